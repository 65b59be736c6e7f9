"""Sanity checks, warnings and ladder entries that fit what the file claims: the gap check only
where some claim normalises by the gap, the reference-prompt warning only for claims that take
means and only when the overlap is material, ladder entries in the claim's own direction; and
the small messages met on the way."""

from __future__ import annotations

import pytest

import harness
from harness.engine.measure import SHARED_MATERIAL, means_warnings

from .conftest import FIXTURE, HYPOTHESES


def weights_only_doc(n_claims=12):
    """Composition claims on the fixture with prompts whose corruption changes nothing."""
    claims = [{"id": f"c{i}", "kind": "composition", "edge": f"L0H{i % 8} -> L1H{(i * 3) % 8}.k",
               "expect": "composes"} for i in range(n_claims)]
    return {"harness": 1, "name": "weights", "model": str(FIXTURE),
            "data": {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 6,
                     "corruptions": ["second_half"]},
            "stats": {"null_draws": 200}, "claims": claims}


def test_a_file_of_weight_claims_exits_by_its_claims(tmp_path):
    """second_half corruption: the copy is intact, the gap small; no claim reads it."""
    ev = harness.run(weights_only_doc(), device="cpu", figures=False)
    gap = next(c for c in ev.sanity_checks if c.name.startswith("clean and corrupted metrics differ"))
    assert gap.applies is False and gap.passed and gap.detail.startswith("not applicable (no claim normalises")
    assert ev.exit_code in (0, 1) and not ev.failed_sanity_checks


def test_the_names_suppressing_head_is_supported_on_its_ladder():
    doc = {"harness": 1, "name": "sup", "model": "../fixtures/names-3l",
           "data": {"file": "../fixtures/names-3l/prompts-abba.jsonl", "limit": 20}, "metric": "logit_diff",
           "claims": [{"id": "L2H0-suppresses-names", "kind": "copying", "head": "L2H0", "at_most": -0.5},
                      {"id": "L2H0-needed", "kind": "ablation", "heads": ["L2H0"], "ablation": "resample",
                       "at_least": 0.2}]}
    ev = harness.run(doc, base_dir=HYPOTHESES, device="cpu", figures=False)
    row = next(r for r in ev.ladder if r.mechanism == "L2H0")
    assert [s.status for s in row.rungs["weights"]] == ["supports"]
    assert not any("weights is against it" in c for c in row.contradictions)


class _Data:
    def __init__(self, n, shared):
        self.n, self.shared_reference = n, shared


def test_the_reference_warning_needs_means_and_a_material_overlap():
    from harness.claims.ablation import AblationClaim
    from harness.claims.role import RoleClaim

    mean = AblationClaim(id="m", kind="ablation", heads=["L0H7"], ablation="mean", at_least=0.5)
    resample = AblationClaim(id="r", kind="ablation", heads=["L0H7"], ablation="resample", at_least=0.5)
    role = RoleClaim(id="p", kind="role", head="L0H7", role="previous_token", at_least=0.5)
    many = int(200 * SHARED_MATERIAL) + 1
    assert means_warnings([mean], _Data(200, many))[0].startswith(f"data: {many} of the 200 prompts")
    assert means_warnings([resample, role], _Data(200, many)) == []  # no claim takes means
    assert means_warnings([mean], _Data(200, 1)) == []  # one prompt in 200: not material


def test_small_messages():
    ev = harness.run(weights_only_doc(2), device="cpu", figures=False)
    with pytest.raises(KeyError, match="no claim 'nope'; the claims are c0, c1"):
        ev.claim("nope")
    edge = {"harness": 1, "name": "e", "model": str(FIXTURE), "data": {"generator": "repeated_tokens"},
            "claims": [{"id": "e", "kind": "edge", "edge": "L0H7 -> L1H5.k", "at_least": 0.2}]}
    with pytest.raises(harness.errors.SpecError, match="expect: used with min_effect"):
        harness.load_hypothesis(edge)
    comp = {**edge, "claims": [{"id": "c", "kind": "composition", "edge": "L0H1 + L0H3 -> L1H5.k"}]}
    with pytest.raises(harness.errors.SpecError, match="is a single name \\(a head L<layer>H<head>\\), not a group"):
        harness.load_hypothesis(comp)
