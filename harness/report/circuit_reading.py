"""What makes a discovered edge circuit readable at real size, and how far its ranking can be
trusted (harness discover; the discovery.json keys `starter_nodes` and `agreement`).

* Node summary of the starter circuit (its top k edges): for each node (embed, a head, an MLP,
  the logits; an edge into L1H5.k belongs to L1H5) the circuit's edges it sends or receives and
  the share of the circuit's attribution they carry,

      share(v) = sum_{e in C, v end of e} |score_e| / (2 sum_{e in C} |score_e|)

  (each edge has two ends, so the shares of all nodes sum to 1): a thousand-edge circuit read
  as its few dozen nodes that matter.
* Agreement of the estimate with the exact patch over the confirmed edges: the Pearson and the
  Spearman correlation between each edge's estimate (its attribution score over the mean gap,
  on the discovery prompts) and its exact noising effect (on the confirmation prompts), with
  BCa intervals from resampling the edges.  The two are measured on different prompts, so the
  correlation is how far the ranking carries over to prompts it never saw.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import stats

SHOWN_NODES = 20  # nodes of the starter circuit the report's table lists


def node_of(end: str) -> str:
    """The node an edge end belongs to: `L1H5.k` -> `L1H5`; embed, L0.mlp, logits as they are."""
    return end.split(".")[0] if end.startswith("L") and "H" in end else end


def starter_nodes(ranking: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """[{node, edges, share}] of the top-k edges' circuit, by share, largest first (module docstring)."""
    weight: dict[str, float] = {}
    count: dict[str, int] = {}
    total = 0.0
    for row in ranking[:k]:
        w = abs(float(row["score"]))
        total += w
        for end in row["edge"].split(" -> "):
            v = node_of(end)
            weight[v] = weight.get(v, 0.0) + w
            count[v] = count.get(v, 0) + 1
    rows = [{"node": v, "edges": count[v], "share": weight[v] / (2 * total) if total else 0.0} for v in weight]
    return sorted(rows, key=lambda r: (-r["share"], r["node"]))


def _pearson(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    xc = x - x.mean(axis=axis, keepdims=True)
    yc = y - y.mean(axis=axis, keepdims=True)
    den = np.sqrt((xc ** 2).sum(axis=axis) * (yc ** 2).sum(axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray((xc * yc).sum(axis=axis) / den)


def _spearman(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    from scipy.stats import rankdata

    return _pearson(rankdata(x, axis=axis), rankdata(y, axis=axis), axis=axis)


def agreement(ranking: list[dict[str, Any]], confirmed: list[dict[str, Any]], n_resamples: int, confidence: float,
              seed: int) -> dict[str, Any]:
    """{edges, pearson, spearman} over the confirmed edges with both numbers defined (module
    docstring); each correlation {value, ci} (None where fewer than 3 edges or no spread)."""
    estimate = {r["edge"]: r["estimate"] for r in ranking}
    pairs = [(estimate.get(c["edge"]), c["effect"]) for c in confirmed]
    kept = [(float(a), float(b)) for a, b in pairs if a is not None and b is not None]
    out: dict[str, Any] = {"edges": len(kept), "pearson": None, "spearman": None}
    if len(kept) < 3:
        return out
    x, y = (np.array(v) for v in zip(*kept, strict=True))
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    for name, fn in (("pearson", _pearson), ("spearman", _spearman)):
        iv = stats.bootstrap_ci([x, y], fn, n_resamples, confidence, seed)
        out[name] = {"value": iv.estimate, "ci": [iv.low, iv.high]}
    return out
