"""Hypothesis files: YAML format, schema and validation.

Validation needs only PyYAML and pydantic (no torch), so `harness validate`
stays fast.  Every problem is reported as `file:line: field: message`; all
problems of a file are collected before raising one `SpecError`.

The full format is documented in docs/hypothesis-format.md; the pydantic
models below are its source of truth (defaults live here only).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      field_validator, model_validator)

from . import names
from .errors import ComponentNameError, SpecError

FORMAT_VERSION = 1
ATTENTION_ROLES = ("previous_token", "induction", "duplicate_token", "first_token")
ROLES = ATTENTION_ROLES + ("copying",)  # copying is read from the weights (OV circuit)
ABLATIONS = ("zero", "mean", "resample")


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
    bos: bool = True
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
    description: str = ""

    @field_validator("heads")
    @classmethod
    def _heads(cls, v: list[str]) -> list[str]:
        for h in v:
            _name_check(names.parse_head, h)
        if len(set(v)) != len(v):
            raise ValueError("a head is listed twice")
        return v


CLAIM_KINDS = {"role": RoleClaim, "ablation": AblationClaim, "composition": CompositionClaim}
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



class LoadedHypothesis(BaseModel):
    """A validated hypothesis with where it came from."""

    model_config = ConfigDict(frozen=True)
    spec: Hypothesis
    path: Optional[str]  # None when given as a dict
    base_dir: str  # relative paths in the file resolve against this
    sha256: str
    lines: dict[str, int] = {}  # field path as printed in errors ("claims[0].head") -> line

    def where(self, field: str) -> str:
        """`file:line: field` for an error found after validation (e.g. against the model)."""
        path = self.path or "<dict>"
        probe = field
        while probe and probe not in self.lines:
            probe = probe.rsplit(".", 1)[0] if "." in probe else probe.rsplit("[", 1)[0] if "[" in probe else ""
        return f"{path}:{self.lines.get(probe, 1)}: {field}"

    def resolve(self, rel: str) -> Path:
        p = Path(rel).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p)


# ---------------------------------------------------------------- line tracking
def _lines(node: yaml.Node, path: tuple, out: dict, dups: list) -> None:
    """Record the 1-based line of every key/item path; collect duplicate keys."""
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            key = k.value
            if key in seen:
                dups.append((k.start_mark.line + 1, path + (key,)))
            seen.add(key)
            out[path + (key,)] = k.start_mark.line + 1
            _lines(v, path + (key,), out, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[path + (i,)] = item.start_mark.line + 1
            _lines(item, path + (i,), out, dups)


def _field(path: tuple) -> str:
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s or "(top level)"


def _clean_msg(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def _problems(exc: ValidationError, lines: dict, where: str) -> list[str]:
    out = []
    for err in exc.errors():
        loc = err["loc"]
        path: tuple = ()
        for part in loc:
            if path + (part,) in lines:
                path = path + (part,)
        line = lines.get(path, 1)
        msg = _clean_msg(err["msg"])
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "unknown key; allowed keys: " + ", ".join(_model_at(loc[:-1]).model_fields)
        elif kind == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        elif kind == "claim_kind":
            got = err["input"].get("kind") if isinstance(err["input"], dict) else err["input"]
            msg = f"unknown claim kind {got!r}; allowed: {', '.join(CLAIM_KINDS)}"
            if isinstance(err["input"], dict) and "kind" in err["input"]:
                path, line = path + ("kind",), lines.get(path + ("kind",), line)
        elif kind == "missing":
            msg = "required field is missing"
            path = tuple(p for p in loc if p not in _TAGS)
        out.append((line, f"{where}:{line}: {_field(path)}: {msg}"))
    return [text for _, text in sorted(set(out))]


def _model_at(loc: tuple) -> type[BaseModel]:
    """The pydantic model that validates the mapping at `loc`."""
    model: type[BaseModel] = Hypothesis
    for part in loc:
        if part in _TAGS:
            model = _TAGS[part]
        elif isinstance(part, str) and part in model.model_fields:
            ann = model.model_fields[part].annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = ann
    return model


# ---------------------------------------------------------------- entry points
def parse_text(text: str, where: str) -> tuple[Hypothesis, str, dict[str, int]]:
    """Validate YAML text; return (spec, sha256 of the text, {field: line})."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise SpecError([f"{where}:{line}: (yaml): {getattr(exc, 'problem', None) or exc}"]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"{where}:1: (top level): a hypothesis file is a YAML mapping with keys "
                         "harness, name, model, data, claims"])
    lines: dict = {}
    dups: list = []
    _lines(node, (), lines, dups)
    if dups:
        raise SpecError([f"{where}:{ln}: {_field(p)}: duplicate key" for ln, p in dups])
    spec = _validate(raw, lines, where)
    seen: set[str] = set()
    for i, c in enumerate(spec.claims):
        if c.id in seen:
            line = lines.get(("claims", i, "id"), 1)
            raise SpecError([f"{where}:{line}: claims[{i}].id: claim id {c.id!r} is used twice"])
        seen.add(c.id)
    return spec, digest, {_field(k): v for k, v in lines.items()}


def _validate(raw: dict, lines: dict, where: str) -> Hypothesis:
    try:
        return Hypothesis.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_problems(exc, lines, where)) from None


def load(source: Union[str, Path, dict], base_dir: Union[str, Path, None] = None) -> LoadedHypothesis:
    """Load and validate a hypothesis from a file path or a dict.

    Relative paths inside the hypothesis resolve against the file's folder
    (for a dict: `base_dir`, default the current directory)."""
    if isinstance(source, dict):
        text = yaml.safe_dump(source, sort_keys=False)
        spec, digest, lines = parse_text(text, "<dict>")
        return LoadedHypothesis(spec=spec, path=None, base_dir=str(Path(base_dir or ".").resolve()),
                                sha256=digest, lines=lines)
    path = Path(source)
    if not path.is_file():
        raise SpecError([f"{path}: no such hypothesis file"])
    spec, digest, lines = parse_text(path.read_text(), str(path))
    return LoadedHypothesis(spec=spec, path=str(path), base_dir=str(path.resolve().parent),
                            sha256=digest, lines=lines)
