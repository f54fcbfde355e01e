/* Chapter 12's GPT (examples/gpt.h) under test.
   - Its backward against finite differences of a double-precision forward written here on its own,
     tensor by tensor: every layer's gradient (embeddings, both layernorms, the fused qkv
     projection through the causal attention, its output projection, the MLP through GELU, ln_f,
     and the tied output layer's share of wte).
   - N ranks with batch B/N train the weights one process trains with batch B (relative 1e-5 after
     20 steps), at ZeRO stages 0-3, with AdamW (decay on the 2-D tensors only), a schedule, clipping
     at a global norm that binds, and two micro-batches accumulated under no_sync per step.
   With --gpu (the GPU stand-in, or a real GPU): the model's kernels (examples/gpt.h) give the CPU's
   loss, probabilities and gradients on a fixed batch, and 2 and 4 ranks over NCCL, one GPU each,
   train the weights of one GPU process. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"
#include "../../examples/gpt.h"

static char g_dir[64];
static int g_gpu, g_gpus; /* --gpu: ranks on GPUs (NCCL); how many GPUs there are */

/* ---- a forward in double precision, written independently of gpt.h ------------------------------ */

typedef struct dnet {
    const gpt_config* c;
    const double* w; /* the parameters, in gpt.h's flat order */
} dnet;

static void d_layernorm(double* out, const double* in, const double* w, const double* b, int N, int C) {
    int n, i;
    for (n = 0; n < N; n++) {
        double mu = 0, var = 0;
        for (i = 0; i < C; i++) mu += in[n * C + i];
        mu /= C;
        for (i = 0; i < C; i++) var += (in[n * C + i] - mu) * (in[n * C + i] - mu);
        var /= C;
        for (i = 0; i < C; i++) out[n * C + i] = (in[n * C + i] - mu) / sqrt(var + 1e-5) * w[i] + b[i];
    }
}

/* out[N,NO] = in[N,NI] W[NO,NI]^T + b */
static void d_linear(double* out, const double* in, const double* W, const double* b, int N, int NI, int NO) {
    int n, o, i;
    for (n = 0; n < N; n++)
        for (o = 0; o < NO; o++) {
            double s = b ? b[o] : 0;
            for (i = 0; i < NI; i++) s += in[n * NI + i] * W[o * NI + i];
            out[n * NO + o] = s;
        }
}

/* The mean cross-entropy of the model with parameters d->w on tokens -> targets. */
static double d_loss(const dnet* d, const int* tok, const int* tgt, int B, int T) {
    const int C = d->c->width, V = d->c->vocab, NH = d->c->heads, HS = C / NH, N = B * T;
    const double* p = d->w;
    double *x = calloc((size_t)N * C, 8), *h = calloc((size_t)N * C, 8), *qkv = calloc((size_t)N * 3 * C, 8);
    double *y = calloc((size_t)N * C, 8), *f = calloc((size_t)N * 4 * C, 8), *lg = calloc((size_t)N * V, 8);
    const double *wte = p, *wpe = p + V * C;
    double loss = 0;
    int n, i, l, b, hh, t, u;
    p += (size_t)(V + d->c->ctx) * C;
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (i = 0; i < C; i++) x[(b * T + t) * C + i] = wte[tok[b * T + t] * C + i] + wpe[t * C + i];
    for (l = 0; l < d->c->layers; l++) {
        const double *ln1w = p, *ln1b = ln1w + C, *aw = ln1b + C, *ab = aw + 3 * C * C, *pw = ab + 3 * C;
        const double *pb = pw + C * C, *ln2w = pb + C, *ln2b = ln2w + C, *fw = ln2b + C, *fb = fw + 4 * C * C;
        const double *mw = fb + 4 * C, *mb = mw + 4 * C * C;
        p = mb + C;
        d_layernorm(h, x, ln1w, ln1b, N, C);
        d_linear(qkv, h, aw, ab, N, C, 3 * C);
        for (b = 0; b < B; b++)
            for (hh = 0; hh < NH; hh++)
                for (t = 0; t < T; t++) {
                    double s[64], mx = -1e300, z = 0;
                    for (u = 0; u <= t; u++) {
                        s[u] = 0;
                        for (i = 0; i < HS; i++)
                            s[u] += qkv[(b * T + t) * 3 * C + hh * HS + i] * qkv[(b * T + u) * 3 * C + C + hh * HS + i];
                        s[u] /= sqrt((double)HS);
                        if (s[u] > mx) mx = s[u];
                    }
                    for (u = 0; u <= t; u++) z += s[u] = exp(s[u] - mx);
                    for (i = 0; i < HS; i++) {
                        double o = 0;
                        for (u = 0; u <= t; u++) o += s[u] / z * qkv[(b * T + u) * 3 * C + 2 * C + hh * HS + i];
                        y[(b * T + t) * C + hh * HS + i] = o;
                    }
                }
        d_linear(h, y, pw, pb, N, C, C);
        for (i = 0; i < N * C; i++) x[i] += h[i];
        d_layernorm(h, x, ln2w, ln2b, N, C);
        d_linear(f, h, fw, fb, N, C, 4 * C);
        for (i = 0; i < N * 4 * C; i++) f[i] = 0.5 * f[i] * (1 + erf(f[i] / sqrt(2.0)));
        d_linear(h, f, mw, mb, N, 4 * C, C);
        for (i = 0; i < N * C; i++) x[i] += h[i];
    }
    d_layernorm(h, x, p, p + C, N, C);
    d_linear(lg, h, wte, NULL, N, C, V);
    for (n = 0; n < N; n++) {
        double mx = -1e300, z = 0;
        for (i = 0; i < V; i++) mx = lg[n * V + i] > mx ? lg[n * V + i] : mx;
        for (i = 0; i < V; i++) z += exp(lg[n * V + i] - mx);
        loss += mx + log(z) - lg[n * V + tgt[n]];
    }
    free(x), free(h), free(qkv), free(y), free(f), free(lg);
    return loss / N;
}

/* Every tensor's gradient against central differences of the double forward. The weights are
   drawn large (not GPT-2's 0.02) so that attention is far from uniform and GELU far from linear. */
static void gpt_backward_matches_finite_differences(void) {
    gpt_config c = {.vocab = 11, .ctx = 7, .layers = 2, .heads = 2, .width = 8};
    enum { B = 2, T = 6 };
    int tok[B * T], tgt[B * T], i, pi, worst_at = -1;
    double *w, worst = 0, dloss;
    float loss;
    gpt g;
    ddp_rng r = ddp_rng_seed(7);
    dnet d = {&c, NULL};
    size_t n, at;
    gpt_create(&g, &c, (ddp_device){DDP_DEVICE_CPU, 0}, B * T, 3);
    n = ddp_model_num_elements(g.m);
    for (pi = 0; pi < ddp_model_num_params(g.m); pi++) { /* gains near 1 */
        ddp_param* p = ddp_model_param(g.m, pi);
        int gain = strstr(p->name, "ln_") && strstr(p->name, ".weight");
        for (i = 0; i < (int)p->count; i++) p->data[i] = (ddp_rng_uniform(&r) - 0.5f) * 0.8f + (float)gain;
    }
    for (i = 0; i < B * T; i++) tok[i] = (int)ddp_rng_below(&r, 11), tgt[i] = (int)ddp_rng_below(&r, 11);
    w = calloc(n, sizeof(double)); /* every tensor, in the model's order */
    for (pi = 0, at = 0; pi < ddp_model_num_params(g.m); pi++) {
        ddp_param* p = ddp_model_param(g.m, pi);
        for (i = 0; i < (int)p->count; i++) w[at++] = p->data[i];
    }
    d.w = w;
    CHECK_OK(ddp_model_zero_grad(g.m));
    loss = gpt_forward(&g, tok, tgt, B, T);
    gpt_backward(&g, 1.f);
    dloss = d_loss(&d, tok, tgt, B, T);
    CHECKF(fabs(loss - dloss) <= 1e-5 * fabs(dloss), "forward: loss %.8f in float, %.8f in double", loss, dloss);
    for (pi = 0, at = 0; pi < ddp_model_num_params(g.m); at += ddp_model_param(g.m, pi)->count, pi++) {
        ddp_param* p = ddp_model_param(g.m, pi); /* its numbers are w[at .. at + count) */
        size_t j;
        double err = 0, scale = 1e-3;
        for (j = 0; j < p->count; j++) {
            double keep = w[at + j], h = 1e-5, up, down, fd;
            w[at + j] = keep + h, up = d_loss(&d, tok, tgt, B, T);
            w[at + j] = keep - h, down = d_loss(&d, tok, tgt, B, T);
            w[at + j] = keep;
            fd = (up - down) / (2 * h);
            if (fabs(fd) > scale) scale = fabs(fd);
            if (fabs(fd - p->grad[j]) > err) err = fabs(fd - p->grad[j]);
        }
        err /= scale; /* relative to the tensor's largest gradient */
        CHECKF(err <= 1e-3, "%s: gradient off by %.3g of its largest element", p->name, err);
        if (err > worst) worst = err, worst_at = pi;
    }
    printf("    %d tensors, %zu numbers: worst gradient error %.2g relative (%s); loss %.6f float, %.6f double\n",
           ddp_model_num_params(g.m), n, worst, worst_at >= 0 ? ddp_model_param(g.m, worst_at)->name : "-",
           loss, dloss);
    free(w);
    gpt_free(&g);
}

/* ---- ranks against one process -------------------------------------------------------------------- */

enum { GB = 8, TT = 8, STEPS = 20 };
static const gpt_config g_cfg = {.vocab = 13, .ctx = 8, .layers = 2, .heads = 2, .width = 16};
typedef struct run {
    int zero, accum;
    float clip;
} run;

/* The global batch of a step: GB sequences of TT+1 tokens from a sequence with some structure. */
static void global_batch(int step, int* tok, int* tgt) {
    ddp_rng r = ddp_rng_seed(1000 + (uint64_t)step);
    int s, t;
    for (s = 0; s < GB; s++) {
        int start = (int)ddp_rng_below(&r, 1000), cur = (start * 7) % 13;
        for (t = 0; t < TT; t++) {
            int next = (cur * 5 + 3 + (int)(ddp_rng_below(&r, 4) == 0)) % 13;
            tok[s * TT + t] = cur, tgt[s * TT + t] = next, cur = next;
        }
    }
}

static float lr_at(int step) { /* warmup over 4 steps, then a cosine to a tenth */
    const float peak = 5e-3f;
    if (step < 4) return peak * (step + 1) / 4;
    return peak / 10 + 0.5f * (peak - peak / 10) * (1 + cosf(3.14159265f * (step - 4) / (STEPS - 4)));
}


static int train_rank(int rank, void* arg) {
    const run* c = (const run*)arg;
    ddp_desc d = {0};
    ddp_wrap_desc wd = {0};
    ddp_optim_desc od = {.kind = DDP_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f, .lr = 1e-3f};
    ddp_pg* pg;
    ddp_wrapper* w;
    ddp_optim* o;
    gpt g;
    int tok[GB * TT], tgt[GB * TT], step, k, W, per;
    float norms[STEPS] = {0};
    char path[128];
    d.device.type = g_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU, d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) return printf("    rank %d: ddp_init: %s\n", rank, ddp_error_string()), 10;
    W = ddp_world_size(pg);
    per = GB / (W * c->accum);
    gpt_create(&g, &g_cfg, ddp_pg_device(pg), per * TT, 5 + (uint64_t)rank); /* other weights on other ranks: rank 0's win */
    wd.zero_stage = c->zero;
    if (ddp_wrap(pg, g.m, &wd, &w) != DDP_OK)
        return printf("    rank %d: ddp_wrap: %s\n", rank, ddp_error_string()), 11;
    if (ddp_optim_create(g.m, &od, &o) != DDP_OK) return 12;
    for (step = 0; step < STEPS; step++) {
        global_batch(step, tok, tgt);
        if (ddp_optim_set_lr(o, lr_at(step)) != DDP_OK || ddp_model_zero_grad(g.m) != DDP_OK) return 13;
        for (k = 0; k < c->accum; k++) { /* this rank's micro-batches: rows (k W + rank) per .. */
            int row = (k * W + rank) * per;
            ddp_no_sync(w, k < c->accum - 1);
            gpt_forward(&g, tok + row * TT, tgt + row * TT, per, TT);
            gpt_backward(&g, 1.f / c->accum);
        }
        if (c->clip > 0 && ddp_optim_clip_grad_norm(o, c->clip, &norms[step]) != DDP_OK) return 14;
        if (ddp_optim_step(o) != DDP_OK) return printf("    rank %d: step: %s\n", rank, ddp_error_string()), 15;
    }
    if (ddp_full_params(w, 1) != DDP_OK) return 16;
    snprintf(path, sizeof path, "%s/w%d_%d.bin", g_dir, W, rank);
    {
        float* all = malloc(ddp_model_num_elements(g.m) * 4);
        size_t at = 0;
        for (k = 0; k < ddp_model_num_params(g.m); k++) { /* p->data is on the model's device */
            ddp_param* p = ddp_model_param(g.m, k);
            if (ddp_copy((ddp_device){DDP_DEVICE_CPU, 0}, all + at, g.dev, p->data, p->count * 4, NULL) != DDP_OK)
                return 18;
            at += p->count;
        }
        h_save_floats(path, all, at);
        free(all);
    }
    if (ddp_full_params(w, 0) != DDP_OK) return 17;
    snprintf(path, sizeof path, "%s/n%d_%d.bin", g_dir, W, rank);
    h_save_floats(path, norms, STEPS);
    ddp_wrapper_destroy(w);
    ddp_optim_destroy(o);
    gpt_free(&g);
    ddp_destroy(pg);
    return 0;
}


/* One process, batch GB, no accumulation, stage 0: the reference. */
static size_t reference(float* w, float* norms, float clip) {
    run one = {0, 1, 0};
    char path[128];
    one.clip = clip;
    if (ddp_spawn(1, train_rank, &one) != DDP_OK) return 0;
    snprintf(path, sizeof path, "%s/n1_0.bin", g_dir);
    h_load_floats(path, norms, STEPS);
    snprintf(path, sizeof path, "%s/w1_0.bin", g_dir);
    return h_load_floats(path, w, 1 << 16);
}

static void gpt_ranks_train_what_one_process_trains(void) {
    static float ref[1 << 16], got[1 << 16], first[1 << 16];
    float refn[STEPS], nrm[STEPS];
    const float clip = 0.5f;
    size_t n = reference(ref, refn, clip), k;
    int stage, W, r, clipped = 0, most = 1; /* the most ranks that ran */
    double worst = 0;
    CHECKF(n > 0, "the one-process run failed: %s", ddp_error_string());
    if (!n) return;
    for (k = 0; k < STEPS; k++) clipped += refn[k] > clip;
    CHECKF(clipped > 0, "the clipping never binds (norms %.3f .. %.3f): the test would not see it", refn[0],
           refn[STEPS - 1]);
    for (W = 2; W <= 4; W += 2)
    for (stage = 0; stage <= 3; stage++) {
        run c = {0, 2, 0};
        if ((W == 4 && !g_gpu) || (g_gpu && W > g_gpus)) break; /* 4 ranks: on NCCL only; a GPU per rank */
        most = W;
        double num = 0, den = 0, nn = 0, nd = 0;
        char path[128];
        c.zero = stage, c.clip = clip;
        if (ddp_spawn(W, train_rank, &c) != DDP_OK) {
            CHECKF(0, "zero_stage %d: %s", stage, ddp_error_string());
            continue;
        }
        for (r = 0; r < W; r++) {
            snprintf(path, sizeof path, "%s/w%d_%d.bin", g_dir, W, r);
            CHECKF(h_load_floats(path, r ? got : first, 1 << 16) == n, "zero_stage %d: rank %d saved no weights", stage,
                   r);
            if (r) CHECKF(!memcmp(first, got, n * 4), "zero_stage %d: rank %d's weights differ from rank 0's", stage,
                          r);
            snprintf(path, sizeof path, "%s/n%d_%d.bin", g_dir, W, r);
            h_load_floats(path, nrm, STEPS);
            for (k = 0; k < STEPS; k++)
                nn += (nrm[k] - refn[k]) * (double)(nrm[k] - refn[k]), nd += refn[k] * (double)refn[k];
        }
        for (k = 0; k < n; k++)
            num += (first[k] - ref[k]) * (double)(first[k] - ref[k]), den += ref[k] * (double)ref[k];
        CHECKF(sqrt(num / den) <= 1e-5 && sqrt(nn / nd) <= 1e-5,
               "zero_stage %d, %d ranks x 2 micro-batches: weights %.3g, norms %.3g relative from one process "
               "(limit 1e-5)",
               stage, W, sqrt(num / den), sqrt(nn / nd));
        if (sqrt(num / den) > worst) worst = sqrt(num / den);
    }
    if (most == 1) SKIP("one GPU: NCCL needs a GPU for each rank (the one-process run alone ran)");
    printf("    %zu weights after %d AdamW steps, clipped at %.1f on %d of them: worst relative distance %.2g%s\n", n,
           STEPS, clip, clipped, worst, !g_gpu ? "" : most == 4 ? " (2 and 4 GPUs over NCCL)" : " (2 GPUs over NCCL)");
}

/* ---- the kernels against the C loops ---------------------------------------------------------------- */

/* The largest |a - b| over n numbers, relative to the largest |b| (at least `floor`). */
static double rel_diff(const float* a, const float* b, size_t n, double floor) {
    double err = 0, scale = floor;
    size_t i;
    for (i = 0; i < n; i++) {
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
        if (fabs(a[i] - b[i]) > err) err = fabs(a[i] - b[i]);
    }
    return err / scale;
}

/* The same model (drawn from one seed) on the CPU and on GPU 0, one fixed batch: the loss, the
   next-character probabilities and every tensor's gradient agree to float rounding. Weights are
   made large, as above, so that every kernel's branch matters (attention far from uniform). */
static void gpt_gpu_matches_cpu(void) {
    const gpt_config c = {.vocab = 11, .ctx = 8, .layers = 2, .heads = 2, .width = 16};
    enum { B = 3, T = 8 };
    const ddp_device cpu = {DDP_DEVICE_CPU, 0}, gpu = {DDP_DEVICE_CUDA, 0};
    static float host[1 << 14];
    int tok[B * T], tgt[B * T], i, pi;
    double worst = 0, err, probs_err;
    float loss_cpu, loss_gpu, probs_cpu[11];
    const char* worst_at = "-";
    gpt a, b;
    ddp_rng r = ddp_rng_seed(11);
    gpt_create(&a, &c, cpu, B * T, 4);
    gpt_create(&b, &c, gpu, B * T, 4);
    for (pi = 0; pi < ddp_model_num_params(a.m); pi++) {
        ddp_param *p = ddp_model_param(a.m, pi), *q = ddp_model_param(b.m, pi);
        int gain = strstr(p->name, "ln_") && strstr(p->name, ".weight");
        for (i = 0; i < (int)p->count; i++) p->data[i] = (ddp_rng_uniform(&r) - 0.5f) * 0.8f + (float)gain;
        CHECK_OK(ddp_copy(gpu, q->data, cpu, p->data, p->count * 4, NULL));
    }
    for (i = 0; i < B * T; i++) tok[i] = (int)ddp_rng_below(&r, 11), tgt[i] = (int)ddp_rng_below(&r, 11);
    CHECK_OK(ddp_model_zero_grad(a.m));
    CHECK_OK(ddp_model_zero_grad(b.m));
    loss_cpu = gpt_forward(&a, tok, tgt, B, T), loss_gpu = gpt_forward(&b, tok, tgt, B, T);
    CHECKF(fabs(loss_cpu - loss_gpu) <= 1e-5 * fabs(loss_cpu), "loss %.7f on the CPU, %.7f on the GPU", loss_cpu,
           loss_gpu);
    gpt_backward(&a, 0.5f), gpt_backward(&b, 0.5f);
    for (pi = 0; pi < ddp_model_num_params(a.m); pi++) {
        ddp_param *p = ddp_model_param(a.m, pi), *q = ddp_model_param(b.m, pi);
        CHECK_OK(ddp_copy(cpu, host, gpu, q->grad, p->count * 4, NULL));
        err = rel_diff(host, p->grad, p->count, 1e-6);
        CHECKF(err <= 1e-4, "%s: the GPU's gradient is off by %.3g of its largest element", p->name, err);
        if (err > worst) worst = err, worst_at = p->name;
    }
    gpt_forward(&a, tok, NULL, 1, T), gpt_forward(&b, tok, NULL, 1, T); /* sampling's forward */
    memcpy(probs_cpu, gpt_probs(&a, T - 1), sizeof probs_cpu);
    probs_err = rel_diff(gpt_probs(&b, T - 1), probs_cpu, 11, 1e-6);
    CHECKF(probs_err <= 1e-5, "the last position's probabilities differ by %.3g", probs_err);
    printf("    loss %.6f (CPU) and %.6f (GPU); gradients within %.2g of each tensor's largest (%s); "
           "probabilities within %.2g\n", loss_cpu, loss_gpu, worst, worst_at, probs_err);
    gpt_free(&a), gpt_free(&b);
}

int main(int argc, char** argv) {
    char tmpl[] = "/tmp/ddp_gpt_XXXXXX";
    char why[256];
    g_gpu = argc > 1 && !strcmp(argv[1], "--gpu");
    if (g_gpu) {
        g_gpus = h_gpus_in_child(why, sizeof why);
        if (g_gpus < 1) {
            printf("skip gpt (--gpu): %s\n", why);
            return 0;
        }
    }
    if (!mkdtemp(tmpl)) return 1;
    snprintf(g_dir, sizeof g_dir, "%s", tmpl);
    if (!g_gpu) RUN(gpt_backward_matches_finite_differences);
    RUN(gpt_ranks_train_what_one_process_trains);
    if (g_gpu) RUN(gpt_gpu_matches_cpu); /* last: CUDA in this process, and a forked rank could not use it */
    h_remove_tree(g_dir);
    return H_EXIT();
}
