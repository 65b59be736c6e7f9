"""Stability of a discovered ranking: would other prompts have found the same circuit?

The discovery prompts are resampled with replacement B = RESAMPLES times (seeded,
Stream.DISCOVER_STABILITY; w_b,n = how often prompt n is drawn in resample b).  Each edge's
score under resample b is the weighted mean of its per-prompt scores (summed over positions),

    s_b(e) = sum_n w_b,n s_n(e) / sum_n w_b,n,

taken from the same pass that scored the edges (mech.graph.attribution's `resamples`; for `exact`, the
per-prompt patches), so stability costs no extra forward.  Resample b ranks the edges by
|s_b(e)| (the `abs` rank; by s_b(e) for the signed ranking; `positions` would need every position
of every resample, and is not offered), and at each k its top-k set T_b is compared with the full
ranking's T by the Jaccard index

    J_b(k) = |T_b ∩ T| / |T_b ∪ T|.

Reported per k: the mean over resamples and the 2.5 and 97.5 % quantiles of J_b(k) (the
spread of the overlap over resamples, not a confidence interval of a parameter); the starter
circuit is called stable when its mean J is at least STABLE (0.8, the bar used for stable
circuits in the circuit-discovery literature).
"""

from __future__ import annotations

from typing import Any

import numpy as np

RESAMPLES = 20
STABLE = 0.8


def weights(n: int, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """[B, n] bootstrap weights: how often each of n prompts is drawn in each resample of n."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)


def jaccard(resampled: np.ndarray, order: np.ndarray, ks: list[int], signed: bool = False) -> np.ndarray:
    """[B, len(ks)]: J_b(k) (module docstring) of each resample's scores `resampled` [B, E] (graph
    edge order) against the ranking `order` (edge indices, strongest first); `signed`: each resample
    ranked by s_b(e), the largest first, as the signed ranking is."""
    E = len(order)
    rank = np.empty(E, dtype=np.int64)
    rank[order] = np.arange(E)
    out = np.zeros((resampled.shape[0], len(ks)))
    for b, values in enumerate(resampled):
        rank_b = np.empty(E, dtype=np.int64)
        rank_b[np.argsort(-(values if signed else np.abs(values)), kind="stable")] = np.arange(E)
        both = np.maximum(rank, rank_b)  # an edge is in both top-k sets iff both ranks are below k
        counts = np.searchsorted(np.sort(both), np.asarray(ks), side="left")  # |T_b(k) ∩ T(k)| per k
        for j, k in enumerate(ks):
            out[b, j] = 1.0 if k == 0 else counts[j] / (2 * k - counts[j])
    return out


def summary(values: np.ndarray, ks: list[int], starter_k: int | None, n_prompts: int) -> dict[str, Any]:
    """discovery.json's `stability` (docs/discover.md) from J [B, len(ks)]."""
    rows: list[dict[str, Any]] = [
        {"k": k, "jaccard": float(values[:, j].mean()),
         "range": [float(np.quantile(values[:, j], 0.025)), float(np.quantile(values[:, j], 0.975))]}
        for j, k in enumerate(ks)]
    starter = next((r for r in rows if r["k"] == starter_k), None)
    return {"resamples": int(values.shape[0]), "prompts": n_prompts, "bar": STABLE, "points": rows,
            "starter": None if starter is None else {**starter, "stable": float(starter["jaccard"]) >= STABLE}}
