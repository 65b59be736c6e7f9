"""Hypothesis files: YAML format, schema and validation.

Validation needs only PyYAML and pydantic (no torch), so `harness validate`
stays fast.  Every problem is reported as `file:line: field: message`; all
problems of a file are collected before raising one `SpecError`.

The full format is documented in docs/hypothesis-format.md; the pydantic
models in `schema.py` are its source of truth (defaults live there only).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import SpecError
from .schema import (  # noqa: F401  (re-exported: the schema is part of the spec API)
    ABLATIONS, ATTENTION_ROLES, CLAIM_KINDS, DATA_KINDS, ROLES, AblationClaim, CompositionClaim,
    DIRECTIONS, REPLACEMENTS, CircuitClaim, EdgeClaim, FileData, GeneratorData, Hypothesis,
    RoleClaim, Stats, _TAGS,
)


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
