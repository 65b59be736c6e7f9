"""The hypothesis document (pydantic).  The top-level keys are defined here;
`claims` accepts every registered claim kind (claims.registry), each validated
by its own schema.  Defaults live in the models only; docs/hypothesis-format.md
documents every key.  Imports no torch.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Discriminator, Field, Tag, create_model, field_validator, model_validator

from ..claims import registry
from ..claims.base import ClaimKind
from ..data import sources as data_sources
from ..model import metrics
from ..spec.fields import ClaimSpec
from ..spec.settings import Stats, Strict
from ..spec.vocabulary import Processing

FORMAT_VERSION = 1
NAME_MAX = 100  # the name is part of report folder names


def claim_tag(kind: str) -> str:
    """The union tag of a claim kind.  Tags appear in pydantic error locations and
    are spelled so that they never collide with a key of the file."""
    return f"kind={kind}"


def data_tag(kind: str) -> str:
    return f"data={kind}"


def _data_tag(v: Any) -> str | None:
    sources = data_sources.kinds()
    if not isinstance(v, dict):
        return next((data_tag(k) for k, s in sources.items() if isinstance(v, s.settings)), data_tag("generator"))
    return next((data_tag(k) for k in sources if k in v), data_tag("file"))


def data_union(keys: tuple[str, ...]) -> Any:
    """The schema of a `data:` mapping: a union of the registered data sources' settings, told
    apart by the key each mapping holds (data.sources)."""
    sources = data_sources.kinds()
    members = tuple(Annotated[sources[k].settings, Tag(data_tag(k))] for k in keys)
    union: Any = Union[members]  # noqa: UP007 (a Union built at run time from the registered sources)
    return Annotated[union, Discriminator(_data_tag)]


class Hypothesis(Strict):
    """A hypothesis file.  `document_model()` is the class that validates files:
    this one with `claims` narrowed to the registered kinds."""

    harness: Literal[1]
    name: str = Field(min_length=1, max_length=NAME_MAX, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    model: str = Field(min_length=1)
    data: Any  # narrowed to the registered data sources by document_model (data_union)
    metric: str = "logprob"  # a registered metric (model.metrics; validated below)
    weight_processing: Processing = Processing.FOLDED
    seed: int = Field(0, ge=0)
    stats: Stats = Stats()
    claims: list[ClaimSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _claims_fit_settings(self) -> Hypothesis:
        for c in self.claims:
            problem = c.check_settings(self.stats) or c.check_data(self.data) or c.check_metric(self.metric)
            if problem:
                raise ValueError(problem)
        return self

    @field_validator("harness", mode="before")
    @classmethod
    def _version_is_int(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML `true` would otherwise pass as 1
            raise ValueError(f"Input should be 1 (the format version), got {v!r}")
        return v

    @field_validator("data", mode="before")
    @classmethod
    def _data_kind(cls, v: Any) -> Any:
        return check_data_kind(v)

    @field_validator("metric", mode="before")
    @classmethod
    def _registered_metric(cls, v: Any) -> Any:
        if not isinstance(v, str) or v not in metrics.names():
            close = difflib.get_close_matches(str(v), metrics.names(), n=1)
            raise ValueError(f"unknown metric {v!r}; allowed: {', '.join(metrics.names())}"
                             + (f" (did you mean {close[0]}?)" if close else ""))
        return v


def check_data_kind(v: Any) -> Any:
    """`v` when it is a data mapping with exactly one source key (data.sources); ValueError otherwise."""
    if isinstance(v, dict) and sum(k in v for k in data_sources.kinds()) != 1:
        raise ValueError(f"give exactly one of {data_sources.allowed()}")
    if v is not None and not isinstance(v, (dict, BaseModel)):
        raise ValueError(f"data is a mapping with one of {data_sources.allowed()}")
    return v


class DataDocumentBase(Strict):
    """A data file (`harness scan --data FILE.yaml`, `harness roles --data FILE.yaml`): the
    `data` mapping of a hypothesis file on its own (`data_document_model()` narrows `data` to
    the registered sources)."""

    data: Any

    @field_validator("data", mode="before")
    @classmethod
    def _data_kind(cls, v: Any) -> Any:
        return check_data_kind(v)


@lru_cache(maxsize=8)
def _data_document(keys: tuple[str, ...]) -> type[DataDocumentBase]:
    model: type[DataDocumentBase] = create_model("DataDocument", __base__=DataDocumentBase, __module__=__name__,
                                                 data=(data_union(keys), ...))
    return model


def data_document_model() -> type[DataDocumentBase]:
    """The model that validates data files with the data sources registered now."""
    return _data_document(tuple(data_sources.kinds()))


def _claim_tag(v: Any) -> str | None:
    if isinstance(v, ClaimSpec):
        return claim_tag(v.kind)
    kind = registry.for_mapping(v)
    return claim_tag(kind.name) if kind is not None else None


@lru_cache(maxsize=8)
def _build(kinds: tuple[ClaimKind[Any, Any], ...], sources: tuple[str, ...]) -> type[Hypothesis]:
    members = tuple(Annotated[k.spec, Tag(claim_tag(k.name))] for k in kinds)
    union: Any = Union[members]  # noqa: UP007 (a Union built at run time from the registered kinds)
    claim: Any = Annotated[union, Discriminator(_claim_tag, custom_error_type="claim_kind",
                                                custom_error_message="unknown claim kind")]
    model: type[Hypothesis] = create_model("Hypothesis", __base__=Hypothesis, __module__=__name__,
                                           claims=(list[claim], Field(min_length=1)),
                                           data=(data_union(sources), ...))
    return model


def document_model() -> type[Hypothesis]:
    """The model that validates hypothesis files with the kinds and data sources registered now."""
    return _build(tuple(registry.kinds().values()), tuple(data_sources.kinds()))


def tags() -> dict[str, type[BaseModel]]:
    """{union tag: model} of every claim kind and data source (for error messages)."""
    out: dict[str, type[BaseModel]] = {claim_tag(k.name): k.spec for k in registry.kinds().values()}
    return out | {data_tag(k): s.settings for k, s in data_sources.kinds().items()}
