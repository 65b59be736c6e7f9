"""Writing report folders: `evidence.json`, `report.md`, a self-contained
`report.html` (figures embedded) and `figures/*.png`; and `harness report`.

A run never overwrites: the folder is new (`reports/<name>-<UTC time>`, with a
suffix when another run took that name, or the `--out` path, which must not exist).
Folders are written whole or not at all (report.folders).  Everything but
evidence.json is rendered from the evidence document alone, which is what
`harness report` does too; it reads the document defensively (report.reading),
validates it, and turns any failure to render a valid document into one clear error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..claims import registry
from ..errors import EvidenceFormatError, UserError
from ..evidence import document
from ..evidence.result import Evidence
from . import attention_figure, explain_figure, figures
from .folders import check_new, default_folder, preflight, preflight_file, replace_folder, write_folder
from .html import render_html
from .markdown import render_markdown
from .reading import load_bytes, parse, read_json
from .text import plain

__all__ = ["check_new", "default_folder", "preflight", "preflight_file", "read_json", "write_folder", "write_report",
           "rerender", "render_files", "report_files", "load_evidence", "validate_evidence", "replace_in_place",
           "render_error"]

REPORT_FILES = frozenset({"report.md", "report.html", "figures"})


def load_evidence(doc: dict[str, Any], checked: bool = False) -> Evidence:
    """The Evidence of an evidence.json document, read with the registered claim kinds
    (`checked`: the document was validated already)."""
    return document.load(doc, registry.kinds(), checked=checked)


def validate_evidence(doc: Any) -> list[str]:
    """Everything wrong with an evidence document under the registered claim kinds ([] when valid)."""
    return document.problems(doc, registry.kinds())


def render_files(doc: dict[str, Any], checked: bool = False) -> dict[str, bytes]:
    """{relative path: bytes} of report.md, report.html and figures/*.png for a document."""
    ev = load_evidence(doc, checked)
    pngs = {**attention_figure.render(ev), **figures.render_all(ev), **explain_figure.render(ev)}
    md = render_markdown(ev, set(pngs))
    files = {f"figures/{name}": png for name, png in pngs.items()}
    files["report.md"] = md.encode()
    files["report.html"] = render_html(md, pngs, ev.hypothesis["name"]).encode()
    return files


def report_files(ev: Evidence) -> dict[str, bytes]:
    """Every file of a run's report folder, evidence.json included."""
    text = document.to_json(ev.to_dict())
    files = render_files(json.loads(text))  # exactly what evidence.json holds
    files["evidence.json"] = text.encode()
    return files


def write_report(ev: Evidence, out_dir: Any | None = None, reports_root: Any | None = None) -> Path:
    """Write a run's report folder (new, never overwriting) and return it: `out_dir`
    (which must not exist), else a new `<name>-<UTC time>` folder under `reports_root`
    (default `reports/`).  Errors are UserErrors: the place cannot be written
    (checked before rendering), or the write failed (the evidence is then kept under
    the system temp folder, and the message says where)."""
    out = Path(out_dir) if out_dir is not None else None
    root = Path(reports_root or "reports")
    preflight(out, root)
    files = report_files(ev)
    if out is not None:
        return write_folder(out, files, unique=False)
    return write_folder(default_folder(ev.hypothesis["name"], root), files, unique=True)


def render_error(path: Path, exc: Exception) -> EvidenceFormatError:
    """A failure to render a validated document, as one line naming the document."""
    return EvidenceFormatError(f"{path}: cannot render this document ({type(exc).__name__}: {plain(exc)[:300]}); "
                               "it passes the schema, so this is a harness bug: please report it")


def replace_in_place(json_path: Path, files: dict[str, bytes], known: frozenset[str], carry: tuple[str, ...] = ()) \
        -> Path:
    """Swap the folder of `json_path` for one holding `files` (and its entries in `carry`),
    refusing a folder that holds anything but a report (`known` names, the JSON) or
    that holds the working directory."""
    folder = json_path.resolve().parent
    cwd = Path.cwd().resolve()
    if folder == cwd or folder in cwd.parents:
        raise UserError(f"{json_path}: cannot re-render in place the folder you are in; run from outside it "
                        "or give --out NEW_FOLDER")
    foreign = sorted(e.name for e in os.scandir(folder) if e.name not in known | {json_path.name}
                     and not (e.name.startswith(".") and e.name.endswith(".tmp")))  # stale temp files go
    if foreign:
        raise UserError(f"{json_path}: its folder holds more than a report ({', '.join(foreign[:3])}"
                        f"{', ...' if len(foreign) > 3 else ''}); give --out NEW_FOLDER")
    replace_folder(folder, files, carry)
    return json_path.parent


def rendered_again(json_path: Path, out_dir: Path | None, what: str, problems: Callable[[Any], list[str]],
                   render: Callable[[Any], dict[str, bytes]]) -> dict[str, bytes]:
    """`harness report`'s common part: the JSON read and checked (`problems` of it: one line each,
    `PATH: not a valid WHAT document: ...`), the place `out_dir` checked before anything renders, and
    the rendered files with the JSON's own bytes among them.  Rendering failures are one line."""
    raw = load_bytes(json_path, what)
    doc = parse(raw, json_path)
    found = problems(doc)
    if found:
        raise EvidenceFormatError("\n".join(f"{json_path}: not a valid {what} document: {p}" for p in found[:10]))
    if out_dir is not None:
        preflight(Path(out_dir))
    try:
        files: dict[str, bytes] = render(doc)
    except Exception as exc:
        raise render_error(json_path, exc) from exc
    files[json_path.name] = raw
    return files


def place(json_path: Path, files: dict[str, bytes], out_dir: Path | None, known: frozenset[str],
          carry: tuple[str, ...] = ()) -> Path:
    """Re-rendered `files` into the new folder `out_dir`, or in place of the JSON's folder at once
    (replace_in_place: `known` the names a report folder holds, `carry` those kept as they are)."""
    if out_dir is not None:
        return write_folder(Path(out_dir), files, unique=False, keep=False)
    return replace_in_place(json_path, files, known, carry)


def rerender(evidence_json: Path, out_dir: Path | None = None) -> Path:
    """`harness report`: report.md/html and figures from evidence.json alone.

    Without `out_dir` the report folder holding the JSON is replaced at once by a
    complete new one (the JSON, report.md, report.html, figures/); with it, a new
    folder gets a copy of the JSON too.  Bad documents, places that cannot be written
    and failures to render are one-line UserErrors; nothing is half-written."""
    evidence_json = Path(evidence_json)
    files = rendered_again(evidence_json, out_dir, "evidence", validate_evidence,
                           lambda doc: render_files(doc, checked=True))
    return place(evidence_json, files, out_dir, REPORT_FILES)
