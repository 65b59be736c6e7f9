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

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .verdicts import Verdict

Num = float | None
CI = list[Num]  # [low, high]


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


class SanityCheck(Record):
    name: str
    passed: bool
    detail: str


class WeightsVsUseRow(Record):
    """Composition (weights) beside patching (use) for one head -> head-input edge claim."""

    edge: str
    claim: str
    composition: Num
    composition_p_adjusted: float
    composes: bool
    effect: Num
    effect_ci: CI | None
    use: str
    classification: str = Field(alias="class")
