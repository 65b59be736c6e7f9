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
* copying:  Re(sum lambda) / sum |lambda| of the head's W_E OV W_U (weights.py);
            exact (no CI); undefined -> INCONCLUSIVE.
* composition: score C against the rotation null (weights.py); the one-sided
            p-values of a file's composition claims are Benjamini-Hochberg
            adjusted together.  "composes" holds when p_adj < composition_alpha,
            "does_not_compose" when p_adj >= composition_alpha.  Weight evidence
            proposes a route; it never shows the route is used.
"""

from __future__ import annotations

import numpy as np

from . import stats
from .evidence import INCONCLUSIVE, ClaimResult, bound_text, threshold_verdict
from .evidence import FAIL, PASS
from .spec import AblationClaim, CompositionClaim, RoleClaim, Stats


def evaluate_role(claim: RoleClaim, scores: np.ndarray, st: Stats, seed: int) -> ClaimResult:
    """scores: per-prompt role scores of the claimed head (NaN = undefined)."""
    expectation = f"{claim.role} score of {claim.head} {bound_text(claim.at_least, claim.at_most)}"
    ok = scores[~np.isnan(scores)]
    details = {"n_prompts": int(len(scores)), "n_undefined": int(len(scores) - len(ok))}
    if len(ok) < 2:
        return ClaimResult(claim.id, "role", expectation, INCONCLUSIVE, None, None, "attention",
                           f"score undefined: only {len(ok)} prompt(s) have a query this role "
                           "can score (e.g. induction needs repeated tokens)",
                           claim.description, details, "observational")
    iv = stats.mean_ci(ok, st.bootstrap, st.confidence, seed)
    verdict, rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)
    details |= stats.summary(ok) | {"ci_method": iv.method, "confidence": iv.confidence}
    return ClaimResult(claim.id, "role", expectation, verdict, iv.estimate, [iv.low, iv.high],
                       "attention", rule, claim.description, details, "observational")


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
                           [d_iv.low, d_iv.high], unit, rule, claim.description, details, "causal")
    if norm is None:
        if keep.sum() < 2:
            why = (f"only {int(keep.sum())} prompt(s) have a clean-corrupted gap of at least "
                   f"min_prompt_gap {st.min_prompt_gap:g} {unit}")
        else:
            why = (f"mean clean-corrupted gap {details['gap_mean']:.3f} {unit} is below min_gap "
                   f"{st.min_gap:g}")
        rule = f"normalized effect undefined: {why} (raw drop {d_iv.estimate:.3f} {unit})"
        return ClaimResult(claim.id, "ablation", expectation, INCONCLUSIVE, None, None,
                           "fraction of gap", rule, claim.description, details, "causal")
    verdict, rule = threshold_verdict(norm.low, norm.high, claim.at_least, claim.at_most)
    rule += f" (raw drop {d_iv.estimate:.3f} {unit})"
    return ClaimResult(claim.id, "ablation", expectation, verdict, norm.estimate,
                       [norm.low, norm.high], "fraction of gap", rule, claim.description, details, "causal")


def evaluate_copying(claim: RoleClaim, value: float | None, info: dict) -> ClaimResult:
    expectation = f"copying score of {claim.head} {bound_text(claim.at_least, claim.at_most)}"
    if value is None:
        return ClaimResult(claim.id, "role", expectation, INCONCLUSIVE, None, None, "eigenvalue positivity",
                           "copying score undefined: the head's OV circuit does not reach the "
                           "unembedding (sum |lambda| ~ 0)", claim.description, info, "weights")
    if claim.at_least is not None:
        ok, rel = value >= claim.at_least, f">= {claim.at_least:g}"
    else:
        ok, rel = value <= claim.at_most, f"<= {claim.at_most:g}"
    rule = f"exact value {value:.3f} {'is' if ok else 'is not'} {rel} (weights only, no sampling)"
    return ClaimResult(claim.id, "role", expectation, PASS if ok else FAIL, value, None,
                       "eigenvalue positivity", rule, claim.description, info, "weights")


def evaluate_composition(claim: CompositionClaim, result: dict, p_adjusted: float, alpha: float,
                         n_tested: int) -> ClaimResult:
    """result: the weights.CompositionResult of the claimed pair, as a dict."""
    composes = p_adjusted < alpha
    want = claim.expect == "composes"
    verdict = PASS if composes == want else FAIL
    expectation = f"{claim.edge} {'composes' if want else 'does not compose'} ({result['mode'].upper()}-composition)"
    rule = (f"C = {result['score']:.3f} vs null mean {result['null_mean']:.3f} (99th pct "
            f"{result['null_q99']:.3f}); p = {result['p_value']:.4g}, BH-adjusted over {n_tested} "
            f"composition claim(s) p = {p_adjusted:.4g} {'<' if composes else '>='} alpha {alpha:g}")
    details = dict(result, p_adjusted=p_adjusted, alpha=alpha, correction="Benjamini-Hochberg",
                   n_tested=n_tested)
    return ClaimResult(claim.id, "composition", expectation, verdict, result["score"], None,
                       "composition score", rule, claim.description, details, "weights")
