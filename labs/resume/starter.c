/* Lab "resume": snapshots and resuming after a crash.     run the tests:  make lab-resume

   A long training job will be interrupted: a machine dies, a job hits its time limit, someone
   presses Ctrl-C. Without snapshots it starts again from step 1. With them it carries on from the
   last one, and - if the snapshot holds EVERYTHING the next steps depend on - it ends with the
   same weights, bit for bit, as a run that never stopped. That is what the tests check: they run
   this loop to the end once, then run it again but kill it at some step (the harness calls _exit
   inside lab_after_step, as a crash would), start it again, and compare the final weights.

   Below is a complete training loop with no snapshots. Add them with ddp.h's ddp_snapshot_*
   (the declarations under >>snapshot in ddp.h say what each call does). THE RULES (the tests
   name the one you break):

   rule RS1 Resume: when a snapshot exists, the run carries on from it: its first step is the one
            after the snapshot's, in the epoch the snapshot was taken in. No snapshot: start from
            the beginning.
   rule RS2 Save every o->save_every optimizer steps (never when it is 0), once the step is
            complete: the snapshot taken "at step 10" holds the state after step 10.
   rule RS3 The snapshot holds every piece of state the next step reads. The weights, certainly.
            What else does the next step read? Go through the loop line by line: the optimizer,
            the sampler, the loader... what does each remember from one step to the next?
   rule RS4 Bit for bit: killed anywhere and restarted (once or several times), the job ends with
            exactly the weights of a run that was never killed.
   rule RS5 Call lab_after_step(step, model) after every step with the true step number (1 for
            the first step ever, also in a resumed run) and lab_finished(model) at the end.
   rule RS6 Keep two snapshots: o->snapshot_path holds the newest, o->previous_path the one saved
            before it. A file on disk can be damaged (a failing disk, a copy cut short), and a
            crash can land in the middle of a save, whatever a save does: resume from the newest
            snapshot that loads whole; when none does, start from the beginning. Think about
            what each moment of your save leaves on disk if the process dies right then.

   The tests use a small made-up data set: 4 epochs of 6 batches, a snapshot every 5 or 6 steps,
   kills mid-epoch, right after a save, before the first save, twice, and after an epoch's end;
   and between a kill and the restart they damage the newest snapshot, cut it short, or leave
   the files as a crash in the middle of a save can leave them.
   Stuck? labs/resume/HINTS.md. Then answer labs/resume/QUESTIONS.md. */
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
    DDP_CHECK(ddp_loader_init(&loader, o->data, &(ddp_loader_desc){.batch_size = o->batch_size}));

    /* TODO (1): resume from the newest snapshot that loads (rules RS1, RS6). */

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
            /* TODO (2): every o->save_every steps, save a snapshot (rules RS2, RS3, RS6). */
            lab_after_step(step, model);
        }
    }
    lab_finished(model);
    ddp_loader_free(&loader);
    ddp_optim_destroy(optim);
    ddp_model_destroy(model);
}
