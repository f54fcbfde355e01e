#!/usr/bin/env bash
# labs/run_lab.sh NAME [FILE]: build lab NAME's tests (labs/NAME/test.c) with FILE (default
# labs/NAME/starter.c; SOLUTION=1: labs/solutions/NAME.c) and run them. `make lab-NAME` calls it.
# Prints one line per test: "ok   name", "FAIL name" (details indented below it) or
# "skip name: reason" (the test cannot run on this machine), then "N passed, N failed, N skipped".
# A file that does not compile is "FAIL lab_NAME_build" with the compiler's messages.
# Exit status: 0 when nothing failed. Environment: BUILD, CC, CFLAGS, LDFLAGS, WARN (from make).
set -u
cd "$(dirname "$0")/.." || exit 2
name=${1:?usage: labs/run_lab.sh NAME [FILE]}
file=${2:-}
BUILD=${BUILD:-build}
CC=${CC:-cc}
CFLAGS=${CFLAGS:--O2 -g}
LDFLAGS=${LDFLAGS:-}
WARN=${WARN:--std=c99 -Wall -Wextra -pedantic}

if [ ! -f "labs/$name/test.c" ]; then
    labs=""
    for t in labs/*/test.c; do t=${t%/test.c}; labs="$labs ${t#labs/}"; done
    echo "no lab named \"$name\"; the labs are:$labs"
    exit 2
fi
if [ -n "$file" ]; then kind=student
elif [ "${SOLUTION:-0}" = 1 ]; then
    kind=solution file="labs/solutions/$name.c"
    if [ ! -f "$file" ]; then
        echo "skip lab_${name}: no reference solution here ($file is not there: labs/solutions is removed before the labs are handed out)"
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
# shellcheck disable=SC2086
if ! out=$($CC $WARN $CFLAGS -DDDP_NO_CUDA -I. -I"labs/$name" "labs/$name/test.c" "$file" "$BUILD/labs/ddp.o" \
           -o "$bin" $LDFLAGS -lpthread -lm 2>&1); then
    echo "FAIL lab_${name}_build"
    sed 's/^/    /' <<<"$out"
    exit 1
fi
if [ -n "$out" ]; then  # warnings: shown, not fatal
    echo "    the compiler warns:"
    sed 's/^/    /' <<<"$out"
fi
"$bin"
