/* Lab "ring": the ring all-reduce, over a link that can fill up.    run the tests:  make lab-ring

   All-reduce: every rank starts with its own buffer of n floats and ends with the element-wise
   sum of all of them. Data-parallel training all-reduces every gradient of every step, so this is
   the collective that decides how well DDP scales. TUTORIAL.md, chapter 2, explains the ring:
   read "The ring all-reduce" there first, with its worked example for 3 ranks, and draw the
   table for 4 ranks yourself before you write any code. This file only says what your code must
   do; how is yours to work out.

   THE RULES (the tests check each one and name it when it is broken)

   rule 0  A ring of your own: the data moves only through the send and recv you are given.
           Nothing of ddp.h's communication (its collectives, its process groups): the tests
           read your file's symbols and refuse it.
   rule 1  On return, buf[0..n) on every rank holds the sum of every rank's buf[0..n). Nothing
           past buf[n-1] is written.
   rule 2  A ring: rank r sends only to its right neighbour, (r + 1) mod world, and receives only
           from its left one, (r - 1) mod world. (In C, (-1) % 3 is -1, not 2.)
   rule 3  Every recv asks for exactly the count of the message it takes, and every message sent
           is received before the function returns.
   rule 4  The buffer is cut into `world` chunks whose sizes differ by at most one (some are empty
           when n < world). No message is larger than a chunk: ceil(n / world) floats.
   rule 5  Bandwidth: each rank sends at most 2(world-1) chunks' worth of floats, and the ranks
           together send exactly 2(world-1) * n floats: the reduce-scatter moves every chunk
           world-1 times, the all-gather too.
   rule 6  A chunk that fits in the window goes as one message (do not cut what need not be cut;
           an empty chunk need not be sent at all).
   rule 7  No deadlock, whatever the window, down to a window of 1 float.
   rule 8  What a ring sends, element by element (any chunk order, any cut into messages): in the
           reduce-scatter a rank sends for element p its own buf[p] (where p's trip starts) or
           what it received for p plus its own buf[p]; in the all-gather it sends p's complete
           sum, which it has just completed or received. Each element's partial sums go once
           around the ring (through world-1 ranks), then its sum once around. The tests know
           every rank's data and check every float sent (in the cases with n <= 4096).
   world == 1 must work too (nothing to send).

   THE TRAP (rule 7). send() returns only once its message is in the link, and the link holds
   `window` floats. If every rank first sends a chunk larger than the window and only then
   receives, every send waits for a receiver that is itself stuck in its own send: a deadlock,
   and the tests will say so within a second, naming what each rank waits for. Find an order of
   sends and receives that cannot deadlock, whatever the window, and be ready to say why it
   cannot (real libraries know two).

   PART 2 (lab_ring_all_reduce_pipelined, below). Real rings (NCCL's, for one) cut every chunk
   into pieces and keep the link busy: while a rank adds piece p that it just received, piece
   p+1 of what it sends is already on the wire. Here the link holds 2 * piece floats: room for
   two pieces, a double buffer. Rules 1-3, 5, 7 and 8 as above, and:
   rule P1 No message is larger than `piece` floats.
   rule P2 Each chunk goes as ceil(len / piece) messages.
   rule P3 One piece in flight: within each step, before a rank waits for piece p, it has already
           sent piece p+1 of that step (when the step has one). The tests check this in the
           cases where every chunk holds the same number of pieces.
   Question to answer before you code part 2: why can sending two pieces ahead deadlock here,
   when one piece ahead cannot?

   Stuck? labs/ring/HINTS.md has hints in three tiers; take the first one first.
   Answer the questions in labs/ring/QUESTIONS.md when the tests pass. */
#include <stdlib.h>

#include "ring.h"

void lab_ring_all_reduce(float* buf, size_t n, int rank, int world, size_t window, lab_send_fn send,
                         lab_recv_fn recv) {
    /* TODO: part 1 */
    (void)buf, (void)n, (void)rank, (void)world, (void)window, (void)send, (void)recv;
}

void lab_ring_all_reduce_pipelined(float* buf, size_t n, int rank, int world, size_t piece, lab_send_fn send,
                                   lab_recv_fn recv) {
    /* TODO: part 2 */
    (void)buf, (void)n, (void)rank, (void)world, (void)piece, (void)send, (void)recv;
}
