"""One sweep job: one hypothesis file on one model.

`run_job` never raises for a problem of its own job: a model that does not
load, names the model does not have, a failed sanity check or any other
exception becomes a result with `status: failed` and the error's type and
message, so the executor keeps every other job's result.  A successful job
returns its evidence document and its rendered report files (report.md,
report.html, figures/, evidence.json), so the worker, not the driver, does the
rendering and the driver only writes bytes.

A process keeps the last model it loaded (`MODELS`, one entry): the in-process
executor orders jobs model by model, so each checkpoint is loaded once.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from typing import Any

from ..engine.runner import run
from ..model.cache import ModelCache
from ..registry import load_plugins
from ..report.writer import report_files
from .executors import failure_result

MODELS = ModelCache(capacity=1)  # jobs come model by model: keep only the current checkpoint


@dataclass(frozen=True)
class Job:
    hypothesis: str  # absolute path of the hypothesis file
    model: str  # absolute model directory or hf:NAME
    seed: int | None  # overrides the file's seed when set
    device: str | None  # None: the worker's best available device
    command: str  # recorded in the job's evidence provenance


def run_job(job: Job) -> dict[str, Any]:
    """Run `job`; {'status': 'ok', 'evidence', 'files', 'seconds', 'host'} or a failure result."""
    start = time.perf_counter()
    stage = "loading the model"
    result: dict[str, Any]
    try:
        load_plugins()  # a Ray worker is a fresh process: the plugins' kinds, metrics and sources
        model = MODELS.get(job.model, job.device)
        stage = "running the claims"
        ev = run(job.hypothesis, seed=job.seed, model=model, device=job.device, command=job.command)
        stage = "rendering the report"
        files = report_files(ev)
        result = {"status": "ok", "evidence": json.loads(files["evidence.json"]), "files": files}
    except Exception as exc:
        result = failure_result(exc, stage)
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["host"] = platform.node()
    return result
