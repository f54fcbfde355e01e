/* labs/buckets/test.c: the tests of lab "buckets", built together with the student's file and
   ddp.h's implementation.

   A backward pass is simulated by calling lab_grad_ready once per parameter in a chosen order, and
   the harness writes a timeline of what happened: "g5" when parameter 5's gradient arrives,
   "[B0]" when bucket 0 is launched. The expected timeline comes from the rule in starter.c. The
   last cases use real ddp.h: a model whose ddp_model_backward calls the hook, and ddp_wrap's own
   bucket map for comparison. */
#include "../lab_test.h"

#include "buckets.h"
#include "ddp.h"

typedef struct timeline {
    char text[2048];
    int launches[LAB_MAX_PARAMS]; /* times each bucket was launched */
    int nbuckets;
} timeline;

static void tl_add(timeline* t, const char* fmt, int v) {
    size_t len = strlen(t->text);
    if (len < sizeof t->text - 16) snprintf(t->text + len, sizeof t->text - len, fmt, v);
}
static void record_launch(int bucket, void* user) {
    timeline* t = (timeline*)user;
    tl_add(t, "[B%d] ", bucket);
    if (bucket >= 0 && bucket < LAB_MAX_PARAMS) t->launches[bucket]++;
}

/* The expected timeline of one backward pass, from the map and the arrival order. */
static void expected_timeline(const int* bucket_of, const int* nparams_in, int nbuckets, const int* arrival, int n,
                              char* out, size_t cap) {
    int pending[LAB_MAX_PARAMS], next = 0, i, k;
    size_t len = 0;
    for (k = 0; k < nbuckets; k++) pending[k] = nparams_in[k];
    out[0] = 0;
    for (i = 0; i < n; i++) {
        len += (size_t)snprintf(out + len, cap - len, "g%d ", arrival[i]);
        pending[bucket_of[arrival[i]]]--;
        while (next < nbuckets && pending[next] == 0) len += (size_t)snprintf(out + len, cap - len, "[B%d] ", next++);
    }
}

/* One simulated backward pass through the student's hook; compares with the rule. */
static void simulate(lab_buckets* b, const int* bucket_of, const int* nparams_in, int nbuckets, const int* arrival,
                     int n, const char* what) {
    timeline t;
    char want[2048];
    int i;
    memset(&t, 0, sizeof t);
    lab_backward_begin(b);
    for (i = 0; i < n; i++) {
        tl_add(&t, "g%d ", arrival[i]);
        lab_grad_ready(b, arrival[i], record_launch, &t);
    }
    expected_timeline(bucket_of, nparams_in, nbuckets, arrival, n, want, sizeof want);
    EXPECT(!strcmp(t.text, want), "%s:\n      expected  %s\n      got       %s", what, want, t.text);
}

/* Fill the map by hand (so the hook cases do not depend on the student's lab_assign_buckets). */
static void set_map(lab_buckets* b, const int* bucket_of, int nparams, int nbuckets) {
    int i;
    memset(b, 0, sizeof *b);
    b->nbuckets = nbuckets;
    for (i = 0; i < nparams; i++) {
        b->bucket_of[i] = bucket_of[i];
        b->nparams_in[bucket_of[i]]++;
    }
}

static const char* fmt_ints(const int* v, int n) {
    static char bufs[2][512];
    static int which;
    char* s = bufs[which ^= 1];
    size_t pos = 0;
    int i;
    s[0] = 0;
    for (i = 0; i < n && pos < sizeof bufs[0] - 16; i++) pos += (size_t)snprintf(s + pos, sizeof bufs[0] - pos, "%s%d", i ? " " : "", v[i]);
    return s;
}

/* Run the student's assignment and compare with the expected map. Returns 1 when equal. */
static int expect_map(int nparams, const size_t* bytes, size_t first, size_t cap, const int* want_of, int want_n,
                      lab_buckets* b) {
    int i, same, want_in[LAB_MAX_PARAMS] = {0};
    char sizes[512];
    size_t pos = 0;
    memset(b, 0, sizeof *b);
    b->nbuckets = -1;
    lab_assign_buckets(b, nparams, bytes, first, cap);
    for (i = 0; i < nparams; i++) want_in[want_of[i]]++;
    same = b->nbuckets == want_n && !memcmp(b->bucket_of, want_of, sizeof(int) * (size_t)nparams);
    for (i = 0; same && i < want_n; i++) same = b->nparams_in[i] == want_in[i];
    if (!same) {
        for (i = 0; i < nparams && pos < sizeof sizes - 24; i++)
            pos += (size_t)snprintf(sizes + pos, sizeof sizes - pos, "%s%zu", i ? " " : "", bytes[i]);
        lab_failf("bytes {%s}, first_bucket_bytes %zu, bucket_cap_bytes %zu:", sizes, first, cap);
        lab_note("  expected %d buckets, bucket_of {%s}, nparams_in {%s}", want_n, fmt_ints(want_of, nparams),
                  fmt_ints(want_in, want_n));
        lab_note("  got      %d buckets, bucket_of {%s}, nparams_in {%s}", b->nbuckets,
                  fmt_ints(b->bucket_of, nparams), fmt_ints(b->nparams_in, b->nbuckets > 0 && b->nbuckets <= LAB_MAX_PARAMS ? b->nbuckets : 0));
    }
    return same;
}

/* ---- (1) the bucket map ---------------------------------------------------------------------- */

static void assign_the_example_in_the_starter(void) {
    size_t bytes[6] = {240, 40, 320, 32, 96, 12};
    int want[6] = {2, 2, 1, 1, 0, 0};
    lab_buckets b;
    expect_map(6, bytes, 100, 300, want, 3, &b);
}

static void assign_first_bucket_smaller(void) {
    size_t bytes[10] = {100, 100, 100, 100, 100, 100, 100, 100, 100, 100};
    int want[10] = {2, 2, 2, 2, 1, 1, 1, 1, 0, 0}; /* 200 >= 150 closes bucket 0; 400 >= 400 the next */
    lab_buckets b;
    expect_map(10, bytes, 150, 400, want, 3, &b);
}

static void assign_large_parameter_overshoots(void) {
    size_t bytes[5] = {8, 4000, 8, 8, 8};
    int want[5] = {2, 1, 1, 0, 0}; /* 16 >= 10; then 8 + 4000 >= 100: never split a parameter */
    int one[5] = {0, 0, 0, 0, 0};
    lab_buckets b;
    expect_map(5, bytes, 10, 100, want, 3, &b);
    expect_map(5, bytes, (size_t)1 << 20, (size_t)25 << 20, one, 1, &b); /* PyTorch's defaults: one bucket */
}

static void assign_one_parameter_per_bucket(void) {
    size_t bytes[4] = {40, 4, 12, 4};
    int want[4] = {3, 2, 1, 0};
    lab_buckets b;
    expect_map(4, bytes, 1, 1, want, 4, &b);
}

/* ---- (2) and (3) the hook, on a map set by hand ---------------------------------------------- */

static const int g_of[6] = {2, 2, 1, 1, 0, 0}, g_in[3] = {2, 2, 2};

static void hook_launches_a_bucket_when_its_last_gradient_arrives(void) {
    int reverse[6] = {5, 4, 3, 2, 1, 0};
    lab_buckets b;
    set_map(&b, g_of, 6, 3);
    simulate(&b, g_of, g_in, 3, reverse, 6, "gradients arriving last parameter first");
}

static void hook_launches_in_bucket_order(void) {
    int early[6] = {3, 2, 5, 4, 1, 0}; /* bucket 1 is complete before bucket 0: it must wait */
    int mixed[6] = {0, 5, 1, 3, 2, 4};
    lab_buckets b;
    set_map(&b, g_of, 6, 3);
    simulate(&b, g_of, g_in, 3, early, 6, "bucket 1 ready before bucket 0 (it must wait for bucket 0)");
    set_map(&b, g_of, 6, 3);
    simulate(&b, g_of, g_in, 3, mixed, 6, "gradients in a mixed order");
}

static void hook_works_for_every_backward_pass(void) {
    int reverse[6] = {5, 4, 3, 2, 1, 0}, early[6] = {1, 0, 3, 2, 5, 4};
    lab_buckets b;
    set_map(&b, g_of, 6, 3);
    simulate(&b, g_of, g_in, 3, reverse, 6, "backward pass 1");
    simulate(&b, g_of, g_in, 3, early, 6, "backward pass 2 (lab_backward_begin must reset the counts)");
    simulate(&b, g_of, g_in, 3, reverse, 6, "backward pass 3");
}

static void hook_one_bucket_and_one_per_parameter(void) {
    int one_of[4] = {0, 0, 0, 0}, one_in[1] = {4}, each_of[4] = {3, 2, 1, 0}, each_in[4] = {1, 1, 1, 1};
    int order[4] = {3, 1, 2, 0};
    lab_buckets b;
    set_map(&b, one_of, 4, 1);
    simulate(&b, one_of, one_in, 1, order, 4, "one bucket for every parameter");
    set_map(&b, each_of, 4, 4);
    simulate(&b, each_of, each_in, 4, order, 4, "one bucket per parameter");
}

/* ---- through ddp.h: a real backward pass calls the hook --------------------------------------- */

typedef struct hook_ctx {
    lab_buckets* b;
    timeline t;
    int arrival[LAB_MAX_PARAMS], n;
} hook_ctx;

static void on_grad_ready(ddp_param* p, void* user) {
    hook_ctx* c = (hook_ctx*)user;
    tl_add(&c->t, "g%d ", p->index);
    if (c->n < LAB_MAX_PARAMS) c->arrival[c->n++] = p->index;
    lab_grad_ready(c->b, p->index, record_launch, &c->t);
}

static void real_backward_through_ddp_model(void) {
    int sizes[4] = {5, 8, 4, 3}, i, pass, y[6] = {0, 1, 2, 0, 1, 2};
    int want_of[6] = {2, 1, 1, 1, 0, 0}; /* bytes 160 32 128 16 48 12, first 50, cap 150 */
    size_t bytes[LAB_MAX_PARAMS];
    float x[30], loss;
    ddp_model* m;
    ddp_model_desc md;
    lab_buckets b;
    hook_ctx c;
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 3;
    if (ddp_model_mlp(&md, sizes, 4, DDP_LAYER_RELU, &m) != DDP_OK) LAB_SKIP("ddp_model_mlp: %s", ddp_error_string());
    for (i = 0; i < ddp_model_num_params(m); i++) bytes[i] = ddp_model_param(m, i)->count * sizeof(float);
    if (!expect_map(ddp_model_num_params(m), bytes, 50, 150, want_of, 3, &b)) return;
    memset(&c, 0, sizeof c);
    c.b = &b;
    for (i = 0; i < ddp_model_num_params(m); i++) ddp_param_add_hook(ddp_model_param(m, i), on_grad_ready, &c);
    for (i = 0; i < 30; i++) x[i] = (float)((i * 7) % 11) / 5.f - 1.f;
    for (pass = 1; pass <= 2; pass++) {
        char want[2048], what[64];
        int in[3] = {2, 3, 1};
        memset(&c.t, 0, sizeof c.t);
        c.n = 0;
        lab_backward_begin(&b);
        if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x, 6) != DDP_OK ||
            ddp_loss_cross_entropy(m, y, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK) {
            lab_failf("a training step failed: %s", ddp_error_string());
            break;
        }
        expected_timeline(want_of, in, 3, c.arrival, c.n, want, sizeof want);
        snprintf(what, sizeof what, "ddp_model_backward, pass %d", pass);
        EXPECT(!strcmp(c.t.text, want), "%s:\n      expected  %s\n      got       %s", what, want, c.t.text);
        if (pass == 1) lab_note("ddp_model_backward's timeline: %s", c.t.text);
    }
    ddp_model_destroy(m);
}

/* ddp_wrap's own bucket map for a range of models and limits, computed in one spawned rank (a
   world of one), compared with the student's. */
#define NCFG 24
typedef struct wrap_maps {
    int nparams[NCFG], layers[NCFG][6];
    size_t first[NCFG], cap[NCFG], bytes[NCFG][LAB_MAX_PARAMS];
    int buckets[NCFG], bucket_params[NCFG][LAB_MAX_PARAMS];
    int error;
    char message[512];
} wrap_maps;

static void make_configs(wrap_maps* w) {
    static const size_t firsts[4] = {4, 64, 500, (size_t)1 << 20}, caps[4] = {4, 100, 1000, (size_t)25 << 20};
    int c, l;
    ddp_rng r = ddp_rng_seed(11);
    for (c = 0; c < NCFG; c++) {
        int nl = 2 + (int)ddp_rng_below(&r, 4);
        for (l = 0; l < nl; l++) w->layers[c][l] = 1 + (int)ddp_rng_below(&r, 40);
        w->nparams[c] = nl; /* layers for now; the rank sets the parameter count */
        w->first[c] = firsts[c % 4];
        w->cap[c] = caps[(c / 4) % 4];
    }
}

static int wrap_rank(int rank, void* arg) {
    wrap_maps* w = (wrap_maps*)arg;
    ddp_desc d;
    ddp_pg* pg;
    int c, i;
    (void)rank;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 20;
    if (ddp_init(&d, &pg) != DDP_OK) {
        snprintf(w->message, sizeof w->message, "ddp_init: %s", ddp_error_string());
        return 1;
    }
    for (c = 0; c < NCFG; c++) {
        ddp_model* m;
        ddp_model_desc md;
        ddp_wrapper* wr;
        ddp_wrap_desc wd;
        ddp_wrap_stats st;
        memset(&md, 0, sizeof md);
        memset(&wd, 0, sizeof wd);
        md.device.type = DDP_DEVICE_CPU;
        wd.first_bucket_bytes = w->first[c], wd.bucket_cap_bytes = w->cap[c];
        if (ddp_model_mlp(&md, w->layers[c], w->nparams[c], DDP_LAYER_RELU, &m) != DDP_OK ||
            ddp_wrap(pg, m, &wd, &wr) != DDP_OK) {
            snprintf(w->message, sizeof w->message, "model or ddp_wrap: %s", ddp_error_string());
            return 1;
        }
        w->nparams[c] = ddp_model_num_params(m);
        for (i = 0; i < w->nparams[c]; i++) w->bytes[c][i] = ddp_model_param(m, i)->count * sizeof(float);
        ddp_wrapper_stats(wr, &st);
        w->buckets[c] = st.buckets;
        for (i = 0; i < st.buckets && i < LAB_MAX_PARAMS; i++) w->bucket_params[c][i] = st.bucket_params[i];
        ddp_wrapper_destroy(wr);
        ddp_model_destroy(m);
    }
    ddp_destroy(pg);
    return 0;
}

static void assign_matches_ddp_wrap(void) {
    wrap_maps* w = (wrap_maps*)lab_shared(sizeof(wrap_maps));
    int c, reported = 0;
    if (!w) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_need_loopback();
    make_configs(w);
    if (ddp_spawn(1, wrap_rank, w) != DDP_OK) {
        lab_failf("could not compute ddp_wrap's bucket maps: %s %s", ddp_error_string(), w->message);
        return;
    }
    for (c = 0; c < NCFG && reported < 3; c++) {
        int want_of[LAB_MAX_PARAMS], p = w->nparams[c] - 1, k, j;
        lab_buckets b;
        for (k = 0; k < w->buckets[c]; k++) /* ddp_wrap fills bucket k from the last parameter on */
            for (j = 0; j < w->bucket_params[c][k] && p >= 0; j++) want_of[p--] = k;
        reported += !expect_map(w->nparams[c], w->bytes[c], w->first[c], w->cap[c], want_of, w->buckets[c], &b);
    }
    if (reported >= 3) lab_note("(stopped after three differences from ddp_wrap)");
    else lab_note("%d models and limits: the same buckets as ddp_wrap", NCFG);
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(assign_the_example_in_the_starter, 10);
    LAB_CASE(assign_first_bucket_smaller, 10);
    LAB_CASE(assign_large_parameter_overshoots, 10);
    LAB_CASE(assign_one_parameter_per_bucket, 10);
    LAB_CASE(hook_launches_a_bucket_when_its_last_gradient_arrives, 10);
    LAB_CASE(hook_launches_in_bucket_order, 10);
    LAB_CASE(hook_works_for_every_backward_pass, 10);
    LAB_CASE(hook_one_bucket_and_one_per_parameter, 10);
    LAB_CASE(real_backward_through_ddp_model, 10);
    LAB_CASE(assign_matches_ddp_wrap, 30);
    return lab_end();
}
