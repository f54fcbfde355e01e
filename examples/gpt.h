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
   The matrix products go through ddp_gemm and ddp_gemm_batched (cuBLAS on a GPU; OpenBLAS or
   ddp.h's loop on the CPU).
   Each other operation is written twice, side by side: a plain C loop for the CPU, and the same
   loop as a CUDA kernel (in a string, compiled at run time by ddp_kernels_compile and run by
   ddp_launch) for a GPU, one thread per element or per row, each row's sum in the C loop's order.
   The sums down the columns (the gradients of biases and gains) take two kernels on a GPU, so
   that thousands of threads share the rows (gpt_sum_chunks).
   On a GPU every activation lives there too; only the tokens go up and the losses come back.
   This file holds the model only: examples/ch12_gpt.c trains it.

   Shapes: B sequences of T characters, C = width, NH heads of HS = C / NH, V characters, L blocks;
   activations are row-major [B*T, ...]. */
#ifndef GPT_H
#define GPT_H

#include <math.h>
#include <stdio.h>
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
    float* fc_slope;                  /* [BT,4C] GELU's derivative (on the CPU only; NULL on a GPU) */
    float *res2;                      /* [BT,C]: the block's output */
} gpt_acts;

typedef struct gpt {
    gpt_config cfg;
    ddp_model* m;
    ddp_device dev; /* where the model and its activations live */
    int gpu;        /* 1: the operations run as the kernels below, on the model's stream */
    ddp_param *wte, *wpe, *lnf_w, *lnf_b;
    gpt_block* h;
    /* activations for up to max_bt = B*T positions */
    int max_bt, B, T;
    int* tokens; /* [BT] the last forward's input, and its targets (or none), on the device */
    int* targets;
    float* losses;      /* [BT] each position's loss (on the GPU; the host adds them up) */
    float* host_losses; /* [BT] */
    float* host_probs;  /* [V] one row of probabilities, copied to the host (gpt_probs) */
    float* x0;   /* [BT,C] the embeddings */
    gpt_acts* a; /* [L] */
    float *lnf, *lnf_mean, *lnf_rstd;
    float* probs; /* [BT,V]: the softmax of the logits (backward turns it into their gradient) */
    float *dx, *dbuf, *dbig; /* backward's scratch: [BT,C], [BT,C], [BT,4C] */
    float* part;             /* the column sums' partial sums, on a GPU (gpt_sum_chunks) */
    float* dscores;          /* [B,NH,T,T]: the gradient of the attention scores */
    float loss_scale;        /* what the last forward's loss is multiplied by in backward */
} gpt;

/* ---- the operations, forward and backward ------------------------------------------------------ */

/* Each operation below is a C function that runs its loop on the CPU or, for a model on a GPU,
   launches the kernel of the same name: `n` threads, each one element or one row of the loop. The
   kernels' source sits beside each function, in strings that gpt_create hands to ddp.h. Every
   kernel begins with GPT_THREAD: its thread's number, and a return for the threads past the end
   (the last block of 256 threads is only partly used). */
#define GPT_LAUNCH(g, name, n, ...)                                                  \
    do {                                                                             \
        void* gpt_args_[] = {__VA_ARGS__};                                           \
        DDP_CHECK(ddp_launch((g)->m, name, (long long)(n), gpt_args_));              \
    } while (0)

static const char gpt_cu_prelude[] =
    "#define GPT_THREAD(i, n) long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;"
    " if (i >= (long long)(n)) return\n";

/* x = wte[token] + wpe[position]: one thread per number of the output */
static void gpt_encoder_forward(gpt* g, float* out, const int* tok, const float* wte, const float* wpe, int B, int T,
                                int C) {
    int b, t, i, BT = B * T;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_encoder_forward", (long long)BT * C, &out, &tok, &wte, &wpe, &BT, &T, &C);
        return;
    }
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)tok[b * T + t] * C, *p = wpe + (size_t)t * C;
            for (i = 0; i < C; i++) o[i] = e[i] + p[i];
        }
}
static const char gpt_cu_encoder_forward[] =
    "extern \"C\" __global__ void gpt_encoder_forward(float* out, const int* tok, const float* wte,"
    " const float* wpe, int BT, int T, int C) {\n"
    "  GPT_THREAD(i, (long long)BT * C);\n"
    "  long long n = i / C, c = i % C; /* position n of the batch, channel c */\n"
    "  out[i] = wte[tok[n] * (long long)C + c] + wpe[(n % T) * C + c]; }\n";

/* Adds into the rows of dwte and dwpe that the positions used. On the GPU one thread owns one
   number of dwte or dwpe and adds the positions in order: no two threads write the same number
   (no atomics), and the sums are the CPU's. */
static void gpt_encoder_backward(gpt* g, float* dwte, float* dwpe, const float* dout, const int* tok, int B, int T,
                                 int C) {
    int b, t, i, BT = B * T, V = g->cfg.vocab;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_encoder_backward", (long long)(V + T) * C, &dwte, &dwpe, &dout, &tok, &BT, &T, &V, &C);
        return;
    }
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++) {
            const float* d = dout + ((size_t)b * T + t) * C;
            float *e = dwte + (size_t)tok[b * T + t] * C, *p = dwpe + (size_t)t * C;
            for (i = 0; i < C; i++) e[i] += d[i], p[i] += d[i];
        }
}
static const char gpt_cu_encoder_backward[] =
    "extern \"C\" __global__ void gpt_encoder_backward(float* dwte, float* dwpe, const float* dout,"
    " const int* tok, int BT, int T, int V, int C) {\n"
    "  GPT_THREAD(i, (long long)(V + T) * C);\n"
    "  long long r = i / C, c = i % C;\n"
    "  if (r < V) { /* row r of wte: every position whose token is r */\n"
    "    float s = dwte[i];\n"
    "    for (long long n = 0; n < BT; n++) if (tok[n] == r) s += dout[n * C + c];\n"
    "    dwte[i] = s;\n"
    "  } else { /* row r - V of wpe: that position in every sequence */\n"
    "    r -= V; float s = dwpe[r * C + c];\n"
    "    for (long long n = r; n < BT; n += T) s += dout[n * C + c];\n"
    "    dwpe[r * C + c] = s; } }\n";

/* LayerNorm over the last dimension (PyTorch's: biased variance, eps 1e-5); one thread per row. */
static void gpt_layernorm_forward(gpt* g, float* out, float* mean, float* rstd, const float* in, const float* w,
                                  const float* bias, int N, int C) {
    int n, i;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_layernorm_forward", N, &out, &mean, &rstd, &in, &w, &bias, &N, &C);
        return;
    }
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
static const char gpt_cu_layernorm_forward[] =
    "extern \"C\" __global__ void gpt_layernorm_forward(float* out, float* mean, float* rstd, const float* in,"
    " const float* w, const float* bias, int N, int C) {\n"
    "  GPT_THREAD(n, N);\n"
    "  const float* x = in + n * C; float* o = out + n * C;\n"
    "  float mu = 0.f, var = 0.f;\n"
    "  for (int i = 0; i < C; i++) mu += x[i];\n"
    "  mu /= C;\n"
    "  for (int i = 0; i < C; i++) var += (x[i] - mu) * (x[i] - mu);\n"
    "  float s = 1.f / sqrtf(var / C + 1e-5f);\n"
    "  for (int i = 0; i < C; i++) o[i] = (x[i] - mu) * s * w[i] + bias[i];\n"
    "  mean[n] = mu; rstd[n] = s; }\n";

/* Column sums on a GPU, in two steps. One thread per column walking down all N = B*T rows, as
   the C loop does, would keep a few hundred threads busy for N steps each, on a GPU that runs tens
   of thousands at once. So the rows go in K chunks of R, about sqrt(N) each: first one thread per
   chunk and column adds up its chunk into g->part ([K, cols]; the kernels named *_chunks), then
   gpt_sum_chunks, one thread per column, adds the K chunks' sums in order into the gradient. The
   result is the C loop's up to the order of the additions. */
static int gpt__chunk_rows(int N) {
    int r = (int)sqrt((double)N);
    return r * r < N ? r + 1 : r;
}
static const char gpt_cu_column_sums[] =
    "extern \"C\" __global__ void gpt_sum_chunks(float* out, const float* part, int K, int cols) {\n"
    "  GPT_THREAD(c, cols);\n"
    "  float s = out[c];\n"
    "  for (int k = 0; k < K; k++) s += part[(long long)k * cols + c];\n"
    "  out[c] = s; }\n";

/* Adds into din, dw and db. On the GPU: din one thread per row; dw and db as column sums in two
   steps (above). */
static void gpt_layernorm_backward(gpt* g, float* din, float* dw, float* db, const float* dout, const float* in,
                                   const float* w, const float* mean, const float* rstd, int N, int C) {
    int n, i;
    if (g->gpu) {
        int R = gpt__chunk_rows(N), K = (N + R - 1) / R;
        float *part = g->part, *part_b = g->part + (size_t)K * C;
        GPT_LAUNCH(g, "gpt_layernorm_backward_input", N, &din, &dout, &in, &w, &mean, &rstd, &N, &C);
        GPT_LAUNCH(g, "gpt_layernorm_backward_params_chunks", (long long)K * C, &part, &dout, &in, &mean, &rstd,
                   &N, &C, &R);
        GPT_LAUNCH(g, "gpt_sum_chunks", C, &dw, &part, &K, &C);
        GPT_LAUNCH(g, "gpt_sum_chunks", C, &db, &part_b, &K, &C);
        return;
    }
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
static const char gpt_cu_layernorm_backward[] =
    "extern \"C\" __global__ void gpt_layernorm_backward_input(float* din, const float* dout, const float* in,"
    " const float* w, const float* mean, const float* rstd, int N, int C) {\n"
    "  GPT_THREAD(n, N);\n"
    "  const float *x = in + n * C, *d = dout + n * C; float* di = din + n * C;\n"
    "  float dmean = 0.f, dnorm_norm = 0.f;\n"
    "  for (int i = 0; i < C; i++) { float norm = (x[i] - mean[n]) * rstd[n], dnorm = d[i] * w[i];\n"
    "    dmean += dnorm; dnorm_norm += dnorm * norm; }\n"
    "  dmean /= C; dnorm_norm /= C;\n"
    "  for (int i = 0; i < C; i++) { float norm = (x[i] - mean[n]) * rstd[n], dnorm = d[i] * w[i];\n"
    "    di[i] += (dnorm - dmean - norm * dnorm_norm) * rstd[n]; } }\n"
    "extern \"C\" __global__ void gpt_layernorm_backward_params_chunks(float* part, const float* dout,"
    " const float* in, const float* mean, const float* rstd, int N, int C, int R) {\n"
    "  long long K = (N + R - 1) / R;\n"
    "  GPT_THREAD(i, K * C);\n"
    "  long long k = i / C, c = i % C, end = (k + 1) * R < N ? (k + 1) * R : N;\n"
    "  float sw = 0.f, sb = 0.f; /* chunk k's sums for column c: dw's, then db's K*C further on */\n"
    "  for (long long n = k * R; n < end; n++) { float d = dout[n * C + c];\n"
    "    sb += d; sw += d * ((in[n * C + c] - mean[n]) * rstd[n]); }\n"
    "  part[i] = sw; part[K * C + i] = sb; }\n";

/* out[N,OC] = in[N,IC] w[OC,IC]^T + bias (nn.Linear): the product through ddp_gemm, then the
   bias on every row (one thread per number). */
static void gpt_linear_forward(gpt* g, float* out, const float* in, const float* w, const float* bias, int N, int IC,
                               int OC) {
    int n, o;
    DDP_CHECK(ddp_gemm(g->m, 0, 1, N, OC, IC, 1.f, in, IC, w, IC, 0.f, out, OC));
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_bias_forward", (long long)N * OC, &out, &bias, &N, &OC);
        return;
    }
    for (n = 0; n < N; n++)
        for (o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

/* din = dout w (overwritten: each input feeds this layer alone), dw += dout^T in, db += the column
   sums of dout (on the GPU in two steps: gpt_sum_chunks). */
static void gpt_linear_backward(gpt* g, float* din, float* dw, float* db, const float* dout, const float* in,
                                const float* w, int N, int IC, int OC) {
    int n, o;
    DDP_CHECK(ddp_gemm(g->m, 0, 0, N, IC, OC, 1.f, dout, OC, w, IC, 0.f, din, IC));
    DDP_CHECK(ddp_gemm(g->m, 1, 0, OC, IC, N, 1.f, dout, OC, in, IC, 1.f, dw, IC));
    if (g->gpu) {
        int R = gpt__chunk_rows(N), K = (N + R - 1) / R;
        GPT_LAUNCH(g, "gpt_bias_backward_chunks", (long long)K * OC, &g->part, &dout, &N, &OC, &R);
        GPT_LAUNCH(g, "gpt_sum_chunks", OC, &db, &g->part, &K, &OC);
        return;
    }
    for (n = 0; n < N; n++)
        for (o = 0; o < OC; o++) db[o] += dout[(size_t)n * OC + o];
}
static const char gpt_cu_linear[] =
    "extern \"C\" __global__ void gpt_bias_forward(float* out, const float* bias, int N, int OC) {\n"
    "  GPT_THREAD(i, (long long)N * OC);\n"
    "  out[i] += bias[i % OC]; }\n"
    "extern \"C\" __global__ void gpt_bias_backward_chunks(float* part, const float* dout, int N, int OC, int R) {\n"
    "  GPT_THREAD(i, (long long)((N + R - 1) / R) * OC);\n"
    "  long long k = i / OC, o = i % OC, end = (k + 1) * R < N ? (k + 1) * R : N;\n"
    "  float s = 0.f; /* chunk k's sum for column o */\n"
    "  for (long long n = k * R; n < end; n++) s += dout[n * OC + o];\n"
    "  part[i] = s; }\n";

/* The masked softmax of causal attention, on rows of T scores: row r belongs to position
   t = r mod T, which sees positions 0..t; the future gets probability 0. One thread per row. */
static void gpt_causal_softmax_forward(gpt* g, float* att, int rows, int T) {
    int r, t, u;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_causal_softmax_forward", rows, &att, &rows, &T);
        return;
    }
    for (r = 0; r < rows; r++) {
        float* row = att + (size_t)r * T;
        float mx = row[0], sum = 0;
        t = r % T;
        for (u = 1; u <= t; u++) mx = row[u] > mx ? row[u] : mx;
        for (u = 0; u <= t; u++) sum += row[u] = expf(row[u] - mx);
        for (u = 0; u <= t; u++) row[u] /= sum;
        for (u = t + 1; u < T; u++) row[u] = 0; /* the future: masked */
    }
}

/* Through the softmax: dS = P (dP - rowsum(P dP)), times `scale` (the scores' 1/sqrt(HS)), in place
   of dP. One thread per row. */
static void gpt_causal_softmax_backward(gpt* g, float* ds, const float* att, int rows, int T, float scale) {
    int r, t, u;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_causal_softmax_backward", rows, &ds, &att, &rows, &T, &scale);
        return;
    }
    for (r = 0; r < rows; r++) {
        const float* pr = att + (size_t)r * T;
        float *d = ds + (size_t)r * T, dot = 0;
        t = r % T;
        for (u = 0; u <= t; u++) dot += pr[u] * d[u];
        for (u = 0; u < T; u++) d[u] = u <= t ? pr[u] * (d[u] - dot) * scale : 0.f;
    }
}
static const char gpt_cu_causal_softmax[] =
    "extern \"C\" __global__ void gpt_causal_softmax_forward(float* att, int rows, int T) {\n"
    "  GPT_THREAD(r, rows);\n"
    "  float* row = att + r * T; int t = (int)(r % T);\n"
    "  float mx = row[0], sum = 0.f;\n"
    "  for (int u = 1; u <= t; u++) mx = row[u] > mx ? row[u] : mx;\n"
    "  for (int u = 0; u <= t; u++) sum += row[u] = expf(row[u] - mx);\n"
    "  for (int u = 0; u <= t; u++) row[u] /= sum;\n"
    "  for (int u = t + 1; u < T; u++) row[u] = 0.f; }\n"
    "extern \"C\" __global__ void gpt_causal_softmax_backward(float* ds, const float* att, int rows, int T,"
    " float scale) {\n"
    "  GPT_THREAD(r, rows);\n"
    "  const float* pr = att + r * T; float* d = ds + r * T; int t = (int)(r % T);\n"
    "  float dot = 0.f;\n"
    "  for (int u = 0; u <= t; u++) dot += pr[u] * d[u];\n"
    "  for (int u = 0; u < T; u++) d[u] = u <= t ? pr[u] * (d[u] - dot) * scale : 0.f; }\n";

/* Causal self-attention on qkv [B,T,3C] (q, k, v side by side, each split into NH heads of HS).
   For each sequence and head: scores S = Q K^T / sqrt(HS), P = the masked softmax of each row,
   out = P V. Q, K and V are column blocks of qkv, so their rows lie 3C apart: the products go
   through ddp_gemm_batched with that leading dimension, one call per head for all B sequences
   (each sequence's block lies T rows further on). att keeps every head's P [B,NH,T,T] for backward. */
static void gpt_attention_forward(gpt* g, float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    const int HS = C / NH, C3 = 3 * C;
    const long long s_qkv = (long long)T * C3, s_att = (long long)NH * T * T, s_out = (long long)T * C;
    const float scale = 1.f / sqrtf((float)HS);
    int h;
    for (h = 0; h < NH; h++) {
        const float* q = qkv + h * HS; /* q + C: this head's keys, q + 2C: its values */
        DDP_CHECK(ddp_gemm_batched(g->m, 0, 1, T, T, HS, scale, q, C3, s_qkv, q + C, C3, s_qkv, 0.f,
                                   att + (size_t)h * T * T, T, s_att, B));
    }
    gpt_causal_softmax_forward(g, att, B * NH * T, T);
    for (h = 0; h < NH; h++)
        DDP_CHECK(ddp_gemm_batched(g->m, 0, 0, T, HS, T, 1.f, att + (size_t)h * T * T, T, s_att,
                                   qkv + 2 * C + h * HS, C3, s_qkv, 0.f, out + h * HS, C, s_out, B));
}

/* dqkv (overwritten) from dout: dP = dOut V^T; through the softmax to dS; then dQ = dS K,
   dK = dS^T Q (dS already carries the 1/sqrt(HS)), dV = P^T dOut. ds: [B,NH,T,T] scratch. */
static void gpt_attention_backward(gpt* g, float* dqkv, float* ds, const float* dout, const float* qkv,
                                   const float* att, int B, int T, int C, int NH) {
    const int HS = C / NH, C3 = 3 * C;
    const long long s_qkv = (long long)T * C3, s_att = (long long)NH * T * T, s_out = (long long)T * C;
    const float scale = 1.f / sqrtf((float)HS);
    int h;
    for (h = 0; h < NH; h++) /* dP */
        DDP_CHECK(ddp_gemm_batched(g->m, 0, 1, T, T, HS, 1.f, dout + h * HS, C, s_out, qkv + 2 * C + h * HS, C3, s_qkv,
                                   0.f, ds + (size_t)h * T * T, T, s_att, B));
    gpt_causal_softmax_backward(g, ds, att, B * NH * T, T, scale);
    for (h = 0; h < NH; h++) {
        const float *q = qkv + h * HS, *d = ds + (size_t)h * T * T;
        float* dq = dqkv + h * HS;
        DDP_CHECK(ddp_gemm_batched(g->m, 0, 0, T, HS, T, 1.f, d, T, s_att, q + C, C3, s_qkv, 0.f, dq, C3, s_qkv,
                                   B)); /* dQ */
        DDP_CHECK(ddp_gemm_batched(g->m, 1, 0, T, HS, T, 1.f, d, T, s_att, q, C3, s_qkv, 0.f, dq + C, C3, s_qkv,
                                   B)); /* dK */
        DDP_CHECK(ddp_gemm_batched(g->m, 1, 0, T, HS, T, 1.f, att + (size_t)h * T * T, T, s_att, dout + h * HS, C,
                                   s_out, 0.f, dq + 2 * C, C3, s_qkv, B)); /* dV */
    }
}

/* GELU, the exact form (nn.GELU's default, which nanoGPT uses): x Phi(x), Phi the normal
   distribution's cdf, 0.5 (1 + erf(x / sqrt 2)). erf here is Abramowitz and Stegun's formula
   7.1.26, within 1.5e-7 of the true value (float's own rounding near 1 is 6e-8), because its one
   exponential, exp(-x^2/2), is also what the backward's density needs: one expf per element each
   way, where erff and expf would be two. The kernels use the same formula. */
/* e^-q for q >= 0, written as arithmetic that the compiler turns into vector instructions (libm's
   expf is a call, which it cannot): -q = k ln 2 + r with k a whole number and |r| <= ln 2 / 2, then
   e^-q = 2^k e^r, e^r from a polynomial (Cephes' coefficients) and 2^k put in a float's exponent
   bits. Within 1 ulp of libm's expf at every q = k 1e-6 up to 87. q above 87 counts as 87 (e^-87
   is near the smallest normal float, and erf is 1 there anyway); the bits of a float >= 0 order as
   its value does, so that clamp is an integer minimum, which vectorises too (fminf is a call). */
static float gpt__exp_minus(float q) {
    float k, r, p, two_k;
    int bits, most = 0x42AE0000; /* 87.0f */
    memcpy(&bits, &q, sizeof bits);
    bits = bits < most ? bits : most;
    memcpy(&q, &bits, sizeof q);
    k = (float)(int)(-q * 1.44269504f - 0.5f); /* the whole number nearest -q / ln 2 */
    r = -q - k * 0.693359375f + k * 2.12194440e-4f; /* ln 2 in two parts, the first exact in a float */
    p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f, p = p * r + 8.3334519073e-3f, p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f, p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    bits = ((int)k + 127) << 23;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

static float gpt__erf_half(float x, float* e) { /* erf(x / sqrt 2), and *e = exp(-x^2 / 2) */
    float z = fabsf(x) * 0.70710678f, t = 1.f / (1.f + 0.3275911f * z), y;
    *e = gpt__exp_minus(0.5f * x * x);
    y = 1.f - t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f)))) *
                  *e;
    return copysignf(y, x);
}

static void gpt_gelu_forward(gpt* g, float* out, float* slope, const float* in, long long n) {
    long long i;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_gelu_forward", n, &out, &in, &n);
        return;
    }
    for (i = 0; i < n; i++) {
        float e, cdf = 0.5f * (1.f + gpt__erf_half(in[i], &e));
        out[i] = in[i] * cdf;
        slope[i] = cdf + in[i] * 0.39894228f * e;
    }
}

/* din = dout (Phi(x) + x phi(x)); din may be dout. */
static void gpt_gelu_backward(gpt* g, float* din, const float* slope, const float* in, const float* dout,
                              long long n) {
    long long i;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_gelu_backward", n, &din, &in, &dout, &n);
        return;
    }
    for (i = 0; i < n; i++) din[i] = dout[i] * slope[i];
}
static const char gpt_cu_gelu[] =
    "__device__ float gpt_erf_half(float x, float* e) {\n"
    "  float z = fabsf(x) * 0.70710678f, t = 1.f / (1.f + 0.3275911f * z);\n"
    "  *e = expf(-0.5f * x * x);\n"
    "  float y = 1.f - t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f"
    " + t * 1.061405429f)))) * *e;\n"
    "  return x < 0 ? -y : y; }\n"
    "extern \"C\" __global__ void gpt_gelu_forward(float* out, const float* in, long long n) {\n"
    "  GPT_THREAD(i, n);\n"
    "  float e; out[i] = 0.5f * in[i] * (1.f + gpt_erf_half(in[i], &e)); }\n"
    "extern \"C\" __global__ void gpt_gelu_backward(float* din, const float* in, const float* dout, long long n) {\n"
    "  GPT_THREAD(i, n);\n"
    "  float e, cdf = 0.5f * (1.f + gpt_erf_half(in[i], &e));\n"
    "  din[i] = dout[i] * (cdf + in[i] * 0.39894228f * e); }\n";

/* out = a + b (the residual stream), and a run of zeros. */
static void gpt_residual_forward(gpt* g, float* out, const float* a, const float* b, long long n) {
    long long i;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_residual_forward", n, &out, &a, &b, &n);
        return;
    }
    for (i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void gpt_zero(gpt* g, float* x, long long n) {
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_zero", n, &x, &n);
        return;
    }
    memset(x, 0, (size_t)n * sizeof(float));
}
static const char gpt_cu_elementwise[] =
    "extern \"C\" __global__ void gpt_residual_forward(float* out, const float* a, const float* b, long long n) {\n"
    "  GPT_THREAD(i, n);\n"
    "  out[i] = a[i] + b[i]; }\n"
    "extern \"C\" __global__ void gpt_zero(float* x, long long n) {\n"
    "  GPT_THREAD(i, n);\n"
    "  x[i] = 0.f; }\n";

/* Softmax of each row of logits [N,V] in place, one thread per row; returns the summed
   -log p[target] (targets may be NULL: probabilities only, for sampling). On the GPU each row's
   loss is written to g->losses and the host adds them up in double precision, as the CPU does. */
static double gpt_softmax_xent_forward(gpt* g, float* probs, const int* targets, int N, int V) {
    double total = 0;
    int n, v;
    if (g->gpu) {
        int has = targets != NULL;
        float* losses = g->losses;
        GPT_LAUNCH(g, "gpt_softmax_xent_forward", N, &probs, &losses, &targets, &has, &N, &V);
        if (!has) return 0;
        ddp_device host = {DDP_DEVICE_CPU, 0};
        DDP_CHECK(ddp_copy(host, g->host_losses, g->dev, losses, (size_t)N * sizeof(float),
                           NULL)); /* after the work queued: the host waits for the forward here */
        for (n = 0; n < N; n++) total += g->host_losses[n];
        return total;
    }
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
static void gpt_softmax_xent_backward(gpt* g, float* probs, const int* targets, int N, int V, float scale) {
    int n, v;
    if (g->gpu) {
        GPT_LAUNCH(g, "gpt_softmax_xent_backward", N, &probs, &targets, &N, &V, &scale);
        return;
    }
    for (n = 0; n < N; n++) {
        float* p = probs + (size_t)n * V;
        p[targets[n]] -= 1.f;
        for (v = 0; v < V; v++) p[v] *= scale / (float)N;
    }
}
static const char gpt_cu_softmax_xent[] =
    "extern \"C\" __global__ void gpt_softmax_xent_forward(float* probs, float* losses, const int* targets,"
    " int has_targets, int N, int V) {\n"
    "  GPT_THREAD(n, N);\n"
    "  float* p = probs + n * V; float mx = p[0], sum = 0.f;\n"
    "  for (int v = 1; v < V; v++) mx = p[v] > mx ? p[v] : mx;\n"
    "  for (int v = 0; v < V; v++) sum += p[v] = expf(p[v] - mx);\n"
    "  for (int v = 0; v < V; v++) p[v] /= sum;\n"
    "  if (has_targets) losses[n] = -logf(p[targets[n]]); }\n"
    "extern \"C\" __global__ void gpt_softmax_xent_backward(float* probs, const int* targets, int N, int V,"
    " float scale) {\n"
    "  GPT_THREAD(n, N);\n"
    "  float* p = probs + n * V;\n"
    "  p[targets[n]] -= 1.f;\n"
    "  for (int v = 0; v < V; v++) p[v] *= scale / (float)N; }\n";

/* The kernels' source, in the order above, joined by gpt_create for ddp_kernels_compile. */
static const char* const gpt_cu_source[] = {
    gpt_cu_prelude, gpt_cu_encoder_forward, gpt_cu_encoder_backward, gpt_cu_layernorm_forward,
    gpt_cu_column_sums, gpt_cu_layernorm_backward, gpt_cu_linear, gpt_cu_causal_softmax, gpt_cu_gelu,
    gpt_cu_elementwise, gpt_cu_softmax_xent};

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

static void* gpt__alloc(size_t n) { /* host memory */
    void* p = calloc(n ? n : 1, 1);
    if (!p) {
        fprintf(stderr, "gpt: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Activations: n floats (or ints) on the model's device, zero-filled. */
static float* gpt__floats(gpt* g, size_t n) {
    void* p = NULL;
    if (ddp_alloc(g->dev, (n ? n : 1) * sizeof(float), &p) != DDP_OK) {
        fprintf(stderr, "gpt: out of memory for activations (%zu bytes): %s\n", n * sizeof(float), ddp_error_string());
        exit(1);
    }
    return (float*)p;
}

/* The model on `dev` (the CPU or a GPU), drawn from `seed` (the same numbers on either), with room
   for batches of up to max_bt = B*T positions. */
static void gpt_create(gpt* g, const gpt_config* cfg, ddp_device dev, int max_bt, uint64_t seed) {
    ddp_model_desc md;
    const int C = cfg->width, L = cfg->layers, V = cfg->vocab, T = cfg->ctx;
    int l;
    char name[64];
    memset(g, 0, sizeof *g), memset(&md, 0, sizeof md);
    if (C % cfg->heads) {
        fprintf(stderr, "gpt: width %d is not a multiple of %d heads\n", C, cfg->heads);
        exit(2);
    }
    g->cfg = *cfg, g->max_bt = max_bt, g->dev = dev, g->gpu = dev.type == DDP_DEVICE_CUDA;
    md.device = dev, md.seed = seed;
    DDP_CHECK(ddp_model_create(&md, &g->m));
    if (g->gpu) { /* the kernels, compiled once for this GPU */
        size_t len = 1, k, nk = sizeof gpt_cu_source / sizeof gpt_cu_source[0];
        char* src;
        for (k = 0; k < nk; k++) len += strlen(gpt_cu_source[k]);
        src = (char*)gpt__alloc(len);
        for (k = 0; k < nk; k++) strcat(src, gpt_cu_source[k]);
        DDP_CHECK(ddp_kernels_compile(g->m, src));
        free(src);
    }
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

    g->tokens = (int*)gpt__floats(g, max_bt), g->targets = (int*)gpt__floats(g, max_bt); /* ints: as wide */
    g->losses = gpt__floats(g, max_bt);
    g->host_losses = (float*)gpt__alloc((size_t)max_bt * sizeof(float));
    g->host_probs = (float*)gpt__alloc((size_t)V * sizeof(float));
    g->x0 = gpt__floats(g, (size_t)max_bt * C);
    g->a = (gpt_acts*)gpt__alloc(L * sizeof(gpt_acts));
    for (l = 0; l < L; l++) {
        gpt_acts* a = &g->a[l];
        a->ln1 = gpt__floats(g, (size_t)max_bt * C), a->ln1_mean = gpt__floats(g, max_bt);
        a->ln1_rstd = gpt__floats(g, max_bt);
        a->qkv = gpt__floats(g, (size_t)max_bt * 3 * C);
        a->att = gpt__floats(g, (size_t)max_bt * cfg->heads * T); /* B*NH*T*T with B*T <= max_bt */
        a->atty = gpt__floats(g, (size_t)max_bt * C), a->res1 = gpt__floats(g, (size_t)max_bt * C);
        a->ln2 = gpt__floats(g, (size_t)max_bt * C), a->ln2_mean = gpt__floats(g, max_bt);
        a->ln2_rstd = gpt__floats(g, max_bt);
        a->fc = gpt__floats(g, (size_t)max_bt * 4 * C), a->fc_gelu = gpt__floats(g, (size_t)max_bt * 4 * C);
        a->fc_slope = g->gpu ? NULL : gpt__floats(g, (size_t)max_bt * 4 * C);
        a->res2 = gpt__floats(g, (size_t)max_bt * C);
    }
    g->lnf = gpt__floats(g, (size_t)max_bt * C), g->lnf_mean = gpt__floats(g, max_bt);
    g->lnf_rstd = gpt__floats(g, max_bt);
    g->probs = gpt__floats(g, (size_t)max_bt * V);
    g->dx = gpt__floats(g, (size_t)max_bt * C), g->dbuf = gpt__floats(g, (size_t)max_bt * C);
    g->dbig = gpt__floats(g, (size_t)max_bt * 4 * C);
    g->dscores = gpt__floats(g, (size_t)max_bt * cfg->heads * T);
    if (g->gpu) /* K chunks by up to 4C columns (or two sums of C): K <= the rows of a chunk */
        g->part = gpt__floats(g, (size_t)gpt__chunk_rows(max_bt) * 4 * C);
}

static void gpt_free(gpt* g) {
    int l;
    float* dev[] = {(float*)g->tokens, (float*)g->targets, g->losses, g->x0, g->lnf, g->lnf_mean, g->lnf_rstd,
                    g->probs, g->dx, g->dbuf, g->dbig, g->dscores, g->part};
    DDP_CHECK(ddp_stream_sync(ddp_model_stream(g->m))); /* the GPU is done with them */
    for (l = 0; l < g->cfg.layers; l++) {
        gpt_acts* a = &g->a[l];
        float* acts[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->att, a->atty, a->res1,
                         a->ln2, a->ln2_mean, a->ln2_rstd, a->fc, a->fc_gelu, a->res2, a->fc_slope};
        size_t k;
        for (k = 0; k < sizeof acts / sizeof acts[0]; k++) ddp_free(g->dev, acts[k]);
    }
    {
        size_t k;
        for (k = 0; k < sizeof dev / sizeof dev[0]; k++) ddp_free(g->dev, dev[k]);
    }
    ddp_model_destroy(g->m);
    free(g->a), free(g->h), free(g->host_losses), free(g->host_probs);
}

/* Row `row` of the last forward's next-character probabilities, on the host (V numbers). */
static const float* gpt_probs(gpt* g, int row) {
    ddp_device host = {DDP_DEVICE_CPU, 0};
    const size_t V = (size_t)g->cfg.vocab;
    if (!g->gpu) return g->probs + (size_t)row * V;
    DDP_CHECK(ddp_copy(host, g->host_probs, g->dev, g->probs + (size_t)row * V, V * sizeof(float), NULL));
    return g->host_probs;
}

/* ---- forward and backward ------------------------------------------------------------------------ */

/* Forward on B sequences of T tokens (host arrays; B*T <= max_bt, T <= ctx). With targets, returns
   the mean cross-entropy and keeps what backward needs; without (NULL), returns 0 and leaves the
   next-character probabilities for gpt_probs. */
static float gpt_forward(gpt* g, const int* tokens, const int* targets, int B, int T) {
    const int C = g->cfg.width, NH = g->cfg.heads, V = g->cfg.vocab, L = g->cfg.layers, BT = B * T;
    const ddp_device host = {DDP_DEVICE_CPU, 0};
    ddp_stream* s = ddp_model_stream(g->m); /* NULL on the CPU */
    const float* x = g->x0;
    double total = 0;
    int l;
    if (BT > g->max_bt || T > g->cfg.ctx || B < 1 || T < 1) {
        fprintf(stderr, "gpt_forward: %d x %d tokens do not fit (at most %d positions, context %d)\n", B, T,
                g->max_bt, g->cfg.ctx);
        exit(2);
    }
    g->B = B, g->T = T;
    DDP_CHECK(ddp_copy(g->dev, g->tokens, host, tokens, (size_t)BT * sizeof(int), s)); /* to the GPU, if there */
    if (targets) DDP_CHECK(ddp_copy(g->dev, g->targets, host, targets, (size_t)BT * sizeof(int), s));
    DDP_CHECK(ddp_unit_begin(g->m, 0, DDP_FORWARD)); /* the embeddings and ln_f: unit 0's */
    gpt_encoder_forward(g, g->x0, g->tokens, g->wte->data, g->wpe->data, B, T, C);
    for (l = 0; l < L; l++) {
        gpt_block* k = &g->h[l];
        gpt_acts* a = &g->a[l];
        DDP_CHECK(ddp_unit_begin(g->m, l + 1, DDP_FORWARD)); /* ZeRO-3 gathers block l here */
        gpt_layernorm_forward(g, a->ln1, a->ln1_mean, a->ln1_rstd, x, k->ln1_w->data, k->ln1_b->data, BT, C);
        gpt_linear_forward(g, a->qkv, a->ln1, k->attn_w->data, k->attn_b->data, BT, C, 3 * C);
        gpt_attention_forward(g, a->atty, a->att, a->qkv, B, T, C, NH);
        gpt_linear_forward(g, a->res1, a->atty, k->attn_proj_w->data, k->attn_proj_b->data, BT, C, C);
        gpt_residual_forward(g, a->res1, a->res1, x, (long long)BT * C);
        gpt_layernorm_forward(g, a->ln2, a->ln2_mean, a->ln2_rstd, a->res1, k->ln2_w->data, k->ln2_b->data, BT, C);
        gpt_linear_forward(g, a->fc, a->ln2, k->fc_w->data, k->fc_b->data, BT, C, 4 * C);
        gpt_gelu_forward(g, a->fc_gelu, a->fc_slope, a->fc, (long long)BT * 4 * C);
        gpt_linear_forward(g, a->res2, a->fc_gelu, k->mlp_proj_w->data, k->mlp_proj_b->data, BT, 4 * C, C);
        gpt_residual_forward(g, a->res2, a->res2, a->res1, (long long)BT * C);
        DDP_CHECK(ddp_unit_end(g->m, l + 1, DDP_FORWARD));
        x = a->res2;
    }
    gpt_layernorm_forward(g, g->lnf, g->lnf_mean, g->lnf_rstd, x, g->lnf_w->data, g->lnf_b->data, BT, C);
    DDP_CHECK(ddp_gemm(g->m, 0, 1, BT, V, C, 1.f, g->lnf, C, g->wte->data, C, 0.f, g->probs, V)); /* logits */
    total = gpt_softmax_xent_forward(g, g->probs, targets ? g->targets : NULL, BT, V);
    DDP_CHECK(ddp_unit_end(g->m, 0, DDP_FORWARD));
    return targets ? (float)(total / BT) : 0.f;
}

#ifndef GPT_OWN_BACKWARD /* lab `gpt` (labs/gpt) has the student write this function */
/* Backward of the last forward's loss times `scale` (1/K for K accumulated micro-batches), adding
   into every p->grad and announcing each gradient the moment it is final. */
static void gpt_backward(gpt* g, float scale) {
    const int C = g->cfg.width, NH = g->cfg.heads, V = g->cfg.vocab, L = g->cfg.layers, B = g->B, T = g->T;
    const int BT = B * T;
    float *dx = g->dx, *dtmp = g->dbuf;
    int l;
    DDP_CHECK(ddp_unit_begin(g->m, 0, DDP_BACKWARD));
    gpt_softmax_xent_backward(g, g->probs, g->targets, BT, V, scale); /* g->probs is now dlogits */
    /* the output layer, tied to wte: wte's gradient is not final until the embedding's adds */
    DDP_CHECK(ddp_gemm(g->m, 1, 0, V, C, BT, 1.f, g->probs, V, g->lnf, C, 1.f, g->wte->grad, C));
    DDP_CHECK(ddp_gemm(g->m, 0, 0, BT, C, V, 1.f, g->probs, V, g->wte->data, C, 0.f, dtmp, C));
    gpt_zero(g, dx, (long long)BT * C);
    gpt_layernorm_backward(g, dx, g->lnf_w->grad, g->lnf_b->grad, dtmp, L ? g->a[L - 1].res2 : g->x0,
                           g->lnf_w->data, g->lnf_mean, g->lnf_rstd, BT, C);
    DDP_CHECK(ddp_param_grad_ready(g->lnf_b));
    DDP_CHECK(ddp_param_grad_ready(g->lnf_w));
    for (l = L - 1; l >= 0; l--) { /* dx: the gradient of block l's output, then of its input */
        gpt_block* k = &g->h[l];
        gpt_acts* a = &g->a[l];
        const float* x = l ? g->a[l - 1].res2 : g->x0;
        DDP_CHECK(ddp_unit_begin(g->m, l + 1, DDP_BACKWARD)); /* ZeRO-3 gathers; ZeRO-2/3 make p->grad */
        /* the MLP's branch: dx reaches its output unchanged through the residual */
        gpt_linear_backward(g, g->dbig, k->mlp_proj_w->grad, k->mlp_proj_b->grad, dx, a->fc_gelu,
                            k->mlp_proj_w->data, BT, 4 * C, C);
        DDP_CHECK(ddp_param_grad_ready(k->mlp_proj_b));
        DDP_CHECK(ddp_param_grad_ready(k->mlp_proj_w));
        gpt_gelu_backward(g, g->dbig, a->fc_slope, a->fc, g->dbig, (long long)BT * 4 * C);
        gpt_linear_backward(g, dtmp, k->fc_w->grad, k->fc_b->grad, g->dbig, a->ln2, k->fc_w->data, BT, C, 4 * C);
        DDP_CHECK(ddp_param_grad_ready(k->fc_b));
        DDP_CHECK(ddp_param_grad_ready(k->fc_w));
        gpt_layernorm_backward(g, dx, k->ln2_w->grad, k->ln2_b->grad, dtmp, a->res1, k->ln2_w->data, a->ln2_mean,
                               a->ln2_rstd, BT, C); /* dx is now the gradient of res1 */
        DDP_CHECK(ddp_param_grad_ready(k->ln2_b));
        DDP_CHECK(ddp_param_grad_ready(k->ln2_w));
        /* the attention's branch */
        gpt_linear_backward(g, dtmp, k->attn_proj_w->grad, k->attn_proj_b->grad, dx, a->atty,
                            k->attn_proj_w->data, BT, C, C);
        DDP_CHECK(ddp_param_grad_ready(k->attn_proj_b));
        DDP_CHECK(ddp_param_grad_ready(k->attn_proj_w));
        gpt_attention_backward(g, g->dbig, g->dscores, dtmp, a->qkv, a->att, B, T, C, NH); /* dqkv: [BT,3C] */
        gpt_linear_backward(g, dtmp, k->attn_w->grad, k->attn_b->grad, g->dbig, a->ln1, k->attn_w->data, BT, C,
                            3 * C);
        DDP_CHECK(ddp_param_grad_ready(k->attn_b));
        DDP_CHECK(ddp_param_grad_ready(k->attn_w));
        gpt_layernorm_backward(g, dx, k->ln1_w->grad, k->ln1_b->grad, dtmp, x, k->ln1_w->data, a->ln1_mean,
                               a->ln1_rstd, BT, C); /* dx is now the gradient of the block's input */
        DDP_CHECK(ddp_param_grad_ready(k->ln1_b));
        DDP_CHECK(ddp_param_grad_ready(k->ln1_w));
        DDP_CHECK(ddp_unit_end(g->m, l + 1, DDP_BACKWARD)); /* ZeRO-2/3 reduce-scatter block l */
    }
    gpt_encoder_backward(g, g->wte->grad, g->wpe->grad, dx, g->tokens, B, T, C);
    DDP_CHECK(ddp_param_grad_ready(g->wpe));
    DDP_CHECK(ddp_param_grad_ready(g->wte)); /* last: both of its uses have added in */
    DDP_CHECK(ddp_unit_end(g->m, 0, DDP_BACKWARD)); /* DDP waits for the all-reduces here */
}

#endif /* GPT_OWN_BACKWARD */

#endif /* GPT_H */
