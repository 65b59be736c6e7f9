"""Measuring a hypothesis on a model: plan the hooks, run the clean and the
corrupted prompts once each, check the interventions, hand every claim kind
its claims, collect the figures' data.

    plan      hooks = union of each claim's kind.hooks(claim) (+ what the signature plot's patches
              read, those patches chosen first by composition score: signature_patches)
    base runs the clean forward and one per named corruption, caching those hooks
              (mech.runs.cached.Runs); the reference prompts for means run on first use
    baseline  clean, corrupted and gap metric with BCa CIs (seed: the run seed), per
              corruption, and the no-information metric (model.metrics.no_information); the
              model's accuracy and the answer's rank on every run (model.behaviour), with a
              warning when the clean run is near chance
    sanity    engine.sanity over every claim's kind.interventions(claim)
    claims    kind.measure(all claims of the kind, Context) for each registered kind
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import cost, memory, stats
from ..claims import effects, metric_parts
from ..claims.base import ClaimKind, Context, InterventionPath
from ..claims.registry import kind_of
from ..data.dataset import Dataset
from ..evidence.details import LadderRow, SanityCheck, WeightsVsUseRow
from ..evidence.result import ClaimResult
from ..mech.runs.build import base_runs
from ..mech.runs.cached import Runs
from ..mech.weights.factored import Composition
from ..model import behaviour, metrics
from ..model.devices import of
from ..model.loaded import LoadedModel
from ..model.tokenizer import shown_tokenizer, start_words
from ..progress import progress, stage
from ..spec import names
from ..spec.fields import ClaimSpec
from ..spec.settings import Stats
from . import figure_data, ladder, sanity


@dataclass
class Measurements:
    baseline: dict[str, Any]
    sanity_checks: list[SanityCheck]
    claims: list[ClaimResult]
    weights_vs_use: list[WeightsVsUseRow]
    figures_data: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    ladder: list[LadderRow] = field(default_factory=list)


def hooks_needed(claims: Sequence[ClaimSpec], n_layers: int, figures: bool = True,
                 n_prompts: int = 0, patched: Collection[names.Edge] | None = None) -> tuple[list[str], list[str]]:
    """Every hook the claims (and the figures, if drawn, on at most figure_data.FIGURE_PROMPTS
    prompts: else they run their own, figure_data.runs_for) read from the base runs, once each:
    from the clean run, and from the corrupted runs (ClaimKind.corrupted_hooks: a zero-ablation
    circuit reads every head's output in the clean run and nothing in a corrupted one);
    `patched`: the signature plot's patches (figure_data.hooks_needed; None: every candidate)."""
    clean = [h for c in claims for h in kind_of(c).hooks(c, n_layers)]
    corrupted = [h for c in claims for h in kind_of(c).corrupted_hooks(c, n_layers)]
    if figures and figure_data.signature_in_base_runs(claims, n_prompts):
        drawn = figure_data.hooks_needed(claims, n_layers, patched)
        clean, corrupted = clean + drawn, corrupted + drawn
    return list(dict.fromkeys(clean + corrupted)), list(dict.fromkeys(corrupted))  # the clean run caches both


def signature_patches(model: LoadedModel, claims: Sequence[ClaimSpec], processing: str,
                      seed: int) -> tuple[set[names.Edge], dict[str, Any]]:
    """The signature plot's patches (figure_data.signature_patches), chosen before the base runs so
    that they cache what those patches read and no more (on SmolLM2, one layer's head outputs instead
    of sixteen), and what the composition that chose them computed without its weights: the score
    grids and the spectra that every composition test of these receiver inputs reads (Context.adopt),
    so no later stage makes the cores (4 L H d r float64 numbers) again."""
    comp = Composition.read(model.bridge, processing, seed)
    patched = figure_data.signature_patches(comp, claims)
    for side in ["x", *sorted({r.which for r in figure_data.receivers(claims)})]:
        comp.spectrum(side)
    return patched, comp.without_weights()


def interventions(claims: Sequence[ClaimSpec], n_layers: int, n_heads: int) -> list[InterventionPath]:
    return [p for c in claims for p in kind_of(c).interventions(c, n_layers, n_heads)]




def by_kind(claims: Sequence[ClaimSpec]) -> dict[ClaimKind[Any, Any], list[tuple[int, ClaimSpec]]]:
    """The claims grouped by kind, each with its position in the file."""
    out: dict[ClaimKind[Any, Any], list[tuple[int, ClaimSpec]]] = {}
    for i, c in enumerate(claims):
        out.setdefault(kind_of(c), []).append((i, c))
    return out


def measure_all(model: LoadedModel, ds: Dataset, claims: Sequence[ClaimSpec], *, metric: str, st: Stats,
                processing: str, seed: int, figures: bool = True) -> Measurements:
    """Run every claim on `model` and `ds`."""

    with cost.counting(ds.n) as ledger:
        return _measure_all(model, ds, claims, metric=metric, st=st, processing=processing, seed=seed,
                            figures=figures, ledger=ledger)


def spent(ledger: cost.Ledger, what: str, runs: Runs | None = None) -> None:
    """The stage line that closes a stage: the forward-equivalents it spent (harness.cost) and the
    process's peak memory so far; what the stage made for itself is let go first (`runs.release`,
    memory.release)."""
    if runs is not None:
        runs.release()
    memory.release()
    peak = memory.peak()
    stage(f"{what}: {ledger.lap():.2f} forward-equivalents" + (f"; peak memory {memory.gb(peak)}" if peak else ""))


def _measure_all(model: LoadedModel, ds: Dataset, claims: Sequence[ClaimSpec], *, metric: str, st: Stats,
                 processing: str, seed: int, figures: bool, ledger: cost.Ledger) -> Measurements:
    bridge = model.bridge
    ds = ds.to(of(bridge))  # the prompts meet the model on its device
    n_layers, n_heads = model.n_layers, model.n_heads
    plan: tuple[set[names.Edge], dict[str, Any]] | None = None
    if figures and figure_data.signature_in_base_runs(claims, ds.n):
        stage("figure data: choosing the signature plot's patches by composition scores")
        plan = signature_patches(model, claims, processing, seed)
        spent(ledger, f"{len(plan[0])} patches chosen")
    names_, corrupted = hooks_needed(claims, n_layers, figures, ds.n, None if plan is None else plan[0])
    stage(f"base runs: {ds.n} prompts ({start_words(model, ds)}), clean and {len(ds.corruptions)} corruption(s)")
    parts = (metric_parts.first(metric),) if any(c.metric_parts() for c in claims) else ()
    runs = base_runs(bridge, ds, names_, metric, parts, corrupted)
    spent(ledger, "base runs done")
    clean, corruptions, default = runs.clean, runs.corruptions, runs.corruption
    unit = metrics.get(metric).unit
    m_base = metrics.no_information(metric, model.d_vocab_out, runs.clean_logp)
    gap = runs.m_clean - runs.m_corrupt
    baseline = {"metric": metric, "unit": unit, "clean": _mean_ci(runs.m_clean, st, seed),
                "corrupted": _mean_ci(runs.m_corrupt, st, seed), "gap": _mean_ci(gap, st, seed),
                "corruption": default, "no_information": m_base}
    gaps = {name: sanity.gap_check(runs.m_clean - m_c, st, unit, name if len(corruptions) > 1 else None)
            for name, (_, m_c) in corruptions.items()}  # a non-finite metric stops the run here
    if len(corruptions) > 1:
        baseline["by_corruption"] = {name: {"corrupted": _mean_ci(m_c, st, seed),
                                            "gap": _mean_ci(runs.m_clean - m_c, st, seed)}
                                     for name, (_, m_c) in corruptions.items()}
    behaves = baseline["behaviour"] = behaviour_of(runs, model.d_vocab_out, st, seed)
    stage(behaviour.headline(behaves))
    stage("sanity checks: identity interventions")
    identity = sanity.identity_checks(runs, interventions(claims, n_layers, n_heads))
    spent(ledger, "sanity checks done", runs)

    ctx = Context(runs=runs, stats=st, seed=seed, unit=unit, processing=processing, baseline=m_base, metric=metric)
    if plan is not None:
        ctx.adopt(plan[1])
    found: dict[int, ClaimResult] = {}
    rows: list[WeightsVsUseRow] = []
    for kind, items in by_kind(claims).items():
        stage(f"claims: {len(items)} {kind.name}")
        measured = kind.measure(items, ctx)
        # a kind that reads the weights reads them again (0.3 s for 135M parameters), its composition
        # starting from the scores and null draws kept: no stage holds them for another's sake
        ctx.let_go_of_weights()
        spent(ledger, f"{kind.name} done", runs)
        found.update(measured.results)
        rows += measured.weights_vs_use
    results = [found[i] for i in range(len(claims))]
    # a gap check applies where a claim declares it reads the gap, or its result shows it divided by it
    read = gap_readers(claims, default) | normalised_by_gap(claims, results, default)
    checks = [gaps[n] if n in read else sanity.not_applicable(gaps[n], "no claim normalises by this gap")
              for n in gaps] + identity
    silent = sorted({kind_of(c).name for c, r in zip(claims, results, strict=True)
                     if _by_gap(r) and not kind_of(c).reads_gap(c)})
    notes = [f"claim kind(s) {', '.join(silent)} normalise by the clean-corrupted gap without declaring it "
             "(ClaimKind.reads_gap): the gap check was applied all the same"] if silent else []

    figs: dict[str, Any] = {}
    if figures:
        tok = shown_tokenizer(model)
        figs["attention"] = figure_data.attention(claims, clean, ds, None if tok is None else tok.piece)
        if any(kind_of(c).needs_weights(c) for c in claims):
            stage("figure data: composition matrices and the signature plot")
            figs["composition"] = figure_data.composition(ctx.composition(), claims, st)
            routes = figure_data.signature_routes(ctx.composition(), claims, st)
            chosen = figure_data.signature_patches(ctx.composition(), claims)
            ctx.let_go_of_weights()  # the patches that follow read none
            on = figure_data.runs_for(runs, claims, metric, chosen)
            figs["signature"] = figure_data.signature(routes, claims, on, st, chosen=chosen, seed=seed, unit=unit,
                                                      progress=progress, n_prompts=ds.n)
            spent(ledger, "figure data done", runs)
    stage(f"measured: {ledger.total:.2f} forward-equivalents of the {ds.n} prompts in all")
    return Measurements(baseline, checks, results, rows, figs,
                        st.warnings() + means_warnings(claims, ds) + notes + chance_warnings(behaves),
                        ladder.build(claims, results, rows))


def behaviour_of(runs: Runs, vocab: int, st: Stats, seed: int) -> dict[str, Any]:
    """baseline["behaviour"]: the accuracy and answer rank of the clean run and of every corruption's
    (model.behaviour.document), from what the base runs read of their logits."""
    ds = runs.ds
    return behaviour.document(runs.behaviour, int(ds.positions.shape[1]), ds.wrong is not None, vocab,
                              st.bootstrap, st.confidence, seed, sets=ds.answer_sets is not None)


def chance_warnings(doc: dict[str, Any]) -> list[str]:
    """The warning a run near chance carries (model.behaviour.near_chance), or none."""
    if not doc["near_chance"]:
        return []
    return [f"the model is near chance on this task: {behaviour.words(doc)} on the clean prompts; "
            "no claim about how it does the task means much until it does it"]


SHARED_MATERIAL = 0.05  # share of the prompts that are also reference prompts above which means are flagged


def _by_gap(result: ClaimResult) -> bool:
    """Whether the claim's number is its effect divided by the clean-corrupted gap."""
    d = result.details
    return (isinstance(d, effects.NormalizedFields) and d.normalization == "corrupted"
            and d.normalized is not None and result.value == d.normalized)


def normalised_by_gap(claims: Sequence[ClaimSpec], results: Sequence[ClaimResult], default: str) -> set[str]:
    """The corruptions whose gap some result's number was divided by (what its details say,
    whatever its kind declares): every one must have had its gap check."""
    return {getattr(c, "corruption", None) or default for c, r in zip(claims, results, strict=True) if _by_gap(r)}


def gap_readers(claims: Sequence[ClaimSpec], default: str) -> set[str]:
    """The corruptions whose clean-corrupted gap some claim normalises by (ClaimKind.reads_gap)."""
    return {getattr(c, "corruption", None) or default for c in claims if kind_of(c).reads_gap(c)}


def means_warnings(claims: Sequence[ClaimSpec], ds: Any) -> list[str]:
    """The warning that prompts are also reference prompts: only when some claim takes means
    (ClaimKind.uses_means) and more than SHARED_MATERIAL of the prompts are shared."""
    shared = int(getattr(ds, "shared_reference", 0))
    if not shared or shared <= SHARED_MATERIAL * ds.n or not any(kind_of(c).uses_means(c) for c in claims):
        return []
    return [f"data: {shared} of the {ds.n} prompts are also reference prompts, so a mean taken over the reference "
            "prompts includes the prompt itself, which pulls mean ablation and mean replacement effects towards "
            "zero (a template with few fillings draws the same ones again): add slot values, or use another "
            "ablation"]


def _mean_ci(x: np.ndarray, st: Stats, seed: int) -> dict[str, Any]:
    ci = stats.mean_ci(x, st.bootstrap, st.confidence, seed)
    return {"mean": ci.estimate, "ci": [ci.low, ci.high]}
