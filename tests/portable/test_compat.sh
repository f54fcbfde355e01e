#!/usr/bin/env bash
# tests/portable/test_compat.sh: the fallbacks of tests/compat.sh, which the test scripts take on a Mac,
# forced on this machine: no timeout program (COMPAT_NO_TIMEOUT), no $EPOCHREALTIME (bash 3.2 has
# none), and a `date` first on PATH that prints a literal N for %N, as BSD date does.
#   bash tests/portable/test_compat.sh        (a few seconds)
# Each case prints "ok   name", "FAIL name" (then details) or "skip name: reason".
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/report.sh   # pass, fail, skip; ok, bad, skp
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

mkdir "$TMP/bin"
real_date=$(command -v date)
# portable: the stand-in for BSD date itself
printf '#!/bin/sh\n# BSD date: %%N is not a conversion, it prints N\nfor a in "$@"; do shift; set -- "$@" "$(printf "%%s" "$a" | sed "s/%%N/N/g")"; done\nexec %s "$@"\n' \
    "$real_date" >"$TMP/bin/date"
chmod +x "$TMP/bin/date"
PATH="$TMP/bin:$PATH"
unset EPOCHREALTIME EPOCHSECONDS
COMPAT_NO_TIMEOUT=1
. tests/compat.sh

# ---- the clock: a fraction of a second without GNU date ---------------------------------------
stand_in=$(date +%s.%N)  # portable: checks the stand-in for BSD date
if [ "$(tr -d '0-9.' <<<"$stand_in")" != N ]; then
    bad compat_clock_without_gnu_date "the stand-in for BSD date printed $stand_in, not SECONDS.N"
elif [ "$COMPAT_FINE_CLOCK" = 0 ]; then
    skp compat_clock_without_gnu_date "neither perl (with Time::HiRes) nor python3 is installed: whole seconds only"
else
    t0=$(now); sleep 0.3; t1=$(now)
    if [[ $t0 =~ ^[0-9]+\.[0-9]+$ ]] && [[ $t1 =~ ^[0-9]+\.[0-9]+$ ]] && awk "BEGIN{exit !($t1 - $t0 >= 0.25)}" &&
       elapsed_over "$t0" "$t1" 0.25 && ! elapsed_below "$t0" "$t1" 0.25; then
        ok "compat_clock_without_gnu_date ($(type now | grep -o -E 'perl|python3' | head -n 1): $t0 then $t1 across sleep 0.3)"
    else bad compat_clock_without_gnu_date "now gave $t0, then $t1 after sleep 0.3"; fi
fi

# ---- with_timeout without a timeout program ---------------------------------------------------
if [ -n "$COMPAT_TIMEOUT" ]; then
    bad compat_timeout_fallback "COMPAT_NO_TIMEOUT=1 still chose $COMPAT_TIMEOUT"
fi
gone() { ! kill -0 "$1" 2>/dev/null; }
pidof_file() { local i; for i in $(seq 100); do [ -s "$1" ] && { cat "$1"; return 0; }; sleep 0.05; done; return 1; }

t0=$(now)
with_timeout 1 sh -c 'echo $$ > "$0"; exec sleep 30' "$TMP/hung.pid"; rc=$?
t1=$(now)
p=$(cat "$TMP/hung.pid" 2>/dev/null)
if [ $rc -eq 124 ] && [ -n "$p" ] && gone "$p" && elapsed_below "$t0" "$t1" 20; then ok compat_timeout_stops_a_hung_command
else bad compat_timeout_stops_a_hung_command "status $rc (want 124), program ${p:-?} $(gone "${p:-0}" && echo gone || echo "still running")"; fi

printf 'line one\n' | with_timeout 10 sh -c 'read l; [ "$l" = "line one" ] && exit 3; exit 4'; rc=$?
out=$(with_timeout 10 sh -c 'echo captured; echo err >&2' 2>/dev/null)
if [ $rc -eq 3 ] && [ "$out" = captured ]; then ok compat_timeout_keeps_status_stdin_stdout
else bad compat_timeout_keeps_status_stdin_stdout "status $rc (want 3: the command read its standard input), output \"$out\""; fi

with_timeout -k 1 1 sh -c 'trap "" TERM; echo $$ > "$0"; while :; do sleep 0.1; done' "$TMP/stubborn.pid"; rc=$?
p=$(cat "$TMP/stubborn.pid" 2>/dev/null)
if [ $rc -eq 137 ] && [ -n "$p" ] && gone "$p"; then ok compat_timeout_kill_after
else bad compat_timeout_kill_after "status $rc (want 137: SIGKILL after TERM was ignored)"; fi

# a TERM to the background with_timeout (what run_bg's callers and the traps send) reaches the command
with_timeout 30 sh -c 'echo $$ > "$0"; exec sleep 30' "$TMP/bg.pid" &
b=$!
if p=$(pidof_file "$TMP/bg.pid"); then
    kill -TERM $b
    wait $b; rc=$?
    if [ $rc -eq 143 ] && gone "$p"; then ok compat_timeout_passes_term_on
    else bad compat_timeout_passes_term_on "status $rc (want 143), program $p $(gone "$p" && echo gone || echo "still running")"; kill -9 "$p" 2>/dev/null; fi
else
    kill -9 $b 2>/dev/null
    bad compat_timeout_passes_term_on "the command never started"
fi

trap 'echo caller' USR1
before=$(trap -p USR1 TERM INT)
with_timeout 5 true
after=$(trap -p USR1 TERM INT)
if [ "$before" = "$after" ]; then ok compat_timeout_keeps_the_callers_traps
else bad compat_timeout_keeps_the_callers_traps "before: $before" "after: $after"; fi
trap - USR1

# ---- read_lines, for mapfile -t --------------------------------------------------------------
read_lines got < <(printf 'first\n\nthird with  spaces\nlast, no newline')
if [ ${#got[@]} -eq 4 ] && [ "${got[0]}" = first ] && [ -z "${got[1]}" ] && [ "${got[2]}" = "third with  spaces" ] &&
   [ "${got[3]}" = "last, no newline" ]; then ok compat_read_lines
else bad compat_read_lines "${#got[@]} lines: $(printf '[%s] ' "${got[@]}")"; fi

# ---- processes, with procps (ps, pgrep) and without it (Linux's /proc), as a fresh Debian has none --
# proc_state PID: the first letter of its state (Z: a zombie), from /proc or ps
proc_state() {
    if [ -r "/proc/$1/stat" ]; then sed 's/.*) //' "/proc/$1/stat" | cut -c1  # portable: Linux; elsewhere ps
    else ps -o stat= -p "$1" 2>/dev/null | tr -d ' ' | cut -c1; fi
}
mark="compat-proc-$$-$RANDOM"
for way in procps no_procps; do
    if [ $way = procps ] && ! command -v pgrep >/dev/null 2>&1; then
        skp compat_processes_procps "procps is not installed (apt-get install procps)"; continue
    fi
    if [ $way = no_procps ] && [ ! -d /proc/self ]; then  # portable: the fallback exists only where /proc does
        skp compat_processes_no_procps "this system has no /proc, and needs none: it has ps and pgrep"; continue
    fi
    [ $way = no_procps ] && COMPAT_NO_PROCPS=1
    # a sleeper whose command line holds the mark, and a zombie: the exec'd sleep never reaps its child.
    # Waited for until it is one (at most 5 s): on a busy machine a fixed pause read the last round's
    # pid, already reaped, before this round's shell had written its own.
    sh -c 'sleep 30; :' "$mark" &
    holder=$!
    rm -f "$TMP/zombie"
    sh -c 'sleep 0.3 & echo $! >"$1"; exec sleep 8' sh "$TMP/zombie" &
    zparent=$!
    zombie=""
    for _ in $(seq 100); do
        zombie=$(cat "$TMP/zombie" 2>/dev/null)
        [ -n "$zombie" ] && [ "$(proc_state "$zombie")" = Z ] && break
        sleep 0.05
    done
    found=$(procs_matching "$mark" | tr '\n' ' ')
    why=()
    proc_alive $$ || why+=("proc_alive says this shell ($$) is not running")
    proc_alive "$holder" || why+=("proc_alive says the sleeper ($holder) is not running")
    if [ -z "$zombie" ] || ! kill -0 "$zombie" 2>/dev/null; then why+=("no zombie to look at (pid \"$zombie\")")
    elif proc_alive "$zombie"; then why+=("proc_alive counts the zombie $zombie as running"); fi
    [ "$found" = "$holder " ] || why+=("procs_matching found \"$found\", want \"$holder \"")
    kill_matching "$mark"
    wait "$holder" 2>/dev/null
    kill "$zparent" 2>/dev/null; wait "$zparent" 2>/dev/null
    ! proc_alive "$holder" || why+=("the sleeper $holder still runs after kill_matching")
    [ -z "$(procs_matching "$mark")" ] || why+=("procs_matching still finds $(procs_matching "$mark")")
    if [ ${#why[@]} -eq 0 ]; then ok "compat_processes_$way"
    else bad "compat_processes_$way" "${why[@]}"; fi
    unset COMPAT_NO_PROCPS
done

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
