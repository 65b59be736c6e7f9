"""One sweep job: one hypothesis file on one model.

`run_job` never raises for a problem of its own job: a model that does not
load, names the model does not have, a failed sanity check or any other
exception becomes a result with `status: failed` and the error's type and
message, so the executor keeps every other job's result.  A successful job
returns its evidence document and its rendered report files (report.md,
report.html, figures/, evidence.json), so the worker, not the driver, does the
rendering and the driver only writes bytes.

A process keeps the last model it loaded (one entry): the in-process executor
orders jobs model by model, so each checkpoint is loaded once.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from typing import Any, Optional

from .executors import failure_result

_LAST_MODEL: dict[tuple, Any] = {}


@dataclass(frozen=True)
class Job:
    hypothesis: str  # absolute path of the hypothesis file
    model: str  # absolute model directory or hf:NAME
    seed: Optional[int]  # overrides the file's seed when set
    device: Optional[str]  # None: the worker's best available device
    command: str  # recorded in the job's evidence provenance


def _model(source: str, device: Optional[str]) -> Any:
    from .devices import resolve_device
    from .models import load_model

    key = (source, resolve_device(device))
    if key not in _LAST_MODEL:
        _LAST_MODEL.clear()
        _LAST_MODEL[key] = load_model(source, device=key[1])
    return _LAST_MODEL[key]


def run_job(job: Job) -> dict:
    """Run `job`; {'status': 'ok', 'evidence', 'files', 'seconds', 'host'} or a failure result."""
    from .report import render_files, to_json
    from .runner import run

    start = time.perf_counter()
    stage = "loading the model"
    try:
        model = _model(job.model, job.device)
        stage = "running the claims"
        ev = run(job.hypothesis, seed=job.seed, model=model, device=job.device, command=job.command)
        stage = "rendering the report"
        doc = json.loads(to_json(ev.to_dict()))
        files = render_files(doc)
        files["evidence.json"] = to_json(doc).encode()
        result = {"status": "ok", "evidence": doc, "files": files}
    except Exception as exc:  # noqa: BLE001 - reported in the combined report
        result = failure_result(exc, stage)
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["host"] = platform.node()
    return result
