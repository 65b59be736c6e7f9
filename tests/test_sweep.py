"""`harness sweep`: hypothesis files x shipped checkpoints, in-process and on Ray.

One in-process sweep (module fixture, through the CLI) covers the eight shipped
checkpoints of the fixture's training run plus one broken model directory; the
Ray sweep repeats three of its jobs on a local Ray instance and must agree.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.errors import UserError
from harness.report.writer import validate_evidence
from harness.sweep import executors
from harness.sweep import models as sweep_models
from harness.sweep.document import problems as sweep_problems
from harness.sweep.report import holds_from

from . import committed

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ROOT / "fixtures" / "induction-2l-checkpoints"
STEPS = [250, 500, 750, 850, 950, 1250, 2000, 3000]

SMALL = """\
harness: 1
name: induction-small
model: {model}
data:
  generator: repeated_tokens
  n_prompts: 60
  segment_length: 12
  split: test
metric: logprob
stats:
  bootstrap: 500
  permutations: 1000
  null_draws: 300
claims:
  - id: prev-token-L0H7
    kind: role
    head: L0H7
    role: previous_token
    at_least: 0.8
  - id: induction-L1H5
    kind: role
    head: L1H5
    role: induction
    at_least: 0.7
  - id: K-comp-L0H7-L1H5
    kind: composition
    edge: L0H7 -> L1H5.k
    expect: composes
  - id: prev-token-feeds-induction-keys
    kind: edge
    edge: L0H7 -> L1H5.k
    expect: used
"""


def small_file(folder: Path, name: str = "small.yaml") -> Path:
    f = folder / name
    f.write_text(SMALL.format(model=ROOT / "fixtures" / "induction-2l"))
    return f


def broken_model(folder: Path) -> Path:
    """A copy of the last checkpoint whose weights file is cut in half: it cannot load."""
    bad = folder / "broken-checkpoint"
    shutil.copytree(CHECKPOINTS / "step-03000", bad)
    (bad / "checkpoint.json").unlink()
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    return bad


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """(exit code, sweep.json, folder, broken dir) of `harness sweep` over the checkpoints + a broken dir."""
    tmp = tmp_path_factory.mktemp("sweep")
    hyp = small_file(tmp)
    bad = broken_model(tmp)
    out = tmp / "report"
    code = cli.main(["sweep", str(hyp), "--models", str(CHECKPOINTS), str(bad), "--out", str(out),
                     "--device", "cpu"])
    return code, json.loads((out / "sweep.json").read_text()), out, bad


def job(doc, model):
    return next(j for j in doc["jobs"] if j["model"] == model)


def verdicts(doc, claim):
    return [next(c["verdict"] for c in job(doc, f"step-{s:05d}")["claims"] if c["id"] == claim) for s in STEPS]


def test_induction_claims_move_from_fail_to_pass_over_training(swept):
    code, doc, out, _ = swept
    assert [m["step"] for m in doc["models"][:8]] == STEPS
    for claim in ("prev-token-L0H7", "induction-L1H5", "K-comp-L0H7-L1H5"):
        v = verdicts(doc, claim)
        assert v[0] == "FAIL" and v[-1] == "PASS", (claim, v)
    v = verdicts(doc, "prev-token-feeds-induction-keys")
    assert v[0] == "INCONCLUSIVE" and v[-1] == "PASS"  # before induction the gap is too small to normalise
    md = (out / "sweep.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| induction-L1H5 "))
    assert row.split("|")[3].strip() == "FAIL" and row.split("|")[10].strip() == "PASS"
    assert " ".join(x[0] for x in verdicts(doc, "induction-L1H5")) in md  # the holds-from sequence
    # the evidence ladder per checkpoint: the K edge climbs from no evidence to edge necessity
    highest = [next(r["highest"] for r in job(doc, f"step-{s:05d}")["ladder"] if r["mechanism"] == "L0H7 -> L1H5.k")
               for s in STEPS]
    assert highest[0] is None and highest[-1] == "edge necessity", highest
    ladder = md[md.index("### Evidence ladder over training"):]
    row = next(line for line in ladder.splitlines() if line.startswith("| L0H7 -> L1H5.k "))
    cells = [c.strip() for c in row.split("|")[2:-1]][:len(STEPS)]
    assert [c.removesuffix(" !") for c in cells] == [h or "none" for h in highest]
    contradicted = [bool(next(r["contradictions"] for r in job(doc, f"step-{s:05d}")["ladder"]
                              if r["mechanism"] == "L0H7 -> L1H5.k")) for s in STEPS]
    assert [c.endswith(" !") for c in cells] == contradicted  # `!`: that model's steps disagree


def test_holds_from_matches_the_verdict_sequence(swept):
    _, doc, _, _ = swept
    rows = {(r[0], r[1]): r for r in holds_from(doc, "induction-small")}
    for claim in ("prev-token-L0H7", "induction-L1H5", "K-comp-L0H7-L1H5", "prev-token-feeds-induction-keys"):
        v = verdicts(doc, claim)
        last_bad = max(i for i, x in enumerate(v) if x != "PASS")  # step 250 never passes
        assert rows[(claim, "induction-2l seed 0")][2] == f"step {STEPS[last_bad + 1]}"


def test_a_broken_model_fails_one_job_and_keeps_the_others(swept):
    code, doc, out, bad = swept
    assert code == 4
    failed = [j for j in doc["jobs"] if j["status"] == "failed"]
    assert [j["model"] for j in failed] == [bad.name]
    assert failed[0]["error"]["type"] == "ModelLoadError" and failed[0]["report"] is None
    assert doc["counts"] == {**doc["counts"], "jobs": 9, "ok": 8, "failed": 1}
    md = (out / "sweep.md").read_text()
    assert "## Failed jobs" in md and bad.name in md and "ModelLoadError" in md
    for j in doc["jobs"]:
        if j["status"] == "ok":
            ev = json.loads((out / j["report"] / "evidence.json").read_text())
            assert validate_evidence(ev) == []
            assert [c["verdict"] for c in ev["claims"]] == [c["verdict"] for c in j["claims"]]
    assert sweep_problems(doc) == []


def test_sweep_numbers_equal_a_direct_run_on_the_checkpoint(swept, tmp_path):
    import harness

    _, doc, _, _ = swept
    ev = harness.run(small_file(tmp_path), model=CHECKPOINTS / "step-00850", device="cpu")
    got = {c["id"]: (c["verdict"], c["value"], c["ci"]) for c in job(doc, "step-00850")["claims"]}
    assert got == {c.id: (c.verdict, c.value, c.ci) for c in ev.claims}


def test_report_files_and_rerender(swept, tmp_path):
    _, doc, out, _ = swept
    html = (out / "sweep.html").read_text()
    assert "data:image/png;base64," in html and "report.html" in html and 'class="v-FAIL"' in html
    for f in ("induction-small-claims.png", "induction-small-together.png"):
        assert (out / "figures" / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["report", str(out / "sweep.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "sweep.md").read_text() == (out / "sweep.md").read_text()
    assert (tmp_path / "again" / job(doc, "step-00250")["report"] / "report.html").is_file()


def _comparable(j):
    if j["status"] != "ok":
        return ("failed", j["error"]["type"])
    return [(c["id"], c["verdict"], c["value"], c["ci"]) for c in j["claims"]]


def test_ray_local_instance_gives_the_in_process_results(swept, tmp_path, ray_reaped):
    import ray

    from harness.sweep.run import sweep

    _, doc, _, bad = swept
    models = [str(CHECKPOINTS / "step-00250"), str(CHECKPOINTS / "step-03000"), str(bad)]
    assert not ray.is_initialized()
    ray_doc, _ = sweep([small_file(tmp_path)], models, executors.Ray(num_cpus=2), device="cpu",
                       out=tmp_path / "ray-report")
    assert not ray.is_initialized()  # the local instance it started is shut down again
    assert ray_doc["settings"]["executor"] == "ray"
    assert [j["model"] for j in ray_doc["jobs"]] == ["step-00250", "step-03000", bad.name]
    for j in ray_doc["jobs"]:
        theirs = job(doc, j["model"])
        if j["status"] != "ok":
            assert _comparable(j) == _comparable(theirs)
            continue
        # workers run single-threaded (Ray sets OMP_NUM_THREADS=1): float sums differ in the last
        # bits, so the claims are compared as committed reports are (tests/committed.py)
        committed.assert_matches(theirs["claims"], j["claims"], scale=1.0, where=f"{j['model']}.claims")


def test_ray_worker_crash_is_one_failed_job(ray_reaped):
    import os

    def job_fn(x):  # a closure: Ray ships it by value
        if x == 1:
            os._exit(3)  # the worker process dies mid-task
        return {"status": "ok", "x": x}

    results = executors.Ray(num_cpus=2).run(job_fn, [0, 1, 2])
    assert [r["status"] for r in results] == ["ok", "failed", "ok"]
    assert results[0]["x"] == 0 and results[2]["x"] == 2
    assert "Worker" in results[1]["error"]["type"] or "died" in results[1]["error"]["message"].lower()


def test_input_errors_exit_2_before_any_job(tmp_path, capsys, monkeypatch):
    hyp = small_file(tmp_path)
    out = tmp_path / "never"
    cases = [
        (["--models", str(tmp_path / "missing")], "no such directory"),
        (["--models", str(CHECKPOINTS), "--ray-address", "auto"], "--ray-address needs --executor ray"),
        (["--models", str(CHECKPOINTS), "--device", "gpu7"], "gpu7"),
    ]
    for extra, needle in cases:
        assert cli.main(["sweep", str(hyp), "--out", str(out), *extra]) == 2
        assert needle in capsys.readouterr().err
    twin = small_file(tmp_path, "twin.yaml")
    assert cli.main(["sweep", str(hyp), str(twin), "--models", str(CHECKPOINTS), "--out", str(out)]) == 2
    assert "distinct names" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # as if the extra were not installed
    assert cli.main(["sweep", str(hyp), "--models", str(CHECKPOINTS), "--executor", "ray", "--out", str(out)]) == 2
    assert "pip install 'harness[ray]'" in capsys.readouterr().err
    assert not out.exists()


def test_models_are_ordered_by_series_and_step_and_labelled_uniquely(tmp_path):
    for seed in (1, 0):
        for step in (900, 100):
            d = tmp_path / f"seed{seed}" / f"step-{step}"
            d.mkdir(parents=True)
            (d / "config.json").write_text("{}")
            (d / "checkpoint.json").write_text(json.dumps({"step": step, "seed": seed, "run": "r"}))
    models = sweep_models.expand([str(tmp_path / "seed1"), str(tmp_path / "seed0")])
    assert [(m.seed, m.step) for m in models] == [(1, 100), (1, 900), (0, 100), (0, 900)]
    assert [m.label for m in models] == ["seed1/step-100", "seed1/step-900", "seed0/step-100", "seed0/step-900"]
    assert models[0].series == "r seed 1"


@pytest.mark.parametrize("content, needle", [
    ('{"step": -1}', "step: must be an integer >= 0"),
    ('{"step": 3, "seed": "x"}', "seed: must be an integer"),
    ('{"step": 3,\n "run": 5}', "run: must be a string"),
    ('{"step": 3,\n oops}', "checkpoint.json:2: not valid JSON"),
])
def test_bad_checkpoint_json_is_a_clear_error(tmp_path, content, needle):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "checkpoint.json").write_text(content)
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        sweep_models.expand([str(d)])


def test_shipped_checkpoints_are_the_fixture_run():
    last = CHECKPOINTS / "step-03000"
    assert (last / "model.safetensors").read_bytes() == \
        (ROOT / "fixtures" / "induction-2l" / "model.safetensors").read_bytes()
    assert sorted(p.name for p in CHECKPOINTS.iterdir() if p.is_dir()) == [f"step-{s:05d}" for s in STEPS]


def test_training_script_saves_loadable_checkpoints(tmp_path, monkeypatch):
    import importlib.util
    import sys

    import torch

    from harness.model.ref import load_model

    spec = importlib.util.spec_from_file_location("train_induction", ROOT / "fixtures" / "train_induction.py")
    train = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_induction", train)  # dataclasses look their module up
    spec.loader.exec_module(train)
    out = tmp_path / "run"
    train.main(["--steps", "6", "--seed", "3", "--checkpoint-steps", "3,6", "--out", str(out)])
    ckpts = tmp_path / "run-checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-00003", "step-00006"]
    meta = json.loads((ckpts / "step-00003" / "checkpoint.json").read_text())
    assert (meta["step"], meta["seed"], meta["run"]) == (3, 3, "induction-2l")
    a, b = load_model(ckpts / "step-00006", device="cpu"), load_model(out, device="cpu")
    for (k, v), (_, w) in zip(a.bridge.state_dict().items(), b.bridge.state_dict().items()):
        assert torch.equal(v, w), k
    assert [m.step for m in sweep_models.expand([str(ckpts)])] == [3, 6]


@pytest.mark.ray
def test_ray_address_joins_a_running_cluster_and_leaves_it_running(swept, tmp_path, monkeypatch, ray_reaped):
    """`ray start --head` stands in for a cluster: the sweep joins it, gets the in-process
    numbers, and does not stop it.  (Token authentication off on both sides: this checks
    joining, not Ray's auth set-up.)"""
    import os
    import subprocess
    import sys

    import ray

    _, doc, _, _ = swept
    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    subprocess.run([ray_cli, "start", "--head", "--port", "6391", "--num-cpus", "2", "--include-dashboard",
                    "false", "--disable-usage-stats"], check=True, env=env, capture_output=True, timeout=120)
    try:
        out = tmp_path / "cluster-report"
        code = cli.main(["sweep", str(small_file(tmp_path)), "--models", str(CHECKPOINTS / "step-03000"),
                         "--executor", "ray", "--ray-address", "127.0.0.1:6391", "--device", "cpu",
                         "--out", str(out)])
        assert code == 0
        got = json.loads((out / "sweep.json").read_text())
        assert got["settings"]["ray_address"] == "127.0.0.1:6391"
        assert [c["verdict"] for c in got["jobs"][0]["claims"]] == \
            [c["verdict"] for c in job(doc, "step-03000")["claims"]]
        assert not ray.is_initialized()  # the driver disconnected ...
        status = subprocess.run([ray_cli, "status", "--address", "127.0.0.1:6391"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0 and "Active" in status.stdout  # ... and the cluster still runs
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_two_series_render_side_by_side(swept):
    """The same jobs presented as two seeds: columns and holds-from rows per series."""
    import copy

    from harness.sweep.report import render_sweep

    _, doc, _, _ = swept
    two = copy.deepcopy(doc)
    ckpt = [m for m in two["models"] if m["step"] is not None]
    twins = [dict(m, label="seed1/" + m["label"], seed=1, series="induction-2l seed 1") for m in ckpt]
    two["models"] = ckpt + twins
    two["jobs"] = [j for j in two["jobs"] if j["status"] == "ok"]
    two["jobs"] += [dict(copy.deepcopy(j), model="seed1/" + j["model"]) for j in two["jobs"]]
    assert sweep_problems(two) == []
    md = render_sweep(two)["sweep.md"].decode()
    assert "induction-2l seed 0 @250" in md and "induction-2l seed 1 @3000" in md
    rows = holds_from(two, "induction-small")
    assert {r[1] for r in rows} == {"induction-2l seed 0", "induction-2l seed 1"}
    by_series = {}
    for claim, _series, start, *_ in rows:
        by_series.setdefault(claim, set()).add(start.split("@")[-1])
    assert all(len(v) == 1 for v in by_series.values())  # identical jobs: identical onsets
