"""Claim kind `copying`: a head's OV circuit copies tokens (weight evidence).

    copying = Re(sum lambda) / sum |lambda|

over the eigenvalues lambda of the head's full OV circuit W_E OV W_U
(mech.weights.scores.copying_score); 1 = pure copying.  Exact (no sampling, no CI):
PASS when the value meets the bound.  Undefined (INCONCLUSIVE) when the OV
circuit never reaches the unembedding (sum |lambda| ~ 0).

`kind: role` with `role: copying` is accepted as another spelling of
`kind: copying` (files written before copying was its own kind).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import model_validator

from ..evidence.details import Details
from ..evidence.result import ClaimResult
from ..evidence.verdicts import FAIL, INCONCLUSIVE, PASS
from ..mech.weights import scores
from ..spec.fields import BoundedClaim, HeadName
from ..spec.vocabulary import Rung
from .base import ClaimKind, Context, Indexed, LadderEntry, Measured, verdict_status
from .view import ClaimView, details

UNIT = "eigenvalue positivity"


class CopyingClaim(BoundedClaim):
    """A head's copying score against a bound."""

    kind: Literal["copying"]
    head: HeadName

    @model_validator(mode="before")
    @classmethod
    def _alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "role" and data.get("role") == "copying":
            data = {k: v for k, v in data.items() if k != "role"} | {"kind": "copying"}
        return data

    @model_validator(mode="after")
    def _in_range(self) -> CopyingClaim:
        if not -1.0 <= self.bound <= 1.0:
            raise ValueError(f"a copying score lies in [-1, 1]; threshold {self.bound} is impossible")
        return self


class CopyingDetails(Details):
    sum_abs_eigenvalues: float
    n_eigenvalues: int  # d_head: the eigenvalues are those of the d_head x d_head form
    processing: str  # folded or raw


class CopyingView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, CopyingDetails)
        return [f"- {d.n_eigenvalues} eigenvalues of W_E OV W_U (d_head x d_head form), "
                f"sum |lambda| = {d.sum_abs_eigenvalues:.4g}; weights {d.processing}"]


class CopyingKind(ClaimKind[CopyingClaim, CopyingDetails]):
    name = "copying"
    spec = CopyingClaim
    details = CopyingDetails
    evidence = "weights"
    summary = "a head's OV circuit copies tokens (eigenvalue positivity of W_E OV W_U)"
    view = CopyingView()

    def matches(self, raw: dict[str, Any]) -> bool:
        return raw.get("kind") == "copying" or (raw.get("kind") == "role" and raw.get("role") == "copying")

    def needs_weights(self, claim: CopyingClaim) -> bool:
        return True

    def ladder(self, claim: CopyingClaim, result: ClaimResult) -> list[LadderEntry]:
        value = "undefined" if result.value is None else f"{result.value:.3f}"
        return [LadderEntry(str(claim.head), "head", Rung.WEIGHTS, verdict_status(result),
                            f"copying score {value}")]

    def measure(self, claims: Sequence[Indexed[CopyingClaim]], ctx: Context) -> Measured:
        return Measured({i: self.evaluate(c, scores.copying_score(ctx.weights(), c.head.layer, c.head.head))
                         for i, c in claims})

    def evaluate(self, claim: CopyingClaim, score: scores.CopyingScore) -> ClaimResult:
        expectation = f"copying score of {claim.head} {claim.bound_text()}"
        details = CopyingDetails(sum_abs_eigenvalues=score.sum_abs_eigenvalues, n_eigenvalues=score.n_eigenvalues,
                                 processing=score.processing)
        value = score.value
        if value is None:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None, unit=UNIT,
                               details=details, rule="copying score undefined: the head's OV circuit does not "
                                                     "reach the unembedding (sum |lambda| ~ 0)")
        if claim.at_least is not None:
            ok, rel = value >= claim.at_least, f">= {claim.at_least:g}"
        else:
            ok, rel = value <= claim.bound, f"<= {claim.bound:g}"
        rule = f"exact value {value:.3f} {'is' if ok else 'is not'} {rel} (weights only, no sampling)"
        return self.result(claim, expectation=expectation, verdict=PASS if ok else FAIL, value=value, ci=None,
                           unit=UNIT, rule=rule, details=details)



KIND = CopyingKind()
