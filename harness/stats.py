"""Statistics over prompts (scipy + numpy), all seeded.

* `bootstrap_ci`: paired BCa bootstrap confidence interval of any statistic of
  one or more per-prompt arrays (resampling prompts, the arrays together).
* `sign_flip_pvalue`: two-sided sign-flip permutation test of mean(d) = 0,
  p = (1 + #{|mean(s * d)| >= |mean(d)|}) / (1 + n_perm), s uniform signs.
* `summary`: median and interquartile range of per-prompt values.
* `benjamini_hochberg`: BH-adjusted p-values (step-up, monotone, capped at 1).
* `clopper_pearson`: exact binomial confidence interval of a rate.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float
    method: str


def bootstrap_ci(samples: Sequence[np.ndarray], statistic: Callable[..., Any],
                 n_resamples: int, confidence: float, seed: int) -> Interval:
    """BCa interval of `statistic(*samples)`, resampling the prompts (paired).

    `statistic` must accept arrays with a trailing prompt axis (vectorised).
    Degenerate data (every resample equal) gives the point estimate as both ends.
    """
    from scipy import stats

    arrays = [np.asarray(s, dtype=np.float64) for s in samples]
    est = float(statistic(*arrays, axis=-1))
    if len(arrays[0]) < 2:
        return Interval(est, float("nan"), float("nan"), confidence, "none (fewer than 2 prompts)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning and BCa's own warnings
        res = stats.bootstrap(arrays, statistic, n_resamples=n_resamples, paired=True,
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
    out: np.ndarray = np.sum(num, axis=axis) / np.sum(den, axis=axis)
    return out


def ratio_of_sums_ci(effect: np.ndarray, gap: np.ndarray, n_resamples: int, confidence: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column c of `effect` [n, C]: R_c = sum_n effect[n, c] / sum_n gap[n], with a percentile
    bootstrap interval of the prompts, every column on the same resamples (weights w [B, n] drawn
    once from `seed`: R*_bc = sum_n w_bn effect[n, c] / sum_n w_bn gap[n]); (R, low, high), each [C],
    NaN where the gap is not finite or its sum is not positive."""
    effect = np.asarray(effect, dtype=np.float64)
    gap = np.asarray(gap, dtype=np.float64)
    C = effect.shape[1]
    if not np.isfinite(gap).all() or gap.sum() <= 0:
        nan = np.full(C, np.nan)
        return nan, nan.copy(), nan.copy()
    n = len(gap)
    w = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=n_resamples).astype(np.float64)
    ratio = (w @ effect) / (w @ gap)[:, None]  # [B, C]
    alpha = (1 - confidence) / 2
    return (effect.sum(0) / gap.sum(), np.quantile(ratio, alpha, axis=0), np.quantile(ratio, 1 - alpha, axis=0))


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


def summary(x: np.ndarray) -> dict[str, float]:
    """Median, quartiles and interquartile range of per-prompt values:
    {median, q1, q3, iqr}."""
    x = np.asarray(x, dtype=np.float64)
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "iqr": float(q3 - q1)}


def benjamini_hochberg(p: Sequence[float]) -> list[float]:
    """BH-adjusted p-values in input order: p_(i) * n / i for the i-th smallest,
    made monotone from the top (step-up) and capped at 1."""
    n = len(p)
    if n == 0:
        return []
    order = np.argsort(p)
    ranked = np.asarray(p, dtype=np.float64)[order] * n / np.arange(1, n + 1)
    adj = np.minimum.accumulate(ranked[::-1])[::-1].clip(max=1.0)
    out = np.empty(n)
    out[order] = adj
    return [float(x) for x in out]


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) confidence interval of the rate k / n."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def beat_likelihood_ratio(k: int, n: int, rate: float, above: bool = True) -> float:
    """The mixture likelihood ratio of k successes in n Bernoulli draws against success rate `rate`:

        above  H1: p > rate, p uniform on (rate, 1]:  LR = int_rate^1 p^k (1-p)^(n-k) dp / (1 - rate)
        below  H1: p < rate, p uniform on [0, rate):  LR = int_0^rate p^k (1-p)^(n-k) dp / rate

    each divided by rate^k (1 - rate)^(n - k).  Under any p <= rate (above; p >= rate, below) the
    sequence of LRs over growing n is a nonnegative supermartingale with mean <= 1, so by Ville's
    inequality P(LR_n >= 1/alpha for some n) <= alpha: a test that stops as soon as it crosses
    1/alpha, looking as often as it likes, keeps its error rate."""
    from scipy.special import betainc, betaincc, betaln

    if not 0 <= k <= n:
        raise ValueError(f"k = {k} successes in n = {n} draws")
    if rate <= 0.0:
        if not above:
            return 0.0  # no rate below 0
        return float("inf") if k > 0 else 1.0 / (n + 1)
    part = betaincc(k + 1, n - k + 1, rate) if above else betainc(k + 1, n - k + 1, rate)
    if part <= 0.0:
        return 0.0
    width = 1.0 - rate if above else rate
    log_null = k * np.log(rate) + ((n - k) * np.log1p(-rate) if n > k else 0.0)
    log_lr = betaln(k + 1, n - k + 1) + np.log(part) - np.log(width) - log_null
    return float("inf") if log_lr > 700 else float(np.exp(log_lr))  # past 1e304: beyond any 1/alpha


@dataclass(frozen=True)
class BeatTest:
    """A sequential test of whether a claimed circuit beats random circuits more often than
    `rate` (sequential_beat_test)."""

    beaten: int
    drawn: int
    max_draws: int
    rate: float
    alpha: float
    decision: str  # "more" (p > rate shown), "not more" (p < rate shown), "undecided"
    p_value: float  # anytime-valid: min(1, 1 / the largest above-LR seen at a look)
    looks: tuple[int, ...]  # the draw counts after which the test looked

    @property
    def stopped_early(self) -> bool:
        return self.drawn < self.max_draws


ROUNDS_FIRST = 8  # draws of the first round; each later round doubles the draws so far


def beat_rounds(max_draws: int, first: int = ROUNDS_FIRST) -> list[int]:
    """The sizes of the rounds of draws: first, then as many as drawn so far, up to max_draws."""
    out, total = [], 0
    while total < max_draws:
        size = min(max_draws - total, first if total == 0 else total)
        out.append(size)
        total += size
    return out


def sequential_beat_test(draw: Callable[[int], Sequence[bool]], max_draws: int, rate: float,
                         alpha: float, first: int = ROUNDS_FIRST) -> BeatTest:
    """Draw in rounds (beat_rounds: 8, 8, 16, 32, ... up to max_draws; `draw(m)` returns m new
    outcomes, True where the claimed circuit beat the random one) and stop at the first look where
    the above-LR (beat_likelihood_ratio) reaches 1/alpha ("more": the rate is exceeded) or the
    below-LR does ("not more"); else "undecided" after max_draws.  Error rates, for any p:
    P("more" | p <= rate) <= alpha and P("not more" | p >= rate) <= alpha."""
    beaten = drawn = 0
    best = 0.0
    looks: list[int] = []
    decision = "undecided"
    for size in beat_rounds(max_draws, first):
        got = list(draw(size))
        beaten += int(sum(bool(x) for x in got))
        drawn += len(got)
        looks.append(drawn)
        up = beat_likelihood_ratio(beaten, drawn, rate, above=True)
        best = max(best, up)
        if up >= 1.0 / alpha:
            decision = "more"
            break
        if beat_likelihood_ratio(beaten, drawn, rate, above=False) >= 1.0 / alpha:
            decision = "not more"
            break
    return BeatTest(beaten, drawn, max_draws, rate, alpha, decision, min(1.0, 1.0 / best) if best > 0 else 1.0,
                    tuple(looks))
