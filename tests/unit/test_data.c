/* tests/unit/test_data.c: the >>data section (CSV loading, name resolution, split, standardisation,
   gather) on the CPU (snapshots: test_snapshot.c). Run from the repository's top
   folder: it reads examples/data/wine.csv and digits.csv. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static char g_tmp[64]; /* temporary folder made by mkdtemp, removed at the end */

/* ---- helpers ----------------------------------------------------------------------------------- */

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
static int write_text(const char* path, const char* text) { return write_bytes(path, text, strlen(text)); }

/* An independent reader of the bundled CSV files: fgets, strtod on each comma-separated field. */
typedef struct {
    int n, nf;
    float* x;
    int* y;
} ref_csv;

static int ref_csv_read(const char* path, ref_csv* r) {
    FILE* f = fopen(path, "r");
    char line[8192];
    int cap = 0, cols = 0;
    memset(r, 0, sizeof *r);
    if (!f) return 0;
    if (!fgets(line, sizeof line, f)) {
        fclose(f);
        return 0;
    }
    {
        char* c;
        for (c = line, cols = 1; *c; c++) cols += *c == ',';
    }
    r->nf = cols - 1;
    while (fgets(line, sizeof line, f)) {
        char *tok, *save = NULL;
        int k = 0;
        if (line[0] == '\n' || line[0] == '\r' || line[0] == 0) continue;
        if (r->n == cap) {
            cap = cap ? cap * 2 : 256;
            r->x = (float*)realloc(r->x, (size_t)cap * r->nf * sizeof(float));
            r->y = (int*)realloc(r->y, (size_t)cap * sizeof(int));
        }
        for (tok = strtok_r(line, ",\r\n", &save); tok; tok = strtok_r(NULL, ",\r\n", &save), k++) {
            if (k < r->nf) r->x[(size_t)r->n * r->nf + k] = (float)strtod(tok, NULL);
            else r->y[r->n] = atoi(tok);
        }
        if (k != cols) {
            fclose(f);
            return 0;
        }
        r->n++;
    }
    fclose(f);
    return 1;
}
static void ref_csv_free(ref_csv* r) {
    free(r->x);
    free(r->y);
    memset(r, 0, sizeof *r);
}

/* 1 if d is all zero: n, nfeatures, nclasses, x, y. */
static int ds_empty(const ddp_dataset* d) {
    return d->n == 0 && d->nfeatures == 0 && d->nclasses == 0 && d->x == NULL && d->y == NULL;
}
static void ds_garbage(ddp_dataset* d) {
    static float fx;
    static int iy;
    d->n = 99;
    d->nfeatures = 98;
    d->nclasses = 97;
    d->x = &fx;
    d->y = &iy;
}

/* ---- 1. the bundled data sets ------------------------------------------------------------------ */

static void compare_with_reference(const ddp_dataset* d, const char* path) {
    ref_csv r;
    int bad = 0, i, j;
    CHECKF(ref_csv_read(path, &r), "the reference reader could not read %s", path);
    CHECK(d->n == r.n && d->nfeatures == r.nf);
    if (d->n == r.n && d->nfeatures == r.nf) {
        for (i = 0; i < r.n; i++) {
            for (j = 0; j < r.nf; j++)
                if (d->x[(size_t)i * r.nf + j] != r.x[(size_t)i * r.nf + j]) {
                    if (bad++ < 3)
                        printf("    %s row %d col %d: %.9g, expected %.9g\n", path, i, j,
                               (double)d->x[(size_t)i * r.nf + j], (double)r.x[(size_t)i * r.nf + j]);
                }
            if (d->y[i] != r.y[i]) bad++;
        }
    }
    CHECKF(bad == 0, "%s: %d values differ from an independent reading of the file", path, bad);
    ref_csv_free(&r);
}

static void test_bundled(void) {
    ddp_dataset w, g;
    int counts[10] = {0}, i, sum = 0, bad = 0;
    static const float row0[13] = {14.23f, 1.71f, 2.43f, 15.6f, 127.f, 2.8f, 3.06f,
                                   0.28f,  2.29f, 5.64f, 1.04f, 3.92f, 1065.f};

    CHECK_OK(ddp__dataset_load_csv("examples/data/wine.csv", &w));
    CHECK(w.n == 178 && w.nfeatures == 13 && w.nclasses == 3);
    CHECK(w.x != NULL && w.y != NULL);
    if (w.n == 178) {
        for (i = 0; i < w.n; i++) {
            if (w.y[i] >= 0 && w.y[i] < 3) counts[w.y[i]]++;
            else bad++;
        }
        CHECKF(bad == 0 && counts[0] == 59 && counts[1] == 71 && counts[2] == 48, "wine classes %d/%d/%d, %d bad",
               counts[0], counts[1], counts[2], bad);
        CHECK(!memcmp(w.x, row0, sizeof row0) && w.y[0] == 0);
        CHECK(w.y[177] == 2);
    }
    compare_with_reference(&w, "examples/data/wine.csv");
    ddp_dataset_free(&w);
    CHECK(ds_empty(&w));

    ds_garbage(&g);
    CHECK_OK(ddp_dataset_load("digits", NULL, &g));
    CHECK(g.n == 1797 && g.nfeatures == 64 && g.nclasses == 10);
    memset(counts, 0, sizeof counts);
    bad = 0;
    for (i = 0; i < g.n; i++) {
        if (g.y[i] >= 0 && g.y[i] < 10) counts[g.y[i]]++;
        else bad++;
    }
    for (i = 0; i < 10; i++) {
        CHECKF(counts[i] >= 174 && counts[i] <= 183, "digit %d has %d samples", i, counts[i]);
        sum += counts[i];
    }
    CHECK(sum == 1797 && bad == 0);
    for (i = 0, bad = 0; i < g.n * g.nfeatures; i++) bad += !(g.x[i] >= 0 && g.x[i] <= 16 && g.x[i] == floorf(g.x[i]));
    CHECKF(bad == 0, "%d digit pixels outside the whole numbers 0..16", bad);
    compare_with_reference(&g, "examples/data/digits.csv");
    ddp_dataset_free(&g);
    ddp_dataset_free(&g); /* twice is harmless */
    ddp_dataset_free(NULL);
}

/* ---- 2. name resolution ------------------------------------------------------------------------ */

static void test_load_names(void) {
    ddp_dataset d;
    char want[300];
    const char* w = want;
    const char* bad_dir = "/nonexistent-ddp-data-dir";

    /* a folder of our own with a small "wine.csv", so that we can tell which file was read */
    CHECK(write_text(tmp_path("wine.csv"), "a,b,label\n1,2,0\n3,4,1\n5,6,1\n"));
    unsetenv("DDP_DATA_DIR");

    CHECK_FAILS(ddp_dataset_load(NULL, NULL, &d), DDP_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(d.n == 0 && d.x == NULL && d.y == NULL);
    CHECK_OK(ddp_dataset_load("wine", "examples/data", &d)); /* explicit folder */
    CHECK(d.n == 178 && d.nfeatures == 13);
    ddp_dataset_free(&d);
    CHECK_OK(ddp_dataset_load("wine", g_tmp, &d));
    CHECK(d.n == 3 && d.nfeatures == 2 && d.nclasses == 2);
    ddp_dataset_free(&d);
    CHECK_OK(ddp_dataset_load("wine", NULL, &d)); /* the default folder */
    CHECK(d.n == 178);
    ddp_dataset_free(&d);

    CHECK(setenv("DDP_DATA_DIR", g_tmp, 1) == 0); /* the environment's folder */
    CHECK_OK(ddp_dataset_load("wine", NULL, &d));
    CHECK(d.n == 3);
    ddp_dataset_free(&d);
    CHECK_OK(ddp_dataset_load("wine", "examples/data", &d)); /* an explicit folder wins */
    CHECK(d.n == 178);
    ddp_dataset_free(&d);
    snprintf(want, sizeof want, "%s/nosuch.csv", g_tmp);
    ds_garbage(&d);
    CHECK_FAILS(ddp_dataset_load("nosuch", NULL, &d), DDP_ERR_IO, w);
    CHECK(ds_empty(&d));
    CHECK(setenv("DDP_DATA_DIR", "", 1) == 0); /* empty: as if unset */
    CHECK_OK(ddp_dataset_load("wine", NULL, &d));
    CHECK(d.n == 178);
    ddp_dataset_free(&d);
    CHECK(unsetenv("DDP_DATA_DIR") == 0);
    CHECK_OK(ddp_dataset_load("wine", NULL, &d));
    CHECK(d.n == 178);
    ddp_dataset_free(&d);

    /* a path ending in .csv is read as it is, whatever the folders */
    CHECK_OK(ddp_dataset_load("examples/data/wine.csv", bad_dir, &d));
    CHECK(d.n == 178);
    ddp_dataset_free(&d);
    CHECK_OK(ddp_dataset_load(tmp_path("wine.csv"), NULL, &d));
    CHECK(d.n == 3);
    ddp_dataset_free(&d);

    /* unknown names: the message says where it looked and how to point elsewhere */
    ds_garbage(&d);
    CHECK_FAILS(ddp_dataset_load("nosuch", NULL, &d), DDP_ERR_IO, "examples/data/nosuch.csv");
    CHECK(strstr(ddp_error_string(), "DDP_DATA_DIR") != NULL);
    CHECK(ds_empty(&d));
    snprintf(want, sizeof want, "%s/wine.csv", bad_dir);
    CHECK_FAILS(ddp_dataset_load("wine", bad_dir, &d), DDP_ERR_IO, w);
    CHECK(strstr(ddp_error_string(), "DDP_DATA_DIR") != NULL);
    CHECK_FAILS(ddp_dataset_load("nosuch.csv", NULL, &d), DDP_ERR_IO, "nosuch.csv");
    CHECK(ds_empty(&d));

    /* a path that is not a .csv is refused, not guessed at */
    ds_garbage(&d);
    CHECK_FAILS(ddp_dataset_load("examples/data/wine", NULL, &d), DDP_ERR_INVALID_ARGUMENT, "examples/data/wine");
    CHECKF(ds_empty(&d), "after a refused name the dataset holds n=%d x=%p (load_csv empties it on every error)",
           d.n, (void*)d.x);
    CHECK_FAILS(ddp_dataset_load("", NULL, &d), DDP_ERR_INVALID_ARGUMENT, "\"\"");
}

/* ---- 3. malformed files ------------------------------------------------------------------------- */

/* Write `text` (len bytes) to tmp/name, load it, expect `want` and a message that names the file and
   contains `needle` (NULL: only the file); the dataset must come back empty. */
static void expect_bad_file(const char* name, const char* text, size_t len, ddp_status want, const char* needle,
                            int line) {
    const char* path = tmp_path(name);
    ddp_dataset d;
    ddp_status s;
    if (text && !write_bytes(path, text, len)) {
        h_failf(__FILE__, line, "cannot write %s", path);
        return;
    }
    ds_garbage(&d);
    ddp__clear_error();
    s = ddp__dataset_load_csv(path, &d);
    if (s != want)
        h_failf(__FILE__, line, "%s: status %s, expected %s (message: %s)", name, ddp_status_name(s),
                ddp_status_name(want), ddp_error_string());
    else if (ddp__last_status() != want)
        h_failf(__FILE__, line, "%s: ddp__last_status() is %s", name, ddp_status_name(ddp__last_status()));
    else if (!strstr(ddp_error_string(), path))
        h_failf(__FILE__, line, "%s: message \"%s\" does not name the file", name, ddp_error_string());
    else if (needle && !strstr(ddp_error_string(), needle))
        h_failf(__FILE__, line, "%s: message \"%s\" lacks \"%s\"", name, ddp_error_string(), needle);
    if (!ds_empty(&d)) h_failf(__FILE__, line, "%s: the dataset is not left empty after the failure", name);
    if (s == DDP_OK) ddp_dataset_free(&d);
}
#define BAD(name, text, want, needle) expect_bad_file(name, text, sizeof(text) - 1, want, needle, __LINE__)

static void expect_loads(const char* name, const char* text, int n, int nf, int nclasses, const float* x,
                         const int* y, int line) {
    const char* path = tmp_path(name);
    ddp_dataset d;
    ddp_status s;
    if (!write_text(path, text)) {
        h_failf(__FILE__, line, "cannot write %s", path);
        return;
    }
    s = ddp__dataset_load_csv(path, &d);
    if (s != DDP_OK) {
        h_failf(__FILE__, line, "%s: %s: %s", name, ddp_status_name(s), ddp_error_string());
        return;
    }
    if (d.n != n || d.nfeatures != nf || d.nclasses != nclasses)
        h_failf(__FILE__, line, "%s: %d x %d, %d classes; expected %d x %d, %d classes", name, d.n, d.nfeatures,
                d.nclasses, n, nf, nclasses);
    else if (memcmp(d.x, x, (size_t)n * nf * sizeof(float)) || memcmp(d.y, y, (size_t)n * sizeof(int)))
        h_failf(__FILE__, line, "%s: the values differ", name);
    ddp_dataset_free(&d);
}

static void test_bad_files(void) {
    static const float x2[] = {1, 2, 3, 4};
    static const int y2[] = {0, 1};
    static const float x1[] = {1.5f, -2.f};
    static const int y1[] = {0};
    static const int ybig[] = {65535};

    expect_bad_file("missing.csv", NULL, 0, DDP_ERR_IO, NULL, __LINE__);
    BAD("empty.csv", "", DDP_ERR_DATA_FORMAT, ":1:");
    BAD("header_only.csv", "a,b,label\n", DDP_ERR_DATA_FORMAT, NULL);
    BAD("header_only_blank.csv", "a,b,label\n\n\r\n", DDP_ERR_DATA_FORMAT, NULL);
    BAD("one_column.csv", "label\n1\n2\n", DDP_ERR_DATA_FORMAT, ":1:");
    BAD("fewer.csv", "a,b,label\n1,2,0\n1,0\n", DDP_ERR_DATA_FORMAT, ":3:");
    BAD("fewer2.csv", "a,b,label\n1,2,0\n1,0\n", DDP_ERR_DATA_FORMAT, "fewer");
    BAD("more.csv", "a,b,label\n1,2,0\n1,2,3,0\n", DDP_ERR_DATA_FORMAT, ":3:");
    BAD("more2.csv", "a,b,label\n1,2,0\n1,2,3,0\n", DDP_ERR_DATA_FORMAT, "more");
    BAD("abc.csv", "a,b,label\n1,2,0\n1,abc,0\n", DDP_ERR_DATA_FORMAT, "\"abc\"");
    BAD("abc_line.csv", "a,b,label\n1,2,0\n1,abc,0\n", DDP_ERR_DATA_FORMAT, ":3:");
    BAD("abc_col.csv", "a,b,label\n1,2,0\n1,abc,0\n", DDP_ERR_DATA_FORMAT, "column 2");
    BAD("abc_tail.csv", "a,b,label\n1,2x,0\n", DDP_ERR_DATA_FORMAT, ":2:");
    BAD("empty_field.csv", "a,b,label\n1,,0\n", DDP_ERR_DATA_FORMAT, ":2:");
    BAD("nan.csv", "a,b,label\n1,nan,0\n", DDP_ERR_DATA_FORMAT, ":2:");
    BAD("inf.csv", "a,b,label\n1,inf,0\n", DDP_ERR_DATA_FORMAT, "not a finite number");
    BAD("huge.csv", "a,b,label\n1,1e39,0\n", DDP_ERR_DATA_FORMAT, ":2:");
    BAD("frac_label.csv", "a,b,label\n1,2,0\n1,2,1.5\n", DDP_ERR_DATA_FORMAT, ":3:");
    BAD("frac_label2.csv", "a,b,label\n1,2,1.5\n", DDP_ERR_DATA_FORMAT, "1.5");
    BAD("neg_label.csv", "a,b,label\n1,2,-1\n", DDP_ERR_DATA_FORMAT, ":2:");
    BAD("neg_label2.csv", "a,b,label\n1,2,-1\n", DDP_ERR_DATA_FORMAT, "-1");
    BAD("big_label.csv", "a,b,label\n1,2,65536\n", DDP_ERR_DATA_FORMAT, ":2:");
    BAD("big_label2.csv", "a,b,label\n1,2,65536\n", DDP_ERR_DATA_FORMAT, "65536");
    BAD("text_label.csv", "a,b,label\n1,2,zero\n", DDP_ERR_DATA_FORMAT, "\"zero\"");
    BAD("nul.csv", "a,b,label\n1,2\0,0\n", DDP_ERR_DATA_FORMAT, "NUL");
    BAD("nul_header.csv", "a,\0b,label\n1,2,0\n", DDP_ERR_DATA_FORMAT, NULL);
    /* the line number counts blank lines too */
    BAD("blank_then_bad.csv", "a,b,label\n\n1,2,0\n\r\nx,4,1\n", DDP_ERR_DATA_FORMAT, ":5:");
    BAD("crlf_bad.csv", "a,b,label\r\n1,2,0\r\n3,4\r\n", DDP_ERR_DATA_FORMAT, ":3:");
    {
        ddp_dataset d;
        const char* dir = g_tmp;
        CHECK_FAILS(ddp__dataset_load_csv(dir, &d), DDP_ERR_IO, dir); /* a folder, not a file */
    }

    /* accepted: CRLF line ends, blank lines anywhere, no newline at the end, the largest label */
    expect_loads("crlf.csv", "a,b,label\r\n1,2,0\r\n3,4,1\r\n", 2, 2, 2, x2, y2, __LINE__);
    expect_loads("blank.csv", "a,b,label\n\n1,2,0\n\n\n3,4,1\n\n", 2, 2, 2, x2, y2, __LINE__);
    expect_loads("blank_crlf.csv", "a,b,label\r\n\r\n1,2,0\r\n\r\n3,4,1\r\n\r\n", 2, 2, 2, x2, y2, __LINE__);
    expect_loads("no_final_newline.csv", "a,b,label\n1,2,0\n3,4,1", 2, 2, 2, x2, y2, __LINE__);
    expect_loads("spaces.csv", "a,b,label\n 1.5 , -2 ,0 \n", 1, 2, 1, x1, y1, __LINE__);
    expect_loads("label_max.csv", "a,b,label\n1.5,-2,65535\n", 1, 2, 65536, x1, ybig, __LINE__);
}

/* ---- 4. split ---------------------------------------------------------------------------------------- */

/* 1 if the rows of a and b together are exactly the rows of all, each used once. */
static int split_is_partition(const ddp_dataset* all, const ddp_dataset* a, const ddp_dataset* b) {
    static char used[4096];
    int part, i, j, nf = all->nfeatures;
    if (a->n + b->n != all->n || all->n > 4096) return 0;
    memset(used, 0, sizeof used);
    for (part = 0; part < 2; part++) {
        const ddp_dataset* p = part ? b : a;
        for (i = 0; i < p->n; i++) {
            for (j = 0; j < all->n; j++)
                if (!used[j] && p->y[i] == all->y[j] &&
                    !memcmp(p->x + (size_t)i * nf, all->x + (size_t)j * nf, (size_t)nf * sizeof(float)))
                    break;
            if (j == all->n) return 0;
            used[j] = 1;
        }
    }
    return 1;
}

static ddp_dataset make_dataset(int n, int nf) {
    ddp_dataset d;
    int i;
    d.n = n;
    d.nfeatures = nf;
    d.nclasses = 2;
    d.x = (float*)malloc((size_t)n * nf * sizeof(float) + 1);
    d.y = (int*)malloc((size_t)n * sizeof(int) + 1);
    for (i = 0; i < n * nf; i++) d.x[i] = (float)i;
    for (i = 0; i < n; i++) d.y[i] = i % 2;
    return d;
}

static void test_split(void) {
    ddp_dataset all, tr, te, tr2, te2, tr3, te3, two, hundred, ten;
    int i, classes[3] = {0};
    static const float bad_fractions[] = {0.f, 1.f, -0.1f, 1.5f};
    size_t k;

    CHECK_OK(ddp__dataset_load_csv("examples/data/wine.csv", &all));
    if (all.n != 178) return;
    CHECK_OK(ddp_dataset_split(&all, 0.2, 42, &tr, &te));
    CHECK(tr.n == 142 && te.n == 36);
    CHECK(tr.nfeatures == 13 && te.nfeatures == 13 && tr.nclasses == 3 && te.nclasses == 3);
    CHECK(split_is_partition(&all, &tr, &te));
    /* shuffled: the file is sorted by class, so a cut without shuffling would be one class */
    for (i = 0; i < te.n; i++)
        if (te.y[i] >= 0 && te.y[i] < 3) classes[te.y[i]]++;
    CHECKF(classes[0] && classes[1] && classes[2], "test classes %d/%d/%d", classes[0], classes[1], classes[2]);

    CHECK_OK(ddp_dataset_split(&all, 0.2, 42, &tr2, &te2));
    CHECK(tr2.n == tr.n && te2.n == te.n);
    if (tr2.n == tr.n && te2.n == te.n) {
        CHECK(!memcmp(tr.x, tr2.x, (size_t)tr.n * 13 * sizeof(float)) && !memcmp(tr.y, tr2.y, (size_t)tr.n * sizeof(int)));
        CHECK(!memcmp(te.x, te2.x, (size_t)te.n * 13 * sizeof(float)) && !memcmp(te.y, te2.y, (size_t)te.n * sizeof(int)));
    }
    CHECK_OK(ddp_dataset_split(&all, 0.2, 43, &tr3, &te3));
    CHECK(te3.n == 36 && split_is_partition(&all, &tr3, &te3));
    if (te3.n == 36) CHECK(memcmp(te.x, te3.x, (size_t)te.n * 13 * sizeof(float)) != 0);
    ddp_dataset_free(&tr2);
    ddp_dataset_free(&te2);
    ddp_dataset_free(&tr3);
    ddp_dataset_free(&te3);
    /* the ceil rule elsewhere: 0.25 * 178 = 44.5 -> 45, 0.5 -> 89 */
    CHECK_OK(ddp_dataset_split(&all, 0.25, 1, &tr2, &te2));
    CHECK(te2.n == 45 && tr2.n == 133);
    ddp_dataset_free(&tr2);
    ddp_dataset_free(&te2);
    CHECK_OK(ddp_dataset_split(&all, 0.5, 1, &tr2, &te2));
    CHECK(te2.n == 89 && tr2.n == 89 && split_is_partition(&all, &tr2, &te2));
    ddp_dataset_free(&tr2);
    ddp_dataset_free(&te2);

    /* scikit-learn's rule is ceil(test_size * n) on the decimal fraction the caller wrote:
       0.2 of 100 samples is 20 test samples, 0.1 of 10 is 1, 0.3 of 10 is 3 */
    hundred = make_dataset(100, 2);
    ten = make_dataset(10, 2);
    CHECK_OK(ddp_dataset_split(&hundred, 0.2, 1, &tr2, &te2));
    CHECKF(te2.n == 20 && tr2.n == 80, "0.2 of 100 samples: %d test, %d train (scikit-learn: 20, 80)", te2.n, tr2.n);
    ddp_dataset_free(&tr2);
    ddp_dataset_free(&te2);
    CHECK_OK(ddp_dataset_split(&ten, 0.1, 1, &tr2, &te2));
    CHECKF(te2.n == 1 && tr2.n == 9, "0.1 of 10 samples: %d test, %d train (scikit-learn: 1, 9)", te2.n, tr2.n);
    ddp_dataset_free(&tr2);
    ddp_dataset_free(&te2);
    CHECK_OK(ddp_dataset_split(&ten, 0.3, 1, &tr2, &te2));
    CHECKF(te2.n == 3 && tr2.n == 7, "0.3 of 10 samples: %d test, %d train (scikit-learn: 3, 7)", te2.n, tr2.n);
    ddp_dataset_free(&tr2);
    ddp_dataset_free(&te2);
    ddp_dataset_free(&hundred);
    ddp_dataset_free(&ten);

    /* fractions outside (0, 1), or a part left empty */
    for (k = 0; k < sizeof bad_fractions / sizeof bad_fractions[0]; k++) {
        ds_garbage(&tr2);
        ds_garbage(&te2);
        CHECK_FAILS(ddp_dataset_split(&all, bad_fractions[k], 1, &tr2, &te2), DDP_ERR_INVALID_ARGUMENT, "test_fraction");
        CHECK(ds_empty(&tr2) && ds_empty(&te2));
    }
    CHECK_FAILS(ddp_dataset_split(&all, NAN, 1, &tr2, &te2), DDP_ERR_INVALID_ARGUMENT, "test_fraction");
    two = make_dataset(2, 3);
    CHECK_OK(ddp_dataset_split(&two, 0.5, 1, &tr2, &te2));
    CHECK(tr2.n == 1 && te2.n == 1 && split_is_partition(&two, &tr2, &te2));
    ddp_dataset_free(&tr2);
    ddp_dataset_free(&te2);
    ds_garbage(&tr2);
    ds_garbage(&te2);
    CHECK_FAILS(ddp_dataset_split(&two, 0.99, 1, &tr2, &te2), DDP_ERR_INVALID_ARGUMENT, "empty");
    CHECK(ds_empty(&tr2) && ds_empty(&te2));
    ddp_dataset_free(&two);
    two = make_dataset(1, 3);
    CHECK_FAILS(ddp_dataset_split(&two, 0.5, 1, &tr2, &te2), DDP_ERR_INVALID_ARGUMENT, "empty");
    ddp_dataset_free(&two);

    ddp_dataset_free(&tr);
    ddp_dataset_free(&te);
    ddp_dataset_free(&all);
}

/* ---- 5. standardisation ------------------------------------------------------------------------------ */

static void test_standardize(void) {
    ddp_dataset all, tr, te, tr0, te0;
    int i, j, bad_nan = 0;
    double mean0 = 0, sd0 = 0;

    CHECK_OK(ddp__dataset_load_csv("examples/data/wine.csv", &all));
    CHECK_OK(ddp_dataset_split(&all, 0.2, 42, &tr, &te));
    CHECK_OK(ddp_dataset_split(&all, 0.2, 42, &tr0, &te0)); /* an untouched copy */
    if (tr.n != 142 || tr0.n != 142) return;
    ddp_dataset_standardize(&tr, &te);
    for (j = 0; j < tr.nfeatures; j++) {
        double m = 0, v = 0;
        for (i = 0; i < tr.n; i++) m += tr.x[i * 13 + j];
        m /= tr.n;
        for (i = 0; i < tr.n; i++) v += (tr.x[i * 13 + j] - m) * (tr.x[i * 13 + j] - m);
        CHECKF(fabs(m) < 1e-5, "feature %d: training mean %g", j, m);
        CHECKF(fabs(sqrt(v / tr.n) - 1) < 1e-4, "feature %d: training population std %.9g", j, sqrt(v / tr.n));
    }
    /* the test set uses the TRAINING statistics: proline (feature 12) of test rows 0 and 1 */
    for (i = 0; i < tr0.n; i++) mean0 += tr0.x[i * 13 + 12];
    mean0 /= tr0.n;
    for (i = 0; i < tr0.n; i++) sd0 += (tr0.x[i * 13 + 12] - mean0) * (tr0.x[i * 13 + 12] - mean0);
    sd0 = sqrt(sd0 / tr0.n);
    CHECK_CLOSE(te.x[0 * 13 + 12], (te0.x[0 * 13 + 12] - mean0) / sd0, 1e-6, 1e-6);
    CHECK_CLOSE(te.x[1 * 13 + 12], (te0.x[1 * 13 + 12] - mean0) / sd0, 1e-6, 1e-6);
    /* and the labels are left alone */
    CHECK(!memcmp(te.y, te0.y, (size_t)te.n * sizeof(int)) && !memcmp(tr.y, tr0.y, (size_t)tr.n * sizeof(int)));
    ddp_dataset_free(&tr);
    ddp_dataset_free(&te);
    ddp_dataset_free(&tr0);
    ddp_dataset_free(&te0);
    ddp_dataset_free(&all);

    /* a constant feature becomes 0 in both sets, with no NaN; test may be NULL */
    {
        float xa[] = {1, 7, 2, 7, 3, 7, 4, 7}, xb[] = {10, 7, -2, 9};
        int ya[] = {0, 1, 0, 1}, yb[] = {0, 1};
        ddp_dataset a, b;
        a.n = 4, a.nfeatures = 2, a.nclasses = 2, a.x = xa, a.y = ya;
        b.n = 2, b.nfeatures = 2, b.nclasses = 2, b.x = xb, b.y = yb;
        ddp_dataset_standardize(&a, &b);
        for (i = 0; i < 8; i++) bad_nan += xa[i] != xa[i];
        for (i = 0; i < 4; i++) bad_nan += xb[i] != xb[i];
        CHECK(bad_nan == 0);
        CHECK(xa[1] == 0 && xa[3] == 0 && xa[5] == 0 && xa[7] == 0);
        CHECK(xb[1] == 0);      /* 7 - 7 */
        /* feature 0: mean 2.5, population std sqrt(1.25) */
        CHECK_CLOSE(xa[0], (1 - 2.5) / sqrt(1.25), 1e-6, 1e-6);
        CHECK_CLOSE(xb[0], (10 - 2.5) / sqrt(1.25), 1e-6, 1e-6);
        ddp_dataset_standardize(&b, NULL); /* test may be NULL */
        CHECK_CLOSE(xb[0], 1, 1e-6, 1e-6);
        CHECK_CLOSE(xb[2], -1, 1e-6, 1e-6);
    }
}

/* ---- 6. gather --------------------------------------------------------------------------------------- */

static void test_gather(void) {
    ddp_dataset all;
    static const int idx[] = {5, 0, 177, 5, 100};
    float x[6 * 13];
    int y[6], i;
    CHECK_OK(ddp__dataset_load_csv("examples/data/wine.csv", &all));
    if (all.n != 178) return;
    for (i = 0; i < 6 * 13; i++) x[i] = -1234.f;
    for (i = 0; i < 6; i++) y[i] = -7;
    ddp__dataset_gather(&all, idx, 5, x, y);
    for (i = 0; i < 5; i++) {
        CHECKF(!memcmp(x + i * 13, all.x + idx[i] * 13, 13 * sizeof(float)), "row %d (sample %d) differs", i, idx[i]);
        CHECK(y[i] == all.y[idx[i]]);
    }
    CHECK(y[2] == 2 && y[1] == 0);
    CHECK(x[5 * 13] == -1234.f && x[6 * 13 - 1] == -1234.f && y[5] == -7); /* nothing past count */
    y[0] = -7;
    ddp__dataset_gather(&all, idx, 0, x, y);
    CHECK(y[0] == -7);
    ddp_dataset_free(&all);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ddp_test_data.XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_bundled);
    RUN(test_load_names);
    RUN(test_bad_files);
    RUN(test_split);
    RUN(test_standardize);
    RUN(test_gather);
    unsetenv("DDP_DATA_DIR");
    h_remove_tree(g_tmp);
    return H_EXIT();
}
