/* fakegpu's cuBLAS: a handle bound to a GPU and a stream, and cublasSgemm with the documented
   column-major semantics, its arguments checked as cuBLAS checks them, run on the handle's stream.
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

static void fg_gemm_run(fg_op* op) {
    fg_gemm* g = (fg_gemm*)op->arg;
    int i, j, l;
    const int ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k, br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
    const float *A = NULL, *B = NULL;
    float* C = (float*)fg_alias(g->C, fg_extent(g->m, g->n, g->ldc) * 4);
    float* col;
    if (g->k > 0 && g->alpha != 0.f) {
        A = (const float*)fg_alias(g->A, fg_extent(ar, ac, g->lda) * 4);
        B = (const float*)fg_alias(g->B, fg_extent(br, bc, g->ldb) * 4);
    }
    if (!C || (g->k > 0 && g->alpha != 0.f && (!A || !B))) {
        fg_fault("cublasSgemm(m=%d, n=%d, k=%d, lda=%d, ldb=%d, ldc=%d): %s reaches past its allocation (or is not "
                 "device memory)", g->m, g->n, g->k, g->lda, g->ldb, g->ldc, !C ? "C" : !A ? "A" : "B");
        return;
    }
    if (!(col = (float*)malloc((size_t)g->m * sizeof *col))) fg_fatal("out of memory");
    for (j = 0; j < g->n; j++) {
        float* c = C + (size_t)j * g->ldc;
        for (i = 0; i < g->m; i++) col[i] = 0.f;
        if (A) {
            for (l = 0; l < g->k; l++) {
                float b = g->tb ? B[(size_t)l * g->ldb + j] : B[(size_t)j * g->ldb + l];
                if (!g->ta) {
                    const float* a = A + (size_t)l * g->lda;
                    for (i = 0; i < g->m; i++) col[i] += a[i] * b;
                } else {
                    for (i = 0; i < g->m; i++) col[i] += A[(size_t)i * g->lda + l] * b;
                }
            }
        }
        for (i = 0; i < g->m; i++) c[i] = g->alpha * col[i] + (g->beta == 0.f ? 0.f : g->beta * c[i]);
    }
    free(col);
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
