"""`harness selftest`: the harness checked against answers known in advance.

1. Builds the constructed models (tools.constructed) and runs the shipped
   validation set (fixtures/constructed/validation/*.yaml), comparing every
   verdict with fixtures/constructed/expected.yaml: a confusion table per claim
   kind (expected x obtained).
2. False-positive rates on null models (random weights, several seeds): for
   every cross-layer head pair and input (q, k, v), an edge claim `expect: used`
   and a composition claim `expect: composes`; the rate of "used" and of
   "composes" verdicts (BH-corrected within each model's file, as users get
   them) and, as a calibration check of the rotation null, of uncorrected
   composition p-values below alpha; each with its Clopper-Pearson 95% CI.
   Within bounds when the CI's lower end is at or below the nominal alpha (the
   rate is not significantly above it).

Exit 0 only when every verdict is as expected and all three rates are within bounds.
The models are built on the CPU and saved; every run loads them on `device`
(model.devices.resolve_device: None = $HARNESS_DEVICE or the best available).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..claims import composition
from ..engine.runner import run
from ..evidence.verdicts import PASS, Verdict
from ..mech.edges.sets import all_edges
from ..model.devices import resolve_device
from ..report.markdown import key_number
from ..stats import clopper_pearson
from . import constructed

ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "constructed"
VERDICTS = tuple(v.value for v in Verdict)
# the weights-vs-use class each test of a known route must give: (file, claim) -> (route, test, class)
ROUTE_CLASSES = {
    ("decoy", "decoy-route-unused"): ("decoy L0H1 -> L1H0.k", "resample, first_half",
                                      "route present, untested by this intervention"),
    ("decoy", "decoy-route-unused-zero"): ("decoy L0H1 -> L1H0.k", "zero", "route present, unused"),
    ("query", "q-route-untested"): ("query L0H1 -> L1H0.q", "resample, first_half",
                                    "route present, untested by this intervention"),
    ("query", "q-route-used-second-half"): ("query L0H1 -> L1H0.q", "resample, second_half", "route used"),
    ("clean", "k-edge-used"): ("clean L0H0 -> L1H0.k", "resample, first_half", "route used"),
    ("clean", "k-edge-alone-not-sufficient"): ("clean L0H0 -> L1H0.k", "denoising, first_half",
                                               "route used, against the claim's direction"),
}


@dataclass
class SelftestResult:
    rows: list[dict] = field(default_factory=list)  # file, claim, kind, expected, obtained
    fpr: dict = field(default_factory=dict)  # name -> {k, n, rate, ci, alpha, ok}

    @property
    def n_ok(self) -> int:
        return sum(r["expected"] == r["obtained"] for r in self.rows)

    def route_classes(self) -> list[tuple[str, str, str, str | None]]:
        """(route, test, expected class, obtained class) of every ROUTE_CLASSES test."""
        got = {(r["file"], r["claim"]): r["class"] for r in self.rows}
        return [(route, test, want, got.get(key)) for key, (route, test, want) in ROUTE_CLASSES.items()]

    @property
    def passed(self) -> bool:
        return (self.n_ok == len(self.rows) and all(f["ok"] for f in self.fpr.values())
                and all(want == got for _, _, want, got in self.route_classes()))

    def summary_line(self) -> str:
        f = self.fpr
        return (f"selftest: {self.n_ok}/{len(self.rows)} verdicts as expected; "
                f"FPR used {f['used']['rate']:.3f}, composes {f['composes']['rate']:.3f}")


def run_validation(root: Path, device: str | None = None) -> list[dict[str, Any]]:
    expected = yaml.safe_load((ROOT / "expected.yaml").read_text())
    rows = []
    for name, claims in expected.items():
        ev = run(root / "validation" / f"{name}.yaml", figures=False, device=device)
        for cid, want in claims.items():
            c = ev.claim(cid)  # the weights-vs-use class of the claim's own test
            rows.append({"file": name, "claim": cid, "kind": c.kind, "expected": want, "obtained": c.verdict,
                         "value": key_number(c), "class": getattr(c.details, "weights_vs_use", None)})
    return rows


def null_rates(root: Path, seeds: range, alpha_used: float, alpha_comp: float,
               device: str | None = None) -> dict[str, Any]:
    used = composes = raw = n = 0
    for seed in seeds:
        path = constructed.save(constructed.build("null", seed), "null", seed, root / "models" / f"null-fpr-{seed}")
        claims = []
        for edge in all_edges(2, 2, embed=False, logits=False):  # every L0 head -> L1 head input
            e = str(edge)
            slug = e.replace(" ", "")
            claims += [{"id": f"edge-{slug}", "kind": "edge", "edge": e, "expect": "used"},
                       {"id": f"comp-{slug}", "kind": "composition", "edge": e, "expect": "composes"}]
        ev = run({"harness": 1, "name": f"null-{seed}", "model": str(path), "seed": seed,
                  "data": {"generator": "repeated_tokens", "n_prompts": 60, "segment_length": 10, "seed": seed},
                  "stats": {"alpha": alpha_used, "composition_alpha": alpha_comp, "bootstrap": 500,
                            "permutations": 1000},
                  "claims": claims}, figures=False, device=device)
        for c in ev.claims:
            if c.kind == "edge":
                n += 1
                used += c.verdict == PASS
            else:
                composes += c.verdict == PASS
                raw += composition.KIND.details_of(c).p_value < alpha_comp
    out = {}
    for name, k, alpha in (("used", used, alpha_used), ("composes", composes, alpha_comp),
                           ("composition p < alpha, uncorrected", raw, alpha_comp)):
        lo, hi = clopper_pearson(k, n)
        out[name] = {"k": k, "n": n, "rate": k / n, "ci": [lo, hi], "alpha": alpha, "ok": lo <= alpha}
    return out


def selftest(out: Path | None = None, null_seeds: int = 20, device: str | None = None) -> SelftestResult:
    """Build, run, compare; models and copies of the files go to `out` (default: a temp dir).
    `device`: where the runs happen (checked before anything is built)."""
    device = resolve_device(device)
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="harness-selftest-"))
    try:
        constructed.build_all(root / "models", (0,))
        shutil.copytree(ROOT / "validation", root / "validation", dirs_exist_ok=True)
        res = SelftestResult(rows=run_validation(root, device))
        res.fpr = null_rates(root, range(1, 1 + null_seeds), alpha_used=0.05, alpha_comp=0.01, device=device)
    finally:
        if out is None:
            shutil.rmtree(root, ignore_errors=True)
    return res


def render(res: SelftestResult) -> str:
    from tabulate import tabulate

    kinds = sorted({r["kind"] for r in res.rows})
    table = []
    for kind in kinds:
        for want in VERDICTS:
            got = [r["obtained"] for r in res.rows if r["kind"] == kind and r["expected"] == want]
            if got:
                table.append([kind, want] + [got.count(v) for v in VERDICTS])
    lines = ["Confusion table (rows: expected verdict per claim kind; columns: obtained)",
             tabulate(table, headers=["kind", "expected", *VERDICTS]), ""]
    wrong = [r for r in res.rows if r["expected"] != r["obtained"]]
    for r in wrong:
        lines.append(f"UNEXPECTED {r['file']}::{r['claim']}: expected {r['expected']}, got {r['obtained']} "
                     f"({r['value']})")
    lines.append("Weights vs use of known routes (the class each test gives):")
    for route, test, want, obtained in res.route_classes():
        mark = "" if obtained == want else f"   UNEXPECTED: expected {want}"
        lines.append(f"  {route} ({test}): {obtained}{mark}")
    lines.append("")
    lines.append("False-positive rates on null-model edges (Clopper-Pearson 95% CI):")
    for name, f in res.fpr.items():
        lines.append(f"  {name:36s} {f['k']}/{f['n']} = {f['rate']:.3f} [{f['ci'][0]:.3f}, {f['ci'][1]:.3f}] "
                     f"(nominal alpha {f['alpha']:g}: {'ok' if f['ok'] else 'ABOVE'})")
    lines.append(res.summary_line())
    return "\n".join(lines)
