# tests/multiproc/proc_cases.sh: what test_bad_input.sh and test_confusions.sh (beside it) share,
# sourced by both after they set BUILD and cd to the top folder: the counters and ok/bad/skp, a
# scratch folder and a trap that stops every process a case started, a clean environment (no
# launcher, SLURM or DDP variable of the caller leaks into a case), and the helpers that run a case
# with a deadline. Each helper starts the command through `sh -c 'echo $$ > ...; exec ...'`, so
# $TMP/TAG.prog holds the command's own pid (prog_pid TAG), on any system (no /proc) and with any
# `timeout`.
. tests/compat.sh
pass=0 fail=0 skip=0
TMP=$(mktemp -d)
PIDS=""   # every background process this script starts; the trap stops them, by pid

cleanup() {
    local p
    for p in $PIDS $(cat "$TMP"/*.pid 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT DDP_JOB_TOKEN \
      DDP_TIMEOUT DDP_BACKEND DDP_DEBUG DDP_TRACE DDP_DATA_DIR DDP_RESTART_COUNT OMP_NUM_THREADS \
      OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE \
      SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID SLURM_JOB_ID SLURM_JOB_NODELIST SLURM_NODELIST \
      SLURM_NTASKS_PER_NODE SLURM_TASKS_PER_NODE SLURM_STEP_ID SLURM_STEP_NUM_NODES SLURM_STEP_NUM_TASKS \
      SLURM_STEP_TASKS_PER_NODE
export OPENBLAS_NUM_THREADS=1 DDP_KILL_GRACE_S=1

ok()   { echo "ok   $1"; pass=$((pass + 1)); }
bad()  { echo "FAIL $1"; shift; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }
skp()  { echo "skip $1: $2"; skip=$((skip + 1)); }


# free_port VAR: set VAR to a port nothing listens on right now, random in 20000..32767 (below
# Linux's ephemeral range, so that no outgoing connection borrows it meanwhile), and never one
# this script handed out before. A function that sets a variable, not $(...), so the memory stays.
LAST_PORT=$((20000 + RANDOM % 12000))
free_port() {
    local _ p=0
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        LAST_PORT=$((LAST_PORT + 1 + RANDOM % 50))
        [ $LAST_PORT -ge 32768 ] && LAST_PORT=$((20000 + RANDOM % 1000))
        p=$LAST_PORT
        if [ $HAVE_PY = 0 ] ||
           python3 -c 'import socket,sys; s=socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1])))' $p 2>/dev/null; then
            break
        fi
    done
    printf -v "$1" '%s' "$p"
}

# Wait (at most $2 s) until something accepts connections on 127.0.0.1:$1.
wait_port() {
    local _
    for _ in $(seq $(( ${2:-5} * 20 ))); do
        with_timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# Wait (at most 5 s) until file $1 exists.
wait_file() {
    local _
    for _ in $(seq 100); do [ -e "$1" ] && return 0; sleep 0.05; done
    return 1
}

# Wait (at most $2 s) until file $1 has a line matching the extended regex $3.
wait_line() {
    local _
    for _ in $(seq $(( $2 * 20 ))); do grep -qE -- "$3" "$1" 2>/dev/null && return 0; sleep 0.05; done
    return 1
}

# The command of case TAG, started so that it writes its own pid to $TMP/TAG.prog first.
RECORD_PID='echo $$ > "$0"; exec "$@"'
# prog_pid TAG: that pid, once the file is there (at most 5 s).
prog_pid() {
    wait_file "$TMP/$1.prog" && cat "$TMP/$1.prog"
}

# run_fg TAG LIMIT [VAR=value...] -- COMMAND...: run in the foreground with a deadline of LIMIT
# seconds (with_timeout); sets RC, T0, T1; stdout and stderr go to $TMP/TAG.out and $TMP/TAG.err.
run_fg() {
    local tag=$1 lim=$2 envs=()
    shift 2
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    T0=$(now)
    # in the background and waited for, so that a TERM to this script is acted on at once
    with_timeout -k 2 "$lim" env ${envs[@]+"${envs[@]}"} sh -c "$RECORD_PID" "$TMP/$tag.prog" "$@" \
        >"$TMP/$tag.out" 2>"$TMP/$tag.err" &
    PIDS="$PIDS $!"
    wait $!
    RC=$?
    T1=$(now)
}

# run_bg TAG LIMIT [VAR=value...] -- COMMAND...: the same in the background; BG gets the pid
# of the deadline's keeper (with_timeout, which passes a TERM on to the program); prog_pid TAG
# gives the program's own.
run_bg() {
    local tag=$1 lim=$2 envs=()
    shift 2
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    with_timeout -k 2 "$lim" env ${envs[@]+"${envs[@]}"} sh -c "$RECORD_PID" "$TMP/$tag.prog" "$@" \
        >"$TMP/$tag.out" 2>"$TMP/$tag.err" &
    BG=$!
    PIDS="$PIDS $BG"
}

# run_async TAG LIMIT [VAR=value...] -- COMMAND...: start a case that mostly waits (for a
# deadline) in the background now, to be judged later with finish_async TAG, which sets RC, T0
# and T1 as run_fg does. The trap stops it (the subshell and the deadline's keeper under it) by pid.
# (The subshell's pid goes to $TMP/TAG.apid: bash 3.2 has no associative arrays.)
run_async() {
    local tag=$1 lim=$2 envs=()
    shift 2
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    (
        t0=$(now)
        with_timeout -k 2 "$lim" env ${envs[@]+"${envs[@]}"} sh -c "$RECORD_PID" "$TMP/$tag.prog" "$@" \
            >"$TMP/$tag.out" 2>"$TMP/$tag.err" &
        echo $! >"$TMP/$tag.pid"
        wait $!
        echo "$? $t0 $(now)" >"$TMP/$tag.rc"
    ) &
    echo $! >"$TMP/$tag.apid"
    PIDS="$PIDS $!"
}
finish_async() {
    wait "$(cat "$TMP/$1.apid")"
    read -r RC T0 T1 <"$TMP/$1.rc" || { RC=125; T0=0; T1=0; }
}
