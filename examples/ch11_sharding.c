/* Chapter 11 of TUTORIAL.md: past DDP. The optimizer's state sharded, and ranks with uneven data.

   The chapter-3 program with three additions:
   --zero-stage 1   each rank keeps Adam's moments for its 1/N shard of the parameters only
                    (ZeRO-1), updates that shard and all-gathers the rest. The weights stay DDP's.
   --zero-stage 2   and each layer's gradients are reduce-scattered, so that a rank keeps only its
                    shard's averaged gradients (ZeRO-2).
   --zero-stage 3   and the weights are sharded too: each layer is gathered just before its forward
                    and its backward, and dropped after (ZeRO-3, PyTorch's FSDP).
   --save-every N   with ZeRO-1 every rank first consolidates the sharded state onto rank 0, which
                    writes the file DDP would write; --resume loads it on start, on any number of
                    ranks, sharded or not (each rank takes its own shard).
   --uneven K       rank r drops K*r batches of every epoch, as if its share of the data were
                    shorter. The wrapper is made with uneven_inputs, and a rank that runs out calls
                    ddp_join: it answers the others' all-reduces with zeros until they are done too
                    (PyTorch's Join). --no-join shows why: the same uneven batches without them.
   At the end every rank prints what it holds (weights, gradients, optimizer state), the bytes it
   sent per optimizer step, and the sum of its weights: replicas that ended equal agree to the
   last digit. `diff examples/ch03_multi_gpu.c examples/ch11_sharding.c` shows every change.

   Build and run (from the repository's top folder):
       make
       build/examples/ch11_sharding --zero-stage 1
       build/examples/ch11_sharding --nproc 3 --uneven 1 --batch-size 8
   Options: --zero-stage 0-3  --resume  --uneven K  --no-join
            and those of examples/ch03_multi_gpu.c: --device cpu|cuda|cuda:N|auto
            --data wine|digits|FILE.csv  --data-dir DIR  --epochs N  --batch-size N  --lr X
            --hidden N  --seed N  --save-every N (epochs; 0 = never)  --snapshot FILE  --nproc N */
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
    int zero_stage, resume, uneven, join; /* chapter 11 */
} options;

static void usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--device cpu|cuda|cuda:N|auto] [--data wine|digits|FILE.csv] [--data-dir DIR]\n"
            "          [--epochs N] [--batch-size N] [--lr X] [--hidden N] [--seed N]\n"
            "          [--save-every N] [--snapshot FILE] [--nproc N]\n"
            "          [--zero-stage 0-3] [--resume] [--uneven K] [--no-join]\n", prog);
    exit(2);
}

static options parse_args(int argc, char** argv) {
    options o = {.device = "auto", .data = "wine", .snapshot = "snapshot.safetensors", .epochs = 100, .batch_size = 32,
                 .save_every = 50, .nproc = 4, .lr = 1e-3f, .seed = 1, .join = 1};
    int i;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(argv[0]);
        if (!strcmp(a, "--resume")) { o.resume = 1; continue; }
        if (!strcmp(a, "--no-join")) { o.join = 0; continue; }
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
        else if (!strcmp(a, "--zero-stage")) o.zero_stage = atoi(v);
        else if (!strcmp(a, "--uneven")) o.uneven = atoi(v);
        else {
            fprintf(stderr, "unknown option %s\n", a);
            usage(argv[0]);
        }
    }
    if (o.epochs < 1 || o.batch_size < 1 || o.hidden < 0 || o.save_every < 0 || !(o.lr > 0) || o.nproc < 1) {
        fprintf(stderr, "--epochs, --batch-size and --nproc must be >= 1, --hidden and --save-every >= 0, --lr > 0\n");
        exit(2);
    }
    if (o.zero_stage < 0 || o.zero_stage > 3 || o.uneven < 0) {
        fprintf(stderr, "--zero-stage must be 0 to 3, --uneven >= 0\n");
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

/* What this rank held and sent in training (st, sent), and the sum of its weights: one line per
   rank, in rank order. */
static void print_holdings(ddp_pg* pg, const ddp_wrap_stats* st, uint64_t sent, ddp_model* model, long steps,
                           int uneven) {
    int r;
    for (r = 0; r < ddp_world_size(pg); r++) {
        if (r == ddp_rank(pg)) {
            printf("rank %d holds: weights %.1f KiB, gradients %.1f KiB, optimizer state %.1f KiB", r,
                   st->param_bytes / 1024.0, st->grad_bytes / 1024.0, st->optim_state_bytes / 1024.0);
            if (uneven) printf("; answered %ld steps with zeros", st->shadowed_steps);
            else printf("; sent %.1f KiB per step", sent / 1024.0 / (double)(steps > 0 ? steps : 1));
            printf("; sum of the weights %.9f\n", weight_sum(model));
            fflush(stdout);
        }
        DDP_CHECK(ddp_barrier(pg));
    }
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
    int epoch, first_epoch = 1;
    long steps_before;
    ddp_wrap_stats st;
    uint64_t sent, received;

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
        ddp_wrap_desc wd = {0};
        sizes[0] = data.nfeatures, sizes[1] = hidden, sizes[2] = all.nclasses;
        md.device = device;
        md.seed = opt->seed;
        od.lr = opt->lr;
        wd.zero_stage = opt->zero_stage; /* 1: the optimizer made after the wrap keeps its shard's state */
        wd.uneven_inputs = opt->uneven > 0 && opt->join; /* each step first counts who still trains */
        DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &model));
        DDP_CHECK(ddp_wrap(pg, model, &wd, &ddp)); /* same weights everywhere; gradients averaged */
        DDP_CHECK(ddp_optim_create(model, &od, &optim));
        if (rank == 0)
            printf("training %d -> %d -> %d on %s: %d training and %d test samples, batch %d\n", sizes[0], sizes[1],
                   sizes[2], ddp_device_name(device, devname, sizeof devname), data.n, test.n, opt->batch_size);
    }

    if (opt->resume) { /* every rank loads; each takes its own shard of the optimizer's state */
        ddp_snapshot snap = {0};
        snap.model = model, snap.optim = optim;
        DDP_CHECK(ddp_snapshot_load(&snap, opt->snapshot));
        first_epoch = snap.epoch + 1;
        if (rank == 0) printf("resumed from %s after epoch %d\n", opt->snapshot, snap.epoch);
    }
    steps_before = ddp_optim_steps(optim);

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
    for (epoch = first_epoch; epoch <= opt->epochs; epoch++) {
        double loss_sum = 0;
        const float* xb;
        const int* yb;
        int n, left;
        ddp_sampler_set_epoch(&sampler, epoch); /* without it every epoch repeats one order */
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        left = ddp_loader_batches(&loader) - rank * opt->uneven; /* --uneven: rank r has K*r fewer */
        while (left-- > 0 && (n = ddp_loader_next(&loader, &xb, &yb)) > 0) {
            float loss;
            DDP_CHECK(ddp_model_zero_grad(model));
            DDP_CHECK(ddp_model_forward(model, xb, n));
            DDP_CHECK(ddp_loss_cross_entropy(model, yb, &loss));
            DDP_CHECK(ddp_model_backward(model));
            DDP_CHECK(ddp_optim_step(optim));
            loss_sum += (double)loss * n;
        }
        /* Out of batches: answer the others' steps with zeros until every rank is here; then all
           take the weights and optimizer state of the rank that trained longest. */
        if (opt->uneven && opt->join) DDP_CHECK(ddp_join(ddp));
        if (rank == 0) report(epoch, opt->epochs, loss_sum / sampler.num_samples);
        if (opt->save_every && epoch % opt->save_every == 0) {
            ddp_snapshot snap = {0}; /* chapter 6 adds the sampler and the position in the epoch */
            snap.model = model, snap.optim = optim, snap.epoch = epoch;
            DDP_CHECK(ddp_optim_consolidate(optim, 0)); /* ZeRO-1: every rank's shard to rank 0 */
            if (rank == 0) DDP_CHECK(ddp_snapshot_save(&snap, opt->snapshot));
            if (rank == 0) printf("epoch %3d/%d  snapshot saved to %s\n", epoch, opt->epochs, opt->snapshot);
        }
    }

    /* 5. Evaluate on the held-out samples. With zero_stage 3 no rank holds the whole model: every
       rank gathers every layer first (collective), and then rank 0 can run forward alone. */
    ddp_wrapper_stats(ddp, &st), ddp_pg_bytes(pg, &sent, &received); /* what training held and sent */
    DDP_CHECK(ddp_full_params(ddp, 1));
    if (rank == 0) {
        float accuracy, test_loss;
        DDP_CHECK(ddp_model_evaluate(model, test.x, test.y, test.n, &accuracy, &test_loss));
        printf("test loss: %.4f\n", test_loss);
        printf("test accuracy: %.4f\n", accuracy);
    }
    print_holdings(pg, &st, sent, model, ddp_optim_steps(optim) - steps_before, opt->uneven);
    DDP_CHECK(ddp_full_params(ddp, 0));

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
