/* Lab "gpt": chapter 12's GPT, made data parallel.                      run the tests:  make lab-gpt

   This file trains examples/gpt.h's character GPT in one process: its backward, the validation
   loss, and the clipping of the gradient all work there. Under DDP each of the three needs
   something more, and each is a place where a real training script goes quietly wrong: the loss
   still falls, and the run is not the one you think. TUTORIAL.md, chapter 12 ("Train a GPT"),
   tells the story; chapter 8 says how the reducer uses each tensor's readiness, chapter 11 what
   ZeRO-2 shards. Change the three functions below; the tests start 1 to 4 ranks (ddp_spawn, over
   TCP on 127.0.0.1) and compare with one process. THE RULES (the tests name the one you break):

   PART 1: the backward under DDP (lab_gpt_backward). ddp_wrap hangs the reducer on every tensor's
   readiness: the moment you call ddp_param_grad_ready(p), p->grad joins its bucket (a copy, or on
   the CPU the all-reduce reads it in place), and a full bucket starts its all-reduce while your
   backward goes on.
   rule G1 Once, when final: every tensor of the model is marked ready exactly once per backward,
           after the last operation that adds into its gradient. What is added after the mark
           reaches the other ranks late or never.
   rule G2 As soon as final: a tensor is marked before the backward's next operation starts (the
           next call that computes another tensor's gradient), so that its bucket can leave while
           backward computes the earlier layers: PyTorch's autograd calls DDP's hook at that
           moment too.
   rule G3 In its unit: under ZeRO-2 and -3 a block's gradients exist only between
           ddp_unit_begin(m, l + 1, DDP_BACKWARD) and ddp_unit_end; its tensors are marked there
           (ddp.h refuses a mark outside).
   rule G4 The same training as one process: W ranks, each on B / W of the sequences, end 3 steps
           of AdamW (2 micro-batches per step, clipped at 1.0) with the weights of one process on
           all B (1e-5, relative), under zero_stage 0, 2 and 3.
   Keep the arithmetic as it is: the tests compare every gradient with examples/gpt.h's.

   PART 2: the validation loss (lab_gpt_val_loss). One process evaluates every batch. With W ranks
   each evaluates a share, and the number printed must be the job's, not rank 0's.
   rule V1 Shares: the batches are 0 .. N-1, with N = lab_val_batches(v) rounded up to a
           multiple of W. Each batch is evaluated by exactly one rank, and every rank evaluates
           N / W of them: under ZeRO-3 every forward gathers the weights, a collective, so a rank
           with one forward more than the others waits for ever.
   rule V2 The job's loss: every rank returns the mean of the N batches' losses (each batch
           counts the same), the same number on every rank: an all-reduce of what the ranks
           found.

   PART 3: clipping under ZeRO-2 (lab_gpt_clip). One process clips its gradient by its norm. Under
   ZeRO-2 backward ends with a reduce-scatter: each rank keeps only its shard of the averaged
   gradient, and no rank holds the gradient whose norm is wanted.
   rule C1 The shard: S = ceil(n / W), and rank r's shard is elements [r S, (r+1) S) of the
           average of the W ranks' gradients, zero past n (the last shard's padding).
   rule C2 The global norm: *norm is the norm of the whole averaged gradient, the same on every
           rank, each element counted once.
   rule C3 The clip: coef = max_norm / (norm + 1e-6); when coef < 1 the shard is multiplied by it,
           otherwise it is left as it is (torch.nn.utils.clip_grad_norm_).
   rule C4 ZeRO-2's bytes: a rank sends what one reduce-scatter of the gradient sends, plus a few
           numbers for the norm; an all-reduce of the whole gradient sends twice that.

   Run one case again with build/labs/gpt-starter WORD (e.g. ready, val, clip).
   Stuck? labs/gpt/HINTS.md. Then answer labs/gpt/QUESTIONS.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_lab.h"

/* ---- part 1 ------------------------------------------------------------------------------------ */

/* TODO (rules G1-G3): mark each tensor ready, with ddp_param_grad_ready, where it belongs. */
void lab_gpt_backward(gpt* g, float scale) {
    const int C = g->cfg.width, NH = g->cfg.heads, V = g->cfg.vocab, L = g->cfg.layers, B = g->B, T = g->T;
    const int BT = B * T;
    float *dx = g->dx, *dtmp = g->dbuf;
    int l;
    DDP_CHECK(ddp_unit_begin(g->m, 0, DDP_BACKWARD));
    gpt_softmax_xent_backward(g, g->probs, g->targets, BT, V, scale); /* g->probs is now dlogits */
    /* the output layer: logits = ln_f(x) wte^T */
    DDP_CHECK(ddp_gemm(g->m, 1, 0, V, C, BT, 1.f, g->probs, V, g->lnf, C, 1.f, g->wte->grad, C));
    DDP_CHECK(ddp_gemm(g->m, 0, 0, BT, C, V, 1.f, g->probs, V, g->wte->data, C, 0.f, dtmp, C));
    gpt_zero(g, dx, (long long)BT * C);
    gpt_layernorm_backward(g, dx, g->lnf_w->grad, g->lnf_b->grad, dtmp, L ? g->a[L - 1].res2 : g->x0,
                           g->lnf_w->data, g->lnf_mean, g->lnf_rstd, BT, C);
    for (l = L - 1; l >= 0; l--) { /* dx: the gradient of block l's output, then of its input */
        gpt_block* k = &g->h[l];
        gpt_acts* a = &g->a[l];
        const float* x = l ? g->a[l - 1].res2 : g->x0;
        DDP_CHECK(ddp_unit_begin(g->m, l + 1, DDP_BACKWARD));
        /* the MLP's branch: dx reaches its output unchanged through the residual */
        gpt_linear_backward(g, g->dbig, k->mlp_proj_w->grad, k->mlp_proj_b->grad, dx, a->fc_gelu,
                            k->mlp_proj_w->data, BT, 4 * C, C);
        gpt_gelu_backward(g, g->dbig, a->fc_slope, a->fc, g->dbig, (long long)BT * 4 * C);
        gpt_linear_backward(g, dtmp, k->fc_w->grad, k->fc_b->grad, g->dbig, a->ln2, k->fc_w->data, BT, C, 4 * C);
        gpt_layernorm_backward(g, dx, k->ln2_w->grad, k->ln2_b->grad, dtmp, a->res1, k->ln2_w->data, a->ln2_mean,
                               a->ln2_rstd, BT, C); /* dx is now the gradient of res1 */
        /* the attention's branch */
        gpt_linear_backward(g, dtmp, k->attn_proj_w->grad, k->attn_proj_b->grad, dx, a->atty,
                            k->attn_proj_w->data, BT, C, C);
        gpt_attention_backward(g, g->dbig, g->dscores, dtmp, a->qkv, a->att, B, T, C, NH); /* dqkv: [BT,3C] */
        gpt_linear_backward(g, dtmp, k->attn_w->grad, k->attn_b->grad, g->dbig, a->ln1, k->attn_w->data, BT, C,
                            3 * C);
        gpt_layernorm_backward(g, dx, k->ln1_w->grad, k->ln1_b->grad, dtmp, x, k->ln1_w->data, a->ln1_mean,
                               a->ln1_rstd, BT, C); /* dx is now the gradient of the block's input */
        DDP_CHECK(ddp_unit_end(g->m, l + 1, DDP_BACKWARD));
    }
    gpt_encoder_backward(g, g->wte->grad, g->wpe->grad, dx, g->tokens, B, T, C); /* x = wte[token] + wpe[t] */
    DDP_CHECK(ddp_unit_end(g->m, 0, DDP_BACKWARD)); /* DDP waits for its all-reduces here */
}

/* ---- part 2 ------------------------------------------------------------------------------------ */

/* One process: every batch, here. TODO (rules V1, V2): a share per rank, and the job's mean. */
float lab_gpt_val_loss(ddp_pg* pg, lab_val* v) {
    int n = lab_val_batches(v), e;
    double sum = 0;
    (void)pg;
    for (e = 0; e < n; e++) sum += lab_val_loss_of(v, e);
    return (float)(sum / n);
}

/* ---- part 3 ------------------------------------------------------------------------------------ */

/* One process: the shard is the whole gradient. TODO (rules C1-C4): W ranks. */
ddp_status lab_gpt_clip(ddp_pg* pg, float* grad, size_t n, float* shard, float max_norm, float* norm) {
    double sq = 0, coef;
    size_t i;
    (void)pg;
    for (i = 0; i < n; i++) sq += (double)grad[i] * grad[i];
    *norm = (float)sqrt(sq);
    coef = max_norm / (sqrt(sq) + 1e-6);
    for (i = 0; i < n; i++) shard[i] = coef < 1 ? (float)(grad[i] * coef) : grad[i];
    return DDP_OK;
}
