"""The data behind the report's figures, collected during a run and stored in
evidence.json (`figures_data`), so `harness report` can redraw every figure
from the JSON alone.

* attention:   for each head in an attention-role claim, its pattern on the
               first clean prompt, with the prompt's tokens (copied to the CPU).
* composition: for each mode (q/k/v) named by a composition or edge claim, the
               cross-layer score matrix and each cell's own null 99th percentile
               (per-cell, uncorrected: a guide to the eye; claims use BH).
* signature:   for every receiver input named by an edge or composition claim,
               every earlier head as a candidate sender: composition score (x),
               BH-adjusted null p over the candidates, and the noising edge effect
               with its CI (y, resample replacement); claimed edges are marked.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from . import names, weights
from .spec import CompositionClaim, EdgeClaim, Hypothesis, RoleClaim


def _clean(x: Any) -> Any:
    """NaN -> None for JSON."""
    if isinstance(x, float):
        return None if x != x else x
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def attention(s: Hypothesis, clean: dict, tokens: Any) -> list[dict]:
    out, seen = [], set()
    for c in s.claims:
        if isinstance(c, RoleClaim) and c.role != "copying" and c.head not in seen:
            seen.add(c.head)
            h = names.parse_head(c.head)
            pat = clean[f"blocks.{h.layer}.attn.hook_pattern"][0, h.head].cpu().double().numpy()
            out.append({"head": str(h), "tokens": tokens[0].tolist(), "pattern": np.round(pat, 5).tolist()})
    return out


def _modes(s: Hypothesis) -> list[str]:
    modes = []
    for c in s.claims:
        if isinstance(c, (CompositionClaim, EdgeClaim)):
            r = names.parse_edge(c.edge).receiver
            if isinstance(r, names.HeadInput) and r.which not in modes:
                modes.append(r.which)
    return sorted(modes)


def composition(hw: Any, s: Hypothesis, seed: int, progress: Callable) -> dict:
    out = {}
    L, H = hw.n_layers, hw.n_heads
    senders = [(l, h) for l in range(L - 1) for h in range(H)]
    receivers = [(l, h) for l in range(1, L) for h in range(H)]
    for m, mode in enumerate(_modes(s)):
        scores = weights.all_scores(hw, mode)
        q99 = np.full((len(senders), len(receivers)), np.nan)
        val = np.full_like(q99, np.nan)
        for i, (l1, h1) in progress(list(enumerate(senders)), f"composition null ({mode})"):
            X = weights.sender_matrix(hw, l1, h1)
            for j, (l2, h2) in enumerate(receivers):
                if l2 <= l1:
                    continue
                val[i, j] = scores[l1, h1, l2, h2]
                null = weights.null_scores(X, weights.receiver_matrix(hw, l2, h2, mode), s.stats.null_draws,
                                           weights.derive_seed(seed, 5, m, i, j), hw.null_dim)
                q99[i, j] = np.quantile(null, 0.99)
        out[mode] = {"senders": [f"L{l}H{h}" for l, h in senders],
                     "receivers": [f"L{l}H{h}.{mode}" for l, h in receivers],
                     "scores": _clean(np.round(val, 6).tolist()), "null_q99": _clean(np.round(q99, 6).tolist())}
    return out


def signature(hw: Any, s: Hypothesis, seed: int, effect: Callable[[EdgeClaim], Optional[dict]],
              progress: Callable) -> dict:
    """effect(claim) -> {"value", "ci"} of a noising edge patch (None if undefined)."""
    from .weight_claims import composition_evidence

    claimed = {str(names.parse_edge(c.edge)) for c in s.claims if isinstance(c, (EdgeClaim, CompositionClaim))}
    receivers: list[names.HeadInput] = []
    for c in s.claims:
        if isinstance(c, (EdgeClaim, CompositionClaim)):
            r = names.parse_edge(c.edge).receiver
            if isinstance(r, names.HeadInput) and r not in receivers:
                receivers.append(r)
    candidates = [names.Edge(names.Head(l, h), r) for r in receivers
                  for l in range(r.head.layer) for h in range(hw.n_heads)]
    if not candidates:
        return {}
    comp = composition_evidence(hw, candidates, s, seed, 6)
    points = []
    for e, r in progress(list(zip(candidates, comp)), "signature edges"):
        eff = effect(EdgeClaim(id=str(e), kind="edge", edge=str(e)))
        points.append({"edge": str(e), "composition": _clean(r["score"]), "null_q99": r["null_q99"],
                       "composition_p_adjusted": r["p_adjusted"],
                       "composes": bool(r["p_adjusted"] < s.stats.composition_alpha),
                       "effect": None if eff is None else eff["value"],
                       "effect_ci": None if eff is None else eff["ci"], "claimed": str(e) in claimed})
    return {"points": points, "min_effect": s.stats.min_effect, "tolerance": s.stats.tolerance,
            "composition_alpha": s.stats.composition_alpha,
            "note": "noising, resample replacement; composition p BH-adjusted over these candidates"}
