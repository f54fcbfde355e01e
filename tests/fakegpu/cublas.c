/* fakegpu's cuBLAS: a handle bound to a GPU and a stream, and cublasSgemm (and its strided batched
   form, one product after another) with the documented column-major semantics, its arguments
   checked as cuBLAS checks them, run on the handle's stream.
   alpha and beta are read at the call (CUBLAS_POINTER_MODE_HOST, the default); with beta == 0, C
   is not read (it may hold NaN), as documented. */
#define _GNU_SOURCE
#include "fakegpu.h"

#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

struct cublasContext {
    int dev;
    cudaStream_t stream;
};

FG_EXPORT const char* cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

FG_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t* out) {
    struct cublasContext* h;
    if (!out) return CUBLAS_STATUS_INVALID_VALUE;
    if (fg_enter() != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED; /* no driver, no GPU, or after fork */
    h = (struct cublasContext*)calloc(1, sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->dev = fg_current_device();
    *out = h;
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

FG_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    cudaError_t e;
    fg_stream* st;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (s) {
        if (!(st = fg_stream_of(s, &e))) return CUBLAS_STATUS_INVALID_VALUE;
        if (fg_stream_device(st) != h->dev) return CUBLAS_STATUS_INVALID_VALUE; /* a stream of another GPU */
    }
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float* C;
} fg_gemm;

/* Elements [0, extent) of a column-major rows x cols matrix with leading dimension ld. */
static size_t fg_extent(int rows, int cols, int ld) { return rows && cols ? (size_t)(cols - 1) * ld + rows : 0; }

/* C = alpha op(A) op(B) + beta C, column-major. op(A) is packed column by column and op(B) row by
   row, so that a block of C (64 rows x 64 columns, kept in registers and cache) takes one pass of
   multiply-adds per element of the inner dimension, in order: the same sums whatever the blocks. */
#define FG_MB 64
#define FG_NB 64
static void fg_axpy64(float* __restrict acc, float a, const float* __restrict b) {
    int j;
    for (j = 0; j < FG_NB; j++) acc[j] += a * b[j];
}
static void fg_gemm_run(fg_op* op) {
    fg_gemm* g = (fg_gemm*)op->arg;
    const int m = g->m, n = g->n, k = g->k;
    const int ar = g->ta ? k : m, ac = g->ta ? m : k, br = g->tb ? n : k, bc = g->tb ? k : n;
    const float *A = NULL, *B = NULL;
    float* C = (float*)fg_alias(g->C, fg_extent(m, n, g->ldc) * 4);
    float *Ap = NULL, *Bp = NULL;
    int i, j, l, ib, jb;
    if (k > 0 && g->alpha != 0.f) {
        A = (const float*)fg_alias(g->A, fg_extent(ar, ac, g->lda) * 4);
        B = (const float*)fg_alias(g->B, fg_extent(br, bc, g->ldb) * 4);
    }
    if (!C || (k > 0 && g->alpha != 0.f && (!A || !B))) {
        fg_fault("cublasSgemm(m=%d, n=%d, k=%d, lda=%d, ldb=%d, ldc=%d): %s reaches past its allocation (or is not "
                 "device memory)", m, n, k, g->lda, g->ldb, g->ldc, !C ? "C" : !A ? "A" : "B");
        return;
    }
    if (A) {
        Ap = (float*)malloc((size_t)m * k * sizeof *Ap); /* op(A)(i, l) at Ap[l * m + i] */
        Bp = (float*)malloc((size_t)k * n * sizeof *Bp); /* op(B)(l, j) at Bp[l * n + j] */
        if (!Ap || !Bp) fg_fatal("out of memory");
        for (l = 0; l < k; l++)
            for (i = 0; i < m; i++) Ap[(size_t)l * m + i] = g->ta ? A[(size_t)i * g->lda + l] : A[(size_t)l * g->lda + i];
        for (l = 0; l < k; l++)
            for (j = 0; j < n; j++) Bp[(size_t)l * n + j] = g->tb ? B[(size_t)l * g->ldb + j] : B[(size_t)j * g->ldb + l];
    }
    for (jb = 0; jb < n; jb += FG_NB)
        for (ib = 0; ib < m; ib += FG_MB) {
            float acc[FG_MB][FG_NB];
            const int mb = m - ib < FG_MB ? m - ib : FG_MB, nb = n - jb < FG_NB ? n - jb : FG_NB;
            memset(acc, 0, sizeof acc);
            for (l = 0; A && l < k; l++) {
                const float* a = Ap + (size_t)l * m + ib;
                const float* b = Bp + (size_t)l * n + jb;
                if (nb == FG_NB) { /* a constant trip count: the compiler vectorises it */
                    float bl[FG_NB];
                    memcpy(bl, b, sizeof bl);
                    for (i = 0; i < mb; i++) fg_axpy64(acc[i], a[i], bl);
                } else {
                    for (i = 0; i < mb; i++)
                        for (j = 0; j < nb; j++) acc[i][j] += a[i] * b[j];
                }
            }
            for (j = 0; j < nb; j++) {
                float* c = C + (size_t)(jb + j) * g->ldc + ib;
                for (i = 0; i < mb; i++) c[i] = g->alpha * acc[i][j] + (g->beta == 0.f ? 0.f : g->beta * c[i]);
            }
        }
    free(Ap);
    free(Bp);
}

static void fg_gemm_fini(fg_op* op) { free(op->arg); }

static int fg_trans(cublasOperation_t t, int* out) {
    if (t == CUBLAS_OP_N) *out = 0;
    else if (t == CUBLAS_OP_T || t == CUBLAS_OP_C) *out = 1; /* real data: conjugate is transpose */
    else return 0;
    return 1;
}

FG_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m,
                                        int n, int k, const float* alpha, const float* A, int lda, const float* B,
                                        int ldb, const float* beta, float* C, int ldc) {
    fg_gemm* g;
    fg_op* op;
    fg_stream* s;
    cudaError_t e;
    int ta, tb, cur;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (fg_enter() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!fg_trans(transa, &ta) || !fg_trans(transb, &tb) || m < 0 || n < 0 || k < 0 ||
        lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1)) || ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1)) ||
        ldc < (m > 1 ? m : 1) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    cur = fg_current_device();
    if (cur != h->dev) return CUBLAS_STATUS_EXECUTION_FAILED; /* a handle is bound to the GPU it was made on */
    if (!(s = fg_stream_of(h->stream, &e))) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!(g = (fg_gemm*)calloc(1, sizeof *g))) return CUBLAS_STATUS_ALLOC_FAILED;
    g->ta = ta, g->tb = tb, g->m = m, g->n = n, g->k = k, g->lda = lda, g->ldb = ldb, g->ldc = ldc;
    g->alpha = *alpha, g->beta = *beta; /* host pointer mode: read now */
    g->A = A, g->B = B, g->C = C;
    op = fg_op_new();
    op->arg = g, op->run = fg_gemm_run, op->fini = fg_gemm_fini, op->what = "cublasSgemm";
    fg_enqueue(s, op);
    return CUBLAS_STATUS_SUCCESS;
}

/* count products, the i-th on A + i strideA, B + i strideB, C + i strideC, queued one after another */
FG_EXPORT cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb,
                                                   int m, int n, int k, const float* alpha, const float* A, int lda,
                                                   long long int strideA, const float* B, int ldb,
                                                   long long int strideB, const float* beta, float* C, int ldc,
                                                   long long int strideC, int batchCount) {
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    int i;
    if (batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (i = 0; i < batchCount && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasSgemm_v2(h, transa, transb, m, n, k, alpha, A + i * strideA, lda, B + i * strideB, ldb, beta,
                            C + i * strideC, ldc);
    return st;
}
