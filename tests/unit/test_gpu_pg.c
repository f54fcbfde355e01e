/* The process group on a GPU: the NCCL backend with one rank, and with 2, 3 and 4 ranks where
   there is a GPU for each (NCCL refuses two ranks on one GPU; the GPU stand-in of make test shows
   four), through ncclAllReduce and through the hand-written ring (DDP_NCCL_RING=1, which needs two
   ranks or more to take a step); and several ranks on the CPU backend with GPU buffers, staged
   through pinned memory (ranks share GPU 0 when there is only one). With one rank, an all-reduce
   or broadcast leaves its buffer as it was, so those values cannot show that the collective ran;
   the all-gather and reduce-scatter, which write another buffer, can.
   Skipped with the reason where there is no GPU; make test-gpu (DDP_REQUIRE_GPU=1) fails instead.
   The parent never touches CUDA itself: ranks are forked, and a process that forks after using
   CUDA leaves its children unable to use it. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

static int g_gpus;
static char g_why[256];

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (g_gpus == 0) {                                                                         \
            const char* req_ = getenv("DDP_REQUIRE_GPU");                                         \
            if (req_ && *req_ == '1') {                                                            \
                h_failf(__FILE__, __LINE__, "make test-gpu needs a GPU: %s", g_why);              \
                return;                                                                            \
            }                                                                                      \
            SKIP("no GPU: %s", g_why);                                                             \
        }                                                                                          \
    } while (0)

/* Rank r's element i: small integers, exact in every dtype and in every sum here. */
static float value(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 3) % 17) - 8); }

/* An all-gather from ag_send into ag_recv (W*n), then a reduce-scatter from rs_send (W*n) into
   rs_recv, of f32 GPU buffers, checked on the host (n*W floats of room). Returns failures. */
static int gather_and_scatter(ddp_pg* pg, float* host, void* ag_send, void* ag_recv, void* rs_send, void* rs_recv,
                              size_t n, const char* how) {
    const ddp_device cpu = {DDP_DEVICE_CPU, 0}, dev = ddp_pg_device(pg);
    const int W = ddp_world_size(pg), me = ddp_rank(pg);
    size_t i;
    int r;
    for (i = 0; i < n; i++) host[i] = value(me, i);
    ddp_copy(dev, ag_send, cpu, host, n * 4, NULL);
    if (ddp_all_gather(pg, ag_send, ag_recv, n, DDP_F32, NULL) != DDP_OK) return 1;
    ddp_copy(cpu, host, dev, ag_recv, n * 4 * (size_t)W, NULL);
    for (i = 0; i < n * (size_t)W; i++)
        if (host[i] != value((int)(i / n), i % n)) {
            printf("    rank %d %sall_gather wrong\n", me, how);
            return 1;
        }
    for (i = 0; i < n * (size_t)W; i++) host[i] = value(me, i);
    ddp_copy(dev, rs_send, cpu, host, n * 4 * (size_t)W, NULL);
    if (ddp_reduce_scatter(pg, rs_send, rs_recv, n, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
    ddp_copy(cpu, host, dev, rs_recv, n * 4, NULL);
    for (i = 0; i < n; i++) {
        double want = 0;
        for (r = 0; r < W; r++) want += value(r, (size_t)me * n + i);
        if (host[i] != want) {
            printf("    rank %d %sreduce_scatter wrong\n", me, how);
            return 1;
        }
    }
    return 0;
}

/* One rank: every collective with GPU buffers, checked on the host. Returns failures. */
static int gpu_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    const ddp_dtype types[3] = {DDP_F32, DDP_F16, DDP_BF16};
    const ddp_reduce_op ops[3] = {DDP_SUM, DDP_AVG, DDP_MAX};
    const size_t n = 100003;
    int bad = 0, W, ti, oi, r;
    void *dbuf = NULL, *dbuf2 = NULL;
    float* host = (float*)malloc(n * 4 * 8);
    uint16_t* h16 = (uint16_t*)malloc(n * 2 * 8);
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    memset(&d, 0, sizeof d);
    d.backend = *(const ddp_backend*)arg;
    d.device.type = DDP_DEVICE_CUDA; /* "cuda": this rank's GPU, LOCAL_RANK modulo the GPUs there are */
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) {
        printf("    rank %d: ddp_init: %s\n", rank, ddp_error_string());
        return 1;
    }
    W = ddp_world_size(pg);
    if (ddp_alloc(ddp_pg_device(pg), n * 4 * (size_t)W, &dbuf) != DDP_OK ||
        ddp_alloc(ddp_pg_device(pg), n * 4 * (size_t)W, &dbuf2) != DDP_OK) {
        printf("    rank %d: ddp_alloc: %s\n", rank, ddp_error_string());
        return 1;
    }
    for (ti = 0; ti < 3; ti++) {
        ddp_dtype t = types[ti];
        size_t es = ddp_dtype_size(t), i;
        for (oi = 0; oi < 3; oi++) {
            for (i = 0; i < n; i++) host[i] = value(ddp_rank(pg), i);
            ddp__convert(cpu, t, h16, DDP_F32, host, n, NULL);
            ddp_copy(ddp_pg_device(pg), dbuf, cpu, t == DDP_F32 ? (void*)host : (void*)h16, n * es, NULL);
            if (ddp_all_reduce(pg, dbuf, n, t, ops[oi], NULL) != DDP_OK) {
                printf("    rank %d all_reduce %s %s: %s\n", rank, ddp__dtype_name(t), ddp__op_name(ops[oi]),
                       ddp_error_string());
                bad++;
                continue;
            }
            ddp_copy(cpu, t == DDP_F32 ? (void*)host : (void*)h16, ddp_pg_device(pg), dbuf, n * es, NULL);
            if (t != DDP_F32) ddp__convert(cpu, DDP_F32, host, t, h16, n, NULL);
            for (i = 0; i < n; i++) {
                double want = 0, mx = -1e30;
                for (r = 0; r < W; r++) want += value(r, i), mx = value(r, i) > mx ? value(r, i) : mx;
                if (ops[oi] == DDP_AVG) want /= W;
                if (ops[oi] == DDP_MAX) want = mx;
                /* Sums of small integers are exact. An average rounds: NCCL scales each rank's value
                   by 1/W (rounded) and adds them up (each sum rounded), so in a 16-bit type the
                   error is at most W roundings, each of half a unit in the last place of a value
                   up to 8 in magnitude. */
                double u = t == DDP_F16 ? 0x1p-11 : 0x1p-8;
                double tol = ops[oi] != DDP_AVG ? 0 : t == DDP_F32 ? 1e-6 * fabs(want) : W * u * 4;
                if (fabs(host[i] - want) > tol) {
                    printf("    rank %d all_reduce %s %s: element %zu is %g, expected %g\n", rank, ddp__dtype_name(t),
                           ddp__op_name(ops[oi]), i, host[i], want);
                    bad++;
                    break;
                }
            }
        }
    }
    /* broadcast from the last rank, all-gather and reduce-scatter in f32 */
    {
        size_t i;
        for (i = 0; i < n; i++) host[i] = value(ddp_rank(pg), i);
        ddp_copy(ddp_pg_device(pg), dbuf, cpu, host, n * 4, NULL);
        if (ddp__broadcast(pg, dbuf, n, DDP_F32, W - 1, NULL) != DDP_OK) bad++;
        ddp_copy(cpu, host, ddp_pg_device(pg), dbuf, n * 4, NULL);
        for (i = 0; i < n; i++) if (host[i] != value(W - 1, i)) { bad++; printf("    rank %d broadcast wrong\n", rank); break; }
        bad += gather_and_scatter(pg, host, dbuf, dbuf2, dbuf, dbuf2, n, "");
    }
    /* NCCL's in-place layouts on GPU buffers (all-gather's send at this rank's slot of recv,
       reduce-scatter's recv at this rank's slot of send), and an overlap off them refused */
    {
        float* mine = (float*)dbuf2 + (size_t)ddp_rank(pg) * n;
        bad += gather_and_scatter(pg, host, mine, dbuf2, dbuf2, mine, n, "in-place ");
        if (ddp_all_gather(pg, mine + 1, dbuf2, n, DDP_F32, NULL) != DDP_ERR_INVALID_ARGUMENT) {
            bad++;
            printf("    rank %d: all_gather with send one element past its slot of recv was not refused\n", rank);
        }
    }
    /* a collective polled with ddp__work_test is reported done (within a generous bound), without a wait */
    {
        ddp_work* w = NULL;
        int done = 0;
        double t0 = ddp__now();
        if (ddp_all_reduce(pg, dbuf, n, DDP_F32, DDP_SUM, &w) != DDP_OK) {
            bad++;
        } else {
            while (!done && ddp__now() - t0 < 20 && ddp__work_test(w, &done) == DDP_OK)
                if (!done) ddp__sleep(1e-3);
            if (!done) printf("    rank %d: ddp__work_test never reported the all-reduce done\n", rank), bad++;
            if (ddp_work_wait(w) != DDP_OK) bad++;
        }
    }
    if (ddp_barrier(pg) != DDP_OK) bad++;
    ddp_free(ddp_pg_device(pg), dbuf);
    ddp_free(ddp_pg_device(pg), dbuf2);
    ddp_destroy(pg);
    free(host);
    free(h16);
    return bad ? 1 : 0;
}

static void nccl_one_rank_library(void) {
    ddp_backend b = DDP_BACKEND_NCCL;
    NEED_GPU();
    unsetenv("DDP_NCCL_RING");
    CHECK_OK(ddp_spawn(1, gpu_rank, &b));
}
/* W = 2, 3, 4 ranks on NCCL, each on its own GPU; ring: DDP_NCCL_RING=1. */
static void nccl_ranks(int ring) {
    ddp_backend b = DDP_BACKEND_NCCL;
    int W;
    NEED_GPU();
    if (g_gpus < 2) SKIP("NCCL with several ranks needs a GPU for each, and this machine has %d", g_gpus);
    if (ring) setenv("DDP_NCCL_RING", "1", 1);
    for (W = 2; W <= 4 && W <= g_gpus; W++) CHECKF(ddp_spawn(W, gpu_rank, &b) == DDP_OK, "%d ranks: %s", W, ddp_error_string());
    unsetenv("DDP_NCCL_RING");
}
static void nccl_several_ranks_library(void) { nccl_ranks(0); }

/* A peer that dies: rank 1 leaves at once; rank 0's all-reduce fails with NCCL's error, and its
   ddp_destroy returns (after the group's short deadline for the leaver) instead of waiting for a
   collective that can never finish. NCCL's rule: a communicator with an error is aborted, not
   destroyed. */
static int dead_peer_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    void* buf = NULL;
    ddp_status s;
    double t0;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CUDA;
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_s = 5;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    if (rank == 1) _exit(0); /* gone without a word, as a crashed process */
    if (ddp_alloc(ddp_pg_device(pg), 1 << 20, &buf) != DDP_OK) return 2;
    s = ddp_all_reduce(pg, buf, 1 << 18, DDP_F32, DDP_SUM, NULL);
    if (s == DDP_OK) {
        printf("    rank 0: the all-reduce succeeded without its peer\n");
        return 3;
    }
    t0 = ddp__now();
    ddp_free(ddp_pg_device(pg), buf);
    ddp_destroy(pg);
    printf("    rank 0: all_reduce failed with %s; ddp_destroy returned after %.1f s\n", ddp_status_name(s), ddp__now() - t0);
    return 0;
}
static void nccl_dead_peer_then_destroy(void) {
    NEED_GPU();
    if (g_gpus < 2) SKIP("NCCL with two ranks needs two GPUs, and this machine has %d", g_gpus);
    CHECK_OK(ddp_spawn(2, dead_peer_rank, NULL));
}
static void nccl_several_ranks_own_ring(void) { nccl_ranks(1); }

/* The fault drills over NCCL with 4 ranks. On one machine NCCL reports neither a peer that died
   nor mismatched collectives (the stand-in, by default, neither: FAKEGPU_NCCL_REPORT=1 makes it
   report them, and test_fakegpu.sh runs these cases both ways): ddp.h's own watchdog must.
   drill: 0 rank 2's process ends in the middle of the job, at the default deadline (300 s): the
   others fail with DDP_ERR_PEER_LOST naming it within 10 s; 1 rank 1 stops (SIGSTOP), deadline 3 s:
   the others fail with DDP_ERR_TIMEOUT naming rank 1 as silent within 3 + 5 s, and rank 0 then
   lets it go on (SIGCONT); 2 rank 1 calls a broadcast where the others all-reduce, deadline 3 s:
   every rank fails with DDP_ERR_DESYNC naming both collectives and who calls which; 3 rank 2 stops
   before ddp_destroy, deadline 3 s: the others' ddp_destroy (NCCL's teardown waits for the node's
   ranks) returns within 3 + 2 s; 4 as 0, but the survivors free a GPU buffer while their
   all-reduce is in flight: cudaFree waits for the stuck collective, so ddp_free must drain it with
   the watchdog (PEER_LOST within 10 s from ddp_work_wait after it), not wait for ever. */
typedef struct drill { int kind; char pidfile[256]; } drill;
static int drill_rank(int rank, void* arg) {
    const drill* dr = (const drill*)arg;
    const size_t n = 1 << 14;
    ddp_desc d;
    ddp_pg* pg;
    void* buf = NULL;
    ddp_status s = DDP_OK;
    double t0 = 0, took, limit = dr->kind == 0 || dr->kind == 4 ? 10 : 8;
    int i;
    const char* want[5] = {"rank 2 has ended while this rank waited", "rank(s) 1 did not say", "rank 1 in broadcast #3",
                           "", "rank 2 has ended while this rank waited"};
    ddp_status want_s[5] = {DDP_ERR_PEER_LOST, DDP_ERR_TIMEOUT, DDP_ERR_DESYNC, DDP_OK, DDP_ERR_PEER_LOST};
    void* extra = NULL;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CUDA;
    d.backend = DDP_BACKEND_NCCL;
    d.timeout_s = dr->kind == 0 || dr->kind == 4 ? 0 : 3;
    if (ddp_init(&d, &pg) != DDP_OK || ddp_alloc(ddp_pg_device(pg), n * 4, &buf) != DDP_OK) return 1;
    if (dr->kind == 4 && ddp_alloc(ddp_pg_device(pg), 4096, &extra) != DDP_OK) return 1;
    for (i = 0; i < 3 && s == DDP_OK; i++) {
        if (i == 2 && (dr->kind == 0 || dr->kind == 4) && rank == 2) _exit(0); /* gone without a word */
        if (i == 2 && dr->kind == 1 && rank == 1) {
            FILE* f = fopen(dr->pidfile, "w");
            if (f) fprintf(f, "%ld\n", (long)getpid()), fclose(f);
            raise(SIGSTOP);
        }
        t0 = ddp__now();
        if (i == 2 && dr->kind == 2 && rank == 1) s = ddp__broadcast(pg, buf, n, DDP_F32, 0, NULL);
        else if (i == 2 && dr->kind == 4) { /* a free while the collective is in flight */
            ddp_work* w = NULL;
            s = ddp_all_reduce(pg, buf, n, DDP_F32, DDP_SUM, &w);
            ddp_free(ddp_pg_device(pg), extra);
            if (rank == 0) printf("    rank 0: ddp_free returned after %.1f s\n", ddp__now() - t0);
            if (s == DDP_OK) s = ddp_work_wait(w);
        } else s = ddp_all_reduce(pg, buf, n, DDP_F32, DDP_SUM, NULL);
    }
    took = ddp__now() - t0;
    if (dr->kind == 3) { /* all collectives done; rank 2 stops before leaving */
        if (s != DDP_OK) {
            printf("    rank %d: a collective failed before the drill: %s\n", rank, ddp_error_string());
            return 4;
        }
        ddp_free(ddp_pg_device(pg), buf);
        if (rank == 2) {
            FILE* f = fopen(dr->pidfile, "w");
            if (f) fprintf(f, "%ld\n", (long)getpid()), fclose(f);
            raise(SIGSTOP);
        }
        while (rank != 2 && access(dr->pidfile, F_OK) != 0) ddp__sleep(0.01);
        ddp__sleep(0.2); /* (rank 2 is stopped by now) */
        t0 = ddp__now();
        ddp_destroy(pg);
        took = ddp__now() - t0;
        if (rank == 0) {
            long pid = 0;
            FILE* f = fopen(dr->pidfile, "r");
            if (!f || fscanf(f, "%ld", &pid) != 1) pid = 0;
            if (f) fclose(f);
            if (pid > 0) kill((pid_t)pid, SIGCONT);
        }
        if (rank != 2 && took > 5) {
            printf("    rank %d: ddp_destroy with a stopped neighbour took %.1f s (deadline 3 s)\n", rank, took);
            return 5;
        }
        if (rank == 0) printf("    rank 0: ddp_destroy returned after %.1f s with rank 2 stopped\n", took);
        return 0;
    }
    if (dr->kind == 1 && rank == 1) { /* went on after the others gave up: its own collective fails too */
        ddp_destroy(pg);
        return s == DDP_OK ? 2 : 0;
    }
    if (dr->kind == 1 && rank == 0) { /* let the stopped rank go on */
        long pid = 0;
        FILE* f = fopen(dr->pidfile, "r");
        if (!f || fscanf(f, "%ld", &pid) != 1) pid = 0;
        if (f) fclose(f);
        if (pid > 0) kill((pid_t)pid, SIGCONT);
    }
    if (s != want_s[dr->kind] || !strstr(ddp_error_string(), want[dr->kind]) || took > limit) {
        printf("    rank %d: want %s (\"%s\") within %.0f s; got %s after %.1f s: %s\n", rank,
               ddp_status_name(want_s[dr->kind]), want[dr->kind], limit, ddp_status_name(s), took, ddp_error_string());
        return 3;
    }
    if (rank == 0) printf("    rank 0: %s after %.1f s: %.200s\n", ddp_status_name(s), took, ddp_error_string());
    ddp_free(ddp_pg_device(pg), buf);
    ddp_destroy(pg);
    return 0;
}
static void nccl_drill(int kind) {
    drill dr;
    int report;
    NEED_GPU();
    if (g_gpus < 4) SKIP("the drill runs 4 ranks on NCCL, one GPU each, and this machine has %d", g_gpus);
    memset(&dr, 0, sizeof dr);
    dr.kind = kind;
    snprintf(dr.pidfile, sizeof dr.pidfile, "%s/ddp_drill_%ld.pid", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
    unsetenv("DDP_TIMEOUT");
    /* On the stand-in: NCCL reports nothing (as on hardware), then it reports the fault too; and for
       the drills where the communicator's mode matters (waits, teardown), a blocking communicator
       (DDP_NCCL_BLOCKING=1), whose teardown cannot finalize with a deadline. */
    for (report = 0; report <= (getenv("FAKEGPU_DEVICES") ? 2 : 0); report++) {
        if (report == 2 && kind != 0 && kind != 1 && kind != 3) break;
        if (report == 1) setenv("FAKEGPU_NCCL_REPORT", "1", 1);
        else unsetenv("FAKEGPU_NCCL_REPORT");
        if (report == 2) setenv("DDP_NCCL_BLOCKING", "1", 1);
        remove(dr.pidfile);
        CHECKF(ddp_spawn(4, drill_rank, &dr) == DDP_OK, "%s: %s",
               report == 1 ? "with FAKEGPU_NCCL_REPORT=1 (NCCL reports the fault too)"
               : report == 2 ? "a blocking communicator (DDP_NCCL_BLOCKING=1), NCCL reports nothing"
                             : "NCCL reports nothing",
               ddp_error_string());
    }
    unsetenv("FAKEGPU_NCCL_REPORT");
    unsetenv("DDP_NCCL_BLOCKING");
    remove(dr.pidfile);
}
static void nccl_ended_peer_named(void) { nccl_drill(0); }
static void nccl_stopped_peer_named_at_deadline(void) { nccl_drill(1); }
static void nccl_mismatch_named_at_deadline(void) { nccl_drill(2); }
static void nccl_destroy_with_stopped_neighbour(void) { nccl_drill(3); }
static void nccl_free_behind_a_stuck_collective(void) { nccl_drill(4); }
static void cpu_backend_gpu_buffers_3_ranks(void) {
    ddp_backend b = DDP_BACKEND_CPU;
    NEED_GPU();
    CHECK_OK(ddp_spawn(3, gpu_rank, &b));
}

/* DDP with its buffers on the GPU (CPU backend: every rank may share GPU 0) trains the same
   weights as one process on the CPU over the whole batch: bit-identical across ranks, and within
   float tolerance of the CPU reference (cuBLAS and the CPU BLAS sum in different orders). Rank 0
   also computes the reference, since the parent must stay free of CUDA. */
static char g_dir[64];
enum { EQ_STEPS = 30, EQ_B = 12, EQ_F = 6 };
static void eq_batch(int step, float* x, int* y) {
    ddp_rng r = ddp_rng_seed(500 + (uint64_t)step);
    int i;
    for (i = 0; i < EQ_B * EQ_F; i++) x[i] = 2.f * ddp_rng_uniform(&r) - 1.f;
    for (i = 0; i < EQ_B; i++) y[i] = (int)ddp_rng_below(&r, 3);
}
static void eq_save(ddp_model* m, const char* path) {
    FILE* f = fopen(path, "wb");
    int i;
    float* host;
    if (!f) return;
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        ddp_device cpu = {DDP_DEVICE_CPU, 0};
        host = (float*)malloc(p->count * 4);
        /* on the model's stream, after the optimizer's kernels, and waited for */
        ddp_copy(cpu, host, p->device, p->data, p->count * 4, ddp_model_stream(m));
        ddp_stream_sync(ddp_model_stream(m));
        fwrite(host, 4, p->count, f);
        free(host);
    }
    fclose(f);
}
static int eq_train(ddp_model* m, ddp_wrapper* w, int rank, int W, const char* save) {
    ddp_optim_desc od;
    ddp_optim* o = NULL;
    float x[EQ_B * EQ_F], loss;
    int y[EQ_B], step, per = EQ_B / W, row = rank * per;
    (void)w;
    memset(&od, 0, sizeof od);
    od.kind = DDP_SGD, od.lr = 0.1f, od.momentum = 0.9f;
    if (ddp_optim_create(m, &od, &o) != DDP_OK) return 1;
    for (step = 0; step < EQ_STEPS; step++) {
        eq_batch(step, x, y);
        if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x + (size_t)row * EQ_F, per) != DDP_OK ||
            ddp_loss_cross_entropy(m, y + row, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK ||
            ddp_optim_step(o) != DDP_OK) {
            printf("    rank %d step %d: %s\n", rank, step, ddp_error_string());
            return 1;
        }
    }
    eq_save(m, save); /* before ddp_optim_destroy, whose cudaFree would synchronise the GPU */
    ddp_optim_destroy(o);
    return 0;
}
static int eq_rank(int rank, void* arg) {
    int sizes[4] = {EQ_F, 10, 8, 3}, bad = 0;
    ddp_desc d;
    ddp_pg* pg;
    ddp_model_desc md;
    ddp_model* m;
    ddp_wrapper* w;
    char path[128];
    (void)arg;
    memset(&d, 0, sizeof d);
    d.backend = DDP_BACKEND_CPU;
    d.device.type = DDP_DEVICE_CUDA;
    if (ddp_init(&d, &pg) != DDP_OK) {
        printf("    rank %d: ddp_init: %s\n", rank, ddp_error_string());
        return 1;
    }
    memset(&md, 0, sizeof md);
    md.device = ddp_pg_device(pg);
    md.seed = 100 + (uint64_t)rank; /* rank 0's weights reach everyone through ddp_wrap */
    if (ddp_model_mlp(&md, sizes, 4, DDP_LAYER_RELU, &m) != DDP_OK || ddp_wrap(pg, m, NULL, &w) != DDP_OK) {
        printf("    rank %d: %s\n", rank, ddp_error_string());
        return 1;
    }
    snprintf(path, sizeof path, "%s/gpu%d.bin", g_dir, rank);
    bad += eq_train(m, w, ddp_rank(pg), ddp_world_size(pg), path);
    ddp_wrapper_destroy(w);
    ddp_model_destroy(m);
    if (rank == 0) { /* the reference: one process, the CPU, the whole batch */
        ddp_model* ref;
        md.device.type = DDP_DEVICE_CPU, md.device.index = 0, md.seed = 100;
        if (ddp_model_mlp(&md, sizes, 4, DDP_LAYER_RELU, &ref) != DDP_OK) return 1;
        snprintf(path, sizeof path, "%s/cpu.bin", g_dir);
        bad += eq_train(ref, NULL, 0, 1, path);
        ddp_model_destroy(ref);
    }
    ddp_destroy(pg);
    return bad;
}
static void equivalence_on_gpu_buffers(void) {
    float ref[512], got[512], first[512];
    size_t n, k, m;
    double num = 0, den = 0;
    int r;
    char path[128];
    FILE* f;
    NEED_GPU();
    snprintf(g_dir, sizeof g_dir, "/tmp/ddp_gpu_eq.XXXXXX");
    if (!mkdtemp(g_dir)) SKIP("cannot make a temporary folder");
    CHECK_OK(ddp_spawn(3, eq_rank, NULL));
    snprintf(path, sizeof path, "%s/cpu.bin", g_dir);
    f = fopen(path, "rb");
    n = f ? fread(ref, 4, 512, f) : 0;
    if (f) fclose(f);
    CHECK(n > 100);
    for (r = 0; r < 3; r++) {
        snprintf(path, sizeof path, "%s/gpu%d.bin", g_dir, r);
        f = fopen(path, "rb");
        m = f ? fread(r == 0 ? first : got, 4, 512, f) : 0;
        if (f) fclose(f);
        CHECKF(m == n, "rank %d saved %zu values, the reference %zu", r, m, n);
        if (r > 0) CHECKF(memcmp(first, got, n * 4) == 0, "rank %d's weights differ from rank 0's", r);
    }
    for (k = 0; k < n; k++) num += ((double)first[k] - ref[k]) * ((double)first[k] - ref[k]), den += (double)ref[k] * ref[k];
    printf("    GPU buffers, 3 ranks vs one CPU process: relative L2 difference %.3g\n", sqrt(num / den));
    CHECKF(sqrt(num / den) < 1e-4, "the GPU-buffer run differs from the CPU reference by %.3g relative", sqrt(num / den));
    h_remove_tree(g_dir);
}

int main(void) {
    g_gpus = h_gpus_in_child(g_why, sizeof g_why); /* this process stays free of CUDA */
    RUN(nccl_one_rank_library);
    RUN(nccl_several_ranks_library);
    RUN(nccl_several_ranks_own_ring);
    RUN(nccl_dead_peer_then_destroy);
    RUN(nccl_ended_peer_named);
    RUN(nccl_stopped_peer_named_at_deadline);
    RUN(nccl_mismatch_named_at_deadline);
    RUN(nccl_destroy_with_stopped_neighbour);
    RUN(nccl_free_behind_a_stuck_collective);
    RUN(cpu_backend_gpu_buffers_3_ranks);
    RUN(equivalence_on_gpu_buffers);
    return H_EXIT();
}
