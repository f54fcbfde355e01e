/* The stand-in's own tests: each strict behaviour must bite. A program that forgets a wait, reuses
   a non-blocking communicator too early, slips between row- and column-major, reads device memory
   on the host or launches a kernel with the wrong argument types must fail here, as it would on a
   GPU; the same programs written correctly must pass. Every case runs in a child process, since
   CUDA state does not survive fork. */
#define _GNU_SOURCE
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nvrtc.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "../unit/harness.h"

#define CU(call) CHECKF((call) == cudaSuccess, "%s failed: %s", #call, cudaGetErrorString(cudaGetLastError()))

/* Run fn in a child; its CHECK lines are printed there, its verdict comes back as the exit code. */
static void in_child(void (*fn)(void)) {
    pid_t pid;
    int st = 0;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        fn();
        fflush(stdout);
        _exit(h_case_failed ? 1 : h_case_skipped ? 2 : 0);
    }
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2) SKIP("%s", "see above");
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the case's process ended with %s %d",
           WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* Run fn in a child that must die of a segmentation fault (or be stopped by AddressSanitizer's
   report of one); its stderr must contain `want`, the stand-in's own account of the fault. */
static void must_fault(void (*fn)(void), const char* want) {
    int p[2], st = 0;
    char out[8192];
    size_t n = 0;
    ssize_t k;
    pid_t pid;
    if (pipe(p) != 0) SKIP("pipe failed");
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        fn();
        _exit(0); /* no fault: the parent fails the case */
    }
    close(p[1]);
    while (n < sizeof out - 1 && (k = read(p[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(p[0]);
    waitpid(pid, &st, 0);
    /* AddressSanitizer reports a fault itself, as a SEGV (or, near a thread's stack, a stack overflow) */
    CHECKF((WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) ||
           (WIFEXITED(st) && WEXITSTATUS(st) != 0 && (strstr(out, "SEGV") || strstr(out, "AddressSanitizer"))),
           "expected a segmentation fault, the child ended with %s %d; its stderr:\n%s", WIFEXITED(st) ? "status" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), out);
    CHECKF(strstr(out, want) != NULL, "its stderr lacks \"%s\":\n%s", want, out);
}

/* ---- memory ---- */

static void host_read_body(void) {
    float* d = NULL;
    volatile float x;
    cudaMalloc((void**)&d, 64);
    x = d[3]; /* a device pointer used on the host */
    (void)x;
}
static void host_read_of_device_memory_faults(void) {
    must_fault(host_read_body, "the host read or wrote device memory");
}

static void fresh_memory_is_nan_body(void) {
    float* d = NULL;
    float h[4];
    CU(cudaMalloc((void**)&d, sizeof h));
    CU(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECKF(h[0] != h[0], "fresh device memory reads %g, expected NaN (uninitialised)", h[0]);
    CU(cudaFree(d));
    CHECK(cudaFree(d) == cudaErrorInvalidValue); /* freed twice */
}
static void fresh_device_memory_is_not_zero(void) { in_child(fresh_memory_is_nan_body); }

/* ---- streams and events ---- */

/* s1 fills a buffer; s2 copies it out, with or without waiting for s1's event. */
static int g_wait_event;
static void event_order_body(void) {
    cudaStream_t s1, s2;
    cudaEvent_t e;
    float *d = NULL, *h = NULL;
    int i, stale = 0;
    CU(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CU(cudaMalloc((void**)&d, 4096));
    CU(cudaMallocHost((void**)&h, 4096));
    memset(h, 0, 4096);
    CU(cudaMemsetAsync(d, 0, 4096, s1)); /* 0.0f everywhere */
    CU(cudaEventRecord(e, s1));
    if (g_wait_event) CU(cudaStreamWaitEvent(s2, e, 0));
    CU(cudaMemcpyAsync(h, d, 4096, cudaMemcpyDeviceToHost, s2));
    CU(cudaStreamSynchronize(s2));
    for (i = 0; i < 1024; i++) stale += h[i] != 0.0f;
    if (g_wait_event) CHECKF(stale == 0, "with the event wait, %d of 1024 values are stale", stale);
    else CHECKF(stale == 1024, "without the event wait, only %d of 1024 values are stale", stale);
    CU(cudaStreamSynchronize(s1));
    CU(cudaFreeHost(h));
    CU(cudaFree(d));
}
static void missing_event_wait_reads_stale_data(void) {
    char seed[16];
    int s;
    for (s = 1; s <= 4; s++) {
        snprintf(seed, sizeof seed, "%d", s);
        setenv("FAKEGPU_SEED", seed, 1);
        g_wait_event = 0;
        in_child(event_order_body);
        g_wait_event = 1;
        in_child(event_order_body);
    }
    unsetenv("FAKEGPU_SEED");
}

/* cudaMemcpy from pageable memory returns before the copy lands, and cudaMemset at once: work on a
   non-blocking stream that does not wait sees the old bytes. */
static void pageable_copy_body(void) {
    cudaStream_t s;
    float *d = NULL, *h = NULL, src[256];
    int i, stale = 0;
    for (i = 0; i < 256; i++) src[i] = 1.0f;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaMalloc((void**)&d, sizeof src));
    CU(cudaMallocHost((void**)&h, sizeof src));
    CU(cudaMemcpy(d, src, sizeof src, cudaMemcpyHostToDevice));
    memset(src, 0, sizeof src); /* the source may be reused at once: it was staged */
    CU(cudaMemcpyAsync(h, d, sizeof src, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    for (i = 0; i < 256; i++) stale += h[i] != 1.0f;
    CHECKF(stale == 256, "a non-blocking stream saw %d of 256 values of an unfinished cudaMemcpy", 256 - stale);
    CU(cudaStreamSynchronize(0)); /* now it has landed */
    CU(cudaMemcpyAsync(h, d, sizeof src, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    for (i = 0, stale = 0; i < 256; i++) stale += h[i] != 1.0f;
    CHECKF(stale == 0, "after the legacy stream's sync, %d of 256 values are wrong", stale);
    CU(cudaFree(d));
    CU(cudaFreeHost(h));
}
static void pageable_cudaMemcpy_returns_before_it_lands(void) { in_child(pageable_copy_body); }

/* A blocking stream waits for the legacy default stream; a non-blocking one does not. */
static void legacy_body(void) {
    cudaStream_t b, nb;
    float *d = NULL, *h = NULL;
    CU(cudaStreamCreateWithFlags(&b, 0));
    CU(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    CU(cudaMalloc((void**)&d, 64));
    CU(cudaMallocHost((void**)&h, 64));
    CU(cudaMemset(d, 0, 64));
    CU(cudaMemcpyAsync(h, d, 64, cudaMemcpyDeviceToHost, nb));
    CU(cudaStreamSynchronize(nb));
    CHECKF(h[0] != 0.0f, "a non-blocking stream waited for the legacy stream's cudaMemset");
    CU(cudaMemcpyAsync(h, d, 64, cudaMemcpyDeviceToHost, b));
    CU(cudaStreamSynchronize(b));
    CHECKF(h[0] == 0.0f, "a blocking stream did not wait for the legacy stream's cudaMemset: %g", h[0]);
}
static void legacy_stream_orders_blocking_streams_only(void) { in_child(legacy_body); }

static void fork_body(void) {
    int n = 0, st = 0;
    pid_t pid;
    CU(cudaGetDeviceCount(&n));
    fflush(stdout);
    pid = fork();
    if (pid == 0) _exit(cudaGetDeviceCount(&n) == cudaErrorInitializationError ? 0 : 1);
    waitpid(pid, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a child forked after CUDA started could use CUDA");
}
static void cuda_does_not_survive_fork(void) { in_child(fork_body); }

static void no_gpu_body(void) {
    int n = 7, v = 1;
    CHECK(cudaGetDeviceCount(&n) == cudaErrorInsufficientDriver && n == 0);
    CHECK(cudaDriverGetVersion(&v) == cudaSuccess && v == 12080);
}
static void old_driver_is_insufficient(void) {
    setenv("FAKEGPU_DRIVER", "12080", 1);
    in_child(no_gpu_body);
    unsetenv("FAKEGPU_DRIVER");
}

/* ---- NVRTC and kernels ---- */

static const char* g_src =
    "extern \"C\" __global__ void fg_scale(float* y, const float* x, long long n, float a) {\n"
    "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)\n"
    "    y[i] = a * x[i]; }\n";

static cudaKernel_t load_scale(const char* arch) {
    nvrtcProgram p;
    const char* opts[2];
    char opt[64], *img;
    size_t n = 0;
    cudaLibrary_t lib;
    cudaKernel_t k = NULL;
    cudaError_t e;
    snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
    opts[0] = opt, opts[1] = "--std=c++17";
    CHECK(nvrtcCreateProgram(&p, g_src, "scale.cu", 0, NULL, NULL) == NVRTC_SUCCESS);
    CHECK(nvrtcCompileProgram(p, 2, opts) == NVRTC_SUCCESS);
    if (arch[0] == 's') {
        CHECK(nvrtcGetCUBINSize(p, &n) == NVRTC_SUCCESS && n > 0);
        img = (char*)malloc(n);
        CHECK(nvrtcGetCUBIN(p, img) == NVRTC_SUCCESS);
    } else {
        CHECK(nvrtcGetCUBINSize(p, &n) == NVRTC_SUCCESS && n == 0); /* a virtual architecture has no CUBIN */
        CHECK(nvrtcGetPTXSize(p, &n) == NVRTC_SUCCESS);
        img = (char*)malloc(n);
        CHECK(nvrtcGetPTX(p, img) == NVRTC_SUCCESS);
    }
    nvrtcDestroyProgram(&p);
    e = cudaLibraryLoadData(&lib, img, NULL, NULL, 0, NULL, NULL, 0);
    free(img);
    if (e != cudaSuccess) return (cudaKernel_t)(uintptr_t)e; /* the caller checks small values */
    CU(cudaLibraryGetKernel(&k, lib, "fg_scale"));
    return k;
}

static void kernel_body(void) {
    enum { N = 10000 };
    static float hx[N], hy[N];
    float *x = NULL, *y = NULL, a = 3.0f;
    long long n = N;
    void* args[4];
    dim3 grid = {7, 1, 1}, block = {128, 1, 1};
    cudaStream_t s;
    int i, bad = 0;
    cudaKernel_t k = load_scale("compute_80");
    if ((uintptr_t)k < 1024) return;
    for (i = 0; i < N; i++) hx[i] = (float)i;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CU(cudaMalloc((void**)&x, sizeof hx));
    CU(cudaMalloc((void**)&y, sizeof hy));
    CU(cudaMemcpyAsync(x, hx, sizeof hx, cudaMemcpyHostToDevice, s));
    args[0] = &y, args[1] = &x, args[2] = &n, args[3] = &a;
    CU(cudaLaunchKernel((const void*)k, grid, block, args, 0, s));
    CU(cudaMemcpyAsync(hy, y, sizeof hy, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(s));
    for (i = 0; i < N; i++) bad += hy[i] != 3.0f * (float)i;
    CHECKF(bad == 0, "the kernel computed %d of %d values wrong", bad, N);
    block.x = 2048; /* more threads than a block may have */
    CHECK(cudaLaunchKernel((const void*)k, grid, block, args, 0, s) == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);
    /* a double where the kernel takes a float: the kernel reads the wrong bits */
    {
        double wrong_a = 3.0;
        block.x = 128;
        args[3] = &wrong_a;
        CU(cudaLaunchKernel((const void*)k, grid, block, args, 0, s));
        CU(cudaMemcpyAsync(hy, y, sizeof hy, cudaMemcpyDeviceToHost, s));
        CU(cudaStreamSynchronize(s));
        for (i = 1, bad = 0; i < N; i++) bad += hy[i] != 3.0f * (float)i;
        CHECKF(bad == N - 1, "a double passed for a float gave %d right values of %d", N - 1 - bad, N - 1);
    }
}
static void kernel_runs_the_source_it_was_given(void) { in_child(kernel_body); }

/* An int where the kernel takes a long long: the upper half comes from the next bytes, the loop
   runs far past the buffer, and the stand-in's guard page stops it. */
static void wrong_width_body(void) {
    float *x = NULL, *y = NULL, a = 1.0f;
    struct { int n, next; } narrow = {100, 0x7fffffff};
    void* args[4];
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    cudaKernel_t k = load_scale("compute_80");
    cudaMalloc((void**)&x, 400);
    cudaMalloc((void**)&y, 400);
    cudaMemset(x, 0, 400);
    args[0] = &y, args[1] = &x, args[2] = &narrow.n, args[3] = &a;
    cudaLaunchKernel((const void*)k, grid, block, args, 0, NULL);
    cudaStreamSynchronize(NULL);
}
static void kernel_with_an_int_for_a_long_long_faults(void) {
    must_fault(wrong_width_body, "outside every live allocation");
}

static void arch_body(void) {
    nvrtcProgram p;
    const char* bad[1] = {"--gpu-architecture=compute_1"};
    const char* unknown[1] = {"--no-such-option"};
    size_t n = 0;
    int v = 0;
    CHECK(nvrtcCreateProgram(&p, g_src, "scale.cu", 0, NULL, NULL) == NVRTC_SUCCESS);
    CHECK(nvrtcCompileProgram(p, 1, bad) == NVRTC_ERROR_INVALID_OPTION);
    CHECK(nvrtcGetProgramLogSize(p, &n) == NVRTC_SUCCESS && n > 1);
    CHECK(nvrtcCompileProgram(p, 1, unknown) == NVRTC_ERROR_INVALID_OPTION);
    nvrtcDestroyProgram(&p);
    /* the image's rules: a CUBIN for another architecture and PTX newer than the driver fail */
    CHECK((uintptr_t)load_scale("sm_80") == (uintptr_t)cudaErrorNoKernelImageForDevice); /* the device is 9.0 */
    CHECK((uintptr_t)load_scale("sm_90") >= 1024);
    CHECK(nvrtcVersion(&v, &v) == NVRTC_SUCCESS && v == 0); /* 13.0 */
}
static void nvrtc_options_and_images_checked(void) { in_child(arch_body); }

static void ptx_too_new_body(void) {
    CHECK((uintptr_t)load_scale("compute_90") == (uintptr_t)cudaErrorUnsupportedPtxVersion);
    CHECK((uintptr_t)load_scale("sm_90") >= 1024); /* the CUBIN needs no JIT */
}
static void ptx_newer_than_the_driver_fails(void) {
    setenv("FAKEGPU_NVRTC_VERSION", "13.1", 1);
    in_child(ptx_too_new_body);
    unsetenv("FAKEGPU_NVRTC_VERSION");
}

/* ---- cuBLAS ---- */

static void gemm_body(void) {
    /* row-major A (2x3) and B (3x2): C = A B (2x2) */
    const float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {7, 8, 9, 10, 11, 12}, want[4] = {58, 64, 139, 154};
    float *dA, *dB, *dC, C[4], one = 1.0f, zero = 0.0f;
    cublasHandle_t h;
    int i, right = 1, slip = 1;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    CU(cudaMalloc((void**)&dA, sizeof A));
    CU(cudaMalloc((void**)&dB, sizeof B));
    CU(cudaMalloc((void**)&dC, sizeof C));
    CU(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice));
    /* row-major C = A B is column-major C^T = B^T A^T: swap the operands */
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dB, 2, dA, 3, &zero, dC, 2) == CUBLAS_STATUS_SUCCESS);
    CU(cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost));
    for (i = 0; i < 4; i++) right &= C[i] == want[i];
    CHECKF(right, "row-major product through column-major cuBLAS: %g %g %g %g", C[0], C[1], C[2], C[3]);
    /* the slip: pass the row-major operands as if cuBLAS were row-major */
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dA, 2, dB, 3, &zero, dC, 2) == CUBLAS_STATUS_SUCCESS);
    CU(cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost));
    for (i = 0; i < 4; i++) slip &= C[i] == want[i];
    CHECKF(!slip, "a row/column-major slip gave the right numbers");
    /* leading dimensions are checked as cuBLAS checks them */
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dB, 1, dA, 3, &zero, dC, 2) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &one, dB, 2, dA, 3, &zero, dC, 2) == CUBLAS_STATUS_INVALID_VALUE);
    cublasDestroy(h);
}
static void gemm_is_column_major(void) { in_child(gemm_body); }

/* ---- NCCL ---- */

static ncclUniqueId g_id;
static int g_blocking = 1, g_same_gpu;

static ncclResult_t settle(ncclComm_t c) {
    ncclResult_t st = ncclInProgress;
    int i;
    for (i = 0; i < 20000 && st == ncclInProgress; i++) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInternalError;
        if (st == ncclInProgress) usleep(500);
    }
    return st;
}

static int nccl_rank_main(int rank, int W) {
    ncclComm_t c = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cudaStream_t s;
    float *d, *d2, h[4 * 64];
    int i, r, bad = 0;
    ncclResult_t res;
    cudaSetDevice(g_same_gpu ? 0 : rank);
    cfg.blocking = g_blocking;
    res = ncclCommInitRankConfig(&c, W, g_id, rank, &cfg);
    if (!g_blocking) {
        if (res != ncclInProgress) return 10;
        if (ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, c, NULL) != ncclInvalidArgument) return 11;
        res = settle(c);
    }
    if (g_same_gpu) return res == ncclInvalidUsage ? 0 : 12;
    if (res != ncclSuccess) return 13;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void**)&d, sizeof h);
    cudaMalloc((void**)&d2, sizeof h);
    /* all-reduce sum of 64 floats: rank r holds r + i */
    for (i = 0; i < 64; i++) h[i] = (float)(rank + i);
    cudaMemcpyAsync(d, h, 64 * 4, cudaMemcpyHostToDevice, s);
    res = ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, c, s);
    if (!g_blocking) {
        if (res != ncclInProgress) return 14;
        /* the collective is not on the stream yet: using the communicator now is refused */
        if (ncclBroadcast(d, d, 64, ncclFloat32, 0, c, s) != ncclInvalidArgument) return 15;
        if (settle(c) != ncclSuccess) return 16;
    } else if (res != ncclSuccess) {
        return 17;
    }
    cudaMemcpyAsync(h, d, 64 * 4, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (i = 0; i < 64; i++) bad += h[i] != (float)(W * i + W * (W - 1) / 2);
    /* all-gather, reduce-scatter, broadcast from the last rank, and a ring of sends */
    for (i = 0; i < 64; i++) h[i] = (float)(100 * rank + i);
    cudaMemcpyAsync(d, h, 64 * 4, cudaMemcpyHostToDevice, s);
    ncclAllGather(d, d2, 16, ncclFloat32, c, s);
    if (!g_blocking) settle(c);
    cudaMemcpyAsync(h, d2, 16 * 4 * (size_t)W, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (r = 0; r < W; r++)
        for (i = 0; i < 16; i++) bad += h[r * 16 + i] != (float)(100 * r + i);
    ncclGroupStart();
    ncclSend(d, 8, ncclFloat32, (rank + 1) % W, c, s);
    ncclRecv(d2, 8, ncclFloat32, (rank + W - 1) % W, c, s);
    res = ncclGroupEnd();
    if (!g_blocking && (res != ncclInProgress || settle(c) != ncclSuccess)) return 18;
    cudaMemcpyAsync(h, d2, 8 * 4, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (i = 0; i < 8; i++) bad += h[i] != (float)(100 * ((rank + W - 1) % W) + i);
    /* buffers that overlap off the in-place layout (send 4 bytes into recv; in place is rank*64):
       undefined in NCCL, refused here */
    if (ncclAllGather((char*)d2 + 4, d2, 16, ncclFloat32, c, s) != ncclInvalidUsage) return 21;
    if (ncclReduceScatter(d2, (char*)d2 + 4, 16, ncclFloat32, ncclSum, c, s) != ncclInvalidUsage) return 22;
    if (ncclCommDestroy(c) != ncclSuccess) return 19;
    return bad ? 20 : 0;
}

static void nccl_job(int W, int blocking, int same_gpu, const char* label) {
    pid_t pids[8];
    int r, st;
    g_blocking = blocking, g_same_gpu = same_gpu;
    CHECK(ncclGetUniqueId(&g_id) == ncclSuccess);
    fflush(stdout);
    for (r = 0; r < W; r++)
        if ((pids[r] = fork()) == 0) _exit(nccl_rank_main(r, W));
    for (r = 0; r < W; r++) {
        waitpid(pids[r], &st, 0);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s, rank %d of %d ended with %s %d", label, r, W,
               WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
}

static void nccl_collectives_across_processes(void) {
    setenv("FAKEGPU_DEVICES", "4", 1);
    nccl_job(1, 1, 0, "blocking");
    nccl_job(3, 1, 0, "blocking");
    nccl_job(4, 0, 0, "non-blocking");
    unsetenv("FAKEGPU_DEVICES");
}
static void nccl_nonblocking_refuses_early_reuse(void) {
    setenv("FAKEGPU_DEVICES", "2", 1);
    nccl_job(1, 0, 0, "non-blocking, one rank");
    nccl_job(2, 0, 0, "non-blocking, two ranks");
    unsetenv("FAKEGPU_DEVICES");
}
static void nccl_refuses_two_ranks_on_one_gpu(void) {
    setenv("FAKEGPU_DEVICES", "2", 1);
    nccl_job(2, 1, 1, "two ranks on GPU 0");
    unsetenv("FAKEGPU_DEVICES");
}

/* Rank 1 never arrives: rank 0's all-reduce stays pending, and ncclCommAbort releases it. */
static int lonely_main(void) {
    ncclComm_t c = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t st;
    int i;
    cfg.blocking = 0;
    if (ncclCommInitRankConfig(&c, 2, g_id, 0, &cfg) != ncclInProgress) return 1;
    for (i = 0; i < 100; i++) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess || st != ncclInProgress) return 2; /* still waiting */
        usleep(1000);
    }
    if (ncclCommAbort(c) != ncclSuccess) return 3;
    if (ncclCommGetAsyncError(c, &st) != ncclInvalidArgument) return 4; /* the handle is gone */
    return 0;
}
static void nccl_missing_peer_pends_until_abort(void) {
    pid_t pid;
    int st;
    CHECK(ncclGetUniqueId(&g_id) == ncclSuccess);
    fflush(stdout);
    if ((pid = fork()) == 0) _exit(lonely_main());
    waitpid(pid, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
}

/* Rank 1 aborts its communicator and lives on; rank 0, on the same host, is inside an all-reduce
   that rank 1 never joined. As over NCCL's shared memory or NVLink, nothing tells rank 0: its
   collective stays pending (no asynchronous error) until it gives up and aborts too. (The
   stand-in used to report "rank 1 aborted the communicator" within 50 ms, so the first rank to
   time out decided what every other rank reported.) */
static int abort_rank_main(int rank) {
    ncclComm_t c = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t st = ncclInProgress;
    cudaStream_t s;
    cudaEvent_t e;
    float* d;
    int i;
    cudaSetDevice(rank);
    cfg.blocking = 0;
    if (ncclCommInitRankConfig(&c, 2, g_id, rank, &cfg) != ncclInProgress || settle(c) != ncclSuccess) return 1;
    if (rank == 1) {
        if (ncclCommAbort(c) != ncclSuccess) return 2;
        usleep(800000); /* alive, on this host, while rank 0 waits */
        return 0;
    }
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc((void**)&d, 64 * 4);
    if (ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, c, s) != ncclInProgress || settle(c) != ncclSuccess) return 3;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaEventRecord(e, s);
    for (i = 0; i < 400 && (st == ncclInProgress || st == ncclSuccess); i++) { /* 400 ms */
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return 4;
        usleep(1000);
    }
    if (st != ncclSuccess && st != ncclInProgress) return 5; /* told of the peer's abort */
    if (cudaEventQuery(e) != cudaErrorNotReady) return 6; /* the collective must still be pending */
    return ncclCommAbort(c) == ncclSuccess ? 0 : 7;
}
static void nccl_peer_abort_not_reported_on_one_host(void) {
    pid_t pid[2];
    int r, st;
    setenv("FAKEGPU_DEVICES", "2", 1);
    CHECK(ncclGetUniqueId(&g_id) == ncclSuccess);
    fflush(stdout);
    for (r = 0; r < 2; r++)
        if ((pid[r] = fork()) == 0) _exit(abort_rank_main(r));
    for (r = 0; r < 2; r++) {
        waitpid(pid[r], &st, 0);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status %d (5: rank 0 was told of rank 1's abort)", r,
               WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    }
    unsetenv("FAKEGPU_DEVICES");
}

/* Host C++ accepts what NVRTC does not (INFINITY is <math.h>'s, which a GPU program does not
   have): the stand-in's own compiler takes this kernel, the real NVRTC refuses it, and so does the
   stand-in whenever the build found one (FG_REAL_NVRTC_LIB, the path it was built with). */
#ifndef FG_REAL_NVRTC_LIB
#define FG_REAL_NVRTC_LIB ""
#endif
static const char* g_host_only_src =
    "extern \"C\" __global__ void fg_host_only(float* y) {\n"
    "  if (threadIdx.x == 0) y[0] = -INFINITY; }\n";
static nvrtcResult compile_host_only(char* log, size_t cap) {
    nvrtcProgram p;
    const char* opts[1] = {"--gpu-architecture=sm_90"};
    size_t n = 0;
    nvrtcResult r;
    log[0] = 0;
    CHECK(nvrtcCreateProgram(&p, g_host_only_src, "host_only.cu", 0, NULL, NULL) == NVRTC_SUCCESS);
    r = nvrtcCompileProgram(p, 1, opts);
    if (nvrtcGetProgramLogSize(p, &n) == NVRTC_SUCCESS && n <= cap) nvrtcGetProgramLog(p, log);
    nvrtcDestroyProgram(&p);
    return r;
}
static void host_only_body(void) {
    char log[8192];
    nvrtcResult r;
    setenv("FAKEGPU_REAL_NVRTC", "", 1); /* the stand-in alone */
    CHECKF((r = compile_host_only(log, sizeof log)) == NVRTC_SUCCESS, "the host compiler refused it: %s", log);
    unsetenv("FAKEGPU_REAL_NVRTC"); /* the build's real NVRTC */
    r = compile_host_only(log, sizeof log);
    CHECKF(r == NVRTC_ERROR_COMPILATION, "compiled to %s with the real NVRTC at hand", nvrtcGetErrorString(r));
    CHECKF(strstr(log, "real NVRTC") && strstr(log, "INFINITY"), "the log does not name the real NVRTC and INFINITY: %s", log);
    r = compile_host_only(log, sizeof log); /* refused again: a refusal is not remembered as accepted */
    CHECKF(r == NVRTC_ERROR_COMPILATION, "the second compile gave %s", nvrtcGetErrorString(r));
}
static void host_only_source_refused_as_nvrtc_refuses_it(void) {
    if (!*FG_REAL_NVRTC_LIB) SKIP("%s", "this build of the stand-in has no real NVRTC to ask (a sanitizer build; make test's plain build asks it)");
    in_child(host_only_body);
}

/* Atomics: 6000 threads in 24 blocks add into one counter of each type; the sums are exact. */
static const char* g_atomic_src =
    "extern \"C\" __global__ void fg_atomics(int* i, float* f, double* d, unsigned long long* u, int* mx, int n) {\n"
    "  int t = blockIdx.x * blockDim.x + threadIdx.x; if (t >= n) return;\n"
    "  atomicAdd(i, 1); atomicAdd(f, 0.5f); atomicAdd(d, (double)t); atomicAdd(u, 3ull);\n"
    "  atomicMax(mx, (t * 7919) % n); }\n";
static void atomics_body(void) {
    nvrtcProgram p;
    const char* opts[1] = {"--gpu-architecture=sm_90"};
    char* img;
    size_t n = 0;
    cudaLibrary_t lib;
    cudaKernel_t k;
    struct { int i; float f; double d; unsigned long long u; int mx; } h = {0, 0.f, 0.0, 0, -1}, z = h, *dv = NULL;
    int *pi, *pm, count = 6000;
    float* pf;
    double* pd;
    unsigned long long* pu;
    void* args[6];
    dim3 grid = {24, 1, 1}, block = {256, 1, 1};
    CHECK(nvrtcCreateProgram(&p, g_atomic_src, "atomics.cu", 0, NULL, NULL) == NVRTC_SUCCESS);
    CHECK(nvrtcCompileProgram(p, 1, opts) == NVRTC_SUCCESS);
    CHECK(nvrtcGetCUBINSize(p, &n) == NVRTC_SUCCESS && n > 0);
    img = (char*)malloc(n);
    CHECK(nvrtcGetCUBIN(p, img) == NVRTC_SUCCESS);
    nvrtcDestroyProgram(&p);
    CU(cudaLibraryLoadData(&lib, img, NULL, NULL, 0, NULL, NULL, 0));
    free(img);
    CU(cudaLibraryGetKernel(&k, lib, "fg_atomics"));
    CU(cudaMalloc((void**)&dv, sizeof h));
    CU(cudaMemcpy(dv, &z, sizeof z, cudaMemcpyHostToDevice));
    pi = &dv->i, pf = &dv->f, pd = &dv->d, pu = &dv->u, pm = &dv->mx;
    args[0] = &pi, args[1] = &pf, args[2] = &pd, args[3] = &pu, args[4] = &pm, args[5] = &count;
    CU(cudaLaunchKernel((const void*)k, grid, block, args, 0, NULL));
    CU(cudaMemcpy(&h, dv, sizeof h, cudaMemcpyDeviceToHost));
    CHECKF(h.i == 6000 && h.f == 3000.f && h.d == 5999.0 * 6000 / 2 && h.u == 18000 && h.mx == 5999,
           "sums %d %g %.1f %llu, max %d; want 6000 3000 17997000 18000, max 5999", h.i, h.f, h.d, h.u, h.mx);
}
static void atomics_add_exactly(void) { in_child(atomics_body); }

/* A kernel whose threads wait for each other cannot run on the stand-in: the compile fails, and the
   log says why before the host compiler's own words. */
static void barrier_body(void) {
    nvrtcProgram p;
    const char* opts[1] = {"--gpu-architecture=sm_90"};
    const char* src = "extern \"C\" __global__ void fg_block_sum(float* y, const float* x) {\n"
                      "  __shared__ float s[256]; s[threadIdx.x] = x[threadIdx.x]; __syncthreads();\n"
                      "  if (threadIdx.x == 0) { float t = 0.f; for (int i = 0; i < 256; i++) t += s[i]; *y = t; } }\n";
    char log[16384] = "";
    size_t n = 0;
    CHECK(nvrtcCreateProgram(&p, src, "block_sum.cu", 0, NULL, NULL) == NVRTC_SUCCESS);
    CHECK(nvrtcCompileProgram(p, 1, opts) == NVRTC_ERROR_COMPILATION);
    CHECK(nvrtcGetProgramLogSize(p, &n) == NVRTC_SUCCESS && n <= sizeof log);
    nvrtcGetProgramLog(p, log);
    nvrtcDestroyProgram(&p);
    CHECKF(strstr(log, "fakegpu: this program uses __s") && strstr(log, "need a real GPU") &&
               strstr(log, *FG_REAL_NVRTC_LIB ? "the real NVRTC accepted it" : "test it there"),
           "the log: %.300s", log);
}
static void block_cooperation_refused_with_its_reason(void) { in_child(barrier_body); }

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsetenv("FAKEGPU_DEVICES");
    setenv("FAKEGPU_WAIT_S", "20", 0); /* a case that goes wrong fails sooner */
    RUN(host_read_of_device_memory_faults);
    RUN(fresh_device_memory_is_not_zero);
    RUN(missing_event_wait_reads_stale_data);
    RUN(pageable_cudaMemcpy_returns_before_it_lands);
    RUN(legacy_stream_orders_blocking_streams_only);
    RUN(cuda_does_not_survive_fork);
    RUN(old_driver_is_insufficient);
    RUN(kernel_runs_the_source_it_was_given);
    RUN(kernel_with_an_int_for_a_long_long_faults);
    RUN(nvrtc_options_and_images_checked);
    RUN(ptx_newer_than_the_driver_fails);
    RUN(host_only_source_refused_as_nvrtc_refuses_it);
    RUN(atomics_add_exactly);
    RUN(block_cooperation_refused_with_its_reason);
    RUN(gemm_is_column_major);
    RUN(nccl_collectives_across_processes);
    RUN(nccl_nonblocking_refuses_early_reuse);
    RUN(nccl_refuses_two_ranks_on_one_gpu);
    RUN(nccl_missing_peer_pends_until_abort);
    RUN(nccl_peer_abort_not_reported_on_one_host);
    return H_EXIT();
}
