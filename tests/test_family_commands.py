"""Every command on the QK-norm families (tests/family_models.py's random Qwen3, OLMo 2 and Gemma 3):
`harness roles`, `harness weights`, `harness discover` (its edge graph through OLMo 2's and Gemma 3's
norms after the attention), `harness explain`, and a hypothesis file of every claim kind, each run to
its end with its files written and every claim given a verdict.  (That the numbers are the model's is
tests/test_families.py's job, against the float64 oracle.)"""

from __future__ import annotations

import json

import pytest
import yaml

from harness.cli import main

from . import family_models

pytestmark = pytest.mark.slow

FAMILIES = ("qwen3", "olmo2", "gemma3")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    return family_models.build(request.param, tmp_path_factory.mktemp(request.param) / "model")


def every_kind(model) -> dict:
    return {"harness": 1, "name": "every-kind", "model": str(model),
            "metric": "kl",  # minus the KL divergence from the clean run: the clean run scores highest, any model
            # the corruption changes the scored tokens themselves: a random model's metric moves with them
            "data": {"generator": "repeated_tokens", "n_prompts": 24, "segment_length": 6,
                     "corruptions": ["second_half"]},
            "stats": {"bootstrap": 300, "null_draws": 199, "min_gap": 0.01, "min_prompt_gap": 0.0},  # a random model
            "claims": [
                {"id": "role", "kind": "role", "head": "L1H0", "role": "induction", "at_least": 0.5},
                {"id": "attention", "kind": "attention", "head": "L1H1", "from": "scored", "to": "bos",
                 "at_most": 0.9},
                {"id": "copying", "kind": "copying", "head": "L1H2", "at_least": 0.0},
                {"id": "composition", "kind": "composition", "edge": "L0H1 -> L1H0.k", "expect": "composes"},
                {"id": "ablation", "kind": "ablation", "heads": ["L0H1"], "ablation": "mean", "at_least": 0.1},
                {"id": "edge", "kind": "edge", "edge": "L0H1 -> L1H0.k", "expect": "used"},
                {"id": "path", "kind": "path", "path": "L0H1 -> L1H0.k -> logits", "expect": "used"},
                {"id": "circuit", "kind": "circuit", "heads": ["L0H1", "L1H0"], "at_least": 0.2},
                {"id": "attribution", "kind": "attribution", "edge": "L0H1 -> L1H0.k", "expect": "used"}]}


def test_every_command_runs_on_the_family(model, tmp_path, capsys):
    f = tmp_path / "every.yaml"
    f.write_text(yaml.safe_dump(every_kind(model), sort_keys=False))
    assert main(["run", str(f), "--out", str(tmp_path / "run"), "--device", "cpu"]) in (0, 1)
    ev = json.loads((tmp_path / "run" / "evidence.json").read_text())
    assert [c["verdict"] for c in ev["claims"]] and all(c["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
                                                        for c in ev["claims"])
    assert ev["model"]["architecture"]["qk_norm"] in ("head", "projection")
    assert main(["roles", str(model), "--data", str(f), "--out", str(tmp_path / "roles"), "--device", "cpu"]) == 0
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    assert (tmp_path / "roles" / "heads.csv").read_text().count("\n") == 1 + layers * 4  # a row per head
    assert main(["weights", str(model), "--draws", "199", "--out", str(tmp_path / "weights"), "--device", "cpu"]) == 0
    assert (tmp_path / "weights" / "composition.json").is_file()
    assert main(["explain", "L0H1 -> L1H0.k", str(model), "--device", "cpu"]) == 0
    assert main(["discover", str(f), "--out", str(tmp_path / "discover"), "--bootstrap", "200", "--device", "cpu"]) == 0
    doc = json.loads((tmp_path / "discover" / "discovery.json").read_text())
    assert doc["curve"] and (tmp_path / "discover" / "starter.yaml").is_file()
    capsys.readouterr()
