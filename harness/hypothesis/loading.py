"""Loading hypothesis files: YAML with line numbers, validated against the
document model (hypothesis.document).

Validation needs only PyYAML and pydantic (no torch), so `harness validate`
stays fast.  Every problem is reported as `file:line: field: message`; all
problems of a file are collected before raising one `SpecError`.  A hypothesis
given as a dict has no lines: its problems name the field, and a claim's field
names the claim by its id (`claims[2] (id: prev-token): head: message`).  An
unknown key, claim kind or value gets the nearest allowed one (`did you mean
at_least?`), and YAML syntax errors a wrong indentation causes get a hint.

With `check_model=True` (`harness validate`, `harness run`), when the file's
model is a local directory whose config.json gives its layers and heads
(model.shape), component names are checked against them here, before any model
loads, and only names inside the model are suggested (a hub name's config.json is
read from the local Hugging Face cache, model.hub_cache); otherwise (a hub model not
in the cache, no readable config.json) names are checked against the loaded model later, with
`LoadedHypothesis.where` giving the same `file:line: field` prefix.

The full format is documented in docs/hypothesis-format.md; the pydantic
models are its source of truth (defaults live there only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .. import locations
from ..errors import SpecError
from ..model.ref import ModelRef
from ..spec.fields import SHAPE
from ..spec.names import Shape
from ..textfile import utf8
from .document import Hypothesis, data_document_model, document_model
from .problems import KeyPath, Source, claim_field, claim_ids, field_name, problems, record_lines, yaml_problem
from .references import EdgeReference, ReferenceError, expand


@dataclass(frozen=True)
class LoadedHypothesis:
    """A validated hypothesis with where it came from."""

    spec: Hypothesis
    path: str | None  # None when given as a dict
    base_dir: str  # relative paths in the file resolve against this
    sha256: str
    lines: dict[str, int] = field(default_factory=dict)  # "claims[0].head" -> line, as printed in errors
    references: tuple[EdgeReference, ...] = ()  # the edge files circuit claims name (`edges_from`)

    @property
    def name(self) -> str:
        return self.spec.name

    def where(self, key: str) -> str:
        """`file:line: key` for an error found after validation (e.g. against the model);
        for a dict, the key with the claim's id (`claims[1] (id: b): heads`)."""
        if self.path is None:
            return claim_field(key, [c.id for c in self.spec.claims])
        return f"{self.path}:{line_of(self.lines, key)}: {key}"

    def where_claim(self, i: int, key: str) -> str:
        """The prefix of a problem with field `key` of claim `i` (the message follows after a
        space), naming the claim: `file:line: claims[i].key: (ID)`, or for a dict
        `claims[i] (id: ID): key:`."""
        where = self.where(f"claims[{i}].{key}")
        return f"{where}:" if self.path is None else f"{where}: ({self.spec.claims[i].id})"

    def resolve(self, rel: str) -> Path:
        return locations.resolve(rel, self.base_dir)


def line_of(lines: dict[str, int], key: str) -> int:
    """The line of field `key`, or of the nearest enclosing field that has one (1 if none)."""
    probe = key
    while probe and probe not in lines:
        probe = probe.rsplit(".", 1)[0] if "." in probe else probe.rsplit("[", 1)[0] if "[" in probe else ""
    return lines.get(probe, 1)


@dataclass(frozen=True)
class LoadedData:
    """A validated data file (load_data_file): its `data` mapping, with where it came from."""

    data: Any  # GeneratorData | FileData | TemplateData | PromptsData
    path: str
    base_dir: str  # relative paths in the mapping resolve against this
    lines: dict[str, int] = field(default_factory=dict)
    model: str | None = None  # its top-level `model`, where it names one
    metric: str | None = None  # its top-level `metric`, where it names one
    claims: bool = False  # whether it has `claims` (a hypothesis file serving as a data file)

    def where(self, key: str) -> str:
        """`file:line: key` for a problem found after validation (e.g. while tokenising)."""
        return f"{self.path}:{line_of(self.lines, key)}: {key}"

    def resolve(self, rel: str) -> Path:
        return locations.resolve(rel, self.base_dir)


MAX_FILE_BYTES = 1 << 20  # 1 MiB: thousands of claims; larger files are refused before parsing
MAX_DEPTH = 32  # nesting of mappings and lists (a hypothesis file needs 5)
# ---------------------------------------------------------------- entry points
def _check_structure(text: str, source: Source) -> None:
    """Refuse YAML aliases (`*name`: each expands to a copy of the anchored node, so a
    few hundred bytes can stand for billions of nodes) and nesting deeper than
    MAX_DEPTH, reading the event stream only (nothing is built)."""
    def line(event: yaml.Event) -> int:
        return event.start_mark.line + 1 if event.start_mark is not None else 1

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise SpecError([f"{source.at(line(event), '(yaml)')}: aliases (*{event.anchor}) are not supported in "
                             "hypothesis files; write the value out"])
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError([f"{source.at(line(event), '(yaml)')}: nested deeper than "
                                 f"{MAX_DEPTH} levels; a hypothesis file needs a handful"])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def parse_text(text: str, where: str | None, base_dir: Path | None = None,
               check_model: bool = False) -> tuple[Hypothesis, str, dict[str, int], tuple[EdgeReference, ...]]:
    """Validate YAML text; return (spec, sha256 of the text, {field: line}, the edge files its
    circuit claims name).  `where` is the file problems are reported in (`file:line: field:
    message`), None for a dict's dump (`field: message`, naming claims by id).  With
    `check_model`, names are checked against the model directory's config.json (model_shape_of;
    `base_dir` resolves a relative `model` and every `edges_from`)."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    source = Source(where)
    if len(text.encode()) > MAX_FILE_BYTES:
        raise SpecError([f"{source.at(1, '(file)')}: {len(text.encode()):,} bytes; hypothesis files are limited to "
                         f"{MAX_FILE_BYTES:,} bytes (split the claims over several files)"])
    node, raw = _parse_yaml(text, source)
    if not isinstance(raw, dict) or node is None:
        raise SpecError([f"{source.at(1, '(top level)')}: a hypothesis file is a YAML mapping with keys "
                         "harness, name, model, data, claims"])
    if where is None:
        source = Source(None, claim_ids(raw))
    lines: dict[KeyPath, int] = {}
    dups: list[tuple[int, KeyPath]] = []
    record_lines(node, (), lines, dups)
    if dups:
        raise SpecError([f"{source.at(ln, field_name(p))}: duplicate key" for ln, p in dups])
    shape = model_shape_of(raw.get("model"), base_dir) if check_model else None
    refs = _read_references(raw, lines, source, base_dir or Path("."), shape)
    spec = _validate(raw, lines, source, shape)
    seen: set[str] = set()
    for i, c in enumerate(spec.claims):
        if c.id in seen:
            line = lines.get(("claims", i, "id"), 1)
            raise SpecError([f"{source.at(line, f'claims[{i}].id')}: claim id {c.id!r} is used twice"])
        seen.add(c.id)
    known = spec.data.corruption_names()  # None for a file: checked when it is read
    bad = [(i, name) for i, c in enumerate(spec.claims) for name in c.corruptions_used()
           if known is not None and name not in known]
    if bad:
        raise SpecError([f"{source.at(lines.get(('claims', i, 'corruption'), 1), f'claims[{i}].corruption')}: "
                         f"{name!r} is not one of the data's corruptions: {', '.join(known or [])} "
                         "(add it to data.corruptions)" for i, name in bad])
    return spec, digest, {field_name(k): v for k, v in lines.items()}, refs


def _read_references(raw: dict[str, Any], lines: dict[KeyPath, int], source: Source, base_dir: Path,
                     shape: Shape | None) -> tuple[EdgeReference, ...]:
    """Each circuit claim's `edges_from` file read into its `edges` (hypothesis.references), in
    place in `raw`; a problem is one SpecError line at the claim's `edges_from`."""
    claims = raw.get("claims")
    if not isinstance(claims, list):
        return ()
    out = []
    for i, c in enumerate(claims):
        if not (isinstance(c, dict) and c.get("kind") == "circuit" and "edges_from" in c):
            continue
        key = ("claims", i, "edges_from")
        try:
            claims[i], ref = expand(c, base_dir, shape)
        except ReferenceError as exc:
            named = "" if source.file is None else f" ({c.get('id')})"
            raise SpecError([f"{source.at(lines.get(key, 1), field_name(key))}:{named} {exc}"]) from None
        lines[("claims", i, "edges")] = lines.get(key, 1)
        out.append(ref)
    return tuple(out)


def _parse_yaml(text: str, source: Source) -> tuple[yaml.Node | None, Any]:
    """(the node tree, the value) of YAML text; SpecError for aliases, deep nesting and syntax errors."""
    try:
        _check_structure(text, source)
        return yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise SpecError([f"{source.at(line, '(yaml)')}: {problem}"]) from None


def load_data_file(path: Path) -> LoadedData:
    """A data file: a YAML mapping whose `data` key holds a data mapping exactly as in a
    hypothesis file (generator, file, template or prompts), validated the same way, with
    `file:line: field` in every problem (SpecError).  Of the other top-level keys `model` and
    `metric` are kept (strings) and whether there are `claims`; the rest is not read, so a
    hypothesis file serves as its own data file.  Relative paths in the mapping
    resolve against the file's folder."""
    if not path.is_file():
        raise SpecError([f"{path}: no such data file"])
    source = Source(str(path))
    node, raw = _parse_yaml(read_text(path), source)
    if not isinstance(raw, dict) or node is None or "data" not in raw:
        raise SpecError([f"{source.at(1, '(top level)')}: a data file is a YAML mapping with a 'data' key holding a "
                         "data mapping as in a hypothesis file (data: {template: ..., ...})"])
    lines: dict[KeyPath, int] = {}
    dups: list[tuple[int, KeyPath]] = []
    record_lines(node, (), lines, dups)
    if dups:
        raise SpecError([f"{source.at(ln, field_name(p))}: duplicate key" for ln, p in dups])
    try:
        doc = data_document_model().model_validate({"data": raw["data"]})
    except ValidationError as exc:
        raise SpecError(problems(exc, lines, source)) from None
    bad = [key for key in ("model", "metric") if key in raw and not (isinstance(raw[key], str) and raw[key].strip())]
    if bad:
        raise SpecError([f"{source.at(lines.get((key,), 1), key)}: a name or path (a non-empty string)" for key in bad])
    return LoadedData(doc.data, str(path), str(path.resolve().parent), {field_name(k): v for k, v in lines.items()},
                      model=raw.get("model"), metric=raw.get("metric"), claims="claims" in raw)


def model_shape_of(model: Any, base_dir: Path | None) -> Shape | None:
    """The shape of a hypothesis's `model` when it is a local directory with a readable
    config.json (model.shape.config_shape), or a hub name (`ORG/NAME` that is not a
    directory, `hf:ORG/NAME`) whose snapshot in the local Hugging Face cache has one
    (model.hub_cache, no network); None for anything else."""
    if not isinstance(model, str) or not model:
        return None
    return ModelRef.parse(model, base_dir or Path(".")).shape()


def _validate(raw: dict[str, Any], lines: dict[KeyPath, int], source: Source, shape: Shape | None) -> Hypothesis:
    try:
        return document_model().model_validate(raw, context={SHAPE: shape} if shape is not None else None)
    except ValidationError as exc:
        raise SpecError(problems(exc, lines, source)) from None


def load_all(files: list[Path], check_model: bool = False) -> list[LoadedHypothesis]:
    """Load several files, reporting every problem of every file at once (one SpecError);
    `check_model` as in load."""
    loaded, problems = [], []
    for f in files:
        try:
            loaded.append(load(f, check_model=check_model))
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
    problem = locations.file_problem(path)
    if problem is not None:
        raise SpecError([f"{path}: cannot read the hypothesis file: {problem}"])
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError([f"{path}:1: (file): {size:,} bytes; hypothesis files are limited to "
                             f"{MAX_FILE_BYTES:,} bytes (split the claims over several files)"])
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    return utf8(raw, path, lambda message: SpecError([message]), "(file): ")


def load(source: str | Path | dict[str, Any], base_dir: str | Path | None = None,
         check_model: bool = False) -> LoadedHypothesis:
    """Load and validate a hypothesis from a file path or a dict.

    Relative paths inside the hypothesis resolve against the file's folder
    (for a dict: `base_dir`, default the current directory).  `check_model`: check the
    component names against the model's config.json too, when it is a local directory
    that has one (parse_text)."""
    if isinstance(source, dict):
        folder = Path(base_dir or ".").resolve()
        try:
            text = yaml.dump(source, Dumper=_NoAliasDumper, sort_keys=False)  # a shared object is written out
        except yaml.YAMLError as exc:
            raise SpecError([f"(top level): the hypothesis holds a value that is not plain data "
                             f"(strings, numbers, booleans, lists, mappings): {exc}"]) from None
        spec, digest, lines, refs = parse_text(text, None, folder, check_model)
        return LoadedHypothesis(spec=spec, path=None, base_dir=str(folder), sha256=digest, lines=lines,
                                references=refs)
    path = Path(source)
    spec, digest, lines, refs = parse_text(read_text(path), str(path), path.resolve().parent, check_model)
    return LoadedHypothesis(spec=spec, path=str(path), base_dir=str(path.resolve().parent),
                            sha256=digest, lines=lines, references=refs)
