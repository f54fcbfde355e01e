/* labs/lab_test.h: the test harness every lab's test.c uses.

   Each test case runs in a child process of its own, so a crash, an exit() or an endless loop in
   the student's code ends that case only, and the next one still runs. A case prints exactly one
   line, then its details indented by four spaces:
       ok   name
       FAIL name          (each failed expectation: what was expected, what came out)
       skip name: reason  (the case cannot run on this machine; never counted as passed)
   The program ends with "N passed, N failed, N skipped" and exits 1 if any case failed.
   Run one case, or every case whose name contains a word:   build/labs/ring-starter ranks

   Include this header first in a test.c (before ddp.h and any system header): it asks for the
   POSIX declarations (fork, pipes, sockets, mkdtemp) that strict C99 hides. */
#ifndef LAB_TEST_H
#define LAB_TEST_H

#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_XOPEN_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#if !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE 1 /* glibc: MAP_ANONYMOUS next to POSIX */
#endif
#if defined(__APPLE__) && !defined(_DARWIN_C_SOURCE)
#define _DARWIN_C_SOURCE 1 /* macOS: with _POSIX_C_SOURCE alone it hides MAP_ANONYMOUS and mkdtemp */
#endif

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int lab_failed_checks;      /* in the case's child: expectations that failed */
static int lab_pass, lab_fail, lab_skip;
static const char* lab_filter;

/* An expectation that did not hold: one indented line, and the case goes on so that one run
   shows every problem. Use through EXPECT. */
static inline void lab_failf(const char* fmt, ...) {
    va_list ap;
    printf("    ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    lab_failed_checks++;
}
/* EXPECT(condition, "what was expected, and what came out", ...) */
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) lab_failf(__VA_ARGS__);                                                       \
    } while (0)
/* An informational line under the case (printed for passing cases too). */
static inline void lab_note(const char* fmt, ...) {
    va_list ap;
    printf("    ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}
/* End the case as "could not run here", with the reason. Use in the case's function:
   LAB_SKIP("no TCP on 127.0.0.1: %s", strerror(errno)); */
#define LAB_SKIP_STATUS 77
#define LAB_SKIP(...)                                                                              \
    do {                                                                                           \
        printf("@skip ");                                                                          \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
        _exit(LAB_SKIP_STATUS);                                                                    \
    } while (0)

/* Memory the case's child and the processes it forks all see (MAP_SHARED), zeroed; NULL if the
   system refuses. Never freed: the case's process ends soon. */
static inline void* lab_shared(size_t bytes) {
    void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Skip the case unless a TCP connection to 127.0.0.1 works: ddp.h's CPU backend needs one. */
static inline void lab_need_loopback(void) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int srv = socket(AF_INET, SOCK_STREAM, 0), cli = socket(AF_INET, SOCK_STREAM, 0), ok;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000001); /* 127.0.0.1, any port */
    ok = srv >= 0 && cli >= 0 && bind(srv, (struct sockaddr*)&a, sizeof a) == 0 && listen(srv, 1) == 0 &&
         getsockname(srv, (struct sockaddr*)&a, &len) == 0 && connect(cli, (struct sockaddr*)&a, sizeof a) == 0;
    if (!ok) {
        int e = errno;
        if (srv >= 0) close(srv);
        if (cli >= 0) close(cli);
        LAB_SKIP("ddp.h's CPU backend needs TCP connections on 127.0.0.1, and this machine refuses them (%s)",
                 strerror(e));
    }
    close(srv);
    close(cli);
}

/* The seed of the randomized cases: LAB_SEED from the environment, else 1. Every seed must
   pass: LAB_SEED=7 make lab-NAME tries another. */
static inline uint64_t lab_seed(void) {
    const char* v = getenv("LAB_SEED");
    return v && *v ? (uint64_t)strtoull(v, NULL, 10) : 1;
}
/* A small random generator (splitmix64): the same numbers on every machine for one seed. */
typedef struct lab_rng {
    uint64_t s;
} lab_rng;
static inline uint64_t lab_rng_next(lab_rng* g) {
    uint64_t z = (g->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Seed g for one case: `stream` keeps the cases of one seed apart. */
static inline void lab_rng_seed(lab_rng* g, uint64_t seed, uint64_t stream) {
    g->s = seed * 0x2545F4914F6CDD1Dull + stream;
    lab_rng_next(g);
}
/* 0 .. n-1 (n >= 1) */
static inline size_t lab_rng_below(lab_rng* g, size_t n) { return (size_t)(lab_rng_next(g) % (uint64_t)n); }
/* [0, 1) */
static inline double lab_rng_uniform(lab_rng* g) { return (double)(lab_rng_next(g) >> 11) * (1.0 / 9007199254740992.0); }

static inline double lab_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* "240 40 320" for a list of sizes, for a message (" ..." when it does not fit). One buffer: use
   it once per printf. */
static inline const char* lab_fmt_sizes(const size_t* v, int n) {
    static char b[1024];
    size_t pos = 0;
    int i;
    b[0] = 0;
    for (i = 0; i < n && pos < sizeof b - 32; i++) pos += (size_t)snprintf(b + pos, sizeof b - pos, "%s%zu", i ? " " : "", v[i]);
    if (i < n) snprintf(b + pos, sizeof b - pos, " ...");
    return b;
}

/* Print what the child wrote, every line indented; the harness's own "@" lines left out. */
static inline void lab_print_output(const char* out) {
    const char* p = out;
    while (*p) {
        const char* e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 0 && p[0] != '@') {
            if (strncmp(p, "    ", 4) != 0) printf("    ");
            fwrite(p, 1, len, stdout);
            printf("\n");
        }
        p += len + (e != NULL);
    }
}

/* The line of out that starts with `marker`, or NULL. */
static inline const char* lab_marker(const char* out, const char* marker) {
    const char* s = strstr(out, marker);
    while (s && s != out && s[-1] != '\n') s = strstr(s + 1, marker);
    return s;
}

/* For a case's deadline message: what it had done (the last call wins), and what "too slow"
   means for it. Both are lines of the case's output that the student does not see otherwise. */
static inline void lab_progress(const char* fmt, ...) {
    va_list ap;
    printf("@progress ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}
static inline void lab_slow_hint(const char* text) {
    printf("@slow %s\n", text);
    fflush(stdout);
}
/* The text after the last line that starts with marker, up to its end, into buf ("" if none). */
static inline const char* lab_last_marker(const char* out, const char* marker, char* buf, size_t cap) {
    const char *s = lab_marker(out, marker), *last = NULL;
    while (s) last = s, s = lab_marker(s + 1, marker);
    buf[0] = 0;
    if (last) {
        const char* e = strchr(last, '\n');
        size_t m = strlen(marker), n = e ? (size_t)(e - last) - m : strlen(last) - m;
        snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), last + m);
    }
    return buf;
}

/* Run fn in a child process with a deadline of timeout_s seconds and print its line. */
static inline void lab_run(const char* name, void (*fn)(void), double timeout_s) {
    int fds[2], status = 0, timed_out = 0;
    pid_t pid;
    char* out;
    size_t len = 0, cap = 4096;
    double deadline;
    const char* skip_line;
    if (lab_filter && !strstr(name, lab_filter)) return;
    out = (char*)malloc(cap);
    fflush(stdout);
    if (!out || pipe(fds) != 0) {
        printf("skip %s: the harness cannot make a pipe: %s\n", name, strerror(errno));
        lab_skip++;
        free(out);
        return;
    }
    pid = fork();
    if (pid < 0) {
        printf("skip %s: the harness cannot fork: %s\n", name, strerror(errno));
        lab_skip++;
        close(fds[0]), close(fds[1]);
        free(out);
        return;
    }
    if (pid == 0) {
        setpgid(0, 0); /* the case and every process it forks: one group, stopped together */
        close(fds[0]);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[1]);
        lab_failed_checks = 0;
        fn();
        printf("@end\n"); /* the checks ran to the end: no crash, no exit() on the way */
        fflush(NULL);
        _exit(lab_failed_checks ? 1 : 0);
    }
    setpgid(pid, pid);
    close(fds[1]);
    deadline = lab_now() + timeout_s;
    for (;;) { /* read until every writer has closed the pipe, or the deadline */
        struct pollfd pf;
        double left = deadline - lab_now();
        int r;
        ssize_t n;
        if (left <= 0) {
            if (!timed_out) {
                timed_out = 1;
                kill(-pid, SIGKILL);
                deadline = lab_now() + 2; /* a moment for what is left in the pipe */
                continue;
            }
            break;
        }
        pf.fd = fds[0], pf.events = POLLIN, pf.revents = 0;
        r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        if (len + 1024 >= cap) {
            char* more = (char*)realloc(out, cap * 2);
            if (!more) break;
            out = more, cap *= 2;
        }
        n = read(fds[0], out + len, cap - len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fds[0]);
    out[len] = 0;
    if (timed_out) kill(-pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    skip_line = lab_marker(out, "@skip ");
    if (timed_out) {
        printf("FAIL %s\n", name);
        lab_print_output(out);
        char progress[256], slow[300];
        lab_last_marker(out, "@progress ", progress, sizeof progress);
        lab_last_marker(out, "@slow ", slow, sizeof slow);
        if (progress[0] || slow[0])
            printf("    did not finish within %.0f s and was stopped. %s%s%s%s\n", timeout_s,
                   progress[0] ? "By then: " : "Nothing it calls had returned yet. ", progress, progress[0] ? ". " : "",
                   slow[0] ? slow : "Too slow, or stuck?");
        else
            printf("    did not finish within %.0f s and was stopped: an endless loop, or a process waiting for a "
                   "message nobody sends?\n", timeout_s);
        lab_fail++;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == LAB_SKIP_STATUS && skip_line) {
        const char* e = strchr(skip_line, '\n');
        int n = e ? (int)(e - skip_line) - 6 : (int)strlen(skip_line) - 6;
        printf("skip %s: %.*s\n", name, n, skip_line + 6);
        lab_print_output(out);
        lab_skip++;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && lab_marker(out, "@end")) {
        printf("ok   %s\n", name);
        lab_print_output(out);
        lab_pass++;
    } else {
        printf("FAIL %s\n", name);
        lab_print_output(out);
        if (WIFSIGNALED(status))
            printf("    the test process was killed by signal %d (%s): a crash in the code under test? "
                   "(a bad pointer, an index out of bounds)\n", WTERMSIG(status), strsignal(WTERMSIG(status)));
        else if (!lab_marker(out, "@end"))
            printf("    the test process exited with status %d before its checks finished (exit() or DDP_CHECK "
                   "in the code under test?)\n", WEXITSTATUS(status));
        lab_fail++;
    }
    fflush(stdout);
    free(out);
}
#define LAB_CASE(fn, timeout_s) lab_run(#fn, fn, timeout_s)

/* Call first in main: argv[1], when given, runs only the cases whose name contains it. */
static inline void lab_begin(int argc, char** argv) {
    lab_filter = argc > 1 ? argv[1] : NULL;
    setvbuf(stdout, NULL, _IOLBF, 0); /* whole lines: nothing left in a buffer when a case forks */
    signal(SIGPIPE, SIG_IGN);
}
/* Return this from main: prints the totals. */
static int lab_end(void) {
    printf("%d passed, %d failed, %d skipped\n", lab_pass, lab_fail, lab_skip);
    if (lab_pass + lab_fail + lab_skip == 0 && lab_filter) printf("no case name contains \"%s\"\n", lab_filter);
    return lab_fail ? 1 : 0;
}

#endif
