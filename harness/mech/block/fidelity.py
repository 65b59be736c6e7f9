"""The torch arithmetic held to the model it was read from, on a few prompts of the base run.

`check(model, w, base)` compares norm1, the MLP (with norm2 and post2) and ln_final +
unembed with the model's modules and puts the modules back where they differ; q/k/v, z and
attn_out of every layer whose attention the base run cached, each block's output and the
logits are compared with the cache, and a difference beyond tolerance(dtype) x (1 + max |b|)
raises UnsupportedError naming the activation and the model's features.
Imports: mech.block.arith, mech.block.layer, mech.block.read, model.architecture, spec.names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import UnsupportedError
from ...model import architecture
from ...spec.names import hook_attn_out, hook_input, hook_resid_post, hook_resid_pre, hook_z
from .arith import attend, causal, output_transform
from .layer import Layer, Model, block
from .read import Weights, build_layer, norm_module, through, unembedding

CHECK_PROMPTS = 2  # prompts of the base run the torch arithmetic is checked on


def tolerance(dtype: Any) -> float:
    """How far a recomputation may sit from a model computing in `dtype`, relative to
    1 + max |model's value|: float64 1e-8, float32 1e-4, half precision (bfloat16, float16) 3e-2.

    The half-precision bound: bfloat16 rounds to 2^-8 (0.4 %) of a value; on a random layer of
    Qwen2.5-7B's width in bfloat16 (d_model 3584, 28 query heads on 4 key/value heads) the
    recomputed z sat within 1 % of max |z| ~ 3.6 on the CPU (about two roundings), and 0.026
    from the model's on CUDA; an arithmetic that differs from the model's (another rotation,
    scale or grouping) moves z by its own size, far past 3 %."""
    import torch

    return {torch.float64: 1e-8, torch.float32: 1e-4}.get(dtype, 3e-2)


def _off(a: Any, b: Any, tol: float) -> float | None:
    """max |a - b| when it exceeds tol * (1 + max |b|), else None."""
    diff = float((a - b).abs().max())
    return diff if diff > tol * (1 + float(b.abs().max())) else None


def _require(diff: float | None, what: str, arch: architecture.Architecture) -> None:
    if diff is not None:
        feats = ", ".join(arch.features()) or "a GPT-2-style block"
        raise UnsupportedError(f"batched edge patching: {what} recomputed from the cached activations differs from "
                               f"the model's by {diff:.3g} ({arch.name}: {feats})")


def check(model: Model, w: Weights, base: dict[str, Any]) -> None:
    """Hold the torch arithmetic to the model on the first prompts of the base run.

    norm1, the MLP (with norm2 and post2) and ln_final + unembed are compared with the model's
    modules and replaced by them where they differ; q/k/v, z and attn_out of every layer whose
    attention the base run cached, each block's output and the logits are compared with the
    cache (UnsupportedError where they differ); a layer cached only by its residual is checked
    as a whole block (its output from its input).  Differences are measured against
    tolerance of the model's dtype (the base run's)."""
    m = CHECK_PROMPTS
    tol = tolerance(base[hook_resid_pre(0)].dtype)
    bridge, arch = w.bridge, w.arch
    L_last = len(model.layers) - 1
    for L in range(len(model.layers)):
        own, lay = bridge.blocks[L], model.layers[L]
        pre = base[hook_resid_pre(L)][:m]
        detailed = all(k in base for k in (hook_attn_out(L), hook_z(L), *(hook_input(L, x) for x in "qkv")))
        probe = base[hook_attn_out(L)][:m] if detailed else pre
        reads = pre if arch.parallel or not detailed else pre + probe
        norm1 = w.norms[f"ln1.{L}"]
        torch_ln1 = norm1 is not None and _off(norm1(pre), norm_module(own, "ln1")(pre), tol) is None
        if torch_ln1 and lay.post1 is not None:
            torch_ln1 = _off(lay.post1(probe), through(own.ln1_post)(probe), tol) is None
        module_mlp = None
        if lay.mlp is not None:
            module_mlp = through(own.mlp)(norm_module(own, "ln2")(reads))
            if getattr(own, "ln2_post", None) is not None:
                module_mlp = through(own.ln2_post)(module_mlp)
        torch_mlp = lay.mlp is None or _off(lay.mlp(reads), module_mlp, tol) is None
        if not (torch_ln1 and torch_mlp):
            model.layers[L] = lay = build_layer(w, L, torch_ln1, torch_mlp, rotation=lay.rotation)
        nxt = hook_resid_pre(L + 1) if L < L_last else hook_resid_post(L)
        if not detailed:
            whole = block(model, lay, pre, causal(pre.shape[1], lay.window, pre))
            _require(_off(whole, base[nxt][:m], tol), f"{nxt} (block {L} as a whole from its input)", arch)
            continue
        z = _check_attention(model, lay, L, pre, base, tol, arch)
        attn_out = lay.attn_out(lay.out(z.reshape(*z.shape[:-2], -1)))
        _require(_off(attn_out, base[hook_attn_out(L)][:m], tol), hook_attn_out(L), arch)
        _require(_off(lay.finish_block(pre, base[hook_attn_out(L)][:m]), base[nxt][:m], tol),
                 f"{nxt} (the block's output)", arch)
    check_unembedding(model, w, base)


def check_unembedding(model: Model, w: Weights, base: dict[str, Any]) -> None:
    """ln_final + unembed in torch held to the model's modules on the first prompts' final residual (the
    modules are put back where they differ) and to the cached logits, when the base run kept them."""
    m, tol, bridge = CHECK_PROMPTS, tolerance(base[hook_resid_pre(0)].dtype), w.bridge
    final = base[hook_resid_post(int(bridge.cfg.n_layers) - 1)][:m]
    flat = final.reshape(-1, final.shape[-1])

    def ours(rows: slice) -> Any:
        return model.logits(flat[None, rows])[0]

    def modules(rows: slice) -> Any:
        return output_transform(bridge, bridge.unembed(bridge.ln_final(flat[None, rows])))[0]

    if _off_rows(len(flat), ours, modules, tol) is not None:
        model.logits, model.columns = unembedding(w, in_torch=False), None
    if "logits" in base:
        cached = base["logits"][:m]
        cached = cached.reshape(-1, cached.shape[-1])
        _require(_off_rows(len(flat), ours, lambda rows: cached[rows], tol), "the logits (ln_final, unembed)", w.arch)


LOGIT_ROWS = 8  # positions whose logits are compared at once: a 262k vocabulary's are 8 MiB each (float32)


def _off_rows(n: int, a: Callable[[slice], Any], b: Callable[[slice], Any], tol: float) -> float | None:
    """_off of the vocabulary-wide outputs a(rows) and b(rows) of n positions, LOGIT_ROWS positions
    at a time (two prompts' logits and their differences at once are 0.4 GiB at 262k tokens): max |a - b|
    when it exceeds tol * (1 + max |b|) over every position, else None."""
    diff, top = 0.0, 0.0
    for lo in range(0, n, LOGIT_ROWS):
        rows = slice(lo, min(n, lo + LOGIT_ROWS))
        x, y = a(rows), b(rows)
        diff, top = max(diff, float((x - y).abs().max())), max(top, float(y.abs().max()))
    return diff if diff > tol * (1 + top) else None


def _check_attention(model: Model, lay: Layer, L: int, pre: Any, base: dict[str, Any], tol: float,
                     arch: architecture.Architecture) -> Any:
    """q/k/v and z of layer L recomputed from resid_pre [m, s, d] and compared with the cache;
    returns z [m, s, H, dh]."""
    m, s, _ = pre.shape
    H, Hkv, dh = arch.n_heads, lay.n_kv, arch.d_head
    h = lay.ln1(pre)
    qkv = {x: lay.proj[x](h).view(m, s, H if x == "q" else Hkv, dh) for x in "qkv"}
    for x in "qkv":
        _require(_off(qkv[x], base[hook_input(L, x)][:m], tol), hook_input(L, x), arch)
    q, k, v = (lay.qk(x, qkv[x].transpose(1, 2), 1) for x in "qkv")
    z = attend(q, k, v, causal(s, lay.window, pre), lay.cap).transpose(1, 2)
    _require(_off(z, base[hook_z(L)][:m], tol), hook_z(L), arch)
    return z
