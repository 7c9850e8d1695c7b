/* What a dot-layout record (kernels.h) holds for a format, and the float steps that turn one
 * block's exact integer sums into an output's term: shared by the integer-dot matmul of every
 * level (dot_body.h) and the tile matmul (dot_tiles.h), after a level's dot_*.h primitives.
 *
 * Invariant: dot_block_term and dot_store_row are the only float steps of the integer-dot
 * matmul, one correctly rounded operation each in the order dot_body.h states, so every kernel
 * that feeds them the same exact integer sums writes the same bits.
 */

#include "lookup_values.h"

/* How many records ahead of the one in use the kernels prefetch. */
#define DOT_PREFETCH_RECORDS 16

/* Compile-time constants in every instance that uses them. */
#define NIBBLE_CODES(F) ((F) == FORMAT_Q4_0 || (F) == FORMAT_Q4_1 || (F) == FORMAT_Q4_K)
#define FLOAT_PARAMETERS(F) ((F) == FORMAT_Q4_K || (F) == FORMAT_Q5_K || (F) == FORMAT_Q6_K)
#define HAS_MINIMUM(F) ((F) == FORMAT_Q4_1 || (F) == FORMAT_Q5_1 || (F) == FORMAT_Q4_K || \
                        (F) == FORMAT_Q5_K)
/* Whether the codes carry an offset that the starts take out (set_dot_starts): else every
 * start is 0 and the row functions get starts = NULL. */
#define CODE_OFFSET(F) ((F) == FORMAT_Q4_0 || (F) == FORMAT_Q5_0 || (F) == FORMAT_Q6_K || \
                        (((F) == FORMAT_Q8_0 || LOOKUP_CODES(F)) && DOT_Q8_CODE_BIAS != 0))
#define PARAMETER_BYTES(F) \
    (LOOKUP_CODES(F) ? LOOKUP_PARAMETER_BYTES(F) : \
     (FLOAT_PARAMETERS(F) ? 4 : 2) * DOT_GROUP * (HAS_MINIMUM(F) || (F) == FORMAT_Q6_K ? 2 : 1))

/* The lanes' block scale of a lookup format (lookup_values.h): the float16 d of iq4_nl; the
 * float32 product d * (ls - 32) of iq4_xs (exact: at most 17 significant bits); mxfp4's
 * 2^(e - 128). */
static ALWAYS_INLINE dv dot_lookup_scale(const int format, const uint8_t *record,
                                         ptrdiff_t lane0)
{
    if (format == FORMAT_MXFP4) return dv_load_e8m0_half(record + lane0);
    const dv d = dv_load_half((const uint16_t *)record + lane0);
    if (format == FORMAT_IQ4_XS)
        return dv_mul(d, dv_load_int8((const int8_t *)record + 2 * DOT_GROUP + lane0));
    return d;
}

/* The lanes' block parameter `which` (0: scale, 1: minimum or q6_k's second scale). */
static ALWAYS_INLINE dv dot_parameter(const int format, const uint8_t *record, int which,
                                      ptrdiff_t lane0)
{
    if (LOOKUP_CODES(format)) return dot_lookup_scale(format, record, lane0);
    if (FLOAT_PARAMETERS(format))
        return dv_load((const float *)record + which * DOT_GROUP + lane0);
    return dv_load_half((const uint16_t *)record + which * DOT_GROUP + lane0);
}

/* One block's term of activation row `index` (the quantized rows' block-major index) from the
 * block's parameters and exact integer sums (isum1: q6_k's second half, read by q6_k only). */
static ALWAYS_INLINE dv dot_block_term(const int format, dv scale, dv second,
                                       const struct quantized_rows *q, ptrdiff_t index, vi isum,
                                       const vi *isum1)
{
    const dv activation_scale = dv_set1(q->scales[index]);
    dv term = dv_mul(dv_mul(scale, activation_scale), vi_to_dv(isum));
    if (HAS_MINIMUM(format))
        term = dv_add(term, dv_mul(second, dv_set1(q->scaled_sums[index])));
    else if (format == FORMAT_Q6_K)
        term = dv_add(term, dv_mul(dv_mul(second, activation_scale), vi_to_dv(*isum1)));
    return term;
}

/* The first `columns` lanes of an output row's accumulator, plus the bias where there is one. */
static ALWAYS_INLINE void dot_store_row(dv acc, const float *bias, float *out, int columns)
{
    float lanes[DOT_VW];
    dv_store(lanes, acc);
    for (int c = 0; c < columns; c++) {
        float total = lanes[c];
        if (bias) total += bias[c];
        out[c] = total;
    }
}
