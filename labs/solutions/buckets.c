/* Reference solution of lab "buckets" (labs/buckets/starter.c). Instructors only: delete
   labs/solutions before handing the labs out.           check it:  make lab-buckets SOLUTION=1 */
#include "buckets.h"

void lab_assign_buckets(lab_buckets* b, int nparams, const size_t* param_bytes, size_t first_bucket_bytes,
                        size_t bucket_cap_bytes) {
    int i, k = 0;
    size_t bytes = 0;
    b->nbuckets = 0;
    for (i = 0; i < LAB_MAX_PARAMS; i++) b->nparams_in[i] = 0;
    for (i = nparams - 1; i >= 0; i--) {
        size_t limit = k == 0 ? first_bucket_bytes : bucket_cap_bytes;
        b->bucket_of[i] = k;
        b->nparams_in[k]++;
        bytes += param_bytes[i];
        if (bytes >= limit || i == 0) { /* full (or the last parameter): close it */
            k++;
            bytes = 0;
        }
    }
    b->nbuckets = k;
    lab_backward_begin(b);
}

void lab_backward_begin(lab_buckets* b) {
    int k;
    for (k = 0; k < b->nbuckets; k++) b->pending[k] = b->nparams_in[k];
    b->next_launch = 0;
}

void lab_grad_ready(lab_buckets* b, int param, lab_launch_fn launch, void* user) {
    b->pending[b->bucket_of[param]]--;
    /* launch every ready bucket from next_launch on, in order: k never overtakes k-1 */
    while (b->next_launch < b->nbuckets && b->pending[b->next_launch] == 0) launch(b->next_launch++, user);
}
