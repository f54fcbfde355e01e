/* labs/no_sync/test.c: the tests of lab "no_sync", built together with the student's file and
   ddp.h's implementation.

   Each case starts WORLD ranks with ddp_spawn (ddp.h's CPU backend, over TCP on 127.0.0.1). Every
   rank wraps the same model, and calls the student's lab_accumulate_step STEPS times on its own
   K micro-batches; the ranks hand their final weights and the wrapper's counters back through
   shared memory. The reference is computed here in one process, without DDP: per step, the sum
   of the gradients of every micro-batch of every rank, divided by WORLD, then the same SGD
   step. Part 2's cases call lab_accumulate_epoch for EPOCHS epochs of nb micro-batches each. */
#include "../lab_test.h"

#include <math.h>

#include "ddp.h"
#include "no_sync.h"

#define WORLD 2
#define STEPS 3
#define ROWS 4 /* rows per micro-batch */
#define FEAT 5
#define CLASSES 3
#define MAX_K 8
#define MAX_NB 12 /* micro-batches in one epoch (part 2) */
#define EPOCHS 2
#define MAX_W 512

typedef struct rank_result {
    int done;
    size_t nweights;
    float weights[MAX_W];
    ddp_wrap_stats stats;
    long plain_all_reduces; /* all-reduces of one plain backward pass after the student's steps */
    char message[512];
} rank_result;

typedef struct run_cfg {
    int K;
    int nb; /* part 2: micro-batches per epoch (0: part 1, STEPS calls of lab_accumulate_step) */
    size_t bucket_cap; /* 0: ddp.h's defaults (one bucket for this model) */
    rank_result* results;
} run_cfg;

static ddp_model* make_model(void) {
    int sizes[3] = {FEAT, 12, CLASSES};
    ddp_model_desc md;
    ddp_model* m = NULL;
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 9;
    if (ddp_model_mlp(&md, sizes, 3, DDP_LAYER_RELU, &m) != DDP_OK) return NULL;
    return m;
}
static ddp_optim* make_sgd(ddp_model* m) {
    ddp_optim_desc od;
    ddp_optim* o = NULL;
    memset(&od, 0, sizeof od);
    od.kind = DDP_SGD;
    od.lr = 0.1f;
    od.momentum = 0.9f;
    if (ddp_optim_create(m, &od, &o) != DDP_OK) return NULL;
    return o;
}

/* Micro-batch k of rank r at step s: its own rows, different everywhere. */
static void micro_batch(int s, int r, int k, float* x, int* y) {
    ddp_rng g = ddp_rng_seed((uint64_t)(1000 * s + 100 * r + k + 1));
    int i;
    for (i = 0; i < ROWS * FEAT; i++) x[i] = 2 * ddp_rng_uniform(&g) - 1;
    for (i = 0; i < ROWS; i++) y[i] = (int)ddp_rng_below(&g, CLASSES);
}

static int copy_weights(ddp_model* m, float* out) {
    size_t n = 0;
    int i;
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        if (n + p->count > MAX_W) return 0;
        memcpy(out + n, p->data, p->count * sizeof(float));
        n += p->count;
    }
    return (int)n;
}

static int rank_main(int rank, void* arg) {
    const run_cfg* c = (const run_cfg*)arg;
    rank_result* res = &c->results[rank];
    ddp_desc d;
    ddp_pg* pg;
    ddp_model* m;
    ddp_optim* o;
    ddp_wrapper* w;
    ddp_wrap_desc wd;
    float xb[MAX_NB][ROWS * FEAT];
    int yb[MAX_NB][ROWS], s, k;
    const float* xs[MAX_NB];
    const int* ys[MAX_NB];
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 20;
    if (ddp_init(&d, &pg) != DDP_OK) {
        snprintf(res->message, sizeof res->message, "ddp_init failed: %s", ddp_error_string());
        return 1;
    }
    memset(&wd, 0, sizeof wd);
    wd.bucket_cap_bytes = wd.first_bucket_bytes = c->bucket_cap;
    if (!(m = make_model()) || !(o = make_sgd(m)) || ddp_wrap(pg, m, &wd, &w) != DDP_OK) {
        snprintf(res->message, sizeof res->message, "setting up the model failed: %s", ddp_error_string());
        return 1;
    }
    for (k = 0; k < MAX_NB; k++) xs[k] = xb[k], ys[k] = yb[k];
    for (s = 0; c->nb > 0 && s < EPOCHS; s++) {
        ddp_status st;
        for (k = 0; k < c->nb; k++) micro_batch(100 + s, rank, k, xb[k], yb[k]);
        st = lab_accumulate_epoch(w, m, o, xs, ys, ROWS, c->nb, c->K);
        if (st != DDP_OK) {
            snprintf(res->message, sizeof res->message, "epoch %d: lab_accumulate_epoch returned %s: %s", s + 1,
                     ddp_status_name(st), ddp_error_string());
            return 1;
        }
    }
    for (s = 0; c->nb == 0 && s < STEPS; s++) {
        ddp_status st;
        for (k = 0; k < c->K; k++) micro_batch(s, rank, k, xb[k], yb[k]);
        st = lab_accumulate_step(w, m, o, xs, ys, ROWS, c->K);
        if (st != DDP_OK) {
            snprintf(res->message, sizeof res->message, "step %d: lab_accumulate_step returned %s: %s", s + 1,
                     ddp_status_name(st), ddp_error_string());
            return 1; /* ddp_spawn stops the other rank */
        }
    }
    ddp_wrapper_stats(w, &res->stats);
    res->nweights = (size_t)copy_weights(m, res->weights);
    { /* rule N4: the wrapper must be left synchronising: a plain backward pass all-reduces */
        ddp_wrap_stats after;
        float loss;
        if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, xb[0], ROWS) != DDP_OK ||
            ddp_loss_cross_entropy(m, yb[0], &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK) {
            snprintf(res->message, sizeof res->message, "a plain backward pass after the steps failed: %s",
                     ddp_error_string());
            return 1;
        }
        ddp_wrapper_stats(w, &after);
        res->plain_all_reduces = after.all_reduces - res->stats.all_reduces;
    }
    res->done = 1;
    ddp_wrapper_destroy(w);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    ddp_destroy(pg);
    return 0;
}

/* The reference, in this process: no DDP, every micro-batch of every rank. The variants give the
   weights of two common mistakes, to name the rule a wrong answer breaks: 1, the gradient of the
   last micro-batch only (zero_grad inside the loop); 2, the sum divided by K. */
static size_t reference(int K, float* out, int variant) {
    ddp_model* m = make_model();
    ddp_optim* o = make_sgd(m);
    float x[ROWS * FEAT], loss;
    int y[ROWS], s, r, k, i;
    size_t j, n;
    for (s = 0; s < STEPS; s++) {
        ddp_model_zero_grad(m);
        for (k = 0; k < K; k++) {
            if (variant == 1) ddp_model_zero_grad(m);
            for (r = 0; r < WORLD; r++) { /* backward adds into p->grad: the sum of them all */
                micro_batch(s, r, k, x, y);
                ddp_model_forward(m, x, ROWS);
                ddp_loss_cross_entropy(m, y, &loss);
                ddp_model_backward(m);
            }
        }
        for (i = 0; i < ddp_model_num_params(m); i++) { /* averaged over the ranks */
            ddp_param* p = ddp_model_param(m, i);
            for (j = 0; j < p->count; j++) p->grad[j] /= (float)WORLD * (variant == 2 ? (float)K : 1.f);
        }
        ddp_optim_step(o);
    }
    n = (size_t)copy_weights(m, out);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return n;
}

/* Part 2's reference: EPOCHS epochs of nb micro-batches, a step after every K and after the
   last. Variants (the mistakes of rule N6): 3, the short last step skipped and its gradients
   dropped; 4, the short last step skipped and its gradients added to the next epoch's first. */
static size_t reference_epochs(int nb, int K, float* out, int variant) {
    ddp_model* m = make_model();
    ddp_optim* o = make_sgd(m);
    float x[ROWS * FEAT], loss;
    int y[ROWS], e, i, r, q;
    size_t j, n;
    ddp_model_zero_grad(m);
    for (e = 0; e < EPOCHS; e++)
        for (i = 0; i < nb; i += K) {
            int k = nb - i < K ? nb - i : K;
            if (k < K && variant == 3) {
                ddp_model_zero_grad(m);
                continue;
            }
            for (q = i; q < i + k; q++)
                for (r = 0; r < WORLD; r++) {
                    micro_batch(100 + e, r, q, x, y);
                    ddp_model_forward(m, x, ROWS);
                    ddp_loss_cross_entropy(m, y, &loss);
                    ddp_model_backward(m);
                }
            if (k < K && variant == 4) continue; /* left in p->grad for the next step */
            for (q = 0; q < ddp_model_num_params(m); q++) {
                ddp_param* p = ddp_model_param(m, q);
                for (j = 0; j < p->count; j++) p->grad[j] /= (float)WORLD;
            }
            ddp_optim_step(o);
            ddp_model_zero_grad(m);
        }
    n = (size_t)copy_weights(m, out);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
    return n;
}

/* The largest relative difference between a and b, and where. */
static double max_rel(const float* a, const float* b, size_t n, size_t* where) {
    size_t i;
    double worst = 0;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (1e-3 + fabs((double)b[i]));
        if (e > worst) worst = e, *where = i;
    }
    return worst;
}

/* Run the ranks; 1 when every rank finished. */
static int run(run_cfg* c) {
    int r, ok = 1;
    lab_need_loopback();
    c->results = (rank_result*)lab_shared(sizeof(rank_result) * WORLD);
    if (!c->results) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    if (ddp_spawn(WORLD, rank_main, c) != DDP_OK) lab_failf("the %d ranks did not all finish: %s", WORLD, ddp_error_string());
    for (r = 0; r < WORLD; r++)
        if (!c->results[r].done) {
            lab_failf("rank %d: %s", r, c->results[r].message[0] ? c->results[r].message : "did not finish (see above)");
            ok = 0;
        }
    return ok;
}

static void expect_weights(const run_cfg* c) {
    float ref[MAX_W], alt[MAX_W];
    size_t n = c->nb ? reference_epochs(c->nb, c->K, ref, 0) : reference(c->K, ref, 0), worst = 0, w2;
    double maxerr;
    int r;
    const rank_result* r0 = &c->results[0];
    for (r = 1; r < WORLD; r++)
        EXPECT(c->results[r].nweights == r0->nweights &&
               !memcmp(c->results[r].weights, r0->weights, r0->nweights * sizeof(float)),
               "[rule N3: the replicas stay identical] K = %d: rank %d's weights differ from rank 0's: the replicas "
               "drifted apart. Were the accumulated gradients of every micro-batch all-reduced before the step?", c->K, r);
    if (r0->nweights != n) {
        lab_failf("rank 0 has %zu weights, the reference %zu", r0->nweights, n);
        return;
    }
    maxerr = max_rel(r0->weights, ref, n, &worst);
    if (maxerr <= 1e-4) {
        lab_note("K = %d: weights within %.2g (relative) of the reference", c->K, maxerr);
        return;
    }
    if (c->nb) {
        int tail = c->nb % c->K;
        if (tail && reference_epochs(c->nb, c->K, alt, 3) == n && max_rel(r0->weights, alt, n, &w2) <= 1e-4)
            lab_failf("[rule N6: no micro-batch is lost] nb = %d, K = %d: the weights are those of a run whose "
                      "epochs end after their last full step of %d: the last %d micro-batch(es) of each epoch never "
                      "reached the optimizer", c->nb, c->K, c->K, tail);
        else if (tail && reference_epochs(c->nb, c->K, alt, 4) == n && max_rel(r0->weights, alt, n, &w2) <= 1e-4)
            lab_failf("[rule N6: the epoch ends with a step] nb = %d, K = %d: the weights are those of a run whose "
                      "last %d micro-batch(es) of an epoch went into the next epoch's first step (and the last "
                      "epoch's were lost)", c->nb, c->K, tail);
        else
            lab_failf("[rule N1: every step on all the micro-batches of all the ranks] nb = %d, K = %d: the weights "
                      "after %d epochs differ from the reference (steps of K micro-batches, then one of the rest) by "
                      "up to %.3g relative, at weight %zu: %.9g, reference %.9g", c->nb, c->K, EPOCHS, maxerr, worst,
                      (double)r0->weights[worst], (double)ref[worst]);
        return;
    }
    if (c->K > 1 && reference(c->K, alt, 1) == n && max_rel(r0->weights, alt, n, &w2) <= 1e-4)
        lab_failf("[rule N5: the gradient of a step is the sum over all K micro-batches] K = %d: the weights are those "
                  "of a step on the last micro-batch alone: is the gradient zeroed inside the micro-batch loop?", c->K);
    else if (c->K > 1 && reference(c->K, alt, 2) == n && max_rel(r0->weights, alt, n, &w2) <= 1e-4)
        lab_failf("[rule N5: the plain sum of the micro-batches' gradients, not divided by K] K = %d: the weights are "
                  "those of the sum divided by K", c->K);
    else
        lab_failf("[rule N1: one step on all the micro-batches of all the ranks] K = %d: the weights differ from the "
                  "reference (each step: the sum of every micro-batch's gradient, averaged over the ranks) by up to "
                  "%.3g relative, at weight %zu: %.9g, reference %.9g", c->K, maxerr, worst, (double)r0->weights[worst],
                  (double)ref[worst]);
}

static void expect_all_reduces(const run_cfg* c) {
    const ddp_wrap_stats* st = &c->results[0].stats;
    long want = (long)STEPS * st->buckets;
    EXPECT(st->all_reduces == want,
           "[rule N2: one all-reduce per bucket per step] K = %d micro-batches, %d steps, %d bucket(s): the wrapper "
           "issued %ld all-reduces, expected %ld%s", c->K, STEPS, st->buckets, st->all_reduces, want,
           st->all_reduces == want * c->K ? ": that is one per micro-batch: which of the K backward passes need "
                                            "to all-reduce, and which need not?"
           : st->all_reduces == 0           ? ": were all the backward passes under no_sync?"
                                            : "");
    EXPECT(st->steps == STEPS, "[rule N2: one synchronised backward pass per step] K = %d: the wrapper counted %ld "
           "synchronised backward passes, expected %d", c->K, st->steps, STEPS);
    EXPECT(c->results[0].plain_all_reduces == st->buckets,
           "[rule N4: leave the wrapper synchronising] K = %d: after your steps, a plain backward pass all-reduced %ld "
           "bucket(s), expected %d: ddp_no_sync is a setting that stays until it is changed, and the next caller "
           "expects the wrapper as it was", c->K, c->results[0].plain_all_reduces, st->buckets);
    lab_note("K = %d, %d steps, %d bucket(s): %ld all-reduces, %llu bytes handed to all-reduce", c->K, STEPS,
             st->buckets, st->all_reduces, (unsigned long long)st->bytes_reduced);
}

/* Part 2: the counts of one run of EPOCHS epochs. */
static void expect_epoch_counts(const run_cfg* c) {
    const ddp_wrap_stats* st = &c->results[0].stats;
    int per = (c->nb + c->K - 1) / c->K, full = c->nb / c->K;
    long want = (long)EPOCHS * per * st->buckets;
    EXPECT(st->all_reduces == want,
           "[rule N7: one all-reduce per bucket per step, the short one too] nb = %d, K = %d, %d epochs, %d "
           "bucket(s): %d step(s) per epoch, so %ld all-reduces expected; the wrapper issued %ld%s", c->nb, c->K,
           EPOCHS, st->buckets, per, want, st->all_reduces,
           per > full && st->all_reduces == (long)EPOCHS * full * st->buckets
               ? ": as many as the full steps alone. What did the backward passes of each epoch's short last step do?"
           : st->all_reduces == (long)EPOCHS * c->nb * st->buckets ? ": one per micro-batch"
                                                                    : "");
    EXPECT(c->results[0].plain_all_reduces == st->buckets,
           "[rule N4: leave the wrapper synchronising] nb = %d, K = %d: after your epochs, a plain backward pass "
           "all-reduced %ld bucket(s), expected %d", c->nb, c->K, c->results[0].plain_all_reduces, st->buckets);
    lab_note("nb = %d, K = %d, %d epochs, %d bucket(s): %ld all-reduces", c->nb, c->K, EPOCHS, st->buckets,
             st->all_reduces);
}

static void epoch(int nb, int K, size_t cap) {
    run_cfg c;
    memset(&c, 0, sizeof c);
    c.nb = nb, c.K = K, c.bucket_cap = cap;
    if (run(&c)) {
        expect_weights(&c);
        expect_epoch_counts(&c);
    }
}

static void epoch_7_by_3(void) { epoch(7, 3, 0); }                  /* steps of 3, 3, 1 */
static void epoch_8_by_4_three_buckets(void) { epoch(8, 4, 40); }   /* 4, 4: K divides */
static void epoch_10_by_4_three_buckets(void) { epoch(10, 4, 40); } /* 4, 4, 2 */
static void epoch_2_by_5(void) { epoch(2, 5, 0); }                  /* K > nb: one step of 2 */
static void epoch_random(void) {
    lab_rng g;
    int nb, K;
    lab_rng_seed(&g, lab_seed(), 43);
    nb = 2 + (int)lab_rng_below(&g, MAX_NB - 1);
    K = 1 + (int)lab_rng_below(&g, MAX_K);
    lab_note("seed %llu (LAB_SEED): nb = %d, K = %d", (unsigned long long)lab_seed(), nb, K);
    epoch(nb, K, lab_rng_below(&g, 2) ? 40 : 0);
}

static void k4_weights_match_the_reference(void) {
    run_cfg c;
    memset(&c, 0, sizeof c);
    c.K = 4;
    if (run(&c)) expect_weights(&c);
}

static void k4_one_all_reduce_per_step(void) {
    run_cfg c;
    memset(&c, 0, sizeof c);
    c.K = 4;
    if (run(&c)) expect_all_reduces(&c);
}

static void k1_is_a_plain_step(void) {
    run_cfg c;
    memset(&c, 0, sizeof c);
    c.K = 1;
    if (run(&c)) {
        expect_weights(&c);
        expect_all_reduces(&c);
    }
}

static void k3_with_three_buckets(void) {
    run_cfg c;
    memset(&c, 0, sizeof c);
    c.K = 3;
    c.bucket_cap = 40; /* buckets: fc2.bias + fc2.weight (156 bytes), fc1.bias (48), fc1.weight (240) */
    if (run(&c)) {
        EXPECT(c.results[0].stats.buckets == 3, "expected ddp_wrap to make 3 buckets with a 40-byte cap, got %d",
               c.results[0].stats.buckets);
        expect_weights(&c);
        expect_all_reduces(&c);
    }
}

/* K and the bucket cap from the seed (LAB_SEED). */
static void random_k_and_buckets(void) {
    static const size_t caps[4] = {0, 40, 100, 200};
    lab_rng g;
    run_cfg c;
    lab_rng_seed(&g, lab_seed(), 41);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    memset(&c, 0, sizeof c);
    c.K = 1 + (int)lab_rng_below(&g, MAX_K);
    c.bucket_cap = caps[lab_rng_below(&g, 4)];
    lab_note("K = %d, bucket cap %zu", c.K, c.bucket_cap);
    if (run(&c)) {
        expect_weights(&c);
        expect_all_reduces(&c);
    }
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(k4_weights_match_the_reference, 60);
    LAB_CASE(k4_one_all_reduce_per_step, 60);
    LAB_CASE(k1_is_a_plain_step, 60);
    LAB_CASE(k3_with_three_buckets, 60);
    LAB_CASE(random_k_and_buckets, 60);
    LAB_CASE(epoch_7_by_3, 60);
    LAB_CASE(epoch_8_by_4_three_buckets, 60);
    LAB_CASE(epoch_10_by_4_three_buckets, 60);
    LAB_CASE(epoch_2_by_5, 60);
    LAB_CASE(epoch_random, 60);
    return lab_end();
}
