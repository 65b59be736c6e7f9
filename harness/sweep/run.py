"""`harness sweep`: hypothesis files x models, one combined report, surviving a kill.

Every (hypothesis, model) pair is one job (sweep.jobs.run_job) run by an
executor (sweep.executors).  The files are validated and the model paths
checked before any job starts; after that, a job that fails is recorded with
its error and the sweep goes on.  The sweep folder is made when the sweep starts:

    sweep.partial.json   the manifest (files, model arguments, seed, device, command, the
                         harness version, each job's key) while the sweep is unfinished
    runs/<hypothesis>/<NN>-<model>/   each job's full evidence report and job.json (its
                         result and key), written atomically as the job finishes
    sweep.json           the sweep document (docs/sweep-json.md, sweep.schema.json)
    sweep.md/.html       verdict tables, when each claim starts to hold, plots
    figures/             the plots over training step

The combined files are written when every job has a result; then the manifest is removed.
A sweep that is killed, runs out of memory or loses its Ray head leaves the jobs it
finished: `harness sweep --resume FOLDER` reads the manifest and runs only the jobs
without a finished result whose key matches (the hypothesis file's sha256, the model's
source and content sha256, the seed, the device and the harness version: a changed file
or checkpoint runs again), and `harness report FOLDER` renders the combined report of what
a partial folder holds (jobs not run yet marked `missing`).  Exit code
(sweep.document.exit_code): 0 every claim of every job passed; 1 some claim failed or
was inconclusive; 3 a job recorded a failed sanity check (its report says which;
`jobs[].sanity_failed`); 4 some job failed (a fatal sanity check fails its job) or is
missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..engine import provenance
from ..errors import UserError
from ..evidence.document import normalised, to_json
from ..hypothesis.loading import LoadedHypothesis, load_all
from ..model.ref import ModelRef
from ..report.folders import check_new, default_folder, preflight, replace_folder, write_folder
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


MANIFEST = "sweep.partial.json"
JOB_FILE = "job.json"


def sweep(files: list[Path], model_args: list[str], executor: Any, *, seed: int | None = None,
          device: str | None = None, out: Path | None = None, reports_root: Path = Path("reports"),
          command: str = "", on_done: Callable[[dict[str, Any]], None] | None = None,
          resume: Path | None = None) -> tuple[dict[str, Any], Path]:
    """Run the sweep (or, with `resume`, the unfinished jobs of the sweep folder `resume`, whose
    manifest then gives the files, models, seed and device) and write its folder; return (sweep
    document, folder).  That the folder can be written is checked before any job runs."""
    if resume is not None:
        manifest = read_manifest(resume)
        files, model_args = [Path(f) for f in manifest["files"]], list(manifest["models"])
        seed, device = manifest["seed"], manifest["device"]
        command = manifest.get("command") or command
    else:
        preflight(out, reports_root)
    hyps = load_hypotheses(files)
    models = expand(model_args)
    pairs = [(m_i, m, h) for m_i, m in enumerate(models) for h in hyps]  # model-major: one load per model
    jobs = [Job(str(h.path), m.source, seed, device, command) for _, m, h in pairs]
    plans = {h.spec.name: {c["id"]: c for c in claim_plan(h)} for h in hyps}
    hashes = {m.source: ModelRef.parse(m.source).content_hash() for m in models}
    keys = [job_key(h, m.source, hashes[m.source], seed, device) for _, m, h in pairs]
    folders = [f"runs/{folder_name(h.spec.name)}/{m_i + 1:02d}-{folder_name(m.label)}" for m_i, m, h in pairs]
    if resume is not None:
        target = resume
        started = manifest["started"]
    else:
        target = _new_folder(out, reports_root)
        started = provenance.now()
    _write_manifest(target, {"files": [str(Path(f).resolve()) for f in files], "models": model_args, "seed": seed,
                             "device": device, "command": command, "started": started, "executor": executor.name,
                             "version": provenance.versions().get("harness"), "jobs": keys})
    results: list[dict[str, Any] | None] = [finished(target / rel, key) for rel, key in zip(folders, keys)]
    todo = [i for i, r in enumerate(results) if r is None]

    def progress(k: int, result: dict[str, Any]) -> None:
        i = todo[k]
        _write_job(target / folders[i], result, keys[i])
        results[i] = result
        if on_done:
            _, m, h = pairs[i]
            on_done({"index": i, "total": len(jobs), "hypothesis": h.spec.name, "model": m.label, **result})

    executor.run(run_job, [jobs[i] for i in todo], progress)
    doc = assemble(hyps, models, pairs, folders, results, plans, seed=seed, device=device, executor=executor,
                   command=command, started=started)
    files_out = render_sweep(doc)
    files_out["sweep.json"] = to_json(doc).encode()
    for rel, data in files_out.items():
        write_file(target / rel, data)
    (target / MANIFEST).unlink(missing_ok=True)
    return doc, target


def job_key(h: LoadedHypothesis, source: str, model_sha256: str | None, seed: int | None,
            device: str | None) -> dict[str, Any]:
    """What a finished job must match to be reused by `--resume` (the edge files its circuits name, when
    there are any: a changed edge file is a changed hypothesis)."""
    refs = {"references_sha256": [r.sha256 for r in h.references]} if h.references else {}
    return {"hypothesis": h.spec.name, "hypothesis_sha256": h.sha256, "model": source, "model_sha256": model_sha256,
            "seed": seed, "device": device, "version": provenance.versions().get("harness"), **refs}


def finished(folder: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The result of the job whose folder this is, when it finished (status ok) under `key`; else None."""
    try:
        record = json.loads((folder / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or record.get("result", {}).get("status") != "ok":
        return None
    result: dict[str, Any] = record["result"]
    return result


def assemble(hyps: list[LoadedHypothesis], models: list[SweepModel], pairs: list[tuple[int, SweepModel, Any]],
             folders: list[str], results: list[dict[str, Any] | None], plans: dict[str, dict[str, Any]], *,
             seed: int | None, device: str | None, executor: Any, command: str, started: str) -> dict[str, Any]:
    """The sweep document of the jobs' results (None: a job not run yet, recorded as missing)."""
    job_docs = []
    for (_, m, h), rel, result in zip(pairs, folders, results, strict=True):
        entry = {"hypothesis": h.spec.name, "model": m.label, "report": None}
        if result is None:
            entry.update({"status": "missing", "seconds": None, "host": None})
        else:
            entry.update(job_summary(result, plans[h.spec.name]))
            if result["status"] == "ok":
                entry["report"] = rel
        job_docs.append(entry)
    return normalised({
        "schema_version": document.SCHEMA_VERSION,
        "complete": all(r is not None for r in results),
        "settings": {"seed": seed, "device": device or "auto", "executor": getattr(executor, "name", executor),
                     "ray_address": getattr(executor, "address", None)},
        "hypotheses": [{"name": h.spec.name, "file": provenance.shown_path(str(h.path)), "sha256": h.sha256,
                        "claims": claim_plan(h)} for h in hyps],
        "models": [_model_entry(m) for m in models],
        "jobs": job_docs,
        "counts": document.counts(job_docs),
        "provenance": {"versions": provenance.versions(), "command": command, "started": started,
                       "finished": provenance.now(), "host": provenance.host()},
    })


def partial_report(folder: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The combined report of an unfinished sweep folder (`harness report FOLDER`): the finished
    jobs' results, the others missing."""
    manifest = read_manifest(folder)
    hyps = load_hypotheses([Path(f) for f in manifest["files"]])
    models = expand(list(manifest["models"]))
    pairs = [(m_i, m, h) for m_i, m in enumerate(models) for h in hyps]
    folders = [f"runs/{folder_name(h.spec.name)}/{m_i + 1:02d}-{folder_name(m.label)}" for m_i, m, h in pairs]
    keys = manifest["jobs"]
    if len(keys) != len(pairs):
        raise UserError(f"{folder / MANIFEST}: its files or models changed since the sweep started "
                        f"({len(keys)} jobs recorded, {len(pairs)} now)")
    results = [finished(folder / rel, key) for rel, key in zip(folders, keys)]
    plans = {h.spec.name: {c["id"]: c for c in claim_plan(h)} for h in hyps}
    doc = assemble(hyps, models, pairs, folders, results, plans, seed=manifest["seed"], device=manifest["device"],
                   executor=manifest.get("executor", "inprocess"), command=manifest.get("command", ""),
                   started=manifest["started"])
    files = render_sweep(doc)
    files["sweep.json"] = to_json(doc).encode()
    return doc, files


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of an unfinished sweep folder (UserError, one line, when there is none)."""
    f = Path(folder) / MANIFEST
    if not f.is_file():
        done = (Path(folder) / "sweep.json").is_file()
        raise UserError(f"{folder}: " + ("the sweep is complete (sweep.json is there): nothing to resume"
                                         if done else f"not a sweep folder (no {MANIFEST})"))
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{f}: cannot read the sweep's manifest: {exc}") from None
    if not isinstance(doc, dict) or not {"files", "models", "seed", "device", "started", "jobs"} <= set(doc):
        raise UserError(f"{f}: not a sweep manifest")
    return doc


def _new_folder(out: Path | None, reports_root: Path) -> Path:
    """The sweep folder, made now (empty): `out`, or a new default folder under `reports_root`."""
    if out is not None:
        check_new(out)
        out.mkdir(parents=True)
        return out
    while True:
        target = default_folder("sweep", reports_root)
        try:
            target.mkdir(parents=True)
            return target
        except FileExistsError:  # taken since it was chosen: the next one
            continue


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    write_file(folder / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())


def _write_job(folder: Path, result: dict[str, Any], key: dict[str, Any]) -> None:
    """A finished job's folder, whole or not at all: its report files (when it ran) and job.json."""
    files = dict(result.get("files") or {})
    record = {"key": key, "result": {k: v for k, v in result.items() if k != "files"}}
    files[JOB_FILE] = (json.dumps(record, indent=1) + "\n").encode()
    if folder.exists():  # an older result of the same job (failed, or from before a change): replaced whole
        replace_folder(folder, files)
    else:
        write_folder(folder, files)


def write_file(path: Path, data: bytes) -> None:
    """`path` holding `data`, replaced at once (a temporary sibling renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _model_entry(m: SweepModel) -> dict[str, Any]:
    d = m.to_dict()
    d["source"] = provenance.shown_path(m.source)
    d["series"] = m.series
    return d
