"""The Python API end to end: determinism, dict input, evidence contents, undefined numbers."""


import pytest
import yaml

import harness

from .conftest import HYPOTHESES, ROOT


def numbers(ev):
    return [(c.id, c.verdict, c.value, c.ci) for c in ev.claims]


@pytest.fixture(scope="module")
def demo(demo_evidence):
    return demo_evidence


def small_demo() -> dict:
    """The demo with fewer prompts and random circuits: every claim kind, quick."""
    d = yaml.safe_load((HYPOTHESES / "induction.yaml").read_text())
    d["data"]["n_prompts"] = 40
    for c in d["claims"]:
        if c["kind"] == "circuit":
            c["random_circuits"] = 20
    return d


@pytest.mark.slow
def test_same_seed_same_numbers():
    first = harness.run(small_demo(), base_dir=HYPOTHESES)
    again = harness.run(small_demo(), base_dir=HYPOTHESES)
    assert numbers(again) == numbers(first)
    assert again.weights_vs_use == first.weights_vs_use and again.figures_data == first.figures_data
    other = harness.run(small_demo(), seed=7, base_dir=HYPOTHESES)
    exact = [c.value for c in first.claims if c.kind != "circuit"]  # circuits draw random circuits
    assert [c.value for c in other.claims if c.kind != "circuit"] == exact  # data fixed
    assert [c.ci for c in other.claims] != [c.ci for c in first.claims]  # bootstrap stream moved


def test_evidence_document(demo):
    d = demo.to_dict()
    assert d["hypothesis"]["name"] == "induction" and len(d["hypothesis"]["sha256"]) == 64
    assert d["model"]["kind"] == "native" and len(d["model"]["sha256"]) == 64
    assert d["settings"]["seed"] == 0 and d["provenance"]["versions"]["torch"].startswith("2.")
    for c in d["claims"]:
        assert {"id", "kind", "verdict", "value", "ci", "rule", "details", "evidence"} <= set(c)
        if c["evidence"] == "weights":
            assert c["ci"] is None  # exact numbers of the weights
        else:
            assert c["ci"][0] <= c["value"] <= c["ci"][1]
    comp = next(c for c in d["claims"] if c["kind"] == "composition")
    det = comp["details"]
    assert det["p_value"] <= det["p_adjusted"] < det["alpha"] == 0.01
    assert det["n_draws"] >= 1000 and det["processing"] == "folded"
    assert det["null_mean"] == pytest.approx(1 / 8, abs=0.01)  # ~ 1/sqrt(d_model)
    assert d["settings"]["weight_processing"].startswith("folded")
    assert all(ch["passed"] for ch in d["sanity_checks"])
    assert d["baseline"]["gap"]["mean"] > 3  # nats: the fixture really does induction
    assert demo.exit_code == 0 and "prev-token-L0H7" in harness.claim_table(demo)


def test_dict_hypothesis_with_base_dir():
    d = yaml.safe_load((HYPOTHESES / "induction.yaml").read_text())
    d["claims"] = d["claims"][:1]
    d["data"]["n_prompts"] = 20
    ev = harness.run(d, base_dir=HYPOTHESES)
    assert ev.hypothesis["file"] is None and ev.claims[0].verdict == "PASS"


def test_undefined_normalised_effect_is_inconclusive():
    """With the corruption equal to the clean prompt (no gap) a normalised effect
    is 0/0: the verdict must be INCONCLUSIVE with the reason, never PASS."""
    d = yaml.safe_load((HYPOTHESES / "induction.yaml").read_text())
    d["claims"] = [c for c in d["claims"] if c["kind"] == "ablation"][:1]
    d["stats"] = {"min_gap": 100.0}  # no model has a 100-nat gap
    ev = harness.run(d, base_dir=HYPOTHESES)
    (c,) = ev.claims
    assert c.verdict == "INCONCLUSIVE" and c.value is None and "undefined" in c.rule
    assert c.details.drop_mean > 1  # the raw change is still shown
    assert not ev.sanity_checks[0].passed


def test_jsonl_data_and_logit_diff(tmp_path):
    import json

    from harness.data import dataset as data

    ds = data.repeated_tokens(12, 10, 128, seed=9)
    with open(tmp_path / "p.jsonl", "w") as f:
        for i in range(ds.n):
            f.write(json.dumps({"clean": ds.clean[i].tolist(), "corrupted": ds.corrupted[i].tolist(),
                                "positions": ds.positions[i].tolist(),
                                "wrong": ((ds.answers[i] % 127) + 1).tolist()}) + "\n")
    d = {"harness": 1, "name": "jsonl", "model": str(ROOT / "fixtures" / "induction-2l"),
         "data": {"file": "p.jsonl"}, "metric": "logit_diff",
         "claims": [{"id": "a", "kind": "ablation", "heads": ["L0H7"], "ablation": "zero",
                     "measure": "delta", "at_least": 1.0}]}
    ev = harness.run(d, base_dir=tmp_path)
    assert ev.claims[0].verdict == "PASS" and ev.claims[0].unit == "logits"
    assert ev.data["n_prompts"] == 12


def test_role_claim_on_hf_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    d = {"harness": 1, "name": "hf", "model": "m",
         "data": {"generator": "repeated_tokens", "n_prompts": 10, "segment_length": 6},
         "claims": [{"id": "r", "kind": "role", "head": "L1H2", "role": "induction", "at_least": 0.9},
                    {"id": "a", "kind": "ablation", "heads": ["L0H1", "L1H3"], "ablation": "resample",
                     "measure": "delta", "at_most": 5.0}]}
    ev = harness.run(d, base_dir=tmp_path)
    assert ev.claims[0].verdict == "FAIL"  # a random model has no induction head
    assert ev.model["kind"] == "transformers"
    assert ev.sanity_checks[1].name == "identity interventions reproduce the base run"


def test_paths_are_shown_relative_to_the_working_folder_or_home(tmp_path, monkeypatch):
    from harness.engine.provenance import shown_path

    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    assert shown_path(str(work / "fixtures" / "m")) == "fixtures/m"
    assert shown_path("~/.cache/m") == "~/.cache/m" == shown_path(str(home / ".cache" / "m"))
    assert shown_path(str(tmp_path / "elsewhere")) == str(tmp_path / "elsewhere")
