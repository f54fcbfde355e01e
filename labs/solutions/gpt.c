/* Reference solution of lab "gpt" (labs/gpt/starter.c). Instructors only: it is not in the
   handout (make lab-handout leaves labs/solutions out).  check it:  make lab-gpt SOLUTION=1 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_lab.h"

/* ---- part 1 ------------------------------------------------------------------------------------ */

/* Each tensor marked ready right after the operation that completes its gradient, inside its
   unit's brackets; wte last of all. */
void lab_gpt_backward(gpt* g, float scale) {
    const int C = g->cfg.width, NH = g->cfg.heads, V = g->cfg.vocab, L = g->cfg.layers, B = g->B, T = g->T;
    const int BT = B * T;
    float *dx = g->dx, *dtmp = g->dbuf;
    int l;
    DDP_CHECK(ddp_unit_begin(g->m, 0, DDP_BACKWARD));
    gpt_softmax_xent_backward(g, g->probs, g->targets, BT, V, scale); /* g->probs is now dlogits */
    /* the output layer: logits = ln_f(x) wte^T. wte is tied: the embedding adds into its gradient
       at the very end, so it is not final here */
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
        DDP_CHECK(ddp_unit_begin(g->m, l + 1, DDP_BACKWARD));
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
        DDP_CHECK(ddp_unit_end(g->m, l + 1, DDP_BACKWARD));
    }
    gpt_encoder_backward(g, g->wte->grad, g->wpe->grad, dx, g->tokens, B, T, C); /* x = wte[token] + wpe[t] */
    DDP_CHECK(ddp_param_grad_ready(g->wpe));
    DDP_CHECK(ddp_param_grad_ready(g->wte)); /* both of its uses have added in */
    DDP_CHECK(ddp_unit_end(g->m, 0, DDP_BACKWARD)); /* DDP waits for its all-reduces here */
}

/* ---- part 2 ------------------------------------------------------------------------------------ */

/* Rank r takes batches r, r + W, ... of N rounded up to a multiple of W; the sum and the count of
   every rank's losses, added up by one all-reduce (the CPU backend's buffers are host memory). */
float lab_gpt_val_loss(ddp_pg* pg, lab_val* v) {
    const int W = ddp_world_size(pg), rank = ddp_rank(pg);
    int n = (lab_val_batches(v) + W - 1) / W * W, e;
    float sums[2] = {0, 0};
    for (e = rank; e < n; e += W) sums[0] += lab_val_loss_of(v, e), sums[1] += 1;
    DDP_CHECK(ddp_all_reduce(pg, sums, 2, DDP_F32, DDP_SUM, NULL));
    return sums[0] / sums[1];
}

/* ---- part 3 ------------------------------------------------------------------------------------ */

/* The gradient padded to W S floats, reduce-scattered with the average; then the squares of the
   shard, added over the ranks (every element belongs to one shard), give the norm. */
ddp_status lab_gpt_clip(ddp_pg* pg, float* grad, size_t n, float* shard, float max_norm, float* norm) {
    const int W = ddp_world_size(pg);
    const size_t S = (n + (size_t)W - 1) / (size_t)W;
    float* padded = (float*)calloc(S * (size_t)W, sizeof(float));
    double local = 0, coef;
    float sq; /* the collectives carry floats */
    ddp_status s;
    size_t i;
    if (!padded) return DDP_ERR_OUT_OF_MEMORY;
    memcpy(padded, grad, n * sizeof(float));
    s = ddp_reduce_scatter(pg, padded, shard, S, DDP_F32, DDP_AVG, NULL);
    free(padded);
    if (s != DDP_OK) return s;
    for (i = 0; i < S; i++) local += (double)shard[i] * shard[i];
    sq = (float)local;
    if ((s = ddp_all_reduce(pg, &sq, 1, DDP_F32, DDP_SUM, NULL)) != DDP_OK) return s;
    *norm = (float)sqrt(sq);
    coef = max_norm / (sqrt(sq) + 1e-6);
    if (coef < 1)
        for (i = 0; i < S; i++) shard[i] = (float)(shard[i] * coef);
    return DDP_OK;
}
