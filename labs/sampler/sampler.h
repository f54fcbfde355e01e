/* labs/sampler/sampler.h: the interface of the distributed sampler lab (see starter.c). */
#ifndef LAB_SAMPLER_H
#define LAB_SAMPLER_H

/* YOUR TASK: the indices rank `rank` of `replicas` visits in one epoch of a data set of n samples
   whose shuffled order is order[0..n) (a permutation of 0..n-1, the same on every rank). Write
   them to out (room for n + replicas entries) and their number to *count. */
void lab_sampler_indices(int n, int replicas, int rank, int drop_last, const int* order, int* out, int* count);

#endif
