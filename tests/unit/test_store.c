/* The rendezvous store: operations, concurrency, timeouts, and hostile connections, which must be
   refused with a log line while a job using the same store carries on. Real sockets on 127.0.0.1. */
#define DDP_IMPLEMENTATION
#include "ddp.h"
#include "harness.h"

#include <ifaddrs.h>
#include <sys/resource.h>

/* A server on a free port, with a short timeout so that failures show quickly. */
static ddp_store* server(double timeout, const char* token) {
    ddp_store_desc d;
    ddp_store* s = NULL;
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1";
    d.port = -1;
    d.is_server = 1;
    d.timeout_s = timeout;
    d.token = token;
    CHECK_OK(ddp__store_create(&d, &s));
    return s;
}

static ddp_store* client(int port, double timeout, const char* token) {
    ddp_store_desc d;
    ddp_store* s = NULL;
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1";
    d.port = port;
    d.timeout_s = timeout;
    d.token = token;
    CHECK_OK(ddp__store_create(&d, &s));
    return s;
}

/* Log lines the library printed, so a test can assert which refusal fired. */
static char g_log[64][512];
static int g_nlog;
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static void capture(ddp_log_level level, const char* line, void* user) {
    (void)level, (void)user;
    pthread_mutex_lock(&g_log_lock);
    if (g_nlog < 64) snprintf(g_log[g_nlog++], sizeof g_log[0], "%s", line);
    pthread_mutex_unlock(&g_log_lock);
}
static int logged(const char* needle) {
    int i, found = 0;
    pthread_mutex_lock(&g_log_lock);
    for (i = 0; i < g_nlog; i++) found |= strstr(g_log[i], needle) != NULL;
    pthread_mutex_unlock(&g_log_lock);
    return found;
}
/* Wait up to `s` seconds for a log line containing needle. */
static int await_log(const char* needle, double s) {
    double end = ddp__now() + s;
    while (ddp__now() < end) {
        if (logged(needle)) return 1;
        ddp__sleep(0.01);
    }
    return logged(needle);
}

static void set_get_add_wait(void) {
    ddp_store* s = server(5, "tok");
    char buf[64] = {0};
    size_t n = 0;
    int64_t v = 0;
    const char* keys[2] = {"a", "counter"};
    if (!s) return;
    CHECK(ddp__store_port(s) > 0);
    CHECK_OK(ddp_store_set(s, "a", "hello", 5));
    CHECK_OK(ddp_store_get(s, "a", buf, sizeof buf, &n));
    CHECK(n == 5 && memcmp(buf, "hello", 5) == 0);
    CHECK_OK(ddp_store_set(s, "a", "bye", 3)); /* replacing */
    CHECK_OK(ddp_store_get(s, "a", buf, 2, &n));
    CHECK(n == 3 && memcmp(buf, "by", 2) == 0); /* copies what fits, reports the full size */
    CHECK_OK(ddp_store_set(s, "empty", "", 0));
    CHECK_OK(ddp_store_get(s, "empty", buf, sizeof buf, &n));
    CHECK(n == 0);
    CHECK_OK(ddp__store_add(s, "counter", 5, &v));
    CHECK(v == 5);
    CHECK_OK(ddp__store_add(s, "counter", -7, &v));
    CHECK(v == -2);
    CHECK_OK(ddp_store_get(s, "counter", buf, sizeof buf, &n)); /* kept as text, as TCPStore */
    CHECK(n == 2 && memcmp(buf, "-2", 2) == 0);
    CHECK_OK(ddp__store_wait(s, keys, 2, 1.0));
    {
        static char big[DDP_STORE_MAX_VALUE + 1];
        CHECK_FAILS(ddp_store_set(s, "big", big, sizeof big), DDP_ERR_INVALID_ARGUMENT, "over the limit");
        memset(big, 'k', DDP_STORE_MAX_KEY + 1);
        big[DDP_STORE_MAX_KEY + 1] = 0;
        CHECK_FAILS(ddp_store_set(s, big, "x", 1), DDP_ERR_INVALID_ARGUMENT, "over the limit");
        big[DDP_STORE_MAX_KEY + 1] = 'k';
    }
    ddp__store_destroy(s);
}

static void get_and_wait_time_out(void) {
    ddp_store* s = server(0.5, "tok");
    const char* keys[2] = {"present", "never"};
    double t0;
    char buf[8];
    size_t n;
    if (!s) return;
    CHECK_OK(ddp_store_set(s, "present", "1", 1));
    t0 = ddp__now();
    CHECK_FAILS(ddp_store_get(s, "never", buf, sizeof buf, &n), DDP_ERR_TIMEOUT, "\"never\"");
    CHECKF(ddp__now() - t0 < 3.0, "get took %.2f s with a 0.5 s timeout", ddp__now() - t0);
    t0 = ddp__now();
    CHECK_FAILS(ddp__store_wait(s, keys, 2, 0.3), DDP_ERR_TIMEOUT, "\"never\" never appeared");
    CHECKF(ddp__now() - t0 < 3.0, "wait took %.2f s with a 0.3 s timeout", ddp__now() - t0);
    CHECK_OK(ddp_store_set(s, "after", "ok", 2)); /* the connection still works after a timeout */
    ddp__store_destroy(s);
}

typedef struct { int port, id, iters; int ok; } worker_arg;

static void* adder(void* p) {
    worker_arg* a = (worker_arg*)p;
    ddp_store* c = client(a->port, 10, "tok");
    char key[32], got[32];
    size_t n;
    int i;
    if (!c) return NULL;
    a->ok = 1;
    for (i = 0; i < a->iters; i++) {
        int64_t v;
        if (ddp__store_add(c, "shared", 1, &v) != DDP_OK) a->ok = 0;
    }
    snprintf(key, sizeof key, "done/%d", a->id);
    if (ddp_store_set(c, key, key, strlen(key)) != DDP_OK) a->ok = 0;
    if (ddp__store_barrier(c, "workers", 8) != DDP_OK) a->ok = 0;
    /* every worker's key exists once the barrier is passed */
    for (i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "done/%d", i);
        if (ddp_store_get(c, key, got, sizeof got, &n) != DDP_OK || n != strlen(key)) a->ok = 0;
    }
    ddp__store_destroy(c);
    return NULL;
}

static void concurrent_clients(void) {
    ddp_store* s = server(10, "tok");
    pthread_t th[8];
    worker_arg args[8];
    int i;
    int64_t v = 0;
    if (!s) return;
    for (i = 0; i < 8; i++) {
        args[i].port = ddp__store_port(s), args[i].id = i, args[i].iters = 200, args[i].ok = 0;
        pthread_create(&th[i], NULL, adder, &args[i]);
    }
    for (i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        CHECKF(args[i].ok, "worker %d failed: %s", i, ddp_error_string());
    }
    CHECK_OK(ddp__store_add(s, "shared", 0, &v));
    CHECK(v == 8 * 200); /* add is atomic */
    ddp__store_destroy(s);
}

static void* late_setter(void* p) {
    ddp_store* c = client(*(int*)p, 5, "tok");
    if (!c) return NULL;
    ddp__sleep(0.3);
    CHECK_OK(ddp_store_set(c, "late", "here", 4));
    ddp__store_destroy(c);
    return NULL;
}

static void get_blocks_until_set(void) {
    ddp_store* s = server(5, "tok");
    pthread_t th;
    int port;
    char buf[8] = {0};
    size_t n = 0;
    double t0 = ddp__now();
    if (!s) return;
    port = ddp__store_port(s);
    pthread_create(&th, NULL, late_setter, &port);
    CHECK_OK(ddp_store_get(s, "late", buf, sizeof buf, &n));
    CHECK(n == 4 && memcmp(buf, "here", 4) == 0);
    CHECKF(ddp__now() - t0 >= 0.25, "get returned after %.2f s, before the key was set", ddp__now() - t0);
    pthread_join(th, NULL);
    ddp__store_destroy(s);
}

static void port_in_use_and_unreachable(void) {
    ddp_store* s = server(5, "tok");
    ddp_store_desc d;
    ddp_store* t = NULL;
    double t0;
    int port;
    if (!s) return;
    port = ddp__store_port(s);
    memset(&d, 0, sizeof d);
    d.port = port, d.is_server = 1, d.timeout_s = 1;
    CHECK_FAILS(ddp__store_create(&d, &t), DDP_ERR_PORT_IN_USE, "already in use");
    ddp__store_destroy(s);
    /* nobody listens there now: the client retries until its deadline, then says so */
    d.is_server = 0, d.host = "127.0.0.1", d.timeout_s = 0.6;
    t0 = ddp__now();
    CHECK_FAILS(ddp__store_create(&d, &t), DDP_ERR_STORE_UNREACHABLE, "Is rank 0 running");
    CHECKF(ddp__now() - t0 >= 0.5 && ddp__now() - t0 < 3.0, "gave up after %.2f s, timeout 0.6 s", ddp__now() - t0);
    CHECK(t == NULL);
}

static void wrong_token_refused(void) {
    ddp_store* s;
    ddp_store_desc d;
    ddp_store* t = NULL;
    g_nlog = 0;
    ddp__set_log(capture, NULL);
    s = server(5, "right");
    if (!s) { ddp__set_log(NULL, NULL); return; }
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1", d.port = ddp__store_port(s), d.timeout_s = 2, d.token = "wrong";
    CHECK_FAILS(ddp__store_create(&d, &t), DDP_ERR_STORE_REFUSED, "DDP_JOB_TOKEN");
    CHECK(await_log("wrong job token", 2.0));
    ddp__store_destroy(s);
    ddp__set_log(NULL, NULL);
}

/* A raw TCP connection to the store, for sending what no real client would. */
static int raw(int port) {
    int fd = ddp__sock_connect("127.0.0.1", port, ddp__now() + 2);
    CHECK(fd >= 0);
    return fd;
}
static void header(unsigned char* h, uint32_t magic, int version, int op, uint32_t klen, uint32_t vlen) {
    ddp__put_le32(h, magic);
    h[4] = (unsigned char)version, h[5] = 0, h[6] = (unsigned char)op, h[7] = 0;
    ddp__put_le32(h + 8, klen);
    ddp__put_le32(h + 12, vlen);
    ddp__put_le32(h + 16, 1000);
}
/* 1 when the server closed the connection within `s` seconds. */
static int closed_by_server(int fd, double s) {
    double end = ddp__now() + s;
    char b[64];
    while (ddp__now() < end) {
        ssize_t k = recv(fd, b, sizeof b, 0);
        if (k == 0) return 1;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
        ddp__sleep(0.01);
    }
    return 0;
}

typedef struct { int port, stop, rounds, ok; } job_arg; /* stop, rounds: __atomic, both threads use them */
/* A well-behaved rank using the store throughout the hostile test. */
static void* job(void* p) {
    job_arg* a = (job_arg*)p;
    ddp_store* c = client(a->port, 5, "tok");
    a->ok = c != NULL;
    while (c && !__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        int64_t v;
        char buf[16];
        size_t n;
        if (ddp__store_add(c, "job/steps", 1, &v) != DDP_OK || ddp_store_set(c, "job/last", "x", 1) != DDP_OK ||
            ddp_store_get(c, "job/last", buf, sizeof buf, &n) != DDP_OK)
            a->ok = 0;
        __atomic_fetch_add(&a->rounds, 1, __ATOMIC_RELAXED);
        ddp__sleep(0.002);
    }
    ddp__store_destroy(c);
    return NULL;
}

static void hostile_connections_refused(void) {
    ddp_store* s;
    pthread_t th;
    job_arg ja;
    unsigned char h[20];
    int port, fd_garbage, fd_huge, fd_version, fd_silent, fd_half, fd_early, rounds_before;
    g_nlog = 0;
    ddp__set_log(capture, NULL);
    s = server(1.0, "tok"); /* 1 s: silent and half-sent connections are dropped after 1 s */
    if (!s) { ddp__set_log(NULL, NULL); return; }
    port = ddp__store_port(s);
    memset(&ja, 0, sizeof ja);
    ja.port = port;
    pthread_create(&th, NULL, job, &ja);
    /* garbage: not this protocol at all */
    fd_garbage = raw(port);
    CHECK(send(fd_garbage, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, 0) == 27);
    /* a header announcing a gigabyte: refused before any body is read */
    fd_huge = raw(port);
    header(h, DDP__STORE_MAGIC, 1, DDP__OP_HELLO, 0, 1u << 30);
    CHECK(send(fd_huge, h, 20, 0) == 20);
    /* another protocol version */
    fd_version = raw(port);
    header(h, DDP__STORE_MAGIC, 9, DDP__OP_HELLO, 0, 3);
    CHECK(send(fd_version, h, 20, 0) == 20 && send(fd_version, "tok", 3, 0) == 3);
    /* a request before HELLO */
    fd_early = raw(port);
    header(h, DDP__STORE_MAGIC, 1, DDP__OP_SET, 1, 1);
    CHECK(send(fd_early, h, 20, 0) == 20 && send(fd_early, "kv", 2, 0) == 2);
    /* connects and says nothing; sends half a header and stops */
    fd_silent = raw(port);
    fd_half = raw(port);
    header(h, DDP__STORE_MAGIC, 1, DDP__OP_HELLO, 0, 3);
    CHECK(send(fd_half, h, 11, 0) == 11);
    CHECK(closed_by_server(fd_garbage, 2.0));
    CHECK(closed_by_server(fd_huge, 2.0));
    CHECK(closed_by_server(fd_version, 2.0));
    CHECK(closed_by_server(fd_early, 2.0));
    CHECK(await_log("bad magic", 1.0));
    CHECK(await_log("over the limits", 1.0));
    CHECK(await_log("protocol version 9", 1.0));
    CHECK(await_log("before HELLO", 1.0));
    /* the job keeps going while silent and half-sent connections are open */
    rounds_before = __atomic_load_n(&ja.rounds, __ATOMIC_RELAXED);
    ddp__sleep(0.3);
    rounds_before = __atomic_load_n(&ja.rounds, __ATOMIC_RELAXED) - rounds_before;
    CHECKF(rounds_before > 10, "the job made %d store rounds in 0.3 s beside hostile connections", rounds_before);
    CHECK(closed_by_server(fd_silent, 3.5));
    CHECK(closed_by_server(fd_half, 3.5));
    CHECK(await_log("no valid HELLO", 1.0));
    __atomic_store_n(&ja.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECKF(ja.ok && ja.rounds > 50, "the job using the store failed (ok %d, %d rounds)", ja.ok, ja.rounds);
    close(fd_garbage), close(fd_huge), close(fd_version), close(fd_early), close(fd_silent), close(fd_half);
    ddp__store_destroy(s);
    ddp__set_log(NULL, NULL);
}

static void client_sees_server_death(void) {
    ddp_store* s = server(5, "tok");
    ddp_store* c;
    char buf[8];
    size_t n;
    if (!s) return;
    c = client(ddp__store_port(s), 2, "tok");
    if (!c) { ddp__store_destroy(s); return; }
    ddp__store_destroy(s); /* the hosting process goes away */
    CHECK_FAILS(ddp_store_get(c, "x", buf, sizeof buf, &n), DDP_ERR_STORE_LOST, "rank 0");
    ddp__store_destroy(c);
}

/* ---- where the server listens ----------------------------------------------------------------------- */

/* This machine's first IPv4 address that is not a loopback one, into buf; 0 if it has none. */
static int outside_address(char* buf, size_t n) {
    struct ifaddrs *all, *a;
    int found = 0;
    if (getifaddrs(&all) != 0) return 0;
    for (a = all; a && !found; a = a->ifa_next) {
        const struct sockaddr_in* in = (const struct sockaddr_in*)a->ifa_addr;
        if (!in || in->sin_family != AF_INET || (ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
        found = inet_ntop(AF_INET, &in->sin_addr, buf, (socklen_t)n) != NULL;
    }
    freeifaddrs(all);
    return found;
}

/* A store whose clients reach it at 127.0.0.1 (ddprun --standalone, ddp_spawn: every rank on this
   machine) listens on the loopback interface only: another machine cannot even connect. One whose
   clients use this machine's outside address still accepts there. */
static void loopback_store_listens_on_loopback_only(void) {
    char addr[64];
    ddp_store *s, *t = NULL;
    ddp_store_desc d;
    int fd;
    if (!outside_address(addr, sizeof addr)) SKIP("this machine has no IPv4 address besides loopback");
    s = server(5, "tok");
    if (!s) return;
    fd = ddp__sock_connect(addr, ddp__store_port(s), ddp__now() + 2);
    CHECKF(fd < 0, "a store for 127.0.0.1 accepted a connection at %s:%d", addr, ddp__store_port(s));
    if (fd >= 0) close(fd);
    ddp__store_destroy(s);
    memset(&d, 0, sizeof d);
    d.host = addr, d.port = -1, d.is_server = 1, d.timeout_s = 5, d.token = "tok";
    CHECK_OK(ddp__store_create(&d, &t)); /* its own client connects at addr */
    if (t) {
        fd = ddp__sock_connect("127.0.0.1", ddp__store_port(t), ddp__now() + 2);
        CHECKF(fd >= 0, "a store for %s refused a connection at 127.0.0.1", addr);
        if (fd >= 0) close(fd);
        ddp__store_destroy(t);
    }
}

/* ---- the fd limit: strangers use up the server process's descriptors ------------------------------ */

/* Lines captured so far that contain needle. */
static int count_logged(const char* needle) {
    int i, n = 0;
    pthread_mutex_lock(&g_log_lock);
    for (i = 0; i < g_nlog; i++) n += strstr(g_log[i], needle) != NULL;
    pthread_mutex_unlock(&g_log_lock);
    return n;
}

/* The server's side, in a child process whose descriptor limit is 48: a store, a job's client,
   and whatever the strangers (the parent) open. Returns 0, or the number of the first check that
   failed (printed too). */
static int fd_limit_server(int to_parent, int from_parent) {
    struct rlimit rl;
    ddp_store *s, *c, *late = NULL;
    ddp_store_desc d;
    int port, i, attempts = -1;
    char b = 0;
    double t0, t1;
    const char* line = NULL;
    g_nlog = 0;
    ddp__set_log(capture, NULL);
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = 48;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return printf("    setrlimit failed\n"), 1;
    s = server(5.0, "tok");
    c = s ? client(ddp__store_port(s), 5, "tok") : NULL;
    if (!c) return printf("    no store: %s\n", ddp_error_string()), 2;
    port = ddp__store_port(s);
    if (write(to_parent, &port, sizeof port) != (ssize_t)sizeof port) return 3;
    if (read(from_parent, &b, 1) != 1) return 4; /* the strangers are connected */
    /* the store is at the limit now; for a second, the job keeps using its connection */
    t0 = ddp__now();
    for (i = 0; i < 20; i++) {
        char v[8];
        size_t n = 0;
        if (ddp_store_set(c, "k", "v", 1) != DDP_OK || ddp_store_get(c, "k", v, sizeof v, &n) != DDP_OK || n != 1)
            return printf("    the job's store call %d failed at the fd limit: %s\n", i, ddp_error_string()), 5;
        ddp__sleep(0.05);
    }
    if (count_logged("open files") != 1)
        return printf("    %d log lines about the descriptor limit, want exactly 1\n", count_logged("open files")), 6;
    if (write(to_parent, &b, 1) != 1) return 7; /* the strangers may go */
    /* with their connections closed the store accepts again: a new client gets in */
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1", d.port = port, d.timeout_s = 5, d.token = "tok";
    if (ddp__store_create(&d, &late) != DDP_OK) return printf("    no new client after the strangers left: %s\n", ddp_error_string()), 8;
    t1 = ddp__now();
    pthread_mutex_lock(&g_log_lock);
    for (i = 0; i < g_nlog && !line; i++) /* the first: the episode the strangers caused */
        if (strstr(g_log[i], "accepting connections again")) line = g_log[i];
    if (line && strstr(line, "accept failed ")) attempts = atoi(strstr(line, "accept failed ") + 14);
    pthread_mutex_unlock(&g_log_lock);
    /* a store that backs off tries about every 0.1 s; one that spins tries thousands of times a second */
    if (attempts < 1 || attempts > 20 * (t1 - t0) + 5)
        return printf("    accept failed %d times over %.1f s at the limit (want 1..%.0f; -1: no recovery line)\n",
                      attempts, t1 - t0, 20 * (t1 - t0) + 5), 9;
    ddp__store_destroy(late);
    ddp__store_destroy(c);
    ddp__store_destroy(s);
    return 0;
}

/* A rank that keeps knocking at a busy store, from a thread: its status. */
static void* knock_until_in(void* arg) {
    ddp_store_desc d;
    ddp_store* c = NULL;
    static ddp_status r;
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1", d.port = *(int*)arg, d.timeout_s = 20, d.token = "tok";
    r = ddp__store_create(&d, &c);
    if (r != DDP_OK) printf("    the rank that kept knocking: %s\n", ddp_error_string());
    ddp__store_destroy(c);
    return &r;
}

/* 100 connections from strangers (another process) against a store whose process may hold 48
   descriptors: it must back off and log once instead of retrying accept in a busy loop, keep
   serving the connection it has, and accept again once descriptors are free. A rank that comes
   meanwhile is told the store is busy and why (not that some other program holds the port), and
   keeps trying until its deadline. */
static void fd_limit_backs_off(void) {
    int up[2], down[2], fds[100], i, port = 0, st = 0, opened = 0;
    char b = 1;
    pid_t pid;
    pthread_t knocker;
    void* knocked = NULL;
    ddp_store_desc d;
    ddp_store* late = NULL;
    ddp_status r;
    CHECK(pipe(up) == 0 && pipe(down) == 0);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        int r;
        close(up[0]), close(down[1]);
        r = fd_limit_server(up[1], down[0]);
        fflush(stdout);
        _exit(r);
    }
    close(up[1]), close(down[0]); /* so that a read sees the child's end */
    CHECK(read(up[0], &port, sizeof port) == (ssize_t)sizeof port);
    for (i = 0; i < 100 && port > 0; i++) {
        fds[i] = ddp__sock_connect("127.0.0.1", port, ddp__now() + 2); /* the kernel's backlog completes them */
        opened += fds[i] >= 0;
    }
    CHECKF(opened == 100, "only %d of 100 stranger connections opened", opened);
    CHECK(write(down[1], &b, 1) == 1);
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1", d.port = port, d.timeout_s = 2, d.token = "tok";
    r = ddp__store_create(&d, &late);
    CHECKF(r == DDP_ERR_STORE_UNREACHABLE && strstr(ddp_error_string(), "it is busy: the store's process is out of "
                                                    "file descriptors (ulimit -n 48)"),
           "a rank that came at the limit got %s: %s", ddp_status_name(r), ddp_error_string());
    ddp__store_destroy(late);
    CHECK(pthread_create(&knocker, NULL, knock_until_in, &port) == 0);
    CHECK(read(up[0], &b, 1) == 1 || 1); /* the child's window is over (or it failed) */
    ddp__sleep(0.5);                     /* the knocker is turned away meanwhile */
    for (i = 0; i < 100; i++)
        if (i < opened && fds[i] >= 0) close(fds[i]);
    CHECK(pthread_join(knocker, &knocked) == 0);
    CHECKF(knocked && *(ddp_status*)knocked == DDP_OK, "the rank that kept knocking did not get in after the "
           "strangers left");
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server's process failed check %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    close(up[0]), close(down[1]);
}

int main(void) {
    RUN(set_get_add_wait);
    RUN(get_and_wait_time_out);
    RUN(concurrent_clients);
    RUN(get_blocks_until_set);
    RUN(port_in_use_and_unreachable);
    RUN(wrong_token_refused);
    RUN(hostile_connections_refused);
    RUN(client_sees_server_death);
    RUN(fd_limit_backs_off);
    RUN(loopback_store_listens_on_loopback_only);
    return H_EXIT();
}
