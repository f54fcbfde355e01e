/* labs/ring/ring.h: the interface of the ring all-reduce lab (see starter.c for the task). */
#ifndef LAB_RING_H
#define LAB_RING_H

#include <stddef.h>

/* The transport the harness gives you. Between each rank and its right neighbour runs a LINK
   that holds at most `window` floats the neighbour has not received yet (a socket's buffer, a
   network card's queue).

   send(to, data, count): one message of count floats to rank `to`. It returns once the whole
   message is IN the link: at once if it fits in the room left, otherwise only after the
   receiver has taken enough of it out. A send of more than the window returns only when the
   receiver is receiving that very message.
   recv(from, data, count): waits for the next message from rank `from` and takes it out of the
   link. Messages between two ranks arrive in the order they were sent, and count must equal the
   count of the matching send. */
typedef void (*lab_send_fn)(int to, const float* data, size_t count);
typedef void (*lab_recv_fn)(int from, float* data, size_t count);

/* YOUR TASK, part 1: on return, buf[0..n) on every rank holds the element-wise sum of every
   rank's buf[0..n). `window` is the link's size in floats (at least 1). */
void lab_ring_all_reduce(float* buf, size_t n, int rank, int world, size_t window, lab_send_fn send,
                         lab_recv_fn recv);

/* YOUR TASK, part 2: the same result, sending every chunk in pieces of at most `piece` floats and
   keeping one piece in flight (starter.c says exactly what that means). The link holds
   2 * piece floats. */
void lab_ring_all_reduce_pipelined(float* buf, size_t n, int rank, int world, size_t piece, lab_send_fn send,
                                   lab_recv_fn recv);

#endif
