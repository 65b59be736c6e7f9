"""The statistics of the circuit criteria (claims.circuit_criteria), all seeded, numpy and scipy.

* `sign_equivalence`: the sign test of equivalence.  With k of the n untied prompts where the
  circuit beats the model and the share p = P(circuit beats model):

      p_equivalent = max(P(X >= k | n, 1/2 - eps), P(X <= k | n, 1/2 + eps))   (two one-sided tests)
      p_different  = min(1, 2 * P(X at least as far from n/2 as k | n, the nearer of 1/2 +- eps))

  P(p_equivalent <= alpha) <= alpha when |p - 1/2| >= eps, and P(p_different <= alpha) <= alpha
  when |p - 1/2| <= eps.
* `hsic_test`: the HSIC permutation test of independence of two per-prompt scores (Gretton et
  al. 2007), with Gaussian kernels of median-heuristic widths written as 2D Fourier features
  each (cos and sin at D = 32 frequencies: a deterministic quadrature of the kernel; Rahimi and
  Recht 2007 draw them at random), so it costs O(n D^2) per permutation, not O(n^2):

      HSIC = || Phi_c^T Psi_c ||_F^2 / (n - 1)^2,   Phi_c, Psi_c the centred feature matrices
      p    = (1 + #{HSIC of a permutation of y >= HSIC}) / (1 + B)

  The permutation p-value is exact (P(p <= alpha) <= alpha under independence) whatever the
  approximation of the kernel.  Given `alpha`, the permutations are drawn in rounds (B, B, 2B,
  4B, ... up to MOST_ROUNDS_FACTOR B) until the sequential test of the exceedance rate against
  alpha (stats.sequential_beat_test at RESAMPLING_RISK) decides which side of alpha the exact
  permutation p lies on: P(the decision differs from the exact test's) <= RESAMPLING_RISK for any
  data.  A p within Monte Carlo error of alpha after every draw is `borderline`, not a decision.
* `binomial_sides`: the two one-sided binomial tests of a share k / n against a rate q.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stats import clopper_pearson, sequential_beat_test

FEATURES = 32  # Fourier frequencies per variable (a cos and a sin feature each)
PERMUTATION_FLOATS = 4_000_000  # permuted features held at once (32 MB)
RESAMPLING_RISK = 1e-3  # at most this chance that the drawn permutations decide otherwise than all of them would
MOST_ROUNDS_FACTOR = 64  # a test near alpha draws up to this many times its first round's permutations


@dataclass(frozen=True)
class SignEquivalence:
    beats: int  # prompts on which the circuit beats the model
    untied: int  # prompts on which they differ
    share: float  # beats / untied (nan when every prompt is tied)
    ci: tuple[float, float]  # Clopper-Pearson interval of the share at 1 - 2 alpha
    p_equivalent: float
    p_different: float


def sign_equivalence(delta: np.ndarray, tie: float, tolerance: float, alpha: float) -> SignEquivalence:
    """The sign test of equivalence of `delta` = circuit - model per prompt (module docstring);
    |delta| <= tie counts as a tie and is left out."""
    from scipy.stats import binom

    d = np.asarray(delta, dtype=np.float64)
    untied = d[np.abs(d) > tie]
    n, k = int(len(untied)), int(np.sum(untied > 0))
    if n == 0:
        return SignEquivalence(0, 0, float("nan"), (float("nan"), float("nan")), 0.0, 1.0)
    lo, hi = 0.5 - tolerance, 0.5 + tolerance
    p_eq = max(float(binom.sf(k - 1, n, lo)), float(binom.cdf(k, n, hi)))
    if k / n >= 0.5:  # above: how surprising k is at the upper edge of the tolerance
        tail = float(binom.sf(k - 1, n, hi))
    else:
        tail = float(binom.cdf(k, n, lo))
    ci = clopper_pearson(k, n, 1 - 2 * alpha)
    return SignEquivalence(k, n, k / n, ci, min(1.0, p_eq), min(1.0, 2 * tail))


@dataclass(frozen=True)
class Hsic:
    statistic: float
    p_value: float  # (1 + exceedances) / (1 + permutations)
    permutations: int
    decision: str = "fixed"  # with alpha: "below" or "above" alpha (decided), "borderline" (never decided)


def _features(x: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """Centred Fourier features of a Gaussian kernel of width w the median pairwise distance
    (estimated from up to 1,000 values): cos and sin of f_k x at the frequencies f_k = z_k / w,
    z_k the normal quantiles at (k + 1/2) / D, so Phi Phi^T is the midpoint quadrature
    (1/D) sum_k cos(f_k (x_i - x_j)) of exp(-(x_i - x_j)^2 / 2 w^2), the same on every run;
    None when x is constant."""
    from scipy.stats import norm

    sample = x if len(x) <= 1000 else rng.choice(x, 1000, replace=False)
    gaps = np.abs(sample[:, None] - sample[None, :])
    positive = gaps[gaps > 0]
    if positive.size == 0:
        return None
    freq = norm.ppf((np.arange(FEATURES) + 0.5) / FEATURES) / float(np.median(positive))
    angle = np.outer(x, freq)
    phi = np.hstack([np.cos(angle), np.sin(angle)]) / np.sqrt(FEATURES)
    centred: np.ndarray = phi - phi.mean(0)
    return centred


def hsic_test(x: np.ndarray, y: np.ndarray, permutations: int, seed: int, alpha: float | None = None) -> Hsic:
    """The HSIC permutation test of x independent of y (module docstring): `permutations` of them, or
    with `alpha`, rounds of them until the side of alpha is decided.  A constant x or y is independent
    of anything: statistic 0, p = 1."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    rng = np.random.default_rng(seed)
    phi, psi = _features(x, rng), _features(y, rng)
    n = len(x)
    if phi is None or psi is None or n < 3:
        return Hsic(0.0, 1.0, 0, "fixed" if alpha is None else "above")
    scale = float((n - 1) ** 2)
    observed = float(np.sum((phi.T @ psi) ** 2)) / scale

    def exceeds(count: int) -> list[bool]:
        """Whether each of `count` new permutations of y reaches the observed HSIC."""
        out: list[bool] = []
        while len(out) < count:
            m = max(1, min(count - len(out), PERMUTATION_FLOATS // (n * psi.shape[1])))
            order = np.argsort(rng.random((m, n)), axis=1)  # m independent permutations
            cross = np.matmul(phi.T[None], psi[order])  # phi^T psi of each permutation: [m, D, D]
            out += (np.sum(cross ** 2, axis=(1, 2)) / scale >= observed * (1 - 1e-12)).tolist()
        return out

    if alpha is None:
        exceed = sum(exceeds(permutations))
        return Hsic(observed, (1 + exceed) / (1 + permutations), permutations)
    t = sequential_beat_test(exceeds, MOST_ROUNDS_FACTOR * permutations, alpha, RESAMPLING_RISK, first=permutations)
    decision = {"more": "above", "not more": "below"}.get(t.decision, "borderline")
    return Hsic(observed, (1 + t.beaten) / (1 + t.drawn), t.drawn, decision)


def binomial_sides(k: int, n: int, rate: float) -> tuple[float, float]:
    """(P(X <= k | n, rate), P(X >= k | n, rate)): the p-values of "the share is below rate" and of
    "the share is above rate"."""
    from scipy.stats import binom

    return float(binom.cdf(k, n, rate)), float(binom.sf(k - 1, n, rate))
