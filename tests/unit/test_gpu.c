/* GPU tests. In `make test` on a machine without a GPU, the kernel-compile case still runs (NVRTC
   needs no GPU) and the device cases are skipped with the reason; `make test-gpu` sets
   DDP_REQUIRE_GPU=1, which turns those skips into failures. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

static int require_gpu(void) {
    const char* v = getenv("DDP_REQUIRE_GPU");
    return v && *v == '1';
}

/* Skip (or, under make test-gpu, fail) when this machine cannot run GPU code. */
#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        if (ddp__cuda_device_count() == 0) {                                                        \
            if (require_gpu()) {                                                                   \
                h_failf(__FILE__, __LINE__, "make test-gpu needs a GPU: %s",                       \
                        ddp__cuda_unavailable_reason());                                            \
                return;                                                                            \
            }                                                                                      \
            SKIP("no GPU: %s", ddp__cuda_unavailable_reason());                                     \
        }                                                                                          \
    } while (0)

/* Every kernel compiles with NVRTC to PTX, for the oldest and a recent architecture. */
static void kernels_compile_without_gpu(void) {
    const char* archs[] = {"compute_75", "compute_80", "compute_90"};
    int a, k;
    if (ddp__kernel_count() == 0) SKIP("CPU-only build (DDP_NO_CUDA): there are no kernels to compile");
    CHECK(ddp__kernel_count() >= 14);
    for (a = 0; a < 3; a++) {
        char* ptx = NULL;
        size_t n = 0;
        CHECK_OK(ddp__kernels_compile_ptx(archs[a], &ptx, &n));
        if (!ptx) continue;
        CHECKF(n > 1000 && strlen(ptx) + 1 == n, "%s: PTX of %zu bytes", archs[a], n);
        for (k = 0; k < ddp__kernel_count(); k++) {
            char entry[96];
            snprintf(entry, sizeof entry, ".entry %s(", ddp__kernel_name(k));
            CHECKF(strstr(ptx, entry) != NULL, "%s: no %s in the PTX", archs[a], entry);
        }
        ddp__free_host(ptx);
    }
    CHECK(ddp__kernel_name(ddp__kernel_count()) == NULL);
    CHECK_FAILS(ddp__kernels_compile_ptx("compute_1", &(char*){NULL}, &(size_t){0}), DDP_ERR_NVRTC, "compute_1");
}

/* Relative L2 distance ||a - b|| / ||b||. */
static double rel_l2(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double max_param_diff(ddp_model* g, ddp_model* c, int grads) {
    double worst = 0;
    int i;
    for (i = 0; i < ddp_model_num_params(c); i++) {
        ddp_param *pg = ddp_model_param(g, i), *pc = ddp_model_param(c, i);
        float* host = (float*)malloc(pc->count * sizeof(float));
        double d;
        ddp_copy(ddp__model_device(c), host, ddp__model_device(g), grads ? pg->grad : pg->data,
                 pc->count * sizeof(float), NULL);
        d = rel_l2(host, grads ? pc->grad : pc->data, pc->count);
        if (d > worst) worst = d;
        free(host);
    }
    return worst;
}

/* The same model, seed and batches on the CPU and on the GPU: outputs, losses, gradients and
   weights after several optimizer steps agree within float tolerance. Prints the figures. */
static void cpu_gpu_agree(ddp_layer_kind act, ddp_optim_kind kind, int use_mse) {
    int sizes[] = {13, 64, 32, 3}, B = 32, step, i;
    ddp_model_desc dc = {{DDP_DEVICE_CPU, 0}, 7}, dg = {{DDP_DEVICE_CUDA, 0}, 7};
    ddp_optim_desc od = {DDP_OPTIM_DEFAULT, 0, 0, 0, 0, 0, 0, 0, 0};
    ddp_model *mc = NULL, *mg = NULL;
    ddp_optim *oc = NULL, *og = NULL;
    float x[32 * 13], t[32 * 3], outc[32 * 3], outg[32 * 3], lc = 0, lg = 0;
    int y[32];
    double worst_out = 0, worst_loss = 0, worst_grad = 0, worst_w;
    ddp_rng r = ddp_rng_seed(3);
    od.kind = kind;
    od.lr = 1e-2f;
    od.momentum = kind == DDP_SGD ? 0.9f : 0.f;
    CHECK_OK(ddp_model_mlp(&dc, sizes, 4, act, &mc));
    CHECK_OK(ddp_model_mlp(&dg, sizes, 4, act, &mg));
    if (!mc || !mg) return;
    CHECK(max_param_diff(mg, mc, 0) == 0); /* the same seed gives the same initial weights */
    CHECK_OK(ddp_optim_create(mc, &od, &oc));
    CHECK_OK(ddp_optim_create(mg, &od, &og));
    for (step = 0; step < 10; step++) {
        for (i = 0; i < B * 13; i++) x[i] = 2.f * ddp_rng_uniform(&r) - 1.f;
        for (i = 0; i < B * 3; i++) t[i] = ddp_rng_uniform(&r);
        for (i = 0; i < B; i++) y[i] = (int)ddp_rng_below(&r, 3);
        CHECK_OK(ddp_model_zero_grad(mc));
        CHECK_OK(ddp_model_zero_grad(mg));
        CHECK_OK(ddp_model_forward(mc, x, B));
        CHECK_OK(ddp_model_forward(mg, x, B));
        CHECK_OK(ddp__model_output(mc, outc));
        CHECK_OK(ddp__model_output(mg, outg));
        if (rel_l2(outg, outc, (size_t)B * 3) > worst_out) worst_out = rel_l2(outg, outc, (size_t)B * 3);
        if (use_mse) {
            CHECK_OK(ddp__loss_mse(mc, t, &lc));
            CHECK_OK(ddp__loss_mse(mg, t, &lg));
        } else {
            CHECK_OK(ddp_loss_cross_entropy(mc, y, &lc));
            CHECK_OK(ddp_loss_cross_entropy(mg, y, &lg));
        }
        if (fabs((double)lg - lc) / fabs((double)lc) > worst_loss) worst_loss = fabs((double)lg - lc) / fabs((double)lc);
        CHECK_OK(ddp_model_backward(mc));
        CHECK_OK(ddp_model_backward(mg));
        CHECK_OK(ddp_stream_sync(ddp_model_stream(mg)));
        if (max_param_diff(mg, mc, 1) > worst_grad) worst_grad = max_param_diff(mg, mc, 1);
        CHECK_OK(ddp_optim_step(oc));
        CHECK_OK(ddp_optim_step(og));
    }
    CHECK_OK(ddp_stream_sync(ddp_model_stream(mg)));
    worst_w = max_param_diff(mg, mc, 0);
    printf("    %s %s %s: max relative L2 difference GPU vs CPU: output %.2e, loss %.2e, grad %.2e, "
           "weights after 10 steps %.2e\n", act == DDP_LAYER_RELU ? "relu" : "gelu",
           kind == DDP_SGD ? "sgd" : kind == DDP_ADAMW ? "adamw" : "adam", use_mse ? "mse" : "xent",
           worst_out, worst_loss, worst_grad, worst_w);
    CHECKF(worst_out < 1e-5, "outputs differ by %.3g", worst_out);
    CHECKF(worst_loss < 1e-5, "losses differ by %.3g", worst_loss);
    CHECKF(worst_grad < 1e-4, "gradients differ by %.3g", worst_grad);
    CHECKF(worst_w < 1e-4, "weights differ by %.3g", worst_w);
    ddp_optim_destroy(oc);
    ddp_optim_destroy(og);
    ddp_model_destroy(mc);
    ddp_model_destroy(mg);
}

static void cpu_gpu_agree_relu_adam_xent(void) { NEED_GPU(); cpu_gpu_agree(DDP_LAYER_RELU, DDP_ADAM, 0); }
static void cpu_gpu_agree_gelu_sgd_mse(void) { NEED_GPU(); cpu_gpu_agree(DDP_LAYER_GELU, DDP_SGD, 1); }
static void cpu_gpu_agree_gelu_adamw_xent(void) { NEED_GPU(); cpu_gpu_agree(DDP_LAYER_GELU, DDP_ADAMW, 0); }

/* f16 and bf16 conversion kernels give the same bits as the CPU functions. */
static void gpu_conversions_match_cpu(void) {
    enum { N = 1 << 16 };
    ddp_device g = {DDP_DEVICE_CUDA, 0};
    static float src[N], back_cpu[N], back_gpu[N];
    static uint16_t h_cpu[N], h_gpu[N];
    void *dsrc = NULL, *dh = NULL, *dback = NULL;
    ddp_rng r = ddp_rng_seed(11);
    int i, t, bad;
    NEED_GPU();
    for (i = 0; i < N; i++) {
        uint32_t bits = (uint32_t)ddp__rng_next(&r);
        memcpy(&src[i], &bits, 4); /* every kind of float: subnormal, huge, inf, NaN */
    }
    CHECK_OK(ddp_alloc(g, sizeof src, &dsrc));
    CHECK_OK(ddp_alloc(g, sizeof h_gpu, &dh));
    CHECK_OK(ddp_alloc(g, sizeof back_gpu, &dback));
    CHECK_OK(ddp_copy(g, dsrc, (ddp_device){DDP_DEVICE_CPU, 0}, src, sizeof src, NULL));
    for (t = 0; t < 2; t++) {
        ddp_dtype dt = t == 0 ? DDP_F16 : DDP_BF16;
        CHECK_OK(ddp__convert(g, dt, dh, DDP_F32, dsrc, N, NULL));
        CHECK_OK(ddp__convert(g, DDP_F32, dback, dt, dh, N, NULL));
        CHECK_OK(ddp_copy((ddp_device){DDP_DEVICE_CPU, 0}, h_gpu, g, dh, sizeof h_gpu, NULL));
        CHECK_OK(ddp_copy((ddp_device){DDP_DEVICE_CPU, 0}, back_gpu, g, dback, sizeof back_gpu, NULL));
        CHECK_OK(ddp__convert((ddp_device){DDP_DEVICE_CPU, 0}, dt, h_cpu, DDP_F32, src, N, NULL));
        CHECK_OK(ddp__convert((ddp_device){DDP_DEVICE_CPU, 0}, DDP_F32, back_cpu, dt, h_cpu, N, NULL));
        for (i = 0, bad = 0; i < N; i++) bad += h_cpu[i] != h_gpu[i] || memcmp(&back_cpu[i], &back_gpu[i], 4) != 0;
        CHECKF(bad == 0, "%s: %d of %d values convert differently on the GPU", ddp__dtype_name(dt), bad, N);
    }
    ddp_free(g, dsrc);
    ddp_free(g, dh);
    ddp_free(g, dback);
}

/* Streams and events on a GPU: a copy ordered after an event sees the data. */
static void gpu_streams_events(void) {
    ddp_device g = {DDP_DEVICE_CUDA, 0}, c = {DDP_DEVICE_CPU, 0};
    ddp_stream *s1 = NULL, *s2 = NULL;
    ddp_event* e = NULL;
    float *host = NULL, back[1024] = {0}; /* (read only after the copy; GCC cannot tell on every target) */
    void* d = NULL;
    int i, done = 0;
    NEED_GPU();
    /* pinned: a copy from pageable memory would be finished when ddp_copy returns, and the test
       would pass without the event */
    CHECK_OK(ddp_alloc_pinned(1024 * sizeof(float), (void**)&host));
    if (!host) return;
    for (i = 0; i < 1024; i++) host[i] = (float)i;
    memset(back, 0xff, sizeof back); /* NaNs until the copy lands (and no compiler warns of garbage) */
    CHECK_OK(ddp__stream_create(g, &s1));
    CHECK_OK(ddp__stream_create(g, &s2));
    CHECK_OK(ddp__event_create(g, &e));
    CHECK_OK(ddp_alloc(g, sizeof back, &d));
    CHECK(ddp__stream_native(s1) != NULL);
    CHECK_OK(ddp_copy(g, d, c, host, sizeof back, s1));
    CHECK_OK(ddp__event_record(e, s1));
    CHECK_OK(ddp__stream_wait_event(s2, e));
    CHECK_OK(ddp_copy(c, back, g, d, sizeof back, s2));
    CHECK_OK(ddp_stream_sync(s2));
    CHECK_OK(ddp__event_query(e, &done));
    CHECK(done == 1);
    CHECK(memcmp(host, back, sizeof back) == 0);
    ddp_free_pinned(host);
    ddp_free(g, d);
    ddp__event_destroy(e);
    ddp__stream_destroy(s1);
    ddp__stream_destroy(s2);
}

int main(void) {
    printf("    %s\n", ddp_build_info());
    RUN(kernels_compile_without_gpu);
    RUN(gpu_streams_events);
    RUN(gpu_conversions_match_cpu);
    RUN(cpu_gpu_agree_relu_adam_xent);
    RUN(cpu_gpu_agree_gelu_sgd_mse);
    RUN(cpu_gpu_agree_gelu_adamw_xent);
    return H_EXIT();
}
