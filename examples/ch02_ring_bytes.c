/* Chapter 2 of TUTORIAL.md: what an all-reduce costs, counted in bytes.

   Every rank all-reduces the same size of data twice: with the library's ring (reduce-scatter,
   then all-gather, each rank sending chunks of 1/N of the data), and with the whole-tensor relay
   that many courses teach, here built as "gather everyone's whole tensor, then add". The backend's
   byte counters say how much each rank sent; rank 0 prints them against the formulas.
       build/examples/ch02_ring_bytes --nproc 4
       build/examples/ch02_ring_bytes --nproc 8 --bytes 4M
       DDP_DEBUG=DETAIL build/examples/ch02_ring_bytes --nproc 4 --bytes 16 --ring-only   # every step */
#define DDP_IMPLEMENTATION
#include "ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options { int nproc, ring_only; size_t count; } options;

static int run(int rank, void* arg) {
    const options* o = (const options*)arg;
    ddp_desc dd = {0};
    ddp_pg* pg;
    uint64_t s0, s1, s2, mine[2], all[2 * 64];
    char key[32];
    float *x, *gathered, *relay;
    size_t i, n = o->count;
    int W, r, same = 1;
    dd.device.type = DDP_DEVICE_CPU;
    DDP_CHECK(ddp_init(&dd, &pg));
    W = ddp_world_size(pg);
    x = (float*)malloc(n * sizeof *x), relay = (float*)calloc(n, sizeof *relay);
    gathered = (float*)malloc(n * (size_t)W * sizeof *gathered);
    if (!x || !relay || !gathered) return 1;
    for (i = 0; i < n; i++) x[i] = (float)(rank + 1); /* the sum is 1 + 2 + ... + W everywhere */

    ddp_pg_bytes(pg, &s0, NULL);
    DDP_CHECK(ddp_all_reduce(pg, x, n, DDP_F32, DDP_SUM, NULL));
    ddp_pg_bytes(pg, &s1, NULL);
    s2 = s1;
    if (!o->ring_only) { /* the relay: every rank's whole tensor travels to every other rank */
        float* mine_x = (float*)malloc(n * sizeof *mine_x);
        if (!mine_x) return 1;
        for (i = 0; i < n; i++) mine_x[i] = (float)(rank + 1);
        DDP_CHECK(ddp_all_gather(pg, mine_x, gathered, n, DDP_F32, NULL));
        ddp_pg_bytes(pg, &s2, NULL);
        for (r = 0; r < W; r++)
            for (i = 0; i < n; i++) relay[i] += gathered[(size_t)r * n + i];
        for (i = 0; i < n; i++) same &= relay[i] == x[i];
        free(mine_x);
    }
    mine[0] = s1 - s0, mine[1] = s2 - s1;
    /* rank 0 prints everyone's counts: they travel through the rendezvous store, so they add
       no bytes to the counters */
    snprintf(key, sizeof key, "demo/bytes/%d", rank);
    DDP_CHECK(ddp_store_set(ddp_pg_store(pg), key, mine, sizeof mine));
    if (rank == 0) {
        for (r = 0; r < W; r++) {
            snprintf(key, sizeof key, "demo/bytes/%d", r);
            DDP_CHECK(ddp_store_get(ddp_pg_store(pg), key, &all[2 * r], 2 * sizeof(uint64_t), NULL));
        }
        double S = (double)(n * sizeof(float));
        printf("%d ranks, all-reduce of S = %zu bytes (%zu floats); bytes each rank sent:\n", W, n * sizeof(float), n);
        printf("  rank  ring (reduce-scatter + all-gather)%s\n", o->ring_only ? "" : "  whole-tensor relay");
        for (r = 0; r < W; r++) {
            printf("  %4d  %10llu = %.2f x S", r, (unsigned long long)all[2 * r], (double)all[2 * r] / S);
            if (!o->ring_only) printf("               %10llu = %.2f x S", (unsigned long long)all[2 * r + 1], (double)all[2 * r + 1] / S);
            printf("\n");
        }
        printf("  formula  2(N-1)/N x S = %.2f x S", 2.0 * (W - 1) / W);
        if (!o->ring_only) printf("          (N-1) x S = %.2f x S", (double)(W - 1));
        printf("\n");
        if (!o->ring_only) printf("both give the sum %g in every element: %s\n", (double)x[0], same ? "yes" : "NO");
    }
    free(x), free(gathered), free(relay);
    DDP_CHECK(ddp_barrier(pg)); /* rank 0 hosts the store: it leaves last */
    ddp_destroy(pg);
    return same ? 0 : 1;
}

int main(int argc, char** argv) {
    options o = {.nproc = 4, .count = 262144};
    int i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc") && i + 1 < argc) o.nproc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bytes") && i + 1 < argc) {
            char* end;
            double b = strtod(argv[++i], &end);
            if (*end == 'K') b *= 1024;
            else if (*end == 'M') b *= 1024 * 1024;
            o.count = (size_t)(b / sizeof(float));
        } else if (!strcmp(argv[i], "--ring-only")) o.ring_only = 1;
        else {
            fprintf(stderr, "usage: %s [--nproc N (1-64)] [--bytes S[K|M]] [--ring-only]\n", argv[0]);
            return 2;
        }
    }
    if (o.nproc < 1 || o.nproc > 64 || o.count < 1) {
        fprintf(stderr, "%s: --nproc must be 1-64 and --bytes at least 4\n", argv[0]);
        return 2;
    }
    return ddp_spawn(o.nproc, run, &o) == DDP_OK ? 0 : 1;
}
