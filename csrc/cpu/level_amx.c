/* The amx level: the avx512vnni level with the integer-dot matmul on AMX tiles (dot_tiles.h
 * over tile_amx.h), for passes of two rows or more.
 *
 * Invariant: see dot_tiles.h; this file only picks the tile layer and the instruction set, and
 * shares every other line with level_amx_emulated.c. dispatch.c offers the level only after
 * amx_probe.c found the instructions, got the OS's permission for tile data and saw the level
 * reproduce the avx512vnni level's bits.
 */
#include "kernels.h"

#if defined(HAVE_AMX_LEVEL)
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(                                                              \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma," \
                          "f16c"))),                                                       \
    apply_to = function)
#else
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#define TILE_LEVEL_NAME "amx"
#define TILE_LEVEL_FUNCTION kernels_amx
#include "dot_avx512vnni.h"
#include "tile_amx.h"
#include "dot_tiles.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
