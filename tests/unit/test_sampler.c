/* tests/unit/test_sampler.c: the distributed sampler (PyTorch's DistributedSampler rules: sizes,
   padding, strided ranks, epochs, errors) and the loader over it, on the CPU. The library's
   allocator is counted here, to show a loader allocates nothing per batch. */
#include <stddef.h> /* size_t for the allocator below; defines nothing POSIX needs */
static long g_allocs;     /* DDP_MALLOC calls so far */
static long g_fail_after = -1; /* >= 0: that many more allocations succeed, then they fail */
static void* counted_malloc(size_t n);
static void counted_free(void* p);
#define DDP_MALLOC(n) counted_malloc(n)
#define DDP_FREE(p) counted_free(p)
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>

static pthread_mutex_t g_alloc_lock = PTHREAD_MUTEX_INITIALIZER; /* the store's thread allocates too */
static void* counted_malloc(size_t n) {
    void* p = NULL;
    pthread_mutex_lock(&g_alloc_lock);
    if (g_fail_after != 0) {
        if (g_fail_after > 0) g_fail_after--;
        g_allocs++;
        p = malloc(n);
    }
    pthread_mutex_unlock(&g_alloc_lock);
    return p;
}
static void counted_free(void* p) { free(p); }

/* ---- helpers ----------------------------------------------------------------------------------- */

static ddp_sampler_desc desc_of(int R, int rank, int drop_last, int shuffle, uint64_t seed) {
    ddp_sampler_desc d;
    memset(&d, 0, sizeof d);
    d.num_replicas = R;
    d.rank = rank;
    d.drop_last = drop_last;
    d.in_order = !shuffle;
    d.seed = seed;
    return d;
}

/* The epoch's order as PyTorch builds it: ddp_permutation(n, seed + epoch) or 0..n-1. */
static void epoch_order(int n, int shuffle, uint64_t seed, int epoch, int* out) {
    int i;
    if (shuffle) ddp_permutation(n, seed + (uint64_t)epoch, out);
    else
        for (i = 0; i < n; i++) out[i] = i;
}

/* A data set whose row i is (i*10 + j for each feature j), label i % 3: a row names its sample. */
static ddp_dataset make_data(int n, int f) {
    ddp_dataset d;
    int i, j;
    d.n = n, d.nfeatures = f, d.nclasses = 3;
    d.x = (float*)malloc((size_t)(n ? n : 1) * f * sizeof(float));
    d.y = (int*)malloc((size_t)(n ? n : 1) * sizeof(int));
    for (i = 0; i < n; i++) {
        for (j = 0; j < f; j++) d.x[i * f + j] = (float)(i * 10 + j);
        d.y[i] = i % 3;
    }
    return d;
}
static void free_data(ddp_dataset* d) { free(d->x), free(d->y); }

/* ---- cases ------------------------------------------------------------------------------------- */

/* (a) sizes, coverage, disjointness and padding for many shapes. */
static void sizes_coverage_and_padding(void) {
    static const int ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 16, 17, 18, 27, 36, 63, 64, 100, 101, 199, 200};
    int ni, R, dl, sh, rank, i, k, checked = 0;
    int *order = (int*)malloc(200 * sizeof(int)), *idx = (int*)malloc(201 * sizeof(int));
    int *seen = (int*)malloc(200 * sizeof(int)), *owner = (int*)malloc(400 * sizeof(int));
    for (ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++)
        for (R = 1; R <= 9; R++)
            for (dl = 0; dl < 2; dl++)
                for (sh = 0; sh < 2; sh++) {
                    int n = ns[ni], want_ns, want_total, pad_total, epoch = 3;
                    uint64_t seed = 7;
                    /* PyTorch's formulas, in floating point as Python computes them */
                    want_ns = (dl && n % R) ? (int)ceil((double)(n - R) / R) : (int)ceil((double)n / R);
                    want_total = want_ns * R;
                    pad_total = want_total - n; /* < 0: dropped */
                    epoch_order(n, sh, seed, epoch, order);
                    memset(seen, 0, 200 * sizeof(int));
                    for (i = 0; i < 400; i++) owner[i] = -1;
                    for (rank = 0; rank < R; rank++) {
                        ddp_sampler s;
                        ddp_sampler_desc d = desc_of(R, rank, dl, sh, seed);
                        int pad_here = 0;
                        CHECK_OK(ddp_sampler_init(&s, n, &d));
                        ddp_sampler_set_epoch(&s, epoch);
                        CHECKF(s.num_samples == want_ns && s.total_size == want_total,
                               "n %d R %d drop_last %d: num_samples %d total %d, want %d %d", n, R, dl,
                               s.num_samples, s.total_size, want_ns, want_total);
                        if (s.num_samples != want_ns) continue;
                        for (k = 0; k <= 200; k++) idx[k] = -7;
                        ddp_sampler_indices(&s, idx);
                        for (k = 0; k < s.num_samples; k++) {
                            int p = rank + k * R; /* the position in the padded list */
                            int want = order[p % (n ? n : 1)];
                            CHECKF(idx[k] == want, "n %d R %d dl %d sh %d rank %d: idx[%d] = %d, want %d", n, R,
                                   dl, sh, rank, k, idx[k], want);
                            CHECKF(owner[p] == -1, "position %d taken twice", p);
                            owner[p] = rank;
                            if (p >= n) pad_here++;
                            else if (idx[k] >= 0 && idx[k] < n) seen[idx[k]]++;
                        }
                        /* the padding is the rank's last entries */
                        for (k = 0; k < s.num_samples; k++)
                            CHECK((rank + k * R >= n) == (k >= s.num_samples - pad_here));
                        CHECKF(ddp_sampler_padding(&s) == pad_here, "n %d R %d dl %d rank %d: padding %d, want %d",
                               n, R, dl, rank, ddp_sampler_padding(&s), pad_here);
                        if (dl) CHECK(ddp_sampler_padding(&s) == 0);
                        CHECK(idx[s.num_samples] == -7); /* nothing written past num_samples */
                        checked++;
                    }
                    /* every position exactly once; the samples before the padding all distinct */
                    for (i = 0; i < want_total; i++) CHECK(owner[i] >= 0);
                    if (pad_total >= 0) {
                        for (i = 0; i < n; i++)
                            CHECKF(seen[i] == 1, "n %d R %d: sample %d seen %d times", n, R, i, seen[i]);
                    } else {
                        int distinct = 0;
                        for (i = 0; i < n; i++) {
                            CHECK(seen[i] <= 1);
                            distinct += seen[i];
                        }
                        CHECK(distinct == want_total);
                    }
                }
    CHECK(checked > 1000);
    free(order), free(idx), free(seen), free(owner);
}

/* The padding entries, as a multiset, are the front of the order repeated (n < R cycles). */
static void padding_repeats_the_front(void) {
    static const int cases[][2] = {{10, 4}, {1, 9}, {2, 9}, {3, 7}, {5, 8}, {7, 3}, {101, 9}};
    int c, rank, k, order[128], npad;
    for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        int n = cases[c][0], R = cases[c][1];
        int want_pad = ((n + R - 1) / R) * R - n;
        npad = 0;
        epoch_order(n, 1, 11, 0, order);
        for (rank = 0; rank < R; rank++) {
            ddp_sampler s;
            ddp_sampler_desc d = desc_of(R, rank, 0, 1, 11);
            int idx[128];
            CHECK_OK(ddp_sampler_init(&s, n, &d));
            ddp_sampler_indices(&s, idx);
            for (k = s.num_samples - ddp_sampler_padding(&s); k < s.num_samples; k++) {
                int p = rank + k * R; /* padding entry number p - n */
                CHECK(idx[k] == order[(p - n) % n]);
                npad++;
            }
        }
        CHECKF(npad == want_pad, "n %d R %d: %d padding entries, want %d", n, R, npad, want_pad);
    }
}

/* (b) PyTorch's documented example: N = 10, R = 4, no shuffle. */
static void strided_like_pytorch(void) {
    static const int want[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
    static const int want_pad[4] = {0, 0, 1, 1};
    int rank, k;
    for (rank = 0; rank < 4; rank++) {
        ddp_sampler s;
        ddp_sampler_desc d = desc_of(4, rank, 0, 0, 0);
        int idx[3];
        CHECK_OK(ddp_sampler_init(&s, 10, &d));
        CHECK(s.num_samples == 3 && s.total_size == 12);
        ddp_sampler_indices(&s, idx);
        for (k = 0; k < 3; k++)
            CHECKF(idx[k] == want[rank][k], "rank %d: idx[%d] = %d, want %d", rank, k, idx[k], want[rank][k]);
        CHECK(ddp_sampler_padding(&s) == want_pad[rank]);
    }
    /* drop_last: 10 over 4 keeps 8, rank 3 gets 3 and 7 */
    {
        ddp_sampler s;
        ddp_sampler_desc d = desc_of(4, 3, 1, 0, 0);
        int idx[2];
        CHECK_OK(ddp_sampler_init(&s, 10, &d));
        CHECK(s.num_samples == 2 && s.total_size == 8);
        ddp_sampler_indices(&s, idx);
        CHECK(idx[0] == 3 && idx[1] == 7);
    }
}

static int same(const int* a, const int* b, int n) { return !memcmp(a, b, (size_t)n * sizeof(int)); }

/* (c) set_epoch and the seed. */
static void epochs_and_seeds(void) {
    ddp_sampler s, s2;
    ddp_sampler_desc d = desc_of(1, 0, 0, 1, 5);
    int a[100], b[100], c[100], full[100], rank, k;
    CHECK_OK(ddp_sampler_init(&s, 100, &d));
    ddp_sampler_indices(&s, a); /* epoch 0 by default */
    ddp_sampler_set_epoch(&s, 0);
    ddp_sampler_indices(&s, b);
    CHECK(same(a, b, 100));
    ddp_sampler_set_epoch(&s, 1);
    ddp_sampler_indices(&s, b);
    CHECK(!same(a, b, 100));
    ddp_sampler_indices(&s, c); /* the same epoch again: the same order */
    CHECK(same(b, c, 100));
    ddp_sampler_set_epoch(&s, 2);
    ddp_sampler_indices(&s, c);
    CHECK(!same(b, c, 100) && !same(a, c, 100));
    /* another seed, same epoch: another order */
    d.seed = 6;
    CHECK_OK(ddp_sampler_init(&s2, 100, &d));
    ddp_sampler_set_epoch(&s2, 1);
    ddp_sampler_indices(&s2, c);
    CHECK(!same(b, c, 100));
    /* every rank's view is a slice of the same permutation of seed + epoch */
    ddp_permutation(100, 5 + 4, full);
    for (rank = 0; rank < 7; rank++) {
        ddp_sampler_desc dr = desc_of(7, rank, 0, 1, 5);
        CHECK_OK(ddp_sampler_init(&s, 100, &dr));
        ddp_sampler_set_epoch(&s, 4);
        ddp_sampler_indices(&s, a);
        ddp_sampler_indices(&s, b);
        CHECK(same(a, b, s.num_samples));
        for (k = 0; k < s.num_samples; k++) CHECK(a[k] == full[(rank + 7 * k) % 100]);
    }
    /* no shuffle: the epoch changes nothing */
    {
        ddp_sampler_desc dn = desc_of(3, 1, 0, 0, 5);
        CHECK_OK(ddp_sampler_init(&s, 100, &dn));
        ddp_sampler_indices(&s, a);
        ddp_sampler_set_epoch(&s, 9);
        ddp_sampler_indices(&s, b);
        CHECK(same(a, b, s.num_samples));
        CHECK(a[0] == 1 && a[1] == 4 && a[33] == 0); /* position 100 is padding: sample 0 */
    }
}

/* (d) one replica with shuffling is ddp_permutation(n, seed + epoch); NULL desc means defaults. */
static void one_replica_is_a_seeded_shuffle(void) {
    int n, epoch, a[150], want[150];
    ddp_sampler s;
    for (n = 0; n <= 150; n += 25)
        for (epoch = 0; epoch < 3; epoch++) {
            ddp_sampler_desc d = desc_of(0, 0, 0, 1, 42); /* num_replicas 0 means 1 */
            CHECK_OK(ddp_sampler_init(&s, n, &d));
            CHECK(s.num_replicas == 1 && s.rank == 0 && s.num_samples == n && s.total_size == n);
            ddp_sampler_set_epoch(&s, epoch);
            ddp_sampler_indices(&s, a);
            ddp_permutation(n, 42 + (uint64_t)epoch, want);
            CHECKF(same(a, want, n), "n %d epoch %d", n, epoch);
            CHECK(ddp_sampler_padding(&s) == 0);
        }
    CHECK_OK(ddp_sampler_init(&s, 30, NULL));
    CHECK(s.num_replicas == 1 && s.rank == 0 && s.shuffle && !s.drop_last && s.seed == 0 && s.epoch == 0);
    ddp_sampler_indices(&s, a);
    ddp_permutation(30, 0, want);
    CHECK(same(a, want, 30));
}

/* When there is no memory for the order, the indices are still the same. */
static void indices_without_memory(void) {
    int rank, a[40], b[40];
    for (rank = 0; rank < 3; rank++) {
        ddp_sampler s;
        ddp_sampler_desc d = desc_of(3, rank, rank == 2, 1, 99);
        CHECK_OK(ddp_sampler_init(&s, 100, &d));
        ddp_sampler_set_epoch(&s, 12);
        ddp_sampler_indices(&s, a);
        g_fail_after = 0;
        ddp_sampler_indices(&s, b);
        g_fail_after = -1;
        CHECK(same(a, b, s.num_samples));
    }
}

/* (e) errors name the field and its value. */
static void errors(void) {
    ddp_sampler s;
    ddp_sampler_desc d = desc_of(-2, 0, 0, 1, 0);
    CHECK_FAILS(ddp_sampler_init(&s, 10, &d), DDP_ERR_INVALID_ARGUMENT, "num_replicas is -2");
    d = desc_of(4, 4, 0, 1, 0);
    CHECK_FAILS(ddp_sampler_init(&s, 10, &d), DDP_ERR_INVALID_ARGUMENT, "rank is 4");
    d = desc_of(4, -1, 0, 1, 0);
    CHECK_FAILS(ddp_sampler_init(&s, 10, &d), DDP_ERR_INVALID_ARGUMENT, "rank is -1");
    d = desc_of(0, 1, 0, 1, 0); /* one replica by default: rank 1 is outside it */
    CHECK_FAILS(ddp_sampler_init(&s, 10, &d), DDP_ERR_INVALID_ARGUMENT, "rank is 1");
    d = desc_of(2, 0, 0, 1, 0);
    CHECK_FAILS(ddp_sampler_init(&s, -1, &d), DDP_ERR_INVALID_ARGUMENT, "n is -1");
    CHECK_FAILS(ddp_sampler_init(&s, 0x7fffffff, &d), DDP_ERR_INVALID_ARGUMENT, "2^31");
    CHECK(s.num_samples == 0 && s.total_size == 0);
}

/* (f) the loader: batches in the sampler's order, with the right rows. */
static void loader_batches(void) {
    ddp_dataset data = make_data(23, 4);
    ddp_sampler s;
    ddp_sampler_desc d = desc_of(3, 1, 0, 1, 3); /* 8 indices per rank, the last one padding */
    ddp_loader l;
    int idx[8], epoch, bs;
    float wantx[8 * 4];
    int wanty[8];
    CHECK_OK(ddp_sampler_init(&s, data.n, &d));
    for (bs = 1; bs <= 9; bs++)
        for (epoch = 0; epoch < 2; epoch++) {
            const float* x = NULL;
            const int* y = NULL;
            int got, seen = 0, batches = 0, dl;
            for (dl = 0; dl < 2; dl++) {
                seen = batches = 0;
                CHECK_OK(ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = bs, .drop_last = dl}));
                ddp_sampler_set_epoch(&s, epoch);
                ddp_sampler_indices(&s, idx);
                CHECK_OK(ddp_loader_start(&l, &s));
                CHECK(ddp_loader_batches(&l) == (dl ? 8 / bs : (8 + bs - 1) / bs));
                while ((got = ddp_loader_next(&l, &x, &y)) > 0) {
                    int i;
                    CHECK(got == (8 - seen < bs ? 8 - seen : bs));
                    CHECK(!dl || got == bs);
                    ddp__dataset_gather(&data, idx + seen, got, wantx, wanty);
                    CHECK(!memcmp(x, wantx, (size_t)got * 4 * sizeof(float)));
                    CHECK(!memcmp(y, wanty, (size_t)got * sizeof(int)));
                    for (i = 0; i < got; i++) CHECK(x[i * 4 + 2] == (float)(idx[seen + i] * 10 + 2));
                    seen += got;
                    batches++;
                }
                CHECKF(batches == ddp_loader_batches(&l), "bs %d dl %d: %d batches, ddp_loader_batches %d", bs, dl,
                       batches, ddp_loader_batches(&l));
                CHECK(seen == (dl ? 8 / bs * bs : 8));
                CHECK(ddp_loader_next(&l, &x, &y) == 0); /* stays over */
                ddp_loader_free(&l);
                CHECK(l.x == NULL && l.y == NULL && l.order == NULL && l.batch_size == 0);
            }
        }
    /* one replica, two epochs: every sample once per epoch, in two different orders */
    {
        ddp_sampler one;
        int first[23], k = 0, got, i, count[23];
        const float* x;
        const int* y;
        CHECK_OK(ddp_sampler_init(&one, data.n, NULL));
        CHECK_OK(ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = 5}));
        for (epoch = 0; epoch < 2; epoch++) {
            int differs = 0;
            memset(count, 0, sizeof count);
            ddp_sampler_set_epoch(&one, epoch);
            CHECK_OK(ddp_loader_start(&l, &one));
            CHECK(ddp_loader_batches(&l) == 5);
            k = 0;
            while ((got = ddp_loader_next(&l, &x, &y)) > 0)
                for (i = 0; i < got; i++, k++) {
                    int sample = (int)x[i * 4] / 10;
                    CHECK(y[i] == sample % 3);
                    count[sample]++;
                    if (epoch == 0) first[k] = sample;
                    else differs |= first[k] != sample;
                }
            CHECK(k == 23);
            for (i = 0; i < 23; i++) CHECK(count[i] == 1);
            if (epoch == 1) CHECK(differs);
        }
        ddp_loader_free(&l);
    }
    /* batch 0 (and no desc) is PyTorch's default, 1: one batch per sample */
    CHECK_OK(ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = 0}));
    CHECK(l.batch_size == 1);
    ddp_loader_free(&l);
    CHECK_OK(ddp_loader_init(&l, &data, NULL));
    CHECK(l.batch_size == 1 && l.drop_last == 0);
    ddp_loader_free(&l);
    /* refused: a negative batch, NULL data, a sampler over more samples than the data set */
    CHECK_FAILS(ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = -3}), DDP_ERR_INVALID_ARGUMENT,
                "batch_size is -3");
    CHECK_FAILS(ddp_loader_init(&l, NULL, NULL), DDP_ERR_INVALID_ARGUMENT, "data is NULL");
    CHECK_OK(ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = 4}));
    CHECK_OK(ddp_sampler_init(&s, 24, NULL));
    CHECK_FAILS(ddp_loader_start(&l, &s), DDP_ERR_INVALID_ARGUMENT, "24");
    ddp_loader_free(&l);
    ddp_loader_free(NULL);
    free_data(&data);
}

/* An empty data set gives empty epochs, not a crash. */
static void loader_empty(void) {
    ddp_dataset data = make_data(0, 3);
    ddp_sampler s;
    ddp_loader l;
    const float* x;
    const int* y;
    CHECK_OK(ddp_sampler_init(&s, 0, NULL));
    CHECK(s.num_samples == 0 && ddp_sampler_padding(&s) == 0);
    CHECK_OK(ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = 8}));
    CHECK_OK(ddp_loader_start(&l, &s));
    CHECK(ddp_loader_batches(&l) == 0);
    CHECK(ddp_loader_next(&l, &x, &y) == 0);
    ddp_loader_free(&l);
    free_data(&data);
}

/* (g) after the first start, nothing is allocated: not per batch, not per epoch. */
static void loader_allocates_nothing_per_batch(void) {
    ddp_dataset data = make_data(100, 6);
    ddp_sampler s;
    ddp_sampler_desc d = desc_of(4, 2, 0, 1, 1);
    ddp_loader l;
    const float *x, *x0 = NULL;
    const int *y, *y0 = NULL;
    long before;
    int epoch, got, batches = 0, moved = 0;
    CHECK_OK(ddp_sampler_init(&s, data.n, &d));
    CHECK_OK(ddp_loader_init(&l, &data, &(ddp_loader_desc){.batch_size = 7}));
    CHECK_OK(ddp_loader_start(&l, &s));
    before = g_allocs;
    for (epoch = 0; epoch < 4; epoch++) {
        ddp_sampler_set_epoch(&s, epoch);
        CHECK_OK(ddp_loader_start(&l, &s));
        while ((got = ddp_loader_next(&l, &x, &y)) > 0) {
            if (!x0) x0 = x, y0 = y;
            moved += x != x0 || y != y0;
            batches++;
        }
    }
    CHECK(batches == 4 * 4); /* 25 per rank in batches of 7 */
    CHECK(moved == 0);
    CHECKF(g_allocs == before, "%ld allocations during 4 epochs", g_allocs - before);
    ddp_loader_free(&l);
    free_data(&data);
}

/* With a process group, the replicas and the rank come from it. */
static int pg_main(int rank, void* arg) {
    ddp_desc dd;
    ddp_pg* pg;
    ddp_sampler s, ref;
    ddp_sampler_desc d, dr;
    int idx[8], want[8], k, bad = 0;
    (void)arg;
    memset(&dd, 0, sizeof dd);
    dd.device.type = DDP_DEVICE_CPU;
    dd.timeout_s = 60;
    if (ddp_init(&dd, &pg) != DDP_OK) {
        printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string());
        return 1;
    }
    memset(&d, 0, sizeof d);
    d.pg = pg;
    d.num_replicas = 99, d.rank = 98; /* ignored with a group */
    d.seed = 4;
    dr = desc_of(3, rank, 0, 1, 4);
    bad += ddp_sampler_init(&s, 22, &d) != DDP_OK;
    bad += ddp_sampler_init(&ref, 22, &dr) != DDP_OK;
    bad += s.num_replicas != 3 || s.rank != rank || s.rank != ddp_rank(pg) || s.num_samples != 8;
    ddp_sampler_set_epoch(&s, 2), ddp_sampler_set_epoch(&ref, 2);
    ddp_sampler_indices(&s, idx), ddp_sampler_indices(&ref, want);
    for (k = 0; k < 8; k++) bad += idx[k] != want[k];
    /* ddp_destroy does not wait for the others: without this, rank 0 can close the store while a
       slower rank still waits in ddp_init's barrier */
    bad += ddp_barrier(pg) != DDP_OK;
    ddp_destroy(pg);
    if (bad) printf("    rank %d: %d mismatches\n", rank, bad);
    return bad ? 1 : 0;
}
static void replicas_from_a_process_group(void) { CHECK_OK(ddp_spawn(3, pg_main, NULL)); }

int main(void) {
    RUN(sizes_coverage_and_padding);
    RUN(padding_repeats_the_front);
    RUN(strided_like_pytorch);
    RUN(epochs_and_seeds);
    RUN(one_replica_is_a_seeded_shuffle);
    RUN(indices_without_memory);
    RUN(errors);
    RUN(loader_batches);
    RUN(loader_empty);
    RUN(loader_allocates_nothing_per_batch);
    RUN(replicas_from_a_process_group);
    return H_EXIT();
}
