"""Sanity checks that run every time.

* always: the metric is finite on every prompt of the clean and corrupted runs
  (a NaN or infinite metric means the model's outputs are not finite, e.g. an
  overflow: SanityCheckError, the run stops); the clean-corrupted gap is
  reported; normalised effects need it >= min_gap (recorded, not fatal: every
  normalised effect is then undefined; a non-finite mean never passes).  The gap
  check applies to a corruption only when some claim normalises by its gap
  (ClaimKind.reads_gap); otherwise it is recorded as not applicable and passes, so a
  file of weight claims on a model without the behaviour exits by its claims;
* with interventions: every intervention hook fired (mech.hooks.run_plan raises
  otherwise), and patching a run's own activations into it reproduces its
  metric, on every intervention path the file's claims use (head ablation, over
  the union of the heads; each edge in its direction, with its frozen patterns;
  frozen patterns alone), on the first IDENTITY_PROMPTS prompts, within
  IDENTITY_TOL x the metric's scale (over all prompts).  A failure
  raises SanityCheckError: the run stops, no report.  A NaN difference or scale
  is a failure (every comparison here is written so that NaN fails it).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ..claims.base import EdgeCircuitPath, EdgePatchPath, FrozenPatternsPath, HeadAblationPath, InterventionPath
from ..claims.effects import NUMERICAL_TOL
from ..errors import SanityCheckError
from ..evidence.details import SanityCheck
from ..mech import hooks
from ..mech.edges import patching
from ..mech.edges import paths as routes
from ..mech.runs.cached import Runs
from ..mech.runs.change import with_activations
from ..spec import names
from ..spec.names import hook_mlp_out
from ..spec.settings import Stats
from ..spec.vocabulary import Direction, Replacement

IDENTITY_TOL = NUMERICAL_TOL  # relative to the metric's magnitude (float32 models carry ~1e-7 relative error)
#: prompts the identity checks run on (the first ones): they hold the plumbing of each intervention path
#: (which hooks, where, which cached tensors) to the base run, which does not vary from prompt to prompt, and
#: on all n prompts they would cost one more intervention per path (an edge-circuit one about two forwards)
IDENTITY_PROMPTS = 8


def gap_check(gap: np.ndarray, st: Stats, unit: str, corruption: str | None = None) -> SanityCheck:
    """The clean-corrupted gap against min_gap (named with its corruption when there are several).

    Raises SanityCheckError when the gap is not finite on some prompt: the clean
    or the corrupted metric is NaN or infinite, so the model's outputs are not
    finite and no number of the run would mean anything.  Otherwise `passed` is
    True exactly when the mean gap is finite and >= min_gap."""
    name = "clean and corrupted metrics differ" + (f" ({corruption})" if corruption else "")
    gap = np.asarray(gap, dtype=float)
    bad = int(np.count_nonzero(~np.isfinite(gap)))
    if bad:
        raise SanityCheckError(f"the metric is NaN or infinite on {bad} of {gap.size} prompts (clean or "
                               f"{corruption or 'corrupted'} run): the model's outputs are not finite "
                               "(overflow, or non-finite weights)")
    mean = float(gap.mean()) if gap.size else float("nan")
    return SanityCheck(name=name, passed=bool(np.isfinite(mean) and mean >= st.min_gap),
                       detail=f"mean gap {mean:.3f} {unit} (min_gap {st.min_gap:g}); "
                              "normalised effects are undefined below it")


def not_applicable(check: SanityCheck, why: str) -> SanityCheck:
    """`check` recorded as not applying to the file (`why`): it passes, and says what it measured."""
    return check.model_copy(update={"passed": True, "applies": False,
                                    "detail": f"not applicable ({why}): {check.detail}"})


def identity_checks(runs: Runs, paths: list[InterventionPath]) -> list[SanityCheck]:
    """Patching a run's own activations into itself must change nothing, through
    every path in `paths` (the interventions of the file's claims), each run the way the
    claims' interventions run (Runs.run: from the first patched layer where it can), on the
    first IDENTITY_PROMPTS prompts."""
    full = runs
    if runs.ds.n > IDENTITY_PROMPTS and runs.scorers is not None:
        runs = runs.prompts(0, IDENTITY_PROMPTS)
    checks: list[tuple[str, Any, np.ndarray]] = []  # (path, metric per prompt, expected metric)
    units = sorted({h for p in paths if isinstance(p, HeadAblationPath) for h in p.heads}, key=str)
    if units:
        runs = with_activations(runs, units)  # a zero-ablated circuit's outside heads are not cached
        heads = [h for h in units if isinstance(h, names.Head)]
        mlps = [m for m in units if isinstance(m, names.Mlp)]
        plan = hooks.ablation_plan(heads, Replacement.RESAMPLE, runs.z(runs.clean), {})
        plan.hooks += hooks.mlp_ablation_plan(mlps, Replacement.RESAMPLE, {m.layer: runs.clean[hook_mlp_out(m.layer)]
                                                                 for m in mlps}, {}).hooks
        checks.append(("head ablation", runs.run(runs.ds.clean, runs.clean, plan), runs.m_clean))
    for p in paths:
        if isinstance(p, EdgePatchPath):
            r = runs.with_corruption(p.corruption)
            base, tokens, m = ((r.clean, r.ds.clean, r.m_clean) if p.direction == Direction.NOISING
                               else (r.corrupt, r.corrupted_tokens, r.m_corrupt))
            if routes.needs_paths(p.edge) or not isinstance(p.edge, names.Edge):
                plan = routes.plan(runs.bridge, p.edge, base, base, Replacement.RESAMPLE,
                                   forward=partial(runs.run, tokens, base, freeze=p.freeze_patterns))
            else:
                patch = patching.prepare(runs.bridge, p.edge, base, base, Replacement.RESAMPLE)
                plan = patching.fast_plan(runs.bridge, patch, base)
            if p.freeze_patterns:
                plan = hooks.Plan(plan.hooks + patching.freeze_patterns_plan(runs.patterns(base)).hooks)
            checks.append((p.label, runs.run(tokens, base, plan), m))
    if any(isinstance(p, EdgeCircuitPath) for p in paths):
        gm = runs.graph_model()
        run, k = runs.graph_check()
        k = min(k, IDENTITY_PROMPTS)
        own = runs.writes(run).first(k)
        empty = gm.graph.adjacency & False
        got = gm.circuits(own, own, empty[None], runs.ds.positions[:k], runs.rows_metric)[0]
        checks.append((f"edge circuit (every edge removed, the clean run's own writes; {k} prompts)", got,
                       runs.m_clean[:k]))
    if any(isinstance(p, FrozenPatternsPath) for p in paths):
        plan = patching.freeze_patterns_plan(runs.patterns(runs.clean))
        checks.append(("frozen patterns", runs.run(runs.ds.clean, runs.clean, plan), runs.m_clean))
    if not checks:
        return []
    diffs = {path: _max_abs(got - m) for path, got, m in checks}
    # NaN sorts first as the worst: max() with a NaN key would pick an arbitrary path
    worst = max(diffs, key=lambda k: (not np.isfinite(diffs[k]), diffs[k] if np.isfinite(diffs[k]) else 0.0))
    scale = float(np.max([_max_abs(full.m_clean), _max_abs(full.m_corrupt)]))  # NaN if either is
    tol = IDENTITY_TOL * max(1.0, scale) if np.isfinite(scale) else float("nan")
    if not diffs[worst] <= tol:  # False for a NaN difference or a NaN scale
        raise SanityCheckError(f"patching a run's own activations into it changed the metric by "
                               f"{diffs[worst]:.2e} on the {worst} path (tolerance {tol:.2g}): the interventions "
                               "do not do what they should" + ("" if np.isfinite(diffs[worst]) and np.isfinite(tol)
                                                               else ", or the model's outputs are not finite"))
    return [SanityCheck(name="identity interventions reproduce the base run", passed=True,
                        detail=f"{len(diffs)} path(s) checked on the first {runs.ds.n} prompts ({', '.join(diffs)}); "
                               f"max |metric diff| "
                               f"{diffs[worst]:.2e} (tolerance {tol:.2g} = {IDENTITY_TOL:g} x the metric's scale)"),
            SanityCheck(name="every intervention hook fired", passed=True,
                        detail="checked on every patched forward; a silent hook stops the run")]


def _max_abs(x: Any) -> float:
    """max |x|, NaN when any entry is NaN (numpy's max propagates NaN; inf stays inf)."""
    a = np.abs(np.asarray(x, dtype=float))
    return float(a.max()) if a.size else 0.0
