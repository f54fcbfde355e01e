#!/usr/bin/env bash
# tools/nccl_host_cost.sh PROGS OUT: what one all-reduce costs the host with each of NCCL's two
# kinds of communicator: ddp.h's default, non-blocking (every call may answer "in progress", and
# ddp.h polls until NCCL has put the work on its stream), and a blocking one (DDP_NCCL_BLOCKING=1:
# the call returns with the work on the stream). One rank on this machine's GPU (or the stand-in's:
# PROGS/libfakegpu.so), tools/allreduce_perf -H 1 from 4 bytes to 4 MiB, medians of 200 calls per
# size: "issue" is the time until ddp_all_reduce with a work handle returns, "wait" ddp_work_wait's.
# Both tables go to OUT/nccl_host_cost.table, and one line sums up the 4-byte row. make gpu-check
# runs it.
set -u
PROGS=${1:?usage: tools/nccl_host_cost.sh PROGS OUT}
OUT=${2:?usage: tools/nccl_host_cost.sh PROGS OUT}
for b in 0 1; do
    echo "== DDP_NCCL_BLOCKING=$b"
    DDP_BACKEND=nccl DDP_NCCL_BLOCKING=$b "$PROGS/allreduce_perf" -b 4 -e 4M -f 32 -n 200 -w 20 -H 1 || exit 1
done > "$OUT/nccl_host_cost.table" 2>&1 || { cat "$OUT/nccl_host_cost.table"; exit 1; }
cat "$OUT/nccl_host_cost.table"
awk '/^== DDP_NCCL_BLOCKING=/ {m = substr($2, 19)}
     /^ +4 +1 +float/ {i[m] = $9; w[m] = $10}
     END {if (i[0] == "" || i[1] == "") exit 1
          printf "one all-reduce of 4 bytes costs the host: non-blocking issue %s us + wait %s us, blocking issue %s us + wait %s us\n", i[0], w[0], i[1], w[1]}' \
    "$OUT/nccl_host_cost.table"
