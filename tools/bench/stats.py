"""The benchmarks' statistics, once: every bench script takes its intervals, means and
percentiles from here (and linear percentiles from ``luftpause.measure.stats``).

How the benchmarks use them (arms alternated in Williams Latin square order, a cell a mean
± the half-width of its 95 % Student's t interval over repetitions, ratios per repetition)
is described once in ``docs/benchmarks/methodology.md``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def mean_or_none(values: Sequence[float] | None) -> float | None:
    """The mean, or None when there are no values."""
    return statistics.fmean(values) if values else None


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) as the order statistic nearest to
    ``q / 100 × (n - 1)`` (no interpolation); NaN when empty. The proxy overhead bench's
    percentiles (tools/bench/overhead.py), kept so its reports compare with earlier ones."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def rank_at(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) as the order statistic at index ``floor(q × n)`` (the last
    for q = 1): the link round-trip bench's percentiles (tools/bench/link_rtt.py), kept so
    its tables compare with earlier ones."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified
    Lentz; Numerical Recipes, 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        + a * math.log(x) + b * math.log1p(-x)
    )  # fmt: skip
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the
    CDF: exact to ~1e-10, e.g. t(0.975, 1) = 12.706, t(0.975, 2) = 4.303)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float | None]:
    """The mean and the half-width of its two-sided ``level`` confidence interval from
    Student's t (n - 1 degrees of freedom: right for the few repetitions a benchmark has).
    The half-width is None for a single value (no interval without a spread)."""
    if not values:
        raise ValueError("mean_ci needs at least one value")
    mean = statistics.fmean(values)
    n = len(values)
    if n < 2:
        return mean, None
    sem = statistics.stdev(values) / math.sqrt(n)
    return mean, t_quantile(0.5 + level / 2.0, n - 1) * sem


def ci_text(values: list[float], digits: int = 1, unit: str = "") -> str:
    """``mean ± half-width`` (95 % t-interval) for several values, the value alone for one."""
    if not values:
        return "-"
    mean, half = mean_ci(values)
    if half is None:
        return f"{mean:.{digits}f}{unit}"
    return f"{mean:.{digits}f}{unit} ± {half:.{digits}f}"


def arm_order(n: int, row: int) -> list[int]:
    """The order of ``n`` arms in round ``row``: row ``row`` mod n of a Williams Latin square
    (0, 1, n-1, 2, n-2, ... shifted by the row). Over n rows every arm runs once in every
    position; in two consecutive rows no arm holds the same position (so, from two
    repetitions on, no arm always runs first or last); with n even every arm also follows
    every other arm once (carry-over balanced)."""
    base = [0]
    lo, hi = 1, n - 1
    while len(base) < n:
        base.append(lo if len(base) % 2 else hi)
        if len(base) % 2:
            hi -= 1
        else:
            lo += 1
    return [(x + row) % n for x in base]


def range_text(values: list[float]) -> str:
    """Mean (min–max): for what is described, not estimated (the host's load average, the
    simulator's seeds)."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ({min(values):.1f}–{max(values):.1f})"
