/* Lab "resume": snapshots and resuming after a crash.     run the tests:  make lab-resume

   A long training job will be interrupted: a machine dies, a job hits its time limit, someone
   presses Ctrl-C. Without snapshots it starts again from step 1. With them it carries on from the
   last one, and - if the snapshot holds EVERYTHING the next steps depend on - it ends with the
   same weights, bit for bit, as a run that never stopped. That is what the tests check: they run
   this loop to the end once, then run it again but kill it at some step (the harness calls _exit
   inside lab_after_step, as a crash would), start it again, and compare the final weights.

   Below is a complete training loop with no snapshots. Add them with ddp.h's ddp_snapshot_*
   (read the >>snapshot declarations in ddp.h, and examples/04_fault_tolerance.c):

   (1) RESUME, before the loop: if a snapshot exists at o->snapshot_path (ddp_snapshot_exists),
       load it (ddp_snapshot_load) and carry on from where it was taken: the epoch to continue
       and the step counter come from the snapshot. No snapshot: start from the beginning.
   (2) SAVE, after the optimizer step: every o->save_every steps (never when it is 0), write a
       snapshot (ddp_snapshot_save) with the current epoch and step.

   What must a snapshot hold for the resumed run to be exactly the uninterrupted one? Think about
   every piece of state the next step reads: the weights, certainly; Adam keeps two running
   averages per weight and a step count; the sampler's shuffle depends on the epoch; and a
   snapshot taken in the middle of an epoch must know how far into the epoch the loader was, or
   the resumed run would see some batches twice. ddp_snapshot has a field for each: fill every
   one (one ddp_snapshot struct, used for both load and save, is simplest).

   Keep calling lab_after_step(step) after each step with the true step number (1 for the first
   step ever, also in a resumed run) and lab_finished(model) at the end: the tests read them.
   The tests use a small made-up data set: 4 epochs of 6 batches, a snapshot every 5 steps. */
#include <string.h>

#include "resume.h"

void lab_train(const lab_resume_opts* o) {
    ddp_model* model;
    ddp_optim* optim;
    ddp_sampler sampler;
    ddp_loader loader;
    ddp_model_desc md;
    ddp_optim_desc od;
    ddp_sampler_desc sd;
    int sizes[3], epoch, start_epoch = 1, n;
    long step = 0; /* optimizer steps since the very first start */
    const float* x;
    const int* y;
    float loss;

    memset(&md, 0, sizeof md), memset(&od, 0, sizeof od), memset(&sd, 0, sizeof sd);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = o->seed;
    sizes[0] = o->data->nfeatures, sizes[1] = 16, sizes[2] = o->data->nclasses;
    DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &model));
    od.kind = DDP_ADAM;
    od.lr = 1e-2f;
    DDP_CHECK(ddp_optim_create(model, &od, &optim));
    sd.seed = o->seed;
    DDP_CHECK(ddp_sampler_init(&sampler, o->data->n, &sd));
    DDP_CHECK(ddp_loader_init(&loader, o->data, o->batch_size, 0));

    /* TODO (1): resume from o->snapshot_path when a snapshot is there. */

    for (epoch = start_epoch; epoch <= o->epochs; epoch++) {
        ddp_sampler_set_epoch(&sampler, epoch);
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        while ((n = ddp_loader_next(&loader, &x, &y)) > 0) {
            DDP_CHECK(ddp_model_zero_grad(model));
            DDP_CHECK(ddp_model_forward(model, x, n));
            DDP_CHECK(ddp_loss_cross_entropy(model, y, &loss));
            DDP_CHECK(ddp_model_backward(model));
            DDP_CHECK(ddp_optim_step(optim));
            step++;
            /* TODO (2): every o->save_every steps, save a snapshot to o->snapshot_path. */
            lab_after_step(step);
        }
    }
    lab_finished(model);
    ddp_loader_free(&loader);
    ddp_optim_destroy(optim);
    ddp_model_destroy(model);
}
