/* A training-step benchmark: the larger model of the performance reference.

   The MLP 1024 -> 4096 -> 4096 -> 1024 -> 10 (ReLU between the Linear layers; 25,185,290
   parameters, 96 MiB of gradients) on synthetic data, SGD lr 0.01, batch 64 per rank: the model
   PyTorch DDP's training-step figures in the project's performance reference ("PyTorch DDP
   training steps") were measured on, so the two compare directly. bench/pytorch_ddp_large.py is
   the same program in PyTorch; bench/large_model.sh runs both side by side.

   Each timed step is what a training loop does: zero_grad, forward, loss, backward (which, under
   DDP, ends by waiting for the last buckets' all-reduces), optimizer step. Every buffer is
   allocated before the first step and reused; a few warm-up steps touch it all before timing.
   Rank 0 prints the bucket map, the median step time, the median time backward waited for
   communication after its last layer (the communication overlap did not hide), that wait as a
   fraction of the step, and a machine-readable "result ..." line.

   Build and run (from the repository's top folder):
       make build/examples/ch08_large_mlp
       build/examples/ch08_large_mlp                          # 2 ranks, PyTorch's default buckets
       OPENBLAS_NUM_THREADS=1 build/examples/ch08_large_mlp --nproc 1   # the 1-process baseline
       build/examples/ch08_large_mlp --one-bucket             # all 96 MiB in one all-reduce
       build/examples/ch08_large_mlp --view                   # gradient_as_bucket_view
       build/examples/ch08_large_mlp --adam --zero-stage 1    # Adam's state sharded (ZeRO-1)
       build/examples/ch08_large_mlp --adam --zero-stage 3    # and the gradients and weights (ZeRO-3)
   Options: --nproc N (1: one process without ddp_init/ddp_wrap)  --steps N  --warmup N
            --bucket-cap-mb X (0: every parameter its own bucket)  --first-bucket-mb X
            --one-bucket  --view  --adam (Adam instead of SGD: two moments of state per parameter)
            --zero-stage 0-3 (1: each rank keeps the optimizer state of its shard only; 2: and the
              gradients; 3: and the weights)  --prefetch (zero_stage 3: the next layer's gather
              overlaps this one's work)
            --device cpu|cuda|cuda:N|auto */
#define DDP_IMPLEMENTATION
#include "ddp.h"

#define NBATCHES 4   /* a fixed set of synthetic batches, generated once and reused */
#define MAX_STEPS 10000

typedef struct options {
    int nproc, steps, warmup, one_bucket, view, adam, zero_stage, prefetch;
    double bucket_cap_mb, first_bucket_mb;
    const char* device;
} options;

static void usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--nproc N] [--steps N] [--warmup N] [--bucket-cap-mb X] [--first-bucket-mb X]\n"
            "          [--one-bucket] [--view] [--adam] [--zero-stage 0-3] [--prefetch]\n"
            "          [--device cpu|cuda|cuda:N|auto]\n",
            prog);
    exit(2);
}

static options parse_args(int argc, char** argv) {
    options o = {.nproc = 2, .steps = 20, .warmup = 3, .bucket_cap_mb = 25, .first_bucket_mb = 1, .device = "cpu"};
    int i;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(argv[0]);
        if (!strcmp(a, "--one-bucket")) { o.one_bucket = 1; continue; }
        if (!strcmp(a, "--view")) { o.view = 1; continue; }
        if (!strcmp(a, "--adam")) { o.adam = 1; continue; }
        if (!strcmp(a, "--prefetch")) { o.prefetch = 1; continue; }
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            usage(argv[0]);
        }
        i++;
        if (!strcmp(a, "--nproc")) o.nproc = atoi(v);
        else if (!strcmp(a, "--steps")) o.steps = atoi(v);
        else if (!strcmp(a, "--warmup")) o.warmup = atoi(v);
        else if (!strcmp(a, "--bucket-cap-mb")) o.bucket_cap_mb = atof(v);
        else if (!strcmp(a, "--first-bucket-mb")) o.first_bucket_mb = atof(v);
        else if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--zero-stage")) o.zero_stage = atoi(v);
        else {
            fprintf(stderr, "unknown option %s\n", a);
            usage(argv[0]);
        }
    }
    if (o.nproc < 1 || o.steps < 1 || o.steps > MAX_STEPS || o.warmup < 0 || o.bucket_cap_mb < 0 ||
        o.first_bucket_mb < 0 || o.zero_stage < 0 || o.zero_stage > 3) {
        fprintf(stderr, "--nproc and --steps (<= %d) must be >= 1, --warmup, --bucket-cap-mb and "
                "--first-bucket-mb >= 0, --zero-stage 0 to 3\n", MAX_STEPS);
        exit(2);
    }
    return o;
}

/* Megabytes (MiB, as PyTorch's bucket_cap_mb) to bytes. ddp_wrap reads 0 as "the default", so a
   requested 0 becomes 1 byte: every parameter closes its bucket, PyTorch's bucket_cap_mb=0. */
static size_t mib_to_bytes(double mb) {
    double b = mb * 1048576.0;
    if (b >= (double)SIZE_MAX / 2) return SIZE_MAX / 2;
    return b < 1 ? 1 : (size_t)b;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v). */
static double median(double* v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Per timed step, one row each: step, forward (+ loss), backward (+ DDP's wait and copy-back),
   optimizer, and the DDP wait alone; in milliseconds. */
enum { T_STEP, T_FWD, T_BWD, T_OPT, T_WAIT, T_COUNT };
static const char* const t_names[T_COUNT] = {"step", "forward+loss", "backward (incl. wait)", "optimizer", "wait"};

static int run(int rank, void* arg) {
    const options* opt = (const options*)arg;
    const int sizes[5] = {1024, 4096, 4096, 1024, 10};
    const int batch = 64, in = sizes[0], classes = sizes[4];
    const int distributed = opt->nproc > 1;
    ddp_pg* pg = NULL;
    ddp_wrapper* ddp = NULL;
    ddp_model* model;
    ddp_optim* optim;
    ddp_device device;
    ddp_wrap_stats st = {0};
    float *x, loss = 0;
    int *y, i, k, world = 1;
    double* times; /* [T_COUNT][steps], then the medians */
    double med[T_COUNT];
    uint64_t sent0 = 0, received; /* bytes this rank had sent when the steps began */
    char devname[32];

    /* 1. Join the job (not for the 1-process baseline: no process group, no wrapper). */
    {
        ddp_device want;
        DDP_CHECK(ddp_device_parse(opt->device, &want));
        if (distributed) {
            ddp_desc dd = {0};
            dd.device = want;
            DDP_CHECK(ddp_init(&dd, &pg));
            device = ddp_pg_device(pg);
            rank = ddp_rank(pg), world = ddp_world_size(pg);
        } else {
            DDP_CHECK(ddp_device_resolve(want, &device));
        }
    }

    /* 2. Model, wrapper, optimizer. */
    {
        ddp_model_desc md = {.device = {.type = DDP_DEVICE_AUTO}};
        ddp_optim_desc od = {.kind = DDP_SGD};
        if (opt->adam) od.kind = DDP_ADAM;
        md.device = device;
        md.seed = 1;
        od.lr = 0.01f;
        DDP_CHECK(ddp_model_mlp(&md, sizes, 5, DDP_LAYER_RELU, &model));
        if (distributed) {
            ddp_wrap_desc wd = {0};
            wd.bucket_cap_bytes = opt->one_bucket ? SIZE_MAX / 2 : mib_to_bytes(opt->bucket_cap_mb);
            wd.first_bucket_bytes = opt->one_bucket ? SIZE_MAX / 2 : mib_to_bytes(opt->first_bucket_mb);
            wd.gradient_as_bucket_view = opt->view;
            wd.zero_stage = opt->zero_stage;
            wd.prefetch = opt->prefetch;
            DDP_CHECK(ddp_wrap(pg, model, &wd, &ddp));
        }
        DDP_CHECK(ddp_optim_create(model, &od, &optim));
    }

    /* 3. Data and timing arrays: allocated once, before the first step. Each rank draws its own
       samples (seed 1000 + rank): inputs uniform in [-1, 1), labels 0..9. */
    x = (float*)malloc((size_t)NBATCHES * batch * in * sizeof *x);
    y = (int*)malloc((size_t)NBATCHES * batch * sizeof *y);
    times = (double*)calloc((size_t)T_COUNT * opt->steps, sizeof *times);
    if (!x || !y || !times) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    {
        ddp_rng g = ddp_rng_seed(1000 + (uint64_t)rank);
        size_t j;
        for (j = 0; j < (size_t)NBATCHES * batch * in; j++) x[j] = 2.f * ddp_rng_uniform(&g) - 1.f;
        for (j = 0; j < (size_t)NBATCHES * batch; j++) y[j] = (int)ddp_rng_below(&g, (uint32_t)classes);
    }

    if (rank == 0) {
        size_t n = ddp_model_num_elements(model);
        printf("model: MLP 1024 -> 4096 -> 4096 -> 1024 -> 10, %zu parameters (%.2f MiB of gradients), "
               "%s lr 0.01, batch %d per rank\n", n, n * 4.0 / 1048576.0, opt->adam ? "Adam" : "SGD", batch);
        printf("setup: %d process%s on %s", world, world == 1 ? " (no process group, no wrapper)" : "es",
               ddp_device_name(device, devname, sizeof devname));
#if defined(DDP_CBLAS) && defined(OPENBLAS_VERSION)
        printf(", OpenBLAS with %d thread%s per rank", openblas_get_num_threads(),
               openblas_get_num_threads() == 1 ? "" : "s");
#endif
        printf("; %d warm-up + %d timed steps\n", opt->warmup, opt->steps);
        if (distributed) {
            ddp_wrapper_stats(ddp, &st);
            if (st.buckets == 0) printf("buckets: none, each layer's gradients are reduce-scattered as one\n");
            else printf("buckets: %d%s (reduced in this order):", st.buckets, opt->view ? ", gradient_as_bucket_view" : "");
            for (k = 0; k < st.buckets && k < 64; k++)
                printf(" %.2f MiB (%d params)%s", st.bucket_bytes[k] / 1048576.0, st.bucket_params[k],
                       k + 1 < st.buckets ? "," : "\n");
            printf("optimizer state on rank 0: %.2f MiB (zero_stage %d)\n", st.optim_state_bytes / 1048576.0,
                   opt->zero_stage);
        }
        fflush(stdout);
    }

    /* 4. Train. Nothing in this loop allocates. */
    if (distributed) ddp_pg_bytes(pg, &sent0, &received); /* what ddp_wrap sent is not a step's */
    for (i = 0; i < opt->warmup + opt->steps; i++) {
        const float* xb = x + (size_t)(i % NBATCHES) * batch * in;
        const int* yb = y + (size_t)(i % NBATCHES) * batch;
        ddp_stream* s = ddp_model_stream(model); /* NULL on the CPU; on a GPU, time finished work */
        double t0, t1, t2, t3, wait0 = 0;
        if (distributed) ddp_wrapper_stats(ddp, &st), wait0 = st.wait_s;
        t0 = now_s();
        DDP_CHECK(ddp_model_zero_grad(model));
        DDP_CHECK(ddp_model_forward(model, xb, batch));
        DDP_CHECK(ddp_loss_cross_entropy(model, yb, &loss));
        DDP_CHECK(ddp_stream_sync(s));
        t1 = now_s();
        DDP_CHECK(ddp_model_backward(model));
        DDP_CHECK(ddp_stream_sync(s));
        t2 = now_s();
        DDP_CHECK(ddp_optim_step(optim));
        DDP_CHECK(ddp_stream_sync(s));
        t3 = now_s();
        if (i >= opt->warmup) {
            int j = i - opt->warmup;
            times[T_STEP * opt->steps + j] = (t3 - t0) * 1e3;
            times[T_FWD * opt->steps + j] = (t1 - t0) * 1e3;
            times[T_BWD * opt->steps + j] = (t2 - t1) * 1e3;
            times[T_OPT * opt->steps + j] = (t3 - t2) * 1e3;
            if (distributed) ddp_wrapper_stats(ddp, &st), times[T_WAIT * opt->steps + j] = (st.wait_s - wait0) * 1e3;
        }
    }

    /* 5. Report the medians of rank 0's steps (the all-reduce in every step keeps the ranks in
       lock step, so rank 0's times are the job's). */
    for (k = 0; k < T_COUNT; k++) med[k] = median(times + (size_t)k * opt->steps, opt->steps);
    if (rank == 0) {
        printf("median over %d steps (ms):", opt->steps);
        for (k = 0; k < T_COUNT; k++)
            if (distributed || k != T_WAIT) printf("  %s %.1f", t_names[k], med[k]);
        printf("\nexposed communication: %.1f ms of a %.1f ms step (%.2f); last loss %.4f\n", med[T_WAIT],
               med[T_STEP], med[T_WAIT] / med[T_STEP], loss);
        if (distributed) { /* what one rank holds of the training state, and what it sent */
            uint64_t sent;
            ddp_pg_bytes(pg, &sent, &received);
            printf("rank 0 holds: weights %.2f MiB (%.2f at most, while layers are gathered), gradients %.2f MiB, "
                   "optimizer state %.2f MiB; sent %.2f MiB per step (zero_stage %d)\n", st.param_bytes / 1048576.0,
                   st.param_peak_bytes / 1048576.0, st.grad_bytes / 1048576.0, st.optim_state_bytes / 1048576.0,
                   (sent - sent0) / 1048576.0 / (opt->warmup + opt->steps), opt->zero_stage);
        }
        printf("result nproc=%d buckets=%d view=%d step_ms=%.2f wait_ms=%.2f exposed=%.3f fwd_ms=%.2f bwd_ms=%.2f "
               "opt_ms=%.2f zero_stage=%d optim_state_mib=%.2f state_mib=%.2f\n", world, distributed ? st.buckets : 0,
               opt->view, med[T_STEP], med[T_WAIT], med[T_WAIT] / med[T_STEP], med[T_FWD], med[T_BWD], med[T_OPT],
               opt->zero_stage, distributed ? st.optim_state_bytes / 1048576.0 : 0.0,
               distributed ? (st.param_peak_bytes + st.grad_bytes + st.optim_state_bytes) / 1048576.0 : 0.0);
        fflush(stdout);
    }

    free(times), free(x), free(y);
    ddp_optim_destroy(optim);
    ddp_wrapper_destroy(ddp);
    ddp_model_destroy(model);
    ddp_destroy(pg);
    return 0;
}

int main(int argc, char** argv) {
    options opt = parse_args(argc, argv);
    if (opt.nproc == 1) return run(0, &opt); /* the baseline: this process alone */
    return ddp_spawn(opt.nproc, run, &opt) == DDP_OK ? 0 : 1;
}
