"""Activation patching at one position at a time: the residual stream, or one head's output.

Two sites, each patched at one layer l and one position p (and for heads one head h):

* `resid`: the residual block l reads (blocks.l.hook_resid_pre; l = 0 is the embedding's output);
* `heads`: head h's output z (blocks.l.attn.hook_z, before W_O) at position p.

The base run's activation there is replaced by the other run's, prompt by prompt, and the blocks
from l on run (hooks.run_from: nothing below l can change):

    denoising: base = the corrupted run, the activation from the clean run;  e_n = m_patched,n - m_corrupted,n
    noising:   base = the clean run, the activation from the corrupted run;  e_n = m_clean,n - m_patched,n

so e_n is, in both directions, how much of prompt n's clean behaviour the activation carries.

A cell is run only where it can change something: a position after the last scored position
cannot (causal attention: no scored logit reads it), nor an activation that is the same in both
runs for every prompt (before the first token a corruption changes); those cells are exactly 0
and not run (`Cells.run`).  The cells of one layer are stacked along the batch (variant v patches
its own cell only), in chunks of prompts and variants that fit the working memory
(ablation.bytes_per_variant), so memory does not grow with the number of prompts or cells.

Cost, in forward passes of the prompts: sum over the cells run of (L - l) / L (`Cells.forwards`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import memory
from ...model.metrics import at_positions
from ...model.shape import vocab_out
from ...progress import progress
from ...spec.names import hook_resid_pre, hook_z
from ...spec.vocabulary import Direction
from .. import hooks
from .ablation import DEFAULT_BUDGET, bytes_per_variant
from .cached import Runs

__all__ = ["SITES", "Cells", "cache_names", "cells_to_run", "effects"]

SITES = ("resid", "heads")


@dataclass(frozen=True)
class Cells:
    """Which cells run: `run` [L, s] (resid) or [L, H, s] (heads) bool; the others are exactly 0."""

    site: str
    run: np.ndarray
    last_scored: int  # the last position any prompt scores: every later position is left out

    def forwards(self) -> float:
        """Their cost in forward passes of the prompts: sum over cells run of (L - l) / L."""
        L = self.run.shape[0]
        return float(sum(int(self.run[layer].sum()) * (L - layer) / L for layer in range(L)))


def cache_names(site: str, layers: range) -> list[str]:
    """The hooks the base runs cache for `site` at `layers`: the residual each layer's blocks start
    from, and for heads their z."""
    return [hook_resid_pre(layer) for layer in layers] + ([hook_z(layer) for layer in layers]
                                                          if site == "heads" else [])


def cells_to_run(runs: Runs, site: str, layers: range | None = None) -> Cells:
    """The cells at `layers` (default every layer) that can change the metric (module docstring),
    from the base runs' cached activations."""
    import torch

    L, H, s = runs.n_layers, runs.n_heads, int(runs.ds.clean.shape[1])
    last = int(runs.ds.positions.max())
    run = np.zeros((L, s) if site == "resid" else (L, H, s), dtype=bool)
    for layer in layers if layers is not None else range(L):
        if site == "resid":
            key = hook_resid_pre(layer)
            same = torch.eq(runs.clean[key], runs.corrupt[key]).all(-1).all(0)  # [s]: equal in every prompt
        else:
            key = hook_z(layer)
            same = torch.eq(runs.clean[key], runs.corrupt[key]).all(-1).all(0).T  # [H, s]
        run[layer] = ~same.cpu().numpy()
    run[..., last + 1:] = False
    return Cells(site, run, last)


def effects(runs: Runs, direction: str, cells: Cells, *, budget_bytes: int | None = None) -> np.ndarray:
    """e [L, s, n] (resid) or [L, H, s, n] (heads): each cell's per-prompt effect (module docstring),
    0 where the cell is not run."""
    import torch

    n = runs.ds.n
    denoise = Direction(direction) is Direction.DENOISING
    base, other = (runs.corrupt, runs.clean) if denoise else (runs.clean, runs.corrupt)
    base_m = np.asarray(runs.m_corrupt if denoise else runs.m_clean, dtype=np.float64)
    if runs.metric_rows is None:
        raise ValueError("these runs cannot score stacked variants")
    out = np.zeros((*cells.run.shape, n))
    cfg = runs.bridge.cfg
    s, d = int(runs.ds.clean.shape[1]), int(cfg.d_model)
    d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * d)
    layers = [layer for layer in range(cells.run.shape[0]) if cells.run[layer].any()]
    if not layers:
        return out
    one = bytes_per_variant(1, s, d, d_mlp, int(cfg.n_heads), runs.clean[hook_resid_pre(layers[0])].element_size(),
                            int(runs.ds.positions.shape[1]), vocab_out(cfg))  # a prompt of one variant
    rows = max(1, (memory.working(DEFAULT_BUDGET) if budget_bytes is None else budget_bytes) // one)
    prompts = min(n, rows)  # prompts a chunk holds; then as many variants as fit
    what = "residual" if cells.site == "resid" else "head output"
    for layer in progress(layers, f"{what} patching: {int(cells.run.sum())} cells over {len(layers)} layers, "
                                  f"{cells.forwards():.1f} forward passes"):
        where = np.argwhere(cells.run[layer])  # [C, 1] positions or [C, 2] (head, position)
        inside = hooks.can_start_inside(runs.bridge, runs.clean, layer, runs.ds.positions)
        for lo in range(0, n, prompts):
            hi = min(n, lo + prompts)
            per = max(1, rows // (hi - lo))
            for v0 in range(0, len(where), per):
                chunk = where[v0:v0 + per]
                x, plan = _variants(runs, base, other, layer, chunk, lo, hi, cells.site)
                V = len(chunk)
                pos = runs.ds.positions[lo:hi].repeat(V, 1)
                if inside:
                    logits_at = hooks.run_from(runs.bridge, layer, x, plan, pos)
                else:  # the model's own forward, the stacked residual put in at layer l
                    plan = hooks.Plan([(hook_resid_pre(layer), _put(x)), *plan.hooks])
                    tokens = runs.corrupted_tokens if denoise else runs.ds.clean
                    logits_at = at_positions(hooks.run_plan(runs.bridge, tokens[lo:hi].repeat(V, 1), plan), pos)
                idx = torch.arange(lo, hi, device=logits_at.device).repeat(V)
                with torch.no_grad():
                    m = runs.metric_rows(logits_at, idx).detach().cpu().numpy().reshape(V, hi - lo)
                e = m - base_m[lo:hi] if denoise else base_m[lo:hi] - m
                out[(layer, *chunk.T, slice(lo, hi))] = e
    return out


def _put(x: Any) -> Callable[..., Any]:
    return lambda _, hook: x


def _variants(runs: Runs, base: Any, other: Any, layer: int, chunk: np.ndarray, lo: int, hi: int,
              site: str) -> tuple[Any, hooks.Plan]:
    """The stacked residual [V (hi - lo), s, d] the blocks start from and the plan of hooks, for the
    V cells of `chunk` at `layer` over prompts lo..hi-1."""
    V, m = len(chunk), hi - lo
    start = base[hook_resid_pre(layer)][lo:hi]
    plan = hooks.Plan()
    if site == "resid":
        x = start.repeat(V, 1, 1).view(V, m, *start.shape[1:])
        src = other[hook_resid_pre(layer)][lo:hi]
        for v, (p,) in enumerate(chunk):
            x[v, :, p] = src[:, p]
        return x.view(V * m, *start.shape[1:]), plan
    src = other[hook_z(layer)][lo:hi]  # [m, s, H, dh]

    def fn(z: Any, hook: Any) -> Any:
        z = z.clone().view(V, m, *z.shape[1:])
        for v, (h, p) in enumerate(chunk):
            z[v, :, p, h] = src[:, p, h].to(z.dtype)
        return z.view(V * m, *z.shape[2:])

    plan.add(hook_z(layer), fn)
    return start.repeat(V, 1, 1), plan
