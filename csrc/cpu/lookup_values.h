/* The formats whose 4-bit codes index a 16-entry table of integers (iq4_nl, iq4_xs, mxfp4):
 * their tables and the facts about their dot records that the packing, the matmul's starts and
 * every level's kernel share.
 *
 * Invariant: a weight of these formats is scale * TABLE[code] with TABLE's entries the exact
 * integers ggml uses (kvalues_iq4nl; kvalues_mxfp4, the e2m1 values doubled), so an integer dot
 * over table values is exact and the block scale is applied once in the float epilogue
 * (dot_record.h). A dot record holds the codes as stored (nibbles, laid out as q4_0's) and the
 * block parameters as stored: iq4_nl 16 float16 d; mxfp4 16 e8m0 bytes (scale 2^(e - 128));
 * iq4_xs a float16 d per 256 weights and an int8 ls - 32 per block of 32 (dot_layout.h's
 * super-block header; scale d * (ls - 32), exact in float32).
 */
#ifndef EXACTDRAFT_CPU_LOOKUP_VALUES_H
#define EXACTDRAFT_CPU_LOOKUP_VALUES_H

#include <stdint.h>
#include <string.h>

#include "formats.h"

#define LOOKUP_CODES(F) ((F) == FORMAT_IQ4_NL || (F) == FORMAT_IQ4_XS || (F) == FORMAT_MXFP4)
/* Bytes of a record's parameters for 16 rows (iq4_xs: its super-block header's d). */
#define LOOKUP_PARAMETER_BYTES(F) ((F) == FORMAT_MXFP4 ? 16 : 2 * 16)

static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* The table of a lookup format. */
static inline const int8_t *lookup_values(int format)
{
    return format == FORMAT_MXFP4 ? MXFP4_VALUES : IQ4_VALUES;
}

/* 2^(e - 128), half the e8m0 scale 2^(e - 127), as ggml's ggml_e8m0_to_fp32_half: e = 0 and 1
 * give the subnormals 2^-128 and 2^-127, the rest the exponent field e - 1. */
static inline float e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#endif
