/* tests/unit/test_desync.c: what a student sees when the ranks fall out of step (chapter 9), with real
   processes and sockets: DDP_DEBUG=DETAIL's desync check (both ranks' views of the mismatch), a
   collective that only one rank calls (the timeout names the collective, its sequence number and
   the rank that never came), the flight recorder printed on a timeout, and on SIGUSR1; and one
   that must not be a desync: a shared-memory peer that finished and left while this rank looked. */
struct ddp_pg;
static void shm_gap_hook(struct ddp_pg* pg, int q, unsigned target);
#define DDP__TEST_SHM_GAP(pg, q, target) shm_gap_hook(pg, q, target) /* ddp.h's test-only knob */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <sys/mman.h>

#include <signal.h>

/* Every log line of this process, kept for the checks (lines may come from the SIGUSR1 thread). */
static char g_log[65536];
static size_t g_log_n;
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static void capture(ddp_log_level level, const char* line, void* user) {
    size_t n = strlen(line);
    (void)level, (void)user;
    pthread_mutex_lock(&g_log_lock);
    if (g_log_n + n + 2 < sizeof g_log) {
        memcpy(g_log + g_log_n, line, n);
        g_log_n += n;
        g_log[g_log_n++] = '\n';
        g_log[g_log_n] = 0;
    }
    pthread_mutex_unlock(&g_log_lock);
}
static int log_has(const char* s) {
    int r;
    pthread_mutex_lock(&g_log_lock);
    r = strstr(g_log, s) != NULL;
    pthread_mutex_unlock(&g_log_lock);
    return r;
}

/* Join a CPU group with a short deadline and the log captured; `detail` turns on DDP_DEBUG=DETAIL. */
static ddp_pg* join(int detail, double timeout) {
    ddp_desc d;
    ddp_pg* pg = NULL;
    memset(&d, 0, sizeof d);
    d.device.type = DDP_DEVICE_CPU;
    d.timeout_s = timeout;
    ddp__g.level = detail ? DDP_LOG_DETAIL : DDP_LOG_WARN;
    ddp__set_log(capture, NULL);
    if (ddp_init(&d, &pg) != DDP_OK) return NULL;
    return pg;
}

/* Print why a rank failed, for the FAIL line's details. */
static int fail_with(int code, const char* what) {
    printf("    rank %d: %s\n    error: %s\n", (int)ddp__g.rank, what, ddp_error_string());
    fflush(stdout);
    return code;
}

/* ---- DETAIL: two ranks call all_reduce with different sizes -------------------------------------- */
static int sizes_main(int rank, void* arg) {
    float x[8] = {0};
    ddp_pg* pg = join(1, 10);
    ddp_status s;
    (void)arg;
    if (!pg) return fail_with(1, "ddp_init failed");
    if (ddp_all_reduce(pg, x, 8, DDP_F32, DDP_SUM, NULL) != DDP_OK) return fail_with(2, "the first all_reduce failed");
    s = ddp_all_reduce(pg, x, rank == 0 ? 4 : 8, DDP_F32, DDP_SUM, NULL);
    if (s != DDP_ERR_DESYNC) return fail_with(3, "the mismatched all_reduce did not return DDP_ERR_DESYNC");
    if (!strstr(ddp_error_string(), "desync at collective #2") || !strstr(ddp_error_string(), "all_reduce #2 (4 x f32, sum)") ||
        !strstr(ddp_error_string(), "all_reduce #2 (8 x f32, sum)"))
        return fail_with(4, "the message does not show both ranks' views");
    if (rank == 0) printf("    rank 0 saw: %.200s\n", ddp_error_string());
    ddp_destroy(pg);
    return 0;
}
static void desync_shows_both_views(void) { CHECK_OK(ddp_spawn(2, sizes_main, NULL)); }

/* ---- without DETAIL: the ring's header catches the same mismatch before any data moves ------------ */
static int ring_sizes_main(int rank, void* arg) {
    float x[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    ddp_pg* pg = join(0, 10);
    ddp_status s;
    (void)arg;
    if (!pg) return fail_with(1, "ddp_init failed");
    s = ddp_all_reduce(pg, x, rank == 0 ? 1 : 8, DDP_F32, DDP_SUM, NULL);
    if (s != DDP_ERR_DESYNC) return fail_with(2, "an all_reduce of 1 float against one of 8 did not return DDP_ERR_DESYNC");
    if (!strstr(ddp_error_string(), rank == 0 ? "rank 1 calls all_reduce #1 (8 x f32, sum)" : "rank 0 calls all_reduce #1 (1 x f32, sum)"))
        return fail_with(3, "the message does not show the neighbour's call");
    if (x[0] != 1.f) return fail_with(4, "the buffer was changed by a collective that should not have run");
    ddp_destroy(pg);
    return 0;
}
static void ring_header_catches_size_mismatch(void) { CHECK_OK(ddp_spawn(2, ring_sizes_main, NULL)); }

/* ---- DETAIL: a collective that only rank 0 calls ---------------------------------------------------- */
static int one_rank_main(int rank, void* arg) {
    float x = 1.f;
    ddp_pg* pg = join(1, 2);
    ddp_status s;
    double t0;
    (void)arg;
    if (!pg) return fail_with(1, "ddp_init failed");
    if (ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return fail_with(2, "the shared all_reduce failed");
    if (rank == 1) { /* does not take part; stays alive past rank 0's deadline */
        ddp__sleep(3.0);
        ddp_destroy(pg);
        return 0;
    }
    t0 = ddp__now();
    s = ddp__broadcast(pg, &x, 1, DDP_F32, 0, NULL); /* "if (rank == 0) broadcast(...)": the classic mistake */
    if (s != DDP_ERR_TIMEOUT) return fail_with(3, "a broadcast on rank 0 alone did not time out");
    if (ddp__now() - t0 > 4.0) return fail_with(4, "the deadline of 2 s was not kept");
    if (!strstr(ddp_error_string(), "rank 1 has not reached collective #2") ||
        !strstr(ddp_error_string(), "its last collective was all_reduce #1 (1 x f32, sum)"))
        return fail_with(5, "the message does not name the missing rank and where it stands");
    printf("    rank 0 saw: %.240s\n", ddp_error_string());
    ddp_destroy(pg);
    return 0;
}
static void collective_on_one_rank_named(void) { CHECK_OK(ddp_spawn(2, one_rank_main, NULL)); }

/* ---- without DETAIL: the same mistake times out in the ring, and the flight record is printed --- */
static int ring_timeout_main(int rank, void* arg) {
    float x = 1.f;
    ddp_pg* pg = join(0, 2);
    ddp_status s;
    (void)arg;
    if (!pg) return fail_with(1, "ddp_init failed");
    if (ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return fail_with(2, "the shared all_reduce failed");
    if (rank == 1) {
        ddp__sleep(3.0);
        ddp_destroy(pg);
        return 0;
    }
    s = ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, NULL);
    if (s != DDP_ERR_TIMEOUT) return fail_with(3, "an all_reduce on rank 0 alone did not time out");
    if (!strstr(ddp_error_string(), "all_reduce #2"))
        return fail_with(4, "the timeout does not name the collective and its sequence number");
    if (!log_has("the last collectives of rank 0 (a collective timed out)") || !log_has("#1 all_reduce (1 x f32): done") ||
        !log_has("#2 all_reduce (1 x f32): FAILED"))
        return fail_with(5, "the flight record was not printed on the timeout");
    printf("    rank 0 saw: %.200s\n", ddp_error_string());
    ddp_destroy(pg);
    return 0;
}
static void ring_timeout_prints_flight_record(void) { CHECK_OK(ddp_spawn(2, ring_timeout_main, NULL)); }

/* ---- SIGUSR1 prints the record ------------------------------------------------------------------------ */
static int usr1_main(int rank, void* arg) {
    float x = 1.f;
    ddp_pg* pg = join(0, 10);
    int i;
    (void)arg;
    if (!pg) return fail_with(1, "ddp_init failed");
    for (i = 0; i < 3; i++)
        if (ddp_all_reduce(pg, &x, 1, DDP_F32, DDP_SUM, NULL) != DDP_OK) return fail_with(2, "an all_reduce failed");
    kill(getpid(), SIGUSR1);
    for (i = 0; i < 200 && !log_has("#3 all_reduce"); i++) ddp__sleep(0.01);
    if (!log_has("the last collectives of rank") || !log_has("(SIGUSR1)") || !log_has("#3 all_reduce (1 x f32): done"))
        return fail_with(3, "SIGUSR1 did not print the last collectives");
    (void)rank;
    ddp_destroy(pg);
    return 0;
}
static void sigusr1_prints_flight_record(void) { CHECK_OK(ddp_spawn(2, usr1_main, NULL)); }

/* ---- shared memory: a peer that finishes its part and leaves while this rank looks is no desync ---
   A waiting rank reads a peer's phase counter, finds it short, and only then reads the peer's
   `left` flag. If the peer reached the phase and called ddp_destroy in between, the flag is set
   although the collective completed: reporting "rank 1 has left the job" there is a false
   DDP_ERR_DESYNC (seen once in 78 runs of chapter 7's block on an aarch64 build). The hook
   (DDP__TEST_SHM_GAP) holds rank 0 inside that gap until rank 1 has left, and rank 1 starts its
   last collective only once rank 0 is in the gap: that order every time, no timing involved. */
typedef struct { int armed, in_gap, peer_left, peer_reached; } shm_gap_state; /* one page both ranks map */
static shm_gap_state* g_gap;

static void shm_gap_hook(struct ddp_pg* pg, int q, unsigned target) {
#if DDP__SHM
    const ddp__shm_rank* o = ddp__shm_rank_of(pg, q);
    double until;
    if (!g_gap || pg->rank != 0 || !__atomic_exchange_n(&g_gap->armed, 0, __ATOMIC_SEQ_CST)) return;
    __atomic_store_n(&g_gap->in_gap, 1, __ATOMIC_SEQ_CST);
    for (until = ddp__now() + 30; !__atomic_load_n(&o->left, __ATOMIC_ACQUIRE) && ddp__now() < until;) ddp__sleep(0.001);
    g_gap->peer_left = (int)__atomic_load_n(&o->left, __ATOMIC_ACQUIRE);
    g_gap->peer_reached = ddp__shm_reached(o, target);
#else
    (void)pg, (void)q, (void)target;
#endif
}

static int shm_leave_main(int rank, void* arg) {
    float x[4] = {0, 0, 0, 0};
    ddp_pg* pg = join(0, 30);
    ddp_status s;
    double until;
    (void)arg;
    if (!pg) return fail_with(1, "ddp_init failed");
    if (!pg->shm) return fail_with(2, "the group does not use shared memory (DDP_TRANSPORT=shm was set)");
    if (ddp_all_reduce(pg, x, 4, DDP_F32, DDP_SUM, NULL) != DDP_OK) return fail_with(3, "the first all_reduce failed");
    if (rank == 1) { /* the root: broadcast once rank 0 waits inside the gap, then leave at once */
        x[0] = 1, x[1] = 2, x[2] = 3, x[3] = 4;
        for (until = ddp__now() + 30; !__atomic_load_n(&g_gap->in_gap, __ATOMIC_SEQ_CST) && ddp__now() < until;)
            ddp__sleep(0.001);
        if (!__atomic_load_n(&g_gap->in_gap, __ATOMIC_SEQ_CST)) return fail_with(4, "rank 0 never reached the gap");
        if (ddp__broadcast(pg, x, 4, DDP_F32, 1, NULL) != DDP_OK) return fail_with(5, "the broadcast failed on its root");
        ddp_destroy(pg);
        return 0;
    }
    __atomic_store_n(&g_gap->armed, 1, __ATOMIC_SEQ_CST);
    s = ddp__broadcast(pg, x, 4, DDP_F32, 1, NULL);
    if (!g_gap->peer_left || !g_gap->peer_reached)
        return fail_with(6, "the hook did not see rank 1 finish and leave inside the gap: the case tested nothing");
    if (s != DDP_OK) return fail_with(7, "a broadcast that rank 1 completed before it left failed on rank 0");
    if (x[0] != 1 || x[1] != 2 || x[2] != 3 || x[3] != 4) return fail_with(8, "rank 0 did not receive rank 1's values");
    ddp_destroy(pg);
    return 0;
}
static void shm_peer_left_after_its_part_is_no_desync(void) {
#if DDP__SHM
    const char* was = getenv("DDP_TRANSPORT");
    char saved[16] = "";
    if (was) snprintf(saved, sizeof saved, "%s", was);
    g_gap = (shm_gap_state*)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(g_gap != MAP_FAILED);
    if (g_gap == MAP_FAILED) return;
    memset(g_gap, 0, sizeof *g_gap);
    setenv("DDP_TRANSPORT", "shm", 1); /* this case is about the shared-memory transport */
    CHECK_OK(ddp_spawn(2, shm_leave_main, NULL));
    if (was) setenv("DDP_TRANSPORT", saved, 1);
    else unsetenv("DDP_TRANSPORT");
    munmap(g_gap, 4096);
    g_gap = NULL;
#else
    SKIP("this build has no shared-memory transport");
#endif
}

int main(void) {
    RUN(desync_shows_both_views);
    RUN(ring_header_catches_size_mismatch);
    RUN(collective_on_one_rank_named);
    RUN(ring_timeout_prints_flight_record);
    RUN(sigusr1_prints_flight_record);
    RUN(shm_peer_left_after_its_part_is_no_desync);
    return H_EXIT();
}
