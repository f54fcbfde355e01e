#!/usr/bin/env bash
# ddp.h against PyTorch DDP on the larger model of the performance reference (MLP 1024 -> 4096 ->
# 4096 -> 1024 -> 10, 25,185,290 parameters, SGD, batch 64 per rank), side by side in one run:
# examples/ch08_large_mlp.c and bench/pytorch_ddp_large.py, one thread per rank, interleaved so that
# a change in the machine's load hits both alike. Prints one table; the raw outputs stay in $LOG.
#
#   bash bench/large_model.sh            # from the repository's top folder; about 3 minutes
#   ROUNDS=1 STEPS=40 WARMUP=5 bash bench/large_model.sh
#
# Each setup is launched ROUNDS times (default 3, round-robin over the setups); a cell is the median
# of its launches, each launch the median of its steps (the performance reference's rule). A
# round that would start after BUDGET_S seconds (default 200) is skipped, so the whole run stays
# under 5 minutes on a busy machine.
#
# Threads: the ddp.h 1-process baseline runs with OPENBLAS_NUM_THREADS=1 (ddp_init would give each
# of 2 ranks cores / local ranks = 1 thread; without a process group OpenBLAS would take both
# cores); PyTorch runs torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1 in every process.
# PyTorch runs in its fastest setting here: OpenBLAS (Debian's libblas.so.3 alternative) and,
# when libjemalloc2 is installed, jemalloc that never returns memory to the kernel.
# portable-lint: linux-only (Debian's python3-torch, its BLAS and jemalloc paths, /proc/loadavg).
set -u
cd "$(dirname "$0")/.." || exit 1
if [ "$(uname)" != Linux ]; then
    echo "bench/large_model.sh compares with Debian's PyTorch and reads Linux paths; elsewhere run"
    echo "build/examples/ch08_large_mlp --nproc 2 on its own (it prints the step time and the exposed wait)"
    exit 0
fi
STEPS=${STEPS:-15}
ROUNDS=${ROUNDS:-3}
BUDGET_S=${BUDGET_S:-200}
WARMUP=${WARMUP:-3}
PY=${PY:-/usr/bin/python3}
BUILD=${BUILD:-build}
LOG=${LOG:-$(mktemp -d /tmp/large_model.XXXXXX)}
BIN=$BUILD/examples/ch08_large_mlp
JEMALLOC=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2

make --no-print-directory BUILD="$BUILD" "$BIN" >"$LOG/build.txt" 2>&1 || { cat "$LOG/build.txt"; exit 1; }

torch_env=(env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)
torch_setting="glibc malloc"
if [ -e "$JEMALLOC" ]; then
    torch_env+=(LD_PRELOAD="$JEMALLOC" MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1)
    torch_setting="jemalloc (LD_PRELOAD, dirty/muzzy decay -1: never returns memory)"
fi
have_torch=1
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then have_torch=0; fi
if [ $have_torch = 1 ]; then
    torch_blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo "?")
    torch_ver=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
fi

# run KEY COMMAND...: run one setup, keep its output (KEY.ROUND.txt), append the fields of its
# "result" line to that setup's lists
declare -A STEP WAIT EXP
run() {
    local key=$1 out="$LOG/$1.$round.txt" line
    shift
    if "$@" >"$out" 2>&1 && line=$(grep '^result ' "$out" | tail -1) && [ -n "$line" ]; then
        STEP[$key]+=" $(sed -n 's/.* step_ms=\([^ ]*\).*/\1/p' <<<"$line")"
        WAIT[$key]+=" $(sed -n 's/.* wait_ms=\([^ ]*\).*/\1/p' <<<"$line")"
        EXP[$key]+=" $(sed -n 's/.* exposed=\([^ ]*\).*/\1/p' <<<"$line")"
        return
    fi
    echo "$key failed (round $round); its output:" >&2
    tail -5 "$out" >&2
}
# med "LIST": the median of the numbers in LIST ("nan" when they are nan, empty when none)
med() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{v[NR]=$1} END{if (NR) print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
t_start=$(date +%s)
common=(--steps "$STEPS" --warmup "$WARMUP")
rounds_done=0
for round in $(seq 1 "$ROUNDS"); do
    if [ "$round" -gt 1 ] && [ $(( $(date +%s) - t_start )) -gt "$BUDGET_S" ]; then break; fi
    run c1 env OPENBLAS_NUM_THREADS=1 "$BIN" --nproc 1 "${common[@]}"
    [ $have_torch = 1 ] && run p1 "${torch_env[@]}" "$PY" bench/pytorch_ddp_large.py --nproc 1 "${common[@]}"
    run c2 "$BIN" --nproc 2 "${common[@]}"
    [ $have_torch = 1 ] && run p2 "${torch_env[@]}" "$PY" bench/pytorch_ddp_large.py --nproc 2 "${common[@]}"
    run c2one "$BIN" --nproc 2 --one-bucket "${common[@]}"
    [ $have_torch = 1 ] && run p2one "${torch_env[@]}" "$PY" bench/pytorch_ddp_large.py --nproc 2 --one-bucket "${common[@]}"
    run c2view "$BIN" --nproc 2 --view "${common[@]}"
    [ $have_torch = 1 ] && run p2view "${torch_env[@]}" "$PY" bench/pytorch_ddp_large.py --nproc 2 --view "${common[@]}"
    rounds_done=$round
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
for k in "${!STEP[@]}"; do
    STEP[$k]=$(med "${STEP[$k]}") WAIT[$k]=$(med "${WAIT[$k]}") EXP[$k]=$(med "${EXP[$k]}")
done

buckets() { grep -m1 '^buckets:' "$LOG/$1.1.txt" 2>/dev/null | sed 's/^buckets: //; s/ (reduced in this order)//; s/ (after the rebuild)//'; }

echo "MLP 1024-4096-4096-1024-10 (25,185,290 parameters, 96 MiB of gradients), SGD, batch 64 per rank,"
echo "median of $rounds_done launches, each the median of $STEPS steps after $WARMUP warm-up; $(nproc) cores;"
echo "one thread per rank everywhere:"
echo "  ddp.h: OpenBLAS, 1-process baseline with OPENBLAS_NUM_THREADS=1, 2 ranks 1 thread each (ddp_init), shared memory"
if [ $have_torch = 1 ]; then
    echo "  PyTorch $torch_ver: gloo, torch.set_num_threads(1), OPENBLAS_NUM_THREADS=1, BLAS $torch_blas,"
    echo "    $torch_setting"
else
    echo "  PyTorch: skip: not installed (apt-get install python3-torch libopenblas0)"
fi
echo "  load average before / after: $load_before / $load_after (other jobs on the machine distort the figures)"
echo "  overhead = step - the same library's 1-process step; ratio = ddp.h's overhead / PyTorch's"
echo
printf '%-34s %9s %10s %8s %10s %7s\n' "setup" "ms/step" "exposed" "exposed" "overhead" "ratio"
printf '%-34s %9s %10s %8s %10s %7s\n' "" "" "ms" "frac" "ms" ""
row() { # label key base pytorch-twin
    local s=${STEP[$2]:-n/a} w=${WAIT[$2]:-} e=${EXP[$2]:-} o="" r=""
    if [[ $s =~ ^[0-9.]+$ ]]; then
        if [ -n "$3" ] && [[ ${STEP[$3]:-} =~ ^[0-9.]+$ ]]; then o=$(awk -v a="$s" -v b="${STEP[$3]}" 'BEGIN{printf "%.1f", a-b}'); fi
        if [ -n "$4" ] && [ -n "$o" ] && [[ ${STEP[$4]:-} =~ ^[0-9.]+$ ]] && [[ ${STEP[p1]:-} =~ ^[0-9.]+$ ]]; then
            r=$(awk -v a="$o" -v b="${STEP[$4]}" -v c="${STEP[p1]}" 'BEGIN{d=b-c; if (d > 0) printf "%.2f", a/d; else print "-"}')
        fi
        s=$(printf '%.1f' "$s")
        [[ $w =~ ^[0-9.]+$ ]] && w=$(printf '%.1f' "$w")
        [[ $e =~ ^[0-9.]+$ ]] && e=$(printf '%.2f' "$e")
    fi
    [ "$2" = c1 ] || [ "$2" = p1 ] && w="-" e="-"
    printf '%-34s %9s %10s %8s %10s %7s\n' "$1" "$s" "${w:--}" "${e:--}" "${o:--}" "${r:--}"
}
row "ddp.h, 1 process"                    c1     ""  ""
row "ddp.h, 2 ranks, default buckets"     c2     c1  p2
row "ddp.h, 2 ranks, one bucket"          c2one  c1  p2one
row "ddp.h, 2 ranks, --view"              c2view c1  p2view
row "PyTorch, 1 process"                  p1     ""  ""
row "PyTorch DDP, 2 ranks, default"       p2     p1  ""
row "PyTorch DDP, 2 ranks, one bucket"    p2one  p1  ""
row "PyTorch DDP, 2 ranks, bucket view"   p2view p1  ""
echo
echo "buckets: ddp.h default: $(buckets c2); PyTorch default: $(buckets p2)"
echo "exposed = time backward waited for communication after its last layer (ddp_wrap_stats.wait_s);"
echo "PyTorch's is not observable from outside its reducer (nan). Took $(( $(date +%s) - t_start )) s; outputs in $LOG"
