/* Lab "buckets": gradient buckets, and a reducer that all-reduces them while backward runs.
                                                                    run the tests:  make lab-buckets

   DDP does not wait for backward to finish before it averages gradients. Backward makes them
   final last layer first; as soon as a group of them is final, its all-reduce starts, and the
   network works while backward computes the earlier layers. The groups are BUCKETS: one
   all-reduce per parameter would pay the per-message latency hundreds of times, one for
   everything would start nothing until backward ends. TUTORIAL.md, chapter 8, shows the effect.
   Here you write both halves of what ddp_wrap (and PyTorch's DDP) do. The rules say what, not
   how; the tests check each rule and name it when it is broken.

   PART 1: lab_assign_buckets, the bucket map.
   rule B1 Reverse order: parameters are taken from the last, nparams-1, down to 0 (the order in
           which backward finishes them); the last one opens bucket 0, and each next one goes into
           the current bucket or opens the next. A bucket holds neighbouring parameters.
   rule B2 A bucket closes as soon as its bytes reach its limit (>=): the parameter that makes it
           reach the limit is its last one. A parameter is never split, so a bucket may overshoot;
           the last bucket holds what is left, however little.
   rule B3 The limit is first_bucket_bytes for bucket 0 and bucket_cap_bytes for every later one
           (a small first bucket gets the network going early). 0 means the default, as in every
           ddp.h desc and in ddp_wrap_desc: 1 MiB for the first bucket, 25 MiB for the others.
   rule B4 The same map as ddp_wrap makes for the same limits (the tests compare on 28 models).
   rule B5 *map is NOT zeroed (the tests fill it with garbage): set nbuckets, bucket_of[i] for
           every parameter and nparams_in[k] for every bucket.
   Example: bytes {240, 40, 320, 32, 96, 12} (parameter 0 first), first 100, cap 300:
     bucket 0 = params 5, 4 (12 + 96 = 108 >= 100), bucket 1 = 3, 2 (352 >= 300),
     bucket 2 = 1, 0 (280: the last bucket, what is left).

   PART 2: a reducer (create, grad_ready, finish, destroy; buckets.h says when each is called).
   The tests call lab_reducer_grad_ready from each parameter's gradient-ready hook and
   lab_reducer_finish after backward, on 2 and 3 ranks, with gradients arriving in orders that
   differ from rank to rank, and compare with ddp_wrap's own results.
   rule R1 After finish, every p->grad holds the average over the ranks of that gradient: each
           bucket is all-reduced (summed) with ddp_all_reduce, so divide by the world size
           (ddp_world_size) on the way into the bucket or on the way out.
   rule R2 A bucket's all-reduce is launched from inside the hook that makes it possible: when
           the bucket's last gradient arrives and every earlier bucket has been launched. Not
           earlier (a gradient would be missing), not later (backward would have nothing to
           overlap with).
   rule R3 Buckets are launched in bucket order: bucket k only after bucket k-1, even when k is
           complete first (then k waits and goes right after k-1). Every rank must issue its
           all-reduces in the same order, or rank 0's bucket 1 meets rank 1's bucket 0.
   rule R4 The launch does not wait: ddp_all_reduce(pg, buf, count, DDP_F32, DDP_SUM, &work)
           returns at once with a handle; ddp_work_wait(work) belongs in finish. The tests make a
           rank whose hook waits for its all-reduce stall its neighbour, and say so.
   rule R5 One all-reduce per bucket per backward pass, of the bucket's own buffer: copy each
           gradient into its bucket as it arrives, and back out at the end.
   rule R6 A parameter that got no gradient in a pass (its hook never ran) counts as zero: its
           bucket still goes, in finish at the latest, and in order. (ddp_wrap does this with
           find_unused_parameters.)
   rule R7 Every pass starts fresh: finish leaves the reducer ready for the next backward pass.

   Draw the timeline of one backward pass of a 6-parameter model in 3 buckets before writing
   part 2: which hook launches what when the gradients come 3 2 5 4 1 0?
   Stuck? labs/buckets/HINTS.md has hints in three tiers. Then labs/buckets/QUESTIONS.md. */
#include <stdlib.h>
#include <string.h>

#include "buckets.h"

/* ---- part 1 ---------------------------------------------------------------------------------- */

void lab_assign_buckets(lab_bucket_map* map, int nparams, const size_t* param_bytes, size_t first_bucket_bytes,
                        size_t bucket_cap_bytes) {
    /* TODO */
    (void)map, (void)nparams, (void)param_bytes, (void)first_bucket_bytes, (void)bucket_cap_bytes;
}

/* ---- part 2 ---------------------------------------------------------------------------------- */

struct lab_reducer {
    int todo; /* TODO: what does the reducer need to remember? */
};

lab_reducer* lab_reducer_create(ddp_pg* pg, ddp_model* m, const lab_bucket_map* map) {
    /* TODO */
    (void)pg, (void)m, (void)map;
    return (lab_reducer*)calloc(1, sizeof(lab_reducer));
}

void lab_reducer_grad_ready(lab_reducer* r, ddp_param* p) {
    /* TODO */
    (void)r, (void)p;
}

ddp_status lab_reducer_finish(lab_reducer* r) {
    /* TODO */
    (void)r;
    return DDP_OK;
}

void lab_reducer_destroy(lab_reducer* r) { free(r); }
