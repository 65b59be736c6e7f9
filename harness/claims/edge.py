"""Claim kind `edge`: patching the edge sender -> receiver moves the metric
(`used`) or does not (`unused`) (causal evidence; exact edge patching,
mech.edges.patching).

Per prompt n: noising d_n = m_clean,n - m_patched,n (necessity); denoising
d_n = m_patched,n - m_corrupted,n (sufficiency), floored to exact zeros below the
numerical tolerance (claims.effects).  The effect is the normalised effect
sum(d) / sum(g) with its BCa CI [lo, hi] (g: the clean-corrupted gap, or with
`normalize: baseline` the clean-no-information gap); its sign-flip p-value (over
the kept prompts) is Benjamini-Hochberg adjusted over the file's edge claims,
leaving out edges whose every d_n is exactly 0 (structurally zero: p = 1).
Use status, with c the mean raw change mean(d):

    untested            the patch does not change the sender's output where the
                        receiver reads it (mech.runs.change: relative change < min_change)
    used                lo > min_effect, p_adj < alpha and c >= min_raw_change
    used (opposite sign) hi < -min_effect, p_adj < alpha and c <= -min_raw_change
    unused              -tolerance <= lo and hi <= tolerance
    undetermined        otherwise

Verdicts: untested or an undefined effect -> INCONCLUSIVE;
          expect used   -> PASS if used, FAIL if hi < min_effect, else INCONCLUSIVE;
          expect unused -> PASS if unused, FAIL if used (either sign), else INCONCLUSIVE
          (between the bands the data cannot tell unused from used).

The weights-vs-use table has one row per claimed head -> head-input edge and
direction: its composition test (claims.composition.route_evidence, BH over
these edges) beside the use its claims' tests show (the first non-vacuous
status among used > used (opposite sign) > unused > undetermined; untested
when every test is vacuous), classified by `classify`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, StrictBool, model_validator

from ..evidence.details import CI, EdgeTest, Num, PassRegion, Sensitivity, Summary, WeightsVsUseRow, optional
from ..evidence.format import fmt, fmt_ci, fmt_p
from ..evidence.result import ClaimResult
from ..evidence.verdicts import INCONCLUSIVE
from ..mech.edges import patching, paths
from ..spec import names
from ..spec.fields import CorruptionChoice, EdgeName
from ..spec.names import hook_pattern
from ..spec.settings import Stats
from ..spec.vocabulary import Direction, LadderStatus, Normalization, Replacement, Rung, UseStatus
from . import effects, metric_parts
from .base import (
    ClaimKind,
    Context,
    EdgePatchPath,
    Indexed,
    InterventionPath,
    LadderEntry,
    Measured,
    sensitivity_entry,
    verdict_status,
    with_details,
)
from .composition import RouteEvidence, route_evidence
from .edge_test import (
    OPPOSITE,
    UNTESTED,
    EdgeEffect,
    EdgeTestSpec,
    UseRule,
    classify,
    edge_tests,
    edge_verdict,
    prefetch,
    row_use,
)
from .metric_parts import MetricPart
from .view import (
    ClaimView,
    baseline_line,
    change_line,
    details,
    parts_line,
    prompt_effect_line,
    sensitivity_line,
    use_reference_lines,
)

FRACTION = "fraction of gap"
CORRECTION = "Benjamini-Hochberg over the file's edge claims (structurally zero edges left out)"


class RouteClaim(CorruptionChoice):
    """What edge and path claims share: patching a route moves the metric (used) or not."""

    expect: Literal["used", "unused"] = "used"
    direction: Direction = Direction.NOISING
    replacement: Replacement = Replacement.RESAMPLE
    normalize: Normalization = Normalization.CORRUPTED
    min_effect: float | None = Field(None, gt=0.0)
    tolerance: float | None = Field(None, gt=0.0)
    freeze_patterns: StrictBool = False
    sensitivity: StrictBool = False
    parts: StrictBool = False  # split logit_diff into its parts (claims.metric_parts)

    def check_metric(self, metric: str) -> str | None:
        return metric_parts.check(self.id, metric) if self.parts else None

    def metric_parts(self) -> bool:
        return self.parts

    @property
    def route(self) -> paths.Route:
        """The edge, path or all routes the claim patches."""
        raise NotImplementedError

    @model_validator(mode="after")
    def _consistent(self) -> RouteClaim:
        for r in paths.as_path(self.route).hops:
            if self.freeze_patterns and isinstance(r, names.HeadInput) and r.which in "qk":
                raise ValueError(f"freeze_patterns holds every attention pattern fixed, so a route through "
                                 f"{r} cannot act at all; use it with .v, MLP or logits receivers")
        if self.min_effect is not None and self.tolerance is not None and self.tolerance >= self.min_effect:
            raise ValueError(f"tolerance {self.tolerance:g} must be below min_effect {self.min_effect:g}, "
                             "or 'used' and 'unused' overlap")
        if self.direction == Direction.DENOISING and (self.replacement != Replacement.RESAMPLE or self.sensitivity):
            raise ValueError("denoising patches the clean run's output into the corrupted run: "
                             "replacement must be resample (and sensitivity, which varies it, is off)")
        if self.direction == Direction.DENOISING and self.normalize == "baseline":
            raise ValueError("normalize: baseline divides a noising effect by the gap to a guess with no "
                             "information; a denoising effect is measured from the corrupted run")
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


class EdgeClaim(RouteClaim):
    """Patching one edge moves the metric (used) or not (unused)."""

    kind: Literal["edge"]
    edge: EdgeName  # names.EDGE_RULE: heads, MLPs, embed or a group of them -> a later head input, MLP or logits
    routes: Literal["direct", "all"] = "direct"  # all: through every component in between (mech.edges.paths.AllRoutes)

    @property
    def route(self) -> names.Edge | paths.AllRoutes:
        return paths.AllRoutes(self.edge) if self.routes == "all" else self.edge


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
    min_raw_change: float | None = optional()
    correction: str
    use: UseStatus
    structurally_zero: bool | None = optional()  # every d_n is 0: left out of the BH family
    corruption: str | None = optional()
    intervention_change: effects.InterventionChange | None = optional()
    weights_vs_use: str | None = optional()  # head -> head-input edges: the class its own test gives
    sensitivity: Sensitivity | None = optional()
    parts: list[MetricPart] | None = optional()  # parts: true (claims.metric_parts)


def read_hooks(edge: names.Edge, n_layers: int) -> list[str]:
    """What the non-vacuity check of `edge` reads beyond the patch's own hooks: the receiver's
    attention weights where it reads keys or values (cached anyway below the last layer)."""
    r = edge.receiver
    return ([hook_pattern(r.head.layer)] if isinstance(r, names.HeadInput) and r.which in "kv"
            and r.head.layer == n_layers - 1 else [])


def mlp_end(edge: names.Edge) -> bool:
    """Whether an edge has an MLP among its senders or as its receiver."""
    return isinstance(edge.receiver, names.Mlp) or any(isinstance(m, names.Mlp) for m in names.members(edge.sender))


class EdgeView(ClaimView):
    """Edge and path claims."""

    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, EdgeDetails)
        wvu = f"; weights vs use: **{d.weights_vs_use}**" if d.weights_vs_use is not None else ""
        where = f" (corruption {d.corruption})" if d.corruption else ""
        out = [f"- metric: clean {fmt(d.clean_metric_mean)}, patched {fmt(d.patched_metric_mean)}, corrupted "
               f"{fmt(d.corrupted_metric_mean)} {unit}{where}",
               f"- raw change {fmt(d.change_mean)} {unit} {fmt_ci(d.change_ci)}; sign-flip p = {fmt_p(d.p_value)}, "
               f"BH-adjusted {fmt_p(d.p_adjusted)}; use: **{d.use}**{wvu}"]
        out += prompt_effect_line(d, "effect")
        out += baseline_line(d, unit) + parts_line(d.parts, unit)
        if d.intervention_change is not None:
            out.append(change_line(d.intervention_change, f"the sender {d.edge.split(' -> ')[0]}'s output"))
        if d.sensitivity is not None:
            out.append(sensitivity_line(d.sensitivity, "replacement"))
        return out

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        d = details(result, EdgeDetails)
        return use_reference_lines(plan.get("expect") == "used", d.min_effect, d.tolerance)

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return [details(result, EdgeDetails).edge]


class EdgeKind(ClaimKind[RouteClaim, EdgeDetails]):
    name = "edge"
    spec: type[RouteClaim] = EdgeClaim
    details = EdgeDetails
    evidence = "causal"
    summary = "patching one edge (exact edge patching) moves the metric, or does not"
    view = EdgeView()

    def hooks(self, claim: RouteClaim, n_layers: int) -> list[str]:
        frozen = [hook_pattern(layer) for layer in range(n_layers)] if claim.freeze_patterns else []
        reads = read_hooks(paths.first_edge(claim.route), n_layers)
        route = claim.route
        cached = (paths.cache_names(route, n_layers) if paths.needs_paths(route) or not isinstance(route, names.Edge)
                  else patching.cache_names([route], n_layers))
        return cached + frozen + reads

    def needs_weights(self, claim: RouteClaim) -> bool:
        return True  # the weights-vs-use table and the signature plot

    def reads_gap(self, claim: RouteClaim) -> bool:
        return claim.normalize == Normalization.CORRUPTED

    def uses_means(self, claim: RouteClaim) -> bool:
        return claim.replacement == Replacement.MEAN or claim.sensitivity

    def interventions(self, claim: RouteClaim, n_layers: int, n_heads: int) -> list[InterventionPath]:
        return [EdgePatchPath(claim.route, claim.direction, claim.freeze_patterns, claim.corruption)]

    def edges(self, claim: RouteClaim) -> list[names.Edge]:
        return [claim.route] if isinstance(claim.route, names.Edge) else []

    def ladder(self, claim: RouteClaim, result: ClaimResult) -> list[LadderEntry]:
        d = self.details_of(result)
        status = LadderStatus.UNTESTED if d.use == UNTESTED else verdict_status(result)
        note = f"{d.use} ({claim.replacement}{', ' + d.corruption if d.corruption else ''})"
        if d.use == OPPOSITE:
            note += ": it works against the claimed direction"
        rung = Rung.EDGE_NECESSITY if claim.direction == Direction.NOISING else Rung.SUFFICIENCY
        route = claim.route  # head -> head-input edges have a weights rung; other routes do not
        kind = "edge" if isinstance(route, names.Edge) and names.is_head_route(route) else "route"
        return ([LadderEntry(str(claim.route), kind, rung, status, note, d.corruption)]
                + sensitivity_entry(str(claim.route), kind, d.sensitivity))

    def measure(self, claims: Sequence[Indexed[RouteClaim]], ctx: Context) -> Measured:
        st = ctx.stats

        def spec_of(c: RouteClaim, replacement: Replacement, i: int) -> EdgeTestSpec:
            min_effect, tol = c.zones(st)
            split = ctx.metric if c.parts and replacement == c.replacement else None
            return EdgeTestSpec(c.route, c.direction, replacement, c.freeze_patterns, c.corruption, c.normalize,
                                min_effect, tol, ctx.claim_seed(i), split=split)

        specs = [spec_of(c, c.replacement, i) for i, c in claims]
        varied = [spec_of(c, kind, i) for i, c in claims if c.sensitivity and c.direction == Direction.NOISING
                  for kind in Replacement if kind != c.replacement]
        prefetch(ctx.runs, specs + varied)  # the sensitivity variants' patches in the same batched passes
        tests = edge_tests(ctx.runs, specs, st, ctx.unit, baseline=ctx.baseline)
        ctx.runs.release()  # the patches are done (the sensitivity variants' too): their arithmetic goes first
        routes = self.route_rows(claims, ctx)
        out = {}
        for (i, c), t in zip(claims, tests, strict=True):
            result = self.evaluate(c, t.effect, t.p_adjusted, st, ctx.unit, routes.composes(c.route),
                                   routes.has(c.route))
            if c.sensitivity:
                def variant(kind: str, c: RouteClaim = c, i: int = i) -> ClaimResult:
                    # sensitivity variants are decided on their own, unadjusted p-values
                    v = c.model_copy(update={"replacement": Replacement(kind)})
                    e = edge_tests(ctx.runs, [spec_of(v, Replacement(kind), i)], st, ctx.unit,
                                   baseline=ctx.baseline)[0]
                    return self.evaluate(v, e.effect, e.effect.p_value, st, ctx.unit)
                result = with_details(result, sensitivity=effects.sensitivity(variant, result))
            out[i] = result
        return Measured(out, routes.rows(claims, out, ctx))

    def evaluate(self, claim: RouteClaim, effect: EdgeEffect, p_adj: float, st: Stats, unit: str,
                 composes: bool | None = None, weights_route: bool = False) -> ClaimResult:
        """The claim's result; `weights_route`: the edge has a weights-vs-use row, whose class under
        this claim's own test (with `composes`: its composition test, None for an MLP end) the
        details record."""
        min_effect, tol = claim.zones(st)
        how = (f"{claim.direction}, {claim.replacement}" + (f", {claim.corruption}" if claim.corruption else "")
               + (", patterns frozen" if claim.freeze_patterns else "")
               + (", against a no-information guess" if claim.normalize == "baseline" else ""))
        want = f"effect > {min_effect:g}" if claim.expect == "used" else f"effect within ±{tol:g}"
        expectation = f"{claim.route} {claim.expect} ({how}: {want})"
        ch, norm = effect.change, effect.norm
        chosen = effect.base if claim.normalize == "baseline" and effect.base is not None else norm
        niv = chosen.interval
        raw_change = ch.interval.estimate
        rule_of_use = UseRule.of(st, min_effect, tol)
        use = rule_of_use.measured(effect.read.vacuous, niv, p_adj, raw_change)
        details = EdgeDetails(
            direction=claim.direction, replacement=claim.replacement, freeze_patterns=claim.freeze_patterns,
            n_prompts=ch.n_prompts, clean_metric_mean=effect.clean_mean, patched_metric_mean=effect.patched_mean,
            corrupted_metric_mean=effect.corrupted_mean, change_mean=raw_change,
            change_ci=[ch.interval.low, ch.interval.high], change_summary=ch.summary, ci_method=ch.interval.method,
            confidence=st.confidence, **effects.effect_fields(norm),
            **effects.baseline_fields(effect.base, effect.baseline, effect.clean_mean, effect.corrupted_mean,
                                      claim.normalize),
            undefined_reason=chosen.reason, p_value=effect.p_value, edge=str(claim.route), p_adjusted=p_adj,
            alpha=st.alpha, min_effect=min_effect, tolerance=tol, min_raw_change=st.min_raw_change,
            correction=CORRECTION, use=use, structurally_zero=effect.structurally_zero or None,
            corruption=effect.corruption, intervention_change=effect.read, parts=effect.parts,
            weights_vs_use=classify(composes, use) if weights_route else None)
        raw = f"raw change {raw_change:.3f} {unit}"
        first = paths.first_edge(claim.route)
        if effect.read.vacuous:
            fix = ("a corruption that changes it there, or replacement: zero" if claim.replacement != Replacement.ZERO
                   else "an edge whose sender writes something")
            estimate = "undefined" if niv is None else f"{niv.estimate:.3f}"
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE,
                               value=None if niv is None else niv.estimate,
                               ci=None if niv is None else [niv.low, niv.high], unit=FRACTION, details=details,
                               per_prompt=None if niv is None else chosen.per_prompt,
                               reason=f"untested: the patch changes nothing {first.receiver} reads (relative "
                                      f"change {effect.read.relative_change:.3f} < min_change {st.min_change:g})",
                               rule=f"untested: the {claim.replacement} patch does not change {first.sender}'s "
                                    f"output where {first.receiver} reads it (relative change "
                                    f"{effect.read.relative_change:.3f} < min_change {st.min_change:g} at "
                                    f"{effect.read.read_at}), so the effect ({estimate}; {raw}) cannot show "
                                    f"whether the route is used; use {fix}")
        if niv is None:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None,
                               unit=FRACTION, details=details,
                               rule=f"normalized effect undefined: {chosen.reason} ({raw})")
        lo, hi = niv.low, niv.high
        zero = "; structurally zero: left out of the BH family" if effect.structurally_zero else ""
        rule = (f"effect {niv.estimate:.3f} CI [{lo:.3f}, {hi:.3f}], p_adj {fmt_p(p_adj)} -> {use} "
                f"(used: CI low > {min_effect:g}, p_adj < {st.alpha:g} and raw change >= {st.min_raw_change:g}; "
                f"unused: CI within ±{tol:g}); {raw}{zero}")
        return self.result(claim, expectation=expectation,
                           verdict=edge_verdict(claim.expect, use, lo, hi, min_effect, tol), value=niv.estimate,
                           ci=[lo, hi], unit=FRACTION, rule=rule, details=details, per_prompt=chosen.per_prompt,
                           reason=rule_of_use.reason(use, lo, hi, p_adj, raw_change))

    def pass_region(self, claim: RouteClaim, result: ClaimResult) -> PassRegion:
        d = self.details_of(result)
        if claim.expect == "used":
            return PassRegion(low=d.min_effect, high=None, text=f"> {d.min_effect:g} (min_effect)")
        return PassRegion(low=-d.tolerance, high=d.tolerance, text=f"within ±{d.tolerance:g} (tolerance)")

    def route_rows(self, claims: Sequence[Indexed[RouteClaim]], ctx: Context) -> Routes:
        """The claimed edges that get a weights-vs-use row (head, or group of heads, -> head input,
        with its composition test; edges with an MLP end, with no score), each edge's composition
        tested once (BH over these edges)."""
        edges = list(dict.fromkeys(c.route for _, c in claims if isinstance(c.route, names.Edge)
                                   and (names.is_head_route(c.route) or mlp_end(c.route))))
        heads = [e for e in edges if names.is_head_route(e)]
        found = dict(zip(heads, route_evidence(ctx.composition(), heads, ctx.stats), strict=True)) if heads else {}
        ctx.let_go_of_cores()  # the patching and the explanations read none
        return Routes(edges, found)


@dataclass(frozen=True)
class Routes:
    """The weights side of the weights-vs-use table: its edges and their composition tests."""

    edges: list[names.Edge]
    found: dict[names.Edge, RouteEvidence]

    @cached_property
    def _listed(self) -> frozenset[names.Edge]:
        return frozenset(self.edges)

    def has(self, route: paths.Route) -> bool:
        return isinstance(route, names.Edge) and route in self._listed

    def composes(self, route: paths.Route) -> bool | None:
        r = self.found.get(route) if isinstance(route, names.Edge) else None
        return None if r is None else r.composes

    def rows(self, claims: Sequence[Indexed[RouteClaim]], results: dict[int, ClaimResult],
             ctx: Context) -> tuple[WeightsVsUseRow, ...]:
        """One row per claimed edge and direction (module docstring): the use the first decisive
        test shows, classified against the edge's composition test."""
        by_row: dict[tuple[names.Edge, str], list[int]] = {}
        for i, c in claims:
            if self.has(c.route):
                by_row.setdefault((c.route, c.direction), []).append(i)  # type: ignore[arg-type]
        specs = dict(claims)
        out = []
        for (edge, direction), members in by_row.items():
            r = self.found.get(edge)
            composes = self.composes(edge)
            tests = [EdgeTest(claim=results[i].id, replacement=specs[i].replacement,
                              corruption=_details(results[i]).corruption, use=_details(results[i]).use,
                              effect=results[i].value) for i in members]
            decider = row_use(tests)
            decided = results[next(i for i in members if results[i].id == decider.claim)]
            out.append(WeightsVsUseRow(
                edge=str(edge), direction=direction, claim=decider.claim,
                composition=None if r is None else r.result.score,
                composition_p_adjusted=None if r is None else r.p_adjusted, composes=composes, effect=decided.value,
                effect_ci=decided.ci, use=decider.use, classification=classify(composes, decider.use), tests=tests,
                explained=ctx.explained(edge) if r is not None else None))
        return tuple(out)


def _details(result: ClaimResult) -> EdgeDetails:
    if not isinstance(result.details, EdgeDetails):
        raise TypeError(f"claim {result.id!r}: details are {type(result.details).__name__}, not EdgeDetails")
    return result.details


KIND = EdgeKind()
