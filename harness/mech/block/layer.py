"""A block as arithmetic (mech.block.arith's pieces put together), and whole blocks run on it.

A layer reads the residual x through norm1 (its affine part folded into the projections), then

    q_h = finish_q(norm1(x) W_Q[h] + b_Q[h]),  k_g = finish_k(norm1(x) W_K[g] + b_K[g]),  v_g likewise
    finish_q(p) = qk_norm_q(p) (its gain times the score scale) or scale * p;  finish_k(p) = qk_norm_k(p) or p
    z_h = attend(rot(q_h), rot(k_g(h)), v_g(h), mask of the layer's window, soft cap)
    P = sum_h z_h W_O[h] + b_O

and, with post1 and post2 the norms after the sublayers where the model has them (else the
identity),

    sequential: mid = x + post1(P),   post = mid + post2(MLP(norm2(mid)))
    parallel:   post = x + post1(P) + post2(MLP(norm2(x)))

The projections p are what the model's hook_q / hook_k / hook_v cache (before any QK-norm
and rotation).  `mech.block.read` reads a bridge's weights into these layers in any dtype;
`mech.block.fidelity` holds them to the model's activations on every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from jaxtyping import Float, Int
    from torch import Tensor

from .arith import Dense, QkNorm, attend, rotate


@dataclass
class Layer:
    """One block as arithmetic.

    ln1(x): standardize(x) (norm1's affine folded into proj) or the model's norm1 module;
    proj[x] for x in q, k, v, qkv, kv: ln1's output -> those inputs of every head, before any
    QK-norm, scale or rotation [..., H dh] for q, [..., H_kv dh] for k and v; W_O [H, dh, d];
    out: z [..., H dh] -> P = sum_h z_h W_O[h] + b_O; post1: the norm after the attention (None:
    none); mlp(x): what the MLP adds given the residual it reads (norm2, MLP, post2; None: no
    MLP); parallel: the MLP reads the block's input; scale: the score scale; q_norm, k_norm: the
    QK-norm (None: none; q_norm's gain times the scale); rotation: (cos, sin) [1 or n, s, r] of
    this layer's positions 0..s-1 (None: no rotary positions)."""

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
    scale: float = 1.0
    q_norm: QkNorm | None = None
    k_norm: QkNorm | None = None
    rotation: tuple[Any, Any] | None = None

    def finish(self, which: str, p: Any, heads_axis: int) -> Any:
        """The queries (`which` "q", scaled) or keys ("k") the scores read, before the rotation, from
        their projections p [..., heads, ..., d_head] (heads on `heads_axis`); values pass unchanged."""
        if which == "v":
            return p
        norm = self.q_norm if which == "q" else self.k_norm
        if norm is not None:
            return norm(p, heads_axis)
        return p * self.scale if which == "q" else p

    def rotate(self, x: Any, positions: Any = None) -> Any:
        """x [..., s, dh] rotated at positions 0..s-1, or at `positions` [n, k] (x [E, n, H, k, dh]:
        queries at the scored positions); the identity without rotary positions."""
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

    def qk(self, which: str, p: Any, heads_axis: int, positions: Any = None) -> Any:
        """finish then rotate: the queries or keys the scores read (values: p itself)."""
        x = self.finish(which, p, heads_axis)
        return x if which == "v" else self.rotate(x, positions)

    def attn_out(self, P: Any) -> Any:
        """What the attention adds to the residual given its sum P."""
        return P if self.post1 is None else self.post1(P)

    def finish_block(self, x: Any, attn_out: Any, mlp_x: Any = None) -> Any:
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
    #: (final residual [..., d], token ids [..., c]) -> those tokens' logits [..., c], without the rest of
    #: the vocabulary (read.unembedding); None where the logits come from the model's modules
    columns: Callable[..., Any] | None = None

    def logits_of(self, x: Float[Tensor, "E n k d"], tokens: Int[Tensor, "n k c"]) -> Float[Tensor, "E n k c"]:
        """The logits of `tokens` only: out[..., j] = logits(x)[..., tokens[..., j]] up to float rounding,
        at c / vocabulary of the unembedding's cost when the arithmetic is in torch (`columns`)."""
        if self.columns is not None:
            return cast("Tensor", self.columns(x, tokens))
        full = self.logits(x)
        return cast("Tensor", full.gather(-1, tokens.expand(*full.shape[:-1], tokens.shape[-1])))


def block(model: Model, lay: Layer, x: Float[Tensor, "B s d"], bias: Float[Tensor, "s s"],
          keep: dict[str, Any] | None = None) -> Float[Tensor, "B s d"]:
    """A whole block at every position: x [B, s, d] -> resid_post [B, s, d]; `bias` its mask [s, s];
    `keep`: given, it receives the attention sum P before any norm after it (keep["P"] [B, s, d])."""
    H, dh = model.n_heads, model.d_head
    B, s, d = x.shape
    h = lay.ln1(x)
    q = lay.qk("q", lay.proj["q"](h).view(B, s, H, dh).transpose(1, 2), 1)
    kv = lay.proj["kv"](h).view(B, s, 2, lay.n_kv, dh).permute(2, 0, 3, 1, 4)
    k, v = lay.qk("k", kv[0], 1), kv[1]
    z = attend(q.contiguous(), k.contiguous(), v.contiguous(), bias, lay.cap).transpose(1, 2)  # [B, s, H, dh]
    P = lay.out(z.reshape(B, s, H * dh))
    if keep is not None:
        keep["P"] = P
    return cast("Tensor", lay.finish_block(x, lay.attn_out(P)))


def block_at(model: Model, lay: Layer, x: Float[Tensor, "E n s d"], positions: Int[Tensor, "n k"],
             scored: Float[Tensor, "n k s"]) -> Float[Tensor, "E n k d"]:
    """The last block at the scored positions only: x [E, n, s, d] -> resid_post [E, n, k, d]
    (keys and values at every position, queries and everything after at the scored ones);
    `scored` its mask [n, k, s]."""
    H, dh = model.n_heads, model.d_head
    E, n, s, d = x.shape
    k_ = positions.shape[1]
    h = lay.ln1(x)
    kv = lay.proj["kv"](h).view(E, n, s, 2, lay.n_kv, dh).permute(3, 0, 1, 4, 2, 5)  # [2, E, n, Hkv, s, dh]
    k, v = lay.qk("k", kv[0], 2).contiguous(), kv[1].contiguous()
    q = lay.proj["q"](at(positions, h)).view(E, n, k_, H, dh).transpose(2, 3)
    q = lay.qk("q", q, 2, positions).contiguous()
    z = attend(q, k, v, scored[:, None], lay.cap).transpose(2, 3)  # [E, n, k, H, dh]
    attn = lay.attn_out(lay.out(z.reshape(E, n, k_, H * dh)))
    mlp_x = lay.mlp(at(positions, x)) if lay.parallel and lay.mlp else None
    return cast("Tensor", lay.finish_block(at(positions, x), attn, mlp_x))


def at(positions: Int[Tensor, "n k"], x: Float[Tensor, "E n s *rest"]) -> Float[Tensor, "E n k *rest"]:
    """x [E, n, s, ...] -> [E, n, k, ...] at the scored positions."""
    idx = positions.reshape(1, *positions.shape, *([1] * (x.dim() - 3)))
    return x.gather(2, idx.expand(x.shape[0], -1, -1, *x.shape[3:]))
