"""Benchmark: all-edges exact edge patching, harness vs TransformerLens.

    python -m harness.tools.bench [--prompts N]

In one run, on one model and one prompt batch: a Hugging Face GPT-2-architecture
model (2 layers x 8 heads, random weights, saved to a temporary directory and
booted with `boot_transformers`, where TransformerLens's direct-path patching is
supported), every head -> later head .q/.k/.v edge, denoising (TransformerLens's
direction).  Times (1) `transformer_lens.patching.get_act_patch_direct_path_all_sources`
for q, k and v, (2) the harness per-edge path (one hooked forward per edge) and
(3) the harness batched path; checks all three agree; measures the batched path's
peak memory under two chunk budgets (each in a fresh process); and times
`harness validate` and `harness --help` against `python -c "import transformer_lens"`.
The last line is `speedup vs TransformerLens: <ratio>x, max abs diff <diff>`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.mech import batched_edges
from harness.mech import patching as P
from harness.mech.hooks import cache_hooks
from harness.model import data, metrics
from harness.model.loading import load_model

N_LAYERS, N_HEADS, D_MODEL, VOCAB, CTX = 2, 8, 64, 128, 64


def build_model(folder: Path) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=D_MODEL, n_layer=N_LAYERS,
                                  n_head=N_HEADS)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    return load_model(folder).bridge


def setup(folder: Path, n_prompts: int) -> tuple[Any, Any, Any, Any]:
    bridge = build_model(folder)
    ds = data.repeated_tokens(n_prompts, 20, VOCAB, seed=0)
    hooks = batched_edges.cache_names(N_LAYERS)
    return bridge, ds, cache_hooks(bridge, ds.clean, hooks), cache_hooks(bridge, ds.corrupted, hooks)


def edges():
    return batched_edges.all_edges(N_LAYERS, N_HEADS, embed=False, logits=False)


def metric_fns(ds):
    def per_prompt(logits, pos):
        return metrics.per_prompt(logits, pos, ds.answers.repeat(logits.shape[0] // ds.n, 1), "logprob")

    def scalar(logits):  # what TransformerLens's sweep gets
        return metrics.per_prompt(logits, ds.positions, ds.answers, "logprob").mean()

    return per_prompt, scalar


def run_tl(bridge, ds, scalar):
    import torch
    from transformer_lens.patching import get_act_patch_direct_path_all_sources

    _, clean_cache = bridge.run_with_cache(ds.clean)
    _, corrupt_cache = bridge.run_with_cache(ds.corrupted)
    t = time.perf_counter()
    with torch.no_grad():
        res = {x: get_act_patch_direct_path_all_sources(bridge, ds.corrupted, clean_cache, corrupt_cache, scalar,
                                                        component=x, verbose=False)  # type: ignore[arg-type]
               for x in "qkv"}
    return time.perf_counter() - t, res


def _warm_tl(bridge: Any, ds: Any, scalar: Any) -> None:
    from transformer_lens.patching import get_act_patch_direct_path

    _, clean_cache = bridge.run_with_cache(ds.clean)
    _, corrupt_cache = bridge.run_with_cache(ds.corrupted)
    get_act_patch_direct_path(bridge, ds.corrupted, clean_cache, corrupt_cache, scalar, 0, 0, "q", verbose=False)


def run_per_edge(bridge, ds, clean, corrupt, es):
    t = time.perf_counter()
    vals = [float(metrics.per_prompt(P.fast_logits(bridge, ds.corrupted, P.prepare(bridge, e, corrupt, clean,
                                                                                  "resample")),
                                     ds.positions, ds.answers, "logprob").mean()) for e in es]
    return time.perf_counter() - t, vals


def run_batched(bridge, ds, clean, corrupt, es, per_prompt, budget):
    t = time.perf_counter()
    vals = batched_edges.batched_metrics(bridge, es, corrupt, clean, clean, ds.positions, per_prompt, "resample",
                                 budget_bytes=budget).mean(1)
    return time.perf_counter() - t, [float(v) for v in vals]


def memory_probe(budget_mb: int, repeat: int, n_prompts: int) -> None:
    """(subprocess) peak RSS above the pre-sweep RSS during one batched sweep, in MiB
    (RSS sampled every millisecond by a thread), printed as JSON."""
    import threading

    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        bridge, ds, clean, corrupt = setup(Path(tmp) / "m", n_prompts)
        per_prompt, _ = metric_fns(ds)
        es = edges() * repeat
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


def timed(cmd: list[str], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=50)
    p.add_argument("--memory-probe", type=int, metavar="BUDGET_MB", help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.memory_probe:
        memory_probe(a.memory_probe, a.repeat, a.prompts)
        return 0
    import torch

    torch.set_num_threads(1)  # the same single thread for every contender
    with tempfile.TemporaryDirectory() as tmp:
        bridge, ds, clean, corrupt = setup(Path(tmp) / "m", a.prompts)
        per_prompt, scalar = metric_fns(ds)
        es = edges()
        # warm-up of each contender on a small piece, so no one pays first-call costs in the timing
        run_per_edge(bridge, ds, clean, corrupt, es[:2])
        run_batched(bridge, ds, clean, corrupt, es[:48], per_prompt, 32 * 2**20)
        _warm_tl(bridge, ds, scalar)
        print(f"model: GPT-2 architecture, {N_LAYERS} layers x {N_HEADS} heads, d_model {D_MODEL}; "
              f"{a.prompts} prompts of length {ds.seq_len}; {len(es)} edges (head -> later head .q/.k/.v), "
              "denoising; 1 thread")
        t_tl, tl = run_tl(bridge, ds, scalar)
        t_slow, slow = run_per_edge(bridge, ds, clean, corrupt, es)
        t_fast, fast = run_batched(bridge, ds, clean, corrupt, es, per_prompt, 32 * 2**20)
    tl_vals = [float(tl[e.receiver.which][e.sender.layer, e.sender.head, e.receiver.head.layer,
                                          e.receiver.head.head]) for e in es]
    diff_tl = max(abs(x - y) for x, y in zip(fast, tl_vals))
    diff_slow = max(abs(x - y) for x, y in zip(fast, slow))
    print(f"TransformerLens get_act_patch_direct_path_all_sources (q, k, v): {t_tl:8.2f} s")
    print(f"harness per-edge path (one forward per edge):                 {t_slow:8.2f} s")
    print(f"harness batched path:                                         {t_fast:8.2f} s")
    print(f"speed ratios: batched vs TransformerLens {t_tl / t_fast:.1f}x, batched vs per-edge "
          f"{t_slow / t_fast:.1f}x")
    print(f"agreement (mean metric per edge): batched vs TransformerLens {diff_tl:.2e}, batched vs per-edge "
          f"{diff_slow:.2e}")
    for budget, repeat in ((16, 1), (16, 4), (128, 1), (128, 4)):
        out = subprocess.run([sys.executable, "-m", "harness.tools.bench", "--memory-probe", str(budget), "--repeat",
                              str(repeat), "--prompts", "400"], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"peak memory of the batched sweep (400 prompts), budget {r['budget_mb']:3d} MiB, "
              f"{r['edges']:3d} edges: {r['peak_growth_mb']:7.1f} MiB")
    hyp = Path(__file__).resolve().parents[2] / "hypotheses" / "induction.yaml"
    exe = [sys.executable, "-m", "harness"]
    t_import = timed([sys.executable, "-c", "import transformer_lens"])
    t_validate = timed(exe + ["validate", str(hyp)])
    t_help = timed(exe + ["--help"])
    print(f"start-up: import transformer_lens {t_import:.2f} s; harness validate {t_validate:.2f} s "
          f"({t_validate / t_import:.2f} of it); harness --help {t_help:.2f} s ({t_help / t_import:.2f} of it)")
    print(f"speedup vs TransformerLens: {t_tl / t_fast:.1f}x, max abs diff {diff_tl:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
