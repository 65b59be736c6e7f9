"""Error rates and power of the circuit criteria (claims.circuit_criteria), measured.

    .venv/bin/python benchmarks/circuit_criteria_rates.py [--reps 1000] [--seeds 20] [--skip-models]

Two parts, each a table of rates with 95% Clopper-Pearson intervals (the Monte Carlo error):

1. **Simulations of each test at the boundary of its null** (harness.criteria_stats and the
   completeness interval, no model): equivalence summed exactly over the binomial law of the
   count; independence (HSIC permutation test, 200 permutations) on independent draws and on
   dependent ones; minimality's BH-adjusted binomial tests with every member exactly at the
   quantile; completeness intervals (BCa at 1 - alpha) on per-prompt differences whose true
   incompleteness is on the tolerance, inside it and beyond it.
2. **The tests on models whose circuits are known**, over `--seeds` data seeds (fresh prompts
   each): the constructed `redundant` model (harness.tools.constructed: two identical
   previous-token heads, each enough alone): the circuit with both heads is complete and each
   member needed, the circuit with one of them is incomplete; the constructed `decoy` model:
   the circuit padded with the decoy head (whose write every key shares) is not minimal; the
   names fixture (fixtures/names-3l): its five-head circuit, and that circuit padded with two
   layer-0 heads the file says are not needed.

A false positive is a test that calls a property violated when it holds (or, for equivalence
and completeness, PASSes when the truth is on the edge of the tolerance); power is the rate at
which it finds a violation that is there.  Cost: part 1 about a minute, part 2 about
`--seeds` x 25 s on two cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from math import comb
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import criteria_stats, stats  # noqa: E402

ALPHA = 0.05


def rate(hits: int, n: int) -> str:
    lo, hi = stats.clopper_pearson(hits, n, 0.95)
    return f"{hits}/{n} = {hits / n:.3f} [{lo:.3f}, {hi:.3f}]"


def exact(n: int, share: float, which: str, tol: float = 0.1) -> float:
    total = 0.0
    for k in range(n + 1):
        r = criteria_stats.sign_equivalence(np.array([1.0] * k + [-1.0] * (n - k)), 0.0, tol, ALPHA)
        hit = r.p_equivalent <= ALPHA if which == "PASS" else r.p_different <= ALPHA
        total += hit * comb(n, k) * share ** k * (1 - share) ** (n - k)
    return total


def simulations(reps: int) -> list[tuple[str, str, str, str]]:
    rows = []
    cases = [("share 0.4 (edge of 0.5 +- 0.1)", 0.4, "PASS", "false PASS"),
             ("share 0.5 (inside)", 0.5, "FAIL", "false FAIL"), ("share 0.5 (inside)", 0.5, "PASS", "power: PASS"),
             ("share 0.25 (outside)", 0.25, "FAIL", "power: FAIL")]
    for n in (50, 200):
        rows += [("equivalence", f"{what}, n {n}", label, f"{exact(n, share, which):.4f} (exact)")
                 for what, share, which, label in cases]
    rng = np.random.default_rng(0)
    for n in (50, 200):
        null = sum(criteria_stats.hsic_test(rng.normal(size=n), rng.standard_t(3, size=n), 200, s).p_value <= ALPHA
                   for s in range(reps))
        rows.append(("independence", f"independent, n {n}", "false FAIL", rate(null, reps)))
        for c in (0.3, 0.5):
            hits = 0
            for s in range(reps // 2):
                x = rng.normal(size=n)
                y = c * x + np.sqrt(1 - c * c) * rng.normal(size=n)
                hits += criteria_stats.hsic_test(x, y, 200, s).p_value <= ALPHA
            rows.append(("independence", f"correlation {c}, n {n}", "power: FAIL", rate(hits, reps // 2)))
    for members in (1, 5, 20):
        hits = 0
        for _ in range(reps):
            k = rng.binomial(100, 0.9, members)
            p = stats.benjamini_hochberg([criteria_stats.binomial_sides(int(b), 100, 0.9)[0] for b in k])
            hits += min(p) <= ALPHA
        rows.append(("minimality", f"{members} member(s), each beating exactly 0.9 of 100 fillers",
                     "false FAIL (any unneeded)", rate(hits, reps)))
    for share in (0.5, 0.8):
        hits = sum(min(stats.benjamini_hochberg([criteria_stats.binomial_sides(int(b), 100, 0.9)[0]
                                                  for b in rng.binomial(100, [share] + [0.99] * 4)])) <= ALPHA
                   for _ in range(reps))
        rows.append(("minimality", f"one of 5 members beating {share} of the fillers", "power: FAIL", rate(hits, reps)))
    bounds = {0.1: ("false FAIL", "FAIL"), 0.1001: ("false PASS", "PASS"), 0.0: ("power: PASS", "PASS"),
             0.3: ("power: FAIL", "FAIL")}
    for n in (50, 100):
        for true_i, (what, verdict) in bounds.items():
            hits = 0
            for s in range(reps // 2):
                gap = rng.gamma(4.0, 0.5, n)
                d = true_i * gap + rng.normal(0, 0.3, n)
                iv = stats.bootstrap_ci([d, gap], stats.ratio_of_means, 1000, 1 - ALPHA, s)
                outside, inside = iv.low > 0.1 or iv.high < -0.1, -0.1 <= iv.low and iv.high <= 0.1
                hits += (outside if verdict == "FAIL" else inside)
            edge = " (on the tolerance 0.1)" if abs(true_i - 0.1) < 1e-3 else ""
            label = f"true incompleteness {true_i:g}{edge}, n {n}"
            rows.append(("completeness", label, what, rate(hits, reps // 2)))
    return rows


def model_rows(seeds: int) -> list[tuple[str, str, str, str]]:
    import harness
    from harness.tools import constructed

    tmp = Path(tempfile.mkdtemp(prefix="criteria-rates-"))
    models = {v: constructed.save(constructed.build(v, 0), v, 0, tmp / v) for v in ("redundant", "decoy")}
    counts: dict[tuple[str, str, str], int] = {}

    def tally(key: tuple[str, str, str], hit: bool) -> None:
        counts[key] = counts.get(key, 0) + int(hit)

    def run(model: Path, claims: list[dict], seed: int, n: int = 100, data: dict | None = None) -> dict:
        doc = {"harness": 1, "name": "rates", "model": str(model), "seed": seed, "stats": {"bootstrap": 500},
               "data": data or {"generator": "repeated_tokens", "n_prompts": n, "segment_length": 10, "seed": seed},
               "claims": claims}
        ev = harness.run(doc, base_dir=tmp, figures=False)
        return {c.id: c.details.criteria for c in ev.claims}

    import yaml
    names_doc = yaml.safe_load((ROOT / "hypotheses" / "names.yaml").read_text())
    five = ["L0H0", "L0H3", "L2H0", "L2H1", "L2H3"]
    for seed in range(1, seeds + 1):
        t = time.time()
        got = run(models["redundant"], [
            {"id": "both", "kind": "circuit", "heads": ["L0H0", "L0H1", "L1H0"], "at_least": 0.5,
             "criteria": ["completeness", "minimality"]},
            {"id": "one", "kind": "circuit", "heads": ["L0H0", "L1H0"], "at_least": 0.5, "criteria": ["completeness"]},
        ], seed)
        tally(("completeness", "constructed redundant: both previous-token heads (complete)", "false FAIL"),
              got["both"]["completeness"].verdict == "FAIL")
        tally(("minimality", "constructed redundant: both previous-token heads (each needed)", "false FAIL"),
              got["both"]["minimality"].verdict == "FAIL")
        tally(("completeness", "constructed redundant: one previous-token head of two (incomplete)", "power: FAIL"),
              got["one"]["completeness"].verdict == "FAIL")
        got = run(models["decoy"], [{"id": "padded", "kind": "circuit", "heads": ["L0H0", "L0H1", "L1H0"],
                                     "at_least": 0.5, "criteria": ["minimality"]}], seed)
        tally(("minimality", "constructed decoy: circuit padded with the decoy head", "power: FAIL"),
              got["padded"]["minimality"].verdict == "FAIL")
        data = dict(names_doc["data"], seed=seed, n_prompts=200)
        got = run(ROOT / "fixtures" / "names-3l", [
            {"id": "five", "kind": "circuit", "heads": five, "at_least": 0.5, "criteria": ["minimality"]},
            {"id": "padded", "kind": "circuit", "heads": five + ["L0H1", "L0H2"], "at_least": 0.5,
             "criteria": ["minimality"]},
        ], seed, data=data | {"split": "test"})
        tally(("minimality", "names fixture: the five-head circuit (each member needed)", "false FAIL"),
              got["five"]["minimality"].verdict == "FAIL")
        flagged = {m.member for m in got["padded"]["minimality"].members if m.status == "unneeded"}
        tally(("minimality", "names fixture: padded with L0H1 and L0H2", "power: FAIL"), bool(flagged))
        tally(("minimality", "names fixture: padded with L0H1 and L0H2", "a needed head flagged"),
              bool(flagged - {"L0H1", "L0H2"}))
        print(f"[model seed {seed}/{seeds}: {time.time() - t:.1f} s]", file=sys.stderr, flush=True)
    keys = [("completeness", "constructed redundant: both previous-token heads (complete)", "false FAIL"),
            ("completeness", "constructed redundant: one previous-token head of two (incomplete)", "power: FAIL"),
            ("minimality", "constructed redundant: both previous-token heads (each needed)", "false FAIL"),
            ("minimality", "constructed decoy: circuit padded with the decoy head", "power: FAIL"),
            ("minimality", "names fixture: the five-head circuit (each member needed)", "false FAIL"),
            ("minimality", "names fixture: padded with L0H1 and L0H2", "power: FAIL"),
            ("minimality", "names fixture: padded with L0H1 and L0H2", "a needed head flagged")]
    return [(k[0], k[1], k[2], rate(counts.get(k, 0), seeds)) for k in keys]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1000, help="simulated data sets per row of part 1")
    ap.add_argument("--seeds", type=int, default=20, help="data seeds per row of part 2")
    ap.add_argument("--skip-models", action="store_true", help="part 1 only")
    args = ap.parse_args()
    from tabulate import tabulate

    t = time.time()
    rows = simulations(args.reps)
    print(f"[simulations: {time.time() - t:.0f} s]", file=sys.stderr, flush=True)
    print(tabulate(rows, headers=["criterion", "truth", "rate of", "measured (95% CI)"], tablefmt="github"))
    if not args.skip_models:
        t = time.time()
        rows = model_rows(args.seeds)
        print(f"[models: {time.time() - t:.0f} s]", file=sys.stderr, flush=True)
        print()
        print(tabulate(rows, headers=["criterion", "circuit", "rate of", "over data seeds (95% CI)"],
                       tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
