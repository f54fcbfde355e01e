#!/usr/bin/env bash
# tests/multiproc/test_bad_input.sh: one bad input at a time, given to a real program (mostly the chapter-3
# example, which reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT like a torchrun program), with real
# processes and real sockets on 127.0.0.1 only.
#   bash tests/multiproc/test_bad_input.sh BUILD_DIR        (BUILD_DIR defaults to build)
# Every case asserts that the program exits with a non-zero status, that it ends within a bound
# (DDP_TIMEOUT is set to a few seconds wherever something waits), and that its stderr has a phrase
# naming the cause. Each case prints one line, "ok   name", "FAIL name" (then indented details) or
# "skip name: reason", as tests/run.sh counts them, followed by
#     first line: <the first line of the error message>
# (the line carrying the DDP_ERR_* status, else the first warning or error line), so a closing note
# can list them. The script exits 1 if any case failed. It takes about 30-40 s: the cases that wait
# out a deadline run alongside the others. python3 plays the foreign listeners and clients; without
# it those cases are skipped.
set -u
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
cd "$(dirname "$0")/../.." || exit 1   # the examples find their bundled data from the top folder
. tests/multiproc/proc_cases.sh

EX=$BUILD/examples/ch04_multi_node
DDPRUN=$BUILD/ddprun
ARGS=(--device cpu --epochs 1 --save-every 0)
for f in "$EX" "$DDPRUN"; do
    if [ ! -x "$f" ]; then bad built "$f is not an executable (run make first, or pass the build folder)"; exit 1; fi
done
HAVE_PY=0; command -v python3 >/dev/null 2>&1 && HAVE_PY=1


# The first line of the error message in file $1: the DDP_ERR_* line, else the first warning or
# error line, else the first line; leading blanks removed.
first_line() {
    local l
    l=$(grep -m1 -E 'DDP_ERR_[A-Z_]+:' "$1" 2>/dev/null)
    [ -z "$l" ] && l=$(grep -m1 -iE 'warning|error|refused|ddprun:' "$1" 2>/dev/null)
    [ -z "$l" ] && l=$(grep -m1 . "$1" 2>/dev/null)
    sed 's/^[[:space:]]*//' <<<"${l:-(no output on stderr)}"
}

# verdict NAME TAG WANT LO HI [EXTRA_PROBLEM...]: judge the foreground run (RC, T0, T1) whose stderr
# is $TMP/TAG.err: non-zero status, not killed by `timeout`, LO <= seconds <= HI, stderr matching
# the extended regex WANT. Extra problems found by the caller (the other ranks) come after.
verdict() {
    local name=$1 tag=$2 want=$3 lo=$4 hi=$5 el l why=() tail_lines=()
    shift 5
    el=$(awk "BEGIN{printf \"%.1f\", $T1 - $T0}")
    [ "$RC" -eq 0 ] && why+=("exit status 0, want non-zero")
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then why+=("killed by timeout after $el s: it hung"); fi
    awk "BEGIN{exit !($el < $lo - $COMPAT_SLACK)}" && why+=("ended after $el s, before $lo s")
    awk "BEGIN{exit !($el > $hi + $COMPAT_SLACK)}" && why+=("took $el s, over the bound of $hi s")
    grep -qE -- "$want" "$TMP/$tag.err" || why+=("stderr does not match /$want/")
    for l in "$@"; do [ -n "$l" ] && why+=("$l"); done
    if [ ${#why[@]} -eq 0 ]; then
        ok "$name"
    else
        read_lines tail_lines < <(tail -n 4 "$TMP/$tag.err" | cut -c1-400)
        bad "$name" "${why[@]}" "(status $RC after $el s; the end of its stderr:)" ${tail_lines[@]+"${tail_lines[@]}"}
    fi
    echo "    first line: $(first_line "$TMP/$tag.err")"
}

# other_rank RC TAG WANT: a problem line when the background rank TAG (which ended with status RC)
# did not end non-zero on its own with stderr matching WANT; empty when it did.
other_rank() {
    local rc=$1 tag=$2 want=$3
    if [ $rc -eq 0 ]; then echo "the other rank ($tag) exited with status 0"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "the other rank ($tag) hung: killed by timeout"
    elif [ -n "$want" ] && ! grep -qE -- "$want" "$TMP/$tag.err"; then
        echo "the other rank's stderr does not match /$want/: $(first_line "$TMP/$tag.err")"
    fi
}

# A foreign program on a port (python3): hold (listen, never accept), silent (accept, never
# answer), banner (answer every connection with an SSH greeting), newer-store (answer every HELLO
# as a store of another protocol version would). It writes $TMP/MODE.ready once listening and
# lives at most 40 s.
cat >"$TMP/listener.py" <<'EOF'
import socket, struct, sys, time
mode, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
open(ready, "w").close()
end, held = time.time() + 40, []
s.settimeout(0.2)
while time.time() < end:
    if mode == "hold":
        time.sleep(0.2); continue
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    if mode == "silent":
        held.append(c)
    elif mode == "banner":
        c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n"); time.sleep(0.3); c.close()
    elif mode == "newer-store":
        c.settimeout(5)
        h = b""
        while len(h) < 20:
            h += c.recv(20 - len(h))
        n = struct.unpack("<I", h[8:12])[0] + struct.unpack("<I", h[12:16])[0]
        while n > 0:
            n -= len(c.recv(n))
        why = b"protocol version mismatch"
        c.sendall(b"DDPS" + struct.pack("<HHI", 2, 0, len(why)) + why)   # status 2: refused
        c.close()
EOF

# A store client of another protocol version: sends HELLO with version $2 to 127.0.0.1:$1 and prints
# the reply; exits 3 when the store refused it, 0 if it was accepted.
cat >"$TMP/old_client.py" <<'EOF'
import socket, struct, sys, time
port, version = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(b"DDPS" + struct.pack("<HHIII", version, 1, 0, 0, 5000))   # HELLO, empty job token
buf = b""
while True:
    b = s.recv(4096)
    if not b: break
    buf += b
if len(buf) >= 12 and buf[:4] == b"DDPS":
    st, n = struct.unpack("<H", buf[4:6])[0], struct.unpack("<I", buf[8:12])[0]
    msg = buf[12:12 + n].decode(errors="replace")
    if st != 0:
        print("error: the store refused a version-%d HELLO (status %d): %s" % (version, st, msg), file=sys.stderr)
        sys.exit(3)
    print("the store accepted a version-%d HELLO" % version, file=sys.stderr)
    sys.exit(0)
print("error: no reply from the store: %r" % buf, file=sys.stderr)
sys.exit(4)
EOF

# start_listener MODE PORT: LST gets its pid; returns 1 if it never became ready.
start_listener() {
    rm -f "$TMP/$1.ready"
    python3 "$TMP/listener.py" "$1" "$2" "$TMP/$1.ready" 2>"$TMP/listener.$1.err" &
    LST=$!
    PIDS="$PIDS $LST"
    wait_file "$TMP/$1.ready"
}
stop() { kill -TERM "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

# one rank, one bad placement variable: single_env NAME WANT VAR=value...
single_env() {
    local name=$1 want=$2
    shift 2
    run_fg "$name" 20 DDP_TIMEOUT=3 "$@" -- "$EX" "${ARGS[@]}"
    verdict "$name" "$name" "$want" 0 10
}

free_port PORT   # a port for the cases that fail before any socket opens

# The cases that wait out a deadline start now, in the background, and are judged in their place
# below: the whole script then takes about as long as the slowest of them.
free_port P_UNREACHABLE
run_async master_unreachable 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P_UNREACHABLE DDP_TIMEOUT=3 -- "$EX" "${ARGS[@]}"
free_port P_ADDR
run_async master_addr_with_port 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1:$P_ADDR MASTER_PORT=$P_ADDR DDP_TIMEOUT=3 -- "$EX" "${ARGS[@]}"
SILENT=0
if [ $HAVE_PY = 1 ]; then
    free_port P_SILENT
    if start_listener silent "$P_SILENT"; then
        SILENT=$LST
        run_async port_held_by_silent_program 25 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P_SILENT DDP_TIMEOUT=3 -- "$EX" "${ARGS[@]}"
    fi
fi

# ---- 1-4, 12, 13: the placement variables ---------------------------------------------------------
single_env rank_not_below_world_size 'DDP_ERR_ENV: RANK=2 is not below WORLD_SIZE=2' \
    RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env rank_negative 'DDP_ERR_ENV: RANK=-1 is negative' \
    RANK=-1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env world_size_not_a_number 'DDP_ERR_ENV: WORLD_SIZE=two is not a whole number' \
    RANK=0 WORLD_SIZE=two MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env world_size_zero 'DDP_ERR_ENV: WORLD_SIZE=0 is below 1' \
    RANK=0 WORLD_SIZE=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env world_size_without_rank 'DDP_ERR_ENV: WORLD_SIZE=2 is set but RANK is not' \
    WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env master_addr_missing 'DDP_ERR_ENV: MASTER_ADDR is not set but WORLD_SIZE=2' \
    RANK=1 WORLD_SIZE=2 MASTER_PORT=$PORT
single_env master_port_out_of_range 'DDP_ERR_ENV: MASTER_PORT=70000 is not a port number' \
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=70000
single_env master_port_not_a_number 'DDP_ERR_ENV: MASTER_PORT=abc is not a port number' \
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=abc
single_env local_rank_not_below_local_world_size 'DDP_ERR_ENV: LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2' \
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env local_world_size_missing 'DDP_ERR_ENV: LOCAL_WORLD_SIZE is not set but LOCAL_RANK is' \
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env local_world_size_above_world_size 'DDP_ERR_ENV: LOCAL_WORLD_SIZE=3 is not between 1 and WORLD_SIZE=2' \
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env group_rank_not_a_number 'DDP_ERR_ENV: GROUP_RANK=x is not a whole number' \
    RANK=0 WORLD_SIZE=1 GROUP_RANK=x MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT

# ---- other settings: backend, device, timeout ------------------------------------------------------
single_env backend_unknown 'DDP_ERR_ENV: DDP_BACKEND=foo is not cpu, nccl or mpi' \
    RANK=0 WORLD_SIZE=1 DDP_BACKEND=foo MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env backend_mpi_not_built 'DDP_ERR_NOT_BUILT: the mpi backend was asked for \(DDP_BACKEND=mpi\), but this program was built without it: compile with -DDDP_MPI' \
    RANK=0 WORLD_SIZE=1 DDP_BACKEND=mpi MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
single_env backend_nccl_on_cpu 'DDP_ERR_INVALID_ARGUMENT: the nccl backend needs GPU buffers' \
    RANK=0 WORLD_SIZE=1 DDP_BACKEND=nccl MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
run_fg device_not_parsed 20 -- "$EX" --device cuda:x --epochs 1 --save-every 0
verdict device_not_parsed device_not_parsed 'device "cuda:x" is not one of cpu, cuda, cuda:N' 0 10
# A timeout that is not a number: today the library warns and goes on with 300 s (exit 0). Every other
# variable it reads is refused with DDP_ERR_ENV; a typo here (DDP_TIMEOUT=30s) silently means 300 s.
single_env timeout_not_a_number 'DDP_TIMEOUT=abc is not a positive number' \
    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT DDP_TIMEOUT=abc
# A timeout too short for any network round trip: said as such, not as "not a ddp.h store".
single_env timeout_too_short 'DDP_ERR_ENV: DDP_TIMEOUT=1e-9 is shorter than' \
    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT DDP_TIMEOUT=1e-9
# A simulated network so slow that one collective would outlast the deadline: a 4 KiB all-reduce at
# 1 ms a byte is 4 s against DDP_TIMEOUT=2. Said at once, not slept through.
run_fg simulate_longer_than_timeout 30 DDP_TIMEOUT=2 DDP_SIMULATE_NS_PER_BYTE=1000000 -- \
    "$DDPRUN" --standalone --nproc-per-node 2 "$BUILD/allreduce_perf" -b 4K -e 4K -n 1 -w 0
verdict simulate_longer_than_timeout simulate_longer_than_timeout \
    'DDP_ERR_ENV: DDP_SIMULATE_NS_PER_BYTE=1000000 makes this all_reduce of 4096 bytes last 4.1 s, longer than the timeout \(2 s' 0 10
run_fg ddprun_master_port_out_of_range 20 -- "$DDPRUN" --master-port 70000 --nproc-per-node 1 true
verdict ddprun_master_port_out_of_range ddprun_master_port_out_of_range \
    'ddprun: --master-port must be a whole number from 1 to 65535, not "70000"' 0 10

# ---- 5: nobody listens at MASTER_ADDR:MASTER_PORT: retry until the deadline, then say so ----------
finish_async master_unreachable
verdict master_unreachable master_unreachable \
    "DDP_ERR_STORE_UNREACHABLE: no rendezvous store answered at 127.0.0.1:$P_UNREACHABLE within 3 s" 2 15

# MASTER_ADDR with the port glued on (a common slip): it cannot resolve; the message must quote it.
finish_async master_addr_with_port
verdict master_addr_with_port master_addr_with_port \
    "DDP_ERR_ENV: MASTER_ADDR=127\.0\.0\.1:$P_ADDR holds a port" 0 15

# ---- 6: MASTER_PORT held by another program when rank 0 starts --------------------------------------
if [ $HAVE_PY = 1 ]; then
    free_port P
    if start_listener hold "$P"; then
        run_fg port_held_by_other_program 20 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=3 -- "$EX" "${ARGS[@]}"
        verdict port_held_by_other_program port_held_by_other_program \
            "DDP_ERR_PORT_IN_USE: the rendezvous store cannot listen on port $P: it is already in use" 0 10
    else
        bad port_held_by_other_program "the python listener never started: $(cat "$TMP/listener.hold.err")"
    fi
    stop "$LST"
else
    skp port_held_by_other_program "python3 is not installed, and it plays the other program (apt-get install python3)"
fi

# ---- rank 1 pointed at a port another program holds: one that answers in its own protocol, one ----
# that accepts and never answers. The message should say the program there is not a ddp.h store;
# the silent one must also give up within about DDP_TIMEOUT.
NOT_A_STORE='not a ddp\.h (rendezvous )?store|not (speaking|speak) (this|the store.s) protocol|another program|did not answer'
if [ $HAVE_PY = 1 ]; then
    free_port P
    if start_listener banner "$P"; then
        run_fg port_held_by_other_protocol 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=3 -- "$EX" "${ARGS[@]}"
        verdict port_held_by_other_protocol port_held_by_other_protocol "$NOT_A_STORE" 0 10
    else
        bad port_held_by_other_protocol "the python listener never started: $(cat "$TMP/listener.banner.err")"
    fi
    stop "$LST"
    if [ "$SILENT" != 0 ]; then
        finish_async port_held_by_silent_program
        verdict port_held_by_silent_program port_held_by_silent_program "$NOT_A_STORE" 0 10
        stop "$SILENT"
    else
        bad port_held_by_silent_program "the python listener never started: $(cat "$TMP/listener.silent.err")"
    fi
else
    skp port_held_by_other_protocol "python3 is not installed, and it plays the other program (apt-get install python3)"
    skp port_held_by_silent_program "python3 is not installed, and it plays the other program (apt-get install python3)"
fi

# ---- 7: two jobs on one port: job B's rank 0 finds job A's store there --------------------------------
free_port P
run_bg jobA_rank0 20 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=8 DDP_JOB_TOKEN=job-a -- "$EX" "${ARGS[@]}"
A=$BG
if wait_port "$P" 5; then
    run_fg two_jobs_one_port 20 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=3 DDP_JOB_TOKEN=job-b -- "$EX" "${ARGS[@]}"
    verdict two_jobs_one_port two_jobs_one_port \
        "DDP_ERR_PORT_IN_USE: the rendezvous store cannot listen on port $P: it is already in use \(another job" 0 10
    # ... and job B's rank 1 reaches job A's store, which refuses it
    run_fg two_jobs_rank1_refused 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=3 DDP_JOB_TOKEN=job-b -- "$EX" "${ARGS[@]}"
    verdict two_jobs_rank1_refused two_jobs_rank1_refused \
        "DDP_ERR_STORE_REFUSED: the process listening at 127.0.0.1:$P refused this rank: wrong job token" 0 10
else
    bad two_jobs_one_port "job A's rank 0 never listened on $P:" "$(tail -n 3 "$TMP/jobA_rank0.err")"
fi
stop "$A"

# ---- 8: rank 1's job token differs from rank 0's --------------------------------------------------
free_port P
run_bg token_rank0 20 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=3 DDP_JOB_TOKEN=token-one -- "$EX" "${ARGS[@]}"
A=$BG
wait_port "$P" 5
run_fg wrong_job_token 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=3 DDP_JOB_TOKEN=token-two -- "$EX" "${ARGS[@]}"
# rank 0 must log the refusal, then give up when rank 1 never joins (DDP_TIMEOUT=3)
wait "$A"; rcA=$?
verdict wrong_job_token wrong_job_token "DDP_ERR_STORE_REFUSED: .*refused this rank: wrong job token.*DDP_JOB_TOKEN" 0 10 \
    "$(other_rank $rcA token_rank0 'store: refused .*wrong job token')"

# ---- 9: a store client of another protocol version ---------------------------------------------------
# (a) a version-2 HELLO (python3) to a real rank 0: the store refuses it and says so; the job
#     then goes on normally with a real rank 1.
# (b) a real rank 1 meets a store that refuses its version (python3 answering as a newer store would).
if [ $HAVE_PY = 1 ]; then
    free_port P
    run_bg version_rank0 20 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 -- "$EX" "${ARGS[@]}"
    A=$BG
    wait_port "$P" 5
    run_fg version_client 10 -- python3 "$TMP/old_client.py" "$P" 2
    run_bg version_rank1 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 -- "$EX" "${ARGS[@]}"
    B=$BG
    wait "$A"; rc0=$?
    wait "$B"; rc1=$?
    more=()
    grep -q "speaks protocol version 2, this server 1" "$TMP/version_rank0.err" ||
        more+=("rank 0 logged no line naming the version: $(first_line "$TMP/version_rank0.err")")
    [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || more+=("the real job after the bad client ended with status $rc0 (rank 0) and $rc1 (rank 1), want 0 and 0")
    cp "$TMP/version_rank0.err" "$TMP/version_mismatch.err"
    cat "$TMP/version_client.err" >>"$TMP/version_mismatch.err"
    verdict protocol_version_mismatch version_mismatch "the store refused a version-2 HELLO \(status 2\): protocol version mismatch" 0 10 \
        ${more[@]+"${more[@]}"}

    free_port P
    if start_listener newer-store "$P"; then
        run_fg protocol_version_mismatch_seen_by_rank 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=3 -- "$EX" "${ARGS[@]}"
        verdict protocol_version_mismatch_seen_by_rank protocol_version_mismatch_seen_by_rank \
            "DDP_ERR_STORE_REFUSED: .*refused this rank: protocol version mismatch" 0 10
    else
        bad protocol_version_mismatch_seen_by_rank "the python listener never started: $(cat "$TMP/listener.newer-store.err")"
    fi
    stop "$LST"
else
    skp protocol_version_mismatch "python3 is not installed, and it plays the client of another version (apt-get install python3)"
    skp protocol_version_mismatch_seen_by_rank "python3 is not installed, and it plays the store of another version (apt-get install python3)"
fi

# ---- 10: the ranks disagree about the world size ------------------------------------------------
free_port P
run_bg world_rank0 20 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 -- "$EX" "${ARGS[@]}"
A=$BG
wait_port "$P" 5
run_fg world_sizes_disagree 20 RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 -- "$EX" "${ARGS[@]}"
wait "$A"; rcA=$?
# (whichever rank notices first says so and stops the other, so either wording may come)
WORLD_MSG='DDP_ERR_WORLD_MISMATCH: .*(rank 0 was started with WORLD_SIZE=2 but rank 1 with WORLD_SIZE=3|rank 1 was started with WORLD_SIZE=3 but rank 0 with WORLD_SIZE=2)'
verdict world_sizes_disagree world_sizes_disagree "$WORLD_MSG" 0 10 "$(other_rank $rcA world_rank0 "$WORLD_MSG")"

# Two processes given the same RANK: the later one is refused. The job (rank 0 and the first
# RANK=1, training for a long time) is running when the duplicate arrives; it is stopped afterwards.
free_port P
run_bg dup_rank0 30 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 DDP_DEBUG=INFO -- "$EX" "${ARGS[@]}" --epochs 1000000
A=$BG
run_bg dup_rank1 30 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 DDP_DEBUG=INFO -- "$EX" "${ARGS[@]}" --epochs 1000000
B=$BG
for _ in $(seq 100); do
    grep -q "joined the job" "$TMP/dup_rank1.err" 2>/dev/null && grep -q "joined the job" "$TMP/dup_rank0.err" 2>/dev/null && break
    sleep 0.05
done
if grep -q "joined the job" "$TMP/dup_rank1.err"; then
    run_fg duplicate_rank 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 -- "$EX" "${ARGS[@]}"
    verdict duplicate_rank duplicate_rank "DDP_ERR_WORLD_MISMATCH: two processes were started with RANK=1: pid [0-9]+ on host .* holds rank 1" 0 10
else
    bad duplicate_rank "the first two ranks never joined:" "$(tail -n 3 "$TMP/dup_rank0.err" "$TMP/dup_rank1.err")"
fi
stop "$A"; stop "$B"

# A duplicate RANK=1 that comes while the job is still in rendezvous (world size 3, rank 2 not
# started yet) is refused with the pid and host of the process that holds rank 1, and the job goes
# on: once rank 2 comes, it trains and every rank ends with status 0.
free_port P
run_bg slot_rank0 40 RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
A=$BG
run_bg slot_rank1 40 RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
B=$BG
wait_port "$P" 5
sleep 0.5   # rank 1 has claimed its slot (ddp_init retries its connection every few ms at first)
run_fg duplicate_rank_in_rendezvous 20 RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
dup_rc=$RC dup_t0=$T0 dup_t1=$T1
rank1_pid=$(prog_pid slot_rank1)   # (the program itself: its pid file, see run_bg)
run_fg slot_rank2 40 RANK=2 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
rc2=$RC
wait "$A"; rcA=$?
wait "$B"; rcB=$?
RC=$dup_rc T0=$dup_t0 T1=$dup_t1
holder=$(sed -n 's/.*pid \([0-9]*\) on host .* holds rank 1.*/\1/p' "$TMP/duplicate_rank_in_rendezvous.err" | head -n 1)
more=()
[ $rcA -eq 0 ] && [ $rcB -eq 0 ] && [ $rc2 -eq 0 ] ||
    more+=("the job did not go on: ranks 0, 1, 2 ended with status $rcA, $rcB, $rc2 (want 0, 0, 0): $(first_line "$TMP/slot_rank0.err")")
[ -n "$holder" ] && [ "$holder" = "$rank1_pid" ] ||
    more+=("the message does not name the pid of the process holding rank 1 (${rank1_pid:-?}): pid '${holder}'")
verdict duplicate_rank_in_rendezvous duplicate_rank_in_rendezvous \
    "DDP_ERR_WORLD_MISMATCH: two processes were started with RANK=1: pid [0-9]+ on host .* holds rank 1" 0 10 \
    ${more[@]+"${more[@]}"}

# Rank 1 killed during the rendezvous (world size 3, rank 2 not started yet; SIGKILL, as the OOM
# killer sends), then started again by hand: its slot is free again, the replacement takes it and
# the job trains; every rank ends with status 0, long before DDP_TIMEOUT. (It was refused, "pid N
# holds rank 1", and ranks 0 and 2 waited the timeout.)
# slot_taken_over CASE MESSAGE [WRAPPER...]: that, with rank 1 started under WRAPPER; the
# replacement must say MESSAGE (a grep pattern; @PID@ stands for the killed process's pid).
slot_taken_over() {
    local name=$1 msg=$2 dead A B rcA rcB el
    shift 2
    free_port P
    run_bg "${name}_r0" 40 RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
    A=$BG
    run_bg "${name}_r1" 40 RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$@" "$EX" "${ARGS[@]}"
    B=$BG
    wait_port "$P" 5
    sleep 1   # rank 1 has claimed its slot
    dead=$(prog_pid "${name}_r1")
    kill -KILL "$dead" 2>/dev/null; wait "$B" 2>/dev/null
    run_bg "${name}_again" 40 RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
    B=$BG
    run_fg "$name" 40 RANK=2 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
    wait "$A"; rcA=$?
    wait "$B"; rcB=$?
    el=$(awk "BEGIN{printf \"%.1f\", $T1 - $T0}")
    if [ $RC -eq 0 ] && [ $rcA -eq 0 ] && [ $rcB -eq 0 ] && awk "BEGIN{exit !($el < 10 + $COMPAT_SLACK)}" &&
       grep -q "${msg//@PID@/${dead:-?}}" "$TMP/${name}_again.err"; then
        ok "$name (the job trained; rank 2 done after $el s, DDP_TIMEOUT 15)"
    else
        bad "$name" "ranks 0, 1 (started again), 2 ended with status $rcA, $rcB, $RC after $el s (want 0, 0, 0, well before DDP_TIMEOUT=15)" \
            "rank 1 started again: $(first_line "$TMP/${name}_again.err")" "rank 0: $(first_line "$TMP/${name}_r0.err")" \
            "rank 2: $(first_line "$TMP/$name.err")"
    fi
}
# on this host: the holder's pid no longer runs
slot_taken_over slot_of_a_dead_rank_taken_over \
    "rank 1's slot was held by pid @PID@ on this host, which no longer runs: this process takes it over"
# on "another host": rank 1 in a pid namespace of its own (unshare --pid), where its pid means
# nothing to the others, so only its store connection can tell that it is gone: its sign of life
# (a store key tied to that connection) goes with it
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null 2>&1 || ! unshare --pid --fork --kill-child true >/dev/null 2>&1; then
    skp slot_of_a_dead_rank_on_another_host_taken_over "needs root and util-linux's unshare --pid --kill-child, to run rank 1 as if on another host"
else
    slot_taken_over slot_of_a_dead_rank_on_another_host_taken_over \
        "rank 1's slot was held by pid [0-9]* on host .*, whose connection to the store has closed (it died or was killed during the rendezvous): this process takes it over" \
        unshare --pid --fork --kill-child
fi

# Two launches of ddprun on one port with one DDP_JOB_TOKEN: job B starts while job A is still in
# rendezvous (A's rank 1 starts only once B has ended: $GO, at most 30 s). B's rank 1 must not take
# A's free rank 1: it is refused as another launch's, and job A trains with its own rank 1 and ends
# with status 0. (B's rank 0 waits 20 s, so that its own failure, the port in use, cannot stop B's
# rank 1 first; ddprun stops it when rank 1 fails.) Waiting on events, not on fixed delays: under
# make sanitize on a busy machine, a program takes seconds to start, and with A's rank 1 started
# 3 s late job A could end before B's rank 1 reached it, which then trained as B's (status 0).
GO=$TMP/launch_a.go
free_port P
run_bg launch_a 60 DDP_JOB_TOKEN=same DDP_TIMEOUT=40 GO="$GO" -- "$DDPRUN" --master-addr 127.0.0.1 --master-port $P --nproc-per-node 2 \
    sh -c 'if [ "$RANK" = 1 ]; then i=0; while [ ! -e "$GO" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; fi; exec "$0" "$@"' "$EX" "${ARGS[@]}"
A=$BG
wait_port "$P" 20
run_fg second_launch_same_token 60 DDP_JOB_TOKEN=same DDP_TIMEOUT=15 -- "$DDPRUN" --master-addr 127.0.0.1 --master-port $P \
    --nproc-per-node 2 sh -c 'if [ "$RANK" = 0 ]; then sleep 20; fi; exec "$0" "$@"' "$EX" "${ARGS[@]}"
touch "$GO"
wait "$A"; rcA=$?
more=()
[ $rcA -eq 0 ] || more+=("job A ended with status $rcA, want 0: $(first_line "$TMP/launch_a.err")")
grep -q "^\[rank 0\]: test accuracy" "$TMP/launch_a.out" || more+=("job A printed no test accuracy")
verdict second_launch_same_token second_launch_same_token \
    "rank 1\]: .*DDP_ERR_STORE_REFUSED: .*another launch" 0 30 ${more[@]+"${more[@]}"}

# A process started by hand with the job's token and DDP_LAUNCH_ID set but empty (a script that
# exports it from an unset variable) reaches a ddprun job in rendezvous (its rank 1 starts once
# that process has ended, as above): refused as another launch's rank, not let in to take rank 1;
# the job trains, status 0.
GO=$TMP/launch_c.go
free_port P
run_bg launch_c 60 DDP_JOB_TOKEN=same DDP_TIMEOUT=40 GO="$GO" -- "$DDPRUN" --master-addr 127.0.0.1 --master-port $P --nproc-per-node 2 \
    sh -c 'if [ "$RANK" = 1 ]; then i=0; while [ ! -e "$GO" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; fi; exec "$0" "$@"' "$EX" "${ARGS[@]}"
A=$BG
wait_port "$P" 20
run_fg empty_launch_id_refused 30 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_JOB_TOKEN=same DDP_LAUNCH_ID= \
    DDP_TIMEOUT=15 -- "$EX" "${ARGS[@]}"
touch "$GO"
wait "$A"; rcA=$?
more=()
[ $rcA -eq 0 ] || more+=("the ddprun job ended with status $rcA, want 0: $(first_line "$TMP/launch_c.err")")
verdict empty_launch_id_refused empty_launch_id_refused \
    "DDP_ERR_STORE_REFUSED: .*belongs to another launch.*this rank by launch \(an empty DDP_LAUNCH_ID\)" 0 10 ${more[@]+"${more[@]}"}

# ---- 11: the ranks build different models (hidden width 64 on rank 0, 32 on rank 1) ---------------
free_port P
run_bg model_rank0 20 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 -- "$EX" "${ARGS[@]}" --hidden 64
A=$BG
wait_port "$P" 5
run_fg models_differ 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=5 -- "$EX" "${ARGS[@]}" --hidden 32
wait "$A"; rcA=$?
verdict models_differ models_differ \
    'DDP_ERR_MODEL_MISMATCH: the ranks hold different models: rank 1 has fc1\.weight\[32,13\] where rank 0 has fc1\.weight\[64,13\]' 0 10 \
    "$(other_rank $rcA model_rank0 'DDP_ERR_MODEL_MISMATCH: the ranks hold different models')"

# ---- a full disk: the snapshot's save fails, and the fix line says to free space -------------------
# (a 4 KiB tmpfs in a mount namespace of its own: the wine model's snapshot does not fit)
mkdir -p "$TMP/full"
if command -v unshare >/dev/null 2>&1 && unshare -m sh -c 'mount -t tmpfs -o size=4k tmpfs "$0"' "$TMP/full" 2>/dev/null; then
    run_fg disk_full 30 -- unshare -m sh -c 'mount -t tmpfs -o size=4k tmpfs "$0" && exec "$1" --device cpu --epochs 2 --save-every 1 --snapshot "$0/snap.safetensors"' \
        "$TMP/full" "$BUILD/examples/ch01_single_gpu"
    verdict disk_full disk_full "DDP_ERR_IO: writing .*snap.safetensors failed: No space left on device" 0 20 \
        "$(grep -q 'fix: .*free space' "$TMP/disk_full.err" || echo "the fix line does not say to free space: $(grep 'fix:' "$TMP/disk_full.err")")"
else
    skp disk_full "cannot mount a small tmpfs here (needs root and unshare -m)"
fi

# ---- nothing left behind ---------------------------------------------------------------------------
left=""
for p in $PIDS; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
if [ -z "$left" ]; then ok nothing_left_running
else bad nothing_left_running "still running:$left"; fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
