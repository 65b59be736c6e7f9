"""The evidence ladder reads a claim's verdict first: for every built-in claim kind, in both
directions (`at_least` and `at_most`, `expect: used` and `unused`, `composes` and
`does_not_compose`), a PASS is a step that supports the mechanism as the file states it and a
FAIL a step against it. A FAILed claim never reads as support."""

from __future__ import annotations

from typing import Any

import pytest

from harness.claims import registry
from harness.evidence.result import ClaimResult
from harness.evidence.verdicts import Verdict
from harness.spec.vocabulary import LadderStatus, Rung

EDGE = "L0H7 -> L1H5.k"
CLAIMS: dict[str, list[dict[str, Any]]] = {
    "role": [{"head": "L1H5", "role": "induction", "at_least": 0.5},
             {"head": "L1H5", "role": "induction", "at_most": 0.1}],
    "attention": [{"head": "L1H5", "from": "scored", "to": "bos", "at_least": 0.5},
                  {"head": "L1H5", "from": "scored", "to": "bos", "at_most": 0.1}],
    "copying": [{"head": "L1H5", "at_least": 0.5}, {"head": "L1H5", "at_most": 0.1},
                {"head": "L1H5", "at_most": -0.5}],  # a suppressing head
    "composition": [{"edge": EDGE, "expect": "composes"}, {"edge": EDGE, "expect": "does_not_compose"}],
    "ablation": [{"heads": ["L1H5"], "at_least": 0.5}, {"heads": ["L1H5"], "at_most": 0.1},
                 {"heads": ["L1H5"], "at_most": -0.2}],  # a head whose removal helps
    "attribution": [{"edge": EDGE, "expect": "used"}, {"edge": EDGE, "expect": "unused"}],
    "edge": [{"edge": EDGE, "expect": "used"}, {"edge": EDGE, "expect": "unused"},
             {"edge": EDGE, "expect": "used", "direction": "denoising"},
             {"edge": EDGE, "expect": "unused", "direction": "denoising"}],
    "path": [{"path": "L0H7 -> L1H5.k -> logits", "expect": "used"},
             {"path": "L0H7 -> L1H5.k -> logits", "expect": "unused"}],
    "circuit": [{"heads": ["L0H7", "L1H5"], "at_least": 0.8}, {"heads": ["L0H7", "L1H5"], "at_most": 0.2},
                {"edges": [EDGE, "L1H5 -> logits"], "at_least": 0.8},
                {"edges": [EDGE, "L1H5 -> logits"], "at_most": 0.2}],
}
# what the kinds' ladder steps read from the details besides the verdict: an intervention that
# changed what it reads, a use that was tested, no sensitivity run
DETAILS = {"intervention_change": None, "sensitivity": None, "corruption": None, "use": "used", "method": "eap-ig",
           "p_adjusted": 0.01, "alpha": 0.05}


def _cases() -> list[tuple[str, dict[str, Any], Verdict]]:
    return [(kind, fields, v) for kind, many in CLAIMS.items() for fields in many for v in (Verdict.PASS, Verdict.FAIL)]


def test_every_built_in_kind_is_covered():
    assert set(CLAIMS) == set(registry.names())


@pytest.mark.parametrize(("kind", "fields", "verdict"), _cases())
def test_a_step_reads_the_verdict_whatever_the_direction(kind, fields, verdict):
    k = registry.get(kind)
    claim = k.spec.model_validate({"id": "x", "kind": kind, **fields})
    details = k.details.model_construct(**{name: value for name, value in DETAILS.items()
                                           if name in k.details.model_fields})
    result = ClaimResult(id="x", kind=kind, expectation="", verdict=verdict, value=0.5, ci=[0.4, 0.6], unit="",
                         rule="", details=details, evidence=k.evidence)
    steps = [e for e in k.ladder(claim, result) if e.rung != Rung.ROBUSTNESS]
    assert steps, f"{kind} adds no step to the ladder"
    want = LadderStatus.SUPPORTS if verdict == Verdict.PASS else LadderStatus.AGAINST
    assert {e.status for e in steps} == {want}


def test_an_inconclusive_claim_is_inconclusive():
    k = registry.get("ablation")
    claim = k.spec.model_validate({"id": "x", "kind": "ablation", "heads": ["L1H5"], "at_most": 0.1})
    result = ClaimResult(id="x", kind="ablation", expectation="", verdict=Verdict.INCONCLUSIVE, value=0.1,
                         ci=[0.0, 0.2], unit="", rule="", details=k.details.model_construct(**{
                             n: v for n, v in DETAILS.items() if n in k.details.model_fields}), evidence=k.evidence)
    assert [e.status for e in k.ladder(claim, result)] == [LadderStatus.INCONCLUSIVE]
