"""Evaluators of causal claims (ablation, edge, circuit), with the shared
normalised-effect statistics.  Formulas, per prompt n, with m the metric:

* gap        g_n = m_clean,n - m_corrupted,n
* ablation   d_n = m_clean,n - m_ablated,n
* edge       noising:   d_n = m_clean,n - m_patched,n      (necessity)
             denoising: d_n = m_patched,n - m_corrupted,n  (sufficiency)
* normalised effect  e = sum(d) / sum(g) over prompts with g_n >= min_prompt_gap
  (ratio of means; 1 = the whole clean-corrupted gap), defined only when the
  mean gap over all prompts >= min_gap (and at least 2 prompts are kept); BCa CI
  over prompts; median/IQR of d_n / g_n.
* circuit    faithfulness F = sum(m_C - m_empty) / sum(m_full - m_empty) over
  prompts with m_full - m_empty >= min_prompt_gap (defined when that mean gap
  >= min_gap), with m_full the clean run, m_C the run with every head outside C
  ablated and m_empty the run with every head ablated; for at_least claims
  compared with N random circuits of the same size (never C itself):
  k = #{F_random < F}, one-sided binomial test of H0: P(beat) <= beat_rate.

Edge use (from the effect's CI [lo, hi] and the BH-adjusted sign-flip p-value):
  used       lo > min_effect and p_adj < alpha
  unused     -tolerance <= lo and hi <= tolerance
  otherwise  undetermined.
Verdicts: expect used   -> PASS if used, FAIL if hi < min_effect, else INCONCLUSIVE;
          expect unused -> PASS if unused, FAIL if lo > tolerance or hi < -tolerance,
          else INCONCLUSIVE; an undefined effect is INCONCLUSIVE.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import stats
from .evidence import FAIL, INCONCLUSIVE, PASS, ClaimResult, bound_text, threshold_verdict
from .spec import AblationClaim, CircuitClaim, EdgeClaim, Stats


def normalized_effect(d: np.ndarray, gap: np.ndarray, st: Stats, seed: int,
                      unit: str) -> tuple[Optional[stats.Interval], dict, str]:
    """(interval or None, details, reason if undefined) of sum(d)/sum(g) over kept prompts."""
    keep = gap >= st.min_prompt_gap
    details: dict = {"n_excluded_small_gap": int((~keep).sum()), "gap_mean": float(gap.mean()),
                     "kept_gap_mean": float(gap[keep].mean()) if keep.any() else None}
    # the gap must be there on average over all prompts: keeping only prompts with a
    # large gap would otherwise pick the positive tail of pure noise
    if gap.mean() < st.min_gap:
        return None, details, (f"mean clean-corrupted gap {gap.mean():.3f} {unit} over all prompts is "
                               f"below min_gap {st.min_gap:g}")
    if keep.sum() < 2:
        return None, details, (f"only {int(keep.sum())} prompt(s) have a clean-corrupted gap of at "
                               f"least min_prompt_gap {st.min_prompt_gap:g} {unit}")
    iv = stats.bootstrap_ci([d[keep], gap[keep]], stats.ratio_of_means, st.bootstrap,
                            st.confidence, seed)
    details |= {"normalized": iv.estimate, "normalized_ci": [iv.low, iv.high],
                "normalized_summary": stats.summary(d[keep] / gap[keep]),
                "normalized_ci_method": iv.method}
    return iv, details, ""


def per_prompt_effect(d: np.ndarray, gap: np.ndarray, st: Stats) -> list[float]:
    """d_n / g_n over the prompts kept for the normalised effect."""
    keep = gap >= st.min_prompt_gap
    return (d[keep] / gap[keep]).tolist()


def _drop_details(d: np.ndarray, st: Stats, seed: int) -> tuple[stats.Interval, dict]:
    iv = stats.mean_ci(d, st.bootstrap, st.confidence, seed)
    return iv, {"drop_mean": iv.estimate, "drop_ci": [iv.low, iv.high],
                "drop_p_value": stats.sign_flip_pvalue(d, st.permutations, seed),
                "drop_summary": stats.summary(d), "ci_method": iv.method,
                "confidence": st.confidence, "n_prompts": int(len(d))}


def evaluate_ablation(claim: AblationClaim, m_clean: np.ndarray, m_corrupt: np.ndarray,
                      m_ablated: np.ndarray, st: Stats, seed: int, unit: str) -> ClaimResult:
    heads = "+".join(claim.heads)
    measure = "normalized effect" if claim.measure == "normalized" else f"metric drop ({unit})"
    frozen = ", patterns frozen" if claim.freeze_patterns else ""
    expectation = (f"{claim.ablation}-ablating {heads}{frozen}: {measure} "
                   f"{bound_text(claim.at_least, claim.at_most)}")
    d = m_clean - m_ablated
    d_iv, details = _drop_details(d, st, seed)
    details |= {"ablation": claim.ablation, "heads": list(claim.heads), "measure": claim.measure,
                "freeze_patterns": claim.freeze_patterns,
                "clean_metric_mean": float(m_clean.mean()), "ablated_metric_mean": float(m_ablated.mean()),
                "corrupted_metric_mean": float(m_corrupt.mean())}
    norm, more, why = normalized_effect(d, m_clean - m_corrupt, st, seed, unit)
    details |= more
    if claim.measure == "delta":
        verdict, rule = threshold_verdict(d_iv.low, d_iv.high, claim.at_least, claim.at_most)
        return ClaimResult(claim.id, "ablation", expectation, verdict, d_iv.estimate,
                           [d_iv.low, d_iv.high], unit, rule, claim.description, details, "causal",
                           d.tolist())
    if norm is None:
        rule = f"normalized effect undefined: {why} (raw drop {d_iv.estimate:.3f} {unit})"
        return ClaimResult(claim.id, "ablation", expectation, INCONCLUSIVE, None, None,
                           "fraction of gap", rule, claim.description, details, "causal")
    verdict, rule = threshold_verdict(norm.low, norm.high, claim.at_least, claim.at_most)
    rule += f" (raw drop {d_iv.estimate:.3f} {unit})"
    return ClaimResult(claim.id, "ablation", expectation, verdict, norm.estimate,
                       [norm.low, norm.high], "fraction of gap", rule, claim.description, details,
                       "causal", per_prompt_effect(d, m_clean - m_corrupt, st))


def use_status(lo: float, hi: float, p_adj: float, min_effect: float, tolerance: float,
               alpha: float) -> str:
    if lo > min_effect and p_adj < alpha:
        return "used"
    if -tolerance <= lo and hi <= tolerance:
        return "unused"
    return "undetermined"


def edge_effect(claim: EdgeClaim, m_clean: np.ndarray, m_corrupt: np.ndarray,
                m_patched: np.ndarray, st: Stats, seed: int, unit: str) -> dict:
    """Measurements of one patched edge (before multiple-testing correction)."""
    d = m_clean - m_patched if claim.direction == "noising" else m_patched - m_corrupt
    _, details = _drop_details(d, st, seed)
    details = {k.replace("drop", "change"): v for k, v in details.items() if k != "drop_p_value"}
    details |= {"direction": claim.direction, "replacement": claim.replacement,
                "freeze_patterns": claim.freeze_patterns,
                "clean_metric_mean": float(m_clean.mean()), "patched_metric_mean": float(m_patched.mean()),
                "corrupted_metric_mean": float(m_corrupt.mean())}
    norm, more, why = normalized_effect(d, m_clean - m_corrupt, st, seed, unit)
    details |= more
    details["undefined_reason"] = why
    details["per_prompt"] = per_prompt_effect(d, m_clean - m_corrupt, st) if norm is not None else None
    keep = (m_clean - m_corrupt) >= st.min_prompt_gap
    details["p_value"] = (stats.sign_flip_pvalue(d[keep], st.permutations, seed)
                          if norm is not None else 1.0)
    return details


def evaluate_edge(claim: EdgeClaim, edge_text: str, details: dict, p_adj: float, st: Stats,
                  unit: str) -> ClaimResult:
    min_effect = claim.min_effect if claim.min_effect is not None else st.min_effect
    tol = claim.tolerance if claim.tolerance is not None else st.tolerance
    how = f"{claim.direction}, {claim.replacement}" + (", patterns frozen" if claim.freeze_patterns else "")
    want = (f"effect > {min_effect:g}" if claim.expect == "used" else f"effect within ±{tol:g}")
    expectation = f"{edge_text} {claim.expect} ({how}: {want})"
    details = dict(details, edge=edge_text, p_adjusted=p_adj, alpha=st.alpha, min_effect=min_effect, tolerance=tol,
                   correction="Benjamini-Hochberg over the file's edge claims")
    if "normalized" not in details:
        details.pop("per_prompt", None)
        details["use"] = "undetermined"
        rule = (f"normalized effect undefined: {details['undefined_reason']} "
                f"(raw change {details['change_mean']:.3f} {unit})")
        return ClaimResult(claim.id, "edge", expectation, INCONCLUSIVE, None, None, "fraction of gap",
                           rule, claim.description, details, "causal")
    per_prompt = details.pop("per_prompt", None)
    est, (lo, hi) = details["normalized"], details["normalized_ci"]
    use = use_status(lo, hi, p_adj, min_effect, tol, st.alpha)
    details["use"] = use
    if claim.expect == "used":
        verdict = PASS if use == "used" else FAIL if hi < min_effect else INCONCLUSIVE
    else:
        verdict = PASS if use == "unused" else FAIL if (lo > tol or hi < -tol) else INCONCLUSIVE
    rule = (f"effect {est:.3f} CI [{lo:.3f}, {hi:.3f}], p_adj {p_adj:.3g} -> {use} "
            f"(used: CI low > {min_effect:g} and p_adj < {st.alpha:g}; unused: CI within ±{tol:g}); "
            f"raw change {details['change_mean']:.3f} {unit}")
    return ClaimResult(claim.id, "edge", expectation, verdict, est, [lo, hi], "fraction of gap", rule,
                       claim.description, details, "causal", per_prompt)


def evaluate_circuit(claim: CircuitClaim, m_full: np.ndarray, m_circuit: np.ndarray,
                     m_empty: np.ndarray, random_f: Optional[np.ndarray], st: Stats, seed: int,
                     unit: str) -> ClaimResult:
    """random_f: faithfulness of random circuits of the same size (never the claimed
    one; computed over the same kept prompts), or None when no other circuit of that
    size exists.  The random comparison applies to at_least claims only."""
    from scipy.stats import binomtest

    compare = claim.at_least is not None
    expectation = (f"keep {len(claim.heads)} heads ({claim.ablation} elsewhere): faithfulness "
                   f"{bound_text(claim.at_least, claim.at_most)}"
                   + (f", beats random circuits (rate > {claim.beat_rate:g})" if compare else ""))
    num, gap = m_circuit - m_empty, m_full - m_empty
    details: dict = {"heads": list(claim.heads), "ablation": claim.ablation,
                     "full_metric_mean": float(m_full.mean()), "circuit_metric_mean": float(m_circuit.mean()),
                     "empty_metric_mean": float(m_empty.mean()), "n_prompts": int(len(num)),
                     "random_circuits": 0 if random_f is None else int(len(random_f)),
                     "beat_rate": claim.beat_rate, "confidence": st.confidence}
    # the "gap" of a circuit is full minus empty: same rules as a normalised effect
    iv, more, why = normalized_effect(num, gap, st, seed, unit)
    details |= {k.replace("normalized", "faithfulness"): v for k, v in more.items()}
    if iv is None:
        rule = f"faithfulness undefined: {why.replace('clean-corrupted', 'full-empty')}"
        return ClaimResult(claim.id, "circuit", expectation, INCONCLUSIVE, None, None, "faithfulness",
                           rule, claim.description, details, "causal")
    f_verdict, f_rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)
    per_prompt = per_prompt_effect(num, gap, st)
    if not compare:
        return ClaimResult(claim.id, "circuit", expectation, f_verdict, iv.estimate, [iv.low, iv.high],
                           "faithfulness", f"faithfulness {f_rule}", claim.description, details, "causal",
                           per_prompt)
    if random_f is None or len(random_f) == 0:
        rule = (f"faithfulness {f_rule}; no other circuit of {len(claim.heads)} heads exists, so the "
                "random-circuit comparison is undefined")
        verdict = FAIL if f_verdict == FAIL else INCONCLUSIVE
        return ClaimResult(claim.id, "circuit", expectation, verdict, iv.estimate, [iv.low, iv.high],
                           "faithfulness", rule, claim.description, details, "causal", per_prompt)
    k = int(np.sum(random_f < iv.estimate))
    test = binomtest(k, len(random_f), claim.beat_rate, alternative="greater")
    details |= {"random_faithfulness_summary": stats.summary(random_f),
                "random_faithfulness_max": float(np.max(random_f)), "beaten": k,
                "binomial_p_value": float(test.pvalue), "alpha": st.alpha}
    better = test.pvalue < st.alpha
    worse = k / len(random_f) <= claim.beat_rate
    if f_verdict == PASS and better:
        verdict = PASS
    elif f_verdict == FAIL or worse:
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    rule = (f"faithfulness {f_rule}; beats {k}/{len(random_f)} random circuits, binomial p = "
            f"{test.pvalue:.3g} ({'<' if better else '>='} alpha {st.alpha:g})")
    return ClaimResult(claim.id, "circuit", expectation, verdict, iv.estimate, [iv.low, iv.high],
                       "faithfulness", rule, claim.description, details, "causal", per_prompt)


WEIGHTS_VS_USE = {
    (True, "used"): "route used",
    (True, "unused"): "route present, unused",
    (False, "used"): "used without a weight route",
    (False, "unused"): "no route",
    (True, "undetermined"): "route present, use undetermined",
    (False, "undetermined"): "no weight route, use undetermined",
}


def classify(composes: bool, use: str) -> str:
    """The DESIGN.md weights-vs-use class of an edge."""
    return WEIGHTS_VS_USE[(composes, use)]
