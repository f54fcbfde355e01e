/* labs/ring/test.c: the tests of lab "ring", built together with the student's file.

   Each case starts `world` processes (fork), joined pairwise by Unix sockets, and runs the
   student's lab_ring_all_reduce in every one of them on different data. send and recv below are
   the whole transport: messages framed with their length, a send that keeps draining incoming
   data while it waits (so it never deadlocks, like a buffered send), a recv that gives up after
   RECV_PATIENCE_S seconds with a message naming what it waited for. The checks: every rank's
   result, and the traffic: who sent to whom, how many messages, how many bytes. */
#include "../lab_test.h"

#include <fcntl.h>
#include <stdint.h>
#include <sys/socket.h>

#include "ring.h"

#define MAX_WORLD 8
#define RECV_PATIENCE_S 5.0

typedef struct rank_stats {
    uint64_t floats_sent;
    int sends, recvs;
    int sent_to[MAX_WORLD]; /* messages sent to each rank */
} rank_stats;

/* ---- the transport, in each rank's process ---------------------------------------------------- */

static int g_rank, g_world;
static int g_fd[MAX_WORLD];          /* g_fd[p]: the socket to rank p */
static rank_stats* g_stats;          /* shared with the case's process, one per rank */
static struct inbox {
    unsigned char* data;
    size_t len, cap;
} g_in[MAX_WORLD];                   /* bytes received from each rank, not yet consumed */

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

/* Read whatever has arrived from rank p into its inbox. Returns the number of bytes read. */
static size_t drain(int p) {
    size_t total = 0;
    for (;;) {
        ssize_t n;
        struct inbox* b = &g_in[p];
        if (b->cap - b->len < 65536) {
            size_t cap = b->cap ? b->cap * 2 : 131072;
            unsigned char* d = (unsigned char*)realloc(b->data, cap);
            if (!d) rank_die("out of memory buffering messages from rank %d", p);
            b->data = d, b->cap = cap;
        }
        n = read(g_fd[p], b->data + b->len, b->cap - b->len);
        if (n > 0) {
            b->len += (size_t)n, total += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return total; /* EAGAIN, or the peer closed (it ended) */
    }
}

/* Wait up to `ms` for something to read from any peer (and, if out >= 0, for room to write to
   rank out); read it. Returns 1 if anything happened. */
static int pump(int out, int ms) {
    struct pollfd pf[MAX_WORLD];
    int p, k = 0, r;
    for (p = 0; p < g_world; p++) {
        if (p == g_rank) continue;
        pf[k].fd = g_fd[p], pf[k].events = (short)(POLLIN | (p == out ? POLLOUT : 0)), pf[k].revents = 0;
        k++;
    }
    r = poll(pf, (nfds_t)k, ms);
    if (r <= 0) return 0;
    for (p = 0; p < g_world; p++)
        if (p != g_rank) drain(p);
    return 1;
}

static void check_peer(const char* what, const char* name, int peer) {
    if (peer < 0 || peer >= g_world || peer == g_rank)
        rank_die("%s(%s = %d, ...): %s must be another rank, 0..%d, not %d itself", what, name, peer, name,
                 g_world - 1, g_rank);
}

static void write_all(int to, const void* data, size_t bytes) {
    const unsigned char* p = (const unsigned char*)data;
    while (bytes > 0) {
        ssize_t n = write(g_fd[to], p, bytes);
        if (n > 0) {
            p += n, bytes -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            rank_die("send to rank %d failed: %s (did rank %d end early?)", to, strerror(errno), to);
        pump(to, 100); /* full: keep taking in what others send while the receiver catches up */
    }
}

static void harness_send(int to, const float* data, size_t count) {
    uint64_t header = count;
    check_peer("send", "to", to);
    if (count > 0 && !data) rank_die("send(to = %d, data = NULL, count = %zu)", to, count);
    g_stats[g_rank].sends++;
    g_stats[g_rank].sent_to[to]++;
    g_stats[g_rank].floats_sent += count;
    write_all(to, &header, sizeof header);
    if (count) write_all(to, data, count * sizeof(float));
}

static void harness_recv(int from, float* data, size_t count) {
    struct inbox* b = &g_in[from];
    double last = lab_now();
    check_peer("recv", "from", from);
    if (count > 0 && !data) rank_die("recv(from = %d, data = NULL, count = %zu)", from, count);
    for (;;) {
        if (b->len >= sizeof(uint64_t)) {
            uint64_t header;
            memcpy(&header, b->data, sizeof header);
            if (header != count)
                rank_die("recv(from = %d, count = %zu): rank %d's next message holds %llu floats. A recv must "
                         "ask for exactly what the matching send sent (are both ranks using the same chunk?)",
                         from, count, from, (unsigned long long)header);
            if (b->len >= sizeof header + count * sizeof(float)) {
                size_t used = sizeof header + count * sizeof(float);
                if (count) memcpy(data, b->data + sizeof header, count * sizeof(float));
                memmove(b->data, b->data + used, b->len - used);
                b->len -= used;
                g_stats[g_rank].recvs++;
                return;
            }
        }
        if (pump(-1, 100)) last = lab_now();
        else if (lab_now() - last > RECV_PATIENCE_S)
            rank_die("waited %.0f s in recv(from = %d, count = %zu) and nothing came: rank %d never sends it "
                     "(or waits itself for something that never comes)", RECV_PATIENCE_S, from, count, from);
    }
}

/* ---- one run: world processes, each all-reducing its own data -------------------------------- */

/* Rank r's element i: small multiples of 1/4, so every sum is exact in any order. */
static float value(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 13) % 17) - 8) + 0.25f * (float)r; }

static void run_ring(int world, size_t n) {
    int pairs[MAX_WORLD][MAX_WORLD];
    pid_t pid[MAX_WORLD];
    rank_stats* stats = (rank_stats*)lab_shared(sizeof(rank_stats) * MAX_WORLD);
    float* result = (float*)lab_shared((n ? n : 1) * sizeof(float) * (size_t)world);
    int r, p, failed = 0, shown = 0, bad_ranks = 0;
    size_t i, wrong = 0;
    uint64_t total = 0, per_rank_max;
    if (!stats || !result) LAB_SKIP("cannot map %zu bytes of shared memory: %s", n * sizeof(float) * (size_t)world, strerror(errno));
    for (r = 0; r < world; r++)
        for (p = r + 1; p < world; p++) {
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) LAB_SKIP("socketpair failed: %s", strerror(errno));
            pairs[r][p] = sv[0], pairs[p][r] = sv[1];
        }
    fflush(NULL);
    for (r = 0; r < world; r++) {
        pid[r] = fork();
        if (pid[r] < 0) LAB_SKIP("cannot fork rank %d: %s", r, strerror(errno));
        if (pid[r] == 0) {
            float* buf = (float*)malloc((n ? n : 1) * sizeof(float));
            g_rank = r, g_world = world, g_stats = stats;
            for (p = 0; p < world; p++) { /* keep only this rank's ends of the sockets */
                int q;
                for (q = p + 1; q < world; q++)
                    if (p != r && q != r) close(pairs[p][q]), close(pairs[q][p]);
                if (p == r) continue;
                g_fd[p] = pairs[r][p];
                close(pairs[p][r]);
                fcntl(g_fd[p], F_SETFL, fcntl(g_fd[p], F_GETFL) | O_NONBLOCK);
            }
            if (!buf) rank_die("out of memory");
            for (i = 0; i < n; i++) buf[i] = value(r, i);
            lab_ring_all_reduce(buf, n, r, world, harness_send, harness_recv);
            if (n) memcpy(result + (size_t)r * n, buf, n * sizeof(float));
            fflush(NULL);
            _exit(0);
        }
    }
    for (r = 0; r < world; r++)
        for (p = r + 1; p < world; p++) close(pairs[r][p]), close(pairs[p][r]);
    /* wait for every rank; once one has failed, stop the others (they would wait for it) */
    for (r = 0; r < world; r++) {
        int status, k;
        pid_t w = waitpid(-1, &status, 0);
        for (k = 0; k < world && pid[k] != w; k++) {
        }
        if (k == world) continue;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL)
                lab_failf("rank %d was killed by signal %d (%s) inside lab_ring_all_reduce", k, WTERMSIG(status),
                          strsignal(WTERMSIG(status)));
            else if (WIFEXITED(status) && WEXITSTATUS(status) != 3)
                lab_failf("rank %d exited with status %d inside lab_ring_all_reduce", k, WEXITSTATUS(status));
            else if (WIFEXITED(status))
                lab_failed_checks++; /* it said why */
            if (!failed) {
                int q;
                for (q = 0; q < world; q++)
                    if (q != k) kill(pid[q], SIGKILL);
            }
            failed = 1;
        }
    }
    if (failed) {
        lab_note("(world = %d, n = %zu; the other ranks were stopped)", world, n);
        return;
    }
    /* every rank holds the sum */
    for (r = 0; r < world; r++)
        for (i = 0; i < n; i++) {
            float want = 0;
            int q;
            for (q = 0; q < world; q++) want += value(q, i);
            if (result[(size_t)r * n + i] != want) {
                wrong++;
                if (shown++ < 4)
                    lab_failf("world = %d, n = %zu: rank %d has buf[%zu] = %g, expected %g (the sum of every rank's "
                              "buf[%zu]; its own was %g)", world, n, r, i, (double)result[(size_t)r * n + i],
                              (double)want, i, (double)value(r, i));
            }
        }
    if (wrong > 4) lab_failf("... %zu wrong elements in all (of %zu on %d ranks)", wrong, n * (size_t)world, world);
    /* the traffic */
    per_rank_max = 2 * (uint64_t)(world - 1) * (uint64_t)((n + (size_t)world - 1) / (size_t)world);
    for (r = 0; r < world; r++) {
        rank_stats* s = &stats[r];
        int right = (r + 1) % world, left = (r + world - 1) % world, before = lab_failed_checks;
        total += s->floats_sent;
        if (bad_ranks >= 2) { /* the details of two ranks are enough */
            int q, wrong_peer = 0;
            for (q = 0; q < world; q++) wrong_peer |= q != right && s->sent_to[q] != 0;
            bad_ranks += wrong_peer || s->sends != 2 * (world - 1) || s->recvs != s->sends || s->floats_sent > per_rank_max;
            continue;
        }
        for (p = 0; p < world; p++)
            EXPECT(p == right || s->sent_to[p] == 0,
                   "world = %d: rank %d sent %d message(s) to rank %d; in a ring it only sends to its right "
                   "neighbour, rank %d", world, r, s->sent_to[p], p, right);
        EXPECT(s->sends == 2 * (world - 1),
               "world = %d: rank %d sent %d messages, expected 2(world-1) = %d: world-1 steps of reduce-scatter, "
               "world-1 of all-gather, one chunk each", world, r, s->sends, 2 * (world - 1));
        EXPECT(s->recvs == s->sends, "world = %d: rank %d received %d messages (from rank %d) and sent %d; each step "
               "of the ring sends one chunk and receives one", world, r, s->recvs, left, s->sends);
        EXPECT(s->floats_sent <= per_rank_max,
               "world = %d, n = %zu: rank %d sent %llu floats, more than 2(world-1) chunks of at most "
               "ceil(n/world) = %zu floats allow (%llu)", world, n, r, (unsigned long long)s->floats_sent,
               (n + (size_t)world - 1) / (size_t)world, (unsigned long long)per_rank_max);
        bad_ranks += lab_failed_checks != before;
    }
    if (bad_ranks > 2) lab_failf("... and the same kind of problem on %d more rank(s)", bad_ranks - 2);
    EXPECT(total == 2 * (uint64_t)(world - 1) * n,
           "world = %d, n = %zu: the ranks sent %llu floats together, expected 2(world-1) * n = %llu: each phase "
           "passes every chunk world-1 times", world, n, (unsigned long long)total,
           (unsigned long long)(2 * (uint64_t)(world - 1) * n));
    lab_note("world = %d, n = %zu floats (S = %zu bytes): each rank sent %.0f bytes on average, "
             "2(W-1)/W * S = %.0f", world, n, n * sizeof(float), world ? (double)total * 4 / world : 0.0,
             2.0 * (world - 1) / world * (double)(n * sizeof(float)));
}

/* ---- the cases ----------------------------------------------------------------------------- */

static void one_rank_leaves_the_buffer_alone(void) { run_ring(1, 5); }
static void two_ranks(void) { run_ring(2, 8); }
static void three_ranks_n_divisible(void) { run_ring(3, 12); }
static void four_ranks_n_not_divisible(void) {
    run_ring(4, 10);
    run_ring(3, 1001);
}
static void fewer_elements_than_ranks(void) {
    run_ring(5, 3);
    run_ring(4, 1);
}
static void empty_buffer(void) { run_ring(3, 0); }
static void eight_ranks(void) { run_ring(8, 1000); }
static void four_ranks_four_megabytes(void) { run_ring(4, ((size_t)1 << 20) + 3); }

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(one_rank_leaves_the_buffer_alone, 30);
    LAB_CASE(two_ranks, 30);
    LAB_CASE(three_ranks_n_divisible, 30);
    LAB_CASE(four_ranks_n_not_divisible, 30);
    LAB_CASE(fewer_elements_than_ranks, 30);
    LAB_CASE(empty_buffer, 30);
    LAB_CASE(eight_ranks, 30);
    LAB_CASE(four_ranks_four_megabytes, 60);
    return lab_end();
}
