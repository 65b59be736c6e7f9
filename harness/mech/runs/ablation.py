"""Many head ablations in one forward: the variants are stacked along the batch.

Variant v ablates its heads H_v, each head's z replaced by a source (hooks.ablation_plan):

    z_v[n, p, h] <- src_v[layer][n or 0, p, h]   for h in H_v   (zeros for zero ablation)
    z_v[n, p, h]  = z[n, p, h]                   otherwise

Every variant starts from the same cached residual at the lowest ablated layer
(nothing below it can change), the blocks run once on [V n, pos, d_model], and
the unembedding is applied at the scored positions only (hooks.run_from).  The
result equals V separate `Runs.ablated` calls; stacking saves the per-forward
overhead that dominates small models and keeps large matrix products large.

Chunks of variants follow a memory budget (the activations of one block for
one variant, estimated from the shapes), so peak memory does not grow with the
number of variants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import memory
from ...model.bridge import Bridge
from ...model.shape import vocab_out
from ...spec.names import Head, hook_z
from ..hooks import Plan, logits_bytes, run_from

DEFAULT_BUDGET = 64 * 2**20  # stacking saves per-forward overhead; larger stacks were not faster on a CPU


@dataclass
class Variant:
    """One joint ablation: the heads and, per layer, the z that replaces theirs
    ([1 or n, pos, n_heads, d_head]; None means zeros)."""

    heads: list[Head]
    sources: dict[int, Any]


def bytes_per_variant(n: int, s: int, d: int, d_mlp: int, n_heads: int, itemsize: int = 4, k: int = 0,
                      vocab: int = 0) -> int:
    """Working memory of one variant's pass through a block (residual, q/k/v/z, MLP hidden,
    attention scores and pattern), with a factor 2 for temporaries, and of its logits at the k
    scored positions with the float64 temporaries of their metric (hooks.logits_bytes a prompt)."""
    return 2 * itemsize * n * s * (6 * d + 2 * d_mlp + 2 * n_heads * s) + n * logits_bytes(k, vocab)


def ablated_metrics(bridge: Bridge, resid: Any, start: int, positions: Any, variants: list[Variant],
                    metric_rows: Callable[[Any], np.ndarray], *, budget_bytes: int | None = None) -> np.ndarray:
    """[V, n] metric of each variant.  `resid`: the run's blocks.{start}.hook_resid_pre [n, pos, d];
    `metric_rows(logits_at [V' n, k, vocab])` -> [V' n] metric (answers tiled V' times)."""
    cfg = bridge.cfg
    budget_bytes = memory.working(DEFAULT_BUDGET) if budget_bytes is None else budget_bytes
    n, s, d = resid.shape
    d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * d)
    size = max(1, budget_bytes // bytes_per_variant(n, s, d, d_mlp, cfg.n_heads, resid.element_size(),
                                                    int(positions.shape[1]), vocab_out(cfg)))
    out = np.zeros((len(variants), n))
    for lo in range(0, len(variants), size):
        chunk = variants[lo:lo + size]
        V = len(chunk)
        plan = _plan(chunk, n, start)
        tiled = resid.repeat(V, 1, 1)
        logits_at = run_from(bridge, start, tiled, plan, positions.repeat(V, 1))
        out[lo:lo + V] = np.asarray(metric_rows(logits_at)).reshape(V, n)
    return out


def _plan(chunk: list[Variant], n: int, start: int) -> Plan:
    """One hook per ablated layer: rows of variant v take their heads' z from v's source."""
    layers = sorted({h.layer for v in chunk for h in v.heads})
    plan = Plan()
    for layer in layers:
        if layer < start:
            raise ValueError(f"variant ablates layer {layer}, below the start layer {start}")
        heads = [[h.head for h in v.heads if h.layer == layer] for v in chunk]
        sources = [v.sources.get(layer) for v in chunk]

        def fn(z: Any, hook: Any, heads: list[list[int]] = heads, sources: list[Any] = sources) -> Any:
            V = len(heads)
            z = z.clone().view(V, n, *z.shape[1:])
            for v, (idx, src) in enumerate(zip(heads, sources, strict=True)):
                if not idx:
                    continue
                if src is None:
                    z[v][:, :, idx, :] = 0.0
                else:
                    z[v][:, :, idx, :] = src[:, :, idx, :].to(z.dtype).expand(n, -1, -1, -1)
            return z.view(V * n, *z.shape[2:])

        plan.add(hook_z(layer), fn)
    if not plan.hooks:  # no head ablated in any variant: still one (identity) hook so the plan is checked
        plan.add(hook_z(start), lambda z, hook: z)
    return plan
