"""Writing report folders: `evidence.json`, `report.md`, a self-contained
`report.html` (figures embedded) and `figures/*.png`.

A run never overwrites: the folder is new (`reports/<name>-<UTC time>` or the
`--out` path, which must not exist).  Files are written into a temporary
sibling folder that is renamed into place at the end, so an interrupted run
leaves no half report.  Everything but evidence.json is rendered from the
evidence document alone, which is what `harness report` does too.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from .errors import OutputExistsError, UserError
from .evidence import Evidence

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
td.v-PASS { background: #d8f0d8; } td.v-FAIL { background: #f8d0d0; } td.v-INCONCLUSIVE { background: #f8e8c0; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f5f5f5; padding: 0 0.2em; }
h1 { border-bottom: 2px solid #444; } h2 { border-bottom: 1px solid #aaa; margin-top: 2em; }
"""


def default_folder(name: str, reports_root: Path) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = reports_root / f"{name}-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def to_json(doc: dict) -> str:
    return json.dumps(_finite(doc), indent=2) + "\n"


def render_files(doc: dict) -> dict[str, bytes]:
    """{relative path: bytes} of report.md, report.html and figures/*.png for a document."""
    from .figures import render_all
    from .report_markdown import render_markdown

    figures = render_all(doc)
    md = render_markdown(Evidence.from_dict(doc), set(figures))
    files = {f"figures/{name}": png for name, png in figures.items()}
    files["report.md"] = md.encode()
    files["report.html"] = render_html(md, figures, doc["hypothesis"]["name"]).encode()
    return files


def render_html(md: str, figures: dict[str, bytes], title: str) -> str:
    """The Markdown report as one self-contained HTML page (figures as data URIs)."""
    import markdown

    body = markdown.markdown(md, extensions=["tables", "sane_lists"])
    for name, png in figures.items():
        uri = "data:image/png;base64," + base64.b64encode(png).decode()
        body = body.replace(f'src="figures/{name}"', f'src="{uri}"')
    for verdict in ("PASS", "FAIL", "INCONCLUSIVE"):
        body = body.replace(f"<td>{verdict}</td>", f'<td class="v-{verdict}">{verdict}</td>')
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Evidence report: {html.escape(title)}</title><style>{CSS}</style></head>"
            f"<body>\n{body}\n</body></html>\n")


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


def write_report(ev: Evidence, out_dir: Optional[Any] = None, reports_root: Optional[Any] = None) -> Path:
    """Write a run's report folder (new, never overwriting); return it."""
    if out_dir is not None:
        target = Path(out_dir)
        if target.exists():
            raise OutputExistsError(f"{target} already exists; runs never overwrite a report "
                                    "(choose another --out)")
    else:
        target = default_folder(ev.hypothesis["name"], Path(reports_root or "reports"))
    doc = json.loads(to_json(ev.to_dict()))  # exactly what evidence.json holds
    files = render_files(doc)
    files["evidence.json"] = to_json(doc).encode()
    write_folder(target, files)
    return target


def rerender(evidence_json: Path, out_dir: Optional[Path] = None) -> Path:
    """`harness report`: render report.md/html and figures from evidence.json alone
    (or sweep.md/html and figures from a sweep.json).

    Without `out_dir` the files beside evidence.json are replaced (each written to a
    temporary name and renamed); with it, a new folder gets a copy of the JSON too."""
    if not evidence_json.is_file():
        raise UserError(f"{evidence_json}: no such evidence file")
    try:
        doc = json.loads(evidence_json.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{evidence_json}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    sweep = isinstance(doc, dict) and "jobs" in doc  # a sweep.json (see sweep_report)
    problems = validate_document(doc, "sweep" if sweep else "evidence")
    if problems:
        raise UserError(f"{evidence_json}: not a valid {'sweep' if sweep else 'evidence'} document:\n"
                        + "\n".join(problems[:10]))
    if sweep:
        from .sweep_report import render_sweep

        files = render_sweep(doc)
    else:
        files = render_files(doc)
    if out_dir is not None:
        if out_dir.exists():
            raise OutputExistsError(f"{out_dir} already exists; choose another --out")
        files[evidence_json.name] = evidence_json.read_bytes()
        runs = evidence_json.parent / "runs"
        if sweep and runs.is_dir():  # the per-job reports the sweep report links to
            for f in runs.rglob("*"):
                if f.is_file():
                    files[str(f.relative_to(evidence_json.parent))] = f.read_bytes()
        write_folder(out_dir, files)
        return out_dir
    folder = evidence_json.parent
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return folder


def schema(kind: str = "evidence") -> dict:
    """The JSON Schema of evidence.json or sweep.json (shipped as harness/<kind>.schema.json)."""
    return json.loads((Path(__file__).parent / f"{kind}.schema.json").read_text())


def validate_evidence(doc: Any) -> list[str]:
    """Problems of an evidence document against the shipped schema ([] when valid)."""
    return validate_document(doc, "evidence")


def validate_document(doc: Any, kind: str) -> list[str]:
    """Problems of an evidence ('evidence') or sweep ('sweep') document ([] when valid)."""
    import jsonschema

    v = jsonschema.Draft202012Validator(schema(kind))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
            for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
