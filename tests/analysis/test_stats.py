"""The statistics of `compare`: Student-t quantiles, the paired t interval and test, Holm's correction, the MDE."""

import math

import numpy as np
import pytest

from ts_trl.analysis.stats import holm, paired_t, t_cdf, t_quantile


def _t_density(t, df):
    """Student's t density, vectorized: the independent reference the CDF is integrated from."""
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    return scale * (1 + np.asarray(t, dtype=np.float64) ** 2 / df) ** (-(df + 1) / 2)


@pytest.mark.parametrize("p", [0.6, 0.8, 0.9, 0.975, 0.995, 0.2, 0.025])
def test_t_quantile_matches_the_closed_forms(p):
    # df = 1 is the Cauchy distribution, df = 2 and df = 4 have closed-form quantiles.
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    alpha = 4 * p * (1 - p)
    q = math.cos(math.acos(math.sqrt(alpha)) / 3) / math.sqrt(alpha)
    assert t_quantile(p, 4) == pytest.approx(math.copysign(2 * math.sqrt(q - 1), p - 0.5), rel=1e-9)


@pytest.mark.parametrize("df", [3, 4, 7, 19, 2.5])
def test_t_cdf_matches_numerical_integration_of_the_density(df):
    grid = np.linspace(0.0, 6.0, 600_001)
    values = _t_density(grid, df)
    cumulative = 0.5 + np.concatenate([[0.0], np.cumsum((values[1:] + values[:-1]) / 2 * np.diff(grid))])
    for t in (0.3, 1.0, 2.0, 2.776, 4.5):
        index = int(round(t / 6.0 * 600_000))
        assert t_cdf(grid[index], df) == pytest.approx(cumulative[index], abs=1e-9)
        assert t_cdf(-grid[index], df) == pytest.approx(1 - cumulative[index], abs=1e-9)
    # The quantile inverts the CDF, and far out the t distribution becomes the normal one.
    assert t_cdf(t_quantile(0.9, df), df) == pytest.approx(0.9, abs=1e-12)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)


def test_paired_t_recomputed_by_hand():
    differences = [0.10, 0.20, 0.00, 0.15, 0.05]  # mean 0.1; squared deviations sum to 0.025; sd = sqrt(0.025/4)
    result = paired_t(differences)
    sd = math.sqrt(0.025 / 4)
    error = sd / math.sqrt(5)
    critical = 2.7764451051977987  # t_{0.975, 4}, the table value
    assert (result.mean, result.sd, result.n) == (pytest.approx(0.1), pytest.approx(sd), 5)
    assert result.low == pytest.approx(0.1 - critical * error, rel=1e-9)
    assert result.high == pytest.approx(0.1 + critical * error, rel=1e-9)
    # Two-sided p from the t statistic 0.1 / error = 2.828...: numerically integrate the df = 4 density beyond it.
    statistic = 0.1 / error
    grid = np.linspace(statistic, 2000.0, 4_000_001)  # the density falls as t^-5: the tail past 2000 is ~1e-14
    tail = np.trapezoid(_t_density(grid, 4), grid)
    assert result.p_value == pytest.approx(2 * tail, rel=1e-5)
    assert 0.04 < result.p_value < 0.05  # the interval barely excludes 0
    # MDE at 80% power: (t_{0.975,4} + t_{0.8,4}) sd / sqrt(n), t_{0.8,4} = 0.9409645772 (table value).
    assert result.mde == pytest.approx((critical + 0.9409645772) * error, rel=1e-9)


def test_paired_t_with_too_few_or_identical_seeds():
    one = paired_t([0.3])
    assert one.mean == 0.3 and math.isnan(one.low) and math.isnan(one.p_value) and math.isnan(one.mde)
    same = paired_t([0.25, 0.25, 0.25])
    assert same.low == same.high == 0.25 and same.p_value == 0.0 and same.mde == 0.0
    assert paired_t([0.0, 0.0]).p_value == 1.0
    assert paired_t([float("nan"), 0.1, 0.3]).n == 2  # a seed that lacks the endpoint is left out


def test_holm_adjusts_step_down_and_keeps_the_order():
    p = [0.01, 0.04, 0.03, 0.005, float("nan")]
    # Four finite p-values: sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone.
    adjusted = holm(p)
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(adjusted[4])
    assert holm([0.6, 0.5]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []
