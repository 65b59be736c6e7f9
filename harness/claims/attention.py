"""Claim kind `attention`: how much a head attends from one named position to another
(observational), e.g. "L2H0 attends from the scored position to the second S".

A position is `scored` (the data's scored position), `bos` (position 0, when the prompts
start with the BOS token) or a slot occurrence of a template, `{slot: S, occurrence: 2}`
(the k-th time `{S}` appears in the template, counted from 1): its token span, the tokens
of its value.  Per prompt n, with A the head's attention pattern on the clean prompt,

    a_n = mean over query positions q of  sum over key positions k in the `to` span of  A[n, q, k]

where the query positions are the scored positions (`from: scored`), 0 (`from: bos`) or the
last token of the slot occurrence; so a multi-token value receives the attention of all its
tokens.  The score is the mean of a_n over prompts with its BCa CI; the threshold rule decides.
A `to` position that no query position can see (it comes after every one of them: attention is
causal) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from .. import stats
from ..data import named_spans
from ..data.settings import DataSettings, FileData
from ..data.text_settings import PromptsData, TemplateData, occurrences, parse_template
from ..errors import DataError
from ..evidence.details import Details, Num, optional
from ..evidence.format import fmt
from ..evidence.result import ClaimResult
from ..evidence.verdicts import threshold_verdict
from ..spec import names
from ..spec.fields import BoundedClaim, HeadName
from ..spec.names import hook_pattern
from ..spec.settings import Strict
from ..spec.vocabulary import Rung
from .base import ClaimKind, Context, Indexed, LadderEntry, Measured, verdict_status
from .view import ClaimView, details


class SlotPosition(Strict):
    """The `occurrence`-th appearance of `{slot}` in a template (from 1)."""

    slot: str = Field(min_length=1)
    occurrence: int = Field(1, ge=1)

    def key(self) -> str:
        return f"{self.slot}#{self.occurrence}"

    def __str__(self) -> str:
        return f"{self.slot} (occurrence {self.occurrence})"


Position = Literal["scored", "bos"] | SlotPosition


def shown(p: Position) -> str:
    return str(p) if isinstance(p, SlotPosition) else {"scored": "the scored position", "bos": "BOS"}[p]


class AttentionClaim(BoundedClaim):
    """A head's attention from one named position to another, against a bound."""

    kind: Literal["attention"]
    head: HeadName
    from_: Position = Field(alias="from")
    to: Position

    @model_validator(mode="after")
    def _sensible(self) -> AttentionClaim:
        if not 0.0 <= self.bound <= 1.0:
            raise ValueError(f"attention weights lie in [0, 1]; threshold {self.bound} is impossible")
        if self.from_ == self.to and self.to != "scored":
            raise ValueError("from and to name the same position")
        return self

    def check_data(self, data: DataSettings) -> str | None:
        """Slot positions need a template that has the slot that often, or text prompts that name it (their
        `spans`: a listed prompt's are checked here, a file's when it is read)."""
        for key, p in (("from", self.from_), ("to", self.to)):
            if not isinstance(p, SlotPosition) or isinstance(data, FileData):
                continue
            if isinstance(data, PromptsData):
                try:
                    named = [s.rpartition("#")[0] for s in named_spans.occurrences(
                        data.prompts[0].text, data.prompts[0].spans or {}, "data.prompts[0]")]
                except DataError as exc:
                    return f"claim {self.id!r}: {key}: {exc}"
                if named.count(p.slot) < p.occurrence:
                    return (f"claim {self.id!r}: {key}: data.prompts[0] names {p.slot!r} {named.count(p.slot)} "
                            f"time(s) in its spans; a slot position of listed prompts is a name of their 'spans'")
                continue
            if not isinstance(data, TemplateData):
                return (f"claim {self.id!r}: {key}: a slot position names a slot of a template (data.template) or a "
                        "named span of text prompts ('spans' of data.prompts or of a text prompt file)")
            n = occurrences(parse_template(data.template), p.slot)
            if n == 0:
                return f"claim {self.id!r}: {key}: the template has no slot {p.slot!r}; its slots: " \
                       f"{', '.join(data.slots)}"
            if p.occurrence > n:
                return (f"claim {self.id!r}: {key}: slot {p.slot!r} appears {n} time(s) in the template; "
                        f"occurrence {p.occurrence} does not exist")
        return None


class AttentionDetails(Details):
    head: str
    from_position: str
    to_position: str
    n_prompts: int
    median: Num = optional()
    q1: Num = optional()
    q3: Num = optional()
    iqr: Num = optional()
    ci_method: str | None = optional()
    confidence: float | None = optional()


def queries(ds: Any, p: Position) -> Any:
    """[n, m] the query positions of `p` (module docstring)."""
    import torch

    if p == "scored":
        return ds.positions
    if p == "bos":
        return torch.zeros(ds.n, 1, dtype=torch.long, device=ds.positions.device)
    return _span(ds, p)[:, 1:] - 1


def _span(ds: Any, p: SlotPosition) -> Any:
    """[n, 2] the token span of a named position; DataError naming what the data name where they lack it."""
    if p.key() not in ds.spans:
        raise DataError(f"{p.key()}: the data name no such position (a template's slot occurrence or a prompt's "
                        f"'spans'); they name: {', '.join(ds.spans) or 'none'}")
    return ds.spans[p.key()]


def keys(ds: Any, p: Position) -> Any:
    """[n, 2] the key span [start, end) of `p`."""
    import torch

    if p == "scored":
        if ds.positions.shape[1] != 1:
            raise DataError(f"to: scored needs one scored position per prompt; the data score {ds.positions.shape[1]}")
        return torch.cat([ds.positions, ds.positions + 1], 1)
    if p == "bos":
        return torch.tensor([[0, 1]], device=ds.positions.device).expand(ds.n, -1)
    return _span(ds, p)


def attention_scores(pattern: Any, q: Any, span: Any) -> np.ndarray:
    """a_n (module docstring) of pattern [n, query, key], query positions q [n, m], key span [n, 2]."""
    import torch

    n, s, _ = pattern.shape
    rows = pattern.double().gather(1, q.unsqueeze(-1).expand(-1, -1, s))  # [n, m, key]
    k = torch.arange(s, device=pattern.device)[None, :]
    inside = ((k >= span[:, :1]) & (k < span[:, 1:])).to(rows.dtype)  # [n, key]
    out: np.ndarray = (rows * inside[:, None, :]).sum(-1).mean(-1).cpu().numpy()
    return out


class AttentionView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, AttentionDetails)
        return [f"- from {d.from_position} to {d.to_position}: per-prompt median {fmt(d.median)}, IQR {fmt(d.iqr)}; "
                f"{d.n_prompts} prompts"]


class AttentionKind(ClaimKind[AttentionClaim, AttentionDetails]):
    name = "attention"
    spec = AttentionClaim
    details = AttentionDetails
    evidence = "observational"
    summary = "a head's attention from one named position (scored, bos, a slot of a template) to another"
    view = AttentionView()

    def hooks(self, claim: AttentionClaim, n_layers: int) -> list[str]:
        return [hook_pattern(claim.head.layer)]

    def shown_heads(self, claim: AttentionClaim) -> list[names.Head]:
        return [claim.head]

    def ladder(self, claim: AttentionClaim, result: ClaimResult) -> list[LadderEntry]:
        return [LadderEntry(str(claim.head), "head", Rung.OBSERVATION, verdict_status(result),
                            f"attention from {shown(claim.from_)} to {shown(claim.to)} {fmt(result.value)}")]

    def measure(self, claims: Sequence[Indexed[AttentionClaim]], ctx: Context) -> Measured:
        ds, out = ctx.runs.ds, {}
        for i, c in claims:
            if "bos" in (c.from_, c.to) and not ds.has_bos:
                raise DataError(f"claim {c.id!r}: bos names position 0, and these prompts do not start with the BOS "
                                "token")
            q, span = queries(ds, c.from_), keys(ds, c.to)
            if bool((span[:, 0] > q.max(1).values).all()):
                raise DataError(f"claim {c.id!r}: {shown(c.to)} comes after {shown(c.from_)} in every prompt, and "
                                "attention is causal: no query there can see it")
            pattern = ctx.runs.clean[hook_pattern(c.head.layer)][:, c.head.head]
            out[i] = self.evaluate(c, attention_scores(pattern, q.to(pattern.device), span.to(pattern.device)), ctx,
                                   ctx.claim_seed(i))
        return Measured(out)

    def evaluate(self, claim: AttentionClaim, scores: np.ndarray, ctx: Context, seed: int) -> ClaimResult:
        expectation = f"attention of {claim.head} from {shown(claim.from_)} to {shown(claim.to)} {claim.bound_text()}"
        iv = stats.mean_ci(scores, ctx.stats.bootstrap, ctx.stats.confidence, seed)
        verdict, rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)
        details = AttentionDetails(head=str(claim.head), from_position=shown(claim.from_), to_position=shown(claim.to),
                                   n_prompts=int(len(scores)), **stats.summary(scores), ci_method=iv.method,
                                   confidence=iv.confidence)
        return self.result(claim, expectation=expectation, verdict=verdict, value=iv.estimate, ci=[iv.low, iv.high],
                           unit="attention", rule=rule, details=details, per_prompt=scores.tolist())


KIND = AttentionKind()
