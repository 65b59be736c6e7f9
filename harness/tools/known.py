"""The known circuit of a hypothesis file against a discovery (`harness discover`): its edges in the
model's edge graph, the ROC AUC of the discovery's ranking against them, and its faithfulness
beside the top-|known| circuit's."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..claims import effects
from ..claims.circuit_plans import with_mlps
from ..claims.circuit_spec import CircuitClaim
from ..errors import UserError
from ..mech.graph.structure import Graph
from ..spec import names
from .curve import Curve


def roc_auc(order: np.ndarray, known: np.ndarray) -> float:
    """Area under the ROC curve of a ranking (edge indices, strongest first) against the known edges
    (bool per edge): the share of (known, other) pairs in which the known edge ranks first."""
    pos, neg = int(known.sum()), int((~known).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    before = np.searchsorted(np.sort(rank[~known]), rank[known])  # other edges ranked above each known one
    return float(1.0 - before.sum() / (pos * neg))


def known_edges(claim: CircuitClaim, g: Graph) -> np.ndarray:
    """[U, V] the known circuit's edges: an edge circuit's own, or the edge circuit a node circuit
    is (Graph.node_mask: the edges among its nodes, from embed and to the logits; a circuit of heads
    alone keeps every MLP)."""
    if claim.edges is not None:
        try:
            return g.mask(claim.edges)
        except ValueError as exc:
            raise UserError(f"the file's edge circuit {claim.id!r}: {exc}") from None
    nodes: list[names.Node] = list(claim.heads or [])
    if not with_mlps(claim):
        nodes += [u for u in g.senders if isinstance(u, names.Mlp)]
    return g.node_mask(nodes)


def known_doc(claim: CircuitClaim, mask: np.ndarray, g: Graph, order: np.ndarray, curve: Curve) -> dict[str, Any]:
    """The known circuit against the discovery: ROC AUC of the ranking, its faithfulness, and the
    top-|known| circuit's faithfulness interval with whether it covers the known one's value."""
    us, rs = g.edge_index()
    edges = g.edges()
    is_known = mask[us, rs]
    f_known, f_top = curve.extra

    def num(f: effects.NormalizedEffect) -> tuple[float | None, list[float] | None]:
        iv = f.interval
        return (None, None) if iv is None else (iv.estimate, [iv.low, iv.high])

    value, ci = num(f_known)
    top_value, top_ci = num(f_top)
    covers = None if value is None or top_ci is None else bool(top_ci[0] <= value <= top_ci[1])
    return {"claim": claim.id, "from": "edges" if claim.edges is not None else "nodes",
            "edges": [str(edges[i]) for i in np.flatnonzero(is_known)], "auc": roc_auc(order, is_known),
            "faithfulness": value, "ci": ci,
            "top": {"k": int(mask.sum()), "faithfulness": top_value, "ci": top_ci, "covers": covers}}
