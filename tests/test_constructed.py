"""Ground truth: every verdict on the constructed models is the one known in
advance, known routes get the weights-vs-use class their test shows (the decoy is
'route present, unused' under zero replacement), and null models give no more
false positives than the nominal alpha (harness.selftest)."""

import pytest
import yaml

from harness.claims import registry
from harness.tools import constructed
from harness.tools.selftest import ROOT, render, selftest

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

EXPECTED = yaml.safe_load((ROOT / "expected.yaml").read_text())
CASES = [(f, c, v) for f, claims in EXPECTED.items() for c, v in claims.items()]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return selftest(tmp_path_factory.mktemp("selftest"), null_seeds=20)


@pytest.mark.parametrize("file,claim,verdict", CASES, ids=[f"{f}::{c}" for f, c, _ in CASES])
def test_expected_verdict(result, file, claim, verdict):
    row = next(r for r in result.rows if r["file"] == file and r["claim"] == claim)
    assert row["obtained"] == verdict, row


def test_every_claim_kind_has_true_and_false_claims():
    import harness

    kinds = {}
    for f, claims in EXPECTED.items():
        spec = harness.load_hypothesis(ROOT / "validation" / f"{f}.yaml").spec
        by_id = {c.id: c.kind for c in spec.claims}
        assert set(by_id) == set(claims), f  # every claim of the file has an expectation
        for cid, v in claims.items():
            kinds.setdefault(by_id[cid], set()).add(v)
    assert set(kinds) == set(registry.names())  # every built-in kind
    assert all({"PASS", "FAIL"} <= v for v in kinds.values())


def test_known_routes_get_the_class_their_test_shows(result):
    """The decoy is 'route present, unused' under zero replacement and untested under
    resample (its output is the same in every prompt); the query route is untested by the
    first-half corruption and used under the second; the clean model's key edge is used,
    and denoising it alone works against the claim's direction."""
    got = {(route, test): obtained for route, test, _, obtained in result.route_classes()}
    assert got == {
        ("decoy L0H1 -> L1H0.k", "resample, first_half"): "route present, untested by this intervention",
        ("decoy L0H1 -> L1H0.k", "zero"): "route present, unused",
        ("query L0H1 -> L1H0.q", "resample, first_half"): "route present, untested by this intervention",
        ("query L0H1 -> L1H0.q", "resample, second_half"): "route used",
        ("clean L0H0 -> L1H0.k", "resample, first_half"): "route used",
        ("clean L0H0 -> L1H0.k", "denoising, first_half"): "route used, against the claim's direction",
    }
    assert "Weights vs use of known routes" in render(result)


def test_null_false_positive_rates(result):
    for name, f in result.fpr.items():
        assert f["n"] >= 200 and f["ok"], (name, f)
        assert f["ci"][0] <= f["alpha"]
    assert result.fpr["used"]["rate"] <= 0.05 and result.fpr["composes"]["rate"] <= 0.01


def test_summary_and_exit_status(result):
    text = render(result)
    last = text.splitlines()[-1]
    assert last == (f"selftest: {len(CASES)}/{len(CASES)} verdicts as expected; FPR used "
                    f"{result.fpr['used']['rate']:.3f}, composes {result.fpr['composes']['rate']:.3f}")
    assert result.passed and "UNEXPECTED" not in text


def test_constructed_models_are_what_the_docstring_says(tmp_path):
    """The clean model's attention: L0H0 attends to the previous position, L1H0 to
    the position after the earlier copy of the current token (hand-checked prompt)."""
    import torch

    b = constructed.build("clean")
    toks = torch.tensor([[0, 5, 7, 9, 5, 7, 9]])
    _, cache = b.run_with_cache(toks)
    prev = cache["blocks.0.attn.hook_pattern"][0, 0]
    ind = cache["blocks.1.attn.hook_pattern"][0, 0]
    assert all(prev[i, i - 1] > 0.99 for i in range(1, 7))
    assert ind[4, 2] > 0.99 and ind[5, 3] > 0.99  # 5 at 4 -> after the 5 at 1 is position 2
    logits = b(toks)[0]
    assert logits[4].argmax() == 7 and logits[5].argmax() == 9  # it copies


def test_selftest_cli_rejects_bad_options(tmp_path):
    from harness.cli import main

    assert main(["selftest", "--null-seeds", "0"]) == 2
    (tmp_path / "x").write_text("")
    assert main(["selftest", "--out", str(tmp_path)]) == 2
