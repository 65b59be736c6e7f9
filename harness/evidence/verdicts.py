"""Verdicts and the threshold rule.

From the confidence interval [lo, hi] of a claim's number and its bound:

* at_least t: PASS if lo >= t;  FAIL if hi < t;  else INCONCLUSIVE
* at_most t:  PASS if hi <= t;  FAIL if lo > t;  else INCONCLUSIVE

A number that is undefined on the data (no qualifying prompts, a clean-corrupt
gap below the minimum) gives INCONCLUSIVE with the reason, never PASS.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Literal


class Verdict(StrEnum):
    """A claim's verdict; a str, equal to its name ("PASS" == Verdict.PASS)."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


PASS, FAIL, INCONCLUSIVE = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE

EvidenceType = Literal["weights", "observational", "attribution", "causal"]
EVIDENCE_TYPES: dict[str, str] = {
    "weights": "Weight evidence: what the parameters allow (proposes routes; not evidence of use)",
    "observational": "Observational evidence: what the model does on the data (attention patterns)",
    "attribution": "Attribution estimates: what a first-order expansion predicts an intervention would change "
                   "(estimates, not interventions)",
    "causal": "Causal evidence: what changes when the model is intervened on",
}


def threshold_verdict(lo: float, hi: float, at_least: float | None,
                      at_most: float | None) -> tuple[Verdict, str]:
    """(verdict, rule text) for a CI [lo, hi] against one bound."""
    if any(math.isnan(x) for x in (lo, hi)):
        return INCONCLUSIVE, "confidence interval undefined"
    ci = f"CI [{lo:.3f}, {hi:.3f}]"
    if at_least is not None:
        if lo >= at_least:
            return PASS, f"{ci} lies at or above {at_least:g}"
        if hi < at_least:
            return FAIL, f"{ci} lies below {at_least:g}"
        return INCONCLUSIVE, f"{ci} straddles {at_least:g}"
    if at_most is None:
        raise ValueError("threshold_verdict needs at_least or at_most")
    if hi <= at_most:
        return PASS, f"{ci} lies at or below {at_most:g}"
    if lo > at_most:
        return FAIL, f"{ci} lies above {at_most:g}"
    return INCONCLUSIVE, f"{ci} straddles {at_most:g}"
