"""Claim kind `edge`: patching the edge sender -> receiver moves the metric
(`used`) or does not (`unused`) (causal evidence; exact edge patching,
mech.patching).

Per prompt n: noising d_n = m_clean,n - m_patched,n (necessity); denoising
d_n = m_patched,n - m_corrupted,n (sufficiency).  The effect is the normalised
effect sum(d) / sum(g) with its BCa CI [lo, hi] (claims.effects); its sign-flip
p-value (over the kept prompts) is Benjamini-Hochberg adjusted over the file's
edge claims.  Use status:

    used          lo > min_effect and p_adj < alpha
    unused        -tolerance <= lo and hi <= tolerance
    undetermined  otherwise

Verdicts: expect used   -> PASS if used, FAIL if hi < min_effect, else INCONCLUSIVE;
          expect unused -> PASS if unused, FAIL if lo > tolerance or hi < -tolerance,
          else INCONCLUSIVE; an undefined effect is INCONCLUSIVE.

For each claimed head -> head-input edge, the weights-vs-use table puts its
composition test (claims.composition.route_evidence, BH over these edges)
beside its use status and classifies the pair (`classify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from .. import stats
from ..evidence.details import CI, Num, Sensitivity, Summary, WeightsVsUseRow, optional
from ..evidence.format import fmt, fmt_ci
from ..evidence.result import ClaimResult
from ..evidence.verdicts import FAIL, INCONCLUSIVE, PASS, Verdict
from ..mech import patching
from ..mech.runs import Runs
from ..spec import names
from ..spec.fields import ClaimSpec, EdgeName
from ..spec.names import hook_pattern
from ..spec.settings import Stats
from ..spec.vocabulary import Direction, Replacement
from ..streams import Stream
from . import effects
from .base import ClaimKind, Context, EdgePatchPath, Indexed, InterventionPath
from .composition import route_evidence

FRACTION = "fraction of gap"
CORRECTION = "Benjamini-Hochberg over the file's edge claims"
WEIGHTS_VS_USE = {
    (True, "used"): "route used",
    (True, "unused"): "route present, unused",
    (False, "used"): "used without a weight route",
    (False, "unused"): "no route",
    (True, "undetermined"): "route present, use undetermined",
    (False, "undetermined"): "no weight route, use undetermined",
}


class EdgeClaim(ClaimSpec):
    """Patching one edge moves the metric (used) or not (unused)."""

    kind: Literal["edge"]
    edge: EdgeName
    expect: Literal["used", "unused"] = "used"
    direction: Direction = "noising"
    replacement: Replacement = "resample"
    min_effect: float | None = Field(None, gt=0.0)
    tolerance: float | None = Field(None, gt=0.0)
    freeze_patterns: StrictBool = False
    sensitivity: StrictBool = False

    @field_validator("edge")
    @classmethod
    def _patchable(cls, e: names.Edge) -> names.Edge:
        if not isinstance(e.sender, (names.Head, names.Embed)) or not isinstance(
                e.receiver, (names.HeadInput, names.Logits)):
            raise ValueError(f"an edge claim goes from a head or embed to a later head's .q/.k/.v or "
                             f"to logits, e.g. 'L0H3 -> L1H6.k'; got {str(e)!r}")
        return e

    @model_validator(mode="after")
    def _consistent(self) -> EdgeClaim:
        r = self.edge.receiver
        if self.freeze_patterns and isinstance(r, names.HeadInput) and r.which in "qk":
            raise ValueError(f"freeze_patterns holds every attention pattern fixed, so a .{r.which} edge "
                             "cannot act at all; use it with .v or logits edges")
        if self.min_effect is not None and self.tolerance is not None and self.tolerance >= self.min_effect:
            raise ValueError(f"tolerance {self.tolerance:g} must be below min_effect {self.min_effect:g}, "
                             "or 'used' and 'unused' overlap")
        if self.direction == "denoising" and (self.replacement != "resample" or self.sensitivity):
            raise ValueError("denoising patches the clean run's output into the corrupted run: "
                             "replacement must be resample (and sensitivity, which varies it, is off)")
        return self

    def zones(self, st: Stats) -> tuple[float, float]:
        """(min_effect, tolerance): the claim's own, else the file's."""
        return (self.min_effect if self.min_effect is not None else st.min_effect,
                self.tolerance if self.tolerance is not None else st.tolerance)

    def check_settings(self, stats: Stats) -> str | None:
        hi, lo = self.zones(stats)
        if lo >= hi:
            return (f"claim {self.id!r}: tolerance {lo:g} must be below min_effect {hi:g} "
                    "(claim or stats values), or 'used' and 'unused' overlap")
        return None


class EdgeDetails(effects.NormalizedFields):
    direction: str
    replacement: str
    freeze_patterns: bool
    n_prompts: int
    clean_metric_mean: float
    patched_metric_mean: float
    corrupted_metric_mean: float
    change_mean: Num  # mean of d_n
    change_ci: CI
    change_summary: Summary
    ci_method: str  # of the change CI
    confidence: float
    undefined_reason: str  # why the normalized effect is undefined; "" when defined
    p_value: float  # sign-flip p-value over the kept prompts, before adjustment
    edge: str
    p_adjusted: float
    alpha: float
    min_effect: float
    tolerance: float
    correction: str
    use: Literal["used", "unused", "undetermined"]
    weights_vs_use: str | None = optional()  # head -> head-input edges: the class
    sensitivity: Sensitivity | None = optional()


@dataclass(frozen=True)
class EdgeEffect:
    """What patching one edge measured, before multiple-testing correction."""

    change: effects.Change
    norm: effects.NormalizedEffect
    p_value: float  # sign-flip over the kept prompts; 1.0 when the effect is undefined
    clean_mean: float
    patched_mean: float
    corrupted_mean: float


def edge_effect(runs: Runs, edge: names.Edge, direction: str, replacement: str, freeze: bool, st: Stats,
                seed: int, unit: str) -> EdgeEffect:
    """Patch `edge` (runs: mech.runs.Runs) and measure its effect."""
    m_clean, m_corrupt = runs.m_clean, runs.m_corrupt
    m_patched = runs.patched(edge, direction, replacement, freeze)
    d = m_clean - m_patched if direction == "noising" else m_patched - m_corrupt
    norm = effects.normalized_effect(d, m_clean - m_corrupt, st, seed, unit)
    p = stats.sign_flip_pvalue(d[norm.kept], st.permutations, seed) if norm.interval else 1.0
    return EdgeEffect(effects.change(d, st, seed), norm, p, float(m_clean.mean()), float(m_patched.mean()),
                      float(m_corrupt.mean()))


def use_status(lo: float, hi: float, p_adj: float, min_effect: float, tolerance: float, alpha: float) -> str:
    """used / unused / undetermined from the effect's CI and adjusted p-value (module docstring)."""
    if lo > min_effect and p_adj < alpha:
        return "used"
    if -tolerance <= lo and hi <= tolerance:
        return "unused"
    return "undetermined"


def edge_verdict(expect: str, use: str, lo: float, hi: float, min_effect: float, tolerance: float) -> Verdict:
    """The verdict of an `expect` claim given its use status and CI (module docstring)."""
    if expect == "used":
        return PASS if use == "used" else FAIL if hi < min_effect else INCONCLUSIVE
    return PASS if use == "unused" else FAIL if (lo > tolerance or hi < -tolerance) else INCONCLUSIVE


def classify(composes: bool, use: str) -> str:
    """The weights-vs-use class of an edge."""
    return WEIGHTS_VS_USE[(composes, use)]


class EdgeKind(ClaimKind[EdgeClaim, EdgeDetails]):
    name = "edge"
    spec = EdgeClaim
    details = EdgeDetails
    evidence = "causal"
    summary = "patching one edge (exact edge patching) moves the metric, or does not"

    def hooks(self, claim: EdgeClaim, n_layers: int) -> list[str]:
        frozen = [hook_pattern(layer) for layer in range(n_layers)] if claim.freeze_patterns else []
        return patching.cache_names([claim.edge], n_layers) + frozen

    def needs_weights(self, claim: EdgeClaim) -> bool:
        return True  # the weights-vs-use table and the signature plot

    def interventions(self, claim: EdgeClaim, n_layers: int, n_heads: int) -> list[InterventionPath]:
        return [EdgePatchPath(claim.edge, claim.direction, claim.freeze_patterns)]

    def edges(self, claim: EdgeClaim) -> list[names.Edge]:
        return [claim.edge]

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return [self.details_of(result).edge]

    def measure(self, claims: Sequence[Indexed[EdgeClaim]], ctx: Context) -> dict[int, ClaimResult]:
        st, runs = ctx.stats, ctx.runs

        def effect_of(c: EdgeClaim, replacement: str, seed: int) -> EdgeEffect:
            return edge_effect(runs, c.edge, c.direction, replacement, c.freeze_patterns, st, seed, ctx.unit)

        found = {i: effect_of(c, c.replacement, ctx.claim_seed(i)) for i, c in claims}
        adjusted = stats.benjamini_hochberg([found[i].p_value for i, _ in claims])
        out = {}
        for (i, c), p_adj in zip(claims, adjusted, strict=True):
            result = self.evaluate(c, found[i], p_adj, st, ctx.unit)
            if c.sensitivity:
                def variant(kind: str, c: EdgeClaim = c, i: int = i) -> ClaimResult:
                    # sensitivity variants are decided on their own, unadjusted p-values
                    v = c.model_copy(update={"replacement": kind})
                    e = effect_of(v, kind, ctx.claim_seed(i))
                    return self.evaluate(v, e, e.p_value, st, ctx.unit)
                self.details_of(result).sensitivity = effects.sensitivity(variant, result)
            out[i] = result
        self._weights_vs_use(claims, out, ctx)
        return out

    def evaluate(self, claim: EdgeClaim, effect: EdgeEffect, p_adj: float, st: Stats, unit: str) -> ClaimResult:
        min_effect, tol = claim.zones(st)
        how = f"{claim.direction}, {claim.replacement}" + (", patterns frozen" if claim.freeze_patterns else "")
        want = f"effect > {min_effect:g}" if claim.expect == "used" else f"effect within ±{tol:g}"
        expectation = f"{claim.edge} {claim.expect} ({how}: {want})"
        ch, norm, niv = effect.change, effect.norm, effect.norm.interval
        use = "undetermined" if niv is None else use_status(niv.low, niv.high, p_adj, min_effect, tol, st.alpha)
        details = EdgeDetails(
            direction=claim.direction, replacement=claim.replacement, freeze_patterns=claim.freeze_patterns,
            n_prompts=ch.n_prompts, clean_metric_mean=effect.clean_mean, patched_metric_mean=effect.patched_mean,
            corrupted_metric_mean=effect.corrupted_mean, change_mean=ch.interval.estimate,
            change_ci=[ch.interval.low, ch.interval.high], change_summary=ch.summary, ci_method=ch.interval.method,
            confidence=st.confidence, **effects.effect_fields(norm), undefined_reason=norm.reason,
            p_value=effect.p_value, edge=str(claim.edge), p_adjusted=p_adj, alpha=st.alpha, min_effect=min_effect,
            tolerance=tol, correction=CORRECTION, use=use)
        raw = f"raw change {ch.interval.estimate:.3f} {unit}"
        if niv is None:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None,
                               unit=FRACTION, details=details,
                               rule=f"normalized effect undefined: {norm.reason} ({raw})")
        lo, hi = niv.low, niv.high
        rule = (f"effect {niv.estimate:.3f} CI [{lo:.3f}, {hi:.3f}], p_adj {p_adj:.3g} -> {use} "
                f"(used: CI low > {min_effect:g} and p_adj < {st.alpha:g}; unused: CI within ±{tol:g}); {raw}")
        return self.result(claim, expectation=expectation,
                           verdict=edge_verdict(claim.expect, use, lo, hi, min_effect, tol), value=niv.estimate,
                           ci=[lo, hi], unit=FRACTION, rule=rule, details=details, per_prompt=norm.per_prompt)

    def _weights_vs_use(self, claims: Sequence[Indexed[EdgeClaim]], results: dict[int, ClaimResult],
                        ctx: Context) -> None:
        """Classify every claimed head -> head-input edge and add its weights-vs-use row."""
        routes = [(i, c) for i, c in claims if names.is_head_route(c.edge)]
        if not routes:
            return
        found = route_evidence(ctx.weights(), [c.edge for _, c in routes], ctx.stats, ctx.seed,
                               Stream.WEIGHTS_VS_USE)
        for (i, c), r in zip(routes, found, strict=True):
            res = results[i]
            details = self.details_of(res)
            composes = r.p_adjusted < ctx.stats.composition_alpha
            details.weights_vs_use = classify(composes, details.use)
            ctx.weights_vs_use.append(WeightsVsUseRow(
                edge=str(c.edge), claim=res.id, composition=r.result.score, composition_p_adjusted=r.p_adjusted,
                composes=composes, effect=res.value, effect_ci=res.ci, use=details.use,
                classification=details.weights_vs_use))

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        d = self.details_of(result)
        if plan.get("expect") == "used":
            return [(d.min_effect, "min effect")]
        return [(d.tolerance, "+tolerance"), (-d.tolerance, "-tolerance")]

    def render(self, result: ClaimResult, unit: str) -> list[str]:
        d = self.details_of(result)
        wvu = f"; weights vs use: **{d.weights_vs_use}**" if d.weights_vs_use is not None else ""
        out = [f"- metric: clean {fmt(d.clean_metric_mean)}, patched {fmt(d.patched_metric_mean)}, corrupted "
               f"{fmt(d.corrupted_metric_mean)} {unit}",
               f"- raw change {fmt(d.change_mean)} {unit} {fmt_ci(d.change_ci)}; sign-flip p = {d.p_value:.3g}, "
               f"BH-adjusted {d.p_adjusted:.3g}; use: **{d.use}**{wvu}"]
        if d.normalized_summary is not None:
            out.append(f"- per-prompt effect median {fmt(d.normalized_summary.median)}, IQR "
                       f"{fmt(d.normalized_summary.iqr)}; {d.n_excluded_small_gap} prompt(s) excluded for a small "
                       "clean-corrupted gap")
        if d.sensitivity is not None:
            out.append(effects.sensitivity_line(d.sensitivity, "replacement"))
        return out


KIND = EdgeKind()
