"""The faithfulness curve of a ranking of edges (`harness discover`), its summaries, and the
search for the smallest circuit whose interval clears a bound.

For k edges kept (the top k of the ranking; every other edge resampled from the corrupted run,
mech.graph.forward) the faithfulness on the confirmation prompts is

    F_k = sum_K (m_k - m_empty) / sum_K (m_full - m_empty)

over the prompts K whose full-empty gap is at least min_prompt_gap, with a BCa interval
(claims.effects.normalized_effect, as circuit claims).

* **The grid**: k = floor(p x edges) at MIB's fractions p = 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50,
  100 %.  MIB's summaries on that grid, linear in x (the fraction of edges), by the trapezoid
  rule: CPR = area under F, CMD = area under |1 - F|, each with an interval from one paired
  bootstrap of the prompts.
* **The finer search** (`refine`): bisection on k between the last grid point below the bound
  (its interval's lower end under it; no edge, k = 0, when the grid's first point clears it) and
  the first at or above it, STEPS circuits one after
  the other: the midpoint k is tried, and becomes the new upper end when its interval clears the
  bound, else the new lower end; the starter is the smallest k tried whose interval clears the
  bound.  Bisection assumes the curve rises between the two grid points; where it does not,
  the starter is still a k whose interval clears the bound, only not the smallest such k.
  Choosing the smallest of many intervals that clear a bound is optimistic: the starter's
  faithfulness is tested again on held-out prompts when its file is run.
* **Drops** (`drops`): where the curve is not monotone, each point (grid and finer search
  together, by k >= 1) whose F lies below the F of a smaller k by more than both intervals allow
  (its upper end below that point's lower end) and by more than the file's `tolerance` (the width
  of "no effect" in every other claim); the smaller k is the one with the highest lower end so
  far, so a fall spread over several points (0.875 [0.751, 1.008] at 1 %, 0.694 [0.509, 0.851]
  at 2 %, 0.571 [0.480, 0.689] at 10 %: no two neighbours apart) is found all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import stats
from ..claims import effects
from ..errors import UserError
from ..mech.graph.structure import Graph
from ..mech.runs.cached import Runs
from ..progress import stage
from ..spec.settings import Stats
from ..spec.vocabulary import Replacement
from ..streams import derive_seed

PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # MIB's circuit sizes
ONE_PERCENT = 0.01  # the grid's size at which discover states what deciding the bound would take
STEPS = 5  # circuits of the finer search, one at a time: the gap between two grid points narrows 32-fold


def top_mask(g: Graph, order: np.ndarray, k: int) -> np.ndarray:
    """The circuit of the first k edges of a ranking."""
    us, rs = g.edge_index()
    m = np.zeros_like(g.adjacency)
    m[us[order[:k]], rs[order[:k]]] = True
    return m


def curve_ks(n_edges: int) -> list[int]:
    """k = floor(p x edges) for each of MIB's fractions p."""
    return [int(p * n_edges) for p in PERCENTAGES]


@dataclass(frozen=True)
class Curve:
    points: list[dict[str, Any]]
    summaries: dict[str, Any]
    extra: list[effects.NormalizedEffect]  # the extra circuits' faithfulness
    m_full: np.ndarray  # [n] the metric with every edge kept, and with none: what the finer search reuses
    m_empty: np.ndarray


def _point(k: int, f: effects.NormalizedEffect, fraction: float | None) -> dict[str, Any]:
    iv = f.interval
    if iv is None:
        raise UserError(f"faithfulness is undefined on the confirmation prompts: {f.reason}")
    return {"k": k, "fraction": fraction, "faithfulness": iv.estimate, "ci": [iv.low, iv.high],
            "ci_method": iv.method}


def faithfulness(m: np.ndarray, m_full: np.ndarray, m_empty: np.ndarray, st: Stats, seed: int,
                 unit: str) -> effects.NormalizedEffect:
    """A circuit's faithfulness from its metric m [n]: sum(m - m_empty) / sum(m_full - m_empty) over the
    prompts whose full-empty gap is at least min_prompt_gap, with a BCa interval seeded `seed`."""
    return effects.normalized_effect(m - m_empty, m_full - m_empty, st, seed, unit, gap_name="full-empty")


def faithfulness_curve(runs: Runs, g: Graph, order: np.ndarray, st: Stats, seed: int, unit: str,
                       extra: list[np.ndarray]) -> Curve:
    """The top-k circuits' faithfulness at curve_ks (module docstring), CPR and CMD; and the
    faithfulness of the `extra` circuits on the same prompts.  Every edge kept is the clean run and
    none kept the corrupted one (resample), so those two come from the base runs, not from circuits."""
    ks = curve_ks(g.n_edges)
    inner = [k for k in ks if 0 < k < g.n_edges]
    stage(f"faithfulness curve: {len(inner)} circuits (+{len(extra)}) on {runs.ds.n} confirmation prompts")
    got = runs.edge_circuits([*(top_mask(g, order, k) for k in inner), *extra], Replacement.RESAMPLE)
    # every edge kept is the clean run and none kept (resample) the corrupted one: the base runs hold both
    m_full, m_empty = np.asarray(runs.m_clean, dtype=float), np.asarray(runs.m_corrupt, dtype=float)
    by_k = {0: m_empty, g.n_edges: m_full, **dict(zip(inner, got[:len(inner)], strict=True))}
    gap = m_full - m_empty
    per_k = [faithfulness(by_k[k], m_full, m_empty, st, derive_seed(seed, i), unit) for i, k in enumerate(ks)]
    if per_k[0].interval is None:
        raise UserError(f"faithfulness is undefined on the confirmation prompts: {per_k[0].reason} (the corruption "
                        "barely changes the behaviour)")
    points = [_point(k, f, p) for k, p, f in zip(ks, PERCENTAGES, per_k, strict=True)]
    kept = per_k[0].kept
    nums = [(by_k[k] - m_empty)[kept] for k in ks]
    x = np.asarray(PERCENTAGES)

    def area(index: int) -> Any:
        def statistic(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
            *num_s, gap_s = samples
            f = np.stack([np.sum(n, axis=axis) / np.sum(gap_s, axis=axis) for n in num_s], -1)
            return np.asarray(np.trapezoid(f if index == 0 else np.abs(1.0 - f), x, axis=-1))
        return statistic

    summaries: dict[str, Any] = {}
    for index, name in enumerate(("CPR", "CMD")):
        iv = stats.bootstrap_ci([*nums, gap[kept]], area(index), st.bootstrap, st.confidence,
                                derive_seed(seed, len(ks) + index))
        summaries[name] = {"value": iv.estimate, "ci": [iv.low, iv.high], "ci_method": iv.method}
    summaries["kept_prompts"] = int(kept.sum())
    summaries["excluded_prompts"] = int((~kept).sum())
    extra_f = [faithfulness(m, m_full, m_empty, st, derive_seed(seed, len(ks) + 2 + i), unit)
               for i, m in enumerate(got[len(inner):])]
    return Curve(points, summaries, extra_f, m_full, m_empty)


def clears(point: dict[str, Any], bound: float) -> bool:
    """Whether a point's interval lies at or above the bound (a circuit of at least one edge)."""
    return point["k"] > 0 and point["ci"][0] >= bound


def refine(runs: Runs, g: Graph, order: np.ndarray, curve: Curve, bound: float, st: Stats, seed: int,
           unit: str) -> list[dict[str, Any]]:
    """The finer search's points (module docstring), in the order tried; [] when no grid point
    clears the bound (below the grid's first point: between no edge, F = 0, and it)."""
    first = next((i for i, p in enumerate(curve.points) if clears(p, bound)), None)
    if first is None:
        return []
    lo, hi = curve.points[first - 1]["k"] if first else 0, curve.points[first]["k"]  # k = 0: F = 0, below
    tried: list[dict[str, Any]] = []
    for r in range(STEPS):
        k = (lo + hi) // 2
        if not lo < k < hi:
            break
        stage(f"faithfulness at {k:,} edges (between {lo:,} and {hi:,}; step {r + 1} of {STEPS}) on "
              f"{runs.ds.n} confirmation prompts")
        (m,) = runs.edge_circuits([top_mask(g, order, k)], Replacement.RESAMPLE)
        point = _point(k, faithfulness(m, curve.m_full, curve.m_empty, st, derive_seed(seed, 100 * (r + 1)), unit),
                       None)
        tried.append(point)
        if clears(point, bound):
            hi = k
        else:
            lo = k
    return tried


def starter_k(curve: Curve, finer: list[dict[str, Any]], bound: float) -> int | None:
    """The smallest k tried (grid or finer search) whose interval clears the bound."""
    return min((p["k"] for p in [*curve.points, *finer] if clears(p, bound)), default=None)


def signed_order(score: np.ndarray, g: Graph, order: np.ndarray) -> np.ndarray:
    """Edge indices (graph.edges() order) by their signed score summed over positions, the largest
    first (ties in the order of `order`, the main ranking): the edges that push the metric towards
    the clean run, then those that push against it."""
    us, rs = g.edge_index()
    total = score.sum(-1)[us, rs]
    return order[np.argsort(-total[order], kind="stable")]


def learned_order(logits: np.ndarray, g: Graph, order: np.ndarray) -> np.ndarray:
    """Edge indices (graph.edges() order) by a learned mask's logits [U, V] (mech.graph.learn), the
    largest first (ties in the order of `order`, the main ranking)."""
    us, rs = g.edge_index()
    return order[np.argsort(-logits[us, rs][order], kind="stable")]


def ranking_search(runs: Runs, g: Graph, order: np.ndarray, st: Stats, seed: int, unit: str,
                   bound: float, label: str) -> dict[str, Any]:
    """A second ranking's part of discovery.json (`signed`, `learned`): the faithfulness curve of the
    ranking `order`, its finer search and its smallest k whose interval clears the bound."""
    stage(label)
    curve = faithfulness_curve(runs, g, order, st, seed, unit, [])
    finer = refine(runs, g, order, curve, bound, st, seed, unit)
    return {"curve": curve.points, "summaries": curve.summaries, "curve_finer": finer,
            "starter_k": starter_k(curve, finer, bound)}


def pareto(tried: dict[str, list[dict[str, Any]]], n_edges: int) -> list[dict[str, Any]]:
    """Size against faithfulness over every circuit tried (each ranking's grid and finer points,
    0 < k < n_edges): the points that no other beats on both counts, no other having k' <= k and
    |1 - F'| <= |1 - F| (to the 3 decimals reports show) with one of them strict; by k, each with
    its ranking's name (one pass after a sort)."""
    points = sorted(((p["k"], round(abs(1.0 - p["faithfulness"]), 3), name, p)
                     for name, pts in tried.items() for p in pts
                     if 0 < p["k"] < n_edges and p["faithfulness"] is not None), key=lambda t: (t[0], t[1]))
    out: list[dict[str, Any]] = []
    best = float("inf")
    for k, err, name, p in points:
        if err < best:
            out.append({"ranking": name, "k": k, "faithfulness": p["faithfulness"], "ci": p["ci"]})
            best = err
    return out


def prompts_to_decide(point: dict[str, Any], bound: float, n: int) -> int | None:
    """How many confirmation prompts a point's interval needs to lie wholly on one side of the bound:
    with F its faithfulness, w its interval's half-width on the bound's side (F - low above the bound,
    high - F below it) from n prompts, and w shrinking as 1/sqrt(n), n (w / |F - bound|)^2 rounded up
    (n itself when it already decides; None when F is the bound)."""
    f, (low, high) = point["faithfulness"], point["ci"]
    if low >= bound or high < bound:
        return n
    if f == bound:
        return None
    w = f - low if f > bound else high - f
    return int(np.ceil(n * (w / abs(f - bound)) ** 2))


def drops(points: list[dict[str, Any]], least: float) -> list[dict[str, Any]]:
    """Where the curve falls beyond its intervals (module docstring), by more than `least`: to each
    k from the smaller k with the highest lower end so far (circuits of at least one edge; one pass)."""
    ordered = sorted((p for p in points if p["k"] > 0), key=lambda p: p["k"])
    out: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None  # the point of the highest lower end among the smaller k
    for b in ordered:
        if best is not None and b["ci"][1] < best["ci"][0] and best["faithfulness"] - b["faithfulness"] > least:
            out.append({"from_k": best["k"], "to_k": b["k"], "from": best["faithfulness"], "to": b["faithfulness"]})
        if best is None or b["ci"][0] > best["ci"][0]:
            best = b
    return out


def doc_rankings(rank: str, points: list[dict[str, Any]], finer: list[dict[str, Any]], signed: dict[str, Any],
                 learned: dict[str, Any] | None, refined: dict[str, Any] | None = None
                 ) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Every ranking tried: its name -> (its grid points, its finer search's); the refined circuit as a
    finer point of its own (`refined`)."""
    out = {rank: (points, finer), "signed": (signed["curve"], signed["curve_finer"])}
    if learned is not None:
        out["learned"] = (learned["curve"], learned["curve_finer"])
    if refined is not None and refined["ci"] is not None:
        out["refined"] = ([], [{"k": refined["k"], "faithfulness": refined["faithfulness"], "ci": refined["ci"]}])
    return out


def selection(tried: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]], n_edges: int, bound: float,
              n_conf: int) -> dict[str, Any]:
    """discovery.json's `selection`: the size/faithfulness front over every ranking's circuits, and each
    ranking's circuit at 1 % of the edges against the bound (prompts it needs to decide)."""
    front = pareto({name: [*grid, *fine] for name, (grid, fine) in tried.items()}, n_edges)
    one = []
    for name, (grid, _) in tried.items():
        p = next((p for p in grid if p["fraction"] == ONE_PERCENT), None)
        if p is not None and p["k"] > 0:
            one.append({"ranking": name, "k": p["k"], "faithfulness": p["faithfulness"], "ci": p["ci"],
                        "decided": bool(p["ci"][0] >= bound or p["ci"][1] < bound),
                        "prompts_needed": prompts_to_decide(p, bound, n_conf)})
    return {"pareto": front, "one_percent": one, "prompts": n_conf}
