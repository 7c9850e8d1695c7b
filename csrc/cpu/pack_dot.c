/* Packing GGUF block rows into the dot layout (kernels.h) at load time.
 *
 * Invariant: a record holds exactly the values its GGUF blocks encode, split as the dot
 * layout reads them: w = scale * (code - offset) + minimum, with float16 parameters copied bit
 * for bit and the k formats' float32 parameters formed as the single float32 products ggml forms
 * (d * sc, -(dmin * m)), which are exact; codes are the stored integers, unsigned. It is the C
 * twin of the format rows' block_fields (exactdraft/formats/table.py, formats/dequantize.py),
 * which tests hold it equal to. The lookup formats' records (lookup_values.h) keep their stored
 * nibbles, which index the format's table, and their parameters as stored; tests hold them
 * equal to a numpy packing of the raw blocks.
 */
#include "pack_dot.h"

#include <string.h>

#include "lookup_values.h"
#include "thread_pool.h"

static float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return half_bits_to_float(h);
}

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
    uint16_t halves[2];   /* float16 scale (and minimum) */
    float floats[2];      /* float32 scale and minimum, or q6_k's two scales */
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
        out->floats[0] = half_at(block) * (float)scale;
        out->floats[1] = -(half_at(block + 2) * (float)minimum);
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
        const float d = half_at(block + 208);
        const int8_t *scales = (const int8_t *)(block + 192);
        const int sub = (int)(b % 8) * 2;
        out->floats[0] = d * (float)scales[sub];
        out->floats[1] = d * (float)scales[sub + 1];
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
        out->halves[1] = (uint16_t)(int8_t)(ls - 32); /* the record keeps ls - 32 as an int8 */
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

static void pack_group(void *context, ptrdiff_t group)
{
    const struct pack_job *job = context;
    const int format = job->format;
    const size_t record_bytes = (size_t)FORMAT_ROWS[format].dot_record_bytes;
    const int nibbles = format == FORMAT_Q4_0 || format == FORMAT_Q4_1 || format == FORMAT_Q4_K ||
                        LOOKUP_CODES(format);
    const int floats = format == FORMAT_Q4_K || format == FORMAT_Q5_K || format == FORMAT_Q6_K;
    const int two = format == FORMAT_Q4_1 || format == FORMAT_Q5_1 || floats;
    const size_t parameter_bytes = LOOKUP_CODES(format)
                                       ? (size_t)LOOKUP_PARAMETER_BYTES(format)
                                       : (size_t)(floats ? 4 : 2) * DOT_GROUP * (two ? 2 : 1);
    uint8_t *first = job->records + (size_t)group * (size_t)job->blocks * record_bytes;
    memset(first, 0, (size_t)job->blocks * record_bytes); /* rows past the last stay zero */
    for (int lane = 0; lane < DOT_GROUP; lane++) {
        const ptrdiff_t n = group * DOT_GROUP + lane;
        if (n >= job->rows) break;
        const uint8_t *row = job->source + (size_t)n * job->row_bytes;
        for (ptrdiff_t b = 0; b < job->blocks; b++) {
            struct block_parts parts = {{0}, {0}, {0}};
            decode(format, row, b, &parts);
            uint8_t *record = first + (size_t)b * record_bytes;
            if (format == FORMAT_IQ4_XS) /* float16 d, then the int8 ls - 32 */
                record[2 * DOT_GROUP + lane] = (uint8_t)parts.halves[1];
            if (format == FORMAT_MXFP4) record[lane] = (uint8_t)parts.halves[0];
            else for (int p = 0; p < (two ? 2 : 1); p++) {
                if (floats) memcpy(record + 4 * (p * DOT_GROUP + lane), &parts.floats[p], 4);
                else memcpy(record + 2 * (p * DOT_GROUP + lane), &parts.halves[p], 2);
            }
            uint8_t *codes = record + parameter_bytes;
            if (nibbles) {
                for (int t = 0; t < 4; t++)
                    for (int i = 0; i < 4; i++)
                        codes[t * DOT_CHUNK + 4 * lane + i] = (uint8_t)(
                            parts.codes[4 * t + i] | (parts.codes[16 + 4 * t + i] << 4));
            } else {
                for (int j = 0; j < 8; j++)
                    memcpy(codes + j * DOT_CHUNK + 4 * lane, parts.codes + 4 * j, 4);
            }
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
