"""The data behind the report's figures, collected during a run and stored in
evidence.json (`figures_data`), so `harness report` can redraw every figure
from the JSON alone.

* attention:   for each head a claim shows (ClaimKind.shown_heads), its pattern
               on the first clean prompt, with the prompt's tokens, and its mean over
               every clean prompt with a label per position (token, slot, scored).
* composition: for each mode (q/k/v) read by a head input that a claim names
               (ClaimKind.edges), the cross-layer score matrix and each cell's
               own null 99th percentile (per-cell, uncorrected: a guide to the
               eye; claims use BH), from the run's shared null draws
               (mech.weights.null).
* signature:   for every head input a claim names, every earlier head as a
               candidate sender: composition score (x), BH-adjusted null p over
               the candidates (the shared null draws), and the noising edge
               effect with its CI (y, resample replacement,
               Stream.SIGNATURE_EFFECT) and its use status by the edge claims'
               rule (p BH-adjusted over the patched candidates; `untested`
               when the patch changes nothing the receiver reads, mech.runs.change);
               claimed edges are marked.  Which candidates are patched follows
               from their composition scores (`signature_patches`), chosen before
               the base runs, which cache what those patches read and no more.
               The patches run on the first
               FIGURE_PROMPTS prompts: the base runs' own when there are no more
               (they cache what the plot reads), else a run of those prompts
               with the default corruption (`runs_for`), so neither the figure's
               memory nor its cost grows with the file's n_prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import numpy as np

from ..claims.composition import route_evidence
from ..claims.edge_test import EdgeTestSpec, edge_tests
from ..claims.registry import kind_of
from ..mech.edges import sets
from ..mech.edges.sets import patch_cost
from ..mech.runs.build import base_runs
from ..mech.runs.cached import Runs
from ..mech.weights import scores
from ..mech.weights.factored import Composition
from ..spec import names
from ..spec.fields import ClaimSpec
from ..spec.names import hook_pattern, hook_resid_pre
from ..spec.settings import Stats
from ..streams import Stream, derive_seed

#: forward passes the signature plot's own patches may cost (patch_cost; the claimed edges, patched by the
#: claims already, cost it nothing): a bounded share of a run, whatever the number of candidates
SIGNATURE_BUDGET = 2.5
FIGURE_PROMPTS = 200  # prompts the signature plot's candidate edges are patched on, at most
#: (head pair, null draw) evaluations the composition matrix's per-cell null percentiles may cost per mode
#: (about 3 s on two cores); past it every cell gets fewer draws, never fewer than MATRIX_MIN_DRAWS
MATRIX_NULL_BUDGET = 4_000_000
MATRIX_MIN_DRAWS = 100
#: null draws a candidate of the signature plot gets at most (the claims' tests take as many as BH needs);
#: each 1,000 beyond the first are made anew for the candidates that need them (about 1 s a thousand)
SIGNATURE_MAX_DRAWS = 5000


def matrix_draws(n_pairs: int, null_draws: int, budget: int = MATRIX_NULL_BUDGET) -> int:
    """Null draws per cell of a composition matrix of `n_pairs` cells: the file's `null_draws` when
    n_pairs * null_draws fits `budget`, else budget // n_pairs (at least MATRIX_MIN_DRAWS, at most
    null_draws).  The matrix's null percentiles are a guide to the eye, not a test: the claims'
    composition tests always use the file's draws."""
    if n_pairs * null_draws <= budget:
        return null_draws
    return min(null_draws, max(MATRIX_MIN_DRAWS, budget // max(1, n_pairs)))


def _clean(x: Any) -> Any:
    """NaN -> None for JSON."""
    if isinstance(x, float):
        return None if x != x else x
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def named_edges(claims: Sequence[ClaimSpec]) -> list[names.Edge]:
    return [e for c in claims for e in kind_of(c).edges(c)]


def receivers(claims: Sequence[ClaimSpec]) -> list[names.HeadInput]:
    """Head inputs the claims name, in first-mention order."""
    return list(dict.fromkeys(e.receiver for e in named_edges(claims) if isinstance(e.receiver, names.HeadInput)))


def runs_for(runs: Runs, claims: Sequence[ClaimSpec], metric: str,
             patched: Collection[names.Edge] | None = None) -> Runs:
    """The runs the signature plot patches on: `runs` when they show at most FIGURE_PROMPTS prompts
    (engine.measure.hooks_needed had them cache what the plot reads), else the clean and default
    corrupted runs of the first FIGURE_PROMPTS prompts, caching what patching `patched` reads
    (`hooks_needed`; 2 x FIGURE_PROMPTS / n forward-equivalents)."""
    if runs.ds.n <= FIGURE_PROMPTS:
        return runs
    ds = runs.ds.select(list(range(FIGURE_PROMPTS))).keep_corruptions([runs.corruption])
    return base_runs(runs.bridge, ds, hooks_needed(claims, runs.n_layers, patched), metric)


def hooks_needed(claims: Sequence[ClaimSpec], n_layers: int,
                 patched: Collection[names.Edge] | None = None) -> list[str]:
    """What the signature plot reads: each receiver's residual, and for a key or value receiver its
    attention pattern (where it reads: mech.runs.change); and what the batched edge patching of the
    candidates it patches reads (mech.edges.sets.cache_names: their senders' outputs, the receivers'
    layers).  `patched`: those candidates (`signature_patches`); None: every candidate, so every
    earlier layer's head outputs (what is cached before the composition scores are known)."""
    out = []
    candidates = []
    for r in receivers(claims):
        out += [hook_resid_pre(r.head.layer)] + ([hook_pattern(r.head.layer)] if r.which in "kv" else [])
        candidates += [names.Edge(names.Head(layer, 0), r) for layer in range(r.head.layer)]  # each sender layer
    if not out:
        return out
    # each receiver's layer whether or not a patch into it was chosen (embed adds no head outputs): the claims'
    # own edges into it take the batched path (mech.edges.batched.patch_into) whatever the plot patches
    reach = [names.Edge(names.Embed(), r) for r in receivers(claims)]
    return out + sets.cache_names(n_layers, (candidates if patched is None else list(patched)) + reach)


def attention(claims: Sequence[ClaimSpec], clean: dict[str, Any], ds: Any,
              piece: Any = None) -> list[dict[str, Any]]:
    """Per head a claim shows: its pattern on the first clean prompt, its mean over every clean
    prompt, and a label per position (position_labels)."""
    out, seen = [], set()
    labels = position_labels(ds, piece)
    for c in claims:
        for h in kind_of(c).shown_heads(c):
            if h in seen:
                continue
            seen.add(h)
            pats = clean[hook_pattern(h.layer)][:, h.head]
            first = pats[0].cpu().double().numpy()
            mean = pats.double().mean(0).cpu().numpy()
            out.append({"head": str(h), "tokens": ds.clean[0].tolist(), "pattern": np.round(first, 5).tolist(),
                        "mean_pattern": np.round(mean, 5).tolist(), "prompts": int(pats.shape[0]),
                        "labels": labels})
    return out


def position_labels(ds: Any, piece: Any = None) -> list[str]:
    """A label per position: the first prompt's token (`piece(id)` gives its text; else the id), with the
    template slot occurrence (`S#2`) whose tokens sit at that position in every prompt, the scored
    position marked `*`, and BOS as `BOS`."""
    first = ds.clean[0].tolist()
    out = [piece(t) if piece is not None else str(t) for t in first]
    if ds.has_bos:
        out[0] = "BOS"
    for name, span in ds.spans.items():
        if bool((span == span[:1]).all()):  # the occurrence sits at the same tokens in every prompt
            lo, hi = int(span[0, 0]), int(span[0, 1])
            for k in range(lo, hi):
                out[k] = f"{out[k]} [{name}]"
    if bool((ds.positions == ds.positions[:1]).all()):  # the scored positions are the same in every prompt
        for q in ds.positions[0].tolist():
            out[q] = f"{out[q]} *"
    return out


def composition(comp: Composition, claims: Sequence[ClaimSpec], st: Stats) -> dict[str, Any]:
    """Per mode a claim reads: every cross-layer score and each cell's own null 99th percentile
    (the shared null draws, mech.weights.null; `matrix_draws` of them per cell)."""
    out = {}
    hw = comp.hw
    L, H = hw.n_layers, hw.n_heads
    senders = names.Head.every(L - 1, H)
    targets = [h for h in names.Head.every(L, H) if h.layer >= 1]
    draws = matrix_draws(H * H * L * (L - 1) // 2, st.null_draws)
    for mode in sorted({r.which for r in receivers(claims)}):
        scores = comp.scores(mode)
        q99 = np.full((len(senders), len(targets)), np.nan)
        val = np.full_like(q99, np.nan)
        for l1, grid in enumerate(comp.null_layer_grids(mode, draws)):  # n_pairs x draws numbers at most the budget
            rows = slice(l1 * H, (l1 + 1) * H)
            cols = slice(l1 * H, (L - 1) * H)  # receivers in layers l1 + 1 .. L - 1
            q99[rows, cols] = grid.quantile(0.99, dim=-1).numpy()
            val[rows, cols] = scores[l1, :, l1 + 1:, :].reshape(H, -1)
        out[mode] = {"senders": [str(s) for s in senders],
                     "receivers": [str(names.HeadInput(r, mode)) for r in targets],
                     "scores": _clean(np.round(val, 6).tolist()), "null_q99": _clean(np.round(q99, 6).tolist()),
                     "null_draws": draws}
    return out


def draws_signature(claims: Sequence[ClaimSpec]) -> bool:
    """Whether the run draws the composition matrices and the signature plot: some claim reads the
    weights and names a head input (`receivers`)."""
    return any(kind_of(c).needs_weights(c) for c in claims) and bool(receivers(claims))


def signature_in_base_runs(claims: Sequence[ClaimSpec], n_prompts: int) -> bool:
    """Whether the file's base runs cache what the signature plot's patches read: it is drawn
    (`draws_signature`) and patches on the file's own prompts (at most FIGURE_PROMPTS of them)."""
    return n_prompts <= FIGURE_PROMPTS and draws_signature(claims)


def signature_candidates(claims: Sequence[ClaimSpec], n_heads: int) -> list[names.Edge]:
    """Every edge into the head inputs the claims name from every head of an earlier layer."""
    return [names.Edge(h, r) for r in receivers(claims) for h in names.Head.every(r.head.layer, n_heads)]


def signature_patches(comp: Composition, claims: Sequence[ClaimSpec]) -> set[names.Edge]:
    """The candidates the signature plot patches (`patch_within_budget` on their composition scores):
    known from the weights alone, so the base runs cache what those patches read and no more."""
    candidates = signature_candidates(claims, comp.hw.n_heads)
    scores = [comp.score(cast(names.Head, e.sender), cast(names.HeadInput, e.receiver)) for e in candidates]
    return patch_within_budget(candidates, scores,
                               {str(e) for e in named_edges(claims)}, comp.hw.n_layers)


def signature_routes(comp: Composition, claims: Sequence[ClaimSpec], st: Stats) -> list[tuple[names.Edge, Any]]:
    """The weights side of the signature plot: every candidate edge into the named receivers (every
    earlier head) with its composition test (claims.composition.route_evidence, BH over the
    candidates); `signature` patches them (the caller may let go of the weights in between)."""
    candidates = signature_candidates(claims, comp.hw.n_heads)
    if not candidates:
        return []
    return list(zip(candidates, route_evidence(comp, candidates, st, max_draws=SIGNATURE_MAX_DRAWS), strict=True))


def signature(routes: list[tuple[names.Edge, Any]], claims: Sequence[ClaimSpec], runs: Runs, st: Stats, *,
              chosen: set[names.Edge], seed: int, unit: str, progress: Callable[..., Any],
              n_prompts: int | None = None) -> dict[str, Any]:
    """Every candidate edge into the named receivers (`signature_routes`): its composition test and,
    for the `chosen` ones (`signature_patches`), the noising resample effect on `runs`' prompts
    (`runs_for`: the first of the file's `n_prompts`) and its use status under the edge claims' rule
    (claims.edge_test.UseRule; sign-flip p-values BH-adjusted over the patched candidates)."""
    claimed = {str(e) for e in named_edges(claims)}
    if not routes:
        return {}
    candidates = [e for e, _ in routes]
    found = [r for _, r in routes]
    capped = scores.draws_needed(len(candidates), st.composition_alpha) > max(st.null_draws, SIGNATURE_MAX_DRAWS)
    effect_seed = derive_seed(seed, Stream.SIGNATURE_EFFECT)
    patched = [e for e in candidates if e in chosen]
    tests = edge_tests(runs, [EdgeTestSpec(e, seed=effect_seed) for e in patched], st, unit, progress=progress,
                       label="signature edges")
    measured = {t.spec.route: t for t in tests}
    points = []
    for e, r in zip(candidates, found, strict=True):
        point = {"edge": str(e), "composition": _clean(r.result.score), "null_q99": r.result.null_q99,
                 "composition_p_adjusted": r.p_adjusted, "composes": r.composes,
                 "effect": None, "effect_ci": None, "claimed": str(e) in claimed, "untested": False,
                 "patched": e in chosen}
        if e in measured:
            t = measured[e]
            iv = t.effect.norm.interval
            point.update(effect=None if iv is None else iv.estimate,
                         effect_ci=None if iv is None else [iv.low, iv.high], untested=t.effect.read.vacuous,
                         use=t.use)
        points.append(point)
    skipped = len(candidates) - len(chosen)
    note = ("noising, resample replacement; use by the edge claims' rule with p BH-adjusted over the patched "
            "candidates; composition p BH-adjusted over these candidates")
    if n_prompts is not None and n_prompts > runs.ds.n:
        note += f"; effects on the first {runs.ds.n} of the {n_prompts} prompts"
    if capped:
        note += f" (a candidate's null from at most {max(st.null_draws, SIGNATURE_MAX_DRAWS)} draws)"
    if skipped:
        note += (f"; {len(chosen)} of {len(candidates)} candidates patched (the claimed edges, then the most "
                 f"composing, within {SIGNATURE_BUDGET:g} forward passes beyond the claims' own); the other "
                 f"{skipped} have weights only")
    return {"points": points, "min_effect": st.min_effect, "tolerance": st.tolerance,
            "composition_alpha": st.composition_alpha, "note": note}


def patch_within_budget(candidates: list[names.Edge], scores: list[Any], claimed: set[str],
                        n_layers: int, budget: float | None = None) -> set[names.Edge]:
    """The candidates whose effect the signature plot measures: all of them when the patches of the
    unclaimed ones cost at most `budget` (SIGNATURE_BUDGET) forward passes, else the claimed edges
    (which the edge claims measured) and then the most composing candidates while the budget lasts."""
    budget = SIGNATURE_BUDGET if budget is None else budget
    if sum(patch_cost(e, n_layers) for e in candidates if str(e) not in claimed) <= budget:
        return set(candidates)
    order = sorted(range(len(candidates)), key=lambda i: (str(candidates[i]) not in claimed,
                                                           -(scores[i] if scores[i] == scores[i] else -1.0), i))
    chosen, spent = set(), 0.0
    for i in order:
        if str(candidates[i]) in claimed:  # the edge claims patched it already: no cost here
            chosen.add(candidates[i])
            continue
        cost = patch_cost(candidates[i], n_layers)
        if spent + cost <= budget:
            chosen.add(candidates[i])
            spent += cost
    return chosen
