"""A learned edge circuit: a continuous mask over the edge graph's edges, trained against the
faithfulness objective with a rising sparsity penalty (the mask-optimisation family of circuit
discovery: Edge Pruning, Bhaskar et al. 2024; MIB's mask methods).

Each edge e has a logit a_e and a keep weight z_e = sigmoid(a_e); the circuit of weights z is the
edge-graph forward (mech.graph.forward.circuit_pass) with every edge removed by 1 - z_e (its
receiver reads z_e of the sender's own write and 1 - z_e of the replacement's), exact at z in
{0, 1}.  On a batch b of the discovery prompts, step t minimises

    loss_t = mean_{i in b} ((m_i(z) - m_i^clean) / gap)^2  +  lambda_t * mean_e z_e,
    lambda_t = lambda_0 * (lambda_1 / lambda_0)^(t / (T - 1)),

with m_i(z) the circuit's metric on prompt i, m_i^clean the model's, and gap the mean
clean-corrupted gap of the discovery prompts: the first term is the squared per-prompt
shortfall of faithfulness, the second the share of edges kept.  The penalty rises
geometrically over the T steps, so edges leave the circuit in the order the objective can spare
them; a_e then ranks the edges (the largest first), and the discovery confirms the ranking's
circuits on other prompts like any other ranking's.  Adam moves every logit by about the
learning rate a step whatever its gradient's scale, so lambda sets which edges go, not how fast.

Cost: each step is a forward through the edge graph and its backward for `batch` prompts, about
three edge-graph passes of `batch` rows (counted so); memory is that of one batch with its
autograd graph, bounded by `batch`, not by the number of prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import cost
from .forward import GraphModel
from .parts import Writes

BACKWARD = 2.0  # a backward pass counted as two forwards


@dataclass(frozen=True, kw_only=True)
class MaskSettings:
    """The optimisation's settings (module docstring)."""

    steps: int = 100  # T
    batch: int = 8  # prompts a step
    learning_rate: float = 0.1  # Adam's
    init: float = 1.0  # every logit's start: z = sigmoid(1) = 0.73
    penalty: tuple[float, float] = (1.0, 1000.0)  # lambda_0, lambda_1
    seed: int = 0


@dataclass(frozen=True)
class Learned:
    """The trained logits [U, V] (0 where the graph has no edge), how training went and its settings."""

    settings: MaskSettings
    logits: np.ndarray
    kept: int  # edges with a_e > 0 (z_e > 1/2) at the end
    loss: list[dict[str, float]]  # every tenth step and the last: {step, faithfulness_loss, kept_share, penalty}


def relaxed_metric(gm: GraphModel, clean: Writes, rep: Writes, positions: Any, metric: Callable[[Any, Any], Any],
                   z: Any, idx: Any) -> Any:
    """The metric [B] of the circuit of keep weights z [U, V] (every edge removed by 1 - z_e, module
    docstring) on prompts idx, differentiable in z where a gradient is enabled."""
    edges = gm.graph.adjacency
    removed = ((1.0 - z) * z.new_tensor(edges))[None].expand(len(idx), -1, -1)
    return metric(gm.circuit_pass(clean.embed[idx], idx, rep, removed, positions[idx]), idx)


def learn_mask(gm: GraphModel, clean: Writes, rep: Writes, positions: Any, metric: Callable[[Any, Any], Any],
               m_clean: np.ndarray, gap: float, cfg: MaskSettings,
               progress: Callable[..., Any] | None = None) -> Learned:
    """Train the mask (module docstring) on the prompts of `clean` / `rep` (the replacement writes:
    the corrupted run's, for resample), `m_clean` [n] the model's metric on them."""
    import torch

    adjacency = gm.graph.adjacency
    x = clean.embed
    n = x.shape[0]
    edges = torch.from_numpy(adjacency).to(x.dtype)
    n_edges = float(edges.sum())
    a = torch.full(adjacency.shape, float(cfg.init), dtype=x.dtype, requires_grad=True)
    opt = torch.optim.Adam([a], lr=cfg.learning_rate)
    target = torch.as_tensor(m_clean, dtype=x.dtype)
    gen = torch.Generator().manual_seed(cfg.seed)
    order, at = torch.randperm(n, generator=gen), 0
    batch = min(cfg.batch, n)
    lam0, lam1 = cfg.penalty
    history: list[dict[str, float]] = []
    steps = range(cfg.steps)
    for t in (progress(steps, "learned mask steps") if progress else steps):
        if at + batch > n:
            order, at = torch.randperm(n, generator=gen), 0
        idx = order[at:at + batch].to(x.device)
        at += batch
        lam = lam0 * (lam1 / lam0) ** (t / max(1, cfg.steps - 1))
        with torch.enable_grad():
            z = torch.sigmoid(a)
            got = relaxed_metric(gm, clean, rep, positions, metric, z, idx)
            shortfall = (((got - target[idx].to(got.dtype)) / gap) ** 2).mean()
            kept = (z * edges).sum() / n_edges
            loss = shortfall + lam * kept
            opt.zero_grad()
            loss.backward()
        opt.step()
        cost.spend(batch * BACKWARD)  # the forward was counted by circuit_pass
        if t % 10 == 0 or t == cfg.steps - 1:
            history.append({"step": t, "faithfulness_loss": float(shortfall.detach()),
                            "kept_share": float(kept.detach()), "penalty": lam})
    logits = (a.detach() * edges).cpu().numpy().astype(np.float64)
    return Learned(cfg, logits, int(((logits > 0) & adjacency).sum()), history)
