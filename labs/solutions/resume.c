/* Reference solution of lab "resume" (labs/resume/starter.c). Instructors only: it is not in the
   handout (make lab-handout leaves labs/solutions out).   check it:  make lab-resume SOLUTION=1 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resume.h"

/* Load `path` into *snap if a snapshot is there and it loads whole (ddp_snapshot_load checks the
   length, the header and the checksum, and changes nothing unless all of it is right). */
static int load_whole(ddp_snapshot* snap, const char* path) {
    return ddp_snapshot_exists(path) == 1 && ddp_snapshot_load(snap, path) == DDP_OK;
}

void lab_train(const lab_resume_opts* o) {
    ddp_model* model;
    ddp_optim* optim;
    ddp_sampler sampler;
    ddp_loader loader;
    ddp_model_desc md;
    ddp_optim_desc od;
    ddp_sampler_desc sd;
    ddp_snapshot snap;
    int sizes[3], epoch, start_epoch = 1, n, newest_whole = 0;
    long step = 0;
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

    /* (1) every piece of state the next step reads: weights, Adam's moments and step count, the
       sampler's epoch, the loader's position in the epoch; and our own counters */
    memset(&snap, 0, sizeof snap);
    snap.model = model, snap.optim = optim, snap.sampler = &sampler, snap.loader = &loader;
    /* the newest snapshot that loads: the one at snapshot_path, else the one before it */
    newest_whole = load_whole(&snap, o->snapshot_path);
    if (newest_whole || load_whole(&snap, o->previous_path)) {
        start_epoch = snap.epoch; /* the epoch it was taken in: the loader skips what was done */
        step = snap.step;
    }

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
            /* (2) after the optimizer step, when the state is whole */
            if (o->save_every > 0 && step % o->save_every == 0) {
                snap.epoch = epoch, snap.step = step;
                /* (3) the newest becomes the previous one, then the new one is written (atomically:
                   ddp_snapshot_save writes a temporary file and renames it). A crash between the two
                   leaves nothing at snapshot_path and this snapshot at previous_path, which the
                   restart finds. A newest that did not load is not moved over the good previous one:
                   the save replaces it. */
                if (newest_whole && rename(o->snapshot_path, o->previous_path) != 0) {
                    fprintf(stderr, "cannot move %s to %s\n", o->snapshot_path, o->previous_path);
                    exit(1);
                }
                DDP_CHECK(ddp_snapshot_save(&snap, o->snapshot_path));
                newest_whole = 1;
            }
            lab_after_step(step, model);
        }
    }
    lab_finished(model);
    ddp_loader_free(&loader);
    ddp_optim_destroy(optim);
    ddp_model_destroy(model);
}
