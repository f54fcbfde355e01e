/* The process group on a GPU: the NCCL backend with one rank (NCCL refuses two ranks on one
   GPU), through ncclAllReduce and through the hand-written ring (DDP_NCCL_RING=1); and several
   ranks sharing one GPU on the CPU backend, their buffers staged through pinned memory.
   Skipped with the reason where there is no GPU; make test-gpu (DDP_REQUIRE_GPU=1) fails instead.
   The parent never touches CUDA itself: ranks are forked, and a process that forks after using
   CUDA leaves its children unable to use it. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

/* How many GPUs, and why none, asked in a throwaway child so that this process stays CUDA-free. */
static int g_gpus;
static char g_why[256];
static void probe(void) {
    int p[2], st;
    pid_t pid;
    if (pipe(p) != 0) return;
    pid = fork();
    if (pid == 0) {
        char msg[300];
        int n = ddp_cuda_device_count();
        snprintf(msg, sizeof msg, "%d %s", n, ddp_cuda_unavailable_reason());
        if (write(p[1], msg, strlen(msg) + 1) < 0) _exit(1);
        _exit(0);
    }
    close(p[1]);
    {
        char msg[300] = "";
        ssize_t k = read(p[0], msg, sizeof msg - 1);
        if (k > 0) {
            msg[k] = 0;
            g_gpus = atoi(msg);
            snprintf(g_why, sizeof g_why, "%s", strchr(msg, ' ') ? strchr(msg, ' ') + 1 : "");
        }
    }
    close(p[0]);
    waitpid(pid, &st, 0);
}

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
    d.device.type = DDP_DEVICE_CUDA;
    d.device.index = 0; /* every rank on GPU 0: the CPU backend allows it, NCCL needs one rank */
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
            ddp_convert(cpu, t, h16, DDP_F32, host, n, NULL);
            ddp_copy(ddp_pg_device(pg), dbuf, cpu, t == DDP_F32 ? (void*)host : (void*)h16, n * es, NULL);
            if (ddp_all_reduce(pg, dbuf, n, t, ops[oi], NULL) != DDP_OK) {
                printf("    rank %d all_reduce %s %s: %s\n", rank, ddp_dtype_name(t), ddp__op_name(ops[oi]),
                       ddp_error_string());
                bad++;
                continue;
            }
            ddp_copy(cpu, t == DDP_F32 ? (void*)host : (void*)h16, ddp_pg_device(pg), dbuf, n * es, NULL);
            if (t != DDP_F32) ddp_convert(cpu, DDP_F32, host, t, h16, n, NULL);
            for (i = 0; i < n; i++) {
                double want = 0, mx = -1e30;
                for (r = 0; r < W; r++) want += value(r, i), mx = value(r, i) > mx ? value(r, i) : mx;
                if (ops[oi] == DDP_AVG) want /= W;
                if (ops[oi] == DDP_MAX) want = mx;
                /* sums of small integers are exact; an average rounds once */
                if (fabs(host[i] - want) > (ops[oi] == DDP_AVG ? fabs(want) * (t == DDP_F32 ? 1e-6 : 1e-2) : 0)) {
                    printf("    rank %d all_reduce %s %s: element %zu is %g, expected %g\n", rank, ddp_dtype_name(t),
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
        if (ddp_broadcast(pg, dbuf, n, DDP_F32, W - 1, NULL) != DDP_OK) bad++;
        ddp_copy(cpu, host, ddp_pg_device(pg), dbuf, n * 4, NULL);
        for (i = 0; i < n; i++) if (host[i] != value(W - 1, i)) { bad++; printf("    rank %d broadcast wrong\n", rank); break; }
        for (i = 0; i < n; i++) host[i] = value(ddp_rank(pg), i);
        ddp_copy(ddp_pg_device(pg), dbuf, cpu, host, n * 4, NULL);
        if (ddp_all_gather(pg, dbuf, dbuf2, n, DDP_F32, NULL) != DDP_OK) bad++;
        ddp_copy(cpu, host, ddp_pg_device(pg), dbuf2, n * 4 * (size_t)W, NULL);
        for (i = 0; i < n * (size_t)W; i++) if (host[i] != value((int)(i / n), i % n)) { bad++; printf("    rank %d all_gather wrong\n", rank); break; }
        for (i = 0; i < n * (size_t)W; i++) host[i] = value(ddp_rank(pg), i);
        ddp_copy(ddp_pg_device(pg), dbuf, cpu, host, n * 4 * (size_t)W, NULL);
        if (ddp_reduce_scatter(pg, dbuf, dbuf2, n, DDP_F32, DDP_SUM, NULL) != DDP_OK) bad++;
        ddp_copy(cpu, host, ddp_pg_device(pg), dbuf2, n * 4, NULL);
        for (i = 0; i < n; i++) {
            double want = 0;
            for (r = 0; r < W; r++) want += value(r, (size_t)ddp_rank(pg) * n + i);
            if (host[i] != want) { bad++; printf("    rank %d reduce_scatter wrong\n", rank); break; }
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
static void nccl_one_rank_own_ring(void) {
    ddp_backend b = DDP_BACKEND_NCCL;
    NEED_GPU();
    setenv("DDP_NCCL_RING", "1", 1);
    CHECK_OK(ddp_spawn(1, gpu_rank, &b));
    unsetenv("DDP_NCCL_RING");
}
static void cpu_backend_gpu_buffers_3_ranks(void) {
    ddp_backend b = DDP_BACKEND_CPU;
    NEED_GPU();
    CHECK_OK(ddp_spawn(3, gpu_rank, &b));
}

int main(void) {
    probe();
    RUN(nccl_one_rank_library);
    RUN(nccl_one_rank_own_ring);
    RUN(cpu_backend_gpu_buffers_3_ranks);
    return H_EXIT();
}
