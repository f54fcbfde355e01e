# shellcheck shell=bash
# tests/report.sh: the counters and case lines of tests/run.sh, tests/portable/test_portable.sh and
# tests/portable/test_compat.sh, sourced by them. Each case prints one line, "ok   name", "FAIL name" (its
# details indented below) or "skip name: reason"; a skip is never a pass. Written for bash 3.2.
# With SKIP_REASONS naming a file, every skip's reason is also appended there (run.sh's closing
# line names the packages that would turn them into tests).
pass=0 fail=0 skip=0

ok()   { echo "ok   $1"; pass=$((pass + 1)); }
bad()  { echo "FAIL $1"; shift; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }
skp()  { echo "skip $1: $2"; skip=$((skip + 1)); [ -z "${SKIP_REASONS:-}" ] || echo "$2" >>"$SKIP_REASONS"; }

# A group of cases: "== name", and the previous group's seconds (where a suite's minutes go).
section() {
    [ -z "${section_name:-}" ] || echo "   (section $section_name: $((SECONDS - section_t0)) s)"
    section_name=${1:-} section_t0=$SECONDS
    [ -z "$section_name" ] || echo "== $section_name"
}

# Run one test program and count the lines it prints; a crash without a FAIL line is a failure.
run_prog() {
    local name=$1; shift
    local out rc p f s t0=$SECONDS
    echo "== $name"
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    echo "   ($name: $((SECONDS - t0)) s)"   # where a suite's minutes go (CI keeps a budget)
    p=$(grep -c '^ok ' <<<"$out"); f=$(grep -c '^FAIL ' <<<"$out"); s=$(grep -c '^skip ' <<<"$out")
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    [ -z "${SKIP_REASONS:-}" ] || grep '^skip ' <<<"$out" | sed 's/^skip [^:]*: //' >>"$SKIP_REASONS"
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then bad "$name" "exited with status $rc without reporting a failed case"; fi
    if [ $((p + f + s)) -eq 0 ] && [ $rc -eq 0 ]; then bad "$name" "reported no case at all"; fi
}
