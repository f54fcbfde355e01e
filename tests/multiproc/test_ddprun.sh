#!/usr/bin/env bash
# tests/multiproc/test_ddprun.sh: the ddprun launcher, run on small /bin/sh programs (no ddp_init needed).
#   bash tests/multiproc/test_ddprun.sh build/ddprun
# Each case prints one line, "ok   name", "FAIL name" (then indented details) or "skip name: reason",
# as tests/run.sh counts them; the script exits 1 if any case failed. It takes a few seconds.
set -u
. "$(dirname "$0")/../compat.sh"   # now, elapsed_below/_over: macOS's date has no %N
DDPRUN=${1:-build/ddprun}
pass=0 fail=0 skip=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export DDP_KILL_GRACE_S=1
unset DDP_JOB_TOKEN RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT OMP_NUM_THREADS

ok()   { echo "ok   $1"; pass=$((pass + 1)); }
bad()  { echo "FAIL $1"; shift; for l in "$@"; do echo "    $l"; done; fail=$((fail + 1)); }
skp()  { echo "skip $1: $2"; skip=$((skip + 1)); }

if [ ! -x "$DDPRUN" ]; then
    bad ddprun_built "$DDPRUN is not an executable (build it first, or pass its path)"
    exit 1
fi


# Wait (at most 5 s) until `n` files match the glob prefix $2 (e.g. "$TMP/x/pid").
wait_files() {
    local n=$1 prefix=$2 i
    for i in $(seq 100); do
        [ "$(ls "$prefix"* 2>/dev/null | wc -l)" -ge "$n" ] && return 0
        sleep 0.05
    done
    return 1
}

# Does process $1 still run? A zombie does not count: a killed grandchild (the sleep below) is
# reparented to PID 1, which may take a moment to reap it, and kill -0 succeeds on a zombie.
running() { proc_alive "$1"; }  # (tests/compat.sh: also without ps)

# The processes whose pids are in files $1* that still run (empty when all are gone). A
# grandchild that ddprun signalled may take a moment to die on a busy machine: allow it 1 s.
still_alive() {
    local f p out i
    for i in $(seq 20); do
        out=""
        for f in "$1"*; do
            [ -e "$f" ] || continue
            p=$(cat "$f")
            if [ -n "$p" ] && running "$p"; then out="$out $p"; fi
        done
        [ -z "$out" ] && break
        sleep 0.05
    done
    echo "$out"
}

# A rank program that records its shell's pid and a background sleep's pid, then waits on it:
# stopping the rank must stop the sleep too (ddprun signals each rank's process group).
SLEEPER='echo $$ > "$D/pid.$RANK"; sleep 30 & echo $! > "$D/sleep.$RANK"; wait'

# ---- the environment each rank sees --------------------------------------------------------------
out=$("$DDPRUN" --standalone --nproc-per-node 3 sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT $DDP_JOB_TOKEN' 2>"$TMP/err"); rc=$?
lines=$(sort <<<"$out")
ports=$(awk '{print $7}' <<<"$lines" | sort -u)   # fields: "[rank" "R]:" R 3 R 127.0.0.1 PORT TOKEN
tokens=$(awk '{print $8}' <<<"$lines" | sort -u)
if [ $rc -eq 0 ] && [ "$(wc -l <<<"$lines")" -eq 3 ] &&
   [ "$(awk '{print $1, $2, $3, $4, $5, $6}' <<<"$lines" | tr '\n' '|')" = "[rank 0]: 0 3 0 127.0.0.1|[rank 1]: 1 3 1 127.0.0.1|[rank 2]: 2 3 2 127.0.0.1|" ] &&
   [ "$(wc -l <<<"$ports")" -eq 1 ] && [ -n "$ports" ] && [ "$ports" != 29500 ] &&
   [ "$(wc -l <<<"$tokens")" -eq 1 ] && [ -n "$tokens" ]; then
    ok standalone_three_ranks_env
else
    bad standalone_three_ranks_env "status $rc; expected 3 lines \"[rank R]: R 3 R 127.0.0.1 PORT TOKEN\" with one port (not 29500) and one token; got:" "$out" "$(cat "$TMP/err")"
fi

out=$(DDP_JOB_TOKEN=shared-token "$DDPRUN" --master-addr 127.0.0.1 --master-port 29611 --nnodes 2 --node-rank 1 --nproc-per-node 2 \
      sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $DDP_JOB_TOKEN' 2>"$TMP/err"); rc=$?
want=$'[rank 2]: 2 4 0 2 1 127.0.0.1 29611 shared-token\n[rank 3]: 3 4 1 2 1 127.0.0.1 29611 shared-token'
if [ $rc -eq 0 ] && [ "$(sort <<<"$out")" = "$want" ] && ! grep -q "DDP_JOB_TOKEN" "$TMP/err"; then
    ok explicit_two_nodes_env
else
    bad explicit_two_nodes_env "status $rc; expected:" "$want" "got:" "$out" "$(cat "$TMP/err")"
fi

out=$("$DDPRUN" --nnodes 2 --node-rank 0 --nproc-per-node 1 sh -c 'echo token=$DDP_JOB_TOKEN' 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "warning: DDP_JOB_TOKEN is not set" <<<"$out" && grep -q "^\[rank 0\]: token=." <<<"$out"; then
    ok multinode_without_token_warns
else
    bad multinode_without_token_warns "status $rc; expected a warning naming DDP_JOB_TOKEN; got:" "$out"
fi

out=$("$DDPRUN" --nproc_per_node=2 --backend nccl sh -c 'echo $OMP_NUM_THREADS $DDP_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT $DDP_BACKEND' 2>&1); rc=$?
if [ $rc -eq 0 ] && [ "$(sort -u <<<"$out" | sed 's/^\[rank .\]: //' | sort -u)" = "1 0 0 nccl" ]; then
    ok underscore_flags_and_extra_env
else
    bad underscore_flags_and_extra_env "status $rc; expected \"1 0 0 nccl\" from each rank; got:" "$out"
fi

# ---- output ------------------------------------------------------------------------------------------
"$DDPRUN" --nproc-per-node 2 sh -c 'echo out$RANK; echo err$RANK >&2; printf "tail$RANK"' >"$TMP/o" 2>"$TMP/e"; rc=$?
if [ $rc -eq 0 ] && [ "$(sort "$TMP/o" | tr '\n' '|')" = "[rank 0]: out0|[rank 0]: tail0|[rank 1]: out1|[rank 1]: tail1|" ] &&
   [ "$(sort "$TMP/e" | tr '\n' '|')" = "[rank 0]: err0|[rank 1]: err1|" ]; then
    ok stdout_and_stderr_prefixed
else
    bad stdout_and_stderr_prefixed "status $rc; stdout:" "$(cat "$TMP/o")" "stderr:" "$(cat "$TMP/e")"
fi

# ---- failures ------------------------------------------------------------------------------------------
D=$TMP/fail; mkdir -p "$D"; export D
t0=$(now)
out=$("$DDPRUN" --nproc-per-node 3 sh -c 'if [ $RANK = 1 ]; then
        while [ ! -e "$D/sleep.0" ] || [ ! -e "$D/sleep.2" ]; do sleep 0.05; done; exit 7; fi; '"$SLEEPER" 2>&1); rc=$?
t1=$(now)
left=$(still_alive "$D/pid.")$(still_alive "$D/sleep.")
if [ $rc -eq 7 ] && elapsed_below "$t0" "$t1" 5 && grep -q "^ddprun: rank 1 (pid [0-9]*) exited with status 7; stopped the other ranks" <<<"$out" &&
   [ -z "$left" ] && [ "$(ls "$D"/sleep.* | wc -l)" -eq 2 ]; then
    ok failing_rank_stops_the_others
else
    bad failing_rank_stops_the_others "status $rc (expected 7) after $(awk "BEGIN{print $t1 - $t0}") s; left running:${left:- none}; output:" "$out"
fi

D=$TMP/kill; mkdir -p "$D"
out=$("$DDPRUN" --nproc-per-node 2 sh -c 'if [ $RANK = 0 ]; then while [ ! -e "$D/sleep.1" ]; do sleep 0.05; done; kill -9 $$; fi; '"$SLEEPER" 2>&1); rc=$?
left=$(still_alive "$D/pid.")$(still_alive "$D/sleep.")
if [ $rc -eq 137 ] && grep -q "rank 0 (pid [0-9]*) was killed by signal 9 (SIGKILL)" <<<"$out" && [ -z "$left" ]; then
    ok killed_rank_gives_137
else
    bad killed_rank_gives_137 "status $rc (expected 137); left running:${left:- none}; output:" "$out"
fi

# Two ranks that end while ddprun cannot look (it is stopped): rank 1 killed by SIGKILL, then rank 0
# exiting with an error, as a survivor does on losing its peer. ddprun reaps both in one step and
# must name the killed rank as the cause, not the lower rank's reaction.
D=$TMP/both; mkdir -p "$D"
"$DDPRUN" --nproc-per-node 2 sh -c 'echo $$ > "$D/pid.$RANK"; while [ ! -e "$D/go" ]; do sleep 0.02; done
    if [ $RANK = 1 ]; then : > "$D/dying"; kill -9 $$; fi
    while [ ! -e "$D/dying" ]; do sleep 0.02; done; sleep 0.2; : > "$D/exiting"; exit 1' >"$TMP/o" 2>&1 &
lpid=$!
if wait_files 2 "$D/pid."; then
    kill -STOP $lpid
    : >"$D/go"
    wait_files 1 "$D/exiting"; sleep 0.3
    kill -CONT $lpid
    wait $lpid; rc=$?
    if [ $rc -eq 137 ] && grep -q "^ddprun: rank 1 (pid [0-9]*) was killed by signal 9 (SIGKILL)" "$TMP/o"; then
        ok same_step_failures_name_the_killed_rank
    else bad same_step_failures_name_the_killed_rank "status $rc (expected 137, rank 1's SIGKILL); output:" "$(cat "$TMP/o")"; fi
else
    kill -KILL $lpid 2>/dev/null; wait $lpid 2>/dev/null
    bad same_step_failures_name_the_killed_rank "the ranks never started"
fi

D=$TMP/term; mkdir -p "$D"
"$DDPRUN" --nproc-per-node 2 sh -c "$SLEEPER" >"$TMP/o" 2>&1 &
lpid=$!
if wait_files 2 "$D/sleep."; then
    t0=$(now)
    kill -TERM $lpid
    wait $lpid; rc=$?
    t1=$(now)
    left=$(still_alive "$D/pid.")$(still_alive "$D/sleep.")
    if [ $rc -ne 0 ] && elapsed_below "$t0" "$t1" 5 && [ -z "$left" ] && grep -q "received SIGTERM" "$TMP/o"; then
        ok sigterm_stops_every_rank
    else
        bad sigterm_stops_every_rank "status $rc; left running:${left:- none}; output:" "$(cat "$TMP/o")"
    fi
else
    kill -KILL $lpid 2>/dev/null; wait $lpid 2>/dev/null
    bad sigterm_stops_every_rank "the ranks never started; output:" "$(cat "$TMP/o")"
fi

# ddprun killed by SIGKILL (it can pass nothing on) while rank 1 is stopped (SIGSTOP) and rank 0
# ignores SIGTERM: no rank, and nothing a rank started, may outlive it. A stopped process acts on no
# SIGTERM until continued; a rank that ignores SIGTERM is what every rank is where the system has
# no parent-death signal (Linux's PR_SET_PDEATHSIG sends SIGTERM).
D=$TMP/orphan; mkdir -p "$D"
"$DDPRUN" --nproc-per-node 2 sh -c 'if [ $RANK = 0 ]; then trap "" TERM; fi; '"$SLEEPER" >"$TMP/o" 2>&1 &
lpid=$!
if wait_files 2 "$D/sleep."; then
    kill -STOP "$(cat "$D/pid.1")"
    kill -KILL $lpid
    wait $lpid 2>/dev/null
    for i in $(seq 200); do   # at most 10 s: DDP_KILL_GRACE_S=1 between SIGTERM and SIGKILL
        left=""
        for f in "$D"/pid.* "$D"/sleep.*; do p=$(cat "$f"); running "$p" && left="$left $p"; done
        [ -z "$left" ] && break
        sleep 0.05
    done
    if [ -z "$left" ]; then ok killed_ddprun_leaves_no_rank_even_stopped
    else
        bad killed_ddprun_leaves_no_rank_even_stopped "still running 10 s after ddprun was killed:$left" \
            "$(command -v ps >/dev/null && ps -o pid,stat,ppid,cmd -p "$(tr ' ' ',' <<<"${left# }")" 2>&1)"
        for p in $left; do kill -KILL "$p" 2>/dev/null; done
    fi
else
    kill -KILL $lpid 2>/dev/null; wait $lpid 2>/dev/null
    bad killed_ddprun_leaves_no_rank_even_stopped "the ranks never started; output:" "$(cat "$TMP/o")"
fi

D=$TMP/ign; mkdir -p "$D"
t0=$(now)
out=$("$DDPRUN" --nproc-per-node 2 sh -c 'if [ $RANK = 0 ]; then while [ ! -e "$D/pid.1" ]; do sleep 0.05; done; exit 3; fi
        trap "" TERM; echo $$ > "$D/pid.1"; while :; do sleep 0.1; done' 2>&1); rc=$?
t1=$(now)
left=$(still_alive "$D/pid.")
if [ $rc -eq 3 ] && elapsed_below "$t0" "$t1" 5 && elapsed_over "$t0" "$t1" 0.9 && [ -z "$left" ]; then
    ok sigterm_ignored_gets_sigkill
else
    bad sigterm_ignored_gets_sigkill "status $rc (expected 3) after $(awk "BEGIN{print $t1 - $t0}") s (expected about 1 s); left running:${left:- none}" "$out"
fi

# ---- restarts ------------------------------------------------------------------------------------------
# rank 1 fails on its first two starts: --max-restarts 3 restarts the whole job twice, each rank
# sees its restart count, and the third start succeeds. Rank 1 fails only after rank 0 has printed
# (a marker file per start): otherwise ddprun may stop rank 0 before its line, as it should.
R=$TMP/restarts; mkdir -p "$R"
out=$(R=$R "$DDPRUN" --standalone --nproc-per-node 2 --max-restarts 3 sh -c \
      'echo "start $DDP_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT"; [ "$RANK" = 0 ] && : > "$R/printed.$DDP_RESTART_COUNT"
       if [ "$RANK" = 1 ] && [ "$DDP_RESTART_COUNT" -lt 2 ]; then
           while [ ! -e "$R/printed.$DDP_RESTART_COUNT" ]; do sleep 0.02; done; exit 7; fi' 2>&1); rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c 'start 2 2' <<<"$out")" -eq 2 ] && [ "$(grep -c 'start 0 0' <<<"$out")" -eq 2 ] &&
   grep -q "rank 1 (pid [0-9]*) exited with status 7; stopped the other ranks; restarting the job (restart 2 of 3)" <<<"$out"; then
    ok restarts_until_success
else bad restarts_until_success "status $rc:" "$out"; fi

# always failing: gives up after the last restart, lists every attempt, marks the first as the
# root cause, and exits with the failing rank's status
out=$("$DDPRUN" --standalone --nproc-per-node 2 --max-restarts 2 sh -c 'if [ "$RANK" = 1 ]; then exit 5; fi; sleep 10' 2>&1); rc=$?
if [ $rc -eq 5 ] && grep -q "giving up: the job failed 3 times (--max-restarts 2)" <<<"$out" &&
   grep -q "attempt 1 (DDP_RESTART_COUNT=0), [0-9:]*: rank 1 (pid [0-9]*) exited with status 5  <- root cause" <<<"$out" &&
   grep -q "attempt 3 (DDP_RESTART_COUNT=2)" <<<"$out" && grep -q "exiting with rank 1's status 5" <<<"$out"; then
    ok restarts_give_up_with_summary
else bad restarts_give_up_with_summary "status $rc:" "$out"; fi

# a rank killed by a signal is restarted too; a program that cannot be run is not (it never would)
out=$("$DDPRUN" --nproc-per-node 1 --max-restarts 1 sh -c 'if [ "$DDP_RESTART_COUNT" = 0 ]; then kill -9 $$; fi; echo resumed' 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "killed by signal 9 (SIGKILL); stopped the other ranks; restarting" <<<"$out" && grep -q resumed <<<"$out"; then
    ok restart_after_sigkill
else bad restart_after_sigkill "status $rc:" "$out"; fi
out=$("$DDPRUN" --nproc-per-node 1 --max-restarts 3 "$TMP/no-such-program" 2>&1); rc=$?
if [ $rc -eq 127 ] && ! grep -q restarting <<<"$out"; then ok no_restart_when_program_missing
else bad no_restart_when_program_missing "status $rc:" "$out"; fi

# without --max-restarts a failure ends the job, and the message says how to ask for restarts
out=$("$DDPRUN" --nproc-per-node 1 sh -c 'exit 3' 2>&1); rc=$?
if [ $rc -eq 3 ] && grep -q "no restart (--max-restarts 0)" <<<"$out"; then ok no_restart_by_default
else bad no_restart_by_default "status $rc:" "$out"; fi

# ---- bad command lines ----------------------------------------------------------------------------------
expect_usage_error() {  # name, text the message must contain, args...
    local name=$1 want=$2 out rc; shift 2
    out=$("$DDPRUN" "$@" 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$want" <<<"$out"; then ok "$name"
    else bad "$name" "expected status 2 and \"$want\"; got status $rc:" "$out"; fi
}
expect_usage_error bad_flag_nproc_zero "--nproc-per-node" --nproc-per-node 0 true
expect_usage_error bad_flag_nproc_text "--nproc-per-node" --nproc-per-node x true
expect_usage_error bad_flag_standalone_nnodes "--standalone" --standalone --nnodes 2 true
expect_usage_error bad_flag_node_rank "--node-rank" --node-rank 2 --nnodes 2 true
expect_usage_error bad_flag_no_program "no program" --nproc-per-node 2
expect_usage_error bad_flag_unknown "--frobnicate" --frobnicate true
expect_usage_error bad_flag_backend "--backend" --backend gloo true
expect_usage_error bad_flag_backend_mpi "run the program with mpirun instead" --backend mpi true
expect_usage_error bad_flag_missing_value "--master-port needs a value" --master-port

out=$("$DDPRUN" --help 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q -- "--nproc-per-node" <<<"$out"; then ok help_exits_0
else bad help_exits_0 "status $rc:" "$out"; fi

out=$("$DDPRUN" --nproc-per-node 2 "$TMP/no-such-program" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "cannot run $TMP/no-such-program: No such file or directory" <<<"$out"; then
    ok missing_program_is_clear
else
    bad missing_program_is_clear "status $rc; output:" "$out"
fi

[ $fail -eq 0 ]
