"""Statistics shared by the causal claims (ablation, edge, circuit).  Per
prompt n, with m the metric:

* gap      g_n = m_clean,n - m_corrupted,n   (a circuit: m_full,n - m_empty,n)
* change   d_n, defined by the kind: ablation m_clean,n - m_ablated,n; edge
           noising m_clean,n - m_patched,n, denoising m_patched,n - m_corrupted,n;
           circuit m_C,n - m_empty,n.  Changes with |d_n| < NUMERICAL_TOL x the
           metric's scale (max(1, max_n |m_clean,n|, max_n |m_corrupted,n|)) are
           float32 noise and count as exact zeros.
* normalised effect  e = sum(d) / sum(g) over prompts with g_n >= min_prompt_gap
  (ratio of means; 1 = the whole gap), defined only when the mean gap over all
  prompts is >= min_gap and at least 2 prompts are kept; BCa CI over prompts;
  median/IQR of d_n / g_n.
* baseline-normalised effect  e_b = sum(d) / sum(m_clean - m_base) with m_base the
  metric of a guess with no information (model.metrics.no_information: -log(vocabulary
  size) for logprob, 0 for logit_diff, ...), under the same rules.  A corrupted run below
  m_base is confidently wrong: e then understates a complete knockout, e_b does not.
* change   mean of d_n over all prompts with its BCa CI (the raw change, in the
  metric's units, always shown beside the normalised effect).
* the mean's own uncertainty (mean ablation, mean replacement): the statistic is
  recomputed with each of the K reference groups left out of the mean (theta_k,
  mech.runs.reference.Reference).  The delete-a-group jackknife gives the bias a finite
  reference set causes, b = (K-1) (mean theta_k - theta) (a statistic nonlinear in
  the mean, e.g. a circuit with every other head mean-ablated, is biased by O(1/m)
  for m reference prompts), and its variance var_ref = (K-1)/K sum_k (theta_k -
  mean theta)^2.  The estimate becomes theta' = theta - b and the bootstrap interval
  [lo, hi] of theta becomes theta' - sqrt((theta - lo)^2 + z^2 var_ref),
  theta' + sqrt((hi - theta)^2 + z^2 var_ref), z the normal quantile of the
  confidence level.
* intervention change (non-vacuity, mech.runs.change): the mean over prompts of the
  relative change r_n the intervention makes where it is read; below `min_change`
  the intervention is vacuous and no "no effect" verdict can pass on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import stats
from ..evidence.details import CI, Details, Num, Record, Sensitivity, Summary, Variant, optional
from ..evidence.result import ClaimResult
from ..mech.runs import change as read_change
from ..progress import progress
from ..spec.settings import Stats
from ..spec.vocabulary import ABLATIONS

NUMERICAL_TOL = 1e-5  # relative to the metric's scale: float32 models carry ~1e-7 relative error


def metric_scale(*runs: np.ndarray) -> float:
    return max(1.0, *(float(np.abs(m).max()) for m in runs))


def floor_changes(d: np.ndarray, scale: float) -> np.ndarray:
    """d with every |d_n| below NUMERICAL_TOL x scale set to exactly 0."""
    return np.where(np.abs(d) < NUMERICAL_TOL * scale, 0.0, d)


@dataclass(frozen=True)
class NormalizedEffect:
    """sum(d) / sum(g) over the kept prompts, or why it is undefined."""

    interval: stats.Interval | None  # None: undefined (see reason)
    n_excluded_small_gap: int  # prompts with g_n < min_prompt_gap
    gap_mean: float  # over all prompts: the number compared with min_gap
    kept_gap_mean: float | None
    summary: Summary | None  # of d_n / g_n over the kept prompts
    per_prompt: list[float] | None  # d_n / g_n over the kept prompts
    reason: str  # why it is undefined; "" when defined
    kept: np.ndarray  # bool mask of the kept prompts


def jackknife_variance(thetas: Sequence[float]) -> float:
    """(K-1)/K sum_k (theta_k - mean theta)^2."""
    t = np.asarray(thetas, dtype=np.float64)
    k = len(t)
    return float((k - 1) / k * np.sum((t - t.mean()) ** 2)) if k > 1 else 0.0


def widen(iv: stats.Interval, thetas: Sequence[float] | None, confidence: float) -> stats.Interval:
    """The bootstrap interval, bias-corrected and widened by the reference mean's
    delete-a-group jackknife (module docstring)."""
    if not thetas:
        return iv
    from scipy.stats import norm

    extra = norm.ppf(0.5 + confidence / 2) ** 2 * jackknife_variance(thetas)
    k = len(thetas)
    bias = (k - 1) * (float(np.mean(thetas)) - iv.estimate)
    est = iv.estimate - bias
    lo = est - float(np.sqrt((iv.estimate - iv.low) ** 2 + extra))
    hi = est + float(np.sqrt((iv.high - iv.estimate) ** 2 + extra))
    return replace(iv, estimate=est, low=lo, high=hi,
                   method=f"{iv.method}, bias-corrected and widened by the reference mean's delete-a-group "
                          f"jackknife ({k} groups)")


def undefined_reason(gap: np.ndarray, st: Stats, unit: str, gap_name: str = "clean-corrupted") -> str:
    """Why a normalised effect against per-prompt gaps `gap` is undefined ("" when it is defined):
    the mean gap over all prompts is below min_gap (keeping only prompts with a large gap would
    otherwise pick the positive tail of pure noise), or fewer than 2 prompts have a gap of at
    least min_prompt_gap."""
    keep = gap >= st.min_prompt_gap
    gap_mean = float(gap.mean())
    if gap_mean < st.min_gap:
        return f"mean {gap_name} gap {gap_mean:.3f} {unit} over all prompts is below min_gap {st.min_gap:g}"
    if keep.sum() < 2:
        return (f"only {int(keep.sum())} prompt(s) have a {gap_name} gap of at least min_prompt_gap "
                f"{st.min_prompt_gap:g} {unit}")
    return ""


def normalized_effect(d: np.ndarray, gap: np.ndarray, st: Stats, seed: int, unit: str, *,
                      jack: Sequence[np.ndarray] | None = None, gap_name: str = "clean-corrupted") -> NormalizedEffect:
    """The normalised effect sum(d) / sum(gap) over the prompts with gap >= min_prompt_gap, with a
    BCa interval (undefined as undefined_reason says); `jack`: d recomputed with each reference
    group left out of a mean (widens the CI)."""
    keep = gap >= st.min_prompt_gap
    n_excluded, gap_mean = int((~keep).sum()), float(gap.mean())
    kept_mean = float(gap[keep].mean()) if keep.any() else None
    reason = undefined_reason(gap, st, unit, gap_name)
    if reason:
        return NormalizedEffect(None, n_excluded, gap_mean, kept_mean, None, None, reason, keep)
    iv = stats.bootstrap_ci([d[keep], gap[keep]], stats.ratio_of_means, st.bootstrap, st.confidence, seed)
    if jack:
        iv = widen(iv, [float(stats.ratio_of_means(dk[keep], gap[keep])) for dk in jack], st.confidence)
    ratios = d[keep] / gap[keep]
    return NormalizedEffect(iv, n_excluded, gap_mean, kept_mean, Summary(**stats.summary(ratios)),
                            ratios.tolist(), "", keep)


@dataclass(frozen=True)
class Change:
    """Mean per-prompt change with its BCa CI and distribution."""

    interval: stats.Interval
    summary: Summary
    n_prompts: int


def change(d: np.ndarray, st: Stats, seed: int, jack: Sequence[np.ndarray] | None = None) -> Change:
    iv = stats.mean_ci(d, st.bootstrap, st.confidence, seed)
    if jack:
        iv = widen(iv, [float(dk.mean()) for dk in jack], st.confidence)
    return Change(iv, Summary(**stats.summary(d)), int(len(d)))


class NormalizedFields(Details):
    """The details keys of a normalised effect (ablation and edge claims)."""

    n_excluded_small_gap: int  # prompts with g_n < min_prompt_gap, left out of the ratio
    gap_mean: float  # mean gap over all prompts: the number compared with min_gap
    kept_gap_mean: Num
    normalized: Num = optional()
    normalized_ci: CI | None = optional()
    normalized_summary: Summary | None = optional()
    normalized_ci_method: str | None = optional()
    normalization: str = "corrupted"  # what the claim's value divides by: corrupted or baseline
    baseline_metric: float | None = optional()  # the no-information metric m_base
    corrupted_below_baseline: bool | None = optional()  # the corrupted run is confidently wrong
    knockout_reads_as: Num = optional()  # (mean clean - m_base) / (mean clean - mean corrupted)
    baseline_normalized: Num = optional()
    baseline_normalized_ci: CI | None = optional()


def effect_fields(norm: NormalizedEffect, name: str = "normalized") -> dict[str, Any]:
    """A normalised effect as details keys: `name`, `name_ci`, `name_summary`,
    `name_ci_method` (absent while undefined) and the gap keys."""
    iv = norm.interval
    return {"n_excluded_small_gap": norm.n_excluded_small_gap, "gap_mean": norm.gap_mean,
            "kept_gap_mean": norm.kept_gap_mean, name: iv.estimate if iv else None,
            f"{name}_ci": [iv.low, iv.high] if iv else None, f"{name}_summary": norm.summary,
            f"{name}_ci_method": iv.method if iv else None}


def baseline_fields(base: NormalizedEffect | None, m_base: float | None, clean_mean: float, corrupted_mean: float,
                    normalization: str) -> dict[str, Any]:
    """The baseline-normalised effect as details keys (None where it does not apply), and what a
    complete knockout to the baseline reads as on the corrupted scale:
    (mean clean - m_base) / (mean clean - mean corrupted), below 1 when the corrupted run is below it."""
    iv = base.interval if base is not None else None
    gap = clean_mean - corrupted_mean
    return {"normalization": normalization, "baseline_metric": m_base,
            "corrupted_below_baseline": None if m_base is None else bool(corrupted_mean < m_base),
            "knockout_reads_as": None if m_base is None or gap == 0 else (clean_mean - m_base) / gap,
            "baseline_normalized": iv.estimate if iv else None,
            "baseline_normalized_ci": [iv.low, iv.high] if iv else None}



class InterventionChange(Record):
    """How much the intervention changed what is read (mech.runs.change): non-vacuity."""

    relative_change: float  # mean over prompts of r_n (the prompts where the sender writes something)
    prompts_changed: float  # fraction of prompts with r_n >= min_change
    min_change: float
    vacuous: bool  # relative_change < min_change: the intervention tests nothing
    silent: bool | None = optional()  # the sender writes nothing where it is read: its route carries nothing
    read_at: str  # where the change is measured
    by_head: dict[str, float] | None = optional()  # ablations: the mean r_n of each head
    vacuous_heads: list[str] | None = optional()  # ablated heads whose own change is below min_change
    at_scored: float | None = optional()  # ablations: the mean r_n at the scored positions alone


def intervention_change(r: np.ndarray, st: Stats, read_at: str, by_head: dict[str, np.ndarray] | None = None,
                        at_scored: np.ndarray | None = None) -> InterventionChange:
    silent = bool(np.all(np.isnan(r)))  # nothing is written where it is read: structurally nothing to test
    rel = 0.0 if silent else float(np.nanmean(r))
    heads = {h: float(np.nanmean(v)) for h, v in by_head.items() if not np.all(np.isnan(v))} if by_head else None
    return InterventionChange(relative_change=rel, prompts_changed=float(np.mean(np.nan_to_num(r) >= st.min_change)),
                              min_change=st.min_change, vacuous=not silent and rel < st.min_change, read_at=read_at,
                              silent=silent or None, by_head=heads,
                              vacuous_heads=[h for h, v in heads.items() if v < st.min_change] if heads else None,
                              at_scored=None if at_scored is None or np.all(np.isnan(at_scored))
                              else float(np.nanmean(at_scored)))


def head_change(runs: Any, heads: list[Any], kind: str, st: Stats) -> InterventionChange:
    """The InterventionChange of ablating `heads` with `kind` (mech.runs.change.head_changes)."""
    c = read_change.head_changes(runs, heads, kind)
    return intervention_change(c.joint, st, read_change.UP_TO_LAST, {str(h): r for h, r in c.per_head.items()},
                               c.joint_scored)


def circuit_change(runs: Any, keep: np.ndarray, outside: list[Any], kind: str, st: Stats) -> InterventionChange:
    """The InterventionChange of an edge circuit: what its receivers read through its removed edges
    (mech.runs.change.received_change), with each sender whose edges are removed listed by its own
    change (`by_head`, not blocking)."""
    joint, scored = read_change.received_change(runs, keep, kind)
    own = read_change.head_changes(runs, outside, kind).per_head if outside else {}
    return intervention_change(joint, st, read_change.RECEIVED, {str(h): r for h, r in own.items()} or None, scored)


def sensitivity(run_variant: Callable[[str], ClaimResult], claimed: ClaimResult) -> Sensitivity:
    """The same claim under zero, mean and resample, and whether each verdict is the claim's."""
    rows = {}
    for kind in progress(ABLATIONS, "sensitivity"):
        r = run_variant(kind)
        rows[kind] = Variant(verdict=r.verdict, value=r.value, ci=r.ci)
    return Sensitivity(by_type=rows, agrees={v.verdict for v in rows.values()} == {claimed.verdict})
