"""Writing report folders: `evidence.json`, `report.md`, a self-contained
`report.html` (figures embedded) and `figures/*.png`.

A run never overwrites: the folder is new (`reports/<name>-<UTC time>` or the
`--out` path, which must not exist).  Files are written into a temporary
sibling folder that is renamed into place at the end, so an interrupted run
leaves no half report.  Everything but evidence.json is rendered from the
evidence document alone, which is what `harness report` does too.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..claims import registry
from ..errors import OutputExistsError, UserError
from ..evidence import document
from ..evidence.result import Evidence
from . import figures
from .html import render_html
from .markdown import render_markdown


def default_folder(name: str, reports_root: Path) -> Path:
    """`reports_root/<name>-<UTC time>` (with `-2`, `-3`, ... if taken)."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = reports_root / f"{name}-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def check_new(target: Path) -> Path:
    """`target`, which must not exist yet (OutputExistsError otherwise)."""
    if target.exists():
        raise OutputExistsError(f"{target} already exists; harness never overwrites a report (choose another --out)")
    return target


def load_evidence(doc: dict[str, Any]) -> Evidence:
    """The Evidence of an evidence.json document, read with the registered claim kinds."""
    return document.load(doc, registry.kinds())


def validate_evidence(doc: Any) -> list[str]:
    """Everything wrong with an evidence document under the registered claim kinds ([] when valid)."""
    return document.problems(doc, registry.kinds())


def render_files(doc: dict[str, Any]) -> dict[str, bytes]:
    """{relative path: bytes} of report.md, report.html and figures/*.png for a document."""
    ev = load_evidence(doc)
    pngs = figures.render_all(ev)
    md = render_markdown(ev, set(pngs))
    files = {f"figures/{name}": png for name, png in pngs.items()}
    files["report.md"] = md.encode()
    files["report.html"] = render_html(md, pngs, ev.hypothesis["name"]).encode()
    return files


def report_files(ev: Evidence) -> dict[str, bytes]:
    """Every file of a run's report folder, evidence.json included."""
    doc = document.normalised(ev.to_dict())  # exactly what evidence.json holds
    files = render_files(doc)
    files["evidence.json"] = document.to_json(doc).encode()
    return files


def write_folder(target: Path, files: dict[str, bytes]) -> None:
    """Write `files` into a temporary sibling of `target`, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_files(folder: Path, files: dict[str, bytes]) -> None:
    """Replace files inside an existing folder, each written to a temporary name and renamed."""
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def write_report(ev: Evidence, out_dir: Any | None = None, reports_root: Any | None = None) -> Path:
    """Write a run's report folder (new, never overwriting); return it."""
    if out_dir is not None:
        target = check_new(Path(out_dir))
    else:
        target = default_folder(ev.hypothesis["name"], Path(reports_root or "reports"))
    write_folder(target, report_files(ev))
    return target


def read_json(path: Path, what: str) -> Any:
    """The JSON document at `path` (UserError with file:line when it is missing or malformed)."""
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None


def rerender(evidence_json: Path, out_dir: Path | None = None) -> Path:
    """`harness report`: render report.md/html and figures from evidence.json alone.

    Without `out_dir` the files beside evidence.json are replaced (each written to a
    temporary name and renamed); with it, a new folder gets a copy of the JSON too."""
    doc = read_json(evidence_json, "evidence")
    problems = validate_evidence(doc)
    if problems:
        raise UserError(f"{evidence_json}: not a valid evidence document:\n" + "\n".join(problems[:10]))
    files = render_files(doc)
    if out_dir is not None:
        check_new(out_dir)
        files[evidence_json.name] = evidence_json.read_bytes()
        write_folder(out_dir, files)
        return out_dir
    replace_files(evidence_json.parent, files)
    return evidence_json.parent
