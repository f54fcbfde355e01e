# shellcheck shell=bash
# tests/compat.sh: the few things the test scripts need that GNU/Linux and macOS do differently,
# sourced by them (after `set -u`). macOS has bash 3.2 (no mapfile, no associative arrays, no
# $EPOCHREALTIME), a BSD date without %N, and no `timeout`; tests/portable/lint_portable.py keeps the
# scripts from using those directly. Written for bash 3.2.
#
#   now                             seconds since the epoch with a fraction, or whole seconds where
#                                   no clock here has one (then COMPAT_FINE_CLOCK=0, COMPAT_SLACK=1)
#   elapsed_below T0 T1 S, elapsed_over T0 T1 S   T1 - T0 < S, > S (widened by COMPAT_SLACK)
#   with_timeout [-k K] LIMIT CMD...  GNU timeout's contract: CMD's status, or 124 when it was
#                                   stopped after LIMIT seconds (SIGTERM, passed on as timeout
#                                   does), 137 when it then needed SIGKILL K seconds later. CMD is
#                                   a program, as for timeout, not a shell function
#   read_lines NAME                 the lines of standard input into the array NAME (mapfile -t)
#   RECORD_RANK_PID, rank_pid PREFIX R
#                                   which process is rank R of a ddprun job (no /proc/PID/environ
#                                   on macOS): below

# ---- the clock ---------------------------------------------------------------------------------
COMPAT_FINE_CLOCK=1
if [ -n "${EPOCHREALTIME:-}" ]; then  # portable: bash 5 only, looked for; a comma where the locale says so
    now() { local t=$EPOCHREALTIME; echo "${t/,/.}"; }  # portable: only where bash has it
elif [ "$(date +%N 2>/dev/null | tr -d '0-9')" = "" ] && [ -n "$(date +%N 2>/dev/null)" ]; then  # portable: GNU date?
    now() { date +%s.%N; }  # portable: only where date printed digits for %N
elif command -v perl >/dev/null 2>&1 && perl -MTime::HiRes -e 1 >/dev/null 2>&1; then  # macOS
    now() { perl -MTime::HiRes=time -e 'printf "%.6f\n", time'; }
elif command -v python3 >/dev/null 2>&1; then
    now() { python3 -c 'import time; print("%.6f" % time.time())'; }
else
    COMPAT_FINE_CLOCK=0
    now() { date +%s; }
fi

# elapsed_below T0 T1 S, elapsed_over T0 T1 S: whether T1 - T0 is under, or over, S seconds. With
# a whole-second clock each bound widens by COMPAT_SLACK (1 s), so that the clock's coarseness
# alone never fails a case.
COMPAT_SLACK=0
[ $COMPAT_FINE_CLOCK = 1 ] || COMPAT_SLACK=1
elapsed_below() { awk "BEGIN{exit !($2 - $1 < $3 + $COMPAT_SLACK)}"; }
elapsed_over() { awk "BEGIN{exit !($2 - $1 > $3 - $COMPAT_SLACK)}"; }

# ---- a deadline on a command -------------------------------------------------------------------
COMPAT_TIMEOUT=
if [ -z "${COMPAT_NO_TIMEOUT:-}" ]; then
    if command -v timeout >/dev/null 2>&1; then COMPAT_TIMEOUT=timeout       # GNU coreutils
    elif command -v gtimeout >/dev/null 2>&1; then COMPAT_TIMEOUT=gtimeout   # Homebrew's coreutils
    fi
fi
with_timeout() {
    local k='' limit flag pid dog rc traps exit_trap
    if [ "$1" = -k ]; then k=$2; shift 2; fi
    if [ -n "$COMPAT_TIMEOUT" ]; then
        if [ -n "$k" ]; then "$COMPAT_TIMEOUT" -k "$k" "$@"; else "$COMPAT_TIMEOUT" "$@"; fi
        return
    fi
    # No timeout program: the command in the background (its standard input kept), a watchdog
    # beside it, and a TERM or INT to this shell passed on to the command while it runs (the
    # caller's own traps are put back after). Unlike GNU timeout, only the command is signalled,
    # not the processes it started.
    limit=$1
    shift
    flag=${TMPDIR:-/tmp}/with_timeout.$$.$RANDOM$RANDOM
    traps=$(trap -p TERM INT)
    # The caller's EXIT trap is lifted while the two subshells start: a subshell that a signal
    # reaches before it has reset the traps it inherited runs them, EXIT too, and a caller's
    # `trap 'rm -rf "$TMP"' EXIT` would then empty its folder while it still runs.
    # (In a subshell, $(...) included, trap -p shows the parent's trap, which is not this shell's
    # to run: leave it alone there, or setting it back would arm it.)
    exit_trap=''
    if [ "${BASH_SUBSHELL:-0}" = 0 ]; then exit_trap=$(trap -p EXIT); trap - EXIT; fi
    "$@" <&0 &
    pid=$!
    trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
    (
        trap 'kill "$s" 2>/dev/null; exit 0' TERM
        sleep "$limit" & s=$!
        wait "$s"
        : >"$flag"
        kill -TERM "$pid" 2>/dev/null
        if [ -n "$k" ]; then
            sleep "$k" & s=$!
            wait "$s"
            kill -KILL "$pid" 2>/dev/null
        fi
    ) </dev/null >/dev/null 2>&1 &
    dog=$!
    [ -n "$exit_trap" ] && eval "$exit_trap"
    wait "$pid" 2>/dev/null
    rc=$?
    # a signal to this shell ends the wait early: wait again for the command itself
    while [ $rc -gt 128 ] && kill -0 "$pid" 2>/dev/null; do wait "$pid" 2>/dev/null; rc=$?; done
    trap - TERM INT
    [ -n "$traps" ] && eval "$traps"
    kill -TERM "$dog" 2>/dev/null
    wait "$dog" 2>/dev/null
    if [ -e "$flag" ]; then
        rm -f "$flag"
        [ $rc -eq 137 ] || rc=124
    fi
    return $rc
}

# ---- lines into an array -----------------------------------------------------------------------
read_lines() {
    local _line _i=0
    eval "$1=()"
    while IFS= read -r _line || [ -n "$_line" ]; do
        eval "$1[$_i]=\$_line"
        _i=$((_i + 1))
    done
}

# ---- processes ---------------------------------------------------------------------------------
# A fresh Debian machine (build-essential and make only, or a debian:12 container) has no procps,
# so no ps, pgrep or pkill; macOS always has them. Where they are missing, Linux's /proc answers
# (COMPAT_NO_PROCPS=1 takes that way even where procps is installed: test_compat.sh checks it).
#   proc_alive PID          PID runs and is not a zombie (a killed grandchild waits to be reaped
#                           by PID 1, and kill -0 succeeds on a zombie)
#   procs_matching TEXT     the pids whose command line holds TEXT (pgrep -f), one per line
#   kill_matching TEXT      SIGKILL to each of them (pkill -9 -f)
proc_alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    if [ -z "${COMPAT_NO_PROCPS:-}" ] && command -v ps >/dev/null 2>&1; then st=$(ps -o stat= -p "$1" 2>/dev/null)
    elif [ -r "/proc/$1/stat" ]; then  # portable: Linux without procps; macOS has ps
        st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null)  # portable: the state follows the command's ")"
    else st=R; fi
    case "$st" in Z*) return 1 ;; esac
    return 0
}
procs_matching() {
    local d
    if [ -z "${COMPAT_NO_PROCPS:-}" ] && command -v pgrep >/dev/null 2>&1; then pgrep -f -- "$1"; return 0; fi
    for d in /proc/[0-9]*; do  # portable: Linux without procps; macOS has pgrep
        [ "${d#/proc/}" = $$ ] && continue  # portable: as above
        tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -qF -- "$1" && echo "${d#/proc/}"  # portable: as above
    done
    return 0
}
kill_matching() {
    local p
    for p in $(procs_matching "$1"); do kill -9 "$p" 2>/dev/null; done
    return 0
}

# ---- which process is rank R ----------------------------------------------------------------------
# ddprun ... sh -c "$RECORD_RANK_PID" PREFIX PROGRAM ARGS...: each rank writes its pid to PREFIX.RANK
# and then becomes the program, so that a case can signal one rank. rank_pid PREFIX R prints the
# pid rank R wrote, once it is there (at most 10 s), and fails otherwise.
RECORD_RANK_PID='echo $$ > "$0.$RANK"; exec "$@"'
rank_pid() {
    local i
    for i in $(seq 200); do
        if [ -s "$1.$2" ]; then cat "$1.$2"; return 0; fi
        sleep 0.05
    done
    return 1
}
