/* Reference solution of lab "measure" (labs/measure/starter.c). Instructors only: it is not in
   the handout (make lab-handout leaves labs/solutions out).  check it:  make lab-measure SOLUTION=1 */
#include <math.h>
#include <stdlib.h>

#include "measure.h"

/* (1) every rank's whole buffer to every rank, then W-1 additions: (W-1) * S bytes sent per rank */
void lab_relay_all_reduce(ddp_pg* pg, float* buf, size_t count) {
    static float* all; /* kept from call to call: a fresh one would add page faults to the timing */
    static size_t cap;
    int W = ddp_world_size(pg), r;
    size_t i;
    if (count * (size_t)W > cap) {
        free(all);
        cap = count * (size_t)W;
        all = (float*)malloc(cap * sizeof(float));
        if (!all) abort();
    }
    DDP_CHECK(ddp_all_gather(pg, buf, all, count, DDP_F32, NULL));
    for (i = 0; i < count; i++) {
        float s = 0;
        for (r = 0; r < W; r++) s += all[(size_t)r * count + i]; /* rank order: the same sum on every rank */
        buf[i] = s;
    }
}

/* (2) least squares on the relative error: minimise sum ((alpha + beta b - t) / t)^2, i.e. weights
   1/t^2. A plain fit would let the largest messages, whose times are thousands of times longer,
   decide alpha alone. */
lab_line lab_fit(const double* bytes, const double* seconds, int n) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    lab_line l;
    int i;
    for (i = 0; i < n; i++) {
        double w = 1.0 / (seconds[i] * seconds[i]), x = bytes[i], y = seconds[i];
        sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
    }
    l.beta_s_per_byte = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
    l.alpha_s = (sy - l.beta_s_per_byte * sx) / sw;
    return l;
}

/* (3) n buckets; bucket k is complete at min((k+1) B, S) tau; the network takes them one at a
   time, in order. Its busy stretch ends at the latest of "bucket k complete, then buckets k..n-1
   back to back", over all k; with equal buckets the latest is at k = 0 (the network cannot keep up
   with backward: first bucket, then n all-reduces) or at the last ones (it can: backward's end,
   then the last all-reduce). */
double lab_step_time(lab_line net, double S, double tau, double B) {
    double n = ceil(S / B - 1e-9), last = S - (n - 1) * B, c = net.alpha_s + net.beta_s_per_byte * B;
    double c_last = net.alpha_s + net.beta_s_per_byte * last;
    double from_first = B * tau + (n - 1) * c + c_last;                       /* k = 0 */
    double from_second_last = n >= 2 ? (n - 1) * B * tau + c + c_last : 0;   /* k = n - 2 */
    double from_last = S * tau + c_last;                                     /* k = n - 1 */
    double t = from_first > from_last ? from_first : from_last;
    return t > from_second_last ? t : from_second_last;
}

/* (4) Network slower than backward (beta >= tau): it is busy from the first bucket on, and
   T(B) = B tau + (S/B) alpha + S beta, smallest at B = sqrt(S alpha / tau): the wait for the first
   bucket against one latency per bucket. Faster network: T(B) = S tau + alpha + beta B once it
   keeps up, which it does from B = alpha / (tau - beta) on; below that the first formula holds.
   The best B is the smaller-cost of the two points. Buckets come in whole numbers, so look
   around each point with (3) for the exact best. */
double lab_best_bucket(lab_line net, double S, double tau) {
    double cand[2], best = S, bt = lab_step_time(net, S, tau, S);
    int i, j;
    cand[0] = sqrt(S * net.alpha_s / tau);
    cand[1] = net.beta_s_per_byte < tau ? net.alpha_s / (tau - net.beta_s_per_byte) : cand[0];
    for (i = 0; i < 2; i++)
        for (j = -200; j <= 200; j++) { /* from half to twice the point */
            double b = cand[i] * pow(2.0, j / 200.0), t;
            if (b > S) b = S;
            if (b <= 0) continue;
            t = lab_step_time(net, S, tau, b);
            if (t < bt) bt = t, best = b;
        }
    return best;
}
