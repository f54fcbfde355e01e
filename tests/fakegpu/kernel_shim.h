// fakegpu's kernel shim: what the host C++ compiler needs to build CUDA kernel source as host code.
// nvrtcCompileProgram puts this before the program's own source, and after it one FG_KERNEL(name)
// line per __global__ function, which exports two entry points per kernel: fg_run_NAME runs the
// whole grid (blocks in a seeded random order, the threads of a block forwards or backwards), and
// fg_info_NAME tells the size of each parameter and which are pointers, from the kernel's own
// signature. Only what ddp.h's kernels and simple kernels of one's own use is here: a kernel that
// needs __syncthreads, __shared__ memory or a warp's shuffles does not compile under the stand-in
// (the threads of a block run one by one; nvrtc.c says so in the log). Atomics are here: one
// thread at a time makes them exact, and __atomic builtins keep them so when kernels on two streams
// run at once.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>
#include <utility>

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
static thread_local uint3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
// round-to-nearest add and multiply; the shim is compiled with -ffp-contract=off so that no
// multiply-add is fused behind the kernel's back
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }

// the atomics CUDA's programs use most, each returning the old value
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <typename F, typename U>
static inline F fg_atomic_float_add(F* p, F v) { // a compare-and-swap loop on the number's bits
    U old = __atomic_load_n((U*)p, __ATOMIC_SEQ_CST), want;
    F o, n;
    do {
        memcpy(&o, &old, sizeof o);
        n = o + v;
        memcpy(&want, &n, sizeof want);
    } while (!__atomic_compare_exchange_n((U*)p, &old, want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return o;
}
static inline float atomicAdd(float* p, float v) { return fg_atomic_float_add<float, uint32_t>(p, v); }
static inline double atomicAdd(double* p, double v) { return fg_atomic_float_add<double, uint64_t>(p, v); }
static inline int atomicMax(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
static inline int atomicMin(int* p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
static inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicCAS(int* p, int cmp, int v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}

template <typename... A, size_t... I>
static void fg_call(void (*f)(A...), void** a, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_cv<A>::type*>(a[I])...);
}

static unsigned long long fg_gcd(unsigned long long a, unsigned long long b) {
    while (b) { unsigned long long t = a % b; a = b; b = t; }
    return a;
}

template <typename... A>
static void fg_grid(void (*f)(A...), void** a, const unsigned* g, const unsigned* b, unsigned long long seed) {
    unsigned long long nb = (unsigned long long)g[0] * g[1] * g[2], nt = (unsigned long long)b[0] * b[1] * b[2];
    // an affine permutation i -> (mul * i + off) mod nb visits every block once, in a seeded order
    unsigned long long mul = (seed | 1) % nb, off = (seed >> 17) % nb, i, t;
    int backwards = (seed >> 9) & 1;
    if (nb == 0) return;
    if (mul == 0) mul = 1;
    while (fg_gcd(mul, nb) != 1) mul++;
    gridDim.x = g[0], gridDim.y = g[1], gridDim.z = g[2];
    blockDim.x = b[0], blockDim.y = b[1], blockDim.z = b[2];
    for (i = 0; i < nb; i++) {
        unsigned long long bl = (unsigned long long)(((unsigned __int128)mul * i + off) % nb);
        blockIdx.x = (unsigned)(bl % g[0]), blockIdx.y = (unsigned)(bl / g[0] % g[1]);
        blockIdx.z = (unsigned)(bl / ((unsigned long long)g[0] * g[1]));
        for (t = 0; t < nt; t++) {
            unsigned long long th = backwards ? nt - 1 - t : t;
            threadIdx.x = (unsigned)(th % b[0]), threadIdx.y = (unsigned)(th / b[0] % b[1]);
            threadIdx.z = (unsigned)(th / ((unsigned long long)b[0] * b[1]));
            fg_call(f, a, std::index_sequence_for<A...>{});
        }
    }
}

template <typename... A>
static int fg_info(void (*)(A...), unsigned* sizes, unsigned char* isptr, int max) {
    const unsigned s[] = {0u, (unsigned)sizeof(A)...};
    const unsigned char p[] = {0, (unsigned char)std::is_pointer<A>::value...};
    int n = (int)sizeof...(A), i;
    for (i = 0; i < n && i < max; i++) sizes[i] = s[i + 1], isptr[i] = p[i + 1];
    return n;
}

#define FG_KERNEL(name)                                                                                        \
    extern "C" __attribute__((visibility("default"))) void fg_run_##name(void** a, const unsigned* g,          \
                                                                         const unsigned* b,                    \
                                                                         unsigned long long seed) {            \
        fg_grid(name, a, g, b, seed);                                                                         \
    }                                                                                                          \
    extern "C" __attribute__((visibility("default"))) int fg_info_##name(unsigned* s, unsigned char* p, int m) { \
        return fg_info(name, s, p, m);                                                                         \
    }

