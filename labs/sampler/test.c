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
        lab_failf("[rule S4: set *count] n = %d, replicas = %d, rank = %d, drop_last = %d: *count was never set", n, R, r,
                  drop_last);
        return -1;
    }
    if (count < 0 || count > n + R) {
        lab_failf("[rule S4: every rank gets ceil(n / replicas) indices, floor with drop_last] n = %d, replicas = %d, "
                  "rank = %d, drop_last = %d: *count = %d, which no rank can have", n, R, r, drop_last, count);
        return -1;
    }
    for (k = count; k < n + R + GUARD; k++)
        if (out[k] != SENTINEL) {
            lab_failf("[rule S5: write only out[0 .. *count)] n = %d, replicas = %d, rank = %d, drop_last = %d: *count = "
                      "%d but out[%d] was written too", n, R, r, drop_last, count, k);
            return -1;
        }
    return count;
}

/* Compare the student's answer with `want`, want_n entries; a difference names the rule it breaks. */
static void expect_indices(int n, int R, int r, int drop_last, const int* order, const int* want, int want_n) {
    int out[256], count = student(n, R, r, drop_last, order, out), k;
    char setting[1200];
    if (count < 0) return;
    if (count == want_n && !memcmp(out, want, sizeof(int) * (size_t)want_n)) return;
    snprintf(setting, sizeof setting, "n = %d, replicas = %d, rank = %d, drop_last = %d, order %s: expected %s (count %d), "
             "got %s (count %d)", n, R, r, drop_last, fmt_list(order, n), fmt_list(want, want_n), want_n,
             fmt_list(out, count), count);
    if (count != want_n && drop_last)
        lab_failf("[rule S3: drop_last cuts the list to floor(n / replicas) per rank] %s", setting);
    else if (count != want_n)
        lab_failf("[rule S4: every rank gets ceil(n / replicas) indices: the list is padded] %s", setting);
    else {
        for (k = 0; k < count && out[k] == want[k]; k++) {
        }
        if (r + k * R >= n)
            lab_failf("[rule S2: padding repeats the list from its start, position p holding order[p %% n]] %s (index %d "
                      "comes from position %d, past the end of the list)", setting, k, r + k * R);
        else
            lab_failf("[rule S1: rank r takes positions r, r + replicas, r + 2 replicas, ...] %s (index %d is position "
                      "%d of the list)", setting, k, r + k * R);
    }
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
                    EXPECT(c == first, "[rule S4: every rank gets the same count] n = %d, replicas = %d, drop_last = %d: "
                           "rank 0 gets %d indices, rank %d gets %d: every rank must take the same number of steps", n, R,
                           drop_last, first, r, c);
                    for (k = 0; k < c; k++)
                        if (out[k] >= 0 && out[k] < n) seen[out[k]]++;
                        else lab_failf("[rule S2: padding repeats the list, so every index is a sample] n = %d, "
                                       "replicas = %d, rank %d: index %d is not a sample (0 .. %d)", n, R, r,
                                       out[k], n - 1);
                    total += c;
                }
                if (lab_failed_checks == before) {
                    int want_total = drop_last ? n / R * R : (n + R - 1) / R * R, expected[32] = {0};
                    for (k = 0; k < want_total; k++) expected[order[k % n]]++; /* the padded or cut list */
                    EXPECT(total == want_total, "[rules S3-S4: the padded or cut list, all of it] n = %d, replicas = %d, "
                           "drop_last = %d: the ranks visit %d positions "
                           "together, expected %d", n, R, drop_last, total, want_total);
                    for (k = 0; k < n; k++)
                        EXPECT(seen[k] == expected[k], "[rules S1-S2: together the ranks visit each position once] n = %d, "
                               "replicas = %d, drop_last = %d: sample %d is visited %d "
                               "time(s) by all ranks together, expected %d", n, R, drop_last, k, seen[k], expected[k]);
                }
                reported += lab_failed_checks != before;
            }
    if (reported >= 3) lab_note("(stopped after three failing settings)");
}

/* The same answer as ddp.h's sampler for every setting: ddp_sampler_indices shuffles with
   ddp_permutation(n, seed + epoch), or keeps the order 0..n-1 with in_order. */
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
                        d.num_replicas = R, d.rank = r, d.seed = 7, d.drop_last = drop_last, d.in_order = !shuffle;
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

/* Larger settings from the seed (LAB_SEED): up to 10000 samples and 64 replicas, against ddp.h. */
static void random_settings_match_ddp_h(void) {
    static int order[10000], want[10000 + 64], out[10000 + 64 + GUARD];
    lab_rng g;
    int t;
    lab_rng_seed(&g, lab_seed(), 21);
    lab_note("seed %llu (LAB_SEED)", (unsigned long long)lab_seed());
    for (t = 0; t < 40 && lab_failed_checks == 0; t++) {
        int n = (int)lab_rng_below(&g, t < 20 ? 200 : 10000), R = 1 + (int)lab_rng_below(&g, 64);
        int r = (int)lab_rng_below(&g, (size_t)R), drop_last = (int)lab_rng_below(&g, 2), c, k;
        ddp_sampler s;
        ddp_sampler_desc d;
        memset(&d, 0, sizeof d);
        d.num_replicas = R, d.rank = r, d.seed = lab_seed() + (uint64_t)t, d.drop_last = drop_last;
        if (ddp_sampler_init(&s, n, &d) != DDP_OK) {
            lab_failf("ddp_sampler_init failed: %s", ddp_error_string());
            return;
        }
        ddp_sampler_set_epoch(&s, t);
        ddp_sampler_indices(&s, want);
        ddp_permutation(n, d.seed + (uint64_t)t, order);
        c = student(n, R, r, drop_last, order, out);
        if (c < 0) return;
        for (k = 0; k < c && k < s.num_samples && out[k] == want[k]; k++) {
        }
        if (c != s.num_samples || k < c) {
            int before = lab_failed_checks;
            if (c <= 200 && n <= 200) expect_indices(n, R, r, drop_last, order, want, s.num_samples);
            if (lab_failed_checks == before)
                lab_failf("[rule %s] n = %d, replicas = %d, rank = %d, drop_last = %d: %d indices, expected %d; the first "
                          "difference at index %d (position %d of the list)",
                          c != s.num_samples ? (drop_last ? "S3: drop_last cuts to floor(n / replicas)"
                                                          : "S4: every rank gets ceil(n / replicas)")
                          : r + k * R >= n ? "S2: padding repeats the list from its start"
                                           : "S1: rank r takes positions r, r + replicas, ...",
                          n, R, r, drop_last, c, s.num_samples, k, r + k * R);
        }
    }
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
    LAB_CASE(random_settings_match_ddp_h, 10);
    return lab_end();
}
