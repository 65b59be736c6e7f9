"""Edge circuits named by reference: `edges_from:` a file instead of an `edges:` list.

A circuit claim may give its edges as a file, relative to the hypothesis file's folder:

* a text file, one edge per line (`L0H7 -> L1H5.k`); blank lines and lines starting with
  `#` are skipped (`harness discover` writes its starter circuit as `starter-edges.txt`);
* a discovery.json (`harness discover`): its `ranking`, best edge first.

`top: N` keeps the first N edges of the file.  The file is read before the claims are
validated, its edges are given to the claim as `edges:` (so everything after, the claim and
its report, is the same as for a listed circuit; `edges_from` and `top` stay on the claim),
and each file's sha256 (of the bytes read) goes into the evidence (`hypothesis.references`),
beside the hypothesis file's own.
Problems name the hypothesis file's line and the edge file's line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import locations
from ..errors import ComponentNameError
from ..spec import names
from ..textfile import utf8

MAX_EDGE_FILE_BYTES = 64 << 20  # an edge list of every edge of a 7B model's graph is a few MB


@dataclass(frozen=True)
class EdgeReference:
    """Where one claim's edges came from."""

    claim: str
    file: str  # as the hypothesis file wrote it
    sha256: str  # of the file's bytes
    top: int | None
    edges: int  # edges taken from it

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, "file": self.file, "sha256": self.sha256, "top": self.top, "edges": self.edges}


class ReferenceError(ValueError):
    """A problem with an `edges_from:` reference (the message is the whole line after the field)."""


def expand(claim: dict[str, Any], base_dir: Path, shape: names.Shape | None) -> tuple[dict[str, Any], EdgeReference]:
    """The raw claim with `edges_from` (and `top`) read into `edges`, and where they came from;
    ReferenceError with a one-line reason."""
    if "edges" in claim:
        raise ReferenceError("give edges or edges_from, not both")
    value, top = claim["edges_from"], claim.get("top")
    if not isinstance(value, str) or not value.strip():
        raise ReferenceError("expected the path of an edge file (one edge per line) or of a discovery.json")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ReferenceError(f"top: expected a whole number of edges >= 1, got {top!r}")
    path = locations.resolve(value, base_dir)
    raw = _read(path)
    listed = _from_json(raw, path) if path.suffix.lower() == ".json" else _from_text(raw, path)
    if not listed:
        raise ReferenceError(f"{value}: lists no edges")
    if top is not None:
        if top > len(listed):
            raise ReferenceError(f"top: {top:,} but {value} lists {len(listed):,} edges")
        listed = listed[:top]
    _check(listed, shape)
    out = {**claim, "edges": [text for _, text in listed]}
    ref = EdgeReference(str(claim.get("id")), value, hashlib.sha256(raw).hexdigest(), top, len(listed))
    return out, ref


def _read(path: Path) -> bytes:
    problem = locations.file_problem(path)
    if problem is not None:
        raise ReferenceError(f"{path}: {problem}")
    size = path.stat().st_size
    if size > MAX_EDGE_FILE_BYTES:
        raise ReferenceError(f"{path}: {size:,} bytes; edge files are limited to {MAX_EDGE_FILE_BYTES:,} bytes")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _from_text(raw: bytes, path: Path) -> list[tuple[str, str]]:
    """(where, edge text) of every edge line: `file:line`."""
    text = utf8(raw, path, ReferenceError)
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            out.append((f"{path}:{i}", line))
    return out


def _from_json(raw: bytes, path: Path) -> list[tuple[str, str]]:
    """(where, edge text) of a discovery.json's ranking, best first: `file: ranking[i]`."""
    try:
        doc = json.loads(utf8(raw, path, ReferenceError))
    except json.JSONDecodeError as exc:
        raise ReferenceError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    ranking = doc.get("ranking") if isinstance(doc, dict) and doc.get("kind") == "discovery" else None
    if not isinstance(ranking, list):
        raise ReferenceError(f"{path}: not a discovery.json (harness discover) with a ranking; "
                             "a .json edge file is a discovery.json, other edge files list one edge per line")
    out = []
    for i, row in enumerate(ranking):
        edge = row.get("edge") if isinstance(row, dict) else None
        if not isinstance(edge, str):
            raise ReferenceError(f"{path}: ranking[{i}]: expected an object with an 'edge' string")
        out.append((f"{path}: ranking[{i}]", edge))
    return out


def _check(listed: list[tuple[str, str]], shape: names.Shape | None) -> None:
    """Every edge a valid edge of one sender, none listed twice: the first problem, with its line."""
    parse: Callable[[str], names.Edge] = lambda t: names.parse_edge(t, names.EDGE, shape)  # noqa: E731
    seen: dict[names.Edge, str] = {}
    for where, text in listed:
        try:
            e = parse(text)
        except ComponentNameError as exc:
            raise ReferenceError(f"{where}: {exc}") from None
        if isinstance(e.sender, names.Group):
            raise ReferenceError(f"{where}: '{e}': an edge of a circuit has one sender")
        if e in seen:
            raise ReferenceError(f"{where}: {e} is listed twice (first at {seen[e]})")
        seen[e] = where
