/* Reference solution of lab "zero1" (labs/zero1/starter.c). Instructors only: it is not in the
   handout (make lab-handout leaves labs/solutions out).  check it:  make lab-zero1 SOLUTION=1 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zero1.h"

struct lab_zero1 {
    ddp_pg* pg;
    ddp_model* m;
    lab_zero1_desc d;
    long steps;
    int nparams, world;
    size_t n, shard, lo;  /* N elements in all, S per shard, this shard's first flat element */
    size_t *first, *len;  /* per parameter: its part inside this rank's shard */
    float **s1, **s2;     /* per parameter: momentum (SGD) or the first moment, and the second
                             moment (Adam); len[i] floats each, NULL when not needed */
    float *send, *recv;   /* the all-gather's buffers: S floats, and world x S */
    size_t state_bytes;
};

size_t lab_zero1_owned(const size_t* counts, int nparams, int world, int rank, size_t* first, size_t* len) {
    size_t n = 0, at = 0, S, lo, hi;
    int i;
    for (i = 0; i < nparams; i++) n += counts[i];
    S = (n + (size_t)world - 1) / (size_t)world; /* rounded up: the last shard may be short */
    lo = S * (size_t)rank;
    hi = lo + S < n ? lo + S : n;
    for (i = 0; i < nparams; i++) {
        size_t end = at + counts[i];
        size_t a = lo > at ? lo : at, b = hi < end ? hi : end; /* [a, b): the overlap, flat */
        first[i] = a - at;
        len[i] = b > a ? b - a : 0;
        at = end;
    }
    return S;
}

/* Copy k floats between buf and the model's flat view, from flat element `at` on: into the
   parameters when to_params, else out of them. */
static void flat_copy(ddp_model* m, size_t at, float* buf, size_t k, int to_params) {
    size_t begin = 0;
    int i;
    for (i = 0; i < ddp_model_num_params(m) && k > 0; i++) {
        ddp_param* p = ddp_model_param(m, i);
        size_t end = begin + p->count;
        if (at < end) {
            size_t off = at - begin, c = end - at < k ? end - at : k;
            if (to_params) memcpy(p->data + off, buf, c * sizeof(float));
            else memcpy(buf, p->data + off, c * sizeof(float));
            buf += c, at += c, k -= c;
        }
        begin = end;
    }
}

void lab_zero1_destroy(lab_zero1* z) {
    int i;
    if (!z) return;
    for (i = 0; i < z->nparams; i++) {
        if (z->s1) free(z->s1[i]);
        if (z->s2) free(z->s2[i]);
    }
    free(z->s1), free(z->s2), free(z->first), free(z->len), free(z->send), free(z->recv);
    free(z);
}

ddp_status lab_zero1_create(ddp_pg* pg, ddp_model* m, const lab_zero1_desc* d, lab_zero1** out) {
    lab_zero1* z = (lab_zero1*)calloc(1, sizeof *z);
    size_t* counts = NULL;
    int i, ok, moments;
    *out = NULL;
    if (!z) return DDP_ERR_OUT_OF_MEMORY;
    z->pg = pg, z->m = m, z->d = *d;
    z->nparams = ddp_model_num_params(m);
    z->world = ddp_world_size(pg);
    z->n = ddp_model_num_elements(m);
    z->first = (size_t*)calloc((size_t)z->nparams + 1, sizeof(size_t));
    z->len = (size_t*)calloc((size_t)z->nparams + 1, sizeof(size_t));
    z->s1 = (float**)calloc((size_t)z->nparams + 1, sizeof(float*));
    z->s2 = (float**)calloc((size_t)z->nparams + 1, sizeof(float*));
    counts = (size_t*)calloc((size_t)z->nparams + 1, sizeof(size_t));
    ok = z->first && z->len && z->s1 && z->s2 && counts;
    if (ok) {
        for (i = 0; i < z->nparams; i++) counts[i] = ddp_model_param(m, i)->count;
        z->shard = lab_zero1_owned(counts, z->nparams, z->world, ddp_rank(pg), z->first, z->len);
        z->lo = z->shard * (size_t)ddp_rank(pg);
        /* the all-gather's buffers (at least one float, so that an empty model allocates) */
        z->send = (float*)calloc(z->shard + 1, sizeof(float));
        z->recv = (float*)calloc(z->shard * (size_t)z->world + 1, sizeof(float));
        ok = z->send && z->recv;
    }
    free(counts);
    /* the state: for the owned elements only; plain SGD keeps none, momentum one float per
       element, Adam two */
    moments = d->kind == LAB_ZERO1_ADAM ? 2 : d->momentum != 0.f ? 1 : 0;
    for (i = 0; ok && i < z->nparams; i++) {
        if (z->len[i] == 0 || moments == 0) continue;
        z->s1[i] = (float*)calloc(z->len[i], sizeof(float));
        if (moments == 2) z->s2[i] = (float*)calloc(z->len[i], sizeof(float));
        ok = z->s1[i] && (moments < 2 || z->s2[i]);
        z->state_bytes += (size_t)moments * z->len[i] * sizeof(float);
    }
    if (!ok) {
        lab_zero1_destroy(z);
        return DDP_ERR_OUT_OF_MEMORY;
    }
    *out = z;
    return DDP_OK;
}

/* Every rank's shard to every rank: one all-gather of S floats (this rank's shard, padded with
   zeros past the model's N elements), then each rank's shard copied to its place. */
static ddp_status gather(lab_zero1* z) {
    ddp_status s;
    int q;
    if (z->lo < z->n) flat_copy(z->m, z->lo, z->send, z->n - z->lo < z->shard ? z->n - z->lo : z->shard, 0);
    if ((s = ddp_all_gather(z->pg, z->send, z->recv, z->shard, DDP_F32, NULL)) != DDP_OK) return s;
    for (q = 0; q < z->world; q++) {
        size_t at = (size_t)q * z->shard;
        if (at < z->n) flat_copy(z->m, at, z->recv + at, z->n - at < z->shard ? z->n - at : z->shard, 1);
    }
    return DDP_OK;
}

ddp_status lab_zero1_step(lab_zero1* z) {
    const lab_zero1_desc* d = &z->d;
    float step_size = 0.f, bc2_sqrt = 1.f;
    int i, first_step;
    z->steps++;
    first_step = z->steps == 1;
    if (d->kind == LAB_ZERO1_ADAM) {
        /* bias corrections in double, as PyTorch computes them with Python floats */
        double bc1 = 1.0 - pow((double)d->beta1, (double)z->steps);
        double bc2 = 1.0 - pow((double)d->beta2, (double)z->steps);
        step_size = (float)(d->lr / bc1);
        bc2_sqrt = (float)sqrt(bc2);
    }
    for (i = 0; i < z->nparams; i++) {
        ddp_param* p = ddp_model_param(z->m, i);
        float *w = p->data + z->first[i], *g = p->grad + z->first[i], *s1 = z->s1[i], *s2 = z->s2[i];
        size_t k, n = z->len[i];
        if (d->kind == LAB_ZERO1_SGD && d->momentum == 0.f) {
            for (k = 0; k < n; k++) w[k] -= d->lr * g[k];
        } else if (d->kind == LAB_ZERO1_SGD) {
            for (k = 0; k < n; k++) {
                /* torch.optim.SGD: the buffer starts as the gradient itself, undamped */
                float b = first_step ? g[k] : d->momentum * s1[k] + (1.f - d->dampening) * g[k];
                s1[k] = b;
                w[k] -= d->lr * b;
            }
        } else {
            for (k = 0; k < n; k++) {
                s1[k] += (1.f - d->beta1) * (g[k] - s1[k]); /* PyTorch's lerp form */
                s2[k] = d->beta2 * s2[k] + (1.f - d->beta2) * g[k] * g[k];
                w[k] -= step_size * s1[k] / (sqrtf(s2[k]) / bc2_sqrt + d->eps);
            }
        }
    }
    return gather(z);
}

size_t lab_zero1_state_bytes(const lab_zero1* z) { return z->state_bytes; }
