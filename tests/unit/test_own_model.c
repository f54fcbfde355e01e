/* A model of one's own under DDP: tensors described with ddp_model_add, a forward and a backward
   written here (not by ddp.h), bracketed with ddp_unit_begin/end and announcing each gradient with
   ddp_param_grad_ready. The model: a shift added to the input and a bias added to the logits (unit
   0, the whole model's: used at both ends, their gradients final at both ends of backward), then
   unit 1 = Linear + LayerNorm + ReLU, unit 2 = Linear without bias, then softmax cross-entropy.
   The central test: N ranks with batch B/N each train the same weights as one process with batch
   B, for SGD with momentum and AdamW with parameter groups (no decay for biases, gains and the
   shift), ZeRO stages 0-3 with those units, with and without no_sync, with a learning rate set
   before every step (warmup, then cosine) and with global-norm clipping, whose norm must be the
   one process's too. With --gpu (the GPU stand-in's NCCL), every rank's tensors on its GPU.
   Also: ddp_model_mlp's MLP and the same MLP described tensor by tensor start and train
   bit-identical; every misuse of the brackets and of ddp_param_grad_ready is refused by name;
   ranks whose tensors differ are told which; ZeRO-3's memory with units is checked to the byte. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

enum { F = 5, H = 8, C = 3, GB = 12, STEPS = 30 };
static char g_dir[64];
static int g_gpu, g_gpus;

/* ---- the model, written here -------------------------------------------------------------------- */

typedef struct net {
    ddp_model* m;
    ddp_param *shift, *obias, *w1, *b1, *g, *beta, *w2;
    int B;
    int skip_shift; /* a backward that never marks `shift` ready (find_unused_parameters) */
    /* kept from forward for backward */
    double h0[GB * F], nhat[GB * H], inv[GB], n[GB * H], r[GB * H], dl[GB * C];
} net;

/* A tensor's values (which = data) or gradient on the host, whatever device it lives on. */
static void fetch(ddp_model* m, const ddp_param* p, const float* src, float* host) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    ddp_copy(cpu, host, p->device, src, p->count * sizeof(float), ddp_model_stream(m));
    ddp_stream_sync(ddp_model_stream(m));
}
/* p->grad += g (as autograd accumulates), on p's device. */
static void add_grad(ddp_model* m, ddp_param* p, const double* g) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    float tmp[GB * H * 2];
    size_t i;
    fetch(m, p, p->grad, tmp);
    for (i = 0; i < p->count; i++) tmp[i] += (float)g[i];
    ddp_copy(p->device, p->grad, cpu, tmp, p->count * sizeof(float), ddp_model_stream(m));
    ddp_stream_sync(ddp_model_stream(m));
}

static float* const* g_flat; /* net_build_in's flat buffers, and how far they are handed out */
static size_t g_flat_at;
static ddp_status add(ddp_model* m, const char* name, int d0, int d1, ddp_init_kind init, float scale, int u,
                      int no_decay, ddp_param** out) {
    ddp_tensor_desc t;
    memset(&t, 0, sizeof t);
    t.name = name, t.ndim = d1 ? 2 : 1, t.shape[0] = d0, t.shape[1] = d1;
    t.init = init, t.scale = scale, t.unit = u, t.no_decay = no_decay;
    if (g_flat) { /* the next slices of the caller's buffers */
        t.data = g_flat[0] + g_flat_at, t.grad = g_flat[1] + g_flat_at;
        g_flat_at += (size_t)d0 * (d1 ? d1 : 1);
    }
    return ddp_model_add(m, &t, out);
}

/* With flat (CPU only), every tensor's data and gradient are slices of flat[0] and flat[1], as
   llm.c keeps its weights: ddp.h adopts them, and the values in flat[0] are the start. */
static int net_build_in(net* t, ddp_device dev, uint64_t seed, float* const* flat);
static int net_build(net* t, ddp_device dev, uint64_t seed) { return net_build_in(t, dev, seed, NULL); }
static int net_build_in(net* t, ddp_device dev, uint64_t seed, float* const* flat) {
    ddp_model_desc md;
    memset(t, 0, sizeof *t);
    memset(&md, 0, sizeof md);
    md.device = dev, md.seed = seed;
    if (ddp_model_create(&md, &t->m) != DDP_OK) return 1;
    g_flat = flat, g_flat_at = 0;
    if (add(t->m, "shift", F, 0, DDP_INIT_NORMAL, 0.1f, 0, 1, &t->shift) != DDP_OK ||
        add(t->m, "fc1.weight", H, F, DDP_INIT_UNIFORM, 0.45f, 1, 0, &t->w1) != DDP_OK ||
        add(t->m, "fc1.bias", H, 0, DDP_INIT_UNIFORM, 0.45f, 1, 1, &t->b1) != DDP_OK ||
        add(t->m, "ln.weight", H, 0, DDP_INIT_ONES, 0, 1, 1, &t->g) != DDP_OK ||
        add(t->m, "ln.bias", H, 0, DDP_INIT_ZEROS, 0, 1, 1, &t->beta) != DDP_OK ||
        add(t->m, "head.weight", C, H, DDP_INIT_NORMAL, 0.3f, 2, 0, &t->w2) != DDP_OK ||
        add(t->m, "out.bias", C, 0, DDP_INIT_ZEROS, 0, 0, 1, &t->obias) != DDP_OK)
        return 2;
    return 0;
}

#define TRY(call) do { ddp_status s_ = (call); if (s_ != DDP_OK) return s_; } while (0)

/* loss = cross_entropy(relu(LN(x + shift) W1^T + b1)) W2^T + obias, y), mean over the B rows. */
static ddp_status net_forward(net* t, const float* x, const int* y, int B, double* loss);
/* loss / accum, as nanoGPT divides it under gradient accumulation: the micro-batches' gradients
   then add up to the mean over all their rows */
static ddp_status net_forward_scaled(net* t, const float* x, const int* y, int B, double scale, double* loss) {
    int i;
    ddp_status s = net_forward(t, x, y, B, loss);
    for (i = 0; i < B * C; i++) t->dl[i] *= scale;
    *loss *= scale;
    return s;
}
static ddp_status net_forward(net* t, const float* x, const int* y, int B, double* loss) {
    float shift[F], obias[C], w1[H * F], b1[H], g[H], beta[H], w2[C * H];
    double a[GB * H], z[GB * C], sum = 0;
    int r, i, j;
    ddp_model* m = t->m;
    t->B = B;
    TRY(ddp_unit_begin(m, 0, DDP_FORWARD));
    fetch(m, t->shift, t->shift->data, shift); /* unit 0's tensors: valid through the whole forward */
    fetch(m, t->obias, t->obias->data, obias);
    for (r = 0; r < B; r++)
        for (j = 0; j < F; j++) t->h0[r * F + j] = x[r * F + j] + shift[j];
    TRY(ddp_unit_begin(m, 1, DDP_FORWARD)); /* ZeRO-3 gathers unit 1 here: read p->data after it */
    fetch(m, t->w1, t->w1->data, w1), fetch(m, t->b1, t->b1->data, b1);
    fetch(m, t->g, t->g->data, g), fetch(m, t->beta, t->beta->data, beta);
    for (r = 0; r < B; r++) {
        double mu = 0, var = 0;
        for (i = 0; i < H; i++) {
            double s = b1[i];
            for (j = 0; j < F; j++) s += t->h0[r * F + j] * w1[i * F + j];
            a[r * H + i] = s, mu += s;
        }
        mu /= H;
        for (i = 0; i < H; i++) var += (a[r * H + i] - mu) * (a[r * H + i] - mu);
        t->inv[r] = 1.0 / sqrt(var / H + 1e-5);
        for (i = 0; i < H; i++) {
            t->nhat[r * H + i] = (a[r * H + i] - mu) * t->inv[r];
            t->n[r * H + i] = t->nhat[r * H + i] * g[i] + beta[i];
            t->r[r * H + i] = t->n[r * H + i] > 0 ? t->n[r * H + i] : 0;
        }
    }
    TRY(ddp_unit_end(m, 1, DDP_FORWARD));
    TRY(ddp_unit_begin(m, 2, DDP_FORWARD));
    fetch(m, t->w2, t->w2->data, w2);
    for (r = 0; r < B; r++)
        for (i = 0; i < C; i++) {
            double s = obias[i];
            for (j = 0; j < H; j++) s += t->r[r * H + j] * w2[i * H + j];
            z[r * C + i] = s;
        }
    TRY(ddp_unit_end(m, 2, DDP_FORWARD));
    for (r = 0; r < B; r++) {
        double mx = z[r * C], e = 0;
        for (i = 1; i < C; i++) mx = z[r * C + i] > mx ? z[r * C + i] : mx;
        for (i = 0; i < C; i++) e += exp(z[r * C + i] - mx);
        sum += mx + log(e) - z[r * C + y[r]];
        for (i = 0; i < C; i++) t->dl[r * C + i] = (exp(z[r * C + i] - mx) / e - (i == y[r])) / B;
    }
    *loss = sum / B;
    return ddp_unit_end(m, 0, DDP_FORWARD);
}

static ddp_status net_backward(net* t) {
    float w1[H * F], g[H], w2[C * H];
    double gw1[H * F], gb1[H], gg[H], gbeta[H], gw2[C * H], gshift[F], gob[C];
    double dr[GB * H], da[GB * H];
    int r, i, j, B = t->B;
    ddp_model* m = t->m;
    memset(gw1, 0, sizeof gw1), memset(gb1, 0, sizeof gb1), memset(gg, 0, sizeof gg);
    memset(gbeta, 0, sizeof gbeta), memset(gw2, 0, sizeof gw2), memset(gshift, 0, sizeof gshift);
    memset(gob, 0, sizeof gob);
    TRY(ddp_unit_begin(m, 0, DDP_BACKWARD));
    for (r = 0; r < B; r++)
        for (i = 0; i < C; i++) gob[i] += t->dl[r * C + i];
    add_grad(m, t->obias, gob);
    TRY(ddp_param_grad_ready(t->obias)); /* unit 0's: ready whenever final, here first */
    TRY(ddp_unit_begin(m, 2, DDP_BACKWARD));
    fetch(m, t->w2, t->w2->data, w2);
    for (r = 0; r < B; r++)
        for (i = 0; i < C; i++)
            for (j = 0; j < H; j++) gw2[i * H + j] += t->dl[r * C + i] * t->r[r * H + j];
    add_grad(m, t->w2, gw2);
    TRY(ddp_param_grad_ready(t->w2));
    for (r = 0; r < B; r++)
        for (j = 0; j < H; j++) {
            double s = 0;
            for (i = 0; i < C; i++) s += t->dl[r * C + i] * w2[i * H + j];
            dr[r * H + j] = t->n[r * H + j] > 0 ? s : 0; /* through the ReLU: dn */
        }
    TRY(ddp_unit_end(m, 2, DDP_BACKWARD));
    TRY(ddp_unit_begin(m, 1, DDP_BACKWARD));
    fetch(m, t->w1, t->w1->data, w1), fetch(m, t->g, t->g->data, g);
    for (r = 0; r < B; r++) {
        double m1 = 0, m2 = 0;
        for (i = 0; i < H; i++) {
            double dnh = dr[r * H + i] * g[i];
            gg[i] += dr[r * H + i] * t->nhat[r * H + i];
            gbeta[i] += dr[r * H + i];
            m1 += dnh, m2 += dnh * t->nhat[r * H + i];
        }
        m1 /= H, m2 /= H;
        for (i = 0; i < H; i++)
            da[r * H + i] = t->inv[r] * (dr[r * H + i] * g[i] - m1 - t->nhat[r * H + i] * m2);
    }
    add_grad(m, t->g, gg), add_grad(m, t->beta, gbeta);
    TRY(ddp_param_grad_ready(t->beta));
    TRY(ddp_param_grad_ready(t->g));
    for (r = 0; r < B; r++)
        for (i = 0; i < H; i++) {
            gb1[i] += da[r * H + i];
            for (j = 0; j < F; j++) gw1[i * F + j] += da[r * H + i] * t->h0[r * F + j];
        }
    add_grad(m, t->b1, gb1), add_grad(m, t->w1, gw1);
    TRY(ddp_param_grad_ready(t->b1));
    TRY(ddp_param_grad_ready(t->w1));
    for (r = 0; r < B; r++)
        for (j = 0; j < F; j++)
            for (i = 0; i < H; i++) gshift[j] += da[r * H + i] * w1[i * F + j];
    TRY(ddp_unit_end(m, 1, DDP_BACKWARD));
    if (!t->skip_shift) {
        add_grad(m, t->shift, gshift);
        TRY(ddp_param_grad_ready(t->shift)); /* unit 0's other tensor: final only at the very end */
    }
    return ddp_unit_end(m, 0, DDP_BACKWARD); /* DDP waits for its all-reduces here */
}

/* ---- the run: configurations, ranks, the one-process reference ------------------------------------ */

typedef struct cfg {
    int zero, prefetch, adamw, accum, view;
    size_t cap;
    float clip;     /* max_norm; 0: no clipping */
    int local_clip; /* the classic bug, for the mutation check: the norm of this rank's shard only */
    int from, to;   /* train steps [from, to) (to 0: STEPS) */
    const char* load; /* a snapshot to resume from before step `from` */
    const char* save; /* where rank 0 writes one after step `to` (consolidated first) */
    int uneven;     /* Join: rank r trains g_uneven[r] steps of GB / W rows, then joins */
    int adopt;      /* the tensors are slices of one flat buffer of the test's (CPU only) */
    ddp_dtype compress; /* the buckets all-reduced in 16 bits */
    int unused;     /* `shift` gets no gradient: find_unused_parameters */
} cfg;
static const int g_uneven[3] = {STEPS, STEPS - 4, STEPS - 9};

static void global_batch(int step, float* x, int* y) {
    ddp_rng r = ddp_rng_seed(5000 + (uint64_t)step);
    int i;
    for (i = 0; i < GB * F; i++) x[i] = 2.f * ddp_rng_uniform(&r) - 1.f;
    for (i = 0; i < GB; i++) y[i] = (int)ddp_rng_below(&r, C);
}
/* nanoGPT's schedule in a few lines: linear warmup over 5 steps, then cosine down to a tenth. */
static float lr_at(const cfg* c, int step) {
    float top = c->adamw ? 0.02f : 0.1f, low = top / 10;
    if (step < 5) return top * (step + 1) / 5;
    return low + 0.5f * (top - low) * (1.f + cosf(3.14159265f * (step - 5) / (STEPS - 5)));
}
static ddp_optim* make_optim(ddp_model* m, const cfg* c) {
    ddp_optim_desc od;
    ddp_optim* o = NULL;
    memset(&od, 0, sizeof od);
    od.kind = c->adamw ? DDP_ADAMW : DDP_SGD;
    od.lr = lr_at(c, 0);
    if (c->adamw) od.beta1 = 0.9f, od.beta2 = 0.95f, od.weight_decay = 0.1f;
    else od.momentum = 0.9f;
    if (ddp_optim_create(m, &od, &o) != DDP_OK) return NULL;
    return o;
}
static size_t all_weights(net* t, float* out) {
    size_t n = 0;
    int i;
    for (i = 0; i < ddp_model_num_params(t->m); i++) {
        ddp_param* p = ddp_model_param(t->m, i);
        fetch(t->m, p, p->data, out + n);
        n += p->count;
    }
    return n;
}

/* ZeRO-3 with units: a rank holds its shard of each unit (S = ceil(n / W) numbers) and, while one
   is in use, the whole unit (W S): unit 0's for the whole forward and backward, and one other at a
   time, or with prefetch two neighbours. The most it held at once must be exactly that; between
   steps it keeps the shards and the buffers units are gathered into (one the size of the largest
   unit, or with prefetch one per parity). Gradients: the shards and the two parity buffers (unit
   0's own buffer, held through backward, is given back at its end). */
static int check_zero3_memory(int rank, int W, const cfg* c, ddp_wrapper* w) {
    const size_t n[3] = {F + C, H * F + 3 * H, C * H}; /* units 0, 1, 2 */
    size_t S[3], shards = 0, root, peak, between, grads;
    ddp_wrap_stats st;
    int u;
    for (u = 0; u < 3; u++) S[u] = (n[u] + W - 1) / W, shards += S[u];
    root = W * S[0];
    peak = 4 * (shards + root + (c->prefetch ? W * S[1] + W * S[2] : (S[1] > S[2] ? W * S[1] : W * S[2])));
    between = 4 * (shards + (c->prefetch ? W * S[1] + W * S[2] : (S[1] > S[2] ? W * S[1] : W * S[2])));
    grads = 4 * (shards + W * S[1] + W * S[2]);
    ddp_wrapper_stats(w, &st);
    if (rank == 0 && W == 4)
        printf("    ZeRO-3 with units on 4 ranks%s: weights held at most %zu bytes at once (the model: %zu; the "
               "shards: %zu), %zu between steps; gradients %zu\n", c->prefetch ? ", prefetch" : "", st.param_peak_bytes,
               4 * (n[0] + n[1] + n[2]), 4 * shards, st.param_bytes, st.grad_bytes);
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
    net t;
    ddp_optim* o;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    float x[GB * F], weights[512], norms[STEPS] = {0};
    static float flat_data[512], flat_grad[512];
    float* const flat[2] = {flat_data, flat_grad};
    int y[GB], step, k, W, per, accum = c->accum > 1 ? c->accum : 1;
    double loss;
    char path[128];
    memset(&d, 0, sizeof d);
    d.device.type = g_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) return printf("    rank %d: ddp_init: %s\n", rank, ddp_error_string()), 10;
    W = ddp_world_size(pg);
    if (c->adopt) { /* the start ddp.h would draw, copied into the flat buffer that the model then adopts */
        net first;
        size_t at = 0;
        if (net_build(&first, ddp_pg_device(pg), 100 + (uint64_t)rank * 17)) return 11;
        for (k = 0; k < ddp_model_num_params(first.m); k++) {
            ddp_param* p = ddp_model_param(first.m, k);
            memcpy(flat[0] + at, p->data, p->count * 4), at += p->count;
        }
        ddp_model_destroy(first.m);
        memset(flat_grad, 0, sizeof flat_grad);
    }
    if (net_build_in(&t, ddp_pg_device(pg), 100 + (uint64_t)rank * 17, c->adopt ? flat : NULL))
        return 11; /* rank 0's weights win */
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = c->zero, wd.prefetch = c->prefetch, wd.gradient_as_bucket_view = c->view;
    wd.bucket_cap_bytes = wd.first_bucket_bytes = c->cap;
    wd.uneven_inputs = c->uneven;
    wd.compress = c->compress, wd.find_unused_parameters = c->unused;
    t.skip_shift = c->unused;
    if (ddp_wrap(pg, t.m, &wd, &w) != DDP_OK) return printf("    rank %d: ddp_wrap: %s\n", rank, ddp_error_string()), 12;
    if (!(o = make_optim(t.m, c))) return 13;
    if (c->load) {
        ddp_snapshot snap;
        memset(&snap, 0, sizeof snap);
        snap.model = t.m, snap.optim = o;
        if (ddp_snapshot_load(&snap, c->load) != DDP_OK)
            return printf("    rank %d: ddp_snapshot_load: %s\n", rank, ddp_error_string()), 20;
    }
    per = GB / (W * accum);
    for (step = c->from; step < (c->to ? c->to : STEPS) && (!c->uneven || step < g_uneven[rank]); step++) {
        global_batch(step, x, y);
        if (ddp_optim_set_lr(o, lr_at(c, step)) != DDP_OK || ddp_model_zero_grad(t.m) != DDP_OK) return 14;
        for (k = 0; k < accum; k++) {
            int row = (k * W + rank) * per;
            ddp_no_sync(w, k < accum - 1);
            if (net_forward_scaled(&t, x + row * F, y + row, per, 1.0 / accum, &loss) != DDP_OK ||
                net_backward(&t) != DDP_OK)
                return printf("    rank %d step %d: %s\n", rank, step, ddp_error_string()), 15;
        }
        norms[step] = 0;
        if (c->clip > 0) {
            if (c->local_clip) ddp__clip_local_only = 1;
            if (ddp_optim_clip_grad_norm(o, c->clip, &norms[step]) != DDP_OK)
                return printf("    rank %d: clip: %s\n", rank, ddp_error_string()), 16;
        }
        if (ddp_optim_step(o) != DDP_OK) return printf("    rank %d: step: %s\n", rank, ddp_error_string()), 17;
    }
    if (c->uneven && ddp_join(w) != DDP_OK) return printf("    rank %d: ddp_join: %s\n", rank, ddp_error_string()), 22;
    if (c->save) {
        ddp_snapshot snap;
        memset(&snap, 0, sizeof snap);
        snap.model = t.m, snap.optim = o, snap.step = c->to;
        if (ddp_optim_consolidate(o, 0) != DDP_OK || (rank == 0 && ddp_snapshot_save(&snap, c->save) != DDP_OK))
            return printf("    rank %d: consolidating and saving: %s\n", rank, ddp_error_string()), 23;
    }
    if (c->zero == 3 && check_zero3_memory(rank, W, c, w)) return 21;
    if (c->compress) { /* every step, every number went as 2 bytes */
        ddp_wrap_stats st;
        ddp_wrapper_stats(w, &st);
        if (st.bytes_reduced != (uint64_t)STEPS * ddp_model_num_elements(t.m) * 2)
            return printf("    rank %d: %llu bytes all-reduced in 16 bits, expected %llu\n", rank,
                          (unsigned long long)st.bytes_reduced,
                          (unsigned long long)STEPS * ddp_model_num_elements(t.m) * 2), 25;
    }
    if (ddp_full_params(w, 1) != DDP_OK) return 18;
    snprintf(path, sizeof path, "%s/w%d.bin", g_dir, rank);
    h_save_floats(path, weights, all_weights(&t, weights));
    if (ddp_full_params(w, 0) != DDP_OK) return 19;
    snprintf(path, sizeof path, "%s/n%d.bin", g_dir, rank);
    h_save_floats(path, norms, STEPS);
    ddp_wrapper_destroy(w); /* under ZeRO-3 collective: every weight back in the model's arrays */
    if (c->adopt) { /* which are the flat buffer: the trained weights are there, the gradients too */
        size_t n = all_weights(&t, weights);
        if (memcmp(weights, flat_data, n * 4) || t.w1->data != flat_data + F || t.w1->grad != flat_grad + F)
            return printf("    rank %d: the flat buffer does not hold the model's weights after the wrapper went\n",
                          rank), 24;
    }
    ddp_optim_destroy(o);
    ddp_model_destroy(t.m);
    ddp_destroy(pg);
    return 0;
}

static size_t reference(const cfg* c, float* weights, float* norms) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    net t;
    ddp_optim* o;
    float x[GB * F];
    int y[GB], step;
    double loss;
    size_t n;
    if (net_build(&t, cpu, 100)) return 0;
    t.skip_shift = c->unused;
    o = make_optim(t.m, c);
    for (step = 0; step < STEPS; step++) {
        global_batch(step, x, y);
        ddp_optim_set_lr(o, lr_at(c, step));
        ddp_model_zero_grad(t.m);
        if (c->uneven) { /* Join's rule: the ranks still training add their mean gradients, divided by all 3 */
            int r;
            for (r = 0; r < 3; r++)
                if (step < g_uneven[r]) {
                    CHECK_OK(net_forward_scaled(&t, x + r * (GB / 3) * F, y + r * (GB / 3), GB / 3, 1.0 / 3, &loss));
                    CHECK_OK(net_backward(&t));
                }
        } else {
            CHECK_OK(net_forward(&t, x, y, GB, &loss));
            CHECK_OK(net_backward(&t));
        }
        norms[step] = 0;
        if (c->clip > 0) CHECK_OK(ddp_optim_clip_grad_norm(o, c->clip, &norms[step]));
        ddp_optim_step(o);
    }
    n = all_weights(&t, weights);
    ddp_optim_destroy(o);
    ddp_model_destroy(t.m);
    return n;
}


/* Run W ranks with c; the relative L2 distance of the weights from one process's (and of the
   norms from its norms), every rank's weights bit-identical to rank 0's. -1 when not run. */
static double compare_ranks(int W, const cfg* c, double* norm_err) {
    float ref[512], refn[STEPS], first[512], got[512], nrm[STEPS];
    size_t n, k;
    double num = 0, den = 0, nn = 0, nd = 0;
    char path[128];
    int r;
    *norm_err = 0;
    n = reference(c, ref, refn);
    for (r = 0; r < W; r++) {
        snprintf(path, sizeof path, "%s/w%d.bin", g_dir, r);
        if (h_load_floats(path, r ? got : first, 512) != n) return 1e9;
        if (r && memcmp(first, got, n * 4)) return printf("    rank %d's weights differ from rank 0's\n", r), 1e9;
        snprintf(path, sizeof path, "%s/n%d.bin", g_dir, r);
        if (h_load_floats(path, nrm, STEPS) != STEPS) return 1e9;
        for (k = 0; k < STEPS; k++) /* the steps this rank took (Join: until it ran out) */
            if (!c->uneven || (int)k < g_uneven[r])
                nn += (nrm[k] - refn[k]) * (double)(nrm[k] - refn[k]), nd += (double)refn[k] * refn[k];
    }
    for (k = 0; k < n; k++) num += (first[k] - ref[k]) * (double)(first[k] - ref[k]), den += (double)ref[k] * ref[k];
    *norm_err = nd > 0 ? sqrt(nn / nd) : 0;
    return sqrt(num / den);
}
static double equivalence(int W, const cfg* c, double* norm_err) {
    *norm_err = 0;
    if (g_gpu && W > g_gpus) return -1;
    if (ddp_spawn(W, train_rank, (void*)c) != DDP_OK) {
        printf("    W=%d zero_stage=%d: %s\n", W, c->zero, ddp_error_string());
        return 1e9;
    }
    return compare_ranks(W, c, norm_err);
}

static void run_case(int W, cfg c, double tol, double* worst, int* runs) {
    double ne, e = equivalence(W, &c, &ne);
    if (e < 0) return;
    CHECKF(e <= tol && ne <= tol,
           "W=%d zero_stage=%d %s accum=%d clip=%g: weights %.3g, norms %.3g relative from one process (limit %g)", W,
           c.zero, c.adamw ? "AdamW" : "SGD", c.accum, c.clip, e, ne, tol);
    if (e > *worst) *worst = e;
    if (ne > *worst) *worst = ne;
    (*runs)++;
}

/* 1-4 ranks, SGD with momentum and AdamW with parameter groups, stages 0-3 (3 with and without
   prefetch), a schedule set before each step, clipping at every stage. */
static void own_model_equivalence(void) {
    double worst[4] = {0, 0, 0, 0}, tol = g_gpu ? 1e-4 : 2e-5;
    int runs[4] = {0, 0, 0, 0}, W, stage, adamw;
    for (stage = 0; stage <= 3; stage++)
        for (W = 1; W <= 4; W++)
            for (adamw = g_gpu || H_TSAN; adamw < 2; adamw++) { /* on GPUs (the stand-in's NCCL), TSan: AdamW only */
                cfg c;
                memset(&c, 0, sizeof c);
                c.zero = stage, c.adamw = adamw, c.prefetch = stage == 3 && W % 2;
                c.cap = stage == 0 && adamw ? 1 : 0; /* stage 0: one bucket per tensor, and one bucket */
                c.view = stage == 0 && W == 2;
                c.clip = W == 3 ? 0.f : 0.5f;
                run_case(W, c, tol, &worst[stage], &runs[stage]);
            }
    printf("    worst relative difference from one process (weights or clipped norms): stage 0 %.3g, 1 %.3g, "
           "2 %.3g, 3 %.3g (%d, %d, %d, %d runs)\n", worst[0], worst[1], worst[2], worst[3], runs[0], runs[1], runs[2],
           runs[3]);
}

/* no_sync: 2 ranks x 3 micro-batches, and 3 x 2, at every stage, clipped after the synchronised one. */
static void own_model_no_sync(void) {
    double worst = 0, tol = g_gpu ? 1e-4 : 2e-5;
    int runs = 0, stage;
    for (stage = 0; stage <= 3; stage++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.zero = stage, c.adamw = stage % 2, c.accum = 3, c.clip = 0.5f;
        run_case(2, c, tol, &worst, &runs);
        c.accum = 2;
        if (!g_gpu) run_case(3, c, tol, &worst, &runs);
    }
    printf("    no_sync with clipping: worst relative difference %.3g over %d runs\n", worst, runs);
}

/* The tensors as slices of one flat buffer of the caller's (llm.c's layout), adopted: the same
   weights as one process at every stage, bucket views too, and after the wrapper is gone the
   buffer holds the trained weights (ZeRO-3 gathers them back into it). */
static void adopted_flat_buffer(void) {
    double worst = 0, tol = 2e-5;
    int runs = 0, stage;
    for (stage = 0; stage <= 3; stage++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.adopt = 1, c.zero = stage, c.adamw = 1, c.clip = 0.5f, c.view = stage == 0;
        run_case(stage == 3 ? 3 : 2, c, tol, &worst, &runs);
    }
    printf("    adopted slices of one buffer: worst relative difference %.3g over %d runs\n", worst, runs);
}

/* bf16 and f16 buckets, and a tensor that never gets a gradient (find_unused_parameters: it counts
   as zero, at every stage). Compression: every rank the same weights, near one process's but not
   equal to them (the gradients were rounded), every number sent as 2 bytes (train_rank). */
static void compression_and_unused_tensors(void) {
    double worst = 0, ne, e, tol = g_gpu ? 1e-4 : 2e-5;
    int runs = 0, stage, k;
    for (k = 0; k < 2; k++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.compress = k ? DDP_F16 : DDP_BF16, c.adamw = 1, c.clip = 0.5f, c.cap = 1;
        e = equivalence(2, &c, &ne);
        if (e < 0) continue;
        CHECKF(e > 1e-7 && e < 2e-2, "%s buckets: the weights are %.3g relative from one process in f32 (expected "
               "between 1e-7 and 2e-2)", k ? "f16" : "bf16", e);
        printf("    %s buckets, 2 ranks: %.3g relative from one process in f32\n", k ? "f16" : "bf16", e);
    }
    for (stage = 0; stage <= 3; stage += 3) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.unused = 1, c.zero = stage, c.clip = 0.5f;
        run_case(2, c, tol, &worst, &runs);
    }
    printf("    a tensor without a gradient, find_unused_parameters: worst %.3g over %d runs\n", worst, runs);
}

/* Overlap, by order: with a bucket per tensor, each bucket's all-reduce is issued from the tensor's
   ddp_param_grad_ready, while the backward written here goes on; none waits for its end. */
static uint64_t g_seen[8];
static int g_nseen;
static void count_hook(ddp_param* p, void* user) {
    (void)p;
    if (g_nseen < 8) g_seen[g_nseen++] = ddp_pg_collectives((ddp_pg*)user);
}
static int overlap_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    net t;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    float x[GB * F];
    int y[GB], i, bad = 0;
    double loss;
    uint64_t before, after;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (ddp_init(&d, &pg) != DDP_OK || net_build(&t, ddp_pg_device(pg), 1)) return 1;
    memset(&wd, 0, sizeof wd);
    wd.bucket_cap_bytes = wd.first_bucket_bytes = 1;
    if (ddp_wrap(pg, t.m, &wd, &w) != DDP_OK) return 2;
    for (i = 0; i < ddp_model_num_params(t.m); i++) ddp_param_add_hook(ddp_model_param(t.m, i), count_hook, pg);
    global_batch(0, x, y);
    if (net_forward(&t, x + rank * 6 * F, y + rank * 6, 6, &loss) != DDP_OK) return 3;
    before = ddp_pg_collectives(pg);
    if (net_backward(&t) != DDP_OK) return 4;
    after = ddp_pg_collectives(pg);
    /* the hooks run after the reducer's: the k-th tensor's bucket is the k-th collective */
    for (i = 0; i < g_nseen; i++) bad += g_seen[i] != before + (uint64_t)i + 1;
    bad += g_nseen != 7 || after != before + 7;
    if (bad) {
        printf("    rank %d: %llu collectives before backward, %llu after; after each tensor's mark:", rank,
               (unsigned long long)before, (unsigned long long)after);
        for (i = 0; i < g_nseen; i++) printf(" %llu", (unsigned long long)g_seen[i]);
        printf("\n");
    }
    ddp_wrapper_destroy(w);
    ddp_model_destroy(t.m);
    ddp_destroy(pg);
    return bad;
}
static void buckets_go_during_your_backward(void) { CHECK_OK(ddp_spawn(2, overlap_rank, NULL)); }

/* The classic bug: each rank clips by the norm of its own shard. It must be caught. */
static void clipping_on_the_local_shard_is_caught(void) {
    int stage;
    for (stage = 1; stage <= 3; stage++) {
        cfg c;
        double ne, e;
        memset(&c, 0, sizeof c);
        c.zero = stage, c.adamw = 1, c.clip = 0.5f, c.local_clip = 1;
        e = equivalence(2, &c, &ne);
        CHECKF(e > 1e-3 && ne > 1e-3, "zero_stage %d: clipping by the local shard's norm ended %.3g (weights) and "
               "%.3g (norms) from one process: the test would not see the bug", stage, e, ne);
        printf("    zero_stage %d, clipping by the local shard's norm: weights %.3g, norms %.3g from one process\n",
               stage, e, ne);
    }
    ddp__clip_local_only = 0;
}

/* Join: 3 ranks run out of batches after 30, 26 and 21 steps, each clipping every step; the
   weights must follow Join's rule (the active ranks' gradients, divided by the world size, then
   clipped), which the reference applies by hand. */
static void clipping_with_join(void) {
    double ne, e, tol = g_gpu ? 1e-4 : 2e-5;
    cfg c;
    if (g_gpu && g_gpus < 3) SKIP("NCCL needs a GPU for each of the 3 ranks");
    memset(&c, 0, sizeof c);
    c.uneven = 1, c.clip = 0.5f, c.adamw = 1;
    e = equivalence(3, &c, &ne);
    CHECKF(e <= tol && ne <= tol, "Join with clipping: weights %.3g, norms %.3g from the rule (limit %g)", e, ne, tol);
    printf("    Join, 3 ranks with 30, 26 and 21 steps, clipped: weights %.3g, norms %.3g from the rule\n", e, ne);
}

/* A snapshot of the model of one's own: N ranks train half the steps, rank 0 saves (its tensors
   under their names, the optimizer's settings, the learning rate set last); M ranks, sharded
   another way, resume and end where one unbroken process ends. */
static void own_model_snapshot_resumes(void) {
    static const int runs[3][4] = {{2, 3, 3, 1}, {3, 0, 2, 3}, {1, 2, 4, 0}}; /* W, stage, then W, stage */
    double worst = 0, e, tol = g_gpu ? 1e-4 : 2e-5;
    char path[128];
    int k;
    snprintf(path, sizeof path, "%s/own.safetensors", g_dir);
    for (k = 0; k < 3; k++) {
        cfg a, b;
        float ref[512], refn[STEPS], got[512];
        size_t n;
        if (g_gpu && (k > 0 || runs[k][0] > g_gpus || runs[k][2] > g_gpus)) continue; /* GPUs: one of them */
        memset(&a, 0, sizeof a);
        a.adamw = 1, a.clip = 0.5f, a.zero = runs[k][1], a.to = STEPS / 2, a.save = path;
        b = a;
        b.zero = runs[k][3], b.from = STEPS / 2, b.to = 0, b.save = NULL, b.load = path;
        n = reference(&a, ref, refn);
        CHECK_OK(ddp_spawn(runs[k][0], train_rank, &a));
        CHECK_OK(ddp_spawn(runs[k][2], train_rank, &b));
        snprintf(path, sizeof path, "%s/w0.bin", g_dir);
        CHECK(h_load_floats(path, got, 512) == n);
        snprintf(path, sizeof path, "%s/own.safetensors", g_dir);
        {
            double num = 0, den = 1e-30;
            size_t i;
            for (i = 0; i < n; i++) num += (got[i] - ref[i]) * (double)(got[i] - ref[i]), den += (double)ref[i] * ref[i];
            e = sqrt(num / den);
        }
        CHECKF(e <= tol, "stage %d on %d ranks, resumed with stage %d on %d: %.3g from one process (limit %g)",
               runs[k][1], runs[k][0], runs[k][3], runs[k][2], e, tol);
        printf("    AdamW, clipped: zero_stage %d on %d ranks, resumed with zero_stage %d on %d: %.3g relative from one "
               "process\n", runs[k][1], runs[k][0], runs[k][3], runs[k][2], e);
        if (e > worst) worst = e;
    }
}

/* What the snapshot keeps of the optimizer: the learning rate set last, betas, eps, decay; and a
   file whose tensors take decay differently (other parameter groups) is refused. */
static void snapshot_keeps_the_optimizer_settings(void) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    net t, u;
    ddp_optim *o, *p;
    ddp_optim_desc od;
    ddp_snapshot snap;
    char path[128];
    cfg c;
    memset(&c, 0, sizeof c);
    c.adamw = 1;
    snprintf(path, sizeof path, "%s/settings.safetensors", g_dir);
    if (net_build(&t, cpu, 3) || net_build(&u, cpu, 4) || !(o = make_optim(t.m, &c))) {
        CHECKF(0, "building: %s", ddp_error_string());
        return;
    }
    CHECK_OK(ddp_optim_set_lr(o, 0.0123f));
    memset(&snap, 0, sizeof snap);
    snap.model = t.m, snap.optim = o;
    CHECK_OK(ddp_snapshot_save(&snap, path));
    memset(&od, 0, sizeof od);
    od.kind = DDP_ADAMW, od.lr = 1.f, od.weight_decay = 0.5f; /* other settings: the file's win */
    CHECK_OK(ddp_optim_create(u.m, &od, &p));
    snap.model = u.m, snap.optim = p;
    CHECK_OK(ddp_snapshot_load(&snap, path));
    CHECK(p->d.lr == 0.0123f && p->d.beta1 == 0.9f && p->d.beta2 == 0.95f && p->d.weight_decay == 0.1f &&
          p->d.eps == 1e-8f);
    u.b1->no_decay = 0; /* fc1.bias now decays: another parameter group */
    CHECK_FAILS(ddp_snapshot_load(&snap, path), DDP_ERR_CHECKPOINT, "the parameter groups differ");
    CHECK_FAILS(ddp_optim_set_lr(p, -1.f), DDP_ERR_INVALID_ARGUMENT, "not a learning rate");
    CHECK_FAILS(ddp_optim_clip_grad_norm(p, 0.f, NULL), DDP_ERR_INVALID_ARGUMENT, "max_norm");
    ddp_optim_destroy(o), ddp_optim_destroy(p);
    ddp_model_destroy(t.m), ddp_model_destroy(u.m);
}

/* ---- ddp_model_mlp's MLP, and the same MLP described tensor by tensor ------------------------------ */

/* The described MLP's backward: its gradients are those of `calc`, an MLP of ddp_model_mlp's with
   the same weights, announced layer by layer as ddp_model_backward announces them. */
static ddp_status described_backward(ddp_model* b, ddp_model* calc, const float* x, const int* y, int B) {
    int i, k;
    float loss;
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    for (i = 0; i < ddp_model_num_params(b); i++) {
        ddp_param *p = ddp_model_param(b, i), *q = ddp_model_param(calc, i);
        ddp_copy(cpu, q->data, cpu, p->data, p->count * 4, NULL);
    }
    TRY(ddp_model_zero_grad(calc));
    TRY(ddp_model_forward(calc, x, B));
    TRY(ddp_loss_cross_entropy(calc, y, &loss));
    TRY(ddp_model_backward(calc));
    TRY(ddp_unit_begin(b, 0, DDP_BACKWARD));
    for (k = ddp_model_num_params(b) / 2; k >= 1; k--) {
        ddp_param *wb = ddp_model_param(b, 2 * k - 2), *bb = ddp_model_param(b, 2 * k - 1);
        TRY(ddp_unit_begin(b, k, DDP_BACKWARD));
        for (i = 0; i < (int)bb->count; i++) bb->grad[i] += ddp_model_param(calc, 2 * k - 1)->grad[i];
        TRY(ddp_param_grad_ready(bb));
        for (i = 0; i < (int)wb->count; i++) wb->grad[i] += ddp_model_param(calc, 2 * k - 2)->grad[i];
        TRY(ddp_param_grad_ready(wb));
        TRY(ddp_unit_end(b, k, DDP_BACKWARD));
    }
    return ddp_unit_end(b, 0, DDP_BACKWARD);
}

static int twins_rank(int rank, void* arg) {
    static const int sizes[4] = {6, 10, 8, 3};
    const int stage = *(const int*)arg;
    ddp_desc d;
    ddp_pg* pg = NULL;
    ddp_model_desc md;
    ddp_model *a, *b, *calc;
    ddp_optim *oa, *ob;
    ddp_optim_desc od;
    ddp_wrapper *wa = NULL, *wb = NULL;
    ddp_wrap_desc wd;
    float x[GB * 6], loss;
    int y[GB], k, step, W = 1, bad = 0;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (stage >= 0 && ddp_init(&d, &pg) != DDP_OK) return 1;
    if (pg) W = ddp_world_size(pg);
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU, md.seed = 7;
    if (ddp_model_mlp(&md, sizes, 4, DDP_LAYER_RELU, &a) != DDP_OK || ddp_model_mlp(&md, sizes, 4, DDP_LAYER_RELU, &calc) ||
        ddp_model_create(&md, &b) != DDP_OK)
        return 2;
    for (k = 1; k <= 3; k++) { /* Linear(in, out): U(-1/sqrt(in), 1/sqrt(in)), unit k, as ddp_model_mlp makes it */
        char name[32];
        ddp_tensor_desc t;
        memset(&t, 0, sizeof t);
        t.init = DDP_INIT_UNIFORM, t.scale = 1.f / sqrtf((float)sizes[k - 1]), t.unit = k;
        snprintf(name, sizeof name, "fc%d.weight", k);
        t.name = name, t.ndim = 2, t.shape[0] = sizes[k], t.shape[1] = sizes[k - 1];
        if (ddp_model_add(b, &t, NULL) != DDP_OK) return 3;
        snprintf(name, sizeof name, "fc%d.bias", k);
        t.ndim = 1, t.shape[1] = 0;
        if (ddp_model_add(b, &t, NULL) != DDP_OK) return 3;
    }
    for (k = 0; k < 6; k++)
        if (memcmp(ddp_model_param(a, k)->data, ddp_model_param(b, k)->data, ddp_model_param(a, k)->count * 4))
            return printf("    %s starts with other weights\n", ddp_model_param(a, k)->name), 4;
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = stage > 0 ? stage : 0;
    if (pg && (ddp_wrap(pg, a, &wd, &wa) != DDP_OK || ddp_wrap(pg, b, &wd, &wb) != DDP_OK)) return 5;
    memset(&od, 0, sizeof od);
    od.kind = DDP_ADAMW, od.lr = 0.01f, od.beta2 = 0.95f;
    if (ddp_optim_create(a, &od, &oa) != DDP_OK || ddp_optim_create(b, &od, &ob) != DDP_OK) return 6;
    for (step = 0; step < 20; step++) {
        int per = GB / W, row = (pg ? ddp_rank(pg) : 0) * per;
        ddp_rng r = ddp_rng_seed(77 + (uint64_t)step);
        for (k = 0; k < GB * 6; k++) x[k] = 2.f * ddp_rng_uniform(&r) - 1.f;
        for (k = 0; k < GB; k++) y[k] = (int)ddp_rng_below(&r, 3);
        if (ddp_model_zero_grad(a) || ddp_model_forward(a, x + row * 6, per) || ddp_loss_cross_entropy(a, y + row, &loss) ||
            ddp_model_backward(a) || ddp_model_zero_grad(b) || described_backward(b, calc, x + row * 6, y + row, per) ||
            ddp_optim_step(oa) || ddp_optim_step(ob))
            return printf("    rank %d step %d: %s\n", rank, step, ddp_error_string()), 7;
    }
    for (k = 0; k < 6; k++)
        if (memcmp(ddp_model_param(a, k)->data, ddp_model_param(b, k)->data, ddp_model_param(a, k)->count * 4))
            bad = printf("    zero_stage %d: %s differs after 20 steps\n", stage, ddp_model_param(a, k)->name);
    ddp_optim_destroy(oa), ddp_optim_destroy(ob);
    ddp_wrapper_destroy(wa), ddp_wrapper_destroy(wb);
    ddp_model_destroy(a), ddp_model_destroy(b), ddp_model_destroy(calc);
    if (pg) ddp_destroy(pg);
    return bad ? 8 : 0;
}

/* One process, then 2 ranks at stages 0, 1 and 2 (where the weights stay whole): the same start
   and, after 20 AdamW steps, the same weights to the last bit. */
static void mlp_described_tensor_by_tensor_is_bit_identical(void) {
    int stage = -1;
    CHECKF(twins_rank(0, &stage) == 0, "one process: the two MLPs differ");
    for (stage = 0; stage <= 2; stage++) CHECK_OK(ddp_spawn(2, twins_rank, &stage));
}

/* ---- misuse, refused by name -------------------------------------------------------------------- */

/* One process, no wrapper: the brackets and ddp_param_grad_ready. */
static void misuse_is_refused_by_name(void) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    net t;
    float x[GB * F];
    int y[GB];
    double loss;
    ddp_tensor_desc td;
    if (net_build(&t, cpu, 1)) {
        CHECKF(0, "building the model: %s", ddp_error_string());
        return;
    }
    global_batch(0, x, y);
    /* ready outside a backward, and a unit's tensor outside its unit's bracket */
    CHECK_FAILS(ddp_param_grad_ready(t.w2), DDP_ERR_STATE, "head.weight was marked ready outside a backward");
    /* ready twice */
    CHECK_OK(ddp_unit_begin(t.m, 0, DDP_BACKWARD));
    CHECK_OK(ddp_param_grad_ready(t.obias));
    CHECK_FAILS(ddp_param_grad_ready(t.obias), DDP_ERR_STATE, "out.bias was marked ready twice");
    CHECK_FAILS(ddp_unit_end(t.m, 0, DDP_BACKWARD), DDP_ERR_STATE, "out.bias was marked ready twice");
    /* unbalanced brackets */
    CHECK_FAILS(ddp_unit_end(t.m, 1, DDP_FORWARD), DDP_ERR_STATE, "ddp_unit_end(m, 1, DDP_FORWARD) without its "
                "ddp_unit_begin: nothing is open");
    CHECK_FAILS(ddp_unit_begin(t.m, 1, DDP_FORWARD), DDP_ERR_STATE, "outside the model's forward");
    CHECK_OK(ddp_unit_begin(t.m, 0, DDP_FORWARD));
    CHECK_FAILS(ddp_unit_begin(t.m, 0, DDP_FORWARD), DDP_ERR_STATE, "the model's forward is still open");
    CHECK_FAILS(ddp_unit_begin(t.m, 1, DDP_BACKWARD), DDP_ERR_STATE, "outside the model's backward");
    CHECK_OK(ddp_unit_begin(t.m, 1, DDP_FORWARD));
    CHECK_FAILS(ddp_unit_begin(t.m, 2, DDP_FORWARD), DDP_ERR_STATE, "while unit 1's forward is open");
    CHECK_FAILS(ddp_unit_end(t.m, 2, DDP_FORWARD), DDP_ERR_STATE, "unit 1's forward is open");
    CHECK_FAILS(ddp_unit_end(t.m, 0, DDP_FORWARD), DDP_ERR_STATE, "while unit 1's forward is open");
    CHECK_FAILS(ddp_unit_end(t.m, 1, DDP_BACKWARD), DDP_ERR_STATE, "without its ddp_unit_begin");
    CHECK_FAILS(ddp_unit_begin(t.m, 3, DDP_FORWARD), DDP_ERR_INVALID_ARGUMENT, "this model's units are 0 to 2");
    CHECK_OK(ddp_unit_end(t.m, 1, DDP_FORWARD));
    CHECK_OK(ddp_unit_end(t.m, 0, DDP_FORWARD));
    /* after all that, a whole step runs */
    CHECK_OK(net_forward(&t, x, y, GB, &loss));
    CHECK_OK(net_backward(&t));
    /* tensors described wrongly */
    memset(&td, 0, sizeof td);
    td.name = "fc1.weight", td.ndim = 1, td.shape[0] = 3;
    CHECK_FAILS(ddp_model_add(t.m, &td, NULL), DDP_ERR_INVALID_ARGUMENT, "already has a tensor named fc1.weight");
    td.name = "x", td.ndim = 5;
    CHECK_FAILS(ddp_model_add(t.m, &td, NULL), DDP_ERR_INVALID_ARGUMENT, "ndim is 5");
    td.ndim = 2, td.shape[1] = 0;
    CHECK_FAILS(ddp_model_add(t.m, &td, NULL), DDP_ERR_INVALID_ARGUMENT, "ddp_model_add(x): shape[1] is 0");
    td.name = "a\"b", td.shape[1] = 2;
    CHECK_FAILS(ddp_model_add(t.m, &td, NULL), DDP_ERR_INVALID_ARGUMENT, "without quotes");
    td.name = "x", td.unit = -1;
    CHECK_FAILS(ddp_model_add(t.m, &td, NULL), DDP_ERR_INVALID_ARGUMENT, "unit -1");
    CHECK_FAILS(ddp_model_forward(t.m, x, GB), DDP_ERR_INVALID_ARGUMENT, "runs your forward");
    ddp_model_destroy(t.m);
}

/* Wrapped on 2 ranks: the messages name the rank; a tensor without a gradient; ZeRO-3 trained on
   while ddp_full_params holds a stale copy. */
static int misuse_rank(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    net t;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    ddp_optim* o;
    cfg c;
    float x[GB * F];
    int y[GB], bad = 0, step;
    double loss;
    ddp_status s;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 30;
    if (ddp_init(&d, &pg) != DDP_OK || net_build(&t, ddp_pg_device(pg), 1)) return 1;
    memset(&wd, 0, sizeof wd);
    if (ddp_wrap(pg, t.m, &wd, &w) != DDP_OK) return 2;
    global_batch(0, x, y);
    /* a backward that never marks out.bias ready: named, with the rank, on every rank */
    s = ddp_unit_begin(t.m, 0, DDP_BACKWARD);
    if (s == DDP_OK) s = ddp_unit_end(t.m, 0, DDP_BACKWARD);
    bad += s != DDP_ERR_UNUSED_PARAMETER || !strstr(ddp_error_string(), "shift") ||
           !strstr(ddp_error_string(), rank ? "on rank 1" : "on rank 0");
    if (bad) printf("    rank %d: %s: %s\n", rank, ddp_status_name(s), ddp_error_string());
    ddp_wrapper_destroy(w);
    /* ready twice, wrapped: the rank is named */
    s = ddp_unit_begin(t.m, 0, DDP_BACKWARD);
    if (s == DDP_OK) s = ddp_param_grad_ready(t.obias);
    if (s == DDP_OK) s = ddp_param_grad_ready(t.obias);
    bad += s != DDP_ERR_STATE || !strstr(ddp_error_string(), "out.bias was marked ready twice");
    ddp_unit_end(t.m, 0, DDP_BACKWARD);
    /* ZeRO-3: a unit's tensor marked ready outside its unit's backward, where its gradient lives */
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = 3;
    if (ddp_wrap(pg, t.m, &wd, &w) != DDP_OK) return 4;
    s = ddp_unit_begin(t.m, 0, DDP_BACKWARD);
    if (s == DDP_OK) s = ddp_param_grad_ready(t.w2);
    if (s != DDP_ERR_STATE || !strstr(ddp_error_string(), "head.weight of unit 2 was marked ready on rank") ||
        !strstr(ddp_error_string(), "outside its unit's backward (no unit is open)"))
        printf("    rank %d: %s: %s\n", rank, ddp_status_name(s), ddp_error_string()), bad++;
    s = ddp_unit_end(t.m, 0, DDP_BACKWARD); /* said again at the end, where every rank still meets */
    if (s != DDP_ERR_STATE || !strstr(ddp_error_string(), "head.weight of unit 2"))
        printf("    rank %d: the backward's end: %s: %s\n", rank, ddp_status_name(s), ddp_error_string()), bad++;
    ddp_wrapper_destroy(w);
    /* ZeRO-3, Adam, ddp_full_params(w, 1) before step 4 and never turned off: step 4's forward may
       use the gathered weights (no step has changed them), step 5's may not */
    memset(&wd, 0, sizeof wd);
    wd.zero_stage = 3;
    memset(&c, 0, sizeof c);
    c.adamw = 1;
    if (ddp_wrap(pg, t.m, &wd, &w) != DDP_OK || !(o = make_optim(t.m, &c))) return 3;
    for (step = 1, s = DDP_OK; step <= 5 && s == DDP_OK; step++) {
        if (step == 4) s = ddp_full_params(w, 1);
        if (s == DDP_OK) s = ddp_model_zero_grad(t.m);
        if (s == DDP_OK) s = net_forward(&t, x, y, GB / 2, &loss);
        if (s == DDP_OK) s = net_backward(&t);
        if (s == DDP_OK) s = ddp_optim_step(o);
    }
    if (s != DDP_ERR_STATE || step != 6 || !strstr(ddp_error_string(), "ddp_full_params(w, 1) is in force")) {
        printf("    rank %d: training on under ddp_full_params(w, 1): step %d, %s: %s\n", rank, step - 1,
               ddp_status_name(s), ddp_error_string());
        bad++;
    }
    /* turned off, training goes on */
    if (ddp_full_params(w, 0) != DDP_OK || net_forward(&t, x, y, GB / 2, &loss) != DDP_OK || net_backward(&t) != DDP_OK) {
        printf("    rank %d: after ddp_full_params(w, 0): %s\n", rank, ddp_error_string());
        bad++;
    }
    ddp_optim_destroy(o);
    ddp_wrapper_destroy(w);
    ddp_model_destroy(t.m);
    ddp_destroy(pg);
    return bad;
}
static void misuse_on_ranks_is_refused_by_name(void) { CHECK_OK(ddp_spawn(2, misuse_rank, NULL)); }

/* Ranks whose tensors differ in number, name or shape: every rank is told which tensor. */
static int differ_rank(int rank, void* arg) {
    int kind = *(int*)arg;
    ddp_desc d;
    ddp_pg* pg;
    net t;
    ddp_wrapper* w = NULL;
    ddp_status s;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 30;
    if (ddp_init(&d, &pg) != DDP_OK || net_build(&t, ddp_pg_device(pg), 1)) return 1;
    if (rank == 1) {
        ddp_tensor_desc td;
        memset(&td, 0, sizeof td);
        td.ndim = 1, td.shape[0] = 2, td.name = "extra";
        if (kind == 0) ddp_model_add(t.m, &td, NULL);                      /* one tensor more */
        if (kind == 1) snprintf(t.w2->name, sizeof t.w2->name, "lm_head.weight"); /* another name */
        if (kind == 2) t.b1->shape[0] = 9;                                /* another shape */
    }
    s = ddp_wrap(pg, t.m, NULL, &w);
    if (s != DDP_ERR_MODEL_MISMATCH) return printf("    rank %d: ddp_wrap returned %s\n", rank, ddp_status_name(s)), 2;
    if (!strstr(ddp_error_string(), kind == 0 ? "rank 1 has extra[2]" : kind == 1 ? "rank 1 has lm_head.weight[3,8]unit2"
                                                                                  : "rank 1 has fc1.bias[9]unit1,no_decay"))
        return printf("    rank %d: %s\n", rank, ddp_error_string()), 3;
    ddp_wrapper_destroy(w);
    if (rank == 1 && kind == 2) t.b1->shape[0] = H;
    ddp_model_destroy(t.m);
    ddp_destroy(pg);
    return 0;
}
static void tensors_that_differ_across_ranks(void) {
    int kind;
    for (kind = 0; kind < 3; kind++) CHECK_OK(ddp_spawn(2, differ_rank, &kind));
}

#ifndef DDP_TEST_OWN_NO_MAIN
int main(int argc, char** argv) {
    char tmpl[] = "/tmp/ddp_own_XXXXXX";
    char why[256];
    g_gpu = argc > 1 && !strcmp(argv[1], "--gpu");
    if (g_gpu) {
        g_gpus = h_gpus_in_child(why, sizeof why);
        if (g_gpus < 1) {
            printf("skip own_model (--gpu): %s\n", why);
            return 0;
        }
    }
    if (!mkdtemp(tmpl)) return 1;
    snprintf(g_dir, sizeof g_dir, "%s", tmpl);
    RUN(own_model_equivalence);
    RUN(own_model_no_sync);
    RUN(clipping_with_join);
    RUN(own_model_snapshot_resumes);
    RUN(compression_and_unused_tensors);
    if (!g_gpu) { /* what does not depend on the device: once, on the CPU */
        RUN(clipping_on_the_local_shard_is_caught);
        RUN(adopted_flat_buffer);
        RUN(buckets_go_during_your_backward);
        RUN(snapshot_keeps_the_optimizer_settings);
        RUN(mlp_described_tensor_by_tensor_is_bit_identical);
        RUN(misuse_is_refused_by_name);
        RUN(misuse_on_ranks_is_refused_by_name);
        RUN(tensors_that_differ_across_ranks);
    }
    h_remove_tree(g_dir);
    return H_EXIT();
}
#endif
