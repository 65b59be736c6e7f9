"""Claim kind `ablation`: ablating a set of heads jointly changes the metric
by at least / at most an amount (causal evidence, node level).

Per prompt n: d_n = m_clean,n - m_ablated,n (the clean prompts with the heads
zero-, mean- or resample-ablated, mech.hooks.ablation_plan).  `measure:
normalized` judges the normalised effect sum(d) / sum(g) (claims.effects);
`measure: delta` judges mean(d) in the metric's units.  Either way both numbers
are reported, with a sign-flip permutation p-value of mean(d) = 0.
`sensitivity: true` repeats the claim under each ablation type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import StrictBool

from .. import stats
from ..evidence.details import CI, Num, Sensitivity, Summary, optional
from ..evidence.format import fmt, fmt_ci
from ..evidence.result import ClaimResult
from ..evidence.verdicts import INCONCLUSIVE, threshold_verdict
from ..spec.fields import BoundedClaim, HeadList
from ..spec.names import hook_pattern, hook_z
from ..spec.settings import Stats
from ..spec.vocabulary import Ablation
from . import effects
from .base import ClaimKind, Context, FrozenPatternsPath, HeadAblationPath, Indexed, InterventionPath

FRACTION = "fraction of gap"


class AblationClaim(BoundedClaim):
    """Ablating these heads jointly changes the metric by at least / at most."""

    kind: Literal["ablation"]
    heads: HeadList
    ablation: Ablation = "mean"
    measure: Literal["normalized", "delta"] = "normalized"
    freeze_patterns: StrictBool = False
    sensitivity: StrictBool = False


class AblationDetails(effects.NormalizedFields):
    ablation: str
    heads: list[str]
    measure: str
    freeze_patterns: bool
    n_prompts: int
    clean_metric_mean: float
    ablated_metric_mean: float
    corrupted_metric_mean: float
    drop_mean: Num  # mean of d_n = m_clean,n - m_ablated,n
    drop_ci: CI
    drop_p_value: float  # two-sided sign-flip permutation p-value of mean(d) = 0
    drop_summary: Summary
    ci_method: str  # of the drop CI
    confidence: float
    sensitivity: Sensitivity | None = optional()


class AblationKind(ClaimKind[AblationClaim, AblationDetails]):
    name = "ablation"
    spec = AblationClaim
    details = AblationDetails
    evidence = "causal"
    summary = "ablating heads (zero, mean, resample) moves the metric by at least / at most"

    def hooks(self, claim: AblationClaim, n_layers: int) -> list[str]:
        frozen = [hook_pattern(layer) for layer in range(n_layers)] if claim.freeze_patterns else []
        return [hook_z(h.layer) for h in claim.heads] + frozen

    def interventions(self, claim: AblationClaim, n_layers: int, n_heads: int) -> list[InterventionPath]:
        paths: list[InterventionPath] = [HeadAblationPath(tuple(claim.heads))]
        return paths + [FrozenPatternsPath()] if claim.freeze_patterns else paths

    def measure(self, claims: Sequence[Indexed[AblationClaim]], ctx: Context) -> dict[int, ClaimResult]:
        runs = ctx.runs
        out = {}
        for i, c in claims:
            seed = ctx.claim_seed(i)

            def run(kind: str, c: AblationClaim = c, seed: int = seed) -> ClaimResult:
                variant = c if kind == c.ablation else c.model_copy(update={"ablation": kind})
                return self.evaluate(variant, runs.m_clean, runs.m_corrupt,
                                     runs.ablated(list(c.heads), kind, c.freeze_patterns), ctx.stats, seed, ctx.unit)

            result = run(c.ablation)
            if c.sensitivity:
                self.details_of(result).sensitivity = effects.sensitivity(run, result)
            out[i] = result
        return out

    def evaluate(self, claim: AblationClaim, m_clean: np.ndarray, m_corrupt: np.ndarray, m_ablated: np.ndarray,
                 st: Stats, seed: int, unit: str) -> ClaimResult:
        heads = "+".join(str(h) for h in claim.heads)
        measure = "normalized effect" if claim.measure == "normalized" else f"metric drop ({unit})"
        frozen = ", patterns frozen" if claim.freeze_patterns else ""
        expectation = f"{claim.ablation}-ablating {heads}{frozen}: {measure} {claim.bound_text()}"
        d = m_clean - m_ablated
        drop = effects.change(d, st, seed)
        norm = effects.normalized_effect(d, m_clean - m_corrupt, st, seed, unit)
        niv = norm.interval
        details = AblationDetails(
            ablation=claim.ablation, heads=[str(h) for h in claim.heads], measure=claim.measure,
            freeze_patterns=claim.freeze_patterns, n_prompts=drop.n_prompts,
            clean_metric_mean=float(m_clean.mean()), ablated_metric_mean=float(m_ablated.mean()),
            corrupted_metric_mean=float(m_corrupt.mean()), drop_mean=drop.interval.estimate,
            drop_ci=[drop.interval.low, drop.interval.high],
            drop_p_value=stats.sign_flip_pvalue(d, st.permutations, seed), drop_summary=drop.summary,
            ci_method=drop.interval.method, confidence=st.confidence, **effects.effect_fields(norm))
        raw = f"raw drop {drop.interval.estimate:.3f} {unit}"
        if claim.measure == "delta":
            verdict, rule = threshold_verdict(drop.interval.low, drop.interval.high, claim.at_least, claim.at_most)
            return self.result(claim, expectation=expectation, verdict=verdict, value=drop.interval.estimate,
                               ci=[drop.interval.low, drop.interval.high], unit=unit, rule=rule, details=details,
                               per_prompt=d.tolist())
        if niv is None:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None,
                               unit=FRACTION, rule=f"normalized effect undefined: {norm.reason} ({raw})",
                               details=details)
        verdict, rule = threshold_verdict(niv.low, niv.high, claim.at_least, claim.at_most)
        return self.result(claim, expectation=expectation, verdict=verdict, value=niv.estimate,
                           ci=[niv.low, niv.high], unit=FRACTION, rule=f"{rule} ({raw})", details=details,
                           per_prompt=norm.per_prompt)

    def render(self, result: ClaimResult, unit: str) -> list[str]:
        d = self.details_of(result)
        out = [f"- metric: clean {fmt(d.clean_metric_mean)}, ablated {fmt(d.ablated_metric_mean)}, corrupted "
               f"{fmt(d.corrupted_metric_mean)} {unit}",
               f"- raw drop {fmt(d.drop_mean)} {unit} {fmt_ci(d.drop_ci)}, sign-flip p = {d.drop_p_value:.4g}; "
               f"per-prompt median {fmt(d.drop_summary.median)}, IQR {fmt(d.drop_summary.iqr)}"]
        if d.normalized is not None and d.normalized_summary is not None:
            out.append(f"- normalized effect {fmt(d.normalized)} {fmt_ci(d.normalized_ci)}; per-prompt median "
                       f"{fmt(d.normalized_summary.median)}, IQR {fmt(d.normalized_summary.iqr)}; "
                       f"{d.n_excluded_small_gap} prompt(s) excluded for a small clean-corrupted gap")
        if d.sensitivity is not None:
            out.append(effects.sensitivity_line(d.sensitivity, "ablation type"))
        return out


KIND = AblationKind()
