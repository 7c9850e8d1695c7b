/* Where a dot-layout record (kernels.h) keeps a format's parameters and codes: the facts the
 * packing (pack_dot.c), the random problems of the tests and every level's kernel
 * (dot_record.h) share.
 *
 * Invariant: a record holds a block's values at (close to) the width its GGUF block stores them,
 * so the loaded weights take about the file's bytes; every float parameter a kernel forms from
 * them (d * sc of the k formats) is one exact float32 product, the same value whichever record
 * layout held it.
 */
#ifndef EXACTDRAFT_CPU_DOT_LAYOUT_H
#define EXACTDRAFT_CPU_DOT_LAYOUT_H

#include "kernels.h"
#include "lookup_values.h"

#define NIBBLE_CODES(F) ((F) == FORMAT_Q4_0 || (F) == FORMAT_Q4_1 || (F) == FORMAT_Q4_K)
#define HAS_MINIMUM(F) ((F) == FORMAT_Q4_1 || (F) == FORMAT_Q5_1 || (F) == FORMAT_Q4_K || \
                        (F) == FORMAT_Q5_K)
/* q5_0, q5_1, q5_k and q6_k keep their codes' low 4 bits as q4_0's nibble chunks, then the
 * high bits: one chunk of bits (q5: byte 4 row + i, bit j = bit 4 of code 4j + i) or two of
 * 2-bit fields (q6_k: chunk p, byte 4 row + i, bits 2t..2t+1 = bits 4..5 of code
 * 4 (4p + t) + i); a level's dot_load_high (or dot_record.h's portable dot_unpack_high)
 * makes byte codes of them. */
#define HIGH_BIT_CODES(F) ((F) == FORMAT_Q5_0 || (F) == FORMAT_Q5_1 || (F) == FORMAT_Q5_K)
#define HIGH_CRUMB_CODES(F) ((F) == FORMAT_Q6_K)
/* The k formats with 4-bit codes or more and iq4_xs keep their float16 super-block scales once
 * per 256 weights (a header of 16 d; q4_k and q5_k then 16 -dmin), and per block of 32 the
 * rows' integer sub-scales before its codes: q4_k, q5_k 16 sc then 16 m (6 bits, 0..63);
 * q6_k 16 int8 sc of weights 0..15, then 16 of 16..31; iq4_xs 16 int8 ls - 32. The block's
 * float parameters are d * sc and -dmin * m, exact float32 products. */
#define SUPER_HEADER(F) ((F) == FORMAT_Q4_K || (F) == FORMAT_Q5_K || (F) == FORMAT_Q6_K || \
                         (F) == FORMAT_IQ4_XS)
#define SUB_SCALE_BYTES(F) \
    ((F) == FORMAT_IQ4_XS ? DOT_GROUP : SUPER_HEADER(F) ? 2 * DOT_GROUP : 0)
/* The ternary and 1-bit formats keep one float16 scale per 256 (tq1_0, tq2_0) or 128 (q1_0)
 * weights, so one record covers SHARED_BLOCKS(F) blocks of 32: the group's 16 scales, then the
 * codes. tq2_0 and q1_0 give each block of 32 SHARED_CODE_BYTES(F) bytes: 2-bit codes 0..3
 * ("crumbs") in two chunks, or q1_0's bits in one (read as 2 * bit). tq1_0 keeps its bytes of
 * five trits each as the file stores them, in 13 chunks (its bytes 4c..4c+3 of each row in chunk
 * c: qs in chunks 0..11, qh in chunk 12), which every block of 32 decodes its trits from
 * (dot_load_trits). Their offset is 1: code - 1 is the ternary weight, or -1 and +1. */
#define CRUMB_CODES(F) ((F) == FORMAT_TQ2_0)
#define TRIT_CODES(F) ((F) == FORMAT_TQ1_0)
#define SIGN_CODES(F) ((F) == FORMAT_Q1_0)
#define SHARED_BLOCKS(F) \
    (CRUMB_CODES(F) || TRIT_CODES(F) || SUPER_HEADER(F) ? 8 : SIGN_CODES(F) ? 4 : 1)
/* Chunks of 64 bytes holding a block of 32's codes. */
#define CODE_CHUNKS(F)                                                                      \
    ((F) == FORMAT_Q8_0 ? 8 : HIGH_BIT_CODES(F) ? 5 : HIGH_CRUMB_CODES(F) ? 6 :             \
     CRUMB_CODES(F) ? 2 : SIGN_CODES(F) ? 1 : 4)
/* Bytes of each block of 32 within a record shared by SHARED_BLOCKS(F) blocks. */
#define SHARED_CODE_BYTES(F) \
    (TRIT_CODES(F) ? 0 : SUB_SCALE_BYTES(F) + CODE_CHUNKS(F) * DOT_CHUNK)
/* Bytes of a record's parameters (a shared record's header) for the group's 16 rows: 16
 * float16 values each (mxfp4: bytes). */
#define PARAMETER_BYTES(F) \
    (LOOKUP_CODES(F) ? LOOKUP_PARAMETER_BYTES(F) : 2 * DOT_GROUP * (HAS_MINIMUM(F) ? 2 : 1))

#endif
