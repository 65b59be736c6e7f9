"""What a sender writes into the residual stream, and how that write changes when the
sender's activation is replaced: the sending end of every edge, path and signature point.

A sender's members (a group's heads, MLPs and embed) each have an activation:

    head L.h:  z_h, its attention-weighted values before W_O   (blocks.L.attn.hook_z[..., h, :])
    embed:     what enters the residual before block 0          (hook_embed, + hook_pos_embed
               for learned positions; Gemma's embedding scaled by sqrt(d_model) is hook_embed)
    MLP L:     what the block adds to the residual              (blocks.L.hook_mlp_out)

and the change of the sender's write when the activations a become a' is

    D = sum over heads (z'_h - z_h) W_O[h] + sum over embed and MLPs (a' - a)

(the output bias b_O is the same in both and cancels).  In a model with a norm after the
attention (Gemma 2) the layer adds post_L(P), P = sum_h z_h W_O[h] + b_O, and a head's
write is not separable: its change is taken inside the norm, with every other head of
the layer at its base value,

    D_L = post_L(P + sum_{h in L} (z'_h - z_h) W_O[h]) - post_L(P)

(several heads of one layer change jointly inside one norm; layers add).  The sender's
own write in the base run is what it adds compared with not being there at all:
out = D(a -> 0) negated, which is z_h W_O[h] without post norms.

Replacement activations: `resample` = the source run's, `mean` = a per-position mean
over reference prompts (mech.runs.reference.Reference), `zero` = 0.  Everything is float64 on the
activations' device.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, cast

from ...model import architecture
from ...model.bridge import Bridge
from ...model.devices import of, wide
from ...spec import names
from ...spec.names import HOOK_EMBED, HOOK_POS_EMBED, hook_attn_sum, hook_mlp_out, hook_z
from ...spec.vocabulary import REPLACEMENTS, Replacement
from ..block.attention import apply_norm

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

    Residual = Float[Tensor, "n pos d_model"]

Member = names.Head | names.Mlp | names.Embed
Cache = dict[str, Any]


def members(sender: names.Sender) -> list[Member]:
    return list(names.members(sender))


def activation_names(sender: names.Sender) -> list[str]:
    """Hooks a run must cache for the sender's activations and writes (hooks.cache_hooks adds
    what the architecture needs besides: a post-norm layer's attention sum)."""
    out: list[str] = []
    for m in members(sender):
        if isinstance(m, names.Head):
            out.append(hook_z(m.layer))
        elif isinstance(m, names.Mlp):
            out.append(hook_mlp_out(m.layer))
        else:
            out += [HOOK_EMBED, HOOK_POS_EMBED]
    return list(dict.fromkeys(out))


def activation(bridge: Bridge, cache: Cache, member: Member) -> Any:
    """The member's activation in the run `cache` holds (float64): z [n, pos, d_head] for a
    head, [n, pos, d_model] for embed and an MLP."""
    if isinstance(member, names.Head):
        return wide(cache[hook_z(member.layer)][:, :, member.head])
    if isinstance(member, names.Mlp):
        return wide(cache[hook_mlp_out(member.layer)])
    emb = wide(cache[HOOK_EMBED])
    return emb + wide(cache[HOOK_POS_EMBED]).to(emb.device) if HOOK_POS_EMBED in cache else emb


_W_O_MEMO: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], Any]] = weakref.WeakKeyDictionary()


def _W_O(bridge: Bridge, head: names.Head, device: Any) -> Any:
    """The head's W_O [d_head, d_model] in float64 (read from its layer once per bridge and head)."""
    memo = _W_O_MEMO.setdefault(bridge, {})
    key = (head.layer, head.head)
    if key not in memo:
        attn = bridge.blocks[head.layer].attn
        W_O = getattr(attn, "W_O", None)
        W_O = bridge.W_O[head.layer] if W_O is None else W_O  # a layer without its own view: the model's stack
        memo[key] = wide(W_O[head.head]).clone()
    return memo[key].to(device)


def change(bridge: Bridge, base: Cache, sender: names.Sender, new: dict[Member, Any]) -> Residual:
    """D: the change of the sender's write when each member's activation becomes new[member]
    (module docstring), [n, pos, d_model] float64."""
    arch = architecture.of(bridge)
    total: Any = None
    by_layer: dict[int, Any] = {}

    def add(x: Any) -> None:
        nonlocal total
        total = x if total is None else total + x.to(total.device)

    for m in members(sender):
        a = activation(bridge, base, m)
        delta = new[m].to(a.device) - a
        if isinstance(m, names.Head):
            dw = delta @ _W_O(bridge, m, a.device)
            if arch.post_norms:
                by_layer[m.layer] = dw if m.layer not in by_layer else by_layer[m.layer] + dw
                continue
            add(dw)
        else:
            add(delta)
    for layer, dw in sorted(by_layer.items()):
        post = bridge.blocks[layer].ln1_post
        P = wide(base[hook_attn_sum(layer)]).to(dw.device)
        device = of(bridge)
        add(apply_norm(post, P + dw, device) - apply_norm(post, P, device))
    return cast("Tensor", total)


def output(bridge: Bridge, base: Cache, sender: names.Sender) -> Residual:
    """The sender's write in the base run: what it adds against a zero activation (z W_O for a
    head of a model without post norms)."""
    zeros = {m: 0.0 * activation(bridge, base, m) for m in members(sender)}
    return -change(bridge, base, sender, zeros)


def replacement(bridge: Bridge, base: Cache, source: Cache | None, member: Member, kind: str,
                mean: Any = None) -> Any:
    """The activation that replaces the member's base activation: the source run's (resample),
    `mean` ([1 or n, pos, .], the per-position mean over reference prompts) or 0 (zero)."""
    a = activation(bridge, base, member)
    if kind == Replacement.RESAMPLE:
        if source is None:
            raise ValueError("the resample replacement needs a source run")
        return activation(bridge, source, member).to(a.device)
    if kind == Replacement.MEAN:
        if mean is None:
            raise ValueError("the mean replacement needs the reference mean of the sender's activation")
        return wide(mean).to(a.device).expand_as(a)
    if kind == Replacement.ZERO:
        return 0.0 * a
    raise ValueError(f"unknown replacement {kind!r}; allowed: {', '.join(REPLACEMENTS)}")


def sender_change(bridge: Bridge, base: Cache, source: Cache | None, sender: names.Sender, kind: str,
                  means: dict[Member, Any] | None = None) -> Residual:
    """D_0 of an edge or path: the sender's replacement write minus its base write."""
    new = {m: replacement(bridge, base, source, m, kind, (means or {}).get(m)) for m in members(sender)}
    return change(bridge, base, sender, new)


def reference_means(bridge: Bridge, reference: Any, sender: names.Sender, drop: int | None = None) -> dict[Member, Any]:
    """Each member's per-position mean activation over the reference prompts
    (mech.runs.reference.Reference.mean: each prompt left out of its own mean when they are the clean ones)."""
    return {m: reference.mean(activation(bridge, reference.cache, m), drop) for m in members(sender)}
