"""`harness discover --refine STEPS`: the starter circuit refined greedily on the discovery prompts
(mech.graph.prune), then measured on the confirmation prompts like every other circuit.

The refinement searches on the discovery prompts only (their base runs are built again: discover
frees them before the confirmation stage), so the confirmation prompts judge its result as they
judge the rankings' circuits: faithfulness with a BCa interval, and the discovery takes the
refined circuit as its starter when that interval clears the bound and it has fewer edges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..mech.graph import prune
from ..mech.graph.structure import Graph
from ..mech.runs.build import base_runs
from ..mech.runs.cached import Runs
from ..progress import progress, stage
from ..spec.settings import Stats
from ..spec.vocabulary import Replacement
from ..streams import Stream, derive_seed
from .curve import faithfulness, prompts_to_decide


def judge(runs: Runs, st: Stats, unit: str, seed: int) -> Callable[[np.ndarray, int], tuple[float | None,
                                                                                        list[float] | None]]:
    """F of a circuit from its metric m [n] on `runs`' prompts, as the faithfulness curve takes it
    (tools.curve.faithfulness); r seeds the interval."""
    m_full, m_empty = np.asarray(runs.m_clean, dtype=float), np.asarray(runs.m_corrupt, dtype=float)

    def f(m: np.ndarray, r: int) -> tuple[float | None, list[float] | None]:
        iv = faithfulness(m, m_full, m_empty, st, derive_seed(seed, r), unit).interval
        return (None, None) if iv is None else (iv.estimate, [iv.low, iv.high])
    return f


def refine_starter(bridge: Any, disc_ds: Any, conf_ds: Any, hooks: Sequence[str], metric: str, g: Graph,
                   start: np.ndarray, source: str, steps: int, bound: float, st: Stats, unit: str,
                   seed: int) -> tuple[dict[str, Any], np.ndarray, Runs]:
    """(discovery.json's `refined`, the refined circuit [U, V] bool, the confirmation runs): the circuit
    `start` ([U, V] bool, the starter of ranking `source`) refined on the discovery prompts `disc_ds`, and
    its faithfulness on the confirmation prompts `conf_ds`.  One set of base runs at a time: the caller
    has freed the confirmation runs, which are built again once the refinement is done."""
    k0 = int(start.sum())
    stage(f"refinement of the {k0}-edge starter on {disc_ds.n} discovery prompts: up to {steps} proposals, "
          "each a forward and a backward through the edge graph")
    disc = base_runs(bridge, disc_ds, hooks, metric)
    got = prune.prune(disc.graph_model(), disc.writes(disc.clean), disc.writes(disc.corrupt), disc.ds.positions,
                      disc.rows_metric, start, bound,
                      judge(disc, st, unit, derive_seed(seed, Stream.DISCOVER_CURVE, 3)), steps, progress=progress)
    disc.release()
    del disc
    stage(f"faithfulness of the refined circuit ({int(got.keep.sum())} edges) on {conf_ds.n} confirmation prompts")
    conf = base_runs(bridge, conf_ds, hooks, metric)
    (m,) = conf.edge_circuits([got.keep], Replacement.RESAMPLE)
    f, ci = judge(conf, st, unit, derive_seed(seed, Stream.DISCOVER_CURVE, 4))(m, 0)
    edges = g.edges()
    us, rs = g.edge_index()
    kept = got.keep[us, rs]
    doc = {"steps": steps, "from": source, "from_k": k0, "k": int(kept.sum()),
           "edges": [str(edges[i]) for i in np.flatnonzero(kept)],
           "faithfulness": f, "ci": ci, "clears": bool(ci is not None and ci[0] >= bound),
           "prompts_needed": None if ci is None else prompts_to_decide({"faithfulness": f, "ci": ci}, bound, conf_ds.n),
           "proposals": got.steps}
    return doc, got.keep, conf
