#!/usr/bin/env bash
# tests/multiproc/test_confusions.sh: the mistakes learners make with DDP (items 1-15 of the list behind
# TUTORIAL.md's callouts), each provoked the way a student meets it: a real job with real processes
# and sockets on 127.0.0.1, started by build/ddprun or by hand with the launcher's variables, running
# the examples or tests/multiproc/confusions/confusions.c (small training programs with the mistake in them).
#   bash tests/multiproc/test_confusions.sh BUILD_DIR        (BUILD_DIR defaults to build)
# Every case asserts what the program says (the exact message: its cause and its fix), its exit
# status, and that it ends within a time bound: where something waits, DDP_TIMEOUT is a few seconds
# and the bound is well below what a hang would take. Each case prints "ok   name", "FAIL name" (then
# indented details) or "skip name: reason", as tests/run.sh counts them, and under an ok the message
# it checked. The cases that wait out a deadline run in the background alongside the others.
#
# Not here: item 2 (the tutorial's commands drifting from the code) is the docs test's
# (tools/docs.py); different models on different ranks is test_bad_input.sh's models_differ; a
# collective inside if (rank == 0) in the middle of training is run.sh's
# ch09_collective_on_one_rank_caught; MASTER_PORT held by a program that is not a ddp.h store is
# test_bad_input.sh's port_held_by_* cases.
set -u
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
cd "$(dirname "$0")/../.." || exit 1   # the programs find the bundled data from the top folder
. tests/multiproc/proc_cases.sh

C=$BUILD/tests/confusions/confusions
DDPRUN=$BUILD/ddprun
EX03=$BUILD/examples/ch04_multi_node
EX04=$BUILD/examples/ch06_fault_tolerance
for f in "$C" "$DDPRUN" "$EX03" "$EX04"; do
    if [ ! -x "$f" ]; then bad confusions_built "$f is not an executable (run make first, or pass the build folder)"; exit 1; fi
done
HAVE_PY=0; command -v python3 >/dev/null 2>&1 && HAVE_PY=1


# ---- judging a run -----------------------------------------------------------------------------
# check_begin TAG: judge the run whose files are $TMP/TAG.{out,err} (RC, T0, T1 from run_fg or
# finish_async); the need_* calls add problems; check_end NAME prints the verdict and, under an ok,
# the message (MSG, the first line checked with need_line, unless the case sets it).
check_begin() { CTAG=$1; WHY=(); MSG=""; }
need_rc() {  # nonzero | N   (124, and 137 unless N is 137, are `timeout` stopping a hung run)
    if [ "$RC" -eq 124 ] || { [ "$RC" -eq 137 ] && [ "$1" != 137 ]; }; then WHY+=("killed by timeout: it hung")
    elif [ "$1" = nonzero ]; then [ "$RC" -ne 0 ] || WHY+=("exit status 0, want non-zero")
    elif [ "$RC" -ne "$1" ]; then WHY+=("exit status $RC, want $1"); fi
}
need_time() {  # LO HI: the run took between LO and HI seconds
    local el
    el=$(awk "BEGIN{printf \"%.1f\", $T1 - $T0}")
    awk "BEGIN{exit !($el < $1 - $COMPAT_SLACK)}" && WHY+=("ended after $el s, before $1 s")
    awk "BEGIN{exit !($el > $2 + $COMPAT_SLACK)}" && WHY+=("took $el s, over the bound of $2 s")
    ELAPSED=$el
}
need_line() {  # out|err FIXED_STRING: a line of stdout or stderr contains it
    grep -qF -- "$2" "$TMP/$CTAG.$1" || WHY+=("std$1 has no line with: $2")
    [ -z "$MSG" ] && MSG=$2
}
need_re() {  # out|err EXTENDED_REGEX
    grep -qE -- "$2" "$TMP/$CTAG.$1" || WHY+=("std$1 has no line matching /$2/")
}
need_no_line() {  # out|err FIXED_STRING
    grep -qF -- "$2" "$TMP/$CTAG.$1" && WHY+=("std$1 has a line it must not have: $(grep -m1 -F -- "$2" "$TMP/$CTAG.$1" | cut -c1-300)")
}
need_count() {  # out|err FIXED_STRING N: exactly N lines contain it
    local n
    n=$(grep -cF -- "$2" "$TMP/$CTAG.$1")
    [ "$n" -eq "$3" ] || WHY+=("std$1 has $n lines with \"$2\", want $3")
}
check_end() {  # NAME [NOTE]
    local tail_lines=()
    if [ ${#WHY[@]} -eq 0 ]; then
        ok "$1${2:+ ($2)}"
        [ -n "$MSG" ] && echo "    message: $MSG"
    else
        read_lines tail_lines < <(tail -n 6 "$TMP/$CTAG.err" | cut -c1-400)
        bad "$1" "${WHY[@]}" "(status $RC after $(awk "BEGIN{printf \"%.1f\", $T1 - $T0}") s; the end of its stderr:)" \
            ${tail_lines[@]+"${tail_lines[@]}"}
    fi
}

# ---- started now, judged in their place below: the cases that wait out a deadline -----------------

# 1: MASTER_ADDR names a host that does not resolve (a typo, or "localhost" copied into a container
# whose resolver has no such name). ".invalid" never resolves (RFC 2606).
free_port P_NAME
run_async addr_unresolved 20 RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=$P_NAME \
    DDP_TIMEOUT=2 -- "$C" eval
# 9: node 1's ddprun is started, node 0's is not (or listens on another port): nothing answers at
# the master's address and port. 127.0.0.1 only: no external address is ever used.
free_port P_NOBODY
run_async nobody_listens 20 DDP_JOB_TOKEN=confusions DDP_TIMEOUT=2 -- "$DDPRUN" --nnodes 2 --node-rank 1 \
    --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $P_NOBODY "$C" eval
# 8 without a launcher: rank 0's shard is a batch short and it reaches ddp_destroy first; nobody stops
# it, so it waits there for rank 1, whose process ends on the desync and says so on its way out.
# Then the same, with rank 0 failing a DDP_CHECK after its last batch: nobody stops rank 1 either.
free_port P_UNEVEN
free_port P_FAILED
for r in 0 1; do
    run_async uneven_rank$r 20 RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P_UNEVEN DDP_TIMEOUT=2 -- "$C" uneven --no-log
    run_async failed_rank$r 20 RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P_FAILED DDP_TIMEOUT=2 -- \
        "$C" uneven --no-log --fail-at-end
done
# WORLD_SIZE larger than the processes started: a hand-written launch loop that starts 2 of 3.
free_port P_WORLD
for r in 0 1; do
    run_async world_rank$r 30 RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P_WORLD DDP_TIMEOUT=6 -- "$C" eval
done

# ---- 1: the master's address ---------------------------------------------------------------------
# localhost may resolve to ::1 first (PyTorch's "errno 99" in containers): every address it resolves
# to is tried, so a job with --master-addr localhost runs.
# (A system without a localhost line in /etc/hosts, a bare chroot say, cannot run it: ddp.h's answer
# there, a warning and retries until DDP_TIMEOUT, is the case of a name that does not resolve, next.)
if command -v getent >/dev/null 2>&1 && ! getent hosts localhost >/dev/null 2>&1; then
    skp confusion01_master_addr_localhost_works "this system does not resolve the name localhost (/etc/hosts has no localhost line)"
else
    free_port P
    run_fg localhost 40 -- "$DDPRUN" --master-addr localhost --master-port $P --nproc-per-node 2 "$C" eval
    check_begin localhost
    need_rc 0; need_time 0 30
    need_line out "[rank 0]: 10 samples on 2 ranks: counted naively 10, without ddp_sampler_padding 10"
    check_end confusion01_master_addr_localhost_works
fi

finish_async addr_unresolved
check_begin addr_unresolved
need_rc nonzero; need_time 1.5 15
need_re err "^\[rank 1/2\] warning: the rendezvous host \"no-such-host\.invalid\" \(MASTER_ADDR\) does not resolve to an address: .+\. Retrying until DDP_TIMEOUT \(2 s\); set MASTER_ADDR to rank 0's IP address, or to a name every machine resolves \(127\.0\.0\.1 when all ranks run here\)$"
need_count err "does not resolve to an address" 1
need_re err "DDP_ERR_STORE_UNREACHABLE: no rendezvous store answered at no-such-host\.invalid:$P_NAME within 2 s \(last error: the host name \"no-such-host\.invalid\" does not resolve: .+\)\. Set MASTER_ADDR to rank 0's IP address, or to a name every machine resolves \(127\.0\.0\.1 when all ranks run here\)$"
MSG=$(grep -m1 'DDP_ERR_STORE_UNREACHABLE' "$TMP/addr_unresolved.err" | sed 's/^[[:space:]]*//')
check_end confusion01_master_addr_does_not_resolve

# ---- 3: ddp_sampler_set_epoch never called -------------------------------------------------------
run_fg no_set_epoch 40 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" epochs --no-set-epoch --epochs 3
check_begin no_set_epoch
need_rc 0; need_time 0 30
SET_EPOCH_WARNING="warning: ddp_loader_start: the sampler's epoch is 0 again, as at this loader's previous start, so this epoch visits the samples in the same order as the last one. Call ddp_sampler_set_epoch(&sampler, epoch) before each ddp_loader_start (PyTorch: sampler.set_epoch(epoch)). Printed once per process"
need_line err "[rank 0]: $SET_EPOCH_WARNING"
need_line err "[rank 1]: $SET_EPOCH_WARNING"
need_count err "ddp_loader_start: the sampler's epoch" 2   # once per process, not once per epoch
orders=$(sed -n 's/^\[rank 0\]: epoch [0-9] order: //p' "$TMP/no_set_epoch.out" | sort -u | wc -l)
[ "$orders" -eq 1 ] || WHY+=("the 3 epochs' orders are not all the same ($orders distinct): the case no longer shows the mistake")
check_end confusion03_set_epoch_never_called

# the right loop, with a resume in the middle of epoch 2 (as a restarted job does): no warning
run_fg set_epoch 40 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" epochs --epochs 3 --resume --snapshot "$TMP/resume.st"
check_begin set_epoch
need_rc 0; need_time 0 30
need_no_line err "ddp_loader_start:"
need_line out "[rank 0]: resumed epoch 2 from $TMP/resume.st"
need_line out "[rank 0]: replicas identical: yes"
orders=$(sed -n 's/^\[rank 0\]: epoch \([0-9]\) order: /\1 /p' "$TMP/set_epoch.out")
[ "$(wc -l <<<"$orders")" -eq 4 ] && [ "$(cut -d' ' -f2- <<<"$orders" | sort -u | wc -l)" -eq 3 ] &&
    [ "$(grep -c '^2 ' <<<"$orders")" -eq 2 ] && [ "$(grep '^2 ' <<<"$orders" | sort -u | wc -l)" -eq 1 ] ||
    WHY+=("want epochs 1, 2, 2 (resumed), 3 with three different orders, the resumed epoch's the same as before: $(tr '\n' ';' <<<"$orders")")
MSG="(no warning; each epoch a new order; the resumed epoch 2 repeats its order without a warning)"
check_end confusion03_set_epoch_called_and_resumed_epoch_no_warning

# ---- 4-5: RANK used as the GPU number ---------------------------------------------------------------
# Node 63 of 64, one rank each: RANK=63, LOCAL_RANK=0, and the program asks for cuda:RANK. Past any
# machine's GPUs, so on a GPU machine this is the real "invalid device ordinal"; here the build or
# the machine has no GPU at all, and the warning names the cause either way.
free_port P
run_fg device_rank 30 DDP_JOB_TOKEN=confusions DDP_TIMEOUT=2 -- "$DDPRUN" --nnodes 64 --node-rank 63 --nproc-per-node 1 \
    --master-addr 127.0.0.1 --master-port $P "$C" device_rank
check_begin device_rank
need_rc nonzero; need_time 0 10
need_line err "[rank 63]: warning: device cuda:63 is this process's RANK, but a GPU is picked by LOCAL_RANK (0 here): RANK counts the ranks of every machine, so from the second machine on it points past this machine's GPUs. Use cuda:LOCAL_RANK, or \"cuda\", which picks this rank's GPU"
need_re err "DDP_ERR_(NOT_BUILT|NO_GPU): device cuda:63 was asked for, but "
GPUS=0
command -v nvidia-smi >/dev/null 2>&1 && GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${HAVE_CUDA:-0}" = 1 ] && [ "$GPUS" -gt 0 ]; then
    need_line err "DDP_ERR_NO_GPU: device cuda:63 was asked for, but only $GPUS GPU$([ "$GPUS" = 1 ] && echo " is" || echo "s are") visible (0..$((GPUS - 1))): pick the GPU with LOCAL_RANK, not RANK, and check CUDA_VISIBLE_DEVICES"
fi
check_end confusion05_rank_used_as_gpu_index
if [ "${HAVE_CUDA:-0}" != 1 ] || [ "$GPUS" -eq 0 ]; then
    skp confusion05_gpu_index_past_the_gpus_on_a_gpu "no GPU here (or a CPU-only build): the \"only N GPUs are visible\" error needs one; confusion05_gpu_index_message checks its text"
fi

# the error itself, built without a GPU (the function ddp_device_resolve calls)
run_fg gpu_message 20 -- "$C" gpu_message
check_begin gpu_message
need_rc 0; need_time 0 10
need_line out "DDP_ERR_NO_GPU: device cuda:3 was asked for, but only 2 GPUs are visible (0..1): pick the GPU with LOCAL_RANK, not RANK, and check CUDA_VISIBLE_DEVICES"
need_line out "DDP_ERR_NO_GPU: device cuda:1 was asked for, but only 1 GPU is visible (0..0): pick the GPU with LOCAL_RANK, not RANK, and check CUDA_VISIBLE_DEVICES"
check_end confusion05_gpu_index_message

# ---- 6: a second job on the port of a running one ---------------------------------------------------
# Job A trains; job B is started with the same --master-port (a copied command line, or a stale job
# still running). B must stop at once with the cause; A must go on.
free_port P
run_bg job_a 60 -- "$DDPRUN" --nproc-per-node 1 --master-port $P "$EX03" --device cpu --epochs 1000000 --save-every 0
A=$BG
if wait_port $P 20; then
    run_fg job_b 30 -- "$DDPRUN" --nproc-per-node 1 --master-port $P "$C" eval
    check_begin job_b
    need_rc nonzero; need_time 0 10
    need_line err "DDP_ERR_PORT_IN_USE: the rendezvous store cannot listen on port $P: it is already in use (another job or program holds it; \`ss -ltnp | grep :$P\` shows which). Pick another MASTER_PORT, or let ddprun --standalone choose a free one"
    kill -0 $A 2>/dev/null || WHY+=("job A stopped when job B failed: $(tail -n 2 "$TMP/job_a.err")")
    check_end confusion06_second_job_on_a_used_port
else
    bad confusion06_second_job_on_a_used_port "job A never listened on $P:" "$(tail -n 3 "$TMP/job_a.err")"
fi
kill -TERM $A 2>/dev/null; wait $A 2>/dev/null

# ---- 7: a collective on one rank only, at the very end --------------------------------------------
# (One in the middle of training is run.sh's ch09_collective_on_one_rank_caught.) Rank 0 calls
# ddp_barrier after "saving a checkpoint"; rank 1 has gone on to ddp_destroy. DDP_TIMEOUT=20: the
# answer must come at once, not after a deadline.
run_fg barrier 40 DDP_TIMEOUT=20 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" barrier
check_begin barrier
need_rc nonzero; need_time 0 10
need_line err "[rank 0]:   DDP_ERR_DESYNC: desync: rank 1 has left the job (it called ddp_destroy after 7 collectives), but this rank (0) calls all_reduce #8 (1 x f32, sum). The ranks ran different numbers of collectives: one rank had more batches than another (give every rank the same number; ddp_sampler pads for this), a rank called ddp_join before its last batch, or a collective runs on some ranks only (inside an if on the rank)"
need_line err "[rank 0]: error: ddp_barrier(j.pg) failed"
check_end confusion07_collective_on_rank0_only_at_exit

# ---- 8: uneven inputs: rank 1's shard has one batch more ---------------------------------------------
# (a) after the loop each rank all-reduces its loss for the log: rank 0's 1-float all-reduce meets
# rank 1's fifth gradient bucket. (b) rank 0 goes straight to ddp_destroy while rank 1 still trains.
# DDP_TIMEOUT=60 and a bound of 30 s: the desync is named at once, not at a deadline (a sanitizer
# build on a busy machine took 15 s)
run_fg uneven_log 90 DDP_TIMEOUT=60 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" uneven
check_begin uneven_log
need_rc nonzero; need_time 0 30
UNEVEN0="DDP_ERR_DESYNC: desync: this rank (0) calls all_reduce #9 (1 x f32, sum), but rank 1 calls all_reduce #9 (1091 x f32, sum). Every rank must call the same collectives in the same order with the same sizes: look for a collective inside an if on the rank"
UNEVEN1="DDP_ERR_DESYNC: desync: this rank (1) calls all_reduce #9 (1091 x f32, sum), but rank 0 calls all_reduce #9 (1 x f32, sum). Every rank must call the same collectives in the same order with the same sizes: look for a collective inside an if on the rank"
# both ranks see it at once; ddprun may stop one before it prints
grep -qF -- "$UNEVEN0" "$TMP/uneven_log.err" || grep -qF -- "$UNEVEN1" "$TMP/uneven_log.err" ||
    WHY+=("neither rank printed the desync: want \"$UNEVEN0\" or rank 1's mirror of it")
need_line err "fix: every rank must call the same collectives in the same order with the same sizes: look for one inside an if on the rank, or a loop whose length differs between ranks"
MSG=$UNEVEN0
check_end confusion08_uneven_batches_then_a_logging_all_reduce

run_fg uneven_exit 40 DDP_TIMEOUT=20 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" uneven --no-log
check_begin uneven_exit
need_rc nonzero; need_time 0 10
need_line err "[rank 1]:   DDP_ERR_DESYNC: desync: rank 0 has left the job (it called ddp_destroy after 8 collectives), but this rank (1) calls all_reduce #9 (1091 x f32, sum). The ranks ran different numbers of collectives: one rank had more batches than another (give every rank the same number; ddp_sampler pads for this), a rank called ddp_join before its last batch, or a collective runs on some ranks only (inside an if on the rank)"
check_end confusion08_uneven_batches_one_rank_finishes_first

# the same, but rank 0's program returns from main without ddp_destroy: its exit tells rank 1 so
run_fg uneven_no_destroy 40 DDP_TIMEOUT=20 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" uneven --no-log --no-destroy
check_begin uneven_no_destroy
need_rc nonzero; need_time 0 10
need_line err "[rank 1]:   DDP_ERR_DESYNC: desync: rank 0 has left the job (its process ended without calling ddp_destroy after 8 collectives), but this rank (1) calls all_reduce #9 (1091 x f32, sum)."
check_end confusion08_uneven_batches_one_rank_ends_without_ddp_destroy

finish_async uneven_rank1
RC1=$RC
finish_async uneven_rank0
check_begin uneven_rank0
need_rc 0; need_time 0 15
need_line err "[rank 0/2] warning: ddp_destroy: 1 of the 2 ranks ended their process without calling ddp_destroy (after a failure, or a program that returns from main without it): see their output"
[ "$RC1" -eq 1 ] && grep -qF "[rank 1/2]   DDP_ERR_DESYNC: desync: rank 0 has left the job (it called ddp_destroy after 8 collectives)" \
    "$TMP/uneven_rank1.err" || WHY+=("rank 1 (status $RC1) did not report that rank 0 left: $(tail -n 2 "$TMP/uneven_rank1.err")")
check_end confusion08_uneven_batches_without_a_launcher

finish_async failed_rank0
RC0=$RC
finish_async failed_rank1
check_begin failed_rank1
need_rc 1; need_time 0 15
need_line err "[rank 1/2]   DDP_ERR_PEER_LOST: all_reduce #9 (1091 x f32, sum): rank 0 failed and has left the job (a DDP_CHECK failed there, after 8 collectives): its output says which call and why"
[ "$RC0" -eq 1 ] && grep -qF "[rank 0/2] error: ddp_snapshot_save(&snap, \"no-such-folder/snapshot.safetensors\") failed" \
    "$TMP/failed_rank0.err" || WHY+=("rank 0 (status $RC0) did not fail its DDP_CHECK: $(tail -n 2 "$TMP/failed_rank0.err")")
check_end confusion08_one_rank_fails_a_ddp_check_the_other_is_told

# ---- 9: nothing listens at MASTER_ADDR:MASTER_PORT ---------------------------------------------------
finish_async nobody_listens
check_begin nobody_listens
need_rc nonzero; need_time 1.5 15
need_line err "[rank 1]:   DDP_ERR_STORE_UNREACHABLE: no rendezvous store answered at 127.0.0.1:$P_NOBODY within 2 s (last error: Connection refused). Is rank 0 running, and do all ranks use the same MASTER_ADDR and MASTER_PORT?"
check_end confusion09_master_not_listening

# ---- 10: srun x ddprun: every srun task starts its own ddprun ------------------------------------------
# SLURM need not run: these are the variables srun gives each task of
#   srun --nodes=1 --ntasks-per-node=2 ddprun --standalone --nproc-per-node 4 PROGRAM   (8 processes)
SRUN_TASK=(SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NUM_NODES=1
           SLURM_STEP_TASKS_PER_NODE=2 SLURM_TASKS_PER_NODE=2 SLURM_NODEID=0 SLURM_JOB_NODELIST=node1)
run_fg srun_tasks 20 "${SRUN_TASK[@]}" SLURM_PROCID=1 SLURM_LOCALID=1 -- "$DDPRUN" --standalone --nproc-per-node 4 "$C" eval
check_begin srun_tasks
need_rc 2; need_time 0 10
need_line err "ddprun: srun started 2 tasks on this node (SLURM_STEP_TASKS_PER_NODE=2; this is SLURM_LOCALID=1), each running its own ddprun with --nproc-per-node 4: 8 processes instead of 4. Start one ddprun per node (srun --ntasks-per-node=1 ddprun ...), or let srun start the ranks without ddprun (srun --ntasks-per-node=4 PROGRAM)"
need_no_line err "[rank "   # refused before any rank started
check_end confusion10_srun_tasks_times_ddprun_ranks

# one task per node on 2 nodes, but ddprun without --nnodes: two separate jobs
run_fg srun_nodes 20 SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NUM_NODES=2 \
    "SLURM_STEP_TASKS_PER_NODE=1(x2)" SLURM_NODEID=1 SLURM_PROCID=1 SLURM_LOCALID=0 -- \
    "$DDPRUN" --standalone --nproc-per-node 4 "$C" eval
check_begin srun_nodes
need_rc 2; need_time 0 10
need_line err "ddprun: srun runs this step on 2 nodes (SLURM_STEP_NUM_NODES=2), but ddprun has --nnodes 1: each node would train a separate job of its own. Give every node's ddprun --nnodes 2 --node-rank \$SLURM_NODEID, the same --master-addr (the first host of SLURM_JOB_NODELIST) and the same DDP_JOB_TOKEN"
check_end confusion10_srun_nodes_without_nnodes

# the batch script itself (no srun: no SLURM_STEP_* variables) may run ddprun, whatever it asked for
run_fg sbatch_ok 30 SLURM_JOB_ID=4242 SLURM_NTASKS=8 SLURM_NTASKS_PER_NODE=8 SLURM_TASKS_PER_NODE=8 SLURM_PROCID=0 \
    SLURM_LOCALID=0 SLURM_NODEID=0 -- "$DDPRUN" --standalone --nproc-per-node 2 sh -c 'echo "rank $RANK of $WORLD_SIZE"'
check_begin sbatch_ok
need_rc 0; need_time 0 10
need_line out "[rank 1]: rank 1 of 2"
MSG="(runs: the batch step has no SLURM_STEP_* variables)"
check_end confusion10_ddprun_in_a_batch_script_runs

# ---- 11: "fault tolerance" that does not restart ------------------------------------------------------
# The chapter-6 program under ddprun without --max-restarts; rank 1 is killed once training runs.
# Each rank of these jobs writes its pid to $TMP/TAG.rank.R before it becomes the program (no
# /proc/PID/environ to read RANK from on macOS).
RANK_PID='echo $$ > "$0.$RANK"; exec "$@"'
kill_rank1_when_training() {  # TAG (of a run_bg ddprun job): kill -9 rank 1 after its first epoch
    wait_line "$TMP/$1.out" 30 "epoch +1/" || return 1
    KILLED=$(cat "$TMP/$1.rank.1" 2>/dev/null) && [ -n "$KILLED" ] && kill -9 "$KILLED"
}
run_bg no_restart 90 DDP_TIMEOUT=60 -- "$DDPRUN" --standalone --nproc-per-node 2 sh -c "$RANK_PID" "$TMP/no_restart.rank" \
    "$EX04" --device cpu --epochs 100000 --save-every 0 --snapshot "$TMP/ft0.st"
if kill_rank1_when_training no_restart; then
    T0=$(now); wait $BG; RC=$?; T1=$(now)
    check_begin no_restart
    need_rc 137; need_time 0 30  # at once, not after DDP_TIMEOUT (60 s); 10 s was once too tight on a busy machine
    need_line err "ddprun: rank 1 (pid $KILLED) was killed by signal 9 (SIGKILL); stopped the other ranks"
    need_line err "ddprun: no restart (--max-restarts 0): start ddprun with --max-restarts N to restart the job after a failure"
    MSG="ddprun: no restart (--max-restarts 0): start ddprun with --max-restarts N to restart the job after a failure"
    check_end confusion11_no_restart_without_max_restarts
else
    bad confusion11_no_restart_without_max_restarts "rank 1 never started training, or could not be killed:" "$(tail -n 3 "$TMP/no_restart.err")"
fi
kill -TERM $BG 2>/dev/null; wait $BG 2>/dev/null

# the same with --max-restarts 1: the job restarts, resumes from its snapshot and finishes, and the
# resumed epoch is no missing set_epoch. A simulated slow network (5 ms per all-reduce) keeps the 100
# epochs from ending before the kill.
run_bg restart 90 DDP_TIMEOUT=20 DDP_SIMULATE_NS_PER_BYTE=1000 -- "$DDPRUN" --standalone --nproc-per-node 2 \
    --max-restarts 1 sh -c "$RANK_PID" "$TMP/restart.rank" "$EX04" --device cpu --epochs 100 --save-every 5 --snapshot "$TMP/ft1.st"
if kill_rank1_when_training restart; then
    T0=$(now); wait $BG; RC=$?; T1=$(now)
    check_begin restart
    need_rc 0; need_time 0 60
    need_line err "ddprun: rank 1 (pid $KILLED) was killed by signal 9 (SIGKILL); stopped the other ranks; restarting the job (restart 1 of 1)"
    need_line out "[rank 0]: test accuracy: "
    need_no_line err "ddp_loader_start:"
    check_end confusion11_max_restarts_resumes
else
    bad confusion11_max_restarts_resumes "rank 1 never started training, or could not be killed:" "$(tail -n 3 "$TMP/restart.err")"
fi
kill -TERM $BG 2>/dev/null; wait $BG 2>/dev/null

# ---- 12: evaluation through the distributed sampler counts the padding ---------------------------------
run_fg eval4 40 -- "$DDPRUN" --standalone --nproc-per-node 4 "$C" eval --samples 10
check_begin eval4
need_rc 0; need_time 0 30
need_line out "[rank 0]: 10 samples on 4 ranks: counted naively 12, without ddp_sampler_padding 10"
check_end confusion12_eval_padding_counted_twice

# ---- 13: a parameter whose gradient never reaches DDP --------------------------------------------------
run_fg freeze 40 DDP_TIMEOUT=20 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" freeze
check_begin freeze
need_rc nonzero; need_time 0 10
need_re err "^\[rank [01]\]:   DDP_ERR_UNUSED_PARAMETER: parameter fc1\.weight \(index 0\) received no gradient in this backward pass on rank [01], so its bucket can never be all-reduced\. Make every parameter take part in the loss, or set ddp_wrap_desc\.find_unused_parameters$"
need_line err "fix: make every parameter take part in the loss, or set find_unused_parameters"
MSG=$(grep -m1 -o 'DDP_ERR_UNUSED_PARAMETER: .*' "$TMP/freeze.err")
check_end confusion13_unused_parameter

run_fg find_unused 40 DDP_TIMEOUT=20 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" freeze --find-unused
check_begin find_unused
need_rc 0; need_time 0 30
need_line out "[rank 0]: trained 3 steps with fc1.weight left out"
check_end confusion13_find_unused_parameters_trains

# ---- 14: gradient accumulation and no_sync ---------------------------------------------------------------
# 3 optimizer steps of 4 micro-batches, 1 bucket: without no_sync 12 all-reduces, with it 3; the
# off-by-one (the first micro-batch synchronised, the last three not) also makes 3, but the replicas
# drift apart, and ddp_optim_step says so.
run_fg accum 40 DDP_TIMEOUT=20 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" accum --k 4 --sync every,last
check_begin accum
need_rc 0; need_time 0 30
need_line out "[rank 0]: sync every: 3 optimizer steps of 4 micro-batches: 12 all-reduces (1 bucket); replicas identical: yes"
need_line out "[rank 0]: sync last: 3 optimizer steps of 4 micro-batches: 3 all-reduces (1 bucket); replicas identical: yes"
need_no_line err "ddp_optim_step:"
check_end confusion14_no_sync_all_reduce_counts

run_fg accum_first 40 DDP_TIMEOUT=20 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" accum --k 4 --sync first
check_begin accum_first
need_rc 0; need_time 0 30
need_line err "[rank 0]: warning: ddp_optim_step: the last 3 backward passes ran under ddp_no_sync after the last all-reduce, so their gradients were never averaged across the ranks and the replicas now drift apart. Keep no_sync on for the first K-1 micro-batches and off for the last one: ddp_no_sync(w, k < K - 1) before each backward. Printed once per process"
need_count err "ddp_optim_step: the last" 2   # once per process (rank 0, rank 1), not once per step
need_line out "[rank 0]: sync first: 3 optimizer steps of 4 micro-batches: 3 all-reduces (1 bucket); replicas identical: no"
check_end confusion14_no_sync_off_by_one

# the same loop in one process: one replica cannot drift from another, so no warning
run_fg accum_alone 40 -- "$C" accum --k 4 --sync first
check_begin accum_alone
need_rc 0; need_time 0 30
need_line out "sync first: 3 optimizer steps of 4 micro-batches: 3 all-reduces (1 bucket); replicas identical: yes"
need_no_line err "ddp_optim_step:"
check_end confusion14_no_sync_one_process_no_warning

# ---- 15: "DDP is slower than one process" ------------------------------------------------------------
# Only what cannot flake is asserted: 2 ranks make 5 steps per epoch of the 142 samples where 1 rank
# makes 9 (batch 16 per rank). The times are printed, not judged: for this tiny model a step costs
# more with 2 ranks (the all-reduce), and the epoch is not faster.
free_port P
run_fg speed1 40 MASTER_PORT=$P -- "$C" speed --epochs 20
run_fg speed2 40 -- "$DDPRUN" --standalone --nproc-per-node 2 "$C" speed --epochs 20
s1=$(grep -o '1 rank: .*' "$TMP/speed1.out"); s2=$(grep -o '2 ranks: .*' "$TMP/speed2.out")
if grep -q "^1 rank: 9 steps per epoch" <<<"$s1" && grep -q "^2 ranks: 5 steps per epoch" <<<"$s2"; then
    ok "confusion15_step_time_vs_epoch_time (timings informative, not asserted)"
    echo "    message: $s1; $s2"
else
    bad confusion15_step_time_vs_epoch_time "want 9 steps per epoch for 1 rank and 5 for 2:" "${s1:-$(tail -n 2 "$TMP/speed1.err")}" \
        "${s2:-$(tail -n 2 "$TMP/speed2.err")}"
fi

# ---- a dead peer: survivors fail fast, naming it -----------------------------------------------------
# Two ranks started by hand (no launcher to stop the survivor); rank 1 is killed with SIGKILL while
# training. DDP_TIMEOUT=30: the survivor must notice at once, not after a deadline. (test_restart.sh
# kills rank 0, the store's host; this is a non-zero rank, and the message must name it.)
free_port P
run_bg peer0 60 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=30 -- "$EX03" --device cpu \
    --epochs 1000000 --save-every 0
B0=$BG
run_bg peer1 60 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P DDP_TIMEOUT=30 -- "$EX03" --device cpu \
    --epochs 1000000 --save-every 0
B1=$BG
if wait_line "$TMP/peer0.out" 30 "epoch +1/" && kill -9 "$(prog_pid peer1)" 2>/dev/null; then
    T0=$(now); wait $B1 2>/dev/null; wait $B0; RC=$?; T1=$(now)
    check_begin peer0
    need_rc nonzero; need_time 0 5
    need_re err "^\[rank 0/2\]   DDP_ERR_PEER_LOST: all_reduce #[0-9]+: (rank 1 closed its connection( at step [0-9]+)? \(end of stream\): that rank has probably died; look at its output|sending to rank 1 failed \(.*\): it has probably died)$"
    need_line err "fix: that rank died or its machine is unreachable: look at its output first"
    MSG=$(grep -m1 -o 'DDP_ERR_PEER_LOST: .*' "$TMP/peer0.err")
    check_end confusion_dead_peer_named
else
    bad confusion_dead_peer_named "the two ranks never trained, or rank 1 could not be killed:" "$(tail -n 3 "$TMP/peer0.err")"
fi
kill -TERM $B0 $B1 2>/dev/null; wait $B0 $B1 2>/dev/null

# ---- WORLD_SIZE larger than the processes started ----------------------------------------------------
# Rank 0 (the store's host) says which rank never came; rank 1 says the same, or, when rank 0 has
# given up first and taken the store with it, that the store is gone.
finish_async world_rank1
RC1=$RC
finish_async world_rank0
check_begin world_rank0
need_rc nonzero; need_time 5.5 20
need_line err "[rank 0/3]   DDP_ERR_TIMEOUT: rank 2 never joined within 6 s (this rank expects WORLD_SIZE=3): start all 3 processes, or fix WORLD_SIZE"
[ "$RC1" -ne 0 ] && [ "$RC1" -ne 124 ] && [ "$RC1" -ne 137 ] || WHY+=("rank 1 ended with status $RC1, want non-zero, not a timeout")
grep -qE "\[rank 1/3\]   (DDP_ERR_TIMEOUT: rank 2 never joined within 6 s|DDP_ERR_STORE_LOST: the rendezvous store at 127\.0\.0\.1:$P_WORLD closed the connection)" \
    "$TMP/world_rank1.err" || WHY+=("rank 1's stderr says neither that rank 2 never joined nor that the store closed: $(tail -n 2 "$TMP/world_rank1.err")")
check_end confusion_world_size_larger_than_started

# The same with the default DDP_TIMEOUT (300 s): rank 0 says within seconds who has joined and who is
# awaited, and a SIGTERM (what ddprun sends to stop a job) makes each rank say what it waited for.
# Rank 1 is stopped first and waited for: stopped together, rank 0 could take the store down before
# rank 1 had read its signal, and rank 1 would rightly report the store gone instead.
free_port P_WAIT
run_bg wait_rank0 60 RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P_WAIT -- "$C" eval; W0=$BG
run_bg wait_rank1 60 RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P_WAIT -- "$C" eval; W1=$BG
T0=$(now)
wait_line "$TMP/wait_rank0.err" 20 "waiting for rank 2 to join the job:"
kill -TERM "$(prog_pid wait_rank1)" 2>/dev/null   # the programs, not their deadline keepers
wait $W1; RC1=$?
kill -TERM "$(prog_pid wait_rank0)" 2>/dev/null
wait $W0; RC=$?
T1=$(now)
check_begin wait_rank0
need_rc 143; need_time 4 25  # killed by SIGTERM (timeout passes it on), after the first report
need_re err "^\[rank 0/3\] warning: waiting for rank 2 to join the job: 2 of 3 ranks \(WORLD_SIZE=3\) have joined after [5-9] s \(ranks 0-1\)\. Start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, or fix WORLD_SIZE if fewer processes belong to the job; DDP_TIMEOUT ends the wait after 300 s$"
need_line err "[rank 0/3] ddp_init got SIGTERM while waiting for rank 2 to join the job"
grep -qF "[rank 1/3] ddp_init got SIGTERM while waiting for rank 2 to join the job" "$TMP/wait_rank1.err" ||
    WHY+=("rank 1 (status $RC1) did not say what it waited for: $(tail -n 2 "$TMP/wait_rank1.err")")
MSG=$(grep -m1 'waiting for rank 2' "$TMP/wait_rank0.err")
check_end confusion_world_size_larger_reported_while_waiting

# ---- nothing left behind ---------------------------------------------------------------------------
left=""
for p in $PIDS; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
if [ -z "$left" ]; then ok confusions_nothing_left_running
else bad confusions_nothing_left_running "still running:$left"; fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
