/* labs/no_sync/no_sync.h: the interface of the gradient accumulation lab (see starter.c). */
#ifndef LAB_NO_SYNC_H
#define LAB_NO_SYNC_H

#include "ddp.h"

/* YOUR TASK: one optimizer step of model m (wrapped by w, optimized by o) over K micro-batches:
   micro-batch k is x[k] (rows x input features, row after row) with labels y[k] (rows). */
ddp_status lab_accumulate_step(ddp_wrapper* w, ddp_model* m, ddp_optim* o, const float* const* x,
                               const int* const* y, int rows, int K);

/* PART 2: one epoch of nb micro-batches (x[i], y[i], i = 0 .. nb-1) with accumulation K: an
   optimizer step after every K micro-batches, and one after the epoch's last micro-batch. */
ddp_status lab_accumulate_epoch(ddp_wrapper* w, ddp_model* m, ddp_optim* o, const float* const* x,
                                const int* const* y, int rows, int nb, int K);

#endif
