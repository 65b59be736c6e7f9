"""Evaluators of weight and observational claims, each turning measurements
into a `ClaimResult`.  Formulas:

* role:     score = mean over prompts of the per-prompt role score
            (roles.role_scores); BCa CI over prompts.
  (causal claims: ablation, edge, circuit are evaluated in causal.py)
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

from . import names, stats
from .evidence import FAIL, INCONCLUSIVE, PASS, ClaimResult, bound_text, threshold_verdict
from .spec import CompositionClaim, RoleClaim, Stats


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
                       "attention", rule, claim.description, details, "observational", ok.tolist())


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
    import math

    composes = p_adjusted < alpha
    want = claim.expect == "composes"
    verdict = PASS if composes == want else FAIL
    expectation = f"{names.parse_edge(claim.edge)} {'composes' if want else 'does not compose'} ({result['mode'].upper()}-composition)"
    rule = (f"C = {result['score']:.3f} vs null mean {result['null_mean']:.3f} (99th pct "
            f"{result['null_q99']:.3f}); p = {result['p_value']:.4g}, BH-adjusted over {n_tested} "
            f"composition claim(s) p = {p_adjusted:.4g} {'<' if composes else '>='} alpha {alpha:g}")
    details = dict(result, edge=str(names.parse_edge(claim.edge)), p_adjusted=p_adjusted, alpha=alpha,
                   correction="Benjamini-Hochberg", n_tested=n_tested)
    if math.isnan(result["score"]):
        rule = "no route: the sender's OV or the receiver's matrix is zero (score undefined, p = 1)"
        return ClaimResult(claim.id, "composition", expectation, verdict, None, None, "composition score",
                           rule, claim.description, details, "weights")
    return ClaimResult(claim.id, "composition", expectation, verdict, result["score"], None,
                       "composition score", rule, claim.description, details, "weights")
