"""Where a sweep's jobs run: in this process (default) or as Ray tasks.

An executor calls `fn(job)` for every job and returns the results in job
order, calling `on_done(index, result)` as each finishes.  `fn` reports its own
errors as a result (see sweep_jobs.run_job); an executor adds the failures
`fn` cannot report itself: an exception escaping `fn`, or (Ray) a worker that
died or a task that could not run.  Such a job becomes
`failure_result(exc)`, and every other job's result is kept.

Ray (optional extra: `pip install 'harness[ray]'`): without an address a local
Ray instance is started with this machine's CPUs and shut down at the end;
with `address` (e.g. "ray://head:10001" or "auto") an existing cluster is
joined and left running.  Each job is one task with `num_cpus=1` (and
`num_gpus=1` when the device asked for is CUDA).  Workers must see the
hypothesis, data and model paths (same machine or a shared filesystem) and
have harness installed.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UserError

EXECUTORS = ("inprocess", "ray")
RETRIES = 1  # Ray: runs of a job after its worker died


def failure_result(exc: BaseException, where: str = "") -> dict:
    """The result of a job that raised `exc` (message first line kept whole)."""
    tb = None if isinstance(exc, UserError) else "".join(traceback.format_exception(exc))
    message = str(exc) or type(exc).__name__
    return {"status": "failed", "error": {"type": type(exc).__name__, "message": message,
                                          "where": where, "traceback": tb}}


class InProcess:
    """Jobs one after another in this process."""

    name = "inprocess"

    def run(self, fn: Callable[[Any], dict], jobs: Sequence[Any],
            on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
        results = []
        for i, job in enumerate(jobs):
            try:
                res = fn(job)
            except Exception as exc:
                res = failure_result(exc, "in-process job")
            results.append(res)
            if on_done:
                on_done(i, res)
        return results


class Ray:
    """Each job a Ray task; local instance unless `address` is given."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 gpus_per_job: float = 0.0):
        self.address, self.num_cpus, self.gpus_per_job = address, num_cpus, gpus_per_job

    def run(self, fn: Callable[[Any], dict], jobs: Sequence[Any],
            on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
        ray = import_ray()
        started = False
        if not ray.is_initialized():
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    # address="local": a new instance of our own, even where a cluster already runs on this
                    # machine (Ray would otherwise join it, and refuse num_cpus there)
                    ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                raise UserError(f"--executor ray: cannot start or join {where}: {exc}") from None
            started = True
        try:
            # a worker that dies (out of memory, killed) is run again once; a second death is the job's failure
            task = ray.remote(num_cpus=1, num_gpus=self.gpus_per_job, max_retries=RETRIES)(fn)
            refs = {task.remote(job): i for i, job in enumerate(jobs)}
            results: list[dict | None] = [None] * len(jobs)
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = refs[ref]
                    try:
                        res = ray.get(ref)
                    except Exception as exc:
                        res = failure_result(exc, "Ray task")
                    results[i] = res
                    if on_done:
                        on_done(i, res)
            return [r if r is not None else failure_result(RuntimeError("no result"), "Ray task")
                    for r in results]
        finally:
            if started:
                ray.shutdown()


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray, an optional extra: pip install 'harness[ray]'") from None
    return ray


def make(name: str, address: str | None = None, device: str | None = None) -> Any:
    """The executor called `name` ('inprocess' or 'ray')."""
    if name not in EXECUTORS:
        raise UserError(f"--executor {name}: allowed: {', '.join(EXECUTORS)}")
    if name == "inprocess":
        if address:
            raise UserError("--ray-address needs --executor ray")
        return InProcess()
    import_ray()
    gpus = 1.0 if device is not None and device.startswith("cuda") else 0.0
    return Ray(address=address, gpus_per_job=gpus)
