/* The tile operations the tile matmul (dot_tiles.h) is written against, as the x86 AMX-INT8
 * instructions define them; tile_amx.h maps them onto the instructions, tile_emulated.h
 * computes them in C. A level includes one of the two before dot_tiles.h.
 *
 * Invariant: both give each operation the documented semantics, so the matmul above them
 * writes the same bits either way:
 * - TILE_LOAD_CONFIG(config): load the 64-byte configuration (palette 1) of this thread;
 * - TILE_ZERO(t): every byte of tile t is 0;
 * - TILE_LOAD(t, base, stride): row r < rows[t] of tile t is the colsb[t] bytes at
 *   base + r * stride;
 * - TILE_DOT_SIGNED_UNSIGNED(c, a, b): for m < rows[c], n < colsb[c] / 4:
 *   C[m][n] += sum over k < colsb[a] / 4, i < 4 of A[m][4k + i] (int8) * B[k][4n + i] (uint8),
 *   in int32 arithmetic that wraps;
 * - TILE_STORE(t, base, stride): the inverse of TILE_LOAD;
 * - TILE_RELEASE(): back to the unconfigured state.
 * The tile numbers are compile-time constants. Whatever a tile instruction reads (the
 * configuration included) lives in memory that is not the stack.
 */
#ifndef EXACTDRAFT_CPU_TILES_H
#define EXACTDRAFT_CPU_TILES_H

#include <stdint.h>

#define TILE_COUNT 8
#define TILE_MAX_ROWS 16
#define TILE_MAX_BYTES 64

/* The layout LDTILECFG reads. */
struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];      /* bytes per row of tile t */
    uint8_t rows[16];
};

#endif
