/* fakegpu's CUDA runtime: devices, memory, streams, events, copies, errors, kernel libraries and
   launches. See fakegpu.h for what it promises. */
#define _GNU_SOURCE
#include "fakegpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---- settings and small helpers --------------------------------------------------------------- */

static fg_settings fg_set;
static pthread_once_t fg_set_once = PTHREAD_ONCE_INIT;

static double fg_env_num(const char* name, double dflt) {
    const char* v = getenv(name);
    char* end;
    double x;
    if (!v || !*v) return dflt;
    x = strtod(v, &end);
    if (*end) fg_fatal("%s=%s is not a number", name, v);
    return x;
}

static void fg_read_settings(void) {
    const char* nv = getenv("FAKEGPU_NVRTC_VERSION");
    const char* vis = getenv("CUDA_VISIBLE_DEVICES");
    int machine = (int)fg_env_num("FAKEGPU_DEVICES", 1), i;
    fg_set.nccl_delay_s = fg_env_num("FAKEGPU_NCCL_DELAY_MS", 0) * 1e-3;
    fg_set.nccl_report = (int)fg_env_num("FAKEGPU_NCCL_REPORT", 0) != 0;
    if (machine < 0 || machine > FG_MAX_DEV) fg_fatal("FAKEGPU_DEVICES=%d: 0 to %d", machine, FG_MAX_DEV);
    fg_set.ndev = 0;
    if (!vis) {
        for (i = 0; i < machine; i++) fg_set.phys[fg_set.ndev++] = i;
    } else {
        /* as CUDA reads it: indices up to the first one that is not a GPU of this machine */
        const char* p = vis;
        while (*p && fg_set.ndev < FG_MAX_DEV) {
            char* end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= machine) break;
            for (i = 0; i < fg_set.ndev && fg_set.phys[i] != (int)v; i++) {}
            if (i < fg_set.ndev) break; /* listed twice */
            fg_set.phys[fg_set.ndev++] = (int)v;
            p = *end == ',' ? end + 1 : end;
            if (*end != ',') break;
        }
    }
    fg_set.cc = (int)fg_env_num("FAKEGPU_CC", 90);
    fg_set.driver = (int)fg_env_num("FAKEGPU_DRIVER", 13000);
    fg_set.seed = (uint64_t)fg_env_num("FAKEGPU_SEED", 1);
    fg_set.delay_s = fg_env_num("FAKEGPU_DELAY_US", 40) * 1e-6;
    fg_set.hold_s = fg_env_num("FAKEGPU_HOLD_MS", 30) * 1e-3;
    fg_set.wait_s = fg_env_num("FAKEGPU_WAIT_S", 60);
    fg_set.nvrtc_major = 13, fg_set.nvrtc_minor = 0;
    if (nv && sscanf(nv, "%d.%d", &fg_set.nvrtc_major, &fg_set.nvrtc_minor) != 2)
        fg_fatal("FAKEGPU_NVRTC_VERSION=%s is not MAJOR.MINOR", nv);
}

const fg_settings* fg_cfg(void) {
    pthread_once(&fg_set_once, fg_read_settings);
    return &fg_set;
}

void fg_fatal(const char* fmt, ...) {
    va_list ap;
    char msg[1024];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakegpu (pid %d): %s\n", (int)getpid(), msg);
    fflush(stderr);
    abort();
}

double fg_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void fg_sleep(double s) {
    struct timespec t;
    if (s <= 0) return;
    t.tv_sec = (time_t)s;
    t.tv_nsec = (long)((s - (double)t.tv_sec) * 1e9);
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

uint64_t fg_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- tracing (FAKEGPU_TRACE) ----------------------------------------------------------------- */

static FILE* fg_trace_file;
static pthread_mutex_t fg_trace_lock = PTHREAD_MUTEX_INITIALIZER;
static int fg_trace_state; /* 0 unknown, 1 on, 2 off */

void fg_trace(const char* fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&fg_trace_lock);
    if (fg_trace_state == 0) {
        const char* path = getenv("FAKEGPU_TRACE");
        fg_trace_file = path && *path ? fopen(path, "a") : NULL;
        fg_trace_state = fg_trace_file ? 1 : 2;
    }
    if (fg_trace_state == 1) {
        fprintf(fg_trace_file, "%d %.6f ", (int)getpid(), fg_now());
        va_start(ap, fmt);
        vfprintf(fg_trace_file, fmt, ap);
        va_end(ap);
        fputc('\n', fg_trace_file);
        fflush(fg_trace_file);
    }
    pthread_mutex_unlock(&fg_trace_lock);
}

/* ---- process state: fork and the current device ------------------------------------------------ */

static pid_t fg_pid;           /* the process whose CUDA state this is */
static pthread_mutex_t fg_init_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int fg_dev_cur;
static __thread cudaError_t fg_last_error;
static cudaError_t fg_sticky_error;
static void fg_install_segv(void);

/* getpid() is a system call on every CUDA call otherwise (glibc caches nothing): the pid is kept
   and forgotten in a forked child, which must find out that it is not the CUDA process. */
static pid_t fg_self_pid;
static pthread_once_t fg_self_once = PTHREAD_ONCE_INIT;
static void fg_forget_pid(void) { __atomic_store_n(&fg_self_pid, 0, __ATOMIC_RELAXED); }
static void fg_watch_forks(void) { pthread_atfork(NULL, NULL, fg_forget_pid); }
static pid_t fg_self(void) {
    pid_t p;
    pthread_once(&fg_self_once, fg_watch_forks);
    p = __atomic_load_n(&fg_self_pid, __ATOMIC_RELAXED);
    if (p == 0) __atomic_store_n(&fg_self_pid, p = getpid(), __ATOMIC_RELAXED);
    return p;
}

cudaError_t fg_enter(void) {
    pid_t me = fg_self();
    fg_cfg();
    if (__atomic_load_n(&fg_pid, __ATOMIC_ACQUIRE) == 0) {
        pthread_mutex_lock(&fg_init_lock);
        if (fg_pid == 0) {
            fg_install_segv();
            __atomic_store_n(&fg_pid, me, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&fg_init_lock);
    }
    /* A child of a process that used CUDA cannot use it (the driver's state is not forkable). */
    if (__atomic_load_n(&fg_pid, __ATOMIC_ACQUIRE) != me) return cudaErrorInitializationError;
    if (fg_cfg()->driver == 0 || fg_cfg()->driver < CUDART_VERSION / 1000 * 1000) return cudaErrorInsufficientDriver;
    if (fg_cfg()->ndev == 0) return cudaErrorNoDevice;
    return fg_sticky_error;
}

int fg_current_device(void) { return fg_dev_cur; }

static cudaError_t fg_ret(cudaError_t e) {
    if (e != cudaSuccess) fg_last_error = e;
    return e;
}
#define FG_ENTER()                                                                                 \
    do {                                                                                           \
        cudaError_t fg_e_ = fg_enter();                                                            \
        if (fg_e_ != cudaSuccess) return fg_ret(fg_e_);                                            \
    } while (0)

cudaError_t fg_sticky(void) { return fg_sticky_error; }

void fg_fault(const char* fmt, ...) {
    va_list ap;
    char msg[768];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakegpu (pid %d): device fault: %s (a GPU reports cudaErrorIllegalAddress, and the "
            "context is unusable from here on)\n", (int)getpid(), msg);
    fflush(stderr);
    fg_sticky_error = cudaErrorIllegalAddress;
}

/* ---- memory ------------------------------------------------------------------------------------ */
/* Each GPU owns one region reserved twice: `view`, the addresses handed out (PROT_NONE for ever),
   and `alias`, where the bytes are. An allocation is placed so that its end (rounded to 256 bytes,
   cudaMalloc's alignment) touches an inaccessible guard page, and freed space is reused only
   after the cursor has gone round the region, so overruns and stale pointers fault. */

#define FG_REGION ((size_t)8 << 30)
typedef struct { size_t start, size, span_start, span; } fg_alloc;
typedef struct {
    char *view, *alias;
    size_t cursor;
    fg_alloc* a; /* sorted by start */
    int n, cap;
} fg_region;
static fg_region fg_reg[FG_MAX_DEV];
static pthread_mutex_t fg_mem_lock = PTHREAD_MUTEX_INITIALIZER;
typedef struct { char* p; size_t n; } fg_pinned;
static fg_pinned* fg_pin;
static int fg_npin, fg_pincap;
static size_t fg_page;

static void fg_region_reserve(int dev) {
    fg_region* r = &fg_reg[dev];
    if (r->view) return;
    fg_page = (size_t)sysconf(_SC_PAGESIZE);
    r->view = (char*)mmap(NULL, FG_REGION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    r->alias = (char*)mmap(NULL, FG_REGION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r->view == MAP_FAILED || r->alias == MAP_FAILED) fg_fatal("reserving %zu GiB of address space failed", FG_REGION >> 30);
}

/* The allocation holding [p, p+n) in region r (n = 0: p may be its end), or -1. */
static int fg_find(const fg_region* r, size_t off, size_t n) {
    int lo = 0, hi = r->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const fg_alloc* a = &r->a[mid];
        if (off < a->start) hi = mid - 1;
        else if (off >= a->start + a->size + (n == 0)) lo = mid + 1;
        else return off + n <= a->start + a->size ? mid : -1;
    }
    return -1;
}

static int fg_region_of(const void* p) {
    int d;
    for (d = 0; d < FG_MAX_DEV; d++)
        if (fg_reg[d].view && (const char*)p >= fg_reg[d].view && (const char*)p < fg_reg[d].view + FG_REGION) return d;
    return -1;
}

int fg_mem_kind(const void* p, size_t n, int* dev, int* ok) {
    int d, i, kind = FG_MEM_PAGEABLE;
    *ok = 1;
    if (dev) *dev = -1;
    pthread_mutex_lock(&fg_mem_lock);
    if ((d = fg_region_of(p)) >= 0) {
        kind = FG_MEM_DEVICE;
        if (dev) *dev = d;
        *ok = fg_find(&fg_reg[d], (size_t)((const char*)p - fg_reg[d].view), n) >= 0;
    } else {
        for (i = 0; i < fg_npin; i++)
            if ((const char*)p >= fg_pin[i].p && (const char*)p < fg_pin[i].p + fg_pin[i].n) {
                kind = FG_MEM_PINNED;
                *ok = (const char*)p + n <= fg_pin[i].p + fg_pin[i].n;
                break;
            }
    }
    pthread_mutex_unlock(&fg_mem_lock);
    return kind;
}

void* fg_alias(const void* p, size_t n) {
    int d, ok;
    if (fg_mem_kind(p, n, &d, &ok) != FG_MEM_DEVICE || !ok) return NULL;
    return fg_reg[d].alias + ((const char*)p - fg_reg[d].view);
}

/* Host pointers given to a kernel become addresses in this inaccessible area, so a kernel that
   dereferences one faults as it would on a GPU. */
static char* fg_poison;

void* fg_alias_arg(void* p, int* bad) {
    int d, ok, kind;
    *bad = 0;
    if (!p) return NULL;
    kind = fg_mem_kind(p, 0, &d, &ok);
    if (kind == FG_MEM_PINNED) return p; /* mapped into the device's address space (UVA) */
    if (kind == FG_MEM_DEVICE && ok) return fg_reg[d].alias + ((char*)p - fg_reg[d].view);
    *bad = 1;
    pthread_mutex_lock(&fg_mem_lock);
    if (!fg_poison) {
        fg_poison = (char*)mmap(NULL, (size_t)4 << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (fg_poison == MAP_FAILED) fg_fatal("reserving the poison area failed");
    }
    pthread_mutex_unlock(&fg_mem_lock);
    return fg_poison + ((size_t)2 << 30) + ((uintptr_t)p & 0xfff);
}

static void fg_segv(int sig, siginfo_t* si, void* uc);
static struct sigaction fg_old_segv;
static void fg_install_segv(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fg_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &fg_old_segv);
}

/* Name the mistake behind a fault in our areas, then let the previous handler (the default, or a
   sanitizer's) report it as usual. */
static void fg_segv(int sig, siginfo_t* si, void* uc) {
    const char* a = (const char*)si->si_addr;
    const char* why = NULL;
    int d;
    for (d = 0; d < FG_MAX_DEV && !why; d++) {
        if (fg_reg[d].view && a >= fg_reg[d].view && a < fg_reg[d].view + FG_REGION)
            why = "the host read or wrote device memory (a device pointer used as a host pointer: copy with cudaMemcpy)\n";
        else if (fg_reg[d].alias && a >= fg_reg[d].alias && a < fg_reg[d].alias + FG_REGION)
            why = "a kernel or library call touched device memory outside every live allocation (an overrun, or memory "
                  "already freed)\n";
    }
    if (!why && fg_poison && a >= fg_poison && a < fg_poison + ((size_t)4 << 30))
        why = "a kernel dereferenced a host pointer it was given as an argument\n";
    if (why) {
        static const char head[] = "fakegpu: segmentation fault: ";
        ssize_t k = write(2, head, sizeof head - 1);
        k = write(2, why, strlen(why));
        (void)k;
    }
    if (fg_old_segv.sa_flags & SA_SIGINFO) {
        sigaction(SIGSEGV, &fg_old_segv, NULL);
        fg_old_segv.sa_sigaction(sig, si, uc);
    } else {
        sigaction(SIGSEGV, &fg_old_segv, NULL); /* the fault repeats under the old action */
    }
}

static size_t fg_round(size_t n, size_t to) { return (n + to - 1) / to * to; }

static cudaError_t fg_dev_alloc(int dev, size_t n, void** out) {
    fg_region* r = &fg_reg[dev];
    size_t body, span, start = 0;
    int i, pass, found = 0;
    fg_region_reserve(dev);
    body = fg_round(fg_round(n, 256), fg_page);
    span = body + fg_page; /* the guard page after it */
    for (pass = 0; pass < 2 && !found; pass++) {
        size_t at = pass == 0 ? r->cursor : 0;
        for (i = 0; i <= r->n && !found; i++) {
            size_t gap_end = i < r->n ? r->a[i].span_start : FG_REGION;
            size_t gap_start = i > 0 ? r->a[i - 1].span_start + r->a[i - 1].span : 0;
            if (gap_start < at) gap_start = at;
            if (gap_end > gap_start && gap_end - gap_start >= span) start = gap_start, found = 1;
        }
    }
    if (!found) return cudaErrorMemoryAllocation;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        fg_alloc* a = (fg_alloc*)realloc(r->a, (size_t)cap * sizeof *a);
        if (!a) return cudaErrorMemoryAllocation;
        r->a = a, r->cap = cap;
    }
    for (i = r->n; i > 0 && r->a[i - 1].span_start > start; i--) r->a[i] = r->a[i - 1];
    r->a[i].span_start = start;
    r->a[i].span = span;
    r->a[i].size = n;
    r->a[i].start = start + body - fg_round(n, 256);
    r->n++;
    r->cursor = start + span;
    if (mprotect(r->alias + start, body, PROT_READ | PROT_WRITE) != 0) fg_fatal("mprotect failed: %s", strerror(errno));
    memset(r->alias + r->a[i].start, 0xff, n); /* uninitialised device memory: NaN in every float type */
    *out = r->view + r->a[i].start;
    return cudaSuccess;
}

/* ---- streams --------------------------------------------------------------------------------- */

struct fg_stream {
    int dev, nonblocking, legacy, live;
    unsigned id;
    fg_op *head, *tail;
    uint64_t enq, done, demand; /* positions: queued, finished, wanted by a waiter */
    uint64_t rng;
    pthread_t thread;
    fg_stream* next_all;
};
static pthread_mutex_t fg_lock = PTHREAD_MUTEX_INITIALIZER; /* every stream's queue and counters */
static pthread_cond_t fg_cv;
static pthread_once_t fg_cv_once = PTHREAD_ONCE_INIT;
static fg_stream* fg_streams; /* every stream ever made (kept, so late events stay readable) */
static fg_stream* fg_legacy[FG_MAX_DEV];
static unsigned fg_nstreams;

static void fg_cv_init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&fg_cv, &a);
    pthread_condattr_destroy(&a);
}

static void fg_timedwait(double until) {
    struct timespec t;
    double now = fg_now();
    if (until > now + 0.05) until = now + 0.05; /* wake now and then: demand may have changed */
    t.tv_sec = (time_t)until;
    t.tv_nsec = (long)((until - (double)t.tv_sec) * 1e9);
    pthread_cond_timedwait(&fg_cv, &fg_lock, &t);
}

static uint64_t fg_rand(fg_stream* s) {
    s->rng = fg_mix(s->rng);
    return s->rng;
}

static void* fg_worker(void* arg) {
    fg_stream* s = (fg_stream*)arg;
    const fg_settings* c = fg_cfg();
    pthread_mutex_lock(&fg_lock);
    for (;;) {
        fg_op* op = s->head;
        int i, blocked = 0;
        double delay;
        if (!op) {
            if (!s->live) break;
            fg_timedwait(fg_now() + 1);
            continue;
        }
        /* held back until someone waits for it, or until the hold time has passed */
        if (s->demand < op->seq && fg_now() < op->t_queued + c->hold_s) {
            fg_timedwait(op->t_queued + c->hold_s);
            continue;
        }
        for (i = 0; i < op->ndeps; i++) {
            fg_stream* d = op->deps[i].s;
            if (d->done < op->deps[i].seq) {
                blocked = 1;
                if (d->demand < op->deps[i].seq) {
                    d->demand = op->deps[i].seq;
                    pthread_cond_broadcast(&fg_cv);
                }
            }
        }
        if (blocked) {
            fg_timedwait(fg_now() + 1);
            continue;
        }
        delay = c->delay_s * (double)(fg_rand(s) >> 11) / 9007199254740992.0;
        pthread_mutex_unlock(&fg_lock);
        fg_sleep(delay);
        if (op->run && !fg_sticky_error) {
            fg_trace("run stream %u #%llu %s", s->id, (unsigned long long)op->seq, op->what ? op->what : "?");
            op->run(op);
        }
        if (op->run) fg_trace("done stream %u #%llu %s", s->id, (unsigned long long)op->seq, op->what ? op->what : "?");
        if (op->fini) op->fini(op);
        pthread_mutex_lock(&fg_lock);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->done = op->seq;
        free(op);
        pthread_cond_broadcast(&fg_cv);
    }
    pthread_mutex_unlock(&fg_lock);
    return NULL;
}

static fg_stream* fg_stream_new(int dev, int nonblocking, int legacy) {
    fg_stream* s = (fg_stream*)calloc(1, sizeof *s);
    pthread_attr_t at;
    if (!s) return NULL;
    pthread_once(&fg_cv_once, fg_cv_init);
    s->dev = dev, s->nonblocking = nonblocking, s->legacy = legacy, s->live = 1;
    pthread_mutex_lock(&fg_lock);
    s->id = fg_nstreams++;
    s->rng = fg_mix(fg_cfg()->seed * 1000003u + s->id);
    s->next_all = fg_streams;
    fg_streams = s;
    pthread_mutex_unlock(&fg_lock);
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, (size_t)8 << 20);
    if (pthread_create(&s->thread, &at, fg_worker, s) != 0) fg_fatal("starting a stream thread failed");
    pthread_attr_destroy(&at);
    pthread_detach(s->thread);
    return s;
}

fg_stream* fg_legacy_stream(int dev) {
    fg_stream* s;
    pthread_mutex_lock(&fg_init_lock);
    if (!fg_legacy[dev]) fg_legacy[dev] = fg_stream_new(dev, 0, 1);
    s = fg_legacy[dev];
    pthread_mutex_unlock(&fg_init_lock);
    return s;
}

fg_stream* fg_stream_of(cudaStream_t h, cudaError_t* err) {
    fg_stream* s;
    *err = cudaSuccess;
    if (h == NULL || h == cudaStreamLegacy) return fg_legacy_stream(fg_dev_cur);
    pthread_mutex_lock(&fg_lock);
    for (s = fg_streams; s && (void*)s != (void*)h; s = s->next_all) {}
    if (s && !s->live) s = NULL;
    pthread_mutex_unlock(&fg_lock);
    if (!s) *err = cudaErrorInvalidResourceHandle;
    return s;
}

int fg_stream_device(const fg_stream* s) { return s->dev; }

fg_op* fg_op_new(void) {
    fg_op* op = (fg_op*)calloc(1, sizeof *op);
    if (!op) fg_fatal("out of memory");
    return op;
}

static void fg_add_dep(fg_op* op, fg_stream* s, uint64_t seq) {
    int i;
    if (s->done >= seq) return;
    for (i = 0; i < op->ndeps; i++)
        if (op->deps[i].s == s) {
            if (op->deps[i].seq < seq) op->deps[i].seq = seq;
            return;
        }
    if (op->ndeps == FG_MAX_DEPS) fg_fatal("an operation waits for more than %d streams", FG_MAX_DEPS);
    op->deps[op->ndeps].s = s;
    op->deps[op->ndeps++].seq = seq;
}

uint64_t fg_enqueue(fg_stream* s, fg_op* op) {
    fg_stream* b;
    uint64_t seq;
    const char* what = op->what ? op->what : "?"; /* op is the worker's once queued: it may run and be freed */
    fg_stream* legacy = s->nonblocking || s->legacy ? NULL : fg_legacy_stream(s->dev);
    pthread_mutex_lock(&fg_lock);
    /* the legacy default stream waits for every blocking stream of its device, and they for it */
    if (s->legacy) {
        for (b = fg_streams; b; b = b->next_all)
            if (b != s && b->dev == s->dev && !b->nonblocking && !b->legacy) fg_add_dep(op, b, b->enq);
    } else if (legacy) {
        fg_add_dep(op, legacy, legacy->enq);
    }
    op->seq = seq = ++s->enq;
    op->t_queued = fg_now();
    op->next = NULL;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&fg_cv);
    pthread_mutex_unlock(&fg_lock);
    fg_trace("queue stream %u #%llu %s", s->id, (unsigned long long)seq, what);
    return seq;
}

uint64_t fg_stream_tail(fg_stream* s) {
    uint64_t t;
    pthread_mutex_lock(&fg_lock);
    t = s->enq;
    pthread_mutex_unlock(&fg_lock);
    return t;
}

cudaError_t fg_wait(fg_stream* s, uint64_t seq, const char* why) {
    double deadline = fg_now() + fg_cfg()->wait_s;
    pthread_mutex_lock(&fg_lock);
    if (s->demand < seq) {
        s->demand = seq;
        pthread_cond_broadcast(&fg_cv);
    }
    while (s->done < seq) {
        if (fg_now() > deadline) {
            const char* what = s->head && s->head->what ? s->head->what : "?";
            pthread_mutex_unlock(&fg_lock);
            fg_fatal("%s waited %.0f s (FAKEGPU_WAIT_S) for stream %u, stuck at: %s", why, fg_cfg()->wait_s, s->id, what);
        }
        fg_timedwait(deadline);
    }
    pthread_mutex_unlock(&fg_lock);
    return fg_sticky_error;
}

/* Wait for everything queued so far on every stream of a device. */
static cudaError_t fg_device_sync(int dev, const char* why) {
    fg_stream* s;
    for (;;) {
        fg_stream* todo = NULL;
        uint64_t seq = 0;
        pthread_mutex_lock(&fg_lock);
        for (s = fg_streams; s && !todo; s = s->next_all)
            if (s->dev == dev && s->done < s->enq) todo = s, seq = s->enq;
        pthread_mutex_unlock(&fg_lock);
        if (!todo) return fg_sticky_error;
        fg_wait(todo, seq, why);
    }
}

/* ---- the API: errors and versions -------------------------------------------------------------- */

static const struct { cudaError_t e; const char *name, *text; } fg_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorInvalidPtx, "cudaErrorInvalidPtx", "a PTX JIT compilation failed"},
    {cudaErrorUnsupportedPtxVersion, "cudaErrorUnsupportedPtxVersion",
     "the provided PTX was compiled with an unsupported toolchain."},
    {cudaErrorSharedObjectInitFailed, "cudaErrorSharedObjectInitFailed", "shared object initialization failed"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};

FG_EXPORT const char* cudaGetErrorName(cudaError_t e) {
    size_t i;
    for (i = 0; i < sizeof fg_errors / sizeof fg_errors[0]; i++)
        if (fg_errors[i].e == e) return fg_errors[i].name;
    return "cudaErrorUnknown";
}

FG_EXPORT const char* cudaGetErrorString(cudaError_t e) {
    size_t i;
    for (i = 0; i < sizeof fg_errors / sizeof fg_errors[0]; i++)
        if (fg_errors[i].e == e) return fg_errors[i].text;
    return "unknown error";
}

FG_EXPORT cudaError_t cudaGetLastError(void) {
    cudaError_t e = fg_sticky_error ? fg_sticky_error : fg_last_error;
    fg_last_error = cudaSuccess;
    return e;
}

FG_EXPORT cudaError_t cudaRuntimeGetVersion(int* v) {
    if (!v) return fg_ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaDriverGetVersion(int* v) {
    if (!v) return fg_ret(cudaErrorInvalidValue);
    *v = fg_cfg()->driver; /* 0: no driver, as the real call says */
    return cudaSuccess;
}

/* ---- devices ------------------------------------------------------------------------------------ */

FG_EXPORT cudaError_t cudaGetDeviceCount(int* n) {
    cudaError_t e = fg_enter();
    if (!n) return fg_ret(cudaErrorInvalidValue);
    *n = 0;
    if (e != cudaSuccess) return fg_ret(e);
    *n = fg_cfg()->ndev;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaSetDevice(int dev) {
    FG_ENTER();
    if (dev < 0 || dev >= fg_cfg()->ndev) return fg_ret(cudaErrorInvalidDevice);
    fg_dev_cur = dev;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int dev) {
    FG_ENTER();
    if (!value) return fg_ret(cudaErrorInvalidValue);
    if (dev < 0 || dev >= fg_cfg()->ndev) return fg_ret(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = fg_cfg()->cc / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = fg_cfg()->cc % 10; break;
    default: return fg_ret(cudaErrorInvalidValue); /* not one the stand-in knows */
    }
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaDeviceGetPCIBusId(char* out, int len, int dev) {
    FG_ENTER();
    if (!out || len < 13) return fg_ret(cudaErrorInvalidValue);
    if (dev < 0 || dev >= fg_cfg()->ndev) return fg_ret(cudaErrorInvalidDevice);
    snprintf(out, (size_t)len, "0000:%02x:00.0", 0x10 + fg_cfg()->phys[dev]);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaDeviceSynchronize(void) {
    FG_ENTER();
    return fg_ret(fg_device_sync(fg_dev_cur, "cudaDeviceSynchronize"));
}

/* ---- memory API ---------------------------------------------------------------------------------- */

FG_EXPORT cudaError_t cudaMalloc(void** p, size_t n) {
    cudaError_t e;
    FG_ENTER();
    if (!p) return fg_ret(cudaErrorInvalidValue);
    *p = NULL;
    if (n == 0) return cudaSuccess;
    pthread_mutex_lock(&fg_mem_lock);
    e = fg_dev_alloc(fg_dev_cur, n, p);
    pthread_mutex_unlock(&fg_mem_lock);
    return fg_ret(e);
}

FG_EXPORT cudaError_t cudaFree(void* p) {
    int d, ok, i;
    fg_region* r;
    FG_ENTER();
    if (!p) return cudaSuccess;
    if (fg_mem_kind(p, 0, &d, &ok) != FG_MEM_DEVICE) return fg_ret(cudaErrorInvalidValue);
    /* cudaFree synchronises: nothing queued may still use the memory */
    fg_trace("cudaFree device %d", d);
    fg_device_sync(d, "cudaFree");
    pthread_mutex_lock(&fg_mem_lock);
    r = &fg_reg[d];
    i = fg_find(r, (size_t)((char*)p - r->view), 0);
    if (i < 0 || r->view + r->a[i].start != (char*)p) {
        pthread_mutex_unlock(&fg_mem_lock);
        return fg_ret(cudaErrorInvalidValue); /* not the start of a live allocation (or freed twice) */
    }
    madvise(r->alias + r->a[i].span_start, r->a[i].span - fg_page, MADV_DONTNEED);
    mprotect(r->alias + r->a[i].span_start, r->a[i].span - fg_page, PROT_NONE);
    memmove(&r->a[i], &r->a[i + 1], (size_t)(r->n - i - 1) * sizeof r->a[0]);
    r->n--;
    pthread_mutex_unlock(&fg_mem_lock);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaMallocHost(void** p, size_t n) {
    void* mem = NULL;
    FG_ENTER();
    if (!p) return fg_ret(cudaErrorInvalidValue);
    *p = NULL;
    if (n == 0) return cudaSuccess;
    if (posix_memalign(&mem, 4096, n) != 0) return fg_ret(cudaErrorMemoryAllocation);
    memset(mem, 0xff, n);
    pthread_mutex_lock(&fg_mem_lock);
    if (fg_npin == fg_pincap) {
        int cap = fg_pincap ? 2 * fg_pincap : 16;
        fg_pinned* a = (fg_pinned*)realloc(fg_pin, (size_t)cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&fg_mem_lock);
            free(mem);
            return fg_ret(cudaErrorMemoryAllocation);
        }
        fg_pin = a, fg_pincap = cap;
    }
    fg_pin[fg_npin].p = (char*)mem;
    fg_pin[fg_npin++].n = n;
    pthread_mutex_unlock(&fg_mem_lock);
    *p = mem;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaFreeHost(void* p) {
    int i, d;
    FG_ENTER();
    if (!p) return cudaSuccess;
    for (d = 0; d < fg_cfg()->ndev; d++) fg_device_sync(d, "cudaFreeHost");
    pthread_mutex_lock(&fg_mem_lock);
    for (i = 0; i < fg_npin && fg_pin[i].p != (char*)p; i++) {}
    if (i == fg_npin) {
        pthread_mutex_unlock(&fg_mem_lock);
        return fg_ret(cudaErrorInvalidValue); /* not from cudaMallocHost */
    }
    fg_pin[i] = fg_pin[--fg_npin];
    pthread_mutex_unlock(&fg_mem_lock);
    free(p);
    return cudaSuccess;
}

/* ---- copies and memsets -------------------------------------------------------------------------- */

typedef struct {
    void* dst;
    const void* src;
    size_t n;
    int value;    /* memset: the byte */
    void* staged; /* cudaMemcpy from pageable memory: the copy taken at the call */
} fg_copy;

static void fg_copy_run(fg_op* op) {
    fg_copy* c = (fg_copy*)op->arg;
    int dk, dd, dok, sk, sd, sok;
    void *dst = c->dst;
    const void* src = c->staged ? c->staged : c->src;
    dk = fg_mem_kind(c->dst, c->n, &dd, &dok);
    if (dk == FG_MEM_DEVICE && !(dst = fg_alias(c->dst, c->n))) {
        fg_fault("%s writes %zu bytes at %p, which is not inside a live allocation", op->what, c->n, c->dst);
        return;
    }
    if (!c->staged) {
        sk = fg_mem_kind(c->src, c->n, &sd, &sok);
        if (sk == FG_MEM_DEVICE && !(src = fg_alias(c->src, c->n))) {
            fg_fault("%s reads %zu bytes at %p, which is not inside a live allocation", op->what, c->n, c->src);
            return;
        }
    }
    if (op->what && !strncmp(op->what, "cudaMemset", 10)) memset(dst, c->value, c->n);
    else memmove(dst, src, c->n);
}

static void fg_copy_fini(fg_op* op) {
    fg_copy* c = (fg_copy*)op->arg;
    free(c->staged);
    free(c);
}

static fg_op* fg_copy_op(void* dst, const void* src, size_t n, const char* what) {
    fg_op* op = fg_op_new();
    fg_copy* c = (fg_copy*)calloc(1, sizeof *c);
    if (!c) fg_fatal("out of memory");
    c->dst = dst, c->src = src, c->n = n;
    op->arg = c, op->run = fg_copy_run, op->fini = fg_copy_fini, op->what = what;
    return op;
}

/* Check a copy's pointers against its kind; returns the device whose legacy stream orders it. */
static cudaError_t fg_copy_check(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind, int* sk, int* dk,
                                 int* dev) {
    int sd, dd, sok, dok;
    *sk = fg_mem_kind(src, n, &sd, &sok);
    *dk = fg_mem_kind(dst, n, &dd, &dok);
    if (!sok || !dok || !dst || !src) return cudaErrorInvalidValue;
    if ((kind == cudaMemcpyHostToDevice && (*dk != FG_MEM_DEVICE || *sk == FG_MEM_DEVICE)) ||
        (kind == cudaMemcpyDeviceToHost && (*sk != FG_MEM_DEVICE || *dk == FG_MEM_DEVICE)) ||
        (kind == cudaMemcpyDeviceToDevice && (*sk != FG_MEM_DEVICE || *dk != FG_MEM_DEVICE)) ||
        (kind == cudaMemcpyHostToHost && (*sk == FG_MEM_DEVICE || *dk == FG_MEM_DEVICE)) || (int)kind < 0 ||
        (int)kind > (int)cudaMemcpyDefault)
        return cudaErrorInvalidValue;
    *dev = *dk == FG_MEM_DEVICE ? dd : *sk == FG_MEM_DEVICE ? sd : fg_dev_cur;
    return cudaSuccess;
}

/* A copy's name in the trace says its direction, so that a test can count the host's round trips. */
static const char* fg_copy_name(int async, int sk, int dk) {
    static const char* const names[2][4] = {
        {"cudaMemcpy host-to-host", "cudaMemcpy host-to-device", "cudaMemcpy device-to-host",
         "cudaMemcpy device-to-device"},
        {"cudaMemcpyAsync host-to-host", "cudaMemcpyAsync host-to-device", "cudaMemcpyAsync device-to-host",
         "cudaMemcpyAsync device-to-device"}};
    return names[async][(sk == FG_MEM_DEVICE) * 2 + (dk == FG_MEM_DEVICE)];
}

FG_EXPORT cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind) {
    int sk, dk, dev;
    fg_stream* L;
    fg_op* op;
    uint64_t seq;
    cudaError_t e;
    FG_ENTER();
    if (n == 0) return cudaSuccess;
    if ((e = fg_copy_check(dst, src, n, kind, &sk, &dk, &dev)) != cudaSuccess) return fg_ret(e);
    L = fg_legacy_stream(dev);
    if (dk == FG_MEM_DEVICE && sk == FG_MEM_PAGEABLE) {
        /* documented: the legacy stream is synchronised, the source staged, and the call returns
           before the copy to the device has landed */
        fg_wait(L, fg_stream_tail(L), "cudaMemcpy (its stream sync)");
        op = fg_copy_op(dst, src, n, "cudaMemcpy host-to-device (staged)");
        ((fg_copy*)op->arg)->staged = malloc(n);
        if (!((fg_copy*)op->arg)->staged) fg_fatal("out of memory");
        memcpy(((fg_copy*)op->arg)->staged, src, n);
        fg_enqueue(L, op);
        return fg_ret(fg_sticky_error);
    }
    op = fg_copy_op(dst, src, n, fg_copy_name(0, sk, dk));
    seq = fg_enqueue(L, op);
    if (dk == FG_MEM_DEVICE && sk == FG_MEM_DEVICE) return fg_ret(fg_sticky_error); /* device to device: async */
    return fg_ret(fg_wait(L, seq, "cudaMemcpy"));
}

FG_EXPORT cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
    int sk, dk, dev;
    fg_stream* s;
    cudaError_t e;
    FG_ENTER();
    s = fg_stream_of(stream, &e);
    if (!s) return fg_ret(e);
    if (n == 0) return cudaSuccess;
    if ((e = fg_copy_check(dst, src, n, kind, &sk, &dk, &dev)) != cudaSuccess) return fg_ret(e);
    /* strict: the bytes move when the stream reaches the copy, from pageable memory too */
    fg_enqueue(s, fg_copy_op(dst, src, n, fg_copy_name(1, sk, dk)));
    return cudaSuccess;
}

static cudaError_t fg_memset(void* p, int v, size_t n, fg_stream* s, const char* what) {
    int d, ok;
    fg_op* op;
    if (n == 0) return cudaSuccess;
    if (fg_mem_kind(p, n, &d, &ok) != FG_MEM_DEVICE || !ok) return cudaErrorInvalidValue;
    if (!s) s = fg_legacy_stream(d);
    op = fg_copy_op(p, NULL, n, what);
    ((fg_copy*)op->arg)->value = v;
    fg_enqueue(s, op);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaMemset(void* p, int v, size_t n) {
    FG_ENTER();
    /* asynchronous with respect to the host, as documented for device memory */
    return fg_ret(fg_memset(p, v, n, NULL, "cudaMemset"));
}

FG_EXPORT cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t stream) {
    fg_stream* s;
    cudaError_t e;
    FG_ENTER();
    if (!(s = fg_stream_of(stream, &e))) return fg_ret(e);
    return fg_ret(fg_memset(p, v, n, s, "cudaMemsetAsync"));
}

/* ---- streams and events API ---------------------------------------------------------------------- */

FG_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
    fg_stream* s;
    FG_ENTER();
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking)) return fg_ret(cudaErrorInvalidValue);
    s = fg_stream_new(fg_dev_cur, (flags & cudaStreamNonBlocking) != 0, 0);
    if (!s) return fg_ret(cudaErrorMemoryAllocation);
    *out = (cudaStream_t)(void*)s;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t h) {
    fg_stream* s;
    cudaError_t e;
    FG_ENTER();
    if (!h || h == cudaStreamLegacy || !(s = fg_stream_of(h, &e))) return fg_ret(cudaErrorInvalidResourceHandle);
    /* documented: returns at once; queued work still runs, then the stream goes */
    pthread_mutex_lock(&fg_lock);
    s->live = 0;
    s->demand = s->enq;
    pthread_cond_broadcast(&fg_cv);
    pthread_mutex_unlock(&fg_lock);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t h) {
    fg_stream* s;
    cudaError_t e;
    FG_ENTER();
    if (!(s = fg_stream_of(h, &e))) return fg_ret(e);
    return fg_ret(fg_wait(s, fg_stream_tail(s), "cudaStreamSynchronize"));
}

struct CUevent_st {
    int dev;
    unsigned flags;
    fg_stream* s; /* NULL: never recorded */
    uint64_t seq;
    struct CUevent_st* next;
    int live;
};
static struct CUevent_st* fg_events;

static struct CUevent_st* fg_event_of(cudaEvent_t h) {
    struct CUevent_st* e;
    pthread_mutex_lock(&fg_lock);
    for (e = fg_events; e && e != (struct CUevent_st*)h; e = e->next) {}
    if (e && !e->live) e = NULL;
    pthread_mutex_unlock(&fg_lock);
    return e;
}

FG_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
    struct CUevent_st* e;
    FG_ENTER();
    if (!out || (flags & ~(unsigned)(cudaEventDisableTiming | cudaEventBlockingSync | cudaEventInterprocess)))
        return fg_ret(cudaErrorInvalidValue);
    e = (struct CUevent_st*)calloc(1, sizeof *e);
    if (!e) return fg_ret(cudaErrorMemoryAllocation);
    e->dev = fg_dev_cur, e->flags = flags, e->live = 1;
    pthread_mutex_lock(&fg_lock);
    e->next = fg_events; /* kept, so a stale handle is recognised as destroyed */
    fg_events = e;
    pthread_mutex_unlock(&fg_lock);
    fg_trace("event create");
    *out = (cudaEvent_t)e;
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t h) {
    struct CUevent_st* e;
    FG_ENTER();
    if (!(e = fg_event_of(h))) return fg_ret(cudaErrorInvalidResourceHandle);
    e->live = 0; /* waits already queued hold their own copy of the position */
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t stream) {
    struct CUevent_st* e;
    fg_stream* s;
    cudaError_t err;
    FG_ENTER();
    if (!(e = fg_event_of(h))) return fg_ret(cudaErrorInvalidResourceHandle);
    if (!(s = fg_stream_of(stream, &err))) return fg_ret(err);
    if (s->dev != e->dev) return fg_ret(cudaErrorInvalidResourceHandle); /* an event and a stream of two GPUs */
    pthread_mutex_lock(&fg_lock);
    e->s = s;
    e->seq = s->enq; /* the event completes when everything queued so far has */
    pthread_mutex_unlock(&fg_lock);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaEventQuery(cudaEvent_t h) {
    struct CUevent_st* e;
    cudaError_t r = cudaSuccess;
    FG_ENTER();
    if (!(e = fg_event_of(h))) return fg_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fg_lock);
    if (e->s && e->s->done < e->seq) {
        r = cudaErrorNotReady; /* not an error: cudaGetLastError does not keep it */
        if (e->s->demand < e->seq) e->s->demand = e->seq, pthread_cond_broadcast(&fg_cv);
    }
    pthread_mutex_unlock(&fg_lock);
    return r;
}

FG_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t h) {
    struct CUevent_st* e;
    fg_stream* s;
    uint64_t seq;
    FG_ENTER();
    if (!(e = fg_event_of(h))) return fg_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fg_lock);
    s = e->s, seq = e->seq;
    pthread_mutex_unlock(&fg_lock);
    return fg_ret(s ? fg_wait(s, seq, "cudaEventSynchronize") : fg_sticky_error);
}

FG_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t h, unsigned int flags) {
    struct CUevent_st* e;
    fg_stream* s;
    cudaError_t err;
    fg_op* op;
    FG_ENTER();
    if (flags != 0) return fg_ret(cudaErrorInvalidValue);
    if (!(e = fg_event_of(h))) return fg_ret(cudaErrorInvalidResourceHandle);
    if (!(s = fg_stream_of(stream, &err))) return fg_ret(err);
    if (!e->s) return cudaSuccess; /* never recorded: nothing to wait for */
    /* a marker in the stream: everything queued after it waits for the event's position */
    op = fg_op_new();
    op->what = "cudaStreamWaitEvent";
    pthread_mutex_lock(&fg_lock);
    fg_add_dep(op, e->s, e->seq);
    pthread_mutex_unlock(&fg_lock);
    fg_enqueue(s, op);
    return cudaSuccess;
}

/* ---- kernel libraries and launches ----------------------------------------------------------------- */

typedef void (*fg_run_kernel)(void** args, const unsigned* grid, const unsigned* block, unsigned long long seed);
typedef int (*fg_info_kernel)(unsigned* sizes, unsigned char* isptr, int max);
struct CUlib_st {
    void* so;
    int target, is_cubin;
    struct CUlib_st* next;
};
struct CUkern_st {
    struct CUlib_st* lib;
    char name[128];
    fg_run_kernel run;
    int nparams;
    unsigned sizes[32];
    unsigned char isptr[32];
    struct CUkern_st* next;
};
static struct CUlib_st* fg_libs;
static struct CUkern_st* fg_kernels;

/* The highest PTX ISA a driver of this CUDA version can JIT (13.0: 9.0; 12.8: 8.7; ...). */
static int fg_driver_ptx(int driver) {
    int major = driver / 1000, minor = driver % 1000 / 10;
    if (major >= 13) return 90 + minor;
    if (major == 12) return minor <= 5 ? 80 + minor : 79 + minor;
    return 70 + minor;
}

FG_EXPORT cudaError_t cudaLibraryLoadData(cudaLibrary_t* out, const void* code, enum cudaJitOption* jo,
                                          void** jov, unsigned int njo, enum cudaLibraryOption* lo, void** lov,
                                          unsigned int nlo) {
    char path[4096];
    int is_cubin, target, pmaj, pmin, cc = fg_cfg()->cc;
    struct CUlib_st* lib;
    void* so;
    (void)jo, (void)jov, (void)lo, (void)lov;
    FG_ENTER();
    if (!out || !code || (njo && !jo) || (nlo && !lo)) return fg_ret(cudaErrorInvalidValue);
    if (!fg_image_parse(code, path, sizeof path, &is_cubin, &target, &pmaj, &pmin))
        return fg_ret(cudaErrorInvalidPtx); /* not an image this stand-in made */
    if (is_cubin) {
        /* binary code runs on the same major architecture, same or newer minor */
        if (target / 10 != cc / 10 || target % 10 > cc % 10) return fg_ret(cudaErrorNoKernelImageForDevice);
    } else {
        if (pmaj * 10 + pmin > fg_driver_ptx(fg_cfg()->driver)) return fg_ret(cudaErrorUnsupportedPtxVersion);
        if (target > cc) return fg_ret(cudaErrorNoKernelImageForDevice);
    }
    so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "fakegpu: loading %s failed: %s\n", path, dlerror());
        return fg_ret(cudaErrorSharedObjectInitFailed);
    }
    lib = (struct CUlib_st*)calloc(1, sizeof *lib);
    if (!lib) return fg_ret(cudaErrorMemoryAllocation);
    lib->so = so, lib->target = target, lib->is_cubin = is_cubin;
    pthread_mutex_lock(&fg_lock);
    lib->next = fg_libs;
    fg_libs = lib;
    pthread_mutex_unlock(&fg_lock);
    *out = (cudaLibrary_t)lib;
    return cudaSuccess;
}

/* Unloading: its kernels are forgotten (a later launch of one is cudaErrorInvalidDeviceFunction)
   and the shared object closed; the caller has waited for the work that used them, as CUDA asks. */
FG_EXPORT cudaError_t cudaLibraryUnload(cudaLibrary_t h) {
    struct CUlib_st **l, *lib = NULL;
    struct CUkern_st **k;
    FG_ENTER();
    pthread_mutex_lock(&fg_lock);
    for (l = &fg_libs; *l; l = &(*l)->next)
        if (*l == (struct CUlib_st*)h) {
            lib = *l, *l = lib->next;
            break;
        }
    for (k = &fg_kernels; lib && *k;) {
        if ((*k)->lib == lib) {
            struct CUkern_st* dead = *k;
            *k = dead->next;
            free(dead);
        } else {
            k = &(*k)->next;
        }
    }
    pthread_mutex_unlock(&fg_lock);
    if (!lib) return fg_ret(cudaErrorInvalidResourceHandle);
    dlclose(lib->so);
    free(lib);
    return cudaSuccess;
}

FG_EXPORT cudaError_t cudaLibraryGetKernel(cudaKernel_t* out, cudaLibrary_t h, const char* name) {
    struct CUlib_st* lib;
    struct CUkern_st* k;
    char sym[160];
    fg_info_kernel info;
    FG_ENTER();
    if (!out || !name || strlen(name) >= sizeof k->name) return fg_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&fg_lock);
    for (lib = fg_libs; lib && lib != (struct CUlib_st*)h; lib = lib->next) {}
    pthread_mutex_unlock(&fg_lock);
    if (!lib) return fg_ret(cudaErrorInvalidResourceHandle);
    k = (struct CUkern_st*)calloc(1, sizeof *k);
    if (!k) return fg_ret(cudaErrorMemoryAllocation);
    snprintf(sym, sizeof sym, "fg_run_%s", name);
    *(void**)&k->run = dlsym(lib->so, sym);
    snprintf(sym, sizeof sym, "fg_info_%s", name);
    *(void**)&info = dlsym(lib->so, sym);
    if (!k->run || !info) {
        free(k);
        return fg_ret(cudaErrorSymbolNotFound);
    }
    k->nparams = info(k->sizes, k->isptr, 32);
    if (k->nparams < 0 || k->nparams > 32) fg_fatal("kernel %s has more than 32 parameters", name);
    k->lib = lib;
    snprintf(k->name, sizeof k->name, "%s", name);
    pthread_mutex_lock(&fg_lock);
    k->next = fg_kernels;
    fg_kernels = k;
    pthread_mutex_unlock(&fg_lock);
    *out = (cudaKernel_t)k;
    return cudaSuccess;
}

typedef struct {
    struct CUkern_st* k;
    unsigned grid[3], block[3];
    unsigned long long seed;
    void* argv[32];
    unsigned char bytes[32][16];
} fg_launch;

static void fg_launch_run(fg_op* op) {
    fg_launch* l = (fg_launch*)op->arg;
    int i;
    for (i = 0; i < l->k->nparams; i++)
        if (l->k->isptr[i]) {
            void* p;
            int bad;
            memcpy(&p, l->bytes[i], sizeof p);
            p = fg_alias_arg(p, &bad);
            if (bad)
                fprintf(stderr, "fakegpu: kernel %s: argument %d is not device memory (a GPU faults if the kernel "
                        "touches it)\n", l->k->name, i);
            memcpy(l->bytes[i], &p, sizeof p);
        }
    l->k->run(l->argv, l->grid, l->block, l->seed);
}

static void fg_free_arg(fg_op* op) { free(op->arg); }

FG_EXPORT cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shmem,
                                       cudaStream_t stream) {
    struct CUkern_st* k;
    fg_stream* s;
    fg_launch* l;
    fg_op* op;
    cudaError_t e;
    int i;
    FG_ENTER();
    pthread_mutex_lock(&fg_lock);
    for (k = fg_kernels; k && (const void*)k != func; k = k->next) {}
    pthread_mutex_unlock(&fg_lock);
    if (!k) return fg_ret(cudaErrorInvalidDeviceFunction);
    if (!(s = fg_stream_of(stream, &e))) return fg_ret(e);
    if (s->dev != fg_dev_cur) return fg_ret(cudaErrorInvalidResourceHandle); /* a stream of another GPU */
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 || block.x > 1024 || block.y > 1024 ||
        block.z > 64 || (unsigned long long)block.x * block.y * block.z > 1024 || shmem > 48 * 1024)
        return fg_ret(cudaErrorInvalidConfiguration);
    if (k->nparams > 0 && !args) return fg_ret(cudaErrorInvalidValue);
    l = (fg_launch*)calloc(1, sizeof *l);
    if (!l) return fg_ret(cudaErrorMemoryAllocation);
    l->k = k;
    l->grid[0] = grid.x, l->grid[1] = grid.y, l->grid[2] = grid.z;
    l->block[0] = block.x, l->block[1] = block.y, l->block[2] = block.z;
    /* the argument values are taken now, each as wide as the kernel's parameter says */
    for (i = 0; i < k->nparams; i++) {
        if (k->sizes[i] > sizeof l->bytes[i]) fg_fatal("kernel %s: parameter %d is wider than 16 bytes", k->name, i);
        memcpy(l->bytes[i], args[i], k->sizes[i]);
        l->argv[i] = l->bytes[i];
    }
    op = fg_op_new();
    op->arg = l, op->run = fg_launch_run, op->fini = fg_free_arg, op->what = k->name;
    pthread_mutex_lock(&fg_lock);
    l->seed = fg_rand(s);
    pthread_mutex_unlock(&fg_lock);
    fg_enqueue(s, op);
    return cudaSuccess;
}
