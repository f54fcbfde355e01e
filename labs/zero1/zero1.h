/* labs/zero1/zero1.h: the interface of the ZeRO-1 lab (see starter.c). */
#ifndef LAB_ZERO1_H
#define LAB_ZERO1_H

#include <stddef.h>

#include "ddp.h"

typedef enum lab_zero1_kind {
    LAB_ZERO1_SGD = 1, /* torch.optim.SGD with momentum and dampening (part 1) */
    LAB_ZERO1_ADAM     /* torch.optim.Adam (part 2) */
} lab_zero1_kind;

/* The optimizer's settings. There are no defaults: the tests set every field the kind uses. */
typedef struct lab_zero1_desc {
    lab_zero1_kind kind;
    float lr;
    float momentum, dampening; /* SGD; momentum 0: plain SGD, which keeps no state */
    float beta1, beta2, eps;   /* Adam */
} lab_zero1_desc;

/* YOUR TASK, part 1a (no communication): the parameters of a model, counts[0..nparams) elements
   each, laid end to end in that order, are cut into `world` shards; rank `rank` owns one. Fill
   first[i] and len[i] for every parameter i: the part of parameter i inside the shard, as its
   first element (counted from the start of parameter i) and its number of elements (0 when the
   shard holds none of it; first[i] is then not read). Return S, the elements per shard. */
size_t lab_zero1_owned(const size_t* counts, int nparams, int world, int rank, size_t* first, size_t* len);

/* YOUR TASK, part 1b and part 2: an optimizer that keeps the state of this rank's shard only.
   Define `struct lab_zero1` in your file: what it holds is your design.
   create:      for model m (float parameters on the CPU, wrapped by ddp_wrap with zero_stage 0,
                so that after backward every rank holds the same averaged gradients) on group
                pg, with settings *d (copy what you need). Allocates the state. Returns DDP_OK and
                sets *out, or an error status (DDP_ERR_OUT_OF_MEMORY, ...).
   step:        one optimizer step from the gradients in p->grad; on return every rank holds the
                whole model's new weights. Collective: every rank calls it, once per step.
                Returns DDP_OK or the status of the collective that failed.
   state_bytes: the bytes of optimizer state this rank holds (momentum, moments), padding and
                buffers for the communication not counted.
   destroy:     frees everything (NULL is ignored). */
typedef struct lab_zero1 lab_zero1;
ddp_status lab_zero1_create(ddp_pg* pg, ddp_model* m, const lab_zero1_desc* d, lab_zero1** out);
ddp_status lab_zero1_step(lab_zero1* z);
size_t lab_zero1_state_bytes(const lab_zero1* z);
void lab_zero1_destroy(lab_zero1* z);

#endif
