/* labs/measure/test.c: the tests of lab "measure", built together with the student's file and
   ddp.h's implementation.

   The cases named exact_* measure nothing: the relay's sums and bytes on 3 ranks, the fit on
   made-up measurements (exact, and with noise from the seed, LAB_SEED), the step time against a
   simulation of the pipeline, the best bucket against a search. They give the same verdict on
   every machine. The cases named live_* measure this machine: ddp_all_reduce's ring against the
   student's relay on 3 ranks, and on 2 ranks over a simulated network (DDP_SIMULATE_LATENCY_US,
   DDP_SIMULATE_NS_PER_BYTE) the all-reduce's time by size, then a sweep of bucket sizes with a
   backward pass that makes gradients at a steady rate while the buckets travel. They are graded
   on consistency (does the fitted line follow the measurements? is the predicted best bucket
   within a factor of 2 of the measured one?), never on how fast anything is. */
#include "../lab_test.h"

#include <math.h>

#include "ddp.h"
#include "measure.h"

/* ---- exact: the relay ---------------------------------------------------------------------- */

#define RELAY_W 3
typedef struct relay_out {
    int done, bad;
    uint64_t sent[8];
    char message[512];
} relay_out;

static const size_t g_relay_counts[5] = {1, 7, 1000, 65537, 250000};

static float rvalue(int r, size_t i) { return (float)((int)((i * 5 + (size_t)r * 11) % 13) - 6) + 0.25f * (float)r; }

static int relay_rank(int rank, void* arg) {
    relay_out* o = (relay_out*)arg;
    ddp_desc d;
    ddp_pg* pg;
    int c;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 20;
    if (ddp_init(&d, &pg) != DDP_OK) {
        snprintf(o->message, sizeof o->message, "ddp_init: %s", ddp_error_string());
        return 1;
    }
    for (c = 0; c < 5; c++) {
        size_t n = g_relay_counts[c], i;
        float* buf = (float*)malloc(n * sizeof(float));
        uint64_t s0, s1;
        if (!buf) return 1;
        for (i = 0; i < n; i++) buf[i] = rvalue(rank, i);
        ddp_pg_bytes(pg, &s0, NULL);
        lab_relay_all_reduce(pg, buf, n);
        ddp_pg_bytes(pg, &s1, NULL);
        if (rank == 0) o->sent[c] = s1 - s0;
        for (i = 0; i < n; i++) {
            float want = 0;
            int q;
            for (q = 0; q < RELAY_W; q++) want += rvalue(q, i);
            if (buf[i] != want && !o->bad++)
                snprintf(o->message, sizeof o->message, "[rule M1: the relay leaves the sum on every rank] count = %zu: "
                         "rank %d has buf[%zu] = %g, expected %g", n, rank, i, (double)buf[i], (double)want);
        }
        free(buf);
    }
    ddp_destroy(pg);
    if (rank == 0) o->done = 1;
    return 0;
}

static void exact_relay_sums_and_bytes(void) {
    relay_out* o = (relay_out*)lab_shared(sizeof(relay_out));
    int c;
    if (!o) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_need_loopback();
    if (ddp_spawn(RELAY_W, relay_rank, o) != DDP_OK || !o->done) {
        lab_failf("the %d ranks did not finish: %s %s", RELAY_W, ddp_error_string(), o->message);
        return;
    }
    if (o->bad) {
        lab_failf("%s", o->message);
        return;
    }
    for (c = 0; c < 5; c++) {
        uint64_t want = (uint64_t)(RELAY_W - 1) * g_relay_counts[c] * 4;
        EXPECT(o->sent[c] == want,
               "[rule M1: the relay moves every rank's whole buffer, (W-1) x S bytes per rank] count = %zu floats (S = "
               "%zu bytes) on %d ranks: rank 0 sent %llu bytes, expected %llu%s", g_relay_counts[c],
               g_relay_counts[c] * 4, RELAY_W, (unsigned long long)o->sent[c], (unsigned long long)want,
               o->sent[c] < want ? " (is it the ring, ddp_all_reduce, instead?)" : "");
    }
}

/* ---- exact: the fit ------------------------------------------------------------------------- */

static const char* fmt_line(lab_line l) {
    static char b[2][96];
    static int w;
    w ^= 1;
    snprintf(b[w], sizeof b[w], "alpha = %.4g us, beta = %.4g ns/byte", l.alpha_s * 1e6, l.beta_s_per_byte * 1e9);
    return b[w];
}

static void exact_fit_of_a_line(void) {
    double x[15], t[15];
    lab_line want, got;
    int i;
    want.alpha_s = 30e-6, want.beta_s_per_byte = 0.25e-9;
    for (i = 0; i < 15; i++) x[i] = 1024.0 * (double)(1 << i), t[i] = want.alpha_s + want.beta_s_per_byte * x[i];
    got = lab_fit(x, t, 15);
    EXPECT(fabs(got.alpha_s - want.alpha_s) <= 1e-6 * want.alpha_s &&
           fabs(got.beta_s_per_byte - want.beta_s_per_byte) <= 1e-6 * want.beta_s_per_byte,
           "[rule M2: the line through the measurements] 15 points exactly on the line %s, sizes 1 KiB to 16 MiB: your "
           "fit says %s", fmt_line(want), fmt_line(got));
    got = lab_fit(x + 3, t + 3, 2);
    EXPECT(fabs(got.alpha_s - want.alpha_s) <= 1e-6 * want.alpha_s &&
           fabs(got.beta_s_per_byte - want.beta_s_per_byte) <= 1e-6 * want.beta_s_per_byte,
           "[rule M2: the line through the measurements] two points on the line %s: your fit says %s", fmt_line(want),
           fmt_line(got));
}

/* Measurements with up to 10% of noise each, as on a real machine: the small sizes must count as
   much as the large ones, or alpha is lost in the large sizes' noise. */
static void exact_fit_with_relative_noise(void) {
    lab_rng g;
    int trial, i;
    lab_rng_seed(&g, lab_seed(), 51);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    for (trial = 0; trial < 6; trial++) {
        double x[15], t[15];
        lab_line want, got;
        want.alpha_s = (20 + 80 * lab_rng_uniform(&g)) * 1e-6;
        want.beta_s_per_byte = (0.2 + 2 * lab_rng_uniform(&g)) * 1e-9;
        for (i = 0; i < 15; i++) {
            x[i] = 1024.0 * (double)(1 << i);
            t[i] = (want.alpha_s + want.beta_s_per_byte * x[i]) * (1 + 0.1 * (2 * lab_rng_uniform(&g) - 1));
        }
        got = lab_fit(x, t, 15);
        if (!(fabs(got.alpha_s - want.alpha_s) <= 0.2 * want.alpha_s &&
              fabs(got.beta_s_per_byte - want.beta_s_per_byte) <= 0.1 * want.beta_s_per_byte)) {
            lab_failf("[rule M2: fit the relative error: every size counts alike] made-up measurements of the line %s, "
                      "sizes 1 KiB to 16 MiB, each off by up to 10%%: your fit says %s; alpha should come out within "
                      "20%%, beta within 10%%. (A 10%% error on 16 MiB is thousands of times alpha: a fit of the plain "
                      "error lets it decide alpha.)", fmt_line(want), fmt_line(got));
            return;
        }
    }
}

/* ---- exact: the step time and the best bucket ---------------------------------------------- */

/* The pipeline, bucket by bucket: bucket k is complete when backward has made its last byte; the
   network takes one bucket at a time, in order. */
static double simulate(lab_line net, double S, double tau, double B) {
    double done = 0, end = 0, free_at = 0;
    while (done < S * (1 - 1e-12)) {
        double size = S - done < B ? S - done : B, ready;
        done += size;
        ready = done * tau;
        end = (ready > free_at ? ready : free_at) + net.alpha_s + net.beta_s_per_byte * size;
        free_at = end;
    }
    return end;
}

static int expect_step_time(lab_line net, double S, double tau, double B) {
    double want = simulate(net, S, tau, B), got = lab_step_time(net, S, tau, B);
    if (fabs(got - want) <= 1e-9 * want) return 1;
    lab_failf("[rule M3: the step ends when the last bucket's all-reduce ends] %s, %.4g MB of gradients made at %.4g "
              "ns/byte, buckets of %.4g MB (%d of them%s): expected %.6g ms, your model says %.6g ms", fmt_line(net),
              S / 1e6, tau * 1e9, B / 1e6, (int)ceil(S / B - 1e-9), fmod(S, B) > 1e-9 * S ? ", the last smaller" : "",
              want * 1e3, got * 1e3);
    if (net.beta_s_per_byte < tau)
        lab_note("  (here the network is faster than backward makes gradients: can it keep up with them?)");
    return 0;
}

static void exact_step_time_network_slower_than_backward(void) {
    lab_line net;
    net.alpha_s = 1e-3, net.beta_s_per_byte = 4.4e-9;
    if (expect_step_time(net, 16e6, 4e-9, 2e6)) /* 8 buckets */
        if (expect_step_time(net, 16e6, 4e-9, 16e6))
            expect_step_time(net, 16e6, 4e-9, 250e3);
}

static void exact_step_time_network_faster_than_backward(void) {
    lab_line net;
    net.alpha_s = 50e-6, net.beta_s_per_byte = 0.5e-9;
    if (expect_step_time(net, 100e6, 2e-9, 1e6)) /* keeps up */
        if (expect_step_time(net, 100e6, 2e-9, 20e3)) /* too many latencies: it cannot */
            expect_step_time(net, 100e6, 2e-9, 100e6);
}

static void exact_step_time_uneven_buckets(void) {
    lab_line net;
    net.alpha_s = 200e-6, net.beta_s_per_byte = 1e-9;
    if (expect_step_time(net, 10e6, 3e-9, 3e6)) /* 3, 3, 3, 1 MB */
        expect_step_time(net, 10e6, 0.5e-9, 3e6);
}

/* A random setting from the seed: 100 kB to 100 MB of gradients made at 0.1 to 10 ns/byte, a
   network of 1 us to 1 ms latency and 0.1 to 10 ns/byte. */
static lab_line random_setting(lab_rng* g, double* S, double* tau) {
    lab_line net;
    *S = 1e5 * pow(10, 3 * lab_rng_uniform(g));
    *tau = (0.1 + 10 * lab_rng_uniform(g)) * 1e-9;
    net.alpha_s = pow(10, -6 + 3 * lab_rng_uniform(g));
    net.beta_s_per_byte = (0.1 + 10 * lab_rng_uniform(g)) * 1e-9;
    return net;
}

/* The best step time over buckets from S/10000 to S, by search. */
static double best_by_search(lab_line net, double S, double tau) {
    double best = simulate(net, S, tau, S);
    int i;
    for (i = 0; i <= 4000; i++) {
        double t = simulate(net, S, tau, S * pow(10, -4.0 * i / 4000));
        if (t < best) best = t;
    }
    return best;
}

static int expect_best_bucket(lab_line net, double S, double tau) {
    static int calls;
    double t0 = lab_now(), b = lab_best_bucket(net, S, tau), best, t;
    lab_progress("lab_best_bucket returned %d time(s), the last after %.2f s", ++calls, lab_now() - t0);
    best = best_by_search(net, S, tau);
    if (!(b > 0 && b <= S * (1 + 1e-9))) {
        lab_failf("[rule M4: the best bucket size is in (0, S]] %s, S = %.4g MB, tau = %.4g ns/byte: your best bucket is "
                  "%.6g bytes", fmt_line(net), S / 1e6, tau * 1e9, b);
        return 0;
    }
    t = simulate(net, S, tau, b);
    if (t <= 1.01 * best) return 1;
    lab_failf("[rule M4: the best bucket makes the step shortest] %s, S = %.4g MB, tau = %.4g ns/byte: with your best "
              "bucket, %.4g MB, the step takes %.6g ms; the best bucket size gives %.6g ms", fmt_line(net), S / 1e6,
              tau * 1e9, b / 1e6, t * 1e3, best * 1e3);
    return 0;
}

/* What "too slow" means for lab_best_bucket, said when a case runs out of time. */
#define SLOW_BEST "Too slow rather than stuck: the reference answers in microseconds. lab_best_bucket should " \
                  "find the size from where the two costs balance (rule M4) and check a few sizes around it with " \
                  "lab_step_time, not try every size"

static void exact_best_bucket(void) {
    /* alpha (s), beta (s/byte), S (bytes), tau (s/byte) */
    static const double cases[5][4] = {
        {1e-3, 4.4e-9, 16.0 * 1048576, 4e-9},   /* the live case's network */
        {1e-3, 4.4e-9, 16.0 * 1048576, 0.4e-9}, /* a backward ten times faster than the network */
        {50e-6, 0.5e-9, 100e6, 2e-9},           /* a network faster than backward */
        {50e-6, 0.5e-9, 1e6, 2e-9},
        {1e-3, 4.4e-9, 1e5, 4e-9},              /* one bucket is best */
    };
    int k;
    lab_slow_hint(SLOW_BEST);
    for (k = 0; k < 5; k++) {
        lab_line net;
        net.alpha_s = cases[k][0], net.beta_s_per_byte = cases[k][1];
        if (!expect_best_bucket(net, cases[k][2], cases[k][3])) return;
    }
}

/* Settings from the seed: 40 step times (best = 0) or 20 best buckets (best = 1). */
static void random_settings(int best) {
    lab_rng g;
    int k;
    lab_rng_seed(&g, lab_seed(), (uint64_t)(52 + best));
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    if (best) lab_slow_hint(SLOW_BEST);
    for (k = 0; k < (best ? 20 : 40); k++) {
        double S, tau;
        lab_line net = random_setting(&g, &S, &tau);
        if (best ? !expect_best_bucket(net, S, tau) : !expect_step_time(net, S, tau, S * pow(10, -3 * lab_rng_uniform(&g))))
            return;
    }
}
static void exact_step_time_random(void) { random_settings(0); }
static void exact_best_bucket_random(void) { random_settings(1); }

/* ---- live: this machine --------------------------------------------------------------------- */

#define MAX_SIZES 16
#define REPS 5
#define PARAM_FLOATS 4096                  /* a "parameter" of the sweep: 16 KiB */
#define NPARAMS 1024                       /* 16 MiB of gradients */
#define SIM_LATENCY_US "1000"              /* the simulated network: 1 ms per all-reduce */
#define SIM_NS_PER_BYTE "4.4"              /* and 4.4 ns per byte (about 230 MB/s) */
#define TAU 4e-9                           /* backward makes 16 MiB of gradients in 67 ms */

typedef struct live {
    int nsizes, ngrid;
    double sizes[MAX_SIZES];               /* bytes */
    double ring[MAX_SIZES], relay[MAX_SIZES]; /* seconds, the fastest of REPS */
    int per[MAX_SIZES];                    /* parameters per bucket */
    double step[MAX_SIZES];                /* seconds, the fastest of REPS */
    int relay_mode, done, wrong_sum;
    char message[512];
} live;

static void sleep_until(double t) {
    struct timespec ts;
    double left = t - lab_now();
    if (left <= 0) return;
    ts.tv_sec = (time_t)left;
    ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

static int live_rank(int rank, void* arg) {
    live* L = (live*)arg;
    ddp_desc d;
    ddp_pg* pg;
    float* buf = (float*)calloc((size_t)PARAM_FLOATS * NPARAMS, sizeof(float));
    int k, rep;
    size_t i;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 60;
    if (!buf || ddp_init(&d, &pg) != DDP_OK) {
        snprintf(L->message, sizeof L->message, "ddp_init: %s", ddp_error_string());
        return 1;
    }
    for (k = 0; k < L->nsizes; k++) L->ring[k] = L->relay[k] = 1e9;
    for (k = 0; k < L->ngrid; k++) L->step[k] = 1e9;
    for (rep = 0; rep < REPS; rep++) { /* the sizes in turn, REPS rounds: a busy moment hits all of them alike */
        for (k = 0; k < L->nsizes; k++) {
            size_t count = (size_t)(L->sizes[k] / 4);
            double t0, t;
            ddp_barrier(pg);
            t0 = lab_now();
            if (ddp_all_reduce(pg, buf, count, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
            t = lab_now() - t0;
            if (rank == 0 && t < L->ring[k]) L->ring[k] = t;
            if (!L->relay_mode) continue;
            for (i = 0; i < count; i++) buf[i] = (float)((i + (size_t)rank) % 8);
            ddp_barrier(pg);
            t0 = lab_now();
            lab_relay_all_reduce(pg, buf, count);
            t = lab_now() - t0;
            if (rank == 0 && t < L->relay[k]) L->relay[k] = t;
            for (i = 0; i < count; i++)
                if (buf[i] != (float)(i % 8 + (i + 1) % 8 + (i + 2) % 8) && !L->wrong_sum++) {
                    snprintf(L->message, sizeof L->message, "count = %zu: rank %d has buf[%zu] = %g, expected %g", count,
                             rank, i, (double)buf[i], (double)(i % 8 + (i + 1) % 8 + (i + 2) % 8));
                    break;
                }
        }
        for (k = 0; k < L->ngrid; k++) { /* a backward pass making 16 MiB at TAU, buckets going as they fill */
            ddp_work* w[NPARAMS];
            int p, nb = 0, start = 0;
            double t0;
            ddp_barrier(pg);
            t0 = lab_now();
            for (p = 0; p < NPARAMS; p++) {
                sleep_until(t0 + (double)(p + 1) * PARAM_FLOATS * 4 * TAU);
                if (p + 1 - start == L->per[k] || p == NPARAMS - 1) {
                    if (ddp_all_reduce(pg, buf + (size_t)start * PARAM_FLOATS, (size_t)(p + 1 - start) * PARAM_FLOATS,
                                       DDP_F32, DDP_SUM, &w[nb++]) != DDP_OK)
                        return 1;
                    start = p + 1;
                }
            }
            for (p = 0; p < nb; p++)
                if (ddp_work_wait(w[p]) != DDP_OK) return 1;
            if (rank == 0 && lab_now() - t0 < L->step[k]) L->step[k] = lab_now() - t0;
        }
    }
    ddp_destroy(pg);
    free(buf);
    if (rank == 0) L->done = 1;
    return 0;
}

/* The live cases measure for seconds: first make sure lab_fit can fit a line at all, and that
   the timings can mean something here. */
static int fit_works(void) {
    double x[3] = {1e3, 1e5, 1e7}, t[3];
    lab_line l;
    int i;
    if (getenv("DDP_TSAN") && strcmp(getenv("DDP_TSAN"), "0") != 0)
        LAB_SKIP("under ThreadSanitizer (make tsan) every copy is instrumented, many times slower and no longer "
                 "linear in its size: no line can follow such timings");
    for (i = 0; i < 3; i++) t[i] = 1e-4 + 1e-9 * x[i];
    l = lab_fit(x, t, 3);
    if (fabs(l.alpha_s - 1e-4) <= 1e-9 && fabs(l.beta_s_per_byte - 1e-9) <= 1e-15) return 1;
    lab_failf("[rule M2: the line through the measurements] lab_fit does not yet find the line through three exact "
              "points (exact_fit_of_a_line says more), so this case measured nothing");
    return 0;
}

/* Whether the live cases' timing verdicts fail a case. make test sets LAB_TIMING=report: there the
   suite's own other work (or a student's busy laptop) may bend any timing, and make test proves
   mechanisms by values, not speed, so the verdict is printed instead. A student's run enforces it. */
static int timing_enforced(void) {
    const char* v = getenv("LAB_TIMING");
    return !(v && strcmp(v, "report") == 0);
}

/* Every measurement within `tol` of the fitted line? Prints the table; returns 1 if so, or if the
   verdict is only reported (LAB_TIMING=report) and beta is positive. */
static int expect_fit_follows(const char* what, const double* x, const double* t, int n, lab_line l, double tol) {
    int i, ok = 1;
    for (i = 0; i < n; i++) {
        double m = l.alpha_s + l.beta_s_per_byte * x[i];
        lab_note("  %10.0f bytes  measured %9.3f ms  your line %9.3f ms%s", x[i], t[i] * 1e3, m * 1e3,
                 fabs(m - t[i]) > tol * t[i] ? "  <- off" : "");
        ok &= fabs(m - t[i]) <= tol * t[i];
    }
    if (!(l.beta_s_per_byte > 0) || (!ok && timing_enforced())) {
        lab_failf("[rule M5: the fitted line follows the measurements] %s: your fit, %s, misses a measurement by more "
                  "than %.0f%% (marked above)", what, fmt_line(l), tol * 100);
        return 0;
    }
    if (!ok) lab_note("(timing verdict reported, not enforced: LAB_TIMING=report) the fit misses a measurement by more "
                      "than %.0f%%", tol * 100);
    return 1;
}

/* The ring against the relay on 3 ranks, on this machine as it is: no simulated network, so the
   times are whatever two shared cores give. Printed to be read (QUESTIONS.md asks about them),
   checked only for what cannot depend on the machine's load: both finish with the right sum
   at every size, and each fit has a positive beta. */
static void live_ring_against_relay(void) {
    live* L = (live*)lab_shared(sizeof(live));
    lab_line ring, relay;
    int k;
    if (!L) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_need_loopback();
    if (!fit_works()) return;
    L->relay_mode = 1;
    for (k = 0; k < 9; k++) L->sizes[L->nsizes++] = 16384.0 * (double)(1 << k); /* 16 KiB .. 4 MiB */
    unsetenv("DDP_SIMULATE_LATENCY_US");
    unsetenv("DDP_SIMULATE_NS_PER_BYTE");
    if (ddp_spawn(3, live_rank, L) != DDP_OK || !L->done) {
        lab_failf("the 3 ranks did not finish: %s %s", ddp_error_string(), L->message);
        return;
    }
    EXPECT(!L->wrong_sum, "[rule M1: the relay leaves the sum on every rank] %s", L->message);
    ring = lab_fit(L->sizes, L->ring, L->nsizes);
    relay = lab_fit(L->sizes, L->relay, L->nsizes);
    lab_note("3 ranks on this machine, the fastest of %d runs of each size:", REPS);
    lab_note("  %10s  %12s  %12s", "bytes", "ring (ms)", "relay (ms)");
    for (k = 0; k < L->nsizes; k++)
        lab_note("  %10.0f  %12.3f  %12.3f", L->sizes[k], L->ring[k] * 1e3, L->relay[k] * 1e3);
    lab_note("your fits: ring %s; relay %s", fmt_line(ring), fmt_line(relay));
    EXPECT(ring.beta_s_per_byte > 0 && relay.beta_s_per_byte > 0,
           "[rule M2: the line through the measurements] a line with beta <= 0 cannot describe times that grow with "
           "size: ring %s, relay %s", fmt_line(ring), fmt_line(relay));
    lab_note("beta of the relay / beta of the ring = %.2f; the bytes each rank sends say (W-1) / (2(W-1)/W) = 1.50",
             relay.beta_s_per_byte / ring.beta_s_per_byte);
}

static void live_best_bucket_on_a_simulated_network(void) {
    live* L = (live*)lab_shared(sizeof(live));
    double S = (double)PARAM_FLOATS * 4 * NPARAMS, predicted, best_t = 1e9, measured = 0;
    lab_line net;
    int k;
    if (!L) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    lab_need_loopback();
    if (!fit_works()) return;
    for (k = 0; k < 13; k++) L->sizes[L->nsizes++] = 4096.0 * (double)(1 << k); /* 4 KiB .. 16 MiB */
    for (k = 8; k <= 18; k++) L->per[L->ngrid++] = (int)floor(pow(2, k / 2.0) + 0.5); /* 16 .. 512 parameters */
    setenv("DDP_SIMULATE_LATENCY_US", SIM_LATENCY_US, 1);
    setenv("DDP_SIMULATE_NS_PER_BYTE", SIM_NS_PER_BYTE, 1);
    if (ddp_spawn(2, live_rank, L) != DDP_OK || !L->done) {
        lab_failf("the 2 ranks did not finish: %s %s", ddp_error_string(), L->message);
        return;
    }
    net = lab_fit(L->sizes, L->ring, L->nsizes);
    lab_note("2 ranks, network simulated at %s us + %s ns/byte, the fastest of %d runs of each size:", SIM_LATENCY_US,
             SIM_NS_PER_BYTE, REPS);
    lab_note("your fit: %s (the simulation's own: alpha = %s us, beta = %s ns/byte; the rest is this machine)",
             fmt_line(net), SIM_LATENCY_US, SIM_NS_PER_BYTE);
    if (!expect_fit_follows("ddp_all_reduce on 2 ranks", L->sizes, L->ring, L->nsizes, net, 0.3)) return;
    predicted = lab_best_bucket(net, S, TAU);
    lab_note("backward makes %.0f MiB of gradients at %.1f ns/byte (%.0f ms); buckets of whole 16 KiB parameters:",
             S / 1048576, TAU * 1e9, S * TAU * 1e3);
    for (k = 0; k < L->ngrid; k++) {
        double B = (double)L->per[k] * PARAM_FLOATS * 4;
        if (L->step[k] < best_t) best_t = L->step[k], measured = B;
    }
    for (k = 0; k < L->ngrid; k++) {
        double B = (double)L->per[k] * PARAM_FLOATS * 4;
        lab_note("  bucket %8.0f KiB  measured %7.1f ms  your model %7.1f ms%s", B / 1024, L->step[k] * 1e3,
                 lab_step_time(net, S, TAU, B) * 1e3, B == measured ? "  <- measured best" : "");
    }
    lab_note("predicted best bucket %.0f KiB, measured best %.0f KiB: ratio %.2f", predicted / 1024, measured / 1024,
             measured / predicted);
    if (!(measured / predicted <= 2 && measured / predicted >= 0.5) && !timing_enforced())
        lab_note("(timing verdict reported, not enforced: LAB_TIMING=report) the ratio is outside 0.5 to 2");
    else EXPECT(measured / predicted <= 2 && measured / predicted >= 0.5,
           "[rule M5: the predicted best bucket is within a factor of 2 of the measured one] predicted %.0f KiB from your "
           "fit and model, measured %.0f KiB. If the fit above follows the measurements and the exact_ cases pass, the "
           "machine was busy while it measured: run it again", predicted / 1024, measured / 1024);
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(exact_relay_sums_and_bytes, 30);
    LAB_CASE(exact_fit_of_a_line, 10);
    LAB_CASE(exact_fit_with_relative_noise, 10);
    LAB_CASE(exact_step_time_network_slower_than_backward, 10);
    LAB_CASE(exact_step_time_network_faster_than_backward, 10);
    LAB_CASE(exact_step_time_uneven_buckets, 10);
    LAB_CASE(exact_step_time_random, 10);
    LAB_CASE(exact_best_bucket, 30);
    LAB_CASE(exact_best_bucket_random, 60);
    LAB_CASE(live_ring_against_relay, 60);
    LAB_CASE(live_best_bucket_on_a_simulated_network, 110);
    return lab_end();
}
