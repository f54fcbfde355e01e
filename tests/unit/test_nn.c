/* tests/unit/test_nn.c: the network layer (>>nn) on the CPU.

   Gradients against double-precision finite differences, the gradient-ready hooks (order, count,
   timing), accumulation and zero_grad, the optimizers against the torch.optim formulas computed
   here in double, deterministic initialisation, the built-in matrix product, and the errors of
   model building. GPU agreement is tested in test_gpu.c. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static ddp_model_desc cpu_desc(uint64_t seed) {
    ddp_model_desc d;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.seed = seed;
    return d;
}

/* An MLP on the CPU; NULL (and a failed check) if it could not be built. */
static ddp_model* cpu_mlp(const int* sizes, int n, ddp_layer_kind act, uint64_t seed) {
    ddp_model* m = NULL;
    ddp_model_desc d = cpu_desc(seed);
    CHECK_OK(ddp_model_mlp(&d, sizes, n, act, &m));
    return m;
}

/* The test's own generator (xorshift64*), so the inputs do not depend on the library's. */
static uint64_t t_state = 88172645463325252ull;
static void t_seed(uint64_t s) { t_state = s * 2654435761ull + 88172645463325252ull; }
static double t_uniform(void) { /* in [-1, 1) */
    t_state ^= t_state >> 12;
    t_state ^= t_state << 25;
    t_state ^= t_state >> 27;
    return (double)((t_state * 2685821657736338717ull) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}
static void t_fill(float* a, size_t n, double scale) {
    size_t i;
    for (i = 0; i < n; i++) a[i] = (float)(scale * t_uniform());
}

/* ---- double-precision reference network -------------------------------------------------------- */

#define R_MAXL 8  /* Linear layers */
#define R_MAXW 16 /* widths */

typedef struct refnet {
    int nlin;
    int in[R_MAXL], out[R_MAXL];
    ddp_layer_kind act[R_MAXL]; /* activation after Linear i (DDP_LAYER_NONE: none) */
    double w[R_MAXL][R_MAXW * R_MAXW];
    double b[R_MAXL][R_MAXW];
} refnet;

static refnet g_ref; /* large: kept out of the stack */

/* Copy m's f32 parameters into doubles. acts[i] is the activation after Linear i. */
static int ref_from_model(refnet* r, ddp_model* m, const ddp_layer_kind* acts) {
    int i;
    size_t k;
    memset(r, 0, sizeof *r);
    r->nlin = ddp_model_num_params(m) / 2;
    if (r->nlin > R_MAXL) return 0;
    for (i = 0; i < r->nlin; i++) {
        ddp_param* w = ddp_model_param(m, 2 * i);
        ddp_param* b = ddp_model_param(m, 2 * i + 1);
        r->out[i] = w->shape[0];
        r->in[i] = w->shape[1];
        if (r->in[i] > R_MAXW || r->out[i] > R_MAXW) return 0;
        r->act[i] = acts[i];
        for (k = 0; k < w->count; k++) r->w[i][k] = (double)w->data[k];
        for (k = 0; k < b->count; k++) r->b[i][k] = (double)b->data[k];
    }
    return 1;
}

static double* ref_param(refnet* r, int pi) { return pi % 2 == 0 ? r->w[pi / 2] : r->b[pi / 2]; }

static double ref_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* One sample: out[out_features] from x[in_features]; *min_relu is lowered to the smallest |z|
   that a ReLU saw (the kink, where finite differences are meaningless). */
static void ref_forward_row(const refnet* r, const double* x, double* out, double* min_relu) {
    double cur[R_MAXW], nxt[R_MAXW];
    int i, o, k;
    memcpy(cur, x, (size_t)r->in[0] * sizeof(double));
    for (i = 0; i < r->nlin; i++) {
        for (o = 0; o < r->out[i]; o++) {
            double z = r->b[i][o];
            for (k = 0; k < r->in[i]; k++) z += cur[k] * r->w[i][o * r->in[i] + k];
            if (r->act[i] == DDP_LAYER_RELU) {
                if (min_relu && fabs(z) < *min_relu) *min_relu = fabs(z);
                z = z > 0 ? z : 0;
            } else if (r->act[i] == DDP_LAYER_GELU) {
                z = ref_gelu(z);
            }
            nxt[o] = z;
        }
        memcpy(cur, nxt, (size_t)r->out[i] * sizeof(double));
    }
    memcpy(out, cur, (size_t)r->out[r->nlin - 1] * sizeof(double));
}

/* Cross-entropy of one row of logits z[C] against label y. */
static double ref_xent_row(const double* z, int C, int y) {
    double mx = z[0], s = 0;
    int c;
    for (c = 1; c < C; c++) mx = z[c] > mx ? z[c] : mx;
    for (c = 0; c < C; c++) s += exp(z[c] - mx);
    return mx + log(s) - z[y];
}

/* The mean loss over B samples: cross-entropy if labels, else MSE against targets. */
static double ref_loss(const refnet* r, const float* x, int B, const int* labels, const float* targets,
                       double* min_relu) {
    int in = r->in[0], C = r->out[r->nlin - 1], s, c;
    double xd[R_MAXW], out[R_MAXW], sum = 0;
    for (s = 0; s < B; s++) {
        for (c = 0; c < in; c++) xd[c] = (double)x[(size_t)s * in + c];
        ref_forward_row(r, xd, out, min_relu);
        if (labels) {
            sum += ref_xent_row(out, C, labels[s]);
        } else {
            for (c = 0; c < C; c++) {
                double d = out[c] - (double)targets[(size_t)s * C + c];
                sum += d * d;
            }
        }
    }
    return labels ? sum / B : sum / ((double)B * C);
}

/* ---- 1. gradients against finite differences --------------------------------------------------- */

/* Forward, loss and backward in the library; then the same loss in double, and central finite
   differences of it with respect to every parameter element, compared with p->grad. */
static void gradcheck(const char* what, ddp_model* m, const ddp_layer_kind* acts, const float* x, int B,
                      const int* labels, const float* targets) {
    const double h = 1e-6;
    float loss = 0.f, out[64 * R_MAXW];
    double L0, min_relu = 1e30, xd[R_MAXW], ref_out[R_MAXW];
    int pi, bad = 0, checked = 0, C = ddp__model_out_features(m), in = ddp__model_in_features(m), s, c;
    CHECK(B <= 64);
    CHECK_OK(ddp_model_zero_grad(m));
    CHECK_OK(ddp_model_forward(m, x, B));
    CHECK_OK(ddp__model_output(m, out));
    if (labels) CHECK_OK(ddp_loss_cross_entropy(m, labels, &loss));
    else CHECK_OK(ddp__loss_mse(m, targets, &loss));
    CHECK_OK(ddp_model_backward(m));
    if (!ref_from_model(&g_ref, m, acts)) {
        CHECKF(0, "%s: model too large for the reference", what);
        return;
    }
    /* the forward output, then the loss value */
    for (s = 0; s < B; s++) {
        for (c = 0; c < in; c++) xd[c] = (double)x[(size_t)s * in + c];
        ref_forward_row(&g_ref, xd, ref_out, NULL);
        for (c = 0; c < C; c++) CHECK_CLOSE(out[s * C + c], ref_out[c], 1e-5, 1e-6);
    }
    L0 = ref_loss(&g_ref, x, B, labels, targets, &min_relu);
    CHECKF(fabs(loss - L0) <= 1e-5 * fabs(L0), "%s: loss %.9g, double reference %.12g", what, loss, L0);
    /* every ReLU input is far from 0 compared with h, or the differences would straddle the kink */
    CHECKF(min_relu > 1e-3, "%s: a ReLU input is %g, too close to 0 for finite differences", what, min_relu);
    for (pi = 0; pi < ddp_model_num_params(m); pi++) {
        ddp_param* p = ddp_model_param(m, pi);
        double* v = ref_param(&g_ref, pi);
        size_t k;
        for (k = 0; k < p->count; k++) {
            double keep = v[k], lp, lm, fd;
            v[k] = keep + h;
            lp = ref_loss(&g_ref, x, B, labels, targets, NULL);
            v[k] = keep - h;
            lm = ref_loss(&g_ref, x, B, labels, targets, NULL);
            v[k] = keep;
            fd = (lp - lm) / (2 * h);
            checked++;
            if (!(fabs((double)p->grad[k] - fd) <= 1e-5 + 1e-3 * fabs(fd))) {
                if (bad < 5)
                    h_failf(__FILE__, __LINE__, "%s: d loss / d %s[%zu] = %.9g, finite difference %.9g", what,
                            p->name, k, (double)p->grad[k], fd);
                bad++;
            }
        }
    }
    CHECKF(bad == 0, "%s: %d of %d gradient elements differ from finite differences", what, bad, checked);
    CHECKF(checked == (int)ddp_model_num_elements(m), "%s: checked %d elements of %d", what, checked,
           (int)ddp_model_num_elements(m));
}

static void test_gradcheck_relu_xent(void) {
    int sizes[] = {5, 7, 4}, labels[6] = {0, 3, 1, 2, 3, 0};
    ddp_layer_kind acts[] = {DDP_LAYER_RELU, DDP_LAYER_NONE};
    float x[6 * 5];
    ddp_model* m = cpu_mlp(sizes, 3, DDP_LAYER_RELU, 11);
    if (!m) return;
    t_seed(1);
    t_fill(x, 30, 1.5);
    gradcheck("relu+xent", m, acts, x, 6, labels, NULL);
    ddp_model_destroy(m);
}

static void test_gradcheck_gelu_xent(void) {
    int sizes[] = {5, 7, 4}, labels[6] = {2, 1, 0, 3, 2, 1};
    ddp_layer_kind acts[] = {DDP_LAYER_GELU, DDP_LAYER_NONE};
    float x[6 * 5];
    ddp_model* m = cpu_mlp(sizes, 3, DDP_LAYER_GELU, 12);
    if (!m) return;
    t_seed(2);
    t_fill(x, 30, 1.5);
    gradcheck("gelu+xent", m, acts, x, 6, labels, NULL);
    ddp_model_destroy(m);
}

/* Built layer by layer: Linear(4,6) ReLU Linear(6,5) GELU Linear(5,3), mean squared error. */
static void test_gradcheck_mixed_mse(void) {
    ddp_layer_kind acts[] = {DDP_LAYER_RELU, DDP_LAYER_GELU, DDP_LAYER_NONE};
    float x[5 * 4], t[5 * 3];
    ddp_model* m = NULL;
    ddp_model_desc d = cpu_desc(13);
    CHECK_OK(ddp__model_create(&d, &m));
    if (!m) return;
    CHECK_OK(ddp__model_add_linear(m, 4, 6));
    CHECK_OK(ddp__model_add_activation(m, DDP_LAYER_RELU));
    CHECK_OK(ddp__model_add_linear(m, 6, 5));
    CHECK_OK(ddp__model_add_activation(m, DDP_LAYER_GELU));
    CHECK_OK(ddp__model_add_linear(m, 5, 3));
    CHECK(ddp__model_in_features(m) == 4 && ddp__model_out_features(m) == 3);
    t_seed(3);
    t_fill(x, 20, 2.0);
    t_fill(t, 15, 1.0);
    gradcheck("relu+gelu+mse", m, acts, x, 5, NULL, t);
    ddp_model_destroy(m);
}

/* ---- 2. hook order, count, timing, limits ------------------------------------------------------ */

typedef struct hook_log {
    int order[64];
    int n;
    float* snap[8]; /* p->grad as the hook saw it, per parameter index */
    ddp_model* m;
    int wrong_pointer;
} hook_log;

static void record_hook(ddp_param* p, void* user) {
    hook_log* log = (hook_log*)user;
    if (log->n < 64) log->order[log->n] = p->index;
    log->n++;
    if (ddp_model_param(log->m, p->index) != p) log->wrong_pointer++;
    if (p->index >= 0 && p->index < 8 && log->snap[p->index])
        memcpy(log->snap[p->index], p->grad, p->count * sizeof(float));
}

typedef struct tag_log {
    char tags[16];
    int n;
} tag_log;
static void tag_a(ddp_param* p, void* user) {
    tag_log* t = (tag_log*)user;
    (void)p;
    if (t->n < 15) t->tags[t->n++] = 'A';
}
static void tag_b(ddp_param* p, void* user) {
    tag_log* t = (tag_log*)user;
    (void)p;
    if (t->n < 15) t->tags[t->n++] = 'B';
}

static int grads_nonzero(const ddp_param* p) {
    size_t k;
    for (k = 0; k < p->count; k++)
        if (p->grad[k] != 0.f) return 1;
    return 0;
}

static void test_hooks_order_and_timing(void) {
    int sizes[] = {4, 8, 6, 3}, labels1[5] = {0, 1, 2, 1, 0}, labels2[5] = {2, 2, 0, 1, 1};
    float x1[5 * 4], x2[5 * 4], loss;
    hook_log log;
    ddp_model *m = cpu_mlp(sizes, 4, DDP_LAYER_RELU, 21), *twin = cpu_mlp(sizes, 4, DDP_LAYER_RELU, 21);
    int i, np, round;
    if (!m || !twin) return;
    np = ddp_model_num_params(m);
    CHECK(np == 6);
    memset(&log, 0, sizeof log);
    log.m = m;
    for (i = 0; i < np; i++) {
        ddp_param* p = ddp_model_param(m, i);
        log.snap[i] = (float*)calloc(p->count, sizeof(float));
        CHECK_OK(ddp_param_add_hook(p, record_hook, &log));
        CHECK(p->nhooks == 1);
    }
    t_seed(4);
    t_fill(x1, 20, 1.0);
    t_fill(x2, 20, 1.0);
    for (round = 0; round < 2; round++) {
        const float* x = round ? x2 : x1;
        const int* y = round ? labels2 : labels1;
        /* accumulate over the two rounds (no zero_grad in between): the hook must still see the
           final, accumulated gradient */
        CHECK_OK(ddp_model_forward(m, x, 5));
        CHECK_OK(ddp_loss_cross_entropy(m, y, &loss));
        CHECK_OK(ddp_model_backward(m));
        CHECK_OK(ddp_model_forward(twin, x, 5));
        CHECK_OK(ddp_loss_cross_entropy(twin, y, &loss));
        CHECK_OK(ddp_model_backward(twin));
        CHECKF(log.n == np * (round + 1), "round %d: %d hook calls, expected %d", round, log.n, np * (round + 1));
        for (i = 0; i < np && np * round + i < 64; i++)
            CHECKF(log.order[np * round + i] == np - 1 - i, "round %d: hook call %d was parameter %d, expected %d",
                   round, i, log.order[np * round + i], np - 1 - i);
        for (i = 0; i < np; i++) {
            ddp_param* p = ddp_model_param(m, i);
            CHECKF(grads_nonzero(p), "%s has an all-zero gradient", p->name);
            CHECKF(memcmp(log.snap[i], p->grad, p->count * sizeof(float)) == 0,
                   "round %d: %s's gradient changed after its hook ran", round, p->name);
            CHECKF(memcmp(log.snap[i], ddp_model_param(twin, i)->grad, p->count * sizeof(float)) == 0,
                   "round %d: %s's gradient at its hook differs from a model without hooks", round, p->name);
        }
    }
    CHECK(log.wrong_pointer == 0);

    /* DDP_MAX_HOOKS per parameter, then one more fails; clear_hooks removes them */
    {
        ddp_param* p = ddp_model_param(m, 2);
        for (i = 1; i < DDP_MAX_HOOKS; i++) CHECK_OK(ddp_param_add_hook(p, record_hook, &log));
        CHECK(p->nhooks == DDP_MAX_HOOKS);
        CHECK_FAILS(ddp_param_add_hook(p, record_hook, &log), DDP_ERR_INVALID_ARGUMENT, "DDP_MAX_HOOKS");
        CHECK(p->nhooks == DDP_MAX_HOOKS);
        CHECK_FAILS(ddp_param_add_hook(ddp_model_param(m, 3), NULL, &log), DDP_ERR_INVALID_ARGUMENT, "NULL");
        CHECK(ddp_model_param(m, 3)->nhooks == 1);
        log.n = 0;
        CHECK_OK(ddp_model_forward(m, x1, 5));
        CHECK_OK(ddp_loss_cross_entropy(m, labels1, &loss));
        CHECK_OK(ddp_model_backward(m));
        CHECKF(log.n == np - 1 + DDP_MAX_HOOKS, "%d hook calls with %d hooks on fc2.weight, expected %d", log.n,
               DDP_MAX_HOOKS, np - 1 + DDP_MAX_HOOKS);
        ddp__param_clear_hooks(p);
        CHECK(p->nhooks == 0);
        log.n = 0;
        CHECK_OK(ddp_model_forward(m, x1, 5));
        CHECK_OK(ddp_loss_cross_entropy(m, labels1, &loss));
        CHECK_OK(ddp_model_backward(m));
        CHECKF(log.n == np - 1, "%d hook calls after clearing fc2.weight's hooks, expected %d", log.n, np - 1);
        for (i = 0; i < log.n && i < 64; i++) CHECKF(log.order[i] != 2, "a cleared hook of parameter 2 ran");
        /* after clearing, DDP_MAX_HOOKS can be added again */
        for (i = 0; i < DDP_MAX_HOOKS; i++) CHECK_OK(ddp_param_add_hook(p, record_hook, &log));
    }

    /* two hooks on one parameter run in registration order */
    {
        ddp_param* p = ddp_model_param(m, 0);
        tag_log t;
        memset(&t, 0, sizeof t);
        ddp__param_clear_hooks(p);
        CHECK_OK(ddp_param_add_hook(p, tag_a, &t));
        CHECK_OK(ddp_param_add_hook(p, tag_b, &t));
        CHECK_OK(ddp_model_forward(m, x1, 5));
        CHECK_OK(ddp_loss_cross_entropy(m, labels1, &loss));
        CHECK_OK(ddp_model_backward(m));
        CHECKF(strcmp(t.tags, "AB") == 0, "hooks of one parameter ran as \"%s\", expected \"AB\"", t.tags);
    }
    for (i = 0; i < np; i++) free(log.snap[i]);
    ddp_model_destroy(m);
    ddp_model_destroy(twin);
}

/* ---- 3. a hand-written backward announces gradients itself ------------------------------------- */

static void test_hand_written_backward(void) {
    int sizes[] = {3, 2}, B = 4, r, o, k, i;
    float x[4 * 3], t[4 * 2], out[4 * 2], loss;
    double dout[4 * 2];
    float hand_w[6], hand_b[2];
    hook_log log;
    tag_log tags;
    ddp_model* m = cpu_mlp(sizes, 2, DDP_LAYER_NONE, 31);
    ddp_param *w, *b;
    if (!m) return;
    w = ddp_model_param(m, 0);
    b = ddp_model_param(m, 1);
    memset(&log, 0, sizeof log);
    memset(&tags, 0, sizeof tags);
    log.m = m;
    log.snap[0] = (float*)calloc(w->count, sizeof(float));
    log.snap[1] = (float*)calloc(b->count, sizeof(float));
    CHECK_OK(ddp_param_add_hook(w, record_hook, &log));
    CHECK_OK(ddp_param_add_hook(b, record_hook, &log));
    CHECK_OK(ddp_param_add_hook(b, tag_a, &tags));
    t_seed(5);
    t_fill(x, 12, 1.0);
    t_fill(t, 8, 1.0);
    /* the user's own forward and backward of MSE(x W^T + b, t), written into p->grad, inside the
       brackets of the model's backward (unit 0) and of the Linear layer's unit (1) */
    CHECK_OK(ddp_model_zero_grad(m));
    CHECK_OK(ddp_unit_begin(m, 0, DDP_BACKWARD));
    CHECK_OK(ddp_unit_begin(m, 1, DDP_BACKWARD));
    for (r = 0; r < B; r++)
        for (o = 0; o < 2; o++) {
            double z = b->data[o];
            for (k = 0; k < 3; k++) z += (double)x[r * 3 + k] * w->data[o * 3 + k];
            dout[r * 2 + o] = 2.0 * (z - t[r * 2 + o]) / (B * 2);
        }
    for (o = 0; o < 2; o++) {
        double s = 0;
        for (r = 0; r < B; r++) s += dout[r * 2 + o];
        b->grad[o] += (float)s;
        hand_b[o] = b->grad[o];
    }
    CHECK_OK(ddp_param_grad_ready(b));
    CHECK(log.n == 1 && log.order[0] == 1);
    CHECK(tags.n == 1 && tags.tags[0] == 'A');
    for (o = 0; o < 2; o++)
        for (k = 0; k < 3; k++) {
            double s = 0;
            for (r = 0; r < B; r++) s += dout[r * 2 + o] * x[r * 3 + k];
            w->grad[o * 3 + k] += (float)s;
            hand_w[o * 3 + k] = w->grad[o * 3 + k];
        }
    CHECK_OK(ddp_param_grad_ready(w));
    CHECK_OK(ddp_unit_end(m, 1, DDP_BACKWARD));
    CHECK_OK(ddp_unit_end(m, 0, DDP_BACKWARD));
    CHECK(log.n == 2 && log.order[1] == 0);
    CHECK(tags.n == 1); /* the weight has no tag hook */
    CHECK(log.wrong_pointer == 0);
    CHECK(memcmp(log.snap[0], hand_w, sizeof hand_w) == 0);
    CHECK(memcmp(log.snap[1], hand_b, sizeof hand_b) == 0);
    /* the library's backward gives the same gradients, and fires the same hooks again */
    CHECK_OK(ddp_model_zero_grad(m));
    CHECK_OK(ddp_model_forward(m, x, B));
    CHECK_OK(ddp__model_output(m, out));
    CHECK_OK(ddp__loss_mse(m, t, &loss));
    CHECK_OK(ddp_model_backward(m));
    CHECK(log.n == 4 && log.order[2] == 1 && log.order[3] == 0);
    CHECK(tags.n == 2);
    for (i = 0; i < 6; i++) CHECK_CLOSE(w->grad[i], hand_w[i], 1e-5, 1e-7);
    for (i = 0; i < 2; i++) CHECK_CLOSE(b->grad[i], hand_b[i], 1e-5, 1e-7);
    free(log.snap[0]);
    free(log.snap[1]);
    ddp_model_destroy(m);
}

/* ---- 4. accumulation, zero_grad and call order ------------------------------------------------- */

static void copy_grads(ddp_model* m, float* dst) {
    int i;
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        memcpy(dst, p->grad, p->count * sizeof(float));
        dst += p->count;
    }
}

static void one_round(ddp_model* m, const float* x, const int* y, int B) {
    float loss;
    CHECK_OK(ddp_model_forward(m, x, B));
    CHECK_OK(ddp_loss_cross_entropy(m, y, &loss));
    CHECK_OK(ddp_model_backward(m));
}

static void test_accumulate_and_zero_grad(void) {
    int sizes[] = {6, 9, 4}, y1[7] = {0, 1, 2, 3, 3, 2, 1}, y2[3] = {3, 0, 2}, bad[7] = {0, 1, 2, 3, 3, 2, 1};
    float x1[7 * 6], x2[3 * 6], loss = -1.f;
    float g1[6 * 9 + 9 + 9 * 4 + 4], g2[sizeof g1 / sizeof g1[0]], g12[sizeof g1 / sizeof g1[0]];
    size_t n, k;
    int i, nonzero = 0;
    ddp_model* m = cpu_mlp(sizes, 3, DDP_LAYER_GELU, 41);
    ddp_model* fresh = cpu_mlp(sizes, 3, DDP_LAYER_GELU, 41);
    if (!m || !fresh) return;
    n = ddp_model_num_elements(m);
    CHECK(n == sizeof g1 / sizeof g1[0]);
    t_seed(6);
    t_fill(x1, sizeof x1 / sizeof x1[0], 1.0);
    t_fill(x2, sizeof x2 / sizeof x2[0], 1.0);

    CHECK_OK(ddp_model_zero_grad(m));
    one_round(m, x1, y1, 7);
    copy_grads(m, g1);
    CHECK_OK(ddp_model_zero_grad(m));
    one_round(m, x2, y2, 3); /* a smaller batch after a larger one */
    copy_grads(m, g2);
    CHECK_OK(ddp_model_zero_grad(m));
    one_round(m, x1, y1, 7);
    one_round(m, x2, y2, 3);
    copy_grads(m, g12);
    for (k = 0; k < n; k++) {
        nonzero += g12[k] != 0.f;
        if (!(fabs((double)g12[k] - ((double)g1[k] + g2[k])) <= 1e-6 + 1e-5 * fabs((double)g1[k] + g2[k]))) {
            CHECKF(0, "accumulated gradient element %zu is %.9g, sum of the rounds %.9g", k, g12[k],
                   (double)g1[k] + g2[k]);
            break;
        }
    }
    CHECK(nonzero > (int)n / 2);
    /* round 1 alone equals the gradient of a fresh model on the same batch: nothing stale */
    {
        float gf[sizeof g1 / sizeof g1[0]];
        one_round(fresh, x1, y1, 7);
        copy_grads(fresh, gf);
        CHECK(memcmp(gf, g1, sizeof gf) == 0);
    }
    CHECK_OK(ddp_model_zero_grad(m));
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        for (k = 0; k < p->count; k++)
            if (p->grad[k] != 0.f) {
                CHECKF(0, "%s[%zu] is %g after zero_grad", p->name, k, p->grad[k]);
                break;
            }
    }

    /* backward twice after one loss: the second is refused and adds nothing */
    CHECK_OK(ddp_model_forward(m, x1, 7));
    CHECK_OK(ddp_loss_cross_entropy(m, y1, &loss));
    CHECK_OK(ddp_model_backward(m));
    copy_grads(m, g12);
    CHECK_FAILS(ddp_model_backward(m), DDP_ERR_STATE, "backward already ran for this loss");
    copy_grads(m, g2);
    CHECK(memcmp(g12, g2, sizeof g2) == 0);
    /* a new loss on the same forward allows one more backward */
    CHECK_OK(ddp_loss_cross_entropy(m, y1, &loss));
    CHECK_OK(ddp_model_backward(m));
    /* a new forward discards a loss that was not backpropagated */
    CHECK_OK(ddp_loss_cross_entropy(m, y1, &loss));
    CHECK_OK(ddp_model_forward(m, x2, 3));
    CHECK_FAILS(ddp_model_backward(m), DDP_ERR_STATE, "backward needs forward and a loss first");

    /* a label outside 0..classes-1, then backward has no loss to use */
    bad[4] = 4;
    CHECK_OK(ddp_model_forward(m, x1, 7));
    CHECK_FAILS(ddp_loss_cross_entropy(m, bad, &loss), DDP_ERR_INVALID_ARGUMENT, "label 4");
    bad[4] = -1;
    CHECK_FAILS(ddp_loss_cross_entropy(m, bad, &loss), DDP_ERR_INVALID_ARGUMENT, "label -1");
    CHECK_FAILS(ddp_model_backward(m), DDP_ERR_STATE, "loss");

    /* loss and backward before any forward */
    {
        ddp_model* m2 = cpu_mlp(sizes, 3, DDP_LAYER_RELU, 42);
        float t[4] = {0, 0, 0, 0};
        if (m2) {
            CHECK_FAILS(ddp_loss_cross_entropy(m2, y1, &loss), DDP_ERR_STATE, "forward");
            CHECK_FAILS(ddp__loss_mse(m2, t, &loss), DDP_ERR_STATE, "forward");
            CHECK_FAILS(ddp_model_backward(m2), DDP_ERR_STATE, "loss");
            CHECK_FAILS(ddp_model_forward(m2, x1, 0), DDP_ERR_INVALID_ARGUMENT, "batch");
            ddp_model_destroy(m2);
        }
    }
    ddp_model_destroy(m);
    ddp_model_destroy(fresh);
}

/* ---- 5. optimizers against the torch.optim formulas -------------------------------------------- */

#define O_N 8 /* Linear(3, 2): 6 weights and 2 biases */

typedef struct ref_opt {
    ddp_optim_kind kind;
    double lr, momentum, dampening, wd, b1, b2, eps;
    int nesterov;
    long t;
    double p[O_N], s1[O_N], s2[O_N];
} ref_opt;

static void ref_opt_step(ref_opt* o, const double* grad) {
    int k;
    o->t++;
    for (k = 0; k < O_N; k++) {
        double g = grad[k];
        if (o->kind == DDP_SGD) {
            if (o->wd != 0) g += o->wd * o->p[k];
            if (o->momentum != 0) {
                o->s1[k] = o->t == 1 ? g : o->momentum * o->s1[k] + (1 - o->dampening) * g;
                g = o->nesterov ? g + o->momentum * o->s1[k] : o->s1[k];
            }
            o->p[k] -= o->lr * g;
        } else {
            double bc1 = 1 - pow(o->b1, (double)o->t), bc2 = 1 - pow(o->b2, (double)o->t);
            if (o->kind == DDP_ADAMW) o->p[k] *= 1 - o->lr * o->wd;
            else if (o->wd != 0) g += o->wd * o->p[k];
            o->s1[k] = o->s1[k] + (1 - o->b1) * (g - o->s1[k]);
            o->s2[k] = o->b2 * o->s2[k] + (1 - o->b2) * g * g;
            o->p[k] -= (o->lr / bc1) * o->s1[k] / (sqrt(o->s2[k]) / sqrt(bc2) + o->eps);
        }
    }
}

/* Run `steps` steps of the library's optimizer (desc; NULL for all defaults) and of the double
   reference (ref, with the hyperparameters the library should resolve), with gradients set by
   hand before each step. Weights' gradients are O(1); biases' are O(1e-8), of the size of eps. */
static void check_optim(const char* what, const ddp_optim_desc* desc, ref_opt ref, int steps) {
    int sizes[] = {3, 2}, s, k;
    ddp_model* m = cpu_mlp(sizes, 2, DDP_LAYER_NONE, 51);
    ddp_optim* o = NULL;
    ddp_param *w, *b;
    float* pk[O_N];
    float* gk[O_N];
    if (!m) return;
    w = ddp_model_param(m, 0);
    b = ddp_model_param(m, 1);
    CHECK(w->count + b->count == O_N);
    for (k = 0; k < 6; k++) pk[k] = &w->data[k], gk[k] = &w->grad[k];
    for (k = 0; k < 2; k++) pk[6 + k] = &b->data[k], gk[6 + k] = &b->grad[k];
    for (k = 0; k < O_N; k++) {
        *pk[k] = (float)((k % 2 ? -1 : 1) * (0.3 + 0.09 * k));
        ref.p[k] = (double)*pk[k];
        ref.s1[k] = ref.s2[k] = 0;
    }
    ref.t = 0;
    CHECK_OK(ddp_optim_create(m, desc, &o));
    if (!o) {
        ddp_model_destroy(m);
        return;
    }
    CHECK(ddp_optim_steps(o) == 0);
    for (s = 0; s < steps; s++) {
        double g[O_N];
        int bad = 0;
        for (k = 0; k < O_N; k++) {
            float gf = (float)(sin(1.7 * k + 0.9 * s + 0.3) * (k < 6 ? 1.0 : 3e-8));
            *gk[k] = gf;
            g[k] = (double)gf;
        }
        CHECK_OK(ddp_optim_step(o));
        ref_opt_step(&ref, g);
        for (k = 0; k < O_N; k++) {
            if (!(fabs((double)*pk[k] - ref.p[k]) <= 1e-7 + 1e-6 * fabs(ref.p[k]))) {
                if (!bad)
                    h_failf(__FILE__, __LINE__, "%s step %d: parameter element %d is %.9g, expected %.9g", what,
                            s + 1, k, (double)*pk[k], ref.p[k]);
                bad++;
            }
            /* as in PyTorch, step reads the gradient and leaves it as it was */
            if (*gk[k] != (float)g[k]) {
                h_failf(__FILE__, __LINE__, "%s step %d: gradient element %d changed", what, s + 1, k);
                bad++;
            }
        }
        if (bad) break;
    }
    CHECKF(ddp_optim_steps(o) == steps, "%s: ddp_optim_steps is %ld after %d steps", what, ddp_optim_steps(o),
           steps);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
}

static ddp_optim_desc odesc(ddp_optim_kind kind, float lr) {
    ddp_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.lr = lr;
    return d;
}

static ref_opt oref(ddp_optim_kind kind, const ddp_optim_desc* d) {
    ref_opt r;
    memset(&r, 0, sizeof r);
    r.kind = kind;
    r.lr = d->lr;
    r.momentum = d->momentum;
    r.dampening = d->dampening;
    r.nesterov = d->nesterov;
    r.wd = d->weight_decay;
    r.b1 = d->beta1;
    r.b2 = d->beta2;
    r.eps = d->eps;
    return r;
}

static void test_optim_sgd(void) {
    ddp_optim_desc d;
    d = odesc(DDP_SGD, 0.1f);
    check_optim("sgd", &d, oref(DDP_SGD, &d), 4);
    d = odesc(DDP_SGD, 0.1f);
    d.weight_decay = 0.05f;
    check_optim("sgd weight decay", &d, oref(DDP_SGD, &d), 4);
    d = odesc(DDP_SGD, 0.05f);
    d.momentum = 0.9f;
    check_optim("sgd momentum", &d, oref(DDP_SGD, &d), 5);
    d = odesc(DDP_SGD, 0.05f);
    d.momentum = 0.8f;
    d.dampening = 0.3f;
    d.weight_decay = 0.01f;
    check_optim("sgd momentum dampening", &d, oref(DDP_SGD, &d), 5);
    d = odesc(DDP_SGD, 0.05f);
    d.momentum = 0.9f;
    d.nesterov = 1;
    check_optim("sgd nesterov", &d, oref(DDP_SGD, &d), 5);
    d = odesc(DDP_SGD, 0.05f);
    d.momentum = 0.7f;
    d.nesterov = 1;
    d.weight_decay = 0.02f;
    check_optim("sgd nesterov weight decay", &d, oref(DDP_SGD, &d), 5);
    /* lr 0 means the default 1e-3 */
    {
        ddp_optim_desc want = odesc(DDP_SGD, 1e-3f);
        d = odesc(DDP_SGD, 0.f);
        check_optim("sgd default lr", &d, oref(DDP_SGD, &want), 3);
    }
}

static void test_optim_adam(void) {
    ddp_optim_desc d, want;
    d = odesc(DDP_ADAM, 0.01f);
    d.beta1 = 0.8f;
    d.beta2 = 0.95f;
    d.eps = 1e-8f;
    check_optim("adam", &d, oref(DDP_ADAM, &d), 5);
    d.weight_decay = 0.1f;
    check_optim("adam weight decay", &d, oref(DDP_ADAM, &d), 5);
    d = odesc(DDP_ADAMW, 0.01f);
    d.beta1 = 0.85f;
    d.beta2 = 0.99f;
    d.eps = 1e-8f;
    d.weight_decay = 0.2f;
    check_optim("adamw", &d, oref(DDP_ADAMW, &d), 5);
    /* AdamW's weight_decay 0 means PyTorch's default 1e-2 */
    d.weight_decay = 0.f;
    want = d;
    want.weight_decay = 1e-2f;
    check_optim("adamw default weight decay", &d, oref(DDP_ADAMW, &want), 5);
    /* a zeroed desc (and a NULL one) is Adam with lr 1e-3, betas 0.9/0.999, eps 1e-8 */
    memset(&d, 0, sizeof d);
    want = odesc(DDP_ADAM, 1e-3f);
    want.beta1 = 0.9f;
    want.beta2 = 0.999f;
    want.eps = 1e-8f;
    check_optim("zeroed desc", &d, oref(DDP_ADAM, &want), 5);
    check_optim("NULL desc", NULL, oref(DDP_ADAM, &want), 5);
    /* the defaults fill only what is 0 */
    d = odesc(DDP_ADAM, 0.f);
    d.beta2 = 0.9f;
    want.beta2 = 0.9f;
    check_optim("adam default lr, beta1, eps", &d, oref(DDP_ADAM, &want), 5);
}

static void test_optim_invalid(void) {
    int sizes[] = {3, 2};
    ddp_model* m = cpu_mlp(sizes, 2, DDP_LAYER_NONE, 52);
    ddp_optim* o = (ddp_optim*)&o; /* anything but NULL: a failed create must set it to NULL */
    ddp_optim_desc d;
    if (!m) return;
    d = odesc(DDP_SGD, -0.1f);
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "lr");
    CHECK(o == NULL);
    d = odesc(DDP_ADAM, -1e-3f);
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "lr");
    d = odesc(DDP_ADAM, 1e-3f);
    d.beta1 = 1.f;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "beta1");
    d.beta1 = 1.5f;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "beta1");
    d.beta1 = -0.1f;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "beta1");
    d = odesc(DDP_ADAMW, 1e-3f);
    d.beta2 = 1.f;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "beta2");
    d = odesc(DDP_SGD, 0.1f);
    d.nesterov = 1;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "nesterov");
    d.momentum = 0.9f;
    d.dampening = 0.1f;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "nesterov");
    d = odesc(DDP_SGD, 0.1f);
    d.momentum = -0.5f;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "momentum");
    d = odesc(DDP_ADAM, 0.1f);
    d.weight_decay = -0.01f;
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "weight_decay");
    d = odesc((ddp_optim_kind)42, 0.1f);
    CHECK_FAILS(ddp_optim_create(m, &d, &o), DDP_ERR_INVALID_ARGUMENT, "kind");
    CHECK(o == NULL);
    /* and a valid one next to them */
    d = odesc(DDP_SGD, 0.1f);
    d.nesterov = 1;
    d.momentum = 0.9f;
    CHECK_OK(ddp_optim_create(m, &d, &o));
    CHECK(o != NULL);
    ddp_optim_destroy(o);
    ddp_optim_destroy(NULL);
    ddp_model_destroy(m);
}

/* ---- 6. deterministic initialisation, names, shapes -------------------------------------------- */

static int params_equal(ddp_model* a, ddp_model* b, int i) {
    ddp_param *p = ddp_model_param(a, i), *q = ddp_model_param(b, i);
    return p && q && p->count == q->count && memcmp(p->data, q->data, p->count * sizeof(float)) == 0;
}

/* 1 if some parameter's first values are another's (or its own, later), rescaled by the ratio of
   their bounds: streams that are shifted copies of one another. Names the pair in `what`. */
static int shifted_copy(ddp_model* m, char* what, size_t n) {
    int i, j, np = ddp_model_num_params(m);
    for (i = 0; i < np; i++)
        for (j = 0; j < np; j++) {
            ddp_param *p = ddp_model_param(m, i), *q = ddp_model_param(m, j);
            /* a weight's bound is 1/sqrt(its columns); its bias (next) shares it */
            double bp = 1.0 / sqrt((double)(p->ndim == 2 ? p->shape[1] : ddp_model_param(m, i - 1)->shape[1]));
            double bq = 1.0 / sqrt((double)(q->ndim == 2 ? q->shape[1] : ddp_model_param(m, j - 1)->shape[1]));
            size_t k, t, run = q->count < 4 ? q->count : 4;
            for (k = i == j ? 1 : 0; k + run <= p->count; k++) {
                for (t = 0; t < run && fabs(p->data[k + t] / bp - q->data[t] / bq) < 1e-6; t++) {}
                if (t == run) {
                    snprintf(what, n, "%s equals %s's values from index %zu on, rescaled", q->name, p->name, k);
                    return 1;
                }
            }
        }
    return 0;
}

static void test_init(void) {
    int sizes[] = {50, 40, 7}, longer[] = {50, 40, 9, 3}, i, np;
    ddp_model *a = cpu_mlp(sizes, 3, DDP_LAYER_RELU, 7), *b = cpu_mlp(sizes, 3, DDP_LAYER_RELU, 7);
    ddp_model *c = cpu_mlp(sizes, 3, DDP_LAYER_RELU, 8), *d = cpu_mlp(longer, 4, DDP_LAYER_GELU, 7);
    size_t total = 0;
    const char* names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    if (!a || !b || !c || !d) return;
    np = ddp_model_num_params(a);
    CHECK(np == 4);
    CHECK(ddp_model_num_params(d) == 6);
    CHECK(ddp_model_param(a, -1) == NULL && ddp_model_param(a, np) == NULL);
    CHECK(ddp__model_in_features(a) == 50 && ddp__model_out_features(a) == 7);
    CHECK(ddp__model_device(a).type == DDP_DEVICE_CPU);
    CHECK(ddp_model_stream(a) == NULL);
    for (i = 0; i < np; i++) {
        ddp_param* p = ddp_model_param(a, i);
        int L = i / 2, in = sizes[L], out = sizes[L + 1];
        double bound = 1.0 / sqrt((double)in), lo = 1e30, hi = -1e30, mean = 0;
        size_t k;
        CHECKF(strcmp(p->name, names[i]) == 0, "parameter %d is named \"%s\", expected \"%s\"", i, p->name, names[i]);
        CHECK(p->index == i);
        CHECK(p->device.type == DDP_DEVICE_CPU);
        if (i % 2 == 0) {
            CHECK(p->ndim == 2 && p->shape[0] == out && p->shape[1] == in);
            CHECK(p->count == (size_t)out * in);
        } else {
            CHECK(p->ndim == 1 && p->shape[0] == out);
            CHECK(p->count == (size_t)out);
        }
        total += p->count;
        for (k = 0; k < p->count; k++) {
            double v = p->data[k];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            mean += v;
            CHECK(p->grad[k] == 0.f);
        }
        mean /= (double)p->count;
        /* 1/sqrt(in) is rounded to f32 in the library: allow that rounding, nothing more */
        CHECKF(lo >= -bound * (1 + 1e-7) && hi <= bound * (1 + 1e-7), "%s spans [%g, %g], bound %g", p->name, lo, hi,
               bound);
        CHECKF(lo < -0.5 * bound && hi > 0.5 * bound, "%s spans only [%g, %g] of +-%g", p->name, lo, hi, bound);
        if (p->count >= 200) CHECKF(fabs(mean) < 0.1 * bound, "%s has mean %g (bound %g)", p->name, mean, bound);
        CHECKF(params_equal(a, b, i), "%s differs between two models with seed 7", p->name);
        CHECKF(!params_equal(a, c, i), "%s is the same with seeds 7 and 8", p->name);
    }
    CHECK(ddp_model_num_elements(a) == total);
    CHECK(total == 50 * 40 + 40 + 40 * 7 + 7);
    CHECK(ddp_model_num_elements(d) == 50 * 40 + 40 + 40 * 9 + 9 + 9 * 3 + 3);
    /* the weights do not depend on what follows: fc1 is the same in a deeper model */
    CHECK(params_equal(a, d, 0) && params_equal(a, d, 1));
    /* parameters draw from unrelated streams: no parameter's values are another's, shifted and
       rescaled (they were: the issue-18 case below, fc1.bias == fc1.weight.flat[1:65]) */
    {
        int wine[] = {13, 64, 3};
        ddp_model* e = cpu_mlp(wine, 3, DDP_LAYER_RELU, 1);
        char what[160];
        CHECKF(!shifted_copy(a, what, sizeof what), "seed 7, 50-40-7: %s", what);
        CHECKF(!shifted_copy(d, what, sizeof what), "seed 7, 50-40-9-3: %s", what);
        CHECKF(!e || !shifted_copy(e, what, sizeof what), "seed 1, 13-64-3: %s", what);
        ddp_model_destroy(e);
    }
    ddp_model_destroy(a);
    ddp_model_destroy(b);
    ddp_model_destroy(c);
    ddp_model_destroy(d);
}

/* ---- 7. the built-in CPU matrix product -------------------------------------------------------- */

static void gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
    int arows = ta ? K : M, brows = tb ? N : K, i, j, k, bad = 0, pad_bad = 0;
    float* A = (float*)malloc((size_t)arows * lda * sizeof(float));
    float* B = (float*)malloc((size_t)brows * ldb * sizeof(float));
    float* C = (float*)malloc((size_t)M * ldc * sizeof(float));
    float* C0 = (float*)malloc((size_t)M * ldc * sizeof(float));
    if (!A || !B || !C || !C0) {
        CHECKF(0, "out of memory");
        free(A), free(B), free(C), free(C0);
        return;
    }
    t_seed((uint64_t)(ta * 2 + tb) * 1000 + (uint64_t)M);
    t_fill(A, (size_t)arows * lda, 1.0);
    t_fill(B, (size_t)brows * ldb, 1.0);
    t_fill(C0, (size_t)M * ldc, 1.0);
    for (i = 0; i < M; i++)
        for (j = N; j < ldc; j++) C0[(size_t)i * ldc + j] = 12345.f; /* padding: must stay */
    memcpy(C, C0, (size_t)M * ldc * sizeof(float));
    if (beta == 0.f) /* beta 0: C is not read (BLAS), so garbage in it must not show */
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;
    ddp__gemm_loop(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    for (i = 0; i < M; i++) {
        for (j = 0; j < N; j++) {
            double s = 0, mag = 0, want, got = C[(size_t)i * ldc + j];
            for (k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += a * b;
                mag += fabs(a * b);
            }
            want = (double)alpha * s + (beta == 0.f ? 0.0 : (double)beta * C0[(size_t)i * ldc + j]);
            mag = fabs((double)alpha) * mag + fabs((double)beta * C0[(size_t)i * ldc + j]);
            /* rtol 1e-5 of the size of the terms summed (the result itself may cancel to ~0) */
            if (!(fabs(got - want) <= 1e-5 * fabs(want) + 1e-6 * mag)) {
                if (!bad)
                    h_failf(__FILE__, __LINE__, "gemm ta=%d tb=%d %dx%dx%d beta %g: C[%d,%d] = %.9g, expected %.9g",
                            ta, tb, M, N, K, (double)beta, i, j, got, want);
                bad++;
            }
        }
        for (j = N; j < ldc; j++) pad_bad += C[(size_t)i * ldc + j] != 12345.f;
    }
    CHECKF(bad == 0, "gemm ta=%d tb=%d %dx%dx%d alpha %g beta %g: %d of %d elements wrong", ta, tb, M, N, K,
           (double)alpha, (double)beta, bad, M * N);
    CHECKF(pad_bad == 0, "gemm ta=%d tb=%d %dx%dx%d: %d elements past N in the rows of C were written", ta, tb, M, N,
           K, pad_bad);
    free(A), free(B), free(C), free(C0);
}

static void test_gemm_loop(void) {
    static const int shapes[][3] = {{3, 300, 70}, {65, 257, 129}, {1, 1, 1}, {17, 5, 64}};
    int s, ta, tb;
    for (s = 0; s < 4; s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                gemm_case(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 1.f, 0.f);
                gemm_case(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 0.75f, 0.5f);
            }
    /* K = 0: C = beta C */
    {
        float A[1] = {1.f}, B[1] = {1.f}, C[6] = {1, 2, 3, 4, 5, 6};
        int i;
        ddp__gemm_loop(0, 0, 2, 3, 0, 1.f, A, 1, B, 3, 0.5f, C, 3);
        for (i = 0; i < 6; i++) CHECK(C[i] == 0.5f * (float)(i + 1));
    }
}

/* ---- 8. model building errors, evaluate -------------------------------------------------------- */

static void test_build_errors(void) {
    ddp_model* m = NULL;
    ddp_model_desc d = cpu_desc(61);
    int bad_sizes[] = {4, 0, 3}, sizes[] = {4, 6, 3};
    float x[4] = {1, 2, 3, 4};
    CHECK_OK(ddp__model_create(&d, &m));
    if (!m) return;
    CHECK(ddp_model_num_params(m) == 0 && ddp__model_in_features(m) == 0 && ddp__model_out_features(m) == 0);
    CHECK_FAILS(ddp__model_add_activation(m, DDP_LAYER_RELU), DDP_ERR_INVALID_ARGUMENT, "layer");
    CHECK_FAILS(ddp_model_forward(m, x, 1), DDP_ERR_INVALID_ARGUMENT, "no layers");
    CHECK_FAILS(ddp__model_add_linear(m, 0, 3), DDP_ERR_INVALID_ARGUMENT, "Linear(0, 3)");
    CHECK_FAILS(ddp__model_add_linear(m, 4, -2), DDP_ERR_INVALID_ARGUMENT, "Linear(4, -2)");
    CHECK(ddp_model_num_params(m) == 0);
    CHECK_OK(ddp__model_add_linear(m, 4, 6));
    CHECK_FAILS(ddp__model_add_linear(m, 5, 3), DDP_ERR_INVALID_ARGUMENT, "Linear(5, 3)");
    CHECKF(strstr(ddp_error_string(), "width 6") != NULL, "message \"%s\" does not name the width 6",
           ddp_error_string());
    CHECK_FAILS(ddp__model_add_activation(m, DDP_LAYER_NONE), DDP_ERR_INVALID_ARGUMENT, "DDP_LAYER_RELU");
    CHECK_FAILS(ddp__model_add_activation(m, DDP_LAYER_LINEAR), DDP_ERR_INVALID_ARGUMENT, "DDP_LAYER_RELU");
    CHECK_FAILS(ddp__model_add_activation(m, (ddp_layer_kind)99), DDP_ERR_INVALID_ARGUMENT, "DDP_LAYER_RELU");
    /* the failures left the model as it was, and it goes on growing */
    CHECK(ddp_model_num_params(m) == 2 && ddp__model_out_features(m) == 6);
    CHECK_OK(ddp__model_add_activation(m, DDP_LAYER_GELU));
    CHECK(ddp__model_out_features(m) == 6);
    CHECK_FAILS(ddp__model_add_linear(m, 4, 3), DDP_ERR_INVALID_ARGUMENT, "width 6");
    CHECK_OK(ddp__model_add_linear(m, 6, 3));
    CHECK(ddp_model_num_params(m) == 4 && ddp__model_out_features(m) == 3);
    CHECK(strcmp(ddp_model_param(m, 2)->name, "fc2.weight") == 0);
    ddp_model_destroy(m);
    /* ddp_model_mlp passes the errors on and leaves *out NULL */
    m = (ddp_model*)&m;
    CHECK_FAILS(ddp_model_mlp(&d, bad_sizes, 3, DDP_LAYER_RELU, &m), DDP_ERR_INVALID_ARGUMENT, "Linear(4, 0)");
    CHECK(m == NULL);
    m = (ddp_model*)&m;
    CHECK_FAILS(ddp_model_mlp(&d, sizes, 1, DDP_LAYER_RELU, &m), DDP_ERR_INVALID_ARGUMENT, "2 sizes");
    CHECK(m == NULL);
    CHECK_FAILS(ddp_model_mlp(&d, sizes, 3, DDP_LAYER_NONE, &m), DDP_ERR_INVALID_ARGUMENT, "DDP_LAYER_RELU");
    CHECK(m == NULL);
    ddp_model_destroy(NULL);
}

static void test_evaluate(void) {
    enum { N = 300 }; /* more than one of evaluate's 256-sample chunks */
    int sizes[] = {5, 7, 4}, labels[N], s, c, k, flipped = 0;
    ddp_layer_kind acts[] = {DDP_LAYER_RELU, DDP_LAYER_NONE};
    static float x[N * 5];
    double sum = 0, xd[5], out[4];
    float acc = -1.f, loss = -1.f;
    ddp_model* m = cpu_mlp(sizes, 3, DDP_LAYER_RELU, 71);
    if (!m) return;
    if (!ref_from_model(&g_ref, m, acts)) {
        CHECKF(0, "reference too small");
        ddp_model_destroy(m);
        return;
    }
    /* samples labelled with the reference's argmax, kept only where the margin is clear */
    t_seed(8);
    for (s = 0; s < N;) {
        int best = 0;
        double second = -1e30;
        for (c = 0; c < 5; c++) x[s * 5 + c] = (float)(2.0 * t_uniform());
        for (c = 0; c < 5; c++) xd[c] = x[s * 5 + c];
        ref_forward_row(&g_ref, xd, out, NULL);
        for (c = 1; c < 4; c++)
            if (out[c] > out[best]) best = c;
        for (c = 0; c < 4; c++)
            if (c != best && out[c] > second) second = out[c];
        if (out[best] - second < 1e-3) continue;
        labels[s] = best;
        sum += ref_xent_row(out, 4, best);
        s++;
    }
    CHECK_OK(ddp_model_evaluate(m, x, labels, N, &acc, &loss));
    CHECKF(acc == 1.f, "accuracy %.9g on a set the model classifies perfectly", acc);
    CHECK_CLOSE(loss, sum / N, 1e-5, 0);
    /* relabel every 8th sample (the first of each chunk among them) to another class: accuracy
       262/300 exactly, and the loss rises as computed */
    sum = 0;
    for (s = 0; s < N; s++) {
        if (s % 8 == 0) {
            labels[s] = (labels[s] + 1 + s % 3) % 4;
            flipped++;
        }
        for (k = 0; k < 5; k++) xd[k] = x[s * 5 + k];
        ref_forward_row(&g_ref, xd, out, NULL);
        sum += ref_xent_row(out, 4, labels[s]);
    }
    CHECK_OK(ddp_model_evaluate(m, x, labels, N, &acc, NULL));
    CHECKF(acc == (float)(N - flipped) / (float)N, "accuracy %.9g, expected %d/%d", acc, N - flipped, N);
    CHECK_OK(ddp_model_evaluate(m, x, labels, N, NULL, &loss));
    CHECK_CLOSE(loss, sum / N, 1e-5, 0);
    CHECK(loss > 0.f);
    /* a single sample, and n < 1 */
    for (k = 0; k < 5; k++) xd[k] = x[k];
    ref_forward_row(&g_ref, xd, out, NULL);
    CHECK_OK(ddp_model_evaluate(m, x, labels, 1, &acc, &loss));
    CHECK(acc == 0.f); /* sample 0 was relabelled */
    CHECK_CLOSE(loss, ref_xent_row(out, 4, labels[0]), 1e-5, 0);
    CHECK_FAILS(ddp_model_evaluate(m, x, labels, 0, &acc, &loss), DDP_ERR_INVALID_ARGUMENT, "n is 0");
    ddp_model_destroy(m);
}

int main(void) {
    RUN(test_gradcheck_relu_xent);
    RUN(test_gradcheck_gelu_xent);
    RUN(test_gradcheck_mixed_mse);
    RUN(test_hooks_order_and_timing);
    RUN(test_hand_written_backward);
    RUN(test_accumulate_and_zero_grad);
    RUN(test_optim_sgd);
    RUN(test_optim_adam);
    RUN(test_optim_invalid);
    RUN(test_init);
    RUN(test_gemm_loop);
    RUN(test_build_errors);
    RUN(test_evaluate);
    return H_EXIT();
}
