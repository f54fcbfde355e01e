/* allreduce_perf.c - ddp.h's analogue of nccl-tests' all_reduce_perf.

   Times ddp_all_reduce over a range of message sizes and prints nccl-tests' columns (size, count,
   type, redop, time, algbw, busbw, #wrong), so that its table reads like theirs and sits beside
   Open MPI's (bench/mpi_allreduce.c) and NCCL's.

   Build (the Makefile may do this for you as build/allreduce_perf):
     CPU only:  cc -std=c99 -O2 -I. -DDDP_NO_CUDA tools/allreduce_perf.c -o build/allreduce_perf -lpthread -lm
     CUDA:      cc -std=c99 -O2 -I. -I$CUDA_HOME/include tools/allreduce_perf.c -o build/allreduce_perf \
                   -L$CUDA_HOME/lib64 -lcublas -lnvrtc -lnccl -lcudart -lpthread -lm
   Run, one process per rank:
     build/ddprun --standalone --nproc-per-node 4 build/allreduce_perf -b 4K -e 256M -f 4
     MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 mpirun -x MASTER_ADDR -x MASTER_PORT -np 4 build/allreduce_perf
     the mpi backend: MPI's own all-reduce, no MASTER_ADDR (make builds build/allreduce_perf_mpi,
                with -DDDP_MPI, when it finds mpicc; that build uses the mpi backend unless
                DDP_BACKEND names another):   mpirun -np 4 build/allreduce_perf_mpi
     or by hand: for r in 0 1; do RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 \
                   MASTER_ADDR=127.0.0.1 MASTER_PORT=29650 build/allreduce_perf & done; wait
   A single process (no launcher variables) is a world of one: busbw is 0 there.

   Flags (as nccl-tests): -b minbytes (4K) -e maxbytes (64M), suffixes K/M/G are powers of 1024;
   -f stepfactor (2); -n iterations (20); -w warm-up iterations (5); -c check 0/1 (1);
   -d float|half|bfloat16 (or f32|f16|bf16; float); -o sum|avg|max (sum); -i 0/1 is accepted,
   but ddp_all_reduce works in place, so every figure is in place; -h help. One of ddp.h's own:
   -H 1 adds the host's time per call, issue (until ddp_all_reduce with a work handle returns) and
   wait (ddp_work_wait), to compare NCCL's blocking and non-blocking communicators
   (DDP_NCCL_BLOCKING=1 or not; tools/nccl_host_cost.sh runs both).

   Method. The collective buffer lives on ddp_pg_device(pg) (a GPU when one is usable, else the
   CPU) and is allocated once at the largest size (fresh memory is slow to touch). Because the
   all-reduce is in place, the input is copied back in before EVERY iteration, untimed. Each
   iteration is: ddp_barrier, then one ddp_all_reduce timed alone on each rank. After the loop the
   per-iteration times are all-reduced with MAX (untimed), giving the slowest rank's time of each
   iteration, and the table shows the MEDIAN of those (nccl-tests shows the mean of back-to-back
   iterations; the median of barrier-separated ones is sturdier on small, noisy machines).
   algbw = size / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes.

   Check (#wrong). After the timed iterations, one more all-reduce runs on freshly filled data
   (a different pattern from the timed one) and every element is compared with a reference that
   each rank computes in double precision from every rank's input (the inputs are a deterministic
   function of rank and index). Exit status 1 when any element is wrong, 2 for bad flags. */

#define DDP_IMPLEMENTATION
#include "ddp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct perf_opts {
    size_t minbytes, maxbytes;
    size_t factor;
    int iters, warmup, check, inplace, host;
    ddp_dtype dtype;
    ddp_reduce_op op;
} perf_opts;

static void usage(FILE* f, const char* prog) {
    fprintf(f,
            "usage: %s [-b minbytes] [-e maxbytes] [-f stepfactor] [-n iters] [-w warmup] [-c 0|1]\n"
            "          [-d float|half|bfloat16] [-o sum|avg|max] [-i 0|1] [-H 0|1] [-h]\n"
            "  -b  smallest message in bytes, suffix K, M or G (powers of 1024); default 4K\n"
            "  -e  largest message in bytes; default 64M\n"
            "  -f  multiply the size by this factor from one row to the next (>= 2); default 2\n"
            "  -n  timed iterations per size (>= 1); default 20\n"
            "  -w  warm-up iterations per size (>= 0); default 5\n"
            "  -c  check the result (1) or not (0); default 1\n"
            "  -d  element type: float (f32), half (f16) or bfloat16 (bf16); default float\n"
            "  -o  reduction: sum, avg or max; default sum\n"
            "  -i  accepted for nccl-tests compatibility: ddp_all_reduce is in place, so every\n"
            "      figure is in place whatever its value\n"
            "  -H  1: two columns more, the host's time per call: issue (until ddp_all_reduce with a\n"
            "      work handle returns) and wait (ddp_work_wait), medians of the slowest rank; run once\n"
            "      with DDP_NCCL_BLOCKING=1 and once without to compare NCCL's two kinds of communicator\n"
            "  -h  this help\n"
            "Start one process per rank with build/ddprun, torchrun-style variables, or mpirun\n"
            "(with MASTER_ADDR and MASTER_PORT exported).\n",
            prog);
}

/* Bytes from "4096", "4K", "64M", "1G" (powers of 1024). 0 on a malformed value. */
static int parse_bytes(const char* s, size_t* out) {
    char* end;
    unsigned long long v, mul = 1;
    if (!s || !*s || *s == '-' || *s == '+') return 0;
    v = strtoull(s, &end, 10);
    if (end == s) return 0;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1ull << 10; break;
        case 'm': case 'M': mul = 1ull << 20; break;
        case 'g': case 'G': mul = 1ull << 30; break;
        default: return 0;
        }
        if (end[1] && !((end[1] == 'b' || end[1] == 'B') && !end[2])) return 0; /* "4K" or "4KB" */
    }
    if (v > (unsigned long long)((size_t)-1) / mul) return 0;
    *out = (size_t)(v * mul);
    return 1;
}

/* A whole number in [lo, hi]. */
static int parse_int(const char* s, long lo, long hi, long* out) {
    char* end;
    long v;
    if (!s || !*s) return 0;
    v = strtol(s, &end, 10);
    if (*end || end == s || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* Is this process rank 0 of its job, as far as the launcher's variables tell before ddp_init?
   Used only to print a usage message once rather than once per rank. */
static int probably_rank0(void) {
    const char* names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char* v = getenv(names[i]);
        if (v && *v) return atoi(v) == 0;
    }
    return 1;
}

static int parse_args(int argc, char** argv, perf_opts* o) {
    int i;
    o->minbytes = (size_t)4 << 10;
    o->maxbytes = (size_t)64 << 20;
    o->factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->inplace = 1;
    o->host = 0;
    o->dtype = DDP_F32;
    o->op = DDP_SUM;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v;
        long n;
        char flag;
        if (a[0] != '-' || !a[1]) {
            fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], a);
            return 2;
        }
        flag = a[1];
        if (flag == 'h' && !a[2]) return 1;
        if (!strchr("befnwcdoiH", flag)) {
            fprintf(stderr, "%s: unknown flag '%s'\n", argv[0], a);
            return 2;
        }
        if (a[2]) v = a + 2; /* "-b4K" */
        else if (i + 1 < argc) v = argv[++i];
        else {
            fprintf(stderr, "%s: flag '%s' needs a value\n", argv[0], a);
            return 2;
        }
        switch (flag) {
        case 'b':
        case 'e': {
            size_t b;
            if (!parse_bytes(v, &b)) {
                fprintf(stderr, "%s: -%c '%s' is not a size (a number of bytes with K, M or G)\n", argv[0], flag, v);
                return 2;
            }
            if (flag == 'b') o->minbytes = b;
            else o->maxbytes = b;
            break;
        }
        case 'f':
            if (!parse_int(v, 2, 1 << 20, &n)) {
                fprintf(stderr, "%s: -f '%s' must be a whole number >= 2\n", argv[0], v);
                return 2;
            }
            o->factor = (size_t)n;
            break;
        case 'n':
        case 'w':
            if (!parse_int(v, flag == 'n' ? 1 : 0, 1000000, &n)) {
                fprintf(stderr, "%s: -%c '%s' must be a whole number >= %d\n", argv[0], flag, v, flag == 'n');
                return 2;
            }
            if (flag == 'n') o->iters = (int)n;
            else o->warmup = (int)n;
            break;
        case 'c':
        case 'i':
        case 'H':
            if (!parse_int(v, 0, 1, &n)) {
                fprintf(stderr, "%s: -%c '%s' must be 0 or 1\n", argv[0], flag, v);
                return 2;
            }
            if (flag == 'c') o->check = (int)n;
            else if (flag == 'H') o->host = (int)n;
            else o->inplace = (int)n;
            break;
        case 'd':
            if (!strcmp(v, "float") || !strcmp(v, "f32") || !strcmp(v, "float32")) o->dtype = DDP_F32;
            else if (!strcmp(v, "half") || !strcmp(v, "f16") || !strcmp(v, "float16")) o->dtype = DDP_F16;
            else if (!strcmp(v, "bfloat16") || !strcmp(v, "bf16")) o->dtype = DDP_BF16;
            else {
                fprintf(stderr, "%s: -d '%s' must be float, half or bfloat16 (f32, f16, bf16)\n", argv[0], v);
                return 2;
            }
            break;
        case 'o':
            if (!strcmp(v, "sum")) o->op = DDP_SUM;
            else if (!strcmp(v, "avg")) o->op = DDP_AVG;
            else if (!strcmp(v, "max")) o->op = DDP_MAX;
            else {
                fprintf(stderr, "%s: -o '%s' must be sum, avg or max\n", argv[0], v);
                return 2;
            }
            break;
        }
    }
    if (o->maxbytes < o->minbytes) {
        fprintf(stderr, "%s: -e (%zu bytes) is smaller than -b (%zu bytes)\n", argv[0], o->maxbytes, o->minbytes);
        return 2;
    }
    return 0;
}

static const char* type_name(ddp_dtype t) {
    return t == DDP_F16 ? "half" : t == DDP_BF16 ? "bfloat16" : "float";
}
static const char* op_name(ddp_reduce_op op) {
    return op == DDP_AVG ? "avg" : op == DDP_MAX ? "max" : "sum";
}

/* ---- test data ------------------------------------------------------------------------------- */

/* Rank r's input at index i: an integer in [-15, 15], depending on rank and index (and on `salt`,
   so the checked data differ from the timed data). Small integers are exact in f32, f16 and bf16,
   and so is every partial sum while the sum of absolute values stays within 2^p (p = 24, 11, 8
   significant bits): up to 16 ranks for bf16, 136 for f16. */
static int input_value(int r, size_t i, int salt) {
    unsigned long long h = (unsigned long long)i * 7u + (unsigned long long)(i >> 9) + (unsigned long long)r * 13u +
                           (unsigned long long)salt * 5u + (unsigned long long)(r * r) * (i % 3u);
    return (int)(h % 31u) - 15;
}

static void fill_input(void* host, size_t count, ddp_dtype t, int rank, int salt) {
    size_t i;
    if (t == DDP_F32) {
        float* p = (float*)host;
        for (i = 0; i < count; i++) p[i] = (float)input_value(rank, i, salt);
    } else {
        uint16_t* p = (uint16_t*)host;
        int h = t == DDP_F16;
        for (i = 0; i < count; i++) {
            float v = (float)input_value(rank, i, salt);
            p[i] = h ? ddp_f32_to_f16(v) : ddp_f32_to_bf16(v);
        }
    }
}

/* The tolerance for one element (see the check below). */
typedef struct tolerance {
    int world;
    double u;       /* unit roundoff: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16) */
    double exact_to; /* integers up to 2^p in magnitude are exact: 2^24, 2^11, 2^8 */
} tolerance;

/* gamma_k = k u / (1 - k u): Higham's bound on the relative error of k roundings. */
static double gamma_k(const tolerance* t, int k) {
    double ku = k * t->u;
    return ku < 1 ? ku / (1 - ku) : 1e300;
}

/* Count elements of got (count elements of dtype t, host memory) farther from the reference than
   the tolerance. The reference is computed in double from every rank's input.
     max: exact (the maximum of representable numbers is one of them).
     sum: each addition in the dtype (the ring converts to f32, adds, and rounds back to the dtype
          at every hop) has relative error <= u, so for W-1 additions in any order or tree
          |got - sum| <= gamma_{W-1} * sum|x_r| (Higham, Accuracy and Stability, 4.2). When
          sum|x_r| <= 2^p every partial sum is an integer of at most p bits, hence exact, and the
          tolerance is 0: that is the case for the data above with W <= 16 (bf16), 136 (f16).
     avg: the sum's bound divided by W, plus the rounding of the division (u), plus NCCL's way of
          averaging floats (each input times a rounded 1/W before the sum): at most
          gamma_{W+1} * sum|x_r| / W in all, and the result is not exact in general (W = 3). */
static size_t count_wrong(const void* got, size_t count, ddp_dtype t, ddp_reduce_op op, int salt,
                          const tolerance* tol) {
    const int W = tol->world;
    size_t i, wrong = 0;
    double gsum = gamma_k(tol, W - 1), gavg = gamma_k(tol, W + 1);
    for (i = 0; i < count; i++) {
        double sum = 0, sabs = 0, mx = -1e300, want, bound, g;
        int r;
        for (r = 0; r < W; r++) {
            int v = input_value(r, i, salt);
            sum += v;
            sabs += v < 0 ? -v : v;
            if (v > mx) mx = v;
        }
        if (op == DDP_MAX) want = mx, bound = 0;
        else if (op == DDP_SUM) want = sum, bound = sabs <= tol->exact_to ? 0 : gsum * sabs;
        else want = sum / W, bound = gavg * sabs / W;
        if (t == DDP_F32) g = ((const float*)got)[i];
        else if (t == DDP_F16) g = ddp_f16_to_f32(((const uint16_t*)got)[i]);
        else g = ddp_bf16_to_f32(((const uint16_t*)got)[i]);
        if (!(fabs(g - want) <= bound)) wrong++; /* NaN counts as wrong */
    }
    return wrong;
}

/* ---- helpers on the group's device ---------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* All-reduce n floats of host memory `v` with `op`, through `dbuf` (n floats on the group's
   device; v itself when that is the CPU). */
static void reduce_host_floats(ddp_pg* pg, ddp_device dev, float* dbuf, float* v, size_t n, ddp_reduce_op op) {
    if (dev.type == DDP_DEVICE_CUDA) {
        DDP_CHECK(ddp_copy(dev, dbuf, (ddp_device){DDP_DEVICE_CPU, 0}, v, n * sizeof *v, NULL));
        DDP_CHECK(ddp_all_reduce(pg, dbuf, n, DDP_F32, op, NULL));
        DDP_CHECK(ddp_copy((ddp_device){DDP_DEVICE_CPU, 0}, v, dev, dbuf, n * sizeof *v, NULL));
    } else {
        DDP_CHECK(ddp_all_reduce(pg, v, n, DDP_F32, op, NULL));
    }
}

static int cmp_float(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return x < y ? -1 : x > y;
}

static double median(float* v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5 * ((double)v[n / 2 - 1] + (double)v[n / 2]);
}

/* nccl-tests' time column: fewer decimals as the number grows, always 7 characters. */
static void format_time(char* out, size_t size, double us) {
    if (us >= 10000.0) snprintf(out, size, "%7.0f", us);
    else if (us >= 100.0) snprintf(out, size, "%7.1f", us);
    else snprintf(out, size, "%7.2f", us);
}

int main(int argc, char** argv) {
    perf_opts o;
    ddp_pg* pg;
    ddp_device dev, cpu = {DDP_DEVICE_CPU, 0};
    int rank, world, pa, it, nsizes = 0;
    size_t es, bytes, maxcount = 0;
    void *buf = NULL, *host = NULL;
    float *times, *dsmall = NULL;
    double bw_sum = 0;
    unsigned long long total_wrong = 0;
    tolerance tol;
    char devname[32];

    pa = parse_args(argc, argv, &o);
    if (pa == 1) {
        usage(stdout, argv[0]);
        return 0;
    }
    if (pa != 0) {
        if (probably_rank0()) usage(stderr, argv[0]);
        return 2;
    }
    es = ddp_dtype_size(o.dtype);

#if defined(DDP_MPI)
    DDP_CHECK(ddp_init(&(ddp_desc){.backend = getenv("DDP_BACKEND") ? DDP_BACKEND_DEFAULT : DDP_BACKEND_MPI}, &pg));
#else
    DDP_CHECK(ddp_init(&(ddp_desc){.backend = DDP_BACKEND_DEFAULT}, &pg));
#endif
    rank = ddp_rank(pg);
    world = ddp_world_size(pg);
    dev = ddp_pg_device(pg);
    ddp_device_name(dev, devname, sizeof devname);

    /* the sizes: minbytes, minbytes * f, ... up to maxbytes; counts in whole elements */
    for (bytes = o.minbytes;; bytes *= o.factor) {
        size_t c = bytes / es;
        if (c > maxcount) maxcount = c;
        if (bytes > o.maxbytes / o.factor || bytes == 0) break;
    }

    /* every buffer once, at the largest size, touched before any timing */
    if (maxcount > 0) {
        DDP_CHECK(ddp_alloc(dev, maxcount * es, &buf));
        DDP_CHECK(ddp_alloc_pinned(maxcount * es, &host));
        memset(host, 0, maxcount * es);
    }
    times = (float*)malloc((size_t)o.iters * 2 * sizeof *times); /* -H: issue times, then wait times */
    if (!times) {
        fprintf(stderr, "allreduce_perf: out of memory\n");
        return 1;
    }
    if (dev.type == DDP_DEVICE_CUDA) {
        size_t n = (size_t)o.iters * 2 > 2 ? (size_t)o.iters * 2 : 2;
        DDP_CHECK(ddp_alloc(dev, n * sizeof(float), (void**)&dsmall));
    }

    tol.world = world;
    tol.u = o.dtype == DDP_F32 ? ldexp(1, -24) : o.dtype == DDP_F16 ? ldexp(1, -11) : ldexp(1, -8);
    tol.exact_to = o.dtype == DDP_F32 ? ldexp(1, 24) : o.dtype == DDP_F16 ? ldexp(1, 11) : ldexp(1, 8);

    /* Header: the run's parameters, then one line per rank (gathered through the store). */
    {
        char line[256], host_name[128] = "?", key[64];
        gethostname(host_name, sizeof host_name - 1);
        snprintf(line, sizeof line, "#  Rank %3d Pid %7ld on %12s device %-8s backend %s", rank, (long)getpid(),
                 host_name, devname,
                 ddp_pg_backend(pg) == DDP_BACKEND_NCCL ? "nccl" : ddp_pg_backend(pg) == DDP_BACKEND_MPI ? "mpi" : "cpu");
        snprintf(key, sizeof key, "allreduce_perf/rank/%d", rank);
        DDP_CHECK(ddp_store_set(ddp_pg_store(pg), key, line, strlen(line) + 1));
        if (rank == 0) {
            int r;
            printf("# allreduce_perf (ddp.h %d.%d.%d): minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d "
                   "iters: %d validation: %d\n",
                   DDP_VERSION_MAJOR, DDP_VERSION_MINOR, DDP_VERSION_PATCH, o.minbytes, o.maxbytes, o.factor, o.warmup,
                   o.iters, o.check);
            printf("# in place only: ddp_all_reduce has no out-of-place form (-i %d accepted, ignored)\n", o.inplace);
            printf("# time: median over iterations of the slowest rank (each iteration: ddp_barrier, then one\n"
                   "#       ddp_all_reduce timed alone; the refill of the input before it is not timed)\n");
            printf("# algbw = size / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes; world size %d\n", world);
            printf("# build: %s\n#\n# Using devices\n", ddp_build_info());
            for (r = 0; r < world; r++) {
                size_t got = 0;
                snprintf(key, sizeof key, "allreduce_perf/rank/%d", r);
                DDP_CHECK(ddp_store_get(ddp_pg_store(pg), key, line, sizeof line - 1, &got));
                line[got < sizeof line ? got : sizeof line - 1] = '\0';
                printf("%s\n", line);
            }
            printf("#\n");
            if (o.host)
                printf("# host (-H 1): issue = until ddp_all_reduce(..., &work) returns, wait = ddp_work_wait; each "
                       "the median of\n#       the slowest rank, after a barrier; %s\n",
                       ddp_pg_backend(pg) != DDP_BACKEND_NCCL ? "not NCCL: the communicator's mode does not apply"
                       : getenv("DDP_NCCL_BLOCKING") && *getenv("DDP_NCCL_BLOCKING") == '1'
                           ? "NCCL communicator: blocking (DDP_NCCL_BLOCKING=1)"
                           : "NCCL communicator: non-blocking (the default)");
            printf("#       size         count      type   redop    time   algbw   busbw  #wrong%s\n",
                   o.host ? "   issue    wait" : "");
            printf("#        (B)    (elements)                       (us)  (GB/s)  (GB/s)        %s\n",
                   o.host ? "    (us)    (us)" : "");
            fflush(stdout);
        }
    }

    for (bytes = o.minbytes;; bytes *= o.factor) {
        size_t count = bytes / es, nbytes = count * es;
        double t_med, algbw, busbw;
        char tstr[16], wstr[32], hstr[40] = "";
        /* timed data */
        fill_input(host, count, o.dtype, rank, 0);
        for (it = 0; it < o.warmup; it++) {
            DDP_CHECK(ddp_copy(dev, buf, cpu, host, nbytes, NULL));
            DDP_CHECK(ddp_barrier(pg));
            DDP_CHECK(ddp_all_reduce(pg, buf, count, o.dtype, o.op, NULL));
        }
        for (it = 0; it < o.iters; it++) {
            double t0;
            DDP_CHECK(ddp_copy(dev, buf, cpu, host, nbytes, NULL)); /* untimed refill */
            DDP_CHECK(ddp_barrier(pg));
            t0 = now_s();
            DDP_CHECK(ddp_all_reduce(pg, buf, count, o.dtype, o.op, NULL));
            times[it] = (float)((now_s() - t0) * 1e6);
        }
        /* each iteration's time on the slowest rank (untimed), then the median */
        reduce_host_floats(pg, dev, dsmall, times, (size_t)o.iters, DDP_MAX);
        t_med = median(times, o.iters);
        algbw = t_med > 0 ? (double)nbytes / (t_med * 1e-6) / 1e9 : 0;
        busbw = algbw * 2.0 * (world - 1) / world;
        bw_sum += busbw;
        nsizes++;

        if (o.host) { /* the host's share: handing the collective over, then waiting for it */
            float *issue = times, *waited = times + o.iters;
            for (it = 0; it < o.iters; it++) {
                ddp_work* w = NULL;
                double t0, t1;
                DDP_CHECK(ddp_copy(dev, buf, cpu, host, nbytes, NULL));
                DDP_CHECK(ddp_barrier(pg));
                t0 = now_s();
                DDP_CHECK(ddp_all_reduce(pg, buf, count, o.dtype, o.op, &w));
                t1 = now_s();
                DDP_CHECK(ddp_work_wait(w));
                issue[it] = (float)((t1 - t0) * 1e6), waited[it] = (float)((now_s() - t1) * 1e6);
            }
            reduce_host_floats(pg, dev, dsmall, times, (size_t)o.iters * 2, DDP_MAX);
            snprintf(hstr, sizeof hstr, "  %6.1f  %6.1f", median(issue, o.iters), median(waited, o.iters));
        }

        if (o.check) {
            size_t wrong = 0;
            float w2[2];
            /* fresh data, another pattern, so a stale result cannot pass */
            fill_input(host, count, o.dtype, rank, 1);
            DDP_CHECK(ddp_copy(dev, buf, cpu, host, nbytes, NULL));
            DDP_CHECK(ddp_all_reduce(pg, buf, count, o.dtype, o.op, NULL));
#ifdef ALLREDUCE_PERF_CORRUPT
            /* scratch builds only: prove that the check can fail (one wrong element on rank 0) */
            if (rank == 0 && count > 0) {
                float bad = 1000.f;
                if (o.dtype == DDP_F32) DDP_CHECK(ddp_copy(dev, buf, cpu, &bad, sizeof bad, NULL));
                else {
                    uint16_t h = o.dtype == DDP_F16 ? ddp_f32_to_f16(bad) : ddp_f32_to_bf16(bad);
                    DDP_CHECK(ddp_copy(dev, buf, cpu, &h, sizeof h, NULL));
                }
            }
#endif
            DDP_CHECK(ddp_copy(cpu, host, dev, buf, nbytes, NULL));
            wrong = count_wrong(host, count, o.dtype, o.op, 1, &tol);
            /* a count in f32 is exact only below 2^24: send it as two exact halves */
            w2[0] = (float)(wrong >> 20);
            w2[1] = (float)(wrong & ((1u << 20) - 1));
            reduce_host_floats(pg, dev, dsmall, w2, 2, DDP_SUM);
            wrong = ((size_t)w2[0] << 20) + (size_t)w2[1];
            total_wrong += wrong;
            snprintf(wstr, sizeof wstr, "%zu", wrong);
        } else {
            snprintf(wstr, sizeof wstr, "N/A");
        }
        if (rank == 0) {
            format_time(tstr, sizeof tstr, t_med);
            printf("%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6s%s\n", nbytes, count, type_name(o.dtype),
                   op_name(o.op), tstr, algbw, busbw, wstr, hstr);
            fflush(stdout);
        }
        if (bytes > o.maxbytes / o.factor || bytes == 0) break;
    }

    if (rank == 0) {
        printf("# Avg bus bandwidth    : %g\n", nsizes ? bw_sum / nsizes : 0.0);
        if (o.check) printf("# Out of bounds values : %llu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        else printf("# Out of bounds values : N/A (not checked: -c 0)\n");
        printf("#\n");
        fflush(stdout);
    }

    free(times);
    ddp_free(dev, dsmall);
    ddp_free_pinned(host);
    ddp_free(dev, buf);
    ddp_destroy(pg);
    return total_wrong ? 1 : 0;
}
