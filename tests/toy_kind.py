"""A claim kind written outside the harness package, as a plugin would write one:
`attention_entropy`, the mean entropy (nats) of a head's attention rows.

    H_n = mean over query positions q >= 1 of  -sum_k A[n, q, k] log A[n, q, k]

per prompt n (query 0 can only attend to itself), averaged over prompts with a
BCa CI; the threshold rule decides.  `EntropyView`, which the kind carries, says how its
details read in a report.  It imports only the declared extension surface (harness.extend).
tests/test_registry.py registers it (harness.extend.register_claim_kind(KIND)) and checks that files, runs, reports,
re-rendering and the pytest plugin handle it with no edit anywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from harness.extend import (
    BoundedClaim,
    ClaimKind,
    ClaimResult,
    ClaimView,
    Context,
    Details,
    HeadName,
    Indexed,
    Measured,
    Num,
    details,
    fmt,
    names,
    stats,
    threshold_verdict,
)


class EntropyClaim(BoundedClaim):
    kind: Literal["attention_entropy"]
    head: HeadName


class EntropyDetails(Details):
    n_prompts: int
    median: Num


def row_entropy(pattern: np.ndarray) -> np.ndarray:
    """Per-prompt mean entropy of the attention rows of queries 1.. : pattern [n, q, k] -> [n]."""
    p = pattern[:, 1:, :]
    logs = np.log(np.where(p > 0, p, 1.0))
    return -(p * logs).sum(-1).mean(-1)


class EntropyView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, EntropyDetails)
        return [f"- per-prompt entropy median {fmt(d.median)} nats over {d.n_prompts} prompts"]


class EntropyKind(ClaimKind[EntropyClaim, EntropyDetails]):
    name = "attention_entropy"
    spec = EntropyClaim
    details = EntropyDetails
    evidence = "observational"
    view = EntropyView()
    summary = "mean entropy of a head's attention rows (nats)"

    def hooks(self, claim: EntropyClaim, n_layers: int) -> list[str]:
        return [names.hook_pattern(claim.head.layer)]

    def shown_heads(self, claim: EntropyClaim) -> list[names.Head]:
        return [claim.head]

    def measure(self, claims: Sequence[Indexed[EntropyClaim]], ctx: Context) -> Measured:
        out = {}
        for i, c in claims:
            pattern = ctx.runs.clean[names.hook_pattern(c.head.layer)][:, c.head.head].double().cpu().numpy()
            h = row_entropy(pattern)
            iv = stats.mean_ci(h, ctx.stats.bootstrap, ctx.stats.confidence, ctx.claim_seed(i))
            verdict, rule = threshold_verdict(iv.low, iv.high, c.at_least, c.at_most)
            out[i] = self.result(c, expectation=f"attention entropy of {c.head} {c.bound_text()}", verdict=verdict,
                                 value=iv.estimate, ci=[iv.low, iv.high], unit="nats", rule=rule,
                                 details=EntropyDetails(n_prompts=len(h), median=float(np.median(h))),
                                 per_prompt=h.tolist())
        return Measured(out)


KIND = EntropyKind()
