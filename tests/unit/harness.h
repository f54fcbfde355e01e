/* tests/unit/harness.h: the project's small test harness.

   A test program is a list of cases, each a plain function run with RUN(fn). Every case prints
   exactly one line, which tests/run.sh counts:
       ok   name
       FAIL name          (after one indented line per failed check: file:line and what differed)
       skip name: reason  (the case cannot run here, e.g. no GPU; never counted as passed)
   The program exits 1 if any case failed. Include it after ddp.h. */
#ifndef DDP_TEST_HARNESS_H
#define DDP_TEST_HARNESS_H

#include <dirent.h> /* h_remove_tree */
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h> /* h_gpus_in_child */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* H_TSAN: built with ThreadSanitizer (make tsan). There the sweeps keep what changes the threads'
   interleavings (world sizes, buckets, stages) and one optimizer kind, which is each rank's own
   arithmetic, as on the GPU stand-in: make tsan's minutes go to the threads. */
#if defined(__SANITIZE_THREAD__)
#define H_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define H_TSAN 1
#endif
#endif
#ifndef H_TSAN
#define H_TSAN 0
#endif

static int h_pass, h_fail, h_skip;
static int h_case_failed, h_case_skipped;
static char h_skip_reason[512];

static void h_failf(const char* file, int line, const char* fmt, ...) {
    va_list ap;
    printf("    %s:%d: ", file, line);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    h_case_failed = 1;
}

/* A check that fails records the failure and lets the case go on, so one run shows them all. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) h_failf(__FILE__, __LINE__, "check failed: %s", #cond);                       \
    } while (0)
#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) h_failf(__FILE__, __LINE__, __VA_ARGS__);                                     \
    } while (0)
/* The call must return DDP_OK; otherwise show its status and message. */
#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        ddp_status h_s_ = (call);                                                                  \
        if (h_s_ != DDP_OK)                                                                        \
            h_failf(__FILE__, __LINE__, "%s returned %s: %s", #call, ddp_status_name(h_s_),        \
                    ddp_error_string());                                                           \
    } while (0)
/* The call must fail with `want`, and its message must contain `needle` (NULL: any message). */
#define CHECK_FAILS(call, want, needle)                                                            \
    do {                                                                                           \
        ddp_status h_s_;                                                                           \
        const char* h_n_ = (needle);                                                               \
        ddp__clear_error();                                                                        \
        h_s_ = (call);                                                                             \
        if (h_s_ != (want))                                                                        \
            h_failf(__FILE__, __LINE__, "%s returned %s, expected %s (message: %s)", #call,       \
                    ddp_status_name(h_s_), ddp_status_name(want), ddp_error_string());             \
        else if (h_n_ && !strstr(ddp_error_string(), h_n_))                                        \
            h_failf(__FILE__, __LINE__, "%s: message \"%s\" lacks \"%s\"", #call,                  \
                    ddp_error_string(), h_n_);                                                     \
    } while (0)
/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, rtol, atol)                                                              \
    do {                                                                                           \
        double h_a_ = (double)(a), h_b_ = (double)(b);                                             \
        if (!(fabs(h_a_ - h_b_) <= (atol) + (rtol) * fabs(h_b_)))                                  \
            h_failf(__FILE__, __LINE__, "%s = %.9g, expected %s = %.9g (rtol %g, atol %g)", #a,    \
                    h_a_, #b, h_b_, (double)(rtol), (double)(atol));                               \
    } while (0)
/* End the current case as skipped, with the reason printed. */
#define SKIP(...)                                                                                  \
    do {                                                                                           \
        snprintf(h_skip_reason, sizeof h_skip_reason, __VA_ARGS__);                                \
        h_case_skipped = 1;                                                                        \
        return;                                                                                    \
    } while (0)

/* n floats to a file, and back: how a rank hands its numbers to the test's parent process. The
   load returns how many it read (0: no file). */
static inline void h_save_floats(const char* path, const float* v, size_t n) {
    FILE* f = fopen(path, "wb");
    if (f) fwrite(v, 4, n, f), fclose(f);
}
static inline size_t h_load_floats(const char* path, float* out, size_t cap) {
    FILE* f = fopen(path, "rb");
    size_t n;
    if (!f) return 0;
    n = fread(out, 4, cap, f);
    fclose(f);
    return n;
}

/* Remove a temporary folder and everything in it (tests make theirs with mkdtemp). */
static inline void h_remove_tree(const char* dir) {
    DIR* d = opendir(dir);
    struct dirent* e;
    char p[1024];
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (unlink(p) != 0) h_remove_tree(p);
    }
    closedir(d);
    rmdir(dir);
}

/* How many GPUs this machine shows, and why none (into why), asked in a throwaway child so that
   the calling process stays free of CUDA: a process that forks after using CUDA leaves its
   children unable to use it, and the tests fork their ranks. (Only after ddp.h.) */
#if defined(DDP_H_INCLUDED)
static inline int h_gpus_in_child(char* why, size_t whylen) {
    int p[2], st, gpus = 0;
    char msg[400] = "";
    ssize_t k;
    pid_t pid;
    if (why && whylen) why[0] = 0;
    if (pipe(p) != 0) return 0;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        snprintf(msg, sizeof msg, "%d %s", ddp__cuda_device_count(), ddp__cuda_unavailable_reason());
        if (write(p[1], msg, strlen(msg) + 1) < 0) _exit(1);
        _exit(0);
    }
    close(p[1]);
    k = read(p[0], msg, sizeof msg - 1);
    if (k > 0) {
        msg[k] = 0;
        gpus = atoi(msg);
        if (why && whylen) snprintf(why, whylen, "%s", strchr(msg, ' ') ? strchr(msg, ' ') + 1 : "");
    }
    close(p[0]);
    waitpid(pid, &st, 0);
    return gpus;
}
#endif

/* H_ONLY=name runs that case alone (while working on it; make test unsets it). */
static void h_run(const char* name, void (*fn)(void)) {
    const char* only = getenv("H_ONLY");
    if (only && *only && strcmp(only, name) != 0) return;
    h_case_failed = h_case_skipped = 0;
    fflush(stdout);
    fn();
    if (h_case_failed) {
        printf("FAIL %s\n", name);
        h_fail++;
    } else if (h_case_skipped) {
        printf("skip %s: %s\n", name, h_skip_reason);
        h_skip++;
    } else {
        printf("ok   %s\n", name);
        h_pass++;
    }
    fflush(stdout);
}
#define RUN(fn) h_run(#fn, fn)
/* Return this from main. */
#define H_EXIT() (h_fail ? 1 : 0)

#endif
