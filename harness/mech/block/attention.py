"""One attention head computed by hand, in float64, as the model computes it.

For query head h of layer l (its key/value head g = kv_head(h) under grouped-query
attention), with x the residual the head reads, the arithmetic of mech.block.layer in
float64:

    p_q = norm1_l(x) W_Q[l] + b_Q[l]   (every head's; p_k, p_v likewise with W_K, W_V)
    q_h = rot(finish_q(p_q)[h]),  k_g = rot(finish_k(p_k)[g]),  v_g = p_v[g]
          (finish: the QK-norm where the model has one, over the head's values or, for a norm
           over the projection, over every head's; the score scale on the queries)
    z_h = softmax(cap(q_h . k_g) + mask_l) v_g      (causal; within layer l's sliding window)

The rotation is the layer's own table (mech.block.rotary: the model's rotary embedding,
each layer's where layers differ).  A patched input enters before the QK-norm and the
rotation, which are applied at the receiver's own positions.  The layer's weights are read
once per bridge (mech.block.read.attention_layer, without the MLP).

`check` holds this arithmetic to the model: every layer's z of the first prompts of a
base run, recomputed from the cached residual, must equal the cached z within
`fidelity.tolerance(dtype)` x (1 + max |z|) for the model's dtype.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, cast

from ...errors import UnsupportedError
from ...model import architecture
from ...model.bridge import Bridge
from ...model.devices import float64_home, of, wide
from ...spec import names
from ...spec.names import hook_resid_pre, hook_z
from . import read
from .arith import attend, causal
from .fidelity import tolerance
from .layer import Layer

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

CHECK_PROMPTS = 2

_LAYERS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Layer]] = weakref.WeakKeyDictionary()
_CHECKED: weakref.WeakKeyDictionary[Any, set[tuple[int, int]]] = weakref.WeakKeyDictionary()


def layer(bridge: Bridge, L: int, s: int) -> Layer:
    """Layer L's attention arithmetic in float64 with the rotation of positions 0..s-1 (read once per
    bridge, layer, length and architecture description)."""
    import torch

    memo = _LAYERS.setdefault(bridge, {})
    key = (L, s, architecture.of(bridge))
    if key not in memo:
        with torch.no_grad():
            memo[key] = read.attention_layer(bridge, L, s, torch.float64, float64_home(of(bridge)))
    return memo[key]


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


def _rows(which: str, head: int, arch: architecture.Architecture) -> tuple[int, int]:
    """(index, count) of `which`'s head among its projection's: query head `head` for q, its key/value
    head for k and v."""
    return (head, arch.n_heads) if which == "q" else (arch.kv_head(head), arch.n_kv_heads)


def head_input(bridge: Bridge, head: names.Head, which: str, resid: Any) -> Float[Tensor, "n pos d_head"]:
    """p = norm1(resid) W_x + b_x for query head `head` (its key/value head's for k and v): what the
    model's hook_q / hook_k / hook_v hold for it ([n, pos, d_head], float64, before any QK-norm,
    scale or rotation)."""
    arch = architecture.of(bridge)
    lay = layer(bridge, head.layer, int(resid.shape[1]))
    i, _ = _rows(which, head.head, arch)
    dh = arch.d_head
    h = lay.ln1(wide(resid).to(lay.W_O.device))
    return cast("Tensor", lay.proj[which].outputs(i * dh, (i + 1) * dh)(h))


def head_qkv(bridge: Bridge, head: names.Head, which: str, resid: Any) -> Float[Tensor, "n pos d_head"]:
    """What head `head`'s scores read of `which` from `resid`: its query (finished and rotated, the
    scale included), key (finished and rotated) or value ([n, pos, d_head], float64)."""
    arch = architecture.of(bridge)
    lay = layer(bridge, head.layer, int(resid.shape[1]))
    i, count = _rows(which, head.head, arch)
    if which != "v" and arch.qk_norm == "projection":  # the norm reads every head's projection
        h = lay.ln1(wide(resid).to(lay.W_O.device))
        p = lay.proj[which](h).view(*h.shape[:-1], count, arch.d_head)
        return cast("Tensor", lay.rotate(lay.finish(which, p, -2)[..., i, :]))
    p = head_input(bridge, head, which, resid)
    return p if which == "v" else cast("Tensor", lay.rotate(lay.finish(which, p.unsqueeze(-2), -2).squeeze(-2)))


def head_z(bridge: Bridge, head: names.Head, inputs: dict[str, Any]) -> Any:
    """z [n, pos, d_head] of query head `head` from residuals `inputs[x]` that its q, k and v read
    (float64)."""
    arch = architecture.of(bridge)
    q, k, v = (head_qkv(bridge, head, x, inputs[x]) for x in "qkv")
    s = k.shape[-2]
    lay = layer(bridge, head.layer, s)
    return attend(q, k, v, causal(s, arch.windows[head.layer], q), lay.cap)


def check(bridge: Bridge, cache: dict[str, Any], layer_: int) -> None:
    """Raise UnsupportedError unless every head's z of `layer_`, recomputed by hand from the
    cached residual of the first prompts, equals the model's (once per bridge and layer)."""
    import torch

    done = _CHECKED.setdefault(bridge, set())
    key = (layer_, int(cache[hook_resid_pre(layer_)].shape[1]))
    if key in done:
        return
    arch = architecture.of(bridge)
    m = CHECK_PROMPTS
    resid = wide(cache[hook_resid_pre(layer_)][:m])
    z_model = cache[hook_z(layer_)][:m]
    want, tol = wide(z_model), tolerance(z_model.dtype)
    with torch.no_grad():
        for h in range(arch.n_heads):
            z = head_z(bridge, names.Head(layer_, h), dict.fromkeys("qkv", resid))
            ref = want[:, :, h].to(z.device)
            diff = float((z - ref).abs().max())
            if diff > tol * (1.0 + float(ref.abs().max())):
                feats = ", ".join(arch.features()) or "a GPT-2-style block"
                raise UnsupportedError(f"{arch.name}: layer {layer_} head {h}'s attention recomputed by hand differs "
                                       f"from the model's by {diff:.3g} ({feats}): harness cannot patch its inputs "
                                       "exactly")
    done.add(key)
