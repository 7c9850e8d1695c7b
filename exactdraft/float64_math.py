"""exactdraft's own float64 exp, log, sin and cos (and the logistic functions composed of
them): the same bits on every machine.

Invariant: each function is one fixed sequence of IEEE float64 additions, multiplications,
divisions, roundings to integer and exact scalings by powers of two (frexp, ldexp), with no
fused multiply-add, so it returns the same bits wherever numpy runs; csrc/sampler/float64_math.h
performs the identical sequence in C (tests/test_float64_math.py holds the two equal). Platform
libraries (libm, numpy's SIMD loops) may differ from each other in the last bit; these do not.
All are within about one ulp of the true value on the ranges exactdraft uses (the sampler's
uniforms and scores, rope angles), which docs/SAMPLER.md states as part of the sampling rule.

    exp(x): k = rint(x / ln 2), r = (x - k ln2_hi) - k ln2_lo, Taylor polynomial of degree 13
            in Horner form, times 2**k.
    log(x): x = m 2**e with m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f / (2 + f), z = s s,
            R = sum of 2 z**j / (2 j + 1) for j = 1..11 (Horner), log(1 + f) = f - s (f - R),
            result e ln2_hi + (f - (s (f - R) - e ln2_lo)).
    sin(x), cos(x): k = rint(x 2 / pi), r = ((x - k p1) - k p2) - k p3 (p1 + p2 + p3 = pi / 2 in
            33-bit pieces), Taylor polynomials of degree 17 (sin) and 18 (cos), by quadrant.
    log1p(u): w = 1 + u; u where w == 1, else log(w) (u / (w - 1)) (the rounding of 1 + u
            divided back out).
    sigmoid(x) = 1 / (1 + exp(-x)); softplus(x) = log1p(exp(x)), and x itself above 20 (as
            torch's softplus); these two have no C twin (the recurrent layers use them on the
            host, in Python only).
"""

from __future__ import annotations

import numpy as np

LN2_HI = 6.93147180369123816490e-01  # ln 2 to 32 bits: k * LN2_HI is exact for |k| < 2**21
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e+00
SQRT_HALF = 0.70710678118654752440
EXP_MAX, EXP_MIN = 709.782712893384, -745.1332191019412
# 1 / n! for n = 13 .. 2, Horner's order.
EXP_TERMS = tuple(1.0 / f for f in (6227020800.0, 479001600.0, 39916800.0, 3628800.0,
                                    362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0))
# 2 / (2 j + 1) for j = 11 .. 1, Horner's order.
LOG_TERMS = tuple(2.0 / (2 * j + 1) for j in range(11, 0, -1))
PIO2_1 = 1.57079632673412561417e+00  # pi / 2 in three 33-bit pieces
PIO2_2 = 6.07710050630396597660e-11
PIO2_3 = 2.02226624871116645580e-21
TWO_OVER_PI = 6.36619772367581382433e-01
# (-1)**n / (2 n + 1)! for n = 8 .. 1, and (-1)**n / (2 n)! for n = 9 .. 1, Horner's order.
SIN_TERMS = tuple((-1.0) ** n / float(np.prod(np.arange(1, 2 * n + 2, dtype=np.float64)))
                  for n in range(8, 0, -1))
COS_TERMS = tuple((-1.0) ** n / float(np.prod(np.arange(1, 2 * n + 1, dtype=np.float64)))
                  for n in range(9, 0, -1))


def _horner(z: np.ndarray, terms: tuple[float, ...]) -> np.ndarray:
    total = np.full_like(z, terms[0])
    for term in terms[1:]:  # in place: the same operations, without a new array each
        np.multiply(total, z, out=total)
        np.add(total, term, out=total)
    return total


def exp(x: np.ndarray | float) -> np.ndarray:
    """e**x, elementwise, float64."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.where(np.isfinite(x), x, 0.0)
    clipped = np.minimum(np.maximum(finite, -800.0), 800.0)
    k = np.rint(clipped * INV_LN2)
    r = (clipped - k * LN2_HI) - k * LN2_LO
    p = _horner(r, EXP_TERMS)
    value = p * r * r + r + 1.0
    with np.errstate(over="ignore"):  # results past EXP_MAX are replaced by inf below
        value = np.ldexp(value, k.astype(np.int64))
    value = np.where(x > EXP_MAX, np.inf, value)
    value = np.where(x < EXP_MIN, 0.0, value)
    return np.where(np.isnan(x), np.nan, value)


def log(x: np.ndarray | float) -> np.ndarray:
    """Natural log, elementwise, float64: -inf at 0, NaN below 0 and for NaN."""
    x = np.asarray(x, dtype=np.float64)
    usable = (x > 0) & np.isfinite(x)
    m, e = np.frexp(np.where(usable, x, 1.0))
    low = m < SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = (e - low).astype(np.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    big_r = z * _horner(z, LOG_TERMS)
    value = e * LN2_HI + (f - (s * (f - big_r) - e * LN2_LO))
    value = np.where(x == 0, -np.inf, value)
    value = np.where(x == np.inf, np.inf, value)
    return np.where((x < 0) | np.isnan(x), np.nan, value)


def _reduced(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sin r, cos r, quadrant k mod 4) with x = k pi / 2 + r."""
    k = np.rint(x * TWO_OVER_PI)
    r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3
    z = r * r
    sin_r = r + r * z * _horner(z, SIN_TERMS)
    cos_r = 1.0 + z * _horner(z, COS_TERMS)
    return sin_r, cos_r, np.mod(k, 4.0)


def sincos(x: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(sin x, cos x), elementwise, float64, for |x| < 2**20 (rope angles)."""
    sin_r, cos_r, quadrant = _reduced(np.asarray(x, dtype=np.float64))
    first, second, third = quadrant == 0, quadrant == 1, quadrant == 2
    sine = np.select([first, second, third], [sin_r, cos_r, -sin_r], -cos_r)
    cosine = np.select([first, second, third], [cos_r, -sin_r, -cos_r], sin_r)
    return sine, cosine


def sin(x: np.ndarray | float) -> np.ndarray:
    """sin x, elementwise, float64, for |x| < 2**20."""
    return sincos(x)[0]


def cos(x: np.ndarray | float) -> np.ndarray:
    """cos x, elementwise, float64, for |x| < 2**20."""
    return sincos(x)[1]


def power(base: float, y: np.ndarray) -> np.ndarray:
    """base**y for base > 0, elementwise, as exp(y log(base))."""
    return exp(np.asarray(y, dtype=np.float64) * log(base))


def log1p(u: np.ndarray | float) -> np.ndarray:
    """log(1 + u), elementwise, float64, accurate for small u (u > -1)."""
    u = np.asarray(u, dtype=np.float64)
    w = 1.0 + u
    denominator = np.where(w == 1.0, 1.0, w - 1.0)
    return np.where(w == 1.0, u, log(w) * (u / denominator))


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    """1 / (1 + e**-x), elementwise, float64."""
    return 1.0 / (1.0 + exp(-np.asarray(x, dtype=np.float64)))


SOFTPLUS_LINEAR_ABOVE = 20.0  # torch's softplus threshold: x itself above it


def softplus(x: np.ndarray | float) -> np.ndarray:
    """log(1 + e**x), elementwise, float64; x itself above SOFTPLUS_LINEAR_ABOVE."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > SOFTPLUS_LINEAR_ABOVE, x, log1p(exp(np.minimum(x, SOFTPLUS_LINEAR_ABOVE))))
