/* tests/unit/test_snapshot.c: the >>snapshot section (ddp_snapshot_save/_load/_exists: a safetensors
   file holding the model, the optimizer's state, the sampler's epoch, the loader's position, a
   random generator and the program's counters) on the CPU. Every refused file must leave the
   target untouched: the helpers below fingerprint everything a load could change. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <signal.h>

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_tmp[64]; /* temporary folder made by mkdtemp, removed at the end */
static const ddp_device g_cpu = {DDP_DEVICE_CPU, 0};

/* ---- files ------------------------------------------------------------------------------------- */

static const char* tmp_path(const char* name) {
    static char bufs[8][256];
    static int next;
    char* b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_tmp, name);
    return b;
}

static int write_bytes(const char* path, const void* data, size_t n) {
    FILE* f = fopen(path, "wb");
    int ok;
    if (!f) return 0;
    ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* The whole file in a malloc'd buffer with 64 spare bytes (NULL if it cannot be read). */
static unsigned char* read_bytes(const char* path, size_t* n) {
    FILE* f = fopen(path, "rb");
    unsigned char* p;
    long len;
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    p = (unsigned char*)calloc((size_t)len + 64, 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) *n = (size_t)len;
    return p;
}

static int file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Names in g_tmp that contain ".tmp" (leftover temporary files, "<path>.tmp.<host>.<pid>");
   the count, the first in `first`. */
static int count_tmp_files(char* first, size_t cap) {
    DIR* d = opendir(g_tmp);
    struct dirent* e;
    int n = 0;
    first[0] = 0;
    if (!d) return 0;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp")) {
            if (!n) snprintf(first, cap, "%s", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

static int msg_has(const char* needle) { return strstr(ddp_error_string(), needle) != NULL; }

static uint64_t get_u64(const unsigned char* p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void put_u64(unsigned char* p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Where the checksum's 16 hex digits are (the documented metadata key), or 0. */
static size_t checksum_pos(const unsigned char* b, size_t n) {
    static const char key[] = "\"checksum\":\"";
    size_t i, k = sizeof key - 1;
    for (i = 8; i + k + 16 <= n; i++)
        if (!memcmp(b + i, key, k)) return i + k;
    return 0;
}
/* The documented checksum: FNV-1a 64 over the whole file with its 16 digits written as '0'. */
static uint64_t doc_checksum(const unsigned char* b, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i, at = checksum_pos(b, n);
    for (i = 0; i < n; i++) {
        unsigned char c = at && i >= at && i < at + 16 ? (unsigned char)'0' : b[i];
        h = (h ^ c) * 0x100000001b3ull;
    }
    return h;
}
/* Recompute and write the checksum, so that a deliberate edit reaches the checks behind it. */
static void rehash(unsigned char* b, size_t n) {
    char hex[17];
    size_t at = checksum_pos(b, n);
    if (!at) return;
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)doc_checksum(b, n));
    memcpy(b + at, hex, 16);
}
/* Replace the first `from` inside the header with `to` (the same length); 1 if found. */
static int edit_header(unsigned char* b, size_t n, const char* from, const char* to) {
    size_t i, k = strlen(from), end = 8 + (size_t)get_u64(b);
    if (strlen(to) != k || end > n) return 0;
    for (i = 8; i + k <= end; i++)
        if (!memcmp(b + i, from, k)) {
            memcpy(b + i, to, k);
            return 1;
        }
    return 0;
}

/* ---- models, data, a whole training job ------------------------------------------------------ */

static ddp_model* make_mlp(const int* sizes, int n, uint64_t seed) {
    ddp_model_desc desc;
    ddp_model* m = NULL;
    memset(&desc, 0, sizeof desc);
    desc.device = g_cpu;
    desc.seed = seed;
    CHECK_OK(ddp_model_mlp(&desc, sizes, n, DDP_LAYER_RELU, &m));
    return m;
}

/* Row i is (i*10 + j for each feature j), label i % classes: a row names its sample. */
static void make_data(ddp_dataset* d, int n, int f, int classes) {
    int i, j;
    d->n = n, d->nfeatures = f, d->nclasses = classes;
    d->x = (float*)malloc((size_t)n * f * sizeof(float));
    d->y = (int*)malloc((size_t)n * sizeof(int));
    for (i = 0; i < n; i++) {
        for (j = 0; j < f; j++) d->x[i * f + j] = (float)(i * 10 + j) * 0.01f;
        d->y[i] = i % classes;
    }
}

/* Everything a training program holds, and the snapshot struct pointing at it. */
typedef struct job {
    ddp_dataset data;
    ddp_model* model;
    ddp_optim* optim; /* NULL for kind DDP_OPTIM_DEFAULT with momentum < 0 (no optimizer) */
    ddp_sampler sampler;
    ddp_loader loader;
    ddp_rng rng;
    ddp_snapshot snap;
} job;

typedef struct job_spec {
    const int* sizes;
    int nsizes;
    uint64_t seed;        /* the model's */
    ddp_optim_kind kind;  /* DDP_OPTIM_DEFAULT and no_optim: none */
    int no_optim;
    float momentum;
    int n, replicas, rank; /* the sampler's */
    uint64_t sampler_seed;
    int batch;
} job_spec;

static void job_init(job* j, const job_spec* sp) {
    ddp_sampler_desc sd;
    memset(j, 0, sizeof *j);
    make_data(&j->data, sp->n, sp->sizes[0], sp->sizes[sp->nsizes - 1]);
    j->model = make_mlp(sp->sizes, sp->nsizes, sp->seed);
    if (j->model && !sp->no_optim) {
        ddp_optim_desc od;
        memset(&od, 0, sizeof od);
        od.kind = sp->kind;
        od.lr = 0.01f;
        od.momentum = sp->momentum;
        CHECK_OK(ddp_optim_create(j->model, &od, &j->optim));
    }
    memset(&sd, 0, sizeof sd);
    sd.num_replicas = sp->replicas;
    sd.rank = sp->rank;
    sd.seed = sp->sampler_seed;
    CHECK_OK(ddp_sampler_init(&j->sampler, sp->n, &sd));
    CHECK_OK(ddp_loader_init(&j->loader, &j->data, &(ddp_loader_desc){.batch_size = sp->batch}));
    j->rng = ddp_rng_seed(sp->seed * 1000 + 5);
    j->snap.model = j->model;
    j->snap.optim = j->optim;
    j->snap.sampler = &j->sampler;
    j->snap.loader = &j->loader;
    j->snap.rng = &j->rng;
    j->snap.epoch = -1;
    j->snap.step = -1;
}
static void job_free(job* j) {
    ddp_loader_free(&j->loader);
    ddp_optim_destroy(j->optim);
    ddp_model_destroy(j->model);
    ddp_dataset_free(&j->data);
    memset(j, 0, sizeof *j);
}

/* One real training step on `batch` random samples drawn from data_rng. */
static void train_step(ddp_model* m, ddp_optim* o, ddp_rng* data_rng, int batch) {
    int in = ddp__model_in_features(m), out = ddp__model_out_features(m), i;
    float* x = (float*)malloc((size_t)batch * in * sizeof(float));
    int* y = (int*)malloc((size_t)batch * sizeof(int));
    float loss = 0;
    for (i = 0; i < batch * in; i++) x[i] = 2.f * ddp_rng_uniform(data_rng) - 1.f;
    for (i = 0; i < batch; i++) y[i] = (int)ddp_rng_below(data_rng, (uint32_t)out);
    CHECK_OK(ddp_model_zero_grad(m));
    CHECK_OK(ddp_model_forward(m, x, batch));
    CHECK_OK(ddp_loss_cross_entropy(m, y, &loss));
    CHECK_OK(ddp_model_backward(m));
    if (o) CHECK_OK(ddp_optim_step(o));
    free(x);
    free(y);
}

/* Everything a load may change: parameters, then each parameter's optimizer state, then the
   counters. Two fingerprints are equal only if every float is bit-for-bit the same. */
typedef struct fingerprint {
    float* f;
    size_t n;
    long osteps;
    int sampler_epoch, resume_pos, epoch;
    uint64_t rng;
    long step;
} fingerprint;

static void fp_take(fingerprint* fp, const ddp_snapshot* s) {
    ddp_model* m = s->model;
    size_t total = 0, off = 0;
    int i, k;
    for (i = 0; i < ddp_model_num_params(m); i++) total += ddp_model_param(m, i)->count * 3;
    memset(fp, 0, sizeof *fp);
    fp->f = (float*)calloc(total + 1, sizeof(float));
    for (i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param* p = ddp_model_param(m, i);
        memcpy(fp->f + off, p->data, p->count * sizeof(float));
        off += p->count;
    }
    for (i = 0; s->optim && i < ddp_model_num_params(m); i++) {
        size_t c = ddp_model_param(m, i)->count;
        float* st[2];
        st[0] = s->optim->state1[i], st[1] = s->optim->state2[i];
        for (k = 0; k < 2; k++)
            if (st[k]) {
                memcpy(fp->f + off, st[k], c * sizeof(float));
                off += c;
            }
    }
    fp->n = off;
    fp->osteps = s->optim ? ddp_optim_steps(s->optim) : -7;
    fp->sampler_epoch = s->sampler ? s->sampler->epoch : -7;
    fp->resume_pos = s->loader ? s->loader->resume_pos : -7;
    fp->rng = s->rng ? s->rng->state : 7;
    fp->epoch = s->epoch;
    fp->step = s->step;
}
static int fp_equal(const fingerprint* a, const fingerprint* b) {
    return a->n == b->n && !memcmp(a->f, b->f, a->n * sizeof(float)) && a->osteps == b->osteps &&
           a->sampler_epoch == b->sampler_epoch && a->resume_pos == b->resume_pos && a->rng == b->rng &&
           a->epoch == b->epoch && a->step == b->step;
}
/* 1 if s is what fp recorded. */
static int fp_same(const fingerprint* fp, const ddp_snapshot* s) {
    fingerprint now;
    int eq;
    fp_take(&now, s);
    eq = fp_equal(fp, &now);
    free(now.f);
    return eq;
}
static int params_equal(ddp_model* a, ddp_model* b) {
    int i;
    if (ddp_model_num_params(a) != ddp_model_num_params(b)) return 0;
    for (i = 0; i < ddp_model_num_params(a); i++) {
        ddp_param *p = ddp_model_param(a, i), *q = ddp_model_param(b, i);
        if (p->count != q->count || memcmp(p->data, q->data, p->count * sizeof(float))) return 0;
    }
    return 1;
}

/* Load `bytes`, written to tmp/<name>, into s: it must fail with `want`, its message must name
   the file and contain `needle` (NULL: any), and s must be unchanged. Returns 1 if all held. */
static int refused_at(ddp_snapshot* s, const fingerprint* fp, const char* name, const unsigned char* bytes, size_t n,
                      ddp_status want, const char* needle, const char* what, long arg, int line) {
    const char* path = tmp_path(name);
    ddp_status st;
    if (!write_bytes(path, bytes, n)) {
        h_failf(__FILE__, line, "cannot write %s", path);
        return 0;
    }
    ddp__clear_error();
    st = ddp_snapshot_load(s, path);
    if (st != want || !msg_has(path) || (needle && !msg_has(needle)) || !fp_same(fp, s)) {
        h_failf(__FILE__, line, "%s %ld: status %s (expected %s), target %s; message \"%s\" (wanted the path and \"%s\")",
                what, arg, ddp_status_name(st), ddp_status_name(want), fp_same(fp, s) ? "unchanged" : "CHANGED",
                ddp_error_string(), needle ? needle : "");
        return 0;
    }
    return 1;
}
#define REFUSED(s, fp, name, bytes, n, want, needle, what, arg)                                             \
    refused_at(s, fp, name, bytes, n, want, needle, what, (long)(arg), __LINE__)

/* The specs the cases use: a 13 -> 16 -> 3 MLP (wine's shape), its sampler over 50 samples on
   rank 1 of 2, batches of 4; and a small 3 -> 4 -> 2 one for the byte-by-byte cases. */
static const int s_wine[] = {13, 16, 3}, s_wide[] = {13, 17, 3}, s_deep[] = {13, 16, 3, 3};
static const int s_deeper[] = {13, 16, 16, 3}, s_small[] = {3, 4, 2};

static job_spec spec(const int* sizes, int nsizes, uint64_t seed, ddp_optim_kind kind, float momentum) {
    job_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.sizes = sizes, sp.nsizes = nsizes, sp.seed = seed, sp.kind = kind, sp.momentum = momentum;
    sp.n = 50, sp.replicas = 2, sp.rank = 1, sp.sampler_seed = 7, sp.batch = 4;
    return sp;
}

/* Train j for 3 steps, move its sampler to epoch 3 and its loader 2 batches in, draw from its
   generator, set the counters (epoch 3, step 17), and save to path. */
static void job_advance_and_save(job* j, const char* path) {
    ddp_rng data = ddp_rng_seed(42);
    int i;
    for (i = 0; i < 3; i++) train_step(j->model, j->optim, &data, 8);
    ddp_sampler_set_epoch(&j->sampler, 3);
    CHECK_OK(ddp_loader_start(&j->loader, &j->sampler));
    CHECK(ddp_loader_next(&j->loader, NULL, NULL) == 4);
    CHECK(ddp_loader_next(&j->loader, NULL, NULL) == 4);
    CHECK(j->loader.pos == 8);
    j->rng = ddp_rng_seed(99);
    for (i = 0; i < 5; i++) ddp__rng_next(&j->rng);
    j->snap.epoch = 3;
    j->snap.step = 17;
    CHECK_OK(ddp_snapshot_save(&j->snap, path));
}

/* ---- 1. round trips -------------------------------------------------------------------------- */

static const char* meta(const ddp__st* st, const char* key) {
    const char* v = ddp__st_get(st, key);
    return v ? v : "(absent)";
}

/* Save a trained job, load it into a fresh one (another seed), and check that everything came
   back: every float bit for bit, the counters, the loader's next batches, the generator, and
   one more training step giving bit-identical parameters. */
static void roundtrip(ddp_optim_kind kind, float momentum, int want_tensors, const char* optim_name,
                      const char* const* state_names, int nstate) {
    const char* path = tmp_path("roundtrip.safetensors");
    job_spec sa = spec(s_wine, 3, 1, kind, momentum), sb = spec(s_wine, 3, 2, kind, momentum);
    job a, b, c;
    fingerprint fa, fb;
    unsigned char* file = NULL;
    size_t size = 0;
    ddp__st* st = (ddp__st*)calloc(1, sizeof *st);
    int i, k, batches = 0;
    char hex[17];

    job_init(&a, &sa);
    job_init(&b, &sb);
    job_init(&c, &sb);
    if (!a.model || !b.model || !c.model || !a.optim || !b.optim || !c.optim) goto done;
    job_advance_and_save(&a, path);
    CHECK(ddp_optim_steps(a.optim) == 3);

    /* the file: valid safetensors with the documented tensors and metadata */
    file = read_bytes(path, &size);
    CHECK(file && size > 8);
    if (!file) goto done;
    CHECK(get_u64(file) % 8 == 0);
    CHECK_OK(ddp__st_parse(file, size, path, st));
    CHECKF(st->nt == want_tensors, "%d tensors, expected %d", st->nt, want_tensors);
    for (i = 0; i < ddp_model_num_params(a.model); i++) {
        const char* pn = ddp_model_param(a.model, i)->name;
        for (k = -1; k < nstate; k++) {
            char want[96];
            int found = 0, j;
            if (k < 0) snprintf(want, sizeof want, "%s", pn);
            else snprintf(want, sizeof want, "optim.%s.%s", pn, state_names[k]);
            for (j = 0; j < st->nt; j++) found += !strcmp(st->t[j].name, want);
            CHECKF(found == 1, "tensor %s appears %d times", want, found);
        }
    }
    CHECK(!strcmp(meta(st, "format"), "ddp.h snapshot 1"));
    CHECKF(!strcmp(meta(st, "optimizer"), optim_name), "optimizer %s", meta(st, "optimizer"));
    CHECK(!strcmp(meta(st, "optimizer_steps"), "3"));
    CHECK(!strcmp(meta(st, "epoch"), "3") && !strcmp(meta(st, "step"), "17"));
    CHECK(!strcmp(meta(st, "sampler_n"), "50") && !strcmp(meta(st, "sampler_replicas"), "2"));
    CHECK(!strcmp(meta(st, "sampler_seed"), "7") && !strcmp(meta(st, "sampler_epoch"), "3"));
    CHECK(!strcmp(meta(st, "loader_position"), "8"));
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)a.rng.state);
    CHECK(!strcmp(meta(st, "rng"), hex));
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)doc_checksum(file, size));
    CHECKF(!strcmp(meta(st, "checksum"), hex), "checksum %s, FNV-1a of the file gives %s", meta(st, "checksum"), hex);

    /* load into the fresh job: different before, identical after */
    fp_take(&fa, &a.snap);
    fp_take(&fb, &b.snap);
    CHECK(!fp_equal(&fa, &fb));
    CHECK(!params_equal(a.model, b.model));
    free(fb.f);
    CHECK_OK(ddp_snapshot_load(&b.snap, path));
    fp_take(&fb, &b.snap);
    CHECK(fb.n == fa.n && !memcmp(fa.f, fb.f, fa.n * sizeof(float))); /* every parameter and moment */
    CHECK(params_equal(a.model, b.model));
    CHECK(ddp_optim_steps(b.optim) == 3);
    CHECK(b.sampler.epoch == 3);
    CHECK(b.rng.state == a.rng.state);
    CHECK(b.snap.epoch == 3 && b.snap.step == 17);
    free(fa.f);
    free(fb.f);

    /* the loader resumes at the saved position: the same batches as the original from there on */
    CHECK(b.loader.resume_pos == 8);
    CHECK_OK(ddp_loader_start(&b.loader, &b.sampler));
    CHECK(b.loader.pos == 8 && b.loader.resume_pos == 0);
    for (;;) {
        const float *xa = NULL, *xb = NULL;
        const int *ya = NULL, *yb = NULL;
        int na = ddp_loader_next(&a.loader, &xa, &ya), nb = ddp_loader_next(&b.loader, &xb, &yb);
        CHECKF(na == nb, "batch %d: %d samples, the original %d", batches, nb, na);
        if (na != nb || na == 0) break;
        CHECKF(!memcmp(xa, xb, (size_t)na * 13 * sizeof(float)) && !memcmp(ya, yb, (size_t)na * sizeof(int)),
               "batch %d differs from the original's", batches);
        batches++;
    }
    CHECKF(batches == 5, "%d batches after the resume point, expected (25 - 8) / 4 rounded up = 5", batches);
    CHECK_OK(ddp_loader_start(&b.loader, &b.sampler)); /* only the first start resumes */
    CHECK(b.loader.pos == 0);
    CHECK(ddp__rng_next(&a.rng) == ddp__rng_next(&b.rng));

    /* the moments came back: one more step on the same data keeps both copies bit-identical,
       while a copy with the weights but a fresh optimizer (c) drifts off where there is state */
    c.snap.optim = NULL;
    CHECK_OK(ddp_snapshot_load(&c.snap, path)); /* weights only */
    CHECK(params_equal(a.model, c.model) && ddp_optim_steps(c.optim) == 0);
    {
        ddp_rng d1 = ddp_rng_seed(77), d2 = ddp_rng_seed(77), d3 = ddp_rng_seed(77);
        train_step(a.model, a.optim, &d1, 8);
        train_step(b.model, b.optim, &d2, 8);
        train_step(c.model, c.optim, &d3, 8);
    }
    CHECK(params_equal(a.model, b.model));
    if (nstate) CHECK(!params_equal(a.model, c.model)); /* the check above can see lost state */
    else CHECK(params_equal(a.model, c.model));          /* plain SGD has none to lose */
    CHECK(ddp_optim_steps(b.optim) == 4);

done:
    free(st);
    free(file);
    job_free(&a);
    job_free(&b);
    job_free(&c);
}

static void test_roundtrip_adam(void) {
    static const char* const names[] = {"exp_avg", "exp_avg_sq"};
    roundtrip(DDP_ADAM, 0.f, 12, "adam", names, 2);
}
static void test_roundtrip_adamw(void) {
    static const char* const names[] = {"exp_avg", "exp_avg_sq"};
    roundtrip(DDP_ADAMW, 0.f, 12, "adamw", names, 2);
}
static void test_roundtrip_sgd_momentum(void) {
    static const char* const names[] = {"momentum_buffer"};
    roundtrip(DDP_SGD, 0.9f, 8, "sgd", names, 1);
}
static void test_roundtrip_sgd_plain(void) { roundtrip(DDP_SGD, 0.f, 4, "sgd", NULL, 0); }

/* Only what the struct points to is saved and loaded; the rest of the struct is optional. */
static void test_roundtrip_model_only(void) {
    const char* path = tmp_path("model_only.safetensors");
    ddp_model *a = make_mlp(s_wine, 3, 1), *b = make_mlp(s_wine, 3, 2);
    ddp_snapshot sa, sb;
    unsigned char* file = NULL;
    size_t size = 0;
    ddp__st* st = (ddp__st*)calloc(1, sizeof *st);
    if (!a || !b) goto done;
    memset(&sa, 0, sizeof sa);
    memset(&sb, 0, sizeof sb);
    sa.model = a, sa.epoch = -3, sa.step = 1234567890123L;
    sb.model = b;
    CHECK_OK(ddp_snapshot_save(&sa, path));
    file = read_bytes(path, &size);
    CHECK(file && ddp__st_parse(file, size, path, st) == DDP_OK);
    CHECK(st->nt == 4 && !strcmp(meta(st, "optimizer"), "none") && !ddp__st_get(st, "sampler_n") &&
          !ddp__st_get(st, "loader_position") && !ddp__st_get(st, "rng"));
    CHECK(!params_equal(a, b));
    CHECK_OK(ddp_snapshot_load(&sb, path));
    CHECK(params_equal(a, b));
    CHECK(sb.epoch == -3 && sb.step == 1234567890123L);
done:
    free(st);
    free(file);
    ddp_model_destroy(a);
    ddp_model_destroy(b);
}

/* ---- 2. optimizer mismatches ----------------------------------------------------------------- */

static void test_optimizer_mismatch(void) {
    const char *p_none = tmp_path("none.safetensors"), *p_adam = tmp_path("adam.safetensors");
    const char *p_sgdm = tmp_path("sgdm.safetensors"), *p_sgd = tmp_path("sgd.safetensors");
    job_spec s_none = spec(s_wine, 3, 1, DDP_ADAM, 0.f);
    job_spec s_adam = spec(s_wine, 3, 1, DDP_ADAM, 0.f), s_adamw = spec(s_wine, 3, 3, DDP_ADAMW, 0.f);
    job_spec s_sgdm = spec(s_wine, 3, 1, DDP_SGD, 0.9f), s_sgd = spec(s_wine, 3, 1, DDP_SGD, 0.f);
    job none, adam, sgdm, sgd, t_adam, t_adamw, t_sgd, t_sgdm, t_free;
    fingerprint fp;
    s_none.no_optim = 1;
    job_init(&none, &s_none);
    job_init(&adam, &s_adam);
    job_init(&sgdm, &s_sgdm);
    job_init(&sgd, &s_sgd);
    job_advance_and_save(&none, p_none);
    job_advance_and_save(&adam, p_adam);
    job_advance_and_save(&sgdm, p_sgdm);
    job_advance_and_save(&sgd, p_sgd);
    s_adam.seed = s_sgd.seed = s_sgdm.seed = 3;
    job_init(&t_adam, &s_adam);
    job_init(&t_adamw, &s_adamw);
    job_init(&t_sgd, &s_sgd);
    job_init(&t_sgdm, &s_sgdm);

#define MISMATCH(target, path, needle)                                                                     \
    do {                                                                                                   \
        fp_take(&fp, &(target).snap);                                                                      \
        CHECK_FAILS(ddp_snapshot_load(&(target).snap, path), DDP_ERR_CHECKPOINT, needle);                  \
        CHECKF(msg_has(path), "message \"%s\" lacks the path", ddp_error_string());                       \
        CHECKF(fp_same(&fp, &(target).snap), "a refused load changed the target");                        \
        free(fp.f);                                                                                        \
    } while (0)
    /* without optimizer state into a struct with an optimizer */
    MISMATCH(t_adam, p_none, "holds no optimizer state, but the optimizer is adam");
    MISMATCH(t_sgd, p_none, "holds no optimizer state, but the optimizer is sgd");
    /* another kind of optimizer */
    MISMATCH(t_sgd, p_adam, "holds adam state, but the optimizer is sgd");
    MISMATCH(t_sgdm, p_adam, "holds adam state, but the optimizer is sgd");
    MISMATCH(t_adamw, p_adam, "holds adam state, but the optimizer is adamw");
    MISMATCH(t_adam, p_sgdm, "holds sgd state, but the optimizer is adam");
    /* SGD with and without momentum: the buffers are there or not */
    MISMATCH(t_sgd, p_sgdm, "optim.fc1.weight.momentum_buffer\", which this model's optimizer does not have");
    MISMATCH(t_sgdm, p_sgd, "has no tensor \"optim.fc1.weight.momentum_buffer\"");
#undef MISMATCH

    /* a struct without an optimizer takes the weights (and counters) of any of them */
    {
        const char* paths[4];
        int i;
        paths[0] = p_none, paths[1] = p_adam, paths[2] = p_sgdm, paths[3] = p_sgd;
        for (i = 0; i < 4; i++) {
            job_spec s_f = spec(s_wine, 3, 5, DDP_ADAM, 0.f);
            s_f.no_optim = 1;
            job_init(&t_free, &s_f);
            CHECK(!params_equal(t_free.model, adam.model));
            CHECK_OK(ddp_snapshot_load(&t_free.snap, paths[i]));
            CHECKF(params_equal(t_free.model, i == 0 ? none.model : i == 1 ? adam.model : i == 2 ? sgdm.model : sgd.model),
                   "weights of %s", paths[i]);
            CHECK(t_free.snap.epoch == 3 && t_free.snap.step == 17 && t_free.sampler.epoch == 3);
            job_free(&t_free);
        }
        /* and so does a struct with an optimizer of the same kind left out */
        t_adam.snap.optim = NULL;
        CHECK_OK(ddp_snapshot_load(&t_adam.snap, p_adam));
        CHECK(params_equal(t_adam.model, adam.model) && ddp_optim_steps(t_adam.optim) == 0);
    }
    job_free(&none);
    job_free(&adam);
    job_free(&sgdm);
    job_free(&sgd);
    job_free(&t_adam);
    job_free(&t_adamw);
    job_free(&t_sgd);
    job_free(&t_sgdm);
}

/* ---- 3. damaged files --------------------------------------------------------------------------- */

/* A small snapshot (3 -> 4 -> 2 with Adam, sampler, loader, generator) and a target job with
   other weights to load it into. */
typedef struct small_case {
    job src, dst;
    unsigned char* file;
    size_t size;
    fingerprint fp; /* the target as it was */
} small_case;

static int small_setup(small_case* sc) {
    job_spec sp = spec(s_small, 3, 1, DDP_ADAM, 0.f);
    memset(sc, 0, sizeof *sc);
    job_init(&sc->src, &sp);
    sp.seed = 2;
    job_init(&sc->dst, &sp);
    if (!sc->src.model || !sc->dst.model) return 0;
    job_advance_and_save(&sc->src, tmp_path("small.safetensors"));
    sc->file = read_bytes(tmp_path("small.safetensors"), &sc->size);
    if (!sc->file || sc->size < 64) return 0;
    fp_take(&sc->fp, &sc->dst.snap);
    return 1;
}
static void small_free(small_case* sc) {
    free(sc->file);
    free(sc->fp.f);
    job_free(&sc->src);
    job_free(&sc->dst);
}

static void test_flipped_bits(void) {
    small_case sc;
    unsigned char* buf;
    size_t off, hdr_end, tried = 0, in_data = 0;
    int fails = 0, masks[2] = {0x01, 0x80}, m;
    if (H_TSAN) SKIP("one thread reading damaged files: make test and make sanitize run it; TSan looks for races");
    if (!small_setup(&sc)) {
        CHECKF(0, "setting up the small snapshot failed");
        small_free(&sc);
        return;
    }
    hdr_end = 8 + (size_t)get_u64(sc.file);
    buf = (unsigned char*)malloc(sc.size);
    for (m = 0; m < 2; m++)
        for (off = 0; off < sc.size && fails < 5; off++) {
            memcpy(buf, sc.file, sc.size);
            buf[off] ^= (unsigned char)masks[m];
            /* a flipped bit in the data can only be the checksum's to catch */
            fails += !REFUSED(&sc.dst.snap, &sc.fp, "flipped.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT,
                              off >= hdr_end ? "checksum" : NULL, masks[m] == 1 ? "bit 0 flipped at byte" : "bit 7 flipped at byte",
                              off);
            tried++;
            in_data += off >= hdr_end;
        }
    CHECKF(tried == 2 * sc.size, "tried %zu flips, expected %zu", tried, 2 * sc.size);
    printf("    %zu single-bit flips (bits 0 and 7 of each of the %zu bytes, %zu in the data) refused\n", tried,
           sc.size, in_data);
    /* the untouched file still loads */
    CHECK_OK(ddp_snapshot_load(&sc.dst.snap, tmp_path("small.safetensors")));
    CHECK(params_equal(sc.dst.model, sc.src.model));
    free(buf);
    small_free(&sc);
}

static void test_truncated_and_extended(void) {
    small_case sc;
    unsigned char* buf;
    size_t len, hlen;
    int fails = 0;
    if (H_TSAN) SKIP("one thread reading damaged files: make test and make sanitize run it; TSan looks for races");
    if (!small_setup(&sc)) {
        CHECKF(0, "setting up the small snapshot failed");
        small_free(&sc);
        return;
    }
    hlen = (size_t)get_u64(sc.file);
    /* every length short of the whole file: the length field, the JSON, the data. An empty file
       reads fine and is refused by the parser, so 0 bytes is DDP_ERR_CHECKPOINT too. */
    for (len = 0; len < sc.size && fails < 5; len++)
        fails += !REFUSED(&sc.dst.snap, &sc.fp, "cut.safetensors", sc.file, len, DDP_ERR_CHECKPOINT, "truncated",
                          "truncated to", len);
    printf("    %zu truncations (0 .. %zu bytes; the header is bytes 8 .. %zu) refused\n", len, sc.size - 1, 8 + hlen);
    CHECK(len == sc.size);

    buf = (unsigned char*)malloc(sc.size + 64);
    /* header lengths that do not fit: the file's size, 0, 2^63, and all the rest of the file */
    memcpy(buf, sc.file, sc.size);
    put_u64(buf, sc.size);
    REFUSED(&sc.dst.snap, &sc.fp, "hlen.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT, "does not fit", "hlen", sc.size);
    put_u64(buf, 0);
    REFUSED(&sc.dst.snap, &sc.fp, "hlen.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT, "header length 0 does not fit",
            "hlen", 0);
    put_u64(buf, (uint64_t)1 << 63);
    REFUSED(&sc.dst.snap, &sc.fp, "hlen.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT,
            "header length 9223372036854775808 does not fit", "hlen", -1);
    put_u64(buf, ~(uint64_t)0);
    REFUSED(&sc.dst.snap, &sc.fp, "hlen.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT, "does not fit", "hlen", -2);
    put_u64(buf, sc.size - 8); /* the data read as header: not spaces after the JSON */
    REFUSED(&sc.dst.snap, &sc.fp, "hlen.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT, "bytes other than spaces",
            "hlen", sc.size - 8);
    put_u64(buf, hlen - 8); /* the JSON cut short */
    REFUSED(&sc.dst.snap, &sc.fp, "hlen.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT, "the header is damaged",
            "hlen", hlen - 8);
    put_u64(buf, hlen + 8); /* eight bytes of data read as header */
    REFUSED(&sc.dst.snap, &sc.fp, "hlen.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT, "the header is damaged",
            "hlen", hlen + 8);

    /* extra bytes after the data */
    memcpy(buf, sc.file, sc.size);
    memset(buf + sc.size, 0, 64);
    REFUSED(&sc.dst.snap, &sc.fp, "long.safetensors", buf, sc.size + 1, DDP_ERR_CHECKPOINT, "extra bytes", "appended", 1);
    REFUSED(&sc.dst.snap, &sc.fp, "long.safetensors", buf, sc.size + 8, DDP_ERR_CHECKPOINT, "extra bytes", "appended", 8);
    memset(buf + sc.size, ' ', 64);
    REFUSED(&sc.dst.snap, &sc.fp, "long.safetensors", buf, sc.size + 64, DDP_ERR_CHECKPOINT, "extra bytes", "appended", 64);
    free(buf);
    small_free(&sc);
}

/* Edits with a recomputed checksum reach the checks behind it; a legal one loads, which also
   proves the checksum is the documented FNV-1a with its digits zeroed. */
static void test_edited_with_valid_checksum(void) {
    small_case sc;
    unsigned char* buf;
    size_t n;
    int i;
    static const struct { const char *from, *to, *needle; } edits[] = {
        {"\"dtype\":\"F32\"", "\"dtype\":\"F16\"", "has dtype F16; ddp.h snapshots hold F32 only"},
        {"\"format\":\"ddp.h snapshot 1\"", "\"format\":\"ddp.h snapshot 2\"", "not a ddp.h snapshot"},
        {"\"optimizer\":\"adam\"", "\"optimizer\":\"adax\"", "metadata \"optimizer\" is adax"},
        {"\"epoch\":\"3\"", "\"epoch\":\"x\"", "metadata \"epoch\" is \"x\", not a number"},
        {"\"step\":\"17\"", "\"step\":\"1 \"", "metadata \"step\" is \"1 \", not a number"},
        {"\"optimizer_steps\":\"3\"", "\"optimizer_steps\":\"-\"", "metadata \"optimizer_steps\" is \"-\""},
        {"\"loader_position\":\"8\"", "\"loader_position\":\"z\"", "metadata \"loader_position\" is \"z\""},
        {"\"sampler_epoch\":\"3\"", "\"sampler_epoch\":\"?\"", "metadata \"sampler_epoch\" is \"?\""},
        {"\"sampler_n\":\"50\"", "\"sampler_n\":\"51\"", "over 51 samples"},
        {"\"sampler_seed\":\"7\"", "\"sampler_seed\":\"8\"", "seed 8"},
        {"\"sampler_shuffle\":\"1\"", "\"sampler_shuffle\":\"0\"", "shuffle 0"},
        {"\"rng\":\"", "\"rnx\":\"", "the metadata lacks \"rng\""},
        {"\"fc1.weight\":{", "\"fc9.weight\":{", "has no tensor \"fc1.weight\""},
        {"\"shape\":[4,3]", "\"shape\":[3,4]", "fc1.weight has shape [3, 4], the model's is [4, 3]"},
        {"\"shape\":[4,3]", "\"shape\":[4,4]", "do not hold its shape's"},
        {"\"data_offsets\":[0,", "\"data_offsets\":[8,", "do not hold its shape's"},
        {"\"checksum\":", "\"checksuM\":", "lacks its 16-digit \"checksum\""},
    };
    if (!small_setup(&sc)) {
        CHECKF(0, "setting up the small snapshot failed");
        small_free(&sc);
        return;
    }
    buf = (unsigned char*)malloc(sc.size + 64);
    n = sc.size;
    /* the checksum as documented */
    {
        char hex[17];
        size_t at = checksum_pos(sc.file, n);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)doc_checksum(sc.file, n));
        CHECKF(at && !memcmp(sc.file + at, hex, 16), "the file's checksum is not FNV-1a-64 of it with the digits zeroed");
    }
    /* a legal edit: epoch 3 -> 4, step 17 -> 18 */
    memcpy(buf, sc.file, n);
    CHECK(edit_header(buf, n, "\"epoch\":\"3\"", "\"epoch\":\"4\"") && edit_header(buf, n, "\"step\":\"17\"", "\"step\":\"18\""));
    REFUSED(&sc.dst.snap, &sc.fp, "edited.safetensors", buf, n, DDP_ERR_CHECKPOINT, "checksum", "unhashed edit", 0);
    rehash(buf, n);
    CHECK(write_bytes(tmp_path("edited.safetensors"), buf, n));
    CHECK_OK(ddp_snapshot_load(&sc.dst.snap, tmp_path("edited.safetensors")));
    CHECK(sc.dst.snap.epoch == 4 && sc.dst.snap.step == 18 && params_equal(sc.dst.model, sc.src.model));
    free(sc.fp.f);
    fp_take(&sc.fp, &sc.dst.snap); /* the target as loaded; every edit below must leave it so */
    /* the checksum is lowercase hex: the same digits in capitals are refused */
    memcpy(buf, sc.file, n);
    {
        size_t at = checksum_pos(buf, n), k;
        int changed = 0;
        for (k = at; k < at + 16; k++)
            if (buf[k] >= 'a' && buf[k] <= 'f') buf[k] = (unsigned char)(buf[k] - 'a' + 'A'), changed = 1;
        if (changed)
            REFUSED(&sc.dst.snap, &sc.fp, "edited.safetensors", buf, n, DDP_ERR_CHECKPOINT, "checksum", "capitals", 0);
    }
    for (i = 0; i < (int)(sizeof edits / sizeof edits[0]); i++) {
        memcpy(buf, sc.file, n);
        CHECKF(edit_header(buf, n, edits[i].from, edits[i].to), "edit %d: no %s in the header", i, edits[i].from);
        rehash(buf, n);
        REFUSED(&sc.dst.snap, &sc.fp, "edited.safetensors", buf, n, DDP_ERR_CHECKPOINT, edits[i].needle, "edit", i);
    }
    free(buf);
    small_free(&sc);
}

/* Where tensor `name`'s data begins in a snapshot's bytes (its data_offsets' first number after
   the header); 0 when the header does not name it. */
static size_t tensor_data_at(const unsigned char* b, size_t n, const char* name) {
    char key[128];
    const char *h = (const char*)b + 8, *t, *o;
    size_t hlen = (size_t)get_u64(b);
    if (n < 8 || hlen > n - 8) return 0;
    snprintf(key, sizeof key, "\"%s\":{", name);
    t = strstr(h, key);
    if (!t || t >= h + hlen || !(o = strstr(t, "\"data_offsets\":["))) return 0;
    return 8 + hlen + (size_t)strtoull(o + strlen("\"data_offsets\":["), NULL, 10);
}

/* A NaN or an infinity in a weight or in the optimizer's state, or a second moment below zero,
   under a recomputed checksum (the file is whole; the run that wrote it was not): refused, naming
   the tensor and the element, and the target left as it was. */
static void test_non_finite_numbers_refused(void) {
    static const struct { const char *tensor, *needle; int at; float v; } bad[] = {
        {"fc1.weight", "fc1.weight[5] is nan", 5, 0.f},
        {"optim.fc2.bias.exp_avg", "optim.fc2.bias.exp_avg[0] is inf", 0, 1.f},
        {"optim.fc1.weight.exp_avg_sq", "optim.fc1.weight.exp_avg_sq[2] is -1 (a second moment below zero)", 2, -1.f},
    };
    small_case sc;
    unsigned char* buf;
    int i;
    if (!small_setup(&sc)) {
        CHECKF(0, "setting up the small snapshot failed");
        small_free(&sc);
        return;
    }
    buf = (unsigned char*)malloc(sc.size);
    for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        size_t at = tensor_data_at(sc.file, sc.size, bad[i].tensor);
        float v = i == 0 ? (float)NAN : i == 1 ? (float)INFINITY : bad[i].v;
        CHECKF(at > 0, "no tensor %s in the header", bad[i].tensor);
        if (!at) continue;
        memcpy(buf, sc.file, sc.size);
        memcpy(buf + at + (size_t)bad[i].at * sizeof v, &v, sizeof v);
        rehash(buf, sc.size);
        REFUSED(&sc.dst.snap, &sc.fp, "nonfinite.safetensors", buf, sc.size, DDP_ERR_CHECKPOINT, bad[i].needle,
                "non-finite", i);
    }
    free(buf);
    small_free(&sc);
}

/* ---- 4. foreign files ------------------------------------------------------------------------- */

static void test_other_models(void) {
    const char* path = tmp_path("wine.safetensors");
    job_spec sp = spec(s_wine, 3, 1, DDP_ADAM, 0.f);
    job src, wide, deep, deeper;
    fingerprint fp;
    job_init(&src, &sp);
    job_advance_and_save(&src, path);
    sp.seed = 2;
    sp.sizes = s_wide;
    job_init(&wide, &sp);
    sp.sizes = s_deep, sp.nsizes = 4;
    job_init(&deep, &sp);
    sp.sizes = s_deeper;
    job_init(&deeper, &sp);

#define FOREIGN(target, file, needle)                                                                      \
    do {                                                                                                   \
        fp_take(&fp, &(target).snap);                                                                      \
        CHECK_FAILS(ddp_snapshot_load(&(target).snap, file), DDP_ERR_CHECKPOINT, needle);                  \
        CHECKF(msg_has(file), "message \"%s\" lacks the path", ddp_error_string());                       \
        CHECKF(fp_same(&fp, &(target).snap), "a refused load changed the target");                        \
        free(fp.f);                                                                                        \
    } while (0)
    /* another hidden width: the first tensor that differs, with both shapes */
    FOREIGN(wide, path, "fc1.weight has shape [16, 13], the model's is [17, 13]");
    /* one layer more: a tensor the file lacks */
    FOREIGN(deep, path, "has no tensor \"fc3.weight\"");
    /* a wider second layer: shapes again */
    FOREIGN(deeper, path, "fc2.weight has shape [3, 16], the model's is [16, 16]");
    /* one layer fewer: a tensor the model lacks (the deep model's file into the wine model) */
    CHECK_OK(ddp_snapshot_save(&deep.snap, tmp_path("deep.safetensors")));
    sp.sizes = s_wine, sp.nsizes = 3, sp.seed = 9;
    {
        job small;
        job_init(&small, &sp);
        FOREIGN(small, tmp_path("deep.safetensors"), "holds tensor \"fc3.weight\", which this model does not have");
        small.snap.optim = NULL; /* the optimizer's state of fc3 is ignored then, but not fc3 itself */
        FOREIGN(small, tmp_path("deep.safetensors"), "holds tensor \"fc3.weight\"");
        job_free(&small);
    }
#undef FOREIGN
    job_free(&src);
    job_free(&wide);
    job_free(&deep);
    job_free(&deeper);
}

static void test_sampler_and_loader_mismatch(void) {
    const char *mid = tmp_path("mid.safetensors"), *start = tmp_path("start.safetensors");
    const char *bare = tmp_path("bare.safetensors");
    job_spec sp = spec(s_wine, 3, 1, DDP_ADAM, 0.f);
    job src, t;
    fingerprint fp;
    job_init(&src, &sp);
    job_advance_and_save(&src, mid); /* epoch 3, 8 samples into it */
    CHECK_OK(ddp_loader_start(&src.loader, &src.sampler));
    CHECK(src.loader.pos == 0);
    CHECK_OK(ddp_snapshot_save(&src.snap, start)); /* epoch 3, at its start */
    {
        ddp_snapshot b = src.snap;
        b.sampler = NULL, b.loader = NULL, b.rng = NULL;
        CHECK_OK(ddp_snapshot_save(&b, bare));
    }

#define TARGET(field, value) (sp = spec(s_wine, 3, 2, DDP_ADAM, 0.f), sp.field = (value), job_init(&t, &sp))
#define SAMPLER_REFUSED(file, needle)                                                                      \
    do {                                                                                                   \
        fp_take(&fp, &t.snap);                                                                             \
        CHECK_FAILS(ddp_snapshot_load(&t.snap, file), DDP_ERR_CHECKPOINT, needle);                         \
        CHECKF(msg_has(file), "message \"%s\" lacks the path", ddp_error_string());                       \
        CHECKF(fp_same(&fp, &t.snap), "a refused load changed the target");                               \
        free(fp.f);                                                                                        \
        job_free(&t);                                                                                      \
    } while (0)
    TARGET(n, 40);
    SAMPLER_REFUSED(mid, "was taken with a sampler over 50 samples");
    TARGET(n, 40);
    SAMPLER_REFUSED(start, "this one is over 40");
    TARGET(sampler_seed, 8);
    SAMPLER_REFUSED(mid, "seed 7); this one is over 50 (shuffle 1, drop_last 0, seed 8)");
    /* another number of ranks: refused always (each rank's share of the data would differ), in the
       middle of an epoch and at its start, with the loader and without it; one rank is "1 rank" */
    TARGET(replicas, 4);
    SAMPLER_REFUSED(mid, "was taken by a job of 2 ranks; this job has 4 ranks");
    TARGET(replicas, 3);
    SAMPLER_REFUSED(start, "was taken by a job of 2 ranks; this job has 3 ranks");
    TARGET(replicas, 3);
    t.snap.loader = NULL;
    SAMPLER_REFUSED(start, "Resume with 2 ranks, or leave snap.sampler and snap.loader NULL");
    sp = spec(s_wine, 3, 2, DDP_ADAM, 0.f), sp.replicas = 1, sp.rank = 0, job_init(&t, &sp);
    t.snap.loader = NULL;
    SAMPLER_REFUSED(start, "this job has 1 rank, so");
    {
        const char* alone = tmp_path("alone.safetensors");
        job one;
        sp = spec(s_wine, 3, 1, DDP_ADAM, 0.f), sp.replicas = 1, sp.rank = 0, job_init(&one, &sp);
        one.snap.loader = NULL;
        CHECK_OK(ddp_snapshot_save(&one.snap, alone)); /* a 1-process run's epoch-end snapshot */
        job_free(&one);
        TARGET(replicas, 2);
        t.snap.loader = NULL;
        SAMPLER_REFUSED(alone, "was taken by a job of 1 rank; this job has 2 ranks");
    }
    /* the way out the message names: without sampler and loader the rest loads */
    TARGET(replicas, 3);
    t.snap.sampler = NULL, t.snap.loader = NULL;
    CHECK_OK(ddp_snapshot_load(&t.snap, start));
    CHECK(params_equal(t.model, src.model) && t.sampler.num_replicas == 3);
    job_free(&t);
    /* the struct asks for what the file lacks */
    TARGET(replicas, 2);
    SAMPLER_REFUSED(bare, "the metadata lacks \"sampler_n\"");
    TARGET(replicas, 2);
    t.snap.sampler = NULL;
    SAMPLER_REFUSED(bare, "the metadata lacks \"loader_position\"");
    TARGET(replicas, 2);
    t.snap.sampler = NULL, t.snap.loader = NULL;
    SAMPLER_REFUSED(bare, "the metadata lacks \"rng\"");
    /* an uninitialised loader is a programming error, found before the file is read */
    TARGET(replicas, 2);
    ddp_loader_free(&t.loader);
    CHECK_FAILS(ddp_snapshot_load(&t.snap, mid), DDP_ERR_INVALID_ARGUMENT, "ddp_loader_init");
    job_free(&t);
#undef TARGET
#undef SAMPLER_REFUSED
    job_free(&src);
}

/* ---- resuming ends where an uninterrupted run ends ------------------------------------------------ */

/* A training program in chapter 6's shape over a job: epochs 1..epochs, each through the sampler
   and the loader, one optimizer step per batch. It saves once and stops there, as a killed job
   would, when it reaches `stop`:
     STOP_IN_LOOP      after global step `at`, inside the batch loop, naming the epoch it is in
                       (snap.epoch = epoch, as examples/ch06_fault_tolerance.c does);
     STOP_AFTER_EPOCH  after epoch `at`'s last batch, outside the loop, naming the next epoch
                       (snap.epoch = epoch + 1: "the epoch saved is the next epoch to run").
   With `resume` it first loads the file and carries on from snap.epoch. Returns how many epochs
   it ran without a single batch (an epoch the resumed run skipped shows here). */
enum { STOP_NEVER, STOP_IN_LOOP, STOP_AFTER_EPOCH };
static int train_program(job* j, int epochs, int stop, int at, const char* path, int resume) {
    int epoch, first = 1, empty = 0;
    long step = 0;
    if (resume) {
        CHECK_OK(ddp_snapshot_load(&j->snap, path));
        first = j->snap.epoch, step = j->snap.step;
    }
    for (epoch = first; epoch <= epochs; epoch++) {
        const float* x;
        const int* y;
        int n, seen = 0;
        ddp_sampler_set_epoch(&j->sampler, epoch);
        CHECK_OK(ddp_loader_start(&j->loader, &j->sampler));
        while ((n = ddp_loader_next(&j->loader, &x, &y)) > 0) {
            float loss;
            CHECK_OK(ddp_model_zero_grad(j->model));
            CHECK_OK(ddp_model_forward(j->model, x, n));
            CHECK_OK(ddp_loss_cross_entropy(j->model, y, &loss));
            CHECK_OK(ddp_model_backward(j->model));
            CHECK_OK(ddp_optim_step(j->optim));
            seen += n, step++;
            if (stop == STOP_IN_LOOP && step == at) {
                j->snap.epoch = epoch, j->snap.step = step;
                CHECK_OK(ddp_snapshot_save(&j->snap, path));
                return empty;
            }
        }
        empty += seen == 0;
        if (stop == STOP_AFTER_EPOCH && epoch == at) {
            j->snap.epoch = epoch + 1, j->snap.step = step;
            CHECK_OK(ddp_snapshot_save(&j->snap, path));
            return empty;
        }
    }
    return empty;
}

static int params_differing(ddp_model* a, ddp_model* b, int* total) {
    int i, n = 0;
    size_t k;
    *total = 0;
    for (i = 0; i < ddp_model_num_params(a); i++) {
        ddp_param *p = ddp_model_param(a, i), *q = ddp_model_param(b, i);
        for (k = 0; k < p->count; k++) n += memcmp(&p->data[k], &q->data[k], sizeof(float)) != 0;
        *total += (int)p->count;
    }
    return n;
}

static char g_warned[2048];
static void keep_warning(ddp_log_level level, const char* line, void* user) {
    (void)user;
    if (level == DDP_LOG_WARN) snprintf(g_warned, sizeof g_warned, "%s", line);
}

/* Train a job of spec sp to global step `at` and save there (inside the loop); load the file into
   a fresh job of spec other and start its loader at the next epoch. Returns where the loader
   starts; the warning it logged, if any, is in g_warned. */
static int resumed_at_next_epoch(const job_spec* sp, const job_spec* other, int at, const char* path) {
    job a, b;
    int pos;
    job_init(&a, sp);
    train_program(&a, 4, STOP_IN_LOOP, at, path, 0);
    job_init(&b, other);
    CHECK_OK(ddp_snapshot_load(&b.snap, path));
    ddp_sampler_set_epoch(&b.sampler, b.snap.epoch + 1);
    g_warned[0] = 0;
    ddp__set_log(keep_warning, NULL);
    CHECK_OK(ddp_loader_start(&b.loader, &b.sampler));
    ddp__set_log(NULL, NULL);
    pos = b.loader.pos;
    job_free(&a);
    job_free(&b);
    return pos;
}

/* Killed after a save and resumed, a run ends bit for bit where the uninterrupted run ends: saved
   in the middle of an epoch or at its end, inside the batch loop or after it, with the loader in
   the snapshot and (saving at an epoch's end) without it. Rank 1 of 2 over 50 samples, batches of
   4: 25 samples and 7 batches an epoch, so epoch 2 holds steps 8 to 14. */
static void test_resume_matches_uninterrupted(void) {
    static const struct {
        const char* what;
        int stop, at, loader, empty;
    } cases[] = {
        {"saved at step 10 (mid-epoch 2), loader attached", STOP_IN_LOOP, 10, 1, 0},
        {"saved at step 14 (epoch 2's last batch) inside the loop, loader attached", STOP_IN_LOOP, 14, 1, 1},
        {"saved after epoch 2 naming epoch 3, loader attached", STOP_AFTER_EPOCH, 2, 1, 0},
        {"saved after epoch 2 naming epoch 3, no loader", STOP_AFTER_EPOCH, 2, 0, 0},
        {"saved after epoch 1 naming epoch 2, loader attached", STOP_AFTER_EPOCH, 1, 1, 0},
    };
    const char* path = tmp_path("resume.safetensors");
    job_spec sp = spec(s_wine, 3, 1, DDP_ADAM, 0.f), other = spec(s_wine, 3, 2, DDP_ADAM, 0.f);
    job ref, a, b;
    size_t i;
    int total, diff;
    job_init(&ref, &sp);
    CHECK(train_program(&ref, 4, STOP_NEVER, 0, NULL, 0) == 0);
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int empty;
        job_init(&a, &sp);
        job_init(&b, &other); /* another model seed: only the load can make it match */
        if (!cases[i].loader) a.snap.loader = NULL, b.snap.loader = NULL;
        train_program(&a, 4, cases[i].stop, cases[i].at, path, 0);
        empty = train_program(&b, 4, STOP_NEVER, 0, path, 1);
        diff = params_differing(ref.model, b.model, &total);
        CHECKF(diff == 0, "%s: the resumed run's weights differ from the uninterrupted run's in %d of %d", cases[i].what,
               diff, total);
        CHECKF(empty == cases[i].empty, "%s: the resumed run ran %d epoch%s without a batch, expected %d",
               cases[i].what, empty, empty == 1 ? "" : "s", cases[i].empty);
        job_free(&a);
        job_free(&b);
    }
    /* A mid-epoch position and a program that resumes at the next epoch: that epoch starts at its
       first batch, and the warning names what is skipped; an epoch-end position goes silently. */
    CHECK(resumed_at_next_epoch(&sp, &other, 10, path) == 0); /* epoch 2, 3 batches (12 samples) in */
    CHECKF(strstr(g_warned, "the snapshot was taken 12 samples into epoch 2 (of 25 on this rank), but the sampler is "
                            "at epoch 3: epoch 3 starts at its first batch, and the last 13 samples of epoch 2 are "
                            "skipped") != NULL, "warning: \"%s\"", g_warned);
    CHECK(resumed_at_next_epoch(&sp, &other, 14, path) == 0); /* epoch 2, all 25 samples in */
    CHECKF(!g_warned[0], "an unexpected warning: \"%s\"", g_warned);
    job_free(&ref);
}

static void test_not_a_snapshot(void) {
    const char* path = tmp_path("plain.safetensors");
    ddp__st* st = (ddp__st*)calloc(1, sizeof *st);
    job_spec sp = spec(s_wine, 3, 2, DDP_ADAM, 0.f);
    job t;
    fingerprint fp;
    unsigned char file[512];
    size_t n;
    float w[2] = {1.5f, -2.f};
    static const char* const headers[] = {
        /* valid safetensors as Python's safetensors writes it, with user metadata and no format */
        "{\"__metadata__\":{\"note\":\"hand made\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        /* no metadata at all */
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        /* the format of a later version */
        "{\"__metadata__\":{\"format\":\"ddp.h snapshot 2\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
    };
    static const char* const needles[] = {"(metadata \"format\" is missing)", "(metadata \"format\" is missing)",
                                          "(metadata \"format\" is \"ddp.h snapshot 2\")"};
    int i;
    job_init(&t, &sp);
    for (i = 0; i < 3; i++) {
        size_t h = strlen(headers[i]), padded = (h + 7) / 8 * 8;
        put_u64(file, padded);
        memcpy(file + 8, headers[i], h);
        memset(file + 8 + h, ' ', padded - h);
        memcpy(file + 8 + padded, w, 8);
        n = 8 + padded + 8;
        CHECK(write_bytes(path, file, n));
        CHECKF(ddp__st_parse(file, n, path, st) == DDP_OK && st->nt == 1, "file %d is not valid safetensors: %s", i,
               ddp_error_string());
        fp_take(&fp, &t.snap);
        CHECK_FAILS(ddp_snapshot_load(&t.snap, path), DDP_ERR_CHECKPOINT, "is a safetensors file but not a ddp.h snapshot");
        CHECKF(msg_has(path) && msg_has(needles[i]), "file %d: message \"%s\"", i, ddp_error_string());
        CHECK(fp_same(&fp, &t.snap));
        free(fp.f);
    }
    /* a text file: its first 8 bytes read as a huge header length */
    fp_take(&fp, &t.snap);
    CHECK_FAILS(ddp_snapshot_load(&t.snap, "examples/data/wine.csv"), DDP_ERR_CHECKPOINT,
                "examples/data/wine.csv is truncated or not a snapshot: its header length");
    CHECK(fp_same(&fp, &t.snap));
    free(fp.f);
    job_free(&t);
    free(st);
}

static void test_missing_file(void) {
    job_spec sp = spec(s_wine, 3, 2, DDP_ADAM, 0.f);
    job t;
    fingerprint fp;
    const char* path = tmp_path("absent.safetensors");
    job_init(&t, &sp);
    fp_take(&fp, &t.snap);
    CHECK_FAILS(ddp_snapshot_load(&t.snap, path), DDP_ERR_IO, path);
    CHECKF(msg_has(strerror(ENOENT)), "message \"%s\" lacks \"%s\"", ddp_error_string(), strerror(ENOENT));
    CHECK(mkdir(tmp_path("a_folder"), 0700) == 0);
    CHECK_FAILS(ddp_snapshot_load(&t.snap, tmp_path("a_folder")), DDP_ERR_IO, "is not a regular file");
    CHECK(msg_has(tmp_path("a_folder")));
    CHECK(fp_same(&fp, &t.snap));
    CHECK(rmdir(tmp_path("a_folder")) == 0);
    /* NULL arguments */
    CHECK_FAILS(ddp_snapshot_load(&t.snap, NULL), DDP_ERR_INVALID_ARGUMENT, "path is NULL");
    CHECK_FAILS(ddp_snapshot_load(NULL, path), DDP_ERR_INVALID_ARGUMENT, "the model is NULL");
    free(fp.f);
    job_free(&t);
}

/* Two temporary files beside `path` as writers on this host name them, "<path>.tmp.<host>.<pid>",
   their names written to the 600-byte buffers `stale` (a pid that no longer runs, returned) and
   `live` (a pid that does: our parent). */
static long make_tmp_files(const char* path, char* stale, char* live) {
    char host[64] = "host";
    long dead = 4000000;
    FILE* f;
    gethostname(host, sizeof host - 1);
    host[strcspn(host, "/.")] = 0;
    while (dead > 2 && (kill((pid_t)dead, 0) == 0 || errno != ESRCH)) dead--;
    snprintf(stale, 600, "%s.tmp.%s.%ld", path, host, dead);
    snprintf(live, 600, "%s.tmp.%s.%ld", path, host, (long)getppid());
    CHECK((f = fopen(stale, "wb")) != NULL && fputs("torn", f) >= 0 && fclose(f) == 0);
    CHECK((f = fopen(live, "wb")) != NULL && fclose(f) == 0);
    return dead;
}

/* ---- 5. saving: atomic replacement, failures leave nothing behind ------------------------------- */

static void test_atomic_save(void) {
    const char* path = tmp_path("atomic.safetensors");
    job_spec sp = spec(s_wine, 3, 1, DDP_ADAM, 0.f);
    job a, b, t;
    char leftover[256], blocker[300], blocker2[300];
    unsigned char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    job_init(&a, &sp);
    sp.seed = 2;
    job_init(&b, &sp);
    sp.seed = 3;
    job_init(&t, &sp);
    job_advance_and_save(&a, path);
    CHECK(count_tmp_files(leftover, sizeof leftover) == 0);

    /* a folder that does not exist: DDP_ERR_IO naming the path, no file, no temporary */
    CHECK_FAILS(ddp_snapshot_save(&a.snap, tmp_path("no/such/dir/x.safetensors")), DDP_ERR_IO, "no/such/dir/x.safetensors");
    CHECK(msg_has(g_tmp) && msg_has(strerror(ENOENT)));
    CHECK(!file_exists(tmp_path("no")));
    CHECKF(count_tmp_files(leftover, sizeof leftover) == 0, "a temporary file was left: %s", leftover);

    /* the path is a folder: the rename fails, the temporary is removed, the folder stays */
    CHECK(mkdir(tmp_path("dir.safetensors"), 0700) == 0);
    CHECK_FAILS(ddp_snapshot_save(&a.snap, tmp_path("dir.safetensors")), DDP_ERR_IO, tmp_path("dir.safetensors"));
    CHECK(msg_has("the previous file, if any, is intact"));
    CHECKF(count_tmp_files(leftover, sizeof leftover) == 0, "a temporary file was left: %s", leftover);
    CHECK(rmdir(tmp_path("dir.safetensors")) == 0);

    /* saving over an existing snapshot replaces it */
    before = read_bytes(path, &nb);
    b.snap.epoch = 11, b.snap.step = 99;
    CHECK_OK(ddp_snapshot_save(&b.snap, path));
    CHECK(count_tmp_files(leftover, sizeof leftover) == 0);
    after = read_bytes(path, &na);
    CHECK(before && after && (na != nb || memcmp(before, after, na) != 0));
    CHECK_OK(ddp_snapshot_load(&t.snap, path));
    CHECK(t.snap.epoch == 11 && t.snap.step == 99 && params_equal(t.model, b.model));

    /* a failed save leaves the previous file intact: the temporary's name, "<path>.tmp.<host>.<pid>"
       (the host name up to its first dot), is taken by a folder; "<path>.tmp" too, which is harmless */
    {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        host[strcspn(host, "/.")] = 0;
        snprintf(blocker, sizeof blocker, "%s.tmp.%s.%ld", path, host, (long)getpid());
    }
    CHECK(mkdir(blocker, 0700) == 0);
    snprintf(blocker2, sizeof blocker2, "%s.tmp", path);
    CHECK(mkdir(blocker2, 0700) == 0);
    CHECK_FAILS(ddp_snapshot_save(&a.snap, path), DDP_ERR_IO, "atomic.safetensors.tmp");
    CHECK(rmdir(blocker) == 0 && rmdir(blocker2) == 0);
    CHECKF(count_tmp_files(leftover, sizeof leftover) == 0, "a temporary file was left: %s", leftover);
    free(before);
    before = read_bytes(path, &nb);
    CHECK(before && nb == na && !memcmp(before, after, na));
    CHECK_OK(ddp_snapshot_load(&t.snap, path));
    CHECK(t.snap.epoch == 11 && params_equal(t.model, b.model));

    /* a temporary file that a killed writer on this host left is removed by the next save; one
       whose writer still runs (here: our parent) is not */
    {
        char stale[600], live[600];
        long dead = make_tmp_files(path, stale, live);
        CHECK_OK(ddp_snapshot_save(&b.snap, path));
        CHECKF(access(stale, F_OK) != 0, "%s (pid %ld is not running) was not removed", stale, dead);
        CHECKF(access(live, F_OK) == 0, "%s (its writer, pid %ld, still runs) was removed", live, (long)getppid());
        unlink(live);
    }

    /* NULL arguments */
    {
        ddp_snapshot empty;
        memset(&empty, 0, sizeof empty);
        CHECK_FAILS(ddp_snapshot_save(&empty, path), DDP_ERR_INVALID_ARGUMENT, "the model is NULL");
        CHECK_FAILS(ddp_snapshot_save(&a.snap, NULL), DDP_ERR_INVALID_ARGUMENT, "path is NULL");
    }
    free(before);
    free(after);
    job_free(&a);
    job_free(&b);
    job_free(&t);
}

/* A snapshot path that is a symbolic link (into a shared folder, as on a cluster): the save writes
   the file the link leads to, in that file's folder, and the link stays a link; a link to a file
   not there yet makes it; a loop of links is refused, naming the path. */
static void test_save_through_a_symlink(void) {
    job_spec sp = spec(s_wine, 3, 1, DDP_ADAM, 0.f);
    job a, b, t;
    struct stat st;
    char leftover[256];
    job_init(&a, &sp);
    sp.seed = 2;
    job_init(&b, &sp);
    sp.seed = 3;
    job_init(&t, &sp);
    CHECK(mkdir(tmp_path("shared"), 0700) == 0);
    job_advance_and_save(&a, tmp_path("shared/s.safetensors"));
    CHECK(symlink("shared/s.safetensors", tmp_path("s.safetensors")) == 0);
    b.snap.epoch = 11, b.snap.step = 99;
    CHECK_OK(ddp_snapshot_save(&b.snap, tmp_path("s.safetensors")));
    CHECKF(lstat(tmp_path("s.safetensors"), &st) == 0 && S_ISLNK(st.st_mode),
           "the link was replaced by a file: shared/s.safetensors keeps the old snapshot");
    CHECK_OK(ddp_snapshot_load(&t.snap, tmp_path("shared/s.safetensors")));
    CHECK(t.snap.epoch == 11 && t.snap.step == 99 && params_equal(t.model, b.model));
    CHECKF(count_tmp_files(leftover, sizeof leftover) == 0, "a temporary file was left: %s", leftover);
    /* a link whose file does not exist yet, through an absolute path */
    CHECK(symlink(tmp_path("shared/new.safetensors"), tmp_path("n.safetensors")) == 0);
    CHECK_OK(ddp_snapshot_save(&b.snap, tmp_path("n.safetensors")));
    CHECK(lstat(tmp_path("n.safetensors"), &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(stat(tmp_path("shared/new.safetensors"), &st) == 0 && S_ISREG(st.st_mode));
    /* a loop */
    CHECK(symlink("loop2", tmp_path("loop1")) == 0 && symlink("loop1", tmp_path("loop2")) == 0);
    CHECK_FAILS(ddp_snapshot_save(&b.snap, tmp_path("loop1")), DDP_ERR_IO, "symbolic links");
    CHECK(msg_has(tmp_path("loop1")) && msg_has(strerror(ELOOP)));
    job_free(&a);
    job_free(&b);
    job_free(&t);
}

static void test_exists(void) {
    const char* path = tmp_path("exists.safetensors");
    ddp_model* m = make_mlp(s_small, 3, 1);
    ddp_snapshot s;
    if (!m) return;
    memset(&s, 0, sizeof s);
    s.model = m;
    CHECK(ddp_snapshot_exists(path) == 0);
    CHECK(ddp_snapshot_exists(NULL) == 0);
    CHECK_OK(ddp_snapshot_save(&s, path));
    CHECK(ddp_snapshot_exists(path) == 1);
    CHECK(unlink(path) == 0);
    CHECK(ddp_snapshot_exists(path) == 0);
    ddp_model_destroy(m);
}

/* Run fn in a child process that must end within `limit_s` seconds (a SIGALRM then ends it):
   returns the child's exit status, or -1 when it hung (or crashed). The harness's checks in the
   child do not reach the parent, so fn returns 0 for success and its own code otherwise. */
static int in_child(int (*fn)(void), unsigned limit_s, int as_nobody) {
    int st = 0, r;
    pid_t pid;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        alarm(limit_s);
        if (as_nobody && geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(90);
        r = fn();
        fflush(stdout); /* _exit does not */
        _exit(r);
    }
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    if (WIFSIGNALED(st)) return -1;
    return WEXITSTATUS(st);
}

static const char* g_child_path; /* what the child functions below look at */

/* A FIFO where the snapshot should be: opening it for reading would wait for a writer forever. */
static int load_fifo_child(void) {
    ddp_snapshot s;
    memset(&s, 0, sizeof s);
    s.model = make_mlp(s_small, 3, 1);
    if (!s.model) return 3;
    if (ddp_snapshot_load(&s, g_child_path) != DDP_ERR_IO) return 4;
    if (!strstr(ddp_error_string(), g_child_path) || !strstr(ddp_error_string(), "named pipe")) {
        printf("    the message lacks the path or \"named pipe\": %s\n", ddp_error_string());
        return 5;
    }
    if (ddp_snapshot_exists(g_child_path) != 1) return 6; /* something is there */
    return 0;
}

static void test_fifo_is_refused_at_once(void) {
    const char* path = tmp_path("fifo.safetensors");
    int rc;
    CHECK(mkfifo(path, 0600) == 0);
    g_child_path = path;
    rc = in_child(load_fifo_child, 10, 0);
    CHECKF(rc == 0, "loading a snapshot path that is a FIFO %s", rc < 0 ? "hung (killed after 10 s)" : "was not refused as it should be");
    unlink(path);
}

/* ddp_snapshot_exists in a folder this process may not search: an error naming the path, not "no
   snapshot" (the job would otherwise train from step 0 and then fail at its first save). */
static int exists_unsearchable_child(void) {
    int r = ddp_snapshot_exists(g_child_path);
    if (r != -1) {
        printf("    ddp_snapshot_exists returned %d for a path in a folder this user cannot search\n", r);
        return 3;
    }
    if (!strstr(ddp_error_string(), g_child_path) || !strstr(ddp_error_string(), strerror(EACCES))) {
        printf("    the message lacks the path or the reason: %s\n", ddp_error_string());
        return 4;
    }
    return 0;
}

static void test_exists_error_is_not_absence(void) {
    char a[600], b[300], inner[300];
    int rc;
    /* a symlink loop: stat fails with ELOOP, and a save would replace the link */
    snprintf(a, sizeof a, "%s", tmp_path("loop_a.safetensors"));
    snprintf(b, sizeof b, "%s", tmp_path("loop_b.safetensors"));
    CHECK(symlink(b, a) == 0 && symlink(a, b) == 0);
    ddp__clear_error();
    CHECKF(ddp_snapshot_exists(a) == -1, "ddp_snapshot_exists on a symlink loop returned %d, want -1", ddp_snapshot_exists(a));
    CHECKF(strstr(ddp_error_string(), a) && strstr(ddp_error_string(), strerror(ELOOP)),
           "message \"%s\" lacks the path or \"%s\"", ddp_error_string(), strerror(ELOOP));
    unlink(a), unlink(b);
    /* a folder the user cannot search (as root: a child that becomes nobody) */
    snprintf(inner, sizeof inner, "%s", tmp_path("locked"));
    CHECK(mkdir(inner, 0700) == 0);
    snprintf(a, sizeof a, "%s/snap.safetensors", inner);
    CHECK(write_bytes(a, "x", 1));
    if (geteuid() != 0) CHECK(chmod(inner, 0) == 0);
    g_child_path = a;
    rc = in_child(exists_unsearchable_child, 10, 1);
    CHECKF(rc == 0, "ddp_snapshot_exists in an unsearchable folder: child status %d", rc);
    chmod(inner, 0700);
    unlink(a);
    rmdir(inner);
    /* absence is still 0, and sets no error */
    ddp__clear_error();
    CHECK(ddp_snapshot_exists(tmp_path("nothing.safetensors")) == 0);
}

/* A torn temporary file that a killed writer left is removed when the next run starts (looks
   for its snapshot), not only after its next save; a live writer's is kept. */
static void test_stale_tmp_removed_on_start(void) {
    const char* path = tmp_path("stale_on_start.safetensors");
    char stale[600], live[600];
    long dead = make_tmp_files(path, stale, live);
    CHECKF(ddp_snapshot_exists(path) == 0, "ddp_snapshot_exists(%s): %d", path, ddp_snapshot_exists(path));
    CHECKF(access(stale, F_OK) != 0, "%s (pid %ld is not running) was not removed on start", stale, dead);
    CHECKF(access(live, F_OK) == 0, "%s (its writer, pid %ld, still runs) was removed", live, (long)getppid());
    unlink(stale);
    unlink(live);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ddp_test_snapshot.XXXXXX");
    if (!mkdtemp(g_tmp)) {
        printf("FAIL setup: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    RUN(test_roundtrip_adam);
    RUN(test_roundtrip_adamw);
    RUN(test_roundtrip_sgd_momentum);
    RUN(test_roundtrip_sgd_plain);
    RUN(test_roundtrip_model_only);
    RUN(test_optimizer_mismatch);
    RUN(test_flipped_bits);
    RUN(test_truncated_and_extended);
    RUN(test_edited_with_valid_checksum);
    RUN(test_non_finite_numbers_refused);
    RUN(test_other_models);
    RUN(test_sampler_and_loader_mismatch);
    RUN(test_resume_matches_uninterrupted);
    RUN(test_not_a_snapshot);
    RUN(test_missing_file);
    RUN(test_atomic_save);
    RUN(test_save_through_a_symlink);
    RUN(test_exists);
    RUN(test_fifo_is_refused_at_once);
    RUN(test_exists_error_is_not_absence);
    RUN(test_stale_tmp_removed_on_start);
    h_remove_tree(g_tmp);
    return H_EXIT();
}
