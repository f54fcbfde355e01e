/* Reference solution of lab "ring" (labs/ring/starter.c). Instructors only: it is not in the
   handout (make lab-handout leaves labs/solutions out).   check it:  make lab-ring SOLUTION=1 */
#include <stdlib.h>

#include "ring.h"

static int mod(int x, int world) { return ((x % world) + world) % world; }
/* chunk c is [c*n/world, (c+1)*n/world): sizes differ by at most one */
static size_t chunk_start(size_t n, int world, int c) { return n * (size_t)c / (size_t)world; }
static size_t chunk_len(size_t n, int world, int c) { return chunk_start(n, world, c + 1) - chunk_start(n, world, c); }
/* piece i of a chunk of len floats cut into pieces of at most `piece`: [i*piece, min(len, (i+1)*piece)) */
static size_t npieces(size_t len, size_t piece) { return (len + piece - 1) / piece; }
static size_t piece_len(size_t len, size_t piece, size_t i) { return len - i * piece < piece ? len - i * piece : piece; }

/* One step: send chunk sc to the right, receive chunk rc from the left, add it (phase 1) or copy
   it (phase 2), all in pieces of at most `piece`. lead = 0: send piece i, then receive piece i
   (part 1: each send fits in an empty link, so it cannot wait for a rank that waits itself).
   lead = 1: piece i+1 goes out before piece i is waited for (part 2: the link holds two pieces). */
static void step(float* buf, float* tmp, size_t n, int world, int sc, int rc, int add, size_t piece, int lead,
                 int right, int left, lab_send_fn send, lab_recv_fn recv) {
    float* out = buf + chunk_start(n, world, sc);
    float* in = buf + chunk_start(n, world, rc);
    size_t slen = chunk_len(n, world, sc), rlen = chunk_len(n, world, rc);
    size_t ks = npieces(slen, piece), kr = npieces(rlen, piece), i, j, sent = 0;
    for (i = 0; i < ks || i < kr; i++) {
        for (; sent < ks && sent <= i + (size_t)lead; sent++)
            send(right, out + sent * piece, piece_len(slen, piece, sent));
        if (i < kr) {
            size_t len = piece_len(rlen, piece, i);
            float* dst = in + i * piece;
            if (add) {
                recv(left, tmp, len);
                for (j = 0; j < len; j++) dst[j] += tmp[j];
            } else {
                recv(left, dst, len); /* a complete sum: it goes straight to its place */
            }
        }
    }
}

static void ring(float* buf, size_t n, int rank, int world, size_t piece, int lead, lab_send_fn send,
                 lab_recv_fn recv) {
    int right = mod(rank + 1, world), left = mod(rank - 1, world), s;
    float* tmp;
    if (world == 1) return;
    tmp = (float*)malloc((piece < n / (size_t)world + 1 ? piece : n / (size_t)world + 1) * sizeof(float));
    if (!tmp) abort();
    /* reduce-scatter: at step s rank r passes on chunk r-s and adds in chunk r-s-1; after
       world-1 steps it holds the whole sum of chunk r+1 */
    for (s = 0; s < world - 1; s++)
        step(buf, tmp, n, world, mod(rank - s, world), mod(rank - s - 1, world), 1, piece, lead, right, left, send, recv);
    /* all-gather: the complete chunks travel once around the ring */
    for (s = 0; s < world - 1; s++)
        step(buf, tmp, n, world, mod(rank + 1 - s, world), mod(rank - s, world), 0, piece, lead, right, left, send,
             recv);
    free(tmp);
}

void lab_ring_all_reduce(float* buf, size_t n, int rank, int world, size_t window, lab_send_fn send,
                         lab_recv_fn recv) {
    ring(buf, n, rank, world, window, 0, send, recv);
}

void lab_ring_all_reduce_pipelined(float* buf, size_t n, int rank, int world, size_t piece, lab_send_fn send,
                                   lab_recv_fn recv) {
    ring(buf, n, rank, world, piece, 1, send, recv);
}
