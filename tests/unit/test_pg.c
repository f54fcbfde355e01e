/* The process group with real processes and real sockets: every collective of the CPU backend
   for world sizes 1 to 8, every dtype and op, sizes 0, 1, 7, one not divisible by the world size
   and 64 MiB, checked element by element against a double-precision reference; results
   bit-identical on every rank; several collectives in flight completing in issue order. Ranks
   are started with ddp_spawn, so this also tests spawning. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <fcntl.h>
#include <sys/time.h>

/* Each rank's input is a function of (rank, index, salt), exactly representable in the dtype,
   so every rank can compute every other rank's input and the reference. */
static float input_value(int rank, size_t i, int salt, ddp_dtype t) {
    uint64_t h = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^ (uint64_t)salt;
    float v;
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    v = (float)((int64_t)(h % 2001) - 1000) / 64.0f; /* -15.6 .. 15.6 */
    if (t == DDP_F16) v = ddp_f16_to_f32(ddp_f32_to_f16(v));
    if (t == DDP_BF16) v = ddp_bf16_to_f32(ddp_f32_to_bf16(v));
    return v;
}

static void fill(void* buf, size_t n, int rank, size_t offset, int salt, ddp_dtype t) {
    size_t i;
    for (i = 0; i < n; i++) {
        float v = input_value(rank, offset + i, salt, t);
        if (t == DDP_F32) ((float*)buf)[i] = v;
        else if (t == DDP_F16) ((uint16_t*)buf)[i] = ddp_f32_to_f16(v);
        else ((uint16_t*)buf)[i] = ddp_f32_to_bf16(v);
    }
}

static float get(const void* buf, size_t i, ddp_dtype t) {
    if (t == DDP_F32) return ((const float*)buf)[i];
    if (t == DDP_F16) return ddp_f16_to_f32(((const uint16_t*)buf)[i]);
    return ddp_bf16_to_f32(((const uint16_t*)buf)[i]);
}

/* Unit roundoff of each dtype: the largest relative error of one rounding. */
static double unit(ddp_dtype t) { return t == DDP_F32 ? 0x1p-24 : t == DDP_F16 ? 0x1p-11 : 0x1p-8; }

/* Compare out[0..n) with op over all W ranks of input(rank, offset + i). The ring rounds once per
   addition (W-1 of them) and once when averaging, each time by at most `unit` of the partial
   sum's size, which is at most the sum of magnitudes: so |error| <= (W + 1) * unit * sum |x|.
   The maximum involves no rounding and must be exact. Returns the number of bad elements. */
static long check(const void* out, size_t n, int W, size_t offset, int salt, ddp_dtype t, ddp_reduce_op op,
                  const char* what, int me) {
    size_t i;
    long bad = 0;
    int r;
    for (i = 0; i < n; i++) {
        double sum = 0, mag = 0, mx = -1e300, want, tol, got = get(out, i, t);
        for (r = 0; r < W; r++) {
            double x = input_value(r, offset + i, salt, t);
            sum += x, mag += fabs(x);
            if (x > mx) mx = x;
        }
        want = op == DDP_MAX ? mx : op == DDP_AVG ? sum / W : sum;
        tol = op == DDP_MAX ? 0 : (W + 1) * unit(t) * (op == DDP_AVG ? mag / W : mag);
        if (!(fabs(got - want) <= tol)) {
            if (bad < 3)
                printf("    rank %d %s: element %zu is %.9g, expected %.9g (tolerance %.3g)\n", me, what, i, got,
                       want, tol);
            bad++;
        }
    }
    return bad;
}

/* A fingerprint of a buffer, to check that every rank ended with the same bits. */
static uint64_t digest(const void* p, size_t nbytes) { return ddp__fnv1a((const unsigned char*)p, nbytes); }

/* Every rank publishes its digest under `name`; rank 0 compares them all. */
static long same_everywhere(ddp_pg* pg, const char* name, const void* buf, size_t nbytes) {
    char key[160];
    uint64_t mine = digest(buf, nbytes), theirs = 0;
    size_t n;
    int r;
    long bad = 0;
    snprintf(key, sizeof key, "test/%s/%d", name, ddp_rank(pg));
    if (ddp_store_set(ddp_pg_store(pg), key, &mine, sizeof mine) != DDP_OK) return 1;
    if (ddp_rank(pg) != 0) return 0;
    for (r = 1; r < ddp_world_size(pg); r++) {
        snprintf(key, sizeof key, "test/%s/%d", name, r);
        if (ddp_store_get(ddp_pg_store(pg), key, &theirs, sizeof theirs, &n) != DDP_OK || theirs != mine) {
            printf("    %s: rank %d's result differs from rank 0's\n", name, r);
            bad++;
        }
    }
    return bad;
}

typedef struct { size_t big; } suite_arg;
static int g_case;

/* The large-buffer case: every collective over `n` f32 elements in all (64 MiB), so that the
   pipelining over many pieces and the buffers' growth are exercised once. */
static long big_collectives(ddp_pg* pg, size_t n, unsigned char* buf, unsigned char* buf2) {
    int W = ddp_world_size(pg), me = ddp_rank(pg);
    size_t per = n / (size_t)W, i;
    long bad = 0;
    fill(buf, n, me, 0, ++g_case, DDP_F32);
    if (ddp_all_reduce(pg, buf, n, DDP_F32, DDP_SUM, NULL) != DDP_OK) return 1;
    bad += check(buf, n, W, 0, g_case, DDP_F32, DDP_SUM, "all_reduce 64 MiB", me);
    bad += same_everywhere(pg, "big all_reduce", buf, n * 4);
    fill(buf, per * (size_t)W, me, 0, ++g_case, DDP_F32);
    if (ddp_reduce_scatter(pg, buf, buf2, per, DDP_F32, DDP_SUM, NULL) != DDP_OK) return bad + 1;
    bad += check(buf2, per, W, (size_t)me * per, g_case, DDP_F32, DDP_SUM, "reduce_scatter 64 MiB", me);
    fill(buf, per, me, (size_t)me * per, ++g_case, DDP_F32);
    if (ddp_all_gather(pg, buf, buf2, per, DDP_F32, NULL) != DDP_OK) return bad + 1;
    for (i = 0; i < per * (size_t)W; i++)
        if (((float*)buf2)[i] != input_value((int)(i / per), i, g_case, DDP_F32)) {
            printf("    rank %d all_gather 64 MiB: wrong element %zu\n", me, i);
            bad++;
            break;
        }
    fill(buf, n, me, 0, ++g_case, DDP_F32);
    if (ddp__broadcast(pg, buf, n, DDP_F32, W - 1, NULL) != DDP_OK) return bad + 1;
    for (i = 0; i < n; i++)
        if (((float*)buf)[i] != input_value(W - 1, i, g_case, DDP_F32)) {
            printf("    rank %d broadcast 64 MiB: wrong element %zu\n", me, i);
            bad++;
            break;
        }
    return bad;
}

/* NCCL's in-place layouts, right on every backend: all-gather with send at this rank's slot of
   recv, reduce-scatter with recv at this rank's slot of send (the slots of the others are left as
   they were by reduce-scatter only where the backend works on a copy, so they are not checked). Any
   other overlap is refused with DDP_ERR_INVALID_ARGUMENT, naming the layout, and the group goes on. */
static long in_place_layouts(ddp_pg* pg, unsigned char* buf, ddp_dtype t, size_t n, ddp_reduce_op op) {
    const int W = ddp_world_size(pg), me = ddp_rank(pg);
    const size_t es = ddp_dtype_size(t);
    char what[96];
    long bad = 0;
    size_t i;
    int r;
    snprintf(what, sizeof what, "in-place all_gather %s n=%zu", ddp__dtype_name(t), n);
    memset(buf, 0x7f, (size_t)W * n * es);
    fill(buf + (size_t)me * n * es, n, me, (size_t)me * n, ++g_case, t);
    if (ddp_all_gather(pg, buf + (size_t)me * n * es, buf, n, t, NULL) != DDP_OK) {
        printf("    rank %d %s: %s\n", me, what, ddp_error_string());
        return 1;
    }
    for (r = 0; r < W; r++)
        for (i = 0; i < n; i++)
            if (get(buf, (size_t)r * n + i, t) != input_value(r, (size_t)r * n + i, g_case, t)) {
                if (bad < 3) printf("    rank %d %s: wrong element %zu of rank %d\n", me, what, i, r);
                bad++;
            }
    snprintf(what, sizeof what, "in-place reduce_scatter %s %s n=%zu", ddp__dtype_name(t), ddp__op_name(op), n);
    fill(buf, (size_t)W * n, me, 0, ++g_case, t);
    if (ddp_reduce_scatter(pg, buf, buf + (size_t)me * n * es, n, t, op, NULL) != DDP_OK) {
        printf("    rank %d %s: %s\n", me, what, ddp_error_string());
        return bad + 1;
    }
    bad += check(buf + (size_t)me * n * es, n, W, (size_t)me * n, g_case, t, op, what, me);
    if (n < 2) return bad;
    /* one element off the in-place layout: refused on every rank, before anything is sent */
    if (ddp_all_gather(pg, buf + (size_t)me * n * es + es, buf, n, t, NULL) != DDP_ERR_INVALID_ARGUMENT ||
        !strstr(ddp_error_string(), "all_gather: send and recv overlap") || !strstr(ddp_error_string(), "in-place")) {
        printf("    rank %d: all_gather with send one element past its slot of recv: %s\n", me, ddp_error_string());
        bad++;
    }
    if (ddp_reduce_scatter(pg, buf, buf + (size_t)me * n * es + es, n, t, op, NULL) != DDP_ERR_INVALID_ARGUMENT ||
        !strstr(ddp_error_string(), "reduce_scatter: send and recv overlap")) {
        printf("    rank %d: reduce_scatter with recv one element past its slot of send: %s\n", me, ddp_error_string());
        bad++;
    }
    return bad;
}

/* The reducer's fused all-reduce on the CPU backend (ddp_work.tensors and premul): the data lives
   in tensors of uneven sizes (empty ones, odd ones, misaligned ones), not in the bucket, and each
   rank's input is first multiplied by premul. Shared memory's two-phase path reads and writes the
   tensors where they are, so the bucket, filled with a NaN pattern, must come back untouched; every
   other path (TCP, the one-step path, one rank) copies the tensors into the bucket and back, so the
   bucket must hold the result too. Two sets: small (the one-step path when it is on) and one that
   spans two shared-memory chunks (with DDP_SHM_CHUNK_BYTES=4096 the small one spans two as well).
   Without premul the sums are exact; with 1/W within rounding. */
static long fused_tensors(ddp_pg* pg) {
    static const size_t small[7] = {0, 1, 7, 1000, 33, 0, 5};
    const int W = ddp_world_size(pg), me = ddp_rank(pg);
    long bad = 0;
    int set, pre;
    for (set = 0; set < 2; set++)
        for (pre = 0; pre < 2; pre++) {
            size_t sizes[8], at[9], total = 0, i, j;
            float* t[8];
            void* mem[8];
            float* bucket;
            ddp__fused f;
            ddp_work* work;
            const float s = pre ? 1.0f / (float)W : 0.0f;
            const int salt = ++g_case, nt = set ? 8 : 7;
            int k, in_place, untouched = 1, copied = 1;
            memcpy(sizes, small, sizeof small);
            /* a chunk and a piece (a chunk holds shm_chunk bytes of each rank's data) */
            sizes[7] = (pg->shm ? pg->shm_chunk / 4 : 65536) + 1001;
            for (k = 0; k < nt; k++) {
                at[k] = total, total += sizes[k];
                mem[k] = malloc((sizes[k] + 1) * sizeof(float));
                t[k] = (float*)mem[k] + (k & 1); /* odd tensors 4 bytes off the allocation's alignment */
                for (j = 0; j < sizes[k]; j++) t[k][j] = input_value(me, at[k] + j, salt, DDP_F32);
            }
            at[nt] = total;
            bucket = (float*)malloc(total * sizeof(float));
            memset(bucket, 0xff, total * sizeof(float)); /* a NaN in every element */
            memset(&f, 0, sizeof f);
            f.premul = s, f.ntensors = nt, f.tensors = t, f.tensor_at = at;
            in_place = W > 1 && pg->shm && !(W > 2 && total * 4 <= pg->shm_one_step && total * 4 <= pg->shm_chunk);
            if (ddp__collective(pg, DDP__ALL_REDUCE, bucket, NULL, total, DDP_F32, DDP_SUM, 0, 0, &f, &work) != DDP_OK ||
                ddp_work_wait(work) != DDP_OK) {
                printf("    rank %d: fused all-reduce of %zu floats: %s\n", me, total, ddp_error_string());
                bad++;
            }
            for (k = 0; k < nt && !bad; k++)
                for (j = 0; j < sizes[k]; j++) {
                    double want = 0, mag = 0, got = t[k][j];
                    uint32_t bits;
                    int q;
                    i = at[k] + j;
                    for (q = 0; q < W; q++) {
                        float v = input_value(q, i, salt, DDP_F32);
                        float x = pre ? v * s : v;
                        want += x, mag += fabs(x);
                    }
                    if (pre ? fabs(got - want) > 1e-6 * mag + 1e-30 : got != want) {
                        if (bad < 3)
                            printf("    rank %d: fused all-reduce, %s premul, %zu floats: element %zu (tensor %d) is "
                                   "%.9g, expected %.9g\n", me, pre ? "with" : "without", total, i, k, got, want);
                        bad++;
                    }
                    memcpy(&bits, &bucket[i], 4);
                    untouched &= bits == 0xffffffffu;
                    copied &= bucket[i] == t[k][j];
                }
            if (!bad && in_place && !untouched) {
                printf("    rank %d: shared memory's two phases wrote the bucket (%zu floats): they should read and "
                       "write the tensors where they are\n", me, total);
                bad++;
            }
            if (!bad && !in_place && !copied) {
                printf("    rank %d: the bucket (%zu floats) does not hold the result: a path that works on one "
                       "buffer should copy the tensors in and the result back out\n", me, total);
                bad++;
            }
            for (k = 0; k < nt; k++) free(mem[k]);
            free(bucket);
        }
    return bad;
}

/* What one rank runs: every collective over every dtype, op and size. Returns the number of
   failures (0 = the rank passes). */
static int rank_main(int rank, void* arg) {
    const suite_arg* a = (const suite_arg*)arg;
    ddp_desc d;
    ddp_pg* pg;
    const ddp_dtype types[3] = {DDP_F32, DDP_F16, DDP_BF16};
    const ddp_reduce_op ops[3] = {DDP_SUM, DDP_AVG, DDP_MAX};
    size_t sizes[6];
    int W, ti, oi, si, nsizes = 5, root;
    long bad = 0;
    unsigned char *buf, *buf2;
    (void)rank;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = 60;
    if (ddp_init(&d, &pg) != DDP_OK) {
        printf("    rank %d: ddp_init failed: %s\n", rank, ddp_error_string());
        return 1;
    }
    W = ddp_world_size(pg);
    sizes[0] = 0, sizes[1] = 1, sizes[2] = 7, sizes[3] = (size_t)W * 1000 + 3, sizes[4] = W <= 4 ? 100003 : 20011;
    buf = (unsigned char*)malloc((a->big > (size_t)W * 100003 ? a->big : (size_t)W * 100003) * 4 + 64);
    buf2 = (unsigned char*)malloc((a->big > (size_t)W * 100003 ? a->big : (size_t)W * 100003) * 4 + 64);
    if (a->big) bad += big_collectives(pg, a->big, buf, buf2);
    if (ddp_pg_backend(pg) == DDP_BACKEND_CPU) bad += fused_tensors(pg);
    for (si = 0; si < nsizes; si++) {
        size_t n = sizes[si];
        for (ti = 0; ti < 3; ti++) {
            ddp_dtype t = types[ti];
            size_t es = ddp_dtype_size(t);
            for (oi = 0; oi < 3; oi++) {
                char what[128];
                snprintf(what, sizeof what, "all_reduce %s %s n=%zu", ddp__dtype_name(t), ddp__op_name(ops[oi]), n);
                fill(buf, n, ddp_rank(pg), 0, ++g_case, t);
                if (ddp_all_reduce(pg, buf, n, t, ops[oi], NULL) != DDP_OK) {
                    printf("    rank %d %s: %s\n", rank, what, ddp_error_string());
                    bad++;
                    continue;
                }
                bad += check(buf, n, W, 0, g_case, t, ops[oi], what, ddp_rank(pg));
                bad += same_everywhere(pg, what, buf, n * es);
                /* reduce-scatter: n elements out per rank, from W*n in */
                snprintf(what, sizeof what, "reduce_scatter %s %s n=%zu", ddp__dtype_name(t), ddp__op_name(ops[oi]), n);
                fill(buf, n * (size_t)W, ddp_rank(pg), 0, ++g_case, t);
                if (ddp_reduce_scatter(pg, buf, buf2, n, t, ops[oi], NULL) != DDP_OK) {
                    printf("    rank %d %s: %s\n", rank, what, ddp_error_string());
                    bad++;
                    continue;
                }
                bad += check(buf2, n, W, (size_t)ddp_rank(pg) * n, g_case, t, ops[oi], what, ddp_rank(pg));
            }
            /* all-gather: rank r's n elements land at r*n on every rank */
            fill(buf, n, ddp_rank(pg), (size_t)ddp_rank(pg) * n, ++g_case, t);
            if (ddp_all_gather(pg, buf, buf2, n, t, NULL) != DDP_OK) {
                printf("    rank %d all_gather: %s\n", rank, ddp_error_string());
                bad++;
            } else {
                int r;
                size_t i;
                for (r = 0; r < W; r++)
                    for (i = 0; i < n; i++)
                        if (get(buf2, (size_t)r * n + i, t) != input_value(r, (size_t)r * n + i, g_case, t)) {
                            if (bad < 3) printf("    rank %d all_gather %s n=%zu: wrong element %zu of rank %d\n",
                                                rank, ddp__dtype_name(t), n, i, r);
                            bad++;
                        }
            }
            /* broadcast from every root */
            for (root = 0; root < W; root++) {
                size_t i;
                fill(buf, n, ddp_rank(pg), 0, ++g_case, t);
                if (ddp__broadcast(pg, buf, n, t, root, NULL) != DDP_OK) {
                    printf("    rank %d broadcast: %s\n", rank, ddp_error_string());
                    bad++;
                    continue;
                }
                for (i = 0; i < n; i++)
                    if (get(buf, i, t) != input_value(root, i, g_case, t)) {
                        if (bad < 3) printf("    rank %d broadcast from %d n=%zu: wrong element %zu\n", rank, root, n, i);
                        bad++;
                        break;
                    }
            }
        }
    }
    for (si = 2; si < 4; si++) /* in-place layouts: 7 elements and one not divisible by the world size */
        for (ti = 0; ti < 3; ti += 2) bad += in_place_layouts(pg, buf, types[ti], sizes[si], ops[si - 2]);
    if (ddp_barrier(pg) != DDP_OK) bad++;
    /* Byte counters: all-reduce sends 2(W-1)/W of the buffer per rank (the CPU ring; MPI does not
       say what its algorithms send). At this size the cost model picks the ring; DDP_ALGO=doubling
       (over TCP, 3 ranks or more) sends the whole buffer at each of its steps instead: log2(P) of
       them, one more where rank + P stands aside, and a rank that stands aside sends once. */
    if (ddp_pg_backend(pg) == DDP_BACKEND_CPU) {
        uint64_t s0, s1, want;
        size_t n = (size_t)W * 25000;
        const char *algo = getenv("DDP_ALGO"), *tr = getenv("DDP_TRANSPORT");
        ddp_pg_bytes(pg, &s0, NULL);
        fill(buf, n, ddp_rank(pg), 0, ++g_case, DDP_F32);
        if (ddp_all_reduce(pg, buf, n, DDP_F32, DDP_SUM, NULL) != DDP_OK) bad++;
        ddp_pg_bytes(pg, &s1, NULL);
        want = (uint64_t)(2 * (W - 1)) * (n / (size_t)W) * 4;
        if (W > 2 && algo && !strcmp(algo, "doubling") && tr && !strcmp(tr, "tcp")) {
            int P = 1, levels = 0, me = ddp_rank(pg);
            while (2 * P <= W) P *= 2, levels++;
            want = (uint64_t)(me >= P ? 1 : levels + (me + P < W)) * n * 4;
        }
        if (s1 - s0 != want) {
            printf("    rank %d: all-reduce of %zu bytes sent %llu bytes, expected %llu\n", rank, n * 4,
                   (unsigned long long)(s1 - s0), (unsigned long long)want);
            bad++;
        }
    }
    free(buf);
    free(buf2);
    ddp_destroy(pg);
    return bad ? 1 : 0;
}

static void run_world(int W, size_t big) {
    suite_arg a;
    a.big = big;
    CHECK_OK(ddp_spawn(W, rank_main, &a));
}
static void world_1(void) { run_world(1, 0); }
static void world_2_with_64MiB(void) { run_world(2, (size_t)16 << 20); }
static void world_3(void) { run_world(3, 0); }
static void world_4_with_64MiB(void) { run_world(4, (size_t)16 << 20); }
static void world_5(void) { run_world(5, 0); }
static void world_8(void) { run_world(8, 0); }
static void world_9(void) { run_world(9, 0); }

/* Several collectives in flight: issued back to back without waiting, then waited for in
   reverse; each completes correctly, and they complete in the order issued. */
static int in_flight_main(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    enum { K = 8 };
    ddp_work* w[K];
    float* bufs[K];
    size_t n[K];
    int k, bad = 0, W;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    W = ddp_world_size(pg);
    for (k = 0; k < K; k++) {
        n[k] = k == 0 ? ((size_t)4 << 20) : (size_t)(1000 * k + 1); /* a big one first */
        bufs[k] = (float*)malloc(n[k] * 4);
        fill(bufs[k], n[k], ddp_rank(pg), 0, 500 + k, DDP_F32);
        if (ddp_all_reduce(pg, bufs[k], n[k], DDP_F32, DDP_SUM, &w[k]) != DDP_OK) bad++;
    }
    for (k = K - 1; k >= 0; k--) {
        int j, done;
        if (ddp_work_wait(w[k]) != DDP_OK) bad++;
        /* when k is done, every collective issued before it is done too */
        for (j = 0; j < k; j++) {
            ddp__work_test(w[j], &done);
            if (!done) {
                printf("    rank %d: collective %d finished before collective %d, issued earlier\n", rank, k, j);
                bad++;
            }
        }
        bad += (int)check(bufs[k], n[k], W, 0, 500 + k, DDP_F32, DDP_SUM, "in flight", rank);
        free(bufs[k]);
    }
    ddp_destroy(pg);
    return bad ? 1 : 0;
}
static void collectives_in_flight_complete_in_order(void) { CHECK_OK(ddp_spawn(3, in_flight_main, NULL)); }

/* Misuse is refused before anything goes on the wire, and the group stays usable. */
static int misuse_main(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    float x = 1.f;
    int bad = 0;
    (void)rank, (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    bad += ddp__broadcast(pg, &x, 1, DDP_F32, 5, NULL) != DDP_ERR_INVALID_ARGUMENT;
    bad += ddp_all_reduce(pg, &x, 1, DDP_F32, (ddp_reduce_op)9, NULL) != DDP_ERR_INVALID_ARGUMENT;
    bad += ddp_all_reduce(pg, NULL, 4, DDP_F32, DDP_SUM, NULL) != DDP_ERR_INVALID_ARGUMENT;
    bad += ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK;
    bad += x != 2.f;
    ddp_destroy(pg);
    return bad;
}
static void misuse_refused(void) { CHECK_OK(ddp_spawn(2, misuse_main, NULL)); }

#ifndef DDP_TEST_PG_NO_MAIN /* tests/unit/test_mpi.c runs the cases above under mpirun */
/* ddp_pg_collectives counts each collective when it is called (an asynchronous one before it
   runs; a barrier is one too), and DDP_SIMULATE_LATENCY_US makes each last at least that long:
   labs/buckets reads the first, labs/measure fits the second. */
static int count_main(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_work* w[3];
    float x[4] = {1, 2, 3, 4};
    int bad = 0, k;
    uint64_t c0;
    double t0, took;
    (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    c0 = ddp_pg_collectives(pg);
    for (k = 0; k < 3; k++) {
        if (ddp_all_reduce(pg, x, 4, DDP_F32, DDP_SUM, &w[k]) != DDP_OK) return 1;
        if (ddp_pg_collectives(pg) != c0 + (uint64_t)k + 1) {
            printf("    rank %d: after %d asynchronous all-reduces ddp_pg_collectives says %llu more, expected %d\n", rank,
                   k + 1, (unsigned long long)(ddp_pg_collectives(pg) - c0), k + 1);
            bad++;
        }
    }
    for (k = 0; k < 3; k++) bad += ddp_work_wait(w[k]) != DDP_OK;
    t0 = ddp__now();
    bad += ddp_barrier(pg) != DDP_OK;
    took = ddp__now() - t0;
    if (ddp_pg_collectives(pg) != c0 + 4) {
        printf("    rank %d: a barrier did not count as a collective\n", rank);
        bad++;
    }
    if (took < 0.05) { /* DDP_SIMULATE_LATENCY_US=50000: a lower bound, so load cannot break it */
        printf("    rank %d: a barrier took %.1f ms with DDP_SIMULATE_LATENCY_US=50000; at least 50 ms expected\n", rank,
               took * 1e3);
        bad++;
    }
    ddp_destroy(pg);
    return bad ? 1 : 0;
}
/* Shared memory a job left when its rank 0 was SIGKILLed during setup (before its ranks mapped
   the segment): the next job on this machine removes it: a segment of a dead pid, a minute old.
   Kept: one of a dead pid made just now, and one whose creator runs (this process). */
#if DDP__LINUX
static int shm_job_main(int rank, void* arg) {
    ddp_desc d;
    ddp_pg* pg;
    float x = 1.f;
    int bad;
    (void)rank, (void)arg;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    if (ddp_init(&d, &pg) != DDP_OK) return 1;
    bad = ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK || x != 2.f;
    ddp_destroy(pg);
    return bad;
}
#endif
static void shm_left_by_a_killed_job_removed(void) {
#if DDP__LINUX
    char stale[96], fresh[96], live[96];
    const char* paths[3] = {stale, fresh, live};
    struct timeval old[2];
    pid_t dead = fork();
    int i, st;
    if (dead == 0) _exit(0);
    waitpid(dead, &st, 0); /* its pid now runs nothing (reused within this test: most unlikely) */
    snprintf(stale, sizeof stale, "/dev/shm/ddp-%ld-0123456789abcdef", (long)dead);
    snprintf(fresh, sizeof fresh, "/dev/shm/ddp-%ld-fedcba9876543210", (long)dead);
    snprintf(live, sizeof live, "/dev/shm/ddp-%ld-00000000000000aa", (long)getpid());
    for (i = 0; i < 3; i++) {
        int fd = open(paths[i], O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) SKIP("cannot make %s: %s", paths[i], strerror(errno));
        close(fd);
    }
    gettimeofday(&old[0], NULL);
    old[0].tv_sec -= 120, old[1] = old[0];
    CHECK(utimes(stale, old) == 0 && utimes(live, old) == 0);
    setenv("DDP_TRANSPORT", "shm", 1); /* also in the suite's TCP run */
    CHECK_OK(ddp_spawn(2, shm_job_main, NULL));
    unsetenv("DDP_TRANSPORT");
    CHECKF(access(stale, F_OK) != 0, "%s (pid %ld is gone, 2 minutes old) was left", stale, (long)dead);
    CHECKF(access(fresh, F_OK) == 0, "%s (made just now) was removed", fresh);
    CHECKF(access(live, F_OK) == 0, "%s (its pid runs) was removed", live);
    for (i = 0; i < 3; i++) unlink(paths[i]);
#else
    SKIP("shared memory segments are files under /dev/shm only on Linux");
#endif
}

static void collective_count_and_simulated_latency(void) {
    setenv("DDP_SIMULATE_LATENCY_US", "50000", 1);
    CHECK_OK(ddp_spawn(2, count_main, NULL));
    unsetenv("DDP_SIMULATE_LATENCY_US");
}

int main(void) {
    RUN(world_1);
    RUN(world_2_with_64MiB);
    RUN(world_3);
    RUN(world_4_with_64MiB);
    RUN(world_5);
    RUN(world_8);
    RUN(world_9);
    RUN(collectives_in_flight_complete_in_order);
    RUN(misuse_refused);
    RUN(collective_count_and_simulated_latency);
    RUN(shm_left_by_a_killed_job_removed);
    return H_EXIT();
}
#endif
