/* tests/unit/test_env.c: the >>launch section's library side: ddp__env_resolve (which launcher's
   variables win, each one parsed, every error naming its variable), SLURM node lists, the
   "[rank R/W]" log prefix, and ddp_spawn (the variables each rank sees, a failing rank stopping
   the others, a rank killed by a signal, a rank that ignores SIGTERM). The ddprun program is
   tested by tests/multiproc/test_ddprun.sh. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static char g_tmp[64]; /* temporary folder made by mkdtemp, removed at the end */

/* ---- helpers ----------------------------------------------------------------------------------- */

/* Every variable ddp__env_resolve or ddp_spawn reads; each case starts with none of them set. */
static const char* const g_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "DDP_JOB_TOKEN",
    "DDP_KILL_GRACE_S"};

static void clear_env(void) {
    size_t i;
    for (i = 0; i < sizeof g_vars / sizeof g_vars[0]; i++) unsetenv(g_vars[i]);
}

static void set_torchrun(const char* rank, const char* world, const char* lrank, const char* lworld) {
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", world, 1);
    if (lrank) setenv("LOCAL_RANK", lrank, 1);
    if (lworld) setenv("LOCAL_WORLD_SIZE", lworld, 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
}
static void set_openmpi(const char* rank, const char* world, const char* lrank, const char* lworld) {
    setenv("OMPI_COMM_WORLD_RANK", rank, 1);
    setenv("OMPI_COMM_WORLD_SIZE", world, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", lrank, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", lworld, 1);
}
static void set_slurm(const char* rank, const char* ntasks, const char* localid, const char* nodeid,
                      const char* per_node, const char* nodelist) {
    setenv("SLURM_PROCID", rank, 1);
    setenv("SLURM_NTASKS", ntasks, 1);
    setenv("SLURM_LOCALID", localid, 1);
    setenv("SLURM_NODEID", nodeid, 1);
    setenv("SLURM_TASKS_PER_NODE", per_node, 1);
    if (nodelist) setenv("SLURM_JOB_NODELIST", nodelist, 1);
}

static ddp_env resolve_ok(const ddp_desc* d) {
    ddp_env e;
    memset(&e, 0, sizeof e);
    CHECK_OK(ddp__env_resolve(d, &e));
    return e;
}

#define CHECK_ENV(e, r, w, lr, lw, node, src)                                                          \
    do {                                                                                           \
        CHECKF((e).rank == (r) && (e).world_size == (w) && (e).local_rank == (lr) &&               \
                   (e).local_world_size == (lw) && (e).node_rank == (node) && (e).source &&        \
                   !strcmp((e).source, src),                                                       \
               "got rank %d/%d local %d/%d node %d source %s; expected %d/%d %d/%d %d %s",         \
               (e).rank, (e).world_size, (e).local_rank, (e).local_world_size, (e).node_rank,     \
               (e).source ? (e).source : "(null)", r, w, lr, lw, node, src);                      \
    } while (0)

static int env_fails(const char* needle) {
    ddp_env e;
    ddp_status s;
    ddp__clear_error();
    s = ddp__env_resolve(NULL, &e);
    if (s != DDP_ERR_ENV) {
        printf("    resolve returned %s, expected DDP_ERR_ENV (message: %s)\n", ddp_status_name(s),
               ddp_error_string());
        return 0;
    }
    if (!strstr(ddp_error_string(), needle)) {
        printf("    message \"%s\" lacks \"%s\"\n", ddp_error_string(), needle);
        return 0;
    }
    return 1;
}
#define CHECK_ENV_FAILS(needle) CHECKF(env_fails(needle), "expected DDP_ERR_ENV naming \"%s\"", needle)

/* ---- precedence -------------------------------------------------------------------------------- */

static void env_default_single_process(void) {
    ddp_env e;
    clear_env();
    e = resolve_ok(NULL);
    CHECK_ENV(e, 0, 1, 0, 1, 0, "default");
    CHECK(!strcmp(e.master_addr, "127.0.0.1"));
    CHECK(e.master_port == 29500);
}

static void env_precedence(void) {
    ddp_desc d;
    ddp_env e;
    clear_env();
    set_slurm("3", "8", "1", "1", "2(x4)", "node[1-4]");
    e = resolve_ok(NULL);
    CHECK_ENV(e, 3, 8, 1, 2, 1, "slurm");
    set_openmpi("2", "6", "0", "2");
    setenv("MASTER_ADDR", "10.0.0.2", 1); /* Open MPI exports none */
    e = resolve_ok(NULL);
    CHECK_ENV(e, 2, 6, 0, 2, 1, "openmpi"); /* Open MPI beats SLURM */
    set_torchrun("1", "4", "1", "2");
    e = resolve_ok(NULL);
    CHECK_ENV(e, 1, 4, 1, 2, 0, "torchrun"); /* torchrun beats Open MPI */
    memset(&d, 0, sizeof d);
    d.explicit_rank = 1;
    d.rank = 0;
    d.world_size = 2;
    e = resolve_ok(&d);
    CHECK_ENV(e, 0, 2, 0, 2, 0, "explicit"); /* explicit beats everything, rank 0 included */
    d.explicit_rank = 0;
    e = resolve_ok(&d); /* without explicit_rank the desc's numbers do not count */
    CHECK_ENV(e, 1, 4, 1, 2, 0, "torchrun");
    clear_env();
}

/* ---- each source ------------------------------------------------------------------------------- */

static void env_torchrun(void) {
    ddp_env e;
    clear_env();
    set_torchrun("5", "8", "1", "4");
    setenv("MASTER_PORT", "29611", 1);
    e = resolve_ok(NULL);
    CHECK_ENV(e, 5, 8, 1, 4, 1, "torchrun");
    CHECK(!strcmp(e.master_addr, "10.0.0.1"));
    CHECK(e.master_port == 29611);
    setenv("GROUP_RANK", "7", 1); /* the launcher's node rank wins over rank / local world size */
    e = resolve_ok(NULL);
    CHECK(e.node_rank == 7);
    /* neither LOCAL_* set: every rank on this machine */
    clear_env();
    set_torchrun("2", "3", NULL, NULL);
    e = resolve_ok(NULL);
    CHECK_ENV(e, 2, 3, 2, 3, 0, "torchrun");
    clear_env();
}

static void env_openmpi(void) {
    ddp_env e;
    clear_env();
    set_openmpi("3", "4", "1", "2");
    setenv("MASTER_ADDR", "head", 1);
    e = resolve_ok(NULL);
    CHECK_ENV(e, 3, 4, 1, 2, 1, "openmpi");
    CHECK(!strcmp(e.master_addr, "head"));
    CHECK(e.master_port == 29500);
    clear_env();
    set_openmpi("0", "1", "0", "1"); /* one process needs no master address */
    e = resolve_ok(NULL);
    CHECK_ENV(e, 0, 1, 0, 1, 0, "openmpi");
    CHECK(!strcmp(e.master_addr, "127.0.0.1"));
    clear_env();
}

static void env_slurm(void) {
    ddp_env e;
    clear_env();
    set_slurm("5", "6", "1", "2", "2(x3)", "gpu[07,09-12],cpu3");
    setenv("SLURM_JOB_ID", "1234567", 1);
    e = resolve_ok(NULL);
    CHECK_ENV(e, 5, 6, 1, 2, 2, "slurm");
    CHECK(!strcmp(e.master_addr, "gpu07"));
    CHECK(e.master_port == 15000 + 4567); /* Lightning's rule: 15000 + last 4 digits of the job id */
    setenv("SLURM_JOB_ID", "42", 1);
    e = resolve_ok(NULL);
    CHECK(e.master_port == 15042);
    unsetenv("SLURM_JOB_ID");
    e = resolve_ok(NULL);
    CHECK(e.master_port == 29500);
    setenv("MASTER_PORT", "23456", 1); /* MASTER_* beat SLURM's own */
    setenv("MASTER_ADDR", "10.1.1.1", 1);
    setenv("SLURM_JOB_ID", "1234567", 1);
    e = resolve_ok(NULL);
    CHECK(e.master_port == 23456 && !strcmp(e.master_addr, "10.1.1.1"));
    /* SLURM_NTASKS_PER_NODE beats SLURM_TASKS_PER_NODE; SLURM_NODELIST is the older name */
    clear_env();
    set_slurm("1", "4", "1", "0", "9", NULL);
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    setenv("SLURM_NODELIST", "alpha,beta", 1);
    e = resolve_ok(NULL);
    CHECK_ENV(e, 1, 4, 1, 2, 0, "slurm");
    CHECK(!strcmp(e.master_addr, "alpha"));
    /* SLURM_PROCID without SLURM_NTASKS (an salloc shell) is not a SLURM job step */
    clear_env();
    setenv("SLURM_PROCID", "0", 1);
    e = resolve_ok(NULL);
    CHECK_ENV(e, 0, 1, 0, 1, 0, "default");
    clear_env();
}

static void env_explicit(void) {
    ddp_desc d;
    ddp_env e;
    clear_env();
    memset(&d, 0, sizeof d);
    d.explicit_rank = 1;
    d.rank = 3;
    d.world_size = 4;
    d.local_rank = 1;
    d.local_world_size = 2;
    d.master_addr = "10.9.9.9";
    d.master_port = 31000;
    setenv("MASTER_ADDR", "ignored", 1);
    setenv("MASTER_PORT", "1", 1);
    e = resolve_ok(&d);
    CHECK_ENV(e, 3, 4, 1, 2, 1, "explicit");
    CHECK(!strcmp(e.master_addr, "10.9.9.9"));
    CHECK(e.master_port == 31000);
    d.rank = 4;
    CHECK_FAILS(ddp__env_resolve(&d, &e), DDP_ERR_INVALID_ARGUMENT, "desc.rank=4 is not below desc.world_size=4");
    clear_env();
}

/* ---- errors ------------------------------------------------------------------------------------ */

static void env_errors_rank_and_world(void) {
    clear_env();
    set_torchrun("4", "4", "0", "4");
    CHECK_ENV_FAILS("RANK=4 is not below WORLD_SIZE=4: ranks run 0..3");
    set_torchrun("-1", "4", "0", "4");
    CHECK_ENV_FAILS("RANK=-1 is negative");
    set_torchrun("3x", "4", "0", "4");
    CHECK_ENV_FAILS("RANK=3x is not a whole number");
    set_torchrun("", "4", "0", "4");
    CHECK_ENV_FAILS("RANK is set but empty");
    set_torchrun("1", "0", "0", "4");
    CHECK_ENV_FAILS("WORLD_SIZE=0 is below 1");
    set_torchrun("1", "four", "0", "4");
    CHECK_ENV_FAILS("WORLD_SIZE=four");
    unsetenv("WORLD_SIZE");
    CHECK_ENV_FAILS("WORLD_SIZE is not set but RANK is: set WORLD_SIZE to the number of processes (ddprun sets it)");
    clear_env();
    setenv("WORLD_SIZE", "4", 1); /* half a setup must not quietly run alone */
    CHECK_ENV_FAILS("RANK is not");
    clear_env();
}

static void env_errors_local(void) {
    clear_env();
    set_torchrun("1", "4", "1", NULL);
    CHECK_ENV_FAILS("LOCAL_WORLD_SIZE is not set but LOCAL_RANK is");
    clear_env();
    set_torchrun("1", "4", NULL, "2");
    CHECK_ENV_FAILS("LOCAL_RANK is not set but LOCAL_WORLD_SIZE is");
    clear_env();
    set_torchrun("1", "4", "2", "2");
    CHECK_ENV_FAILS("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
    set_torchrun("1", "4", "0", "8");
    CHECK_ENV_FAILS("LOCAL_WORLD_SIZE=8");
    set_torchrun("1", "4", "0", "2");
    setenv("GROUP_RANK", "x", 1);
    CHECK_ENV_FAILS("GROUP_RANK=x");
    clear_env();
}

static void env_errors_master(void) {
    clear_env();
    set_torchrun("0", "2", "0", "2");
    setenv("MASTER_PORT", "0", 1);
    CHECK_ENV_FAILS("MASTER_PORT=0 is not a port number");
    setenv("MASTER_PORT", "70000", 1);
    CHECK_ENV_FAILS("MASTER_PORT=70000");
    setenv("MASTER_PORT", "abc", 1);
    CHECK_ENV_FAILS("MASTER_PORT=abc");
    setenv("MASTER_PORT", "29501", 1);
    unsetenv("MASTER_ADDR");
    CHECK_ENV_FAILS("MASTER_ADDR is not set but WORLD_SIZE=2");
    clear_env();
    set_openmpi("0", "2", "0", "2");
    CHECK_ENV_FAILS("Open MPI exports no master address");
    CHECK(strstr(ddp_error_string(), "mpirun -x MASTER_ADDR") != NULL);
    clear_env();
}

static void env_errors_openmpi_slurm(void) {
    clear_env();
    set_openmpi("0", "2", "0", "2");
    setenv("MASTER_ADDR", "h", 1);
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    CHECK_ENV_FAILS("OMPI_COMM_WORLD_LOCAL_SIZE is not set but OMPI_COMM_WORLD_RANK is");
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    CHECK_ENV_FAILS("OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2");
    clear_env();
    set_slurm("0", "2", "0", "0", "2", "node[");
    CHECK_ENV_FAILS("node[");
    set_slurm("0", "2", "0", "0", "two", "n1");
    CHECK_ENV_FAILS("SLURM_TASKS_PER_NODE=two");
    unsetenv("SLURM_TASKS_PER_NODE");
    CHECK_ENV_FAILS("nor SLURM_TASKS_PER_NODE is set");
    set_slurm("0", "2", "0", "0", "2", "n1");
    unsetenv("SLURM_LOCALID");
    CHECK_ENV_FAILS("SLURM_LOCALID is not set but SLURM_PROCID is");
    clear_env();
}

/* ---- SLURM node lists -------------------------------------------------------------------------- */

static void slurm_first_host_forms(void) {
    static const char* const ok[][2] = {
        {"a", "a"},
        {"a,b", "a"},
        {"a b", "a"},
        {"node[1-4]", "node1"},
        {"node[001-004]", "node001"},
        {"gpu[07,09-12],cpu3", "gpu07"},
        {"rack1-node[3-5]", "rack1-node3"},
        {"node[5]", "node5"},
        {"cpu3,gpu[07,09-12]", "cpu3"},
    };
    static const char* const bad[] = {"", "node[", "node[]", "node[a-b]", "[1-2]", "node[1-", "node1]", "node[4-1]"};
    char out[64];
    size_t i;
    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ddp_status s = ddp__slurm_first_host(ok[i][0], out, sizeof out);
        CHECKF(s == DDP_OK && !strcmp(out, ok[i][1]), "\"%s\": got %s \"%s\", expected \"%s\" (%s)", ok[i][0],
               ddp_status_name(s), out, ok[i][1], ddp_error_string());
    }
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", bad[i]);
        CHECK_FAILS(ddp__slurm_first_host(bad[i], out, sizeof out), DDP_ERR_ENV, quoted);
    }
    CHECK_FAILS(ddp__slurm_first_host("averyveryverylonghostname", out, 8), DDP_ERR_ENV, "longer than 7");
}

/* ---- the log prefix ---------------------------------------------------------------------------- */

static char g_line[512];
static void capture(ddp_log_level level, const char* line, void* user) {
    (void)level;
    (void)user;
    snprintf(g_line, sizeof g_line, "%s", line);
}

static void env_sets_log_prefix(void) {
    clear_env();
    set_torchrun("2", "4", "2", "4");
    resolve_ok(NULL);
    ddp__set_log(capture, NULL);
    g_line[0] = 0;
    ddp__log(DDP_LOG_WARN, "hello %d", 7);
    CHECKF(!strcmp(g_line, "[rank 2/4] warning: hello 7"), "logged \"%s\"", g_line);
    clear_env();
    resolve_ok(NULL); /* back to a single process for the cases that follow */
    g_line[0] = 0;
    ddp__log(DDP_LOG_WARN, "again");
    CHECKF(!strcmp(g_line, "[rank 0/1] warning: again"), "logged \"%s\"", g_line);
    ddp__set_log(NULL, NULL);
}

/* Before the placement is known (no ddp_init yet), a line's label comes from the launcher's
   variables; ddprun's DDP_RELAYED_RANK, naming this rank, leaves it out of stderr (ddprun adds its
   own), but only for that rank, and a sink still gets it. */
static void label_before_init(void) {
    char buf[128] = "";
    FILE* err;
    int saved = dup(2);
    clear_env();
    ddp__g.placed = 0; /* as in a fresh process */
    ddp__set_log(capture, NULL);
    set_torchrun("3", "4", NULL, NULL);
    g_line[0] = 0;
    ddp__log(DDP_LOG_WARN, "early");
    CHECKF(!strcmp(g_line, "[rank 3/4] warning: early"), "logged \"%s\"", g_line);
    clear_env();
    set_openmpi("1", "2", "1", "2");
    ddp__log(DDP_LOG_WARN, "early");
    CHECKF(!strcmp(g_line, "[rank 1/2] warning: early"), "logged \"%s\"", g_line);
    setenv("DDP_RELAYED_RANK", "1", 1);
    ddp__log(DDP_LOG_WARN, "early");
    CHECKF(!strcmp(g_line, "[rank 1/2] warning: early"), "a sink got \"%s\"", g_line);
    ddp__set_log(NULL, NULL);
    err = tmpfile();
    if (err && saved >= 0 && dup2(fileno(err), 2) >= 0) {
        ddp__log(DDP_LOG_WARN, "relayed");
        setenv("DDP_RELAYED_RANK", "0", 1); /* another rank's relay: this line keeps its label */
        ddp__log(DDP_LOG_WARN, "inherited");
        fflush(stderr);
        dup2(saved, 2);
        rewind(err);
        if (fread(buf, 1, sizeof buf - 1, err) == 0) buf[0] = 0;
    }
    if (err) fclose(err);
    if (saved >= 0) close(saved);
    CHECKF(!strcmp(buf, "warning: relayed\n[rank 1/2] warning: inherited\n"), "stderr got \"%s\"", buf);
    unsetenv("DDP_RELAYED_RANK");
    clear_env();
    resolve_ok(NULL); /* placed again, as a single process, for the cases that follow */
}

/* ---- ddp_spawn --------------------------------------------------------------------------------- */

typedef enum { SPAWN_REPORT, SPAWN_FAIL_RANK2, SPAWN_SIGKILL_RANK1, SPAWN_IGNORE_TERM } spawn_mode;
typedef struct spawn_arg { spawn_mode mode; int nproc; } spawn_arg;

static void write_file(const char* name, int rank, const char* text) {
    char path[256], tmp[260];
    FILE* f;
    snprintf(path, sizeof path, "%s/%s%d", g_tmp, name, rank);
    snprintf(tmp, sizeof tmp, "%s.t", path);
    f = fopen(tmp, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path); /* whole or absent: the parent never reads half a file */
}

static int read_file(const char* name, int rank, char* buf, size_t n) {
    char path[256];
    FILE* f;
    size_t got;
    snprintf(path, sizeof path, "%s/%s%d", g_tmp, name, rank);
    f = fopen(path, "r");
    if (!f) return 0;
    got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    fclose(f);
    return 1;
}

static void sleep_ms(int ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&t, NULL);
}

/* Wait (at most 5 s) until every rank but `me` has written its pid file. */
static void wait_for_pids(int nproc, int me) {
    int i, tries;
    char b[32];
    for (tries = 0; tries < 500; tries++) {
        for (i = 0; i < nproc; i++)
            if (i != me && !read_file("pid", i, b, sizeof b)) break;
        if (i == nproc) return;
        sleep_ms(10);
    }
}

static void long_sleep(void) {
    int i;
    for (i = 0; i < 300; i++) sleep_ms(100); /* 30 s, in steps: a handled signal cuts a sleep short */
}

static int spawn_fn(int rank, void* p) {
    const spawn_arg* a = (const spawn_arg*)p;
    char b[512];
    const char* tok = getenv("DDP_JOB_TOKEN");
    snprintf(b, sizeof b, "%ld", (long)getpid());
    write_file("pid", rank, b);
    snprintf(b, sizeof b, "%s %s %s %s %s %s %s", getenv("RANK"), getenv("WORLD_SIZE"), getenv("LOCAL_RANK"),
             getenv("LOCAL_WORLD_SIZE"), getenv("MASTER_ADDR"), getenv("MASTER_PORT"), tok ? tok : "(none)");
    write_file("env", rank, b);
    switch (a->mode) {
    case SPAWN_REPORT: return 0;
    case SPAWN_FAIL_RANK2:
        if (rank == 2) { wait_for_pids(a->nproc, rank); return 3; }
        long_sleep();
        return 0;
    case SPAWN_SIGKILL_RANK1:
        if (rank == 1) { wait_for_pids(a->nproc, rank); raise(SIGKILL); }
        long_sleep();
        return 0;
    case SPAWN_IGNORE_TERM:
        if (rank == 0) { wait_for_pids(a->nproc, rank); return 1; }
        signal(SIGTERM, SIG_IGN);
        long_sleep();
        return 0;
    }
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void clear_tmp(void) {
    h_remove_tree(g_tmp);
    mkdir(g_tmp, 0700);
}

/* Every rank's pid file names a process that no longer exists. */
static void check_all_gone(int nproc) {
    int i;
    for (i = 0; i < nproc; i++) {
        char b[32];
        long pid;
        if (!read_file("pid", i, b, sizeof b)) {
            CHECKF(0, "rank %d wrote no pid file", i);
            continue;
        }
        pid = strtol(b, NULL, 10);
        CHECKF(pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH, "rank %d (pid %ld) still exists", i, pid);
    }
}

static void spawn_four_ranks_see_their_env(void) {
    spawn_arg a = {SPAWN_REPORT, 4};
    char b[512], tok0[64] = "";
    int i;
    clear_env();
    clear_tmp();
    CHECK_OK(ddp_spawn(4, spawn_fn, &a));
    for (i = 0; i < 4; i++) {
        int r = -1, w = -1, lr = -1, lw = -1, port = -1;
        char addr[64] = "", tok[64] = "";
        CHECKF(read_file("env", i, b, sizeof b), "rank %d wrote nothing", i);
        if (sscanf(b, "%d %d %d %d %63s %d %63s", &r, &w, &lr, &lw, addr, &port, tok) != 7) {
            CHECKF(0, "rank %d saw \"%s\"", i, b);
            continue;
        }
        CHECKF(r == i && w == 4 && lr == i && lw == 4, "rank %d saw \"%s\"", i, b);
        CHECKF(!strcmp(addr, "127.0.0.1") && port > 0 && port <= 65535, "rank %d saw \"%s\"", i, b);
        CHECKF(strlen(tok) == 16 && strcmp(tok, "(none)"), "rank %d's token is \"%s\"", i, tok);
        if (i == 0) snprintf(tok0, sizeof tok0, "%s", tok);
        else CHECKF(!strcmp(tok, tok0), "rank %d's token %s differs from rank 0's %s", i, tok, tok0);
    }
    check_all_gone(4);
    CHECK(getenv("RANK") == NULL); /* the parent's environment is untouched */
}

/* What ddp_spawn itself writes to stderr while it runs (its ranks' lines too), into out. */
static ddp_status spawn_stderr(int n, spawn_arg* a, char* out, size_t cap) {
    char path[96];
    int fd, saved = dup(2);
    ssize_t k;
    ddp_status s;
    snprintf(path, sizeof path, "%s/stderr", g_tmp);
    fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    out[0] = 0;
    if (fd < 0 || saved < 0) return DDP_ERR_IO;
    fflush(stderr);
    dup2(fd, 2);
    s = ddp_spawn(n, spawn_fn, a);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    k = pread(fd, out, cap - 1, 0);
    out[k > 0 ? k : 0] = 0;
    close(fd);
    return s;
}

static void spawn_failing_rank_stops_the_others(void) {
    spawn_arg a = {SPAWN_FAIL_RANK2, 4};
    double t0, dt;
    char err[4096];
    clear_env();
    clear_tmp();
    setenv("DDP_KILL_GRACE_S", "1", 1);
    t0 = now_s();
    CHECK_FAILS(spawn_stderr(4, &a, err, sizeof err), DDP_ERR_LAUNCH, "rank 2 exited with status 3");
    /* a rank that exits says why itself: ddp_spawn adds nothing */
    CHECKF(!strstr(err, "ddp_spawn:"), "ddp_spawn wrote: %s", err);
    dt = now_s() - t0;
    CHECKF(dt < 5.0, "ddp_spawn took %.1f s", dt);
    check_all_gone(4);
    clear_env();
}

static void spawn_rank_killed_by_signal(void) {
    spawn_arg a = {SPAWN_SIGKILL_RANK1, 3};
    char err[4096];
    clear_env();
    clear_tmp();
    setenv("DDP_KILL_GRACE_S", "1", 1);
    CHECK_FAILS(spawn_stderr(3, &a, err, sizeof err), DDP_ERR_LAUNCH, "rank 1 was killed by signal 9 (SIGKILL)");
    /* the rank could not say it (the OOM killer's way): ddp_spawn does, as ddprun would, so that a
       program that only returns 1 does not end silently */
    CHECKF(strstr(err, "ddp_spawn: rank 1 was killed by signal 9 (SIGKILL); stopped the other ranks\n") != NULL,
           "stderr: %s", err);
    check_all_gone(3);
    clear_env();
}

static void spawn_sigterm_ignored_gets_sigkill(void) {
    spawn_arg a = {SPAWN_IGNORE_TERM, 2};
    double t0, dt;
    clear_env();
    clear_tmp();
    setenv("DDP_KILL_GRACE_S", "1", 1);
    t0 = now_s();
    CHECK_FAILS(ddp_spawn(2, spawn_fn, &a), DDP_ERR_LAUNCH, "rank 0 exited with status 1");
    dt = now_s() - t0;
    CHECKF(dt >= 0.9 && dt < 5.0, "ddp_spawn took %.2f s; expected the 1 s grace period, then SIGKILL", dt);
    check_all_gone(2);
    clear_env();
}

static void spawn_bad_arguments(void) {
    spawn_arg a = {SPAWN_REPORT, 1};
    CHECK_FAILS(ddp_spawn(0, spawn_fn, &a), DDP_ERR_INVALID_ARGUMENT, "nproc=0");
    CHECK_FAILS(ddp_spawn(257, spawn_fn, &a), DDP_ERR_INVALID_ARGUMENT, "nproc=257");
    CHECK_FAILS(ddp_spawn(2, NULL, &a), DDP_ERR_INVALID_ARGUMENT, "fn");
}

/* Binding ranks to cores (ddp__bind_plan, what ddp_init applies on Linux): whole physical cores,
   so that no two ranks share one core's hyper-threads, and a rank on a GPU among the cores next to
   that GPU. */
static void bind_plan_whole_cores_near_the_gpu(void) {
    ddp__cpu_core ht[8], numa[16];
    unsigned char node0[DDP__BIND_MAXCPU], node1[DDP__BIND_MAXCPU];
    int out[16], i, r, m;
    /* 4 cores with 2 threads each, numbered as Linux does on most x86 machines: CPU i and CPU i+4
       are the two threads of core i */
    for (i = 0; i < 8; i++) ht[i].cpu = i, ht[i].core = i % 4;
    for (r = 0; r < 4; r++) {
        m = ddp__bind_plan(ht, 8, NULL, r, 4, out);
        CHECKF(m == 2 && out[0] == r && out[1] == r + 4, "4 ranks on 4 cores x 2 threads: rank %d got %d CPUs (%d, %d), "
               "want both threads of core %d (CPUs %d and %d)", r, m, out[0], m > 1 ? out[1] : -1, r, r, r + 4);
    }
    m = ddp__bind_plan(ht, 8, NULL, 1, 2, out);
    CHECKF(m == 4 && out[0] == 2 && out[1] == 3 && out[2] == 6 && out[3] == 7,
           "2 ranks: rank 1 got %d CPUs starting %d, want cores 2 and 3 (CPUs 2, 3, 6, 7)", m, out[0]);
    CHECK(ddp__bind_plan(ht, 8, NULL, 0, 5, out) == 0); /* more ranks than cores: no binding */
    /* two NUMA nodes of 8 cores, GPUs 0-1 next to node 0 and 2-3 next to node 1: the two ranks of
       each node split its cores */
    for (i = 0; i < 16; i++) numa[i].cpu = i, numa[i].core = i;
    CHECK(ddp__cpulist("0-7", node0) == 8 && ddp__cpulist("8-11,12-15\n", node1) == 8);
    m = ddp__bind_plan(numa, 16, node1, 1, 2, out);
    CHECKF(m == 4 && out[0] == 12 && out[3] == 15, "rank 3 (second near GPU 3's node): got %d CPUs from %d, want 12-15",
           m, out[0]);
    m = ddp__bind_plan(numa, 16, node0, 0, 2, out);
    CHECKF(m == 4 && out[0] == 0 && out[3] == 3, "rank 0 (first near GPU 0's node): got %d CPUs from %d, want 0-3", m,
           out[0]);
}

/* Masks a launcher set before ddp_init (ddp__bind_group): only local ranks that share one mask
   exactly split it; a mask of a rank's own (SLURM --cpu-bind, mpirun --bind-to) is kept whole, and
   so is one that overlaps another rank's without being equal. Each mask as a CPU list. */
static void set_mask(unsigned long* m, const char* cpus) {
    unsigned char flags[DDP__BIND_MAXCPU];
    const int bits = (int)(8 * sizeof m[0]);
    int i;
    memset(m, 0, DDP__BIND_WORDS * sizeof m[0]);
    ddp__cpulist(cpus, flags);
    for (i = 0; i < DDP__BIND_MAXCPU && i < DDP__BIND_WORDS * bits; i++)
        if (flags[i]) m[i / bits] |= 1ul << (i % bits);
}
static void bind_group_respects_the_launcher(void) {
    unsigned long masks[4][DDP__BIND_WORDS];
    ddp__cpu_core cpus[48];
    char text[256];
    int r, k, index, group, out[48], m, n;
    /* SLURM, --cpus-per-task=12 --cpu-bind=cores on a 48-CPU node: each of the 4 ranks keeps its 12 */
    for (r = 0; r < 4; r++) {
        snprintf(text, sizeof text, "%d-%d", 12 * r, 12 * r + 11);
        set_mask(masks[r], text);
    }
    for (r = 0; r < 4; r++) {
        k = ddp__bind_group((const unsigned long(*)[DDP__BIND_WORDS])masks, 4, r, &index, &group);
        CHECKF(k == DDP__BIND_OWN && group == 1, "SLURM per-task masks: rank %d got kind %d, group %d; want its own "
               "mask kept (kind %d)", r, k, group, DDP__BIND_OWN);
        ddp__mask_text(masks[r], text, sizeof text);
        CHECKF(atoi(text) == 12 * r && strchr(text, '-') && atoi(strchr(text, '-') + 1) == 12 * r + 11,
               "rank %d's mask reads \"%s\", want %d-%d", r, text, 12 * r, 12 * r + 11);
    }
    /* taskset -c 0-7 around a launcher of 4 ranks: all share 0-7, and rank r takes CPUs 2r, 2r+1 */
    for (r = 0; r < 4; r++) set_mask(masks[r], "0-7");
    for (r = 0; r < 8; r++) cpus[r].cpu = r, cpus[r].core = r;
    for (r = 0; r < 4; r++) {
        k = ddp__bind_group((const unsigned long(*)[DDP__BIND_WORDS])masks, 4, r, &index, &group);
        m = ddp__bind_plan(cpus, 8, NULL, index, group, out);
        CHECKF(k == DDP__BIND_SPLIT && index == r && group == 4 && m == 2 && out[0] == 2 * r && out[1] == 2 * r + 1,
               "one shared mask 0-7: rank %d got kind %d, share %d of %d, %d CPUs from %d; want CPUs %d and %d", r, k,
               index, group, m, m ? out[0] : -1, 2 * r, 2 * r + 1);
    }
    /* numactl per socket: ranks 0-1 on CPUs 0-63, ranks 2-3 on 64-127 (the mask's second word on a
       64-bit machine): each pair splits its own socket */
    set_mask(masks[0], "0-63"), set_mask(masks[1], "0-63"), set_mask(masks[2], "64-127"), set_mask(masks[3], "64-127");
    for (r = 0; r < 4; r++) {
        k = ddp__bind_group((const unsigned long(*)[DDP__BIND_WORDS])masks, 4, r, &index, &group);
        CHECKF(k == DDP__BIND_SPLIT && index == r % 2 && group == 2, "a mask per socket: rank %d got kind %d, share "
               "%d of %d; want share %d of 2", r, k, index, group, r % 2);
    }
    for (n = 0; n < 48; n++) cpus[n].cpu = 64 + n, cpus[n].core = n; /* the first 48 of the second socket */
    m = ddp__bind_plan(cpus, 48, NULL, 1, 2, out);
    CHECKF(m == 24 && out[0] == 88, "rank 3, second of the second socket: %d CPUs from %d, want 24 from 88", m, out[0]);
    /* taskset per rank with overlapping sets: someone else's plan, kept */
    set_mask(masks[0], "0-7"), set_mask(masks[1], "4-11");
    k = ddp__bind_group((const unsigned long(*)[DDP__BIND_WORDS])masks, 2, 1, &index, &group);
    CHECKF(k == DDP__BIND_OVERLAP, "masks 0-7 and 4-11: kind %d, want kept as overlapping (%d)", k, DDP__BIND_OVERLAP);
    set_mask(masks[0], "0-3,8,10-11");
    ddp__mask_text(masks[0], text, sizeof text);
    CHECKF(!strcmp(text, "0-3,8,10-11"), "a mask as text: \"%s\", want \"0-3,8,10-11\"", text);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ddp_test_env_XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(bind_plan_whole_cores_near_the_gpu);
    RUN(bind_group_respects_the_launcher);
    RUN(env_default_single_process);
    RUN(env_precedence);
    RUN(env_torchrun);
    RUN(env_openmpi);
    RUN(env_slurm);
    RUN(env_explicit);
    RUN(env_errors_rank_and_world);
    RUN(env_errors_local);
    RUN(env_errors_master);
    RUN(env_errors_openmpi_slurm);
    RUN(slurm_first_host_forms);
    RUN(env_sets_log_prefix);
    RUN(label_before_init);
    RUN(spawn_four_ranks_see_their_env);
    RUN(spawn_failing_rank_stops_the_others);
    RUN(spawn_rank_killed_by_signal);
    RUN(spawn_sigterm_ignored_gets_sigkill);
    RUN(spawn_bad_arguments);
    h_remove_tree(g_tmp);
    return H_EXIT();
}
