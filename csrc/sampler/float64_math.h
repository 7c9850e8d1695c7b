/* exactdraft's own float64 exp and log, the C twin of exactdraft/float64_math.py.
 *
 * Invariant: each function performs exactly the operation sequence of its Python twin (IEEE
 * float64 +, -, *, /, rounding to an integer, frexp and ldexp; the build turns contraction into
 * fused multiply-adds off), so the two give the same bits on every machine, which the C
 * library's exp and log do not promise.
 */
#ifndef EXACTDRAFT_SAMPLER_FLOAT64_MATH_H
#define EXACTDRAFT_SAMPLER_FLOAT64_MATH_H

#include <math.h>

#define XD_LN2_HI 6.93147180369123816490e-01
#define XD_LN2_LO 1.90821492927058770002e-10
#define XD_INV_LN2 1.44269504088896338700e+00
#define XD_SQRT_HALF 0.70710678118654752440
#define XD_EXP_MAX 709.782712893384
#define XD_EXP_MIN -745.1332191019412

/* 1 / n! for n = 13 .. 2 and 2 / (2 j + 1) for j = 11 .. 1, in Horner's order. */
static const double XD_EXP_TERMS[12] = {
    1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
    1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,
    1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,        1.0 / 2.0};
static const double XD_LOG_TERMS[11] = {2.0 / 23, 2.0 / 21, 2.0 / 19, 2.0 / 17, 2.0 / 15, 2.0 / 13,
                                        2.0 / 11, 2.0 / 9,  2.0 / 7,  2.0 / 5,  2.0 / 3};

static inline double xd_horner(double z, const double *terms, int count)
{
    double total = terms[0];
    for (int i = 1; i < count; i++) total = total * z + terms[i];
    return total;
}

static inline double xd_exp(double x)
{
    if (x != x) return x;
    if (x > XD_EXP_MAX) return INFINITY;
    if (x < XD_EXP_MIN) return 0.0;
    const double k = nearbyint(x * XD_INV_LN2);
    const double r = (x - k * XD_LN2_HI) - k * XD_LN2_LO;
    const double p = xd_horner(r, XD_EXP_TERMS, 12);
    return ldexp(p * r * r + r + 1.0, (int)k);
}

static inline double xd_log(double x)
{
    if (x != x || x < 0) return NAN;
    if (x == 0) return -INFINITY;
    if (x == INFINITY) return INFINITY;
    int exponent;
    double m = frexp(x, &exponent);
    if (m < XD_SQRT_HALF) {
        m = m * 2.0;
        exponent -= 1;
    }
    const double e = (double)exponent;
    const double f = m - 1.0, s = f / (2.0 + f), z = s * s;
    const double big_r = z * xd_horner(z, XD_LOG_TERMS, 11);
    return e * XD_LN2_HI + (f - (s * (f - big_r) - e * XD_LN2_LO));
}

#endif
