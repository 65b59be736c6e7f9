"""Exact edge patching: sender -> receiver.{q,k,v} and sender -> logits.

Only the receiver sees the sender's changed write; every other reader sees the
base run.  For a receiver head B (query head b of layer L) and input x in {q, k, v}:

    r'   = resid_pre_L(base) + D                     (D: the sender's change of write, mech.edges.writes)
    x_B' = norm1_L(r') W_x + b_x                     (the norm recomputed on r'; W_x, b_x of query
                                                      head b for q, of its key/value head for k, v)

then B's attention as the model computes it: a QK-norm (over B's values, or over every
head's projection of r' where the norm spans the projection) and rotary positions act on
q and k after the projection at B's own positions, the scale, soft cap and
(sliding-window) causal mask of layer L apply (mech.block.attention).  Only head B's input changes: under
grouped-query attention the other query heads of B's key/value group keep reading
the base keys and values.  For `-> logits` the final residual gets the change:
logits' = out(ln_final(resid_final + D)), with the model's output transform (a soft
cap) applied.  Without post norms D = (z_A' - z_A) W_O[A] for a head A (its share of
b_O is the same in every run and cancels); `embed` is what enters the residual before
block 0 (token embedding, plus learned positions where the model has them: a rotary
model has no positional embedding to include).

Directions:
* noising   (base = clean, replacement from the corrupted run): necessity;
* denoising (base = corrupted, replacement from the clean run): sufficiency.
Replacement (noising only for mean and zero): `resample` = the other run's
activation (default), `mean` = the sender's activation averaged per position over
reference prompts other than the patched one (mech.runs.reference.Reference), `zero` = 0.

`fast_plan` hooks the receiver's own slice of q/k/v where the model has one (the
model then normalises, rotates and attends); for a shared key/value head, or a QK-norm
over the whole projection, it sets the receiver's z from its attention recomputed by
hand.  `slow_logits` is the plainly written reference: it always recomputes the receiver
head's whole attention by hand and replaces its z.  Tests hold them equal, and both to a float64 reference forward of
each architecture.

Devices: the float64 arithmetic runs on the activations' device (on the CPU for
MPS, which has no float64: devices.wide); norm modules run on the model's device;
hooks hand the model its own dtype and device back (devices.like).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ...errors import UnsupportedError
from ...model import architecture
from ...model.bridge import Bridge
from ...model.devices import like, of, wide
from ...spec import names
from ...spec.names import hook_input, hook_pattern, hook_resid_post, hook_resid_pre, hook_z
from ..block import attention
from ..block.arith import output_transform
from ..hooks import Cache, Plan, run_plan
from . import writes

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

    Residual = Float[Tensor, "n pos d_model"]


def cache_names(edges: list[names.Edge], n_layers: int) -> list[str]:
    """Hooks to cache in both runs for these edges (a head or embed into a head input or
    logits; MLP ends and groups of senders are mech.edges.paths's).  hooks.cache_hooks adapts the
    list to the architecture (the rotation, post-norm sums, no learned positions)."""
    out = []
    for e in edges:
        s = e.sender
        if not isinstance(s, names.Head | names.Embed):
            raise UnsupportedError(names.edge_end_unsupported(s, "from"))
        out += writes.activation_names(s)
        out += receiver_names(e.receiver, n_layers)
    return list(dict.fromkeys(out))


def receiver_names(receiver: names.Receiver, n_layers: int) -> list[str]:
    """Hooks the receiving end of a patch reads: the residual it reads (and, for a head, its
    layer's z, which the attention recomputed by hand is checked against)."""
    if isinstance(receiver, names.HeadInput):
        L = receiver.head.layer
        return [hook_resid_pre(L), hook_z(L)]
    if isinstance(receiver, names.Logits):
        return [hook_resid_post(n_layers - 1)]
    raise UnsupportedError(names.edge_end_unsupported(receiver, "into"))


def receiver_residual(bridge: Bridge, base: Cache, receiver: names.Receiver) -> Residual:
    """The residual the receiver reads in the base run (float64): a head input reads its layer's
    resid_pre, `logits` the last layer's resid_post."""
    key = (hook_resid_pre(receiver.head.layer) if isinstance(receiver, names.HeadInput)
           else hook_resid_post(bridge.cfg.n_layers - 1))
    return cast("Tensor", wide(base[key]))


def sender_output(bridge: Bridge, cache: Cache, sender: names.Sender) -> Residual:
    """The sender's write into the residual stream [n, pos, d_model] (float64; mech.edges.writes)."""
    return writes.output(bridge, cache, sender)


def attn_scale(cfg: Any) -> float:
    """The divisor of attention scores of a native config: cfg.attn_scale when set, else sqrt(d_head)."""
    if getattr(cfg, "use_attn_scale", True) and cfg.attn_scale > 0:
        return float(cfg.attn_scale)
    return math.sqrt(cfg.d_head)


apply_module = attention.apply_norm


def receiver_input(bridge: Bridge, head: names.Head, which: str, resid: Residual) -> Float[Tensor, "n pos d_head"]:
    """x = norm1(resid) W_x + b_x for one query head (its key/value head's W, b for k and v):
    [n, pos, d_head] (float64, before any rotation)."""
    return attention.head_input(bridge, head, which, resid)


@dataclass
class EdgePatch:
    """Everything one patched forward needs, computed from the two caches."""

    edge: names.Edge
    resid: Residual  # the patched residual the receiver sees


def prepare(bridge: Bridge, edge: names.Edge, base: Cache, source: Cache | None, replacement: str,
            means: dict[Any, Any] | None = None) -> EdgePatch:
    """r' = (the receiver's base residual) + D, D the sender's change of write (mech.edges.writes);
    `means`: per member, the reference mean activation (mean replacement)."""
    change = writes.sender_change(bridge, base, source, edge.sender, replacement, means)
    resid = receiver_residual(bridge, base, edge.receiver)
    return EdgePatch(edge, resid + change.to(resid.device))


def final_logits(bridge: Bridge, resid: Residual) -> Any:
    """The logits of a final residual: the final norm, the unembedding and the model's output
    transform (Gemma 2's soft cap), in the model's dtype."""
    import torch

    with torch.no_grad():
        return output_transform(bridge, bridge.unembed(like(apply_module(bridge.ln_final, resid, of(bridge)),
                                                            bridge.W_U)))


def fast_plan(bridge: Bridge, patch: EdgePatch, base: Cache | None = None) -> Plan:
    """Hooks that apply the patch: the receiver's q/k/v slice of `blocks.L.attn.hook_x` (the
    projection, before any QK-norm and rotation, which the model then applies) where the model has
    one for that query head alone (q always; k and v unless the key/value head is shared; q and k
    not under a QK-norm over the whole projection, which would mix the patched slice with the other
    heads' base ones), else the receiver's z, from its attention recomputed by hand
    (mech.block.attention; this needs the `base` run); `-> logits`: the final residual."""
    plan = Plan()
    r = patch.edge.receiver
    if isinstance(r, names.Logits):
        resid = patch.resid

        def final(x: Any, hook: Any) -> Any:
            return like(resid, x)

        plan.add(hook_resid_post(bridge.cfg.n_layers - 1), final)
        return plan
    if not isinstance(r, names.HeadInput):
        raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    arch = architecture.of(bridge)
    own_slice = r.which == "v" or arch.qk_norm != "projection"  # a norm over the projection reads every head's
    if own_slice and (r.which == "q" or not arch.grouped):
        new = receiver_input(bridge, r.head, r.which, patch.resid)
        idx = r.head.head if r.which == "q" else arch.kv_head(r.head.head)

        def swap(x: Any, hook: Any) -> Any:
            x = x.clone()
            x[:, :, idx, :] = like(new, x)
            return x

        plan.add(hook_input(r.head.layer, r.which), swap)
        return plan
    if base is None:
        raise ValueError("patching a head's input through its z needs the base run")
    return z_plan(bridge, r.head, patched_z(bridge, r, patch.resid, base))


def patched_z(bridge: Bridge, receiver: names.HeadInput, resid: Residual, base: Cache) -> Any:
    """The receiver head's z when its input `receiver.which` reads `resid` and the other two its
    base residual (attention by hand, checked against the model once per layer)."""
    L = receiver.head.layer
    attention.check(bridge, base, L)
    pre = wide(base[hook_resid_pre(L)]).to(resid.device)
    inputs = {w: resid if w == receiver.which else pre for w in "qkv"}
    return attention.head_z(bridge, receiver.head, inputs)


def z_plan(bridge: Bridge, head: names.Head, z: Any) -> Plan:
    """Hooks that set one head's z (its other heads untouched)."""
    plan = Plan()

    def set_z(x: Any, hook: Any) -> Any:
        x = x.clone()
        x[:, :, head.head, :] = like(z, x)
        return x

    plan.add(hook_z(head.layer), set_z)
    return plan


def fast_logits(bridge: Bridge, tokens: Any, patch: EdgePatch, extra: Plan | None = None,
                base: Cache | None = None) -> Any:
    plan = fast_plan(bridge, patch, base)
    if extra is not None:
        plan.hooks += extra.hooks
    return run_plan(bridge, tokens, plan)


def slow_logits(bridge: Bridge, tokens: Any, patch: EdgePatch, base: Cache) -> Float[Tensor, "n pos vocab"]:
    """Reference: recompute the receiver head's attention by hand, replace its z.

    q, k, v of head B are computed from norm1 of the base residual, except the patched
    input, computed from norm1 of the patched residual; then rotation, scale, soft cap, the
    causal (and sliding-window) mask and the softmax as the model does (mech.block.attention).
    For `-> logits`, the final norm, the unembedding and the output transform are applied
    by hand to the patched final residual.
    """
    r = patch.edge.receiver
    if isinstance(r, names.Logits):
        return cast("Tensor", wide(final_logits(bridge, patch.resid)))
    if not isinstance(r, names.HeadInput):
        raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    z = patched_z(bridge, r, patch.resid, base)
    return cast("Tensor", wide(run_plan(bridge, tokens, z_plan(bridge, r.head, z))))


def freeze_patterns_plan(patterns: dict[int, Float[Tensor, "n head query key"]]) -> Plan:
    """Hooks that hold every layer's attention pattern at the given (base-run) values."""
    plan = Plan()
    for layer, pat in sorted(patterns.items()):
        plan.add(hook_pattern(layer), lambda x, hook, pat=pat: like(pat, x))
    return plan
