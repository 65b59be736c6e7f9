"""Claim results and the evidence document of one run (plain data).

`Evidence.to_dict()` is the evidence.json document (docs/evidence-json.md);
`evidence.document` reads it back and validates it.  Rendering lives in
`harness.report`; the claim table and the Markdown need the claim kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..errors import ExitCode
from .details import Details, LadderRow, PassRegion, SanityCheck, WeightsVsUseRow
from .verdicts import EvidenceType, Verdict

SCHEMA_VERSION = 8  # of evidence.json; docs/evidence-json.md lists the changes


@dataclass(kw_only=True, frozen=True)
class ClaimResult:
    """One claim's verdict with the numbers that decided it (immutable: a kind builds it whole)."""

    id: str
    kind: str
    expectation: str  # the claim in words, e.g. "previous_token score of L0H3 >= 0.5"
    verdict: Verdict
    value: float | None  # the deciding number (None if undefined)
    ci: list[float] | None  # [low, high]; None for exact or undefined numbers
    unit: str
    rule: str  # how the verdict was reached, with the numbers
    details: Details  # the kind's typed details
    evidence: EvidenceType
    description: str = ""
    per_prompt: list[float] | None = None  # the claim's number prompt by prompt (None: exact)
    reason: str = ""  # why this verdict, in one line (the verdict table's `reason`; "" reads as `rule`)
    pass_region: PassRegion | None = None  # where the number must lie for PASS (ClaimKind.pass_region)

    @property
    def why(self) -> str:
        """The verdict's reason in one line: `reason`, or the rule when there is none."""
        return self.reason or self.rule

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "expectation": self.expectation,
                "verdict": self.verdict, "value": self.value, "ci": self.ci, "unit": self.unit,
                "rule": self.rule, "description": self.description, "details": self.details.to_dict(),
                "evidence": self.evidence, "per_prompt": self.per_prompt, "reason": self.reason,
                "pass_region": None if self.pass_region is None else self.pass_region.to_dict()}


@dataclass(kw_only=True)
class Evidence:
    """Everything a run found; `to_dict()` is the evidence.json document."""

    hypothesis: dict[str, Any]
    model: dict[str, Any]
    data: dict[str, Any]
    settings: dict[str, Any]
    baseline: dict[str, Any]
    sanity_checks: list[SanityCheck]
    claims: list[ClaimResult]
    provenance: dict[str, Any]
    weights_vs_use: list[WeightsVsUseRow] = field(default_factory=list)
    figures_data: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # settings that weaken the guards (stats.warnings)
    ladder: list[LadderRow] = field(default_factory=list)  # the evidence ladder per mechanism (engine.ladder)

    @property
    def passed(self) -> bool:
        return all(c.verdict == Verdict.PASS for c in self.claims)

    @property
    def failed_sanity_checks(self) -> list[SanityCheck]:
        """The recorded sanity checks that failed (e.g. the clean-corrupted gap below
        min_gap); fatal ones raise SanityCheckError and leave no Evidence."""
        return [c for c in self.sanity_checks if not c.passed]

    @property
    def exit_code(self) -> int:
        """ExitCode.SANITY (3) when a recorded sanity check failed, else OK (0) when every
        claim passed, else CLAIMS (1)."""
        if self.failed_sanity_checks:
            return ExitCode.SANITY
        return ExitCode.OK if self.passed else ExitCode.CLAIMS

    @cached_property
    def _by_id(self) -> dict[str, ClaimResult]:
        """The claims by id (the first of each), made once: the pytest plugin asks once per claim."""
        return {c.id: c for c in reversed(self.claims)}

    def claim(self, claim_id: str) -> ClaimResult:
        """The result of the claim with this id (KeyError listing the ids if there is none)."""
        found = self._by_id.get(claim_id)
        if found is not None:
            return found
        ids = [c.id for c in self.claims]
        shown = ", ".join(ids[:20]) + (f", ... ({len(ids)} in all)" if len(ids) > 20 else "")
        raise KeyError(f"no claim {claim_id!r}; the claims are {shown}")

    def counts(self) -> dict[str, int]:
        out = {v.value: 0 for v in Verdict}
        for c in self.claims:
            out[c.verdict.value] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "hypothesis": self.hypothesis,
            "model": self.model,
            "data": self.data,
            "settings": self.settings,
            "baseline": self.baseline,
            "sanity_checks": [c.to_dict() for c in self.sanity_checks],
            "claims": [c.to_dict() for c in self.claims],
            "weights_vs_use": [r.to_dict() for r in self.weights_vs_use],
            "figures_data": self.figures_data,
            "warnings": self.warnings,
            "ladder": [r.to_dict() for r in self.ladder],
            "counts": self.counts(),
            "provenance": self.provenance,
        }
