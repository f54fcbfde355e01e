/* gpt.h: the GPT of TUTORIAL.md's chapter 12, forward and backward written out by hand.

   A GPT-2-style model of characters, the architecture of nanoGPT with bias=True and no dropout:
       x = wte[token] + wpe[position]
       for each block:  x = x + attn.c_proj(attention(attn.c_attn(ln_1(x))))      causal, fused qkv
                        x = x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))                4x wide, exact GELU
       logits = ln_f(x) wte^T                                                       tied output layer
       loss = mean cross-entropy of the logits against the next characters
   Every tensor carries nanoGPT's state_dict name, so a snapshot loads into nanoGPT's GPT class.

   ddp.h allocates and initialises every tensor (ddp_model_add), so that under ZeRO-2 and -3 no rank
   holds a whole copy of the weights or gradients anywhere. What DDP needs from this file:
     - unit 0 (the whole model) brackets forward and backward; the embeddings and ln_f belong to it;
     - block l is unit l + 1, bracketed where it is used: under ZeRO-3 its weights exist only
       between ddp_unit_begin and ddp_unit_end, so p->data is read there and nowhere else;
     - backward calls ddp_param_grad_ready(p) the moment p's gradient is final: a block's tensors
       as its backward leaves them, wte last of all (the output layer and the embedding both add
       into its gradient).
   The matrix products go through ddp_gemm (OpenBLAS or ddp.h's loop on the CPU); the other
   operations are the plain C loops below, one function per operation, forward and backward side
   by side. This file holds the model only: examples/ch12_gpt.c trains it.

   Shapes: B sequences of T characters, C = width, NH heads of HS = C / NH, V characters, L blocks;
   activations are row-major [B*T, ...]. */
#ifndef GPT_H
#define GPT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct gpt_config {
    int vocab, ctx, layers, heads, width; /* V, the longest T, L, NH, C */
} gpt_config;

/* One block's tensors, in nanoGPT's order. */
typedef struct gpt_block {
    ddp_param *ln1_w, *ln1_b, *attn_w, *attn_b, *attn_proj_w, *attn_proj_b;
    ddp_param *ln2_w, *ln2_b, *fc_w, *fc_b, *mlp_proj_w, *mlp_proj_b;
} gpt_block;

/* What one block's forward keeps for its backward. */
typedef struct gpt_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [BT,C], [BT], [BT] */
    float *qkv;                       /* [BT,3C] */
    float *att;                       /* [B,NH,T,T]: the attention probabilities */
    float *atty;                      /* [BT,C]: attention's output, before c_proj */
    float *res1;                      /* [BT,C]: x after the attention's residual */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc, *fc_gelu;              /* [BT,4C] */
    float *res2;                      /* [BT,C]: the block's output */
} gpt_acts;

typedef struct gpt {
    gpt_config cfg;
    ddp_model* m;
    ddp_param *wte, *wpe, *lnf_w, *lnf_b;
    gpt_block* h;
    /* activations for up to max_bt = B*T positions */
    int max_bt, B, T;
    int* tokens; /* [BT] the last forward's input, and its targets (or none) */
    int* targets;
    float* x0;   /* [BT,C] the embeddings */
    gpt_acts* a; /* [L] */
    float *lnf, *lnf_mean, *lnf_rstd;
    float* probs; /* [BT,V]: the softmax of the logits (backward turns it into their gradient) */
    float *dx, *dbuf, *dbig; /* backward's scratch: [BT,C], [BT,C], [BT,4C] */
    float* dscores;          /* [T,T]: one head's gradient of its attention scores */
    float loss_scale;        /* what the last forward's loss is multiplied by in backward */
} gpt;

/* ---- the operations, forward and backward ------------------------------------------------------ */

static void gpt_encoder_forward(float* out, const int* tok, const float* wte, const float* wpe, int B, int T, int C) {
    int b, t, i;
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tok[b * T + t] * C, *p = wpe + (size_t)t * C;
            for (i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}

static void gpt_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tok, int B, int T, int C) {
    int b, t, i;
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++) {
            const float* d = dout + ((size_t)b * T + t) * C;
            float *e = dwte + (size_t)tok[b * T + t] * C, *p = dwpe + (size_t)t * C;
            for (i = 0; i < C; i++) e[i] += d[i], p[i] += d[i];
        }
}

/* LayerNorm over the last dimension (PyTorch's: biased variance, eps 1e-5). */
static void gpt_layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w,
                                  const float* bias, int N, int C) {
    int n, i;
    for (n = 0; n < N; n++) {
        const float* x = in + (size_t)n * C;
        float* o = out + (size_t)n * C;
        float mu = 0, var = 0, s;
        for (i = 0; i < C; i++) mu += x[i];
        mu /= C;
        for (i = 0; i < C; i++) var += (x[i] - mu) * (x[i] - mu);
        s = 1.f / sqrtf(var / C + 1e-5f);
        for (i = 0; i < C; i++) o[i] = (x[i] - mu) * s * w[i] + bias[i];
        mean[n] = mu, rstd[n] = s;
    }
}

/* Adds into din, dw and db. */
static void gpt_layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in,
                                   const float* w, const float* mean, const float* rstd, int N, int C) {
    int n, i;
    for (n = 0; n < N; n++) {
        const float *x = in + (size_t)n * C, *d = dout + (size_t)n * C;
        float* di = din + (size_t)n * C;
        float dmean = 0, dnorm_norm = 0;
        for (i = 0; i < C; i++) { /* the two means the normalisation's gradient subtracts */
            float norm = (x[i] - mean[n]) * rstd[n], dnorm = d[i] * w[i];
            dmean += dnorm, dnorm_norm += dnorm * norm;
        }
        dmean /= C, dnorm_norm /= C;
        for (i = 0; i < C; i++) {
            float norm = (x[i] - mean[n]) * rstd[n], dnorm = d[i] * w[i];
            db[i] += d[i];
            dw[i] += d[i] * norm;
            di[i] += (dnorm - dmean - norm * dnorm_norm) * rstd[n];
        }
    }
}

/* out[N,OC] = in[N,IC] w[OC,IC]^T + bias (nn.Linear). */
static void gpt_linear_forward(ddp_model* m, float* out, const float* in, const float* w, const float* bias, int N,
                               int IC, int OC) {
    int n, o;
    DDP_CHECK(ddp_gemm(m, 0, 1, N, OC, IC, 1.f, in, IC, w, IC, 0.f, out, OC));
    for (n = 0; n < N; n++)
        for (o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

/* din = dout w (overwritten: each input feeds this layer alone), dw += dout^T in, db += column sums. */
static void gpt_linear_backward(ddp_model* m, float* din, float* dw, float* db, const float* dout, const float* in,
                                const float* w, int N, int IC, int OC) {
    int n, o;
    DDP_CHECK(ddp_gemm(m, 0, 0, N, IC, OC, 1.f, dout, OC, w, IC, 0.f, din, IC));
    DDP_CHECK(ddp_gemm(m, 1, 0, OC, IC, N, 1.f, dout, OC, in, IC, 1.f, dw, IC));
    for (n = 0; n < N; n++)
        for (o = 0; o < OC; o++) db[o] += dout[(size_t)n * OC + o];
}

/* Causal self-attention on qkv [B,T,3C] (q, k, v side by side, each split into NH heads of HS).
   For each sequence and head: scores S = Q K^T / sqrt(HS), the future masked (position t sees
   positions 0..t), P = softmax of each row, out = P V. Q, K and V are column blocks of qkv, so
   their rows lie 3C apart: the two products go through ddp_gemm with that leading dimension.
   att keeps every head's P [B,NH,T,T] for backward. */
static void gpt_attention_forward(ddp_model* m, float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    const int HS = C / NH, C3 = 3 * C;
    const float scale = 1.f / sqrtf((float)HS);
    int b, h, t, u;
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++) {
            const float* q = qkv + (size_t)b * T * C3 + h * HS; /* q + C: this head's keys, q + 2C: values */
            float* p = att + ((size_t)b * NH + h) * T * T;
            DDP_CHECK(ddp_gemm(m, 0, 1, T, T, HS, scale, q, C3, q + C, C3, 0.f, p, T));
            for (t = 0; t < T; t++) {
                float* row = p + (size_t)t * T;
                float mx = row[0], sum = 0;
                for (u = 1; u <= t; u++) mx = row[u] > mx ? row[u] : mx;
                for (u = 0; u <= t; u++) sum += row[u] = expf(row[u] - mx);
                for (u = 0; u <= t; u++) row[u] /= sum;
                for (u = t + 1; u < T; u++) row[u] = 0; /* the future: masked */
            }
            DDP_CHECK(ddp_gemm(m, 0, 0, T, HS, T, 1.f, p, T, q + 2 * C, C3, 0.f, out + (size_t)b * T * C + h * HS, C));
        }
}

/* dqkv (overwritten) from dout: dP = dOut V^T; through the softmax, dS = P (dP - rowsum(P dP));
   then dQ = dS K / sqrt(HS), dK = dS^T Q / sqrt(HS), dV = P^T dOut. ds: one head's [T,T] scratch. */
static void gpt_attention_backward(ddp_model* m, float* dqkv, float* ds, const float* dout, const float* qkv,
                                   const float* att, int B, int T, int C, int NH) {
    const int HS = C / NH, C3 = 3 * C;
    const float scale = 1.f / sqrtf((float)HS);
    int b, h, t, u;
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * HS, *p = att + ((size_t)b * NH + h) * T * T;
            const float* dy = dout + (size_t)b * T * C + h * HS;
            float* dq = dqkv + (size_t)b * T * C3 + h * HS;
            DDP_CHECK(ddp_gemm(m, 0, 1, T, T, HS, 1.f, dy, C, q + 2 * C, C3, 0.f, ds, T)); /* dP */
            for (t = 0; t < T; t++) {
                const float* pr = p + (size_t)t * T;
                float* d = ds + (size_t)t * T, dot = 0;
                for (u = 0; u <= t; u++) dot += pr[u] * d[u];
                for (u = 0; u < T; u++) d[u] = u <= t ? pr[u] * (d[u] - dot) * scale : 0.f;
            }
            DDP_CHECK(ddp_gemm(m, 0, 0, T, HS, T, 1.f, ds, T, q + C, C3, 0.f, dq, C3));             /* dQ */
            DDP_CHECK(ddp_gemm(m, 1, 0, T, HS, T, 1.f, ds, T, q, C3, 0.f, dq + C, C3));             /* dK */
            DDP_CHECK(ddp_gemm(m, 1, 0, T, HS, T, 1.f, p, T, dy, C, 0.f, dq + 2 * C, C3));          /* dV */
        }
}

/* GELU, the exact form (nn.GELU's default, which nanoGPT uses): x Phi(x), Phi the normal
   distribution's cdf, 0.5 (1 + erf(x / sqrt 2)). erf here is Abramowitz and Stegun's formula
   7.1.26, within 1.5e-7 of the true value (float's own rounding near 1 is 6e-8), because its one
   exponential, exp(-x^2/2), is also what the backward's density needs: one expf per element each
   way, where erff and expf would be two. */
static float gpt__erf_half(float x, float* e) { /* erf(x / sqrt 2), and *e = exp(-x^2 / 2) */
    float z = fabsf(x) * 0.70710678f, t = 1.f / (1.f + 0.3275911f * z), y;
    *e = expf(-0.5f * x * x);
    y = 1.f - t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f)))) *
                  *e;
    return x < 0 ? -y : y;
}

static void gpt_gelu_forward(float* out, const float* in, size_t n) {
    size_t i;
    float e;
    for (i = 0; i < n; i++) out[i] = 0.5f * in[i] * (1.f + gpt__erf_half(in[i], &e));
}

/* din = dout (Phi(x) + x phi(x)), phi the normal density; din may be dout. */
static void gpt_gelu_backward(float* din, const float* in, const float* dout, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        float e, cdf = 0.5f * (1.f + gpt__erf_half(in[i], &e));
        din[i] = dout[i] * (cdf + in[i] * 0.39894228f * e);
    }
}

static void gpt_residual_forward(float* out, const float* a, const float* b, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* Softmax of each row of logits [N,V] in place; returns the summed -log p[target] (targets may be
   NULL: probabilities only, for sampling). */
static double gpt_softmax_xent_forward(float* probs, const int* targets, int N, int V) {
    double total = 0;
    int n, v;
    for (n = 0; n < N; n++) {
        float* p = probs + (size_t)n * V;
        float mx = p[0], sum = 0;
        for (v = 1; v < V; v++) mx = p[v] > mx ? p[v] : mx;
        for (v = 0; v < V; v++) sum += p[v] = expf(p[v] - mx);
        for (v = 0; v < V; v++) p[v] /= sum;
        if (targets) total -= log((double)p[targets[n]]);
    }
    return total;
}

/* probs -> the gradient of (scale x the mean loss) with respect to the logits, in place. */
static void gpt_softmax_xent_backward(float* probs, const int* targets, int N, int V, float scale) {
    int n, v;
    for (n = 0; n < N; n++) {
        float* p = probs + (size_t)n * V;
        p[targets[n]] -= 1.f;
        for (v = 0; v < V; v++) p[v] *= scale / (float)N;
    }
}

/* ---- building the model -------------------------------------------------------------------------- */

/* One tensor, initialised as GPT-2 (nanoGPT's _init_weights) starts it: N(0, 0.02) for the
   matrices and embeddings, N(0, 0.02/sqrt(2L)) for the two projections into the residual stream,
   zero biases, unit gains. Weight decay for the 2-D tensors only (nanoGPT's parameter groups). */
static ddp_param* gpt__tensor(gpt* g, const char* name, int rows, int cols, int unit) {
    ddp_tensor_desc t;
    ddp_param* p;
    memset(&t, 0, sizeof t);
    t.name = name, t.unit = unit;
    t.ndim = cols ? 2 : 1, t.shape[0] = rows, t.shape[1] = cols;
    t.no_decay = cols == 0;
    if (cols) t.init = DDP_INIT_NORMAL, t.scale = strstr(name, "c_proj") ? 0.02f / sqrtf(2.f * g->cfg.layers) : 0.02f;
    else t.init = strstr(name, "ln_") && strstr(name, ".weight") ? DDP_INIT_ONES : DDP_INIT_ZEROS;
    DDP_CHECK(ddp_model_add(g->m, &t, &p));
    return p;
}

static void* gpt__alloc(size_t n) {
    void* p = calloc(n ? n : 1, 1);
    if (!p) {
        fprintf(stderr, "gpt: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
#define GPT__FLOATS(n) ((float*)gpt__alloc((size_t)(n) * sizeof(float)))

/* The model on the CPU, drawn from `seed`, with room for batches of up to max_bt = B*T positions. */
static void gpt_create(gpt* g, const gpt_config* cfg, int max_bt, uint64_t seed) {
    ddp_model_desc md;
    const int C = cfg->width, L = cfg->layers, V = cfg->vocab, T = cfg->ctx;
    int l;
    char name[64];
    memset(g, 0, sizeof *g), memset(&md, 0, sizeof md);
    if (C % cfg->heads) {
        fprintf(stderr, "gpt: width %d is not a multiple of %d heads\n", C, cfg->heads);
        exit(2);
    }
    g->cfg = *cfg, g->max_bt = max_bt;
    md.device.type = DDP_DEVICE_CPU, md.seed = seed;
    DDP_CHECK(ddp_model_create(&md, &g->m));
    g->h = (gpt_block*)gpt__alloc(L * sizeof(gpt_block));
    g->wte = gpt__tensor(g, "transformer.wte.weight", V, C, 0);
    g->wpe = gpt__tensor(g, "transformer.wpe.weight", T, C, 0);
    for (l = 0; l < L; l++) {
        gpt_block* k = &g->h[l];
#define GPT__T(field, suffix, rows, cols) \
    (snprintf(name, sizeof name, "transformer.h.%d.%s", l, suffix), k->field = gpt__tensor(g, name, rows, cols, l + 1))
        GPT__T(ln1_w, "ln_1.weight", C, 0), GPT__T(ln1_b, "ln_1.bias", C, 0);
        GPT__T(attn_w, "attn.c_attn.weight", 3 * C, C), GPT__T(attn_b, "attn.c_attn.bias", 3 * C, 0);
        GPT__T(attn_proj_w, "attn.c_proj.weight", C, C), GPT__T(attn_proj_b, "attn.c_proj.bias", C, 0);
        GPT__T(ln2_w, "ln_2.weight", C, 0), GPT__T(ln2_b, "ln_2.bias", C, 0);
        GPT__T(fc_w, "mlp.c_fc.weight", 4 * C, C), GPT__T(fc_b, "mlp.c_fc.bias", 4 * C, 0);
        GPT__T(mlp_proj_w, "mlp.c_proj.weight", C, 4 * C), GPT__T(mlp_proj_b, "mlp.c_proj.bias", C, 0);
#undef GPT__T
    }
    g->lnf_w = gpt__tensor(g, "transformer.ln_f.weight", C, 0, 0);
    g->lnf_b = gpt__tensor(g, "transformer.ln_f.bias", C, 0, 0);

    g->tokens = (int*)gpt__alloc((size_t)max_bt * sizeof(int));
    g->targets = (int*)gpt__alloc((size_t)max_bt * sizeof(int));
    g->x0 = GPT__FLOATS((size_t)max_bt * C);
    g->a = (gpt_acts*)gpt__alloc(L * sizeof(gpt_acts));
    for (l = 0; l < L; l++) {
        gpt_acts* a = &g->a[l];
        a->ln1 = GPT__FLOATS((size_t)max_bt * C), a->ln1_mean = GPT__FLOATS(max_bt), a->ln1_rstd = GPT__FLOATS(max_bt);
        a->qkv = GPT__FLOATS((size_t)max_bt * 3 * C);
        a->att = GPT__FLOATS((size_t)max_bt * cfg->heads * T); /* B*NH*T*T with B*T <= max_bt */
        a->atty = GPT__FLOATS((size_t)max_bt * C), a->res1 = GPT__FLOATS((size_t)max_bt * C);
        a->ln2 = GPT__FLOATS((size_t)max_bt * C), a->ln2_mean = GPT__FLOATS(max_bt), a->ln2_rstd = GPT__FLOATS(max_bt);
        a->fc = GPT__FLOATS((size_t)max_bt * 4 * C), a->fc_gelu = GPT__FLOATS((size_t)max_bt * 4 * C);
        a->res2 = GPT__FLOATS((size_t)max_bt * C);
    }
    g->lnf = GPT__FLOATS((size_t)max_bt * C), g->lnf_mean = GPT__FLOATS(max_bt), g->lnf_rstd = GPT__FLOATS(max_bt);
    g->probs = GPT__FLOATS((size_t)max_bt * V);
    g->dx = GPT__FLOATS((size_t)max_bt * C), g->dbuf = GPT__FLOATS((size_t)max_bt * C);
    g->dbig = GPT__FLOATS((size_t)max_bt * 4 * C);
    g->dscores = GPT__FLOATS((size_t)T * T);
}

static void gpt_free(gpt* g) {
    int l;
    ddp_model_destroy(g->m);
    for (l = 0; l < g->cfg.layers; l++) {
        gpt_acts* a = &g->a[l];
        free(a->ln1), free(a->ln1_mean), free(a->ln1_rstd), free(a->qkv), free(a->att), free(a->atty), free(a->res1);
        free(a->ln2), free(a->ln2_mean), free(a->ln2_rstd), free(a->fc), free(a->fc_gelu), free(a->res2);
    }
    free(g->a), free(g->h), free(g->tokens), free(g->targets), free(g->x0);
    free(g->lnf), free(g->lnf_mean), free(g->lnf_rstd), free(g->probs), free(g->dx), free(g->dbuf), free(g->dbig);
    free(g->dscores);
}

/* ---- forward and backward ------------------------------------------------------------------------ */

/* Forward on B sequences of T tokens (B*T <= max_bt, T <= ctx). With targets, returns the mean
   cross-entropy and keeps what backward needs; without (NULL), returns 0 and leaves the
   next-character probabilities in g->probs ([B*T, V]). */
static float gpt_forward(gpt* g, const int* tokens, const int* targets, int B, int T) {
    const int C = g->cfg.width, NH = g->cfg.heads, V = g->cfg.vocab, L = g->cfg.layers, BT = B * T;
    const float* x = g->x0;
    double total = 0;
    int l;
    if (BT > g->max_bt || T > g->cfg.ctx || B < 1 || T < 1) {
        fprintf(stderr, "gpt_forward: %d x %d tokens do not fit (at most %d positions, context %d)\n", B, T,
                g->max_bt, g->cfg.ctx);
        exit(2);
    }
    g->B = B, g->T = T;
    memcpy(g->tokens, tokens, (size_t)BT * sizeof(int));
    if (targets) memcpy(g->targets, targets, (size_t)BT * sizeof(int));
    DDP_CHECK(ddp_unit_begin(g->m, 0, DDP_FORWARD)); /* the embeddings and ln_f: unit 0's */
    gpt_encoder_forward(g->x0, tokens, g->wte->data, g->wpe->data, B, T, C);
    for (l = 0; l < L; l++) {
        gpt_block* k = &g->h[l];
        gpt_acts* a = &g->a[l];
        DDP_CHECK(ddp_unit_begin(g->m, l + 1, DDP_FORWARD)); /* ZeRO-3 gathers block l here */
        gpt_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, k->ln1_w->data, k->ln1_b->data, BT, C);
        gpt_linear_forward(g->m, a->qkv, a->ln1, k->attn_w->data, k->attn_b->data, BT, C, 3 * C);
        gpt_attention_forward(g->m, a->atty, a->att, a->qkv, B, T, C, NH);
        gpt_linear_forward(g->m, a->res1, a->atty, k->attn_proj_w->data, k->attn_proj_b->data, BT, C, C);
        gpt_residual_forward(a->res1, a->res1, x, (size_t)BT * C);
        gpt_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res1, k->ln2_w->data, k->ln2_b->data, BT, C);
        gpt_linear_forward(g->m, a->fc, a->ln2, k->fc_w->data, k->fc_b->data, BT, C, 4 * C);
        gpt_gelu_forward(a->fc_gelu, a->fc, (size_t)BT * 4 * C);
        gpt_linear_forward(g->m, a->res2, a->fc_gelu, k->mlp_proj_w->data, k->mlp_proj_b->data, BT, 4 * C, C);
        gpt_residual_forward(a->res2, a->res2, a->res1, (size_t)BT * C);
        DDP_CHECK(ddp_unit_end(g->m, l + 1, DDP_FORWARD));
        x = a->res2;
    }
    gpt_layernorm_forward(g->lnf, g->lnf_mean, g->lnf_rstd, x, g->lnf_w->data, g->lnf_b->data, BT, C);
    DDP_CHECK(ddp_gemm(g->m, 0, 1, BT, V, C, 1.f, g->lnf, C, g->wte->data, C, 0.f, g->probs, V)); /* logits */
    total = gpt_softmax_xent_forward(g->probs, targets, BT, V);
    DDP_CHECK(ddp_unit_end(g->m, 0, DDP_FORWARD));
    return targets ? (float)(total / BT) : 0.f;
}

/* Backward of the last forward's loss times `scale` (1/K for K accumulated micro-batches), adding
   into every p->grad and announcing each gradient the moment it is final. */
static void gpt_backward(gpt* g, float scale) {
    const int C = g->cfg.width, NH = g->cfg.heads, V = g->cfg.vocab, L = g->cfg.layers, B = g->B, T = g->T;
    const int BT = B * T;
    float *dx = g->dx, *dtmp = g->dbuf;
    int l;
    DDP_CHECK(ddp_unit_begin(g->m, 0, DDP_BACKWARD));
    gpt_softmax_xent_backward(g->probs, g->targets, BT, V, scale); /* g->probs is now dlogits */
    /* the output layer, tied to wte: wte's gradient is not final until the embedding's adds */
    DDP_CHECK(ddp_gemm(g->m, 1, 0, V, C, BT, 1.f, g->probs, V, g->lnf, C, 1.f, g->wte->grad, C));
    DDP_CHECK(ddp_gemm(g->m, 0, 0, BT, C, V, 1.f, g->probs, V, g->wte->data, C, 0.f, dtmp, C));
    memset(dx, 0, (size_t)BT * C * sizeof(float));
    gpt_layernorm_backward(dx, g->lnf_w->grad, g->lnf_b->grad, dtmp, L ? g->a[L - 1].res2 : g->x0, g->lnf_w->data,
                           g->lnf_mean, g->lnf_rstd, BT, C);
    DDP_CHECK(ddp_param_grad_ready(g->lnf_b));
    DDP_CHECK(ddp_param_grad_ready(g->lnf_w));
    for (l = L - 1; l >= 0; l--) { /* dx: the gradient of block l's output, then of its input */
        gpt_block* k = &g->h[l];
        gpt_acts* a = &g->a[l];
        const float* x = l ? g->a[l - 1].res2 : g->x0;
        DDP_CHECK(ddp_unit_begin(g->m, l + 1, DDP_BACKWARD)); /* ZeRO-3 gathers; ZeRO-2/3 make p->grad */
        /* the MLP's branch: dx reaches its output unchanged through the residual */
        gpt_linear_backward(g->m, g->dbig, k->mlp_proj_w->grad, k->mlp_proj_b->grad, dx, a->fc_gelu,
                            k->mlp_proj_w->data, BT, 4 * C, C);
        DDP_CHECK(ddp_param_grad_ready(k->mlp_proj_b));
        DDP_CHECK(ddp_param_grad_ready(k->mlp_proj_w));
        gpt_gelu_backward(g->dbig, a->fc, g->dbig, (size_t)BT * 4 * C);
        gpt_linear_backward(g->m, dtmp, k->fc_w->grad, k->fc_b->grad, g->dbig, a->ln2, k->fc_w->data, BT, C, 4 * C);
        DDP_CHECK(ddp_param_grad_ready(k->fc_b));
        DDP_CHECK(ddp_param_grad_ready(k->fc_w));
        gpt_layernorm_backward(dx, k->ln2_w->grad, k->ln2_b->grad, dtmp, a->res1, k->ln2_w->data, a->ln2_mean,
                               a->ln2_rstd, BT, C); /* dx is now the gradient of res1 */
        DDP_CHECK(ddp_param_grad_ready(k->ln2_b));
        DDP_CHECK(ddp_param_grad_ready(k->ln2_w));
        /* the attention's branch */
        gpt_linear_backward(g->m, dtmp, k->attn_proj_w->grad, k->attn_proj_b->grad, dx, a->atty,
                            k->attn_proj_w->data, BT, C, C);
        DDP_CHECK(ddp_param_grad_ready(k->attn_proj_b));
        DDP_CHECK(ddp_param_grad_ready(k->attn_proj_w));
        gpt_attention_backward(g->m, g->dbig, g->dscores, dtmp, a->qkv, a->att, B, T, C, NH); /* dqkv: [BT,3C] */
        gpt_linear_backward(g->m, dtmp, k->attn_w->grad, k->attn_b->grad, g->dbig, a->ln1, k->attn_w->data, BT, C,
                            3 * C);
        DDP_CHECK(ddp_param_grad_ready(k->attn_b));
        DDP_CHECK(ddp_param_grad_ready(k->attn_w));
        gpt_layernorm_backward(dx, k->ln1_w->grad, k->ln1_b->grad, dtmp, x, k->ln1_w->data, a->ln1_mean,
                               a->ln1_rstd, BT, C); /* dx is now the gradient of the block's input */
        DDP_CHECK(ddp_param_grad_ready(k->ln1_b));
        DDP_CHECK(ddp_param_grad_ready(k->ln1_w));
        DDP_CHECK(ddp_unit_end(g->m, l + 1, DDP_BACKWARD)); /* ZeRO-2/3 reduce-scatter block l */
    }
    gpt_encoder_backward(g->wte->grad, g->wpe->grad, dx, g->tokens, B, T, C);
    DDP_CHECK(ddp_param_grad_ready(g->wpe));
    DDP_CHECK(ddp_param_grad_ready(g->wte)); /* last: both of its uses have added in */
    DDP_CHECK(ddp_unit_end(g->m, 0, DDP_BACKWARD)); /* DDP waits for the all-reduces here */
}

#endif /* GPT_H */
