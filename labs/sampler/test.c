/* labs/sampler/test.c: the tests of lab "sampler", built together with the student's file and
   ddp.h's implementation (the last cases compare with ddp_sampler_indices). */
#include "../lab_test.h"

#include "ddp.h"
#include "sampler.h"

#define GUARD 8
#define SENTINEL (-12345)

/* "[7 2 9]" into a static buffer (up to four in one message) */
static const char* fmt_list(const int* v, int n) {
    static char bufs[4][512];
    static int which;
    char* b = bufs[which = (which + 1) % 4];
    size_t pos = 0;
    int i;
    pos += (size_t)snprintf(b, sizeof bufs[0], "[");
    for (i = 0; i < n && pos < sizeof bufs[0] - 16; i++) pos += (size_t)snprintf(b + pos, sizeof bufs[0] - pos, "%s%d", i ? " " : "", v[i]);
    snprintf(b + pos, sizeof bufs[0] - pos, "%s]", i < n ? " ..." : "");
    return b;
}

/* Run the student's function with a guarded output buffer. Returns the count (-1 if it wrote
   outside what it reported). */
static int student(int n, int R, int r, int drop_last, const int* order, int* out) {
    int k, count = SENTINEL;
    for (k = 0; k < n + R + GUARD; k++) out[k] = SENTINEL;
    lab_sampler_indices(n, R, r, drop_last, order, out, &count);
    if (count == SENTINEL) {
        lab_failf("n = %d, replicas = %d, rank = %d, drop_last = %d: *count was never set", n, R, r, drop_last);
        return -1;
    }
    if (count < 0 || count > n + R) {
        lab_failf("n = %d, replicas = %d, rank = %d, drop_last = %d: *count = %d, which no rank can have "
                  "(0 .. ceil(n / replicas))", n, R, r, drop_last, count);
        return -1;
    }
    for (k = count; k < n + R + GUARD; k++)
        if (out[k] != SENTINEL) {
            lab_failf("n = %d, replicas = %d, rank = %d, drop_last = %d: *count = %d but out[%d] was written too",
                      n, R, r, drop_last, count, k);
            return -1;
        }
    return count;
}

/* Compare the student's answer with `want`, want_n entries. */
static void expect_indices(int n, int R, int r, int drop_last, const int* order, const int* want, int want_n) {
    int out[256], count = student(n, R, r, drop_last, order, out);
    if (count < 0) return;
    EXPECT(count == want_n && !memcmp(out, want, sizeof(int) * (size_t)want_n),
           "n = %d, replicas = %d, rank = %d, drop_last = %d, order %s: expected %s (count %d), got %s (count %d)", n,
           R, r, drop_last, fmt_list(order, n), fmt_list(want, want_n), want_n, fmt_list(out, count), count);
}

static void one_replica_is_the_order(void) {
    int order[7] = {3, 6, 0, 5, 1, 4, 2};
    expect_indices(7, 1, 0, 0, order, order, 7);
    expect_indices(7, 1, 0, 1, order, order, 7);
}

static void the_example_in_the_starter(void) {
    int order[10] = {7, 2, 9, 0, 4, 1, 8, 3, 6, 5};
    int want[4][3] = {{7, 4, 6}, {2, 1, 5}, {9, 8, 7}, {0, 3, 2}};
    int r;
    for (r = 0; r < 4; r++) expect_indices(10, 4, r, 0, order, want[r], 3);
    for (r = 0; r < 4; r++) expect_indices(10, 4, r, 1, order, want[r], 2);
}

static void n_a_multiple_of_replicas_needs_no_padding(void) {
    int order[12] = {11, 4, 7, 0, 2, 9, 5, 1, 10, 3, 8, 6};
    int want[3][4] = {{11, 0, 5, 3}, {4, 2, 1, 8}, {7, 9, 10, 6}};
    int r;
    for (r = 0; r < 3; r++) expect_indices(12, 3, r, 0, order, want[r], 4);
    for (r = 0; r < 3; r++) expect_indices(12, 3, r, 1, order, want[r], 4);
}

static void padding_repeats_from_the_start(void) {
    int order[5] = {4, 0, 3, 1, 2}; /* padded to 6: 4 0 3 1 2 | 4 */
    int want[3][2] = {{4, 1}, {0, 2}, {3, 4}};
    int r;
    for (r = 0; r < 3; r++) expect_indices(5, 3, r, 0, order, want[r], 2);
    for (r = 0; r < 3; r++) expect_indices(5, 3, r, 1, order, want[r], 1); /* cut to 3: one each */
}

static void fewer_samples_than_replicas(void) {
    int order[2] = {1, 0}; /* padded to 5: 1 0 1 0 1 */
    int want[5] = {1, 0, 1, 0, 1}, r;
    for (r = 0; r < 5; r++) expect_indices(2, 5, r, 0, order, want + r, 1);
    for (r = 0; r < 5; r++) expect_indices(2, 5, r, 1, order, want, 0); /* nothing left after the cut */
}

static void empty_data_set(void) {
    int order[1] = {0}, r;
    for (r = 0; r < 3; r++) expect_indices(0, 3, r, 0, order, order, 0);
    expect_indices(0, 1, 0, 1, order, order, 0);
}

/* Across every rank: each sample visited, padding only where it must be, everybody the same
   number of steps. */
static void ranks_together_cover_the_data_set(void) {
    int n, R, drop_last, reported = 0;
    for (n = 1; n <= 23 && reported < 3; n++)
        for (R = 1; R <= 6 && reported < 3; R++)
            for (drop_last = 0; drop_last < 2 && reported < 3; drop_last++) {
                int order[32], seen[32] = {0}, out[64], r, k, total = 0, first = -1, before = lab_failed_checks;
                ddp_permutation(n, (uint64_t)(n * 31 + R), order);
                for (r = 0; r < R; r++) {
                    int c = student(n, R, r, drop_last, order, out);
                    if (c < 0) break;
                    if (first < 0) first = c;
                    EXPECT(c == first, "n = %d, replicas = %d, drop_last = %d: rank 0 gets %d indices, rank %d gets %d: "
                           "every rank must take the same number of steps", n, R, drop_last, first, r, c);
                    for (k = 0; k < c; k++)
                        if (out[k] >= 0 && out[k] < n) seen[out[k]]++;
                        else lab_failf("n = %d, replicas = %d, rank %d: index %d is not a sample (0 .. %d)", n, R, r,
                                       out[k], n - 1);
                    total += c;
                }
                if (lab_failed_checks == before) {
                    int want_total = drop_last ? n / R * R : (n + R - 1) / R * R, expected[32] = {0};
                    for (k = 0; k < want_total; k++) expected[order[k % n]]++; /* the padded or cut list */
                    EXPECT(total == want_total, "n = %d, replicas = %d, drop_last = %d: the ranks visit %d positions "
                           "together, expected %d", n, R, drop_last, total, want_total);
                    for (k = 0; k < n; k++)
                        EXPECT(seen[k] == expected[k], "n = %d, replicas = %d, drop_last = %d: sample %d is visited %d "
                               "time(s) by all ranks together, expected %d", n, R, drop_last, k, seen[k], expected[k]);
                }
                reported += lab_failed_checks != before;
            }
    if (reported >= 3) lab_note("(stopped after three failing settings)");
}

/* The same answer as ddp.h's sampler for every setting: ddp_sampler_indices shuffles with
   ddp_permutation(n, seed + epoch), or keeps the order 0..n-1 with no_shuffle. */
static void matches_ddp_h_sampler(void) {
    int n, R, r, drop_last, shuffle, settings = 0, reported = 0;
    for (n = 0; n <= 40 && reported < 3; n++)
        for (R = 1; R <= 8 && reported < 3; R++)
            for (drop_last = 0; drop_last < 2; drop_last++)
                for (shuffle = 0; shuffle < 2; shuffle++)
                    for (r = 0; r < R && reported < 3; r++) {
                        ddp_sampler s;
                        ddp_sampler_desc d;
                        int order[48], want[48], k;
                        memset(&d, 0, sizeof d);
                        d.num_replicas = R, d.rank = r, d.seed = 7, d.drop_last = drop_last, d.no_shuffle = !shuffle;
                        if (ddp_sampler_init(&s, n, &d) != DDP_OK) {
                            lab_failf("ddp_sampler_init failed: %s", ddp_error_string());
                            return;
                        }
                        ddp_sampler_set_epoch(&s, n % 3);
                        ddp_sampler_indices(&s, want);
                        if (shuffle) ddp_permutation(n, 7 + (uint64_t)(n % 3), order);
                        else
                            for (k = 0; k < n; k++) order[k] = k;
                        k = lab_failed_checks;
                        expect_indices(n, R, r, drop_last, order, want, s.num_samples);
                        reported += lab_failed_checks != k;
                        settings++;
                    }
    if (reported >= 3) lab_note("(stopped after three differences)");
    else lab_note("%d settings (n 0..40, replicas 1..8, every rank, drop_last, shuffled or not) compared", settings);
}

int main(int argc, char** argv) {
    lab_begin(argc, argv);
    LAB_CASE(one_replica_is_the_order, 10);
    LAB_CASE(the_example_in_the_starter, 10);
    LAB_CASE(n_a_multiple_of_replicas_needs_no_padding, 10);
    LAB_CASE(padding_repeats_from_the_start, 10);
    LAB_CASE(fewer_samples_than_replicas, 10);
    LAB_CASE(empty_data_set, 10);
    LAB_CASE(ranks_together_cover_the_data_set, 10);
    LAB_CASE(matches_ddp_h_sampler, 10);
    return lab_end();
}
