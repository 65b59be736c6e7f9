"""How much an intervention changes what is read: the test of non-vacuity.

An intervention can only show an effect through what it changes.  If the
corruption leaves a sender's output where its reader reads it as it was, swapping
clean for corrupted output there is the identity, and "no effect" means "not
tested".  Per prompt n, with Δ the change the intervention makes to a sender's
output and out its base-run output:

    r_n = sqrt(sum_p w_np ||Δ_np||^2) / sqrt(sum_p w_np ||out_np||^2)

(NaN where the sender writes nothing at those positions.  A sender silent on every
prompt is not vacuous but structurally unused: its route carries nothing at all, so
"unused" is true of it, and its effect is exactly zero)

over positions p weighted by where the output is read (`read_weights`):

* an edge into `logits`, or into the query of a head in the last layer: the
  scored positions (equal weights);
* into the key or value of a head in the last layer: the head's base-run
  attention from the scored positions to each position (averaged over them);
* into a head of an earlier layer: every position up to the last scored one (a
  later layer may read any of them).

Edge (A -> R, replacement o'):  Δ = o' - out_A(base) (a group of senders: the sum of
their changes over the sum of their outputs); an MLP receiver reads every position up
to the last scored one, or (last layer) the scored positions.  A path: the change
its first hop reads.
Edge circuit: what its receivers read through its removed edges, pooled over them per position,
each receiver at the positions it reads (RECEIVED), and averaged over positions
(mech.graph.received: a position's ratio, not a ratio of sums over positions).
Head ablation (each ablated head h):  Δ = out_h(replacement) - out_h(clean),
with out_h = z_h W_O[h] (inside the layer's post-attention norm where the model has one:
mech.edges.writes) and the replacement of the ablation type (zero: -out_h),
over every position up to the last scored one (what any later reader may read),
and, for the record, at the scored positions alone.  A change there that no
reader's weights pick up is not detected here: it shows as an ablation type
that changes the verdict (`sensitivity: true`, the ladder's robustness rung).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...model.devices import wide
from ...progress import progress
from ...spec import names
from ...spec.names import hook_mlp_out, hook_pattern, hook_z, unit_hook
from ...spec.vocabulary import Ablation, Direction, Replacement
from .. import hooks
from ..edges import paths, writes
from ..graph import received
from ..hooks import Cache
from .cached import PerPrompt, Runs

UP_TO_LAST = "every position up to the last scored one"
RECEIVED = ("the scored positions for the logits and the last layer's queries and MLP, every position up to "
            "the last scored one for the other receivers")


def scored_positions(runs: Runs) -> Any:
    """Weights [n, pos]: 1 at each scored position (counted as often as it is scored)."""
    import torch

    pos = runs.ds.positions.to(runs.ds.clean.device)
    n, s = runs.ds.clean.shape
    scored = torch.zeros(n, s, dtype=torch.float64, device=pos.device)
    return scored.scatter_add_(1, pos, torch.ones_like(pos, dtype=torch.float64))


def read_weights(runs: Runs, receiver: names.Receiver, base: dict[str, Any]) -> tuple[Any, str]:
    """(weights [n, pos] over positions, where they are), for a receiver of an edge."""
    pos = runs.ds.positions.to(runs.ds.clean.device)
    s = runs.ds.clean.shape[1]
    scored = scored_positions(runs)
    last = runs.n_layers - 1
    if isinstance(receiver, names.Logits):
        return scored, "the scored positions"
    if isinstance(receiver, names.Mlp) and receiver.layer == last:
        return scored, "the scored positions (the last layer's MLP reads each position for itself)"
    if isinstance(receiver, names.HeadInput) and receiver.head.layer == last:
        if receiver.which == "q":
            return scored, "the scored query positions"
        pattern = wide(base[hook_pattern(last)][:, receiver.head.head])  # [n, q, key]
        rows = pattern.gather(1, pos.to(pattern.device).unsqueeze(-1).expand(-1, -1, s))  # [n, k, key]
        return rows.mean(1), f"the key positions {receiver.head} attends to from the scored positions"
    return up_to_last(runs), UP_TO_LAST


def up_to_last(runs: Runs) -> Any:
    """Equal weights on every position up to each prompt's last scored position."""
    import torch

    pos = runs.ds.positions
    s = runs.ds.clean.shape[1]
    upto = torch.arange(s, device=pos.device)[None, :] <= pos.max(1, keepdim=True).values
    return upto.to(torch.float64)


def relative_change(delta: Any, out: Any, weights: Any) -> PerPrompt:
    """r_n (module docstring) from Δ and out [n, pos, d] and weights [n, pos]."""
    return ratio(*squares(delta, out, weights))


def squares(delta: Any, out: Any, weights: Any) -> tuple[Any, Any]:
    """(sum_p w_p |Δ_p|^2, sum_p w_p |out_p|^2) per prompt: r_n's numerator and denominator, which
    add over units changed together (their outputs side by side)."""
    w = weights.to(delta.device)
    return (w * (delta ** 2).sum(-1)).sum(-1), (w * (out ** 2).sum(-1)).sum(-1)


def ratio(num: Any, den: Any) -> PerPrompt:
    """r_n = sqrt(num / den), NaN where den is 0."""
    r = (num / den.clamp_min(1e-300)).sqrt()
    return np.asarray(r.where(den > 0, torch_nan(r)).cpu().numpy())


def torch_nan(like: Any) -> Any:
    import torch

    return torch.full_like(like, float("nan"))


def edge_change(runs: Runs, edge: names.Edge, direction: str, replacement: str) -> tuple[PerPrompt, str]:
    """(r_n, where it is read) for patching `edge` (Runs.patched's arguments)."""
    import torch

    with torch.no_grad():
        return _edge_change(runs, edge, direction, replacement)


def _edge_change(runs: Runs, edge: names.Edge, direction: str, replacement: str) -> tuple[PerPrompt, str]:
    noising = direction == Direction.NOISING
    base, source = (runs.clean, runs.corrupt) if noising else (runs.corrupt, runs.clean)
    out = paths.sender_output(runs.bridge, base, edge.sender)
    means = runs.mean_activations(edge.sender) if replacement == Replacement.MEAN else None
    delta = paths.first_change(runs.bridge, base, source, edge.sender, replacement, means)
    weights, where = read_weights(runs, edge.receiver, base)
    return relative_change(delta, out, weights), where


@dataclass(frozen=True)
class HeadChanges:
    """r_n of each ablated head's output and of all of them together (numerators and
    denominators summed over heads), up to the last scored position; and the joint r_n
    at the scored positions alone."""

    per_head: dict[names.Unit, PerPrompt]
    joint: PerPrompt
    joint_scored: PerPrompt


def head_changes(runs: Runs, heads: list[names.Unit], kind: str) -> HeadChanges:
    """How much ablating `heads` (heads and MLPs) with `kind` on the clean prompts changes
    their outputs (an MLP's output: its `hook_mlp_out`).  Where the base runs did not cache
    their activations (a zero-ablated circuit's outside heads: every head of the model), they
    are made again chunk by chunk (`with_activations`): one more forward of the prompts, in
    the memory of a chunk rather than of every prompt."""
    import torch

    with torch.no_grad():
        corrupted = kind == Ablation.RESAMPLE
        if not missing(runs, heads, corrupted):
            return _head_changes(runs, heads, kind)
        size = runs.chunk()
        if runs.scorers is None or runs.ds.n <= size:  # runs that cannot be narrowed: all prompts at once
            return _head_changes(with_activations(runs, heads, corrupted), heads, kind)
        parts = [_head_changes(with_activations(runs.prompts(lo, min(runs.ds.n, lo + size)), heads, corrupted),
                               heads, kind)
                 for lo in progress(range(0, runs.ds.n, size), f"{len(heads)} ablated units' outputs again, "
                                    f"{runs.ds.n} prompts in chunks of {size}", quiet=True)]
        return HeadChanges({h: np.concatenate([p.per_head[h] for p in parts]) for h in heads},
                           np.concatenate([p.joint for p in parts]), np.concatenate([p.joint_scored for p in parts]))


def missing(runs: Runs, units: list[names.Unit], corrupted: bool = False) -> list[str]:
    """The hooks holding `units`' activations (with what a post-attention norm reads) that the clean
    run (and, with `corrupted`, the corrupted run) did not cache."""
    wanted = hooks.for_architecture(runs.bridge, [unit_hook(u) for u in units])
    return [h for h in wanted if h not in runs.clean or (corrupted and h not in runs.corrupt)]


def with_activations(runs: Runs, units: list[names.Unit], corrupted: bool = False) -> Runs:
    """`runs` with `units`' activations in the clean run's cache (and the corrupted run's, with
    `corrupted`), those the base runs did not cache made by a forward of these runs' prompts."""
    need = missing(runs, units, corrupted)
    if not need:
        return runs

    def add(run: Cache, tokens: Any) -> Cache:
        got = hooks.cache_hooks(runs.bridge, tokens, [h for h in need if h not in run], runs.ds.positions, keep=0)
        return {**run, **{h: t for h, t in got.items() if h in need}}

    return replace(runs, clean=add(runs.clean, runs.ds.clean),
                   corrupt=add(runs.corrupt, runs.corrupted_tokens) if corrupted else runs.corrupt)


def _head_changes(runs: Runs, heads: list[names.Unit], kind: str) -> HeadChanges:
    import torch

    weights, scored = up_to_last(runs), scored_positions(runs)
    only_heads = [h for h in heads if isinstance(h, names.Head)]
    mlps = {m.layer for m in heads if isinstance(m, names.Mlp)}
    means = runs.mean_z({h.layer for h in only_heads}) if kind == Ablation.MEAN else {}
    mlp_means = runs.mean_mlp(mlps) if kind == Ablation.MEAN else {}
    per_head: dict[names.Unit, PerPrompt] = {}
    joint = [0.0, 0.0]  # every unit's numerator and denominator together, over weights and over scored
    scored_sums = [0.0, 0.0]
    for h in heads:
        if isinstance(h, names.Mlp):
            base = wide(runs.clean[hook_mlp_out(h.layer)])
            new = (torch.zeros_like(base) if kind == Ablation.ZERO else wide(mlp_means[h.layer]).expand_as(base)
                   if kind == Ablation.MEAN else wide(runs.corrupt[hook_mlp_out(h.layer)]))
            delta = new - base
        else:
            z = wide(runs.clean[hook_z(h.layer)][:, :, h.head])
            if kind == Ablation.ZERO:
                z_new = torch.zeros_like(z)
            elif kind == Ablation.MEAN:
                z_new = wide(means[h.layer][:, :, h.head]).expand_as(z)
            else:
                z_new = wide(runs.corrupt[hook_z(h.layer)][:, :, h.head])
            base = writes.output(runs.bridge, runs.clean, h)  # z W_O, or inside a post-attention norm
            delta = writes.change(runs.bridge, runs.clean, h, {h: z_new})
        num, den = squares(delta, base, weights)
        per_head[h] = ratio(num, den)
        joint = [joint[0] + num, joint[1] + den]
        num_s, den_s = squares(delta, base, scored)
        scored_sums = [scored_sums[0] + num_s, scored_sums[1] + den_s]
    return HeadChanges(per_head, ratio(*joint), ratio(*scored_sums))


def received_change(runs: Runs, keep: np.ndarray, kind: str) -> tuple[PerPrompt, PerPrompt]:
    """(r_n, r_n at the scored positions alone) of what the edge circuit `keep` [senders, receivers]
    gives its receivers through its removed edges, ablated with `kind`: per position, averaged over
    positions (mech.graph.received)."""
    import torch

    def squares(r: Runs) -> list[PerPrompt]:
        clean = r.writes(r.clean)
        rep = (r.writes(r.corrupt) if kind == Replacement.RESAMPLE else r.mean_writes()
               if kind == Replacement.MEAN else clean.zeros())
        return list(received.received_squares(r.graph_model(), clean, rep, keep, scored_positions(r), up_to_last(r)))

    with torch.no_grad():
        num, den, num_all, den_all = runs.in_chunks(squares) or squares(runs)
        scored = scored_positions(runs)[:, :num.shape[1]].cpu().numpy() > 0
    return received.position_mean(num, den), received.position_mean(num_all, den_all, scored)
