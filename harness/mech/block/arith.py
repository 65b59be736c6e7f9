"""The pieces of a block's arithmetic, each written once: the causal (sliding-window) mask,
attention, the rotation, norms (the QK-norm included), dense layers with their activations,
and the model's transform after the unembedding.  Every path that recomputes part of a forward
pass (mech.block.layer's blocks, the hand attention of mech.block.attention, the edge graph,
attribution) calls these; dtypes and devices are the inputs'.

    mask:      bias[i, j] = 0 if j <= p_i and p_i - j < window (p_i: query i's position), else -inf
    attend:    z = softmax(cap(q k^T) + bias) v,   cap(x) = c tanh(x / c)  (q already scaled)
    rotate:    rot(x) = x cos_p + rotate_half(x) sin_p on the first r dimensions of each head,
               rotate_half([a, b]) = [-b, a]   (the halves convention of Llama and GPT-NeoX)
    Norm:      y = standardize(x) w + b,  standardize(x) = c(x) / sqrt(mean(c(x)^2) + eps),
               c(x) = x - mean(x) (LayerNorm) or x (RMSNorm)
    QkNorm:    a Norm over each head's d_head values ("head": Qwen3, Gemma 3) or over all heads'
               values of a layer at once ("projection": OLMo 2), on queries or keys after their
               projection and before the rotation
    Dense:     y = act(x W + b)

`fold` moves a norm's affine part into the linear map after it:
norm(x) W + b = standardize(x) (diag(w) W) + (b_norm W + b).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxtyping import Float, Int
    from torch import Tensor

from ...model.bridge import Bridge


def tracked(x: Any) -> bool:
    """Whether autograd records operations on x (mech.graph.attribution differentiates through these
    functions; in-place steps and oneDNN's fused linear are then avoided)."""
    import torch

    return torch.is_grad_enabled() and bool(x.requires_grad)


def mask(positions: Int[Tensor, "*n sq"], s: int, window: int | None, ref: Tensor) -> Float[Tensor, "*n sq s"]:
    """Additive mask of the queries at `positions` ([sq] or per prompt [n, sq], int) over keys
    0..s-1: [sq, s] or [n, sq, s], 0 where key j is visible (j <= p and p - j < window), -inf
    elsewhere; in ref's dtype on ref's device."""
    import torch

    j = torch.arange(s, device=ref.device)
    p = positions.to(ref.device).unsqueeze(-1)
    hidden = j > p
    if window is not None:
        hidden |= (p - j) >= window
    return torch.zeros(hidden.shape, dtype=ref.dtype, device=ref.device).masked_fill(hidden, float("-inf"))


def causal(s: int, window: int | None, ref: Tensor) -> Float[Tensor, "s s"]:
    """mask() of the queries at every position 0..s-1: [s, s]."""
    import torch

    return mask(torch.arange(s, device=ref.device), s, window, ref)


def attend(q: Float[Tensor, "*b H sq dh"], k: Float[Tensor, "*b Hkv s dh"], v: Float[Tensor, "*b Hkv s dh"],
           bias: Float[Tensor, "*b sq s"], cap: float | None = None) -> Float[Tensor, "*b H sq dh"]:
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


def rotate(x: Float[Tensor, "... pos dh"], cos: Float[Tensor, "n pos r"], sin: Float[Tensor, "n pos r"]
           ) -> Float[Tensor, "... pos dh"]:
    """x [..., pos, d_head] rotated at its positions: the first r = cos.shape[-1] dimensions as
    x cos + rotate_half(x) sin (cos, sin [1 or n, pos, r], broadcast over the axes between the
    prompts and the positions; computed in x's dtype)."""
    import torch

    r = cos.shape[-1]
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    cos, sin = cos.to(dtype=x.dtype, device=x.device), sin.to(dtype=x.dtype, device=x.device)
    part, rest = x[..., :r], x[..., r:]
    half = r // 2
    turned = torch.cat([-part[..., half:], part[..., :half]], dim=-1)
    out = part * cos + turned * sin
    return out if rest.shape[-1] == 0 else torch.cat([out, rest], dim=-1)


def gelu_tanh(x: Any) -> Any:
    """GELU (tanh approximation) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
    the sigmoid form, torch's CPU tanh being several times slower than its sigmoid."""
    import torch

    c = 2 * math.sqrt(2 / math.pi)
    t = torch.addcmul(x.new_full((), c), x, x, value=0.044715 * c)  # 2u / x
    if tracked(x):  # autograd needs the intermediate values kept: no in-place steps
        return x * torch.sigmoid(t * x)
    return t.mul_(x).sigmoid_().mul_(x)


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
    for LayerNorm (kind "ln"), c(x) = x for RMS norms ("rms"); "none": y = x.  For norm1 the affine
    part (w, b) is folded into the linear map that follows (see fold); norm2 is applied whole."""

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

    def jvp(self, x: Any, dx: Any) -> Any:
        """The change of y = norm(x) for a small change dx of its input (the Jacobian at x times dx):
        w r (dc - y' mean(y' dc)) with c, dc centred for LayerNorm, r = 1 / sqrt(mean(c^2) + eps),
        y' = c r; dx may carry extra axes before the last, against which x broadcasts."""
        if self.kind == "none":
            return dx
        c = x - x.mean(-1, keepdim=True) if self.kind == "ln" else x
        dc = dx - dx.mean(-1, keepdim=True) if self.kind == "ln" else dx
        r = (c.square().mean(-1, keepdim=True) + self.eps).rsqrt()
        y = c * r
        out = r * (dc - y * (y * dc).mean(-1, keepdim=True))
        return out if self.w is None else out * self.w

    def __call__(self, x: Any) -> Any:
        import torch

        y = self.standardize(x)
        if self.w is not None and self.b is not None:
            return torch.addcmul(self.b, y, self.w)
        y = y if self.w is None else y * self.w
        return y if self.b is None else y + self.b


@dataclass
class QkNorm:
    """A norm on queries or keys after their projection (module docstring): `scope` "head"
    normalises each head's d_head values (w [d_head]), "projection" all heads' values of a
    position together (w [heads * d_head], the projection's layout: head by head).  A query norm's w carries the
    score scale as well (mech.block.read)."""

    scope: str
    norm: Norm

    def __call__(self, x: Any, heads_axis: int) -> Any:
        """x [..., heads, ..., d_head] (heads on `heads_axis`) normalised as the model does."""
        if self.scope == "head":
            return self.norm(x)
        y = x.movedim(heads_axis, -2)
        shape = y.shape
        return self.norm(y.reshape(*shape[:-2], -1)).view(shape).movedim(-2, heads_axis)


class Dense:
    """y = act(x W + b) for a fixed W [in, out], b [out] (or None), act (or None).

    On a CPU with AVX-512 in float32, when this torch has it and it agrees with addmm, by oneDNN's
    linear with the activation fused (W kept only as oneDNN's layout W^T [out, in]), which
    there runs faster kernels than torch's own float32 matmul; on AVX2 CPUs the fused kernels
    are the slower ones, and torch's matmul runs (docs/performance.md)."""

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

    def matrix(self) -> tuple[Any, Any]:
        """(W [in, out], b [out] or None) as a plain linear map."""
        return (self.W if self.W is not None else self.Wt.t()), self.b  # type: ignore[union-attr]

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


def dnn_faster() -> bool:
    """Whether oneDNN's linear is the faster float32 kernel on this CPU: one with AVX-512, as torch's
    dispatch sees it (on AVX2 CPUs its fused activations run slower than torch's matmul and activation)."""
    import torch

    return torch.backends.mkldnn.is_available() and "AVX512" in torch.backends.cpu.get_cpu_capability()


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


def output_transform(bridge: Bridge, logits: Any) -> Any:
    """The model's transform after the unembedding (Gemma 2's soft cap c tanh(x / c); the
    identity for most models), as the bridge's forward applies it."""
    transform = getattr(getattr(bridge, "adapter", None), "apply_output_logits_transform", None)
    return transform(logits) if transform is not None else logits
