#!/usr/bin/env bash
# The test runner behind `make test` (`make test-gpu` with --gpu, `make test-faults` with --faults).
# Runs every test program and the shell-level checks below, and ends with one line: N passed, N
# failed, N skipped.
# Each case reports one line, "ok   name", "FAIL name" or "skip name: reason"; a skip is never a pass.
set -u
cd "$(dirname "$0")/.."
. tests/compat.sh   # with_timeout, read_lines: what macOS's bash 3.2 and BSD tools lack
BUILD=${BUILD:-build}
GPU_ONLY=0 FAULTS=0
[ "${1:-}" = "--gpu" ] && GPU_ONLY=1
[ "${1:-}" = "--faults" ] && FAULTS=1
. tests/report.sh   # pass, fail, skip; ok, bad, skp, run_prog
# What a user exported while following the tutorial (DDP_DATA_DIR, DDP_DEBUG, a launcher's RANK or
# MASTER_PORT, a SLURM allocation's SLURM_*) must not steer the suite: each case sets what it needs.
# Kept: DDP_TSAN (make tsan says which build this is) and DDP_TEST_* (the suite's own knobs). H_ONLY
# (one case of a unit test, while working on it) goes too.
for v in $(compgen -e); do
    case $v in
        DDP_TSAN|DDP_TEST_*) ;;
        DDP_*|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK|MASTER_ADDR|MASTER_PORT|\
        TORCHELASTIC_*|SLURM_*|OMPI_COMM_WORLD_*|PMI_*|PMIX_RANK|H_ONLY) unset "$v" ;;
    esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SKIP_REASONS=$TMP/skip_reasons
# Under a sanitizer build (make sanitize, make tsan), checks whose programs do not depend on the
# build's flags (compilers, shell helpers, the fuzzers' own ASan build) or that test logic the plain
# build already tested are left to make test: they would only repeat it (CI's minutes).
case $BUILD in */sanitize|*/tsan) plain_only=1 ;; *) plain_only=0 ;; esac
plain_why="make test runs it in the plain build; it does not depend on this build's flags"

# ---- the GPU suite (make test-gpu) -----------------------------------------------------------
if [ $GPU_ONLY = 1 ]; then
    run_prog test_gpu env DDP_REQUIRE_GPU=1 "$BUILD/tests/test_gpu"
    run_prog test_gpu_pg env DDP_REQUIRE_GPU=1 "$BUILD/tests/test_gpu_pg"
    out=$("$BUILD/examples/ch01_single_gpu" --device cuda --save-every 0 --snapshot "$TMP/c" 2>&1)
    acc=$(sed -n 's/^test accuracy: //p' <<<"$out")
    if [ -n "$acc" ] && awk "BEGIN{exit !($acc >= 0.95)}"; then ok "ch01_gpu_wine_accuracy ($acc)"
    else bad ch01_gpu_wine_accuracy "$(tail -n 3 <<<"$out")"; fi
    echo "$pass passed, $fail failed, $skip skipped"
    [ $fail -eq 0 ]; exit
fi

# ---- the longer fault drills (make test-faults) ---------------------------------------------------
if [ $FAULTS = 1 ]; then
    run_prog test_restart bash tests/multiproc/test_restart.sh "$BUILD" 20
    run_prog "test_cycles (200 cycles)" env DDP_TEST_CYCLES=200 "$BUILD/tests/test_cycles"
    echo "$pass passed, $fail failed, $skip skipped"
    [ $fail -eq 0 ]; exit
fi

# ---- unit tests ------------------------------------------------------------------------------
for t in test_basics test_nn test_data test_gpu test_gpu_pg test_store test_env test_pg test_ddp test_own_model test_gpt test_sampler test_snapshot test_desync test_cycles; do
    run_prog "$t" "$BUILD/tests/$t"
done
# on one machine the CPU backend moves data through shared memory: the TCP ring's own run
for t in test_pg test_desync; do
    run_prog "$t (DDP_TRANSPORT=tcp)" env DDP_TRANSPORT=tcp "$BUILD/tests/$t"
done
# where TCP's cost model picks recursive doubling (small all-reduces, 3 ranks or more), each
# algorithm alone: every size, dtype and op through doubling, and through the ring (segments of
# no element when the count is below the world size)
for a in doubling ring; do
    run_prog "test_pg (DDP_TRANSPORT=tcp DDP_ALGO=$a)" env DDP_TRANSPORT=tcp DDP_ALGO=$a "$BUILD/tests/test_pg"
done
# and shared memory in chunks of 4 KiB: every collective crosses many chunks and both slot sets,
# with the all-reduces up to 4 KiB in one step between them (DDP_SHM_ONE_STEP_BYTES)
# (not under ThreadSanitizer: the default chunks take the same slot protocol through the same
# code, its largest messages over many chunks, and this run cost TSan's suite two minutes)
if [ "${DDP_TSAN:-0}" = 1 ]; then
    skp "test_pg (DDP_SHM_CHUNK_BYTES=4096, one step up to 4096)" "make test and make sanitize run it; under TSan test_pg's default chunks take the same code"
else
    run_prog "test_pg (DDP_SHM_CHUNK_BYTES=4096, one step up to 4096)" env DDP_SHM_CHUNK_BYTES=4096 DDP_SHM_ONE_STEP_BYTES=4096 "$BUILD/tests/test_pg"
fi
# the GPU path on the GPU stand-in (tests/fakegpu): CUDA, cuBLAS, NVRTC and NCCL emulated on the CPU
run_prog "GPU stand-in" bash tests/fakegpu/test_fakegpu.sh "$BUILD"
run_prog test_ddprun bash tests/multiproc/test_ddprun.sh "$BUILD/ddprun"
# (under TSan, bad input is refused before any thread of ddp.h's starts, or by the threads test_pg
# and test_ddp run there; under both sanitizers, the learners' mistakes reach the reducer's paths
# for unused parameters, uneven inputs and no_sync, which test_ddp runs there: CI's minutes)
if [ "${DDP_TSAN:-0}" = 1 ]; then
    skp test_bad_input "make test and make sanitize run it; under TSan its programs start no thread that test_pg and test_ddp do not"
else run_prog test_bad_input bash tests/multiproc/test_bad_input.sh "$BUILD"; fi
if [ $plain_only = 1 ]; then
    skp test_confusions "make test runs it; the library paths its mistakes reach are test_ddp's, which runs in this build"
else run_prog test_confusions bash tests/multiproc/test_confusions.sh "$BUILD"; fi
# (the kill-and-resume drill: 5 random kills; 2 under a sanitizer, whose rounds take the same paths)
run_prog test_restart bash tests/multiproc/test_restart.sh "$BUILD" "$([ $plain_only = 1 ] && echo 2 || echo 5)"
run_prog test_transport bash tests/multiproc/test_transport.sh "$BUILD"
# (not under TSan: the GPT's threads are the reducer's, which test_own_model runs under TSan; the
# chapter's program only adds arithmetic, and took TSan's suite 40 s)
if [ "${DDP_TSAN:-0}" = 1 ]; then
    skp "test_gpt (processes)" "make test and make sanitize run it; under TSan its threads are test_own_model's"
else run_prog test_gpt bash tests/multiproc/test_gpt.sh "$BUILD"; fi

# ---- a snapshot read in Python: struct + json + numpy, the checksum rule, every tensor exact ----
section "snapshot in numpy"
if [ ! -x /usr/bin/python3 ]; then
    skp snapshot_read_by_numpy "/usr/bin/python3 is not installed (apt-get install python3 python3-numpy)"
elif ! /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1; then
    skp snapshot_read_by_numpy "numpy is not installed for /usr/bin/python3 (apt-get install python3-numpy)"
elif ! out=$("$BUILD/tests/snapshot_dump" "$TMP/dump.safetensors" "$TMP/dump.txt" 2>&1); then
    bad snapshot_read_by_numpy "snapshot_dump failed:" "$(tail -n 3 <<<"$out")"
elif out=$(/usr/bin/python3 tests/crosscheck/snapshot_numpy.py "$TMP/dump.safetensors" "$TMP/dump.txt" 2>&1); then
    ok "snapshot_read_by_numpy ($out tensors)"
else
    bad snapshot_read_by_numpy "$(tail -n 5 <<<"$out")"
fi

# ---- the sampler against PyTorch's DistributedSampler: exact without shuffling, the rules with it ----
section "sampler against PyTorch"
if [ $plain_only = 1 ]; then
    skp sampler_matches_pytorch "make test runs it in the plain build: it compares the sampler's indices, which test_sampler checks here"
elif [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
    skp sampler_matches_pytorch "/usr/bin/python3 with torch not found (apt-get install python3-torch)"
elif [ ! -x "$BUILD/tests/sampler_dump" ]; then
    bad sampler_matches_pytorch "$BUILD/tests/sampler_dump is not built"
elif out=$(/usr/bin/python3 tests/crosscheck/sampler_torch.py "$BUILD/tests/sampler_dump" 2>&1); then
    ok "sampler_matches_pytorch ($out)"
else
    read_lines sampler_lines < <(tail -n 15 <<<"$out")
    bad sampler_matches_pytorch "${sampler_lines[@]}"
fi

# ---- fuzzing: a short fixed-seed libFuzzer round of the snapshot reader and the store server -----
# (make fuzz runs them for longer). A crash's input is kept as $BUILD/fuzz/crash-*.
section "fuzz"
FUZZ_CC=${FUZZ_CC:-clang}
fuzz_works=0
if command -v "$FUZZ_CC" >/dev/null 2>&1 &&
   printf 'int LLVMFuzzerTestOneInput(const unsigned char* d, unsigned long n) { (void)d; (void)n; return 0; }\n' |
   "$FUZZ_CC" -x c -fsanitize=fuzzer,address,undefined - -o "$TMP/fuzz_probe" >/dev/null 2>&1; then
    fuzz_works=1
fi
for f in snapshot store; do
    name=fuzz_${f}_short bin="$BUILD/fuzz/fuzz_$f"
    if [ $plain_only = 1 ]; then skp "$name" "$plain_why (the fuzzers have their own ASan build)"; continue; fi
    if [ $fuzz_works = 0 ]; then skp "$name" "clang with libFuzzer not found (apt-get install clang libclang-rt-14-dev)"; continue; fi
    if ! out=$(make --no-print-directory BUILD="$BUILD" FUZZ_CC="$FUZZ_CC" "$bin" 2>&1); then
        bad "$name" "building $bin failed:" "$(tail -n 5 <<<"$out")"; continue
    fi
    mkdir -p "$TMP/fuzz_$f" "$TMP/seeds_$f"
    DDP_FUZZ_WRITE_SEEDS="$TMP/seeds_$f" "$bin" >/dev/null 2>&1
    out=$(with_timeout 300 "$bin" -seed=1 -runs=20000 -artifact_prefix="$BUILD/fuzz/" "$TMP/fuzz_$f" "tests/fuzz/corpus_$f" "$TMP/seeds_$f" 2>&1); rc=$?
    runs=$(sed -n 's/^Done \([0-9]*\) runs in .*/\1/p' <<<"$out")
    if [ $rc = 0 ] && [ -n "$runs" ]; then ok "$name ($runs runs, no crash)"
    else bad "$name" "exit status $rc; the input that crashed it: $(sed -n 's/.*Test unit written to //p' <<<"$out")" \
             "$(grep -m 3 -E 'ERROR|runtime error|fuzz_(snapshot|store): ' <<<"$out")"; fi
done

# ---- the classroom labs (labs/README.md): each starter builds and fails its tests, each solution passes ----
section "docs"
# The tutorial never rots: every generated diff is current, and every block of TUTORIAL.md and
# README.md marked runnable runs as written, with the output shown where the text marks it.
if ! command -v python3 >/dev/null 2>&1; then
    skp docs_diffs "python3 is not installed (apt-get install python3)"; skp docs_runnable_blocks "python3 is not installed (apt-get install python3)"
else
    run_prog docs_diffs python3 tools/docs.py diffs --check
    case $BUILD in
        */sanitize|*/tsan) skp docs_runnable_blocks "make test runs the tutorial's commands; under a sanitizer they would only repeat the cases above, several times slower" ;;
        *) run_prog docs_runnable_blocks python3 tools/docs.py run "$BUILD" TUTORIAL.md README.md ;;
    esac
fi

# The public API stays small and earns its place: at most 90 DDP_API functions (80 until a model of
# one's own came: its tensors, unit brackets, clipping and learning rate), each one used by an
# example, a lab, a tool or a bench program, or taught in TUTORIAL.md (the rest are ddp__ internals,
# which the tests may call). ddp_check_failed is what DDP_CHECK expands to in every example.
api=$(sed -n 's/^DDP_API [^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' ddp.h)
n_api=$(wc -w <<<"$api" | tr -d ' ')
unused=""
for f in $api; do
    if [ "$f" = ddp_check_failed ] && grep -q 'ddp_check_failed(ddp_check_s_' ddp.h && grep -q 'DDP_CHECK(' examples/*.c; then continue; fi
    grep -qw -- "$f" examples/*.c examples/*.h labs/*.c labs/*/*.c tools/*.c bench/*.c TUTORIAL.md 2>/dev/null || unused="$unused $f"
done
if [ "$n_api" -gt 0 ] && [ "$n_api" -le 90 ] && [ -z "$unused" ]; then ok "public_api_used_or_taught ($n_api DDP_API functions)"
else bad public_api_used_or_taught "$n_api DDP_API functions (at most 90); used by no example, lab, tool or bench program and not in TUTORIAL.md:${unused:- none}"; fi

# The header's map (its top comment) lists the sections in the order their banners stand, and
# Part II, the machinery, begins at most a little past the middle of the file (Part I is the course;
# 54%, up from 52% when Part I gained a model of one's own: describing tensors, the unit brackets
# and their errors, clipping and the learning rate, which chapter 12 reads).
map_tags=$(sed -n '/^    THE MAP: /,/^    GLOSSARY/p' ddp.h | grep -o '^        >>[a-z]*' | tr -d ' ' | tr '\n' ' ')
file_tags=$(grep -o '^/\* >>[a-z]*: [a-zA-Z]' ddp.h | sed 's/^\/\* //; s/: [a-zA-Z]$//' | tr '\n' ' ')
part2_at=$(grep -n '^/\*  PART II: THE MACHINERY' ddp.h | cut -d: -f1)
n_lines=$(wc -l < ddp.h)
if [ -n "$map_tags" ] && [ "$map_tags" = "$file_tags" ] && [ -n "$part2_at" ] && [ $((part2_at * 100)) -le $((n_lines * 54)) ]
then ok "header_map_matches (${map_tags% }; Part II at line $part2_at of $n_lines)"
else bad header_map_matches "the map lists: $map_tags" "the banners are: $file_tags" "Part II begins at line ${part2_at:-?} of $n_lines (at most 54%)"; fi

# make figures' cheapest measurements, parsed from the programs' real output into a scratch folder:
# a change in what the programs print that its parsers no longer read fails here (the others run
# the same programs at full size: `make figures`, about 7 minutes).
case $BUILD in
    */sanitize|*/tsan) skp figures_measure_quick "the parsers read the same lines in the plain build" ;;
    *)
    if ! command -v python3 >/dev/null 2>&1; then skp figures_measure_quick "python3 is not installed (apt-get install python3)"
    elif out=$(FIG_DATA="$TMP/figdata" with_timeout 120 python3 docs/figures/measure.py "$BUILD" ring loss 2>&1) &&
         [ "$(grep -c '^[0-9]' "$TMP/figdata/ring_steps.dat" 2>/dev/null)" = 48 ] &&
         [ "$(grep -c '^[0-9]' "$TMP/figdata/loss.dat" 2>/dev/null)" -gt 0 ]; then
        ok "figures_measure_quick (ring: the 48 sends and receives of 4 ranks parsed; the loss curves)"
    else bad figures_measure_quick "docs/figures/measure.py ring loss:" "$(tail -n 6 <<<"$out")"; fi ;;
esac

# make bench's parsers: every program it times, once, at the smallest sizes (BENCH_SMOKE=1, about a
# minute, into a scratch folder): a change in what a program prints that bench/run.py no longer
# reads leaves a cell without a figure, and fails here (`make bench` itself takes about 9 minutes).
case $BUILD in
    */sanitize|*/tsan) skp bench_smoke "the parsers read the same lines in the plain build" ;;
    *)
    if ! command -v python3 >/dev/null 2>&1; then skp bench_smoke "python3 is not installed (apt-get install python3)"
    elif out=$(BENCH_SMOKE=1 BENCH_OUT="$TMP/bench" with_timeout 400 python3 bench/run.py "$BUILD" 2>&1); then
        ok "bench_smoke ($(sed -n 's/.*every cell it ran has a figure (\(.*\))/\1/p' <<<"$out"), every cell that ran has its figure)"
    else bad bench_smoke "BENCH_SMOKE=1 python3 bench/run.py $BUILD:" "$(tail -n 8 <<<"$out")"; fi ;;
esac

# bench/gpt_quality.sh (chapter 12's loss beside PyTorch's, over seeds) at 3 steps of one seed: its
# two programs run, and the four losses it reads are the untrained model's, about ln 65 = 4.17.
case $BUILD in
    */sanitize|*/tsan) skp gpt_quality_smoke "the parsers read the same lines in the plain build" ;;
    *)
    if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
        skp gpt_quality_smoke "no PyTorch for /usr/bin/python3 (apt-get install python3-torch)"
    elif out=$(STEPS=3 SEEDS=7 GPT_QUALITY_OUT="$TMP/gpt_quality" with_timeout 300 bash bench/gpt_quality.sh "$BUILD" 2>&1) &&
         awk '$1 == 7 { for (i = 2; i <= 6; i++) if (i != 4 && ($i < 4.0 || $i > 4.35)) exit 1; n++ } END { exit n != 1 }' <<<"$out"; then
        ok "gpt_quality_smoke ($(awk '$1 == 7 { print "val " $2 " and " $5 ", whole " $3 " and " $6 }' <<<"$out"))"
    else bad gpt_quality_smoke "STEPS=3 SEEDS=7 bash bench/gpt_quality.sh $BUILD:" "$(tail -n 8 <<<"$out")"; fi ;;
esac

# The figures redraw from their committed data (into a copy: the test never touches docs/).
if ! command -v gnuplot >/dev/null 2>&1; then
    skp figures_render "gnuplot is not installed (apt-get install gnuplot-nox)"
else
    cp -r docs/figures "$TMP/figures" && rm -f "$TMP"/figures/*.png
    fig_bad=()
    for gp in "$TMP"/figures/*.gp; do
        case $gp in */style.gp) continue ;; esac
        png=${gp%.gp}.png
        out=$(cd "$TMP/figures" && gnuplot "$(basename "$gp")" 2>&1)
        [ -s "$png" ] || fig_bad+=("$(basename "$gp") drew nothing: $out")
    done
    if [ ${#fig_bad[@]} -eq 0 ]; then ok "figures_render ($(ls "$TMP"/figures/*.png | wc -l) PNGs from docs/figures/data)"
    else bad figures_render "${fig_bad[@]}"; fi
fi

# The numbers TUTORIAL.md and README.md quote from the figures' data match that data (after a new
# `make figures`, the text must be brought along).
case $BUILD in
    */sanitize|*/tsan) skp figures_claims "the text and data are the same in every build" ;;
    *)
    if ! command -v python3 >/dev/null 2>&1; then skp figures_claims "python3 is not installed (apt-get install python3)"
    elif out=$(python3 docs/figures/claims.py 2>&1); then ok "figures_claims (${out#claims.py: })"
    else bad figures_claims "$out"; fi ;;
esac

section "labs"
for lab in sampler ring buckets no_sync resume measure zero1 gpt; do
    for kind in starter solution; do
        name=lab_${lab}_${kind}_$([ $kind = starter ] && echo fails || echo passes)
        sol=(); [ $kind = solution ] && sol=(SOLUTION=1)
        # that a starter fails is the lab's logic (and often waits out a deadline): plain build only
        if [ $kind = starter ] && [ $plain_only = 1 ]; then skp "$name" "make test runs it in the plain build: a starter failing is the lab's logic, not ddp.h's memory or threads"; continue; fi
        # LAB_TIMING=report: the measure lab's timing verdicts are printed, not enforced (this suite
        # proves mechanisms by values; a busy machine bends timings). A student's make lab-measure enforces them.
        out=$(LAB_TIMING=report make --no-print-directory BUILD="$BUILD" "lab-$lab" ${sol[@]+"${sol[@]}"} 2>&1); rc=$?
        p=$(grep -c '^ok ' <<<"$out"); f=$(grep -c '^FAIL ' <<<"$out"); s=$(grep -c '^skip ' <<<"$out")
        if grep -q "^skip lab_${lab}: " <<<"$out"; then  # the solutions were removed (a student's copy)
            skp "$name" "$(sed -n "s/^skip lab_${lab}: //p" <<<"$out")"
        elif grep -q "^FAIL lab_${lab}_build" <<<"$out"; then
            bad "$name" "labs/$lab does not build with the $kind:" "$(sed -n '/^FAIL lab_/,$p' <<<"$out" | sed -n '2,8p')"
        elif grep -q "the compiler warns" <<<"$out"; then
            bad "$name" "the $kind of labs/$lab builds with warnings:" "$(grep -m 4 'warning:' <<<"$out")"
        elif ! grep -q '^[0-9]* passed, [0-9]* failed, [0-9]* skipped$' <<<"$out"; then
            bad "$name" "the test program ended without its summary (exit status $rc):" "$(tail -n 4 <<<"$out")"
        elif [ $kind = starter ] && [ "$f" -gt 0 ]; then
            ok "$name ($f of $((p + f + s)) tests fail)"
        elif [ $kind = starter ] && [ "$p" -gt 0 ]; then
            bad "$name" "labs/$lab/starter.c passes all $p tests: a student would have nothing to do"
        elif [ $kind = solution ] && [ "$f" -eq 0 ] && [ "$p" -gt 0 ] && [ $rc -eq 0 ]; then
            ok "$name ($p tests$([ "$s" -gt 0 ] && echo ", $s skipped"))"
        elif [ "$f" -eq 0 ] && [ "$p" -eq 0 ]; then
            skp "$name" "$(grep -m 1 '^skip ' <<<"$out" | sed 's/^skip [^:]*: //')"
        else
            read_lines lab_lines < <(grep -A 3 '^FAIL ' <<<"$out" | head -n 12)
            bad "$name" "labs/solutions/$lab.c fails $f test(s) (exit status $rc):" "${lab_lines[@]}"
        fi
    done
done

# Each lab's deliberately wrong solutions (labs/solutions/wrong/LAB/*.patch) are caught, with the
# message that names the rule each one breaks. These and the handout check the labs' logic, not
# ddp.h's memory or threads: the sanitizer builds leave them to the plain one (CI's minutes).
lab_plain_why="make test runs it in the plain build; it checks the labs' logic, which a sanitizer build would only repeat"
if [ $plain_only = 1 ]; then
    skp lab_wrong_solutions "$lab_plain_why"
else
    out=$(make --no-print-directory BUILD="$BUILD" lab-wrong 2>&1)
    if grep -q '^skip lab_wrong_solutions: ' <<<"$out"; then
        skp lab_wrong_solutions "$(sed -n 's/^skip lab_wrong_solutions: //p' <<<"$out")"
    else
        printf '%s\n' "$out" | grep -v '^ddp.h build\|^MPI \|^cc \|^no mpicc'
        p=$(grep -c '^ok ' <<<"$out"); f=$(grep -c '^FAIL ' <<<"$out")
        pass=$((pass + p)); fail=$((fail + f))
        if [ $((p + f)) -eq 0 ]; then bad lab_wrong_solutions "make lab-wrong reported nothing:" "$(tail -n 4 <<<"$out")"; fi
    fi
fi
# The handout, packed in a clone of this commit (the working tree may hold edits; the handout is
# made of committed files only): one top folder, no solution in it, TUTORIAL.md with it, the
# students' guide (labs/GUIDE.md) and not the instructors' one (labs/README.md), no text naming a
# wrong solution (labs/solutions/wrong/*/NAME.patch), and make, make lab-NAME and make test run
# inside it; and a starter that differs from the commit is refused.
if [ $plain_only = 1 ]; then
    skp lab_handout "$lab_plain_why"
elif ! command -v git >/dev/null 2>&1 || ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
    skp lab_handout "not a git checkout with a commit: the handout is packed from committed files"
elif ! git clone -q --no-hardlinks . "$TMP/clone" 2>"$TMP/clone.err"; then
    bad lab_handout "git clone of this checkout failed:" "$(tail -n 3 "$TMP/clone.err")"
else
    ho=() hb="$TMP/handout_build"
    out=$(cd "$TMP/clone" && make --no-print-directory BUILD="$hb" lab-handout 2>&1) || ho+=("make lab-handout failed: $(tail -n 2 <<<"$out")")
    mkdir -p "$TMP/unpacked"
    if [ ${#ho[@]} -eq 0 ] && tar -xzf "$hb/ddp-labs.tar.gz" -C "$TMP/unpacked"; then
        top=$(ls -A "$TMP/unpacked")
        [ "$top" = ddp-labs ] || ho+=("the archive's top level is \"$(tr '\n' ' ' <<<"$top")\", not one folder ddp-labs")
        leaked=$(cd "$TMP/unpacked" && find . -path '*solutions*' -o -name '*.patch' -o -path '*answers*' | head -n 3)
        [ -z "$leaked" ] && ! grep -rqs 'Reference solution of lab' "$TMP/unpacked" || ho+=("a solution is in the handout: $leaked")
        for f in TUTORIAL.md ddp.h Makefile README.md labs/GUIDE.md labs/ring/starter.c labs/ring/HINTS.md examples/gpt.h; do
            [ -f "$TMP/unpacked/ddp-labs/$f" ] || ho+=("the handout has no $f")
        done
        [ -e "$TMP/unpacked/ddp-labs/labs/README.md" ] &&
            ho+=("the instructors' guide, labs/README.md, is in the handout (it names the wrong solutions)")
        for w in labs/solutions/wrong/*/*.patch; do
            [ -f "$w" ] || continue
            w=${w##*/} w=${w%.patch}
            named=$(grep -rlF -e "$w" "$TMP/unpacked/ddp-labs" | sed "s|^$TMP/unpacked/||" | head -n 3 | tr '\n' ' ')
            [ -z "$named" ] || ho+=("the handout names the wrong solution $w, in: ${named% }")
        done
        d="$TMP/unpacked/ddp-labs"
        out=$(make -C "$d" --no-print-directory 2>&1) || ho+=("make in the handout failed: $(tail -n 2 <<<"$out")")
        out=$(make -C "$d" --no-print-directory lab-sampler 2>&1)
        grep -q '^[0-9]* passed, [1-9][0-9]* failed, [0-9]* skipped$' <<<"$out" ||
            ho+=("make lab-sampler in the handout did not run the starter's tests (which fail): $(tail -n 2 <<<"$out")")
        out=$(make -C "$d" --no-print-directory test 2>&1)
        grep -q '^[0-9]* passed, [0-9]* failed, [0-9]* skipped$' <<<"$(tail -n 2 <<<"$out")" ||
            ho+=("make test in the handout did not end with its counts: $(tail -n 2 <<<"$out")")
    fi
    echo '/* solved, while trying the lab */' >> "$TMP/clone/labs/ring/starter.c"
    out=$(cd "$TMP/clone" && make --no-print-directory BUILD="$hb" lab-handout 2>&1) &&
        ho+=("make lab-handout packed an edited starter")
    grep -q 'labs/ring/starter.c' <<<"$out" || ho+=("the refusal does not name the edited starter: $(tail -n 2 <<<"$out")")
    if [ ${#ho[@]} -eq 0 ]; then ok "lab_handout (one folder ddp-labs/, no solution, labs/GUIDE.md and not labs/README.md, no wrong solution named; make, make lab-sampler and make test run in it; an edited starter refused)"
    else bad lab_handout "${ho[@]}"; fi
fi

# ---- whole jobs: ddprun and mpirun starting real ranks that join through the store ----------
section "jobs"
perf="$BUILD/allreduce_perf"
job_ok() {  # name, command...: the all-reduce table must end with "Out of bounds values : 0 OK"
    local name=$1; shift
    local out
    out=$(with_timeout 120 "$@" 2>&1)
    if grep -q "Out of bounds values : 0 OK" <<<"$out"; then ok "$name"
    else bad "$name" "$*" "$(tail -n 6 <<<"$out")"; fi
}
job_ok ddprun_standalone_4_ranks "$BUILD/ddprun" --standalone --nproc-per-node 4 "$perf" -b 4K -e 1M -f 4 -n 5 -w 1
# Ports 20000-31999: below Linux's ephemeral range (32768-60999), so no outgoing connection holds one.
port=$((20000 + RANDOM % 12000))
job_ok ddprun_explicit_master "$BUILD/ddprun" --master-addr 127.0.0.1 --master-port $port --nproc-per-node 3 "$perf" -b 1K -e 64K -f 8 -n 3 -w 1 -d bf16 -o avg
# two "nodes" on one machine: two ddprun, node ranks 0 and 1, one shared token
port=$((20000 + RANDOM % 12000))
out=$( { DDP_JOB_TOKEN=twonodes with_timeout 120 "$BUILD/ddprun" --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port $port "$perf" -b 4K -e 64K -n 3 -w 1 >/dev/null 2>&1 & }
        DDP_JOB_TOKEN=twonodes with_timeout 120 "$BUILD/ddprun" --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port $port "$perf" -b 4K -e 64K -n 3 -w 1 2>&1; wait)
if grep -q "Out of bounds values : 0 OK" <<<"$out" && grep -q "world size 4" <<<"$out"; then ok ddprun_two_nodes_loopback
else bad ddprun_two_nodes_loopback "$(tail -n 6 <<<"$out")"; fi
# DDP_DEBUG=DETAIL prints every step of the ring (the TCP transport): 2(W-1) steps, half reducing, half copying
out=$(DDP_TRANSPORT=tcp DDP_ALGO=ring DDP_DEBUG=DETAIL with_timeout 60 "$BUILD/ddprun" --standalone --nproc-per-node 3 "$perf" -b 12 -e 12 -n 1 -w 0 -c 0 2>&1)
if grep -q "step 1/4 (reduce-scatter): send segment 0 \[0, 1) to rank 1" <<<"$out" &&
   grep -q "step 2/4 (reduce-scatter): received segment 1 \[1, 2) from rank 2 and added it" <<<"$out" &&
   grep -q "step 4/4 (all-gather): received segment 2 \[2, 3) from rank 2 and copied it" <<<"$out"; then
    ok ring_steps_printed_at_detail
else bad ring_steps_printed_at_detail "$(grep step <<<"$out" | head -n 8)"; fi
# left to the cost model, so small an all-reduce takes recursive doubling instead, and says so: on 3
# ranks, rank 2 stands aside (rank 0 adds its buffer first and hands it the result last)
out=$(DDP_TRANSPORT=tcp DDP_DEBUG=DETAIL with_timeout 60 "$BUILD/ddprun" --standalone --nproc-per-node 3 "$perf" -b 12 -e 12 -n 1 -w 0 -c 0 2>&1)
d="(recursive doubling, 3 ranks, 12 bytes)"
if grep -qF "[rank 2]: all_reduce #2 $d step 1/3: sent the whole buffer to rank 0, which stands in for this one" <<<"$out" &&
   grep -qF "[rank 0]: all_reduce #2 $d step 1/3: received rank 2's buffer and added it" <<<"$out" &&
   grep -qF "[rank 1]: all_reduce #2 $d step 2/3: exchanged the whole buffer with rank 0 and added it" <<<"$out" &&
   grep -qF "[rank 0]: all_reduce #2 $d step 3/3: sent the result to rank 2" <<<"$out" &&
   grep -qF "[rank 2]: all_reduce #2 $d step 3/3: received the result from rank 0" <<<"$out" &&
   ! grep -q "reduce-scatter" <<<"$out"; then
    ok doubling_steps_printed_at_detail
else bad doubling_steps_printed_at_detail "$(grep step <<<"$out" | head -n 8)"; fi
# ranks that chose different algorithms would each wait for a message the other never sends: refused
out=$(DDP_TRANSPORT=tcp with_timeout 60 "$BUILD/ddprun" --standalone --nproc-per-node 3 \
      sh -c 'if [ "$LOCAL_RANK" = 1 ]; then export DDP_ALGO=ring; fi; exec "$0" -b 4 -e 4 -n 1' "$perf" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -qF "DDP_ALGO is auto on rank 0 but ring on this rank (1)" <<<"$out"; then ok algo_mismatch_named
else bad algo_mismatch_named "exit $rc; $(grep -E 'DDP_ERR|error' <<<"$out" | head -n 3)"; fi
# with DDP_SHM_ONE_STEP_BYTES=16384 a small all-reduce on 3 ranks over shared memory takes one step
# (>>shm), a large one the two phases; by default every size takes the two phases; the results are
# checked either way (test_pg's run in 4 KiB chunks mixes both paths)
out=$(DDP_DEBUG=DETAIL DDP_TRANSPORT=shm DDP_SHM_ONE_STEP_BYTES=16384 with_timeout 60 "$BUILD/ddprun" --standalone --nproc-per-node 3 "$perf" -b 4K -e 64K -f 16 -n 2 -w 1 2>&1)
out0=$(DDP_DEBUG=DETAIL DDP_TRANSPORT=shm with_timeout 60 "$BUILD/ddprun" --standalone --nproc-per-node 3 "$perf" -b 4K -e 4K -n 2 -w 1 2>&1)
if grep -q "Out of bounds values : 0 OK" <<<"$out" && grep -q "Out of bounds values : 0 OK" <<<"$out0" &&
   grep -q "through shared memory in one step: 4096 bytes from each of 3 slots" <<<"$out" &&
   grep -q "all_reduce #[0-9]* through shared memory: 1 chunk(s) of up to" <<<"$out" && ! grep -q "in one step" <<<"$out0"; then
    ok shm_small_all_reduce_in_one_step
else bad shm_small_all_reduce_in_one_step "$(grep -E 'Out of bounds|one step|chunk' <<<"$out$out0" | head -n 6)"; fi
# log lines carry one rank label: under ddprun its "[rank R]: " alone, even before ddp_init; by hand,
# before ddp_init, the launcher's RANK and WORLD_SIZE (nobody listens at the port: init fails at once)
out=$(DDP_DEBUG=INFO with_timeout 60 "$BUILD/ddprun" --standalone --nproc-per-node 2 "$BUILD/examples/ch04_multi_node" --device cpu \
      --epochs 1 --save-every 0 2>&1)
port=$((20000 + RANDOM % 12000))
out1=$(RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TIMEOUT=1 DDP_DEBUG=INFO with_timeout 30 \
       "$BUILD/examples/ch04_multi_node" --device cpu 2>&1)
if grep -q '^\[rank 1\]: loaded examples/data/wine.csv' <<<"$out" && grep -q '^\[rank 1\]: placement from torchrun: rank 1 of 2' <<<"$out" &&
   ! grep -q '^\[rank [0-9]*\]: .*\[rank [0-9]*/' <<<"$out" && grep -q '^\[rank 1/2\] loaded examples/data/wine.csv' <<<"$out1"; then
    ok log_lines_one_rank_label
else bad log_lines_one_rank_label "under ddprun:" "$(grep -E 'loaded|placement' <<<"$out" | head -n 4)" "by hand, RANK=1:" "$(head -n 2 <<<"$out1")"; fi
# a rank that dies before joining: the others must not wait for it; ddprun ends promptly
start=$(date +%s)
out=$(DDP_TIMEOUT=60 with_timeout 60 "$BUILD/ddprun" --standalone --nproc-per-node 3 sh -c 'if [ "$RANK" = 2 ]; then exit 5; fi; exec "$0" -b 4K -e 4K' "$perf" 2>&1); rc=$?
if [ $rc = 5 ] && [ $(( $(date +%s) - start )) -lt 20 ]; then ok ddprun_real_job_rank_dies
else bad ddprun_real_job_rank_dies "exit status $rc after $(( $(date +%s) - start )) s (want 5, promptly)" "$(tail -n 4 <<<"$out")"; fi
if command -v mpirun >/dev/null 2>&1; then
    port=$((20000 + RANDOM % 12000))
    out=$(DDP_DEBUG=INFO with_timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port -x DDP_DEBUG "$perf" -b 4K -e 256K -n 3 -w 1 2>&1)
    if grep -q "Out of bounds values : 0 OK" <<<"$out" && grep -q "placement from openmpi" <<<"$out"; then ok mpirun_openmpi_env
    else bad mpirun_openmpi_env "$(tail -n 6 <<<"$out")"; fi
else
    skp mpirun_openmpi_env "Open MPI (mpirun) is not installed: apt-get install openmpi-bin"
fi

# ---- the header in every compile mode, warnings as errors, linked and run ---------------------
section "compile modes"
WFLAGS="-Wall -Wextra -pedantic -Werror"
compile_mode() {  # name, compiler, flags (one word list), libraries (one word list)
    local name=$1 cc=$2 flags=$3 libs=$4 out run=""
    if [ $plain_only = 1 ]; then skp "compile_$name" "$plain_why (its own flags)"; return; fi
    # shellcheck disable=SC2086
    if out=$($cc $flags -I. tests/unit/compile_smoke.c -o "$TMP/$name" $libs -lpthread -lm 2>&1) &&
       run=$("$TMP/$name" 2>&1); then
        ok "compile_$name"
    else
        bad "compile_$name" "$cc $flags tests/unit/compile_smoke.c $libs" "$(head -n 5 <<<"$out"$'\n'"$run")"
    fi
}
CCX=${CC:-cc}
compile_mode c99_no_cuda "$CCX" "-std=c99 $WFLAGS -DDDP_NO_CUDA" ""
compile_mode c99_static "$CCX" "-std=c99 $WFLAGS -DDDP_NO_CUDA -DDDP_STATIC" ""
HAVE_GXX=0; command -v g++ >/dev/null 2>&1 && HAVE_GXX=1
if [ $HAVE_GXX = 1 ]; then compile_mode cxx_no_cuda g++ "-x c++ $WFLAGS -DDDP_NO_CUDA" "-x none"
else skp compile_cxx_no_cuda "no g++ on this machine (apt-get install g++)"; fi
if [ "${HAVE_CUDA:-0}" = 1 ]; then
    compile_mode c99_cuda "$CCX" "-std=c99 $WFLAGS ${CUDA_CFLAGS:-}" "${CUDA_LIBS:-}"
    if [ $HAVE_GXX = 1 ]; then compile_mode cxx_cuda g++ "-x c++ $WFLAGS ${CUDA_CFLAGS:-}" "-x none ${CUDA_LIBS:-}"
    else skp compile_cxx_cuda "no g++ on this machine (apt-get install g++)"; fi
else
    skp compile_c99_cuda "this build is CPU-only: make found no CUDA toolkit (see its first line)"
    skp compile_cxx_cuda "this build is CPU-only: make found no CUDA toolkit (see its first line)"
fi
# DDP_PORTABLE: the header without its Linux-only code, as macOS and the BSDs compile it
compile_mode c99_portable "$CCX" "-std=c99 $WFLAGS -DDDP_NO_CUDA -DDDP_PORTABLE" ""
if [ $HAVE_GXX = 1 ]; then compile_mode cxx_portable g++ "-x c++ $WFLAGS -DDDP_NO_CUDA -DDDP_PORTABLE" "-x none"
else skp compile_cxx_portable "no g++ on this machine"; fi
# clang with _FORTIFY_SOURCE=2, as macOS compiles by default: printf-like calls are macros there
if command -v clang >/dev/null 2>&1; then
    compile_mode clang_fortify clang "-std=c99 -O2 -D_FORTIFY_SOURCE=2 $WFLAGS -DDDP_NO_CUDA" ""
else skp compile_clang_fortify "clang is not installed (apt-get install clang)"; fi
if [ "${HAVE_MPI:-0}" = 1 ]; then
    compile_mode c99_mpi "$CCX" "-std=c99 $WFLAGS -DDDP_NO_CUDA -DDDP_MPI ${MPI_CFLAGS:-}" "${MPI_LIBS:-}"
    if [ $HAVE_GXX = 1 ]; then compile_mode cxx_mpi g++ "-x c++ $WFLAGS -DDDP_NO_CUDA -DDDP_MPI ${MPI_CFLAGS:-}" "-x none ${MPI_LIBS:-}"
    else skp compile_cxx_mpi "no g++ on this machine (apt-get install g++)"; fi
else
    skp compile_c99_mpi "no mpicc: the MPI backend is not built (apt-get install libopenmpi-dev)"
    skp compile_cxx_mpi "no mpicc: the MPI backend is not built (apt-get install libopenmpi-dev)"
fi

# ---- a student's laptop: what a Mac's shell and a Windows-side clone need (make test-portable
# runs the rest: the portable, musl and aarch64 builds) ------------------------------------------
section "laptops"
if command -v python3 >/dev/null 2>&1; then run_prog portability_lint python3 tests/portable/lint_portable.py
else skp portability_lint "python3 is not installed (apt-get install python3)"; fi
if [ $plain_only = 1 ]; then skp test_compat "$plain_why (shell helpers)"
else run_prog test_compat bash tests/portable/test_compat.sh; fi
# Scripts, sources and the Makefile keep LF endings in every checkout, also a Windows-side clone
# with core.autocrlf=true, where CRLF would break bash ("$'\r': command not found") and make.
if ! command -v git >/dev/null 2>&1 || ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    skp gitattributes_keep_lf "not a git checkout: .gitattributes acts on clones"
else
    n=$(git ls-files -- '*.sh' '*.c' '*.h' '*.py' '*.md' '*.mk' Makefile .ci/run | wc -l | tr -d ' ')
    not_lf=$(git ls-files -- '*.sh' '*.c' '*.h' '*.py' '*.md' '*.mk' Makefile .ci/run | git check-attr --stdin eol |
             grep -v ': eol: lf$' | head -n 5)
    if [ "$n" -gt 0 ] && [ -z "$not_lf" ]; then ok "gitattributes_keep_lf ($n text files are checked out with LF)"
    else bad gitattributes_keep_lf "files a core.autocrlf=true clone would turn to CRLF:" "$not_lf"; fi
fi
# The Makefile's OpenBLAS probe (used where pkg-config does not know OpenBLAS, as on a Mac with
# Homebrew's) must write a real "#include" line, whatever GNU make's version
if ! printf '#include <cblas.h>\nint main(void){return 0;}\n' | ${CC:-cc} -x c - -o /dev/null -lopenblas >/dev/null 2>&1; then
    skp makefile_openblas_probe_without_pkg_config "OpenBLAS is not installed (apt-get install libopenblas-dev)"
else
    mkdir -p "$TMP/no-pkg-config"
    printf '#!/bin/sh\nexit 1\n' >"$TMP/no-pkg-config/pkg-config"
    chmod +x "$TMP/no-pkg-config/pkg-config"
    line=$(PATH="$TMP/no-pkg-config:$PATH" make -n --no-print-directory BUILD="$TMP/probe" CBLAS=auto CUDA=0 MPI=0 \
           "$TMP/probe/ddprun" 2>&1 | grep -m1 '^ddp.h build:')
    if grep -q 'CPU Linear through OpenBLAS' <<<"$line"; then ok makefile_openblas_probe_without_pkg_config
    else bad makefile_openblas_probe_without_pkg_config "without pkg-config, make says: ${line:-nothing}"; fi
fi

# ---- make install: the pkg-config line a student uses builds and runs chapter 1 --------------
# ddp.pc is this build's flavour (CUDA when make found it), ddp-cpu.pc the CPU-only one, whose
# program needs no CUDA library; install says how to point pkg-config at a PREFIX it does not search.
section "install"
if command -v pkg-config >/dev/null 2>&1; then
    for pc in ddp ddp-cpu; do
        if out=$(make --no-print-directory install PREFIX="$TMP/prefix" BUILD="$BUILD" 2>&1) &&
           { grep -qF "export PKG_CONFIG_PATH=$TMP/prefix/lib/pkgconfig" <<<"$out" ||
             ! out="make install did not say how to point pkg-config at $TMP/prefix/lib/pkgconfig: $out"; } &&
           flags=$(PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig" pkg-config --cflags --libs $pc 2>&1) &&
           cp examples/ch01_single_gpu.c "$TMP/train.c" &&
           out=$(cd "$TMP" && ${CC:-cc} train.c $flags -o train 2>&1) &&
           { [ $pc = ddp ] || ! ldd "$TMP/train" | grep -E 'lib(cudart|cublas|nvrtc|nccl)' ||
             ! out="built with ddp-cpu, the program still needs CUDA libraries: $(ldd "$TMP/train" | grep -E 'cuda|nccl|nvrtc|cublas')"; } &&
           out=$("$TMP/train" --device cpu --epochs 2 --save-every 0 2>&1); then
            ok "install_pkg_config_build_$pc"
        else
            bad "install_pkg_config_build_$pc" "$(tail -n 5 <<<"$out")"
        fi
    done
else
    skp install_pkg_config_build_ddp "pkg-config is not installed (apt-get install pkg-config)"
    skp install_pkg_config_build_ddp-cpu "pkg-config is not installed (apt-get install pkg-config)"
fi

# ---- the chapter-1 example, end to end ----------------------------------------------------------
section "example 01"
ex="$BUILD/examples/ch01_single_gpu"
check_accuracy() {  # name, minimum, args...
    local name=$1 min=$2; shift 2
    local out acc
    out=$("$ex" "$@" 2>&1)
    CHECK_OUT=$out  # for a later comparison
    acc=$(sed -n 's/^\(\[rank [0-9]*\]: \)\{0,1\}test accuracy: //p' <<<"$out")
    if [ -n "$acc" ] && awk "BEGIN{exit !($acc >= $min)}"; then ok "$name ($acc >= $min)"
    else bad "$name" "expected test accuracy >= $min" "$(tail -n 3 <<<"$out")"; fi
}
# chapter 9: a collective inside `if (rank == 0)` is caught at once, not trained on silently
out=$(DDP_TIMEOUT=10 with_timeout 60 "$BUILD/examples/ch09_hang" --nproc 2 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "DDP_ERR_DESYNC: desync: this rank (0) calls all_reduce #[0-9]* (1 x f32, sum), but rank 1 calls all_reduce #[0-9]* (1091 x f32, sum)" <<<"$out"; then
    ok ch09_collective_on_one_rank_caught
else bad ch09_collective_on_one_rank_caught "exit status $rc" "$(tail -n 4 <<<"$out")"; fi
out=$(DDP_TIMEOUT=10 with_timeout 60 "$BUILD/examples/ch09_hang" --nproc 2 --fixed 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "epoch 20  mean loss over all ranks" <<<"$out"; then ok ch09_fixed_trains
else bad ch09_fixed_trains "exit status $rc" "$(tail -n 4 <<<"$out")"; fi
check_accuracy ch01_wine_cpu 0.95 --device cpu --snapshot "$TMP/wine.st"
check_accuracy ch01_digits_cpu 0.95 --device cpu --data digits --epochs 30 --save-every 0

if [ -s "$TMP/wine.st" ] && ! ls "$TMP"/wine.st.tmp* >/dev/null 2>&1; then ok ch01_snapshot_written
else bad ch01_snapshot_written "no snapshot at $TMP/wine.st after --save-every 50, or a temporary file left"; fi

# ---- chapters 2 and 3: several ranks, the same accuracy bar ---------------------------------------
section "examples 02 and 03"
ex="$BUILD/examples/ch03_multi_gpu"
check_accuracy ch03_wine_4_ranks 0.95 --device cpu --save-every 0
check_accuracy ch03_digits_2_ranks 0.95 --device cpu --nproc 2 --data digits --epochs 30 --save-every 0
ex="$BUILD/ddprun"
check_accuracy ch04_ddprun_4_ranks 0.95 --standalone --nproc-per-node 4 "$BUILD/examples/ch04_multi_node" --device cpu --save-every 0
if command -v mpirun >/dev/null 2>&1; then
    ex=mpirun
    port=$((20000 + RANDOM % 12000))
    check_accuracy ch04_mpirun_4_ranks 0.95 --allow-run-as-root --oversubscribe -np 4 -x MASTER_ADDR=127.0.0.1 \
        -x MASTER_PORT=$port "$BUILD/examples/ch04_multi_node" --device cpu --save-every 0
    cpu03_out=$CHECK_OUT
else
    skp ch04_mpirun_4_ranks "Open MPI (mpirun) is not installed: apt-get install openmpi-bin"
fi
ex="$BUILD/examples/ch01_single_gpu"

# ---- the mpi backend: the *_mpi programs make builds with -DDDP_MPI when it finds mpicc ---------------
# mpirun alone places the ranks (no ddprun, no MASTER_ADDR). tests/test_mpi runs test_pg.c's checks of
# every collective, dtype and op against the exact reference, the bootstrap, and a timeout; the
# chapter-3 example must end where the cpu backend ended above, under the same mpirun.
section "mpi backend"
mpi_skip=
if [ ! -x "$BUILD/tests/test_mpi" ]; then mpi_skip="no mpicc: the MPI backend is not built (apt-get install libopenmpi-dev)"
elif ! command -v mpirun >/dev/null 2>&1; then mpi_skip="Open MPI (mpirun) is not installed: apt-get install openmpi-bin"
elif [ "${DDP_TSAN:-0}" = 1 ]; then
    mpi_skip="Open MPI is not built with -fsanitize=thread, and TSan reports its own locking (mca_pml_ob1, mca_btl_tcp)"
fi
if [ -n "$mpi_skip" ]; then
    for c in mpi_backend_np2 mpi_backend_np4 mpi_backend_timeout ch04_mpi_backend_4_ranks; do skp "$c" "$mpi_skip"; done
else
    # fast_unwind_on_malloc=0 (used under make sanitize only): whole stacks through Open MPI's plugins,
    # so that tests/lsan.supp tells what Open MPI keeps from what ddp.h would leak
    mpirun_=(with_timeout 120 env -u MASTER_ADDR -u MASTER_PORT "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
             mpirun --allow-run-as-root --oversubscribe)
    run_prog mpi_backend_np2 "${mpirun_[@]}" -np 2 "$BUILD/tests/test_mpi"
    run_prog mpi_backend_np4 "${mpirun_[@]}" -np 4 "$BUILD/tests/test_mpi"
    # Rank 0 calls a collective rank 1 never calls. Both ranks then exit without MPI_Finalize (it could
    # wait for the pending collective for ever), so mpirun's own status is not 0: the lines decide.
    start=$(date +%s)
    out=$("${mpirun_[@]}" -np 2 "$BUILD/tests/test_mpi" --timeout 2>&1)
    el=$(( $(date +%s) - start ))
    if grep -q "^ok   mpi_timeout_names_the_collective" <<<"$out" && grep -q "^ok   mpi_timeout_breaks_the_group" <<<"$out" &&
       [ $el -lt 30 ]; then ok "mpi_backend_timeout (DDP_TIMEOUT 2 s; the job ended after $el s)"
    else bad mpi_backend_timeout "after $el s:" "$(grep -E '^(ok|FAIL|skip)|DDP_ERR' <<<"$out" | head -n 6)"; fi
    out=$("${mpirun_[@]}" -np 4 -x DDP_BACKEND=mpi -x DDP_DEBUG=INFO "$BUILD/examples/ch04_multi_node_mpi" --device cpu \
          --save-every 0 2>&1)
    acc=$(sed -n 's/^test accuracy: //p' <<<"$out"); loss=$(sed -n 's/^test loss: //p' <<<"$out")
    acc_cpu=$(sed -n 's/^test accuracy: //p' <<<"${cpu03_out:-}"); loss_cpu=$(sed -n 's/^test loss: //p' <<<"${cpu03_out:-}")
    if [ -n "$acc" ] && [ "$acc" = "$acc_cpu" ] && [ -n "$loss_cpu" ] && awk "BEGIN{d = $loss - $loss_cpu; exit !(d < 2e-3 && d > -2e-3)}" &&
       [ "$(grep -c 'joined the job on host .*: backend mpi, .*(placement from mpi)' <<<"$out")" = 4 ]; then
        ok "ch04_mpi_backend_4_ranks (test accuracy $acc, loss $loss; the cpu backend: $acc_cpu, $loss_cpu)"
    else
        bad ch04_mpi_backend_4_ranks "want the cpu backend's test accuracy ${acc_cpu:-?} and loss ${loss_cpu:-?} (+-0.002), 4 ranks on the mpi backend" \
            "$(grep -E 'test (loss|accuracy)|joined|DDP_ERR' <<<"$out" | tail -n 6)"
    fi
fi

# DDP_TRACE: one timeline per rank, with every kind of span the chapter on overlap shows
rm -f "$TMP"/trace.*
DDP_TRACE="$TMP/trace" "$BUILD/examples/ch03_multi_gpu" --nproc 2 --epochs 2 --device cpu --save-every 0 >/dev/null 2>&1
if command -v python3 >/dev/null 2>&1; then
    if out=$(python3 - "$TMP/trace" <<'PY' 2>&1
import json, sys
for r in (0, 1):
    ev = json.load(open("%s.rank%d.json" % (sys.argv[1], r)))["traceEvents"]
    names = " ".join(e["name"] for e in ev if e.get("ph") == "X")
    for want in ("forward", "backward fc1", "backward fc2", "all_reduce", "broadcast", "wait for buckets", "optimizer step"):
        assert want in names, "rank %d's trace has no %r span" % (r, want)
    assert any(e.get("tid") == 2 for e in ev), "no communication row"
PY
); then ok trace_files_per_rank; else bad trace_files_per_rank "$out"; fi
else
    skp trace_files_per_rank "python3 is not installed, which parses the JSON (apt-get install python3)"
fi

# ---- chapter 3 across two hosts: network namespaces, and a real two-node SLURM cluster ------------
section "multi-node"
TWO_HOSTS_NAME=ch04_two_hosts_netns \
TWO_HOSTS_CMD="env DDP_DEBUG=INFO $BUILD/ddprun --nnodes {NNODES} --node-rank {NODE_RANK} --nproc-per-node 2 --master-addr {MASTER_ADDR} --master-port {MASTER_PORT} $BUILD/examples/ch04_multi_node --device cpu --save-every 0" \
TWO_HOSTS_EXPECT=$'test accuracy: (0\\.9[5-9]|1\\.0)\njoined the job on host node1' \
    run_prog multinode_netns bash tests/multiproc/netns_two_hosts.sh "$BUILD"
DDP_BUILD="$BUILD" DDP_DEBUG=INFO SLURM_TWO_HOSTS_NAME=ch04_slurm_two_hosts \
SLURM_TWO_HOSTS_EXPECT=$'test accuracy: (0\\.9[5-9]|1\\.0)\njoined the job on host node1\njoined the job on host node2\nplacement from slurm' \
    run_prog slurm_two_hosts bash tests/multiproc/slurm_two_hosts.sh examples/ch05_multi_node.sbatch

expect_error() {  # name, text the error must contain, args...
    local name=$1 want=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -qF -- "$want" <<<"$out"; then ok "$name"
    else bad "$name" "expected a non-zero exit and \"$want\"; got status $rc:" "$(tail -n 3 <<<"$out")"; fi
}
if [ "$(uname)" = Linux ] && [ "${HAVE_CUDA:-0}" = 1 ] && ! "$BUILD/tests/test_gpu" 2>/dev/null | grep -q '^ok   gpu_streams_events'; then
    expect_error ch01_cuda_without_gpu "DDP_ERR_NO_GPU" "$ex" --device cuda
elif [ "${HAVE_CUDA:-0}" = 0 ]; then
    expect_error ch01_cuda_without_cuda "DDP_ERR_NOT_BUILT" "$ex" --device cuda
else
    skp ch01_cuda_without_gpu "this machine has a GPU"
fi
expect_error ch01_missing_data "DDP_DATA_DIR" "$ex" --data-dir "$TMP/nowhere"
expect_error ch01_bad_device "is not one of cpu, cuda" "$ex" --device tpu
printf 'a,b,label\n1,2,0\n3,x,1\n' > "$TMP/bad.csv"
expect_error ch01_bad_csv "bad.csv:3: column 2" "$ex" --data "$TMP/bad.csv"

# ---- what would turn the skips into tests ---------------------------------------------------------
# tests/skip_hints.sh reads every skip's reason and prints the packages that cure them (a check on
# made-up reasons first: the line must name exactly their packages).
printf '%s\n' "no mpicc (apt-get install libopenmpi-dev)" "no GPU: no driver" "x (apt-get install --no-install-recommends slurmd munge)" \
    "needs root" "numpy is missing (apt-get install python3-numpy)" "(apt-get install no-such-package)" >"$TMP/hints_fixture"
out=$(bash tests/skip_hints.sh "$TMP/hints_fixture" 6 2>&1); rc=$?
if [ $rc = 1 ] && [ "$out" = "skipped cases: apt-get install libopenmpi-dev munge no-such-package python3-numpy slurmd would turn 4 of the 6 into tests (as .ci/run installs them); 1 need a GPU or the CUDA toolkit, 1 need root
skip reasons name packages that .ci/run does not install: no-such-package" ]; then ok skip_hints_line
else bad skip_hints_line "exit status $rc (want 1: a package .ci/run lacks), printed:" "$out"; fi
if [ -s "$TMP/skip_reasons" ]; then
    if ! out=$(bash tests/skip_hints.sh "$TMP/skip_reasons" "$skip"); then
        bad skip_hints_name_ci_packages "$(tail -n 1 <<<"$out")"
        out=$(head -n 1 <<<"$out")
    fi
    echo "$out"
fi
section ""
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
