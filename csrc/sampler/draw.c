/* SAMPLER.md's draw, steps 3-9, on the processed float64 logits row x.
 *
 * Invariant: draw() returns the token SAMPLER.md defines for (x, temperature, top_k, top_p,
 * min_p, seed, pos), the token the numpy path of exactdraft/sampling.py returns, and fails
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
 * - the row's maximum, and the candidates and buckets top-k and top-p start from, are found
 *   eight tokens at a time where the CPU has AVX-512 (the same decisions, in id order);
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
    /* Covers the rounding of s + cap, of s + g, of the caps and of a rough s (within
     * 8 * 2**-53 * |s| of s), for |s| <= |s0| + 45. */
    c->slack = 1e-9 * (1.0 + fabs(s0));
    for (int bit = 0; bit < 53; bit++) c->noise_cap[bit] = (double)(53 - bit) * LN2_ROUNDED_UP;
    c->started = 0;
}

/* Offers candidate id, whose scaled score x / T is rough_s up to 8 * 2**-53 * |rough_s|;
 * 0, or -1 when the token's uniform is 1.0. */
static inline int consider(struct contest *c, size_t id, double rough_s)
{
    const uint64_t k = mix(c->position_key ^ (uint64_t)id) >> 11;
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
        const uint64_t k = mix(c->position_key ^ (uint64_t)i) >> 11;
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

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_OPEN_AVX2 1

/* Lanes a * b modulo 2**64, b given as its low and high 32-bit halves. */
__attribute__((target("avx2"))) static inline __m256i multiply_low(__m256i a, __m256i b_low,
                                                                    __m256i b_high)
{
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b_low),
                                           _mm256_mul_epu32(a, b_high));
    return _mm256_add_epi64(_mm256_mul_epu32(a, b_low), _mm256_slli_epi64(cross, 32));
}

/* Lanes as doubles, for lanes below 2**52. */
__attribute__((target("avx2"))) static inline __m256d small_to_double(__m256i v)
{
    const __m256i magic = _mm256_set1_epi64x(0x4330000000000000ll);
    return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(v, magic)),
                         _mm256_castsi256_pd(magic));
}

/* open_scalar four tokens at a time (the rest by open_scalar), with the same hash and the same
 * rough scores; the cap is computed from the highest bit of (2**53 - 1 - k) >> 29 and taken as
 * the largest one (bit 0) below 2**29, so it is never below open_scalar's and the tokens let
 * through include open_scalar's. */
__attribute__((target("avx2"))) static int open_avx2(const struct contest *c,
                                                     const struct draw_request *r,
                                                     const struct scaling *z, double loose,
                                                     uint32_t *hopeful, size_t *open)
{
    const double *x = r->x;
    const __m256i m1_low = _mm256_set1_epi64x(0xBF58476D1CE4E5B9ll & 0xffffffffll);
    const __m256i m1_high = _mm256_set1_epi64x((long long)(0xBF58476D1CE4E5B9ull >> 32));
    const __m256i m2_low = _mm256_set1_epi64x(0x94D049BB133111EBll & 0xffffffffll);
    const __m256i m2_high = _mm256_set1_epi64x((long long)(0x94D049BB133111EBull >> 32));
    const __m256i key = _mm256_set1_epi64x((long long)c->position_key);
    const __m256i last = _mm256_set1_epi64x((long long)LAST_UNIFORM_INDEX);
    const __m256d scale = _mm256_set1_pd(z->approximate ? z->inverse : z->temperature);
    const __m256d loose4 = _mm256_set1_pd(loose), best = _mm256_set1_pd(c->best_score);
    const __m256d slack = _mm256_set1_pd(c->slack), ln2 = _mm256_set1_pd(LN2_ROUNDED_UP);
    const __m256d top_bit = _mm256_set1_pd(53.0 + 1023.0 - 29.0);
    const __m256d most = _mm256_set1_pd(53.0);
    __m256i ids = _mm256_setr_epi64x(0, 1, 2, 3), unit = _mm256_setzero_si256();
    const __m256i step = _mm256_set1_epi64x(4);
    size_t n = 0, i = 0;
    for (; i + 4 <= r->vocab; i += 4, ids = _mm256_add_epi64(ids, step)) {
        const __m256d values = _mm256_loadu_pd(x + i);
        const __m256d rough = z->approximate ? _mm256_mul_pd(values, scale)
                                             : _mm256_div_pd(values, scale);
        const __m256d near = _mm256_cmp_pd(rough, loose4, _CMP_GE_OQ);
        __m256i h = _mm256_xor_si256(key, ids);
        h = _mm256_xor_si256(h, _mm256_srli_epi64(h, 30));
        h = multiply_low(h, m1_low, m1_high);
        h = _mm256_xor_si256(h, _mm256_srli_epi64(h, 27));
        h = multiply_low(h, m2_low, m2_high);
        h = _mm256_xor_si256(h, _mm256_srli_epi64(h, 31));
        const __m256i k = _mm256_srli_epi64(h, 11);
        unit = _mm256_or_si256(unit, _mm256_and_si256(_mm256_castpd_si256(near),
                                                      _mm256_cmpeq_epi64(k, last)));
        /* exponent of the double (distance >> 29) is 1023 + its highest bit, 0 for 0 */
        const __m256d coarse = small_to_double(_mm256_srli_epi64(_mm256_sub_epi64(last, k), 29));
        const __m256d exponent = small_to_double(
            _mm256_srli_epi64(_mm256_castpd_si256(coarse), 52));
        /* 53 - bit, bit = exponent - 1023 + 29 (at least 0) */
        const __m256d lost = _mm256_min_pd(_mm256_sub_pd(top_bit, exponent), most);
        const __m256d reach = _mm256_add_pd(_mm256_add_pd(rough, _mm256_mul_pd(lost, ln2)),
                                            slack);
        const int hope = _mm256_movemask_pd(
            _mm256_and_pd(near, _mm256_cmp_pd(reach, best, _CMP_GE_OQ)));
        for (int lane = 0; lane < 4; lane++) {
            hopeful[n] = (uint32_t)(i + (size_t)lane);
            n += (hope >> lane) & 1;
        }
    }
    *open = n;
    const int tail = open_scalar(c, r, z, loose, i, hopeful, open);
    return tail || !_mm256_testz_si256(unit, unit);
}
#endif

#if defined(HAVE_OPEN_AVX2)
#define HAVE_OPEN_AVX512 1

/* open_scalar eight tokens at a time (the rest by open_scalar), with the same hash, the same
 * rough scores and the same caps: 53 - highest_bit(distance) is lzcnt(distance) - 10, and the
 * cap (53 - bit) * ln 2 and the sum rough + cap + slack are the same double operations, so
 * exactly open_scalar's tokens are let through. */
__attribute__((target("avx512f,avx512dq,avx512cd,avx512vl"))) static int open_avx512(
    const struct contest *c, const struct draw_request *r, const struct scaling *z,
    double loose, uint32_t *hopeful, size_t *open)
{
    const double *x = r->x;
    const __m512i m1 = _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ull);
    const __m512i m2 = _mm512_set1_epi64((long long)0x94D049BB133111EBull);
    const __m512i key = _mm512_set1_epi64((long long)c->position_key);
    const __m512i last = _mm512_set1_epi64((long long)LAST_UNIFORM_INDEX);
    const __m512i one = _mm512_set1_epi64(1), ten = _mm512_set1_epi64(10);
    const __m512d scale = _mm512_set1_pd(z->approximate ? z->inverse : z->temperature);
    const __m512d loose8 = _mm512_set1_pd(loose), best = _mm512_set1_pd(c->best_score);
    const __m512d slack = _mm512_set1_pd(c->slack), ln2 = _mm512_set1_pd(LN2_ROUNDED_UP);
    __m512i ids = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i ids32 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i step = _mm512_set1_epi64(8);
    const __m256i step32 = _mm256_set1_epi32(8);
    __mmask8 unit = 0;
    size_t n = 0, i = 0;
    /* hopeful[n .. n + 8) is written whole: n <= i and i + 8 <= vocab, the buffer's size. */
    for (; i + 8 <= r->vocab; i += 8) {
        const __m512d values = _mm512_loadu_pd(x + i);
        const __m512d rough = z->approximate ? _mm512_mul_pd(values, scale)
                                             : _mm512_div_pd(values, scale);
        const __mmask8 near = _mm512_cmp_pd_mask(rough, loose8, _CMP_GE_OQ);
        __m512i h = _mm512_xor_si512(key, ids);
        h = _mm512_mullo_epi64(_mm512_xor_si512(h, _mm512_srli_epi64(h, 30)), m1);
        h = _mm512_mullo_epi64(_mm512_xor_si512(h, _mm512_srli_epi64(h, 27)), m2);
        const __m512i k = _mm512_srli_epi64(_mm512_xor_si512(h, _mm512_srli_epi64(h, 31)), 11);
        const __mmask8 at_last = _mm512_cmpeq_epi64_mask(k, last);
        unit |= near & at_last;
        __m512i distance = _mm512_sub_epi64(last, k);
        distance = _mm512_mask_add_epi64(distance, at_last, distance, one);
        const __m512d lost =
            _mm512_cvtepi64_pd(_mm512_sub_epi64(_mm512_lzcnt_epi64(distance), ten));
        const __m512d reach = _mm512_add_pd(_mm512_add_pd(rough, _mm512_mul_pd(lost, ln2)),
                                            slack);
        const __mmask8 hope = near & _mm512_cmp_pd_mask(reach, best, _CMP_GE_OQ);
        _mm256_storeu_si256((__m256i *)(hopeful + n), _mm256_maskz_compress_epi32(hope, ids32));
        n += (size_t)__builtin_popcount(hope);
        ids = _mm512_add_epi64(ids, step);
        ids32 = _mm256_add_epi32(ids32, step32);
    }
    *open = n;
    const int tail = open_scalar(c, r, z, loose, i, hopeful, open);
    return tail || unit != 0;
}
#endif

#if defined(HAVE_OPEN_AVX2)
__attribute__((target("avx2"))) static void widen_avx2(const float *row, double *out, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) _mm256_storeu_pd(out + i, _mm256_cvtps_pd(_mm_loadu_ps(row + i)));
    for (; i < n; i++) out[i] = (double)row[i];
}
#endif

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

#if defined(HAVE_OPEN_AVX512)
/* collect() eight tokens at a time on AVX-512, with the same decisions in the same id order
 * and the same buckets: for the top-k draw, scaled_at_least's tests (a lane whose product
 * falls within the margin is decided by the quotient, one lane at a time) and buckets from
 * the rough s, clamped as collect() clamps them; for top-p, the quotient's difference and its
 * bucket. Returns the count. */
__attribute__((target("avx512f,avx512dq,avx512cd,avx512vl"))) static size_t collect_avx512(
    const struct draw_request *r, const struct scaling *z, double s0, int for_top_p,
    uint32_t *ids, uint32_t *buckets)
{
    const double *x = r->x;
    const double lower = s0 - IRRELEVANT_BELOW, margin = margin_of(z, lower);
    const __m512d loose = _mm512_set1_pd(lower - margin), sure = _mm512_set1_pd(lower + margin);
    const __m512d inverse = _mm512_set1_pd(z->inverse);
    const __m512d temperature = _mm512_set1_pd(for_top_p ? r->temperature : z->temperature);
    const __m512d top = _mm512_set1_pd(s0), per_unit = _mm512_set1_pd(BUCKETS_PER_UNIT);
    const __m512d zero = _mm512_setzero_pd(), deepest = _mm512_set1_pd(DEEPEST);
    const __m512d relevant_from = _mm512_set1_pd(TOP_P_RELEVANT_FROM);
    const __m512d sign = _mm512_set1_pd(-0.0);
    const int approximate = !for_top_p && z->approximate;
    __m256i lane_ids = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    size_t count = 0, i = 0;
    /* ids and buckets [count, count + 8) are written whole: count <= i, i + 8 <= vocab. */
    for (; i + 8 <= r->vocab; i += 8, lane_ids = _mm256_add_epi32(lane_ids, step)) {
        const __m512d values = _mm512_loadu_pd(x + i);
        __mmask8 keep;
        __m512d depth;
        if (for_top_p) {
            const __m512d difference = _mm512_sub_pd(_mm512_div_pd(values, temperature), top);
            keep = _mm512_cmp_pd_mask(difference, relevant_from, _CMP_GE_OQ);
            depth = _mm512_mul_pd(_mm512_xor_pd(difference, sign), per_unit);
        } else {
            const __m512d rough = approximate ? _mm512_mul_pd(values, inverse)
                                              : _mm512_div_pd(values, temperature);
            if (approximate) {
                keep = _mm512_cmp_pd_mask(rough, sure, _CMP_GE_OQ);
                __mmask8 unsure = _mm512_cmp_pd_mask(rough, loose, _CMP_GE_OQ) & ~keep;
                while (unsure) {
                    const int lane = __builtin_ctz(unsure);
                    unsure &= (__mmask8)(unsure - 1);
                    if (x[i + (size_t)lane] / z->temperature >= lower) keep |= (__mmask8)(1 << lane);
                }
            } else {
                keep = _mm512_cmp_pd_mask(rough, _mm512_set1_pd(lower), _CMP_GE_OQ);
            }
            depth = _mm512_min_pd(_mm512_max_pd(_mm512_mul_pd(_mm512_sub_pd(top, rough),
                                                              per_unit), zero), deepest);
        }
        const __m256i bucket = _mm512_cvttpd_epu32(_mm512_maskz_mov_pd(keep, depth));
        _mm256_storeu_si256((__m256i *)(ids + count), _mm256_maskz_compress_epi32(keep, lane_ids));
        _mm256_storeu_si256((__m256i *)(buckets + count), _mm256_maskz_compress_epi32(keep, bucket));
        count += (size_t)__builtin_popcount(keep);
    }
    for (; i < r->vocab; i++) {
        const double value = x[i];
        if (for_top_p) {
            const double difference = value / r->temperature - s0;
            ids[count] = (uint32_t)i;
            buckets[count] = depth_bucket(-difference * BUCKETS_PER_UNIT,
                                          difference >= TOP_P_RELEVANT_FROM);
            count += difference >= TOP_P_RELEVANT_FROM;
            continue;
        }
        const double rough = rough_scaled(z, value);
        const int kept = approximate ? rough >= lower - margin &&
                                           (rough >= lower + margin || value / z->temperature >= lower)
                                     : rough >= lower;
        if (!kept) continue;
        const double depth = (s0 - rough) * BUCKETS_PER_UNIT;
        ids[count] = (uint32_t)i;
        buckets[count++] = (uint32_t)(depth < 0.0 ? 0.0 : depth < DEEPEST ? depth : DEEPEST);
    }
    return count;
}
#endif

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

#if defined(HAVE_OPEN_AVX512)
/* first_maximum eight values at a time: the same index (the maximum is one of the values, and
 * the first lane equal to it, or the first NaN, is found in index order). */
__attribute__((target("avx512f,avx512dq,avx512cd,avx512vl"))) static int first_maximum_avx512(
    const double *x, size_t n, size_t *index)
{
    __m512d top = _mm512_set1_pd(x[0]);
    __mmask8 nan = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d values = _mm512_loadu_pd(x + i);
        nan |= _mm512_cmp_pd_mask(values, values, _CMP_UNORD_Q);
        top = _mm512_max_pd(top, values);
    }
    double best = _mm512_reduce_max_pd(top);
    int any_nan = nan != 0;
    for (; i < n; i++) {
        any_nan |= x[i] != x[i];
        best = x[i] > best ? x[i] : best;
    }
    const __m512d wanted = _mm512_set1_pd(best);
    for (i = 0; i + 8 <= n; i += 8) {
        const __m512d values = _mm512_loadu_pd(x + i);
        const __mmask8 hit = any_nan ? _mm512_cmp_pd_mask(values, values, _CMP_UNORD_Q)
                                     : _mm512_cmp_pd_mask(values, wanted, _CMP_EQ_OQ);
        if (hit) {
            *index = i + (size_t)__builtin_ctz(hit);
            return -any_nan;
        }
    }
    for (; any_nan ? x[i] == x[i] : !(x[i] == best); i++) continue;
    *index = i;
    return -any_nan;
}
#endif

static struct draw_result outcome(enum draw_status status, size_t index, double value)
{
    struct draw_result result = {status, index, value};
    return result;
}

struct draw_result draw(const struct draw_request *r)
{
    const double *x = r->x, temperature = r->temperature;
    size_t top = 0;
    const enum row_scan scan = resolve_scan(r->scan);
#if defined(HAVE_OPEN_AVX512)
    const int nan = scan == SCAN_AVX512 ? first_maximum_avx512(x, r->vocab, &top)
                                        : first_maximum(x, r->vocab, &top);
#else
    const int nan = first_maximum(x, r->vocab, &top);
#endif
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
