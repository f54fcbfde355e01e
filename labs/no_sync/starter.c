/* Lab "no_sync": gradient accumulation without wasted all-reduces.   run the tests:  make lab-no_sync

   When a batch is too big for memory, split it into K micro-batches and ACCUMULATE: run forward
   and backward on each, let the gradients add up in p->grad (ddp_model_backward adds into it,
   it never overwrites), and take one optimizer step at the end. With DDP there is a catch: the
   wrapper all-reduces the gradients in every backward pass. K micro-batches, K all-reduces of
   every gradient, where one would do: the gradients are summed anyway, and the sum of averages
   is the average of sums.

   PyTorch's answer is the no_sync() context manager; ddp.h's is ddp_no_sync(w, on):
       ddp_no_sync(w, 1)   the following backward passes only accumulate locally (no hook fires
                           an all-reduce)
       ddp_no_sync(w, 0)   the next backward all-reduces what has accumulated, as usual

   The loop below is correct but wasteful: it all-reduces after every micro-batch. THE RULES (the
   tests run it on 2 ranks, and name the rule a wrong answer breaks):
   rule N1 The weights equal those of a reference computed in one process: per step, the sum of
           the gradients of all the micro-batches of all the ranks, averaged over the ranks.
   rule N2 One all-reduce per bucket per STEP, not per micro-batch (ddp_wrapper_stats counts
           them): with K = 4 and 3 steps, 3 per bucket, not 12.
   rule N3 The replicas stay identical: after every step, every rank holds the same weights.
   rule N4 Leave the wrapper as you found it, synchronising: ddp_no_sync is a setting that stays
           until it is changed, and the tests follow your steps with a plain backward pass.
   rule N5 The gradient is the plain sum of the micro-batches' gradients: not divided by K (the
           tests' reference does not divide either), nothing lost between micro-batches.
   In part 1 the starter passes N1, N3, N4 and N5 already and fails N2: the answer was right,
   the network paid K times over. Which backward passes must all-reduce, and which need not? The
   off-by-one here is classic (TUTORIAL.md, chapter 7, shows what it does to the replicas).

   PART 2 (lab_accumulate_epoch, below): a whole epoch. Its nb micro-batches rarely divide by K:
   with nb = 7 and K = 3 the steps take 3, 3 and then 1 micro-batch. Rules N1-N5 hold for every
   step, the short last one included, and:
   rule N6 No micro-batch is lost: every one of the epoch's micro-batches goes into exactly one
           optimizer step, and the epoch ends with a step (nothing left over for the next epoch).
   rule N7 ceil(nb / K) steps per epoch, each with one all-reduce per bucket, the short one too.
   The tests run 2 epochs on 2 ranks, with nb and K that divide and that do not, and K > nb.

   Stuck? labs/no_sync/HINTS.md. Then answer labs/no_sync/QUESTIONS.md. */
#include "no_sync.h"

ddp_status lab_accumulate_step(ddp_wrapper* w, ddp_model* m, ddp_optim* o, const float* const* x,
                               const int* const* y, int rows, int K) {
    ddp_status s;
    float loss;
    int k;
    (void)w; /* TODO: use ddp_no_sync(w, ...) below */
    if ((s = ddp_model_zero_grad(m)) != DDP_OK) return s;
    for (k = 0; k < K; k++) {
        if ((s = ddp_model_forward(m, x[k], rows)) != DDP_OK) return s;
        if ((s = ddp_loss_cross_entropy(m, y[k], &loss)) != DDP_OK) return s;
        if ((s = ddp_model_backward(m)) != DDP_OK) return s; /* all-reduces, every time */
    }
    return ddp_optim_step(o);
}

ddp_status lab_accumulate_epoch(ddp_wrapper* w, ddp_model* m, ddp_optim* o, const float* const* x,
                                const int* const* y, int rows, int nb, int K) {
    /* TODO: part 2 */
    (void)w, (void)m, (void)o, (void)x, (void)y, (void)rows, (void)nb, (void)K;
    return DDP_OK;
}
