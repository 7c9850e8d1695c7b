/* The integer-dot matmul (dot layout, kernels.h) on tile operations (tiles.h), for passes of
 * two rows or more; a one-row pass stays on the avx512vnni level's kernel. Included by
 * level_amx.c (the AMX instructions) and level_amx_emulated.c (the same operations in C) after
 * dot_avx512vnni.h and a tile layer; TILE_LEVEL_NAME and TILE_LEVEL_FUNCTION name the level.
 * The weights are not packed again: a dot-layout record's code chunks (64 bytes: 4 codes of
 * each of the group's 16 rows) already are the rows of a B tile, so every level reads the same
 * packed weights and the level can change at any time.
 *
 * Invariant: output element (m, n) has the bits dot_body.h states, the same as on every other
 * level: a block of 32 is one tile step (activation rows of the block are the A tile, read in
 * place from the block-major quantized rows; the record's codes are the B tile, as stored for
 * q8_0 and unpacked into bytes for the others; the
 * halves of q6_k, q2_k and q3_k are two steps), the
 * int32 sums are exact, and each block's float term is added into the fp32 accumulator in block
 * order by dot_record.h's dot_block_term, the one epilogue every level runs. Rows are cut into
 * tiles of up to 16, columns into the 16-row groups of the records: this decides which rows
 * share a tile, never an element's arithmetic.
 */
#include <pthread.h>

#include "dot_record.h"
#include "dot_k_low.h"

/* Tiles (literal numbers: the instructions name their registers): C, the block's sums (q6_k:
 * of its first half, then SUM_TILE_HIGH of its second); A, the activation rows; B, the codes. */
#define SUM_TILE 0
#define SUM_TILE_HIGH 1
#define ROWS_TILE 2
#define ROWS_TILE_HIGH 3
#define CODES_TILE 4
#define CODES_TILE_HIGH 5

/* What tile instructions read and write, per thread and never on the stack. */
struct __attribute__((aligned(64))) tile_scratch {
    struct tile_config config;
    uint8_t codes[8][DOT_CHUNK];              /* a block's codes as B tile rows */
    int32_t sums[2][TILE_MAX_ROWS][DOT_GROUP]; /* the C tiles after a block */
};

static _Thread_local struct tile_scratch tile_scratch;

/* Load this thread's tile shapes for `rows` activation rows (q6_k: two half-block steps). */
static void configure_tiles(int rows, int halves)
{
    struct tile_config *config = &tile_scratch.config;
    memset(config, 0, sizeof *config);
    config->palette = 1;
    const int steps = halves ? 2 : 1;
    for (int s = 0; s < steps; s++) {
        config->rows[SUM_TILE + s] = (uint8_t)rows;
        config->colsb[SUM_TILE + s] = 4 * DOT_GROUP;
        config->rows[ROWS_TILE + s] = (uint8_t)rows;
        config->colsb[ROWS_TILE + s] = (uint16_t)(QUANT_BLOCK / steps);
        config->rows[CODES_TILE + s] = (uint8_t)(QUANT_BLOCK / 4 / steps);
        config->colsb[CODES_TILE + s] = DOT_CHUNK;
    }
    TILE_LOAD_CONFIG(config);
}

/* The record's codes as B tile rows: row j holds each weight row's codes 4j..4j+3. */
static ALWAYS_INLINE const uint8_t *tile_codes(const int format, const uint8_t *codes,
                                               ptrdiff_t b)
{
    if (format == FORMAT_Q8_0) return codes;
    struct dot_codes w;
    if (HIGH_BIT_CODES(format) || HIGH_CRUMB_CODES(format)) dot_load_high(format, codes, &w);
    else if (LOOKUP_CODES(format)) dot_load_lookup(lookup_values(format), codes, &w);
    else if (CRUMB_CODES(format)) dot_load_crumbs(codes, &w);
    else if (TRIT_CODES(format)) dot_load_trits(codes, (int)(b % 8), &w);
    else if (SIGN_CODES(format)) dot_load_signs(codes, &w);
    else dot_load_q4(codes, &w);
    for (int j = 0; j < 8; j++) _mm512_store_si512((void *)tile_scratch.codes[j], w.code[j]);
    return tile_scratch.codes[0];
}

/* One block's exact sums for the tile's rows into tile_scratch.sums (x: the block's first
 * activation row; rows 32 bytes apart). */
static ALWAYS_INLINE void tile_block_sums(const int format, const int8_t *x,
                                          const uint8_t *codes)
{
    TILE_ZERO(SUM_TILE);
    if (format == FORMAT_Q6_K || K_LOW(format)) {
        TILE_ZERO(SUM_TILE_HIGH);
        TILE_LOAD(ROWS_TILE, x, QUANT_BLOCK);
        TILE_LOAD(ROWS_TILE_HIGH, x + QUANT_BLOCK / 2, QUANT_BLOCK);
        TILE_LOAD(CODES_TILE, codes, DOT_CHUNK);
        TILE_LOAD(CODES_TILE_HIGH, codes + 4 * DOT_CHUNK, DOT_CHUNK);
        TILE_DOT_SIGNED_UNSIGNED(SUM_TILE, ROWS_TILE, CODES_TILE);
        TILE_DOT_SIGNED_UNSIGNED(SUM_TILE_HIGH, ROWS_TILE_HIGH, CODES_TILE_HIGH);
        TILE_STORE(SUM_TILE_HIGH, tile_scratch.sums[1], 4 * DOT_GROUP);
    } else {
        TILE_LOAD(ROWS_TILE, x, QUANT_BLOCK);
        TILE_LOAD(CODES_TILE, codes, DOT_CHUNK);
        TILE_DOT_SIGNED_UNSIGNED(SUM_TILE, ROWS_TILE, CODES_TILE);
    }
    TILE_STORE(SUM_TILE, tile_scratch.sums[0], 4 * DOT_GROUP);
}

#if defined(EXACTDRAFT_REORDERED_TILE_EPILOGUE)
/* Only for the tests' negative control: s_w * (d_x * isum) instead of (s_w * d_x) * isum. */
static ALWAYS_INLINE dv reordered_block_term(const int format, dv scale, dv second,
                                             const struct quantized_rows *q, ptrdiff_t index,
                                             vi isum, const vi *isum1)
{
    dv term = dot_block_term(format, dv_zero(), second, q, index, isum, isum1);
    return dv_add(term, dv_mul(scale, dv_mul(dv_set1(q->scales[index]), vi_to_dv(isum))));
}
#define TILE_BLOCK_TERM reordered_block_term
#else
#define TILE_BLOCK_TERM dot_block_term
#endif

/* q2_k and q3_k's block b (dot_k_low.h) for the tile's rows: the halves as two tile steps on
 * the unpacked codes, then the same integer steps and epilogue as every other level. */
static ALWAYS_INLINE void tile_k_low_block(const int format, const struct quantized_rows *q,
                                           const uint8_t *records, size_t record_bytes,
                                           ptrdiff_t b, ptrdiff_t index, int rows, dv *acc)
{
    const uint8_t *super = k_low_super_block(records, record_bytes, b);
    const uint8_t *block = k_low_block(format, super, b);
    dv scale, second;
    k_low_parameters(format, super, 0, &scale, &second);
    k_low_unpack(format, block + K_LOW_SCALE_BYTES, tile_scratch.codes[0], DOT_CHUNK);
    tile_block_sums(format, q->values + index * QUANT_BLOCK, tile_scratch.codes[0]);
    struct k_low_scales scales;
    k_low_load_scales(format, block, 0, &scales);
    const int32_t *starts = format == FORMAT_Q3_K ? q->starts + 2 * index : NULL;
    for (int r = 0; r < rows; r++) {
        vi isum = _mm512_add_epi32(_mm512_load_si512((const void *)tile_scratch.sums[0][r]),
                                   vi_set1(start_at(starts, 2 * r)));
        vi isum1 = _mm512_add_epi32(_mm512_load_si512((const void *)tile_scratch.sums[1][r]),
                                    vi_set1(start_at(starts, 2 * r + 1)));
        k_low_combine(format, &scales, q->starts + 2 * (index + r), &isum, &isum1);
        acc[r] = dv_add(acc[r], TILE_BLOCK_TERM(format, scale, second, q, index + r, isum,
                                                &isum1));
    }
}

static ALWAYS_INLINE void tile_columns(const int format, const struct matmul_problem *p,
                                       ptrdiff_t first, ptrdiff_t end)
{
    const struct quantized_rows *q = p->quantized;
    const ptrdiff_t blocks = p->depth / QUANT_BLOCK;
    const size_t record_bytes = (size_t)FORMAT_ROWS[format].dot_record_bytes;
    const ptrdiff_t out_stride = p->out_stride ? p->out_stride : p->columns;
    for (ptrdiff_t m0 = 0; m0 < p->rows; m0 += TILE_MAX_ROWS) {
        const int rows = (int)(p->rows - m0 < TILE_MAX_ROWS ? p->rows - m0 : TILE_MAX_ROWS);
        configure_tiles(rows, format == FORMAT_Q6_K || K_LOW(format));
        for (ptrdiff_t n = first; n < end; n += DOT_GROUP) {
            const uint8_t *records = p->weight + (size_t)(n / DOT_GROUP * blocks) * record_bytes;
            dv acc[TILE_MAX_ROWS];
            for (int r = 0; r < rows; r++) acc[r] = dv_zero();
            for (ptrdiff_t b = 0; b < blocks; b++) {
                const uint8_t *next = records + (size_t)(b + DOT_PREFETCH_RECORDS) * record_bytes;
                const uint8_t *record = dot_record_parameters(format, records, b, record_bytes);
                for (size_t line = 0; line < record_bytes; line += 64)
                    __builtin_prefetch(next + line);
                const ptrdiff_t index = b * p->rows + m0;
                if (K_LOW(format)) {
                    tile_k_low_block(format, q, records, record_bytes, b, index, rows, acc);
                    continue;
                }
                const uint8_t *codes = dot_record_codes(format, record, b);
                const dv scale = dot_parameter(format, record, codes, 0, 0);
                dv second = dv_zero();
                if (HAS_MINIMUM(format) || format == FORMAT_Q6_K)
                    second = dot_parameter(format, record, codes, 1, 0);
                tile_block_sums(format, q->values + index * QUANT_BLOCK,
                                tile_codes(format, codes, b));
                const int32_t *starts = CODE_OFFSET(format) ? q->starts + 2 * index : NULL;
                for (int r = 0; r < rows; r++) {
                    const vi isum = _mm512_add_epi32(
                        _mm512_load_si512((const void *)tile_scratch.sums[0][r]),
                        vi_set1(start_at(starts, 2 * r)));
                    vi isum1 = isum;
                    if (format == FORMAT_Q6_K)
                        isum1 = _mm512_add_epi32(
                            _mm512_load_si512((const void *)tile_scratch.sums[1][r]),
                            vi_set1(start_at(starts, 2 * r + 1)));
                    acc[r] = dv_add(acc[r], TILE_BLOCK_TERM(format, scale, second, q, index + r,
                                                            isum, &isum1));
                }
            }
            const int columns = (int)(end - n < DOT_GROUP ? end - n : DOT_GROUP);
            for (int r = 0; r < rows; r++)
                dot_store_row(acc[r], p->bias ? p->bias + n : NULL,
                              p->out + (m0 + r) * out_stride + n, columns);
        }
    }
    TILE_RELEASE();
}

#define TILE_INSTANCE(F) \
    static void tile_columns_##F(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end) \
    { tile_columns(F, p, first, end); }
TILE_INSTANCE(2) TILE_INSTANCE(3) TILE_INSTANCE(4) TILE_INSTANCE(5) TILE_INSTANCE(6)
TILE_INSTANCE(7) TILE_INSTANCE(8) TILE_INSTANCE(9)
TILE_INSTANCE(10) TILE_INSTANCE(11) TILE_INSTANCE(12)
TILE_INSTANCE(13) TILE_INSTANCE(14) TILE_INSTANCE(15) TILE_INSTANCE(16) TILE_INSTANCE(17)

typedef void (*tile_function)(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end);

/* By format code minus FORMAT_Q8_0. */
static const tile_function tile_functions[FORMAT_COUNT - FORMAT_Q8_0] = {
    tile_columns_2, tile_columns_3, tile_columns_4, tile_columns_5, tile_columns_6,
    tile_columns_7, tile_columns_8, tile_columns_9,
    tile_columns_10, tile_columns_11, tile_columns_12, tile_columns_13, tile_columns_14,
    tile_columns_15, tile_columns_16, tile_columns_17};

#if DOT_GROUP != 16 || DOT_VW != 16 || DOT_Q8_CODE_BIAS != 128
#error "the tile matmul reads a record's 16 rows as one tile of unsigned codes"
#endif

/* Columns [first, end), first a multiple of DOT_GROUP. */
static void tile_matmul_columns(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    if (p->rows < 2) {
        kernels_avx512vnni.dot_matmul_columns(p, first, end);
        return;
    }
    tile_functions[p->format - FORMAT_Q8_0](p, first, end);
}

/* The level: the avx512vnni level's kernels with the tile matmul. */
static struct kernel_table tile_level;
static pthread_once_t tile_level_once = PTHREAD_ONCE_INIT;

static void fill_tile_level(void)
{
    tile_level = kernels_avx512vnni;
    tile_level.name = TILE_LEVEL_NAME;
    tile_level.dot_matmul_columns = tile_matmul_columns;
    tile_level.sign_lookup_rows = 1; /* more rows run on tiles, which read no tables */
}

const struct kernel_table *TILE_LEVEL_FUNCTION(void)
{
    pthread_once(&tile_level_once, fill_tile_level);
    return &tile_level;
}
