/* The formats whose 4-bit codes index a 16-entry table of integers (iq4_nl, iq4_xs, mxfp4):
 * their tables and the facts about their dot records that the packing, the matmul's starts and
 * every level's kernel share.
 *
 * Invariant: a weight of these formats is scale * TABLE[code] with TABLE's entries the exact
 * integers ggml uses (kvalues_iq4nl; kvalues_mxfp4, the e2m1 values doubled), so an integer dot
 * over table values is exact and the block scale is applied once in the float epilogue
 * (dot_record.h). A dot record holds the codes as stored (nibbles, laid out as q4_0's) and the
 * block parameters as stored: iq4_nl 16 float16 d; iq4_xs 16 float16 d, then 16 int8 ls - 32
 * (scale d * (ls - 32), exact in float32); mxfp4 16 e8m0 bytes (scale 2^(e - 128)).
 */
#ifndef EXACTDRAFT_CPU_LOOKUP_VALUES_H
#define EXACTDRAFT_CPU_LOOKUP_VALUES_H

#include <stdint.h>
#include <string.h>

#include "formats.h"

#define LOOKUP_CODES(F) ((F) == FORMAT_IQ4_NL || (F) == FORMAT_IQ4_XS)
/* Bytes of a record's parameters for 16 rows. */
#define LOOKUP_PARAMETER_BYTES(F) ((F) == FORMAT_IQ4_XS ? 3 * 16 : 2 * 16)

static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

/* The table of a lookup format. */
static inline const int8_t *lookup_values(int format)
{
    (void)format;
    return IQ4_VALUES;
}

#endif
