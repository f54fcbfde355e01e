/* Chapter 9 of TUTORIAL.md: debugging a hang.

   The chapter-3 training loop with one line added, the classic DDP bug: rank 0 wants the average
   loss over all ranks for its progress line, so it all-reduces the loss, inside `if (rank == 0)`.
   The other ranks never make that call. Rank 0 then waits for partners that are busy with the next
   step's gradients, and the job hangs until the deadline. Run it and read what each rank says:
       DDP_TIMEOUT=5 build/examples/ch09_hang --nproc 2
       DDP_TIMEOUT=5 DDP_DEBUG=DETAIL build/examples/ch09_hang --nproc 2
   With --fixed every rank makes the call, and the job trains normally. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

typedef struct options { int nproc, fixed; } options;

static int train(int rank, void* arg) {
    const options* opt = (const options*)arg;
    ddp_dataset all, data, test;
    ddp_pg* pg;
    ddp_wrapper* ddp;
    ddp_model* model;
    ddp_optim* optim;
    ddp_sampler sampler;
    ddp_loader loader;
    ddp_desc dd = {0};
    ddp_sampler_desc sd = {0};
    ddp_model_desc md = {.device = {.type = DDP_DEVICE_CPU}, .seed = 1};
    int sizes[3] = {13, 64, 3}, epoch;

    DDP_CHECK(ddp_dataset_load("wine", NULL, &all));
    DDP_CHECK(ddp_dataset_split(&all, 0.2, 42, &data, &test));
    ddp_dataset_standardize(&data, &test);
    dd.device.type = DDP_DEVICE_CPU;
    DDP_CHECK(ddp_init(&dd, &pg));
    rank = ddp_rank(pg);
    DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &model));
    DDP_CHECK(ddp_wrap(pg, model, NULL, &ddp));
    DDP_CHECK(ddp_optim_create(model, NULL, &optim));
    sd.pg = pg;
    DDP_CHECK(ddp_sampler_init(&sampler, data.n, &sd));
    DDP_CHECK(ddp_loader_init(&loader, &data, &(ddp_loader_desc){.batch_size = 32}));
    for (epoch = 1; epoch <= 20; epoch++) {
        float loss_sum = 0;
        const float* xb;
        const int* yb;
        int n;
        ddp_sampler_set_epoch(&sampler, epoch);
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        while ((n = ddp_loader_next(&loader, &xb, &yb)) > 0) {
            float loss;
            DDP_CHECK(ddp_model_zero_grad(model));
            DDP_CHECK(ddp_model_forward(model, xb, n));
            DDP_CHECK(ddp_loss_cross_entropy(model, yb, &loss));
            DDP_CHECK(ddp_model_backward(model));
            DDP_CHECK(ddp_optim_step(optim));
            loss_sum += loss * (float)n;
        }
        /* THE BUG: a collective that only rank 0 calls. --fixed moves the call out of the if. */
        if (opt->fixed) DDP_CHECK(ddp_all_reduce(pg, &loss_sum, 1, DDP_F32, DDP_SUM, NULL));
        else if (rank == 0) DDP_CHECK(ddp_all_reduce(pg, &loss_sum, 1, DDP_F32, DDP_SUM, NULL));
        if (rank == 0) printf("epoch %2d  mean loss over all ranks %.4f\n", epoch, loss_sum / data.n);
        fflush(stdout);
    }
    ddp_loader_free(&loader);
    ddp_optim_destroy(optim);
    ddp_wrapper_destroy(ddp);
    ddp_model_destroy(model);
    ddp_destroy(pg);
    ddp_dataset_free(&data), ddp_dataset_free(&test), ddp_dataset_free(&all);
    return 0;
}

int main(int argc, char** argv) {
    options opt = {.nproc = 2};
    int i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fixed")) opt.fixed = 1;
        else if (!strcmp(argv[i], "--nproc") && i + 1 < argc) opt.nproc = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--nproc N] [--fixed]\n", argv[0]);
            return 2;
        }
    }
    if (opt.nproc < 1) opt.nproc = 1;
    DDP_CHECK(ddp_spawn(opt.nproc, train, &opt));
    return 0;
}
