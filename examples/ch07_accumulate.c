/* Chapter 7 of TUTORIAL.md: gradient accumulation and no_sync.

   The chapter-3 program with one optimizer step per --accumulate K micro-batches: the gradients
   of the K backward passes add up in p->grad, and the step uses their sum. Every rank does the
   same, so one step sees micro-batch x K x ranks samples. Only the last backward of a step needs
   to all-reduce (the sum of averages is the average of sums): ddp_no_sync(ddp, 1) before the
   others keeps their gradients local. --sync every all-reduces in every backward (the same
   weights, K times the traffic); --sync first is the classic off-by-one, which all-reduces the
   step's first micro-batch instead of its last: the ranks then step with gradients of their own,
   and their weights drift apart. At the end rank 0 prints the wrapper's counters, and every rank
   prints the sum of its weights: equal replicas agree to the last digit.
   `diff examples/ch03_multi_gpu.c examples/ch07_accumulate.c` shows every change.

   Build and run (from the repository's top folder):
       make
       build/examples/ch07_accumulate --nproc 2 --batch-size 8 --accumulate 4
       build/examples/ch07_accumulate --nproc 2 --batch-size 8 --accumulate 4 --sync every
   Options: --accumulate K (micro-batches per optimizer step, default 1)  --sync last|every|first
            and those of examples/ch03_multi_gpu.c: --device cpu|cuda|cuda:N|auto
            --data wine|digits|FILE.csv  --data-dir DIR  --epochs N  --batch-size N (per micro-batch)
            --lr X  --hidden N  --seed N  --save-every N (epochs; 0 = never)  --snapshot FILE
            --nproc N */
#define DDP_IMPLEMENTATION
#include "ddp.h"

typedef struct options {
    const char* device;
    const char* data;
    const char* data_dir;
    const char* snapshot;
    int epochs, batch_size, hidden, save_every, nproc;
    float lr;
    unsigned long seed;
    int accumulate; const char* sync; /* chapter 7: micro-batches per step, which one all-reduces */
} options;

static void usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--device cpu|cuda|cuda:N|auto] [--data wine|digits|FILE.csv] [--data-dir DIR]\n"
            "          [--epochs N] [--batch-size N] [--lr X] [--hidden N] [--seed N]\n"
            "          [--save-every N] [--snapshot FILE] [--nproc N]\n"
            "          [--accumulate K] [--sync last|every|first]\n", prog);
    exit(2);
}

static options parse_args(int argc, char** argv) {
    options o = {.device = "auto", .data = "wine", .snapshot = "snapshot.safetensors", .epochs = 100, .batch_size = 32,
                 .save_every = 50, .nproc = 4, .lr = 1e-3f, .seed = 1, .accumulate = 1, .sync = "last"};
    int i;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(argv[0]);
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            usage(argv[0]);
        }
        i++;
        if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--data")) o.data = v;
        else if (!strcmp(a, "--data-dir")) o.data_dir = v;
        else if (!strcmp(a, "--snapshot")) o.snapshot = v;
        else if (!strcmp(a, "--epochs")) o.epochs = atoi(v);
        else if (!strcmp(a, "--batch-size")) o.batch_size = atoi(v);
        else if (!strcmp(a, "--hidden")) o.hidden = atoi(v);
        else if (!strcmp(a, "--save-every")) o.save_every = atoi(v);
        else if (!strcmp(a, "--lr")) o.lr = (float)atof(v);
        else if (!strcmp(a, "--seed")) o.seed = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--nproc")) o.nproc = atoi(v); /* used from chapter 3 on */
        else if (!strcmp(a, "--accumulate")) o.accumulate = atoi(v);
        else if (!strcmp(a, "--sync")) o.sync = v;
        else {
            fprintf(stderr, "unknown option %s\n", a);
            usage(argv[0]);
        }
    }
    if (o.epochs < 1 || o.batch_size < 1 || o.hidden < 0 || o.save_every < 0 || !(o.lr > 0) || o.nproc < 1) {
        fprintf(stderr, "--epochs, --batch-size and --nproc must be >= 1, --hidden and --save-every >= 0, --lr > 0\n");
        exit(2);
    }
    if (o.accumulate < 1 || (strcmp(o.sync, "last") && strcmp(o.sync, "every") && strcmp(o.sync, "first"))) {
        fprintf(stderr, "--accumulate must be >= 1, --sync last, every or first\n");
        exit(2);
    }
    return o;
}

/* One line per epoch; on a terminal, a progress bar that rewrites itself instead. */
static void report(int epoch, int epochs, double loss) {
    if (isatty(1)) {
        int i, done = 30 * epoch / epochs;
        printf("\r[");
        for (i = 0; i < 30; i++) putchar(i < done ? '#' : '.');
        printf("] epoch %3d/%d  loss %.4f%s", epoch, epochs, loss, epoch == epochs ? "\n" : "");
    } else {
        printf("epoch %3d/%d  loss %.4f\n", epoch, epochs, loss);
    }
    fflush(stdout);
}

/* The sum of this rank's weights: replicas that stay in step agree to the last digit. */
static double weight_sum(ddp_model* m) {
    ddp_device cpu = {.type = DDP_DEVICE_CPU};
    double sum = 0;
    int i;
    size_t j;
    DDP_CHECK(ddp_stream_sync(ddp_model_stream(m))); /* on a GPU: after the last step's work */
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        float* w = (float*)malloc(p->count * sizeof *w);
        if (w) DDP_CHECK(ddp_copy(cpu, w, p->device, p->data, p->count * sizeof *w, NULL));
        for (j = 0; w && j < p->count; j++) sum += w[j];
        free(w);
    }
    return sum;
}

/* Everything a training run does. In chapter 1 `rank` is 0, the only process; from chapter 3 on,
   this same function runs in every process of the job, with its own rank. Returns the exit status. */
static int train(int rank, void* arg) {
    const options* opt = (const options*)arg;
    ddp_dataset all, data, test;
    ddp_device device;
    ddp_desc desc = {0};
    ddp_pg* pg;
    ddp_wrapper* ddp;
    ddp_model* model;
    ddp_optim* optim;
    ddp_sampler sampler;
    ddp_loader loader;
    char devname[32];
    int epoch, r;

    /* 1. Data: load, hold out 20% for testing, standardise with the training statistics. */
    DDP_CHECK(ddp_dataset_load(opt->data, opt->data_dir, &all));
    DDP_CHECK(ddp_dataset_split(&all, 0.2, 42, &data, &test));
    ddp_dataset_standardize(&data, &test);

    /* 2. Device: a GPU when usable, else the CPU (--device overrides). */
    DDP_CHECK(ddp_device_parse(opt->device, &desc.device));
    DDP_CHECK(ddp_init(&desc, &pg)); /* join the job: this rank's GPU when every rank has one */
    device = ddp_pg_device(pg), rank = ddp_rank(pg);

    /* 3. Model and optimizer: the MLP features -> hidden -> classes, Adam. */
    {
        int hidden = opt->hidden ? opt->hidden : (data.nfeatures > 32 ? 256 : 64);
        int sizes[3];
        ddp_model_desc md = {.device = {.type = DDP_DEVICE_AUTO}};
        ddp_optim_desc od = {.kind = DDP_ADAM};
        sizes[0] = data.nfeatures, sizes[1] = hidden, sizes[2] = all.nclasses;
        md.device = device;
        md.seed = opt->seed;
        od.lr = opt->lr;
        DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &model));
        DDP_CHECK(ddp_wrap(pg, model, NULL, &ddp)); /* same weights everywhere; gradients averaged */
        DDP_CHECK(ddp_optim_create(model, &od, &optim));
        if (rank == 0)
            printf("training %d -> %d -> %d on %s: %d training and %d test samples, batch %d x %d micro-batches x "
                   "%d ranks = %d per step\n", sizes[0], sizes[1], sizes[2],
                   ddp_device_name(device, devname, sizeof devname), data.n, test.n, opt->batch_size,
                   opt->accumulate, ddp_world_size(pg), opt->batch_size * opt->accumulate * ddp_world_size(pg));
    }

    /* 4. Train: each epoch visits the training set once in a fresh random order. With one replica
       the sampler is simply a seeded shuffle; chapter 3 hands it the process group instead, and
       each rank then visits its own share. The loader gathers the batches in that order. */
    {
        ddp_sampler_desc sd = {0};
        sd.seed = opt->seed;
        sd.pg = pg; /* each rank takes every world-size-th sample of the epoch's order */
        DDP_CHECK(ddp_sampler_init(&sampler, data.n, &sd));
        DDP_CHECK(ddp_loader_init(&loader, &data, &(ddp_loader_desc){.batch_size = opt->batch_size}));
    }
    for (epoch = 1; epoch <= opt->epochs; epoch++) {
        double loss_sum = 0;
        const float* xb;
        const int* yb;
        int n, b, nb;
        ddp_sampler_set_epoch(&sampler, epoch); /* without it every epoch repeats one order */
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        nb = ddp_loader_batches(&loader); /* the same on every rank: the sampler pads */
        for (b = 0; (n = ddp_loader_next(&loader, &xb, &yb)) > 0; b++) { /* micro-batch b */
            float loss;
            /* a step is K micro-batches (fewer at the end of the epoch): the first zeroes the
               gradients, the last steps */
            int first = b % opt->accumulate == 0, last = (b + 1) % opt->accumulate == 0 || b + 1 == nb;
            int sync = !strcmp(opt->sync, "every") ? 1 : !strcmp(opt->sync, "first") ? first : last;
            if (first) DDP_CHECK(ddp_model_zero_grad(model));
            ddp_no_sync(ddp, !sync); /* 1: this backward only adds into p->grad, no all-reduce */
            DDP_CHECK(ddp_model_forward(model, xb, n));
            DDP_CHECK(ddp_loss_cross_entropy(model, yb, &loss));
            DDP_CHECK(ddp_model_backward(model));
            if (last) DDP_CHECK(ddp_optim_step(optim));
            loss_sum += (double)loss * n;
        }
        if (rank == 0) report(epoch, opt->epochs, loss_sum / sampler.num_samples);
        if (rank == 0 && opt->save_every && epoch % opt->save_every == 0) {
            ddp_snapshot snap = {0}; /* chapter 6 adds the sampler and the position in the epoch */
            snap.model = model, snap.optim = optim, snap.epoch = epoch;
            DDP_CHECK(ddp_snapshot_save(&snap, opt->snapshot));
            printf("epoch %3d/%d  snapshot saved to %s\n", epoch, opt->epochs, opt->snapshot);
        }
    }

    /* 5. Evaluate on the held-out samples. */
    if (rank == 0) {
        float accuracy, test_loss;
        ddp_wrap_stats st;
        DDP_CHECK(ddp_model_evaluate(model, test.x, test.y, test.n, &accuracy, &test_loss));
        printf("test loss: %.4f\n", test_loss);
        printf("test accuracy: %.4f\n", accuracy);
        ddp_wrapper_stats(ddp, &st); /* the wrapper's counters */
        printf("%ld optimizer steps, %ld all-reduces of the gradients\n", ddp_optim_steps(optim), st.all_reduces);
    }
    for (r = 0; r < ddp_world_size(pg); r++) { /* every rank, in rank order */
        if (r == rank) printf("rank %d: sum of the weights %.9f\n", rank, weight_sum(model)), fflush(stdout);
        DDP_CHECK(ddp_barrier(pg));
    }

    ddp_loader_free(&loader);
    ddp_optim_destroy(optim);
    ddp_wrapper_destroy(ddp), ddp_destroy(pg);
    ddp_model_destroy(model);
    ddp_dataset_free(&data), ddp_dataset_free(&test), ddp_dataset_free(&all);
    return 0;
}

int main(int argc, char** argv) {
    options opt = parse_args(argc, argv);
    return ddp_spawn(opt.nproc, train, &opt) == DDP_OK ? 0 : 1;
}
