/* labs/buckets/test.c: the tests of lab "buckets", built together with the student's file and
   ddp.h's implementation.

   Part 1 (the map): the student's map is checked against the rules themselves (reverse order, a
   bucket closes as soon as its bytes reach its limit, 0 means the default, ...), each failure
   naming the rule, on hand-worked examples, on random models from the seed (LAB_SEED), and
   against ddp_wrap's own map. The map struct is filled with garbage before every call.

   Part 2 (the reducer): ranks started with ddp_spawn (the CPU backend) run backward passes,
   either written by hand (the test sets p->grad and calls the hook in a chosen order, different
   on each rank, some parameters left without a gradient) or real ones (ddp_model_backward) on a
   model that ddp_wrap also trains, for comparison. After each hook the test reads
   ddp_pg_collectives: how many all-reduces the reducer has launched so far, which gives the
   timeline of launches ("g5 g4 [B0] g3 ..."). After finish it reads every gradient. */
#include "../lab_test.h"

#include <math.h>

#include "buckets.h"
#include "ddp.h"

#define DEFAULT_FIRST ((size_t)1 << 20)
#define DEFAULT_CAP ((size_t)25 << 20)

/* ---- part 1: the map against the rules ------------------------------------------------------- */

static const char* fmt_ints(const int* v, int n) {
    static char bufs[2][1024];
    static int which;
    char* s = bufs[which ^= 1];
    size_t pos = 0;
    int i;
    s[0] = 0;
    for (i = 0; i < n && pos < sizeof bufs[0] - 32; i++) pos += (size_t)snprintf(s + pos, sizeof bufs[0] - pos, "%s%d", i ? " " : "", v[i]);
    if (i < n) snprintf(s + pos, sizeof bufs[0] - pos, " ...");
    return s;
}

/* Run the student's assignment on a map full of garbage and check it against the rules. Returns 1
   when it holds them all; on the first broken rule, one message naming it. */
static int check_map(int nparams, const size_t* bytes, size_t first, size_t cap, lab_bucket_map* map) {
    size_t lim0 = first ? first : DEFAULT_FIRST, lim = cap ? cap : DEFAULT_CAP;
    int i, k, count[LAB_MAX_PARAMS];
    char setting[1400];
    memset(map, 0x5A, sizeof *map); /* documented: not zeroed */
    lab_assign_buckets(map, nparams, bytes, first, cap);
    snprintf(setting, sizeof setting, "param_bytes {%s} (parameter 0 first), first_bucket_bytes %zu, bucket_cap_bytes %zu",
             lab_fmt_sizes(bytes, nparams), first, cap);
#define MAP_FAIL(...)                                                                                                  \
    do {                                                                                                           \
        lab_failf(__VA_ARGS__);                                                                                    \
        lab_note("  for %s", setting);                                                                             \
        if (map->nbuckets >= 0 && map->nbuckets <= LAB_MAX_PARAMS)                                                 \
            lab_note("  your map: %d buckets, bucket_of {%s}, nparams_in {%s}", map->nbuckets,                     \
                     fmt_ints(map->bucket_of, nparams), fmt_ints(map->nparams_in, map->nbuckets));                 \
        return 0;                                                                                                  \
    } while (0)
    if (nparams == 0) {
        if (map->nbuckets != 0) MAP_FAIL("[rule B5: set every field] no parameters, but nbuckets = %d", map->nbuckets);
        return 1;
    }
    if (map->nbuckets < 1 || map->nbuckets > nparams)
        MAP_FAIL("[rule B5: set every field; the map is not zeroed] nbuckets = %d: it must be 1 .. %d", map->nbuckets,
                 nparams);
    for (k = 0; k < map->nbuckets; k++) count[k] = 0;
    for (i = 0; i < nparams; i++) {
        if (map->bucket_of[i] < 0 || map->bucket_of[i] >= map->nbuckets)
            MAP_FAIL("[rule B5: set every field; the map is not zeroed] bucket_of[%d] = %d is not a bucket (0 .. %d)", i,
                     map->bucket_of[i], map->nbuckets - 1);
        count[map->bucket_of[i]]++;
    }
    if (map->bucket_of[nparams - 1] != 0)
        MAP_FAIL("[rule B1: reverse order] the last parameter, %d, is in bucket %d: backward finishes it first, so it "
                 "opens bucket 0", nparams - 1, map->bucket_of[nparams - 1]);
    for (i = nparams - 2; i >= 0; i--)
        if (map->bucket_of[i] != map->bucket_of[i + 1] && map->bucket_of[i] != map->bucket_of[i + 1] + 1)
            MAP_FAIL("[rule B1: reverse order] parameter %d is in bucket %d and parameter %d in bucket %d: walking "
                     "from the last parameter to the first, each one goes into the current bucket or opens the next",
                     i + 1, map->bucket_of[i + 1], i, map->bucket_of[i]);
    for (k = 0; k < map->nbuckets; k++)
        if (map->nparams_in[k] != count[k])
            MAP_FAIL("[rule B5: set every field; the map is not zeroed] nparams_in[%d] = %d, but bucket_of puts %d "
                     "parameter(s) in bucket %d", k, map->nparams_in[k], count[k], k);
    /* each bucket: full when it closed (but the last), and not full before its last parameter */
    for (i = nparams - 1, k = 0; k < map->nbuckets; k++) {
        size_t total = 0, limit = k == 0 ? lim0 : lim, asked = k == 0 ? first : cap;
        int lo = i;
        for (; i >= 0 && map->bucket_of[i] == k; i--) total += bytes[i], lo = i;
        if (k + 1 < map->nbuckets && total < limit) {
            if (asked == 0)
                MAP_FAIL("[rule B3: 0 means the default, as in ddp_wrap] %s = 0, so bucket %d's limit is %zu bytes "
                         "(%s), but it closed with %zu", k == 0 ? "first_bucket_bytes" : "bucket_cap_bytes", k, limit,
                         k == 0 ? "1 MiB" : "25 MiB", total);
            MAP_FAIL("[rule B2: a bucket closes once its bytes reach its limit, not before] bucket %d closed with %zu "
                     "bytes, under its limit %zu (%s)", k, total, limit, k == 0 ? "first_bucket_bytes" : "bucket_cap_bytes");
        }
        if (total - bytes[lo] >= limit)
            MAP_FAIL("[rule B2: a bucket closes as soon as its bytes reach its limit (>=, not >)] bucket %d already held "
                     "%zu bytes, its limit being %zu, before parameter %d went in: it should have closed there", k,
                     total - bytes[lo], limit, lo);
    }
#undef MAP_FAIL
    return 1;
}

static void assign_the_example_in_the_starter(void) {
    size_t bytes[6] = {240, 40, 320, 32, 96, 12};
    lab_bucket_map m;
    if (check_map(6, bytes, 100, 300, &m)) /* and the map itself, as the starter works it out */
        EXPECT(m.nbuckets == 3 && m.bucket_of[5] == 0 && m.bucket_of[4] == 0 && m.bucket_of[3] == 1 &&
               m.bucket_of[2] == 1 && m.bucket_of[1] == 2 && m.bucket_of[0] == 2,
               "the starter's example: expected buckets {5 4} {3 2} {1 0}, got bucket_of {%s}", fmt_ints(m.bucket_of, 6));
}

static void assign_first_bucket_smaller(void) {
    size_t bytes[10] = {100, 100, 100, 100, 100, 100, 100, 100, 100, 100};
    lab_bucket_map m;
    check_map(10, bytes, 150, 400, &m);
}

static void assign_a_bucket_closes_at_exactly_its_limit(void) {
    size_t bytes[6] = {8, 8, 8, 8, 8, 8};
    lab_bucket_map m;
    if (check_map(6, bytes, 16, 16, &m)) /* 16 >= 16: two parameters per bucket, three buckets */
        if (check_map(6, bytes, 8, 24, &m))
            check_map(6, bytes, 48, 48, &m); /* exactly all of them: one bucket */
}

static void assign_large_parameter_overshoots(void) {
    size_t bytes[5] = {8, 4000, 8, 8, 8};
    lab_bucket_map m;
    if (check_map(5, bytes, 10, 100, &m)) check_map(5, bytes, 1, 1, &m); /* one parameter per bucket */
}

static void assign_zero_means_the_default(void) {
    size_t bytes[6] = {240, 40, 320, 32, 96, 12};
    size_t big[4] = {(size_t)3 << 20, 64, (size_t)30 << 20, 400}; /* fc-like sizes around the defaults */
    lab_bucket_map m;
    if (check_map(6, bytes, 0, 0, &m)) /* both defaults: one bucket */
        if (check_map(6, bytes, 0, 100, &m))
            if (check_map(4, big, 0, 0, &m))
                check_map(4, big, 100, 0, &m);
}

static void assign_one_parameter(void) {
    size_t bytes[1] = {4};
    lab_bucket_map m;
    check_map(1, bytes, 0, 0, &m);
}

/* Random models from the seed: sizes, and limits that often fall exactly on a bucket's total. */
static void assign_random_models(void) {
    lab_rng g;
    int c;
    lab_rng_seed(&g, lab_seed(), 11);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    for (c = 0; c < 60; c++) {
        int n = 1 + (int)lab_rng_below(&g, LAB_MAX_PARAMS), i;
        size_t bytes[LAB_MAX_PARAMS], limits[2], sum = 0;
        lab_bucket_map m;
        for (i = 0; i < n; i++) bytes[i] = 4 * (1 + lab_rng_below(&g, lab_rng_below(&g, 3) ? 64 : 2000));
        for (i = 0; i < 2; i++) {
            size_t pick = lab_rng_below(&g, 4);
            int j, upto = n - 1 - (int)lab_rng_below(&g, (size_t)n);
            for (sum = 0, j = n - 1; j >= upto; j--) sum += bytes[j]; /* a total of the last few parameters */
            limits[i] = pick == 0 ? 0 : pick == 1 ? sum : 1 + lab_rng_below(&g, 3 * sum);
        }
        if (!check_map(n, bytes, limits[0], limits[1], &m)) break;
    }
}

/* ddp_wrap's own map for a range of models and limits, computed in one spawned rank. */
#define NCFG 28
typedef struct wrap_maps {
    int nparams[NCFG], layers[NCFG][6];
    size_t first[NCFG], cap[NCFG], bytes[NCFG][LAB_MAX_PARAMS];
    int buckets[NCFG], bucket_params[NCFG][LAB_MAX_PARAMS];
    char message[512];
} wrap_maps;

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
    static const size_t firsts[4] = {0, 64, 500, (size_t)1 << 20}, caps[4] = {4, 0, 1000, (size_t)25 << 20};
    wrap_maps* w = (wrap_maps*)lab_shared(sizeof(wrap_maps));
    lab_rng g;
    int c, l, reported = 0;
    if (!w) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_need_loopback();
    lab_rng_seed(&g, lab_seed(), 12);
    for (c = 0; c < NCFG; c++) {
        int nl = 2 + (int)lab_rng_below(&g, 4);
        for (l = 0; l < nl; l++) w->layers[c][l] = 1 + (int)lab_rng_below(&g, c < 4 ? 800 : 40);
        w->nparams[c] = nl; /* layers for now; the rank sets the parameter count */
        w->first[c] = firsts[c % 4];
        w->cap[c] = caps[(c / 4) % 4];
    }
    if (ddp_spawn(1, wrap_rank, w) != DDP_OK) {
        lab_failf("could not compute ddp_wrap's bucket maps: %s %s", ddp_error_string(), w->message);
        return;
    }
    for (c = 0; c < NCFG && reported < 2; c++) {
        int p = w->nparams[c] - 1, k, j, same;
        lab_bucket_map m;
        if (!check_map(w->nparams[c], w->bytes[c], w->first[c], w->cap[c], &m)) {
            reported++;
            continue;
        }
        same = m.nbuckets == w->buckets[c];
        for (k = 0; k < w->buckets[c] && same; k++) /* ddp_wrap fills bucket k from the last parameter on */
            for (j = 0; j < w->bucket_params[c][k] && p >= 0; j++) same = same && m.bucket_of[p--] == k;
        if (!same) {
            lab_failf("[rule B1-B4: the same map as ddp_wrap] param_bytes {%s}, first_bucket_bytes %zu, bucket_cap_bytes "
                      "%zu: ddp_wrap makes %d bucket(s) of {%s} parameters, yours %d of {%s}",
                      lab_fmt_sizes(w->bytes[c], w->nparams[c]), w->first[c], w->cap[c], w->buckets[c],
                      fmt_ints(w->bucket_params[c], w->buckets[c]), m.nbuckets, fmt_ints(m.nparams_in, m.nbuckets));
            reported++;
        }
    }
    if (!reported) lab_note("%d models and limits (0 among them): the same buckets as ddp_wrap", NCFG);
}

/* ---- part 2: the reducer on real ranks ----------------------------------------------------- */

#define MAX_RANKS 3
#define MAX_PASS 3
#define MAX_W 4096 /* floats of all the parameters of a test model */

typedef struct scenario {
    int W, nlayers, sizes[6], npasses;
    int real;                    /* 1: real backward passes, beside a ddp_wrap model */
    int handshake;               /* 1: rank 1 starts only once rank 0 is back from the hook that completes bucket 0 */
    size_t first, cap;           /* real: ddp_wrap's limits (its map is the reducer's map) */
    lab_bucket_map map;          /* hand-written passes: the map */
    int narr[MAX_PASS][MAX_RANKS];
    int arrival[MAX_PASS][MAX_RANKS][LAB_MAX_PARAMS]; /* hand-written passes: hook order; the rest get none */
    int flag;                    /* the handshake */
    struct rank_out {
        int done, blocked, nparams, started, finished; /* passes begun, passes whose finish returned */
        char message[512];
        int arr[MAX_PASS][LAB_MAX_PARAMS], narr[MAX_PASS]; /* the hooks as they ran */
        int launched[MAX_PASS][LAB_MAX_PARAMS];             /* all-reduces launched after each hook */
        int at_finish[MAX_PASS];                            /* ... and after finish */
        float grads[MAX_PASS][MAX_W], wrap[MAX_PASS][MAX_W]; /* after finish; ddp_wrap's (real) */
        char names[LAB_MAX_PARAMS][32];
        size_t counts[LAB_MAX_PARAMS];
    } out[MAX_RANKS];
} scenario;

/* Hand-written gradients: small multiples of 1/8, exact in any sum. */
static float gvalue(int rank, int pass, int param, size_t j) {
    return (float)((int)((size_t)rank * 7 + (size_t)pass * 3 + (size_t)param * 5 + j) % 9 - 4) * 0.125f;
}

typedef struct hook_ctx {
    lab_reducer* r;
    ddp_pg* pg;
    uint64_t c0;
    struct rank_out* out;
    int pass, complete_b0_param; /* the hook after which rank 0 raises the handshake flag */
    scenario* sc;
} hook_ctx;

static void record_hook(ddp_param* p, void* user) {
    hook_ctx* c = (hook_ctx*)user;
    int n = c->out->narr[c->pass];
    lab_reducer_grad_ready(c->r, p);
    if (n < LAB_MAX_PARAMS) {
        c->out->arr[c->pass][n] = p->index;
        c->out->launched[c->pass][n] = (int)(ddp_pg_collectives(c->pg) - c->c0);
        c->out->narr[c->pass] = n + 1;
    }
    if (c->sc->handshake && ddp_rank(c->pg) == 0 && p->index == c->complete_b0_param)
        __atomic_store_n(&c->sc->flag, 1, __ATOMIC_RELEASE);
}

static int fail_rank(struct rank_out* o, const char* what) {
    snprintf(o->message, sizeof o->message, "%s: %s", what, ddp_error_string());
    return 1;
}

static int reducer_rank(int rank, void* arg) {
    scenario* sc = (scenario*)arg;
    struct rank_out* o = &sc->out[rank];
    ddp_desc d;
    ddp_pg* pg;
    ddp_model *m, *mw = NULL;
    ddp_model_desc md;
    ddp_wrapper* wr = NULL;
    lab_bucket_map map = sc->map;
    hook_ctx ctx;
    int i, pass;
    size_t off;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 10;
    if (ddp_init(&d, &pg) != DDP_OK) return fail_rank(o, "ddp_init");
    memset(&md, 0, sizeof md);
    md.device.type = DDP_DEVICE_CPU;
    md.seed = 17;
    if (ddp_model_mlp(&md, sc->sizes, sc->nlayers, DDP_LAYER_RELU, &m) != DDP_OK) return fail_rank(o, "ddp_model_mlp");
    o->nparams = ddp_model_num_params(m);
    if (ddp_model_num_elements(m) > MAX_W) {
        snprintf(o->message, sizeof o->message, "the test's model is larger than MAX_W");
        return 1;
    }
    for (i = 0; i < o->nparams; i++) {
        snprintf(o->names[i], sizeof o->names[i], "%s", ddp_model_param(m, i)->name);
        o->counts[i] = ddp_model_param(m, i)->count;
    }
    if (sc->real) { /* the same model under ddp_wrap, whose map the reducer gets too */
        ddp_wrap_desc wd;
        ddp_wrap_stats st;
        int k, j, p;
        memset(&wd, 0, sizeof wd);
        wd.first_bucket_bytes = sc->first, wd.bucket_cap_bytes = sc->cap;
        if (ddp_model_mlp(&md, sc->sizes, sc->nlayers, DDP_LAYER_RELU, &mw) != DDP_OK || ddp_wrap(pg, mw, &wd, &wr) != DDP_OK)
            return fail_rank(o, "the ddp_wrap model");
        ddp_wrapper_stats(wr, &st);
        map.nbuckets = st.buckets;
        for (p = o->nparams - 1, k = 0; k < st.buckets; k++)
            for (map.nparams_in[k] = st.bucket_params[k], j = 0; j < st.bucket_params[k]; j++) map.bucket_of[p--] = k;
        if (rank == 0) sc->map = map; /* for the checks */
        for (i = 0; i < o->nparams; i++) /* ddp_wrap broadcast rank 0's weights; the seed made them equal anyway */
            memcpy(ddp_model_param(m, i)->data, ddp_model_param(mw, i)->data, o->counts[i] * sizeof(float));
    }
    memset(&ctx, 0, sizeof ctx);
    ctx.pg = pg, ctx.out = o, ctx.sc = sc, ctx.complete_b0_param = -1;
    ctx.r = lab_reducer_create(pg, m, &map);
    memset(&map, 0x5A, sizeof map); /* the reducer must have copied what it needs */
    if (!ctx.r) {
        snprintf(o->message, sizeof o->message, "lab_reducer_create returned NULL");
        return 1;
    }
    for (i = 0; i < o->nparams; i++) ddp_param_add_hook(ddp_model_param(m, i), record_hook, &ctx);
    for (pass = 0; pass < sc->npasses; pass++) {
        ddp_status s;
        ctx.pass = pass;
        o->started = pass + 1;
        if (sc->real) {
            float x[8 * 64], loss;
            int y[8], n = 8;
            for (i = 0; i < n * sc->sizes[0]; i++) x[i] = gvalue(rank, pass, i % 7, (size_t)i) * 3.f;
            for (i = 0; i < n; i++) y[i] = (rank + pass + i) % sc->sizes[sc->nlayers - 1];
            /* ddp_wrap's step first, then the reducer's: every rank issues the same collectives in the same order */
            if (ddp_model_zero_grad(mw) != DDP_OK || ddp_model_forward(mw, x, n) != DDP_OK ||
                ddp_loss_cross_entropy(mw, y, &loss) != DDP_OK || ddp_model_backward(mw) != DDP_OK)
                return fail_rank(o, "ddp_wrap's backward");
            for (i = 0, off = 0; i < o->nparams; off += o->counts[i], i++)
                memcpy(o->wrap[pass] + off, ddp_model_param(mw, i)->grad, o->counts[i] * sizeof(float));
            ctx.c0 = ddp_pg_collectives(pg);
            if (ddp_model_zero_grad(m) != DDP_OK || ddp_model_forward(m, x, n) != DDP_OK ||
                ddp_loss_cross_entropy(m, y, &loss) != DDP_OK || ddp_model_backward(m) != DDP_OK)
                return fail_rank(o, "the backward pass");
        } else {
            int a;
            if (sc->handshake && rank == 0) /* the parameter whose hook completes bucket 0 */
                for (a = 0; a < sc->narr[pass][0]; a++)
                    if (sc->map.bucket_of[sc->arrival[pass][0][a]] == 0) ctx.complete_b0_param = sc->arrival[pass][0][a];
            if (sc->handshake && rank == 1) {
                double until = lab_now() + 2.0;
                while (!__atomic_load_n(&sc->flag, __ATOMIC_ACQUIRE) && lab_now() < until) {
                    struct timespec ts = {0, 1000000};
                    nanosleep(&ts, NULL);
                }
                o->blocked = !__atomic_load_n(&sc->flag, __ATOMIC_ACQUIRE);
            }
            ctx.c0 = ddp_pg_collectives(pg);
            for (i = 0; i < o->nparams; i++) {
                ddp_param* p = ddp_model_param(m, i);
                size_t j;
                for (j = 0; j < p->count; j++) p->grad[j] = gvalue(rank, pass, i, j);
            }
            /* a backward of the test's own, announcing the gradients in this scenario's order */
            ddp_unit_begin(m, 0, DDP_BACKWARD);
            for (a = 0; a < sc->narr[pass][rank]; a++) ddp_param_grad_ready(ddp_model_param(m, sc->arrival[pass][rank][a]));
            ddp_unit_end(m, 0, DDP_BACKWARD);
        }
        s = lab_reducer_finish(ctx.r);
        o->at_finish[pass] = (int)(ddp_pg_collectives(pg) - ctx.c0);
        o->finished = pass + 1;
        if (s != DDP_OK) {
            snprintf(o->message, sizeof o->message, "pass %d: lab_reducer_finish returned %s: %s", pass + 1,
                     ddp_status_name(s), ddp_error_string());
            return 1;
        }
        for (i = 0, off = 0; i < o->nparams; off += o->counts[i], i++)
            memcpy(o->grads[pass] + off, ddp_model_param(m, i)->grad, o->counts[i] * sizeof(float));
    }
    lab_reducer_destroy(ctx.r);
    if (wr) ddp_wrapper_destroy(wr);
    ddp_model_destroy(m);
    ddp_model_destroy(mw);
    ddp_destroy(pg);
    o->done = 1;
    return 0;
}

/* The all-reduces that should have been launched after each hook: bucket k goes in the hook that
   completes it, or, if an earlier bucket is still incomplete then, in the hook that completes
   that one. */
static void expected_launches(const lab_bucket_map* map, const int* arr, int narr, int* want, int* complete_now) {
    int done_at[LAB_MAX_PARAMS], left[LAB_MAX_PARAMS], k, a, go = -1;
    for (k = 0; k < map->nbuckets; k++) done_at[k] = narr, left[k] = map->nparams_in[k]; /* narr: at finish */
    for (a = 0; a < narr; a++) {
        int b = map->bucket_of[arr[a]];
        if (--left[b] == 0) done_at[b] = a;
    }
    for (a = 0; a < narr; a++) {
        int n = 0, c = 0;
        for (k = 0; k < map->nbuckets; k++) {
            go = k == 0 ? done_at[0] : (done_at[k] > go ? done_at[k] : go); /* when every bucket up to k is done */
            n += go <= a;
            c += done_at[k] <= a;
        }
        want[a] = n, complete_now[a] = c;
    }
}

/* "g5 g4 [B0] g3 ... | finish [B2]": the hooks in order, and after each the all-reduces launched
   in it: [Bk] for bucket k where the order is known to be right, else [#n], the n-th launch. */
static int g_render_numbers;
static size_t render_launches(char* out, size_t cap, size_t pos, int from, int to, int nb) {
    int k;
    for (k = from; k < to && pos < cap - 32; k++)
        pos += (size_t)snprintf(out + pos, cap - pos, g_render_numbers || k >= nb ? "[#%d] " : "[B%d] ",
                                g_render_numbers || k >= nb ? k + 1 : k);
    return pos;
}
static void render(char* out, size_t cap, const int* arr, const int* launched, int narr, int at_finish, int nb) {
    size_t pos = 0;
    int a, before = 0;
    out[0] = 0;
    for (a = 0; a < narr && pos < cap - 64; a++) {
        pos += (size_t)snprintf(out + pos, cap - pos, "g%d ", arr[a]);
        pos = render_launches(out, cap, pos, before, launched[a], nb);
        before = launched[a] > before ? launched[a] : before;
    }
    pos += (size_t)snprintf(out + pos, cap - pos, "| finish ");
    render_launches(out, cap, pos, before, at_finish, nb);
}

/* The timeline of each pass each rank began, against rules R2, R3, R5, R6 and R7. Returns 1 when
   it holds them. */
static int check_timelines(scenario* sc) {
    int r, pass, a;
    for (pass = 0; pass < sc->npasses; pass++)
        for (r = 0; r < sc->W; r++) {
            struct rank_out* o = &sc->out[r];
            int want[LAB_MAX_PARAMS], complete[LAB_MAX_PARAMS], before = lab_failed_checks, n = o->narr[pass];
            char got_s[1024], want_s[1024];
            if (o->started <= pass) continue;
            expected_launches(&sc->map, o->arr[pass], n, want, complete);
            for (a = 0; a < n && lab_failed_checks == before; a++) {
                int got = o->launched[pass][a];
                if (got > want[a] && got <= complete[a])
                    lab_failf("[rule R3: buckets go in bucket order] rank %d, pass %d: after g%d, %d all-reduce(s) had "
                              "been launched, expected %d: a bucket is complete before an earlier one, and it must wait "
                              "for it (every rank must launch the same buckets in the same order)", r, pass + 1,
                              o->arr[pass][a], got, want[a]);
                else if (got > want[a])
                    lab_failf("[rule R2: a bucket goes when all of its gradients are in] rank %d, pass %d: after g%d, %d "
                              "all-reduce(s) had been launched, expected %d: one went before its bucket was complete",
                              r, pass + 1, o->arr[pass][a], got, want[a]);
                else if (got < want[a] && pass > 0 && n > 0 && o->launched[pass][n - 1] == 0)
                    lab_failf("[rule R7: every pass starts fresh] rank %d, pass %d: no all-reduce was launched during "
                              "this backward pass, though pass 1 launched as it should: does finish leave the reducer "
                              "ready for the next pass (counts back, launches back to bucket 0)?", r, pass + 1);
                else if (got < want[a])
                    lab_failf("[rule R2: a bucket goes as soon as it and every bucket before it are complete] rank %d, "
                              "pass %d: after g%d, %d all-reduce(s) had been launched, expected %d: launch in the hook "
                              "that completes the bucket, or backward cannot overlap the communication", r, pass + 1,
                              o->arr[pass][a], got, want[a]);
            }
            if (lab_failed_checks == before && o->finished > pass && o->at_finish[pass] != sc->map.nbuckets)
                lab_failf("[rule %s] rank %d, pass %d: %d all-reduce(s) in all, expected %d, one per bucket",
                          n < o->nparams && o->at_finish[pass] < sc->map.nbuckets
                              ? "R6: a parameter that got no gradient counts as zero, and its bucket still goes"
                              : "R5: one all-reduce per bucket per backward pass",
                          r, pass + 1, o->at_finish[pass], sc->map.nbuckets);
            if (lab_failed_checks == before && o->finished <= pass && n < o->nparams && want[n > 0 ? n - 1 : 0] < sc->map.nbuckets)
                lab_failf("[rule R6: a parameter that got no gradient counts as zero, and its bucket still goes] rank %d, "
                          "pass %d: %d parameter(s) got no gradient, and finish did not come back (below)", r, pass + 1,
                          o->nparams - n);
            if (lab_failed_checks != before) {
                render(want_s, sizeof want_s, o->arr[pass], want, n, sc->map.nbuckets, sc->map.nbuckets);
                g_render_numbers = 1;
                render(got_s, sizeof got_s, o->arr[pass], o->launched[pass], n, o->finished > pass ? o->at_finish[pass] : 0,
                       sc->map.nbuckets);
                g_render_numbers = 0;
                lab_note("  expected  %s", want_s);
                lab_note("  got       %s%s", got_s, o->finished > pass ? "" : "(finish did not return)");
                lab_note("  (gN: parameter N's hook ran; [Bk]: bucket k's all-reduce; [#n]: your n-th all-reduce)");
                return 0;
            }
        }
    return 1;
}

/* Start the ranks and check what they recorded. */
static void run_scenario(scenario* sc) {
    int r, pass, a, all_done = 1;
    lab_need_loopback();
    if (ddp_spawn(sc->W, reducer_rank, sc) != DDP_OK) all_done = 0;
    for (r = 0; r < sc->W; r++) all_done &= sc->out[r].done;
    if (sc->handshake && sc->out[1].blocked) {
        lab_failf("[rule R4: the launch does not wait] rank 0 did not come back within 2 s from the hook that completed "
                  "bucket 0, while rank 1 had not started its backward pass yet: lab_reducer_grad_ready waits for the "
                  "all-reduce it launched (ddp_all_reduce with work = NULL, or ddp_work_wait right after it). Launch "
                  "with a work handle and wait in lab_reducer_finish: backward goes on while the bucket travels");
        return;
    }
    if (!check_timelines(sc) || !all_done) {
        if (!all_done) lab_failf("the %d ranks did not all finish: %s", sc->W, ddp_error_string());
        for (r = 0; r < sc->W; r++)
            if (!sc->out[r].done)
                lab_note("  rank %d: %s", r, sc->out[r].message[0] ? sc->out[r].message : "did not finish (see above)");
        return;
    }
    /* the gradients: the average over the ranks, a missing gradient counting as zero */
    for (pass = 0; pass < sc->npasses; pass++)
        for (r = 0; r < sc->W; r++) {
            struct rank_out* o = &sc->out[r];
            size_t off, j;
            int i;
            for (i = 0, off = 0; i < o->nparams; off += o->counts[i], i++)
                for (j = 0; j < o->counts[i]; j++) {
                    double want = 0, got = o->grads[pass][off + j];
                    int q, used_everywhere = 1;
                    if (sc->real) want = sc->out[0].wrap[pass][off + j];
                    else
                        for (q = 0; q < sc->W; q++) {
                            int used = 0;
                            for (a = 0; a < sc->out[q].narr[pass]; a++) used |= sc->out[q].arr[pass][a] == i;
                            used_everywhere &= used;
                            if (used) want += gvalue(q, pass, i, j);
                        }
                    if (!sc->real) want /= sc->W;
                    if (fabs(got - want) <= 1e-6 * (1 + fabs(want))) continue;
                    if (want != 0 && fabs(got - want * sc->W) <= 1e-6 * (1 + fabs(want * sc->W)))
                        lab_failf("[rule R1: divide by the world size] rank %d, pass %d: %s[%zu] = %.9g, the sum over the "
                                  "%d ranks; the average is %.9g", r, pass + 1, o->names[i], j, got, sc->W, want);
                    else if (!used_everywhere)
                        lab_failf("[rule R6: a parameter that got no gradient counts as zero] rank %d, pass %d: %s[%zu] = "
                                  "%.9g, expected %.9g: the average over the ranks, a rank without a gradient for %s "
                                  "adding zero", r, pass + 1, o->names[i], j, got, want, o->names[i]);
                    else
                        lab_failf("[rule R1: after finish every p->grad holds the average over the ranks%s] rank %d, "
                                  "pass %d: %s[%zu] = %.9g, expected %.9g", sc->real ? " (ddp_wrap's result)" : "", r,
                                  pass + 1, o->names[i], j, got, want);
                    return;
                }
        }
    {
        char s[1024];
        render(s, sizeof s, sc->out[0].arr[0], sc->out[0].launched[0], sc->out[0].narr[0], sc->out[0].at_finish[0],
               sc->map.nbuckets);
        lab_note("rank 0, pass 1: %s", s);
    }
}

/* The six-parameter model (fc1.weight 0, fc1.bias 1, ... fc3.bias 5) in three buckets of two. */
static scenario* six_params(int W, int npasses) {
    scenario* sc = (scenario*)lab_shared(sizeof(scenario));
    static const int of[6] = {2, 2, 1, 1, 0, 0};
    int i;
    if (!sc) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    sc->W = W, sc->npasses = npasses, sc->nlayers = 4;
    sc->sizes[0] = 4, sc->sizes[1] = 6, sc->sizes[2] = 5, sc->sizes[3] = 3;
    sc->map.nbuckets = 3;
    for (i = 0; i < 6; i++) sc->map.bucket_of[i] = of[i], sc->map.nparams_in[of[i]]++;
    return sc;
}
static void set_order(scenario* sc, int pass, int rank, const int* order, int n) {
    sc->narr[pass][rank] = n;
    memcpy(sc->arrival[pass][rank], order, sizeof(int) * (size_t)n);
}

static void reducer_launches_a_bucket_when_it_is_complete(void) {
    static const int reverse[6] = {5, 4, 3, 2, 1, 0};
    scenario* sc = six_params(2, 1);
    set_order(sc, 0, 0, reverse, 6);
    set_order(sc, 0, 1, reverse, 6);
    run_scenario(sc);
}

static void reducer_launches_in_bucket_order(void) {
    static const int early[6] = {3, 2, 5, 4, 1, 0}, mixed[6] = {0, 5, 1, 3, 2, 4};
    scenario* sc = six_params(2, 1);
    set_order(sc, 0, 0, early, 6); /* bucket 1 complete before bucket 0: it must wait */
    set_order(sc, 0, 1, mixed, 6);
    run_scenario(sc);
}

static void reducer_every_backward_pass(void) {
    static const int reverse[6] = {5, 4, 3, 2, 1, 0}, early[6] = {1, 0, 3, 2, 5, 4}, mixed[6] = {4, 5, 0, 2, 3, 1};
    scenario* sc = six_params(2, 3);
    set_order(sc, 0, 0, reverse, 6), set_order(sc, 0, 1, early, 6);
    set_order(sc, 1, 0, early, 6), set_order(sc, 1, 1, mixed, 6);
    set_order(sc, 2, 0, mixed, 6), set_order(sc, 2, 1, reverse, 6);
    run_scenario(sc);
}

static void reducer_one_bucket_and_one_per_parameter(void) {
    static const int order[6] = {5, 3, 4, 1, 2, 0};
    scenario* sc = six_params(2, 1);
    int i;
    memset(&sc->map, 0, sizeof sc->map);
    sc->map.nbuckets = 1, sc->map.nparams_in[0] = 6;
    set_order(sc, 0, 0, order, 6), set_order(sc, 0, 1, order, 6);
    run_scenario(sc);
    sc = six_params(2, 1);
    memset(&sc->map, 0, sizeof sc->map);
    sc->map.nbuckets = 6;
    for (i = 0; i < 6; i++) sc->map.bucket_of[i] = 5 - i, sc->map.nparams_in[i] = 1;
    set_order(sc, 0, 0, order, 6), set_order(sc, 0, 1, order, 6);
    run_scenario(sc);
}

static void reducer_launch_does_not_wait(void) {
    static const int reverse[6] = {5, 4, 3, 2, 1, 0};
    scenario* sc = six_params(2, 1);
    sc->handshake = 1;
    set_order(sc, 0, 0, reverse, 6), set_order(sc, 0, 1, reverse, 6);
    run_scenario(sc);
}

static void reducer_parameter_without_gradient(void) {
    static const int no4[5] = {5, 3, 2, 1, 0}, no1[5] = {5, 4, 3, 2, 0}, all[6] = {5, 4, 3, 2, 1, 0};
    scenario* sc = six_params(2, 2);
    set_order(sc, 0, 0, no4, 5); /* bucket 0 never completes on rank 0: everything goes at finish */
    set_order(sc, 0, 1, no1, 5);
    set_order(sc, 1, 0, all, 6), set_order(sc, 1, 1, all, 6); /* and the next pass is whole again */
    run_scenario(sc);
}

static void reducer_three_ranks(void) {
    static const int a[6] = {5, 4, 3, 2, 1, 0}, b[6] = {3, 5, 4, 2, 0, 1}, c[6] = {0, 1, 2, 3, 4, 5};
    scenario* sc = six_params(3, 1);
    set_order(sc, 0, 0, a, 6), set_order(sc, 0, 1, b, 6), set_order(sc, 0, 2, c, 6);
    run_scenario(sc);
}

static void reducer_random_passes(void) {
    lab_rng g;
    int t;
    lab_rng_seed(&g, lab_seed(), 13);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    for (t = 0; t < 3 && lab_failed_checks == 0; t++) {
        scenario* sc = (scenario*)lab_shared(sizeof(scenario));
        int l, np, i, k, pass, r;
        if (!sc) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
        sc->W = 2 + (int)lab_rng_below(&g, 2), sc->npasses = 2, sc->nlayers = 3 + (int)lab_rng_below(&g, 3);
        for (l = 0; l < sc->nlayers; l++) sc->sizes[l] = 1 + (int)lab_rng_below(&g, 9);
        np = 2 * (sc->nlayers - 1);
        for (i = np - 1, k = 0; i >= 0; i--) { /* a random map: contiguous, last parameter first */
            sc->map.bucket_of[i] = k;
            sc->map.nparams_in[k]++;
            if (i > 0 && lab_rng_below(&g, 3) == 0) k++;
        }
        sc->map.nbuckets = k + 1;
        for (pass = 0; pass < 2; pass++)
            for (r = 0; r < sc->W; r++) {
                int order[LAB_MAX_PARAMS], n = np;
                for (i = 0; i < np; i++) order[i] = np - 1 - i;
                for (i = 0; i < np; i++) { /* a few swaps: roughly reverse order */
                    int j = (int)lab_rng_below(&g, (size_t)np), tmp = order[i];
                    if (lab_rng_below(&g, 3) == 0) order[i] = order[j], order[j] = tmp;
                }
                if (lab_rng_below(&g, 4) == 0) n--; /* one parameter without a gradient */
                set_order(sc, pass, r, order, n);
            }
        run_scenario(sc);
    }
}

static void reducer_matches_ddp_wrap_in_real_backward_passes(void) {
    scenario* sc = (scenario*)lab_shared(sizeof(scenario));
    if (!sc) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    sc->W = 2, sc->npasses = 2, sc->real = 1, sc->nlayers = 5;
    sc->sizes[0] = 12, sc->sizes[1] = 16, sc->sizes[2] = 8, sc->sizes[3] = 10, sc->sizes[4] = 4;
    sc->first = 100, sc->cap = 400; /* several buckets */
    run_scenario(sc);
    if (lab_failed_checks) return;
    sc = (scenario*)lab_shared(sizeof(scenario));
    if (!sc) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    sc->W = 3, sc->npasses = 2, sc->real = 1, sc->nlayers = 4;
    sc->sizes[0] = 9, sc->sizes[1] = 20, sc->sizes[2] = 7, sc->sizes[3] = 5;
    sc->first = 64, sc->cap = 0; /* the later bucket at its default, 25 MiB: two buckets */
    run_scenario(sc);
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(assign_the_example_in_the_starter, 10);
    LAB_CASE(assign_first_bucket_smaller, 10);
    LAB_CASE(assign_a_bucket_closes_at_exactly_its_limit, 10);
    LAB_CASE(assign_large_parameter_overshoots, 10);
    LAB_CASE(assign_zero_means_the_default, 10);
    LAB_CASE(assign_one_parameter, 10);
    LAB_CASE(assign_random_models, 10);
    LAB_CASE(assign_matches_ddp_wrap, 30);
    LAB_CASE(reducer_launches_a_bucket_when_it_is_complete, 30);
    LAB_CASE(reducer_launches_in_bucket_order, 30);
    LAB_CASE(reducer_every_backward_pass, 30);
    LAB_CASE(reducer_one_bucket_and_one_per_parameter, 30);
    LAB_CASE(reducer_launch_does_not_wait, 30);
    LAB_CASE(reducer_parameter_without_gradient, 30);
    LAB_CASE(reducer_three_ranks, 30);
    LAB_CASE(reducer_random_passes, 60);
    LAB_CASE(reducer_matches_ddp_wrap_in_real_backward_passes, 60);
    return lab_end();
}
