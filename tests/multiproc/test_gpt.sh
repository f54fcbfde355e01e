#!/usr/bin/env bash
# tests/multiproc/test_gpt.sh: chapter 12's GPT program (examples/ch12_gpt.c) as a student runs it.
#   bash tests/multiproc/test_gpt.sh BUILD
# 1. ZeRO stages 0-3, 2 ranks with 2 micro-batches each (no_sync): the four runs end with the same
#    final snapshot, byte for byte (the stages change who holds what, not the numbers).
# 2. kill -9 one rank at a random step under ddprun --max-restarts 2, at ZeRO stages 0 and 3: the
#    job finishes and its final snapshot is byte-identical to an uninterrupted run's.
# 3. where /usr/bin/python3 has torch: the snapshot loads into a PyTorch GPT built module for module
#    as nanoGPT's (bench/gpt_torch.py) with strict=True, and PyTorch's train and validation losses
#    on the program's own evaluation batches are the program's.
# Each case prints "ok   name", "FAIL name" (then details) or "skip name: reason".
set -u
. "$(dirname "$0")/../compat.sh"   # with_timeout, kill_matching
BUILD=${1:-build}
EX="$BUILD/examples/ch12_gpt"
DDPRUN="$BUILD/ddprun"
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
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }

for f in "$EX" "$DDPRUN"; do
    if [ ! -x "$f" ]; then bad gpt_tests_built "$f is missing (run make first)"; exit 1; fi
done

# a small GPT (2 blocks, 32 wide, context 32: 28,576 numbers) that trains in a second or two
SMALL=(--layers 2 --heads 2 --width 32 --ctx 32 --batch-size 4 --warmup 5 --eval-every 0 --eval-batches 4 --sample 0)

# ---- 1. the ZeRO stages change who holds what, not the numbers ----------------------------------
for z in 0 1 2 3; do
    out=$(with_timeout 120 "$EX" --nproc 2 "${SMALL[@]}" --steps 24 --accum 2 --save-every 24 --zero-stage $z \
          --snapshot "$TMP/z$z.st" 2>&1) || { bad "gpt_zero_stage_$z" "the run failed" "$(tail -n 5 <<<"$out")"; continue; }
    grep '^step 24: train loss' <<<"$out" >"$TMP/z$z.last"
done
same=1
for z in 1 2 3; do cmp -s "$TMP/z0.st" "$TMP/z$z.st" || same=0; done
if [ $same = 1 ] && [ -s "$TMP/z0.st" ]; then
    ok "gpt_zero_stages_0_to_3_end_alike (2 ranks x 2 micro-batches, 24 steps: four snapshots byte-identical; $(cat "$TMP/z0.last"))"
else
    bad gpt_zero_stages_0_to_3_end_alike "the final snapshots differ:" "$(for z in 1 2 3; do cmp "$TMP/z0.st" "$TMP/z$z.st" 2>&1; done)"
fi

# ---- 2. kill -9 and resume: bit-identical to an uninterrupted run --------------------------------
# One rank is killed (RECORD_RANK_PID and rank_pid: tests/compat.sh). A slow simulated network
# (300 ns per byte) stretches the 40 steps over about a second and a half.
ARGS=("${SMALL[@]}" --steps 40 --save-every 5 --log-every 5)
export DDP_SIMULATE_NS_PER_BYTE=300
for z in 0 3; do
    ref="$TMP/ref$z.st"
    out=$(with_timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 "$EX" "${ARGS[@]}" --zero-stage $z --snapshot "$ref" 2>&1)
    if [ $? -ne 0 ] || [ ! -s "$ref" ]; then
        bad "gpt_kill_resume_zero_stage_$z" "the uninterrupted run failed" "$(tail -n 5 <<<"$out")"
        continue
    fi
    RANDOM=$((17 + z))
    victim=$((RANDOM % 2))
    at=$((10 + 5 * (RANDOM % 5)))  # the kill comes after this step's line, plus a random delay
    delay=$(awk -v r=$RANDOM 'BEGIN{printf "%.3f", (r % 40) / 1000}')
    snap="$TMP/run$z.st" log="$TMP/run$z.log"
    with_timeout 180 "$DDPRUN" --standalone --nproc-per-node 2 --max-restarts 2 sh -c "$RECORD_RANK_PID" "$TMP/pid$z" \
        "$EX" "${ARGS[@]}" --zero-stage $z --snapshot "$snap" >"$log" 2>&1 &
    tpid=$!
    pid=$(rank_pid "$TMP/pid$z" $victim)
    for i in $(seq 1500); do grep -q "step *$at/" "$log" && break; sleep 0.01; done
    sleep "$delay"
    if [ -z "$pid" ] || ! kill -9 "$pid" 2>/dev/null; then
        wait $tpid
        bad "gpt_kill_resume_zero_stage_$z" "rank $victim (pid ${pid:-unknown}) was not running after step $at: nothing was killed"
        continue
    fi
    wait $tpid
    rc=$?
    resumed=$(sed -n 's/.*resuming from .* at \(step [0-9]*\).*/\1/p' "$log" | head -n 1)
    if [ $rc -eq 0 ] && grep -q "restarting the job (restart 1 of 2)" "$log" && [ -n "$resumed" ] && cmp -s "$snap" "$ref"; then
        ok "gpt_kill_resume_zero_stage_$z (rank $victim killed after step $at + $delay s; resumed at $resumed; final snapshot identical)"
    else
        bad "gpt_kill_resume_zero_stage_$z" "rank $victim killed after step $at + $delay s; exit status $rc; resumed at ${resumed:-no step}" \
            "$(cmp "$snap" "$ref" 2>&1)" "$(grep -v '^\[rank [0-9]*\]: step ' "$log" | tail -n 8)"
    fi
done
unset DDP_SIMULATE_NS_PER_BYTE

# ---- 3. the snapshot in PyTorch, loaded with strict=True ------------------------------------------
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
    skp gpt_snapshot_loads_into_pytorch "/usr/bin/python3 with torch not found (apt-get install python3-torch)"
elif [ ! -s "$TMP/z0.st" ]; then
    bad gpt_snapshot_loads_into_pytorch "no snapshot from case 1"
else
    want=$(sed -n 's/^step 24: train loss \([0-9.]*\), val loss \([0-9.]*\)$/\1 \2/p' "$TMP/z0.last")
    got=$(/usr/bin/python3 bench/gpt_torch.py check "$TMP/z0.st" --layers 2 --heads 2 --width 32 --ctx 32 \
          --batch-size 4 --eval-batches 4 --world 2 2>&1)
    pair=$(sed -n 's/^train loss \([0-9.]*\), val loss \([0-9.]*\) .*/\1 \2/p' <<<"$got")
    if [ -n "$want" ] && [ -n "$pair" ] && awk -v a="$want" -v b="$pair" 'BEGIN{split(a,x," "); split(b,y," ");
           exit !((x[1]-y[1])^2 < 1e-8 && (x[2]-y[2])^2 < 1e-8)}'; then
        ok "gpt_snapshot_loads_into_pytorch (train and val loss: ddp.h $want, PyTorch $pair; $(sed -n 's/.*(\(.*\))/\1/p' <<<"$got"))"
    else
        bad gpt_snapshot_loads_into_pytorch "the program said: ${want:-nothing}" "PyTorch said:" "$got"
    fi
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
