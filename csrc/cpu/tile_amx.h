/* tiles.h's operations as the AMX-TILE and AMX-INT8 instructions; for a file compiled with
 * those targets, which dispatch.c runs only where CPUID, XCR0 and the OS grant tile data
 * (amx_probe.c).
 *
 * Invariant: see tiles.h; each operation is one instruction.
 */
#include <immintrin.h>

#include "tiles.h"

#define TILE_LOAD_CONFIG(config) _tile_loadconfig(config)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TILE_DOT_SIGNED_UNSIGNED(c, a, b) _tile_dpbsud(c, a, b)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_RELEASE() _tile_release()
