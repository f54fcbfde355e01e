/* ddp.h v0.1.0 - Distributed Data Parallel training in one C header. MIT or public domain: see the end of this file.

    WHAT THIS IS
    ============
    A single-header C99 library that teaches, and performs, data-parallel training the way
    PyTorch's DistributedDataParallel does it: one process per device, each with a full replica
    of a small neural network, gradients averaged across processes during backward.
    It runs on a laptop with no GPU (a CPU path over real sockets) and on NVIDIA GPUs
    (CUDA, cuBLAS, NCCL). TUTORIAL.md is the course; this comment is the map.

    What it is not: an autograd engine, a tensor library, or a replacement for PyTorch. The
    network layer holds exactly what the tutorial needs (Linear, ReLU, GELU, two losses, SGD and
    Adam/AdamW) so that every line of a training step can be read.

    USE
    ===
    In exactly one C file:

        #define DDP_IMPLEMENTATION
        #include "ddp.h"

    Other files include "ddp.h" without the define. Build with the flags of the installed
    pkg-config file:   cc train.c $(pkg-config --cflags --libs ddp)
    or by hand, CPU only:   cc -DDDP_NO_CUDA train.c -lpthread -lm
    or with CUDA:           cc train.c -I$CUDA_HOME/include -L$CUDA_HOME/lib64 \
                               -lcublas -lnvrtc -lnccl -lcudart -lpthread -lm

    QUICK START (the heart of TUTORIAL.md chapter 1)
    ===========
        ddp_dataset all, train, test;
        DDP_CHECK(ddp_dataset_load_csv("examples/data/wine.csv", &all));
        DDP_CHECK(ddp_dataset_split(&all, 0.2, 42, &train, &test));
        ddp_dataset_standardize(&train, &test);
        ddp_model* m;  int sizes[] = {13, 64, 3};
        DDP_CHECK(ddp_model_mlp(&(ddp_model_desc){.seed = 1}, sizes, 3, DDP_LAYER_RELU, &m));
        ddp_optim* opt;
        DDP_CHECK(ddp_optim_create(m, &(ddp_optim_desc){.kind = DDP_ADAM, .lr = 1e-3f}, &opt));
        ... per batch: ddp_model_zero_grad(m); ddp_model_forward(m, x, n);
                       ddp_loss_cross_entropy(m, y, &loss); ddp_model_backward(m); ddp_optim_step(opt);

    STEP BY STEP: ONE TRAINING STEP, AND THE SECTION OF THIS FILE THAT OWNS EACH PART
    ==================================================================================
    Search this file for the tag (">>nn") to jump to a section. Sections appear in the same
    order in the declarations and in the implementation: the order data flows through a step.

        tag         what it owns                                              TUTORIAL chapter
        >>config    macros, status codes, errors, logging, random numbers     1
        >>device    host and CUDA memory, copies, streams, events, dtypes     1
        >>kernels   GPU kernels (compiled at run time by NVRTC), cuBLAS glue  1
        >>nn        parameters, Linear/ReLU/GELU, losses, SGD/Adam; backward   1
                    fires the per-parameter "gradient ready" hook
        >>store     rendezvous key-value store                (not built yet: issue 4)
        >>pg        process group, CPU ring and NCCL backends (not built yet: issue 4)
        >>data      data files, train/test split, batches; the distributed
                    sampler                                   (sampler: issue 5)
        >>reducer   buckets, hooks, overlap, no_sync          (not built yet: issue 5)
        >>snapshot  checkpoint files (simple format now; safetensors: issue 6)
        >>launch    spawning ranks, ddprun                    (not built yet: issue 4)

    GLOSSARY
    ========
    rank         the number of one process in a job, 0 .. world size - 1 (global)
    local rank   the number of a process on its own machine; it picks the GPU
    world size   how many processes the job has in all
    collective   an operation every rank calls together (all-reduce, broadcast, barrier)
    bucket       a group of gradients all-reduced as one message
    hook         a function the backward pass calls the moment a parameter's gradient is final

    CONFIGURATION MACROS (define before including the implementation)
    ====================
    DDP_NO_CUDA          CPU-only build: no CUDA, cuBLAS, NVRTC or NCCL header is included.
                         Without it the CUDA headers are required, and a binary built with them
                         still runs on the CPU when the machine has no GPU.
    DDP_CBLAS            Linear layers on the CPU call cblas_sgemm (link a CBLAS such as
                         OpenBLAS: -lopenblas); otherwise a cache-blocked loop of our own.
    DDP_STATIC           make every function static (for a private copy in one file).
    DDP_MALLOC(n), DDP_FREE(p)
                         host allocator; define both or neither.
    DDP_ASSERT(c)        internal consistency checks (default: assert from <assert.h>).
    DDP_MAX_LAYERS       layers in one model (default 64); DDP_MAX_HOOKS hooks per parameter (4).

    Environment, read at run time:
    DDP_DEBUG=INFO|DETAIL   more log lines; DETAIL also synchronises after every GPU launch
                            so an error is reported at the call that caused it.

    BACKENDS AND FEATURES
    =====================
                                  CPU build (DDP_NO_CUDA)   CUDA build, no GPU   CUDA build, GPU
        model on the CPU          yes                       yes                  yes
        model on a GPU            no (DDP_ERR_NOT_BUILT)    no (DDP_ERR_NO_GPU)  yes
        kernels compile (NVRTC)   no                        yes (to PTX)         yes

    ERRORS
    ======
    Functions return ddp_status (DDP_OK is 0). ddp_error_string() gives the last message of the
    calling thread: what failed, where, and what to do. ddp_status_name/_cause/_fix describe the
    code itself. Examples stop on error through DDP_CHECK(call).

    LIMITS, HONESTLY
    ================
    - f32 compute only; f16 and bf16 are storage formats (conversion, later gradient compression).
    - The network layer is a sequential stack; there is no automatic differentiation.
    - Not yet built (see the chapter map): multi-process training. This version is chapter 1.
*/

/* The implementation uses POSIX (files, later sockets and processes). Strict C99 hides those
   declarations unless a feature macro comes before the first system header, so the file that
   defines DDP_IMPLEMENTATION must include ddp.h before any other header (or compile with
   -D_POSIX_C_SOURCE=200809L); a check below says so if it did not. */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP__IMPLEMENTED)
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_XOPEN_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#if !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE 1 /* glibc: BSD extras such as MAP_ANONYMOUS, alongside POSIX */
#endif
#if defined(__APPLE__) && !defined(_DARWIN_C_SOURCE)
#define _DARWIN_C_SOURCE 1
#endif
#endif

/* ============================================================================================== */
/*                                        DECLARATIONS                                            */
/* ============================================================================================== */
#ifndef DDP_H_INCLUDED
#define DDP_H_INCLUDED

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t, uint16_t */

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1
#define DDP_VERSION_PATCH 0

#if defined(DDP_STATIC)
#define DDP_API static
#else
#define DDP_API extern
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DDP__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define DDP__PRINTF(fmt, args)
#endif

#ifndef DDP_MAX_LAYERS
#define DDP_MAX_LAYERS 64
#endif
#ifndef DDP_MAX_HOOKS
#define DDP_MAX_HOOKS 4
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* >>config: status codes, errors, logging, random numbers                          (chapter 1)  */
/* ---------------------------------------------------------------------------------------------- */

/* One row per status: name, the usual cause, and what to do. The enum and the messages are both
   generated from this table, so a code can never lack its explanation. */
#define DDP__STATUS_TABLE(X)                                                                       \
    X(DDP_OK, "success", "nothing to do")                                                        \
    X(DDP_ERR_INVALID_ARGUMENT, "an argument is missing, out of range or inconsistent",          \
      "read the message: it names the argument and the values it accepts")                        \
    X(DDP_ERR_OUT_OF_MEMORY, "host memory ran out",                                              \
      "use a smaller batch or model, or free memory on this machine")                             \
    X(DDP_ERR_STATE, "a call came in the wrong order",                                           \
      "follow the order forward -> loss -> backward -> optimizer step")                           \
    X(DDP_ERR_NOT_BUILT, "this build has no CUDA support (it was compiled with DDP_NO_CUDA)",    \
      "use --device cpu, or rebuild with the CUDA toolkit installed (make prints what it found)")\
    X(DDP_ERR_NO_GPU, "no usable NVIDIA GPU was found (no GPU, no driver, or none visible)",     \
      "use --device cpu, or check nvidia-smi and CUDA_VISIBLE_DEVICES")                           \
    X(DDP_ERR_CUDA, "a CUDA runtime call failed",                                                \
      "read the CUDA error named in the message; DDP_DEBUG=DETAIL reports it at the call")        \
    X(DDP_ERR_CUBLAS, "a cuBLAS call failed", "read the cuBLAS status named in the message")      \
    X(DDP_ERR_NVRTC, "NVRTC could not compile the GPU kernels",                                  \
      "check that the CUDA toolkit's NVRTC matches the driver; the message has the compile log") \
    X(DDP_ERR_NCCL, "an NCCL call failed", "read the NCCL error named in the message")            \
    X(DDP_ERR_IO, "a file could not be opened, read or written",                                 \
      "check the path (relative paths start in the current directory) and its permissions")      \
    X(DDP_ERR_DATA_FORMAT, "a data file is malformed",                                           \
      "the message names the file, line and column; compare with examples/data/README.md")      \
    X(DDP_ERR_CHECKPOINT, "a checkpoint file is damaged or belongs to another model",           \
      "delete the file to start afresh, or load it into the model that wrote it")

#define DDP__STATUS_ENUM(name, cause, fix) name,
typedef enum ddp_status { DDP__STATUS_TABLE(DDP__STATUS_ENUM) DDP__STATUS_COUNT } ddp_status;
#undef DDP__STATUS_ENUM

/* The status's name, e.g. "DDP_ERR_IO"; "DDP_ERR_UNKNOWN" for a value outside the table. */
DDP_API const char* ddp_status_name(ddp_status s);
/* The usual cause of a status, one line. Never NULL. */
DDP_API const char* ddp_status_cause(ddp_status s);
/* What to do about a status, one line. Never NULL. */
DDP_API const char* ddp_status_fix(ddp_status s);
/* The calling thread's last error message (what failed, where, why); "" when none. Never NULL. */
DDP_API const char* ddp_error_string(void);
/* The status of the calling thread's last error, DDP_OK when none; ddp_clear_error() resets it. */
DDP_API ddp_status ddp_last_status(void);
/* Forget the calling thread's last error. */
DDP_API void ddp_clear_error(void);

/* Print the last error with its cause and fix to stderr and exit(1) when `call` fails. For
   examples and tests: a library function never exits (a rank that exits cannot tell its peers). */
#define DDP_CHECK(call)                                                                            \
    do {                                                                                           \
        ddp_status ddp_check_s_ = (call);                                                          \
        if (ddp_check_s_ != DDP_OK) ddp_check_failed(ddp_check_s_, #call, __FILE__, __LINE__);     \
    } while (0)
/* Used by DDP_CHECK: report the failure of `call_text` and exit(1). Does not return. */
DDP_API void ddp_check_failed(ddp_status s, const char* call_text, const char* file, int line);

typedef enum ddp_log_level {
    DDP_LOG_ERROR = 1, /* always printed */
    DDP_LOG_WARN,      /* always printed */
    DDP_LOG_INFO,      /* DDP_DEBUG=INFO or DETAIL */
    DDP_LOG_DETAIL     /* DDP_DEBUG=DETAIL */
} ddp_log_level;
/* A log sink receives each line, already prefixed with "[rank R/W]", without a newline. */
typedef void (*ddp_log_fn)(ddp_log_level level, const char* line, void* user);
/* Send log lines to `fn` instead of stderr (NULL restores stderr). Not thread-safe: call early. */
DDP_API void ddp_set_log(ddp_log_fn fn, void* user);
/* The level DDP_DEBUG asks for: DDP_LOG_WARN when unset, DDP_LOG_INFO or DDP_LOG_DETAIL. */
DDP_API ddp_log_level ddp_log_level_enabled(void);
/* Log one printf-style line at `level` with the rank prefix; dropped if the level is not enabled. */
DDP_API void ddp_log(ddp_log_level level, const char* fmt, ...) DDP__PRINTF(2, 3);

/* What this copy of the library was built with, one line (backends, BLAS, CUDA versions). */
DDP_API const char* ddp_build_info(void);

/* A small deterministic random generator (splitmix64): the same seed gives the same numbers on
   every machine and device, which is what makes replicas start identical. */
typedef struct ddp_rng { uint64_t state; } ddp_rng;
/* A generator seeded with `seed`. */
DDP_API ddp_rng ddp_rng_seed(uint64_t seed);
/* The next 64 random bits. */
DDP_API uint64_t ddp_rng_next(ddp_rng* r);
/* A uniform float in [0, 1). */
DDP_API float ddp_rng_uniform(ddp_rng* r);
/* An integer uniform in [0, n) for n >= 1. */
DDP_API uint32_t ddp_rng_below(ddp_rng* r, uint32_t n);
/* Fill out[0..n) with a permutation of 0..n-1 drawn from `seed` (Fisher-Yates). */
DDP_API void ddp_permutation(int n, uint64_t seed, int* out);

/* ---------------------------------------------------------------------------------------------- */
/* >>device: devices, memory, copies, streams, events, dtypes                       (chapter 1)  */
/* ---------------------------------------------------------------------------------------------- */

typedef enum ddp_device_type {
    DDP_DEVICE_AUTO = 0, /* a GPU when one is usable, else the CPU */
    DDP_DEVICE_CPU,
    DDP_DEVICE_CUDA
} ddp_device_type;

typedef struct ddp_device {
    ddp_device_type type;
    int index; /* CUDA device number; with DDP_DEVICE_AUTO it is the local rank's GPU */
} ddp_device;

/* Number of usable CUDA devices; 0 with no GPU, no driver, or DDP_NO_CUDA. Never fails. */
DDP_API int ddp_cuda_device_count(void);
/* Why ddp_cuda_device_count() is 0, in plain words ("" when it is not). Never NULL. */
DDP_API const char* ddp_cuda_unavailable_reason(void);
/* Parse "cpu", "cuda", "cuda:N" or "auto" into *out. DDP_ERR_INVALID_ARGUMENT on anything else. */
DDP_API ddp_status ddp_device_parse(const char* text, ddp_device* out);
/* Turn DDP_DEVICE_AUTO into a concrete device and check that a CUDA device exists.
   DDP_ERR_NO_GPU or DDP_ERR_NOT_BUILT when CUDA was asked for but cannot be used. */
DDP_API ddp_status ddp_device_resolve(ddp_device want, ddp_device* out);
/* "cpu" or "cuda:N" into buf (at least 16 bytes); returns buf. */
DDP_API const char* ddp_device_name(ddp_device d, char* buf, size_t bufsize);
/* Make `d` the calling thread's current CUDA device (no-op for the CPU). DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_device_activate(ddp_device d);

/* Allocate nbytes on `d`, zero-filled. *out is NULL for nbytes 0. DDP_ERR_OUT_OF_MEMORY or
   DDP_ERR_CUDA (a full GPU) on failure. */
DDP_API ddp_status ddp_alloc(ddp_device d, size_t nbytes, void** out);
/* Free memory from ddp_alloc on the same device. NULL is ignored. */
DDP_API void ddp_free(ddp_device d, void* p);
/* Allocate page-locked host memory (plain host memory in a CPU-only build or without a GPU):
   copies to and from a GPU run at full speed and can overlap compute. */
DDP_API ddp_status ddp_alloc_pinned(size_t nbytes, void** out);
/* Free memory from ddp_alloc_pinned. NULL is ignored. */
DDP_API void ddp_free_pinned(void* p);

typedef struct ddp_stream ddp_stream; /* an ordered queue of GPU work; immediate on the CPU */
typedef struct ddp_event ddp_event;   /* a marker in a stream that other streams can wait for */

/* Create a stream on `d`. DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_stream_create(ddp_device d, ddp_stream** out);
/* Destroy a stream (waits for its work first). NULL is ignored. */
DDP_API void ddp_stream_destroy(ddp_stream* s);
/* Block until all work queued on `s` is done. Returns the first error the work raised. */
DDP_API ddp_status ddp_stream_sync(ddp_stream* s);
/* The cudaStream_t behind `s` as void* (NULL on the CPU): an escape hatch for your own kernels. */
DDP_API void* ddp_stream_native(ddp_stream* s);
/* Create an event on `d`. DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_event_create(ddp_device d, ddp_event** out);
/* Destroy an event. NULL is ignored. */
DDP_API void ddp_event_destroy(ddp_event* e);
/* Mark the current end of stream `s` with `e`. DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_event_record(ddp_event* e, ddp_stream* s);
/* Make later work on `s` wait until `e` has happened, without blocking the host. */
DDP_API ddp_status ddp_stream_wait_event(ddp_stream* s, ddp_event* e);
/* Block the host until `e` has happened. DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_event_sync(ddp_event* e);
/* *done = 1 if `e` has happened, else 0, without blocking. DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_event_query(ddp_event* e, int* done);

/* Copy nbytes from src on src_dev to dst on dst_dev, in order on `s` (NULL: now, blocking).
   Any pair of CPU and CUDA devices. DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_copy(ddp_device dst_dev, void* dst, ddp_device src_dev, const void* src,
                            size_t nbytes, ddp_stream* s);
/* Set nbytes at p on `d` to zero, in order on `s` (NULL: now). DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_zero(ddp_device d, void* p, size_t nbytes, ddp_stream* s);

typedef enum ddp_dtype {
    DDP_DTYPE_DEFAULT = 0, /* f32 */
    DDP_F32,
    DDP_F16,  /* IEEE half: 5-bit exponent, 10-bit mantissa; max 65504 */
    DDP_BF16  /* bfloat16: f32's 8-bit exponent, 7-bit mantissa */
} ddp_dtype;

/* Bytes per element of `t` (4 or 2); 0 for an unknown dtype. */
DDP_API size_t ddp_dtype_size(ddp_dtype t);
/* "f32", "f16", "bf16" or "?". */
DDP_API const char* ddp_dtype_name(ddp_dtype t);
/* f32 -> f16, rounding to nearest even; overflow gives infinity, NaN stays NaN. */
DDP_API uint16_t ddp_f32_to_f16(float f);
/* f16 -> f32, exact (subnormals included). */
DDP_API float ddp_f16_to_f32(uint16_t h);
/* f32 -> bf16, rounding to nearest even; NaN stays NaN. */
DDP_API uint16_t ddp_f32_to_bf16(float f);
/* bf16 -> f32, exact. */
DDP_API float ddp_bf16_to_f32(uint16_t h);
/* Convert `count` elements between dtypes on device `d` (both buffers there), in order on `s`.
   DDP_ERR_INVALID_ARGUMENT for an unknown dtype; DDP_ERR_CUDA on a GPU failure. */
DDP_API ddp_status ddp_convert(ddp_device d, ddp_dtype dst_type, void* dst, ddp_dtype src_type,
                               const void* src, size_t count, ddp_stream* s);

/* ---------------------------------------------------------------------------------------------- */
/* >>kernels: GPU kernels compiled at run time by NVRTC, and cuBLAS glue            (chapter 1)  */
/* ---------------------------------------------------------------------------------------------- */

/* Number of GPU kernels in this library (0 in a CPU-only build). */
DDP_API int ddp_kernel_count(void);
/* The name of kernel i, 0 <= i < ddp_kernel_count(); NULL outside that range. */
DDP_API const char* ddp_kernel_name(int i);
/* Compile every kernel with NVRTC for `arch` (e.g. "compute_80") into PTX text. Needs no GPU:
   this is how a machine without one proves the kernels compile. *ptx is freed with ddp_free_host.
   DDP_ERR_NVRTC with the compiler log on failure; DDP_ERR_NOT_BUILT in a CPU-only build. */
DDP_API ddp_status ddp_kernels_compile_ptx(const char* arch, char** ptx, size_t* nbytes);
/* Free host memory the library handed out (PTX text). NULL is ignored. */
DDP_API void ddp_free_host(void* p);

/* ---------------------------------------------------------------------------------------------- */
/* >>nn: parameters, layers, losses, optimizers, and the gradient-ready hook        (chapter 1)  */
/* ---------------------------------------------------------------------------------------------- */

typedef struct ddp_param ddp_param;
/* Called once per backward for each parameter, the moment its gradient is final (accumulated
   into p->grad), last layer first. This is where data parallelism plugs in: the reducer's hook
   starts averaging a gradient while backward still computes the earlier layers'. */
typedef void (*ddp_grad_hook_fn)(ddp_param* p, void* user);

struct ddp_param {
    char name[32];       /* "fc1.weight", "fc1.bias", ... in registration order */
    int index;           /* position in the model's parameter list */
    int ndim;            /* 2 for a weight [out, in], 1 for a bias [out] */
    int shape[2];
    size_t count;        /* elements */
    ddp_device device;
    float* data;         /* count floats on `device` */
    float* grad;         /* count floats on `device`; accumulates until ddp_model_zero_grad */
    int nhooks;
    ddp_grad_hook_fn hooks[DDP_MAX_HOOKS];
    void* hook_user[DDP_MAX_HOOKS];
};

/* Register `fn` to run each time p's gradient becomes final. DDP_ERR_INVALID_ARGUMENT when
   p already has DDP_MAX_HOOKS hooks. */
DDP_API ddp_status ddp_param_add_hook(ddp_param* p, ddp_grad_hook_fn fn, void* user);
/* Remove every hook of p. */
DDP_API void ddp_param_clear_hooks(ddp_param* p);
/* Announce that p->grad is final for this backward: runs p's hooks in registration order.
   ddp_model_backward calls it; a hand-written backward must call it for each parameter. */
DDP_API void ddp_param_grad_ready(ddp_param* p);

typedef enum ddp_layer_kind {
    DDP_LAYER_NONE = 0,
    DDP_LAYER_LINEAR, /* y = x W^T + b, W is [out, in] as in PyTorch */
    DDP_LAYER_RELU,
    DDP_LAYER_GELU    /* the exact (erf) form, PyTorch's default */
} ddp_layer_kind;

typedef struct ddp_model_desc {
    ddp_device device; /* default: DDP_DEVICE_AUTO (a GPU when usable, else the CPU) */
    uint64_t seed;     /* initial weights; the same seed gives the same weights on CPU and GPU */
} ddp_model_desc;

typedef struct ddp_model ddp_model; /* a sequential stack of layers */

/* An empty model on desc->device. DDP_ERR_NO_GPU / DDP_ERR_NOT_BUILT if that device is unusable. */
DDP_API ddp_status ddp_model_create(const ddp_model_desc* desc, ddp_model** out);
/* Append Linear(in, out) with PyTorch's default initialisation, U(-1/sqrt(in), 1/sqrt(in)) for
   weight and bias, drawn from the model's seed. DDP_ERR_INVALID_ARGUMENT if `in` does not match
   the previous layer's width or a size is not positive. */
DDP_API ddp_status ddp_model_add_linear(ddp_model* m, int in, int out);
/* Append an activation (DDP_LAYER_RELU or DDP_LAYER_GELU). DDP_ERR_INVALID_ARGUMENT otherwise. */
DDP_API ddp_status ddp_model_add_activation(ddp_model* m, ddp_layer_kind kind);
/* A multilayer perceptron sizes[0] -> sizes[1] -> ... -> sizes[n-1] with activation `act`
   between the Linear layers (none after the last). Errors as ddp_model_create/_add_linear. */
DDP_API ddp_status ddp_model_mlp(const ddp_model_desc* desc, const int* sizes, int n,
                                 ddp_layer_kind act, ddp_model** out);
/* Free the model and everything on its device. NULL is ignored. */
DDP_API void ddp_model_destroy(ddp_model* m);

/* The model's device, number of parameters, parameter i (NULL outside 0..n-1), input and output
   widths, and its compute stream (NULL on the CPU). */
DDP_API ddp_device ddp_model_device(const ddp_model* m);
DDP_API int ddp_model_num_params(const ddp_model* m);
DDP_API ddp_param* ddp_model_param(ddp_model* m, int i);
DDP_API int ddp_model_in_features(const ddp_model* m);
DDP_API int ddp_model_out_features(const ddp_model* m);
DDP_API ddp_stream* ddp_model_stream(ddp_model* m);
/* Total number of parameter elements. */
DDP_API size_t ddp_model_num_elements(const ddp_model* m);

/* Run the layers on x, a host array [batch, in_features]. The output stays on the model's device
   until read with ddp_model_output. DDP_ERR_INVALID_ARGUMENT for batch < 1 or an empty model. */
DDP_API ddp_status ddp_model_forward(ddp_model* m, const float* x, int batch);
/* Copy the last forward's output [batch, out_features] to the host array `out`. */
DDP_API ddp_status ddp_model_output(ddp_model* m, float* out);
/* Mean softmax cross-entropy of the last forward's output against host labels[batch] (PyTorch's
   F.cross_entropy), written to *loss; also prepares the output gradient for backward.
   DDP_ERR_INVALID_ARGUMENT for a label outside 0..out_features-1; DDP_ERR_STATE before forward. */
DDP_API ddp_status ddp_loss_cross_entropy(ddp_model* m, const int* labels, float* loss);
/* Mean squared error against host targets[batch, out_features] (F.mse_loss); as above. */
DDP_API ddp_status ddp_loss_mse(ddp_model* m, const float* targets, float* loss);
/* Backpropagate the last loss, last layer first, ADDING each gradient into p->grad and calling
   ddp_param_grad_ready(p) as soon as p's gradient is final. DDP_ERR_STATE without a loss. */
DDP_API ddp_status ddp_model_backward(ddp_model* m);
/* Set every p->grad to zero (call once per step, before backward, as optimizer.zero_grad()). */
DDP_API ddp_status ddp_model_zero_grad(ddp_model* m);
/* Accuracy (fraction of argmax == label) and mean cross-entropy over n samples, in batches.
   Either output may be NULL. DDP_ERR_INVALID_ARGUMENT for a label outside 0..out_features-1;
   otherwise errors as ddp_model_forward. */
DDP_API ddp_status ddp_model_evaluate(ddp_model* m, const float* x, const int* labels, int n,
                                      float* accuracy, float* mean_loss);

typedef enum ddp_optim_kind {
    DDP_OPTIM_DEFAULT = 0, /* Adam */
    DDP_SGD,   /* torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay */
    DDP_ADAM,  /* torch.optim.Adam: L2 weight decay added to the gradient */
    DDP_ADAMW  /* torch.optim.AdamW: decoupled weight decay */
} ddp_optim_kind;

typedef struct ddp_optim_desc {
    ddp_optim_kind kind; /* default Adam */
    float lr;            /* default 1e-3 */
    float momentum;      /* SGD; default 0 */
    float dampening;     /* SGD; default 0 */
    int nesterov;        /* SGD; needs momentum > 0 */
    float weight_decay;  /* default 0; AdamW: 0 means PyTorch's default 1e-2 (use Adam for none) */
    float beta1, beta2;  /* Adam/AdamW; default 0.9, 0.999 */
    float eps;           /* Adam/AdamW; default 1e-8 */
} ddp_optim_desc;

typedef struct ddp_optim ddp_optim;
/* An optimizer over every parameter of m, its state on m's device. DDP_ERR_INVALID_ARGUMENT for a
   negative rate, betas outside [0, 1), or nesterov without momentum. */
DDP_API ddp_status ddp_optim_create(ddp_model* m, const ddp_optim_desc* desc, ddp_optim** out);
/* Update every parameter from its gradient: one torch.optim step. DDP_ERR_CUDA on a GPU failure. */
DDP_API ddp_status ddp_optim_step(ddp_optim* o);
/* Steps taken so far. */
DDP_API long ddp_optim_steps(const ddp_optim* o);
/* Free the optimizer and its state. NULL is ignored. */
DDP_API void ddp_optim_destroy(ddp_optim* o);

/* ---------------------------------------------------------------------------------------------- */
/* >>data: data files, train/test split, standardisation, batches                   (chapter 1)  */
/* ---------------------------------------------------------------------------------------------- */

typedef struct ddp_dataset {
    int n;          /* samples */
    int nfeatures;  /* columns of x */
    int nclasses;   /* labels are 0 .. nclasses-1 */
    float* x;       /* [n, nfeatures], host memory */
    int* y;         /* [n], host memory */
} ddp_dataset;

/* Read a CSV file: one header row, then one row per sample whose last column is an integer label
   >= 0. DDP_ERR_IO when it cannot be read, DDP_ERR_DATA_FORMAT (naming line and column) when a
   row is malformed. *out is left empty on error. */
DDP_API ddp_status ddp_dataset_load_csv(const char* path, ddp_dataset* out);
/* Find a bundled data set by name ("wine", "digits"), looking in `dir` when not NULL, else in
   $DDP_DATA_DIR, else examples/data; or load `name` as a path when it ends in ".csv".
   Errors as ddp_dataset_load_csv, with the places it looked in the message. */
DDP_API ddp_status ddp_dataset_load(const char* name, const char* dir, ddp_dataset* out);
/* Shuffle with `seed` and cut ceil(test_fraction * n) samples into *test, the rest into *train
   (scikit-learn's train_test_split rule; a double, as Python computes it: 0.2 of 100 is 20). DDP_ERR_INVALID_ARGUMENT unless 0 < fraction < 1 and
   both parts are non-empty. */
DDP_API ddp_status ddp_dataset_split(const ddp_dataset* all, double test_fraction, uint64_t seed,
                                     ddp_dataset* train, ddp_dataset* test);
/* Scale each feature to mean 0, variance 1 using the TRAINING set's statistics, applied to both
   (test may be NULL): the test set must not leak into training. Constant features become 0. */
DDP_API void ddp_dataset_standardize(ddp_dataset* train, ddp_dataset* test);
/* Copy the samples idx[0..count) into x [count, nfeatures] and y [count]. */
DDP_API void ddp_dataset_gather(const ddp_dataset* d, const int* idx, int count, float* x, int* y);
/* Free a data set's arrays and zero it. */
DDP_API void ddp_dataset_free(ddp_dataset* d);

/* ---------------------------------------------------------------------------------------------- */
/* >>snapshot: checkpoint files                                           (chapter 1; 4 later)   */
/* ---------------------------------------------------------------------------------------------- */

/* Write every parameter of m and `epoch` to `path` atomically: a temporary file, flushed, then
   renamed over the old one, so a crash mid-write leaves the previous checkpoint intact.
   DDP_ERR_IO on failure. */
DDP_API ddp_status ddp_checkpoint_save(ddp_model* m, int epoch, const char* path);
/* Read a checkpoint written by ddp_checkpoint_save into m and *epoch. Verifies the magic,
   version, parameter names and shapes, and a checksum before touching m: DDP_ERR_CHECKPOINT
   for a damaged or mismatched file (m unchanged), DDP_ERR_IO when it cannot be read. */
DDP_API ddp_status ddp_checkpoint_load(ddp_model* m, const char* path, int* epoch);

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* DDP_H_INCLUDED */

/* ============================================================================================== */
/*  You can stop reading here if you only use the library. The implementation follows, in the    */
/*  same section order as the declarations above.                                                 */
/* ============================================================================================== */

#if (defined(DDP_IMPLEMENTATION) || defined(__INTELLISENSE__) || defined(__JETBRAINS_IDE__)) && \
    !defined(DDP__IMPLEMENTED)
#define DDP__IMPLEMENTED

/* ============================================================================================== */
/* >>config: includes, allocation, status table, errors, logging, random numbers   (chapter 1)   */
/* ============================================================================================== */

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h> /* pthread_once, mutexes: the kernel cache is shared by threads */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> /* fstat: refuse a folder given as a data file */
#include <unistd.h>  /* fsync, unlink: atomic checkpoint writes */
#if defined(__GLIBC__) && !defined(__USE_POSIX199309)
#error "ddp.h: POSIX declarations are hidden. Include ddp.h (with DDP_IMPLEMENTATION) before any other header, or compile with -D_POSIX_C_SOURCE=200809L."
#endif

#if defined(DDP_CBLAS)
#include <cblas.h>   /* cblas_sgemm for Linear on the CPU */
#endif

#if !defined(DDP_NO_CUDA)
#define DDP__CUDA 1
/* The CUDA headers use anonymous unions, which -pedantic C99 reports; they are not ours to fix. */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#endif
#if defined(__has_include)
#if !__has_include(<cuda_runtime.h>)
#error "ddp.h: cuda_runtime.h not found. Add -I$CUDA_HOME/include, or define DDP_NO_CUDA for a CPU-only build."
#endif
#endif
#include <cuda_runtime.h> /* memory, streams, events, kernel launch (cudaLibrary*) */
#include <cublas_v2.h>    /* cublasSgemm for Linear on the GPU */
#include <nvrtc.h>        /* compiles the kernel source below to PTX at run time */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
#define DDP__CUDA 0
#endif

#if defined(DDP_MALLOC) != defined(DDP_FREE)
#error "ddp.h: define both DDP_MALLOC and DDP_FREE, or neither"
#endif
#ifndef DDP_MALLOC
#define DDP_MALLOC(n) malloc(n)
#define DDP_FREE(p) free(p)
#endif
#ifndef DDP_ASSERT
#define DDP_ASSERT(c) assert(c)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DDP__PRIVATE static __attribute__((unused))
#define DDP__TLS __thread
#elif defined(_MSC_VER)
#define DDP__PRIVATE static
#define DDP__TLS __declspec(thread)
#else
#define DDP__PRIVATE static
#define DDP__TLS
#endif

#if defined(DDP_STATIC)
#define DDP__DEF DDP__PRIVATE /* static, and no warning for the functions a program never calls */
#else
#define DDP__DEF
#endif

#define DDP__MAX_GPUS 64

/* ---- status table ---------------------------------------------------------------------------- */

#define DDP__STATUS_NAME(name, cause, fix) #name,
#define DDP__STATUS_CAUSE(name, cause, fix) cause,
#define DDP__STATUS_FIX(name, cause, fix) fix,
static const char* const ddp__status_names[] = {DDP__STATUS_TABLE(DDP__STATUS_NAME)};
static const char* const ddp__status_causes[] = {DDP__STATUS_TABLE(DDP__STATUS_CAUSE)};
static const char* const ddp__status_fixes[] = {DDP__STATUS_TABLE(DDP__STATUS_FIX)};
#undef DDP__STATUS_NAME
#undef DDP__STATUS_CAUSE
#undef DDP__STATUS_FIX

DDP__DEF const char* ddp_status_name(ddp_status s) {
    return ((unsigned)s < DDP__STATUS_COUNT) ? ddp__status_names[s] : "DDP_ERR_UNKNOWN";
}
DDP__DEF const char* ddp_status_cause(ddp_status s) {
    return ((unsigned)s < DDP__STATUS_COUNT) ? ddp__status_causes[s] : "an unknown status code";
}
DDP__DEF const char* ddp_status_fix(ddp_status s) {
    return ((unsigned)s < DDP__STATUS_COUNT) ? ddp__status_fixes[s] : "report this as a bug";
}

/* ---- logging ------------------------------------------------------------------------------------ */

/* Process-wide facts every log line needs. rank/world stay 0/1 until the process group exists. */
static struct {
    int rank, world;
    ddp_log_fn log_fn;
    void* log_user;
    int level; /* 0: not read from DDP_DEBUG yet */
} ddp__g = {0, 1, NULL, NULL, 0};

DDP__DEF ddp_log_level ddp_log_level_enabled(void) {
    if (ddp__g.level == 0) {
        const char* v = getenv("DDP_DEBUG");
        int level = DDP_LOG_WARN;
        if (v && (!strcmp(v, "INFO") || !strcmp(v, "info"))) level = DDP_LOG_INFO;
        else if (v && (!strcmp(v, "DETAIL") || !strcmp(v, "detail"))) level = DDP_LOG_DETAIL;
        else if (v && *v && strcmp(v, "OFF") && strcmp(v, "off"))
            fprintf(stderr, "[rank %d/%d] warning: DDP_DEBUG=%s is not OFF, INFO or DETAIL; using OFF\n",
                    ddp__g.rank, ddp__g.world, v);
        ddp__g.level = level;
    }
    return (ddp_log_level)ddp__g.level;
}

DDP__DEF void ddp_set_log(ddp_log_fn fn, void* user) {
    ddp__g.log_fn = fn;
    ddp__g.log_user = user;
}

DDP__PRIVATE void ddp__vlog(ddp_log_level level, const char* fmt, va_list ap) {
    char line[2048];
    int n;
    if ((int)level > (int)ddp_log_level_enabled()) return;
    n = snprintf(line, sizeof line, "[rank %d/%d] %s", ddp__g.rank, ddp__g.world,
                 level == DDP_LOG_ERROR ? "error: " : level == DDP_LOG_WARN ? "warning: " : "");
    if (n < 0 || n >= (int)sizeof line) n = 0;
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (ddp__g.log_fn) ddp__g.log_fn(level, line, ddp__g.log_user);
    else fprintf(stderr, "%s\n", line);
}

DDP__DEF void ddp_log(ddp_log_level level, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ddp__vlog(level, fmt, ap);
    va_end(ap);
}

/* ---- errors ------------------------------------------------------------------------------------- */

/* Per thread, as stb's failure reason: a communication thread's error must not overwrite the
   message the training thread is about to print. */
static DDP__TLS char ddp__err_msg[1536];
static DDP__TLS ddp_status ddp__err_status;

/* Record a failure with a printf-style message and return its status: `return ddp__fail(...)`. */
DDP__PRIVATE ddp_status ddp__fail(ddp_status s, const char* fmt, ...) DDP__PRINTF(2, 3);
DDP__PRIVATE ddp_status ddp__fail(ddp_status s, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ddp__err_msg, sizeof ddp__err_msg, fmt, ap);
    va_end(ap);
    ddp__err_status = s;
    ddp_log(DDP_LOG_INFO, "%s: %s", ddp_status_name(s), ddp__err_msg);
    return s;
}

DDP__DEF const char* ddp_error_string(void) { return ddp__err_msg; }
DDP__DEF ddp_status ddp_last_status(void) { return ddp__err_status; }
DDP__DEF void ddp_clear_error(void) {
    ddp__err_msg[0] = 0;
    ddp__err_status = DDP_OK;
}

DDP__DEF void ddp_check_failed(ddp_status s, const char* call_text, const char* file, int line) {
    fprintf(stderr, "[rank %d/%d] error: %s failed (%s:%d)\n", ddp__g.rank, ddp__g.world,
            call_text, file, line);
    fprintf(stderr, "[rank %d/%d]   %s: %s\n", ddp__g.rank, ddp__g.world, ddp_status_name(s),
            ddp__err_status == s && ddp__err_msg[0] ? ddp__err_msg : ddp_status_cause(s));
    fprintf(stderr, "[rank %d/%d]   fix: %s\n", ddp__g.rank, ddp__g.world, ddp_status_fix(s));
    exit(1);
}

/* Every CUDA, cuBLAS and NVRTC call goes through one of these: the message keeps the call's
   source text, the library's own error name and a likely cause, and the status says which. */
#define DDP__TRY(call)                                                                             \
    do {                                                                                           \
        ddp_status try_s_ = (call);                                                                \
        if (try_s_ != DDP_OK) return try_s_;                                                       \
    } while (0)

#if DDP__CUDA
DDP__PRIVATE const char* ddp__cuda_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
        return "this machine has no usable NVIDIA GPU or driver; run with --device cpu";
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: use a smaller batch or model, or check nvidia-smi for "
               "another process holding the GPU";
    case cudaErrorInvalidDevice:
        return "the device number is not below the number of visible GPUs: pick the GPU with "
               "LOCAL_RANK, not RANK, and check CUDA_VISIBLE_DEVICES";
    case cudaErrorInvalidValue:
        return "an argument is wrong (a NULL or host pointer where a device one is expected?)";
    case cudaErrorIllegalAddress:
        return "a kernel read or wrote outside its buffers; the GPU context is now unusable";
    case cudaErrorLaunchFailure:
        return "a kernel crashed; run with DDP_DEBUG=DETAIL to find which";
    default:
        return "see the CUDA documentation for this error";
    }
}
DDP__PRIVATE ddp_status ddp__fail_cuda(cudaError_t e, const char* call, int line) {
    ddp_status s = (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) ? DDP_ERR_NO_GPU
                                                                                : DDP_ERR_CUDA;
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    return ddp__fail(s, "%s failed (ddp.h:%d): %s (%s); likely cause: %s", call, line,
                     cudaGetErrorName(e), cudaGetErrorString(e), ddp__cuda_hint(e));
}
#define DDP__CU(call)                                                                              \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (cu_e_ != cudaSuccess) return ddp__fail_cuda(cu_e_, #call, __LINE__);                   \
    } while (0)
DDP__PRIVATE ddp_status ddp__fail_cublas(cublasStatus_t e, const char* call, int line) {
    return ddp__fail(DDP_ERR_CUBLAS, "%s failed (ddp.h:%d): %s; likely cause: %s", call, line,
                     cublasGetStatusName(e),
                     e == CUBLAS_STATUS_NOT_INITIALIZED ? "no usable GPU or driver for cuBLAS"
                     : e == CUBLAS_STATUS_ALLOC_FAILED  ? "the GPU is out of memory"
                     : e == CUBLAS_STATUS_INVALID_VALUE ? "a matrix size or leading dimension is wrong"
                                                        : "see the cuBLAS documentation");
}
#define DDP__BLAS(call)                                                                            \
    do {                                                                                           \
        cublasStatus_t bl_e_ = (call);                                                             \
        if (bl_e_ != CUBLAS_STATUS_SUCCESS) return ddp__fail_cublas(bl_e_, #call, __LINE__);       \
    } while (0)
#define DDP__NVRTC(call)                                                                           \
    do {                                                                                           \
        nvrtcResult nv_e_ = (call);                                                                \
        if (nv_e_ != NVRTC_SUCCESS)                                                                \
            return ddp__fail(DDP_ERR_NVRTC, "%s failed (ddp.h:%d): %s", #call, __LINE__,           \
                             nvrtcGetErrorString(nv_e_));                                          \
    } while (0)
#endif

/* ---- build information -------------------------------------------------------------------------- */

DDP__DEF const char* ddp_build_info(void) {
    static char info[256];
    if (!info[0]) {
#if DDP__CUDA
        int rt = 0, nv_major = 0, nv_minor = 0;
        cudaRuntimeGetVersion(&rt);
        nvrtcVersion(&nv_major, &nv_minor);
        snprintf(info, sizeof info, "ddp.h %d.%d.%d: CUDA runtime %d.%d, NVRTC %d.%d, cuBLAS; %s",
                 DDP_VERSION_MAJOR, DDP_VERSION_MINOR, DDP_VERSION_PATCH, rt / 1000,
                 (rt % 1000) / 10, nv_major, nv_minor,
#if defined(DDP_CBLAS)
                 "CPU Linear through CBLAS"
#else
                 "CPU Linear through the built-in blocked loop"
#endif
        );
#else
        snprintf(info, sizeof info, "ddp.h %d.%d.%d: CPU only (DDP_NO_CUDA); %s", DDP_VERSION_MAJOR,
                 DDP_VERSION_MINOR, DDP_VERSION_PATCH,
#if defined(DDP_CBLAS)
                 "CPU Linear through CBLAS"
#else
                 "CPU Linear through the built-in blocked loop"
#endif
        );
#endif
    }
    return info;
}

/* ---- random numbers ----------------------------------------------------------------------------- */

DDP__DEF ddp_rng ddp_rng_seed(uint64_t seed) {
    ddp_rng r;
    r.state = seed;
    return r;
}
DDP__DEF uint64_t ddp_rng_next(ddp_rng* r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull); /* splitmix64 (Steele, Lea, Flood 2014) */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
DDP__DEF float ddp_rng_uniform(ddp_rng* r) {
    return (float)(ddp_rng_next(r) >> 40) * (1.0f / 16777216.0f); /* 24 random mantissa bits */
}
DDP__DEF uint32_t ddp_rng_below(ddp_rng* r, uint32_t n) {
    /* multiply-shift maps 32 random bits onto [0, n) without a division */
    return (uint32_t)(((ddp_rng_next(r) >> 32) * (uint64_t)n) >> 32);
}
DDP__DEF void ddp_permutation(int n, uint64_t seed, int* out) {
    ddp_rng r = ddp_rng_seed(seed);
    int i;
    for (i = 0; i < n; i++) out[i] = i;
    for (i = n - 1; i > 0; i--) {
        int j = (int)ddp_rng_below(&r, (uint32_t)i + 1), t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

DDP__PRIVATE void* ddp__malloc(size_t nbytes) { return nbytes ? DDP_MALLOC(nbytes) : NULL; }
DDP__PRIVATE void* ddp__calloc(size_t nbytes) {
    void* p = ddp__malloc(nbytes);
    if (p) memset(p, 0, nbytes);
    return p;
}

/* ============================================================================================== */
/* >>device: devices, memory, copies, streams, events, dtypes                      (chapter 1)   */
/* ============================================================================================== */

DDP__PRIVATE ddp_device ddp__cpu(void) {
    ddp_device d;
    d.type = DDP_DEVICE_CPU;
    d.index = 0;
    return d;
}

/* The CUDA probe runs once per process: asking the runtime is slow the first time, and its
   answer (no driver, no device) does not change while we run. */
static struct {
    pthread_once_t once;
    int count;
    char reason[256];
} ddp__cuda_probe_state = {PTHREAD_ONCE_INIT, 0, {0}};

static void ddp__cuda_probe(void) {
#if DDP__CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorInsufficientDriver)
            snprintf(ddp__cuda_probe_state.reason, sizeof ddp__cuda_probe_state.reason,
                     "no NVIDIA driver is installed on this machine (CUDA reports %s)",
                     cudaGetErrorName(e));
        else if (e == cudaErrorNoDevice)
            snprintf(ddp__cuda_probe_state.reason, sizeof ddp__cuda_probe_state.reason,
                     "the NVIDIA driver sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
        else
            snprintf(ddp__cuda_probe_state.reason, sizeof ddp__cuda_probe_state.reason,
                     "CUDA could not start: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        n = 0;
    } else if (n == 0) {
        snprintf(ddp__cuda_probe_state.reason, sizeof ddp__cuda_probe_state.reason,
                 "the NVIDIA driver sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
    }
    ddp__cuda_probe_state.count = n;
#else
    snprintf(ddp__cuda_probe_state.reason, sizeof ddp__cuda_probe_state.reason,
             "this program was built without CUDA (DDP_NO_CUDA)");
#endif
}

DDP__DEF int ddp_cuda_device_count(void) {
    pthread_once(&ddp__cuda_probe_state.once, ddp__cuda_probe);
    return ddp__cuda_probe_state.count;
}
DDP__DEF const char* ddp_cuda_unavailable_reason(void) {
    return ddp_cuda_device_count() > 0 ? "" : ddp__cuda_probe_state.reason;
}

DDP__DEF ddp_status ddp_device_parse(const char* text, ddp_device* out) {
    char* end;
    long idx;
    out->type = DDP_DEVICE_AUTO;
    out->index = 0;
    if (!text || !strcmp(text, "auto")) return DDP_OK;
    if (!strcmp(text, "cpu")) { out->type = DDP_DEVICE_CPU; return DDP_OK; }
    if (!strcmp(text, "cuda") || !strcmp(text, "gpu")) { out->type = DDP_DEVICE_CUDA; return DDP_OK; }
    if (!strncmp(text, "cuda:", 5) && isdigit((unsigned char)text[5])) {
        errno = 0;
        idx = strtol(text + 5, &end, 10);
        if (!*end && errno == 0 && idx >= 0 && idx < DDP__MAX_GPUS) {
            out->type = DDP_DEVICE_CUDA;
            out->index = (int)idx;
            return DDP_OK;
        }
    }
    return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                     "device \"%s\" is not one of cpu, cuda, cuda:N (0 <= N < %d) or auto", text,
                     DDP__MAX_GPUS);
}

DDP__DEF ddp_status ddp_device_resolve(ddp_device want, ddp_device* out) {
    int n = ddp_cuda_device_count();
    *out = want;
    if (want.type == DDP_DEVICE_AUTO) {
        if (n > 0) {
            out->type = DDP_DEVICE_CUDA;
            out->index = want.index % n;
        } else {
            out->type = DDP_DEVICE_CPU;
            out->index = 0;
            ddp_log(DDP_LOG_INFO, "no GPU: using the CPU (%s)", ddp_cuda_unavailable_reason());
        }
        return DDP_OK;
    }
    if (want.type == DDP_DEVICE_CPU) { out->index = 0; return DDP_OK; }
#if !DDP__CUDA
    return ddp__fail(DDP_ERR_NOT_BUILT, "device cuda:%d was asked for, but %s", want.index,
                     ddp_cuda_unavailable_reason());
#else
    if (n == 0)
        return ddp__fail(DDP_ERR_NO_GPU, "device cuda:%d was asked for, but %s", want.index,
                         ddp_cuda_unavailable_reason());
    if (want.index < 0 || want.index >= n)
        return ddp__fail(DDP_ERR_NO_GPU,
                         "device cuda:%d was asked for, but only %d GPU%s visible (0..%d): pick "
                         "the GPU with LOCAL_RANK, not RANK, and check CUDA_VISIBLE_DEVICES",
                         want.index, n, n == 1 ? " is" : "s are", n - 1);
    return DDP_OK;
#endif
}

DDP__DEF const char* ddp_device_name(ddp_device d, char* buf, size_t bufsize) {
    if (d.type == DDP_DEVICE_CUDA) snprintf(buf, bufsize, "cuda:%d", d.index);
    else snprintf(buf, bufsize, "%s", d.type == DDP_DEVICE_CPU ? "cpu" : "auto");
    return buf;
}

DDP__DEF ddp_status ddp_device_activate(ddp_device d) {
#if DDP__CUDA
    if (d.type == DDP_DEVICE_CUDA) DDP__CU(cudaSetDevice(d.index));
#else
    (void)d;
#endif
    return DDP_OK;
}

DDP__DEF ddp_status ddp_alloc(ddp_device d, size_t nbytes, void** out) {
    *out = NULL;
    if (nbytes == 0) return DDP_OK;
    if (d.type == DDP_DEVICE_CUDA) {
#if DDP__CUDA
        DDP__TRY(ddp_device_activate(d));
        DDP__CU(cudaMalloc(out, nbytes));
        if (cudaMemset(*out, 0, nbytes) != cudaSuccess) {
            cudaFree(*out);
            *out = NULL;
            return ddp__fail_cuda(cudaGetLastError(), "cudaMemset(new buffer)", __LINE__);
        }
        return DDP_OK;
#else
        return ddp__fail(DDP_ERR_NOT_BUILT, "cannot allocate on a GPU: %s",
                         ddp_cuda_unavailable_reason());
#endif
    }
    *out = ddp__calloc(nbytes);
    if (!*out)
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %zu bytes of host memory failed", nbytes);
    return DDP_OK;
}

DDP__DEF void ddp_free(ddp_device d, void* p) {
    if (!p) return;
#if DDP__CUDA
    if (d.type == DDP_DEVICE_CUDA) {
        cudaSetDevice(d.index);
        cudaFree(p);
        return;
    }
#else
    (void)d;
#endif
    DDP_FREE(p);
}

DDP__DEF ddp_status ddp_alloc_pinned(size_t nbytes, void** out) {
    *out = NULL;
    if (nbytes == 0) return DDP_OK;
#if DDP__CUDA
    if (ddp_cuda_device_count() > 0) {
        DDP__CU(cudaMallocHost(out, nbytes));
        memset(*out, 0, nbytes);
        return DDP_OK;
    }
#endif
    return ddp_alloc(ddp__cpu(), nbytes, out);
}

DDP__DEF void ddp_free_pinned(void* p) {
    if (!p) return;
#if DDP__CUDA
    if (ddp_cuda_device_count() > 0) {
        cudaFreeHost(p);
        return;
    }
#endif
    DDP_FREE(p);
}

DDP__DEF void ddp_free_host(void* p) {
    if (p) DDP_FREE(p);
}

/* On the CPU a stream is a name for "now": work runs as it is issued, in order. */
struct ddp_stream {
    ddp_device dev;
#if DDP__CUDA
    cudaStream_t s;
#endif
};
struct ddp_event {
    ddp_device dev;
#if DDP__CUDA
    cudaEvent_t e;
#endif
};

DDP__DEF ddp_status ddp_stream_create(ddp_device d, ddp_stream** out) {
    ddp_stream* s = (ddp_stream*)ddp__calloc(sizeof *s);
    *out = NULL;
    if (!s) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a stream failed");
    s->dev = d;
#if DDP__CUDA
    if (d.type == DDP_DEVICE_CUDA) {
        cudaError_t e = cudaSetDevice(d.index);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            DDP_FREE(s);
            return ddp__fail_cuda(e, "cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)", __LINE__);
        }
    }
#endif
    *out = s;
    return DDP_OK;
}

DDP__DEF void ddp_stream_destroy(ddp_stream* s) {
    if (!s) return;
#if DDP__CUDA
    if (s->dev.type == DDP_DEVICE_CUDA) {
        cudaSetDevice(s->dev.index);
        cudaStreamSynchronize(s->s);
        cudaStreamDestroy(s->s);
    }
#endif
    DDP_FREE(s);
}

DDP__DEF ddp_status ddp_stream_sync(ddp_stream* s) {
#if DDP__CUDA
    if (s && s->dev.type == DDP_DEVICE_CUDA) DDP__CU(cudaStreamSynchronize(s->s));
#else
    (void)s;
#endif
    return DDP_OK;
}

DDP__DEF void* ddp_stream_native(ddp_stream* s) {
#if DDP__CUDA
    if (s && s->dev.type == DDP_DEVICE_CUDA) return (void*)s->s;
#else
    (void)s;
#endif
    return NULL;
}

DDP__DEF ddp_status ddp_event_create(ddp_device d, ddp_event** out) {
    ddp_event* e = (ddp_event*)ddp__calloc(sizeof *e);
    *out = NULL;
    if (!e) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating an event failed");
    e->dev = d;
#if DDP__CUDA
    if (d.type == DDP_DEVICE_CUDA) {
        cudaError_t c = cudaSetDevice(d.index);
        /* timing off: an event used only for ordering is cheaper to record and wait on */
        if (c == cudaSuccess) c = cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming);
        if (c != cudaSuccess) {
            DDP_FREE(e);
            return ddp__fail_cuda(c, "cudaEventCreateWithFlags(&e, cudaEventDisableTiming)", __LINE__);
        }
    }
#endif
    *out = e;
    return DDP_OK;
}

DDP__DEF void ddp_event_destroy(ddp_event* e) {
    if (!e) return;
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA) cudaEventDestroy(e->e);
#endif
    DDP_FREE(e);
}

DDP__DEF ddp_status ddp_event_record(ddp_event* e, ddp_stream* s) {
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA) DDP__CU(cudaEventRecord(e->e, s ? s->s : 0));
#else
    (void)e;
    (void)s;
#endif
    return DDP_OK;
}

DDP__DEF ddp_status ddp_stream_wait_event(ddp_stream* s, ddp_event* e) {
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA && s && s->dev.type == DDP_DEVICE_CUDA)
        DDP__CU(cudaStreamWaitEvent(s->s, e->e, 0));
#else
    (void)e;
    (void)s;
#endif
    return DDP_OK;
}

DDP__DEF ddp_status ddp_event_sync(ddp_event* e) {
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA) DDP__CU(cudaEventSynchronize(e->e));
#else
    (void)e;
#endif
    return DDP_OK;
}

DDP__DEF ddp_status ddp_event_query(ddp_event* e, int* done) {
    *done = 1;
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA) {
        cudaError_t c = cudaEventQuery(e->e);
        if (c == cudaErrorNotReady) {
            *done = 0;
            return DDP_OK;
        }
        DDP__CU(c);
    }
#else
    (void)e;
#endif
    return DDP_OK;
}

DDP__DEF ddp_status ddp_copy(ddp_device dst_dev, void* dst, ddp_device src_dev, const void* src,
                             size_t nbytes, ddp_stream* s) {
    if (nbytes == 0) return DDP_OK;
    if (dst_dev.type != DDP_DEVICE_CUDA && src_dev.type != DDP_DEVICE_CUDA) {
        memcpy(dst, src, nbytes);
        return DDP_OK;
    }
#if DDP__CUDA
    /* cudaMemcpyDefault: unified addressing tells the runtime which side each pointer is on */
    DDP__TRY(ddp_device_activate(dst_dev.type == DDP_DEVICE_CUDA ? dst_dev : src_dev));
    if (s && s->dev.type == DDP_DEVICE_CUDA)
        DDP__CU(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s->s));
    else
        DDP__CU(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
    return DDP_OK;
#else
    (void)s;
    return ddp__fail(DDP_ERR_NOT_BUILT, "cannot copy to or from a GPU: %s",
                     ddp_cuda_unavailable_reason());
#endif
}

DDP__DEF ddp_status ddp_zero(ddp_device d, void* p, size_t nbytes, ddp_stream* s) {
    if (nbytes == 0) return DDP_OK;
    if (d.type != DDP_DEVICE_CUDA) {
        memset(p, 0, nbytes);
        return DDP_OK;
    }
#if DDP__CUDA
    DDP__TRY(ddp_device_activate(d));
    if (s && s->dev.type == DDP_DEVICE_CUDA) DDP__CU(cudaMemsetAsync(p, 0, nbytes, s->s));
    else DDP__CU(cudaMemset(p, 0, nbytes));
    return DDP_OK;
#else
    (void)s;
    return ddp__fail(DDP_ERR_NOT_BUILT, "cannot clear GPU memory: %s", ddp_cuda_unavailable_reason());
#endif
}

/* ---- dtypes ------------------------------------------------------------------------------------- */

DDP__DEF size_t ddp_dtype_size(ddp_dtype t) {
    switch (t) {
    case DDP_DTYPE_DEFAULT:
    case DDP_F32: return 4;
    case DDP_F16:
    case DDP_BF16: return 2;
    }
    return 0;
}
DDP__DEF const char* ddp_dtype_name(ddp_dtype t) {
    switch (t) {
    case DDP_DTYPE_DEFAULT:
    case DDP_F32: return "f32";
    case DDP_F16: return "f16";
    case DDP_BF16: return "bf16";
    }
    return "?";
}

/* The conversions work on the bit patterns; the GPU kernels (>>kernels) repeat the same steps
   so that a value converts identically on either side. */
DDP__DEF uint16_t ddp_f32_to_f16(float f) {
    uint32_t x, a, sign;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
    if (a < 0x38800000u) {
        /* Below 2^-14 the result is an f16 subnormal, a multiple of 2^-24. Adding 0.5 puts the
           value's multiples of 2^-24 into the low mantissa bits of a float whose exponent is
           fixed, and the FPU's own round-to-nearest-even does the rounding. */
        float g;
        uint32_t r;
        memcpy(&g, &a, 4);
        g += 0.5f;
        memcpy(&r, &g, 4);
        return (uint16_t)(sign | (r - 0x3f000000u));
    }
    /* Normal: re-bias the exponent (127 -> 15, i.e. subtract 112 << 23) and round the 13 bits
       that fall off to nearest, ties to the even result (the +odd term). */
    a += 0xc8000fffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}

DDP__DEF float ddp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return sign ? -f : f;
    }
    if (e == 31) x = sign | 0x7f800000u | (m << 13);
    else x = sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &x, 4);
    return f;
}

DDP__DEF uint16_t ddp_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(x >> 16);
}

DDP__DEF float ddp_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ============================================================================================== */
/* >>kernels: GPU kernels compiled at run time by NVRTC; cuBLAS and CPU matrix products (ch. 1)  */
/* ============================================================================================== */
/*
   Why NVRTC: the kernels below are CUDA C source in a string, compiled when a program first
   uses a GPU. A student's file therefore stays plain C built by `cc` (no nvcc, no second
   compilation unit, no build-system knowledge), and because NVRTC compiles to PTX without a GPU
   or driver, `make test` proves on any machine that every kernel compiles
   (ddp_kernels_compile_ptx). The cost is a compile of a few hundred milliseconds at the first
   GPU use, paid once per process and device. Kernels are launched through the runtime API
   (cudaLibraryLoadData + cudaLaunchKernel), so a program links against cudart and never against
   libcuda directly: the same binary starts, and runs on the CPU, on a machine without a driver.
   Every kernel is a grid-stride loop so that any launch size covers any element count.
*/

/* The kernel list: the name used in the source and the index used to launch it. */
#define DDP__KERNEL_LIST(X)                                                                        \
    X(bias_add) X(bias_grad) X(relu_fwd) X(relu_bwd) X(gelu_fwd) X(gelu_bwd) X(xent) X(mse)        \
    X(sgd) X(adam) X(f32_to_f16) X(f16_to_f32) X(f32_to_bf16) X(bf16_to_f32)

#define DDP__KERNEL_ENUM(name) DDP__K_##name,
enum { DDP__KERNEL_LIST(DDP__KERNEL_ENUM) DDP__K_COUNT };
#undef DDP__KERNEL_ENUM
#define DDP__KERNEL_NAME(name) "ddp_k_" #name,
static const char* const ddp__kernel_names[] = {DDP__KERNEL_LIST(DDP__KERNEL_NAME)};
#undef DDP__KERNEL_NAME

#if DDP__CUDA
/* The kernel source, in pieces (C99 promises string literals only up to 4095 characters);
   ddp__kernel_source_joined() concatenates them for NVRTC. */
static const char* const ddp__kernel_source[] = {
    "#define GRID_LOOP(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;"
    " i < (n); i += (long long)gridDim.x * blockDim.x)\n",
    /* y[r, c] += b[c]: the bias of a Linear layer, broadcast over the batch */
    "extern \"C\" __global__ void ddp_k_bias_add(float* y, const float* b, int rows, int cols) {\n"
    "  GRID_LOOP(i, (long long)rows * cols) y[i] += b[i % cols]; }\n",
    /* db[c] += sum over rows of dy[r, c]: one thread per column, rows summed in order so the
       result is the same on every run */
    "extern \"C\" __global__ void ddp_k_bias_grad(const float* dy, float* db, int rows, int cols) {\n"
    "  GRID_LOOP(c, cols) { float s = 0.f; for (int r = 0; r < rows; r++) s += dy[(long long)r * cols + c];"
    " db[c] += s; } }\n",
    "extern \"C\" __global__ void ddp_k_relu_fwd(const float* x, float* y, long long n) {\n"
    "  GRID_LOOP(i, n) y[i] = x[i] > 0.f ? x[i] : 0.f; }\n",
    /* dx = dy where the output was positive: the output alone decides, no need to keep x */
    "extern \"C\" __global__ void ddp_k_relu_bwd(const float* y, const float* dy, float* dx, long long n) {\n"
    "  GRID_LOOP(i, n) dx[i] = y[i] > 0.f ? dy[i] : 0.f; }\n",
    "extern \"C\" __global__ void ddp_k_gelu_fwd(const float* x, float* y, long long n) {\n"
    "  GRID_LOOP(i, n) y[i] = 0.5f * x[i] * (1.f + erff(x[i] * 0.70710678118654752f)); }\n",
    "extern \"C\" __global__ void ddp_k_gelu_bwd(const float* x, const float* dy, float* dx, long long n) {\n"
    "  GRID_LOOP(i, n) { float v = x[i];\n"
    "    float cdf = 0.5f * (1.f + erff(v * 0.70710678118654752f));\n"
    "    float pdf = 0.39894228040143268f * expf(-0.5f * v * v);\n"
    "    dx[i] = dy[i] * (cdf + v * pdf); } }\n",
    /* softmax cross-entropy, one thread per row: the loss of each row, and the gradient of the
       batch mean, (softmax - onehot) / rows */
    "extern \"C\" __global__ void ddp_k_xent(const float* z, const int* label, float* dz, float* loss,"
    " int rows, int cols) {\n"
    "  GRID_LOOP(r, rows) { const float* zr = z + r * (long long)cols; float* dr = dz + r * (long long)cols;\n"
    "    float mx = zr[0]; for (int c = 1; c < cols; c++) mx = fmaxf(mx, zr[c]);\n"
    "    float s = 0.f; for (int c = 0; c < cols; c++) s += expf(zr[c] - mx);\n"
    "    loss[r] = mx + logf(s) - zr[label[r]];\n"
    "    for (int c = 0; c < cols; c++) dr[c] = (expf(zr[c] - mx) / s - (c == label[r] ? 1.f : 0.f)) / rows; } }\n",
    /* squared error: each row's sum, and the gradient of the mean over rows*cols elements */
    "extern \"C\" __global__ void ddp_k_mse(const float* p, const float* t, float* dp, float* loss,"
    " int rows, int cols) {\n"
    "  GRID_LOOP(r, rows) { float s = 0.f; float k = 2.f / ((float)rows * cols);\n"
    "    for (int c = 0; c < cols; c++) { long long i = r * (long long)cols + c; float d = p[i] - t[i];"
    " s += d * d; dp[i] = k * d; }\n"
    "    loss[r] = s; } }\n",
    /* torch.optim.SGD, one element per thread; `first` is 1 on the first step with momentum,
       when the momentum buffer starts as a copy of the gradient */
    "extern \"C\" __global__ void ddp_k_sgd(float* p, const float* g, float* buf, long long n, float lr,"
    " float momentum, float dampening, float wd, int nesterov, int first) {\n"
    "  GRID_LOOP(i, n) { float d = g[i]; if (wd != 0.f) d += wd * p[i];\n"
    "    if (momentum != 0.f) { float b = first ? d : momentum * buf[i] + (1.f - dampening) * d;"
    " buf[i] = b; d = nesterov ? d + momentum * b : b; }\n"
    "    p[i] -= lr * d; } }\n",
    /* torch.optim.Adam / AdamW in the order PyTorch's single-tensor path computes them */
    "extern \"C\" __global__ void ddp_k_adam(float* p, const float* g, float* m, float* v, long long n,"
    " float lr, float b1, float b2, float eps, float wd, int decoupled, float step_size, float bc2_sqrt) {\n"
    "  GRID_LOOP(i, n) { float d = g[i];\n"
    "    if (decoupled) p[i] *= 1.f - lr * wd; else if (wd != 0.f) d += wd * p[i];\n"
    "    m[i] += (1.f - b1) * (d - m[i]);\n"
    "    v[i] = b2 * v[i] + (1.f - b2) * d * d;\n"
    "    p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps); } }\n",
    /* dtype conversions: the same bit steps as ddp_f32_to_f16 and friends on the CPU */
    "extern \"C\" __global__ void ddp_k_f32_to_f16(const float* s, unsigned short* d, long long n) {\n"
    "  GRID_LOOP(i, n) { unsigned x = __float_as_uint(s[i]); unsigned sg = (x >> 16) & 0x8000u;"
    " unsigned a = x & 0x7fffffffu; unsigned short h;\n"
    "    if (a > 0x7f800000u) h = sg | 0x7e00u | ((a >> 13) & 0x3ffu);\n"
    "    else if (a >= 0x477ff000u) h = sg | 0x7c00u;\n"
    "    else if (a < 0x38800000u) h = sg | (__float_as_uint(__fadd_rn(__uint_as_float(a), 0.5f)) - 0x3f000000u);\n"
    "    else h = sg | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13);\n"
    "    d[i] = h; } }\n",
    "extern \"C\" __global__ void ddp_k_f16_to_f32(const unsigned short* s, float* d, long long n) {\n"
    "  GRID_LOOP(i, n) { unsigned h = s[i]; unsigned sg = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu,"
    " m = h & 0x3ffu;\n"
    "    if (e == 0) { float f = (float)m * 5.9604644775390625e-8f; d[i] = sg ? -f : f; }\n"
    "    else d[i] = __uint_as_float(e == 31 ? (sg | 0x7f800000u | (m << 13)) : (sg | ((e + 112u) << 23) | (m << 13))); } }\n",
    "extern \"C\" __global__ void ddp_k_f32_to_bf16(const float* s, unsigned short* d, long long n) {\n"
    "  GRID_LOOP(i, n) { unsigned x = __float_as_uint(s[i]);\n"
    "    d[i] = (x & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((x >> 16) | 0x40u)"
    " : (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); } }\n",
    "extern \"C\" __global__ void ddp_k_bf16_to_f32(const unsigned short* s, float* d, long long n) {\n"
    "  GRID_LOOP(i, n) d[i] = __uint_as_float((unsigned)s[i] << 16); }\n"
};
#endif

DDP__DEF int ddp_kernel_count(void) { return DDP__CUDA ? (int)DDP__K_COUNT : 0; }
DDP__DEF const char* ddp_kernel_name(int i) {
    return (i >= 0 && i < ddp_kernel_count()) ? ddp__kernel_names[i] : NULL;
}

#if DDP__CUDA
/* Compile the kernel source for one virtual architecture; *ptx is host memory from DDP_MALLOC. */
DDP__PRIVATE ddp_status ddp__nvrtc_compile(const char* arch, char** ptx, size_t* nbytes) {
    nvrtcProgram prog;
    char opt_arch[64];
    const char* opts[2];
    nvrtcResult r;
    *ptx = NULL;
    *nbytes = 0;
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", arch);
    opts[0] = opt_arch;
    opts[1] = "--std=c++17";
    {
        size_t i, total = 1, pos = 0, n = sizeof ddp__kernel_source / sizeof ddp__kernel_source[0];
        char* src;
        for (i = 0; i < n; i++) total += strlen(ddp__kernel_source[i]);
        src = (char*)ddp__malloc(total);
        if (!src) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the kernel source failed");
        for (i = 0; i < n; i++) {
            memcpy(src + pos, ddp__kernel_source[i], strlen(ddp__kernel_source[i]));
            pos += strlen(ddp__kernel_source[i]);
        }
        src[pos] = 0;
        r = nvrtcCreateProgram(&prog, src, "ddp_kernels.cu", 0, NULL, NULL);
        DDP_FREE(src);
        if (r != NVRTC_SUCCESS)
            return ddp__fail(DDP_ERR_NVRTC, "nvrtcCreateProgram failed: %s", nvrtcGetErrorString(r));
    }
    r = nvrtcCompileProgram(prog, 2, opts);
    if (r != NVRTC_SUCCESS) {
        size_t logsize = 0;
        char log[1024] = "";
        if (nvrtcGetProgramLogSize(prog, &logsize) == NVRTC_SUCCESS && logsize > 1) {
            char* full = (char*)ddp__malloc(logsize);
            if (full && nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS)
                snprintf(log, sizeof log, "%s", full);
            if (full) DDP_FREE(full);
        }
        nvrtcDestroyProgram(&prog);
        return ddp__fail(DDP_ERR_NVRTC, "nvrtcCompileProgram(%s) failed: %s; compiler log: %s",
                         arch, nvrtcGetErrorString(r), log);
    }
    r = nvrtcGetPTXSize(prog, nbytes);
    if (r == NVRTC_SUCCESS) {
        *ptx = (char*)ddp__malloc(*nbytes);
        if (!*ptx) {
            nvrtcDestroyProgram(&prog);
            return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %zu bytes for PTX failed", *nbytes);
        }
        r = nvrtcGetPTX(prog, *ptx);
    }
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS) {
        if (*ptx) DDP_FREE(*ptx);
        *ptx = NULL;
        return ddp__fail(DDP_ERR_NVRTC, "reading the PTX for %s failed: %s", arch,
                         nvrtcGetErrorString(r));
    }
    return DDP_OK;
}
#endif

DDP__DEF ddp_status ddp_kernels_compile_ptx(const char* arch, char** ptx, size_t* nbytes) {
#if DDP__CUDA
    return ddp__nvrtc_compile(arch ? arch : "compute_80", ptx, nbytes);
#else
    (void)arch;
    *ptx = NULL;
    *nbytes = 0;
    return ddp__fail(DDP_ERR_NOT_BUILT, "no GPU kernels in a CPU-only build (DDP_NO_CUDA)");
#endif
}

#if DDP__CUDA
/* Loaded kernels, one set per GPU, compiled on first use for that GPU's architecture. */
static struct {
    pthread_mutex_t lock;
    int loaded[DDP__MAX_GPUS];
    cudaLibrary_t lib[DDP__MAX_GPUS];
    cudaKernel_t k[DDP__MAX_GPUS][DDP__K_COUNT];
} ddp__kern = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, {{0}}};

DDP__PRIVATE ddp_status ddp__kernels_load_locked(int dev) {
    int major = 0, minor = 0, narch = 0, best = 0, i, want;
    int archs[128];
    char arch[32], *ptx = NULL;
    size_t nbytes = 0;
    cudaError_t e;
    DDP__CU(cudaSetDevice(dev));
    DDP__CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    DDP__CU(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    /* The newest virtual architecture both NVRTC and this GPU know; the driver finishes the
       compile from PTX for the exact chip. */
    want = major * 10 + minor;
    DDP__NVRTC(nvrtcGetNumSupportedArchs(&narch));
    if (narch > 128) narch = 128;
    DDP__NVRTC(nvrtcGetSupportedArchs(archs));
    for (i = 0; i < narch; i++)
        if (archs[i] <= want && archs[i] > best) best = archs[i];
    if (best == 0)
        return ddp__fail(DDP_ERR_NVRTC, "GPU %d has compute capability %d.%d, older than any "
                         "architecture this NVRTC supports", dev, major, minor);
    snprintf(arch, sizeof arch, "compute_%d", best);
    DDP__TRY(ddp__nvrtc_compile(arch, &ptx, &nbytes));
    e = cudaLibraryLoadData(&ddp__kern.lib[dev], ptx, NULL, NULL, 0, NULL, NULL, 0);
    DDP_FREE(ptx);
    if (e != cudaSuccess) return ddp__fail_cuda(e, "cudaLibraryLoadData(kernels PTX)", __LINE__);
    for (i = 0; i < DDP__K_COUNT; i++)
        DDP__CU(cudaLibraryGetKernel(&ddp__kern.k[dev][i], ddp__kern.lib[dev], ddp__kernel_names[i]));
    ddp__kern.loaded[dev] = 1;
    ddp_log(DDP_LOG_INFO, "compiled %d GPU kernels for cuda:%d (%s)", (int)DDP__K_COUNT, dev, arch);
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__kernels_ready(int dev) {
    ddp_status s = DDP_OK;
    if (dev < 0 || dev >= DDP__MAX_GPUS)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "GPU index %d out of range", dev);
    pthread_mutex_lock(&ddp__kern.lock);
    if (!ddp__kern.loaded[dev]) s = ddp__kernels_load_locked(dev);
    pthread_mutex_unlock(&ddp__kern.lock);
    return s;
}

/* Launch kernel `k` over n elements (a grid-stride loop covers any n) on stream `s`. */
DDP__PRIVATE ddp_status ddp__launch(ddp_device d, ddp_stream* s, int k, long long n, void** args) {
    long long blocks = (n + 255) / 256;
    dim3 grid, block;
    cudaError_t e;
    DDP__TRY(ddp__kernels_ready(d.index));
    if (blocks < 1) blocks = 1;
    if (blocks > 65535) blocks = 65535;
    grid.x = (unsigned)blocks, grid.y = grid.z = 1;
    block.x = 256, block.y = block.z = 1;
    e = cudaLaunchKernel((const void*)ddp__kern.k[d.index][k], grid, block, args, 0, s ? s->s : 0);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaLaunchKernel(%s)", ddp__kernel_names[k]);
        return ddp__fail_cuda(e, what, __LINE__);
    }
    /* DETAIL mode waits for each kernel so an error points at the kernel that caused it. */
    if (ddp_log_level_enabled() >= DDP_LOG_DETAIL) {
        e = cudaStreamSynchronize(s ? s->s : 0);
        if (e != cudaSuccess) {
            char what[96];
            snprintf(what, sizeof what, "%s (synchronised under DDP_DEBUG=DETAIL)", ddp__kernel_names[k]);
            return ddp__fail_cuda(e, what, __LINE__);
        }
    }
    return DDP_OK;
}
#endif

DDP__DEF ddp_status ddp_convert(ddp_device d, ddp_dtype dst_type, void* dst, ddp_dtype src_type,
                                const void* src, size_t count, ddp_stream* s) {
    size_t i;
    if (dst_type == DDP_DTYPE_DEFAULT) dst_type = DDP_F32;
    if (src_type == DDP_DTYPE_DEFAULT) src_type = DDP_F32;
    if (ddp_dtype_size(dst_type) == 0 || ddp_dtype_size(src_type) == 0 ||
        (dst_type != DDP_F32 && src_type != DDP_F32))
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "ddp_convert supports f32 <-> f16 and f32 <-> bf16, not %s -> %s",
                         ddp_dtype_name(src_type), ddp_dtype_name(dst_type));
    if (dst_type == src_type) return ddp_copy(d, dst, d, src, count * ddp_dtype_size(dst_type), s);
    if (d.type == DDP_DEVICE_CUDA) {
#if DDP__CUDA
        long long n = (long long)count;
        int k = dst_type == DDP_F16 ? DDP__K_f32_to_f16 : dst_type == DDP_BF16 ? DDP__K_f32_to_bf16
              : src_type == DDP_F16 ? DDP__K_f16_to_f32 : DDP__K_bf16_to_f32;
        void* args[3];
        args[0] = (void*)&src;
        args[1] = (void*)&dst;
        args[2] = (void*)&n;
        if (count == 0) return DDP_OK;
        return ddp__launch(d, s, k, n, args);
#else
        return ddp__fail(DDP_ERR_NOT_BUILT, "cannot convert on a GPU: %s", ddp_cuda_unavailable_reason());
#endif
    }
    for (i = 0; i < count; i++) {
        if (dst_type == DDP_F16) ((uint16_t*)dst)[i] = ddp_f32_to_f16(((const float*)src)[i]);
        else if (dst_type == DDP_BF16) ((uint16_t*)dst)[i] = ddp_f32_to_bf16(((const float*)src)[i]);
        else if (src_type == DDP_F16) ((float*)dst)[i] = ddp_f16_to_f32(((const uint16_t*)src)[i]);
        else ((float*)dst)[i] = ddp_bf16_to_f32(((const uint16_t*)src)[i]);
    }
    return DDP_OK;
}

/* ---- matrix product: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, row-major ----------- */

/* The built-in CPU product. op(B) is copied block by block into a small contiguous panel, so the
   innermost loop runs over consecutive memory whatever B's layout, and a KC x NC panel
   (64 x 256 floats, 64 KiB) stays in the L2 cache while every row of A streams past it. The
   summation order is fixed, so results repeat exactly from run to run. */
#define DDP__KC 64
#define DDP__NC 256
DDP__PRIVATE void ddp__gemm_loop(int ta, int tb, int M, int N, int K, float alpha, const float* A,
                                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    float panel[DDP__KC * DDP__NC];
    int i, j, jc, pc, kk;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.f ? 0.f : beta * C[(size_t)i * ldc + j];
    for (jc = 0; jc < N; jc += DDP__NC) {
        int nc = N - jc < DDP__NC ? N - jc : DDP__NC;
        for (pc = 0; pc < K; pc += DDP__KC) {
            int kc = K - pc < DDP__KC ? K - pc : DDP__KC;
            for (kk = 0; kk < kc; kk++)
                for (j = 0; j < nc; j++)
                    panel[kk * DDP__NC + j] = tb ? B[(size_t)(jc + j) * ldb + pc + kk]
                                                 : B[(size_t)(pc + kk) * ldb + jc + j];
            for (i = 0; i < M; i++) {
                float* crow = C + (size_t)i * ldc + jc;
                for (kk = 0; kk < kc; kk++) {
                    float a = alpha * (ta ? A[(size_t)(pc + kk) * lda + i] : A[(size_t)i * lda + pc + kk]);
                    const float* prow = panel + kk * DDP__NC;
                    for (j = 0; j < nc; j++) crow[j] += a * prow[j];
                }
            }
        }
    }
}

DDP__PRIVATE void ddp__gemm_cpu(int ta, int tb, int M, int N, int K, float alpha, const float* A,
                                int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    if (M == 0 || N == 0) return;
#if defined(DDP_CBLAS)
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    ddp__gemm_loop(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

/* ============================================================================================== */
/* >>nn: parameters, Linear/ReLU/GELU, losses, optimizers; backward fires the gradient-ready    */
/*       hook (the C analogue of autograd's accumulate-grad hook)                  (chapter 1)   */
/* ============================================================================================== */

typedef struct ddp__layer {
    ddp_layer_kind kind;
    int in, out;        /* widths of the layer's input and output */
    ddp_param* weight;  /* Linear only: [out, in] */
    ddp_param* bias;    /* Linear only: [out] */
} ddp__layer;

struct ddp_model {
    ddp_device device;
    uint64_t seed;
    int nlayers, nlinear, nparams;
    ddp__layer layers[DDP_MAX_LAYERS];
    ddp_param* params[2 * DDP_MAX_LAYERS];
    /* act[i] is layer i's input, act[nlayers] the model's output, each [capacity, width]; kept
       from forward for backward. Grown (never shrunk) when a larger batch arrives, so a steady
       training loop allocates nothing: fresh memory is slow to touch. */
    float* act[DDP_MAX_LAYERS + 1];
    float *grad_a, *grad_b; /* ping-pong gradients of the activations, [capacity, max width] */
    float* row_loss;        /* per-row loss on the device, [capacity] */
    float* host_rows;       /* the same, copied to the host */
    int* labels;            /* device copy of the batch's labels */
    float* targets;         /* device copy of the batch's regression targets */
    int capacity, max_width, batch;
    int have_output, have_loss;
    ddp_stream* stream;
#if DDP__CUDA
    cublasHandle_t blas;
#endif
};

DDP__DEF ddp_status ddp_param_add_hook(ddp_param* p, ddp_grad_hook_fn fn, void* user) {
    if (!fn) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_param_add_hook: fn is NULL");
    if (p->nhooks >= DDP_MAX_HOOKS)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "parameter %s already has %d hooks (DDP_MAX_HOOKS); define DDP_MAX_HOOKS "
                         "larger before including ddp.h", p->name, DDP_MAX_HOOKS);
    p->hooks[p->nhooks] = fn;
    p->hook_user[p->nhooks] = user;
    p->nhooks++;
    return DDP_OK;
}

DDP__DEF void ddp_param_clear_hooks(ddp_param* p) { p->nhooks = 0; }

DDP__DEF void ddp_param_grad_ready(ddp_param* p) {
    int i;
    for (i = 0; i < p->nhooks; i++) p->hooks[i](p, p->hook_user[i]);
}

DDP__DEF ddp_status ddp_model_create(const ddp_model_desc* desc, ddp_model** out) {
    ddp_model* m;
    ddp_device dev, want;
    *out = NULL;
    memset(&want, 0, sizeof want); /* a NULL desc means all defaults: DDP_DEVICE_AUTO */
    if (desc) want = desc->device;
    DDP__TRY(ddp_device_resolve(want, &dev));
    m = (ddp_model*)ddp__calloc(sizeof *m);
    if (!m) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a model failed");
    m->device = dev;
    m->seed = desc ? desc->seed : 0;
    if (ddp_stream_create(dev, &m->stream) != DDP_OK) {
        DDP_FREE(m);
        return ddp_last_status();
    }
#if DDP__CUDA
    if (dev.type == DDP_DEVICE_CUDA) {
        cublasStatus_t b = cublasCreate(&m->blas);
        if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetStream(m->blas, m->stream->s);
        if (b != CUBLAS_STATUS_SUCCESS) {
            ddp_stream_destroy(m->stream);
            DDP_FREE(m);
            return ddp__fail_cublas(b, "cublasCreate/cublasSetStream", __LINE__);
        }
    }
#endif
    *out = m;
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__param_new(ddp_model* m, const char* name, int ndim, int d0, int d1,
                                       float bound, ddp_param** out) {
    ddp_param* p = (ddp_param*)ddp__calloc(sizeof *p);
    float* host;
    ddp_rng r;
    size_t i;
    ddp_status s;
    if (!p) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating parameter %s failed", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->index = m->nparams;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 1;
    p->count = (size_t)d0 * (size_t)p->shape[1];
    p->device = m->device;
    host = (float*)ddp__malloc(p->count * sizeof(float));
    if (!host) {
        DDP_FREE(p);
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating parameter %s failed", name);
    }
    /* Each parameter draws from its own stream, seeded by (model seed, parameter index), on the
       host: the weights do not depend on the device or on how many layers follow. */
    r = ddp_rng_seed(m->seed * 0x100000001B3ull + (uint64_t)p->index * 0x9E3779B97F4A7C15ull + 1);
    for (i = 0; i < p->count; i++) host[i] = (2.f * ddp_rng_uniform(&r) - 1.f) * bound;
    s = ddp_alloc(m->device, p->count * sizeof(float), (void**)&p->data);
    if (s == DDP_OK) s = ddp_alloc(m->device, p->count * sizeof(float), (void**)&p->grad);
    if (s == DDP_OK) s = ddp_copy(m->device, p->data, ddp__cpu(), host, p->count * sizeof(float), NULL);
    DDP_FREE(host);
    if (s != DDP_OK) {
        ddp_free(m->device, p->data);
        ddp_free(m->device, p->grad);
        DDP_FREE(p);
        return s;
    }
    m->params[m->nparams++] = p;
    *out = p;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_add_linear(ddp_model* m, int in, int out) {
    ddp__layer* L;
    char name[32];
    float bound;
    if (in < 1 || out < 1)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "Linear(%d, %d): sizes must be positive", in, out);
    if (m->nlayers >= DDP_MAX_LAYERS)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "the model already has DDP_MAX_LAYERS (%d) layers",
                         DDP_MAX_LAYERS);
    if (m->nlayers > 0 && m->layers[m->nlayers - 1].out != in)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "Linear(%d, %d) follows a layer of width %d: its input size must be %d",
                         in, out, m->layers[m->nlayers - 1].out, m->layers[m->nlayers - 1].out);
    L = &m->layers[m->nlayers];
    memset(L, 0, sizeof *L);
    L->kind = DDP_LAYER_LINEAR;
    L->in = in;
    L->out = out;
    /* PyTorch's nn.Linear default: kaiming_uniform(a=sqrt(5)) for the weight and the same bound,
       1/sqrt(fan_in), for the bias */
    bound = 1.f / sqrtf((float)in);
    snprintf(name, sizeof name, "fc%d.weight", m->nlinear + 1);
    DDP__TRY(ddp__param_new(m, name, 2, out, in, bound, &L->weight));
    snprintf(name, sizeof name, "fc%d.bias", m->nlinear + 1);
    if (ddp__param_new(m, name, 1, out, 1, bound, &L->bias) != DDP_OK) {
        ddp_param* w = m->params[--m->nparams]; /* undo the weight: the layer was not added */
        ddp_free(m->device, w->data);
        ddp_free(m->device, w->grad);
        DDP_FREE(w);
        return ddp_last_status();
    }
    m->nlinear++;
    m->nlayers++;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_add_activation(ddp_model* m, ddp_layer_kind kind) {
    ddp__layer* L;
    if (kind != DDP_LAYER_RELU && kind != DDP_LAYER_GELU)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "activation must be DDP_LAYER_RELU or DDP_LAYER_GELU");
    if (m->nlayers == 0)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "an activation needs a layer before it");
    if (m->nlayers >= DDP_MAX_LAYERS)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "the model already has DDP_MAX_LAYERS (%d) layers",
                         DDP_MAX_LAYERS);
    L = &m->layers[m->nlayers++];
    memset(L, 0, sizeof *L);
    L->kind = kind;
    L->in = L->out = m->layers[m->nlayers - 2].out;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_mlp(const ddp_model_desc* desc, const int* sizes, int n,
                                  ddp_layer_kind act, ddp_model** out) {
    ddp_model* m;
    int i;
    ddp_status s = DDP_OK;
    *out = NULL;
    if (n < 2) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "an MLP needs at least 2 sizes, got %d", n);
    DDP__TRY(ddp_model_create(desc, &m));
    for (i = 0; i + 1 < n && s == DDP_OK; i++) {
        s = ddp_model_add_linear(m, sizes[i], sizes[i + 1]);
        if (s == DDP_OK && i + 2 < n) s = ddp_model_add_activation(m, act);
    }
    if (s != DDP_OK) {
        ddp_model_destroy(m);
        return s;
    }
    *out = m;
    return DDP_OK;
}

DDP__PRIVATE void ddp__model_free_buffers(ddp_model* m) {
    int i;
    for (i = 0; i <= m->nlayers; i++) {
        ddp_free(m->device, m->act[i]);
        m->act[i] = NULL;
    }
    ddp_free(m->device, m->grad_a);
    ddp_free(m->device, m->grad_b);
    ddp_free(m->device, m->row_loss);
    ddp_free(m->device, m->labels);
    ddp_free(m->device, m->targets);
    ddp_free(ddp__cpu(), m->host_rows);
    m->grad_a = m->grad_b = m->row_loss = m->targets = m->host_rows = NULL;
    m->labels = NULL;
    m->capacity = 0;
}

DDP__DEF void ddp_model_destroy(ddp_model* m) {
    int i;
    if (!m) return;
    ddp_stream_sync(m->stream);
    ddp__model_free_buffers(m);
    for (i = 0; i < m->nparams; i++) {
        ddp_free(m->device, m->params[i]->data);
        ddp_free(m->device, m->params[i]->grad);
        DDP_FREE(m->params[i]);
    }
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) cublasDestroy(m->blas);
#endif
    ddp_stream_destroy(m->stream);
    DDP_FREE(m);
}

DDP__DEF ddp_device ddp_model_device(const ddp_model* m) { return m->device; }
DDP__DEF int ddp_model_num_params(const ddp_model* m) { return m->nparams; }
DDP__DEF ddp_param* ddp_model_param(ddp_model* m, int i) {
    return (i >= 0 && i < m->nparams) ? m->params[i] : NULL;
}
DDP__DEF int ddp_model_in_features(const ddp_model* m) { return m->nlayers ? m->layers[0].in : 0; }
DDP__DEF int ddp_model_out_features(const ddp_model* m) {
    return m->nlayers ? m->layers[m->nlayers - 1].out : 0;
}
DDP__DEF ddp_stream* ddp_model_stream(ddp_model* m) {
    return m->device.type == DDP_DEVICE_CUDA ? m->stream : NULL;
}
DDP__DEF size_t ddp_model_num_elements(const ddp_model* m) {
    size_t n = 0;
    int i;
    for (i = 0; i < m->nparams; i++) n += m->params[i]->count;
    return n;
}

/* Make room for a batch of `batch` rows in every activation buffer. */
DDP__PRIVATE ddp_status ddp__model_reserve(ddp_model* m, int batch) {
    int i, w;
    ddp_status s = DDP_OK;
    if (batch <= m->capacity) return DDP_OK;
    DDP__TRY(ddp_stream_sync(m->stream));
    ddp__model_free_buffers(m);
    m->max_width = m->layers[0].in;
    for (i = 0; i < m->nlayers; i++)
        if (m->layers[i].out > m->max_width) m->max_width = m->layers[i].out;
    for (i = 0; i <= m->nlayers && s == DDP_OK; i++) {
        w = i == 0 ? m->layers[0].in : m->layers[i - 1].out;
        s = ddp_alloc(m->device, (size_t)batch * w * sizeof(float), (void**)&m->act[i]);
    }
    if (s == DDP_OK) s = ddp_alloc(m->device, (size_t)batch * m->max_width * sizeof(float), (void**)&m->grad_a);
    if (s == DDP_OK) s = ddp_alloc(m->device, (size_t)batch * m->max_width * sizeof(float), (void**)&m->grad_b);
    if (s == DDP_OK) s = ddp_alloc(m->device, (size_t)batch * sizeof(float), (void**)&m->row_loss);
    if (s == DDP_OK) s = ddp_alloc(m->device, (size_t)batch * sizeof(int), (void**)&m->labels);
    if (s == DDP_OK)
        s = ddp_alloc(m->device, (size_t)batch * ddp_model_out_features(m) * sizeof(float), (void**)&m->targets);
    if (s == DDP_OK) s = ddp_alloc(ddp__cpu(), (size_t)batch * sizeof(float), (void**)&m->host_rows);
    if (s != DDP_OK) {
        ddp__model_free_buffers(m);
        return s;
    }
    m->capacity = batch;
    return DDP_OK;
}

/* C[M,N] = alpha op(A) op(B) + beta C on the model's device (row-major, as the CPU loop). */
DDP__PRIVATE ddp_status ddp__gemm(ddp_model* m, int ta, int tb, int M, int N, int K, float alpha,
                                  const float* A, int lda, const float* B, int ldb, float beta,
                                  float* C, int ldc) {
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) {
        /* cuBLAS is column-major. A row-major matrix read column-major is its transpose, so
           computing C^T = op(B)^T op(A)^T column-major writes C row-major: swap the operands. */
        DDP__BLAS(cublasSgemm(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
        return DDP_OK;
    }
#endif
    (void)m;
    ddp__gemm_cpu(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return DDP_OK;
}

/* GELU's exact form and its derivative, shared by forward and backward on the CPU. */
DDP__PRIVATE float ddp__gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
DDP__PRIVATE float ddp__gelu_grad(float x) {
    return 0.5f * (1.f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x);
}

DDP__DEF ddp_status ddp_model_forward(ddp_model* m, const float* x, int batch) {
    int i;
    size_t r, c;
    if (m->nlayers == 0) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "forward on a model with no layers");
    if (batch < 1) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "forward: batch is %d, must be >= 1", batch);
    DDP__TRY(ddp__model_reserve(m, batch));
    m->batch = batch;
    m->have_output = m->have_loss = 0;
    DDP__TRY(ddp_copy(m->device, m->act[0], ddp__cpu(), x, (size_t)batch * m->layers[0].in * sizeof(float),
                      m->stream));
    for (i = 0; i < m->nlayers; i++) {
        const ddp__layer* L = &m->layers[i];
        const float* in = m->act[i];
        float* out = m->act[i + 1];
        long long n = (long long)batch * L->out;
        if (L->kind == DDP_LAYER_LINEAR) {
            /* out[B, out] = in[B, in] . W^T, then + b on every row */
            DDP__TRY(ddp__gemm(m, 0, 1, batch, L->out, L->in, 1.f, in, L->in, L->weight->data, L->in, 0.f,
                               out, L->out));
#if DDP__CUDA
            if (m->device.type == DDP_DEVICE_CUDA) {
                void* args[4];
                int rows = batch, cols = L->out;
                args[0] = (void*)&out;
                args[1] = (void*)&L->bias->data;
                args[2] = (void*)&rows;
                args[3] = (void*)&cols;
                DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_bias_add, n, args));
                continue;
            }
#endif
            for (r = 0; r < (size_t)batch; r++)
                for (c = 0; c < (size_t)L->out; c++) out[r * L->out + c] += L->bias->data[c];
        } else {
#if DDP__CUDA
            if (m->device.type == DDP_DEVICE_CUDA) {
                void* args[3];
                args[0] = (void*)&in;
                args[1] = (void*)&out;
                args[2] = (void*)&n;
                DDP__TRY(ddp__launch(m->device, m->stream,
                                     L->kind == DDP_LAYER_RELU ? DDP__K_relu_fwd : DDP__K_gelu_fwd, n, args));
                continue;
            }
#endif
            for (r = 0; r < (size_t)n; r++)
                out[r] = L->kind == DDP_LAYER_RELU ? (in[r] > 0.f ? in[r] : 0.f) : ddp__gelu(in[r]);
        }
    }
    m->have_output = 1;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_output(ddp_model* m, float* out) {
    if (!m->have_output) return ddp__fail(DDP_ERR_STATE, "ddp_model_output before ddp_model_forward");
    DDP__TRY(ddp_copy(ddp__cpu(), out, m->device, m->act[m->nlayers],
                      (size_t)m->batch * ddp_model_out_features(m) * sizeof(float), m->stream));
    return ddp_stream_sync(m->stream);
}

/* Sum the per-row losses (on the host, in double, in row order) and divide by `denominator`. */
DDP__PRIVATE ddp_status ddp__sum_rows(ddp_model* m, double denominator, float* loss) {
    double sum = 0;
    int r;
    DDP__TRY(ddp_copy(ddp__cpu(), m->host_rows, m->device, m->row_loss, (size_t)m->batch * sizeof(float),
                      m->stream));
    DDP__TRY(ddp_stream_sync(m->stream));
    for (r = 0; r < m->batch; r++) sum += m->host_rows[r];
    *loss = (float)(sum / denominator);
    return DDP_OK;
}

DDP__DEF ddp_status ddp_loss_cross_entropy(ddp_model* m, const int* labels, float* loss) {
    int B = m->batch, C = ddp_model_out_features(m), r, c;
    const float* z = m->act[m->nlayers];
    float* dz = m->grad_a;
    if (!m->have_output) return ddp__fail(DDP_ERR_STATE, "the loss needs a ddp_model_forward first");
    for (r = 0; r < B; r++)
        if (labels[r] < 0 || labels[r] >= C)
            return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                             "label %d of sample %d is outside 0..%d (the model has %d outputs): "
                             "the last layer's width must equal the number of classes", labels[r], r,
                             C - 1, C);
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) {
        void* args[6];
        DDP__TRY(ddp_copy(m->device, m->labels, ddp__cpu(), labels, (size_t)B * sizeof(int), m->stream));
        args[0] = (void*)&z;
        args[1] = (void*)&m->labels;
        args[2] = (void*)&dz;
        args[3] = (void*)&m->row_loss;
        args[4] = (void*)&B;
        args[5] = (void*)&C;
        DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_xent, B, args));
        DDP__TRY(ddp__sum_rows(m, B, loss));
        m->have_loss = 1;
        return DDP_OK;
    }
#endif
    for (r = 0; r < B; r++) {
        const float* zr = z + (size_t)r * C;
        float* dr = dz + (size_t)r * C;
        float mx = zr[0], s = 0.f;
        for (c = 1; c < C; c++) mx = zr[c] > mx ? zr[c] : mx;
        for (c = 0; c < C; c++) s += expf(zr[c] - mx); /* shifted by the max: exp cannot overflow */
        m->row_loss[r] = mx + logf(s) - zr[labels[r]];
        for (c = 0; c < C; c++) dr[c] = (expf(zr[c] - mx) / s - (c == labels[r] ? 1.f : 0.f)) / (float)B;
    }
    DDP__TRY(ddp__sum_rows(m, B, loss));
    m->have_loss = 1;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_loss_mse(ddp_model* m, const float* targets, float* loss) {
    int B = m->batch, C = ddp_model_out_features(m), r, c;
    const float* p = m->act[m->nlayers];
    float* dp = m->grad_a;
    if (!m->have_output) return ddp__fail(DDP_ERR_STATE, "the loss needs a ddp_model_forward first");
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) {
        void* args[6];
        DDP__TRY(ddp_copy(m->device, m->targets, ddp__cpu(), targets, (size_t)B * C * sizeof(float), m->stream));
        args[0] = (void*)&p;
        args[1] = (void*)&m->targets;
        args[2] = (void*)&dp;
        args[3] = (void*)&m->row_loss;
        args[4] = (void*)&B;
        args[5] = (void*)&C;
        DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_mse, B, args));
        DDP__TRY(ddp__sum_rows(m, (double)B * C, loss));
        m->have_loss = 1;
        return DDP_OK;
    }
#endif
    for (r = 0; r < B; r++) {
        float s = 0.f, k = 2.f / ((float)B * C);
        for (c = 0; c < C; c++) {
            size_t i = (size_t)r * C + c;
            float d = p[i] - targets[i];
            s += d * d;
            dp[i] = k * d;
        }
        m->row_loss[r] = s;
    }
    DDP__TRY(ddp__sum_rows(m, (double)B * C, loss));
    m->have_loss = 1;
    return DDP_OK;
}

/* db[c] += sum over rows of g[r, c] */
DDP__PRIVATE ddp_status ddp__bias_grad(ddp_model* m, const float* g, ddp_param* b, int rows, int cols) {
    int r, c;
    (void)m;
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) {
        void* args[4];
        args[0] = (void*)&g;
        args[1] = (void*)&b->grad;
        args[2] = (void*)&rows;
        args[3] = (void*)&cols;
        return ddp__launch(m->device, m->stream, DDP__K_bias_grad, cols, args);
    }
#endif
    for (c = 0; c < cols; c++) {
        float s = 0.f;
        for (r = 0; r < rows; r++) s += g[(size_t)r * cols + c];
        b->grad[c] += s;
    }
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_backward(ddp_model* m) {
    int i, B = m->batch;
    float *g = m->grad_a, *gnext = m->grad_b, *t;
    if (!m->have_loss) return ddp__fail(DDP_ERR_STATE, "backward needs forward and a loss first");
    m->have_loss = 0; /* one backward per loss, as autograd frees the graph after backward */
    for (i = m->nlayers - 1; i >= 0; i--) {
        const ddp__layer* L = &m->layers[i];
        long long n = (long long)B * L->in;
        if (L->kind == DDP_LAYER_LINEAR) {
            /* dW[out, in] += g[B, out]^T . x[B, in];  db[out] += column sums of g */
            DDP__TRY(ddp__gemm(m, 1, 0, L->out, L->in, B, 1.f, g, L->out, m->act[i], L->in, 1.f,
                               L->weight->grad, L->in));
            DDP__TRY(ddp__bias_grad(m, g, L->bias, B, L->out));
            /* Both gradients of this layer are final now: announce them (bias first, so the
               order is exactly the reverse of registration) before computing the input
               gradient, so a hook's communication can overlap the rest of backward. */
            ddp_param_grad_ready(L->bias);
            ddp_param_grad_ready(L->weight);
            if (i == 0) break; /* nobody needs the gradient of the input data */
            /* dx[B, in] = g[B, out] . W[out, in] */
            DDP__TRY(ddp__gemm(m, 0, 0, B, L->in, L->out, 1.f, g, L->out, L->weight->data, L->in, 0.f,
                               gnext, L->in));
        } else {
            const float* keep = L->kind == DDP_LAYER_RELU ? m->act[i + 1] : m->act[i];
#if DDP__CUDA
            if (m->device.type == DDP_DEVICE_CUDA) {
                void* args[4];
                args[0] = (void*)&keep;
                args[1] = (void*)&g;
                args[2] = (void*)&gnext;
                args[3] = (void*)&n;
                DDP__TRY(ddp__launch(m->device, m->stream,
                                     L->kind == DDP_LAYER_RELU ? DDP__K_relu_bwd : DDP__K_gelu_bwd, n, args));
                t = g, g = gnext, gnext = t;
                continue;
            }
#endif
            {
                long long k;
                for (k = 0; k < n; k++)
                    gnext[k] = L->kind == DDP_LAYER_RELU ? (keep[k] > 0.f ? g[k] : 0.f)
                                                         : g[k] * ddp__gelu_grad(keep[k]);
            }
        }
        t = g, g = gnext, gnext = t;
    }
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_zero_grad(ddp_model* m) {
    int i;
    for (i = 0; i < m->nparams; i++)
        DDP__TRY(ddp_zero(m->device, m->params[i]->grad, m->params[i]->count * sizeof(float), m->stream));
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_evaluate(ddp_model* m, const float* x, const int* labels, int n,
                                       float* accuracy, float* mean_loss) {
    int start, C = ddp_model_out_features(m), in = ddp_model_in_features(m), correct = 0;
    double loss_sum = 0;
    float* out;
    const int chunk = 256;
    if (n < 1) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "evaluate: n is %d, must be >= 1", n);
    for (start = 0; start < n; start++)
        if (labels[start] < 0 || labels[start] >= C)
            return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                             "evaluate: label %d of sample %d is outside 0..%d (the model has %d outputs)",
                             labels[start], start, C - 1, C);
    out = (float*)ddp__malloc((size_t)chunk * C * sizeof(float));
    if (!out) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "evaluate: allocating outputs failed");
    for (start = 0; start < n; start += chunk) {
        int b = n - start < chunk ? n - start : chunk, r, c;
        ddp_status s = ddp_model_forward(m, x + (size_t)start * in, b);
        if (s == DDP_OK) s = ddp_model_output(m, out);
        if (s != DDP_OK) {
            DDP_FREE(out);
            return s;
        }
        for (r = 0; r < b; r++) {
            const float* z = out + (size_t)r * C;
            int best = 0, y = labels[start + r];
            double mx = z[0], sum = 0;
            for (c = 1; c < C; c++) {
                if (z[c] > z[best]) best = c;
                if (z[c] > mx) mx = z[c];
            }
            for (c = 0; c < C; c++) sum += exp(z[c] - mx);
            correct += best == y;
            loss_sum += mx + log(sum) - z[y];
        }
    }
    DDP_FREE(out);
    m->have_output = 0;
    if (accuracy) *accuracy = (float)correct / (float)n;
    if (mean_loss) *mean_loss = (float)(loss_sum / n);
    return DDP_OK;
}

/* ---- optimizers --------------------------------------------------------------------------------- */

struct ddp_optim {
    ddp_model* m;
    ddp_optim_desc d; /* resolved: every default filled in */
    long steps;
    float* state1[2 * DDP_MAX_LAYERS]; /* SGD momentum buffer, or Adam's first moment */
    float* state2[2 * DDP_MAX_LAYERS]; /* Adam's second moment */
};

DDP__DEF ddp_status ddp_optim_create(ddp_model* m, const ddp_optim_desc* desc, ddp_optim** out) {
    ddp_optim* o;
    ddp_optim_desc d;
    int i;
    ddp_status s = DDP_OK;
    *out = NULL;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.kind == DDP_OPTIM_DEFAULT) d.kind = DDP_ADAM;
    if (d.kind != DDP_SGD && d.kind != DDP_ADAM && d.kind != DDP_ADAMW)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_optim_desc.kind %d is not DDP_SGD, DDP_ADAM or DDP_ADAMW",
                         (int)d.kind);
    if (d.lr == 0.f) d.lr = 1e-3f;
    if (d.beta1 == 0.f) d.beta1 = 0.9f;
    if (d.beta2 == 0.f) d.beta2 = 0.999f;
    if (d.eps == 0.f) d.eps = 1e-8f;
    if (d.kind == DDP_ADAMW && d.weight_decay == 0.f) d.weight_decay = 1e-2f;
    if (!(d.lr > 0.f) || d.weight_decay < 0.f || d.momentum < 0.f || !(d.eps > 0.f))
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "ddp_optim_desc: lr (%g) must be > 0, eps (%g) > 0, weight_decay (%g) and "
                         "momentum (%g) >= 0", d.lr, d.eps, d.weight_decay, d.momentum);
    if (d.beta1 < 0.f || d.beta1 >= 1.f || d.beta2 < 0.f || d.beta2 >= 1.f)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_optim_desc: beta1 (%g) and beta2 (%g) must be in [0, 1)",
                         d.beta1, d.beta2);
    if (d.nesterov && (d.momentum <= 0.f || d.dampening != 0.f))
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "ddp_optim_desc: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
    o = (ddp_optim*)ddp__calloc(sizeof *o);
    if (!o) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating an optimizer failed");
    o->m = m;
    o->d = d;
    for (i = 0; i < m->nparams && s == DDP_OK; i++) {
        size_t nb = m->params[i]->count * sizeof(float);
        if (d.kind != DDP_SGD || d.momentum != 0.f) s = ddp_alloc(m->device, nb, (void**)&o->state1[i]);
        if (s == DDP_OK && d.kind != DDP_SGD) s = ddp_alloc(m->device, nb, (void**)&o->state2[i]);
    }
    if (s != DDP_OK) {
        ddp_optim_destroy(o);
        return s;
    }
    *out = o;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_optim_step(ddp_optim* o) {
    const ddp_optim_desc* d = &o->d;
    ddp_model* m = o->m;
    int i, first;
    float step_size = 0.f, bc2_sqrt = 1.f;
    o->steps++;
    first = o->steps == 1;
    if (d->kind != DDP_SGD) {
        /* bias corrections in double, as PyTorch computes them with Python floats */
        double bc1 = 1.0 - pow((double)d->beta1, (double)o->steps);
        double bc2 = 1.0 - pow((double)d->beta2, (double)o->steps);
        step_size = (float)(d->lr / bc1);
        bc2_sqrt = (float)sqrt(bc2);
    }
    for (i = 0; i < m->nparams; i++) {
        ddp_param* p = m->params[i];
        float *w = p->data, *g = p->grad, *s1 = o->state1[i], *s2 = o->state2[i];
        long long n = (long long)p->count, k;
#if DDP__CUDA
        if (m->device.type == DDP_DEVICE_CUDA) {
            if (d->kind == DDP_SGD) {
                void* args[10];
                args[0] = (void*)&w; args[1] = (void*)&g; args[2] = (void*)&s1; args[3] = (void*)&n;
                args[4] = (void*)&d->lr; args[5] = (void*)&d->momentum; args[6] = (void*)&d->dampening;
                args[7] = (void*)&d->weight_decay; args[8] = (void*)&d->nesterov; args[9] = (void*)&first;
                DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_sgd, n, args));
            } else {
                void* args[13];
                int decoupled = d->kind == DDP_ADAMW;
                args[0] = (void*)&w; args[1] = (void*)&g; args[2] = (void*)&s1; args[3] = (void*)&s2;
                args[4] = (void*)&n; args[5] = (void*)&d->lr; args[6] = (void*)&d->beta1;
                args[7] = (void*)&d->beta2; args[8] = (void*)&d->eps; args[9] = (void*)&d->weight_decay;
                args[10] = (void*)&decoupled; args[11] = (void*)&step_size; args[12] = (void*)&bc2_sqrt;
                DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_adam, n, args));
            }
            continue;
        }
#endif
        if (d->kind == DDP_SGD) {
            for (k = 0; k < n; k++) {
                float gr = g[k];
                if (d->weight_decay != 0.f) gr += d->weight_decay * w[k];
                if (d->momentum != 0.f) {
                    float b = first ? gr : d->momentum * s1[k] + (1.f - d->dampening) * gr;
                    s1[k] = b;
                    gr = d->nesterov ? gr + d->momentum * b : b;
                }
                w[k] -= d->lr * gr;
            }
        } else {
            for (k = 0; k < n; k++) {
                float gr = g[k];
                if (d->kind == DDP_ADAMW) w[k] *= 1.f - d->lr * d->weight_decay;
                else if (d->weight_decay != 0.f) gr += d->weight_decay * w[k];
                s1[k] += (1.f - d->beta1) * (gr - s1[k]); /* PyTorch's lerp form of the first moment */
                s2[k] = d->beta2 * s2[k] + (1.f - d->beta2) * gr * gr;
                w[k] -= step_size * s1[k] / (sqrtf(s2[k]) / bc2_sqrt + d->eps);
            }
        }
    }
    return DDP_OK;
}

DDP__DEF long ddp_optim_steps(const ddp_optim* o) { return o->steps; }

DDP__DEF void ddp_optim_destroy(ddp_optim* o) {
    int i;
    if (!o) return;
    for (i = 0; i < o->m->nparams; i++) {
        ddp_free(o->m->device, o->state1[i]);
        ddp_free(o->m->device, o->state2[i]);
    }
    DDP_FREE(o);
}

/* ============================================================================================== */
/* >>data: data files, train/test split, standardisation, batches                  (chapter 1)   */
/*         (the distributed sampler joins this section in chapter 2)                             */
/* ============================================================================================== */

DDP__DEF void ddp_dataset_free(ddp_dataset* d) {
    if (!d) return;
    if (d->x) DDP_FREE(d->x);
    if (d->y) DDP_FREE(d->y);
    memset(d, 0, sizeof *d);
}

/* The largest data file we agree to read: far above the bundled sets, far below a mistake such
   as pointing the loader at a disk image. */
#ifndef DDP_MAX_DATA_FILE
#define DDP_MAX_DATA_FILE ((size_t)1 << 30)
#endif

/* Read a whole file into a NUL-terminated buffer. */
DDP__PRIVATE ddp_status ddp__read_file(const char* path, size_t limit, char** out, size_t* size) {
    FILE* f = fopen(path, "rb");
    long len;
    char* buf;
    *out = NULL;
    struct stat st;
    if (!f) return ddp__fail(DDP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return ddp__fail(DDP_ERR_IO, "cannot read %s: it is not a regular file (a folder?)", path);
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return ddp__fail(DDP_ERR_IO, "cannot read %s: it is not a regular file", path);
    }
    if ((size_t)len > limit) {
        fclose(f);
        return ddp__fail(DDP_ERR_IO, "%s is %ld bytes, more than the limit of %zu", path, len, limit);
    }
    buf = (char*)ddp__malloc((size_t)len + 1);
    if (!buf) {
        fclose(f);
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %ld bytes for %s failed", len + 1, path);
    }
    if (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        DDP_FREE(buf);
        fclose(f);
        return ddp__fail(DDP_ERR_IO, "reading %s failed: %s", path, strerror(errno));
    }
    fclose(f);
    buf[len] = 0;
    *out = buf;
    *size = (size_t)len;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_dataset_load_csv(const char* path, ddp_dataset* out) {
    char *text, *p, *line, *next;
    size_t size;
    int ncols = 1, rows = 0, r, lineno = 1, maxlabel = -1;
    ddp_dataset d;
    memset(out, 0, sizeof *out);
    memset(&d, 0, sizeof d);
    DDP__TRY(ddp__read_file(path, DDP_MAX_DATA_FILE, &text, &size));
    if (memchr(text, 0, size))
        return DDP_FREE(text), ddp__fail(DDP_ERR_DATA_FORMAT, "%s is not a text file (it has NUL bytes)", path);
    /* header: count its columns */
    for (p = text; *p && *p != '\n'; p++) ncols += *p == ',';
    if (!*text || ncols < 2) {
        DDP_FREE(text);
        return ddp__fail(DDP_ERR_DATA_FORMAT,
                         "%s:1: expected a header of at least two comma-separated columns (features, "
                         "then label)", path);
    }
    /* count the data rows (non-empty lines after the header) */
    for (line = strchr(text, '\n'); line; line = strchr(line + 1, '\n'))
        if (line[1] && line[1] != '\n' && line[1] != '\r') rows++;
    if (rows == 0) {
        DDP_FREE(text);
        return ddp__fail(DDP_ERR_DATA_FORMAT, "%s: the header is there but no data rows follow", path);
    }
    d.n = rows;
    d.nfeatures = ncols - 1;
    d.x = (float*)ddp__malloc((size_t)rows * d.nfeatures * sizeof(float));
    d.y = (int*)ddp__malloc((size_t)rows * sizeof(int));
    if (!d.x || !d.y) {
        DDP_FREE(text);
        ddp_dataset_free(&d);
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %d x %d values for %s failed", rows, ncols, path);
    }
    r = 0;
    line = strchr(text, '\n');
    while (line && r < rows) {
        int col = 0;
        line++;
        lineno++;
        next = strchr(line, '\n');
        if (next) *next = 0;
        if (*line == 0 || *line == '\r') {
            line = next;
            continue;
        }
        p = line;
        for (col = 0; col < ncols; col++) {
            char* end;
            double v;
            errno = 0;
            v = strtod(p, &end);
            while (*end == ' ' || *end == '\t' || *end == '\r') end++;
            /* a number, finite also as a float (no nan, inf or 1e39), ending at a comma or the end */
            if (end == p || (*end != ',' && *end != 0) || errno == ERANGE || v != v ||
                fabs(v) > 3.4028234663852886e38) {
                char field[32];
                size_t k = 0;
                while (p[k] && p[k] != ',' && p[k] != '\r' && k + 1 < sizeof field) field[k] = p[k], k++;
                field[k] = 0;
                DDP_FREE(text);
                ddp_dataset_free(&d);
                return ddp__fail(DDP_ERR_DATA_FORMAT, "%s:%d: column %d is \"%s\", not a finite number", path,
                                 lineno, col + 1, field);
            }
            if ((*end == 0) != (col == ncols - 1)) {
                DDP_FREE(text);
                ddp_dataset_free(&d);
                return ddp__fail(DDP_ERR_DATA_FORMAT, "%s:%d: %s columns, the header has %d", path, lineno,
                                 col < ncols - 1 ? "fewer" : "more", ncols);
            }
            if (col < ncols - 1) {
                d.x[(size_t)r * d.nfeatures + col] = (float)v;
            } else {
                if (v != floor(v) || v < 0 || v > 65535) {
                    DDP_FREE(text);
                    ddp_dataset_free(&d);
                    return ddp__fail(DDP_ERR_DATA_FORMAT,
                                     "%s:%d: the label (last column) is %g; labels are whole numbers 0..65535",
                                     path, lineno, v);
                }
                d.y[r] = (int)v;
                if (d.y[r] > maxlabel) maxlabel = d.y[r];
            }
            p = end + 1;
        }
        r++;
        line = next;
    }
    DDP_FREE(text);
    d.nclasses = maxlabel + 1;
    *out = d;
    ddp_log(DDP_LOG_INFO, "loaded %s: %d samples, %d features, %d classes", path, d.n, d.nfeatures, d.nclasses);
    return DDP_OK;
}

DDP__DEF ddp_status ddp_dataset_load(const char* name, const char* dir, ddp_dataset* out) {
    char path[1024];
    size_t len = name ? strlen(name) : 0;
    const char* env = getenv("DDP_DATA_DIR");
    ddp_status s;
    memset(out, 0, sizeof *out); /* empty on every error, as ddp_dataset_load_csv */
    if (!name) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_dataset_load: name is NULL");
    if (len > 4 && !strcmp(name + len - 4, ".csv")) return ddp_dataset_load_csv(name, out);
    if (strchr(name, '/') || len == 0 || len > 64)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "data set \"%s\" is neither a bundled name (wine, digits) nor a .csv path", name);
    if (!dir) dir = (env && *env) ? env : "examples/data";
    snprintf(path, sizeof path, "%s/%s.csv", dir, name);
    s = ddp_dataset_load_csv(path, out);
    if (s == DDP_ERR_IO) {
        char first[sizeof ddp__err_msg];
        memcpy(first, ddp__err_msg, sizeof first);
        return ddp__fail(DDP_ERR_IO,
                         "%s. The bundled data sets are wine and digits in examples/data: run from "
                         "the repository's top folder, or set DDP_DATA_DIR (or --data-dir) to that "
                         "folder", first);
    }
    return s;
}

DDP__DEF ddp_status ddp_dataset_split(const ddp_dataset* all, double test_fraction, uint64_t seed,
                                      ddp_dataset* train, ddp_dataset* test) {
    int ntest, ntrain, *perm;
    ddp_dataset parts[2];
    int k;
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    if (!(test_fraction > 0.0 && test_fraction < 1.0))
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "test_fraction is %g; it must be between 0 and 1",
                         test_fraction);
    ntest = (int)ceil(test_fraction * all->n);
    ntrain = all->n - ntest;
    if (ntest < 1 || ntrain < 1)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "splitting %d samples with test_fraction %g leaves an empty part", all->n,
                         test_fraction);
    perm = (int*)ddp__malloc((size_t)all->n * sizeof(int));
    if (!perm) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a permutation failed");
    ddp_permutation(all->n, seed, perm);
    for (k = 0; k < 2; k++) {
        ddp_dataset* d = &parts[k];
        d->n = k == 0 ? ntest : ntrain;
        d->nfeatures = all->nfeatures;
        d->nclasses = all->nclasses;
        d->x = (float*)ddp__malloc((size_t)d->n * d->nfeatures * sizeof(float));
        d->y = (int*)ddp__malloc((size_t)d->n * sizeof(int));
        if (!d->x || !d->y) {
            if (k == 1) ddp_dataset_free(&parts[0]);
            ddp_dataset_free(d);
            DDP_FREE(perm);
            return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the split failed");
        }
        ddp_dataset_gather(all, perm + (k == 0 ? 0 : ntest), d->n, d->x, d->y);
    }
    DDP_FREE(perm);
    *test = parts[0];
    *train = parts[1];
    return DDP_OK;
}

DDP__DEF void ddp_dataset_standardize(ddp_dataset* train, ddp_dataset* test) {
    int j, i, f = train->nfeatures;
    for (j = 0; j < f; j++) {
        double mean = 0, var = 0, sd;
        for (i = 0; i < train->n; i++) mean += train->x[(size_t)i * f + j];
        mean /= train->n;
        for (i = 0; i < train->n; i++) {
            double dv = train->x[(size_t)i * f + j] - mean;
            var += dv * dv;
        }
        sd = sqrt(var / train->n); /* population deviation, as scikit-learn's StandardScaler */
        if (sd == 0) sd = 1;       /* a constant feature carries no information: map it to 0 */
        for (i = 0; i < train->n; i++)
            train->x[(size_t)i * f + j] = (float)((train->x[(size_t)i * f + j] - mean) / sd);
        if (test)
            for (i = 0; i < test->n; i++)
                test->x[(size_t)i * f + j] = (float)((test->x[(size_t)i * f + j] - mean) / sd);
    }
}

DDP__DEF void ddp_dataset_gather(const ddp_dataset* d, const int* idx, int count, float* x, int* y) {
    int i;
    for (i = 0; i < count; i++) {
        memcpy(x + (size_t)i * d->nfeatures, d->x + (size_t)idx[i] * d->nfeatures,
               (size_t)d->nfeatures * sizeof(float));
        y[i] = d->y[idx[i]];
    }
}

/* ============================================================================================== */
/* >>snapshot: checkpoint files                                  (chapter 1; snapshots: chapter 4) */
/* ============================================================================================== */
/*
   Layout, all integers little-endian:
     "DDPCKPT1"  u32 version (1)  u32 nparams  i32 epoch
     per parameter: u32 name length, name bytes, u32 ndim, u32 shape[ndim], u64 count
     the parameters' f32 data, in order
     u64 FNV-1a hash of every byte before it
   The loader checks everything (bounds first, then hash, then names and shapes) before it writes
   into the model, so a bad file changes nothing.
*/

DDP__PRIVATE uint64_t ddp__fnv1a(const unsigned char* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* A growable byte buffer for building the file in memory. */
typedef struct ddp__bytes { unsigned char* p; size_t n, cap; int oom; } ddp__bytes;
DDP__PRIVATE void ddp__put(ddp__bytes* b, const void* src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        unsigned char* q;
        while (cap < b->n + n) cap *= 2;
        q = (unsigned char*)ddp__malloc(cap);
        if (!q) { b->oom = 1; return; }
        if (b->n) memcpy(q, b->p, b->n);
        if (b->p) DDP_FREE(b->p);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
DDP__PRIVATE void ddp__put_u32(ddp__bytes* b, uint32_t v) {
    unsigned char x[4];
    x[0] = (unsigned char)v; x[1] = (unsigned char)(v >> 8); x[2] = (unsigned char)(v >> 16); x[3] = (unsigned char)(v >> 24);
    ddp__put(b, x, 4);
}
DDP__PRIVATE void ddp__put_u64(ddp__bytes* b, uint64_t v) {
    ddp__put_u32(b, (uint32_t)v);
    ddp__put_u32(b, (uint32_t)(v >> 32));
}
DDP__PRIVATE uint32_t ddp__get_u32(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
DDP__PRIVATE uint64_t ddp__get_u64(const unsigned char* p) {
    return (uint64_t)ddp__get_u32(p) | (uint64_t)ddp__get_u32(p + 4) << 32;
}

/* Write `n` bytes to `path` through a temporary file, fsync, then rename over `path`. */
DDP__PRIVATE ddp_status ddp__write_atomic(const char* path, const unsigned char* data, size_t n) {
    char tmp[1100];
    FILE* f;
    int ok;
    if (strlen(path) > 1000) return ddp__fail(DDP_ERR_IO, "checkpoint path is too long");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f) return ddp__fail(DDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    ok = fwrite(data, 1, n, f) == n;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok; /* on disk before the rename makes it visible */
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return ddp__fail(DDP_ERR_IO, "writing %s failed: %s (the previous file, if any, is intact)", path,
                         strerror(e));
    }
    return DDP_OK;
}

DDP__DEF ddp_status ddp_checkpoint_save(ddp_model* m, int epoch, const char* path) {
    ddp__bytes b;
    int i;
    ddp_status s = DDP_OK;
    memset(&b, 0, sizeof b);
    ddp__put(&b, "DDPCKPT1", 8);
    ddp__put_u32(&b, 1);
    ddp__put_u32(&b, (uint32_t)m->nparams);
    ddp__put_u32(&b, (uint32_t)epoch);
    for (i = 0; i < m->nparams; i++) {
        const ddp_param* p = m->params[i];
        int k;
        ddp__put_u32(&b, (uint32_t)strlen(p->name));
        ddp__put(&b, p->name, strlen(p->name));
        ddp__put_u32(&b, (uint32_t)p->ndim);
        for (k = 0; k < p->ndim; k++) ddp__put_u32(&b, (uint32_t)p->shape[k]);
        ddp__put_u64(&b, (uint64_t)p->count);
    }
    DDP__TRY(ddp_stream_sync(m->stream)); /* the parameters are final only once the GPU is done */
    for (i = 0; i < m->nparams && !b.oom && s == DDP_OK; i++) {
        const ddp_param* p = m->params[i];
        size_t off = b.n, nb = p->count * sizeof(float);
        ddp__put(&b, p->data, nb); /* reserve the space; overwritten from the device below */
        if (!b.oom) s = ddp_copy(ddp__cpu(), b.p + off, m->device, p->data, nb, NULL);
    }
    if (!b.oom && s == DDP_OK) ddp__put_u64(&b, ddp__fnv1a(b.p, b.n));
    if (b.oom) s = ddp__fail(DDP_ERR_OUT_OF_MEMORY, "building the checkpoint in memory failed");
    if (s == DDP_OK) s = ddp__write_atomic(path, b.p, b.n);
    if (b.p) DDP_FREE(b.p);
    return s;
}

DDP__DEF ddp_status ddp_checkpoint_load(ddp_model* m, const char* path, int* epoch) {
    unsigned char* buf;
    size_t size, pos = 20, data_off;
    int i;
    ddp_status s = DDP_OK;
    DDP__TRY(ddp__read_file(path, DDP_MAX_DATA_FILE * 4, (char**)&buf, &size));
/* format the message first: it may quote bytes of buf */
#define DDP__CKPT_BAD(...)                                                                         \
    do {                                                                                           \
        ddp_status bad_ = ddp__fail(DDP_ERR_CHECKPOINT, __VA_ARGS__);                              \
        DDP_FREE(buf);                                                                             \
        return bad_;                                                                               \
    } while (0)
    if (size < 28 || memcmp(buf, "DDPCKPT1", 8) != 0)
        DDP__CKPT_BAD("%s is not a ddp.h checkpoint (no DDPCKPT1 header, or too short)", path);
    if (ddp__get_u64(buf + size - 8) != ddp__fnv1a(buf, size - 8))
        DDP__CKPT_BAD("%s is damaged: its checksum does not match (truncated or altered)", path);
    if (ddp__get_u32(buf + 8) != 1)
        DDP__CKPT_BAD("%s has format version %u; this library reads version 1", path, ddp__get_u32(buf + 8));
    if ((int)ddp__get_u32(buf + 12) != m->nparams)
        DDP__CKPT_BAD("%s holds %u parameters, the model has %d: it was written by another model",
                      path, ddp__get_u32(buf + 12), m->nparams);
    for (i = 0; i < m->nparams; i++) {
        const ddp_param* p = m->params[i];
        uint32_t len, nd, k;
        if (pos + 4 > size - 8) DDP__CKPT_BAD("%s ends inside parameter %d's description", path, i);
        len = ddp__get_u32(buf + pos);
        pos += 4;
        if (len > 31 || pos + len + 4 > size - 8) DDP__CKPT_BAD("%s: parameter %d's name is damaged", path, i);
        if (len != strlen(p->name) || memcmp(buf + pos, p->name, len) != 0)
            DDP__CKPT_BAD("%s: parameter %d is \"%.*s\", the model's is \"%s\": another model's file", path,
                          i, (int)len, (const char*)buf + pos, p->name);
        pos += len;
        nd = ddp__get_u32(buf + pos);
        pos += 4;
        if (nd != (uint32_t)p->ndim || pos + 4 * nd + 8 > size - 8)
            DDP__CKPT_BAD("%s: %s has %u dimensions, the model's has %d", path, p->name, nd, p->ndim);
        for (k = 0; k < nd; k++, pos += 4)
            if (ddp__get_u32(buf + pos) != (uint32_t)p->shape[k])
                DDP__CKPT_BAD("%s: %s has size %u in dimension %u, the model's has %d", path, p->name,
                              ddp__get_u32(buf + pos), k, p->shape[k]);
        if (ddp__get_u64(buf + pos) != p->count) DDP__CKPT_BAD("%s: %s has the wrong element count", path, p->name);
        pos += 8;
    }
    data_off = pos;
    for (i = 0; i < m->nparams; i++) pos += m->params[i]->count * sizeof(float);
    if (pos != size - 8) DDP__CKPT_BAD("%s: the data section has the wrong length", path);
#undef DDP__CKPT_BAD
    /* Everything checked: only now write into the model. */
    for (i = 0, pos = data_off; i < m->nparams && s == DDP_OK; i++) {
        size_t nb = m->params[i]->count * sizeof(float);
        s = ddp_copy(m->device, m->params[i]->data, ddp__cpu(), buf + pos, nb, NULL);
        pos += nb;
    }
    if (s == DDP_OK && epoch) *epoch = (int)ddp__get_u32(buf + 16);
    DDP_FREE(buf);
    return s;
}

#endif /* DDP_IMPLEMENTATION */

/*
------------------------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the ddp.h authors
Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
------------------------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this software, either
in source code form or as a compiled binary, for any purpose, commercial or non-commercial, and by
any means.
In jurisdictions that recognize copyright laws, the author or authors of this software dedicate
any and all copyright interest in the software to the public domain. We make this dedication for
the benefit of the public at large and to the detriment of our heirs and successors. We intend
this dedication to be an overt act of relinquishment in perpetuity of all present and future
rights to this software under copyright law.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY,
WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE
SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
------------------------------------------------------------------------------------------------
*/
