"""The model's arithmetic written out in torch, for the batched edge sweep
(mech.batched_edges): LayerNorm, dense layers with their activations (oneDNN's fused
linear on the CPU in float32), attention, whole blocks and the unembedding, with the
affine part of LN1 and LN2 folded into the linear map after it:

    norm(x) W + b = standardize(x) (diag(w_norm) W) + (b_norm W + b)

`build` reads a bridge's weights into these pieces; `check` holds them to the model's
own modules and cached activations on a few prompts of the base run (CHECK_PROMPTS): a
norm, MLP or unembedding that does not reproduce its module falls back to calling the
module; attention or a block that does not reproduce the cache raises
UnsupportedError.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedError
from ..spec.names import hook_attn_out, hook_input, hook_resid_post, hook_resid_pre, hook_z
from .patching import attn_scale

CHECK_PROMPTS = 2  # prompts of the base run the torch arithmetic is checked on



def gelu_tanh(x: Any) -> Any:
    """GELU (tanh approximation) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
    the sigmoid form, torch's CPU tanh being several times slower than its sigmoid."""
    import torch

    c = 2 * math.sqrt(2 / math.pi)
    t = torch.addcmul(x.new_full((), c), x, x, value=0.044715 * c)  # 2u / x
    return t.mul_(x).sigmoid_().mul_(x)


def activation(name: str | None) -> tuple[Callable, tuple[str, str]] | None:
    """(torch function, oneDNN post-op (attr, algorithm)) of a TransformerLens act_fn name."""
    import torch.nn.functional as F

    table: dict[str, tuple[Callable, tuple[str, str]]] = {
        "gelu_new": (gelu_tanh, ("gelu", "tanh")), "gelu_fast": (gelu_tanh, ("gelu", "tanh")),
        "gelu_pytorch_tanh": (gelu_tanh, ("gelu", "tanh")), "gelu": (F.gelu, ("gelu", "none")),
        "relu": (F.relu, ("relu", "")), "silu": (F.silu, ("swish", "")), "swish": (F.silu, ("swish", ""))}
    return table.get(name or "")


@dataclass
class _Norm:
    """y = standardize(x) w + b, standardize(x) = c(x) / sqrt(mean(c(x)^2) + eps); c(x) = x - mean(x)
    for LayerNorm (kind "ln"), c(x) = x for RMS norms ("rms"); "none": y = x.  For LN1 and LN2
    the affine part (w, b) is folded into the linear map that follows (see _fold)."""

    kind: str
    w: Any = None
    b: Any = None
    eps: float = 0.0

    def standardize(self, x: Any) -> Any:
        import torch

        if self.kind == "none":
            return x
        c = x - x.mean(-1, keepdim=True) if self.kind == "ln" else x
        r = torch.linalg.vector_norm(c, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(self.eps).rsqrt_()
        return c.mul_(r) if self.kind == "ln" else c * r

    def __call__(self, x: Any) -> Any:
        import torch

        y = self.standardize(x)
        if self.w is not None and self.b is not None:
            return torch.addcmul(self.b, y, self.w)
        y = y if self.w is None else y * self.w
        return y if self.b is None else y + self.b


class Dense:
    """y = act(x W + b) for a fixed W [in, out], b [out] (or None), act (or None).

    On the CPU in float32, when this torch has it and it agrees with addmm, by oneDNN's
    linear with the activation fused (W kept only as oneDNN's layout W^T [out, in]):
    torch's own float32 matmul calls MKL, whose kernels on AMD CPUs are AVX2 ones, about
    half the speed of oneDNN's AVX-512 ones there."""

    def __init__(self, W: Any, b: Any, dnn: bool, act: tuple[Callable, tuple[str, str]] | None = None):
        self.b, self.act = b, act
        self.Wt = W.t().contiguous() if dnn and _dnn_ok(W.dtype, act) else None  # no copy if W^T is contiguous
        self.W = None if self.Wt is not None else W

    def outputs(self, lo: int, hi: int) -> Dense:
        """The map to outputs lo:hi only (sharing this one's weights)."""
        part = Dense.__new__(Dense)
        part.act = self.act
        part.b = None if self.b is None else self.b[lo:hi]
        part.Wt = None if self.Wt is None else self.Wt[lo:hi]
        part.W = None if self.W is None else self.W[:, lo:hi]
        return part

    def __call__(self, x: Any) -> Any:
        import torch

        if self.Wt is not None:
            attr, algorithm = self.act[1] if self.act is not None else ("none", "")
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.Wt, self.b, attr, [], algorithm)
        W: Any = self.W
        flat = x.reshape(-1, x.shape[-1])
        y = (flat @ W if self.b is None else torch.addmm(self.b, flat, W)).view(*x.shape[:-1], -1)
        return y if self.act is None else self.act[0](y)


@functools.cache
def _dnn_ok(dtype: Any, act: tuple[Callable, tuple[str, str]] | None) -> bool:
    """Whether oneDNN's linear (with this activation fused) runs here and agrees with torch on a trial
    (once per dtype and activation)."""
    import torch

    if dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    g = torch.Generator().manual_seed(0)
    x, W, b = (torch.randn(*shape, generator=g) for shape in ((33, 24), (24, 40), (40,)))
    attr, algorithm = act[1] if act is not None else ("none", "")
    try:
        y = torch.ops.mkldnn._linear_pointwise(x, W.t().contiguous(), b, attr, [], algorithm)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    want = torch.addmm(b, x, W)
    want = want if act is None else act[0](want)
    return y.shape == want.shape and bool(torch.allclose(y, want, rtol=1e-5, atol=1e-5))


def _fold(norm: _Norm | None, W: Any, b: Any) -> tuple[Any, Any]:
    """norm(x) W + b = standardize(x) W' + b':  W' = diag(w) W, b' = b_norm W + b (no norm: W, b)."""
    if norm is None:
        return W, b
    Wf = W if norm.w is None else norm.w[:, None] * W
    bf = b if norm.b is None else (norm.b @ W if b is None else b + norm.b @ W)
    return Wf, bf


def _through(module: Any) -> Callable:
    """A position-wise module (norm, MLP, unembedding) called on [..., d] as one [1, N, d] batch."""
    def call(x: Any) -> Any:
        y = module(x.reshape(1, -1, x.shape[-1]))
        return y.reshape(*x.shape[:-1], y.shape[-1])
    return call


@dataclass
class Layer:
    """One block as arithmetic.

    ln1(x): standardize(x) (LN1's affine folded into proj) or the model's LN1 module;
    proj[x] for x in q, k, v, qkv, kv: ln1's output -> those inputs of every head
    [..., (1-3) H dh] (W_Q and b_Q divided by the attention scale); W_O [H, dh, d];
    out: z [..., H dh] -> sum_h z_h W_O[h] + b_O; mlp(mid) = MLP(LN2(mid)) (None: no MLP)."""

    ln1: Callable
    proj: dict[str, Dense]
    W_O: Any
    out: Dense
    mlp: Callable | None
    scale: float

    def after_attention(self, mid: Any) -> Any:
        """post = mid + MLP(LN2(mid)) (mid without an MLP)."""
        return mid if self.mlp is None else mid + self.mlp(mid)


@dataclass
class Model:
    layers: list[Layer]
    logits: Callable  # final residual -> unembed(ln_final(.))
    n_heads: int
    d_head: int


def _stacked(bridge: Any, name: str) -> Any:
    """bridge.W_in etc. (stacked over layers), or None when the model has none."""
    try:
        return getattr(bridge, name)
    except (AttributeError, KeyError, IndexError, RuntimeError, TypeError, ValueError):
        return None


def _norm_of(module: Any, cfg: Any, cast: Callable) -> _Norm | None:
    """The arithmetic a TransformerLens NormalizationBridge does (None if not recognised)."""
    import torch

    if module is None:
        return _Norm("none")
    comp = getattr(module, "original_component", None)
    if comp is None:
        return None
    if isinstance(comp, torch.nn.Identity):
        return _Norm("none")
    rms = bool(getattr(module, "uses_rms_norm", False))
    w = getattr(comp, "weight", None)
    b = None if rms else getattr(comp, "bias", None)
    if w is not None and getattr(module, "uses_weight_offset", False):
        w = 1.0 + w
    eps: Any = getattr(comp, "eps", None) or getattr(comp, "variance_epsilon", None) or getattr(cfg, "eps", 1e-5)
    return _Norm("rms" if rms else "ln", cast(w), cast(b), float(eps))


@dataclass
class _Weights:
    """What _layer and _logits build from: the bridge's stacked weights (in the activations'
    dtype and device), its config, the torch norms, the activation, oneDNN or not."""

    bridge: Any
    st: dict[str, Any]
    norms: dict[str, _Norm | None]  # "ln1.L", "ln2.L", "ln_final"
    act: tuple[Callable, tuple[str, str]] | None
    dnn: bool

    def has_mlp(self, L: int) -> bool:
        cfg = self.bridge.cfg
        return not getattr(cfg, "attn_only", False) and getattr(self.bridge.blocks[L], "mlp", None) is not None

    def mlp_in_torch(self, L: int) -> bool:
        """Whether MLP L can be written out: a known activation, not gated, weights exposed."""
        return (self.act is not None and not bool(getattr(self.bridge.cfg, "gated_mlp", False))
                and self.st["W_in"] is not None and self.st["W_out"] is not None)


def _weights(bridge: Any, dtype: Any, device: Any) -> _Weights:
    import torch

    cfg = bridge.cfg

    def cast(t: Any) -> Any:
        return None if t is None else t.detach().to(dtype=dtype, device=device)

    st = {x: cast(_stacked(bridge, x)) for x in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O", "W_in",
                                                 "b_in", "W_out", "b_out", "W_U", "b_U")}
    norms = {"ln_final": _norm_of(getattr(bridge, "ln_final", None), cfg, cast)}
    for L in range(cfg.n_layers):
        block = bridge.blocks[L]
        norms[f"ln1.{L}"] = _norm_of(getattr(block, "ln1", None), cfg, cast)
        norms[f"ln2.{L}"] = _norm_of(getattr(block, "ln2", None), cfg, cast)
    dnn = torch.device(device).type == "cpu" and _dnn_ok(dtype, None)
    return _Weights(bridge, st, norms, activation(getattr(cfg, "act_fn", None)), dnn)


def _layer(w: _Weights, L: int, torch_ln1: bool = True, torch_mlp: bool = True) -> Layer:
    """Block L as arithmetic: LN1 and LN2 + MLP in torch when recognised and asked for, else
    the model's modules."""
    import torch

    cfg, st, block = w.bridge.cfg, w.st, w.bridge.blocks[L]
    H, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    scale = attn_scale(cfg)
    norm1 = w.norms[f"ln1.{L}"] if torch_ln1 else None
    hd = H * dh
    W = torch.cat([st[f"W_{x.upper()}"][L].permute(1, 0, 2).reshape(d, hd) / (scale if x == "q" else 1.0)
                   for x in "qkv"], dim=1)  # [d, 3 H dh]
    b = torch.cat([st[f"b_{x.upper()}"][L].reshape(hd) / (scale if x == "q" else 1.0) for x in "qkv"])
    qkv = Dense(*_fold(norm1, W, b), w.dnn)
    proj = {"qkv": qkv, "q": qkv.outputs(0, hd), "k": qkv.outputs(hd, 2 * hd), "v": qkv.outputs(2 * hd, 3 * hd),
            "kv": qkv.outputs(hd, 3 * hd)}
    ln1 = norm1.standardize if norm1 is not None else _through(block.ln1)
    mlp: Callable | None = None
    if w.has_mlp(L):
        norm2 = w.norms[f"ln2.{L}"]
        if torch_mlp and norm2 is not None and w.mlp_in_torch(L):
            fc_in = Dense(*_fold(norm2, st["W_in"][L], st["b_in"][L]), w.dnn, w.act)
            fc_out = Dense(st["W_out"][L], st["b_out"][L], w.dnn)

            def mlp(mid: Any, norm2: _Norm = norm2, fc_in: Dense = fc_in, fc_out: Dense = fc_out) -> Any:
                return fc_out(fc_in(norm2.standardize(mid)))
        else:
            ln2, module = _through(block.ln2), _through(block.mlp)

            def mlp(mid: Any, ln2: Callable = ln2, module: Callable = module) -> Any:
                return module(ln2(mid))
    out = Dense(st["W_O"][L].reshape(H * dh, d), st["b_O"][L], w.dnn)
    return Layer(ln1, proj, st["W_O"][L], out, mlp, scale)


def _logits(w: _Weights, in_torch: bool = True) -> Callable:
    """Final residual -> logits: ln_final, then the unembedding; in torch, or the model's modules."""
    norm = w.norms["ln_final"]
    if in_torch and norm is not None and w.st["W_U"] is not None:
        unembed = Dense(w.st["W_U"], w.st["b_U"], w.dnn)  # not folded: W_U^T is the (tied) embedding, no copy
        return lambda x: unembed(norm(x))
    ln_final, unembed_module = _through(w.bridge.ln_final), _through(w.bridge.unembed)
    return lambda x: unembed_module(ln_final(x))


def build(bridge: Any, dtype: Any, device: Any) -> tuple[Model, _Weights]:
    """The torch arithmetic of every block, ln_final and the unembedding, in the activations'
    dtype and device (unchecked: see check)."""
    w = _weights(bridge, dtype, device)
    layers = [_layer(w, L) for L in range(bridge.cfg.n_layers)]
    return Model(layers, _logits(w), bridge.cfg.n_heads, bridge.cfg.d_head), w


def tolerance(dtype: Any) -> float:
    import torch

    return {torch.float64: 1e-8, torch.float32: 1e-4}.get(dtype, 3e-2)


def _off(a: Any, b: Any, tol: float) -> float | None:
    """max |a - b| when it exceeds tol * (1 + max |b|), else None."""
    diff = float((a - b).abs().max())
    return diff if diff > tol * (1 + float(b.abs().max())) else None


def _require(diff: float | None, what: str) -> None:
    if diff is not None:
        raise UnsupportedError(f"batched edge patching: {what} recomputed from the cached activations differs from "
                               f"the model's by {diff:.3g}; the batched path handles blocks resid + attention "
                               "(learned positions, causal softmax), then + MLP(LN2(.)), only")


def check(model: Model, w: _Weights, base: dict, tol: float) -> None:
    """Hold the torch arithmetic to the model on the first prompts of the base run.

    LN1, LN2 + MLP and ln_final + unembed are compared with the model's modules and
    replaced by them where they differ; q/k/v, z and attn_out of every layer, each block's
    output and the logits are compared with the cache (UnsupportedError where they differ)."""
    m = CHECK_PROMPTS
    bridge = w.bridge
    L_last = len(model.layers) - 1
    for L in range(len(model.layers)):
        block, lay = bridge.blocks[L], model.layers[L]
        pre = base[hook_resid_pre(L)][:m]
        mid = pre + base[hook_attn_out(L)][:m]
        norm1 = w.norms[f"ln1.{L}"]
        torch_ln1 = norm1 is not None and _off(norm1(pre), _through(block.ln1)(pre), tol) is None
        torch_mlp = lay.mlp is None or _off(lay.mlp(mid), _through(block.mlp)(_through(block.ln2)(mid)), tol) is None
        if not (torch_ln1 and torch_mlp):
            model.layers[L] = lay = _layer(w, L, torch_ln1, torch_mlp)
        z = _check_attention(lay, L, pre, base, tol, model.n_heads, model.d_head)
        _require(_off(lay.out(z.reshape(*z.shape[:-2], -1)), base[hook_attn_out(L)][:m], tol), hook_attn_out(L))
        nxt = hook_resid_pre(L + 1) if L < L_last else hook_resid_post(L)
        _require(_off(lay.after_attention(mid), base[nxt][:m], tol), f"{nxt} (as resid_mid + MLP(LN2(resid_mid)))")
    final = base[hook_resid_post(L_last)][:m]
    if _off(model.logits(final), bridge.unembed(bridge.ln_final(final)), tol) is not None:
        model.logits = _logits(w, in_torch=False)
    if "logits" in base:
        _require(_off(model.logits(final), base["logits"][:m], tol), "the logits (ln_final, unembed)")


def _check_attention(lay: Layer, L: int, pre: Any, base: dict, tol: float, H: int, dh: int) -> Any:
    """q/k/v and z of layer L recomputed from resid_pre [m, s, d] and compared with the cache;
    returns z [m, s, H, dh]."""
    m, s, _ = pre.shape
    h = lay.ln1(pre)
    qkv = {x: lay.proj[x](h).view(m, s, H, dh) for x in "qkv"}
    for x in "qkv":
        _require(_off(qkv[x] * (lay.scale if x == "q" else 1.0), base[hook_input(L, x)][:m], tol), hook_input(L, x))
    z = attend(qkv["q"].transpose(1, 2), qkv["k"].transpose(1, 2), qkv["v"].transpose(1, 2),
                causal(s, pre)).transpose(1, 2)
    _require(_off(z, base[hook_z(L)][:m], tol), hook_z(L))
    return z


def causal(s: int, ref: Any) -> Any:
    """Additive causal mask [s, s]: 0 on and below the diagonal, -inf above."""
    import torch

    keep = torch.ones(s, s, dtype=torch.bool, device=ref.device).tril()
    return torch.zeros(s, s, dtype=ref.dtype, device=ref.device).masked_fill(~keep, float("-inf"))


def attend(q: Any, k: Any, v: Any, bias: Any) -> Any:
    """softmax(q k^T + bias) v over the last two dims, q [..., sq, dh] already divided by the
    attention scale, bias [sq, s] or broadcasting to [..., sq, s] (0 or -inf).  As 3-D
    batched products (4-D matmuls of permuted views are several times slower on CPU)."""
    import torch

    lead, sq, s = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    scores = torch.bmm(q3, k3.transpose(1, 2))
    scores.view(*lead, sq, s).add_(bias)
    return torch.bmm(torch.softmax(scores, dim=-1), v3).view(*lead, sq, v.shape[-1])


def block(lay: Layer, x: Any, causal: Any, H: int, dh: int) -> Any:
    """A whole block at every position: x [B, s, d] -> resid_post [B, s, d]."""
    B, s, d = x.shape
    q, k, v = lay.proj["qkv"](lay.ln1(x)).view(B, s, 3, H, dh).permute(2, 0, 3, 1, 4).contiguous()  # [B, H, s, dh]
    z = attend(q, k, v, causal).transpose(1, 2)  # [B, s, H, dh]
    return lay.after_attention(x + lay.out(z.reshape(B, s, H * dh)))


def block_at(lay: Layer, x: Any, positions: Any, scored_mask: Any, H: int, dh: int) -> Any:
    """The last block at the scored positions only: x [E, n, s, d] -> resid_post [E, n, k, d]
    (keys and values at every position, queries and everything after at the scored ones)."""
    E, n, s, d = x.shape
    k_ = positions.shape[1]
    h = lay.ln1(x)
    k, v = lay.proj["kv"](h).view(E, n, s, 2, H, dh).permute(3, 0, 1, 4, 2, 5).contiguous()  # [E, n, H, s, dh]
    q = lay.proj["q"](at(positions, h)).view(E, n, k_, H, dh).transpose(2, 3).contiguous()
    z = attend(q, k, v, scored_mask[:, None]).transpose(2, 3)  # [E, n, k, H, dh]
    return lay.after_attention(at(positions, x) + lay.out(z.reshape(E, n, k_, H * dh)))


def at(positions: Any, x: Any) -> Any:
    """x [E, n, s, ...] -> [E, n, k, ...] at the scored positions."""
    idx = positions.reshape(1, *positions.shape, *([1] * (x.dim() - 3)))
    return x.gather(2, idx.expand(x.shape[0], -1, -1, *x.shape[3:]))
