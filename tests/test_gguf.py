"""GGUF files as a model source (model.gguf): a tiny Llama written here with the gguf package's
GGUFWriter (2 layers, d_model 64, 4 heads on 2 key/value heads, a byte-level BPE tokenizer of 264
tokens in its metadata, one tensor stored as Q8_0) loads through transformers' GGUF support, computes
what a float64 LlamaForCausalLM with the same weights computes, and records the file's hash and
quantisation; `harness validate` reads its shape without torch; each error is one line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import harness
from harness.cli import main
from harness.errors import ModelLoadError
from harness.evidence import document
from harness.model.ref import ModelRef, load_model
from harness.model.tokenizer import model_bos, model_tokenizer

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

D, HEADS, KV_HEADS, LAYERS, FF = 64, 4, 2, 2, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # as SmolLM2's: BOS <|im_start|>, id 1
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "a n"]
TOKENS = torch.tensor([[1, 5, 9, 100, 200, 7, 3, 250, 5, 9]])


def vocabulary() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return SPECIALS + sorted(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]


def llama_weights(vocab: int) -> dict[str, np.ndarray]:
    """Seeded random weights of a tiny LlamaForCausalLM, by its parameter names (norms around 1)."""
    g = np.random.default_rng(0)

    def r(*shape: int, around: float = 0.0) -> np.ndarray:
        return (around + 0.2 * g.standard_normal(shape)).astype(np.float32)

    w = {"model.embed_tokens.weight": r(vocab, D), "model.norm.weight": r(D, around=1), "lm_head.weight": r(vocab, D)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": r(D, around=1), p + "post_attention_layernorm.weight": r(D, around=1),
              p + "self_attn.q_proj.weight": r(D, D), p + "self_attn.k_proj.weight": r(KV_HEADS * D // HEADS, D),
              p + "self_attn.v_proj.weight": r(KV_HEADS * D // HEADS, D), p + "self_attn.o_proj.weight": r(D, D),
              p + "mlp.gate_proj.weight": r(FF, D), p + "mlp.up_proj.weight": r(FF, D),
              p + "mlp.down_proj.weight": r(D, FF)}
    return w


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows as llama.cpp's convert_hf_to_gguf.py writes them (pairs interleaved); transformers undoes it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, arch: str = "llama") -> dict[str, np.ndarray]:
    """The tiny Llama as a GGUF file; returns its weights as loaded (the Q8_0 tensor dequantised)."""
    toks = vocabulary()
    weights = llama_weights(len(toks))
    q8 = gguf.GGMLQuantizationType.Q8_0
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(D // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_vocab_size(len(toks))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(toks) - len(SPECIALS)))  # 3: control, 1: normal
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", weights["model.norm.weight"])
    w.add_tensor("output.weight", weights["lm_head.weight"])
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", weights[p + "input_layernorm.weight"])
        w.add_tensor(b + "ffn_norm.weight", weights[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", permute(weights[p + "self_attn.q_proj.weight"], HEADS))
        w.add_tensor(b + "attn_k.weight", permute(weights[p + "self_attn.k_proj.weight"], KV_HEADS))
        w.add_tensor(b + "attn_v.weight", weights[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", weights[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_gate.weight", weights[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", weights[p + "mlp.up_proj.weight"])
        down = weights[p + "mlp.down_proj.weight"]
        if i == 1:  # one quantised tensor: the model holds exactly its dequantised values
            packed = gguf.quants.quantize(down, q8)
            w.add_tensor(b + "ffn_down.weight", packed, raw_dtype=q8)
            weights[p + "mlp.down_proj.weight"] = gguf.quants.dequantize(packed, q8)
        else:
            w.add_tensor(b + "ffn_down.weight", down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """(the tiny Llama's .gguf file alone in its folder, its weights)."""
    folder = tmp_path_factory.mktemp("gguf") / "tiny"
    folder.mkdir()
    weights = write_gguf(folder / "tiny.Q8_0.gguf")
    return folder / "tiny.Q8_0.gguf", weights


@pytest.fixture(scope="module")
def loaded(tiny):
    return load_model(tiny[0].parent, device="cpu")  # the folder: its one .gguf file


def reference_logits(weights: dict[str, np.ndarray]) -> torch.Tensor:
    """A float64 LlamaForCausalLM holding `weights`: what the file's model computes."""
    T = transformers
    cfg = T.LlamaConfig(vocab_size=len(vocabulary()), hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64,
                        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    model = T.LlamaForCausalLM(cfg).to(torch.float64).eval()
    model.load_state_dict({k: torch.from_numpy(v).to(torch.float64) for k, v in weights.items()}, strict=True)
    with torch.no_grad():
        return model(TOKENS).logits


def one_error(capsys, argv: list) -> str:
    """The CLI in-process: exit 2, one `error:` line on stderr (besides the stage lines), no traceback."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert code == 2 and "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_gguf_file_loads_as_the_llama_its_weights_make(tiny, loaded):
    """Dequantised to float32 by transformers, un-permuted, wrapped as a bridge: the logits of a
    float64 Llama with the same weights, to float32 rounding; the Q8_0 tensor holds exactly its
    dequantised values; the file's sha256 and quantisation are recorded."""
    file, weights = tiny
    m = loaded
    assert (m.source, m.kind, m.dtype, m.stored_dtype) == (str(file.resolve()), "gguf", "float32", None)
    assert m.sha256 == hashlib.sha256(file.read_bytes()).hexdigest()
    assert m.quantization == {"tensor_types": "F32, Q8_0", "file_type": "Q8_0"}
    assert (m.n_layers, m.n_heads, m.d_vocab) == (LAYERS, HEADS, len(vocabulary()))
    hf = m.bridge.original_model
    assert getattr(hf.config, "quantization_config", None) is None and not getattr(hf, "is_quantized", False)
    assert all(p.dtype == torch.float32 for p in hf.parameters())
    assert torch.equal(hf.model.layers[1].mlp.down_proj.weight.detach(),
                       torch.from_numpy(weights["model.layers.1.mlp.down_proj.weight"]))
    with torch.no_grad():
        got = m.bridge(TOKENS).to(torch.float64)
    want = reference_logits(weights)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert gguf.GGUFReader.__name__ == "GGUFReader"  # the loader's speed-ups are undone


def test_the_tokenizer_comes_from_the_file(loaded):
    """The tokenizer the metadata describes, on the bridge; its BOS (<|im_start|>, id 1) starts the
    generator's prompts, as a Hugging Face directory's tokenizer's does."""
    tok = model_tokenizer(loaded)
    assert tok is not None and tok.bos == 1 and model_bos(loaded, "data") == 1
    vocab = tok.tokenizer.get_vocab()
    assert tok.encode([" the in"]) == [[vocab["Ġthe"], vocab["Ġ"], vocab["in"]]]  # the file's merges


def test_the_file_alone_is_read(tiny, tmp_path):
    """Named by its path, the file loads whatever lies beside it (a config.json and tokenizer files that are
    not valid JSON); its folder, holding config.json, is a Hugging Face directory instead."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    file = folder / "m.gguf"
    file.write_bytes(tiny[0].read_bytes())
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "adapter_config.json"):
        (folder / name).write_text("{not json")
    ref = ModelRef.parse("mixed/m.gguf", tmp_path)
    assert (ref.path, ref.kind(), ref.folder()) == (file, "gguf", None)
    assert ref.content_hash() == hashlib.sha256(file.read_bytes()).hexdigest()
    m = ref.load("cpu")
    assert m.source == str(file) and model_tokenizer(m) is not None
    assert ModelRef.parse(folder).path == folder
    with pytest.raises(ModelLoadError, match="config.json:1: not valid JSON"):
        ModelRef.parse(folder).load("cpu")


def test_shape_from_the_metadata_without_torch(tiny, tmp_path):
    """`harness validate` checks names against the GGUF metadata's layers and heads, without torch
    or transformers (a path ending in .gguf is a file, never a hub name)."""
    file = tiny[0]
    assert ModelRef.parse(file).shape() == ModelRef.parse(file.parent).shape()
    assert ModelRef.parse(file).shape().n_layers == LAYERS and ModelRef.parse(file).shape().n_heads == HEADS
    assert ModelRef.parse("missing.gguf", tmp_path).path == tmp_path / "missing.gguf"
    h = tmp_path / "h.yaml"
    h.write_text(json.dumps({"harness": 1, "name": "g", "model": str(file),
                             "data": {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 5},
                             "claims": [{"id": "r", "kind": "role", "head": "L5H0", "role": "previous_token",
                                         "at_least": 0.0}]}))
    script = ("import sys\nfrom harness.cli import main\ncode = main(['validate', sys.argv[1]])\n"
              "print(code, sorted(m for m in ('torch', 'transformers', 'gguf') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", script, str(h)], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip().splitlines()[-1] == "2 []", run.stdout + run.stderr
    assert "L5H0 is not in the model: the model has layers 0..1 and heads 0..3" in run.stdout + run.stderr


def test_the_evidence_records_the_file(tiny, tmp_path):
    """A run on a GGUF file: kind gguf, the file's sha256 and quantisation in evidence.json, which
    matches its schema."""
    file = tiny[0]
    h = {"harness": 1, "name": "g", "model": str(file),
         "data": {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 5},
         "stats": {"bootstrap": 200, "permutations": 200},
         "claims": [{"id": "r", "kind": "role", "head": "L1H0", "role": "previous_token", "at_least": 0.0}]}
    ev = harness.run(h, device="cpu", figures=False)
    assert (ev.model["kind"], ev.model["sha256"]) == ("gguf", hashlib.sha256(file.read_bytes()).hexdigest())
    assert ev.model["quantization"] == {"tensor_types": "F32, Q8_0", "file_type": "Q8_0"}
    assert ev.model["dtype"] == "float32" and "stored_dtype" not in ev.model
    doc = json.loads(document.to_json(ev.to_dict()))
    assert document.json_schema_problems(doc, document.schema()) == []


def test_errors_are_one_line(tiny, tmp_path, capsys, monkeypatch):
    """A missing file, a folder with two .gguf files, a file that is not GGUF or is cut short, an
    architecture transformers cannot read, no gguf package: one line each, exit 2."""
    missing = tmp_path / "missing.gguf"
    assert one_error(capsys, ["roles", missing]) == f"error: model file {missing} does not exist"
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(tiny[0].read_bytes())
    assert ModelRef.parse(two).kind() == "gguf" and ModelRef.parse(two).shape() is None
    assert one_error(capsys, ["roles", two]) == (
        f"error: {two} holds 2 .gguf files (a.gguf, b.gguf): a folder without config.json loads when it "
        "holds exactly one; name the file to load (FOLDER/NAME.gguf)")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04" + bytes(100))
    assert one_error(capsys, ["roles", junk]) == (f"error: {junk}: not a GGUF file (it does not start with the "
                                                  "bytes 'GGUF')")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny[0].read_bytes()[:2000])
    assert one_error(capsys, ["roles", cut]) == (f"error: {cut}: not a complete GGUF file (its header ends early at "
                                                 "byte 2000)")
    odd = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(odd), "notanarch")
    w.add_block_count(1)
    w.add_tensor("blk.0.w.weight", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert one_error(capsys, ["roles", odd]).startswith(
        f"error: {odd}: GGUF architecture 'notanarch' cannot be read by transformers")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ModelLoadError) as info:
        load_model(tiny[0], device="cpu")
    assert str(info.value) == (f"model {tiny[0]}: reading GGUF files needs the gguf package >= 0.10: "
                               "pip install 'harness[gguf]'")
