"""Tests of the float64 family oracle (tests/family_oracle.py) itself, so the harness can be tested against it.

The reference is the transformers model in float64 (eager attention).  transformers upcasts to float32 in
places even in a float64 model (RMSNorm, the rotary inv_freq / cos / sin, the eager softmax), which limits it
to ~1e-6 relative; `Float64` (a TorchFunctionMode that turns every float32 request into float64) removes
those casts and nothing else, so the comparison can be made at 1e-9.  `test_float64_mode_only_removes_rounding`
checks that the plain float64 model agrees at float32 precision.

Second computations "by hand" below read the raw safetensors / HF modules, not the oracle's weight layout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode

from tests import family_models
from tests.family_oracle import Oracle, Patch

ALL_FAMILIES = family_models.FAMILIES + family_models.NEW_FAMILIES
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    **{f: (f, {}) for f in ALL_FAMILIES},
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen2-sliding": ("qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
    "gemma2-bias": ("gemma2", {"attention_bias": True}),
    "neox-sequential": ("neox", {"use_parallel_residual": False}),
    "neox-odd-rotary": ("neox", {"hidden_size": 48}),  # d_head 12: int(12 * 0.25) = 3 rotary dims (HF rotates 4)
}
GQA = ("llama", "mistral", "qwen2", "gemma2", "qwen3", "olmo2", "gemma3", "llama3")
QK_NORM = ("qwen3", "olmo2", "gemma3")  # per head, whole projection, per head with 1 + w
ROTARY = tuple(v for v in VARIANTS if VARIANTS[v][0] != "gpt2")  # GPT-2 has learned positions
SEQ = 13  # > every sliding window (6, 5): the windows cut


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Float64(TorchFunctionMode):
    """Within it, a requested float32 (dtype=, .to(torch.float32), .float()) is float64 instead."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = {k: torch.float64 if v is torch.float32 else v for k, v in (kwargs or {}).items()}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        return func(*args, **kwargs)


def tokens(seed: int, n: int = 3, s: int = SEQ) -> torch.Tensor:
    return torch.randint(0, family_models.VOCAB, (n, s), generator=torch.Generator().manual_seed(seed))


BASE, SOURCE = tokens(1), tokens(2)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: family_models.build(fam, root / name, **over) for name, (fam, over) in VARIANTS.items()}


_HF: dict[Path, torch.nn.Module] = {}
_ORACLE: dict[Path, Oracle] = {}


def hf(path: Path, float64_mode: bool = True) -> torch.nn.Module:
    """The transformers model of `path` in float64, eager attention.  Weights are loaded outside Float64 (the
    mode must not touch loading: safetensors' frombuffer takes a dtype); with `float64_mode` its rotary
    modules (whose inv_freq buffers stay float32 after a float64 load) are rebuilt inside it."""
    key = path if float64_mode else path / "plain"
    if key not in _HF:
        cls = family_models._model_class(family(path))
        model = cls.from_pretrained(str(path), dtype=torch.float64, attn_implementation="eager").eval()
        if float64_mode:
            for name, mod in list(model.named_modules()):
                if type(mod).__name__.endswith("RotaryEmbedding"):
                    with Float64():
                        new = type(mod)(model.config)
                    parent, _, leaf = name.rpartition(".")
                    setattr(model.get_submodule(parent), leaf, new)
                    freqs = [b for k, b in new.named_buffers() if k.endswith("inv_freq")]  # Gemma 3: one per type
                    assert freqs and all(b.dtype == torch.float64 for b in freqs)
        _HF[key] = model
    return _HF[key]


def oracle(path: Path) -> Oracle:
    if path not in _ORACLE:
        _ORACLE[path] = Oracle(path)
    return _ORACLE[path]


def family(path: Path) -> str:
    return VARIANTS[path.name][0]


def close(a: torch.Tensor, b: torch.Tensor, rel: float, scale: torch.Tensor | None = None) -> bool:
    """max |a - b| <= rel * max |scale| (scale defaults to b; at least 1e-300)."""
    s = (b if scale is None else scale).abs().max().clamp_min(1e-300)
    return bool((a - b).abs().max() <= rel * s)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


# ---------------------------------------------------------------------------- transformers, hooked


def hf_modules(model: torch.nn.Module, fam: str) -> dict[str, Any]:
    """The HF modules per family: blocks, the pre-attention norm (None: OLMo 2 has none), o_proj (input = z heads
    concatenated), the module whose output is what the MLP adds, the final norm, the module whose input is what
    the MLP reads (the pre-MLP norm; OLMo 2: the MLP itself), and the post-attention norm (or None)."""
    if fam == "neox":
        blocks = list(model.gpt_neox.layers)
        return {"blocks": blocks, "norm1": [b.input_layernorm for b in blocks],
                "o": [b.attention.dense for b in blocks], "mlp": [b.mlp for b in blocks],
                "norm2": [b.post_attention_layernorm for b in blocks], "post1": None,
                "final": model.gpt_neox.final_layer_norm}
    if fam == "gpt2":
        blocks = list(model.transformer.h)
        return {"blocks": blocks, "norm1": [b.ln_1 for b in blocks], "o": [b.attn.c_proj for b in blocks],
                "mlp": [b.mlp for b in blocks], "norm2": [b.ln_2 for b in blocks], "post1": None,
                "final": model.transformer.ln_f}
    blocks = list(model.model.layers)
    if fam == "olmo2":  # no pre-norms: h = x + post1(attn(x)); out = h + post2(mlp(h))
        return {"blocks": blocks, "norm1": [None for _ in blocks], "o": [b.self_attn.o_proj for b in blocks],
                "mlp": [b.post_feedforward_layernorm for b in blocks], "norm2": [b.mlp for b in blocks],
                "post1": [b.post_attention_layernorm for b in blocks], "final": model.model.norm}
    gemma = fam in family_models.GEMMA
    return {"blocks": blocks, "norm1": [b.input_layernorm for b in blocks], "o": [b.self_attn.o_proj for b in blocks],
            "mlp": [b.post_feedforward_layernorm if gemma else b.mlp for b in blocks],
            "norm2": [b.pre_feedforward_layernorm if gemma else b.post_attention_layernorm for b in blocks],
            "post1": [b.post_attention_layernorm for b in blocks] if gemma else None, "final": model.model.norm}


def hf_mlp_block(model: Any, fam: str, l: int, resid: torch.Tensor) -> torch.Tensor:
    """What HF's block l MLP adds when it reads `resid` (its own norm / MLP / post-norm modules)."""
    if fam == "neox":
        b = model.gpt_neox.layers[l]
        return b.mlp(b.post_attention_layernorm(resid))
    if fam == "gpt2":
        b = model.transformer.h[l]
        return b.mlp(b.ln_2(resid))
    b = model.model.layers[l]
    if fam in family_models.GEMMA:
        return b.post_feedforward_layernorm(b.mlp(b.pre_feedforward_layernorm(resid)))
    if fam == "olmo2":
        return b.post_feedforward_layernorm(b.mlp(resid))
    return b.mlp(b.post_attention_layernorm(resid))


def hf_unembed(model: torch.nn.Module, fam: str, resid_final: torch.Tensor) -> torch.Tensor:
    """HF's final norm, lm_head and final soft cap on a final residual."""
    m = hf_modules(model, fam)
    logits = model.get_output_embeddings()(m["final"](resid_final))
    cap = getattr(model.config, "final_logit_softcapping", None)
    return cap * torch.tanh(logits / cap) if cap else logits


def hf_run(model: torch.nn.Module, fam: str, toks: torch.Tensor,
           z_edit: dict[tuple[int, int], torch.Tensor] | None = None) -> dict[str, Any]:
    """HF logits and captured activations: resid_pre (block inputs), z (o_proj inputs, per head, before any
    edit), attn_pre_norm (o_proj outputs), mlp_out, mlp_in (what the MLP norm reads), resid_final.
    z_edit {(layer, head): z} overwrites those heads' slices of the o_proj input (head ablation)."""
    m = hf_modules(model, fam)
    H = model.config.n_head if fam == "gpt2" else model.config.num_attention_heads
    cap: dict[str, Any] = {k: {} for k in ("resid_pre", "z", "attn_pre_norm", "mlp_out", "mlp_in")}
    handles = []

    def block_pre(l: int, mod: Any, args: tuple, kwargs: dict) -> None:
        cap["resid_pre"][l] = args[0] if args else kwargs["hidden_states"]

    def o_pre(l: int, mod: Any, args: tuple) -> tuple | None:
        x = args[0]
        n, s, _ = x.shape
        cap["z"][l] = x.view(n, s, H, -1).clone()
        edits = {h: v for (L, h), v in (z_edit or {}).items() if L == l}
        if not edits:
            return None
        x = x.clone().view(n, s, H, -1)
        for h, v in edits.items():
            x[:, :, h] = v
        return (x.view(n, s, -1), *args[1:])

    def store(key: str, l: int, mod: Any, args: tuple, out: torch.Tensor) -> None:
        cap[key][l] = out

    def store_in(l: int, mod: Any, args: tuple) -> None:
        cap["mlp_in"][l] = args[0]

    def final_pre(mod: Any, args: tuple) -> None:
        cap["resid_final"] = args[0]

    for l, blk in enumerate(m["blocks"]):
        handles.append(blk.register_forward_pre_hook(partial(block_pre, l), with_kwargs=True))
        handles.append(m["o"][l].register_forward_pre_hook(partial(o_pre, l)))
        handles.append(m["o"][l].register_forward_hook(partial(store, "attn_pre_norm", l)))
        handles.append(m["mlp"][l].register_forward_hook(partial(store, "mlp_out", l)))
        handles.append(m["norm2"][l].register_forward_pre_hook(partial(store_in, l)))
    handles.append(m["final"].register_forward_pre_hook(final_pre))
    try:
        with Float64(), torch.no_grad():
            cap["logits"] = model(toks).logits
    finally:
        for hd in handles:
            hd.remove()
    return cap


# ---------------------------------------------------------------------------- raw weights, by hand


_RAW: dict[Path, dict[str, torch.Tensor]] = {}


def raw(path: Path) -> dict[str, torch.Tensor]:
    """The saved tensors in float64 (never load inside Float64)."""
    if path not in _RAW:
        _RAW[path] = {k: v.double() for k, v in load_file(str(path / "model.safetensors")).items()}
    return _RAW[path]


def head_write_by_hand(path: Path, l: int, h: int, dz: torch.Tensor) -> torch.Tensor:
    """dz [n, s, dh] @ head h's slice of the saved output projection (no post norm)."""
    sd, fam, dh = raw(path), family(path), dz.shape[-1]
    sl = slice(h * dh, (h + 1) * dh)
    if fam == "gpt2":
        return dz @ sd[f"transformer.h.{l}.attn.c_proj.weight"][sl]  # Conv1D [in, out]
    key = (f"gpt_neox.layers.{l}.attention.dense.weight" if fam == "neox"
           else f"model.layers.{l}.self_attn.o_proj.weight")
    return dz @ sd[key][:, sl].T  # nn.Linear [out, in]


def unembed_by_hand(path: Path, resid: torch.Tensor) -> torch.Tensor:
    """Final norm, unembedding and final soft cap written out from the saved tensors and config."""
    sd, fam, cfg = raw(path), family(path), json_config(path)
    if fam in ("gpt2", "neox"):
        pre = "transformer.ln_f." if fam == "gpt2" else "gpt_neox.final_layer_norm."
        eps = cfg.get("layer_norm_epsilon", cfg.get("layer_norm_eps", 1e-5))
        c = resid - resid.mean(-1, keepdim=True)
        x = c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + eps) * sd[pre + "weight"] + sd[pre + "bias"]
        W = sd.get("embed_out.weight", sd.get("lm_head.weight", sd.get("transformer.wte.weight")))
        return x @ W.T
    x = resid / torch.sqrt(resid.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"])
    w = sd["model.norm.weight"]
    x = x * (1 + w) if fam in family_models.GEMMA else x * w
    logits = x @ sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).T
    cap = cfg.get("final_logit_softcapping")
    return cap * torch.tanh(logits / cap) if cap else logits


def json_config(path: Path) -> dict[str, Any]:
    import json

    return json.loads((path / "config.json").read_text())


# ---------------------------------------------------------------------------- the builders


def test_builders_are_deterministic_and_float32(tmp_path: Path) -> None:
    for fam in ALL_FAMILIES:
        a = family_models.build(fam, tmp_path / f"{fam}-a")
        b = family_models.build(fam, tmp_path / f"{fam}-b")
        assert sorted(p.name for p in a.iterdir()) == ["config.json", "model.safetensors"]
        digest = [hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in (a, b)]
        assert digest[0] == digest[1], fam
        sd = load_file(str(a / "model.safetensors"))
        assert {t.dtype for t in sd.values()} == {torch.float32}
        # norms (q_norm / k_norm too) and biases perturbed away from identity (1, or 0 for Gemma's 1 + w)
        for k, t in sd.items():
            if k.endswith("bias") or "norm" in k or ".ln_" in k:
                ident = 0.0 if fam in family_models.GEMMA or k.endswith("bias") else 1.0
                assert (t - ident).abs().max() > 0.1, k


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_builders_exercise_the_features(model_dirs: dict[str, Path], name: str) -> None:
    """Sharp attention (with a QK norm too), soft caps biting, sliding windows cutting (positions before the window
    agree), QK norms where the family has them."""
    o = oracle(model_dirs[name])
    r = o.run(BASE)
    for p in r["pattern"]:
        assert float(p[:, :, 3:].max(-1).values.mean()) > 0.5  # not near-uniform
    assert o.n_layers >= 2 and o.n_heads == 4
    assert (o.qk_norm is not None) == (name in QK_NORM)
    assert all((lay.q_norm is not None) == (lay.k_norm is not None) == (name in QK_NORM) for lay in o.layers)
    if o.final_softcap:
        pre = o.norm(r["resid_final"], o.norm_f) @ o.W_U
        assert float(pre.abs().max()) > 2 * o.final_softcap
        q, k = o.rotary(r["q"][0], 0), o.rotary(r["k"][0], 0)
        scores = torch.einsum("nqhe,nkhe->nhqk", q, k) * o.attn_scale
        assert o.attn_softcap and float(scores.abs().max()) > 2 * o.attn_softcap
    windows = [w for w in o.windows if w is not None]
    if windows:
        assert max(windows) < SEQ
        full = Oracle(model_dirs[name])
        full.windows = [None] * o.n_layers
        lf = full.run(BASE)["logits"]
        w = min(windows)
        assert close(lf[:, :w], r["logits"][:, :w], 1e-12)
        assert rel_err(lf[:, w:], r["logits"][:, w:]) > 1e-3


# ---------------------------------------------------------------------------- unpatched: oracle == transformers


@pytest.mark.parametrize("name", list(VARIANTS))
def test_oracle_matches_transformers(model_dirs: dict[str, Path], name: str) -> None:
    """Logits and every cached activation equal the float64 HF model's to 1e-9 of their scale."""
    path = model_dirs[name]
    o, fam = oracle(path), family(path)
    r, ref = o.run(BASE), hf_run(hf(path), fam, BASE)
    assert close(r["logits"], ref["logits"], 1e-9), rel_err(r["logits"], ref["logits"])
    assert close(r["embed"], ref["resid_pre"][0], 1e-9)
    assert close(r["resid_final"], ref["resid_final"], 1e-9)
    for l in range(o.n_layers):
        assert close(r["resid_pre"][l], ref["resid_pre"][l], 1e-9), l
        assert close(r["z"][l], ref["z"][l], 1e-9), l
        assert close(r["attn_pre_norm"][l], ref["attn_pre_norm"][l], 1e-9), l
        assert close(r["mlp_out"][l], ref["mlp_out"][l], 1e-9), l
        assert close(r["mlp_in"][l], ref["mlp_in"][l], 1e-9), l


@pytest.mark.parametrize("name", ["llama", "gemma2", "neox", "gemma3"])
def test_float64_mode_only_removes_rounding(model_dirs: dict[str, Path], name: str) -> None:
    """The plain float64 HF model (float32 upcasts inside) agrees with the oracle at float32 precision."""
    path = model_dirs[name]
    with torch.no_grad():
        plain = hf(path, float64_mode=False)(BASE).logits
    err = rel_err(oracle(path).run(BASE)["logits"], plain)
    assert 1e-12 < err < 1e-5


def _set_rotary(o: Oracle, dims: int, theta: float | None = None) -> None:
    o.set_rotary(dims, theta or float(o.config["rope_parameters"]["rope_theta"]))


def _unscaled_rope(o: Oracle) -> None:
    """Every layer's rope as the default formula of its own theta (drops linear / llama3 scaling)."""
    rp = o.config["rope_parameters"]
    thetas = ([rp["full_attention" if w is None else "sliding_attention"]["rope_theta"] for w in o.windows]
              if "full_attention" in rp else [rp["rope_theta"]] * o.n_layers)
    o.set_inv_freq([Oracle.rope_inv_freq({"rope_theta": t}, o.d_head) for t in thetas])


def _set_layers(o: Oracle, **fields: Callable[[Any], Any]) -> None:
    for lay in o.layers:
        for k, f in fields.items():
            setattr(lay, k, f(getattr(lay, k)))


SLIDING = ("mistral", "gemma2", "qwen2-sliding", "gemma3")


MUTATIONS: dict[str, tuple[tuple[str, ...], Callable[[Oracle], None]]] = {
    # a wrong reading of the architecture must be caught by test_oracle_matches_transformers' comparison
    "window+1": (SLIDING, lambda o: setattr(o, "windows", [w and w + 1 for w in o.windows])),
    "window-1": (SLIDING, lambda o: setattr(o, "windows", [w and w - 1 for w in o.windows])),
    "kv-interleaved": (GQA, lambda o: setattr(o, "kv_of", torch.arange(o.n_heads) % o.n_kv_heads)),
    "scale-1/sqrt(d_head)": (("gemma2", "gemma3"), lambda o: setattr(o, "attn_scale", o.d_head**-0.5)),
    "no-attn-softcap": (("gemma2",), lambda o: setattr(o, "attn_softcap", None)),
    "no-final-softcap": (("gemma2",), lambda o: setattr(o, "final_softcap", None)),
    "unscaled-embed": (("gemma2", "gemma3"), lambda o: setattr(o, "embed_scale", 1.0)),
    "sequential": (("neox",), lambda o: setattr(o, "parallel", False)),
    "full-rotary": (("neox",), lambda o: _set_rotary(o, o.d_head)),
    "even-rotary-floor": (("neox-odd-rotary",), lambda o: _set_rotary(o, 2)),
    "theta-1e4": (("mistral", "qwen2", "qwen3"), lambda o: _set_rotary(o, o.d_head, theta=1e4)),
    "no-qk-norm": (QK_NORM, lambda o: _set_layers(o, q_norm=lambda w: None, k_norm=lambda w: None)),
    "qk-norm-other-scope": (("qwen3", "olmo2"),  # per head <-> over the whole projection
                            lambda o: setattr(o, "qk_norm", "all" if o.qk_norm == "head" else "head")),
    "qk-norm-w-not-1+w": (("gemma3",), lambda o: _set_layers(o, q_norm=lambda w: w - 1, k_norm=lambda w: w - 1)),
    "no-post-norms": (("olmo2",), lambda o: _set_layers(o, post1=lambda n: None, post2=lambda n: None)),
    "unscaled-rope": (("llama3", "gemma3"), _unscaled_rope),
    "one-rope-for-all-layers": (("gemma3",), lambda o: o.set_inv_freq([o.layer_inv_freq[0]] * o.n_layers)),
}


@pytest.mark.parametrize(("name", "mutation"), [(n, m) for m, (names, _) in MUTATIONS.items() for n in names])
def test_comparison_detects_misread_architecture(model_dirs: dict[str, Path], name: str, mutation: str) -> None:
    path = model_dirs[name]
    o = Oracle(path)
    MUTATIONS[mutation][1](o)
    assert rel_err(o.run(BASE)["logits"], hf_run(hf(path), family(path), BASE)["logits"]) > 1e-4


def hf_rotary(model: torch.nn.Module) -> torch.nn.Module:
    (rot,) = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    return rot


def hf_inv_freq(rot: torch.nn.Module, config: Any, l: int) -> torch.Tensor:
    """Layer l's inv_freq in a transformers rotary module (Gemma 3 keeps one per layer type)."""
    types = getattr(config, "layer_types", None)
    name = f"{types[l]}_inv_freq" if types is not None and hasattr(rot, f"{types[l]}_inv_freq") else "inv_freq"
    freq: torch.Tensor = getattr(rot, name)
    return freq


@pytest.mark.parametrize("name", ROTARY)  # GPT-2 has no rotary
def test_rope_frequencies_match_transformers(model_dirs: dict[str, Path], name: str) -> None:
    """Each layer's inv_freq (default, linear, llama3; per layer type for Gemma 3) equals transformers' own
    rotary module's, built in float64."""
    path = model_dirs[name]
    o, model = oracle(path), hf(path)
    rot = hf_rotary(model)
    for l in range(o.n_layers):
        assert close(o.layer_inv_freq[l], hf_inv_freq(rot, model.config, l), 1e-14), l


def test_scaled_ropes_are_exercised(model_dirs: dict[str, Path]) -> None:
    """llama3: of the frequencies some are unchanged, some divided by the factor and some interpolated strictly
    between; Gemma 3: sliding layers use theta 1e4 unscaled, full layers theta 1e6 divided by 8."""
    o = oracle(model_dirs["llama3"])
    rp = o.config["rope_parameters"]
    ratio = o.inv_freq / Oracle.rope_inv_freq({"rope_theta": rp["rope_theta"]}, o.d_head)
    f = rp["factor"]
    kept, divided = (ratio - 1).abs() < 1e-14, (ratio - 1 / f).abs() < 1e-14
    between = (ratio > 1 / f + 1e-3) & (ratio < 1 - 1e-3)
    assert int(kept.sum()) >= 2 and int(divided.sum()) >= 2 and int(between.sum()) >= 2
    assert bool((kept | divided | between).all())
    g = oracle(model_dirs["gemma3"])
    assert g.windows[0] is not None and g.windows[1] is None
    for l, w in enumerate(g.windows):
        want = (Oracle.rope_inv_freq({"rope_theta": 1e4}, g.d_head) if w is not None
                else Oracle.rope_inv_freq({"rope_theta": 1e6}, g.d_head) / 8)
        assert close(g.layer_inv_freq[l], want, 1e-15), l


DROP = object()  # a config.json key to remove


def with_config(src: Path, dst: Path, changes: dict[str, Any]) -> Path:
    """A copy of the model directory `src` whose config.json has `changes` (DROP: the key removed)."""
    import json
    import shutil

    dst.mkdir(parents=True)
    shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    cfg = {**json_config(src), **changes}
    (dst / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not DROP}))
    return dst


LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0, "original_max_position_embeddings": 256}
LEGACY_ROPE: dict[str, dict[str, Any]] = {
    "gemma3": {"rope_parameters": DROP, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "llama3": {"rope_parameters": DROP, "rope_theta": 1e4, "rope_scaling": {"rope_type": "llama3", **LLAMA3_ROPE}},
}


@pytest.mark.parametrize("name", list(LEGACY_ROPE))
def test_legacy_rope_keys_are_read_as_transformers_reads_them(model_dirs: dict[str, Path], tmp_path: Path,
                                                             name: str) -> None:
    """Older config.json forms (top-level rope_theta, rope_scaling, Gemma 3's rope_local_base_freq) give the same
    frequencies in the oracle as the current form, and as transformers' rotary module built from that config."""
    path = model_dirs[name]
    legacy = with_config(path, tmp_path / name, LEGACY_ROPE[name])
    old, new = Oracle(legacy), oracle(path)
    config_class: Any = type(hf(path).config)
    config = config_class.from_pretrained(str(legacy))
    with Float64():
        rot = type(hf_rotary(hf(path)))(config)
    for l in range(new.n_layers):
        assert close(old.layer_inv_freq[l], new.layer_inv_freq[l], 0.0), l
        assert close(old.layer_inv_freq[l], hf_inv_freq(rot, config, l), 1e-14), l


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("llama3", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "'dynamic' not impl"),
    ("llama3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "'yarn' not impl"),
    ("llama3", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, **LLAMA3_ROPE, "attention_factor": 2.0}},
     "attention_factor"),
    ("llama3", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                                    "partial_rotary_factor": 0.5}}, "partial rotary"),
    ("gemma3", {"attn_logit_softcapping": 5.0}, "ignores it"),
    ("gemma3", {"use_bidirectional_attention": True}, "bidirectional"),
    ("gemma3", {"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                    "full_attention": {"rope_type": "longrope", "rope_theta": 1e6}}}, "'longrope'"),
    ("gemma3", {"layer_types": ["sliding_attention", "chunked_attention", "sliding_attention"]}, "chunked"),
    ("qwen3", {"model_type": "qwen2"}, "q_norm"),  # the QK-norm weights left over
    ("qwen3", {"model_type": "olmo2"}, "post_feedforward_layernorm"),
    ("olmo2", {"model_type": "qwen3"}, "input_layernorm"),
]


def test_unimplemented_configs_are_refused(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    for i, (name, changes, match) in enumerate(REFUSED):
        with pytest.raises(ValueError, match=match):
            Oracle(with_config(model_dirs[name], tmp_path / str(i), changes))


# ---------------------------------------------------------------------------- patching: identities


def _edges(o: Oracle) -> list[Any]:
    """A spread of edges and paths valid in every variant (last layer L-1)."""
    L = o.n_layers - 1
    edges: list[Any] = [
        (("head", 0, 1), ("q", L, 2)), (("head", 0, 1), ("k", L, 3)), (("head", 0, 3), ("v", L, 0)),
        (("head", L, 2), ("logits",)), (("embed",), ("mlp", 0)), (("embed",), ("k", 0, 1)),
        (("mlp", 0), ("v", L, 1)), (("mlp", 0), ("logits",)),
        ([("head", 0, 0), ("head", 0, 2), ("head", L, 1), ("embed",)], ("logits",)),
        [("embed",), ("mlp", 0), ("q", L, 0)],
    ]
    if o.parallel:  # a head of layer 1 does not feed MLP 1
        edges.append([("head", 0, 2), ("v", 1, 3), ("logits",)])
    else:
        edges += [[("head", 0, 2), ("v", 1, 3), ("mlp", L), ("logits",)], (("head", L, 0), ("mlp", L))]
    return edges


@pytest.mark.parametrize("name", list(VARIANTS))
def test_identity_patches_reproduce_the_base_run(model_dirs: dict[str, Path], name: str) -> None:
    o = oracle(model_dirs[name])
    base = o.run(BASE)["logits"]
    for e in _edges(o):
        assert close(o.patched_logits(BASE, BASE, e), base, 1e-12), e
    assert float(o.sender_delta(BASE, BASE, [("head", 0, 1), ("head", 0, 2), ("mlp", 0)]).abs().max()) == 0.0


@pytest.mark.parametrize("name", list(VARIANTS))
def test_patches_have_effects(model_dirs: dict[str, Path], name: str) -> None:
    """Non-identity patches change the logits (so the identity test is not vacuous)."""
    o = oracle(model_dirs[name])
    base = o.run(BASE)["logits"]
    for e in _edges(o):
        assert rel_err(o.patched_logits(BASE, SOURCE, e), base) > 1e-4, e


# ---------------------------------------------------------------------------- GQA


@pytest.mark.parametrize("name", GQA)
@pytest.mark.parametrize("which", ["k", "v", "q"])
def test_gqa_edge_changes_only_its_query_head(model_dirs: dict[str, Path], name: str, which: str) -> None:
    o = oracle(model_dirs[name])
    assert o.n_kv_heads == 2 and o.n_heads == 4
    base = o.run(BASE)
    D = o.sender_delta(BASE, SOURCE, ("head", 0, 1))
    for h in range(o.n_heads):
        r = o.run(BASE, Patch(head_inputs={(1, h, which): D}))
        for g in range(o.n_heads):
            dz = (r["z"][1][:, :, g] - base["z"][1][:, :, g]).abs().max()
            if g == h:
                assert dz > 1e-3
            else:  # including h's partner in the same KV group, which reads the same base k / v
                assert dz <= 1e-13 * base["z"][1].abs().max()
        # the edge API (recomputed z of h put in place) == the Patch.head_inputs route
        assert close(o.patched_logits(BASE, SOURCE, (("head", 0, 1), (which, 1, h))), r["logits"], 1e-12)


# ---------------------------------------------------------------------------- by hand


@pytest.mark.parametrize("name", ["llama", *QK_NORM])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_edge_into_a_head_input_through_transformers_modules(model_dirs: dict[str, Path], name: str,
                                                            which: str) -> None:
    """A -> B.x with transformers computing the receiver: a run whose layer-L x_proj output is replaced by
    x_proj(norm1(resid_pre_L + D)) (every head's x reads r'; then HF's own QK norm, per head or over the whole
    projection, rotary and attention) gives B's z'_B, as B's z depends only on q_B and its KV head's k / v; a
    second run with only B's z replaced by it gives the logits the oracle's edge must give."""
    path = model_dirs[name]
    o, fam, model = oracle(path), family(path), hf(path)
    L, B = o.n_layers - 1, 2
    D = o.sender_delta(BASE, SOURCE, ("head", 0, 1))
    base = hf_run(model, fam, BASE)
    m = hf_modules(model, fam)
    proj, norm1 = getattr(m["blocks"][L].self_attn, f"{which}_proj"), m["norm1"][L]
    r_new = base["resid_pre"][L] + D
    with Float64(), torch.no_grad():
        x_new = proj(norm1(r_new) if norm1 is not None else r_new)
    handle = proj.register_forward_hook(lambda mod, args, out: x_new)
    try:
        z_B = hf_run(model, fam, BASE)["z"][L][:, :, B]
    finally:
        handle.remove()
    want = hf_run(model, fam, BASE, z_edit={(L, B): z_B})["logits"]
    got = o.patched_logits(BASE, SOURCE, (("head", 0, 1), (which, L, B)))
    assert close(got, want, 1e-9), rel_err(got, want)
    assert rel_err(got, base["logits"]) > 1e-4


@pytest.mark.parametrize("name", list(VARIANTS))
def test_head_delta_and_edge_to_logits_by_hand(model_dirs: dict[str, Path], name: str) -> None:
    """D of a head from HF's own z (o_proj inputs) and the saved W_O; logits = final norm / unembedding /
    soft cap of HF's resid_final + D, written out by hand."""
    path = model_dirs[name]
    o, fam, model = oracle(path), family(path), hf(path)
    base, src = hf_run(model, fam, BASE), hf_run(model, fam, SOURCE)
    for l, h in [(0, 1), (o.n_layers - 1, 3)]:
        dz = src["z"][l][:, :, h] - base["z"][l][:, :, h]
        if o.post_norms:  # Gemma, OLMo 2: D = post1(P + dz W_O[h]) - post1(P), with HF's own norm module
            P = base["attn_pre_norm"][l]
            post1 = hf_modules(model, fam)["post1"][l]
            write = head_write_by_hand(path, l, h, dz)
            with Float64(), torch.no_grad():
                D = post1(P + write) - post1(P)
        else:
            D = head_write_by_hand(path, l, h, dz)
        assert close(o.sender_delta(BASE, SOURCE, ("head", l, h)), D, 1e-9)
        want = unembed_by_hand(path, base["resid_final"] + D)
        assert close(o.patched_logits(BASE, SOURCE, (("head", l, h), ("logits",))), want, 1e-9)
    # embed -> logits, zero replacement: the final residual loses the embedding
    want = unembed_by_hand(path, base["resid_final"] - base["resid_pre"][0])
    assert close(o.patched_logits(BASE, None, (("embed",), ("logits",)), "zero"), want, 1e-9)


@pytest.mark.parametrize("name", ["gemma2", "gemma2-bias", "llama", "gemma3", "olmo2"])
def test_head_groups_change_jointly_per_layer(model_dirs: dict[str, Path], name: str) -> None:
    """Heads of one layer: one joint post1 call (not the sum of single-head changes, for Gemma 2 / 3 and OLMo 2);
    groups over layers: the sum of per-layer changes."""
    path = model_dirs[name]
    o, fam, model = oracle(path), family(path), hf(path)
    base, src = hf_run(model, fam, BASE), hf_run(model, fam, SOURCE)
    pair = [("head", 0, 0), ("head", 0, 3)]
    joint = o.sender_delta(BASE, SOURCE, pair)
    write = sum(head_write_by_hand(path, 0, h, src["z"][0][:, :, h] - base["z"][0][:, :, h]) for _, _, h in pair)
    if o.post_norms:
        P, post1 = base["attn_pre_norm"][0], hf_modules(model, fam)["post1"][0]
        with Float64(), torch.no_grad():
            want = post1(P + write) - post1(P)
        singles = sum(o.sender_delta(BASE, SOURCE, s) for s in pair)
        assert rel_err(singles, joint) > 1e-3  # the post norm is not additive over heads
    else:
        want = write
    assert close(joint, want, 1e-9)
    spread = [("head", 0, 0), ("head", 0, 3), ("head", 1, 2), ("embed",), ("mlp", 1)]
    parts = o.sender_delta(BASE, SOURCE, pair) + sum(o.sender_delta(BASE, SOURCE, s) for s in spread[2:])
    assert close(o.sender_delta(BASE, SOURCE, spread), parts, 1e-12)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_paths_by_hand(model_dirs: dict[str, Path], name: str) -> None:
    """A path [A, R] is the edge (A, R); A -> MLP m -> logits passes only the MLP's change, computed with HF's
    own MLP modules on HF's captured MLP input + D."""
    path = model_dirs[name]
    o, fam, model = oracle(path), family(path), hf(path)
    base = hf_run(model, fam, BASE)
    for e in _edges(o)[:8]:
        if isinstance(e, tuple):
            assert close(o.patched_logits(BASE, SOURCE, list(e)), o.patched_logits(BASE, SOURCE, e), 0.0)
    m = o.n_layers - 1
    for sender in [("head", 0, 2), ("embed",), ("mlp", 0)]:
        D0 = o.sender_delta(BASE, SOURCE, sender)
        with Float64(), torch.no_grad():
            D1 = hf_mlp_block(model, fam, m, base["mlp_in"][m] + D0) - base["mlp_out"][m]
            want = hf_unembed(model, fam, base["resid_final"] + D1)
        assert close(o.patched_logits(BASE, SOURCE, [sender, ("mlp", m), ("logits",)]), want, 1e-9), sender
        # the edge sender -> MLP m instead changes MLP m's output inside the forward: same, as m is last
        assert close(o.patched_logits(BASE, SOURCE, (sender, ("mlp", m))), want, 1e-9), sender


@pytest.mark.parametrize("name", ["llama", "gemma2", "neox", "gpt2", "olmo2"])
def test_path_through_a_head_hop(model_dirs: dict[str, Path], name: str) -> None:
    """A -> L1H h.v -> logits: the hop's write change (via HF's post1 for Gemma) of z'_B, where z'_B is the z of
    the edge A -> L1H h.v's forward (Patch route)."""
    path = model_dirs[name]
    o, fam, model = oracle(path), family(path), hf(path)
    hb = 2
    base = o.run(BASE)
    D0 = o.sender_delta(BASE, SOURCE, ("head", 0, 1))
    z_new = o.run(BASE, Patch(head_inputs={(1, hb, "v"): D0}))["z"][1][:, :, hb]
    dz = z_new - base["z"][1][:, :, hb]
    if o.post_norms:
        P, post1 = base["attn_pre_norm"][1], hf_modules(model, fam)["post1"][1]
        write = head_write_by_hand(path, 1, hb, dz)
        with Float64(), torch.no_grad():
            D1 = post1(P + write) - post1(P)
    else:
        D1 = head_write_by_hand(path, 1, hb, dz)
    want = unembed_by_hand(path, base["resid_final"] + D1)
    assert close(o.patched_logits(BASE, SOURCE, [("head", 0, 1), ("v", 1, hb), ("logits",)]), want, 1e-9)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_last_layer_sender_patched_into_all_its_readers_is_its_ablation(model_dirs: dict[str, Path],
                                                                         name: str) -> None:
    """For a head of the last layer, D into every reader (its MLP unless parallel, and the logits) is the same
    as replacing its z in the forward: ties the delta machinery to z replacement."""
    o = oracle(model_dirs[name])
    L, h = o.n_layers - 1, 1
    z_src = o.run(SOURCE)["z"][L][:, :, h]
    D = o.sender_delta(BASE, SOURCE, ("head", L, h))
    patch = Patch(final=D) if o.parallel else Patch(mlp_in={L: D}, final=D)
    assert close(o.run(BASE, patch)["logits"], o.ablated_logits(BASE, [(L, h)], {(L, h): z_src}), 1e-10)


# ---------------------------------------------------------------------------- ablation == transformers with hooks


@pytest.mark.parametrize("name", list(VARIANTS))
def test_ablation_matches_transformers_o_proj_hooks(model_dirs: dict[str, Path], name: str) -> None:
    path = model_dirs[name]
    o, fam, model = oracle(path), family(path), hf(path)
    L = o.n_layers - 1
    layer0 = [(0, h) for h in range(o.n_heads)]
    zero = torch.zeros(*BASE.shape, o.d_head, dtype=torch.float64)
    ref = hf_run(model, fam, BASE, z_edit=dict.fromkeys(layer0, zero))["logits"]
    assert close(o.ablated_logits(BASE, layer0), ref, 1e-9)
    assert rel_err(ref, hf_run(model, fam, BASE)["logits"]) > 1e-3
    # given values: the source run's z of two heads in different layers
    src = o.run(SOURCE)
    values = {(0, 2): src["z"][0][:, :, 2], (L, 1): src["z"][L][:, :, 1]}
    ref = hf_run(model, fam, BASE, z_edit=values)["logits"]
    assert close(o.ablated_logits(BASE, list(values), values), ref, 1e-9)


# ---------------------------------------------------------------------------- replacements


@pytest.mark.parametrize("name", ["llama", "gemma2", "neox"])
def test_mean_and_zero_replacements(model_dirs: dict[str, Path], name: str) -> None:
    o = oracle(model_dirs[name])
    L = o.n_layers - 1
    one = SOURCE[:1].expand(3, -1)  # a reference batch of one prompt repeated: its mean is that prompt
    for sender, receiver in [(("head", 0, 1), ("k", L, 0)), (("embed",), ("logits",)), (("mlp", 0), ("mlp", L))]:
        mean = o.mean_values(one, [sender])[sender]
        assert mean.shape[0] == SEQ
        got = o.patched_logits(BASE, None, (sender, receiver), "mean", mean)
        assert close(got, o.patched_logits(BASE, one, (sender, receiver)), 1e-12), sender
        zero = o.patched_logits(BASE, None, (sender, receiver), "zero")
        assert close(o.patched_logits(BASE, None, (sender, receiver), "mean", torch.zeros_like(mean)), zero, 0.0)
    group = [("head", 0, 1), ("head", L, 2)]
    means = o.mean_values(one, group)
    assert close(o.patched_logits(BASE, None, (group, ("logits",)), "mean", means),
                 o.patched_logits(BASE, one, (group, ("logits",))), 1e-12)


# ---------------------------------------------------------------------------- what is not an edge


def test_invalid_edges_are_refused(model_dirs: dict[str, Path]) -> None:
    neox, llama = oracle(model_dirs["neox"]), oracle(model_dirs["llama"])
    with pytest.raises(ValueError, match="parallel"):
        neox.patched_logits(BASE, SOURCE, (("head", 0, 1), ("mlp", 0)))
    with pytest.raises(ValueError):
        neox.patched_logits(BASE, SOURCE, [("embed",), ("q", 0, 1), ("mlp", 0)])  # head hop of 0 -> MLP 0
    neox.patched_logits(BASE, SOURCE, (("mlp", 0), ("mlp", 1)))  # MLP 0 feeds MLP 1
    llama.patched_logits(BASE, SOURCE, (("head", 0, 1), ("mlp", 0)))  # sequential: a head feeds its MLP
    bad: list[Any] = [
        (("head", 1, 0), ("k", 1, 2)),  # same layer
        (("mlp", 0), ("q", 0, 1)),  # the MLP writes after layer 0's heads read
        (("mlp", 1), ("mlp", 1)),
        [("head", 0, 0), ("logits",), ("mlp", 1)],  # logits not last
        (("head", 0, 4), ("logits",)),  # no head 4
        (("head", 0, 0), ("q", 9, 0)),  # no layer 9
        (("logits",), ("mlp", 1)),  # not a sender
        (("head", 0, 0), ("head", 1, 0)),  # a head is not a receiver; its inputs are
        (("head", 0, 0),),
        ([("head", 0, 0), ("head", 0, 0)], ("logits",)),
    ]
    for e in bad:
        with pytest.raises(ValueError):
            llama.patched_logits(BASE, SOURCE, e)
    with pytest.raises(ValueError):
        llama.patched_logits(BASE, SOURCE[:, :5], (("head", 0, 0), ("logits",)))
