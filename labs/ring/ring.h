/* labs/ring/ring.h: the interface of the ring all-reduce lab (see starter.c for the task). */
#ifndef LAB_RING_H
#define LAB_RING_H

#include <stddef.h>

/* Send count floats from data to rank `to`. Like MPI's buffered send, it returns once the data is
   on its way and never waits for `to` to call recv: "send, then receive" cannot deadlock. */
typedef void (*lab_send_fn)(int to, const float* data, size_t count);
/* Receive count floats from rank `from` into data, waiting until they arrive. Messages between
   two ranks arrive in the order they were sent, and count must equal the count of the matching
   send (the harness stops with a message when it does not). */
typedef void (*lab_recv_fn)(int from, float* data, size_t count);

/* YOUR TASK: on return, buf[0..n) on every rank holds the element-wise sum of every rank's buf. */
void lab_ring_all_reduce(float* buf, size_t n, int rank, int world, lab_send_fn send, lab_recv_fn recv);

#endif
