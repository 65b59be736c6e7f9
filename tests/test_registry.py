"""The claim-kind registry: a kind written outside the package (tests/toy_kind.py)
and registered here is validated, measured, reported, re-rendered and run as a
pytest test, with no edit to the harness itself."""

import json

import numpy as np
import pytest
import yaml

import harness
from harness.claims import registry
from harness.claims.view import ClaimView
from harness.cli import main
from harness.errors import HarnessError, SpecError
from harness.report import views, writer

from . import toy_kind
from .conftest import FIXTURE

DOC = {"harness": 1, "name": "toy", "model": str(FIXTURE),
       "data": {"generator": "repeated_tokens", "n_prompts": 30, "segment_length": 8},
       "stats": {"bootstrap": 500},
       "claims": [{"id": "L0H7-focused", "kind": "attention_entropy", "head": "L0H7", "at_most": 0.5},
                  {"id": "L0H0-diffuse", "kind": "attention_entropy", "head": "L0H0", "at_least": 3.0},
                  {"id": "prev-token-L0H7", "kind": "role", "head": "L0H7", "role": "previous_token",
                   "at_least": 0.8}]}


@pytest.fixture
def toy():
    registry.register(toy_kind.KIND)
    try:
        yield toy_kind.KIND
    finally:
        registry.unregister(toy_kind.KIND.name)


def test_builtin_kinds_and_their_protocol():
    assert registry.names() == ["role", "attention", "copying", "composition", "ablation", "attribution", "edge",
                                "path", "circuit"]
    for name, kind in registry.kinds().items():
        assert kind.evidence in ("weights", "observational", "attribution", "causal")
        assert kind.name == name and kind.summary
        assert kind.spec.model_fields["kind"].annotation.__args__[0] == name  # the schema's literal is the name
        assert type(kind.view) is not ClaimView and views.get(name) is kind.view  # each carries its own view
    with pytest.raises(HarnessError, match="already registered"):
        registry.register(registry.get("role"))
    with pytest.raises(HarnessError, match="built-in"):
        registry.unregister("edge")

    class Mislabelled(toy_kind.EntropyKind):
        name = "entropy2"  # its schema still says attention_entropy

    with pytest.raises(HarnessError, match="must declare kind: Literal\\['entropy2'\\]"):
        registry.register(Mislabelled())
    assert "entropy2" not in registry.names()


def test_unregistered_kind_is_a_schema_error():
    with pytest.raises(SpecError, match="unknown claim kind 'attention_entropy'; allowed: role, attention, copying"):
        harness.load_hypothesis(DOC)


def test_registered_kind_validates_with_its_own_schema(toy):
    h = harness.load_hypothesis(DOC)
    assert [type(c).__name__ for c in h.spec.claims] == ["EntropyClaim", "EntropyClaim", "RoleClaim"]
    bad = json.loads(json.dumps(DOC))
    bad["claims"][0]["head"] = "L0H7.k"
    bad["claims"][1]["heads"] = ["L0H0"]
    with pytest.raises(SpecError) as exc:
        harness.load_hypothesis(bad)
    # a dict has no lines: the claim is named by its id
    assert any("claims[0] (id: L0H7-focused): head: 'L0H7.k' is not a head" in p for p in exc.value.problems)
    assert any("claims[1] (id: L0H0-diffuse): heads: unknown key; allowed keys: id, kind, head, at_least, at_most, "
               "description (did you mean head?)" in p for p in exc.value.problems)


def test_registered_kind_runs_reports_and_rerenders(toy, tmp_path, fixture_model):
    import torch

    from harness.engine.runner import build_dataset

    ev = harness.run(DOC, device="cpu")
    focused, diffuse, role = ev.claims
    assert (focused.kind, focused.evidence, focused.unit) == ("attention_entropy", "observational", "nats")
    # oracle: entropy of every attention row with torch's own x log x, on the same prompts
    ds = build_dataset(harness.load_hypothesis(DOC), fixture_model)
    with torch.no_grad():
        _, cache = fixture_model.bridge.run_with_cache(ds.clean, names_filter=lambda n: n.endswith("hook_pattern"))
    for result, head in ((focused, 7), (diffuse, 0)):
        rows = torch.special.entr(cache["blocks.0.attn.hook_pattern"][:, head, 1:].double()).sum(-1)
        # both sides are float32 forwards of the fixture, batched differently (the run caches in
        # chunks): they agree to float32 rounding of an O(1) entropy, not to the bit
        assert result.value == pytest.approx(float(rows.mean()), abs=1e-6)
    assert focused.verdict == "PASS" and diffuse.verdict == "FAIL" and role.verdict == "PASS"
    assert focused.value < 0.5 < diffuse.value  # the previous-token head attends sharply
    assert "L0H7-focused" in harness.claim_table(ev) and "attention entropy of L0H7 <= 0.5" in harness.claim_table(ev)

    folder = harness.write_report(ev, out_dir=tmp_path / "r")
    md = (folder / "report.md").read_text()
    assert "- per-prompt entropy median" in md and "</a>L0H0-diffuse — FAIL" in md
    doc = json.loads((folder / "evidence.json").read_text())
    assert writer.validate_evidence(doc) == []
    again = writer.rerender(folder / "evidence.json", tmp_path / "again")
    assert (again / "report.md").read_bytes() == (folder / "report.md").read_bytes()
    attention_heads = [a["head"] for a in doc["figures_data"]["attention"]]
    assert attention_heads == ["L0H7", "L0H0"]  # shown_heads reaches the attention figure

    registry.unregister(toy.name)  # a reader without the kind refuses the document, naming it
    try:
        assert any("unknown claim kind 'attention_entropy'" in p for p in writer.validate_evidence(doc))
        assert main(["report", str(folder / "evidence.json"), "--out", str(tmp_path / "x")]) == 2
    finally:
        registry.register(toy)


def test_registered_kind_in_the_cli_and_the_pytest_plugin(toy, pytester, fixture_model):
    """(fixture_model: torch and TransformerLens are imported outside pytester first; see test_pytest_plugin.)"""
    pytester.makefile(".yaml", toy=yaml.safe_dump(DOC, sort_keys=False))
    assert main(["validate", str(pytester.path / "toy.yaml")]) == 0
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-m", "attention_entropy", "-v")
    result.assert_outcomes(passed=1, failed=1, deselected=1)
    out = result.stdout.str()
    assert "toy.yaml::L0H7-focused PASSED" in out
    assert "FAIL: L0H0-diffuse (attention_entropy, observational evidence)" in out


def test_entropy_oracle_on_a_hand_pattern():
    """The toy's own formula on patterns whose entropy is known: one-hot rows 0, uniform rows log k."""
    onehot = np.zeros((1, 4, 4))
    onehot[0, np.arange(4), 0] = 1.0
    uniform = np.tril(np.ones((4, 4)))[None] / np.arange(1, 5)[None, :, None]
    assert toy_kind.row_entropy(onehot)[0] == pytest.approx(0.0)
    assert toy_kind.row_entropy(uniform)[0] == pytest.approx(np.mean(np.log([2, 3, 4])))


def test_a_kind_that_normalises_by_the_gap_without_declaring_it_gets_the_gap_check(monkeypatch):
    """ClaimKind.reads_gap decides before measuring which gap checks apply; a kind that forgets it
    (here the ablation kind, told to say no) still has its gap checked, from what its results say."""
    from harness.claims.ablation import AblationKind

    doc = {"harness": 1, "name": "gap", "model": str(FIXTURE),
           "data": {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 8},
           "stats": {"bootstrap": 300},
           "claims": [{"id": "needed", "kind": "ablation", "heads": ["L1H5"], "ablation": "resample",
                       "at_least": 0.1}]}

    def gap(ev):
        return next(c for c in ev.sanity_checks if c.name.startswith("clean and corrupted metrics differ"))

    declared = harness.run(doc, device="cpu", figures=False)
    assert gap(declared).applies is not False and not any("without declaring" in w for w in declared.warnings)
    monkeypatch.setattr(AblationKind, "reads_gap", lambda self, claim: False)
    silent = harness.run(doc, device="cpu", figures=False)
    assert gap(silent) == gap(declared)
    assert any("ablation normalise by the clean-corrupted gap without declaring it" in w for w in silent.warnings)
    doc["claims"][0]["measure"] = "delta"  # a change in metric units divides by nothing: its gap check does not apply
    delta = harness.run(doc, device="cpu", figures=False)
    assert gap(delta).applies is False and not any("without declaring" in w for w in delta.warnings)
