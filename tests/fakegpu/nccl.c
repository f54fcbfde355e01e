/* fakegpu's NCCL: communicators across processes, collectives and send/receive run on the caller's
   stream, blocking and non-blocking communicators as NCCL documents them.

   The ranks of a communicator meet in a shared-memory header named after the unique id; each rank
   also owns a data file (tmpfs). A collective, when its stream reaches it, writes this rank's
   contribution to its file, publishes a sequence number, waits for every rank's, checks that all
   ranks called the same collective, reads the contributions and computes its result (in rank
   order, so every rank gets the same bits). A send writes into a per-peer region of the sender's
   file; the receive reads it; the group finishes when the peer has read what it was sent. The
   files are unlinked as soon as every rank has opened them, so nothing outlives a crash.

   Non-blocking (config.blocking = 0): init, every collective and ncclGroupEnd return
   ncclInProgress; a background thread puts the work on its stream after a seeded delay; until it
   has, ncclCommGetAsyncError says ncclInProgress and any other call on the communicator fails with
   ncclInvalidArgument, as NCCL's ncclCommEnsureReady does. A peer that never arrives leaves an
   operation pending, stuck on its stream until this rank calls ncclCommAbort, as a real kernel
   would. As on one machine's shared memory or NVLink, nothing is reported when a peer on this
   host exits or aborts, or when the ranks call different collectives: the operation just stays
   pending (a peer on another host that aborts closes its connections: ncclRemoteError).
   FAKEGPU_NCCL_REPORT=1 makes the stand-in kinder, as it was first written: a dead peer on this
   host gives ncclRemoteError within 50 ms, mismatched collectives ncclInvalidUsage; the fault
   tests run both ways. ncclCommDestroy waits for the communicator's work, then for this host's
   other ranks to tear down theirs too (ncclCommFinalize does both without blocking, and destroy
   then only frees); ncclCommAbort is local and releases everything. */
#define _GNU_SOURCE
#include "fakegpu.h"

#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FG_MAX_RANKS 64
#define FG_ID_MAGIC 0x4c43434e55504746ull /* "FGPUNCCL" */
#define FG_P2P_REGION ((off_t)1 << 40)

enum { FG_AR = 1, FG_BC, FG_AG, FG_RS, FG_SEND, FG_RECV };
static const char* const fg_kind_name[] = {"?", "AllReduce", "Broadcast", "AllGather", "ReduceScatter", "Send", "Recv"};

/* ---- the shared header ---- */
typedef struct {
    int32_t kind, dtype, op, root;
    uint64_t count;
} fg_desc;
typedef struct {
    int32_t pid, dev, state; /* state: 1 joined, 3 aborted, 4 destroyed, 5 finalizing or finalized */
    int32_t pad;
    uint64_t host;
    uint64_t posted, consumed; /* collectives published, and finished reading */
    fg_desc desc;              /* the collective published last */
} fg_rank_sh;
typedef struct {
    uint32_t state; /* 0 fresh, 1 being set up, 2 ready */
    int32_t nranks;
    int32_t created, opened;
    fg_rank_sh r[FG_MAX_RANKS];
    uint64_t sent[FG_MAX_RANKS][FG_MAX_RANKS], recvd[FG_MAX_RANKS][FG_MAX_RANKS];
    uint64_t bytes[FG_MAX_RANKS][FG_MAX_RANKS]; /* the size of the message in flight */
} fg_sh;

#define LD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define ADD(x, v) __atomic_add_fetch(&(x), (v), __ATOMIC_ACQ_REL)

typedef struct fg_task {
    int kind;
    const void* send;
    void* recv;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root, peer;
    struct ncclComm* comm;
    cudaStream_t stream;
    uint64_t k; /* collectives: its number on the communicator */
    struct fg_task* next;
} fg_task;

typedef struct fg_job { /* one ncclGroupEnd's work for one non-blocking communicator */
    fg_task* tasks;
    double t_queued;
    struct fg_job* next;
} fg_job;

struct ncclComm {
    int rank, nranks, dev, blocking;
    uint64_t id, host;
    fg_sh* sh;
    int* fds;
    pthread_mutex_t m;
    pthread_cond_t cv;
    ncclResult_t error; /* the first asynchronous error */
    int pending;        /* non-blocking operations not yet on their streams */
    int aborted, closing, refs;
    int finalized;      /* ncclCommFinalize: 1 in progress, 2 done (ncclCommDestroy then only frees) */
    int polled;         /* ncclCommGetAsyncError was asked since the last job went out */
    uint64_t coll;      /* collectives put on streams so far */
    uint64_t rng;
    char lasterr[512];
    fg_job *jobs, *jobs_tail;
    pthread_t bg;
    int bg_started;
    int joined;
    struct ncclComm* next_all;
};

static pthread_mutex_t fg_comms_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm* fg_comms; /* live communicators */
static char fg_lasterr[512];
static __thread int fg_group_depth;
static __thread fg_task *fg_group_head, *fg_group_tail;
static __thread ncclResult_t fg_group_error;

/* ---- small helpers ---- */

static void fg_comm_error(struct ncclComm* c, ncclResult_t r, const char* fmt, ...) {
    va_list ap;
    char msg[512];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->m);
    if (c->error == ncclSuccess || c->error == ncclInProgress) {
        c->error = r;
        snprintf(c->lasterr, sizeof c->lasterr, "%s", msg);
    }
    pthread_mutex_unlock(&c->m);
    fg_trace("nccl rank %d error %d: %s", c->rank, (int)r, msg);
}

static ncclResult_t fg_fail(struct ncclComm* c, ncclResult_t r, const char* fmt, ...) {
    va_list ap;
    char msg[512];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(fg_lasterr, sizeof fg_lasterr, "%s", msg);
    if (c) {
        pthread_mutex_lock(&c->m);
        snprintf(c->lasterr, sizeof c->lasterr, "%s", msg);
        pthread_mutex_unlock(&c->m);
    }
    return r;
}

static int fg_comm_live(struct ncclComm* c) {
    struct ncclComm* x;
    pthread_mutex_lock(&fg_comms_lock);
    for (x = fg_comms; x && x != c; x = x->next_all) {}
    pthread_mutex_unlock(&fg_comms_lock);
    return x != NULL;
}

static void fg_comm_unref(struct ncclComm* c) {
    int last;
    pthread_mutex_lock(&c->m);
    last = --c->refs == 0;
    pthread_mutex_unlock(&c->m);
    if (!last) return;
    if (c->sh) munmap(c->sh, sizeof *c->sh);
    if (c->fds) {
        int r;
        for (r = 0; r < c->nranks; r++)
            if (c->fds[r] >= 0) close(c->fds[r]);
        free(c->fds);
    }
    pthread_mutex_destroy(&c->m);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static void fg_names(const struct ncclComm* c, int rank, char* out, size_t n) {
    if (rank < 0) snprintf(out, n, "/fgnccl-%016llx", (unsigned long long)c->id);
    else snprintf(out, n, "/fgnccl-%016llx-%d", (unsigned long long)c->id, rank);
}

/* A process of this host that has exited (or is a zombie). */
static int fg_pid_dead(int pid) {
    char path[64], buf[256], *p;
    FILE* f;
    size_t n;
    if (pid <= 0) return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (!(f = fopen(path, "r"))) return 1;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static uint64_t fg_host_hash(void) {
    char h[256] = "";
    uint64_t x = 1469598103934665603ull;
    size_t i;
    gethostname(h, sizeof h - 1);
    for (i = 0; h[i]; i++) x = (x ^ (unsigned char)h[i]) * 1099511628211ull;
    return x;
}

/* Wait until cond(arg) holds. Returns 0 when it does, -1 when this rank aborted the communicator
   meanwhile. A peer that aborted on another host (its connections close) sets ncclRemoteError and
   the wait goes on (a stuck kernel), until abort; the stand-in's own bound ends it with a
   message. A peer on this host that exited or aborted is not reported: NCCL's shared-memory and
   NVLink transports have no connection to close, and the waiting kernel spins until its own rank
   gives up (FAKEGPU_NCCL_REPORT=1: an exited one is reported, as a kinder stand-in would). */
static int fg_nccl_wait(struct ncclComm* c, int (*cond)(struct ncclComm*, void*), void* arg, const char* what) {
    double start = fg_now(), next_check = start + 0.05, pause = 1e-6;
    int told = 0;
    for (;;) {
        int r;
        if (cond(c, arg)) return 0;
        if (LD(c->aborted)) return -1;
        if (fg_now() > next_check) {
            next_check = fg_now() + 0.05;
            for (r = 0; r < c->nranks && !told && c->sh; r++) {
                if (r == c->rank) continue;
                const int here = c->sh->r[r].host == c->host;
                if ((LD(c->sh->r[r].state) == 3 && !here) ||
                    (here && fg_cfg()->nccl_report && fg_pid_dead(LD(c->sh->r[r].pid)))) {
                    fg_comm_error(c, ncclRemoteError, "%s: rank %d %s", what, r,
                                  LD(c->sh->r[r].state) == 3 ? "aborted the communicator" : "exited");
                    told = 1;
                }
            }
            if (fg_now() - start > fg_cfg()->wait_s)
                fg_fatal("NCCL rank %d: %s waited %.0f s (FAKEGPU_WAIT_S)%s", c->rank, what, fg_cfg()->wait_s,
                         told ? "; the communicator has an error, but nobody called ncclCommAbort" : "");
        }
        fg_sleep(pause);
        if (pause < 1e-3) pause *= 2;
    }
}

/* ---- float types ---- */

float fg_half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u, x;
    float f;
    if (e == 0) {
        f = (float)m / 16777216.0f;
        return s ? -f : f;
    }
    x = e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &x, 4);
    return f;
}

uint16_t fg_float_to_half(float f) {
    uint32_t x, s, e, m;
    memcpy(&x, &f, 4);
    s = (x >> 16) & 0x8000u;
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
    e = (x >> 23) & 255u;
    m = x & 0x7fffffu;
    if (e >= 143) return (uint16_t)(s | 0x7c00u); /* overflow: infinity */
    if (e < 113) { /* subnormal or zero: shift with round to nearest even */
        uint32_t full = m | 0x800000u, shift = 126 - e, q, rem, half;
        if (shift > 24) return (uint16_t)s;
        q = full >> shift;
        rem = full & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(s | q);
    }
    {
        uint32_t v = ((e - 112) << 10) | (m >> 13), rem = m & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (v & 1))) v++;
        return (uint16_t)(s | v);
    }
}

float fg_bf16_to_float(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t fg_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static size_t fg_esize(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 2; }
static float fg_get(const void* p, size_t i, ncclDataType_t t) {
    if (t == ncclFloat32) return ((const float*)p)[i];
    return t == ncclFloat16 ? fg_half_to_float(((const uint16_t*)p)[i]) : fg_bf16_to_float(((const uint16_t*)p)[i]);
}
static void fg_put(void* p, size_t i, ncclDataType_t t, float v) {
    if (t == ncclFloat32) ((float*)p)[i] = v;
    else ((uint16_t*)p)[i] = t == ncclFloat16 ? fg_float_to_half(v) : fg_float_to_bf16(v);
}

/* ---- file I/O ---- */

static void fg_pwrite(int fd, const void* buf, size_t n, off_t off) {
    const char* p = (const char*)buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) fg_fatal("NCCL stand-in: writing %zu bytes to its shared file failed: %s", n, strerror(errno));
        p += k, n -= (size_t)k, off += k;
    }
}

static void fg_pread(int fd, void* buf, size_t n, off_t off) {
    char* p = (char*)buf;
    while (n) {
        ssize_t k = pread(fd, p, n, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) fg_fatal("NCCL stand-in: reading %zu bytes of a peer's file failed: %s", n, strerror(errno));
        p += k, n -= (size_t)k, off += k;
    }
}

/* ---- running a collective on its stream ---- */

static int fg_all_consumed(struct ncclComm* c, void* arg) {
    uint64_t k = *(uint64_t*)arg;
    int r;
    for (r = 0; r < c->nranks; r++)
        if (LD(c->sh->r[r].consumed) < k) return 0;
    return 1;
}
/* Every rank has posted collective k, and none that aborted before finishing it: with a peer gone
   from the middle of a collective, the real kernels wait for ever (its data was posted, but the
   peer no longer moves it). */
static int fg_all_posted(struct ncclComm* c, void* arg) {
    uint64_t k = *(uint64_t*)arg;
    int r;
    for (r = 0; r < c->nranks; r++)
        if (LD(c->sh->r[r].posted) < k || (LD(c->sh->r[r].state) == 3 && LD(c->sh->r[r].consumed) < k)) return 0;
    return 1;
}
static int fg_never(struct ncclComm* c, void* arg) {
    (void)c, (void)arg;
    return 0;
}

/* Bytes this rank contributes to a collective. */
static size_t fg_contrib(const fg_task* t, int rank, int W) {
    size_t es = fg_esize(t->dt);
    switch (t->kind) {
    case FG_BC: return rank == t->root ? t->count * es : 0;
    case FG_RS: return t->count * es * (size_t)W;
    default: return t->count * es;
    }
}

static void fg_coll_run(fg_op* op) {
    fg_task* t = (fg_task*)op->arg;
    struct ncclComm* c = t->comm;
    const int W = c->nranks, me = c->rank;
    const size_t es = fg_esize(t->dt), mine = fg_contrib(t, me, W);
    uint64_t prev = t->k - 1;
    const void* src;
    void* dst;
    char* peer = NULL;
    float* acc = NULL;
    size_t out_n = t->kind == FG_AG ? t->count * (size_t)W : t->count, i;
    int r;
    char what[96];
    if (LD(c->aborted)) return;
    fg_sleep(fg_cfg()->nccl_delay_s);
    snprintf(what, sizeof what, "%s #%llu (%zu elements)", fg_kind_name[t->kind], (unsigned long long)t->k, t->count);
    src = mine ? fg_alias(t->send, mine) : NULL;
    dst = fg_alias(t->recv, out_n * es);
    if ((mine && !src) || !dst) {
        fg_fault("NCCL %s: a buffer is not inside a live allocation any more", what);
        return;
    }
    /* our file may be overwritten once everyone has read the previous collective */
    if (fg_nccl_wait(c, fg_all_consumed, &prev, what) < 0) return;
    if (mine) fg_pwrite(c->fds[me], src, mine, 0);
    c->sh->r[me].desc.kind = t->kind, c->sh->r[me].desc.dtype = (int32_t)t->dt, c->sh->r[me].desc.op = (int32_t)t->op;
    c->sh->r[me].desc.root = t->root, c->sh->r[me].desc.count = t->count;
    ST(c->sh->r[me].posted, t->k);
    if (fg_nccl_wait(c, fg_all_posted, &t->k, what) < 0) return;
    for (r = 0; r < W; r++) {
        const fg_desc* d = &c->sh->r[r].desc;
        if (d->kind != t->kind || d->count != t->count || d->dtype != (int32_t)t->dt ||
            (t->kind == FG_BC && d->root != t->root) || ((t->kind == FG_AR || t->kind == FG_RS) && d->op != (int32_t)t->op)) {
            if (fg_cfg()->nccl_report)
                fg_comm_error(c, ncclInvalidUsage, "collective #%llu: rank %d calls %s(count %llu, type %d, op %d, "
                              "root %d) but rank %d calls %s(count %zu, type %d, op %d, root %d): the ranks are out of "
                              "step", (unsigned long long)t->k, r, fg_kind_name[d->kind], (unsigned long long)d->count,
                              d->dtype, d->op, d->root, me, fg_kind_name[t->kind], t->count, (int)t->dt, (int)t->op,
                              t->root);
            else
                fg_trace("nccl rank %d: collective #%llu does not match rank %d's: stuck, unreported", me,
                         (unsigned long long)t->k, r);
            fg_nccl_wait(c, fg_never, NULL, what); /* stuck, as mismatched kernels would be, until abort */
            return;
        }
    }
    if (!(peer = (char*)malloc(t->count * es + es))) fg_fatal("out of memory");
    switch (t->kind) {
    case FG_BC:
        fg_pread(c->fds[t->root], peer, t->count * es, 0);
        memcpy(dst, peer, t->count * es);
        break;
    case FG_AG:
        for (r = 0; r < W; r++) fg_pread(c->fds[r], (char*)dst + (size_t)r * t->count * es, t->count * es, 0);
        break;
    default: { /* AllReduce, ReduceScatter: rank 0's part, then each next rank's, rounded each time */
        const size_t seg = t->kind == FG_RS ? (size_t)me * t->count * es : 0;
        const float scale = t->op == ncclAvg ? 1.0f / (float)W : 1.0f;
        if (!(acc = (float*)malloc(t->count * sizeof *acc + 4))) fg_fatal("out of memory");
        for (r = 0; r < W; r++) {
            fg_pread(c->fds[r], peer, t->count * es, (off_t)seg);
            for (i = 0; i < t->count; i++) {
                float v = fg_get(peer, i, t->dt);
                if (t->op == ncclAvg) { /* NCCL averages floats by pre-multiplying by 1/nranks */
                    fg_put(peer, i, t->dt, v * scale);
                    v = fg_get(peer, i, t->dt);
                }
                if (r == 0) acc[i] = v;
                else acc[i] = t->op == ncclMax ? (v > acc[i] ? v : acc[i]) : acc[i] + v;
                fg_put(dst, i, t->dt, acc[i]);
                acc[i] = fg_get(dst, i, t->dt);
            }
        }
        break;
    }
    }
    free(acc);
    free(peer);
    ST(c->sh->r[me].consumed, t->k);
}

/* ---- send and receive: one stream operation for a group's point-to-point calls ---- */

typedef struct {
    fg_task* tasks; /* sends and receives of one communicator on one stream */
} fg_p2p;

typedef struct {
    int from, to;
    uint64_t seq;
} fg_chan;
static int fg_chan_free(struct ncclComm* c, void* arg) {
    fg_chan* ch = (fg_chan*)arg;
    return LD(c->sh->recvd[ch->from][ch->to]) >= LD(c->sh->sent[ch->from][ch->to]);
}
static int fg_chan_full(struct ncclComm* c, void* arg) {
    fg_chan* ch = (fg_chan*)arg;
    return LD(c->sh->sent[ch->from][ch->to]) > LD(c->sh->recvd[ch->from][ch->to]);
}
static int fg_chan_read(struct ncclComm* c, void* arg) {
    fg_chan* ch = (fg_chan*)arg;
    return LD(c->sh->recvd[ch->from][ch->to]) >= ch->seq;
}

static void fg_p2p_run(fg_op* op) {
    fg_p2p* p = (fg_p2p*)op->arg;
    fg_task* t;
    struct ncclComm* c = p->tasks->comm;
    const int me = c->rank;
    char what[96];
    if (LD(c->aborted)) return;
    fg_sleep(fg_cfg()->nccl_delay_s);
    /* sends first (they are buffered in the file), then receives, then wait until every peer has
       read what it was sent: the group ends when both sides are done, as in NCCL */
    for (t = p->tasks; t; t = t->next) {
        fg_chan ch;
        const void* src;
        size_t n = t->count * fg_esize(t->dt);
        if (t->kind != FG_SEND) continue;
        ch.from = me, ch.to = t->peer;
        snprintf(what, sizeof what, "Send of %zu elements to rank %d", t->count, t->peer);
        if (fg_nccl_wait(c, fg_chan_free, &ch, what) < 0) return;
        if (n && !(src = fg_alias(t->send, n))) {
            fg_fault("NCCL %s: the buffer is not inside a live allocation", what);
            return;
        }
        if (n) fg_pwrite(c->fds[me], src, n, FG_P2P_REGION * (1 + t->peer));
        c->sh->bytes[me][t->peer] = n;
        ADD(c->sh->sent[me][t->peer], 1);
    }
    for (t = p->tasks; t; t = t->next) {
        fg_chan ch;
        void* dst = NULL;
        size_t n = t->count * fg_esize(t->dt), got;
        if (t->kind != FG_RECV) continue;
        ch.from = t->peer, ch.to = me;
        snprintf(what, sizeof what, "Recv of %zu elements from rank %d", t->count, t->peer);
        if (fg_nccl_wait(c, fg_chan_full, &ch, what) < 0) return;
        got = c->sh->bytes[t->peer][me];
        if (got != n) {
            if (fg_cfg()->nccl_report)
                fg_comm_error(c, ncclInvalidUsage, "rank %d receives %zu bytes from rank %d, which sent %zu", me, n,
                              t->peer, got);
            fg_nccl_wait(c, fg_never, NULL, what); /* unreported on the hardware: stuck until abort */
            return;
        }
        if (n && !(dst = fg_alias(t->recv, n))) {
            fg_fault("NCCL %s: the buffer is not inside a live allocation", what);
            return;
        }
        if (n) fg_pread(c->fds[t->peer], dst, n, FG_P2P_REGION * (1 + me));
        ADD(c->sh->recvd[t->peer][me], 1);
    }
    for (t = p->tasks; t; t = t->next) {
        fg_chan ch;
        if (t->kind != FG_SEND) continue;
        ch.from = me, ch.to = t->peer, ch.seq = LD(c->sh->sent[me][t->peer]);
        snprintf(what, sizeof what, "Send to rank %d (waiting for it to be received)", t->peer);
        if (fg_nccl_wait(c, fg_chan_read, &ch, what) < 0) return;
    }
}

static void fg_task_list_free(fg_task* t) {
    while (t) {
        fg_task* n = t->next;
        free(t);
        t = n;
    }
}

static void fg_coll_fini(fg_op* op) {
    fg_task* t = (fg_task*)op->arg;
    struct ncclComm* c = t->comm;
    free(t);
    fg_comm_unref(c);
}

static void fg_p2p_fini(fg_op* op) {
    fg_p2p* p = (fg_p2p*)op->arg;
    struct ncclComm* c = p->tasks->comm;
    fg_task_list_free(p->tasks);
    free(p);
    fg_comm_unref(c);
}

/* Put one group's tasks of one communicator on their streams: each collective its own operation,
   the point-to-point calls of each stream one operation. */
static void fg_launch_tasks(fg_task* tasks) {
    fg_task *t, *next;
    while (tasks) {
        cudaError_t e;
        struct ncclComm* c = tasks->comm;
        fg_stream* s;
        fg_op* op = fg_op_new();
        t = tasks;
        tasks = t->next;
        t->next = NULL;
        s = fg_stream_of(t->stream, &e);
        if (!s) fg_fatal("NCCL stand-in: a stream checked at the call is gone");
        pthread_mutex_lock(&c->m);
        c->refs++;
        pthread_mutex_unlock(&c->m);
        if (t->kind == FG_SEND || t->kind == FG_RECV) {
            fg_p2p* p = (fg_p2p*)calloc(1, sizeof *p);
            fg_task **pp = &tasks, *tail = t;
            if (!p) fg_fatal("out of memory");
            p->tasks = t;
            while (*pp) { /* the same stream's other point-to-point calls join this operation */
                next = (*pp)->next;
                if (((*pp)->kind == FG_SEND || (*pp)->kind == FG_RECV) && (*pp)->stream == t->stream) {
                    tail->next = *pp;
                    tail = *pp;
                    tail->next = NULL;
                    *pp = next;
                } else {
                    pp = &(*pp)->next;
                }
            }
            op->arg = p, op->run = fg_p2p_run, op->fini = fg_p2p_fini, op->what = "ncclSend/ncclRecv group";
        } else {
            t->k = ++c->coll;
            op->arg = t, op->run = fg_coll_run, op->fini = fg_coll_fini, op->what = fg_kind_name[t->kind];
        }
        fg_enqueue(s, op);
    }
}

/* ---- the background thread of a non-blocking communicator ---- */

static ncclResult_t fg_join(struct ncclComm* c);

/* Wait until the program asks (ncclCommGetAsyncError) or the hold time since `since` has passed. */
static void fg_until_polled(struct ncclComm* c, double since) {
    while (!c->polled && !c->closing && fg_now() < since + fg_cfg()->hold_s) {
        struct timespec ts;
        double until;
        clock_gettime(CLOCK_REALTIME, &ts);
        until = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + (since + fg_cfg()->hold_s - fg_now());
        ts.tv_sec = (time_t)until;
        ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&c->cv, &c->m, &ts);
    }
    c->polled = 0;
}

static void* fg_bg_main(void* arg) {
    struct ncclComm* c = (struct ncclComm*)arg;
    double t0 = fg_now();
    ncclResult_t r = fg_join(c);
    pthread_mutex_lock(&c->m);
    fg_until_polled(c, t0); /* init, too, is in progress until the program has asked */
    if (r != ncclSuccess && (c->error == ncclSuccess || c->error == ncclInProgress)) c->error = r;
    c->pending--; /* the init */
    c->joined = r == ncclSuccess;
    pthread_cond_broadcast(&c->cv);
    for (;;) {
        fg_job* j;
        while (!c->jobs && !c->closing) pthread_cond_wait(&c->cv, &c->m);
        if (!c->jobs) break;
        /* like a stream's operation, a job waits until the program asks how it is going (it polls
           ncclCommGetAsyncError, as NCCL says it must) or the hold time has passed: a program that
           uses the communicator without asking finds it still in progress, every time */
        fg_until_polled(c, c->jobs->t_queued);
        j = c->jobs;
        c->jobs = j->next;
        if (!c->jobs) c->jobs_tail = NULL;
        c->rng = fg_mix(c->rng);
        pthread_mutex_unlock(&c->m);
        fg_sleep(1e-3 * (double)(c->rng >> 11) / 9007199254740992.0); /* then a seeded delay */
        if (!LD(c->aborted) && c->joined) fg_launch_tasks(j->tasks);
        else fg_task_list_free(j->tasks);
        free(j);
        pthread_mutex_lock(&c->m);
        c->pending--;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->m);
    fg_comm_unref(c);
    return NULL;
}

/* ---- joining ---- */

static int fg_all_created(struct ncclComm* c, void* arg) {
    (void)arg;
    return LD(c->sh->created) >= c->nranks;
}
static int fg_all_opened(struct ncclComm* c, void* arg) {
    (void)arg;
    return LD(c->sh->opened) >= c->nranks;
}
static int fg_header_ready(struct ncclComm* c, void* arg) {
    (void)arg;
    return LD(c->sh->state) == 2;
}

static ncclResult_t fg_join_files(struct ncclComm* c);

/* Join the communicator; a failed join removes this rank's names (the communicator is unusable, and
   a program that exits without aborting it must leave nothing in /dev/shm). */
static ncclResult_t fg_join(struct ncclComm* c) {
    ncclResult_t r = fg_join_files(c);
    if (r != ncclSuccess) {
        char name[96];
        fg_names(c, c->rank, name, sizeof name);
        shm_unlink(name);
        fg_names(c, -1, name, sizeof name);
        shm_unlink(name);
    }
    return r;
}

static ncclResult_t fg_join_files(struct ncclComm* c) {
    char name[96];
    int fd, r, me = c->rank;
    uint32_t zero = 0;
    int32_t pid0 = 0;
    fg_names(c, -1, name, sizeof name);
    fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0) return fg_fail(c, ncclSystemError, "shm_open(%s): %s", name, strerror(errno));
    if (ftruncate(fd, sizeof(fg_sh)) != 0) {
        close(fd);
        return fg_fail(c, ncclSystemError, "ftruncate(%s): %s", name, strerror(errno));
    }
    c->sh = (fg_sh*)mmap(NULL, sizeof(fg_sh), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (c->sh == MAP_FAILED) {
        c->sh = NULL;
        return fg_fail(c, ncclSystemError, "mmap(%s): %s", name, strerror(errno));
    }
    if (__atomic_compare_exchange_n(&c->sh->state, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        c->sh->nranks = c->nranks;
        ST(c->sh->state, 2);
    }
    if (fg_nccl_wait(c, fg_header_ready, NULL, "ncclCommInitRank (the shared header)") < 0)
        return fg_fail(c, ncclInvalidArgument, "the communicator was aborted during init");
    if (c->sh->nranks != c->nranks)
        return fg_fail(c, ncclInvalidArgument, "this rank says nranks=%d, another %d", c->nranks, c->sh->nranks);
    if (!__atomic_compare_exchange_n(&c->sh->r[me].pid, &pid0, (int32_t)getpid(), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return fg_fail(c, ncclInvalidUsage, "rank %d of this communicator is taken by pid %d already", me,
                       (int)LD(c->sh->r[me].pid));
    c->sh->r[me].dev = fg_cfg()->phys[c->dev]; /* the machine's GPU, whatever CUDA_VISIBLE_DEVICES calls it */
    c->sh->r[me].host = c->host;
    ST(c->sh->r[me].state, 1);
    fg_names(c, me, name, sizeof name);
    fd = shm_open(name, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) return fg_fail(c, ncclSystemError, "shm_open(%s): %s", name, strerror(errno));
    c->fds[me] = fd;
    ADD(c->sh->created, 1);
    if (fg_nccl_wait(c, fg_all_created, NULL, "ncclCommInitRank (waiting for every rank)") < 0)
        return fg_fail(c, ncclInvalidArgument, "the communicator was aborted during init");
    for (r = 0; r < c->nranks; r++) { /* NCCL refuses two ranks on one GPU */
        int q;
        for (q = 0; q < r; q++)
            if (c->sh->r[q].host == c->sh->r[r].host && c->sh->r[q].dev == c->sh->r[r].dev)
                return fg_fail(c, ncclInvalidUsage, "Duplicate GPU detected: rank %d and rank %d both on the GPU with "
                               "busId 0000:%02x:00.0", q, r, 0x10 + c->sh->r[r].dev);
    }
    for (r = 0; r < c->nranks; r++) {
        if (r == me) continue;
        fg_names(c, r, name, sizeof name);
        if ((c->fds[r] = shm_open(name, O_RDWR, 0600)) < 0)
            return fg_fail(c, ncclSystemError, "shm_open(%s): %s", name, strerror(errno));
    }
    ADD(c->sh->opened, 1);
    if (fg_nccl_wait(c, fg_all_opened, NULL, "ncclCommInitRank (waiting for every rank to connect)") < 0)
        return fg_fail(c, ncclInvalidArgument, "the communicator was aborted during init");
    fg_names(c, me, name, sizeof name);
    shm_unlink(name);
    if (me == 0) {
        fg_names(c, -1, name, sizeof name);
        shm_unlink(name);
    }
    return ncclSuccess;
}

/* ---- the API ---- */

FG_EXPORT const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

FG_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
    if (comm && fg_comm_live(comm)) return comm->lasterr;
    return fg_lasterr;
}

FG_EXPORT ncclResult_t ncclGetVersion(int* version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE; /* the headers' own: the stand-in answers as the NCCL it was built against */
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    uint64_t v[2];
    FILE* f;
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    v[0] = FG_ID_MAGIC;
    v[1] = fg_mix((uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(fg_now() * 1e9));
    if ((f = fopen("/dev/urandom", "rb")) != NULL) {
        uint64_t x;
        if (fread(&x, sizeof x, 1, f) == 1) v[1] ^= x;
        fclose(f);
    }
    memcpy(id->internal, v, sizeof v);
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                              ncclConfig_t* config) {
    struct ncclComm* c;
    uint64_t v[2];
    int blocking = 1, r;
    if (!out) return fg_fail(NULL, ncclInvalidArgument, "comm is NULL");
    *out = NULL;
    memcpy(v, id.internal, sizeof v);
    if (v[0] != FG_ID_MAGIC) return fg_fail(NULL, ncclInvalidArgument, "the unique id was not made by ncclGetUniqueId");
    if (nranks < 1 || nranks > FG_MAX_RANKS || rank < 0 || rank >= nranks)
        return fg_fail(NULL, ncclInvalidArgument, "rank %d of %d is out of range (the stand-in takes up to %d ranks)",
                       rank, nranks, FG_MAX_RANKS);
    if (config) {
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t))
            return fg_fail(NULL, ncclInvalidArgument, "config was not set up with NCCL_CONFIG_INITIALIZER");
        if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
    }
    if (fg_enter() != cudaSuccess) return fg_fail(NULL, ncclUnhandledCudaError, "CUDA is not usable in this process");
    c = (struct ncclComm*)calloc(1, sizeof *c);
    if (!c || !(c->fds = (int*)malloc((size_t)nranks * sizeof(int)))) {
        free(c);
        return ncclSystemError;
    }
    for (r = 0; r < nranks; r++) c->fds[r] = -1;
    c->rank = rank, c->nranks = nranks, c->dev = fg_current_device(), c->blocking = blocking;
    c->id = v[1], c->host = fg_host_hash();
    c->rng = fg_mix(fg_cfg()->seed * 7919u + (uint64_t)rank);
    c->refs = 1;
    pthread_mutex_init(&c->m, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_lock(&fg_comms_lock);
    c->next_all = fg_comms;
    fg_comms = c;
    pthread_mutex_unlock(&fg_comms_lock);
    *out = c;
    if (blocking) {
        ncclResult_t res = fg_join(c);
        c->joined = res == ncclSuccess;
        if (res != ncclSuccess) c->error = res;
        return res;
    }
    c->pending = 1;
    c->refs++; /* the background thread's */
    if (pthread_create(&c->bg, NULL, fg_bg_main, c) != 0) return fg_fail(c, ncclSystemError, "pthread_create failed");
    c->bg_started = 1;
    return ncclInProgress;
}

FG_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* st) {
    if (!c || !st || !fg_comm_live(c)) return fg_fail(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
    pthread_mutex_lock(&c->m);
    *st = c->error != ncclSuccess ? c->error : c->pending > 0 ? ncclInProgress : ncclSuccess;
    if (c->pending > 0 && !c->polled) {
        c->polled = 1;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->m);
    return ncclSuccess;
}

/* NCCL's rule: a communicator is used only when its last operation has returned ncclSuccess. */
static ncclResult_t fg_ensure_ready(struct ncclComm* c, const char* call) {
    ncclResult_t st;
    if (!c || !fg_comm_live(c)) return fg_fail(NULL, ncclInvalidArgument, "%s: not a live communicator", call);
    pthread_mutex_lock(&c->m);
    st = c->error != ncclSuccess ? c->error : c->pending > 0 ? ncclInProgress : ncclSuccess;
    pthread_mutex_unlock(&c->m);
    if (st == ncclInProgress)
        return fg_fail(c, ncclInvalidArgument, "%s: Attempt to use communicator before the previous operation returned "
                       "ncclSuccess", call);
    return st;
}

/* Check one call's arguments and add it to the thread's group. */
static ncclResult_t fg_add(int kind, const void* send, void* recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           int root, int peer, ncclComm_t c, cudaStream_t stream) {
    fg_task* t;
    fg_stream* s;
    cudaError_t e;
    ncclResult_t r;
    size_t es, in_n, out_n;
    int dev, ok;
    const char* call = fg_kind_name[kind];
    if ((r = fg_ensure_ready(c, call)) != ncclSuccess) return r;
    if (dt != ncclFloat32 && dt != ncclFloat16 && dt != ncclBfloat16)
        return fg_fail(c, ncclInvalidArgument, "%s: data type %d (the stand-in has f32, f16, bf16)", call, (int)dt);
    if ((kind == FG_AR || kind == FG_RS) && op != ncclSum && op != ncclAvg && op != ncclMax)
        return fg_fail(c, ncclInvalidArgument, "%s: reduction %d (the stand-in has sum, avg, max)", call, (int)op);
    if ((kind == FG_BC && (root < 0 || root >= c->nranks)) || ((kind == FG_SEND || kind == FG_RECV) && (peer < 0 || peer >= c->nranks)))
        return fg_fail(c, ncclInvalidArgument, "%s: rank %d out of range", call, kind == FG_BC ? root : peer);
    if (!(s = fg_stream_of(stream, &e)) || fg_stream_device(s) != c->dev)
        return fg_fail(c, ncclInvalidArgument, "%s: the stream is not a live stream of the communicator's GPU", call);
    es = fg_esize(dt);
    in_n = (kind == FG_RS ? count * (size_t)c->nranks : count) * es;
    out_n = (kind == FG_AG ? count * (size_t)c->nranks : count) * es;
    if (count > 0) {
        int check_in = kind != FG_RECV && (kind != FG_BC || c->rank == root), check_out = kind != FG_SEND;
        if (check_in && (fg_mem_kind(send, in_n, &dev, &ok) != FG_MEM_DEVICE || !ok || dev != c->dev))
            return fg_fail(c, ncclInvalidArgument, "%s: sendbuff %p is not %zu bytes of device memory on GPU %d", call, send,
                           in_n, c->dev);
        if (check_out && (fg_mem_kind(recv, out_n, &dev, &ok) != FG_MEM_DEVICE || !ok || dev != c->dev))
            return fg_fail(c, ncclInvalidArgument, "%s: recvbuff %p is not %zu bytes of device memory on GPU %d", call, recv,
                           out_n, c->dev);
    }
    if (count == 0 && kind != FG_SEND && kind != FG_RECV) return ncclSuccess; /* nothing to do */
    if (!(t = (fg_task*)calloc(1, sizeof *t))) return ncclSystemError;
    t->kind = kind, t->send = send, t->recv = recv, t->count = count, t->dt = dt, t->op = op;
    t->root = root, t->peer = peer, t->comm = c, t->stream = stream;
    if (fg_group_tail) fg_group_tail->next = t;
    else fg_group_head = t;
    fg_group_tail = t;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclGroupStart(void) {
    fg_group_depth++;
    return ncclSuccess;
}

FG_EXPORT ncclResult_t ncclGroupEnd(void) {
    fg_task *all, *t;
    ncclResult_t res = ncclSuccess;
    if (fg_group_depth == 0) return fg_fail(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--fg_group_depth > 0) return ncclSuccess;
    all = fg_group_head;
    fg_group_head = fg_group_tail = NULL;
    if (fg_group_error != ncclSuccess) { /* a call inside the group failed: nothing of it runs */
        res = fg_group_error;
        fg_group_error = ncclSuccess;
        fg_task_list_free(all);
        return res;
    }
    while (all) { /* one communicator at a time, its tasks in call order */
        struct ncclComm* c = all->comm;
        fg_task *mine = NULL, *mine_tail = NULL, **pp = &all;
        while ((t = *pp) != NULL) {
            if (t->comm == c) {
                *pp = t->next;
                t->next = NULL;
                if (mine_tail) mine_tail->next = t;
                else mine = t;
                mine_tail = t;
            } else {
                pp = &t->next;
            }
        }
        if (c->blocking) {
            fg_launch_tasks(mine);
        } else {
            fg_job* j = (fg_job*)calloc(1, sizeof *j);
            if (!j) fg_fatal("out of memory");
            j->tasks = mine;
            j->t_queued = fg_now();
            pthread_mutex_lock(&c->m);
            if (c->jobs_tail) c->jobs_tail->next = j;
            else c->jobs = j;
            c->jobs_tail = j;
            c->pending++;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->m);
            res = ncclInProgress;
        }
    }
    return res;
}

/* FAKEGPU_FAIL=NAME:N makes the Nth call of NCCL function NAME (ncclSend, ...) in this process
   fail with ncclInternalError, to test what a program does after a failed call. */
static int fg_injected_failure(const char* name) {
    static int calls[8];
    const char* f = getenv("FAKEGPU_FAIL");
    size_t n = strlen(name);
    if (!f || strncmp(f, name, n) || f[n] != ':') return 0;
    return ++calls[0] == atoi(f + n + 1);
}

/* A single call is a group of one. Inside a group, a failed call fails the group. */
static ncclResult_t fg_call(int kind, const void* send, void* recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                            int root, int peer, ncclComm_t c, cudaStream_t stream) {
    ncclResult_t r;
    int outer = fg_group_depth == 0;
    char api[32];
    fg_trace("nccl call %s count %zu rank %d", fg_kind_name[kind], count, c && fg_comm_live(c) ? c->rank : -1);
    snprintf(api, sizeof api, "nccl%s", fg_kind_name[kind]);
    if (fg_injected_failure(api)) return fg_fail(c, ncclInternalError, "%s: failure injected by FAKEGPU_FAIL", api);
    if (outer) ncclGroupStart();
    r = fg_add(kind, send, recv, count, dt, op, root, peer, c, stream);
    if (r != ncclSuccess) {
        if (outer) {
            fg_group_depth--;
            fg_task_list_free(fg_group_head);
            fg_group_head = fg_group_tail = NULL;
        } else if (fg_group_error == ncclSuccess) {
            fg_group_error = r;
        }
        return r;
    }
    return outer ? ncclGroupEnd() : ncclSuccess;
}

FG_EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                                     ncclComm_t comm, cudaStream_t stream) {
    return fg_call(FG_AR, send, recv, count, dt, op, 0, 0, comm, stream);
}

FG_EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t dt, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
    return fg_call(FG_BC, send, recv, count, dt, ncclSum, root, 0, comm, stream);
}

/* NCCL defines two layouts for the collectives whose buffers differ in size: apart, or in place
   (the small buffer at this rank's slot of the large one). Real NCCL does not check; an overlap
   off the in-place layout is undefined there (wrong data or not), so the stand-in refuses it as
   the misuse it is instead of happening to compute the right answer. */
static ncclResult_t fg_layout(const char* api, const void* big, const void* small, size_t count, ncclDataType_t dt,
                              ncclComm_t c) {
    const uintptr_t part = count * fg_esize(dt), b = (uintptr_t)big, s = (uintptr_t)small;
    const uintptr_t whole = c && fg_comm_live(c) ? part * (uintptr_t)c->nranks : part;
    const int rank = c && fg_comm_live(c) ? c->rank : 0;
    if (count == 0 || s == b + (uintptr_t)rank * part || s + part <= b || b + whole <= s) return ncclSuccess;
    return fg_fail(c, ncclInvalidUsage, "%s: the buffers overlap off the in-place layout (the %s buffer starts %ld "
                   "bytes into the other; in place it starts at rank %d's slot, %lu bytes in): undefined in NCCL", api,
                   api[4] == 'A' ? "send" : "recv", (long)(s - b), rank, (unsigned long)((uintptr_t)rank * part));
}

FG_EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                                     cudaStream_t stream) {
    ncclResult_t r = fg_layout("ncclAllGather", recv, send, count, dt, comm);
    return r != ncclSuccess ? r : fg_call(FG_AG, send, recv, count, dt, ncclSum, 0, 0, comm, stream);
}

FG_EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = fg_layout("ncclReduceScatter", send, recv, count, dt, comm);
    return r != ncclSuccess ? r : fg_call(FG_RS, send, recv, count, dt, op, 0, 0, comm, stream);
}

FG_EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                                cudaStream_t stream) {
    return fg_call(FG_SEND, send, NULL, count, dt, ncclSum, 0, peer, comm, stream);
}

FG_EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                                cudaStream_t stream) {
    return fg_call(FG_RECV, NULL, recv, count, dt, ncclSum, 0, peer, comm, stream);
}

static void fg_comm_close(struct ncclComm* c, int aborting) {
    char name[96];
    struct ncclComm** pp;
    pthread_mutex_lock(&fg_comms_lock);
    for (pp = &fg_comms; *pp && *pp != c; pp = &(*pp)->next_all) {}
    if (*pp) *pp = c->next_all;
    pthread_mutex_unlock(&fg_comms_lock);
    if (c->sh) ST(c->sh->r[c->rank].state, aborting ? 3 : 4);
    fg_names(c, c->rank, name, sizeof name);
    shm_unlink(name); /* after a failed or aborted init the names may still be there */
    fg_names(c, -1, name, sizeof name);
    if (aborting || !c->joined) shm_unlink(name);
    pthread_mutex_lock(&c->m);
    c->closing = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->m);
    fg_comm_unref(c);
}

/* A group this thread opened and never closed would swallow every later call of the thread. */
static void fg_check_group(const char* call) {
    if (fg_group_depth > 0)
        fprintf(stderr, "fakegpu (pid %d): %s with a group still open on this thread (ncclGroupStart without "
                "ncclGroupEnd): its calls never run\n", (int)getpid(), call);
}

FG_EXPORT ncclResult_t ncclCommAbort(ncclComm_t c) {
    fg_check_group("ncclCommAbort");
    if (!c || !fg_comm_live(c)) return fg_fail(NULL, ncclInvalidArgument, "ncclCommAbort: not a live communicator");
    ST(c->aborted, 1); /* operations waiting for peers give up; queued ones do nothing */
    fg_trace("nccl rank %d abort", c->rank);
    fg_comm_close(c, 1);
    return ncclSuccess;
}

/* ---- teardown: a collective over this host's ranks ---- */

/* Every other rank of this host has finalized or destroyed its communicator. */
static int fg_host_left(struct ncclComm* c, void* arg) {
    int r, st;
    (void)arg;
    for (r = 0; r < c->nranks; r++) {
        if (r == c->rank || c->sh->r[r].host != c->host) continue;
        st = LD(c->sh->r[r].state);
        if (st != 4 && st != 5) return 0;
    }
    return 1;
}

/* Teardown's work, as NCCL does it: the communicator's operations finish (those still to be
   enqueued, then the ones on streams; a stuck one, with a dead peer or a mismatch, never does:
   call ncclCommAbort), then this host's ranks meet (its proxy threads and shared buffers are
   theirs together), so a rank whose neighbour is stopped waits. `mine`: the pending operations and
   references the caller holds itself. Returns 0, or -1 when the communicator was aborted. */
static int fg_teardown(struct ncclComm* c, int mine, const char* what) {
    double deadline = fg_now() + fg_cfg()->wait_s;
    pthread_mutex_lock(&c->m);
    while (c->pending > mine || c->refs > 1 + mine + (c->bg_started && !c->closing)) {
        if (LD(c->aborted)) break;
        if (fg_now() > deadline) {
            pthread_mutex_unlock(&c->m);
            fg_fatal("%s (rank %d) waited %.0f s (FAKEGPU_WAIT_S) for the communicator's operations%s: a communicator "
                     "with an error must be aborted (ncclCommAbort), not destroyed", what, c->rank, fg_cfg()->wait_s,
                     c->error != ncclSuccess ? ", which have failed" : "");
        }
        pthread_mutex_unlock(&c->m);
        fg_sleep(1e-3);
        pthread_mutex_lock(&c->m);
    }
    pthread_mutex_unlock(&c->m);
    if (LD(c->aborted)) return -1;
    if (!c->sh || !c->joined) return 0;
    ST(c->sh->r[c->rank].state, 5);
    return fg_nccl_wait(c, fg_host_left, NULL, what);
}

static void* fg_finalize_main(void* arg) {
    struct ncclComm* c = (struct ncclComm*)arg;
    int r = fg_teardown(c, 1, "ncclCommFinalize (waiting for this host's other ranks to finalize or destroy)");
    pthread_mutex_lock(&c->m);
    c->finalized = r == 0 ? 2 : 0;
    c->pending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->m);
    fg_comm_unref(c);
    return NULL;
}

/* Non-blocking: in progress until this host's ranks have all finalized (or destroyed); then
   ncclCommDestroy only frees. Blocking: returns then. */
FG_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t c) {
    pthread_t t;
    ncclResult_t r;
    fg_check_group("ncclCommFinalize");
    if ((r = fg_ensure_ready(c, "ncclCommFinalize")) != ncclSuccess) return r;
    fg_trace("nccl rank %d finalize", c->rank);
    if (c->blocking) {
        c->finalized = fg_teardown(c, 0, "ncclCommFinalize (waiting for this host's other ranks)") == 0 ? 2 : 0;
        return ncclSuccess;
    }
    pthread_mutex_lock(&c->m);
    c->finalized = 1;
    c->pending++;
    c->refs++;
    pthread_mutex_unlock(&c->m);
    if (pthread_create(&t, NULL, fg_finalize_main, c) != 0) fg_fatal("NCCL stand-in: pthread_create failed");
    pthread_detach(t);
    return ncclInProgress;
}

FG_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t c) {
    fg_check_group("ncclCommDestroy");
    if (!c || !fg_comm_live(c)) return fg_fail(NULL, ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
    pthread_mutex_lock(&c->m);
    if (c->finalized == 1) { /* a finalize still in progress */
        pthread_mutex_unlock(&c->m);
        return fg_fail(c, ncclInvalidArgument, "ncclCommDestroy: Attempt to use communicator before the previous "
                       "operation returned ncclSuccess");
    }
    pthread_mutex_unlock(&c->m);
    /* without a finalize first, destroy does its work, blocking, however long this host's other
       ranks take to come */
    if (c->finalized != 2) fg_teardown(c, 0, "ncclCommDestroy (waiting for this host's other ranks to destroy theirs)");
    fg_comm_close(c, 0);
    return ncclSuccess;
}
