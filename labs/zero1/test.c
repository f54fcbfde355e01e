/* labs/zero1/test.c: the tests of lab "zero1", built together with the student's file and ddp.h's
   implementation.

   The ownership cases (rule Z1) call lab_zero1_owned directly, with the first/len arrays full of
   garbage, and check each answer against the rule itself: shards of S = ceil(N / W) elements,
   every element owned by exactly one rank.

   The other cases start W ranks with ddp_spawn (ddp.h's CPU backend, over TCP on 127.0.0.1).
   Every rank wraps the same small MLP with ddp_wrap (zero_stage 0: after backward every rank
   holds the same averaged gradients), creates the student's optimizer and trains on its share of
   the same global batches. Around every lab_zero1_step the rank reads ddp_pg_collectives and
   ddp_pg_bytes (what the step communicated), and after it the weights; it hands all of that back
   through shared memory. The reference is computed here in one process, without DDP and without
   sharding: ddp.h's own optimizer (torch.optim.SGD's and torch.optim.Adam's rules) on the whole
   global batch. */
#include "../lab_test.h"

#include <math.h>
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h> /* mallinfo2: how much of the heap is in use */
#define LAB_HEAP 1
#endif

#include "ddp.h"
#include "zero1.h"

#define MAX_STEPS 50
#define MAX_N 512     /* model elements */
#define MAX_PARAMS 16
#define GLOBAL_B 12   /* rows per step; 1, 2, 3 and 4 ranks take equal shares */
#define TOL 1e-5      /* relative L2 difference from the reference */

/* ---- part 1a: ownership ---------------------------------------------------------------------- */

/* The rule: rank r owns the flat range [lo, hi). */
static void shard_range(size_t n, int world, int rank, size_t* S, size_t* lo, size_t* hi) {
    *S = (n + (size_t)world - 1) / (size_t)world;
    *lo = *S * (size_t)rank;
    if (*lo > n) *lo = n;
    *hi = *lo + *S < n ? *lo + *S : n;
}

/* Check lab_zero1_owned for one model on `world` ranks, every rank: first that every element has
   exactly one owner, then each rank's answer against the rule. Prints at most 4 messages; returns
   the number of problems. */
static int check_ownership(const size_t* counts, int nparams, int world) {
    static size_t first[16][MAX_PARAMS], len[16][MAX_PARAMS], got_S[16];
    unsigned char owners[4096];
    size_t n = 0, at, S, lo, hi;
    int r, i, bad = 0, shown = 0;
    char setting[700];
    for (i = 0; i < nparams; i++) n += counts[i];
    snprintf(setting, sizeof setting, "counts {%s} (N = %zu), W = %d", lab_fmt_sizes(counts, nparams), n, world);
    for (r = 0; r < world; r++) {
        memset(first[r], 0xA5, sizeof first[r]); /* documented: filled in by the call */
        memset(len[r], 0xA5, sizeof len[r]);
        got_S[r] = lab_zero1_owned(counts, nparams, world, r, first[r], len[r]);
    }
    /* every element owned by exactly one rank, according to the answers */
    memset(owners, 0, n);
    for (r = 0; r < world; r++)
        for (at = 0, i = 0; i < nparams; at += counts[i], i++) {
            size_t k;
            if (len[r][i] == 0) continue;
            if (len[r][i] > counts[i] || first[r][i] > counts[i] - len[r][i]) {
                if (shown++ < 4)
                    lab_failf("[rule Z1: ownership] %s, rank %d: parameter %d has %zu elements, but first %zu, len %zu "
                              "reaches past its end", setting, r, i, counts[i], first[r][i], len[r][i]);
                bad++;
                continue;
            }
            for (k = 0; k < len[r][i]; k++)
                if (owners[at + first[r][i] + k] < 255) owners[at + first[r][i] + k]++;
        }
    for (at = 0; at < n; at++) {
        size_t e = at;
        if (owners[at] == 1) continue;
        while (e + 1 < n && owners[e + 1] == owners[at]) e++;
        bad++;
        if (shown++ < 2)
            lab_failf("[rule Z1: ownership] %s: flat elements %zu..%zu are owned by %s rank%s: every element by exactly "
                      "one%s", setting, at, e, owners[at] == 0 ? "no" : owners[at] == 2 ? "two" : "several",
                      owners[at] == 0 ? "" : "s",
                      owners[at] == 0 && e == n - 1 && at > 0 ? " (the end of the model: is S rounded down?)" : "");
        at = e;
    }
    /* each rank's answer against the rule */
    for (r = 0; r < world; r++) {
        shard_range(n, world, r, &S, &lo, &hi);
        if (got_S[r] != S) {
            bad++;
            if (shown++ < 4)
                lab_failf("[rule Z1: ownership] %s, rank %d: returned S = %zu, expected ceil(N / W) = %zu%s", setting, r,
                          got_S[r], S,
                          n % (size_t)world && got_S[r] == n / (size_t)world ? " (N / W rounded down)" : "");
        }
        for (at = 0, i = 0; i < nparams; at += counts[i], i++) {
            size_t a = lo > at ? lo : at, b = hi < at + counts[i] ? hi : at + counts[i];
            size_t want_len = b > a ? b - a : 0, want_first = a - at;
            if (len[r][i] == want_len && (want_len == 0 || first[r][i] == want_first)) continue;
            bad++;
            if (shown++ >= 4) continue;
            if (want_len == 0)
                lab_failf("[rule Z1: ownership] %s, rank %d (flat %zu..%zu): parameter %d (flat %zu..%zu) is not in its "
                          "shard, so len = 0; got first %zu, len %zu", setting, r, lo, hi - (hi > lo), i, at,
                          at + counts[i] - 1, first[r][i], len[r][i]);
            else
                lab_failf("[rule Z1: ownership] %s, rank %d (flat %zu..%zu): parameter %d (%zu elements, flat %zu..%zu): "
                          "expected first %zu, len %zu (flat %zu..%zu); got first %zu, len %zu", setting, r, lo, hi - 1, i,
                          counts[i], at, at + counts[i] - 1, want_first, want_len, a, b - 1, first[r][i], len[r][i]);
        }
    }
    if (shown > 4) lab_note("(%d problems in all for %s)", bad, setting);
    return bad;
}

static void ownership_worked_examples(void) {
    /* 4 parameters, N = 15: W = 2 cuts parameter 1 (flat 6..8) at 8; W = 4 has a short last
       shard; W = 7 (more ranks than parameters): S = 3, ranks 5 and 6 own nothing */
    static const size_t a[4] = {6, 3, 4, 2};
    /* N = 10, W = 4: S = 3, the last shard 1 element (S rounded down, 2, would leave out 2) */
    static const size_t b[3] = {4, 4, 2};
    /* one parameter over three shards, and W > N */
    static const size_t c[1] = {3};
    /* the MLP of the other cases: 6 -> 10 -> 8 -> 3 */
    static const size_t mlp[6] = {60, 10, 80, 8, 24, 3};
    static const int worlds_a[5] = {2, 7, 1, 3, 4}; /* the starter's example first */
    int i, bad = 0;
    /* the first setting that fails is reported, not every one */
    for (i = 0; i < 5 && !bad; i++) bad += check_ownership(a, 4, worlds_a[i]);
    if (!bad) bad += check_ownership(b, 3, 4);
    if (!bad) bad += check_ownership(c, 1, 3);
    if (!bad) bad += check_ownership(c, 1, 5);
    for (i = 1; i <= 8 && !bad; i++) bad += check_ownership(mlp, 6, i);
    if (!bad)
        lab_note("counts {6 3 4 2} on 2, 7, 1, 3, 4 ranks; {4 4 2} on 4; {3} on 3 and 5; {60 10 80 8 24 3} on 1 to 8: "
                 "all right");
}

static void ownership_random_from_seed(void) {
    lab_rng g;
    int t, bad = 0;
    lab_rng_seed(&g, lab_seed(), 71);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    for (t = 0; t < 40 && bad == 0; t++) {
        size_t counts[8];
        int nparams = 1 + (int)lab_rng_below(&g, 8), world = 1 + (int)lab_rng_below(&g, 16), i;
        for (i = 0; i < nparams; i++) counts[i] = 1 + lab_rng_below(&g, t % 2 ? 60 : 6);
        bad += check_ownership(counts, nparams, world);
    }
    if (!bad) lab_note("40 models of 1 to 8 parameters on 1 to 16 ranks: all right");
}

/* ---- the runs: W ranks training with the student's optimizer --------------------------------- */

typedef struct rank_result {
    int done;
    char message[512];
    size_t n;                         /* the model's elements */
    size_t state_bytes;               /* lab_zero1_state_bytes after the last step */
    long long held;                   /* heap bytes lab_zero1_create and the first lab_zero1_step left
                                         allocated; -1: not measurable here */
    long long held_create;            /* ... of which lab_zero1_create */
    float before[MAX_N];              /* the weights before the first step */
    float after[MAX_STEPS][MAX_N];    /* ... after each step */
    long collectives[MAX_STEPS];      /* collectives issued inside lab_zero1_step */
    unsigned long long sent[MAX_STEPS]; /* bytes this rank sent inside lab_zero1_step */
} rank_result;

typedef struct run_cfg {
    int world, steps, nsizes;
    int poison; /* 1: before each step, every gradient outside the rank's shard is set to NaN */
    int measure; /* 1: one all-gather of S floats before lab_zero1_create, so that ddp.h's own
                    buffers for it already exist when the heap is measured */
    int sizes[4];
    lab_zero1_desc d;
    rank_result* results;
} run_cfg;

static ddp_model* make_model(const run_cfg* c) {
    ddp_model_desc md;
    ddp_model* m = NULL;
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 11;
    if (ddp_model_mlp(&md, c->sizes, c->nsizes, DDP_LAYER_RELU, &m) != DDP_OK) return NULL;
    return m;
}

/* The global batch of step s: GLOBAL_B rows, the same in every rank and in the reference. */
static void global_batch(const run_cfg* c, int s, float* x, int* y) {
    ddp_rng g = ddp_rng_seed(500 + (uint64_t)s);
    int i, feat = c->sizes[0], classes = c->sizes[c->nsizes - 1];
    for (i = 0; i < GLOBAL_B * feat; i++) x[i] = 2 * ddp_rng_uniform(&g) - 1;
    for (i = 0; i < GLOBAL_B; i++) y[i] = (int)ddp_rng_below(&g, (uint32_t)classes);
}

static size_t copy_weights(ddp_model* m, float* out) {
    size_t n = 0;
    int i;
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        if (n + p->count > MAX_N) return 0;
        memcpy(out + n, p->data, p->count * sizeof(float));
        n += p->count;
    }
    return n;
}

/* Bytes of the heap in use (this thread's arena, and the large blocks glibc maps on their own), or
   -1 where that cannot be read: another C library, or a sanitizer's allocator, which mallinfo2
   does not see (a probe of 1 MiB tells). */
static long long heap_in_use(void) {
#ifdef LAB_HEAP
    static int works = -1;
    struct mallinfo2 a, b;
    if (works < 0) {
        void* probe;
        a = mallinfo2();
        probe = malloc((size_t)1 << 20);
        b = mallinfo2();
        works = probe && (b.uordblks + b.hblkhd) - (a.uordblks + a.hblkhd) >= ((size_t)1 << 20);
        free(probe);
    }
    if (works) {
        a = mallinfo2();
        return (long long)(a.uordblks + a.hblkhd);
    }
#endif
    return -1;
}

/* Rule Z6's trap: NaN in every gradient this rank does not own. A rank that updates only its
   shard never reads them; one that updates the whole model writes NaN where the all-gather then
   has to put the owners' values. */
static void poison_others(ddp_model* m, int world, int rank) {
    size_t n = ddp_model_num_elements(m), S, lo, hi, at = 0, k;
    int i;
    shard_range(n, world, rank, &S, &lo, &hi);
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        for (k = 0; k < p->count; k++, at++)
            if (at < lo || at >= hi) p->grad[k] = NAN;
    }
}

static int rank_main(int rank, void* arg) {
    const run_cfg* c = (const run_cfg*)arg;
    rank_result* res = &c->results[rank];
    ddp_desc dd;
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    lab_zero1* z = NULL;
    ddp_status st;
    float x[GLOBAL_B * 16], loss;
    int y[GLOBAL_B], s, per = GLOBAL_B / c->world, feat = c->sizes[0];
    long long heap0, heap1 = -1;
    memset(&dd, 0, sizeof dd);
    dd.device.type = DDP_DEVICE_CPU;
    dd.timeout_s = 20;
    if (ddp_init(&dd, &pg) != DDP_OK) {
        snprintf(res->message, sizeof res->message, "ddp_init failed: %s", ddp_error_string());
        return 1;
    }
    memset(&wd, 0, sizeof wd); /* zero_stage 0: plain DDP; the sharding is the student's */
    if (!(m = make_model(c)) || ddp_wrap(pg, m, &wd, &w) != DDP_OK) {
        snprintf(res->message, sizeof res->message, "setting up the model failed: %s", ddp_error_string());
        return 1;
    }
    res->n = copy_weights(m, res->before);
    if (!res->n) res->n = ddp_model_num_elements(m); /* a model too large to keep: its size only */
    if (c->measure) {
        size_t S = (ddp_model_num_elements(m) + (size_t)c->world - 1) / (size_t)c->world;
        float *a = (float*)calloc(S + 1, sizeof(float)), *b = (float*)calloc(S * (size_t)c->world + 1, sizeof(float));
        st = a && b ? ddp_all_gather(pg, a, b, S, DDP_F32, NULL) : DDP_ERR_OUT_OF_MEMORY;
        free(a), free(b);
        if (st != DDP_OK) {
            snprintf(res->message, sizeof res->message, "the test's own all-gather failed: %s", ddp_error_string());
            return 1;
        }
    }
    heap0 = heap_in_use();
    st = lab_zero1_create(pg, m, &c->d, &z);
    res->held_create = heap0 < 0 ? -1 : heap_in_use() - heap0;
    if (st != DDP_OK || !z) {
        snprintf(res->message, sizeof res->message, "lab_zero1_create returned %s%s", ddp_status_name(st),
                 st == DDP_OK ? " but no optimizer (*out is NULL)" : "");
        return 1; /* ddp_spawn stops the other ranks */
    }
    for (s = 0; s < c->steps; s++) {
        uint64_t c0, sent0, sent1, recv;
        global_batch(c, s, x, y);
        if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x + (size_t)rank * per * feat, per) != DDP_OK ||
            ddp_loss_cross_entropy(m, y + rank * per, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK) {
            snprintf(res->message, sizeof res->message, "step %d: the forward or backward pass failed: %s", s + 1,
                     ddp_error_string());
            return 1;
        }
        if (c->poison) poison_others(m, c->world, rank);
        if (s == 0) heap1 = heap_in_use();
        c0 = ddp_pg_collectives(pg);
        ddp_pg_bytes(pg, &sent0, &recv);
        if ((st = lab_zero1_step(z)) != DDP_OK) {
            snprintf(res->message, sizeof res->message, "step %d: lab_zero1_step returned %s: %s", s + 1,
                     ddp_status_name(st), ddp_error_string());
            return 1;
        }
        ddp_pg_bytes(pg, &sent1, &recv);
        res->collectives[s] = (long)(ddp_pg_collectives(pg) - c0);
        res->sent[s] = (unsigned long long)(sent1 - sent0);
        if (s == 0) res->held = heap0 < 0 ? -1 : res->held_create + (heap_in_use() - heap1);
        copy_weights(m, res->after[s]);
    }
    res->state_bytes = lab_zero1_state_bytes(z);
    res->done = 1;
    lab_zero1_destroy(z);
    ddp_wrapper_destroy(w);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}

/* Run the ranks; 1 when every rank finished. */
static int run(run_cfg* c) {
    int r, ok = 1;
    lab_need_loopback();
    c->results = (rank_result*)lab_shared(sizeof(rank_result) * (size_t)c->world);
    if (!c->results) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    if (ddp_spawn(c->world, rank_main, c) != DDP_OK)
        lab_failf("W = %d: the ranks did not all finish: %s", c->world, ddp_error_string());
    for (r = 0; r < c->world; r++)
        if (!c->results[r].done) {
            lab_failf("W = %d, rank %d: %s", c->world, r,
                      c->results[r].message[0] ? c->results[r].message : "did not finish (see above)");
            ok = 0;
        }
    return ok;
}

static const char* describe_desc(const lab_zero1_desc* d) {
    static char b[160];
    if (d->kind == LAB_ZERO1_SGD)
        snprintf(b, sizeof b, "SGD lr %g momentum %g dampening %g", (double)d->lr, (double)d->momentum, (double)d->dampening);
    else
        snprintf(b, sizeof b, "Adam lr %g betas (%g, %g) eps %g", (double)d->lr, (double)d->beta1, (double)d->beta2,
                 (double)d->eps);
    return b;
}

/* "6 -> 10 -> 8 -> 3" */
static const char* describe_sizes(const run_cfg* c) {
    static char b[64];
    size_t pos = 0;
    int i;
    for (i = 0; i < c->nsizes; i++) pos += (size_t)snprintf(b + pos, sizeof b - pos, "%s%d", i ? " -> " : "", c->sizes[i]);
    return b;
}

/* Where flat element e lies: "fc2.weight[17]". */
static const char* describe_element(const run_cfg* c, size_t e) {
    static char b[2][64];
    static int which;
    char* s = b[which ^= 1];
    ddp_model* m = make_model(c);
    size_t at = 0;
    int i;
    snprintf(s, sizeof b[0], "element %zu", e);
    for (i = 0; m && i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        if (e < at + p->count) {
            snprintf(s, sizeof b[0], "%s[%zu]", p->name, e - at);
            break;
        }
        at += p->count;
    }
    ddp_model_destroy(m);
    return s;
}

/* The reference in this process: ddp.h's own (unsharded) optimizer on the whole global batch.
   after[s] holds the weights after step s + 1, grad1 the gradient of the first step. */
static size_t reference(const run_cfg* c, float (*after)[MAX_N], float* grad1) {
    ddp_model* m = make_model(c);
    ddp_optim* o = NULL;
    ddp_optim_desc od;
    float x[GLOBAL_B * 16], loss;
    int y[GLOBAL_B], s, i;
    size_t n = 0;
    memset(&od, 0, sizeof od);
    od.kind = c->d.kind == LAB_ZERO1_ADAM ? DDP_ADAM : DDP_SGD;
    od.lr = c->d.lr;
    od.momentum = c->d.momentum, od.dampening = c->d.dampening;
    od.beta1 = c->d.beta1, od.beta2 = c->d.beta2, od.eps = c->d.eps;
    if (!m || ddp_optim_create(m, &od, &o) != DDP_OK) {
        lab_failf("the test's reference could not be set up: %s", ddp_error_string());
        ddp_model_destroy(m);
        return 0;
    }
    for (s = 0; s < c->steps; s++) {
        global_batch(c, s, x, y);
        ddp_model_zero_grad(m);
        ddp_model_forward(m, x, GLOBAL_B);
        ddp_loss_cross_entropy(m, y, &loss);
        ddp_model_backward(m);
        if (s == 0 && grad1)
            for (n = 0, i = 0; i < ddp_model_num_params(m); n += ddp_model_param(m, i)->count, i++)
                memcpy(grad1 + n, ddp_model_param(m, i)->grad, ddp_model_param(m, i)->count * sizeof(float));
        ddp_optim_step(o);
        n = copy_weights(m, after[s]);
    }
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return n;
}

static double rel_l2(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        num += e * e, den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Rule Z2: each rank's state is (its owned elements) x (floats per element) x 4 bytes. */
static void expect_state_bytes(const run_cfg* c) {
    int per = c->d.kind == LAB_ZERO1_ADAM ? 2 : c->d.momentum != 0.f ? 1 : 0, r, bad = -1;
    size_t n = c->results[0].n, S, lo, hi, ddp_bytes = (size_t)per * n * 4, got = 0, want = 0, owned = 0;
    char got_list[256], want_list[256];
    size_t pos = 0, pos2 = 0;
    for (r = 0; r < c->world; r++) {
        size_t g = c->results[r].state_bytes, w;
        shard_range(n, c->world, r, &S, &lo, &hi);
        w = (size_t)per * (hi - lo) * 4;
        pos += (size_t)snprintf(got_list + pos, sizeof got_list - pos, "%s%zu", r ? " " : "", g);
        pos2 += (size_t)snprintf(want_list + pos2, sizeof want_list - pos2, "%s%zu", r ? " " : "", w);
        if (g != w && bad < 0) bad = r, got = g, want = w, owned = hi - lo;
    }
    if (bad < 0) {
        lab_note("W = %d, %s: state bytes per rank %s (DDP: %zu on every rank)", c->world, describe_desc(&c->d), got_list,
                 ddp_bytes);
        return;
    }
    shard_range(n, c->world, bad, &S, &lo, &hi);
    lab_failf("[rule Z2: state for your shard only] W = %d, N = %zu, %s: lab_zero1_state_bytes per rank (rank 0 first) "
              "%s, expected %s (owned elements x %d float%s x 4 bytes). Rank %d: %zu, expected %zu (%zu owned elements)%s",
              c->world, n, describe_desc(&c->d), got_list, want_list, per, per == 1 ? "" : "s", bad, got,
              want, owned,
              got == ddp_bytes && c->world > 1 ? ": that is the whole model's state, as DDP keeps; keep only your shard's"
              : per > 0 && got == (size_t)per * S * 4 ? ": that is a whole shard of S elements, but the padding past the "
                                                        "end of the model is nobody's and holds no state"
              : per == 0 ? ": plain SGD (momentum 0) keeps no state"
              : per == 2 && got == owned * 4 ? ": Adam keeps two floats per element, the two moments"
              : got == 0 ? ": no state?"
                         : "");
}

/* Rule Z2, measured: what a rank's heap holds after its first step, beyond what it held before
   lab_zero1_create, is at most the state it reports plus the all-gather's buffers (a shard to send
   and W shards to receive) and 64 KiB for everything small. A rank that keeps the whole model's
   state while reporting its shard's holds (W - 1) shards more. */
static void expect_held_bytes(const run_cfg* c) {
    int per = c->d.kind == LAB_ZERO1_ADAM ? 2 : c->d.momentum != 0.f ? 1 : 0, r;
    size_t n = c->results[0].n, S = (n + (size_t)c->world - 1) / (size_t)c->world;
    size_t buffers = ((size_t)c->world + 1) * S * 4;
    for (r = 0; r < c->world; r++) {
        const rank_result* res = &c->results[r];
        long long allowed = (long long)(res->state_bytes + buffers) + 65536;
        if (res->held < 0) {
            lab_note("the heap cannot be measured here (mallinfo2: glibc 2.33 or later, no sanitizer); rule Z2 "
                     "rests on lab_zero1_state_bytes alone");
            return;
        }
        if (res->held > allowed) {
            lab_failf("[rule Z2: state for your shard only] W = %d, N = %zu, %s: rank %d's lab_zero1_create and first "
                      "lab_zero1_step left %lld bytes more of the heap in use (create: %lld): more than the state it reports (%zu "
                      "bytes), the all-gather's buffers ((W + 1) x S floats, %zu bytes) and 64 KiB for the rest. "
                      "Whole-model state is %zu bytes: does the optimizer keep state outside its shard?",
                      c->world, n, describe_desc(&c->d), r, res->held, res->held_create, res->state_bytes, buffers,
                      (size_t)per * n * 4);
            return;
        }
    }
    lab_note("W = %d, N = %zu, %s: the heap that lab_zero1_create and the first step left in use is within the "
             "reported state and the all-gather's buffers on every rank (rank 0: %lld bytes, of which create %lld; "
             "it reports %zu)", c->world, n, describe_desc(&c->d), c->results[0].held, c->results[0].held_create,
             c->results[0].state_bytes);
}

static void expect_reference(const run_cfg* c); /* below */

/* Rule Z6: with NaN in every gradient a rank does not own, every rank still ends every step with
   the whole model's right weights and no NaN: it read only its own gradients, and every other
   element came from its owner through the all-gather. */
static void expect_own_shard_only(const run_cfg* c) {
    size_t n = c->results[0].n, e, S = (n + (size_t)c->world - 1) / (size_t)c->world;
    int r, s;
    for (r = 0; r < c->world; r++)
        for (s = 0; s < c->steps; s++)
            for (e = 0; e < n; e++)
                if (isnan(c->results[r].after[s][e])) {
                    int owner = (int)(e / S);
                    lab_failf("[rule Z6: update only your shard] W = %d, %s: after step %d rank %d holds NaN in %s "
                              "(flat %zu, %s): the test set every gradient outside each rank's shard to NaN before "
                              "lab_zero1_step, so this value was computed from a gradient the rank does not own%s. A "
                              "rank updates only the elements it owns and takes every other one from the all-gather",
                              c->world, describe_desc(&c->d), s + 1, r, describe_element(c, e), e,
                              owner == r ? "in its own shard" : "in another rank's shard",
                              owner == r ? " (its own shard read outside its range?)"
                                         : ", and the all-gather's value did not replace it");
                    return;
                }
    expect_reference(c);
}

/* 1 when a step took an element from `before` to `got` as the unsharded optimizer takes it to
   `want`, within rounding (DDP's averaged gradient and one process's differ in the last bits). */
static int close_to(double got, double want, double before) {
    return fabs(got - want) <= 1e-3 * fabs(want - before) + 1e-7 * (1 + fabs(want));
}

/* 1 when a and b are one value up to rounding (a float holds about 7 digits). */
static int same_value(double a, double b) { return fabs(a - b) <= 1e-6 * fabs(b) + 1e-9; }

/* The elements of got[lo, hi) that a step changed but not as the unsharded optimizer (ref): *wrong
   counts them. Returns how many of them hold the value ANOTHER element has in ref (a shard copied
   to the wrong place), with the first in *e_out and the element whose value it holds in *f_out.
   When that is most of the wrong ones, the values are right but misplaced: a coincidence is rare
   (about 1 in 10^4 per element), most of them at once is not one. */
static size_t misplaced(const float* got, const float* ref, const float* before, size_t n, size_t lo, size_t hi,
                        size_t* wrong, size_t* e_out, size_t* f_out) {
    size_t e, f, k = 0;
    *wrong = 0;
    for (e = lo; e < hi; e++) {
        if (close_to(got[e], ref[e], before[e]) || got[e] == before[e]) continue;
        ++*wrong;
        for (f = 0; f < n; f++)
            if (f != e && same_value(got[e], ref[f])) break;
        if (f < n && k++ == 0) *e_out = e, *f_out = f;
    }
    return k;
}

/* Rule Z4, after step 1: every rank holds every element's new value, the one its owner computed.
   Checked against one process's unsharded step, which tells a shard written to the wrong place (an
   element holds another one's new value) from a missing all-gather (the elements other ranks own
   keep their old values), and both from a wrong update (rule Z3 or A1, named instead). Returns 1
   when all is well. */
static int expect_gathered(const run_cfg* c) {
    static float ref[MAX_STEPS][MAX_N];
    run_cfg one = *c;
    size_t n, S, lo, hi, e, f;
    int r;
    one.steps = 1;
    n = reference(&one, ref, NULL);
    if (n == 0 || n != c->results[0].n) return 0;
    for (r = 0; r < c->world; r++) { /* other elements' new values: the wrong place */
        const rank_result* me = &c->results[r];
        size_t wrong, k = misplaced(me->after[0], ref[0], me->before, n, 0, n, &wrong, &e, &f);
        if (k > 0 && 2 * k > wrong) {
            lab_failf("[rule Z4: every shard to every rank] W = %d, step 1: rank %d holds %s (flat %zu, in rank %d's "
                      "shard) = %.9g, which is the value of %s (flat %zu) after the step; it should be %.9g. A shard "
                      "written to the wrong place?", c->world, r, describe_element(c, e), e,
                      (int)(e / ((n + (size_t)c->world - 1) / (size_t)c->world)), (double)me->after[0][e],
                      describe_element(c, f), f, (double)ref[0][e]);
            return 0;
        }
    }
    for (r = 0; r < c->world; r++) { /* old values where the owner has new ones: no all-gather */
        const rank_result* me = &c->results[r];
        size_t moving = 0, stale = 0, wrong = 0, first_stale = 0;
        shard_range(n, c->world, r, &S, &lo, &hi);
        for (e = 0; e < n; e++) {
            if (e >= lo && e < hi) continue;
            if (ref[0][e] != me->before[e]) moving++;
            if (close_to(me->after[0][e], ref[0][e], me->before[e])) continue;
            if (memcmp(&me->after[0][e], &me->before[e], sizeof(float)) != 0) wrong++;
            else if (stale++ == 0) first_stale = e;
        }
        if (stale == 0 || wrong > 0) continue;
        lab_failf("[rule Z4: every shard to every rank] W = %d, step 1: rank %d still holds the old values of %zu of the "
                  "%zu elements outside its shard that the step changes (%s, in rank %d's shard, for one): every "
                  "rank's new shard must reach every rank. Is the all-gather missing, or its result not written back "
                  "into the parameters?", c->world, r, stale, moving, describe_element(c, first_stale),
                  (int)(first_stale / S));
        return 0;
    }
    for (r = 0; r < c->world; r++) { /* any other difference: the owner's update, or what came of it */
        const rank_result* me = &c->results[r];
        shard_range(n, c->world, r, &S, &lo, &hi);
        for (e = 0; e < n; e++) {
            int q = (int)(e / S);
            const rank_result* owner = &c->results[q];
            if (close_to(me->after[0][e], ref[0][e], me->before[e])) continue;
            if (!close_to(owner->after[0][e], ref[0][e], owner->before[e]))
                lab_failf("%s W = %d, step 1: rank %d's update of its own shard differs from the unsharded optimizer's "
                          "(%s: %.9g, expected %.9g; the first_step case says more), so what the all-gather hands on "
                          "cannot be checked", c->d.kind == LAB_ZERO1_ADAM ? "[rule A1: torch.optim.Adam's update]"
                                                                           : "[rule Z3: torch.optim.SGD's update]",
                          c->world, q, describe_element(c, e), (double)owner->after[0][e], (double)ref[0][e]);
            else
                lab_failf("[rule Z4: every shard to every rank] W = %d, step 1: rank %d holds %s (flat %zu, in rank "
                          "%d's shard) = %.9g, but its owner computed %.9g", c->world, r, describe_element(c, e), e, q,
                          (double)me->after[0][e], (double)owner->after[0][e]);
            return 0;
        }
    }
    lab_note("W = %d, step 1: every rank holds the new values of the elements the other ranks own", c->world);
    return 1;
}

/* Rule Z5: one collective per step, an all-gather of S floats: (W - 1) S 4 bytes sent per rank. */
static void expect_one_all_gather(const run_cfg* c) {
    size_t n = c->results[0].n, S = (n + (size_t)c->world - 1) / (size_t)c->world;
    unsigned long long want = (unsigned long long)(c->world - 1) * S * 4;
    int r, s;
    for (r = 0; r < c->world; r++)
        for (s = 0; s < c->steps; s++) {
            const rank_result* me = &c->results[r];
            if (me->collectives[s] != 1) {
                lab_failf("[rule Z5: one all-gather of S floats per step] W = %d, rank %d, step %d: lab_zero1_step issued "
                          "%ld collectives, expected 1%s", c->world, r, s + 1, me->collectives[s],
                          me->collectives[s] == 0 ? ": how would the other ranks get this rank's shard?"
                                                  : ": one all-gather of S floats carries every shard at once");
                return;
            }
            if (me->sent[s] != want) {
                lab_failf("[rule Z5: one all-gather of S floats per step] W = %d, N = %zu, rank %d, step %d: sent %llu "
                          "bytes; an all-gather of S = %zu floats sends (W - 1) x S x 4 = %llu%s", c->world, n, r,
                          s + 1, me->sent[s], S, want,
                          me->sent[s] > want * 3 / 2 ? ": that is about what an all-reduce of the whole model sends, "
                                                       "twice an all-gather's traffic"
                          : me->sent[s] > want ? ": more than S floats per rank (count is per rank, not the total)"
                                               : ": fewer than S floats per rank");
                return;
            }
        }
    lab_note("W = %d, N = %zu, S = %zu: one collective per step, %llu bytes sent per rank (an all-reduce of the model "
             "would send about twice that)", c->world, n, S, want);
}

/* Rules Z3 / A1 (and Z4: the ranks agree): the weights after every step against the reference. */
static void expect_reference(const run_cfg* c) {
    static float ref[MAX_STEPS][MAX_N];
    size_t n = reference(c, ref, NULL), e, worst = 0;
    const char* rule = c->d.kind == LAB_ZERO1_ADAM ? "[rule A1: torch.optim.Adam's update]"
                                                   : "[rule Z3: torch.optim.SGD's update]";
    double err = 0, worst_abs = -1;
    int r, s, agree = 1;
    if (n == 0) return;
    if (c->results[0].n != n) {
        lab_failf("rank 0 has %zu weights, the reference %zu", c->results[0].n, n);
        return;
    }
    for (r = 1; r < c->world && agree; r++)
        for (s = 0; s < c->steps && agree; s++)
            if (memcmp(c->results[r].after[s], c->results[0].after[s], n * sizeof(float)) != 0) {
                agree = 0;
                lab_failf("[rule Z4: every shard to every rank] W = %d, %s: after step %d rank %d's weights differ from "
                          "rank 0's: every rank must end each step with the same, whole model", c->world,
                          describe_desc(&c->d), s + 1, r);
            }
    for (s = 0; s < c->steps; s++) {
        err = rel_l2(c->results[0].after[s], ref[s], n);
        if (err > TOL) break;
    }
    if (s == c->steps) {
        lab_note("W = %d, %s: after %d steps within %.2g (relative L2) of one process's unsharded optimizer", c->world,
                 describe_desc(&c->d), c->steps, err);
        return;
    }
    for (e = 0; e < n; e++) {
        double d = fabs((double)c->results[0].after[s][e] - ref[s][e]);
        if (d > worst_abs) worst_abs = d, worst = e;
    }
    {
        size_t S = (n + (size_t)c->world - 1) / (size_t)c->world;
        size_t wrong, e_moved = 0, f = 0;
        size_t k = misplaced(c->results[0].after[s], ref[s], s == 0 ? c->results[0].before : c->results[0].after[s - 1],
                             n, 0, n, &wrong, &e_moved, &f);
        char moved[300] = "";
        if (k > 0 && 2 * k > wrong) /* other elements' values: moved, not miscomputed */
            snprintf(moved, sizeof moved, " (%zu of the %zu wrong elements hold another element's value: %s has the "
                     "value %s should have. A shard written to the wrong place? Rule Z4)", k, wrong,
                     describe_element(c, e_moved), describe_element(c, f));
        else
            f = n;
        lab_failf("%s W = %d, %s: after step %d rank 0's weights differ from one process's unsharded optimizer by %.3g "
                  "(relative L2, limit %g); the most at %s (flat %zu, rank %d's shard): %.9g, expected %.9g%s%s",
                  f < n ? "[rule Z4: every shard to every rank]" : rule, c->world, describe_desc(&c->d), s + 1, err, TOL,
                  describe_element(c, worst), worst, (int)(worst / S), (double)c->results[0].after[s][worst],
                  (double)ref[s][worst], moved, agree ? "" : " (the ranks disagree too: see rule Z4)");
    }
}

/* Rules Z3 / A1 on the first step alone, each rank's own shard only (no all-gather involved):
   names the common mistakes of a first step. */
static void expect_first_step(const run_cfg* c) {
    static float ref[MAX_STEPS][MAX_N];
    float grad1[MAX_N];
    size_t n = reference(c, ref, grad1), S, lo, hi, e;
    const lab_zero1_desc* d = &c->d;
    int r;
    if (n == 0) return;
    for (r = 0; r < c->world; r++) {
        const rank_result* me = &c->results[r];
        size_t wrong = 0, still = 0, zero_buffer = 0, no_bias = 0, worst = 0, k, wrong2, e_moved = 0, f = 0;
        double worst_rel = 0;
        shard_range(n, c->world, r, &S, &lo, &hi);
        for (e = lo; e < hi; e++) {
            double got = me->after[0][e], want = ref[0][e], w0 = me->before[e], g = grad1[e];
            double rel = fabs(got - want) / (1e-6 + fabs(want - w0));
            if (close_to(got, want, w0)) continue;
            if (wrong++ == 0 || rel > worst_rel) worst_rel = rel, worst = e;
            if (got == w0) still++;
            if (d->kind == LAB_ZERO1_SGD && close_to(got, w0 - (double)d->lr * (1 - (double)d->dampening) * g, w0))
                zero_buffer++;
            if (d->kind == LAB_ZERO1_ADAM) {
                double m1 = (1 - (double)d->beta1) * g, v = (1 - (double)d->beta2) * g * g;
                double nb = w0 - (double)d->lr * m1 / (sqrt(v) + (double)d->eps);
                if (close_to(got, nb, w0)) no_bias++;
            }
        }
        if (wrong == 0) continue;
        k = misplaced(me->after[0], ref[0], me->before, n, lo, hi, &wrong2, &e_moved, &f);
        if (k > 0 && 2 * k > wrong2) {
            lab_failf("[rule Z4: every shard to every rank] W = %d, %s, step 1, rank %d: %s (flat %zu, in its own shard) "
                      "is %.9g, the value of %s (flat %zu) after the step; it should be %.9g. The update is right, "
                      "but the all-gather wrote a shard to the wrong place?", c->world, describe_desc(d), r,
                      describe_element(c, e_moved), e_moved, (double)me->after[0][e_moved], describe_element(c, f), f,
                      (double)ref[0][e_moved]);
            return;
        }
        lab_failf("%s W = %d, %s, step 1, rank %d: %zu of the %zu elements of its own shard are wrong; %s (flat %zu) is "
                  "%.9g, expected %.9g (it was %.9g, its gradient %.9g)%s",
                  d->kind == LAB_ZERO1_ADAM ? "[rule A1: torch.optim.Adam's update]" : "[rule Z3: torch.optim.SGD's update]",
                  c->world, describe_desc(d), r, wrong, hi - lo, describe_element(c, worst), worst,
                  (double)me->after[0][worst], (double)ref[0][worst], (double)me->before[worst], (double)grad1[worst],
                  still == wrong ? ": the step did not move them"
                  : zero_buffer == wrong ? ": they moved by lr x (1 - dampening) x gradient. torch.optim.SGD's first step "
                                           "starts the momentum buffer AS the gradient, undamped; dampening applies "
                                           "from the second step on"
                  : no_bias == wrong ? ": that is Adam without its bias corrections (its first step moves every weight "
                                       "by about lr, whatever the gradient)"
                                     : "");
        return;
    }
    lab_note("W = %d, %s: every rank's first step of its own shard is torch's", c->world, describe_desc(d));
}

static run_cfg mlp(int world, int steps, lab_zero1_kind kind) {
    run_cfg c;
    memset(&c, 0, sizeof c);
    c.world = world, c.steps = steps;
    c.nsizes = 4, c.sizes[0] = 6, c.sizes[1] = 10, c.sizes[2] = 8, c.sizes[3] = 3; /* N = 185 */
    c.d.kind = kind;
    if (kind == LAB_ZERO1_SGD) c.d.lr = 0.1f, c.d.momentum = 0.9f;
    else c.d.lr = 0.01f, c.d.beta1 = 0.9f, c.d.beta2 = 0.999f, c.d.eps = 1e-8f;
    return c;
}

/* Rule Z2 on 1 to 4 ranks. */
static void state_on_1_to_4_ranks(lab_zero1_kind kind) {
    int W;
    for (W = 1; W <= 4; W++) {
        run_cfg c = mlp(W, 1, kind);
        if (run(&c)) expect_state_bytes(&c);
    }
}

/* 50 steps on 1 to 4 ranks against the reference; other settings on 2 (Adam) and 3 ranks (SGD). */
static void reference_on_1_to_4_ranks(lab_zero1_kind kind) {
    int W;
    for (W = 1; W <= 4; W++) {
        run_cfg c = mlp(W, MAX_STEPS, kind);
        if (kind == LAB_ZERO1_SGD && W == 3) c.d.dampening = 0.25f;
        if (kind == LAB_ZERO1_ADAM && W == 2) c.d.beta1 = 0.8f, c.d.beta2 = 0.99f, c.d.lr = 0.02f;
        if (run(&c)) expect_reference(&c);
    }
}

/* A setting from the seed: every rule. */
static void every_rule(run_cfg* c) {
    lab_note("W = %d, an MLP %s, %s", c->world, describe_sizes(c), describe_desc(&c->d));
    if (run(c)) {
        expect_state_bytes(c);
        if (c->world > 1 && expect_gathered(c)) expect_one_all_gather(c);
        expect_reference(c);
    }
}

/* ---- part 1b: SGD with momentum -------------------------------------------------------------- */

static void sgd_state_is_one_shard(void) { state_on_1_to_4_ranks(LAB_ZERO1_SGD); }

static void sgd_plain_keeps_no_state(void) {
    run_cfg c = mlp(2, 10, LAB_ZERO1_SGD);
    c.d.momentum = 0;
    if (run(&c)) {
        expect_state_bytes(&c);
        expect_reference(&c);
    }
}

static void sgd_first_step(void) {
    run_cfg c = mlp(2, 1, LAB_ZERO1_SGD);
    c.d.dampening = 0.5f;
    if (run(&c)) expect_first_step(&c);
}

static void sgd_gather_every_shard_to_every_rank(void) {
    int W, ok = 1;
    for (W = 2; W <= 4 && ok; W++) {
        run_cfg c = mlp(W, 1, LAB_ZERO1_SGD);
        if (run(&c)) ok = expect_gathered(&c);
    }
}

static void sgd_one_all_gather_per_step(void) {
    int W;
    for (W = 2; W <= 4; W += 2) {
        run_cfg c = mlp(W, 3, LAB_ZERO1_SGD);
        if (run(&c)) expect_one_all_gather(&c);
    }
}

static void sgd_matches_one_process_1_to_4_ranks(void) { reference_on_1_to_4_ranks(LAB_ZERO1_SGD); }

/* Rule Z6 on 2 and 3 ranks, and rule Z2 measured on 4 ranks of a model of 75,658 elements (the
   small MLP's state is too small to tell from the heap's other traffic). */
static void only_own_shard(lab_zero1_kind kind) {
    int W;
    for (W = 2; W <= 3; W++) {
        run_cfg c = mlp(W, 5, kind);
        c.poison = 1;
        if (run(&c)) expect_own_shard_only(&c);
    }
}
static void measured_state(lab_zero1_kind kind) {
    run_cfg c = mlp(4, 1, kind);
    c.sizes[0] = 16, c.sizes[1] = 512, c.sizes[2] = 128, c.sizes[3] = 10;
    c.measure = 1;
    if (run(&c)) {
        expect_state_bytes(&c);
        expect_held_bytes(&c);
    }
}
static void sgd_updates_only_its_shard(void) { only_own_shard(LAB_ZERO1_SGD); }
static void sgd_state_measured_not_reported(void) { measured_state(LAB_ZERO1_SGD); }

/* A model of 2 parameters, 1 -> 2 (4 elements), on 3 ranks (S = 2: rank 2 owns nothing) and on
   4 (S = 1): more ranks than parameters. */
static void sgd_more_ranks_than_parameters(void) {
    int W, ok = 1;
    for (W = 3; W <= 4 && ok; W++) {
        run_cfg c = mlp(W, 20, LAB_ZERO1_SGD);
        c.nsizes = 2, c.sizes[0] = 1, c.sizes[1] = 2;
        if ((ok = run(&c)) != 0) {
            expect_state_bytes(&c);
            if ((ok = expect_gathered(&c)) != 0) expect_reference(&c);
        }
    }
}

static void sgd_random_from_seed(void) {
    static const float moms[3] = {0.f, 0.5f, 0.9f}, damps[2] = {0.f, 0.3f};
    lab_rng g;
    run_cfg c;
    int i;
    lab_rng_seed(&g, lab_seed(), 72);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    memset(&c, 0, sizeof c);
    c.world = 1 + (int)lab_rng_below(&g, 4);
    c.steps = 20;
    c.nsizes = 2 + (int)lab_rng_below(&g, 3);
    c.sizes[0] = 1 + (int)lab_rng_below(&g, 8);
    for (i = 1; i < c.nsizes - 1; i++) c.sizes[i] = 1 + (int)lab_rng_below(&g, 12);
    c.sizes[c.nsizes - 1] = 2 + (int)lab_rng_below(&g, 4);
    c.d.kind = LAB_ZERO1_SGD;
    c.d.lr = 0.05f + 0.05f * (float)lab_rng_below(&g, 4);
    c.d.momentum = moms[lab_rng_below(&g, 3)];
    c.d.dampening = c.d.momentum > 0 ? damps[lab_rng_below(&g, 2)] : 0.f;
    every_rule(&c);
}

/* ---- part 2: Adam ---------------------------------------------------------------------------- */

static void adam_state_is_two_floats_per_owned_element(void) { state_on_1_to_4_ranks(LAB_ZERO1_ADAM); }

static void adam_first_step(void) {
    run_cfg c = mlp(3, 1, LAB_ZERO1_ADAM);
    if (run(&c)) expect_first_step(&c);
}

static void adam_matches_one_process_1_to_4_ranks(void) { reference_on_1_to_4_ranks(LAB_ZERO1_ADAM); }
static void adam_updates_only_its_shard(void) { only_own_shard(LAB_ZERO1_ADAM); }
static void adam_state_measured_not_reported(void) { measured_state(LAB_ZERO1_ADAM); }

static void adam_random_from_seed(void) {
    lab_rng g;
    run_cfg c = mlp(1, 30, LAB_ZERO1_ADAM);
    lab_rng_seed(&g, lab_seed(), 73);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    c.world = 1 + (int)lab_rng_below(&g, 4);
    c.sizes[1] = 1 + (int)lab_rng_below(&g, 16);
    c.sizes[2] = 1 + (int)lab_rng_below(&g, 16);
    c.d.lr = 0.001f * (float)(1 + lab_rng_below(&g, 20));
    c.d.beta1 = 0.5f + 0.1f * (float)lab_rng_below(&g, 5);
    c.d.beta2 = 0.99f + 0.001f * (float)lab_rng_below(&g, 10);
    every_rule(&c);
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(ownership_worked_examples, 10);
    LAB_CASE(ownership_random_from_seed, 10);
    LAB_CASE(sgd_state_is_one_shard, 60);
    LAB_CASE(sgd_plain_keeps_no_state, 60);
    LAB_CASE(sgd_first_step, 60);
    LAB_CASE(sgd_gather_every_shard_to_every_rank, 60);
    LAB_CASE(sgd_one_all_gather_per_step, 60);
    LAB_CASE(sgd_matches_one_process_1_to_4_ranks, 90);
    LAB_CASE(sgd_more_ranks_than_parameters, 60);
    LAB_CASE(sgd_updates_only_its_shard, 60);
    LAB_CASE(sgd_state_measured_not_reported, 60);
    LAB_CASE(sgd_random_from_seed, 60);
    LAB_CASE(adam_state_is_two_floats_per_owned_element, 60);
    LAB_CASE(adam_first_step, 60);
    LAB_CASE(adam_matches_one_process_1_to_4_ranks, 90);
    LAB_CASE(adam_updates_only_its_shard, 60);
    LAB_CASE(adam_state_measured_not_reported, 60);
    LAB_CASE(adam_random_from_seed, 60);
    return lab_end();
}
