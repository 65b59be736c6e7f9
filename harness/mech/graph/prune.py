"""Greedy refinement of an edge circuit: edges removed a batch at a time by their estimated effect
on faithfulness, every removal checked by the circuit's exact forward.

On prompts with per-prompt metrics m^full (every edge kept) and m^empty (none kept), a circuit C
(a mask of kept edges) has the faithfulness

    F(C) = sum_i (m_i(C) - m_i^empty) / sum_i (m_i^full - m_i^empty)

with an interval (the caller's `judge`: discover's is the faithfulness curve's BCa interval).  Each step
runs C's exact forward on every prompt (mech.graph.forward.circuit_pass at keep weights
z = 1 on C, 0 elsewhere) and, from the same pass, the gradient g_e of sum_i m_i with respect to
each kept edge's keep weight (mech.graph.carried); removing e changes F by about
-g_e / sum_i (m_i^full - m_i^empty).  The `chunk` kept edges of smallest |g_e| are proposed for
removal and the proposal is run exactly: it is accepted when its interval's lower end stays at or
above the bound, else the chunk halves.  The chunk starts at a quarter of the circuit; the search
ends when the chunk reaches 0 or after `steps` proposals.  Edges are only removed: the result is
a subset of C whose interval, on these prompts, clears the bound (C itself when C's does not).

Cost: one forward and backward through the edge graph per prompt per proposal, plus the
start's (counted as three edge-graph passes a prompt); memory is one batch's autograd graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import cost
from .forward import GraphModel
from .learn import BACKWARD, relaxed_metric
from .parts import Writes

BATCH = 4  # prompts a forward and backward
FIRST_CHUNK = 0.25  # of the circuit's edges, the first proposal


@dataclass(frozen=True)
class Pruned:
    """The refined circuit [U, V] (bool) and every proposal: {edges (the circuit's size if accepted),
    removed, faithfulness, ci, accepted}, the start first (removed 0)."""

    keep: np.ndarray
    steps: list[dict[str, Any]]


def prune(gm: GraphModel, clean: Writes, rep: Writes, positions: Any, metric: Callable[[Any, Any], Any],
          start: np.ndarray, bound: float, judge: Callable[[np.ndarray, int], tuple[float | None, list[float] | None]],
          steps: int, progress: Callable[..., Any] | None = None) -> Pruned:
    """Refine `start` ([U, V] bool, edges of the graph) on the prompts of `clean` / `rep` (module
    docstring); `judge(m, r)`: (F, its interval) of a circuit whose metric is m [n] (proposal r; None, None
    where F is undefined)."""

    def judged(keep: np.ndarray, r: int) -> tuple[dict[str, Any], np.ndarray]:
        m, grad = _exact_with_gradient(gm, clean, rep, positions, metric, keep)
        f, ci = judge(m, r)
        return {"edges": int(keep.sum()), "faithfulness": f, "ci": ci}, grad

    keep = start & gm.graph.adjacency
    point, grad = judged(keep, 0)
    history = [{**point, "removed": 0, "accepted": True}]
    clears = point["ci"] is not None and point["ci"][0] >= bound
    chunk = max(1, int(FIRST_CHUNK * keep.sum()))
    tries = range(1, steps + 1)
    for r in (progress(tries, "refinement proposals") if progress else tries):
        if not clears or chunk < 1 or keep.sum() <= 1:
            break
        us, vs = np.nonzero(keep)
        weakest = np.argsort(np.abs(grad[us, vs]), kind="stable")[:min(chunk, len(us) - 1)]
        trial = keep.copy()
        trial[us[weakest], vs[weakest]] = False
        point, trial_grad = judged(trial, r)
        ok = point["ci"] is not None and point["ci"][0] >= bound
        history.append({**point, "removed": len(weakest), "accepted": ok})
        if ok:
            keep, grad = trial, trial_grad
        else:
            chunk //= 2
    return Pruned(keep, history)


def _exact_with_gradient(gm: GraphModel, clean: Writes, rep: Writes, positions: Any,
                         metric: Callable[[Any, Any], Any], keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the metric [n] of circuit `keep` on every prompt, exact; d(sum of it)/d(keep weight) [U, V]),
    BATCH prompts a forward and backward."""
    import torch

    x = clean.embed
    n = x.shape[0]
    z = torch.from_numpy(keep).to(x.dtype).requires_grad_(True)
    out = np.zeros(n)
    for lo in range(0, n, BATCH):
        idx = torch.arange(lo, min(n, lo + BATCH), device=x.device)
        with torch.enable_grad():
            got = relaxed_metric(gm, clean, rep, positions, metric, z, idx)
            got.sum().backward()
        out[lo:lo + len(idx)] = got.detach().double().cpu().numpy()
        cost.spend(len(idx) * BACKWARD)
    grad = torch.zeros_like(z) if z.grad is None else z.grad
    return out, grad.double().cpu().numpy()
