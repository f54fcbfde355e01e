/* Lab "zero1": ZeRO-1, the optimizer's state sharded over the ranks.   run the tests:  make lab-zero1

   DDP keeps a whole copy of the training state on every rank: weights, gradients, and the
   optimizer's state (SGD's momentum, one float per weight; Adam's two moments, two). After
   backward every rank holds the same averaged gradients, so every rank computes the same update
   of the same weights from the same state: W copies of the work and of the memory. ZeRO-1
   (Rajbhandari et al., 2020; PyTorch's ZeroRedundancyOptimizer) keeps one copy of the
   optimizer's state in all: the parameters laid end to end are cut into W shards, and each rank
   keeps the state of its own shard and updates that shard only. Then each rank holds new values
   for 1/W of the weights, and an all-gather brings every shard to every rank. TUTORIAL.md,
   chapter 10 ("What limits DDP: every rank holds everything"), counts what it saves.

   Here the model is wrapped by plain DDP (ddp_wrap with zero_stage 0): when lab_zero1_step is
   called, p->grad holds the averaged gradient on every rank. Write the optimizer yourself, with
   ddp_all_gather as the only collective: not ddp_optim, not zero_stage 1 (they are the answer).
   The tests train a small MLP on 1 to 4 ranks and compare with ddp.h's own unsharded optimizer
   in one process. THE RULES (the tests name the one you break):

   PART 1: the shards, and SGD with momentum.
   rule Z1 Ownership (lab_zero1_owned, no communication). The parameters in registration order,
           laid end to end, are N elements. Each shard has S = ceil(N / W) elements, and rank r
           owns the flat range [r S, (r+1) S) cut at N: the last shards may be short, or empty.
           For each parameter: the part of it inside the rank's shard, as its first element
           (counted within the parameter) and its length. Every element has exactly one owner.
   rule Z2 State for your shard only: optimizer state for the elements this rank owns, none for
           the others and none for the padding past N. SGD with momentum keeps one float per
           owned element, plain SGD (momentum 0) none, Adam two. lab_zero1_state_bytes says how
           many bytes of it the rank holds: owned elements x floats per element x 4, about 1/W
           of what DDP's optimizer holds. The tests also measure the heap your create and first
           step leave in use: the state you report plus the all-gather's buffers, no more.
   rule Z3 torch.optim.SGD's update, of the owned elements only, from p->grad:
               buf = momentum * buf + (1 - dampening) * grad,    w = w - lr * buf
           except at the very first step, where torch sets buf = grad, undamped. Momentum 0:
           w = w - lr * grad.
   rule Z4 Every shard to every rank: when lab_zero1_step returns, every rank holds the whole
           model's new weights, each element with the value its owner computed (the same bits on
           every rank).
   rule Z5 One collective per step: an all-gather of S floats per rank, each rank's shard (the
           last one padded to S): ddp_all_gather(pg, send, recv, S, DDP_F32, NULL) hands every
           rank all W shards, rank 0's first. A rank that owns nothing still takes part.
   rule Z6 Update only your shard: a rank reads the gradients of the elements it owns and no
           others (the tests put NaN in the others), and takes every other element's new value
           from the all-gather.
   Example: parameters of 6, 3, 4 and 2 elements (N = 15) on W = 2 ranks: S = 8. Rank 0 owns flat
     0..7: parameter 0 (first 0, len 6) and parameter 1 (first 0, len 2); rank 1 owns flat 8..14:
     parameter 1 (first 2, len 1), 2 (first 0, len 4) and 3 (first 0, len 2). On W = 7 ranks,
     S = 3, and ranks 5 and 6 own nothing.

   PART 2: Adam (kind LAB_ZERO1_ADAM), in the same structure.
   rule A1 torch.optim.Adam's update, of the owned elements only. With t the step (1, 2, ...) and
           m and v zero before the first step:
               m = beta1 m + (1 - beta1) grad,    v = beta2 v + (1 - beta2) grad^2
               w = w - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
   The weights must stay within 1e-5 (relative, over the whole model) of the unsharded
   optimizer's after 50 steps: another order of the same arithmetic passes.

   Work out the example above by hand before writing lab_zero1_owned. Run one case again with
   build/labs/zero1-starter WORD (e.g. ownership, first_step, gather).
   Stuck? labs/zero1/HINTS.md. Then answer labs/zero1/QUESTIONS.md. */
#include <stdlib.h>
#include <string.h>

#include "zero1.h"

size_t lab_zero1_owned(const size_t* counts, int nparams, int world, int rank, size_t* first, size_t* len) {
    int i;
    (void)counts, (void)world, (void)rank;
    for (i = 0; i < nparams; i++) first[i] = 0, len[i] = 0; /* TODO (rule Z1) */
    return 0;
}

struct lab_zero1 {
    ddp_pg* pg;
    ddp_model* m;
    lab_zero1_desc d;
    long steps; /* taken so far */
    /* TODO: what else must the optimizer remember from one step to the next? */
};

ddp_status lab_zero1_create(ddp_pg* pg, ddp_model* m, const lab_zero1_desc* d, lab_zero1** out) {
    lab_zero1* z = (lab_zero1*)calloc(1, sizeof *z);
    *out = NULL;
    if (!z) return DDP_ERR_OUT_OF_MEMORY;
    z->pg = pg, z->m = m, z->d = *d;
    /* TODO (rules Z1, Z2): which elements this rank owns, and their state */
    *out = z;
    return DDP_OK;
}

ddp_status lab_zero1_step(lab_zero1* z) {
    z->steps++;
    /* TODO (rule Z3; part 2: rule A1): update this rank's shard */
    /* TODO (rules Z4, Z5): every shard to every rank */
    return DDP_OK;
}

size_t lab_zero1_state_bytes(const lab_zero1* z) {
    (void)z;
    return 0; /* TODO (rule Z2) */
}

void lab_zero1_destroy(lab_zero1* z) { free(z); }
