#!/usr/bin/env bash
# tests/test_fakegpu.sh BUILD: ddp.h's GPU path on the GPU stand-in (tests/fakegpu), a section of
# make test. The programs under BUILD/fakegpu are the usual sources linked with the stand-in in
# place of cudart, cuBLAS, NVRTC and NCCL; FAKEGPU_DEVICES says how many GPUs the machine has.
# What this proves: the host-side logic of the GPU path, stream and event ordering, the use of
# NCCL (blocking rules, errors, aborts) and multi-rank NCCL, which no machine of ours can run.
# What only a real GPU proves: the driver, PTX JIT, real numerics and speed (make gpu-check).
# Each case prints "ok   name", "FAIL name" (then details) or "skip name: reason".
set -u
BUILD=${1:-build}
FG="$BUILD/fakegpu"
pass=0 fail=0 skip=0
TMP=$(mktemp -d)
cleanup() {
    pkill -9 -f "$TMP" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
unset DDP_JOB_TOKEN RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT DDP_TIMEOUT \
      DDP_BACKEND DDP_NCCL_RING DDP_DEBUG DDP_TRACE CUDA_VISIBLE_DEVICES FAKEGPU_TRACE
# kernels compiled by the stand-in are kept with the build, so each is compiled once
export FAKEGPU_CACHE
FAKEGPU_CACHE="$(cd "$BUILD" && pwd)/fakegpu/kernels"

ok()  { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; shift; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }
skp() { echo "skip $1: $2"; skip=$((skip + 1)); }

if [ ! -e "$FG/libfakegpu.so" ]; then
    skp fakegpu_section "the stand-in is built only with the CUDA toolkit's headers (make found none: see its first line)"
    exit 0
fi

# A test program: its own ok/FAIL/skip lines pass through; a crash without a FAIL line is one.
prog() {
    local name=$1 out rc f p
    shift
    echo "== $name"
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(grep -c '^ok ' <<<"$out"); f=$(grep -c '^FAIL ' <<<"$out")
    pass=$((pass + p)); fail=$((fail + f))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then bad "$name" "exited with status $rc without reporting a failed case"; fi
}

# ---- the stand-in itself -------------------------------------------------------------------------
prog fakegpu_selftest "$FG/tests/fakegpu/selftest"

# It exports exactly the CUDA, cuBLAS, NVRTC and NCCL functions ddp.h calls (cuBLAS's under the
# _v2 names its header maps them to).
echo "== exports"
inc=$(sed -n 's/.*-I\([^ ]*\).*/\1/p' <<<"${CUDA_CFLAGS:--I/usr/local/cuda/include}")
want=$(grep -oE '\b(cuda|cublas|nvrtc|nccl)[A-Z][A-Za-z0-9_]*[[:space:]]*\(' ddp.h | tr -d ' (' | sort -u |
       while read -r f; do
           v=$(sed -n "s/^#define $f \([A-Za-z0-9_]*\)\$/\1/p" "$inc/cublas_v2.h" 2>/dev/null | head -n 1)
           echo "${v:-$f}"
       done | sort -u)
have=$(nm -D --defined-only "$FG/libfakegpu.so" | awk '{print $3}' | sort -u)
if [ "$want" = "$have" ]; then ok "fakegpu_exports_what_ddp_h_calls ($(wc -l <<<"$want") functions)"
else bad fakegpu_exports_what_ddp_h_calls "ddp.h calls, the stand-in lacks: $(comm -23 <(echo "$want") <(echo "$have") | tr '\n' ' ')" \
         "the stand-in has, ddp.h does not call: $(comm -13 <(echo "$want") <(echo "$have") | tr '\n' ' ')"; fi

# ---- the GPU tests, on one GPU and on four --------------------------------------------------------
prog "test_gpu (1 GPU)" env FAKEGPU_DEVICES=1 DDP_REQUIRE_GPU=1 "$FG/tests/test_gpu"
prog "test_gpu (4 GPUs)" env FAKEGPU_DEVICES=4 DDP_REQUIRE_GPU=1 "$FG/tests/test_gpu"
prog "test_gpu_pg (4 GPUs)" env FAKEGPU_DEVICES=4 DDP_REQUIRE_GPU=1 "$FG/tests/test_gpu_pg"
prog "test_ddp --gpu (4 GPUs, NCCL)" env FAKEGPU_DEVICES=4 "$FG/tests/test_ddp" --gpu

# ---- the chapter-3 program over NCCL ----------------------------------------------------------------
echo "== chapter 3 on NCCL"
for n in 2 4; do
    out=$(FAKEGPU_DEVICES=$n DDP_DEBUG=INFO timeout 300 "$FG/examples/02_multi_gpu" --nproc $n --device cuda \
          --save-every 0 2>&1)
    acc=$(sed -n 's/^\(\[rank [0-9]*\]: \)\{0,1\}test accuracy: //p' <<<"$out")
    joined=$(grep -c 'joined the job on host .*: backend nccl, device cuda:' <<<"$out")
    if [ -n "$acc" ] && awk "BEGIN{exit !($acc >= 0.95)}" && [ "$joined" = $n ]; then
        ok "example02_nccl_${n}_ranks (test accuracy $acc; $n ranks on NCCL, one GPU each)"
    else
        bad "example02_nccl_${n}_ranks" "want test accuracy >= 0.95 and $n ranks joined on nccl ($joined did)" \
            "$(grep -E 'DDP_ERR|accuracy|fakegpu' <<<"$out" | tail -n 6)"
    fi
done

echo "$pass passed, $fail failed, $skip skipped (GPU stand-in)"
[ $fail -eq 0 ]
