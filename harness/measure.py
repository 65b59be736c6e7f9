"""Measurements on the model: the base runs, role scores and ablation runs a
hypothesis needs, each forward done once, then handed to the evaluators.

Sanity checks recorded on every run (a failure raises SanityCheckError):
* every intervention hook fired (interventions.run_plan);
* identity intervention: replacing the ablated heads' z by their own clean
  values reproduces the clean metric (max |diff| <= 1e-5);
* the clean-corrupted gap is reported; normalised claims need it >= min_gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import claims as evaluators
from . import interventions as iv
from . import metrics, names, roles
from .errors import SanityCheckError
from .evidence import ClaimResult
from .spec import AblationClaim, CompositionClaim, Hypothesis, RoleClaim
from .stats import mean_ci

IDENTITY_TOL = 1e-5


@dataclass
class Measurements:
    baseline: dict
    sanity_checks: list[dict]
    claims: list[ClaimResult]
    patterns: dict  # {head name: attention pattern of prompt 0 [q, k]} for figures


def measure_all(model: Any, ds: Any, s: Hypothesis, seed: int) -> Measurements:
    bridge = model.bridge
    role_layers = {names.parse_head(c.head).layer for c in s.claims
                   if isinstance(c, RoleClaim) and c.role != "copying"}
    ablation_heads = [[names.parse_head(h) for h in c.heads] for c in s.claims
                      if isinstance(c, AblationClaim)]
    z_layers = {h.layer for hs in ablation_heads for h in hs}

    clean = iv.cache_hooks(bridge, ds.clean, [iv.pattern_hook(l) for l in sorted(role_layers)]
                           + [iv.z_hook(l) for l in sorted(z_layers)])
    corrupt = iv.cache_hooks(bridge, ds.corrupted, [iv.z_hook(l) for l in sorted(z_layers)])

    def metric(logits: Any) -> np.ndarray:
        return metrics.per_prompt(logits, ds.positions, ds.answers, s.metric, ds.wrong).cpu().numpy()

    m_clean, m_corrupt = metric(clean["logits"]), metric(corrupt["logits"])
    st = s.stats
    unit = metrics.UNITS[s.metric]
    gap = m_clean - m_corrupt
    baseline = {
        "metric": s.metric, "unit": unit,
        "clean": _ci_dict(m_clean, st, seed), "corrupted": _ci_dict(m_corrupt, st, seed),
        "gap": _ci_dict(gap, st, seed),
    }
    checks = [{"name": "clean and corrupted metrics differ",
               "passed": bool(gap.mean() >= st.min_gap),
               "detail": f"mean gap {gap.mean():.3f} {unit} (min_gap {st.min_gap:g}); "
                         "normalised effects are undefined below it"}]
    clean_z = {l: clean[iv.z_hook(l)] for l in z_layers}
    corrupt_z = {l: corrupt[iv.z_hook(l)] for l in z_layers}
    if ablation_heads:
        heads = sorted({h for hs in ablation_heads for h in hs})
        # identity: "resample" from the clean run itself must change nothing
        plan = iv.ablation_plan(heads, "resample", clean_z, clean_z)
        diff = float(np.abs(metric(iv.run_plan(bridge, ds.clean, plan)) - m_clean).max())
        passed = diff <= IDENTITY_TOL
        checks.append({"name": "identity intervention reproduces the clean run", "passed": passed,
                       "detail": f"max |metric diff| {diff:.2e} (tolerance {IDENTITY_TOL:g})"})
        if not passed:
            raise SanityCheckError(f"patching clean activations into the clean run changed the "
                                   f"metric by {diff:.2e}: the hooks do not do what they should")
        checks.append({"name": "every intervention hook fired", "passed": True,
                       "detail": "checked on every patched forward"})

    results: list = [None] * len(s.claims)
    for i, r in weight_results(bridge, s, seed).items():
        results[i] = r
    patterns = {}
    for i, c in enumerate(s.claims):
        cseed = seed + 1000 * i  # independent, reproducible stream per claim
        if results[i] is not None:
            continue
        if isinstance(c, RoleClaim):
            h = names.parse_head(c.head)
            pat = clean[iv.pattern_hook(h.layer)][:, h.head]
            patterns[str(h)] = pat[0].double().cpu().numpy()
            sc = roles.role_scores(pat, ds.clean, c.role).cpu().numpy()
            results[i] = evaluators.evaluate_role(c, sc, st, cseed)
        else:
            heads = [names.parse_head(x) for x in c.heads]
            plan = iv.ablation_plan(heads, c.ablation, clean_z, corrupt_z)
            m_abl = metric(iv.run_plan(bridge, ds.clean, plan))
            results[i] = evaluators.evaluate_ablation(c, m_clean, m_corrupt, m_abl, st, cseed, unit)
    return Measurements(baseline, checks, results, patterns)


def weight_results(bridge: Any, s: Hypothesis, seed: int) -> dict[int, ClaimResult]:
    """Weight-only claims (composition, copying), keyed by claim index.  Composition
    p-values are Benjamini-Hochberg adjusted across the file's composition claims."""
    from dataclasses import asdict

    from . import weights

    wanted = {i: c for i, c in enumerate(s.claims)
              if isinstance(c, CompositionClaim) or (isinstance(c, RoleClaim) and c.role == "copying")}
    if not wanted:
        return {}
    hw = weights.head_weights(bridge, s.weight_processing)
    out: dict[int, ClaimResult] = {}
    comp: dict[int, dict] = {}
    n_comp = sum(isinstance(c, CompositionClaim) for c in wanted.values())
    extend = weights.draws_needed(n_comp, s.stats.composition_alpha)
    mode_scores: dict[str, Any] = {}
    for i, c in wanted.items():
        if isinstance(c, RoleClaim):
            h = names.parse_head(c.head)
            value, info = weights.copying_score(hw, h.layer, h.head)
            out[i] = evaluators.evaluate_copying(c, value, info)
            continue
        e = names.parse_edge(c.edge)
        mode = e.receiver.which
        if mode not in mode_scores:
            mode_scores[mode] = weights.all_scores(hw, mode)
        r = weights.composition(hw, (e.sender.layer, e.sender.head),
                                (e.receiver.head.layer, e.receiver.head.head), mode,
                                s.stats.null_draws, seed + 1000 * i, mode_scores[mode],
                                extend, s.stats.composition_alpha)
        comp[i] = asdict(r)
    adjusted = weights.benjamini_hochberg([r["p_value"] for r in comp.values()])
    for (i, r), p_adj in zip(comp.items(), adjusted):
        out[i] = evaluators.evaluate_composition(wanted[i], r, p_adj, s.stats.composition_alpha, len(comp))
    return out


def _ci_dict(x: np.ndarray, st: Any, seed: int) -> dict:
    ci = mean_ci(x, st.bootstrap, st.confidence, seed)
    return {"mean": ci.estimate, "ci": [ci.low, ci.high]}
