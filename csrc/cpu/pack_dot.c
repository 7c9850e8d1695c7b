/* Packing GGUF block rows into the dot layout (kernels.h, dot_layout.h) at load time.
 *
 * Invariant: a record holds exactly the values its GGUF blocks encode, split as the dot
 * layout reads them: w = scale * (code - offset) + minimum, with float16 parameters copied bit
 * for bit (q4_k and q5_k's dmin with its sign flipped, exactly) and the k formats' integer
 * sub-scales as stored, from which the kernels form the float32 products ggml forms (d * sc,
 * -(dmin * m)), which are exact; codes are the stored integers, unsigned, kept at their stored
 * width (q5 and q6_k's high bits apart from their low nibbles; q2_k and q3_k as dot_k_low.h
 * lays out). It is the C twin of the format rows' block_fields (exactdraft/formats/table.py,
 * formats/dequantize.py), which tests hold it equal to. The ternary and 1-bit formats keep one
 * scale per GGUF block (pack_shared_group), so that their records take the bytes their blocks
 * take; tq1_0 keeps its five-trit bytes as stored, decoded by the kernels. The lookup formats'
 * records (lookup_values.h) keep their stored nibbles, which index the format's table, and
 * their parameters as stored; tests hold them equal to a numpy packing of the raw blocks.
 */
#include "pack_dot.h"

#include <string.h>

#include "dot_layout.h"
#include "thread_pool.h"

/* q4_k / q5_k's 6-bit scale and min of sub-block j from the 12 packed bytes. */
static void k4_scale(const uint8_t *s, int j, int *scale, int *minimum)
{
    if (j < 4) {
        *scale = s[j] & 63;
        *minimum = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *minimum = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

struct block_parts {
    uint16_t halves[2];   /* float16 scale and minimum (a super-block header's d, -dmin) */
    int8_t sub_scales[2]; /* sc and m (q4_k, q5_k), q6_k's two sc, iq4_xs's ls - 32 */
    uint8_t codes[32];    /* unsigned codes 0..255 */
};

/* The parameters and codes of 32-weight block b of one GGUF row. */
static void decode(int format, const uint8_t *row, ptrdiff_t b, struct block_parts *out)
{
    const uint8_t *block;
    switch (format) {
    case FORMAT_Q8_0:
        block = row + b * 34;
        memcpy(out->halves, block, 2);
        for (int i = 0; i < 32; i++) out->codes[i] = block[2 + i] ^ 0x80;
        return;
    case FORMAT_Q4_0:
    case FORMAT_IQ4_NL: /* q4_0's block; its nibbles index IQ4_VALUES */
    case FORMAT_Q4_1: {
        const int minimum = format == FORMAT_Q4_1;
        block = row + b * (minimum ? 20 : 18);
        memcpy(out->halves, block, minimum ? 4 : 2);
        const uint8_t *qs = block + (minimum ? 4 : 2);
        for (int i = 0; i < 16; i++) {
            out->codes[i] = qs[i] & 0x0F;
            out->codes[i + 16] = qs[i] >> 4;
        }
        return;
    }
    case FORMAT_Q5_0:
    case FORMAT_Q5_1: {
        const int minimum = format == FORMAT_Q5_1;
        block = row + b * (minimum ? 24 : 22);
        memcpy(out->halves, block, minimum ? 4 : 2);
        uint32_t high;
        memcpy(&high, block + (minimum ? 4 : 2), 4);
        const uint8_t *qs = block + (minimum ? 8 : 6);
        for (int i = 0; i < 16; i++) {
            out->codes[i] = (uint8_t)((qs[i] & 0x0F) | (((high >> i) & 1) << 4));
            out->codes[i + 16] = (uint8_t)((qs[i] >> 4) | (((high >> (i + 16)) & 1) << 4));
        }
        return;
    }
    case FORMAT_Q4_K:
    case FORMAT_Q5_K: {
        const int five = format == FORMAT_Q5_K;
        block = row + (b / 8) * (five ? 176 : 144);
        const int j = (int)(b % 8);
        int scale, minimum;
        k4_scale(block + 4, j, &scale, &minimum);
        memcpy(out->halves, block, 4);
        out->halves[1] ^= 0x8000; /* -dmin, exactly */
        out->sub_scales[0] = (int8_t)scale;
        out->sub_scales[1] = (int8_t)minimum;
        const uint8_t *qs = block + (five ? 48 : 16) + 32 * (j / 2);
        for (int l = 0; l < 32; l++) {
            uint8_t code = j % 2 ? qs[l] >> 4 : qs[l] & 0x0F;
            if (five) code |= (uint8_t)(((block[16 + l] >> j) & 1) << 4);
            out->codes[l] = code;
        }
        return;
    }
    case FORMAT_Q6_K: {
        block = row + (b / 8) * 210;
        const int h = (int)(b % 8) / 4, jj = (int)(b % 4);
        memcpy(out->halves, block + 208, 2);
        memcpy(out->sub_scales, block + 192 + (b % 8) * 2, 2);
        const uint8_t *ql = block + 64 * h + 32 * (jj % 2), *qh = block + 128 + 32 * h;
        for (int l = 0; l < 32; l++) {
            const int low = jj < 2 ? ql[l] & 0x0F : ql[l] >> 4;
            out->codes[l] = (uint8_t)(low | (((qh[l] >> (2 * jj)) & 3) << 4));
        }
        return;
    }
    case FORMAT_MXFP4: {
        block = row + b * 17;
        out->halves[0] = block[0]; /* the e8m0 byte */
        for (int i = 0; i < 16; i++) {
            out->codes[i] = block[1 + i] & 0x0F;
            out->codes[i + 16] = block[1 + i] >> 4;
        }
        return;
    }
    case FORMAT_IQ4_XS: {
        block = row + (b / 8) * 136;
        const int j = (int)(b % 8);
        uint16_t high;
        memcpy(out->halves, block, 2);
        memcpy(&high, block + 2, 2);
        const int ls =
            ((block[4 + j / 2] >> (4 * (j % 2))) & 0x0F) | (((high >> (2 * j)) & 3) << 4);
        out->sub_scales[0] = (int8_t)(ls - 32);
        const uint8_t *qs = block + 8 + 16 * j;
        for (int i = 0; i < 16; i++) {
            out->codes[i] = qs[i] & 0x0F;
            out->codes[i + 16] = qs[i] >> 4;
        }
        return;
    }
    default:
        return;
    }
}

struct pack_job {
    int format;
    const uint8_t *source;
    size_t row_bytes;
    ptrdiff_t rows, blocks;
    uint8_t *records;
};

/* q2_k and q3_k's super-block record layout (sizes as dot_k_low.h states). */
enum { K_LOW_BLOCKS_PER_SUPER = 8, K_LOW_SCALES = 2 * DOT_GROUP };

/* q3_k's 6-bit scale of sub-block s (16 weights), minus 32. */
static int k3_scale(const uint8_t *scales, int s)
{
    const int low = (scales[s % 8] >> (4 * (s / 8))) & 0x0F;
    const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (low | high << 4) - 32;
}

/* Super-block `super` of lane `lane` of a q2_k or q3_k group record at `record`: the header
 * halves, and per block of 32 its sub-scales and codes (dot_k_low.h's layout). */
static void pack_k_low_super(int format, const uint8_t *block, int lane, uint8_t *record)
{
    const int q2 = format == FORMAT_Q2_K;
    const int header = (q2 ? 4 : 2) * DOT_GROUP, chunks = q2 ? 2 : 3;
    const uint8_t *qs = block + (q2 ? 16 : 32);
    if (q2) {
        memcpy(record + 2 * lane, block + 80, 2);
        uint16_t minimum;
        memcpy(&minimum, block + 82, 2);
        minimum ^= 0x8000; /* -dmin, exactly */
        memcpy(record + 2 * (DOT_GROUP + lane), &minimum, 2);
    } else {
        memcpy(record + 2 * lane, block + 108, 2);
    }
    for (int b = 0; b < K_LOW_BLOCKS_PER_SUPER; b++) {
        uint8_t *out = record + header + b * (K_LOW_SCALES + chunks * DOT_CHUNK);
        if (q2) {
            out[lane] = (uint8_t)((block[2 * b] & 0x0F) | (block[2 * b + 1] & 0x0F) << 4);
            out[DOT_GROUP + lane] = (uint8_t)((block[2 * b] >> 4) | (block[2 * b + 1] >> 4) << 4);
        } else {
            out[lane] = (uint8_t)(int8_t)k3_scale(block + 96, 2 * b);
            out[DOT_GROUP + lane] = (uint8_t)(int8_t)k3_scale(block + 96, 2 * b + 1);
        }
        uint8_t *codes = out + K_LOW_SCALES + 4 * lane;
        const int h = b / 4, j = b % 4;
        for (int k = 0; k < 32; k++) {
            /* Weight 32 b + k: bits 2j..2j+1 of qs[32 h + k]; q3_k's hmask bit 4h + j of byte k. */
            const int low = (qs[32 * h + k] >> (2 * j)) & 3;
            const int chunk = k / 4, i = k % 4;
            codes[(chunk / 4) * DOT_CHUNK + i] |= (uint8_t)(low << (2 * (chunk % 4)));
            if (!q2)
                codes[2 * DOT_CHUNK + i] |= (uint8_t)(((block[k] >> (4 * h + j)) & 1) << chunk);
        }
    }
}

static void pack_k_low_group(const struct pack_job *job, ptrdiff_t group)
{
    const size_t super_bytes = K_LOW_BLOCKS_PER_SUPER *
                               (size_t)FORMAT_ROWS[job->format].dot_record_bytes;
    const ptrdiff_t supers = job->blocks / K_LOW_BLOCKS_PER_SUPER;
    uint8_t *first = job->records + (size_t)group * (size_t)supers * super_bytes;
    memset(first, 0, (size_t)supers * super_bytes); /* rows past the last stay zero */
    const int block_bytes = FORMAT_ROWS[job->format].block_bytes;
    for (int lane = 0; lane < DOT_GROUP; lane++) {
        const ptrdiff_t n = group * DOT_GROUP + lane;
        if (n >= job->rows) break;
        const uint8_t *row = job->source + (size_t)n * job->row_bytes;
        for (ptrdiff_t s = 0; s < supers; s++)
            pack_k_low_super(job->format, row + s * block_bytes, lane, first + s * super_bytes);
    }
}

/* The weights of one tq2_0 or q1_0 block as unsigned codes (2-bit codes 0..3, bits), in weight
 * order; returns the block's float16 scale bits. */
static uint16_t shared_block_codes(int format, const uint8_t *block, uint8_t *codes)
{
    uint16_t scale;
    if (format == FORMAT_TQ2_0) {
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++)
                    codes[128 * h + 32 * l + m] = (uint8_t)((block[32 * h + m] >> (2 * l)) & 3);
        memcpy(&scale, block + 64, 2);
    } else {
        for (int j = 0; j < 128; j++) codes[j] = (uint8_t)((block[2 + j / 8] >> (j % 8)) & 1);
        memcpy(&scale, block, 2);
    }
    return scale;
}

/* One group's records for the formats whose blocks of 32 share a record's scales (dot_record.h):
 * per GGUF block, the 16 rows' float16 scales, then the codes: tq1_0's bytes as stored, 4 of
 * each row per chunk; per block of 32, tq2_0's 2-bit codes in two chunks (chunk t, row byte i:
 * bits 2s..2s+1 hold code 8s+4t+i) or q1_0's bits in one (row byte i: bit s holds code 4s+i). */
static void pack_shared_group(const struct pack_job *job, ptrdiff_t group)
{
    const int format = job->format, block_size = FORMAT_ROWS[format].block_size;
    const int block_bytes = FORMAT_ROWS[format].block_bytes, crumbs = format == FORMAT_TQ2_0;
    const size_t code_bytes = crumbs ? 2 * DOT_CHUNK : DOT_CHUNK;
    const size_t shared_bytes = (size_t)FORMAT_ROWS[format].dot_record_bytes *
                                (size_t)(block_size / QUANT_BLOCK);
    const ptrdiff_t shared = job->blocks / (block_size / QUANT_BLOCK);
    uint8_t *first = job->records + (size_t)group * (size_t)shared * shared_bytes;
    memset(first, 0, (size_t)shared * shared_bytes); /* rows past the last stay zero */
    for (int lane = 0; lane < DOT_GROUP; lane++) {
        const ptrdiff_t n = group * DOT_GROUP + lane;
        if (n >= job->rows) break;
        const uint8_t *row = job->source + (size_t)n * job->row_bytes;
        for (ptrdiff_t b = 0; b < shared; b++) {
            if (format == FORMAT_TQ1_0) { /* the file's bytes of trits, 4 per chunk */
                const uint8_t *block = row + b * block_bytes;
                uint8_t *record = first + (size_t)b * shared_bytes;
                memcpy(record + 2 * lane, block + 52, 2);
                for (int c = 0; c < 13; c++)
                    memcpy(record + 2 * DOT_GROUP + c * DOT_CHUNK + 4 * lane, block + 4 * c, 4);
                continue;
            }
            uint8_t codes[256];
            const uint16_t scale = shared_block_codes(format, row + b * block_bytes, codes);
            uint8_t *record = first + (size_t)b * shared_bytes;
            memcpy(record + 2 * lane, &scale, 2);
            for (int k = 0; k < block_size / QUANT_BLOCK; k++) {
                const uint8_t *c = codes + QUANT_BLOCK * k;
                uint8_t *out = record + 2 * DOT_GROUP + (size_t)k * code_bytes + 4 * lane;
                for (int i = 0; i < 4; i++) {
                    if (crumbs)
                        for (int t = 0; t < 2; t++)
                            out[t * DOT_CHUNK + i] = (uint8_t)(
                                c[4 * t + i] | c[8 + 4 * t + i] << 2 | c[16 + 4 * t + i] << 4 |
                                c[24 + 4 * t + i] << 6);
                    else
                        for (int s = 0; s < 8; s++) out[i] |= (uint8_t)(c[4 * s + i] << s);
                }
            }
        }
    }
}

/* Block b's codes of row `lane` into a record's chunks at `codes` (dot_layout.h): bytes as
 * stored for q8_0, else the low 4 bits as nibble chunks, then the 5- and 6-bit codes' high
 * bits. */
static void pack_codes(int format, const uint8_t *values, int lane, uint8_t *codes)
{
    if (format == FORMAT_Q8_0) {
        for (int j = 0; j < 8; j++) memcpy(codes + j * DOT_CHUNK + 4 * lane, values + 4 * j, 4);
        return;
    }
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++)
            codes[t * DOT_CHUNK + 4 * lane + i] =
                (uint8_t)((values[4 * t + i] & 15) | (values[16 + 4 * t + i] & 15) << 4);
    uint8_t *high = codes + 4 * DOT_CHUNK + 4 * lane;
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) {
            if (HIGH_BIT_CODES(format))
                high[i] |= (uint8_t)(((values[4 * j + i] >> 4) & 1) << j);
            else if (HIGH_CRUMB_CODES(format))
                high[(j / 4) * DOT_CHUNK + i] |=
                    (uint8_t)(((values[4 * j + i] >> 4) & 3) << (2 * (j % 4)));
        }
}

static void pack_group(void *context, ptrdiff_t group)
{
    const struct pack_job *job = context;
    const int format = job->format;
    if (format == FORMAT_Q2_K || format == FORMAT_Q3_K) {
        pack_k_low_group(job, group);
        return;
    }
    if (format == FORMAT_TQ1_0 || format == FORMAT_TQ2_0 || format == FORMAT_Q1_0) {
        pack_shared_group(job, group);
        return;
    }
    const size_t record_bytes = (size_t)FORMAT_ROWS[format].dot_record_bytes;
    const int parameters = HAS_MINIMUM(format) ? 2 : 1;
    const int sub_scales = SUB_SCALE_BYTES(format) / DOT_GROUP;
    uint8_t *first = job->records + (size_t)group * (size_t)job->blocks * record_bytes;
    memset(first, 0, (size_t)job->blocks * record_bytes); /* rows past the last stay zero */
    for (int lane = 0; lane < DOT_GROUP; lane++) {
        const ptrdiff_t n = group * DOT_GROUP + lane;
        if (n >= job->rows) break;
        const uint8_t *row = job->source + (size_t)n * job->row_bytes;
        for (ptrdiff_t b = 0; b < job->blocks; b++) {
            struct block_parts parts = {{0}, {0}, {0}};
            decode(format, row, b, &parts);
            uint8_t *record = first + (size_t)(b - b % SHARED_BLOCKS(format)) * record_bytes;
            uint8_t *codes = record + PARAMETER_BYTES(format) +
                             (size_t)(b % SHARED_BLOCKS(format)) * SHARED_CODE_BYTES(format) +
                             SUB_SCALE_BYTES(format);
            if (format == FORMAT_MXFP4) record[lane] = (uint8_t)parts.halves[0];
            else
                for (int p = 0; p < parameters; p++)
                    memcpy(record + 2 * (p * DOT_GROUP + lane), &parts.halves[p], 2);
            for (int p = 0; p < sub_scales; p++) /* just before the codes */
                codes[(p - sub_scales) * DOT_GROUP + lane] = (uint8_t)parts.sub_scales[p];
            pack_codes(format, parts.codes, lane, codes);
        }
    }
}

int pack_dot_records(int format, const uint8_t *source, ptrdiff_t rows, ptrdiff_t depth,
                     uint8_t *records)
{
    if (format < 0 || format >= FORMAT_COUNT || !FORMAT_ROWS[format].dot_record_bytes ||
        depth % FORMAT_ROWS[format].block_size)
        return -1;
    struct pack_job job = {format, source,
                           (size_t)(depth / FORMAT_ROWS[format].block_size) *
                               (size_t)FORMAT_ROWS[format].block_bytes,
                           rows, depth / QUANT_BLOCK, records};
    pool_run(pack_group, &job, (rows + DOT_GROUP - 1) / DOT_GROUP);
    return 0;
}
