/* labs/measure/measure.h: the interface of the measurement lab (see starter.c). */
#ifndef LAB_MEASURE_H
#define LAB_MEASURE_H

#include <stddef.h>

#include "ddp.h"

/* A cost line: sending a message of b bytes takes alpha + beta * b seconds. */
typedef struct lab_line {
    double alpha_s;         /* latency: seconds per message */
    double beta_s_per_byte; /* inverse bandwidth: seconds per byte */
} lab_line;

/* YOUR TASK (1): the whole-buffer relay: on return buf[0..count) on every rank of pg holds the sum
   of every rank's buf, computed by gathering every rank's whole buffer (ddp_all_gather) and
   adding the copies up. The tests time it against ddp_all_reduce's ring. */
void lab_relay_all_reduce(ddp_pg* pg, float* buf, size_t count);

/* YOUR TASK (2): fit t = alpha + beta * bytes to n measurements (bytes[i], seconds[i]), n >= 2,
   at least two different sizes. */
lab_line lab_fit(const double* bytes, const double* seconds, int n);

/* YOUR TASK (3): the time from the start of backward to the end of the last bucket's all-reduce,
   for grad_bytes of gradients made by backward at tau seconds per byte and cut into buckets of
   bucket_bytes (the last bucket smaller when it does not divide grad_bytes), on network `net`. */
double lab_step_time(lab_line net, double grad_bytes, double tau_s_per_byte, double bucket_bytes);

/* YOUR TASK (4): the bucket size in (0, grad_bytes] that makes lab_step_time smallest. */
double lab_best_bucket(lab_line net, double grad_bytes, double tau_s_per_byte);

#endif
