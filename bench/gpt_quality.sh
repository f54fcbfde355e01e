#!/usr/bin/env bash
# Chapter 12's quality, side by side with PyTorch: nanoGPT's laptop setting (4 layers, 4 heads,
# 128 wide, context 64, 12 sequences a step, 2,000 steps) trained by examples/ch12_gpt on 2 ranks
# of 6 sequences, and by nanoGPT's own loop in PyTorch (bench/gpt_torch.py train: one process, 12
# sequences drawn at random), once per seed. Both are then measured on the same held-out windows:
# the 20-batch estimate the chapter prints, and the whole held-out text (--eval-all). One seed's
# figure differs from another's by up to a few hundredths, so a target such as nanoGPT's "about
# 1.88" is a question for the mean over seeds, asked of both programs.
#
#   bash bench/gpt_quality.sh [BUILD]        SEEDS="1337 1 2 3 4" STEPS=2000 by default; the logs and
#                                            a CSV go to BUILD/bench/gpt_quality (or GPT_QUALITY_OUT)
#
# About 5 minutes per seed on 2 cores (25 for the five) (the PyTorch run is the longer). Needs PyTorch (python3-torch).
# TUTORIAL chapter 12 quotes docs/figures/data/gpt_quality.csv, a copy of the CSV this writes
# (docs/figures/claims.py checks the quotes against it).
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SEEDS=${SEEDS:-1337 1 2 3 4}
STEPS=${STEPS:-2000}
PY=${BENCH_PY:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
OUT=${GPT_QUALITY_OUT:-$BUILD/bench/gpt_quality}
mkdir -p "$OUT"
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_BACKEND DDP_DEBUG
if [ ! -x "$BUILD/examples/ch12_gpt" ]; then echo "gpt_quality: $BUILD/examples/ch12_gpt is not built: run make" >&2; exit 1; fi
if ! "$PY" -c 'import torch' 2>/dev/null; then echo "gpt_quality: no PyTorch for $PY (apt install python3-torch)" >&2; exit 1; fi

csv="$OUT/results.csv"
cpu=$( { sysctl -n machdep.cpu.brand_string || lscpu | sed -n 's/^Model name:[[:space:]]*//p'; } 2>/dev/null | head -n 1)
{
    echo "# bench/gpt_quality.sh: nanoGPT's laptop setting, $STEPS steps, by examples/ch12_gpt (2 ranks x 6) and by"
    echo "# nanoGPT's loop in PyTorch (bench/gpt_torch.py train, 1 process x 12), one row per seed; losses on the"
    echo "# held-out text: val the 20 batches the chapter prints, whole every window once; minutes per run"
    echo "# machine: $(uname -s) $(uname -m), $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?') cores${cpu:+ ($cpu)}"
    echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "seed,ddp_val,ddp_whole,ddp_minutes,torch_val,torch_whole,torch_minutes"
} >"$csv"
printf '%-6s %22s %22s\n' "" "ddp.h, 2 ranks x 6" "PyTorch (nanoGPT's loop)"
printf '%-6s %8s %8s %5s %8s %8s %5s\n' seed val whole min val whole min
for s in $SEEDS; do
    t0=$(date +%s)
    "$BUILD/examples/ch12_gpt" --nproc 2 --batch-size 6 --steps "$STEPS" --log-every 500 --eval-every 0 \
        --eval-all 1 --sample 0 --save-every 0 --seed "$s" >"$OUT/ddp_$s.log" 2>&1 || {
        echo "gpt_quality: ch12_gpt failed (seed $s): the end of $OUT/ddp_$s.log:" >&2; tail -5 "$OUT/ddp_$s.log" >&2; exit 1; }
    t1=$(date +%s)
    dv=$(sed -n "s/^step $STEPS: train loss [0-9.]*, val loss \([0-9.]*\)$/\1/p" "$OUT/ddp_$s.log")
    dw=$(sed -n 's/^val loss on the whole held-out text ([0-9]* batches): \([0-9.]*\)$/\1/p' "$OUT/ddp_$s.log")
    "$PY" bench/gpt_torch.py train --world 2 --batch-size 6 --steps "$STEPS" --seed "$s" --threads 1 \
        >"$OUT/torch_$s.log" 2>&1 || {
        echo "gpt_quality: gpt_torch.py failed (seed $s): the end of $OUT/torch_$s.log:" >&2; tail -5 "$OUT/torch_$s.log" >&2; exit 1; }
    line=$(grep '^result ' "$OUT/torch_$s.log")
    tv=$(echo "$line" | sed -n 's/.* val=\([0-9.]*\).*/\1/p')
    tw=$(echo "$line" | sed -n 's/.* whole=\([0-9.]*\).*/\1/p')
    tm=$(echo "$line" | sed -n 's/.* minutes=\([0-9.]*\).*/\1/p')
    dm=$(awk -v t=$((t1 - t0)) 'BEGIN { printf "%.1f", t / 60 }')
    if [ -z "$dv" ] || [ -z "$dw" ] || [ -z "$tv" ] || [ -z "$tw" ]; then
        echo "gpt_quality: a loss is missing from $OUT/ddp_$s.log or $OUT/torch_$s.log" >&2; exit 1
    fi
    printf '%-6s %8s %8s %5s %8s %8s %5s\n' "$s" "$dv" "$dw" "$dm" "$tv" "$tw" "$tm"
    echo "$s,$dv,$dw,$dm,$tv,$tw,$tm" >>"$csv"
done
awk -F, '/^[0-9]/ { n++; for (i = 2; i <= 7; i++) { s[i] += $i; q[i] += $i * $i } }
    END { printf "%-6s", "mean"; for (i = 2; i <= 7; i++) printf (i == 4 || i == 7) ? " %5.1f" : " %8.4f", s[i] / n;
          printf "\n"; if (n < 2) exit; printf "%-6s", "sd"
          for (i = 2; i <= 7; i++) { v = (q[i] - s[i] * s[i] / n) / (n - 1)
              printf (i == 4 || i == 7) ? " %5s" : " %8.4f", (i == 4 || i == 7) ? "" : sqrt(v > 0 ? v : 0) }
          printf "\n" }' "$csv"
echo "(val: the 20 batches the chapter prints; whole: every window of the held-out text; min: minutes; $csv)"
