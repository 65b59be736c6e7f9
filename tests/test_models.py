"""Model loading: native fixture directories, local Hugging Face directories, errors."""

import json
import shutil

import pytest
import torch

from harness.errors import ModelLoadError
from harness.model.loading import directory_hash
from harness.model.ref import load_model

from .conftest import FIXTURE


def test_fixture_loads_as_native(fixture_model):
    m = fixture_model
    assert (m.kind, m.n_layers, m.n_heads, m.d_vocab, m.n_ctx) == ("native", 2, 8, 128, 64)
    assert not m.has_mlp
    assert m.sha256 == directory_hash(FIXTURE)
    logits = m.bridge(torch.zeros(1, 5, dtype=torch.long))
    assert logits.shape == (1, 5, 128)


def test_round_trip_native_directory(tiny_native):
    bridge, path = tiny_native
    loaded = load_model(path, dtype=torch.float64)
    toks = torch.tensor([[0, 3, 1, 4, 1, 5]])
    with torch.no_grad():
        assert torch.allclose(loaded.bridge(toks), bridge(toks), atol=1e-12)


def test_hf_gpt2_directory(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=4)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path / "gpt2-tiny")
    m = load_model(tmp_path / "gpt2-tiny")
    assert (m.kind, m.n_layers, m.n_heads) == ("transformers", 2, 4)
    toks = torch.tensor([[1, 2, 3, 1, 2, 3]])
    with torch.no_grad():
        assert torch.allclose(m.bridge(toks), hf(toks).logits, atol=1e-4)


def test_hf_loading_draws_no_progress_bar(tmp_path, capfd):
    """Loading a Hugging Face directory prints no "Loading weights" bar between the harness's
    stage lines, and leaves transformers' own progress-bar setting as it found it."""
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging

    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    capfd.readouterr()
    for enabled in (True, False):
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
        load_model(tmp_path / "m")
        assert "Loading weights" not in capfd.readouterr().err
        assert hf_logging.is_progress_bar_enabled() == enabled
    hf_logging.enable_progress_bar()


def test_hf_directory_with_wrong_weights_is_refused(tmp_path):
    """transformers would fill missing weights randomly; the loader must refuse."""
    p = shutil.copytree(FIXTURE, tmp_path / "m")
    cfg = json.loads((p / "config.json").read_text())
    (p / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ModelLoadError, match=r"weights do not match config.json \(gpt2\)"):
        load_model(p)


def test_hash_ignores_model_card(tmp_path):
    p = shutil.copytree(FIXTURE, tmp_path / "m")
    (p / "README.md").write_text("changed")
    (p / "training.json").write_text("{}")
    assert directory_hash(p) == directory_hash(FIXTURE)
    (p / "config.json").write_text((p / "config.json").read_text() + " ")
    assert directory_hash(p) != directory_hash(FIXTURE)


def copy_fixture(tmp_path):
    return shutil.copytree(FIXTURE, tmp_path / "m")


@pytest.mark.parametrize("breakage,needle", [
    (lambda p: shutil.rmtree(p), "does not exist"),
    (lambda p: (p / "config.json").unlink(), "has no config.json"),
    (lambda p: (p / "config.json").write_text("{\n  \"d_model\": 64,\n}"), r"config.json:3: not valid JSON"),
    (lambda p: (p / "config.json").write_text("[1, 2]"), "expected a JSON object"),
    (lambda p: (p / "model.safetensors").unlink(), "has no model.safetensors"),
    (lambda p: ((p / "model.safetensors").rename(p / "pytorch_model.bin")), "pickle weights"),
    (lambda p: (p / "model.safetensors").write_bytes(b"not a safetensors file"), "cannot read"),
    (lambda p: (p / "config.json").write_text(json.dumps({"d_model": 64, "n_layers": 2})),
     "missing TransformerBridgeConfig fields: d_head, n_ctx, n_heads, d_vocab"),
    (lambda p: (p / "config.json").write_text(json.dumps(
        {**json.loads((FIXTURE / "config.json").read_text()), "d_model": 32})), "does not match config.json"),
])
def test_malformed_model_directory(tmp_path, breakage, needle):
    p = copy_fixture(tmp_path)
    breakage(p)
    with pytest.raises(ModelLoadError, match=needle):
        load_model(p)


def test_path_that_is_a_file(tmp_path):
    f = tmp_path / "x"
    f.write_text("")
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model(f)
