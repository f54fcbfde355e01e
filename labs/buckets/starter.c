/* Lab "buckets": gradient buckets and the ready-counting hook.   run the tests:  make lab-buckets

   DDP does not wait for backward to finish before it averages gradients. Backward produces them
   last layer first; as soon as a group of gradients is final, their all-reduce starts, and the
   network works while backward computes the earlier layers. The groups are BUCKETS: all-reducing
   every parameter on its own would pay the per-message latency hundreds of times, one bucket for
   everything would start nothing until backward ends. ddp.h's ddp_wrap (and PyTorch's DDP) do
   exactly what you write here; see ddp__assign_buckets and ddp__reducer_hook in ddp.h.

   (1) lab_assign_buckets: the bucket map.
       Walk the parameters in REVERSE order, nparams-1 down to 0 (the order backward makes them
       ready). Put each into the current bucket (bucket 0 first) and add its bytes to the bucket's
       total. Close the bucket (move on to the next) as soon as its total is >= its limit, or when
       the last parameter (index 0) is in. The limit is first_bucket_bytes for bucket 0 and
       bucket_cap_bytes for every later one: a SMALL first bucket gets communication going early.
       A parameter is never split, so a bucket may overshoot its limit by one parameter.
       Fill b->nbuckets, b->bucket_of[i] for every parameter, b->nparams_in[k] for every bucket.
       Example: bytes {240, 40, 320, 32, 96, 12} (parameter 0 first), first 100, cap 300:
         bucket 0 = params 5, 4 (12 + 96 = 108 >= 100), bucket 1 = 3, 2 (352 >= 300),
         bucket 2 = 1, 0 (280: closed because parameter 0 is the last one).

   (2) lab_backward_begin: called before every backward pass. Every bucket waits for all of its
       gradients again (b->pending), and the next bucket to launch is bucket 0.

   (3) lab_grad_ready: the hook, called once per parameter per backward pass, the moment that
       parameter's gradient is final. Count the gradient into its bucket. When a bucket has all
       of its gradients it is READY; launch ready buckets with launch(k, user), STRICTLY IN BUCKET
       ORDER: bucket k is launched only after bucket k-1, even if k became ready first (then it
       waits, and goes right after k-1). Why: every rank must issue its all-reduces in the same
       order, or rank 0's bucket 1 meets rank 1's bucket 0 on the wire. Gradients usually arrive
       in reverse order, but not always (a layer used twice, a branch), so do not assume it.

   The tests call (2) and (3) the way ddp_model_backward does, with made-up orders and through a
   real ddp.h model, and record when each bucket launched. For those cases the tests fill in the
   map themselves (nbuckets, bucket_of, nparams_in) and then call lab_backward_begin: so (2) and
   (3) must work from those three fields alone, whatever else (1) computes. */
#include "buckets.h"

void lab_assign_buckets(lab_buckets* b, int nparams, const size_t* param_bytes, size_t first_bucket_bytes,
                        size_t bucket_cap_bytes) {
    /* TODO (1) */
    (void)nparams, (void)param_bytes, (void)first_bucket_bytes, (void)bucket_cap_bytes;
    b->nbuckets = 0;
}

void lab_backward_begin(lab_buckets* b) {
    /* TODO (2) */
    (void)b;
}

void lab_grad_ready(lab_buckets* b, int param, lab_launch_fn launch, void* user) {
    /* TODO (3) */
    (void)b, (void)param, (void)launch, (void)user;
}
