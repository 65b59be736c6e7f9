"""Statistics shared by the causal claims (ablation, edge, circuit).  Per
prompt n, with m the metric:

* gap      g_n = m_clean,n - m_corrupted,n   (a circuit: m_full,n - m_empty,n)
* change   d_n, defined by the kind: ablation m_clean,n - m_ablated,n; edge
           noising m_clean,n - m_patched,n, denoising m_patched,n - m_corrupted,n;
           circuit m_C,n - m_empty,n
* normalised effect  e = sum(d) / sum(g) over prompts with g_n >= min_prompt_gap
  (ratio of means; 1 = the whole gap), defined only when the mean gap over all
  prompts is >= min_gap and at least 2 prompts are kept; BCa CI over prompts;
  median/IQR of d_n / g_n.
* change   mean of d_n over all prompts with its BCa CI (the raw change, in the
  metric's units, always shown beside the normalised effect).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import stats
from ..evidence.details import CI, Details, Num, Sensitivity, Summary, Variant, optional
from ..evidence.format import fmt
from ..evidence.result import ClaimResult
from ..progress import progress
from ..spec.settings import Stats
from ..spec.vocabulary import ABLATIONS


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


class NormalizedFields(Details):
    """The details keys of a normalised effect (ablation and edge claims)."""

    n_excluded_small_gap: int  # prompts with g_n < min_prompt_gap, left out of the ratio
    gap_mean: float  # mean gap over all prompts: the number compared with min_gap
    kept_gap_mean: Num
    normalized: Num = optional()
    normalized_ci: CI | None = optional()
    normalized_summary: Summary | None = optional()
    normalized_ci_method: str | None = optional()


def effect_fields(norm: NormalizedEffect, name: str = "normalized") -> dict[str, Any]:
    """A normalised effect as details keys: `name`, `name_ci`, `name_summary`,
    `name_ci_method` (absent while undefined) and the gap keys."""
    iv = norm.interval
    return {"n_excluded_small_gap": norm.n_excluded_small_gap, "gap_mean": norm.gap_mean,
            "kept_gap_mean": norm.kept_gap_mean, name: iv.estimate if iv else None,
            f"{name}_ci": [iv.low, iv.high] if iv else None, f"{name}_summary": norm.summary,
            f"{name}_ci_method": iv.method if iv else None}


def normalized_effect(d: np.ndarray, gap: np.ndarray, st: Stats, seed: int, unit: str) -> NormalizedEffect:
    """The normalised effect of per-prompt changes `d` against per-prompt gaps `gap`."""
    keep = gap >= st.min_prompt_gap
    n_excluded, gap_mean = int((~keep).sum()), float(gap.mean())
    kept_mean = float(gap[keep].mean()) if keep.any() else None
    # the gap must be there on average over all prompts: keeping only prompts with a
    # large gap would otherwise pick the positive tail of pure noise
    reason = ""
    if gap_mean < st.min_gap:
        reason = f"mean clean-corrupted gap {gap_mean:.3f} {unit} over all prompts is below min_gap {st.min_gap:g}"
    elif keep.sum() < 2:
        reason = (f"only {int(keep.sum())} prompt(s) have a clean-corrupted gap of at least min_prompt_gap "
                  f"{st.min_prompt_gap:g} {unit}")
    if reason:
        return NormalizedEffect(None, n_excluded, gap_mean, kept_mean, None, None, reason, keep)
    iv = stats.bootstrap_ci([d[keep], gap[keep]], stats.ratio_of_means, st.bootstrap, st.confidence, seed)
    ratios = d[keep] / gap[keep]
    return NormalizedEffect(iv, n_excluded, gap_mean, kept_mean, Summary(**stats.summary(ratios)),
                            ratios.tolist(), "", keep)


@dataclass(frozen=True)
class Change:
    """Mean per-prompt change with its BCa CI and distribution."""

    interval: stats.Interval
    summary: Summary
    n_prompts: int


def change(d: np.ndarray, st: Stats, seed: int) -> Change:
    iv = stats.mean_ci(d, st.bootstrap, st.confidence, seed)
    return Change(iv, Summary(**stats.summary(d)), int(len(d)))


def sensitivity(run_variant: Callable[[str], ClaimResult], claimed: ClaimResult) -> Sensitivity:
    """The same claim under zero, mean and resample, and whether each verdict is the claim's."""
    rows = {}
    for kind in progress(ABLATIONS, "sensitivity"):
        r = run_variant(kind)
        rows[kind] = Variant(verdict=r.verdict, value=r.value, ci=r.ci)
    return Sensitivity(by_type=rows, agrees={v.verdict for v in rows.values()} == {claimed.verdict})


def sensitivity_line(sens: Sensitivity, varied: str) -> str:
    """The report line of a sensitivity run (`varied`: "replacement" or "ablation type")."""
    cells = "; ".join(f"{k}: {v.verdict} {fmt(v.value)}" for k, v in sens.by_type.items())
    return (f"- sensitivity across the {varied}: {cells} — "
            f"{'verdict agrees' if sens.agrees else '**verdict depends on the ablation type**'}")
