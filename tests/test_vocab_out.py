"""Native models that spell out `d_vocab_out` (tracr-compiled models converted to
TransformerLens write `d_vocab: 13, d_vocab_out: 13`), equal to `d_vocab` or smaller.

The oracle for `d_vocab_out == d_vocab` is the fixture itself: the same weights under the
spelled-out config give the same evidence, number for number.  For a narrower output
vocabulary the fixture's unembedding keeps its first 100 columns: the induction mechanism
is untouched for prompts drawn from those ids, so every claim kind runs and the mechanism's
claims pass; the copying score is checked against a float64 eigenvalue computation over the
shared ids, the no-information baseline against -log(100), and answers outside the output
vocabulary give one clear error.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

import harness
from harness.errors import ModelLoadError, SpecError

from .conftest import FIXTURE

OUT = 100  # the narrower output vocabulary


def claims_file(tmp_path, model, vocab_max=None, name="vocab"):
    data = {"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 10, "seed": 3, "split": "test"}
    if vocab_max is not None:
        data["vocab_max"] = vocab_max
    doc = {
        "harness": 1, "name": name, "model": str(model), "data": data, "metric": "logprob", "seed": 0,
        "stats": {"bootstrap": 500, "permutations": 1000, "null_draws": 200},
        "claims": [
            {"id": "prev", "kind": "role", "head": "L0H7", "role": "previous_token", "at_least": 0.8},
            {"id": "copies", "kind": "copying", "head": "L1H5", "at_least": 0.9},
            {"id": "k-comp", "kind": "composition", "edge": "L0H7 -> L1H5.k", "expect": "composes"},
            {"id": "needed", "kind": "ablation", "heads": [f"L1H{i}" for i in range(8)], "ablation": "resample",
             "at_least": 0.8},
            {"id": "k-edge", "kind": "edge", "edge": "L0H7 -> L1H5.k", "expect": "used"},
            {"id": "q-edge", "kind": "edge", "edge": "L0H7 -> L1H5.q", "expect": "unused"},
            {"id": "to-logits", "kind": "path", "path": "L0H7 -> L1H5.k -> logits", "expect": "used"},
            {"id": "circuit", "kind": "circuit", "random_circuits": 20,
             "heads": ["L0H3", "L0H4", "L0H5", "L0H6", "L0H7"] + [f"L1H{i}" for i in range(8)], "at_least": 0.6},
        ]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def fixture_copy(tmp_path, d_vocab_out: int, name: str):
    """The induction fixture with `d_vocab_out` spelled out, its unembedding cut to that width."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / name
    shutil.copytree(FIXTURE, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["d_vocab_out"] = d_vocab_out
    (out / "config.json").write_text(json.dumps(cfg))
    weights = load_file(str(out / "model.safetensors"))
    weights["unembed.weight"] = weights["unembed.weight"][:d_vocab_out].contiguous()
    weights["unembed.bias"] = weights["unembed.bias"][:d_vocab_out].contiguous()
    save_file(weights, str(out / "model.safetensors"))
    return out


def comparable(ev) -> list:
    return [(c.id, c.verdict, c.value, c.ci, c.per_prompt) for c in ev.claims]


def test_spelled_out_output_vocabulary_is_the_fixture(tmp_path):
    """d_vocab_out: 128 = d_vocab gives exactly the fixture's evidence (same machine, same arithmetic)."""
    same = fixture_copy(tmp_path, 128, "same")
    ev = harness.run(claims_file(tmp_path, same, name="same"), device="cpu")
    ref = harness.run(claims_file(tmp_path, FIXTURE, name="ref"), device="cpu")
    assert comparable(ev) == comparable(ref)
    assert ev.model["d_vocab_out"] == ev.model["d_vocab"] == 128
    assert ev.counts()["PASS"] == len(ev.claims)


def test_narrower_output_vocabulary_runs_every_claim_kind(tmp_path):
    narrow = fixture_copy(tmp_path, OUT, "narrow")
    ev = harness.run(claims_file(tmp_path, narrow, vocab_max=OUT), device="cpu")
    assert ev.model["d_vocab"] == 128 and ev.model["d_vocab_out"] == OUT
    assert {c.kind for c in ev.claims} == {"role", "copying", "composition", "ablation", "edge", "path", "circuit"}
    assert ev.counts() == {"PASS": len(ev.claims), "FAIL": 0, "INCONCLUSIVE": 0}, \
        [(c.id, c.verdict, c.rule) for c in ev.claims]
    assert ev.baseline["no_information"] == pytest.approx(-np.log(OUT), abs=1e-12)
    # copying over the ids both vocabularies have, against float64 eigenvalues of the full
    # circuit W_E[:100] OV W_U (folded weights, as the claim reads them)
    from harness.mech.weights.scores import head_weights

    loaded = harness.load_model(narrow, device="cpu")
    hw = head_weights(loaded.bridge, "folded")
    W_E, W_U = hw.vocab(0, hw.vocab_span)
    assert W_E.shape[0] == 128 and W_U.shape[1] == OUT
    full = (W_E[:OUT] @ hw.W_V[1, 5] @ hw.W_O[1, 5] @ W_U).numpy()
    lam = np.linalg.eigvals(full)
    expected = float(lam.sum().real / np.abs(lam).sum())
    assert ev.claim("copies").value == pytest.approx(expected, abs=1e-9)
    assert tuple(loaded.bridge.W_U.shape) == (64, OUT)


def test_answers_outside_the_output_vocabulary_are_refused(tmp_path):
    narrow = fixture_copy(tmp_path, OUT, "narrow")
    with pytest.raises(SpecError) as err:
        harness.run(claims_file(tmp_path, narrow), device="cpu")
    text = str(err.value)
    assert f"outside the model's output vocabulary 0..{OUT - 1} (d_vocab_out {OUT})" in text
    assert f"set data.vocab_max: {OUT}" in text


def test_answers_outside_the_output_vocabulary_exit_2(tmp_path, capsys):
    from harness.cli import main

    narrow = fixture_copy(tmp_path, OUT, "narrow")
    assert main(["run", str(claims_file(tmp_path, narrow)), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "d_vocab_out" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "13"])
def test_bad_d_vocab_out_is_refused(tmp_path, value):
    bad = tmp_path / "bad"
    shutil.copytree(FIXTURE, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["d_vocab_out"] = value
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="d_vocab_out: must be -1"):
        harness.load_model(bad, device="cpu")


def test_output_width_must_match_the_weights(tmp_path):
    """A config whose d_vocab_out disagrees with the stored unembedding is refused at load."""
    narrow = fixture_copy(tmp_path, OUT, "narrow")
    cfg = json.loads((narrow / "config.json").read_text())
    cfg["d_vocab_out"] = 90
    (narrow / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unembed"):
        harness.load_model(narrow, device="cpu")
