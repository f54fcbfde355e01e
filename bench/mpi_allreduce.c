/* mpi_allreduce.c - an MPI_Allreduce timer whose table sits beside tools/allreduce_perf.c's.

   The same sizes, flags and timing method as allreduce_perf, for the peer ddp.h is measured
   against (Open MPI here; see shared reference performance.md):
     each iteration: refill the buffer (untimed; the all-reduce is in place), MPI_Barrier, then one
     MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM) timed alone; after the loop the
     per-iteration times are reduced with MPI_MAX (untimed), and the table shows the MEDIAN over
     iterations of the slowest rank's time. algbw = size / time, busbw = algbw * 2(n-1)/n, GB = 1e9.
   #wrong: one more all-reduce on other data, every element compared with the exact sum (small
   integers: exact in f32), counted over ranks.

   Build:  mpicc -O2 bench/mpi_allreduce.c -o build/mpi_allreduce
   Run:    mpirun --allow-run-as-root --oversubscribe -np 2 build/mpi_allreduce -b 4K -e 256M -f 4
           (shared memory by default; add --mca btl tcp,self for TCP only)
   Flags:  -b minbytes (4K) -e maxbytes (64M), suffixes K/M/G = powers of 1024; -f stepfactor (2);
           -n iterations (20); -w warm-up iterations (5); -c check 0/1 (1); -h help. */

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE* f, const char* prog) {
    fprintf(f,
            "usage: %s [-b minbytes] [-e maxbytes] [-f stepfactor] [-n iters] [-w warmup] [-c 0|1] [-h]\n"
            "  sizes in bytes with K, M or G (powers of 1024); defaults -b 4K -e 64M -f 2 -n 20 -w 5 -c 1\n"
            "  float sum, in place (MPI_IN_PLACE); time: median over iterations of the slowest rank\n",
            prog);
}

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
        if (end[1] && !((end[1] == 'b' || end[1] == 'B') && !end[2])) return 0;
    }
    *out = (size_t)(v * mul);
    return 1;
}

static int parse_int(const char* s, long lo, long hi, long* out) {
    char* end;
    long v;
    if (!s || !*s) return 0;
    v = strtol(s, &end, 10);
    if (*end || end == s || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* The same integers as allreduce_perf's input_value, in [-15, 15]. */
static int input_value(int r, size_t i, int salt) {
    unsigned long long h = (unsigned long long)i * 7u + (unsigned long long)(i >> 9) + (unsigned long long)r * 13u +
                           (unsigned long long)salt * 5u + (unsigned long long)(r * r) * (i % 3u);
    return (int)(h % 31u) - 15;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

static void format_time(char* out, size_t size, double us) {
    if (us >= 10000.0) snprintf(out, size, "%7.0f", us);
    else if (us >= 100.0) snprintf(out, size, "%7.1f", us);
    else snprintf(out, size, "%7.2f", us);
}

int main(int argc, char** argv) {
    size_t minbytes = (size_t)4 << 10, maxbytes = (size_t)64 << 20, factor = 2, bytes, maxcount = 0, i;
    int iters = 20, warmup = 5, check = 1, rank, world, it, a, bad = 0, nsizes = 0;
    float *buf, *input;
    double *times, bw_sum = 0;
    long long total_wrong = 0;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int liblen = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (a = 1; a < argc && !bad; a++) {
        const char* v;
        long n;
        char flag = argv[a][0] == '-' ? argv[a][1] : 0;
        if (flag == 'h' && !argv[a][2]) {
            if (rank == 0) usage(stdout, argv[0]);
            MPI_Finalize();
            return 0;
        }
        if (!flag || !strchr("befnwc", flag)) { bad = 1; break; }
        v = argv[a][2] ? argv[a] + 2 : (a + 1 < argc ? argv[++a] : NULL);
        if (!v) { bad = 1; break; }
        switch (flag) {
        case 'b': bad = !parse_bytes(v, &minbytes); break;
        case 'e': bad = !parse_bytes(v, &maxbytes); break;
        case 'f': bad = !parse_int(v, 2, 1 << 20, &n); factor = (size_t)n; break;
        case 'n': bad = !parse_int(v, 1, 1000000, &n); iters = (int)n; break;
        case 'w': bad = !parse_int(v, 0, 1000000, &n); warmup = (int)n; break;
        case 'c': bad = !parse_int(v, 0, 1, &n); check = (int)n; break;
        }
    }
    if (bad || maxbytes < minbytes) {
        if (rank == 0) {
            fprintf(stderr, "%s: bad flag or value near '%s'\n", argv[0], a < argc ? argv[a] : "(end)");
            usage(stderr, argv[0]);
        }
        MPI_Finalize();
        return 2;
    }

    for (bytes = minbytes;; bytes *= factor) {
        if (bytes / sizeof(float) > maxcount) maxcount = bytes / sizeof(float);
        if (bytes > maxbytes / factor || bytes == 0) break;
    }
    buf = (float*)malloc((maxcount ? maxcount : 1) * sizeof *buf);
    input = (float*)malloc((maxcount ? maxcount : 1) * sizeof *input);
    times = (double*)malloc((size_t)iters * sizeof *times);
    if (!buf || !input || !times) {
        fprintf(stderr, "mpi_allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(buf, 0, maxcount * sizeof *buf); /* touch every page before timing */
    memset(input, 0, maxcount * sizeof *input);

    MPI_Get_library_version(lib, &liblen);
    if (rank == 0) {
        char* nl = strchr(lib, '\n');
        if (nl) *nl = '\0';
        printf("# mpi_allreduce: minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d "
               "validation: %d\n# %s\n# world size %d; in place (MPI_IN_PLACE)\n"
               "# time: median over iterations of the slowest rank (each iteration: MPI_Barrier, then one\n"
               "#       MPI_Allreduce timed alone; the refill of the input before it is not timed)\n"
               "# algbw = size / time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes\n#\n",
               minbytes, maxbytes, factor, warmup, iters, check, lib, world);
        printf("#       size         count      type   redop    time   algbw   busbw  #wrong\n");
        printf("#        (B)    (elements)                       (us)  (GB/s)  (GB/s)\n");
        fflush(stdout);
    }

    for (bytes = minbytes;; bytes *= factor) {
        size_t count = bytes / sizeof(float), nbytes = count * sizeof(float);
        double t_med, algbw, busbw;
        char tstr[16], wstr[32];
        for (i = 0; i < count; i++) input[i] = (float)input_value(rank, i, 0);
        for (it = 0; it < warmup; it++) {
            memcpy(buf, input, nbytes);
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        for (it = 0; it < iters; it++) {
            double t0;
            memcpy(buf, input, nbytes); /* untimed refill */
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            times[it] = (MPI_Wtime() - t0) * 1e6;
        }
        MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        qsort(times, (size_t)iters, sizeof *times, cmp_double);
        t_med = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
        algbw = t_med > 0 ? (double)nbytes / (t_med * 1e-6) / 1e9 : 0;
        busbw = algbw * 2.0 * (world - 1) / world;
        bw_sum += busbw;
        nsizes++;
        if (check) {
            long long wrong = 0;
            int r;
            for (i = 0; i < count; i++) buf[i] = (float)input_value(rank, i, 1);
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (i = 0; i < count; i++) {
                double want = 0;
                for (r = 0; r < world; r++) want += input_value(r, i, 1);
                if ((double)buf[i] != want) wrong++; /* exact: small integers */
            }
            MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            total_wrong += wrong;
            snprintf(wstr, sizeof wstr, "%lld", wrong);
        } else {
            snprintf(wstr, sizeof wstr, "N/A");
        }
        if (rank == 0) {
            format_time(tstr, sizeof tstr, t_med);
            printf("%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6s\n", nbytes, count, "float", "sum", tstr, algbw,
                   busbw, wstr);
            fflush(stdout);
        }
        if (bytes > maxbytes / factor || bytes == 0) break;
    }
    if (rank == 0) {
        printf("# Avg bus bandwidth    : %g\n", nsizes ? bw_sum / nsizes : 0.0);
        if (check) printf("# Out of bounds values : %lld %s\n#\n", total_wrong, total_wrong ? "FAILED" : "OK");
        else printf("# Out of bounds values : N/A (not checked: -c 0)\n#\n");
    }
    free(times);
    free(input);
    free(buf);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
