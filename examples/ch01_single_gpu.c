/* Chapter 1 of TUTORIAL.md: the single-device baseline.

   A small classifier (13 -> 64 -> 3, ReLU) trained on the UCI wine data with Adam and
   cross-entropy, on one device: a GPU when one is usable, otherwise the CPU. Every later
   chapter starts from this file and changes a few lines, so read it once slowly.

   Build and run (from the repository's top folder):
       make
       build/examples/ch01_single_gpu                  # device chosen automatically
       build/examples/ch01_single_gpu --device cpu --epochs 20
       build/examples/ch01_single_gpu --data digits    # 8x8 digits with a wider MLP
   Options: --device cpu|cuda|cuda:N|auto  --data wine|digits|FILE.csv  --data-dir DIR
            --epochs N  --batch-size N  --lr X  --hidden N  --seed N
            --save-every N (epochs; 0 = never)  --snapshot FILE */
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
} options;

static void usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--device cpu|cuda|cuda:N|auto] [--data wine|digits|FILE.csv] [--data-dir DIR]\n"
            "          [--epochs N] [--batch-size N] [--lr X] [--hidden N] [--seed N]\n"
            "          [--save-every N] [--snapshot FILE] [--nproc N]\n", prog);
    exit(2);
}

static options parse_args(int argc, char** argv) {
    options o = {.device = "auto", .data = "wine", .snapshot = "snapshot.safetensors", .epochs = 100, .batch_size = 32,
                 .save_every = 50, .nproc = 4, .lr = 1e-3f, .seed = 1};
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
        else {
            fprintf(stderr, "unknown option %s\n", a);
            usage(argv[0]);
        }
    }
    if (o.epochs < 1 || o.batch_size < 1 || o.hidden < 0 || o.save_every < 0 || !(o.lr > 0) || o.nproc < 1) {
        fprintf(stderr, "--epochs, --batch-size and --nproc must be >= 1, --hidden and --save-every >= 0, --lr > 0\n");
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

/* Everything a training run does. In chapter 1 `rank` is 0, the only process; from chapter 3 on,
   this same function runs in every process of the job, with its own rank. Returns the exit status. */
static int train(int rank, void* arg) {
    const options* opt = (const options*)arg;
    ddp_dataset all, data, test;
    ddp_device device;
    ddp_model* model;
    ddp_optim* optim;
    ddp_sampler sampler;
    ddp_loader loader;
    char devname[32];
    int epoch;

    /* 1. Data: load, hold out 20% for testing, standardise with the training statistics. */
    DDP_CHECK(ddp_dataset_load(opt->data, opt->data_dir, &all));
    DDP_CHECK(ddp_dataset_split(&all, 0.2, 42, &data, &test));
    ddp_dataset_standardize(&data, &test);

    /* 2. Device: a GPU when usable, else the CPU (--device overrides). */
    DDP_CHECK(ddp_device_parse(opt->device, &device));
    DDP_CHECK(ddp_device_resolve(device, &device));

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
        DDP_CHECK(ddp_optim_create(model, &od, &optim));
        if (rank == 0)
            printf("training %d -> %d -> %d on %s: %d training and %d test samples, batch %d\n", sizes[0], sizes[1],
                   sizes[2], ddp_device_name(device, devname, sizeof devname), data.n, test.n, opt->batch_size);
    }

    /* 4. Train: each epoch visits the training set once in a fresh random order. With one replica
       the sampler is simply a seeded shuffle; chapter 3 hands it the process group instead, and
       each rank then visits its own share. The loader gathers the batches in that order. */
    {
        ddp_sampler_desc sd = {0};
        sd.seed = opt->seed;
        DDP_CHECK(ddp_sampler_init(&sampler, data.n, &sd));
        DDP_CHECK(ddp_loader_init(&loader, &data, &(ddp_loader_desc){.batch_size = opt->batch_size}));
    }
    for (epoch = 1; epoch <= opt->epochs; epoch++) {
        double loss_sum = 0;
        const float* xb;
        const int* yb;
        int n;
        ddp_sampler_set_epoch(&sampler, epoch); /* without it every epoch repeats one order */
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        while ((n = ddp_loader_next(&loader, &xb, &yb)) > 0) {
            float loss;
            DDP_CHECK(ddp_model_zero_grad(model));
            DDP_CHECK(ddp_model_forward(model, xb, n));
            DDP_CHECK(ddp_loss_cross_entropy(model, yb, &loss));
            DDP_CHECK(ddp_model_backward(model));
            DDP_CHECK(ddp_optim_step(optim));
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
        DDP_CHECK(ddp_model_evaluate(model, test.x, test.y, test.n, &accuracy, &test_loss));
        printf("test loss: %.4f\n", test_loss);
        printf("test accuracy: %.4f\n", accuracy);
    }

    ddp_loader_free(&loader);
    ddp_optim_destroy(optim);
    ddp_model_destroy(model);
    ddp_dataset_free(&data), ddp_dataset_free(&test), ddp_dataset_free(&all);
    return 0;
}

int main(int argc, char** argv) {
    options opt = parse_args(argc, argv);
    return train(0, &opt);
}
