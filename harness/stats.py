"""Statistics over prompts (scipy + numpy), all seeded.

* `bootstrap_ci`: paired BCa bootstrap confidence interval of any statistic of
  one or more per-prompt arrays (resampling prompts, the arrays together).
* `sign_flip_pvalue`: two-sided sign-flip permutation test of mean(d) = 0,
  p = (1 + #{|mean(s * d)| >= |mean(d)|}) / (1 + n_perm), s uniform signs.
* `summary`: median and interquartile range of per-prompt values.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float
    method: str


def bootstrap_ci(samples: Sequence[np.ndarray], statistic: Callable[..., np.ndarray],
                 n_resamples: int, confidence: float, seed: int) -> Interval:
    """BCa interval of `statistic(*samples)`, resampling the prompts (paired).

    `statistic` must accept arrays with a trailing prompt axis (vectorised).
    Degenerate data (every resample equal) gives the point estimate as both ends.
    """
    from scipy import stats

    samples = [np.asarray(s, dtype=np.float64) for s in samples]
    est = float(statistic(*samples, axis=-1))
    if len(samples[0]) < 2:
        return Interval(est, float("nan"), float("nan"), confidence, "none (fewer than 2 prompts)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning and BCa's own warnings
        res = stats.bootstrap(samples, statistic, n_resamples=n_resamples, paired=True,
                              vectorized=True, confidence_level=confidence, method="BCa",
                              rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    method = f"BCa bootstrap, {n_resamples} resamples"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        # BCa is undefined when the bootstrap distribution is constant
        spread = res.bootstrap_distribution
        lo, hi = float(np.min(spread)), float(np.max(spread))
        method = f"bootstrap range, {n_resamples} resamples (BCa undefined: constant data)"
    return Interval(est, lo, hi, confidence, method)


def mean_ci(x: np.ndarray, n_resamples: int, confidence: float, seed: int) -> Interval:
    """BCa interval of the mean of per-prompt values."""
    return bootstrap_ci([x], np.mean, n_resamples, confidence, seed)


def ratio_of_means(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    """sum(num) / sum(den) along `axis` (the ratio of means)."""
    return np.sum(num, axis=axis) / np.sum(den, axis=axis)


def sign_flip_pvalue(d: np.ndarray, n_perm: int, seed: int) -> float:
    """Two-sided sign-flip permutation p-value for mean(d) == 0."""
    d = np.asarray(d, dtype=np.float64)
    if len(d) == 0 or np.all(d == 0):
        return 1.0
    rng = np.random.default_rng(seed)
    observed = abs(d.mean())
    count = 0
    chunk = 1000
    for start in range(0, n_perm, chunk):
        m = min(chunk, n_perm - start)
        signs = rng.choice((-1.0, 1.0), size=(m, len(d)))
        count += int(np.sum(np.abs(signs @ d / len(d)) >= observed - 1e-15))
    return (1 + count) / (1 + n_perm)


def summary(x: np.ndarray) -> dict:
    """Median and interquartile range of per-prompt values."""
    x = np.asarray(x, dtype=np.float64)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "iqr": float(q3 - q1)}
