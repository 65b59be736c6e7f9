"""Measuring the weight-only claims of a file (composition, copying) and the
composition side of the weights-vs-use table.  No forward pass is needed."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from . import claims as evaluators
from . import names, weights
from .weights import derive_seed
from .evidence import ClaimResult
from .spec import CompositionClaim, Hypothesis, RoleClaim


def composition_evidence(hw: Any, pairs: list[names.Edge], s: Hypothesis, seed: int,
                         stream: int) -> list[dict]:
    """CompositionResult dicts for head -> head-input edges, with BH-adjusted p."""
    extend = weights.draws_needed(len(pairs), s.stats.composition_alpha)
    mode_scores: dict[str, Any] = {}
    out = []
    for k, e in enumerate(pairs):
        mode = e.receiver.which
        if mode not in mode_scores:
            mode_scores[mode] = weights.all_scores(hw, mode)
        r = weights.composition(hw, (e.sender.layer, e.sender.head),
                                (e.receiver.head.layer, e.receiver.head.head), mode,
                                s.stats.null_draws, derive_seed(seed, stream, k), mode_scores[mode],
                                extend, s.stats.composition_alpha)
        out.append(asdict(r))
    for r, p_adj in zip(out, weights.benjamini_hochberg([r["p_value"] for r in out])):
        r["p_adjusted"] = p_adj
    return out


def weight_results(hw: Any, s: Hypothesis, seed: int) -> dict[int, ClaimResult]:
    """Weight-only claims keyed by claim index; composition p-values are
    Benjamini-Hochberg adjusted across the file's composition claims."""
    out: dict[int, ClaimResult] = {}
    comp_idx = [i for i, c in enumerate(s.claims) if isinstance(c, CompositionClaim)]
    for i, c in enumerate(s.claims):
        if isinstance(c, RoleClaim) and c.role == "copying":
            h = names.parse_head(c.head)
            value, info = weights.copying_score(hw, h.layer, h.head)
            out[i] = evaluators.evaluate_copying(c, value, info)
    results = composition_evidence(hw, [names.parse_edge(s.claims[i].edge) for i in comp_idx], s, seed, 1)
    for i, r in zip(comp_idx, results):
        out[i] = evaluators.evaluate_composition(s.claims[i], r, r.pop("p_adjusted"),
                                                 s.stats.composition_alpha, len(comp_idx))
    return out


def needs_weights(s: Hypothesis) -> bool:
    from .spec import EdgeClaim

    return any(isinstance(c, (CompositionClaim, EdgeClaim)) or (isinstance(c, RoleClaim) and c.role == "copying")
               for c in s.claims)
