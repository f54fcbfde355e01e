/* Reference solution of lab "no_sync" (labs/no_sync/starter.c). Instructors only: it is not in
   the handout (make lab-handout leaves labs/solutions out).  check it:  make lab-no_sync SOLUTION=1 */
#include "no_sync.h"

ddp_status lab_accumulate_step(ddp_wrapper* w, ddp_model* m, ddp_optim* o, const float* const* x,
                               const int* const* y, int rows, int K) {
    ddp_status s;
    float loss;
    int k;
    if ((s = ddp_model_zero_grad(m)) != DDP_OK) return s;
    for (k = 0; k < K; k++) {
        ddp_no_sync(w, k < K - 1); /* local accumulation, except for the last micro-batch */
        if ((s = ddp_model_forward(m, x[k], rows)) != DDP_OK) return s;
        if ((s = ddp_loss_cross_entropy(m, y[k], &loss)) != DDP_OK) return s;
        if ((s = ddp_model_backward(m)) != DDP_OK) return s; /* the last one all-reduces the sum */
    }
    return ddp_optim_step(o); /* the wrapper is left synchronising, as it was found */
}

/* Part 2: the epoch as steps of K micro-batches, the last one of what remains. */
ddp_status lab_accumulate_epoch(ddp_wrapper* w, ddp_model* m, ddp_optim* o, const float* const* x,
                                const int* const* y, int rows, int nb, int K) {
    ddp_status s;
    int i;
    for (i = 0; i < nb; i += K) {
        int k = nb - i < K ? nb - i : K; /* the epoch's last step may be short */
        if ((s = lab_accumulate_step(w, m, o, x + i, y + i, rows, k)) != DDP_OK) return s;
    }
    return DDP_OK;
}
