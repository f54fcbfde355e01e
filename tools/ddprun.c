/* ddprun: the launcher, torchrun's analogue, and a user of ddp.h like any training program.
       build/ddprun --standalone --nproc-per-node 4 build/allreduce_perf -b 4K -e 64M
   It parses torchrun-style flags, starts one process per rank with the environment ddp_init
   reads, prefixes each line they print with "[rank R]: ", stops them all when one fails, and
   restarts the job up to --max-restarts times. Starting, reaping and stopping processes, and the
   guardian that outlives a killed launcher, are the header's (>>spawn), shared with ddp_spawn;
   the internal ddp__ names it calls are reachable because this file compiles the implementation
   (make links it with ddp_internals.o instead, the implementation with those names exported).
   Under srun it refuses (status 2) to run as one of several tasks on a node, or with --nnodes 1
   in a step over several nodes. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

/* The exit status a shell would show for a rank: its own, or 128 + signal. */
static int ddprun_exit_code(int status) {
    if (status == -1) return 1;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* ---- ddprun: the flags ---------------------------------------------------------------------------- */

typedef struct ddprun_opts {
    int nproc, nnodes, node_rank, port, standalone, max_restarts;
    int restart;         /* restarts so far: the ranks' DDP_RESTART_COUNT */
    int addr_given, port_given;
    const char* addr;
    const char* backend; /* NULL: the program chooses */
    char** prog;         /* the program and its arguments, NULL-terminated (inside argv) */
    char launch[128];    /* DDP_LAUNCH_ID: "host:pid:start time" of this ddprun */
} ddprun_opts;

static const char ddprun_usage[] =
    "usage: ddprun [flags] PROGRAM [ARGS...]     (torchrun's analogue: start one process per rank)\n"
    "  --nproc-per-node N   processes on this machine (default 1)\n"
    "  --nnodes N           machines in the job (default 1)\n"
    "  --node-rank R        this machine's number, 0..nnodes-1 (default 0)\n"
    "  --master-addr A      rank 0's machine (default 127.0.0.1)\n"
    "  --master-port P      rank 0's store port (default 29500)\n"
    "  --standalone         one machine: 127.0.0.1 and a free port (no clash with other jobs)\n"
    "  --backend cpu|nccl   exported as DDP_BACKEND (default: the program chooses); for mpi,\n"
    "                       start the program with mpirun instead of ddprun\n"
    "  --max-restarts N     when a rank fails, stop the others and start the job again, up to N\n"
    "                       times (default 0); ranks read DDP_RESTART_COUNT and resume from a snapshot\n"
    "  -h, --help           this text\n"
    "Under srun, start one ddprun per node (srun --ntasks-per-node=1), with --nnodes and --node-rank.\n"
    "Flags may be written --a-b or --a_b, and --flag=value. \"--\" ends the flags.\n"
    "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,\n"
    "MASTER_PORT and DDP_JOB_TOKEN (every node of a job must share DDP_JOB_TOKEN), and DDP_LAUNCH_ID,\n"
    "which keeps the ranks of another ddprun on the same port and token out of this job. Output lines are\n"
    "prefixed \"[rank R]: \". When one rank fails the others are stopped (SIGTERM, then SIGKILL\n"
    "after DDP_KILL_GRACE_S, default 5 s) and ddprun exits with that rank's status. If ddprun itself\n"
    "is killed, even by SIGKILL, a guardian process stops the ranks the same way.\n";

/* Does `arg` (after its "--") name `flag`? '_' matches '-', so --nproc_per_node works too. The
   name ends at the end of arg or at '='; *value gets what follows '=' (NULL if none). */
static int ddprun_flag_is(const char* arg, const char* flag, const char** value) {
    const char* a = arg + 2;
    for (; *flag; a++, flag++)
        if (*a != *flag && !(*a == '_' && *flag == '-')) return 0;
    if (*a != 0 && *a != '=') return 0;
    *value = *a == '=' ? a + 1 : NULL;
    return 1;
}

/* A flag's integer value in [lo, hi]; prints the message and returns 0 if it is not one. */
static int ddprun_int_flag(const char* flag, const char* v, int lo, int hi, int* out) {
    long x;
    if (!ddp__env_parse_int(v, &x) || x < lo || x > hi) {
        fprintf(stderr, "ddprun: %s must be a whole number from %d to %d, not \"%s\"\n", flag, lo, hi, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

/* Parse argv into *o. Returns -1 to go on, else the exit status (0 after --help, 2 on an error). */
static int ddprun_parse(int argc, char** argv, ddprun_opts* o) {
    static const char* const value_flags[] = {"nproc-per-node", "nnodes", "node-rank", "master-addr",
                                              "master-port", "backend", "max-restarts"};
    int i, k;
    memset(o, 0, sizeof *o);
    o->nproc = o->nnodes = 1;
    o->port = DDP__DEFAULT_PORT;
    o->addr = "127.0.0.1";
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int known = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(ddprun_usage, stdout); return 0; }
        if (!strcmp(a, "--")) { i++; break; }
        if (a[0] != '-' || a[1] == 0) break; /* the program */
        if (a[1] != '-') { fprintf(stderr, "ddprun: unknown flag %s (ddprun --help lists them)\n", a); return 2; }
        if (ddprun_flag_is(a, "standalone", &v) && !v) { o->standalone = 1; continue; }
        for (k = 0; k < (int)(sizeof value_flags / sizeof value_flags[0]) && !known; k++) {
            if (!ddprun_flag_is(a, value_flags[k], &v)) continue;
            known = 1;
            if (!v && i + 1 >= argc) { fprintf(stderr, "ddprun: --%s needs a value\n", value_flags[k]); return 2; }
            if (!v) v = argv[++i];
            switch (k) {
            case 0: if (!ddprun_int_flag("--nproc-per-node", v, 1, DDP__MAX_SPAWN, &o->nproc)) return 2; break;
            case 1: if (!ddprun_int_flag("--nnodes", v, 1, 65536, &o->nnodes)) return 2; break;
            case 2: if (!ddprun_int_flag("--node-rank", v, 0, 65535, &o->node_rank)) return 2; break;
            case 3: o->addr = v; o->addr_given = 1; break;
            case 4: if (!ddprun_int_flag("--master-port", v, 1, 65535, &o->port)) return 2; o->port_given = 1; break;
            case 5: o->backend = v; break;
            default: if (!ddprun_int_flag("--max-restarts", v, 0, 1000000, &o->max_restarts)) return 2; break;
            }
        }
        if (!known) { fprintf(stderr, "ddprun: unknown flag %s (ddprun --help lists them)\n", a); return 2; }
    }
    if (i >= argc) {
        fprintf(stderr, "ddprun: no program to run: name it after the flags, e.g. "
                        "ddprun --standalone --nproc-per-node 2 ./train\n");
        return 2;
    }
    o->prog = argv + i;
    return -1;
}

/* Tasks on node `node` of a SLURM per-node count: "4", "2(x3)" (2 on each of 3 nodes), "3,2" or
   "2(x2),1". 0 when the text is malformed or has no such node. */
static int ddprun_slurm_tasks_on(const char* v, int node) {
    while (v && *v) {
        char* end;
        long n = isdigit((unsigned char)*v) ? strtol(v, &end, 10) : -1, reps = 1;
        if (n < 0 || n > 65536) return 0;
        if (*end == '(') {
            if (end[1] != 'x' || !isdigit((unsigned char)end[2])) return 0;
            reps = strtol(end + 2, &end, 10);
            if (*end != ')' || reps < 1 || reps > INT_MAX) return 0;
            end++;
        }
        if (node < reps) return (int)n;
        node -= (int)reps;
        if (*end != ',') return 0;
        v = end + 1;
    }
    return 0;
}

/* ddprun inside an srun step. srun starts every task itself, so srun --ntasks-per-node=M with
   ddprun --nproc-per-node N gives M x N processes on each node (and, with GPUs, two ranks on one
   GPU); and a step on several nodes with --nnodes 1 trains one separate job per node. Only srun
   sets the SLURM_STEP_* variables: ddprun in a batch script (no srun) is not looked at. Returns -1
   when fine, else 2 after a message. */
static int ddprun_slurm_check(const ddprun_opts* o) {
    const char* per_node = getenv("SLURM_STEP_TASKS_PER_NODE");
    const char* nodes_v = getenv("SLURM_STEP_NUM_NODES");
    long node = 0, local = 0, nodes = 0;
    int here;
    if (!per_node && !nodes_v) return -1;
    if (getenv("SLURM_NODEID") && !ddp__env_parse_int(getenv("SLURM_NODEID"), &node)) node = 0;
    if (getenv("SLURM_LOCALID") && !ddp__env_parse_int(getenv("SLURM_LOCALID"), &local)) local = 0;
    here = per_node ? ddprun_slurm_tasks_on(per_node, node < 0 ? 0 : (int)node) : 0;
    if (here < local + 1 && local > 0) here = (int)local + 1; /* at least this many */
    if (here > 1) {
        fprintf(stderr, "ddprun: srun started %d tasks on this node (SLURM_STEP_TASKS_PER_NODE=%s; this is "
                        "SLURM_LOCALID=%ld), each running its own ddprun with --nproc-per-node %d: %d processes "
                        "instead of %d. Start one ddprun per node (srun --ntasks-per-node=1 ddprun ...), or let srun "
                        "start the ranks without ddprun (srun --ntasks-per-node=%d PROGRAM)\n",
                here, per_node ? per_node : "?", local, o->nproc, here * o->nproc, o->nproc, o->nproc);
        return 2;
    }
    if (nodes_v && ddp__env_parse_int(nodes_v, &nodes) && nodes > 1 && o->nnodes == 1) {
        fprintf(stderr, "ddprun: srun runs this step on %ld nodes (SLURM_STEP_NUM_NODES=%s), but ddprun has "
                        "--nnodes 1: each node would train a separate job of its own. Give every node's ddprun "
                        "--nnodes %ld --node-rank $SLURM_NODEID, the same --master-addr (the first host of "
                        "SLURM_JOB_NODELIST) and the same DDP_JOB_TOKEN\n", nodes, nodes_v, nodes);
        return 2;
    }
    return -1;
}

/* The checks that need all the flags at once. Returns -1 when fine, else 2 after a message. */
static int ddprun_validate(ddprun_opts* o) {
    int rc = ddprun_slurm_check(o);
    if (rc >= 0) return rc;
    if (o->standalone && o->nnodes != 1) {
        fprintf(stderr, "ddprun: --standalone runs on one machine; it cannot be combined with --nnodes %d\n",
                o->nnodes);
        return 2;
    }
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "ddprun: --node-rank %d is not below --nnodes %d: node ranks run 0..%d\n",
                o->node_rank, o->nnodes, o->nnodes - 1);
        return 2;
    }
    if ((long)o->nnodes * o->nproc > INT_MAX / 2) {
        fprintf(stderr, "ddprun: --nnodes %d times --nproc-per-node %d is too many ranks\n", o->nnodes, o->nproc);
        return 2;
    }
    if (!*o->addr) {
        fprintf(stderr, "ddprun: --master-addr is empty: give rank 0's host name or address\n");
        return 2;
    }
    if (o->backend && strcmp(o->backend, "cpu") != 0 && strcmp(o->backend, "nccl") != 0) {
        /* MPI places its ranks itself: processes ddprun starts are separate MPI jobs of one rank */
        if (!strcmp(o->backend, "mpi"))
            fprintf(stderr, "ddprun: --backend mpi: MPI starts its own ranks, so run the program with mpirun instead "
                    "(mpirun -np N program, with DDP_BACKEND=mpi; no ddprun and no MASTER_ADDR needed)\n");
        else fprintf(stderr, "ddprun: --backend %s is not one of cpu, nccl\n", o->backend);
        return 2;
    }
    if (o->standalone) {
        if (o->addr_given || o->port_given)
            fprintf(stderr, "ddprun: warning: --standalone picks 127.0.0.1 and a free port; "
                            "--master-addr/--master-port are ignored\n");
        o->addr = "127.0.0.1";
        o->port = ddp__ln_free_port();
        if (o->port <= 0) {
            fprintf(stderr, "ddprun: --standalone: cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno));
            return 1;
        }
    }
    return -1;
}

/* ---- ddprun: starting the ranks and relaying their output ------------------------------------------ */

/* One of a rank's output pipes, and the unfinished line read from it so far. */
typedef struct ddprun_stream {
    int fd;   /* -1 once closed */
    int rank;
    FILE* to; /* the launcher's stdout or stderr */
    size_t n;
    char buf[4096];
} ddprun_stream;

/* Write buf[0..len) as one line with the rank's prefix. */
static void ddprun_emit(ddprun_stream* st, const char* line, size_t len) {
    fprintf(st->to, "[rank %d]: ", st->rank);
    fwrite(line, 1, len, st->to);
    if (len == 0 || line[len - 1] != '\n') fputc('\n', st->to);
    fflush(st->to); /* line by line, so ranks' lines interleave whole and appear at once */
}

/* Read what the pipe has and print every complete line; at end of file print the rest and close.
   A line longer than the buffer is cut into buffer-sized lines. */
static void ddprun_pump(ddprun_stream* st) {
    ssize_t got = read(st->fd, st->buf + st->n, sizeof st->buf - st->n);
    size_t start = 0, i;
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (got <= 0) { /* end of file (or a broken pipe): flush the partial last line */
        if (st->n > 0) ddprun_emit(st, st->buf, st->n);
        st->n = 0;
        close(st->fd);
        st->fd = -1;
        return;
    }
    st->n += (size_t)got;
    for (i = 0; i < st->n; i++)
        if (st->buf[i] == '\n') {
            ddprun_emit(st, st->buf + start, i + 1 - start);
            start = i + 1;
        }
    if (start == 0 && st->n == sizeof st->buf) { /* no newline in a full buffer: cut the line here */
        ddprun_emit(st, st->buf, st->n);
        start = st->n;
    }
    memmove(st->buf, st->buf + start, st->n - start);
    st->n -= start;
}

/* In the child: the job's variables, the pipes as stdout/stderr, then the program. Never returns. */
static void ddprun_exec(const ddprun_opts* o, const char* token, int local, int out_fd, int err_fd) {
    ddp__ln_setenv_int("RANK", o->node_rank * o->nproc + local);
    ddp__ln_setenv_int("DDP_RELAYED_RANK", o->node_rank * o->nproc + local); /* see ddp__relayed */
    ddp__ln_setenv_int("WORLD_SIZE", o->nnodes * o->nproc);
    ddp__ln_setenv_int("LOCAL_RANK", local);
    ddp__ln_setenv_int("LOCAL_WORLD_SIZE", o->nproc);
    ddp__ln_setenv_int("GROUP_RANK", o->node_rank);
    setenv("MASTER_ADDR", o->addr, 1);
    ddp__ln_setenv_int("MASTER_PORT", o->port);
    setenv("DDP_JOB_TOKEN", token, 1);
    setenv("DDP_LAUNCH_ID", o->launch, 1);
    ddp__ln_setenv_int("DDP_RESTART_COUNT", o->restart);
    ddp__ln_setenv_int("TORCHELASTIC_RESTART_COUNT", o->restart);
    if (o->backend) setenv("DDP_BACKEND", o->backend, 1);
    /* N ranks each starting a thread per core would oversubscribe the machine (torchrun does this) */
    if (o->nproc > 1) setenv("OMP_NUM_THREADS", "1", 0);
    if (dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(127);
    close(out_fd);
    close(err_fd);
    execvp(o->prog[0], o->prog);
    fprintf(stderr, "ddprun: cannot run %s: %s\n", o->prog[0], strerror(errno));
    fflush(stderr);
    _exit(127); /* the shell's status for "command not found" */
}

/* Start local rank `local`: a pipe pair for its output, then fork. The read ends stay in the
   launcher (close-on-exec, so later ranks do not inherit them); the write ends only in the child. */
static int ddprun_start(const ddprun_opts* o, const char* token, int local, ddp__ln_job* j,
                               ddprun_stream* out, ddprun_stream* err, const ddp__ln_signals* sv) {
    int po[2], pe[2];
    pid_t pid, me = getpid();
    if (pipe(po) != 0) return -1;
    if (pipe(pe) != 0) { close(po[0]); close(po[1]); return -1; }
    fcntl(po[0], F_SETFD, FD_CLOEXEC);
    fcntl(pe[0], F_SETFD, FD_CLOEXEC);
    pid = fork();
    if (pid == 0) {
        ddp__ln_child_setup(sv, me);
        close(po[0]);
        close(pe[0]);
        ddprun_exec(o, token, local, po[1], pe[1]);
    }
    close(po[1]);
    close(pe[1]);
    if (pid < 0) { close(po[0]); close(pe[0]); return -1; }
    ddp__ln_started(j, local, pid);
    out->fd = po[0]; out->rank = err->rank = o->node_rank * o->nproc + local; out->to = stdout; out->n = 0;
    err->fd = pe[0]; err->to = stderr; err->n = 0;
    return 0;
}

/* Relay output and supervise until every rank has ended. Once all are reaped, what is left in the
   pipes is drained; a pipe still held open by something a rank started is given up after 100 ms
   of silence (or 2 s in all), so a leftover background program cannot hang the launcher. */
static void ddprun_relay(ddp__ln_job* j, ddprun_stream* st, int nst, struct pollfd* pf) {
    int i, k, m, open_n;
    double drain_until = 0;
    for (;;) {
        ddp__ln_tick(j);
        if (j->alive == 0 && drain_until == 0) drain_until = ddp__now() + 2.0;
        if (j->alive == 0 && ddp__now() > drain_until) break;
        for (i = 0, open_n = 0; i < nst; i++)
            if (st[i].fd >= 0) {
                pf[open_n].fd = st[i].fd;
                pf[open_n].events = POLLIN;
                pf[open_n].revents = 0;
                open_n++;
            }
        if (open_n == 0) {
            if (j->alive == 0) break;
            ddp__sleep(0.01);
            continue;
        }
        k = poll(pf, (nfds_t)open_n, j->alive > 0 ? 20 : 100);
        if (k == 0 && j->alive == 0) break; /* all ended and the pipes are quiet */
        if (k < 0) continue;                /* EINTR: a forwarded signal */
        /* pf lists the open streams in order; a stream closed before this poll has fd -1 */
        for (i = 0, m = 0; i < nst && m < open_n; i++) {
            if (st[i].fd != pf[m].fd) continue;
            if (pf[m].revents & (POLLIN | POLLHUP | POLLERR)) ddprun_pump(&st[i]);
            m++;
        }
    }
    for (i = 0; i < nst; i++)
        if (st[i].fd >= 0) {
            if (st[i].n > 0) ddprun_emit(&st[i], st[i].buf, st[i].n);
            close(st[i].fd);
            st[i].fd = -1;
        }
}

/* The job token: the environment's (every node of a job must share one), else a fresh one. */
static void ddprun_job_token(const ddprun_opts* o, char* token, size_t n) {
    const char* t = getenv("DDP_JOB_TOKEN");
    if (t && *t) {
        snprintf(token, n, "%s", t);
        return;
    }
    ddp__ln_token(token);
    if (o->nnodes > 1)
        fprintf(stderr, "ddprun: warning: DDP_JOB_TOKEN is not set, so this node made its own (%s); every "
                        "node of the job must be given the same one: export DDP_JOB_TOKEN=<same value> "
                        "before ddprun on each node\n", token);
}

/* One failed attempt of the job: the rank that failed first, and how. */
typedef struct ddprun_failure { int rank, status, restart; long pid; time_t when; } ddprun_failure;
#define DDPRUN_MAX_FAILURES 32 /* the summary keeps the first 31 failures and the last one */

/* Print one failure: "restart 0, 12:00:01: rank 1 (pid 4242) was killed by signal 9 (SIGKILL)". */
static void ddprun_print_failure(const ddprun_failure* f, const char* note) {
    char how[96], when[16];
    struct tm tmv;
    ddp__ln_how(f->status, how, sizeof how);
    localtime_r(&f->when, &tmv);
    strftime(when, sizeof when, "%H:%M:%S", &tmv);
    fprintf(stderr, "ddprun:   attempt %d (DDP_RESTART_COUNT=%d), %s: rank %d (pid %ld) %s%s%s\n", f->restart + 1,
            f->restart, when, f->rank, f->pid, how, ddprun_exit_code(f->status) == 127 ? " (the program could not be run)" : "",
            note);
}

/* The final word: the failures (the first is the root cause), or the signal we got; returns the
   exit status for main: the last failing rank's. */
static int ddprun_summary(const ddprun_opts* o, const ddp__ln_job* j, const ddprun_failure* fails,
                                 int nfails, int total_fails) {
    int i;
    if (j->first_fail >= 0 && !j->fail_after_signal) {
        const ddprun_failure* last = &fails[nfails - 1];
        char how[96];
        ddp__ln_how(last->status, how, sizeof how);
        if (total_fails == 1) {
            fprintf(stderr, "ddprun: rank %d (pid %ld) %s%s%s\n", last->rank, last->pid, how,
                    ddprun_exit_code(last->status) == 127 ? " (the program could not be run)" : "",
                    j->n > 1 || o->nnodes > 1 ? "; stopped the other ranks" : "");
            if (o->max_restarts == 0 && ddprun_exit_code(last->status) != 127)
                fprintf(stderr, "ddprun: no restart (--max-restarts 0): start ddprun with --max-restarts N to "
                                "restart the job after a failure\n");
        } else {
            fprintf(stderr, "ddprun: giving up: the job failed %d times (--max-restarts %d); each attempt's first "
                            "failure:\n", total_fails, o->max_restarts);
            for (i = 0; i < nfails; i++) {
                if (i == nfails - 1 && total_fails > nfails)
                    fprintf(stderr, "ddprun:   ... %d more ...\n", total_fails - nfails);
                ddprun_print_failure(&fails[i], i == 0 ? "  <- root cause (the first failure)" : "");
            }
            fprintf(stderr, "ddprun: exiting with rank %d's status %d\n", last->rank,
                    ddprun_exit_code(last->status));
        }
        return ddprun_exit_code(last->status);
    }
    if (ddp__ln_got_signal) {
        fprintf(stderr, "ddprun: received %s and passed it to every rank; all have stopped\n",
                ddp__ln_signame((int)ddp__ln_got_signal));
        return 128 + (int)ddp__ln_got_signal;
    }
    return 0;
}

/* Start every local rank and supervise them until all have ended. Returns 0, or -1 if a rank
   could not be started (the others were stopped). pids[] gets the ranks' pids. */
static int ddprun_run_once(const ddprun_opts* o, const char* token, ddp__ln_job* j, ddprun_stream* st,
                                  struct pollfd* pf, pid_t* pids) {
    ddp__ln_signals sv;
    int i, start_failed = 0;
    for (i = 0; i < 2 * o->nproc; i++) st[i].fd = -1;
    fflush(NULL);
    ddp__ln_signals_begin(j, &sv);
    for (i = 0; i < o->nproc; i++) {
        if (ddprun_start(o, token, i, j, &st[2 * i], &st[2 * i + 1], &sv) != 0) {
            fprintf(stderr, "ddprun: cannot start local rank %d: %s; stopping the others\n", i, strerror(errno));
            start_failed = 1;
            ddp__ln_stop(j);
            break;
        }
        pids[i] = j->pid[i];
    }
    ddp__ln_signals_unblock(&sv);
    ddprun_relay(j, st, 2 * o->nproc, pf);
    ddp__ln_signals_end(&sv);
    return start_failed ? -1 : 0;
}

int main(int argc, char** argv) {
    ddprun_opts o;
    ddp__ln_job j;
    ddprun_stream* st;
    struct pollfd* pf;
    pid_t* pids;
    ddprun_failure fails[DDPRUN_MAX_FAILURES];
    char token[256];
    int rc, nfails = 0, total_fails = 0;
    if ((rc = ddprun_parse(argc, argv, &o)) >= 0) return rc;
    if ((rc = ddprun_validate(&o)) >= 0) return rc;
    ddprun_job_token(&o, token, sizeof token);
    {
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        snprintf(o.launch, sizeof o.launch, "%s:%ld:%ld", host, (long)getpid(), (long)time(NULL));
    }
    st = (ddprun_stream*)ddp__calloc((size_t)o.nproc * 2 * sizeof(ddprun_stream));
    pf = (struct pollfd*)ddp__calloc((size_t)o.nproc * 2 * sizeof(struct pollfd));
    pids = (pid_t*)ddp__calloc((size_t)o.nproc * sizeof(pid_t)); /* for the summary: j.pid is zeroed */
    if (!st || !pf || !pids || ddp__ln_job_init(&j, o.nproc) != DDP_OK) {
        fprintf(stderr, "ddprun: out of memory\n");
        if (st) DDP_FREE(st);
        if (pf) DDP_FREE(pf);
        if (pids) DDP_FREE(pids);
        return 1;
    }
    for (o.restart = 0;; o.restart++) {
        ddprun_failure* f;
        if (ddprun_run_once(&o, token, &j, st, pf, pids) != 0) { rc = 1; break; }
        if (j.first_fail < 0 || j.fail_after_signal || ddp__ln_got_signal) {
            rc = ddprun_summary(&o, &j, fails, nfails, total_fails);
            break;
        }
        /* keep the first failures and, in the last slot, the newest */
        f = &fails[nfails < DDPRUN_MAX_FAILURES ? nfails++ : nfails - 1];
        f->rank = o.node_rank * o.nproc + j.first_fail;
        f->status = j.status[j.first_fail];
        f->pid = (long)pids[j.first_fail];
        f->when = j.fail_time;
        f->restart = o.restart;
        total_fails++;
        if (o.restart >= o.max_restarts || ddprun_exit_code(f->status) == 127) {
            rc = ddprun_summary(&o, &j, fails, nfails, total_fails);
            break;
        }
        {
            char how[96];
            ddp__ln_how(f->status, how, sizeof how);
            fprintf(stderr, "ddprun: rank %d (pid %ld) %s; stopped the other ranks; restarting the job (restart %d "
                            "of %d)\n", f->rank, f->pid, how, o.restart + 1, o.max_restarts);
        }
        ddp__ln_job_free(&j);
        if (ddp__ln_job_init(&j, o.nproc) != DDP_OK) {
            fprintf(stderr, "ddprun: out of memory\n");
            DDP_FREE(st);
            DDP_FREE(pf);
            DDP_FREE(pids);
            return 1;
        }
    }
    ddp__ln_job_free(&j);
    DDP_FREE(st);
    DDP_FREE(pf);
    DDP_FREE(pids);
    return rc;
}
