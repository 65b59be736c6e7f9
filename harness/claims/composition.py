"""Claim kind `composition`: the sender's OV composes with the receiver's q, k
or v input beyond chance (weight evidence; it proposes a route and never shows
the route is used).

    C = ||X Y||_F / (||X||_F ||Y||_F),  X = OV_sender,  Y = QK (q), QK^T (k), OV (v) of the receiver

against a rotation null that keeps both spectra (mech.weights.scores).  The one-sided
p-values of a file's composition claims are Benjamini-Hochberg adjusted
together.  "composes" when p_adj < composition_alpha and the route stands out
among its peers, C >= composition_min_ratio x the median score of every other
earlier head into the same receiver input (mech.weights.scores.composes);
"does_not_compose" otherwise.

`route_evidence` is the same computation for any list of head -> head-input
edges (the weights side of the weights-vs-use table and the signature plot).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .. import stats
from ..evidence.details import Details, Explained, Num, optional
from ..evidence.format import fmt, fmt_p
from ..evidence.result import ClaimResult
from ..evidence.verdicts import FAIL, PASS
from ..mech.weights import scores
from ..mech.weights.factored import Composition
from ..spec import names
from ..spec.fields import ClaimSpec, HeadRouteName
from ..spec.settings import Stats
from ..spec.vocabulary import Rung
from .base import ClaimKind, Context, Indexed, LadderEntry, Measured, verdict_status
from .view import ClaimView, details, explained_lines

UNIT = "composition score"


class CompositionClaim(ClaimSpec):
    """A head -> head-input edge composes (or does not) in the weights."""

    kind: Literal["composition"]
    edge: HeadRouteName  # a head -> a later head's .q/.k/.v (names.HEAD_ROUTE)
    expect: Literal["composes", "does_not_compose"] = "composes"


class CompositionDetails(scores.CompositionResult, Details):
    """Every field of mech.weights.scores.CompositionResult, then the multiple-testing fields."""

    edge: str
    p_adjusted: float
    alpha: float
    correction: str
    n_tested: int
    explained: Explained | None = optional()  # what flows (mech.weights.explain); absent in older documents
    min_peer_ratio: float | None = optional()  # stats.composition_min_ratio (absent in older documents)
    composes: bool | None = optional()  # the rule's outcome (older documents: p_adjusted < alpha alone)


@dataclass(frozen=True)
class RouteEvidence:
    """Composition of one head -> head-input edge, with its BH-adjusted p-value."""

    result: scores.CompositionResult
    p_adjusted: float
    composes: bool  # mech.weights.scores.composes: the null rejected and the route stands out among its peers


def route_evidence(comp: Composition, edges: Sequence[names.Edge], st: Stats,
                   max_draws: int | None = None) -> list[RouteEvidence]:
    """Composition evidence for head -> head-input edges (a group of sender heads: their
    combined write, Composition.group_result); p-values BH-adjusted over them.  Every pair
    reads the same shared null draws (mech.weights.null), so an edge has the same score,
    null and raw p in a claim, the weights-vs-use table and the figures.  A pair whose p from
    `st.null_draws` draws is below alpha gets more draws, as many as BH over these edges needs
    (scores.draws_needed), at most `max_draws` (the signature plot's budget)."""
    extend = scores.draws_needed(len(edges), st.composition_alpha)
    if max_draws is not None:
        extend = min(extend, max(st.null_draws, max_draws))
    pairs, groups = [], {}
    for i, e in enumerate(edges):
        sender, receiver = e.sender, e.receiver
        if not names.is_head_route(e) or not isinstance(receiver, names.HeadInput):
            raise ValueError(f"{e} is not a head -> head-input edge")
        if isinstance(sender, names.Group):
            heads = tuple(m for m in sender.members if isinstance(m, names.Head))
            groups[i] = comp.group_result(heads, receiver, max(st.null_draws, extend))
        elif isinstance(sender, names.Head):
            pairs.append((sender, receiver))
    singles = iter(comp.results(pairs, st.null_draws, extend, st.composition_alpha))
    results = [groups[i] if i in groups else next(singles) for i in range(len(edges))]
    adjusted = stats.benjamini_hochberg([r.p_value for r in results])
    return [RouteEvidence(r, p, scores.composes(p, r.peer_ratio, st.composition_alpha, st.composition_min_ratio))
            for r, p in zip(results, adjusted, strict=True)]


class CompositionView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, CompositionDetails)
        return [f"- null (random relative orientation, spectra kept, {d.n_draws} draws): mean "
                f"{fmt(d.null_mean)}, sd {fmt(d.null_std)}, 95th pct {fmt(d.null_q95)}, 99th pct {fmt(d.null_q99)}",
                f"- C·sqrt({d.null_dim}) = {fmt(d.ratio_to_isotropic, 2)} (1 = isotropic baseline); "
                f"C / C_max = {fmt(d.fraction_of_max)} (C_max = {fmt(d.c_max)}); percentile among all cross-layer "
                f"{d.mode.upper()} pairs: {fmt(d.percentile, 1)}; rank(X) = {d.rank_sender} (X: the sender's OV), "
                f"rank(Y) = {d.rank_receiver} (Y: the receiver's {'OV' if d.mode == 'v' else 'QK'}); "
                f"weights {d.processing}"] + explained_lines(d.explained, d.edge)

    def key_number(self, result: ClaimResult) -> str:
        if result.value is None:
            return "undefined"
        return f"{result.value:.3f} (p_adj {fmt_p(details(result, CompositionDetails).p_adjusted)})"

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        return [(details(result, CompositionDetails).null_q99, "null 99th pct")]

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return [details(result, CompositionDetails).edge]


class CompositionKind(ClaimKind[CompositionClaim, CompositionDetails]):
    name = "composition"
    spec = CompositionClaim
    details = CompositionDetails
    evidence = "weights"
    summary = "a head's OV composes with a later head's q, k or v input (rotation null)"
    view = CompositionView()

    def needs_weights(self, claim: CompositionClaim) -> bool:
        return True

    def edges(self, claim: CompositionClaim) -> list[names.Edge]:
        return [claim.edge]

    def ladder(self, claim: CompositionClaim, result: ClaimResult) -> list[LadderEntry]:
        d = self.details_of(result)
        composes = d.composes if d.composes is not None else d.p_adjusted < d.alpha
        status = verdict_status(result)
        return [LadderEntry(str(claim.edge), "edge", Rung.WEIGHTS, status,
                            f"{'composes' if composes else 'does not compose'} (p_adj {fmt_p(d.p_adjusted)})")]

    def measure(self, claims: Sequence[Indexed[CompositionClaim]], ctx: Context) -> Measured:
        found = route_evidence(ctx.composition(), [c.edge for _, c in claims], ctx.stats)
        ctx.let_go_of_cores()  # the explanations read the weights alone
        return Measured({i: self.evaluate(c, r, ctx.stats, len(claims), ctx.explained(c.edge))
                         for (i, c), r in zip(claims, found, strict=True)})

    def evaluate(self, claim: CompositionClaim, route: RouteEvidence, st: Stats, n_tested: int,
                 explained: Explained | None = None) -> ClaimResult:
        r, p_adjusted, composes = route.result, route.p_adjusted, route.composes
        alpha, min_ratio = st.composition_alpha, st.composition_min_ratio
        want = claim.expect == "composes"
        verdict = PASS if composes == want else FAIL
        expectation = (f"{claim.edge} {'composes' if want else 'does not compose'} "
                       f"({r.mode.upper()}-composition)")
        details = CompositionDetails(**r.model_dump(), edge=str(claim.edge), p_adjusted=p_adjusted, alpha=alpha,
                                     correction="Benjamini-Hochberg", n_tested=n_tested, explained=explained,
                                     min_peer_ratio=min_ratio, composes=composes)
        score = r.score
        if score is None or math.isnan(score):
            return self.result(claim, expectation=expectation, verdict=verdict, value=None, ci=None, unit=UNIT,
                               details=details, rule="no route: the sender's OV or the receiver's matrix is zero "
                                                     "(score undefined, p = 1)")
        null = p_adjusted < alpha
        out = scores.stands_out(r.peer_ratio, min_ratio)
        peers = ("no peers to stand out from" if r.peer_ratio is None else
                 f"{r.peer_ratio:.2f} x the median of its {r.n_peers} peers ({r.peer_median:.3f}; rank "
                 f"{r.peer_rank}) {'>=' if out else '<'} {min_ratio:g}")
        rule = (f"C = {score:.3f} vs null mean {r.null_mean:.3f} (99th pct {r.null_q99:.3f}); "
                f"p = {fmt_p(r.p_value)}, BH-adjusted over {n_tested} composition claim(s) p = {fmt_p(p_adjusted)} "
                f"{'<' if null else '>='} alpha {alpha:g}; {peers}")
        why = ("" if composes else ": beats the rotation null but does not stand out among its peers" if null
               else ": does not beat the rotation null")
        return self.result(claim, expectation=expectation, verdict=verdict, value=score, ci=None, unit=UNIT,
                           rule=rule, details=details,
                           reason=f"{'composes' if composes else 'does not compose'}{why}: C = {score:.3f}, p_adj "
                                  f"{fmt_p(p_adjusted)}, {peers}")




KIND = CompositionKind()
