/* The amx_emulated level: the amx level's code with the tile operations computed in C
 * (tile_emulated.h), so that the tile matmul is tested bit for bit on CPUs without AMX. Tests
 * pin it (dispatch.c's test levels); it is never chosen by default.
 *
 * Invariant: see dot_tiles.h; every line but the tile layer is level_amx.c's.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(EXACTDRAFT_EMULATE_X86)
/* SIMDe: plain x86-64 code */
#elif defined(__clang__)
#pragma clang attribute push(                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#define TILE_LEVEL_NAME "amx_emulated"
#define TILE_LEVEL_FUNCTION kernels_amx_emulated
#include "kernels.h"
#include "dot_avx512vnni.h"
#include "tile_emulated.h"
#include "dot_tiles.h"

#if defined(__clang__) && !defined(EXACTDRAFT_EMULATE_X86)
#pragma clang attribute pop
#endif
#endif
