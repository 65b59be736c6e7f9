"""The scale benchmark's (benchmarks/scale_bench.py) pieces on tiny models (seconds): the hypothesis files it writes
are valid, `measure` reports time, memory and timeouts, and one benchmark pass over two
tiny sizes (its subprocesses run in-process here) fills every row of the table with
positive numbers.  The full benchmark (minutes) is not run here."""

import contextlib
import io
import json
import resource
import sys
import time

import pytest

from harness.hypothesis.loading import load

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks are scripts beside the package, not in it
import scale_bench as sb
import scale_files as sf

pytestmark = pytest.mark.slow  # make test-quick leaves this module out
pytest.importorskip("transformers")


def kinds(doc):
    return {c["kind"] for c in doc["claims"]}


@pytest.mark.parametrize("n_layers", [2, 6, 12])
def test_size_files_are_valid(tmp_path, n_layers):
    shape = sf.gpt2_shape(n_layers)
    model = tmp_path / "model"
    five = sf.five_claim(shape, model)
    real = sf.realistic(shape, model)
    for doc in (five, real):
        path = sf.write_hypothesis(doc, tmp_path / f"{doc['name']}.yaml")
        loaded = load(path)
        assert len(loaded.spec.claims) == len(doc["claims"])
        assert doc["data"] == {"generator": "repeated_tokens", "n_prompts": 50, "segment_length": 20}
    assert len(five["claims"]) == 5
    assert [c["kind"] for c in five["claims"]] == ["role", "ablation", "composition", "edge", "edge"]
    assert five["claims"][2]["edge"] == ("L0H11 -> L1H1.k" if n_layers == 2 else "L4H11 -> L5H1.k")
    assert kinds(real) == {"role", "ablation", "composition", "edge", "circuit"}
    assert {c.get("ablation") for c in real["claims"] if c["kind"] == "ablation"} == {"zero", "mean", "resample"}
    circuit = next(c for c in real["claims"] if c["kind"] == "circuit")
    assert len(circuit["heads"]) == 20 and "random_circuits" not in circuit


@pytest.mark.parametrize("tiny", [False, True])
def test_many_claims_file_is_valid(tmp_path, tiny):
    doc = sf.many_claims(sf.small_shape(tiny), tmp_path / "model")
    loaded = load(sf.write_hypothesis(doc, tmp_path / "many.yaml"))
    assert len(loaded.spec.claims) == 123
    assert kinds(doc) == {"role", "copying", "composition", "ablation", "edge", "circuit"}
    assert doc["data"] == {"generator": "repeated_tokens"}  # default settings


def test_measure_time_memory_and_exit_code(tmp_path):
    got = sb.measure([sys.executable, "-c", "x = bytearray(200 * 2**20); import sys; sys.exit(3)"], 60,
                     tmp_path / "logs" / "alloc")
    assert got.returncode == 3 and not got.timed_out
    assert got.status() == "error (exit 3)" and got.status((3,)) == "ok"
    assert got.seconds > 0 and got.peak_mb >= 200


def test_measure_kills_on_timeout(tmp_path):
    t = time.perf_counter()
    got = sb.measure([sys.executable, "-c", "import time; time.sleep(60)"], 0.5, tmp_path / "sleep")
    assert got.timed_out and got.status().startswith("timeout after")
    assert time.perf_counter() - t < 30


def test_parse_layers_and_fit():
    assert sb.parse_layers("12,2,6,6") == [2, 6, 12]
    with pytest.raises(sb.UserError):
        sb.parse_layers("1,2")
    assert sb.fit_exponent([2.0, 4.0, 8.0], [3.0, 12.0, 48.0]) == pytest.approx(2.0)
    assert sb.fit_exponent([2.0], [1.0]) is None


def in_process(cmd, timeout, logs, cwd=None):
    """`measure` without a subprocess: the same command's main() in this process (its
    imports are already paid), timed, with this process's peak RSS."""
    if cmd[1:2] == [sb.__file__]:
        main, argv = sb.main, cmd[2:]
    elif cmd[1:3] == ["-m", "harness"]:
        from harness.cli import main
        argv = cmd[3:]
    else:
        raise ValueError(cmd)
    logs.parent.mkdir(parents=True, exist_ok=True)
    out, err = logs.with_suffix(".out"), logs.with_suffix(".err")
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as o, contextlib.redirect_stderr(io.StringIO()) as e:
        code = main(argv)
    seconds = time.perf_counter() - t
    out.write_text(o.getvalue())
    err.write_text(e.getvalue())
    peak = sb._maxrss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return sb.Measured(seconds, peak, int(code), False, out, err)


@pytest.fixture
def one_thread(monkeypatch):
    """HARNESS_THREADS=1 for the in-process children; torch's thread count restored afterwards."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("HARNESS_THREADS", "1")
    yield
    torch.set_num_threads(before)


def test_benchmark_fills_every_row(tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(sb, "measure", in_process)
    monkeypatch.setattr(sb, "N_PROMPTS", 8)
    monkeypatch.setattr(sf, "DATA", {"generator": "repeated_tokens", "n_prompts": 8, "segment_length": 5})
    rows = sb.benchmark([2, 3], tmp_path, timeout=60, tiny=True, many=False)
    keys = ["five", "realistic", "weights", "scores", "edges", "edges-tl"]
    assert [(r.size, r.key) for r in rows] == [(s, k) for s in ("2L", "3L") for k in keys]
    for r in rows:
        assert r.status == "ok", (r.key, r.status, r.notes)
        assert r.seconds > 0 and r.peak_mb > 0
    with_tl = [r for r in rows if r.tl]
    assert {r.key for r in with_tl} == {"weights", "scores", "edges", "edges-tl"}
    assert all(r.tl_seconds > 0 and r.ratio > 0 for r in with_tl)
    edges = next(r for r in rows if r.key == "edges")
    assert edges.extra["edges"] == 91 and "edges/s" in edges.notes
    same = next(r for r in rows if r.key == "edges-tl")
    diff = float(same.notes.split("difference| ")[1])
    assert diff < 1e-4  # the harness and TransformerLens compute the same 12 edge patches

    machine = {"cores": 2, "threads": 1, "load_average": "0", "python": "3"}
    text = sb.render(rows, machine, target_layers=3)
    table = text.split("### Growth")[0]
    for r in rows:
        assert f"| {r.size} " in table and r.measurement in table
    growth = sb.growth(rows)
    quantities = {g["quantity"] for g in growth}
    assert quantities >= {f"{r.measurement}: seconds" for r in rows}
    assert quantities >= {f"TL equivalent of {r.measurement}: seconds" for r in with_tl}
    assert all(g["ratios"]["3L/2L"] > 0 and g["exponent"] is not None for g in growth)
    assert "- not measured: 123-claim run under 60 s" in text
    assert sum(line.startswith(("- PASS", "- MISS")) for line in text.splitlines()) == 3
    doc = json.loads(json.dumps(sb.to_json(rows, machine, target_layers=3)))
    assert len(doc["rows"]) == len(rows) and len(doc["targets"]) == 4
