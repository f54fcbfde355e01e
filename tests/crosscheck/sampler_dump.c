/* tests/crosscheck/sampler_dump.c: prints the distributed sampler's index lists, for
   tests/crosscheck/sampler_torch.py to compare with PyTorch's DistributedSampler (tests/run.sh
   runs both).

   usage: sampler_dump [N R RANK SHUFFLE DROP_LAST EPOCH SEED]...
   With no arguments the cases come from stdin, seven numbers a line ('#' starts a comment).
   One line out per case:
       N R RANK SHUFFLE DROP_LAST EPOCH SEED NUM_SAMPLES TOTAL_SIZE PADDING PATHS : I0 I1 ...
   PADDING is ddp_sampler_padding. PATHS is "ok" when the other ways to the same list agree with
   ddp_sampler_indices: asking again after another epoch, ddp_loader_start's order, and (with
   shuffling) the slow path taken when no memory is left for the epoch's order; otherwise it names
   the first that differs (e.g. "loader@3": entry 3). A case the sampler refuses prints "error" and
   the message after the seven numbers; then the exit status is 1. */
#include <stddef.h>
static int g_fail_alloc; /* 1: the library's allocations fail (the sampler's no-memory path) */
static void* dump_malloc(size_t n);
#define DDP_MALLOC(n) dump_malloc(n)
#define DDP_FREE(p) free(p)
#define DDP_IMPLEMENTATION
#include "ddp.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void* dump_malloc(size_t n) { return g_fail_alloc ? NULL : malloc(n); }

#define GUARD (-7) /* written past num_samples: ddp_sampler_indices must leave it */

static int* g_a; /* the lists, num_samples + 1 entries each (the last one a guard) */
static int* g_b;
static int g_cap;

static void ensure(int n) {
    if (n + 1 <= g_cap) return;
    g_cap = 2 * (n + 1);
    g_a = (int*)realloc(g_a, (size_t)g_cap * sizeof(int));
    g_b = (int*)realloc(g_b, (size_t)g_cap * sizeof(int));
    if (!g_a || !g_b) {
        fprintf(stderr, "sampler_dump: out of memory\n");
        exit(2);
    }
}

/* "" when b[0..count) equals a[0..count) and b[count] is still the guard; else "WHAT@K" in buf */
static const char* compare(const char* what, const int* a, const int* b, int count, int guarded, char* buf) {
    int k;
    for (k = 0; k < count; k++)
        if (a[k] != b[k]) {
            sprintf(buf, "%s@%d", what, k);
            return buf;
        }
    if (guarded && b[count] != GUARD) {
        sprintf(buf, "%s:wrote_past_end", what);
        return buf;
    }
    return "";
}

static int one_case(int n, int R, int rank, int shuffle, int drop_last, int epoch, uint64_t seed) {
    ddp_sampler_desc d;
    ddp_sampler s;
    ddp_status st;
    char buf[64];
    const char* bad = "";
    int k;
    memset(&d, 0, sizeof d);
    d.num_replicas = R;
    d.rank = rank;
    d.in_order = !shuffle;
    d.drop_last = drop_last;
    d.seed = seed;
    printf("%d %d %d %d %d %d %" PRIu64, n, R, rank, shuffle, drop_last, epoch, seed);
    st = ddp_sampler_init(&s, n, &d);
    if (st != DDP_OK) {
        printf(" error %s\n", ddp_error_string());
        return 1;
    }
    ensure(s.num_samples > n ? s.num_samples : n);
    ddp_sampler_set_epoch(&s, epoch);
    for (k = 0; k <= s.num_samples; k++) g_a[k] = GUARD;
    ddp_sampler_indices(&s, g_a);
    if (g_a[s.num_samples] != GUARD) bad = "indices:wrote_past_end";

    /* the same epoch again after another one: the sampler keeps no state between calls */
    if (!*bad) {
        ddp_sampler_set_epoch(&s, epoch + 1);
        ddp_sampler_indices(&s, g_b);
        ddp_sampler_set_epoch(&s, epoch);
        for (k = 0; k <= s.num_samples; k++) g_b[k] = GUARD;
        ddp_sampler_indices(&s, g_b);
        bad = compare("again", g_a, g_b, s.num_samples, 1, buf);
    }
    /* the loader's order (the in-place fill over a buffer of n entries) */
    if (!*bad && n > 0) {
        ddp_dataset data;
        ddp_loader l;
        memset(&data, 0, sizeof data);
        memset(&l, 0, sizeof l);
        data.n = n, data.nfeatures = 1, data.nclasses = 1;
        data.x = (float*)calloc((size_t)n, sizeof(float));
        data.y = (int*)calloc((size_t)n, sizeof(int));
        if (!data.x || !data.y || ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = 1}) != DDP_OK || ddp_loader_start(&l, &s) != DDP_OK)
            bad = "loader:failed";
        else if (l.count != s.num_samples)
            bad = "loader:count";
        else
            bad = compare("loader", g_a, l.order, s.num_samples, 0, buf);
        ddp_loader_free(&l);
        free(data.x), free(data.y);
    }
    /* no memory for the order: entry by entry (O(n) each; only where that stays cheap) */
    if (!*bad && shuffle && (long long)n * s.num_samples <= 300000) {
        for (k = 0; k <= s.num_samples; k++) g_b[k] = GUARD;
        g_fail_alloc = 1;
        ddp_sampler_indices(&s, g_b);
        g_fail_alloc = 0;
        bad = compare("nomem", g_a, g_b, s.num_samples, 1, buf);
    }
    printf(" %d %d %d %s :", s.num_samples, s.total_size, ddp_sampler_padding(&s), *bad ? bad : "ok");
    for (k = 0; k < s.num_samples; k++) printf(" %d", g_a[k]);
    printf("\n");
    return 0;
}

static int parse_int(const char* t, long long lo, long long hi, long long* v) {
    char* end;
    long long x = strtoll(t, &end, 10);
    if (end == t || *end || x < lo || x > hi) return 0;
    *v = x;
    return 1;
}

/* the seven numbers of a case from words w[0..7); 0 if one is not a number */
static int run_words(char** w, int* failed) {
    long long v[6];
    uint64_t seed;
    char* end;
    int i;
    for (i = 0; i < 6; i++)
        if (!parse_int(w[i], -0x7fffffffLL - 1, 0x7fffffff, &v[i])) return 0;
    if (w[6][0] == '-') return 0;
    seed = (uint64_t)strtoull(w[6], &end, 10);
    if (end == w[6] || *end) return 0;
    *failed |= one_case((int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5], seed);
    return 1;
}

int main(int argc, char** argv) {
    int failed = 0, i, lineno = 0;
    char line[1024];
    if (argc > 1) {
        if ((argc - 1) % 7 != 0) {
            fprintf(stderr, "usage: %s [N R RANK SHUFFLE DROP_LAST EPOCH SEED]...\n", argv[0]);
            return 2;
        }
        for (i = 1; i < argc; i += 7)
            if (!run_words(argv + i, &failed)) {
                fprintf(stderr, "sampler_dump: case %d: expected seven integers\n", (i - 1) / 7 + 1);
                return 2;
            }
    } else {
        while (fgets(line, sizeof line, stdin)) {
            char *w[8], *p = line;
            int nw = 0;
            lineno++;
            if (strchr(line, '#')) *strchr(line, '#') = 0;
            while (nw < 8 && (w[nw] = strtok(nw ? NULL : p, " \t\r\n")) != NULL) nw++;
            if (nw == 0) continue;
            if (nw != 7 || !run_words(w, &failed)) {
                fprintf(stderr, "sampler_dump: stdin line %d: expected seven integers\n", lineno);
                return 2;
            }
        }
    }
    free(g_a), free(g_b);
    if (fflush(stdout) != 0) return 2;
    return failed;
}
