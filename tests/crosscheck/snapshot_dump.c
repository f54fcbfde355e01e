/* tests/crosscheck/snapshot_dump.c: writes a snapshot and, beside it, the values it must hold, for
   tests/crosscheck/snapshot_numpy.py to compare with what numpy reads from the file (tests/run.sh runs both).

   usage: snapshot_dump SNAPSHOT VALUES.txt

   The snapshot: the wine-shaped MLP 13 -> 16 -> 3 (seed 1) with Adam after 3 steps on seeded
   random data, a sampler (2 replicas, rank 1, epoch 3), a loader 2 batches into the epoch, a
   generator, epoch 3, step 17. VALUES.txt has one line per tensor,
       tensor NAME DIM... : V V V ...        (every value "%.9g": float32 round-trips exactly)
   and one per metadata value the C side knows,
       meta KEY VALUE */
#define DDP_IMPLEMENTATION
#include "ddp.h"

#include <stdio.h>
#include <stdlib.h>

static void put_tensor(FILE* f, const char* name, const ddp_param* p, const float* v) {
    size_t i;
    fprintf(f, "tensor %s", name);
    if (p->ndim == 2) fprintf(f, " %d %d :", p->shape[0], p->shape[1]);
    else fprintf(f, " %d :", p->shape[0]);
    for (i = 0; i < p->count; i++) fprintf(f, " %.9g", (double)v[i]);
    fprintf(f, "\n");
}

int main(int argc, char** argv) {
    static const int sizes[] = {13, 16, 3};
    ddp_model_desc md;
    ddp_optim_desc od;
    ddp_sampler_desc sd;
    ddp_model* m = NULL;
    ddp_optim* o = NULL;
    ddp_sampler sampler;
    ddp_loader loader;
    ddp_dataset data;
    ddp_snapshot snap;
    ddp_rng r = ddp_rng_seed(42), gen;
    float x[8 * 13], loss;
    int y[8], i, step;
    FILE* f;
    if (argc != 3) {
        fprintf(stderr, "usage: %s SNAPSHOT VALUES.txt\n", argv[0]);
        return 2;
    }
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 1;
    DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &m));
    memset(&od, 0, sizeof od);
    od.kind = DDP_ADAM;
    od.lr = 0.01f;
    DDP_CHECK(ddp_optim_create(m, &od, &o));
    for (step = 0; step < 3; step++) {
        for (i = 0; i < 8 * 13; i++) x[i] = 2.f * ddp_rng_uniform(&r) - 1.f;
        for (i = 0; i < 8; i++) y[i] = (int)ddp_rng_below(&r, 3);
        DDP_CHECK(ddp_model_zero_grad(m));
        DDP_CHECK(ddp_model_forward(m, x, 8));
        DDP_CHECK(ddp_loss_cross_entropy(m, y, &loss));
        DDP_CHECK(ddp_model_backward(m));
        DDP_CHECK(ddp_optim_step(o));
    }
    /* a small data set for the sampler and loader: row i is i*10 + j */
    data.n = 50, data.nfeatures = 13, data.nclasses = 3;
    data.x = (float*)malloc(50 * 13 * sizeof(float));
    data.y = (int*)malloc(50 * sizeof(int));
    for (i = 0; i < 50 * 13; i++) data.x[i] = (float)((i / 13) * 10 + i % 13);
    for (i = 0; i < 50; i++) data.y[i] = i % 3;
    memset(&sd, 0, sizeof sd);
    sd.num_replicas = 2, sd.rank = 1, sd.seed = 7;
    DDP_CHECK(ddp_sampler_init(&sampler, 50, &sd));
    ddp_sampler_set_epoch(&sampler, 3);
    DDP_CHECK(ddp_loader_init(&loader, &data, &(ddp_loader_desc){.batch_size = 4}));
    DDP_CHECK(ddp_loader_start(&loader, &sampler));
    ddp_loader_next(&loader, NULL, NULL);
    ddp_loader_next(&loader, NULL, NULL);
    gen = ddp_rng_seed(99);
    ddp__rng_next(&gen);

    memset(&snap, 0, sizeof snap);
    snap.model = m, snap.optim = o, snap.sampler = &sampler, snap.loader = &loader, snap.rng = &gen;
    snap.epoch = 3, snap.step = 17;
    DDP_CHECK(ddp_snapshot_save(&snap, argv[1]));

    f = fopen(argv[2], "w");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    for (i = 0; i < ddp_model_num_params(m); i++) put_tensor(f, ddp_model_param(m, i)->name, ddp_model_param(m, i),
                                                            ddp_model_param(m, i)->data);
    for (i = 0; i < ddp_model_num_params(m); i++) { /* Adam's moments, under PyTorch's names */
        char name[96];
        const ddp_param* p = ddp_model_param(m, i);
        snprintf(name, sizeof name, "optim.%s.exp_avg", p->name);
        put_tensor(f, name, p, o->state1[i]);
        snprintf(name, sizeof name, "optim.%s.exp_avg_sq", p->name);
        put_tensor(f, name, p, o->state2[i]);
    }
    fprintf(f, "meta format ddp.h snapshot 1\nmeta epoch 3\nmeta step 17\nmeta optimizer adam\n");
    fprintf(f, "meta optimizer_steps %ld\nmeta sampler_epoch 3\nmeta sampler_n 50\nmeta sampler_replicas 2\n",
            ddp_optim_steps(o));
    fprintf(f, "meta loader_position %d\nmeta rng %016llx\n", loader.pos, (unsigned long long)gen.state);
    if (fclose(f) != 0) {
        perror(argv[2]);
        return 1;
    }
    ddp_loader_free(&loader);
    ddp_dataset_free(&data);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return 0;
}
