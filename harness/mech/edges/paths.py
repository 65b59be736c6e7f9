"""Path patching: a sender's change carried along a listed route of nodes, MLP
nodes and groups of senders included (the general case of exact edge patching).

For a path  n0 -> n1 -> ... -> nm  (names.Path; m = 1 is an edge), a base run b
and a source run s:

    D_0 = the change of n0's write when its members' activations are replaced
          (mech.edges.writes: sum of (z' - z) W_O over heads without post norms)
    D_k = write_nk(input_b + D_{k-1}) - write_nk(input_b)     k = 1 .. m-1 (intermediate hops)

where a hop reads the change only through its listed input and its own output
change goes only to the next hop (nothing else sees it):

* a head input `LlHh.x`: x = norm1_l(resid_pre_l + D) W_x + b_x for head h alone, the
  other two of q/k/v from the base residual, then h's attention as the model computes
  it (rotary, grouped keys and values, soft cap, sliding window: mech.block.attention); its
  write z W_O[h], or inside the layer's post-attention norm (Gemma 2, mech.edges.writes);
* an MLP `Ll.mlp`: MLP_l(norm2_l(resid_mid_l + D)) (it reads the residual after its
  layer's attention, so the heads of layer l can feed it), then its post norm where the
  model has one.  With parallel blocks (GPT-NeoX) the MLP reads the block's input,
  norm2_l(resid_pre_l + D), and a head of layer l does not feed MLP l: such a route is
  refused;
* outputs: a head's is its write (the shared b_O cancels), embed's what enters the
  residual before block 0, an MLP's `hook_mlp_out` (its output bias cancels).

The last hop nm receives D_{m-1} the same way, and its changed output is written
into the residual stream: every later reader sees it in an ordinary forward pass
from there (a head input: as patching.fast_plan; an MLP: its `hook_mlp_out` is
replaced; `logits`: the final residual gets + D_{m-1}).  Everything else reads the
base run.  Replacements: `resample` (the source run's activation), `mean` (the
per-position mean over reference prompts, mech.runs.reference.Reference), `zero`.

The changes are computed in float64 from the base and source runs' caches, with
the model's own norm and MLP modules; only the last hop runs inside a forward.

All routes (`AllRoutes`, an edge claim's `routes: all`): the sender's effect on the receiver's
input by every route through the layers in between, as TransformerLens-style path patching
with nothing frozen.  One forward of the base prompts with the sender's activations replaced
(z, MLP output or embedding: `sender_plan`) gives the residual the receiver reads, r'_v; then

    D = r'_v - r_v          (r_v: the base run's, at the same hook)

is delivered to the receiver alone exactly as an edge's last hop (`last_plan`).  Every head
and MLP between sender and receiver responds to the sender, but only the receiver's listed
input sees the result.  Cost: that forward (from the sender's layer where the base run cached
its residual) and the patched forward (from the receiver's layer).  A route into `logits`
by all routes is the sender's whole effect (the same as patching the sender).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ...errors import UnsupportedError
from ...model import architecture
from ...model.bridge import Bridge
from ...model.devices import like, of, wide
from ...spec import names
from ...spec.names import (
    HOOK_EMBED,
    HOOK_POS_EMBED,
    hook_mlp_out,
    hook_resid_mid,
    hook_resid_post,
    hook_resid_pre,
    hook_z,
)
from ...spec.vocabulary import Replacement
from ..block import attention
from ..hooks import Cache, Plan, cache_hooks, run_plan
from . import patching, writes

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

    Residual = Float[Tensor, "n pos d_model"]

@dataclass(frozen=True)
class AllRoutes:
    """An edge read by every route from its sender to its receiver's input (module docstring)."""

    edge: names.Edge

    @property
    def sender(self) -> names.Sender:
        return self.edge.sender

    @property
    def receiver(self) -> names.Receiver:
        return self.edge.receiver

    def __str__(self) -> str:
        return f"{self.edge} (all routes)"


Route = names.Path | names.Edge | AllRoutes
Forward = Callable[[Plan], object]  # runs the base prompts with a plan's hooks


def as_path(route: Route) -> names.Path:
    """An edge as the one-hop path it is (all routes: the edge whose ends they join)."""
    if isinstance(route, AllRoutes):
        route = route.edge
    return route if isinstance(route, names.Path) else names.Path(route.sender, (route.receiver,))


def first_edge(route: Route) -> names.Edge:
    """The sender and the first hop: what the sender's change is read by (non-vacuity)."""
    path = as_path(route)
    return names.Edge(path.sender, path.hops[0])


def needs_paths(route: Route) -> bool:
    """Whether a route needs this module: more than one hop, an MLP end or a group of
    senders (a head or embed into a head input or logits is patching.py's edge)."""
    path = as_path(route)
    return (isinstance(route, AllRoutes) or len(path.hops) > 1 or isinstance(path.sender, (names.Mlp, names.Group))
            or isinstance(path.hops[-1], names.Mlp))


def cache_names(route: Route, n_layers: int) -> list[str]:
    """Hooks to cache in the base and source runs (and the reference run, for means);
    hooks.cache_hooks adapts them to the architecture."""
    path = as_path(route)
    out: list[str] = list(writes.activation_names(path.sender))
    for hop in path.hops:
        if isinstance(hop, names.Mlp):
            out += [hook_resid_mid(hop.layer), hook_resid_pre(hop.layer), hook_mlp_out(hop.layer)]
        else:
            out += patching.receiver_names(hop, n_layers)
        if isinstance(hop, names.HeadInput):
            out += writes.activation_names(hop.head)
    if isinstance(route, AllRoutes):
        first = min(layer_of(m) for m in names.members(route.sender))
        out.append(hook_resid_pre(first))  # the sender's forward starts there
    return list(dict.fromkeys(out))


def layer_of(member: names.Node) -> int:
    """The block a sender member writes in (embed: 0, the first block reads it)."""
    return 0 if isinstance(member, names.Embed) else member.layer


def node_output(bridge: Bridge, cache: Cache, node: names.Node) -> Residual:
    """What a node writes into the residual stream in the run `cache` holds [n, pos, d] (float64)."""
    return writes.output(bridge, cache, node)


def sender_output(bridge: Bridge, cache: Cache, sender: names.Sender) -> Residual:
    """A sender's write (a group's: its members' joint write; mech.edges.writes)."""
    return writes.output(bridge, cache, sender)


def first_change(bridge: Bridge, base: Cache, source: Cache | None, sender: names.Sender, replacement: str,
                 means: dict[Any, Any] | None = None) -> Residual:
    """D_0: the sender's replacement write minus its base write (mech.edges.writes.sender_change)."""
    return writes.sender_change(bridge, base, source, sender, replacement, means)


def mlp_reads(bridge: Bridge, layer: int) -> str:
    """The residual MLP `layer` reads: after its layer's attention (resid_mid), or, in a model
    with parallel blocks, the block's input (resid_pre)."""
    return hook_resid_pre(layer) if architecture.of(bridge).parallel else hook_resid_mid(layer)


def mlp_output(bridge: Bridge, layer: int, resid: Residual) -> Residual:
    """What MLP `layer` adds to the residual when it reads `resid`: MLP_l(norm2_l(resid)), then the
    norm after the MLP where the model has one (the model's modules; float64)."""
    block = bridge.blocks[layer]
    device = of(bridge)
    ln2 = getattr(block, "ln2", None)  # none in OLMo 2
    out = patching.apply_module(block.mlp, resid if ln2 is None else patching.apply_module(ln2, resid, device), device)
    post = getattr(block, "ln2_post", None)
    return cast("Tensor", patching.apply_module(post, out, device) if post is not None else out)


def head_z(bridge: Bridge, receiver: names.HeadInput, resid_pre: Residual, changed: Residual, base: Cache) -> Any:
    """Head h's z when its input `receiver.which` reads `changed` and the other two read
    `resid_pre` (its attention recomputed by hand, mech.block.attention; float64)."""
    inputs = {w: changed if w == receiver.which else resid_pre for w in "qkv"}
    return attention.head_z(bridge, receiver.head, inputs)


def hop_change(bridge: Bridge, base: Cache, hop: names.Receiver, change: Residual) -> Residual:
    """D_k: how much an intermediate hop's write changes when its listed input reads the
    base residual plus `change` (both writes computed by hand, so their rounding cancels)."""
    if isinstance(hop, names.HeadInput):
        attention.check(bridge, base, hop.head.layer)
        resid = wide(base[hook_resid_pre(hop.head.layer)]).to(change.device)
        old = head_z(bridge, hop, resid, resid, base)
        new = head_z(bridge, hop, resid, resid + change, base)
        return (writes.change(bridge, base, hop.head, {hop.head: new})
                - writes.change(bridge, base, hop.head, {hop.head: old}))
    if isinstance(hop, names.Mlp):
        resid = wide(base[mlp_reads(bridge, hop.layer)]).to(change.device)
        return mlp_output(bridge, hop.layer, resid + change) - mlp_output(bridge, hop.layer, resid)
    raise ValueError(f"{hop} cannot be an intermediate hop of a path")


def last_plan(bridge: Bridge, base: Cache, receiver: names.Receiver, change: Residual) -> Plan:
    """Hooks that deliver `change` into the last hop's listed input and write its changed
    output into the residual stream."""
    if isinstance(receiver, names.Mlp):
        resid = wide(base[mlp_reads(bridge, receiver.layer)]).to(change.device)
        new = mlp_output(bridge, receiver.layer, resid + change)
        plan = Plan()
        plan.add(hook_mlp_out(receiver.layer), lambda x, hook: like(new, x))
        return plan
    resid = patching.receiver_residual(bridge, base, receiver).to(change.device) + change
    some = names.Edge(names.Embed(), receiver)  # fast_plan reads only the receiver and the residual
    return patching.fast_plan(bridge, patching.EdgePatch(some, resid), base)


def read_hook(bridge: Bridge, receiver: names.Receiver) -> str:
    """The hook whose residual the receiver reads: its layer's resid_pre (a head input), what
    an MLP reads (mlp_reads), the last resid_post (logits)."""
    if isinstance(receiver, names.HeadInput):
        return hook_resid_pre(receiver.head.layer)
    if isinstance(receiver, names.Mlp):
        return mlp_reads(bridge, receiver.layer)
    return hook_resid_post(int(bridge.cfg.n_layers) - 1)


def sender_plan(bridge: Bridge, base: Cache, source: Cache | None, sender: names.Sender, replacement: str,
                means: dict[Any, Any] | None = None) -> Plan:
    """Hooks that give each of the sender's members its replacement activation (writes.replacement)
    in a forward of the base prompts: a head's slice of z, an MLP's output, the embedding (the
    learned positions kept, so embed + positions becomes the replacement)."""
    out = Plan()
    for m in writes.members(sender):
        new = writes.replacement(bridge, base, source, m, replacement, (means or {}).get(m))
        if isinstance(m, names.Head):
            def set_z(z: Any, hook: Any, new: Any = new, h: int = m.head) -> Any:
                z = z.clone()
                z[:, :, h, :] = like(new, z)
                return z

            out.add(hook_z(m.layer), set_z)
        elif isinstance(m, names.Mlp):
            out.add(hook_mlp_out(m.layer), lambda x, hook, new=new: like(new, x).clone())
        else:
            pos = wide(base[HOOK_POS_EMBED]).to(new.device) if HOOK_POS_EMBED in base else 0.0
            out.add(HOOK_EMBED, lambda x, hook, e=new - pos: like(e, x).clone())
    return out


def all_routes_change(bridge: Bridge, route: AllRoutes, base: Cache, source: Cache | None, replacement: str,
                      means: dict[Any, Any] | None, forward: Forward) -> Residual:
    """D = r'_v - r_v: how the residual the receiver reads changes when the sender is replaced and
    every component in between responds (module docstring; one forward)."""
    read = read_hook(bridge, route.receiver)
    got: dict[str, Any] = {}

    def grab(x: Any, hook: Any) -> Any:
        got[read] = x.detach()
        return x

    run = sender_plan(bridge, base, source, route.sender, replacement, means)
    run.add(read, grab)
    forward(run)
    return cast("Tensor", wide(got[read]) - wide(base[read]).to(got[read].device))


def plan(bridge: Bridge, route: Route, base: Cache, source: Cache | None, replacement: str,
         means: dict[Any, Any] | None = None, forward: Forward | None = None) -> Plan:
    """The hooks of one patched forward of the base prompts along `route` (`means`: each sender
    member's reference mean activation, for the mean replacement; `forward`: runs the base
    prompts with a plan, which all routes need for the sender's forward)."""
    path = as_path(route)
    check_route(bridge, path)
    if isinstance(route, AllRoutes):
        if forward is None:
            raise ValueError("patching all routes needs a forward of the base prompts")
        return last_plan(bridge, base, route.receiver,
                         all_routes_change(bridge, route, base, source, replacement, means, forward))
    change = first_change(bridge, base, source, path.sender, replacement, means)
    for hop in path.hops[:-1]:
        change = hop_change(bridge, base, hop, change)
    return last_plan(bridge, base, path.hops[-1], change)


def patch_path(bridge: Bridge, route: Route, base_tokens: Any, source_tokens: Any,
               replacement: str = Replacement.RESAMPLE, reference_tokens: Any = None) -> Float[Tensor, "n pos vocab"]:
    """The logits [n, pos, vocab] (float64) of the base prompts with `route` patched: the
    whole computation from tokens (caching what it needs; `reference_tokens` [m, pos]: the
    prompts the `mean` replacement averages over, per position)."""
    needed = cache_names(route, int(bridge.cfg.n_layers))
    base = cache_hooks(bridge, base_tokens, needed)
    source = cache_hooks(bridge, source_tokens, needed)
    means = None
    if replacement == Replacement.MEAN:
        if reference_tokens is None:
            raise ValueError("the mean replacement needs reference_tokens")
        ref = cache_hooks(bridge, reference_tokens, needed)
        means = {m: writes.activation(bridge, ref, m).mean(0, keepdim=True)
                 for m in writes.members(as_path(route).sender)}
    def forward(p: Plan) -> object:
        return run_plan(bridge, base_tokens, p)

    patched = plan(bridge, route, base, source, replacement, means, forward)
    return cast("Tensor", wide(run_plan(bridge, base_tokens, patched)))


def check_route(bridge: Bridge, path: names.Path) -> None:
    """Refuse a route through an edge the architecture does not have: in a model with parallel
    blocks, a head of layer l does not feed MLP l (both read the block's input)."""
    if not architecture.of(bridge).parallel:
        return
    nodes = [*names.members(path.sender), *path.hops]
    for a, b in zip(nodes, nodes[1:]):
        head = a.head if isinstance(a, names.HeadInput) else a
        if isinstance(head, names.Head) and isinstance(b, names.Mlp) and head.layer == b.layer:
            raise UnsupportedError(f"{head} -> {b}: in {architecture.of(bridge).name} attention and MLP of a layer "
                                   "run in parallel on the same input, so a head does not feed its own layer's MLP")
