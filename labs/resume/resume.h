/* labs/resume/resume.h: the interface of the snapshot-and-resume lab (see starter.c). */
#ifndef LAB_RESUME_H
#define LAB_RESUME_H

#include "ddp.h"

typedef struct lab_resume_opts {
    const ddp_dataset* data;   /* the training set */
    const char* snapshot_path; /* where the newest snapshot lives */
    const char* previous_path; /* where the one saved before it lives (rule RS6) */
    int save_every;            /* save after every save_every optimizer steps; 0: never */
    int epochs, batch_size;
    uint64_t seed;             /* the model's initial weights and the sampler's shuffles */
} lab_resume_opts;

/* Given by the test harness. Call lab_after_step(step, model) after every optimizer step (and
   after saving, if this step saves), with the number of steps done since the very first start:
   1, 2, ... The harness uses it to see which steps ran and with which weights, and to kill the
   run at a chosen step (it calls _exit there, as a crash would). Call lab_finished(model) once,
   when training is over. */
void lab_after_step(long step, ddp_model* model);
void lab_finished(ddp_model* model);

/* YOUR TASK: the training loop, with a snapshot every save_every steps and resume on start. */
void lab_train(const lab_resume_opts* o);

#endif
