"""Sweeps that survive: a sweep killed after some jobs leaves their reports, `harness sweep
--resume FOLDER` runs only the rest, and the result equals an uninterrupted sweep's sweep.json
(every field but the timings, hosts and provenance); a partial folder renders its report so far;
under Ray a worker that dies is run again once, and a job whose worker dies twice is recorded.
Killed for real: the sweep runs as a subprocess and gets SIGKILL (in-process and on a local Ray
instance)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.sweep import executors
from harness.sweep.run import JOB_FILE, MANIFEST

from .test_sweep import CHECKPOINTS, small_file

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

MODELS = [str(CHECKPOINTS / s) for s in ("step-00250", "step-00750", "step-00850", "step-00950", "step-01250",
                                         "step-03000")]
VOLATILE = {"seconds", "host", "provenance", "started", "finished", "command"}


def harness(*args: str, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, HARNESS_DEVICE="cpu", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished_jobs(folder: Path) -> int:
    return len(list(folder.glob(f"runs/*/*/{JOB_FILE}")))


def stable(doc):
    """The sweep document without what differs between two runs of the same jobs."""
    if isinstance(doc, dict):
        return {k: stable(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [stable(v) for v in doc]
    return doc


def kill_after(proc: subprocess.Popen, folder: Path, jobs: int, limit: float = 300.0) -> None:
    """SIGKILL `proc` once `jobs` jobs of the sweep in `folder` have finished."""
    start = time.monotonic()
    while finished_jobs(folder) < jobs:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < limit, "the sweep took too long"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()  # waits, and closes its pipes


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole")
    f = small_file(root)
    p = harness("sweep", str(f), "--models", *MODELS, "--out", str(root / "sweep"), cwd=root)
    out, err = p.communicate(timeout=900)
    assert p.returncode in (0, 1, 3), err  # 3: the earliest checkpoints record a failed gap check
    return f, json.loads((root / "sweep" / "sweep.json").read_text())  # (paths show relative to root)


@pytest.mark.parametrize("executor", ["inprocess", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_killed_sweep_resumes_to_the_same_sweep_json(uninterrupted, tmp_path, executor):
    pytest.importorskip("ray") if executor == "ray" else None
    f, whole = uninterrupted
    folder = tmp_path / "sweep"
    here = f.parent  # the working directory of the uninterrupted sweep: paths show the same
    p = harness("sweep", str(f), "--models", *MODELS, "--out", str(folder), "--executor", executor, cwd=here)
    kill_after(p, folder, 2)
    done = finished_jobs(folder)
    assert 2 <= done < len(MODELS) and (folder / MANIFEST).is_file() and not (folder / "sweep.json").exists()

    # the report so far: the finished jobs, the others marked missing
    r = harness("report", str(folder), cwd=here)
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, err
    partial = json.loads((folder / "sweep.json").read_text())
    assert partial["complete"] is False and partial["counts"]["missing"] == len(MODELS) - done
    assert "**This sweep is unfinished**" in (folder / "sweep.md").read_text()

    resumed = harness("sweep", "--resume", str(folder), "--executor", executor, cwd=here)
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode in (0, 1, 3), err
    # one result line per job that ran ("[4/6] induction-small on step-00950: 3 pass, ..."); a job's
    # warnings carry the same prefix, so only the result lines are counted
    ran = [line for line in err.splitlines() if re.match(r"\[\d+/\d+\] \S+ on step-\d+: \d+ pass, ", line)]
    assert len(ran) == len(MODELS) - done, ran  # only the jobs without a result ran again
    doc = json.loads((folder / "sweep.json").read_text())
    assert not (folder / MANIFEST).exists() and doc["complete"] is True
    expected = stable(whole)
    expected["settings"]["executor"] = executor  # the uninterrupted sweep ran in-process
    assert stable(doc) == expected
    for j in doc["jobs"]:  # every job's report is there, the finished ones as they were written
        assert (folder / j["report"] / "evidence.json").is_file()


def test_resume_refuses_what_is_not_an_unfinished_sweep(uninterrupted, tmp_path, capsys):
    from harness.cli import main

    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    assert "not a sweep folder (no sweep.partial.json)" in capsys.readouterr().err
    f, _ = uninterrupted
    assert main(["sweep", str(f), "--resume", str(tmp_path)]) == 2
    assert "give no FILE, --models, --seed or --out with it" in capsys.readouterr().err


def _dies_once(job):
    """A job whose worker dies the first time it runs (a marker file remembers)."""
    marker = Path(job)
    if not marker.exists():
        marker.write_text("died")
        os._exit(1)
    return {"status": "ok", "evidence": None, "files": {}}


def _always_dies(job):
    os._exit(1)


@pytest.mark.ray
def test_ray_runs_a_dead_worker_again_once_and_records_a_second_death(tmp_path, ray_reaped):
    pytest.importorskip("ray")
    ray = executors.Ray(num_cpus=1)
    results = ray.run(_dies_once, [str(tmp_path / "a")])
    assert results[0]["status"] == "ok" and (tmp_path / "a").read_text() == "died"
    results = ray.run(_always_dies, ["x"])
    assert results[0]["status"] == "failed" and results[0]["error"]["where"] == "Ray task"
