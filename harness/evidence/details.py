"""Typed records of the evidence document.

`Record` is the base of every typed part of evidence.json: unknown keys are
errors, `to_dict()` is exactly what the document holds.  `Details` is the base
of each claim kind's details (defined in the kind's module).  A field made
with `optional()` is left out of the document while it is None, so keys that
exist only in some cases (e.g. a normalized effect that is undefined) stay
absent, as docs/evidence-json.md documents them.

Measured numbers are `Num` (float or None): JSON has no NaN, so an undefined
number is written as null and read back as None.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ..spec.vocabulary import LadderStatus, Rung, UseStatus
from .verdicts import Verdict

Num = float | None
CI = Annotated[list[Num], Field(min_length=2, max_length=2)]  # [low, high]


def _is_none(value: Any) -> bool:
    return value is None


def optional(default: Any = None) -> Any:
    """A field that is left out of the document while it is None."""
    return Field(default, exclude_if=_is_none)


class Record(BaseModel):
    """A typed part of the evidence document."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class Details(Record):
    """Base class of a claim kind's details."""


class Summary(Record):
    """Median and interquartile range of per-prompt values."""

    median: Num
    q1: Num
    q3: Num
    iqr: Num


class Variant(Record):
    """One row of a sensitivity run: the claim under another ablation/replacement."""

    verdict: Verdict
    value: Num
    ci: CI | None


class Sensitivity(Record):
    """The same claim under every ablation or replacement type."""

    by_type: dict[str, Variant]
    agrees: bool  # every type gives the claim's own verdict


class PassRegion(Record):
    """Where a claim's number must lie for PASS, as the effects figure shades it: the
    interval [low, high] (None: unbounded on that side) and the bound in words
    (`at least 0.8`, `> 0.1 (min_effect)`, `within ±0.05 (tolerance)`).  The verdict
    itself needs the whole CI inside (and, for some kinds, more: the rule says what)."""

    low: Num
    high: Num
    text: str


class SanityCheck(Record):
    name: str
    passed: bool  # a check that does not apply passes
    detail: str
    applies: bool | None = optional()  # False: no claim of the file reads what it checks (absent: it applies)


class EdgeTest(Record):
    """One edge claim's test of an edge (a row of the weights-vs-use table may have several)."""

    claim: str
    replacement: str
    corruption: str | None
    use: UseStatus  # used, used (opposite sign), unused, undetermined, or untested (a vacuous patch)
    effect: Num


class TokenLoad(Record):
    """One token of a direction's readout: its id, its text (with the model's tokenizer;
    absent without one) and how much it loads on the direction (mech.weights.explain)."""

    token: int
    text: str | None = optional()
    load: float


class ExplainedDirection(Record):
    """One singular direction of a route's product P = X Y (mech.weights.explain): its singular
    value, its share of C^2 against the rotation null, and what it means in token space."""

    index: int  # 1 = the largest singular value
    sigma: float  # singular value of P
    share: float  # sigma^2 / sum of all sigma^2: its share of C^2
    null_share_mean: float  # the i-th largest share under the rotation null
    null_share_ci: CI  # its central 95% interval
    multiplicity: int  # singular values equal to this one (> 1: the direction is not unique)
    positional_share: Num  # of the sender's input direction; None: no learned positions
    sender_reads: list[TokenLoad]  # embeddings closest to the sender's input direction a_i
    sender_writes: list[TokenLoad]  # embeddings through the sender's OV closest to what it writes, m_i
    receiver_reads: list[TokenLoad] | None = optional()  # .q/.k: embeddings closest to b_i, the other side
    receiver_positional_share: Num = optional()  # .q/.k: of b_i
    token_match: Num = optional()  # .q/.k: correlation over tokens of the sender_reads and receiver_reads loads
    promotes: list[TokenLoad] | None = optional()  # .v: the largest logits of b_i W_U


class Explained(Record):
    """What flows through a head -> head-input route (mech.weights.explain): the spectrum of the
    product against the rotation null, the principal angles between what the sender writes
    and what the receiver reads, and the top singular directions."""

    score: Num  # C; spectrum[i]^2 sums to C^2
    rank: int  # of the product
    n_draws: int  # null draws
    spectrum: list[float]  # sigma_i / (||X||_F ||Y||_F), all d_head, largest first
    null_spectrum: list[CI]  # the central 95% interval of each under the null
    angles: list[float]  # principal angles in degrees, smallest first
    null_angles: list[CI]  # the central 95% interval of each under the null
    n_aligned: int  # angles below their null interval: directions aligned beyond chance
    top_share_p: Num  # one-sided p of direction 1's share under the null; None: no direction
    directions: list[ExplainedDirection]  # the top ones (at most the product's rank)
    n_layers: int | None = optional()  # of the model: how far the route lies from the embeddings and the logits


class WeightsVsUseRow(Record):
    """Composition (weights) beside patching (use) for one edge in one direction: every
    edge claim that tests it, and the class their results give.  An edge with an MLP end
    has no composition score: composition, its p and `composes` are None."""

    edge: str
    direction: str
    claim: str  # the claim whose test decides `use` (its effect and CI are shown)
    composition: Num
    composition_p_adjusted: float | None
    composes: bool | None
    effect: Num
    effect_ci: CI | None
    use: UseStatus
    classification: str = Field(alias="class")
    tests: list[EdgeTest]
    explained: Explained | None = optional()  # head -> head-input edges (not groups): what flows


class LadderStep(Record):
    """One claim's evidence on one rung of a mechanism's ladder."""

    claim: str
    status: LadderStatus  # supports, against, inconclusive or untested (an intervention that tests nothing)
    note: str = ""


class LadderRow(Record):
    """Which levels of evidence the run reached for one mechanism (a head, a set of heads, an edge)."""

    mechanism: str
    type: str  # head, heads or edge
    rungs: dict[Rung, list[LadderStep]]  # rung -> the claims that bear on it (only rungs with claims)
    highest: Rung | None  # the highest rung some claim supports
    missing: list[Rung]  # rungs that apply to this type of mechanism and no claim tested
    contradictions: list[str]  # rungs whose evidence disagrees, in words
