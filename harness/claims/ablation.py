"""Claim kind `ablation`: ablating a set of heads jointly changes the metric
by at least / at most an amount (causal evidence, node level).

Per prompt n: d_n = m_clean,n - m_ablated,n (the clean prompts with the heads
zero-, mean- or resample-ablated, mech.hooks.ablation_plan).  `measure:
normalized` judges the normalised effect sum(d) / sum(g) (claims.effects), with
g the clean-corrupted gap (`normalize: corrupted`, default) or the gap to a guess
with no information (`normalize: baseline`); `measure: delta` judges mean(d) in
the metric's units.  Every number is reported, with a sign-flip permutation
p-value of mean(d) = 0.  Mean ablation takes the mean over reference prompts and
carries its uncertainty into the intervals (claims.effects).

Non-vacuity (mech.runs.change): when the ablation leaves the heads' outputs as they
were (mean relative change below `min_change`), it tests nothing and the claim is
INCONCLUSIVE whatever the number.  `sensitivity: true` repeats the claim under
each ablation type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from pydantic import StrictBool

from .. import stats
from ..evidence.details import CI, Num, Sensitivity, Summary, optional
from ..evidence.format import fmt, fmt_ci, fmt_p
from ..evidence.result import ClaimResult
from ..evidence.verdicts import INCONCLUSIVE, threshold_verdict
from ..mech.runs import jackknife
from ..mech.runs.cached import Runs
from ..spec.fields import BoundedCausalClaim, UnitList
from ..spec.names import hook_pattern, hook_resid_pre, unit_hook
from ..spec.settings import Stats
from ..spec.vocabulary import Ablation, LadderStatus, Normalization, Rung
from . import effects, metric_parts
from .base import (
    ClaimKind,
    Context,
    FrozenPatternsPath,
    HeadAblationPath,
    Indexed,
    InterventionPath,
    LadderEntry,
    Measured,
    heads_mechanism,
    sensitivity_entry,
    verdict_status,
    with_details,
)
from .metric_parts import MetricPart
from .view import ClaimView, baseline_line, change_line, details, parts_line, sensitivity_line

FRACTION = "fraction of gap"


class AblationClaim(BoundedCausalClaim):
    """Ablating these heads jointly changes the metric by at least / at most."""

    kind: Literal["ablation"]
    heads: UnitList  # heads and MLPs (L1.mlp)
    ablation: Ablation = Ablation.MEAN
    measure: Literal["normalized", "delta"] = "normalized"
    normalize: Normalization = Normalization.CORRUPTED
    freeze_patterns: StrictBool = False
    sensitivity: StrictBool = False
    parts: StrictBool = False  # split logit_diff into its parts (claims.metric_parts)

    def check_metric(self, metric: str) -> str | None:
        return metric_parts.check(self.id, metric) if self.parts else None

    def metric_parts(self) -> bool:
        return self.parts


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
    corruption: str | None = optional()  # the corrupted run (resample source, normalisation)
    intervention_change: effects.InterventionChange | None = optional()
    sensitivity: Sensitivity | None = optional()
    parts: list[MetricPart] | None = optional()  # parts: true (claims.metric_parts)


@dataclass(frozen=True)
class Ablated:
    """What ablating the heads measured: the metric, its reference-group recomputations
    (mean ablation), and how much the heads' outputs changed."""

    m_ablated: np.ndarray
    jack: list[np.ndarray]
    change: effects.InterventionChange
    d_part: np.ndarray | None = None  # the first metric part's change (parts: true; claims.metric_parts)
    jack_part: list[np.ndarray] = field(default_factory=list)


def ablate(runs: Runs, claim: AblationClaim, kind: str, st: Stats, part: str | None = None) -> Ablated:
    """The ablation's metric per prompt (its jackknife replicates for a mean), how much it changed
    the heads' outputs, and with `part` the change of that metric part."""
    heads = list(claim.heads)
    m = runs.ablated(heads, kind, claim.freeze_patterns)
    freeze = claim.freeze_patterns

    def measure(r: Runs, drops: Sequence[int | None]) -> list[np.ndarray]:
        if freeze:
            return [r.ablated(heads, kind, True, drop=d) for d in drops]
        return r.ablated_many([heads] * len(drops), kind, drops)

    jack = jackknife.replicates(runs, measure, m) if kind == Ablation.MEAN else []
    done = Ablated(m, jack, effects.head_change(runs, heads, kind, st))
    if part is None:
        return done
    view, scale = runs.with_metric(part), effects.metric_scale(runs.m_clean, runs.m_corrupt)
    m_part = view.ablated(heads, kind, freeze)
    jack_part = jackknife.replicates(view, measure, m_part) if kind == Ablation.MEAN else []
    return replace(done, d_part=effects.floor_changes(view.m_clean - m_part, scale),
                   jack_part=[effects.floor_changes(view.m_clean - mk, scale) for mk in jack_part])


class AblationView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, AblationDetails)
        out = [f"- metric: clean {fmt(d.clean_metric_mean)}, ablated {fmt(d.ablated_metric_mean)}, corrupted "
               f"{fmt(d.corrupted_metric_mean)} {unit}" + (f" (corruption {d.corruption})" if d.corruption else ""),
               f"- raw drop {fmt(d.drop_mean)} {unit} {fmt_ci(d.drop_ci)}, sign-flip p = {fmt_p(d.drop_p_value)}; "
               f"per-prompt median {fmt(d.drop_summary.median)}, IQR {fmt(d.drop_summary.iqr)}"]
        if d.normalized is not None and d.normalized_summary is not None:
            out.append(f"- normalized effect {fmt(d.normalized)} {fmt_ci(d.normalized_ci)}; per-prompt median "
                       f"{fmt(d.normalized_summary.median)}, IQR {fmt(d.normalized_summary.iqr)}; "
                       f"{d.n_excluded_small_gap} prompt(s) excluded for a small clean-corrupted gap")
        out += baseline_line(d, unit) + parts_line(d.parts, unit)
        if d.intervention_change is not None:
            out.append(change_line(d.intervention_change, "the ablated heads' output"))
        if d.sensitivity is not None:
            out.append(sensitivity_line(d.sensitivity, "ablation type"))
        return out


class AblationKind(ClaimKind[AblationClaim, AblationDetails]):
    name = "ablation"
    spec = AblationClaim
    details = AblationDetails
    evidence = "causal"
    summary = "ablating heads (zero, mean, resample) moves the metric by at least / at most"
    view = AblationView()

    def hooks(self, claim: AblationClaim, n_layers: int) -> list[str]:
        frozen = [hook_pattern(layer) for layer in range(n_layers)] if claim.freeze_patterns else []
        first = hook_resid_pre(min(h.layer for h in claim.heads))  # interventions start there (Runs.run)
        return [unit_hook(h) for h in claim.heads] + frozen + [first]

    def corrupted_hooks(self, claim: AblationClaim, n_layers: int) -> list[str]:
        """Zero and mean ablation run on the clean prompts alone; resample (also a sensitivity
        variant) reads the heads' outputs in the corrupted run."""
        return self.hooks(claim, n_layers) if claim.ablation == Ablation.RESAMPLE or claim.sensitivity else []

    def reads_gap(self, claim: AblationClaim) -> bool:
        return claim.measure == "normalized" and claim.normalize == Normalization.CORRUPTED

    def uses_means(self, claim: AblationClaim) -> bool:
        return claim.ablation == Ablation.MEAN or claim.sensitivity

    def interventions(self, claim: AblationClaim, n_layers: int, n_heads: int) -> list[InterventionPath]:
        paths: list[InterventionPath] = [HeadAblationPath(tuple(claim.heads))]
        return paths + [FrozenPatternsPath()] if claim.freeze_patterns else paths

    def ladder(self, claim: AblationClaim, result: ClaimResult) -> list[LadderEntry]:
        d = self.details_of(result)
        mechanism, type_ = heads_mechanism(claim.heads)
        status = verdict_status(result)
        if d.intervention_change is not None and d.intervention_change.vacuous:
            status = LadderStatus.UNTESTED
        note = f"{claim.ablation}-ablated: {result.unit} {fmt(result.value)}"
        return ([LadderEntry(mechanism, type_, Rung.NECESSITY, status, note, d.corruption)]
                + sensitivity_entry(mechanism, type_, d.sensitivity))

    def measure(self, claims: Sequence[Indexed[AblationClaim]], ctx: Context) -> Measured:
        out = {}
        for i, c in claims:
            runs, seed = ctx.runs_for(c.corruption), ctx.claim_seed(i)

            def run(kind: str, c: AblationClaim = c, runs: Runs = runs, seed: int = seed) -> ClaimResult:
                variant = c if kind == c.ablation else c.model_copy(update={"ablation": kind})
                part = metric_parts.first(ctx.metric) if c.parts and kind == c.ablation else None
                return self.evaluate(variant, runs, ablate(runs, c, kind, ctx.stats, part), ctx, seed)

            result = run(c.ablation)
            out[i] = with_details(result, sensitivity=effects.sensitivity(run, result)) if c.sensitivity else result
        return Measured(out)

    def evaluate(self, claim: AblationClaim, runs: Runs, a: Ablated, ctx: Context, seed: int) -> ClaimResult:
        st, unit = ctx.stats, ctx.unit
        heads = "+".join(str(h) for h in claim.heads)
        measure = "normalized effect" if claim.measure == "normalized" else f"metric drop ({unit})"
        frozen = ", patterns frozen" if claim.freeze_patterns else ""
        against = " (against a no-information guess)" if claim.normalize == "baseline" else ""
        corrupted = f" ({claim.corruption})" if claim.corruption else ""
        expectation = (f"{claim.ablation}-ablating {heads}{frozen}{corrupted}: {measure}{against} "
                       f"{claim.bound_text()}")
        m_clean, m_corrupt = runs.m_clean, runs.m_corrupt
        scale = effects.metric_scale(m_clean, m_corrupt)
        d = effects.floor_changes(m_clean - a.m_ablated, scale)
        jack = [effects.floor_changes(m_clean - mk, scale) for mk in a.jack]
        drop = effects.change(d, st, seed, jack)
        norm = effects.normalized_effect(d, m_clean - m_corrupt, st, seed, unit, jack=jack)
        base = (effects.normalized_effect(d, m_clean - ctx.baseline, st, seed, unit, jack=jack,
                                          gap_name="clean-baseline")
                if ctx.baseline is not None else None)
        details = AblationDetails(
            ablation=claim.ablation, heads=[str(h) for h in claim.heads], measure=claim.measure,
            freeze_patterns=claim.freeze_patterns, n_prompts=drop.n_prompts,
            clean_metric_mean=float(m_clean.mean()), ablated_metric_mean=float(a.m_ablated.mean()),
            corrupted_metric_mean=float(m_corrupt.mean()), drop_mean=drop.interval.estimate,
            drop_ci=[drop.interval.low, drop.interval.high],
            drop_p_value=stats.sign_flip_pvalue(d, st.permutations, seed), drop_summary=drop.summary,
            ci_method=drop.interval.method, confidence=st.confidence, **effects.effect_fields(norm),
            **effects.baseline_fields(base, ctx.baseline, float(m_clean.mean()), float(m_corrupt.mean()),
                                      claim.normalize),
            corruption=runs.corruption, intervention_change=a.change,
            parts=None if a.d_part is None else metric_parts.split(ctx.metric, d, a.d_part, m_clean - m_corrupt, st,
                                                                   seed, unit, jack, a.jack_part))
        raw = f"raw drop {drop.interval.estimate:.3f} {unit}"
        chosen = base if claim.normalize == "baseline" and base is not None else norm
        if claim.measure == "delta":
            value, ci, unit_out, per_prompt = drop.interval.estimate, [drop.interval.low, drop.interval.high], unit, \
                d.tolist()
            verdict, rule = threshold_verdict(ci[0], ci[1], claim.at_least, claim.at_most)
        elif chosen.interval is None:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None,
                               unit=FRACTION, rule=f"normalized effect undefined: {chosen.reason} ({raw})",
                               details=details)
        else:
            iv = chosen.interval
            value, ci, unit_out, per_prompt = iv.estimate, [iv.low, iv.high], FRACTION, chosen.per_prompt
            verdict, rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)
            rule = f"{rule} ({raw})"
        reason = ""
        if a.change.vacuous:
            verdict = INCONCLUSIVE
            reason = (f"untested: {claim.ablation}-ablating {heads} leaves their output as it was (relative change "
                      f"{a.change.relative_change:.3f} < min_change {st.min_change:g})")
            rule = (f"untested: {claim.ablation}-ablating {heads} leaves their output as it was (relative change "
                    f"{a.change.relative_change:.3f} < min_change {st.min_change:g} at {a.change.read_at}), so the "
                    f"number ({rule}) says nothing about whether they are needed; use ablation: zero, or a "
                    "corruption that changes their output")
        return self.result(claim, expectation=expectation, verdict=verdict, value=value, ci=ci, unit=unit_out,
                           rule=rule, details=details, per_prompt=per_prompt, reason=reason)



KIND = AblationKind()
