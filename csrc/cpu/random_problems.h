/* Reproducible random inputs for the kernels: the level check program's (check_levels.c) and
 * the tile level's load-time self-check (amx_probe.c).
 *
 * Invariant: a stream started from the same state yields the same values on every machine
 * (integer arithmetic, exact float scaling), and every value is a valid input (finite floats,
 * finite float16 scales, codes inside each format's range).
 */
#ifndef EXACTDRAFT_CPU_RANDOM_PROBLEMS_H
#define EXACTDRAFT_CPU_RANDOM_PROBLEMS_H

#include <stddef.h>
#include <stdint.h>

struct random_stream {
    unsigned long long state;
};

unsigned random_next(struct random_stream *s);
/* A float in [-1, 1), times 2^-10 .. 2^10 with `spread`, exact zeros included. */
float random_stream_float(struct random_stream *s, int spread);
/* `count` such floats in a new malloc'ed array (NULL when out of memory). */
float *random_stream_floats(struct random_stream *s, size_t count, int spread);
/* A float16 of either sign with exponent 2^-6 .. 2^-2. */
uint16_t random_stream_half(struct random_stream *s);
/* Dot-layout records (kernels.h) for `columns` weight rows of K = depth in a malloc'ed array
 * (NULL when out of memory): per group of 16 rows and block, random parameters (float16, or
 * float32 for the k formats), then random codes inside each format's range. */
uint8_t *random_stream_dot_weights(struct random_stream *s, int format, ptrdiff_t columns,
                                   ptrdiff_t depth);

#endif
