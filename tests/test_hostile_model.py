"""Hostile and broken model directories: pickles and weights the hash does not
cover, non-finite weights and outputs, configs with absurd values, truncated or
wrong-shape safetensors, files that are not UTF-8 or cannot be read.  Every case
is a one-line error naming the file (exit 2, no traceback) raised before
anything large is allocated, or, for outputs that become non-finite while
running, a failed sanity check (exit 3).  One test (or parametrised test) per
group; the directories are copies of fixtures/induction-2l or a tiny GPT-2
written with save_pretrained.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.cli import main
from harness.engine import sanity
from harness.errors import ModelLoadError, SanityCheckError, UserError
from harness.model import files, tensors
from harness.model.loading import directory_hash
from harness.model.ref import load_model
from harness.spec.settings import Stats
from harness.sweep import models as sweep_models

from .conftest import FIXTURE

transformers = pytest.importorskip("transformers")


# ---------------------------------------------------------------- helpers


def one_error(capsys, argv: list, *needles: str) -> str:
    """Run the CLI in-process: exit 2, one line on stderr holding every needle, no traceback."""
    capsys.readouterr()  # drop what earlier steps printed (transformers' progress bars)
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert str(n) in err, err
    return err


def load_error(capsys, path: Path, *needles: str) -> str:
    """`harness weights PATH` fails as bad input naming the file (and whatever else is asked)."""
    return one_error(capsys, ["weights", path, "--draws", "99", "--device", "cpu"], *needles)


def native(tmp_path: Path, name: str = "m") -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / name))


def edit_config(p: Path, **over) -> None:
    cfg = json.loads((p / "config.json").read_text())
    cfg.update(over)
    (p / "config.json").write_text(json.dumps(cfg))


def edit_tensors(f: Path, fn) -> None:
    """Rewrite safetensors file `f` with fn(state) applied (fn edits the dict in place)."""
    state = load_file(str(f))
    fn(state)
    save_file(state, str(f))


def content_hash(folder: Path, names: list[str]) -> str:
    """The documented content hash, computed independently: sha256 over (name, bytes) in name order."""
    h = hashlib.sha256()
    for n in sorted(names):
        h.update(n.encode())
        h.update((folder / n).read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def gpt2_source(tmp_path_factory):
    """A tiny GPT-2 (vocab 40, 2 layers, 4 heads of 4) saved with save_pretrained, and the model itself."""
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    out = tmp_path_factory.mktemp("hf") / "gpt2-tiny"
    hf.save_pretrained(out)
    return out, hf


@pytest.fixture
def gpt2(tmp_path, gpt2_source):
    """A fresh copy of the tiny GPT-2 directory for one test to break."""
    return Path(shutil.copytree(gpt2_source[0], tmp_path / "gpt2"))


def wte(bridge) -> torch.Tensor:
    """The token embedding transformers loaded into a bridge."""
    return bridge.original_model.get_input_embeddings().weight.detach()


# ------------------------------- 2. safetensors only; the hash covers what was loaded


def test_pickle_weights_are_refused_and_only_safetensors_are_loaded_and_hashed(tmp_path, capsys, gpt2):
    real = load_file(str(gpt2 / "model.safetensors"))
    zeros = {k: torch.zeros_like(v) for k, v in real.items()}

    # other.safetensors + pytorch_model.bin of zeros: transformers would load the zeros
    d = Path(shutil.copytree(gpt2, tmp_path / "bin"))
    (d / "model.safetensors").rename(d / "other.safetensors")
    torch.save(zeros, d / "pytorch_model.bin")
    load_error(capsys, d, f"{d / 'pytorch_model.bin'}: pickle weights are not loaded", "convert them to safetensors")

    # a malicious pickle is never unpickled: refused before anything reads it, no traceback
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    d = Path(shutil.copytree(gpt2, tmp_path / "evil"))
    (d / "training_args.bin").write_bytes(pickle.dumps(Evil()))
    load_error(capsys, d, f"{d / 'training_args.bin'}: pickle weights are not loaded")
    assert not marker.exists()
    for suffix in (".pt", ".pth", ".ckpt", ".pkl"):  # the rule holds for native directories too
        n = native(tmp_path, "native" + suffix)
        (n / ("optimizer" + suffix)).write_bytes(b"\x80\x04N.")
        load_error(capsys, n, f"{n / ('optimizer' + suffix)}: pickle weights are not loaded")

    # model.safetensors beside a stray other.safetensors of zeros: model.safetensors is loaded
    # and hashed, the stray file neither
    d = Path(shutil.copytree(gpt2, tmp_path / "stray"))
    save_file(zeros, str(d / "other.safetensors"))
    m = load_model(d, device="cpu")
    assert torch.equal(wte(m.bridge), real["transformer.wte.weight"])
    assert m.sha256 == directory_hash(d) == content_hash(d, ["config.json", "model.safetensors"])
    save_file(real, str(d / "other.safetensors"))
    assert directory_hash(d) == m.sha256

    # only other.safetensors: not loaded, said so
    (d / "model.safetensors").unlink()
    load_error(capsys, d, f"{d} has no model.safetensors or model.safetensors.index.json",
               "other.safetensors is not loaded")

    # config.json asking transformers for another file
    d = Path(shutil.copytree(gpt2, tmp_path / "asks"))
    edit_config(d, transformers_weights="other.safetensors")
    load_error(capsys, d, f"{d / 'config.json'}: transformers_weights: harness loads model.safetensors")

    # a torch.distributed shard makes transformers load every *.safetensors: refused
    d = Path(shutil.copytree(gpt2, tmp_path / "dcp"))
    save_file(zeros, str(d / "shard-00000-model-00001-of-00001.safetensors"))
    load_error(capsys, d, "shard-00000-model-00001-of-00001.safetensors: a torch.distributed checkpoint shard")


@pytest.mark.slow
def test_hub_models_load_safetensors_only(tmp_path, capsys, monkeypatch, gpt2):
    """hf:NAME (from the local cache): transformers is made to use safetensors (a hub model
    with only pytorch_model.bin is refused; beside model.safetensors the .bin is ignored),
    and the hash covers the snapshot's files loaded, as for a directory."""
    revision = "a" * 40
    snapshot = tmp_path / "cache" / "models--local--tiny" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (tmp_path / "cache" / "models--local--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--local--tiny" / "refs" / "main").write_text(revision)
    shutil.copy(gpt2 / "config.json", snapshot)
    real = load_file(str(gpt2 / "model.safetensors"))
    torch.save({k: torch.zeros_like(v) for k, v in real.items()}, snapshot / "pytorch_model.bin")
    script = (
        "import shutil, sys\n"
        "from harness.errors import ModelLoadError\n"
        "from harness.model.ref import load_model\n"
        "try:\n"
        "    load_model('hf:local/tiny', device='cpu')\n"
        "    print('LOADED')\n"
        "except ModelLoadError as exc:\n"
        "    print('ERROR', exc)\n"
        "shutil.copy(sys.argv[1], sys.argv[2])\n"
        "m = load_model('hf:local/tiny', device='cpu')\n"
        "print('SUM', float(m.bridge.original_model.get_input_embeddings().weight.abs().sum()), m.sha256)\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script, str(gpt2 / "model.safetensors"), str(snapshot)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"ERROR {snapshot} has no model.safetensors or model.safetensors.index.json"), lines
    assert "pickle weights (pytorch_model.bin) are not loaded" in lines[0]
    _, total, sha = lines[1].split()
    assert float(total) == pytest.approx(float(real["transformer.wte.weight"].abs().sum()), rel=1e-6)
    assert sha == directory_hash(gpt2)

    # hf:NAME where NAME is also a local folder: the hub's cache is searched, never the folder
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    one_error(capsys, ["weights", "hf:gpt2", "--device", "cpu"],
              "Hugging Face model 'gpt2' is not in the local cache")


def test_an_index_names_exactly_the_files_loaded_and_hashed(tmp_path, capsys, gpt2):
    real = load_file(str(gpt2 / "model.safetensors"))
    doubled = {k: 2 * v for k, v in real.items()}

    def sharded(name: str, shard: str) -> Path:
        d = Path(shutil.copytree(gpt2, tmp_path / name))
        (d / "model.safetensors").unlink()
        index = {"metadata": {"total_size": 0}, "weight_map": dict.fromkeys(real, shard)}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        return d

    # the index points into a sub-folder; a stray top-level shard of other weights is ignored
    d = sharded("ok", "sub/real.safetensors")
    (d / "sub").mkdir()
    save_file(doubled, str(d / "sub" / "real.safetensors"))
    save_file(real, str(d / "model-00001-of-00001.safetensors"))
    m = load_model(d, device="cpu")
    assert torch.equal(wte(m.bridge), doubled["transformer.wte.weight"])
    files = ["config.json", "model.safetensors.index.json", "sub/real.safetensors"]
    assert m.sha256 == directory_hash(d) == content_hash(d, files)
    (d / "model-00001-of-00001.safetensors").unlink()
    assert directory_hash(d) == m.sha256
    save_file(real, str(d / "sub" / "real.safetensors"))
    assert directory_hash(d) != m.sha256

    outside = tmp_path / "outside.safetensors"
    save_file(doubled, str(outside))
    for i, shard in enumerate(["../outside.safetensors", str(outside), "sub/../../outside.safetensors"]):
        d = sharded(f"escape{i}", shard)
        load_error(capsys, d, f"{d / 'model.safetensors.index.json'}: weight_map: ", "outside the model directory")
    d = sharded("link", "link.safetensors")
    (d / "link.safetensors").symlink_to(outside)
    load_error(capsys, d, "'link.safetensors' is outside the model directory")
    d = sharded("absent", "missing.safetensors")
    load_error(capsys, d, "shard 'missing.safetensors' does not exist")
    d = sharded("pickled", "weights.bin.part")
    load_error(capsys, d, "'weights.bin.part' is not a .safetensors file")
    d = sharded("noindex", "x.safetensors")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    load_error(capsys, d, "model.safetensors.index.json: expected a JSON object with a non-empty 'weight_map'")


# ------------------------------------------------ 6. NaN/inf weights and outputs


def test_non_finite_weights_are_refused_at_load(tmp_path, capsys, gpt2):
    p = native(tmp_path)

    def twelve_nans(state):
        state["blocks.0.attn.q.weight"].view(-1)[:12] = float("nan")

    edit_tensors(p / "model.safetensors", twelve_nans)
    load_error(capsys, p, f"{p / 'model.safetensors'}: tensor blocks.0.attn.q.weight has 12 NaN/inf values")

    p = native(tmp_path, "all-nan")
    edit_tensors(p / "model.safetensors", lambda s: [t.fill_(float("nan")) for t in s.values()])
    load_error(capsys, p, f"{p / 'model.safetensors'}: tensor ", "NaN/inf values")

    # finite in float64, infinite once loaded as float32
    p = native(tmp_path, "overflow")
    edit_tensors(p / "model.safetensors", lambda s: s.update({k: v.double() for k, v in s.items()}))
    edit_tensors(p / "model.safetensors", lambda s: s["embed.weight"].view(-1).__setitem__(0, 1e300))
    with pytest.raises(ModelLoadError, match=r"tensor embed.weight has 1 NaN/inf value \(of 8192\) after "
                                             r"conversion to torch.float32"):
        load_model(p, dtype=torch.float32, device="cpu")

    edit_tensors(gpt2 / "model.safetensors", lambda s: s["transformer.h.1.attn.c_proj.weight"].__setitem__(
        (0, 0), float("inf")))
    load_error(capsys, gpt2, f"{gpt2 / 'model.safetensors'}: tensor transformer.h.1.attn.c_proj.weight has 1 "
                             "NaN/inf value")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_non_finite_entries_are_counted_in_every_float_dtype(dtype):
    """The count every loaded weight goes through: NaN, +inf and -inf each counted, wherever they sit
    (the finite tensor's fast path reads only its minimum and maximum)."""
    from harness.model.tensors import count_nonfinite

    t = torch.randn(64, 33, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert count_nonfinite(t) == 0 and count_nonfinite(t[:0]) == 0
    assert count_nonfinite(torch.arange(5)) == 0
    for where, bad in ((0, float("nan")), (1000, float("inf")), (2111, -float("inf"))):
        t.view(-1)[where] = bad
        assert count_nonfinite(t) == 1 + (where > 0) + (where > 1000)
    t.fill_(float("nan"))
    assert count_nonfinite(t) == t.numel()
    assert count_nonfinite(torch.tensor([1.0 + 0j, complex(float("nan"), 0)])) == 1


def test_non_finite_outputs_fail_every_sanity_check(tmp_path, capsys, monkeypatch):
    st = Stats()
    with pytest.raises(SanityCheckError, match="NaN or infinite on 1 of 3 prompts"):
        sanity.gap_check(np.array([1.0, np.nan, 1.0]), st, "nats")
    with pytest.raises(SanityCheckError, match="NaN or infinite on 3 of 3 prompts"):
        sanity.gap_check(np.full(3, np.inf), st, "nats")
    assert not sanity.gap_check(np.array([]), st, "nats").passed  # no mean: not passed
    assert sanity.gap_check(np.array([1.0, 2.0]), st, "nats").passed

    # the identity check: a NaN difference (or a NaN metric scale) never compares as within tolerance
    from harness.claims.base import FrozenPatternsPath

    monkeypatch.setattr(sanity.patching, "freeze_patterns_plan", lambda patterns: None)
    for patched, m_clean in [(np.array([1.0, np.nan]), np.array([1.0, 2.0])),
                             (np.array([1.0, 2.0]), np.array([1.0, np.nan])),
                             (np.array([1.0, np.inf]), np.array([1.0, 2.0]))]:
        runs = SimpleNamespace(bridge=None, ds=SimpleNamespace(clean=None, n=2), clean=None, patterns=lambda c: {},
                               run=lambda tokens, base, plan, patched=patched: patched, m_clean=m_clean,
                               m_corrupt=np.array([0.0, 0.0]))
        with pytest.raises(SanityCheckError, match="not finite"):
            sanity.identity_checks(runs, [FrozenPatternsPath()])

    # a model with finite weights whose logits overflow: the run stops (exit 3), no report
    monkeypatch.undo()
    p = native(tmp_path)
    edit_tensors(p / "model.safetensors", lambda s: [s[k].mul_(1e20) for k in ("ln_final.weight", "unembed.weight")])
    hyp = tmp_path / "h.yaml"
    hyp.write_text(f"harness: 1\nname: overflow\nmodel: {p}\n"
                   "data: {generator: repeated_tokens, n_prompts: 20, segment_length: 8}\n"
                   "claims:\n  - {id: knockout, kind: ablation, heads: [L0H7], ablation: zero, at_least: 0.5}\n")
    reports = tmp_path / "reports"
    code = main(["run", str(hyp), "--reports", str(reports), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "sanity check failed: the metric is NaN or infinite" in err and "Traceback" not in err
    assert not reports.exists() or not any(reports.iterdir())


# ------------------------------------------------------ 10. configs are checked


@pytest.mark.parametrize("over, needle", [
    ({"n_heads": 0}, "n_heads: must be a positive integer, got 0"),
    ({"d_model": -64}, "d_model: must be a positive integer, got -64"),
    ({"d_vocab": 1e11}, "d_vocab: must be a positive integer, got 100000000000.0"),
    ({"n_layers": True}, "n_layers: must be a positive integer, got True"),
    ({"d_vocab": 100_000_000_000}, "the config implies at least 12,800,000,069,632 weights, mostly embedding and "
                                   "unembedding (2 x d_vocab 100000000000 x d_model 64), but model.safetensors "
                                   "holds 87,424"),
    ({"n_ctx": 10**9}, "mostly positional embedding (n_ctx 1000000000 x d_model 64)"),
    ({"n_layers": 10**7}, "mostly attention (n_layers 10000000"),
    ({"attn_only": False, "d_mlp": 10**8}, "mostly MLPs (n_layers 2 x 2 x d_model 64 x d_mlp 100000000)"),
    ({"normalization_type": "BOGUS"}, "normalization_type: must be one of LN, LNPre, RMS, RMSPre (or null: none), "
                                      "got 'BOGUS'"),
    ({"act_fn": "tanh"}, "act_fn: must be one of gelu, gelu_new, relu, silu, swish, solu, solu_ln (or null), "
                         "got 'tanh'"),
    ({"positional_embedding_type": "rotary"}, "positional_embedding_type: must be 'standard'"),
    ({"attention_dir": "bidirectional"}, "attention_dir: must be 'causal'"),
    ({"n_key_value_heads": 2}, "n_key_value_heads: must be null"),
    ({"attn_scores_soft_cap": 30.0}, "attn_scores_soft_cap: not supported for native models"),
    ({"normalisation_type": "LN"}, "normalisation_type: unknown key (not a TransformerBridgeConfig field)"),
    ({"parallel_attn_mlp": True}, "parallel_attn_mlp: a TransformerBridgeConfig field the native loader does not "
                                  "support"),
])
def test_native_config_values_are_checked_before_booting(tmp_path, capsys, monkeypatch, over, needle):
    from transformer_lens.model_bridge import TransformerBridge

    def never(*a, **k):
        raise AssertionError("booted a model from a config that should have been refused")

    monkeypatch.setattr(TransformerBridge, "boot_native", never)
    p = native(tmp_path)
    edit_config(p, **over)
    load_error(capsys, p, f"{p / 'config.json'}: ", needle)


@pytest.mark.parametrize("over, edit, needle", [
    ({"d_model": 32}, None, "model.safetensors does not match config.json: tensor embed.weight has shape [128, 64], "
                            "the config implies [128, 32]"),
    ({}, lambda s: s.pop("blocks.1.ln1.bias"),
     "model.safetensors does not match config.json: missing tensor blocks.1.ln1.bias (shape [64])"),
    ({"n_layers": 1}, None,
     "model.safetensors does not match config.json: unexpected tensor blocks.1.attn.k.bias (and 9 more)"),
    ({}, lambda s: s.update({"blocks.0.attn.o.bias": torch.zeros(3)}),
     "model.safetensors does not match config.json: tensor blocks.0.attn.o.bias has shape [3], the config "
     "implies [64]"),
])
def test_native_tensors_must_match_the_config(tmp_path, capsys, over, edit, needle):
    p = native(tmp_path)
    edit_config(p, **over)
    if edit is not None:
        edit_tensors(p / "model.safetensors", edit)
    load_error(capsys, p, f"{p / 'model.safetensors'}", needle)


def test_loading_beyond_the_machines_memory_is_refused(tmp_path, capsys, monkeypatch, gpt2):
    monkeypatch.setattr(tensors, "physical_memory", lambda: 10_000)
    p = native(tmp_path)
    load_error(capsys, p, f"{p / 'config.json'}: loading needs about", "more than this machine's")
    load_error(capsys, gpt2, f"{gpt2 / 'config.json'}: loading needs about", "more than this machine's")


@pytest.mark.parametrize("over, needle", [
    ({"n_head": 0}, "config.json: n_head: must be a positive integer, got 0"),
    ({"n_embd": -16}, "config.json: n_embd: must be a positive integer, got -16"),
    ({"vocab_size": 1e11}, "config.json: vocab_size: must be a positive integer, got 100000000000.0"),
    ({"vocab_size": 100_000_000_000}, "model.safetensors does not match config.json (gpt2): tensor "
                                      "transformer.wte.weight has shape [40, 16], the config implies "
                                      "[100000000000, 16]"),
    ({"n_positions": 10**7}, "tensor transformer.wpe.weight has shape [16, 16], the config implies [10000000, 16]"),
    ({"n_head": 5}, "config.json: not a Hugging Face causal LM config: ValueError: `embed_dim` must be divisible"),
    ({"model_type": "bogus"}, "config.json: not a Hugging Face causal LM config"),
])
def test_hf_config_values_are_checked(tmp_path, capsys, gpt2, over, needle):
    edit_config(gpt2, **over)
    load_error(capsys, gpt2, needle)


def test_truncated_and_wrong_shape_safetensors_are_clear_errors(tmp_path, capsys, gpt2):
    p = native(tmp_path)
    data = (p / "model.safetensors").read_bytes()
    for cut in (4, 100, len(data) // 2, len(data) - 1):
        (p / "model.safetensors").write_bytes(data[:cut])
        load_error(capsys, p, f"{p / 'model.safetensors'}: cannot read: ")

    hf_data = (gpt2 / "model.safetensors").read_bytes()
    (gpt2 / "model.safetensors").write_bytes(hf_data[: len(hf_data) // 2])
    load_error(capsys, gpt2, f"{gpt2 / 'model.safetensors'}: cannot read: ")
    (gpt2 / "model.safetensors").write_bytes(hf_data)
    edit_tensors(gpt2 / "model.safetensors", lambda s: s.update({"transformer.wpe.weight": torch.zeros(8, 16)}))
    load_error(capsys, gpt2, f"{gpt2 / 'model.safetensors'} does not match config.json (gpt2): tensor "
                             "transformer.wpe.weight has shape [8, 16], the config implies [16, 16]")


def test_the_intact_models_still_load(gpt2_source, tmp_path):
    """The checks refuse nothing that is sound: the fixture and the tiny GPT-2 load, with the same numbers."""
    path, hf = gpt2_source
    m = load_model(path, device="cpu")
    toks = torch.tensor([[1, 2, 3, 1, 2, 3]])
    with torch.no_grad():
        assert torch.allclose(m.bridge(toks), hf(toks).logits, atol=1e-4)
    assert m.sha256 == content_hash(path, ["config.json", "model.safetensors"])
    f = load_model(FIXTURE, device="cpu")
    assert f.sha256 == content_hash(FIXTURE, ["config.json", "model.safetensors"])


# --------------------------------------------- 11. unreadable and non-UTF-8 files


def test_files_that_are_not_utf8_or_cannot_be_read(tmp_path, capsys, monkeypatch, gpt2):
    p = native(tmp_path)
    (p / "config.json").write_bytes(b'{"d_model": 64, "model_name": "caf\xe9"}')
    load_error(capsys, p, f"{p / 'config.json'}: not UTF-8 text (byte 0xe9 at offset 34)")

    monkeypatch.setattr(files, "MAX_TEXT_BYTES", 1000)  # a huge config.json is not read into memory
    (p / "config.json").write_text(json.dumps({"pad": "x" * 2000}))
    load_error(capsys, p, f"{p / 'config.json'}: 2,011 bytes, more than the 1,000")
    monkeypatch.undo()

    (gpt2 / "config.json").write_bytes(b"\xff\xfe{\x00}\x00")
    load_error(capsys, gpt2, f"{gpt2 / 'config.json'}: not UTF-8 text (byte 0xff at offset 0)")

    ckpt = native(tmp_path, "ckpt")
    (ckpt / "checkpoint.json").write_bytes(b'{"step": 3, "run": "\x80"}')
    with pytest.raises(UserError, match="checkpoint.json: not UTF-8 text"):
        sweep_models.read_checkpoint(ckpt)
    hyp = tmp_path / "h.yaml"
    hyp.write_text(f"harness: 1\nname: s\nmodel: {FIXTURE}\n"
                   "data: {generator: repeated_tokens, n_prompts: 20, segment_length: 8}\n"
                   "claims:\n  - {id: r, kind: role, head: L0H7, role: previous_token, at_least: 0.8}\n")
    one_error(capsys, ["sweep", hyp, "--models", ckpt, "--out", tmp_path / "out"],
              f"{ckpt / 'checkpoint.json'}: not UTF-8 text")
    assert not (tmp_path / "out").exists()

    # unreadable files (PermissionError), simulated so the test means something as root too
    real_read_bytes = Path.read_bytes

    def denied(self):
        if self.name in ("config.json", "checkpoint.json", "model.safetensors"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_bytes(self)

    p = native(tmp_path, "denied")
    (p / "checkpoint.json").write_text('{"step": 1}')
    monkeypatch.setattr(Path, "read_bytes", denied)
    load_error(capsys, p, f"{p / 'config.json'}: cannot read: Permission denied")
    with pytest.raises(UserError, match="checkpoint.json: cannot read: Permission denied"):
        sweep_models.read_checkpoint(p)
    monkeypatch.undo()

    if os.geteuid() != 0:  # a real unreadable file (root reads everything)
        p = native(tmp_path, "chmod")
        for name in ("config.json", "model.safetensors"):
            (p / name).chmod(0)
            try:
                load_error(capsys, p, f"{p / name}: cannot read")
            finally:
                (p / name).chmod(0o644)
