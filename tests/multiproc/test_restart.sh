#!/usr/bin/env bash
# tests/multiproc/test_restart.sh: fault tolerance with real processes (chapter 6).
#   bash tests/multiproc/test_restart.sh BUILD [SEEDS]
# 1. kill -9 a random rank of examples/ch06_fault_tolerance at a random moment under
#    ddprun --max-restarts 3: the job must finish, and its final snapshot (weights, Adam state,
#    counters) must be byte-identical to an uninterrupted run's. SEEDS rounds (default 5).
# 2. kill -9 a program in the middle of writing a 12 MB snapshot: what is left loads, whole.
# 3. SIGSTOP one rank (a hung process), or rank 0 (the store's host), or kill -9 rank 0 or rank 1:
#    every other rank fails within DDP_TIMEOUT with a message naming the cause, ddprun exits
#    non-zero, and no process is left.
# Each case prints "ok   name", "FAIL name" (then details) or "skip name: reason".
# The GPU stand-in's section (tests/fakegpu/test_fakegpu.sh) runs cases 1 and 3 on fake GPUs with NCCL:
# RESTART_EXAMPLE names the example built against the stand-in, RESTART_DEVICE=cuda, and
# RESTART_CASES the sections to run (default: "1 2 3"); it runs case 3 again with
# FAKEGPU_NCCL_REPORT=1, where the stand-in's NCCL reports a dead peer itself.
set -u
. "$(dirname "$0")/../compat.sh"   # now, with_timeout: macOS has no %N in date and no timeout
BUILD=${1:-build}
SEEDS=${2:-5}
EX=${RESTART_EXAMPLE:-"$BUILD/examples/ch06_fault_tolerance"}
DEVICE=${RESTART_DEVICE:-cpu}
CASES=" ${RESTART_CASES:-1 2 3} "
# what a survivor says when a rank is killed: the CPU ring sees the closed socket; over NCCL, which
# reports no dead peer on one machine, ddp.h's watchdog sees its sign of life gone from the store
# (rank 0's: the store itself), and names it
PEER_DIED=$([ "$DEVICE" = cpu ] && echo DDP_ERR_PEER_LOST || echo "DDP_ERR_PEER_LOST: .*rank 0 has ended")
PEER1_DIED=$([ "$DEVICE" = cpu ] && echo DDP_ERR_PEER_LOST || echo "DDP_ERR_PEER_LOST: .*rank 1 has ended")
DDPRUN="$BUILD/ddprun"
WRITER="$BUILD/tests/snapshot_writer"
pass=0 fail=0 skip=0
TMP=$(mktemp -d)
cleanup() {
    kill_matching "$TMP"
    rm -rf "$TMP"
}
trap cleanup EXIT
export DDP_KILL_GRACE_S=1
unset DDP_JOB_TOKEN RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT DDP_TIMEOUT

ok()  { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }

for f in "$EX" "$DDPRUN" "$WRITER"; do
    if [ ! -x "$f" ]; then bad restart_tests_built "$f is missing (run make first)"; exit 1; fi
done

# ---- 1. kill -9 and resume: bit-identical to an uninterrupted run ------------------------------
# A slow simulated network (1 us per byte) stretches the 200 steps over about 2 s, so the kill
# lands mid-training; it changes timing only, not the numbers.
W=3
ARGS=(--device "$DEVICE" --epochs 100 --save-every 7)
export DDP_SIMULATE_NS_PER_BYTE=1000
if [[ $CASES == *" 1 "* ]]; then
ref_out=$(with_timeout 120 "$DDPRUN" --standalone --nproc-per-node $W "$EX" "${ARGS[@]}" --snapshot "$TMP/ref.st" 2>&1)
if [ $? -ne 0 ] || [ ! -s "$TMP/ref.st" ]; then
    bad kill_resume_reference "the uninterrupted run failed" "$(tail -n 5 <<<"$ref_out")"
else
    for seed in $(seq "$SEEDS"); do
        RANDOM=$seed
        victim=$((RANDOM % W))
        epoch=$((1 + RANDOM % 95))  # the kill comes after this epoch's line, plus a random delay
        delay=$(awk -v r=$RANDOM 'BEGIN{printf "%.3f", (r % 60) / 1000}')
        snap="$TMP/run$seed.st"
        log="$TMP/run$seed.log"
        with_timeout 180 "$DDPRUN" --standalone --nproc-per-node $W --max-restarts 3 sh -c "$RECORD_RANK_PID" "$TMP/pid$seed" \
            "$EX" "${ARGS[@]}" --snapshot "$snap" >"$log" 2>&1 &
        tpid=$!
        pid=$(rank_pid "$TMP/pid$seed" $victim)
        for i in $(seq 1200); do grep -q "epoch *$epoch/" "$log" && break; sleep 0.01; done
        sleep "$delay"
        if [ -z "$pid" ] || ! kill -9 "$pid" 2>/dev/null; then
            wait $tpid
            bad "kill_resume_seed_$seed" "rank $victim (pid ${pid:-unknown}) was not running after epoch $epoch + $delay s: nothing was killed"
            continue
        fi
        wait $tpid
        rc=$?
        resumed=$(sed -n 's/.*resuming from [^:]*: \(epoch [0-9]*, step [0-9]*\).*/\1/p' "$log" | head -n 1)
        if [ $rc -eq 0 ] && grep -q "restarting the job (restart 1 of 3)" "$log" && cmp -s "$snap" "$TMP/ref.st"; then
            ok "kill_resume_seed_$seed (rank $victim killed after epoch $epoch + $delay s; resumed at ${resumed:-the start: no snapshot yet}; final snapshot identical)"
        else
            bad "kill_resume_seed_$seed" "rank $victim killed after epoch $epoch + $delay s; exit status $rc" \
                "$(cmp "$snap" "$TMP/ref.st" 2>&1)" "$(grep -v 'epoch ' "$log" | tail -n 8)"
        fi
    done
fi
fi
unset DDP_SIMULATE_NS_PER_BYTE

# ---- 2. killed in the middle of writing a snapshot ------------------------------------------
if [[ $CASES == *" 2 "* ]]; then
# Odd rounds kill at a random moment; even rounds wait until a temporary file has data in it (a
# save is under way) and kill then. A kill cut a save short when the writer's own temporary
# file (named with its pid) is left behind; rounds go on (up to 12) until two have.
mid=0 loaded=0 rounds=0
for r in $(seq 12); do  # at least 4 rounds, and until 2 kills have come during a save
    [ $r -gt 4 ] && [ $mid -ge 2 ] && break
    rounds=$r
    RANDOM=$((100 + r))
    "$WRITER" write "$TMP/big.st" >"$TMP/writer.log" 2>&1 &
    wpid=$!
    # wait for the first complete snapshot (which also removes the last round's stale temporary)
    for i in $(seq 200); do grep -q "saved step" "$TMP/writer.log" && break; sleep 0.05; done
    if [ $((r % 2)) = 1 ]; then
        sleep "$(awk -v r=$RANDOM 'BEGIN{printf "%.2f", (r % 120) / 100}')"
    else
        for i in $(seq 400); do
            [ -n "$(find "$TMP" -maxdepth 1 -name 'big.st.tmp.*' -size +0 2>/dev/null)" ] && break
            sleep 0.005
        done
    fi
    kill -9 $wpid 2>/dev/null
    wait $wpid 2>/dev/null
    # the killed writer's own temporary file is still there: it died in the middle of a save
    ls "$TMP"/big.st.tmp.*."$wpid" >/dev/null 2>&1 && mid=$((mid + 1))
    out=$("$WRITER" check "$TMP/big.st" 2>&1) && loaded=$((loaded + 1)) || echo "    round $r: $out"
done
if [ $loaded -eq $rounds ] && [ $mid -ge 2 ]; then
    ok "snapshot_killed_mid_write ($rounds kills, $mid with a write under way; every snapshot left loads whole)"
else bad snapshot_killed_mid_write "$loaded of $rounds snapshots left behind loaded; $mid kills came during a write (want >= 2)"; fi
fi

# ---- 3. deadlines: a stopped or dead rank makes the others fail, not hang ------------------------
# DDP_TIMEOUT=3: the survivors must give up within a few seconds of the fault. Under ddprun, which
# then stops everyone (SIGTERM, SIGCONT, SIGKILL after DDP_KILL_GRACE_S=1) and exits non-zero; and
# with ranks started by hand (as mpirun or srun would), where nobody stops the survivors for them.
export DDP_TIMEOUT=3 DDP_SIMULATE_NS_PER_BYTE=1000
secs() { awk "BEGIN{printf \"%.1f\", $2 - $1}"; }
wait_training() {  # until log $1 shows a finished epoch (at most 20 s)
    local i
    for i in $(seq 400); do grep -q "epoch " "$1" 2>/dev/null && return 0; sleep 0.05; done
    return 1
}
ddprun_fault() {  # name, signal, rank, phrase expected in a survivor's error
    local name=$1 sig=$2 victim=$3 phrase=$4 log="$TMP/$1.log" tpid pid t0 t1 rc left
    with_timeout 60 "$DDPRUN" --standalone --nproc-per-node 3 sh -c "$RECORD_RANK_PID" "$TMP/$name.pid" \
        "$EX" --device "$DEVICE" --epochs 100 --save-every 0 --snapshot "$TMP/$name.st" >"$log" 2>&1 &
    tpid=$!
    wait_training "$log"
    pid=$(rank_pid "$TMP/$name.pid" "$victim")
    t0=$(now)
    kill -s "$sig" "$pid"
    wait $tpid
    rc=$?
    t1=$(now)
    sleep 0.2
    left=$(procs_matching "$TMP/$name.st" | tr '\n' ' ')
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -z "$left" ] && awk "BEGIN{exit !($t1 - $t0 < 10)}" &&
       grep -q "$phrase" "$log"; then
        ok "$name (ddprun exited $rc after $(secs $t0 $t1) s; $(grep -m1 -o "$phrase.\{0,70\}" "$log"))"
    else
        bad "$name" "exit status $rc after $(secs $t0 $t1) s; left running: ${left:-none}" "$(grep -v 'epoch ' "$log" | tail -n 8)"
        [ -n "$left" ] && kill -9 $left 2>/dev/null
    fi
}
if [[ $CASES == *" 3 "* ]]; then
ddprun_fault stopped_rank_times_out STOP 1 "DDP_ERR_TIMEOUT"
ddprun_fault stopped_rank0_times_out STOP 0 "DDP_ERR_TIMEOUT"
ddprun_fault killed_rank0_under_ddprun KILL 0 "was killed by signal 9 (SIGKILL)"

manual_fault() {  # name, signal, rank, phrase: three ranks started by hand, no launcher
    local name=$1 sig=$2 victim=$3 phrase=$4 port r pids=() t0 t1 rc good=0 left try
    # a random port may be taken by another program (rank 0 then says DDP_ERR_PORT_IN_USE at once):
    # that is not the fault under test, so the three start again on another port (at most 3 tries)
    for try in 1 2 3; do
        port=$((20000 + RANDOM % 12000)) pids=()
        rm -f "$TMP/$name.pid".*
        for r in 0 1 2; do
            RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                with_timeout 60 sh -c "$RECORD_RANK_PID" "$TMP/$name.pid" "$EX" --device "$DEVICE" --epochs 100 \
                --save-every 0 --snapshot "$TMP/$name.st" >"$TMP/$name.$r.log" 2>&1 &
            pids+=($!)
        done
        wait_training "$TMP/$name.0.log" && break
        grep -q DDP_ERR_PORT_IN_USE "$TMP/$name.0.log" || break
        left=$(procs_matching "$TMP/$name.st" | tr '\n' ' ')
        [ -n "$left" ] && kill -9 $left 2>/dev/null
        wait 2>/dev/null
    done
    t0=$(now)
    kill -s "$sig" "$(rank_pid "$TMP/$name.pid" "$victim")"
    for r in 0 1 2; do
        [ "$r" = "$victim" ] && continue
        wait "${pids[$r]}"
        rc=$?
        [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "$phrase" "$TMP/$name.$r.log" && good=$((good + 1))
    done
    t1=$(now)
    left=$(procs_matching "$TMP/$name.st" | tr '\n' ' ')
    [ -n "$left" ] && kill -9 $left 2>/dev/null
    wait 2>/dev/null
    if [ $good -eq 2 ] && awk "BEGIN{exit !($t1 - $t0 < 10)}"; then
        ok "$name (both survivors failed within $(secs $t0 $t1) s; $(grep -h -m1 -o "$phrase.\{0,70\}" "$TMP/$name".[0-2].log | head -n 1))"
    else
        bad "$name" "$good of 2 survivors failed with \"$phrase\"; $(secs $t0 $t1) s" \
            "$(for r in 0 1 2; do tail -n 2 "$TMP/$name.$r.log"; done)"
    fi
}
manual_fault killed_rank0_no_launcher KILL 0 "$PEER_DIED"
manual_fault killed_rank1_no_launcher KILL 1 "$PEER1_DIED"
manual_fault stopped_rank2_no_launcher STOP 2 "DDP_ERR_TIMEOUT"
fi
unset DDP_TIMEOUT DDP_SIMULATE_NS_PER_BYTE

[ $fail -eq 0 ]
