/* The AVX2 and AVX-512 twins of draw.c's scans of a row, included by draw.c after the scalar
 * versions they mirror (and whose helpers they use).
 *
 * Invariant: each twin makes its scalar version's decisions, in id order, with the same double
 * operations where they decide anything (the comments say how), so which scan runs changes
 * speed only; tests/test_sampling_native.py runs every scan the CPU has against numpy.
 */
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

#if defined(HAVE_OPEN_AVX2)
/* first_maximum four values at a time in four running maxima: the same index (the maximum is
 * one of the values, and the first lane equal to it, or the first NaN, is found in index
 * order; a NaN that max_pd lets into a running maximum matters only where the row has one, and
 * then the NaN is what is looked for). */
__attribute__((target("avx2"))) static int first_maximum_avx2(const double *x, size_t n,
                                                              size_t *index)
{
    enum { RUNNING = 4, BLOCK = 4 * RUNNING };
    __m256d top[RUNNING], nan = _mm256_setzero_pd();
    for (int a = 0; a < RUNNING; a++) top[a] = _mm256_set1_pd(x[0]);
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int a = 0; a < RUNNING; a++) {
            const __m256d values = _mm256_loadu_pd(x + i + 4 * a);
            nan = _mm256_or_pd(nan, _mm256_cmp_pd(values, values, _CMP_UNORD_Q));
            top[a] = _mm256_max_pd(top[a], values);
        }
    double lanes[BLOCK];
    for (int a = 0; a < RUNNING; a++) _mm256_storeu_pd(lanes + 4 * a, top[a]);
    double best = lanes[0];
    for (int j = 1; j < BLOCK; j++) best = lanes[j] > best ? lanes[j] : best;
    int any_nan = _mm256_movemask_pd(nan) != 0;
    for (; i < n; i++) {
        any_nan |= x[i] != x[i];
        best = x[i] > best ? x[i] : best;
    }
    const __m256d wanted = _mm256_set1_pd(best);
    for (i = 0; i + 4 <= n; i += 4) {
        const __m256d values = _mm256_loadu_pd(x + i);
        const int hit = _mm256_movemask_pd(any_nan
                                               ? _mm256_cmp_pd(values, values, _CMP_UNORD_Q)
                                               : _mm256_cmp_pd(values, wanted, _CMP_EQ_OQ));
        if (hit) {
            *index = i + (size_t)__builtin_ctz((unsigned)hit);
            return -any_nan;
        }
    }
    for (; any_nan ? x[i] == x[i] : !(x[i] == best); i++) continue;
    *index = i;
    return -any_nan;
}
#endif

/* pshufb masks that move the 32-bit lanes a 4-bit mask keeps to the front, in lane order. */
static const uint8_t kept_lanes_front[16][16] = {
#define LANE_BYTES(l) 4 * (l), 4 * (l) + 1, 4 * (l) + 2, 4 * (l) + 3
#define NONE 0x80, 0x80, 0x80, 0x80
    {NONE, NONE, NONE, NONE},
    {LANE_BYTES(0), NONE, NONE, NONE},
    {LANE_BYTES(1), NONE, NONE, NONE},
    {LANE_BYTES(0), LANE_BYTES(1), NONE, NONE},
    {LANE_BYTES(2), NONE, NONE, NONE},
    {LANE_BYTES(0), LANE_BYTES(2), NONE, NONE},
    {LANE_BYTES(1), LANE_BYTES(2), NONE, NONE},
    {LANE_BYTES(0), LANE_BYTES(1), LANE_BYTES(2), NONE},
    {LANE_BYTES(3), NONE, NONE, NONE},
    {LANE_BYTES(0), LANE_BYTES(3), NONE, NONE},
    {LANE_BYTES(1), LANE_BYTES(3), NONE, NONE},
    {LANE_BYTES(0), LANE_BYTES(1), LANE_BYTES(3), NONE},
    {LANE_BYTES(2), LANE_BYTES(3), NONE, NONE},
    {LANE_BYTES(0), LANE_BYTES(2), LANE_BYTES(3), NONE},
    {LANE_BYTES(1), LANE_BYTES(2), LANE_BYTES(3), NONE},
    {LANE_BYTES(0), LANE_BYTES(1), LANE_BYTES(2), LANE_BYTES(3)},
#undef LANE_BYTES
#undef NONE
};

/* collect() four tokens at a time with AVX2 (the last, partial four one token at a time), with
 * the same decisions in the same id order and the same buckets: for the top-k draw,
 * scaled_at_least's tests (a token whose product falls within the margin is decided by the
 * quotient) and buckets from the rough s, clamped as collect() clamps them; for top-p, the
 * quotient's difference and its bucket. Returns the count. */
__attribute__((target("avx2"))) static size_t collect_avx2(const struct draw_request *r,
                                                           const struct scaling *z, double s0,
                                                           int for_top_p, uint32_t *ids,
                                                           uint32_t *buckets)
{
    const double *x = r->x;
    const double lower = s0 - IRRELEVANT_BELOW, margin = margin_of(z, lower);
    const int approximate = !for_top_p && z->approximate;
    const __m256d loose = _mm256_set1_pd(lower - margin), sure = _mm256_set1_pd(lower + margin);
    const __m256d bound = _mm256_set1_pd(lower), inverse = _mm256_set1_pd(z->inverse);
    const __m256d temperature = _mm256_set1_pd(for_top_p ? r->temperature : z->temperature);
    const __m256d top = _mm256_set1_pd(s0), per_unit = _mm256_set1_pd(BUCKETS_PER_UNIT);
    const __m256d zero = _mm256_setzero_pd(), deepest = _mm256_set1_pd(DEEPEST);
    const __m256d relevant_from = _mm256_set1_pd(TOP_P_RELEVANT_FROM);
    const __m256d sign = _mm256_set1_pd(-0.0);
    __m128i lane_ids = _mm_setr_epi32(0, 1, 2, 3);
    const __m128i step = _mm_set1_epi32(4);
    size_t count = 0, i = 0;
    for (; i + 4 <= r->vocab; i += 4, lane_ids = _mm_add_epi32(lane_ids, step)) {
        const __m256d values = _mm256_loadu_pd(x + i);
        int keep;
        __m256d depth;
        if (for_top_p) {
            const __m256d difference = _mm256_sub_pd(_mm256_div_pd(values, temperature), top);
            keep = _mm256_movemask_pd(_mm256_cmp_pd(difference, relevant_from, _CMP_GE_OQ));
            depth = _mm256_mul_pd(_mm256_xor_pd(difference, sign), per_unit);
        } else {
            const __m256d rough = approximate ? _mm256_mul_pd(values, inverse)
                                              : _mm256_div_pd(values, temperature);
            if (approximate) {
                keep = _mm256_movemask_pd(_mm256_cmp_pd(rough, sure, _CMP_GE_OQ));
                int unsure = _mm256_movemask_pd(_mm256_cmp_pd(rough, loose, _CMP_GE_OQ)) & ~keep;
                while (unsure) {
                    const int lane = __builtin_ctz((unsigned)unsure);
                    unsure &= unsure - 1;
                    if (x[i + (size_t)lane] / z->temperature >= lower) keep |= 1 << lane;
                }
            } else {
                keep = _mm256_movemask_pd(_mm256_cmp_pd(rough, bound, _CMP_GE_OQ));
            }
            depth = _mm256_min_pd(_mm256_max_pd(_mm256_mul_pd(_mm256_sub_pd(top, rough),
                                                              per_unit), zero), deepest);
        }
        /* Depths of kept lanes lie in [0, DEEPEST]: the signed conversion is exact there. */
        const __m128i bucket = _mm256_cvttpd_epi32(depth);
        const __m128i front = _mm_loadu_si128((const __m128i *)kept_lanes_front[keep]);
        /* count <= i and i + 4 <= vocab: four entries fit; only the kept ones count. */
        _mm_storeu_si128((__m128i *)(ids + count), _mm_shuffle_epi8(lane_ids, front));
        _mm_storeu_si128((__m128i *)(buckets + count), _mm_shuffle_epi8(bucket, front));
        count += (size_t)__builtin_popcount((unsigned)keep);
    }
    for (; i < r->vocab; i++) {
        const double value = x[i];
        int kept;
        uint32_t bucket;
        if (for_top_p) {
            const double difference = value / r->temperature - s0;
            kept = difference >= TOP_P_RELEVANT_FROM;
            bucket = depth_bucket(-difference * BUCKETS_PER_UNIT, kept);
        } else {
            const double rough = rough_scaled(z, value);
            kept = approximate ? rough >= lower + margin ||
                                     (rough >= lower - margin && value / z->temperature >= lower)
                               : rough >= lower;
            const double depth = (s0 - rough) * BUCKETS_PER_UNIT;
            bucket = (uint32_t)(depth < 0.0 ? 0.0 : depth < DEEPEST ? depth : DEEPEST);
        }
        ids[count] = (uint32_t)i;
        buckets[count] = bucket;
        count += (size_t)kept;
    }
    return count;
}

#if defined(HAVE_OPEN_AVX512)
/* collect() eight tokens at a time on AVX-512 (the last, partial eight masked), with the same
 * decisions in the same id order and the same buckets: for the top-k draw, scaled_at_least's
 * tests (a lane whose product falls within the margin is decided by the quotient, one lane at
 * a time) and buckets from the rough s, clamped as collect() clamps them; for top-p, the
 * quotient's difference and its bucket. Returns the count. */
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
    const __m512d sign = _mm512_set1_pd(-0.0), minus_infinity = _mm512_set1_pd(-INFINITY);
    const int approximate = !for_top_p && z->approximate;
    __m256i lane_ids = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    size_t count = 0;
    for (size_t i = 0; i < r->vocab; i += 8, lane_ids = _mm256_add_epi32(lane_ids, step)) {
        /* The last lanes past the row read as -inf, which no test keeps. */
        const size_t left = r->vocab - i;
        const __mmask8 lanes = left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1);
        const __m512d values = _mm512_mask_loadu_pd(minus_infinity, lanes, x + i);
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
                    if (x[i + (size_t)lane] / z->temperature >= lower)
                        keep |= (__mmask8)(1 << lane);
                }
            } else {
                keep = _mm512_cmp_pd_mask(rough, _mm512_set1_pd(lower), _CMP_GE_OQ);
            }
            depth = _mm512_min_pd(_mm512_max_pd(_mm512_mul_pd(_mm512_sub_pd(top, rough),
                                                              per_unit), zero), deepest);
        }
        const __m256i bucket = _mm512_cvttpd_epu32(_mm512_maskz_mov_pd(keep, depth));
        const __m256i kept_ids = _mm256_maskz_compress_epi32(keep, lane_ids);
        const __m256i kept_buckets = _mm256_maskz_compress_epi32(keep, bucket);
        if (lanes == 0xff) { /* count <= i and i + 8 <= vocab: eight entries fit */
            _mm256_storeu_si256((__m256i *)(ids + count), kept_ids);
            _mm256_storeu_si256((__m256i *)(buckets + count), kept_buckets);
        } else { /* only the kept entries, as the buffers may end there */
            const __mmask8 written = (__mmask8)((1u << __builtin_popcount(keep)) - 1);
            _mm256_mask_storeu_epi32(ids + count, written, kept_ids);
            _mm256_mask_storeu_epi32(buckets + count, written, kept_buckets);
        }
        count += (size_t)__builtin_popcount(keep);
    }
    return count;
}
#endif

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
