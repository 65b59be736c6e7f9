"""Benchmark: edge attribution and the faithfulness curve on a GPT-2-small-shaped model.

    .venv/bin/python benchmarks/edge_discovery.py [--layers 12] [--prompts 50] [--tl-prompts N]
                                                  [--curve-prompts 100] [--threads 2] [--keep DIR]

In one run, on one random-weight GPT-2 model (12 layers x 12 heads, d_model 768, vocabulary
50257 by default: GPT-2 small's shape, built locally with `transformers`, seed 0) and
repeated-token prompts (BOS 50256 + a 20-token segment twice, 41 tokens), with the same
torch threads for every contender:

1. harness's EAP scores of every edge of the graph (32,491 edges for GPT-2 small: embed,
   heads and MLPs into every later head's q/k/v, MLP input and the logits), denoising
   (TransformerLens's direction), over `--prompts` prompts: the base runs (clean and
   corrupted, caching what the graph reads) and the scores (`mech.graph.attribution.edge_scores`),
   timed apart;
2. TransformerLens 4.3's `attribution_patch(..., EdgeAttributionConfig(granularity="edge"))`,
   which scores one clean/corrupted pair per call, looped over the first `--tl-prompts`
   prompts (default: all of them); only the calls are timed (mapping its per-position edges
   to harness's is not). Its edges summed over positions and averaged over those prompts are
   compared with harness's scores on the same prompts: the largest difference, absolute and
   relative to the largest score;
3. EAP-IG (5 steps, noising) on the same prompts: the ranking of step 4;
4. the faithfulness curve of `harness discover` (`tools.curve.faithfulness_curve`: 10
   circuits of the top-k edges, k at MIB's fractions, every other edge resampled; plus the
   full and empty circuits; BCa intervals and CPR/CMD with 1000 resamples) on
   `--curve-prompts` other prompts (seed 1), with their base runs timed apart.  Its metric is
   `kl` (minus the KL divergence from the clean run's next-token distribution): a random
   model does not copy, so the log-probability's clean-corrupted gap is about 0 and its
   faithfulness undefined, while the KL gap is positive on every prompt (small on random
   weights, so the curve's gap thresholds are 0: the curve's numbers mean little here, its
   time is what is measured).

When TransformerLens runs fewer prompts than harness, its time is scaled to `--prompts`
(it is one call per pair, so linear in the prompts) and the line says so.  The last line is
`speedup vs TransformerLens: <ratio>x, max abs diff <diff>` (harness's time: base runs plus
scores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scale_files import build_model, gpt2_shape  # benchmarks/ is on sys.path when run as a script

from harness.data import dataset as data
from harness.mech.graph import attribution
from harness.mech.graph import parts as graph_parts
from harness.mech.graph.structure import Graph
from harness.mech.runs.build import base_runs
from harness.mech.runs.cached import Runs
from harness.model.ref import ModelRef
from harness.spec.settings import Stats
from harness.spec.vocabulary import Direction
from harness.tools import curve, discover

SEGMENT, BOS = 20, 50256
# a random model's outputs are near uniform: its KL gap is small (about 0.07 nats), so the
# thresholds on the gap are lowered; what this measures is time
CURVE_STATS = Stats(bootstrap=1000, permutations=2000, min_gap=0.0, min_prompt_gap=0.0)


def say(line: str) -> None:
    print(line, flush=True)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def runs_on(bridge: Any, n_layers: int, vocab: int, n: int, seed: int, first: int | None = None,
            metric: str = "logprob") -> Runs:
    """Base runs of n repeated-token prompts (or of their `first` ones)."""
    ds = data.repeated_tokens(n, SEGMENT, vocab, seed=seed, bos_token=min(BOS, vocab - 1))
    if first is not None:
        ds = ds.select(list(range(first)))
    return base_runs(bridge, ds, graph_parts.cache_names(n_layers, True), metric)


def scores(runs: Runs, method: str, direction: str) -> attribution.Scores:
    return runs.edge_scores(method, direction=direction)


# ---------------------------------------------------------------- TransformerLens's side
def tl_scores(runs: Runs, g: Graph, n: int) -> tuple[float, np.ndarray]:
    """(seconds in attribution_patch, [U, V] edge scores summed over positions, mean over the
    first n prompts)."""
    import torch
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    ds = runs.ds
    index = {}
    for e, u, v in zip(g.edges(), *g.edge_index(), strict=True):
        for p in range(ds.clean.shape[1]):
            index[attribution.transformer_lens_nodes(e, p, g.n_layers)] = (u, v)
    out = np.zeros(g.adjacency.shape)
    seconds = 0.0
    for i in range(n):
        pos, idx = ds.positions[i:i + 1], torch.tensor([i])

        def metric(logits: Any, pos: Any = pos, idx: Any = idx) -> Any:
            at = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
            assert runs.metric_rows is not None
            return runs.metric_rows(at, idx).sum()

        took, res = timed(lambda i=i, metric=metric: attribution_patch(
            runs.bridge, ds.clean[i:i + 1], ds.corrupted[i:i + 1], metric, EdgeAttributionConfig(granularity="edge")))
        seconds += took
        for pair, value in res.edge_scores.items():
            u, v = index[pair]
            out[u, v] += float(value) / n
        say(f"  TransformerLens pair {i + 1}/{n}: {took:.1f} s")
    return seconds, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--prompts", type=int, default=50, help="prompts attributed (default 50)")
    p.add_argument("--tl-prompts", type=int, default=None, help="prompts TransformerLens runs (default: all)")
    p.add_argument("--curve-prompts", type=int, default=100, help="prompts of the faithfulness curve (default 100)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keep", type=Path, metavar="DIR", help="build the model here (reused next time)")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    tl_n = min(a.tl_prompts or a.prompts, a.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        shape = gpt2_shape(a.layers)
        folder = (a.keep or Path(tmp)) / shape.folder_name
        built, _ = timed(lambda: build_model(shape, folder))
        say(f"model {shape.folder_name} ({built:.0f} s to build or find); {a.threads} thread(s)")
        m = ModelRef.parse(str(folder)).load("cpu")
        g = Graph.of(m.bridge)
        say(f"graph: {g.n_edges} edges")

        base_s, runs = timed(lambda: runs_on(m.bridge, m.n_layers, m.d_vocab, a.prompts, 0))
        eap_s, eap = timed(lambda: scores(runs, "eap", Direction.DENOISING))
        harness_s = base_s + eap_s
        say(f"harness EAP, {g.n_edges} edges, {a.prompts} prompts: {harness_s:.1f} s (base runs {base_s:.1f} s, "
            f"scores {eap_s:.1f} s)")
        mine = eap.total
        if tl_n < a.prompts:  # harness's scores on the prompts TransformerLens runs
            mine = scores(runs_on(m.bridge, m.n_layers, m.d_vocab, a.prompts, 0, tl_n), "eap",
                          Direction.DENOISING).total
        tl_s, theirs = tl_scores(runs, g, tl_n)
        scaled = tl_s * a.prompts / tl_n
        note = "" if tl_n == a.prompts else f" (measured on {tl_n} prompts: {tl_s:.1f} s, scaled to {a.prompts})"
        scale = float(np.abs(theirs).max())
        diff = float(np.abs(mine - theirs).max())
        outside = int(np.count_nonzero(theirs[~g.adjacency]))
        say(f"TransformerLens attribution_patch, one pair per call: {scaled:.1f} s for {a.prompts} prompts "
            f"({tl_s / tl_n:.2f} s per pair){note}")
        say(f"scores compared on {tl_n} prompts: max abs diff {diff:.3g}, largest score {scale:.3g} "
            f"(relative {diff / scale:.2g}); TransformerLens edges outside harness's graph with a score: {outside}")

        ig_s, ig = timed(lambda: scores(runs, "eap-ig", Direction.NOISING))
        say(f"harness EAP-IG (5 steps), {a.prompts} prompts: {ig_s:.1f} s (scores only)")
        order = discover.ranking(ig.per_position, g, "abs")
        curve_base_s, conf = timed(lambda: runs_on(m.bridge, m.n_layers, m.d_vocab, a.curve_prompts, 1,
                                                        metric="kl"))
        curve_s, fc = timed(lambda: curve.faithfulness_curve(
            conf, g, order, CURVE_STATS, 0, "nats", []))
        points = ", ".join(f"k={pt['k']}: {pt['faithfulness']:.3f}" for pt in fc.points)
        say(f"faithfulness curve, 10 values of k (+ full and empty), {a.curve_prompts} prompts: {curve_s:.1f} s "
            f"(+ base runs {curve_base_s:.1f} s): {points}; CPR {fc.summaries['CPR']['value']:.3f}, "
            f"CMD {fc.summaries['CMD']['value']:.3f}")
    say(f"speedup vs TransformerLens: {scaled / harness_s:.1f}x, max abs diff {diff:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
