"""The model's arithmetic written out in torch, for the batched edge sweep
(mech.edges.batched): norms (LayerNorm, RMSNorm), dense layers with their activations
(oneDNN's fused linear on the CPU in float32), plain and gated MLPs, attention (rotary
positions, grouped key/value heads, soft caps, sliding windows: the features of
model.architecture), sequential and parallel blocks with or without norms after each
sublayer, and the unembedding with the model's output transform.  The affine part of
norm1 and norm2 is folded into the linear map after it:

    norm(x) W + b = standardize(x) (diag(w_norm) W) + (b_norm W + b)

A block, with P = sum_h z_h W_O[h] + b_O its attention sum and post1, post2 the norms
after the sublayers where the model has them (else the identity):

    sequential: mid = x + post1(P(norm1(x))),   post = mid + post2(MLP(norm2(mid)))
    parallel:   post = x + post1(P(norm1(x))) + post2(MLP(norm2(x)))

This module is the arithmetic; `mech.torch_weights.build` reads a bridge's weights into
these pieces, and `mech.block.fidelity.check` holds them to the model's own modules and cached
activations.  Imports: mech.block.attention (torch lazily).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .attention import rotate


def gelu_tanh(x: Any) -> Any:
    """GELU (tanh approximation) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
    the sigmoid form, torch's CPU tanh being several times slower than its sigmoid."""
    import torch

    c = 2 * math.sqrt(2 / math.pi)
    t = torch.addcmul(x.new_full((), c), x, x, value=0.044715 * c)  # 2u / x
    if tracked(x):  # autograd needs the intermediate values kept: no in-place steps
        return x * torch.sigmoid(t * x)
    return t.mul_(x).sigmoid_().mul_(x)


def tracked(x: Any) -> bool:
    """Whether autograd records operations on x (mech.graph.attribution differentiates through these
    functions; in-place steps and oneDNN's fused linear are then avoided)."""
    import torch

    return torch.is_grad_enabled() and bool(x.requires_grad)


def activation(name: str | None) -> tuple[Callable[..., Any], tuple[str, str]] | None:
    """(torch function, oneDNN post-op (attr, algorithm)) of a TransformerLens act_fn name."""
    import torch.nn.functional as F

    table: dict[str, tuple[Callable[..., Any], tuple[str, str]]] = {
        "gelu_new": (gelu_tanh, ("gelu", "tanh")), "gelu_fast": (gelu_tanh, ("gelu", "tanh")),
        "gelu_pytorch_tanh": (gelu_tanh, ("gelu", "tanh")), "gelu": (F.gelu, ("gelu", "none")),
        "relu": (F.relu, ("relu", "")), "silu": (F.silu, ("swish", "")), "swish": (F.silu, ("swish", ""))}
    return table.get(name or "")


@dataclass
class Norm:
    """y = standardize(x) w + b, standardize(x) = c(x) / sqrt(mean(c(x)^2) + eps); c(x) = x - mean(x)
    for LayerNorm (kind "ln"), c(x) = x for RMS norms ("rms"); "none": y = x.  For LN1 and LN2
    the affine part (w, b) is folded into the linear map that follows (see fold)."""

    kind: str
    w: Any = None
    b: Any = None
    eps: float = 0.0

    def standardize(self, x: Any) -> Any:
        import torch

        if self.kind == "none":
            return x
        c = x - x.mean(-1, keepdim=True) if self.kind == "ln" else x
        if tracked(x):
            return c * (c.square().mean(-1, keepdim=True) + self.eps).rsqrt()
        r = torch.linalg.vector_norm(c, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(self.eps).rsqrt_()
        return c.mul_(r) if self.kind == "ln" else c * r

    def standardize_vjp(self, y: Any, x: Any, g: Any) -> Any:
        """d L / d x from g = d L / d standardize(x) (y = standardize(x), r = 1 / sqrt(mean(c^2) + eps)):
        rms  r (g - y mean(g y));  ln  r (g - mean(g) - y mean(g y));  none  g.  g may carry extra
        axes before the last (several readers of the same x); x and y broadcast against it."""
        if self.kind == "none":
            return g
        c = x - x.mean(-1, keepdim=True) if self.kind == "ln" else x
        r = (c.square().mean(-1, keepdim=True) + self.eps).rsqrt()
        out = g - y * (g * y).mean(-1, keepdim=True)
        if self.kind == "ln":
            out = out - g.mean(-1, keepdim=True)
        return r * out

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
    linear with the activation fused (W kept only as oneDNN's layout W^T [out, in]), which
    on some CPUs runs faster kernels than torch's own float32 matmul (docs/performance.md)."""

    def __init__(self, W: Any, b: Any, dnn: bool, act: tuple[Callable[..., Any], tuple[str, str]] | None = None):
        self.b, self.act = b, act
        self.Wt = W.t().contiguous() if dnn and dnn_ok(W.dtype, act) else None  # no copy if W^T is contiguous
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

        if self.Wt is not None and tracked(x):
            y = torch.nn.functional.linear(x, self.Wt, self.b)
            return y if self.act is None else self.act[0](y)
        if self.Wt is not None:
            attr, algorithm = self.act[1] if self.act is not None else ("none", "")
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.Wt, self.b, attr, [], algorithm)
        W: Any = self.W
        flat = x.reshape(-1, x.shape[-1])
        y = (flat @ W if self.b is None else torch.addmm(self.b, flat, W)).view(*x.shape[:-1], -1)
        return y if self.act is None else self.act[0](y)


@functools.cache
def dnn_ok(dtype: Any, act: tuple[Callable[..., Any], tuple[str, str]] | None) -> bool:
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


def fold(norm: Norm | None, W: Any, b: Any) -> tuple[Any, Any]:
    """norm(x) W + b = standardize(x) W' + b':  W' = diag(w) W, b' = b_norm W + b (no norm: W, b)."""
    if norm is None:
        return W, b
    Wf = W if norm.w is None else norm.w[:, None] * W
    bf = b if norm.b is None else (norm.b @ W if b is None else b + norm.b @ W)
    return Wf, bf


@dataclass
class Layer:
    """One block as arithmetic.

    ln1(x): standardize(x) (norm1's affine folded into proj) or the model's norm1 module;
    proj[x] for x in q, k, v, qkv, kv: ln1's output -> those inputs of every head, pre-rotation
    [..., H dh] for q (W_Q and b_Q times the score scale), [..., H_kv dh] for k and v;
    W_O [H, dh, d]; out: z [..., H dh] -> P = sum_h z_h W_O[h] + b_O; post1: the norm after
    the attention (None: none); mlp(x): what the MLP adds given the residual it reads
    (norm2, MLP, post2; None: no MLP); parallel: the MLP reads the block's input."""

    ln1: Callable[..., Any]
    proj: dict[str, Dense]
    W_O: Any
    out: Dense
    post1: Callable[..., Any] | None
    mlp: Callable[..., Any] | None
    parallel: bool
    n_kv: int
    cap: float | None  # soft cap on the scores
    window: int | None  # sliding window (None: every earlier key)

    def attn_out(self, P: Any) -> Any:
        """What the attention adds to the residual given its sum P."""
        return P if self.post1 is None else self.post1(P)

    def finish(self, x: Any, attn_out: Any, mlp_x: Any = None) -> Any:
        """resid_post from the block's input x and its attention output; `mlp_x`: the MLP's
        output when it reads x (parallel blocks; computed here when not given)."""
        if self.parallel:
            if self.mlp is None:
                return x + attn_out
            return x + attn_out + (self.mlp(x) if mlp_x is None else mlp_x)
        mid = x + attn_out
        return mid if self.mlp is None else mid + self.mlp(mid)


@dataclass
class Model:
    layers: list[Layer]
    logits: Callable[..., Any]  # final residual -> the model's output transform of unembed(ln_final(.))
    n_heads: int
    d_head: int
    rotation: tuple[Any, Any] | None = None  # (cos, sin) [1 or n, s, r] of the run (rotary models)

    def rotate(self, x: Any, positions: Any = None) -> Any:
        """x [..., s or k, dh] rotated at positions 0..s-1, or at `positions` [n, k] (scored queries:
        x [E, n, H, k, dh]); the identity without rotary positions."""
        if self.rotation is None:
            return x
        cos, sin = self.rotation
        if positions is not None:
            n, k = positions.shape
            idx = positions.reshape(n, k, 1).expand(n, k, cos.shape[-1])
            cos = cos.expand(n, -1, -1).gather(1, idx)[None, :, None]  # [1, n, 1, k, r]
            sin = sin.expand(n, -1, -1).gather(1, idx)[None, :, None]
            return rotate(x, cos, sin)
        s = x.shape[-2]
        return rotate(x, cos[..., :s, :], sin[..., :s, :])


def causal(s: int, ref: Any) -> Any:
    """Additive causal mask [s, s]: 0 on and below the diagonal, -inf above."""
    return mask(s, None, ref)


def mask(s: int, window: int | None, ref: Any) -> Any:
    """Additive mask [s, s]: 0 where key j is visible from query i (j <= i and i - j < window), -inf elsewhere."""
    import torch

    i = torch.arange(s, device=ref.device)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep &= (i[:, None] - i[None, :]) < window
    return torch.zeros(s, s, dtype=ref.dtype, device=ref.device).masked_fill(~keep, float("-inf"))


def scored_mask(positions: Any, s: int, window: int | None, ref: Any) -> Any:
    """[n, k, s] additive: key j is visible to the query at scored position p iff j <= p (and p - j < window)."""
    import torch

    j = torch.arange(s, device=ref.device)[None, None, :]
    p = positions[:, :, None]
    hidden = j > p
    if window is not None:
        hidden |= (p - j) >= window
    return torch.zeros(hidden.shape, dtype=ref.dtype, device=ref.device).masked_fill(hidden, float("-inf"))


def attend(q: Any, k: Any, v: Any, bias: Any, cap: float | None = None) -> Any:
    """softmax(cap(q k^T) + bias) v over the last two dims, q [..., H, sq, dh] already scaled (and
    rotated), k and v [..., H or H_kv, s, dh] (key/value heads repeated over their query heads'
    groups), bias [sq, s] or broadcasting to [..., sq, s] (0 or -inf); cap: c tanh(x / c).  As
    3-D batched products (4-D matmuls of permuted views are several times slower on CPU)."""
    import torch

    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    lead, sq, s = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    scores = torch.bmm(q3, k3.transpose(1, 2))
    if cap and tracked(scores):
        scores = torch.tanh(scores / cap) * cap
    elif cap:
        scores = scores.div_(cap).tanh_().mul_(cap)
    scores.view(*lead, sq, s).add_(bias)
    return torch.bmm(torch.softmax(scores, dim=-1), v3).view(*lead, sq, v.shape[-1])


def block(model: Model, lay: Layer, x: Any, bias: Any) -> Any:
    """A whole block at every position: x [B, s, d] -> resid_post [B, s, d]; `bias` its mask [s, s]."""
    H, dh = model.n_heads, model.d_head
    B, s, d = x.shape
    h = lay.ln1(x)
    q = model.rotate(lay.proj["q"](h).view(B, s, H, dh).transpose(1, 2))
    kv = lay.proj["kv"](h).view(B, s, 2, lay.n_kv, dh).permute(2, 0, 3, 1, 4)
    k, v = model.rotate(kv[0]), kv[1]
    z = attend(q.contiguous(), k.contiguous(), v.contiguous(), bias, lay.cap).transpose(1, 2)  # [B, s, H, dh]
    return lay.finish(x, lay.attn_out(lay.out(z.reshape(B, s, H * dh))))


def block_at(model: Model, lay: Layer, x: Any, positions: Any, scored: Any) -> Any:
    """The last block at the scored positions only: x [E, n, s, d] -> resid_post [E, n, k, d]
    (keys and values at every position, queries and everything after at the scored ones);
    `scored` its mask [n, k, s]."""
    H, dh = model.n_heads, model.d_head
    E, n, s, d = x.shape
    k_ = positions.shape[1]
    h = lay.ln1(x)
    kv = lay.proj["kv"](h).view(E, n, s, 2, lay.n_kv, dh).permute(3, 0, 1, 4, 2, 5)  # [2, E, n, Hkv, s, dh]
    k, v = model.rotate(kv[0]).contiguous(), kv[1].contiguous()
    q = lay.proj["q"](at(positions, h)).view(E, n, k_, H, dh).transpose(2, 3)
    q = model.rotate(q, positions).contiguous()
    z = attend(q, k, v, scored[:, None], lay.cap).transpose(2, 3)  # [E, n, k, H, dh]
    attn = lay.attn_out(lay.out(z.reshape(E, n, k_, H * dh)))
    return lay.finish(at(positions, x), attn, lay.mlp(at(positions, x)) if lay.parallel and lay.mlp else None)


def at(positions: Any, x: Any) -> Any:
    """x [E, n, s, ...] -> [E, n, k, ...] at the scored positions."""
    idx = positions.reshape(1, *positions.shape, *([1] * (x.dim() - 3)))
    return x.gather(2, idx.expand(x.shape[0], -1, -1, *x.shape[3:]))
