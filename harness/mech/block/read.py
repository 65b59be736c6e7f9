"""A bridge's weights read into the block arithmetic (mech.block.layer), in any dtype.

`build(bridge, dtype, device, s)` reads every block (norm1's affine folded into the
projections after it: norm(x) W + b = standardize(x) (diag(w_norm) W) + (b_norm W + b); the
QK-norms with Gemma's 1 + w and, for queries, the score scale in their gain; norm2 applied whole
before the MLP's own matrices, so the MLP holds no copy of them; each layer's
rotation table for positions 0..s-1, mech.block.rotary), ln_final and the unembedding, in
`dtype` on `device`, unchecked (see mech.block.fidelity).  `build_layer(w, L, torch_ln1,
torch_mlp)` rebuilds one block with the model's own norm1 or MLP module where the torch version
does not reproduce it; `attention_layer(bridge, L, s, dtype, device)` is one layer's attention
alone (the hand attention's, mech.block.attention).
Imports: mech.block.arith, mech.block.layer, mech.block.rotary, model.architecture (torch lazily).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import UnsupportedError
from ...model import architecture
from ...model.bridge import Bridge
from . import rotary
from .arith import Dense, Norm, QkNorm, activation, dnn_faster, dnn_ok, fold, output_transform, tracked
from .layer import Layer, Model


def through(module: Any) -> Callable[..., Any]:
    """A position-wise module (norm, MLP, unembedding) called on [..., d] as one [1, N, d] batch."""
    def call(x: Any) -> Any:
        y = module(x.reshape(1, -1, x.shape[-1]))
        return y.reshape(*x.shape[:-1], y.shape[-1])
    return call


def norm_module(block: Any, name: str) -> Callable[..., Any]:
    """A block's norm `name` (ln1, ln2) as `through` calls it; the identity where the model has none
    (OLMo 2 has no norm before its sublayers)."""
    module = getattr(block, name, None)
    return (lambda x: x) if module is None else through(module)


def _stacked(bridge: Bridge, name: str) -> Any:
    """bridge.W_in etc. (stacked over layers), or None when the model has none."""
    try:
        return getattr(bridge, name)
    except (AttributeError, KeyError, IndexError, RuntimeError, TypeError, ValueError):
        return None


def _norm_of(module: Any, cfg: Any, cast: Callable[..., Any]) -> Norm | None:
    """The arithmetic a TransformerLens NormalizationBridge does (None if not recognised)."""
    import torch

    if module is None:
        return Norm("none")
    comp = getattr(module, "original_component", None)
    if comp is None:
        return None
    if isinstance(comp, torch.nn.Identity):
        return Norm("none")
    rms = bool(getattr(module, "uses_rms_norm", False))
    w = getattr(comp, "weight", None)
    b = None if rms else getattr(comp, "bias", None)
    if w is not None and getattr(module, "uses_weight_offset", False):
        w = 1.0 + w
    eps: Any = getattr(comp, "eps", None) or getattr(comp, "variance_epsilon", None) or getattr(cfg, "eps", 1e-5)
    return Norm("rms" if rms else "ln", cast(w), cast(b), float(eps))


def _qk_norm(attn: Any, name: str, cfg: Any, cast: Callable[..., Any], scope: str | None,
             gain: float) -> QkNorm | None:
    """The attention's QK-norm `name` (q_norm, k_norm) with its gain times `gain` (None: none)."""
    if scope is None:
        return None
    norm = _norm_of(getattr(attn, name, None), cfg, cast)
    if norm is None or norm.kind != "rms" or norm.w is None:
        raise UnsupportedError(f"{name}: harness reproduces RMS norms with a weight on queries and keys")
    return QkNorm(scope, Norm("rms", norm.w * gain, None, norm.eps))


@dataclass
class Weights:
    """What build_layer and unembedding build from: the bridge's stacked weights (in the activations'
    dtype and device), its architecture, the torch norms, the activation, oneDNN or not."""

    bridge: Bridge
    arch: architecture.Architecture
    st: dict[str, Any]  # the unembedding: W_U, b_U
    norms: dict[str, Norm | None]  # "ln1.L", "ln2.L", "ln1_post.L", "ln2_post.L", "ln_final"
    act: tuple[Callable[..., Any], tuple[str, str]] | None
    dnn: bool
    cast: Callable[[Any], Any]

    def of(self, L: int, name: str) -> Any:
        """Layer L's W_Q, b_O, W_in, ... (None where the model has none) from the layer itself, in the
        activations' dtype and device: views of the model's parameters where the layout allows (the
        model-wide stacks would copy every layer's weights at once)."""
        part = self.bridge.blocks[L].mlp if name[2:] in ("in", "gate", "out") else self.bridge.blocks[L].attn
        try:
            value = getattr(part, name)
        except (AttributeError, KeyError, IndexError, RuntimeError, TypeError, ValueError):
            value = None
        return self.cast(value)

    def has_mlp(self, L: int) -> bool:
        return self.arch.has_mlp and getattr(self.bridge.blocks[L], "mlp", None) is not None

    def mlp_in_torch(self, L: int) -> bool:
        """Whether MLP L can be written out: a known activation, its weights exposed."""
        gate_ok = not self.arch.gated_mlp or self.of(L, "W_gate") is not None
        return self.act is not None and gate_ok and self.of(L, "W_in") is not None and self.of(L, "W_out") is not None


def _weights(bridge: Bridge, dtype: Any, device: Any, layers: tuple[int, ...] | None = None,
             unembed: bool | None = None) -> Weights:
    """The Weights of `layers` (default every layer) and the unembedding (`unembed`; default: with every
    layer, which the whole model reads)."""
    import torch

    cfg = bridge.cfg
    arch = architecture.of(bridge)

    def cast(t: Any) -> Any:
        return None if t is None else t.detach().to(dtype=dtype, device=device)

    unembed = layers is None if unembed is None else unembed
    st = {x: cast(_stacked(bridge, x)) if unembed else None for x in ("W_U", "b_U")}
    norms = {"ln_final": _norm_of(getattr(bridge, "ln_final", None), cfg, cast)}
    for L in range(cfg.n_layers) if layers is None else layers:
        block = bridge.blocks[L]
        for name in ("ln1", "ln2", "ln1_post", "ln2_post"):
            module = getattr(block, name, None)
            if module is not None or name in ("ln1", "ln2"):
                norms[f"{name}.{L}"] = _norm_of(module, cfg, cast)
    dnn = torch.device(device).type == "cpu" and dnn_faster() and dnn_ok(dtype, None)
    return Weights(bridge, arch, st, norms, activation(getattr(cfg, "act_fn", None)), dnn, cast)


def _bias(w: Weights, name: str, L: int, shape: tuple[int, ...], like: Any) -> Any:
    b = w.of(L, name)
    return b.reshape(shape) if b is not None else like.new_zeros(shape)


def _post(w: Weights, name: str, L: int, block: Any, in_torch: bool) -> Callable[..., Any] | None:
    """The norm after a sublayer (Gemma 2), in torch or the model's module; None without one."""
    if f"{name}.{L}" not in w.norms:
        return None
    norm = w.norms[f"{name}.{L}"]
    return norm if in_torch and norm is not None else through(getattr(block, name))


def build_layer(w: Weights, L: int, torch_ln1: bool = True, torch_mlp: bool = True, with_mlp: bool = True,
                rotation: tuple[Any, Any] | None = None) -> Layer:
    """Block L as arithmetic: norm1, and norm2 + MLP (+ post2), in torch when recognised and asked
    for, else the model's modules; without the MLP when not `with_mlp`; `rotation`: the layer's
    (cos, sin)."""
    import torch

    arch, block = w.arch, w.bridge.blocks[L]
    H, Hkv, dh, d = arch.n_heads, arch.n_kv_heads, arch.d_head, arch.d_model
    scale = arch.scales[L]
    norm1 = w.norms[f"ln1.{L}"] if torch_ln1 else None
    W_Q = w.of(L, "W_Q").permute(1, 0, 2).reshape(d, H * dh)
    b_Q = _bias(w, "b_Q", L, (H * dh,), W_Q)
    W_K, W_V = (w.of(L, f"W_{x}").permute(1, 0, 2).reshape(d, Hkv * dh) for x in "KV")
    b_K, b_V = (_bias(w, f"b_{x}", L, (Hkv * dh,), W_K) for x in "KV")
    qkv = Dense(*fold(norm1, torch.cat([W_Q, W_K, W_V], 1), torch.cat([b_Q, b_K, b_V])), w.dnn)
    hq, hk = H * dh, Hkv * dh
    proj = {"qkv": qkv, "q": qkv.outputs(0, hq), "k": qkv.outputs(hq, hq + hk),
            "v": qkv.outputs(hq + hk, hq + 2 * hk), "kv": qkv.outputs(hq, hq + 2 * hk)}
    ln1 = norm1.standardize if norm1 is not None else norm_module(block, "ln1")
    attn = block.attn
    q_norm = _qk_norm(attn, "q_norm", w.bridge.cfg, w.cast, arch.qk_norm, scale)
    k_norm = _qk_norm(attn, "k_norm", w.bridge.cfg, w.cast, arch.qk_norm, 1.0)
    W_O = w.of(L, "W_O")
    out = Dense(W_O.reshape(H * dh, d), w.of(L, "b_O"), w.dnn)
    mlp = _mlp(w, L, block, torch_mlp) if with_mlp else None
    return Layer(ln1, proj, W_O, out, _post(w, "ln1_post", L, block, torch_ln1), mlp, arch.parallel, Hkv,
                 arch.attn_softcap, arch.windows[L], scale, q_norm, k_norm, rotation)


def _mlp(w: Weights, L: int, block: Any, torch_mlp: bool) -> Callable[..., Any] | None:
    """What MLP L adds given the residual it reads: norm2, the MLP and post2, in torch when recognised
    and asked for, else the model's modules; None without an MLP."""
    if not w.has_mlp(L):
        return None
    post2 = _post(w, "ln2_post", L, block, torch_mlp)
    norm2 = w.norms[f"ln2.{L}"]
    if torch_mlp and norm2 is not None and w.mlp_in_torch(L):
        fc_out = Dense(w.of(L, "W_out"), w.of(L, "b_out"), w.dnn)
        b_in = w.of(L, "b_in")
        inner: Callable[..., Any]
        # norm2's affine part is applied to the activations, not folded into the weights: folded, the
        # MLP's input matrices would be copies (0.19 GiB for Gemma 3 270M), held by every arithmetic built
        if w.arch.gated_mlp:
            gate = Dense(w.of(L, "W_gate"), w.of(L, "b_gate"), w.dnn, w.act)
            up = Dense(w.of(L, "W_in"), b_in, w.dnn)

            def gated(h: Any, gate: Dense = gate, up: Dense = up, fc_out: Dense = fc_out) -> Any:
                a = gate(h)
                return fc_out(a * up(h) if tracked(a) else a.mul_(up(h)))
            inner = gated
        else:
            fc_in = Dense(w.of(L, "W_in"), b_in, w.dnn, w.act)

            def plain(h: Any, fc_in: Dense = fc_in, fc_out: Dense = fc_out) -> Any:
                return fc_out(fc_in(h))
            inner = plain

        def mlp(x: Any, norm2: Norm = norm2, inner: Callable[..., Any] = inner,
                post2: Callable[..., Any] | None = post2) -> Any:
            y = inner(norm2(x))
            return y if post2 is None else post2(y)
        return mlp
    ln2, module = norm_module(block, "ln2"), through(block.mlp)

    def modules(x: Any, ln2: Callable[..., Any] = ln2, module: Callable[..., Any] = module,
                post2: Callable[..., Any] | None = post2) -> Any:
        y = module(ln2(x))
        return y if post2 is None else post2(y)
    return modules


def unembedding(w: Weights, in_torch: bool = True) -> Callable[..., Any]:
    """Final residual -> logits: ln_final, the unembedding, the output transform; in torch, or the
    model's modules."""
    norm = w.norms["ln_final"]
    bridge = w.bridge
    if in_torch and norm is not None and w.st["W_U"] is not None:
        unembed = Dense(w.st["W_U"], w.st["b_U"], w.dnn)  # not folded: W_U^T is the (tied) embedding, no copy
        return lambda x: output_transform(bridge, unembed(norm(x)))
    ln_final, unembed_module = through(bridge.ln_final), through(bridge.unembed)
    return lambda x: output_transform(bridge, unembed_module(ln_final(x)))


def token_logits(w: Weights) -> Callable[..., Any] | None:
    """(final residual x [E, n, k, d], token ids t [n, k, c]) -> out [E, n, k, c] with
    out[e, a, b, j] = T(ln_final(x[e, a, b]) . W_U[:, t[a, b, j]] + b_U[t[a, b, j]]) (T the output
    transform, elementwise): the unembedding's columns of those tokens only; None where the
    unembedding is not in torch (unembedding's modules then, through Model.logits_of)."""
    import torch

    norm, W_U, b_U = w.norms["ln_final"], w.st["W_U"], w.st["b_U"]
    if norm is None or W_U is None:
        return None
    bridge = w.bridge

    def columns(x: Any, tokens: Any) -> Any:
        out = torch.einsum("enkd,nkcd->enkc", norm(x), W_U.t()[tokens])
        return output_transform(bridge, out if b_U is None else out + b_U[tokens])
    return columns


def build(bridge: Bridge, dtype: Any, device: Any, s: int) -> tuple[Model, Weights]:
    """The torch arithmetic of every block, ln_final and the unembedding, in `dtype` on `device`, with
    each layer's rotation table for positions 0..s-1 (unchecked: see mech.block.fidelity)."""
    w = _weights(bridge, dtype, device)
    tables = rotary.tables(bridge, s, dtype, device)
    layers = [build_layer(w, L, rotation=tables[L]) for L in range(bridge.cfg.n_layers)]
    return Model(layers, unembedding(w), bridge.cfg.n_heads, bridge.cfg.d_head, token_logits(w)), w


def build_unembedding(bridge: Bridge, dtype: Any, device: Any) -> tuple[Model, Weights]:
    """ln_final and the unembedding alone, as a Model without layers (what edges into the logits read:
    the final residual is the cached one plus the sender's change), unchecked like `build`."""
    w = _weights(bridge, dtype, device, layers=(), unembed=True)
    return Model([], unembedding(w), bridge.cfg.n_heads, bridge.cfg.d_head, token_logits(w)), w


def attention_layer(bridge: Bridge, L: int, s: int, dtype: Any, device: Any) -> Layer:
    """Layer L's norm1, projections, QK-norms and rotation (positions 0..s-1) in `dtype` on `device`,
    without its MLP (the hand attention's arithmetic)."""
    w = _weights(bridge, dtype, device, layers=(L,))
    return build_layer(w, L, with_mlp=False, rotation=rotary.tables(bridge, s, dtype, device)[L])
