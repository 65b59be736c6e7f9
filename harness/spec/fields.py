"""Building blocks of claim schemas: the base claim model, bounds, and fields
that hold parsed component names.

A name field validates a string with `names` and holds the parsed frozen
dataclass (`Head`, `Edge`); it serialises back to the canonical string, so
`model_dump()` of a claim gives the file's spelling.  Validation errors are
`ValueError`s with the grammar's message, which the loader reports as
`file:line: field: message`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import Field, PlainSerializer, PlainValidator, WithJsonSchema, model_validator

from ..errors import ComponentNameError
from . import names
from .settings import Stats, Strict

T = TypeVar("T")
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+=,@>-]*$"  # addressable as a pytest node id, no shell quoting needed
ID_MAX = 100


def _parsed(parse: Callable[[str], T]) -> Callable[[Any], T]:
    def validate(value: Any) -> T:
        if isinstance(value, (names.Head, names.Edge)):
            return parse(str(value))
        try:
            return parse(value)
        except ComponentNameError as exc:
            raise ValueError(str(exc)) from None
    return validate


def _no_duplicates(heads: list[names.Head]) -> list[names.Head]:
    if len(set(heads)) != len(heads):
        raise ValueError("a head is listed twice")
    return heads


_AS_STRING = PlainSerializer(str, return_type=str)
HeadName = Annotated[names.Head, PlainValidator(_parsed(names.parse_head)), _AS_STRING,
                     WithJsonSchema({"type": "string", "examples": ["L1H6"]})]
EdgeName = Annotated[names.Edge, PlainValidator(_parsed(names.parse_edge)), _AS_STRING,
                     WithJsonSchema({"type": "string", "examples": ["L0H3 -> L1H6.k"]})]
HeadList = Annotated[list[HeadName], PlainValidator(
    lambda v: _no_duplicates([_parsed(names.parse_head)(x) for x in _as_list(v)])),
    WithJsonSchema({"type": "array", "items": {"type": "string"}, "minItems": 1, "examples": [["L0H7", "L1H5"]]})]


def _as_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("expected a list of heads, e.g. [L0H7, L1H5]")
    if not value:
        raise ValueError("List should have at least 1 item")
    return value


class ClaimSpec(Strict):
    """What every claim has.  A kind's schema subclasses this (or `BoundedClaim`)
    and narrows `kind` to a literal."""

    id: str = Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)
    kind: str
    description: str = ""

    def check_settings(self, stats: Stats) -> str | None:
        """A problem with this claim under the file's `stats` (checked after both
        validate), or None.  Override when a claim's values interact with them."""
        return None

    def corruptions_used(self) -> list[str]:
        """The named corruptions the claim runs on (checked against the data's)."""
        return []




class BoundedClaim(ClaimSpec):
    """A claim about one number with exactly one bound: `at_least` or `at_most`."""

    at_least: float | None = None
    at_most: float | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> BoundedClaim:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("give exactly one of at_least / at_most")
        return self

    @property
    def bound(self) -> float:
        """The bound's value (at_least or at_most, whichever is given)."""
        value = self.at_least if self.at_least is not None else self.at_most
        if value is None:  # unreachable after validation
            raise ValueError("give exactly one of at_least / at_most")
        return value

    def bound_text(self) -> str:
        return f">= {self.at_least:g}" if self.at_least is not None else f"<= {self.at_most:g}"


class CorruptionChoice(ClaimSpec):
    """A claim that runs on a corrupted run: `corruption` names which (default: the data's first)."""

    corruption: str | None = Field(None, min_length=1)

    def corruptions_used(self) -> list[str]:
        return [self.corruption] if self.corruption is not None else []


class BoundedCausalClaim(BoundedClaim):
    """A bounded claim that runs on a corrupted run (`corruption`, as CorruptionChoice)."""

    corruption: str | None = Field(None, min_length=1)

    def corruptions_used(self) -> list[str]:
        return [self.corruption] if self.corruption is not None else []
