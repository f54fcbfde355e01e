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
    Adam/AdamW) so that every line of a training step can be read. A model of your own (your
    tensors, your forward and backward) goes under DDP too: see ddp_model_add and ddp_unit_begin.

    USE
    ===
    In exactly one C file:

        #define DDP_IMPLEMENTATION
        #include "ddp.h"

    Other files include "ddp.h" without the define. Build with the flags of the installed
    pkg-config file:   cc train.c $(pkg-config --cflags --libs ddp)
    (ddp-cpu instead of ddp: the CPU-only flavour, which links no CUDA library; make install
    PREFIX=DIR with a DIR pkg-config does not search needs PKG_CONFIG_PATH=DIR/lib/pkgconfig)
    or by hand, CPU only:   cc -DDDP_NO_CUDA train.c -lpthread -lm
    or with CUDA:           cc train.c -I$CUDA_HOME/include -L$CUDA_HOME/lib64 \
                               -lcublas -lnvrtc -lnccl -lcudart -lpthread -lm

    QUICK START (the heart of TUTORIAL.md chapter 1)
    ===========
        ddp_dataset all, train, test;
        DDP_CHECK(ddp_dataset_load("wine", NULL, &all));   // examples/data/wine.csv
        DDP_CHECK(ddp_dataset_split(&all, 0.2, 42, &train, &test));
        ddp_dataset_standardize(&train, &test);
        ddp_model* m;  int sizes[] = {13, 64, 3};
        DDP_CHECK(ddp_model_mlp(&(ddp_model_desc){.seed = 1}, sizes, 3, DDP_LAYER_RELU, &m));
        ddp_optim* opt;
        DDP_CHECK(ddp_optim_create(m, &(ddp_optim_desc){.kind = DDP_ADAM, .lr = 1e-3f}, &opt));
        ... per batch: ddp_model_zero_grad(m); ddp_model_forward(m, x, n);
                       ddp_loss_cross_entropy(m, y, &loss); ddp_model_backward(m); ddp_optim_step(opt);

    THE MAP: ONE TRAINING STEP, AND THE SECTION OF THIS FILE THAT OWNS EACH PART
    ============================================================================
    Search for the tag (">>nn") to jump to a section. Each section holds its declarations and,
    right after them, its implementation. Part I is the course: one training step's path, in the
    order the data takes it, each section naming its TUTORIAL.md chapters. Part II is the machinery
    that makes Part I fast or portable; Part I calls it by name and reads without it.

        tag         PART I: THE COURSE                                         TUTORIAL chapter
        >>config    status codes, errors, logging, random numbers              1
        >>device    where tensors live: devices, memory, copies, dtypes        1
        >>pg        the process group: joining the job (the store, agreeing    2-5, 9
                    on the world), collectives and their work handles
        >>launch    reading the launcher's environment (torchrun, Open MPI,    3-5
                    SLURM)
        >>data      data files, train/test split, the distributed sampler,     1-2
                    batches
        >>nn        the model: layers, forward, losses, backward, which fires  1, 12
                    the per-parameter "gradient ready" hook; a model of your
                    own tensors, and the brackets around each unit's use
        >>reducer   the DDP wrapper: buckets, hooks, overlap, no_sync          2, 7-8
        >>zero      sharding the training state (ZeRO-1, -2, -3): who owns      11
                    what, a layer gathered just before use, the shards' step
        >>ring      the ring all-reduce, one rule for every step               2, 10
        >>nccl      the NCCL backend, and the ring over NCCL's send and recv   3, 10
        >>optim     the optimizer step: SGD, Adam, AdamW; the learning rate;   1, 12
                    clipping by the global norm
        >>snapshot  resumable state in a safetensors file                      1, 6

        tag         PART II: THE MACHINERY (its own map and tuning variables open it)
        >>trace     the timeline DDP_TRACE writes                              10
        >>cuda      the CUDA runtime: probing the GPUs, streams, events
        >>kernels   GPU kernels compiled at run time by NVRTC; cuBLAS; the CPU
                    matrix product
        >>buffers   the two buffers ZeRO's layers take turns in                11
        >>store     the rendezvous store: sockets, its server, its client      2, 4
        >>signals   who has joined; the flight record of the last collectives  9
                    (SIGUSR1); desync checks; the watchdog over NCCL; what
                    ddp_init waited for
        >>sums      element-wise sums, four floats at a time
        >>shm       the shared-memory transport between ranks of one machine   10
        >>cpu       the CPU backend: communication thread, queue, connections
        >>mpi       the MPI backend (-DDDP_MPI)
        >>bind      keeping each rank on its own cores
        >>files     file formats: CSV rows, the safetensors header, atomic
                    writes
        >>slurm     SLURM's compressed node lists
        >>gpus      which GPU is whose: ranks that share one
        >>spawn     spawning ranks, supervising them, the guardian             3, 6

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
    DDP_MPI              add the mpi backend (MPI's own collectives; build with mpicc's flags:
                         mpicc -DDDP_MPI train.c -lpthread -lm). Off by default.
    DDP_CBLAS            Linear layers on the CPU call cblas_sgemm (link a CBLAS such as
                         OpenBLAS: -lopenblas); otherwise a cache-blocked loop of our own.
    DDP_STATIC           make every function static (for a private copy in one file).
    DDP_PORTABLE         leave out the Linux-only code on Linux too (futexes, /dev/shm, /proc, core
                         binding, PR_SET_PDEATHSIG): the plain POSIX paths that macOS and the BSDs
                         take, so that Linux can run and test them (make test-portable).
    DDP_NO_FIX_HINTS     the warnings that spell out a training loop's fix (the no_sync off-by-one)
                         say what went wrong and leave the fix out: an exercise's build, where
                         finding it is the exercise (labs/ddp_impl.c).
    DDP_MALLOC(n), DDP_FREE(p)
                         host allocator; define both or neither.
    DDP_ASSERT(c)        internal consistency checks (default: assert from <assert.h>).
    DDP_MAX_LAYERS       layers in one ddp_model_mlp (default 64); DDP_MAX_HOOKS hooks per parameter (4).
    DDP_MAX_PARAMS       tensors in one model (default 1024: a 48-block GPT-2 has 580).

    Environment, read at run time (a tuning value that cannot be used is named in a warning, and
    its default is used instead):
    DDP_DEBUG=INFO|DETAIL   more log lines; DETAIL also synchronises after every GPU launch
                            so an error is reported at the call that caused it, prints every
                            step of the ring, and checks before each collective that every rank
                            calls the same one (desync detection, through the store).
    SIGUSR1                 kill -USR1 <pid> prints that rank's last 16 collectives (also
                            printed when one times out), unless the program handles SIGUSR1.
    DDP_RESTART_COUNT       set by ddprun --max-restarts: 0 on the first start, then 1, 2, ...
    DDP_TIMEOUT=seconds     deadline of every store operation, connection and collective (300;
                            at least 0.1).
    DDP_BACKEND=cpu|nccl|mpi  the backend when ddp_desc.backend is not set (mpi: built with
                            -DDDP_MPI and started by mpirun; see >>mpi).
    DDP_TRANSPORT, DDP_ALGO, DDP_SHM_*, DDP_BIND, DDP_RING_PIECE_BYTES  tune the machinery: see
                            PART II.
    DDP_SIMULATE_NS_PER_BYTE  make every CPU-backend collective last at least this long per
                            byte: a slow network, to watch communication overlap backward.
    DDP_SIMULATE_LATENCY_US  and at least this long more, once per collective: the network's
                            latency (alpha, where the bytes give beta: labs/measure fits both).
    DDP_NCCL_RING=1         the NCCL backend runs the ring of >>ring instead of ncclAllReduce.
    DDP_NCCL_BLOCKING=1     a blocking NCCL communicator instead of the default non-blocking one
                            (to measure what each mode costs the host: tools/allreduce_perf -H).
    DDP_TRACE=prefix        write prefix.rank<R>.json, a timeline of forward, each layer's
                            backward, each collective, the wait and the optimizer step, for
                            ui.perfetto.dev or chrome://tracing.
    DDP_KILL_GRACE_S        seconds a stopped rank gets between SIGTERM and SIGKILL (5).
    DDP_RELAYED_RANK        set by ddprun for its ranks: it starts each line they print with
                            "[rank R]: ", so the library's own "[rank R/W]" label is left out of
                            the lines that rank R writes to stderr (a log sink still gets it).
    DDP_LAUNCH_ID           set by ddprun for its ranks ("host:pid:start time"): the ranks of one
                            node must all come from one launch, so a second ddprun given the same
                            MASTER_PORT and DDP_JOB_TOKEN cannot slip its ranks into this job.

    BACKENDS AND FEATURES
    =====================
                                  CPU build (DDP_NO_CUDA)   CUDA build, no GPU   CUDA build, GPU
        model on the CPU          yes                       yes                  yes
        model on a GPU            no (DDP_ERR_NOT_BUILT)    no (DDP_ERR_NO_GPU)  yes
        kernels compile (NVRTC)   no                        yes (to PTX)         yes

                                  cpu                 nccl                mpi (-DDDP_MPI)
        started by                any launcher        any launcher        mpirun (no MASTER_ADDR)
        buffers                   host; GPU staged    GPU                 host; GPU staged
        runs collectives on       its own thread      a CUDA stream       MPI's non-blocking calls
        deadline on every wait    yes                 yes (aborts)        yes (cannot cancel:
                                                                          exit after a timeout)
        desync caught without     yes (ring header)   at the deadline     no
          DDP_DEBUG=DETAIL                            (the watchdog)
        a dead rank named         at once (its        within a second     mpirun ends the job
                                  socket, its pid)    (the watchdog)

    ERRORS
    ======
    Functions return ddp_status (DDP_OK is 0). ddp_error_string() gives the last message of the
    calling thread: what failed, where, and what to do; ddp_status_name names the code. Examples
    stop on error through DDP_CHECK(call), which prints the message and the code's usual fix.

    THE API'S RULES
    ===============
    - Objects the library makes are opaque pointers. The function that makes one hands it back
      through its last argument (ddp_init, ddp_model_mlp, ddp_optim_create, ddp_wrap), and one
      function ends it: ddp_destroy, ddp_model_destroy, ddp_optim_destroy, ddp_wrapper_destroy.
      A destroy function ignores NULL.
    - Structs you own (fields visible, usually on your stack: ddp_dataset, ddp_sampler,
      ddp_loader) are filled by _load, _split or _init and emptied by _free, which frees what
      the library put inside and never the struct itself (a sampler holds nothing to free).
    - Options come in a _desc struct: zero it and set fields by name, {.lr = 1e-3f}. A field's
      zero is its default, and where that default is not zero the field's comment says so.
    - Accessors are ddp_OBJECT_PROPERTY(object): ddp_model_num_params, ddp_pg_backend;
      ddp_rank and ddp_world_size keep torch.distributed's short names.
    - Collectives are verbs on the group, ddp_all_reduce(pg, ...); the non-blocking ones hand back
      a ddp_work to wait on.
    - Every function that can fail returns ddp_status; getters, destroy and free functions, and
      the number conversions cannot fail.
    - Names with two underscores (ddp__, DDP__) belong to the implementation and may change; the
      tests call some of them, a program should not.

    LIMITS, HONESTLY
    ================
    - f32 compute only; f16 and bf16 are storage and wire formats (conversion, gradient
      compression), with arithmetic in f32.
    - ddp_model_mlp is a sequential stack; there is no automatic differentiation, so a model of
      your own brings its own backward, which marks each gradient ready (TUTORIAL chapter 12).
    - The CPU backend uses shared memory only when every rank is on one host; a job across
      machines talks TCP between all its ranks, also between those that share a machine.
    - The GPU path has run on one GPU (make gpu-check on an H200). NCCL with several ranks needs
      a GPU for each and has run only on the GPU stand-in (tests/fakegpu).
    - ZeRO-2 and -3 (>>zero) shard unit by unit (a Linear layer of ddp_model_mlp, or the units
      you give your tensors): a rank holds a whole unit while it computes, so the largest unit sets
      a floor under what sharding saves.
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
/*  How the file is read. Each section below holds its declarations (what a program calls) and   */
/*  its implementation (compiled once, where DDP_IMPLEMENTATION is defined) side by side, so a    */
/*  section reads in one place. A file may include ddp.h more than once: the declarations count   */
/*  the first time, the implementation the first time DDP_IMPLEMENTATION is defined.              */
/* ============================================================================================== */
#if !defined(DDP_H_INCLUDED)
#define DDP_H_INCLUDED
#define DDP__DECLARE 1
#else
#define DDP__DECLARE 0
#endif
#if (defined(DDP_IMPLEMENTATION) || defined(__INTELLISENSE__) || defined(__JETBRAINS_IDE__)) && \
    !defined(DDP__IMPLEMENTED)
#define DDP__IMPLEMENTED
#define DDP__IMPLEMENT 1
#else
#define DDP__IMPLEMENT 0
#endif

#if DDP__DECLARE
#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t, uint16_t */

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1
#define DDP_VERSION_PATCH 0

#if defined(DDP_STATIC)
#define DDP_API static
#elif defined(__cplusplus)
#define DDP_API extern "C" /* C names, so that C and C++ files link against one implementation */
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
#ifndef DDP_MAX_PARAMS
#define DDP_MAX_PARAMS 1024
#endif
#ifndef DDP_MAX_HOOKS
#define DDP_MAX_HOOKS 4
#endif
#endif /* DDP__DECLARE */

/* ############################################################################################## */
/*                                                                                                */
/*  PART I: THE COURSE. One training step's path, in the order the data takes it. Every section   */
/*  is declared and implemented in one place and names its TUTORIAL.md chapters. Where a section */
/*  needs fast or portable machinery (the shared-memory transport, the CUDA runtime, the store's  */
/*  sockets), it calls a function of Part II by name; Part I can be read without it.              */
/*                                                                                                */
/* ############################################################################################## */

/* ============================================================================================== */
/* >>config: status codes, errors, logging, random numbers                           (chapter 1)  */
/* ============================================================================================== */
#if DDP__DECLARE

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
    X(DDP_ERR_NOT_BUILT, "this build lacks what was asked for (CUDA: compiled with DDP_NO_CUDA; " \
      "the mpi backend: compiled without DDP_MPI)",                                              \
      "use --device cpu or another backend, or rebuild with the CUDA toolkit or mpicc installed " \
      "(make prints what it found)")                                                             \
    X(DDP_ERR_NO_GPU, "no usable NVIDIA GPU was found (no GPU, no driver, or none visible)",     \
      "use --device cpu, or check nvidia-smi and CUDA_VISIBLE_DEVICES")                           \
    X(DDP_ERR_CUDA, "a CUDA runtime call failed",                                                \
      "read the CUDA error named in the message; DDP_DEBUG=DETAIL reports it at the call")        \
    X(DDP_ERR_CUBLAS, "a cuBLAS call failed", "read the cuBLAS status named in the message")      \
    X(DDP_ERR_NVRTC, "NVRTC could not compile the GPU kernels",                                  \
      "check that the CUDA toolkit's NVRTC matches the driver; the message has the compile log") \
    X(DDP_ERR_NCCL, "an NCCL call failed", "read the NCCL error named in the message")            \
    X(DDP_ERR_MPI, "an MPI call failed, or MPI cannot give what the mpi backend needs",          \
      "read the MPI error named in the message; another rank's output usually shows the cause")   \
    X(DDP_ERR_IO, "a file could not be opened, read or written",                                 \
      "check the path (relative paths start in the current directory) and its permissions")      \
    X(DDP_ERR_DATA_FORMAT, "a data file is malformed",                                           \
      "the message names the file, line and column; compare with examples/data/README.md")      \
    X(DDP_ERR_CHECKPOINT, "a snapshot file is damaged, truncated or belongs to another model",  \
      "delete the file to start afresh, or load it into the model that wrote it")                \
    X(DDP_ERR_ENV, "an environment variable that places this process in the job is wrong",      \
      "the message names the variable: set it (a launcher such as build/ddprun sets them all)")  \
    X(DDP_ERR_PORT_IN_USE, "MASTER_PORT is already in use on this machine",                      \
      "pick another MASTER_PORT, stop the program holding it, or let ddprun --standalone choose")\
    X(DDP_ERR_STORE_UNREACHABLE, "no rendezvous store answered at MASTER_ADDR:MASTER_PORT",      \
      "start rank 0 too, and give every rank the same MASTER_ADDR and MASTER_PORT")              \
    X(DDP_ERR_STORE_REFUSED, "the rendezvous store refused this process (another job's store?)",\
      "every rank of one job needs the same DDP_JOB_TOKEN and library version; another job may "  \
      "hold this port")                                                                          \
    X(DDP_ERR_STORE_LOST, "the connection to the rendezvous store broke",                       \
      "the process hosting it (rank 0) probably died: look at its output first")                 \
    X(DDP_ERR_TIMEOUT, "a peer did not answer within the timeout",                               \
      "a rank is stuck, stopped or calling another collective: see the message and each rank's " \
      "last collectives; DDP_TIMEOUT sets the deadline")                                         \
    X(DDP_ERR_PEER_LOST, "a connection to another rank broke",                                   \
      "that rank died or its machine is unreachable: look at its output first")                  \
    X(DDP_ERR_WORLD_MISMATCH, "the ranks disagree about the job (world size or rank numbers)",   \
      "start every rank with the same WORLD_SIZE and a distinct RANK below it")                  \
    X(DDP_ERR_LAUNCH, "a rank of the job failed or could not be started",                        \
      "read that rank's output above: its own error comes first")                                \
    X(DDP_ERR_MODEL_MISMATCH, "the ranks' models, ddp_wrap settings or optimizers differ",     \
      "build the same model on every rank, from the same code and sizes, and wrap it and create " \
      "its optimizer with the same ddp_wrap_desc and ddp_optim_desc (the same options) on every "\
      "rank")                                                                                    \
    X(DDP_ERR_UNUSED_PARAMETER, "a parameter received no gradient in this backward pass",       \
      "make every parameter take part in the loss, or set find_unused_parameters")               \
    X(DDP_ERR_DESYNC, "the ranks called different collectives at the same point (desync)",      \
      "every rank must call the same collectives in the same order with the same sizes: look "   \
      "for one inside an if on the rank, or a loop whose length differs between ranks")

#define DDP__STATUS_ENUM(name, cause, fix) name,
typedef enum ddp_status { DDP__STATUS_TABLE(DDP__STATUS_ENUM) DDP__STATUS_COUNT } ddp_status;
#undef DDP__STATUS_ENUM

/* The status's name, e.g. "DDP_ERR_IO"; "DDP_ERR_UNKNOWN" for a value outside the table. */
DDP_API const char* ddp_status_name(ddp_status s);
/* The calling thread's last error message (what failed, where, why); "" when none. Never NULL. */
DDP_API const char* ddp_error_string(void);

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
/* A log sink receives each line, already prefixed with "[rank R/W]", without a newline (before
   ddp_init, R and W come from the launcher's RANK and WORLD_SIZE when set). */
typedef void (*ddp_log_fn)(ddp_log_level level, const char* line, void* user);

/* What this copy of the library was built with, one line (backends, BLAS, CUDA versions). */
DDP_API const char* ddp_build_info(void);

/* A small deterministic random generator (splitmix64): the same seed gives the same numbers on
   every machine and device, which is what makes replicas start identical. */
typedef struct ddp_rng { uint64_t state; } ddp_rng;
/* A generator seeded with `seed`. */
DDP_API ddp_rng ddp_rng_seed(uint64_t seed);
/* A uniform float in [0, 1). */
DDP_API float ddp_rng_uniform(ddp_rng* r);
/* An integer uniform in [0, n) for n >= 1. */
DDP_API uint32_t ddp_rng_below(ddp_rng* r, uint32_t n);
/* Fill out[0..n) with a permutation of 0..n-1 drawn from `seed` (Fisher-Yates). */
DDP_API void ddp_permutation(int n, uint64_t seed, int* out);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT

#include <assert.h>
#include <ctype.h>
#include <dirent.h> /* opendir: removing temporary files that a killed snapshot writer left */
#include <errno.h>
#include <limits.h> /* INT_MAX: range checks on numbers read from files and the environment */
#include <math.h>
#include <pthread.h> /* pthread_once, mutexes: the kernel cache is shared by threads */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>    /* sched_yield: a poll that leaves the core to whoever finishes the work */
#include <sys/stat.h> /* fstat: refuse a folder given as a data file */
#include <time.h>     /* clock_gettime, nanosleep: deadlines and the trace's clock */
#include <unistd.h>  /* fsync, unlink: atomic snapshot writes */
#if defined(__GLIBC__) && !defined(__USE_POSIX199309)
#error "ddp.h: POSIX declarations are hidden. Include ddp.h (with DDP_IMPLEMENTATION) before any other header, or compile with -D_POSIX_C_SOURCE=200809L."
#endif

/* Linux-only code (futexes, /dev/shm, /proc, core binding, PR_SET_PDEATHSIG) sits under DDP__LINUX.
   DDP_PORTABLE turns it off on Linux as well, so that a Linux machine runs and tests the plain
   POSIX paths that macOS and the BSDs take (make test-portable). */
#if defined(__linux__) && !defined(DDP_PORTABLE)
#define DDP__LINUX 1
#else
#define DDP__LINUX 0
#endif
/* The commands that error messages suggest exist on the system that prints them. */
#if DDP__LINUX
#define DDP__HINT_WHO_LISTENS "`ss -ltnp | grep :%d` shows which"
#define DDP__HINT_INSTALL_MPI "apt-get install libopenmpi-dev"
#elif defined(__APPLE__)
#define DDP__HINT_WHO_LISTENS "`lsof -nP -iTCP:%d -sTCP:LISTEN` shows which"
#define DDP__HINT_INSTALL_MPI "brew install open-mpi"
#else
#define DDP__HINT_WHO_LISTENS "`lsof -nP -iTCP:%d -sTCP:LISTEN` shows which"
#define DDP__HINT_INSTALL_MPI "install Open MPI or MPICH with the system's package manager"
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
#include <nccl.h>         /* the nccl backend's collectives (>>nccl) */
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
#if defined(DDP__EXPORT_INTERNALS) /* build-internal (Makefile): internals get external linkage, for the tests and ddprun */
#undef DDP__PRIVATE
#define DDP__PRIVATE
#endif

#if defined(DDP_STATIC)
#define DDP__DEF DDP__PRIVATE /* static, and no warning for the functions a program never calls */
#else
#define DDP__DEF
#endif

/* The largest data or snapshot file read into memory (1 GiB). */
#ifndef DDP_MAX_DATA_FILE
#define DDP_MAX_DATA_FILE ((size_t)1 << 30)
#endif
#define DDP__MAX_GPUS 64
#define DDP__MAX_USER_KERNELS 64 /* kernels of your own, per model (ddp_launch) */

#if defined(DDP_MPI)
#define DDP__MPI 1 /* the mpi backend is built in (>>mpi) */
#else
#define DDP__MPI 0
#endif

/* The GPU kernels (>>kernels): the name used in their source and the index used to launch one. */
#define DDP__KERNEL_LIST(X)                                                                        \
    X(bias_add) X(bias_grad) X(relu_fwd) X(relu_bwd) X(gelu_fwd) X(gelu_bwd) X(xent) X(mse)        \
    X(sgd) X(adam) X(f32_to_f16) X(f16_to_f32) X(f32_to_bf16) X(bf16_to_f32) X(reduce) X(scale)     \
    X(sum_squares)

#define DDP__KERNEL_ENUM(name) DDP__K_##name,
enum { DDP__KERNEL_LIST(DDP__KERNEL_ENUM) DDP__K_COUNT };
#undef DDP__KERNEL_ENUM

/* The two rows of the DDP_TRACE timeline (>>trace): computation and communication. */
enum { DDP__TRACE_COMPUTE = 1, DDP__TRACE_COMM = 2 };

/* Counters one thread adds to while another reads them (ddp_pg_bytes). */
#if defined(__GNUC__) || defined(__clang__)
#define DDP__COUNT(var, n) __atomic_fetch_add(&(var), (n), __ATOMIC_RELAXED)
#define DDP__READ_COUNT(var) __atomic_load_n(&(var), __ATOMIC_RELAXED)
#else
#define DDP__COUNT(var, n) ((var) += (n))
#define DDP__READ_COUNT(var) (var)
#endif

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
/* The usual cause of a status, one line. Never NULL. */
DDP__PRIVATE const char* ddp__status_cause(ddp_status s) {
    return ((unsigned)s < DDP__STATUS_COUNT) ? ddp__status_causes[s] : "an unknown status code";
}
/* What to do about a status, one line. Never NULL. */
DDP__PRIVATE const char* ddp__status_fix(ddp_status s) {
    return ((unsigned)s < DDP__STATUS_COUNT) ? ddp__status_fixes[s] : "report this as a bug";
}

/* ---- logging ------------------------------------------------------------------------------------ */

/* Process-wide facts every log line needs. rank/world are set when the placement is known
   (ddp__env_resolve, or MPI); until then log lines take them from the launcher's variables. */
DDP__PRIVATE struct {
    int rank, world;
    ddp_log_fn log_fn;
    void* log_user;
    int level; /* 0: not read from DDP_DEBUG yet */
    int placed; /* 1: rank and world are this process's placement */
} ddp__g = {0, 1, NULL, NULL, 0, 0};

/* The "[rank R/W] " that starts a log line. Before ddp_init knows the placement, a launcher's
   RANK and WORLD_SIZE (or Open MPI's or SLURM's) name the rank, so that rank 1's first lines do
   not read "[rank 0/1]". */
DDP__PRIVATE void ddp__label(char* out, size_t n) {
    static const char* const vars[3][2] = {{"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                           {"SLURM_PROCID", "SLURM_NTASKS"}};
    int rank = ddp__g.rank, world = ddp__g.world, i;
    for (i = 0; i < 3 && !ddp__g.placed; i++) {
        const char *r = getenv(vars[i][0]), *w = getenv(vars[i][1]);
        char *re = NULL, *we = NULL;
        long rv, wv;
        if (!r || !w || !*r || !*w) continue;
        rv = strtol(r, &re, 10), wv = strtol(w, &we, 10);
        if (*re == 0 && *we == 0 && rv >= 0 && rv < wv && wv <= INT_MAX) rank = (int)rv, world = (int)wv;
        break;
    }
    snprintf(out, n, "[rank %d/%d] ", rank, world);
}

/* 1 when ddprun relays this process's stderr with its own "[rank R]: " before each line
   (DDP_RELAYED_RANK names the rank it shows): a line printed there needs no second label. */
DDP__PRIVATE int ddp__relayed(void) {
    const char* v = getenv("DDP_RELAYED_RANK");
    char label[48], want[48];
    if (!v || !*v) return 0;
    ddp__label(label, sizeof label);
    snprintf(want, sizeof want, "[rank %s/", v);
    return strncmp(label, want, strlen(want)) == 0;
}

/* The level DDP_DEBUG asks for: DDP_LOG_WARN when unset, DDP_LOG_INFO or DDP_LOG_DETAIL. */
DDP__PRIVATE ddp_log_level ddp__log_level_enabled(void) {
    if (ddp__g.level == 0) {
        const char* v = getenv("DDP_DEBUG");
        int level = DDP_LOG_WARN;
        if (v && (!strcmp(v, "INFO") || !strcmp(v, "info"))) level = DDP_LOG_INFO;
        else if (v && (!strcmp(v, "DETAIL") || !strcmp(v, "detail"))) level = DDP_LOG_DETAIL;
        else if (v && *v && strcmp(v, "OFF") && strcmp(v, "off")) {
            char label[48] = "";
            if (!ddp__relayed()) ddp__label(label, sizeof label);
            fprintf(stderr, "%swarning: DDP_DEBUG=%s is not OFF, INFO or DETAIL; using OFF\n", label, v);
        }
        ddp__g.level = level;
    }
    return (ddp_log_level)ddp__g.level;
}

/* Send log lines to `fn` instead of stderr (NULL restores stderr). Not thread-safe: call early. */
DDP__PRIVATE void ddp__set_log(ddp_log_fn fn, void* user) {
    ddp__g.log_fn = fn;
    ddp__g.log_user = user;
}

/* One line to stderr in one write. stderr is unbuffered, and musl's fprintf then writes 80 bytes at
   a time, so the lines of ranks that share a terminal would interleave mid-line. */
DDP__PRIVATE void ddp__eprint_line(const char* fmt, ...) DDP__PRINTF(1, 2);
DDP__PRIVATE void ddp__eprint_line(const char* fmt, ...) {
    char line[2200];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    fwrite(line, 1, (size_t)n, stderr);
}

DDP__PRIVATE void ddp__vlog(ddp_log_level level, const char* fmt, va_list ap) {
    char line[2048];
    size_t label;
    int n;
    if ((int)level > (int)ddp__log_level_enabled()) return;
    ddp__label(line, sizeof line);
    label = strlen(line);
    n = snprintf(line + label, sizeof line - label, "%s",
                 level == DDP_LOG_ERROR ? "error: " : level == DDP_LOG_WARN ? "warning: " : "");
    if (n < 0 || (size_t)n >= sizeof line - label) n = 0;
    vsnprintf(line + label + (size_t)n, sizeof line - label - (size_t)n, fmt, ap);
    if (ddp__g.log_fn) ddp__g.log_fn(level, line, ddp__g.log_user); /* a sink always gets the label */
    else ddp__eprint_line("%s", ddp__relayed() ? line + label : line);
}

/* Log one printf-style line at `level` with the rank prefix; dropped if the level is not enabled. */
DDP__PRIVATE void ddp__log(ddp_log_level level, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ddp__vlog(level, fmt, ap);
    va_end(ap);
}

/* 1 the first time it is called with *flag, 0 ever after: for the warnings about a likely mistake
   that a training loop would otherwise repeat every step (atomic with GCC and Clang). */
DDP__PRIVATE int ddp__first_time(int* flag) {
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_exchange_n(flag, 1, __ATOMIC_RELAXED) == 0;
#else
    if (*flag) return 0;
    *flag = 1;
    return 1;
#endif
}
static int ddp__warned_set_epoch, ddp__warned_no_sync; /* one warning each per process */

/* A tuning variable from the environment: `def` when it is unset or empty. A value that is not a
   number of at least `min` (or, with `whole`, not a plain whole number: "1MB" would read as 1) is
   named in a warning and replaced by def, as DDP_DEBUG's is: a typo must not quietly mean
   something else. */
DDP__PRIVATE double ddp__env_tuning(const char* name, double def, double min, int whole, const char* unit) {
    const char* v = getenv(name);
    char* end = NULL;
    double x;
    if (!v || !*v) return def;
    errno = 0;
    x = whole ? (strspn(v, "0123456789") == strlen(v) ? (double)strtoull(v, &end, 10) : -1) : strtod(v, &end);
    if (errno == 0 && end && *end == 0 && x >= min && x < 1e15) return x;
    ddp__log(DDP_LOG_WARN, "%s=%s is not a %snumber of %s (at least %.15g); using %.15g", name, v, whole ? "whole " : "",
            unit, min, def);
    return def;
}

/* ---- errors ------------------------------------------------------------------------------------- */

/* Per thread, as stb's failure reason: a communication thread's error must not overwrite the
   message the training thread is about to print. */
static DDP__TLS char ddp__err_msg[1536];
static DDP__TLS ddp_status ddp__err_status;
/* The fix for this one error when the status's own fix line would mislead (a full disk is a
   DDP_ERR_IO, but checking the path's permissions will not help); NULL: the status's. */
static DDP__TLS const char* ddp__err_fix;
/* 1 once a DDP_CHECK has failed: the process is on its way out, and its exit says so (>>signals). */
static int ddp__check_failed;

/* Record a failure with a printf-style message and return its status: `return ddp__fail(...)`. */
DDP__PRIVATE ddp_status ddp__fail(ddp_status s, const char* fmt, ...) DDP__PRINTF(2, 3);
DDP__PRIVATE ddp_status ddp__fail(ddp_status s, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ddp__err_msg, sizeof ddp__err_msg, fmt, ap);
    va_end(ap);
    ddp__err_status = s;
    ddp__err_fix = NULL;
    ddp__log(DDP_LOG_INFO, "%s: %s", ddp_status_name(s), ddp__err_msg);
    return s;
}

DDP__DEF const char* ddp_error_string(void) { return ddp__err_msg; }
/* The status of the calling thread's last error, DDP_OK when none; ddp__clear_error() resets it. */
DDP__PRIVATE ddp_status ddp__last_status(void) { return ddp__err_status; }
/* Forget the calling thread's last error. */
DDP__PRIVATE void ddp__clear_error(void) {
    ddp__err_msg[0] = 0;
    ddp__err_status = DDP_OK;
    ddp__err_fix = NULL;
}

DDP__DEF void ddp_check_failed(ddp_status s, const char* call_text, const char* file, int line) {
    char label[48] = "";
    if (!ddp__relayed()) ddp__label(label, sizeof label);
    ddp__eprint_line("%serror: %s failed (%s:%d)", label, call_text, file, line);
    ddp__eprint_line("%s  %s: %s", label, ddp_status_name(s),
                     ddp__err_status == s && ddp__err_msg[0] ? ddp__err_msg : ddp__status_cause(s));
    ddp__eprint_line("%s  fix: %s", label, ddp__err_status == s && ddp__err_fix ? ddp__err_fix : ddp__status_fix(s));
    ddp__check_failed = 1;
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
    /* Chosen before the calls, not inside their arguments: with _FORTIFY_SOURCE (macOS's default,
       or -D_FORTIFY_SOURCE=2 with clang) snprintf is a macro, and a directive inside a macro's
       arguments is undefined behaviour, which compilers warn about. */
#if defined(DDP_CBLAS)
    const char* linear = "CPU Linear through CBLAS";
#else
    const char* linear = "CPU Linear through the built-in blocked loop";
#endif
    if (!info[0]) {
#if DDP__CUDA
        int rt = 0, drv = 0, nv_major = 0, nv_minor = 0, nccl = 0;
        char driver[32] = "no driver";
        cudaRuntimeGetVersion(&rt);
        if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0)
            snprintf(driver, sizeof driver, "driver for CUDA %d.%d", drv / 1000, (drv % 1000) / 10);
        nvrtcVersion(&nv_major, &nv_minor);
        ncclGetVersion(&nccl); /* 22809: 2.28.9 (from NCCL 2.9 on, 10000 * major + 100 * minor + patch) */
        snprintf(info, sizeof info, "ddp.h %d.%d.%d: CUDA runtime %d.%d (%s), NVRTC %d.%d, NCCL %d.%d.%d, cuBLAS; %s",
                 DDP_VERSION_MAJOR, DDP_VERSION_MINOR, DDP_VERSION_PATCH, rt / 1000,
                 (rt % 1000) / 10, driver, nv_major, nv_minor, nccl / 10000, nccl % 10000 / 100, nccl % 100, linear);
#else
        snprintf(info, sizeof info, "ddp.h %d.%d.%d: CPU only (DDP_NO_CUDA); %s", DDP_VERSION_MAJOR,
                 DDP_VERSION_MINOR, DDP_VERSION_PATCH, linear);
#endif
#if defined(DDP_MPI)
        strncat(info, "; mpi backend (DDP_MPI)", sizeof info - strlen(info) - 1);
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
/* splitmix64's output function: a bijection of 64-bit words under which nearby inputs land far
   apart, so it also serves to derive unrelated seeds from related ones (ddp__param_new). */
DDP__PRIVATE uint64_t ddp__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* The next 64 random bits. */
DDP__PRIVATE uint64_t ddp__rng_next(ddp_rng* r) {
    return ddp__mix64(r->state += 0x9E3779B97F4A7C15ull); /* splitmix64 (Steele, Lea, Flood 2014) */
}
DDP__DEF float ddp_rng_uniform(ddp_rng* r) {
    return (float)(ddp__rng_next(r) >> 40) * (1.0f / 16777216.0f); /* 24 random mantissa bits */
}
DDP__DEF uint32_t ddp_rng_below(ddp_rng* r, uint32_t n) {
    /* multiply-shift maps 32 random bits onto [0, n) without a division */
    return (uint32_t)(((ddp__rng_next(r) >> 32) * (uint64_t)n) >> 32);
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

/* FNV-1a, 64 bits: a checksum for files and a digest of the job token. */
DDP__PRIVATE uint64_t ddp__fnv1a(const unsigned char* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

DDP__PRIVATE void* ddp__malloc(size_t nbytes) { return nbytes ? DDP_MALLOC(nbytes) : NULL; }
DDP__PRIVATE void* ddp__calloc(size_t nbytes) {
    void* p = ddp__malloc(nbytes);
    if (p) memset(p, 0, nbytes);
    return p;
}

DDP__PRIVATE double ddp__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

DDP__PRIVATE void ddp__sleep(double s) {
    struct timespec ts;
    if (s <= 0) return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>device: where tensors live: devices, memory, copies, dtypes                     (chapter 1)  */
/* ============================================================================================== */
#if DDP__DECLARE

typedef enum ddp_device_type {
    DDP_DEVICE_AUTO = 0, /* a GPU when one is usable, else the CPU */
    DDP_DEVICE_CPU,
    DDP_DEVICE_CUDA
} ddp_device_type;

typedef struct ddp_device {
    ddp_device_type type;
    int index; /* CUDA device number; with DDP_DEVICE_AUTO it is the local rank's GPU */
} ddp_device;

/* Parse "cpu", "cuda", "cuda:N" or "auto" into *out. DDP_ERR_INVALID_ARGUMENT on anything else. */
DDP_API ddp_status ddp_device_parse(const char* text, ddp_device* out);
/* Turn DDP_DEVICE_AUTO into a concrete device and check that a CUDA device exists (a CPU device
   never starts CUDA, so a program may still fork GPU ranks afterwards).
   DDP_ERR_NO_GPU or DDP_ERR_NOT_BUILT when CUDA was asked for but cannot be used. */
DDP_API ddp_status ddp_device_resolve(ddp_device want, ddp_device* out);
/* "cpu" or "cuda:N" into buf (at least 16 bytes); returns buf. */
DDP_API const char* ddp_device_name(ddp_device d, char* buf, size_t bufsize);

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

/* Block until all work queued on `s` is done. Returns the first error the work raised. */
DDP_API ddp_status ddp_stream_sync(ddp_stream* s);

/* Copy nbytes from src on src_dev to dst on dst_dev, in order on `s`; with s NULL, now: after all
   work queued on the GPU, and landed when it returns. Any pair of CPU and CUDA devices.
   DDP_ERR_CUDA on failure. */
DDP_API ddp_status ddp_copy(ddp_device dst_dev, void* dst, ddp_device src_dev, const void* src,
                            size_t nbytes, ddp_stream* s);

typedef enum ddp_dtype {
    DDP_DTYPE_DEFAULT = 0, /* f32 */
    DDP_F32,
    DDP_F16,  /* IEEE half: 5-bit exponent, 10-bit mantissa; max 65504 */
    DDP_BF16  /* bfloat16: f32's 8-bit exponent, 7-bit mantissa */
} ddp_dtype;

/* Bytes per element of `t` (4 or 2); 0 for an unknown dtype. */
DDP_API size_t ddp_dtype_size(ddp_dtype t);
/* f32 -> f16, rounding to nearest even; overflow gives infinity, NaN stays NaN. */
DDP_API uint16_t ddp_f32_to_f16(float f);
/* f16 -> f32, exact (subnormals included). */
DDP_API float ddp_f16_to_f32(uint16_t h);
/* f32 -> bf16, rounding to nearest even; NaN stays NaN. */
DDP_API uint16_t ddp_f32_to_bf16(float f);
/* bf16 -> f32, exact. */
DDP_API float ddp_bf16_to_f32(uint16_t h);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
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

/* Defined further down, in the section named, and called here: */
DDP__PRIVATE int ddp__cuda_device_count(void); /* >>cuda */
DDP__PRIVATE int ddp__cuda_driver_too_old(void); /* >>cuda */
DDP__PRIVATE const char* ddp__cuda_unavailable_reason(void); /* >>cuda */
#if DDP__CUDA
DDP__PRIVATE void ddp__nccl_quiet(int device, const char* why); /* >>nccl (device -1: every GPU) */
#endif

DDP__PRIVATE ddp_device ddp__cpu(void) {
    ddp_device d;
    d.type = DDP_DEVICE_CPU;
    d.index = 0;
    return d;
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

/* The error for a GPU number past the visible GPUs: the usual cause is a GPU picked by the global
   RANK, which on a second machine counts past the GPUs this one has. Built in every build, so a
   test without a GPU can read it. */
DDP__PRIVATE ddp_status ddp__fail_gpu_index(int index, int ngpus) {
    return ddp__fail(DDP_ERR_NO_GPU,
                     "device cuda:%d was asked for, but only %d GPU%s visible (0..%d): pick "
                     "the GPU with LOCAL_RANK, not RANK, and check CUDA_VISIBLE_DEVICES",
                     index, ngpus, ngpus == 1 ? " is" : "s are", ngpus - 1);
}

DDP__DEF ddp_status ddp_device_resolve(ddp_device want, ddp_device* out) {
    int n;
    *out = want;
    /* asking CUDA starts it, and a process that forks after that cannot give its children a GPU */
    if (want.type == DDP_DEVICE_CPU) { out->index = 0; return DDP_OK; }
    n = ddp__cuda_device_count();
    if (want.type == DDP_DEVICE_AUTO) {
        if (n > 0) {
            out->type = DDP_DEVICE_CUDA;
            out->index = want.index % n;
        } else {
            out->type = DDP_DEVICE_CPU;
            out->index = 0;
            /* a laptop without a GPU is normal; a GPU machine whose driver is too old is a surprise */
            ddp__log(ddp__cuda_driver_too_old() ? DDP_LOG_WARN : DDP_LOG_INFO, "no GPU: using the CPU (%s)",
                    ddp__cuda_unavailable_reason());
        }
        return DDP_OK;
    }
#if !DDP__CUDA
    return ddp__fail(DDP_ERR_NOT_BUILT, "device cuda:%d was asked for, but %s", want.index,
                     ddp__cuda_unavailable_reason());
#else
    if (n == 0)
        return ddp__fail(DDP_ERR_NO_GPU, "device cuda:%d was asked for, but %s", want.index,
                         ddp__cuda_unavailable_reason());
    if (want.index < 0 || want.index >= n) return ddp__fail_gpu_index(want.index, n);
    return DDP_OK;
#endif
}

DDP__DEF const char* ddp_device_name(ddp_device d, char* buf, size_t bufsize) {
    if (d.type == DDP_DEVICE_CUDA) snprintf(buf, bufsize, "cuda:%d", d.index);
    else snprintf(buf, bufsize, "%s", d.type == DDP_DEVICE_CPU ? "cpu" : "auto");
    return buf;
}

/* Make `d` the calling thread's current CUDA device (no-op for the CPU). DDP_ERR_CUDA on failure. */
DDP__PRIVATE ddp_status ddp__device_activate(ddp_device d) {
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
        cudaError_t e;
        DDP__TRY(ddp__device_activate(d));
        DDP__CU(cudaMalloc(out, nbytes));
        /* cudaMemset returns before it is done, on the legacy stream, which the library's own
           streams do not wait for: the zeros must have landed before anyone uses the buffer */
        e = cudaMemset(*out, 0, nbytes);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
        if (e != cudaSuccess) {
            cudaFree(*out);
            *out = NULL;
            return ddp__fail_cuda(e, "cudaMemset(new buffer)", __LINE__);
        }
        return DDP_OK;
#else
        return ddp__fail(DDP_ERR_NOT_BUILT, "cannot allocate on a GPU: %s",
                         ddp__cuda_unavailable_reason());
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
        ddp__nccl_quiet(d.index, "ddp_free (cudaFree waits for the collectives in flight)");
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
    if (ddp__cuda_device_count() > 0) {
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
    if (ddp__cuda_device_count() > 0) {
        ddp__nccl_quiet(-1, "ddp_free_pinned (cudaFreeHost waits for the collectives in flight)");
        cudaFreeHost(p);
        return;
    }
#endif
    DDP_FREE(p);
}

/* Free host memory the library handed out (PTX text). NULL is ignored. */
DDP__PRIVATE void ddp__free_host(void* p) {
    if (p) DDP_FREE(p);
}

/* A copy that the caller has already ordered after the work producing src (an event waited for):
   on the legacy stream, and landed when it returns (cudaMemcpy from pageable memory returns once
   the source is staged, before the bytes are on the device). Waits for no other stream, so the
   CPU backend's thread can stage a bucket while backward goes on. */
DDP__PRIVATE ddp_status ddp__copy_now(ddp_device dst_dev, void* dst, ddp_device src_dev, const void* src,
                                      size_t nbytes) {
    if (nbytes == 0) return DDP_OK;
    if (dst_dev.type != DDP_DEVICE_CUDA && src_dev.type != DDP_DEVICE_CUDA) {
        memcpy(dst, src, nbytes);
        return DDP_OK;
    }
#if DDP__CUDA
    /* cudaMemcpyDefault: unified addressing tells the runtime which side each pointer is on */
    DDP__TRY(ddp__device_activate(dst_dev.type == DDP_DEVICE_CUDA ? dst_dev : src_dev));
    DDP__CU(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
    DDP__CU(cudaStreamSynchronize(cudaStreamLegacy));
    return DDP_OK;
#else
    return ddp__fail(DDP_ERR_NOT_BUILT, "cannot copy to or from a GPU: %s", ddp__cuda_unavailable_reason());
#endif
}

DDP__DEF ddp_status ddp_copy(ddp_device dst_dev, void* dst, ddp_device src_dev, const void* src,
                             size_t nbytes, ddp_stream* s) {
    if (nbytes == 0) return DDP_OK;
    if (dst_dev.type != DDP_DEVICE_CUDA && src_dev.type != DDP_DEVICE_CUDA) {
        memcpy(dst, src, nbytes);
        return DDP_OK;
    }
#if DDP__CUDA
    if (s && s->dev.type == DDP_DEVICE_CUDA) {
        DDP__TRY(ddp__device_activate(s->dev));
        DDP__CU(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s->s));
        return DDP_OK;
    }
    /* "now": after everything queued on the GPU (the model's own stream included: the legacy
       stream that cudaMemcpy uses does not wait for the library's non-blocking streams) */
    ddp__nccl_quiet(dst_dev.type == DDP_DEVICE_CUDA ? dst_dev.index : src_dev.index,
                    "ddp_copy (it waits for the collectives in flight)");
    DDP__TRY(ddp__device_activate(dst_dev.type == DDP_DEVICE_CUDA ? dst_dev : src_dev));
    DDP__CU(cudaDeviceSynchronize());
    return ddp__copy_now(dst_dev, dst, src_dev, src, nbytes);
#else
    (void)s;
    return ddp__fail(DDP_ERR_NOT_BUILT, "cannot copy to or from a GPU: %s",
                     ddp__cuda_unavailable_reason());
#endif
}

/* Set nbytes at p on `d` to zero, in order on `s` (NULL: now, as ddp_copy). DDP_ERR_CUDA on failure. */
DDP__PRIVATE ddp_status ddp__zero(ddp_device d, void* p, size_t nbytes, ddp_stream* s) {
    if (nbytes == 0) return DDP_OK;
    if (d.type != DDP_DEVICE_CUDA) {
        memset(p, 0, nbytes);
        return DDP_OK;
    }
#if DDP__CUDA
    DDP__TRY(ddp__device_activate(d));
    if (s && s->dev.type == DDP_DEVICE_CUDA) {
        DDP__CU(cudaMemsetAsync(p, 0, nbytes, s->s));
        return DDP_OK;
    }
    /* now, as ddp_copy: after the queued work, and done when it returns */
    ddp__nccl_quiet(d.index, "zeroing a GPU buffer (it waits for the collectives in flight)");
    DDP__CU(cudaDeviceSynchronize());
    DDP__CU(cudaMemset(p, 0, nbytes));
    DDP__CU(cudaStreamSynchronize(cudaStreamLegacy));
    return DDP_OK;
#else
    (void)s;
    return ddp__fail(DDP_ERR_NOT_BUILT, "cannot clear GPU memory: %s", ddp__cuda_unavailable_reason());
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
/* "f32", "f16", "bf16" or "?". */
DDP__PRIVATE const char* ddp__dtype_name(ddp_dtype t) {
    switch (t) {
    case DDP_DTYPE_DEFAULT:
    case DDP_F32: return "f32";
    case DDP_F16: return "f16";
    case DDP_BF16: return "bf16";
    }
    return "?";
}

/* The f16 and bf16 conversions work on bit patterns. Their steps are written once, here, as
   functions of a 32-bit pattern: the CPU compiles them just below, and >>kernels pastes the same
   text into the GPU source (DDP__XSTR), so that a value converts identically on either side.
   ddp__bits and ddp__flt are the bit casts, ddp__add_half(a) is a + 0.5f rounded to nearest even;
   each side defines its own. f32 -> f16: NaN stays NaN, >= 65520 rounds to infinity; below 2^-14
   the result is an f16 subnormal, a multiple of 2^-24, and adding 0.5 puts those multiples into
   the low mantissa bits of a float whose exponent is fixed, so the hardware's own rounding does
   the work; a normal value has its exponent re-biased (127 -> 15: subtract 112 << 23) and the 13
   bits that fall off rounded to nearest, ties to the even result (the + odd term). */
#define DDP__CONVERSIONS(QUAL)                                                                     \
    QUAL unsigned short ddp__cv_f32_to_f16(unsigned x) {                                           \
        unsigned sg = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;                                    \
        if (a > 0x7f800000u) return (unsigned short)(sg | 0x7e00u | ((a >> 13) & 0x3ffu));        \
        if (a >= 0x477ff000u) return (unsigned short)(sg | 0x7c00u);                               \
        if (a < 0x38800000u) return (unsigned short)(sg | (ddp__bits(ddp__add_half(ddp__flt(a))) - 0x3f000000u)); \
        return (unsigned short)(sg | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));                \
    }                                                                                              \
    QUAL float ddp__cv_f16_to_f32(unsigned h) {                                                    \
        unsigned sg = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;                  \
        if (e == 0) return sg ? -((float)m * 5.9604644775390625e-8f) : (float)m * 5.9604644775390625e-8f; \
        return ddp__flt(e == 31 ? (sg | 0x7f800000u | (m << 13)) : (sg | ((e + 112u) << 23) | (m << 13))); \
    }                                                                                              \
    QUAL unsigned short ddp__cv_f32_to_bf16(unsigned x) {                                          \
        if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);          \
        return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);                          \
    }                                                                                              \
    QUAL float ddp__cv_bf16_to_f32(unsigned h) { return ddp__flt(h << 16); }
#define DDP__STR_(...) #__VA_ARGS__
#define DDP__XSTR(...) DDP__STR_(__VA_ARGS__) /* the text of a macro's expansion */

DDP__PRIVATE unsigned ddp__bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (unsigned)x;
}
DDP__PRIVATE float ddp__flt(unsigned u) {
    uint32_t x = (uint32_t)u;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
DDP__PRIVATE float ddp__add_half(float a) { return a + 0.5f; }
DDP__CONVERSIONS(DDP__PRIVATE)

DDP__DEF uint16_t ddp_f32_to_f16(float f) { return ddp__cv_f32_to_f16(ddp__bits(f)); }
DDP__DEF float ddp_f16_to_f32(uint16_t h) { return ddp__cv_f16_to_f32(h); }
DDP__DEF uint16_t ddp_f32_to_bf16(float f) { return ddp__cv_f32_to_bf16(ddp__bits(f)); }
DDP__DEF float ddp_bf16_to_f32(uint16_t h) { return ddp__cv_bf16_to_f32(h); }

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>pg: the process group: joining the job, collectives, work handles            (chapters 2-5)  */
/* ============================================================================================== */
#if DDP__DECLARE

/* A small TCP key-value server that one process hosts (rank 0, at MASTER_ADDR:MASTER_PORT) and
   every process uses as a client: the way ranks find each other before any collective exists.
   The analogue of PyTorch's TCPStore. Every request carries the protocol version and the job
   token; every length read from the network is bounded (DDP_STORE_MAX_KEY/VALUE); a connection
   that sends garbage, the wrong token, or nothing at all is dropped with a log line. A job token
   keeps stray jobs apart; it is not authentication against an attacker on your network. */

#ifndef DDP_STORE_MAX_KEY
#define DDP_STORE_MAX_KEY 256            /* bytes */
#endif
#ifndef DDP_STORE_MAX_VALUE
#define DDP_STORE_MAX_VALUE (1 << 20)    /* bytes */
#endif

typedef struct ddp_store ddp_store;

typedef struct ddp_store_desc {
    const char* host;  /* where the server is; default MASTER_ADDR, else 127.0.0.1 */
    int port;          /* default MASTER_PORT, else 29500; a server given port -1 picks a free one */
    int is_server;     /* host the server in this process, on `port`: on 127.0.0.1 only when `host`
                          is a loopback address (every client is on this machine), else on all
                          interfaces */
    double timeout_s;  /* connect and every operation; default DDP_TIMEOUT, else 300 s (TCPStore's) */
    const char* token; /* default DDP_JOB_TOKEN, else "" */
} ddp_store_desc;

/* Set key to nbytes of value. DDP_ERR_INVALID_ARGUMENT for an oversized key or value;
   DDP_ERR_STORE_LOST when the server is gone. */
DDP_API ddp_status ddp_store_set(ddp_store* s, const char* key, const void* value, size_t nbytes);
/* Wait until key exists (at most the timeout), then copy up to `capacity` bytes of its value into
   buf; *nbytes gets the value's full size. DDP_ERR_TIMEOUT if it never appears. */
DDP_API ddp_status ddp_store_get(ddp_store* s, const char* key, void* buf, size_t capacity, size_t* nbytes);

typedef enum ddp_backend {
    DDP_BACKEND_DEFAULT = 0, /* DDP_BACKEND in the environment, else nccl on a GPU, else cpu */
    DDP_BACKEND_CPU,         /* the ring written out over sockets, on a communication thread */
    DDP_BACKEND_NCCL,        /* NVIDIA's library (one rank per GPU) */
    DDP_BACKEND_MPI          /* MPI's own collectives under mpirun; only in a -DDDP_MPI build */
} ddp_backend;

typedef enum ddp_reduce_op { DDP_SUM = 0, DDP_AVG, DDP_MAX } ddp_reduce_op;

typedef struct ddp_desc {
    ddp_backend backend;
    ddp_device device;       /* where collective buffers live; default: cuda:LOCAL_RANK when this
                                machine has a GPU for every local rank, else cpu. DDP_DEVICE_CUDA
                                with index 0 means cuda:(LOCAL_RANK mod GPUs) */
    /* Explicit placement beats every environment variable. Rank 0 is a real rank, so the
       numbers count only when `explicit_rank` is set. */
    int explicit_rank;
    int rank, world_size, local_rank, local_world_size;
    const char* master_addr; /* default MASTER_ADDR (SLURM: the first host of the job) */
    int master_port;         /* <= 0: MASTER_PORT, else (SLURM) 15000 + last 4 digits of
                                SLURM_JOB_ID, else 29500 */
    double timeout_s;        /* every store operation, connection and collective wait;
                                default DDP_TIMEOUT, else 300 s */
    const char* token;       /* default DDP_JOB_TOKEN, else "" */
    ddp_log_fn log;          /* default: stderr */
    void* log_user;
} ddp_desc;

/* Where this process sits in the job, as ddp_init reads it from the launcher's variables (>>launch). */
typedef struct ddp_env {
    int rank, world_size, local_rank, local_world_size, node_rank;
    char master_addr[256];
    int master_port;
    const char* source;      /* "explicit", "torchrun", "openmpi", "slurm", "default", or "mpi"
                                (the mpi backend: MPI_COMM_WORLD itself) */
} ddp_env;

typedef struct ddp_pg ddp_pg;     /* a process group: every rank of the job */
typedef struct ddp_work ddp_work; /* a collective in flight */

/* Join the job (collective: every rank calls it): resolve the environment, start or reach the
   store, check every rank agrees on the world size, and connect the backend. While ranks are
   missing, rank 0 logs which have joined and which are awaited (every 5 s, after the first half
   minute every 30 s); a SIGTERM or SIGINT during ddp_init (unless the program handles or ignores
   it) prints what the rank was waiting for before it ends the process. Errors: DDP_ERR_ENV, the
   store's errors, DDP_ERR_WORLD_MISMATCH, DDP_ERR_TIMEOUT (a rank never came: named),
   DDP_ERR_NCCL. */
DDP_API ddp_status ddp_init(const ddp_desc* desc, ddp_pg** out);
/* Leave the job and free everything (collective: rank 0, which hosts the store, waits up to the
   timeout for every rank to call it, and the others wait for rank 0 to close the store, so that
   a ddp_init right after it, on the same address, starts the next job). Returns within the
   timeout: a rank whose process has ended is not waited for, and NCCL's teardown, which waits for
   the machine's other ranks, is aborted at the deadline. On the CPU backend a neighbour still
   inside a collective this rank never called is told at once (DDP_ERR_DESYNC: "rank R has left
   the job"). NULL is ignored. */
DDP_API void ddp_destroy(ddp_pg* pg);
/* This process's rank, the world size, the backend in use, and the device collective buffers
   live on. */
DDP_API int ddp_rank(const ddp_pg* pg);
DDP_API int ddp_world_size(const ddp_pg* pg);
DDP_API ddp_backend ddp_pg_backend(const ddp_pg* pg);
DDP_API ddp_device ddp_pg_device(const ddp_pg* pg);
/* The store every rank shares (for your own keys; prefix them to avoid the library's "ddp/"). */
DDP_API ddp_store* ddp_pg_store(ddp_pg* pg);
/* Payload bytes this rank has sent and received through the backend since ddp_init (the CPU
   ring's 32-byte header per collective is not counted). */
DDP_API void ddp_pg_bytes(const ddp_pg* pg, uint64_t* sent, uint64_t* received);
/* Collectives this rank has issued since ddp_init: the sequence number of the last one (the #N of
   DDP_DEBUG=DETAIL and of the flight recorder). It counts at the call, before the collective runs,
   so a hook can tell whether a call it made started one. */
DDP_API uint64_t ddp_pg_collectives(const ddp_pg* pg);

/* The collectives. Each is collective (every rank calls it, in the same order, with the same
   count, dtype, op and root) and runs in the order issued. Buffers are on ddp_pg_device(pg);
   counts are in elements. With work == NULL the call returns when the collective is done; with a
   work pointer it returns at once and *work must be passed to ddp_work_wait. Errors:
   DDP_ERR_INVALID_ARGUMENT before anything is sent; DDP_ERR_TIMEOUT, DDP_ERR_PEER_LOST naming the
   collective, its sequence number and the peer. */
/* buf[0..count) = op over all ranks of their buf (sum, average or maximum). */
DDP_API ddp_status ddp_all_reduce(ddp_pg* pg, void* buf, size_t count, ddp_dtype dtype, ddp_reduce_op op,
                                  ddp_work** work);
/* recv[r*count .. (r+1)*count) = rank r's send[0..count), for every r. In place: send at recv +
   rank*count; any other overlap is refused (as for reduce-scatter, where recv may be send + rank*count). */
DDP_API ddp_status ddp_all_gather(ddp_pg* pg, const void* send, void* recv, size_t count, ddp_dtype dtype,
                                  ddp_work** work);
/* recv[0..count) = op over all ranks of their send[rank*count .. (rank+1)*count). */
DDP_API ddp_status ddp_reduce_scatter(ddp_pg* pg, const void* send, void* recv, size_t count,
                                      ddp_dtype dtype, ddp_reduce_op op, ddp_work** work);
/* Return when every rank has called it. */
DDP_API ddp_status ddp_barrier(ddp_pg* pg);
/* Wait for a collective (at most the group's timeout) and free the handle; returns its status. */
DDP_API ddp_status ddp_work_wait(ddp_work* work);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE ddp_status ddp__own_gpu(ddp_pg* pg, ddp_device want, ddp_device* out); /* >>gpus */
DDP__PRIVATE ddp_status ddp__nccl_gpu_own(ddp_pg* pg); /* >>gpus */

/*
   A collective is described by a ddp_work and handed to the backend. The CPU backend queues it
   for its communication thread, which runs collectives one at a time in the order they were
   issued (the order every rank must agree on) while the caller goes on computing; the NCCL
   backend queues it on a CUDA stream. ddp_work_wait waits for one.

   Backends sit behind one small table of function pointers, so that one binary runs the CPU ring
   on a laptop and NCCL on a GPU node, and one test suite can run every backend:
     connect  set up connections once the store is up (collective);
     submit   start one collective (must not block on peers);
     wait     block until that collective is done or its deadline passes;
     test     whether it is done, without blocking;
     destroy  close everything.
*/

#define DDP__RING_MAGIC 0x52504444u /* "DDPR": the first word of every ring header */
enum { DDP__ALL_REDUCE = 1, DDP__BROADCAST, DDP__ALL_GATHER, DDP__REDUCE_SCATTER,
       DDP__LEAVE /* not a collective: the ring header a rank sends its right neighbour in ddp_destroy */ };
/* How a rank left, in its LEAVE header: ddp_destroy; its process ended (exit, return from main)
   with the group still open; or it ended because a DDP_CHECK failed. */
enum { DDP__LEFT_DESTROY = 1, DDP__LEFT_EXIT, DDP__LEFT_FAILED };

struct ddp_work {
    ddp_pg* pg;
    int kind;
    void* buf;             /* all-reduce and broadcast: in place; others: the output */
    const void* send;      /* all-gather, reduce-scatter: the input */
    size_t count;          /* elements (per rank for all-gather and reduce-scatter) */
    ddp_dtype dtype;
    ddp_reduce_op op;
    int root;
    uint64_t seq;          /* 1, 2, 3, ...: the same on every rank for the same collective */
    ddp_event* ready;      /* GPU buffers: recorded on the producer's stream at submit */
    int done;              /* guarded by pg->lock */
    int abandoned;         /* the waiter gave up: the communication thread frees it */
    int lazy;              /* queued without waking the communication thread (see ddp__cpu_submit) */
    int in_place;          /* all-gather or reduce-scatter in NCCL's in-place layout (ddp__layout) */
    float premul;          /* f32 all-reduce: every rank's input times this first (0: none), see >>reducer */
    int ntensors;          /* f32 all-reduce, > 0: the data lives in these tensors, not in buf, which is */
    float* const* tensors; /* scratch; tensors[i] holds elements [tensor_at[i], tensor_at[i + 1]) */
    const size_t* tensor_at;
    int staged;            /* the path works on buf: the tensors were copied in, and go back at the end */
    ddp_status status;
    char msg[sizeof ddp__err_msg]; /* the failure's message, carried to the waiting thread */
    ddp_work* next;
};

/* The flight recorder: each rank remembers its last DDP__FLIGHT_N collectives, printed when one
   times out and on SIGUSR1, so a hang can be read rank by rank: where did each one stop? It is
   kept, and printed, by >>signals, which also holds DDP_DEBUG=DETAIL's check before each
   collective that every rank calls the same one (desync detection). */
#define DDP__FLIGHT_N 16
enum { DDP__FL_QUEUED = 1, DDP__FL_RUNNING, DDP__FL_DONE, DDP__FL_FAILED };
/* What the reducer asks the CPU backend to fold into the passes an f32 all-reduce takes over the
   data anyway (>>reducer): a factor on every rank's input, and the tensors the data lives in (the
   parameters' own gradients, when they do not live in the bucket). */
typedef struct ddp__fused {
    float premul;          /* 0: none */
    int ntensors;          /* 0: the data is in the bucket */
    float* const* tensors;
    const size_t* tensor_at; /* ntensors + 1 offsets into the bucket, the last one its count */
} ddp__fused;

typedef struct ddp__flight {
    uint64_t seq;      /* 0: empty */
    int kind, state;
    size_t count;
    ddp_dtype dtype;
    double t_issue, t_start, t_end;
} ddp__flight;

typedef struct ddp__backend_vt {
    const char* name;
    ddp_status (*connect)(ddp_pg* pg);
    ddp_status (*submit)(ddp_pg* pg, ddp_work* w);
    ddp_status (*wait)(ddp_pg* pg, ddp_work* w);
    ddp_status (*test)(ddp_pg* pg, ddp_work* w, int* done);
    void (*destroy)(ddp_pg* pg);
} ddp__backend_vt;

struct ddp_pg {
    ddp_env env;
    int rank, world;
    ddp_backend backend;
    ddp_device device;
    double timeout;
    ddp_store* store;
    const ddp__backend_vt* vt;
    uint64_t seq;              /* collectives issued */
    ddp_stream* user_stream;   /* later collectives wait for work queued here */
    uint64_t bytes_sent, bytes_received;
    ddp_status broken;         /* after a failed collective the group cannot be trusted */
    char broken_msg[sizeof ddp__err_msg];
    /* the CPU backend */
    int left_fd, right_fd;     /* ring: we receive from rank-1 and send to rank+1 */
    int rd_fd[31], rd_levels;  /* recursive doubling (TCP): the partner rank ^ 2^k, for k < rd_levels */
    int rd_extra_fd;           /* and the rank this one stands in for, or that stands in for it; -1 */
    int algo;                  /* DDP_ALGO: 0 chosen by size (the cost model), 1 the ring, 2 doubling */
    pthread_t thread;
    int thread_started, stop;
    pthread_mutex_t lock;
    pthread_cond_t cond;       /* the communication thread waits here for work */
    pthread_cond_t done_cond;  /* callers wait here for their collectives */
    ddp_work *head, *tail;
    int inline_busy;           /* a collective is running on the caller's thread */
    ddp_work* running;         /* the collective the communication thread is running */
    int wraps;                 /* models wrapped so far: names the store keys of each ddp_wrap */
    int optims;                /* optimizers of wrapped models so far: their store keys likewise */
    int joined;                /* ddp_init completed: ddp_destroy waits for the others */
    float* one;                /* ddp_barrier's number, on the group's device */
    unsigned char* staging;    /* host copy of GPU buffers and scratch space */
    size_t staging_bytes;
    unsigned char* piece;      /* one received piece before it is reduced */
    size_t piece_elems;
    double sim_s_per_byte;     /* DDP_SIMULATE_NS_PER_BYTE: pretend the network is this slow */
    double sim_latency_s;      /* DDP_SIMULATE_LATENCY_US: and this slow to start each collective */
    unsigned char* shm;        /* the shared-memory transport's segment (>>shm), NULL: the TCP ring */
    size_t shm_bytes, shm_chunk; /* its size; bytes per slot */
    uint32_t shm_phase;        /* this rank's phase counter, as published */
    uint64_t shm_chunks;       /* chunks done: picks the slot set */
    uint32_t shm_reuse;        /* the phase every rank must reach before the next chunk's set is
                                  written: the last chunk's first one (>>shm) */
    size_t shm_one_step;       /* all-reduces up to this many bytes take one step (>>shm) */
    double shm_spin_s;         /* how long a wait spins before it sleeps */
    int shm_yield;             /* more local ranks than cores: a wait yields its core (>>shm) */
    int tcp_yield;             /* the same on TCP (>>ring, >>cpu) */
    size_t shm_stream_bytes;   /* collectives this large copy their result out with streaming stores */
    size_t shm_slot_stream;    /* all-reduces smaller than this write their slots with streaming stores */
    void* nccl;                /* the NCCL backend's state */
    void* mpi;                 /* the MPI backend's state (>>mpi) */
    char* live_keys;           /* the watchdog's list of every rank's sign of life, 64 bytes each */
    double leave_by;           /* ddp_destroy's deadline, which the backend's teardown keeps too */
    int watch_off;             /* the store stopped answering the watchdog, which then looks no more */
    ddp__flight flight[DDP__FLIGHT_N]; /* the last collectives, slot seq % N; under `lock` */
};

/* Defined further down, in the section named, and called here: */
DDP__PRIVATE ddp_status ddp__store_add(ddp_store* s, const char* key, int64_t delta,
                                       int64_t* value); /* >>store */
DDP__PRIVATE ddp_status ddp__store_check(ddp_store* s, const char* const* keys, int n,
                                         int* present); /* >>store */
DDP__PRIVATE ddp_status ddp__store_barrier(ddp_store* s, const char* name, int count); /* >>store */
DDP__PRIVATE ddp_status ddp__timeout(double from_desc, double* out); /* >>store */
DDP__PRIVATE ddp_status ddp__store_create(const ddp_store_desc* desc, ddp_store** out); /* >>store */
DDP__PRIVATE int ddp__store_wait_closed(ddp_store* s, double deadline); /* >>store */
DDP__PRIVATE void ddp__store_destroy(ddp_store* s); /* >>store */
DDP__PRIVATE void ddp__wait_note(const char* fmt, ...); /* >>signals */
DDP__PRIVATE void ddp__join_progress(ddp_pg* pg, double started, int say); /* >>signals */
DDP__PRIVATE void ddp__wait_watch(int on); /* >>signals */
DDP__PRIVATE void ddp__usr1_follow(ddp_pg* pg); /* >>signals */
DDP__PRIVATE void ddp__usr1_forget(ddp_pg* pg); /* >>signals */
DDP__PRIVATE void ddp__flight_note(ddp_pg* pg, const ddp_work* w, int state); /* >>signals */
DDP__PRIVATE void ddp__flight_dump(ddp_pg* pg, ddp_log_level level, const char* why); /* >>signals */
DDP__PRIVATE ddp_status ddp__desync_check(ddp_pg* pg, const ddp_work* w); /* >>signals */
DDP__PRIVATE ddp_status ddp__agree(ddp_pg* pg); /* >>signals */
DDP__PRIVATE ddp_status ddp__watch_peers(ddp_pg* pg, const char* what, const char* told); /* >>signals */
DDP__PRIVATE ddp_status ddp__watch_count(ddp_pg* pg, unsigned char* gone, double within_s, int* ngone); /* >>signals */
DDP__PRIVATE ddp_status ddp__deadline_report(ddp_pg* pg, const char* what, const char* told); /* >>signals */
#define DDP__WATCH_EVERY_S 1.0 /* a long wait asks the watchdog (>>signals) at most this often, in seconds */
DDP__PRIVATE ddp_status ddp__env_resolve(const ddp_desc* desc, ddp_env* out); /* >>launch */
DDP__PRIVATE ddp_status ddp__bind_cores(ddp_pg* pg); /* >>bind */
DDP__PRIVATE void ddp__cpu_leave(ddp_pg* pg, int how); /* >>cpu */
DDP__PRIVATE ddp_status ddp__cpu_run(ddp_pg* pg, ddp_work* w); /* >>cpu */
DDP__PRIVATE void* ddp__comm_main(void* arg); /* >>cpu */
DDP__PRIVATE const ddp__backend_vt* ddp__cpu_vt(void); /* >>cpu */
DDP__PRIVATE void ddp__trace_write(void); /* >>trace */
DDP__PRIVATE ddp_status ddp__event_create(ddp_device d, ddp_event** out); /* >>cuda */
DDP__PRIVATE ddp_status ddp__event_record(ddp_event* e, ddp_stream* s); /* >>cuda */
DDP__PRIVATE void ddp__event_destroy(ddp_event* e); /* >>cuda */
#if DDP__CUDA
DDP__PRIVATE const ddp__backend_vt* ddp__nccl_vt(void); /* >>nccl */
#endif
#if DDP__MPI
DDP__PRIVATE const ddp__backend_vt* ddp__mpi_vt(void); /* >>mpi */
DDP__PRIVATE ddp_status ddp__mpi_join(const ddp_desc* d, ddp_pg* pg); /* >>mpi */
DDP__PRIVATE void ddp__mpi_leave(ddp_pg* pg); /* >>mpi */
#endif

DDP__DEF int ddp_rank(const ddp_pg* pg) { return pg->rank; }
DDP__DEF int ddp_world_size(const ddp_pg* pg) { return pg->world; }
DDP__PRIVATE int ddp__local_rank(const ddp_pg* pg) { return pg->env.local_rank; }
DDP__PRIVATE int ddp__local_world_size(const ddp_pg* pg) { return pg->env.local_world_size; }
DDP__DEF ddp_backend ddp_pg_backend(const ddp_pg* pg) { return pg->backend; }
DDP__DEF ddp_device ddp_pg_device(const ddp_pg* pg) { return pg->device; }
DDP__DEF ddp_store* ddp_pg_store(ddp_pg* pg) { return pg->store; }
/* Order later collectives after the work queued so far on `s` (e.g. the model's compute stream);
   NULL: no ordering beyond the host's. */
DDP__PRIVATE void ddp__pg_set_stream(ddp_pg* pg, ddp_stream* s) { pg->user_stream = s; }
DDP__DEF void ddp_pg_bytes(const ddp_pg* pg, uint64_t* sent, uint64_t* received) {
    if (sent) *sent = DDP__READ_COUNT(pg->bytes_sent);
    if (received) *received = DDP__READ_COUNT(pg->bytes_received);
}

DDP__DEF uint64_t ddp_pg_collectives(const ddp_pg* pg) { return pg->seq; }

DDP__PRIVATE const char* ddp__coll_name(int kind) {
    switch (kind) {
    case DDP__ALL_REDUCE: return "all_reduce";
    case DDP__BROADCAST: return "broadcast";
    case DDP__ALL_GATHER: return "all_gather";
    case DDP__REDUCE_SCATTER: return "reduce_scatter";
    }
    return "?";
}

/* How messages name a collective: "all_reduce #42 (1091 x f32, sum)", "broadcast #7 (13 x f32, root 0)". */
DDP__PRIVATE void ddp__fingerprint(const ddp_work* w, char* out, size_t n) {
    if (w->kind == DDP__BROADCAST)
        snprintf(out, n, "%s #%llu (%zu x %s, root %d)", ddp__coll_name(w->kind), (unsigned long long)w->seq,
                 w->count, ddp__dtype_name(w->dtype), w->root);
    else
        snprintf(out, n, "%s #%llu (%zu x %s, %s)", ddp__coll_name(w->kind), (unsigned long long)w->seq, w->count,
                 ddp__dtype_name(w->dtype), w->op == DDP_SUM ? "sum" : w->op == DDP_AVG ? "avg" : "max");
}

/* A failed or timed-out collective breaks the group: later calls fail at once with its message
   (the first failure's, kept under the lock that the communication thread also takes). Returns s. */
DDP__PRIVATE ddp_status ddp__pg_break(ddp_pg* pg, ddp_status s) {
    pthread_mutex_lock(&pg->lock);
    if (!pg->broken) {
        pg->broken = s;
        snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", ddp_error_string());
    }
    pthread_mutex_unlock(&pg->lock);
    return s;
}

DDP__PRIVATE const char* ddp__op_name(ddp_reduce_op op) {
    return op == DDP_SUM ? "sum" : op == DDP_AVG ? "avg" : op == DDP_MAX ? "max" : "?";
}

/* ---- joining the job --------------------------------------------------------------------------- */
/* ddp_init connects to the store, then agrees with the others on the world (>>signals,
   ddp__agree): no two processes with one rank, one launch per node, one WORLD_SIZE. */

DDP__PRIVATE ddp_status ddp__named_backend(const ddp_desc* d, ddp_backend* out) {
    const char* env = getenv("DDP_BACKEND");
    *out = d->backend;
    if (*out == DDP_BACKEND_DEFAULT && env && *env) {
        if (!strcmp(env, "cpu") || !strcmp(env, "gloo")) *out = DDP_BACKEND_CPU;
        else if (!strcmp(env, "nccl")) *out = DDP_BACKEND_NCCL;
        else if (!strcmp(env, "mpi")) *out = DDP_BACKEND_MPI;
        else return ddp__fail(DDP_ERR_ENV, "DDP_BACKEND=%s is not cpu, nccl or mpi", env);
    }
    if (*out == DDP_BACKEND_MPI && !DDP__MPI)
        return ddp__fail(DDP_ERR_NOT_BUILT, "the mpi backend was asked for (%s), but this program was built without "
                         "it: compile with -DDDP_MPI and mpicc's flags (make builds the _mpi programs when it finds "
                         "mpicc; " DDP__HINT_INSTALL_MPI "), or use the cpu backend",
                         d->backend == DDP_BACKEND_MPI ? "desc.backend" : "DDP_BACKEND=mpi");
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__pick_backend(const ddp_desc* d, ddp_device dev, ddp_backend* out) {
    DDP__TRY(ddp__named_backend(d, out));
    if (*out == DDP_BACKEND_DEFAULT) *out = dev.type == DDP_DEVICE_CUDA ? DDP_BACKEND_NCCL : DDP_BACKEND_CPU;
    if (*out == DDP_BACKEND_NCCL && dev.type != DDP_DEVICE_CUDA)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "the nccl backend needs GPU buffers, but this rank's device is "
                         "the CPU (%s): use the cpu backend", ddp__cuda_unavailable_reason());
    return DDP_OK;
}

/* ddp_init failed with the store up. The checks made together (agree, shared GPUs) stop every rank
   with the same words, but rank 0 hosts the store: were it to close the store at once, a neighbour
   still between two store calls would report a lost store instead of the cause. So each rank says
   it is leaving, and rank 0 waits for all of them (a rank that failed alone waits at most 5 s). */
DDP__PRIVATE void ddp__init_failed_leave(ddp_pg* pg) {
    int64_t left = 0;
    double until = ddp__now() + (pg->timeout < 5.0 ? pg->timeout : 5.0);
    if (ddp__store_add(pg->store, "ddp/init_failed", 1, &left) != DDP_OK) return;
    if (pg->rank != 0) {
        /* When every rank failed (the usual case: they reached the same verdict), wait for rank 0 to
           close the store, so that rank 0 returns, and its program prints why, first: a launcher
           stops the job once one rank has exited, and rank 0, the last to leave (below), would be
           stopped before saying why. A rank that failed alone leaves after a second. */
        double soon = ddp__now() + 1.0;
        while (ddp__now() < until && (left >= pg->world || ddp__now() < soon) &&
               ddp__store_add(pg->store, "ddp/init_failed", 0, &left) == DDP_OK)
            ddp__sleep(0.002);
        return;
    }
    while (left < pg->world && ddp__now() < until && ddp__store_add(pg->store, "ddp/init_failed", 0, &left) == DDP_OK)
        ddp__sleep(0.002);
}

DDP__DEF ddp_status ddp_init(const ddp_desc* desc, ddp_pg** out) {
    ddp_desc d;
    ddp_pg* pg;
    ddp_store_desc sd;
    ddp_device want;
    ddp_status s;
    char devname[32];
    *out = NULL;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.log) ddp__set_log(d.log, d.log_user);
    pg = (ddp_pg*)ddp__calloc(sizeof *pg);
    if (!pg) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a process group failed");
    ddp__wait_watch(1); /* a SIGTERM or SIGINT from here to the end says what init waited for */
    pg->left_fd = pg->right_fd = -1;
    pthread_mutex_init(&pg->lock, NULL);
    pthread_cond_init(&pg->cond, NULL);
    pthread_cond_init(&pg->done_cond, NULL);
    s = ddp__named_backend(&d, &pg->backend);
#if DDP__MPI
    if (s == DDP_OK && pg->backend == DDP_BACKEND_MPI) {
        pg->vt = ddp__mpi_vt(); /* from here on ddp_destroy cleans MPI up */
        s = ddp__mpi_join(&d, pg);  /* placement from MPI_COMM_WORLD; also creates the store */
    } else
#endif
    if (s == DDP_OK) s = ddp__env_resolve(&d, &pg->env);
    if (s != DDP_OK) goto fail;
    pg->rank = pg->env.rank;
    pg->world = pg->env.world_size;
    s = ddp__timeout(d.timeout_s, &pg->timeout);
    if (s != DDP_OK) goto fail;
    want = d.device;
    if (want.type == DDP_DEVICE_AUTO) {
        /* One GPU per rank when this machine shows enough of them (NCCL refuses two ranks on one
           GPU), else the CPU for every rank. Fewer GPUs than local ranks may still be one each:
           CUDA_VISIBLE_DEVICES set per rank (SLURM's --gpus-per-task) shows each rank only its
           own. That is settled with the other ranks, once the store is up. */
        int gpus = ddp__cuda_device_count();
        want.type = gpus >= pg->env.local_world_size ? DDP_DEVICE_CUDA : gpus > 0 ? DDP_DEVICE_AUTO : DDP_DEVICE_CPU;
        want.index = gpus > 0 ? pg->env.local_rank % gpus : 0;
    } else if (want.type == DDP_DEVICE_CUDA && ddp__cuda_device_count() > 0) {
        int gpus = ddp__cuda_device_count();
        if (d.device.index == 0) /* "cuda" means this rank's GPU: LOCAL_RANK picks it */
            want.index = pg->env.local_rank % gpus;
        else if (gpus == 1 && d.device.index == pg->env.local_rank) {
            /* cuda:LOCAL_RANK where each rank is shown only its own GPU */
            ddp__log(DDP_LOG_INFO, "device cuda:%d is this rank's LOCAL_RANK, and this process sees one GPU "
                    "(CUDA_VISIBLE_DEVICES=%s): using it", d.device.index,
                    getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
            want.index = 0;
        }
    }
    /* torch.cuda.set_device(rank): fine on one machine, where RANK == LOCAL_RANK; past this
       machine's GPUs on the next one. Said before the device is even looked at, so a machine
       without that GPU (or without any) shows the cause next to the error. */
    if (d.device.type == DDP_DEVICE_CUDA && d.device.index > 0 && d.device.index == pg->env.rank &&
        pg->env.rank != pg->env.local_rank)
        ddp__log(DDP_LOG_WARN, "device cuda:%d is this process's RANK, but a GPU is picked by LOCAL_RANK (%d here): "
                "RANK counts the ranks of every machine, so from the second machine on it points past this "
                "machine's GPUs. Use cuda:LOCAL_RANK, or \"cuda\", which picks this rank's GPU",
                d.device.index, pg->env.local_rank);
    s = want.type == DDP_DEVICE_AUTO ? DDP_OK : ddp_device_resolve(want, &pg->device);
    if (s != DDP_OK) goto fail;
    memset(&sd, 0, sizeof sd);
    sd.host = pg->env.master_addr;
    sd.port = pg->env.master_port;
    sd.is_server = pg->rank == 0;
    sd.timeout_s = pg->timeout;
    sd.token = d.token;
    if (pg->rank == 0) ddp__wait_note("starting the rendezvous store on port %d", sd.port);
    else ddp__wait_note("connecting to the rendezvous store at %s:%d, which rank 0 hosts", sd.host, sd.port);
    s = pg->store ? DDP_OK : ddp__store_create(&sd, &pg->store); /* the mpi backend made it already */
    if (s == DDP_OK) s = ddp__agree(pg);
    if (s == DDP_OK && want.type == DDP_DEVICE_AUTO) s = ddp__own_gpu(pg, want, &pg->device);
    if (s == DDP_OK) s = ddp__pick_backend(&d, pg->device, &pg->backend);
    if (s == DDP_OK && want.type != DDP_DEVICE_AUTO && pg->backend == DDP_BACKEND_NCCL) s = ddp__nccl_gpu_own(pg);
    if (s != DDP_OK) goto fail;
    s = ddp__bind_cores(pg); /* now that this rank's GPU, and so its NUMA node, is known */
    if (s != DDP_OK) goto fail;
#if DDP__CUDA
    if (pg->backend == DDP_BACKEND_NCCL) pg->vt = ddp__nccl_vt();
    else
#endif
#if DDP__MPI
    if (pg->backend == DDP_BACKEND_MPI) pg->vt = ddp__mpi_vt();
    else
#endif
        pg->vt = ddp__cpu_vt();
    ddp__wait_note("connecting to the other ranks (backend %s)", pg->vt->name);
    s = pg->vt->connect(pg);
    if (s != DDP_OK) goto fail;
    if (pg->vt == ddp__cpu_vt()) {
        if (pthread_create(&pg->thread, NULL, ddp__comm_main, pg) != 0) {
            s = ddp__fail(DDP_ERR_IO, "starting the communication thread failed");
            goto fail;
        }
        pg->thread_started = 1;
    }
#if defined(DDP_CBLAS) && defined(OPENBLAS_VERSION)
    {
        /* ranks on one machine share its cores: give each its share of BLAS threads, unless the
           user chose (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS) */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int share = (int)(cores / (pg->env.local_world_size > 0 ? pg->env.local_world_size : 1));
        if (!getenv("OPENBLAS_NUM_THREADS") && !getenv("OMP_NUM_THREADS")) openblas_set_num_threads(share > 0 ? share : 1);
    }
#endif
    /* Nobody leaves init before everyone has read what it needs from the store. */
    ddp__wait_note("waiting for every rank to finish ddp_init");
    s = ddp__store_barrier(pg->store, "init", pg->world);
    if (s != DDP_OK) goto fail;
    pg->joined = 1;
    ddp__usr1_follow(pg); /* SIGUSR1 prints this group's last collectives */
    {
        char host[256] = "?";
        gethostname(host, sizeof host - 1);
        ddp__log(DDP_LOG_INFO, "joined the job on host %s: backend %s, device %s, store %s:%d (placement from %s)",
                host, pg->vt->name, ddp_device_name(pg->device, devname, sizeof devname), pg->env.master_addr,
                pg->env.master_port, pg->env.source);
    }
    ddp__wait_watch(0);
    *out = pg;
    return DDP_OK;
fail:
    {
        char msg[sizeof ddp__err_msg];
        const char* fix = ddp__err_fix;
        memcpy(msg, ddp__err_msg, sizeof msg);
        if (pg->store && !pg->joined) ddp__init_failed_leave(pg);
        ddp_destroy(pg);
        ddp__fail(s, "%s", msg);
        ddp__err_fix = fix;
    }
    ddp__wait_watch(0);
    return s;
}

DDP__DEF void ddp_destroy(ddp_pg* pg) {
    int wait_store = 0;
    double deadline = 0;
    if (!pg) return;
    ddp__usr1_forget(pg);
    if (pg->joined) {
        /* Rank 0 hosts the store: it stays until every rank has left, or a rank still on its way
           out of ddp_init, or reading a key, would find the store gone (torchrun's exit barrier). */
        int64_t left = 0;
        if (pg->vt == ddp__cpu_vt()) ddp__cpu_leave(pg, DDP__LEFT_DESTROY);
#if DDP__MPI
        if (pg->vt == ddp__mpi_vt()) ddp__mpi_leave(pg);
#endif
        deadline = pg->leave_by = ddp__now() + pg->timeout;
        if (ddp__store_add(pg->store, "ddp/left", 1, &left) == DDP_OK) {
            double look = ddp__now() + DDP__WATCH_EVERY_S;
            int ended = 0; /* ranks whose process has ended without leaving: nobody waits for them */
            if (pg->rank != 0) wait_store = 1;
            while (pg->rank == 0 && left + ended < pg->world && ddp__now() < deadline &&
                   ddp__store_add(pg->store, "ddp/left", 0, &left) == DDP_OK) {
                ddp__sleep(0.002);
                if (ddp__now() >= look) {
                    unsigned char* gone = (unsigned char*)ddp__calloc((size_t)pg->world);
                    if (gone && ddp__watch_count(pg, gone, 2.0, &ended) != DDP_OK) ended = 0;
                    if (gone) DDP_FREE(gone);
                    look = ddp__now() + DDP__WATCH_EVERY_S;
                }
            }
            if (left < pg->world && pg->rank == 0 && left + ended >= pg->world)
                ddp__log(DDP_LOG_WARN, "ddp_destroy: %d of the %d ranks ended their process without reaching ddp_destroy "
                        "(after a failure, or a program that returns from main without it): see their output", ended,
                        pg->world);
            else if (left < pg->world && pg->rank == 0)
                ddp__log(DDP_LOG_WARN, "ddp_destroy: only %lld of %d ranks reached ddp_destroy within %.0f s; the others "
                        "are still inside a collective or have failed (see their output)", (long long)left, pg->world,
                        pg->timeout);
            else if (pg->rank == 0 && ddp__store_add(pg->store, "ddp/exited", 0, &left) == DDP_OK && left > 0)
                ddp__log(DDP_LOG_WARN, "ddp_destroy: %lld of the %d ranks ended their process without calling ddp_destroy "
                        "(after a failure, or a program that returns from main without it): see their output",
                        (long long)left, pg->world);
        }
    }
    if (pg->vt) pg->vt->destroy(pg);
    /* The other ranks return only once rank 0 has stopped the store (it closes their connections
       after its listening socket): a program that calls ddp_init again at once then reaches the
       next job's store, never this one on its way out, where its rank would already be taken. */
    if (wait_store && !ddp__store_wait_closed(pg->store, deadline))
        ddp__log(DDP_LOG_WARN, "ddp_destroy: rank 0 has not closed the store within %.0f s of this rank leaving (it is "
                "still busy, or waiting for a rank that never called ddp_destroy); a ddp_init now on the same port could "
                "meet that store", pg->timeout);
    ddp__trace_write(); /* DDP_TRACE: this rank's file, while its rank is still known */
    ddp_free(pg->device, pg->one);
    ddp__store_destroy(pg->store);
    if (pg->live_keys) DDP_FREE(pg->live_keys);
    pthread_mutex_destroy(&pg->lock);
    pthread_cond_destroy(&pg->cond);
    pthread_cond_destroy(&pg->done_cond);
    DDP_FREE(pg);
}

/* ---- the collectives' common entrance -------------------------------------------------------------- */

/* All-gather and reduce-scatter read and write buffers of different sizes: W*count elements on one
   side, count on the other. NCCL defines only two layouts: the buffers apart, or the small one being
   this rank's own slot of the large one (in place: all-gather's send is recv + rank*count,
   reduce-scatter's recv is send + rank*count). Other overlaps are undefined there; they are refused
   on every backend, so that a program that runs on the CPU also runs on GPUs. *in_place says which
   of the two layouts (the mpi backend hands MPI a copy then: MPI allows no aliasing). */
DDP__PRIVATE ddp_status ddp__layout(const ddp_pg* pg, int kind, const void* buf, const void* send, size_t count,
                                    ddp_dtype dtype, int* in_place) {
    const uintptr_t part = (uintptr_t)(count * ddp_dtype_size(dtype)), whole = part * (uintptr_t)pg->world;
    const uintptr_t big = (uintptr_t)(kind == DDP__ALL_GATHER ? buf : send);
    const uintptr_t small = (uintptr_t)(kind == DDP__ALL_GATHER ? send : buf);
    const char* name = kind == DDP__ALL_GATHER ? "send" : "recv";
    *in_place = 0;
    if ((kind != DDP__ALL_GATHER && kind != DDP__REDUCE_SCATTER) || count == 0) return DDP_OK;
    *in_place = small == big + (uintptr_t)pg->rank * part;
    if (*in_place || small + part <= big || big + whole <= small) return DDP_OK;
    return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "%s: send and recv overlap (%s starts %ld bytes into %s's %lu), but "
                     "not in the in-place layout, where %s = %s + rank * count (here %lu bytes in, rank %d): NCCL "
                     "leaves any other overlap undefined. Give %s a buffer of its own, or put it at this rank's slot",
                     ddp__coll_name(kind), name, (long)(small - big), kind == DDP__ALL_GATHER ? "recv" : "send",
                     (unsigned long)whole, name, kind == DDP__ALL_GATHER ? "recv" : "send",
                     (unsigned long)((uintptr_t)pg->rank * part), pg->rank, name);
}

DDP__PRIVATE ddp_status ddp__collective(ddp_pg* pg, int kind, void* buf, const void* send, size_t count,
                                        ddp_dtype dtype, ddp_reduce_op op, int root, int lazy, const ddp__fused* f,
                                        ddp_work** work) {
    ddp_work* w;
    ddp_status s;
    int in_place;
    if (work) *work = NULL;
    if (dtype == DDP_DTYPE_DEFAULT) dtype = DDP_F32;
    if (ddp_dtype_size(dtype) == 0)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", ddp__coll_name(kind), (int)dtype);
    if (op != DDP_SUM && op != DDP_AVG && op != DDP_MAX)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "%s: unknown reduce op %d", ddp__coll_name(kind), (int)op);
    if (root < 0 || root >= pg->world)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "broadcast: root %d is not a rank (0..%d)", root, pg->world - 1);
    if (count > 0 && (!buf || ((kind == DDP__ALL_GATHER || kind == DDP__REDUCE_SCATTER) && !send)))
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "%s: a buffer is NULL", ddp__coll_name(kind));
    DDP__TRY(ddp__layout(pg, kind, buf, send, count, dtype, &in_place));
    pthread_mutex_lock(&pg->lock); /* the communication thread sets broken under it */
    s = pg->broken;
    if (s != DDP_OK) {
        char msg[sizeof pg->broken_msg];
        memcpy(msg, pg->broken_msg, sizeof msg);
        pthread_mutex_unlock(&pg->lock);
        return ddp__fail(s, "an earlier collective failed, so this group can no longer be used: %s", msg);
    }
    pthread_mutex_unlock(&pg->lock);
    w = (ddp_work*)ddp__calloc(sizeof *w);
    if (!w) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a work handle failed");
    w->pg = pg, w->kind = kind, w->buf = buf, w->send = send, w->count = count;
    w->dtype = dtype, w->op = op, w->root = root, w->seq = ++pg->seq, w->lazy = lazy, w->in_place = in_place;
    if (f) w->premul = f->premul, w->ntensors = f->ntensors, w->tensors = f->tensors, w->tensor_at = f->tensor_at;
    ddp__flight_note(pg, w, DDP__FL_QUEUED);
    if (ddp__log_level_enabled() >= DDP_LOG_DETAIL && pg->world > 1 && (s = ddp__desync_check(pg, w)) != DDP_OK) {
        ddp__flight_note(pg, w, DDP__FL_FAILED);
        DDP_FREE(w);
        return ddp__pg_break(pg, s);
    }
    if (pg->device.type == DDP_DEVICE_CUDA && pg->vt == ddp__cpu_vt()) {
        /* the host thread must not read GPU memory before the kernels writing it are done */
        s = ddp__event_create(pg->device, &w->ready);
        if (s == DDP_OK) s = ddp__event_record(w->ready, pg->user_stream);
        if (s != DDP_OK) {
            ddp__event_destroy(w->ready);
            DDP_FREE(w);
            return s;
        }
    }
    if (!work && pg->vt == ddp__cpu_vt()) {
        /* A blocking call with nothing queued runs right here: handing it to the communication
           thread and waiting for it to finish would only add two thread switches. */
        int idle;
        pthread_mutex_lock(&pg->lock);
        idle = !pg->head && !pg->inline_busy;
        if (idle) pg->inline_busy = 1;
        pthread_mutex_unlock(&pg->lock);
        if (idle) {
            s = ddp__cpu_run(pg, w);
            pthread_mutex_lock(&pg->lock);
            pg->inline_busy = 0;
            if (s != DDP_OK && !pg->broken) {
                pg->broken = s;
                snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", ddp_error_string());
            }
            if (pg->head) pthread_cond_signal(&pg->cond); /* queued by another thread meanwhile */
            pthread_mutex_unlock(&pg->lock);
            ddp__event_destroy(w->ready);
            DDP_FREE(w);
            return s;
        }
    }
    s = pg->vt->submit(pg, w);
    if (s != DDP_OK) {
        ddp__event_destroy(w->ready);
        DDP_FREE(w);
        return s;
    }
    if (work) {
        *work = w;
        return DDP_OK;
    }
    return ddp_work_wait(w);
}

DDP__DEF ddp_status ddp_work_wait(ddp_work* w) {
    ddp_status s;
    ddp_pg* pg;
    if (!w) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_work_wait: work is NULL");
    pg = w->pg;
    s = pg->vt->wait(pg, w);
    /* the CPU backend's wait frees w, or (abandoned) leaves it to the communication thread */
    if (pg->vt != ddp__cpu_vt()) {
        ddp__event_destroy(w->ready);
        DDP_FREE(w);
    }
    return s;
}

/* *done = 1 when the collective has finished (successfully or not), without blocking. */
DDP__PRIVATE ddp_status ddp__work_test(ddp_work* w, int* done) {
    if (!w) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp__work_test: work is NULL");
    return w->pg->vt->test(w->pg, w, done);
}

DDP__DEF ddp_status ddp_all_reduce(ddp_pg* pg, void* buf, size_t count, ddp_dtype dtype, ddp_reduce_op op,
                                   ddp_work** work) {
    return ddp__collective(pg, DDP__ALL_REDUCE, buf, NULL, count, dtype, op, 0, 0, NULL, work);
}
/* buf[0..count) = root's buf, on every rank. */
DDP__PRIVATE ddp_status ddp__broadcast(ddp_pg* pg, void* buf, size_t count, ddp_dtype dtype, int root, ddp_work** work) {
    return ddp__collective(pg, DDP__BROADCAST, buf, NULL, count, dtype, DDP_SUM, root, 0, NULL, work);
}
DDP__DEF ddp_status ddp_all_gather(ddp_pg* pg, const void* send, void* recv, size_t count, ddp_dtype dtype,
                                   ddp_work** work) {
    return ddp__collective(pg, DDP__ALL_GATHER, recv, send, count, dtype, DDP_SUM, 0, 0, NULL, work);
}
DDP__DEF ddp_status ddp_reduce_scatter(ddp_pg* pg, const void* send, void* recv, size_t count, ddp_dtype dtype,
                                       ddp_reduce_op op, ddp_work** work) {
    return ddp__collective(pg, DDP__REDUCE_SCATTER, recv, send, count, dtype, op, 0, 0, NULL, work);
}
DDP__DEF ddp_status ddp_barrier(ddp_pg* pg) {
    /* an all-reduce of one number: ordered with the other collectives, and done by every rank
       only when every rank has contributed */
    if (!pg->one) DDP__TRY(ddp_alloc(pg->device, sizeof(float), (void**)&pg->one)); /* kept: no malloc per call */
    return ddp_all_reduce(pg, pg->one, 1, DDP_F32, DDP_SUM, NULL);
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>launch: reading the launcher's environment                                   (chapters 3-5)  */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE ddp_status ddp__slurm_first_host(const char* nodelist, char* out, size_t outsize); /* >>slurm */

/*
   Three jobs live here, in the order a process meets them:
     1. ddp__env_resolve: "who am I in this job?" A launcher (ddprun, torchrun, mpirun, srun) puts
        the answer in environment variables, each launcher under its own names.
     2. ddp_spawn: start N copies of a C function on this machine (torch.multiprocessing.spawn).
     3. the supervision of child processes that ddp_spawn and the ddprun program share: reap
        children without blocking, stop the others when one fails (SIGTERM, then SIGKILL after a
        grace period), pass the launcher's own SIGINT/SIGTERM on, and keep a guardian process
        that stops the ranks if the launcher itself is killed.
   ddprun itself (torchrun's analogue: flags, restarts, output prefixed by rank) is a user of this
   header, in tools/ddprun.c; it is not compiled into a training program.
*/

#include <fcntl.h>      /* open, fcntl(FD_CLOEXEC) */
#include <limits.h>     /* INT_MAX */
#include <poll.h>       /* poll over the children's pipes */
#include <signal.h>     /* sigaction, kill */
#include <sys/types.h>
#include <sys/socket.h> /* a free port: bind to port 0 and ask which one we got */
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/wait.h>   /* waitpid and the W* macros */
#include <time.h>       /* clock_gettime, nanosleep */
#if DDP__LINUX
#include <sys/prctl.h>  /* PR_SET_PDEATHSIG: a rank dies with its launcher */
#endif

#define DDP__MAX_SPAWN 256          /* ranks one ddp_spawn or ddprun starts on a machine */
#define DDP__DEFAULT_PORT 29500     /* torchrun's and TCPStore's default MASTER_PORT */

/* ---- reading the environment -------------------------------------------------------------------- */

/* The variable names one launcher uses. The first one that is present decides everything: mixing
   torchrun's RANK with SLURM's SLURM_NTASKS would give nonsense. */
typedef struct ddp__env_src {
    const char* source;                                        /* ddp_env.source */
    const char *rank, *world, *local_rank, *local_world, *node; /* node may be NULL */
    const char* setter;                                        /* who normally sets them */
} ddp__env_src;

static const char* const ddp__env_what_rank = "this process's number, 0 to the world size - 1";
static const char* const ddp__env_what_world = "the number of processes";
static const char* const ddp__env_what_local_rank = "this process's number on its machine";
static const char* const ddp__env_what_local_world = "the number of processes on this machine";
static const char* const ddp__env_what_node = "this machine's number, 0 to the number of machines - 1";

/* A whole decimal number: strtol must use every character, so "3x", "" and " 3" are refused. */
DDP__PRIVATE int ddp__env_parse_int(const char* s, long* out) {
    char* end;
    long v;
    if (!s || !*s || isspace((unsigned char)*s)) return 0;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != 0 || v > INT_MAX || v < -INT_MAX) return 0;
    *out = v;
    return 1;
}

/* Read the integer variable `name` (at least `min`) into *out. `because` names the variable that
   made this source count (for "X is not set but Y is"); `what` completes "set X to ...". */
DDP__PRIVATE ddp_status ddp__env_read(const ddp__env_src* s, const char* name, const char* because,
                                      const char* what, int min, int* out) {
    const char* v = getenv(name);
    long x;
    if (!v)
        return ddp__fail(DDP_ERR_ENV, "%s is not set but %s is: set %s to %s (%s sets it)", name,
                         because, name, what, s->setter);
    if (!*v)
        return ddp__fail(DDP_ERR_ENV, "%s is set but empty: set %s to %s (%s sets it)", name, name,
                         what, s->setter);
    if (!ddp__env_parse_int(v, &x))
        return ddp__fail(DDP_ERR_ENV, "%s=%s is not a whole number: set %s to %s (%s sets it)", name, v,
                         name, what, s->setter);
    if (x < min)
        return ddp__fail(DDP_ERR_ENV, "%s=%s is %s: set %s to %s (%s sets it)", name, v,
                         min == 0 ? "negative" : "below 1", name, what, s->setter);
    *out = (int)x;
    return DDP_OK;
}

/* The numbers must fit together: rank below world size, local rank below local world size. The
   names are the variables' (or desc fields') so the message points at what to change. */
DDP__PRIVATE ddp_status ddp__env_check(const ddp__env_src* s, const ddp_env* e, ddp_status bad) {
    if (e->world_size < 1)
        return ddp__fail(bad, "%s=%d is below 1: set it to %s", s->world, e->world_size, ddp__env_what_world);
    if (e->rank < 0 || e->rank >= e->world_size)
        return ddp__fail(bad, "%s=%d is not below %s=%d: ranks run 0..%d", s->rank, e->rank, s->world,
                         e->world_size, e->world_size - 1);
    if (e->local_world_size < 1 || e->local_world_size > e->world_size)
        return ddp__fail(bad, "%s=%d is not between 1 and %s=%d: set it to %s", s->local_world,
                         e->local_world_size, s->world, e->world_size, ddp__env_what_local_world);
    if (e->local_rank < 0 || e->local_rank >= e->local_world_size)
        return ddp__fail(bad, "%s=%d is not below %s=%d: local ranks run 0..%d", s->local_rank,
                         e->local_rank, s->local_world, e->local_world_size, e->local_world_size - 1);
    return DDP_OK;
}

/* Explicit placement from ddp_desc. A desc without local numbers means one machine. */
DDP__PRIVATE ddp_status ddp__env_explicit(const ddp_desc* d, ddp_env* e) {
    static const ddp__env_src src = {"explicit", "desc.rank", "desc.world_size", "desc.local_rank",
                                     "desc.local_world_size", NULL, "your program"};
    e->rank = d->rank;
    e->world_size = d->world_size;
    e->local_rank = d->local_world_size > 0 ? d->local_rank : d->rank;
    e->local_world_size = d->local_world_size > 0 ? d->local_world_size : d->world_size;
    if (d->local_world_size <= 0 && d->local_rank != 0)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "desc.local_rank=%d is set but desc.local_world_size "
                         "is not: set both, or neither for ranks that all run on this machine", d->local_rank);
    DDP__TRY(ddp__env_check(&src, e, DDP_ERR_INVALID_ARGUMENT));
    e->node_rank = e->rank / e->local_world_size;
    e->source = src.source;
    return DDP_OK;
}

/* torchrun's (and ddprun's) variables. LOCAL_RANK and LOCAL_WORLD_SIZE may both be missing (a
   hand-made launch on one machine); one without the other is a mistake. */
DDP__PRIVATE ddp_status ddp__env_torchrun(ddp_env* e) {
    static const ddp__env_src s = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK", "ddprun"};
    int has_lr = getenv("LOCAL_RANK") != NULL, has_lw = getenv("LOCAL_WORLD_SIZE") != NULL;
    DDP__TRY(ddp__env_read(&s, "RANK", "RANK", ddp__env_what_rank, 0, &e->rank));
    DDP__TRY(ddp__env_read(&s, "WORLD_SIZE", "RANK", ddp__env_what_world, 1, &e->world_size));
    if (!has_lr && !has_lw) {
        e->local_rank = e->rank;
        e->local_world_size = e->world_size;
        ddp__log(DDP_LOG_INFO, "LOCAL_RANK and LOCAL_WORLD_SIZE are not set: assuming all %d ranks run on "
                "this machine (local rank = rank)", e->world_size);
    } else {
        DDP__TRY(ddp__env_read(&s, "LOCAL_RANK", has_lr ? "RANK" : "LOCAL_WORLD_SIZE",
                               ddp__env_what_local_rank, 0, &e->local_rank));
        DDP__TRY(ddp__env_read(&s, "LOCAL_WORLD_SIZE", "LOCAL_RANK", ddp__env_what_local_world, 1,
                               &e->local_world_size));
    }
    DDP__TRY(ddp__env_check(&s, e, DDP_ERR_ENV));
    if (getenv("GROUP_RANK")) DDP__TRY(ddp__env_read(&s, "GROUP_RANK", "RANK", ddp__env_what_node, 0, &e->node_rank));
    else e->node_rank = e->rank / e->local_world_size;
    e->source = s.source;
    return DDP_OK;
}

/* Open MPI's variables (mpirun -np N): all four are always exported together. */
DDP__PRIVATE ddp_status ddp__env_openmpi(ddp_env* e) {
    static const ddp__env_src s = {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, "mpirun"};
    DDP__TRY(ddp__env_read(&s, s.rank, s.rank, ddp__env_what_rank, 0, &e->rank));
    DDP__TRY(ddp__env_read(&s, s.world, s.rank, ddp__env_what_world, 1, &e->world_size));
    DDP__TRY(ddp__env_read(&s, s.local_rank, s.rank, ddp__env_what_local_rank, 0, &e->local_rank));
    DDP__TRY(ddp__env_read(&s, s.local_world, s.rank, ddp__env_what_local_world, 1, &e->local_world_size));
    DDP__TRY(ddp__env_check(&s, e, DDP_ERR_ENV));
    e->node_rank = e->rank / e->local_world_size; /* mpirun fills each node's slots in turn */
    e->source = s.source;
    return DDP_OK;
}

/* SLURM writes tasks per node as "2", "2(x3)" (2 on each of 3 nodes) or "3,2" (3 on the first
   node, 2 on the second). We take the first number: the usual case is the same on every node. */
DDP__PRIVATE ddp_status ddp__env_slurm_local_world(ddp__env_src* s, int* out) {
    const char* name = getenv("SLURM_NTASKS_PER_NODE") ? "SLURM_NTASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    const char* v = getenv(name);
    char* end;
    long x;
    s->local_world = name;
    if (!v)
        return ddp__fail(DDP_ERR_ENV, "neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set but "
                         "SLURM_PROCID is: run the program through srun, which sets them");
    errno = 0;
    x = isdigit((unsigned char)v[0]) ? strtol(v, &end, 10) : -1;
    if (x < 1 || errno != 0 || x > INT_MAX || (*end != 0 && *end != '(' && *end != ','))
        return ddp__fail(DDP_ERR_ENV, "%s=%s is not a task count such as 2 or 2(x3): set it to %s "
                         "(srun sets it)", name, v, ddp__env_what_local_world);
    *out = (int)x;
    return DDP_OK;
}

/* SLURM's variables under srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID. */
DDP__PRIVATE ddp_status ddp__env_slurm(ddp_env* e) {
    ddp__env_src s = {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE",
                      "SLURM_NODEID", "srun"};
    DDP__TRY(ddp__env_read(&s, s.rank, s.rank, ddp__env_what_rank, 0, &e->rank));
    DDP__TRY(ddp__env_read(&s, s.world, s.rank, ddp__env_what_world, 1, &e->world_size));
    DDP__TRY(ddp__env_read(&s, s.local_rank, s.rank, ddp__env_what_local_rank, 0, &e->local_rank));
    DDP__TRY(ddp__env_slurm_local_world(&s, &e->local_world_size));
    DDP__TRY(ddp__env_read(&s, s.node, s.rank, ddp__env_what_node, 0, &e->node_rank));
    DDP__TRY(ddp__env_check(&s, e, DDP_ERR_ENV));
    e->source = s.source;
    return DDP_OK;
}

/* Where rank 0's store listens: desc, MASTER_ADDR, SLURM's first host, or this machine for a job
   that cannot span machines. A multi-machine job without an address is an error, never a guess. */
DDP__PRIVATE ddp_status ddp__env_master_addr(const ddp_desc* d, ddp_env* e) {
    const char* a = d && d->master_addr && *d->master_addr ? d->master_addr : getenv("MASTER_ADDR");
    const char* list = getenv("SLURM_JOB_NODELIST") ? getenv("SLURM_JOB_NODELIST") : getenv("SLURM_NODELIST");
    if (a && *a) {
        const char* colon = strchr(a, ':');
        if (strlen(a) >= sizeof e->master_addr)
            return ddp__fail(DDP_ERR_ENV, "MASTER_ADDR is %d characters long; at most %d fit",
                             (int)strlen(a), (int)sizeof e->master_addr - 1);
        /* one colon is "host:port" (an IPv6 address has several): a common slip */
        if (colon && !strchr(colon + 1, ':'))
            return ddp__fail(DDP_ERR_ENV, "MASTER_ADDR=%s holds a port: give only the host in MASTER_ADDR "
                             "(MASTER_ADDR=%.*s) and the port in MASTER_PORT (MASTER_PORT=%s)", a, (int)(colon - a),
                             a, colon + 1);
        strcpy(e->master_addr, a);
        return DDP_OK;
    }
    if (!strcmp(e->source, "slurm") && list)
        return ddp__slurm_first_host(list, e->master_addr, sizeof e->master_addr);
    if (e->world_size > 1 && !strcmp(e->source, "openmpi"))
        return ddp__fail(DDP_ERR_ENV, "MASTER_ADDR is not set: Open MPI exports no master address, so "
                         "MASTER_ADDR and MASTER_PORT must be set and passed on, e.g. "
                         "mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=29500 ...");
    if (e->world_size > 1 && !strcmp(e->source, "torchrun"))
        return ddp__fail(DDP_ERR_ENV, "MASTER_ADDR is not set but WORLD_SIZE=%d: set MASTER_ADDR to the "
                         "address of rank 0's machine, 127.0.0.1 when every rank runs here (ddprun sets it)",
                         e->world_size);
    if (e->world_size > 1 && !strcmp(e->source, "slurm"))
        return ddp__fail(DDP_ERR_ENV, "MASTER_ADDR is not set and neither is SLURM_JOB_NODELIST: set "
                         "MASTER_ADDR to the host of rank 0");
    strcpy(e->master_addr, "127.0.0.1"); /* one process, or explicit ranks: all on this machine */
    return DDP_OK;
}

/* The store's port: desc, MASTER_PORT, SLURM's job id (Lightning's rule, so that two jobs sharing
   a node get different ports), else 29500. */
DDP__PRIVATE ddp_status ddp__env_master_port(const ddp_desc* d, ddp_env* e) {
    const char* p = getenv("MASTER_PORT");
    const char* job = getenv("SLURM_JOB_ID");
    long x;
    if (d && d->master_port > 0) {
        if (d->master_port > 65535)
            return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "desc.master_port=%d is not a port: use 1..65535",
                             d->master_port);
        e->master_port = d->master_port;
    } else if (p) {
        if (!ddp__env_parse_int(p, &x) || x < 1 || x > 65535)
            return ddp__fail(DDP_ERR_ENV, "MASTER_PORT=%s is not a port number: set MASTER_PORT to a free TCP "
                             "port, 1..65535 (ddprun --standalone picks one)", p);
        e->master_port = (int)x;
    } else if (!strcmp(e->source, "slurm") && job && *job) {
        size_t n = strlen(job);
        const char* last4 = n > 4 ? job + n - 4 : job;
        e->master_port = ddp__env_parse_int(last4, &x) && x >= 0 ? 15000 + (int)x : DDP__DEFAULT_PORT;
    } else {
        e->master_port = DDP__DEFAULT_PORT;
    }
    return DDP_OK;
}

/* Resolve rank, world size, local rank and the master address from desc and the environment:
   explicit beats torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK),
   beats Open MPI's (OMPI_COMM_WORLD_*; MASTER_ADDR must be exported when there is more than one
   process), beats SLURM's (counted when SLURM_PROCID and SLURM_NTASKS are set; the master is
   the first host of SLURM_JOB_NODELIST and, without MASTER_PORT, the port is 15000 + the last
   four digits of SLURM_JOB_ID); nothing set means a single process. Also sets the "[rank R/W]"
   prefix of log lines. DDP_ERR_ENV naming the variable and what to set when one is missing,
   non-numeric, out of range or inconsistent with the others; DDP_ERR_INVALID_ARGUMENT naming
   the desc field for explicit values. */
DDP__PRIVATE ddp_status ddp__env_resolve(const ddp_desc* desc, ddp_env* out) {
    ddp_env e;
    ddp_status s;
    if (!out) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp__env_resolve: out is NULL");
    memset(&e, 0, sizeof e);
    if (desc && desc->explicit_rank) s = ddp__env_explicit(desc, &e);
    else if (getenv("RANK")) s = ddp__env_torchrun(&e);
    else if (getenv("OMPI_COMM_WORLD_RANK")) s = ddp__env_openmpi(&e);
    else if (getenv("SLURM_PROCID") && getenv("SLURM_NTASKS")) s = ddp__env_slurm(&e);
    else if (getenv("WORLD_SIZE"))
        /* Half a torchrun setup: without this check the process would quietly run alone. */
        s = ddp__fail(DDP_ERR_ENV, "WORLD_SIZE=%s is set but RANK is not: set RANK to %s (ddprun sets it)",
                      getenv("WORLD_SIZE"), ddp__env_what_rank);
    else {
        e.world_size = e.local_world_size = 1; /* nothing set: a single process */
        e.source = "default";
        s = DDP_OK;
    }
    if (s == DDP_OK) s = ddp__env_master_addr(desc, &e);
    if (s == DDP_OK) s = ddp__env_master_port(desc, &e);
    if (s != DDP_OK) return s;
    *out = e;
    ddp__g.rank = e.rank; /* from now on log lines read "[rank R/W]" */
    ddp__g.world = e.world_size;
    ddp__g.placed = 1;
    ddp__log(DDP_LOG_INFO, "placement from %s: rank %d of %d, local rank %d of %d, node %d, master %s:%d",
            e.source, e.rank, e.world_size, e.local_rank, e.local_world_size, e.node_rank, e.master_addr,
            e.master_port);
    return DDP_OK;
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>data: data files, the distributed sampler, batches                           (chapters 1-2)  */
/* ============================================================================================== */
#if DDP__DECLARE

typedef struct ddp_dataset {
    int n;          /* samples */
    int nfeatures;  /* columns of x */
    int nclasses;   /* labels are 0 .. nclasses-1 */
    float* x;       /* [n, nfeatures], host memory */
    int* y;         /* [n], host memory */
} ddp_dataset;

/* Find a bundled data set by name ("wine", "digits"), looking in `dir` when not NULL, else in
   $DDP_DATA_DIR, else examples/data; or load `name` as a path when it ends in ".csv".
   A CSV file has one header row, then one row per sample whose last column is an integer label
   >= 0. DDP_ERR_IO (naming the places it looked) when it cannot be read, DDP_ERR_DATA_FORMAT
   (naming line and column) when a row is malformed; *out is left empty on error. */
DDP_API ddp_status ddp_dataset_load(const char* name, const char* dir, ddp_dataset* out);
/* Shuffle with `seed` and cut ceil(test_fraction * n) samples into *test, the rest into *train
   (scikit-learn's train_test_split rule; a double, as Python computes it: 0.2 of 100 is 20). DDP_ERR_INVALID_ARGUMENT unless 0 < fraction < 1 and
   both parts are non-empty. */
DDP_API ddp_status ddp_dataset_split(const ddp_dataset* all, double test_fraction, uint64_t seed,
                                     ddp_dataset* train, ddp_dataset* test);
/* Scale each feature to mean 0, variance 1 using the TRAINING set's statistics, applied to both
   (test may be NULL): the test set must not leak into training. Constant features become 0. */
DDP_API void ddp_dataset_standardize(ddp_dataset* train, ddp_dataset* test);
/* Free a data set's arrays and zero it. */
DDP_API void ddp_dataset_free(ddp_dataset* d);

/* The distributed sampler (PyTorch's DistributedSampler): which samples this rank visits in an
   epoch. With shuffling, every rank draws the same permutation of 0..n-1 from seed + epoch; the
   list is padded with its own first entries up to a multiple of the number of replicas (or, with
   drop_last, cut down to one); rank r then takes positions r, r + R, r + 2R, ... So the ranks'
   samples are disjoint apart from the padding, and together they cover the data set. With one
   replica it is simply a seeded shuffle, which is how chapter 1 uses it. */
typedef struct ddp_sampler_desc {
    const ddp_pg* pg;  /* replicas and rank from this group; NULL: num_replicas and rank below */
    int num_replicas;  /* without pg; 0 means 1 */
    int rank;          /* without pg */
    uint64_t seed;     /* must be the same on every rank; default 0 */
    int in_order;      /* 1: keep the data set's order (PyTorch's shuffle=False); default: shuffle */
    int drop_last;     /* 1: drop the tail instead of padding */
} ddp_sampler_desc;

typedef struct ddp_sampler {
    int n, num_replicas, rank, shuffle, drop_last, epoch;
    uint64_t seed;
    int num_samples;   /* indices per rank per epoch: ceil(n/R), or floor(n/R) with drop_last */
    int total_size;    /* num_samples * R: n plus the padding, or less the dropped tail */
} ddp_sampler;

/* Set up a sampler over n samples. DDP_ERR_INVALID_ARGUMENT for n < 0, num_replicas < 1, or
   rank outside 0..num_replicas-1 (the message names the field). */
DDP_API ddp_status ddp_sampler_init(ddp_sampler* s, int n, const ddp_sampler_desc* desc);
/* Choose the epoch whose order ddp_sampler_indices gives. Call it before every epoch: without
   it every epoch repeats the same order (PyTorch's set_epoch). */
DDP_API void ddp_sampler_set_epoch(ddp_sampler* s, int epoch);
/* Write this rank's s->num_samples indices for the current epoch into out. */
DDP_API void ddp_sampler_indices(const ddp_sampler* s, int* out);
/* How many of this rank's indices in the current epoch are padding (repeats of samples another
   position already holds): 0 or 1, the last one, to leave out of an evaluation. 0 with drop_last. */
DDP_API int ddp_sampler_padding(const ddp_sampler* s);

/* Batches from a data set in a sampler's order (PyTorch's DataLoader over a sampler). */
typedef struct ddp_loader {
    const ddp_dataset* data;
    int batch_size;
    int drop_last;     /* 1: skip a last batch smaller than batch_size */
    int* order;        /* this epoch's indices */
    int count, pos;
    int resume_pos;    /* set by ddp_snapshot_load: the next ddp_loader_start of epoch resume_epoch
                          begins here (a start at another epoch begins at that epoch's first batch) */
    int last_epoch;    /* the sampler's epoch + 1 at this loader's previous shuffled start (0:
                          none); the same epoch twice means ddp_sampler_set_epoch was not called */
    float* x;          /* the current batch, [batch_size, nfeatures] */
    int* y;
    int epoch;         /* the sampler's epoch at this loader's last start: where pos belongs */
    int resume_epoch;  /* the epoch resume_pos belongs to */
    int resume;        /* 1: ddp_snapshot_load left resume_pos for the next start; 2: the same, from
                          a file that does not say which epoch the position belongs to */
} ddp_loader;

/* What a loader cuts an epoch into (torch.utils.data.DataLoader's arguments of the same names). */
typedef struct ddp_loader_desc {
    int batch_size;    /* samples per batch; default 1, as PyTorch's */
    int drop_last;     /* 1: skip a last batch smaller than batch_size */
} ddp_loader_desc;

/* Prepare a loader over data (allocates its batch buffers once); desc NULL takes the defaults.
   DDP_ERR_INVALID_ARGUMENT for a NULL data set or a negative batch_size. */
DDP_API ddp_status ddp_loader_init(ddp_loader* l, const ddp_dataset* data, const ddp_loader_desc* desc);
/* Start an epoch in the sampler's current order (call ddp_sampler_set_epoch first). After
   ddp_snapshot_load, the first start resumes at the snapshot's position when the sampler is at the
   snapshot's epoch (a position at the epoch's end then leaves no batch: that epoch is done); at
   any other epoch it begins at the first batch, with a warning if that leaves the snapshot's epoch
   unfinished. A shuffling sampler at the same epoch as this loader's previous start logs a
   warning (once per process) naming ddp_sampler_set_epoch: every epoch would repeat one order. */
DDP_API ddp_status ddp_loader_start(ddp_loader* l, const ddp_sampler* s);
/* The next batch: *x and *y point into the loader; returns its size, 0 when the epoch is over. */
DDP_API int ddp_loader_next(ddp_loader* l, const float** x, const int** y);
/* Batches per epoch for the current order. */
DDP_API int ddp_loader_batches(const ddp_loader* l);
/* Free the loader's buffers. */
DDP_API void ddp_loader_free(ddp_loader* l);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE void ddp__dataset_gather(const ddp_dataset* d, const int* idx, int count,
                                      float* x, int* y); /* >>data */
DDP__PRIVATE ddp_status ddp__dataset_load_csv(const char* path, ddp_dataset* out); /* >>files */

DDP__DEF void ddp_dataset_free(ddp_dataset* d) {
    if (!d) return;
    if (d->x) DDP_FREE(d->x);
    if (d->y) DDP_FREE(d->y);
    memset(d, 0, sizeof *d);
}

/* The largest data file we agree to read: far above the bundled sets, far below a mistake such
   as pointing the loader at a disk image. */
DDP__DEF ddp_status ddp_dataset_load(const char* name, const char* dir, ddp_dataset* out) {
    char path[1024];
    size_t len = name ? strlen(name) : 0;
    const char* env = getenv("DDP_DATA_DIR");
    ddp_status s;
    memset(out, 0, sizeof *out); /* empty on every error, as ddp__dataset_load_csv */
    if (!name) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_dataset_load: name is NULL");
    if (len > 4 && !strcmp(name + len - 4, ".csv")) return ddp__dataset_load_csv(name, out);
    if (strchr(name, '/') || len == 0 || len > 64)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "data set \"%s\" is neither a bundled name (wine, digits) nor a .csv path", name);
    if (!dir) dir = (env && *env) ? env : "examples/data";
    snprintf(path, sizeof path, "%s/%s.csv", dir, name);
    s = ddp__dataset_load_csv(path, out);
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
        ddp__dataset_gather(all, perm + (k == 0 ? 0 : ntest), d->n, d->x, d->y);
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

/* Copy the samples idx[0..count) into x [count, nfeatures] and y [count]. */
DDP__PRIVATE void ddp__dataset_gather(const ddp_dataset* d, const int* idx, int count, float* x, int* y) {
    int i;
    for (i = 0; i < count; i++) {
        memcpy(x + (size_t)i * d->nfeatures, d->x + (size_t)idx[i] * d->nfeatures,
               (size_t)d->nfeatures * sizeof(float));
        y[i] = d->y[idx[i]];
    }
}

/* ---- the distributed sampler (PyTorch's DistributedSampler) ---------------------------------- */

DDP__DEF ddp_status ddp_sampler_init(ddp_sampler* s, int n, const ddp_sampler_desc* desc) {
    ddp_sampler_desc d;
    long long total;
    memset(s, 0, sizeof *s);
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.pg) {
        d.num_replicas = ddp_world_size(d.pg);
        d.rank = ddp_rank(d.pg);
    } else if (d.num_replicas == 0) {
        d.num_replicas = 1;
    }
    if (n < 0) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_sampler_init: n is %d; it must be >= 0", n);
    if (d.num_replicas < 1)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_sampler_init: num_replicas is %d; it must be >= 1",
                         d.num_replicas);
    if (d.rank < 0 || d.rank >= d.num_replicas)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "ddp_sampler_init: rank is %d; it must be in 0..%d (num_replicas is %d)", d.rank,
                         d.num_replicas - 1, d.num_replicas);
    s->n = n;
    s->num_replicas = d.num_replicas;
    s->rank = d.rank;
    s->shuffle = !d.in_order;
    s->drop_last = d.drop_last;
    s->seed = d.seed;
    /* PyTorch's rule: ceil((n - R) / R) with drop_last is floor(n / R); else ceil(n / R) */
    s->num_samples = n / d.num_replicas + (!d.drop_last && n % d.num_replicas != 0);
    total = (long long)s->num_samples * d.num_replicas;
    if (total > 0x7fffffff) {
        memset(s, 0, sizeof *s);
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "ddp_sampler_init: n = %d padded for %d replicas is more than 2^31 - 1 positions", n,
                         d.num_replicas);
    }
    s->total_size = (int)total;
    return DDP_OK;
}

DDP__DEF void ddp_sampler_set_epoch(ddp_sampler* s, int epoch) { s->epoch = epoch; }

/* Padding never reaches a whole round (total_size < n + R), so a rank holds at most one padded
   position, and it is its last. */
DDP__DEF int ddp_sampler_padding(const ddp_sampler* s) {
    if (s->drop_last || s->num_samples == 0) return 0;
    return s->rank + (s->num_samples - 1) * s->num_replicas >= s->n;
}

/* Entry q of ddp_permutation(n, seed) without the array, for when memory for it is short: follow
   position q back through the Fisher-Yates swaps, the last swap first. splitmix64 advances its
   state by a constant, so the draw of each swap can be made directly. O(n) per entry. */
DDP__PRIVATE int ddp__permutation_at(int n, uint64_t seed, int q) {
    int i;
    for (i = 1; i < n; i++) { /* the swap at i is the (n - i)-th draw */
        ddp_rng r = ddp_rng_seed(seed + (uint64_t)(n - 1 - i) * 0x9E3779B97F4A7C15ull);
        int j = (int)ddp_rng_below(&r, (uint32_t)i + 1);
        if (q == i) q = j;
        else if (q == j) q = i;
    }
    return q;
}

/* This rank's indices into out, using work[0..n) for the epoch's order. work may be out itself
   (when out has room for n): position r + kR is never before k, so the strided reads stay ahead of
   the writes, apart from the padded last one, read first. */
DDP__PRIVATE void ddp__sampler_fill(const ddp_sampler* s, int* work, int* out) {
    int k, ns = s->num_samples, R = s->num_replicas, pad = ddp_sampler_padding(s), last = 0;
    if (ns == 0) return;
    if (s->shuffle) ddp_permutation(s->n, s->seed + (uint64_t)s->epoch, work);
    else
        for (k = 0; k < s->n; k++) work[k] = k;
    /* the padded list repeats the order from its front: position p holds order[p % n] */
    if (pad) last = work[(s->rank + (ns - 1) * R) % s->n];
    for (k = 0; k < ns - pad; k++) out[k] = work[s->rank + k * R];
    if (pad) out[ns - 1] = last;
}

DDP__DEF void ddp_sampler_indices(const ddp_sampler* s, int* out) {
    int k, *work;
    if (s->num_samples == 0) return;
    if (!s->shuffle) {
        for (k = 0; k < s->num_samples; k++) out[k] = (s->rank + k * s->num_replicas) % s->n;
        return;
    }
    if (s->num_samples >= s->n) { /* one replica, or n < R: out holds the whole order */
        ddp__sampler_fill(s, out, out);
        return;
    }
    work = (int*)ddp__malloc((size_t)s->n * sizeof(int));
    if (work) {
        ddp__sampler_fill(s, work, out);
        DDP_FREE(work);
        return;
    }
    /* no memory for the order: slower, but every rank still gets the same answer */
    for (k = 0; k < s->num_samples; k++)
        out[k] = ddp__permutation_at(s->n, s->seed + (uint64_t)s->epoch,
                                     (s->rank + k * s->num_replicas) % s->n);
}

/* ---- batches (PyTorch's DataLoader over a sampler) ----------------------------------------- */

DDP__DEF ddp_status ddp_loader_init(ddp_loader* l, const ddp_dataset* data, const ddp_loader_desc* desc) {
    int rows, batch_size = desc ? desc->batch_size : 0, drop_last = desc ? desc->drop_last : 0;
    memset(l, 0, sizeof *l);
    if (!data) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_loader_init: data is NULL");
    if (batch_size < 0)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_loader_init: batch_size is %d; it must be >= 1 (0: the "
                         "default, 1)", batch_size);
    if (batch_size == 0) batch_size = 1;
    rows = batch_size < data->n ? batch_size : data->n; /* a batch never holds more than the data set */
    if (rows < 1) rows = 1;
    l->x = (float*)ddp__malloc((size_t)rows * (size_t)data->nfeatures * sizeof(float));
    l->y = (int*)ddp__malloc((size_t)rows * sizeof(int));
    if ((!l->x && data->nfeatures > 0) || !l->y) {
        ddp_loader_free(l);
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "ddp_loader_init: allocating a batch of %d x %d failed", rows,
                         data->nfeatures);
    }
    l->data = data;
    l->batch_size = batch_size;
    l->drop_last = drop_last;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_loader_start(ddp_loader* l, const ddp_sampler* s) {
    if (!l->data) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_loader_start: the loader is not initialised");
    if (s->n > l->data->n)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "ddp_loader_start: the sampler is over %d samples, the data set has only %d", s->n,
                         l->data->n);
    /* n entries: enough for any sampler over this data set (num_samples <= n) and for the whole
       order as scratch, so no epoch allocates again */
    if (!l->order && l->data->n > 0) {
        l->order = (int*)ddp__malloc((size_t)l->data->n * sizeof(int));
        if (!l->order)
            return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "ddp_loader_start: allocating %d indices failed", l->data->n);
    }
    ddp__sampler_fill(s, l->order, l->order);
    l->count = s->num_samples;
    l->pos = 0;
    /* A snapshot's position belongs to the epoch it was taken in. A program that resumes at the
       next epoch (it saved after an epoch's last batch, with the next epoch as its counter) starts
       that epoch at its first batch; only a position in the middle of its epoch is then lost, and
       said so. */
    if (l->resume == 1 && s->epoch != l->resume_epoch) {
        if (l->resume_pos > 0 && l->resume_pos < l->count &&
            !(l->drop_last && l->count - l->resume_pos < l->batch_size))
            ddp__log(DDP_LOG_WARN, "ddp_loader_start: the snapshot was taken %d samples into epoch %d (of %d on this "
                    "rank), but the sampler is at epoch %d: epoch %d starts at its first batch, and the last %d samples "
                    "of epoch %d are skipped. A snapshot taken inside the batch loop names the epoch it is in "
                    "(snap.epoch = epoch); one taken after the loop names the next", l->resume_pos, l->resume_epoch,
                    l->count, s->epoch, s->epoch, l->count - l->resume_pos, l->resume_epoch);
    } else if (l->resume) {
        l->pos = l->resume_pos < l->count ? l->resume_pos : l->count;
    }
    l->resume = 0, l->resume_pos = 0;
    l->epoch = s->epoch;
    /* PyTorch's most common sampler slip: no set_epoch, so every epoch draws the same order (the
       order is a function of the seed and the epoch). A resumed epoch (ddp_snapshot_load) starts
       afresh. */
    if (s->shuffle && s->num_samples > 0) {
        if (s->epoch + 1 == l->last_epoch && ddp__first_time(&ddp__warned_set_epoch))
            ddp__log(DDP_LOG_WARN, "ddp_loader_start: the sampler's epoch is %d again, as at this loader's previous "
                    "start, so this epoch visits the samples in the same order as the last one. Call "
                    "ddp_sampler_set_epoch(&sampler, epoch) before each ddp_loader_start (PyTorch: "
                    "sampler.set_epoch(epoch)). Printed once per process", s->epoch);
        l->last_epoch = s->epoch + 1;
    } else {
        l->last_epoch = 0;
    }
    return DDP_OK;
}

DDP__DEF int ddp_loader_next(ddp_loader* l, const float** x, const int** y) {
    int b = l->count - l->pos;
    if (b > l->batch_size) b = l->batch_size;
    if (b <= 0 || (l->drop_last && b < l->batch_size)) {
        l->pos = l->count;
        return 0;
    }
    ddp__dataset_gather(l->data, l->order + l->pos, b, l->x, l->y);
    l->pos += b;
    if (x) *x = l->x;
    if (y) *y = l->y;
    return b;
}

DDP__DEF int ddp_loader_batches(const ddp_loader* l) {
    if (l->batch_size < 1) return 0;
    return l->count / l->batch_size + (!l->drop_last && l->count % l->batch_size != 0);
}

DDP__DEF void ddp_loader_free(ddp_loader* l) {
    if (!l) return;
    if (l->order) DDP_FREE(l->order);
    if (l->x) DDP_FREE(l->x);
    if (l->y) DDP_FREE(l->y);
    memset(l, 0, sizeof *l);
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>nn: the model: layers, forward, losses, backward, the gradient-ready hook  (chapters 1, 12)  */
/* ============================================================================================== */
#if DDP__DECLARE

typedef struct ddp_param ddp_param;
typedef struct ddp_model ddp_model; /* a model: ddp_model_mlp's layers, or your own tensors */
/* Called once per backward for each parameter, the moment its gradient is final (accumulated
   into p->grad), last layer first. This is where data parallelism plugs in: the reducer's hook
   starts averaging a gradient while backward still computes the earlier layers'. */
typedef void (*ddp_grad_hook_fn)(ddp_param* p, void* user);

struct ddp_param {
    char name[48];       /* "fc1.weight", "h.0.attn.bias", ... unique in the model */
    int index;           /* position in the model's parameter list */
    int ndim;            /* 1 to 4; a Linear weight is [out, in], a bias [out] */
    int shape[4];        /* shape[ndim..3] are 1 */
    size_t count;        /* elements */
    ddp_device device;
    float* data;         /* count floats on `device` (under ZeRO-3 only while its unit is gathered) */
    float* grad;         /* count floats on `device`; accumulates until ddp_model_zero_grad */
    int unit;            /* its unit (ddp_unit_begin): 0, the whole model, or 1, 2, ... */
    int no_decay;        /* 1: the optimizer gives it no weight decay (a parameter group of its own) */
    int nhooks;
    ddp_grad_hook_fn hooks[DDP_MAX_HOOKS];
    void* hook_user[DDP_MAX_HOOKS];
    /* the library's own */
    ddp_model* model;
    float *home_data, *home_grad; /* the caller's arrays when adopted (ddp_tensor_desc.data, .grad) */
    int ready;                    /* marked ready in the open backward */
};

/* Register `fn` to run each time p's gradient becomes final. DDP_ERR_INVALID_ARGUMENT when
   p already has DDP_MAX_HOOKS hooks. */
DDP_API ddp_status ddp_param_add_hook(ddp_param* p, ddp_grad_hook_fn fn, void* user);
/* Announce that p->grad is final for this backward: runs p's hooks in registration order.
   ddp_model_backward calls it; your own backward calls it once per tensor, inside
   ddp_unit_begin(m, 0, DDP_BACKWARD) .. ddp_unit_end (under ZeRO-2 and -3 inside the bracket of
   p's unit too, where its gradient lives).
   DDP_ERR_STATE, naming the tensor, outside a backward or for a second call in one backward. */
DDP_API ddp_status ddp_param_grad_ready(ddp_param* p);

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


/* A multilayer perceptron sizes[0] -> sizes[1] -> ... -> sizes[n-1] with activation `act`
   between the Linear layers (none after the last), initialised as PyTorch's Linear does:
   U(-1/sqrt(in), 1/sqrt(in)) for weight and bias, drawn from desc->seed. DDP_ERR_NO_GPU or
   DDP_ERR_NOT_BUILT when desc->device is unusable, DDP_ERR_INVALID_ARGUMENT for a size < 1. */
DDP_API ddp_status ddp_model_mlp(const ddp_model_desc* desc, const int* sizes, int n,
                                 ddp_layer_kind act, ddp_model** out);
/* Free the model and everything on its device. NULL is ignored. */
DDP_API void ddp_model_destroy(ddp_model* m);

/* ---- your own model: tensors you describe, a forward and a backward you write ---- */
typedef enum ddp_init_kind {
    DDP_INIT_ZEROS = 0, /* the default */
    DDP_INIT_ONES,      /* a layernorm's gain */
    DDP_INIT_UNIFORM,   /* U(-scale, scale): PyTorch's Linear with scale 1/sqrt(fan_in) */
    DDP_INIT_NORMAL     /* N(0, scale^2): GPT-2's weights with scale 0.02 */
} ddp_init_kind;

typedef struct ddp_tensor_desc {
    const char* name;  /* required, unique, at most 47 characters; a snapshot stores it */
    int ndim;          /* 1 to 4 */
    int shape[4];
    float* data;       /* NULL: ddp.h allocates it on the model's device and initialises it (init);
                          otherwise it adopts these shape-many floats on that device (a slice of
                          one flat buffer, as llm.c keeps its weights), which stay yours to free
                          after ddp_model_destroy */
    float* grad;       /* likewise for the gradient; ddp.h's own starts at zero */
    ddp_init_kind init; /* for data ddp.h allocates, drawn from the model's seed and this tensor's
                          position: the same on every rank and device */
    float scale;       /* its bound or standard deviation */
    int unit;          /* 0: the whole model's unit; 1, 2, ...: a unit of its own (ZeRO-3 gathers a
                          unit's weights between its ddp_unit_begin and ddp_unit_end; FSDP's wrap
                          policy: one unit per transformer block). Number units in forward's order */
    int no_decay;      /* 1: no weight decay for this tensor (biases, gains, embeddings) */
} ddp_tensor_desc;

/* An empty model on desc->device, for tensors you add. DDP_ERR_NO_GPU or DDP_ERR_NOT_BUILT when
   that device is unusable. */
DDP_API ddp_status ddp_model_create(const ddp_model_desc* desc, ddp_model** out);
/* Add tensor *t to m (before ddp_wrap) and hand it back through *out (may be NULL).
   DDP_ERR_INVALID_ARGUMENT, naming the tensor, for a bad name, shape or unit, or a name taken. */
DDP_API ddp_status ddp_model_add(ddp_model* m, const ddp_tensor_desc* t, ddp_param** out);

typedef enum ddp_phase { DDP_FORWARD = 1, DDP_BACKWARD = 2 } ddp_phase;
/* Brackets around the use of a unit's tensors. Unit 0 is the whole model: ddp_unit_begin(m, 0,
   DDP_FORWARD) opens a forward, ddp_unit_begin(m, 0, DDP_BACKWARD) a backward, and the matching
   ddp_unit_end closes it; a backward's end is where DDP waits for its all-reduces (its status is
   returned). Inside, each other unit's forward or backward is bracketed the same way, one unit at
   a time: under ZeRO-3 its weights are gathered at begin (p->data is valid only from there) and
   freed after, and under ZeRO-2 and -3 its gradients exist (p->grad) only inside its backward.
   ddp_model_mlp's forward and backward bracket each Linear layer as a unit. DDP_ERR_STATE,
   naming the unit, for brackets that do not match. */
DDP_API ddp_status ddp_unit_begin(ddp_model* m, int unit, ddp_phase phase);
DDP_API ddp_status ddp_unit_end(ddp_model* m, int unit, ddp_phase phase);

/* The model's number of parameters, parameter i (NULL outside 0..n-1), and its compute stream
   (NULL on the CPU). */
DDP_API int ddp_model_num_params(const ddp_model* m);
DDP_API ddp_param* ddp_model_param(ddp_model* m, int i);
DDP_API ddp_stream* ddp_model_stream(ddp_model* m);
/* Total number of parameter elements. */
DDP_API size_t ddp_model_num_elements(const ddp_model* m);

/* Run the layers on x, a host array [batch, in_features]. The output stays on the model's device
   for the loss to read. DDP_ERR_INVALID_ARGUMENT for batch < 1 or an empty model. */
DDP_API ddp_status ddp_model_forward(ddp_model* m, const float* x, int batch);
/* Mean softmax cross-entropy of the last forward's output against host labels[batch] (PyTorch's
   F.cross_entropy), written to *loss; also prepares the output gradient for backward.
   DDP_ERR_INVALID_ARGUMENT for a label outside 0..out_features-1; DDP_ERR_STATE before forward. */
DDP_API ddp_status ddp_loss_cross_entropy(ddp_model* m, const int* labels, float* loss);
/* Backpropagate the last loss, last layer first, ADDING each gradient into p->grad and calling
   ddp_param_grad_ready(p) as soon as p's gradient is final. DDP_ERR_STATE without a loss, or
   when backward already ran for this loss (one backward per loss, as in PyTorch). */
DDP_API ddp_status ddp_model_backward(ddp_model* m);
/* Run fn(m, user) at the end of every ddp_model_backward, after the last hook; its status becomes
   backward's. The analogue of an autograd engine callback: the DDP wrapper waits for its
   all-reduces here. NULL removes it. */
typedef ddp_status (*ddp_post_backward_fn)(ddp_model* m, void* user);
/* C[M,N] = alpha op(A) op(B) + beta C, row-major, op(X) = X or (ta, tb = 1) its transpose, on the
   model's device: cuBLAS on a GPU, a CBLAS or ddp.h's blocked loop on the CPU. The Linear layers'
   product, for a forward and backward of your own. */
DDP_API ddp_status ddp_gemm(ddp_model* m, int ta, int tb, int M, int N, int K, float alpha, const float* A,
                            int lda, const float* B, int ldb, float beta, float* C, int ldc);
/* count such products at once: C_i = alpha op(A_i) op(B_i) + beta C_i, where X_i starts stride_x
   floats after X_{i-1}. One call on a GPU (cuBLAS's strided batched product), a loop on the CPU:
   attention's products, one per sequence, where one call each would cost a launch each. */
DDP_API ddp_status ddp_gemm_batched(ddp_model* m, int ta, int tb, int M, int N, int K, float alpha, const float* A,
                                    int lda, long long stride_a, const float* B, int ldb, long long stride_b,
                                    float beta, float* C, int ldc, long long stride_c, int count);
/* Your own GPU kernels, for the other operations of such a forward and backward: CUDA C source
   of extern "C" __global__ functions, compiled by NVRTC for the model's GPU (a later call
   replaces it). DDP_ERR_INVALID_ARGUMENT for a model on the CPU (there, write the loop in C);
   DDP_ERR_NVRTC with the compiler's log. */
DDP_API ddp_status ddp_kernels_compile(ddp_model* m, const char* source);
/* Run the kernel called `name` on n threads, in order on the model's stream: blocks of 256, so
   the kernel returns where blockIdx.x * blockDim.x + threadIdx.x >= n. args holds the address of
   each argument (cudaLaunchKernel's convention). DDP_ERR_STATE before ddp_kernels_compile. */
DDP_API ddp_status ddp_launch(ddp_model* m, const char* name, long long n, void** args);
/* Set every p->grad to zero (call once per step, before backward, as optimizer.zero_grad()). */
DDP_API ddp_status ddp_model_zero_grad(ddp_model* m);
/* Accuracy (fraction of argmax == label) and mean cross-entropy over n samples, in batches.
   Either output may be NULL. DDP_ERR_INVALID_ARGUMENT for a label outside 0..out_features-1;
   otherwise errors as ddp_model_forward. */
DDP_API ddp_status ddp_model_evaluate(ddp_model* m, const float* x, const int* labels, int n,
                                      float* accuracy, float* mean_loss);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE ddp_status ddp__stream_create(ddp_device d, ddp_stream** out); /* >>cuda */
DDP__PRIVATE void ddp__stream_destroy(ddp_stream* s); /* >>cuda */
/* >>kernels: */
DDP__PRIVATE void ddp__gemm_cpu(int ta, int tb, int M, int N, int K, float alpha, const float* A,
                                int lda, const float* B, int ldb, float beta, float* C, int ldc);
DDP__PRIVATE void ddp__trace(const char* name, int tid, double t0, double t1); /* >>trace */
DDP__PRIVATE int ddp__trace_on(void); /* >>trace */
typedef struct ddp__shards ddp__shards; /* >>zero: who owns which part of the training state */
DDP__PRIVATE int ddp__zero_stage(const ddp__shards* z); /* >>zero */
#if DDP__CUDA
DDP__PRIVATE ddp_status ddp__launch(ddp_device d, ddp_stream* s, int k, long long n,
                                    void** args); /* >>kernels */
#endif

/* The moments around a unit's use at which m->unit_fn is called: ddp_unit_begin and ddp_unit_end
   of its forward and of its backward. */
enum { DDP__UNIT_FORWARD = 1, DDP__UNIT_FORWARD_DONE, DDP__UNIT_BACKWARD, DDP__UNIT_BACKWARD_DONE };

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
    int nunits;             /* 1 + the largest unit number of a tensor */
    int phase;              /* unit 0's open bracket: 0, DDP_FORWARD or DDP_BACKWARD */
    int open_unit;          /* the other unit whose bracket is open; 0: none */
    int rank;               /* the rank it is wrapped on, for messages; -1: not wrapped */
    ddp_pg* pg;             /* the group it is wrapped on (an optimizer compares its settings over
                               it); NULL: not wrapped */
    ddp_status broken;      /* a tensor marked ready wrongly in the open backward: its end says so */
    char err[512];
    ddp__layer layers[DDP_MAX_LAYERS];
    ddp_param* params[DDP_MAX_PARAMS];
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
    int have_output;
    int have_loss;          /* 0: no loss since forward, 1: a loss to backpropagate, 2: backward used it */
    ddp_post_backward_fn post_backward;
    void* post_backward_user;
    struct ddp__shards* zero; /* ddp_wrap's zero_stage 1-3: who owns which part of the training
                               state (>>zero); an optimizer created from then on keeps only its
                               rank's part. NULL: every rank holds everything */
    /* Called at each bracket of a unit (DDP__UNIT_*): where ZeRO-3 gathers a unit's weights just
       before they are used and frees them after. */
    ddp_status (*unit_fn)(ddp_model* m, void* user, int event, int layer);
    void* unit_user;
    size_t optim_state_bytes; /* what the model's optimizer holds (ddp_wrapper_stats reports it) */
    struct ddp_optim* optim; /* the optimizer made last for this model: ddp_join evens its state too */
    int local_backwards;  /* backward passes added into p->grad under ddp_no_sync since the last
                             all-reduce or zero_grad: gradients no other rank has seen */
    char trace_name[48];  /* the layer whose backward span is open (DDP_TRACE) */
    double trace_t;
    ddp_stream* stream;
#if DDP__CUDA
    cublasHandle_t blas;
    cudaLibrary_t user_lib; /* ddp_kernels_compile's kernels (NULL: none yet) */
    struct { char name[64]; cudaKernel_t k; } user_k[DDP__MAX_USER_KERNELS]; /* those looked up */
    int nuser_k;
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

/* Remove every hook of p. */
DDP__PRIVATE void ddp__param_clear_hooks(ddp_param* p) { p->nhooks = 0; }

/* " on rank R" once the model is wrapped, for messages that name a tensor. */
DDP__PRIVATE const char* ddp__model_where(const ddp_model* m) {
    static DDP__TLS char where[32];
    where[0] = 0;
    if (m && m->rank >= 0) snprintf(where, sizeof where, " on rank %d", m->rank);
    return where;
}

/* A tensor marked ready wrongly: fail now, and again when the backward ends (the hook is not run,
   so a caller that ignores this status still hears of it there). */
DDP__PRIVATE ddp_status ddp__model_broke(ddp_model* m, const char* fmt, ...) DDP__PRINTF(2, 3);
DDP__PRIVATE ddp_status ddp__model_broke(ddp_model* m, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    if (m->phase == DDP_BACKWARD) m->broken = DDP_ERR_STATE;
    return ddp__fail(DDP_ERR_STATE, "%s", m->err);
}

DDP__DEF ddp_status ddp_param_grad_ready(ddp_param* p) {
    ddp_model* m = p->model;
    int i;
    if (m->phase != DDP_BACKWARD)
        return ddp__model_broke(m, "tensor %s was marked ready%s outside a backward: a backward of your own opens "
                                "with ddp_unit_begin(m, 0, DDP_BACKWARD) and ends with ddp_unit_end(m, 0, "
                                "DDP_BACKWARD), and marks each tensor ready between the two", p->name,
                                ddp__model_where(m));
    if (p->unit && m->open_unit != p->unit && m->zero && ddp__zero_stage(m->zero) >= 2)
        return ddp__model_broke(m, "tensor %s of unit %d was marked ready%s outside its unit's backward (%s%.0d): "
                                "mark it between ddp_unit_begin(m, %d, DDP_BACKWARD) and ddp_unit_end, where its "
                                "gradient lives under ZeRO-2 and -3", p->name, p->unit, ddp__model_where(m),
                                m->open_unit ? "unit " : "no unit is open", m->open_unit, p->unit);
    if (p->ready)
        return ddp__model_broke(m, "tensor %s was marked ready twice in one backward%s: its gradient would be "
                                "averaged before it is complete. Call ddp_param_grad_ready once per tensor, when "
                                "its gradient is final", p->name, ddp__model_where(m));
    p->ready = 1;
    for (i = 0; i < p->nhooks; i++) p->hooks[i](p, p->hook_user[i]);
    return DDP_OK;
}

/* An empty model on desc->device. DDP_ERR_NO_GPU / DDP_ERR_NOT_BUILT if that device is unusable. */
DDP__PRIVATE ddp_status ddp__model_create(const ddp_model_desc* desc, ddp_model** out) {
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
    m->nunits = 1, m->rank = -1;
    if (ddp__stream_create(dev, &m->stream) != DDP_OK) {
        DDP_FREE(m);
        return ddp__last_status();
    }
#if DDP__CUDA
    if (dev.type == DDP_DEVICE_CUDA) {
        cublasStatus_t b = cublasCreate(&m->blas);
        if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetStream(m->blas, m->stream->s);
        if (b != CUBLAS_STATUS_SUCCESS) {
            ddp__stream_destroy(m->stream);
            DDP_FREE(m);
            return ddp__fail_cublas(b, "cublasCreate/cublasSetStream", __LINE__);
        }
    }
#endif
    *out = m;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_create(const ddp_model_desc* desc, ddp_model** out) {
    return ddp__model_create(desc, out);
}

/* Fill n floats of tensor `index` of m as `init` says, on the host. Each tensor draws from its own
   stream, so the values depend neither on the device nor on the tensors that follow. The stream's
   start is a hash of (model seed, tensor index). Not an affine function of the index:
   splitmix64's state advances by 0x9E37...7C15 per draw, so a start of seed + index * 0x9E37...7C15
   made tensor i's values tensor 0's shifted by i draws (fc1.bias was fc1.weight's values 1..64). */
DDP__PRIVATE void ddp__param_init(const ddp_model* m, int index, ddp_init_kind init, float scale, float* host, size_t n) {
    ddp_rng r = ddp_rng_seed(ddp__mix64(ddp__mix64(m->seed ^ 0x6A09E667F3BCC909ull) ^ (uint64_t)index));
    size_t i;
    for (i = 0; i < n; i++) {
        if (init == DDP_INIT_ZEROS || init == DDP_INIT_ONES) {
            host[i] = init == DDP_INIT_ONES ? 1.f : 0.f;
        } else if (init == DDP_INIT_UNIFORM) {
            host[i] = (2.f * ddp_rng_uniform(&r) - 1.f) * scale;
        } else { /* Box-Muller: two uniform draws make one normal one */
            double u1 = 1.0 - (double)ddp_rng_uniform(&r), u2 = (double)ddp_rng_uniform(&r);
            host[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)) * scale;
        }
    }
}

DDP__DEF ddp_status ddp_model_add(ddp_model* m, const ddp_tensor_desc* t, ddp_param** out) {
    ddp_param* p;
    float* host;
    size_t count = 1;
    int k;
    ddp_status s = DDP_OK;
    const char* name = t ? t->name : NULL;
    if (out) *out = NULL;
    if (!t || !name || !*name || strlen(name) >= sizeof p->name || strpbrk(name, "\"\\"))
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add: a tensor needs a name of 1 to %d characters "
                         "without quotes or backslashes (a snapshot stores it in JSON); got %s%s%s",
                         (int)sizeof p->name - 1, name ? "\"" : "", name ? name : "NULL", name ? "\"" : "");
    if (m->rank >= 0 || m->post_backward)
        return ddp__fail(DDP_ERR_STATE, "ddp_model_add(%s): the model is already wrapped, and every rank's "
                         "reducer is built for the tensors it had: add every tensor before ddp_wrap", name);
    if (m->nlayers > 0)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add(%s): ddp_model_mlp's models run their own "
                         "layers; start a model of your own tensors with ddp_model_create", name);
    if (m->nparams >= DDP_MAX_PARAMS)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add(%s): the model already has DDP_MAX_PARAMS (%d) "
                         "tensors; define DDP_MAX_PARAMS larger before including ddp.h", name, DDP_MAX_PARAMS);
    for (k = 0; k < m->nparams; k++)
        if (!strcmp(m->params[k]->name, name))
            return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add: the model already has a tensor named %s "
                             "(tensor %d): names must be unique, a snapshot finds tensors by name", name, k);
    if (t->ndim < 1 || t->ndim > 4)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add(%s): ndim is %d, must be 1 to 4", name, t->ndim);
    for (k = 0; k < t->ndim; k++) {
        if (t->shape[k] < 1 || count > ((size_t)1 << 40) / (size_t)t->shape[k])
            return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add(%s): shape[%d] is %d: every size must be "
                             "positive (and the tensor under 2^40 elements)", name, k, t->shape[k]);
        count *= (size_t)t->shape[k];
    }
    if (t->unit < 0 || t->unit >= DDP_MAX_PARAMS)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add(%s): unit %d: units are 0 (the whole model) to "
                         "%d", name, t->unit, DDP_MAX_PARAMS - 1);
    if ((int)t->init < DDP_INIT_ZEROS || (int)t->init > DDP_INIT_NORMAL || !(t->scale >= 0.f) || t->scale > 1e30f)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_add(%s): init %d with scale %g: init is one of "
                         "DDP_INIT_ZEROS, _ONES, _UNIFORM, _NORMAL, and scale a finite number >= 0", name,
                         (int)t->init, t->scale);
    p = (ddp_param*)ddp__calloc(sizeof *p);
    if (!p) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating tensor %s failed", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->index = m->nparams;
    p->ndim = t->ndim;
    for (k = 0; k < 4; k++) p->shape[k] = k < t->ndim ? t->shape[k] : 1;
    p->count = count;
    p->device = m->device;
    p->unit = t->unit;
    p->no_decay = t->no_decay != 0;
    p->model = m;
    p->home_data = t->data, p->home_grad = t->grad;
    if (t->data) {
        p->data = t->data;
    } else if ((s = ddp_alloc(m->device, count * sizeof(float), (void**)&p->data)) == DDP_OK) {
        host = (float*)ddp__malloc(count * sizeof(float));
        if (!host) s = ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating tensor %s failed", name);
        if (host) ddp__param_init(m, p->index, t->init, t->scale, host, count);
        if (host) s = ddp_copy(m->device, p->data, ddp__cpu(), host, count * sizeof(float), NULL);
        if (host) DDP_FREE(host);
    }
    if (s == DDP_OK && t->grad) {
        p->grad = t->grad;
    } else if (s == DDP_OK) {
        s = ddp_alloc(m->device, count * sizeof(float), (void**)&p->grad);
        if (s == DDP_OK) s = ddp__zero(m->device, p->grad, count * sizeof(float), NULL);
    }
    if (s != DDP_OK) {
        if (!t->data) ddp_free(m->device, p->data);
        if (!t->grad) ddp_free(m->device, p->grad);
        DDP_FREE(p);
        return s;
    }
    m->params[m->nparams++] = p;
    if (p->unit >= m->nunits) m->nunits = p->unit + 1;
    if (out) *out = p;
    return DDP_OK;
}

/* A tensor of ddp_model_mlp's: [d0, d1] (ndim 2) or [d0], U(-bound, bound), in unit `unit`. */
DDP__PRIVATE ddp_status ddp__param_new(ddp_model* m, const char* name, int ndim, int d0, int d1, float bound,
                                       int unit, ddp_param** out) {
    ddp_tensor_desc t;
    int nl = m->nlayers;
    ddp_status s;
    memset(&t, 0, sizeof t);
    t.name = name, t.ndim = ndim, t.shape[0] = d0, t.shape[1] = d1;
    t.init = DDP_INIT_UNIFORM, t.scale = bound, t.unit = unit;
    m->nlayers = 0; /* ddp_model_add is for models of one's own: the MLP's layers are added after */
    s = ddp_model_add(m, &t, out);
    m->nlayers = nl;
    return s;
}

/* Append Linear(in, out) with PyTorch's default initialisation, U(-1/sqrt(in), 1/sqrt(in)) for
   weight and bias, drawn from the model's seed. DDP_ERR_INVALID_ARGUMENT if `in` does not match
   the previous layer's width or a size is not positive. */
DDP__PRIVATE ddp_status ddp__model_add_linear(ddp_model* m, int in, int out) {
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
    DDP__TRY(ddp__param_new(m, name, 2, out, in, bound, m->nlinear + 1, &L->weight));
    snprintf(name, sizeof name, "fc%d.bias", m->nlinear + 1);
    if (ddp__param_new(m, name, 1, out, 1, bound, m->nlinear + 1, &L->bias) != DDP_OK) {
        ddp_param* w = m->params[--m->nparams]; /* undo the weight: the layer was not added */
        ddp_free(m->device, w->data);
        ddp_free(m->device, w->grad);
        DDP_FREE(w);
        m->nunits = m->nlinear + 1;
        return ddp__last_status();
    }
    m->nlinear++;
    m->nlayers++;
    return DDP_OK;
}

/* Append an activation (DDP_LAYER_RELU or DDP_LAYER_GELU). DDP_ERR_INVALID_ARGUMENT otherwise. */
DDP__PRIVATE ddp_status ddp__model_add_activation(ddp_model* m, ddp_layer_kind kind) {
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
    DDP__TRY(ddp__model_create(desc, &m));
    for (i = 0; i + 1 < n && s == DDP_OK; i++) {
        s = ddp__model_add_linear(m, sizes[i], sizes[i + 1]);
        if (s == DDP_OK && i + 2 < n) s = ddp__model_add_activation(m, act);
    }
    if (s != DDP_OK) {
        ddp_model_destroy(m);
        return s;
    }
    *out = m;
    return DDP_OK;
}

/* ---- the brackets around a unit's forward and backward ------------------------------------------ */

DDP__PRIVATE const char* ddp__phase_name(int phase) { return phase == DDP_FORWARD ? "DDP_FORWARD" : "DDP_BACKWARD"; }
DDP__PRIVATE const char* ddp__phase_word(int phase) { return phase == DDP_FORWARD ? "forward" : "backward"; }

DDP__DEF ddp_status ddp_unit_begin(ddp_model* m, int unit, ddp_phase phase) {
    ddp_status s = DDP_OK;
    int i;
    if (phase != DDP_FORWARD && phase != DDP_BACKWARD)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_unit_begin: phase %d is neither DDP_FORWARD nor DDP_BACKWARD",
                         (int)phase);
    if (unit < 0 || unit >= m->nunits)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_unit_begin(m, %d, %s): this model's units are 0 to %d (the "
                         "units its tensors were given)", unit, ddp__phase_name(phase), m->nunits - 1);
    if (unit == 0 && m->phase)
        return ddp__fail(DDP_ERR_STATE, "ddp_unit_begin(m, 0, %s)%s: the model's %s is still open: end it with "
                         "ddp_unit_end(m, 0, %s) first", ddp__phase_name(phase), ddp__model_where(m),
                         ddp__phase_word(m->phase), ddp__phase_name(m->phase));
    if (unit != 0 && m->phase != (int)phase)
        return ddp__fail(DDP_ERR_STATE, "ddp_unit_begin(m, %d, %s)%s outside the model's %s: open that first with "
                         "ddp_unit_begin(m, 0, %s)%s", unit, ddp__phase_name(phase), ddp__model_where(m),
                         ddp__phase_word(phase), ddp__phase_name(phase),
                         m->phase ? " (the model's other phase is open now)" : "");
    if (unit != 0 && m->open_unit)
        return ddp__fail(DDP_ERR_STATE, "ddp_unit_begin(m, %d, %s)%s while unit %d's %s is open: units other than 0 "
                         "do not nest, so end unit %d first", unit, ddp__phase_name(phase), ddp__model_where(m),
                         m->open_unit, ddp__phase_word(phase), m->open_unit);
    if (unit == 0) {
        m->phase = (int)phase;
        if (phase == DDP_BACKWARD) {
            m->broken = DDP_OK;
            for (i = 0; i < m->nparams; i++) m->params[i]->ready = 0;
        }
    } else {
        m->open_unit = unit;
    }
    if (m->unit_fn) s = m->unit_fn(m, m->unit_user, phase == DDP_FORWARD ? DDP__UNIT_FORWARD : DDP__UNIT_BACKWARD, unit);
    if (s != DDP_OK) { /* nothing was opened: the caller may fix the cause and begin again */
        if (unit == 0) m->phase = 0;
        else m->open_unit = 0;
    }
    return s;
}

DDP__DEF ddp_status ddp_unit_end(ddp_model* m, int unit, ddp_phase phase) {
    ddp_status s = DDP_OK, t;
    if (phase != DDP_FORWARD && phase != DDP_BACKWARD)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_unit_end: phase %d is neither DDP_FORWARD nor DDP_BACKWARD",
                         (int)phase);
    if (m->phase != (int)phase || (unit != 0 && m->open_unit != unit) || unit < 0) {
        char open[96];
        if (!m->phase) snprintf(open, sizeof open, "nothing is open");
        else if (!m->open_unit) snprintf(open, sizeof open, "the model's %s is open", ddp__phase_word(m->phase));
        else snprintf(open, sizeof open, "unit %d's %s is open", m->open_unit, ddp__phase_word(m->phase));
        return ddp__fail(DDP_ERR_STATE, "ddp_unit_end(m, %d, %s)%s without its ddp_unit_begin: %s", unit,
                         ddp__phase_name(phase), ddp__model_where(m), open);
    }
    if (unit == 0 && m->open_unit)
        return ddp__fail(DDP_ERR_STATE, "ddp_unit_end(m, 0, %s)%s while unit %d's %s is open: end unit %d first",
                         ddp__phase_name(phase), ddp__model_where(m), m->open_unit, ddp__phase_word(phase),
                         m->open_unit);
    if (m->unit_fn)
        s = m->unit_fn(m, m->unit_user, phase == DDP_FORWARD ? DDP__UNIT_FORWARD_DONE : DDP__UNIT_BACKWARD_DONE, unit);
    if (unit != 0) {
        m->open_unit = 0;
        return s;
    }
    m->phase = 0;
    if (phase != DDP_BACKWARD) return s;
    /* the end of backward: DDP waits for its all-reduces here, even after a tensor was marked
       ready wrongly, so that every rank still issues the same collectives */
    t = m->post_backward ? m->post_backward(m, m->post_backward_user) : DDP_OK;
    if (s == DDP_OK && m->broken) s = ddp__fail(m->broken, "%s", m->err);
    return s != DDP_OK ? s : t;
}

/* After a failure inside ddp_model_forward or _backward: no bracket stays open. */
DDP__PRIVATE void ddp__model_unbracket(ddp_model* m) { m->phase = 0, m->open_unit = 0; }

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
    for (i = 0; i < m->nparams; i++) { /* the caller's arrays stay the caller's */
        if (!m->params[i]->home_data) ddp_free(m->device, m->params[i]->data);
        if (!m->params[i]->home_grad) ddp_free(m->device, m->params[i]->grad);
        DDP_FREE(m->params[i]);
    }
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) cublasDestroy(m->blas);
    if (m->user_lib) cudaLibraryUnload(m->user_lib);
#endif
    ddp__stream_destroy(m->stream);
    DDP_FREE(m);
}

DDP__PRIVATE ddp_device ddp__model_device(const ddp_model* m) { return m->device; }
DDP__DEF int ddp_model_num_params(const ddp_model* m) { return m->nparams; }
DDP__DEF ddp_param* ddp_model_param(ddp_model* m, int i) {
    return (i >= 0 && i < m->nparams) ? m->params[i] : NULL;
}
DDP__PRIVATE int ddp__model_in_features(const ddp_model* m) { return m->nlayers ? m->layers[0].in : 0; }
DDP__PRIVATE int ddp__model_out_features(const ddp_model* m) {
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
        s = ddp_alloc(m->device, (size_t)batch * ddp__model_out_features(m) * sizeof(float), (void**)&m->targets);
    if (s == DDP_OK) s = ddp_alloc(ddp__cpu(), (size_t)batch * sizeof(float), (void**)&m->host_rows);
    if (s != DDP_OK) {
        ddp__model_free_buffers(m);
        return s;
    }
    m->capacity = batch;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_gemm(ddp_model* m, int ta, int tb, int M, int N, int K, float alpha, const float* A,
                            int lda, const float* B, int ldb, float beta, float* C, int ldc) {
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) {
        /* cuBLAS is column-major. A row-major matrix read column-major is its transpose, so
           computing C^T = op(B)^T op(A)^T column-major writes C row-major: swap the operands. */
        DDP__BLAS(cublasSgemm(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
        /* DETAIL mode waits for each product, as for each kernel (ddp__launch), so that an error
           is reported at the call that caused it */
        if (ddp__log_level_enabled() >= DDP_LOG_DETAIL) {
            cudaError_t e = cudaStreamSynchronize(m->stream->s);
            if (e != cudaSuccess) return ddp__fail_cuda(e, "cublasSgemm (synchronised under DDP_DEBUG=DETAIL)", __LINE__);
        }
        return DDP_OK;
    }
#endif
    (void)m;
    ddp__gemm_cpu(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return DDP_OK;
}

DDP__DEF ddp_status ddp_gemm_batched(ddp_model* m, int ta, int tb, int M, int N, int K, float alpha, const float* A,
                                    int lda, long long stride_a, const float* B, int ldb, long long stride_b,
                                    float beta, float* C, int ldc, long long stride_c, int count) {
    int i;
    if (count < 0) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_gemm_batched: count %d < 0", count);
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) { /* operands swapped, as in ddp_gemm */
        if (count == 0) return DDP_OK;
        DDP__BLAS(cublasSgemmStridedBatched(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            N, M, K, &alpha, B, ldb, stride_b, A, lda, stride_a, &beta, C, ldc,
                                            stride_c, count));
        if (ddp__log_level_enabled() >= DDP_LOG_DETAIL) {
            cudaError_t e = cudaStreamSynchronize(m->stream->s);
            if (e != cudaSuccess)
                return ddp__fail_cuda(e, "cublasSgemmStridedBatched (synchronised under DDP_DEBUG=DETAIL)", __LINE__);
        }
        return DDP_OK;
    }
#endif
    for (i = 0; i < count; i++)
        DDP__TRY(ddp_gemm(m, ta, tb, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
                          C + i * stride_c, ldc));
    return DDP_OK;
}

/* GELU's exact form and its derivative, shared by forward and backward on the CPU. */
DDP__PRIVATE float ddp__gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
DDP__PRIVATE float ddp__gelu_grad(float x) {
    return 0.5f * (1.f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x);
}

/* The layers' forward, between the model's brackets (ddp_model_forward). */
DDP__PRIVATE ddp_status ddp__mlp_forward(ddp_model* m, const float* x, int batch) {
    int i;
    size_t r, c;
    DDP__TRY(ddp_copy(m->device, m->act[0], ddp__cpu(), x, (size_t)batch * m->layers[0].in * sizeof(float),
                      m->stream));
    for (i = 0; i < m->nlayers; i++) {
        const ddp__layer* L = &m->layers[i];
        const float* in = m->act[i];
        float* out = m->act[i + 1];
        long long n = (long long)batch * L->out;
        if (L->kind == DDP_LAYER_LINEAR) {
            DDP__TRY(ddp_unit_begin(m, L->weight->unit, DDP_FORWARD));
            /* out[B, out] = in[B, in] . W^T, then + b on every row */
            DDP__TRY(ddp_gemm(m, 0, 1, batch, L->out, L->in, 1.f, in, L->in, L->weight->data, L->in, 0.f,
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
                DDP__TRY(ddp_unit_end(m, L->weight->unit, DDP_FORWARD));
                continue;
            }
#endif
            for (r = 0; r < (size_t)batch; r++)
                for (c = 0; c < (size_t)L->out; c++) out[r * L->out + c] += L->bias->data[c];
            DDP__TRY(ddp_unit_end(m, L->weight->unit, DDP_FORWARD));
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
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_forward(ddp_model* m, const float* x, int batch) {
    double t_start;
    ddp_status s;
    if (m->nlayers == 0)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, m->nparams ? "ddp_model_forward runs ddp_model_mlp's layers: a "
                         "model of your own tensors runs your forward, between ddp_unit_begin(m, 0, DDP_FORWARD) and "
                         "ddp_unit_end" : "forward on a model with no layers");
    if (batch < 1) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "forward: batch is %d, must be >= 1", batch);
    t_start = ddp__now();
    DDP__TRY(ddp__model_reserve(m, batch));
    m->batch = batch;
    m->have_output = m->have_loss = 0;
    DDP__TRY(ddp_unit_begin(m, 0, DDP_FORWARD));
    s = ddp__mlp_forward(m, x, batch);
    if (s == DDP_OK) s = ddp_unit_end(m, 0, DDP_FORWARD);
    if (s != DDP_OK) {
        ddp__model_unbracket(m);
        return s;
    }
    m->have_output = 1;
    ddp__trace("forward", DDP__TRACE_COMPUTE, t_start, ddp__now());
    return DDP_OK;
}

/* Copy the last forward's output [batch, out_features] to the host array `out`. */
DDP__PRIVATE ddp_status ddp__model_output(ddp_model* m, float* out) {
    if (!m->have_output) return ddp__fail(DDP_ERR_STATE, "ddp__model_output before ddp_model_forward");
    DDP__TRY(ddp_copy(ddp__cpu(), out, m->device, m->act[m->nlayers],
                      (size_t)m->batch * ddp__model_out_features(m) * sizeof(float), m->stream));
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
    int B = m->batch, C = ddp__model_out_features(m), r, c;
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

/* Mean squared error against host targets[batch, out_features] (F.mse_loss); as above. */
DDP__PRIVATE ddp_status ddp__loss_mse(ddp_model* m, const float* targets, float* loss) {
    int B = m->batch, C = ddp__model_out_features(m), r, c;
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

DDP__PRIVATE ddp_status ddp__mlp_backward(ddp_model* m);
DDP__DEF ddp_status ddp_model_backward(ddp_model* m) {
    ddp_status s;
    if (m->nlayers == 0 && m->nparams)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_model_backward runs ddp_model_mlp's layers: a model of your "
                         "own tensors runs your backward, between ddp_unit_begin(m, 0, DDP_BACKWARD) and ddp_unit_end");
    if (m->have_loss == 2)
        return ddp__fail(DDP_ERR_STATE, "backward already ran for this loss, and a second one would add its gradients "
                         "again: compute the loss again (or run forward and the loss on the next batch) before the next "
                         "ddp_model_backward (in PyTorch, a second loss.backward() fails the same way)");
    if (m->have_loss != 1) return ddp__fail(DDP_ERR_STATE, "backward needs forward and a loss first");
    m->have_loss = 2; /* one backward per loss, as autograd frees the graph after backward */
    DDP__TRY(ddp_unit_begin(m, 0, DDP_BACKWARD));
    s = ddp__mlp_backward(m);
    if (s != DDP_OK) {
        ddp__model_unbracket(m);
        return s;
    }
    if (ddp__trace_on()) ddp__trace(m->trace_name, DDP__TRACE_COMPUTE, m->trace_t, ddp__now());
    return ddp_unit_end(m, 0, DDP_BACKWARD);
}

/* The layers' backward, last first, between the model's brackets (ddp_model_backward). */
DDP__PRIVATE ddp_status ddp__mlp_backward(ddp_model* m) {
    int i, B = m->batch;
    float *g = m->grad_a, *gnext = m->grad_b, *t;
    for (i = m->nlayers - 1; i >= 0; i--) {
        const ddp__layer* L = &m->layers[i];
        long long n = (long long)B * L->in;
        double t_layer = ddp__now();
        if (ddp__trace_on()) { /* one span per layer: "backward fc2", "backward relu (layer 3)" */
            int k, fc = 0;
            for (k = 0; k <= i; k++) fc += m->layers[k].kind == DDP_LAYER_LINEAR;
            if (i + 1 < m->nlayers) ddp__trace(m->trace_name, DDP__TRACE_COMPUTE, m->trace_t, t_layer);
            if (L->kind == DDP_LAYER_LINEAR) snprintf(m->trace_name, sizeof m->trace_name, "backward fc%d", fc);
            else snprintf(m->trace_name, sizeof m->trace_name, "backward %s (layer %d)",
                          L->kind == DDP_LAYER_RELU ? "relu" : "gelu", i + 1);
            m->trace_t = t_layer;
        }
        if (L->kind == DDP_LAYER_LINEAR) {
            DDP__TRY(ddp_unit_begin(m, L->weight->unit, DDP_BACKWARD));
            /* dW[out, in] += g[B, out]^T . x[B, in];  db[out] += column sums of g */
            DDP__TRY(ddp_gemm(m, 1, 0, L->out, L->in, B, 1.f, g, L->out, m->act[i], L->in, 1.f,
                               L->weight->grad, L->in));
            DDP__TRY(ddp__bias_grad(m, g, L->bias, B, L->out));
            /* Both gradients of this layer are final now: announce them (bias first, so the
               order is exactly the reverse of registration) before computing the input
               gradient, so a hook's communication can overlap the rest of backward. */
            DDP__TRY(ddp_param_grad_ready(L->bias));
            DDP__TRY(ddp_param_grad_ready(L->weight));
            if (i == 0) { /* nobody needs the gradient of the input data */
                DDP__TRY(ddp_unit_end(m, L->weight->unit, DDP_BACKWARD));
                break;
            }
            /* dx[B, in] = g[B, out] . W[out, in] */
            DDP__TRY(ddp_gemm(m, 0, 0, B, L->in, L->out, 1.f, g, L->out, L->weight->data, L->in, 0.f,
                               gnext, L->in));
            DDP__TRY(ddp_unit_end(m, L->weight->unit, DDP_BACKWARD));
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

DDP__PRIVATE void ddp__model_set_post_backward(ddp_model* m, ddp_post_backward_fn fn, void* user) {
    m->post_backward = fn;
    m->post_backward_user = user;
}

DDP__DEF ddp_status ddp_model_zero_grad(ddp_model* m) {
    int i;
    m->local_backwards = 0;
    for (i = 0; i < m->nparams; i++) /* ZeRO-2 and -3 hold a gradient only during backward */
        if (m->params[i]->grad)
            DDP__TRY(ddp__zero(m->device, m->params[i]->grad, m->params[i]->count * sizeof(float), m->stream));
    return DDP_OK;
}

DDP__DEF ddp_status ddp_model_evaluate(ddp_model* m, const float* x, const int* labels, int n,
                                       float* accuracy, float* mean_loss) {
    int start, C = ddp__model_out_features(m), in = ddp__model_in_features(m), correct = 0;
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
        if (s == DDP_OK) s = ddp__model_output(m, out);
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

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>reducer: the DDP wrapper: buckets, hooks, overlap, no_sync                (chapters 2, 7-8)  */
/* ============================================================================================== */
#if DDP__DECLARE
/* ddp_wrap makes a model data-parallel, as torch.nn.parallel.DistributedDataParallel does: it
   checks that every rank has the same model, copies rank 0's parameters to every rank, groups the
   gradients into buckets (last layer first) and hooks every parameter. During backward each
   gradient is scaled by 1/world size into its bucket; a full bucket is all-reduced at once, on
   the communication thread or stream, while backward goes on with earlier layers. At the end of
   backward the wrapper waits for the buckets and writes the averaged gradients back into p->grad,
   so the optimizer step that follows is the same on every rank. The training loop itself does
   not change. */

typedef struct ddp_wrap_desc {
    size_t bucket_cap_bytes;      /* default 25 MiB (PyTorch's bucket_cap_mb) */
    size_t first_bucket_bytes;    /* default 1 MiB: a small first bucket starts communication early */
    int gradient_as_bucket_view;  /* 1: p->grad lives inside the bucket (saves a copy and memory) */
    int find_unused_parameters;   /* 1: a parameter without a gradient counts as zero, not an error */
    ddp_dtype compress;           /* DDP_F16 or DDP_BF16: all-reduce in 16 bits (PyTorch's
                                     fp16/bf16_compress_hook); default: no compression */
    int zero_stage;               /* 0: DDP, every rank holds everything. 1 (ZeRO-1): each rank
                                     keeps the optimizer state of its 1/N shard of the parameters,
                                     updates that shard and all-gathers the rest. 2: the gradients
                                     too, reduce-scattered layer by layer during backward. 3: the
                                     weights too, gathered layer by layer when used (>>zero). Create
                                     the optimizer after ddp_wrap. At 2 and 3 a layer is the unit:
                                     bucket caps and gradient_as_bucket_view do not apply, and
                                     p->grad exists only during backward (and p->data, at 3, only
                                     while the layer is gathered: see ddp_full_params) */
    int prefetch;                 /* zero_stage 3: gather the next layer's weights while this one
                                     computes (holds one layer more) */
    int uneven_inputs;            /* 1: ranks may run out of batches at different steps (PyTorch's
                                     Join). Each synchronised backward first counts the ranks still
                                     training; a rank out of batches calls ddp_join, which answers
                                     the others' all-reduces with zeros. The average divides by the
                                     world size ddp_wrap saw, as PyTorch's default
                                     (divide_by_initial_world_size=True) does */
    int divide_by_active_ranks;   /* with uneven_inputs: divide by the ranks still training instead
                                     (PyTorch's divide_by_initial_world_size=False) */
} ddp_wrap_desc;

typedef struct ddp_wrapper ddp_wrapper;

/* What the wrapper has done, for a student to print. Times in seconds, sizes in bytes. */
typedef struct ddp_wrap_stats {
    int buckets;                  /* number of buckets */
    size_t bucket_bytes[64];      /* the first 64 buckets' sizes, bucket 0 first (reduced first) */
    int bucket_params[64];        /* parameters in each */
    long steps;                   /* synchronised backward passes */
    long all_reduces;             /* all-reduce calls issued */
    uint64_t bytes_reduced;       /* bytes handed to all-reduce (zero_stage 2-3: to reduce-scatter) */
    double wait_s;                /* time backward spent waiting for communication after its
                                     last layer: the communication overlap did not hide (on a
                                     GPU, counted from when backward's kernels have finished) */
    size_t param_bytes;           /* the model's weights this rank holds (all of them; zero_stage 3:
                                     its shards, and the buffers gathered layers go into) */
    size_t param_peak_bytes;      /* zero_stage 3: the most weight bytes in use at once: the shards
                                     and the layers gathered (otherwise param_bytes) */
    long reduce_scatters;         /* zero_stage 2-3: reduce-scatters of gradients issued */
    long all_gathers;             /* zero_stage 1-3: all-gathers of weights issued */
    uint64_t bytes_gathered;      /* bytes each rank handed to those all-gathers */
    size_t grad_bytes;            /* gradient memory this rank holds: p->grad, the buckets unless
                                     gradient_as_bucket_view puts p->grad inside them, and their
                                     16-bit copies when compressing (zero_stage 2-3: its shards
                                     of the averaged gradients, and the buffers backward uses) */
    size_t optim_state_bytes;     /* optimizer state this rank holds for the model (ZeRO-1: its
                                     shard's; DDP: all of it) */
    double backward_s;            /* time from each synchronised backward's first ready gradient to
                                     its end, for comparison */
    int active_ranks;             /* uneven_inputs: ranks that trained in the last synchronised step */
    long shadowed_steps;          /* uneven_inputs: the other ranks' steps ddp_join answered with zeros */
    int last_joined;              /* after ddp_join: the rank whose weights every rank now holds */
} ddp_wrap_stats;

/* Wrap model m for data-parallel training on group pg (collective). Errors: DDP_ERR_MODEL_MISMATCH
   on every rank naming the first difference and the ranks when the models differ, or the
   settings of desc (each rank's value); DDP_ERR_INVALID_ARGUMENT for a bad desc; the group's errors. */
DDP_API ddp_status ddp_wrap(ddp_pg* pg, ddp_model* m, const ddp_wrap_desc* desc, ddp_wrapper** out);
/* Unhook the model and free the wrapper (the model keeps its weights). NULL is ignored. */
DDP_API void ddp_wrapper_destroy(ddp_wrapper* w);
/* on = 1: the following backward passes only accumulate gradients locally (PyTorch's no_sync());
   on = 0: the next backward all-reduces the accumulated sum. An optimizer step on gradients that
   no_sync backward passes added after the last all-reduce logs a warning (once per process; not
   with one rank, whose one replica cannot drift from another). */
DDP_API void ddp_no_sync(ddp_wrapper* w, int on);
/* Copy the counters into *out. */
DDP_API void ddp_wrapper_stats(const ddp_wrapper* w, ddp_wrap_stats* out);
/* This rank has no batches left (a wrapper made with uneven_inputs). Collective in the end: every
   rank calls it once after its last step (of the run, or of each epoch). Until every rank has
   called it, it takes part in the others' synchronised backward passes with zero gradients; then
   every rank takes the weights of the rank that trained the most steps since the last join (the
   last to join; the highest such rank on a tie), so all replicas end equal. Its own optimizer
   takes no step meanwhile, and its state stays as it was. DDP_ERR_STATE without uneven_inputs;
   the group's errors. */
DDP_API ddp_status ddp_join(ddp_wrapper* w);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
/* >>kernels: */
DDP__PRIVATE ddp_status ddp__convert(ddp_device d, ddp_dtype dst_type, void* dst, ddp_dtype src_type,
                                const void* src, size_t count, ddp_stream* s);
DDP__PRIVATE ddp_status ddp__event_sync(ddp_event* e); /* >>cuda */
DDP__PRIVATE void ddp__wrapper_log_buckets(const ddp_wrapper* w); /* >>reducer */
DDP__PRIVATE ddp_status ddp__verify_model(ddp_wrapper* w); /* >>signals */
DDP__PRIVATE ddp_status ddp__optim_follow(struct ddp_optim* o, ddp_pg* pg, int root); /* >>optim */
/* >>zero: */
DDP__PRIVATE ddp_status ddp__zero_create(ddp_pg* pg, ddp_model* m, int stage, int prefetch, ddp__shards** out);
DDP__PRIVATE ddp_status ddp__zero_destroy(ddp__shards* z);
DDP__PRIVATE ddp_status ddp__zero_grad_ready(ddp__shards* z, ddp_param* p, float scale);
DDP__PRIVATE ddp_status ddp__zero_grads_ensure(ddp__shards* z, int g);
DDP__PRIVATE ddp_status ddp__zero_grads_done(ddp__shards* z);
DDP__PRIVATE int ddp__zero_stage(const ddp__shards* z);
DDP__PRIVATE int ddp__zero_group_of(const ddp__shards* z, int param);
DDP__PRIVATE void ddp__zero_stats(const ddp__shards* z, ddp_wrap_stats* st);

/*
   The life of one synchronised backward pass:
     1. ddp_model_backward reaches a parameter whose gradient is final and calls its hook;
     2. the hook copies grad * (1/W) into the parameter's slot of its bucket (with
        gradient_as_bucket_view the gradient already lives there and is scaled in place); on
        the CPU backend the all-reduce multiplies by 1/W in the pass over the data it takes
        anyway (ddp_work.premul), the same products, and without the view it reads each p->grad
        where it is (ddp_work.tensors): the hook has nothing left to do;
     3. when every parameter of a bucket is in, the bucket is ready; ready buckets are launched
        as asynchronous all-reduces (sum) strictly in bucket order, the same on every rank;
     4. backward goes on with earlier layers while the all-reduces run;
     5. the post-backward callback waits for every bucket and copies the averages back into
        p->grad (on the CPU backend the all-reduce has written them there already).
   Pre-dividing by W and then summing is PyTorch's choice too: the sum of W averages cannot
   overflow where a sum of W gradients might.
*/

typedef struct ddp__bucket {
    int* params;        /* indexes into the model's parameters, in the order they arrive */
    int nparams, pending;
    size_t count;       /* f32 elements */
    float* buf;         /* on the model's device */
    void* wire;         /* the compressed copy that travels, when compressing */
    ddp_work* work;
    float** grads;      /* the parameters' gradients in bucket order, and where each starts in the */
    size_t* at;         /* bucket (nparams + 1: the last is count), for a fused all-reduce */
    int fused;          /* this step's all-reduce reads and writes p->grad itself (see fuse) */
} ddp__bucket;

struct ddp_wrapper {
    ddp_pg* pg;
    ddp_model* m;
    ddp_wrap_desc d;
    int nbuckets, next_launch, sync;
    ddp_status broken;   /* a failure in a hook, reported when backward ends */
    ddp__bucket* buckets;
    int* bucket_of;     /* per parameter */
    size_t* offset_of;  /* per parameter, elements into its bucket */
    unsigned char* ready;
    float** old_grad;   /* gradient_as_bucket_view: the parameter's own grad, restored at the end */
    ddp_wrap_stats st;
    double t_backward_start;
    ddp_event* backward_done; /* GPU: the end of backward's kernels, where exposed waiting starts */
    struct ddp__shards* z; /* zero_stage 1-3: the shards (>>zero) */
    float* join_buf;    /* uneven_inputs: room for W floats on the model's device */
    int counted;        /* uneven_inputs: this backward pass has counted the active ranks */
    long joined_at;     /* uneven_inputs: st.steps when ddp_join last returned */
    float scale;        /* what each gradient is multiplied by into its bucket: 1 / the divisor */
    int premul;         /* the CPU backend multiplies by `scale` in the all-reduce's first pass over the
                           bucket (ddp_work.premul), so the hook only copies; saves one pass over the
                           gradients, all of them with gradient_as_bucket_view */
    int fuse;           /* premul without the view: the all-reduce reads each p->grad where it is and
                           writes the average back there (ddp_work.tensors), so the hook copies
                           nothing and step 5 neither: two passes fewer */
    char err[sizeof ddp__err_msg];
};

/* f32 dst = src * a on the model's device, in order on its stream (a copy, or nothing, for a = 1). */
DDP__PRIVATE ddp_status ddp__scale(ddp_model* m, float* dst, const float* src, size_t n, float a) {
    (void)m;
#if DDP__CUDA
    if (m->device.type == DDP_DEVICE_CUDA) {
        long long cnt = (long long)n;
        void* args[4];
        args[0] = &dst, args[1] = (void*)&src, args[2] = &cnt, args[3] = &a;
        return n ? ddp__launch(m->device, m->stream, DDP__K_scale, cnt, args) : DDP_OK;
    }
#endif
    if (a == 1.0f) {
        if (dst != src && n) memmove(dst, src, n * sizeof *dst);
    } else {
        size_t i;
        for (i = 0; i < n; i++) dst[i] = src[i] * a;
    }
    return DDP_OK;
}

/* Launch every ready bucket from next_launch on, in order: bucket k never overtakes k-1. With
   to_grads the averages go straight into p->grad where the backend can do that (see premul). */
DDP__PRIVATE ddp_status ddp__launch_ready(ddp_wrapper* w, int to_grads) {
    while (w->next_launch < w->nbuckets && w->buckets[w->next_launch].pending == 0) {
        ddp__bucket* b = &w->buckets[w->next_launch];
        /* Every gradient is in once the last bucket goes: it is waited for next, so it need not
           wake the communication thread (see ddp__cpu_submit). */
        int lazy = w->next_launch == w->nbuckets - 1;
        ddp_status s;
        if (w->d.compress == DDP_F16 || w->d.compress == DDP_BF16) {
            s = ddp__convert(w->m->device, w->d.compress, b->wire, DDP_F32, b->buf, b->count, w->m->stream);
            if (s == DDP_OK)
                s = ddp__collective(w->pg, DDP__ALL_REDUCE, b->wire, NULL, b->count, w->d.compress, DDP_SUM, 0, lazy,
                                    NULL, &b->work);
            w->st.bytes_reduced += b->count * 2;
        } else {
            ddp__fused f;
            int i;
            memset(&f, 0, sizeof f);
            if (w->premul) f.premul = w->scale;
            b->fused = w->fuse && to_grads;
            if (b->fused) { /* the gradients' addresses as they are now: a caller may have moved one */
                for (i = 0; i < b->nparams; i++) b->grads[i] = w->m->params[b->params[i]]->grad;
                f.ntensors = b->nparams, f.tensors = b->grads, f.tensor_at = b->at;
            }
            s = ddp__collective(w->pg, DDP__ALL_REDUCE, b->buf, NULL, b->count, DDP_F32, DDP_SUM, 0, lazy, &f,
                                &b->work);
            w->st.bytes_reduced += b->count * 4;
        }
        if (s != DDP_OK) return s;
        w->st.all_reduces++;
        ddp__log(DDP_LOG_DETAIL, "reducer: bucket %d ready (%d parameters, %zu bytes): all-reduce launched",
                w->next_launch, b->nparams, b->count * 4);
        w->next_launch++;
    }
    return DDP_OK;
}

/*
   Uneven inputs (PyTorch's Join). A rank that has run out of batches cannot simply stop: the
   others' next all-reduce would wait for it until the deadline. So with uneven_inputs every
   synchronised backward opens with one more all-reduce, of a single number: 1 from each rank
   still training. A rank in ddp_join adds 0 to it, and while the sum is above 0 it launches the
   same bucket all-reduces as the others, with zeros. When the sum is 0 every rank has joined.
   Zeros leave the sum of the gradients to the active ranks; dividing it by the initial world size
   (each gradient was scaled by 1/W on its way in) weighs every sample of a short step as much as
   one of a full step would be, which is PyTorch's default.
*/
/* Sum `mine` over the ranks (a vector of n floats, n <= W) through the wrapper's buffer. */
DDP__PRIVATE ddp_status ddp__join_sum(ddp_wrapper* w, float* mine, int n) {
    ddp_model* m = w->m;
    if (!w->join_buf)
        DDP__TRY(ddp_alloc(m->device, (size_t)ddp_world_size(w->pg) * sizeof(float), (void**)&w->join_buf));
    DDP__TRY(ddp_copy(m->device, w->join_buf, ddp__cpu(), mine, (size_t)n * sizeof(float), m->stream));
    DDP__TRY(ddp_all_reduce(w->pg, w->join_buf, (size_t)n, DDP_F32, DDP_SUM, NULL));
    DDP__TRY(ddp_copy(ddp__cpu(), mine, m->device, w->join_buf, (size_t)n * sizeof(float), m->stream));
    return ddp_stream_sync(m->stream);
}

/* A training rank's count at the start of a synchronised backward: how many ranks are still
   training, and so what the gradients are divided by. */
DDP__PRIVATE ddp_status ddp__join_count(ddp_wrapper* w) {
    float active = 1.f;
    w->counted = 1;
    DDP__TRY(ddp__join_sum(w, &active, 1));
    w->st.active_ranks = (int)active;
    if (w->d.divide_by_active_ranks) w->scale = 1.f / active;
    ddp__log(DDP_LOG_DETAIL, "join: %d of %d ranks train this step", (int)active, ddp_world_size(w->pg));
    return DDP_OK;
}

/* The gradient-ready hook: step 2 and 3 above. */
static void ddp__reducer_hook(ddp_param* p, void* user) {
    ddp_wrapper* w = (ddp_wrapper*)user;
    ddp__bucket* b;
    float* slot;
    ddp_status s;
    if (!w->sync || w->broken) return; /* no_sync: the gradient just accumulates in p->grad */
    if (w->t_backward_start == 0) w->t_backward_start = ddp__now(); /* the first gradient of this pass */
    if (w->d.uneven_inputs && !w->counted && (s = ddp__join_count(w)) != DDP_OK) {
        w->broken = s;
        snprintf(w->err, sizeof w->err, "%s", ddp_error_string());
        return;
    }
    w->ready[p->index] = 1; /* once per backward: ddp_param_grad_ready refuses a second call */
    if (ddp__zero_stage(w->z) >= 2) { /* ZeRO-2/3: the layer's gradients are reduce-scattered (>>zero) */
        if ((s = ddp__zero_grad_ready(w->z, p, w->scale)) != DDP_OK) {
            w->broken = s;
            snprintf(w->err, sizeof w->err, "%s", ddp_error_string());
        }
        return;
    }
    b = &w->buckets[w->bucket_of[p->index]];
    slot = b->buf + w->offset_of[p->index];
    /* into the bucket, already divided by the world size (in place for a bucket view); with
       premul the all-reduce divides as it first reads the bucket, one pass less over memory, and
       with fuse it reads p->grad itself */
    s = w->fuse ? DDP_OK : ddp__scale(w->m, slot, p->grad, p->count, w->premul ? 1.0f : w->scale);
    if (s == DDP_OK && --b->pending == 0) s = ddp__launch_ready(w, 1);
    if (s != DDP_OK) {
        w->broken = s;
        snprintf(w->err, sizeof w->err, "%s", ddp_error_string());
    }
}

/* Step 5: after the last layer, wait for every bucket and hand the averages back. */
static ddp_status ddp__reducer_finish(ddp_model* m, void* user) {
    ddp_wrapper* w = (ddp_wrapper*)user;
    double t0;
    int i, k;
    ddp_status s = DDP_OK;
    if (!w->sync) { /* no_sync: the gradients stay this rank's own until a synchronised backward */
        /* With one rank there is no other replica to drift from: nothing to warn about later. */
        if (ddp_world_size(w->pg) > 1) m->local_backwards++;
        return DDP_OK;
    }
    if (w->broken) return ddp__fail(w->broken, "%s", w->err);
    if (w->d.uneven_inputs && !w->counted) DDP__TRY(ddp__join_count(w)); /* no gradient at all came */
    /* parameters that received no gradient this time */
    for (i = 0; i < m->nparams; i++) {
        ddp_param* p = m->params[i];
        if (w->ready[i]) continue;
        if (!w->d.find_unused_parameters) {
            w->broken = DDP_ERR_UNUSED_PARAMETER;
            snprintf(w->err, sizeof w->err, "parameter %s (index %d) received no gradient in this backward pass on "
                     "rank %d, so its bucket can never be all-reduced. Make every parameter take part in the loss, "
                     "or set ddp_wrap_desc.find_unused_parameters", p->name, i, ddp_rank(w->pg));
            return ddp__fail(DDP_ERR_UNUSED_PARAMETER, "%s", w->err);
        }
        /* find_unused_parameters: it contributes zeros, and its bucket can go */
        w->ready[i] = 1;
        if (ddp__zero_stage(w->z) >= 2) {
            int g = ddp__zero_group_of(w->z, i);
            s = ddp__zero_grads_ensure(w->z, g); /* a zeroed buffer if backward never reached the layer */
            if (s == DDP_OK && p->grad) s = ddp__zero(m->device, p->grad, p->count * sizeof(float), m->stream);
            if (s == DDP_OK) s = ddp__zero_grad_ready(w->z, p, w->scale);
            if (s != DDP_OK) return s;
            continue;
        }
        {
            ddp__bucket* b = &w->buckets[w->bucket_of[i]];
            s = ddp__zero(m->device, w->fuse ? p->grad : b->buf + w->offset_of[i], p->count * sizeof(float), m->stream);
            if (s == DDP_OK && --b->pending == 0) s = ddp__launch_ready(w, 1);
            if (s != DDP_OK) return s;
        }
    }
    /* On a GPU the host reaches this point while backward's kernels still run: the wait that
       communication adds starts only when they are done. */
    if (m->device.type == DDP_DEVICE_CUDA) {
        if (!w->backward_done) s = ddp__event_create(m->device, &w->backward_done);
        if (s == DDP_OK) s = ddp__event_record(w->backward_done, m->stream);
        if (s == DDP_OK) s = ddp__event_sync(w->backward_done);
    }
    t0 = ddp__now();
    if (s == DDP_OK && ddp__zero_stage(w->z) >= 2) s = ddp__zero_grads_done(w->z);
    for (k = 0; k < w->nbuckets && s == DDP_OK; k++) {
        ddp__bucket* b = &w->buckets[k];
        s = ddp_work_wait(b->work);
        b->work = NULL;
        if (s == DDP_OK && b->wire) s = ddp__convert(m->device, DDP_F32, b->buf, w->d.compress, b->wire, b->count, m->stream);
    }
    w->st.wait_s += ddp__now() - t0;
    ddp__trace("wait for buckets", DDP__TRACE_COMPUTE, t0, ddp__now());
    for (k = 0; k < w->nbuckets && s == DDP_OK && !w->d.gradient_as_bucket_view; k++) {
        ddp__bucket* b = &w->buckets[k];
        for (i = 0; i < b->nparams && s == DDP_OK && !b->fused; i++) {
            ddp_param* p = m->params[b->params[i]];
            s = ddp_copy(m->device, p->grad, m->device, b->buf + w->offset_of[p->index], p->count * sizeof(float),
                         m->stream);
        }
    }
    if (s != DDP_OK) {
        w->broken = s;
        snprintf(w->err, sizeof w->err, "%s", ddp_error_string());
        return s;
    }
    /* ready for the next backward */
    w->counted = 0;
    memset(w->ready, 0, (size_t)m->nparams);
    for (k = 0; k < w->nbuckets; k++) w->buckets[k].pending = w->buckets[k].nparams;
    w->next_launch = 0;
    w->st.steps++;
    m->local_backwards = 0; /* what accumulated under no_sync has now been averaged too */
    if (w->t_backward_start > 0) w->st.backward_s += ddp__now() - w->t_backward_start;
    w->t_backward_start = 0;
    return DDP_OK;
}

/* Bucket assignment: walk the parameters last to first (the order backward makes them ready)
   and close a bucket once it holds at least its limit: first_bucket_bytes for the first, then
   bucket_cap_bytes. A parameter is never split, so a bucket may overshoot by one parameter. */
DDP__PRIVATE ddp_status ddp__assign_buckets(ddp_wrapper* w) {
    ddp_model* m = w->m;
    int i, k = 0;
    size_t bytes = 0;
    w->buckets = (ddp__bucket*)ddp__calloc((size_t)m->nparams * sizeof *w->buckets);
    w->bucket_of = (int*)ddp__calloc((size_t)m->nparams * sizeof(int));
    w->offset_of = (size_t*)ddp__calloc((size_t)m->nparams * sizeof(size_t));
    w->ready = (unsigned char*)ddp__calloc((size_t)m->nparams + 1);
    if (!w->buckets || !w->bucket_of || !w->offset_of || !w->ready)
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the bucket map failed");
    for (i = m->nparams - 1; i >= 0; i--) {
        ddp__bucket* b = &w->buckets[k];
        size_t limit = k == 0 ? w->d.first_bucket_bytes : w->d.bucket_cap_bytes;
        if (!b->params) {
            b->params = (int*)ddp__malloc((size_t)m->nparams * sizeof(int));
            if (!b->params) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a bucket failed");
        }
        w->bucket_of[i] = k;
        w->offset_of[i] = b->count;
        b->params[b->nparams++] = i;
        b->count += m->params[i]->count;
        bytes += m->params[i]->count * sizeof(float);
        if (bytes >= limit || i == 0) {
            k++;
            bytes = 0;
        }
    }
    w->nbuckets = k;
    for (k = 0; k < w->nbuckets; k++) {
        ddp__bucket* b = &w->buckets[k];
        b->pending = b->nparams;
        DDP__TRY(ddp_alloc(m->device, b->count * sizeof(float), (void**)&b->buf));
        b->grads = (float**)ddp__calloc((size_t)b->nparams * sizeof(float*));
        b->at = (size_t*)ddp__malloc(((size_t)b->nparams + 1) * sizeof(size_t));
        if (!b->grads || !b->at) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a bucket failed");
        for (i = 0; i < b->nparams; i++) b->at[i] = w->offset_of[b->params[i]];
        b->at[b->nparams] = b->count;
        if (w->d.compress == DDP_F16 || w->d.compress == DDP_BF16)
            DDP__TRY(ddp_alloc(m->device, b->count * 2, &b->wire));
        if (k < 64) {
            w->st.bucket_bytes[k] = b->count * sizeof(float);
            w->st.bucket_params[k] = b->nparams;
        }
    }
    w->st.buckets = w->nbuckets;
    return DDP_OK;
}

DDP__DEF ddp_status ddp_wrap(ddp_pg* pg, ddp_model* m, const ddp_wrap_desc* desc, ddp_wrapper** out) {
    ddp_wrapper* w;
    ddp_status s, bad = DDP_OK;
    int i;
    char dn[32], pn[32];
    *out = NULL;
    if (m->device.type != pg->device.type || m->device.index != pg->device.index)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "the model is on %s but the group's buffers are on %s: create the "
                         "model on ddp_pg_device(pg)", ddp_device_name(m->device, dn, sizeof dn),
                         ddp_device_name(pg->device, pn, sizeof pn));
    w = (ddp_wrapper*)ddp__calloc(sizeof *w);
    if (!w) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the wrapper failed");
    if (desc) w->d = *desc;
    if (w->d.bucket_cap_bytes == 0) w->d.bucket_cap_bytes = (size_t)25 << 20;
    if (w->d.first_bucket_bytes == 0) w->d.first_bucket_bytes = (size_t)1 << 20;
    if (w->d.compress == DDP_DTYPE_DEFAULT) w->d.compress = DDP_F32;
    if (w->d.zero_stage < 0 || w->d.zero_stage > 3)
        bad = ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_wrap_desc.zero_stage %d: 0 (DDP), 1 (the optimizer's state "
                        "sharded), 2 (and the gradients) or 3 (and the weights)", desc->zero_stage);
    else if (w->d.zero_stage >= 2 && w->d.compress != DDP_F32)
        bad = ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_wrap_desc: zero_stage %d with compress (16-bit gradients) is "
                        "not built: its gradients go through reduce-scatters in f32. Use one of the two",
                        desc->zero_stage);
    else if (w->d.uneven_inputs && w->d.zero_stage)
        bad = ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_wrap_desc: uneven_inputs with zero_stage %d is not built: a "
                        "rank that joined would also have to update its shard and take part in the all-gather of "
                        "the weights. Use one of the two", desc->zero_stage);
    w->pg = pg, w->m = m, w->sync = 1;
    w->scale = 1.f / (float)ddp_world_size(pg);
    w->premul = pg->vt == ddp__cpu_vt() && m->device.type == DDP_DEVICE_CPU && w->d.compress != DDP_F16 &&
                w->d.compress != DDP_BF16;
    w->fuse = w->premul && !w->d.gradient_as_bucket_view && w->d.zero_stage < 2;
    if (bad != DDP_OK) { /* still compared with the others: they learn at once which setting differs */
        char msg[sizeof ddp__err_msg];
        memcpy(msg, ddp__err_msg, sizeof msg);
        (void)ddp__verify_model(w);
        DDP_FREE(w);
        return ddp__fail(bad, "%s", msg);
    }
    s = ddp__verify_model(w);
    /* every rank starts from rank 0's weights, whatever its own seed was */
    for (i = 0; i < m->nparams && s == DDP_OK; i++)
        s = ddp__broadcast(pg, m->params[i]->data, m->params[i]->count, DDP_F32, 0, NULL);
    if (s == DDP_OK && w->d.zero_stage >= 2) { /* no buckets: a layer's gradients go as one (>>zero) */
        w->ready = (unsigned char*)ddp__calloc((size_t)m->nparams + 1);
        if (!w->ready) s = ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the wrapper failed");
    } else if (s == DDP_OK) {
        s = ddp__assign_buckets(w);
    }
    if (s == DDP_OK && w->d.zero_stage) s = ddp__zero_create(pg, m, w->d.zero_stage, w->d.prefetch, &w->z);
    if (s == DDP_OK && w->d.gradient_as_bucket_view && w->d.zero_stage < 2) {
        w->old_grad = (float**)ddp__calloc((size_t)m->nparams * sizeof(float*));
        if (!w->old_grad) s = ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the gradient views failed");
        for (i = 0; i < m->nparams && s == DDP_OK; i++) {
            ddp_param* p = m->params[i];
            float* view = w->buckets[w->bucket_of[i]].buf + w->offset_of[i];
            s = ddp_copy(m->device, view, m->device, p->grad, p->count * sizeof(float), m->stream);
            w->old_grad[i] = p->grad;
            p->grad = view; /* the gradient now lives in the bucket: no copy in, no copy out */
        }
    }
    for (i = 0; i < m->nparams && s == DDP_OK; i++) s = ddp_param_add_hook(m->params[i], ddp__reducer_hook, w);
    if (s != DDP_OK) {
        char msg[sizeof ddp__err_msg];
        memcpy(msg, ddp__err_msg, sizeof msg);
        ddp_wrapper_destroy(w);
        return ddp__fail(s, "%s", msg);
    }
    ddp__model_set_post_backward(m, ddp__reducer_finish, w);
    ddp__pg_set_stream(pg, m->device.type == DDP_DEVICE_CUDA ? m->stream : NULL);
    m->zero = w->z;
    m->rank = ddp_rank(pg);
    m->pg = pg;
    *out = w;
    if (ddp__log_level_enabled() >= DDP_LOG_INFO && ddp_rank(pg) == 0) ddp__wrapper_log_buckets(w);
    return DDP_OK;
}

DDP__DEF void ddp_wrapper_destroy(ddp_wrapper* w) {
    int i;
    if (!w) return;
    for (i = 0; i < w->m->nparams; i++) {
        ddp_param* p = w->m->params[i];
        int k, j = 0;
        for (k = 0; k < p->nhooks; k++) /* remove only our hook */
            if (p->hooks[k] != ddp__reducer_hook || p->hook_user[k] != w)
                p->hooks[j] = p->hooks[k], p->hook_user[j] = p->hook_user[k], j++;
        p->nhooks = j;
        if (w->old_grad && w->old_grad[i]) {
            ddp_copy(w->m->device, w->old_grad[i], w->m->device, p->grad, p->count * sizeof(float), w->m->stream);
            p->grad = w->old_grad[i];
        }
    }
    if (w->m->post_backward == ddp__reducer_finish) ddp__model_set_post_backward(w->m, NULL, NULL);
    w->m->rank = -1;
    w->m->pg = NULL;
    if (w->z && ddp__zero_destroy(w->z) != DDP_OK) /* zero_stage 3: collective, it gathers the weights back */
        ddp__log(DDP_LOG_WARN, "ddp_wrapper_destroy: giving the model its weights back failed: %s", ddp_error_string());
    ddp_stream_sync(w->m->stream);
    ddp__event_destroy(w->backward_done);
    for (i = 0; i < w->nbuckets; i++) {
        if (w->buckets[i].work) ddp_work_wait(w->buckets[i].work);
        ddp_free(w->m->device, w->buckets[i].buf);
        ddp_free(w->m->device, w->buckets[i].wire);
    }
    if (w->buckets) {
        for (i = 0; i < w->m->nparams; i++) {
            if (w->buckets[i].params) DDP_FREE(w->buckets[i].params);
            if (w->buckets[i].grads) DDP_FREE(w->buckets[i].grads);
            if (w->buckets[i].at) DDP_FREE(w->buckets[i].at);
        }
        DDP_FREE(w->buckets);
    }
    ddp_free(w->m->device, w->join_buf);
    if (w->bucket_of) DDP_FREE(w->bucket_of);
    if (w->offset_of) DDP_FREE(w->offset_of);
    if (w->ready) DDP_FREE(w->ready);
    if (w->old_grad) DDP_FREE(w->old_grad);
    DDP_FREE(w);
}

DDP__DEF void ddp_no_sync(ddp_wrapper* w, int on) { w->sync = !on; }

DDP__DEF ddp_status ddp_join(ddp_wrapper* w) {
    ddp_model* m = w->m;
    const int W = ddp_world_size(w->pg), me = ddp_rank(w->pg);
    float* steps;
    int k, last = 0;
    ddp_status s = DDP_OK;
    if (!w->d.uneven_inputs)
        return ddp__fail(DDP_ERR_STATE, "ddp_join: the wrapper was made without ddp_wrap_desc.uneven_inputs, so the "
                         "other ranks do not count who is still training and would wait for this rank's gradients "
                         "until the deadline: set uneven_inputs = 1 on every rank");
    if (w->broken) return ddp__fail(w->broken, "%s", w->err);
    /* Shadow the others' synchronised steps, one per round, until nobody trains. */
    for (;;) {
        float active = 0.f;
        DDP__TRY(ddp__join_sum(w, &active, 1));
        if (active < 0.5f) break;
        w->st.active_ranks = (int)active;
        for (k = 0; k < w->nbuckets && s == DDP_OK; k++) {
            s = ddp__zero(m->device, w->buckets[k].buf, w->buckets[k].count * sizeof(float), m->stream);
            w->buckets[k].pending = 0;
        }
        w->next_launch = 0;
        if (s == DDP_OK) s = ddp__launch_ready(w, 0); /* zeros in, and the result is not this rank's */
        for (k = 0; k < w->nbuckets; k++) { /* wait even after a failure: no work is left behind */
            ddp_status ws = w->buckets[k].work ? ddp_work_wait(w->buckets[k].work) : DDP_OK;
            w->buckets[k].work = NULL;
            w->buckets[k].pending = w->buckets[k].nparams;
            if (s == DDP_OK) s = ws;
        }
        w->next_launch = 0;
        if (s != DDP_OK) return s;
        w->st.shadowed_steps++;
        ddp__log(DDP_LOG_DETAIL, "join: answered a step of %d training rank%s with zeros", (int)active,
                 active > 1.5f ? "s" : "");
    }
    /* Every rank is here. The one that trained the most steps holds the newest weights. */
    steps = (float*)ddp__calloc((size_t)W * sizeof(float));
    if (!steps) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "ddp_join: no memory");
    steps[me] = (float)(w->st.steps - w->joined_at); /* since the last join: it may come once per epoch */
    s = ddp__join_sum(w, steps, W);
    for (k = 1; k < W && s == DDP_OK; k++)
        if (steps[k] >= steps[last]) last = k;
    DDP_FREE(steps);
    for (k = 0; k < m->nparams && s == DDP_OK; k++)
        s = ddp__broadcast(w->pg, m->params[k]->data, m->params[k]->count, DDP_F32, last, NULL);
    /* and its optimizer's state, which the ranks that joined early did not advance: without it a
       next epoch would start from equal weights but unequal moments, and the replicas drift */
    if (s == DDP_OK && m->optim) s = ddp__optim_follow(m->optim, w->pg, last);
    if (s == DDP_OK) w->st.last_joined = last;
    w->joined_at = w->st.steps;
    return s;
}

DDP__DEF void ddp_wrapper_stats(const ddp_wrapper* w, ddp_wrap_stats* out) {
    int k;
    *out = w->st;
    out->optim_state_bytes = w->m->optim_state_bytes;
    out->param_bytes = out->param_peak_bytes = out->grad_bytes = ddp_model_num_elements(w->m) * sizeof(float);
    for (k = 0; k < w->nbuckets; k++) /* the buckets, and their 16-bit copies when compressing */
        out->grad_bytes += (w->d.gradient_as_bucket_view ? 0 : w->buckets[k].count * sizeof(float)) +
                           (w->buckets[k].wire ? w->buckets[k].count * 2 : 0);
    if (w->z) ddp__zero_stats(w->z, out);
}

/* Print the bucket map (which parameters in which bucket) through the log, at INFO level. */
DDP__PRIVATE void ddp__wrapper_log_buckets(const ddp_wrapper* w) {
    int k, i;
    ddp__log(DDP_LOG_INFO, "reducer: %d bucket%s (cap %zu bytes, first %zu bytes), reduced in this order:", w->nbuckets,
            w->nbuckets == 1 ? "" : "s", w->d.bucket_cap_bytes, w->d.first_bucket_bytes);
    for (k = 0; k < w->nbuckets; k++) {
        char names[512];
        size_t pos = 0;
        names[0] = 0;
        for (i = 0; i < w->buckets[k].nparams && pos < sizeof names - 40; i++)
            pos += (size_t)snprintf(names + pos, sizeof names - pos, "%s%s", i ? ", " : "",
                                    w->m->params[w->buckets[k].params[i]]->name);
        ddp__log(DDP_LOG_INFO, "  bucket %d: %zu bytes: %s", k, w->buckets[k].count * sizeof(float), names);
    }
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>zero: sharding the training state: ZeRO-1, ZeRO-2, ZeRO-3                       (chapter 11)  */
/* ============================================================================================== */
#if DDP__DECLARE
/* zero_stage 3 (collective): on = 1 gathers every layer's weights onto every rank, so that p->data
   holds the whole model until on = 0 gives the memory back (PyTorch's summon_full_params): to read
   the weights, compare them or save them. Nothing to do for the other stages, whose ranks hold all
   the weights anyway. The group's errors. */
DDP_API ddp_status ddp_full_params(ddp_wrapper* w, int on);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/*
   ZeRO (Rajbhandari et al., 2020) gives each part of the training state one owner. Parameters are
   laid end to end in groups; a group of `count` numbers is cut into W shards of S = count / W
   (rounded up), and rank r owns shard r of every group: its numbers [r S, (r+1) S). The last
   shard's tail past `count` is padding that holds nothing. A parameter may straddle shards; each
   rank owns a contiguous part of it, [first, first + len), possibly empty.

     stage 1  one group: the whole model in registration order. Each rank keeps the optimizer's
              state for its shard only; backward is DDP's (every rank ends it with all the averaged
              gradients); each rank updates its shard and all-gathers everyone's new weights.
     stage 2  a group per Linear layer (its weight, then its bias). A layer's gradients live only
              during backward, in a buffer of W S numbers; once both are final they are averaged
              with a reduce-scatter, which leaves each rank the S averaged numbers of its shard,
              and the buffer goes back. The update is stage 1's, with the shard's gradients.
     stage 3  stage 2, and the weights are sharded too: between uses each rank holds only its S
              weights of each layer. Just before a layer's forward, and again before its backward,
              an all-gather puts the whole layer together; right after, it is dropped. The update
              changes the shard in place, and nothing is gathered after it.

   Bytes each rank sends per step, for N parameters in f32 and W ranks (the ring's (W-1)/W x 4N
   being one "unit"): DDP's all-reduce 2 units; stage 1 3 units (the all-reduce, then the weights'
   all-gather); stage 2 2 units (a reduce-scatter and an all-gather); stage 3 3 units (the weights
   gathered for forward and for backward, and the reduce-scatter), less the last layer's gather
   for backward, which stays from forward.
*/

/* The buffers a gathered layer's weights, or its gradients during backward, go into (stages 2
   and 3). Layers come one after another, and at most two neighbours are held at once (a layer's
   gradients while the one before is on the wire; with prefetch, a layer's weights while the next
   one's arrive), so two buffers serve them all: even layers use one, odd layers the other, each
   the size of its largest layer. Without prefetch one buffer, the size of the largest layer,
   serves every layer's weights. A layer that finds its buffer taken (under no_sync, where every
   layer keeps its gradients until the synchronised pass) gets one of its own for that time. */
typedef struct ddp__pool {
    float* slot[2];
    size_t floats[2]; /* each slot's size */
    int busy[2];
    int nslots;       /* 1 or 2 */
    size_t bytes;     /* held: the slots allocated so far, and the buffers of its own a layer holds */
} ddp__pool;
/* Defined in >>buffers: a buffer for n floats in slot k (-1: one of its own); giving it back;
   freeing the pool. */
DDP__PRIVATE ddp_status ddp__pool_get(ddp_model* m, ddp__pool* p, int k, size_t n, float** out);
DDP__PRIVATE void ddp__pool_put(ddp_model* m, ddp__pool* p, float* buf, size_t n);
DDP__PRIVATE void ddp__pool_free(ddp_model* m, ddp__pool* p);

struct ddp__shards {
    ddp_pg* pg;
    ddp_model* m;
    int stage, W, rank, prefetch;
    int ngroups;
    int* members;       /* the groups' parameters, group after group, each in its layout order */
    int* member_start;  /* group g: members[member_start[g] .. member_start[g + 1]) */
    size_t *count, *shard;               /* per group */
    int* group_of;                       /* per parameter */
    size_t *offset, *first, *len;        /* per parameter: where it starts in its group; its owned part */
    int* group_of_unit;                  /* stages 2-3: a unit's group; -1 for a unit without tensors */
    int root;                            /* stages 2-3: unit 0 has tensors, and group 0 is theirs */
    unsigned char* ended;                /* stage 3, per group: its forward ended, its weights still
                                            held (dropped when another unit begins) */
    float** ptrs;                        /* per parameter: scratch for ddp__zero_io's base pointers */
    float *send, *recv;                  /* pieces of the weights' all-gather (stages 1-2), and of
                                            ddp_optim_consolidate's */
    float** gshard;                      /* stages 2-3: per group, this rank's S averaged gradients */
    float** gfull;                       /* stages 2-3: per group, its W S gradients during backward */
    ddp_work** gwork;                    /* ... their reduce-scatter in flight */
    int* gpending;                       /* ... parameters whose gradient is not final yet */
    int inflight[DDP_MAX_PARAMS], nin;   /* groups whose reduce-scatter is in flight, oldest first */
    float** wshard;                      /* stage 3: per group, this rank's S weights */
    float** wfull;                       /* stage 3: per group, all W S weights while gathered */
    ddp_work** wwork;                    /* ... their all-gather in flight (a prefetch) */
    int full_on;                         /* ddp_full_params(w, 1) in force: nothing is dropped */
    int full_stale;                      /* ... and an optimizer step has changed the shards since */
    ddp__pool wpool, gpool;
    long reduce_scatters, all_gathers;
    uint64_t bytes_scattered, bytes_gathered;
    size_t param_peak;                   /* stage 3: the most weight bytes held at once */
    size_t param_now;
};

/* Pieces of a shard are gathered this many numbers at a time (stages 1 and 2), so that the
   all-gather's buffers stay small ((W + 1) pieces) whatever the model's size. A variable so that
   a test can make it tiny. */
DDP__PRIVATE size_t ddp__zero_piece = (size_t)1 << 18;

/* Copy n numbers of group g, from its number `at` on, between buf and the parameters' arrays:
   number e of parameter i is base[i][e - from[i]] (from NULL: base[i][e]). into = 1: from buf
   into the arrays. The range must lie inside the group's `count` numbers. */
DDP__PRIVATE ddp_status ddp__zero_io(const ddp__shards* z, int g, size_t at, float* buf, size_t n, float* const* base,
                                     const size_t* from, int into) {
    ddp_model* m = z->m;
    int k;
    for (k = z->member_start[g]; k < z->member_start[g + 1] && n > 0; k++) {
        int i = z->members[k];
        size_t begin = z->offset[i], end = begin + m->params[i]->count;
        if (at >= begin && at < end) {
            size_t e = at - begin, c = end - at < n ? end - at : n;
            float* arr = base[i] + (e - (from ? from[i] : 0));
            if (into) DDP__TRY(ddp_copy(m->device, arr, m->device, buf, c * sizeof(float), m->stream));
            else DDP__TRY(ddp_copy(m->device, buf, m->device, arr, c * sizeof(float), m->stream));
            buf += c, at += c, n -= c;
        }
    }
    return DDP_OK;
}
DDP__PRIVATE float* const* ddp__zero_data_ptrs(const ddp__shards* z) {
    int i;
    for (i = 0; i < z->m->nparams; i++) z->ptrs[i] = z->m->params[i]->data;
    return z->ptrs;
}

/* Where the owned part of parameter i's weights, and of its averaged gradient, lives: inside the
   parameter (stages 1-2; the gradient at stage 1), or in the group's shard (stage 3; the gradient
   at stages 2-3). Only for a parameter this rank owns some of (len > 0). */
DDP__PRIVATE float* ddp__zero_at(const ddp__shards* z, float* const* shards, int i) {
    int g = z->group_of[i];
    return shards[g] + (z->offset[i] + z->first[i] - (size_t)z->rank * z->shard[g]);
}
DDP__PRIVATE float* ddp__zero_w(const ddp__shards* z, int i) {
    return z->stage == 3 ? ddp__zero_at(z, z->wshard, i) : z->m->params[i]->data + z->first[i];
}
DDP__PRIVATE float* ddp__zero_g(const ddp__shards* z, int i) {
    return z->stage >= 2 ? ddp__zero_at(z, z->gshard, i) : z->m->params[i]->grad + z->first[i];
}

/* Stages 1-2, after the update of this rank's shard: every rank's shard of every group to every
   rank, a piece at a time. */
DDP__PRIVATE ddp_status ddp__zero_gather_weights(ddp__shards* z) {
    int g, q;
    for (g = 0; g < z->ngroups; g++) {
        const size_t S = z->shard[g], n = z->count[g], piece = S < ddp__zero_piece ? S : ddp__zero_piece;
        size_t j;
        for (j = 0; j < S; j += piece) {
            size_t k = S - j < piece ? S - j : piece, from = (size_t)z->rank * S + j;
            if (from < n)
                DDP__TRY(ddp__zero_io(z, g, from, z->send, n - from < k ? n - from : k, ddp__zero_data_ptrs(z), NULL,
                                      0));
            DDP__TRY(ddp_all_gather(z->pg, z->send, z->recv, k, DDP_F32, NULL));
            z->all_gathers++, z->bytes_gathered += k * sizeof(float);
            for (q = 0; q < z->W; q++) {
                size_t at = (size_t)q * S + j;
                if (at < n) DDP__TRY(ddp__zero_io(z, g, at, z->recv + (size_t)q * k, n - at < k ? n - at : k,
                                                  ddp__zero_data_ptrs(z), NULL, 1));
            }
        }
    }
    return DDP_OK;
}

/* The pool slot group g's buffers take: one of its own for unit 0's group, which is held through
   the whole forward or backward; otherwise by the parity of its place among the other groups (the
   only slot, when the pool has one). */
DDP__PRIVATE int ddp__zero_slot(const ddp__shards* z, const ddp__pool* p, int g) {
    if (z->root && g == 0) return -1;
    return p->nslots == 2 ? (g - z->root) % 2 : 0;
}

/* ---- stage 3: a unit's weights, gathered for use and dropped after ------------------------------- */

/* Point the group's parameters at their places in buf (NULL: nowhere). */
DDP__PRIVATE void ddp__zero_point(ddp__shards* z, int g, float* buf, int grads) {
    int k;
    for (k = z->member_start[g]; k < z->member_start[g + 1]; k++) {
        ddp_param* p = z->m->params[z->members[k]];
        float* at = buf ? buf + z->offset[p->index] : NULL;
        if (grads) p->grad = at;
        else p->data = at;
    }
}

/* Start gathering group g's weights (wait = 0: a prefetch, waited for later), or make sure they
   are all here (wait = 1), and point its parameters at them. */
DDP__PRIVATE ddp_status ddp__zero_gather(ddp__shards* z, int g, int wait) {
    if (g < 0 || g >= z->ngroups) return DDP_OK;
    if (!z->wfull[g]) {
        DDP__TRY(ddp__pool_get(z->m, &z->wpool, ddp__zero_slot(z, &z->wpool, g), (size_t)z->W * z->shard[g],
                               &z->wfull[g]));
        DDP__TRY(ddp_all_gather(z->pg, z->wshard[g], z->wfull[g], z->shard[g], DDP_F32, wait ? NULL : &z->wwork[g]));
        z->all_gathers++, z->bytes_gathered += z->shard[g] * sizeof(float);
        z->param_now += (size_t)z->W * z->shard[g] * sizeof(float);
        if (z->param_now > z->param_peak) z->param_peak = z->param_now;
    }
    if (wait && z->wwork[g]) {
        ddp_status s = ddp_work_wait(z->wwork[g]);
        z->wwork[g] = NULL;
        DDP__TRY(s);
    }
    if (wait) ddp__zero_point(z, g, z->wfull[g], 0);
    return DDP_OK;
}

/* Give group g's gathered weights back (unless ddp_full_params holds them). */
DDP__PRIVATE ddp_status ddp__zero_drop(ddp__shards* z, int g) {
    ddp_status s = DDP_OK;
    if (g < 0 || z->full_on || !z->wfull[g]) return DDP_OK;
    z->ended[g] = 0;
    if (z->wwork[g]) s = ddp_work_wait(z->wwork[g]), z->wwork[g] = NULL;
    ddp__zero_point(z, g, NULL, 0);
    ddp__pool_put(z->m, &z->wpool, z->wfull[g], (size_t)z->W * z->shard[g]);
    z->wfull[g] = NULL;
    z->param_now -= (size_t)z->W * z->shard[g] * sizeof(float);
    return s;
}

/* ---- stages 2-3: a layer's gradients, reduce-scattered and dropped ------------------------------- */

/* Wait for the oldest reduce-scatter in flight and give its buffer back. */
DDP__PRIVATE ddp_status ddp__zero_retire(ddp__shards* z) {
    int g = z->inflight[0], k;
    ddp_status s = ddp_work_wait(z->gwork[g]);
    z->gwork[g] = NULL;
    for (k = 1; k < z->nin; k++) z->inflight[k - 1] = z->inflight[k];
    z->nin--;
    ddp__zero_point(z, g, NULL, 1);
    ddp__pool_put(z->m, &z->gpool, z->gfull[g], (size_t)z->W * z->shard[g]);
    z->gfull[g] = NULL;
    return s;
}

/* Before a layer's backward: a zeroed buffer for its gradients, unless one holds what earlier
   backward passes under no_sync accumulated. At most two reduce-scatters stay in flight, so that
   the gradients held stay a few layers' worth. */
DDP__PRIVATE ddp_status ddp__zero_grads_here(ddp__shards* z, int g) {
    if (!z->gfull[g]) {
        while (z->nin >= 2) DDP__TRY(ddp__zero_retire(z));
        DDP__TRY(ddp__pool_get(z->m, &z->gpool, ddp__zero_slot(z, &z->gpool, g), (size_t)z->W * z->shard[g],
                               &z->gfull[g]));
        DDP__TRY(ddp__zero(z->m->device, z->gfull[g], (size_t)z->W * z->shard[g] * sizeof(float), z->m->stream));
        ddp__zero_point(z, g, z->gfull[g], 1);
    }
    z->gpending[g] = z->member_start[g + 1] - z->member_start[g];
    return DDP_OK;
}

/* The end of backward, for a layer backward never reached (a hand-written backward): its buffer. */
DDP__PRIVATE ddp_status ddp__zero_grads_ensure(ddp__shards* z, int g) {
    return z->gfull[g] ? DDP_OK : ddp__zero_grads_here(z, g);
}

/* A parameter's gradient is final (the reducer's hook, synchronised passes only): scale it by
   `scale`; when its layer's are all in, reduce-scatter them. */
DDP__PRIVATE ddp_status ddp__zero_grad_ready(ddp__shards* z, ddp_param* p, float scale) {
    int g = z->group_of[p->index];
    DDP__TRY(ddp__scale(z->m, p->grad, p->grad, p->count, scale));
    if (--z->gpending[g] > 0) return DDP_OK;
    DDP__TRY(ddp_reduce_scatter(z->pg, z->gfull[g], z->gshard[g], z->shard[g], DDP_F32, DDP_SUM, &z->gwork[g]));
    z->reduce_scatters++, z->bytes_scattered += (size_t)z->W * z->shard[g] * sizeof(float);
    z->inflight[z->nin++] = g;
    ddp__log(DDP_LOG_DETAIL, "zero: layer group %d's gradients final: reduce-scatter launched", g);
    return DDP_OK;
}

/* The end of a synchronised backward: every reduce-scatter done, every gradient buffer back. */
DDP__PRIVATE ddp_status ddp__zero_grads_done(ddp__shards* z) {
    ddp_status s = DDP_OK, t;
    while (z->nin > 0)
        if ((t = ddp__zero_retire(z)) != DDP_OK && s == DDP_OK) s = t;
    return s;
}

/* Drop every gathered group but `keep` (-1: all); only those whose forward ended when `ended`. */
DDP__PRIVATE ddp_status ddp__zero_drop_others(ddp__shards* z, int keep, int ended) {
    int g;
    for (g = 0; g < z->ngroups; g++)
        if (g != keep && (!ended || z->ended[g])) DDP__TRY(ddp__zero_drop(z, g));
    return DDP_OK;
}

/* The group of the next unit with tensors after `unit`, going up (dir 1, forward's order) or down
   (dir -1, backward's; unit 0 is never next there, it is held throughout); -1 if none. */
DDP__PRIVATE int ddp__zero_next(const ddp__shards* z, int unit, int dir) {
    int u;
    for (u = unit + dir; u >= 1 && u < z->m->nunits; u += dir)
        if (z->group_of_unit[u] >= 0) return z->group_of_unit[u];
    return -1;
}

/* m->unit_fn for stages 2 and 3, at each bracket of a unit (ddp_unit_begin, ddp_unit_end). Unit 0,
   the whole model, is gathered when a forward begins and held until the backward ends. Another
   unit's weights are gathered when its forward begins and stay when it ends, until another unit
   begins: the last unit's backward, next, finds them still there. */
DDP__PRIVATE ddp_status ddp__zero_unit(ddp_model* m, void* user, int event, int unit) {
    ddp__shards* z = (ddp__shards*)user;
    int g = z->group_of_unit[unit];
    switch (event) {
    case DDP__UNIT_FORWARD:
        if (z->stage < 3) return DDP_OK;
        if (unit == 0 && z->full_on && z->full_stale)
            return ddp__fail(DDP_ERR_STATE, "a forward%s while ddp_full_params(w, 1) is in force, after an optimizer "
                             "step: the gathered weights are the ones from before that step (the step updates each "
                             "rank's shard), so this forward would train on stale weights. Call ddp_full_params(w, 0) "
                             "once the weights are read or saved, before training on", ddp__model_where(m));
        DDP__TRY(ddp__zero_drop_others(z, g, unit != 0)); /* a new forward starts from fresh weights */
        DDP__TRY(ddp__zero_gather(z, g, 1));
        return z->prefetch ? ddp__zero_gather(z, ddp__zero_next(z, unit, 1), 0) : DDP_OK;
    case DDP__UNIT_FORWARD_DONE:
        if (z->stage == 3 && unit != 0 && g >= 0) z->ended[g] = 1;
        return DDP_OK;
    case DDP__UNIT_BACKWARD:
        if (z->stage == 3) { /* unit 0 keeps the last unit, gathered in forward, for its backward next */
            if (unit != 0) DDP__TRY(ddp__zero_drop_others(z, g, 1));
            DDP__TRY(ddp__zero_gather(z, g, 1));
            if (g >= 0) z->ended[g] = 0;
            if (z->prefetch) DDP__TRY(ddp__zero_gather(z, ddp__zero_next(z, unit ? unit : m->nunits, -1), 0));
        }
        return g >= 0 ? ddp__zero_grads_here(z, g) : DDP_OK;
    case DDP__UNIT_BACKWARD_DONE:
        if (z->stage < 3) return DDP_OK;
        return unit == 0 ? ddp__zero_drop_others(z, -1, 0) : ddp__zero_drop(z, g);
    }
    return DDP_OK;
}

/* ---- making and unmaking the shards -------------------------------------------------------------- */

DDP__PRIVATE void ddp__zero_free(ddp__shards* z) {
    int g;
    if (!z) return;
    for (g = 0; g < z->ngroups; g++) {
        if (z->gshard) ddp_free(z->m->device, z->gshard[g]);
        if (z->wshard) ddp_free(z->m->device, z->wshard[g]);
    }
    ddp__pool_free(z->m, &z->wpool);
    ddp__pool_free(z->m, &z->gpool);
    ddp_free(z->m->device, z->send);
    ddp_free(z->m->device, z->recv);
    if (z->members) DDP_FREE(z->members);
    if (z->member_start) DDP_FREE(z->member_start);
    if (z->count) DDP_FREE(z->count);
    if (z->shard) DDP_FREE(z->shard);
    if (z->group_of) DDP_FREE(z->group_of);
    if (z->offset) DDP_FREE(z->offset);
    if (z->first) DDP_FREE(z->first);
    if (z->len) DDP_FREE(z->len);
    if (z->group_of_unit) DDP_FREE(z->group_of_unit);
    if (z->ended) DDP_FREE(z->ended);
    if (z->ptrs) DDP_FREE(z->ptrs);
    if (z->gshard) DDP_FREE(z->gshard);
    if (z->gfull) DDP_FREE(z->gfull);
    if (z->gwork) DDP_FREE(z->gwork);
    if (z->gpending) DDP_FREE(z->gpending);
    if (z->wshard) DDP_FREE(z->wshard);
    if (z->wfull) DDP_FREE(z->wfull);
    if (z->wwork) DDP_FREE(z->wwork);
    DDP_FREE(z);
}

/* Lay out the groups of `stage` for model m on group pg, and (stages 2-3) move the gradients, and
   (stage 3) the weights, into shards: the model's own arrays are freed. Every rank holds rank 0's
   weights when this is called. */
DDP__PRIVATE ddp_status ddp__zero_create(ddp_pg* pg, ddp_model* m, int stage, int prefetch, ddp__shards** out) {
    ddp__shards* z = (ddp__shards*)ddp__calloc(sizeof *z);
    size_t np = (size_t)m->nparams + 1, most = 0;
    int i, g, k = 0;
    ddp_status s = DDP_OK;
    *out = NULL;
    if (!z) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the shards' layout failed");
    z->pg = pg, z->m = m, z->stage = stage, z->prefetch = prefetch;
    z->W = ddp_world_size(pg), z->rank = ddp_rank(pg);
    z->members = (int*)ddp__calloc(np * sizeof(int));
    z->member_start = (int*)ddp__calloc(np * sizeof(int));
    z->count = (size_t*)ddp__calloc(np * sizeof(size_t));
    z->shard = (size_t*)ddp__calloc(np * sizeof(size_t));
    z->group_of = (int*)ddp__calloc(np * sizeof(int));
    z->offset = (size_t*)ddp__calloc(np * sizeof(size_t));
    z->first = (size_t*)ddp__calloc(np * sizeof(size_t));
    z->len = (size_t*)ddp__calloc(np * sizeof(size_t));
    z->group_of_unit = (int*)ddp__calloc(((size_t)m->nunits + 1) * sizeof(int));
    z->ended = (unsigned char*)ddp__calloc(np);
    z->ptrs = (float**)ddp__calloc(np * sizeof(float*));
    if (!z->members || !z->member_start || !z->count || !z->shard || !z->group_of || !z->offset || !z->first ||
        !z->len || !z->group_of_unit || !z->ended || !z->ptrs) {
        ddp__zero_free(z);
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the shards' layout failed");
    }
    /* the groups: stage 1 the whole model; stages 2-3 a unit each, its tensors in the order they
       were added (ddp_model_mlp: a Linear layer's weight, then its bias) */
    for (i = 0; i < m->nunits; i++) z->group_of_unit[i] = -1;
    if (stage == 1) {
        z->ngroups = 1;
        for (i = 0; i < m->nparams; i++) z->members[k++] = i;
    } else {
        int u;
        for (u = 0; u < m->nunits; u++) {
            int start = k;
            for (i = 0; i < m->nparams; i++)
                if (m->params[i]->unit == u) z->members[k++] = i;
            if (k == start) continue;
            z->group_of_unit[u] = z->ngroups;
            z->member_start[z->ngroups++] = start;
        }
        z->root = z->group_of_unit[0] == 0;
    }
    z->member_start[z->ngroups] = k;
    for (g = 0; g < z->ngroups; g++) {
        size_t lo, hi;
        for (k = z->member_start[g]; k < z->member_start[g + 1]; k++) {
            i = z->members[k];
            z->group_of[i] = g;
            z->offset[i] = z->count[g];
            z->count[g] += m->params[i]->count;
        }
        z->shard[g] = (z->count[g] + (size_t)z->W - 1) / (size_t)z->W;
        if (z->shard[g] > most) most = z->shard[g];
        lo = (size_t)z->rank * z->shard[g], hi = lo + z->shard[g] < z->count[g] ? lo + z->shard[g] : z->count[g];
        for (k = z->member_start[g]; k < z->member_start[g + 1]; k++) { /* each parameter's part in [lo, hi) */
            size_t a, b;
            i = z->members[k];
            a = lo > z->offset[i] ? lo : z->offset[i];
            b = hi < z->offset[i] + m->params[i]->count ? hi : z->offset[i] + m->params[i]->count;
            z->first[i] = b > a ? a - z->offset[i] : 0;
            z->len[i] = b > a ? b - a : 0;
        }
    }
    /* the pools' slots: gradients by the parity of the unit; weights likewise with prefetch */
    z->gpool.nslots = 2, z->wpool.nslots = prefetch ? 2 : 1;
    for (g = z->root; g < z->ngroups; g++) {
        size_t n = (size_t)z->W * z->shard[g];
        int gk = ddp__zero_slot(z, &z->gpool, g), wk = ddp__zero_slot(z, &z->wpool, g);
        if (n > z->gpool.floats[gk]) z->gpool.floats[gk] = n;
        if (n > z->wpool.floats[wk]) z->wpool.floats[wk] = n;
    }
    { /* the weights' all-gather after each step (stages 1-2) and ddp_optim_consolidate, in pieces */
        size_t piece = most < ddp__zero_piece ? most : ddp__zero_piece;
        s = ddp_alloc(m->device, piece * sizeof(float), (void**)&z->send);
        if (s == DDP_OK) s = ddp_alloc(m->device, piece * (size_t)z->W * sizeof(float), (void**)&z->recv);
    }
    if (s == DDP_OK && stage >= 2) {
        z->gshard = (float**)ddp__calloc((size_t)z->ngroups * sizeof(float*) + 1);
        z->gfull = (float**)ddp__calloc((size_t)z->ngroups * sizeof(float*) + 1);
        z->gwork = (ddp_work**)ddp__calloc((size_t)z->ngroups * sizeof(ddp_work*) + 1);
        z->gpending = (int*)ddp__calloc((size_t)z->ngroups * sizeof(int) + 1);
        if (!z->gshard || !z->gfull || !z->gwork || !z->gpending)
            s = ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the gradients' shards failed");
        for (g = 0; g < z->ngroups && s == DDP_OK; g++) {
            s = ddp_alloc(m->device, z->shard[g] * sizeof(float), (void**)&z->gshard[g]);
            if (s == DDP_OK) s = ddp__zero(m->device, z->gshard[g], z->shard[g] * sizeof(float), m->stream);
        }
    }
    if (s == DDP_OK && stage == 3) {
        z->wshard = (float**)ddp__calloc((size_t)z->ngroups * sizeof(float*) + 1);
        z->wfull = (float**)ddp__calloc((size_t)z->ngroups * sizeof(float*) + 1);
        z->wwork = (ddp_work**)ddp__calloc((size_t)z->ngroups * sizeof(ddp_work*) + 1);
        if (!z->wshard || !z->wfull || !z->wwork)
            s = ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the weights' shards failed");
        for (g = 0; g < z->ngroups && s == DDP_OK; g++) { /* this rank's weights of the layer, padding zeroed */
            size_t lo = (size_t)z->rank * z->shard[g], have = lo < z->count[g] ? z->count[g] - lo : 0;
            if (have > z->shard[g]) have = z->shard[g];
            s = ddp_alloc(m->device, z->shard[g] * sizeof(float), (void**)&z->wshard[g]);
            if (s == DDP_OK) s = ddp__zero(m->device, z->wshard[g], z->shard[g] * sizeof(float), m->stream);
            if (s == DDP_OK && have) s = ddp__zero_io(z, g, lo, z->wshard[g], have, ddp__zero_data_ptrs(z), NULL, 0);
        }
    }
    if (s == DDP_OK) s = ddp_stream_sync(m->stream);
    if (s != DDP_OK) {
        ddp__zero_free(z);
        return s;
    }
    /* From here the model's own arrays are gone: gradients exist only during backward (stages
       2-3), weights only while gathered (stage 3). Arrays the caller lent (ddp_tensor_desc.data,
       .grad) are the caller's to keep: they are left alone, and filled again by ddp__zero_destroy. */
    for (i = 0; i < m->nparams && stage >= 2; i++) {
        if (!m->params[i]->home_grad) ddp_free(m->device, m->params[i]->grad);
        m->params[i]->grad = NULL;
        if (stage == 3) {
            if (!m->params[i]->home_data) ddp_free(m->device, m->params[i]->data);
            m->params[i]->data = NULL;
        }
    }
    if (stage >= 2) m->unit_fn = ddp__zero_unit, m->unit_user = z;
    *out = z;
    return DDP_OK;
}

/* Undo ddp__zero_create: the model gets arrays of its own back, with every weight (collective at
   stage 3, which gathers them) and zero gradients. */
DDP__PRIVATE ddp_status ddp__zero_destroy(ddp__shards* z) {
    ddp_model* m;
    ddp_status s = DDP_OK, t;
    int g, i;
    if (!z) return DDP_OK;
    m = z->m;
    if (z->stage >= 2) s = ddp__zero_grads_done(z);
    for (g = 0; z->gfull && g < z->ngroups; g++) /* no_sync leftovers */
        if (z->gfull[g])
            ddp__zero_point(z, g, NULL, 1), ddp__pool_put(m, &z->gpool, z->gfull[g], (size_t)z->W * z->shard[g]),
                z->gfull[g] = NULL;
    if (z->stage == 3) {
        z->full_on = 0;
        for (g = 0; g < z->ngroups; g++)
            if ((t = ddp__zero_drop(z, g)) != DDP_OK && s == DDP_OK) s = t;
    }
    for (i = 0; i < m->nparams && z->stage >= 2; i++) {
        ddp_param* p = m->params[i];
        t = p->home_grad ? (p->grad = p->home_grad, DDP_OK) : ddp_alloc(m->device, p->count * sizeof(float), (void**)&p->grad);
        if (t == DDP_OK) t = ddp__zero(m->device, p->grad, p->count * sizeof(float), m->stream);
        if (t == DDP_OK && z->stage == 3)
            t = p->home_data ? (p->data = p->home_data, DDP_OK)
                             : ddp_alloc(m->device, p->count * sizeof(float), (void**)&p->data);
        if (t != DDP_OK && s == DDP_OK) s = t;
    }
    for (g = 0; g < z->ngroups && z->stage == 3 && s == DDP_OK; g++) { /* every weight, back in place */
        float* buf;
        s = ddp__pool_get(m, &z->wpool, ddp__zero_slot(z, &z->wpool, g), (size_t)z->W * z->shard[g], &buf);
        if (s == DDP_OK) s = ddp_all_gather(z->pg, z->wshard[g], buf, z->shard[g], DDP_F32, NULL);
        if (s == DDP_OK) s = ddp__zero_io(z, g, 0, buf, z->count[g], ddp__zero_data_ptrs(z), NULL, 1);
        if (s == DDP_OK) s = ddp_stream_sync(m->stream);
        ddp__pool_put(m, &z->wpool, buf, (size_t)z->W * z->shard[g]);
    }
    if (m->unit_user == z) m->unit_fn = NULL, m->unit_user = NULL;
    if (m->zero == z) m->zero = NULL;
    ddp_stream_sync(m->stream);
    ddp__zero_free(z);
    return s;
}

DDP__PRIVATE int ddp__zero_stage(const ddp__shards* z) { return z ? z->stage : 0; }
DDP__PRIVATE int ddp__zero_group_of(const ddp__shards* z, int param) { return z->group_of[param]; }

/* What the shards hold and what moved, into the wrapper's counters. */
DDP__PRIVATE void ddp__zero_stats(const ddp__shards* z, ddp_wrap_stats* st) {
    size_t shards = 0;
    int g;
    for (g = 0; g < z->ngroups; g++) shards += z->shard[g] * sizeof(float);
    if (z->stage == 3) st->param_bytes = shards + z->wpool.bytes, st->param_peak_bytes = shards + z->param_peak;
    if (z->stage >= 2) st->grad_bytes = shards + z->gpool.bytes;
    st->reduce_scatters = z->reduce_scatters, st->all_gathers = z->all_gathers;
    st->bytes_gathered = z->bytes_gathered;
    if (z->stage >= 2) st->bytes_reduced = z->bytes_scattered;
}

DDP__DEF ddp_status ddp_full_params(ddp_wrapper* w, int on) {
    ddp__shards* z = w->z;
    int g;
    if (!z || z->stage < 3) return DDP_OK;
    z->full_on = z->full_stale = 0;
    for (g = 0; g < z->ngroups; g++) DDP__TRY(on ? ddp__zero_gather(z, g, 1) : ddp__zero_drop(z, g));
    z->full_on = on;
    return ddp_stream_sync(w->m->stream);
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>ring: the ring all-reduce, one rule for every step                         (chapters 2, 10)  */
/* ============================================================================================== */
#if DDP__IMPLEMENT
#include <sys/socket.h> /* send flags, struct msghdr */
#ifdef MSG_NOSIGNAL
#define DDP__SEND_FLAGS MSG_NOSIGNAL /* Linux: a write to a dead peer is an error, not SIGPIPE */
#else
#define DDP__SEND_FLAGS 0
#endif

/* Defined further down, in the section named, and called here: */
DDP__PRIVATE void ddp__reduce(void* dst, const void* src, size_t n, ddp_dtype t,
                              ddp_reduce_op op); /* >>sums */
DDP__PRIVATE void ddp__divide(void* buf, size_t n, ddp_dtype t, int world); /* >>sums */
DDP__PRIVATE int ddp__ms_left(double deadline); /* >>store */
DDP__PRIVATE int ddp__poll_yielding(struct pollfd* pf, int n, int yield, double deadline); /* >>store */
DDP__PRIVATE void ddp__put_le64(unsigned char* p, uint64_t v); /* >>store */
DDP__PRIVATE uint64_t ddp__le64(const unsigned char* p); /* >>store */
DDP__PRIVATE int ddp__send_all(int fd, const void* buf, size_t n, double deadline); /* >>store */
DDP__PRIVATE int ddp__recv_all(int fd, void* buf, size_t n, double deadline); /* >>store */

/* ---- the ring (>>ring) ---------------------------------------------------------------------------- */
/*
   The buffer is cut into `world` segments; segment s starts at seg_start(s) (the first count %
   world segments hold one element more). Rank r sends to rank r+1 and receives from rank r-1.
   One rule gives every step of both phases:

       at step t, send segment (r - t + shift) mod W and receive segment (r - t - 1 + shift) mod W

   Steps 0 .. W-2 are the reduce-scatter: the received segment is ADDED into ours, so after
   W-1 steps rank r holds the full sum of segment (r + 1 + shift). Steps W-1 .. 2W-3 are the
   all-gather: the received segment is COPIED over ours, passing every finished segment once
   round the ring. What we send at step t is exactly what we received at step t-1, so each rank
   sends 2(W-1) segments: 2(W-1)/W of the buffer, whatever the number of ranks (the relay that
   sends the whole buffer W-1 times moves W/2 times more).

   all-reduce runs steps 0 .. 2W-3 with shift 0; reduce-scatter runs 0 .. W-2 with shift -1 (so
   rank r ends owning segment r); all-gather runs W-1 .. 2W-3 with shift -1 (rank r starts
   owning segment r).

   Pipelining: each segment travels in pieces of at most `piece` elements, and piece j of step t
   may leave as soon as piece j of step t-1 has arrived and been reduced. One thread drives both
   sockets with poll(): it sends while the kernel receives, and reduces while the kernel sends.
*/

DDP__PRIVATE size_t ddp__seg_start(size_t count, int world, int s) {
    size_t base = count / (size_t)world, extra = count % (size_t)world;
    return (size_t)s * base + ((size_t)s < extra ? (size_t)s : extra);
}
DDP__PRIVATE int ddp__mod(int a, int w) { return ((a % w) + w) % w; }

/* The rule: the segments rank r sends and receives at step t. */
DDP__PRIVATE int ddp__ring_send_seg(int r, int t, int shift, int W) { return ddp__mod(r - t + shift, W); }
DDP__PRIVATE int ddp__ring_recv_seg(int r, int t, int shift, int W) { return ddp__mod(r - t - 1 + shift, W); }

typedef struct ddp__ring_cursor {
    int t;        /* step */
    size_t off;   /* elements of this step's segment already done */
    size_t done;  /* pieces received over all steps (the receive side's count) */
} ddp__ring_cursor;

/* Pieces in step t's segment. */
DDP__PRIVATE size_t ddp__pieces(size_t seglen, size_t piece) { return (seglen + piece - 1) / piece; }

/* DDP_DEBUG=DETAIL's line for one step: "send segment ..." when `did` is NULL, else "received
   segment ... and <did> it". */
DDP__PRIVATE void ddp__ring_say(const ddp_pg* pg, const ddp_work* w, int t, int seg, size_t from, size_t to,
                                int peer, const char* did) {
    const int W = pg->world;
    const char* phase = t < W - 1 ? "reduce-scatter" : "all-gather";
    if (!did)
        ddp__log(DDP_LOG_DETAIL, "%s #%llu step %d/%d (%s): send segment %d [%zu, %zu) to rank %d",
                 ddp__coll_name(w->kind), (unsigned long long)w->seq, t + 1, 2 * W - 2, phase, seg, from, to,
                 peer);
    else
        ddp__log(DDP_LOG_DETAIL, "%s #%llu step %d/%d (%s): received segment %d [%zu, %zu) from rank %d and %s it",
                 ddp__coll_name(w->kind), (unsigned long long)w->seq, t + 1, 2 * W - 2, phase, seg, from, to,
                 peer, did);
}

/* The error when rank `left` sent nothing before the deadline, at step t. */
DDP__PRIVATE ddp_status ddp__ring_timed_out(const ddp_pg* pg, const ddp_work* w, int t, int left) {
    return ddp__fail(DDP_ERR_TIMEOUT,
                     "%s #%llu (%zu x %s) timed out after %.0f s at step %d waiting for rank %d "
                     "(it sends to this rank): that rank is stuck, stopped, or calling a different "
                     "collective (every rank must issue the same collectives in the same order)",
                     ddp__coll_name(w->kind), (unsigned long long)w->seq, w->count, ddp__dtype_name(w->dtype),
                     pg->timeout, t + 1, left);
}

/* The error when the connection to `peer` broke: while sending to it (t < 0), or while receiving
   from it at step t. */
DDP__PRIVATE ddp_status ddp__ring_lost(const ddp_work* w, int peer, int t, const char* why) {
    if (t < 0)
        return ddp__fail(DDP_ERR_PEER_LOST, "%s #%llu: sending to rank %d failed (%s): that rank has probably "
                         "died; look at its output", ddp__coll_name(w->kind), (unsigned long long)w->seq, peer, why);
    return ddp__fail(DDP_ERR_PEER_LOST, "%s #%llu: rank %d closed its connection at step %d (%s): that rank has "
                     "probably died; look at its output", ddp__coll_name(w->kind), (unsigned long long)w->seq,
                     peer, t + 1, why);
}

/* The ring engine. Runs steps [t0, t1) of the rule above on buf (count elements of dtype) with
   the given shift; reduce-scatter steps combine with `op` (dividing the owned segment by the world
   size at the last such step for an average). Returns DDP_OK or a failure naming the peer. */
DDP__PRIVATE ddp_status ddp__ring(ddp_pg* pg, ddp_work* w, unsigned char* buf, size_t count, int t0, int t1,
                                  int shift) {
    const int W = pg->world, r = pg->rank, left = ddp__mod(r - 1, W), right = ddp__mod(r + 1, W);
    const size_t es = ddp_dtype_size(w->dtype), piece = pg->piece_elems;
    const int detail = ddp__log_level_enabled() >= DDP_LOG_DETAIL;
    ddp__ring_cursor snd, rcv;
    size_t snd_sent = 0, rcv_got = 0; /* bytes of the current piece */
    size_t *prefix;                   /* prefix[t - t0] = pieces received before step t */
    double deadline = ddp__now() + pg->timeout;
    int t;
    prefix = (size_t*)ddp__malloc((size_t)(t1 - t0 + 1) * sizeof *prefix);
    if (!prefix) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating ring bookkeeping failed");
    prefix[0] = 0;
    for (t = t0; t < t1; t++) {
        int seg = ddp__ring_recv_seg(r, t, shift, W);
        size_t len = ddp__seg_start(count, W, seg + 1) - ddp__seg_start(count, W, seg);
        prefix[t - t0 + 1] = prefix[t - t0] + ddp__pieces(len, piece);
    }
    memset(&snd, 0, sizeof snd);
    memset(&rcv, 0, sizeof rcv);
    snd.t = rcv.t = t0;
    while (snd.t < t1 || rcv.t < t1) {
        struct pollfd pf[2];
        int sseg = ddp__ring_send_seg(r, snd.t, shift, W), rseg = ddp__ring_recv_seg(r, rcv.t, shift, W);
        size_t s0 = ddp__seg_start(count, W, sseg), slen = ddp__seg_start(count, W, sseg + 1) - s0;
        size_t r0 = ddp__seg_start(count, W, rseg), rlen = ddp__seg_start(count, W, rseg + 1) - r0;
        size_t sn = slen - snd.off < piece ? slen - snd.off : piece;
        size_t rn = rlen - rcv.off < piece ? rlen - rcv.off : piece;
        /* piece j of step t leaves once piece j of step t-1 was received (same segment) */
        int can_send = snd.t < t1 &&
                       (snd.t == t0 || rcv.done > prefix[snd.t - 1 - t0] + snd.off / piece);
        int n = 0, si = -1, ri = -1;
        /* Steps whose segment is empty (count < world) pass at once. */
        if (snd.t < t1 && slen == 0 && can_send) { snd.t++; continue; }
        if (rcv.t < t1 && rlen == 0) { rcv.t++; continue; }
        if (detail && snd.t < t1 && snd.off == 0 && snd_sent == 0 && can_send)
            ddp__ring_say(pg, w, snd.t, sseg, s0, s0 + slen, right, NULL);
        if (can_send) pf[n].fd = pg->right_fd, pf[n].events = POLLOUT, pf[n].revents = 0, si = n++;
        if (rcv.t < t1) pf[n].fd = pg->left_fd, pf[n].events = POLLIN, pf[n].revents = 0, ri = n++;
        if (n == 0) break; /* cannot happen: a send waits only for a receive that is pending */
        if (ddp__poll_yielding(pf, n, pg->tcp_yield, deadline) == 0 && ddp__now() >= deadline) {
            DDP_FREE(prefix);
            return ddp__ring_timed_out(pg, w, rcv.t, left);
        }
        if (si >= 0 && (pf[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = send(pg->right_fd, buf + (s0 + snd.off) * es + snd_sent, sn * es - snd_sent, DDP__SEND_FLAGS);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                int e = errno;
                DDP_FREE(prefix);
                return ddp__ring_lost(w, right, -1, strerror(e));
            }
            if (k > 0) {
                snd_sent += (size_t)k;
                DDP__COUNT(pg->bytes_sent, (uint64_t)k);
                if (snd_sent == sn * es) {
                    snd_sent = 0;
                    snd.off += sn;
                    if (snd.off == slen) snd.off = 0, snd.t++;
                }
            }
        }
        if (ri >= 0 && (pf[ri].revents & (POLLIN | POLLERR | POLLHUP))) {
            int reducing = rcv.t < W - 1;
            /* reduce-scatter pieces land in scratch and are then combined; all-gather pieces are
               final and land in place */
            unsigned char* dst = reducing ? pg->piece + rcv_got : buf + (r0 + rcv.off) * es + rcv_got;
            ssize_t k = recv(pg->left_fd, dst, rn * es - rcv_got, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                int e = k == 0 ? ECONNRESET : errno;
                DDP_FREE(prefix);
                return ddp__ring_lost(w, left, rcv.t, k == 0 ? "end of stream" : strerror(e));
            }
            if (k > 0) {
                rcv_got += (size_t)k;
                DDP__COUNT(pg->bytes_received, (uint64_t)k);
                if (rcv_got == rn * es) {
                    if (reducing) {
                        unsigned char* mine = buf + (r0 + rcv.off) * es;
                        ddp__reduce(mine, pg->piece, rn, w->dtype, w->op);
                        if (rcv.t == W - 2 && w->op == DDP_AVG) ddp__divide(mine, rn, w->dtype, W);
                    }
                    if (detail && rcv.off == 0)
                        ddp__ring_say(pg, w, rcv.t, rseg, r0, r0 + rlen, left,
                                      reducing ? (w->op == DDP_MAX ? "took the maximum with" : "added") : "copied");
                    rcv_got = 0;
                    rcv.off += rn;
                    rcv.done++;
                    if (rcv.off == rlen) rcv.off = 0, rcv.t++;
                }
            }
        }
    }
    DDP_FREE(prefix);
    return DDP_OK;
}

/* Broadcast down the ring from the root: rank root sends to root+1, which passes each piece on
   as soon as it has it, ... up to the rank before the root. Pipelined, so the time is close to
   one transfer of the buffer rather than W-1 of them. */
DDP__PRIVATE ddp_status ddp__ring_broadcast(ddp_pg* pg, ddp_work* w, unsigned char* buf) {
    const int W = pg->world, r = pg->rank, left = ddp__mod(r - 1, W), right = ddp__mod(r + 1, W);
    const size_t nbytes = w->count * ddp_dtype_size(w->dtype);
    const int receives = r != w->root, sends = right != w->root;
    size_t got = receives ? 0 : nbytes, sent = 0;
    double deadline = ddp__now() + pg->timeout;
    while ((sends && sent < nbytes) || got < nbytes) {
        struct pollfd pf[2];
        int n = 0, si = -1, ri = -1;
        if (sends && sent < got) pf[n].fd = pg->right_fd, pf[n].events = POLLOUT, pf[n].revents = 0, si = n++;
        if (got < nbytes) pf[n].fd = pg->left_fd, pf[n].events = POLLIN, pf[n].revents = 0, ri = n++;
        if (ddp__poll_yielding(pf, n, pg->tcp_yield, deadline) == 0 && ddp__now() >= deadline)
            return ddp__fail(DDP_ERR_TIMEOUT, "broadcast #%llu from rank %d timed out after %.0f s waiting for rank "
                             "%d: that rank is stuck, stopped, or calling a different collective",
                             (unsigned long long)w->seq, w->root, pg->timeout, got < nbytes ? left : right);
        if (si >= 0 && (pf[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = send(pg->right_fd, buf + sent, got - sent, DDP__SEND_FLAGS);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return ddp__fail(DDP_ERR_PEER_LOST, "broadcast #%llu: sending to rank %d failed (%s): it has "
                                 "probably died", (unsigned long long)w->seq, right, strerror(errno));
            if (k > 0) sent += (size_t)k, DDP__COUNT(pg->bytes_sent, (uint64_t)k);
        }
        if (ri >= 0 && (pf[ri].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t k = recv(pg->left_fd, buf + got, nbytes - got, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return ddp__fail(DDP_ERR_PEER_LOST, "broadcast #%llu: rank %d closed its connection: it has "
                                 "probably died", (unsigned long long)w->seq, left);
            if (k > 0) got += (size_t)k, DDP__COUNT(pg->bytes_received, (uint64_t)k);
        }
    }
    return DDP_OK;
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>nccl: the NCCL backend, and the ring over NCCL's send and recv             (chapters 3, 10)  */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE ddp_status ddp__stream_wait_event(ddp_stream* s, ddp_event* e); /* >>cuda */
DDP__PRIVATE ddp_status ddp__event_query(ddp_event* e, int* done); /* >>cuda */

/* ---- the NCCL backend (>>nccl) ------------------------------------------------------------------ */
/*
   One communicator per process group, made from an id that rank 0 draws and shares through the
   store, created non-blocking so that every wait can keep a deadline. Non-blocking means that
   NCCL may answer a call with ncclInProgress and put the work on its stream later: until
   ncclCommGetAsyncError says ncclSuccess, the collective is not yet on the stream (an event
   recorded there would mark a point before it) and the communicator refuses every other call. So
   each call is followed by ddp__nccl_settle, which polls until NCCL has taken the work.

   Collectives run on the group's own stream, which first waits (by an event, not a host sync) for
   the work queued on the producer's stream, so that the model's stream goes on with backward while
   a bucket is reduced (overlap). ddp_work_wait polls the collective's end event and NCCL's
   asynchronous error until the deadline, then makes the producer's stream wait for the result, as
   PyTorch's Work.wait() does. An error or a timeout aborts the communicator (ncclCommAbort), the
   one call NCCL promises will not hang when a peer has died, and breaks the group.

   DDP_NCCL_RING=1 swaps ncclAllReduce for the ring of >>ring written with ncclSend/ncclRecv and a
   reduction kernel, so the tutorial can put the library call and the algorithm side by side.

   DDP_NCCL_BLOCKING=1 makes the communicator blocking, as PyTorch's are by default: each call
   returns once its work is on the stream, so there is nothing to settle, but NCCL's own waits (its
   init, its teardown) have no deadline. The store's barrier, which has one, goes first, so a rank
   that never comes is named; and ddp_destroy aborts instead of finalizing. The waits for results
   poll events in either mode, so the watchdog and the deadline hold in both. The mode exists to
   be measured against the default (tools/allreduce_perf -H: the host's time per call).
*/
#if DDP__CUDA
#define DDP__NCCL_EVENTS 16
typedef struct ddp__nccl {
    ncclComm_t comm;        /* NULL once aborted */
    ddp_stream* stream;
    ddp_event* produced;    /* where the producer's stream was at the last submit */
    ddp_event* spare[DDP__NCCL_EVENTS]; /* end events of finished collectives, for the next ones */
    int nspare;
    int own_ring;
    void* scratch;          /* one received segment, for the hand-written ring */
    size_t scratch_bytes;
    ddp_event* quiet;       /* the end of everything queued, for ddp__nccl_quiet */
    int blocking;           /* DDP_NCCL_BLOCKING=1: a blocking communicator */
} ddp__nccl;

/* The NCCL groups of this process (one, as a rule), for ddp__nccl_quiet. */
#define DDP__NCCL_LIVE 8
static ddp_pg* ddp__nccl_live[DDP__NCCL_LIVE];
static pthread_mutex_t ddp__nccl_live_lock = PTHREAD_MUTEX_INITIALIZER;

DDP__PRIVATE ddp_status ddp__fail_nccl(ddp_pg* pg, ncclResult_t r, const char* call, int line) {
    ddp__nccl* n = pg ? (ddp__nccl*)pg->nccl : NULL;
    const char* last = n && n->comm ? ncclGetLastError(n->comm) : "";
    return ddp__fail(DDP_ERR_NCCL, "%s failed (ddp.h:%d): %s%s%s; likely cause: %s", call, line, ncclGetErrorString(r),
                     last && *last ? " - " : "", last ? last : "",
                     r == ncclSystemError ? "a network or system problem (NCCL_DEBUG=INFO shows which; on several "
                                            "nodes check NCCL_SOCKET_IFNAME)"
                     : r == ncclInvalidUsage ? "two ranks on one GPU, or collectives called in different orders"
                     : r == ncclRemoteError ? "another rank failed or died"
                                            : "see the NCCL documentation");
}

/* Abort the communicator (never hangs, unlike ncclCommDestroy after a failure) and break the
   group with the error just set, so that every later call says why. Returns that status. */
DDP__PRIVATE ddp_status ddp__nccl_break(ddp_pg* pg, ddp_status s) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    if (n->comm) ncclCommAbort(n->comm);
    n->comm = NULL;
    return ddp__pg_break(pg, s);
}

/* An error NCCL reported while this rank waited in `what`. A remote or system error usually means
   a peer has ended: the watchdog (>>signals) names it when its process is gone (its store
   connection may close a moment after NCCL noticed), else NCCL's own words stand. */
DDP__PRIVATE ddp_status ddp__nccl_error(ddp_pg* pg, ncclResult_t st, const char* what, int line) {
    char told[sizeof ddp__err_msg];
    ddp_status s = ddp__fail_nccl(pg, st, what, line);
    double until = ddp__now() + 1.0;
    snprintf(told, sizeof told, "%s", ddp_error_string());
    if (st == ncclInvalidUsage) return ddp__deadline_report(pg, what, told); /* which ranks call which */
    if (st != ncclRemoteError && st != ncclSystemError) return s;
    do {
        ddp_status w = ddp__watch_peers(pg, what, told);
        if (w != DDP_OK) return w;
        ddp__sleep(0.05);
    } while (ddp__now() < until);
    return ddp__fail(s, "%s", told);
}

/* Poll without burning a core for long: for the first millisecond yielding the core between
   polls (where ranks outnumber cores, a pure spin keeps the threads that finish the work off it),
   then sleeping a sixteenth of the time waited so far (10 us to 1 ms), so a wait ends at most
   about 6% late. */
DDP__PRIVATE void ddp__nccl_pause(double started) {
    double waited = ddp__now() - started;
    if (waited < 1e-3) {
        sched_yield();
        return;
    }
    ddp__sleep(waited / 16 < 1e-5 ? 1e-5 : waited / 16 > 1e-3 ? 1e-3 : waited / 16);
}

/* Wait until the non-blocking communicator has taken the last call (ncclCommGetAsyncError says
   ncclSuccess), or it reports an error, or the deadline passes: both break the group. */
DDP__PRIVATE ddp_status ddp__nccl_settle(ddp_pg* pg, double deadline, const char* what) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    double start = ddp__now(), look = start + DDP__WATCH_EVERY_S;
    for (;;) {
        ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess) return ddp__nccl_break(pg, ddp__fail_nccl(pg, r, "ncclCommGetAsyncError", __LINE__));
        if (st == ncclSuccess) return DDP_OK;
        if (st != ncclInProgress) return ddp__nccl_break(pg, ddp__nccl_error(pg, st, what, __LINE__));
        if (ddp__now() >= look) { /* the watchdog (>>signals): has a peer's process ended? */
            ddp_status s = ddp__watch_peers(pg, what, NULL);
            if (s != DDP_OK) return ddp__nccl_break(pg, s);
            look = ddp__now() + DDP__WATCH_EVERY_S;
        }
        if (ddp__now() >= deadline)
            return ddp__nccl_break(pg, ddp__fail(DDP_ERR_TIMEOUT, "%s did not finish within %.0f s; the communicator "
                                                 "was aborted (a rank is missing, stuck or on another collective)",
                                                 what, pg->timeout));
        ddp__nccl_pause(start);
    }
}

/* One NCCL call's result: ncclInProgress waits until NCCL has taken the call; an error breaks
   the group (its peers are now out of step with it). */
DDP__PRIVATE ddp_status ddp__nccl_done(ddp_pg* pg, ncclResult_t r, const char* call, int line) {
    if (r == ncclInProgress) return ddp__nccl_settle(pg, ddp__now() + pg->timeout, call);
    if (r != ncclSuccess) return ddp__nccl_break(pg, ddp__fail_nccl(pg, r, call, line));
    return DDP_OK;
}
#define DDP__NCCL(call) DDP__TRY(ddp__nccl_done(pg, (call), #call, __LINE__))

DDP__PRIVATE ddp_status ddp__nccl_connect(ddp_pg* pg) {
    ddp__nccl* n;
    ncclUniqueId id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    size_t got = 0;
    const char *ring = getenv("DDP_NCCL_RING"), *blocking = getenv("DDP_NCCL_BLOCKING");
    n = (ddp__nccl*)ddp__calloc(sizeof *n);
    if (!n) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the NCCL state failed");
    pg->nccl = n;
    n->own_ring = ring && *ring == '1';
    n->blocking = blocking && *blocking == '1';
    DDP__TRY(ddp__device_activate(pg->device));
    if (pg->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return ddp__fail_nccl(pg, r, "ncclGetUniqueId", __LINE__);
        DDP__TRY(ddp_store_set(pg->store, "ddp/nccl/id", &id, sizeof id));
    } else {
        DDP__TRY(ddp_store_get(pg->store, "ddp/nccl/id", &id, sizeof id, &got));
        if (got != sizeof id)
            return ddp__fail(DDP_ERR_NCCL, "the NCCL id in the store has %zu bytes, not %zu", got, sizeof id);
    }
    cfg.blocking = n->blocking; /* default 0: so that creating the communicator, too, can time out */
    if (n->blocking) /* NCCL's init would wait for a missing rank for ever: the store's barrier names it */
        DDP__TRY(ddp__store_barrier(pg->store, "nccl-init", pg->world));
    ddp__log(DDP_LOG_INFO, "NCCL: a %s communicator", n->blocking ? "blocking (DDP_NCCL_BLOCKING=1)" : "non-blocking");
    {
        ncclResult_t r = ncclCommInitRankConfig(&n->comm, pg->world, id, pg->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            ddp_status s = ddp__fail_nccl(pg, r, "ncclCommInitRankConfig", __LINE__);
            if (n->comm) ncclCommAbort(n->comm);
            n->comm = NULL;
            return s;
        }
    }
    DDP__TRY(ddp__nccl_settle(pg, ddp__now() + pg->timeout, "ncclCommInitRankConfig"));
    DDP__TRY(ddp__stream_create(pg->device, &n->stream));
    DDP__TRY(ddp__event_create(pg->device, &n->quiet));
    DDP__TRY(ddp__event_create(pg->device, &n->produced));
    {
        int i;
        pthread_mutex_lock(&ddp__nccl_live_lock);
        for (i = 0; i < DDP__NCCL_LIVE && ddp__nccl_live[i]; i++) {}
        if (i < DDP__NCCL_LIVE) ddp__nccl_live[i] = pg;
        pthread_mutex_unlock(&ddp__nccl_live_lock);
    }
    return DDP_OK;
}

DDP__PRIVATE ncclDataType_t ddp__nccl_type(ddp_dtype t) {
    return t == DDP_F16 ? ncclFloat16 : t == DDP_BF16 ? ncclBfloat16 : ncclFloat32;
}

/* One step of the hand-written ring: a send and a receive in one NCCL group. A call that fails
   inside the group still closes it, or every later NCCL call of this thread would join it. */
DDP__PRIVATE ddp_status ddp__nccl_step(ddp_pg* pg, const void* sbuf, size_t slen, void* rbuf, size_t rlen,
                                       ncclDataType_t t, int right, int left) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    ncclResult_t r = ncclGroupStart(), e;
    if (r == ncclSuccess && slen) r = ncclSend(sbuf, slen, t, right, n->comm, n->stream->s);
    if ((r == ncclSuccess || r == ncclInProgress) && rlen) r = ncclRecv(rbuf, rlen, t, left, n->comm, n->stream->s);
    e = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return ddp__nccl_break(pg, ddp__fail_nccl(pg, r, "ncclSend/ncclRecv", __LINE__));
    return ddp__nccl_done(pg, e, "ncclGroupEnd (a ring step)", __LINE__);
}

/* The >>ring algorithm over NCCL point-to-point calls: the same segments and steps as the CPU
   ring, each step one send to rank+1 and one receive from rank-1, then a reduction kernel, all
   in order on the group's stream. */
DDP__PRIVATE ddp_status ddp__nccl_ring(ddp_pg* pg, ddp_work* w) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    const int W = pg->world, r = pg->rank, left = (r - 1 + W) % W, right = (r + 1) % W;
    const size_t es = ddp_dtype_size(w->dtype);
    unsigned char* buf = (unsigned char*)w->buf;
    int t;
    size_t maxseg = w->count / (size_t)W + 1;
    if (maxseg * es > n->scratch_bytes) {
        ddp_free(pg->device, n->scratch);
        n->scratch = NULL;
        n->scratch_bytes = 0;
        DDP__TRY(ddp_alloc(pg->device, maxseg * es, &n->scratch));
        n->scratch_bytes = maxseg * es;
    }
    for (t = 0; t < 2 * W - 2; t++) {
        int sseg = ddp__mod(r - t, W), rseg = ddp__mod(r - t - 1, W);
        size_t s0 = ddp__seg_start(w->count, W, sseg), slen = ddp__seg_start(w->count, W, sseg + 1) - s0;
        size_t r0 = ddp__seg_start(w->count, W, rseg), rlen = ddp__seg_start(w->count, W, rseg + 1) - r0;
        int reducing = t < W - 1;
        void* dst = reducing ? n->scratch : (void*)(buf + r0 * es);
        DDP__TRY(ddp__nccl_step(pg, buf + s0 * es, slen, dst, rlen, ddp__nccl_type(w->dtype), right, left));
        if (reducing && rlen) { /* queued after the receive, on the same stream */
            void* mine = buf + r0 * es;
            long long cnt = (long long)rlen;
            int dt = (int)w->dtype, op = w->op == DDP_MAX ? 1 : 0;
            float divisor = (t == W - 2 && w->op == DDP_AVG) ? (float)W : 1.f; /* as ddp__divide */
            void* args[6];
            args[0] = &mine, args[1] = &n->scratch, args[2] = &cnt, args[3] = &dt, args[4] = &op, args[5] = &divisor;
            DDP__TRY(ddp__launch(pg->device, n->stream, DDP__K_reduce, cnt, args));
        }
    }
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__nccl_submit(ddp_pg* pg, ddp_work* w) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    ncclDataType_t t = ddp__nccl_type(w->dtype);
    ncclRedOp_t op = w->op == DDP_MAX ? ncclMax : w->op == DDP_AVG ? ncclAvg : ncclSum;
    DDP__TRY(ddp__device_activate(pg->device));
    /* order after the producer's stream without blocking the host */
    DDP__TRY(ddp__event_record(n->produced, pg->user_stream));
    DDP__TRY(ddp__stream_wait_event(n->stream, n->produced));
    switch (w->kind) {
    case DDP__ALL_REDUCE:
        if (n->own_ring && pg->world > 1) DDP__TRY(ddp__nccl_ring(pg, w));
        else DDP__NCCL(ncclAllReduce(w->buf, w->buf, w->count, t, op, n->comm, n->stream->s));
        break;
    case DDP__BROADCAST:
        DDP__NCCL(ncclBroadcast(w->buf, w->buf, w->count, t, w->root, n->comm, n->stream->s));
        break;
    case DDP__ALL_GATHER:
        DDP__NCCL(ncclAllGather(w->send, w->buf, w->count, t, n->comm, n->stream->s));
        break;
    default:
        DDP__NCCL(ncclReduceScatter(w->send, w->buf, w->count, t, op, n->comm, n->stream->s));
        break;
    }
    /* w->ready marks the collective's end on the group's stream (NCCL has put it there: settled) */
    if (n->nspare > 0) w->ready = n->spare[--n->nspare];
    else DDP__TRY(ddp__event_create(pg->device, &w->ready));
    DDP__TRY(ddp__event_record(w->ready, n->stream));
    ddp__flight_note(pg, w, DDP__FL_RUNNING);
    return DDP_OK;
}

/* Poll event e (the end of a collective, or of everything on the group's stream) and NCCL's
   asynchronous error until e has happened; an error or the deadline breaks the group. */
DDP__PRIVATE ddp_status ddp__nccl_poll(ddp_pg* pg, ddp_event* e, double deadline, const char* what) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    double start = ddp__now(), look = start + DDP__WATCH_EVERY_S;
    for (;;) {
        int done = 0;
        ncclResult_t st = ncclSuccess, r;
        DDP__TRY(ddp__event_query(e, &done));
        /* an abort ends the kernels too: after a break (ddp__nccl_quiet's, say), done says nothing */
        if (pg->broken) return ddp__fail(pg->broken, "%s", pg->broken_msg);
        if (done) return DDP_OK;
        if (!n->comm) return ddp__fail(DDP_ERR_STATE, "%s: the NCCL communicator was aborted", what);
        r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess) st = r;
        if (st != ncclSuccess && st != ncclInProgress) return ddp__nccl_break(pg, ddp__nccl_error(pg, st, what, __LINE__));
        if (ddp__now() >= look) { /* the watchdog (>>signals): has a peer's process ended? */
            ddp_status s = ddp__watch_peers(pg, what, NULL);
            if (s != DDP_OK) return ddp__nccl_break(pg, s);
            look = ddp__now() + DDP__WATCH_EVERY_S;
        }
        /* at the deadline, what does every rank wait in? (names a desync, or the silent ranks) */
        if (ddp__now() >= deadline) return ddp__nccl_break(pg, ddp__deadline_report(pg, what, NULL));
        ddp__nccl_pause(start);
    }
}

/* Before a call that synchronises a whole GPU (cudaFree, cudaDeviceSynchronize), which would also
   wait, with no deadline, for a collective stuck on it (a peer gone or stopped: NCCL's kernels
   wait for ever): the collectives queued on that GPU by this process's groups are waited for
   here, with the deadline and the watchdog, as ddp_work_wait waits. A stuck one is aborted, which
   releases its kernels, so the call returns; the group is broken, and its next call says why. */
DDP__PRIVATE void ddp__nccl_quiet(int device, const char* why) {
    int i;
    for (i = 0; i < DDP__NCCL_LIVE; i++) {
        ddp_pg* pg;
        ddp__nccl* n;
        pthread_mutex_lock(&ddp__nccl_live_lock);
        pg = ddp__nccl_live[i];
        pthread_mutex_unlock(&ddp__nccl_live_lock);
        n = pg ? (ddp__nccl*)pg->nccl : NULL;
        if (!n || !n->comm || !n->quiet || (device >= 0 && pg->device.index != device) || pg->broken) continue;
        if (ddp__event_record(n->quiet, n->stream) != DDP_OK) continue;
        if (ddp__nccl_poll(pg, n->quiet, ddp__now() + pg->timeout, why) != DDP_OK)
            ddp__log(DDP_LOG_WARN, "%s", ddp_error_string());
    }
}

/* The end event of a finished collective goes back to the spares. */
DDP__PRIVATE void ddp__nccl_recycle(ddp__nccl* n, ddp_work* w) {
    if (w->ready && n->nspare < DDP__NCCL_EVENTS) {
        n->spare[n->nspare++] = w->ready;
        w->ready = NULL;
    }
}

DDP__PRIVATE ddp_status ddp__nccl_wait(ddp_pg* pg, ddp_work* w) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    char what[128];
    ddp_status s;
    ddp__fingerprint(w, what, sizeof what);
    s = ddp__nccl_poll(pg, w->ready, ddp__now() + pg->timeout, what);
    if (s != DDP_OK) {
        ddp__flight_note(pg, w, DDP__FL_FAILED);
        if (s == DDP_ERR_TIMEOUT) ddp__flight_dump(pg, DDP_LOG_ERROR, "a collective timed out");
        return s;
    }
    /* later work on the producer's stream waits for the result, as PyTorch's Work.wait() does */
    if (pg->user_stream) DDP__TRY(ddp__stream_wait_event(pg->user_stream, w->ready));
    ddp__flight_note(pg, w, DDP__FL_DONE);
    ddp__nccl_recycle(n, w);
    return DDP_OK;
}

/* ddp__work_test: the end event, without blocking. A failure reports *done = 1 (ddp_work_wait
   then returns the error). */
DDP__PRIVATE ddp_status ddp__nccl_test(ddp_pg* pg, ddp_work* w, int* done) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    ncclResult_t st = ncclSuccess;
    DDP__TRY(ddp__event_query(w->ready, done));
    if (!*done && (!n->comm || ncclCommGetAsyncError(n->comm, &st) != ncclSuccess ||
                   (st != ncclSuccess && st != ncclInProgress)))
        *done = 1;
    return DDP_OK;
}

DDP__PRIVATE void ddp__nccl_destroy(ddp_pg* pg) {
    ddp__nccl* n = (ddp__nccl*)pg->nccl;
    int i;
    if (!n) return;
    pthread_mutex_lock(&ddp__nccl_live_lock);
    for (i = 0; i < DDP__NCCL_LIVE; i++)
        if (ddp__nccl_live[i] == pg) ddp__nccl_live[i] = NULL;
    pthread_mutex_unlock(&ddp__nccl_live_lock);
    if (n->comm) {
        /* A healthy communicator is finalized once its work has drained; one with an error, or
           whose work never ends, is aborted (NCCL's one call that never waits for a peer). NCCL's
           teardown is a collective over this machine's ranks: ncclCommDestroy alone would wait,
           with no deadline, for a neighbour that is stopped. So: ncclCommFinalize, polled against
           ddp_destroy's deadline with the watchdog looking, then ncclCommDestroy, which only frees;
           or, past the deadline, the abort (as PyTorch's shutdown does). */
        ddp_event* end = NULL;
        double deadline = pg->leave_by > 0 ? pg->leave_by : ddp__now() + pg->timeout;
        ddp_status s = pg->broken ? pg->broken : ddp__event_create(pg->device, &end);
        if (s == DDP_OK) s = ddp__event_record(end, n->stream);
        if (s == DDP_OK) s = ddp__nccl_poll(pg, end, deadline, "the collectives still queued at ddp_destroy");
        ddp__event_destroy(end);
        if (s == DDP_OK && n->comm && !n->blocking) { /* blocking: finalize would wait with no deadline */
            ncclResult_t r = ncclCommFinalize(n->comm);
            if (r == ncclInProgress) s = ddp__nccl_settle(pg, deadline, "ncclCommFinalize (ddp_destroy)");
            else if (r != ncclSuccess) s = ddp__fail_nccl(pg, r, "ncclCommFinalize", __LINE__);
            if (s != DDP_OK)
                ddp__log(DDP_LOG_WARN, "ddp_destroy: the NCCL communicator was aborted, not finalized: %s",
                         ddp_error_string());
        }
        if (s == DDP_OK && n->comm && !n->blocking) ncclCommDestroy(n->comm);
        else if (n->comm) ncclCommAbort(n->comm);
        n->comm = NULL;
    }
    ddp__stream_destroy(n->stream);
    ddp__event_destroy(n->produced);
    ddp__event_destroy(n->quiet);
    for (i = 0; i < n->nspare; i++) ddp__event_destroy(n->spare[i]);
    ddp_free(pg->device, n->scratch);
    DDP_FREE(n);
    pg->nccl = NULL;
}

static const ddp__backend_vt ddp__nccl_backend = {"nccl",          ddp__nccl_connect, ddp__nccl_submit,
                                                  ddp__nccl_wait,  ddp__nccl_test,    ddp__nccl_destroy};
/* The nccl backend's entry in the backend table (>>pg). */
DDP__PRIVATE const ddp__backend_vt* ddp__nccl_vt(void) { return &ddp__nccl_backend; }
#endif

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>optim: the optimizer step: SGD, Adam, AdamW; the learning rate; clipping   (chapters 1, 12)  */
/* ============================================================================================== */
#if DDP__DECLARE
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
   negative rate, betas outside [0, 1), or nesterov without momentum. On a wrapped model it is
   collective: DDP_ERR_MODEL_MISMATCH, naming the setting, when the ranks' settings differ. */
DDP_API ddp_status ddp_optim_create(ddp_model* m, const ddp_optim_desc* desc, ddp_optim** out);
/* Update every parameter from its gradient: one torch.optim step. DDP_ERR_CUDA on a GPU failure. */
DDP_API ddp_status ddp_optim_step(ddp_optim* o);
/* Steps taken so far. */
DDP_API long ddp_optim_steps(const ddp_optim* o);
/* The learning rate of the steps that follow: a schedule (warmup, then cosine decay) is the
   caller's few lines before each step. A snapshot keeps it. DDP_ERR_INVALID_ARGUMENT for a rate
   below 0 or not finite. */
DDP_API ddp_status ddp_optim_set_lr(ddp_optim* o, float lr);
/* Global-norm clipping (torch.nn.utils.clip_grad_norm_): norm is the L2 norm of the whole model's
   averaged gradients, each element counted once, also when each rank holds only a shard of them
   (ZeRO; then it is collective). When max_norm / (norm + 1e-6) is below 1, every gradient is
   multiplied by it. Call it between the synchronised backward and ddp_optim_step; *norm (NULL
   allowed) gets the norm before clipping, the same on every rank. DDP_ERR_INVALID_ARGUMENT for a
   max_norm not above 0; the group's errors. */
DDP_API ddp_status ddp_optim_clip_grad_norm(ddp_optim* o, float max_norm, float* norm);
/* ZeRO (collective: every rank calls it): gather the sharded state, and at zero_stage 3 the
   weights, onto rank `to`, so that a ddp_snapshot_save there, before the next step, writes the
   file DDP writes (PyTorch's consolidate_state_dict). Only rank `to` holds the copy, until the next
   step. Does nothing for an optimizer that is not sharded. DDP_ERR_INVALID_ARGUMENT for a bad
   `to`; the group's errors. */
DDP_API ddp_status ddp_optim_consolidate(ddp_optim* o, int to);
/* Free the optimizer and its state. NULL is ignored. */
DDP_API void ddp_optim_destroy(ddp_optim* o);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE ddp_status ddp__verify_optim(struct ddp_optim* o); /* >>signals */

/* ---- optimizers --------------------------------------------------------------------------------- */

struct ddp_optim {
    ddp_model* m;
    ddp_optim_desc d; /* resolved: every default filled in */
    long steps;
    float* state1[DDP_MAX_PARAMS]; /* SGD momentum buffer, or Adam's first moment */
    float* state2[DDP_MAX_PARAMS]; /* Adam's second moment */
    /* ZeRO: the state covers numbers [first[i], first[i] + len[i]) of parameter i only, the part
       of it this rank owns; without sharding first is 0 and len the count. */
    size_t first[DDP_MAX_PARAMS], len[DDP_MAX_PARAMS];
    ddp__shards* z;       /* ZeRO (zero_stage 1-3): who owns what (>>zero); NULL: not sharded */
    size_t state_bytes; /* the state held, counted into the model's optim_state_bytes */
    float* full[3];     /* on the rank that consolidated: all of state1, state2 and (zero_stage 3)
                           the weights, the parameters end to end; freed by the next step */
    int consolidated;   /* 1 + the rank ddp_optim_consolidate put this step's state on; 0: none */
    double *sq_dev, *sq_host; /* on a GPU: the partial sums of the clipping norm (>>sums), made at
                                 the first clip */
    float *norm_dev, *norm_host; /* ZeRO: every rank's part of that norm, gathered (>>sums) */
};

/*
   With ZeRO (>>zero says who owns what) the optimizer keeps state only for the numbers this rank
   owns, and updates only those: in the parameter itself (stages 1-2) or in the layer's shard of
   weights (stage 3), from the averaged gradient in p->grad (stage 1) or in the layer's shard of
   gradients (stages 2-3). Every number has exactly one owner, which computes exactly the update
   DDP would. Stages 1 and 2 then all-gather the new weights; stage 3 keeps them sharded.
*/
DDP__PRIVATE void ddp__optim_shard(ddp_optim* o, ddp__shards* z) {
    int i;
    o->z = z;
    for (i = 0; i < o->m->nparams; i++) o->first[i] = z->first[i], o->len[i] = z->len[i];
}

/* State tensors per parameter: SGD's momentum buffer (with momentum only), Adam's two moments. */
DDP__PRIVATE int ddp__optim_nstate(const ddp_optim* o) {
    return o->d.kind == DDP_SGD ? o->d.momentum != 0.f : 2;
}

/* Where parameter i starts when the parameters are laid end to end in registration order. */
DDP__PRIVATE size_t ddp__flat_offset(const ddp_model* m, int i) {
    size_t at = 0;
    int j;
    for (j = 0; j < i; j++) at += m->params[j]->count;
    return at;
}

/* Consolidation moves each sharded tensor (each state, and at stage 3 the weights) the way the
   weights' all-gather of stages 1-2 moves them: every shard of every group, a piece at a time,
   all-gathered; rank `to` keeps what arrives, in registration order, and the others drop it. An
   all-gather rather than a gather to one rank because it is the collective every backend has. */
DDP__DEF ddp_status ddp_optim_consolidate(ddp_optim* o, int to) {
    ddp__shards* z = o->z;
    ddp_model* m = o->m;
    float* mine[DDP_MAX_PARAMS];
    float* whole[DDP_MAX_PARAMS];
    int which, g, q, i;
    if (!z) return DDP_OK;
    if (to < 0 || to >= z->W)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_optim_consolidate: rank %d is not in this job of %d", to, z->W);
    for (which = 0; which < 3; which++) { /* only rank `to` keeps a copy, of this step */
        float* full = NULL;
        if (z->rank != to) ddp_free(m->device, o->full[which]), o->full[which] = NULL;
        if (which < 2 ? which >= ddp__optim_nstate(o) : z->stage != 3) continue;
        for (i = 0; i < m->nparams; i++) /* this rank's numbers of each parameter */
            mine[i] = which == 0 ? o->state1[i] : which == 1 ? o->state2[i] : o->len[i] ? ddp__zero_w(z, i) : NULL;
        if (z->rank == to) {
            if (!o->full[which])
                DDP__TRY(ddp_alloc(m->device, ddp_model_num_elements(m) * sizeof(float), (void**)&o->full[which]));
            full = o->full[which];
            for (i = 0; i < m->nparams; i++) whole[i] = full + ddp__flat_offset(m, i);
        }
        for (g = 0; g < z->ngroups; g++) {
            const size_t S = z->shard[g], n = z->count[g], lo = (size_t)z->rank * S;
            const size_t piece = S < ddp__zero_piece ? S : ddp__zero_piece;
            size_t j, have = lo < n ? (n - lo < S ? n - lo : S) : 0; /* the last shard may be short */
            for (j = 0; j < S; j += piece) {
                size_t k = S - j < piece ? S - j : piece;
                if (j < have)
                    DDP__TRY(ddp__zero_io(z, g, lo + j, z->send, have - j < k ? have - j : k, mine, o->first, 0));
                DDP__TRY(ddp_all_gather(z->pg, z->send, z->recv, k, DDP_F32, NULL));
                for (q = 0; full && q < z->W; q++) {
                    size_t at = (size_t)q * S + j;
                    if (at < n) DDP__TRY(ddp__zero_io(z, g, at, z->recv + (size_t)q * k, n - at < k ? n - at : k, whole,
                                                      NULL, 1));
                }
            }
        }
    }
    o->consolidated = 1 + to;
    return ddp_stream_sync(m->stream);
}

/* ddp_join: take rank root's optimizer state and step count (collective; not for a sharded state,
   which ddp_wrap keeps apart from uneven inputs). */
DDP__PRIVATE ddp_status ddp__optim_follow(ddp_optim* o, ddp_pg* pg, int root) {
    ddp_model* m = o->m;
    float steps = (float)o->steps, *dev;
    int i;
    DDP__TRY(ddp_alloc(m->device, sizeof(float), (void**)&dev));
    if (ddp_copy(m->device, dev, ddp__cpu(), &steps, sizeof steps, m->stream) != DDP_OK ||
        ddp__broadcast(pg, dev, 1, DDP_F32, root, NULL) != DDP_OK ||
        ddp_copy(ddp__cpu(), &steps, m->device, dev, sizeof steps, m->stream) != DDP_OK ||
        ddp_stream_sync(m->stream) != DDP_OK) {
        ddp_free(m->device, dev);
        return ddp__last_status();
    }
    ddp_free(m->device, dev);
    o->steps = (long)steps;
    for (i = 0; i < m->nparams; i++) {
        if (o->state1[i]) DDP__TRY(ddp__broadcast(pg, o->state1[i], o->len[i], DDP_F32, root, NULL));
        if (o->state2[i]) DDP__TRY(ddp__broadcast(pg, o->state2[i], o->len[i], DDP_F32, root, NULL));
    }
    return DDP_OK;
}

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
    for (i = 0; i < m->nparams; i++) o->len[i] = m->params[i]->count;
    if (m->zero) ddp__optim_shard(o, m->zero);
    for (i = 0; i < m->nparams && s == DDP_OK; i++) {
        size_t nb = o->len[i] * sizeof(float);
        /* zeroed, so a snapshot taken before the first step holds no stray bytes */
        if (d.kind != DDP_SGD || d.momentum != 0.f) s = ddp_alloc(m->device, nb, (void**)&o->state1[i]);
        if (s == DDP_OK && o->state1[i]) s = ddp__zero(m->device, o->state1[i], nb, m->stream);
        if (s == DDP_OK && d.kind != DDP_SGD) s = ddp_alloc(m->device, nb, (void**)&o->state2[i]);
        if (s == DDP_OK && o->state2[i]) s = ddp__zero(m->device, o->state2[i], nb, m->stream);
    }
    if (s != DDP_OK) {
        ddp_optim_destroy(o);
        return s;
    }
    for (i = 0; i < m->nparams; i++)
        o->state_bytes += ((o->state1[i] != NULL) + (o->state2[i] != NULL)) * o->len[i] * sizeof(float);
    m->optim_state_bytes += o->state_bytes;
    m->optim = o;
    /* a wrapped model: every rank must create the same optimizer (collective), or the replicas
       would step apart, or consolidate different states, without any collective noticing */
    if (m->pg && (s = ddp__verify_optim(o)) != DDP_OK) {
        char msg[sizeof ddp__err_msg];
        memcpy(msg, ddp__err_msg, sizeof msg);
        ddp_optim_destroy(o);
        return ddp__fail(s, "%s", msg);
    }
    *out = o;
    return DDP_OK;
}

#ifdef DDP_NO_FIX_HINTS
#define DDP__NO_SYNC_FIX ""
#else
#define DDP__NO_SYNC_FIX                                                                                    \
    " Keep no_sync on for the first K-1 micro-batches and off for the last one: ddp_no_sync(w, k < K - 1) "   \
    "before each backward."
#endif

DDP__DEF ddp_status ddp_optim_step(ddp_optim* o) {
    const ddp_optim_desc* d = &o->d;
    ddp_model* m = o->m;
    int i, first;
    float step_size = 0.f, bc2_sqrt = 1.f, decay;
    double t_start = ddp__now();
    /* An accumulation loop that turned no_sync off too early (the first micro-batch synchronised,
       the others not) steps on gradients the other ranks never saw: the replicas drift apart. */
    if (m->local_backwards > 0 && ddp__first_time(&ddp__warned_no_sync))
        ddp__log(DDP_LOG_WARN, "ddp_optim_step: the last %d backward pass%s ran under ddp_no_sync after the last "
                "all-reduce, so %s gradients were never averaged across the ranks and the replicas now drift apart.%s "
                "Printed once per process", m->local_backwards, m->local_backwards == 1 ? "" : "es",
                m->local_backwards == 1 ? "its" : "their", DDP__NO_SYNC_FIX);
    if (m->zero && o->z != m->zero)
        return ddp__fail(DDP_ERR_STATE, "ddp_optim_step: the model was wrapped with zero_stage %d after this optimizer "
                         "was created, so its state is not sharded the way the model now is: create the optimizer "
                         "after ddp_wrap", ddp__zero_stage(m->zero));
    /* ZeRO-3: gathered weights are a copy of the shards this step changes. A copy held by
       ddp_full_params is kept, and a forward on it refused (>>zero); any other copy goes. */
    if (o->z && o->z->stage == 3) {
        if (o->z->full_on) o->z->full_stale = 1;
        else DDP__TRY(ddp__zero_drop_others(o->z, -1, 0));
    }
    /* a consolidated copy describes the state before this step: it is stale from here on */
    for (i = 0; i < 3; i++) ddp_free(m->device, o->full[i]), o->full[i] = NULL;
    o->consolidated = 0;
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
        /* with ZeRO only the part of p this rank owns, wherever it lives (>>zero) */
        float *w, *g, *s1 = o->state1[i], *s2 = o->state2[i];
        long long n = (long long)o->len[i], k;
        if (n == 0) continue;
        w = o->z ? ddp__zero_w(o->z, i) : p->data;
        g = o->z ? ddp__zero_g(o->z, i) : p->grad;
        decay = p->no_decay ? 0.f : d->weight_decay; /* its parameter group's */
#if DDP__CUDA
        if (m->device.type == DDP_DEVICE_CUDA) {
            if (d->kind == DDP_SGD) {
                void* args[10];
                args[0] = (void*)&w; args[1] = (void*)&g; args[2] = (void*)&s1; args[3] = (void*)&n;
                args[4] = (void*)&d->lr; args[5] = (void*)&d->momentum; args[6] = (void*)&d->dampening;
                args[7] = (void*)&decay; args[8] = (void*)&d->nesterov; args[9] = (void*)&first;
                DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_sgd, n, args));
            } else {
                void* args[13];
                int decoupled = d->kind == DDP_ADAMW;
                args[0] = (void*)&w; args[1] = (void*)&g; args[2] = (void*)&s1; args[3] = (void*)&s2;
                args[4] = (void*)&n; args[5] = (void*)&d->lr; args[6] = (void*)&d->beta1;
                args[7] = (void*)&d->beta2; args[8] = (void*)&d->eps; args[9] = (void*)&decay;
                args[10] = (void*)&decoupled; args[11] = (void*)&step_size; args[12] = (void*)&bc2_sqrt;
                DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_adam, n, args));
            }
            continue;
        }
#endif
        {
            /* The settings as locals: read through d, the compiler must assume every store to w
               may change them, reload them per element and give up vectorising (3x slower). */
            const float lr = d->lr, wd = decay, mom = d->momentum, damp = d->dampening;
            const float b1 = d->beta1, b2 = d->beta2, eps = d->eps;
            const int nesterov = d->nesterov, adamw = d->kind == DDP_ADAMW;
            if (d->kind == DDP_SGD && wd == 0.f && mom == 0.f) {
                for (k = 0; k < n; k++) w[k] -= lr * g[k];
            } else if (d->kind == DDP_SGD) {
                for (k = 0; k < n; k++) {
                    float gr = g[k];
                    if (wd != 0.f) gr += wd * w[k];
                    if (mom != 0.f) {
                        float b = first ? gr : mom * s1[k] + (1.f - damp) * gr;
                        s1[k] = b;
                        gr = nesterov ? gr + mom * b : b;
                    }
                    w[k] -= lr * gr;
                }
            } else {
                for (k = 0; k < n; k++) {
                    float gr = g[k];
                    if (adamw) w[k] *= 1.f - lr * wd;
                    else if (wd != 0.f) gr += wd * w[k];
                    s1[k] += (1.f - b1) * (gr - s1[k]); /* PyTorch's lerp form of the first moment */
                    s2[k] = b2 * s2[k] + (1.f - b2) * gr * gr;
                    w[k] -= step_size * s1[k] / (sqrtf(s2[k]) / bc2_sqrt + eps);
                }
            }
        }
    }
    if (o->z && o->z->stage <= 2) DDP__TRY(ddp__zero_gather_weights(o->z));
    ddp__trace("optimizer step", DDP__TRACE_COMPUTE, t_start, ddp__now());
    return DDP_OK;
}

DDP__DEF long ddp_optim_steps(const ddp_optim* o) { return o->steps; }

DDP__DEF ddp_status ddp_optim_set_lr(ddp_optim* o, float lr) {
    if (!(lr >= 0.f) || lr > 1e30f)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_optim_set_lr: %g is not a learning rate (a finite number >= 0)",
                         lr);
    o->d.lr = lr;
    return DDP_OK;
}

/* ---- clipping by the global norm ----------------------------------------------------------------- */

/* A test's mutation: 1 makes each rank clip by the norm of the gradients it holds, the classic bug
   under ZeRO, so that the test can show it would catch it. */
DDP__PRIVATE int ddp__clip_local_only = 0;
/* Defined in >>sums: the sum of the squares of the gradient numbers this rank owns; the sum of
   every rank's x. */
DDP__PRIVATE ddp_status ddp__grad_sum_squares(ddp_optim* o, double* out);
DDP__PRIVATE ddp_status ddp__sum_double_over_ranks(ddp_optim* o, double* x);

DDP__DEF ddp_status ddp_optim_clip_grad_norm(ddp_optim* o, float max_norm, float* norm) {
    ddp_model* m = o->m;
    ddp__shards* z = o->z;
    double sq = 0, total;
    float coef;
    int i;
    if (norm) *norm = 0.f;
    if (!(max_norm > 0.f) || max_norm > 1e30f)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_optim_clip_grad_norm: max_norm %g must be a finite number > 0",
                         max_norm);
    /* Each rank adds up the squares of the numbers it owns (without ZeRO: all of them), so that
       across the ranks every number counts exactly once. */
    DDP__TRY(ddp__grad_sum_squares(o, &sq));
    total = sq;
    if (z && z->W > 1 && !ddp__clip_local_only) DDP__TRY(ddp__sum_double_over_ranks(o, &total));
    if (norm) *norm = (float)sqrt(total);
    coef = (float)(max_norm / (sqrt(total) + 1e-6));
    if (coef >= 1.f) return DDP_OK; /* PyTorch multiplies by min(coef, 1): by 1 changes nothing */
    for (i = 0; i < m->nparams; i++) {
        /* ZeRO-2 and -3: the shard this rank owns; otherwise every rank holds every averaged gradient */
        float* g = z && z->stage >= 2 ? (o->len[i] ? ddp__zero_g(z, i) : NULL) : m->params[i]->grad;
        size_t n = z && z->stage >= 2 ? o->len[i] : m->params[i]->count;
        if (g && n) DDP__TRY(ddp__scale(m, g, g, n, coef));
    }
    return DDP_OK;
}

DDP__DEF void ddp_optim_destroy(ddp_optim* o) {
    int i;
    if (!o) return;
    for (i = 0; i < o->m->nparams; i++) {
        ddp_free(o->m->device, o->state1[i]);
        ddp_free(o->m->device, o->state2[i]);
    }
    o->m->optim_state_bytes -= o->state_bytes;
    if (o->m->optim == o) o->m->optim = NULL;
    for (i = 0; i < 3; i++) ddp_free(o->m->device, o->full[i]);
    ddp_free(o->m->device, o->sq_dev);
    DDP_FREE(o->sq_host);
    ddp_free(o->m->device, o->norm_dev);
    DDP_FREE(o->norm_host);
    DDP_FREE(o);
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>snapshot: everything needed to resume, in a safetensors file                (chapters 1, 6)  */
/* ============================================================================================== */
#if DDP__DECLARE
/* A snapshot is the state a job needs to carry on exactly where it stopped. The file is in the
   safetensors format, so Python reads it in a few lines (TUTORIAL.md, chapter 6):
     8 bytes      little-endian length N of the JSON header
     N bytes      {"__metadata__":{...},"fc1.weight":{"dtype":"F32","shape":[64,13],
                  "data_offsets":[0,3328]},...}  padded with spaces to a multiple of 8
     the rest     the tensors' raw little-endian bytes, back to back
   Tensors: each parameter under its own name, and the optimizer's state under
   "optim.<param>.exp_avg", ".exp_avg_sq" (Adam, AdamW) or ".momentum_buffer" (SGD), PyTorch's
   names. The metadata (strings, as the format requires) holds the counters, the optimizer's kind
   and step count, the sampler's settings and epoch, the loader's position and the random
   generator, and "checksum": 16 hex digits of FNV-1a-64 over the whole file with those 16 digits
   written as zeros. The model has no buffers (no batch norm), so there are none to save.

   Only pointers that are set are saved; load restores what both the file and the struct have,
   and refuses a file whose parameters, optimizer or sampler do not match the struct's. */
typedef struct ddp_snapshot {
    ddp_model* model;     /* required */
    ddp_optim* optim;     /* optional: moments or momentum buffers, and the step count */
    ddp_sampler* sampler; /* optional: its epoch (seed, size and replicas are checked on load) */
    ddp_loader* loader;   /* optional: how far into which epoch; the next ddp_loader_start of that
                             epoch skips on (a save after an epoch's last batch: the next epoch
                             starts at its first batch). Without it a resumed epoch starts afresh */
    ddp_rng* rng;         /* optional: a generator the program draws from (the same on every rank) */
    int epoch;            /* the program's counters, saved and restored as they are */
    long step;
} ddp_snapshot;

/* Write s to `path`: a temporary file in the same folder, flushed and fsynced, then renamed over
   `path`, so a crash mid-write leaves the previous snapshot intact. Call it on one rank only
   (rank 0: every replica holds the same state). Save after the optimizer step, not between
   no_sync backward passes (gradients are not saved). With ZeRO-1, every rank first calls
   ddp_optim_consolidate(o, 0); the file is then the one DDP would write, and resumes on any number
   of ranks, sharded or not (DDP_ERR_STATE without that call). DDP_ERR_INVALID_ARGUMENT without a model,
   DDP_ERR_IO when the file cannot be written (the message names the path and the reason). */
DDP_API ddp_status ddp_snapshot_save(const ddp_snapshot* s, const char* path);
/* Read `path` into what s points to, and s->epoch/s->step. Under DDP, call it on every rank after
   ddp_wrap (whose broadcast of rank 0's initial weights would overwrite what was loaded) and after
   ddp_optim_create (a sharded optimizer, ZeRO, takes its own part of the state, and at
   zero_stage 3 of the weights too). Checks the whole file first (length, header, offsets,
   checksum, names, shapes, optimizer kind, sampler settings, the number of ranks) and changes
   nothing unless all of it
   matches: DDP_ERR_CHECKPOINT naming the first problem for a damaged, truncated or foreign file,
   or one of a job with another number of ranks; DDP_ERR_IO when it cannot be read (DDP_ERR_IO with
   errno ENOENT: no file). */
DDP_API ddp_status ddp_snapshot_load(ddp_snapshot* s, const char* path);
/* 1 if `path` exists (a snapshot to resume from), 0 if nothing is there (or path is NULL); -1
   when it cannot be checked (a symlink loop, a folder this user may not search): ddp_error_string()
   names the path and the reason, and a load would fail the same way. Also removes the temporary
   files that writers on this host killed mid-save left beside it. */
DDP_API int ddp_snapshot_exists(const char* path);

#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE void ddp__remove_stale_tmp(const char* path); /* >>files */
DDP__PRIVATE ddp_status ddp__write_atomic(const char* path, const unsigned char* data,
                                          size_t n); /* >>files */
DDP__PRIVATE ddp_status ddp__read_file(const char* path, size_t limit, char** out,
                                       size_t* size); /* >>files */

/* Saving builds the whole file in memory (header, then data), patches in the checksum and writes
   it atomically. Loading reads the whole file, parses the header into a table (ddp__st_parse,
   which never looks at a model and is what the fuzzer drives), checks the table against the
   snapshot struct, and only then copies into the model and the rest. */

/* A growable byte buffer for building the file in memory (>>files: ddp__put appends n bytes from
   src, or n bytes of room when src is NULL, for data that a copy from a GPU will fill). */
typedef struct ddp__bytes { unsigned char* p; size_t n, cap; int oom; } ddp__bytes;
DDP__PRIVATE void ddp__put(ddp__bytes* b, const void* src, size_t n); /* >>files */
DDP__PRIVATE void ddp__putf(ddp__bytes* b, const char* fmt, ...) DDP__PRINTF(2, 3); /* >>files */
/* Which tensors take no weight decay, as a metadata value (>>files). */
DDP__PRIVATE const char* ddp__no_decay_sig(const ddp_model* m, char* out, size_t n);

/* ---- the tensors a snapshot holds ---------------------------------------------------------------- */

static const char* const ddp__optim_names[] = {"none", "sgd", "adam", "adamw"};
#define DDP__ST_MAX_TENSORS (3 * DDP_MAX_PARAMS)

/* The i-th tensor of a snapshot of (m, o): parameters first, then each parameter's optimizer
   state. Writes its name, its device pointer, and the parameter it belongs to (whose shape and
   count it has); 0 past the end. */
DDP__PRIVATE int ddp__st_tensor_at(ddp_model* m, ddp_optim* o, int i, char* name, size_t nn, float** data,
                                   const ddp_param** owner) {
    int per = 0, k;
    if (i < m->nparams) {
        snprintf(name, nn, "%s", m->params[i]->name);
        *data = m->params[i]->data;
        if (!*data && o && o->full[2]) *data = o->full[2] + ddp__flat_offset(m, i); /* ZeRO-3, consolidated */
        *owner = m->params[i];
        return 1;
    }
    i -= m->nparams;
    if (o) per = ddp__optim_nstate(o);
    if (per == 0 || i >= per * m->nparams) return 0;
    k = i / per;
    if (o->d.kind == DDP_SGD) snprintf(name, nn, "optim.%s.momentum_buffer", m->params[k]->name);
    else snprintf(name, nn, "optim.%s.%s", m->params[k]->name, i % per ? "exp_avg_sq" : "exp_avg");
    *data = i % per ? o->state2[k] : o->state1[k];
    if (o->z) /* ZeRO: the consolidated copy (NULL on a rank without one), all of the tensor */
        *data = o->full[i % per] ? o->full[i % per] + ddp__flat_offset(m, k) : NULL;
    *owner = m->params[k];
    return 1;
}

DDP__DEF int ddp_snapshot_exists(const char* path) {
    struct stat st;
    if (!path) return 0;
    ddp__remove_stale_tmp(path); /* a run is starting: a torn save of an earlier one is garbage */
    if (stat(path, &st) == 0) return 1;
    if (errno == ENOENT) return 0;
    /* Only absence means "no snapshot": a symlink loop or a folder we may not search would
       otherwise train from step 0 without a word, then fail (or replace the link) at the save. */
    ddp__fail(DDP_ERR_IO, "cannot tell whether the snapshot %s exists: %s. Fix the path or its folder's "
              "permissions (or remove it to start afresh)", path, strerror(errno));
    return -1;
}

DDP__DEF ddp_status ddp_snapshot_save(const ddp_snapshot* s, const char* path) {
    ddp__bytes b;
    ddp_model* m;
    char name[96];
    float* data;
    const ddp_param* p;
    size_t off = 0, hdr_start, cs_at = 0;
    int i, k, okind;
    ddp_status st = DDP_OK;
    if (!s || !s->model || !path)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_snapshot_save: %s is NULL", !path ? "path" : "the model");
    /* A sharded state is saved by the rank it was consolidated onto, before the next step. */
    if (s->optim && s->optim->z && (ddp__optim_nstate(s->optim) > 0 || s->optim->z->stage == 3) &&
        (!s->optim->consolidated || !s->optim->full[ddp__optim_nstate(s->optim) > 0 ? 0 : 2])) {
        const int me = s->optim->z->rank, onto = s->optim->consolidated - 1;
        if (onto >= 0 && onto != me) { /* consolidated this step, onto another rank */
            ddp__fail(DDP_ERR_STATE, "ddp_snapshot_save: the optimizer's state was consolidated onto rank %d, so "
                      "this rank (%d) holds only its shard of it", onto, me);
            ddp__err_fix = "save on the rank the state was consolidated onto (ddp_optim_consolidate's `to`), or "
                           "consolidate onto the rank that saves";
            return DDP_ERR_STATE;
        }
        ddp__fail(DDP_ERR_STATE, "ddp_snapshot_save: the optimizer's state is sharded over the ranks (zero_stage %d) "
                  "and this rank holds only its shard: call ddp_optim_consolidate(o, %d) on every rank right before "
                  "this save, after the last step", s->optim->z->stage, me);
        ddp__err_fix = "with ZeRO, a save is: ddp_optim_consolidate(o, r) on every rank, then ddp_snapshot_save on "
                       "rank r, with no optimizer step between them";
        return DDP_ERR_STATE;
    }
    m = s->model;
    for (i = 0; i < m->nparams; i++)
        if (!m->params[i]->data && !(s->optim && s->optim->full[2]))
            return ddp__fail(DDP_ERR_STATE, "ddp_snapshot_save: the weights are sharded over the ranks (zero_stage 3): "
                             "put the optimizer in the snapshot and call ddp_optim_consolidate(o, this rank) on every "
                             "rank first, or gather them with ddp_full_params(w, 1)");
    okind = s->optim ? (int)s->optim->d.kind : 0;
    memset(&b, 0, sizeof b);
    ddp__put(&b, "\0\0\0\0\0\0\0\0", 8); /* the header's length, filled in below */
    hdr_start = b.n;
    ddp__putf(&b, "{\"__metadata__\":{\"format\":\"ddp.h snapshot 1\",\"epoch\":\"%d\",\"step\":\"%ld\"", s->epoch,
              s->step);
    ddp__putf(&b, ",\"optimizer\":\"%s\",\"optimizer_steps\":\"%ld\"", ddp__optim_names[okind],
              s->optim ? s->optim->steps : 0L);
    if (s->optim) { /* its settings, as PyTorch's param_groups, and which tensors take no decay */
        const ddp_optim_desc* d = &s->optim->d;
        ddp__putf(&b, ",\"lr\":\"%.9g\",\"betas\":\"%.9g %.9g\",\"eps\":\"%.9g\",\"weight_decay\":\"%.9g\","
                      "\"momentum\":\"%.9g\",\"no_decay\":\"%s\"", d->lr, d->beta1, d->beta2, d->eps, d->weight_decay,
                  d->momentum, ddp__no_decay_sig(m, name, sizeof name));
    }
    if (s->sampler)
        ddp__putf(&b, ",\"sampler_n\":\"%d\",\"sampler_replicas\":\"%d\",\"sampler_seed\":\"%llu\","
                      "\"sampler_shuffle\":\"%d\",\"sampler_drop_last\":\"%d\",\"sampler_epoch\":\"%d\"",
                  s->sampler->n, s->sampler->num_replicas, (unsigned long long)s->sampler->seed,
                  s->sampler->shuffle, s->sampler->drop_last, s->sampler->epoch);
    /* A position loaded but not yet used (no ddp_loader_start since) is still the position. The
       epoch it belongs to goes with it: a resumed loader starts at the position only in that epoch. */
    if (s->loader) {
        const ddp_loader* l = s->loader;
        ddp__putf(&b, ",\"loader_position\":\"%d\",\"loader_epoch\":\"%d\"", l->resume ? l->resume_pos : l->pos,
                  l->resume == 1 ? l->resume_epoch : l->resume && s->sampler ? s->sampler->epoch : l->epoch);
    }
    if (s->rng) ddp__putf(&b, ",\"rng\":\"%016llx\"", (unsigned long long)s->rng->state);
    ddp__putf(&b, ",\"checksum\":\"");
    cs_at = b.n;
    ddp__putf(&b, "0000000000000000\"}");
    for (i = 0; ddp__st_tensor_at(m, s->optim, i, name, sizeof name, &data, &p); i++) {
        ddp__putf(&b, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", name);
        for (k = 0; k < p->ndim; k++) ddp__putf(&b, "%s%d", k ? "," : "", p->shape[k]);
        ddp__putf(&b, "],\"data_offsets\":[%zu,%zu]}", off, off + p->count * sizeof(float));
        off += p->count * sizeof(float);
    }
    ddp__put(&b, "}", 1);
    while ((b.n - hdr_start) % 8) ddp__put(&b, " ", 1); /* the data starts 8-byte aligned */
    if (!b.oom) {
        uint64_t len = b.n - hdr_start;
        for (i = 0; i < 8; i++) b.p[i] = (unsigned char)(len >> (8 * i));
    }
    st = ddp_stream_sync(m->stream); /* the weights are final only once the GPU is done */
    for (i = 0; st == DDP_OK && !b.oom && ddp__st_tensor_at(m, s->optim, i, name, sizeof name, &data, &p); i++) {
        size_t at = b.n, nb = p->count * sizeof(float);
        /* GPU memory cannot be read by the host: room for it, filled by a copy */
        ddp__put(&b, m->device.type == DDP_DEVICE_CPU ? data : NULL, nb);
        if (!b.oom && m->device.type != DDP_DEVICE_CPU) st = ddp_copy(ddp__cpu(), b.p + at, m->device, data, nb, NULL);
    }
    if (b.oom && st == DDP_OK) st = ddp__fail(DDP_ERR_OUT_OF_MEMORY, "building the snapshot in memory failed");
    if (st == DDP_OK) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ddp__fnv1a(b.p, b.n));
        memcpy(b.p + cs_at, hex, 16);
        st = ddp__write_atomic(path, b.p, b.n);
    }
    if (b.p) DDP_FREE(b.p);
    return st;
}

/* ---- reading: the header parser ----------------------------------------------------------------- */

typedef struct ddp__st_tensor {
    char name[96];
    char dtype[8];
    int ndim;
    uint64_t shape[4];
    uint64_t begin, end; /* byte offsets into the data section */
    int used;            /* matched by the loader */
} ddp__st_tensor;

typedef struct ddp__st_meta { char key[32]; char val[64]; } ddp__st_meta;

typedef struct ddp__st {
    ddp__st_tensor t[DDP__ST_MAX_TENSORS];
    int nt;
    ddp__st_meta meta[32];
    int nmeta;
    size_t data_off;     /* where the data section starts in the file */
    size_t checksum_at;  /* where the checksum's 16 digits are in the file; 0 if absent */
} ddp__st;
/* Parse a whole file's header into *st (>>files); DDP_ERR_CHECKPOINT naming the first problem. */
DDP__PRIVATE ddp_status ddp__st_parse(const unsigned char* buf, size_t size, const char* what, ddp__st* st);
/* A metadata value (>>files), or NULL when absent; and one as a whole number in [lo, hi] (0, after
   setting the error, if absent or bad). */
DDP__PRIVATE const char* ddp__st_get(const ddp__st* st, const char* key);
DDP__PRIVATE int ddp__st_num(const ddp__st* st, const char* what, const char* key, long long lo, long long hi,
                             long long* out);

/* ---- reading: checking the file against the snapshot struct, then loading ------------------------- */

DDP__DEF ddp_status ddp_snapshot_load(ddp_snapshot* s, const char* path) {
    unsigned char* buf = NULL;
    ddp__st* st = NULL;
    ddp_model* m;
    size_t size;
    char name[96], hex[17];
    float* data;
    const ddp_param* p;
    const char* v;
    long long epoch = 0, step = 0, osteps = 0, pos = 0, x = 0, pos_epoch = 0;
    int pos_epoch_known = 0, have_settings = 0;
    double settings[6];
    uint64_t rng = 0;
    int i, k, okind = 0;
    int match[DDP__ST_MAX_TENSORS]; /* match[i]: where the i-th tensor the struct needs is in st->t */
    ddp_status r = DDP_OK;
    if (!s || !s->model || !path)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_snapshot_load: %s is NULL", !path ? "path" : "the model");
    if (s->loader && !s->loader->data)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_snapshot_load: initialise the loader (ddp_loader_init) first");
    m = s->model;
    ddp__remove_stale_tmp(path);
    DDP__TRY(ddp__read_file(path, DDP_MAX_DATA_FILE * 4, (char**)&buf, &size));
    st = (ddp__st*)ddp__malloc(sizeof *st);
    if (!st) { DDP_FREE(buf); return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "ddp_snapshot_load: no memory"); }
#define DDP__ST_BAD(...) do { r = ddp__fail(DDP_ERR_CHECKPOINT, __VA_ARGS__); goto done; } while (0)
#define DDP__ST_NUM(key, lo, hi, out) do { if (!ddp__st_num(st, path, key, lo, hi, out)) { r = DDP_ERR_CHECKPOINT; goto done; } } while (0)
    if ((r = ddp__st_parse(buf, size, path, st)) != DDP_OK) goto done;
    v = ddp__st_get(st, "format");
    if (!v || strcmp(v, "ddp.h snapshot 1") != 0)
        DDP__ST_BAD("%s is a safetensors file but not a ddp.h snapshot (metadata \"format\" is %s%s%s)", path,
                    v ? "\"" : "", v ? v : "missing", v ? "\"" : "");
    /* the checksum: FNV-1a over the file with its own 16 digits read as zeros */
    if (!st->checksum_at || strlen(ddp__st_get(st, "checksum")) != 16)
        DDP__ST_BAD("%s: the metadata lacks its 16-digit \"checksum\"", path);
    memcpy(hex, buf + st->checksum_at, 16);
    hex[16] = 0;
    memset(buf + st->checksum_at, '0', 16);
    {
        char want[17];
        snprintf(want, sizeof want, "%016llx", (unsigned long long)ddp__fnv1a(buf, size));
        memcpy(buf + st->checksum_at, hex, 16);
        if (strcmp(want, hex) != 0)
            DDP__ST_BAD("%s is damaged: its checksum is %s, its bytes give %s (a flipped bit, or an edited file)", path,
                        hex, want);
    }
    DDP__ST_NUM("epoch", INT_MIN, INT_MAX, &epoch);
    DDP__ST_NUM("step", LONG_MIN, LONG_MAX, &step);
    DDP__ST_NUM("optimizer_steps", 0, LONG_MAX, &osteps);
    if (s->optim && (v = ddp__st_get(st, "no_decay")) != NULL && strcmp(v, ddp__no_decay_sig(m, name, sizeof name)))
        DDP__ST_BAD("%s was taken with weight decay off for other tensors (%s; this model: %s): the parameter groups "
                    "differ, so the optimizer would not resume the run that wrote it", path, v, name);
    if (s->optim && ddp__st_get(st, "lr")) { /* older files have no settings: the optimizer's stay */
        const char* keys[4] = {"lr", "eps", "weight_decay", "momentum"};
        for (k = 0; k < 4; k++) {
            char* end;
            v = ddp__st_get(st, keys[k]);
            settings[k] = v ? strtod(v, &end) : -1;
            if (!v || end == v || *end || !(settings[k] >= 0) || settings[k] > 1e30)
                DDP__ST_BAD("%s: metadata \"%s\" is not a number >= 0", path, keys[k]);
        }
        v = ddp__st_get(st, "betas");
        if (!v || sscanf(v, "%lf %lf", &settings[4], &settings[5]) != 2 || !(settings[4] >= 0 && settings[4] < 1) ||
            !(settings[5] >= 0 && settings[5] < 1))
            DDP__ST_BAD("%s: metadata \"betas\" is not two numbers in [0, 1)", path);
        have_settings = 1;
    }
    v = ddp__st_get(st, "optimizer");
    for (okind = 0; v && okind < 4 && strcmp(v, ddp__optim_names[okind]); okind++) {}
    if (!v || okind == 4) DDP__ST_BAD("%s: metadata \"optimizer\" is %s", path, v ? v : "missing");
    if (s->optim && okind != (int)s->optim->d.kind)
        DDP__ST_BAD("%s holds %s state, but the optimizer is %s: resume with the same optimizer", path,
                    okind ? ddp__optim_names[okind] : "no optimizer", ddp__optim_names[s->optim->d.kind]);
    /* every tensor the struct needs, with its shape; nothing the struct cannot take */
    for (i = 0; ddp__st_tensor_at(m, okind ? s->optim : NULL, i, name, sizeof name, &data, &p); i++) {
        ddp__st_tensor* t = NULL;
        for (k = 0; k < st->nt; k++)
            if (!strcmp(st->t[k].name, name)) { t = &st->t[k]; match[i] = k; break; }
        if (!t) DDP__ST_BAD("%s has no tensor \"%s\": it was written by another model%s", path, name,
                            i >= m->nparams ? " or optimizer" : "");
        int same = t->ndim == p->ndim;
        for (k = 0; k < p->ndim && same; k++) same = t->shape[k] == (uint64_t)p->shape[k];
        if (!same) {
            char fs[64], ms[64];
            int n = snprintf(fs, sizeof fs, "[");
            for (k = 0; k < t->ndim && n < 40; k++)
                n += snprintf(fs + n, sizeof fs - (size_t)n, "%s%llu", k ? ", " : "", (unsigned long long)t->shape[k]);
            snprintf(fs + n, sizeof fs - (size_t)n, "]");
            n = snprintf(ms, sizeof ms, "[");
            for (k = 0; k < p->ndim; k++) n += snprintf(ms + n, sizeof ms - (size_t)n, "%s%d", k ? ", " : "", p->shape[k]);
            snprintf(ms + n, sizeof ms - (size_t)n, "]");
            DDP__ST_BAD("%s: %s has shape %s, the model's is %s: another model's snapshot", path, name, fs, ms);
        }
        t->used = 1;
        { /* numbers a run can only go on from to NaN: refused here, naming the tensor, not found
             steps later as a NaN loss (PyTorch loads them; its checksum-free files have no other check) */
            const unsigned char* from = buf + st->data_off + t->begin;
            size_t e, count = (size_t)p->count;
            float f = 0;
            int sq = i >= m->nparams && strstr(name, ".exp_avg_sq") != NULL;
            for (e = 0; e < count; e++) {
                memcpy(&f, from + e * sizeof f, sizeof f);
                if (!isfinite(f) || (sq && f < 0)) break;
            }
            if (e < count)
                DDP__ST_BAD("%s: %s[%lu] is %g%s: the run that wrote it had diverged, or the file was edited. Resume "
                            "from an earlier snapshot (and look for the step where the loss became nan)", path, name,
                            (unsigned long)e, (double)f, sq && isfinite(f) ? " (a second moment below zero)" : "");
        }
    }
    for (k = 0; k < st->nt; k++)
        if (!st->t[k].used && (s->optim || strncmp(st->t[k].name, "optim.", 6) != 0))
            DDP__ST_BAD("%s holds tensor \"%s\", which this model%s does not have: another model's snapshot", path,
                        st->t[k].name, strncmp(st->t[k].name, "optim.", 6) ? "" : "'s optimizer");
    if (s->sampler) {
        const ddp_sampler* sp = s->sampler;
        long long n, reps, shuffle, drop;
        DDP__ST_NUM("sampler_n", 0, INT_MAX, &n);
        DDP__ST_NUM("sampler_replicas", 1, INT_MAX, &reps);
        DDP__ST_NUM("sampler_shuffle", 0, 1, &shuffle);
        DDP__ST_NUM("sampler_drop_last", 0, 1, &drop);
        DDP__ST_NUM("sampler_epoch", INT_MIN, INT_MAX, &x);
        v = ddp__st_get(st, "sampler_seed");
        if (!v || !*v || strspn(v, "0123456789") != strlen(v) || strlen(v) > 20)
            DDP__ST_BAD("%s: metadata \"sampler_seed\" is not a whole number", path);
        if (n != sp->n || shuffle != sp->shuffle || drop != sp->drop_last || strtoull(v, NULL, 10) != sp->seed)
            DDP__ST_BAD("%s was taken with a sampler over %lld samples (shuffle %lld, drop_last %lld, seed %s); this "
                        "one is over %d (shuffle %d, drop_last %d, seed %llu): not the same data or settings",
                        path, n, shuffle, drop, v ? v : "?", sp->n, sp->shuffle, sp->drop_last,
                        (unsigned long long)sp->seed);
        /* Each rank's share of every epoch depends on the number of ranks: a run resumed with
           another number trains on other batches than the run that wrote the file. */
        if (reps != sp->num_replicas)
            DDP__ST_BAD("%s was taken by a job of %lld rank%s; this job has %d rank%s, so each rank's share of the "
                        "data (and the training from here on) would differ from that run's. Resume with %lld rank%s, "
                        "or leave snap.sampler and snap.loader NULL to carry on deliberately with %d (the epoch "
                        "then starts afresh)", path, reps, reps == 1 ? "" : "s", sp->num_replicas,
                        sp->num_replicas == 1 ? "" : "s", reps, reps == 1 ? "" : "s", sp->num_replicas);
        pos_epoch = x, pos_epoch_known = 1;
    }
    if (s->loader) {
        DDP__ST_NUM("loader_position", 0, INT_MAX, &pos);
        if (ddp__st_get(st, "loader_epoch")) { /* older files name only the sampler's epoch */
            DDP__ST_NUM("loader_epoch", INT_MIN, INT_MAX, &pos_epoch);
            pos_epoch_known = 1;
        } else if (!pos_epoch_known && ddp__st_get(st, "sampler_epoch")) {
            DDP__ST_NUM("sampler_epoch", INT_MIN, INT_MAX, &pos_epoch);
            pos_epoch_known = 1;
        }
    }
    if (s->rng) {
        char* end;
        v = ddp__st_get(st, "rng");
        if (!v) DDP__ST_BAD("%s: the metadata lacks \"rng\"", path);
        if (strlen(v) != 16 || strspn(v, "0123456789abcdef") != 16)
            DDP__ST_BAD("%s: metadata \"rng\" is not 16 lower-case hex digits", path);
        rng = (uint64_t)strtoull(v, &end, 16);
    }
#undef DDP__ST_BAD
#undef DDP__ST_NUM
    /* Everything checked: only now change the model and the rest. A sharded optimizer (ZeRO) takes
       from each state tensor only this rank's part, and at zero_stage 3 so do the weights, so a
       file that N ranks wrote resumes on any number of ranks. */
    for (i = 0; r == DDP_OK && ddp__st_tensor_at(m, okind ? s->optim : NULL, i, name, sizeof name, &data, &p); i++) {
        const unsigned char* from = buf + st->data_off + st->t[match[i]].begin;
        if (i < m->nparams && !m->params[i]->data && m->zero) { /* zero_stage 3: into this rank's shard */
            const ddp__shards* z = m->zero;
            if (z->len[i])
                r = ddp_copy(m->device, ddp__zero_w(z, i), ddp__cpu(), from + z->first[i] * sizeof(float),
                             z->len[i] * sizeof(float), NULL);
        } else if (i >= m->nparams && s->optim->z) {
            int per = ddp__optim_nstate(s->optim), k = (i - m->nparams) / per;
            float* to = (i - m->nparams) % per ? s->optim->state2[k] : s->optim->state1[k];
            if (s->optim->len[k])
                r = ddp_copy(m->device, to, ddp__cpu(), from + s->optim->first[k] * sizeof(float),
                             s->optim->len[k] * sizeof(float), NULL);
        } else {
            r = ddp_copy(m->device, data, ddp__cpu(), from, p->count * sizeof(float), NULL);
        }
    }
    if (r != DDP_OK) goto done;
    if (s->optim) s->optim->steps = (long)osteps;
    if (s->optim && have_settings) {
        ddp_optim_desc* d = &s->optim->d;
        d->lr = (float)settings[0], d->eps = (float)settings[1], d->weight_decay = (float)settings[2];
        d->momentum = (float)settings[3], d->beta1 = (float)settings[4], d->beta2 = (float)settings[5];
    }
    if (s->sampler) ddp_sampler_set_epoch(s->sampler, (int)x);
    if (s->loader) {
        ddp_loader* l = s->loader;
        l->resume_pos = (int)pos, l->resume_epoch = (int)pos_epoch, l->resume = pos_epoch_known ? 1 : 2;
        l->last_epoch = 0; /* a resumed epoch is no repeat */
    }
    if (s->rng) s->rng->state = rng;
    s->epoch = (int)epoch;
    s->step = (long)step;
done:
    DDP_FREE(st);
    DDP_FREE(buf);
    return r;
}

#endif /* DDP__IMPLEMENT */

/* ############################################################################################## */
/*                                                                                                */
/*  PART II: THE MACHINERY. What makes Part I fast or portable, plugged in through the backend   */
/*  table of >>pg and the functions Part I names. Its sections:                                   */
/*                                                                                                */
/*      >>trace     the timeline DDP_TRACE writes                                                 */
/*      >>cuda      the CUDA runtime: probing the GPUs, streams, events                           */
/*      >>kernels   GPU kernels compiled at run time by NVRTC; cuBLAS; the CPU matrix product     */
/*      >>buffers   the two buffers ZeRO's gathered layers and their gradients take turns in      */
/*      >>store     the rendezvous store: sockets, its server, its client (declared in >>pg)      */
/*      >>signals   who has joined; the flight record; desync checks; the watchdog; ddp_init     */
/*      >>sums      element-wise sums, four floats at a time (the ring, shm, the reducer)         */
/*      >>shm       the shared-memory transport between the ranks of one machine                  */
/*      >>cpu       the CPU backend: its communication thread, queue and ring connections         */
/*      >>mpi       the MPI backend (-DDDP_MPI)                                                   */
/*      >>bind      keeping each rank on its own cores                                            */
/*      >>files     file formats: CSV rows, the safetensors header, atomic writes                 */
/*      >>slurm     SLURM's compressed node lists (>>launch reads SLURM_JOB_NODELIST)             */
/*      >>gpus      which GPU is whose: ranks that share one, the nccl backend's check            */
/*      >>spawn     spawning ranks, supervising them, the guardian                                */
/*                                                                                                */
/*  Its tuning variables (read at run time; a value that cannot be used is named in a warning):  */
/*      DDP_TRANSPORT=auto|shm|tcp  how the CPU backend moves data: shared memory when every rank */
/*                          is on this host (auto, the default), else the TCP ring; shm fails     */
/*                          when it cannot be used, tcp always takes the ring.                    */
/*      DDP_SHM_CHUNK_BYTES     bytes per rank and chunk in the shared-memory segment (1 MiB).    */
/*      DDP_SHM_SPIN_US         how long a shared-memory wait on the communication thread spins   */
/*                              before it sleeps (20; a blocking call on the caller's thread      */
/*                              spins 500 times longer; 0 when there are more local ranks than    */
/*                              cores).                                                           */
/*      DDP_SHM_STREAM_BYTES    all-reduces this large write their result past the caches        */
/*                              (32 MiB).                                                         */
/*      DDP_SHM_SLOT_STREAM_BELOW  all-reduces smaller than this write their shared-memory slots  */
/*                              past the caches, which the reading core fetches faster (512 KiB;  */
/*                              0: never).                                                        */
/*      DDP_SHM_ONE_STEP_BYTES  all-reduces up to this size, on 3 ranks or more, take one step     */
/*                              through shared memory instead of two phases (0, the default: never). */
/*      DDP_ALGO=auto|ring|doubling  the TCP all-reduce on 3 ranks or more: recursive doubling for    */
/*                              small buffers, the ring for large ones, chosen by the cost model  */
/*                              (auto, the default); ring or doubling forces one (doubling up to  */
/*                              one piece, DDP_RING_PIECE_BYTES).                                 */
/*      DDP_BIND=core|none      ranks on one machine each keep to their own share of its cores    */
/*                              (Linux; core, the default, when there is a core per local rank;   */
/*                              a set of CPUs a launcher gave one rank alone is kept whole).      */
/*      DDP_RING_PIECE_BYTES    size of the pieces the CPU ring pipelines (1 MiB).                */
/*                                                                                                */
/* ############################################################################################## */

/* ============================================================================================== */
/* >>trace: the timeline DDP_TRACE writes                                           (chapter 10)  */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* ---- the trace (DDP_TRACE=prefix) ----------------------------------------------------------------- */
/* With DDP_TRACE set, every forward, every layer's backward, every collective, the wait at the end
   of backward and every optimizer step is recorded, and prefix.rank<R>.json is written when the
   process group is destroyed (or at exit without one): Chrome's trace-event format, which
   Perfetto (ui.perfetto.dev) and chrome://tracing draw as a timeline, one row for computation and
   one for communication, so the overlap of the two can be seen. */
typedef struct ddp__tev { char name[48]; int tid; double t0, t1; } ddp__tev;
DDP__PRIVATE struct {
    pthread_once_t once;
    int state; /* 0: DDP_TRACE not read yet, 1: off, 2: on */
    char prefix[512];
    ddp__tev* ev;
    size_t n, cap;
    double origin;
    pthread_mutex_t lock;
} ddp__tr = {PTHREAD_ONCE_INIT, 0, "", NULL, 0, 0, 0, PTHREAD_MUTEX_INITIALIZER};

DDP__PRIVATE void ddp__trace_write(void);
static void ddp__trace_atexit(void) { ddp__trace_write(); }

/* Read DDP_TRACE once per process, whichever thread (training or communication) asks first. */
static void ddp__trace_init(void) {
    const char* v = getenv("DDP_TRACE");
    if (v && *v) {
        snprintf(ddp__tr.prefix, sizeof ddp__tr.prefix, "%s", v);
        ddp__tr.origin = ddp__now();
        atexit(ddp__trace_atexit);
    }
    ddp__tr.state = (v && *v) ? 2 : 1;
}

DDP__PRIVATE int ddp__trace_on(void) {
    pthread_once(&ddp__tr.once, ddp__trace_init);
    return ddp__tr.state == 2;
}

/* Record one span [t0, t1] (seconds of ddp__now) on a row; cheap no-op when tracing is off. */
DDP__PRIVATE void ddp__trace(const char* name, int tid, double t0, double t1) {
    ddp__tev* e;
    if (!ddp__trace_on()) return;
    pthread_mutex_lock(&ddp__tr.lock);
    if (ddp__tr.n == ddp__tr.cap) {
        size_t cap = ddp__tr.cap ? 2 * ddp__tr.cap : 4096;
        ddp__tev* grown = (ddp__tev*)ddp__malloc(cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&ddp__tr.lock);
            return;
        }
        if (ddp__tr.n) memcpy(grown, ddp__tr.ev, ddp__tr.n * sizeof *grown);
        if (ddp__tr.ev) DDP_FREE(ddp__tr.ev);
        ddp__tr.ev = grown;
        ddp__tr.cap = cap;
    }
    e = &ddp__tr.ev[ddp__tr.n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->tid = tid, e->t0 = t0, e->t1 = t1;
    pthread_mutex_unlock(&ddp__tr.lock);
}

/* Write and forget the events recorded so far (a rank writes its own file). */
DDP__PRIVATE void ddp__trace_write(void) {
    char path[600];
    FILE* f;
    size_t i;
    if (ddp__tr.state != 2) return;
    pthread_mutex_lock(&ddp__tr.lock);
    if (ddp__tr.n == 0) {
        pthread_mutex_unlock(&ddp__tr.lock);
        return;
    }
    snprintf(path, sizeof path, "%s.rank%d.json", ddp__tr.prefix, ddp__g.rank);
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
        fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}},\n",
                ddp__g.rank, ddp__g.rank);
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": "
                "\"compute\"}},\n", ddp__g.rank);
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 2, \"args\": {\"name\": "
                "\"communication\"}}", ddp__g.rank);
        for (i = 0; i < ddp__tr.n; i++) {
            const ddp__tev* e = &ddp__tr.ev[i];
            fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f}",
                    e->name, ddp__g.rank, e->tid, (e->t0 - ddp__tr.origin) * 1e6, (e->t1 - e->t0) * 1e6);
        }
        fprintf(f, "\n]}\n");
        fclose(f);
        ddp__log(DDP_LOG_INFO, "trace: wrote %zu events to %s (open it in ui.perfetto.dev)", ddp__tr.n, path);
    } else {
        ddp__log(DDP_LOG_WARN, "trace: cannot write %s: %s", path, strerror(errno));
    }
    ddp__tr.n = 0;
    pthread_mutex_unlock(&ddp__tr.lock);
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>cuda: the CUDA runtime: probing, streams, events                                             */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* The CUDA probe runs once per process: asking the runtime is slow the first time, and its
   answer (no driver, no device) does not change while we run. */
static struct {
    pthread_once_t once;
    int count;
    int driver_too_old; /* a driver is there, but older than this program's CUDA runtime */
    char reason[320];
} ddp__cuda_probe_state = {PTHREAD_ONCE_INIT, 0, 0, {0}};

static void ddp__cuda_probe(void) {
#if DDP__CUDA
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0 &&
            cudaRuntimeGetVersion(&rt) == cudaSuccess) {
            /* CUDA versions are 1000 * major + 10 * minor */
            ddp__cuda_probe_state.driver_too_old = 1;
            snprintf(ddp__cuda_probe_state.reason, sizeof ddp__cuda_probe_state.reason,
                     "the NVIDIA driver here supports CUDA %d.%d, older than the CUDA %d.%d this program was built "
                     "with: update the driver (CUDA 13 needs driver R580 or later; nvidia-smi shows the version), or "
                     "build with a CUDA toolkit no newer than %d.%d (make CUDA_HOME=...)", drv / 1000, drv % 1000 / 10,
                     rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
        } else if (e == cudaErrorInsufficientDriver)
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

/* Number of usable CUDA devices; 0 with no GPU, no driver, or DDP_NO_CUDA. Never fails. */
DDP__PRIVATE int ddp__cuda_device_count(void) {
    pthread_once(&ddp__cuda_probe_state.once, ddp__cuda_probe);
    return ddp__cuda_probe_state.count;
}
/* 1 when a driver is there but older than this program's CUDA runtime (a surprise worth a warning). */
DDP__PRIVATE int ddp__cuda_driver_too_old(void) {
    return ddp__cuda_device_count() == 0 && ddp__cuda_probe_state.driver_too_old;
}
/* Why ddp__cuda_device_count() is 0, in plain words ("" when it is not). Never NULL. */
DDP__PRIVATE const char* ddp__cuda_unavailable_reason(void) {
    return ddp__cuda_device_count() > 0 ? "" : ddp__cuda_probe_state.reason;
}

/* Create a stream on `d`. DDP_ERR_CUDA on failure. */
DDP__PRIVATE ddp_status ddp__stream_create(ddp_device d, ddp_stream** out) {
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

/* Destroy a stream (waits for its work first). NULL is ignored. */
DDP__PRIVATE void ddp__stream_destroy(ddp_stream* s) {
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

/* The cudaStream_t behind `s` as void* (NULL on the CPU): an escape hatch for your own kernels. */
DDP__PRIVATE void* ddp__stream_native(ddp_stream* s) {
#if DDP__CUDA
    if (s && s->dev.type == DDP_DEVICE_CUDA) return (void*)s->s;
#else
    (void)s;
#endif
    return NULL;
}

/* Create an event on `d`. DDP_ERR_CUDA on failure. */
DDP__PRIVATE ddp_status ddp__event_create(ddp_device d, ddp_event** out) {
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

/* Destroy an event. NULL is ignored. */
DDP__PRIVATE void ddp__event_destroy(ddp_event* e) {
    if (!e) return;
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA) cudaEventDestroy(e->e);
#endif
    DDP_FREE(e);
}

/* Mark the current end of stream `s` with `e`. DDP_ERR_CUDA on failure. */
DDP__PRIVATE ddp_status ddp__event_record(ddp_event* e, ddp_stream* s) {
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA) DDP__CU(cudaEventRecord(e->e, s ? s->s : 0));
#else
    (void)e;
    (void)s;
#endif
    return DDP_OK;
}

/* Make later work on `s` wait until `e` has happened, without blocking the host. */
DDP__PRIVATE ddp_status ddp__stream_wait_event(ddp_stream* s, ddp_event* e) {
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA && s && s->dev.type == DDP_DEVICE_CUDA)
        DDP__CU(cudaStreamWaitEvent(s->s, e->e, 0));
#else
    (void)e;
    (void)s;
#endif
    return DDP_OK;
}

/* Block the host until `e` has happened. DDP_ERR_CUDA on failure. */
DDP__PRIVATE ddp_status ddp__event_sync(ddp_event* e) {
#if DDP__CUDA
    if (e->dev.type == DDP_DEVICE_CUDA) DDP__CU(cudaEventSynchronize(e->e));
#else
    (void)e;
#endif
    return DDP_OK;
}

/* *done = 1 if `e` has happened, else 0, without blocking. DDP_ERR_CUDA on failure. */
DDP__PRIVATE ddp_status ddp__event_query(ddp_event* e, int* done) {
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
#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>kernels: GPU kernels compiled at run time by NVRTC; cuBLAS and CPU matrix products           */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/*
   Why NVRTC: the kernels below are CUDA C source in a string, compiled when a program first
   uses a GPU. A student's file therefore stays plain C built by `cc` (no nvcc, no second
   compilation unit, no build-system knowledge), and because NVRTC compiles to PTX without a GPU
   or driver, `make test` proves on any machine that every kernel compiles
   (ddp__kernels_compile_ptx). The cost is a compile of a few hundred milliseconds at the first
   GPU use, paid once per process and device. Kernels are launched through the runtime API
   (cudaLibraryLoadData + cudaLaunchKernel), so a program links against cudart and never against
   libcuda directly: the same binary starts, and runs on the CPU, on a machine without a driver.
   Every kernel is a grid-stride loop so that any launch size covers any element count.
*/

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
    /* dtype conversions: the text of DDP__CONVERSIONS (>>device), the CPU's own code */
    "#define DDP__ON_GPU __device__\n"
    "__device__ unsigned ddp__bits(float f) { return __float_as_uint(f); }\n"
    "__device__ float ddp__flt(unsigned u) { return __uint_as_float(u); }\n"
    "__device__ float ddp__add_half(float a) { return __fadd_rn(a, 0.5f); }\n",
    DDP__XSTR(DDP__CONVERSIONS(DDP__ON_GPU)) "\n", /* DDP__ON_GPU: a name no host header defines */
    "extern \"C\" __global__ void ddp_k_f32_to_f16(const float* s, unsigned short* d, long long n) {\n"
    "  GRID_LOOP(i, n) d[i] = ddp__cv_f32_to_f16(__float_as_uint(s[i])); }\n",
    "extern \"C\" __global__ void ddp_k_f16_to_f32(const unsigned short* s, float* d, long long n) {\n"
    "  GRID_LOOP(i, n) d[i] = ddp__cv_f16_to_f32(s[i]); }\n",
    "extern \"C\" __global__ void ddp_k_f32_to_bf16(const float* s, unsigned short* d, long long n) {\n"
    "  GRID_LOOP(i, n) d[i] = ddp__cv_f32_to_bf16(__float_as_uint(s[i])); }\n",
    "extern \"C\" __global__ void ddp_k_bf16_to_f32(const unsigned short* s, float* d, long long n) {\n"
    "  GRID_LOOP(i, n) d[i] = ddp__cv_bf16_to_f32(s[i]); }\n",
    /* dst = (dst op src) / divisor for the NCCL ring: dtype 1 f32, 2 f16, 3 bf16; op 0 sum, 1 max.
       Values are widened to f32, combined, and rounded back, as the CPU ring does. */
    "__device__ float ddp_ld(const void* p, long long i, int t) {\n"
    "  if (t == 2) return ddp__cv_f16_to_f32(((const unsigned short*)p)[i]);\n"
    "  if (t == 3) return ddp__cv_bf16_to_f32(((const unsigned short*)p)[i]);\n"
    "  return ((const float*)p)[i]; }\n"
    "__device__ void ddp_st(void* p, long long i, int t, float v) {\n"
    "  if (t == 2) ((unsigned short*)p)[i] = ddp__cv_f32_to_f16(__float_as_uint(v));\n"
    "  else if (t == 3) ((unsigned short*)p)[i] = ddp__cv_f32_to_bf16(__float_as_uint(v));\n"
    "  else ((float*)p)[i] = v; }\n"
    "extern \"C\" __global__ void ddp_k_reduce(void* dst, const void* src, long long n, int t, int op, float divisor) {\n"
    "  GRID_LOOP(i, n) { float a = ddp_ld(dst, i, t), b = ddp_ld(src, i, t);\n"
    "    float r = op == 1 ? fmaxf(a, b) : a + b; if (divisor != 1.f) r /= divisor;\n"
    "    ddp_st(dst, i, t, r); } }\n",
    /* dst = src * a: a gradient scaled by 1/world size on its way into a bucket */
    "extern \"C\" __global__ void ddp_k_scale(float* dst, const float* src, long long n, float a) {\n"
    "  GRID_LOOP(i, n) dst[i] = src[i] * a; }\n",
    /* part[t] = the sum of the squares of v[t], v[t + P], v[t + 2P], ... in double: P partial sums
       of a gradient, coalesced reads, which the host adds in order (the norm for clipping) */
    "extern \"C\" __global__ void ddp_k_sum_squares(const float* v, long long n, double* part, long long P) {\n"
    "  GRID_LOOP(t, P) { double s = 0.0; for (long long i = t; i < n; i += P) s += (double)v[i] * v[i];"
    " part[t] = s; } }\n"
};
#endif

/* Number of GPU kernels in this library (0 in a CPU-only build). */
DDP__PRIVATE int ddp__kernel_count(void) { return DDP__CUDA ? (int)DDP__K_COUNT : 0; }
/* The name of kernel i, 0 <= i < ddp__kernel_count(); NULL outside that range. */
DDP__PRIVATE const char* ddp__kernel_name(int i) {
    return (i >= 0 && i < ddp__kernel_count()) ? ddp__kernel_names[i] : NULL;
}

#if DDP__CUDA
/* ddp.h's kernel source in one piece, from DDP_MALLOC (NULL when out of memory). */
DDP__PRIVATE char* ddp__kernel_source_joined(void) {
    size_t i, total = 1, pos = 0, n = sizeof ddp__kernel_source / sizeof ddp__kernel_source[0];
    char* src;
    for (i = 0; i < n; i++) total += strlen(ddp__kernel_source[i]);
    if (!(src = (char*)ddp__malloc(total))) return NULL;
    for (i = 0; i < n; i++) {
        memcpy(src + pos, ddp__kernel_source[i], strlen(ddp__kernel_source[i]));
        pos += strlen(ddp__kernel_source[i]);
    }
    src[pos] = 0;
    return src;
}

/* Compile kernel source `src` (named `file` in the compiler's messages) for one architecture:
   "compute_XY" gives PTX, "sm_XY" the GPU's own binary code (CUBIN) when cubin is 1. *img is host
   memory from DDP_MALLOC. */
DDP__PRIVATE ddp_status ddp__nvrtc_compile(const char* src, const char* file, const char* arch, int cubin, char** img,
                                           size_t* nbytes) {
    nvrtcProgram prog;
    char opt_arch[64];
    const char* opts[2];
    nvrtcResult r;
    *img = NULL;
    *nbytes = 0;
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", arch);
    opts[0] = opt_arch;
    opts[1] = "--std=c++17";
    r = nvrtcCreateProgram(&prog, src, file, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return ddp__fail(DDP_ERR_NVRTC, "nvrtcCreateProgram(%s) failed: %s", file, nvrtcGetErrorString(r));
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
        return ddp__fail(DDP_ERR_NVRTC, "nvrtcCompileProgram(%s, %s) failed: %s; compiler log: %s",
                         file, arch, nvrtcGetErrorString(r), log);
    }
    r = cubin ? nvrtcGetCUBINSize(prog, nbytes) : nvrtcGetPTXSize(prog, nbytes);
    if (r == NVRTC_SUCCESS && *nbytes == 0) r = NVRTC_ERROR_INVALID_INPUT; /* no CUBIN for a compute_XY */
    if (r == NVRTC_SUCCESS) {
        *img = (char*)ddp__malloc(*nbytes);
        if (!*img) {
            nvrtcDestroyProgram(&prog);
            return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %zu bytes for the compiled kernels failed", *nbytes);
        }
        r = cubin ? nvrtcGetCUBIN(prog, *img) : nvrtcGetPTX(prog, *img);
    }
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS) {
        if (*img) DDP_FREE(*img);
        *img = NULL;
        return ddp__fail(DDP_ERR_NVRTC, "reading the %s for %s failed: %s", cubin ? "CUBIN" : "PTX", arch,
                         nvrtcGetErrorString(r));
    }
    return DDP_OK;
}
#endif

/* Compile every kernel with NVRTC for `arch` (e.g. "compute_80") into PTX text. Needs no GPU:
   this is how a machine without one proves the kernels compile. *ptx is freed with ddp__free_host.
   DDP_ERR_NVRTC with the compiler log on failure; DDP_ERR_NOT_BUILT in a CPU-only build. */
DDP__PRIVATE ddp_status ddp__kernels_compile_ptx(const char* arch, char** ptx, size_t* nbytes) {
#if DDP__CUDA
    char* src = ddp__kernel_source_joined();
    ddp_status st;
    if (!src) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the kernel source failed");
    st = ddp__nvrtc_compile(src, "ddp_kernels.cu", arch ? arch : "compute_80", 0, ptx, nbytes);
    DDP_FREE(src);
    return st;
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

/* Compile `src` for GPU `dev` and load it into *lib; *arch (32 bytes) says for what. */
DDP__PRIVATE ddp_status ddp__library_load(int dev, const char* src, const char* file, cudaLibrary_t* lib,
                                          char* arch) {
    int major = 0, minor = 0, narch = 0, best = 0, i, want, nv_major = 0, nv_minor = 0, drv = 0;
    int archs[128];
    char* img = NULL;
    size_t nbytes = 0;
    cudaError_t e = cudaErrorInvalidValue;
    DDP__CU(cudaSetDevice(dev));
    DDP__CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    DDP__CU(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    want = major * 10 + minor;
    DDP__NVRTC(nvrtcGetNumSupportedArchs(&narch));
    if (narch > 128) narch = 128;
    DDP__NVRTC(nvrtcGetSupportedArchs(archs));
    for (i = 0; i < narch; i++)
        if (archs[i] <= want && archs[i] > best) best = archs[i];
    if (best == 0)
        return ddp__fail(DDP_ERR_NVRTC, "GPU %d has compute capability %d.%d, older than any "
                         "architecture this NVRTC supports", dev, major, minor);
    /* Binary code (CUBIN) for this GPU's own architecture when NVRTC knows one of its family: it
       needs no compile by the driver, so a driver older than this NVRTC still runs it. Else PTX for
       the newest architecture both know, which the driver compiles for the exact chip. */
    if (best / 10 == major) {
        snprintf(arch, 32, "sm_%d", best);
        if (ddp__nvrtc_compile(src, file, arch, 1, &img, &nbytes) == DDP_OK) {
            e = cudaLibraryLoadData(lib, img, NULL, NULL, 0, NULL, NULL, 0);
            DDP_FREE(img);
            if (e != cudaSuccess) (void)cudaGetLastError();
        }
    }
    if (e != cudaSuccess) {
        snprintf(arch, 32, "compute_%d", best);
        DDP__TRY(ddp__nvrtc_compile(src, file, arch, 0, &img, &nbytes));
        e = cudaLibraryLoadData(lib, img, NULL, NULL, 0, NULL, NULL, 0);
        DDP_FREE(img);
        if (e == cudaErrorUnsupportedPtxVersion) {
            (void)cudaGetLastError();
            nvrtcVersion(&nv_major, &nv_minor);
            cudaDriverGetVersion(&drv);
            return ddp__fail(DDP_ERR_CUDA, "GPU %d (compute capability %d.%d) needs its kernels compiled by the driver "
                             "from PTX, and this PTX comes from NVRTC %d.%d, newer than the driver (CUDA %d.%d) can "
                             "read (cudaErrorUnsupportedPtxVersion): update the NVIDIA driver, or build with the CUDA "
                             "toolkit that matches it (make CUDA_HOME=...)", dev, major, minor, nv_major, nv_minor,
                             drv / 1000, drv % 1000 / 10);
        }
        if (e != cudaSuccess) return ddp__fail_cuda(e, "cudaLibraryLoadData(kernels PTX)", __LINE__);
    }
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__kernels_load_locked(int dev) {
    char arch[32], *src = ddp__kernel_source_joined();
    ddp_status st;
    int i;
    if (!src) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the kernel source failed");
    st = ddp__library_load(dev, src, "ddp_kernels.cu", &ddp__kern.lib[dev], arch);
    DDP_FREE(src);
    DDP__TRY(st);
    for (i = 0; i < DDP__K_COUNT; i++)
        DDP__CU(cudaLibraryGetKernel(&ddp__kern.k[dev][i], ddp__kern.lib[dev], ddp__kernel_names[i]));
    ddp__kern.loaded[dev] = 1;
    ddp__log(DDP_LOG_INFO, "compiled %d GPU kernels for cuda:%d (%s)", (int)DDP__K_COUNT, dev, arch);
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

/* Launch kernel k (named `name` in messages) in blocks of 256 threads on stream s: at most
   max_blocks blocks (ddp.h's kernels loop over the grid, so any launch size covers any n; a
   kernel of one thread per element needs n / 256 blocks, rounded up). */
DDP__PRIVATE ddp_status ddp__launch_on(ddp_stream* s, cudaKernel_t k, const char* name, long long n,
                                       long long max_blocks, void** args) {
    long long blocks = (n + 255) / 256;
    dim3 grid, block;
    cudaError_t e;
    if (blocks < 1) blocks = 1;
    if (blocks > max_blocks) blocks = max_blocks;
    grid.x = (unsigned)blocks, grid.y = grid.z = 1;
    block.x = 256, block.y = block.z = 1;
    e = cudaLaunchKernel((const void*)k, grid, block, args, 0, s ? s->s : 0);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaLaunchKernel(%s)", name);
        return ddp__fail_cuda(e, what, __LINE__);
    }
    /* DETAIL mode waits for each kernel so an error points at the kernel that caused it. */
    if (ddp__log_level_enabled() >= DDP_LOG_DETAIL) {
        e = cudaStreamSynchronize(s ? s->s : 0);
        if (e != cudaSuccess) {
            char what[96];
            snprintf(what, sizeof what, "%s (synchronised under DDP_DEBUG=DETAIL)", name);
            return ddp__fail_cuda(e, what, __LINE__);
        }
    }
    return DDP_OK;
}

/* Launch ddp.h's kernel `k` over n elements on stream `s`. */
DDP__PRIVATE ddp_status ddp__launch(ddp_device d, ddp_stream* s, int k, long long n, void** args) {
    DDP__TRY(ddp__kernels_ready(d.index));
    return ddp__launch_on(s, ddp__kern.k[d.index][k], ddp__kernel_names[k], n, 65535, args);
}
#endif

/* ---- your own kernels (ddp_kernels_compile, ddp_launch): the same compiler and loader ---------- */

DDP__PRIVATE ddp_status ddp__kernels_need_gpu(const ddp_model* m, const char* fn) {
    if (m->device.type == DDP_DEVICE_CUDA) return DDP_OK;
    return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "%s: the model is on the CPU, and kernels run on a GPU; on the CPU "
                     "write the operation as a C loop (examples/gpt.h has both)", fn);
}

DDP__DEF ddp_status ddp_kernels_compile(ddp_model* m, const char* source) {
    if (!m || !source) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_kernels_compile: model or source is NULL");
    DDP__TRY(ddp__kernels_need_gpu(m, "ddp_kernels_compile"));
#if DDP__CUDA
    {
        cudaLibrary_t lib;
        char arch[32];
        DDP__TRY(ddp__library_load(m->device.index, source, "your_kernels.cu", &lib, arch));
        if (m->user_lib) { /* the old kernels may still be queued */
            DDP__TRY(ddp_stream_sync(m->stream));
            cudaLibraryUnload(m->user_lib);
        }
        m->user_lib = lib, m->nuser_k = 0;
        ddp__log(DDP_LOG_INFO, "compiled your kernels for cuda:%d (%s)", m->device.index, arch);
    }
#endif
    return DDP_OK;
}

DDP__DEF ddp_status ddp_launch(ddp_model* m, const char* name, long long n, void** args) {
    if (!m || !name || n < 0) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_launch: NULL model or name, or n < 0");
    DDP__TRY(ddp__kernels_need_gpu(m, "ddp_launch"));
#if DDP__CUDA
    {
        int i;
        if (!m->user_lib)
            return ddp__fail(DDP_ERR_STATE, "ddp_launch(%s): this model has no kernels yet: call "
                             "ddp_kernels_compile(m, source) first", name);
        if (n == 0) return DDP_OK;
        for (i = 0; i < m->nuser_k && strcmp(m->user_k[i].name, name) != 0; i++) {}
        if (i == m->nuser_k) { /* first use of this name: look it up once */
            cudaError_t e;
            if (i == DDP__MAX_USER_KERNELS || strlen(name) >= sizeof m->user_k[i].name)
                return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_launch(%s): at most %d kernels of at most 63 "
                                 "characters' names", name, DDP__MAX_USER_KERNELS);
            e = cudaLibraryGetKernel(&m->user_k[i].k, m->user_lib, name);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_launch: no kernel called \"%s\" in the source given "
                                 "to ddp_kernels_compile (%s); is it declared extern \"C\" __global__?", name,
                                 cudaGetErrorName(e));
            }
            snprintf(m->user_k[i].name, sizeof m->user_k[i].name, "%s", name);
            m->nuser_k++;
        }
        return ddp__launch_on(m->stream, m->user_k[i].k, name, n, 2147483647LL, args);
    }
#else
    (void)args;
    return DDP_OK;
#endif
}

/* Convert `count` elements between dtypes on device `d` (both buffers there), in order on `s`.
   DDP_ERR_INVALID_ARGUMENT for an unknown dtype; DDP_ERR_CUDA on a GPU failure. */
DDP__PRIVATE ddp_status ddp__convert(ddp_device d, ddp_dtype dst_type, void* dst, ddp_dtype src_type,
                                const void* src, size_t count, ddp_stream* s) {
    size_t i;
    if (dst_type == DDP_DTYPE_DEFAULT) dst_type = DDP_F32;
    if (src_type == DDP_DTYPE_DEFAULT) src_type = DDP_F32;
    if (ddp_dtype_size(dst_type) == 0 || ddp_dtype_size(src_type) == 0 ||
        (dst_type != DDP_F32 && src_type != DDP_F32))
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT,
                         "ddp__convert supports f32 <-> f16 and f32 <-> bf16, not %s -> %s",
                         ddp__dtype_name(src_type), ddp__dtype_name(dst_type));
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
        return ddp__fail(DDP_ERR_NOT_BUILT, "cannot convert on a GPU: %s", ddp__cuda_unavailable_reason());
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
#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>buffers: the two buffers ZeRO's layers take turns in (>>zero)                                */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* A buffer for n floats in slot k (0 or 1), or one of its own when k is -1 or the slot is taken. */
DDP__PRIVATE ddp_status ddp__pool_get(ddp_model* m, ddp__pool* p, int k, size_t n, float** out) {
    if (k >= 0 && !p->busy[k] && p->floats[k] >= n) {
        if (!p->slot[k]) {
            DDP__TRY(ddp_alloc(m->device, p->floats[k] * sizeof(float), (void**)&p->slot[k]));
            p->bytes += p->floats[k] * sizeof(float);
        }
        p->busy[k] = 1, *out = p->slot[k];
        return DDP_OK;
    }
    DDP__TRY(ddp_alloc(m->device, n * sizeof(float), (void**)out));
    p->bytes += n * sizeof(float);
    return DDP_OK;
}
/* Give back a buffer of n floats that ddp__pool_get handed out. */
DDP__PRIVATE void ddp__pool_put(ddp_model* m, ddp__pool* p, float* buf, size_t n) {
    int k;
    if (!buf) return;
    for (k = 0; k < 2; k++)
        if (buf == p->slot[k]) {
            p->busy[k] = 0;
            return;
        }
    ddp_free(m->device, buf);
    p->bytes -= n * sizeof(float);
}
DDP__PRIVATE void ddp__pool_free(ddp_model* m, ddp__pool* p) {
    int k;
    for (k = 0; k < 2; k++) ddp_free(m->device, p->slot[k]), p->slot[k] = NULL;
    p->bytes = 0;
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>store: the rendezvous key-value store: sockets, server, client              (chapters 2, 4)  */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/*
   Wire format (all integers little-endian). A request is a 20-byte header
       u32 magic "DDPS"  u16 version  u16 op  u32 key bytes  u32 value bytes  u32 timeout (ms)
   then the key, then the value. A reply is
       u32 magic  u16 status  u16 0  u32 value bytes     then the value.
   The first request on a connection must be HELLO with the job token as its value; the server
   answers anything else, a wrong token or a wrong version by closing the connection. Lengths are
   checked against DDP_STORE_MAX_KEY/VALUE before a byte of the body is read.

   The server is one thread running poll() over every connection: a slow, silent or half-sent
   client never blocks the others. GET and WAIT park the connection until the keys exist or the
   request's own deadline passes, so a client's timeout is enforced by the server too. When the
   process runs out of file descriptors (many strangers on the port, a low `ulimit -n`), the
   listening socket rests for 0.1 s at a time, with one warning, while the connections already
   accepted are served.
*/

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h> /* getrlimit: the descriptor limit, named when accept runs out */
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h> /* struct iovec: a header and its data in one system call */
#include <sys/wait.h>
#include <time.h>
#include <arpa/inet.h>

#define DDP__STORE_MAGIC 0x53504444u /* "DDPS" */
#define DDP__STORE_VERSION 1
enum { DDP__OP_HELLO = 1, DDP__OP_SET, DDP__OP_GET, DDP__OP_ADD, DDP__OP_WAIT, DDP__OP_CHECK };
enum { DDP__ST_OK = 0, DDP__ST_TIMEOUT, DDP__ST_REFUSED, DDP__ST_BAD, DDP__ST_BUSY };

/* ---- time and sockets: the portable pieces every network path uses ---------------------------- */

/* Milliseconds until `deadline` for poll(), at least 0 and at most a minute. */
DDP__PRIVATE int ddp__ms_left(double deadline) {
    double left = deadline - ddp__now();
    if (left <= 0) return 0;
    return left > 60 ? 60000 : (int)(left * 1000) + 1;
}

/* poll() until `deadline` for the ring's and the swaps' sockets. With `yield` (more ranks on this
   host than cores: pg->tcp_yield) the peer being waited for may need this very core, so the wait
   first gives it up (sched_yield) for a millisecond, looking between yields, and sleeps after. */
DDP__PRIVATE int ddp__poll_yielding(struct pollfd* pf, int n, int yield, double deadline) {
    if (yield) {
        double until = ddp__now() + 1e-3;
        do {
            int k = poll(pf, (nfds_t)n, 0);
            if (k != 0) return k;
            sched_yield();
        } while (ddp__now() < until);
    }
    return poll(pf, (nfds_t)n, ddp__ms_left(deadline));
}

DDP__PRIVATE void ddp__sock_setup(int fd) {
    int one = 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small messages go at once */
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one); /* macOS: no SIGPIPE on a dead peer */
#endif
}

/* Send all n bytes before `deadline`. Returns 0, or -1 with errno (ETIMEDOUT on the deadline). */
DDP__PRIVATE int ddp__send_all(int fd, const void* buf, size_t n, double deadline) {
    const char* p = (const char*)buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, DDP__SEND_FLAGS);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            struct pollfd pf;
            pf.fd = fd, pf.events = POLLOUT, pf.revents = 0;
            if (ddp__now() >= deadline) { errno = ETIMEDOUT; return -1; }
            poll(&pf, 1, ddp__ms_left(deadline));
        } else {
            return -1;
        }
    }
    return 0;
}

/* Receive exactly n bytes before `deadline`. Returns 0, or -1 with errno (ECONNRESET when the
   peer closed the connection, ETIMEDOUT on the deadline). */
DDP__PRIVATE int ddp__recv_all(int fd, void* buf, size_t n, double deadline) {
    char* p = (char*)buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        } else if (k == 0) {
            errno = ECONNRESET;
            return -1;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            struct pollfd pf;
            pf.fd = fd, pf.events = POLLIN, pf.revents = 0;
            if (ddp__now() >= deadline) { errno = ETIMEDOUT; return -1; }
            poll(&pf, 1, ddp__ms_left(deadline));
        } else {
            return -1;
        }
    }
    return 0;
}

/* getaddrinfo's status of this thread's last ddp__sock_connect: 0, or why the name did not resolve
   (for gai_strerror). */
static DDP__TLS int ddp__gai_err;

/* One non-blocking connect attempt to host:port, finished before `deadline`. Returns the socket
   or -1 with errno (and, for a name that does not resolve, errno = EHOSTUNREACH and ddp__gai_err
   set). */
DDP__PRIVATE int ddp__sock_connect(const char* host, int port, double deadline) {
    struct addrinfo hints, *res = NULL, *ai;
    char portstr[16];
    int fd = -1, err = ECONNREFUSED, g;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(portstr, sizeof portstr, "%d", port);
    ddp__gai_err = 0;
    if ((g = getaddrinfo(host, portstr, &hints, &res)) != 0 || !res) {
        ddp__gai_err = g ? g : EAI_NONAME;
        errno = EHOSTUNREACH;
        return -1;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        struct pollfd pf;
        int soerr = 0;
        socklen_t len = sizeof soerr;
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) { err = errno; continue; }
        ddp__sock_setup(fd);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        if (errno != EINPROGRESS) { err = errno; close(fd); fd = -1; continue; }
        pf.fd = fd, pf.events = POLLOUT, pf.revents = 0;
        if (poll(&pf, 1, ddp__ms_left(deadline)) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0)
            break;
        err = soerr ? soerr : ETIMEDOUT;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) errno = err;
    return fd;
}

/* 1 when every address `host` resolves to is a loopback one (127.0.0.0/8, ::1): whoever connects
   there runs on this machine. */
DDP__PRIVATE int ddp__loopback_only(const char* host) {
    struct addrinfo hints, *res = NULL, *ai;
    int all = 1;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (!host || getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return 0;
    for (ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET)
            all &= (ntohl(((struct sockaddr_in*)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (ai->ai_family == AF_INET6)
            all &= IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6*)ai->ai_addr)->sin6_addr) != 0;
        else
            all = 0;
    }
    freeaddrinfo(res);
    return all;
}

/* Listen at `port` (0: any free port) on the IPv4 address `ip` ("127.0.0.1": this machine only),
   or on all interfaces when ip is NULL or not an IPv4 address. Returns the socket or -1 with errno. */
DDP__PRIVATE int ddp__sock_listen(const char* ip, int port, int* bound_port) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    /* SO_REUSEADDR lets a restarted job take the port while old connections linger in TIME_WAIT;
       a port another program is listening on is still refused with EADDRINUSE. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    if (!ip || inet_pton(AF_INET, ip, &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (getsockname(fd, (struct sockaddr*)&a, &len) == 0 && bound_port) *bound_port = ntohs(a.sin_port);
    return fd;
}

/* "a.b.c.d:port" of a connected socket's far end, for log lines. */
DDP__PRIVATE const char* ddp__peer_name(int fd, char* buf, size_t n) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[64] = "?", port[16] = "?";
    if (getpeername(fd, (struct sockaddr*)&ss, &len) == 0)
        getnameinfo((struct sockaddr*)&ss, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(buf, n, "%s:%s", host, port);
    return buf;
}

DDP__PRIVATE void ddp__put_le32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}
DDP__PRIVATE uint32_t ddp__le32(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
DDP__PRIVATE void ddp__put_le64(unsigned char* p, uint64_t v) {
    ddp__put_le32(p, (uint32_t)v);
    ddp__put_le32(p + 4, (uint32_t)(v >> 32));
}
DDP__PRIVATE uint64_t ddp__le64(const unsigned char* p) {
    return (uint64_t)ddp__le32(p) | (uint64_t)ddp__le32(p + 4) << 32;
}

/* The timeout every blocking operation uses, into *out: the desc's value, else DDP_TIMEOUT
   (seconds), else 300. DDP_ERR_ENV when DDP_TIMEOUT is used and is not a positive number: "30s"
   or "abc" would otherwise quietly mean the default. */
#define DDP__MIN_TIMEOUT 0.1 /* seconds: a shorter deadline would fail even a busy machine's round trip */
DDP__PRIVATE ddp_status ddp__timeout(double from_desc, double* out) {
    const char* v = getenv("DDP_TIMEOUT");
    char* end;
    double t;
    *out = from_desc > 0 ? from_desc : 300.0;
    if (from_desc > 0 && from_desc < DDP__MIN_TIMEOUT)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "desc.timeout_s=%g is shorter than %g s, less than a network round "
                         "trip may take on a busy machine: give a few seconds at least (0: DDP_TIMEOUT, else 300)",
                         from_desc, DDP__MIN_TIMEOUT);
    if (from_desc > 0 || !v || !*v) return DDP_OK;
    t = strtod(v, &end);
    if (*end != 0 || !(t > 0) || t > 1e7)
        ddp__fail(DDP_ERR_ENV, "DDP_TIMEOUT=%s is not a positive number of seconds: write it as a plain number, "
                  "e.g. DDP_TIMEOUT=60, or unset it for the default 300", v);
    else if (t < DDP__MIN_TIMEOUT)
        ddp__fail(DDP_ERR_ENV, "DDP_TIMEOUT=%s is shorter than %g s, less than a network round trip may take on a busy "
                  "machine: set it to a few seconds at least, e.g. DDP_TIMEOUT=60, or unset it for the default 300",
                  v, DDP__MIN_TIMEOUT);
    else {
        *out = t;
        return DDP_OK;
    }
    ddp__err_fix = "set DDP_TIMEOUT to a number of seconds (the deadline of every wait), or unset it for 300";
    return DDP_ERR_ENV;
}

/* ---- the server ------------------------------------------------------------------------------------ */

/* A key under ddp/live/ belongs to the connection that set it (owner: its serial number), and goes
   when that connection closes: a rank's sign of life, which outlasts it by no more than its socket
   (ddp__agree frees the slot of a rank whose connection has closed, on any host). */
#define DDP__LIVE_PREFIX "ddp/live/"
typedef struct ddp__kv { char* key; unsigned char* val; uint32_t len; uint64_t owner; } ddp__kv;

typedef struct ddp__sconn {
    int fd;
    int hello;          /* 1 once the HELLO was accepted */
    double since;       /* when the connection opened, or its partial message began */
    unsigned char head[20];
    size_t got;         /* bytes of header + body received so far */
    unsigned char* body;
    uint32_t op, klen, vlen, timeout_ms;
    int parked;         /* a GET or WAIT waiting for keys */
    double deadline;
    uint64_t serial;    /* this connection's number (from 1), the owner of its ddp/live/ keys */
    char peer[64];
} ddp__sconn;

typedef struct ddp__server {
    int listen_fd, port, wake[2];
    pthread_t thread;
    pthread_mutex_t lock; /* guards `stop` only; the data belongs to the server thread */
    int stop;
    double idle_s;        /* a silent newcomer or a stalled half message is dropped after this */
    char token[128];
    ddp__kv* kv;
    int nkv, capkv;
    ddp__sconn* conns;
    int nconns, capconns;
    /* accept failing for want of descriptors (EMFILE: `ulimit -n`): the listening socket stays
       readable, so the server leaves it alone until `accept_pause_until` instead of spinning */
    double accept_pause_until, accept_failing_since;
    long accept_fails;    /* failed accepts since the first of this episode; 0: none */
    int reserve_fd;       /* /dev/null, held so that a newcomer can be told "busy" at the limit */
    int accept_episodes;  /* episodes so far: only the first is a warning, later ones are INFO */
    uint64_t serials;     /* connections accepted so far */
} ddp__server;

DDP__PRIVATE ddp__kv* ddp__kv_find(ddp__server* s, const char* key, size_t klen) {
    int i;
    for (i = 0; i < s->nkv; i++)
        if (strlen(s->kv[i].key) == klen && memcmp(s->kv[i].key, key, klen) == 0) return &s->kv[i];
    return NULL;
}

/* Store a copy of value under key (replacing). Returns 0, or -1 when memory ran out. */
DDP__PRIVATE int ddp__kv_set(ddp__server* s, const char* key, size_t klen, const void* val, uint32_t len) {
    ddp__kv* e = ddp__kv_find(s, key, klen);
    unsigned char* copy = (unsigned char*)ddp__malloc(len ? len : 1);
    if (!copy) return -1;
    if (len) memcpy(copy, val, len);
    if (!e) {
        if (s->nkv == s->capkv) {
            int cap = s->capkv ? 2 * s->capkv : 64;
            ddp__kv* grown = (ddp__kv*)ddp__malloc((size_t)cap * sizeof *grown);
            if (!grown) { DDP_FREE(copy); return -1; }
            if (s->nkv) memcpy(grown, s->kv, (size_t)s->nkv * sizeof *grown);
            if (s->kv) DDP_FREE(s->kv);
            s->kv = grown;
            s->capkv = cap;
        }
        e = &s->kv[s->nkv];
        e->key = (char*)ddp__malloc(klen + 1);
        if (!e->key) { DDP_FREE(copy); return -1; }
        memcpy(e->key, key, klen);
        e->key[klen] = 0;
        e->val = NULL;
        e->owner = 0;
        s->nkv++;
    }
    if (e->val) DDP_FREE(e->val);
    e->val = copy;
    e->len = len;
    return 0;
}

DDP__PRIVATE void ddp__sconn_close(ddp__server* s, int i, const char* why) {
    ddp__sconn* c = &s->conns[i];
    int k;
    if (why) ddp__log(DDP_LOG_WARN, "store: dropped the connection from %s: %s", c->peer, why);
    for (k = s->nkv - 1; k >= 0; k--) /* its ddp/live/ keys go with it */
        if (s->kv[k].owner == c->serial) {
            DDP_FREE(s->kv[k].key);
            DDP_FREE(s->kv[k].val);
            s->kv[k] = s->kv[--s->nkv];
        }
    close(c->fd);
    if (c->body) DDP_FREE(c->body);
    s->conns[i] = s->conns[--s->nconns];
}

DDP__PRIVATE int ddp__sreply(ddp__sconn* c, int status, const void* val, uint32_t len) {
    unsigned char h[12];
    double deadline = ddp__now() + 5.0; /* a client that reads nothing cannot hold the server long */
    ddp__put_le32(h, DDP__STORE_MAGIC);
    h[4] = (unsigned char)status, h[5] = 0, h[6] = h[7] = 0;
    ddp__put_le32(h + 8, len);
    if (ddp__send_all(c->fd, h, 12, deadline) != 0) return -1;
    if (len && ddp__send_all(c->fd, val, len, deadline) != 0) return -1;
    return 0;
}

/* For WAIT and CHECK the value is a list of keys, each a u32 length and its bytes. Returns the
   number of keys that exist, or -1 for a malformed list; *nkeys gets the list's length. */
DDP__PRIVATE int ddp__count_present(ddp__server* s, const unsigned char* list, uint32_t len, int* nkeys) {
    uint32_t pos = 0;
    int present = 0;
    *nkeys = 0;
    while (pos < len) {
        uint32_t k;
        if (len - pos < 4) return -1;
        k = ddp__le32(list + pos);
        pos += 4;
        if (k > DDP_STORE_MAX_KEY || k > len - pos || memchr(list + pos, 0, k)) return -1;
        present += ddp__kv_find(s, (const char*)list + pos, k) != NULL;
        pos += k;
        (*nkeys)++;
    }
    return present;
}

/* Try to answer a parked or new GET/WAIT: returns 1 if answered, 0 if it must keep waiting,
   -1 if the connection must be dropped. */
DDP__PRIVATE int ddp__serve_wait(ddp__server* s, ddp__sconn* c) {
    const char* key = (const char*)c->body;
    if (c->op == DDP__OP_GET) {
        ddp__kv* e = ddp__kv_find(s, key, c->klen);
        if (!e) return 0;
        return ddp__sreply(c, DDP__ST_OK, e->val, e->len) == 0 ? 1 : -1;
    } else {
        int n, present = ddp__count_present(s, c->body + c->klen, c->vlen, &n);
        if (present < 0) return -1;
        if (present < n) return 0;
        return ddp__sreply(c, DDP__ST_OK, NULL, 0) == 0 ? 1 : -1;
    }
}

/* Act on one complete request. Returns 0 to keep the connection, -1 to drop it. */
DDP__PRIVATE int ddp__serve(ddp__server* s, ddp__sconn* c) {
    const char* key = (const char*)c->body;
    const unsigned char* val = c->body + c->klen;
    if (!c->hello) {
        if (c->op != DDP__OP_HELLO) {
            ddp__log(DDP_LOG_WARN, "store: %s sent a request before HELLO; dropped", c->peer);
            return -1;
        }
        if (c->vlen != strlen(s->token) || memcmp(val, s->token, c->vlen) != 0) {
            ddp__sreply(c, DDP__ST_REFUSED, "wrong job token", 15);
            ddp__log(DDP_LOG_WARN, "store: refused %s: wrong job token (another job, or DDP_JOB_TOKEN "
                    "differs between ranks)", c->peer);
            return -1;
        }
        c->hello = 1;
        return ddp__sreply(c, DDP__ST_OK, NULL, 0);
    }
    if (c->klen && memchr(key, 0, c->klen)) { /* keys are C strings: a NUL would alias another key */
        ddp__log(DDP_LOG_WARN, "store: %s sent a key with a NUL byte; dropped", c->peer);
        return -1;
    }
    switch (c->op) {
    case DDP__OP_SET:
        if (ddp__kv_set(s, key, c->klen, val, c->vlen) != 0) return ddp__sreply(c, DDP__ST_BAD, "out of memory", 13);
        if (c->klen > strlen(DDP__LIVE_PREFIX) && !memcmp(key, DDP__LIVE_PREFIX, strlen(DDP__LIVE_PREFIX)))
            ddp__kv_find(s, key, c->klen)->owner = c->serial;
        return ddp__sreply(c, DDP__ST_OK, NULL, 0);
    case DDP__OP_ADD: {
        ddp__kv* e = ddp__kv_find(s, key, c->klen);
        int64_t v = 0;
        unsigned char out[8];
        if (c->vlen != 8) return -1;
        if (e) {
            char num[32];
            size_t n = e->len < sizeof num - 1 ? e->len : sizeof num - 1;
            memcpy(num, e->val, n);
            num[n] = 0;
            v = strtoll(num, NULL, 10);
        }
        v = (int64_t)((uint64_t)v + ddp__le64(val)); /* wraps as unsigned arithmetic does: no overflow */
        {
            char num[32];
            int n = snprintf(num, sizeof num, "%lld", (long long)v); /* stored as text, as TCPStore */
            if (ddp__kv_set(s, key, c->klen, num, (uint32_t)n) != 0) return ddp__sreply(c, DDP__ST_BAD, "out of memory", 13);
        }
        ddp__put_le64(out, (uint64_t)v);
        return ddp__sreply(c, DDP__ST_OK, out, 8);
    }
    case DDP__OP_CHECK: {
        int n, present = ddp__count_present(s, val, c->vlen, &n);
        unsigned char out[4];
        if (present < 0) return -1;
        ddp__put_le32(out, (uint32_t)present);
        return ddp__sreply(c, DDP__ST_OK, out, 4);
    }
    case DDP__OP_GET:
    case DDP__OP_WAIT: {
        int r = ddp__serve_wait(s, c);
        if (r != 0) return r > 0 ? 0 : -1;
        c->parked = 1;
        c->deadline = ddp__now() + c->timeout_ms / 1000.0;
        return 0;
    }
    default:
        ddp__log(DDP_LOG_WARN, "store: %s sent unknown operation %u; dropped", c->peer, c->op);
        return -1;
    }
}

/* Read what has arrived on connection i; act on a complete request. Returns -1 to drop. */
DDP__PRIVATE int ddp__server_read(ddp__server* s, int i) {
    ddp__sconn* c = &s->conns[i];
    for (;;) {
        size_t want;
        unsigned char* dst;
        ssize_t k;
        if (c->parked) {
            char b;
            /* a parked client sends nothing; data or EOF here means it gave up or misbehaves */
            k = recv(c->fd, &b, 1, MSG_PEEK);
            if (k == 0) return -1;
            if (k > 0) {
                ddp__log(DDP_LOG_WARN, "store: %s sent data while waiting for a reply; dropped", c->peer);
                return -1;
            }
            return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        }
        if (c->got < 20) {
            want = 20 - c->got;
            dst = c->head + c->got;
        } else {
            want = (size_t)c->klen + c->vlen - (c->got - 20);
            dst = c->body + (c->got - 20);
        }
        k = want ? recv(c->fd, dst, want, 0) : 0;
        if (want && k == 0) return -1; /* the client closed */
        if (want && k < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        if (c->got == 0 && k > 0) c->since = ddp__now();
        c->got += (size_t)k;
        if (c->got == 20 && !c->body) {
            /* the header is complete: check it before accepting a byte of the body */
            if (ddp__le32(c->head) != DDP__STORE_MAGIC) {
                ddp__log(DDP_LOG_WARN, "store: %s is not speaking this protocol (bad magic); dropped", c->peer);
                return -1;
            }
            if ((c->head[4] | c->head[5] << 8) != DDP__STORE_VERSION) {
                ddp__sreply(c, DDP__ST_REFUSED, "protocol version mismatch", 25);
                ddp__log(DDP_LOG_WARN, "store: %s speaks protocol version %d, this server %d: every rank must "
                        "use the same ddp.h; dropped", c->peer, c->head[4] | c->head[5] << 8, DDP__STORE_VERSION);
                return -1;
            }
            c->op = (uint32_t)(c->head[6] | c->head[7] << 8);
            c->klen = ddp__le32(c->head + 8);
            c->vlen = ddp__le32(c->head + 12);
            c->timeout_ms = ddp__le32(c->head + 16);
            if (c->klen > DDP_STORE_MAX_KEY || c->vlen > DDP_STORE_MAX_VALUE ||
                (!c->hello && c->vlen > sizeof s->token)) {
                ddp__log(DDP_LOG_WARN, "store: %s announced a %u-byte key and %u-byte value, over the limits "
                        "(%d, %d); dropped", c->peer, c->klen, c->vlen, DDP_STORE_MAX_KEY, DDP_STORE_MAX_VALUE);
                return -1;
            }
            c->body = (unsigned char*)ddp__malloc((size_t)c->klen + c->vlen + 1);
            if (!c->body) return -1;
        }
        if (c->got >= 20 && c->got == 20 + (size_t)c->klen + c->vlen) {
            int r = ddp__serve(s, c);
            if (!c->parked) {
                DDP_FREE(c->body);
                c->body = NULL;
                c->got = 0;
            }
            if (r != 0) return -1;
        }
    }
}

/* After a SET or ADD, answer every parked request whose keys now exist. */
DDP__PRIVATE void ddp__server_wake_parked(ddp__server* s) {
    int i;
    for (i = 0; i < s->nconns; i++) {
        ddp__sconn* c = &s->conns[i];
        int r;
        if (!c->parked) continue;
        r = ddp__serve_wait(s, c);
        if (r == 0) continue;
        c->parked = 0;
        DDP_FREE(c->body);
        c->body = NULL;
        c->got = 0;
        if (r < 0) ddp__sconn_close(s, i--, "lost while answering");
    }
}

/* Out of descriptors, a newcomer would sit silent in the kernel's backlog and, after its HELLO
   timed out, take the store for some other program on the port. The descriptor held in reserve is
   lent to answer each newcomer "busy", with the reason, so that a rank keeps trying until its
   deadline and can then say what held it up. */
DDP__PRIVATE void ddp__server_turn_away(ddp__server* s) {
    char why[200], junk[512];
    struct rlimit rl;
    int k, silent = 0;
    long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : -1;
    const double wait_until = ddp__now() + 0.05;
    for (k = 0; k < s->nconns; k++) silent += !s->conns[k].hello;
    if (s->reserve_fd < 0) s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* lost last time */
    snprintf(why, sizeof why, "the store's process is out of file descriptors (ulimit -n %ld) with %d connections "
             "open, %d of them silent (never sent a HELLO)", lim, s->nconns, silent);
    for (k = 0; k < 256 && s->reserve_fd >= 0; k++) {
        unsigned char h[12];
        int fd;
        close(s->reserve_fd);
        fd = accept(s->listen_fd, NULL, NULL);
        if (fd >= 0) {
            struct pollfd pf;
            pf.fd = fd, pf.events = POLLIN, pf.revents = 0;
            /* the HELLO, usually here already: read it, so that the close sends no reset, which could
               take the answer with it (50 ms per round at most: silent strangers must not stall us) */
            (void)poll(&pf, 1, ddp__ms_left(wait_until) > 20 ? 20 : ddp__ms_left(wait_until));
            while (recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {
            }
            ddp__put_le32(h, DDP__STORE_MAGIC);
            h[4] = DDP__ST_BUSY, h[5] = h[6] = h[7] = 0;
            ddp__put_le32(h + 8, (uint32_t)strlen(why));
            ddp__sock_setup(fd);
            if (send(fd, h, 12, MSG_DONTWAIT | DDP__SEND_FLAGS) == 12) {
                if (send(fd, why, strlen(why), MSG_DONTWAIT | DDP__SEND_FLAGS) < 0) {
                }
            }
            close(fd);
        }
        s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) break; /* the backlog is empty (or another thread took the descriptor) */
    }
}

static void* ddp__server_main(void* arg) {
    ddp__server* s = (ddp__server*)arg;
    struct pollfd* pf = NULL;
    int cap = 0;
    for (;;) {
        int i, n = s->nconns + 2, stop;
        double now = ddp__now(), next = now + 1.0;
        pthread_mutex_lock(&s->lock);
        stop = s->stop;
        pthread_mutex_unlock(&s->lock);
        if (stop) break;
        if (n > cap) {
            struct pollfd* grown = (struct pollfd*)ddp__malloc((size_t)n * 2 * sizeof *grown);
            if (!grown) { ddp__sleep(0.01); continue; }
            if (pf) DDP_FREE(pf);
            pf = grown;
            cap = n * 2;
        }
        /* Expire: parked requests past their deadline, silent newcomers, stalled partial messages. */
        for (i = 0; i < s->nconns; i++) {
            ddp__sconn* c = &s->conns[i];
            if (c->parked && now >= c->deadline) {
                c->parked = 0;
                DDP_FREE(c->body);
                c->body = NULL;
                c->got = 0;
                if (ddp__sreply(c, DDP__ST_TIMEOUT, NULL, 0) != 0) ddp__sconn_close(s, i--, NULL);
            } else if (!c->hello && now - c->since > s->idle_s) {
                ddp__sconn_close(s, i--, "it sent no valid HELLO in time");
            } else if (c->hello && c->got > 0 && !c->parked && now - c->since > s->idle_s) {
                ddp__sconn_close(s, i--, "it sent half a message and then nothing");
            } else if (c->parked && c->deadline < next) {
                next = c->deadline;
            }
        }
        if (now < s->accept_pause_until && s->accept_pause_until < next) next = s->accept_pause_until;
        /* a negative fd is skipped by poll: the listening socket rests while accept cannot succeed */
        pf[0].fd = now < s->accept_pause_until ? -1 : s->listen_fd, pf[0].events = POLLIN, pf[0].revents = 0;
        pf[1].fd = s->wake[0], pf[1].events = POLLIN, pf[1].revents = 0;
        for (i = 0; i < s->nconns; i++) pf[i + 2].fd = s->conns[i].fd, pf[i + 2].events = POLLIN, pf[i + 2].revents = 0;
        n = s->nconns + 2;
        if (poll(pf, (nfds_t)n, ddp__ms_left(next)) < 0 && errno != EINTR) ddp__sleep(0.01);
        if (pf[1].revents) {
            char b[16];
            while (read(s->wake[0], b, sizeof b) > 0) {
            }
        }
        /* Existing connections first (indexes shift when one closes, so walk from the end). */
        for (i = n - 3; i >= 0; i--) {
            int fd, r, j;
            if (i >= s->nconns || !(pf[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            fd = s->conns[i].fd;
            r = ddp__server_read(s, i);
            /* A request served just before the client hung up (set, then exit) must still wake
               the requests waiting for its key, so wake first and drop afterwards. */
            ddp__server_wake_parked(s);
            if (r != 0)
                for (j = 0; j < s->nconns; j++)
                    if (s->conns[j].fd == fd) {
                        ddp__sconn_close(s, j, NULL);
                        break;
                    }
        }
        if (pf[0].revents & POLLIN) {
            for (;;) {
                int fd = accept(s->listen_fd, NULL, NULL);
                ddp__sconn* c;
                if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
                    int e = errno;
                    if (s->accept_fails++ == 0) {
                        struct rlimit rl;
                        long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : -1;
                        s->accept_failing_since = ddp__now();
                        ddp__log(s->accept_episodes++ ? DDP_LOG_INFO : DDP_LOG_WARN,
                                "store: cannot accept a connection: %s (this process may have %ld open "
                                "files: ulimit -n). Serving the %d connections it has and retrying every 0.1 s; "
                                "many connections that never say HELLO come from another program or an attack "
                                "on MASTER_PORT", strerror(e), lim, s->nconns);
                    }
                    ddp__server_turn_away(s);
                    s->accept_pause_until = ddp__now() + 0.1;
                    break;
                }
                if (fd < 0) break;
                if (s->accept_fails) {
                    ddp__log(s->accept_episodes > 1 ? DDP_LOG_INFO : DDP_LOG_WARN, "store: accepting connections again (accept failed %ld times over %.1f s "
                            "for want of file descriptors)", s->accept_fails, ddp__now() - s->accept_failing_since);
                    s->accept_fails = 0;
                }
                if (s->nconns == s->capconns) {
                    int capc = s->capconns ? 2 * s->capconns : 16;
                    ddp__sconn* grown = (ddp__sconn*)ddp__malloc((size_t)capc * sizeof *grown);
                    if (!grown) { close(fd); break; }
                    if (s->nconns) memcpy(grown, s->conns, (size_t)s->nconns * sizeof *grown);
                    if (s->conns) DDP_FREE(s->conns);
                    s->conns = grown;
                    s->capconns = capc;
                }
                ddp__sock_setup(fd);
                c = &s->conns[s->nconns++];
                memset(c, 0, sizeof *c);
                c->fd = fd;
                c->since = ddp__now();
                c->serial = ++s->serials;
                ddp__peer_name(fd, c->peer, sizeof c->peer);
            }
        }
    }
    if (pf) DDP_FREE(pf);
    return NULL;
}

DDP__PRIVATE void ddp__server_free(ddp__server* s) {
    int i;
    /* The listening socket first: a client that sees its connection close may connect again at
       once (ddp_destroy, then ddp_init), and must be refused, not queued on a socket about to go. */
    if (s->listen_fd >= 0) close(s->listen_fd);
    s->listen_fd = -1;
    while (s->nconns) ddp__sconn_close(s, s->nconns - 1, NULL);
    for (i = 0; i < s->nkv; i++) {
        DDP_FREE(s->kv[i].key);
        if (s->kv[i].val) DDP_FREE(s->kv[i].val);
    }
    if (s->kv) DDP_FREE(s->kv);
    if (s->conns) DDP_FREE(s->conns);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    if (s->reserve_fd >= 0) close(s->reserve_fd);
    pthread_mutex_destroy(&s->lock);
    DDP_FREE(s);
}

/* `local`: every client is on this machine (they reach the store at a loopback address), so it
   listens on 127.0.0.1 only and no other machine can even connect; else on every interface. */
DDP__PRIVATE ddp_status ddp__server_start(int port, int local, const char* token, double timeout, ddp__server** out) {
    ddp__server* s = (ddp__server*)ddp__calloc(sizeof *s);
    int e;
    *out = NULL;
    if (!s) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the store server failed");
    s->wake[0] = s->wake[1] = -1;
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->idle_s = timeout < 10.0 ? timeout : 10.0;
    pthread_mutex_init(&s->lock, NULL);
    snprintf(s->token, sizeof s->token, "%s", token);
    s->listen_fd = ddp__sock_listen(local ? "127.0.0.1" : NULL, port < 0 ? 0 : port, &s->port);
    if (s->listen_fd < 0) {
        e = errno;
        ddp__server_free(s);
        if (e == EADDRINUSE)
            return ddp__fail(DDP_ERR_PORT_IN_USE,
                             "the rendezvous store cannot listen on port %d: it is already in use (another "
                             "job or program holds it; " DDP__HINT_WHO_LISTENS "). Pick another "
                             "MASTER_PORT, or let ddprun --standalone choose a free one", port, port);
        return ddp__fail(DDP_ERR_IO, "the rendezvous store cannot listen on port %d: %s", port, strerror(e));
    }
    if (pipe(s->wake) != 0 || pthread_create(&s->thread, NULL, ddp__server_main, s) != 0) {
        e = errno;
        ddp__server_free(s);
        return ddp__fail(DDP_ERR_IO, "starting the store server thread failed: %s", strerror(e));
    }
    fcntl(s->wake[0], F_SETFL, fcntl(s->wake[0], F_GETFL) | O_NONBLOCK);
    *out = s;
    return DDP_OK;
}

DDP__PRIVATE void ddp__server_stop(ddp__server* s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_mutex_unlock(&s->lock);
    if (write(s->wake[1], "x", 1) < 0) {
    }
    pthread_join(s->thread, NULL);
    ddp__server_free(s);
}

/* ---- the client ------------------------------------------------------------------------------------ */

struct ddp_store {
    int fd;
    char host[256];
    int port;
    double timeout;
    char token[128];
    pthread_mutex_t lock; /* one request at a time: the training and communication threads share it */
    ddp__server* server;  /* when this process hosts the store */
    int gone;             /* a request failed: 1 the connection closed, 2 no reply in time; later ones fail */
};

/* One request and its reply. *reply (may be NULL) gets DDP_MALLOC'd bytes. */
DDP__PRIVATE ddp_status ddp__store_call_x(ddp_store* s, int op, const char* key, const void* val, size_t vlen,
                                          double timeout, double slack, int* status, unsigned char** reply,
                                          uint32_t* rlen) {
    unsigned char h[20], r[12];
    size_t klen = key ? strlen(key) : 0;
    double deadline = ddp__now() + timeout + slack;
    uint32_t n;
    int fail = 0;
    if (klen > DDP_STORE_MAX_KEY || vlen > DDP_STORE_MAX_VALUE)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "store key of %zu bytes or value of %zu bytes is over the limit "
                         "(DDP_STORE_MAX_KEY %d, DDP_STORE_MAX_VALUE %d)", klen, vlen, DDP_STORE_MAX_KEY,
                         DDP_STORE_MAX_VALUE);
    if (reply) *reply = NULL;
    if (s->gone) /* a reply that came late would answer the next request: the connection is spent */
        return ddp__fail(DDP_ERR_STORE_LOST, "the rendezvous store at %s:%d %s before this request (key \"%s\"): the "
                         "process hosting it (rank 0) is stopped, overloaded, or has exited", s->host, s->port,
                         s->gone == 2 ? "stopped answering" : "closed the connection", key ? key : "");
    ddp__put_le32(h, DDP__STORE_MAGIC);
    h[4] = DDP__STORE_VERSION & 0xff, h[5] = DDP__STORE_VERSION >> 8;
    h[6] = (unsigned char)op, h[7] = 0;
    ddp__put_le32(h + 8, (uint32_t)klen);
    ddp__put_le32(h + 12, (uint32_t)vlen);
    ddp__put_le32(h + 16, (uint32_t)(timeout * 1000 > 4e9 ? 4e9 : timeout * 1000));
    pthread_mutex_lock(&s->lock);
    if (ddp__send_all(s->fd, h, 20, deadline) || (klen && ddp__send_all(s->fd, key, klen, deadline)) ||
        (vlen && ddp__send_all(s->fd, val, vlen, deadline)) || ddp__recv_all(s->fd, r, 12, deadline))
        fail = 1;
    if (!fail && ddp__le32(r) != DDP__STORE_MAGIC) fail = 2;
    n = fail ? 0 : ddp__le32(r + 8);
    if (!fail && n > DDP_STORE_MAX_VALUE) fail = 2;
    if (!fail && n) {
        unsigned char* b = (unsigned char*)ddp__malloc(n);
        if (!b || ddp__recv_all(s->fd, b, n, deadline) != 0) fail = 1;
        if (b && (fail || !reply)) DDP_FREE(b);
        else if (b) *reply = b;
    }
    if (fail) s->gone = fail == 1 && errno == ETIMEDOUT ? 2 : 1;
    pthread_mutex_unlock(&s->lock);
    if (fail)
        return ddp__fail(DDP_ERR_STORE_LOST, "the rendezvous store at %s:%d %s (key \"%s\"): the process "
                         "hosting it (rank 0) has probably exited or crashed", s->host, s->port,
                         fail == 2 ? "sent a malformed reply" : errno == ETIMEDOUT ? "stopped answering" : "closed the connection",
                         key ? key : "");
    *status = r[4];
    if (rlen) *rlen = n;
    return DDP_OK;
}
/* The server enforces a request's own timeout (a WAIT may rightly take all of it); the extra 10 s
   only detect a dead server. */
DDP__PRIVATE ddp_status ddp__store_call(ddp_store* s, int op, const char* key, const void* val, size_t vlen,
                                        double timeout, int* status, unsigned char** reply, uint32_t* rlen) {
    return ddp__store_call_x(s, op, key, val, vlen, timeout, 10.0, status, reply, rlen);
}

/* HELLO, the first request of a connection. A store out of descriptors answers "busy": then
   DDP_ERR_STORE_UNREACHABLE, with its reason in busy[] (else busy[0] is 0). *closed: 1 when the
   connection closed without an answer. */
DDP__PRIVATE ddp_status ddp__store_hello(ddp_store* s, char* busy, size_t nbusy, int* closed) {
    int st = 0;
    unsigned char* msg = NULL;
    uint32_t n = 0;
    busy[0] = 0, *closed = 0;
    /* A store answers HELLO at once, so no slack: a program on that port that accepts the
       connection but speaks another protocol (or nothing) is found out within the deadline. */
    double t = s->timeout < 5.0 ? s->timeout : 5.0;
    if (ddp__store_call_x(s, DDP__OP_HELLO, NULL, s->token, strlen(s->token), t, 0.0, &st, &msg, &n) != DDP_OK) {
        char why[96];
        if (strstr(ddp_error_string(), "malformed")) snprintf(why, sizeof why, "answered the HELLO in another protocol");
        else if (strstr(ddp_error_string(), "closed the"))
            snprintf(why, sizeof why, "closed the connection without answering the HELLO"), *closed = 1;
        else snprintf(why, sizeof why, "did not answer the HELLO within %g s (a store answers at once)", t);
        return ddp__fail(DDP_ERR_STORE_REFUSED, "the program listening at %s:%d is not a ddp.h rendezvous store: it "
                         "%s. Another program holds MASTER_PORT (pick another port), or MASTER_ADDR/MASTER_PORT "
                         "point to the wrong machine", s->host, s->port, why);
    }
    if (st == DDP__ST_BUSY) {
        snprintf(busy, nbusy, "%.*s", msg ? (int)n : 14, msg ? (const char*)msg : "no reason said");
        if (msg) DDP_FREE(msg);
        return DDP_ERR_STORE_UNREACHABLE;
    }
    if (st != DDP__ST_OK) {
        char why[64] = "refused";
        if (msg) snprintf(why, sizeof why, "%.*s", (int)(n < 60 ? n : 60), (const char*)msg);
        if (msg) DDP_FREE(msg);
        if (strstr(why, "version"))
            return ddp__fail(DDP_ERR_STORE_REFUSED, "the store at %s:%d refused this rank: %s: the ranks were built "
                             "from different versions of ddp.h; rebuild every rank's program from the same ddp.h",
                             s->host, s->port, why);
        return ddp__fail(DDP_ERR_STORE_REFUSED,
                         "the process listening at %s:%d refused this rank: %s. Either another job holds "
                         "that port (pick another MASTER_PORT) or the ranks were given different "
                         "DDP_JOB_TOKEN values (launch them together, e.g. with ddprun)", s->host, s->port, why);
    }
    if (msg) DDP_FREE(msg);
    return DDP_OK;
}

/* Start a server (is_server) and connect a client to it, retrying with back-off until the
   deadline. DDP_ERR_PORT_IN_USE when the port is taken, DDP_ERR_STORE_UNREACHABLE when no server
   answers in time, DDP_ERR_STORE_REFUSED when the server rejects the token or version. */
DDP__PRIVATE ddp_status ddp__store_create(const ddp_store_desc* desc, ddp_store** out) {
    ddp_store* s;
    ddp_store_desc d;
    const char* env;
    double deadline, backoff = 0.01;
    int last_err = 0, last_gai = 0, warned_name = 0, warned_busy = 0, closed = 0, closes = 0;
    char busy[200];
    ddp_status st;
    *out = NULL;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    s = (ddp_store*)ddp__calloc(sizeof *s);
    if (!s) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a store failed");
    s->fd = -1;
    pthread_mutex_init(&s->lock, NULL);
    env = getenv("MASTER_ADDR");
    snprintf(s->host, sizeof s->host, "%s", d.host ? d.host : (env && *env) ? env : "127.0.0.1");
    env = getenv("MASTER_PORT");
    s->port = d.port ? d.port : (env && *env) ? atoi(env) : 29500;
    if ((st = ddp__timeout(d.timeout_s, &s->timeout)) != DDP_OK) {
        pthread_mutex_destroy(&s->lock);
        DDP_FREE(s);
        return st;
    }
    env = getenv("DDP_JOB_TOKEN");
    snprintf(s->token, sizeof s->token, "%s", d.token ? d.token : (env ? env : ""));
    if (d.is_server) {
        st = ddp__server_start(s->port, ddp__loopback_only(s->host), s->token, s->timeout, &s->server);
        if (st != DDP_OK) {
            ddp__store_destroy(s);
            return st;
        }
        s->port = s->server->port;
    }
    /* Connect, retrying with doubling back-off: the server may not be up yet. */
    deadline = ddp__now() + s->timeout;
    for (;;) { /* until a HELLO is answered: a busy store says so, and is asked again */
        for (;;) {
            /* The host connects like everyone else, to MASTER_ADDR: the local address of this
               connection is what the ring publishes, and 127.0.0.1 would be useless to other hosts. */
            s->fd = ddp__sock_connect(s->host, s->port,
                                      ddp__now() + 2.0 < deadline ? ddp__now() + 2.0 : deadline);
            s->gone = 0; /* a new connection: its requests are in step */
            if (s->fd >= 0) break;
            last_err = errno;
            /* A name that does not resolve is said at once: the retries only help when the name is about
               to appear (a cluster's DNS catching up), and a typo would otherwise wait out DDP_TIMEOUT. */
            if (ddp__gai_err && !warned_name++)
                ddp__log(DDP_LOG_WARN, "the rendezvous host \"%s\" (MASTER_ADDR) does not resolve to an address: %s. "
                        "Retrying until DDP_TIMEOUT (%.0f s); set MASTER_ADDR to rank 0's IP address, or to a name every "
                        "machine resolves (127.0.0.1 when all ranks run here)", s->host, gai_strerror(ddp__gai_err),
                        s->timeout);
            last_gai = ddp__gai_err;
            if (ddp__now() >= deadline) {
                if (last_gai)
                    st = ddp__fail(DDP_ERR_STORE_UNREACHABLE,
                                   "no rendezvous store answered at %s:%d within %.0f s (last error: the host name \"%s\" "
                                   "does not resolve: %s). Set MASTER_ADDR to rank 0's IP address, or to a name every "
                                   "machine resolves (127.0.0.1 when all ranks run here)",
                                   s->host, s->port, s->timeout, s->host, gai_strerror(last_gai));
                else
                    st = ddp__fail(DDP_ERR_STORE_UNREACHABLE,
                                   "no rendezvous store answered at %s:%d within %.0f s (last error: %s). Is rank 0 "
                                   "running, and do all ranks use the same MASTER_ADDR and MASTER_PORT?",
                                   s->host, s->port, s->timeout,
                                   last_err == EHOSTUNREACH ? "the address is unreachable" : strerror(last_err));
                ddp__store_destroy(s); /* after the message: it quotes s */
                return st;
            }
            ddp__sleep(deadline - ddp__now() < backoff ? deadline - ddp__now() : backoff);
            backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
        }
        st = ddp__store_hello(s, busy, sizeof busy, &closed);
        /* A store turning newcomers away may close a connection whose HELLO came after its
           answer, and the reset can take the answer with it: a close is asked again, a few times
           (or until the deadline once the store has said it is busy). */
        if (closed && (warned_busy || closes++ < 3) && ddp__now() + backoff < deadline) {
            close(s->fd);
            s->fd = -1;
            ddp__sleep(backoff);
            backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
            continue;
        }
        if (st == DDP_OK || !busy[0]) break;
        close(s->fd);
        s->fd = -1;
        if (!warned_busy++)
            ddp__log(DDP_LOG_WARN, "the rendezvous store at %s:%d is busy: %s. Retrying until DDP_TIMEOUT (%.0f s)",
                     s->host, s->port, busy, s->timeout);
        if (ddp__now() + backoff >= deadline) {
            st = ddp__fail(DDP_ERR_STORE_UNREACHABLE, "the rendezvous store at %s:%d could not take this rank within "
                           "DDP_TIMEOUT (%.0f s): it is busy: %s", s->host, s->port, s->timeout, busy);
            ddp__err_fix = "raise the open-file limit of rank 0's process (ulimit -n), or stop the program that opens "
                           "connections to MASTER_PORT (ss -tnp shows who)";
            break;
        }
        ddp__sleep(backoff);
        backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
    }
    if (st != DDP_OK) {
        ddp__store_destroy(s);
        return st;
    }
    *out = s;
    return DDP_OK;
}

/* Wait (until `deadline`) for the server to close this client's connection: the sign that the
   process hosting it has stopped it. The server never writes unasked, so anything readable is
   the end. Returns 1 when it closed, 0 at the deadline. */
DDP__PRIVATE int ddp__store_wait_closed(ddp_store* s, double deadline) {
    for (;;) {
        struct pollfd pf;
        char b;
        pf.fd = s->fd, pf.events = POLLIN, pf.revents = 0;
        if (poll(&pf, 1, ddp__ms_left(deadline)) > 0) {
            ssize_t k = recv(s->fd, &b, 1, MSG_PEEK);
            if (k <= 0 && !(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) return 1;
            if (k > 0) return 1; /* not a reply to anything: the connection is over for us too */
        }
        if (ddp__now() >= deadline) return 0;
    }
}

/* Close the client and, if this process hosts it, stop the server. NULL is ignored. */
DDP__PRIVATE void ddp__store_destroy(ddp_store* s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    ddp__server_stop(s->server);
    pthread_mutex_destroy(&s->lock);
    DDP_FREE(s);
}

/* The port the server listens on (useful after port -1). */
DDP__PRIVATE int ddp__store_port(const ddp_store* s) { return s->port; }

DDP__DEF ddp_status ddp_store_set(ddp_store* s, const char* key, const void* value, size_t nbytes) {
    int st;
    DDP__TRY(ddp__store_call(s, DDP__OP_SET, key, value, nbytes, s->timeout, &st, NULL, NULL));
    return st == DDP__ST_OK ? DDP_OK : ddp__fail(DDP_ERR_OUT_OF_MEMORY, "the store could not keep \"%s\"", key);
}

DDP__DEF ddp_status ddp_store_get(ddp_store* s, const char* key, void* buf, size_t capacity, size_t* nbytes) {
    int st;
    unsigned char* v = NULL;
    uint32_t n = 0;
    DDP__TRY(ddp__store_call(s, DDP__OP_GET, key, NULL, 0, s->timeout, &st, &v, &n));
    if (st == DDP__ST_TIMEOUT)
        return ddp__fail(DDP_ERR_TIMEOUT, "key \"%s\" did not appear in the store within %.0f s: the rank that "
                         "should set it is missing or stuck", key, s->timeout);
    if (buf && n) memcpy(buf, v, n < capacity ? n : capacity);
    if (v) DDP_FREE(v);
    if (nbytes) *nbytes = n;
    return DDP_OK;
}

/* Atomically add delta to the integer stored at key (missing = 0); *value gets the new value. */
DDP__PRIVATE ddp_status ddp__store_add(ddp_store* s, const char* key, int64_t delta, int64_t* value) {
    int st;
    unsigned char d[8], *v = NULL;
    uint32_t n = 0;
    ddp__put_le64(d, (uint64_t)delta);
    DDP__TRY(ddp__store_call(s, DDP__OP_ADD, key, d, 8, s->timeout, &st, &v, &n));
    if (n == 8 && value) *value = (int64_t)ddp__le64(v);
    if (v) DDP_FREE(v);
    return n == 8 ? DDP_OK : ddp__fail(DDP_ERR_STORE_LOST, "the store answered add(\"%s\") without a value", key);
}

/* Pack keys as a WAIT/CHECK list into a DDP_MALLOC'd buffer. */
DDP__PRIVATE ddp_status ddp__key_list(const char* const* keys, int n, unsigned char** out, size_t* len) {
    size_t total = 0, pos = 0;
    int i;
    for (i = 0; i < n; i++) {
        if (strlen(keys[i]) > DDP_STORE_MAX_KEY)
            return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "store key \"%.40s...\" is longer than %d bytes", keys[i],
                             DDP_STORE_MAX_KEY);
        total += 4 + strlen(keys[i]);
    }
    *out = (unsigned char*)ddp__malloc(total ? total : 1);
    if (!*out) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating a key list failed");
    for (i = 0; i < n; i++) {
        size_t k = strlen(keys[i]);
        ddp__put_le32(*out + pos, (uint32_t)k);
        memcpy(*out + pos + 4, keys[i], k);
        pos += 4 + k;
    }
    *len = total;
    return DDP_OK;
}

/* How many of keys[0..n) exist now, without waiting. */
DDP__PRIVATE ddp_status ddp__store_check(ddp_store* s, const char* const* keys, int n, int* present) {
    unsigned char *list, *rep = NULL;
    size_t len;
    uint32_t cnt = 0;
    int st;
    ddp_status r;
    DDP__TRY(ddp__key_list(keys, n, &list, &len));
    r = ddp__store_call(s, DDP__OP_CHECK, "", list, len, s->timeout, &st, &rep, &cnt);
    DDP_FREE(list);
    if (r == DDP_OK) *present = (rep && cnt == 4) ? (int)ddp__le32(rep) : 0;
    if (rep) DDP_FREE(rep);
    return r;
}

/* Wait until every one of keys[0..n) exists, at most timeout_s (<= 0: the store's timeout).
   DDP_ERR_TIMEOUT naming the first missing key. */
DDP__PRIVATE ddp_status ddp__store_wait(ddp_store* s, const char* const* keys, int n, double timeout_s) {
    unsigned char* list;
    size_t len;
    int st;
    ddp_status r;
    double t = timeout_s > 0 ? timeout_s : s->timeout;
    DDP__TRY(ddp__key_list(keys, n, &list, &len));
    r = ddp__store_call(s, DDP__OP_WAIT, "", list, len, t, &st, NULL, NULL);
    DDP_FREE(list);
    DDP__TRY(r);
    if (st == DDP__ST_TIMEOUT) {
        int i, present = 0;
        for (i = 0; i < n; i++) /* name the first missing key */
            if (ddp__store_check(s, keys + i, 1, &present) != DDP_OK || !present) break;
        return ddp__fail(DDP_ERR_TIMEOUT, "waited %.0f s for %d store key%s; \"%s\" never appeared: the rank "
                         "that should set it is missing or stuck", t, n, n == 1 ? "" : "s", i < n ? keys[i] : "?");
    }
    return DDP_OK;
}

/* Block until `count` callers have reached the barrier called `name`. Each name is single-use. */
DDP__PRIVATE ddp_status ddp__store_barrier(ddp_store* s, const char* name, int count) {
    char key[DDP_STORE_MAX_KEY], done[DDP_STORE_MAX_KEY];
    const char* keys[1];
    int64_t arrived = 0;
    snprintf(key, sizeof key, "ddp/barrier/%s", name);
    snprintf(done, sizeof done, "ddp/barrier/%s/done", name);
    DDP__TRY(ddp__store_add(s, key, 1, &arrived));
    if (arrived == count) DDP__TRY(ddp_store_set(s, done, "1", 1));
    keys[0] = done;
    if (ddp__store_wait(s, keys, 1, 0) != DDP_OK) {
        int64_t now = arrived;
        if (ddp__last_status() != DDP_ERR_TIMEOUT) return ddp__last_status(); /* e.g. the store is gone */
        ddp__store_add(s, key, 0, &now);
        return ddp__fail(DDP_ERR_TIMEOUT, "barrier \"%s\": only %lld of %d processes arrived within %.0f s",
                         name, (long long)now, count, s->timeout);
    }
    return DDP_OK;
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>signals: who has joined, the flight record, desync checks, the watchdog, ddp_init's waits   */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* The ranks 0..n-1 whose flag equals `want`, compactly ("0-3, 7, 9-12"), cut short with "..." when
   they do not fit in out. Returns how many there are. */
DDP__PRIVATE int ddp__rank_list(const unsigned char* flags, int n, int want, char* out, size_t cap) {
    int i = 0, count = 0;
    size_t len = 0;
    out[0] = 0;
    while (i < n) {
        int j = i;
        if ((flags[i] != 0) != (want != 0)) { i++; continue; }
        while (j + 1 < n && (flags[j + 1] != 0) == (want != 0)) j++;
        count += j - i + 1;
        if (len + 32 < cap) {
            int k = j == i ? snprintf(out + len, cap - len, "%s%d", len ? ", " : "", i)
                           : snprintf(out + len, cap - len, "%s%d-%d", len ? ", " : "", i, j);
            len += k > 0 ? (size_t)k : 0;
        } else if (len + 5 < cap && strcmp(out + len - 3, "...") != 0) {
            len += (size_t)snprintf(out + len, cap - len, ", ...");
        }
        i = j + 1;
    }
    return count;
}

/* While ranks are missing from the rendezvous: which have joined (published their world size)
   and which are awaited. Rank 0, which hosts the store, says so every few seconds (as torchrun's
   rendezvous does), so that a WORLD_SIZE larger than the processes started is not 300 s of
   silence; every rank notes it for a SIGTERM to print. */
DDP__PRIVATE void ddp__join_progress(ddp_pg* pg, double started, int say) {
    unsigned char* joined = (unsigned char*)ddp__calloc((size_t)pg->world);
    char have[160], missing[160], key[64];
    int i, nj, nm, present = 0;
    if (!joined) return;
    for (i = 0; i < pg->world; i++) {
        const char* k[1];
        snprintf(key, sizeof key, "ddp/world/%d", i);
        k[0] = key;
        if (ddp__store_check(pg->store, k, 1, &present) != DDP_OK) break;
        joined[i] = (unsigned char)(present != 0);
    }
    if (i == pg->world) {
        nj = ddp__rank_list(joined, pg->world, 1, have, sizeof have);
        nm = ddp__rank_list(joined, pg->world, 0, missing, sizeof missing);
        ddp__wait_note("waiting for rank%s %s to join the job: %d of %d (WORLD_SIZE) had joined after %.0f s (rank%s %s)",
                       nm == 1 ? "" : "s", missing, nj, pg->world, ddp__now() - started, nj == 1 ? "" : "s", have);
        if (say)
            ddp__log(DDP_LOG_WARN, "waiting for rank%s %s to join the job: %d of %d ranks (WORLD_SIZE=%d) have joined "
                    "after %.0f s (rank%s %s). Start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, "
                    "or fix WORLD_SIZE if fewer processes belong to the job; DDP_TIMEOUT ends the wait after %.0f s",
                    nm == 1 ? "" : "s", missing, nj, pg->world, pg->world, ddp__now() - started, nj == 1 ? "" : "s",
                    have, pg->timeout);
    }
    DDP_FREE(joined);
}


/* SIGUSR1 prints the record of the newest group. The handler only writes a byte to a pipe (all a
   signal handler may safely do); a small thread reads it and prints. The handler is installed
   only when SIGUSR1 still has its default action, so a program's own handler is left alone. */
static pthread_mutex_t ddp__usr1_lock = PTHREAD_MUTEX_INITIALIZER;
static ddp_pg* ddp__usr1_pg;       /* under ddp__usr1_lock */
static int ddp__usr1_pipe[2] = {-1, -1};
static pthread_once_t ddp__usr1_once = PTHREAD_ONCE_INIT;

static void ddp__usr1_handler(int sig) {
    int saved = errno;
    ssize_t k = write(ddp__usr1_pipe[1], "d", 1);
    (void)k, (void)sig;
    errno = saved;
}
static void* ddp__usr1_main(void* arg) {
    char c;
    (void)arg;
    while (read(ddp__usr1_pipe[0], &c, 1) >= 0 || errno == EINTR) {
        pthread_mutex_lock(&ddp__usr1_lock);
        if (ddp__usr1_pg) ddp__flight_dump(ddp__usr1_pg, DDP_LOG_WARN, "SIGUSR1");
        else ddp__log(DDP_LOG_WARN, "SIGUSR1: no process group is open");
        pthread_mutex_unlock(&ddp__usr1_lock);
    }
    return NULL;
}
static void ddp__usr1_setup(void) {
    struct sigaction old, sa;
    pthread_t t;
    if (sigaction(SIGUSR1, NULL, &old) != 0 || old.sa_handler != SIG_DFL) return;
    if (pipe(ddp__usr1_pipe) != 0) return;
    fcntl(ddp__usr1_pipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(ddp__usr1_pipe[1], F_SETFD, FD_CLOEXEC);
    if (pthread_create(&t, NULL, ddp__usr1_main, NULL) != 0) return;
    pthread_detach(t);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ddp__usr1_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

/* A process that ends with its group still open (main returns without ddp_destroy; exit()) tells its
   neighbour so, as ddp_destroy would: else a rank still training reads the closed connection as
   a death. Through atexit, and from ddp_spawn's child before its _exit. */
DDP__PRIVATE void ddp__exit_leave(void) {
    static const char* const keys[2] = {"ddp/exited", "ddp/left"};
    unsigned char one[8], *v = NULL;
    uint32_t n = 0;
    int i, st = 0;
    ddp_pg* pg;
    pthread_mutex_lock(&ddp__usr1_lock);
    pg = ddp__usr1_pg;
    pthread_mutex_unlock(&ddp__usr1_lock);
    if (!pg || !pg->joined) return;
    if (pg->vt == ddp__cpu_vt()) ddp__cpu_leave(pg, ddp__check_failed ? DDP__LEFT_FAILED : DDP__LEFT_EXIT);
    /* counted as gone by rank 0's ddp_destroy, which else waits for it until the deadline. Not when
       another thread is inside a store call (it might never return), and for half a second at most
       (rank 0 may be stopped, with the store in it). */
    ddp__put_le64(one, 1);
    if (pthread_mutex_trylock(&pg->store->lock) != 0) return;
    pthread_mutex_unlock(&pg->store->lock);
    for (i = 0; i < 2; i++) {
        if (ddp__store_call_x(pg->store, DDP__OP_ADD, keys[i], one, 8, 0.5, 0.0, &st, &v, &n) != DDP_OK) return;
        if (v) DDP_FREE(v), v = NULL;
    }
#if DDP__CUDA
    /* Over NCCL the others learn who has ended from the store (the watchdog), which rank 0 hosts:
       after a loss (ddp/lost), on its way out it keeps the store, for 2 s at most, while they are
       still connected, or a rank that looks after rank 0 has ended would name rank 0, not the
       first loss. */
    if (pg->rank == 0 && pg->store->server && pg->vt == ddp__nccl_vt() && pg->world > 1) {
        unsigned char* gone = (unsigned char*)ddp__calloc((size_t)pg->world);
        const char* lost[1] = {"ddp/lost/first"};
        double until = ddp__now() + 2.0;
        int ended = 0, loss = 0;
        if (ddp__store_check(pg->store, lost, 1, &loss) != DDP_OK) loss = 0;
        while (loss && gone && ddp__now() < until && ddp__watch_count(pg, gone, 0.5, &ended) == DDP_OK &&
               ended < pg->world - 1)
            ddp__sleep(0.05);
        if (gone) DDP_FREE(gone);
    }
#endif
}
static pthread_once_t ddp__exit_once = PTHREAD_ONCE_INIT;
static void ddp__exit_setup(void) { atexit(ddp__exit_leave); }

/* From now on SIGUSR1 prints pg's record (the handler is installed the first time), and the
   process's end without ddp_destroy is told to pg's neighbour. */
DDP__PRIVATE void ddp__usr1_follow(ddp_pg* pg) {
    pthread_once(&ddp__usr1_once, ddp__usr1_setup);
    pthread_once(&ddp__exit_once, ddp__exit_setup);
    pthread_mutex_lock(&ddp__usr1_lock);
    ddp__usr1_pg = pg;
    pthread_mutex_unlock(&ddp__usr1_lock);
}

/* pg is going away: SIGUSR1 stops printing it. */
DDP__PRIVATE void ddp__usr1_forget(ddp_pg* pg) {
    pthread_mutex_lock(&ddp__usr1_lock);
    if (ddp__usr1_pg == pg) ddp__usr1_pg = NULL;
    pthread_mutex_unlock(&ddp__usr1_lock);
}
/* What ddp_init is waiting for, said when a SIGTERM or SIGINT stops it there (ddprun stops a job
   whose ranks never all came with SIGTERM; ^C sends SIGINT): otherwise a rank killed during a
   long rendezvous dies without a word. The text is formatted beforehand, into the buffer the
   handler is not reading, because a handler may only write(). Installed only for signals that
   still have their default action (a program's own handler is left alone), from the start of
   ddp_init to its end. */
static char ddp__waiting[2][640];
static volatile sig_atomic_t ddp__waiting_at = -1; /* the buffer to print, -1: nothing */
static const int ddp__wait_sigs[2] = {SIGTERM, SIGINT};
static struct sigaction ddp__wait_old[2];
static int ddp__wait_mine[2]; /* 1: our handler is installed for that signal */
static pthread_mutex_t ddp__wait_lock = PTHREAD_MUTEX_INITIALIZER;

static void ddp__wait_on_signal(int sig, siginfo_t* info, void* ctx) {
    int saved = errno, i, at = ddp__waiting_at;
    const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    if (at == 0 || at == 1) {
        const char* t = ddp__waiting[at];
        const char* cut = strchr(t, '\t'); /* the text is "LABELddp_init got \tSIGNAL while ...\n" */
        ssize_t k = cut ? write(2, t, (size_t)(cut - t)) : 0;
        k = write(2, name, strlen(name));
        k = write(2, cut ? cut + 1 : t, strlen(cut ? cut + 1 : t));
        (void)k;
    }
    for (i = 0; i < 2 && ddp__wait_sigs[i] != sig; i++) {}
    if (i < 2) { /* then what the signal would have done: its default action */
        sigaction(sig, &ddp__wait_old[i], NULL);
        raise(sig); /* blocked while this runs: acted on when it returns */
    }
    (void)info, (void)ctx;
    errno = saved;
}

/* Say (for a signal to print) what ddp_init waits for now: printf-style, one line. */
DDP__PRIVATE void ddp__wait_note(const char* fmt, ...) DDP__PRINTF(1, 2);
DDP__PRIVATE void ddp__wait_note(const char* fmt, ...) {
    int next = ddp__waiting_at == 0 ? 1 : 0;
    char label[48] = "";
    size_t n;
    va_list ap;
    if (!ddp__relayed()) ddp__label(label, sizeof label);
    n = (size_t)snprintf(ddp__waiting[next], sizeof ddp__waiting[next], "%sddp_init got \t while ", label);
    if (n >= sizeof ddp__waiting[next]) n = 0;
    va_start(ap, fmt);
    vsnprintf(ddp__waiting[next] + n, sizeof ddp__waiting[next] - n - 1, fmt, ap);
    va_end(ap);
    strcat(ddp__waiting[next], "\n");
    ddp__waiting_at = next;
}

DDP__PRIVATE void ddp__wait_watch(int on) {
    int i;
    pthread_mutex_lock(&ddp__wait_lock);
    for (i = 0; i < 2; i++) {
        struct sigaction cur, sa;
        if (on && !ddp__wait_mine[i] && sigaction(ddp__wait_sigs[i], NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
            cur.sa_handler == SIG_DFL) {
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = ddp__wait_on_signal;
            sa.sa_flags = SA_SIGINFO;
            sigemptyset(&sa.sa_mask);
            if (sigaction(ddp__wait_sigs[i], &sa, &ddp__wait_old[i]) == 0) ddp__wait_mine[i] = 1;
        } else if (!on && ddp__wait_mine[i]) {
            /* only while ours is still the handler (the shared-memory guard may sit on top of it and
               puts ours back when it is done; then ours stays, and with nothing noted only dies) */
            if (sigaction(ddp__wait_sigs[i], NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
                cur.sa_sigaction == ddp__wait_on_signal)
                sigaction(ddp__wait_sigs[i], &ddp__wait_old[i], NULL), ddp__wait_mine[i] = 0;
        }
    }
    if (!on) ddp__waiting_at = -1;
    pthread_mutex_unlock(&ddp__wait_lock);
}

/* ---- the flight recorder: each rank's last collectives (>>pg records them) ------------------------ */
/* Record that collective w reached `state`. */
DDP__PRIVATE void ddp__flight_note(ddp_pg* pg, const ddp_work* w, int state) {
    ddp__flight* f = &pg->flight[w->seq % DDP__FLIGHT_N];
    double t = ddp__now();
    pthread_mutex_lock(&pg->lock);
    if (state == DDP__FL_QUEUED) {
        f->seq = w->seq, f->kind = w->kind, f->count = w->count, f->dtype = w->dtype;
        f->t_issue = t, f->t_start = f->t_end = 0;
    }
    if (f->seq == w->seq) {
        f->state = state;
        if (state == DDP__FL_RUNNING) f->t_start = t;
        if (state >= DDP__FL_DONE) f->t_end = t;
    }
    pthread_mutex_unlock(&pg->lock);
}

/* Log this rank's last collectives, oldest first, at `level`. */
DDP__PRIVATE void ddp__flight_dump(ddp_pg* pg, ddp_log_level level, const char* why) {
    ddp__flight copy[DDP__FLIGHT_N];
    uint64_t newest = 0;
    int i, n = 0;
    double now = ddp__now();
    pthread_mutex_lock(&pg->lock);
    memcpy(copy, pg->flight, sizeof copy);
    pthread_mutex_unlock(&pg->lock);
    for (i = 0; i < DDP__FLIGHT_N; i++)
        if (copy[i].seq > newest) newest = copy[i].seq;
    ddp__log(level, "the last collectives of rank %d (%s), oldest first:", pg->rank, why);
    for (i = 0; i < DDP__FLIGHT_N; i++) {
        const ddp__flight* f = &copy[(newest + 1 + (uint64_t)i) % DDP__FLIGHT_N];
        char when[64];
        if (!f->seq) continue;
        n++;
        if (f->state == DDP__FL_QUEUED) snprintf(when, sizeof when, "queued %.3f s ago, not started", now - f->t_issue);
        else if (f->state == DDP__FL_RUNNING) snprintf(when, sizeof when, "RUNNING for %.3f s", now - f->t_start);
        else snprintf(when, sizeof when, "%s in %.3f ms, %.3f s ago", f->state == DDP__FL_DONE ? "done" : "FAILED",
                      (f->t_end - f->t_start) * 1e3, now - f->t_end);
        ddp__log(level, "  #%llu %s (%zu x %s): %s", (unsigned long long)f->seq, ddp__coll_name(f->kind), f->count,
                ddp__dtype_name(f->dtype), when);
    }
    if (!n) ddp__log(level, "  (none yet)");
}
/* ---- desync detection (DDP_DEBUG=DETAIL) ------------------------------------------------------------ */
/* Before each collective every rank publishes what it is about to call, "all_reduce #42 (1091 x
   f32, sum)", under ddp/fp/<rank>/<seq % 4>, and reads every other rank's entry for the same
   sequence number. Different entries mean the ranks have fallen out of step (the classic cause
   of a DDP hang); an entry that never comes means a rank is not calling this collective at all.
   Four slots per rank suffice: no rank can get more than one collective ahead of another,
   because each waits here for all the others. Costs a few store round trips per collective. */
DDP__PRIVATE ddp_status ddp__desync_check(ddp_pg* pg, const ddp_work* w) {
    char mine[128], theirs[128], key[64], seqtag[32];
    size_t n;
    int r;
    double deadline = ddp__now() + pg->timeout;
    ddp__fingerprint(w, mine, sizeof mine);
    snprintf(seqtag, sizeof seqtag, " #%llu ", (unsigned long long)w->seq);
    snprintf(key, sizeof key, "ddp/fp/%d/%d", pg->rank, (int)(w->seq % 4));
    DDP__TRY(ddp_store_set(pg->store, key, mine, strlen(mine)));
    snprintf(key, sizeof key, "ddp/fp/%d/last", pg->rank);
    DDP__TRY(ddp_store_set(pg->store, key, mine, strlen(mine)));
    for (r = 0; r < pg->world; r++) {
        const char* k = key;
        int present = 0;
        if (r == pg->rank) continue;
        snprintf(key, sizeof key, "ddp/fp/%d/%d", r, (int)(w->seq % 4));
        for (;;) { /* until rank r's slot holds this sequence number */
            DDP__TRY(ddp__store_check(pg->store, &k, 1, &present));
            if (present) {
                memset(theirs, 0, sizeof theirs);
                DDP__TRY(ddp_store_get(pg->store, key, theirs, sizeof theirs - 1, &n));
                if (strstr(theirs, seqtag)) break;
            }
            if (ddp__now() >= deadline) {
                char lastkey[64];
                const char* lk = lastkey;
                snprintf(lastkey, sizeof lastkey, "ddp/fp/%d/last", r);
                memset(theirs, 0, sizeof theirs);
                if (ddp__store_check(pg->store, &lk, 1, &present) == DDP_OK && present)
                    ddp_store_get(pg->store, lastkey, theirs, sizeof theirs - 1, &n);
                return ddp__fail(DDP_ERR_TIMEOUT, "desync: this rank (%d) is calling %s, but rank %d has not reached "
                                 "collective #%llu within %.0f s; its last collective was %s. A collective must be "
                                 "called by every rank: look for one that only some ranks reach (inside an if on "
                                 "the rank, or a loop with a different number of batches per rank)", pg->rank, mine,
                                 r, (unsigned long long)w->seq, pg->timeout, theirs[0] ? theirs : "none yet");
            }
            ddp__sleep(0.0005);
        }
        if (strcmp(theirs, mine) != 0)
            return ddp__fail(DDP_ERR_DESYNC, "desync at collective #%llu: this rank (%d) calls %s, rank %d calls %s. "
                             "Every rank must call the same collectives in the same order with the same sizes",
                             (unsigned long long)w->seq, pg->rank, mine, r, theirs);
    }
    return DDP_OK;
}

DDP__PRIVATE void ddp__live_key(int rank, const char* who, char* out, size_t n); /* below */
/* ---- the watchdog: signs of life, and what each rank waits in at a deadline ----------------------- */
/* NCCL tells a rank neither that a peer on its machine has died (its kernel waits on shared memory
   or NVLink for data that never comes) nor that the ranks called different collectives (a count
   that differs can hang, or finish with wrong data). So while a wait over NCCL lasts, ddp.h looks
   for itself, as PyTorch's watchdog thread does for ProcessGroupNCCL: once a second it counts the
   ranks' signs of life in the store (the ddp/live/ keys, which go when their process's store
   connection closes, that is when the process ends), and names a rank that is gone; rank 0's own
   end shows as the store's connection closing. A stopped rank keeps its sign of life: the others
   wait until the deadline, where each publishes the collective it waits in and reads the others'
   for a moment, so that the error names the collectives and the ranks. One small request per
   second per waiting rank, only after the first second of a wait. */
#define DDP__REPORT_S 2.0 /* at a deadline, how long a rank waits for the others' answers */

/* How many of keys[0..n) the store holds, asking for at most `within_s` seconds: the watchdog's
   requests must not hold a wait whose store host is stopped. */
DDP__PRIVATE ddp_status ddp__watch_check(ddp_pg* pg, const char* const* keys, int n, double within_s, int* present) {
    unsigned char *list = NULL, *rep = NULL;
    size_t len = 0;
    uint32_t cnt = 0;
    int st = 0;
    ddp_status s = ddp__key_list(keys, n, &list, &len);
    if (s == DDP_OK) s = ddp__store_call_x(pg->store, DDP__OP_CHECK, "", list, len, within_s, 0.0, &st, &rep, &cnt);
    *present = s == DDP_OK && rep && cnt == 4 ? (int)ddp__le32(rep) : 0;
    if (rep) DDP_FREE(rep);
    if (list) DDP_FREE(list);
    return s;
}

/* The value of `key` into buf (cap bytes, ended by a 0), asking for at most `within_s` seconds.
   Returns 1 when the key was there. */
DDP__PRIVATE int ddp__watch_get(ddp_pg* pg, const char* key, char* buf, size_t cap, double within_s) {
    unsigned char* v = NULL;
    uint32_t n = 0;
    int st = 0, got;
    memset(buf, 0, cap);
    got = ddp__store_call_x(pg->store, DDP__OP_GET, key, NULL, 0, within_s, 0.0, &st, &v, &n) == DDP_OK &&
          st == DDP__ST_OK && v;
    if (got) memcpy(buf, v, n < cap - 1 ? n : cap - 1);
    if (v) DDP_FREE(v);
    return got;
}

/* Every rank's ddp/live/ key (from its claim, which ddp__agree made), into pg->live_keys. */
DDP__PRIVATE ddp_status ddp__watch_keys(ddp_pg* pg) {
    char key[48], holder[320];
    int r;
    if (pg->live_keys) return DDP_OK;
    pg->live_keys = (char*)ddp__calloc((size_t)pg->world * 64);
    if (!pg->live_keys) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "the watchdog's list of %d ranks", pg->world);
    for (r = 0; r < pg->world; r++) { /* each within 2 s: a stopped rank 0 must not hold the wait */
        snprintf(key, sizeof key, "ddp/claim/%d", r);
        if (!ddp__watch_get(pg, key, holder, sizeof holder, 2.0)) { /* the list is whole or absent */
            DDP_FREE(pg->live_keys);
            pg->live_keys = NULL;
            return ddp__fail(DDP_ERR_STORE_LOST, "the claim of rank %d could not be read from the store", r);
        }
        ddp__live_key(r, holder, pg->live_keys + (size_t)r * 64, 64);
    }
    return DDP_OK;
}

/* Which ranks' signs of life are gone, as flags (1: gone) in gone[world]; DDP_OK, or the store's
   failure (pg->store->gone says whether it closed or did not answer within `within_s`). */
DDP__PRIVATE ddp_status ddp__watch_count(ddp_pg* pg, unsigned char* gone, double within_s, int* ngone) {
    const char** keys = (const char**)ddp__calloc((size_t)pg->world * sizeof *keys);
    int r, present = 0;
    ddp_status s = keys ? ddp__watch_keys(pg) : DDP_ERR_OUT_OF_MEMORY;
    *ngone = 0;
    for (r = 0; s == DDP_OK && r < pg->world; r++) keys[r] = pg->live_keys + (size_t)r * 64;
    if (s == DDP_OK) s = ddp__watch_check(pg, keys, pg->world, within_s, &present);
    for (r = 0; s == DDP_OK && present < pg->world && r < pg->world; r++) { /* rare: find who */
        int one = 1;
        s = ddp__watch_check(pg, keys + r, 1, within_s, &one);
        gone[r] = s == DDP_OK && !one;
        *ngone += gone[r];
    }
    if (keys) DDP_FREE(keys);
    return s;
}

/* Called by a wait over NCCL (>>nccl) at most once a second, and at once when NCCL has reported
   an error (`told`: its text, else NULL): DDP_ERR_PEER_LOST naming a rank whose process has ended
   while this rank waited in `what`, else DDP_OK (and the wait goes on). */
DDP__PRIVATE ddp_status ddp__watch_peers(ddp_pg* pg, const char* what, const char* told) {
    unsigned char* gone;
    char list[160], holder[320], key[48];
    int n = 0, first = -1, r;
    ddp_status s;
    if (!pg->store || pg->world < 2 || pg->watch_off) return DDP_OK;
    if (!(gone = (unsigned char*)ddp__calloc((size_t)pg->world))) return DDP_OK;
    s = ddp__watch_count(pg, gone, 2.0, &n);
    if (s != DDP_OK) {
        DDP_FREE(gone);
        if (pg->store->gone == 1) /* the store's connection closed: rank 0, which hosts it, has ended */
            return ddp__fail(DDP_ERR_PEER_LOST, "%s: rank 0 has ended (the store it hosts closed this rank's "
                             "connection)%s%s. See rank 0's output for why it stopped", what,
                             told ? "; NCCL said: " : "", told ? told : "");
        pg->watch_off = 1; /* stopped answering: rank 0 is stopped or overloaded; the deadline decides */
        return DDP_OK;
    }
    for (r = 0; r < pg->world; r++)
        if (gone[r] && r != pg->rank && first < 0) first = r;
    if (first < 0) {
        DDP_FREE(gone);
        return DDP_OK;
    }
    /* The first rank to notice names the first loss in the store (ddp/lost): a survivor that gives
       up ends too, and whoever looks later should still name the cause, not the survivors. */
    {
        unsigned char one[8], *v = NULL;
        uint32_t vn = 0;
        int st = 0, mine = 0;
        ddp__put_le64(one, 1);
        if (ddp__store_call_x(pg->store, DDP__OP_ADD, "ddp/lost/count", one, 8, 2.0, 0.0, &st, &v, &vn) == DDP_OK &&
            v && vn == 8 && ddp__le64(v) == 1) {
            mine = 1;
            snprintf(key, sizeof key, "%d", first);
            ddp__store_call_x(pg->store, DDP__OP_SET, "ddp/lost/first", key, strlen(key), 2.0, 0.0, &st, NULL, NULL);
        }
        if (v) DDP_FREE(v);
        if (!mine && ddp__watch_get(pg, "ddp/lost/first", key, sizeof key, 2.0) && atoi(key) >= 0 &&
            atoi(key) < pg->world && atoi(key) != pg->rank)
            first = atoi(key);
    }
    gone[pg->rank] = 0;
    gone[first] = 0;
    n = ddp__rank_list(gone, pg->world, 1, list, sizeof list);
    DDP_FREE(gone);
    snprintf(key, sizeof key, "ddp/claim/%d", first);
    ddp__watch_get(pg, key, holder, sizeof holder, 2.0);
    if (strchr(holder, '|')) *strchr(holder, '|') = 0; /* "pid P on host H" */
    return ddp__fail(DDP_ERR_PEER_LOST, "%s: rank %d has ended while this rank waited (%s: its connection to the "
                     "store closed)%s%s%s%s. NCCL does not report a dead peer on one machine; see that rank's output "
                     "for why it stopped", what, first, holder[0] ? holder : "?", n ? "; since then also rank(s) " : "",
                     n ? list : "", told ? "; NCCL said: " : "", told ? told : "");
}

/* At the deadline of a wait in `what`: publish it, read what the other ranks wait in (for up to
   DDP__REPORT_S), and fail with the finding: DDP_ERR_DESYNC when ranks wait in different
   collectives, else DDP_ERR_TIMEOUT naming the ranks that did not answer (stopped, or stuck
   outside ddp.h). Also when NCCL has said the ranks' calls do not match (`told`: its words, which
   stand when every rank that answers waits in the same collective). */
DDP__PRIVATE ddp_status ddp__deadline_report(ddp_pg* pg, const char* what, const char* told) {
    char key[48], *text = NULL, quiet[160] = "", line[1024] = "";
    unsigned char* flag = NULL;
    int *group = NULL, r, q, g, n = 0, groups = 0, silent = 0, st = 0;
    size_t len = 0;
    double until = ddp__now() + (pg->timeout < DDP__REPORT_S ? pg->timeout : DDP__REPORT_S);
    snprintf(key, sizeof key, "ddp/waits/%d", pg->rank);
    if (pg->store && pg->world > 1 && !pg->watch_off && (text = (char*)ddp__calloc((size_t)pg->world * 128)) &&
        (flag = (unsigned char*)ddp__calloc((size_t)pg->world)) && (group = (int*)ddp__calloc((size_t)pg->world * sizeof *group)) &&
        ddp__store_call_x(pg->store, DDP__OP_SET, key, what, strlen(what), 1.0, 0.0, &st, NULL, NULL) == DDP_OK) {
        for (;;) { /* until every rank has answered, or the moment is over */
            for (r = 0, n = 0; r < pg->world; r++) {
                int present = 0;
                const char* k = key;
                if (text[(size_t)r * 128]) { n++; continue; }
                snprintf(key, sizeof key, "ddp/waits/%d", r);
                if (ddp__watch_check(pg, &k, 1, 1.0, &present) != DDP_OK) break;
                if (present && ddp__watch_get(pg, key, text + (size_t)r * 128, 128, 1.0) && text[(size_t)r * 128]) n++;
            }
            if (n == pg->world || ddp__now() >= until) break;
            ddp__sleep(0.05);
        }
        for (r = 0; r < pg->world; r++) { /* ranks that answered the same share a group; -1: no answer */
            flag[r] = text[(size_t)r * 128] == 0;
            group[r] = -1;
            for (q = 0; q < r && !flag[r]; q++)
                if (group[q] >= 0 && !strcmp(text + (size_t)q * 128, text + (size_t)r * 128)) { group[r] = group[q]; break; }
            if (!flag[r] && group[r] < 0) group[r] = groups++;
        }
        silent = ddp__rank_list(flag, pg->world, 1, quiet, sizeof quiet);
        for (g = 0; g < groups; g++) { /* "ranks 0, 2: all_reduce #5 (...); rank 1: broadcast #5 (...)" */
            char ranks[160];
            int at = -1;
            for (r = 0; r < pg->world; r++) {
                flag[r] = group[r] == g;
                if (flag[r] && at < 0) at = r;
            }
            n = ddp__rank_list(flag, pg->world, 1, ranks, sizeof ranks);
            if (len + 300 < sizeof line)
                len += (size_t)snprintf(line + len, sizeof line - len, "%srank%s %s in %.127s", g ? "; " : "",
                                        n > 1 ? "s" : "", ranks, text + (size_t)at * 128);
        }
    }
    if (text) DDP_FREE(text);
    if (flag) DDP_FREE(flag);
    if (group) DDP_FREE(group);
    if (groups > 1 && told)
        return ddp__fail(DDP_ERR_DESYNC, "the ranks wait in different collectives: %s%s%s. Every rank must call the "
                         "same collectives in the same order with the same sizes; the NCCL communicator was aborted "
                         "(NCCL said: %s)", line, silent ? "; no answer from rank(s) " : "", silent ? quiet : "", told);
    if (told) return ddp__fail(DDP_ERR_NCCL, "%s", told);
    if (groups > 1)
        return ddp__fail(DDP_ERR_DESYNC, "the ranks wait in different collectives, so none can finish (NCCL does not "
                         "check): %s%s%s. Every rank must call the same collectives in the same order with the same "
                         "sizes; the NCCL communicator was aborted after %.0f s", line,
                         silent ? "; no answer from rank(s) " : "", silent ? quiet : "", pg->timeout);
    if (silent)
        return ddp__fail(DDP_ERR_TIMEOUT, "%s did not finish within %.0f s; the NCCL communicator was aborted. %s%s"
                         "rank(s) %s did not say within %.0f s what they wait in: stopped (SIGSTOP, a debugger), stuck "
                         "outside ddp.h (a long computation, a deadlock), or past this collective without it",
                         what, pg->timeout, line, line[0] ? "; " : "", quiet, DDP__REPORT_S);
    return ddp__fail(DDP_ERR_TIMEOUT, "%s did not finish within %.0f s; the NCCL communicator was aborted. %s%s",
                     what, pg->timeout, groups ? "Every rank waits in it, so the GPUs or the links between them are "
                     "stuck, or slower than DDP_TIMEOUT allows (NCCL_DEBUG=INFO shows its transports)"
                     : "A rank is stuck, stopped, or calling a different collective", "");
}

/* ---- agreeing on the world (ddp_init) ------------------------------------------------------------- */

/* The first caller for `key` stores `value` under it; a later one gets the first one's value in
   `first` (n bytes) and *taken = 1. The store has no compare-and-set: a counter decides. */
DDP__PRIVATE ddp_status ddp__claim(ddp_pg* pg, const char* key, const char* value, char* first, size_t n, int* taken) {
    char count[DDP_STORE_MAX_KEY + 8];
    int64_t claims = 0;
    size_t got = 0;
    snprintf(count, sizeof count, "%s/claims", key);
    DDP__TRY(ddp__store_add(pg->store, count, 1, &claims));
    *taken = claims > 1;
    if (!*taken) return ddp_store_set(pg->store, key, value, strlen(value));
    memset(first, 0, n);
    return ddp_store_get(pg->store, key, first, n - 1, &got); /* set right after the first add */
}

/* Every rank publishes its view of the job; every rank reads all views. A rank that sees a
   disagreement publishes it under ddp/abort so that the others fail at once with the same
   explanation instead of waiting out the timeout. A slot once taken stays taken: a second process
   for one rank (or one node of a launcher) is refused with who holds it, and the job goes on. */
#define DDP__JOIN_REPORT_S 5.0 /* seconds between rank 0's first reports of who is missing */
/* The store key of the sign of life of the process `who` ("pid P on host H|pid namespace") that
   claims rank `rank`: a ddp/live/ key, gone when that process's store connection closes. */
DDP__PRIVATE void ddp__live_key(int rank, const char* who, char* out, size_t n) {
    snprintf(out, n, DDP__LIVE_PREFIX "%d/%016llx", rank,
             (unsigned long long)ddp__fnv1a((const unsigned char*)who, strlen(who)));
}

DDP__PRIVATE ddp_status ddp__agree(ddp_pg* pg) {
    char key[64], mine[64], theirs[64], me[320], holder[320], host[256] = "?", live[64];
    const char* abort_key[1] = {"ddp/abort"};
    const char* launch = getenv("DDP_LAUNCH_ID");
    int i, present, taken = 0;
    double started = ddp__now(), deadline = started + pg->timeout, report = started + DDP__JOIN_REPORT_S;
    gethostname(host, sizeof host - 1);
    /* ddprun names its launch (DDP_LAUNCH_ID): the ranks of one node must all come from the
       launch that started that node's first rank, or two launches given one MASTER_PORT and one
       DDP_JOB_TOKEN would mix their ranks (the later one's rank 1 taking the free slot). */
    if (launch) { /* set but empty: refused as any other launch's id would be, not ignored */
        snprintf(me, sizeof me, "%.200s", *launch ? launch : "(an empty DDP_LAUNCH_ID)");
        snprintf(key, sizeof key, "ddp/launch/%d", pg->env.node_rank);
        DDP__TRY(ddp__claim(pg, key, me, holder, sizeof holder, &taken));
        if (taken && strcmp(holder, me) != 0)
            return ddp__fail(DDP_ERR_STORE_REFUSED, "the store at %s:%d refused this rank: it belongs to another "
                             "launch. Node %d of the job there was started by launch %s (host:launcher pid:start time), "
                             "this rank by launch %s: two jobs share MASTER_PORT %d and DDP_JOB_TOKEN. Give each job its "
                             "own MASTER_PORT (ddprun --standalone picks a free one) or its own DDP_JOB_TOKEN",
                             pg->env.master_addr, pg->env.master_port, pg->env.node_rank, holder, me, pg->env.master_port);
    }
    /* who holds the slot: "pid P on host H", then (not shown) this process's pid namespace */
    {
        char ns[48] = "";
#if DDP__LINUX
        ssize_t k = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
        ns[k > 0 ? k : 0] = 0;
#endif
        snprintf(me, sizeof me, "pid %ld on host %.200s|%s", (long)getpid(), host, ns);
    }
    /* the sign of life first, so that a claim never stands without one while its holder lives */
    ddp__live_key(pg->rank, me, live, sizeof live);
    DDP__TRY(ddp_store_set(pg->store, live, "1", 1));
    snprintf(key, sizeof key, "ddp/claim/%d", pg->rank);
    DDP__TRY(ddp__claim(pg, key, me, holder, sizeof holder, &taken));
    if (taken && strchr(holder, '|') && !strcmp(strchr(holder, '|'), strchr(me, '|'))) {
        /* A holder on this host, in this pid namespace, that no longer runs (killed during the
           rendezvous): its replacement takes the slot, and the job goes on. */
        long pid = 0;
        char on[210] = "";
        if (sscanf(holder, "pid %ld on host %200[^|]", &pid, on) == 2 && !strncmp(on, host, 200) && pid > 0 &&
            kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            ddp__log(DDP_LOG_WARN, "rank %d's slot was held by pid %ld on this host, which no longer runs: this "
                     "process takes it over", pg->rank, pid);
            DDP__TRY(ddp_store_set(pg->store, key, me, strlen(me)));
            taken = 0;
        }
    }
    if (taken) {
        /* A holder anywhere whose connection to the store has closed (killed on another host):
           its sign of life went with the connection, so the slot is free. */
        const char* k[1];
        int alive = 1;
        ddp__live_key(pg->rank, holder, live, sizeof live);
        k[0] = live;
        DDP__TRY(ddp__store_check(pg->store, k, 1, &alive));
        if (!alive) {
            char who[320];
            snprintf(who, sizeof who, "%s", holder);
            who[strcspn(who, "|")] = 0;
            ddp__log(DDP_LOG_WARN, "rank %d's slot was held by %s, whose connection to the store has closed (it died "
                     "or was killed during the rendezvous): this process takes it over", pg->rank, who);
            DDP__TRY(ddp_store_set(pg->store, key, me, strlen(me)));
            taken = 0;
        }
    }
    if (taken) {
        holder[strcspn(holder, "|")] = 0, me[strcspn(me, "|")] = 0;
        return ddp__fail(DDP_ERR_WORLD_MISMATCH, "two processes were started with RANK=%d: %s holds rank %d (it "
                         "came first), and this process, %s, came later. Give each process its own rank 0..%d; if "
                         "another job uses this MASTER_PORT with the same DDP_JOB_TOKEN, give each job its own port",
                         pg->rank, holder, pg->rank, me, pg->world - 1);
    }
    snprintf(mine, sizeof mine, "%d", pg->world);
    snprintf(key, sizeof key, "ddp/world/%d", pg->rank);
    DDP__TRY(ddp_store_set(pg->store, key, mine, strlen(mine)));
    for (i = 0; i < pg->world; i++) {
        const char* k[1];
        size_t n = 0;
        snprintf(key, sizeof key, "ddp/world/%d", i);
        k[0] = key;
        ddp__wait_note("waiting for rank %d to join the job (WORLD_SIZE=%d)", i, pg->world);
        for (;;) {
            DDP__TRY(ddp__store_check(pg->store, abort_key, 1, &present));
            if (present) {
                char why[256] = "";
                ddp_store_get(pg->store, "ddp/abort", why, sizeof why - 1, &n);
                return ddp__fail(DDP_ERR_WORLD_MISMATCH, "another rank stopped the job: %s", why);
            }
            DDP__TRY(ddp__store_check(pg->store, k, 1, &present));
            if (present) break;
            if (ddp__now() >= deadline)
                return ddp__fail(DDP_ERR_TIMEOUT, "rank %d never joined within %.0f s (this rank expects WORLD_SIZE=%d): "
                                 "start all %d processes, or fix WORLD_SIZE", i, pg->timeout, pg->world, pg->world);
            if (ddp__now() >= report) { /* every 5 s, and every 30 s after the first half minute */
                ddp__join_progress(pg, started, pg->rank == 0);
                report = ddp__now() + (ddp__now() - started < 30 ? DDP__JOIN_REPORT_S : 6 * DDP__JOIN_REPORT_S);
            }
            ddp__sleep(0.02);
        }
        memset(theirs, 0, sizeof theirs);
        DDP__TRY(ddp_store_get(pg->store, key, theirs, 15, &n)); /* a world size: a few digits */
        if (strcmp(theirs, mine) != 0) {
            char why[256];
            snprintf(why, sizeof why, "rank %d was started with WORLD_SIZE=%s but rank %d with WORLD_SIZE=%s: every "
                     "rank needs the same WORLD_SIZE", i, theirs, pg->rank, mine);
            ddp_store_set(pg->store, "ddp/abort", why, strlen(why));
            return ddp__fail(DDP_ERR_WORLD_MISMATCH, "%s", why);
        }
    }
    return DDP_OK;
}

/* ---- the same model on every rank (ddp_wrap) ------------------------------------------------------ */
/* The settings that change which collectives a step calls, or its arithmetic, as "name=value"
   words under ddp_wrap_desc's field names. A setting that another one turns off is left out
   (prefetch below stage 3, the buckets' settings at stages 2-3), so that the first word in which
   two ranks differ has the same name on both. */
DDP__PRIVATE void ddp__wrap_settings(const ddp_wrap_desc* d, char* out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "zero_stage=%d", d->zero_stage);
    if (d->zero_stage == 3 && n < cap) n += (size_t)snprintf(out + n, cap - n, " prefetch=%d", !!d->prefetch);
    if (n < cap) n += (size_t)snprintf(out + n, cap - n, " uneven_inputs=%d", !!d->uneven_inputs);
    if (d->uneven_inputs && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " divide_by_active_ranks=%d", !!d->divide_by_active_ranks);
    if (d->zero_stage < 2 && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " compress=%s bucket_cap_bytes=%lu first_bucket_bytes=%lu "
                              "gradient_as_bucket_view=%d", ddp__dtype_name(d->compress),
                              (unsigned long)d->bucket_cap_bytes, (unsigned long)d->first_bucket_bytes,
                              !!d->gradient_as_bucket_view);
    if (n < cap) snprintf(out + n, cap - n, " find_unused_parameters=%d", !!d->find_unused_parameters);
}

/* The first setting in which any rank differs from rank 0, with each value and its ranks: the same
   sentence on every rank that writes it (all[r]: rank r's settings; `what`: "wrapped the model" or
   "created the optimizer", and `desc` the struct that holds the settings). */
DDP__PRIVATE void ddp__settings_verdict(char** all, int W, const char* what, const char* desc, char* out, size_t cap) {
    size_t word = (size_t)-1, key, len;
    int r, q, k, count;
    for (r = 1; r < W; r++) { /* where the first word in which some rank differs from rank 0 starts */
        size_t i = 0, w0 = 0;
        for (; all[0][i] && all[0][i] == all[r][i]; i++)
            if (all[0][i] == ' ') w0 = i + 1;
        if ((all[0][i] || all[r][i]) && w0 < word) word = w0;
    }
    if (word == (size_t)-1) return;
    key = strcspn(all[0] + word, "="); /* the same name on every rank: the words before agree */
    for (r = 1; r < W; r++)
        if (strncmp(all[r] + word, all[0] + word, key + 1)) { /* not from this ddp.h's ddp__wrap_settings */
            snprintf(out, cap, "the ranks %s with different settings: rank 0 has %s, rank %d %s. Pass every rank "
                     "the same %s", what, all[0], r, all[r], desc);
            return;
        }
    len = (size_t)snprintf(out, cap, "the ranks %s with different settings: %.*s is ", what, (int)key,
                           all[0] + word);
#define DDP__VALUE(r) (all[r] + word + key + 1)
#define DDP__SAME(a, b) (!strncmp(DDP__VALUE(a), DDP__VALUE(b), strcspn(DDP__VALUE(a), " ") + 1))
    for (r = 0; r < W && len < cap; r++) { /* each value once, with the ranks that hold it */
        for (q = 0; q < r && !DDP__SAME(q, r); q++) {}
        if (q < r) continue;
        for (q = r, count = 0; q < W; q++) count += DDP__SAME(q, r);
        len += (size_t)snprintf(out + len, cap - len, "%s%.*s on rank%s", r ? "; " : "",
                                (int)strcspn(DDP__VALUE(r), " "), DDP__VALUE(r), count > 1 ? "s" : "");
        for (q = r, k = 0; q < W && len < cap; q++) {
            if (!DDP__SAME(q, r)) continue;
            if (k == 8 && count > 9) { /* a long list: the first eight */
                len += (size_t)snprintf(out + len, cap - len, " and %d more", count - 8);
                break;
            }
            len += (size_t)snprintf(out + len, cap - len, "%s %d", k++ ? "," : "", q);
        }
    }
#undef DDP__SAME
#undef DDP__VALUE
    if (len < cap)
        snprintf(out + len, cap - len, ". Pass every rank the same %s (the same options on every rank's command "
                 "line)", desc);
}

/* Each rank's settings `set` under `prefix` in the store, compared with rank 0's (every rank's
   read only when one differs): in verdict, "" when they agree, else the sentence naming the first
   that differs (ddp__settings_verdict's `what` and `desc`). */
DDP__PRIVATE ddp_status ddp__compare_settings(ddp_pg* pg, const char* prefix, const char* set, const char* what,
                                              const char* desc, char* verdict, size_t cap) {
    ddp_store* st = ddp_pg_store(pg);
    char key[96], set0[320];
    char** all;
    size_t n = 0;
    int i, W = ddp_world_size(pg);
    ddp_status s;
    snprintf(key, sizeof key, "%s/set/%d", prefix, ddp_rank(pg));
    DDP__TRY(ddp_store_set(st, key, set, strlen(set)));
    snprintf(key, sizeof key, "%s/set/0", prefix);
    memset(set0, 0, sizeof set0);
    DDP__TRY(ddp_store_get(st, key, set0, sizeof set0 - 1, &n));
    if (strcmp(set, set0) == 0) return DDP_OK;
    all = (char**)ddp__calloc((size_t)W * (sizeof(char*) + sizeof set0));
    if (!all) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "no memory to compare the ranks' settings");
    for (i = 0, s = DDP_OK; i < W && s == DDP_OK; i++) {
        all[i] = (char*)(all + W) + (size_t)i * sizeof set0;
        snprintf(key, sizeof key, "%s/set/%d", prefix, i);
        s = ddp_store_get(st, key, all[i], sizeof set0 - 1, &n);
    }
    if (s == DDP_OK) ddp__settings_verdict(all, W, what, desc, verdict, cap);
    DDP_FREE(all);
    return s;
}

/* Every rank publishes its verdict under `prefix` ("" when it found nothing) and reads every
   rank's: the first one given, in rank order, is what every rank reports, DDP_ERR_MODEL_MISMATCH
   with it (DDP_OK when all are empty). Each reads them all even after finding one: returning at
   the first would let rank 0 fail, and its program exit with the store, while a slower rank still
   waits for a verdict, which would then see the store vanish instead of the mismatch. */
DDP__PRIVATE ddp_status ddp__agree_verdict(ddp_pg* pg, const char* prefix, char* verdict, size_t cap) {
    ddp_store* st = ddp_pg_store(pg);
    char key[96];
    size_t n = 0;
    int i, W = ddp_world_size(pg), me = ddp_rank(pg);
    snprintf(key, sizeof key, "%s/verdict/%d", prefix, me);
    DDP__TRY(ddp_store_set(st, key, verdict, strlen(verdict)));
    verdict[0] = 0;
    for (i = 0; i < W; i++) {
        char theirs[768];
        memset(theirs, 0, sizeof theirs);
        snprintf(key, sizeof key, "%s/verdict/%d", prefix, i);
        DDP__TRY(ddp_store_get(st, key, theirs, sizeof theirs - 1, &n));
        if (theirs[0] && !verdict[0]) snprintf(verdict, cap, "%s", theirs);
    }
    if (!verdict[0]) return DDP_OK;
    /* A mismatch ends the job. Rank 0 holds the store until every rank has read its verdicts
       (each says so with one add, whose answer it has when the count is complete). */
    snprintf(key, sizeof key, "%s/told", prefix);
    {
        int64_t told = 0;
        double deadline = ddp__now() + pg->timeout;
        if (ddp__store_add(st, key, 1, &told) == DDP_OK)
            while (me == 0 && told < W && ddp__now() < deadline && ddp__store_add(st, key, 0, &told) == DDP_OK)
                ddp__sleep(0.002);
    }
    return ddp__fail(DDP_ERR_MODEL_MISMATCH, "%s", verdict);
}

/* Every rank must hold the same model: compare each rank's list of names and shapes with rank
   0's through the store, then the settings it was wrapped with, and let every rank fail with the
   same explanation when one differs (before the wrapper's first collective, which would otherwise
   be a different one on some rank). */
DDP__PRIVATE ddp_status ddp__verify_model(ddp_wrapper* w) {
    ddp_store* st = ddp_pg_store(w->pg);
    char *sig, *other, key[96], prefix[48], verdict[768], set[320];
    size_t n = 0, pos = 0, cap;
    int i, k, me = ddp_rank(w->pg);
    ddp_model* m = w->m;
    ddp_status s;
    /* a fresh key space per wrap: every rank wraps in the same order */
    snprintf(prefix, sizeof prefix, "ddp/wrap/%d", w->pg->wraps++);
    /* each tensor as name[d0,d1,...]; a model of one's own adds its unit (unit2) and parameter group
       (no_decay) where not 0 (ddp_model_mlp's follow from its layers) */
    cap = 64 + (size_t)m->nparams * (sizeof m->params[0]->name + 4 * 12 + 24);
    sig = (char*)ddp__calloc(2 * cap);
    if (!sig) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "ddp_wrap: no memory to compare the models");
    other = sig + cap;
    pos += (size_t)snprintf(sig + pos, cap - pos, "%d parameters:", m->nparams);
    for (i = 0; i < m->nparams; i++) {
        const ddp_param* p = m->params[i];
        pos += (size_t)snprintf(sig + pos, cap - pos, " %s[", p->name);
        for (k = 0; k < p->ndim; k++) pos += (size_t)snprintf(sig + pos, cap - pos, "%s%d", k ? "," : "", p->shape[k]);
        pos += (size_t)snprintf(sig + pos, cap - pos, "]");
        if (p->unit && !m->nlayers) pos += (size_t)snprintf(sig + pos, cap - pos, "unit%d", p->unit);
        if (p->no_decay) pos += (size_t)snprintf(sig + pos, cap - pos, "%sno_decay", p->unit && !m->nlayers ? "," : "");
    }
    snprintf(key, sizeof key, "%s/sig/0", prefix);
    s = me == 0 ? ddp_store_set(st, key, sig, strlen(sig)) : DDP_OK;
    if (s == DDP_OK) s = ddp_store_get(st, key, other, cap - 1, &n);
    /* the settings: each rank's own, compared with rank 0's */
    verdict[0] = 0;
    ddp__wrap_settings(&w->d, set, sizeof set);
    if (s == DDP_OK)
        s = ddp__compare_settings(w->pg, prefix, set, "wrapped the model", "ddp_wrap_desc", verdict, sizeof verdict);
    if (s == DDP_OK && strcmp(sig, other) != 0) { /* a different model says more than different settings */
        /* name the first differing parameter (past the counts, which say less) */
        const char *a = strchr(sig, ':'), *b = strchr(other, ':');
        const char* a0 = a = a ? a : sig;
        if (!b) b = other;
        while (*a && *a == *b) a++, b++;
        if ((*a == ' ' || !*a) && (*b == ' ' || !*b)) a += *a == ' ', b += *b == ' '; /* a tensor more on one side */
        else while (a > a0 && a[-1] != ' ') a--, b--;                                /* or one that differs */
        /* quote one parameter from each side: up to the next space */
        snprintf(verdict, sizeof verdict, "the ranks hold different models: rank %d has %.*s where rank 0 has %.*s "
                 "(rank %d: %d parameters, rank 0: %d). Every rank must build the same model", me, (int)strcspn(a, " "),
                 a, (int)strcspn(b, " "), *b ? b : "nothing", me, m->nparams, atoi(other));
    }
    DDP_FREE(sig);
    if (s != DDP_OK) return s;
    return ddp__agree_verdict(w->pg, prefix, verdict, sizeof verdict);
}

/* f in as few digits as read back to the same float (0.01f as 0.01, not 0.0099999998). */
DDP__PRIVATE const char* ddp__float_text(float f, char* out, size_t cap) {
    int digits;
    for (digits = 6; digits < 9; digits++) {
        snprintf(out, cap, "%.*g", digits, (double)f);
        if (strtof(out, NULL) == f) break;
    }
    if (digits == 9) snprintf(out, cap, "%.9g", (double)f);
    return out;
}

/* The optimizer's settings as "name=value" words, after its defaults are filled in. */
DDP__PRIVATE void ddp__optim_settings(const ddp_optim_desc* d, char* out, size_t cap) {
    char a[24], b[24], c[24], e[24], g[24];
    if (d->kind == DDP_SGD)
        snprintf(out, cap, "kind=sgd lr=%s momentum=%s dampening=%s nesterov=%d weight_decay=%s",
                 ddp__float_text(d->lr, a, sizeof a), ddp__float_text(d->momentum, b, sizeof b),
                 ddp__float_text(d->dampening, c, sizeof c), !!d->nesterov, ddp__float_text(d->weight_decay, e, sizeof e));
    else
        snprintf(out, cap, "kind=%s lr=%s beta1=%s beta2=%s eps=%s weight_decay=%s",
                 d->kind == DDP_ADAMW ? "adamw" : "adam", ddp__float_text(d->lr, a, sizeof a),
                 ddp__float_text(d->beta1, b, sizeof b), ddp__float_text(d->beta2, c, sizeof c),
                 ddp__float_text(d->eps, e, sizeof e), ddp__float_text(d->weight_decay, g, sizeof g));
}

/* A wrapped model's optimizer, at its creation: the same kind and settings on every rank, as
   ddp_wrap checks its own (collective; every rank fails with the same sentence). */
DDP__PRIVATE ddp_status ddp__verify_optim(ddp_optim* o) {
    ddp_pg* pg = o->m->pg;
    char prefix[48], set[320], verdict[768] = "";
    snprintf(prefix, sizeof prefix, "ddp/optim/%d", pg->optims++);
    ddp__optim_settings(&o->d, set, sizeof set);
    DDP__TRY(ddp__compare_settings(pg, prefix, set, "created the optimizer", "ddp_optim_desc", verdict, sizeof verdict));
    return ddp__agree_verdict(pg, prefix, verdict, sizeof verdict);
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>sums: element-wise sums, four floats at a time                                               */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* ---- the global norm's sums (ddp_optim_clip_grad_norm, >>optim) ------------------------------- */

/* On a GPU, how many partial sums of n numbers' squares: one per thread, each thread taking every
   P-th number; at least 32 numbers a thread, at most 4096 threads a tensor. */
DDP__PRIVATE size_t ddp__sq_parts(size_t n) {
    size_t p = (n + 31) / 32;
    return p < 1 ? 1 : p > 4096 ? 4096 : p;
}

/* The sum of the squares of the gradient numbers this rank owns (o->len[i] of parameter i, where
   ddp_optim_clip_grad_norm reads them), in double, tensor by tensor. On a GPU a kernel per tensor
   leaves its partial sums, and one copy brings every tensor's to the host, which adds them in
   order: the host waits once per clip, where a copy of each piece would be thousands of waits per
   step for a model of millions of numbers. */
DDP__PRIVATE ddp_status ddp__grad_sum_squares(ddp_optim* o, double* out) {
    ddp_model* m = o->m;
    double s = 0, part;
    size_t k;
    int i;
    if (m->device.type == DDP_DEVICE_CPU) {
        for (i = 0; i < m->nparams; i++) {
            const float* g = o->z ? ddp__zero_g(o->z, i) : m->params[i]->grad;
            for (k = 0, part = 0; k < o->len[i]; k++) part += (double)g[k] * g[k];
            s += part;
        }
        *out = s;
        return DDP_OK;
    }
#if DDP__CUDA
    {
        size_t at = 0;
        for (i = 0; i < m->nparams; i++) at += o->len[i] ? ddp__sq_parts(o->len[i]) : 0;
        if (!o->sq_host) { /* the first clip */
            if (!o->sq_dev) DDP__TRY(ddp_alloc(m->device, (at ? at : 1) * sizeof(double), (void**)&o->sq_dev));
            if (!(o->sq_host = (double*)ddp__malloc((at ? at : 1) * sizeof(double))))
                return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "no memory for the clipping norm's %zu partial sums", at);
        }
        for (i = 0, at = 0; i < m->nparams; i++) {
            const float* g = o->z ? ddp__zero_g(o->z, i) : m->params[i]->grad;
            long long n = (long long)o->len[i], P = (long long)ddp__sq_parts(o->len[i]);
            double* dst = o->sq_dev + at;
            void* args[4];
            if (!n) continue;
            args[0] = (void*)&g, args[1] = (void*)&n, args[2] = (void*)&dst, args[3] = (void*)&P;
            DDP__TRY(ddp__launch(m->device, m->stream, DDP__K_sum_squares, P, args));
            at += (size_t)P;
        }
        if (at) {
            DDP__TRY(ddp_copy(ddp__cpu(), o->sq_host, m->device, o->sq_dev, at * sizeof(double), m->stream));
            DDP__TRY(ddp_stream_sync(m->stream));
        }
        for (i = 0, at = 0; i < m->nparams; i++) {
            size_t P = o->len[i] ? ddp__sq_parts(o->len[i]) : 0;
            for (k = 0, part = 0; k < P; k++) part += o->sq_host[at + k];
            s += part, at += P;
        }
        *out = s;
        return DDP_OK;
    }
#else
    return ddp__fail(DDP_ERR_NOT_BUILT, "the gradients are on a GPU: %s", ddp__cuda_unavailable_reason());
#endif
}

/* The sum of every rank's x, the same on every rank: each rank's double goes as two floats (its
   float and what that float misses), gathered, and added in rank order. The buffers are made at
   the first clip and kept: no allocation, and no free (which waits for the whole GPU), per step. */
DDP__PRIVATE ddp_status ddp__sum_double_over_ranks(ddp_optim* o, double* x) {
    ddp_pg* pg = o->z->pg;
    ddp_model* m = o->m;
    const int W = ddp_world_size(pg);
    float mine[2], *all, *dev;
    double s = 0;
    int q;
    if (!o->norm_host) {
        if (!o->norm_dev) DDP__TRY(ddp_alloc(m->device, (size_t)(W + 1) * 2 * sizeof(float), (void**)&o->norm_dev));
        if (!(o->norm_host = (float*)ddp__malloc((size_t)W * 2 * sizeof(float))))
            return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "no memory for the norm's partial sums");
    }
    all = o->norm_host, dev = o->norm_dev;
    mine[0] = (float)*x, mine[1] = (float)(*x - (double)mine[0]);
    DDP__TRY(ddp_copy(m->device, dev, ddp__cpu(), mine, sizeof mine, m->stream));
    DDP__TRY(ddp_all_gather(pg, dev, dev + 2, 2, DDP_F32, NULL));
    DDP__TRY(ddp_copy(ddp__cpu(), all, m->device, dev + 2, (size_t)W * 2 * sizeof(float), m->stream));
    DDP__TRY(ddp_stream_sync(m->stream));
    for (q = 0; q < W; q++) s += (double)all[2 * q] + (double)all[2 * q + 1];
    *x = s;
    return DDP_OK;
}

/* ---- element-wise reduction: dst[i] = dst[i] (op) src[i], computed in f32 ---------------------- */
#if defined(__SSE2__)
#include <emmintrin.h> /* four floats at a time, and streaming stores (>>shm) */
#endif

DDP__PRIVATE void ddp__reduce(void* dst, const void* src, size_t n, ddp_dtype t, ddp_reduce_op op) {
    size_t i;
    if (t == DDP_F32 || t == DDP_DTYPE_DEFAULT) {
        float* d = (float*)dst;
        const float* s = (const float*)src;
        i = 0;
        if (op == DDP_MAX)
            for (; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];
#if defined(__SSE2__)
        /* written out in SSE: at -O2 compilers leave this loop scalar (d and s might overlap) */
        for (; i + 8 <= n; i += 8) {
            _mm_storeu_ps(d + i, _mm_add_ps(_mm_loadu_ps(d + i), _mm_loadu_ps(s + i)));
            _mm_storeu_ps(d + i + 4, _mm_add_ps(_mm_loadu_ps(d + i + 4), _mm_loadu_ps(s + i + 4)));
        }
#endif
        for (; i < n; i++) d[i] += s[i];
    } else {
        uint16_t* d = (uint16_t*)dst;
        const uint16_t* s = (const uint16_t*)src;
        int h = t == DDP_F16;
        for (i = 0; i < n; i++) {
            float a = h ? ddp_f16_to_f32(d[i]) : ddp_bf16_to_f32(d[i]);
            float b = h ? ddp_f16_to_f32(s[i]) : ddp_bf16_to_f32(s[i]);
            float r = op == DDP_MAX ? (b > a ? b : a) : a + b;
            d[i] = h ? ddp_f32_to_f16(r) : ddp_f32_to_bf16(r);
        }
    }
}

#if defined(__SSE2__)
/* Eight floats to d: with `stream` past the caches (d 16-byte aligned), else an ordinary store. */
DDP__PRIVATE void ddp__put8(float* d, __m128 x, __m128 y, int stream) {
    if (stream) {
        _mm_stream_ps(d, x);
        _mm_stream_ps(d + 4, y);
    } else {
        _mm_storeu_ps(d, x);
        _mm_storeu_ps(d + 4, y);
    }
}
#endif

/* dst[i] = src[i] * a in f32 (dst may be src): the reducer's 1/world, applied by the CPU backend in
   a pass the data takes anyway (ddp_work.premul); with `stream`, past the caches (see ddp__copy). */
DDP__PRIVATE void ddp__mul_f32(float* dst, const float* src, size_t n, float a, int stream) {
    size_t i = 0;
#if defined(__SSE2__)
    const __m128 k = _mm_set1_ps(a);
    if (n < 1024) stream = 0; /* as ddp__copy: small writes stay cached */
    for (; i < n && ((uintptr_t)(dst + i) & 15); i++) dst[i] = src[i] * a;
    for (; i + 8 <= n; i += 8) {
        ddp__put8(dst + i, _mm_mul_ps(_mm_loadu_ps(src + i), k), _mm_mul_ps(_mm_loadu_ps(src + i + 4), k), stream);
    }
    if (stream) _mm_sfence();
#else
    (void)stream;
#endif
    for (; i < n; i++) dst[i] = src[i] * a;
}

/* dst[i] /= world: the last step of an average, done once by the rank that owns the segment. */
DDP__PRIVATE void ddp__divide(void* buf, size_t n, ddp_dtype t, int world) {
    size_t i;
    if (t == DDP_F32 || t == DDP_DTYPE_DEFAULT) {
        float* d = (float*)buf;
        for (i = 0; i < n; i++) d[i] /= (float)world;
    } else {
        uint16_t* d = (uint16_t*)buf;
        int h = t == DDP_F16;
        for (i = 0; i < n; i++) {
            float a = (h ? ddp_f16_to_f32(d[i]) : ddp_bf16_to_f32(d[i])) / (float)world;
            d[i] = h ? ddp_f32_to_f16(a) : ddp_f32_to_bf16(a);
        }
    }
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>shm: the shared-memory transport                                               (chapter 10)  */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* Defined further down, in the section named, and called here: */
DDP__PRIVATE void ddp__ring_header(const ddp_work* w, unsigned char h[32]); /* >>cpu */
DDP__PRIVATE ddp_status ddp__ring_left_job(ddp_pg* pg, ddp_work* w, int who,
                                           const unsigned char theirs[32]); /* >>cpu */
DDP__PRIVATE void ddp__ring_header_text(const unsigned char h[32], char* out, size_t n); /* >>cpu */

/* ---- the shared-memory transport (>>shm) ------------------------------------------------------ */
/*
   Ranks on one machine need not push their data through the kernel's TCP stack and back: they can
   map one segment of shared memory and read each other's data where it lies. When every rank of
   the group is on this host, the CPU backend does so (DDP_TRANSPORT=tcp|shm overrides; the choice
   is logged at DDP_DEBUG=INFO). The TCP ring stays connected, idle: a neighbour that dies closes
   it, which is how a rank notices a dead peer without a network message.

   The segment: a control block per rank (its phase counter, its sleepers, its headers), one abort
   line, then two sets of W slots of `chunk` bytes each, slot (set, rank) written only by that rank.
   A collective moves through the data in chunks; each chunk has two phases, and a rank says it has
   finished one by raising its phase counter:
     phase 1  copy my part of this chunk into my slot;
     phase 2  once every rank has finished phase 1: read what I need from the others' slots and
              compute my share (all-reduce: I own share r of the chunk, so I add up share r of
              every slot, and write the sum into share r of my own slot);
     after    once every rank has finished phase 2 (all-reduce only): copy every rank's share of
              the sum out of its slot.
   This is the ring's reduce-scatter then all-gather, with every rank reducing its share at the
   same time instead of over W-1 steps: each rank writes S and reads about 2S, whatever W is. Two
   sets of slots let a rank fill chunk g+1 while the others still copy chunk g out; before filling
   a set again it waits until every rank has finished phase 1 of the chunk in between, which they
   do only after they are done with that set. The reducer's all-reduce (ddp_work.tensors) takes its
   part of each chunk from the gradients where they lie and puts the sums back there, tensor by
   tensor: the data is in many buffers, but every phase copies anyway, so nothing is added.

   With DDP_SHM_ONE_STEP_BYTES set, a small all-reduce on three ranks or more takes one step instead:
   every rank copies its whole buffer into its slot, raises its counter, waits for every other
   rank's, and adds up all W slots itself, in rank order, so every rank gets the same bits. Each
   rank reads (W-1) S where the two phases read about 2S, but it waits once instead of twice, and
   for a small buffer the waits are the cost (latency: Open MPI and NCCL switch algorithm by size
   too). It is off by default: the chapters count the bytes of the ring's algorithm (ZeRO's against
   DDP's), and once the waits yield their core (below) the two phases are about as fast. Before
   writing a set, a rank waits until every rank has made the first raise of the chunk in between: a
   rank makes it only once it is done reading that set, whichever way that chunk went.

   A rank waits for a counter by spinning (a peer on another core answers sooner than a sleeping
   thread wakes) and then sleeping on it (a futex on Linux, short sleeps elsewhere): 20 us on the
   communication thread, whose core the training thread needs during backward, and 10 ms in a
   blocking call, which has nothing else to do; when ranks outnumber the cores, no spin: the
   wait yields its core for a millisecond, then sleeps. Every wait has the collective's
   deadline and watches for a dead neighbour, a rank that left (ddp_destroy) and another rank's
   failure (the abort line). The header of each collective (ddp__ring_header) sits in the control
   block, so ranks that call different collectives fail with DDP_ERR_DESYNC as on the ring.

   The segment has a name only while the ranks open it: rank 0 removes the name once everyone has
   mapped it, so the memory goes back to the system when the last rank exits, also after a crash;
   a SIGTERM, SIGINT or SIGHUP that comes before that removes the name on its way (ddp__shm_guard).

   Memory order (C11 atomics; what a weakly ordered CPU such as arm64 relies on, which x86 and qemu
   on x86 would forgive): a rank writes its slot and header with plain stores, then raises its phase
   counter (sequentially consistent, so at least a release); a reader loads the counter with
   acquire before it reads the slot, so it sees the data. A rank reads the others' slots before it
   raises its next counter, so a writer that acquires that counter overwrites nothing still being
   read. Streaming stores are fenced (sfence) before the counter. `left` and the abort line's rank
   are stored with release after the fields they publish (the counter, `made`, the message) and
   loaded with acquire. A sleeper's increment of `waiters` and its look at the counter, and a
   waker's store of the counter and its look at `waiters`, are all sequentially consistent, so at
   least one of the two sees the other and no wake-up is lost. ThreadSanitizer cannot check this:
   it sees one process's threads, not two processes sharing a segment.
*/
#if (defined(__linux__) || defined(__APPLE__) || defined(__FreeBSD__)) && (defined(__GNUC__) || defined(__clang__))
#define DDP__SHM 1
#include <sys/mman.h>
#if DDP__LINUX
#include <sys/syscall.h>
/* FUTEX_WAIT and FUTEX_WAKE are numbers of the kernel's ABI. <linux/futex.h> comes with the
   kernel's headers, which a musl toolchain (Debian's musl-gcc) does not search: then ours. */
#if defined(__has_include)
#if __has_include(<linux/futex.h>)
#include <linux/futex.h>
#endif
#endif
#ifndef FUTEX_WAIT
#define FUTEX_WAIT 0
#define FUTEX_WAKE 1
#endif
#endif
#if DDP__LINUX && defined(SYS_futex)
#define DDP__FUTEX 1 /* sleep on a counter until its writer wakes us */
#else
#define DDP__FUTEX 0 /* short sleeps, woken by nobody */
#endif
#else
#define DDP__SHM 0 /* no POSIX shared memory or no atomics we know: the TCP ring everywhere */
#endif

#define DDP__SHM_MAGIC 0x4d48535044445044ull /* "DDPDPSHM" */
/* Test-only: tests/unit/test_desync.c defines this to hold a waiting rank inside the gap between its
   last look at a peer's counter and its look at the peer's flags, so that the peer can finish
   and leave in that gap every time instead of once in many runs. Nothing in a real build. */
#ifndef DDP__TEST_SHM_GAP
#define DDP__TEST_SHM_GAP(pg, q, target) ((void)0)
#endif
static DDP__TLS int ddp__comm_thread; /* 1 on a group's communication thread */

typedef struct ddp__shm_rank { /* one rank's control block, 256 bytes: fields others poll apart */
    uint32_t phase;            /* phases finished (wraps; compared modulo 2^32) */
    unsigned char pad0[60];
    uint32_t waiters;          /* ranks asleep on `phase` */
    unsigned char pad1[60];
    uint32_t left, pid;        /* left: how the rank left (DDP__LEFT_DESTROY, DDP__LEFT_EXIT), 0: not */
    uint64_t made;             /* collectives it made before it left */
    unsigned char pad2[48];
    unsigned char hdr[2][32];  /* its collectives' headers, by sequence number parity */
} ddp__shm_rank;

typedef struct ddp__shm_head { /* the segment's first 1024 bytes */
    uint64_t magic, nonce;
    uint32_t world, chunk;
    unsigned char pad[40];
    uint32_t who, status;      /* abort line: rank + 1 of the first rank whose collective failed */
    char msg[952];             /* its message */
} ddp__shm_head;

typedef char ddp__shm_rank_is_256[sizeof(ddp__shm_rank) == 256 ? 1 : -1];
typedef char ddp__shm_head_is_1024[sizeof(ddp__shm_head) == 1024 ? 1 : -1];

DDP__PRIVATE size_t ddp__shm_ctl_bytes(int world) {
    size_t n = sizeof(ddp__shm_head) + (size_t)world * sizeof(ddp__shm_rank);
    return (n + 4095) & ~(size_t)4095;
}
DDP__PRIVATE ddp__shm_head* ddp__shm_head_of(ddp_pg* pg) { return (ddp__shm_head*)pg->shm; }
DDP__PRIVATE ddp__shm_rank* ddp__shm_rank_of(ddp_pg* pg, int q) {
    return (ddp__shm_rank*)(pg->shm + sizeof(ddp__shm_head)) + q;
}
DDP__PRIVATE unsigned char* ddp__shm_slot(ddp_pg* pg, int set, int q) {
    return pg->shm + ddp__shm_ctl_bytes(pg->world) + ((size_t)set * (size_t)pg->world + (size_t)q) * pg->shm_chunk;
}

#if DDP__SHM
/* Inside a spin: tell the core that this thread only waits, so that it yields the pipeline to a
   sibling hardware thread and eases off the memory bus (x86 pause, Arm yield). */
#if defined(__x86_64__) || defined(__i386__)
#define DDP__SPIN_HINT() __builtin_ia32_pause()
#elif defined(__aarch64__) || (defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7)
#define DDP__SPIN_HINT() __asm__ __volatile__("yield" ::: "memory") /* (Armv6 assemblers lack it) */
#else
#define DDP__SPIN_HINT() ((void)0)
#endif
DDP__PRIVATE int ddp__shm_reached(const ddp__shm_rank* o, uint32_t target) {
    return (int32_t)(__atomic_load_n(&o->phase, __ATOMIC_ACQUIRE) - target) >= 0;
}

/* Raise this rank's phase counter, and wake the ranks asleep on it. */
DDP__PRIVATE void ddp__shm_publish(ddp_pg* pg) {
    ddp__shm_rank* me = ddp__shm_rank_of(pg, pg->rank);
    __atomic_store_n(&me->phase, ++pg->shm_phase, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&me->waiters, __ATOMIC_SEQ_CST) > 0) {
#if DDP__FUTEX
        syscall(SYS_futex, &me->phase, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
    }
}

/* Sleep until rank o's counter may have reached `target`, for at most `s` seconds (the caller
   looks again: waking early is harmless). */
DDP__PRIVATE void ddp__shm_sleep(ddp__shm_rank* o, uint32_t target, double s) {
    __atomic_add_fetch(&o->waiters, 1, __ATOMIC_SEQ_CST);
    if (!ddp__shm_reached(o, target)) {
#if DDP__FUTEX
        struct timespec ts;
        uint32_t seen = __atomic_load_n(&o->phase, __ATOMIC_SEQ_CST);
        ts.tv_sec = 0, ts.tv_nsec = (long)(s * 1e9);
        if ((int32_t)(seen - target) < 0) syscall(SYS_futex, &o->phase, FUTEX_WAIT, seen, &ts, NULL, 0);
#else
        ddp__sleep(s < 50e-6 ? s : 50e-6); /* no futex: a short sleep, woken by nobody */
#endif
    }
    __atomic_sub_fetch(&o->waiters, 1, __ATOMIC_SEQ_CST);
}

/* After a failure: tell the other ranks, so that they stop at once with this message instead of
   waiting out their deadlines. The first failure wins. */
DDP__PRIVATE void ddp__shm_abort(ddp_pg* pg, ddp_status s) {
    ddp__shm_head* h;
    uint32_t none = 0;
    int q;
    if (!pg->shm) return;
    h = ddp__shm_head_of(pg);
    if (__atomic_compare_exchange_n(&h->who, &none, (uint32_t)UINT32_MAX, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        const char* e = ddp_error_string();
        size_t len = strlen(e) < sizeof h->msg - 1 ? strlen(e) : sizeof h->msg - 1;
        memcpy(h->msg, e, len);
        h->msg[len] = 0;
        h->status = (uint32_t)s;
        __atomic_store_n(&h->who, (uint32_t)pg->rank + 1, __ATOMIC_RELEASE);
    }
#if DDP__FUTEX
    /* the others sleep on the counters of the ranks they wait for: wake them all to look */
    for (q = 0; q < pg->world; q++) syscall(SYS_futex, &ddp__shm_rank_of(pg, q)->phase, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    (void)q;
#endif
}

/* A neighbour's idle ring connection became readable: in this mode nothing is ever sent on it,
   so that is its end of stream, and the neighbour has died. Returns the dead rank, or -1. */
DDP__PRIVATE int ddp__shm_dead_neighbour(ddp_pg* pg) {
    struct pollfd pf[2];
    int i;
    pf[0].fd = pg->left_fd, pf[1].fd = pg->right_fd;
    for (i = 0; i < 2; i++) pf[i].events = POLLIN, pf[i].revents = 0;
    if (poll(pf, 2, 0) <= 0) return -1;
    for (i = 0; i < 2; i++) {
        char c;
        if (pf[i].revents & (POLLIN | POLLERR | POLLHUP)) {
            ssize_t k = recv(pf[i].fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return ddp__mod(pg->rank + (i == 0 ? -1 : 1), pg->world);
        }
    }
    return -1;
}

/* Rank q has left the job (its `left` says how, `made` after how many collectives): w is a
   collective it never called. */
DDP__PRIVATE ddp_status ddp__shm_left_job(ddp_pg* pg, ddp_work* w, int q) {
    const ddp__shm_rank* o = ddp__shm_rank_of(pg, q);
    unsigned char theirs[32];
    ddp_work leave;
    memset(&leave, 0, sizeof leave);
    leave.kind = DDP__LEAVE, leave.count = (size_t)o->made;
    leave.op = (ddp_reduce_op)__atomic_load_n(&o->left, __ATOMIC_ACQUIRE);
    ddp__ring_header(&leave, theirs);
    return ddp__ring_left_job(pg, w, q, theirs);
}

/* Wait until rank q has finished phase `target` of collective w. */
DDP__PRIVATE ddp_status ddp__shm_wait_one(ddp_pg* pg, ddp_work* w, int q, uint32_t target, double deadline) {
    ddp__shm_rank* o = ddp__shm_rank_of(pg, q);
    ddp__shm_head* h = ddp__shm_head_of(pg);
    /* On the caller's own thread (a blocking collective) this rank has nothing else to run, so
       it spins far longer before it sleeps (10 ms at the default): with a short spin, ranks that
       share few cores can fall into taking turns to sleep, each waking just after the other
       has gone to sleep, and a whole launch runs an order of magnitude slower. */
    double t = ddp__now(), spin_until = t + (ddp__comm_thread ? pg->shm_spin_s : pg->shm_spin_s * 500);
    int i;
    /* With more ranks than cores, the rank waited for may need this very core: the wait gives it
       up (sched_yield) for a millisecond before it sleeps, so a runnable peer gets the core at once
       and this rank gets it back as soon as the peer waits in turn, without a sleep and a wake-up
       on each side. */
    if (pg->shm_yield) spin_until = t + 1e-3;
    for (i = 0; !ddp__shm_reached(o, target); i++) {
        uint32_t who;
        int dead;
        if ((i & 63) != 63) {
            if (pg->shm_yield) sched_yield();
            else DDP__SPIN_HINT();
            continue;
        }
        t = ddp__now();
        if (t < spin_until) continue;
        DDP__TEST_SHM_GAP(pg, q, target);
        who = __atomic_load_n(&h->who, __ATOMIC_ACQUIRE);
        if (who && who != UINT32_MAX && (int)who - 1 != pg->rank) {
            char msg[sizeof h->msg];
            memcpy(msg, h->msg, sizeof msg);
            msg[sizeof msg - 1] = 0;
            return ddp__fail(h->status ? (ddp_status)h->status : DDP_ERR_PEER_LOST, "%s #%llu: rank %d failed: %s",
                             ddp__coll_name(w->kind), (unsigned long long)w->seq, (int)who - 1, msg);
        }
        /* A peer that left, or whose connection closed, may have finished this phase after the
           loop's look and before these: it raises its counter before it sets `left` (release,
           read here with acquire) and long before it exits, so one more look at the counter
           tells "it finished, then left" (no error) from "it left without this collective". */
        if (__atomic_load_n(&o->left, __ATOMIC_ACQUIRE)) {
            if (ddp__shm_reached(o, target)) break;
            return ddp__shm_left_job(pg, w, q);
        }
        if ((dead = ddp__shm_dead_neighbour(pg)) >= 0) {
            if (ddp__shm_reached(o, target)) break;
            /* a neighbour that left the job properly and has since exited (the rank waited for, q,
               may be slower to leave): said as its leaving, not as a death */
            if (__atomic_load_n(&ddp__shm_rank_of(pg, dead)->left, __ATOMIC_ACQUIRE))
                return ddp__shm_left_job(pg, w, dead);
            return ddp__fail(DDP_ERR_PEER_LOST, "%s #%llu: rank %d closed its connection (end of stream): that rank "
                             "has probably died; look at its output", ddp__coll_name(w->kind),
                             (unsigned long long)w->seq, dead);
        }
        if (t >= deadline)
            return ddp__fail(DDP_ERR_TIMEOUT, "%s #%llu (%zu x %s) timed out after %.0f s waiting for rank %d (shared "
                             "memory): that rank is stuck, stopped, or calling a different collective (every rank "
                             "must issue the same collectives in the same order)", ddp__coll_name(w->kind),
                             (unsigned long long)w->seq, w->count, ddp__dtype_name(w->dtype), pg->timeout, q);
        ddp__shm_sleep(o, target, deadline - t < 0.01 ? deadline - t + 1e-4 : 0.01);
    }
    return DDP_OK;
}

/* Wait until every other rank has finished phase `target`; with `check`, compare its header of
   this collective with ours (the first wait of each collective). */
DDP__PRIVATE ddp_status ddp__shm_wait_all(ddp_pg* pg, ddp_work* w, uint32_t target, int check, double deadline) {
    int q;
    for (q = 0; q < pg->world; q++) {
        const unsigned char *mine, *theirs;
        if (q == pg->rank) continue;
        if (!ddp__shm_reached(ddp__shm_rank_of(pg, q), target))
            DDP__TRY(ddp__shm_wait_one(pg, w, q, target, deadline));
        if (!check) continue;
        mine = ddp__shm_rank_of(pg, pg->rank)->hdr[w->seq & 1];
        theirs = ddp__shm_rank_of(pg, q)->hdr[w->seq & 1];
        if (memcmp(mine, theirs, 32) != 0) {
            char a[96], b[96];
            const unsigned char* other = ddp__shm_rank_of(pg, q)->hdr[(w->seq & 1) ^ 1];
            /* show the rank's latest collective: the other parity when it has moved on */
            if (ddp__le64(other + 8) > ddp__le64(theirs + 8)) theirs = other;
            ddp__ring_header_text(mine, a, sizeof a);
            ddp__ring_header_text(theirs, b, sizeof b);
            return ddp__fail(DDP_ERR_DESYNC, "desync: this rank (%d) calls %s, but rank %d calls %s. Every rank must "
                             "call the same collectives in the same order with the same sizes: look for a collective "
                             "inside an if on the rank", pg->rank, a, q, b);
        }
    }
    return DDP_OK;
}

#if defined(__cplusplus)
#define DDP__RESTRICT __restrict
#else
#define DDP__RESTRICT restrict
#endif

/* memcpy that accepts n == 0 with any pointers (memcpy wants valid ones even then) */
DDP__PRIVATE void ddp__mcpy(void* dst, const void* src, size_t n) {
    if (n) memcpy(dst, src, n);
}

/* Copy n bytes; with `stream`, past the caches (streaming stores): a destination that will not be
   read again soon then costs one write instead of a read for ownership and a write. */
DDP__PRIVATE void ddp__copy(void* dst, const void* src, size_t n, int stream) {
#if defined(__SSE2__)
    unsigned char* d = (unsigned char*)dst;
    const unsigned char* s = (const unsigned char*)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (!stream || n < 4096) {
        ddp__mcpy(dst, src, n);
        return;
    }
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i*)s), b = _mm_loadu_si128((const __m128i*)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i*)(s + 32)), e = _mm_loadu_si128((const __m128i*)(s + 48));
        _mm_stream_si128((__m128i*)d, a);
        _mm_stream_si128((__m128i*)(d + 16), b);
        _mm_stream_si128((__m128i*)(d + 32), c);
        _mm_stream_si128((__m128i*)(d + 48), e);
    }
    _mm_sfence();
    memcpy(d, s, n);
#else
    (void)stream;
    memcpy(dst, src, n);
#endif
}

/* a[i] * pre + b[i] (pre 1: a[i] + b[i]), divided by `div` when it is not 1, written to both out and
   dst: a rank's share of an f32 sum, into its slot for the others and into its result, in one pass
   (dst may be a: in place; pre is the reducer's 1/world, ddp_work.premul); with `stream` the write
   to dst goes past the caches (see ddp__copy), with `stream_out` the write to out. The SSE loop's
   products and sums are the ones a separate multiply would make, the same bits; in the scalar
   loops a compiler allowed to contract (GCC's default outside ISO mode) may fuse them into one FMA
   where the target has it, and round those elements once instead of twice. */
DDP__PRIVATE void ddp__add2_f32(float* DDP__RESTRICT out, float* dst, const float* a, const float* DDP__RESTRICT b,
                                size_t n, float pre, float div, int stream, int stream_out) {
    size_t i = 0;
#if defined(__SSE2__)
    /* written out in SSE: at -O2 compilers leave this loop scalar, four times slower */
    const __m128 d = _mm_set1_ps(div), k = _mm_set1_ps(pre);
    for (; i < n && ((uintptr_t)(dst + i) & 15); i++) {
        float x = pre != 1.0f ? a[i] * pre : a[i];
        out[i] = dst[i] = (x + b[i]) / div;
    }
    if (((uintptr_t)(out + i) & 15) || n < 1024) stream_out = 0; /* as ddp__copy: small writes stay cached */
    if (n < 1024) stream = 0;
    for (; i + 8 <= n; i += 8) {
        __m128 x = _mm_loadu_ps(a + i), y = _mm_loadu_ps(a + i + 4);
        if (pre != 1.0f) x = _mm_mul_ps(x, k), y = _mm_mul_ps(y, k);
        x = _mm_add_ps(x, _mm_loadu_ps(b + i)), y = _mm_add_ps(y, _mm_loadu_ps(b + i + 4));
        if (div != 1.0f) x = _mm_div_ps(x, d), y = _mm_div_ps(y, d);
        ddp__put8(out + i, x, y, stream_out);
        ddp__put8(dst + i, x, y, stream);
    }
    if (stream || stream_out) _mm_sfence();
#else
    (void)stream, (void)stream_out;
#endif
    for (; i < n; i++) {
        float x = pre != 1.0f ? a[i] * pre : a[i];
        out[i] = dst[i] = (x + b[i]) / div;
    }
}

/* Where elements [a, b) of an all-reduce live when its data is in tensors (ddp_work.tensors): the
   first tensor that holds element a, and how many of [a, b) it holds. */
DDP__PRIVATE size_t ddp__tensor_piece(const ddp_work* w, size_t a, size_t b, float** at) {
    int lo = 0, hi = w->ntensors - 1;
    size_t end;
    while (lo < hi) { /* the last tensor that starts at or before a (an empty one never holds it) */
        int mid = (lo + hi + 1) / 2;
        if (w->tensor_at[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    *at = w->tensors[lo] + (a - w->tensor_at[lo]);
    end = w->tensor_at[lo + 1] < b ? w->tensor_at[lo + 1] : b;
    return end - a;
}

/* n floats between the tensors, from element a on, and a buffer: to_tensors 0 reads them into buf
   (times premul unless it is 0), 1 writes buf to them (`stream` as for ddp__copy). */
DDP__PRIVATE void ddp__tensors_copy(const ddp_work* w, size_t a, float* buf, size_t n, int to_tensors, int stream) {
    while (n) {
        float* t;
        size_t k = ddp__tensor_piece(w, a, a + n, &t);
        if (to_tensors) ddp__copy(t, buf, k * sizeof(float), stream);
        else if (w->premul) ddp__mul_f32(buf, t, k, w->premul, stream);
        else ddp__copy(buf, t, k * sizeof(float), stream);
        a += k, buf += k, n -= k;
    }
}

/* For a path that works on one buffer: the tensors into buf, with premul applied (it is then
   done); their results go back in ddp__cpu_copy_out. */
DDP__PRIVATE void ddp__tensors_stage(ddp_work* w, unsigned char* buf) {
    if (!w->ntensors || w->staged) return;
    ddp__tensors_copy(w, 0, (float*)buf, w->count, 0, 0);
    w->premul = 0, w->staged = 1;
}

/* A small all-reduce in one step (see the top of this section): the whole buffer into this rank's
   slot, one wait, then every slot added up in rank order into `host`. */
DDP__PRIVATE ddp_status ddp__shm_all_reduce_one_step(ddp_pg* pg, ddp_work* w, unsigned char* host) {
    const int W = pg->world, set = (int)(pg->shm_chunks & 1);
    const size_t es = ddp_dtype_size(w->dtype), n = w->count, bytes = n * es;
    const double deadline = ddp__now() + pg->timeout;
    int q;
    if (ddp__log_level_enabled() >= DDP_LOG_DETAIL)
        ddp__log(DDP_LOG_DETAIL, "all_reduce #%llu through shared memory in one step: %zu bytes from each of %d slots",
                 (unsigned long long)w->seq, bytes, W);
    ddp__ring_header(w, ddp__shm_rank_of(pg, pg->rank)->hdr[w->seq & 1]);
    if (pg->shm_chunks > 0) DDP__TRY(ddp__shm_wait_all(pg, w, pg->shm_reuse, 0, deadline));
    if (w->premul) ddp__mul_f32((float*)ddp__shm_slot(pg, set, pg->rank), (const float*)host, n, w->premul, 0);
    else memcpy(ddp__shm_slot(pg, set, pg->rank), host, bytes);
    ddp__shm_publish(pg);
    pg->shm_reuse = pg->shm_phase;
    DDP__TRY(ddp__shm_wait_all(pg, w, pg->shm_phase, 1, deadline));
    memcpy(host, ddp__shm_slot(pg, set, 0), bytes);
    for (q = 1; q < W; q++) ddp__reduce(host, ddp__shm_slot(pg, set, q), n, w->dtype, w->op);
    if (w->op == DDP_AVG) ddp__divide(host, n, w->dtype, W);
    pg->shm_chunks++;
    DDP__COUNT(pg->bytes_sent, (uint64_t)bytes * (uint64_t)(W - 1)); /* read by the W - 1 others */
    DDP__COUNT(pg->bytes_received, (uint64_t)bytes * (uint64_t)(W - 1));
    return DDP_OK;
}

/* One collective through the segment, on `host` laid out as for the ring (ddp__cpu_run_once).
   The chunked axis: the buffer (all-reduce, broadcast), or each rank's part (all-gather,
   reduce-scatter; a reduce-scatter slot holds the chunk of every destination's part). */
DDP__PRIVATE ddp_status ddp__shm_run_once(ddp_pg* pg, ddp_work* w, unsigned char* host) {
    const int W = pg->world, r = pg->rank, kind = w->kind;
    const size_t es = ddp_dtype_size(w->dtype), n = w->count;
    /* all-reduce: a whole chunk splits into W equal shares of whole cache lines */
    const size_t line = kind == DDP__ALL_REDUCE ? (size_t)W * (64 / es) : 1;
    const size_t per = kind == DDP__REDUCE_SCATTER ? pg->shm_chunk / ((size_t)W * es)
                                                    : (pg->shm_chunk / es / line ? pg->shm_chunk / es / line * line : pg->shm_chunk / es);
    const double deadline = ddp__now() + pg->timeout;
    size_t off = 0, sent = 0, got = 0;
    int q, first = 1;
    /* a result larger than the caches goes past them (ddp__copy) */
    const int stream = n * es >= pg->shm_stream_bytes;
    /* A slot is written by one core and read by another. A line another core's stores left in
       its cache can reach the reader more slowly than one written past the caches, so small and
       middle-sized slots are written with streaming stores; past the caches' size streaming loses
       again. Hence a threshold (DDP_SHM_SLOT_STREAM_BELOW) instead of always; only the all-reduce
       was measured (make bench), so only it streams. */
    const int slot_stream = n * es < pg->shm_slot_stream;
    unsigned char empty[64];
    /* (two ranks: the two phases measured faster, each rank adding up only half) */
    if (kind == DDP__ALL_REDUCE && W > 2 && n > 0 && n * es <= pg->shm_one_step && n * es <= pg->shm_chunk) {
        ddp__tensors_stage(w, host);
        return ddp__shm_all_reduce_one_step(pg, w, host);
    }
    if (!host) host = empty; /* an empty collective on a rank with no buffer: still checked, nothing copied */
    if (ddp__log_level_enabled() >= DDP_LOG_DETAIL)
        ddp__log(DDP_LOG_DETAIL, "%s #%llu through shared memory: %zu chunk(s) of up to %zu elements",
                ddp__coll_name(kind), (unsigned long long)w->seq, n ? (n + per - 1) / per : 1, per);
    ddp__ring_header(w, ddp__shm_rank_of(pg, r)->hdr[w->seq & 1]);
    do {
        const size_t c = n - off < per ? n - off : per;
        const int set = (int)(pg->shm_chunks & 1);
        unsigned char* mine = ddp__shm_slot(pg, set, r);
        const size_t s0 = ddp__seg_start(c, W, r), s1 = ddp__seg_start(c, W, r + 1);
        /* this set was last used two chunks ago: everyone must be done with it */
        if (pg->shm_chunks > 0) DDP__TRY(ddp__shm_wait_all(pg, w, pg->shm_reuse, 0, deadline));
        /* phase 1: my part of the chunk into my slot (all-reduce: not my own share, which only I read);
           an all-reduce with tensors (ddp_work.tensors) reads and writes them where they are, not host */
        if (kind == DDP__ALL_REDUCE && w->ntensors) {
            ddp__tensors_copy(w, off, (float*)mine, s0, 0, slot_stream);
            ddp__tensors_copy(w, off + s1, (float*)(mine + s1 * es), c - s1, 0, slot_stream);
        } else if (kind == DDP__ALL_REDUCE && w->premul) { /* the reducer's 1/world as the data goes in */
            ddp__mul_f32((float*)mine, (const float*)(host + off * es), s0, w->premul, slot_stream);
            ddp__mul_f32((float*)(mine + s1 * es), (const float*)(host + (off + s1) * es), c - s1, w->premul,
                         slot_stream);
        } else if (kind == DDP__ALL_REDUCE) {
            ddp__copy(mine, host + off * es, s0 * es, slot_stream);
            ddp__copy(mine + s1 * es, host + (off + s1) * es, (c - s1) * es, slot_stream);
        } else if (kind == DDP__BROADCAST && r == w->root)
            ddp__mcpy(mine, host + off * es, c * es);
        else if (kind == DDP__ALL_GATHER)
            ddp__mcpy(mine, host + ((size_t)r * n + off) * es, c * es);
        else if (kind == DDP__REDUCE_SCATTER)
            for (q = 0; q < W; q++) ddp__mcpy(mine + (size_t)q * c * es, host + ((size_t)q * n + off) * es, c * es);
        ddp__shm_publish(pg);
        pg->shm_reuse = pg->shm_phase; /* for the chunk after this one */
        DDP__TRY(ddp__shm_wait_all(pg, w, pg->shm_phase, first, deadline));
        first = 0;
        /* phase 2: read the others' slots */
        if (kind == DDP__ALL_REDUCE) {
            /* my share of the result, into my slot (the others copy it from there) and my buffer */
            unsigned char *res = mine + s0 * es, *own = host + (off + s0) * es;
            if (W == 2 && es == 4 && w->op != DDP_MAX) { /* f32 sum or average */
                const float* other = (const float*)(ddp__shm_slot(pg, set, 1 - r) + s0 * es);
                const float pre = w->premul ? w->premul : 1.0f, div = w->op == DDP_AVG ? 2.0f : 1.0f;
                size_t a = off + s0, k;
                if (!w->ntensors) ddp__add2_f32((float*)res, (float*)own, (const float*)own, other, s1 - s0, pre, div,
                                                stream, slot_stream);
                for (; w->ntensors && a < off + s1; a += k) { /* tensor by tensor, in place */
                    float* t;
                    const size_t i = a - off - s0;
                    k = ddp__tensor_piece(w, a, off + s1, &t);
                    ddp__add2_f32((float*)res + i, t, t, other + i, k, pre, div, stream, slot_stream);
                }
            } else {
                if (w->ntensors) ddp__tensors_copy(w, off + s0, (float*)res, s1 - s0, 0, 0); /* my share */
                else if (w->premul) ddp__mul_f32((float*)res, (const float*)own, s1 - s0, w->premul, 0);
                else ddp__mcpy(res, own, (s1 - s0) * es);
                for (q = 0; q < W; q++)
                    if (q != r) ddp__reduce(res, ddp__shm_slot(pg, set, q) + s0 * es, s1 - s0, w->dtype, w->op);
                if (w->op == DDP_AVG) ddp__divide(res, s1 - s0, w->dtype, W);
                if (w->ntensors) ddp__tensors_copy(w, off + s0, (float*)res, s1 - s0, 1, stream);
                else ddp__mcpy(own, res, (s1 - s0) * es);
            }
            got += (size_t)(W - 1) * (s1 - s0) * es, sent += (c - (s1 - s0)) * es;
        } else if (kind == DDP__BROADCAST) {
            if (r != w->root) ddp__mcpy(host + off * es, ddp__shm_slot(pg, set, w->root), c * es), got += c * es;
            else sent += (size_t)(W - 1) * c * es;
        } else if (kind == DDP__ALL_GATHER) {
            for (q = 0; q < W; q++)
                if (q != r) ddp__mcpy(host + ((size_t)q * n + off) * es, ddp__shm_slot(pg, set, q), c * es);
            got += (size_t)(W - 1) * c * es, sent += (size_t)(W - 1) * c * es;
        } else {
            unsigned char* dst = host + ((size_t)r * n + off) * es;
            for (q = 0; q < W; q++)
                if (q != r) ddp__reduce(dst, ddp__shm_slot(pg, set, q) + (size_t)r * c * es, c, w->dtype, w->op);
            if (w->op == DDP_AVG) ddp__divide(dst, c, w->dtype, W);
            got += (size_t)(W - 1) * c * es, sent += (size_t)(W - 1) * c * es;
        }
        ddp__shm_publish(pg);
        /* all-reduce: every share of the sum, from the slot of the rank that made it */
        if (kind == DDP__ALL_REDUCE) {
            DDP__TRY(ddp__shm_wait_all(pg, w, pg->shm_phase, 0, deadline));
            for (q = 0; q < W; q++) {
                size_t a = ddp__seg_start(c, W, q), b = ddp__seg_start(c, W, q + 1);
                unsigned char* from = ddp__shm_slot(pg, set, q) + a * es;
                if (q != r && w->ntensors) ddp__tensors_copy(w, off + a, (float*)from, b - a, 1, stream);
                else if (q != r) ddp__copy(host + (off + a) * es, from, (b - a) * es, stream);
            }
            got += (c - (s1 - s0)) * es, sent += (size_t)(W - 1) * (s1 - s0) * es;
        }
        pg->shm_chunks++;
        off += c;
    } while (off < n);
    DDP__COUNT(pg->bytes_sent, (uint64_t)sent);
    DDP__COUNT(pg->bytes_received, (uint64_t)got);
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__shm_run(ddp_pg* pg, ddp_work* w, unsigned char* host) {
    ddp_status s = ddp__shm_run_once(pg, w, host);
    if (s != DDP_OK) ddp__shm_abort(pg, s);
    return s;
}

/* ddp_destroy on an idle rank: a rank that waits for this one learns that it has left. */
DDP__PRIVATE void ddp__shm_leave(ddp_pg* pg, int how) {
    ddp__shm_rank* me = ddp__shm_rank_of(pg, pg->rank);
    me->made = pg->seq;
    __atomic_store_n(&me->left, (uint32_t)how, __ATOMIC_RELEASE);
#if DDP__FUTEX
    syscall(SYS_futex, &me->phase, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
}

/* Where the segment's name lives while the ranks open it. Linux: a file under /dev/shm, which is
   what shm_open makes too, without needing -lrt on older C libraries; elsewhere shm_open. */
DDP__PRIVATE void ddp__shm_path(char* out, size_t n, const char* name) {
#if DDP__LINUX
    snprintf(out, n, "/dev/shm%s", name);
#else
    snprintf(out, n, "%s", name);
#endif
}
DDP__PRIVATE int ddp__shm_open(const char* name, int create) {
#if DDP__LINUX
    char path[96];
    ddp__shm_path(path, sizeof path, name);
    return open(path, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
#else
    return shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
#endif
}
/* While rank 0's segment has a name (until every rank has mapped it, which may take the whole
   timeout when a rank is slow or failing), a SIGTERM, SIGINT or SIGHUP, as ddprun sends when it
   stops a job, would end the process and leave the segment in /dev/shm (megabytes) until the
   machine restarts. For that window these handlers remove the name first, then do what the signal
   would have done: the previous handler, or the default action. One segment per process at a time
   (a second group set up at the same moment in another thread goes unguarded). */
static const int ddp__shm_sigs[3] = {SIGTERM, SIGINT, SIGHUP};
static struct sigaction ddp__shm_old_sa[3];
static char ddp__shm_guarded[96];                 /* what unlink (Linux) or shm_unlink takes */
static volatile sig_atomic_t ddp__shm_guarding;
static pthread_mutex_t ddp__shm_guard_lock = PTHREAD_MUTEX_INITIALIZER;

DDP__PRIVATE void ddp__shm_on_signal(int sig, siginfo_t* info, void* ctx) {
    int i, saved = errno;
    if (ddp__shm_guarding) {
#if DDP__LINUX
        unlink(ddp__shm_guarded); /* both async-signal-safe system calls */
#else
        shm_unlink(ddp__shm_guarded);
#endif
    }
    for (i = 0; i < 3 && ddp__shm_sigs[i] != sig; i++) {}
    if (i < 3) {
        struct sigaction old = ddp__shm_old_sa[i];
        sigaction(sig, &old, NULL);
        if (old.sa_flags & SA_SIGINFO) old.sa_sigaction(sig, info, ctx);
        else if (old.sa_handler == SIG_DFL) raise(sig); /* blocked here: acted on when this returns */
        else if (old.sa_handler != SIG_IGN) old.sa_handler(sig);
    }
    errno = saved;
}

DDP__PRIVATE void ddp__shm_guard(const char* name) {
    struct sigaction sa;
    int i;
    pthread_mutex_lock(&ddp__shm_guard_lock);
    if (!ddp__shm_guarding) {
        ddp__shm_path(ddp__shm_guarded, sizeof ddp__shm_guarded, name);
        ddp__shm_guarding = 1;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = ddp__shm_on_signal;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        for (i = 0; i < 3; i++) sigaction(ddp__shm_sigs[i], &sa, &ddp__shm_old_sa[i]);
    }
    pthread_mutex_unlock(&ddp__shm_guard_lock);
}

DDP__PRIVATE void ddp__shm_unlink(const char* name) {
    char path[96];
    int i;
    ddp__shm_path(path, sizeof path, name);
#if DDP__LINUX
    unlink(path);
#else
    shm_unlink(name);
#endif
    pthread_mutex_lock(&ddp__shm_guard_lock);
    if (ddp__shm_guarding && !strcmp(path, ddp__shm_guarded)) { /* the name is gone: the usual handlers again */
        ddp__shm_guarding = 0;
        for (i = 0; i < 3; i++) sigaction(ddp__shm_sigs[i], &ddp__shm_old_sa[i], NULL);
    }
    pthread_mutex_unlock(&ddp__shm_guard_lock);
}

/* What makes two ranks "on one host" for shared memory: the host name, and on Linux the boot and
   the network namespace, so that two namespaces standing in for two machines talk TCP. */
DDP__PRIVATE void ddp__host_id(char* out, size_t n) {
    char host[128] = "?", boot[64] = "", net[64] = "";
    gethostname(host, sizeof host - 1);
#if DDP__LINUX
    {
        FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
        ssize_t k;
        if (f) {
            if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
            boot[strcspn(boot, "\n")] = 0;
            fclose(f);
        }
        k = readlink("/proc/self/ns/net", net, sizeof net - 1);
        net[k > 0 ? k : 0] = 0;
    }
#endif
    snprintf(out, n, "%s|%s|%s", host, boot, net);
}

/* Segments whose rank 0 died before every rank had mapped them (SIGKILL, as the OOM killer
   sends, where no handler runs) keep their name, and their megabytes, until the machine restarts.
   Each job that makes a segment removes those: named by ddp__shm_create, created by a pid that no
   longer runs, and untouched for a minute (a live job in another pid namespace that shares this
   /dev/shm names its segment and maps it within its setup, and its pid would look dead here). */
DDP__PRIVATE void ddp__shm_remove_stale(void) {
#if DDP__LINUX
    DIR* d = opendir("/dev/shm");
    struct dirent* e;
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        char path[300], *end;
        struct stat st;
        long pid;
        if (strncmp(e->d_name, "ddp-", 4) != 0) continue;
        pid = strtol(e->d_name + 4, &end, 10);
        if (pid <= 0 || *end != '-' || strlen(end + 1) != 16 || strspn(end + 1, "0123456789abcdef") != 16) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its creator still runs (or is not ours) */
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
            (double)time(NULL) - (double)st.st_mtime < 60)
            continue;
        if (unlink(path) == 0)
            ddp__log(DDP_LOG_INFO, "removed %s, shared memory a job left when its rank 0 was killed", path);
    }
    closedir(d);
#endif
}

/* Rank 0 makes the segment: a fresh name, the memory reserved now (a full /dev/shm fails here,
   not later with SIGBUS), the head filled in. Returns the mapping, or NULL with `why` set. */
DDP__PRIVATE unsigned char* ddp__shm_create(ddp_pg* pg, size_t bytes, char* name, size_t namelen, uint64_t* nonce,
                                            char* why, size_t whylen) {
    int fd = -1, tries;
    void* p;
    ddp__shm_head* h;
    ddp__shm_remove_stale();
    for (tries = 0; tries < 8 && fd < 0; tries++) {
        uint64_t seed[3];
        seed[0] = (uint64_t)getpid(), seed[1] = (uint64_t)(ddp__now() * 1e9), seed[2] = (uint64_t)tries;
        *nonce = ddp__fnv1a((const unsigned char*)seed, sizeof seed) ^
                 ddp__fnv1a((const unsigned char*)pg->store->token, strlen(pg->store->token));
        snprintf(name, namelen, "/ddp-%d-%016llx", (int)getpid(), (unsigned long long)*nonce);
        fd = ddp__shm_open(name, 1);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd >= 0) ddp__shm_guard(name);
    if (fd < 0) {
        snprintf(why, whylen, "creating shared memory %s failed: %s", name, strerror(errno));
        return NULL;
    }
#if DDP__LINUX
    {
        int e = posix_fallocate(fd, 0, (off_t)bytes);
        if (e != 0) {
            snprintf(why, whylen, "reserving %zu bytes of shared memory failed: %s (is /dev/shm full or small? "
                     "df -h /dev/shm)", bytes, strerror(e));
            close(fd);
            ddp__shm_unlink(name);
            return NULL;
        }
    }
#else
    if (ftruncate(fd, (off_t)bytes) != 0) {
        snprintf(why, whylen, "sizing shared memory failed: %s", strerror(errno));
        close(fd);
        ddp__shm_unlink(name);
        return NULL;
    }
#endif
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "mapping shared memory failed: %s", strerror(errno));
        ddp__shm_unlink(name);
        return NULL;
    }
    h = (ddp__shm_head*)p;
    h->nonce = *nonce, h->world = (uint32_t)pg->world, h->chunk = (uint32_t)pg->shm_chunk;
    __atomic_store_n(&h->magic, DDP__SHM_MAGIC, __ATOMIC_RELEASE);
    return (unsigned char*)p;
}

/* Another rank maps the segment rank 0 announced, and checks it is that one. */
DDP__PRIVATE unsigned char* ddp__shm_attach(ddp_pg* pg, const char* name, size_t bytes, uint64_t nonce, char* why,
                                            size_t whylen) {
    int fd = ddp__shm_open(name, 0);
    struct stat st;
    void* p;
    const ddp__shm_head* h;
    if (fd < 0) {
        snprintf(why, whylen, "opening rank 0's shared memory %s failed: %s", name, strerror(errno));
        return NULL;
    }
    /* At least `bytes`, not exactly: macOS rounds a shared-memory object up to its page size
       (16 KiB on Apple silicon), so an exact check would refuse every segment there. */
    if (fstat(fd, &st) != 0 || st.st_size < 0 || (size_t)st.st_size < bytes) {
        snprintf(why, whylen, "rank 0's shared memory %s has %lld bytes, fewer than the %zu this job needs", name,
                 (long long)st.st_size, bytes);
        close(fd);
        return NULL;
    }
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "mapping rank 0's shared memory failed: %s", strerror(errno));
        return NULL;
    }
    h = (const ddp__shm_head*)p;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != DDP__SHM_MAGIC || h->nonce != nonce ||
        h->world != (uint32_t)pg->world || h->chunk != (uint32_t)pg->shm_chunk) {
        snprintf(why, whylen, "%s is not this job's shared memory", name);
        munmap(p, bytes);
        return NULL;
    }
    return (unsigned char*)p;
}
#endif /* DDP__SHM */

/* Choose the transport after the ring is connected (collective: every rank calls it). Shared
   memory when DDP_TRANSPORT allows it and every rank could map rank 0's segment; else TCP. */
DDP__PRIVATE ddp_status ddp__shm_setup(ddp_pg* pg) {
    const char* env = getenv("DDP_TRANSPORT");
    int want_shm = 0; /* 0: either, 1: shm or fail */
    char why[400] = "";
    if (env && *env && strcmp(env, "auto") != 0) {
        if (!strcmp(env, "tcp")) {
            ddp__log(DDP_LOG_INFO, "transport: tcp ring (DDP_TRANSPORT=tcp)");
            return DDP_OK;
        }
        if (strcmp(env, "shm") != 0) return ddp__fail(DDP_ERR_ENV, "DDP_TRANSPORT=%s is not tcp, shm or auto", env);
        want_shm = 1;
    }
#if DDP__SHM
    {
        const int W = pg->world;
        char key_val[400], name[64] = "", me[300], theirs[300] = "";
        uint64_t nonce = 0;
        size_t chunk, bytes, n = 0;
        int64_t yes = 0;
        int ok = 0;
        unsigned char* p = NULL;
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        chunk = (size_t)ddp__env_tuning("DDP_SHM_CHUNK_BYTES", 1 << 20, 1, 1, "bytes");
        if (chunk > ((size_t)32 << 20) / (size_t)W) chunk = ((size_t)32 << 20) / (size_t)W; /* 64 MiB at most */
        chunk = (chunk + 4095) & ~(size_t)4095;
        if (chunk < (size_t)W * 4) chunk = ((size_t)W * 4 + 4095) & ~(size_t)4095;
        pg->shm_chunk = chunk;
        bytes = ddp__shm_ctl_bytes(W) + 2 * (size_t)W * chunk;
        ddp__host_id(me, sizeof me);
        if (pg->rank == 0) {
            p = ddp__shm_create(pg, bytes, name, sizeof name, &nonce, why, sizeof why);
            if (p) snprintf(key_val, sizeof key_val, "%s %016llx %s", name, (unsigned long long)nonce, me);
            else snprintf(key_val, sizeof key_val, "- 0 -");
            DDP__TRY(ddp_store_set(pg->store, "ddp/shm", key_val, strlen(key_val)));
        } else {
            unsigned long long nn = 0;
            memset(key_val, 0, sizeof key_val);
            DDP__TRY(ddp_store_get(pg->store, "ddp/shm", key_val, sizeof key_val - 1, &n));
            if (sscanf(key_val, "%63s %llx %299s", name, &nn, theirs) != 3 || name[0] != '/')
                snprintf(why, sizeof why, "rank 0 could not make a shared memory segment (see its log)");
            else if (strcmp(theirs, me) != 0)
                snprintf(why, sizeof why, "rank 0 is on another host");
            else
                p = ddp__shm_attach(pg, name, bytes, (uint64_t)nn, why, sizeof why);
        }
        ok = p != NULL;
        if (ok) {
            /* touch every page now: fresh memory is slow to fault in, and not inside a collective */
            size_t i;
            volatile unsigned char sink = 0;
            ddp__shm_rank* mine = (ddp__shm_rank*)(p + sizeof(ddp__shm_head)) + pg->rank;
            for (i = 0; i < bytes; i += 4096) sink ^= p[i];
            (void)sink;
            pg->shm = p, pg->shm_bytes = bytes;
            memset(ddp__shm_slot(pg, 0, pg->rank), 0, chunk);
            memset(ddp__shm_slot(pg, 1, pg->rank), 0, chunk);
            mine->pid = (uint32_t)getpid();
        }
        if (!ok) { /* every rank's message then names the cause, not only this rank's */
            char told[300];
            snprintf(told, sizeof told, "rank %d: %.280s", pg->rank, why);
            DDP__TRY(ddp_store_set(pg->store, "ddp/shm/why", told, strlen(told)));
        }
        if (ddp__store_add(pg->store, "ddp/shm/yes", ok, &yes) != DDP_OK ||
            ddp__store_barrier(pg->store, "shm", W) != DDP_OK || ddp__store_add(pg->store, "ddp/shm/yes", 0, &yes) != DDP_OK) {
            if (pg->rank == 0 && name[0] == '/') ddp__shm_unlink(name);
            return ddp__last_status();
        }
        if (pg->rank == 0 && p) ddp__shm_unlink(name); /* everyone has mapped it or given up */
        if (yes == W) {
            /* spin only when every local rank has a core: with more ranks than cores, a spinning
               rank takes the core the one it waits for needs */
            pg->shm_spin_s = ddp__env_tuning("DDP_SHM_SPIN_US", cores >= W ? 20 : 0, 0, 0, "microseconds") * 1e-6;
            pg->shm_yield = cores < W;
            pg->shm_stream_bytes = (size_t)ddp__env_tuning("DDP_SHM_STREAM_BYTES", 32 << 20, 1, 1, "bytes");
            pg->shm_slot_stream = (size_t)ddp__env_tuning("DDP_SHM_SLOT_STREAM_BELOW", 512 << 10, 0, 1, "bytes");
            pg->shm_one_step = (size_t)ddp__env_tuning("DDP_SHM_ONE_STEP_BYTES", 0, 0, 1, "bytes");
            ddp__log(DDP_LOG_INFO, "transport: shared memory (%d ranks on this host, %zu KiB chunks, %.1f MiB segment)",
                    W, chunk >> 10, (double)bytes / (1 << 20));
            return DDP_OK;
        }
        if (p) munmap(p, bytes);
        pg->shm = NULL, pg->shm_bytes = 0;
        if (!why[0]) {
            const char* key = "ddp/shm/why";
            char told[300];
            memset(told, 0, sizeof told);
            if (ddp__store_wait(pg->store, &key, 1, 5.0) != DDP_OK ||
                ddp_store_get(pg->store, key, told, sizeof told - 1, &n) != DDP_OK)
                snprintf(told, sizeof told, "see their logs");
            snprintf(why, sizeof why, "%lld of %d ranks could not map the segment (%s)", (long long)(W - yes), W, told);
        }
    }
#else
    snprintf(why, sizeof why, "this build has no shared memory transport (needs POSIX shared memory and GCC/Clang atomics)");
#endif
    if (want_shm)
        return ddp__fail(DDP_ERR_ENV, "DDP_TRANSPORT=shm, but rank %d cannot use shared memory: %s. Unset "
                         "DDP_TRANSPORT to fall back to TCP", pg->rank, why);
    ddp__log(DDP_LOG_INFO, "transport: tcp ring (%s)", why);
    return DDP_OK;
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>cpu: the CPU backend: its communication thread, queue and connections                        */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* Make sure the host scratch holds nbytes; grown, never shrunk (fresh memory is slow to touch). */
DDP__PRIVATE ddp_status ddp__staging(ddp_pg* pg, size_t nbytes) {
    if (nbytes <= pg->staging_bytes) return DDP_OK;
    ddp_free_pinned(pg->staging);
    pg->staging = NULL;
    pg->staging_bytes = 0;
    DDP__TRY(ddp_alloc_pinned(nbytes, (void**)&pg->staging));
    pg->staging_bytes = nbytes;
    return DDP_OK;
}

/* Run one collective on the CPU backend's thread. GPU buffers are staged through pinned host
   memory: copied down, reduced on the host, copied back. */
DDP__PRIVATE ddp_status ddp__cpu_run_once(ddp_pg* pg, ddp_work* w);
/* One collective, traced on the communication row under DDP_TRACE. */
DDP__PRIVATE ddp_status ddp__cpu_run(ddp_pg* pg, ddp_work* w) {
    double t0 = ddp__now();
    ddp_status s;
    ddp__flight_note(pg, w, DDP__FL_RUNNING);
    s = ddp__cpu_run_once(pg, w);
    ddp__flight_note(pg, w, s == DDP_OK ? DDP__FL_DONE : DDP__FL_FAILED);
    if (s == DDP_ERR_TIMEOUT || s == DDP_ERR_PEER_LOST)
        ddp__flight_dump(pg, DDP_LOG_ERROR, s == DDP_ERR_TIMEOUT ? "a collective timed out" : "a peer was lost");
    if (ddp__trace_on()) {
        char name[48];
        snprintf(name, sizeof name, "%s %zu B #%llu", ddp__coll_name(w->kind), w->count * ddp_dtype_size(w->dtype),
                 (unsigned long long)w->seq);
        ddp__trace(name, DDP__TRACE_COMM, t0, ddp__now());
    }
    return s;
}

/* Before the data of each collective, every rank sends its right neighbour a 32-byte header
   (sequence number, kind, count, dtype, op or root) and checks the one from its left against its
   own. Ranks that call different collectives, or one with a
   different size, would otherwise pair up silently: a 1-float all_reduce on one rank would take
   part of another rank's gradient bucket, and training would go on with wrong numbers. The
   header travels ahead of the data on the same stream, so it costs two small system calls, not
   a round trip. */
DDP__PRIVATE void ddp__ring_header(const ddp_work* w, unsigned char h[32]) {
    ddp__put_le64(h, DDP__RING_MAGIC | (uint64_t)w->kind << 32);
    ddp__put_le64(h + 8, w->seq);
    ddp__put_le64(h + 16, (uint64_t)w->count);
    ddp__put_le64(h + 24, (uint64_t)w->dtype |
                              (uint64_t)(w->kind == DDP__BROADCAST ? (unsigned)w->root : (unsigned)w->op) << 32);
}
/* A header as the words ddp__fingerprint uses: "all_reduce #42 (1091 x f32, sum)". */
DDP__PRIVATE void ddp__ring_header_text(const unsigned char h[32], char* out, size_t n) {
    ddp_work w;
    uint64_t last = ddp__le64(h + 24);
    memset(&w, 0, sizeof w);
    w.kind = (int)(ddp__le64(h) >> 32);
    w.seq = ddp__le64(h + 8);
    w.count = (size_t)ddp__le64(h + 16);
    w.dtype = (ddp_dtype)(uint32_t)last;
    w.root = (int)(last >> 32);
    w.op = (ddp_reduce_op)(last >> 32);
    ddp__fingerprint(&w, out, n);
}
/* Rank `who` has left the job (its header says how, and after how many collectives): this
   collective is one it never called. */
DDP__PRIVATE ddp_status ddp__ring_left_job(ddp_pg* pg, ddp_work* w, int who, const unsigned char theirs[32]) {
    char a[96];
    const int how = (int)(ddp__le64(theirs + 24) >> 32);
    ddp__fingerprint(w, a, sizeof a);
    if (how == DDP__LEFT_FAILED)
        return ddp__fail(DDP_ERR_PEER_LOST, "%s: rank %d failed and has left the job (a DDP_CHECK failed there, after "
                         "%llu collectives): its output says which call and why", a, who,
                         (unsigned long long)ddp__le64(theirs + 16));
    return ddp__fail(DDP_ERR_DESYNC, "desync: rank %d has left the job (%s after %llu collectives), but this rank "
                     "(%d) calls %s. The ranks ran different numbers of collectives: one rank had more batches than "
                     "another (give every rank the same number; ddp_sampler pads for this), a rank called ddp_join "
                     "before its last batch, or a collective runs on some ranks only (inside an if on the rank)",
                     who, how == DDP__LEFT_EXIT ? "its process ended without calling ddp_destroy" : "it called ddp_destroy",
                     (unsigned long long)ddp__le64(theirs + 16), pg->rank, a);
}
DDP__PRIVATE int ddp__ring_is_leave(const unsigned char h[32]) {
    return ddp__le64(h) == (DDP__RING_MAGIC | (uint64_t)DDP__LEAVE << 32);
}

/* Our header against rank `who`'s: DDP_OK, or the desync (or that rank's leaving). The ring
   compares with its left neighbour's; the MPI backend with every rank's. */
DDP__PRIVATE ddp_status ddp__header_compare(ddp_pg* pg, ddp_work* w, const unsigned char mine[32],
                                            const unsigned char theirs[32], int who) {
    char a[96], b[96];
    if (ddp__ring_is_leave(theirs)) return ddp__ring_left_job(pg, w, who, theirs);
    if (memcmp(mine, theirs, 32) == 0) return DDP_OK;
    ddp__ring_header_text(mine, a, sizeof a);
    ddp__ring_header_text(theirs, b, sizeof b);
    return ddp__fail(DDP_ERR_DESYNC, "desync: this rank (%d) calls %s, but rank %d calls %s. Every rank must call "
                     "the same collectives in the same order with the same sizes: look for a collective inside "
                     "an if on the rank", pg->rank, a, who, b);
}
DDP__PRIVATE ddp_status ddp__ring_compare(ddp_pg* pg, ddp_work* w, const unsigned char mine[32],
                                          const unsigned char theirs[32]) {
    return ddp__header_compare(pg, w, mine, theirs, ddp__mod(pg->rank - 1, pg->world));
}

DDP__PRIVATE ddp_status ddp__ring_check(ddp_pg* pg, ddp_work* w) {
    const int left = ddp__mod(pg->rank - 1, pg->world), right = ddp__mod(pg->rank + 1, pg->world);
    unsigned char mine[32], theirs[32];
    double deadline = ddp__now() + pg->timeout;
    ddp__ring_header(w, mine);
    if (ddp__send_all(pg->right_fd, mine, 32, deadline) != 0) {
        int e = errno;
        /* a neighbour that left the job may have said so before its connection closed */
        if (e != ETIMEDOUT && ddp__recv_all(pg->left_fd, theirs, 32, ddp__now() + 0.1) == 0 && ddp__ring_is_leave(theirs))
            return ddp__ring_left_job(pg, w, ddp__mod(pg->rank - 1, pg->world), theirs);
        errno = e;
        return errno == ETIMEDOUT
                   ? ddp__fail(DDP_ERR_TIMEOUT, "%s #%llu timed out after %.0f s sending to rank %d: that rank is "
                               "stuck, stopped, or calling a different collective", ddp__coll_name(w->kind),
                               (unsigned long long)w->seq, pg->timeout, right)
                   : ddp__fail(DDP_ERR_PEER_LOST, "%s #%llu: sending to rank %d failed (%s): it has probably died",
                               ddp__coll_name(w->kind), (unsigned long long)w->seq, right, strerror(errno));
    }
    if (pg->tcp_yield) { /* ranks share cores: yield a while before recv_all sleeps */
        struct pollfd pf;
        pf.fd = pg->left_fd, pf.events = POLLIN, pf.revents = 0;
        ddp__poll_yielding(&pf, 1, 1, deadline);
    }
    if (ddp__recv_all(pg->left_fd, theirs, 32, deadline) != 0)
        return errno == ETIMEDOUT
                   ? ddp__fail(DDP_ERR_TIMEOUT, "%s #%llu (%zu x %s) timed out after %.0f s waiting for rank %d to "
                               "start it: that rank is stuck, stopped, or not calling this collective (every rank "
                               "must issue the same collectives in the same order)", ddp__coll_name(w->kind),
                               (unsigned long long)w->seq, w->count, ddp__dtype_name(w->dtype), pg->timeout, left)
                   : ddp__fail(DDP_ERR_PEER_LOST, "%s #%llu: rank %d closed its connection (%s): that rank has "
                               "probably died; look at its output", ddp__coll_name(w->kind), (unsigned long long)w->seq,
                               left, errno == ECONNRESET ? "end of stream" : strerror(errno));
    return ddp__ring_compare(pg, w, mine, theirs);
}

/* Small all-reduces over TCP: recursive doubling. The ring takes 2(W-1) steps, each a message that
   must start, cross the network and wake its receiver, whatever its size; for a small buffer that
   latency is the whole cost. Recursive doubling takes log2(W) steps: at step k each rank swaps its
   whole buffer with rank ^ 2^k and adds, so after k steps each rank holds the sum of its group of
   2^k ranks. It sends log2(W) x S bytes instead of 2(W-1)/W x S, which the cost model weighs
   (ddp__use_doubling). A world that is not a power of two, W = P + E with P the largest power of two
   below it: rank P + i first hands its buffer to rank i and takes no part in the doubling; at the
   end rank i hands it the result (two steps more). Two ranks are one exchange (ddp__tcp_exchange).

   Every rank gets the same bits: a pair adds the same two numbers, and a + b == b + a exactly in
   floating point (max too), so after step k the 2^k ranks of a group hold identical buffers. The
   order of the additions is a tree, ((x0 + x1) + (x2 + x3)) for 4 ranks, not the ring's chain,
   so the two algorithms may differ in the last bits. Every message starts with the collective's
   header, which the receiver checks as the ring does. The waits spin a few microseconds before they
   sleep in poll (the answer usually comes sooner than a sleeping thread wakes), or yield their core
   when ranks outnumber cores. */
/* The rest of a 32-byte header followed by `n` bytes of data, `done` bytes of which have moved. */
DDP__PRIVATE void ddp__iov2(struct msghdr* mh, struct iovec iov[2], unsigned char* head, unsigned char* data, size_t n,
                            size_t done) {
    memset(mh, 0, sizeof *mh);
    iov[0].iov_base = head + (done < 32 ? done : 32), iov[0].iov_len = done < 32 ? 32 - done : 0;
    iov[1].iov_base = data + (done > 32 ? done - 32 : 0), iov[1].iov_len = n - (done > 32 ? done - 32 : 0);
    mh->msg_iov = iov, mh->msg_iovlen = 2;
}

/* One swap with rank `peer`: the header and `nbytes` of buf go out on sfd (unless sfd < 0) while
   peer's header and data come in on rfd into pg->piece (unless rfd < 0). `step` names the step in
   errors (0 for the only one). */
DDP__PRIVATE ddp_status ddp__tcp_swap(ddp_pg* pg, ddp_work* w, int sfd, int rfd, int peer, int step,
                                      unsigned char* buf, size_t nbytes, double deadline) {
    unsigned char mine[32], theirs[32];
    size_t sent = sfd < 0 ? 32 + nbytes : 0, got = rfd < 0 ? 32 + nbytes : 0;
    double spin_until = pg->tcp_yield ? 0 : ddp__now() + 20e-6;
    memset(theirs, 0, sizeof theirs); /* a send-only swap reads no header */
    ddp__ring_header(w, mine);
    while (sent < 32 + nbytes || got < 32 + nbytes) {
        int progress = 0;
        if (sent < 32 + nbytes) {
            struct iovec iov[2];
            struct msghdr mh;
            ssize_t k;
            ddp__iov2(&mh, iov, mine, buf, nbytes, sent);
            k = sendmsg(sfd, &mh, DDP__SEND_FLAGS | MSG_DONTWAIT);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                int e = errno;
                /* a partner that left the job may have said so before its connection closed */
                if (got >= 32 && ddp__ring_is_leave(theirs)) return ddp__header_compare(pg, w, mine, theirs, peer);
                return ddp__fail(DDP_ERR_PEER_LOST, "%s #%llu: sending to rank %d failed (%s): it has probably died",
                                 ddp__coll_name(w->kind), (unsigned long long)w->seq, peer, strerror(e));
            }
            if (k > 0) sent += (size_t)k, progress = 1;
        }
        if (got < 32 + nbytes) {
            struct iovec iov[2];
            struct msghdr mh;
            ssize_t k;
            ddp__iov2(&mh, iov, theirs, pg->piece, nbytes, got);
            k = recvmsg(rfd, &mh, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                int e = k == 0 ? ECONNRESET : errno;
                if (got >= 32 && ddp__ring_is_leave(theirs)) return ddp__header_compare(pg, w, mine, theirs, peer);
                return ddp__fail(DDP_ERR_PEER_LOST, "%s #%llu: rank %d closed its connection (%s): that rank has "
                                 "probably died; look at its output", ddp__coll_name(w->kind), (unsigned long long)w->seq,
                                 peer, k == 0 ? "end of stream" : strerror(e));
            }
            if (k > 0) {
                if (got < 32 && got + (size_t)k >= 32) DDP__TRY(ddp__header_compare(pg, w, mine, theirs, peer));
                got += (size_t)k, progress = 1;
            }
        }
        if (!progress) {
            struct pollfd pf[2];
            int n = 0;
            double t = ddp__now();
            if (t < spin_until) continue;
            if (t >= deadline) {
                char at[32] = "";
                if (step > 0) snprintf(at, sizeof at, " at step %d", step);
                return ddp__fail(DDP_ERR_TIMEOUT, "%s #%llu (%zu x %s) timed out after %.0f s%s waiting for rank %d: "
                                 "that rank is stuck, stopped, or calling a different collective (every rank must "
                                 "issue the same collectives in the same order)", ddp__coll_name(w->kind),
                                 (unsigned long long)w->seq, w->count, ddp__dtype_name(w->dtype), pg->timeout, at, peer);
            }
            if (sent < 32 + nbytes) pf[n].fd = sfd, pf[n].events = POLLOUT, pf[n].revents = 0, n++;
            if (got < 32 + nbytes) pf[n].fd = rfd, pf[n].events = POLLIN, pf[n].revents = 0, n++;
            ddp__poll_yielding(pf, n, pg->tcp_yield, deadline);
        }
    }
    if (sfd >= 0) DDP__COUNT(pg->bytes_sent, (uint64_t)nbytes);
    if (rfd >= 0) DDP__COUNT(pg->bytes_received, (uint64_t)nbytes);
    return DDP_OK;
}

/* Two ranks, a small all-reduce: the ring's two steps of half the buffer each become one swap of
   the whole buffer (the same bytes), with the header in front of the data, so the collective costs
   one trip through the kernel instead of three. */
#define DDP__EXCHANGE_MAX ((size_t)64 << 10)
DDP__PRIVATE ddp_status ddp__tcp_exchange(ddp_pg* pg, ddp_work* w, unsigned char* buf) {
    const size_t nbytes = w->count * ddp_dtype_size(w->dtype);
    const int other = 1 - pg->rank;
    DDP__TRY(ddp__tcp_swap(pg, w, pg->right_fd, pg->left_fd, other, 0, buf, nbytes, ddp__now() + pg->timeout));
    ddp__reduce(buf, pg->piece, w->count, w->dtype, w->op);
    if (w->op == DDP_AVG) ddp__divide(buf, w->count, w->dtype, 2);
    if (ddp__log_level_enabled() >= DDP_LOG_DETAIL)
        ddp__log(DDP_LOG_DETAIL, "%s #%llu (2 ranks, %zu bytes): exchanged the whole buffer with rank %d and %s it",
                ddp__coll_name(w->kind), (unsigned long long)w->seq, nbytes, other,
                w->op == DDP_MAX ? "took the maximum with" : "added");
    return DDP_OK;
}

/* The largest power of two not above n (n >= 1), and its log2. */
DDP__PRIVATE int ddp__pow2_floor(int n, int* log2) {
    int p = 1, l = 0;
    while (2 * p <= n) p *= 2, l++;
    if (log2) *log2 = l;
    return p;
}

/* Recursive doubling or the ring, for an all-reduce of `bytes` over TCP on 3 ranks or more. The
   cost model of chapter 10: a message costs alpha + bytes * beta. The ring pays 2W - 1 alphas (its
   steps and the header's trip) for 2(W-1)/W x bytes; doubling pays D = log2(P) (+2 when W is not
   a power of two) alphas for D x bytes. Doubling wins while the alphas it saves outweigh the
   bytes it adds, with alpha/beta, the bytes a link moves in the time one message takes to start,
   taken as DDP__ALPHA_BYTES. DDP_ALGO=ring or doubling overrides (doubling up to one piece). */
#define DDP__ALPHA_BYTES 32768.0
DDP__PRIVATE int ddp__use_doubling(const ddp_pg* pg, size_t bytes) {
    const int W = pg->world;
    int levels, P = ddp__pow2_floor(W, &levels), D = levels + (W > P ? 2 : 0);
    if (W < 3 || pg->rd_levels == 0 || pg->algo == 1 || bytes > pg->piece_elems * 4) return 0;
    if (pg->algo == 2) return 1;
    return (double)(2 * W - 1 - D) * DDP__ALPHA_BYTES >= (double)bytes * (D - 2.0 * (W - 1) / W);
}

/* DDP_DEBUG=DETAIL's line for one step; `did` holds one %d, the peer. */
DDP__PRIVATE void ddp__doubling_say(const ddp_pg* pg, const ddp_work* w, int step, int steps, int peer,
                                    const char* did) {
    char what[96];
    snprintf(what, sizeof what, did, peer);
    ddp__log(DDP_LOG_DETAIL, "%s #%llu (recursive doubling, %d ranks, %zu bytes) step %d/%d: %s",
            ddp__coll_name(w->kind), (unsigned long long)w->seq, pg->world, w->count * ddp_dtype_size(w->dtype),
            step, steps, what);
}

DDP__PRIVATE ddp_status ddp__tcp_doubling(ddp_pg* pg, ddp_work* w, unsigned char* buf) {
    const int W = pg->world, r = pg->rank, detail = ddp__log_level_enabled() >= DDP_LOG_DETAIL;
    const size_t nbytes = w->count * ddp_dtype_size(w->dtype);
    const double deadline = ddp__now() + pg->timeout;
    const char* added = w->op == DDP_MAX ? "exchanged the whole buffer with rank %d and took the maximum" :
                                           "exchanged the whole buffer with rank %d and added it";
    int levels, P = ddp__pow2_floor(W, &levels), k, steps = levels + (W > P ? 2 : 0), step = 0;
    if (r >= P) { /* stand aside: give rank r - P this buffer, take the result back from it */
        DDP__TRY(ddp__tcp_swap(pg, w, pg->rd_extra_fd, -1, r - P, 1, buf, nbytes, deadline));
        if (detail) ddp__doubling_say(pg, w, 1, steps, r - P, "sent the whole buffer to rank %d, which stands in for this one");
        DDP__TRY(ddp__tcp_swap(pg, w, -1, pg->rd_extra_fd, r - P, steps, buf, nbytes, deadline));
        memcpy(buf, pg->piece, nbytes);
        if (detail) ddp__doubling_say(pg, w, steps, steps, r - P, "received the result from rank %d");
        return DDP_OK;
    }
    if (r + P < W) {
        DDP__TRY(ddp__tcp_swap(pg, w, -1, pg->rd_extra_fd, r + P, ++step, buf, nbytes, deadline));
        ddp__reduce(buf, pg->piece, w->count, w->dtype, w->op);
        if (detail)
            ddp__doubling_say(pg, w, step, steps, r + P, w->op == DDP_MAX ? "received rank %d's buffer and took the maximum"
                                                                          : "received rank %d's buffer and added it");
    } else if (W > P) {
        step++; /* the others' first step, which this rank has no part in */
    }
    for (k = 0; k < levels; k++) {
        int peer = r ^ (1 << k);
        DDP__TRY(ddp__tcp_swap(pg, w, pg->rd_fd[k], pg->rd_fd[k], peer, ++step, buf, nbytes, deadline));
        ddp__reduce(buf, pg->piece, w->count, w->dtype, w->op);
        if (detail) ddp__doubling_say(pg, w, step, steps, peer, added);
    }
    if (w->op == DDP_AVG) ddp__divide(buf, w->count, w->dtype, W);
    if (r + P < W) {
        DDP__TRY(ddp__tcp_swap(pg, w, pg->rd_extra_fd, -1, r + P, ++step, buf, nbytes, deadline));
        if (detail) ddp__doubling_say(pg, w, step, steps, r + P, "sent the result to rank %d");
    }
    return DDP_OK;
}

/* The result, from the buffer the transport worked on to the caller's (scratch or GPU). */
DDP__PRIVATE ddp_status ddp__cpu_copy_out(ddp_pg* pg, ddp_work* w, unsigned char* host) {
    const size_t es = ddp_dtype_size(w->dtype);
    size_t total = w->kind == DDP__ALL_GATHER ? w->count * (size_t)pg->world : w->count;
    if (w->kind == DDP__REDUCE_SCATTER)
        return ddp__copy_now(pg->device, w->buf, ddp__cpu(), host + (size_t)pg->rank * w->count * es, w->count * es);
    if (host != (unsigned char*)w->buf) return ddp__copy_now(pg->device, w->buf, ddp__cpu(), host, total * es);
    if (w->staged) ddp__tensors_copy(w, 0, (float*)host, w->count, 1, 0); /* the results to the tensors */
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__cpu_run_once(ddp_pg* pg, ddp_work* w) {
    const int W = pg->world;
    const size_t es = ddp_dtype_size(w->dtype);
    const int on_gpu = pg->device.type == DDP_DEVICE_CUDA;
    size_t total = (w->kind == DDP__ALL_GATHER || w->kind == DDP__REDUCE_SCATTER) ? w->count * (size_t)W : w->count;
    unsigned char* host;
    ddp_status s = DDP_OK;
    if (w->ready) DDP__TRY(ddp__event_sync(w->ready));
    /* The buffer the ring works on: the user's own (host, in-place collectives), else scratch. */
    if (!on_gpu && (w->kind == DDP__ALL_REDUCE || w->kind == DDP__BROADCAST)) {
        host = (unsigned char*)w->buf;
    } else {
        DDP__TRY(ddp__staging(pg, total * es));
        host = pg->staging;
        if (w->kind == DDP__ALL_REDUCE || w->kind == DDP__BROADCAST)
            DDP__TRY(ddp__copy_now(ddp__cpu(), host, pg->device, w->buf, total * es));
        else if (w->kind == DDP__REDUCE_SCATTER)
            DDP__TRY(ddp__copy_now(ddp__cpu(), host, pg->device, w->send, total * es));
        else /* all-gather: our part goes to its place */
            DDP__TRY(ddp__copy_now(ddp__cpu(), host + (size_t)pg->rank * w->count * es, pg->device, w->send,
                                   w->count * es));
    }
    /* A simulated slow network (for experiments with overlap and with the cost model): each
       collective takes at least its latency plus as long as its bytes would need at the given
       speed, but never past the deadline, which a real network that slow would miss too. */
    {
        double sim = pg->sim_latency_s + (double)(total * es) * pg->sim_s_per_byte;
        if (sim > 0 && sim > pg->timeout) {
            const char *ns = getenv("DDP_SIMULATE_NS_PER_BYTE"), *lat = getenv("DDP_SIMULATE_LATENCY_US");
            char what[160];
            if (pg->sim_latency_s > 0 && pg->sim_s_per_byte > 0)
                snprintf(what, sizeof what, "DDP_SIMULATE_LATENCY_US=%s and DDP_SIMULATE_NS_PER_BYTE=%s make",
                         lat ? lat : "?", ns ? ns : "?");
            else if (pg->sim_latency_s > 0)
                snprintf(what, sizeof what, "DDP_SIMULATE_LATENCY_US=%s makes", lat ? lat : "?");
            else
                snprintf(what, sizeof what, "DDP_SIMULATE_NS_PER_BYTE=%s makes", ns ? ns : "?");
            return ddp__fail(DDP_ERR_ENV, "%s this %s of %zu bytes last %.1f s, longer than the timeout (%.0f s, "
                             "DDP_TIMEOUT): lower %s, or raise DDP_TIMEOUT", what, ddp__coll_name(w->kind), total * es,
                             sim, pg->timeout, pg->sim_s_per_byte > 0 ? "DDP_SIMULATE_NS_PER_BYTE" : "DDP_SIMULATE_LATENCY_US");
        }
        if (sim > 0) ddp__sleep(sim);
    }
    /* the reducer's 1/world (ddp_work.premul): shared memory applies it as it copies into the slots;
       the other paths take a pass over the buffer first */
    if (w->premul == 1.0f) w->premul = 0;
    /* an all-reduce with tensors (ddp_work.tensors): shared memory's two-phase path reads and writes
       them where they are; the other paths work on one buffer, the bucket */
    if (!(W > 1 && pg->shm)) ddp__tensors_stage(w, host);
    if (w->premul && !(W > 1 && pg->shm)) {
        ddp__mul_f32((float*)host, (const float*)host, w->count, w->premul, 0);
        w->premul = 0;
    }
#if DDP__SHM
    if (W > 1 && pg->shm) return ddp__shm_run(pg, w, host) != DDP_OK ? ddp__last_status() : ddp__cpu_copy_out(pg, w, host);
#endif
    if (W == 2 && w->kind == DDP__ALL_REDUCE && total * es <= DDP__EXCHANGE_MAX && total * es <= pg->piece_elems * 4)
        return ddp__tcp_exchange(pg, w, host) != DDP_OK ? ddp__last_status() : ddp__cpu_copy_out(pg, w, host);
    if (w->kind == DDP__ALL_REDUCE && ddp__use_doubling(pg, total * es))
        return ddp__tcp_doubling(pg, w, host) != DDP_OK ? ddp__last_status() : ddp__cpu_copy_out(pg, w, host);
    if (W > 1) DDP__TRY(ddp__ring_check(pg, w));
    if (W > 1) {
        if (w->kind == DDP__ALL_REDUCE) s = ddp__ring(pg, w, host, w->count, 0, 2 * W - 2, 0);
        else if (w->kind == DDP__REDUCE_SCATTER) s = ddp__ring(pg, w, host, total, 0, W - 1, -1);
        else if (w->kind == DDP__ALL_GATHER) s = ddp__ring(pg, w, host, total, W - 1, 2 * W - 2, -1);
        else s = ddp__ring_broadcast(pg, w, host);
    }
    return s != DDP_OK ? s : ddp__cpu_copy_out(pg, w, host);
}

/* The queue's first collective has ended with status s: take it off, record a failure for the
   group, mark it done. Called with pg->lock held, by whichever thread ran it. */
DDP__PRIVATE void ddp__work_finish(ddp_pg* pg, ddp_work* w, ddp_status s) {
    pg->head = w->next;
    if (!pg->head) pg->tail = NULL;
    w->status = s;
    if (s != DDP_OK) {
        snprintf(w->msg, sizeof w->msg, "%s", pg->broken ? pg->broken_msg : ddp_error_string());
        if (!pg->broken) {
            pg->broken = s;
            snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", ddp_error_string());
        }
    }
    w->done = 1;
    if (w->abandoned) {
        ddp__event_destroy(w->ready);
        DDP_FREE(w);
    }
    pthread_cond_broadcast(&pg->done_cond);
}

/* The communication thread: take collectives in issue order, run each, mark it done. */
DDP__PRIVATE void* ddp__comm_main(void* arg) {
    ddp_pg* pg = (ddp_pg*)arg;
    ddp__comm_thread = 1;
#if DDP__CUDA
    if (pg->device.type == DDP_DEVICE_CUDA) ddp__device_activate(pg->device);
#endif
    for (;;) {
        ddp_work* w;
        ddp_status s;
        pthread_mutex_lock(&pg->lock);
        while ((!pg->head || pg->inline_busy) && !pg->stop) pthread_cond_wait(&pg->cond, &pg->lock);
        if (!pg->head) {
            pthread_mutex_unlock(&pg->lock);
            break;
        }
        w = pg->head;
        pg->running = w;
        s = pg->broken; /* read under the lock: the caller's thread may set it */
        pthread_mutex_unlock(&pg->lock);
        if (s == DDP_OK) s = ddp__cpu_run(pg, w);
        pthread_mutex_lock(&pg->lock);
        pg->running = NULL;
        ddp__work_finish(pg, w, s);
        pthread_mutex_unlock(&pg->lock);
    }
    return NULL;
}

/* A lazy collective is one its caller is about to wait for (the reducer's last bucket: backward
   has nothing left to overlap it with). Waking the idle communication thread for it would cost a
   futex call and a thread switch on the core the caller needs; left in the queue, it runs on the
   waiting thread instead, or on the communication thread if that is busy with earlier ones. */
DDP__PRIVATE ddp_status ddp__cpu_submit(ddp_pg* pg, ddp_work* w) {
    pthread_mutex_lock(&pg->lock);
    if (pg->tail) pg->tail->next = w;
    else pg->head = w;
    pg->tail = w;
    if (!w->lazy) pthread_cond_broadcast(&pg->cond);
    pthread_mutex_unlock(&pg->lock);
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__cpu_wait(ddp_pg* pg, ddp_work* w) {
    /* The communication thread enforces the collective's deadline on every socket wait; this
       longer one only guards against the thread itself being stuck. */
    double deadline = ddp__now() + pg->timeout * 2 + 10;
    ddp_status s;
    pthread_mutex_lock(&pg->lock);
    if (!w->done && pg->head == w && pg->running != w && !pg->inline_busy && !pg->broken) {
        /* Next in line and not started: run it here. Waking the communication thread and then
           being woken by it costs two thread switches, more than a small collective itself (and
           when the ranks are bound to one core each, the two threads share that core). */
        pg->inline_busy = 1;
        pthread_mutex_unlock(&pg->lock);
        s = ddp__cpu_run(pg, w);
        pthread_mutex_lock(&pg->lock);
        pg->inline_busy = 0;
        ddp__work_finish(pg, w, s);
        if (pg->head) pthread_cond_signal(&pg->cond); /* it waited while this ran */
    }
    while (!w->done) {
        struct timespec ts;
        struct timeval tv;
        double at;
        if (ddp__now() >= deadline) {
            int kind = w->kind;
            unsigned long long seq = (unsigned long long)w->seq;
            w->abandoned = 1; /* from here on the communication thread frees w */
            pthread_mutex_unlock(&pg->lock);
            return ddp__fail(DDP_ERR_TIMEOUT, "%s #%llu did not finish: the communication thread is stuck",
                             ddp__coll_name(kind), seq);
        }
        /* pthread_cond_timedwait takes wall-clock time */
        gettimeofday(&tv, NULL);
        at = (double)tv.tv_sec + tv.tv_usec * 1e-6 + 0.5;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&pg->done_cond, &pg->lock, &ts);
    }
    pthread_mutex_unlock(&pg->lock);
    s = w->status;
    if (s != DDP_OK) ddp__fail(s, "%s", w->msg);
    ddp__event_destroy(w->ready);
    DDP_FREE(w);
    return s;
}

/* Connect the ring: listen, publish our address, connect to rank+1, accept rank-1. */
/* Recursive doubling's connections (TCP, 3 ranks or more): one to each partner rank ^ 2^k and one
   to the rank that stands in for this one, or that this one stands in for (ddp__tcp_doubling).
   Each rank listens, publishes its address, connects to its lower-ranked partners and accepts the
   higher-ranked ones; the greeting says "doubling" (rank + 2^30), so it is never taken for the
   ring's. */
DDP__PRIVATE ddp_status ddp__rd_connect(ddp_pg* pg, const char* host, uint64_t tok) {
    const int W = pg->world, r = pg->rank, RD = 1 << 30;
    int levels, P = ddp__pow2_floor(W, &levels), k, lfd, lport = 0, expect = 0, peer;
    double deadline = ddp__now() + pg->timeout;
    char key[64], addr[300];
    unsigned char hello[16];
    size_t n = 0;
    for (k = 0; k < levels; k++) pg->rd_fd[k] = -1;
    if (r >= P) levels = 0; /* a rank that stands aside swaps with its stand-in only */
    pg->rd_levels = levels > 0 ? levels : 1; /* what ddp__cpu_destroy closes; > 0: doubling is set up */
    lfd = ddp__sock_listen(host, 0, &lport);
    if (lfd < 0) return ddp__fail(DDP_ERR_IO, "rank %d cannot listen for its doubling partners: %s", r, strerror(errno));
    snprintf(addr, sizeof addr, "%s %d", host, lport);
    snprintf(key, sizeof key, "ddp/rd/%d", r);
    if (ddp_store_set(pg->store, key, addr, strlen(addr)) != DDP_OK) { close(lfd); return ddp__last_status(); }
    ddp__put_le64(hello, tok);
    ddp__put_le32(hello + 8, (uint32_t)(r + RD));
    ddp__put_le32(hello + 12, DDP__STORE_VERSION);
    /* connect to the lower-ranked: the partners r ^ 2^k below r, and the stand-in r - P */
    for (k = -1; k < levels; k++) {
        char rhost[256];
        int rport = 0, fd;
        peer = k < 0 ? (r >= P ? r - P : -1) : r ^ (1 << k);
        if (peer < 0) continue;
        if (peer > r) { expect++; continue; }
        snprintf(key, sizeof key, "ddp/rd/%d", peer);
        memset(addr, 0, sizeof addr);
        if (ddp_store_get(pg->store, key, addr, sizeof addr - 1, &n) != DDP_OK) { close(lfd); return ddp__last_status(); }
        if (sscanf(addr, "%255s %d", rhost, &rport) != 2) {
            close(lfd);
            return ddp__fail(DDP_ERR_WORLD_MISMATCH, "rank %d published a malformed address \"%s\"", peer, addr);
        }
        fd = ddp__sock_connect(rhost, rport, deadline);
        if (fd < 0 || ddp__send_all(fd, hello, 16, deadline) != 0) {
            int e = errno;
            if (fd >= 0) close(fd);
            close(lfd);
            return ddp__fail(DDP_ERR_PEER_LOST, "rank %d cannot connect to rank %d at %s:%d for recursive doubling: %s "
                             "(a firewall, or the wrong network interface?)", r, peer, rhost, rport, strerror(e));
        }
        if (k < 0) pg->rd_extra_fd = fd;
        else pg->rd_fd[k] = fd;
    }
    if (r < P && r + P < W) expect++; /* rank r + P stands aside and connects to this one */
    while (expect > 0) {
        struct pollfd pf;
        int fd, ok = 0;
        unsigned char got[16];
        pf.fd = lfd, pf.events = POLLIN, pf.revents = 0;
        if (poll(&pf, 1, ddp__ms_left(deadline)) == 0 && ddp__now() >= deadline) {
            close(lfd);
            return ddp__fail(DDP_ERR_TIMEOUT, "rank %d waited %.0f s for %d of its doubling partners to connect", r,
                             pg->timeout, expect);
        }
        fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        ddp__sock_setup(fd);
        if (ddp__recv_all(fd, got, 16, ddp__now() + 5.0) == 0 && ddp__le64(got) == tok &&
            ddp__le32(got + 12) == DDP__STORE_VERSION && (int)ddp__le32(got + 8) >= RD) {
            peer = (int)ddp__le32(got + 8) - RD;
            for (k = 0; k < levels; k++)
                if (peer == (r ^ (1 << k)) && peer > r && pg->rd_fd[k] < 0) pg->rd_fd[k] = fd, ok = 1;
            if (!ok && r < P && peer == r + P && pg->rd_extra_fd < 0) pg->rd_extra_fd = fd, ok = 1;
        }
        if (ok) {
            expect--;
        } else {
            char who[64];
            ddp__log(DDP_LOG_WARN, "recursive doubling: refused a connection from %s that is no partner of rank %d in "
                    "this job", ddp__peer_name(fd, who, sizeof who), r);
            close(fd);
        }
    }
    close(lfd);
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__cpu_connect(ddp_pg* pg) {
    char key[64], addr[300], host[256] = "127.0.0.1";
    int lport = 0, lfd, r = pg->rank, W = pg->world, right = (r + 1) % W, left = (r - 1 + W) % W;
    size_t n = 0;
    double deadline = ddp__now() + pg->timeout;
    unsigned char hello[16];
    uint64_t tok = ddp__fnv1a((const unsigned char*)pg->store->token, strlen(pg->store->token));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    /* 1 MiB pieces: fewer pieces mean fewer system calls and wake-ups per byte, which large
       all-reduces gain more from than small ones lose (make bench's tcp rows measure it). */
    size_t piece_bytes = (size_t)ddp__env_tuning("DDP_RING_PIECE_BYTES", 1 << 20, 1, 1, "bytes");
    pg->left_fd = pg->right_fd = pg->rd_extra_fd = -1;
    pg->rd_levels = 0;
    pg->piece_elems = piece_bytes / 4 ? piece_bytes / 4 : 1;
    pg->sim_s_per_byte = ddp__env_tuning("DDP_SIMULATE_NS_PER_BYTE", 0, 0, 0, "nanoseconds") * 1e-9;
    pg->sim_latency_s = ddp__env_tuning("DDP_SIMULATE_LATENCY_US", 0, 0, 0, "microseconds") * 1e-6;
    pg->tcp_yield = sysconf(_SC_NPROCESSORS_ONLN) < pg->env.local_world_size;
    {
        const char* algo = getenv("DDP_ALGO");
        if (algo && *algo && strcmp(algo, "auto") != 0) {
            if (!strcmp(algo, "ring")) pg->algo = 1;
            else if (!strcmp(algo, "doubling")) pg->algo = 2;
            else return ddp__fail(DDP_ERR_ENV, "DDP_ALGO=%s is not ring, doubling or auto", algo);
        }
    }

    /* the scratch for one received piece, sized for the widest dtype (f32) */
    pg->piece = (unsigned char*)ddp__malloc(pg->piece_elems * 4);
    if (!pg->piece) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the ring's receive piece failed");
    if (W == 1) return DDP_OK;
    if (W > 2) { /* ranks that chose differently would run two algorithms in one all-reduce */
        static const char* const names[3] = {"auto", "ring", "doubling"};
        char theirs[16] = "";
        if (pg->rank == 0) {
            DDP__TRY(ddp_store_set(pg->store, "ddp/algo", names[pg->algo], strlen(names[pg->algo])));
        } else {
            DDP__TRY(ddp_store_get(pg->store, "ddp/algo", theirs, sizeof theirs - 1, &n));
            if (strcmp(theirs, names[pg->algo]) != 0) {
                ddp__fail(DDP_ERR_ENV, "DDP_ALGO is %s on rank 0 but %s on this rank (%d): every rank must choose the "
                          "same all-reduce algorithm", theirs, names[pg->algo], pg->rank);
                ddp__err_fix = "give every rank the same DDP_ALGO (export it before the launcher), or unset it";
                return DDP_ERR_ENV;
            }
        }
    }
    /* The address peers reach us at: the one our store connection leaves from, since that
       interface reaches the master and so, presumably, the other nodes too. We listen there only
       (127.0.0.1 when the whole job is on this machine), not on every interface. */
    if (getsockname(pg->store->fd, (struct sockaddr*)&ss, &sl) == 0)
        getnameinfo((struct sockaddr*)&ss, sl, host, sizeof host, NULL, 0, NI_NUMERICHOST);
    lfd = ddp__sock_listen(host, 0, &lport);
    if (lfd < 0) return ddp__fail(DDP_ERR_IO, "rank %d cannot listen for its ring neighbour: %s", r, strerror(errno));
    snprintf(addr, sizeof addr, "%s %d", host, lport);
    snprintf(key, sizeof key, "ddp/ring/%d", r);
    if (ddp_store_set(pg->store, key, addr, strlen(addr)) != DDP_OK) { close(lfd); return ddp__last_status(); }
    snprintf(key, sizeof key, "ddp/ring/%d", right);
    memset(addr, 0, sizeof addr);
    if (ddp_store_get(pg->store, key, addr, sizeof addr - 1, &n) != DDP_OK) { close(lfd); return ddp__last_status(); }
    {
        char rhost[256];
        int rport = 0;
        if (sscanf(addr, "%255s %d", rhost, &rport) != 2) {
            close(lfd);
            return ddp__fail(DDP_ERR_WORLD_MISMATCH, "rank %d published a malformed ring address \"%s\"", right, addr);
        }
        pg->right_fd = ddp__sock_connect(rhost, rport, deadline);
        if (pg->right_fd < 0) {
            int e = errno;
            close(lfd);
            return ddp__fail(DDP_ERR_PEER_LOST, "rank %d cannot connect to rank %d at %s:%d: %s (a firewall, or "
                             "the wrong network interface?)", r, right, rhost, rport, strerror(e));
        }
    }
    /* Introduce ourselves: token digest and rank, so a stray connection is never taken for a peer. */
    ddp__put_le64(hello, tok);
    ddp__put_le32(hello + 8, (uint32_t)r);
    ddp__put_le32(hello + 12, DDP__STORE_VERSION);
    if (ddp__send_all(pg->right_fd, hello, 16, deadline) != 0) {
        close(lfd);
        return ddp__fail(DDP_ERR_PEER_LOST, "rank %d could not greet rank %d: %s", r, right, strerror(errno));
    }
    while (pg->left_fd < 0) {
        struct pollfd pf;
        int fd;
        unsigned char got[16];
        pf.fd = lfd, pf.events = POLLIN, pf.revents = 0;
        if (poll(&pf, 1, ddp__ms_left(deadline)) == 0 && ddp__now() >= deadline) {
            close(lfd);
            return ddp__fail(DDP_ERR_TIMEOUT, "rank %d waited %.0f s for rank %d to connect", r, pg->timeout, left);
        }
        fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        ddp__sock_setup(fd);
        if (ddp__recv_all(fd, got, 16, ddp__now() + 5.0) == 0 && ddp__le64(got) == tok &&
            (int)ddp__le32(got + 8) == left && ddp__le32(got + 12) == DDP__STORE_VERSION) {
            pg->left_fd = fd;
        } else {
            char peer[64];
            ddp__log(DDP_LOG_WARN, "ring: refused a connection from %s that is not rank %d of this job",
                    ddp__peer_name(fd, peer, sizeof peer), left);
            close(fd);
        }
    }
    close(lfd);
    {
        /* Big socket buffers let a whole piece sit in the kernel while the thread reduces. */
        int big = 4 << 20;
        setsockopt(pg->right_fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
        setsockopt(pg->left_fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    }
    DDP__TRY(ddp__shm_setup(pg));
    /* over TCP, small all-reduces on 3 ranks or more take recursive doubling's connections */
    if (!pg->shm && W > 2 && pg->algo != 1) return ddp__rd_connect(pg, host, tok);
    return DDP_OK;
}

/* Tell the right neighbour that this rank is leaving, as the header of a collective it will never
   call (sequence number: the next one; count: how many it made). A neighbour still inside a
   collective (it had one more batch, or calls a collective inside an if on the rank) then stops
   at once with a message saying so, instead of finding the connection closed or waiting out
   DDP_TIMEOUT. When every rank leaves together nobody reads it. */
DDP__PRIVATE void ddp__cpu_leave(ddp_pg* pg, int how) {
    unsigned char h[32];
    ddp_work leave;
    int idle, k;
    if (pg->world < 2 || pg->right_fd < 0) return;
    pthread_mutex_lock(&pg->lock);
    idle = !pg->head && !pg->inline_busy && !pg->broken;
    pthread_mutex_unlock(&pg->lock);
    if (!idle) return; /* a collective still running or failed: the stream is not at a header */
#if DDP__SHM
    if (pg->shm) {
        ddp__shm_leave(pg, how);
        return;
    }
#endif
    memset(&leave, 0, sizeof leave);
    leave.kind = DDP__LEAVE, leave.seq = pg->seq + 1, leave.count = (size_t)pg->seq, leave.op = (ddp_reduce_op)how;
    ddp__ring_header(&leave, h);
    (void)ddp__send_all(pg->right_fd, h, 32, ddp__now() + 1.0);
    /* and to the doubling partners, which may be waiting for this rank instead of the ring */
    for (k = 0; k < pg->rd_levels; k++)
        if (pg->rd_fd[k] >= 0) (void)ddp__send_all(pg->rd_fd[k], h, 32, ddp__now() + 1.0);
    if (pg->rd_extra_fd >= 0) (void)ddp__send_all(pg->rd_extra_fd, h, 32, ddp__now() + 1.0);
}

DDP__PRIVATE void ddp__cpu_destroy(ddp_pg* pg) {
    if (pg->thread_started) {
        pthread_mutex_lock(&pg->lock);
        pg->stop = 1;
        pthread_cond_broadcast(&pg->cond);
        pthread_mutex_unlock(&pg->lock);
        pthread_join(pg->thread, NULL);
        pg->thread_started = 0;
    }
    if (pg->left_fd >= 0) close(pg->left_fd);
    if (pg->right_fd >= 0) close(pg->right_fd);
    pg->left_fd = pg->right_fd = -1;
    for (; pg->rd_levels > 0; pg->rd_levels--)
        if (pg->rd_fd[pg->rd_levels - 1] >= 0) close(pg->rd_fd[pg->rd_levels - 1]);
    if (pg->rd_extra_fd >= 0) close(pg->rd_extra_fd);
    pg->rd_extra_fd = -1;
#if DDP__SHM
    if (pg->shm) munmap(pg->shm, pg->shm_bytes);
#endif
    pg->shm = NULL;
    ddp_free_pinned(pg->staging);
    if (pg->piece) DDP_FREE(pg->piece);
    pg->staging = pg->piece = NULL;
}

/* ddp__work_test: the communication thread marks a collective done under the group's lock. */
DDP__PRIVATE ddp_status ddp__cpu_test(ddp_pg* pg, ddp_work* w, int* done) {
    pthread_mutex_lock(&pg->lock);
    *done = w->done;
    pthread_mutex_unlock(&pg->lock);
    return DDP_OK;
}

static const ddp__backend_vt ddp__cpu_backend = {"cpu", ddp__cpu_connect, ddp__cpu_submit, ddp__cpu_wait,
                                                 ddp__cpu_test, ddp__cpu_destroy};
/* The cpu backend's entry in the backend table (>>pg). */
DDP__PRIVATE const ddp__backend_vt* ddp__cpu_vt(void) { return &ddp__cpu_backend; }

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>mpi: the MPI backend                                                                         */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* ---- the MPI backend (>>mpi) -------------------------------------------------------------------- */
/*
   Compiled only with -DDDP_MPI and MPI's headers (make builds *_mpi variants of some programs when
   it finds mpicc). The library's collectives become MPI's own non-blocking ones, MPI_Iallreduce,
   MPI_Ibcast, MPI_Iallgather and MPI_Ireduce_scatter_block, on a duplicate of MPI_COMM_WORLD so
   that the program's own MPI traffic never matches ours. submit starts one and returns; wait and
   ddp__work_test poll it with MPI_Test. Polling instead of MPI_Wait keeps the deadline: MPI_Wait
   would block for ever on a rank that never calls. But MPI cannot cancel a collective, so after a
   timeout the request stays pending inside MPI: the group is broken and the process should exit
   (mpirun then stops the others).

   Joining: under mpirun neither ddprun nor MASTER_ADDR is needed. ddp_init starts MPI (unless the
   program did), takes rank and world size from MPI_COMM_WORLD, counts the ranks on each host
   (local rank: it picks the GPU) and bootstraps the store, which the library still uses (ddp_wrap's
   model check, desync detection): rank 0 hosts it on a free port and sends its host and port to
   the others with MPI_Ibcast. MASTER_ADDR and MASTER_PORT, when set, are used instead.

   f16 and bf16: MPI has no half-precision sum, so reductions go through MPI_Ops of our own that
   widen each element to f32, combine, and round back: ddp__reduce, the arithmetic of the CPU ring,
   with 2 bytes per element on the wire. An average is a sum divided once by the world size at the
   end. GPU buffers are staged through host memory: copied down at submit, back up when done.

   Headers: MPI pairs collectives by their order alone, so ranks that call different ones would
   pair an all-gather with an all-reduce: wrong numbers, MPI_ERR_TRUNCATE, or a heap overrun
   inside MPI. So each collective first all-gathers every rank's 32-byte header (the CPU ring's:
   kind, sequence number, count, dtype, op or root) on a second communicator, and its data go to
   MPI only once every header matches; otherwise the ranks fail with DDP_ERR_DESYNC naming both
   calls, and nothing touches the buffers. ddp_destroy all-gathers a "leaving" header, so a rank
   still calling a collective learns that the others have left. The cost: one small all-gather
   per collective, in flight with the others.

   Progress: Open MPI advances a non-blocking collective only inside MPI calls (it has no progress
   thread), so a bucket all-reduce issued during backward mostly runs in ddp_work_wait: less overlap
   than the CPU backend's thread gives. ddp_pg_bytes stays 0: MPI does not say how many bytes its
   algorithms moved.
*/
#if defined(DDP_MPI)
#if !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1  /* a C++ build gets the C API only: the old C++ bindings warn with -Wextra */
#endif
#if !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

/* defined in >>launch */
DDP__PRIVATE int ddp__env_parse_int(const char* s, long* out);
DDP__PRIVATE ddp_status ddp__env_master_addr(const ddp_desc* d, ddp_env* e);
DDP__PRIVATE ddp_status ddp__env_master_port(const ddp_desc* d, ddp_env* e);

typedef struct ddp__mpi_op { /* one collective in flight */
    ddp_work* w;
    unsigned char hdr[32];   /* this rank's header (>>cpu's ddp__ring_header) */
    unsigned char* hdrs;     /* every rank's, world x 32 bytes, as the header all-gather fills it */
    MPI_Request hreq;        /* the header all-gather */
    int posted;              /* the headers matched and the data collective went to MPI (req) */
    ddp_status failed;       /* it never will: the group broke before (done is then 1 too) */
    MPI_Request req;
    unsigned char* host;     /* GPU buffers: the host copy, input first, then output (in place: one) */
    size_t out_offset;       /* bytes from host to the output */
    int done;                /* MPI finished it and the result is in the caller's buffer */
    struct ddp__mpi_op* next;
} ddp__mpi_op;

typedef struct ddp__mpi {
    MPI_Comm comm;           /* our duplicate of MPI_COMM_WORLD */
    MPI_Comm hcomm;          /* another: the headers' all-gathers, ordered apart from the data */
    MPI_Op half[2][2];       /* [f16, bf16][sum, max]: the user-defined reductions */
    ddp__mpi_op *head, *tail; /* in flight, in issue order */
    int stuck;               /* a collective failed or timed out and is still pending in MPI */
} ddp__mpi;

static int ddp__mpi_started; /* ddp_init called MPI_Init_thread: the last MPI group finalizes */
static int ddp__mpi_groups;  /* MPI process groups alive in this process */

DDP__PRIVATE ddp_status ddp__fail_mpi(int err, const char* call, int line) {
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(err, text, &n) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", err);
    return ddp__fail(DDP_ERR_MPI, "%s failed (ddp.h:%d): %s; likely cause: another rank failed or died, or the "
                     "ranks called different collectives", call, line, text);
}
#define DDP__MPI_TRY(call)                                                                         \
    do {                                                                                           \
        int mpi_e_ = (call);                                                                       \
        if (mpi_e_ != MPI_SUCCESS) return ddp__fail_mpi(mpi_e_, #call, __LINE__);                  \
    } while (0)

/* Poll one request with MPI_Test until it completes or the deadline passes; `what` names it in
   the timeout message. A collective in shared memory completes in microseconds, so the first
   millisecond polls without pause; later polls sleep a little, so that ranks sharing a core
   (mpirun --oversubscribe) leave it to the rank still computing. A request that fails or times
   out stays inside MPI: m->stuck. */
DDP__PRIVATE ddp_status ddp__mpi_poll(ddp__mpi* m, MPI_Request* req, double deadline, double timeout,
                                      const char* what) {
    double start = ddp__now();
    for (;;) {
        int flag = 0, err = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS) {
            m->stuck = 1;
            return ddp__fail_mpi(err, "MPI_Test", __LINE__);
        }
        if (flag) return DDP_OK;
        if (ddp__now() >= deadline) {
            m->stuck = 1;
            return ddp__fail(DDP_ERR_TIMEOUT, "%s did not finish within %.0f s on the mpi backend: a rank is stuck, "
                             "stopped, or calling a different collective. MPI cannot cancel a collective, so this "
                             "process group can no longer be used: exit the process (mpirun then stops the others)",
                             what, timeout);
        }
        if (ddp__now() - start > 1e-3) ddp__sleep(20e-6);
    }
}

/* The MPI rank and world size must agree with any launcher variable that also gives them. They
   disagree when ddprun or a hand-made loop started the ranks: each such process is an MPI job of
   its own, rank 0 of 1. */
DDP__PRIVATE ddp_status ddp__mpi_check_env(const ddp_desc* d, const ddp_env* e) {
    static const char* const vars[3][2] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}, {"RANK", "WORLD_SIZE"}};
    int i, j;
    for (i = 0; i < 3; i++)
        for (j = 0; j < 2; j++) {
            const char* v = getenv(vars[i][j]);
            long x;
            if (v && ddp__env_parse_int(v, &x) && x != (j ? e->world_size : e->rank))
                return ddp__fail(DDP_ERR_WORLD_MISMATCH, "the mpi backend takes the placement from MPI (rank %d of %d "
                                 "in MPI_COMM_WORLD), but %s=%s: start the program with mpirun -np N (ddprun and "
                                 "hand-made launches start every process as an MPI job of its own), or use another "
                                 "backend", e->rank, e->world_size, vars[i][j], v);
        }
    if (d->explicit_rank && (d->rank != e->rank || d->world_size != e->world_size))
        return ddp__fail(DDP_ERR_WORLD_MISMATCH, "desc.rank=%d and desc.world_size=%d disagree with MPI (rank %d of "
                         "%d): leave explicit_rank unset with the mpi backend", d->rank, d->world_size, e->rank,
                         e->world_size);
    return DDP_OK;
}

/* Local rank and local world size: the ranks whose host name is ours, counted in rank order as
   torchrun's LOCAL_RANK is; the node rank: the number of distinct hosts that appear before ours.
   The names are gathered with a non-blocking call, so a rank that never joins costs a timeout,
   not a hang (MPI_Comm_split_type has no non-blocking form). O(world^2) string compares, once. */
DDP__PRIVATE ddp_status ddp__mpi_placement(ddp_pg* pg, const char* me, double deadline, double timeout) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp_env* e = &pg->env;
    char *all, mine[256];
    MPI_Request req;
    ddp_status s;
    int r, q, err, my_first = -1;
    all = (char*)ddp__calloc((size_t)e->world_size * sizeof mine);
    if (!all) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the ranks' host names failed");
    memset(mine, 0, sizeof mine);
    snprintf(mine, sizeof mine, "%s", me);
    err = MPI_Iallgather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR, m->comm, &req);
    s = err != MPI_SUCCESS ? ddp__fail_mpi(err, "MPI_Iallgather(host names)", __LINE__)
                           : ddp__mpi_poll(m, &req, deadline, timeout, "gathering every rank's host name (ddp_init)");
    e->local_rank = e->local_world_size = e->node_rank = 0;
    for (r = 0; s == DDP_OK && r < e->world_size; r++)
        if (!strcmp(all + (size_t)r * sizeof mine, mine)) {
            if (my_first < 0) my_first = r;
            if (r < e->rank) e->local_rank++;
            e->local_world_size++;
        }
    for (r = 0; s == DDP_OK && r < my_first; r++) { /* is rank r the first of its host? */
        for (q = 0; q < r && strcmp(all + (size_t)q * sizeof mine, all + (size_t)r * sizeof mine); q++) {}
        e->node_rank += q == r;
    }
    DDP_FREE(all);
    return s;
}

/* Reach the store. Rank 0 hosts it (at MASTER_PORT when set, else on a free port) and broadcasts
   "ok port host", or its failure, so that no rank waits for a store that never came. A rank on
   rank 0's host connects to 127.0.0.1, the others to rank 0's host name or to MASTER_ADDR. */
DDP__PRIVATE ddp_status ddp__mpi_store(const ddp_desc* d, ddp_pg* pg, const char* me, double deadline,
                                       double timeout) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp_env* e = &pg->env;
    const char* env_addr = getenv("MASTER_ADDR");
    const int addr_given = (d->master_addr && *d->master_addr) || (env_addr && *env_addr);
    const int port_given = d->master_port > 0 || getenv("MASTER_PORT") != NULL;
    char msg[300], host[256];
    int ok = 0, port = 0, err;
    MPI_Request req;
    ddp_store_desc sd;
    ddp_status s = ddp__env_master_addr(d, e); /* checks MASTER_ADDR/PORT when set */
    if (s == DDP_OK) s = ddp__env_master_port(d, e);
    memset(&sd, 0, sizeof sd);
    sd.timeout_s = timeout;
    sd.token = d->token;
    memset(msg, 0, sizeof msg);
    if (e->rank == 0) {
        if (s == DDP_OK) {
            sd.is_server = 1;
            sd.host = "127.0.0.1";
            sd.port = port_given ? e->master_port : -1; /* -1: any free port */
            s = ddp__store_create(&sd, &pg->store);
        }
        snprintf(msg, sizeof msg, "%d %d %s", s == DDP_OK, s == DDP_OK ? ddp__store_port(pg->store) : 0, me);
    }
    err = MPI_Ibcast(msg, (int)sizeof msg, MPI_CHAR, 0, m->comm, &req);
    if (err != MPI_SUCCESS) return ddp__fail_mpi(err, "MPI_Ibcast(store address)", __LINE__);
    if (s != DDP_OK) { /* rank 0 has said so; its own error is the one to report */
        char why[sizeof ddp__err_msg];
        memcpy(why, ddp__err_msg, sizeof why);
        (void)ddp__mpi_poll(m, &req, deadline, timeout, "broadcasting the store's address");
        return ddp__fail(s, "%s", why);
    }
    DDP__TRY(ddp__mpi_poll(m, &req, deadline, timeout, "broadcasting the store's address (ddp_init)"));
    if (sscanf(msg, "%d %d %255s", &ok, &port, host) != 3 || !ok)
        return ddp__fail(DDP_ERR_STORE_UNREACHABLE, "rank 0 could not start the rendezvous store: its output says why");
    e->master_port = port;
    if (!addr_given) snprintf(e->master_addr, sizeof e->master_addr, "%s", !strcmp(host, me) ? "127.0.0.1" : host);
    if (e->rank == 0) return DDP_OK;
    sd.host = e->master_addr;
    sd.port = port;
    return ddp__store_create(&sd, &pg->store);
}

/* ddp_init's first step on the mpi backend, in place of ddp__env_resolve: start MPI unless the
   program did, place this rank from MPI_COMM_WORLD, and reach the store. */
DDP__PRIVATE ddp_status ddp__mpi_join(const ddp_desc* d, ddp_pg* pg) {
    ddp__mpi* m;
    ddp_env* e = &pg->env;
    int started = 0, finalized = 0, provided = 0, err, i, j;
    double timeout, deadline;
    char me[256] = "?";
    MPI_Request req;
    DDP__TRY(ddp__timeout(d->timeout_s, &timeout));
    deadline = ddp__now() + timeout;
    MPI_Finalized(&finalized);
    if (finalized)
        return ddp__fail(DDP_ERR_STATE, "the mpi backend cannot start: MPI was already finalized in this process, and "
                         "it starts only once per process (ddp_destroy finalizes MPI when ddp_init started it). For "
                         "several process groups in one program, call MPI_Init_thread before the first ddp_init "
                         "and MPI_Finalize after the last ddp_destroy");
    MPI_Initialized(&started);
    if (started) DDP__MPI_TRY(MPI_Query_thread(&provided));
    else DDP__MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided));
    if (!started) ddp__mpi_started = 1;
    m = (ddp__mpi*)ddp__calloc(sizeof *m);
    if (!m) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating the MPI state failed");
    m->comm = m->hcomm = MPI_COMM_NULL;
    for (i = 0; i < 2; i++)
        for (j = 0; j < 2; j++) m->half[i][j] = MPI_OP_NULL;
    pg->mpi = m; /* from here on ddp_destroy cleans up, and finalizes MPI if we started it */
    ddp__mpi_groups++;
    /* SERIALIZED: collectives may come from any one thread at a time, not only the one that
       started MPI (a training thread, a test harness) */
    if (provided < MPI_THREAD_SERIALIZED)
        return ddp__fail(DDP_ERR_MPI, "the mpi backend needs MPI_THREAD_SERIALIZED, but MPI provides only %s: %s",
                         provided == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : "MPI_THREAD_FUNNELED",
                         started ? "start MPI with MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) "
                                   "instead of MPI_Init, or let ddp_init start it"
                                 : "use an MPI library built with thread support");
    MPI_Comm_rank(MPI_COMM_WORLD, &e->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &e->world_size);
    e->source = "mpi";
    ddp__g.rank = e->rank; /* from now on log lines read "[rank R/W]" */
    ddp__g.world = e->world_size;
    ddp__g.placed = 1;
    DDP__TRY(ddp__mpi_check_env(d, e));
    /* our own communicator, duplicated without blocking: a rank that never calls ddp_init costs
       a timeout, not a hang */
    err = MPI_Comm_idup(MPI_COMM_WORLD, &m->comm, &req);
    if (err != MPI_SUCCESS) return ddp__fail_mpi(err, "MPI_Comm_idup", __LINE__);
    DDP__TRY(ddp__mpi_poll(m, &req, deadline, timeout, "duplicating MPI_COMM_WORLD (ddp_init: every rank calls it)"));
    DDP__MPI_TRY(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN)); /* errors come back as codes */
    err = MPI_Comm_idup(m->comm, &m->hcomm, &req);
    if (err != MPI_SUCCESS) return ddp__fail_mpi(err, "MPI_Comm_idup", __LINE__);
    DDP__TRY(ddp__mpi_poll(m, &req, deadline, timeout, "duplicating MPI_COMM_WORLD (ddp_init: every rank calls it)"));
    DDP__MPI_TRY(MPI_Comm_set_errhandler(m->hcomm, MPI_ERRORS_RETURN));
    gethostname(me, sizeof me - 1);
    DDP__TRY(ddp__mpi_placement(pg, me, deadline, timeout));
    DDP__TRY(ddp__mpi_store(d, pg, me, deadline, timeout));
    ddp__log(DDP_LOG_INFO, "placement from mpi: rank %d of %d, local rank %d of %d, node %d, store %s:%d", e->rank,
            e->world_size, e->local_rank, e->local_world_size, e->node_rank, e->master_addr, e->master_port);
    return DDP_OK;
}

/* f16 and bf16 reductions for MPI: inout[i] = in[i] (op) inout[i], in f32, rounded back. */
static void ddp__mpi_f16_sum(void* in, void* inout, int* n, MPI_Datatype* t) {
    (void)t;
    ddp__reduce(inout, in, (size_t)*n, DDP_F16, DDP_SUM);
}
static void ddp__mpi_f16_max(void* in, void* inout, int* n, MPI_Datatype* t) {
    (void)t;
    ddp__reduce(inout, in, (size_t)*n, DDP_F16, DDP_MAX);
}
static void ddp__mpi_bf16_sum(void* in, void* inout, int* n, MPI_Datatype* t) {
    (void)t;
    ddp__reduce(inout, in, (size_t)*n, DDP_BF16, DDP_SUM);
}
static void ddp__mpi_bf16_max(void* in, void* inout, int* n, MPI_Datatype* t) {
    (void)t;
    ddp__reduce(inout, in, (size_t)*n, DDP_BF16, DDP_MAX);
}

DDP__PRIVATE ddp_status ddp__mpi_connect(ddp_pg* pg) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    MPI_User_function* fn[2][2] = {{ddp__mpi_f16_sum, ddp__mpi_f16_max}, {ddp__mpi_bf16_sum, ddp__mpi_bf16_max}};
    int i, j;
    for (i = 0; i < 2; i++)
        for (j = 0; j < 2; j++) DDP__MPI_TRY(MPI_Op_create(fn[i][j], 1 /* commutative */, &m->half[i][j]));
    return DDP_OK;
}

/* GPU buffers: wait for the kernels writing the input (an event on the producer's stream), then
   copy it into host memory, where MPI will work. Host buffers in the in-place layout of all-gather
   or reduce-scatter are copied too: MPI's own in-place forms differ from NCCL's. */
DDP__PRIVATE ddp_status ddp__mpi_stage_in(ddp_pg* pg, ddp__mpi_op* o, const void* src, size_t in_bytes,
                                          size_t out_bytes, int in_place) {
    ddp_event* ready = NULL;
    ddp_status s = ddp__event_create(pg->device, &ready);
    if (s == DDP_OK) s = ddp__event_record(ready, pg->user_stream);
    if (s == DDP_OK) s = ddp__event_sync(ready);
    ddp__event_destroy(ready);
    DDP__TRY(s);
    o->out_offset = in_place ? 0 : in_bytes;
    o->host = (unsigned char*)ddp__malloc(o->out_offset + out_bytes + 1);
    if (!o->host) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %zu bytes of host staging failed", out_bytes);
    return ddp__copy_now(ddp__cpu(), o->host, pg->device, src, in_bytes);
}

/* One of o's requests (its headers' or its data's): with a deadline (> 0) poll it until it is
   done, else test it once; *done says which. */
DDP__PRIVATE ddp_status ddp__mpi_step(ddp_pg* pg, ddp__mpi_op* o, MPI_Request* req, double deadline, int* done) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    int err;
    *done = 1;
    if (deadline > 0) {
        char what[128];
        ddp__fingerprint(o->w, what, sizeof what);
        return ddp__mpi_poll(m, req, deadline, pg->timeout, what);
    }
    err = MPI_Test(req, done, MPI_STATUS_IGNORE);
    if (err == MPI_SUCCESS) return DDP_OK;
    m->stuck = 1;
    return ddp__fail_mpi(err, "MPI_Test", __LINE__);
}

/* Every rank's header is in and matches this one's: hand the data collective to MPI. */
DDP__PRIVATE ddp_status ddp__mpi_post(ddp_pg* pg, ddp__mpi_op* o) {
    static const char* const calls[] = {"", "MPI_Iallreduce", "MPI_Ibcast", "MPI_Iallgather",
                                        "MPI_Ireduce_scatter_block"};
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    const ddp_work* w = o->w;
    const int reduces = w->kind == DDP__ALL_REDUCE || w->kind == DDP__REDUCE_SCATTER;
    MPI_Datatype type = w->dtype == DDP_F32 ? MPI_FLOAT : MPI_UINT16_T;
    MPI_Op op = w->op == DDP_MAX ? MPI_MAX : MPI_SUM;
    const void* in = o->host ? o->host : w->send;
    void* out = o->host ? o->host + o->out_offset : w->buf;
    const int cnt = (int)w->count;
    int err;
    if (w->dtype != DDP_F32 && reduces) op = m->half[w->dtype == DDP_BF16][w->op == DDP_MAX];
    switch (w->kind) {
    case DDP__ALL_REDUCE: err = MPI_Iallreduce(MPI_IN_PLACE, out, cnt, type, op, m->comm, &o->req); break;
    case DDP__BROADCAST: err = MPI_Ibcast(out, cnt, type, w->root, m->comm, &o->req); break;
    case DDP__ALL_GATHER: err = MPI_Iallgather(in, cnt, type, out, cnt, type, m->comm, &o->req); break;
    default: err = MPI_Ireduce_scatter_block(in, out, cnt, type, op, m->comm, &o->req); break;
    }
    if (err != MPI_SUCCESS) return ddp__fail_mpi(err, calls[w->kind], __LINE__);
    o->posted = 1;
    return DDP_OK;
}

/* The headers of o are in: DDP_OK when every rank's equals this rank's; else the desync, or the
   news that a rank has left the job (its header is a leaving one), as the CPU ring words them. */
DDP__PRIVATE ddp_status ddp__mpi_compare(ddp_pg* pg, ddp__mpi_op* o) {
    int r;
    for (r = 0; r < pg->world; r++)
        if (r != pg->rank) DDP__TRY(ddp__header_compare(pg, o->w, o->hdr, o->hdrs + 32 * (size_t)r, r));
    return DDP_OK;
}

/* Hand MPI, in issue order, the data of the collectives whose headers are in and match. With a
   deadline (> 0), wait for the headers of the collectives up to and including `until` (NULL: all);
   otherwise stop at the first whose headers are not in yet. A mismatch breaks the group; header
   all-gathers still pending after it would stay inside MPI (m->stuck). */
DDP__PRIVATE ddp_status ddp__mpi_post_ready(ddp_pg* pg, ddp__mpi_op* until, double deadline) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp__mpi_op* o;
    int waiting = deadline > 0;
    for (o = m->head; o; o = o->next) {
        if (!o->posted) {
            int in = 0;
            ddp_status s = ddp__mpi_step(pg, o, &o->hreq, waiting ? deadline : 0, &in);
            if (s == DDP_OK && !in) return DDP_OK;
            if (s == DDP_OK) s = ddp__mpi_compare(pg, o);
            if (s == DDP_OK) s = ddp__mpi_post(pg, o);
            if (s != DDP_OK) {
                ddp__mpi_op* q;
                ddp__flight_note(pg, o->w, DDP__FL_FAILED);
                if (s == DDP_ERR_TIMEOUT) ddp__flight_dump(pg, DDP_LOG_ERROR, "a collective timed out");
                s = ddp__pg_break(pg, s);
                /* neither this one nor any later one will reach MPI: each fails at its wait */
                for (q = o; q; q = q->next) {
                    m->stuck |= q->hreq != MPI_REQUEST_NULL;
                    q->failed = s, q->posted = q->done = 1;
                }
                return s;
            }
        }
        if (o == until) waiting = 0;
    }
    return DDP_OK;
}

DDP__PRIVATE ddp_status ddp__mpi_submit(ddp_pg* pg, ddp_work* w) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    const size_t es = ddp_dtype_size(w->dtype), W = (size_t)pg->world;
    const int in_place = w->kind == DDP__ALL_REDUCE || w->kind == DDP__BROADCAST;
    const size_t in_bytes = w->count * es * (w->kind == DDP__REDUCE_SCATTER ? W : 1);
    const size_t out_bytes = w->count * es * (w->kind == DDP__ALL_GATHER ? W : 1);
    ddp__mpi_op* o;
    int err;
    if (w->count > (size_t)INT_MAX)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "%s of %zu elements: MPI counts are int, so the mpi backend takes at "
                         "most %d elements per rank; split the buffer", ddp__coll_name(w->kind), w->count, INT_MAX);
    o = (ddp__mpi_op*)ddp__calloc(sizeof *o);
    if (!o) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating an MPI request failed");
    o->w = w;
    o->req = o->hreq = MPI_REQUEST_NULL;
    o->hdrs = (unsigned char*)ddp__malloc(32 * W);
    if (!o->hdrs) {
        DDP_FREE(o);
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %zu bytes for the ranks' headers failed", 32 * W);
    }
    if (pg->device.type == DDP_DEVICE_CUDA || w->in_place) { /* MPI allows no aliasing: a copy */
        ddp_status s = ddp__mpi_stage_in(pg, o, in_place ? w->buf : w->send, in_place ? out_bytes : in_bytes,
                                         out_bytes, in_place);
        if (s != DDP_OK) {
            DDP_FREE(o->host);
            DDP_FREE(o->hdrs);
            DDP_FREE(o);
            return s;
        }
    }
    ddp__ring_header(w, o->hdr);
    err = MPI_Iallgather(o->hdr, 32, MPI_BYTE, o->hdrs, 32, MPI_BYTE, m->hcomm, &o->hreq);
    if (err != MPI_SUCCESS) {
        DDP_FREE(o->host);
        DDP_FREE(o->hdrs);
        DDP_FREE(o);
        return ddp__pg_break(pg, ddp__fail_mpi(err, "MPI_Iallgather(headers)", __LINE__));
    }
    if (m->tail) m->tail->next = o;
    else m->head = o;
    m->tail = o;
    ddp__flight_note(pg, w, DDP__FL_RUNNING);
    /* this one's data, and earlier ones', if their headers are in; a failure there breaks the group
       and reaches each collective it stopped at its wait (w stays with its caller) */
    (void)ddp__mpi_post_ready(pg, NULL, 0);
    return DDP_OK;
}

/* MPI finished o: divide for an average, copy a staged result up to the GPU, mark it done. */
DDP__PRIVATE ddp_status ddp__mpi_complete(ddp_pg* pg, ddp__mpi_op* o) {
    ddp_work* w = o->w;
    unsigned char* out = o->host ? o->host + o->out_offset : (unsigned char*)w->buf;
    size_t n = w->count * (w->kind == DDP__ALL_GATHER ? (size_t)pg->world : 1);
    ddp_status s = DDP_OK;
    if (w->op == DDP_AVG && (w->kind == DDP__ALL_REDUCE || w->kind == DDP__REDUCE_SCATTER))
        ddp__divide(out, w->count, w->dtype, pg->world);
    if (o->host && n) s = ddp__copy_now(pg->device, w->buf, ddp__cpu(), out, n * ddp_dtype_size(w->dtype));
    DDP_FREE(o->host);
    o->host = NULL;
    DDP_FREE(o->hdrs);
    o->hdrs = NULL;
    o->done = 1;
    ddp__flight_note(pg, w, s == DDP_OK ? DDP__FL_DONE : DDP__FL_FAILED);
    return s == DDP_OK ? DDP_OK : ddp__pg_break(pg, s);
}

/* Complete the collectives in flight in issue order, up to and including `until` (NULL: all), so
   that each one waited for implies the ones before it, as on the CPU backend's thread. With a
   deadline (> 0) poll each until it is done; without one, stop at the first still running. */
DDP__PRIVATE ddp_status ddp__mpi_progress(ddp_pg* pg, ddp__mpi_op* until, double deadline) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp__mpi_op* o;
    DDP__TRY(ddp__mpi_post_ready(pg, until, deadline));
    for (o = m->head; o; o = o->next) {
        if (!o->posted) return DDP_OK; /* its headers are not in yet (no deadline) */
        if (!o->done) {
            int finished = 0;
            ddp_status s = ddp__mpi_step(pg, o, &o->req, deadline, &finished);
            if (s == DDP_OK && !finished) return DDP_OK;
            if (s != DDP_OK) {
                ddp__flight_note(pg, o->w, DDP__FL_FAILED);
                if (s == DDP_ERR_TIMEOUT) ddp__flight_dump(pg, DDP_LOG_ERROR, "a collective timed out");
                return ddp__pg_break(pg, s);
            }
            DDP__TRY(ddp__mpi_complete(pg, o));
        }
        if (o == until) break;
    }
    return DDP_OK;
}

DDP__PRIVATE ddp__mpi_op* ddp__mpi_find(ddp__mpi* m, const ddp_work* w) {
    ddp__mpi_op* o = m->head;
    while (o && o->w != w) o = o->next;
    return o;
}

/* After a collective stuck inside MPI nothing else can be trusted to finish. */
DDP__PRIVATE ddp_status ddp__mpi_stuck(ddp_pg* pg) {
    return ddp__fail(pg->broken ? pg->broken : DDP_ERR_MPI, "an earlier collective did not finish, so this group can "
                     "no longer be used: %s", pg->broken_msg);
}

DDP__PRIVATE ddp_status ddp__mpi_wait(ddp_pg* pg, ddp_work* w) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp__mpi_op *o = ddp__mpi_find(m, w), **pp;
    if (m->stuck) return ddp__mpi_stuck(pg);
    ddp_status s, failed;
    if (!o) return ddp__fail(DDP_ERR_STATE, "ddp_work_wait: this work is not in flight on the mpi backend");
    s = ddp__mpi_progress(pg, o, ddp__now() + pg->timeout);
    if (!o->done) return s; /* still inside MPI: the group is stuck */
    /* finished, or failed before reaching MPI: either way its work goes back to the caller now */
    for (pp = &m->head; *pp != o; pp = &(*pp)->next) {}
    *pp = o->next;
    if (m->tail == o) {
        ddp__mpi_op* last = m->head;
        while (last && last->next) last = last->next;
        m->tail = last;
    }
    failed = o->failed;
    DDP_FREE(o->host);
    DDP_FREE(o->hdrs);
    DDP_FREE(o);
    if (s != DDP_OK) return s;
    return failed ? ddp__fail(failed, "%s", pg->broken_msg) : DDP_OK;
}

/* ddp_destroy: finish what is in flight, then all-gather a leaving header on the headers'
   communicator. A rank still in a collective that the others never call gets it in place of
   their headers and fails with DDP_ERR_DESYNC ("rank N has left the job"), instead of pairing
   with whatever MPI call comes next; this rank names that collective. Every rank's ddp_destroy
   takes part; a rank that never calls it costs the others DDP_TIMEOUT here. */
DDP__PRIVATE void ddp__mpi_leave(ddp_pg* pg) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp_work leave;
    unsigned char h[32], *all;
    MPI_Request req = MPI_REQUEST_NULL;
    int r;
    if (!m || m->stuck || pg->broken) return;
    if (m->head && ddp__mpi_progress(pg, NULL, ddp__now() + pg->timeout) != DDP_OK) return;
    all = (unsigned char*)ddp__malloc(32 * (size_t)pg->world);
    if (!all) return;
    memset(&leave, 0, sizeof leave);
    leave.kind = DDP__LEAVE, leave.seq = pg->seq + 1, leave.count = (size_t)pg->seq;
    leave.op = (ddp_reduce_op)DDP__LEFT_DESTROY;
    ddp__ring_header(&leave, h);
    if (MPI_Iallgather(h, 32, MPI_BYTE, all, 32, MPI_BYTE, m->hcomm, &req) != MPI_SUCCESS) {
        DDP_FREE(all);
        return;
    }
    if (ddp__mpi_poll(m, &req, ddp__now() + pg->timeout, pg->timeout,
                      "ddp_destroy's goodbye to the other ranks (every rank's ddp_destroy takes part)") != DDP_OK) {
        ddp__log(DDP_LOG_WARN, "ddp_destroy: %s", ddp_error_string()); /* `all` stays: MPI may still write it */
        return;
    }
    for (r = 0; r < pg->world; r++)
        if (r != pg->rank && !ddp__ring_is_leave(all + 32 * (size_t)r)) {
            char b[96];
            ddp__ring_header_text(all + 32 * (size_t)r, b, sizeof b);
            ddp__log(DDP_LOG_WARN, "ddp_destroy: rank %d is calling %s, which this rank (leaving after %llu "
                    "collectives) never calls: that rank fails with DDP_ERR_DESYNC, unless it has timed out on it "
                    "already", r, b, (unsigned long long)pg->seq);
        }
    DDP_FREE(all);
}

/* ddp__work_test on the mpi backend: MPI_Test the collectives in flight, in issue order. A
   failure reports *done = 1; ddp_work_wait then returns the error. */
DDP__PRIVATE ddp_status ddp__mpi_test(ddp_pg* pg, ddp_work* w, int* done) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp__mpi_op* o = ddp__mpi_find(m, w);
    *done = 1;
    if (m->stuck || !o || ddp__mpi_progress(pg, o, 0) != DDP_OK) return DDP_OK;
    *done = o->done;
    return DDP_OK;
}

DDP__PRIVATE void ddp__mpi_destroy(ddp_pg* pg) {
    ddp__mpi* m = (ddp__mpi*)pg->mpi;
    ddp__mpi_op* o;
    int i, j;
    if (!m) return;
    /* collectives nobody waited for still use their buffers: finish them first (within the deadline) */
    if (!m->stuck && m->head) (void)ddp__mpi_progress(pg, NULL, ddp__now() + pg->timeout);
    pg->mpi = NULL;
    ddp__mpi_groups--;
    if (m->stuck) {
        /* MPI may still write into the pending collective's buffers, so they are not freed; and
           MPI_Finalize could wait for it for ever */
        ddp__log(DDP_LOG_WARN, "ddp_destroy: a collective is still pending inside MPI, which cannot cancel it: MPI is "
                "left as it is (not finalized), and this process should exit now");
        ddp__mpi_started = 0;
        return;
    }
    while ((o = m->head) != NULL) {
        m->head = o->next;
        DDP_FREE(o->host);
        DDP_FREE(o->hdrs);
        DDP_FREE(o);
    }
    for (i = 0; i < 2; i++)
        for (j = 0; j < 2; j++)
            if (m->half[i][j] != MPI_OP_NULL) MPI_Op_free(&m->half[i][j]);
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    if (m->hcomm != MPI_COMM_NULL) MPI_Comm_free(&m->hcomm);
    DDP_FREE(m);
    if (ddp__mpi_groups == 0 && ddp__mpi_started) {
        ddp__mpi_started = 0;
        MPI_Finalize();
    }
}

static const ddp__backend_vt ddp__mpi_backend = {"mpi", ddp__mpi_connect, ddp__mpi_submit, ddp__mpi_wait,
                                                 ddp__mpi_test, ddp__mpi_destroy};
/* The mpi backend's entry in the backend table (>>pg). */
DDP__PRIVATE const ddp__backend_vt* ddp__mpi_vt(void) { return &ddp__mpi_backend; }
#endif

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>bind: keeping each rank on its own cores                                                     */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* Ranks of one machine each get their own share of the cores this process may use (Linux; as
   mpirun's --bind-to core does): a rank that waits by spinning then never sits on the core of the
   rank it waits for, and the scheduler stops moving ranks between cores, which costs them their
   caches. Shares are whole physical cores (a core's hyper-threads go together: two ranks on the
   two threads of one core would share its units), and a rank on a GPU takes its share of the
   cores next to that GPU (its PCI device's local_cpulist, the GPU's NUMA node), shared with the
   local ranks whose GPUs sit there too. Only when every rank can have a core of its own;
   DDP_BIND=none leaves placement to the system. The raw system call needs no _GNU_SOURCE. Threads
   already running (a BLAS library's, the store's) are moved too; threads started later inherit
   the mask.
   A launcher may have placed the ranks already (SLURM's --cpu-bind, mpirun's --bind-to, taskset or
   numactl in a wrapper): the ranks compare their masks through the store, and only ranks that
   share one mask exactly split it among themselves. A mask that no other local rank has is this
   rank's own and is kept whole (dividing it again by the number of local ranks would leave a rank
   a fraction of the cores it was given); masks that overlap without being equal are someone
   else's plan, kept too. */
#define DDP__BIND_MAXCPU 1024
#define DDP__BIND_WORDS 16 /* a mask as unsigned longs: 1024 CPUs on a 64-bit machine, 512 on 32 */
enum { DDP__BIND_SPLIT, DDP__BIND_OWN, DDP__BIND_OVERLAP };
typedef struct ddp__cpu_core {
    int cpu;  /* a CPU number */
    int core; /* its physical core: CPUs with the same value are hyper-threads of one core */
} ddp__cpu_core;

/* Parse a sysfs CPU list ("0-3,8,10-11") into flags[0..DDP__BIND_MAXCPU). Returns how many CPUs. */
DDP__PRIVATE int ddp__cpulist(const char* text, unsigned char* flags) {
    int n = 0;
    memset(flags, 0, DDP__BIND_MAXCPU);
    while (*text) {
        char* end;
        long a = strtol(text, &end, 10), b = a, i;
        if (end == text) break;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        for (i = a; i <= b && i < DDP__BIND_MAXCPU; i++)
            if (i >= 0 && !flags[i]) flags[i] = 1, n++;
        text = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    return n;
}

/* Which CPUs rank `index` of `group` ranks takes among cpus[0..n) (in CPU order), restricted to the
   CPUs flagged in `near` when near is not NULL: an equal share of whole cores, in order. Writes
   the CPUs to out (room for n); returns how many, 0 when there are fewer cores than ranks. */
DDP__PRIVATE int ddp__bind_plan(const ddp__cpu_core* cpus, int n, const unsigned char* near, int index, int group,
                                int* out) {
    int cores[DDP__BIND_MAXCPU], ncores = 0, i, j, k, m = 0;
    for (i = 0; i < n; i++) { /* the distinct cores, in order of their first CPU */
        if (near && !near[cpus[i].cpu]) continue;
        for (j = 0; j < ncores && cores[j] != cpus[i].core; j++) {}
        if (j == ncores && ncores < DDP__BIND_MAXCPU) cores[ncores++] = cpus[i].core;
    }
    if (group < 1 || index < 0 || index >= group || ncores < group) return 0;
    k = ncores / group;
    for (i = 0; i < n; i++) {
        if (near && !near[cpus[i].cpu]) continue;
        for (j = index * k; j < index * k + k && cores[j] != cpus[i].core; j++) {}
        if (j < index * k + k) out[m++] = cpus[i].cpu;
    }
    return m;
}

/* What local rank `lr` of `lws` does, from every local rank's mask (masks[r]): DDP__BIND_SPLIT,
   with *index of *group the ranks that share its mask exactly; DDP__BIND_OWN when no other rank
   has a CPU of its mask (the launcher gave it these CPUs alone); DDP__BIND_OVERLAP when another
   rank's mask shares some CPUs without being the same. */
DDP__PRIVATE int ddp__bind_group(const unsigned long (*masks)[DDP__BIND_WORDS], int lws, int lr, int* index, int* group) {
    int r, w, overlap = 0;
    *index = 0, *group = 0;
    for (r = 0; r < lws; r++) {
        if (!memcmp(masks[r], masks[lr], sizeof masks[r])) {
            *index += r < lr;
            ++*group;
            continue;
        }
        for (w = 0; w < DDP__BIND_WORDS; w++) overlap |= (masks[r][w] & masks[lr][w]) != 0;
    }
    return overlap ? DDP__BIND_OVERLAP : *group > 1 ? DDP__BIND_SPLIT : DDP__BIND_OWN;
}

/* A mask as a CPU list with ranges ("0-3,8"), as sysfs and taskset -c write them. */
DDP__PRIVATE void ddp__mask_text(const unsigned long* mask, char* out, size_t cap) {
    const int bits = (int)(8 * sizeof mask[0]);
    size_t len = 0;
    int i, first = -1;
    out[0] = 0;
    for (i = 0; i <= DDP__BIND_WORDS * bits; i++) {
        int on = i < DDP__BIND_WORDS * bits && (mask[i / bits] >> (i % bits) & 1);
        if (on && first < 0) first = i;
        if (!on && first >= 0) {
            if (len + 24 < cap)
                len += (size_t)snprintf(out + len, cap - len, first == i - 1 ? "%s%d" : "%s%d-%d", len ? "," : "",
                                        first, i - 1);
            first = -1;
        }
    }
}

#if DDP__LINUX && defined(SYS_sched_setaffinity)
/* The CPUs near GPU `dev` (its PCI device's local_cpulist) into flags; 0 when unknown. */
DDP__PRIVATE int ddp__gpu_near(int dev, unsigned char* flags) {
    int n = 0;
#if DDP__CUDA
    char bus[32], path[96], text[4096];
    FILE* f;
    size_t i;
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    for (i = 0; bus[i]; i++) bus[i] = (char)tolower((unsigned char)bus[i]); /* sysfs names are lower case */
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpulist", bus);
    if ((f = fopen(path, "r")) == NULL) return 0;
    if (fgets(text, sizeof text, f)) n = ddp__cpulist(text, flags);
    fclose(f);
#else
    (void)dev, (void)flags;
#endif
    return n;
}
#endif

/* DDP_BIND, checked on every system: a value that means nothing is named also where nothing is bound. */
DDP__PRIVATE const char* ddp__bind_env(void) {
    const char* env = getenv("DDP_BIND");
    if (env && *env && strcmp(env, "core") && strcmp(env, "none") && strcmp(env, "0")) {
        ddp__log(DDP_LOG_WARN, "DDP_BIND=%s is not core or none; using core", env);
        return NULL;
    }
    return env;
}

DDP__PRIVATE ddp_status ddp__bind_cores(ddp_pg* pg) {
#if DDP__LINUX && defined(SYS_sched_setaffinity)
    unsigned long mask[DDP__BIND_WORDS], mine[DDP__BIND_WORDS], (*masks)[DDP__BIND_WORDS];
    const int bits = (int)(8 * sizeof mask[0]);
    ddp__cpu_core cpus[DDP__BIND_MAXCPU];
    unsigned char near[DDP__BIND_MAXCPU], other[DDP__BIND_MAXCPU];
    int chosen[DDP__BIND_MAXCPU], n = 0, m, i, r, lr = pg->env.local_rank, lws = pg->env.local_world_size;
    int index = 0, group = 0, use_near = 0, kind;
    char list[256] = "", given[256], key[384], host[256] = "?";
    const char *env = ddp__bind_env(), *plural = "";
    ddp_status s = DDP_OK;
    size_t got;
    DIR* dir;
    if (lws < 2 || lr < 0 || lr >= lws) return DDP_OK;
    memset(mask, 0, sizeof mask);
    if (syscall(SYS_sched_getaffinity, 0, sizeof mask, mask) < 0) memset(mask, 0xff, sizeof mask);
    /* every local rank's mask, also where this one binds nothing (its neighbours wait for it) */
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "ddp/cpus/%s/%d/%d", host, pg->env.node_rank, lr);
    DDP__TRY(ddp_store_set(pg->store, key, mask, sizeof mask));
    if (env && (!strcmp(env, "none") || !strcmp(env, "0"))) return DDP_OK;
    masks = (unsigned long(*)[DDP__BIND_WORDS])ddp__calloc((size_t)lws * sizeof *masks);
    if (!masks) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %d CPU masks failed", lws);
    for (r = 0; r < lws && s == DDP_OK; r++) {
        snprintf(key, sizeof key, "ddp/cpus/%s/%d/%d", host, pg->env.node_rank, r);
        s = ddp_store_get(pg->store, key, masks[r], sizeof masks[r], &got);
    }
    kind = s == DDP_OK ? ddp__bind_group((const unsigned long(*)[DDP__BIND_WORDS])masks, lws, lr, &index, &group) : 0;
    DDP_FREE(masks);
    if (s != DDP_OK) return s;
    ddp__mask_text(mask, given, sizeof given);
    if (strchr(given, ',') || strchr(given, '-')) plural = "s";
    if (kind != DDP__BIND_SPLIT) {
        ddp__log(DDP_LOG_INFO, "kept CPU%s %s as given: %s; only local ranks that share one set split it",
                 plural, given, kind == DDP__BIND_OWN
                 ? "no other rank of this machine has them (a launcher's binding: SLURM --cpu-bind, mpirun --bind-to)"
                 : "other ranks of this machine have some of them in a different set (taskset or numactl per rank)");
        return DDP_OK;
    }
    for (i = 0; i < DDP__BIND_WORDS * bits && i < DDP__BIND_MAXCPU; i++) {
        char path[96];
        FILE* f;
        int pkg = 0, core = -1;
        if (!(mask[i / bits] >> (i % bits) & 1)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", i);
        if ((f = fopen(path, "r")) != NULL) {
            if (fscanf(f, "%d", &core) != 1) core = -1;
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", i);
        if ((f = fopen(path, "r")) != NULL) {
            if (fscanf(f, "%d", &pkg) != 1) pkg = 0;
            fclose(f);
        }
        cpus[n].cpu = i;
        cpus[n++].core = core < 0 ? -1 - i : pkg * 65536 + core; /* unknown: the CPU is its own core */
    }
    /* On a GPU whose neighbours are known, when all local ranks share the mask and this rank can
       tell every local rank's GPU (each sees them all), the group is the local ranks whose GPUs
       have the same neighbours. */
    if (group == lws && pg->device.type == DDP_DEVICE_CUDA && ddp__cuda_device_count() >= lws &&
        ddp__gpu_near(pg->device.index, near) > 0) {
        int gpus = ddp__cuda_device_count();
        use_near = 1, index = 0, group = 0;
        for (r = 0; r < lws; r++) {
            if (r == lr || (ddp__gpu_near(r % gpus, other) > 0 && !memcmp(other, near, sizeof near))) {
                if (r < lr) index++;
                group++;
            }
        }
    }
    m = ddp__bind_plan(cpus, n, use_near ? near : NULL, index, group, chosen);
    if (m == 0 && use_near) { /* too few cores near the GPU: a share of the whole set, which all share */
        use_near = 0, index = lr, group = lws;
        m = ddp__bind_plan(cpus, n, NULL, index, group, chosen);
    }
    if (m == 0) {
        ddp__log(DDP_LOG_INFO, "not bound: %d local ranks share CPU%s %s, fewer cores than ranks", group,
                 plural, given);
        return DDP_OK;
    }
    memset(mine, 0, sizeof mine);
    for (i = 0; i < m; i++) {
        size_t len = strlen(list);
        mine[chosen[i] / bits] |= 1ul << (chosen[i] % bits);
        if (len < sizeof list - 16) snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", chosen[i]);
    }
    if ((dir = opendir("/proc/self/task")) != NULL) {
        struct dirent* e;
        while ((e = readdir(dir)) != NULL)
            if (e->d_name[0] != '.') syscall(SYS_sched_setaffinity, atoi(e->d_name), sizeof mine, mine);
        closedir(dir);
    }
    syscall(SYS_sched_setaffinity, 0, sizeof mine, mine);
    /* next to a GPU, the shares are of the CPUs near it, which the ranks whose GPUs share those
       neighbours split: the given set is only where they come from */
    if (use_near)
        ddp__log(DDP_LOG_INFO, "bound to CPU%s %s, share %d of %d of the CPUs next to this rank's GPU, which the %d "
                 "local ranks whose GPUs are there split (from CPU%s %s; DDP_BIND=none leaves placement to the system)",
                 m == 1 ? "" : "s", list, index + 1, group, group, plural, given);
    else
        ddp__log(DDP_LOG_INFO, "bound to CPU%s %s, share %d of %d of CPU%s %s (DDP_BIND=none leaves placement to the "
                 "system)", m == 1 ? "" : "s", list, index + 1, group, plural, given);
    return DDP_OK;
#else
    (void)pg;
    (void)ddp__bind_env();
    return DDP_OK;
#endif
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>files: file formats: CSV rows, the safetensors header, atomic writes                         */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* Which tensors take no weight decay, short enough for a metadata value: how many, and a hash of
   their names. */
DDP__PRIVATE const char* ddp__no_decay_sig(const ddp_model* m, char* out, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    int i, count = 0;
    for (i = 0; i < m->nparams; i++)
        if (m->params[i]->no_decay) {
            const char* c = m->params[i]->name;
            count++;
            for (; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
            h = (h ^ 0xff) * 0x100000001b3ull; /* the end of a name */
        }
    snprintf(out, n, "%d tensors, %016llx", count, (unsigned long long)h);
    return out;
}

/* ---- reading a data file (>>data) ---------------------------------------------------------------- */

/* What a file that is not a regular one is, for "it is not a regular file (...)". */
DDP__PRIVATE const char* ddp__file_kind(mode_t m) {
    return S_ISDIR(m) ? "a folder" : S_ISFIFO(m) ? "a named pipe (FIFO)" : S_ISSOCK(m) ? "a socket"
         : (S_ISCHR(m) || S_ISBLK(m)) ? "a device" : "something else";
}

/* Read a whole file into a NUL-terminated buffer. The file is opened non-blocking and checked
   before a byte is read: opening a named pipe for reading would otherwise wait for a writer that
   never comes, with no deadline. */
DDP__PRIVATE ddp_status ddp__read_file(const char* path, size_t limit, char** out, size_t* size) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    FILE* f;
    long len;
    char* buf;
    struct stat st;
    *out = NULL;
    if (fd < 0) return ddp__fail(DDP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ddp__fail(DDP_ERR_IO, "cannot read %s: it is not a regular file but %s", path,
                         ddp__file_kind(st.st_mode));
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (!(f = fdopen(fd, "rb"))) {
        int e = errno;
        close(fd);
        return ddp__fail(DDP_ERR_IO, "cannot read %s: %s", path, strerror(e));
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

/* Read a CSV file: one header row, then one row per sample whose last column is an integer label
   >= 0. DDP_ERR_IO when it cannot be read, DDP_ERR_DATA_FORMAT (naming line and column) when a
   row is malformed. *out is left empty on error. */
DDP__PRIVATE ddp_status ddp__dataset_load_csv(const char* path, ddp_dataset* out) {
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
    ddp__log(DDP_LOG_INFO, "loaded %s: %d samples, %d features, %d classes", path, d.n, d.nfeatures, d.nclasses);
    return DDP_OK;
}

/* ---- building a snapshot file in memory (>>snapshot) ------------------------------------------------ */

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
    if (src) memcpy(b->p + b->n, src, n);
    b->n += n;
}
DDP__PRIVATE void ddp__putf(ddp__bytes* b, const char* fmt, ...) DDP__PRINTF(2, 3);
DDP__PRIVATE void ddp__putf(ddp__bytes* b, const char* fmt, ...) {
    char tmp[256];
    int n;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof tmp) { b->oom = 1; return; } /* every piece we write is short */
    ddp__put(b, tmp, (size_t)n);
}

/* ---- writing a snapshot file atomically (>>snapshot) ------------------------------------------------ */

/* This host's name as the temporary files carry it: up to its first dot, no slash. */
DDP__PRIVATE void ddp__tmp_host(char* host, size_t n) {
    snprintf(host, n, "host");
    gethostname(host, n - 1);
    host[n - 1] = 0;
    host[strcspn(host, "/.")] = 0;
}

/* Remove the temporary files that writers on this host killed mid-write left beside `path`
   (`path`.tmp.<host>.<pid> whose pid no longer runs). */
DDP__PRIVATE void ddp__remove_stale_tmp(const char* path) {
    char dir[1100], prefix[1400], full[2200], host[64];
    const char* slash = strrchr(path, '/');
    DIR* d;
    struct dirent* e;
    if (strlen(path) > 1000) return; /* no snapshot is saved there either */
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path + (slash == path)), path);
    else snprintf(dir, sizeof dir, ".");
    ddp__tmp_host(host, sizeof host);
    snprintf(prefix, sizeof prefix, "%s.tmp.%s.", slash ? slash + 1 : path, host);
    if (!(d = opendir(dir))) return;
    while ((e = readdir(d)) != NULL) {
        const char* pid = e->d_name + strlen(prefix);
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || !*pid || strspn(pid, "0123456789") != strlen(pid)) continue;
        if (kill((pid_t)atol(pid), 0) == 0 || errno != ESRCH) continue; /* its writer still runs */
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        unlink(full);
    }
    closedir(d);
}

/* Put a file's data on the disk. On Apple systems fsync only hands it to the drive, whose cache can
   still lose it when the power fails; F_FULLFSYNC asks the drive to write it out (Apple's fsync(2)
   says so). A file system that refuses F_FULLFSYNC (some network ones) still gets the fsync. */
DDP__PRIVATE int ddp__sync_file(int fd) {
#if defined(F_FULLFSYNC)
    if (fcntl(fd, F_FULLFSYNC) == 0) return 0;
#endif
    return fsync(fd);
}

/* The file a save must replace: `path` itself, or where its symbolic links lead (a link into a
   shared folder stays a link, and the shared file gets the snapshot, as cp and editors do). NULL
   with errno ELOOP after 16 links, ENAMETOOLONG past n bytes. */
DDP__PRIVATE const char* ddp__through_links(const char* path, char* buf, size_t n) {
    char link[1100], next[2200];
    struct stat st;
    int hops;
    for (hops = 0; lstat(path, &st) == 0 && S_ISLNK(st.st_mode); hops++) {
        ssize_t k;
        const char* slash;
        if (hops == 16 || (k = readlink(path, link, sizeof link - 1)) < 0) {
            if (hops == 16) errno = ELOOP;
            return NULL;
        }
        link[k] = 0;
        slash = strrchr(path, '/');
        if (link[0] == '/' || !slash) snprintf(next, sizeof next, "%s", link); /* relative: to the link's folder */
        else snprintf(next, sizeof next, "%.*s/%s", (int)(slash - path), path, link);
        if (strlen(next) >= n) {
            errno = ENAMETOOLONG;
            return NULL;
        }
        memcpy(buf, next, strlen(next) + 1);
        path = buf;
    }
    return path;
}

/* Write `n` bytes to `path` through a temporary file, fsync, then rename over `path`. The
   temporary file's name carries the host and pid, so two writers of one path (every rank saving,
   by mistake) never write into the same file: the last rename wins and the file is always whole.
   Temporary files left by writers killed mid-write are removed after the next save, and when a
   job looks for its snapshot (ddp_snapshot_exists, ddp_snapshot_load). */
DDP__PRIVATE ddp_status ddp__write_atomic(const char* path, const unsigned char* data, size_t n) {
    char tmp[1400], host[64];
    FILE* f;
    int ok;
    const char* asked = path;
    char real[1100];
    if (strlen(path) > 1000) return ddp__fail(DDP_ERR_IO, "snapshot path is too long");
    if (!(path = ddp__through_links(path, real, sizeof real)) || strlen(path) > 1000)
        return ddp__fail(DDP_ERR_IO, "cannot follow the symbolic links of %s: %s", asked,
                         path ? strerror(ENAMETOOLONG) : strerror(errno));
    ddp__tmp_host(host, sizeof host);
    snprintf(tmp, sizeof tmp, "%s.tmp.%s.%ld", path, host, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f) return ddp__fail(DDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    ok = fwrite(data, 1, n, f) == n;
    ok = fflush(f) == 0 && ok;
    ok = ddp__sync_file(fileno(f)) == 0 && ok; /* on disk before the rename makes it visible */
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        ddp_status r;
        unlink(tmp);
        r = ddp__fail(DDP_ERR_IO, "writing %s failed: %s (the previous file, if any, is intact)", path, strerror(e));
        if (e == ENOSPC
#ifdef EDQUOT
            || e == EDQUOT
#endif
        )
            ddp__err_fix = "free space on that file system (df -h shows how full it is; a quota also counts), or "
                           "save the snapshot to another one";
        return r;
    }
    ddp__remove_stale_tmp(path);
    return DDP_OK;
}

/* ---- the safetensors header's JSON (>>snapshot) ------------------------------------------------------ */

typedef struct ddp__js { const unsigned char *p, *end, *base; const char* err; } ddp__js;

DDP__PRIVATE void ddp__js_ws(ddp__js* j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')) j->p++;
}
DDP__PRIVATE int ddp__js_char(ddp__js* j, char c) {
    ddp__js_ws(j);
    if (j->p < j->end && *j->p == (unsigned char)c) { j->p++; return 1; }
    return 0;
}
/* A string without escapes (names and metadata never need them) into out[n]. */
DDP__PRIVATE int ddp__js_string(ddp__js* j, char* out, size_t n, const unsigned char** start) {
    size_t k = 0;
    if (!ddp__js_char(j, '"')) { j->err = "expected a string"; return 0; }
    if (start) *start = j->p;
    for (; j->p < j->end && *j->p != '"'; j->p++) {
        if (*j->p == '\\' || *j->p < 0x20) { j->err = "a string holds an escape or a control character"; return 0; }
        if (k + 1 >= n) { j->err = "a string is too long"; return 0; }
        out[k++] = (char)*j->p;
    }
    if (j->p >= j->end) { j->err = "a string is not closed"; return 0; }
    j->p++;
    out[k] = 0;
    return 1;
}
DDP__PRIVATE int ddp__js_uint(ddp__js* j, uint64_t* v) {
    int digits = 0;
    ddp__js_ws(j);
    *v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (*v > ((uint64_t)1 << 53) / 10) { j->err = "a number is too large"; return 0; }
        *v = *v * 10 + (uint64_t)(*j->p++ - '0');
        digits++;
    }
    if (!digits) { j->err = "expected a whole number"; return 0; }
    return 1;
}
/* "[a,b,...]" of at most `max` whole numbers. */
DDP__PRIVATE int ddp__js_uints(ddp__js* j, uint64_t* v, int max, int* n) {
    *n = 0;
    if (!ddp__js_char(j, '[')) { j->err = "expected '['"; return 0; }
    if (ddp__js_char(j, ']')) return 1;
    do {
        if (*n >= max) { j->err = "a list has too many entries"; return 0; }
        if (!ddp__js_uint(j, &v[(*n)++])) return 0;
    } while (ddp__js_char(j, ','));
    if (!ddp__js_char(j, ']')) { j->err = "expected ']'"; return 0; }
    return 1;
}

DDP__PRIVATE int ddp__js_metadata(ddp__js* j, ddp__st* st) {
    if (!ddp__js_char(j, '{')) { j->err = "__metadata__ is not an object"; return 0; }
    if (ddp__js_char(j, '}')) return 1;
    do {
        ddp__st_meta* m;
        const unsigned char* vstart;
        int k;
        if (st->nmeta >= 32) { j->err = "__metadata__ has too many entries"; return 0; }
        m = &st->meta[st->nmeta];
        if (!ddp__js_string(j, m->key, sizeof m->key, NULL)) return 0;
        for (k = 0; k < st->nmeta; k++)
            if (!strcmp(st->meta[k].key, m->key)) { j->err = "__metadata__ repeats a key"; return 0; }
        if (!ddp__js_char(j, ':')) { j->err = "expected ':'"; return 0; }
        if (!ddp__js_string(j, m->val, sizeof m->val, &vstart)) return 0;
        if (!strcmp(m->key, "checksum")) st->checksum_at = (size_t)(vstart - j->base);
        st->nmeta++;
    } while (ddp__js_char(j, ','));
    if (!ddp__js_char(j, '}')) { j->err = "expected '}' after __metadata__"; return 0; }
    return 1;
}

DDP__PRIVATE int ddp__js_tensor(ddp__js* j, ddp__st_tensor* t) {
    int seen = 0, n;
    char key[16];
    uint64_t off[2];
    if (!ddp__js_char(j, '{')) { j->err = "a tensor entry is not an object"; return 0; }
    do {
        if (!ddp__js_string(j, key, sizeof key, NULL)) return 0;
        if (!ddp__js_char(j, ':')) { j->err = "expected ':'"; return 0; }
        if (!strcmp(key, "dtype") && !(seen & 1)) {
            if (!ddp__js_string(j, t->dtype, sizeof t->dtype, NULL)) return 0;
            seen |= 1;
        } else if (!strcmp(key, "shape") && !(seen & 2)) {
            if (!ddp__js_uints(j, t->shape, 4, &t->ndim)) return 0;
            seen |= 2;
        } else if (!strcmp(key, "data_offsets") && !(seen & 4)) {
            if (!ddp__js_uints(j, off, 2, &n)) return 0;
            if (n != 2) { j->err = "data_offsets needs two numbers"; return 0; }
            t->begin = off[0];
            t->end = off[1];
            seen |= 4;
        } else {
            j->err = "a tensor entry has an unknown or repeated key";
            return 0;
        }
    } while (ddp__js_char(j, ','));
    if (!ddp__js_char(j, '}')) { j->err = "expected '}' after a tensor entry"; return 0; }
    if (seen != 7) { j->err = "a tensor entry lacks dtype, shape or data_offsets"; return 0; }
    return 1;
}

DDP__PRIVATE int ddp__st_by_begin(const void* a, const void* b) {
    const ddp__st_tensor *x = (const ddp__st_tensor*)a, *y = (const ddp__st_tensor*)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end; /* an empty tensor first, whatever the JSON order */
}

/* Parse and check a whole safetensors file held in buf[size]: the length, the JSON, and that the
   tensors tile the data section exactly. Knows nothing of models. DDP_ERR_CHECKPOINT naming the
   first problem (prefixed with `what`, the file's name). */
DDP__PRIVATE ddp_status ddp__st_parse(const unsigned char* buf, size_t size, const char* what, ddp__st* st) {
    ddp__js j;
    uint64_t hlen, data_len, k;
    int i, d, seen_meta = 0;
    memset(st, 0, sizeof *st);
    if (size < 8) return ddp__fail(DDP_ERR_CHECKPOINT, "%s is truncated: %zu bytes, not even the 8-byte length", what, size);
    hlen = ddp__le64(buf);
    if (hlen < 2 || hlen > size - 8)
        return ddp__fail(DDP_ERR_CHECKPOINT, "%s is truncated or not a snapshot: its header length %llu does not fit "
                         "in the file's %zu bytes", what, (unsigned long long)hlen, size);
    j.base = buf;
    j.p = buf + 8;
    j.end = buf + 8 + hlen;
    j.err = NULL;
    if (!ddp__js_char(&j, '{')) j.err = "the header is not a JSON object";
    else if (!ddp__js_char(&j, '}')) {
        do {
            char name[96];
            if (!ddp__js_string(&j, name, sizeof name, NULL)) break;
            if (!ddp__js_char(&j, ':')) { j.err = "expected ':'"; break; }
            if (!strcmp(name, "__metadata__")) {
                if (seen_meta) { j.err = "two __metadata__"; break; }
                seen_meta = 1;
                if (!ddp__js_metadata(&j, st)) break;
                continue;
            }
            if (st->nt >= DDP__ST_MAX_TENSORS) { j.err = "too many tensors"; break; }
            for (i = 0; i < st->nt; i++)
                if (!strcmp(st->t[i].name, name)) { j.err = "a tensor name appears twice"; break; }
            if (j.err) break;
            memcpy(st->t[st->nt].name, name, sizeof name);
            if (!ddp__js_tensor(&j, &st->t[st->nt])) break;
            st->nt++;
        } while (ddp__js_char(&j, ','));
        if (!j.err && !ddp__js_char(&j, '}')) j.err = "expected '}' at the end of the header";
    }
    if (!j.err) {
        for (; j.p < j.end; j.p++)
            if (*j.p != ' ') { j.err = "bytes other than spaces follow the header's JSON"; break; }
    }
    if (j.err)
        return ddp__fail(DDP_ERR_CHECKPOINT, "%s: the header is damaged at byte %ld: %s", what,
                         (long)(j.p - buf), j.err);
    st->data_off = (size_t)(8 + hlen);
    data_len = size - st->data_off;
    /* every tensor F32, its byte length its shape's, and together they cover the data exactly */
    for (i = 0; i < st->nt; i++) {
        ddp__st_tensor* t = &st->t[i];
        uint64_t elems = 1;
        if (strcmp(t->dtype, "F32") != 0)
            return ddp__fail(DDP_ERR_CHECKPOINT, "%s: tensor %s has dtype %s; ddp.h snapshots hold F32 only", what,
                             t->name, t->dtype);
        for (d = 0; d < t->ndim; d++) {
            if (t->shape[d] > ((uint64_t)1 << 40) || (elems && t->shape[d] > ((uint64_t)1 << 60) / elems))
                return ddp__fail(DDP_ERR_CHECKPOINT, "%s: tensor %s has an impossible shape", what, t->name);
            elems *= t->shape[d];
        }
        if (t->end < t->begin || t->end - t->begin != elems * 4)
            return ddp__fail(DDP_ERR_CHECKPOINT, "%s: tensor %s's data_offsets [%llu, %llu] do not hold its shape's "
                             "%llu floats", what, t->name, (unsigned long long)t->begin,
                             (unsigned long long)t->end, (unsigned long long)elems);
    }
    qsort(st->t, (size_t)st->nt, sizeof *st->t, ddp__st_by_begin); /* the loader looks tensors up by name */
    for (i = 0, k = 0; i < st->nt; k = st->t[i].end, i++)
        if (st->t[i].begin != k)
            return ddp__fail(DDP_ERR_CHECKPOINT, "%s: tensor %s starts at byte %llu of the data, not %llu: the "
                             "tensors overlap or leave a gap", what, st->t[i].name,
                             (unsigned long long)st->t[i].begin, (unsigned long long)k);
    if (k != data_len)
        return ddp__fail(DDP_ERR_CHECKPOINT, "%s is %s: its tensors need %llu bytes of data, the file has %llu", what,
                         k > data_len ? "truncated" : "damaged (it has extra bytes)", (unsigned long long)k,
                         (unsigned long long)data_len);
    return DDP_OK;
}

/* ---- reading a snapshot's metadata (>>snapshot checks it against the struct) ------------------------ */
DDP__PRIVATE const char* ddp__st_get(const ddp__st* st, const char* key) {
    int i;
    for (i = 0; i < st->nmeta; i++)
        if (!strcmp(st->meta[i].key, key)) return st->meta[i].val;
    return NULL;
}
/* A metadata value as a whole number in [lo, hi]; 0 (after setting the error) if absent or bad. */
DDP__PRIVATE int ddp__st_num(const ddp__st* st, const char* what, const char* key, long long lo, long long hi,
                             long long* out) {
    const char* v = ddp__st_get(st, key);
    char* end;
    long long x;
    if (!v) { ddp__fail(DDP_ERR_CHECKPOINT, "%s: the metadata lacks \"%s\"", what, key); return 0; }
    errno = 0;
    x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        ddp__fail(DDP_ERR_CHECKPOINT, "%s: metadata \"%s\" is \"%s\", not a number from %lld to %lld", what, key, v, lo,
                  hi);
        return 0;
    }
    *out = x;
    return 1;
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>slurm: SLURM's compressed node lists (>>launch)                                              */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* ---- SLURM node lists ----------------------------------------------------------------------------- */
/* A node list names hosts compactly: "a,b", "node[1-4]", "gpu[07,09-12],cpu3", "rack1-node[3-5]".
   The first host is the first name with each [...] replaced by its first number, zero padding
   kept (node[001-004] -> node001). */

DDP__PRIVATE ddp_status ddp__slurm_bad(const char* list, const char* why) {
    return ddp__fail(DDP_ERR_ENV, "the SLURM node list \"%s\" is malformed (%s): expected forms such as "
                     "\"node1,node2\" or \"node[1-4]\"; set MASTER_ADDR to rank 0's host instead", list, why);
}

/* Check one bracket's contents "07,09-12" from p (just after '['); on success *first and *len give the
   first number and the return value points just after ']'. NULL if malformed. */
DDP__PRIVATE const char* ddp__slurm_bracket(const char* p, const char** first, size_t* len) {
    *first = p;
    *len = 0;
    for (;;) {
        const char* a = p;
        long lo, hi;
        while (isdigit((unsigned char)*p)) p++;
        if (p == a) return NULL; /* "[]", "[a-b]", "[1,]" */
        if (*len == 0) *len = (size_t)(p - a);
        lo = strtol(a, NULL, 10);
        if (*p == '-') {
            const char* b = ++p;
            while (isdigit((unsigned char)*p)) p++;
            if (p == b) return NULL;
            hi = strtol(b, NULL, 10);
            if (hi < lo) return NULL; /* "[4-1]" */
        }
        if (*p == ']') return p + 1;
        if (*p != ',') return NULL; /* unclosed, or a stray character */
        p++;
    }
}

/* The first host of a SLURM node list ("a,b", "node[1-4]", "gpu[01-02,07],cpu3") into out.
   DDP_ERR_ENV for a malformed list. */
DDP__PRIVATE ddp_status ddp__slurm_first_host(const char* nodelist, char* out, size_t outsize) {
    const char* p = nodelist ? nodelist : "";
    size_t n = 0;
    if (!out || outsize == 0)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp__slurm_first_host: out is NULL or outsize is 0");
    out[0] = 0;
    while (*p == ' ') p++;
    /* The first host ends at a ',' or ' ' outside brackets (inside, ',' separates numbers). */
    while (*p && *p != ',' && *p != ' ') {
        const char* src = p;
        size_t len = 1;
        if (*p == '[') {
            if (n == 0) return ddp__slurm_bad(p, "a host name must come before \"[\"");
            p = ddp__slurm_bracket(p + 1, &src, &len);
            if (!p) return ddp__slurm_bad(nodelist, "a \"[...]\" must hold numbers and ranges like 1-4, "
                                          "separated by commas, and be closed");
        } else if (*p == ']') {
            return ddp__slurm_bad(nodelist, "a \"]\" without its \"[\"");
        } else {
            p++;
        }
        if (n + len >= outsize) return ddp__fail(DDP_ERR_ENV, "the first host of \"%s\" is longer than %d "
                                                 "characters", nodelist, (int)outsize - 1);
        memcpy(out + n, src, len);
        n += len;
        out[n] = 0;
    }
    if (n == 0) return ddp__slurm_bad(nodelist ? nodelist : "(null)", "it names no host");
    return DDP_OK;
}

#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>gpus: which GPU is whose: ranks that share one, the nccl backend's check                     */
/* ============================================================================================== */
#if DDP__IMPLEMENT
/* Whether two ranks of this machine share a GPU: each rank publishes the PCI bus id of its GPU
   (cuda:index in its own numbering) in the store and reads every local rank's, since
   CUDA_VISIBLE_DEVICES may number the GPUs differently for each rank. pair[0] is -1 when all
   differ, else pair[0] < pair[1] are the first two local ranks found on one GPU. A bus id that
   cannot be read counts as shared. */
DDP__PRIVATE ddp_status ddp__gpu_sharer(ddp_pg* pg, int index, char mine[64], int pair[2]) {
    char key[384], host[256] = "?", (*ids)[64];
    int r, q, lws = pg->env.local_world_size;
    size_t n;
    ddp_status s = DDP_OK;
    mine[0] = 0;
    pair[0] = pair[1] = -1;
    gethostname(host, sizeof host - 1);
#if DDP__CUDA
    if (cudaDeviceGetPCIBusId(mine, 64, index) != cudaSuccess) {
        (void)cudaGetLastError();
        mine[0] = 0;
    }
#else
    (void)index;
#endif
    snprintf(key, sizeof key, "ddp/gpu/%s/%d/%d", host, pg->env.node_rank, pg->env.local_rank);
    DDP__TRY(ddp_store_set(pg->store, key, mine, strlen(mine) + 1));
    ids = (char(*)[64])ddp__calloc((size_t)lws * sizeof *ids);
    if (!ids) return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "allocating %d GPU bus ids failed", lws);
    for (r = 0; r < lws && s == DDP_OK; r++) { /* every local rank's id, this one's too, read once */
        snprintf(key, sizeof key, "ddp/gpu/%s/%d/%d", host, pg->env.node_rank, r);
        s = ddp_store_get(pg->store, key, ids[r], sizeof ids[r] - 1, &n);
    }
    /* every pair, so that all ranks of this machine reach the same verdict */
    for (r = 0; r < lws && s == DDP_OK && pair[0] == -1; r++)
        for (q = r + 1; q < lws; q++)
            if (!ids[r][0] || !ids[q][0] || !strcmp(ids[r], ids[q])) {
                pair[0] = r, pair[1] = q;
                break;
            }
    DDP_FREE(ids);
    if (s != DDP_OK) return s;
    /* Nobody acts on the verdict before every local rank has read the ids: rank 0 failing at
       once would take the store with it while a neighbour still reads, and that neighbour would
       report a lost store instead of the shared GPU. */
    snprintf(key, sizeof key, "gpu/%s/%d", host, pg->env.node_rank);
    return ddp__store_barrier(pg->store, key, lws);
}

/* AUTO on a machine that shows this rank fewer GPUs than it has local ranks: each rank takes GPU
   want.index if every local rank's GPU is a different one (told by its PCI bus id, published in
   the store), as when CUDA_VISIBLE_DEVICES gives each rank its own; else every rank uses the CPU. */
DDP__PRIVATE ddp_status ddp__own_gpu(ddp_pg* pg, ddp_device want, ddp_device* out) {
    char mine[64];
    int pair[2];
    want.type = DDP_DEVICE_CUDA;
    DDP__TRY(ddp__gpu_sharer(pg, want.index, mine, pair));
    if (pair[0] != -1) {
        ddp__log(DDP_LOG_INFO, "%d GPU%s for %d local ranks, shared: every rank uses the CPU (NCCL needs a GPU of its "
                "own for each rank)", ddp__cuda_device_count(), ddp__cuda_device_count() == 1 ? "" : "s",
                pg->env.local_world_size);
        want.type = DDP_DEVICE_CPU, want.index = 0;
    } else {
        ddp__log(DDP_LOG_INFO, "each local rank sees a GPU of its own (this one: %s, cuda:%d here)", mine, want.index);
    }
    return ddp_device_resolve(want, out);
}

/* The nccl backend on a GPU named by the program: two ranks on one GPU are refused here, by name,
   with the way out, rather than by NCCL's "Duplicate GPU detected" at the first collective setup.
   Every rank of this machine sees the same pairs, so every one of them stops with the same words. */
DDP__PRIVATE ddp_status ddp__nccl_gpu_own(ddp_pg* pg) {
    char mine[64];
    int pair[2], gpus = ddp__cuda_device_count();
    if (pg->env.local_world_size < 2) return DDP_OK;
    DDP__TRY(ddp__gpu_sharer(pg, pg->device.index, mine, pair));
    if (pair[0] == -1) return DDP_OK;
    return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "local ranks %d and %d of this machine share one GPU, and the nccl "
                     "backend needs a GPU of its own for each rank (this rank: cuda:%d, bus id %s; this process sees "
                     "%d GPU%s for %d ranks here). Start at most %d rank%s per machine (ddprun --nproc, torchrun "
                     "--nproc_per_node, srun --ntasks-per-node), or use the cpu backend (DDP_BACKEND=cpu), which "
                     "reduces GPU buffers through host memory", pair[0], pair[1], pg->device.index,
                     mine[0] ? mine : "unknown", gpus, gpus == 1 ? "" : "s", pg->env.local_world_size,
                     gpus > 0 ? gpus : 1, gpus == 1 ? "" : "s");
}

/* The backend desc.backend or DDP_BACKEND names (DEFAULT when neither does). ddp_init asks before
   reading the environment, because the mpi backend takes the placement from MPI itself. */
#endif /* DDP__IMPLEMENT */

/* ============================================================================================== */
/* >>spawn: spawning ranks and supervising them                                  (chapters 3, 6)  */
/* ============================================================================================== */
#if DDP__DECLARE

/* The function each spawned rank runs; its return value is the process's exit status. */
typedef int (*ddp_spawn_fn)(int rank, void* arg);
/* Run fn(rank, arg) in nproc new processes on this machine (torch.multiprocessing.spawn), each
   with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT
   a fresh DDP_JOB_TOKEN and GROUP_RANK=0 set, each in its own session. Returns when all have
   ended: DDP_OK if every one returned 0, else DDP_ERR_LAUNCH naming the first rank that failed,
   after stopping the others (SIGTERM, then SIGKILL after DDP_KILL_GRACE_S, default 5 s); a
   guardian process stops them the same way if this process is killed, even by SIGKILL. Call
   it early, before starting threads or any CUDA work: it forks, and a forked child can use
   neither its parent's other threads nor its GPU context. */
DDP_API ddp_status ddp_spawn(int nproc, ddp_spawn_fn fn, void* arg);
#endif /* DDP__DECLARE */
#if DDP__IMPLEMENT
/* ---- supervising child processes (shared by ddp_spawn and ddprun) ------------------------------- */

/* How long a stopped rank gets to exit after SIGTERM before SIGKILL: DDP_KILL_GRACE_S, else 5 s
   (torchrun waits 30 s; our ranks have nothing large to save). */
DDP__PRIVATE double ddp__ln_grace(void) {
    const char* v = getenv("DDP_KILL_GRACE_S");
    char* end;
    double g;
    if (!v || !*v) return 5.0;
    g = strtod(v, &end);
    if (*end != 0 || !(g >= 0) || g > 86400) {
        ddp__log(DDP_LOG_WARN, "DDP_KILL_GRACE_S=%s is not a number of seconds; using 5", v);
        return 5.0;
    }
    return g;
}

DDP__PRIVATE const char* ddp__ln_signame(int sig) {
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    default: return "unknown";
    }
}

/* "exited with status 3", "was killed by signal 9 (SIGKILL)": how one rank ended. */
DDP__PRIVATE void ddp__ln_how(int status, char* buf, size_t n) {
    if (status == -1) snprintf(buf, n, "ended, but its exit status was lost (is SIGCHLD ignored?)");
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status), ddp__ln_signame(WTERMSIG(status)));
    else snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
}

/* The ranks a launcher watches. Each rank leads its own session and process group (its pid is the
   group's id), so stopping a rank also stops what it started: `sh -c 'prog'` leaves no orphaned
   prog. A session of its own also means no terminal can stop a rank for reading from it. */
typedef struct ddp__ln_job {
    int n;           /* ranks */
    pid_t* pid;      /* 0 once reaped (so no signal can reach a recycled pid) */
    int* status;     /* waitpid's status for each reaped rank; -1 if lost */
    int alive;       /* ranks not reaped yet */
    int first_fail;  /* the rank that failed first, -1 while none has */
    time_t fail_time; /* when it did */
    int fail_after_signal; /* it failed after we passed on a SIGINT/SIGTERM: the signal is the cause */
    double grace;    /* seconds between SIGTERM and SIGKILL */
    double kill_at;  /* when stopping: when survivors get SIGKILL; 0 while not stopping */
    int killed;      /* SIGKILL sent */
    int guard_fd;    /* our end of the guardian's socket, -1 without one */
    pid_t guard_pid;
} ddp__ln_job;

/* What the signal handler needs, in globals because a handler gets no argument. Only one launcher
   runs in a process at a time. */
static pid_t* volatile ddp__ln_fwd_pid;
static volatile int ddp__ln_fwd_n;
DDP__PRIVATE volatile sig_atomic_t ddp__ln_got_signal; /* the SIGINT or SIGTERM we received, 0 if none */

/* Signal a rank's process group; a rank that has not reached setsid() yet has no group, so then
   the rank itself. Safe in a signal handler (kill is async-signal-safe). */
DDP__PRIVATE void ddp__ln_kill(pid_t pid, int sig) {
    if (kill(-pid, sig) != 0 && errno == ESRCH) kill(pid, sig);
}

/* Ctrl-C reaches only the launcher (the ranks sit in their own sessions), so pass it on. */
DDP__PRIVATE void ddp__ln_on_signal(int sig) {
    int i, saved = errno;
    ddp__ln_got_signal = sig;
    for (i = 0; i < ddp__ln_fwd_n; i++)
        if (ddp__ln_fwd_pid[i] > 0) ddp__ln_kill(ddp__ln_fwd_pid[i], sig);
    errno = saved;
}

typedef struct ddp__ln_signals { struct sigaction old_int, old_term; sigset_t old_mask; } ddp__ln_signals;

/* Block SIGINT/SIGTERM while forking: a child must never run our handler (it would signal its
   siblings), and a signal arriving mid-start is forwarded once every pid is known. */
DDP__PRIVATE void ddp__ln_signals_begin(ddp__ln_job* j, ddp__ln_signals* sv) {
    struct sigaction sa;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &sv->old_mask);
    ddp__ln_got_signal = 0;
    ddp__ln_fwd_pid = j->pid;
    ddp__ln_fwd_n = j->n;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ddp__ln_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &sv->old_int);
    sigaction(SIGTERM, &sa, &sv->old_term);
}
/* After the forks: let the (possibly pending) signals in. */
DDP__PRIVATE void ddp__ln_signals_unblock(const ddp__ln_signals* sv) { sigprocmask(SIG_SETMASK, &sv->old_mask, NULL); }
/* Put back the caller's handlers and mask (in the parent when done; in each child at once). */
DDP__PRIVATE void ddp__ln_signals_end(const ddp__ln_signals* sv) {
    ddp__ln_fwd_n = 0;
    ddp__ln_fwd_pid = NULL;
    sigaction(SIGINT, &sv->old_int, NULL);
    sigaction(SIGTERM, &sv->old_term, NULL);
    sigprocmask(SIG_SETMASK, &sv->old_mask, NULL);
}

static int ddp__ln_guard_fd = -1; /* the running job's guardian socket: a rank must not hold it */

/* First steps of every child: default signals, own session, no copy of the guardian's socket
   (its end of file is what tells the guardian that the launcher died), and (Linux) SIGTERM at
   once when the launcher dies; the guardian below covers what that signal cannot. */
DDP__PRIVATE void ddp__ln_child_setup(const ddp__ln_signals* sv, pid_t launcher) {
    ddp__ln_signals_end(sv);
    if (ddp__ln_guard_fd >= 0) close(ddp__ln_guard_fd);
    setsid();
#if DDP__LINUX
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher) _exit(1); /* the launcher died before prctl took effect */
#else
    (void)launcher;
#endif
}

/* ---- the guardian: no rank outlives its launcher --------------------------------------------------- */
/* A launcher killed by SIGKILL can pass nothing on. Linux's PR_SET_PDEATHSIG then sends each rank
   SIGTERM, but a stopped rank (SIGSTOP, ^Z, a debugger) never acts on it, what a rank started
   gets nothing, and other systems have no such signal. So each job has a guardian: a small process
   in a session of its own (a kill of the launcher's process group spares it), told every rank's
   pid over a socket. When the launcher dies, however it dies, the socket reaches end of file and
   the guardian stops every rank's process group as the launcher would have: SIGTERM and SIGCONT,
   then SIGKILL after the grace period. A launcher that ends normally says so first. Messages are
   8 bytes: an operation ('A' add a pid, 'D' drop a reaped one, 'E' end quietly) and the pid. The
   guardian only makes system calls that are safe after fork in a threaded process. */
DDP__PRIVATE void ddp__ln_guard_main(int fd, double grace) {
    pid_t pids[DDP__MAX_SPAWN];
    int n = 0, i, alive;
    unsigned char m[8];
    double end;
    sigset_t none;
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) dup2(nul, 0), dup2(nul, 1), dup2(nul, 2); /* a pipe reading our launcher's output ends with it */
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    for (;;) {
        ssize_t k = recv(fd, m, 8, MSG_WAITALL);
        pid_t p;
        if (k < 0 && errno == EINTR) continue;
        if (k != 8) break; /* end of file: the launcher is gone */
        p = (pid_t)ddp__le32(m + 4);
        if (m[0] == 'E') _exit(0);
        if (m[0] == 'A' && n < DDP__MAX_SPAWN) pids[n++] = p;
        for (i = 0; m[0] == 'D' && i < n; i++)
            if (pids[i] == p) pids[i--] = pids[--n];
    }
    for (i = 0; i < n; i++) {
        ddp__ln_kill(pids[i], SIGTERM);
        ddp__ln_kill(pids[i], SIGCONT); /* a stopped rank acts on SIGTERM only once continued */
    }
    for (end = ddp__now() + grace, alive = n; alive > 0 && ddp__now() < end; ddp__sleep(0.01))
        for (i = 0, alive = 0; i < n; i++) alive += kill(-pids[i], 0) == 0 || kill(pids[i], 0) == 0;
    for (i = 0; i < n; i++) ddp__ln_kill(pids[i], SIGKILL);
    _exit(0);
}

/* Tell the guardian op ('A', 'D', 'E') about pid. A guardian that is gone changes nothing. */
DDP__PRIVATE void ddp__ln_guard_tell(ddp__ln_job* j, int op, pid_t pid) {
    unsigned char m[8] = {0};
    if (j->guard_fd < 0) return;
    m[0] = (unsigned char)op;
    ddp__put_le32(m + 4, (uint32_t)pid);
    (void)ddp__send_all(j->guard_fd, m, 8, ddp__now() + 1.0);
}

/* Start the job's guardian. Without one (no socket, no fork) the job still runs, with a warning. */
DDP__PRIVATE void ddp__ln_guard_start(ddp__ln_job* j) {
    int sv[2];
    j->guard_fd = -1;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0 || (j->guard_pid = fork()) < 0) {
        ddp__log(DDP_LOG_WARN, "launcher: cannot start the guardian that stops the ranks if this launcher is killed "
                "(%s); a stopped rank could then outlive it", strerror(errno));
        return;
    }
    if (j->guard_pid == 0) {
        close(sv[0]);
        ddp__ln_guard_main(sv[1], j->grace);
    }
    close(sv[1]);
    fcntl(sv[0], F_SETFD, FD_CLOEXEC);
    ddp__sock_setup(sv[0]); /* non-blocking, and a write to a dead guardian is an error, not SIGPIPE */
    j->guard_fd = ddp__ln_guard_fd = sv[0];
}

/* A rank was started: record it, and tell the guardian. */
DDP__PRIVATE void ddp__ln_started(ddp__ln_job* j, int i, pid_t pid) {
    j->pid[i] = pid;
    j->alive++;
    ddp__ln_guard_tell(j, 'A', pid);
}

DDP__PRIVATE ddp_status ddp__ln_job_init(ddp__ln_job* j, int n) {
    memset(j, 0, sizeof *j);
    j->guard_fd = -1;
    j->pid = (pid_t*)ddp__calloc((size_t)n * sizeof(pid_t));
    j->status = (int*)ddp__calloc((size_t)n * sizeof(int));
    if (!j->pid || !j->status) {
        if (j->pid) DDP_FREE(j->pid);
        if (j->status) DDP_FREE(j->status);
        return ddp__fail(DDP_ERR_OUT_OF_MEMORY, "cannot allocate the table of %d ranks", n);
    }
    j->n = n;
    j->first_fail = -1;
    j->grace = ddp__ln_grace();
    ddp__ln_guard_start(j);
    return DDP_OK;
}
DDP__PRIVATE void ddp__ln_job_free(ddp__ln_job* j) {
    if (j->guard_fd >= 0) {
        ddp__ln_guard_tell(j, 'E', 0);
        close(j->guard_fd);
        ddp__ln_guard_fd = j->guard_fd = -1;
        while (waitpid(j->guard_pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
    DDP_FREE(j->pid);
    DDP_FREE(j->status);
}

/* Send `sig` to every rank still running (to its whole process group). */
DDP__PRIVATE void ddp__ln_signal_all(ddp__ln_job* j, int sig) {
    int i;
    for (i = 0; i < j->n; i++)
        if (j->pid[i] > 0) ddp__ln_kill(j->pid[i], sig);
}

/* Begin stopping every rank: SIGTERM now, SIGKILL when the grace period is over. */
DDP__PRIVATE void ddp__ln_stop(ddp__ln_job* j) {
    if (j->kill_at > 0) return;
    ddp__ln_signal_all(j, SIGTERM);
    ddp__ln_signal_all(j, SIGCONT); /* a rank stopped by SIGSTOP acts on SIGTERM only once continued */
    j->kill_at = ddp__now() + j->grace;
}

/* One supervision step, never blocking: reap the ranks that ended, start stopping the others at
   the first failure (or when the launcher itself got SIGINT/SIGTERM, already passed on by the
   handler), and SIGKILL the survivors once the grace period is over. */
DDP__PRIVATE void ddp__ln_tick(ddp__ln_job* j) {
    int i, st = 0, fail = -1, fail_by_signal = 0, nreaped = 0;
    int reaped[64]; /* the ranks reaped in this step (at most 64 are judged together; more wait) */
    pid_t gone[64];
    for (i = 0; i < j->n && nreaped < 64; i++) {
        pid_t r;
        if (j->pid[i] <= 0) continue;
        r = waitpid(j->pid[i], &st, WNOHANG);
        if (r == 0 || (r < 0 && errno == EINTR)) continue;
        j->status[i] = r == j->pid[i] ? st : -1;
        gone[nreaped] = j->pid[i];
        reaped[nreaped++] = i;
        ddp__ln_guard_tell(j, 'D', j->pid[i]);
        j->pid[i] = 0;
        j->alive--;
    }
    /* The first failure. Ranks reaped in the same step ended in an order nobody saw; one killed by
       a signal is then named before one that exited with an error, which is most often its
       reaction to losing that peer (DDP_ERR_PEER_LOST), so that the report names the cause. */
    for (i = 0; i < nreaped && j->first_fail < 0; i++) {
        int k = reaped[i], s = j->status[k];
        if (s != -1 && WIFEXITED(s) && WEXITSTATUS(s) == 0) continue;
        if (fail < 0 || (!fail_by_signal && s != -1 && WIFSIGNALED(s))) fail = k, fail_by_signal = s != -1 && WIFSIGNALED(s);
    }
    if (fail >= 0) {
        j->first_fail = fail;
        j->fail_time = time(NULL);
        j->fail_after_signal = ddp__ln_got_signal != 0;
        ddp__ln_stop(j);
    }
    /* The group may outlive its leader (a program the rank started); stop it too when failing. */
    if (j->kill_at > 0)
        for (i = 0; i < nreaped; i++) kill(-gone[i], j->killed ? SIGKILL : SIGTERM);
    if (ddp__ln_got_signal && j->kill_at == 0) j->kill_at = ddp__now() + j->grace;
    if (j->kill_at > 0 && !j->killed && ddp__now() >= j->kill_at) {
        ddp__ln_signal_all(j, SIGKILL);
        j->killed = 1;
    }
}

/* A free TCP port: listen on port 0 and ask which port the kernel chose. Another program could
   take it before rank 0 binds it; torchrun --standalone accepts the same race. */
DDP__PRIVATE int ddp__ln_free_port(void) {
    int port = 0, fd = ddp__sock_listen(NULL, 0, &port);
    if (fd < 0) return 0;
    close(fd);
    return port;
}

/* A random job token (16 hex characters), which keeps a stray rank of another job out of our
   store. /dev/urandom when it can be read, else the time and pid mixed by splitmix64. */
DDP__PRIVATE void ddp__ln_token(char out[17]) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        ddp_rng r = ddp_rng_seed((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^
                                 (uint64_t)(ddp__now() * 1e9));
        v = ddp__rng_next(&r);
    }
    if (fd >= 0) close(fd);
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

DDP__PRIVATE void ddp__ln_setenv_int(const char* name, int v) {
    char b[24];
    snprintf(b, sizeof b, "%d", v);
    setenv(name, b, 1);
}

/* ---- ddp_spawn ---------------------------------------------------------------------------------- */

/* The child's side of ddp_spawn: the launcher variables, then fn; its return value becomes the
   exit status (outside 0..255 it becomes 255, so a negative "error" never reads as success). */
DDP__PRIVATE void ddp__spawn_child(int rank, int nproc, int port, const char* token, ddp_spawn_fn fn, void* arg) {
    int rc;
    ddp__ln_setenv_int("RANK", rank);
    ddp__ln_setenv_int("WORLD_SIZE", nproc);
    ddp__ln_setenv_int("LOCAL_RANK", rank);
    ddp__ln_setenv_int("LOCAL_WORLD_SIZE", nproc);
    setenv("GROUP_RANK", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    ddp__ln_setenv_int("MASTER_PORT", port);
    setenv("DDP_JOB_TOKEN", token, 1);
    unsetenv("DDP_RELAYED_RANK"); /* a spawned rank writes to the terminal directly: it keeps its label */
    ddp__g.rank = rank;
    ddp__g.world = nproc;
    ddp__g.placed = 1;
    rc = fn(rank, arg);
    fflush(NULL);
    ddp__exit_leave(); /* a group fn left open: its neighbour is told, as atexit would */
    _exit(rc < 0 || rc > 255 ? 255 : rc); /* _exit: no atexit handlers of the parent's copy */
}

/* Wait for every rank, stopping the rest at the first failure; the result names that failure. */
DDP__PRIVATE ddp_status ddp__spawn_wait(ddp__ln_job* j) {
    char how[96];
    while (j->alive > 0) {
        ddp__ln_tick(j);
        if (j->alive > 0) ddp__sleep(0.005);
    }
    if (j->first_fail >= 0 && !j->fail_after_signal) {
        ddp__ln_how(j->status[j->first_fail], how, sizeof how);
        /* A rank killed by a signal (the OOM killer's SIGKILL, a crash) could say nothing itself, and
           a program that only returns 1 would end silently after its last ordinary line: say it
           here, as ddprun does for its ranks. */
        if (j->status[j->first_fail] != -1 && WIFSIGNALED(j->status[j->first_fail]))
            ddp__eprint_line("ddp_spawn: rank %d %s%s", j->first_fail, how,
                             j->n > 1 ? "; stopped the other ranks" : "");
        return ddp__fail(DDP_ERR_LAUNCH, "rank %d %s%s", j->first_fail, how,
                         j->n > 1 ? "; the other ranks were stopped" : "");
    }
    if (ddp__ln_got_signal)
        return ddp__fail(DDP_ERR_LAUNCH, "interrupted by %s, which was passed to every rank",
                         ddp__ln_signame((int)ddp__ln_got_signal));
    return DDP_OK;
}

DDP__DEF ddp_status ddp_spawn(int nproc, ddp_spawn_fn fn, void* arg) {
    ddp__ln_job j;
    ddp__ln_signals sv;
    char token[17];
    int i, port;
    pid_t me = getpid();
    ddp_status s;
    if (nproc < 1 || nproc > DDP__MAX_SPAWN)
        return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_spawn: nproc=%d is not between 1 and %d", nproc,
                         DDP__MAX_SPAWN);
    if (!fn) return ddp__fail(DDP_ERR_INVALID_ARGUMENT, "ddp_spawn: fn is NULL");
    port = ddp__ln_free_port();
    if (port <= 0) return ddp__fail(DDP_ERR_LAUNCH, "ddp_spawn: cannot find a free TCP port on 127.0.0.1: %s",
                                    strerror(errno));
    ddp__ln_token(token);
    DDP__TRY(ddp__ln_job_init(&j, nproc));
    fflush(NULL); /* or each child would print the parent's buffered output again */
    ddp__ln_signals_begin(&j, &sv);
    for (i = 0; i < nproc; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            ddp__ln_child_setup(&sv, me);
            ddp__spawn_child(i, nproc, port, token, fn, arg);
        }
        if (pid < 0) {
            int e = errno;
            ddp__ln_signal_all(&j, SIGKILL); /* a partial job is useless: take it down */
            while (j.alive > 0) {
                ddp__ln_tick(&j);
                ddp__sleep(0.005);
            }
            ddp__ln_signals_end(&sv);
            ddp__ln_job_free(&j);
            return ddp__fail(DDP_ERR_LAUNCH, "ddp_spawn: cannot start rank %d: fork failed: %s", i, strerror(e));
        }
        ddp__ln_started(&j, i, pid);
    }
    ddp__ln_signals_unblock(&sv);
    s = ddp__spawn_wait(&j);
    ddp__ln_signals_end(&sv);
    ddp__ln_job_free(&j);
    return s;
}

#endif /* DDP__IMPLEMENT */

#undef DDP__DECLARE
#undef DDP__IMPLEMENT

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
