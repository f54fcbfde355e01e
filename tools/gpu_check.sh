#!/usr/bin/env bash
# make gpu-check: everything a first run on a real GPU must show, in one report file.
#
#   make gpu-check                    on a machine with an NVIDIA GPU, with a build made there or
#                                     carried there (make gpu-check-build makes the few programs it
#                                     needs; nothing is rebuilt by gpu-check itself)
#   make gpu-check-standin            the same flow on the GPU stand-in (tests/fakegpu), so that the
#                                     first run on a real GPU can only fail on the GPU itself
#
# It finds the CUDA libraries the programs need (cudart, cuBLAS, NVRTC, NCCL: the toolkit's, or the
# ones PyTorch's wheels bring) and says which it used; reports the driver, toolkit and NCCL
# versions; runs make test-gpu (tests/run.sh --gpu), the chapter-1 and chapter-3 programs on the
# GPU (chapter 3 with one NCCL rank, and with two ranks on the CPU backend with GPU buffers), a rank
# killed in the middle of a job with GPU buffers (tools/gpu_fault_drill.sh), the host's time per
# NCCL all-reduce with each kind of communicator (tools/nccl_host_cost.sh), the DDP equivalence
# test on GPU buffers, chapter 12's GPT (its kernels against its C loops, a short run of nanoGPT's
# GPU setting, and that step's time operation by operation: tools/gpt_op_times.c),
# compute-sanitizer's memcheck, initcheck and synccheck where the toolkit has it, and make bench-gpu
# beside PyTorch. The report goes to
# BUILD/gpu-check/report.txt, with every step's full output beside it, and is printed at the end.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STANDIN=${GPU_CHECK_STANDIN:-0}
OUT="$BUILD/gpu-check"
REPORT="$OUT/report.txt"
rm -rf "$OUT" && mkdir -p "$OUT"
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_BACKEND DDP_DEBUG DDP_NCCL_RING \
      DDP_TIMEOUT DDP_JOB_TOKEN
steps=0 passed=0

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
# step NAME WANT COMMAND...: run, keep the output in OUT/NAME.log; the step passes when the
# command exits 0 and its output has a line matching the extended regex WANT. A step that runs past
# GPU_CHECK_STEP_LIMIT seconds (default 300) is stopped and fails, so that one hung step (an NCCL
# init waiting forever, say) cannot take the whole of a short lease of a GPU machine.
. tests/compat.sh
STEP_LIMIT=${GPU_CHECK_STEP_LIMIT:-300}
step() {
    local name=$1 want=$2 rc t0 t1
    shift 2
    steps=$((steps + 1))
    t0=$(date +%s)
    with_timeout -k 5 "$STEP_LIMIT" "$@" >"$OUT/$name.log" 2>&1; rc=$?
    [ $rc -eq 124 ] && echo "gpu-check: stopped after $STEP_LIMIT s (GPU_CHECK_STEP_LIMIT)" >>"$OUT/$name.log"
    t1=$(date +%s)
    if [ $rc -eq 0 ] && grep -qE -- "$want" "$OUT/$name.log"; then
        passed=$((passed + 1))
        say "PASS $name ($((t1 - t0)) s): $(grep -m1 -E -- "$want" "$OUT/$name.log")"
    else
        say "FAIL $name ($((t1 - t0)) s, exit status $rc); the end of $OUT/$name.log:"
        tail -n 12 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$REPORT"
    fi
}

say "ddp.h gpu-check, $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname)"
if [ "$STANDIN" = 1 ]; then
    PROGS="$BUILD/fakegpu"
    export FAKEGPU_DEVICES=1 FAKEGPU_CACHE
    FAKEGPU_CACHE="$(cd "$BUILD" && pwd)/fakegpu/kernels"
    say "mode: the GPU stand-in (tests/fakegpu, one fake GPU): this checks the flow, not a GPU"
    if [ ! -e "$PROGS/libfakegpu.so" ]; then say "FAIL: $PROGS/libfakegpu.so is not built (run make)"; exit 1; fi
else
    PROGS="$BUILD"
    say "mode: a real GPU"
fi
for p in tests/test_gpu tests/test_gpu_pg tests/test_ddp tests/test_own_model tests/test_gpt examples/ch01_single_gpu \
         examples/ch03_multi_gpu examples/ch06_fault_tolerance examples/ch08_large_mlp examples/ch12_gpt \
         bench/large_mlp_launched allreduce_perf gpt_op_times; do
    if [ ! -x "$PROGS/$p" ]; then
        say "FAIL: $PROGS/$p is not built: run make gpu-check-build (BUILD=$BUILD) on a machine with the CUDA toolkit"
        exit 1
    fi
done

# ---- the libraries: the toolkit's, or PyTorch's wheels' ---------------------------------------------
if [ "$STANDIN" != 1 ]; then
    missing=$(ldd "$PROGS/examples/ch01_single_gpu" | awk '/not found/ {print $1}')
    if [ -n "$missing" ]; then
        # look where the libraries live on this machine: PyTorch's nvidia-* wheels, then the usual places
        dirs=""
        for py in ${BENCH_PY:-} python3 /usr/bin/python3; do
            command -v "$py" >/dev/null 2>&1 || continue
            d=$("$py" -c 'import nvidia, os; r = list(nvidia.__path__)[0]; print(" ".join(sorted(os.path.join(r, x, "lib") for x in os.listdir(r) if os.path.isdir(os.path.join(r, x, "lib")))))' 2>/dev/null)
            [ -n "$d" ] && dirs="$dirs $d"
        done
        dirs="$dirs $(ls -d /usr/local/cuda*/lib64 /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu 2>/dev/null | tr '\n' ' ')"
        for lib in $missing; do
            for d in $dirs; do
                if [ -e "$d/$lib" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
            done
        done
    fi
    still=$(ldd "$PROGS/examples/ch01_single_gpu" | awk '/not found/ {print $1}' | tr '\n' ' ')
    if [ -n "$still" ]; then say "FAIL: no $still on this machine (looked in:$dirs)"; exit 1; fi
    say "libraries: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} (added by gpu-check where the programs' own were missing)"
fi
ldd "$PROGS/examples/ch01_single_gpu" | grep -E 'libcudart|libcublas|libnvrtc|libnccl|libfakegpu' |
    awk '{print "  " $1 " -> " $3}' | tee -a "$REPORT"

# ---- versions ------------------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    say "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -n 4 | tr '\n' ';')"
else
    say "nvidia-smi: not found${STANDIN:+ (the stand-in needs none)}"
fi
say "ddp.h: $("$PROGS/tests/test_gpu" 2>/dev/null | sed -n '1s/^ *//p')"
for py in ${BENCH_PY:-} python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    v=$("$py" -c 'import torch; print("PyTorch %s, CUDA %s, NCCL %s, GPU available: %s" % (torch.__version__, torch.version.cuda, ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-", torch.cuda.is_available()))' 2>/dev/null) && { say "$py: $v"; break; }
done

# ---- the checks ----------------------------------------------------------------------------------------
say ""
step test_gpu '^[0-9]+ passed, 0 failed, [0-9]+ skipped$' env BUILD="$PROGS" bash tests/run.sh --gpu
step chapter1_on_the_gpu '^test accuracy: (0\.9[5-9]|1\.0)' "$PROGS/examples/ch01_single_gpu" --device cuda --save-every 0
step chapter3_one_nccl_rank 'test accuracy: (0\.9[5-9]|1\.0)' \
    env DDP_DEBUG=INFO "$PROGS/examples/ch03_multi_gpu" --nproc 1 --device cuda --save-every 0
grep -q 'backend nccl' "$OUT/chapter3_one_nccl_rank.log" 2>/dev/null ||
    say "  (note: chapter3_one_nccl_rank did not say it joined on the nccl backend)"
step chapter3_cpu_backend_gpu_buffers_2_ranks 'test accuracy: (0\.9[5-9]|1\.0)' \
    env DDP_BACKEND=cpu "$PROGS/examples/ch03_multi_gpu" --nproc 2 --device cuda --save-every 0
step equivalence_on_gpu_buffers '^ok   equivalence_all_worlds_and_buckets' "$PROGS/tests/test_ddp" --gpu
# a model of one's own (its tensors on the GPU, its forward and backward through host copies)
step own_model_on_gpu_buffers '^ok   own_model_equivalence' "$PROGS/tests/test_own_model" --gpu
# chapter 12's GPT: its kernels (examples/gpt.h, compiled by ddp_kernels_compile) against its C loops
# on one batch, then a short run of nanoGPT's GPU setting (the stand-in: a tiny model)
step gpt_kernels_match_cpu '^ok   gpt_gpu_matches_cpu' "$PROGS/tests/test_gpt" --gpu
if [ "$STANDIN" = 1 ]; then gpt_size=(--layers 2 --heads 2 --width 32 --ctx 32 --batch-size 4)
else gpt_size=(--layers 6 --heads 6 --width 384 --ctx 256 --batch-size 64); fi
step chapter12_gpt_on_the_gpu '^step +60/60 .* tokens/s' "$PROGS/examples/ch12_gpt" --device cuda "${gpt_size[@]}" \
    --steps 60 --warmup 10 --log-every 10 --eval-every 0 --eval-batches 4 --sample 200
# where that step's time goes, operation by operation (tools/gpt_op_times.c); the table goes into the report
step gpt_op_times '^the operations, each timed alone' "$PROGS/gpt_op_times" --device cuda "${gpt_size[@]}"
sed -n '/^whole step/,$s/^/    /p' "$OUT/gpt_op_times.log" | tee -a "$REPORT"
# the fault drill one GPU allows (tools/gpu_fault_drill.sh): rank 1 of 2 on the CPU backend with GPU
# buffers killed with kill -9, started by hand; rank 0 must fail naming the loss (the time is reported)
step fault_drill_peer_killed 'rank 0 failed after [0-9.]+ s with DDP_ERR_PEER_LOST' bash tools/gpu_fault_drill.sh "$PROGS" "$OUT"
# the NCCL communicator's two modes measured by the host's time per all-reduce, one rank
# (tools/nccl_host_cost.sh)
step nccl_host_cost 'costs the host: non-blocking issue' bash tools/nccl_host_cost.sh "$PROGS" "$OUT"
# compute-sanitizer (the toolkit's): out-of-bounds and misaligned accesses, leaks, reads of device
# memory never written, and barrier misuse, in ddp.h's kernels and CUDA calls. Not on the stand-in,
# whose "GPU" is the host.
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ "$STANDIN" != 1 ] && [ -n "$CS" ]; then
    step memcheck_test_gpu 'ERROR SUMMARY: 0 errors' "$CS" --error-exitcode 99 --leak-check full \
        env DDP_REQUIRE_GPU=1 "$PROGS/tests/test_gpu"
    step initcheck_chapter1 'ERROR SUMMARY: 0 errors' "$CS" --tool initcheck --error-exitcode 99 \
        "$PROGS/examples/ch01_single_gpu" --device cuda --epochs 5 --save-every 0
    step synccheck_chapter1 'ERROR SUMMARY: 0 errors' "$CS" --tool synccheck --error-exitcode 99 \
        "$PROGS/examples/ch01_single_gpu" --device cuda --epochs 3 --save-every 0
else
    if [ "$STANDIN" = 1 ]; then say "compute-sanitizer steps: not run (the stand-in is not a GPU)"
    else say "compute-sanitizer steps: not run (no compute-sanitizer on PATH or in /usr/local/cuda/bin)"; fi
fi
if [ "$STANDIN" = 1 ]; then
    step bench_gpu 'took [0-9]+ s' env BENCH_FAKEGPU=1 BENCH_HAVE_CUDA=1 BENCH_STEPS=1 BENCH_WARMUP=1 BENCH_STEP_ROUNDS=1 \
        python3 bench/run.py --gpu "$BUILD"
else
    step bench_gpu 'took [0-9]+ s' env BENCH_HAVE_CUDA=1 python3 bench/run.py --gpu "$BUILD"
fi
if [ -s "$OUT/bench_gpu.log" ]; then
    say ""
    say "make bench-gpu's table (targets: the large model's step at most 1.1x PyTorch's; the tutorial model's"
    say "step at most 0.5x PyTorch's; the GPT's at most 1.0x PyTorch eager's):"
    sed -n '/^=\{20,\}/,$p' "$OUT/bench_gpu.log" | tee -a "$REPORT"
fi
say ""
say "gpu-check: $passed of $steps steps passed; the logs are in $OUT"
[ $passed -eq $steps ]
