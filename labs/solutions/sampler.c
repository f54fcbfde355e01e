/* Reference solution of lab "sampler" (labs/sampler/starter.c). Instructors only: it is not in
   the handout (make lab-handout leaves labs/solutions out).  check it:  make lab-sampler SOLUTION=1 */
#include "sampler.h"

void lab_sampler_indices(int n, int replicas, int rank, int drop_last, const int* order, int* out, int* count) {
    int k, num_samples = drop_last ? n / replicas : (n + replicas - 1) / replicas;
    for (k = 0; k < num_samples; k++) out[k] = order[(rank + k * replicas) % n]; /* % n: the padding */
    *count = num_samples;
}
