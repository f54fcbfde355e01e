/* Lab "ring": the ring all-reduce.                      run the tests:  make lab-ring

   All-reduce: every rank starts with its own buffer of n floats and ends with the element-wise
   sum of all of them. It is the one collective data-parallel training cannot do without: every
   step, every rank's gradients are all-reduced, so it had better be fast. ddp.h's CPU backend
   and NCCL both use a ring: rank r only ever sends to its right neighbour, (r + 1) % world, and
   only ever receives from its left neighbour, (r - 1 + world) % world.

   The algorithm. Cut the buffer into `world` chunks, chunk c covering [c*n/world, (c+1)*n/world)
   (chunk sizes differ by at most one when n is not a multiple of world; some chunks are empty
   when n < world). Then two phases of world-1 steps each:

   1. reduce-scatter. At step s = 0 .. world-2, rank r sends chunk (r - s) mod world to the right
      and receives chunk (r - s - 1) mod world from the left, which it ADDS into its own copy of
      that chunk. After world-1 steps, rank r holds the complete sum of chunk (r + 1) mod world.
   2. all-gather. At step s = 0 .. world-2, rank r sends chunk (r + 1 - s) mod world (a complete
      sum) to the right and receives chunk (r - s) mod world from the left, which it COPIES over
      its own. After world-1 steps every rank holds every complete chunk.

   Draw it for world = 3 before you write it: a 3 x 3 table, ranks across, chunks down.

   Why a ring: each rank sends 2(world-1) chunks of about S/world bytes, 2(world-1)/world * S in all
   for a buffer of S bytes: nearly 2S however many ranks there are, and every link is busy at every
   step. Sending your whole buffer to everyone would cost (world-1) * S per rank. The tests count
   the bytes each rank sends and check this.

   The tools: send(to, data, count) and recv(from, data, count), declared in ring.h. send never
   waits for the receiver, so every rank may send first and then receive. recv's count must match
   the sender's count exactly. Mind the modulo of negative numbers in C: (-1) % 3 is -1, so write
   ((x % world) + world) % world. Use a temporary buffer (malloc) for what you receive in phase 1.

   Rules: only send to the right neighbour, receive from the left one, send exactly 2(world-1)
   messages (an empty chunk is a message of 0 floats, which is fine), and handle world == 1. */
#include <stdlib.h>

#include "ring.h"

void lab_ring_all_reduce(float* buf, size_t n, int rank, int world, lab_send_fn send, lab_recv_fn recv) {
    /* TODO: the reduce-scatter phase, then the all-gather phase, as described above. */
    (void)buf, (void)n, (void)rank, (void)world, (void)send, (void)recv;
}
