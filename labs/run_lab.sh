#!/usr/bin/env bash
# labs/run_lab.sh NAME [FILE]: build lab NAME's tests (labs/NAME/test.c) with FILE (default
# labs/NAME/starter.c; SOLUTION=1: labs/solutions/NAME.c; WRONG=W: the reference solution with
# labs/solutions/wrong/NAME/W.patch applied, one of the deliberately wrong solutions) and run them.
# `make lab-NAME` calls it.
# Prints one line per test: "ok   name", "FAIL name" (details indented below it) or
# "skip name: reason" (the test cannot run on this machine), then "N passed, N failed, N skipped".
# A file that does not compile is "FAIL lab_NAME_build" with the compiler's messages.
# Exit status: 0 when nothing failed. Environment: BUILD, CC, CFLAGS, LDFLAGS, WARN (from make);
# LAB_SEED (the randomized cases' seed, default 1); LAB_CASES (run only the cases whose name
# contains this word).
set -u
cd "$(dirname "$0")/.." || exit 2
name=${1:?usage: labs/run_lab.sh NAME [FILE]}
file=${2:-}
BUILD=${BUILD:-build}
CC=${CC:-cc}
CFLAGS=${CFLAGS:--O2 -g}
LDFLAGS=${LDFLAGS:-}
WARN=${WARN:--std=c99 -Wall -Wextra -pedantic}
WRONG=${WRONG:-}

if [ ! -f "labs/$name/test.c" ]; then
    labs=""
    for t in labs/*/test.c; do t=${t%/test.c}; labs="$labs ${t#labs/}"; done
    echo "no lab named \"$name\"; the labs are:$labs"
    exit 2
fi
if [ -n "$file" ]; then kind=student
elif [ -n "$WRONG" ]; then
    kind=wrong-$WRONG patch="labs/solutions/wrong/$name/$WRONG.patch"
    if [ ! -f "$patch" ] || [ ! -f "labs/solutions/$name.c" ]; then
        echo "skip lab_${name}_wrong_$WRONG: no $patch here (labs/solutions is not in the handout)"
        exit 0
    fi
    mkdir -p "$BUILD/labs/wrong/$name"
    file="$BUILD/labs/wrong/$name/$WRONG.c"
    cp "labs/solutions/$name.c" "$file"
    if ! out=$(patch --quiet --force --no-backup-if-mismatch "$file" "$patch" 2>&1); then
        echo "FAIL lab_${name}_build"
        echo "    $patch no longer applies to labs/solutions/$name.c:"
        sed 's/^/    /' <<<"$out"
        exit 1
    fi
elif [ "${SOLUTION:-0}" = 1 ]; then
    kind=solution file="labs/solutions/$name.c"
    if [ ! -f "$file" ]; then
        echo "skip lab_${name}: no reference solution here ($file is not there: labs/solutions is not in the handout)"
        exit 0
    fi
else kind=starter file="labs/$name/starter.c"; fi
if [ ! -f "$file" ]; then
    echo "FAIL lab_${name}_build"
    echo "    no file $file (LAB_FILE is relative to the top folder of the repository)"
    exit 1
fi

bin="$BUILD/labs/$name-$kind"
mkdir -p "$BUILD/labs"
echo "== lab $name: $file"
# The tests are compiled once (they change less often than the file under test); a build that
# runs beside another writes its own temporary object and renames it into place.
tobj="$BUILD/labs/$name-test.o"
stale=0
[ -f "$tobj" ] || stale=1
for dep in "labs/$name/test.c" labs/lab_test.h labs/"$name"/*.h ddp.h; do
    [ "$dep" -nt "$tobj" ] && stale=1
done
if [ $stale = 1 ]; then
    # shellcheck disable=SC2086
    if ! out=$($CC $WARN $CFLAGS -DDDP_NO_CUDA -I. -I"labs/$name" -c "labs/$name/test.c" -o "$tobj.$$" 2>&1); then
        rm -f "$tobj.$$"
        echo "FAIL lab_${name}_build"
        echo "    the lab's own tests do not compile:"
        sed 's/^/    /' <<<"$out"
        exit 1
    fi
    mv -f "$tobj.$$" "$tobj"
fi
# shellcheck disable=SC2086
if ! out=$($CC $WARN $CFLAGS -DDDP_NO_CUDA -I. -I"labs/$name" -c "$file" -o "$bin.o" 2>&1) ||
   ! out2=$($CC $CFLAGS "$bin.o" "$tobj" "$BUILD/labs/ddp.o" -o "$bin" $LDFLAGS -lpthread -lm 2>&1); then
    echo "FAIL lab_${name}_build"
    sed 's/^/    /' <<<"$out${out2:+
$out2}"
    exit 1
fi
# The ring lab is about moving the data yourself: a file that reaches ddp.h's communication (its
# collectives, its process groups) would pass the result checks without a ring of its own.
if [ "$name" = ring ] && command -v nm >/dev/null 2>&1; then
    used=$(nm -u "$bin.o" 2>/dev/null | awk '{print $NF}' | sed 's/^_//' | grep -E '^ddp_' | sort -u | tr '\n' ' ')
    if [ -n "$used" ]; then
        echo "FAIL lab_ring_own_ring"
        echo "    [rule 0: a ring of your own] $file calls ${used% } from ddp.h: the all-reduce must move the data"
        echo "    itself, with the send and recv the tests hand it, and nothing else"
        echo "0 passed, 1 failed, 0 skipped"
        exit 1
    fi
fi
if [ -n "$out" ]; then  # warnings: shown, not fatal
    echo "    the compiler warns:"
    sed 's/^/    /' <<<"$out"
fi
# shellcheck disable=SC2086
"$bin" ${LAB_CASES:-} | tee "$BUILD/labs/$name-$kind.out"
rc=${PIPESTATUS[0]}
# One line per run in $BUILD/labs/NAME-runs.log: when, which file, the counts. From the first line
# to the first with "0 failed" is how long the lab took (labs/GUIDE.md, "How long").
if [ -z "${LAB_CASES:-}" ] && [ -z "$WRONG" ]; then
    printf '%s %s %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$file" \
        "$(tail -n 1 "$BUILD/labs/$name-$kind.out")" >> "$BUILD/labs/$name-runs.log"
fi
exit "$rc"
