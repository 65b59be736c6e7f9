"""Model sources beyond a tokenized directory (issue 25, loading): Hugging Face directories
without tokenizer files, GPT-NeoX's renamed checkpoint keys, hub names resolved in a local
cache built here in the hub's own layout (offline), a TransformerBridge the caller holds,
and bfloat16/float16 weights used in float32 with both dtypes recorded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import harness
from harness.cli import main
from harness.errors import DataError, ModelLoadError, SpecError, UserError
from harness.evidence import document
from harness.model import hub_cache
from harness.model.loaded import BRIDGE_HASH_PREFIX, bridge_hash, from_bridge
from harness.model.loading import directory_hash
from harness.model.ref import ModelRef, load_model
from harness.model.tokenizer import model_tokenizer

from .conftest import boot_random_native, save_native, tiny_config
from .documents import hypothesis as hypothesis_doc

transformers = pytest.importorskip("transformers")
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

REVISION = "0123456789abcdef0123456789abcdef01234567"
TOKENS = torch.tensor([[1, 5, 7, 9, 11, 3, 5, 7]])


def tiny_hf(arch: str):
    """A tiny random Hugging Face causal LM of `arch` (seeded)."""
    T = transformers
    torch.manual_seed(0)
    small = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 64}
    if arch == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**small, num_key_value_heads=2))
    if arch == "neox":
        return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**small))
    if arch == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(**small, num_key_value_heads=2))
    if arch == "gemma2":
        return T.Gemma2ForCausalLM(T.Gemma2Config(**small, num_key_value_heads=2, head_dim=8))
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4))


def word_tokenizer():
    """A word-level tokenizer over t0 … t99, built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({f"t{i}": i for i in range(100)}, unk_token="t0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="t1", eos_token="t2", unk_token="t0")


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """{arch: (directory without tokenizer files, the same with a tokenizer)} for five architectures."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for arch in ("llama", "neox", "qwen2", "gemma2", "gpt2"):
        bare, tok = root / arch, root / f"{arch}-tok"
        tiny_hf(arch).save_pretrained(bare)
        shutil.copytree(bare, tok)
        word_tokenizer().save_pretrained(tok)
        out[arch] = (bare, tok)
    return out


def make_cache(cache: Path, name: str, src: Path, revision: str = REVISION) -> Path:
    """`src`'s files as the hub client caches them: blobs/<sha256>, snapshots/<revision>/<file>
    symlinked to ../../blobs/<sha256>, refs/main holding the revision.  Returns the snapshot."""
    repo = cache / ("models--" + name.replace("/", "--"))
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / sha).write_bytes(data)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / sha)
    (repo / "refs" / "main").write_text(revision)
    return snap


def logits(m) -> torch.Tensor:
    with torch.no_grad():
        return m.bridge(TOKENS)


def one_error(capsys, argv: list) -> str:
    """Run the CLI in-process: exit 2, exactly one `error:` line on stderr (besides the stage
    lines, which start with a clock), no traceback."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def hypothesis(model: str, data: dict | None = None, head: str = "L1H0") -> dict:
    claims = [{"id": "r", "kind": "role", "head": head, "role": "previous_token", "at_least": 0.0},
              {"id": "a", "kind": "ablation", "heads": ["L0H1"], "ablation": "zero", "at_least": -10.0}]
    return hypothesis_doc(model, claims, name="src", stats={"bootstrap": 200, "permutations": 200},
                          data=data or {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 5})


# ---------------------------------------------------------------- 1. no tokenizer files


@pytest.mark.parametrize("arch", ["llama", "neox", "qwen2", "gemma2", "gpt2"])
def test_directory_without_tokenizer_is_the_bridge_boot_transformers_builds(hf_dirs, arch):
    """Loaded without asking TransformerLens for a tokenizer, the bridge has boot_transformers's
    hooks and numbers (boot_transformers itself needs the tokenizer files)."""
    bare, tok = hf_dirs[arch]
    m = load_model(bare, device="cpu")
    assert m.kind == "transformers" and m.bridge.tokenizer is None and model_tokenizer(m) is None
    assert m.sha256 == directory_hash(bare) == directory_hash(tok)  # tokenizer files are not hashed
    ref = TransformerBridge.boot_transformers(str(tok), device="cpu")
    ref.eval()
    assert sorted(m.bridge.hook_dict) == sorted(ref.hook_dict)
    with torch.no_grad():
        out, cache = m.bridge.run_with_cache(TOKENS)
        want, ref_cache = ref.run_with_cache(TOKENS)
    assert torch.allclose(out, want, atol=1e-6, rtol=0)
    assert set(cache.keys()) == set(ref_cache.keys())
    for k in ref_cache.keys():
        assert torch.allclose(cache[k], ref_cache[k], atol=1e-6, rtol=0), k
    hf = transformers.AutoModelForCausalLM.from_pretrained(bare, attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.allclose(out, hf(TOKENS).logits, atol=1e-5, rtol=0)


def test_directory_with_tokenizer_files_keeps_its_tokenizer(hf_dirs):
    m = load_model(hf_dirs["llama"][1], device="cpu")
    tok = model_tokenizer(m)
    assert tok is not None and tok.encode(["t5 t7"]) == [[5, 7]] and tok.bos == 1


def test_token_ids_run_and_text_data_is_refused_in_one_line(hf_dirs, tmp_path, capsys):
    bare, _ = hf_dirs["llama"]
    ev = harness.run(hypothesis(str(bare)), device="cpu", figures=False)
    assert ev.model["kind"] == "transformers" and [c.id for c in ev.claims] == ["r", "a"]
    prompts = {"prompts": [{"text": "t5 t6 t7", "corrupted": "t8 t6 t7", "answer": " t9"},
                           {"text": "t6 t5 t7", "corrupted": "t8 t5 t7", "answer": " t9"}]}
    with pytest.raises(DataError) as exc:
        harness.run(hypothesis(str(bare), prompts), device="cpu", figures=False)
    text = str(exc.value)
    assert "\n" not in text
    assert (f"data.prompts: text data needs a tokenizer, and the model {bare} has none (the model directory has no "
            "tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model, ...), which text data needs: "
            "write them beside config.json with tokenizer.save_pretrained(DIR)): give token ids") in text
    f = tmp_path / "h.yaml"
    f.write_text(json.dumps(hypothesis(str(bare), prompts)))
    err = one_error(capsys, ["run", f, "--reports", tmp_path / "reports", "--device", "cpu"])
    assert f"the model {bare} has none (the model directory has no tokenizer files" in err


# ---------------------------------------------------------------- 2. GPT-NeoX renamed keys


def test_gpt_neox_checkpoint_keys_are_compared_as_transformers_loads_them(hf_dirs, tmp_path):
    """GPT-NeoX stores its unembedding as embed_out.weight; transformers loads it as lm_head.weight.
    Every check still holds, under the names transformers loads."""
    bare, _ = hf_dirs["neox"]
    state = load_file(str(bare / "model.safetensors"))
    assert "embed_out.weight" in state and "lm_head.weight" not in state
    m = load_model(bare, device="cpu")
    hf = transformers.GPTNeoXForCausalLM.from_pretrained(bare, attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.allclose(logits(m), hf(TOKENS).logits, atol=1e-5, rtol=0)

    def broken(name: str, tensors: dict) -> Path:
        d = Path(shutil.copytree(bare, tmp_path / name))
        save_file(tensors, str(d / "model.safetensors"))
        return d

    out = broken("missing", {k: v for k, v in state.items() if k != "embed_out.weight"})
    with pytest.raises(ModelLoadError, match=r"\(gpt_neox\): 1 parameter\(s\) missing, e.g. lm_head.weight$"):
        load_model(out, device="cpu")
    out = broken("shape", {**state, "embed_out.weight": torch.zeros(99, 32)})
    with pytest.raises(ModelLoadError, match=r"model.safetensors does not match config.json \(gpt_neox\): tensor "
                                             r"embed_out.weight has shape \[99, 32\], the config implies \[100, 32\]"):
        load_model(out, device="cpu")
    out = broken("both", {**state, "lm_head.weight": state["embed_out.weight"].clone()})
    with pytest.raises(ModelLoadError, match=r"tensors (embed_out|lm_head).weight and (embed_out|lm_head).weight "
                                             r"are both loaded as lm_head.weight"):
        load_model(out, device="cpu")


# ---------------------------------------------------------------- 3. hub names from the local cache


@pytest.fixture
def cache(tmp_path, monkeypatch, hf_dirs):
    """HF_HUB_CACHE pointing at a cache holding local/tiny-llama (with tokenizer files)
    and local/bare-neox (without)."""
    root = tmp_path / "hub-cache"
    make_cache(root, "local/tiny-llama", hf_dirs["llama"][1])
    make_cache(root, "local/bare-neox", hf_dirs["neox"][0], "f" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return root


def test_cache_folder_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "b"))
    assert hub_cache.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("HF_HUB_CACHE")
    assert hub_cache.cache_dir() == tmp_path / "b" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache.cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"


def test_hub_name_loads_from_the_cache_offline(cache, hf_dirs, monkeypatch):
    """The snapshot is loaded like the directory it came from (same hash, same numbers), with
    its tokenizer, and nothing opens a network connection."""
    import huggingface_hub.constants as hub_constants

    def no_network(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    flag = hub_constants.HF_HUB_OFFLINE
    src = hf_dirs["llama"][1]
    for name in ("local/tiny-llama", "hf:local/tiny-llama"):
        m = load_model(name, device="cpu")
        assert (m.source, m.kind, m.revision) == ("hf:local/tiny-llama", "transformers", REVISION)
        assert m.sha256 == directory_hash(src)
        assert model_tokenizer(m) is not None
    direct = load_model(src, device="cpu")
    assert torch.equal(logits(m), logits(direct))
    bare = load_model("local/bare-neox", device="cpu")  # no tokenizer files in the snapshot either
    assert bare.bridge.tokenizer is None and bare.revision == "f" * 40
    assert hub_constants.HF_HUB_OFFLINE == flag and "HF_HUB_OFFLINE" not in os.environ


def test_hub_name_in_a_hypothesis_file(cache, hf_dirs, tmp_path, capsys):
    """`model: ORG/NAME` runs on the cached snapshot; the evidence records the hub name and
    revision; `harness validate` checks names against the cached config.json."""
    f = tmp_path / "h.yaml"
    f.write_text(json.dumps(hypothesis("local/tiny-llama", head="L5H0")))
    err = one_error(capsys, ["validate", f])
    assert "claims[0].head: L5H0 is not in the model: the model has layers 0..1 and heads 0..3" in err
    f.write_text(json.dumps(hypothesis("local/tiny-llama")))
    ev = harness.run(f, device="cpu", figures=False)
    assert ev.model["source"] == "hf:local/tiny-llama" and ev.model["revision"] == REVISION
    assert ev.model["sha256"] == directory_hash(hf_dirs["llama"][1])
    assert ev.model["dtype"] == ev.model["stored_dtype"] == "float32"
    doc = json.loads(document.to_json(ev.to_dict()))
    assert document.json_schema_problems(doc, document.schema()) == []
    same = harness.run(tmp_path / "h.yaml", device="cpu", figures=False, model="hf:local/tiny-llama")
    assert [c.value for c in same.claims] == [c.value for c in ev.claims]


def test_validate_reads_the_cached_config_without_torch(cache, tmp_path):
    f = tmp_path / "h.yaml"
    f.write_text(json.dumps(hypothesis("local/tiny-llama", head="L5H0")))
    script = ("import sys\nfrom harness.cli import main\ncode = main(['validate', sys.argv[1]])\n"
              "print(code, sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script, str(f)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_CACHE": str(cache)})
    assert out.stdout.strip() == "2 []", out.stdout + out.stderr
    assert "L5H0 is not in the model" in out.stderr


def test_an_existing_directory_wins_over_a_hub_name(cache, hf_dirs, tmp_path, monkeypatch):
    local = tmp_path / "work" / "local" / "tiny-llama"
    shutil.copytree(hf_dirs["neox"][0], local)
    base = tmp_path / "work"
    assert ModelRef.parse("local/tiny-llama", base).source == str(base / "local" / "tiny-llama")
    assert ModelRef.parse("hf:local/tiny-llama", base).source == "hf:local/tiny-llama"
    assert ModelRef.parse("local/other", base).source == "hf:local/other"
    assert ModelRef.parse("./local/other", base).source == str(base / "local" / "other")
    monkeypatch.chdir(base)
    assert load_model("local/tiny-llama", device="cpu").sha256 == directory_hash(hf_dirs["neox"][0])
    assert load_model("hf:local/tiny-llama", device="cpu").sha256 == directory_hash(hf_dirs["llama"][1])
    with pytest.raises(ModelLoadError, match="model directory .*local/other does not exist"):
        load_model("./local/other", device="cpu")
    f = base / "h.yaml"  # in a hypothesis file, relative to the file's folder
    f.write_text(json.dumps(hypothesis("local/tiny-llama")))
    monkeypatch.chdir(tmp_path)
    assert harness.run(f, device="cpu", figures=False).model["sha256"] == directory_hash(hf_dirs["neox"][0])


def test_hub_errors_are_one_line(cache, hf_dirs, tmp_path, capsys, monkeypatch):
    with pytest.raises(ModelLoadError) as exc:
        load_model("local/missing", device="cpu")
    text = str(exc.value)
    assert "\n" not in text and text.startswith("Hugging Face model 'local/missing' is not in the local cache: "
                                                f"{cache / 'models--local--missing'} does not exist")
    assert "run `huggingface-cli download local/missing`" in text and f"into {cache}" in text
    f = tmp_path / "h.yaml"
    f.write_text(json.dumps(hypothesis("local/missing")))
    assert "error: Hugging Face model 'local/missing' is not in the local cache" in one_error(
        capsys, ["run", f, "--reports", tmp_path / "reports", "--device", "cpu"])
    with pytest.raises(ModelLoadError, match=r"^hf:a/b/c: not a Hugging Face model name"):
        load_model("hf:a/b/c", device="cpu")

    repo = cache / "models--local--tiny-llama"
    (repo / "refs" / "main").write_text("nope nope")
    with pytest.raises(ModelLoadError, match=r"refs/main: expected a 40-character commit hash, got 'nope nope'"):
        load_model("local/tiny-llama", device="cpu")
    (repo / "refs" / "main").write_text("e" * 40)
    with pytest.raises(ModelLoadError, match=f"snapshots/{'e' * 40}: missing: refs/main names revision"):
        load_model("local/tiny-llama", device="cpu")
    (repo / "refs" / "main").unlink()
    with pytest.raises(ModelLoadError, match=r"refs/main: missing: the cache holds 'local/tiny-llama' but no "
                                             r"revision 'main'"):
        load_model("local/tiny-llama", device="cpu")
    (repo / "refs" / "main").write_text(REVISION)

    # a symlink may lead into the repository's blobs, not out of its cache folder
    snap = repo / "snapshots" / REVISION
    outside = tmp_path / "elsewhere.json"
    outside.write_text((snap / "config.json").read_text())
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(outside)
    with pytest.raises(ModelLoadError, match=r"config.json: a symlink to a file outside the cache folder "):
        load_model("local/tiny-llama", device="cpu")


def test_pickles_in_a_snapshot_are_never_read(cache, hf_dirs, tmp_path):
    """The hub client downloads every file of a repository; a pytorch_model.bin beside
    model.safetensors is ignored (here it is not even a pickle), and one alone is refused."""
    snap = cache / "models--local--bare-neox" / "snapshots" / ("f" * 40)
    (snap / "pytorch_model.bin").write_bytes(b"not a pickle: reading it would fail")
    m = load_model("local/bare-neox", device="cpu")
    assert m.sha256 == directory_hash(hf_dirs["neox"][0])
    (snap / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"has no model.safetensors or model.safetensors.index.json, and pickle "
                                             r"weights \(pytorch_model.bin\) are not loaded"):
        load_model("local/bare-neox", device="cpu")


# ---------------------------------------------------------------- 4. a bridge the caller holds


@pytest.fixture(scope="module")
def native_bridge():
    return boot_random_native(tiny_config(), seed=3)


def test_run_takes_a_bridge_without_reloading_it(native_bridge, tmp_path):
    path = save_native(native_bridge, tiny_config(), tmp_path / "m")
    doc = hypothesis(str(path))
    held = from_bridge(native_bridge)
    assert held.bridge is native_bridge and held.kind == "bridge"
    assert held.source == "TransformerBridge (TransformerLensNative)"
    ev = harness.run(doc, device="cpu", figures=False, model=native_bridge)
    as64 = harness.run(doc, device="cpu", figures=False, model=load_model(path, dtype=torch.float64, device="cpu"))
    assert [c.value for c in ev.claims] == [c.value for c in as64.claims]
    loaded = harness.run(doc, device="cpu", figures=False, model=str(path))  # float64 file, used as float32
    assert ev.model["kind"] == "bridge" and ev.model["source"] == "TransformerBridge (TransformerLensNative)"
    assert ev.model["sha256"] == bridge_hash(native_bridge) and ev.model["sha256"].startswith(BRIDGE_HASH_PREFIX)
    assert ev.model["dtype"] == "float64" and "stored_dtype" not in ev.model and "revision" not in ev.model
    assert (loaded.model["kind"], loaded.model["dtype"], loaded.model["stored_dtype"]) == ("native", "float32",
                                                                                           "float64")
    assert document.json_schema_problems(json.loads(document.to_json(ev.to_dict())), document.schema()) == []


def test_bridge_hash_covers_every_tensor(native_bridge):
    twin = boot_random_native(tiny_config(), seed=3)
    assert bridge_hash(twin) == bridge_hash(native_bridge)
    with torch.no_grad():
        p = next(iter(twin.original_model.parameters()))
        p.view(-1)[0] += 1e-12
    assert bridge_hash(twin) != bridge_hash(native_bridge)
    as32 = boot_random_native(tiny_config(), seed=3).to(torch.float32)
    assert bridge_hash(as32) != bridge_hash(native_bridge)  # the dtype is part of what is hashed


def test_a_held_bridge_is_checked_like_a_loaded_model(native_bridge, hf_dirs):
    bad = boot_random_native(tiny_config(), seed=3)
    with torch.no_grad():
        dict(bad.named_parameters())[next(n for n, _ in bad.named_parameters() if "q" in n)].view(-1)[0] = float("nan")
    with pytest.raises(ModelLoadError, match=r"^TransformerBridge \(TransformerLensNative\): tensor .* has 1 NaN/inf "
                                             r"value \(of \d+\); a model with non-finite weights"):
        harness.run(hypothesis("unused"), device="cpu", model=bad)
    with pytest.raises(ModelLoadError, match=r"^model: expected a model directory, a hub name .* got int$"):
        harness.run(hypothesis("unused"), device="cpu", model=42)
    with pytest.raises(SpecError, match=r"claims\[0\] \(id: r\): head: L5H0 is not in the model"):
        harness.run(hypothesis("unused", head="L5H0"), device="cpu", model=native_bridge)
    prompts = {"prompts": [{"text": "t5 t6", "corrupted": "t8 t6", "answer": " t9"}] * 2}
    with pytest.raises(DataError, match=r"^data.prompts: text data needs a tokenizer, and the model TransformerBridge "
                                        r"\(TransformerLensNative\) has none \(boot the bridge with one, "):
        harness.run(hypothesis("unused", prompts), device="cpu", model=native_bridge)
    booted = TransformerBridge.boot_transformers(str(hf_dirs["llama"][1]), device="cpu")
    held = from_bridge(booted)
    assert held.source == "TransformerBridge (LlamaForCausalLM)" and model_tokenizer(held) is not None


# ---------------------------------------------------------------- 5. bfloat16 / float16 weights


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_half_precision_native_weights_load_as_float32(tmp_path, stored):
    cfg = tiny_config()
    bridge = boot_random_native(cfg, seed=4)
    half = {k: v.detach().to(stored).contiguous() for k, v in bridge.state_dict().items()}
    (tmp_path / "m").mkdir()
    save_file(half, str(tmp_path / "m" / "model.safetensors"))
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    m = load_model(tmp_path / "m", device="cpu")
    name = str(stored).removeprefix("torch.")
    assert (m.dtype, m.stored_dtype) == ("float32", name)
    ref = boot_random_native(cfg, seed=4).to(torch.float32)
    ref.load_state_dict({k: v.to(torch.float32) for k, v in half.items()})
    with torch.no_grad():
        assert torch.allclose(m.bridge(TOKENS % 7), ref(TOKENS % 7), atol=1e-6, rtol=0)
    ev = harness.run(hypothesis(str(tmp_path / "m")), device="cpu", figures=False)
    assert (ev.model["dtype"], ev.model["stored_dtype"]) == ("float32", name)


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_half_precision_hf_weights_load_as_float32(tmp_path, stored):
    hf = tiny_hf("llama").to(stored)
    hf.save_pretrained(tmp_path / "m")
    m = load_model(tmp_path / "m", device="cpu")
    assert (m.dtype, m.stored_dtype) == ("float32", str(stored).removeprefix("torch."))
    assert all(p.dtype == torch.float32 for p in m.bridge.original_model.parameters())
    ref = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.allclose(logits(m), ref(TOKENS).logits, atol=1e-5, rtol=0)


def test_bfloat16_model_is_patched_within_its_own_precision(tmp_path, monkeypatch):
    """A model loaded in bfloat16 (the API's dtype): the hand attention the patches use passes its
    check at bfloat16's tolerance, which the float32 bound would have refused (the check is not
    vacuous), and a misread architecture is still refused (the bound is not too loose)."""
    from dataclasses import replace

    from harness.errors import UnsupportedError
    from harness.mech.block import attention, fidelity
    from harness.model import architecture
    from harness.model.devices import wide
    from harness.spec import names

    hf = tiny_hf("qwen2")
    with torch.no_grad():  # sharper attention than the random init's (nearly uniform: any scale would pass)
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(20)
            layer.self_attn.k_proj.weight.mul_(20)
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "m")
    m = load_model(tmp_path / "m", dtype=torch.bfloat16, device="cpu")
    assert m.dtype == "bfloat16"
    hooks = {names.hook_resid_pre(1), names.hook_z(1)}
    tokens = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(tokens, names_filter=lambda n: n in hooks)
    cache = dict(cache.items())
    assert cache[names.hook_z(1)].dtype == torch.bfloat16
    attention.check(m.bridge, cache, 1)  # no UnsupportedError
    resid = wide(cache[names.hook_resid_pre(1)])
    z = attention.head_z(m.bridge, names.Head(1, 0), dict.fromkeys("qkv", resid))
    ref = wide(cache[names.hook_z(1)][:, :, 0])
    bound = float((z - ref).abs().max()) / (1 + float(ref.abs().max()))
    assert fidelity.tolerance(torch.float32) < bound < fidelity.tolerance(torch.bfloat16)
    arch = architecture.of(m.bridge)
    monkeypatch.setitem(architecture._KNOWN, m.bridge, replace(arch, scales=tuple(s * 2 for s in arch.scales)))
    monkeypatch.setattr(attention, "_CHECKED", type(attention._CHECKED)())
    with pytest.raises(UnsupportedError, match="recomputed by hand differs"):
        attention.check(m.bridge, cache, 1)


def test_sweep_models_take_hub_names(cache, hf_dirs, tmp_path, monkeypatch):
    """`harness sweep --models` parses its arguments as `model:` does: `ORG/NAME` is the cached hub
    model (labelled as written), a directory that exists wins."""
    from harness.sweep.models import expand

    monkeypatch.chdir(tmp_path)
    models = expand(["local/tiny-llama", "hf:local/bare-neox", str(hf_dirs["neox"][0])])
    assert [m.source for m in models] == ["hf:local/tiny-llama", "hf:local/bare-neox",
                                          str(Path(hf_dirs["neox"][0]).resolve())]
    assert models[0].label == "hf:local/tiny-llama"
    with pytest.raises(UserError, match="--models no-such-dir/: no such directory"):
        expand(["no-such-dir/"])
