"""Measurements on the model: the base runs every claim shares (clean and
corrupted, each done once, caching only the hooks the claims need), then one
patched forward per ablation / edge / circuit, handed to the evaluators.

Sanity checks (a failure raises SanityCheckError):
* always: the clean-corrupted gap is reported; normalised effects need it >= min_gap;
* with causal claims: every intervention hook fired (interventions.run_plan), and
  patching a run's own activations into it reproduces its metric, on every
  intervention path the file uses (head ablation, incl. every head for circuits;
  each edge in its direction, with its frozen patterns; frozen patterns alone),
  within IDENTITY_TOL x the metric's scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import causal, claims as evaluators
from . import interventions as iv
from . import figure_data, metrics, names, patching, roles
from .progress import progress
from .errors import SanityCheckError
from .evidence import ClaimResult
from .spec import AblationClaim, CircuitClaim, CompositionClaim, EdgeClaim, Hypothesis, RoleClaim
from .stats import mean_ci
from .weight_claims import composition_evidence, needs_weights, weight_results
from .weights import derive_seed

IDENTITY_TOL = 1e-5  # relative to the metric's magnitude (float32 models carry ~1e-7 relative error)


@dataclass
class Measurements:
    baseline: dict
    sanity_checks: list[dict]
    claims: list[ClaimResult]
    weights_vs_use: list[dict]
    figures_data: dict = field(default_factory=dict)


@dataclass
class Runs:
    """The shared base runs and what every measurement needs from them."""

    bridge: Any
    ds: Any
    clean: dict
    corrupt: dict
    metric: Callable[[Any], np.ndarray]
    m_clean: np.ndarray
    m_corrupt: np.ndarray

    def z(self, run: dict) -> dict[int, Any]:
        return {l: run[iv.z_hook(l)] for l in range(self.bridge.cfg.n_layers) if iv.z_hook(l) in run}

    def patterns(self, run: dict) -> dict[int, Any]:
        return {l: run[iv.pattern_hook(l)] for l in range(self.bridge.cfg.n_layers)}

    def ablated(self, heads: list[names.Head], kind: str, freeze: bool = False) -> np.ndarray:
        plan = iv.ablation_plan(heads, kind, self.z(self.clean), self.z(self.corrupt))
        if freeze:
            plan.hooks += patching.freeze_patterns_plan(self.patterns(self.clean)).hooks
        return self.metric(iv.run_plan(self.bridge, self.ds.clean, plan))

    def patched(self, claim: EdgeClaim, replacement: str) -> np.ndarray:
        e = names.parse_edge(claim.edge)
        noising = claim.direction == "noising"
        base, source = (self.clean, self.corrupt) if noising else (self.corrupt, self.clean)
        patch = patching.prepare(self.bridge, e, base, source, self.clean, replacement)
        extra = patching.freeze_patterns_plan(self.patterns(base)) if claim.freeze_patterns else None
        tokens = self.ds.clean if noising else self.ds.corrupted
        return self.metric(patching.fast_logits(self.bridge, tokens, patch, extra))


def hooks_needed(s: Hypothesis, n_layers: int) -> list[str]:
    out: list[str] = []
    causal_claims = [c for c in s.claims if isinstance(c, (AblationClaim, EdgeClaim, CircuitClaim))]
    for c in s.claims:
        if isinstance(c, RoleClaim) and c.role != "copying":
            out.append(iv.pattern_hook(names.parse_head(c.head).layer))
        elif isinstance(c, AblationClaim):
            out += [iv.z_hook(names.parse_head(h).layer) for h in c.heads]
        elif isinstance(c, CircuitClaim):
            out += [iv.z_hook(l) for l in range(n_layers)]
        elif isinstance(c, EdgeClaim):
            out += patching.cache_names([names.parse_edge(c.edge)], n_layers)
        if isinstance(c, (EdgeClaim, CompositionClaim)):  # the signature plot's candidate senders
            r = names.parse_edge(c.edge).receiver
            if isinstance(r, names.HeadInput):
                out += [iv.z_hook(l) for l in range(r.head.layer)] + [f"blocks.{r.head.layer}.hook_resid_pre"]
    if any(getattr(c, "freeze_patterns", False) for c in causal_claims):
        out += [iv.pattern_hook(l) for l in range(n_layers)]
    return list(dict.fromkeys(out))


def measure_all(model: Any, ds: Any, s: Hypothesis, seed: int, figures: bool = True) -> Measurements:
    from .devices import of

    bridge = model.bridge
    ds = ds.to(of(bridge))  # the prompts meet the model on its device
    n_layers = model.n_layers
    hooks = hooks_needed(s, n_layers)
    clean = iv.cache_hooks(bridge, ds.clean, hooks)
    corrupt = iv.cache_hooks(bridge, ds.corrupted, hooks)

    def metric(logits: Any) -> np.ndarray:
        return metrics.per_prompt(logits, ds.positions, ds.answers, s.metric, ds.wrong).cpu().numpy()

    runs = Runs(bridge, ds, clean, corrupt, metric, metric(clean["logits"]), metric(corrupt["logits"]))
    st, unit = s.stats, metrics.UNITS[s.metric]
    gap = runs.m_clean - runs.m_corrupt
    baseline = {"metric": s.metric, "unit": unit, "clean": _ci_dict(runs.m_clean, st, seed),
                "corrupted": _ci_dict(runs.m_corrupt, st, seed), "gap": _ci_dict(gap, st, seed)}
    checks = [{"name": "clean and corrupted metrics differ", "passed": bool(gap.mean() >= st.min_gap),
               "detail": f"mean gap {gap.mean():.3f} {unit} (min_gap {st.min_gap:g}); "
                         "normalised effects are undefined below it"}]
    checks += identity_checks(runs, s)

    hw = None
    if needs_weights(s):
        from . import weights

        hw = weights.head_weights(bridge, s.weight_processing)
    results: list = [None] * len(s.claims)
    for i, r in (weight_results(hw, s, seed) if hw is not None else {}).items():
        results[i] = r
    edge_details: dict[int, dict] = {}
    for i, c in enumerate(s.claims):
        cseed = derive_seed(seed, 2, i)  # independent, reproducible stream per claim
        if results[i] is not None:
            continue
        if isinstance(c, RoleClaim):
            h = names.parse_head(c.head)
            pat = clean[iv.pattern_hook(h.layer)][:, h.head]
            results[i] = evaluators.evaluate_role(c, roles.role_scores(pat, ds.clean, c.role).cpu().numpy(),
                                                  st, cseed)
        elif isinstance(c, AblationClaim):
            heads = [names.parse_head(x) for x in c.heads]
            results[i] = causal.evaluate_ablation(c, runs.m_clean, runs.m_corrupt,
                                                  runs.ablated(heads, c.ablation, c.freeze_patterns),
                                                  st, cseed, unit)
            if c.sensitivity:
                results[i].details["sensitivity"] = _sensitivity(
                    lambda kind: causal.evaluate_ablation(c.model_copy(update={"ablation": kind}), runs.m_clean,
                                                          runs.m_corrupt, runs.ablated(heads, kind, c.freeze_patterns),
                                                          st, cseed, unit), results[i])
        elif isinstance(c, EdgeClaim):
            edge_details[i] = causal.edge_effect(c, runs.m_clean, runs.m_corrupt,
                                                 runs.patched(c, c.replacement), st, cseed, unit)
        elif isinstance(c, CircuitClaim):
            results[i] = measure_circuit(runs, c, st, cseed, unit, model.n_layers, model.n_heads)
    _evaluate_edges(s, runs, edge_details, results, unit, seed)
    table = weights_vs_use(hw, s, results, seed) if hw is not None else []
    figs: dict = {"attention": figure_data.attention(s, clean, ds.clean)} if figures else {}
    if hw is not None and figures:
        def effect(claim: EdgeClaim) -> dict | None:
            det = causal.edge_effect(claim, runs.m_clean, runs.m_corrupt, runs.patched(claim, "resample"),
                                     st, derive_seed(seed, 7), unit)
            return {"value": det["normalized"], "ci": det["normalized_ci"]} if "normalized" in det else None

        figs["composition"] = figure_data.composition(hw, s, seed, progress)
        figs["signature"] = figure_data.signature(hw, s, seed, effect, progress)
    return Measurements(baseline, checks, results, table, figs)


def _evaluate_edges(s: Hypothesis, runs: Runs, edge_details: dict[int, dict], results: list,
                    unit: str, seed: int) -> None:
    """BH-adjust the edge claims' p-values together, then decide each (and its sensitivity)."""
    from .weights import benjamini_hochberg

    idx = list(edge_details)
    adjusted = benjamini_hochberg([edge_details[i]["p_value"] for i in idx])
    for i, p_adj in zip(idx, adjusted):  # noqa: B007
        c = s.claims[i]
        text = str(names.parse_edge(c.edge))
        results[i] = causal.evaluate_edge(c, text, edge_details[i], p_adj, s.stats, unit)
        if c.sensitivity:
            def variant(kind: str, c=c, text=text, i=i) -> ClaimResult:
                # sensitivity variants are decided on their own, unadjusted p-values
                v = c.model_copy(update={"replacement": kind})
                det = causal.edge_effect(v, runs.m_clean, runs.m_corrupt, runs.patched(v, kind), s.stats,
                                         derive_seed(seed, 2, i), unit)
                return causal.evaluate_edge(v, text, det, det["p_value"], s.stats, unit)
            results[i].details["sensitivity"] = _sensitivity(variant, results[i])


def _sensitivity(run_variant: Callable[[str], ClaimResult], claimed: ClaimResult) -> dict:
    """The same claim under zero, mean and resample; whether the verdict agrees.
    (Edge variants are decided on unadjusted p-values.)"""
    rows = {}
    for kind in progress(("zero", "mean", "resample"), "sensitivity"):
        r = run_variant(kind)
        rows[kind] = {"verdict": r.verdict, "value": r.value, "ci": r.ci}
    verdicts = {row["verdict"] for row in rows.values()}
    return {"by_type": rows, "agrees": verdicts == {claimed.verdict}}


def measure_circuit(runs: Runs, c: CircuitClaim, st: Any, seed: int, unit: str, n_layers: int,
                    n_heads: int) -> ClaimResult:
    from math import comb

    every = [names.Head(l, h) for l in range(n_layers) for h in range(n_heads)]
    keep = {names.parse_head(h) for h in c.heads}
    m_circuit = runs.ablated([h for h in every if h not in keep], c.ablation)
    m_empty = runs.ablated(every, c.ablation)
    gap = runs.m_clean - m_empty
    kept = gap >= st.min_prompt_gap
    random_f: Any = None
    if c.at_least is not None and comb(len(every), len(keep)) > 1 and kept.sum() > 0:
        rng = np.random.default_rng(seed)
        claimed = sorted(every.index(h) for h in keep)
        random_f = []
        for _ in progress(range(c.random_circuits), f"random circuits ({c.id})"):
            pick = claimed
            while pick == claimed:  # random circuits of the same size, never the claimed one
                pick = sorted(rng.choice(len(every), size=len(keep), replace=False).tolist())
            m_r = runs.ablated([h for j, h in enumerate(every) if j not in set(pick)], c.ablation)
            random_f.append(float((m_r - m_empty)[kept].sum() / gap[kept].sum()))
        random_f = np.asarray(random_f)
    return causal.evaluate_circuit(c, runs.m_clean, m_circuit, m_empty, random_f, st, seed, unit)


def identity_checks(runs: Runs, s: Hypothesis) -> list[dict]:
    """Patching a run's own activations into itself must change nothing, through
    every intervention path the file uses: head ablation (and the circuit's
    all-heads ablation), edge patching in each direction, frozen patterns."""
    n_layers = runs.bridge.cfg.n_layers
    checks: list[tuple[str, Any, np.ndarray]] = []  # (path, logits, expected metric)
    heads = sorted({names.parse_head(h) for c in s.claims if isinstance(c, AblationClaim) for h in c.heads})
    if any(isinstance(c, CircuitClaim) for c in s.claims):
        heads = [names.Head(l, h) for l in range(n_layers) for h in range(runs.bridge.cfg.n_heads)]
    if heads:
        plan = iv.ablation_plan(heads, "resample", runs.z(runs.clean), runs.z(runs.clean))
        checks.append(("head ablation", iv.run_plan(runs.bridge, runs.ds.clean, plan), runs.m_clean))
    for c in s.claims:
        if isinstance(c, EdgeClaim):
            e = names.parse_edge(c.edge)
            base, tokens, m = ((runs.clean, runs.ds.clean, runs.m_clean) if c.direction == "noising"
                               else (runs.corrupt, runs.ds.corrupted, runs.m_corrupt))
            patch = patching.prepare(runs.bridge, e, base, base, runs.clean, "resample")
            extra = patching.freeze_patterns_plan(runs.patterns(base)) if c.freeze_patterns else None
            label = f"edge {e} ({c.direction}{', frozen patterns' if c.freeze_patterns else ''})"
            checks.append((label, patching.fast_logits(runs.bridge, tokens, patch, extra), m))
    if any(getattr(c, "freeze_patterns", False) for c in s.claims if isinstance(c, AblationClaim)):
        plan = patching.freeze_patterns_plan(runs.patterns(runs.clean))
        checks.append(("frozen patterns", iv.run_plan(runs.bridge, runs.ds.clean, plan), runs.m_clean))
    if not checks:
        return []
    diffs = {path: float(np.abs(runs.metric(logits) - m).max()) for path, logits, m in checks}
    worst = max(diffs, key=diffs.get)
    tol = IDENTITY_TOL * max(1.0, float(np.abs(runs.m_clean).max()), float(np.abs(runs.m_corrupt).max()))
    if diffs[worst] > tol:
        raise SanityCheckError(f"patching a run's own activations into it changed the metric by "
                               f"{diffs[worst]:.2e} on the {worst} path: the interventions do not do "
                               "what they should")
    return [{"name": "identity interventions reproduce the base run", "passed": True,
             "detail": f"{len(diffs)} path(s) checked ({', '.join(diffs)}); max |metric diff| "
                       f"{diffs[worst]:.2e} (tolerance {tol:.2g} = {IDENTITY_TOL:g} x the metric's scale)"},
            {"name": "every intervention hook fired", "passed": True,
             "detail": "checked on every patched forward; a silent hook stops the run"}]


def weights_vs_use(hw: Any, s: Hypothesis, results: list, seed: int) -> list[dict]:
    """The DESIGN.md table for every head -> head-input edge claim (composition and use)."""
    rows = []
    idx = [i for i, c in enumerate(s.claims) if isinstance(c, EdgeClaim)
           and isinstance(names.parse_edge(c.edge).sender, names.Head)
           and isinstance(names.parse_edge(c.edge).receiver, names.HeadInput)]
    comp = composition_evidence(hw, [names.parse_edge(s.claims[i].edge) for i in idx], s, seed, 4)
    for i, r in zip(idx, comp):
        res = results[i]
        composes = r["p_adjusted"] < s.stats.composition_alpha
        use = res.details.get("use", "undetermined")
        cls = causal.classify(composes, use)
        res.details["weights_vs_use"] = cls
        rows.append({"edge": str(names.parse_edge(s.claims[i].edge)), "claim": res.id,
                     "composition": r["score"], "composition_p_adjusted": r["p_adjusted"],
                     "composes": composes, "effect": res.value, "effect_ci": res.ci, "use": use,
                     "class": cls})
    return rows


def _ci_dict(x: np.ndarray, st: Any, seed: int) -> dict:
    ci = mean_ci(x, st.bootstrap, st.confidence, seed)
    return {"mean": ci.estimate, "ci": [ci.low, ci.high]}
