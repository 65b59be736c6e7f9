"""The hypothesis file schema (pydantic models).  Defaults live here only;
docs/hypothesis-format.md documents every key.  Imports no torch."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, field_validator,
                      model_validator)

from . import names
from .errors import ComponentNameError

FORMAT_VERSION = 1
ATTENTION_ROLES = ("previous_token", "induction", "duplicate_token", "first_token")
ROLES = ATTENTION_ROLES + ("copying",)  # copying is read from the weights (OV circuit)
ABLATIONS = ("zero", "mean", "resample")
DIRECTIONS = ("noising", "denoising")
REPLACEMENTS = ("resample", "mean", "zero")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _name_check(parser, value: Any) -> Any:
    try:
        parser(value)
    except ComponentNameError as exc:
        raise ValueError(str(exc)) from None
    return value


class GeneratorData(_Strict):
    """Built-in generator: `[BOS] + S + S` with S uniformly random tokens.
    The corrupted prompt replaces the first S by fresh random tokens."""

    generator: Literal["repeated_tokens"]
    n_prompts: int = Field(200, ge=2, le=100_000)
    segment_length: int = Field(20, ge=2)
    bos: StrictBool = True
    bos_token: Optional[int] = Field(None, ge=0)
    seed: int = 0
    split: Literal["test", "explore"] = "test"
    vocab_min: int = Field(1, ge=0)
    vocab_max: Optional[int] = Field(None, ge=1)

    @model_validator(mode="after")
    def _range(self):
        if self.vocab_max is not None and self.vocab_max <= self.vocab_min:
            raise ValueError("vocab_max must be greater than vocab_min")
        return self


class FileData(_Strict):
    """A JSONL file of token-id prompts (see docs/hypothesis-format.md)."""

    file: str
    limit: Optional[int] = Field(None, ge=2)


class Stats(_Strict):
    bootstrap: int = Field(2000, ge=100, le=1_000_000)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    permutations: int = Field(10_000, ge=100, le=1_000_000)
    min_gap: float = Field(0.5, ge=0.0)
    min_prompt_gap: float = Field(0.1, ge=0.0)
    composition_alpha: float = Field(0.01, gt=0.0, lt=1.0)
    null_draws: int = Field(1000, ge=99, le=1_000_000)
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    min_effect: float = Field(0.1, gt=0.0)
    tolerance: float = Field(0.05, gt=0.0)

    @model_validator(mode="after")
    def _zones_apart(self):
        if self.tolerance >= self.min_effect:
            raise ValueError(f"tolerance {self.tolerance:g} must be below min_effect {self.min_effect:g}, "
                             "or 'used' and 'unused' overlap")
        return self


class _Threshold(_Strict):
    at_least: Optional[float] = None
    at_most: Optional[float] = None

    @model_validator(mode="after")
    def _one_bound(self):
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("give exactly one of at_least / at_most")
        return self


class RoleClaim(_Threshold):
    """A head's role score against a threshold: an attention-pattern score on
    the data, or (role `copying`) the OV circuit's eigenvalue positivity."""

    id: str = Field(min_length=1)
    kind: Literal["role"]
    head: str
    role: Literal[ROLES]  # type: ignore[valid-type]
    description: str = ""

    _head = field_validator("head")(lambda cls, v: _name_check(names.parse_head, v))

    @model_validator(mode="after")
    def _in_range(self):
        bound = self.at_least if self.at_least is not None else self.at_most
        if self.role == "copying":
            if not -1.0 <= bound <= 1.0:
                raise ValueError(f"a copying score lies in [-1, 1]; threshold {bound} is impossible")
        elif not 0.0 <= bound <= 1.0:
            raise ValueError(f"an attention score lies in [0, 1]; threshold {bound} is impossible")
        return self


def _composition_edge(v: str) -> str:
    edge = _name_check(names.parse_edge, v)
    e = names.parse_edge(edge)
    if not isinstance(e.sender, names.Head) or not isinstance(e.receiver, names.HeadInput):
        raise ValueError(f"a composition edge goes from a head to a later head's .q, .k or .v input, "
                         f"e.g. 'L0H3 -> L1H6.k'; got {v!r}")
    return v


class CompositionClaim(_Strict):
    """Weight evidence: the sender's OV composes with the receiver's q/k/v input
    beyond what a random relative orientation of the two heads gives."""

    id: str = Field(min_length=1)
    kind: Literal["composition"]
    edge: str
    expect: Literal["composes", "does_not_compose"] = "composes"
    description: str = ""

    _edge = field_validator("edge")(lambda cls, v: _composition_edge(v))


class AblationClaim(_Threshold):
    """Ablating a set of heads jointly changes the metric by at least/at most."""

    id: str = Field(min_length=1)
    kind: Literal["ablation"]
    heads: list[str] = Field(min_length=1)
    ablation: Literal[ABLATIONS] = "mean"  # type: ignore[valid-type]
    measure: Literal["normalized", "delta"] = "normalized"
    freeze_patterns: StrictBool = False
    sensitivity: StrictBool = False
    description: str = ""

    @field_validator("heads")
    @classmethod
    def _heads(cls, v: list[str]) -> list[str]:
        for h in v:
            _name_check(names.parse_head, h)
        if len(set(v)) != len(v):
            raise ValueError("a head is listed twice")
        return v


def _patchable_edge(v: str) -> str:
    _name_check(names.parse_edge, v)
    e = names.parse_edge(v)
    if not isinstance(e.sender, (names.Head, names.Embed)) or not isinstance(
            e.receiver, (names.HeadInput, names.Logits)):
        raise ValueError(f"an edge claim goes from a head or embed to a later head's .q/.k/.v or "
                         f"to logits, e.g. 'L0H3 -> L1H6.k'; got {v!r}")
    return v


class EdgeClaim(_Strict):
    """Causal evidence: patching the edge moves the metric (used) or not (unused)."""

    id: str = Field(min_length=1)
    kind: Literal["edge"]
    edge: str
    expect: Literal["used", "unused"] = "used"
    direction: Literal[DIRECTIONS] = "noising"  # type: ignore[valid-type]
    replacement: Literal[REPLACEMENTS] = "resample"  # type: ignore[valid-type]
    min_effect: Optional[float] = Field(None, gt=0.0)
    tolerance: Optional[float] = Field(None, gt=0.0)
    freeze_patterns: StrictBool = False
    sensitivity: StrictBool = False
    description: str = ""

    _edge = field_validator("edge")(lambda cls, v: _patchable_edge(v))

    @model_validator(mode="after")
    def _frozen_patterns_need_values(self):
        r = names.parse_edge(self.edge).receiver
        if self.freeze_patterns and isinstance(r, names.HeadInput) and r.which in "qk":
            raise ValueError(f"freeze_patterns holds every attention pattern fixed, so a .{r.which} edge "
                             "cannot act at all; use it with .v or logits edges")
        if (self.min_effect is not None and self.tolerance is not None
                and self.tolerance >= self.min_effect):
            raise ValueError(f"tolerance {self.tolerance:g} must be below min_effect {self.min_effect:g}, "
                             "or 'used' and 'unused' overlap")
        return self

    @model_validator(mode="after")
    def _denoising_resamples(self):
        if self.direction == "denoising" and (self.replacement != "resample" or self.sensitivity):
            raise ValueError("denoising patches the clean run's output into the corrupted run: "
                             "replacement must be resample (and sensitivity, which varies it, is off)")
        return self


class CircuitClaim(_Threshold):
    """Keeping only these heads (ablating every other head) recovers at least a
    fraction of the clean behaviour, and more than random circuits of equal size."""

    id: str = Field(min_length=1)
    kind: Literal["circuit"]
    heads: list[str] = Field(min_length=1)
    ablation: Literal[ABLATIONS] = "resample"  # type: ignore[valid-type]
    random_circuits: int = Field(100, ge=20, le=100_000)
    beat_rate: float = Field(0.5, ge=0.0, lt=1.0)
    description: str = ""

    @field_validator("heads")
    @classmethod
    def _heads(cls, v: list[str]) -> list[str]:
        return AblationClaim._heads(v)


CLAIM_KINDS = {"role": RoleClaim, "ablation": AblationClaim, "composition": CompositionClaim,
               "edge": EdgeClaim, "circuit": CircuitClaim}
DATA_KINDS = {"generator": GeneratorData, "file": FileData}
# Union tags appear in pydantic error locations; they are spelled so that they
# never collide with a key of the file (see _problems).
_TAGS = {f"kind={k}": v for k, v in CLAIM_KINDS.items()} | {f"data={k}": v for k, v in DATA_KINDS.items()}


def _claim_tag(v: Any) -> Optional[str]:
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return f"kind={kind}" if kind in CLAIM_KINDS else None


def _data_tag(v: Any) -> Optional[str]:
    if not isinstance(v, dict):
        return "data=file" if isinstance(v, FileData) else "data=generator"
    return "data=generator" if "generator" in v else "data=file"


Claim = Annotated[
    Union[tuple(Annotated[cls, Tag(f"kind={k}")] for k, cls in CLAIM_KINDS.items())],  # type: ignore[misc]
    Discriminator(_claim_tag, custom_error_type="claim_kind",
                  custom_error_message="unknown claim kind"),
]
Data = Annotated[
    Union[Annotated[GeneratorData, Tag("data=generator")], Annotated[FileData, Tag("data=file")]],
    Discriminator(_data_tag),
]


class Hypothesis(_Strict):
    harness: Literal[1]
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    model: str = Field(min_length=1)
    data: Data
    metric: Literal["logprob", "logit_diff"] = "logprob"
    weight_processing: Literal["folded", "raw"] = "folded"
    seed: int = 0
    stats: Stats = Stats()
    claims: list[Claim] = Field(min_length=1)

    @model_validator(mode="after")
    def _edge_zones_apart(self):
        for c in self.claims:
            if isinstance(c, EdgeClaim):
                lo = c.tolerance if c.tolerance is not None else self.stats.tolerance
                hi = c.min_effect if c.min_effect is not None else self.stats.min_effect
                if lo >= hi:
                    raise ValueError(f"claim {c.id!r}: tolerance {lo:g} must be below min_effect {hi:g} "
                                     "(claim or stats values), or 'used' and 'unused' overlap")
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
        if isinstance(v, dict) and ("generator" in v) == ("file" in v):
            raise ValueError("give exactly one of 'generator' (built-in) or 'file' (JSONL)")
        if v is not None and not isinstance(v, (dict, BaseModel)):
            raise ValueError("data is a mapping with 'generator: repeated_tokens' or 'file: PATH'")
        return v



