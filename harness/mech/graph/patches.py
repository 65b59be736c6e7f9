"""Through the edge graph (mech.graph.forward), many at a time: edges with an MLP end, patched
together instead of one forward each (what Runs.patched_many does for the edges the batched
head path, mech.edges.batched, does not take), and edge circuits (Runs.edge_circuits)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...spec import names
from ...spec.names import hook_resid_post, hook_resid_pre
from ...spec.vocabulary import Direction, Replacement
from ..edges import paths


def patch_mlp_ends(runs: Any, edges: Sequence[names.Edge], direction: str, replacement: str) -> None:
    """Edges with an MLP end among `edges`, patched together through the edge graph of `runs`
    (mech.runs.cached.Runs; mech.graph.forward: each edge is the circuit of every edge but it, with the base
    run's writes kept and the source's replacing it), when the base runs cached what the graph
    reads; memoised in runs.memo as Runs.patched would.  Nothing happens for fewer than two such
    edges, or where the graph cannot take them (Runs.patched then runs each on its own)."""
    import torch

    todo = [e for e in dict.fromkeys(edges) if isinstance(e, names.Edge) and paths.needs_paths(e)
            and not isinstance(e.sender, names.Group)
            and runs.edge_key(e, direction, replacement, False, None) not in runs.memo]
    if len(todo) < 2 or runs.metric_rows is None or not runs.has_writes(runs.clean):
        return
    if direction != Direction.NOISING and replacement != Replacement.RESAMPLE:
        return
    gm = runs.graph_model()
    g = gm.graph
    if not all(g.has(e) for e in todo):
        return
    noising = direction == Direction.NOISING
    base = runs.writes(runs.clean if noising else runs.corrupt)
    rep = (runs.writes(runs.corrupt if noising else runs.clean) if replacement == Replacement.RESAMPLE
           else runs.mean_writes() if replacement == Replacement.MEAN else base.zeros())
    pairs = [(g.sender_index(e.sender), g.receiver_index(e.receiver)) for e in todo]
    run = runs.clean if noising else runs.corrupt
    L = runs.n_layers
    entering = [hook_resid_pre(layer) for layer in range(L)] + [hook_resid_post(L - 1)]
    if all(entering[g.receiver_layer(v)] in run for _, v in pairs):  # each from its receiver's layer on
        got = gm.edge_patches(base, rep, lambda layer: run[entering[layer]], pairs, runs.ds.positions,
                              runs.metric_rows)
    else:  # the graph forward of every edge but one, from the start
        masks = np.repeat(g.full()[None], len(todo), axis=0)
        for i, (u, v) in enumerate(pairs):
            masks[i, u, v] = False
        with torch.no_grad():
            got = gm.circuits(base, rep, masks, runs.ds.positions, runs.metric_rows)
    for e, m in zip(todo, got, strict=True):
        runs.memo[runs.edge_key(e, direction, replacement, False, None)] = m


def circuit_metrics(runs: Any, masks: Sequence[np.ndarray], kind: str, drop: int | None = None) -> list[np.ndarray]:
    """Runs.edge_circuits: the metric of the clean prompts keeping only each mask's edges, many
    circuits per whole-graph pass (mech.graph.forward.GraphModel.circuits), each distinct circuit
    (by corruption, replacement, left-out group and the mask's bits) computed once per run and
    memoised in runs.memo."""
    import hashlib

    keys = [("circuit", runs.corruption if kind == Replacement.RESAMPLE else "", str(kind), drop,
             hashlib.sha1(np.packbits(m).tobytes()).hexdigest()) for m in masks]
    todo: list[int] = []
    pending: set[tuple[Any, ...]] = set()
    for i, k in enumerate(keys):
        if k not in runs.memo and k not in pending:
            pending.add(k)
            todo.append(i)
    if todo:
        keep = np.stack([masks[i] for i in todo])
        # prompts in chunks (Runs.in_chunks): every sender's write, clean and replaced, is built for a
        # chunk's prompts only (at Gemma 3 270M's width, 0.5 GB a run of 50 prompts)
        got = runs.in_chunks(lambda r: list(_circuits(r, keep, kind, drop)))
        for i, m in zip(todo, got if got is not None else _circuits(runs, keep, kind, drop), strict=True):
            runs.memo[keys[i]] = m
    return [runs.memo[k] for k in keys]


def _circuits(runs: Any, keep: np.ndarray, kind: str, drop: int | None) -> np.ndarray:
    """The metric [E, n] of the edge circuits `keep` [E, U, V] on `runs`' prompts, from one set of writes."""
    gm = runs.graph_model()
    clean = runs.writes(runs.clean)
    rep = (runs.writes(runs.corrupt) if kind == Replacement.RESAMPLE else runs.mean_writes(drop)
           if kind == Replacement.MEAN else clean.zeros())
    return np.asarray(gm.circuits(clean, rep, keep, runs.ds.positions, runs.rows_metric))
