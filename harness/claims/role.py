"""Claim kind `role`: a head's attention-pattern score on the data (observational).

    score = mean over prompts of the per-prompt role score (mech.roles.role_scores)

with a BCa CI over prompts; the threshold rule decides (evidence.verdicts).
Prompts with no query the role can score are left out and counted; with fewer
than 2 defined prompts the score is undefined (INCONCLUSIVE).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import model_validator

from .. import stats
from ..evidence.details import Details, Num, optional
from ..evidence.format import fmt
from ..evidence.result import ClaimResult
from ..evidence.verdicts import INCONCLUSIVE, threshold_verdict
from ..mech import roles
from ..spec import names
from ..spec.fields import BoundedClaim, HeadName
from ..spec.names import hook_pattern
from ..spec.vocabulary import AttentionRole, Rung
from .base import ClaimKind, Context, Indexed, LadderEntry, Measured, verdict_status
from .view import ClaimView, details


class RoleClaim(BoundedClaim):
    """A head's attention-role score against a bound."""

    kind: Literal["role"]
    head: HeadName
    role: AttentionRole

    @model_validator(mode="after")
    def _in_range(self) -> RoleClaim:
        if not 0.0 <= self.bound <= 1.0:
            raise ValueError(f"an attention score lies in [0, 1]; threshold {self.bound} is impossible")
        return self


class RoleDetails(Details):
    n_prompts: int
    n_undefined: int  # prompts with no query the role can score (left out)
    median: Num = optional()
    q1: Num = optional()
    q3: Num = optional()
    iqr: Num = optional()
    ci_method: str | None = optional()
    confidence: float | None = optional()


class RoleView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, RoleDetails)
        return [f"- per-prompt median {fmt(d.median)}, IQR {fmt(d.iqr)}; {d.n_prompts} prompts, "
                f"{d.n_undefined} undefined"]


class RoleKind(ClaimKind[RoleClaim, RoleDetails]):
    name = "role"
    spec = RoleClaim
    details = RoleDetails
    evidence = "observational"
    summary = "a head's attention-pattern score (previous_token, induction, duplicate_token, first_token)"
    view = RoleView()

    def matches(self, raw: dict[str, Any]) -> bool:
        return raw.get("kind") == "role" and raw.get("role") != "copying"  # role: copying is `copying`

    def hooks(self, claim: RoleClaim, n_layers: int) -> list[str]:
        return [hook_pattern(claim.head.layer)]

    def shown_heads(self, claim: RoleClaim) -> list[names.Head]:
        return [claim.head]

    def ladder(self, claim: RoleClaim, result: ClaimResult) -> list[LadderEntry]:
        return [LadderEntry(str(claim.head), "head", Rung.OBSERVATION, verdict_status(result),
                            f"{claim.role} score {fmt(result.value)}")]

    def measure(self, claims: Sequence[Indexed[RoleClaim]], ctx: Context) -> Measured:
        out = {}
        for i, c in claims:
            pattern = ctx.runs.clean[hook_pattern(c.head.layer)][:, c.head.head]
            scores = roles.role_scores(pattern, ctx.runs.ds.clean, c.role).cpu().numpy()
            out[i] = self.evaluate(c, scores, ctx, ctx.claim_seed(i))
        return Measured(out)

    def evaluate(self, claim: RoleClaim, scores: np.ndarray, ctx: Context, seed: int) -> ClaimResult:
        """scores: per-prompt role scores of the claimed head (NaN = undefined)."""
        expectation = f"{claim.role} score of {claim.head} {claim.bound_text()}"
        ok = scores[~np.isnan(scores)]
        n, n_undefined = int(len(scores)), int(len(scores) - len(ok))
        if len(ok) < 2:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None,
                               unit="attention", details=RoleDetails(n_prompts=n, n_undefined=n_undefined),
                               rule=f"score undefined: only {len(ok)} prompt(s) have a query this role can "
                                    "score (e.g. induction needs repeated tokens)")
        iv = stats.mean_ci(ok, ctx.stats.bootstrap, ctx.stats.confidence, seed)
        verdict, rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)
        details = RoleDetails(n_prompts=n, n_undefined=n_undefined, **stats.summary(ok), ci_method=iv.method,
                              confidence=iv.confidence)
        return self.result(claim, expectation=expectation, verdict=verdict, value=iv.estimate,
                           ci=[iv.low, iv.high], unit="attention", rule=rule, details=details,
                           per_prompt=ok.tolist())



KIND = RoleKind()
