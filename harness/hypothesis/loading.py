"""Loading hypothesis files: YAML with line numbers, validated against the
document model (hypothesis.document).

Validation needs only PyYAML and pydantic (no torch), so `harness validate`
stays fast.  Every problem is reported as `file:line: field: message`; all
problems of a file are collected before raising one `SpecError`.  Names are
checked against a loaded model later, with `LoadedHypothesis.where` giving the
same `file:line: field` prefix.

The full format is documented in docs/hypothesis-format.md; the pydantic
models are its source of truth (defaults live there only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..claims import registry
from ..errors import SpecError
from ..spec.fields import BoundedClaim, ClaimSpec
from ..textfile import utf8
from .document import Hypothesis, document_model, tags


@dataclass(frozen=True)
class LoadedHypothesis:
    """A validated hypothesis with where it came from."""

    spec: Hypothesis
    path: str | None  # None when given as a dict
    base_dir: str  # relative paths in the file resolve against this
    sha256: str
    lines: dict[str, int] = field(default_factory=dict)  # "claims[0].head" -> line, as printed in errors

    @property
    def name(self) -> str:
        return self.spec.name

    def where(self, key: str) -> str:
        """`file:line: key` for an error found after validation (e.g. against the model)."""
        path = self.path or "<dict>"
        probe = key
        while probe and probe not in self.lines:
            probe = probe.rsplit(".", 1)[0] if "." in probe else probe.rsplit("[", 1)[0] if "[" in probe else ""
        return f"{path}:{self.lines.get(probe, 1)}: {key}"

    def resolve(self, rel: str) -> Path:
        p = Path(rel).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p)


MAX_FILE_BYTES = 1 << 20  # 1 MiB: thousands of claims; larger files are refused before parsing
MAX_DEPTH = 32  # nesting of mappings and lists (a hypothesis file needs 5)
PATTERN_TEXT = {
    "id": "a claim id is letters, digits and _ . - + = , @ >, starting with a letter or digit, "
          "no spaces (ids name pytest items: file.yaml::ID)",
    "name": "a name is letters, digits, '_', '.' and '-' (it names the report folder)",
}


# ---------------------------------------------------------------- line tracking
KeyPath = tuple[str | int, ...]


def _lines(node: yaml.Node, path: KeyPath, out: dict[KeyPath, int], dups: list[tuple[int, KeyPath]]) -> None:
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


def _field(path: KeyPath) -> str:
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s or "(top level)"


def _clean_msg(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def _problems(exc: ValidationError, lines: dict[KeyPath, int], where: str) -> list[str]:
    all_tags = tags()
    out = []
    for err in exc.errors():
        loc = err["loc"]
        path: KeyPath = ()
        for part in loc:
            if path + (part,) in lines:
                path = path + (part,)
        line = lines.get(path, 1)
        msg = _clean_msg(err["msg"])
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "unknown key; allowed keys: " + ", ".join(allowed_keys(_model_at(loc[:-1], all_tags)))
        elif kind == "string_pattern_mismatch":
            msg = f"{PATTERN_TEXT.get(str(loc[-1]), msg)} (got {err.get('input')!r})"
        elif kind == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        elif kind == "claim_kind":
            got = err["input"].get("kind") if isinstance(err["input"], dict) else err["input"]
            msg = f"unknown claim kind {got!r}; allowed: {', '.join(registry.names())}"
            if isinstance(err["input"], dict) and "kind" in err["input"]:
                path, line = path + ("kind",), lines.get(path + ("kind",), line)
        elif kind == "missing":
            msg = "required field is missing"
            path = tuple(p for p in loc if p not in all_tags)
        out.append((line, f"{where}:{line}: {_field(path)}: {msg}"))
    return [text for _, text in sorted(set(out))]


def allowed_keys(model: type[BaseModel]) -> list[str]:
    """The keys of a mapping in the order users read them: for claims id and kind
    first, the kind's own keys, the bound, description last."""
    fields = list(model.model_fields)
    if not issubclass(model, ClaimSpec):
        return fields
    common = set(BoundedClaim.model_fields)  # id, kind, description and the bound
    own = [f for f in fields if f not in common]
    bounds = [f for f in ("at_least", "at_most") if f in fields]
    return ["id", "kind"] + own + bounds + ["description"]


def _model_at(loc: tuple[str | int, ...], all_tags: dict[str, type[BaseModel]]) -> type[BaseModel]:
    """The pydantic model that validates the mapping at `loc`."""
    model: type[BaseModel] = Hypothesis
    for part in loc:
        if isinstance(part, str) and part in all_tags:
            model = all_tags[part]
        elif isinstance(part, str) and part in model.model_fields:
            ann = model.model_fields[part].annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = ann
    return model


# ---------------------------------------------------------------- entry points
def _check_structure(text: str, where: str) -> None:
    """Refuse YAML aliases (`*name`: each expands to a copy of the anchored node, so a
    few hundred bytes can stand for billions of nodes) and nesting deeper than
    MAX_DEPTH, reading the event stream only (nothing is built)."""
    def line(event: yaml.Event) -> int:
        return event.start_mark.line + 1 if event.start_mark is not None else 1

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise SpecError([f"{where}:{line(event)}: (yaml): aliases (*{event.anchor}) are not supported in "
                             "hypothesis files; write the value out"])
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError([f"{where}:{line(event)}: (yaml): nested deeper than "
                                 f"{MAX_DEPTH} levels; a hypothesis file needs a handful"])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def parse_text(text: str, where: str) -> tuple[Hypothesis, str, dict[str, int]]:
    """Validate YAML text; return (spec, sha256 of the text, {field: line})."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    if len(text.encode()) > MAX_FILE_BYTES:
        raise SpecError([f"{where}:1: (file): {len(text.encode()):,} bytes; hypothesis files are limited to "
                         f"{MAX_FILE_BYTES:,} bytes (split the claims over several files)"])
    try:
        _check_structure(text, where)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise SpecError([f"{where}:{line}: (yaml): {getattr(exc, 'problem', None) or exc}"]) from None
    if not isinstance(raw, dict) or node is None:
        raise SpecError([f"{where}:1: (top level): a hypothesis file is a YAML mapping with keys "
                         "harness, name, model, data, claims"])
    lines: dict[KeyPath, int] = {}
    dups: list[tuple[int, KeyPath]] = []
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
    known = spec.data.corruption_names()  # None for a file: checked when it is read
    bad = [(i, name) for i, c in enumerate(spec.claims) for name in c.corruptions_used()
           if known is not None and name not in known]
    if bad:
        raise SpecError([f"{where}:{lines.get(('claims', i, 'corruption'), 1)}: claims[{i}].corruption: "
                         f"{name!r} is not one of the data's corruptions: {', '.join(known or [])} "
                         "(add it to data.corruptions)" for i, name in bad])
    return spec, digest, {_field(k): v for k, v in lines.items()}


def _validate(raw: dict[str, Any], lines: dict[KeyPath, int], where: str) -> Hypothesis:
    try:
        return document_model().model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_problems(exc, lines, where)) from None


def load_all(files: list[Path]) -> list[LoadedHypothesis]:
    """Load several files, reporting every problem of every file at once (one SpecError)."""
    loaded, problems = [], []
    for f in files:
        try:
            loaded.append(load(f))
        except SpecError as exc:
            problems += exc.problems
    if problems:
        raise SpecError(problems)
    return loaded


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a value shared by two places in a dict twice, instead of as an alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def read_text(path: Path) -> str:
    """The UTF-8 text of a hypothesis file (SpecError: missing, unreadable, too large,
    not UTF-8 — with the line of the first bad byte)."""
    if not path.is_file():
        raise SpecError([f"{path}: no such hypothesis file"])
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError([f"{path}:1: (file): {size:,} bytes; hypothesis files are limited to "
                             f"{MAX_FILE_BYTES:,} bytes (split the claims over several files)"])
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    return utf8(raw, path, lambda message: SpecError([message]), "(file): ")


def load(source: str | Path | dict[str, Any], base_dir: str | Path | None = None) -> LoadedHypothesis:
    """Load and validate a hypothesis from a file path or a dict.

    Relative paths inside the hypothesis resolve against the file's folder
    (for a dict: `base_dir`, default the current directory)."""
    if isinstance(source, dict):
        text = yaml.dump(source, Dumper=_NoAliasDumper, sort_keys=False)  # a shared object is written out
        spec, digest, lines = parse_text(text, "<dict>")
        return LoadedHypothesis(spec=spec, path=None, base_dir=str(Path(base_dir or ".").resolve()),
                                sha256=digest, lines=lines)
    path = Path(source)
    spec, digest, lines = parse_text(read_text(path), str(path))
    return LoadedHypothesis(spec=spec, path=str(path), base_dir=str(path.resolve().parent),
                            sha256=digest, lines=lines)
