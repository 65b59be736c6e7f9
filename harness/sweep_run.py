"""`harness sweep`: hypothesis files x models, one combined report.

Every (hypothesis, model) pair is one job (sweep_jobs.run_job) run by an
executor (executors.py).  The files are validated and the model paths
checked before any job starts; after that, a job that fails is recorded with
its error and the sweep goes on.  The combined report folder holds

    sweep.json      the sweep document (docs/sweep-json.md, sweep.schema.json)
    sweep.md/.html  verdict tables, when each claim starts to hold, plots
    figures/        the plots over training step
    runs/<hypothesis>/<NN>-<model>/   each job's full evidence report

written atomically, like a run's report.  Exit code: 0 every claim of every
job passed; 1 some claim failed or was inconclusive; 4 some job failed.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
from pathlib import Path
from typing import Any, Callable, Optional

from . import spec as spec_mod
from .errors import OutputExistsError, SpecError, UserError
from .evidence import FAIL, INCONCLUSIVE, PASS
from .runner import shown_path
from .sweep_models import SweepModel, expand

SWEEP_SCHEMA_VERSION = 1
EXIT_JOB_FAILED = 4


def load_hypotheses(files: list[Path]) -> list[spec_mod.LoadedHypothesis]:
    """Validate every file first (all problems at once); names must be unique."""
    loaded, problems = [], []
    for f in files:
        try:
            loaded.append(spec_mod.load(f))
        except SpecError as exc:
            problems += exc.problems
    if problems:
        raise SpecError(problems)
    names: dict[str, str] = {}
    for h in loaded:
        if h.spec.name in names:
            raise UserError(f"{h.where('name')}: name: '{h.spec.name}' is also the name of "
                            f"{names[h.spec.name]}; hypotheses in one sweep need distinct names")
        names[h.spec.name] = str(h.path)
    return loaded


def claim_plan(h: spec_mod.LoadedHypothesis) -> list[dict]:
    """The claims of a file as the sweep report lists them, with their fixed bounds."""
    out = []
    for c in h.spec.claims:
        d = c.model_dump()
        out.append({"id": c.id, "kind": c.kind,
                    "at_least": d.get("at_least"), "at_most": d.get("at_most"), "expect": d.get("expect")})
    return out


def reference_lines(claim: dict, plan: dict) -> list[dict]:
    """Horizontal lines a claim's number is judged against (for the plots)."""
    det = claim.get("details") or {}
    if plan["kind"] == "edge":
        if plan["expect"] == "used":
            return [{"y": det.get("min_effect"), "label": "min effect"}]
        tol = det.get("tolerance")
        return [{"y": tol, "label": "+tolerance"}, {"y": -tol if tol is not None else None, "label": "-tolerance"}]
    if plan["kind"] == "composition":
        return [{"y": det.get("null_q99"), "label": "null 99th pct"}]
    for key in ("at_least", "at_most"):
        if plan.get(key) is not None:
            return [{"y": plan[key], "label": key.replace("_", " ")}]
    return []


def job_summary(result: dict, plans: dict[str, dict]) -> dict:
    """What sweep.json keeps of one job's result (the full evidence stays in runs/)."""
    if result["status"] != "ok":
        return {"status": "failed", "error": result["error"], "seconds": result.get("seconds"),
                "host": result.get("host")}
    ev = result["evidence"]
    claims = []
    for c in ev["claims"]:
        claims.append({"id": c["id"], "kind": c["kind"], "evidence": c["evidence"],
                       "verdict": c["verdict"], "value": c["value"], "ci": c["ci"], "unit": c["unit"],
                       "rule": c["rule"], "reference": [r for r in reference_lines(c, plans[c["id"]])
                                                        if r["y"] is not None]})
    return {"status": "ok", "seconds": result.get("seconds"), "host": result.get("host"),
            "model_sha256": ev["model"]["sha256"], "device": ev["provenance"].get("device"),
            "counts": ev["counts"], "baseline_gap": ev["baseline"]["gap"], "claims": claims,
            "weights_vs_use": [{k: w[k] for k in ("edge", "class", "composes", "use", "composition",
                                                  "effect", "effect_ci")} for w in ev["weights_vs_use"]]}


def folder_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def sweep(files: list[Path], model_args: list[str], executor: Any, seed: Optional[int] = None,
          device: Optional[str] = None, out: Optional[Path] = None, reports_root: Path = Path("reports"),
          command: str = "", on_done: Optional[Callable[[dict], None]] = None) -> tuple[dict, Path]:
    """Run the sweep and write its folder; return (sweep document, folder)."""
    from .report import write_folder, default_folder, to_json
    from .runner import versions
    from .sweep_jobs import Job, run_job
    from .sweep_report import render_sweep

    hyps = load_hypotheses(files)
    models = expand(model_args)
    target = out if out is not None else default_folder("sweep", reports_root)
    if target.exists():
        raise OutputExistsError(f"{target} already exists; a sweep never overwrites (choose another --out)")
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    pairs = [(m_i, m, h) for m_i, m in enumerate(models) for h in hyps]  # model-major: one load per model
    jobs = [Job(str(h.path), m.source, seed, device, command) for _, m, h in pairs]
    plans = {h.spec.name: {c["id"]: c for c in claim_plan(h)} for h in hyps}

    def progress(i: int, result: dict) -> None:
        if on_done:
            _, m, h = pairs[i]
            on_done({"index": i, "total": len(jobs), "hypothesis": h.spec.name, "model": m.label, **result})

    results = executor.run(run_job, jobs, progress)
    files_out: dict[str, bytes] = {}
    job_docs = []
    for (m_i, m, h), result in zip(pairs, results):
        entry = {"hypothesis": h.spec.name, "model": m.label, "report": None,
                 **job_summary(result, plans[h.spec.name])}
        if result["status"] == "ok":
            rel = f"runs/{folder_name(h.spec.name)}/{m_i + 1:02d}-{folder_name(m.label)}"
            entry["report"] = rel
            for name, data in result["files"].items():
                files_out[f"{rel}/{name}"] = data
        job_docs.append(entry)
    doc = {
        "schema_version": SWEEP_SCHEMA_VERSION,
        "settings": {"seed": seed, "device": device or "auto", "executor": executor.name,
                     "ray_address": getattr(executor, "address", None)},
        "hypotheses": [{"name": h.spec.name, "file": shown_path(str(h.path)), "sha256": h.sha256,
                        "claims": claim_plan(h)} for h in hyps],
        "models": [_model_entry(m) for m in models],
        "jobs": job_docs,
        "counts": counts(job_docs),
        "provenance": {"versions": versions(), "command": command, "started": started,
                       "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       "host": {"python": platform.python_version(), "platform": platform.platform(),
                                "machine": platform.machine()}},
    }
    doc = json.loads(to_json(doc))
    files_out.update(render_sweep(doc))
    files_out["sweep.json"] = to_json(doc).encode()
    write_folder(target, files_out)
    return doc, target


def _model_entry(m: SweepModel) -> dict:
    d = m.to_dict()
    d["source"] = shown_path(m.source)
    d["series"] = m.series
    return d


def counts(jobs: list[dict]) -> dict:
    out = {"jobs": len(jobs), "ok": 0, "failed": 0, PASS: 0, FAIL: 0, INCONCLUSIVE: 0}
    for j in jobs:
        out[j["status"]] += 1
        for c in j.get("claims", []):
            out[c["verdict"]] += 1
    return out


def exit_code(doc: dict) -> int:
    c = doc["counts"]
    if c["failed"]:
        return EXIT_JOB_FAILED
    return 0 if c[FAIL] == 0 and c[INCONCLUSIVE] == 0 else 1
