/* Step 7 of SAMPLER.md (top-p), deciding the cut without summing the whole tail when a bracket
 * on the total suffices.
 *
 * Invariant: top_p_keep returns n + 1 for the first index n, in step 4's order, with
 * c[n] >= top_p * c[-1], where c are the sequential float64 sums of exp(s - s0) (exactdraft's
 * own exp, float64_math.h, the twin of the Python definition's) over the sorted candidates. Every prefix sum it
 * compares is computed as the reference computes it, so the answer is exact.
 *
 * Candidates with d = s - s0 < -38 are left out: each adds exp(d) < 2**-54 to a running sum of
 * at least exp(0) = 1 (at least 1/2 for any faithful exp), which rounding to nearest leaves
 * unchanged; and they sort after all others, so neither c[-1] nor the cut moves.
 *
 * Exhaustive path: sort the candidates and sum them all.
 *
 * Bounded path: with buckets b = floor(-d * 256) (see draw.h), the candidates of the buckets
 * below a bound B are a prefix of the sorted order; that prefix is sorted and summed exactly,
 * ending at C. Each later candidate adds exp(d) in [exp(-(b+1)/256), exp(-b/256)], so c[-1]
 * lies in [(C + L)(1 - eta), (C + H)(1 + eta)], with L and H those bounds summed over the tail
 * and eta covering the rounding of the remaining additions (2**-53 relative each), of the
 * bounds' own sums, and the error of the exp (taken below 1e-12 relative; exactdraft's is
 * within a few ulps). If the first prefix sum reaching top_p times the bracket's top comes right
 * after one below top_p times its bottom, that index is the cut for every total in the bracket,
 * hence for c[-1]; otherwise the exhaustive path decides. B is placed where the tail's
 * uncertainty falls under a sixteenth of a term at the estimated cut, so that is rare.
 */
#include <float.h>
#include <math.h>

#include "float64_math.h"

#include "draw.h"

#define EXHAUSTIVE_MAX 1024 /* fewer candidates than this: summing them all is cheaper */
#define WHOLE ((size_t)-1)  /* bounded(): the bound left no tail, so no bracket was made */

static double bucket_top[BUCKET_COUNT + 1]; /* exp(-b / 256) */
static int bucket_top_filled;
static uint32_t bucket_counts[BUCKET_COUNT];
static uint64_t path_counts[3];

void top_p_path_counts(uint64_t counts[3]) { memcpy(counts, path_counts, sizeof path_counts); }

/* Sequential sums of exp(s - s0) over the n sorted ids; returns the last. */
static double prefix_sums(const double *x, double temperature, double s0, const uint32_t *ids,
                          size_t n, double *sums)
{
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        total += xd_exp(x[ids[i]] / temperature - s0);
        sums[i] = total;
    }
    return total;
}

static size_t first_reaching(const double *sums, size_t n, double threshold)
{
    size_t i = 0;
    while (i < n && sums[i] < threshold) i++;
    return i;
}

static size_t exhaustive(const double *x, double temperature, double s0, double top_p,
                         struct candidates *c, struct sort_space *space, double *sums,
                         const uint32_t **sorted)
{
    fill_keys(x, c->top_key, c->ids, c->keys, c->count);
    *sorted = sort_by_key(c->keys, c->ids, space->keys[0], space->ids[0], c->count);
    double total = prefix_sums(x, temperature, s0, *sorted, c->count, sums);
    return first_reaching(sums, c->count, top_p * total) + 1;
}

/* Counts the buckets; returns the bound B: every bucket below it is summed exactly. */
static size_t choose_bound(const struct candidates *c, double top_p, size_t *used)
{
    if (!bucket_top_filled) {
        for (size_t b = 0; b <= BUCKET_COUNT; b++)
            bucket_top[b] = xd_exp(-(double)b / BUCKETS_PER_UNIT);
        bucket_top_filled = 1;
    }
    *used = count_buckets(c, bucket_counts);
    double high = 0.0;
    for (size_t b = 0; b < *used; b++) high += bucket_counts[b] * bucket_top[b];
    /* The cut lies in or before the first bucket whose low running mass reaches the target. */
    double low = 0.0, target = top_p * high;
    size_t cut = 0;
    while (cut + 1 < *used && (low += bucket_counts[cut] * bucket_top[cut + 1]) < target) cut++;
    /* Extend B until the tail's uncertainty is under a sixteenth of a term at the cut. */
    double allowed = bucket_top[cut + 1] / 16.0, uncertain = 0.0;
    size_t bound = *used;
    while (bound > cut + 1) {
        size_t b = bound - 1;
        uncertain += bucket_counts[b] * (bucket_top[b] - bucket_top[b + 1]);
        if (uncertain > allowed) break;
        bound = b;
    }
    return bound;
}

static size_t bounded(const double *x, double temperature, double s0, double top_p,
                      struct candidates *c, struct sort_space *space, double *sums,
                      const uint32_t **sorted)
{
    size_t used, bound = choose_bound(c, top_p, &used);
    if (bound >= used) return WHOLE;
    double tail_low = 0.0, tail_high = 0.0;
    for (size_t b = bound; b < used; b++) {
        tail_low += bucket_counts[b] * bucket_top[b + 1];
        tail_high += bucket_counts[b] * bucket_top[b];
    }
    uint32_t *ids = space->ids[0];
    uint64_t *keys = space->keys[0];
    size_t region = 0;
    for (size_t i = 0; i < c->count; i++) { /* branch-free: written, then kept or not */
        ids[region] = c->ids[i];
        region += c->buckets[i] < bound;
    }
    fill_keys(x, c->top_key, ids, keys, region);
    *sorted = sort_by_key(keys, ids, space->keys[1], space->ids[1], region);
    double exact = prefix_sums(x, temperature, s0, *sorted, region, sums);
    const double eta = 1e-9 + 4.0 * (double)(c->count + BUCKET_COUNT) * DBL_EPSILON;
    double threshold_low = top_p * (exact + tail_low) * (1.0 - eta);
    double threshold_high = top_p * (exact + tail_high) * (1.0 + eta);
    size_t n = first_reaching(sums, region, threshold_high);
    if (n < region && (n == 0 || sums[n - 1] < threshold_low)) return n + 1;
    return 0;
}

size_t top_p_keep(const double *x, double temperature, double s0, double top_p,
                  struct candidates *c, struct sort_space *space, double *sums,
                  enum top_p_path path, const uint32_t **sorted)
{
    if (path == TOP_P_BOUNDED || (path == TOP_P_AUTO && c->count > EXHAUSTIVE_MAX)) {
        size_t kept = bounded(x, temperature, s0, top_p, c, space, sums, sorted);
        path_counts[kept == WHOLE ? 0 : kept ? 1 : 2]++;
        if (kept != WHOLE && kept) return kept;
    } else {
        path_counts[0]++;
    }
    return exhaustive(x, temperature, s0, top_p, c, space, sums, sorted);
}
