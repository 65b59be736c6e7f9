"""Exact edge patching: sender -> receiver.{q,k,v} and sender -> logits.

Only the receiver sees the swapped sender output; every other reader sees the
base run.  For a receiver head B (layer L) and input x in {q, k, v}:

    r'   = resid_pre_L(base) - out_A(base) + out_A(replacement)
    x_B' = LN1_L(r') W_x[L, B] + b_x[L, B]         (LayerNorm recomputed on r')

and only head B's slice of `blocks.L.attn.hook_x` is replaced.  For `-> logits`
the final residual gets the swap: logits' = unembed(ln_final(resid_final - out_A
+ out_A')).  A head's output is out_A = z_A W_O[A] (its share of b_O is the same
in every run and cancels); `embed` is the token + positional embedding.

Directions:
* noising   (base = clean, replacement from the corrupted run): necessity;
* denoising (base = corrupted, replacement from the clean run): sufficiency.
Replacement (noising only for mean and zero): `resample` = the other run's
output (default), `mean` = the sender's output averaged per position over
reference prompts other than the patched one (mech.runs.Reference), `zero` = 0.

`fast_plan` hooks the receiver's q/k/v (TransformerLens computes attention);
`slow_logits` is the plainly written reference: it recomputes the receiver
head's whole attention by hand and replaces its z.  Tests hold them equal.

Devices: the float64 arithmetic runs on the activations' device (on the CPU for
MPS, which has no float64: devices.wide); norm modules run on the model's device;
hooks hand the model its own dtype and device back (devices.like).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedError
from ..model.devices import like, of, wide
from ..spec import names
from ..spec.names import hook_input, hook_pattern, hook_resid_post, hook_resid_pre, hook_z
from ..spec.vocabulary import REPLACEMENTS
from .hooks import Cache, Plan, run_plan

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

    Residual = Float[Tensor, "n pos d_model"]


def cache_names(edges: list[names.Edge], n_layers: int) -> list[str]:
    """Hooks to cache in both runs for these edges (a head or embed into a head input or
    logits; MLP ends and groups of senders are mech.paths's)."""
    out = []
    for e in edges:
        s = e.sender
        if isinstance(s, names.Head):
            out.append(hook_z(s.layer))
        elif isinstance(s, names.Embed):
            out += [names.HOOK_EMBED, names.HOOK_POS_EMBED]
        else:
            raise UnsupportedError(names.edge_end_unsupported(s, "from"))
        r = e.receiver
        if isinstance(r, names.HeadInput):
            out.append(hook_resid_pre(r.head.layer))
        elif isinstance(r, names.Logits):
            out.append(hook_resid_post(n_layers - 1))
        else:
            raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    return list(dict.fromkeys(out))


def sender_output(bridge: Any, cache: Cache, sender: names.Sender) -> Residual:
    """The sender's write into the residual stream [n, pos, d_model] (float64)."""
    if isinstance(sender, names.Head):
        z = wide(cache[hook_z(sender.layer)][:, :, sender.head])
        return z @ wide(bridge.W_O[sender.layer, sender.head]).to(z.device)
    return wide(cache[names.HOOK_EMBED] + cache[names.HOOK_POS_EMBED])


def replacement_output(bridge: Any, base: Cache, source: Cache, sender: names.Sender, replacement: str,
                       mean_out: Residual | None = None) -> Residual:
    """The sender's output that replaces its base-run output: the source run's (resample),
    `mean_out` ([1 or n, pos, d], the per-position mean over reference prompts; mean), or 0."""
    if replacement == "resample":
        return sender_output(bridge, source, sender)
    if replacement == "mean":
        if mean_out is None:
            raise ValueError("mean replacement needs the reference mean of the sender's output")
        return wide(mean_out).expand_as(sender_output(bridge, base, sender))
    if replacement == "zero":
        return 0.0 * sender_output(bridge, base, sender)
    raise ValueError(f"unknown replacement {replacement!r}; allowed: {', '.join(REPLACEMENTS)}")


def patched_residual(bridge: Any, edge: names.Edge, base: Cache, new_out: Residual) -> Residual:
    """r' = (the receiver's base residual) - out_A(base) + out_A(replacement)."""
    r = edge.receiver
    key = (hook_resid_pre(r.head.layer) if isinstance(r, names.HeadInput)
           else hook_resid_post(bridge.cfg.n_layers - 1))
    return wide(base[key]) - sender_output(bridge, base, edge.sender) + new_out


def attn_scale(cfg: Any) -> float:
    """The divisor of attention scores: cfg.attn_scale when set, else sqrt(d_head)."""
    if getattr(cfg, "use_attn_scale", True) and cfg.attn_scale > 0:
        return float(cfg.attn_scale)
    return math.sqrt(cfg.d_head)


def apply_module(module: Any, x: Any, device: Any) -> Any:
    """Apply a norm (or MLP) module on the model's `device` in its own dtype (parameter-free
    norms: the input's, float32 on MPS), return float64 (devices.wide)."""
    import torch

    param = next(module.parameters(), None)
    dtype = x.dtype if param is None else param.dtype
    if torch.device(device).type == "mps" and dtype == torch.float64:
        dtype = torch.float32
    with torch.no_grad():
        return wide(module(x.to(dtype).to(device)))


def receiver_input(bridge: Any, head: names.Head, which: str, resid: Residual) -> Float[Tensor, "n pos d_head"]:
    """x = LN1(resid) W_x + b_x for one head: [n, pos, d_head] (float64)."""
    h = apply_module(bridge.blocks[head.layer].ln1, resid, of(bridge))
    W = wide(getattr(bridge, f"W_{which.upper()}")[head.layer, head.head]).to(h.device)
    b = wide(getattr(bridge, f"b_{which.upper()}")[head.layer, head.head]).to(h.device)
    return h @ W + b


@dataclass
class EdgePatch:
    """Everything one patched forward needs, computed from the two caches."""

    edge: names.Edge
    resid: Residual  # the patched residual the receiver sees


def prepare(bridge: Any, edge: names.Edge, base: Cache, source: Cache, replacement: str,
            mean_out: Residual | None = None) -> EdgePatch:
    new_out = replacement_output(bridge, base, source, edge.sender, replacement, mean_out)
    return EdgePatch(edge, patched_residual(bridge, edge, base, new_out))


def fast_plan(bridge: Any, patch: EdgePatch) -> Plan:
    """Hooks that apply the patch: the receiver head's q/k/v slice, or the final residual."""
    plan = Plan()
    r = patch.edge.receiver
    if isinstance(r, names.Logits):
        resid = patch.resid

        def final(x, hook):
            return like(resid, x)

        plan.add(hook_resid_post(bridge.cfg.n_layers - 1), final)
        return plan
    if not isinstance(r, names.HeadInput):
        raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    new = receiver_input(bridge, r.head, r.which, patch.resid)
    idx = r.head.head

    def swap(x, hook):
        x = x.clone()
        x[:, :, idx, :] = like(new, x)
        return x

    plan.add(hook_input(r.head.layer, r.which), swap)
    return plan


def fast_logits(bridge: Any, tokens: Any, patch: EdgePatch, extra: Plan | None = None) -> Any:
    plan = fast_plan(bridge, patch)
    if extra is not None:
        plan.hooks += extra.hooks
    return run_plan(bridge, tokens, plan)


def slow_logits(bridge: Any, tokens: Any, patch: EdgePatch, base: Cache) -> Float[Tensor, "n pos vocab"]:
    """Reference: recompute the receiver head's attention by hand, replace its z.

    q, k, v of head B are computed from LN1 of the base residual, except the
    patched input, computed from LN1 of the patched residual; then
    z = softmax(q k^T / scale + causal mask) v.  For `-> logits`, ln_final and
    the unembedding are applied by hand to the patched final residual.
    """
    import torch

    r = patch.edge.receiver
    if isinstance(r, names.Logits):
        with torch.no_grad():
            return wide(bridge.unembed(like(apply_module(bridge.ln_final, patch.resid, of(bridge)), bridge.W_U)))
    if not isinstance(r, names.HeadInput):
        raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    L, h = r.head.layer, r.head
    resid = wide(base[hook_resid_pre(L)])
    qkv = {w: receiver_input(bridge, h, w, patch.resid if w == r.which else resid) for w in "qkv"}
    scores = qkv["q"] @ qkv["k"].transpose(-1, -2) / attn_scale(bridge.cfg)
    s = scores.shape[-1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=scores.device), 1)
    z = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ qkv["v"]
    plan = Plan()

    def set_z(x, hook):
        x = x.clone()
        x[:, :, h.head, :] = like(z, x)
        return x

    plan.add(hook_z(L), set_z)
    return wide(run_plan(bridge, tokens, plan))


def freeze_patterns_plan(patterns: dict[int, Float[Tensor, "n head query key"]]) -> Plan:
    """Hooks that hold every layer's attention pattern at the given (base-run) values."""
    plan = Plan()
    for layer, pat in sorted(patterns.items()):
        plan.add(hook_pattern(layer), lambda x, hook, pat=pat: like(pat, x))
    return plan
