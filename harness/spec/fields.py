"""Building blocks of claim schemas: the base claim model, bounds, and fields
that hold parsed component names.

A name field validates a string with `names` and holds the parsed frozen
dataclass (`Head`, `Edge`); it serialises back to the canonical string, so
`model_dump()` of a claim gives the file's spelling.  Each field takes only what
fits it (`HeadName`, `HeadList`: heads; `EdgeName`: an edge claim's edge;
`PathName`: a path claim's path; `HeadRouteName`: a composition edge, head to head input), and a bad name's message
says so and suggests the nearest name that fits (names.parse_as).  Validation errors
are `ValueError`s with that message, which the loader reports as
`file:line: field: message`.  When the validation context holds a `names.Shape`
under SHAPE (hypothesis.loading, from the model's config.json), names are also
checked against the model's range and only names inside it are suggested.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import Field, PlainSerializer, PlainValidator, ValidationInfo, WithJsonSchema, model_validator

from ..errors import ComponentNameError
from . import names
from .settings import Stats, Strict

T = TypeVar("T")
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+=,@>-]*$"  # addressable as a pytest node id, no shell quoting needed
ID_MAX = 100
SHAPE = "model_shape"  # validation-context key: a names.Shape to check names against (hypothesis.loading)


def model_shape(info: ValidationInfo) -> names.Shape | None:
    """The model shape the validation was given in its context, if any."""
    shape = info.context.get(SHAPE) if isinstance(info.context, dict) else None
    return shape if isinstance(shape, names.Shape) else None


def _parsed(parse: Callable[[Any, names.Shape | None], T]) -> Callable[[Any, ValidationInfo], T]:
    """A pydantic validator from a names parser: the message of a ComponentNameError
    becomes the field's error; names are checked against the context's shape when given."""
    def validate(value: Any, info: ValidationInfo) -> T:
        if isinstance(value, (names.Head, names.Mlp, names.Edge, names.Path)):
            value = str(value)
        try:
            return parse(value, model_shape(info))
        except ComponentNameError as exc:
            raise ValueError(str(exc)) from None
    return validate


def _head_list(value: Any, info: ValidationInfo) -> list[names.Head]:
    """A non-empty list of distinct heads (each checked as a HeadName)."""
    head = _parsed(names.parse_head)
    return _no_duplicates([head(x, info) for x in _as_list(value)])


def _unit_list(value: Any, info: ValidationInfo) -> list[names.Unit]:
    """A non-empty list of distinct heads and MLPs (ablation and circuit members)."""
    unit = _parsed(names.parse_unit)
    return _no_duplicates([unit(x, info) for x in _as_list(value)])


U = TypeVar("U", names.Head, names.Unit)


def _no_duplicates(heads: list[U]) -> list[U]:
    """`heads`, unless one is listed twice (ValueError naming it)."""
    seen: set[U] = set()
    for h in heads:  # one pass
        if h in seen:
            raise ValueError(f"{h} is listed twice")
        seen.add(h)
    return heads


def _edge(ends: names.EdgeEnds) -> Callable[[Any, names.Shape | None], names.Edge]:
    """A parser of edges whose ends fit `ends`."""
    def parse(value: Any, shape: names.Shape | None) -> names.Edge:
        return names.parse_edge(value, ends, shape)
    return parse


def _path(value: Any, shape: names.Shape | None) -> names.Path:
    return names.parse_path(value, shape)


_AS_STRING = PlainSerializer(str, return_type=str)
HeadName = Annotated[names.Head, PlainValidator(_parsed(names.parse_head)), _AS_STRING,
                     WithJsonSchema({"type": "string", "examples": ["L1H6"]})]
# an edge claim's edge: a head or embed -> a later head's .q/.k/.v or logits (names.EDGE_RULE)
EdgeName = Annotated[names.Edge, PlainValidator(_parsed(_edge(names.EDGE))), _AS_STRING,
                     WithJsonSchema({"type": "string", "examples": ["L0H3 -> L1H6.k"]})]
# a path claim's path: sender -> hop -> ... -> receiver (names.parse_path)
PathName = Annotated[names.Path, PlainValidator(_parsed(_path)), _AS_STRING,
                     WithJsonSchema({"type": "string", "examples": ["L0H7 -> L1H5.k -> L2H3.q"]})]
# a composition claim's edge: a head -> a later head's .q/.k/.v
HeadRouteName = Annotated[names.Edge, PlainValidator(_parsed(_edge(names.HEAD_ROUTE))), _AS_STRING,
                          WithJsonSchema({"type": "string", "examples": ["L0H3 -> L1H6.k"]})]
HeadList = Annotated[list[HeadName], PlainValidator(_head_list),
                     WithJsonSchema({"type": "array", "items": {"type": "string"}, "minItems": 1,
                                     "examples": [["L0H7", "L1H5"]]})]
# ablation and circuit members: heads and MLPs
UnitList = Annotated[list[names.Unit], PlainValidator(_unit_list),
                     PlainSerializer(lambda xs: [str(x) for x in xs], return_type=list[str]),
                     WithJsonSchema({"type": "array", "items": {"type": "string"}, "minItems": 1,
                                     "examples": [["L0H7", "L1H5", "L1.mlp"]]})]


def _circuit_edges(value: Any, info: ValidationInfo) -> list[names.Edge]:
    """A non-empty list of distinct edges, each from one sender (an edge circuit's)."""
    if not isinstance(value, list) or not value:
        raise ValueError("expected a non-empty list of edges, e.g. [embed -> L0H7.v, L0H7 -> L1H5.k, L1H5 -> logits]")
    edge = _parsed(_edge(names.EDGE))
    out = [edge(x, info) for x in value]
    for e in out:
        if isinstance(e.sender, names.Group):
            parts = " and ".join(f"'{m} -> {e.receiver}'" for m in e.sender.members)
            raise ValueError(f"'{e}': an edge of a circuit has one sender; list {parts}")
    seen: set[names.Edge] = set()
    for e in out:  # one pass: a circuit may list a hundred thousand edges
        if e in seen:
            raise ValueError(f"{e} is listed twice")
        seen.add(e)
    return out


# an edge circuit's edges: each one sender -> one receiver (names.EDGE_RULE)
CircuitEdgeList = Annotated[list[names.Edge], PlainValidator(_circuit_edges),
                            PlainSerializer(lambda xs: [str(x) for x in xs], return_type=list[str]),
                            WithJsonSchema({"type": "array", "items": {"type": "string"}, "minItems": 1,
                                            "examples": [["embed -> L0H7.v", "L0H7 -> L1H5.k", "L1H5 -> logits"]]})]


def _as_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("expected a list of heads (or MLPs), e.g. [L0H7, L1H5]")
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

    def check_data(self, data: Any) -> str | None:
        """A problem with this claim under the file's `data` mapping (a data.settings.DataSettings),
        or None.  Override when the claim names something of the data (e.g. a template's slot)."""
        return None

    def check_metric(self, metric: str) -> str | None:
        """A problem with this claim under the file's metric, or None."""
        return None

    def metric_parts(self) -> bool:
        """Whether the claim splits the file's metric into its parts (`parts: true`)."""
        return False




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
