/* Lab "measure": a cost model of the all-reduce, fitted on this machine, that predicts the best
   bucket size.                                                  run the tests:  make lab-measure

   Chapter 8 of TUTORIAL.md measures bucket sizes; chapter 10 gives the cost of an all-reduce as
   a latency per message plus a time per byte. Here you close the loop: measure, fit, predict,
   and check the prediction against a measurement. The tests do the timing (on 3 ranks for ring
   against relay, then on 2 ranks over a network that ddp.h simulates: DDP_SIMULATE_LATENCY_US
   and DDP_SIMULATE_NS_PER_BYTE, because two processes on a laptop have no network between them);
   you write what turns the numbers into a prediction. The cases named exact_* check your code on
   made-up numbers; the live_* cases print this machine's numbers beside your model's. The tests
   take about 10 seconds (8.5 s on our 2-core machine, with the reference solution).

   THE RULES (the tests name the one you break)
   rule M1 lab_relay_all_reduce: the whole-buffer relay many courses teach as "ring all-reduce":
           every rank's whole buffer goes to every rank (ddp_all_gather), and each rank adds the
           copies up. Each rank sends (W-1) x S bytes; the ring sends 2(W-1)/W x S. The sum ends
           on every rank.
   rule M2 lab_fit: the line t = alpha + beta * bytes through measurements that span 1 KiB to
           16 MiB, where the times differ by a factor of a thousand. Every size must count alike:
           a 10% error at 16 MiB is many times the whole 4 KiB time, so a fit that minimises the
           plain squared error lets the largest sizes decide alpha. Minimise the relative error.
   rule M3 lab_step_time: backward makes grad_bytes of gradients at a steady tau seconds per byte,
           from time 0. They are cut into buckets of bucket_bytes, in the order they are made (the
           last bucket smaller when bucket_bytes does not divide grad_bytes). A bucket is complete
           when its last byte is made. The network all-reduces one bucket at a time, in order,
           each taking alpha + beta * (its bytes), starting as soon as the bucket is complete and
           the previous all-reduce is done. The step time is when the last all-reduce ends.
           Mind both cases: a network slower than backward (beta >= tau) and a faster one.
   rule M4 lab_best_bucket: the bucket size in (0, grad_bytes] whose step time is the smallest
           (within 1%). Derive it: where do the two costs that pull in opposite directions
           balance? Then check your formula with lab_step_time around it.
   rule M5 Live: your fit follows this machine's measurements (every size within 30% of the line
           on the simulated network, 50% on the real one), and your predicted best bucket is
           within a factor of 2 of the best one measured in the sweep.

   The numbers printed under the live_* cases are yours to interpret: labs/measure/QUESTIONS.md
   asks about them. Stuck? labs/measure/HINTS.md. */
#include <math.h>
#include <stdlib.h>

#include "measure.h"

void lab_relay_all_reduce(ddp_pg* pg, float* buf, size_t count) {
    /* TODO (1) */
    (void)pg, (void)buf, (void)count;
}

lab_line lab_fit(const double* bytes, const double* seconds, int n) {
    lab_line l = {0, 0};
    /* TODO (2) */
    (void)bytes, (void)seconds, (void)n;
    return l;
}

double lab_step_time(lab_line net, double grad_bytes, double tau_s_per_byte, double bucket_bytes) {
    /* TODO (3) */
    (void)net, (void)grad_bytes, (void)tau_s_per_byte, (void)bucket_bytes;
    return 0;
}

double lab_best_bucket(lab_line net, double grad_bytes, double tau_s_per_byte) {
    /* TODO (4) */
    (void)net, (void)tau_s_per_byte;
    return grad_bytes;
}
