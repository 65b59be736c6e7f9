"""One attention head computed by hand, in float64, as the model computes it.

For query head h of layer l (its key/value head g = kv_head(h) under grouped-query
attention), with x the residual the head reads:

    q = norm1_l(x) W_Q[l, h] + b_Q[l, h]         k, v likewise with W_K[l, g], W_V[l, g]
    q~ = rot(q), k~ = rot(k)                     (rotary models; the identity otherwise)
    s_ij = scale_l q~_i . k~_j                   (scale_l: 1/sqrt(d_head), or the model's own)
    s_ij <- c tanh(s_ij / c)                     (models with an attention soft cap c)
    s_ij <- -inf unless 0 <= i - j < window_l    (causal; window_l = infinity for full layers)
    z_i = sum_j softmax_j(s_ij) v_j

Rotary positions rotate the first rotary_dim dimensions of a vector at position p as
the model does (the halves convention of Llama and GPT-NeoX):

    rot(x) = x cos_p + rotate_half(x) sin_p,   rotate_half([a, b]) = [-b, a]

with cos_p, sin_p read from the model's own rotary embedding in the run being patched
(`rotary_emb.hook_cos` / `hook_sin`), so any frequency scaling the model applies is
reproduced.  A patched input enters before the rotation; the rotation is applied at
the receiver's own positions.

`check` holds this arithmetic to the model: every layer's z of the first prompts of a
base run, recomputed from the cached residual, must equal the cached z within
`tolerance(dtype)` x (1 + max |z|) for the model's dtype.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, cast

from ...errors import UnsupportedError
from ...model import architecture
from ...model.devices import of, wide
from ...spec import names
from ...spec.names import HOOK_ROT_COS, HOOK_ROT_SIN, hook_resid_pre, hook_z

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

CHECK_PROMPTS = 2

_PARAMS: weakref.WeakKeyDictionary[Any, dict[tuple[int, int, str], tuple[Any, Any]]] = weakref.WeakKeyDictionary()
_CHECKED: weakref.WeakKeyDictionary[Any, set[tuple[int, int]]] = weakref.WeakKeyDictionary()


def tolerance(dtype: Any) -> float:
    """How far a float64 recomputation may sit from a model computing in `dtype`, relative to
    1 + max |model's value|: float64 1e-8, float32 1e-4, half precision (bfloat16, float16) 3e-2.

    The half-precision bound: bfloat16 rounds to 2^-8 (0.4 %) of a value; on a random layer of
    Qwen2.5-7B's width in bfloat16 (d_model 3584, 28 query heads on 4 key/value heads) the
    recomputed z sat within 1 % of max |z| ~ 3.6 on the CPU (about two roundings), and 0.026
    from the model's on CUDA; an arithmetic that differs from the model's (another rotation,
    scale or grouping) moves z by its own size, far past 3 %."""
    import torch

    return {torch.float64: 1e-8, torch.float32: 1e-4}.get(dtype, 3e-2)


def rotary_names(bridge: Any) -> list[str]:
    """The hooks the rotation reads (none without rotary positions)."""
    return [HOOK_ROT_COS, HOOK_ROT_SIN] if architecture.of(bridge).rotary else []


def projection(bridge: Any, layer: int, head: int, which: str) -> tuple[Any, Any]:
    """(W [d_model, d_head], b [d_head]) in float64 of query head `head`'s input `which` (the
    key/value head's for k and v); b is zero where the model has no bias."""
    import torch

    memo = _PARAMS.setdefault(bridge, {})
    arch = architecture.of(bridge)
    idx = head if which == "q" else arch.kv_head(head)
    key = (layer, idx, which)
    if key not in memo:
        X = which.upper()
        with torch.no_grad():
            W = wide(_layer_weight(bridge, layer, f"W_{X}")[idx]).clone()
            b = _layer_weight(bridge, layer, f"b_{X}")
            bias = wide(b[idx]).clone() if b is not None else torch.zeros(W.shape[-1], dtype=W.dtype, device=W.device)
        memo[key] = (W, bias)
    return memo[key]


def _layer_weight(bridge: Any, layer: int, name: str) -> Any:
    """One layer's W_Q / b_Q etc. ([heads, ...]; None for a bias the model does not have), read from
    that layer's attention (the model-wide stacks would copy every layer's weights)."""
    try:
        value = getattr(bridge.blocks[layer].attn, name)
    except AttributeError:
        value = None
    if value is not None:
        return value
    try:
        stacked = getattr(bridge, name)
    except AttributeError:
        return None
    return None if stacked is None else stacked[layer]


def apply_norm(module: Any, x: Any, device: Any) -> Any:
    """A norm (or MLP) module applied on the model's `device` in its own dtype, returned in
    float64 (parameter-free modules: the input's dtype; MPS has no float64)."""
    import torch

    param = next(module.parameters(), None)
    dtype = x.dtype if param is None else param.dtype
    if torch.device(device).type == "mps" and dtype == torch.float64:
        dtype = torch.float32
    with torch.no_grad():
        return wide(module(x.to(dtype).to(device)))


def head_input(bridge: Any, head: names.Head, which: str, resid: Any) -> Float[Tensor, "n pos d_head"]:
    """x = norm1(resid) W_x + b_x for query head `head` ([n, pos, d_head], float64, before any rotation)."""
    h = apply_norm(bridge.blocks[head.layer].ln1, resid, of(bridge))
    W, b = projection(bridge, head.layer, head.head, which)
    return cast("Tensor", h @ W.to(h.device) + b.to(h.device))


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """x [..., pos, d_head] rotated at its positions: the first r = cos.shape[-1] dimensions as
    x cos + rotate_half(x) sin (cos, sin [1 or n, pos, r], broadcast over the heads in between;
    computed in x's dtype)."""
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


def visible(sq: Any, s: int, window: int | None, device: Any) -> Any:
    """Bool [..., s]: key j visible from each query position i in `sq` (an int tensor of
    positions): j <= i and i - j < window."""
    import torch

    j = torch.arange(s, device=device)
    i = sq.to(device).unsqueeze(-1)
    ok = j <= i
    if window is not None:
        ok = ok & (i - j < window)
    return ok


def attend(arch: architecture.Architecture, layer: int, q: Any, k: Any, v: Any, cos: Any = None, sin: Any = None,
           query_positions: Any = None) -> Any:
    """z = softmax(cap(scale q~ k~^T) + mask) v for q [..., sq, dh] and k, v [..., s, dh]
    (pre-rotation; float64); `query_positions`: where the queries sit, [sq] (default
    0..sq-1) or per prompt [n, sq] (then q is [n, sq, dh] or [n, H, sq, dh])."""
    import torch

    s = k.shape[-2]
    if query_positions is None:
        query_positions = torch.arange(q.shape[-2], device=q.device)
    if arch.rotary:
        if cos is None or sin is None:
            raise ValueError("rotary attention needs the run's cos and sin")
        cq = _at_positions(cos, query_positions)
        sq = _at_positions(sin, query_positions)
        q, k = rotate(q, cq, sq), rotate(k, cos, sin)
    scores = (q @ k.transpose(-1, -2)) * arch.scales[layer]
    if arch.attn_softcap:
        scores = arch.attn_softcap * torch.tanh(scores / arch.attn_softcap)
    ok = visible(query_positions, s, arch.windows[layer], q.device)  # [sq, s] or [n, sq, s]
    if ok.dim() == 3 and scores.dim() == 4:  # per-prompt positions, scores [n, H, sq, s]
        ok = ok.unsqueeze(1)
    scores = scores.masked_fill(~ok, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _at_positions(t: Any, positions: Any) -> Any:
    """cos/sin [1 or n, s, r] at query positions [sq] or [n, sq] -> [1 or n, sq, r]."""
    import torch

    pos = positions.to(t.device)
    if pos.dim() == 1:
        return t[:, pos]
    n = max(t.shape[0], pos.shape[0])
    return torch.gather(t.expand(n, -1, -1), 1, pos.unsqueeze(-1).expand(n, -1, t.shape[-1]))


def head_z(bridge: Any, head: names.Head, inputs: dict[str, Any], cache: dict[str, Any]) -> Any:
    """z [n, pos, d_head] of query head `head` from residuals `inputs[x]` that its q, k and v
    read (float64), with the rotation of the run `cache` holds."""
    arch = architecture.of(bridge)
    qkv = {x: head_input(bridge, head, x, inputs[x]) for x in "qkv"}
    cos, sin = (cache[HOOK_ROT_COS], cache[HOOK_ROT_SIN]) if arch.rotary else (None, None)
    return attend(arch, head.layer, qkv["q"], qkv["k"], qkv["v"], cos, sin)


def check(bridge: Any, cache: dict[str, Any], layer: int) -> None:
    """Raise UnsupportedError unless every head's z of `layer`, recomputed by hand from the
    cached residual of the first prompts, equals the model's (once per bridge and layer)."""
    import torch

    done = _CHECKED.setdefault(bridge, set())
    key = (layer, int(cache[hook_resid_pre(layer)].shape[1]))
    if key in done:
        return
    arch = architecture.of(bridge)
    m = CHECK_PROMPTS
    resid = wide(cache[hook_resid_pre(layer)][:m])
    part = {k: v[:m] for k, v in cache.items() if k in (HOOK_ROT_COS, HOOK_ROT_SIN)}
    z_model = cache[hook_z(layer)][:m]
    want, tol = wide(z_model), tolerance(z_model.dtype)
    with torch.no_grad():
        for h in range(arch.n_heads):
            z = head_z(bridge, names.Head(layer, h), dict.fromkeys("qkv", resid), part)
            ref = want[:, :, h].to(z.device)
            diff = float((z - ref).abs().max())
            if diff > tol * (1.0 + float(ref.abs().max())):
                feats = ", ".join(arch.features()) or "a GPT-2-style block"
                raise UnsupportedError(f"{arch.name}: layer {layer} head {h}'s attention recomputed by hand differs "
                                       f"from the model's by {diff:.3g} ({feats}): harness cannot patch its inputs "
                                       "exactly")
    done.add(key)
