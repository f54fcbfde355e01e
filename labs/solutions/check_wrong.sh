#!/usr/bin/env bash
# labs/solutions/check_wrong.sh [LAB...]: run each lab's tests on each of its deliberately wrong
# solutions (labs/solutions/wrong/LAB/*.patch, each the reference solution with one mistake) and
# check that the tests catch it: at least one case fails, and the output holds every "Expect:"
# line of the patch's header, the message that names the broken rule. A "Cases: WORD" line runs
# only the cases whose name contains WORD (labs/measure: the cases that measure nothing). An
# "Absent: TEXT" line is text the output must not hold (a fix that ddp.h would print outside labs).
# One line per wrong solution ("ok   lab_LAB_wrong_NAME (...)" or "FAIL ..." with the output's
# failing lines), in the format of tests/run.sh, which calls it from `make test`. Instructors
# only, like the rest of labs/solutions. Environment: as labs/run_lab.sh (BUILD, CC, ...).
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${BUILD:-build}
labs=("$@")
[ ${#labs[@]} -eq 0 ] && labs=(sampler ring buckets resume no_sync measure zero1 gpt)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check_one() {  # lab patch: writes $tmp/LAB.NAME.line (the verdict, then detail lines)
    local lab=$1 patch=$2 wname out rc expect missing=() present=() cases
    wname=$(basename "$patch" .patch)
    cases=$(sed -n 's/^Cases: //p' "$patch" | head -n 1)
    out=$(LAB_CASES="$cases" WRONG="$wname" bash labs/run_lab.sh "$lab" 2>&1); rc=$?
    while IFS= read -r expect; do
        grep -qF -- "$expect" <<<"$out" || missing+=("$expect")
    done < <(sed -n 's/^Expect: //p' "$patch")
    while IFS= read -r expect; do
        ! grep -qF -- "$expect" <<<"$out" || present+=("$expect")
    done < <(sed -n 's/^Absent: //p' "$patch")
    {
        if grep -q "^FAIL lab_${lab}_build" <<<"$out"; then
            echo "FAIL lab_${lab}_wrong_$wname"
            echo "    it does not build:"
            sed -n '/^FAIL lab_/,$p' <<<"$out" | sed -n '2,6p'
        elif [ $rc -eq 0 ]; then
            echo "FAIL lab_${lab}_wrong_$wname"
            echo "    the tests pass a wrong solution ($(sed -n 1p "$patch" | sed 's/^Wrong solution "[^"]*" of lab [a-z_]*: //'))"
        elif [ ${#missing[@]} -gt 0 ]; then
            echo "FAIL lab_${lab}_wrong_$wname"
            echo "    caught, but the output lacks the message that names the broken rule:"
            printf '      %s\n' "${missing[@]}"
            grep -m 4 -A 1 '^FAIL ' <<<"$out" | sed 's/^/    /'
        elif [ ${#present[@]} -gt 0 ]; then
            echo "FAIL lab_${lab}_wrong_$wname"
            echo "    caught, but the output gives the fix away:"
            printf '      %s\n' "${present[@]}"
        else
            echo "ok   lab_${lab}_wrong_$wname ($(grep -c '^FAIL ' <<<"$out") case(s) fail; $(sed -n 's/^Expect: //p' "$patch" | head -n 1 | cut -c1-60))"
        fi
    } > "$tmp/$lab.$wname.line"
}

# The wrong solutions misbehave on purpose (one divides by zero): under make tsan their reports
# would land among the suite's and fail it, so they go to a folder of their own, thrown away.
if [ -n "${TSAN_OPTIONS:-}" ]; then
    mkdir -p "$tmp/sanitizer-reports"
    export TSAN_OPTIONS="$TSAN_OPTIONS:log_path=$tmp/sanitizer-reports/tsan"
fi
jobs_max=${LAB_JOBS:-2}
order=()
for lab in "${labs[@]}"; do
    for patch in labs/solutions/wrong/"$lab"/*.patch; do
        [ -f "$patch" ] || continue
        order+=("$lab.$(basename "$patch" .patch)")
        while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
        check_one "$lab" "$patch" &
    done
done
wait
for o in "${order[@]}"; do cat "$tmp/$o.line"; done
