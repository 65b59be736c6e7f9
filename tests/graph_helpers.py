"""Base runs of a shipped hypothesis file's prompts that cache what the edge graph reads
(mech.graph.forward) and what one-at-a-time patching of every edge reads, for the edge-graph,
attribution and discovery tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.engine import runner
from harness.hypothesis.loading import load
from harness.mech.edges import paths
from harness.mech.graph import parts
from harness.mech.graph.structure import Graph
from harness.mech.runs.build import base_runs
from harness.mech.runs.cached import Runs
from harness.model.ref import ModelRef
from harness.tools.scan import scan_hooks

ROOT = Path(__file__).resolve().parent.parent


def graph_runs(hypothesis: str, n: int, *, corruption: str | None = None, reference: bool = True) -> Runs:
    """The first `n` prompts of hypotheses/`hypothesis`.yaml, with every hook an edge test needs
    (without `reference`: means over the other prompts, leave-one-out, as a prompt file without
    `mean_from` has them)."""
    h = load(ROOT / "hypotheses" / f"{hypothesis}.yaml")
    m = runner.load_model_cached(str(ModelRef.parse(h.spec.model, h.base_dir).source), "cpu")
    ds = runner.build_dataset(h, m).select(list(range(n)))
    if corruption is not None:
        ds = ds.keep_corruptions([corruption])
    if not reference:
        ds = dataclasses.replace(ds, reference=None)
    g = Graph.of(m.bridge)
    wanted = scan_hooks(m.n_layers, m.has_mlp) + parts.cache_names(m.n_layers, m.has_mlp)
    for e in g.edges():
        if paths.needs_paths(e):
            wanted += paths.cache_names(e, m.n_layers)
    return base_runs(m.bridge, ds, list(dict.fromkeys(wanted)), h.spec.metric)
