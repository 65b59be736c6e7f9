"""Reading an evidence.json or sweep.json that may come from anyone.

`read_json(path, what)` returns the parsed document or raises one clear
`EvidenceFormatError` (exit 2) naming the file, and the line where there is one: a
name that does not end in `.json` (so `harness report report.html` never writes over
the page), a missing, unreadable or non-UTF-8 file, malformed JSON, the literals
`NaN`, `Infinity` and `-Infinity` or a number too large for a float (JSON has no
non-finite numbers: the harness writes them as null), or nesting deeper than
`MAX_DEPTH` (no evidence document comes near it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import EvidenceFormatError
from ..textfile import utf8

MAX_DEPTH = 64
MAX_INT_DIGITS = 18


class _NotFinite(ValueError):
    """A number JSON cannot hold or the renderer cannot draw (the token as written)."""

    def __init__(self, token: str, why: str):
        super().__init__(f"{token}: {why}")
        self.token = token


NON_FINITE = "not a finite number (JSON has no NaN or Infinity; undefined numbers are written as null)"


def _constant(name: str) -> Any:
    raise _NotFinite(name, NON_FINITE)


def _float(text: str) -> float:
    x = float(text)
    if x in (float("inf"), float("-inf")):
        raise _NotFinite(text, NON_FINITE)
    return x


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _NotFinite(text, f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _line_of(text: str, token: str) -> int:
    """The line of the first `token` outside a JSON string (1 if not found)."""
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|' + re.escape(token), text):
        if not m.group().startswith('"'):
            return text.count("\n", 0, m.start()) + 1
    return 1


def depth(doc: Any) -> int:
    """How deeply lists and objects nest in `doc` (0 for a scalar); iterative."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict | list):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return deepest


def load_bytes(path: Path, what: str) -> bytes:
    """The bytes of a `.json` file (EvidenceFormatError, one line, if it cannot be read)."""
    if path.suffix.lower() != ".json":
        raise EvidenceFormatError(f"{path}: not a .json file: give the {what}.json document (the report files are "
                                  "written beside it or into --out)")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise EvidenceFormatError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise EvidenceFormatError(f"{path}: is a folder, not an {what} file") from None
    except OSError as exc:
        raise EvidenceFormatError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def parse(raw: bytes, path: Path) -> Any:
    """The JSON document in `raw` (EvidenceFormatError with file:line if it is not one)."""
    text = utf8(raw, path, EvidenceFormatError).removeprefix("\ufeff")  # a byte-order mark is allowed
    try:
        doc = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except _NotFinite as exc:
        raise EvidenceFormatError(f"{path}:{_line_of(text, exc.token)}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise EvidenceFormatError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise EvidenceFormatError(f"{path}: nested too deeply (at most {MAX_DEPTH} levels)") from None
    if depth(doc) > MAX_DEPTH:
        raise EvidenceFormatError(f"{path}: nested too deeply (at most {MAX_DEPTH} levels)")
    return doc


def read_json(path: Path, what: str) -> Any:
    """The JSON document at `path` (see the module docstring for what is refused)."""
    return parse(load_bytes(Path(path), what), Path(path))
