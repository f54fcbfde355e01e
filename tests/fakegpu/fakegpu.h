/* fakegpu: a CPU stand-in for the CUDA runtime, cuBLAS, NVRTC and NCCL, for tests only.

   ddp.h's GPU path cannot run on the project's machines (no GPU), and a lent GPU machine has one
   GPU, so multi-rank NCCL never runs on hardware we can get. This library implements, on the CPU,
   exactly the part of those four APIs that ddp.h calls, built against NVIDIA's own headers so the
   signatures are theirs, and as strict as NVIDIA's documentation allows, so that code that would
   be wrong on a GPU fails here:

   - Device memory is not host-addressable. Every device pointer lies in a region the host sees as
     PROT_NONE; the stand-in reaches the bytes through a second mapping (the alias) at the same
     offset. A host read of a device pointer faults at once. Fresh allocations hold 0xFF bytes (NaN
     in every float type), as real device memory holds whatever was there.
   - Every stream runs its queue in order on its own thread. An operation waits for its
     dependencies (events, the legacy default stream's implicit ordering) and then, unless the host
     or another stream is waiting for it, for FAKEGPU_HOLD_MS (default 30) after it was queued, and
     a seeded random delay (FAKEGPU_SEED, up to FAKEGPU_DELAY_US). So work nobody waits for runs
     late: a missing wait reads stale data every time, not by bad luck, while a program that waits
     correctly runs at full speed because its waits pull the work forward.
   - Copies and memsets follow the documented host synchronisation: cudaMemcpy from pageable memory
     returns once the source is staged, before the device copy lands; cudaMemset returns at once.
   - NVRTC compiles the kernel source it is given with the host C++ compiler under a small shim
     (kernel_shim.h); a launch runs the whole grid on the stream's thread, blocks in a shuffled
     order, unpacking the argument array by the kernel's own signature.
   - NCCL communicators span processes (shared memory files named after the unique id); a
     non-blocking communicator returns ncclInProgress, enqueues later from a background thread,
     and refuses use (ncclInvalidArgument) until ncclCommGetAsyncError says ncclSuccess.
   - Nothing waits for ever: every internal wait ends after FAKEGPU_WAIT_S (default 60 s) with a
     message and abort(), so a broken test fails instead of hanging CI.

   What it cannot show: the driver, PTX JIT and real device code generation, real numerics (the
   host's expf is not the GPU's), memory-model effects inside a kernel, and speed.

   Environment: FAKEGPU_DEVICES (GPUs in the machine, default 1; 0: none; CUDA_VISIBLE_DEVICES
   picks among them as it does on a real machine), FAKEGPU_CC (compute capability,
   default 90), FAKEGPU_DRIVER (driver CUDA version, default 13000; 0: no driver),
   FAKEGPU_NVRTC_VERSION (default 13.0), FAKEGPU_SEED, FAKEGPU_DELAY_US (default 40),
   FAKEGPU_HOLD_MS, FAKEGPU_WAIT_S, FAKEGPU_CXX (host compiler, default c++), FAKEGPU_CACHE (where
   compiled kernels are kept), FAKEGPU_NCCL_DELAY_MS (every collective takes at least this long:
   a slow network, for tests of overlap), FAKEGPU_FAIL=NAME:N (the Nth call of NCCL function NAME
   fails with ncclInternalError), FAKEGPU_TRACE (a file: one line per operation queued,
   started and finished, and per NCCL call, for tests that check order). */
#ifndef FAKEGPU_H
#define FAKEGPU_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#define FG_EXPORT __attribute__((visibility("default")))
#define FG_MAX_DEV 16
#define FG_MAX_DEPS 24

/* ---- settings, read once ---- */
typedef struct fg_settings {
    int ndev, cc, driver, nvrtc_major, nvrtc_minor;
    int phys[FG_MAX_DEV]; /* visible GPU i is physical GPU phys[i] (CUDA_VISIBLE_DEVICES) */
    uint64_t seed;
    double delay_s, hold_s, wait_s, nccl_delay_s;
    int nccl_report; /* FAKEGPU_NCCL_REPORT=1: NCCL reports what the hardware does not (nccl.c) */
} fg_settings;
const fg_settings* fg_cfg(void);

/* A fatal stand-in error: print the message (prefixed "fakegpu:") and abort. */
void fg_fatal(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
double fg_now(void);
void fg_sleep(double s);
uint64_t fg_mix(uint64_t x); /* a 64-bit hash */

/* Every API call starts here: CUDA state does not survive fork (cudaErrorInitializationError). */
cudaError_t fg_enter(void);
int fg_current_device(void);

/* ---- memory ---- */
enum { FG_MEM_DEVICE = 1, FG_MEM_PINNED, FG_MEM_PAGEABLE };
/* What kind of memory [p, p+n) is; for device memory *dev is its GPU. A device range that does not
   lie inside one live allocation is FG_MEM_DEVICE with *ok = 0. */
int fg_mem_kind(const void* p, size_t n, int* dev, int* ok);
/* The host address of device bytes [p, p+n), or NULL when they are not inside one live allocation. */
void* fg_alias(const void* p, size_t n);
/* For kernel arguments: the host address a device pointer stands for (pinned and NULL pointers
   pass as they are); NULL with *bad = 1 when p points at no memory a kernel may touch. */
void* fg_alias_arg(void* p, int* bad);

/* ---- streams and operations ---- */
typedef struct fg_stream fg_stream;
typedef struct fg_op fg_op;
typedef void (*fg_run_fn)(fg_op* op);
struct fg_op {
    fg_op* next;
    uint64_t seq;                       /* its position in the stream, from 1 */
    double t_queued;
    int ndeps;
    struct { fg_stream* s; uint64_t seq; } deps[FG_MAX_DEPS];
    fg_run_fn run;                      /* the work, on the stream's thread; NULL: a marker */
    void (*fini)(fg_op* op);            /* frees what the op owns, after it ran */
    const char* what;                   /* for messages and the trace */
    void* arg;                          /* the op's own data */
};
/* The stream a cudaStream_t names on the current device (NULL: the legacy default stream), or NULL
   with *err set when it is not a live stream. */
fg_stream* fg_stream_of(cudaStream_t s, cudaError_t* err);
int fg_stream_device(const fg_stream* s);
fg_stream* fg_legacy_stream(int dev);
/* A new op with no work yet; fill run/arg/fini/what and hand it to fg_enqueue. */
fg_op* fg_op_new(void);
/* Queue op on s (adding the legacy-stream ordering); returns its position. */
uint64_t fg_enqueue(fg_stream* s, fg_op* op);
/* Wait until s has run everything up to position seq; returns the sticky error, if any. */
cudaError_t fg_wait(fg_stream* s, uint64_t seq, const char* why);
uint64_t fg_stream_tail(fg_stream* s);

/* A device fault (illegal address): sticky, as on a GPU; the message goes to stderr. */
void fg_fault(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
cudaError_t fg_sticky(void);
void fg_trace(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- kernels (runtime side of NVRTC) ---- */
/* The object file a fake PTX or CUBIN image names, with its target; 0 when the image is not ours. */
int fg_image_parse(const void* image, char* so_path, size_t n, int* is_cubin, int* target, int* ptx_major,
                   int* ptx_minor);

/* ---- float helpers shared by cuBLAS and NCCL ---- */
float fg_half_to_float(uint16_t h);
uint16_t fg_float_to_half(float f);
float fg_bf16_to_float(uint16_t h);
uint16_t fg_float_to_bf16(float f);

#endif
