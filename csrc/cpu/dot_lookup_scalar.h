/* The lookup formats' primitives (lookup_values.h) for dot_scalar.h: each nibble code becomes
 * its table value plus DOT_Q8_CODE_BIAS, an unsigned byte code like q8_0's, which dot_rows sums
 * exactly and the starts take the bias back out of.
 */
#include "lookup_values.h"

/* Row c's lane of code[k]: table[nibble k of row c] + DOT_Q8_CODE_BIAS. */
static inline void dot_load_lookup(const int8_t *table, const uint8_t *chunks,
                                   struct dot_codes *w)
{
    dot_load_q4(chunks, w);
    for (int k = 0; k < 32; k++)
        for (int i = 0; i < DOT_VW; i++)
            DOT_LANE(w->code[k], i) = table[DOT_LANE(w->code[k], i)] + DOT_Q8_CODE_BIAS;
}

#define dot_lookup_rows dot_rows

/* DOT_VW e8m0 bytes as their scales 2^(e - 128). */
static inline dv dv_load_e8m0_half(const uint8_t *p)
{
    dv r;
    DV_LANEWISE(e8m0_half(p[i]));
    return r;
}

/* DOT_VW int8 values as floats (exact). */
static inline dv dv_load_int8(const int8_t *p)
{
    dv r;
    DV_LANEWISE((float)p[i]);
    return r;
}
