/* q1_0's integer sums by table lookup on AVX-512 VBMI, for dot_body.h on the avx512vnni level:
 * a decode-shaped matmul (few activation rows, many weight rows) reads each row's 1-bit codes
 * four at a time as the index of a table of that activation row's partial sums, instead of
 * widening every bit to a byte for vpdpbusd. The tables are built once per call
 * (build_sign_tables) and shared by every weight row.
 *
 * Invariant: a table entry is the exact integer sum of its four activations, each with the
 * sign its bit gives (the weight code - 1 of dot_layout.h, -1 or +1), held in two bytes (below);
 * isum is the exact sum of the entries, so it equals the integer sum
 * the bytewise path forms (starts[2 r] + sum of 2 * bit * x) and dot_block_term turns both into
 * the same bits.
 *
 * Table layout, per quantized block of 32 activations (index b * rows + m, as q->scales), 256
 * bytes: for the codes' low nibbles (bit s of a row's byte i pairs with activation 4 s + i),
 * then for the high nibbles (16 + 4 s + i), 64 bytes of low parts then 64 of high parts, entry
 * nibble | i << 4. With T the signed sum (|T| <= 4 * 127) and U = T + 512 (0 < U < 1024), the
 * low part is U & 127 and the high part U >> 7, so T = low + 128 * high - 512.
 */
#ifndef EXACTDRAFT_CPU_DOT_SIGN_LOOKUP_H
#define EXACTDRAFT_CPU_DOT_SIGN_LOOKUP_H

/* Groups of 16 weight rows that share each table read, at most. */
#define SIGN_GROUPS 4

#if defined(EXACTDRAFT_EMULATE_X86)
#define SIGN_LOOKUP_TARGET
#else
/* Only these functions need VBMI's byte permute; dispatch.c calls them only on CPUs with it. */
#define SIGN_LOOKUP_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))
#endif

/* The tables of one half (activations 16 h .. 16 h + 15 of a block) into out[0..127]. Lane l of
 * word vector v is entry 32 v + l: position i = 2 v + l / 16, nibble l % 16. */
static inline void build_sign_half(const int8_t *x, uint8_t *out)
{
    const __m512i words = _mm512_castsi256_si512(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x)));
    /* Bit s of lane l's nibble: l = 0..31 holds nibbles 0..15 twice. */
    static const __mmask32 bit_set[4] = {0xAAAAAAAAu, 0xCCCCCCCCu, 0xF0F0F0F0u, 0xFF00FF00u};
    static const int16_t second_position[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const __m512i lane_position = _mm512_loadu_si512((const void *)second_position);
    for (int v = 0; v < 2; v++) {
        __m512i total = _mm512_set1_epi16(512);
        for (int s = 0; s < 4; s++) {
            /* Lane l reads activation 4 s + i of the half. */
            const __m512i index = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * s + 2 * v)),
                                                   lane_position);
            /* - x everywhere, then + 2 x where the bit is set: +x or -x. */
            const __m512i activation = _mm512_permutexvar_epi16(index, words);
            total = _mm512_sub_epi16(total, activation);
            total = _mm512_mask_add_epi16(total, bit_set[s], total,
                                          _mm512_add_epi16(activation, activation));
        }
#if defined(EXACTDRAFT_SIGN_TABLE_MISTAKE)
        /* The check program's negative control: one entry one too large. */
        if (v == 1) total = _mm512_mask_add_epi16(total, 1u << 5, total, _mm512_set1_epi16(1));
#endif
        const __m512i low = _mm512_and_si512(total, _mm512_set1_epi16(127));
        const __m512i high = _mm512_srli_epi16(total, 7);
        _mm256_storeu_si256((__m256i *)(out + 32 * v), _mm512_cvtepi16_epi8(low));
        _mm256_storeu_si256((__m256i *)(out + 64 + 32 * v), _mm512_cvtepi16_epi8(high));
    }
}

/* The tables of the first `count` quantized blocks of q (block-major) into out. */
static void build_sign_tables(const struct quantized_rows *q, size_t count, uint8_t *out)
{
    for (size_t i = 0; i < count; i++)
        for (int h = 0; h < 2; h++)
            build_sign_half(q->values + i * QUANT_BLOCK + 16 * h,
                            out + i * SIGN_TABLE_BYTES + 128 * h);
}

/* A block's tables for one activation row: four vectors of 64 bytes. */
struct sign_table {
    __m512i part[4];
};

static ALWAYS_INLINE SIGN_LOOKUP_TARGET struct sign_table sign_table_at(const uint8_t *table)
{
    struct sign_table t;
    for (int i = 0; i < 4; i++) t.part[i] = _mm512_loadu_si512((const void *)(table + 64 * i));
    return t;
}

/* A row's sum of the block from its table: the four positions of each row lane (vpdpbusd adds
 * a dword's four bytes) at the nibbles' indices; -4096 takes out the 512 of each of the eight
 * entries. */
static ALWAYS_INLINE SIGN_LOOKUP_TARGET vi sign_lookup_sum(__m512i low_nibbles,
                                                           __m512i high_nibbles,
                                                           const struct sign_table *t)
{
    const __m512i ones = _mm512_set1_epi8(1), weight = _mm512_set1_epi8((char)128);
    __m512i sum = _mm512_set1_epi32(-4096);
    sum = _mm512_dpbusd_epi32(sum, _mm512_permutexvar_epi8(low_nibbles, t->part[0]), ones);
    sum = _mm512_dpbusd_epi32(sum, weight, _mm512_permutexvar_epi8(low_nibbles, t->part[1]));
    sum = _mm512_dpbusd_epi32(sum, _mm512_permutexvar_epi8(high_nibbles, t->part[2]), ones);
    return _mm512_dpbusd_epi32(sum, weight,
                               _mm512_permutexvar_epi8(high_nibbles, t->part[3]));
}

/* dot_tile for q1_0 with the tables in q->sign_tables, for `groups` consecutive groups of 16
 * weight rows (records group_bytes apart) that share each table they read: the same blocks in
 * the same order, and the same dot_block_term of the same integer sums. */
static ALWAYS_INLINE SIGN_LOOKUP_TARGET void dot_sign_tile(const int rows, const int groups,
                                                           const struct dot_args *a,
                                                           ptrdiff_t group_bytes)
{
    const int format = FORMAT_Q1_0;
    const struct quantized_rows *q = a->q;
    /* (code & 15) | position << 4, position i in byte i of each row's dword; 0xEA: a & b | c */
    const __m512i nibble = _mm512_set1_epi8(15), position = _mm512_set1_epi32(0x30201000);
    dv acc[SIGN_GROUPS][DOT_TILE_ROWS], scale[SIGN_GROUPS];
#pragma GCC unroll 4
    for (int g = 0; g < groups; g++) {
        scale[g] = dv_zero();
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) acc[g][r] = dv_zero();
    }
    for (ptrdiff_t b = 0; b < a->blocks; b++) {
        __m512i low_nibbles[SIGN_GROUPS], high_nibbles[SIGN_GROUPS];
#pragma GCC unroll 4
        for (int g = 0; g < groups; g++) {
            const uint8_t *records = a->records + g * group_bytes;
            const uint8_t *next = records + (b + DOT_PREFETCH_RECORDS) * a->record_bytes;
            const uint8_t *record = dot_record_parameters(format, records, b, a->record_bytes);
            const uint8_t *codes = dot_record_codes(format, record, b);
            for (size_t line = 0; line < a->record_bytes; line += 64)
                __builtin_prefetch(next + line);
            if (b % SHARED_BLOCKS(format) == 0)
                scale[g] = dot_parameter(format, record, codes, 0, 0);
            const __m512i bytes = _mm512_loadu_si512((const void *)codes);
            low_nibbles[g] = _mm512_ternarylogic_epi32(bytes, nibble, position, 0xEA);
            high_nibbles[g] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(bytes, 4), nibble,
                                                        position, 0xEA);
        }
        const ptrdiff_t first = b * a->rows + a->first_row;
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            const struct sign_table table =
                sign_table_at(q->sign_tables + (first + r) * SIGN_TABLE_BYTES);
#pragma GCC unroll 4
            for (int g = 0; g < groups; g++) {
                const vi isum = sign_lookup_sum(low_nibbles[g], high_nibbles[g], &table);
                acc[g][r] = dv_add(acc[g][r], dot_block_term(format, scale[g], scale[g], q,
                                                             first + r, isum, &isum));
            }
        }
    }
    for (int g = 0; g < groups; g++) {
        const int columns = a->columns - DOT_VW * g;
        for (int r = 0; r < rows; r++)
            dot_store_row(acc[g][r], a->bias ? a->bias + DOT_VW * g : NULL,
                          a->out + r * a->out_stride + DOT_VW * g,
                          columns < DOT_VW ? columns : DOT_VW);
    }
}

#define DOT_SIGN_INSTANCE(R, G)                                                                \
    static SIGN_LOOKUP_TARGET void dot_sign_##R##_##G(const struct dot_args *a,               \
                                                      ptrdiff_t group_bytes)                  \
    {                                                                                          \
        dot_sign_tile(R, G, a, group_bytes);                                                   \
    }
DOT_SIGN_INSTANCE(1, 4)
DOT_SIGN_INSTANCE(1, 1) DOT_SIGN_INSTANCE(2, 1) DOT_SIGN_INSTANCE(3, 1) DOT_SIGN_INSTANCE(4, 1)
DOT_SIGN_INSTANCE(5, 1) DOT_SIGN_INSTANCE(6, 1) DOT_SIGN_INSTANCE(7, 1) DOT_SIGN_INSTANCE(8, 1)
typedef void (*dot_sign_function)(const struct dot_args *, ptrdiff_t);
/* By rows: one group at a time (one row also four at a time: dot_sign_1_4). */
static const dot_sign_function dot_sign_single[DOT_TILE_ROWS] = {
    dot_sign_1_1, dot_sign_2_1, dot_sign_3_1, dot_sign_4_1,
    dot_sign_5_1, dot_sign_6_1, dot_sign_7_1, dot_sign_8_1};

/* Output columns [first, end), first a multiple of DOT_GROUP, of a q1_0 matmul of at most
 * DOT_TILE_ROWS rows with its tables: with one row, four groups at a time share each block's
 * tables, which then come from the cache once per four groups' records (with more rows, and
 * so more tables, sharing measured no faster when the weights stream from memory). */
static void dot_sign_columns(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end,
                             struct dot_args a)
{
    const int rows = (int)p->rows;
    const int together = rows == 1 ? SIGN_GROUPS : 1;
    const ptrdiff_t group_bytes = a.blocks * (ptrdiff_t)a.record_bytes;
    a.first_row = 0;
    a.lane0 = 0;
    for (ptrdiff_t n = first; n < end;) {
        const int groups = end - n > DOT_VW * (together - 1) ? together : 1;
        a.records = p->weight + (size_t)(n / DOT_GROUP) * (size_t)group_bytes;
        a.columns = (int)min_index(DOT_VW * groups, end - n);
        a.bias = p->bias ? p->bias + n : NULL;
        a.out = p->out + n;
        if (groups == SIGN_GROUPS) dot_sign_1_4(&a, group_bytes);
        else dot_sign_single[rows - 1](&a, group_bytes);
        n += DOT_VW * groups;
    }
}

#endif
