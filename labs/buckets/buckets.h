/* labs/buckets/buckets.h: the interface of the gradient bucketing lab (see starter.c). */
#ifndef LAB_BUCKETS_H
#define LAB_BUCKETS_H

#include <stddef.h>

#include "ddp.h"

#define LAB_MAX_PARAMS 64

/* A bucket map: which parameters are all-reduced together, bucket 0 first. */
typedef struct lab_bucket_map {
    int nbuckets;
    int bucket_of[LAB_MAX_PARAMS];  /* parameter i's bucket */
    int nparams_in[LAB_MAX_PARAMS]; /* how many parameters bucket k holds */
} lab_bucket_map;

/* YOUR TASK, part 1: fill *map (which is NOT zeroed: it may hold anything) for parameters
   0..nparams-1 of param_bytes[i] bytes each. */
void lab_assign_buckets(lab_bucket_map* map, int nparams, const size_t* param_bytes, size_t first_bucket_bytes,
                        size_t bucket_cap_bytes);

/* YOUR TASK, part 2: a reducer, as ddp_wrap's. Define `struct lab_reducer` in your file: what it
   holds is your design.
   create:     for model m (float parameters, on the CPU) on group pg, with bucket map *map (copy
               what you need: the map may be gone after the call). NULL when out of memory.
   grad_ready: called from p's gradient-ready hook during backward, once per parameter that got a
               gradient, the moment p->grad is final.
   finish:     called once after the backward pass: on return every p->grad holds the average
               over the ranks. Returns DDP_OK or the status of the collective that failed.
   destroy:    frees everything (NULL is ignored). */
typedef struct lab_reducer lab_reducer;
lab_reducer* lab_reducer_create(ddp_pg* pg, ddp_model* m, const lab_bucket_map* map);
void lab_reducer_grad_ready(lab_reducer* r, ddp_param* p);
ddp_status lab_reducer_finish(lab_reducer* r);
void lab_reducer_destroy(lab_reducer* r);

#endif
