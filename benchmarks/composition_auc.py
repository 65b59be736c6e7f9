"""Weights against use, measured: how well does a composition statistic predict which
head -> head-input edges a model uses?

    .venv/bin/python benchmarks/composition_auc.py MODEL [--receivers 16,17,18] [--modes k]
                                                  [--n-prompts 20] [--segment-length 10] [--seed 0]
                                                  [--data FILE.yaml] [--metric logprob] [--save rows.json]

Every edge from an earlier head into the q/k/v inputs (`--modes`) of every head of the
`--receiver` layers (default: all layers) is patched exactly (noising, resample, the
repeated-tokens generator's explore split, first_half corruption, or `--data`: a YAML file's
data mapping on its explore split, with `--metric`; claims.edge_test: BH over
the edges, `used` as an edge claim decides it with the default stats).  Beside each edge's
use, its composition statistics (mech.weights.factored on folded weights): the score C, the rotation
null's p-value (uncorrected, 1,000 draws; the tail bound below the Monte Carlo floor) and the
peer ratio C / median(peers) (mech.weights.scores.stands_out).  Printed per statistic: the area
under the ROC curve for telling `used` edges from the rest (the Mann-Whitney U over the two
groups: the probability that a used edge outranks an unused one; 0.5 is chance), and the
share of used edges among the edges the rule "composes" picks (p < 0.01 alone, and with the
peer ratio >= 1.3).  Cost: the base runs (2 forwards) and the batched patches, from each
receiver's layer on (stage lines on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import rankdata, spearmanr


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(a positive outranks a negative), ties counted half: the normalised Mann-Whitney U."""
    ok = ~np.isnan(score)
    s, y = score[ok], positive[ok]
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    ranks = rankdata(s)
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _num(x: float) -> float | None:
    return None if x != x else float(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--receivers", default="", help="receiver layers, comma-separated (default: all)")
    ap.add_argument("--modes", default="qkv")
    ap.add_argument("--n-prompts", type=int, default=20)
    ap.add_argument("--segment-length", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="", help="the prompts of a YAML file's data mapping (a hypothesis or data "
                                               "file; its explore split) instead of the repeated-tokens generator")
    ap.add_argument("--metric", default="logprob")
    ap.add_argument("--show", type=int, default=10, help="list the top edges by C and the used ones (stderr)")
    ap.add_argument("--save", default="", help="write every edge's row (statistics, effect, use) to this JSON file")
    args = ap.parse_args(argv)

    from harness.claims.edge_test import USED, EdgeTestSpec, edge_tests
    from harness.data.sources import generated
    from harness.engine.data_source import build_dataset, from_data_file
    from harness.mech.runs.build import base_runs
    from harness.mech.weights import scores
    from harness.mech.weights.factored import Composition
    from harness.model import metrics
    from harness.model.devices import of
    from harness.model.ref import load_model
    from harness.progress import progress
    from harness.spec import names
    from harness.spec.settings import Stats
    from harness.spec.vocabulary import Direction, Replacement
    from harness.tools.scan import scan_hooks

    t0 = time.perf_counter()
    m = load_model(args.model)
    L, H = m.n_layers, m.n_heads
    layers = [int(x) for x in args.receivers.split(",")] if args.receivers else list(range(1, L))
    edges = [names.Edge(names.Head(l1, h1), names.HeadInput(names.Head(l2, h2), w))
             for l2 in layers for h2 in range(H) for w in args.modes for l1 in range(l2) for h1 in range(H)]
    print(f"{args.model}: {len(edges)} edges into layers {layers} ({args.modes})", file=sys.stderr)
    if args.data:
        spec, source = from_data_file(Path(args.data), "explore")
        ds = build_dataset(spec, source, m)
    else:
        ds = generated(m, args.n_prompts, args.segment_length, "composition_auc", seed=args.seed, split="explore",
                       corruptions=("first_half",), n_ctx=m.n_ctx, vocab_max=min(m.d_vocab, m.d_vocab_out))
    ds = ds.to(of(m.bridge))
    runs = base_runs(m.bridge, ds, scan_hooks(L, m.has_mlp), args.metric)
    runs.patched_many(edges, Direction.NOISING, Replacement.RESAMPLE, progress=progress)
    st = Stats(bootstrap=500, permutations=2000)  # as harness scan: use status, not publication intervals
    tests = edge_tests(runs, [EdgeTestSpec(e, seed=i) for i, e in enumerate(edges)], st, metrics.get(args.metric).unit,
                       progress=progress)
    used = np.array([t.use == USED for t in tests])
    print(f"patched in {time.perf_counter() - t0:.0f} s; {int(used.sum())} of {len(edges)} edges used", file=sys.stderr)

    comp = Composition(scores.head_weights(m.bridge, "folded"), args.seed)
    at = [(e.sender.layer, e.sender.head, e.receiver.head.layer, e.receiver.head.head) for e in edges]
    by_mode = {w: (comp.scores(w), comp.p_values(w, 1000)[0], comp.peer_ratios(w)) for w in args.modes}
    score = np.array([by_mode[e.receiver.which][0][a] for e, a in zip(edges, at, strict=True)])
    p = np.array([by_mode[e.receiver.which][1][a] for e, a in zip(edges, at, strict=True)])
    ratio = np.array([by_mode[e.receiver.which][2][a] for e, a in zip(edges, at, strict=True)])
    null_rule = p < st.composition_alpha
    peer_rule = np.array([scores.composes(pi, None if ri != ri else ri, st.composition_alpha,
                                           st.composition_min_ratio) for pi, ri in zip(p, ratio, strict=True)])
    top = np.argsort(-np.nan_to_num(score))[:args.show]
    for i in sorted(set(top) | set(np.flatnonzero(used)[:args.show]), key=lambda i: -np.nan_to_num(score[i])):
        print(f"  {edges[i]}: C {score[i]:.3f}, p {p[i]:.2g}, peer ratio {ratio[i]:.2f}, "
              f"{'used' if used[i] else tests[i].use}", file=sys.stderr)
    print(f"\n{args.model}: {len(edges)} edges, {int(used.sum())} used ({used.mean():.1%}); "
          f"{time.perf_counter() - t0:.0f} s")
    print("| statistic | AUC for used edges |")
    print("|---|---|")
    print(f"| composition score C | {auc(score, used):.3f} |")
    print(f"| rotation null, 1 - p | {auc(-p, used):.3f} |")
    print(f"| peer ratio C / median(peers) | {auc(ratio, used):.3f} |")
    effect = np.array([np.nan if t.effect.norm.interval is None else t.effect.norm.interval.estimate
                       for t in tests])
    print("\n| statistic | Spearman correlation with the edge's effect |")
    print("|---|---|")
    for name, stat in (("composition score C", score), ("rotation null, 1 - p", -p), ("peer ratio", ratio)):
        ok = ~np.isnan(stat) & ~np.isnan(effect)
        print(f"| {name} | {spearmanr(stat[ok], effect[ok]).statistic:.3f} |")
    if args.save:
        rows = [{"edge": str(e), "C": _num(score[i]), "p": _num(p[i]), "peer_ratio": _num(ratio[i]),
                 "effect": _num(effect[i]), "use": tests[i].use} for i, e in enumerate(edges)]
        with open(args.save, "w") as f:
            json.dump({"model": args.model, "n_prompts": args.n_prompts, "segment_length": args.segment_length,
                       "seed": args.seed, "edges": rows}, f, indent=1)
    best = np.argsort(-np.nan_to_num(effect, nan=-np.inf))[:5]
    print("\nlargest effects: " + "; ".join(f"{edges[i]} {effect[i]:.3f} (C {score[i]:.3f}, peer ratio "
                                              f"{ratio[i]:.2f}, {tests[i].use})" for i in best))
    print("\n| rule | edges it calls composing | of them used | used edges it misses |")
    print("|---|---|---|---|")
    for name, rule in (("p < 0.01 (null alone)", null_rule), ("p < 0.01 and peer ratio >= 1.3", peer_rule)):
        print(f"| {name} | {int(rule.sum())} ({rule.mean():.1%}) | "
              f"{(used[rule].mean() if rule.any() else float('nan')):.1%} | {int((used & ~rule).sum())} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
