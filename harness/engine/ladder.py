"""The evidence ladder: for each mechanism a file talks about (each head, set of
heads, edge and path its claims name), which levels of evidence the run reached, in
order (evidence.details.RUNGS):

    weights         the route composes beyond chance (composition claims and the
                    weights-vs-use table; for a head, its copying score)
    observation     the head's attention pattern has the role (role claims)
    necessity       ablating the head(s) removes the behaviour (ablation claims)
    edge necessity  noising the edge removes it, with a patch that changes what
                    the receiver reads (noising edge claims)
    sufficiency     denoising the edge restores it (denoising edge claims); keeping
                    only a circuit keeps it (circuit claims)
    robustness      the verdict agrees across ablation/replacement types
                    (`sensitivity: true`) and across corruptions (the same rung
                    tested under several corruptions)

The ladder is of the mechanism as the file states it.  Each claim adds steps through its
kind (ClaimKind.ladder) that read its verdict first (claims.base.verdict_status): a PASS
`supports` it and a FAIL is `against` it whatever the claim's direction (an `at_most` or
`expect: unused` claim that PASSes supports the file's account too), an INCONCLUSIVE claim is
`inconclusive`, and an intervention that changed nothing it reads is `untested`.  The
weights-vs-use table adds a weights step for an edge only edge claims name and that the file
says is used (`supports`: the route composes, `against`: it does not); for a route the file
says is unused, composition states nothing either way (the table shows the pair).  A row
gives the highest rung some step supports, the rungs that apply and no claim tested, and
every contradiction: a rung whose steps disagree, a rung that supports the mechanism while
another is against it, a robustness failure.  A high rung never hides a contradiction on a
lower one.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..claims.base import LadderEntry
from ..claims.registry import kind_of
from ..evidence.details import LadderRow, LadderStep, WeightsVsUseRow
from ..evidence.format import fmt_p
from ..evidence.result import ClaimResult
from ..spec.fields import ClaimSpec
from ..spec.vocabulary import CIRCUIT_RUNGS, LadderStatus, Rung

SUPPORTS, AGAINST = LadderStatus.SUPPORTS, LadderStatus.AGAINST
APPLIES = {"head": (Rung.WEIGHTS, Rung.OBSERVATION, Rung.NECESSITY, Rung.ROBUSTNESS),
           "heads": (Rung.NECESSITY, Rung.SUFFICIENCY, Rung.ROBUSTNESS),
           "edge": (Rung.WEIGHTS, Rung.EDGE_NECESSITY, Rung.SUFFICIENCY, Rung.ROBUSTNESS),
           "route": (Rung.EDGE_NECESSITY, Rung.SUFFICIENCY, Rung.ROBUSTNESS)}  # paths, MLP ends, groups: no weights
WEIGHTS_VS_USE = "(weights vs use)"


def entries(claims: Sequence[ClaimSpec], results: Sequence[ClaimResult], rows: Sequence[WeightsVsUseRow]) -> Steps:
    """(claim id, entry) for every step the claims and the weights-vs-use table give."""
    out = [(r.id, e) for c, r in zip(claims, results, strict=True) for e in kind_of(c).ladder(c, r)]
    expected = {c.id: getattr(c, "expect", None) for c in claims}
    weighed = {e.mechanism for _, e in out if e.rung is Rung.WEIGHTS}  # routes a composition claim names
    for row in rows:  # the composition test of an edge that only edge claims name
        if row.composes is None or row.composition_p_adjusted is None:
            continue  # an MLP end: no composition score
        if row.edge in weighed:
            continue  # its composition claim is the step: the same test is not shown twice
        if all(expected.get(t.claim) == "unused" for t in row.tests):
            continue  # the file states the route is not used: composition neither supports nor contradicts that
        out.append((WEIGHTS_VS_USE, LadderEntry(row.edge, "edge", Rung.WEIGHTS, SUPPORTS if row.composes else AGAINST,
                                                f"composition {fmt_p(row.composition_p_adjusted)} (BH-adjusted p)")))
    return out


Steps = list[tuple[str, LadderEntry]]  # (claim id, entry)


def _across_corruptions(mechanism: str, type_: str, found: Steps) -> Steps:
    """A robustness step for each rung tested under several corruptions."""
    out = []
    for rung in (Rung.NECESSITY, Rung.EDGE_NECESSITY, Rung.SUFFICIENCY):
        by_corruption: dict[str, set[LadderStatus]] = {}
        for _, e in found:
            if e.rung == rung and e.corruption is not None and e.status in (SUPPORTS, AGAINST):
                by_corruption.setdefault(e.corruption, set()).add(LadderStatus(e.status))
        if len(by_corruption) < 2:
            continue
        statuses = set().union(*by_corruption.values())
        cells = ", ".join(f"{c} {'/'.join(sorted(s))}" for c, s in by_corruption.items())
        if statuses == {AGAINST}:
            continue  # robustly against: the rung itself says so
        if statuses == {SUPPORTS}:
            out.append(("(corruptions)", LadderEntry(mechanism, type_, Rung.ROBUSTNESS, SUPPORTS,
                                                     f"{rung} agrees across corruptions: {cells}")))
        else:
            out.append(("(corruptions)", LadderEntry(mechanism, type_, Rung.ROBUSTNESS, AGAINST,
                                                     f"{rung} depends on the corruption: {cells}")))
    return out


def contradictions(rungs: dict[Rung, list[LadderStep]]) -> list[str]:
    """Disagreements within a rung and between rungs: a claim (or the weights-vs-use table) whose
    step is against the mechanism as the file states it, beside one that supports it."""
    out = []
    for rung, steps in rungs.items():
        statuses = {s.status for s in steps}
        if {SUPPORTS, AGAINST} <= statuses and rung != Rung.ROBUSTNESS:
            yes = ", ".join(s.claim for s in steps if s.status == SUPPORTS)
            no = ", ".join(s.claim for s in steps if s.status == AGAINST)
            out.append(f"{rung}: for it {yes}; against it {no}")
    if any(s.status == AGAINST for s in rungs.get(Rung.ROBUSTNESS, [])):
        out += [f"robustness: {s.note}" for s in rungs[Rung.ROBUSTNESS] if s.status == AGAINST]
    order = [r for r in Rung if r in rungs and r != Rung.ROBUSTNESS]
    for i, low in enumerate(order):
        for high in order[i + 1:]:
            if low in CIRCUIT_RUNGS and high in CIRCUIT_RUNGS:
                continue  # separate properties of a circuit, not levels of one another
            low_s = {s.status for s in rungs[low]}
            high_s = {s.status for s in rungs[high]}
            if SUPPORTS in low_s and AGAINST in high_s:
                out.append(f"{low} supports it but {high} is against it")
            elif AGAINST in low_s and SUPPORTS in high_s:
                out.append(f"{low} is against it but {high} supports it")
    return out


def build(claims: Sequence[ClaimSpec], results: Sequence[ClaimResult],
          rows: Sequence[WeightsVsUseRow]) -> list[LadderRow]:
    """One row per mechanism, in the order the file first names them."""
    found: dict[tuple[str, str], Steps] = {}
    for claim_id, e in entries(claims, results, rows):
        found.setdefault((e.mechanism, e.type), []).append((claim_id, e))
    out = []
    for (mechanism, type_), items in found.items():
        items = items + _across_corruptions(mechanism, type_, items)
        rungs: dict[Rung, list[LadderStep]] = {}
        for claim_id, e in items:
            rungs.setdefault(Rung(e.rung), []).append(LadderStep(claim=claim_id, status=LadderStatus(e.status),
                                                                 note=e.note))
        rungs = {r: rungs[r] for r in Rung if r in rungs}
        supported = [r for r in Rung if any(s.status == SUPPORTS for s in rungs.get(r, []))]
        out.append(LadderRow(mechanism=mechanism, type=type_, rungs=rungs,
                             highest=supported[-1] if supported else None,
                             missing=[r for r in APPLIES[type_] if r not in rungs],
                             contradictions=contradictions(rungs)))
    return out
