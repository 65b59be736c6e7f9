"""Scale benchmark: what a hypothesis run, the weights table and the edge sweep cost
as a GPT-2-shaped model grows from 2 to 12 layers, beside TransformerLens.

    .venv/bin/python benchmarks/scale_bench.py [--layers 2,6,12] [--keep DIR] [--json FILE]
                                        [--timeout SECONDS] [--threads N]

Models.  Random-weight Hugging Face GPT-2 architectures built locally (no
download): `torch.manual_seed(0)`, `transformers.GPT2LMHeadModel(GPT2Config(...))`,
`.eval().save_pretrained(folder)` (safetensors), with 12 heads, d_model 768, vocab
50257, n_positions 1024 and 2, 6 or 12 layers (12 layers is GPT-2-small-shaped).
They are built in a temporary directory, or in `--keep DIR`, where a model already
built with the same shape is reused.  The 123-claim model is a 2-layer, 4-head,
d_model-120 GPT-2 (vocab 1000, n_positions 128).

Prompts.  Every measurement below uses the repeated-tokens generator with 50 prompts
and |S| = 20 (41 tokens), except the 123-claim file, which keeps every default
(200 prompts).

Rows of the results table, per model size (the hypothesis files are written by
`five_claim`, `realistic` and `many_claims` in benchmarks/scale_files.py, into the work directory):

* `five-claim run`: `harness run` on five claims: an induction role claim on
  L{L/2}H1, a mean ablation of the route's two heads, the composition
  L4H11 -> L5H1.k (L{L-2}H11 -> L{L-1}H1.k below 6 layers), and two edge claims
  (that route, and its receiver -> logits).
* `realistic run`: `harness run` on 4 role claims, 3 ablations (zero, mean,
  resample), 6 composition claims (so the null-draw extension applies), 6 edge
  claims (.q/.k/.v, embed, logits, denoising, zero replacement) and one circuit of
  20 heads with its default comparison with 100 random circuits.  The notes give
  how many random circuits the run actually drew (none when no prompt has a
  full-empty gap of min_prompt_gap, which a random-weight model can produce).
* `harness weights`: the command line `harness weights MODEL` (every cross-layer
  pair's composition score in Q, K and V, with the rotation null for every pair,
  1000 draws plus the extension).  TL equivalent: a process that loads the same
  model with the same loader and calls TransformerLens's
  `TransformerBridge.all_composition_scores(mode)` for Q, K and V.  TransformerLens
  has no null, so this compares the whole command with scores only.
* `composition scores only`: in-process seconds of `mech.weights.scores.head_weights`
  (folded) and every cross-layer pair's score for q, k and v
  (`mech.weights.factored.Composition.scores`, or `mech.weights.scores.all_scores` before that
  module existed), against in-process seconds of `all_composition_scores` Q, K, V
  (unprocessed weights as loaded); each the median of 3 fresh computations.  The
  like-for-like part of the row above.
* `edge sweep, s per edge`: in-process seconds per edge of
  `mech.edges.batched.batched_metrics` (denoising: base = the corrupted run,
  source = the clean run, resample, its default chunk budget, logprob metric;
  caches from `mech.hooks.cache_hooks` with `edge_sets.cache_names`; after a
  one-edge warm-up) on a fixed subset of 91 edges (with 12 heads): embed and every
  head of layer L/2-1 -> L{L/2}H1 .q/.k/.v (39 edges), embed and every head of
  layer L-2 -> L{L-1}H2 .q/.k/.v (39), and embed and every head of the last layer
  -> logits (13).  The notes give edges per second (overall and per group) and the
  seconds per edge as a fraction of one plain forward pass (no hooks) on the same
  50 clean prompts (median of 3).  TL equivalent: seconds per edge of
  `transformer_lens.patching.get_act_patch_direct_path` from L{L-2}H0 into every
  head of the last layer (component k: 12 edges, one hooked forward each; its
  caches hold that layer's hook_z only).  TransformerLens's direct-path patching
  cannot be restricted to given receivers (it patches one sender into every later
  head), so this row compares the cost per edge, not the same edges.
* `edge sweep, TL's 12 edges`: in-process seconds of harness `batched_metrics` on
  exactly the edges TransformerLens patched (L{L-2}H0 -> L{L-1}H*.k, denoising)
  against the seconds of that `get_act_patch_direct_path` call; the notes give the
  largest difference between the two mean metrics over the 12 edges (they compute
  the same quantity).  Both edge rows come from one child process each (harness,
  TransformerLens), so they share its peak MB.

And once (unless `--no-many`): `123-claim run`, `harness run` on a generated file of
32 role, 8 copying, 48 composition, 11 ablation, 21 edge and 3 circuit claims, each
with its default settings.

How it is measured.  Every row runs in a fresh subprocess (`python -m harness ...`,
or this module with a hidden `--child` option for the in-process timings), started
by `measure`: seconds is the subprocess's wall time (Python start-up, imports and
model loading included) unless the row says in-process; peak MB is the
subprocess's peak resident set size (`os.wait4` rusage `ru_maxrss`: the largest of
the process and of any descendant it waited for), in MiB.  A subprocess still running
after `--timeout` seconds (default 900) is killed with its process group and the
row says `timeout`.  Torch threads: `harness.threads.configure` in this process
and in the children (`--threads N` sets $HARNESS_THREADS for every subprocess;
default: every core this process may use).  Timings on a shared machine are noisy.

Output: the Markdown results table; how each cost grows with layers (the ratio
between consecutive sizes and the exponent b of a least-squares fit
cost ~ layers^b); PASS/MISS against the targets (12-layer five-claim run under
120 s and under 4 GiB peak RSS, 12-layer `harness weights` under 30 s, 123-claim
run under 60 s).  `--json FILE` writes the same numbers.  POSIX only (os.wait4).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scale_children import run_child
from scale_files import (
    N_PROMPTS,
    SEGMENT,
    Shape,
    build_model,
    five_claim,
    gpt2_shape,
    many_claims,
    realistic,
    small_shape,
    write_hypothesis,
)

from harness.errors import UserError
from harness.threads import available_cores, chosen, configure

DEFAULT_TIMEOUT = 900.0
TARGETS_LAYERS = 12
WEIGHTS_TARGET_S, RUN_TARGET_S, RUN_TARGET_MB, MANY_TARGET_S = 30.0, 120.0, 4096.0, 60.0


# ----------------------------------------------------------------------------------- measuring a child

@dataclass
class Measured:
    """One subprocess: wall seconds, peak RSS (MiB), exit code, and whether it was killed on the timeout."""

    seconds: float
    peak_mb: float
    returncode: int
    timed_out: bool
    stdout: Path
    stderr: Path

    def status(self, ok_codes: tuple[int, ...] = (0,)) -> str:
        if self.timed_out:
            return f"timeout after {self.seconds:.0f} s"
        return "ok" if self.returncode in ok_codes else f"error (exit {self.returncode})"


def _maxrss_mb(ru_maxrss: int) -> float:
    """ru_maxrss is in KiB on Linux and in bytes on macOS."""
    return ru_maxrss / 2**20 if sys.platform == "darwin" else ru_maxrss / 1024


def wait_child(cmd: list[str], timeout: float, stdout: Any, stderr: Any, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> tuple[float, Any, int, bool]:
    """Run `cmd` in a new process group: (wall seconds, its os.wait4 rusage, exit code, timed out).
    After `timeout` seconds the group is killed; on Ctrl-C or an error here no child is left running.
    benchmarks/real_model.py measures its children with it too."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                            start_new_session=True)
    timed_out, status, usage = False, 0, None
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
    except BaseException:
        if usage is None:
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen must not wait again
    return time.perf_counter() - start, usage, proc.returncode, timed_out


def measure(cmd: list[str], timeout: float, logs: Path, cwd: Path | None = None) -> Measured:
    """Run `cmd` in a new process group; its wall time and peak RSS (from os.wait4's rusage).
    stdout/stderr go to `logs`.out/.err.  After `timeout` seconds the group is killed."""
    out_path, err_path = logs.with_suffix(".out"), logs.with_suffix(".err")
    logs.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        seconds, usage, code, timed_out = wait_child(cmd, timeout, out, err, cwd)
    return Measured(seconds, _maxrss_mb(usage.ru_maxrss), code, timed_out, out_path, err_path)


# --------------------------------------------------------------------------------------- the benchmark

@dataclass
class Row:
    """One line of the results table."""

    size: str
    shape: str
    d_model: int
    key: str
    measurement: str
    seconds: float | None
    peak_mb: float | None
    status: str
    tl: str = ""
    tl_seconds: float | None = None
    tl_peak_mb: float | None = None
    tl_status: str = ""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """TransformerLens seconds / harness seconds (above 1: the harness is faster)."""
        if self.seconds and self.tl_seconds and self.status == "ok" and self.tl_status == "ok":
            return self.tl_seconds / self.seconds
        return None


@dataclass
class Bench:
    """Where the benchmark works and how long a child may take."""

    work: Path
    timeout: float
    started: float = field(default_factory=time.perf_counter)

    def log(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)

    def run(self, name: str, cmd: list[str], ok_codes: tuple[int, ...] = (0,)) -> Measured:
        """One measured subprocess, with a progress line before and after it."""
        self.log(f"{name} ... (timeout {self.timeout:.0f} s)")
        got = measure(cmd, self.timeout, self.work / "logs" / name.replace(" ", "_"), cwd=self.work)
        self.log(f"{name}: {got.status(ok_codes)}, {got.seconds:.1f} s wall, {got.peak_mb:.0f} MB peak "
                 f"(load average {os.getloadavg()[0]:.2f})")
        return got

    def child(self, name: str, kind: str, model: Path) -> tuple[Measured, dict[str, Any] | None]:
        """Run an in-process timing in a fresh subprocess; its JSON, or None if it failed."""
        out = self.work / "logs" / f"{name.replace(' ', '_')}.json"
        out.unlink(missing_ok=True)
        got = self.run(name, [sys.executable, __file__, "--child", kind, "--model",
                              str(model), "--out", str(out)])
        if got.status() != "ok" or not out.is_file():
            return got, None
        return got, json.loads(out.read_text())

    def harness_run(self, name: str, hypothesis: Path) -> tuple[Measured, dict[str, Any] | None]:
        """`harness run FILE --out DIR`; the evidence.json it wrote (exit 1 = a claim did not pass, 3 = a recorded
        sanity check failed, e.g. a random model's clean-corrupted gap: fine, the report is written)."""
        report = self.work / "reports" / name.replace(" ", "_")
        _remove_tree(report)
        got = self.run(name, [sys.executable, "-m", "harness", "run", str(hypothesis), "--out", str(report)],
                       ok_codes=(0, 1, 3))
        evidence = report / "evidence.json"
        return got, json.loads(evidence.read_text()) if evidence.is_file() else None


def _remove_tree(path: Path) -> None:
    import shutil

    if path.exists():
        shutil.rmtree(path)


def _run_notes(evidence: dict[str, Any] | None) -> str:
    """Verdict counts of a run (and the random circuits it drew)."""
    if evidence is None:
        return "no evidence.json"
    claims = evidence.get("claims", [])
    counts = {v: sum(c.get("verdict") == v for c in claims) for v in ("PASS", "FAIL", "INCONCLUSIVE")}
    text = f"{len(claims)} claims: {counts['PASS']} pass, {counts['FAIL']} fail, {counts['INCONCLUSIVE']} inconclusive"
    drawn = [c.get("details", {}).get("random_circuits") for c in claims if c.get("kind") == "circuit"]
    if drawn:
        text += f"; random circuits drawn: {', '.join(str(d) for d in drawn)}"
    return text


def _row(shape: Shape, key: str, measurement: str, got: Measured, ok_codes: tuple[int, ...] = (0,),
         seconds: float | None = None, notes: str = "") -> Row:
    status = got.status(ok_codes)
    return Row(shape.label, f"{shape.n_layers}x{shape.n_heads}", shape.d_model, key, measurement,
               (got.seconds if seconds is None else seconds) if status == "ok" else None, got.peak_mb, status,
               notes=notes if status == "ok" else f"{notes} see {got.stderr}".strip())


def _with_tl(row: Row, name: str, got: Measured, seconds: float | None) -> Row:
    row.tl, row.tl_status, row.tl_peak_mb = name, got.status(), got.peak_mb
    row.tl_seconds = seconds if row.tl_status == "ok" else None
    return row


def measure_size(bench: Bench, shape: Shape) -> list[Row]:
    """Every row of one model size."""
    folder = bench.work / "models" / shape.folder_name
    t = time.perf_counter()
    built = build_model(shape, folder)
    bench.log(f"{shape.label}: model {'built' if built else 'reused'} in {time.perf_counter() - t:.1f} s ({folder})")
    hyp = bench.work / "hypotheses"
    five = write_hypothesis(five_claim(shape, folder), hyp / f"five-{shape.label}.yaml")
    real = write_hypothesis(realistic(shape, folder), hyp / f"realistic-{shape.label}.yaml")
    rows = []
    got, ev = bench.harness_run(f"{shape.label} five-claim run", five)
    rows.append(_row(shape, "five", "five-claim run (harness run)", got, (0, 1, 3), notes=_run_notes(ev)))
    got, ev = bench.harness_run(f"{shape.label} realistic run", real)
    rows.append(_row(shape, "realistic", "realistic run (harness run)", got, (0, 1, 3), notes=_run_notes(ev)))
    rows += weights_rows(bench, shape, folder)
    rows += edge_rows(bench, shape, folder)
    return rows


def weights_rows(bench: Bench, shape: Shape, folder: Path) -> list[Row]:
    """`harness weights` and the scores alone, each beside TransformerLens's all_composition_scores."""
    got = bench.run(f"{shape.label} harness weights", [sys.executable, "-m", "harness", "weights", str(folder)])
    tl_got, tl = bench.child(f"{shape.label} TL composition scores", "tl-scores", folder)
    sc_got, sc = bench.child(f"{shape.label} harness composition scores", "scores", folder)
    tl_name = "all_composition_scores Q, K, V"
    weights_row = _with_tl(_row(shape, "weights", "harness weights (scores + nulls, all pairs)", got),
                           f"{tl_name} (process wall, no null)", tl_got, tl_got.seconds if tl else None)
    scores_row = _row(shape, "scores", "composition scores only (in-process)", sc_got,
                      seconds=sc["seconds"] if sc else None)
    if sc is None:
        scores_row.status, scores_row.seconds = sc_got.status() if sc_got.status() != "ok" else "no result", None
    return [weights_row, _with_tl(scores_row, f"{tl_name} (in-process)", tl_got, tl["seconds"] if tl else None)]


def edge_rows(bench: Bench, shape: Shape, folder: Path) -> list[Row]:
    """The sweep's seconds per edge on the subset, and on TransformerLens's own edges."""
    got, ed = bench.child(f"{shape.label} edge sweep", "edges", folder)
    tl_got, tl = bench.child(f"{shape.label} TL direct-path patching", "tl-edges", folder)
    tl_name = f"get_act_patch_direct_path L{shape.n_layers - 2}H0 -> L{shape.n_layers - 1}H*.k"
    per_edge = ed["seconds"] / ed["edges"] if ed else None
    notes = ""
    if ed:
        groups = ", ".join(f"{name} {ed['group_edges'][name]} edges {ed['group_edges'][name] / s:.2f}/s"
                           for name, s in ed["group_seconds"].items())
        notes = (f"{ed['edges']} edges, {ed['edges'] / ed['seconds']:.2f} edges/s, "
                 f"{per_edge / ed['forward_seconds']:.3f} of a forward ({ed['forward_seconds']:.2f} s); {groups}")
    subset = _row(shape, "edges", "edge sweep, s per edge (subset)", got, seconds=per_edge, notes=notes)
    subset.extra = ed or {}
    if ed is None and subset.status == "ok":
        subset.status = "no result"
    subset = _with_tl(subset, f"{tl_name}, s per edge (other edges)", tl_got,
                      tl["seconds"] / tl["edges"] if tl else None)
    same_notes = ""
    if ed and tl:
        diff = max(abs(a - b) for a, b in zip(ed["tl_edges_values"], tl["values"]))
        same_notes = f"{tl['edges']} edges; max |mean metric difference| {diff:.2e}"
    same = _row(shape, "edges-tl", f"edge sweep, TL's {shape.n_heads} edges (in-process)", got,
                seconds=ed["tl_edges_seconds"] if ed else None, notes=same_notes)
    if ed is None and same.status == "ok":
        same.status = "no result"
    return [subset, _with_tl(same, tl_name, tl_got, tl["seconds"] if tl else None)]


def measure_many(bench: Bench, shape: Shape) -> Row:
    """The 123-claim file on the small model."""
    folder = bench.work / "models" / shape.folder_name
    build_model(shape, folder)
    doc = many_claims(shape, folder)
    path = write_hypothesis(doc, bench.work / "hypotheses" / "many-claims.yaml")
    got, ev = bench.harness_run(f"small {len(doc['claims'])}-claim run", path)
    row = _row(shape, "many", f"{len(doc['claims'])}-claim run (harness run, defaults)", got, (0, 1, 3),
               notes=_run_notes(ev))
    row.size = "small"
    return row


# ------------------------------------------------------------------------------------------ reporting

def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.1f}"
    return f"{x:.{digits}g}"


def results_table(rows: list[Row]) -> str:
    """The Markdown results table."""
    from tabulate import tabulate

    body = [(r.size, r.shape, r.d_model, r.measurement, _fmt(r.seconds) if r.status == "ok" else r.status,
             _fmt(r.peak_mb), r.tl or "-", _fmt(r.tl_seconds) if r.tl_status in ("ok", "") else r.tl_status,
             _fmt(r.tl_peak_mb), _fmt(r.ratio), r.notes) for r in rows]
    headers = ["size", "layers x heads", "d_model", "measurement", "seconds", "peak MB", "TL equivalent",
               "TL seconds", "TL peak MB", "TL s / harness s", "notes"]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """b of the least-squares fit log y = a + b log x (None with fewer than two points)."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def growth(rows: list[Row]) -> list[dict[str, Any]]:
    """For every measured quantity at two or more sizes: consecutive ratios and the fitted exponent."""
    series: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        if r.size == "small":
            continue
        layers = int(r.shape.split("x")[0])
        for what, value, ok in ((f"{r.measurement}: seconds", r.seconds, r.status == "ok"),
                                (f"{r.measurement}: peak MB", r.peak_mb, r.status == "ok"),
                                (f"TL equivalent of {r.measurement}: seconds", r.tl_seconds, r.tl_status == "ok")):
            if ok and value:
                series.setdefault((what, r.key), {})[layers] = value
    out = []
    for (what, _), points in series.items():
        if len(points) < 2:
            continue
        ls = sorted(points)
        ratios = {f"{b}L/{a}L": points[b] / points[a] for a, b in zip(ls, ls[1:])}
        out.append({"quantity": what, "values": {f"{k}L": points[k] for k in ls}, "ratios": ratios,
                    "exponent": fit_exponent([float(k) for k in ls], [points[k] for k in ls])})
    return out


def growth_table(items: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    if not items:
        return "(one size measured: no growth to show)"
    ratio_names = list(dict.fromkeys(k for it in items for k in it["ratios"]))
    body = [(it["quantity"], *(_fmt(it["ratios"].get(k)) for k in ratio_names), _fmt(it["exponent"], 2))
            for it in items]
    return tabulate(body, headers=["quantity", *ratio_names, "exponent b (cost ~ layers^b)"], tablefmt="github",
                    disable_numparse=True)


def targets(rows: list[Row], target_layers: int = TARGETS_LAYERS) -> list[dict[str, Any]]:
    """PASS/MISS against each target (`not measured` when its row is absent)."""
    label = f"{target_layers}L"

    def find(key: str, size: str) -> Row | None:
        return next((r for r in rows if r.key == key and r.size == size), None)

    checks = [("five", label, "seconds", RUN_TARGET_S, f"{label} five-claim run under {RUN_TARGET_S:.0f} s wall"),
              ("five", label, "peak_mb", RUN_TARGET_MB, f"{label} five-claim run under 4 GiB peak RSS"),
              ("weights", label, "seconds", WEIGHTS_TARGET_S,
               f"{label} harness weights under {WEIGHTS_TARGET_S:.0f} s"),
              ("many", "small", "seconds", MANY_TARGET_S, f"123-claim run under {MANY_TARGET_S:.0f} s")]
    out: list[dict[str, Any]] = []
    for key, size, attr, limit, text in checks:
        r = find(key, size)
        if r is None:
            out.append({"target": text, "result": "not measured", "value": None})
            continue
        value = r.peak_mb if attr == "peak_mb" else r.seconds
        if attr == "seconds" and r.status != "ok":
            out.append({"target": text, "result": f"MISS ({r.status})", "value": None})
            continue
        ok = value is not None and value < limit
        out.append({"target": text, "result": "PASS" if ok else "MISS", "value": value})
    return out


def render(rows: list[Row], machine: dict[str, Any], target_layers: int = TARGETS_LAYERS) -> str:
    """Everything printed at the end: the table, the growth, the targets."""
    lines = [f"## Scale benchmark ({machine['cores']} cores, {machine['threads']} torch threads, load average "
             f"{machine['load_average']} at start; {N_PROMPTS} prompts, |S| = {SEGMENT})", "", results_table(rows),
             "", "### Growth with layers", "", growth_table(growth(rows)), "", "### Targets", ""]
    lines += [f"- {t['result']}: {t['target']}" + (f" ({_fmt(t['value'])})" if t["value"] is not None else "")
              for t in targets(rows, target_layers)]
    return "\n".join(lines)


def to_json(rows: list[Row], machine: dict[str, Any], target_layers: int = TARGETS_LAYERS) -> dict[str, Any]:
    return {"machine": machine, "rows": [{**asdict(r), "ratio": r.ratio} for r in rows],
            "growth": growth(rows), "targets": targets(rows, target_layers)}


def machine_info() -> dict[str, Any]:

    return {"cores": available_cores(), "threads": chosen(), "load_average": " ".join(f"{x:.2f}" for x in
                                                                                      os.getloadavg()),
            "python": sys.version.split()[0]}


@contextmanager
def workdir(keep: Path | None) -> Iterator[Path]:
    """--keep DIR (created if needed, kept), else a temporary directory removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        yield Path(tmp)


def parse_layers(text: str) -> list[int]:
    """'2,6,12' -> [2, 6, 12] (each at least 2: the five-claim file needs a route between layers)."""
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--layers {text!r}: a comma-separated list of layer counts, e.g. 2,6,12") from None
    if not layers or min(layers) < 2:
        raise UserError(f"--layers {text!r}: every model needs at least 2 layers")
    return sorted(set(layers))


def benchmark(layers: list[int], work: Path, timeout: float, tiny: bool = False, many: bool = True) -> list[Row]:
    """Build, write and measure every size, then the 123-claim file; the rows."""
    bench = Bench(work, timeout)
    rows: list[Row] = []
    for n in layers:
        rows += measure_size(bench, gpt2_shape(n, tiny))
    if many:
        rows.append(measure_many(bench, small_shape(tiny)))
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/scale_bench.py", description=__doc__.split("\n\n")[0],
                                epilog="What each row measures: see the module docstring (pydoc "
                                       "benchmarks/scale_bench.py).")
    p.add_argument("--layers", default="2,6,12", help="model sizes in layers (default 2,6,12)")
    p.add_argument("--keep", type=Path, metavar="DIR", help="build models and write files here (reused next time)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the numbers as JSON")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds before a measurement is killed and reported as a timeout "
                        f"(default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--threads", type=int, help="torch threads here and in every subprocess ($HARNESS_THREADS)")
    p.add_argument("--no-many", action="store_true", help="skip the 123-claim run")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # d_model 48 models, for the tests
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--prompts", type=int, default=N_PROMPTS, help=argparse.SUPPRESS)
    p.add_argument("--segment", type=int, default=SEGMENT, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.child:
        if a.model is None or a.out is None:
            raise UserError("--child needs --model and --out")
        return run_child(a.child, a.model, a.out, a.prompts, a.segment)

    layers = parse_layers(a.layers)
    if a.timeout <= 0:
        raise UserError("--timeout must be positive")
    if a.threads is not None:
        if a.threads < 1:
            raise UserError("--threads must be at least 1")
        os.environ["HARNESS_THREADS"] = str(a.threads)
    configure()
    machine = machine_info()
    target_layers = max(layers) if a.tiny else TARGETS_LAYERS
    with workdir(a.keep) as work:
        rows = benchmark(layers, work, a.timeout, a.tiny, not a.no_many)
    print(render(rows, machine, target_layers))
    if a.json is not None:
        a.json.write_text(json.dumps(to_json(rows, machine, target_layers), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
