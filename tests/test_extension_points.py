"""The recipes of docs/architecture.md followed from outside the package: a data source
(tests/toy_data_source.py) and a model source (tests/toy_model_source.py), each registered here
and used by `harness run`, `harness validate` and the error messages with no edit anywhere else.
(The claim kind's recipe is tests/test_registry.py's, the metric's tests/test_metrics.py's.)"""

from __future__ import annotations

import pytest
import yaml

import harness
from harness.cli import main
from harness.errors import SpecError
from harness.model import data_sources
from harness.model import ref as model_ref

from . import toy_data_source, toy_model_source
from .conftest import FIXTURE


@pytest.fixture
def reversed_half():
    data_sources.register(toy_data_source.SOURCE)
    try:
        yield toy_data_source.SOURCE
    finally:
        data_sources.unregister("reversed_half")


@pytest.fixture
def toy_models():
    model_ref.register(toy_model_source.SOURCE)
    try:
        yield toy_model_source.SOURCE
    finally:
        model_ref.unregister("toy:")


def doc(model: str, data: dict) -> dict:
    return {"harness": 1, "name": "plugin", "model": model, "data": data, "stats": {"bootstrap": 300},
            "claims": [{"id": "prev", "kind": "role", "head": "L0H7", "role": "previous_token", "at_least": 0.8},
                       {"id": "needed", "kind": "ablation", "heads": ["L0H7"], "ablation": "resample",
                        "at_least": 0.3}]}


def test_a_data_source_registered_from_outside(reversed_half, tmp_path):
    ev = harness.run(doc(str(FIXTURE), toy_data_source.mapping()), device="cpu", figures=False)
    prev, needed = ev.claims
    assert prev.verdict == "PASS"  # the fixture's previous-token head on the plugin's prompts
    assert ev.data["description"].startswith("reversed_half: 40 prompts") and ev.baseline["corruption"] == "reversed"
    # the plugin's corruption breaks the earlier copy's order: induction loses most of its gap
    assert ev.baseline["gap"]["mean"] > 1.0 and needed.verdict == "PASS"
    assert ev.settings["mean_ablation_reference"] == "the other clean prompts (leave-one-out), per position"
    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump(doc(str(FIXTURE), toy_data_source.mapping(reversed_half=1))))
    with pytest.raises(SpecError, match=r"h.yaml:\d+: data.reversed_half: Input should be greater than or equal"):
        harness.load_hypothesis(f)


def test_an_unregistered_data_source_is_named_in_the_error(reversed_half, tmp_path):
    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump(doc(str(FIXTURE), {"generator": "repeated_tokens", "reversed_half": 8})))
    with pytest.raises(SpecError, match="give exactly one of .*'reversed_half' \\(the toy plugin\\)"):
        harness.load_hypothesis(f)
    data_sources.unregister("reversed_half")
    f.write_text(yaml.safe_dump(doc(str(FIXTURE), toy_data_source.mapping())))
    with pytest.raises(SpecError, match="give exactly one of 'generator'"):
        harness.load_hypothesis(f)
    with pytest.raises(ValueError, match="built-in"):
        data_sources.unregister("generator")


def test_a_model_source_registered_from_outside(toy_models, tmp_path, capsys):
    data = {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 6}
    d = doc("toy:3", data)
    d["claims"] = [{"id": "weak", "kind": "role", "head": "L1H3", "role": "previous_token", "at_most": 0.9}]
    ev = harness.run(d, device="cpu", figures=False)
    assert ev.model["source"] == "toy:3" and ev.model["kind"] == "toy" and ev.model["n_heads"] == 4
    again = harness.run(d, device="cpu", figures=False)
    assert again.claims[0].value == ev.claims[0].value  # the same seed builds the same model
    # validate reads the source's shape without loading: a head outside it is refused by name
    bad = dict(d, claims=[{"id": "x", "kind": "role", "head": "L1H7", "role": "previous_token", "at_least": 0.1}])
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    assert main(["validate", str(f)]) == 2
    assert "L1H7 is not in the model: the model has layers 0..1 and heads 0..3" in capsys.readouterr().err
    ref = model_ref.ModelRef.parse("toy:3")
    assert ref.is_named and ref.kind() == "toy" and ref.relative_to(tmp_path) == "toy:3"
    with pytest.raises(ValueError, match="ending with ':'"):
        model_ref.register(model_ref.ModelSource("hf:", toy_model_source.load))
