#!/usr/bin/env bash
# tests/multiproc/test_transport.sh: how the CPU backend moves data between ranks. On one machine it maps a
# shared-memory segment (the default); DDP_TRANSPORT=tcp forces the TCP ring; a segment that cannot
# be made falls back to TCP, or fails clearly when shared memory was asked for; the segment's name
# is gone once the ranks have opened it, so nothing is left in /dev/shm, even after a rank is killed.
# Last, how the ranks of one machine share its cores (DDP_BIND) under CPU masks set beforehand.
#   bash tests/multiproc/test_transport.sh BUILD_DIR        (about 15 s)
set -u
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
cd "$(dirname "$0")/../.." || exit 1
. tests/multiproc/proc_cases.sh

PERF=$BUILD/allreduce_perf
DDPRUN=$BUILD/ddprun
for f in "$PERF" "$DDPRUN"; do
    if [ ! -x "$f" ]; then bad built "$f is not an executable (run make first, or pass the build folder)"; exit 1; fi
done
export DDP_TIMEOUT=20
HAVE_PY=0; command -v python3 >/dev/null 2>&1 && HAVE_PY=1   # free_port asks python3 whether a port is taken

# run_perf OUTFILE NPROC ARGS...: a short all-reduce sweep on NPROC local ranks, output in OUTFILE
run_perf() {
    local out=$1 n=$2; shift 2
    with_timeout 60 "$DDPRUN" --standalone --nproc-per-node "$n" "$PERF" "$@" >"$out" 2>&1
}
checked() { grep -q "Out of bounds values : 0 OK" "$1"; }

# ---- which transport, and the results are right either way ----
DDP_DEBUG=INFO run_perf "$TMP/shm.txt" 2 -b 4K -e 4M -f 16 -n 3 -w 1
if checked "$TMP/shm.txt" && grep -q "transport: shared memory (2 ranks on this host" "$TMP/shm.txt"; then
    ok transport_default_is_shared_memory
else bad transport_default_is_shared_memory "$(grep -E 'transport|wrong|ERR' "$TMP/shm.txt" | head -n 4)"; fi

DDP_TRANSPORT=tcp DDP_DEBUG=INFO run_perf "$TMP/tcp.txt" 2 -b 4K -e 4M -f 16 -n 3 -w 1
if checked "$TMP/tcp.txt" && grep -q "transport: tcp ring (DDP_TRANSPORT=tcp)" "$TMP/tcp.txt"; then
    ok transport_tcp_when_asked
else bad transport_tcp_when_asked "$(grep -E 'transport|wrong|ERR' "$TMP/tcp.txt" | head -n 4)"; fi

DDP_TRANSPORT=udp run_perf "$TMP/udp.txt" 2 -b 4K -e 4K; rc=$?
if [ $rc -ne 0 ] && grep -q "DDP_TRANSPORT=udp is not tcp, shm or auto" "$TMP/udp.txt"; then
    ok transport_bad_value_named
else bad transport_bad_value_named "exit status $rc" "$(tail -n 3 "$TMP/udp.txt")"; fi

# tuning values that cannot be used: each is named in a warning (as DDP_DEBUG's is) and replaced by
# its default; the job runs and its results are right
DDP_RING_PIECE_BYTES=1MB DDP_SHM_CHUNK_BYTES=-5 DDP_BIND=cores DDP_SHM_SPIN_US=x DDP_SHM_STREAM_BYTES=0 \
    DDP_SHM_SLOT_STREAM_BELOW=big DDP_SIMULATE_NS_PER_BYTE=fast run_perf "$TMP/tuning.txt" 2 -b 4K -e 64K -n 1 -w 0
missing=""
for v in "DDP_RING_PIECE_BYTES=1MB" "DDP_SHM_CHUNK_BYTES=-5" "DDP_BIND=cores" "DDP_SHM_SPIN_US=x" "DDP_SHM_STREAM_BYTES=0" \
         "DDP_SHM_SLOT_STREAM_BELOW=big" "DDP_SIMULATE_NS_PER_BYTE=fast"; do
    grep -q "warning: $v is not .*; using " "$TMP/tuning.txt" || missing="$missing $v"
done
if checked "$TMP/tuning.txt" && [ -z "$missing" ]; then ok tuning_values_refused_with_a_warning
else bad tuning_values_refused_with_a_warning "no warning for:${missing:- (none missing)}" "$(grep -E 'warning|wrong|ERR' "$TMP/tuning.txt" | head -n 4)"; fi

# many chunks, 3 ranks (shares of unequal length), 16-bit types and averages, every element checked
DDP_SHM_CHUNK_BYTES=4096 run_perf "$TMP/chunks.txt" 3 -b 1K -e 1M -f 32 -n 2 -w 0 -d bf16 -o avg
DDP_SHM_CHUNK_BYTES=4096 run_perf "$TMP/chunks2.txt" 3 -b 12 -e 3M -f 64 -n 2 -w 0 -o max
if checked "$TMP/chunks.txt" && checked "$TMP/chunks2.txt"; then ok shm_small_chunks_3_ranks_exact
else bad shm_small_chunks_3_ranks_exact "$(grep -E 'wrong|ERR' "$TMP/chunks.txt" "$TMP/chunks2.txt" | head -n 4)"; fi

# ---- macOS rounds a shared-memory object up to its 16 KiB page (fstat then says so): shared memory
# must still be used. tests/portable/macos_shim.c rounds the segment here as XNU would, and logs each time.
shim=$TMP/macos_shim.so
if ! out=$(${CC:-cc} -shared -fPIC -O2 tests/portable/macos_shim.c -o "$shim" -ldl 2>&1); then
    skp shm_macos_16k_pages_still_shared "cannot build tests/portable/macos_shim.c with ${CC:-cc}: $(head -n 2 <<<"$out")"
else
    # (under make sanitize: the shim comes before GCC's ASan runtime in the library list, harmlessly)
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" LD_PRELOAD="$shim" \
        MACOS_SHIM_LOG=$TMP/shim.log DDP_TRANSPORT=shm DDP_DEBUG=INFO run_perf "$TMP/shim.txt" 2 -b 4K -e 4M -f 16 -n 3 -w 1
    rounded=$(grep -c 'bytes rounded up to' "$TMP/shim.log" 2>/dev/null)
    used=$(grep -c 'transport: shared memory (2 ranks on this host' "$TMP/shim.txt")
    if checked "$TMP/shim.txt" && [ "$used" -eq 2 ] && [ "${rounded:-0}" -ge 1 ]; then
        ok "shm_macos_16k_pages_still_shared ($(head -n 1 "$TMP/shim.log" | sed 's/^[a-z_]* //'); both ranks on shared memory)"
    else bad shm_macos_16k_pages_still_shared "segments rounded: ${rounded:-0} (want >= 1); ranks on shared memory: $used (want 2)" \
             "$(grep -E 'transport|wrong|ERR' "$TMP/shim.txt" | head -n 4)"; fi
fi

# A rank that cannot map the segment says why, and every rank's fallback line repeats that reason
# (rank 0's used to guess "another host?"). Here rank 1 wants 2 MiB chunks, rank 0 made 1 MiB ones.
DDP_DEBUG=INFO with_timeout 60 "$DDPRUN" --standalone --nproc-per-node 2 sh -c \
    '[ "$RANK" = 1 ] && export DDP_SHM_CHUNK_BYTES=2097152; exec "$0" "$@"' "$PERF" -b 4K -e 64K -n 2 -w 0 >"$TMP/why.txt" 2>&1
if checked "$TMP/why.txt" && grep -q "^\[rank 0\]: .*transport: tcp ring (1 of 2 ranks could not map the segment (rank 1: rank 0's shared memory .* fewer than the .* this job needs))" "$TMP/why.txt" &&
   ! grep -q "another host" "$TMP/why.txt"; then
    ok shm_fallback_names_the_cause_on_every_rank
else bad shm_fallback_names_the_cause_on_every_rank "$(grep -E 'transport|wrong|ERR' "$TMP/why.txt" | head -n 4)"; fi

# ---- the segment does not outlive the job ----
if [ ! -d /dev/shm ]; then
    skp shm_nothing_left_after_kill "no /dev/shm on this system (the segment is made by shm_open there)"
else
    # two ranks started by hand (ddprun would stop the survivor itself), a long sweep, and a
    # kill -9 of rank 1 in the middle of it: rank 0 must name it and end, and leave nothing behind
    free_port port
    for r in 1 0; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$PERF" -b 64M -e 64M -n 400 -w 1 >"$TMP/kill$r.txt" 2>&1 &   # DDP_TIMEOUT bounds it
        eval "pid$r=$!"
        PIDS="$PIDS $!"
    done
    for _ in $(seq 100); do
        grep -q "size" "$TMP/kill0.txt" && break
        sleep 0.1
    done
    sleep 1
    t0=$(now)
    kill -9 "$pid1"
    wait "$pid0"; rc=$?
    t1=$(now)
    # this job's segments only (named /ddp-PID-..., PID the rank that made it): other jobs on the
    # machine, another suite's among them, may come and go meanwhile
    left=$(ls /dev/shm 2>/dev/null | grep -E "^ddp-($pid0|$pid1)-")
    if [ "$rc" -eq 0 ]; then bad shm_nothing_left_after_kill "rank 0 ended well although rank 1 was killed"
    elif ! grep -qE "rank 1 closed its connection" "$TMP/kill0.txt"; then
        bad shm_nothing_left_after_kill "rank 0 did not name rank 1" "$(tail -n 4 "$TMP/kill0.txt")"
    elif [ -n "$left" ]; then
        bad shm_nothing_left_after_kill "the killed job left /dev/shm/$left behind"
    elif awk "BEGIN{exit !($t1 - $t0 > 15)}"; then
        bad shm_nothing_left_after_kill "rank 0 took $(awk "BEGIN{print $t1 - $t0}") s to end after the kill"
    else
        ok "shm_nothing_left_after_kill (rank 0 ended $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s after the kill)"
        echo "    first line: $(grep -m1 'DDP_ERR' "$TMP/kill0.txt")"
    fi
fi

# ---- stopped while the segment still has its name: ddprun's SIGTERM reaches rank 0 while it waits
# for the others to map the segment (here: forever, as rank 1 was told DDP_TRANSPORT=tcp and never
# comes to map it). Rank 0 must remove the name on its way out.
if [ ! -d /dev/shm ]; then
    skp shm_name_removed_on_sigterm "no /dev/shm on this system (the segment is made by shm_open there)"
else
    # each rank writes its pid to $TMP/term.pid.RANK first (no /proc/PID/environ on macOS)
    "$DDPRUN" --standalone --nproc-per-node 2 sh -c 'echo $$ > "$1.$RANK"; if [ "$RANK" = 1 ]; then export DDP_TRANSPORT=tcp; fi
        exec "$0" -b 4K -e 4K -n 1' "$PERF" "$TMP/term.pid" >"$TMP/term.txt" 2>&1 &
    launcher=$!
    PIDS="$PIDS $launcher"
    rank0="" seg=""
    for _ in $(seq 200); do   # rank 0's pid, then its segment's name (at most 10 s)
        rank0=$(cat "$TMP/term.pid.0" 2>/dev/null)
        [ -n "$rank0" ] && seg=$(ls /dev/shm 2>/dev/null | grep "^ddp-$rank0-" | head -n 1)
        [ -n "$seg" ] && break
        sleep 0.05
    done
    if [ -z "$seg" ]; then
        kill -TERM $launcher 2>/dev/null; wait $launcher 2>/dev/null
        bad shm_name_removed_on_sigterm "rank 0 (pid ${rank0:-?}) never made its segment" "$(tail -n 4 "$TMP/term.txt")"
    else
        kill -TERM $launcher
        wait $launcher; rc=$?
        if [ -e "/dev/shm/$seg" ]; then
            bad shm_name_removed_on_sigterm "/dev/shm/$seg (rank 0's, $(du -k "/dev/shm/$seg" | cut -f1) KiB) is left after SIGTERM (ddprun exit status $rc)"
            rm -f "/dev/shm/$seg"
        elif [ $rc -eq 0 ]; then bad shm_name_removed_on_sigterm "ddprun ended with status 0 after SIGTERM"
        else ok "shm_name_removed_on_sigterm (rank 0's /dev/shm/$seg is gone; ddprun exit status $rc)"; fi
    fi
fi

# ---- no room for the segment: TCP instead, or a clear error when shm was asked for ----
# a private mount namespace with a 64 KiB /dev/shm (root, util-linux unshare). Linux's tmpfs only:
# the portable build (make test-portable) sizes the segment with ftruncate, as macOS does, which
# reserves nothing on tmpfs, so there the first touch of a missing page would be the failure.
full_skip=
if [ "${DDP_TEST_PORTABLE:-0}" = 1 ]; then full_skip="a Linux tmpfs case: the portable build sizes shared memory with ftruncate, as macOS does"
elif ! unshare -m true 2>/dev/null; then full_skip="cannot make a mount namespace here (needs root and unshare)"; fi
if [ -n "$full_skip" ]; then
    skp shm_full_falls_back_to_tcp "$full_skip"
    skp shm_full_fails_when_asked "$full_skip"
else
    small() { with_timeout 60 unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "$@"' sh "$@"; }
    DDP_DEBUG=INFO small "$DDPRUN" --standalone --nproc-per-node 2 "$PERF" -b 4K -e 64K -n 2 -w 0 >"$TMP/full.txt" 2>&1
    if checked "$TMP/full.txt" && grep -q "transport: tcp ring (reserving .* bytes of shared memory failed" "$TMP/full.txt"; then
        ok shm_full_falls_back_to_tcp
    else bad shm_full_falls_back_to_tcp "$(grep -E 'transport|wrong|ERR|mount' "$TMP/full.txt" | head -n 4)"; fi
    DDP_TRANSPORT=shm small "$DDPRUN" --standalone --nproc-per-node 2 "$PERF" -b 4K -e 4K -n 1 -w 0 >"$TMP/full2.txt" 2>&1; rc=$?
    if [ $rc -ne 0 ] && grep -q "DDP_TRANSPORT=shm, but rank 0 cannot use shared memory: reserving" "$TMP/full2.txt"; then
        ok shm_full_fails_when_asked
    else bad shm_full_fails_when_asked "exit status $rc" "$(grep -E 'ERR|shm' "$TMP/full2.txt" | head -n 4)"; fi
fi

# ---- core binding (DDP_BIND, Linux): local ranks split only a CPU set they share; a set that a
# launcher gave one rank alone (SLURM --cpu-bind, mpirun --bind-to) is kept whole. taskset plays the
# launcher: around ddprun (one set for both ranks), or in a wrapper per rank (a set each).
bind_skip= cpus=()
if [ "${DDP_TEST_PORTABLE:-0}" = 1 ]; then bind_skip="the portable build binds nothing (macOS has no CPU masks)"
elif ! command -v taskset >/dev/null 2>&1; then bind_skip="no taskset (util-linux) to give the ranks CPU masks"
else
    for part in $(taskset -pc $$ 2>/dev/null | sed 's/.*: //' | tr ',' ' '); do   # "0-3,6": the first two CPUs
        for ((c = ${part%-*}; c <= ${part#*-} && ${#cpus[@]} < 2; c++)); do cpus+=("$c"); done
    done
    [ ${#cpus[@]} -lt 2 ] && bind_skip="this process may use ${#cpus[@]} CPU, and the cases need 2"
fi
if [ -n "$bind_skip" ]; then
    for c in bind_own_sets_kept bind_one_shared_cpu_not_split bind_shared_set_split; do skp "$c" "$bind_skip"; done
else
    c0=${cpus[0]} c1=${cpus[1]}
    DDP_DEBUG=INFO C0=$c0 C1=$c1 with_timeout 60 "$DDPRUN" --standalone --nproc-per-node 2 sh -c \
        'if [ "$LOCAL_RANK" = 0 ]; then c=$C0; else c=$C1; fi; exec taskset -c $c "$0" "$@"' "$PERF" -b 4K -e 4K -n 1 -w 0 >"$TMP/own.txt" 2>&1
    if checked "$TMP/own.txt" && grep -q "^\[rank 0\]: .*kept CPU $c0 as given: no other rank of this machine has them" "$TMP/own.txt" &&
       grep -q "^\[rank 1\]: .*kept CPU $c1 as given: no other rank" "$TMP/own.txt" && ! grep -q "bound to" "$TMP/own.txt"; then
        ok "bind_own_sets_kept (CPU $c0 and CPU $c1, one per rank)"
    else bad bind_own_sets_kept "$(grep -E 'kept|bound|wrong|ERR' "$TMP/own.txt" | head -n 4)"; fi
    DDP_DEBUG=INFO with_timeout 60 taskset -c "$c1" "$DDPRUN" --standalone --nproc-per-node 2 "$PERF" -b 4K -e 4K -n 1 -w 0 >"$TMP/one.txt" 2>&1
    if checked "$TMP/one.txt" && [ "$(grep -c "not bound: 2 local ranks share CPU $c1, fewer cores than ranks" "$TMP/one.txt")" = 2 ]; then
        ok bind_one_shared_cpu_not_split
    else bad bind_one_shared_cpu_not_split "$(grep -E 'kept|bound|wrong|ERR' "$TMP/one.txt" | head -n 4)"; fi
    # both CPUs shared: each rank takes one, or (two threads of one core) neither is bound
    DDP_DEBUG=INFO with_timeout 60 taskset -c "$c0,$c1" "$DDPRUN" --standalone --nproc-per-node 2 "$PERF" -b 4K -e 4K -n 1 -w 0 >"$TMP/two.txt" 2>&1
    got0=$(sed -n "s/^\[rank 0\]: .*bound to CPU \([0-9]*\), share 1 of 2 of CPUs .*/\1/p" "$TMP/two.txt")
    got1=$(sed -n "s/^\[rank 1\]: .*bound to CPU \([0-9]*\), share 2 of 2 of CPUs .*/\1/p" "$TMP/two.txt")
    if checked "$TMP/two.txt" && { { [ -n "$got0" ] && [ -n "$got1" ] && [ "$got0" != "$got1" ]; } ||
       [ "$(grep -c "not bound: 2 local ranks share CPUs" "$TMP/two.txt")" = 2 ]; }; then
        ok "bind_shared_set_split (ranks 0 and 1 on CPU ${got0:-none} and CPU ${got1:-none})"
    else bad bind_shared_set_split "$(grep -E 'kept|bound|wrong|ERR' "$TMP/two.txt" | head -n 4)"; fi
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
