/* tests/unit/test_basics.c: the >>config and >>device sections on the CPU: status table, errors,
   logging, random numbers, f16/bf16 conversions, devices, memory, streams, build information. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <fcntl.h>
#include <float.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

static char g_tmp[64];           /* temporary folder made by mkdtemp, removed at the end */

/* ---- small helpers --------------------------------------------------------------------------- */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static int streq(const char* a, const char* b) { return a != NULL && !strcmp(a, b); }
static int f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
static int bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

/* Read a whole (small) file into buf as a string; returns its length or -1. */
static long slurp(const char* path, char* buf, size_t cap) {
    FILE* f = fopen(path, "rb");
    size_t n;
    if (!f) return -1;
    n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (long)n;
}

/* ---- 1. status table and errors --------------------------------------------------------------- */

typedef struct {
    char msg[1536];
    ddp_status before, after, call;
    char before_msg[64];
} thread_result;

static void* error_thread(void* arg) {
    thread_result* r = (thread_result*)arg;
    ddp_dataset d;
    /* a fresh thread starts with no error, whatever the main thread did */
    r->before = ddp__last_status();
    snprintf(r->before_msg, sizeof r->before_msg, "%.63s", ddp_error_string());
    r->call = ddp__dataset_load_csv("/nonexistent-ddp-dir/thread-file.csv", &d);
    r->after = ddp__last_status();
    snprintf(r->msg, sizeof r->msg, "%s", ddp_error_string());
    return NULL;
}

static void test_status_and_errors(void) {
    int s, t;
    ddp_device d;
    pthread_t th;
    thread_result tr;
    char main_msg[1536];

    for (s = DDP_OK; s < DDP__STATUS_COUNT; s++) {
        const char* name = ddp_status_name((ddp_status)s);
        const char* cause = ddp__status_cause((ddp_status)s);
        const char* fix = ddp__status_fix((ddp_status)s);
        CHECKF(name && !strncmp(name, "DDP_", 4), "status %d has name \"%s\"", s, name ? name : "(null)");
        CHECKF(name && !streq(name, "DDP_ERR_UNKNOWN"), "status %d is named DDP_ERR_UNKNOWN", s);
        CHECKF(cause && cause[0], "status %d (%s) has an empty cause", s, name);
        CHECKF(fix && fix[0], "status %d (%s) has an empty fix", s, name);
        for (t = DDP_OK; t < s; t++)
            CHECKF(!streq(ddp_status_name((ddp_status)t), name ? name : ""), "statuses %d and %d share the name %s", t,
                   s, name);
    }
    /* the names follow the enum, not just any order */
    CHECK(streq(ddp_status_name(DDP_OK), "DDP_OK"));
    CHECK(streq(ddp_status_name(DDP_ERR_INVALID_ARGUMENT), "DDP_ERR_INVALID_ARGUMENT"));
    CHECK(streq(ddp_status_name(DDP_ERR_NOT_BUILT), "DDP_ERR_NOT_BUILT"));
    CHECK(streq(ddp_status_name(DDP_ERR_IO), "DDP_ERR_IO"));
    CHECK(streq(ddp_status_name(DDP_ERR_CHECKPOINT), "DDP_ERR_CHECKPOINT"));
    CHECK(streq(ddp_status_name((ddp_status)DDP__STATUS_COUNT), "DDP_ERR_UNKNOWN"));
    CHECK(streq(ddp_status_name((ddp_status)(DDP__STATUS_COUNT + 7)), "DDP_ERR_UNKNOWN"));
    CHECK(streq(ddp_status_name((ddp_status)-1), "DDP_ERR_UNKNOWN"));
    CHECK(ddp__status_cause((ddp_status)-1) != NULL && ddp__status_cause((ddp_status)-1)[0]);
    CHECK(ddp__status_fix((ddp_status)DDP__STATUS_COUNT) != NULL && ddp__status_fix((ddp_status)DDP__STATUS_COUNT)[0]);

    /* last error: set by a failing call, kept until cleared */
    ddp__clear_error();
    CHECK(ddp__last_status() == DDP_OK);
    CHECK(!strcmp(ddp_error_string(), ""));
    CHECK(ddp_device_parse("tpu", &d) == DDP_ERR_INVALID_ARGUMENT);
    CHECK(ddp__last_status() == DDP_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(ddp_error_string(), "\"tpu\"") != NULL, "message \"%s\" does not name \"tpu\"",
           ddp_error_string());
    /* a successful call leaves the last error in place (it is the LAST error, not the last call) */
    CHECK(ddp_device_parse("cpu", &d) == DDP_OK);
    CHECK(ddp__last_status() == DDP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(ddp_error_string(), "tpu") != NULL);
    ddp__clear_error();
    CHECK(ddp__last_status() == DDP_OK);
    CHECK(!strcmp(ddp_error_string(), ""));

    /* per thread: an error on another thread leaves this thread's message alone */
    CHECK(ddp_device_parse("tpu", &d) == DDP_ERR_INVALID_ARGUMENT);
    snprintf(main_msg, sizeof main_msg, "%s", ddp_error_string());
    memset(&tr, 0, sizeof tr);
    tr.before = tr.after = tr.call = (ddp_status)-1;
    CHECK(pthread_create(&th, NULL, error_thread, &tr) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECKF(tr.before == DDP_OK && tr.before_msg[0] == 0,
           "a new thread sees status %s, message \"%s\"", ddp_status_name(tr.before), tr.before_msg);
    CHECK(tr.call == DDP_ERR_IO);
    CHECK(tr.after == DDP_ERR_IO);
    CHECKF(strstr(tr.msg, "thread-file.csv") != NULL, "thread message: %s", tr.msg);
    CHECK(ddp__last_status() == DDP_ERR_INVALID_ARGUMENT);
    CHECKF(!strcmp(ddp_error_string(), main_msg), "main thread's message changed to \"%s\"",
           ddp_error_string());
    CHECK(strstr(ddp_error_string(), "thread-file") == NULL);
    ddp__clear_error();
}

/* ---- 2. logging --------------------------------------------------------------------------------- */

#define LOG_MAX 16
typedef struct {
    int n;
    ddp_log_level level[LOG_MAX];
    char line[LOG_MAX][256];
} log_rec;

static void log_hook(ddp_log_level level, const char* line, void* user) {
    log_rec* r = (log_rec*)user;
    if (r->n < LOG_MAX) {
        r->level[r->n] = level;
        snprintf(r->line[r->n], sizeof r->line[r->n], "%s", line);
    }
    r->n++;
}

/* The child side of the DDP_DEBUG checks: runs in a process forked before any library call, with
   DDP_DEBUG=mode set, so the level is read from it. Prints failures to stdout (a file the parent
   reads) and returns 1 if any check failed. */
static int log_child(const char* mode) {
    log_rec r;
    ddp_device d;
    memset(&r, 0, sizeof r);
    setenv("DDP_DEBUG", mode, 1);
    ddp__set_log(log_hook, &r);
    if (!strcmp(mode, "INFO")) {
        CHECK(ddp__log_level_enabled() == DDP_LOG_INFO);
        ddp__log(DDP_LOG_INFO, "info %s %d", "line", 1);
        ddp__log(DDP_LOG_DETAIL, "detail line");
        ddp__log(DDP_LOG_WARN, "warn line");
        CHECKF(r.n == 2, "got %d lines", r.n);
        CHECK(r.level[0] == DDP_LOG_INFO && !strcmp(r.line[0], "[rank 0/1] info line 1"));
        CHECK(r.level[1] == DDP_LOG_WARN && !strcmp(r.line[1], "[rank 0/1] warning: warn line"));
        /* at INFO, a failing call logs its status and message */
        r.n = 0;
        CHECK(ddp_device_parse("tpu", &d) == DDP_ERR_INVALID_ARGUMENT);
        CHECKF(r.n == 1, "a failing call logged %d lines", r.n);
        CHECKF(r.level[0] == DDP_LOG_INFO && strstr(r.line[0], "DDP_ERR_INVALID_ARGUMENT") &&
                   strstr(r.line[0], "tpu"),
               "failure line: %s", r.line[0]);
    } else if (!strcmp(mode, "DETAIL")) {
        CHECK(ddp__log_level_enabled() == DDP_LOG_DETAIL);
        ddp__log(DDP_LOG_DETAIL, "detail line");
        ddp__log(DDP_LOG_INFO, "info line");
        CHECKF(r.n == 2, "got %d lines", r.n);
        CHECK(r.level[0] == DDP_LOG_DETAIL && !strcmp(r.line[0], "[rank 0/1] detail line"));
        CHECK(r.level[1] == DDP_LOG_INFO && !strcmp(r.line[1], "[rank 0/1] info line"));
    } else { /* an unknown value: warned about on stderr, then treated as the default */
        CHECK(ddp__log_level_enabled() == DDP_LOG_WARN);
        ddp__log(DDP_LOG_INFO, "info line");
        ddp__log(DDP_LOG_WARN, "warn line");
        CHECKF(r.n == 1, "got %d lines", r.n);
        CHECK(!strcmp(r.line[0], "[rank 0/1] warning: warn line"));
    }
    ddp__set_log(NULL, NULL);
    return h_case_failed ? 1 : 0;
}

/* The modes tried in child processes, and what each child reported. */
static const char* const g_log_modes[3] = {"INFO", "DETAIL", "bogus"};
static int g_log_rc[3];

/* Fork one child per mode; its stdout and stderr go to files in g_tmp. Called first in main:
   the level is read from DDP_DEBUG once, so the children must not inherit a level already read. */
static void fork_log_children(void) {
    int k;
    for (k = 0; k < 3; k++) {
        char outp[128], errp[128];
        pid_t pid;
        int st = 0;
        snprintf(outp, sizeof outp, "%s/child_%s.out", g_tmp, g_log_modes[k]);
        snprintf(errp, sizeof errp, "%s/child_%s.err", g_tmp, g_log_modes[k]);
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid == 0) {
            int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            int rc;
            if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0) _exit(126);
            rc = log_child(g_log_modes[k]);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        g_log_rc[k] = (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
    }
}

static void test_logging(void) {
    log_rec r;
    char path[128], buf[4096], out[4096], err[4096];
    int saved, fd, k;

    /* the default level (main unset DDP_DEBUG before any library call) */
    CHECK(ddp__log_level_enabled() == DDP_LOG_WARN);
    memset(&r, 0, sizeof r);
    ddp__set_log(log_hook, &r);
    ddp__log(DDP_LOG_WARN, "disk %s is %d%% full", "sda", 93);
    ddp__log(DDP_LOG_ERROR, "bad %s", "thing");
    ddp__log(DDP_LOG_INFO, "an info line");
    ddp__log(DDP_LOG_DETAIL, "a detail line");
    CHECKF(r.n == 2, "the hook got %d lines, expected 2 (INFO and DETAIL dropped)", r.n);
    CHECKF(r.level[0] == DDP_LOG_WARN && !strcmp(r.line[0], "[rank 0/1] warning: disk sda is 93% full"),
           "line 0 (level %d): \"%s\"", (int)r.level[0], r.line[0]);
    CHECKF(r.level[1] == DDP_LOG_ERROR && !strcmp(r.line[1], "[rank 0/1] error: bad thing"),
           "line 1 (level %d): \"%s\"", (int)r.level[1], r.line[1]);
    /* a long line is cut, not overflowed, and still starts with the prefix */
    {
        static char longmsg[5000];
        memset(longmsg, 'x', sizeof longmsg - 1);
        longmsg[sizeof longmsg - 1] = 0;
        r.n = 0;
        ddp__log(DDP_LOG_WARN, "%s", longmsg);
        CHECK(r.n == 1 && !strncmp(r.line[0], "[rank 0/1] warning: xxx", 23));
    }

    /* NULL restores stderr: the line no longer reaches the hook but appears on stderr */
    ddp__set_log(NULL, NULL);
    r.n = 0;
    snprintf(path, sizeof path, "%s/stderr.txt", g_tmp);
    fflush(stderr);
    saved = dup(2);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && fd >= 0);
    if (saved >= 0 && fd >= 0) {
        dup2(fd, 2);
        ddp__log(DDP_LOG_WARN, "to stderr %d", 5);
        ddp__log(DDP_LOG_INFO, "not shown");
        fflush(stderr);
        dup2(saved, 2);
    }
    if (fd >= 0) close(fd);
    if (saved >= 0) close(saved);
    CHECK(r.n == 0);
    CHECK(slurp(path, buf, sizeof buf) >= 0);
    CHECKF(!strcmp(buf, "[rank 0/1] warning: to stderr 5\n"), "stderr got \"%s\"", buf);

    /* other levels need DDP_DEBUG set before the first call: children forked at the start did that */
    for (k = 0; k < 3; k++) {
        char outp[128], errp[128];
        snprintf(outp, sizeof outp, "%s/child_%s.out", g_tmp, g_log_modes[k]);
        snprintf(errp, sizeof errp, "%s/child_%s.err", g_tmp, g_log_modes[k]);
        if (slurp(outp, out, sizeof out) < 0) out[0] = 0;
        if (slurp(errp, err, sizeof err) < 0) err[0] = 0;
        CHECKF(g_log_rc[k] == 0, "DDP_DEBUG=%s child exited %d; its output:\n%s%s", g_log_modes[k], g_log_rc[k],
               out, err);
        if (!strcmp(g_log_modes[k], "bogus"))
            CHECKF(strstr(err, "DDP_DEBUG=bogus") != NULL, "no warning about DDP_DEBUG=bogus on stderr: \"%s\"", err);
    }
}

/* ---- 3. random numbers ----------------------------------------------------------------------------- */

static int is_permutation(const int* p, int n) {
    static char seen[1000];
    int i;
    memset(seen, 0, sizeof seen);
    for (i = 0; i < n; i++) {
        if (p[i] < 0 || p[i] >= n || seen[p[i]]) return 0;
        seen[p[i]] = 1;
    }
    return 1;
}

static void test_rng(void) {
    ddp_rng a = ddp_rng_seed(123), b = ddp_rng_seed(123), c = ddp_rng_seed(124);
    int i, same = 0, diff = 0, bad = 0, counts[10] = {0};
    double sum = 0, sumsq = 0;
    static const uint32_t ns[] = {1, 2, 3, 7, 10, 1000, 65537, 0x80000001u, 0xffffffffu};
    static int p1[1000], p2[1000], p3[1000];
    static const int sizes[] = {0, 1, 2, 17, 1000};
    int perm_counts[6] = {0};
    size_t k;

    for (i = 0; i < 1000; i++) {
        uint64_t x = ddp__rng_next(&a), y = ddp__rng_next(&b), z = ddp__rng_next(&c);
        same += x == y;
        diff += x != z;
    }
    CHECKF(same == 1000, "the same seed matched %d of 1000 draws", same);
    CHECKF(diff == 1000, "different seeds differed in %d of 1000 draws", diff);
    /* the state is just the seed: a copy continues identically */
    a = ddp_rng_seed(7);
    b = a;
    CHECK(ddp__rng_next(&a) == ddp__rng_next(&b));

    a = ddp_rng_seed(2024);
    for (i = 0; i < 100000; i++) {
        float u = ddp_rng_uniform(&a);
        if (!(u >= 0.f && u < 1.f)) bad++;
        sum += u;
        sumsq += (double)u * u;
    }
    CHECKF(bad == 0, "%d uniform draws outside [0, 1)", bad);
    CHECK_CLOSE(sum / 100000, 0.5, 0, 0.01);
    CHECK_CLOSE(sumsq / 100000 - (sum / 100000) * (sum / 100000), 1.0 / 12, 0, 0.005);

    for (k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        uint32_t n = ns[k], mx = 0;
        bad = 0;
        a = ddp_rng_seed(k + 1);
        for (i = 0; i < 20000; i++) {
            uint32_t v = ddp_rng_below(&a, n);
            if (v >= n) bad++;
            if (v > mx) mx = v;
        }
        CHECKF(bad == 0, "ddp_rng_below(%u) returned %d values >= n", n, bad);
        /* the top of the range is reached for small n, and large n is not squeezed low */
        if (n <= 10) CHECKF(mx == n - 1, "ddp_rng_below(%u) never returned %u", n, n - 1);
        if (n >= 65537) CHECKF(mx > n / 2, "ddp_rng_below(%u) max %u", n, mx);
    }
    a = ddp_rng_seed(99);
    for (i = 0; i < 100000; i++) counts[ddp_rng_below(&a, 10)]++;
    for (i = 0; i < 10; i++) CHECKF(counts[i] >= 9000 && counts[i] <= 11000, "value %d came %d times of 100000", i, counts[i]);

    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k];
        for (i = 0; i < 1000; i++) p1[i] = p2[i] = -7;
        ddp_permutation(n, 5, p1);
        ddp_permutation(n, 5, p2);
        CHECKF(is_permutation(p1, n), "ddp_permutation(%d) is not a permutation", n);
        CHECKF(!memcmp(p1, p2, sizeof p1), "ddp_permutation(%d) differs for the same seed", n);
        CHECKF(p1[n < 1000 ? n : 999] == (n < 1000 ? -7 : p1[999]), "ddp_permutation(%d) wrote past n", n);
    }
    ddp_permutation(1000, 5, p1);
    ddp_permutation(1000, 6, p3);
    CHECK(memcmp(p1, p3, sizeof p1) != 0);
    for (i = 0, same = 0; i < 1000; i++) same += p1[i] == i;
    CHECKF(same < 20, "a shuffle of 1000 left %d elements in place", same);
    /* Fisher-Yates is uniform: each of the 6 orders of 3 elements about 1/6 of the time */
    for (i = 0; i < 60000; i++) {
        int q[3];
        ddp_permutation(3, (uint64_t)i * 7919u + 1u, q);
        perm_counts[q[0] * 2 + (q[1] > q[2])]++;
    }
    for (i = 0; i < 6; i++)
        CHECKF(perm_counts[i] >= 9400 && perm_counts[i] <= 10600, "order %d of 3 came %d times of 60000", i,
               perm_counts[i]);
}

/* ---- 4. f16 --------------------------------------------------------------------------------------- */

/* Reference f32 -> f16 from arithmetic on doubles: scale to an integer significand, rint (round
   to nearest even in the default mode), re-normalise. No bit tricks, no thresholds. */
static uint16_t ref_f16(float f) {
    uint16_t sign = signbit(f) ? 0x8000u : 0;
    double a = fabs((double)f), q;
    int e, E;
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    if (isinf(f)) return (uint16_t)(sign | 0x7c00u);
    if (a < ldexp(1.0, -14)) { /* subnormal: a multiple of 2^-24; 1024 * 2^-24 is the first normal */
        q = rint(ldexp(a, 24));
        return (uint16_t)(sign | (uint16_t)q);
    }
    (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
    E = e - 1;
    q = rint(ldexp(a, 10 - E)); /* significand in [1024, 2048] */
    if (q == 2048) {
        q = 1024;
        E++;
    }
    if (E + 15 >= 31) return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | ((unsigned)(E + 15) << 10) | ((unsigned)q - 1024u));
}
/* Reference f16 -> f32 by arithmetic. */
static double ref_f16_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000u) ? -v : v;
}

static void test_f16(void) {
    unsigned h;
    int bad_rt = 0, bad_val = 0, bad_nan = 0, bad_tie = 0, bad_below = 0, bad_above = 0, bad_ref = 0;
    ddp_rng r = ddp_rng_seed(16);
    long i;

    for (h = 0; h < 65536; h++) {
        float f = ddp_f16_to_f32((uint16_t)h);
        uint16_t back = ddp_f32_to_f16(f);
        if (f16_is_nan((uint16_t)h)) {
            if (!isnan(f) || !f16_is_nan(back) || (back & 0x8000u) != (h & 0x8000u)) bad_nan++;
        } else {
            if (back != h) {
                if (bad_rt++ < 3) printf("    f16 0x%04x -> %g -> 0x%04x\n", h, (double)f, back);
            }
            if ((h & 0x7c00u) == 0x7c00u) {
                if (!isinf(f) || (signbit(f) != 0) != ((h & 0x8000u) != 0)) bad_val++;
            } else if ((double)f != ref_f16_value((uint16_t)h) || (signbit(f) != 0) != ((h & 0x8000u) != 0)) {
                if (bad_val++ < 3) printf("    f16 0x%04x -> %.9g, expected %.9g\n", h, (double)f, ref_f16_value((uint16_t)h));
            }
        }
    }
    CHECKF(bad_rt == 0, "%d f16 patterns do not round-trip", bad_rt);
    CHECKF(bad_val == 0, "%d f16 patterns convert to the wrong f32", bad_val);
    CHECKF(bad_nan == 0, "%d f16 NaNs do not stay NaN (with their sign)", bad_nan);

    CHECK(ddp_f32_to_f16(1.0f) == 0x3C00);
    CHECK(ddp_f32_to_f16(-2.0f) == 0xC000);
    CHECK(ddp_f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(ddp_f32_to_f16(0.0f) == 0x0000);
    CHECK(ddp_f32_to_f16(-0.0f) == 0x8000);
    CHECK(ddp_f32_to_f16((float)ldexp(1.0, -24)) == 0x0001);
    CHECK(ddp_f32_to_f16((float)ldexp(1.0, -14)) == 0x0400);
    CHECK(ddp_f32_to_f16((float)ldexp(1023.0, -24)) == 0x03FF);
    CHECK(ddp_f32_to_f16((float)ldexp(1.0, -26)) == 0x0000); /* below half the smallest subnormal */
    CHECK(ddp_f32_to_f16((float)ldexp(3.0, -26)) == 0x0001); /* 0.75 of it rounds up */
    CHECK(ddp_f32_to_f16(INFINITY) == 0x7C00);
    CHECK(ddp_f32_to_f16(-INFINITY) == 0xFC00);
    CHECK(ddp_f32_to_f16(65520.0f) == 0x7C00);
    CHECK(ddp_f32_to_f16(-65520.0f) == 0xFC00);
    CHECK(ddp_f32_to_f16(65519.0f) == 0x7BFF);
    CHECK(ddp_f32_to_f16(1e10f) == 0x7C00);
    CHECK(ddp_f32_to_f16(FLT_MAX) == 0x7C00);
    CHECK(ddp_f32_to_f16(0.1f) == 0x2E66);
    CHECK(f16_is_nan(ddp_f32_to_f16(NAN)));
    CHECK(f16_is_nan(ddp_f32_to_f16(u2f(0x7f800001u)))); /* signalling NaN with a low payload */
    CHECK(f16_is_nan(ddp_f32_to_f16(u2f(0xff800001u))) && (ddp_f32_to_f16(u2f(0xff800001u)) & 0x8000u));
    CHECK(ddp_f16_to_f32(0x3C00) == 1.0f);
    CHECK(ddp_f16_to_f32(0x0001) == (float)ldexp(1.0, -24));
    CHECK(ddp_f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(isinf(ddp_f16_to_f32(0x7C00)) && ddp_f16_to_f32(0x7C00) > 0);
    CHECK(signbit(ddp_f16_to_f32(0x8000)) && ddp_f16_to_f32(0x8000) == 0.0f);

    /* round to nearest, ties to even, between every pair of adjacent non-negative f16 values
       (the last pair is 65504 and 65536, which is infinity) */
    for (h = 0; h < 0x7C00; h++) {
        double a = ddp_f16_to_f32((uint16_t)h);
        double b = h + 1 == 0x7C00 ? 65536.0 : (double)ddp_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2); /* exact: 12 significant bits */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        uint16_t got = ddp_f32_to_f16(mid), gotneg = ddp_f32_to_f16(-mid);
        uint16_t lo = ddp_f32_to_f16(nextafterf(mid, 0.f)), hi = ddp_f32_to_f16(nextafterf(mid, INFINITY));
        if ((double)mid != (a + b) / 2) bad_tie++;
        if (got != even || gotneg != (even | 0x8000u)) {
            if (bad_tie++ < 3) printf("    midpoint %.9g of 0x%04x/0x%04x -> 0x%04x\n", (double)mid, h, h + 1, got);
        }
        if (lo != h) {
            if (bad_below++ < 3) printf("    just below %.9g -> 0x%04x, expected 0x%04x\n", (double)mid, lo, h);
        }
        if (hi != h + 1) {
            if (bad_above++ < 3) printf("    just above %.9g -> 0x%04x, expected 0x%04x\n", (double)mid, hi, h + 1);
        }
    }
    CHECKF(bad_tie == 0, "%d midpoints not rounded to even", bad_tie);
    CHECKF(bad_below == 0, "%d values just below a midpoint not rounded down", bad_below);
    CHECKF(bad_above == 0, "%d values just above a midpoint not rounded up", bad_above);

    /* against the reference over random floats: exponents from 2^-27 (underflow to 0) through
       2^17 (overflow), every mantissa; one in eight a fully random pattern (NaN, inf, huge, tiny) */
    for (i = 0; i < 1000000; i++) {
        uint64_t z = ddp__rng_next(&r);
        uint32_t bits;
        float f;
        uint16_t got, want;
        if ((z & 7) == 0) bits = (uint32_t)(z >> 32);
        else bits = (uint32_t)((z >> 63) << 31) | ((uint32_t)(127 - 27 + (z >> 40) % 45) << 23) |
                    (uint32_t)((z >> 3) & 0x7fffffu);
        f = u2f(bits);
        got = ddp_f32_to_f16(f);
        want = ref_f16(f);
        if (isnan(f) ? !(f16_is_nan(got) && (got & 0x8000u) == (want & 0x8000u)) : got != want) {
            if (bad_ref++ < 5) printf("    f32 %.9g (0x%08x) -> 0x%04x, reference 0x%04x\n", (double)f, bits, got, want);
        }
    }
    CHECKF(bad_ref == 0, "%d of 1000000 random floats differ from the reference", bad_ref);
}

/* ---- 5. bf16 -------------------------------------------------------------------------------------- */

/* Reference f32 -> bf16: the two candidates around x are its 32-bit pattern cut to the upper 16
   bits and the next pattern up in magnitude; pick the nearer by exact double arithmetic, the
   one with an even last bit on a tie. The pattern after the largest finite one is infinity,
   which counts as 2^128. */
static uint16_t ref_bf16(float f) {
    uint32_t x = f2u(f), lo = x & 0xffff0000u, hi = lo + 0x10000u;
    double d, dl, dh;
    if (lo == x) return (uint16_t)(x >> 16);
    d = fabs((double)f);
    dl = fabs((double)u2f(lo));
    dh = (hi & 0x7fffffffu) == 0x7f800000u ? ldexp(1.0, 128) : fabs((double)u2f(hi));
    if (d - dl < dh - d) return (uint16_t)(lo >> 16);
    if (dh - d < d - dl) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1u) ? (hi >> 16) : (lo >> 16));
}

static void test_bf16(void) {
    unsigned h;
    int bad_rt = 0, bad_nan = 0, bad_exact = 0, bad_ref = 0;
    ddp_rng r = ddp_rng_seed(17);
    long i;
    static const uint32_t nans[] = {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0xff800001u, 0xffc00000u, 0x7f80ffffu,
                                    0x7fbfffffu};
    size_t k;

    for (h = 0; h < 65536; h++) {
        float f = ddp_bf16_to_f32((uint16_t)h);
        uint16_t back = ddp_f32_to_bf16(f);
        if (f2u(f) != (uint32_t)h << 16) bad_exact++;
        if (bf16_is_nan((uint16_t)h)) {
            if (!isnan(f) || !bf16_is_nan(back) || (back & 0x8000u) != (h & 0x8000u)) bad_nan++;
        } else if (back != h) {
            if (bad_rt++ < 3) printf("    bf16 0x%04x -> %g -> 0x%04x\n", h, (double)f, back);
        }
    }
    CHECKF(bad_exact == 0, "%d bf16 patterns do not widen exactly", bad_exact);
    CHECKF(bad_rt == 0, "%d bf16 patterns do not round-trip", bad_rt);
    CHECKF(bad_nan == 0, "%d bf16 NaNs do not stay NaN", bad_nan);

    CHECK(ddp_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(ddp_f32_to_bf16(1.0f + (float)ldexp(1.0, -8)) == 0x3F80);      /* tie -> even 1.0 */
    CHECK(ddp_f32_to_bf16(1.0f + (float)ldexp(3.0, -8)) == 0x3F82);      /* tie -> even 1 + 2^-6 */
    CHECK(ddp_f32_to_bf16(nextafterf(1.0f + (float)ldexp(1.0, -8), 2.f)) == 0x3F81); /* above the tie */
    CHECK(ddp_f32_to_bf16(-1.0f - (float)ldexp(1.0, -8)) == 0xBF80);
    CHECK(ddp_f32_to_bf16(INFINITY) == 0x7F80);
    CHECK(ddp_f32_to_bf16(-INFINITY) == 0xFF80);
    CHECK(ddp_f32_to_bf16(FLT_MAX) == 0x7F80); /* above the midpoint to 2^128: rounds to infinity */
    CHECK(ddp_f32_to_bf16(u2f(0x7f7f7fffu)) == 0x7F7F);
    CHECK(ddp_f32_to_bf16(u2f(0x7f7f8000u)) == 0x7F80); /* tie, 0x7F7F is odd */
    CHECK(ddp_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(ddp_f32_to_bf16(u2f(0x00008000u)) == 0x0000); /* subnormal tie to even 0 */
    CHECK(ddp_f32_to_bf16(u2f(0x00018000u)) == 0x0002);
    CHECK(isinf(ddp_bf16_to_f32(0x7F80)) && isinf(ddp_bf16_to_f32(0xFF80)) && ddp_bf16_to_f32(0xFF80) < 0);
    for (k = 0; k < sizeof nans / sizeof nans[0]; k++) {
        uint16_t b = ddp_f32_to_bf16(u2f(nans[k]));
        CHECKF(bf16_is_nan(b) && (b & 0x8000u) == ((nans[k] >> 16) & 0x8000u), "NaN 0x%08x -> bf16 0x%04x", nans[k], b);
    }

    for (i = 0; i < 1000000; i++) {
        uint64_t z = ddp__rng_next(&r);
        uint32_t bits = (uint32_t)(z >> 32);
        float f;
        uint16_t got, want;
        if ((z & 3) == 0) bits = (bits & 0xffff0000u) | 0x8000u; /* many exact ties */
        f = u2f(bits);
        got = ddp_f32_to_bf16(f);
        if (isnan(f)) {
            if (!bf16_is_nan(got)) bad_ref++;
            continue;
        }
        want = ref_bf16(f);
        if (got != want) {
            if (bad_ref++ < 5) printf("    f32 0x%08x -> bf16 0x%04x, reference 0x%04x\n", bits, got, want);
        }
    }
    CHECKF(bad_ref == 0, "%d of 1000000 random floats differ from the reference", bad_ref);
}

/* ---- 6. ddp__convert and dtypes -------------------------------------------------------------------- */

static void test_convert(void) {
    enum { N = 4096 };
    static float src[N], back[N], copy[N];
    static uint16_t half[N], all16[65536], ref16[65536];
    static float wide[65536];
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    ddp_rng r = ddp_rng_seed(6);
    int i, bad;

    for (i = 0; i < N; i++) {
        uint64_t z = ddp__rng_next(&r);
        src[i] = (i % 4 == 0) ? u2f((uint32_t)(z >> 32))
                              : (float)((ddp_rng_uniform(&r) - 0.5f) * ldexp(1.0, (int)(z % 50) - 30));
    }
    src[0] = NAN;
    src[1] = INFINITY;
    src[2] = -0.0f;
    src[3] = 65520.0f;
    src[4] = (float)ldexp(1.0, -25);

    CHECK_OK(ddp__convert(cpu, DDP_F16, half, DDP_F32, src, N, NULL));
    for (i = 0, bad = 0; i < N; i++) bad += half[i] != ddp_f32_to_f16(src[i]);
    CHECKF(bad == 0, "f32 -> f16: %d elements differ from ddp_f32_to_f16", bad);
    CHECK_OK(ddp__convert(cpu, DDP_F32, back, DDP_F16, half, N, NULL));
    for (i = 0, bad = 0; i < N; i++) bad += f2u(back[i]) != f2u(ddp_f16_to_f32(half[i]));
    CHECKF(bad == 0, "f16 -> f32: %d elements differ from ddp_f16_to_f32", bad);

    CHECK_OK(ddp__convert(cpu, DDP_BF16, half, DDP_F32, src, N, NULL));
    for (i = 0, bad = 0; i < N; i++) bad += half[i] != ddp_f32_to_bf16(src[i]);
    CHECKF(bad == 0, "f32 -> bf16: %d elements differ from ddp_f32_to_bf16", bad);
    CHECK_OK(ddp__convert(cpu, DDP_F32, back, DDP_BF16, half, N, NULL));
    for (i = 0, bad = 0; i < N; i++) bad += f2u(back[i]) != f2u(ddp_bf16_to_f32(half[i]));
    CHECKF(bad == 0, "bf16 -> f32: %d elements differ from ddp_bf16_to_f32", bad);

    /* every 16-bit pattern, both formats, widening */
    for (i = 0; i < 65536; i++) all16[i] = (uint16_t)i;
    CHECK_OK(ddp__convert(cpu, DDP_F32, wide, DDP_F16, all16, 65536, NULL));
    for (i = 0, bad = 0; i < 65536; i++) bad += f2u(wide[i]) != f2u(ddp_f16_to_f32((uint16_t)i));
    CHECKF(bad == 0, "f16 -> f32 over all patterns: %d differ", bad);
    CHECK_OK(ddp__convert(cpu, DDP_F32, wide, DDP_BF16, all16, 65536, NULL));
    for (i = 0, bad = 0; i < 65536; i++) bad += f2u(wide[i]) != (uint32_t)i << 16;
    CHECKF(bad == 0, "bf16 -> f32 over all patterns: %d differ", bad);

    /* DEFAULT means f32 on either side */
    memset(ref16, 0, sizeof ref16);
    CHECK_OK(ddp__convert(cpu, DDP_F16, ref16, DDP_DTYPE_DEFAULT, src, N, NULL));
    for (i = 0, bad = 0; i < N; i++) bad += ref16[i] != ddp_f32_to_f16(src[i]);
    CHECKF(bad == 0, "DEFAULT -> f16: %d elements differ from ddp_f32_to_f16", bad);
    CHECK_OK(ddp__convert(cpu, DDP_DTYPE_DEFAULT, back, DDP_BF16, all16, N, NULL));
    for (i = 0, bad = 0; i < N; i++) bad += f2u(back[i]) != (uint32_t)i << 16;
    CHECKF(bad == 0, "bf16 -> DEFAULT: %d elements differ", bad);

    /* only conversions through f32 */
    CHECK_FAILS(ddp__convert(cpu, DDP_BF16, half, DDP_F16, all16, N, NULL), DDP_ERR_INVALID_ARGUMENT, "f16 -> bf16");
    CHECK_FAILS(ddp__convert(cpu, DDP_F16, half, DDP_BF16, all16, N, NULL), DDP_ERR_INVALID_ARGUMENT, "bf16 -> f16");
    CHECK_FAILS(ddp__convert(cpu, DDP_F16, half, DDP_F16, all16, N, NULL), DDP_ERR_INVALID_ARGUMENT, "f16 -> f16");
    CHECK_FAILS(ddp__convert(cpu, (ddp_dtype)9, half, DDP_F32, src, N, NULL), DDP_ERR_INVALID_ARGUMENT, "f32 -> ?");
    CHECK_FAILS(ddp__convert(cpu, DDP_F32, back, (ddp_dtype)9, half, N, NULL), DDP_ERR_INVALID_ARGUMENT, "? -> f32");

    /* f32 -> f32 is a copy, bit for bit (NaN included); count 0 writes nothing */
    memset(copy, 0, sizeof copy);
    CHECK_OK(ddp__convert(cpu, DDP_F32, copy, DDP_F32, src, N, NULL));
    CHECK(!memcmp(copy, src, sizeof src));
    copy[0] = 42.f;
    CHECK_OK(ddp__convert(cpu, DDP_F16, half, DDP_F32, copy, 0, NULL));
    CHECK_OK(ddp__convert(cpu, DDP_F32, copy, DDP_F32, src, 0, NULL));
    CHECK(copy[0] == 42.f);

    CHECK(ddp_dtype_size(DDP_DTYPE_DEFAULT) == 4);
    CHECK(ddp_dtype_size(DDP_F32) == 4);
    CHECK(ddp_dtype_size(DDP_F16) == 2);
    CHECK(ddp_dtype_size(DDP_BF16) == 2);
    CHECK(ddp_dtype_size((ddp_dtype)9) == 0);
    CHECK(!strcmp(ddp__dtype_name(DDP_DTYPE_DEFAULT), "f32"));
    CHECK(!strcmp(ddp__dtype_name(DDP_F32), "f32"));
    CHECK(!strcmp(ddp__dtype_name(DDP_F16), "f16"));
    CHECK(!strcmp(ddp__dtype_name(DDP_BF16), "bf16"));
    CHECK(!strcmp(ddp__dtype_name((ddp_dtype)9), "?"));
}

/* ---- 7. devices ------------------------------------------------------------------------------------ */

static void test_devices(void) {
    ddp_device d, r;
    char buf[32];
    static const char* bad[] = {"cuda:", "cuda:-1", "cuda:x", "tpu", "cuda:1x", "CPU", "", "cuda: 3", "cuda:+3"};
    size_t k;
    const char* reason;

    d.type = DDP_DEVICE_CUDA;
    d.index = 5;
    CHECK_OK(ddp_device_parse("cpu", &d));
    CHECK(d.type == DDP_DEVICE_CPU && d.index == 0);
    CHECK_OK(ddp_device_parse("cuda", &d));
    CHECK(d.type == DDP_DEVICE_CUDA && d.index == 0);
    CHECK_OK(ddp_device_parse("cuda:3", &d));
    CHECK(d.type == DDP_DEVICE_CUDA && d.index == 3);
    CHECK_OK(ddp_device_parse("cuda:0", &d));
    CHECK(d.type == DDP_DEVICE_CUDA && d.index == 0);
    CHECK_OK(ddp_device_parse("auto", &d));
    CHECK(d.type == DDP_DEVICE_AUTO && d.index == 0);
    d.type = DDP_DEVICE_CPU;
    CHECK_OK(ddp_device_parse(NULL, &d));
    CHECK(d.type == DDP_DEVICE_AUTO);
    for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char quoted[64];
        const char* want = quoted;
        snprintf(quoted, sizeof quoted, "\"%s\"", bad[k]);
        CHECK_FAILS(ddp_device_parse(bad[k], &d), DDP_ERR_INVALID_ARGUMENT, want);
    }

    d.type = DDP_DEVICE_CPU;
    d.index = 0;
    CHECK(!strcmp(ddp_device_name(d, buf, sizeof buf), "cpu"));
    d.type = DDP_DEVICE_CUDA;
    d.index = 2;
    CHECK(ddp_device_name(d, buf, sizeof buf) == buf && !strcmp(buf, "cuda:2"));
    d.index = 17;
    CHECK(!strcmp(ddp_device_name(d, buf, sizeof buf), "cuda:17"));

    d.type = DDP_DEVICE_CPU;
    d.index = 3;
    CHECK_OK(ddp_device_resolve(d, &r));
    CHECK(r.type == DDP_DEVICE_CPU && r.index == 0);
    CHECK_OK(ddp__device_activate(r));

    reason = ddp__cuda_unavailable_reason();
    CHECK(reason != NULL);
#if defined(DDP_NO_CUDA)
    CHECK(ddp__cuda_device_count() == 0);
#endif
    if (ddp__cuda_device_count() > 0) {
        CHECK(!strcmp(reason, ""));
        SKIP("%d CUDA device(s) visible: the no-GPU resolve checks do not apply", ddp__cuda_device_count());
    }
    CHECKF(reason[0] != 0, "no GPU, yet ddp__cuda_unavailable_reason() is empty");
    d.type = DDP_DEVICE_AUTO;
    d.index = 1;
    CHECK_OK(ddp_device_resolve(d, &r));
    CHECK(r.type == DDP_DEVICE_CPU && r.index == 0);
    d.type = DDP_DEVICE_CUDA;
    d.index = 0;
#if defined(DDP_NO_CUDA)
    CHECK_FAILS(ddp_device_resolve(d, &r), DDP_ERR_NOT_BUILT, reason);
    CHECK(strstr(reason, "DDP_NO_CUDA") != NULL);
#else
    CHECK_FAILS(ddp_device_resolve(d, &r), DDP_ERR_NO_GPU, reason);
#endif
    CHECK(strstr(ddp_error_string(), "cuda:0") != NULL);
}

/* ---- 8. memory, streams, events on the CPU ----------------------------------------------------------- */

/* Leave garbage in freed blocks of these sizes so that a missing memset would show. */
static void dirty_heap(size_t n) {
    int i;
    void* p[4];
    for (i = 0; i < 4; i++) {
        p[i] = malloc(n);
        if (p[i]) memset(p[i], 0xAB, n);
    }
    for (i = 3; i >= 0; i--) free(p[i]);
}
static int all_zero(const void* p, size_t n) {
    const unsigned char* c = (const unsigned char*)p;
    size_t i;
    for (i = 0; i < n; i++)
        if (c[i]) return 0;
    return 1;
}

static void test_memory_streams(void) {
    ddp_device cpu = {DDP_DEVICE_CPU, 0};
    static const size_t sizes[] = {1, 24, 1000, 4096, 200000};
    size_t k;
    void* p = (void*)&k;
    unsigned char *a, *b;
    ddp_stream* s = NULL;
    ddp_event* e = NULL;
    int done = -1, i;

    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        dirty_heap(sizes[k]);
        p = NULL;
        CHECK_OK(ddp_alloc(cpu, sizes[k], &p));
        CHECK(p != NULL);
        if (p) {
            CHECKF(all_zero(p, sizes[k]), "ddp_alloc(%zu) is not zero-filled", sizes[k]);
            memset(p, 1, sizes[k]); /* writable to the end */
        }
        ddp_free(cpu, p);
    }
    p = (void*)&k;
    CHECK_OK(ddp_alloc(cpu, 0, &p));
    CHECK(p == NULL);
    ddp_free(cpu, NULL);

    CHECK_OK(ddp_alloc(cpu, 256, (void**)&a));
    CHECK_OK(ddp_alloc(cpu, 256, (void**)&b));
    if (a && b) {
        for (i = 0; i < 256; i++) a[i] = (unsigned char)(i * 7 + 1);
        CHECK_OK(ddp_copy(cpu, b, cpu, a, 200, NULL));
        CHECK(!memcmp(a, b, 200) && all_zero(b + 200, 56));
        CHECK_OK(ddp_copy(cpu, b + 200, cpu, a, 0, NULL));
        CHECK(all_zero(b + 200, 56));
        CHECK_OK(ddp__zero(cpu, a + 10, 100, NULL));
        CHECK(all_zero(a + 10, 100) && a[9] == (unsigned char)(9 * 7 + 1) && a[110] == (unsigned char)(110 * 7 + 1));
        CHECK_OK(ddp__zero(cpu, a, 0, NULL));
        CHECK(a[0] == 1);
    }
    ddp_free(cpu, a);
    ddp_free(cpu, b);

    dirty_heap(3000);
    p = NULL;
    CHECK_OK(ddp_alloc_pinned(3000, &p));
    CHECK(p != NULL);
    if (p) {
        CHECK(all_zero(p, 3000));
        memset(p, 0x5A, 3000);
        CHECK(((unsigned char*)p)[2999] == 0x5A);
    }
    ddp_free_pinned(p);
    p = (void*)&k;
    CHECK_OK(ddp_alloc_pinned(0, &p));
    CHECK(p == NULL);
    ddp_free_pinned(NULL);

    /* streams and events: on the CPU, work is done when issued */
    CHECK_OK(ddp__stream_create(cpu, &s));
    CHECK(s != NULL);
    CHECK_OK(ddp__event_create(cpu, &e));
    CHECK(e != NULL);
    if (s && e) {
        float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {0};
        CHECK(ddp__stream_native(s) == NULL);
        CHECK_OK(ddp_copy(cpu, y, cpu, x, sizeof x, s));
        CHECK_OK(ddp__event_record(e, s));
        CHECK_OK(ddp__stream_wait_event(s, e));
        CHECK_OK(ddp__event_sync(e));
        CHECK_OK(ddp__event_query(e, &done));
        CHECK(done == 1);
        CHECK_OK(ddp_stream_sync(s));
        CHECK(!memcmp(x, y, sizeof x));
        CHECK_OK(ddp__zero(cpu, y, sizeof y, s));
        CHECK_OK(ddp_stream_sync(s));
        CHECK(all_zero(y, sizeof y));
        CHECK_OK(ddp__event_record(e, NULL)); /* the default stream */
    }
    CHECK_OK(ddp_stream_sync(NULL));
    CHECK(ddp__stream_native(NULL) == NULL);
    ddp__event_destroy(e);
    ddp__stream_destroy(s);
    ddp__event_destroy(NULL);
    ddp__stream_destroy(NULL);
    ddp__free_host(NULL);
}

/* ---- 9. build information and kernels ------------------------------------------------------------------ */

static void test_build_info(void) {
    const char* info = ddp_build_info();
    char* ptx = (char*)&info;
    size_t nbytes = 99;
    CHECK(info != NULL);
    CHECKF(strstr(info, "ddp.h 0.1.0") != NULL, "build info: %s", info);
    CHECK(ddp_build_info() == info); /* built once */
#if defined(DDP_CBLAS)
    CHECKF(strstr(info, "CBLAS") != NULL, "build info: %s", info);
#else
    CHECKF(strstr(info, "built-in blocked loop") != NULL, "build info: %s", info);
#endif
#if defined(DDP_NO_CUDA)
    CHECKF(strstr(info, "CPU only") != NULL, "build info: %s", info);
    CHECK(strstr(info, "CUDA runtime") == NULL);
    CHECK(ddp__kernel_count() == 0);
    CHECK(ddp__kernel_name(0) == NULL);
    CHECK_FAILS(ddp__kernels_compile_ptx("compute_80", &ptx, &nbytes), DDP_ERR_NOT_BUILT, "DDP_NO_CUDA");
    CHECK(ptx == NULL && nbytes == 0);
#else
    {
        int i, n = ddp__kernel_count();
        CHECKF(strstr(info, "CUDA runtime") != NULL, "build info: %s", info);
        CHECK(strstr(info, "CPU only") == NULL);
        CHECK(n > 0);
        for (i = 0; i < n; i++) {
            const char* name = ddp__kernel_name(i);
            CHECKF(name && !strncmp(name, "ddp_k_", 6), "kernel %d is named %s", i, name ? name : "(null)");
        }
        CHECK(ddp__kernel_name(n) == NULL && ddp__kernel_name(-1) == NULL);
        (void)ptx;
        (void)nbytes;
    }
#endif
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ddp_test_basics.XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    /* No library call may come before these two lines: the log level is read from DDP_DEBUG
       once. The children set it; this process unsets it for the default-level checks. */
    fork_log_children();
    unsetenv("DDP_DEBUG");
    RUN(test_status_and_errors);
    RUN(test_logging);
    RUN(test_rng);
    RUN(test_f16);
    RUN(test_bf16);
    RUN(test_convert);
    RUN(test_devices);
    RUN(test_memory_streams);
    RUN(test_build_info);
    h_remove_tree(g_tmp);
    return H_EXIT();
}
