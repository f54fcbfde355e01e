/* Lab "sampler": the distributed sampler.            run the tests:  make lab-sampler

   In data-parallel training every rank must see a different part of each epoch, and together the
   ranks must see all of it. PyTorch's DistributedSampler decides who gets what, with no
   communication at all: every rank computes the same shuffled order from the
   same seed, and takes its own share of it. Here the order is handed to you.

   THE RULES, for n samples, R = replicas and this rank r (the tests name the one you break):

   rule S1 The epoch's list is the shuffled order, position p holding order[p]. Rank r takes every
           R-th position starting at r: positions r, r + R, r + 2R, ..., in that order.
   rule S2 drop_last = 0: the list is PADDED to total = ceil(n / R) * R positions; the extra
           positions p = n .. total-1 repeat the list from its start, position p holding
           order[p % n]. (If n < R the start is repeated more than once: that is what p % n does.)
   rule S3 drop_last = 1: the list is CUT to total = floor(n / R) * R positions; the positions from
           total on are dropped and nobody visits them this epoch.
   rule S4 So every rank gets the same number of indices, total / R, written to *count.
   rule S5 out has room for n + R entries; write only out[0 .. *count).

   Example: n = 10, R = 4, order = [7 2 9 0 4 1 8 3 6 5].
      padded list:  7 2 9 0 | 4 1 8 3 | 6 5 7 2      (total 12: positions 10 and 11 repeat 7 2)
      rank 0 gets 7 4 6,  rank 1 gets 2 1 5,  rank 2 gets 9 8 7,  rank 3 gets 0 3 2.
      With drop_last = 1: total 8, rank 0 gets 7 4, rank 1 gets 2 1, rank 2 9 8, rank 3 0 3.

   Why rank striding and not contiguous blocks: the samples the ranks see at the same step come
   from neighbouring positions of the shuffled order, and the padding lands on the last step.
   Why pad at all: every rank must run the same number of steps, or the ranks' collectives no
   longer pair up and the job hangs.

   Edge cases the tests try: n = 0, R = 1, n < R (with and without drop_last), n a multiple of R,
   and then thousands of settings against a reference (40 more from the seed, LAB_SEED).
   Stuck? labs/sampler/HINTS.md. Then answer labs/sampler/QUESTIONS.md. */
#include "sampler.h"

void lab_sampler_indices(int n, int replicas, int rank, int drop_last, const int* order, int* out, int* count) {
    /* TODO: how many indices (rules S2-S4), then which ones (rules S1-S2) */
    (void)n, (void)replicas, (void)rank, (void)drop_last, (void)order, (void)out;
    *count = 0;
}
