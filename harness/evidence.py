"""Evidence: claim results, verdicts, and the evidence document.

Threshold verdicts, from the confidence interval [lo, hi] of the claim's
number and its bound:

* at_least t: PASS if lo >= t;  FAIL if hi < t;  else INCONCLUSIVE
* at_most t:  PASS if hi <= t;  FAIL if lo > t;  else INCONCLUSIVE

A number that is undefined on the data (no qualifying prompts, a clean-corrupt
gap below the minimum) gives INCONCLUSIVE with the reason, never PASS.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
EVIDENCE_SCHEMA_VERSION = 1
EVIDENCE_TYPES = {
    "weights": "Weight evidence: what the parameters allow (proposes routes; not evidence of use)",
    "observational": "Observational evidence: what the model does on the data (attention patterns)",
    "causal": "Causal evidence: what changes when the model is intervened on",
}


@dataclass
class ClaimResult:
    id: str
    kind: str
    expectation: str  # e.g. "previous_token score of L0H3 >= 0.5"
    verdict: str
    value: Optional[float]  # the deciding number (None if undefined)
    ci: Optional[list[float]]  # [low, high]
    unit: str
    rule: str  # how the verdict was reached, with the numbers
    description: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    evidence: str = ""  # "weights" | "observational" | "causal" (see EVIDENCE_TYPES)
    per_prompt: Optional[list[float]] = None  # the claim's number prompt by prompt (None: exact)

    def key_number(self) -> str:
        if self.value is None:
            return "undefined"
        if self.kind == "composition":
            return f"{self.value:.3f} (p_adj {self.details['p_adjusted']:.3g})"
        ci = f" [{self.ci[0]:.3f}, {self.ci[1]:.3f}]" if self.ci else " (exact)"
        return f"{self.value:.3f}{ci}"


def threshold_verdict(lo: float, hi: float, at_least: Optional[float],
                      at_most: Optional[float]) -> tuple[str, str]:
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


def bound_text(at_least: Optional[float], at_most: Optional[float]) -> str:
    return f">= {at_least:g}" if at_least is not None else f"<= {at_most:g}"


@dataclass
class Evidence:
    """Everything a run found; `to_dict()` is the evidence.json document."""

    hypothesis: dict
    model: dict
    data: dict
    settings: dict
    baseline: dict
    sanity_checks: list[dict]
    claims: list[ClaimResult]
    provenance: dict
    weights_vs_use: list[dict] = field(default_factory=list)
    figures_data: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.verdict == PASS for c in self.claims)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict:
        return {
            "schema_version": EVIDENCE_SCHEMA_VERSION,
            "hypothesis": self.hypothesis,
            "model": self.model,
            "data": self.data,
            "settings": self.settings,
            "baseline": self.baseline,
            "sanity_checks": self.sanity_checks,
            "claims": [asdict(c) for c in self.claims],
            "weights_vs_use": self.weights_vs_use,
            "figures_data": self.figures_data,
            "counts": self.counts(),
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Evidence":
        """Rebuild from an evidence.json document (the inverse of `to_dict`)."""
        return cls(d["hypothesis"], d["model"], d["data"], d["settings"], d["baseline"],
                   d["sanity_checks"], [ClaimResult(**c) for c in d["claims"]], d["provenance"],
                   d.get("weights_vs_use", []), d.get("figures_data", {}))

    def counts(self) -> dict:
        out = {PASS: 0, FAIL: 0, INCONCLUSIVE: 0}
        for c in self.claims:
            out[c.verdict] += 1
        return out

    def table(self, fmt: str = "simple") -> str:
        """The claim table (tabulate)."""
        from tabulate import tabulate

        rows = [(c.id, c.kind, c.expectation, c.verdict, c.key_number()) for c in self.claims]
        return tabulate(rows, headers=["claim", "kind", "expectation", "verdict", "value [CI]"],
                        tablefmt=fmt)

    def write(self, out_dir: Any = None, reports_root: Any = None) -> Any:
        """Write report.md and evidence.json to a new folder; return its path."""
        from .report import write_report

        return write_report(self, out_dir=out_dir, reports_root=reports_root)
