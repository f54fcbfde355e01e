/* DDP proper, with real processes and sockets (CPU backend). The central test: N ranks with
   batch B/N each train the same weights as one process with batch B, whatever the bucket sizes,
   with bit-identical weights on every rank. Also: no_sync accumulation, f16/bf16 compression
   within a bound derived from the rounding, the bucket map, unused parameters, mismatched models,
   and overlap proved by the order of the recorded timeline under a simulated slow network.
   With --gpu (the GPU stand-in's section of make test, or a real machine with one GPU per rank),
   the equivalence cases run with every rank's model on its own GPU and the default backend there,
   NCCL, against the same one-process CPU reference. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

enum { FEAT = 6, CLASSES = 3, STEPS = 50, GLOBAL_B = 12 };
static const int g_sizes[4] = {FEAT, 10, 8, CLASSES}; /* 3 Linear layers, 6 parameters */
static char g_dir[64];
static int g_gpu;  /* --gpu: each rank's model on its GPU */
static int g_gpus; /* --gpu: how many there are (NCCL needs one per rank) */

/* The global batch of step s: GLOBAL_B rows, the same on every rank and in the reference. */
static void global_batch(int step, float* x, int* y) {
    ddp_rng r = ddp_rng_seed(1000 + (uint64_t)step);
    int i;
    for (i = 0; i < GLOBAL_B * FEAT; i++) x[i] = 2.f * ddp_rng_uniform(&r) - 1.f;
    for (i = 0; i < GLOBAL_B; i++) y[i] = (int)ddp_rng_below(&r, CLASSES);
}

static ddp_model* model_on(ddp_device dev, uint64_t seed) {
    ddp_model_desc md;
    ddp_model* m = NULL;
    memset(&md, 0, sizeof md);
    md.device = dev;
    md.seed = seed;
    if (ddp_model_mlp(&md, g_sizes, 4, DDP_LAYER_RELU, &m) != DDP_OK) return NULL;
    return m;
}
static ddp_model* cpu_model(uint64_t seed) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    return model_on(cpu, seed);
}

/* A parameter's values or gradient in host memory (a copy ordered after the model's stream). */
static void host_copy(ddp_model* m, ddp_param* p, const float* src, float* dst) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    ddp_copy(cpu, dst, ddp__model_device(m), src, p->count * 4, ddp_model_stream(m));
    ddp_stream_sync(ddp_model_stream(m));
}

static ddp_optim* optimizer(ddp_model* m, int adam, float lr, float momentum) {
    ddp_optim_desc od;
    ddp_optim* o = NULL;
    memset(&od, 0, sizeof od);
    od.kind = adam ? DDP_ADAM : DDP_SGD;
    od.lr = lr;
    od.momentum = adam ? 0.f : momentum;
    ddp_optim_create(m, &od, &o);
    return o;
}
static ddp_optim* sgd(ddp_model* m, float lr, float momentum) { return optimizer(m, 0, lr, momentum); }

static void save_params(ddp_model* m, const char* path) {
    FILE* f = fopen(path, "wb");
    int i;
    if (!f) return;
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        float* host = (float*)malloc(p->count * 4);
        host_copy(m, p, p->data, host);
        fwrite(host, 4, p->count, f);
        free(host);
    }
    fclose(f);
}

/* One configuration of the run. */
typedef struct cfg {
    size_t cap, first;  /* bucket caps in bytes (0: defaults) */
    int view;           /* gradient_as_bucket_view */
    ddp_dtype compress;
    int accum;          /* micro-batches per step under no_sync (0 or 1: none) */
    float lr, momentum;
    int adam;           /* Adam instead of SGD */
    int zero;           /* ddp_wrap_desc.zero_stage */
    int prefetch;       /* ddp_wrap_desc.prefetch (zero_stage 3) */
    int from, to;       /* train steps [from, to) (to 0: STEPS) */
    const char* load;   /* a snapshot (model and optimizer) to resume from before step `from` */
    int load_model_only; /* ... leaving the optimizer's state out of the load */
    const char* save;   /* where rank 0 writes the snapshot after step `to` (consolidated first) */
} cfg;

/* Per rank: wrap a model seeded differently from rank 0's (the broadcast must fix that), train
   STEPS steps on this rank's share of each global batch, save the weights. Also records the sum
   over steps of the largest local gradient element, for the compression bound. */
static double g_grad_max_step;
static void track_max(ddp_param* p, void* user) {
    size_t i;
    float* g = (float*)malloc(p->count * 4);
    host_copy((ddp_model*)user, p, p->grad, g);
    for (i = 0; i < p->count; i++)
        if (fabs(g[i]) > g_grad_max_step) g_grad_max_step = fabs(g[i]);
    free(g);
}
/* The numbers rank r owns of a group of n: [r S, (r+1) S) cut at n, S = ceil(n / W). */
static size_t owned(size_t n, int W, int r) {
    size_t S = (n + (size_t)W - 1) / (size_t)W, lo = S * (size_t)r;
    return lo >= n ? 0 : n - lo < S ? n - lo : S;
}
/* The optimizer state a rank holds: all of it (DDP); its shard's of the whole model laid end to end
   (ZeRO-1); its shard's of each layer, weight and bias end to end (ZeRO-2 and -3). */
static int check_state_bytes(int rank, int W, const cfg* c, ddp_wrapper* w, size_t n) {
    size_t per = c->adam ? 2 : (c->momentum != 0.f), want = 0;
    int l;
    ddp_wrap_stats st;
    if (c->zero == 0) want = n;
    else if (c->zero == 1) want = owned(n, W, rank);
    else
        for (l = 0; l + 1 < 4; l++) want += owned((size_t)g_sizes[l] * g_sizes[l + 1] + g_sizes[l + 1], W, rank);
    want *= per * 4;
    ddp_wrapper_stats(w, &st);
    if (st.optim_state_bytes != want) {
        printf("    rank %d: %zu bytes of optimizer state, expected %zu (zero_stage %d)\n", rank, st.optim_state_bytes,
               want, c->zero);
        return 1;
    }
    return 0;
}
/* ZeRO-3's weights: a rank holds its shard of each layer (S numbers) and, while a layer is in use,
   the whole layer (W S); with prefetch also the next one (forward) or the previous one (backward).
   The most it held at once must be exactly the shards and the largest layer (the largest pair of
   neighbours with prefetch): more means a layer was not dropped. Between steps it holds the shards
   and the buffers gathered layers go into: one the size of the largest layer, or with prefetch one
   for the even layers and one for the odd, each the size of its largest. Gradients (stages 2-3):
   the shards, and the even and the odd buffer (a layer's gradients are computed while the previous
   layer's are reduce-scattered); under no_sync the layers that found their buffer taken had one
   of their own until the synchronised pass, and gave it back. */
static int check_zero3_memory(int rank, int W, const cfg* c, ddp_wrapper* w) {
    size_t shards = 0, largest = 0, pair = 0, prev = 0, model = 0, parity[2] = {0, 0}, peak, between, grads;
    int l;
    ddp_wrap_stats st;
    for (l = 0; l + 1 < 4; l++) {
        size_t n = (size_t)g_sizes[l] * g_sizes[l + 1] + g_sizes[l + 1], S = (n + (size_t)W - 1) / (size_t)W;
        shards += S, model += n;
        if (W * S > largest) largest = W * S;
        if (W * S > parity[l % 2]) parity[l % 2] = W * S;
        if (l > 0 && prev + W * S > pair) pair = prev + W * S;
        prev = W * S;
    }
    peak = 4 * (shards + (c->prefetch ? pair : largest));
    between = 4 * (shards + (c->prefetch ? parity[0] + parity[1] : largest));
    grads = 4 * (shards + parity[0] + parity[1]);
    ddp_wrapper_stats(w, &st);
    if (rank == 0 && W == 4 && !c->load)
        printf("    ZeRO-3 on 4 ranks%s: weights held at most %zu bytes at once (the model: %zu; the shards: %zu), "
               "%zu between steps; gradients %zu\n", c->prefetch ? ", prefetch" : "", st.param_peak_bytes, 4 * model,
               4 * shards, st.param_bytes, st.grad_bytes);
    if (st.param_peak_bytes != peak || st.param_bytes != between || st.grad_bytes != grads) {
        printf("    rank %d (W=%d%s): ZeRO-3 held %zu bytes of weights at most, %zu between steps and %zu of gradients; "
               "expected %zu, %zu and %zu\n", rank, W, c->prefetch ? ", prefetch" : "", st.param_peak_bytes,
               st.param_bytes, st.grad_bytes, peak, between, grads);
        return 1;
    }
    return 0;
}

static int train_rank(int rank, void* arg) {
    const cfg* c = (const cfg*)arg;
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_optim* o;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    float x[GLOBAL_B * FEAT], loss;
    int y[GLOBAL_B], step, W, per, k, accum = c->accum > 1 ? c->accum : 1;
    double grad_sum = 0;
    char path[128];
    memset(&d, 0, sizeof d);
    d.device.type = g_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU; /* "cuda": this rank's GPU */
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) {
        printf("    rank %d: ddp_init: %s\n", rank, ddp_error_string());
        return 10;
    }
    W = ddp_world_size(pg);
    m = model_on(ddp_pg_device(pg), 100 + (uint64_t)rank * 17);
    if (!m) return 11;
    if (c->compress)
        for (k = 0; k < ddp_model_num_params(m); k++) ddp_param_add_hook(ddp_model_param(m, k), track_max, m);
    memset(&wd, 0, sizeof wd);
    wd.bucket_cap_bytes = c->cap, wd.first_bucket_bytes = c->first, wd.gradient_as_bucket_view = c->view;
    wd.compress = c->compress;
    wd.zero_stage = c->zero, wd.prefetch = c->prefetch;
    if (ddp_wrap(pg, m, &wd, &w) != DDP_OK) {
        printf("    rank %d: ddp_wrap: %s\n", rank, ddp_error_string());
        return 12;
    }
    o = optimizer(m, c->adam, c->lr / (float)accum, c->momentum);
    if (!o) {
        printf("    rank %d: ddp_optim_create: %s\n", rank, ddp_error_string());
        return 17;
    }
    if (check_state_bytes(rank, W, c, w, ddp_model_num_elements(m))) return 18;
    if (c->load) {
        ddp_snapshot snap;
        memset(&snap, 0, sizeof snap);
        snap.model = m, snap.optim = c->load_model_only ? NULL : o;
        if (ddp_snapshot_load(&snap, c->load) != DDP_OK) {
            printf("    rank %d: ddp_snapshot_load: %s\n", rank, ddp_error_string());
            return 19;
        }
    }
    per = GLOBAL_B / (W * accum); /* rows per rank per micro-batch */
    for (step = c->from; step < (c->to ? c->to : STEPS); step++) {
        global_batch(step, x, y);
        if (ddp_model_zero_grad(m) != DDP_OK) return 13;
        g_grad_max_step = 0;
        for (k = 0; k < accum; k++) {
            /* micro-batch k of rank r: rows (k*W + r)*per ... so that together they cover the batch */
            int row = (k * W + ddp_rank(pg)) * per;
            ddp_no_sync(w, k < accum - 1); /* only the last micro-batch all-reduces */
            if (ddp_model_forward(m, x + (size_t)row * FEAT, per) != DDP_OK ||
                ddp_loss_cross_entropy(m, y + row, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK) {
                printf("    rank %d step %d: %s\n", rank, step, ddp_error_string());
                return 14;
            }
        }
        grad_sum += g_grad_max_step;
        if (ddp_optim_step(o) != DDP_OK) {
            printf("    rank %d step %d: %s\n", rank, step, ddp_error_string());
            return 15;
        }
    }
    {
        ddp_wrap_stats st;
        ddp_wrapper_stats(w, &st);
        long steps = (c->to ? c->to : STEPS) - c->from;
        if (st.steps != steps || st.all_reduces != steps * st.buckets) {
            printf("    rank %d: %ld synchronised steps and %ld all-reduces for %d buckets, expected %ld and %ld\n",
                   rank, st.steps, st.all_reduces, st.buckets, steps, steps * st.buckets);
            return 16;
        }
    }
    if (c->save) {
        ddp_snapshot snap;
        memset(&snap, 0, sizeof snap);
        snap.model = m, snap.optim = o, snap.step = c->to;
        if (ddp_optim_consolidate(o, 0) != DDP_OK || (rank == 0 && ddp_snapshot_save(&snap, c->save) != DDP_OK)) {
            printf("    rank %d: consolidating and saving: %s\n", rank, ddp_error_string());
            return 20;
        }
    }
    if (c->zero == 3 && check_zero3_memory(rank, W, c, w)) return 21;
    snprintf(path, sizeof path, "%s/w%d.bin", g_dir, rank);
    if (ddp_full_params(w, 1) != DDP_OK) return 22; /* zero_stage 3: the weights are sharded until then */
    save_params(m, path);
    if (ddp_full_params(w, 0) != DDP_OK) return 23;
    snprintf(path, sizeof path, "%s/g%d.txt", g_dir, rank);
    {
        FILE* f = fopen(path, "w");
        if (f) fprintf(f, "%.17g\n", grad_sum), fclose(f);
    }
    ddp_wrapper_destroy(w);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}

/* The same training in one process on the whole global batch. */
static size_t reference(const cfg* c, float* out, size_t cap) {
    ddp_model* m = cpu_model(100);
    ddp_optim* o = optimizer(m, c->adam, c->lr, c->momentum);
    float x[GLOBAL_B * FEAT], loss;
    int y[GLOBAL_B], step, i;
    size_t n = 0;
    for (step = 0; step < STEPS; step++) {
        global_batch(step, x, y);
        ddp_model_zero_grad(m);
        ddp_model_forward(m, x, GLOBAL_B);
        ddp_loss_cross_entropy(m, y, &loss);
        ddp_model_backward(m);
        ddp_optim_step(o);
    }
    for (i = 0; i < ddp_model_num_params(m) && n < cap; i++) {
        memcpy(out + n, ddp_model_param(m, i)->data, ddp_model_param(m, i)->count * 4);
        n += ddp_model_param(m, i)->count;
    }
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return n;
}

/* Run W ranks with configuration c and compare with the reference. tol < 0: the compression
   bound is derived from the gradients the ranks saw. Returns the relative L2 error. */
static double equivalence(int W, const cfg* c, double tol) {
    float ref[2048], got[2048], first[2048];
    size_t n, k;
    double num = 0, den = 0, maxabs = 0, grad_bound = 0, rel;
    char path[128];
    int r;
    if (g_gpu && W > g_gpus) {
        printf("    W=%d not run: NCCL needs a GPU for each rank, and this machine shows %d\n", W, g_gpus);
        return 0;
    }
    n = reference(c, ref, 2048);
    CHECK_OK(ddp_spawn(W, train_rank, (void*)c));
    for (r = 0; r < W; r++) {
        FILE* f;
        double gs = 0;
        snprintf(path, sizeof path, "%s/w%d.bin", g_dir, r);
        CHECKF(h_load_floats(path, r == 0 ? first : got, 2048) == n, "rank %d saved no weights", r);
        if (r > 0) CHECKF(memcmp(first, got, n * 4) == 0, "rank %d's weights differ from rank 0's", r);
        snprintf(path, sizeof path, "%s/g%d.txt", g_dir, r);
        f = fopen(path, "r");
        if (f && fscanf(f, "%lf", &gs) == 1 && gs > grad_bound) grad_bound = gs;
        if (f) fclose(f);
    }
    for (k = 0; k < n; k++) {
        double e = (double)first[k] - ref[k];
        num += e * e, den += (double)ref[k] * ref[k];
        if (fabs(e) > maxabs) maxabs = fabs(e);
    }
    rel = sqrt(num / den);
    if (tol >= 0) {
        CHECKF(rel <= tol,
               "W=%d cap=%zu view=%d accum=%d %s zero_stage=%d: weights differ from one process by %.3g relative "
               "(limit %g)", W, c->cap, c->view, c->accum, c->adam ? "Adam" : "SGD", c->zero, rel, tol);
    } else {
        /* Each step, every rank's contribution g/W is rounded to 16 bits once (relative error u),
           and the ring adds W of them in 16 bits (W-1 more roundings, each at most u of a partial
           sum bounded by the largest |g|): per element at most (W+1) u max|g| per step. SGD
           moves the weights by lr times that, and over the run the differences add up; a factor
           2 leaves room for the drift that different weights cause in later gradients. */
        double u = c->compress == DDP_F16 ? 0x1p-11 : 0x1p-8;
        double bound = 2.0 * c->lr * (W + 1) * u * grad_bound;
        printf("    %s W=%d: max |weight error| %.3g, bound 2 lr (W+1) u sum_steps max|g| = %.3g\n",
               ddp__dtype_name(c->compress), W, maxabs, bound);
        CHECKF(maxabs <= bound, "compressed weights differ by %.3g, more than the bound %.3g", maxabs, bound);
    }
    return rel;
}

static cfg base(void) {
    cfg c;
    memset(&c, 0, sizeof c);
    c.lr = 0.1f;
    c.momentum = 0.9f;
    return c;
}

static void equivalence_all_worlds_and_buckets(void) {
    const size_t caps[3] = {1, 256, 0}; /* one parameter per bucket; a few per bucket; one bucket */
    int W, ci, view, runs = 0;
    double worst = 0;
    for (W = 1; W <= 4; W++)
        for (ci = 0; ci < 3; ci++)
            for (view = 0; view < 2; view++) {
                cfg c = base();
                double e;
                if (g_gpu && W == 2) continue; /* on GPUs: 1, 3 and 4 ranks (2 takes no NCCL path of its own) */
                c.cap = c.first = caps[ci];
                c.view = view;
                e = equivalence(W, &c, g_gpu ? 1e-4 : 1e-5);
                if (e > worst) worst = e;
                runs += !(g_gpu && W > g_gpus); /* equivalence() skips it otherwise */
            }
    printf("    worst relative L2 difference from one process over %d runs: %.3g\n", runs, worst);
}

/* The reducer's division by W rides in the CPU backend's first pass over each bucket (premul):
   shared memory multiplies as it fills its slots (two ranks, three or more, and the one-step path),
   TCP multiplies the bucket once before the exchange, doubling or the ring. Applied twice, or not
   at all, on any of them, the weights would be off by a factor of W in their updates. Without the
   view the all-reduce also reads and writes each p->grad itself (ddp_work.tensors; test_pg's
   fused_tensors checks the mechanism): a gradient missed, or an average not written back, shows
   here as weights that drift from one process's. */
static void equivalence_every_transport_path(void) {
    static const struct { const char *transport, *algo, *one_step; int W; } paths[] = {
        {"shm", NULL, NULL, 2},  {"shm", NULL, NULL, 3},  {"shm", NULL, "65536", 3},
        {"tcp", NULL, NULL, 2},  {"tcp", "doubling", NULL, 3}, {"tcp", "ring", NULL, 3}};
    size_t i;
    int view;
    double worst = 0;
    if (g_gpu) SKIP("the GPU's reducer divides with a kernel, not in the CPU backend (premul is CPU only)");
    for (i = 0; i < sizeof paths / sizeof paths[0]; i++)
        for (view = 0; view < 2; view++) {
            cfg c = base();
            double e;
            c.cap = c.first = 256;
            c.view = view;
            setenv("DDP_TRANSPORT", paths[i].transport, 1);
            if (paths[i].algo) setenv("DDP_ALGO", paths[i].algo, 1);
            if (paths[i].one_step) setenv("DDP_SHM_ONE_STEP_BYTES", paths[i].one_step, 1);
            e = equivalence(paths[i].W, &c, 1e-5);
            unsetenv("DDP_TRANSPORT"), unsetenv("DDP_ALGO"), unsetenv("DDP_SHM_ONE_STEP_BYTES");
            if (e > worst) worst = e;
        }
    printf("    worst relative L2 difference from one process over %d transport paths x 2 (view): %.3g\n",
           (int)(sizeof paths / sizeof paths[0]), worst);
}

static void equivalence_no_sync_accumulation(void) {
    cfg c = base();
    double e2, e3;
    c.accum = 3;
    c.momentum = 0;
    e2 = equivalence(2, &c, g_gpu ? 1e-4 : 1e-5); /* 2 ranks x 3 micro-batches of 2 = one step of 12 */
    c.accum = 2;
    e3 = equivalence(3, &c, g_gpu ? 1e-4 : 1e-5); /* 3 ranks x 2 micro-batches of 2 */
    printf("    no_sync: relative L2 difference %.3g (2 ranks x 3 micro-batches), %.3g (3 x 2)\n", e2, e3);
}

/* ZeRO-1: the optimizer state sharded over the ranks trains the same weights as one process, for
   SGD with momentum and Adam, bucket caps from one parameter to one bucket, and no_sync. Each
   rank holds 1/W of the state (train_rank checks the bytes). */
static void equivalence_zero(void) {
    const size_t caps[2] = {1, 0};
    int W, ci, adam, stage;
    double worst[4] = {0, 0, 0, 0}, e;
    int runs[4] = {0, 0, 0, 0};
    for (stage = 1; stage <= 3; stage++)
        for (W = 1; W <= 4; W++)
            for (adam = g_gpu || H_TSAN; adam < 2; adam++) /* on GPUs (the stand-in's NCCL), TSan: Adam only */
                for (ci = 0; ci < (stage == 2 ? 1 : 2); ci++) {
                    cfg c = base();
                    if (g_gpu && W == 2) continue; /* on GPUs: 1, 3 (uneven shards) and 4 ranks (CI minutes) */
                    c.zero = stage;
                    c.adam = adam;
                    if (adam) c.lr = 0.01f;
                    /* stages 2-3 go by layer, whatever the cap: stage 3 tries prefetch instead */
                    c.cap = c.first = caps[stage == 1 ? ci : 0];
                    c.prefetch = stage == 3 && ci == 1;
                    e = equivalence(W, &c, g_gpu ? 1e-4 : 1e-5);
                    if (e > worst[stage]) worst[stage] = e;
                    runs[stage] += !(g_gpu && W > g_gpus); /* equivalence() skips it otherwise */
                }
    for (stage = 1; stage <= 3; stage++) { /* no_sync: stages 2-3 keep the layers' gradients meanwhile */
        cfg c = base();
        c.zero = stage;
        c.accum = 3;
        c.momentum = 0;
        e = equivalence(2, &c, g_gpu ? 1e-4 : 1e-5);
        if (e > worst[stage]) worst[stage] = e;
        runs[stage] += !(g_gpu && 2 > g_gpus);
    }
    /* the all-gathers in pieces of 7 numbers: shards of 62 and 47 of the 185 cut unevenly */
    ddp__zero_piece = 7;
    for (W = 3; W <= 4; W++)
        for (stage = 1; stage <= 2; stage++) {
            cfg c = base();
            c.zero = stage;
            c.adam = 1;
            c.lr = 0.01f;
            e = equivalence(W, &c, g_gpu ? 1e-4 : 1e-5);
            if (e > worst[stage]) worst[stage] = e;
            runs[stage] += !(g_gpu && W > g_gpus);
        }
    ddp__zero_piece = (size_t)1 << 18;
    printf("    worst relative L2 difference from one process: ZeRO-1 %.3g, ZeRO-2 %.3g, ZeRO-3 %.3g (%d, %d and %d "
           "runs)\n", worst[1], worst[2], worst[3], runs[1], runs[2], runs[3]);
}

/* A ZeRO snapshot: N ranks train half the steps, consolidate the sharded state onto rank 0, which
   saves; M ranks (sharded the same way, another way, or plain DDP) load it and train the other
   half. The weights must be those of one process that trained every step without stopping: each
   resumed rank took its own part of the state (and at stage 3 of the weights) from the file, and a
   run without the optimizer's state (a fresh Adam) ends elsewhere, which the first check shows. */
static void zero_snapshot_resumes_on_other_worlds(void) {
    /* N, M, the writers' stage, the readers' */
    static const int runs[][4] = {{2, 3, 1, 1}, {4, 2, 1, 1}, {3, 1, 1, 1}, {2, 4, 1, 0}, {1, 2, 1, 1},
                                  {3, 2, 3, 2}, {2, 4, 2, 3}, {4, 1, 3, 0}, {2, 3, 0, 3}};
    char path[128];
    double worst = 0, e;
    size_t i;
    int adam;
    snprintf(path, sizeof path, "%s/zero.st", g_dir);
    for (adam = 0; adam < 2; adam++)
        for (i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            cfg c = base();
            int N = runs[i][0], M = runs[i][1];
            if (g_gpu && (N > g_gpus || M > g_gpus)) continue;
            if (!adam && i > 1 && i != 5) continue; /* SGD: two ZeRO-1 pairs and one across stages suffice */
            if ((g_gpu || H_TSAN) && (!adam || i < 5)) continue; /* on GPUs, TSan: the pairs across stages, Adam */
            c.adam = adam;
            if (adam) c.lr = 0.01f;
            c.zero = runs[i][2], c.to = STEPS / 2, c.save = path;
            CHECK_OK(ddp_spawn(N, train_rank, &c));
            c.zero = runs[i][3], c.from = STEPS / 2, c.to = 0, c.save = NULL, c.load = path;
            e = equivalence(M, &c, g_gpu ? 1e-4 : 1e-5);
            printf("    %s: zero_stage %d on %d rank%s, resumed with zero_stage %d on %d: %.3g relative from one "
                   "process\n", adam ? "Adam" : "SGD", runs[i][2], N, N > 1 ? "s" : "", runs[i][3], M, e);
            if (e > worst) worst = e;
            if (i == 0) { /* the same resume without the optimizer's state must miss */
                c.load_model_only = 1;
                e = equivalence(M, &c, 1e30);
                printf("    ... resumed without the optimizer's state: %.3g relative\n", e);
                CHECKF(e > 1e-3, "resuming without the optimizer's state ended %.3g from the uninterrupted run: the "
                       "test cannot tell a lost state from a kept one", e);
            }
        }
    printf("    worst relative L2 difference from one process: %.3g\n", worst);
}

/* Uneven inputs (Join): in epoch e rank r has g_join_batches[e][r] batches of its own. The ranks
   still training in a step average their gradients over the initial world size (PyTorch's
   default) or over themselves (divide_by_active_ranks); a rank out of batches calls ddp_join and
   answers with zeros; at each epoch's end every rank holds the weights and the optimizer state of
   the rank that trained longest (rank 0, then rank 1), so the second epoch starts even. */
enum { JOIN_W = 3, JOIN_B = 4, JOIN_EPOCHS = 2 };
static const int g_join_batches[JOIN_EPOCHS][JOIN_W] = {{10, 9, 7}, {7, 10, 9}};
static void join_batch(int rank, int step, float* x, int* y) {
    ddp_rng r = ddp_rng_seed(5000 + (uint64_t)rank * 100 + (uint64_t)step);
    int i;
    for (i = 0; i < JOIN_B * FEAT; i++) x[i] = 2.f * ddp_rng_uniform(&r) - 1.f;
    for (i = 0; i < JOIN_B; i++) y[i] = (int)ddp_rng_below(&r, CLASSES);
}
typedef struct join_cfg { int by_active, view, cap, adam; } join_cfg;
static int join_rank(int rank, void* arg) {
    const join_cfg* jc = (const join_cfg*)arg;
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_optim* o;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    ddp_wrap_stats st;
    float x[JOIN_B * FEAT], loss;
    int y[JOIN_B], step, e;
    long shadowed = 0;
    char path[128];
    memset(&d, 0, sizeof d);
    d.device.type = g_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) return 10;
    m = model_on(ddp_pg_device(pg), 100 + (uint64_t)rank * 17);
    memset(&wd, 0, sizeof wd);
    wd.uneven_inputs = 1, wd.divide_by_active_ranks = jc->by_active;
    wd.gradient_as_bucket_view = jc->view, wd.bucket_cap_bytes = wd.first_bucket_bytes = (size_t)jc->cap;
    if (!m || ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 11;
    o = optimizer(m, jc->adam, jc->adam ? 0.01f : 0.1f, 0.9f);
    for (e = 0; e < JOIN_EPOCHS; e++) {
        const int* nb = g_join_batches[e];
        int most = nb[0] > nb[1] ? (nb[0] > nb[2] ? 0 : 2) : (nb[1] > nb[2] ? 1 : 2);
        for (step = 0; step < nb[rank]; step++) {
            join_batch(rank, e * 100 + step, x, y);
            if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x, JOIN_B) != DDP_OK ||
                ddp_loss_cross_entropy(m, y, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK ||
                ddp_optim_step(o) != DDP_OK) {
                printf("    rank %d step %d: %s\n", rank, step, ddp_error_string());
                return 12;
            }
        }
        if (ddp_join(w) != DDP_OK) {
            printf("    rank %d: ddp_join: %s\n", rank, ddp_error_string());
            return 13;
        }
        shadowed += nb[most] - nb[rank];
        ddp_wrapper_stats(w, &st);
        if (st.shadowed_steps != shadowed || st.last_joined != most || ddp_optim_steps(o) != 10 * (e + 1)) {
            printf("    rank %d, epoch %d: answered %ld steps with zeros, took rank %d's weights, optimizer at step "
                   "%ld; expected %ld, %d, %d\n", rank, e, st.shadowed_steps, st.last_joined, ddp_optim_steps(o),
                   shadowed, most, 10 * (e + 1));
            return 14;
        }
    }
    snprintf(path, sizeof path, "%s/w%d.bin", g_dir, rank);
    save_params(m, path);
    ddp_wrapper_destroy(w);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}
/* The rule in one process: per step, the gradients of the ranks that still have a batch, summed
   (backward adds into p->grad) and divided by 3 or by how many they are; then one SGD step. */
static size_t join_reference(int by_active, int adam, float* out, size_t cap) {
    ddp_model* m = cpu_model(100);
    ddp_optim* o = optimizer(m, adam, adam ? 0.01f : 0.1f, 0.9f);
    float x[JOIN_B * FEAT], loss;
    int y[JOIN_B], step, r, i, e;
    size_t n = 0, k;
    for (e = 0; e < JOIN_EPOCHS; e++)
    for (step = 0; step < 10; step++) { /* 10: the most batches any rank has in each epoch */
        int active = 0;
        ddp_model_zero_grad(m);
        for (r = 0; r < JOIN_W; r++) {
            if (step >= g_join_batches[e][r]) continue;
            active++;
            join_batch(r, e * 100 + step, x, y);
            ddp_model_forward(m, x, JOIN_B);
            ddp_loss_cross_entropy(m, y, &loss);
            ddp_model_backward(m);
        }
        for (i = 0; i < ddp_model_num_params(m); i++)
            for (k = 0; k < ddp_model_param(m, i)->count; k++)
                ddp_model_param(m, i)->grad[k] /= (float)(by_active ? active : JOIN_W);
        ddp_optim_step(o);
    }
    for (i = 0; i < ddp_model_num_params(m) && n < cap; i++) {
        memcpy(out + n, ddp_model_param(m, i)->data, ddp_model_param(m, i)->count * 4);
        n += ddp_model_param(m, i)->count;
    }
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return n;
}
static void join_uneven_inputs(void) {
    static const join_cfg cfgs[] = {{0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 1, 0}, {1, 1, 256, 0}, {0, 0, 0, 1}};
    float ref[2048], other[2048], got[2048];
    char path[128];
    size_t i, k, n;
    int r;
    if (g_gpu && JOIN_W > g_gpus) {
        printf("    not run: NCCL needs a GPU for each of %d ranks, and this machine shows %d\n", JOIN_W, g_gpus);
        return;
    }
    for (i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        double num = 0, den = 0, dnum = 0;
        n = join_reference(cfgs[i].by_active, cfgs[i].adam, ref, 2048);
        join_reference(!cfgs[i].by_active, cfgs[i].adam, other, 2048);
        CHECK_OK(ddp_spawn(JOIN_W, join_rank, (void*)&cfgs[i]));
        for (r = 0; r < JOIN_W; r++) {
            snprintf(path, sizeof path, "%s/w%d.bin", g_dir, r);
            CHECKF(h_load_floats(path, got, 2048) == n, "rank %d saved no weights", r);
            for (k = 0; k < n; k++) {
                double e = (double)got[k] - ref[k], e2 = (double)other[k] - ref[k];
                num += e * e, den += (double)ref[k] * ref[k], dnum += e2 * e2;
            }
        }
        printf("    %s, batches 10, 9, 7 then 7, 10, 9 on 3 ranks, divided by %s, %s, cap %d: %.3g relative from "
               "the rule (the other rule is %.3g away)\n", cfgs[i].adam ? "Adam" : "SGD",
               cfgs[i].by_active ? "the active ranks" : "the world size", cfgs[i].view ? "bucket views" : "copies",
               cfgs[i].cap, sqrt(num / den), sqrt(dnum / den));
        CHECKF(sqrt(num / den) <= (g_gpu ? 1e-4 : 1e-5), "the weights are %.3g from the documented rule",
               sqrt(num / den));
        CHECKF(sqrt(dnum / den) > 1e-3, "the two rules end %.3g apart: the test cannot tell them apart",
               sqrt(dnum / den));
    }
}

/* What ddp_join refuses: a wrapper without uneven_inputs, and uneven inputs with ZeRO. */
static int join_refusals_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w = NULL;
    ddp_wrap_desc wd;
    int bad = 0;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) return 10;
    m = model_on(ddp_pg_device(pg), 100);
    memset(&wd, 0, sizeof wd);
    wd.uneven_inputs = 1, wd.zero_stage = 1;
    if (ddp_wrap(pg, m, &wd, &w) != DDP_ERR_INVALID_ARGUMENT || !strstr(ddp_error_string(), "uneven_inputs")) {
        printf("    rank %d: uneven_inputs with ZeRO-1 was not refused by name: %s\n", rank, ddp_error_string());
        bad = 1;
    }
    memset(&wd, 0, sizeof wd);
    if (ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 11;
    if (ddp_join(w) != DDP_ERR_STATE || !strstr(ddp_error_string(), "set uneven_inputs = 1")) {
        printf("    rank %d: ddp_join without uneven_inputs was not refused: %s\n", rank, ddp_error_string());
        bad = 1;
    }
    ddp_wrapper_destroy(w);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return bad ? 12 : 0;
}
static void join_refusals(void) { CHECK_OK(ddp_spawn(2, join_refusals_rank, NULL)); }

/* A rank that calls ddp_join before it trains (rank 0 here) answers the others' whole epoch with
   zeros and leaves the join with them; its own steps then find them gone. It is told that they
   left the job, how, and after how many collectives, not that a rank died: when they called
   ddp_destroy, and when their processes ended without it (*arg: 1). */
static int join_too_early_rank(int rank, void* arg) {
    const int no_destroy = *(const int*)arg;
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_optim* o;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    float x[JOIN_B * FEAT], loss;
    int y[JOIN_B], step, bad = 0;
    ddp_status s = DDP_OK;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 30;
    if (ddp_init(&d, &pg) != DDP_OK) return 10;
    m = model_on(ddp_pg_device(pg), 100);
    memset(&wd, 0, sizeof wd);
    wd.uneven_inputs = 1;
    if (!m || ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 11;
    o = optimizer(m, 0, 0.1f, 0.9f);
    if (rank == 0 && ddp_join(w) != DDP_OK) return 12;
    for (step = 0; step < 3 && s == DDP_OK; step++) {
        join_batch(rank, step, x, y);
        if ((s = ddp_model_zero_grad(m)) == DDP_OK && (s = ddp_model_forward(m, x, JOIN_B)) == DDP_OK &&
            (s = ddp_loss_cross_entropy(m, y, &loss)) == DDP_OK && (s = ddp_model_backward(m)) == DDP_OK)
            s = ddp_optim_step(o);
    }
    if (rank != 0 && (s != DDP_OK || ddp_join(w) != DDP_OK)) {
        printf("    rank %d: %s\n", rank, ddp_error_string());
        bad = 1;
    }
    if (rank == 0 && (s != DDP_ERR_DESYNC || !strstr(ddp_error_string(), "has left the job") ||
                      !strstr(ddp_error_string(), no_destroy ? "ended without calling ddp_destroy after 27 collectives"
                                                             : "it called ddp_destroy after 27 collectives"))) {
        printf("    rank 0, trained after joining: %s: %s\n", ddp_status_name(s), ddp_error_string());
        bad = 1;
    }
    /* rank 1 leaves last, well after rank 2 (rank 0's left neighbour) has left and exited: rank 0,
       waiting on rank 1 first, must still read rank 2's leaving, not a death (it read "rank 2
       closed its connection" under load) */
    if (rank == 1) usleep(300000);
    if (rank != 0 && no_destroy) return 0; /* the process ends with its group open */
    ddp_wrapper_destroy(w);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return bad ? 13 : 0;
}
static void join_too_early(void) {
    static const int destroy = 0, no_destroy = 1;
    CHECK_OK(ddp_spawn(JOIN_W, join_too_early_rank, (void*)&destroy));
    CHECK_OK(ddp_spawn(JOIN_W, join_too_early_rank, (void*)&no_destroy));
}

/* What ZeRO cannot do here is refused by name: a stage past 3, 16-bit gradients with stage 2, an
   optimizer created before the wrap (it would hold the full state), and a snapshot of a sharded
   state that was not consolidated right before the save. */
static int zero_refusals_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w = NULL;
    ddp_wrap_desc wd;
    ddp_optim *early, *o;
    ddp_snapshot snap;
    int bad = 0;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) return 10;
    m = model_on(ddp_pg_device(pg), 100);
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = 4;
    if (ddp_wrap(pg, m, &wd, &w) != DDP_ERR_INVALID_ARGUMENT || !strstr(ddp_error_string(), "zero_stage 4")) {
        printf("    rank %d: zero_stage 4 was not refused by name: %s\n", rank, ddp_error_string());
        bad = 1;
    }
    wd.zero_stage = 2, wd.compress = DDP_BF16;
    if (ddp_wrap(pg, m, &wd, &w) != DDP_ERR_INVALID_ARGUMENT || !strstr(ddp_error_string(), "with compress")) {
        printf("    rank %d: zero_stage 2 with compression was not refused by name: %s\n", rank, ddp_error_string());
        bad = 1;
    }
    wd.compress = DDP_DTYPE_DEFAULT;
    early = sgd(m, 0.1f, 0.9f);
    wd.zero_stage = 1;
    if (ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 11;
    if (ddp_optim_step(early) != DDP_ERR_STATE || !strstr(ddp_error_string(), "create the optimizer after ddp_wrap")) {
        printf("    rank %d: a step of an optimizer made before the wrap was not refused: %s\n", rank,
               ddp_error_string());
        bad = 1;
    }
    o = sgd(m, 0.1f, 0.9f);
    memset(&snap, 0, sizeof snap);
    snap.model = m, snap.optim = o;
    if (rank == 0 && (ddp_snapshot_save(&snap, "/nonexistent/never-written.st") != DDP_ERR_STATE ||
                      !strstr(ddp_error_string(), "ddp_optim_consolidate(o, 0)"))) {
        printf("    rank %d: saving a sharded optimizer that was not consolidated was not refused: %s\n", rank,
               ddp_error_string());
        bad = 1;
    }
    /* consolidated, then a step: the copy is stale, and a save says so */
    if (ddp_optim_consolidate(o, 0) != DDP_OK || ddp_optim_consolidate(o, 2) != DDP_ERR_INVALID_ARGUMENT) {
        printf("    rank %d: ddp_optim_consolidate: %s\n", rank, ddp_error_string());
        bad = 1;
    }
    /* consolidated onto rank 1: rank 0 holds only its shard, and rank 1 gets past the check (to the
       missing folder) */
    if (ddp_optim_consolidate(o, 1) != DDP_OK) return 14;
    if (ddp_snapshot_save(&snap, "/nonexistent/never-written.st") != (rank == 0 ? DDP_ERR_STATE : DDP_ERR_IO) ||
        (rank == 0 && !strstr(ddp_error_string(), "consolidated onto rank 1"))) {
        printf("    rank %d: saving after a consolidation onto rank 1: %s\n", rank, ddp_error_string());
        bad = 1;
    }
    if (ddp_optim_step(o) != DDP_OK) return 13;
    if (rank == 0 && (ddp_snapshot_save(&snap, "/nonexistent/never-written.st") != DDP_ERR_STATE ||
                      !strstr(ddp_error_string(), "right before this save"))) {
        printf("    rank %d: saving after a step past the consolidation was not refused: %s\n", rank,
               ddp_error_string());
        bad = 1;
    }
    ddp_wrapper_destroy(w);
    ddp_optim_destroy(o);
    ddp_optim_destroy(early);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return bad ? 12 : 0;
}
static void zero_refusals(void) { CHECK_OK(ddp_spawn(2, zero_refusals_rank, NULL)); }

static void equivalence_compressed(void) {
    cfg c = base();
    c.momentum = 0;
    c.compress = DDP_F16;
    equivalence(2, &c, -1);
    equivalence(4, &c, -1);
    c.compress = DDP_BF16;
    equivalence(2, &c, -1);
    equivalence(4, &c, -1);
}

/* The bucket map: last parameter first, limits as asked, reported by the stats. */
static int buckets_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    ddp_wrap_stats st;
    int bad = 0, i;
    (void)rank, (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    m = cpu_model(1);
    /* sizes in bytes: fc1.weight 240, fc1.bias 40, fc2.weight 320, fc2.bias 32, fc3.weight 96, fc3.bias 12 */
    memset(&wd, 0, sizeof wd);
    wd.first_bucket_bytes = 100; /* fc3.bias + fc3.weight = 108 >= 100: closes the first bucket */
    wd.bucket_cap_bytes = 300;   /* fc2.bias + fc2.weight = 352; fc1.bias + fc1.weight = 280 */
    if (ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 2;
    ddp_wrapper_stats(w, &st);
    bad += st.buckets != 3;
    bad += st.bucket_bytes[0] != 108 || st.bucket_params[0] != 2;
    bad += st.bucket_bytes[1] != 352 || st.bucket_params[1] != 2;
    bad += st.bucket_bytes[2] != 280 || st.bucket_params[2] != 2;
    for (i = 0; i < 6; i++) bad += w->bucket_of[i] != (5 - i) / 2; /* fc3 -> 0, fc2 -> 1, fc1 -> 2 */
    bad += w->buckets[0].params[0] != 5; /* fc3.bias arrives first */
    ddp_wrapper_destroy(w);
    memset(&wd, 0, sizeof wd); /* defaults: 1 MiB first bucket, 25 MiB: one bucket for this model */
    if (ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 3;
    ddp_wrapper_stats(w, &st);
    bad += st.buckets != 1 || st.bucket_params[0] != 6;
    ddp_wrapper_destroy(w);
    for (i = 0; i < ddp_model_num_params(m); i++) bad += ddp_model_param(m, i)->nhooks != 0; /* unhooked */
    ddp_model_destroy(m);
    ddp_destroy(pg);
    if (bad) printf("    rank %d: %d bucket-map checks failed\n", rank, bad);
    return bad;
}
static void bucket_assignment(void) { CHECK_OK(ddp_spawn(2, buckets_rank, NULL)); }

/* A backward that gives fc2.weight no gradient: a clear error naming it, or, with
   find_unused_parameters, a zero contribution. Every rank skips the same parameter, so nothing
   waits. */
static int unused_rank(int rank, void* arg) {
    int find_unused = *(int*)arg, bad = 0, i;
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    ddp_status s;
    (void)rank;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    m = cpu_model(1);
    memset(&wd, 0, sizeof wd);
    wd.find_unused_parameters = find_unused;
    wd.bucket_cap_bytes = wd.first_bucket_bytes = 1;
    if (ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 2;
    /* a hand-written backward: gradients of 1 everywhere, fc2.weight (index 2) left out; each
       Linear layer is a unit of the MLP, bracketed as ddp_model_backward brackets it */
    s = ddp_unit_begin(m, 0, DDP_BACKWARD);
    for (i = 5; i >= 0 && s == DDP_OK; i--) {
        ddp_param* p = ddp_model_param(m, i);
        size_t k;
        for (k = 0; k < p->count; k++) p->grad[k] = 1.f;
        if (i % 2) s = ddp_unit_begin(m, p->unit, DDP_BACKWARD);
        if (s == DDP_OK && i != 2) s = ddp_param_grad_ready(p);
        if (s == DDP_OK && i % 2 == 0) s = ddp_unit_end(m, p->unit, DDP_BACKWARD);
    }
    if (s == DDP_OK) s = ddp_unit_end(m, 0, DDP_BACKWARD);
    if (find_unused) {
        bad += s != DDP_OK;
        bad += ddp_model_param(m, 2)->grad[0] != 0.f;  /* every rank contributed zero */
        bad += ddp_model_param(m, 3)->grad[0] != 1.f;  /* the average of ones */
    } else {
        bad += s != DDP_ERR_UNUSED_PARAMETER;
        bad += strstr(ddp_error_string(), "fc2.weight") == NULL;
        bad += strstr(ddp_error_string(), "find_unused_parameters") == NULL;
        if (bad) printf("    rank %d: status %s, message: %s\n", rank, ddp_status_name(s), ddp_error_string());
    }
    ddp_wrapper_destroy(w);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return bad;
}
static void unused_parameter_error(void) {
    int f = 0;
    CHECK_OK(ddp_spawn(2, unused_rank, &f));
}
static void find_unused_parameters(void) {
    int f = 1;
    CHECK_OK(ddp_spawn(2, unused_rank, &f));
}

/* Rank 1 builds a wider hidden layer: ddp_wrap fails on every rank, naming the difference. With
   arg set, as a student's program with DDP_CHECK does: ranks 1 and 2 both differ from rank 0, rank
   2 comes to ddp_wrap late, and every rank exits right after the error, without ddp_destroy (rank
   0, which hosts the store, must not take it away while another rank still needs it). */
static int mismatch_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_model_desc md;
    ddp_wrapper* w = NULL;
    int sizes[4] = {FEAT, 10, 8, CLASSES};
    ddp_status s;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 20;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    if (rank == 1) sizes[1] = 11;
    if (rank == 2 && arg) sizes[1] = 12;
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    if (ddp_model_mlp(&md, sizes, 4, DDP_LAYER_RELU, &m) != DDP_OK) return 2;
    if (rank == 2 && arg) ddp__sleep(0.5);
    s = ddp_wrap(pg, m, NULL, &w);
    if (s != DDP_ERR_MODEL_MISMATCH || !strstr(ddp_error_string(), "fc1.weight[11,6]") ||
        !strstr(ddp_error_string(), "rank 1")) {
        printf("    rank %d: ddp_wrap returned %s: %s\n", rank, ddp_status_name(s), ddp_error_string());
        return 3;
    }
    if (arg) return 0; /* DDP_CHECK would exit here */
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}
static void mismatched_models_fail_on_every_rank(void) { CHECK_OK(ddp_spawn(3, mismatch_rank, NULL)); }
static void mismatched_models_late_rank_told_too(void) {
    int late = 1;
    CHECK_OK(ddp_spawn(3, mismatch_rank, &late));
}

/* The settings that change the collectives or the arithmetic, set differently on rank 1 (or on
   every rank): ddp_wrap fails on every rank, at once, naming the setting and each rank's value,
   before a wrapper's collective could differ between ranks. A rank whose own settings are refused
   (zero_stage 2 with compression) gets its own error, and the others still learn at once. */
typedef struct settings_case {
    const char* want; /* in every error on ranks that get DDP_ERR_MODEL_MISMATCH */
    int all_stage, stage1, prefetch1, uneven_all, uneven1, divide1, view1, unused1, three;
    size_t cap1, first1;
    ddp_dtype compress1;
} settings_case;
static const settings_case g_settings[] = {
    {"zero_stage is 0 on ranks 0, 2; 2 on rank 1", 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, DDP_DTYPE_DEFAULT},
    {"prefetch is 0 on ranks 0, 2; 1 on rank 1", 3, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, DDP_DTYPE_DEFAULT},
    {"uneven_inputs is 0 on ranks 0, 2; 1 on rank 1", 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, DDP_DTYPE_DEFAULT},
    {"divide_by_active_ranks is 0 on ranks 0, 2; 1 on rank 1", 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, DDP_DTYPE_DEFAULT},
    {"compress is f32 on ranks 0, 2; bf16 on rank 1", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, DDP_BF16},
    {"bucket_cap_bytes is 26214400 on ranks 0, 2; 1024 on rank 1", 0, 0, 0, 0, 0, 0, 0, 0, 0, 1024, 0,
     DDP_DTYPE_DEFAULT},
    {"first_bucket_bytes is 1048576 on ranks 0, 2; 64 on rank 1", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64,
     DDP_DTYPE_DEFAULT},
    {"gradient_as_bucket_view is 0 on ranks 0, 2; 1 on rank 1", 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, DDP_DTYPE_DEFAULT},
    {"find_unused_parameters is 0 on ranks 0, 2; 1 on rank 1", 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, DDP_DTYPE_DEFAULT},
    /* rank 1's own settings are refused; the others name the first difference */
    {"zero_stage is 0 on ranks 0, 2; 2 on rank 1", 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, DDP_F16},
    /* three values: rank r at stage r (rank 2 at 3) */
    {"zero_stage is 0 on rank 0; 1 on rank 1; 3 on rank 2", 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, DDP_DTYPE_DEFAULT},
    /* the buckets' settings do not count at stage 2: the same wrapper on every rank */
    {NULL, 2, 2, 0, 0, 0, 0, 0, 0, 0, 1024, 64, DDP_DTYPE_DEFAULT},
};
static int settings_rank(int rank, void* arg) {
    const settings_case* c = (const settings_case*)arg;
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_model_desc md;
    ddp_wrap_desc wd;
    ddp_wrapper* w = NULL;
    int sizes[4] = {FEAT, 10, 8, CLASSES}, refused_here = 0;
    double t0;
    ddp_status s;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 20;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    if (ddp_model_mlp(&md, sizes, 4, DDP_LAYER_RELU, &m) != DDP_OK) return 2;
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = c->all_stage, wd.uneven_inputs = c->uneven_all;
    if (rank == 1) {
        wd.zero_stage = c->stage1, wd.prefetch = c->prefetch1, wd.uneven_inputs |= c->uneven1;
        wd.divide_by_active_ranks = c->divide1, wd.gradient_as_bucket_view = c->view1;
        wd.find_unused_parameters = c->unused1, wd.compress = c->compress1;
        wd.bucket_cap_bytes = c->cap1, wd.first_bucket_bytes = c->first1;
        refused_here = c->stage1 >= 2 && c->compress1 != DDP_DTYPE_DEFAULT;
    }
    if (rank == 2 && c->three) wd.zero_stage = 3;
    if (!c->want) wd.bucket_cap_bytes = (size_t)(rank + 1) << 10, wd.first_bucket_bytes = (size_t)64 << rank;
    t0 = ddp__now();
    s = ddp_wrap(pg, m, &wd, &w);
    if (!c->want ? s != DDP_OK
        : refused_here ? s != DDP_ERR_INVALID_ARGUMENT || !strstr(ddp_error_string(), "compress")
                       : s != DDP_ERR_MODEL_MISMATCH || !strstr(ddp_error_string(), c->want) ||
                             !strstr(ddp_error_string(), "the same ddp_wrap_desc")) {
        printf("    rank %d (want %s): ddp_wrap returned %s: %s\n", rank, c->want ? c->want : "no error",
               ddp_status_name(s), ddp_error_string());
        return 3;
    }
    if (ddp__now() - t0 > 10)
        return printf("    rank %d: told after %.1f s (DDP_TIMEOUT 20)\n", rank, ddp__now() - t0), 4;
    if (rank == 0 && c->three) printf("    rank 0 reads: %s\n", ddp_error_string()); /* what a student reads */
    ddp_wrapper_destroy(w);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}
static void settings_that_differ_across_ranks(void) {
    size_t i;
    for (i = 0; i < sizeof g_settings / sizeof g_settings[0]; i++) {
        CHECKF(ddp_spawn(3, settings_rank, (void*)&g_settings[i]) == DDP_OK, "case %zu (%s): %s", i,
               g_settings[i].want ? g_settings[i].want : "no difference", ddp_error_string());
    }
}

/* The optimizer of a wrapped model is compared across the ranks when it is created, as ddp_wrap's
   settings are: every rank is told which setting differs, with each value and its ranks, and a
   next optimizer, the same everywhere, is created as usual. */
typedef struct optim_case {
    const char* want; /* NULL: the same everywhere */
    ddp_optim_desc d, d1; /* ranks 0 and 2; rank 1 */
} optim_case;
static const optim_case g_optim_cases[] = {
    {"kind is sgd on ranks 0, 2; adam on rank 1", {DDP_SGD, 0.1f, 0, 0, 0, 0, 0, 0, 0}, {DDP_ADAM, 0.1f, 0, 0, 0, 0, 0, 0, 0}},
    {"lr is 0.1 on ranks 0, 2; 0.2 on rank 1", {DDP_SGD, 0.1f, 0, 0, 0, 0, 0, 0, 0}, {DDP_SGD, 0.2f, 0, 0, 0, 0, 0, 0, 0}},
    {"momentum is 0.9 on ranks 0, 2; 0 on rank 1", {DDP_SGD, 0.1f, 0.9f, 0, 0, 0, 0, 0, 0},
     {DDP_SGD, 0.1f, 0, 0, 0, 0, 0, 0, 0}},
    {"weight_decay is 0.01 on ranks 0, 2; 0.1 on rank 1", {DDP_ADAMW, 0, 0, 0, 0, 0, 0, 0, 0},
     {DDP_ADAMW, 0, 0, 0, 0, 0.1f, 0, 0, 0}},
    {NULL, {DDP_ADAM, 0, 0, 0, 0, 0, 0, 0, 0}, {DDP_ADAM, 0, 0, 0, 0, 0, 0, 0, 0}},
};
static int optim_settings_rank(int rank, void* arg) {
    const optim_case* c = (const optim_case*)arg;
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w = NULL;
    ddp_wrap_desc wd;
    ddp_optim *o = NULL, *next = NULL;
    ddp_status s;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 20;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    m = model_on(ddp_pg_device(pg), 100);
    memset(&wd, 0, sizeof wd);
    if (!m || ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 2;
    s = ddp_optim_create(m, rank == 1 ? &c->d1 : &c->d, &o);
    if (!c->want ? s != DDP_OK
                 : s != DDP_ERR_MODEL_MISMATCH || o || !strstr(ddp_error_string(), c->want) ||
                       !strstr(ddp_error_string(), "the ranks created the optimizer with different settings") ||
                       !strstr(ddp_error_string(), "the same ddp_optim_desc")) {
        printf("    rank %d (want %s): ddp_optim_create returned %s: %s\n", rank, c->want ? c->want : "no error",
               ddp_status_name(s), ddp_error_string());
        return 3;
    }
    if (ddp_optim_create(m, &c->d, &next) != DDP_OK) {
        printf("    rank %d: the next optimizer, the same on every rank: %s\n", rank, ddp_error_string());
        return 4;
    }
    ddp_optim_destroy(next);
    ddp_optim_destroy(o);
    ddp_wrapper_destroy(w);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}
static void optimizers_that_differ_across_ranks(void) {
    size_t i;
    for (i = 0; i < sizeof g_optim_cases / sizeof g_optim_cases[0]; i++)
        CHECKF(ddp_spawn(3, optim_settings_rank, (void*)&g_optim_cases[i]) == DDP_OK, "case %zu (%s): %s", i,
               g_optim_cases[i].want ? g_optim_cases[i].want : "no difference", ddp_error_string());
}

/* Overlap, proved by order on the recorded timeline (the spans DDP_TRACE writes), with the network
   made slow (DDP_SIMULATE_NS_PER_BYTE). Each rank first times its own backward, without DDP, and
   picks the batch that makes backward last about 0.3 s here (so that the comparisons below have
   tens of milliseconds of room even when other programs take the cores) and a network on which the
   first bucket's all-reduce lasts 3 times that backward: a busy machine slows both alike, and
   nothing below compares durations. Two steps, on the same batch:
     a bucket per layer (about): the first bucket (fc4 and fc3) is all-reduced while backward
       computes fc2 and fc1: its all-reduce starts before fc2's backward has ended, and ends after
       backward's last layer (fc1) has ended, so backward did not wait for it;
     one bucket: the all-reduce cannot start before fc2's backward has ended (it needs fc1's
       gradients), which shows that the first check tells the two apart.
   The ratio of the two steps' times is a figure of make bench, not a test. */
enum { OV_MAX_BATCH = 2048 };
typedef struct ov_step { /* one step's spans, in ms from the start of its backward */
    int all_reduces;
    double ar0_start, ar0_end; /* the all-reduce that started first */
    double fc2_end, fc1_end;
} ov_step;

/* Run one forward/backward of m on the batch, recording the timeline, and read the spans back. */
static int ov_traced_step(ddp_model* m, const float* x, const int* y, int batch, ov_step* out) {
    size_t i;
    float loss;
    double t0;
    memset(out, 0, sizeof *out);
    out->ar0_start = 1e30;
    pthread_mutex_lock(&ddp__tr.lock);
    ddp__tr.n = 0, ddp__tr.state = 2; /* record (the spans DDP_TRACE would write), from empty */
    pthread_mutex_unlock(&ddp__tr.lock);
    if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x, batch) != DDP_OK ||
        ddp_loss_cross_entropy(m, y, &loss) != DDP_OK)
        return 0;
    t0 = ddp__now();
    if (ddp_model_backward(m) != DDP_OK) return 0; /* returns once every bucket is averaged */
    pthread_mutex_lock(&ddp__tr.lock);
    for (i = 0; i < ddp__tr.n; i++) {
        const ddp__tev* e = &ddp__tr.ev[i];
        double a = (e->t0 - t0) * 1e3, b = (e->t1 - t0) * 1e3;
        if (e->tid == DDP__TRACE_COMM && !strncmp(e->name, "all_reduce ", 11)) {
            out->all_reduces++;
            if (a < out->ar0_start) out->ar0_start = a, out->ar0_end = b;
        }
        if (e->tid == DDP__TRACE_COMPUTE && !strcmp(e->name, "backward fc2")) out->fc2_end = b;
        if (e->tid == DDP__TRACE_COMPUTE && !strcmp(e->name, "backward fc1")) out->fc1_end = b;
    }
    ddp__tr.n = 0, ddp__tr.state = 1; /* off again: ddp_destroy must not write a trace file */
    pthread_mutex_unlock(&ddp__tr.lock);
    return out->all_reduces > 0 && out->fc2_end > 0 && out->fc1_end > 0;
}

static int overlap_rank(int rank, void* arg) {
    int sizes[5] = {256, 512, 512, 512, 10}, i, k, batch = 256, y[OV_MAX_BATCH];
    const size_t caps[2] = {(size_t)300 << 10, (size_t)1 << 30}; /* about a layer each; one bucket */
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m[2];
    ddp_model_desc md;
    ddp_wrapper* w[2];
    ddp_wrap_desc wd;
    ddp_wrap_stats st;
    ov_step ov[2];
    float *x = (float*)malloc((size_t)OV_MAX_BATCH * 256 * sizeof(float)), loss;
    double tb = 1e30, delay;
    char path[128], ns[32];
    FILE* f;
    (void)arg;
    for (i = 0; i < OV_MAX_BATCH * 256; i++) x[i] = (float)((i * 7) % 13) / 13.f;
    for (i = 0; i < OV_MAX_BATCH; i++) y[i] = i % 10;
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    for (k = 0; k < 2; k++)
        if (ddp_model_mlp(&md, sizes, 5, DDP_LAYER_RELU, &m[k]) != DDP_OK) return 1;
    /* this machine's backward now, without DDP (the best of 3), at 256 samples, then at the batch
       that takes about 0.3 s */
    for (k = 0; k < 2; k++) {
        for (i = 0, tb = 1e30; i < 3; i++) {
            double t;
            ddp_model_zero_grad(m[0]);
            ddp_model_forward(m[0], x, batch);
            ddp_loss_cross_entropy(m[0], y, &loss);
            t = ddp__now();
            if (ddp_model_backward(m[0]) != DDP_OK) return 2;
            t = ddp__now() - t;
            tb = t < tb ? t : tb;
        }
        if (k == 0) batch = tb >= 0.3 ? 256 : tb * 8 < 0.3 ? OV_MAX_BATCH : 256 * (int)ceil(0.3 / tb);
    }
    delay = 3 * tb > 0.2 ? 3 * tb : 0.2; /* the first bucket's all-reduce, about 1 MiB */
    snprintf(ns, sizeof ns, "%.3f", delay / (double)((512 * 512 + 512 + 10 * 512 + 10) * 4) * 1e9);
    setenv("DDP_SIMULATE_NS_PER_BYTE", ns, 1);
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 120;
    if (ddp_init(&d, &pg) != DDP_OK) return 3;
    for (k = 0; k < 2; k++) {
        memset(&wd, 0, sizeof wd);
        wd.bucket_cap_bytes = wd.first_bucket_bytes = caps[k];
        if (ddp_wrap(pg, m[k], &wd, &w[k]) != DDP_OK) return 4;
    }
    ddp_wrapper_stats(w[0], &st);
    ddp__trace_on(); /* DDP_TRACE was read (unset) long ago: ov_traced_step turns recording on */
    for (k = 0; k < 2; k++)
        if (!ov_traced_step(m[k], x, y, batch, &ov[k])) {
            printf("    rank %d: %s\n", rank, ddp_error_string());
            return 5;
        }
    snprintf(path, sizeof path, "%s/overlap%d.txt", g_dir, rank);
    if ((f = fopen(path, "w")) != NULL) {
        fprintf(f, "%d %d %.3f %.3f %d", st.buckets, batch, tb * 1e3, delay * 1e3, ov[0].all_reduces);
        for (k = 0; k < 2; k++) fprintf(f, " %.3f %.3f %.3f %.3f", ov[k].ar0_start, ov[k].ar0_end, ov[k].fc2_end, ov[k].fc1_end);
        fprintf(f, " %d\n", ov[1].all_reduces);
        fclose(f);
    }
    for (k = 0; k < 2; k++) ddp_wrapper_destroy(w[k]), ddp_model_destroy(m[k]);
    ddp_destroy(pg);
    free(x);
    return 0;
}
static void overlap_by_order(void) {
    int r;
    CHECK_OK(ddp_spawn(2, overlap_rank, NULL));
    for (r = 0; r < 2; r++) {
        char path[128];
        int buckets = 0, batch = 0, n_many = 0, n_one = 0;
        double tb = 0, delay = 0, v[8] = {0};
        FILE* f;
        snprintf(path, sizeof path, "%s/overlap%d.txt", g_dir, r);
        f = fopen(path, "r");
        if (!f || fscanf(f, "%d %d %lf %lf %d %lf %lf %lf %lf %lf %lf %lf %lf %d", &buckets, &batch, &tb, &delay, &n_many,
                         &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &n_one) != 14) {
            CHECKF(0, "rank %d wrote no timeline to %s", r, path);
            if (f) fclose(f);
            continue;
        }
        fclose(f);
        printf("    rank %d (batch %d, backward %.1f ms, first bucket's all-reduce made to last %.0f ms), ms from "
               "backward's start: %d buckets: first all-reduce %.1f-%.1f, fc2 done %.1f, fc1 done %.1f; one bucket: "
               "all-reduce %.1f-%.1f, fc2 done %.1f, fc1 done %.1f\n", r, batch, tb, delay, buckets, v[0], v[1], v[2],
               v[3], v[4], v[5], v[6], v[7]);
        CHECKF(buckets == 3 && n_many == 3 && n_one == 1, "rank %d: %d buckets, %d and %d all-reduces (want 3, 3, 1)", r,
               buckets, n_many, n_one);
        CHECKF(v[0] < v[2], "rank %d: the first bucket's all-reduce started at %.1f ms, after fc2's backward ended "
               "(%.1f ms): it did not run while backward computed", r, v[0], v[2]);
        CHECKF(v[3] < v[1], "rank %d: backward's last layer ended at %.1f ms, after the first all-reduce ended (%.1f ms): "
               "backward waited for it", r, v[3], v[1]);
        CHECKF(v[4] >= v[6], "rank %d: with one bucket the all-reduce started at %.1f ms, before fc2's backward ended "
               "(%.1f ms), without fc1's gradients", r, v[4], v[6]);
    }
}

/* Overlap on the GPU: one step of 2 ranks, one parameter per bucket, under the GPU stand-in with a
   slow network (FAKEGPU_NCCL_DELAY_MS) and its trace of every operation queued, started and
   finished (FAKEGPU_TRACE). Order, not time, is the proof, on each rank: the first bucket's
   all-reduce is called before backward has queued its last kernel (fc1's bias gradient), and
   that kernel runs before the all-reduce ends, so the model's stream does not wait for the
   network. On a real GPU there is no trace, and the case is skipped. */
static int overlap_gpu_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    float x[GLOBAL_B * FEAT], loss;
    int y[GLOBAL_B];
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CUDA;
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    m = model_on(ddp_pg_device(pg), 100);
    memset(&wd, 0, sizeof wd);
    wd.bucket_cap_bytes = wd.first_bucket_bytes = 1;
    if (!m || ddp_wrap(pg, m, &wd, &w) != DDP_OK) return 2;
    global_batch(0, x, y);
    if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x + rank * 6 * FEAT, 6) != DDP_OK ||
        ddp_loss_cross_entropy(m, y + rank * 6, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK) {
        printf("    rank %d: %s\n", rank, ddp_error_string());
        return 3;
    }
    ddp_stream_sync(ddp_model_stream(m));
    ddp_wrapper_destroy(w);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}
static void overlap_on_the_gpu(void) {
    char path[128], line[512];
    FILE* f;
    long pids[2] = {0, 0};
    int k;
    if (g_gpus < 2) SKIP("two ranks on NCCL need two GPUs, and this machine shows %d", g_gpus);
    snprintf(path, sizeof path, "%s/trace", g_dir);
    setenv("FAKEGPU_TRACE", path, 1);
    setenv("FAKEGPU_NCCL_DELAY_MS", "250", 1);
    /* work runs as soon as it may: only a real dependency (a stream waiting for the collective)
       can then hold backward's last kernel until the all-reduce's 250 ms are over */
    setenv("FAKEGPU_HOLD_MS", "0", 1);
    CHECK_OK(ddp_spawn(2, overlap_gpu_rank, NULL));
    unsetenv("FAKEGPU_TRACE");
    unsetenv("FAKEGPU_NCCL_DELAY_MS");
    unsetenv("FAKEGPU_HOLD_MS");
    if (!(f = fopen(path, "r"))) SKIP("no operation trace: only the GPU stand-in (make test) writes one");
    while (fgets(line, sizeof line, f)) { /* the two ranks' pids, in order of appearance */
        long pid = atol(line);
        if (pid != pids[0] && !pids[1] && pids[0]) pids[1] = pid;
        if (!pids[0]) pids[0] = pid;
    }
    for (k = 0; k < 2; k++) {
        long n = 0, first_call = -1, last_queue = -1, ran = -1, ended = -1;
        unsigned model = (unsigned)-1, comm = (unsigned)-1, st;
        unsigned long long op, last_op = 0, first_ar = 0;
        rewind(f);
        while (fgets(line, sizeof line, f)) { /* "PID TIME queue|run|done stream S #N NAME" or "PID TIME nccl ..." */
            char* rest = strchr(line, ' ');
            char verb[16], name[64];
            int stream_line;
            if (atol(line) != pids[k] || !rest || !(rest = strchr(rest + 1, ' '))) continue;
            rest++;
            n++;
            stream_line = sscanf(rest, "%15s stream %u #%llu %63s", verb, &st, &op, name) == 4;
            if (!strncmp(rest, "nccl call AllReduce ", 20) && first_call < 0) first_call = n;
            if (!stream_line) continue;
            if (model == (unsigned)-1 && !strcmp(verb, "queue") && !strcmp(name, "ddp_k_relu_fwd")) model = st;
            if (first_call >= 0 && comm == (unsigned)-1 && !strcmp(verb, "queue") && !strcmp(name, "AllReduce"))
                comm = st, first_ar = op;
            if (!strcmp(verb, "queue") && !strcmp(name, "ddp_k_bias_grad") && st == model) last_queue = n, last_op = op;
            if (!strcmp(verb, "run") && st == model && op == last_op) ran = n;
            if (ended < 0 && !strcmp(verb, "done") && st == comm && op == first_ar) ended = n;
        }
        printf("    rank %d (pid %ld): first all-reduce called at line %ld, backward's last kernel queued at %ld and "
               "run at %ld, the first all-reduce done at %ld\n", k, pids[k], first_call, last_queue, ran, ended);
        CHECKF(first_call > 0 && last_queue > 0 && first_call < last_queue,
               "the first bucket's all-reduce was not called before backward's last kernel was queued");
        CHECKF(ran > 0 && ended > 0 && ran < ended,
               "backward's last kernel did not run before the first all-reduce ended: the model's stream waited for it");
    }
    fclose(f);
}

int main(int argc, char** argv) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ddp_test_ddp.XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    g_gpu = argc > 1 && !strcmp(argv[1], "--gpu");
    if (g_gpu) {
        char why[256];
        if ((g_gpus = h_gpus_in_child(why, sizeof why)) == 0) {
            printf("skip equivalence_on_gpus: no GPU: %s\n", why);
            return 0;
        }
        RUN(equivalence_all_worlds_and_buckets);
        RUN(equivalence_no_sync_accumulation);
        RUN(equivalence_compressed);
        RUN(equivalence_zero);
        RUN(zero_snapshot_resumes_on_other_worlds);
        RUN(join_uneven_inputs);
        RUN(overlap_on_the_gpu);
        h_remove_tree(g_dir);
        return H_EXIT();
    }
    RUN(equivalence_all_worlds_and_buckets);
    RUN(equivalence_every_transport_path);
    RUN(equivalence_no_sync_accumulation);
    RUN(equivalence_compressed);
    RUN(equivalence_zero);
    RUN(zero_snapshot_resumes_on_other_worlds);
    RUN(zero_refusals);
    RUN(join_uneven_inputs);
    RUN(join_refusals);
    RUN(join_too_early);
    RUN(bucket_assignment);
    RUN(unused_parameter_error);
    RUN(find_unused_parameters);
    RUN(mismatched_models_fail_on_every_rank);
    RUN(mismatched_models_late_rank_told_too);
    RUN(settings_that_differ_across_ranks);
    RUN(optimizers_that_differ_across_ranks);
    RUN(overlap_by_order);
    h_remove_tree(g_dir);
    return H_EXIT();
}
