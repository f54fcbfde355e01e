/* labs/gpt/test.c: the tests of lab "gpt", built together with the student's file and ddp.h's
   implementation.

   Part 1 runs the student's backward on a tiny GPT of examples/gpt.h (2 blocks, 2 heads, 8 wide,
   context 8, 13 characters): first in one process, beside examples/gpt.h's own gpt_backward on a
   second copy of the model, with a hook of the test's own on every tensor that records, at the
   moment the tensor is marked ready, its gradient then and whether the next operation of backward
   has already run (its tensors' gradients are no longer zero); then on W ranks under ddp_wrap,
   three steps of AdamW against the same steps in one process on the whole batch.
   Part 2 hands the student's validation loss a set of batches whose lab_val_loss_of records, in
   memory shared with the test, which rank evaluated which batch and what it found.
   Part 3 gives each rank a gradient of its own (numbers drawn from the rank) and checks the shard,
   the norm and the bytes each rank sent against the average computed here. */
#define LAB_GPT_TESTS /* examples/gpt.h's own gpt_backward: the reference */
#include "../lab_test.h"

#include <math.h>

#include "ddp.h"
#include "gpt_lab.h"

#define V_ 13
#define T_ 8
#define GLOBAL_B 4 /* sequences per micro-batch; 1, 2 and 4 ranks take equal shares */
#define STEPS 3
#define ACCUM 2
#define MAX_ELEMS 4096 /* the tiny model has 1,926 */
#define MAX_TENSORS 32

static gpt_config tiny(void) {
    gpt_config c;
    c.vocab = V_, c.ctx = T_, c.layers = 2, c.heads = 2, c.width = 8;
    return c;
}

static ddp_device cpu(void) {
    ddp_device d;
    memset(&d, 0, sizeof d);
    d.type = DDP_DEVICE_CPU;
    return d;
}

/* Sequences of T_ + 1 characters with a pattern to learn (each character mostly follows from the
   one before), drawn from `stream`: x the first T_, y the next. */
static void sequences(uint64_t stream, int nseq, int* x, int* y) {
    lab_rng g;
    int i, j;
    lab_rng_seed(&g, 2024, stream);
    for (i = 0; i < nseq; i++) {
        int c = (int)lab_rng_below(&g, V_);
        for (j = 0; j <= T_; j++) {
            if (j < T_) x[i * T_ + j] = c;
            if (j > 0) y[i * T_ + j - 1] = c;
            c = lab_rng_below(&g, 4) ? (c * 3 + 1) % V_ : (int)lab_rng_below(&g, V_);
        }
    }
}

static double rel_l2(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    if (num != num) return INFINITY; /* NaN */
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double l2(const float* a, size_t n) {
    double s = 0;
    size_t i;
    for (i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

/* ---- part 1a: one process, the test's hook on every tensor ---------------------------------------- */

/* The tensors of examples/gpt.h's backward in the order it finishes them: groups of tensors whose
   gradients one operation completes. wte's gradient starts in the first operation (the output
   layer) and is completed in the last (the embedding). */
typedef struct watch {
    gpt* g;
    int ngroups;
    ddp_param* group[MAX_TENSORS][2];
    int group_of[MAX_TENSORS]; /* by tensor index */
    int marks[MAX_TENSORS];
    float* at_mark[MAX_TENSORS]; /* the gradient when it was marked */
    int late[MAX_TENSORS];       /* -1, or the index of a tensor of the next group that had a gradient */
} watch;

static void add_group(watch* w, ddp_param* a, ddp_param* b) {
    w->group[w->ngroups][0] = a, w->group[w->ngroups][1] = b;
    w->group_of[a->index] = w->group_of[b->index] = w->ngroups;
    w->ngroups++;
}

static int nonzero(const ddp_param* p) {
    size_t i;
    for (i = 0; i < p->count; i++)
        if (p->grad[i] != 0) return 1;
    return 0;
}

static void watch_hook(ddp_param* p, void* user) {
    watch* w = (watch*)user;
    int k = w->group_of[p->index], j;
    if (w->marks[p->index]++ == 0) memcpy(w->at_mark[p->index], p->grad, p->count * sizeof(float));
    if (k + 1 < w->ngroups)
        for (j = 0; j < 2; j++) {
            ddp_param* q = w->group[k + 1][j];
            if (q != w->g->wte && nonzero(q) && w->late[p->index] < 0) w->late[p->index] = q->index;
        }
}

static void watch_setup(watch* w, gpt* g) {
    int l, i;
    memset(w, 0, sizeof *w);
    w->g = g;
    add_group(w, g->lnf_w, g->lnf_b);
    for (l = g->cfg.layers - 1; l >= 0; l--) {
        gpt_block* k = &g->h[l];
        add_group(w, k->mlp_proj_w, k->mlp_proj_b), add_group(w, k->fc_w, k->fc_b);
        add_group(w, k->ln2_w, k->ln2_b), add_group(w, k->attn_proj_w, k->attn_proj_b);
        add_group(w, k->attn_w, k->attn_b), add_group(w, k->ln1_w, k->ln1_b);
    }
    add_group(w, g->wpe, g->wte);
    for (i = 0; i < ddp_model_num_params(g->m); i++) {
        ddp_param* p = ddp_model_param(g->m, i);
        w->at_mark[i] = (float*)calloc(p->count, sizeof(float));
        w->late[i] = -1;
        DDP_CHECK(ddp_param_add_hook(p, watch_hook, w));
    }
}

static void ready_once_when_final(void) {
    gpt_config cfg = tiny();
    gpt mine, ref;
    watch w;
    int x[GLOBAL_B * T_], y[GLOBAL_B * T_], i, shown = 0, marked = 0;
    gpt_create(&mine, &cfg, cpu(), GLOBAL_B * T_, 7);
    gpt_create(&ref, &cfg, cpu(), GLOBAL_B * T_, 7);
    watch_setup(&w, &mine);
    sequences(1, GLOBAL_B, x, y);
    DDP_CHECK(ddp_model_zero_grad(mine.m));
    DDP_CHECK(ddp_model_zero_grad(ref.m));
    gpt_forward(&mine, x, y, GLOBAL_B, T_);
    gpt_forward(&ref, x, y, GLOBAL_B, T_);
    lab_progress("the forward ran; lab_gpt_backward had not returned");
    lab_gpt_backward(&mine, 1.f);
    gpt_backward(&ref, 1.f);
    for (i = 0; i < ddp_model_num_params(mine.m); i++) marked += w.marks[i] > 0;
    if (!marked) {
        lab_failf("[rule G1: once, when final] none of the model's %d tensors was marked ready: under ddp_wrap no "
                  "gradient would ever be averaged (ddp_param_grad_ready(p), once per tensor per backward)",
                  ddp_model_num_params(mine.m));
        shown = 1;
    }
    for (i = 0; i < ddp_model_num_params(mine.m) && marked; i++) {
        ddp_param *p = ddp_model_param(mine.m, i), *r = ddp_model_param(ref.m, i);
        double d = rel_l2(p->grad, r->grad, p->count);
        if (d > 1e-6) {
            if (shown++ < 4)
                lab_failf("[keep the arithmetic] %s: its gradient differs from examples/gpt.h's (relative difference "
                          "%.2g): part 1 only adds the marks; the backward's operations stay as they are",
                          p->name, d);
            continue;
        }
        if (w.marks[i] == 0) {
            if (shown++ < 4)
                lab_failf("[rule G1: once, when final] %s was never marked ready: DDP would never average its "
                          "gradient (ddp_param_grad_ready(p) once per tensor per backward)", p->name);
            continue;
        }
        d = rel_l2(w.at_mark[i], r->grad, p->count);
        if (d > 1e-6) {
            if (shown++ < 4)
                lab_failf("[rule G1: once, when final] %s was marked ready before its gradient was final: when it was "
                          "marked, its gradient had norm %.4g; backward then still added to it, and it ended with "
                          "norm %.4g. From the mark on DDP may read p->grad at any moment: what comes after reaches the "
                          "other ranks late or never%s", p->name, l2(w.at_mark[i], p->count), l2(r->grad, p->count),
                          p == mine.wte ? " (which operations of backward add into this tensor's gradient?)" : "");
            continue;
        }
        if (w.late[i] >= 0 && shown++ < 4)
            lab_failf("[rule G2: as soon as final] %s was marked ready only after backward had gone on to the next "
                      "operation (%s already had its gradient): mark each tensor right after the operation that "
                      "completes its gradient, so that its bucket's all-reduce overlaps the rest of backward",
                      p->name, ddp_model_param(mine.m, w.late[i])->name);
    }
    if (shown > 4) lab_note("(%d problems in all)", shown);
    if (!shown)
        lab_note("%d tensors, each marked once, with its final gradient, right after the operation that completes "
                 "it", marked);
    gpt_free(&mine), gpt_free(&ref);
}

/* ---- part 1b: W ranks under ddp_wrap, against one process ------------------------------------------ */

typedef struct train_result {
    int done;
    char message[400];
    float w[MAX_ELEMS];
} train_result;

typedef struct train_cfg {
    int world, zero_stage;
    train_result* results;
} train_cfg;

static size_t copy_weights(ddp_model* m, float* out) {
    size_t n = 0;
    int i;
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        if (n + p->count > MAX_ELEMS) return 0;
        memcpy(out + n, p->data, p->count * sizeof(float));
        n += p->count;
    }
    return n;
}

static void make_optim(ddp_model* m, ddp_optim** o) {
    ddp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = DDP_ADAMW, od.lr = 1e-2f, od.beta1 = 0.9f, od.beta2 = 0.95f, od.weight_decay = 0.1f;
    DDP_CHECK(ddp_optim_create(m, &od, o));
}

static int train_rank(int rank, void* arg) {
    const train_cfg* c = (const train_cfg*)arg;
    train_result* res = &c->results[rank];
    gpt_config cfg = tiny();
    const int per = GLOBAL_B / c->world;
    ddp_desc dd;
    ddp_wrap_desc wd;
    ddp_pg* pg;
    ddp_wrapper* w;
    ddp_optim* o;
    gpt g;
    int x[GLOBAL_B * T_], y[GLOBAL_B * T_], s, k;
    float norm;
    memset(&dd, 0, sizeof dd), memset(&wd, 0, sizeof wd);
    dd.device = cpu(), dd.timeout_s = 20;
    if (ddp_init(&dd, &pg) != DDP_OK) {
        snprintf(res->message, sizeof res->message, "ddp_init failed: %s", ddp_error_string());
        return 1;
    }
    gpt_create(&g, &cfg, cpu(), GLOBAL_B * T_, 7);
    wd.zero_stage = c->zero_stage;
    DDP_CHECK(ddp_wrap(pg, g.m, &wd, &w));
    make_optim(g.m, &o);
    for (s = 0; s < STEPS; s++) {
        DDP_CHECK(ddp_model_zero_grad(g.m));
        for (k = 0; k < ACCUM; k++) {
            ddp_no_sync(w, k < ACCUM - 1);
            sequences(100 + (uint64_t)(s * ACCUM + k), GLOBAL_B, x, y);
            lab_progress("rank %d, step %d, micro-batch %d: in forward or in lab_gpt_backward", rank, s + 1, k + 1);
            gpt_forward(&g, x + rank * per * T_, y + rank * per * T_, per, T_);
            lab_gpt_backward(&g, 1.f / ACCUM);
        }
        DDP_CHECK(ddp_optim_clip_grad_norm(o, 1.f, &norm));
        DDP_CHECK(ddp_optim_step(o));
    }
    DDP_CHECK(ddp_full_params(w, 1)); /* ZeRO-3: every weight on every rank, for the comparison */
    copy_weights(g.m, res->w);
    DDP_CHECK(ddp_full_params(w, 0));
    res->done = 1;
    ddp_optim_destroy(o);
    ddp_wrapper_destroy(w);
    gpt_free(&g);
    ddp_destroy(pg);
    return 0;
}

/* The same steps in one process on the whole batch, with examples/gpt.h's backward. */
static size_t train_reference(float* out) {
    gpt_config cfg = tiny();
    ddp_optim* o;
    gpt g;
    int x[GLOBAL_B * T_], y[GLOBAL_B * T_], s, k;
    float norm;
    size_t n;
    gpt_create(&g, &cfg, cpu(), GLOBAL_B * T_, 7);
    make_optim(g.m, &o);
    for (s = 0; s < STEPS; s++) {
        DDP_CHECK(ddp_model_zero_grad(g.m));
        for (k = 0; k < ACCUM; k++) {
            sequences(100 + (uint64_t)(s * ACCUM + k), GLOBAL_B, x, y);
            gpt_forward(&g, x, y, GLOBAL_B, T_);
            gpt_backward(&g, 1.f / ACCUM);
        }
        DDP_CHECK(ddp_optim_clip_grad_norm(o, 1.f, &norm));
        DDP_CHECK(ddp_optim_step(o));
    }
    n = copy_weights(g.m, out);
    ddp_optim_destroy(o);
    gpt_free(&g);
    return n;
}

static void train_and_compare(int world, int zero_stage) {
    static float ref[MAX_ELEMS];
    train_cfg c;
    gpt_config cfg = tiny();
    gpt names;
    size_t n = train_reference(ref);
    int r, worst = -1, failed = 0;
    lab_need_loopback();
    c.world = world, c.zero_stage = zero_stage;
    c.results = (train_result*)lab_shared(sizeof(train_result) * (size_t)world);
    if (!c.results) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_slow_hint("3 steps of a tiny model take well under a second: is a rank waiting in a collective the others "
                  "never reach (a tensor marked in one rank's backward and not another's)?");
    if (ddp_spawn(world, train_rank, &c) != DDP_OK)
        lab_failf("W = %d, zero_stage %d: the ranks did not all finish: %s", world, zero_stage, ddp_error_string());
    for (r = 0; r < world; r++)
        if (!c.results[r].done) {
            if (c.results[r].message[0]) lab_failf("W = %d, rank %d: %s", world, r, c.results[r].message);
            failed = 1;
        }
    if (failed) {
        lab_note("(a rank stopped in its training: case ready_once_when_final checks each tensor's mark in one "
                 "process, and names what is wrong there)");
        return;
    }
    gpt_create(&names, &cfg, cpu(), 1, 7);
    for (r = 0; r < world; r++) {
        double d, most = 0;
        size_t at = 0;
        int i;
        d = rel_l2(c.results[r].w, ref, n);
        if (d <= 1e-5) continue;
        for (i = 0; i < ddp_model_num_params(names.m); at += ddp_model_param(names.m, i)->count, i++) {
            double di = rel_l2(c.results[r].w + at, ref + at, ddp_model_param(names.m, i)->count);
            if (di > most) most = di, worst = i;
        }
        lab_failf("[rule G4: the same training as one process] W = %d, zero_stage %d, rank %d: after %d steps the "
                  "weights differ from one process's on the whole batch by %.3g (relative; at most 1e-5). Most of all "
                  "%s (%.3g)", world, zero_stage, r, STEPS, d, ddp_model_param(names.m, worst)->name, most);
        break;
    }
    if (worst < 0)
        lab_note("W = %d, zero_stage %d: %d steps (%d micro-batches each, clipped at 1.0) end with one process's "
                 "weights on every rank", world, zero_stage, STEPS, ACCUM);
    gpt_free(&names);
}

static void ddp_two_ranks(void) { train_and_compare(2, 0); }
static void ddp_four_ranks(void) { train_and_compare(4, 0); }
static void ddp_two_ranks_zero2(void) { train_and_compare(2, 2); }
static void ddp_four_ranks_zero3(void) { train_and_compare(4, 3); }

/* ---- part 2: the validation loss -------------------------------------------------------------------- */

#define MAX_EVAL 64
typedef struct val_result {
    int done;
    char message[400];
    float returned;
    int n;                 /* batches this rank evaluated */
    int which[MAX_EVAL];   /* ... their numbers */
    float loss[MAX_EVAL];  /* ... their losses */
} val_result;

typedef struct val_cfg {
    int world, zero_stage, batches;
    val_result* results;
} val_cfg;

struct lab_val {
    gpt* g;
    int batches;
    val_result* res;
};

int lab_val_batches(const lab_val* v) { return v->batches; }

float lab_val_loss_of(lab_val* v, int e) {
    int x[2 * T_], y[2 * T_];
    float loss;
    if (e < 0) {
        fprintf(stderr, "lab_val_loss_of: batch %d: the batches are numbered 0, 1, 2, ...\n", e);
        return NAN;
    }
    sequences(1000 + (uint64_t)e, 2, x, y);
    loss = gpt_forward(v->g, x, y, 2, T_);
    if (v->res->n < MAX_EVAL) v->res->which[v->res->n] = e, v->res->loss[v->res->n] = loss;
    v->res->n++;
    return loss;
}

static int val_rank(int rank, void* arg) {
    const val_cfg* c = (const val_cfg*)arg;
    val_result* res = &c->results[rank];
    gpt_config cfg = tiny();
    ddp_desc dd;
    ddp_wrap_desc wd;
    ddp_pg* pg;
    ddp_wrapper* w;
    lab_val v;
    gpt g;
    memset(&dd, 0, sizeof dd), memset(&wd, 0, sizeof wd);
    dd.device = cpu(), dd.timeout_s = 10;
    if (ddp_init(&dd, &pg) != DDP_OK) {
        snprintf(res->message, sizeof res->message, "ddp_init failed: %s", ddp_error_string());
        return 1;
    }
    gpt_create(&g, &cfg, cpu(), 2 * T_, 7);
    wd.zero_stage = c->zero_stage;
    DDP_CHECK(ddp_wrap(pg, g.m, &wd, &w));
    v.g = &g, v.batches = c->batches, v.res = res;
    lab_progress("rank %d: in lab_gpt_val_loss", rank);
    res->returned = lab_gpt_val_loss(pg, &v);
    res->done = 1;
    ddp_wrapper_destroy(w);
    gpt_free(&g);
    ddp_destroy(pg);
    return 0;
}

static void val_check(int world, int batches, int zero_stage) {
    val_cfg c;
    int r, e, per, want = (batches + world - 1) / world * world, bad = 0;
    int times[MAX_EVAL * 4];
    double sum = 0;
    int count = 0;
    lab_need_loopback();
    c.world = world, c.batches = batches, c.zero_stage = zero_stage;
    c.results = (val_result*)lab_shared(sizeof(val_result) * (size_t)world);
    if (!c.results) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_slow_hint(zero_stage == 3 ? "under ZeRO-3 every forward gathers the weights, a collective: does a rank run "
                                    "more forwards than another, and wait for a gather nobody else joins?"
                                  : "a few forwards of a tiny model take well under a second: is a rank waiting in a "
                                    "collective the others never call?");
    if (ddp_spawn(world, val_rank, &c) != DDP_OK)
        lab_failf("W = %d, N = %d: the ranks did not all finish: %s", world, batches, ddp_error_string());
    for (r = 0; r < world; r++)
        if (!c.results[r].done) {
            lab_failf("W = %d, N = %d, rank %d: %s", world, batches, r,
                      c.results[r].message[0] ? c.results[r].message : "did not finish");
            return;
        }
    /* rule V1: each batch of 0 .. want-1 once, equal shares */
    memset(times, 0, sizeof times);
    for (r = 0; r < world; r++)
        for (e = 0; e < c.results[r].n && e < MAX_EVAL; e++) {
            int b = c.results[r].which[e];
            if (b >= 0 && b < MAX_EVAL * 4) times[b]++;
            if (b >= want && !bad++)
                lab_failf("[rule V1: shares] W = %d, N = %d: rank %d evaluated batch %d, but the batches are 0 .. %d "
                          "(N rounded up to a multiple of W)", world, batches, r, b, want - 1);
            sum += c.results[r].loss[e], count++;
        }
    for (e = 0; e < want && !bad; e++)
        if (times[e] != 1) {
            bad++;
            lab_failf("[rule V1: shares] W = %d, N = %d: batch %d was evaluated %d times over all ranks: each batch by "
                      "exactly one rank%s", world, batches, e, times[e],
                      times[e] == world ? " (every rank evaluated it: a share each, not every batch each)"
                      : e >= batches ? " (N rounded up to a multiple of W: the last ones too)" : "");
        }
    per = want / world;
    for (r = 0; r < world && !bad; r++)
        if (c.results[r].n != per) {
            bad++;
            lab_failf("[rule V1: shares] W = %d, N = %d: rank %d evaluated %d batches, expected %d on every rank: "
                      "under ZeRO-3 each forward is a collective, and a rank with more of them waits for ever",
                      world, batches, r, c.results[r].n, per);
        }
    /* rule V2: the job's mean on every rank */
    for (r = 0; r < world && count; r++) {
        double want_loss = sum / count, got = c.results[r].returned;
        if (fabs(got - want_loss) > 1e-5 * fabs(want_loss) || got != got) {
            double own = 0;
            for (e = 0; e < c.results[r].n && e < MAX_EVAL; e++) own += c.results[r].loss[e];
            own = c.results[r].n ? own / c.results[r].n : 0;
            lab_failf("[rule V2: the job's loss] W = %d, N = %d: rank %d returned %.6f; the mean over all %d batches "
                      "is %.6f%s", world, batches, r, got, count, want_loss,
                      world > 1 && fabs(got - own) <= 1e-6 * fabs(own)
                          ? " (that is the mean of this rank's own batches only: what did the others find?)" : "");
            bad++;
            break;
        }
        if (r > 0 && memcmp(&c.results[r].returned, &c.results[0].returned, sizeof(float)) != 0) {
            lab_failf("[rule V2: the job's loss] W = %d: rank %d returned %.9g and rank 0 %.9g: the same number on "
                      "every rank", world, r, (double)c.results[r].returned, (double)c.results[0].returned);
            bad++;
            break;
        }
    }
    if (!bad)
        lab_note("W = %d, N = %d%s: %d batches, %d per rank; every rank returned %.5f", world, batches,
                 zero_stage ? ", ZeRO-3" : "", want, per, (double)c.results[0].returned);
}

static void val_one_rank(void) { val_check(1, 5, 0); }
static void val_two_ranks(void) { val_check(2, 6, 0); }
static void val_three_ranks_rounded_up(void) { val_check(3, 5, 0); }
static void val_four_ranks_rounded_up(void) { val_check(4, 5, 0); }
static void val_two_ranks_zero3(void) { val_check(2, 3, 3); }

/* ---- part 3: clipping under ZeRO-2 ------------------------------------------------------------------- */

#define MAX_N 1024
typedef struct clip_result {
    int done;
    char message[400];
    float shard[MAX_N + 8];
    float norm;
    unsigned long long sent;
    ddp_status status;
} clip_result;

typedef struct clip_cfg {
    int world;
    size_t n;
    float max_norm;
    clip_result* results;
} clip_cfg;

/* Rank r's own gradient: numbers of its own, around a direction the ranks share (as gradients of
   different batches are), so the average is not small. */
static void rank_grad(int rank, size_t n, float* g) {
    lab_rng a, b;
    size_t i;
    lab_rng_seed(&a, 31, 0), lab_rng_seed(&b, 31, 1 + (uint64_t)rank);
    for (i = 0; i < n; i++) g[i] = (float)((2 * lab_rng_uniform(&a) - 1) + 1.5 * (2 * lab_rng_uniform(&b) - 1)) * 0.1f;
}

static int clip_rank(int rank, void* arg) {
    const clip_cfg* c = (const clip_cfg*)arg;
    clip_result* res = &c->results[rank];
    const size_t S = (c->n + (size_t)c->world - 1) / (size_t)c->world;
    ddp_desc dd;
    ddp_pg* pg;
    float grad[MAX_N];
    uint64_t sent0, sent1, recv;
    size_t i;
    memset(&dd, 0, sizeof dd);
    dd.device = cpu(), dd.timeout_s = 10;
    if (ddp_init(&dd, &pg) != DDP_OK) {
        snprintf(res->message, sizeof res->message, "ddp_init failed: %s", ddp_error_string());
        return 1;
    }
    rank_grad(rank, c->n, grad);
    for (i = 0; i < S + 8; i++) res->shard[i] = i < S ? NAN : 12345.f; /* past S: a guard */
    res->norm = NAN;
    ddp_pg_bytes(pg, &sent0, &recv);
    lab_progress("rank %d: in lab_gpt_clip", rank);
    res->status = lab_gpt_clip(pg, grad, c->n, res->shard, c->max_norm, &res->norm);
    ddp_pg_bytes(pg, &sent1, &recv);
    res->sent = (unsigned long long)(sent1 - sent0);
    res->done = 1;
    ddp_destroy(pg);
    return 0;
}

static void clip_check(int world, size_t n, float max_norm) {
    static float avg[MAX_N + 4 * 8], own[MAX_N];
    clip_cfg c;
    const size_t S = (n + (size_t)world - 1) / (size_t)world;
    double norm = 0, coef;
    int r, bad = 0;
    size_t i;
    lab_need_loopback();
    c.world = world, c.n = n, c.max_norm = max_norm;
    c.results = (clip_result*)lab_shared(sizeof(clip_result) * (size_t)world);
    if (!c.results) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_slow_hint("one reduce-scatter and a number or two: is a rank waiting in a collective the others never call?");
    if (ddp_spawn(world, clip_rank, &c) != DDP_OK)
        lab_failf("W = %d, n = %zu: the ranks did not all finish: %s", world, n, ddp_error_string());
    memset(avg, 0, sizeof avg);
    for (r = 0; r < world; r++) {
        rank_grad(r, n, own);
        for (i = 0; i < n; i++) avg[i] += own[i] / (float)world;
    }
    for (i = 0; i < n; i++) norm += (double)avg[i] * avg[i];
    norm = sqrt(norm);
    coef = max_norm / (norm + 1e-6);
    for (r = 0; r < world && !bad; r++) {
        clip_result* res = &c.results[r];
        const float* mine = avg + (size_t)r * S;
        float want[MAX_N];
        double d, shard_norm = 0, rs_bytes = (double)(world - 1) * S * sizeof(float);
        if (!res->done) {
            lab_failf("W = %d, n = %zu, rank %d: %s", world, n, r, res->message[0] ? res->message : "did not finish");
            return;
        }
        if (res->status != DDP_OK) {
            lab_failf("W = %d, n = %zu, rank %d: lab_gpt_clip returned %s", world, n, r, ddp_status_name(res->status));
            return;
        }
        for (i = 0; i < S; i++) {
            want[i] = (size_t)r * S + i < n ? (float)(mine[i] * (coef < 1 ? coef : 1)) : 0.f;
            shard_norm += (size_t)r * S + i < n ? (double)mine[i] * mine[i] : 0;
        }
        shard_norm = sqrt(shard_norm);
        for (i = S; i < S + 8; i++)
            if (res->shard[i] != 12345.f) {
                lab_failf("[rule C1: the shard] W = %d, n = %zu, rank %d wrote shard[%zu], past its S = ceil(n / W) = "
                          "%zu floats", world, n, r, i, S);
                return;
            }
        /* rule C2 first: a wrong norm explains a wrong shard */
        if (!(fabs(res->norm - norm) <= 1e-5 * norm)) {
            double local = 0;
            rank_grad(r, n, own);
            for (i = 0; i < n; i++) local += (double)own[i] * own[i];
            local = sqrt(local);
            lab_failf("[rule C2: the global norm] W = %d, n = %zu, rank %d: *norm = %.6g; the averaged gradient's norm "
                      "is %.6g%s", world, n, r, (double)res->norm, norm,
                      fabs(res->norm - shard_norm) <= 1e-5 * shard_norm
                          ? " (that is the norm of this rank's shard alone: every shard's squares count)"
                      : fabs(res->norm - local) <= 1e-5 * local
                          ? " (that is the norm of this rank's own gradient, before the reduce-scatter: the norm "
                            "that counts is the averaged gradient's)"
                      : fabs(res->norm - norm * world) <= 1e-5 * norm * world
                          ? " (W times too large: a sum of the gradients, not their average?)" : "");
            bad++;
            break;
        }
        d = rel_l2(res->shard, want, S);
        if (d > 1e-5) {
            int pad_bad = 0;
            for (i = 0; i < S; i++)
                if ((size_t)r * S + i >= n && res->shard[i] != 0) pad_bad = 1;
            if (pad_bad)
                lab_failf("[rule C1: the shard] W = %d, n = %zu, rank %d: shard[%zu..%zu] is past the gradient's %zu "
                          "numbers, so 0 (the padding), and it is not", world, n, r, n - (size_t)r * S, S - 1, n);
            else if (coef < 1 && rel_l2(res->shard, mine, n - (size_t)r * S < S ? n - (size_t)r * S : S) <= 1e-5)
                lab_failf("[rule C3: the clip] W = %d, n = %zu, rank %d: the shard is the average, not clipped: the "
                          "norm %.4g is above max_norm %.4g, so every number is multiplied by %.6g", world, n, r,
                          norm, (double)max_norm, coef);
            else
                lab_failf("[rule %s] W = %d, n = %zu, rank %d: the shard differs from rank %d's part (elements %zu .. "
                          "%zu) of the averaged gradient%s by %.3g (relative; at most 1e-5)",
                          coef < 1 ? "C1: the shard, or C3: the clip" : "C1: the shard", world, n, r, r,
                          (size_t)r * S, (size_t)r * S + S - 1, coef < 1 ? ", clipped," : "", d);
            bad++;
            break;
        }
        if ((double)res->sent > rs_bytes * 1.1 + 256.0 * world) {
            lab_failf("[rule C4: ZeRO-2's bytes] W = %d, n = %zu, rank %d sent %llu bytes; one reduce-scatter of its %zu "
                      "floats per rank sends %.0f, and the norm a few numbers more%s", world, n, r, res->sent, S,
                      rs_bytes, (double)res->sent > 1.8 * rs_bytes ? " (twice as much: an all-reduce of the whole "
                                                                     "gradient?)" : "");
            bad++;
            break;
        }
    }
    if (!bad)
        lab_note("W = %d, n = %zu (S = %zu): norm %.5f on every rank, %s; each rank sent %llu bytes", world, n, S,
                 norm, coef < 1 ? "every shard clipped" : "below max_norm: nothing clipped", c.results[0].sent);
}

static void clip_one_rank(void) { clip_check(1, 100, 0.5f); }
static void clip_two_ranks_below_max(void) { clip_check(2, 100, 1e6f); }
static void clip_two_ranks(void) { clip_check(2, 1000, 0.5f); }
static void clip_three_ranks_padded(void) { clip_check(3, 37, 0.2f); }
static void clip_four_ranks(void) { clip_check(4, 1000, 0.5f); }

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(ready_once_when_final, 30);
    LAB_CASE(ddp_two_ranks, 60);
    LAB_CASE(ddp_four_ranks, 60);
    LAB_CASE(ddp_two_ranks_zero2, 60);
    LAB_CASE(ddp_four_ranks_zero3, 60);
    LAB_CASE(val_one_rank, 30);
    LAB_CASE(val_two_ranks, 30);
    LAB_CASE(val_three_ranks_rounded_up, 30);
    LAB_CASE(val_four_ranks_rounded_up, 30);
    LAB_CASE(val_two_ranks_zero3, 30);
    LAB_CASE(clip_one_rank, 30);
    LAB_CASE(clip_two_ranks_below_max, 30);
    LAB_CASE(clip_two_ranks, 30);
    LAB_CASE(clip_three_ranks_padded, 30);
    LAB_CASE(clip_four_ranks, 30);
    return lab_end();
}
