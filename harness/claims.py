"""Evaluators: one function per claim kind, each turning measurements into a
`ClaimResult`.  Formulas:

* role:     score = mean over prompts of the per-prompt role score
            (roles.role_scores); BCa CI over prompts.
* ablation: per prompt, drop d_n = m_clean,n - m_ablated,n (metric units) and
            gap g_n = m_clean,n - m_corrupted,n.
            measure "delta":      value = mean(d)
            measure "normalized": value = sum(d) / sum(g) over prompts with
            g_n >= min_prompt_gap (the ratio of means; 1 = the ablation removes
            the whole clean-corrupted gap), defined only when mean(g) over those
            prompts >= min_gap.  Median and IQR of d_n / g_n are reported too.
"""

from __future__ import annotations

import numpy as np

from . import stats
from .evidence import INCONCLUSIVE, ClaimResult, bound_text, threshold_verdict
from .spec import AblationClaim, RoleClaim, Stats


def evaluate_role(claim: RoleClaim, scores: np.ndarray, st: Stats, seed: int) -> ClaimResult:
    """scores: per-prompt role scores of the claimed head (NaN = undefined)."""
    expectation = f"{claim.role} score of {claim.head} {bound_text(claim.at_least, claim.at_most)}"
    ok = scores[~np.isnan(scores)]
    details = {"n_prompts": int(len(scores)), "n_undefined": int(len(scores) - len(ok))}
    if len(ok) < 2:
        return ClaimResult(claim.id, "role", expectation, INCONCLUSIVE, None, None, "attention",
                           f"score undefined: only {len(ok)} prompt(s) have a query this role "
                           "can score (e.g. induction needs repeated tokens)",
                           claim.description, details)
    iv = stats.mean_ci(ok, st.bootstrap, st.confidence, seed)
    verdict, rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)
    details |= stats.summary(ok) | {"ci_method": iv.method, "confidence": iv.confidence}
    return ClaimResult(claim.id, "role", expectation, verdict, iv.estimate, [iv.low, iv.high],
                       "attention", rule, claim.description, details)


def evaluate_ablation(claim: AblationClaim, m_clean: np.ndarray, m_corrupt: np.ndarray,
                      m_ablated: np.ndarray, st: Stats, seed: int, unit: str) -> ClaimResult:
    heads = "+".join(claim.heads)
    measure = "normalized effect" if claim.measure == "normalized" else f"metric drop ({unit})"
    expectation = (f"{claim.ablation}-ablating {heads}: {measure} "
                   f"{bound_text(claim.at_least, claim.at_most)}")
    drop = m_clean - m_ablated
    gap = m_clean - m_corrupt
    d_iv = stats.mean_ci(drop, st.bootstrap, st.confidence, seed)
    details = {
        "ablation": claim.ablation,
        "heads": list(claim.heads),
        "measure": claim.measure,
        "n_prompts": int(len(drop)),
        "clean_metric_mean": float(m_clean.mean()),
        "ablated_metric_mean": float(m_ablated.mean()),
        "corrupted_metric_mean": float(m_corrupt.mean()),
        "drop_mean": d_iv.estimate,
        "drop_ci": [d_iv.low, d_iv.high],
        "drop_p_value": stats.sign_flip_pvalue(drop, st.permutations, seed),
        "drop_summary": stats.summary(drop),
        "ci_method": d_iv.method,
        "confidence": st.confidence,
    }
    keep = gap >= st.min_prompt_gap
    details["n_excluded_small_gap"] = int((~keep).sum())
    norm = None
    if keep.sum() >= 2 and gap[keep].mean() >= st.min_gap:
        norm = stats.bootstrap_ci([drop[keep], gap[keep]], stats.ratio_of_means,
                                  st.bootstrap, st.confidence, seed)
        details["normalized"] = norm.estimate
        details["normalized_ci"] = [norm.low, norm.high]
        details["normalized_summary"] = stats.summary(drop[keep] / gap[keep])
        details["normalized_ci_method"] = norm.method
    details["gap_mean"] = float(gap[keep].mean()) if keep.any() else float(gap.mean())

    if claim.measure == "delta":
        verdict, rule = threshold_verdict(d_iv.low, d_iv.high, claim.at_least, claim.at_most)
        return ClaimResult(claim.id, "ablation", expectation, verdict, d_iv.estimate,
                           [d_iv.low, d_iv.high], unit, rule, claim.description, details)
    if norm is None:
        if keep.sum() < 2:
            why = (f"only {int(keep.sum())} prompt(s) have a clean-corrupted gap of at least "
                   f"min_prompt_gap {st.min_prompt_gap:g} {unit}")
        else:
            why = (f"mean clean-corrupted gap {details['gap_mean']:.3f} {unit} is below min_gap "
                   f"{st.min_gap:g}")
        rule = f"normalized effect undefined: {why} (raw drop {d_iv.estimate:.3f} {unit})"
        return ClaimResult(claim.id, "ablation", expectation, INCONCLUSIVE, None, None,
                           "fraction of gap", rule, claim.description, details)
    verdict, rule = threshold_verdict(norm.low, norm.high, claim.at_least, claim.at_most)
    rule += f" (raw drop {d_iv.estimate:.3f} {unit})"
    return ClaimResult(claim.id, "ablation", expectation, verdict, norm.estimate,
                       [norm.low, norm.high], "fraction of gap", rule, claim.description, details)
