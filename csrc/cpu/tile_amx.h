/* tiles.h's operations as the AMX-TILE and AMX-INT8 instructions; for a file compiled with
 * those targets, which dispatch.c runs only where CPUID, XCR0 and the OS grant tile data
 * (amx_probe.c).
 *
 * Invariant: see tiles.h; each operation is one instruction, in program order with the
 * memory accesses around it.
 */
#include <immintrin.h>

#include "tiles.h"

/* GCC's _tile_loadd and _tile_loadconfig (12 at least) are asm statements that do not tell the
 * compiler which memory they read, so it could move the stores that fill their source (the
 * configuration, a block's unpacked codes) across them: a compiler barrier on either side keeps
 * memory in program order (it costs no instruction). */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")
#define TILE_LOAD_CONFIG(config) \
    do { MEMORY_BARRIER(); _tile_loadconfig(config); MEMORY_BARRIER(); } while (0)
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) \
    do { MEMORY_BARRIER(); _tile_loadd(t, base, stride); MEMORY_BARRIER(); } while (0)
#define TILE_DOT_SIGNED_UNSIGNED(c, a, b) _tile_dpbsud(c, a, b)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_RELEASE() _tile_release()
