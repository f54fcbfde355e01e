#!/usr/bin/env bash
# tools/gpu_fault_drill.sh PROGS OUT: the fault drill that one GPU allows, for make gpu-check (NCCL
# needs a GPU for each rank, so its drills run on the stand-in, in make test). Two ranks of the
# chapter-6 program on the CPU backend with GPU buffers, sharing the GPU, started by hand as srun
# or mpirun would start them (no launcher stops the survivor); rank 1 is killed with kill -9 in the
# middle of training. Rank 0 must fail, naming the loss; the line it prints gives the time from
# the kill to rank 0's end. Exit status 0 when it did.
set -u
. "$(dirname "$0")/../tests/compat.sh"   # now
PROGS=$1 OUT=$2
port=$((20000 + RANDOM % 12000)) pids=()
for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_BACKEND=cpu \
        DDP_TIMEOUT=60 "$PROGS/examples/ch06_fault_tolerance" --device cuda --epochs 100000 --save-every 0 \
        --snapshot "$OUT/drill.$r.safetensors" >"$OUT/drill.$r.log" 2>&1 &
    pids+=($!)
done
for i in $(seq 1200); do grep -q "epoch " "$OUT/drill.0.log" 2>/dev/null && break; sleep 0.05; done
if ! grep -q "epoch " "$OUT/drill.0.log"; then
    echo "rank 0 did not start training within 60 s:"; tail -n 5 "$OUT/drill.0.log"
    kill -9 "${pids[@]}" 2>/dev/null; exit 1
fi
t0=$(now)
kill -9 "${pids[1]}"
( sleep 90; kill -9 "${pids[0]}" 2>/dev/null ) &   # (a rank 0 that never notices: stopped after 90 s)
guard=$!
wait "${pids[0]}"; rc=$?
t1=$(now)
kill "$guard" 2>/dev/null
wait "${pids[1]}" 2>/dev/null
secs=$(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")
if [ $rc -ne 0 ] && [ $rc -ne 137 ] && grep -q DDP_ERR_PEER_LOST "$OUT/drill.0.log"; then
    echo "rank 0 failed after $secs s with $(grep -m1 -o 'DDP_ERR_PEER_LOST.\{0,110\}' "$OUT/drill.0.log")"
    exit 0
fi
echo "rank 0: exit status $rc after $secs s, without DDP_ERR_PEER_LOST:"
tail -n 6 "$OUT/drill.0.log"
exit 1
