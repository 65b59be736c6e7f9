"""The edge test: one implementation of patching a route and deciding whether it is used,
for edge and path claims (claims.edge), the signature plot (engine.figure_data) and
`harness scan` (tools.scan).

For a route patched in one direction with one replacement (mech.runs.cached.Runs.patched; the
batched sweep fills the same memo, Runs.patched_many), per prompt n:

    noising    d_n = m_clean,n - m_patched,n      (necessity)
    denoising  d_n = m_patched,n - m_corrupted,n  (sufficiency)

floored to exact zeros below the numerical tolerance (claims.effects.floor_changes).
The effect is the normalised effect sum(d) / sum(g) with its BCa CI (g: the
clean-corrupted gap, or the clean-no-information gap with `normalize: baseline`; a
mean replacement carries the reference mean's jackknife); the sign-flip p-value of d
over the kept prompts; non-vacuity from mech.runs.change.  A family of tests (`edge_tests`)
is Benjamini-Hochberg adjusted over its members whose every d_n is not exactly 0
(structurally zero routes keep p = 1), and each member's use status follows:

    untested            the patch does not change the sender's output where the
                        receiver reads it (relative change < min_change)
    used                lo > min_effect, p_adj < alpha and mean(d) >= min_raw_change
    used (opposite sign) hi < -min_effect, p_adj < alpha and mean(d) <= -min_raw_change
    unused              -tolerance <= lo and hi <= tolerance
    undetermined        otherwise (an undefined effect is undetermined too)

`classify` names the weights-vs-use class of a composition test beside a use status.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import stats
from ..evidence.details import EdgeTest
from ..evidence.format import fmt_p
from ..evidence.verdicts import FAIL, INCONCLUSIVE, PASS, Verdict
from ..mech.edges import paths
from ..mech.runs import change as read_change
from ..mech.runs import jackknife
from ..mech.runs.cached import Runs
from ..spec import names
from ..spec.settings import Stats
from ..spec.vocabulary import Direction, Normalization, Replacement, UseStatus
from . import effects, metric_parts
from .metric_parts import MetricPart

USED, OPPOSITE, UNUSED, UNDETERMINED, UNTESTED = (UseStatus.USED, UseStatus.OPPOSITE, UseStatus.UNUSED,
                                                  UseStatus.UNDETERMINED, UseStatus.UNTESTED)
WEIGHTS_VS_USE = {
    (True, USED): "route used",
    (True, OPPOSITE): "route used, against the claim's direction",
    (True, UNUSED): "route present, unused",
    (True, UNDETERMINED): "route present, use undetermined",
    (True, UNTESTED): "route present, untested by this intervention",
    (False, USED): "used without a weight route",
    (False, OPPOSITE): "used against the claim's direction, without a weight route",
    (False, UNUSED): "no route",
    (False, UNDETERMINED): "no weight route, use undetermined",
    (False, UNTESTED): "no weight route, untested by this intervention",
}


@dataclass(frozen=True)
class EdgeEffect:
    """What patching one edge measured, before multiple-testing correction."""

    change: effects.Change
    norm: effects.NormalizedEffect
    base: effects.NormalizedEffect | None  # against the no-information baseline (noising only)
    p_value: float  # sign-flip over the kept prompts; 1.0 when undefined or structurally zero
    clean_mean: float
    patched_mean: float
    corrupted_mean: float
    structurally_zero: bool  # every d_n is exactly 0 after the numerical floor
    read: effects.InterventionChange
    baseline: float | None  # the no-information metric (noising only)
    corruption: str  # the corrupted run's name
    parts: list[MetricPart] | None = None  # the metric's parts (claims.metric_parts), when asked for


def edge_effect(runs: Runs, edge: paths.Route, direction: str, replacement: str, freeze: bool, st: Stats, *,
                seed: int, unit: str, baseline: float | None = None, normalize: str = Normalization.CORRUPTED,
                perm_seed: int | None = None, split: str | None = None) -> EdgeEffect:
    """Patch `edge` (runs: mech.runs.cached.Runs) and measure its effect (module docstring); `seed` drives
    the bootstrap, `perm_seed` (default `seed`) the sign-flip test; `split`: the file's metric, to
    split into its parts (claims.metric_parts: the patch once more, scored by the first part)."""
    m_clean, m_corrupt = runs.m_clean, runs.m_corrupt
    noising = direction == Direction.NOISING

    def change_of(m_patched: np.ndarray) -> np.ndarray:
        d = m_clean - m_patched if noising else m_patched - m_corrupt
        return effects.floor_changes(d, effects.metric_scale(m_clean, m_corrupt))

    m_patched = runs.patched(edge, direction, replacement, freeze)
    d = change_of(m_patched)

    def measure(r: Runs, drops: Sequence[int | None]) -> list[np.ndarray]:
        return [r.patched(edge, direction, replacement, freeze, drop=k) for k in drops]

    jack = ([change_of(m) for m in jackknife.replicates(runs, measure, m_patched)] if replacement == Replacement.MEAN
            else [])
    norm = effects.normalized_effect(d, m_clean - m_corrupt, st, seed, unit, jack=jack)
    base = (effects.normalized_effect(d, m_clean - baseline, st, seed, unit, jack=jack,
                                      gap_name="clean-baseline")
            if noising and baseline is not None else None)
    chosen = base if normalize == "baseline" and base is not None else norm
    zero = bool(np.all(d == 0))
    perm = seed if perm_seed is None else perm_seed
    p = stats.sign_flip_pvalue(d[chosen.kept], st.permutations, perm) if chosen.interval and not zero else 1.0
    r, where = read_change.edge_change(runs, paths.first_edge(edge), direction, replacement)
    parts = None
    if split is not None:
        view, scale = runs.with_metric(metric_parts.first(split)), effects.metric_scale(m_clean, m_corrupt)

        def part_change(m: np.ndarray) -> np.ndarray:
            return effects.floor_changes(view.m_clean - m if noising else m - view.m_corrupt, scale)

        m_part = view.patched(edge, direction, replacement, freeze)
        jack_part = jackknife.replicates(view, measure, m_part) if replacement == Replacement.MEAN else []
        parts = metric_parts.split(split, d, part_change(m_part), m_clean - m_corrupt, st, seed, unit, jack,
                                   [part_change(m) for m in jack_part])
    return EdgeEffect(effects.change(d, st, seed, jack), norm, base, p, float(m_clean.mean()),
                      float(m_patched.mean()), float(m_corrupt.mean()), zero, effects.intervention_change(r, st, where),
                      baseline if noising else None, runs.corruption, parts)


@dataclass(frozen=True, kw_only=True)
class UseRule:
    """The zones that decide a non-vacuous edge test's use status (module docstring): `min_effect`
    and `tolerance` on the normalised effect's CI, `alpha` on the BH-adjusted p-value and
    `min_raw_change` on the mean raw change, in the metric's units."""

    min_effect: float
    tolerance: float
    alpha: float
    min_raw_change: float = 0.0

    @classmethod
    def of(cls, st: Stats, min_effect: float | None = None, tolerance: float | None = None) -> UseRule:
        """The file's `stats` zones, with a claim's own min_effect / tolerance where it gives them."""
        return cls(min_effect=st.min_effect if min_effect is None else min_effect,
                   tolerance=st.tolerance if tolerance is None else tolerance, alpha=st.alpha,
                   min_raw_change=st.min_raw_change)

    def status(self, lo: float, hi: float, p_adj: float, raw_change: float = 0.0) -> UseStatus:
        """The use status from the effect's CI [lo, hi], adjusted p-value and mean raw change."""
        if lo > self.min_effect and p_adj < self.alpha and raw_change >= self.min_raw_change:
            return USED
        if hi < -self.min_effect and p_adj < self.alpha and raw_change <= -self.min_raw_change:
            return OPPOSITE
        if -self.tolerance <= lo and hi <= self.tolerance:
            return UNUSED
        return UNDETERMINED

    def measured(self, vacuous: bool, interval: stats.Interval | None, p_adj: float, raw_change: float) -> UseStatus:
        """untested (a vacuous patch), undetermined (an undefined effect), else `status` of the interval."""
        if vacuous:
            return UNTESTED
        if interval is None:
            return UNDETERMINED
        return self.status(interval.low, interval.high, p_adj, raw_change)

    def reason(self, use: str, lo: float, hi: float, p_adj: float, raw_change: float) -> str:
        """The use status with the comparison that decided it, in one line."""
        ci = f"CI [{lo:.3f}, {hi:.3f}]"
        if use == USED:
            return f"used: {ci} above {self.min_effect:g}, p_adj {fmt_p(p_adj)} < {self.alpha:g}"
        if use == OPPOSITE:
            return (f"used against the claim's direction: {ci} below -{self.min_effect:g}, p_adj {fmt_p(p_adj)} < "
                    f"{self.alpha:g}")
        if use == UNUSED:
            return f"unused: {ci} within ±{self.tolerance:g}"
        if lo > self.min_effect or hi < -self.min_effect:
            short = (f"p_adj {fmt_p(p_adj)} >= alpha {self.alpha:g}" if p_adj >= self.alpha
                     else f"|raw change| {abs(raw_change):.3g} is below min_raw_change {self.min_raw_change:g}")
            return f"undetermined: {ci} clears ±{self.min_effect:g} but {short}"
        return f"undetermined: {ci} is neither beyond ±{self.min_effect:g} nor within ±{self.tolerance:g}"


def classify(composes: bool | None, use: UseStatus) -> str:
    """The weights-vs-use class of an edge (composes None: an MLP end, no composition score)."""
    if composes is None:
        return f"{use} (no composition score: MLP end)"
    return WEIGHTS_VS_USE[(composes, use)]


@dataclass(frozen=True)
class EdgeTestSpec:
    """One member of a family of edge tests: what to patch and how, and where its use zones lie."""

    route: paths.Route
    direction: Direction = Direction.NOISING
    replacement: Replacement = Replacement.RESAMPLE
    freeze: bool = False
    corruption: str | None = None  # None: the runs' default corruption
    normalize: Normalization = Normalization.CORRUPTED
    min_effect: float | None = None  # None: stats.min_effect
    tolerance: float | None = None  # None: stats.tolerance
    seed: int = 0  # the bootstrap's stream
    perm_seed: int | None = None  # the sign-flip test's stream (None: `seed`)
    split: str | None = None  # the file's metric, split into its parts (claims.metric_parts); None: not split


@dataclass(frozen=True)
class EdgeTestResult:
    spec: EdgeTestSpec
    effect: EdgeEffect
    p_adjusted: float  # BH over the family's members that are not structurally zero
    use: UseStatus


def prefetch(runs: Runs, specs: Sequence[EdgeTestSpec]) -> None:
    """Patch the members the batched sweep can take (edges, resample or zero, no frozen patterns),
    one pass per corruption, direction and replacement, into the runs' memo (Runs.patched_many)."""
    groups: dict[tuple[str | None, Direction, Replacement], list[names.Edge]] = {}
    for s in specs:
        if not s.freeze and isinstance(s.route, names.Edge) and s.replacement in (Replacement.RESAMPLE,
                                                                                   Replacement.ZERO):
            groups.setdefault((s.corruption, s.direction, s.replacement), []).append(s.route)
    for (corruption, direction, replacement), edges in groups.items():
        runs.with_corruption(corruption).patched_many(edges, direction, replacement)


def edge_tests(runs: Runs, specs: Sequence[EdgeTestSpec], st: Stats, unit: str, *, baseline: float | None = None,
               progress: Callable[..., Any] | None = None, label: str = "edge tests") -> list[EdgeTestResult]:
    """Patch every member (edges batched where the runs allow: resample and zero, no frozen
    patterns), measure each (edge_effect), adjust the sign-flip p-values over the family
    (Benjamini-Hochberg, structurally zero members left out) and decide each use status
    (module docstring)."""
    prefetch(runs, specs)
    steps = specs if progress is None else progress(specs, label)
    found = [edge_effect(runs.with_corruption(s.corruption), s.route, s.direction, s.replacement, s.freeze, st,
                         seed=s.seed, unit=unit, baseline=baseline, normalize=s.normalize, perm_seed=s.perm_seed,
                         split=s.split)
             for s in steps]
    family = [i for i, e in enumerate(found) if not e.structurally_zero]
    adjusted = dict(zip(family, stats.benjamini_hochberg([found[i].p_value for i in family]), strict=True))
    out = []
    for i, (s, e) in enumerate(zip(specs, found, strict=True)):
        p_adj = adjusted.get(i, 1.0)
        chosen = e.base if s.normalize == Normalization.BASELINE and e.base is not None else e.norm
        rule = UseRule.of(st, s.min_effect, s.tolerance)
        use = rule.measured(e.read.vacuous, chosen.interval, p_adj, e.change.interval.estimate)
        out.append(EdgeTestResult(s, e, p_adj, use))
    return out


USE_PRECEDENCE = (USED, OPPOSITE, UNUSED, UNDETERMINED)  # which test decides a weights-vs-use row


def edge_verdict(expect: str, use: UseStatus, lo: float, hi: float, min_effect: float, tolerance: float) -> Verdict:
    """The verdict of an `expect` claim given its use status and CI (claims.edge, module docstring)."""
    if use == UNTESTED:
        return INCONCLUSIVE
    if expect == "used":
        return PASS if use == USED else FAIL if hi < min_effect else INCONCLUSIVE
    return PASS if use == UNUSED else FAIL if use in (USED, OPPOSITE) else INCONCLUSIVE


def row_use(tests: Sequence[EdgeTest]) -> EdgeTest:
    """The test that decides a weights-vs-use row (claims.edge, module docstring)."""
    for status in USE_PRECEDENCE:
        for t in tests:
            if t.use == status:
                return t
    return tests[0]
