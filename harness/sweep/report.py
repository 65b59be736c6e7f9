"""The combined sweep report (sweep.md, sweep.html, figures/), rendered from
the sweep document alone.

"Holds from": for each claim and series (run, seed), the first model in step
order from which the claim PASSes on that model and on every later one; a
failed job counts as not PASS.  "never" when the last model does not PASS.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tabulate import tabulate

from ..report.folders import write_folder
from ..report.html import render_html
from ..report.text import md_cell, md_code, md_link_text, md_text
from ..report.writer import rendered_again, replace_in_place
from . import document
from . import figures as sweep_figures
from .document import folder_name, plan_of

ERROR_CELL = "job failed"
MISSING_CELL = "not run yet"
SWEEP_FILES = frozenset({"sweep.md", "sweep.html", "figures", "runs"})
# a contradiction the file itself asserted, in the ladders of evidence documents before version 6 (whose
# steps read the direction of a claim, not its verdict); later ladders have no such suffix
LEGACY_AS_CLAIMED = " (as the file claims)"


def column_names(doc: dict) -> dict[str, str]:
    """Short column header per model: 'step N' (with the series when there are several)."""
    models = doc["models"]
    several = len({m["series"] for m in models if m["series"]}) > 1
    out = {}
    for m in models:
        if m["step"] is None:
            out[m["label"]] = m["label"]
        else:
            out[m["label"]] = f"{m['series']} @{m['step']}" if several else f"step {m['step']}"
    if len(set(out.values())) < len(out):  # two models at one step in one series: labels
        out = {m["label"]: m["label"] for m in models}
    return out


def _jobs(doc: dict, hypothesis: str) -> dict[str, dict]:
    return {j["model"]: j for j in doc["jobs"] if j["hypothesis"] == hypothesis}


def verdict_rows(doc: dict, hypothesis: str) -> list[list[str]]:
    """One row per claim: id, kind, then the verdict on each model (model order)."""
    plan = plan_of(doc, hypothesis)
    jobs = _jobs(doc, hypothesis)
    by_id = {label: _claims(j) for label, j in jobs.items()}
    rows = []
    for c in plan:
        row = [c["id"], c["kind"]]
        for m in doc["models"]:
            j = jobs.get(m["label"])
            if j is None or j["status"] != "ok":
                row.append(MISSING_CELL if j is not None and j["status"] == "missing" else ERROR_CELL)
            else:
                row.append(by_id[m["label"]][c["id"]]["verdict"])
        rows.append(row)
    return rows


def holds_from(doc: dict, hypothesis: str) -> list[list[str]]:
    """Rows: claim, series, holds from, first PASS, verdict sequence (P/F/I/E)."""
    plan = plan_of(doc, hypothesis)
    jobs = _jobs(doc, hypothesis)
    by_id = {label: _claims(j) for label, j in jobs.items()}
    series: dict[str, list[dict]] = {}
    for m in doc["models"]:
        series.setdefault(m["series"], []).append(m)
    rows = []
    for c in plan:
        for s, models in series.items():
            verdicts = []
            for m in models:
                j = jobs.get(m["label"])
                ok = j is not None and j["status"] == "ok"
                verdicts.append(by_id[m["label"]][c["id"]]["verdict"] if j is not None and ok else "ERROR")
            start: int | None = None
            for i in range(len(verdicts) - 1, -1, -1):
                if verdicts[i] != "PASS":
                    break
                start = i
            first = next((i for i, v in enumerate(verdicts) if v == "PASS"), None)
            rows.append([c["id"], s or "-",
                         "never" if start is None else _within(models[start]),
                         "never" if first is None else _within(models[first]),
                         " ".join(v[0] for v in verdicts)])
    return rows


def _within(model: dict) -> str:
    """A model's name within its series row: its step, else its label."""
    return model["label"] if model["step"] is None else f"step {model['step']}"


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render_markdown(doc: dict, figures: set[str]) -> str:
    c = doc["counts"]
    s = doc["settings"]
    names = column_names(doc)
    hyp_names = ", ".join(md_text(h["name"]) for h in doc["hypotheses"])
    out = [f"# Sweep: {hyp_names} over {len(doc['models'])} models", ""]
    out.append(f"{c['jobs']} jobs: {c['ok']} ran, {c['failed']} failed. Claims over all jobs: "
               f"{c['PASS']} PASS, {c['FAIL']} FAIL, {c['INCONCLUSIVE']} INCONCLUSIVE. "
               f"Executor {md_code(s['executor'])}"
               + (f" at {md_code(s['ray_address'])}" if s.get("ray_address") else "")
               + f", device {md_code(s['device'])}, seed "
               + ("from each file" if s["seed"] is None else md_code(s["seed"])) + ".")
    out += ["", "Each model runs every claim of the file on the same prompts and seed. A verdict "
            "table reads left to right along training; each column header links to that job's "
            "full evidence report. Weight evidence proposes routes; only the causal claims show a "
            "route is used.", ""]
    missing = [j for j in doc["jobs"] if j["status"] == "missing"]
    if missing:
        out += ["## Not run yet", "", f"**This sweep is unfinished**: {len(missing)} of {len(doc['jobs'])} jobs have "
                "no result yet (`harness sweep --resume FOLDER` runs them). Their cells read "
                f"*{MISSING_CELL}*.", "", _table([(j["hypothesis"], j["model"]) for j in missing],
                                                  ["hypothesis", "model"]), ""]
    failed = [j for j in doc["jobs"] if j["status"] == "failed"]
    if failed:
        out += ["## Failed jobs", "", "These jobs did not produce evidence; every other job's result is kept.", ""]
        failures = [(j["hypothesis"], j["model"], j["error"]["type"], j["error"]["where"],
                     j["error"]["message"].splitlines()[0] if j["error"]["message"] else "") for j in failed]
        out += [_table(failures, ["hypothesis", "model", "error", "while", "message"]), ""]
    for h in doc["hypotheses"]:
        name = h["name"]
        jobs = _jobs(doc, name)
        out += [f"## {md_text(name)} ({md_code(h['file'])})", "", "### Verdicts per model", ""]
        headers = ["claim", "kind"]
        for m in doc["models"]:  # each column's header links to that job's own report
            j = jobs.get(m["label"])
            report = j.get("report") if j else None
            headers.append(f"[{md_link_text(names[m['label']])}]({quote(report)}/report.md)" if report
                           else md_cell(names[m["label"]]))
        out += [_table(verdict_rows(doc, name), headers, escape_headers=False), ""]
        out += ["### When each claim starts to hold", "",
                "*Holds from*: the first model from which the claim passes on it and on every later "
                "model of the series. Sequence: P pass, F fail, I inconclusive, E job failed.", ""]
        out += [_table(holds_from(doc, name), ["claim", "series", "holds from", "first PASS", "sequence"]), ""]
        for key, title in (("claims", "Key numbers"), ("together", "Evidence together")):
            fname = f"{folder_name(name)}-{key}.png"
            if fname in figures:
                out += [f"### {title}", "", f"![{md_text(name)}: {title.lower()}](figures/{quote(fname)})", ""]
        out += _ladder(doc, name, names)
        out += _weights_vs_use(doc, name, names)
        out += _numbers(doc, name, names)
    out += ["## Models", ""]
    rows: list[tuple[Any, ...]] = []
    for i, m in enumerate(doc["models"], 1):
        shas = {j.get("model_sha256") for j in doc["jobs"] if j["model"] == m["label"] and j.get("model_sha256")}
        rows.append((i, m["label"], m["series"] or "-", "-" if m["step"] is None else m["step"], m["source"],
                     next(iter(shas))[:12] if shas else "-"))
    out += [_table(rows, ["#", "model", "series", "step", "source", "sha256"]), ""]
    p = doc["provenance"]
    out += ["## Provenance", "", f"- command: {md_code(p['command'])}",
            f"- started {md_text(p['started'])}, finished {md_text(p['finished'])}",
            "- versions: " + ", ".join(f"{md_text(k)} {md_text(v)}" for k, v in p["versions"].items()), ""]
    return "\n".join(out)


def _table(rows: list[Any], headers: list[str], escape_headers: bool = True) -> str:
    """A GitHub table of `rows` whose every cell (and header) is literal text (report.text)."""
    body = [[md_cell(x) for x in row] for row in rows]
    return tabulate(body, headers=[md_cell(h) for h in headers] if escape_headers else headers,
                    tablefmt="github", disable_numparse=True)


def _row_key(row: dict[str, Any]) -> str:
    """An edge and its direction (sweep.json version 1 and 2 rows have no direction)."""
    return f"{row['edge']} ({row['direction']})" if row.get("direction") else row["edge"]


def _first_by(rows: list[dict], key: Any) -> dict[Any, dict]:
    """{key(row): row} keeping each key's first row (one pass, not a scan per lookup)."""
    out: dict[Any, dict] = {}
    for r in rows:
        out.setdefault(key(r), r)
    return out


def _claims(job: dict) -> dict[str, dict]:
    """A job's claims by id."""
    return _first_by(job.get("claims", []), lambda x: x["id"])


def _weights_vs_use(doc: dict, hypothesis: str, names: dict[str, str]) -> list[str]:
    jobs = _jobs(doc, hypothesis)
    edges = list(dict.fromkeys(_row_key(row) for j in jobs.values() for row in j.get("weights_vs_use", [])))
    if not edges:
        return []
    found = {m["label"]: _first_by((jobs.get(m["label"]) or {}).get("weights_vs_use", []), _row_key)
             for m in doc["models"]}
    rows = []
    for e in edges:
        row = [e]
        for m in doc["models"]:
            w = found[m["label"]].get(e)
            row.append(w["class"] if w else "-")
        rows.append(row)
    return ["### Weights vs use over training", "",
            "Per edge named by both a composition and an edge claim (or an edge claim alone): "
            "whether the weights propose the route (composition) and whether the model uses it "
            "(edge patching). *route present, unused* and *used without a weight route* mark where "
            "the two kinds of evidence diverge.", "",
            _table(rows, ["edge"] + [names[m["label"]] for m in doc["models"]]), ""]


def _ladder(doc: dict, hypothesis: str, names: dict[str, str]) -> list[str]:
    """The highest rung of the evidence ladder each mechanism reaches on each model (! marks
    a model on which some of its evidence contradicts the rest)."""
    jobs = _jobs(doc, hypothesis)
    mechanisms = list(dict.fromkeys(r["mechanism"] for j in jobs.values() for r in j.get("ladder", [])))
    if not mechanisms:
        return []
    found = {m["label"]: _first_by((jobs.get(m["label"]) or {}).get("ladder", []), lambda r: r["mechanism"])
             for m in doc["models"]}
    rows = []
    for mech in mechanisms:
        row = [mech]
        for m in doc["models"]:
            r = found[m["label"]].get(mech)
            unexpected = r is not None and any(not c.endswith(LEGACY_AS_CLAIMED) for c in r["contradictions"])
            row.append("-" if r is None else (r["highest"] or "none") + (" !" if unexpected else ""))
        rows.append(row)
    return ["### Evidence ladder over training", "",
            "The highest level of evidence each mechanism reaches on each model (weights, observation, necessity, "
            "edge necessity, sufficiency, robustness); `!` marks a mechanism whose evidence on that model disagrees "
            "(a FAILed claim beside one that PASSed, or a robustness failure; each job's report lists it).", "",
            _table(rows, ["mechanism"] + [names[m["label"]] for m in doc["models"]]), ""]


def _numbers(doc: dict, hypothesis: str, names: dict[str, str]) -> list[str]:
    plan = plan_of(doc, hypothesis)
    jobs = _jobs(doc, hypothesis)
    by_id = {label: _claims(j) for label, j in jobs.items()}
    rows = []
    for c in plan:
        row = [c["id"]]
        for m in doc["models"]:
            j = jobs.get(m["label"])
            x = by_id.get(m["label"], {}).get(c["id"])
            if x is None:
                row.append("-")
            elif x["ci"]:
                row.append(f"{_cell(x['value'])} [{_cell(x['ci'][0])}, {_cell(x['ci'][1])}]")
            else:
                row.append(_cell(x["value"]))
        rows.append(row)
    gap = ["clean - corrupted gap (nats)"]
    for m in doc["models"]:
        j = jobs.get(m["label"])
        gap.append(_cell(j["baseline_gap"]["mean"]) if j and j["status"] == "ok" else "-")
    return ["### Key numbers (95% CI)", "",
            _table(rows + [gap], ["claim"] + [names[m["label"]] for m in doc["models"]]), ""]


def render_sweep(doc: dict) -> dict[str, bytes]:
    """{relative path: bytes} of sweep.md, sweep.html and figures/*.png."""
    figures: dict[str, bytes] = {}
    for h in doc["hypotheses"]:
        for key, fn in (("claims", sweep_figures.claims), ("together", sweep_figures.together)):
            png = fn(doc, h["name"])
            if png is not None:
                figures[f"{folder_name(h['name'])}-{key}.png"] = png
    md = render_markdown(doc, set(figures))
    title = "sweep: " + ", ".join(h["name"] for h in doc["hypotheses"])
    page = render_html(md, figures, title, marks={ERROR_CELL: "FAIL"},
                       rewrite=lambda body: re.sub(r'(href="[^"]*/report)\.md"', r'\1.html"', body))
    files = {f"figures/{k}": v for k, v in figures.items()}
    files["sweep.md"] = md.encode()
    files["sweep.html"] = page.encode()
    return files


def rerender(sweep_json: Path, out_dir: Path | None = None) -> Path:
    """`harness report` on a sweep.json: sweep.md, sweep.html and figures from the JSON alone.

    Without `out_dir` the sweep folder is replaced at once by a complete new one (the
    JSON, the new pages and figures, and its runs/); with it, a new folder gets copies
    of the JSON and of the per-job reports it links to.  Bad documents, places that
    cannot be written and failures to render are one-line UserErrors."""
    sweep_json = Path(sweep_json)
    files = rendered_again(sweep_json, out_dir, "sweep", document.problems, render_sweep)
    if out_dir is None:
        return replace_in_place(sweep_json, files, SWEEP_FILES, carry=("runs",))
    runs = sweep_json.parent / "runs"
    if runs.is_dir():  # the per-job reports the sweep report links to
        for f in runs.rglob("*"):
            if f.is_file() and not f.is_symlink():
                files[str(f.relative_to(sweep_json.parent))] = f.read_bytes()
    return write_folder(Path(out_dir), files, unique=False, keep=False)
