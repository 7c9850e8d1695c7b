/* SAMPLER.md's draw, steps 3-9, on the processed float64 logits row x.
 *
 * Invariant: draw() returns the token SAMPLER.md defines for (x, temperature, top_k, top_p,
 * min_p, seed, pos), the token the numpy path of exactdraft/sampling/keyed.py returns, and fails
 * where that path raises (NaN in x, no finite best scaled score, a kept candidate whose keyed
 * uniform rounds to 1.0, where -log(-log(u)) is undefined).
 *
 * Why no near-tie fallback is needed: the definition's exp and log are exactdraft's own
 * (exactdraft/float64_math.py), and this code runs their C twins (float64_math.h), the same
 * sequence of IEEE double operations, so they return the same bits for every argument on
 * every machine. Every other step is an IEEE double operation (division, subtraction,
 * addition, multiplication, comparison) rounded to nearest, identical in Python and here
 * provided the compiler emits each one as written: the build uses -ffp-contract=off (no fused
 * multiply-add) and no -ffast-math, and the checks below refuse a build whose double
 * arithmetic is not evaluated in double. So every score, top-p sum and min-p bound is the
 * reference's value, and ties are decided exactly.
 *
 * Work is skipped only where a proof says it cannot change the answer:
 * - a candidate more than IRRELEVANT_BELOW under the best scaled score s0 cannot win step 9:
 *   finite noise lies in [-3.63, 36.05], and the best candidate is always kept;
 * - without top-p nothing is sorted: the winner is the largest (score, x, -id), which is the
 *   first of the tied scores in (x descending, id ascending) order; top-k keeps the buckets
 *   (draw.h) before the one where the count reaches k and sorts only that one (order.c);
 * - top-p sums only what can move the cut (top_p.c);
 * - which tokens pass a bound on s = x / T is decided by x * fl(1 / T) where that is provably
 *   the same answer, by the division otherwise (scaled_at_least), and scores use the division;
 * - the row's maximum is found four tokens at a time with AVX2 and eight with AVX-512, and the
 *   candidates and buckets top-k and top-p start from eight at a time with AVX-512 (the same
 *   decisions, in id order);
 * - the plain draw (no top-k, no top-p) hashes the whole row in one branch-free scan, with
 *   AVX-512 or AVX2 where the CPU has it, and hands consider() only the tokens the cap test
 *   below lets through (open_candidates); the AVX2 scan's caps are never below the scalar
 *   ones, the AVX-512 scan's are the scalar ones;
 * - noise is computed only for a candidate that could still reach the best score so far:
 *   u <= (k + 1) * 2**-53 for k = key >> 11, so g <= -log(1 - u) <= (53 - floor(log2(2**53 -
 *   1 - k))) * ln 2, and a candidate whose s plus that cap plus a rounding slack is below the
 *   best score is passed over. Every kept candidate is still hashed, so a uniform of 1.0
 *   (k = 2**53 - 1, where k + 0.5 rounds up to 2**53) fails here exactly where numpy fails.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draw.h"
#include "float64_math.h"

#if defined(__FAST_MATH__)
#error "exactdraft._sampler needs IEEE arithmetic: build it without -ffast-math"
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "exactdraft._sampler needs double arithmetic evaluated in double (e.g. SSE2, not x87)"
#endif
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define GOLDEN 0x9E3779B97F4A7C15ull
#define POSITION_MULTIPLIER 0xD1B54A32D192ED03ull
#define IRRELEVANT_BELOW 45.0
#define LN2_ROUNDED_UP 0.6931471805599454 /* the double just above ln 2 */
#define DEEPEST ((double)(BUCKET_COUNT - 1)) /* deeper candidates are never kept */
#define LAST_UNIFORM_INDEX ((1ull << 53) - 1)

static inline uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Step 9 over candidates offered one at a time, in any order. */
struct contest {
    const double *x;
    double temperature;
    uint64_t position_key;
    const uint64_t *tokens; /* the request's token of each index, NULL: the index itself */
    double slack;
    double noise_cap[53]; /* by floor(log2(2**53 - 1 - k)) */
    double best_score, best_x;
    size_t best_id;
    int started;
};

static void start_contest(struct contest *c, const struct draw_request *r, double s0)
{
    c->x = r->x;
    c->temperature = r->temperature;
    c->position_key = mix(mix(r->seed + GOLDEN) ^ (r->pos * POSITION_MULTIPLIER));
    c->tokens = r->tokens;
    /* Covers the rounding of s + cap, of s + g, of the caps and of a rough s (within
     * 8 * 2**-53 * |s| of s), for |s| <= |s0| + 45. */
    c->slack = 1e-9 * (1.0 + fabs(s0));
    for (int bit = 0; bit < 53; bit++) c->noise_cap[bit] = (double)(53 - bit) * LN2_ROUNDED_UP;
    c->started = 0;
}

/* The 53-bit uniform index of the noise of row entry `id`, keyed by its token. */
static inline uint64_t uniform_index(const struct contest *c, size_t id)
{
    return mix(c->position_key ^ (c->tokens ? c->tokens[id] : (uint64_t)id)) >> 11;
}

/* Offers candidate id, whose scaled score x / T is rough_s up to 8 * 2**-53 * |rough_s|;
 * 0, or -1 when the token's uniform is 1.0. */
static inline int consider(struct contest *c, size_t id, double rough_s)
{
    const uint64_t k = uniform_index(c, id);
    if (k == LAST_UNIFORM_INDEX) return -1;
    if (c->started) {
        const double cap = c->noise_cap[highest_bit(LAST_UNIFORM_INDEX - k)]; /* k < 2**53-1 */
        if (rough_s + cap + c->slack < c->best_score) return 0;
    }
    const double value = c->x[id];
    const double u = ((double)k + 0.5) * 0x1p-53;
    const double score = value / c->temperature + -xd_log(-xd_log(u));
    if (!c->started || score > c->best_score ||
        (score == c->best_score &&
         (value > c->best_x || (value == c->best_x && id < c->best_id)))) {
        c->best_score = score;
        c->best_x = value;
        c->best_id = id;
        c->started = 1;
    }
    return 0;
}

/* x / T, or when approximate x * fl(1 / T): within 3.01 * 2**-53 * |x / T| of it while 1 / T
 * is a normal number and nothing overflows; a comparison with a bound decided by the product
 * outside margin_of(bound) has the quotient's answer. */
struct scaling {
    double temperature, inverse;
    int approximate;
};

static struct scaling scaling_for(double temperature, double s0)
{
    struct scaling z = {temperature, 1.0 / temperature, 0};
    z.approximate = isnormal(z.inverse) && fabs(s0) < 0x1p40;
    return z;
}

static inline double rough_scaled(const struct scaling *z, double x)
{
    return z->approximate ? x * z->inverse : x / z->temperature;
}

static double margin_of(const struct scaling *z, double bound)
{
    return z->approximate ? 4.0 * DBL_EPSILON * (fabs(bound) + 1.0) : 0.0;
}

/* (uint32_t)depth when valid (then 0 <= depth < BUCKET_COUNT), else 0; masking the bits, not
 * branching, since validity follows the data. */
static inline uint32_t depth_bucket(double depth, int valid)
{
    uint64_t bits;
    memcpy(&bits, &depth, sizeof bits);
    bits &= 0 - (uint64_t)valid;
    memcpy(&depth, &bits, sizeof bits);
    return (uint32_t)depth;
}

/* The candidates of the plain draw (no top-k or top-p: those with x / T >= lower) in one pass
 * without branches on the data, for consider() to decide: every token whose rough score (the
 * product, or the quotient when exact) clears lower less its margin is hashed, and goes to
 * hopeful[0..*open) unless the cap test against the best score so far (a lower bound of every
 * later one) proves it cannot win; consider() then checks x / T >= lower exactly. Returns 1
 * when a token that may be kept has a uniform of 1.0: the caller then redoes the draw one
 * candidate at a time, to fail exactly where the definition does. */
static int open_scalar(const struct contest *c, const struct draw_request *r,
                       const struct scaling *z, double loose, size_t from, uint32_t *hopeful,
                       size_t *open)
{
    const double *x = r->x, best = c->best_score, slack = c->slack;
    uint64_t unit = 0;
    size_t n = *open;
    for (size_t i = from; i < r->vocab; i++) {
        const double rough = rough_scaled(z, x[i]);
        const uint64_t k = uniform_index(c, i);
        const int near = rough >= loose;
        unit |= (uint64_t)(near & (k == LAST_UNIFORM_INDEX));
        /* k = 2**53 - 1 takes the cap of 1 (bit 0); the flag above sends it to the slow path. */
        const uint64_t distance = LAST_UNIFORM_INDEX - k + (k == LAST_UNIFORM_INDEX);
        hopeful[n] = (uint32_t)i;
        n += near & (rough + c->noise_cap[highest_bit(distance)] + slack >= best);
    }
    *open = n;
    return unit != 0;
}

#include "draw_simd.h"

void widen_row(const float *row, double *out, size_t n)
{
#if defined(HAVE_OPEN_AVX2)
    if (scan_available(SCAN_AVX2)) {
        widen_avx2(row, out, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) out[i] = (double)row[i];
}

int scan_available(enum row_scan scan)
{
#if defined(HAVE_OPEN_AVX2)
    __builtin_cpu_init(); /* idempotent; needed before __builtin_cpu_supports in a library */
#endif
    switch (scan) {
    case SCAN_BEST:
    case SCAN_SCALAR:
        return 1;
#if defined(HAVE_OPEN_AVX2)
    case SCAN_AVX2:
        return __builtin_cpu_supports("avx2");
    case SCAN_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512vl");
#endif
    default:
        return 0;
    }
}

/* The scan `scan` stands for: SCAN_BEST is the best one this CPU runs. */
static enum row_scan resolve_scan(enum row_scan scan)
{
    static enum row_scan best = SCAN_BEST; /* decided once: the GIL serializes the calls */
    if (scan != SCAN_BEST) return scan;
    if (best == SCAN_BEST)
        best = scan_available(SCAN_AVX512) ? SCAN_AVX512
               : scan_available(SCAN_AVX2) ? SCAN_AVX2 : SCAN_SCALAR;
    return best;
}

static int open_candidates(const struct contest *c, const struct draw_request *r,
                           enum row_scan scan, const struct scaling *z, double lower,
                           uint32_t *hopeful, size_t *open)
{
    const double loose = lower - margin_of(z, lower);
    *open = 0;
#if defined(HAVE_OPEN_AVX2)
    /* The vector scans key the noise by index: a row of listed tokens takes the scalar one. */
    if (r->tokens) scan = SCAN_SCALAR;
    if (scan == SCAN_AVX512) return open_avx512(c, r, z, loose, hopeful, open);
    if (scan == SCAN_AVX2) return open_avx2(c, r, z, loose, hopeful, open);
#endif
    (void)scan;
    return open_scalar(c, r, z, loose, 0, hopeful, open);
}

/* Ids (ascending) of the tokens with x / T >= lower: a branch-free pass on the product keeps
 * a superset, then the few within the margin are checked by the quotient. */
static size_t scaled_at_least(const struct draw_request *r, const struct scaling *z,
                              double lower, uint32_t *ids)
{
    const double *x = r->x, inverse = z->inverse, temperature = z->temperature;
    const double margin = margin_of(z, lower), loose = lower - margin, sure = lower + margin;
    const size_t vocab = r->vocab;
    size_t count = 0, kept = 0;
    if (z->approximate) {
        for (size_t i = 0; i < vocab; i++) {
            ids[count] = (uint32_t)i;
            count += x[i] * inverse >= loose;
        }
        for (size_t j = 0; j < count; j++) {
            const double value = x[ids[j]];
            ids[kept] = ids[j];
            kept += value * inverse >= sure || value / temperature >= lower;
        }
        return kept;
    }
    for (size_t i = 0; i < vocab; i++) {
        ids[count] = (uint32_t)i;
        count += x[i] / temperature >= lower;
    }
    return count;
}

static struct {
    size_t capacity;
    void *block;
    uint64_t *keys[3];
    double *sums;
    uint32_t *ids[3], *buckets;
} scratch;

static int reserve(size_t n)
{
    if (n <= scratch.capacity) return 0;
    free(scratch.block);
    scratch.capacity = 0;
    scratch.block = malloc(n * (4 * sizeof(uint64_t) + 4 * sizeof(uint32_t)));
    if (!scratch.block) return -1;
    uint64_t *words = scratch.block;
    for (int a = 0; a < 3; a++) scratch.keys[a] = words + a * n;
    scratch.sums = (double *)(words + 3 * n);
    uint32_t *halves = (uint32_t *)(words + 4 * n);
    for (int a = 0; a < 3; a++) scratch.ids[a] = halves + a * n;
    scratch.buckets = halves + 3 * n;
    scratch.capacity = n;
    return 0;
}



/* The candidates in id order with their buckets: with s - s0 >= TOP_P_RELEVANT_FROM and
 * buckets from s when for_top_p, else with s >= s0 - IRRELEVANT_BELOW and buckets from the rough
 * s (a non-decreasing function of x). */
static void collect(const struct draw_request *r, enum row_scan scan, const struct scaling *z,
                    double s0, double best_x, int for_top_p, struct candidates *c)
{
    const double *x = r->x;
    c->ids = scratch.ids[2];
    c->keys = scratch.keys[2];
    c->buckets = scratch.buckets;
    c->top_key = order_key(best_x);
#if defined(HAVE_OPEN_AVX512)
    if (scan == SCAN_AVX512) {
        c->count = collect_avx512(r, z, s0, for_top_p, c->ids, c->buckets);
        return;
    }
#endif
#if defined(HAVE_OPEN_AVX2)
    if (scan == SCAN_AVX2) {
        c->count = collect_avx2(r, z, s0, for_top_p, c->ids, c->buckets);
        return;
    }
#endif
    (void)scan;
    if (!for_top_p) {
        c->count = scaled_at_least(r, z, s0 - IRRELEVANT_BELOW, c->ids);
        for (size_t j = 0; j < c->count; j++) {
            const double depth = (s0 - rough_scaled(z, x[c->ids[j]])) * BUCKETS_PER_UNIT;
            c->buckets[j] = (uint32_t)(depth < 0.0 ? 0.0 : depth < DEEPEST ? depth : DEEPEST);
        }
        return;
    }
    /* Every token is written, and kept by advancing the count: no branch on the data. */
    size_t count = 0;
    for (size_t i = 0; i < r->vocab; i++) {
        const double difference = x[i] / r->temperature - s0;
        const int relevant = difference >= TOP_P_RELEVANT_FROM;
        c->ids[count] = (uint32_t)i;
        c->buckets[count] = depth_bucket(-difference * BUCKETS_PER_UNIT, relevant);
        count += relevant;
    }
    c->count = count;
}

/* The first index of the largest value (-0.0 and +0.0 count as equal), or -1 with the first
 * NaN's index. Four running maxima keep the loop free of branches on the data. */
static int first_maximum(const double *x, size_t n, size_t *index)
{
    double best[4] = {x[0], x[0], x[0], x[0]};
    int nan = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int lane = 0; lane < 4; lane++) {
            const double value = x[i + lane];
            nan |= value != value;
            best[lane] = value > best[lane] ? value : best[lane];
        }
    }
    for (; i < n; i++) {
        nan |= x[i] != x[i];
        best[0] = x[i] > best[0] ? x[i] : best[0];
    }
    for (int lane = 1; lane < 4; lane++) best[0] = best[lane] > best[0] ? best[lane] : best[0];
    for (i = 0; nan ? x[i] == x[i] : !(x[i] == best[0]); i++) continue;
    *index = i;
    return -nan;
}


static struct draw_result outcome(enum draw_status status, size_t index, double value)
{
    struct draw_result result = {status, index, value};
    return result;
}

/* first_maximum with the scan's instructions. */
static int row_maximum(enum row_scan scan, const double *x, size_t n, size_t *index)
{
#if defined(HAVE_OPEN_AVX512)
    if (scan == SCAN_AVX512) return first_maximum_avx512(x, n, index);
#endif
#if defined(HAVE_OPEN_AVX2)
    if (scan == SCAN_AVX2) return first_maximum_avx2(x, n, index);
#endif
    (void)scan;
    return first_maximum(x, n, index);
}

struct draw_result draw(const struct draw_request *r)
{
    const double *x = r->x, temperature = r->temperature;
    size_t top = 0;
    const enum row_scan scan = resolve_scan(r->scan);
    const int nan = row_maximum(scan, x, r->vocab, &top);
    if (nan) return outcome(DRAW_NAN, top, 0.0);
    if (temperature == 0.0) return outcome(DRAW_OK, top, 0.0);
    const double best_x = x[top], s0 = best_x / temperature;
    if (!isfinite(s0)) return outcome(DRAW_NO_FINITE_MAXIMUM, 0, s0);
    const double keep_from = r->min_p > 0 ? s0 + xd_log(r->min_p) : -INFINITY;
    const struct scaling z = scaling_for(temperature, s0);
    struct contest contest;
    start_contest(&contest, r, s0);
    if (consider(&contest, top, s0)) return outcome(DRAW_UNIT_UNIFORM, top, 0.0);
    if (reserve(r->vocab)) return outcome(DRAW_NO_MEMORY, 0, 0.0);
    const int top_p_on = r->top_p < 1.0;
    if (!top_p_on && (r->top_k == 0 || r->top_k >= r->vocab)) {
        const double window = s0 - IRRELEVANT_BELOW;
        const double lower = keep_from > window ? keep_from : window;
        uint32_t *ids = scratch.ids[0];
        size_t open = 0;
        if (open_candidates(&contest, r, scan, &z, lower, ids, &open)) {
            size_t count = scaled_at_least(r, &z, lower, ids);
            for (size_t j = 0; j < count; j++)
                if (consider(&contest, ids[j], rough_scaled(&z, x[ids[j]])))
                    return outcome(DRAW_UNIT_UNIFORM, ids[j], 0.0);
            return outcome(DRAW_OK, contest.best_id, 0.0);
        }
        for (size_t j = 0; j < open; j++) {
            const uint32_t id = ids[j];
            if (x[id] / temperature >= lower) consider(&contest, id, rough_scaled(&z, x[id]));
        }
        return outcome(DRAW_OK, contest.best_id, 0.0);
    }
    struct candidates c;
    struct sort_space space = {{scratch.keys[0], scratch.keys[1]},
                               {scratch.ids[0], scratch.ids[1]}};
    collect(r, scan, &z, s0, best_x, top_p_on, &c);
    if (0 < r->top_k && r->top_k < c.count) keep_top_k(x, &c, r->top_k, &space);
    const uint32_t *kept = c.ids;
    size_t count = c.count;
    if (top_p_on)
        count = top_p_keep(x, temperature, s0, r->top_p, &c, &space, scratch.sums,
                           r->top_p_path, &kept);
    for (size_t i = 0; i < count; i++) {
        const double s = x[kept[i]] / temperature;
        if (s >= keep_from && consider(&contest, kept[i], s))
            return outcome(DRAW_UNIT_UNIFORM, kept[i], 0.0);
    }
    return outcome(DRAW_OK, contest.best_id, 0.0);
}
