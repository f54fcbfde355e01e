/* labs/ring/test.c: the tests of lab "ring", built together with the student's file.

   Each case starts `world` processes (fork) and runs the student's all-reduce in every one of
   them on different data. The transport is below: between rank r and rank r+1 a LINK in shared
   memory, a ring buffer of `window` floats plus a queue of message headers. send() puts a
   message into the link and returns once all of it is in; with the link full it waits, as a
   socket's send does when the peer's buffer is full. recv() takes the next message out.

   While the ranks run, the case's process watches them: when every rank that has not returned
   is blocked in send or recv and none of them can move (each sender's link is full, each
   receiver's link is empty), nothing can ever change again: that is a deadlock, reported at
   once with what every rank waits for. Then the checks: every rank's result, and the traffic
   (who sent to whom, how many messages, how many floats, in which order), each failure naming
   the rule of starter.c it breaks.

   What the messages hold (rule 8), checked float by float in cases with n <= CONTENT_N. There
   the data say where they come from: rank q's buf[p] is 64p + q + 1, so a sum over L
   consecutive ranks r, r-1, ..., r-L+1 of buf[p] is 64Lp plus a remainder below 64 (the sum of
   q + 1 over those ranks: at most 36 for 8 ranks, and different for every L), and from the value
   alone and its sender the tests read p and L, or see that it is no such sum (0 never is).
   This makes no assumption about which chunk goes at which step, or how chunks are cut into
   messages: only about what a ring's floats are. In send, every float must be, for some p,
     - L = 1: the sender's own buf[p] (the first hop of p's reduce-scatter),
     - 1 < L < world: its own buf[p] plus the sum over L-1 ranks that it has already received
       for p from its left neighbour (what it received, plus its own),
     - L = world: p's complete sum, once it has received either the sum of the world-1 others
       for p (to add its own to) or the complete sum (to pass on),
   and no rank sends two partial sums of one p, nor its complete sum twice. After the run, every
   p's partial sums went out from exactly world-1 ranks, and its complete sum from world-1. These
   hold for any correct ring (every chunk order, pieces of any size, either deadlock fix,
   part 2), and together they force each p's traffic to be a ring's: a chain of world-1 partial
   sums that grows by one rank per hop, then world-1 copies of the sum, each forwarded from one
   received. Junk of the right sizes, or sums computed some other way and sent in a ring's
   shape, fail them. */
#include "../lab_test.h"

#include <sched.h>
#include <stdint.h>

#include "ring.h"

#define MAX_WORLD 8
#define MAX_Q 1024   /* message headers a link holds */
#define MAX_EV 8192  /* non-empty sends and receives logged per rank, in order */
#define GUARD 16     /* floats past buf[n-1] that must stay untouched */
#define SENTINEL 12345.0f
#define CONTENT_N 4096 /* rule 8 (what the messages hold) is checked up to this n */

enum { ST_RUN, ST_SEND, ST_RECV, ST_DONE };

typedef struct link_t {     /* rank r -> rank r+1; counters only grow */
    uint64_t head, tail;    /* floats put in, taken out */
    uint64_t mhead, mtail;  /* messages put in, taken out (a message is out when all of it is) */
    uint64_t msg[MAX_Q];    /* message k's count, at k % MAX_Q */
} link_t;

typedef struct rank_info {
    int state, peer;                /* what the rank is doing now */
    uint64_t call_count, call_done; /* the current send's or recv's count, and how much has moved */
    uint64_t floats_sent, biggest;
    int sends, nonempty_sends, recvs, nonempty_recvs;
    int nev;                        /* ev[0..nev): 'S' or 'R' per non-empty message, in call order */
    char ev[MAX_EV];
} rank_info;

typedef struct shared {
    uint64_t progress;              /* bumped by every change anywhere: the watcher's clock */
    rank_info rank[MAX_WORLD];
    link_t link[MAX_WORLD];
} shared;

static uint64_t ld(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void st(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static int ldi(const int* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void sti(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* ---- the transport, in each rank's process ---------------------------------------------------- */

static shared* g_sh;
static float* g_data;                /* link r's ring buffer: g_data + r * g_window */
static int g_rank, g_world;
static size_t g_n, g_window, g_piece; /* g_piece > 0: part 2 */
/* rule 8, where n <= CONTENT_N (NULL otherwise): bit L-1 of g_sent[r * n + p] says that rank r
   sent p's sum over L ranks ending at r; g_got[r * n + p] the same for what r received */
static uint16_t *g_sent, *g_got;
static int g_encoded; /* set before the fork: the data are value()'s encoded form (see the top) */

static void rank_die(const char* fmt, ...) {
    va_list ap;
    printf("    rank %d: ", g_rank);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    _exit(3);
}

static void bump(void) { __atomic_fetch_add(&g_sh->progress, 1, __ATOMIC_SEQ_CST); }

/* Wait a moment: yield first, then short sleeps (eight ranks may share two cores). */
static void wait_a_little(unsigned* tries) {
    if (++*tries < 50) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

/* Copy k floats between mem and a link's ring buffer at position pos (counted since the start):
   up to the end of the ring, then from its start. */
static void ring_copy(float* ring, uint64_t pos, float* mem, uint64_t k, int into_ring) {
    uint64_t at = pos % g_window, first = g_window - at < k ? g_window - at : k;
    if (into_ring) {
        memcpy(ring + at, mem, first * sizeof(float));
        if (k > first) memcpy(ring, mem + first, (k - first) * sizeof(float));
    } else {
        memcpy(mem, ring + at, first * sizeof(float));
        if (k > first) memcpy(mem + first, ring, (k - first) * sizeof(float));
    }
}

static size_t chunk_max(void) { return (g_n + (size_t)g_world - 1) / (size_t)g_world; }

static void set_call(int state, int peer, size_t count) {
    rank_info* me = &g_sh->rank[g_rank];
    st(&me->call_count, count);
    st(&me->call_done, 0);
    sti(&me->peer, peer);
    sti(&me->state, state);
    bump();
}

/* The sum of q + 1 over the L ranks r, r-1, ..., r-L+1 (mod W): a float's remainder mod 64. */
static long long ranks_part(int r, int L, int W) {
    long long s = 0;
    int j;
    for (j = 0; j < L; j++) s += (long long)((r - j + W * 2) % W) + 1;
    return s;
}

/* v as a sum over L consecutive ranks ending at r of buf[p] (the encoded data): 1 and *p, *L
   when it is one, 0 when no p < n and L <= W give v. */
static int decode(float v, int r, int W, size_t n, size_t* p, int* L) {
    double d = (double)v;
    long long iv, rest;
    int l;
    if (!(d >= 1.0 && d < 16777216.0) || (double)(long long)d != d) return 0;
    iv = (long long)d;
    for (l = 1; l <= W; l++)
        if (iv % 64 == ranks_part(r, l, W)) {
            rest = (iv - iv % 64) / 64;
            if (rest % l || (size_t)(rest / l) >= n) return 0;
            *p = (size_t)(rest / l), *L = l;
            return 1;
        }
    return 0;
}

static float encoded_sum(size_t p, int r, int L, int W) { return (float)(64 * (long long)p * L + ranks_part(r, L, W)); }

/* What L's are set in a mask, as "1, 3" (sums over 1 and 3 ranks), or "nothing". */
static const char* which_sums(uint16_t mask, int W, char* out, size_t size) {
    int l, k = 0;
    out[0] = 0;
    for (l = 1; l <= W; l++)
        if (mask & (1u << (l - 1))) k += snprintf(out + k, size - (size_t)k, "%s%d", k ? ", " : "", l);
    if (!k) snprintf(out, size, "nothing");
    return out;
}

/* Rule 8, in send: every float is a sum the ring can send now (see the top of this file). */
static void check_content(const float* data, size_t count, int nsend) {
    int W = g_world, r = g_rank, left = (g_rank + W - 1) % W;
    size_t j, p, q;
    int L, LL;
    char have[64];
    for (j = 0; j < count; j++) {
        uint16_t *sent, got;
        if (!decode(data[j], r, W, g_n, &p, &L)) {
            /* what it could have been: the neighbour's position in this message, one further */
            for (q = 0; q < count; q++)
                if (q != j && decode(data[q], r, W, g_n, &p, &L) && (q < j || p >= q - j) && p + j - q < g_n) break;
            if (q < count)
                rank_die("[rule 8: what a ring sends] rank %d's send #%d (to = %d, count = %zu), float %zu: %g is no "
                         "value a ring sends; float %zu of the message is buf[%zu]'s sum over %d rank(s), so this one "
                         "would be buf[%zu]'s: %g. Every float a rank sends is, for some element p, its own buf[p], "
                         "its own plus what it received for p, or p's complete sum (here rank q's buf[p] = 64p + q + 1)",
                         r, nsend, (r + 1) % W, count, j, (double)data[j], q, p, L, p + j - q,
                         (double)encoded_sum(p + j - q, r, L, W));
            rank_die("[rule 8: what a ring sends] rank %d's send #%d (to = %d, count = %zu), float %zu: %g is no value "
                     "a ring sends, and no float of that message is one. Every float a rank sends is, for some element "
                     "p, its own buf[p], its own plus what it received for p, or p's complete sum (here rank q's buf[p] "
                     "= 64p + q + 1, so rank %d's first message could hold its own buf[p] = %g, %g, ...)", r, nsend,
                     (r + 1) % W, count, j, (double)data[j], r, (double)encoded_sum(0, r, 1, W),
                     (double)encoded_sum(1, r, 1, W));
        }
        sent = &g_sent[(size_t)r * g_n + p];
        got = g_got[(size_t)r * g_n + p];
        if (L > 1 && L < W && !(got & (1u << (L - 2))))
            rank_die("[rule 8: what a ring sends] rank %d's send #%d (to = %d, count = %zu), float %zu: %g is buf[%zu]'s "
                     "sum over %d ranks (%d and the %d before it), but rank %d has not received that sum over the %d "
                     "before it from rank %d (for buf[%zu] it received sums over: %s): in the reduce-scatter a rank "
                     "adds its own value to what it received", r, nsend, (r + 1) % W, count, j, (double)data[j], p, L,
                     r, L - 1, r, L - 1, left, p, which_sums(got, W, have, sizeof have));
        if (L == W && !(got & (1u << (W - 2))) && !(got & (1u << (W - 1))))
            rank_die("[rule 8: what a ring sends] rank %d's send #%d (to = %d, count = %zu), float %zu: %g is buf[%zu]'s "
                     "complete sum, but rank %d has received from rank %d for buf[%zu] neither the sum of the other %d "
                     "ranks nor the complete sum (it received sums over: %s rank(s)): a rank sends a sum it holds "
                     "because the ring brought it", r, nsend, (r + 1) % W, count, j, (double)data[j], p, r, left, p,
                     W - 1, which_sums(got, W, have, sizeof have));
        if (L < W)
            for (LL = 1; LL < W; LL++)
                if (*sent & (1u << (LL - 1)))
                    rank_die("[rule 8: what a ring sends] rank %d's send #%d (to = %d, count = %zu), float %zu: %g is "
                             "buf[%zu]'s sum over %d rank(s), and rank %d already sent buf[%zu]'s sum over %d: in the "
                             "reduce-scatter each element passes through a rank once", r, nsend, (r + 1) % W, count, j,
                             (double)data[j], p, L, r, p, LL);
        if (L == W && (*sent & (1u << (W - 1))))
            rank_die("[rule 8: what a ring sends] rank %d's send #%d (to = %d, count = %zu), float %zu: %g is buf[%zu]'s "
                     "complete sum, which rank %d already sent once: in the all-gather each sum passes through a rank "
                     "once", r, nsend, (r + 1) % W, count, j, (double)data[j], p, r);
        *sent |= (uint16_t)(1u << (L - 1));
    }
}

static void harness_send(int to, const float* data, size_t count) {
    rank_info* me = &g_sh->rank[g_rank];
    int right = (g_rank + 1) % g_world;
    link_t* L = &g_sh->link[g_rank];
    float* ring = g_data + (size_t)g_rank * g_window;
    size_t left = count;
    unsigned tries = 0;
    if (to != right)
        rank_die("[rule 2: a ring] send(to = %d, ...): rank %d sends only to its right neighbour, rank %d", to, g_rank,
                 right);
    if (count > 0 && !data) rank_die("send(to = %d, data = NULL, count = %zu)", to, count);
    if (!g_piece && count > chunk_max())
        rank_die("[rule 4: chunks differ in size by at most one] send(to = %d, count = %zu): no chunk holds more than "
                 "ceil(n / world) = %zu floats (n = %zu, world = %d: every chunk holds %zu or %zu)", to, count,
                 chunk_max(), g_n, g_world, g_n / (size_t)g_world, chunk_max());
    if (g_piece && count > g_piece)
        rank_die("[rule P1: pieces of at most `piece` floats] send(to = %d, count = %zu): piece = %zu", to, count,
                 g_piece);
    me->sends++;
    if (g_sent && count) check_content(data, count, me->sends);
    me->floats_sent += count;
    if (count > me->biggest) me->biggest = count;
    if (count) {
        me->nonempty_sends++;
        if (me->nev < MAX_EV) me->ev[me->nev] = 'S';
        me->nev++;
    }
    set_call(ST_SEND, to, count);
    while (ld(&L->mhead) - ld(&L->mtail) >= MAX_Q) wait_a_little(&tries); /* the header queue is full */
    L->msg[ld(&L->mhead) % MAX_Q] = count;
    st(&L->mhead, ld(&L->mhead) + 1);
    bump();
    while (left > 0) {
        uint64_t head = ld(&L->head), room = g_window - (head - ld(&L->tail)), k;
        if (room == 0) {
            wait_a_little(&tries);
            continue;
        }
        tries = 0;
        k = room < left ? room : left;
        ring_copy(ring, head, (float*)data, k, 1);
        st(&L->head, head + k);
        data += k, left -= (size_t)k;
        st(&me->call_done, count - left);
        bump();
    }
    set_call(ST_RUN, -1, 0);
}

static void harness_recv(int from, float* data, size_t count) {
    rank_info* me = &g_sh->rank[g_rank];
    int leftn = (g_rank + g_world - 1) % g_world;
    link_t* L = &g_sh->link[leftn];
    float* ring = g_data + (size_t)leftn * g_window;
    size_t left = count;
    uint64_t theirs;
    unsigned tries = 0;
    if (from != leftn)
        rank_die("[rule 2: a ring] recv(from = %d, ...): rank %d receives only from its left neighbour, rank %d", from,
                 g_rank, leftn);
    if (count > 0 && !data) rank_die("recv(from = %d, data = NULL, count = %zu)", from, count);
    me->recvs++;
    if (count) {
        me->nonempty_recvs++;
        if (me->nev < MAX_EV) me->ev[me->nev] = 'R';
        me->nev++;
    }
    set_call(ST_RECV, from, count);
    while (ld(&L->mhead) == ld(&L->mtail)) wait_a_little(&tries);
    theirs = L->msg[ld(&L->mtail) % MAX_Q];
    if (theirs != count)
        rank_die("[rule 3: recv asks for exactly what the matching send sent] recv(from = %d, count = %zu): rank %d's next "
                 "message holds %llu floats (do both ranks cut the same chunk at this step?)", from, count, from,
                 (unsigned long long)theirs);
    while (left > 0) {
        uint64_t tail = ld(&L->tail), avail = ld(&L->head) - tail, k;
        if (avail == 0) {
            wait_a_little(&tries);
            continue;
        }
        tries = 0;
        k = avail < left ? avail : left;
        ring_copy(ring, tail, data, k, 0);
        st(&L->tail, tail + k);
        data += k, left -= (size_t)k;
        st(&me->call_done, count - left);
        bump();
    }
    if (g_got) { /* rule 8: what rank `from` sent, it checked; note what this rank now holds */
        size_t j, p;
        int l;
        const float* in = data - count;
        for (j = 0; j < count; j++)
            if (decode(in[j], leftn, g_world, g_n, &p, &l))
                g_got[(size_t)g_rank * g_n + p] |= (uint16_t)(1u << (l - 1));
    }
    st(&L->mtail, ld(&L->mtail) + 1);
    set_call(ST_RUN, -1, 0);
}

/* ---- the watcher, in the case's process -------------------------------------------------------- */

/* 1 when no rank that has not returned can ever move again: each is in send with its link full,
   or in recv with nothing to take. */
static int nobody_can_move(shared* sh, int W, size_t window) {
    int r, blocked = 0;
    for (r = 0; r < W; r++) {
        rank_info* ri = &sh->rank[r];
        int s = ldi(&ri->state);
        if (s == ST_DONE) continue;
        if (s == ST_RUN) return 0;
        if (s == ST_SEND) {
            link_t* L = &sh->link[r];
            int full = ld(&L->mhead) - ld(&L->mtail) >= MAX_Q ||
                       (ld(&L->head) - ld(&L->tail) >= window && ld(&ri->call_done) < ld(&ri->call_count));
            if (!full) return 0;
        } else {
            link_t* L = &sh->link[(r + W - 1) % W];
            int empty = ld(&L->mhead) == ld(&L->mtail) ||
                        (ld(&L->head) == ld(&L->tail) && ld(&ri->call_done) < ld(&ri->call_count));
            if (!empty) return 0;
        }
        blocked++;
    }
    return blocked > 0;
}

/* What each rank waits for, and which rule that breaks. */
static void describe_deadlock(shared* sh, int W, size_t window, double after_s) {
    int r, senders = 0, receivers = 0, returned = 0;
    for (r = 0; r < W; r++) {
        int s = ldi(&sh->rank[r].state);
        senders += s == ST_SEND, receivers += s == ST_RECV, returned += s == ST_DONE;
    }
    if (returned > 0)
        lab_failf("[rule 3: every message sent is received] %d rank(s) returned while the others still wait for them "
                  "(found %.0f ms after the last move):", returned, after_s * 1e3);
    else if (receivers == 0)
        lab_failf("[rule 7: no deadlock] deadlock: every rank is blocked in send, and no rank is receiving, so no send "
                  "can ever finish (found %.0f ms after the last move). A send returns only once its message is in the "
                  "link, and the link holds window = %zu float(s):", after_s * 1e3, window);
    else if (senders == 0)
        lab_failf("[rule 7: no deadlock] deadlock: every rank is blocked in recv, and no message is on its way: "
                  "somebody has to send first (found %.0f ms after the last move):", after_s * 1e3);
    else
        lab_failf("[rule 7: no deadlock] deadlock: every rank waits for another (found %.0f ms after the last move), "
                  "window = %zu floats:", after_s * 1e3, window);
    for (r = 0; r < W; r++) {
        rank_info* ri = &sh->rank[r];
        int s = ldi(&ri->state), peer = ldi(&ri->peer);
        unsigned long long c = (unsigned long long)ld(&ri->call_count), d = (unsigned long long)ld(&ri->call_done);
        if (s == ST_DONE)
            lab_note("  rank %d has returned from the all-reduce", r);
        else if (s == ST_SEND && ld(&sh->link[r].mhead) - ld(&sh->link[r].mtail) >= MAX_Q)
            lab_note("  rank %d is blocked in send(to = %d, count = %llu): %d messages wait in the link, none received",
                     r, peer, c, MAX_Q);
        else if (s == ST_SEND && d == 0)
            lab_note("  rank %d is blocked in send(to = %d, count = %llu): none of this message has got in yet, "
                     "because earlier messages fill the link's %zu float(s), and rank %d is not receiving", r, peer, c,
                     window, peer);
        else if (s == ST_SEND)
            lab_note("  rank %d is blocked in send(to = %d, count = %llu): %llu of its floats got in and filled the "
                     "link's %zu float(s); the rest waits for rank %d, which is not receiving", r, peer, c, d, window,
                     peer);
        else if (d > 0)
            lab_note("  rank %d is blocked in recv(from = %d, count = %llu) with %llu floats, and no more is on its way",
                     r, peer, c, d);
        else
            lab_note("  rank %d is blocked in recv(from = %d, count = %llu): no message from rank %d is on its way", r,
                     peer, c, peer);
    }
}

/* ---- one run ------------------------------------------------------------------------------------ */

/* Rank r's element i. Where rule 8 is checked (n <= CONTENT_N), 64i + r + 1: integers below
   2^19, whose sums over ranks say which element and which ranks they hold (see the top). Larger
   cases: small multiples of 1/4. Either way every sum is exact in any order. */
static float value(int r, size_t i) {
    if (g_encoded) return (float)(64 * (long long)i + r + 1);
    return (float)((int)((i * 7 + (size_t)r * 13) % 17) - 8) + 0.25f * (float)r;
}

static size_t clen(size_t n, int W, int c) { return n * (size_t)(c + 1) / (size_t)W - n * (size_t)c / (size_t)W; }

/* Run the all-reduce on W ranks; piece > 0 runs part 2 (the link then holds 2 * piece floats).
   Returns 1 when the ranks finished and every check passed. */
static int run_ring(int W, size_t n, size_t window, size_t piece) {
    shared* sh = (shared*)lab_shared(sizeof(shared));
    float* result = (float*)lab_shared((n + GUARD) * sizeof(float) * (size_t)W);
    float* data;
    pid_t pid[MAX_WORLD];
    int r, exited[MAX_WORLD], nexited = 0, failed = 0, stuck_polls = 0, before = lab_failed_checks, bad_ranks = 0;
    uint64_t last_progress = 0, total = 0, per_rank_max;
    double last_move = lab_now();
    size_t i, wrong = 0;
    const char* part = piece ? "lab_ring_all_reduce_pipelined" : "lab_ring_all_reduce";
    if (piece) window = 2 * piece;
    data = (float*)lab_shared(window * sizeof(float) * (size_t)W);
    if (!sh || !result || !data) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
    g_encoded = n <= CONTENT_N, g_sent = g_got = NULL;
    if (g_encoded && n > 0) {
        g_sent = (uint16_t*)lab_shared(2 * n * (size_t)W * sizeof(uint16_t));
        if (!g_sent) LAB_SKIP("cannot map shared memory: %s", strerror(errno));
        g_got = g_sent + n * (size_t)W;
    }
    fflush(NULL);
    for (r = 0; r < W; r++) {
        pid[r] = fork();
        if (pid[r] < 0) LAB_SKIP("cannot fork rank %d: %s", r, strerror(errno));
        if (pid[r] == 0) {
            float* buf = (float*)malloc((n + GUARD) * sizeof(float));
            g_sh = sh, g_data = data, g_rank = r, g_world = W, g_n = n, g_window = window, g_piece = piece;
            if (!buf) rank_die("out of memory");
            for (i = 0; i < n; i++) buf[i] = value(r, i);
            for (i = n; i < n + GUARD; i++) buf[i] = SENTINEL;
            if (piece) lab_ring_all_reduce_pipelined(buf, n, r, W, piece, harness_send, harness_recv);
            else lab_ring_all_reduce(buf, n, r, W, window, harness_send, harness_recv);
            memcpy(result + (size_t)r * (n + GUARD), buf, (n + GUARD) * sizeof(float));
            sti(&sh->rank[r].state, ST_DONE);
            bump();
            fflush(NULL);
            _exit(0);
        }
        exited[r] = 0;
    }
    /* watch until every rank has ended, or nobody can move */
    while (nexited < W) {
        int status, k, stuck;
        uint64_t p1, p2;
        pid_t w = waitpid(-1, &status, WNOHANG);
        if (w > 0) {
            for (k = 0; k < W && pid[k] != w; k++) {
            }
            if (k == W) continue;
            exited[k] = 1, nexited++;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL)
                    lab_failf("rank %d was killed by signal %d (%s) inside %s", k, WTERMSIG(status),
                              strsignal(WTERMSIG(status)), part);
                else if (WIFEXITED(status) && WEXITSTATUS(status) != 3)
                    lab_failf("rank %d exited with status %d inside %s", k, WEXITSTATUS(status), part);
                else if (WIFEXITED(status))
                    lab_failed_checks++; /* it said why */
                failed = 1;
                break;
            }
            continue;
        }
        p1 = ld(&sh->progress);
        stuck = nobody_can_move(sh, W, window);
        p2 = ld(&sh->progress);
        if (p1 != last_progress) last_move = lab_now(), last_progress = p1;
        /* the same picture twice, 20 ms apart, with nothing moving in between: a deadlock */
        stuck_polls = stuck && p1 == p2 && p1 == last_progress ? stuck_polls + 1 : 0;
        if (stuck_polls >= 3) {
            describe_deadlock(sh, W, window, lab_now() - last_move);
            failed = 1;
            break;
        }
        {
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
    }
    if (failed) {
        for (r = 0; r < W; r++)
            if (!exited[r]) kill(pid[r], SIGKILL);
        for (r = 0; r < W; r++)
            if (!exited[r]) waitpid(pid[r], NULL, 0);
        lab_note("(%s, world = %d, n = %zu, %s = %zu; the other ranks were stopped)", part, W, n,
                 piece ? "piece" : "window", piece ? piece : window);
        return 0;
    }
    /* rule 3: nothing left in a link */
    for (r = 0; r < W; r++) {
        uint64_t left = sh->link[r].mhead - sh->link[r].mtail;
        EXPECT(left == 0, "[rule 3: every message sent is received] world = %d, n = %zu: rank %d returned with %llu "
               "message(s) to rank %d that rank %d never received", W, n, r, (unsigned long long)left, (r + 1) % W,
               (r + 1) % W);
    }
    /* rule 1: every rank holds the sum, and nothing past it changed */
    for (r = 0; r < W; r++) {
        const float* got = result + (size_t)r * (n + GUARD);
        for (i = 0; i < n; i++) {
            float want = 0;
            int q;
            for (q = 0; q < W; q++) want += value(q, i);
            if (got[i] != want && wrong++ < 4)
                lab_failf("[rule 1: every rank ends with the sum] world = %d, n = %zu: rank %d has buf[%zu] = %g, "
                          "expected %g (the sum of every rank's buf[%zu]; its own was %g)", W, n, r, i, (double)got[i],
                          (double)want, i, (double)value(r, i));
        }
        for (i = n; i < n + GUARD; i++)
            if (got[i] != SENTINEL) {
                lab_failf("[rule 1: nothing past buf[n-1] is written] world = %d, n = %zu: rank %d wrote buf[%zu]", W,
                          n, r, i);
                break;
            }
    }
    if (wrong > 4) lab_failf("... %zu wrong elements in all (of %zu on %d ranks)", wrong, n * (size_t)W, W);
    /* rule 5: bandwidth */
    per_rank_max = 2 * (uint64_t)(W - 1) * (uint64_t)((n + (size_t)W - 1) / (size_t)W);
    for (r = 0; r < W; r++) {
        total += sh->rank[r].floats_sent;
        if (sh->rank[r].floats_sent > per_rank_max && bad_ranks++ < 2)
            lab_failf("[rule 5: each rank sends at most 2(world-1) chunks] world = %d, n = %zu: rank %d sent %llu "
                      "floats, more than 2(world-1) chunks of at most ceil(n/world) = %zu floats (%llu)", W, n, r,
                      (unsigned long long)sh->rank[r].floats_sent, (n + (size_t)W - 1) / (size_t)W,
                      (unsigned long long)per_rank_max);
    }
    EXPECT(total == 2 * (uint64_t)(W - 1) * n,
           "[rule 5: the ranks together send exactly 2(world-1) * n floats] world = %d, n = %zu: they sent %llu, "
           "expected %llu: each phase moves every chunk world-1 times", W, n, (unsigned long long)total,
           (unsigned long long)(2 * (uint64_t)(W - 1) * n));
    if (g_sent && W > 1 && lab_failed_checks == before) { /* rule 8: each element's traffic is a ring's */
        size_t bad = 0, first = 0;
        int fp = 0, ft = 0;
        for (i = 0; i < n; i++) {
            int partials = 0, totals = 0;
            for (r = 0; r < W; r++) {
                uint16_t m = g_sent[(size_t)r * n + i];
                partials += (m & ((1u << (W - 1)) - 1)) != 0, totals += (m >> (W - 1)) & 1;
            }
            if ((partials != W - 1 || totals != W - 1) && bad++ == 0) first = i, fp = partials, ft = totals;
        }
        EXPECT(bad == 0,
               "[rule 8: what a ring sends] world = %d, n = %zu: partial sums of buf[%zu] went out from %d rank(s) "
               "and its complete sum from %d, expected world-1 = %d of each (%zu element(s) like this): the "
               "reduce-scatter carries each element once around the ring, one more rank's value added at each hop, "
               "and the all-gather carries its sum once around", W, n, first, fp, ft, W - 1, bad);
    } else if (!g_encoded && W > 1) {
        lab_note("(rule 8, what the messages hold, is checked only up to n = %d)", CONTENT_N);
    }
    if (!piece && window >= (n + (size_t)W - 1) / (size_t)W && W > 1) { /* rule 6: every chunk fits */
        int msgs = 0;
        size_t want = 2 * (size_t)(W - 1) * (n < (size_t)W ? n : (size_t)W);
        for (r = 0; r < W; r++) msgs += sh->rank[r].nonempty_sends;
        EXPECT((size_t)msgs == want,
               "[rule 6: a chunk that fits in the window goes as one message] world = %d, n = %zu, window = %zu: the "
               "ranks sent %d non-empty messages, expected %zu (2(world-1) steps on each rank, one chunk each, and "
               "every chunk fits in the window)", W, n, window, msgs, want);
    }
    if (piece && W > 1) { /* rule P2: ceil(len / piece) messages per chunk */
        int msgs = 0, c;
        size_t want = 0;
        for (c = 0; c < W; c++) want += 2 * (size_t)(W - 1) * ((clen(n, W, c) + piece - 1) / piece);
        for (r = 0; r < W; r++) msgs += sh->rank[r].nonempty_sends;
        EXPECT((size_t)msgs == want,
               "[rule P2: each chunk goes as ceil(len / piece) messages] world = %d, n = %zu, piece = %zu: the ranks "
               "sent %d non-empty messages, expected %zu", W, n, piece, msgs, want);
    }
    if (piece && W > 1 && n % ((size_t)W * piece) == 0 && n > 0) { /* rule P3, when every chunk has K pieces */
        size_t K = n / (size_t)W / piece;
        for (r = 0; r < W && lab_failed_checks == before; r++) {
            rank_info* ri = &sh->rank[r];
            int e, sends = 0, recvs = 0;
            if (ri->nev > MAX_EV) continue;
            for (e = 0; e < ri->nev; e++) {
                if (ri->ev[e] == 'S') {
                    sends++;
                    continue;
                }
                {
                    size_t step = (size_t)recvs / K, p = (size_t)recvs % K;
                    size_t need = step * K + (p + 2 < K ? p + 2 : K);
                    if ((size_t)sends < need) {
                        lab_failf("[rule P3: one piece in flight] world = %d, n = %zu, piece = %zu (%zu pieces per "
                                  "chunk): rank %d waited for piece %zu of step %zu having sent only %zu piece(s) of "
                                  "that step; piece %zu should already be on its way, so that the link never idles "
                                  "while the rank adds", W, n, piece, K, r, p, step, (size_t)sends - step * K,
                                  p + 1 < K ? p + 1 : p);
                        break;
                    }
                }
                recvs++;
            }
        }
    }
    if (lab_failed_checks == before)
        lab_note("world = %d, n = %zu floats, %s = %zu: each rank sent %.0f floats on average, 2(W-1)/W * n = %.0f",
                 W, n, piece ? "piece" : "window", piece ? piece : window, W ? (double)total / W : 0.0,
                 2.0 * (W - 1) / W * (double)n);
    return lab_failed_checks == before;
}

/* ---- the cases ----------------------------------------------------------------------------- */

#define BIG ((size_t)1 << 30) /* a window larger than any chunk */

static void one_rank_leaves_the_buffer_alone(void) { run_ring(1, 5, BIG, 0); }
static void two_ranks(void) { run_ring(2, 8, 1024, 0); }
static void three_ranks_n_divisible(void) { run_ring(3, 12, 1024, 0); }
static void uneven_chunks(void) {
    if (run_ring(4, 10, 1024, 0)) /* chunks of 2 and 3 */
        if (run_ring(3, 1001, 4096, 0))
            run_ring(5, 13, 64, 0);
}
static void fewer_elements_than_ranks(void) {
    if (run_ring(5, 3, 1024, 0)) run_ring(4, 1, 1024, 0);
}
static void empty_buffer(void) { run_ring(3, 0, 1024, 0); }
static void eight_ranks(void) { run_ring(8, 1000, 1024, 0); }
static void chunks_larger_than_the_window(void) {
    if (run_ring(3, 3000, 64, 0)) /* "send, then receive" deadlocks here */
        if (run_ring(2, 1000, 16, 0))
            run_ring(4, 4099, 100, 0);
}
static void a_chunk_that_just_fits(void) {
    if (run_ring(3, 12, 4, 0)) run_ring(4, 10, 3, 0);
}
static void a_window_of_one_float(void) {
    if (run_ring(3, 20, 1, 0)) run_ring(2, 7, 1, 0);
}
static void four_ranks_four_megabytes(void) { run_ring(4, ((size_t)1 << 20) + 3, 65536, 0); }

/* Eight random settings of the seed (LAB_SEED); part 2 (pipelined) or part 1. */
static void random_settings(int pipelined) {
    lab_rng g;
    int k;
    lab_rng_seed(&g, lab_seed(), (uint64_t)(1 + pipelined));
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    for (k = 0; k < 8; k++) {
        int W = 1 + (int)lab_rng_below(&g, 8);
        size_t piece = 1 + lab_rng_below(&g, 64), n, window = 0;
        if (pipelined) {
            n = k % 2 ? (size_t)W * piece * (1 + lab_rng_below(&g, 6)) : lab_rng_below(&g, 3000);
        } else {
            n = lab_rng_below(&g, 4) == 0 ? lab_rng_below(&g, 9) : lab_rng_below(&g, 5000);
            window = 1 + lab_rng_below(&g, lab_rng_below(&g, 2) ? 8 : 2048);
            piece = 0;
        }
        if (!run_ring(W, n, window, piece)) break;
    }
}
static void random_cases(void) { random_settings(0); }

static void pipelined_even_pieces(void) { run_ring(3, 3 * 4 * 16, 0, 16); }
static void pipelined_four_ranks(void) {
    if (run_ring(4, 4 * 8 * 32, 0, 32)) run_ring(2, 2 * 5 * 3, 0, 3);
}
static void pipelined_uneven(void) {
    if (run_ring(3, 1000, 0, 64)) /* chunks of 333 and 334: 6 pieces each, the last ones short */
        if (run_ring(5, 13, 0, 2))
            run_ring(4, 2, 0, 5);
}
static void pipelined_one_piece_per_chunk(void) { run_ring(4, 40, 0, 64); }
static void pipelined_piece_of_one_float(void) { run_ring(3, 3 * 6, 0, 1); }
static void pipelined_eight_ranks_one_megabyte(void) { run_ring(8, (size_t)8 * 16 * 2048, 0, 2048); }
static void pipelined_random_cases(void) { random_settings(1); }

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(one_rank_leaves_the_buffer_alone, 20);
    LAB_CASE(two_ranks, 20);
    LAB_CASE(three_ranks_n_divisible, 20);
    LAB_CASE(uneven_chunks, 20);
    LAB_CASE(fewer_elements_than_ranks, 20);
    LAB_CASE(empty_buffer, 20);
    LAB_CASE(eight_ranks, 20);
    LAB_CASE(chunks_larger_than_the_window, 20);
    LAB_CASE(a_chunk_that_just_fits, 20);
    LAB_CASE(a_window_of_one_float, 20);
    LAB_CASE(four_ranks_four_megabytes, 60);
    LAB_CASE(random_cases, 60);
    LAB_CASE(pipelined_even_pieces, 20);
    LAB_CASE(pipelined_four_ranks, 20);
    LAB_CASE(pipelined_uneven, 20);
    LAB_CASE(pipelined_one_piece_per_chunk, 20);
    LAB_CASE(pipelined_piece_of_one_float, 20);
    LAB_CASE(pipelined_eight_ranks_one_megabyte, 60);
    LAB_CASE(pipelined_random_cases, 60);
    return lab_end();
}
