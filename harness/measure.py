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
from .spec import AblationClaim, Hypothesis, RoleClaim
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
    role_layers = {names.parse_head(c.head).layer for c in s.claims if isinstance(c, RoleClaim)}
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

    results, patterns = [], {}
    for i, c in enumerate(s.claims):
        cseed = seed + 1000 * i  # independent, reproducible stream per claim
        if isinstance(c, RoleClaim):
            h = names.parse_head(c.head)
            pat = clean[iv.pattern_hook(h.layer)][:, h.head]
            patterns[str(h)] = pat[0].double().cpu().numpy()
            sc = roles.role_scores(pat, ds.clean, c.role).cpu().numpy()
            results.append(evaluators.evaluate_role(c, sc, st, cseed))
        else:
            heads = [names.parse_head(x) for x in c.heads]
            plan = iv.ablation_plan(heads, c.ablation, clean_z, corrupt_z)
            m_abl = metric(iv.run_plan(bridge, ds.clean, plan))
            results.append(evaluators.evaluate_ablation(c, m_clean, m_corrupt, m_abl, st, cseed, unit))
    return Measurements(baseline, checks, results, patterns)


def _ci_dict(x: np.ndarray, st: Any, seed: int) -> dict:
    ci = mean_ci(x, st.bootstrap, st.confidence, seed)
    return {"mean": ci.estimate, "ci": [ci.low, ci.high]}
