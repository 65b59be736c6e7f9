"""Measuring a hypothesis on a model: plan the hooks, run the clean and the
corrupted prompts once each, check the interventions, hand every claim kind
its claims, collect the figures' data.

    plan      hooks = union of each claim's kind.hooks(claim) (+ the signature plot's)
    base runs clean and corrupted forwards caching those hooks (mech.runs.Runs)
    baseline  clean, corrupted and gap metric with BCa CIs (seed: the run seed)
    sanity    engine.sanity over every claim's kind.interventions(claim)
    claims    kind.measure(all claims of the kind, Context) for each registered kind
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import stats
from ..claims.base import ClaimKind, Context, InterventionPath
from ..claims.registry import kind_of
from ..evidence.details import SanityCheck, WeightsVsUseRow
from ..evidence.result import ClaimResult
from ..mech import hooks
from ..mech.runs import Runs
from ..model import metrics
from ..model.devices import of
from ..progress import progress
from ..spec.fields import ClaimSpec
from ..spec.settings import Stats
from . import figure_data, sanity


@dataclass
class Measurements:
    baseline: dict[str, Any]
    sanity_checks: list[SanityCheck]
    claims: list[ClaimResult]
    weights_vs_use: list[WeightsVsUseRow]
    figures_data: dict[str, Any] = field(default_factory=dict)


def hooks_needed(claims: Sequence[ClaimSpec], n_layers: int) -> list[str]:
    """Every hook the claims (and the figures) read from the base runs, once each."""
    out = [h for c in claims for h in kind_of(c).hooks(c, n_layers)] + figure_data.hooks_needed(claims)
    return list(dict.fromkeys(out))


def interventions(claims: Sequence[ClaimSpec], n_layers: int, n_heads: int) -> list[InterventionPath]:
    return [p for c in claims for p in kind_of(c).interventions(c, n_layers, n_heads)]


def by_kind(claims: Sequence[ClaimSpec]) -> dict[ClaimKind[Any, Any], list[tuple[int, ClaimSpec]]]:
    """The claims grouped by kind, each with its position in the file."""
    out: dict[ClaimKind[Any, Any], list[tuple[int, ClaimSpec]]] = {}
    for i, c in enumerate(claims):
        out.setdefault(kind_of(c), []).append((i, c))
    return out


def measure_all(model: Any, ds: Any, claims: Sequence[ClaimSpec], metric: str, st: Stats, processing: str,
                seed: int, figures: bool = True) -> Measurements:
    """Run every claim on `model` (model.loading.LoadedModel) and `ds` (model.data.Dataset)."""
    bridge = model.bridge
    ds = ds.to(of(bridge))  # the prompts meet the model on its device
    n_layers, n_heads = model.n_layers, model.n_heads
    names_ = hooks_needed(claims, n_layers)
    clean = hooks.cache_hooks(bridge, ds.clean, names_)
    corrupt = hooks.cache_hooks(bridge, ds.corrupted, names_)

    def metric_of(logits: Any) -> np.ndarray:
        return metrics.per_prompt(logits, ds.positions, ds.answers, metric, ds.wrong).cpu().numpy()

    runs = Runs(bridge, ds, clean, corrupt, metric_of, metric_of(clean["logits"]), metric_of(corrupt["logits"]))
    unit = metrics.UNITS[metric]
    gap = runs.m_clean - runs.m_corrupt
    baseline = {"metric": metric, "unit": unit, "clean": _mean_ci(runs.m_clean, st, seed),
                "corrupted": _mean_ci(runs.m_corrupt, st, seed), "gap": _mean_ci(gap, st, seed)}
    checks = [sanity.gap_check(gap, st, unit)]
    checks += sanity.identity_checks(runs, interventions(claims, n_layers, n_heads))

    ctx = Context(runs=runs, stats=st, seed=seed, unit=unit, processing=processing)
    found: dict[int, ClaimResult] = {}
    for kind, items in by_kind(claims).items():
        found.update(kind.measure(items, ctx))
    results = [found[i] for i in range(len(claims))]

    figs: dict[str, Any] = {}
    if figures:
        figs["attention"] = figure_data.attention(claims, clean, ds.clean)
        if any(kind_of(c).needs_weights(c) for c in claims):
            hw = ctx.weights()
            figs["composition"] = figure_data.composition(hw, claims, st, seed, progress)
            figs["signature"] = figure_data.signature(hw, claims, runs, st, seed, unit, progress)
    return Measurements(baseline, checks, results, ctx.weights_vs_use, figs)


def _mean_ci(x: np.ndarray, st: Stats, seed: int) -> dict[str, Any]:
    ci = stats.mean_ci(x, st.bootstrap, st.confidence, seed)
    return {"mean": ci.estimate, "ci": [ci.low, ci.high]}
