/* tiles.h's operations computed in C, one tile register file per thread, so that the tile
 * matmul runs (and is tested bit for bit) on CPUs without AMX.
 *
 * Invariant: see tiles.h; each operation follows the instruction's documented pseudocode,
 * including what it zeroes, and stops the process (as the instruction faults) where the
 * hardware would: a tile operation before the thread loaded a configuration, or shapes that do
 * not fit the configuration.
 */
#include <stdlib.h>
#include <string.h>

#include "tiles.h"

struct emulated_tiles {
    struct tile_config config;
    uint8_t data[TILE_COUNT][TILE_MAX_ROWS][TILE_MAX_BYTES];
};

static _Thread_local struct emulated_tiles emulated_tiles;

static inline void emulated_check(int configured)
{
    if (!configured || emulated_tiles.config.palette != 1) abort();
}

static inline void emulated_load_config(const struct tile_config *config)
{
    if (config->palette != 1) abort();
    for (int t = 0; t < TILE_COUNT; t++)
        if (config->rows[t] > TILE_MAX_ROWS || config->colsb[t] > TILE_MAX_BYTES) abort();
    emulated_tiles.config = *config;
    memset(emulated_tiles.data, 0, sizeof emulated_tiles.data);
}

static inline void emulated_zero(int t)
{
    emulated_check(1);
    memset(emulated_tiles.data[t], 0, sizeof emulated_tiles.data[t]);
}

static inline void emulated_load(int t, const void *base, size_t stride)
{
    const struct tile_config *c = &emulated_tiles.config;
    emulated_check(c->rows[t] && c->colsb[t]);
    memset(emulated_tiles.data[t], 0, sizeof emulated_tiles.data[t]);
    for (int r = 0; r < c->rows[t]; r++)
        memcpy(emulated_tiles.data[t][r], (const uint8_t *)base + (size_t)r * stride, c->colsb[t]);
}

static inline void emulated_store(int t, void *base, size_t stride)
{
    const struct tile_config *c = &emulated_tiles.config;
    emulated_check(c->rows[t] && c->colsb[t]);
    for (int r = 0; r < c->rows[t]; r++)
        memcpy((uint8_t *)base + (size_t)r * stride, emulated_tiles.data[t][r], c->colsb[t]);
}

/* TDPBSUD: C[m][n] += sum of A[m][4k + i] (signed) * B[k][4n + i] (unsigned), wrapping. The
 * sum is taken over (k, i) in order with B transposed first, so that the compiler runs the n
 * lanes side by side (wrapping int32 sums are exact in any order). */
static inline void emulated_dot_signed_unsigned(int c, int a, int b)
{
    const struct tile_config *config = &emulated_tiles.config;
    const int rows = config->rows[c], words = config->colsb[c] / 4, depth = config->colsb[a];
    emulated_check(rows && rows == config->rows[a] && depth / 4 == config->rows[b] &&
                   config->colsb[c] == config->colsb[b] && config->colsb[c] % 4 == 0 &&
                   depth % 4 == 0);
    uint32_t codes[TILE_MAX_BYTES][TILE_MAX_BYTES / 4] = {{0}}; /* [4k + i][n] = B[k][4n + i] */
    for (int k = 0; k < depth / 4; k++)
        for (int n = 0; n < words; n++)
            for (int i = 0; i < 4; i++) codes[4 * k + i][n] = emulated_tiles.data[b][k][4 * n + i];
    for (int m = 0; m < rows; m++) {
        uint8_t *row = emulated_tiles.data[c][m];
        uint32_t sums[TILE_MAX_BYTES / 4];
        memcpy(sums, row, sizeof sums);
        for (int j = 0; j < depth; j++) {
            const uint32_t x = (uint32_t)(int32_t)(int8_t)emulated_tiles.data[a][m][j];
            for (int n = 0; n < TILE_MAX_BYTES / 4; n++) sums[n] += x * codes[j][n];
        }
        memset(row, 0, TILE_MAX_BYTES);
        memcpy(row, sums, 4 * (size_t)words);
    }
    for (int m = rows; m < TILE_MAX_ROWS; m++) memset(emulated_tiles.data[c][m], 0, TILE_MAX_BYTES);
}

static inline void emulated_release(void)
{
    memset(&emulated_tiles.config, 0, sizeof emulated_tiles.config);
}

#define TILE_LOAD_CONFIG(config) emulated_load_config(config)
#define TILE_ZERO(t) emulated_zero(t)
#define TILE_LOAD(t, base, stride) emulated_load(t, base, stride)
#define TILE_DOT_SIGNED_UNSIGNED(c, a, b) emulated_dot_signed_unsigned(c, a, b)
#define TILE_STORE(t, base, stride) emulated_store(t, base, stride)
#define TILE_RELEASE() emulated_release()
