/* SAMPLER.md's draw (steps 3-9) on a processed float64 logits row, in plain C (see draw.c). */
#ifndef EXACTDRAFT_SAMPLER_DRAW_H
#define EXACTDRAFT_SAMPLER_DRAW_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* How step 7 (top-p) is computed; every path returns the same token. */
enum top_p_path {
    TOP_P_AUTO = 0,       /* bounded for many candidates, exhaustive for few */
    TOP_P_EXHAUSTIVE = 1, /* sort every candidate that can move the sum, sum them all */
    TOP_P_BOUNDED = 2,    /* bracket the sum's tail, fall back to exhaustive when undecided */
};

/* The plain draw's scans of the row: SCAN_BEST is the best one the CPU runs. */
enum row_scan { SCAN_BEST, SCAN_SCALAR, SCAN_AVX2, SCAN_AVX512, SCAN_COUNT };

/* out[i] = (double)row[i] for i < n (exact). */
void widen_row(const float *row, double *out, size_t n);

/* Whether this build and CPU run `scan`. */
int scan_available(enum row_scan scan);

struct draw_request {
    const double *x;
    size_t vocab; /* 1 <= vocab <= UINT32_MAX */
    size_t top_k;
    double temperature, top_p, min_p;
    uint64_t seed, pos;
    enum top_p_path top_p_path;
    enum row_scan scan; /* how the plain draw scans the row (tests pick one; the same token) */
    /* NULL: x[i] is the logit of token i. Else x[i] is that of token tokens[i], the tokens
     * strictly ascending (so index order is token order), and the draw runs among the listed
     * tokens alone: it keys the noise by tokens[i] and returns the index i of the winner. */
    const uint64_t *tokens;
};

enum draw_status {
    DRAW_OK,
    DRAW_NAN,                /* index: the first NaN */
    DRAW_NO_FINITE_MAXIMUM,  /* value: the best scaled score */
    DRAW_UNIT_UNIFORM,       /* index: the token whose keyed uniform rounds to 1.0 */
    DRAW_NO_MEMORY,
};

struct draw_result {
    enum draw_status status;
    size_t index; /* the token when DRAW_OK */
    double value;
};

/* Not reentrant (it reuses module-wide scratch memory): callers serialize calls. */
struct draw_result draw(const struct draw_request *request);

/* Top-p decisions so far: [exhaustive, bounded and decided, bounded then exhaustive]. */
void top_p_path_counts(uint64_t counts[3]);

static inline int highest_bit(uint64_t v) /* v != 0 */
{
#if defined(__GNUC__) || defined(__clang__)
    return 63 - __builtin_clzll(v);
#else
    int bit = 0;
    while (v >>= 1) bit++;
    return bit;
#endif
}

static inline int lowest_bit(uint64_t v) /* v != 0 */
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(v);
#else
    int bit = 0;
    while (!(v & 1)) v >>= 1, bit++;
    return bit;
#endif
}

#define SIGN_BIT (1ull << 63)

/* Ascending in the value; -0.0 and +0.0 (which compare equal) share a key. Branch-free form of
 * (negative ? SIGN_BIT - magnitude : SIGN_BIT + magnitude). */
static inline uint64_t order_key(double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint64_t negative = 0 - (bits >> 63), magnitude = bits & ~SIGN_BIT;
    return SIGN_BIT + ((magnitude ^ negative) - negative);
}

/* Buckets group candidates by depth below the best scaled score s0: b = floor((s0 - s) * 256),
 * from s itself or from a rough s that is a non-decreasing function of x. Either way b never
 * increases as x grows, so the candidates of the buckets below any bound are a prefix of step
 * 4's order, and equal x share a bucket. */
#define BUCKETS_PER_UNIT 256.0
#define BUCKET_COUNT (45 * 256 + 2)

/* Candidate lists: ids ascending on entry. A candidate's key is top_key - order_key(x): 0 for
 * the largest x, growing as x falls, equal for equal x. Within any run of equal keys ids
 * ascend, which every operation keeps, so a stable sort by key gives step 4's order. */
struct candidates {
    size_t count;
    uint32_t *ids;
    uint32_t *buckets;
    uint64_t *keys; /* room for count keys, filled on demand */
    uint64_t top_key;
};

struct sort_space {
    uint64_t *keys[2];
    uint32_t *ids[2];
};

/* Counts per bucket into counts[BUCKET_COUNT]; returns one past the deepest bucket used. */
size_t count_buckets(const struct candidates *c, uint32_t *counts);
void fill_keys(const double *x, uint64_t top_key, const uint32_t *ids, uint64_t *keys,
               size_t n);
uint32_t *sort_by_key(uint64_t *keys, uint32_t *ids, uint64_t *spare_keys, uint32_t *spare_ids,
                      size_t n);
/* Step 5: keeps the k (0 < k < count) first candidates in step 4's order. */
void keep_top_k(const double *x, struct candidates *c, size_t k, struct sort_space *space);

/* Step 7 on c, all candidates with s - s0 >= TOP_P_RELEVANT_FROM (maybe cut by top-k), their
 * buckets from s itself: returns how many top-p keeps and sets *sorted to their ids in step 4's
 * order. */
#define TOP_P_RELEVANT_FROM (-38.0)
size_t top_p_keep(const double *x, double temperature, double s0, double top_p,
                  struct candidates *c, struct sort_space *space, double *sums,
                  enum top_p_path path, const uint32_t **sorted);

#endif
