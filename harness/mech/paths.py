"""Path patching: a sender's change carried along a listed route of nodes, MLP
nodes and groups of senders included (the general case of exact edge patching).

For a path  n0 -> n1 -> ... -> nm  (names.Path; m = 1 is an edge), a base run b
and a source run s:

    D_0 = sum over n0's members of (out_rep - out_b)        (rep: the replacement output)
    D_k = out_nk(input_b + D_{k-1}) - out_nk(input_b)       k = 1 .. m-1 (intermediate hops)

where a hop reads the change only through its listed input and its own output
change goes only to the next hop (nothing else sees it):

* a head input `LlHh.x`: x = LN1_l(resid_pre_l + D) W_x + b_x for head h alone, the
  other two of q/k/v from the base residual, then h's attention; out = z W_O[h];
* an MLP `Ll.mlp`: out = MLP_l(LN2_l(resid_mid_l + D)) (it reads the residual after
  its layer's attention, so the heads of layer l can feed it);
* outputs: a head's is z W_O[h] (the shared b_O cancels), embed's the token plus
  positional embedding, an MLP's `hook_mlp_out` (its output bias cancels).

The last hop nm receives D_{m-1} the same way, and its changed output is written
into the residual stream: every later reader sees it in an ordinary forward pass
from there (a head input: that head's q/k/v slice is replaced, as in
patching.fast_plan; an MLP: its `hook_mlp_out` is replaced; `logits`: the final
residual gets + D_{m-1}).  Everything else reads the base run.  Replacements:
`resample` (the source run's output), `mean` (the per-position mean over
reference prompts, mech.runs.Reference), `zero`.

The changes are computed in float64 from the base and source runs' caches, with
the model's own norm and MLP modules; only the last hop runs inside a forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..model.devices import like, of, wide
from ..spec import names
from ..spec.names import hook_mlp_out, hook_resid_mid, hook_resid_post, hook_resid_pre, hook_z
from ..spec.vocabulary import REPLACEMENTS
from . import patching
from .hooks import Cache, Plan, cache_hooks, run_plan

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

    Residual = Float[Tensor, "n pos d_model"]

Route = names.Path | names.Edge


def as_path(route: Route) -> names.Path:
    """An edge as the one-hop path it is."""
    return route if isinstance(route, names.Path) else names.Path(route.sender, (route.receiver,))


def first_edge(route: Route) -> names.Edge:
    """The sender and the first hop: what the sender's change is read by (non-vacuity)."""
    path = as_path(route)
    return names.Edge(path.sender, path.hops[0])


def needs_paths(route: Route) -> bool:
    """Whether a route needs this module: more than one hop, an MLP end or a group of
    senders (a head or embed into a head input or logits is patching.py's edge)."""
    path = as_path(route)
    return (len(path.hops) > 1 or isinstance(path.sender, (names.Mlp, names.Group))
            or isinstance(path.hops[-1], names.Mlp))


def cache_names(route: Route, n_layers: int) -> list[str]:
    """Hooks to cache in the base and source runs (and the reference run, for means)."""
    path = as_path(route)
    out: list[str] = []
    for m in names.members(path.sender):
        if isinstance(m, names.Head):
            out.append(hook_z(m.layer))
        elif isinstance(m, names.Mlp):
            out.append(hook_mlp_out(m.layer))
        else:
            out += [names.HOOK_EMBED, names.HOOK_POS_EMBED]
    for hop in path.hops:
        if isinstance(hop, names.HeadInput):
            out.append(hook_resid_pre(hop.head.layer))
        elif isinstance(hop, names.Mlp):
            out += [hook_resid_mid(hop.layer), hook_resid_pre(hop.layer)]
        else:
            out += [hook_resid_post(n_layers - 1), hook_resid_pre(n_layers - 1)]
    return list(dict.fromkeys(out))


def node_output(bridge: Any, cache: Cache, node: names.Node) -> Residual:
    """What a node writes into the residual stream in the run `cache` holds [n, pos, d] (float64)."""
    if isinstance(node, names.Mlp):
        return wide(cache[hook_mlp_out(node.layer)])
    return patching.sender_output(bridge, cache, node)


def sender_output(bridge: Any, cache: Cache, sender: names.Sender) -> Residual:
    """A sender's output; a group's is the sum of its members'."""
    outs = [node_output(bridge, cache, m) for m in names.members(sender)]
    total = outs[0]
    for o in outs[1:]:
        total = total + o.to(total.device)
    return total


def first_change(bridge: Any, base: Cache, source: Cache, sender: names.Sender, replacement: str,
                 mean_out: Residual | None = None) -> Residual:
    """D_0: the sender's replacement output minus its base output."""
    out_b = sender_output(bridge, base, sender)
    if replacement == "resample":
        return sender_output(bridge, source, sender).to(out_b.device) - out_b
    if replacement == "mean":
        if mean_out is None:
            raise ValueError("mean replacement needs the reference mean of the sender's output")
        return wide(mean_out).to(out_b.device).expand_as(out_b) - out_b
    if replacement == "zero":
        return -out_b
    raise ValueError(f"unknown replacement {replacement!r}; allowed: {', '.join(REPLACEMENTS)}")


def mlp_output(bridge: Any, layer: int, resid_mid: Residual) -> Residual:
    """MLP_l(LN2_l(resid_mid)) with the model's modules (float64)."""
    block = bridge.blocks[layer]
    device = of(bridge)
    return patching.apply_module(block.mlp, patching.apply_module(block.ln2, resid_mid, device), device)


def head_output(bridge: Any, receiver: names.HeadInput, resid_pre: Residual, changed: Residual) -> Residual:
    """Head h's output z W_O[h] when its input `receiver.which` reads `changed` and the other
    two read `resid_pre` (causal attention recomputed by hand, float64)."""
    import torch

    h = receiver.head
    qkv = {w: patching.receiver_input(bridge, h, w, changed if w == receiver.which else resid_pre) for w in "qkv"}
    scores = qkv["q"] @ qkv["k"].transpose(-1, -2) / patching.attn_scale(bridge.cfg)
    s = scores.shape[-1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=scores.device), 1)
    z = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ qkv["v"]
    return z @ wide(bridge.W_O[h.layer, h.head]).to(z.device)


def hop_change(bridge: Any, base: Cache, hop: names.Receiver, change: Residual) -> Residual:
    """D_k: how much an intermediate hop's output changes when its listed input reads the
    base residual plus `change`."""
    if isinstance(hop, names.HeadInput):
        resid = wide(base[hook_resid_pre(hop.head.layer)]).to(change.device)
        return head_output(bridge, hop, resid, resid + change) - head_output(bridge, hop, resid, resid)
    if isinstance(hop, names.Mlp):
        resid = wide(base[hook_resid_mid(hop.layer)]).to(change.device)
        return mlp_output(bridge, hop.layer, resid + change) - mlp_output(bridge, hop.layer, resid)
    raise ValueError(f"{hop} cannot be an intermediate hop of a path")


def last_plan(bridge: Any, base: Cache, receiver: names.Receiver, change: Residual) -> Plan:
    """Hooks that deliver `change` into the last hop's listed input and write its changed
    output into the residual stream."""
    if isinstance(receiver, names.Mlp):
        new = mlp_output(bridge, receiver.layer, wide(base[hook_resid_mid(receiver.layer)]).to(change.device)
                         + change)
        plan = Plan()
        plan.add(hook_mlp_out(receiver.layer), lambda x, hook: like(new, x))
        return plan
    key = (hook_resid_pre(receiver.head.layer) if isinstance(receiver, names.HeadInput)
           else hook_resid_post(bridge.cfg.n_layers - 1))
    resid = wide(base[key]).to(change.device) + change
    some = names.Edge(names.Embed(), receiver)  # fast_plan reads only the receiver and the residual
    return patching.fast_plan(bridge, patching.EdgePatch(some, resid))


def plan(bridge: Any, route: Route, base: Cache, source: Cache, replacement: str,
         mean_out: Residual | None = None) -> Plan:
    """The hooks of one patched forward of the base prompts along `route`."""
    path = as_path(route)
    change = first_change(bridge, base, source, path.sender, replacement, mean_out)
    for hop in path.hops[:-1]:
        change = hop_change(bridge, base, hop, change)
    return last_plan(bridge, base, path.hops[-1], change)


def patch_path(bridge: Any, route: Route, base_tokens: Any, source_tokens: Any, replacement: str = "resample",
               reference_tokens: Any = None) -> Float[Tensor, "n pos vocab"]:
    """The logits [n, pos, vocab] (float64) of the base prompts with `route` patched: the
    whole computation from tokens (caching what it needs; `reference_tokens` [m, pos]: the
    prompts the `mean` replacement averages over, per position)."""
    needed = cache_names(route, int(bridge.cfg.n_layers))
    base = cache_hooks(bridge, base_tokens, needed)
    source = cache_hooks(bridge, source_tokens, needed)
    mean_out = None
    if replacement == "mean":
        if reference_tokens is None:
            raise ValueError("the mean replacement needs reference_tokens")
        ref = cache_hooks(bridge, reference_tokens, needed)
        mean_out = sender_output(bridge, ref, as_path(route).sender).mean(0, keepdim=True)
    return wide(run_plan(bridge, base_tokens, plan(bridge, route, base, source, replacement, mean_out)))
