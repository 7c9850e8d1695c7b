/* Ordering candidates by (x descending, id ascending) without comparison sorts: SAMPLER.md's
 * step 4 order, and step 5 (top-k) in it.
 *
 * Invariant: keys are 0 for the largest x and grow as x falls, equal exactly when the x values
 * compare equal; within every run of equal keys the ids ascend, and every operation here keeps
 * that, so a stable sort by key is step 4's order.
 */
#include "draw.h"

#define MAX_SORT_PASSES 6
#define MAX_DIGIT_BITS 12

size_t count_buckets(const struct candidates *c, uint32_t *counts)
{
    uint32_t deepest = 0;
    memset(counts, 0, BUCKET_COUNT * sizeof *counts);
    for (size_t i = 0; i < c->count; i++) {
        const uint32_t b = c->buckets[i];
        counts[b]++;
        deepest = b > deepest ? b : deepest;
    }
    return c->count ? (size_t)deepest + 1 : 0;
}

void fill_keys(const double *x, uint64_t top_key, const uint32_t *ids, uint64_t *keys, size_t n)
{
    for (size_t j = 0; j < n; j++) keys[j] = top_key - order_key(x[ids[j]]);
}

/* Stable LSD radix sort of n (key, id) pairs by key over the bits that vary, with the spare
 * arrays as the other half of each pass; returns the array that holds the sorted ids. */
uint32_t *sort_by_key(uint64_t *keys, uint32_t *ids, uint64_t *spare_keys, uint32_t *spare_ids,
                      size_t n)
{
    static uint32_t counts[MAX_SORT_PASSES][1u << MAX_DIGIT_BITS];
    uint64_t any = 0;
    for (size_t j = 0; j < n; j++) any |= keys[j];
    if (n < 2 || any == 0) return ids;
    const int low = lowest_bit(any), width = highest_bit(any) - low + 1;
    const int passes = (width + MAX_DIGIT_BITS - 1) / MAX_DIGIT_BITS;
    const int bits = (width + passes - 1) / passes;
    const uint64_t mask = (1ull << bits) - 1;
    for (int p = 0; p < passes; p++) memset(counts[p], 0, (mask + 1) * sizeof(uint32_t));
    for (size_t j = 0; j < n; j++)
        for (int p = 0; p < passes; p++) counts[p][(keys[j] >> (low + p * bits)) & mask]++;
    for (int p = 0; p < passes; p++) {
        const int shift = low + p * bits;
        uint32_t *count = counts[p];
        if (count[(keys[0] >> shift) & mask] == n) continue; /* one digit for all: no move */
        uint32_t start = 0;
        for (uint64_t d = 0; d <= mask; d++) {
            uint32_t here = count[d];
            count[d] = start;
            start += here;
        }
        for (size_t j = 0; j < n; j++) {
            uint32_t to = count[(keys[j] >> shift) & mask]++;
            spare_keys[to] = keys[j];
            spare_ids[to] = ids[j];
        }
        uint64_t *swap_keys = keys;
        uint32_t *swap_ids = ids;
        keys = spare_keys, spare_keys = swap_keys;
        ids = spare_ids, spare_ids = swap_ids;
    }
    return ids;
}

/* The k first candidates are those of the buckets before the bucket where the running count
 * reaches k, then the first ones of that bucket in step 4's order (found by sorting it). They
 * are left as the first group in id order, then the second group in step 4's order: equal keys
 * only meet within one bucket, so their ids still ascend. */
void keep_top_k(const double *x, struct candidates *c, size_t k, struct sort_space *space)
{
    static uint32_t counts[BUCKET_COUNT];
    count_buckets(c, counts);
    size_t cut = 0, before = 0;
    while (before + counts[cut] < k) before += counts[cut++];
    uint32_t *tied = space->ids[0];
    size_t kept = 0, in_cut = 0;
    for (size_t i = 0; i < c->count; i++) { /* branch-free: written, then kept or not */
        const uint32_t id = c->ids[i], b = c->buckets[i];
        tied[in_cut] = id;
        in_cut += b == cut;
        c->ids[kept] = id;
        c->buckets[kept] = b;
        kept += b < cut;
    }
    fill_keys(x, c->top_key, tied, space->keys[0], in_cut);
    const uint32_t *sorted = sort_by_key(space->keys[0], tied, space->keys[1], space->ids[1],
                                         in_cut);
    for (size_t j = 0; kept < k; j++, kept++) {
        c->ids[kept] = sorted[j];
        c->buckets[kept] = (uint32_t)cut;
    }
    c->count = k;
}
