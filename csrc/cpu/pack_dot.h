/* Packing GGUF block rows into the dot layout (kernels.h) at load time; see pack_dot.c. */
#ifndef EXACTDRAFT_CPU_PACK_DOT_H
#define EXACTDRAFT_CPU_PACK_DOT_H

#include "kernels.h"

/* records [ceil(rows / 16), depth / 32 * dot record bytes] from source [rows, row bytes] of a
 * format with a dot kernel; returns 0, or -1 for a format or depth it cannot pack. */
int pack_dot_records(int format, const uint8_t *source, ptrdiff_t rows, ptrdiff_t depth,
                     uint8_t *records);

#endif
