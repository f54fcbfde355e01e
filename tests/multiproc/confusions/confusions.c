/* tests/multiproc/confusions/confusions.c: the mistakes learners make with DDP, each as a small training
   program written the way a student would write it. tests/multiproc/test_confusions.sh runs each one with
   real processes (under build/ddprun, or with the launcher's variables set by hand) and checks
   what the library says about it.

       confusions SCENARIO [--epochs N] [--batch-size N] [--k N] [--sync every|last|first]
                           [--samples N] [--snapshot FILE] [--no-set-epoch] [--resume]
                           [--find-unused] [--no-log] [--no-destroy] [--fail-at-end]

   Scenarios (the number is the item of the list in TUTORIAL.md's callouts):
     epochs       3   trains a few epochs and prints the first indices of each epoch's order;
                      --no-set-epoch forgets ddp_sampler_set_epoch; --resume restarts epoch 2
                      from a snapshot taken in the middle of it (in this process), as a resumed
                      job does, which is no repeat
     device_rank  4-5 picks the GPU with RANK instead of LOCAL_RANK
     gpu_message  4-5 prints the error for a GPU number past the visible GPUs (no GPU needed)
     barrier      7   trains a few steps, then calls ddp_barrier inside if (rank == 0) (to wait
                      for "the others" after saving a checkpoint) before leaving
     uneven       8   a hand-made split: rank r's shard has 4 + r batches; after the loop every
                      rank all-reduces its loss for the log (--no-log: goes straight to the end;
                      --no-destroy: and returns from main without ddp_destroy; --fail-at-end:
                      rank 0 then fails a DDP_CHECK, saving to a folder that does not exist)
     eval         12  evaluates --samples samples spread by the distributed sampler: counted
                      naively, and without ddp_sampler_padding
     freeze       13  "freezes" fc1 by clearing its hooks, so DDP never hears of its gradient
                      (--find-unused: with ddp_wrap_desc.find_unused_parameters)
     accum        14  --k micro-batches per optimizer step; --sync every (no no_sync), last
                      (no_sync for the first k-1: right) or first (the off-by-one), or a comma-
                      separated list of them; prints the all-reduce count and whether the
                      replicas still hold the same weights
     speed        15  steps per epoch and the time of a step and of an epoch
   The data set is the bundled wine data (run from the repository's top folder). */
#define DDP_IMPLEMENTATION
#include "ddp.h"

typedef struct options {
    const char* scenario;
    const char* snapshot;
    const char* sync;
    int epochs, batch_size, k, samples, no_set_epoch, resume, find_unused, no_log, no_destroy, fail_at_end;
} options;

static void usage(void) {
    fprintf(stderr, "usage: confusions epochs|device_rank|gpu_message|barrier|uneven|eval|freeze|accum|speed [--epochs N]\n"
                    "       [--batch-size N] [--k N] [--sync every|last|first] [--samples N] [--snapshot FILE]\n"
                    "       [--no-set-epoch] [--resume] [--find-unused] [--no-log] [--no-destroy] [--fail-at-end]\n");
    exit(2);
}

static options parse(int argc, char** argv) {
    options o;
    int i;
    memset(&o, 0, sizeof o);
    o.snapshot = "confusions.safetensors";
    o.sync = "last";
    o.epochs = 3, o.batch_size = 16, o.k = 4, o.samples = 10;
    if (argc < 2) usage();
    o.scenario = argv[1];
    for (i = 2; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--no-set-epoch")) o.no_set_epoch = 1;
        else if (!strcmp(a, "--resume")) o.resume = 1;
        else if (!strcmp(a, "--find-unused")) o.find_unused = 1;
        else if (!strcmp(a, "--no-log")) o.no_log = 1;
        else if (!strcmp(a, "--no-destroy")) o.no_destroy = 1;
        else if (!strcmp(a, "--fail-at-end")) o.fail_at_end = 1;
        else if (i + 1 >= argc) usage();
        else if (!strcmp(a, "--epochs")) o.epochs = atoi(argv[++i]);
        else if (!strcmp(a, "--batch-size")) o.batch_size = atoi(argv[++i]);
        else if (!strcmp(a, "--k")) o.k = atoi(argv[++i]);
        else if (!strcmp(a, "--samples")) o.samples = atoi(argv[++i]);
        else if (!strcmp(a, "--sync")) o.sync = argv[++i];
        else if (!strcmp(a, "--snapshot")) o.snapshot = argv[++i];
        else usage();
    }
    if (o.epochs < 1 || o.batch_size < 1 || o.k < 1 || o.samples < 1) usage();
    return o;
}

/* What every scenario shares: the wine training set, a process group, a wrapped 13-64-3 MLP, Adam. */
typedef struct job {
    ddp_dataset all, data, test;
    ddp_pg* pg;
    ddp_model* model;
    ddp_wrapper* ddp;
    ddp_optim* optim;
    int rank, world;
} job;

static void job_start(job* j, const ddp_wrap_desc* wd) {
    ddp_desc desc;
    ddp_model_desc md;
    ddp_optim_desc od;
    int sizes[3];
    memset(&desc, 0, sizeof desc), memset(&md, 0, sizeof md), memset(&od, 0, sizeof od);
    DDP_CHECK(ddp_dataset_load("wine", NULL, &j->all));
    DDP_CHECK(ddp_dataset_split(&j->all, 0.2, 42, &j->data, &j->test));
    ddp_dataset_standardize(&j->data, &j->test);
    desc.device.type = DDP_DEVICE_CPU;
    DDP_CHECK(ddp_init(&desc, &j->pg));
    j->rank = ddp_rank(j->pg), j->world = ddp_world_size(j->pg);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 1;
    sizes[0] = j->data.nfeatures, sizes[1] = 64, sizes[2] = j->all.nclasses;
    DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &j->model));
    DDP_CHECK(ddp_wrap(j->pg, j->model, wd, &j->ddp));
    od.kind = DDP_ADAM;
    od.lr = 1e-2f;
    DDP_CHECK(ddp_optim_create(j->model, &od, &j->optim));
}

static void job_end(job* j) {
    ddp_optim_destroy(j->optim);
    ddp_wrapper_destroy(j->ddp);
    ddp_destroy(j->pg);
    ddp_model_destroy(j->model);
    ddp_dataset_free(&j->data), ddp_dataset_free(&j->test), ddp_dataset_free(&j->all);
}

/* One training step on a batch; returns its loss. */
static float step(job* j, const float* x, const int* y, int n) {
    float loss;
    DDP_CHECK(ddp_model_zero_grad(j->model));
    DDP_CHECK(ddp_model_forward(j->model, x, n));
    DDP_CHECK(ddp_loss_cross_entropy(j->model, y, &loss));
    DDP_CHECK(ddp_model_backward(j->model));
    DDP_CHECK(ddp_optim_step(j->optim));
    return loss;
}

/* 1 on every rank when every rank holds rank 0's weights bit for bit. */
static int replicas_identical(job* j) {
    int i;
    float differ = 0.f;
    for (i = 0; i < ddp_model_num_params(j->model); i++) {
        ddp_param* p = ddp_model_param(j->model, i);
        float* mine = (float*)malloc(p->count * sizeof(float));
        if (!mine) exit(1);
        memcpy(mine, p->data, p->count * sizeof(float));
        DDP_CHECK(ddp__broadcast(j->pg, mine, p->count, DDP_F32, 0, NULL));
        if (memcmp(mine, p->data, p->count * sizeof(float)) != 0) differ = 1.f;
        free(mine);
    }
    DDP_CHECK(ddp_all_reduce(j->pg, &differ, 1, DDP_F32, DDP_MAX, NULL));
    return differ == 0.f;
}

/* 3: ddp_sampler_set_epoch before every epoch, or not; and a resumed epoch. */
static int scenario_epochs(const options* o) {
    job j;
    ddp_sampler sampler;
    ddp_sampler_desc sd;
    ddp_loader loader;
    int epoch, resumed = 0;
    memset(&sd, 0, sizeof sd);
    job_start(&j, NULL);
    sd.pg = j.pg;
    sd.seed = 7;
    DDP_CHECK(ddp_sampler_init(&sampler, j.data.n, &sd));
    DDP_CHECK(ddp_loader_init(&loader, &j.data, &(ddp_loader_desc){.batch_size = o->batch_size}));
    for (epoch = 1; epoch <= o->epochs; epoch++) {
        const float* x;
        const int* y;
        int n, b = 0;
        if (!o->no_set_epoch) ddp_sampler_set_epoch(&sampler, epoch);
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        if (j.rank == 0)
            printf("epoch %d order: %d %d %d %d %d\n", epoch, loader.order[0], loader.order[1], loader.order[2],
                   loader.order[3], loader.order[4]);
        while ((n = ddp_loader_next(&loader, &x, &y)) > 0) {
            step(&j, x, y, n);
            if (o->resume && epoch == 2 && ++b == 2 && !resumed) {
                /* the job "dies" here and comes back: rank 0 saves, every rank loads, epoch 2 goes on */
                ddp_snapshot snap;
                memset(&snap, 0, sizeof snap);
                snap.model = j.model, snap.optim = j.optim, snap.sampler = &sampler, snap.loader = &loader;
                snap.epoch = epoch;
                if (j.rank == 0) DDP_CHECK(ddp_snapshot_save(&snap, o->snapshot));
                DDP_CHECK(ddp_barrier(j.pg));
                DDP_CHECK(ddp_snapshot_load(&snap, o->snapshot));
                if (j.rank == 0) printf("resumed epoch %d from %s\n", snap.epoch, o->snapshot);
                resumed = 1;
                epoch = snap.epoch - 1; /* the loop's ++ brings it back to the snapshot's epoch */
                break;
            }
        }
    }
    if (j.rank == 0) printf("replicas identical: %s\n", replicas_identical(&j) ? "yes" : "no");
    else replicas_identical(&j);
    ddp_loader_free(&loader);
    job_end(&j);
    return 0;
}

/* 4-5: torch.cuda.set_device(rank) in C. */
static int scenario_device_rank(void) {
    ddp_desc desc;
    ddp_pg* pg;
    const char* rank = getenv("RANK");
    memset(&desc, 0, sizeof desc);
    desc.device.type = DDP_DEVICE_CUDA;
    desc.device.index = rank ? atoi(rank) : 0; /* the mistake: RANK, where LOCAL_RANK belongs */
    DDP_CHECK(ddp_init(&desc, &pg));
    printf("rank %d on cuda:%d\n", ddp_rank(pg), ddp_pg_device(pg).index);
    ddp_destroy(pg);
    return 0;
}

/* 4-5: the message for cuda:N past the visible GPUs, built without a GPU. */
static int scenario_gpu_message(void) {
    ddp_status s = ddp__fail_gpu_index(3, 2);
    printf("%s: %s\n", ddp_status_name(s), ddp_error_string());
    s = ddp__fail_gpu_index(1, 1);
    printf("%s: %s\n", ddp_status_name(s), ddp_error_string());
    return 0;
}

/* 7: a collective inside if (rank == 0) at the very end: the others have left by then. */
static int scenario_barrier(void) {
    job j;
    int b;
    job_start(&j, NULL);
    for (b = 0; b < 3; b++) step(&j, j.data.x + (size_t)b * 16 * (size_t)j.data.nfeatures, j.data.y + b * 16, 16);
    if (j.rank == 0) {
        printf("rank 0: checkpoint saved; waiting for the others\n");
        fflush(stdout);
        DDP_CHECK(ddp_barrier(j.pg)); /* the mistake: only rank 0 gets here */
    }
    job_end(&j);
    return 0;
}

/* 8: each rank reads its own shard, and the shards differ by a batch. */
static int scenario_uneven(const options* o) {
    job j;
    int b, nb, *idx, i;
    float loss_sum = 0.f, *x;
    int* y;
    job_start(&j, NULL);
    nb = 4 + j.rank; /* rank 0: 4 batches, rank 1: 5, ... */
    idx = (int*)malloc(sizeof(int) * (size_t)o->batch_size);
    x = (float*)malloc(sizeof(float) * (size_t)o->batch_size * (size_t)j.data.nfeatures);
    y = (int*)malloc(sizeof(int) * (size_t)o->batch_size);
    if (!idx || !x || !y) return 1;
    if (nb * o->batch_size > j.data.n) {
        fprintf(stderr, "uneven: %d batches of %d need more than the %d samples\n", nb, o->batch_size, j.data.n);
        return 2;
    }
    printf("rank %d: %d batches in this rank's shard\n", j.rank, nb);
    fflush(stdout);
    for (b = 0; b < nb; b++) {
        for (i = 0; i < o->batch_size; i++) idx[i] = (b * o->batch_size + i + j.rank * 7) % j.data.n;
        ddp__dataset_gather(&j.data, idx, o->batch_size, x, y);
        loss_sum += step(&j, x, y, o->batch_size);
    }
    if (!o->no_log) { /* the usual log line: the mean loss over every rank */
        DDP_CHECK(ddp_all_reduce(j.pg, &loss_sum, 1, DDP_F32, DDP_SUM, NULL));
        if (j.rank == 0) printf("mean loss %.4f\n", loss_sum / (float)(j.world * nb));
    }
    free(idx), free(x), free(y);
    if (o->fail_at_end && j.rank == 0) { /* "saves a checkpoint" where it cannot */
        ddp_snapshot snap;
        memset(&snap, 0, sizeof snap);
        snap.model = j.model;
        DDP_CHECK(ddp_snapshot_save(&snap, "no-such-folder/snapshot.safetensors"));
    }
    if (o->no_destroy) return 0; /* main returns with the group open, as many programs do */
    job_end(&j);
    return 0;
}

/* 12: evaluation through the distributed sampler counts its padding twice. */
static int scenario_eval(const options* o) {
    ddp_desc desc;
    ddp_pg* pg;
    ddp_sampler s;
    ddp_sampler_desc sd;
    float counts[2];
    memset(&desc, 0, sizeof desc), memset(&sd, 0, sizeof sd);
    desc.device.type = DDP_DEVICE_CPU;
    DDP_CHECK(ddp_init(&desc, &pg));
    sd.pg = pg;
    sd.in_order = 1; /* evaluation keeps the data's order */
    DDP_CHECK(ddp_sampler_init(&s, o->samples, &sd));
    counts[0] = (float)s.num_samples;                           /* every index this rank was given */
    counts[1] = (float)(s.num_samples - ddp_sampler_padding(&s)); /* without the padded repeat */
    DDP_CHECK(ddp_all_reduce(pg, counts, 2, DDP_F32, DDP_SUM, NULL));
    if (ddp_rank(pg) == 0)
        printf("%d samples on %d ranks: counted naively %d, without ddp_sampler_padding %d\n", o->samples,
               ddp_world_size(pg), (int)counts[0], (int)counts[1]);
    ddp_destroy(pg);
    return 0;
}

/* 13: a layer "frozen" by clearing its hooks after ddp_wrap: its gradient never reaches DDP. */
static int scenario_freeze(const options* o) {
    job j;
    ddp_wrap_desc wd;
    int b;
    memset(&wd, 0, sizeof wd);
    wd.find_unused_parameters = o->find_unused;
    job_start(&j, &wd);
    ddp__param_clear_hooks(ddp_model_param(j.model, 0)); /* fc1.weight: "no hook, no sync" */
    for (b = 0; b < 3; b++) step(&j, j.data.x + (size_t)b * 16 * (size_t)j.data.nfeatures, j.data.y + b * 16, 16);
    if (j.rank == 0) printf("trained 3 steps with fc1.weight left out\n");
    job_end(&j);
    return 0;
}

/* 14: k micro-batches per optimizer step, with no_sync used right, not at all, or off by one. Each
   mode of the comma-separated --sync list trains its own freshly wrapped model. */
static int scenario_accum(const options* o) {
    job j;
    char modes[64], *mode, *save = NULL;
    job_start(&j, NULL);
    snprintf(modes, sizeof modes, "%s", o->sync);
    for (mode = strtok_r(modes, ",", &save); mode; mode = strtok_r(NULL, ",", &save)) {
        ddp_wrap_stats st;
        int s, m, steps = 3, micro = 8, same;
        if (strcmp(mode, "every") && strcmp(mode, "last") && strcmp(mode, "first")) usage();
        if (mode != modes) { /* a fresh model for each mode after the first */
            ddp_model_desc md;
            ddp_optim_desc od;
            int sizes[3];
            memset(&md, 0, sizeof md), memset(&od, 0, sizeof od);
            ddp_optim_destroy(j.optim), ddp_wrapper_destroy(j.ddp), ddp_model_destroy(j.model);
            md.device.type = DDP_DEVICE_CPU, md.seed = 1;
            sizes[0] = j.data.nfeatures, sizes[1] = 64, sizes[2] = j.all.nclasses;
            DDP_CHECK(ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &j.model));
            DDP_CHECK(ddp_wrap(j.pg, j.model, NULL, &j.ddp));
            od.kind = DDP_ADAM, od.lr = 1e-2f;
            DDP_CHECK(ddp_optim_create(j.model, &od, &j.optim));
        }
        for (s = 0; s < steps; s++) {
            DDP_CHECK(ddp_model_zero_grad(j.model));
            for (m = 0; m < o->k; m++) {
                int first = (((s * o->k + m) * j.world + j.rank) * micro) % (j.data.n - micro);
                float loss;
                if (!strcmp(mode, "last")) ddp_no_sync(j.ddp, m < o->k - 1);
                else if (!strcmp(mode, "first")) ddp_no_sync(j.ddp, m != 0); /* the off-by-one */
                DDP_CHECK(ddp_model_forward(j.model, j.data.x + (size_t)first * (size_t)j.data.nfeatures, micro));
                DDP_CHECK(ddp_loss_cross_entropy(j.model, j.data.y + first, &loss));
                DDP_CHECK(ddp_model_backward(j.model));
            }
            DDP_CHECK(ddp_optim_step(j.optim));
        }
        ddp_no_sync(j.ddp, 0);
        ddp_wrapper_stats(j.ddp, &st);
        same = replicas_identical(&j);
        if (j.rank == 0)
            printf("sync %s: %d optimizer steps of %d micro-batches: %ld all-reduces (%d bucket%s); replicas "
                   "identical: %s\n", mode, steps, o->k, st.all_reduces, st.buckets, st.buckets == 1 ? "" : "s",
                   same ? "yes" : "no");
        fflush(stdout);
    }
    job_end(&j);
    return 0;
}

/* 15: what one step and one epoch cost, for 1 rank or several. */
static int scenario_speed(const options* o) {
    job j;
    ddp_sampler sampler;
    ddp_sampler_desc sd;
    ddp_loader loader;
    int epoch, steps = 0;
    double t0;
    memset(&sd, 0, sizeof sd);
    job_start(&j, NULL);
    sd.pg = j.pg;
    DDP_CHECK(ddp_sampler_init(&sampler, j.data.n, &sd));
    DDP_CHECK(ddp_loader_init(&loader, &j.data, &(ddp_loader_desc){.batch_size = o->batch_size}));
    DDP_CHECK(ddp_barrier(j.pg));
    t0 = ddp__now();
    for (epoch = 1; epoch <= o->epochs; epoch++) {
        const float* x;
        const int* y;
        int n;
        ddp_sampler_set_epoch(&sampler, epoch);
        DDP_CHECK(ddp_loader_start(&loader, &sampler));
        while ((n = ddp_loader_next(&loader, &x, &y)) > 0) step(&j, x, y, n), steps++;
    }
    t0 = ddp__now() - t0;
    if (j.rank == 0)
        printf("%d rank%s: %d steps per epoch, %.3f ms per step, %.3f ms per epoch\n", j.world, j.world == 1 ? "" : "s",
               steps / o->epochs, 1e3 * t0 / steps, 1e3 * t0 / o->epochs);
    ddp_loader_free(&loader);
    job_end(&j);
    return 0;
}

int main(int argc, char** argv) {
    options o = parse(argc, argv);
    if (!strcmp(o.scenario, "epochs")) return scenario_epochs(&o);
    if (!strcmp(o.scenario, "device_rank")) return scenario_device_rank();
    if (!strcmp(o.scenario, "gpu_message")) return scenario_gpu_message();
    if (!strcmp(o.scenario, "barrier")) return scenario_barrier();
    if (!strcmp(o.scenario, "uneven")) return scenario_uneven(&o);
    if (!strcmp(o.scenario, "eval")) return scenario_eval(&o);
    if (!strcmp(o.scenario, "freeze")) return scenario_freeze(&o);
    if (!strcmp(o.scenario, "accum")) return scenario_accum(&o);
    if (!strcmp(o.scenario, "speed")) return scenario_speed(&o);
    usage();
    return 2;
}
