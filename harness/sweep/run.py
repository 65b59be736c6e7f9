"""`harness sweep`: hypothesis files x models, one combined report.

Every (hypothesis, model) pair is one job (sweep.jobs.run_job) run by an
executor (sweep.executors).  The files are validated and the model paths
checked before any job starts; after that, a job that fails is recorded with
its error and the sweep goes on.  The combined report folder holds

    sweep.json      the sweep document (docs/sweep-json.md, sweep.schema.json)
    sweep.md/.html  verdict tables, when each claim starts to hold, plots
    figures/        the plots over training step
    runs/<hypothesis>/<NN>-<model>/   each job's full evidence report

written atomically, like a run's report.  Exit code (sweep.document.exit_code): 0
every claim of every job passed; 1 some claim failed or was inconclusive; 3 a job
recorded a failed sanity check (its report says which; `jobs[].sanity_failed`);
4 some job failed (a fatal sanity check fails its job).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..engine import provenance
from ..errors import UserError
from ..evidence.document import normalised, to_json
from ..hypothesis.loading import LoadedHypothesis, load_all
from ..report.folders import check_new, default_folder, preflight, write_folder
from . import document
from .document import claim_plan, folder_name, job_summary
from .jobs import Job, run_job
from .models import SweepModel, expand
from .report import render_sweep


def load_hypotheses(files: list[Path]) -> list[LoadedHypothesis]:
    """Validate every file first (all problems at once); names must be unique."""
    loaded = load_all(files)
    seen: dict[str, str] = {}
    for h in loaded:
        if h.spec.name in seen:
            raise UserError(f"{h.where('name')}: name: '{h.spec.name}' is also the name of "
                            f"{seen[h.spec.name]}; hypotheses in one sweep need distinct names")
        seen[h.spec.name] = str(h.path)
    return loaded


def sweep(files: list[Path], model_args: list[str], executor: Any, *, seed: int | None = None,
          device: str | None = None, out: Path | None = None, reports_root: Path = Path("reports"),
          command: str = "", on_done: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], Path]:
    """Run the sweep and write its folder; return (sweep document, folder).  That the
    folder can be written is checked before any job runs (report.folders.preflight)."""
    preflight(out, reports_root)
    hyps = load_hypotheses(files)
    models = expand(model_args)
    target = check_new(out) if out is not None else default_folder("sweep", reports_root)
    started = provenance.now()
    pairs = [(m_i, m, h) for m_i, m in enumerate(models) for h in hyps]  # model-major: one load per model
    jobs = [Job(str(h.path), m.source, seed, device, command) for _, m, h in pairs]
    plans = {h.spec.name: {c["id"]: c for c in claim_plan(h)} for h in hyps}

    def progress(i: int, result: dict[str, Any]) -> None:
        if on_done:
            _, m, h = pairs[i]
            on_done({"index": i, "total": len(jobs), "hypothesis": h.spec.name, "model": m.label, **result})

    results = executor.run(run_job, jobs, progress)
    files_out: dict[str, bytes] = {}
    job_docs = []
    for (m_i, m, h), result in zip(pairs, results, strict=True):
        entry = {"hypothesis": h.spec.name, "model": m.label, "report": None,
                 **job_summary(result, plans[h.spec.name])}
        if result["status"] == "ok":
            rel = f"runs/{folder_name(h.spec.name)}/{m_i + 1:02d}-{folder_name(m.label)}"
            entry["report"] = rel
            for name, data in result["files"].items():
                files_out[f"{rel}/{name}"] = data
        job_docs.append(entry)
    doc = normalised({
        "schema_version": document.SCHEMA_VERSION,
        "settings": {"seed": seed, "device": device or "auto", "executor": executor.name,
                     "ray_address": getattr(executor, "address", None)},
        "hypotheses": [{"name": h.spec.name, "file": provenance.shown_path(str(h.path)), "sha256": h.sha256,
                        "claims": claim_plan(h)} for h in hyps],
        "models": [_model_entry(m) for m in models],
        "jobs": job_docs,
        "counts": document.counts(job_docs),
        "provenance": {"versions": provenance.versions(), "command": command, "started": started,
                       "finished": provenance.now(), "host": provenance.host()},
    })
    files_out.update(render_sweep(doc))
    files_out["sweep.json"] = to_json(doc).encode()
    return doc, write_folder(target, files_out, unique=out is None)


def _model_entry(m: SweepModel) -> dict[str, Any]:
    d = m.to_dict()
    d["source"] = provenance.shown_path(m.source)
    d["series"] = m.series
    return d
