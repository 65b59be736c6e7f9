"""A circuit claim's non-vacuity is judged on the ablated rest as a whole: heads that do not
change on their own are listed, not a reason for INCONCLUSIVE, when the rest's joint change
is above min_change; a rest that changes nothing leaves the claim untested; a faithfulness
above 1 is explained."""

from __future__ import annotations

import numpy as np
import pytest

from harness.claims.circuit import KIND, CircuitMetrics
from harness.claims.effects import intervention_change
from harness.evidence.verdicts import Verdict
from harness.spec.settings import Stats
from harness.spec.vocabulary import LadderStatus

ST = Stats()
N = 60


def _claim():
    return KIND.spec.model_validate({"id": "c", "kind": "circuit", "heads": ["L1H5", "L0H7"], "at_least": 0.5})


def _runs(f: float):
    """Per-prompt metrics whose faithfulness is about f: full 2, empty 0, circuit 2f, with a little noise."""
    rng = np.random.default_rng(0)
    full = 2.0 + 0.1 * rng.standard_normal(N)
    empty = 0.1 * rng.standard_normal(N)
    return full, empty + f * (full - empty) + 0.02 * rng.standard_normal(N), empty


def _evaluate(f: float, joint: float, per_head: dict[str, float]):
    change = intervention_change(np.full(N, joint), ST, "every position up to the last scored one",
                                 {h: np.full(N, v) for h, v in per_head.items()})
    full, circuit, empty = _runs(f)
    return KIND.evaluate(_claim(), CircuitMetrics(full, circuit, empty, change), None, ST, 0, "nats", compare=False)


def test_no_op_members_are_listed_and_do_not_block_a_pass():
    r = _evaluate(0.9, 0.4, {"L0H1": 0.001, "L0H2": 0.6, "L1H0": 0.02})
    assert r.verdict == Verdict.PASS
    assert r.details.intervention_change.vacuous_heads == ["L0H1", "L1H0"]
    assert "2 of the ablated do not change on their own" in r.rule and "L0H1, L1H0" in r.rule
    assert [e.status for e in KIND.ladder(_claim(), r)] == [LadderStatus.SUPPORTS]


def test_a_rest_that_changes_nothing_leaves_the_claim_untested():
    r = _evaluate(0.9, 0.01, {"L0H1": 0.01, "L0H2": 0.01})
    assert r.verdict == Verdict.INCONCLUSIVE and r.reason.startswith("untested: ")
    assert "relative change 0.010 < min_change 0.05" in r.reason
    assert [e.status for e in KIND.ladder(_claim(), r)] == [LadderStatus.UNTESTED]


def test_a_fail_stays_a_fail_whatever_the_change():
    r = _evaluate(0.1, 0.01, {"L0H1": 0.01})
    assert r.verdict == Verdict.FAIL


def test_faithfulness_above_one_is_explained():
    r = _evaluate(1.3, 0.4, {"L0H2": 0.4})
    assert r.verdict == Verdict.PASS and r.value > 1.2
    assert "faithfulness above 1: the circuit alone moves the metric further than the whole model" in r.rule
    med = float(np.median(r.per_prompt))
    assert f"median {med:.3f}" in r.rule
    assert med == pytest.approx(1.3, abs=0.05)
