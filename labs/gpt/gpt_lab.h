/* labs/gpt/gpt_lab.h: the interface of the GPT lab (see starter.c). */
#ifndef LAB_GPT_H
#define LAB_GPT_H

#include <stddef.h>

#include "ddp.h"

/* The model: examples/gpt.h, chapter 12's GPT, its operations forward and backward. Its own
   gpt_backward is left out here: part 1 is yours. The pragmas keep the operations your file does
   not call from being reported as unused. */
#ifndef LAB_GPT_TESTS
#define GPT_OWN_BACKWARD
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include "examples/gpt.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* YOUR TASK, part 1: the backward of the last gpt_forward's loss times `scale`, adding into every
   p->grad, as examples/gpt.h computes it, and under DDP: each tensor marked ready
   (ddp_param_grad_ready) once, at the right moment. */
void lab_gpt_backward(gpt* g, float scale);

/* YOUR TASK, part 2: the job's validation loss. The tests hand you `v`, a set of held-out batches
   numbered 0, 1, 2, ...: lab_val_batches(v) says how many the job wants at least, and
   lab_val_loss_of(v, e) runs the model forward on batch e (any e >= 0) and returns its mean loss.
   Collective: every rank calls it, and every rank returns the same number. */
typedef struct lab_val lab_val;
int lab_val_batches(const lab_val* v);
float lab_val_loss_of(lab_val* v, int e);
float lab_gpt_val_loss(ddp_pg* pg, lab_val* v);

/* YOUR TASK, part 3: the end of a ZeRO-2 backward, and the clipping that follows it. `grad` holds
   this rank's own gradient of the whole model, flat, n floats (not averaged yet: each rank's
   comes from its own batch; you may overwrite it). Write into shard[0..S), S = ceil(n / W), this
   rank's part of the average of all ranks' gradients, clipped to a global norm of max_norm as
   torch.nn.utils.clip_grad_norm_ clips the whole averaged gradient; *norm = that gradient's norm
   before clipping. Collective. Returns DDP_OK or the status of the collective that failed. */
ddp_status lab_gpt_clip(ddp_pg* pg, float* grad, size_t n, float* shard, float max_norm, float* norm);

#endif
