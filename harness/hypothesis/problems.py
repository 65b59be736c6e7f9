"""The problems of a hypothesis or data file, as `file:line: field: message` lines.

`record_lines` maps every key and list item of the YAML document to its line (and finds
duplicate keys); `problems` turns pydantic's validation errors into one line each, with the
allowed keys, the nearest allowed word (`did_you_mean`) and the claim's id for a document
given as a dict (`Source`, `claim_field`); `yaml_problem` adds a plain hint to the YAML syntax
errors a wrong indentation or a tab causes.
Imports: claims.registry (the kinds' names), spec.fields, hypothesis.document.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..claims import registry
from ..spec.fields import BoundedClaim, ClaimSpec
from .document import Hypothesis, tags

PATTERN_TEXT = {
    "id": "a claim id is letters, digits and _ . - + = , @ >, starting with a letter or digit, "
          "no spaces (ids name pytest items: file.yaml::ID)",
    "name": "a name is letters, digits, '_', '.' and '-' (it names the report folder)",
}


_CLAIM_FIELD = re.compile(r"^claims\[(\d+)\]\.?(.*)$")


def claim_field(key: str, ids: list[Any]) -> str:
    """A field of a dict-given hypothesis as its problems name it: a claim's field with
    the claim's id (`claims[2].head` -> `claims[2] (id: prev-token): head`), other fields
    as they are."""
    m = _CLAIM_FIELD.match(key)
    if m is None:
        return key
    i, rest = int(m[1]), m[2]
    claim_id = ids[i] if i < len(ids) else None
    named = f"claims[{i}] (id: {claim_id})" if isinstance(claim_id, str) and claim_id else f"claims[{i}]"
    return f"{named}: {rest}" if rest else named


@dataclass(frozen=True)
class Source:
    """Where a problem is: `file:line: field` in a file; in a dict (file None), the field,
    with the claim's id for a claim's field (claim_field)."""

    file: str | None
    ids: list[Any] = field(default_factory=list)  # claim ids by index, for a dict

    def at(self, line: int, key: str) -> str:
        """The problem's prefix for field `key` found on `line`."""
        return f"{self.file}:{line}: {key}" if self.file is not None else claim_field(key, self.ids)


def claim_ids(raw: Any) -> list[Any]:
    """The `id` of each item of a raw document's `claims` (None where there is none)."""
    claims = raw.get("claims") if isinstance(raw, dict) else None
    return [c.get("id") if isinstance(c, dict) else None for c in claims] if isinstance(claims, list) else []


def did_you_mean(got: Any, allowed: list[str]) -> str:
    """` (did you mean X?)` for the allowed word closest to `got` (difflib, case
    ignored), or "" when none is close."""
    if not isinstance(got, str) or not allowed:
        return ""
    lower = {a.lower(): a for a in allowed}
    close = difflib.get_close_matches(got.lower(), list(lower), n=1, cutoff=0.6)
    return f" (did you mean {lower[close[0]]}?)" if close and lower[close[0]] != got else ""


# ---------------------------------------------------------------- line tracking
KeyPath = tuple[str | int, ...]


def record_lines(node: yaml.Node, path: KeyPath, out: dict[KeyPath, int], dups: list[tuple[int, KeyPath]]) -> None:
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
            record_lines(v, path + (key,), out, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[path + (i,)] = item.start_mark.line + 1
            record_lines(item, path + (i,), out, dups)


def field_name(path: KeyPath) -> str:
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s or "(top level)"


def _clean_msg(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def problems(exc: ValidationError, lines: dict[KeyPath, int], source: Source) -> list[str]:
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
            allowed = allowed_keys(model_at(loc[:-1], all_tags))
            msg = "unknown key; allowed keys: " + ", ".join(allowed) + did_you_mean(loc[-1], allowed)
            if loc[-1] in ("at_least", "at_most") and "min_effect" in allowed:
                msg += ("; an edge or path claim is decided by its use: expect: used with min_effect (the effect "
                        "must be above it), or expect: unused with tolerance (within ±tolerance)")
        elif kind == "string_pattern_mismatch":
            msg = f"{PATTERN_TEXT.get(str(loc[-1]), msg)} (got {err.get('input')!r})"
        elif kind in ("literal_error", "enum"):  # a word of the vocabulary (spec.vocabulary)
            expected = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
            msg = f"{msg} (got {err.get('input')!r})" + did_you_mean(err.get("input"), expected)
        elif kind == "claim_kind":
            got = err["input"].get("kind") if isinstance(err["input"], dict) else err["input"]
            msg = f"unknown claim kind {got!r}; allowed: {', '.join(registry.names())}"
            msg += did_you_mean(got, registry.names())
            if isinstance(err["input"], dict) and "kind" in err["input"]:
                path, line = path + ("kind",), lines.get(path + ("kind",), line)
        elif kind == "missing":
            msg = "required field is missing"
            path = tuple(p for p in loc if p not in all_tags)
        out.append((line, f"{source.at(line, field_name(path))}: {msg}"))
    return [text for _, text in sorted(set(out))]


def allowed_keys(model: type[BaseModel]) -> list[str]:
    """The keys of a mapping in the order users read them: for claims id and kind
    first, the kind's own keys, the bound, description last."""
    fields = [info.alias or name for name, info in model.model_fields.items()]  # as files spell them (`from`)
    if not issubclass(model, ClaimSpec):
        return fields
    common = set(BoundedClaim.model_fields)  # id, kind, description and the bound
    own = [f for f in fields if f not in common]
    bounds = [f for f in ("at_least", "at_most") if f in fields]
    return ["id", "kind"] + own + bounds + ["description"]


def model_at(loc: tuple[str | int, ...], all_tags: dict[str, type[BaseModel]]) -> type[BaseModel]:
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


# PyYAML problems that a wrong indentation (or a tab) on this line or the one above causes
INDENTATION_PROBLEMS = ("mapping values are not allowed", "could not find expected ':'", "did not find expected key",
                        "did not find expected '-' indicator", "expected <block end>", "while scanning a simple key")
INDENTATION_HINT = ("hint: check the indentation of this line and the one above "
                    "(YAML nests by indentation; use spaces, not tabs)")
TAB_HINT = "hint: this line has a tab character; indent with spaces (YAML nests by indentation and refuses tabs)"


def yaml_problem(exc: yaml.YAMLError) -> tuple[int, str]:
    """(line, message) of a YAML syntax error: PyYAML's problem, with a plain hint when
    it is one that a wrong indentation or a tab causes."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark else 1
    problem = str(getattr(exc, "problem", None) or exc)
    context = str(getattr(exc, "context", None) or "")
    if "'\\t'" in problem or "tab" in problem:
        return line, f"{problem}; {TAB_HINT}"
    if any(p in problem or p in context for p in INDENTATION_PROBLEMS):
        return line, f"{problem}; {INDENTATION_HINT}"
    return line, problem
