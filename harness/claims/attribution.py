"""Claim kind `attribution`: an edge's attribution score (EAP or EAP-IG, mech.graph.attribution)
estimates that patching it would move the metric (`used`) or would not (`unused`).  An
estimate, not an intervention: its own evidence type and its own rung of the evidence
ladder ("attribution", below every intervention); an edge claim on the same edge tests it.

Per prompt n, s_n is the edge's score summed over positions (noising convention: it
estimates m_clean,n - m_patched,n of the noising resample patch).  The estimated effect is
sum(s) / sum(g) over the prompts with g_n >= min_prompt_gap (g: the clean-corrupted gap;
claims.effects, a BCa CI), its sign-flip p-value Benjamini-Hochberg adjusted over the file's
attribution claims, and the use rule of edge claims (claims.edge_test.UseRule) decides
`used`, `used (opposite sign)`, `unused` or `undetermined`; a sender whose write the
corruption does not change where the receiver reads it leaves the estimate untested.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from .. import stats
from ..errors import UnsupportedError
from ..evidence.details import CI, Num, Summary, optional
from ..evidence.format import fmt, fmt_ci, fmt_p
from ..evidence.result import ClaimResult
from ..evidence.verdicts import INCONCLUSIVE
from ..mech.edges import patching, writes
from ..mech.runs import change as read_change
from ..spec import names
from ..spec.fields import CorruptionChoice, EdgeName
from ..spec.vocabulary import Direction, LadderStatus, Replacement, Rung, UseStatus
from . import effects
from .base import (
    ClaimKind,
    Context,
    EdgeCircuitPath,
    Indexed,
    InterventionPath,
    LadderEntry,
    Measured,
    verdict_status,
)
from .edge import read_hooks
from .edge_test import UNTESTED, UseRule, edge_verdict
from .view import ClaimView, change_line, details, prompt_effect_line, use_reference_lines

FRACTION = "fraction of gap (estimate)"


class AttributionClaim(CorruptionChoice):
    """An edge's attribution estimates that it is used (or unused)."""

    kind: Literal["attribution"]
    edge: EdgeName
    method: Literal["eap", "eap-ig"] = "eap-ig"
    steps: int = Field(5, ge=1, le=200)  # EAP-IG's points between the corrupted and the clean input
    expect: Literal["used", "unused"] = "used"
    min_effect: float | None = Field(None, gt=0.0)
    tolerance: float | None = Field(None, gt=0.0)

    @model_validator(mode="after")
    def _one_sender(self) -> AttributionClaim:
        if isinstance(self.edge.sender, names.Group):
            raise ValueError("an attribution score is of one edge: give one sender")
        return self


class AttributionDetails(effects.NormalizedFields):
    edge: str
    method: str
    steps: int
    score_mean: float  # mean over prompts of s_n (the metric's units)
    score_ci: CI
    score_summary: Summary
    p_value: float
    p_adjusted: float
    use: UseStatus
    min_effect: float
    tolerance: float
    alpha: float
    confidence: float
    corruption: str | None = optional()
    intervention_change: effects.InterventionChange | None = optional()
    undefined_reason: str = ""


class AttributionView(ClaimView):
    """Attribution claims: an estimate, said so on every line."""

    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, AttributionDetails)
        how = d.method + (f", {d.steps} steps" if d.method == "eap-ig" else "")
        where = f" (corruption {d.corruption})" if d.corruption else ""
        out = [f"- attribution score ({how}; estimates clean minus patched metric): mean {fmt(d.score_mean)} {unit} "
               f"{fmt_ci(d.score_ci)}{where}; sign-flip p = {fmt_p(d.p_value)}, BH-adjusted {fmt_p(d.p_adjusted)}; "
               f"estimated use: **{d.use}** — an estimate, not an intervention"]
        out += prompt_effect_line(d, "estimated effect")
        if d.intervention_change is not None:
            out.append(change_line(d.intervention_change, f"the sender {d.edge.split(' -> ')[0]}'s output"))
        return out

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        d = details(result, AttributionDetails)
        return use_reference_lines(plan.get("expect", "used") == "used", d.min_effect, d.tolerance)

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return [details(result, AttributionDetails).edge]


class AttributionKind(ClaimKind[AttributionClaim, AttributionDetails]):
    name = "attribution"
    spec = AttributionClaim
    details = AttributionDetails
    evidence = "attribution"
    summary = "an edge's attribution score (EAP, EAP-IG) estimates that patching it would move the metric"
    view = AttributionView()

    def hooks(self, claim: AttributionClaim, n_layers: int) -> list[str]:
        # embed's and the sender's writes (the graph arithmetic is checked on a run of the first prompts,
        # Runs.graph_model), and what the non-vacuity check of the edge reads
        return (writes.activation_names(names.Embed()) + writes.activation_names(claim.edge.sender)
                + patching.cache_names([claim.edge], n_layers) + read_hooks(claim.edge, n_layers))

    def reads_gap(self, claim: AttributionClaim) -> bool:
        return True

    def interventions(self, claim: AttributionClaim, n_layers: int, n_heads: int) -> list[InterventionPath]:
        return [EdgeCircuitPath()]  # the graph arithmetic it differentiates is held to the clean run

    def edges(self, claim: AttributionClaim) -> list[names.Edge]:
        return [claim.edge]

    def ladder(self, claim: AttributionClaim, result: ClaimResult) -> list[LadderEntry]:
        d = self.details_of(result)
        status = LadderStatus.UNTESTED if d.use == UNTESTED else verdict_status(result)
        kind = "edge" if names.is_head_route(claim.edge) else "route"
        return [LadderEntry(str(claim.edge), kind, Rung.ATTRIBUTION, status, f"{d.method} estimate {d.use}",
                            d.corruption)]

    def measure(self, claims: Sequence[Indexed[AttributionClaim]], ctx: Context) -> Measured:
        st = ctx.stats
        found = []
        for i, c in claims:
            runs = ctx.runs_for(c.corruption)
            gm = runs.graph_model()
            g = gm.graph
            sender = c.edge.sender
            if isinstance(sender, names.Group) or not g.has(c.edge):
                raise UnsupportedError(f"claim {c.id!r}: {c.edge} is not an edge of this model's graph (its receiver "
                                       "reads the residual stream before the sender writes to it)")
            s = runs.edge_prompt_scores(c.edge, c.method, steps=c.steps)
            seed = ctx.claim_seed(i)
            norm = effects.normalized_effect(s, runs.m_clean - runs.m_corrupt, st, seed, ctx.unit)
            p = (stats.sign_flip_pvalue(s[norm.kept], st.permutations, seed)
                 if norm.interval is not None and np.any(s != 0) else 1.0)
            r, where = read_change.edge_change(runs, c.edge, Direction.NOISING, Replacement.RESAMPLE)
            found.append((i, c, s, norm, p, effects.intervention_change(r, st, where), runs.corruption))
        adjusted = stats.benjamini_hochberg([f[4] for f in found])
        out = {}
        for (i, c, s, norm, p, change, corruption), p_adj in zip(found, adjusted, strict=True):
            out[i] = self.evaluate(c, s, norm, p, p_adj, change, corruption, ctx, ctx.claim_seed(i))
        return Measured(out)

    def evaluate(self, claim: AttributionClaim, s: np.ndarray, norm: effects.NormalizedEffect, p: float,
                 p_adj: float, change: effects.InterventionChange, corruption: str, ctx: Context,
                 seed: int) -> ClaimResult:
        st = ctx.stats
        rule_of_use = UseRule.of(st, claim.min_effect, claim.tolerance)
        score = stats.mean_ci(s, st.bootstrap, st.confidence, seed)
        use = rule_of_use.measured(change.vacuous, norm.interval, p_adj, score.estimate)
        how = f"{claim.method}" + (f", {claim.steps} steps" if claim.method == "eap-ig" else "")
        want = (f"estimate > {rule_of_use.min_effect:g}" if claim.expect == "used"
                else f"estimate within ±{rule_of_use.tolerance:g}")
        expectation = f"{claim.edge} {claim.expect}, estimated ({how}: {want})"
        details = AttributionDetails(
            edge=str(claim.edge), method=claim.method, steps=claim.steps if claim.method == "eap-ig" else 1,
            score_mean=score.estimate, score_ci=[score.low, score.high], score_summary=Summary(**stats.summary(s)),
            p_value=p, p_adjusted=p_adj, use=use, min_effect=rule_of_use.min_effect,
            tolerance=rule_of_use.tolerance, alpha=st.alpha, confidence=st.confidence,
            **effects.effect_fields(norm), corruption=corruption, intervention_change=change,
            undefined_reason=norm.reason)
        iv = norm.interval
        if change.vacuous:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE,
                               value=None if iv is None else iv.estimate,
                               ci=None if iv is None else [iv.low, iv.high], unit=FRACTION, details=details,
                               rule=f"untested: the corruption does not change {claim.edge.sender}'s write where "
                                    f"{claim.edge.receiver} reads it (relative change {change.relative_change:.3f})",
                               reason="untested: the corruption leaves the sender's write as it was")
        if iv is None:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None,
                               unit=FRACTION, details=details, rule=f"estimate undefined: {norm.reason}")
        rule = (f"estimated effect {iv.estimate:.3f} CI [{iv.low:.3f}, {iv.high:.3f}], p_adj {fmt_p(p_adj)} -> "
                f"{use} (an attribution estimate, not a patch; mean score {fmt(score.estimate)} {ctx.unit})")
        return self.result(claim, expectation=expectation,
                           verdict=edge_verdict(claim.expect, use, iv.low, iv.high, rule_of_use.min_effect,
                                                rule_of_use.tolerance),
                           value=iv.estimate, ci=[iv.low, iv.high], unit=FRACTION, rule=rule, details=details,
                           per_prompt=norm.per_prompt,
                           reason=rule_of_use.reason(use, iv.low, iv.high, p_adj, score.estimate) + " (estimate)")


KIND = AttributionKind()
