"""Statistics of a comparison over a few RNG seeds: Student-t quantiles, the paired t interval, Holm's correction, MDE.

The t distribution is computed here (regularized incomplete beta function by its continued fraction, inverted by
bisection) rather than taken from SciPy: these few functions are all `compare` needs, and SciPy would be a large
dependency for them. `tests/test_stats.py` checks them against closed forms and numerical integration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.05  # two-sided level of every interval and test of `compare`, fixed in advance
POWER = 0.8  # the power at which the minimum detectable effect is stated


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method (converges for x < (a+1)/(a+b+2))."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 10_000):
        # Even step: m (b - m) x / ((a + 2m - 1)(a + 2m)); odd step: -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)).
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return value


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1 and a, b > 0."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log1p(-x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2.0, 0.5)  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`, to about 1e-12)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class PairedT:
    """A paired t analysis of per-seed differences: mean, interval, two-sided p-value, spread, and detectable effect."""

    mean: float
    low: float
    high: float
    p_value: float
    sd: float  # sample standard deviation of the per-seed differences (ddof = 1)
    n: int
    mde: float  # the smallest true mean difference detected with probability POWER at level ALPHA (see `paired_t`)


def paired_t(differences: Sequence[float], alpha: float = ALPHA, power: float = POWER) -> PairedT:
    """The paired t interval and test of per-seed differences (df = n - 1), and the minimum detectable effect.

    MDE = (t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n): the usual normal-shift approximation of the
    noncentral t power calculation, with the observed SD standing in for the true one. At 5 seeds it is about 1%
    below the exact noncentral-t value. With fewer than two seeds everything but the mean is NaN.
    """
    values = [float(v) for v in differences if not math.isnan(float(v))]
    n = len(values)
    if n == 0:
        return PairedT(math.nan, math.nan, math.nan, math.nan, math.nan, 0, math.nan)
    mean = sum(values) / n
    if n < 2:
        return PairedT(mean, math.nan, math.nan, math.nan, math.nan, n, math.nan)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    error = sd / math.sqrt(n)
    critical = t_quantile(1.0 - alpha / 2.0, n - 1)
    if error == 0.0:  # every seed gave the same difference: a zero-width interval, decided by its sign
        p_value = 1.0 if mean == 0.0 else 0.0
    else:
        p_value = 2.0 * (1.0 - t_cdf(abs(mean) / error, n - 1))
    mde = (critical + t_quantile(power, n - 1)) * error
    return PairedT(mean, mean - critical * error, mean + critical * error, p_value, sd, n, mde)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given; NaN p-values stay NaN and do not count in the family.

    Sorted ascending, the i-th smallest of m is multiplied by m - i + 1 (i from 1), capped at 1, and made
    non-decreasing. Rejecting where the adjusted p-value is below alpha controls the family-wise error at alpha.
    """
    finite = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - rank) * p))
        adjusted[i] = running
    return adjusted
