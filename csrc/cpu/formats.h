/* The weight formats the CPU kernels read, one row each: the C side of exactdraft/formats/table.py.
 *
 * Invariant: these rows carry the same facts (kernel code, name, weights and bytes per block) as
 * the formats table in Python; the extension's format_table() hands them out and a test holds
 * the two equal, so a format is added in both places or the suite fails.
 */
#ifndef EXACTDRAFT_CPU_FORMATS_H
#define EXACTDRAFT_CPU_FORMATS_H

/* X(ID, code, name, weights per block, bytes per block, float kernel, dot record bytes)
 * float kernel: the rows and grouped layouts (float activations) can multiply the format;
 * dot record bytes: the dot layout's record for 16 rows and 32 weights (0: no dot kernel); for
 * the formats whose blocks of 32 share a record's scales (dot_layout.h's SHARED_BLOCKS), the
 * bytes of that record over the blocks of 32 it holds; for q2_k and q3_k, whose records share a
 * header per 256 weights (dot_k_low.h), the average. Codes missing from the list are rows of
 * zeros (no name, no kernel). */
#define WEIGHT_FORMATS(X)                                 \
    X(F32, 0, "f32", 1, 4, 1, 0)                        \
    X(BF16, 1, "bf16", 1, 2, 1, 0)                      \
    X(Q8_0, 2, "q8_0", 32, 34, 1, 32 + 512)             \
    X(Q4_0, 3, "q4_0", 32, 18, 1, 32 + 256)             \
    X(Q4_1, 4, "q4_1", 32, 20, 1, 64 + 256)             \
    X(Q5_0, 5, "q5_0", 32, 22, 0, 32 + 320)             \
    X(Q5_1, 6, "q5_1", 32, 24, 0, 64 + 320)             \
    X(Q4_K, 7, "q4_k", 256, 144, 0, (64 + 8 * 288) / 8) \
    X(Q5_K, 8, "q5_k", 256, 176, 0, (64 + 8 * 352) / 8) \
    X(Q6_K, 9, "q6_k", 256, 210, 0, (32 + 8 * 416) / 8) \
    X(IQ4_NL, 10, "iq4_nl", 32, 18, 0, 32 + 256)        \
    X(IQ4_XS, 11, "iq4_xs", 256, 136, 0, (32 + 8 * 272) / 8)\
    X(MXFP4, 12, "mxfp4", 32, 17, 0, 16 + 256)          \
    X(TQ1_0, 13, "tq1_0", 256, 54, 0, (32 + 13 * 64) / 8)\
    X(TQ2_0, 14, "tq2_0", 256, 66, 0, (32 + 8 * 128) / 8)\
    X(Q1_0, 15, "q1_0", 128, 18, 0, (32 + 4 * 64) / 4)  \
    X(Q2_K, 16, "q2_k", 256, 84, 0, 168)                \
    X(Q3_K, 17, "q3_k", 256, 110, 0, 228)                \
    X(FP8_E4M3, 18, "fp8_e4m3", 32, 36, 1, 0)

#define FORMAT_ENUM_ENTRY(ID, CODE, NAME, BLOCK, BYTES, FLOAT, DOT) FORMAT_##ID = CODE,
enum weight_format { WEIGHT_FORMATS(FORMAT_ENUM_ENTRY) FORMAT_COUNT };
#undef FORMAT_ENUM_ENTRY

/* The formats with float kernels: codes 0 .. 4 and fp8_e4m3 (fp8_e4m3.h, a float scale and
 * e4m3fn codes per block of 32), which FLOAT_FORMAT_INDEX maps to the float kernels' table row
 * after them. */
#define FLOAT_FORMAT_COUNT 6
#define FLOAT_FORMAT_INDEX(format) ((format) == FORMAT_FP8_E4M3 ? 5 : (format))

struct format_row {
    const char *name;
    int block_size;  /* weights per block along K */
    int block_bytes;
    int float_kernel;
    int dot_record_bytes;
};

#define FORMAT_ROW_ENTRY(ID, CODE, NAME, BLOCK, BYTES, FLOAT, DOT) \
    [CODE] = {NAME, BLOCK, BYTES, FLOAT, DOT},
static const struct format_row FORMAT_ROWS[FORMAT_COUNT] = {WEIGHT_FORMATS(FORMAT_ROW_ENTRY)};
#undef FORMAT_ROW_ENTRY

/* Bytes of 32 consecutive weights of a row (the unit the grouped layout interleaves), for the
 * formats with float kernels. */
#define BYTES_PER_32(format) \
    ((size_t)(32 / FORMAT_ROWS[format].block_size) * (size_t)FORMAT_ROWS[format].block_bytes)

#endif
