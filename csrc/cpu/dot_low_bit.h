/* The row sums of tq2_0's 2-bit codes ("crumbs", dot_record.h) for dot_body.h, after
 * dot_record.h: a level with its own decode for few rows defines DOT_CRUMB_ROWS and
 * dot_crumb_rows; every other level decodes the crumbs to byte codes and sums them as
 * dot_u8_rows does.
 *
 * Invariant: isum[r] is the exact integer starts[2 r] + sum over the block of code * x_r,
 * whichever way a level decodes the codes, so the bits do not depend on the level.
 */
#ifndef EXACTDRAFT_CPU_DOT_LOW_BIT_H
#define EXACTDRAFT_CPU_DOT_LOW_BIT_H

#ifndef DOT_CRUMB_ROWS
static ALWAYS_INLINE void dot_crumb_rows(const uint8_t *chunks, const int8_t *x,
                                         const int32_t *starts, const int rows, vi *isum)
{
    struct dot_codes w;
    dot_load_crumbs(chunks, &w);
    dot_u8_rows(&w, x, starts, rows, isum);
}
#endif

#endif
