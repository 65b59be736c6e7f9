"""Claim kind `circuit`: keeping only these heads, or only these edges, recovers at least a
fraction of the clean behaviour, and more than random circuits of the same size (causal
evidence).

A node circuit (`heads:`) keeps its heads (and MLPs) and ablates every other head (every
other head and MLP when it names an MLP) on `hook_z` / `hook_mlp_out`.  An edge circuit
(`edges:`) keeps exactly its edges: every other edge from a sender (embed, a head, an MLP) to
a receiver (a head's q/k/v input, an MLP's input, the logits) carries the sender's
replacement write, each receiver's input rebuilt exactly (mech.graph.forward).  A node circuit
is the edge circuit of all edges among its nodes, from embed and to the logits
(mech.graph.structure.Graph.node_mask: the two give the same numbers).

    faithfulness F = sum(m_C - m_empty) / sum(m_full - m_empty)

over prompts with m_full - m_empty >= min_prompt_gap (defined when that mean gap is >=
min_gap; claims.effects), with m_full the clean run (an edge circuit: every edge kept),
m_C the circuit and m_empty nothing kept.  For `at_least` claims it is compared with random
circuits of the same size (never C itself): node circuits draw as many heads (and MLPs)
uniformly, edge circuits as many edges into each receiver as C has, uniformly among that
receiver's senders (matched per receiver).  They are drawn in rounds (8, 8, 16, 32, ... up
to `random_circuits`) and the sequential test of P(beat) > beat_rate (stats.sequential_beat_test,
anytime-valid at `alpha`) stops as soon as it decides.  PASS needs the bound met and the test
deciding "more"; FAIL when the bound fails, the test decides "not more", or after every draw
the share of circuits beaten is at most beat_rate.

Non-vacuity (mech.runs.change): the intervention tests C only if it changes what C reads.  A node
circuit: the joint relative change of the ablated heads' (and MLPs') outputs.  An edge circuit:
of what its receivers (and the logits) read through its removed edges, each where it reads
(mech.graph.received), so a corruption that changes one token still counts where the circuit
reads it.  A PASS whose rest changes nothing (below min_change) is INCONCLUSIVE (untested);
units that do not change on their own are listed, not blocking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import stats
from ..evidence.details import Summary
from ..evidence.format import fmt, fmt_p
from ..evidence.result import ClaimResult
from ..evidence.verdicts import FAIL, INCONCLUSIVE, PASS, Verdict, threshold_verdict
from ..mech.graph import parts
from ..mech.runs import jackknife
from ..mech.runs.cached import Runs
from ..spec import names
from ..spec.names import hook_mlp_out, hook_resid_pre, hook_z
from ..spec.settings import Stats
from ..spec.vocabulary import Ablation, LadderStatus, Rung
from . import circuit_criteria, effects
from .base import (
    ClaimKind,
    Context,
    EdgeCircuitPath,
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
from .circuit_plans import (
    EdgeCircuit,
    NodeCircuit,
    Plan,
    RandomComparison,
    nodes_of,
    pool,
    random_faithfulness_test,
    with_mlps,
)
from .circuit_spec import CircuitClaim, CircuitDetails, CriterionResult
from .view import ClaimView, change_line, details, edge_classes_text, sensitivity_line

UNIT = "faithfulness"
LADDER_EDGES = 60  # an edge circuit of more edges is one ladder row, not a row per edge


class CircuitView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, CircuitDetails)
        kept = (f"{len(d.edges)} of the model's {d.graph_edges} edges kept, joining {', '.join(d.heads) or 'no heads'}"
                if d.edges is not None else f"heads kept: {', '.join(d.heads)}")
        out = [f"- metric: full {fmt(d.full_metric_mean)}, circuit {fmt(d.circuit_metric_mean)}, empty "
               f"{fmt(d.empty_metric_mean)} {unit}; {kept}"]
        if d.edge_classes is not None:
            out.append(f"- kept edges by class: {edge_classes_text(d.edge_classes)}")
        if d.beaten is not None and d.random_faithfulness_summary is not None and d.beat_p_value is not None:
            rs = d.random_faithfulness_summary
            out.append(f"- {d.random_circuits} random circuits drawn (at most {d.random_draws_max}; {d.random_draw}): "
                       f"faithfulness median {fmt(rs.median)}, IQR {fmt(rs.iqr)}, max "
                       f"{fmt(d.random_faithfulness_max)}; beaten {d.beaten}; sequential test: {d.beat_decision} than "
                       f"the rate {d.beat_rate:g}, p = {fmt_p(d.beat_p_value)}")
        if d.intervention_change is not None:
            read = "what the circuit's receivers read through its removed edges"
            out.append(change_line(d.intervention_change, read if d.edges is not None
                                   else "the output of the heads outside the circuit"))
        if d.sensitivity is not None:
            out.append(sensitivity_line(d.sensitivity, "ablation type (faithfulness bound only)"))
        if d.criteria:
            out.append(f"- faithfulness bound and random circuits alone: {d.bound_verdict}")
            out += [f"- {name}: **{r.verdict}** ({r.circuits} circuits): {r.rule}" for name, r in d.criteria.items()]
            minimality = d.criteria.get("minimality")
            failing = [m for m in (minimality.members or []) if m.status != "needed"] if minimality else []
            if failing:
                out.append("- members not shown needed: " + ", ".join(
                    f"{m.member} {m.status} (knockout {m.knockout:+.3f}, beats {m.beaten} fillers)"
                    for m in failing[:20]) + (f", and {len(failing) - 20} more" if len(failing) > 20 else ""))
        return out

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return list(details(result, CircuitDetails).edges or [])


class CircuitKind(ClaimKind[CircuitClaim, CircuitDetails]):
    name = "circuit"
    spec = CircuitClaim
    details = CircuitDetails
    evidence = "causal"
    summary = "keeping only these heads or edges recovers the behaviour (faithfulness) better than random circuits"
    view = CircuitView()

    def hooks(self, claim: CircuitClaim, n_layers: int) -> list[str]:
        if claim.edges is not None:
            return parts.cache_names(n_layers, True)
        if claim.ablation == Ablation.ZERO and not claim.sensitivity:
            # zeros replace the outside units: no activation of theirs is read but by the non-vacuity
            # check, which makes them again chunk by chunk (mech.runs.change.head_changes) rather than
            # hold every head's output for every prompt
            return [hook_resid_pre(0)]  # Runs.run starts there
        mlps = [hook_mlp_out(layer) for layer in range(n_layers)] if with_mlps(claim) else []
        return [hook_z(layer) for layer in range(n_layers)] + mlps + [hook_resid_pre(0)]  # Runs.run starts there

    def corrupted_hooks(self, claim: CircuitClaim, n_layers: int) -> list[str]:
        """Zero and mean ablation keep the circuit in the clean run and replace the rest with zeros
        or means of clean prompts; resample (also a sensitivity variant) reads the corrupted run."""
        return self.hooks(claim, n_layers) if claim.ablation == Ablation.RESAMPLE or claim.sensitivity else []

    def uses_means(self, claim: CircuitClaim) -> bool:
        return claim.ablation == Ablation.MEAN or claim.sensitivity

    def interventions(self, claim: CircuitClaim, n_layers: int, n_heads: int) -> list[InterventionPath]:
        if claim.edges is not None:
            return [EdgeCircuitPath()]
        return [HeadAblationPath(tuple(pool(claim, n_layers, n_heads)))]

    def ladder(self, claim: CircuitClaim, result: ClaimResult) -> list[LadderEntry]:
        d = self.details_of(result)
        status = verdict_status(result) if d.bound_verdict is None else STATUS[Verdict(d.bound_verdict)]
        if d.intervention_change is not None and d.intervention_change.vacuous:
            status = LadderStatus.UNTESTED if status == LadderStatus.INCONCLUSIVE else status
        if claim.edges is not None and claim.size <= LADDER_EDGES:  # the sufficiency rung of every edge
            note = f"kept in an edge circuit of {claim.size} edges: faithfulness {fmt(result.value)}"
            out = [LadderEntry(str(e), "edge" if names.is_head_route(e) else "route", Rung.SUFFICIENCY, status, note,
                               d.corruption) for e in claim.edges]
            if not d.criteria:
                return out
            mechanism = f"edge circuit {claim.id} ({claim.size} edges)"
            return out + [LadderEntry(mechanism, "heads", Rung.SUFFICIENCY, status, f"faithfulness {fmt(result.value)}",
                                      d.corruption)] + criteria_entries(mechanism, d, member_rows=True)
        if claim.edges is not None:  # a large circuit: one row, not one per edge
            mechanism = f"edge circuit {claim.id} ({claim.size} edges)"
            return ([LadderEntry(mechanism, "heads", Rung.SUFFICIENCY, status,
                                 f"faithfulness {fmt(result.value)}, every other edge {claim.ablation}", d.corruption)]
                    + criteria_entries(mechanism, d, member_rows=False))
        mechanism = f"circuit {heads_mechanism(claim.heads or [])[0]}"
        return ([LadderEntry(mechanism, "heads", Rung.SUFFICIENCY, status,
                             f"faithfulness {fmt(result.value)} with the rest {claim.ablation}-ablated", d.corruption)]
                + sensitivity_entry(mechanism, "heads", d.sensitivity)
                + criteria_entries(mechanism, d, member_rows=True))

    def measure(self, claims: Sequence[Indexed[CircuitClaim]], ctx: Context) -> Measured:
        st = ctx.stats
        out = {}
        for i, c in claims:
            runs, seed = ctx.runs_for(c.corruption), ctx.claim_seed(i)
            plan: Plan = EdgeCircuit(c, runs) if c.edges is not None else NodeCircuit(c, runs)
            m_full, m_circuit, m_empty = plan.base(c.ablation)
            gap = m_full - m_empty
            kept = gap >= st.min_prompt_gap
            random = None
            if c.at_least is not None and not effects.undefined_reason(gap, st, ctx.unit):  # F is defined
                f_point = float(stats.ratio_of_means((m_circuit - m_empty)[kept], gap[kept]))
                random = random_faithfulness_test(plan, c, m_empty, gap, kept, f_point, seed, st)
            change = self.change(plan, c.ablation, st)
            jack = None
            if c.ablation == Ablation.MEAN:
                def measure(r: Runs, drops: Sequence[int | None], c: CircuitClaim = c,
                            plan: Plan = plan) -> list[np.ndarray]:
                    p = plan if r is plan.runs else EdgeCircuit(c, r) if c.edges is not None else NodeCircuit(c, r)
                    return [np.stack(p.base(Ablation.MEAN, k)[1:]) for k in drops]

                jack = [(mc, me) for mc, me in jackknife.replicates(runs, measure, np.stack([m_circuit, m_empty]))]
            extra = self.edge_fields(plan) if isinstance(plan, EdgeCircuit) else {}
            if c.criteria is not None:
                defined = not effects.undefined_reason(gap, st, ctx.unit)
                scores = circuit_criteria.Scores(plan, c.ablation, m_full, m_circuit, m_empty, st, seed, defined)
                extra["criteria"] = circuit_criteria.evaluate(plan, dict(c.criteria), scores, c.id)
            result = self.evaluate(c, CircuitMetrics(m_full, m_circuit, m_empty, change, runs.corruption, jack, extra),
                                   random, st, seed, ctx.unit)
            if c.sensitivity:
                def variant(kind: str, c: CircuitClaim = c, runs: Runs = runs, plan: Plan = plan, seed: int = seed,
                            extra: dict[str, Any] = extra) -> ClaimResult:
                    v = c.model_copy(update={"ablation": kind})
                    ch = self.change(plan, kind, st)
                    return self.evaluate(v, CircuitMetrics(*plan.base(kind), ch, runs.corruption, None, extra), None,
                                         st, seed, ctx.unit, compare=False)
                result = with_details(result, sensitivity=effects.sensitivity(variant, result))
            out[i] = result
        return Measured(out)

    @staticmethod
    def change(plan: Plan, kind: str, st: Stats) -> effects.InterventionChange | None:
        """Non-vacuity: an edge circuit's by what its receivers read through its removed edges, a node
        circuit's by the output of the heads (and MLPs) it ablates (None: nothing is ablated)."""
        outside = plan.outside()
        if isinstance(plan, EdgeCircuit):
            return effects.circuit_change(plan.runs, plan.mask, outside, kind, st)
        return effects.head_change(plan.runs, outside, kind, st) if outside else None

    @staticmethod
    def edge_fields(plan: EdgeCircuit) -> dict[str, Any]:
        edges = plan.graph.edges_of(plan.mask)
        return {"edges": [str(e) for e in edges], "graph_edges": plan.graph.n_edges,
                "edge_classes": plan.graph.counts(plan.mask), "heads": nodes_of(edges)}

    def evaluate(self, claim: CircuitClaim, m: CircuitMetrics, random: RandomComparison | None, st: Stats,
                 seed: int, unit: str, compare: bool = True) -> ClaimResult:
        """The claim's result from its metrics per prompt (`m`).  random: the random circuits of the
        same size and the sequential test (None when no other circuit of that size exists); the random
        comparison applies to at_least claims only (and not with compare=False: sensitivity variants)."""
        own = compare  # False for a sensitivity variant: no random circuits, no criteria
        compare = compare and claim.at_least is not None
        expectation = f"keep {self.members(claim)}: faithfulness {claim.bound_text()}" + (
            f", beats random circuits (rate > {claim.beat_rate:g})" if compare else "")
        num, gap = m.circuit - m.empty, m.full - m.empty
        # the "gap" of a circuit is full minus empty: same rules as a normalised effect
        norm = effects.normalized_effect(num, gap, st, seed, unit, gap_name="full-empty")
        if m.jack and norm.interval is not None:
            kept = norm.kept
            thetas = [float(stats.ratio_of_means((mc - me)[kept], (m.full - me)[kept])) for mc, me in m.jack]
            norm = replace(norm, interval=effects.widen(norm.interval, thetas, st.confidence))
        iv = norm.interval
        fields: dict[str, Any] = {
            "heads": [str(h) for h in claim.heads or []], "ablation": claim.ablation,
            "full_metric_mean": float(m.full.mean()), "circuit_metric_mean": float(m.circuit.mean()),
            "empty_metric_mean": float(m.empty.mean()), "n_prompts": int(len(num)),
            "random_circuits": 0 if random is None else int(random.test.drawn), "beat_rate": claim.beat_rate,
            "confidence": st.confidence, **effects.effect_fields(norm, "faithfulness"), "corruption": m.corruption,
            "intervention_change": m.change, **m.extra}
        if random is not None and compare and iv is not None:
            t = random.test
            fields.update(random_faithfulness_summary=Summary(**stats.summary(random.faithfulness)),
                          random_faithfulness_max=float(np.max(random.faithfulness)), beaten=t.beaten,
                          beat_p_value=t.p_value, beat_decision=t.decision, random_draws_max=t.max_draws,
                          random_draw=random.how, alpha=st.alpha)
        details = CircuitDetails(**fields)
        if iv is None:
            verdict, rule, reason = INCONCLUSIVE, f"faithfulness undefined: {norm.reason}", ""
            if own and m.extra.get("criteria"):  # a criterion that FAILs still FAILs the claim
                details = details.model_copy(update={"bound_verdict": str(verdict)})
                verdict, rule, reason = with_criteria(verdict, rule, reason, m.extra["criteria"])
            return self.result(claim, expectation=expectation, verdict=verdict, value=None, ci=None, unit=UNIT,
                               details=details, rule=rule, reason=reason)
        f_verdict, f_rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)
        if not compare:
            verdict, rule, reason = f_verdict, f"faithfulness {f_rule}", ""
        elif random is None:
            verdict, reason = (FAIL if f_verdict == FAIL else INCONCLUSIVE), ""
            rule = (f"faithfulness {f_rule}; no other circuit of {claim.size} "
                    f"{'edges' if claim.edges is not None else 'heads'} exists, so the random-circuit comparison "
                    "is undefined")
        else:
            verdict, rule, reason = random_comparison(f_verdict, f_rule, random.test)
        verdict, rule, reason = qualified(claim, verdict, rule, reason, m.change, norm, st)
        if own and m.extra.get("criteria"):
            details = details.model_copy(update={"bound_verdict": str(verdict)})
            verdict, rule, reason = with_criteria(verdict, rule, reason, m.extra["criteria"])
        return self.result(claim, expectation=expectation, verdict=verdict, value=iv.estimate, ci=[iv.low, iv.high],
                           unit=UNIT, rule=rule, details=details, per_prompt=norm.per_prompt, reason=reason)

    @staticmethod
    def members(claim: CircuitClaim) -> str:
        if claim.edges is not None:
            return f"{claim.size} edge{'s' * (claim.size != 1)} ({claim.ablation} on every other edge)"
        heads = claim.heads or []
        n_mlps = sum(isinstance(h, names.Mlp) for h in heads)
        n_heads = len(heads) - n_mlps
        if n_mlps:
            return (f"{n_heads} head{'s' * (n_heads != 1)} and {n_mlps} MLP{'s' * (n_mlps != 1)} ({claim.ablation} "
                    "elsewhere, MLPs included)")
        return f"{len(heads)} heads ({claim.ablation} elsewhere)"


KIND = CircuitKind()


@dataclass(frozen=True)
class CircuitMetrics:
    """A circuit claim's metric per prompt with everything kept (`full`), the circuit kept
    (`circuit`) and nothing kept (`empty`), and what goes with them: how much ablating the rest
    changed what the circuit reads (`change`), the corruption, (m_C, m_empty) with each reference
    group left out of the mean (`jack`: mean ablation, widening F's CI), an edge circuit's own
    details (`extra`)."""

    full: np.ndarray
    circuit: np.ndarray
    empty: np.ndarray
    change: effects.InterventionChange | None = None
    corruption: str | None = None
    jack: list[tuple[np.ndarray, np.ndarray]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def qualified(claim: CircuitClaim, verdict: Verdict, rule: str, reason: str,
              change: effects.InterventionChange | None, norm: effects.NormalizedEffect,
              st: Stats) -> tuple[Verdict, str, str]:
    """The verdict with what qualifies it: non-vacuity judged on what is ablated as a whole (the
    complement's joint change of what the circuit's readers read: a PASS whose rest changes nothing
    is INCONCLUSIVE, untested), members that do not change on their own listed, not blocking, and a
    faithfulness above 1 explained."""
    noop = (change.vacuous_heads or []) if change is not None else []
    if verdict == PASS and change is not None and change.vacuous:
        verdict = INCONCLUSIVE
        reason = (f"untested: {claim.ablation}-ablating the rest leaves what the circuit reads as it was "
                  f"(relative change {change.relative_change:.3f} < min_change {st.min_change:g})")
        rule = (f"{reason}, so the circuit's faithfulness does not show it works without the rest ({rule}); "
                "use ablation: zero, or a corruption that changes the rest's output")
    elif noop and change is not None:
        rule += (f"; {len(noop)} of the ablated do not change on their own (relative change < min_change "
                 f"{st.min_change:g}: {', '.join(noop[:10])}{', ...' if len(noop) > 10 else ''}), so the "
                 f"circuit is tested without the others; the rest as a whole changes by "
                 f"{change.relative_change:.3f}")
    if norm.interval is not None and norm.interval.estimate > 1:
        q1, med, q3 = np.nanpercentile(np.asarray(norm.per_prompt, dtype=float), [25, 50, 75])
        rule += (f"; faithfulness above 1: the circuit alone moves the metric further than the whole model, "
                 f"so the ablated rest works against the metric on average (per prompt: median {med:.3f}, "
                 f"quartiles {q1:.3f} and {q3:.3f})")
    return verdict, rule, reason


STATUS = {PASS: LadderStatus.SUPPORTS, FAIL: LadderStatus.AGAINST, INCONCLUSIVE: LadderStatus.INCONCLUSIVE}
MEMBER_STATUS = {"needed": LadderStatus.SUPPORTS, "unneeded": LadderStatus.AGAINST,
                 "undetermined": LadderStatus.INCONCLUSIVE}
RUNG_OF = {"equivalence": Rung.EQUIVALENCE, "independence": Rung.INDEPENDENCE, "completeness": Rung.COMPLETENESS,
           "minimality": Rung.MINIMALITY}


def criteria_entries(mechanism: str, d: CircuitDetails, member_rows: bool) -> list[LadderEntry]:
    """A step per stated criterion on the circuit's row, and (member_rows) a minimality step on each
    member's row: supports when it is needed, against when it is not."""
    out = [LadderEntry(mechanism, "heads", RUNG_OF[name], STATUS[Verdict(r.verdict)], f"{name} {r.verdict}",
                       d.corruption) for name, r in (d.criteria or {}).items()]
    minimality = (d.criteria or {}).get("minimality")
    if member_rows and minimality is not None:
        for m in minimality.members or []:
            edge = "->" in m.member
            type_ = ("edge" if names.is_head_route(names.parse_edge(m.member)) else "route") if edge else "head"
            out.append(LadderEntry(m.member, type_, Rung.MINIMALITY, MEMBER_STATUS[m.status],
                                   f"knockout {m.knockout:+.3f}, beats {m.beaten} fillers", d.corruption))
    return out


def with_criteria(verdict: Verdict, rule: str, reason: str,
                  criteria: dict[str, CriterionResult]) -> tuple[Verdict, str, str]:
    """The verdict with the stated criteria's: FAIL when the faithfulness part or any criterion
    FAILs, PASS when it and every criterion PASS, else INCONCLUSIVE; the rule lists each."""
    verdicts = [verdict, *(r.verdict for r in criteria.values())]
    combined = FAIL if FAIL in verdicts else PASS if all(v == PASS for v in verdicts) else INCONCLUSIVE
    listed = ", ".join(f"{name} {r.verdict}" for name, r in criteria.items())
    failed = [name for name, r in criteria.items() if r.verdict == FAIL]
    if combined == FAIL and verdict != FAIL:
        reason = "; ".join(f"not {n}: {circuit_criteria.brief(n, criteria[n])}" for n in failed)
    elif combined == INCONCLUSIVE and verdict == PASS:
        open_ = [name for name, r in criteria.items() if r.verdict != PASS]
        reason = "; ".join(f"{n} undecided: {circuit_criteria.brief(n, criteria[n])}" for n in open_)
    return Verdict(combined), f"{rule}; criteria: {listed} (each test's rule in the details)", reason


def random_comparison(f_verdict: Verdict, f_rule: str, test: stats.BeatTest) -> tuple[Verdict, str, str]:
    """(verdict, rule, reason) of a circuit claim from its faithfulness verdict and the sequential
    test against random circuits (it beat `test.beaten` of `test.drawn`): PASS needs the
    faithfulness PASS and the test deciding "more"; FAIL follows a faithfulness FAIL, a test
    deciding "not more", or, undecided after every draw, a share beaten at most the rate;
    otherwise INCONCLUSIVE (the reason names which part held it back)."""
    k, n, rate, alpha = test.beaten, test.drawn, test.rate, test.alpha
    better = test.decision == "more"
    worse = test.decision == "not more" or (test.decision == "undecided" and k / n <= rate)
    if f_verdict == PASS and better:
        verdict = PASS
    elif f_verdict == FAIL or worse:
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    what = (f"decided after {n} of at most {test.max_draws} draws: {test.decision} than the rate {rate:g}"
            if test.decision != "undecided" else f"undecided after {n} of at most {test.max_draws} draws")
    beats = f"beats {k}/{n} random circuits (sequential test {what}, p {fmt_p(test.p_value)} at alpha {alpha:g})"
    if verdict == PASS:
        reason = f"faithfulness {f_rule}; {beats}"
    elif f_verdict == FAIL:
        reason = f"faithfulness {f_rule}"
    elif worse:
        reason = f"beats only {k}/{n} random circuits, not more than the rate {rate:g} (faithfulness {f_rule})"
    elif f_verdict == PASS:
        reason = f"faithfulness {f_rule}, but it {beats}: not clearly more than the rate {rate:g}"
    else:
        reason = f"faithfulness {f_rule}; {beats}"
    return verdict, f"faithfulness {f_rule}; {beats}", reason

