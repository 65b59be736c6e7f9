"""Benchmark: all-edges exact edge patching, harness vs TransformerLens.

    .venv/bin/python benchmarks/edge_sweep.py [--layers N] [--prompts N] [--repeats R] [--tl-repeats R]

In one run, on one model and one prompt batch: a Hugging Face GPT-2-architecture
model (N layers, default 2, x 8 heads, d_model 64, random weights, saved to a
temporary directory and booted with `boot_transformers`, where TransformerLens's
direct-path patching is supported), every head -> later head .q/.k/.v edge,
denoising (TransformerLens's direction), one thread for every contender.  Times

1. `transformer_lens.patching.get_act_patch_direct_path_all_sources` for q, k and v;
2. the harness per-edge path (one hooked forward per edge), once;
3. the harness batched path (`mech.edges.batched.batched_metrics`, 32 MiB chunk
   budget, the `harness scan` default);
4. one plain forward of the same prompt batch, the unit of the per-edge cost;

(1) and (3) alternate, `--tl-repeats` (default 3 up to 3 layers, else 1) and
`--repeats` (default 3) times, and their medians are compared, by wall-clock time
and by process CPU time (which another job on a shared machine disturbs less).
Checks that the three agree; measures the batched path's peak memory under two
chunk budgets, with 1x and 4x the edges, each in a fresh process (400 prompts;
the edges into layer 1, from head L0H0 only when there are more than 2 layers);
and times `harness validate` and `harness --help` against `python -c "import
transformer_lens"`.  The last line is `speedup vs TransformerLens: <ratio>x, max
abs diff <diff>`: the ratio of the median wall-clock times of (1) and (3), and the
largest difference between their per-edge metrics.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.data import dataset as data
from harness.mech.edges import batched, sets
from harness.mech.edges import patching as P
from harness.mech.hooks import cache_hooks
from harness.model import metrics
from harness.model.ref import load_model

N_HEADS, D_MODEL, VOCAB, CTX = 8, 64, 128, 64
BUDGET_MB = 32  # the batched path's chunk budget in the timed runs (harness scan's default)


def build_model(folder: Path, n_layers: int = 2) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=D_MODEL, n_layer=n_layers,
                                  n_head=N_HEADS)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    return load_model(folder).bridge


def setup(folder: Path, n_prompts: int, n_layers: int = 2) -> tuple[Any, Any, Any, Any]:
    bridge = build_model(folder, n_layers)
    ds = data.repeated_tokens(n_prompts, 20, VOCAB, seed=0)
    hooks = sets.cache_names(n_layers)
    return bridge, ds, cache_hooks(bridge, ds.clean, hooks), cache_hooks(bridge, ds.corrupted, hooks)


def edges(n_layers: int = 2) -> list:
    return sets.all_edges(n_layers, N_HEADS, embed=False, logits=False)


def probe_edges(n_layers: int) -> list:
    """The memory probe's edges: those into layer 1 (the most downstream work), from L0H0 only
    beyond 2 layers (the probe runs 400 prompts)."""
    into = [e for e in edges(n_layers) if e.receiver.head.layer == 1]
    return into if n_layers <= 2 else [e for e in into if e.sender.layer == 0 and e.sender.head == 0]


def metric_fns(ds: Any) -> tuple[Callable, Callable]:
    repeated: dict[int, Any] = {}

    def per_prompt(logits: Any, pos: Any) -> Any:  # what the batched path gets (scan's metric)
        times = logits.shape[0] // ds.n
        if times not in repeated:
            repeated[times] = ds.answers.repeat(times, 1)
        return metrics.per_prompt(logits, pos, repeated[times], "logprob")

    def scalar(logits: Any) -> Any:  # what TransformerLens's sweep gets
        return metrics.per_prompt(logits, ds.positions, ds.answers, "logprob").mean()

    return per_prompt, scalar


def clocks(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall-clock seconds, process CPU seconds, result) of fn()."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t, time.process_time() - c, out


def run_tl(bridge: Any, ds: Any, scalar: Callable) -> tuple[float, float, dict]:
    import torch
    from transformer_lens.patching import get_act_patch_direct_path_all_sources

    _, clean_cache = bridge.run_with_cache(ds.clean)
    _, corrupt_cache = bridge.run_with_cache(ds.corrupted)

    def sweep() -> dict:
        with torch.no_grad():
            return {x: get_act_patch_direct_path_all_sources(bridge, ds.corrupted, clean_cache, corrupt_cache,
                                                             scalar, component=x,  # type: ignore[arg-type]
                                                             verbose=False)
                    for x in "qkv"}

    return clocks(sweep)


def _warm_tl(bridge: Any, ds: Any, scalar: Callable) -> None:
    from transformer_lens.patching import get_act_patch_direct_path

    _, clean_cache = bridge.run_with_cache(ds.clean)
    _, corrupt_cache = bridge.run_with_cache(ds.corrupted)
    get_act_patch_direct_path(bridge, ds.corrupted, clean_cache, corrupt_cache, scalar, 0, 0, "q", verbose=False)


def run_per_edge(bridge: Any, ds: Any, clean: dict, corrupt: dict, es: list) -> tuple[float, list[float]]:
    t = time.perf_counter()
    vals = [float(metrics.per_prompt(P.fast_logits(bridge, ds.corrupted, P.prepare(bridge, e, corrupt, clean,
                                                                                  "resample"), base=corrupt),
                                     ds.positions, ds.answers, "logprob").mean()) for e in es]
    return time.perf_counter() - t, vals


def run_batched(bridge: Any, ds: Any, clean: dict, corrupt: dict, es: list, per_prompt: Callable,
                budget: int) -> tuple[float, list[float]]:
    wall, _, vals = batched_clocks(bridge, ds, clean, corrupt, es, per_prompt, budget)
    return wall, vals


def batched_clocks(bridge: Any, ds: Any, clean: dict, corrupt: dict, es: list, per_prompt: Callable,
                   budget: int) -> tuple[float, float, list[float]]:
    """(wall-clock s, CPU s, mean metric per edge) of one batched sweep."""
    wall, cpu, vals = clocks(lambda: batched.batched_metrics(
        bridge, es, corrupt, clean, clean, ds.positions, per_prompt, replacement="resample", budget_bytes=budget))
    return wall, cpu, [float(v) for v in vals.mean(1)]


def forward_seconds(bridge: Any, tokens: Any, repeats: int) -> float:
    """Median wall-clock seconds of one plain forward of `tokens` (no hooks, no grad)."""
    import torch

    times = []
    with torch.no_grad():
        bridge(tokens)
        for _ in range(repeats):
            t = time.perf_counter()
            bridge(tokens)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def memory_probe(budget_mb: int, repeat: int, n_prompts: int, n_layers: int) -> None:
    """(subprocess) peak RSS above the pre-sweep RSS during one batched sweep, in MiB
    (RSS sampled every millisecond by a thread), printed as JSON."""
    import threading

    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        bridge, ds, clean, corrupt = setup(Path(tmp) / "m", n_prompts, n_layers)
        per_prompt, _ = metric_fns(ds)
        es = probe_edges(n_layers) * repeat
        _release_freed_memory()
        proc = psutil.Process()
        before, peak, done = proc.memory_info().rss, [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                time.sleep(0.001)

        t = threading.Thread(target=sample)
        t.start()
        run_batched(bridge, ds, clean, corrupt, es, per_prompt, budget_mb * 2**20)
        done.set()
        t.join()
    print(json.dumps({"budget_mb": budget_mb, "edges": len(es), "peak_growth_mb": (peak[0] - before) / 2**20}))


def _release_freed_memory() -> None:
    """Return memory freed by the set-up to the system (glibc's malloc_trim), so the sweep's
    allocations show in the RSS rather than reusing it unseen (elsewhere: nothing)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def timed(cmd: list[str], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _memory_lines(n_layers: int) -> None:
    for budget, repeat in ((16, 1), (16, 4), (128, 1), (128, 4)):
        out = subprocess.run([sys.executable, __file__, "--memory-probe", str(budget), "--repeat",
                              str(repeat), "--prompts", "400", "--layers", str(n_layers)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"peak memory of the batched sweep (400 prompts), budget {r['budget_mb']:3d} MiB, "
              f"{r['edges']:3d} edges into layer 1: {r['peak_growth_mb']:7.1f} MiB")


def _startup_line() -> None:
    hyp = Path(__file__).resolve().parents[1] / "hypotheses" / "induction.yaml"
    exe = [sys.executable, "-m", "harness"]
    t_import = timed([sys.executable, "-c", "import transformer_lens"])
    t_validate = timed(exe + ["validate", str(hyp)])
    t_help = timed(exe + ["--help"])
    print(f"start-up: import transformer_lens {t_import:.2f} s; harness validate {t_validate:.2f} s "
          f"({t_validate / t_import:.2f} of it); harness --help {t_help:.2f} s ({t_help / t_import:.2f} of it)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2, help="layers of the benchmark model (8 heads each; default 2)")
    p.add_argument("--prompts", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3, help="timed batched sweeps and forwards (median; default 3)")
    p.add_argument("--tl-repeats", type=int, help="timed TransformerLens sweeps (default 3 up to 3 layers, else 1)")
    p.add_argument("--memory-probe", type=int, metavar="BUDGET_MB", help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.layers < 2 or a.repeats < 1 or (a.tl_repeats is not None and a.tl_repeats < 1):
        p.error("--layers >= 2, --repeats >= 1 and --tl-repeats >= 1 are required")
    if a.memory_probe:
        memory_probe(a.memory_probe, a.repeat, a.prompts, a.layers)
        return 0
    import torch

    torch.set_num_threads(1)  # the same single thread for every contender
    tl_repeats = a.tl_repeats or (3 if a.layers <= 3 else 1)
    budget = BUDGET_MB * 2**20
    with tempfile.TemporaryDirectory() as tmp:
        bridge, ds, clean, corrupt = setup(Path(tmp) / "m", a.prompts, a.layers)
        per_prompt, scalar = metric_fns(ds)
        es = edges(a.layers)
        # warm-up of each contender on a small piece, so no one pays first-call costs in the timing
        run_per_edge(bridge, ds, clean, corrupt, es[:2])
        run_batched(bridge, ds, clean, corrupt, es[:48], per_prompt, budget)
        _warm_tl(bridge, ds, scalar)
        print(f"model: GPT-2 architecture, {a.layers} layers x {N_HEADS} heads, d_model {D_MODEL}; "
              f"{a.prompts} prompts of length {ds.seq_len}; {len(es)} edges (head -> later head .q/.k/.v), "
              "denoising; 1 thread")
        t_forward = forward_seconds(bridge, ds.corrupted, max(5, a.repeats))
        tl_runs: list[tuple[float, float, dict]] = []
        fast_runs: list[tuple[float, float, list[float]]] = []
        for i in range(max(tl_repeats, a.repeats)):  # alternate, so both meet the same machine load
            if i < tl_repeats:
                tl_runs.append(run_tl(bridge, ds, scalar))
            if i < a.repeats:
                fast_runs.append(batched_clocks(bridge, ds, clean, corrupt, es, per_prompt, budget))
        t_slow, slow = run_per_edge(bridge, ds, clean, corrupt, es)
    tl: dict = tl_runs[0][2]
    fast: list[float] = fast_runs[0][2]
    tl_vals = [float(tl[e.receiver.which][e.sender.layer, e.sender.head, e.receiver.head.layer,
                                          e.receiver.head.head]) for e in es]
    diff_tl = max(abs(x - y) for x, y in zip(fast, tl_vals))
    diff_slow = max(abs(x - y) for x, y in zip(fast, slow))
    t_tl, c_tl = statistics.median([r[0] for r in tl_runs]), statistics.median([r[1] for r in tl_runs])
    t_fast, c_fast = statistics.median([r[0] for r in fast_runs]), statistics.median([r[1] for r in fast_runs])
    per_edge = t_fast / len(es)
    print(f"one plain forward of the {a.prompts} prompts (median of {max(5, a.repeats)}): {t_forward * 1e3:.1f} ms")
    print(f"TransformerLens get_act_patch_direct_path_all_sources (q, k, v): {t_tl:8.2f} s "
          f"(median of {len(tl_runs)}: {_runs([r[0] for r in tl_runs])} s)")
    print(f"harness per-edge path (one forward per edge):                 {t_slow:8.2f} s (one run)")
    print(f"harness batched path ({BUDGET_MB} MiB chunks):                         {t_fast:8.2f} s "
          f"(median of {len(fast_runs)}: {_runs([r[0] for r in fast_runs])} s)")
    print(f"batched cost per edge: {per_edge * 1e3:.2f} ms = {per_edge / t_forward:.3f} of one plain forward "
          f"of the same {a.prompts} prompts ({len(es)} edges)")
    print(f"speed ratios: batched vs TransformerLens {t_tl / t_fast:.1f}x wall-clock, {c_tl / c_fast:.1f}x CPU time; "
          f"batched vs per-edge {t_slow / t_fast:.1f}x")
    print(f"agreement (mean metric per edge): batched vs TransformerLens {diff_tl:.2e}, batched vs per-edge "
          f"{diff_slow:.2e}")
    _memory_lines(a.layers)
    _startup_line()
    print(f"speedup vs TransformerLens: {t_tl / t_fast:.1f}x, max abs diff {diff_tl:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
