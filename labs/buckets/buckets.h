/* labs/buckets/buckets.h: the interface of the gradient bucketing lab (see starter.c). */
#ifndef LAB_BUCKETS_H
#define LAB_BUCKETS_H

#include <stddef.h>

#define LAB_MAX_PARAMS 64

/* What the hook calls to start the all-reduce of bucket k (the tests record it). */
typedef void (*lab_launch_fn)(int bucket, void* user);

typedef struct lab_buckets {
    /* the bucket map, filled by lab_assign_buckets and read by the tests */
    int nbuckets;
    int bucket_of[LAB_MAX_PARAMS];  /* parameter i's bucket */
    int nparams_in[LAB_MAX_PARAMS]; /* how many parameters bucket k holds */
    /* the state of one backward pass: yours to use (the tests never read it) */
    int pending[LAB_MAX_PARAMS];    /* bucket k: gradients it still waits for */
    int next_launch;                /* the next bucket to launch */
} lab_buckets;

/* YOUR TASK (1): group parameters 0..nparams-1, of param_bytes[i] bytes each, into buckets. */
void lab_assign_buckets(lab_buckets* b, int nparams, const size_t* param_bytes, size_t first_bucket_bytes,
                        size_t bucket_cap_bytes);
/* YOUR TASK (2): get ready for a backward pass (every bucket waits for all its gradients). */
void lab_backward_begin(lab_buckets* b);
/* YOUR TASK (3): the gradient-ready hook: parameter `param`'s gradient is final. */
void lab_grad_ready(lab_buckets* b, int param, lab_launch_fn launch, void* user);

#endif
