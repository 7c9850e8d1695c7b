/* The weight formats the CPU kernels read, one row each: the C side of exactdraft/formats.py.
 *
 * Invariant: these rows carry the same facts (kernel code, name, weights and bytes per block) as
 * the formats table in Python; the extension's format_table() hands them out and a test holds
 * the two equal, so a format is added in both places or the suite fails.
 */
#ifndef EXACTDRAFT_CPU_FORMATS_H
#define EXACTDRAFT_CPU_FORMATS_H

/* X(ID, code, name, weights per block, bytes per block) */
#define WEIGHT_FORMATS(X)             \
    X(F32, 0, "f32", 1, 4)            \
    X(BF16, 1, "bf16", 1, 2)          \
    X(Q8_0, 2, "q8_0", 32, 34)        \
    X(Q4_0, 3, "q4_0", 32, 18)        \
    X(Q4_1, 4, "q4_1", 32, 20)

#define FORMAT_ENUM_ENTRY(ID, CODE, NAME, BLOCK, BYTES) FORMAT_##ID = CODE,
enum weight_format { WEIGHT_FORMATS(FORMAT_ENUM_ENTRY) FORMAT_COUNT };
#undef FORMAT_ENUM_ENTRY

struct format_row {
    const char *name;
    int block_size;  /* weights per block along K */
    int block_bytes;
};

#define FORMAT_ROW_ENTRY(ID, CODE, NAME, BLOCK, BYTES) [CODE] = {NAME, BLOCK, BYTES},
static const struct format_row FORMAT_ROWS[FORMAT_COUNT] = {WEIGHT_FORMATS(FORMAT_ROW_ENTRY)};
#undef FORMAT_ROW_ENTRY

/* Bytes of 32 consecutive weights of a row (the unit the grouped layout interleaves). */
#define BYTES_PER_32(format) \
    ((size_t)(32 / FORMAT_ROWS[format].block_size) * (size_t)FORMAT_ROWS[format].block_bytes)

#endif
