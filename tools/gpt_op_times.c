/* gpt_op_times.c - where one training step of chapter 12's GPT spends its time, operation by
   operation (examples/gpt.h), on the CPU or on a GPU.

   make gpu-check runs it on nanoGPT's GPU setting, so that the first run on a GPU says which of
   gpt.h's kernels, cuBLAS's products or ddp.h's optimizer a step waits for, beside the whole step
   that make bench-gpu compares with PyTorch's.

   Run:      build/gpt_op_times --device cuda          nanoGPT's GPU setting on the first GPU
             build/gpt_op_times                        nanoGPT's CPU setting on the CPU
   Options:  --device cpu|cuda|cuda:N  --layers L  --heads H  --width C  --ctx T  --batch-size B
             --repeat N (how many times each figure is measured; the median is shown; 5)

   Method. One model, one process, no DDP; random tokens of 65 characters. Two whole steps to warm
   up (zero_grad, forward, backward, clipping at 1.0, AdamW), then the whole step N times. Then each
   operation alone, N times, on the step's own shapes and buffers, the device waited for before and
   after each call, so that a figure is that operation's own time plus one launch and one wait (a
   few microseconds on a GPU). An operation that works in place gets its input made again, untimed,
   before each call. Each row: the median time of one call, the calls in one step, their product
   and its share of the step; the rate is TFLOP/s for the matrix products (the attention's
   included) and GB/s for the others, counting only the bytes they must read and write. The rows
   add up to less than the whole step by the launches and waits between operations and the host's
   own work, or to more where each operation's own launch and wait outweigh those (small models). */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "../examples/gpt.h"

#include <time.h>

static gpt g;
static ddp_optim* optim;
static int B, T, C, NH, V, L, BT;
static int *tokens, *targets; /* on the host */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
static void wait_device(void) { DDP_CHECK(ddp_stream_sync(ddp_model_stream(g.m))); }

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

/* ---- the operations, each on block 0's buffers (every block has the same shapes) --------------- */

static gpt_block* k0(void) { return &g.h[0]; }
static gpt_acts* a0(void) { return &g.a[0]; }

static void step(void) {
    float norm;
    DDP_CHECK(ddp_model_zero_grad(g.m));
    gpt_forward(&g, tokens, targets, B, T);
    gpt_backward(&g, 1.f);
    DDP_CHECK(ddp_optim_clip_grad_norm(optim, 1.f, &norm));
    DDP_CHECK(ddp_optim_step(optim));
}
static void encoder_fwd(void) { gpt_encoder_forward(&g, g.x0, g.tokens, g.wte->data, g.wpe->data, B, T, C); }
static void layernorm_fwd(void) {
    gpt_layernorm_forward(&g, a0()->ln1, a0()->ln1_mean, a0()->ln1_rstd, g.x0, k0()->ln1_w->data, k0()->ln1_b->data,
                          BT, C);
}
static void qkv_fwd(void) {
    gpt_linear_forward(&g, a0()->qkv, a0()->ln1, k0()->attn_w->data, k0()->attn_b->data, BT, C, 3 * C);
}
static void attention_fwd(void) { gpt_attention_forward(&g, a0()->atty, a0()->att, a0()->qkv, B, T, C, NH); }
static void attn_proj_fwd(void) {
    gpt_linear_forward(&g, a0()->res1, a0()->atty, k0()->attn_proj_w->data, k0()->attn_proj_b->data, BT, C, C);
}
static void residual_fwd(void) { gpt_residual_forward(&g, g.dx, a0()->res1, g.x0, (long long)BT * C); }
static void fc_fwd(void) {
    gpt_linear_forward(&g, a0()->fc, a0()->ln2, k0()->fc_w->data, k0()->fc_b->data, BT, C, 4 * C);
}
static void gelu_fwd(void) { gpt_gelu_forward(&g, a0()->fc_gelu, a0()->fc_slope, a0()->fc, (long long)BT * 4 * C); }
static void mlp_proj_fwd(void) {
    gpt_linear_forward(&g, a0()->res2, a0()->fc_gelu, k0()->mlp_proj_w->data, k0()->mlp_proj_b->data, BT, 4 * C, C);
}
static void logits_fwd(void) {
    DDP_CHECK(ddp_gemm(g.m, 0, 1, BT, V, C, 1.f, g.lnf, C, g.wte->data, C, 0.f, g.probs, V));
}
static void xent_fwd(void) { gpt_softmax_xent_forward(&g, g.probs, g.targets, BT, V); }
static void logits_then_xent(void) { logits_fwd(), xent_fwd(); }
static void xent_bwd(void) { gpt_softmax_xent_backward(&g, g.probs, g.targets, BT, V, 1.f); }
static void logits_bwd(void) {
    DDP_CHECK(ddp_gemm(g.m, 1, 0, V, C, BT, 1.f, g.probs, V, g.lnf, C, 1.f, g.wte->grad, C));
    DDP_CHECK(ddp_gemm(g.m, 0, 0, BT, C, V, 1.f, g.probs, V, g.wte->data, C, 0.f, g.dbuf, C));
}
static void zero_dx(void) { gpt_zero(&g, g.dx, (long long)BT * C); }
static void layernorm_bwd(void) {
    gpt_layernorm_backward(&g, g.dx, k0()->ln1_w->grad, k0()->ln1_b->grad, g.dbuf, g.x0, k0()->ln1_w->data,
                           a0()->ln1_mean, a0()->ln1_rstd, BT, C);
}
static void mlp_proj_bwd(void) {
    gpt_linear_backward(&g, g.dbig, k0()->mlp_proj_w->grad, k0()->mlp_proj_b->grad, g.dx, a0()->fc_gelu,
                        k0()->mlp_proj_w->data, BT, 4 * C, C);
}
static void gelu_bwd(void) { gpt_gelu_backward(&g, g.dbig, a0()->fc_slope, a0()->fc, g.dbig, (long long)BT * 4 * C); }
static void fc_bwd(void) {
    gpt_linear_backward(&g, g.dbuf, k0()->fc_w->grad, k0()->fc_b->grad, g.dbig, a0()->ln2, k0()->fc_w->data, BT, C,
                        4 * C);
}
static void attn_proj_bwd(void) {
    gpt_linear_backward(&g, g.dbuf, k0()->attn_proj_w->grad, k0()->attn_proj_b->grad, g.dx, a0()->atty,
                        k0()->attn_proj_w->data, BT, C, C);
}
static void attention_bwd(void) {
    gpt_attention_backward(&g, g.dbig, g.dscores, g.dbuf, a0()->qkv, a0()->att, B, T, C, NH);
}
static void qkv_bwd(void) {
    gpt_linear_backward(&g, g.dbuf, k0()->attn_w->grad, k0()->attn_b->grad, g.dbig, a0()->ln1, k0()->attn_w->data,
                        BT, C, 3 * C);
}
static void encoder_bwd(void) { gpt_encoder_backward(&g, g.wte->grad, g.wpe->grad, g.dx, g.tokens, B, T, C); }
static void zero_grad(void) { DDP_CHECK(ddp_model_zero_grad(g.m)); }
static void clip(void) {
    float norm;
    DDP_CHECK(ddp_optim_clip_grad_norm(optim, 1.f, &norm));
}
static void adamw(void) { DDP_CHECK(ddp_optim_step(optim)); }

typedef struct op {
    const char* name;
    int calls;             /* in one step */
    double flops, bytes;   /* one call's: a product's arithmetic, or the fewest bytes moved */
    void (*run)(void);
    void (*prep)(void);    /* NULL, or what makes an in-place operation's input again */
} op;

/* The median of `repeat` timings of run (prep untimed before each). */
static double time_of(void (*run)(void), void (*prep)(void), int repeat) {
    double t[64], t0;
    int r;
    for (r = 0; r < repeat; r++) {
        if (prep) prep();
        wait_device();
        t0 = now_s();
        run();
        wait_device();
        t[r] = now_s() - t0;
    }
    qsort(t, (size_t)repeat, sizeof t[0], cmp_double);
    return t[repeat / 2];
}

int main(int argc, char** argv) {
    const char* device = "cpu";
    gpt_config cfg = {.vocab = 65};
    ddp_optim_desc od = {.kind = DDP_ADAMW, .beta1 = 0.9f};
    ddp_device dev;
    int repeat = 5, i, set[5] = {0, 0, 0, 0, 0}, batch = 0;
    double whole, sum = 0;
    char name[64];
    ddp_rng r = ddp_rng_seed(1);
    for (i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--layers")) set[0] = atoi(v);
        else if (!strcmp(a, "--heads")) set[1] = atoi(v);
        else if (!strcmp(a, "--width")) set[2] = atoi(v);
        else if (!strcmp(a, "--ctx")) set[3] = atoi(v);
        else if (!strcmp(a, "--batch-size")) batch = atoi(v);
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else break;
    }
    if (i < argc || repeat < 1 || repeat > 64) {
        fprintf(stderr, "usage: %s [--device cpu|cuda|cuda:N] [--layers L] [--heads H] [--width C] [--ctx T]\n"
                        "          [--batch-size B] [--repeat N (1-64)]\n", argv[0]);
        return 2;
    }
    DDP_CHECK(ddp_device_parse(device, &dev));
    DDP_CHECK(ddp_device_resolve(dev, &dev));
    { /* nanoGPT's GPU setting on a GPU, its CPU setting on the CPU; each option replaces its part */
        int gpu = dev.type == DDP_DEVICE_CUDA;
        cfg.layers = set[0] ? set[0] : gpu ? 6 : 4, cfg.heads = set[1] ? set[1] : gpu ? 6 : 4;
        cfg.width = set[2] ? set[2] : gpu ? 384 : 128, cfg.ctx = set[3] ? set[3] : gpu ? 256 : 64;
        B = batch ? batch : gpu ? 64 : 12;
    }
    L = cfg.layers, NH = cfg.heads, C = cfg.width, T = cfg.ctx, V = cfg.vocab, BT = B * T;
    if (L < 1 || NH < 1 || C < 1 || T < 1 || B < 1) {
        fprintf(stderr, "%s: every size must be at least 1\n", argv[0]);
        return 2;
    }
    gpt_create(&g, &cfg, dev, BT, 1);
    DDP_CHECK(ddp_optim_create(g.m, &od, &optim));
    tokens = (int*)gpt__alloc((size_t)BT * sizeof(int)), targets = (int*)gpt__alloc((size_t)BT * sizeof(int));
    for (i = 0; i < BT; i++) tokens[i] = (int)ddp_rng_below(&r, (uint32_t)V);
    for (i = 0; i < BT; i++) targets[i] = (int)ddp_rng_below(&r, (uint32_t)V);
    (void)gpt_probs; /* gpt.h's helper for sampling, which this program does not do */
    printf("gpt_op_times: %d layers, %d heads, %d wide, context %d, batch %d, on %s: %zu parameters\n", L, NH, C, T, B,
           ddp_device_name(dev, name, sizeof name), ddp_model_num_elements(g.m));
    step(), step(); /* warm-up: kernels compiled, memory touched, the optimizer's state made */
    whole = time_of(step, NULL, repeat);
    {
        const double f = 4.0, bt = BT, c = C, t = T, b = B;
        const op ops[] = {
            {"encoder_forward", 1, 0, f * bt * c * 3, encoder_fwd, NULL},
            {"layernorm_forward", 2 * L + 1, 0, f * bt * c * 2, layernorm_fwd, NULL},
            {"linear_forward c_attn (C -> 3C)", L, 2 * bt * c * 3 * c, 0, qkv_fwd, NULL},
            {"attention_forward", L, 4 * b * t * t * c, 0, attention_fwd, NULL},
            {"linear_forward attn.c_proj (C -> C)", L, 2 * bt * c * c, 0, attn_proj_fwd, NULL},
            {"residual_forward", 2 * L, 0, f * bt * c * 3, residual_fwd, NULL},
            {"linear_forward c_fc (C -> 4C)", L, 2 * bt * c * 4 * c, 0, fc_fwd, NULL},
            {"gelu_forward", L, 0, f * bt * 4 * c * 2, gelu_fwd, NULL},
            {"linear_forward mlp.c_proj (4C -> C)", L, 2 * bt * 4 * c * c, 0, mlp_proj_fwd, NULL},
            {"logits (the output layer's product)", 1, 2 * bt * V * c, 0, logits_fwd, NULL},
            {"softmax_xent_forward (and its losses)", 1, 0, f * bt * V * 2, xent_fwd, logits_fwd},
            {"softmax_xent_backward", 1, 0, f * bt * V * 2, xent_bwd, logits_then_xent},
            {"the output layer's two products", 1, 4 * bt * V * c, 0, logits_bwd, NULL},
            {"zero (dx)", 1, 0, f * bt * c, zero_dx, NULL},
            {"layernorm_backward", 2 * L + 1, 0, f * bt * c * 3, layernorm_bwd, NULL},
            {"linear_backward mlp.c_proj", L, 4 * bt * 4 * c * c, 0, mlp_proj_bwd, NULL},
            {"gelu_backward", L, 0, f * bt * 4 * c * 3, gelu_bwd, NULL},
            {"linear_backward c_fc", L, 4 * bt * c * 4 * c, 0, fc_bwd, NULL},
            {"linear_backward attn.c_proj", L, 4 * bt * c * c, 0, attn_proj_bwd, NULL},
            {"attention_backward", L, 8 * b * t * t * c, 0, attention_bwd, NULL},
            {"linear_backward c_attn", L, 4 * bt * c * 3 * c, 0, qkv_bwd, NULL},
            {"encoder_backward", 1, 0, f * bt * c, encoder_bwd, NULL},
            {"zero_grad (ddp.h)", 1, 0, f * (double)ddp_model_num_elements(g.m), zero_grad, NULL},
            {"clip_grad_norm (ddp.h)", 1, 0, f * (double)ddp_model_num_elements(g.m), clip, NULL},
            {"AdamW step (ddp.h)", 1, 0, f * (double)ddp_model_num_elements(g.m) * 7, adamw, NULL},
        };
        printf("whole step: %.3f ms (the median of %d)\n\n", whole * 1e3, repeat);
        printf("%-40s %5s %9s %9s %6s %12s\n", "operation", "calls", "ms/call", "ms/step", "share", "rate");
        for (i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++) {
            const op* o = &ops[i];
            double t1 = time_of(o->run, o->prep, repeat), per_step = t1 * o->calls;
            char rate[32];
            if (o->flops) snprintf(rate, sizeof rate, "%.2f TFLOP/s", o->flops / t1 / 1e12);
            else snprintf(rate, sizeof rate, "%.1f GB/s", o->bytes / t1 / 1e9);
            printf("%-40s %5d %9.3f %9.3f %5.1f%% %12s\n", o->name, o->calls, t1 * 1e3, per_step * 1e3,
                   100 * per_step / whole, rate);
            sum += per_step;
        }
    }
    printf("\nthe operations, each timed alone, add up to %.3f ms of the whole step's %.3f ms (%.0f%%)\n", sum * 1e3,
           whole * 1e3, 100 * sum / whole);
    ddp_optim_destroy(optim);
    gpt_free(&g);
    free(tokens), free(targets);
    return 0;
}
