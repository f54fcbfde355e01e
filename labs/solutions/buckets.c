/* Reference solution of lab "buckets" (labs/buckets/starter.c). Instructors only: it is not in
   the handout (make lab-handout leaves labs/solutions out).   check it:  make lab-buckets SOLUTION=1 */
#include <stdlib.h>
#include <string.h>

#include "buckets.h"

/* ---- part 1: the map ------------------------------------------------------------------------ */

void lab_assign_buckets(lab_bucket_map* map, int nparams, const size_t* param_bytes, size_t first_bucket_bytes,
                        size_t bucket_cap_bytes) {
    int i, k = 0;
    size_t bytes = 0;
    if (first_bucket_bytes == 0) first_bucket_bytes = (size_t)1 << 20; /* 0: the default, as ddp_wrap */
    if (bucket_cap_bytes == 0) bucket_cap_bytes = (size_t)25 << 20;
    map->nparams_in[0] = 0;
    for (i = nparams - 1; i >= 0; i--) { /* last parameter first: the order backward finishes them */
        size_t limit = k == 0 ? first_bucket_bytes : bucket_cap_bytes;
        map->bucket_of[i] = k;
        map->nparams_in[k]++;
        bytes += param_bytes[i];
        if (bytes >= limit && i > 0) { /* full: the next parameter opens the next bucket */
            k++;
            bytes = 0;
            map->nparams_in[k] = 0;
        }
    }
    map->nbuckets = nparams > 0 ? k + 1 : 0;
}

/* ---- part 2: the reducer -------------------------------------------------------------------- */

typedef struct bucket {
    float* buf;        /* the bucket's gradients, back to back */
    size_t count;      /* floats */
    int pending;       /* gradients still to come in this backward pass */
    ddp_work* work;    /* its all-reduce, once launched */
} bucket;

struct lab_reducer {
    ddp_pg* pg;
    ddp_model* m;
    int nparams, nbuckets, next_launch;
    int bucket_of[LAB_MAX_PARAMS], nparams_in[LAB_MAX_PARAMS];
    size_t offset_of[LAB_MAX_PARAMS];  /* where parameter i sits in its bucket */
    unsigned char ready[LAB_MAX_PARAMS];
    bucket b[LAB_MAX_PARAMS];
    ddp_status failed;                 /* a launch that failed inside a hook, reported by finish */
};

static void reset(lab_reducer* r) {
    int k;
    for (k = 0; k < r->nbuckets; k++) r->b[k].pending = r->nparams_in[k], r->b[k].work = NULL;
    memset(r->ready, 0, sizeof r->ready);
    r->next_launch = 0;
}

lab_reducer* lab_reducer_create(ddp_pg* pg, ddp_model* m, const lab_bucket_map* map) {
    lab_reducer* r = (lab_reducer*)calloc(1, sizeof *r);
    int i, k;
    if (!r) return NULL;
    r->pg = pg, r->m = m, r->nparams = ddp_model_num_params(m), r->nbuckets = map->nbuckets;
    for (k = 0; k < r->nbuckets; k++) r->nparams_in[k] = map->nparams_in[k];
    /* bucket k holds its parameters in the order backward finishes them: last index first */
    for (i = r->nparams - 1; i >= 0; i--) {
        bucket* b = &r->b[map->bucket_of[i]];
        r->bucket_of[i] = map->bucket_of[i];
        r->offset_of[i] = b->count;
        b->count += ddp_model_param(m, i)->count;
    }
    for (k = 0; k < r->nbuckets; k++)
        if (!(r->b[k].buf = (float*)malloc(r->b[k].count * sizeof(float) + 1))) {
            lab_reducer_destroy(r);
            return NULL;
        }
    reset(r);
    return r;
}

/* Launch every complete bucket from next_launch on, in order: bucket k never overtakes k-1, so
   every rank issues the same all-reduces in the same order whatever order its gradients came in. */
static void launch_ready(lab_reducer* r) {
    while (r->failed == DDP_OK && r->next_launch < r->nbuckets && r->b[r->next_launch].pending == 0) {
        bucket* b = &r->b[r->next_launch++];
        r->failed = ddp_all_reduce(r->pg, b->buf, b->count, DDP_F32, DDP_SUM, &b->work); /* returns at once */
    }
}

void lab_reducer_grad_ready(lab_reducer* r, ddp_param* p) {
    int i = p->index;
    bucket* b = &r->b[r->bucket_of[i]];
    float scale = 1.f / (float)ddp_world_size(r->pg);
    size_t j;
    for (j = 0; j < p->count; j++) b->buf[r->offset_of[i] + j] = p->grad[j] * scale; /* the sum becomes the mean */
    r->ready[i] = 1;
    b->pending--;
    launch_ready(r);
}

ddp_status lab_reducer_finish(lab_reducer* r) {
    int i, k;
    ddp_status s = DDP_OK;
    for (i = 0; i < r->nparams; i++) /* no gradient this time: it counts as zero */
        if (!r->ready[i]) {
            bucket* b = &r->b[r->bucket_of[i]];
            memset(b->buf + r->offset_of[i], 0, ddp_model_param(r->m, i)->count * sizeof(float));
            r->ready[i] = 1;
            b->pending--;
        }
    launch_ready(r);
    for (k = 0; k < r->nbuckets; k++) { /* every handle is waited for, even after a failure */
        ddp_status w = r->b[k].work ? ddp_work_wait(r->b[k].work) : DDP_OK;
        if (s == DDP_OK) s = w;
    }
    if (s == DDP_OK) s = r->failed;
    for (i = 0; i < r->nparams && s == DDP_OK; i++) {
        ddp_param* p = ddp_model_param(r->m, i);
        memcpy(p->grad, r->b[r->bucket_of[i]].buf + r->offset_of[i], p->count * sizeof(float));
    }
    reset(r);
    r->failed = DDP_OK;
    return s;
}

void lab_reducer_destroy(lab_reducer* r) {
    int k;
    if (!r) return;
    for (k = 0; k < r->nbuckets; k++) free(r->b[k].buf);
    free(r);
}
