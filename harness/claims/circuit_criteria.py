"""The criteria a `circuit` claim may state beyond its faithfulness bound (`criteria:`), each a
test with a known error rate (harness.criteria_stats), run on the claim's plan (claims.circuit_plans)
as stacked circuits.  With m_X the metric per prompt of circuit X, M the model, C the circuit,
F(X) = sum(m_X - m_empty) / sum(m_full - m_empty) over the prompts the faithfulness keeps:

* **equivalence** (Shi et al. 2024): the share of prompts on which the circuit beats the model,
  P(m_C > m_M), is 1/2 within `tolerance` eps.  Sign test on the untied prompts: PASS when
  equivalence is shown (two one-sided tests at alpha), FAIL when non-equivalence is shown
  (P(share outside 1/2 +- eps) at the nearer edge, two-sided, at alpha), else INCONCLUSIVE.
  Cost: nothing beyond the claim's own circuits.
* **independence** (Shi et al. 2024): the model's score m_M and the score of the model with the
  circuit removed, m_(M minus C), are independent over prompts.  HSIC permutation test: FAIL when
  dependence is shown (p <= alpha: the rest carries what the model does); otherwise PASS, reading
  "no dependence found", never "independence shown".  Cost: 1 circuit.
* **minimality** (Shi et al. 2024; Wang et al. 2022 with K empty): each member v's knockout
  effect d_v = F(C) - F(C minus v) against the knockout effect of a random filler u added to the
  circuit, d_u = F(C + u) - F(C) (`fillers` draws; node circuits: a unit outside C; edge circuits:
  an edge outside C from a live sender (embed, or a node with a circuit edge into it) into a
  receiver the circuit reads).  With b_v = #{draws with |d_v| > |d_u|}, the binomial tests of
  P(|d_v| > |d_U|) < `quantile` (unneeded) and > `quantile` (needed), each Benjamini-Hochberg
  adjusted over the members: FAIL when some member is unneeded, PASS when every member is needed,
  else INCONCLUSIVE.  Cost: |C| + distinct fillers circuits.
* **completeness** (Wang et al. 2022): incompleteness I(K) = F(C minus K) - F(M minus K) for sets
  K of the circuit's units (node circuits: its heads and MLPs; edge circuits: its edges grouped by
  sender; named sets: members or, for edges, nodes).  K is searched on the even-numbered prompts
  (`random` subsets, each unit in with probability 1/2, and `greedy` steps that add the unit
  raising |I| most, as Wang et al.); the worst K found is tested on the odd-numbered prompts and
  each named set on all prompts, with BCa intervals at 1 - alpha / m (m sets tested, Bonferroni):
  FAIL when an interval lies outside [-tolerance, tolerance], PASS when every one lies inside,
  else INCONCLUSIVE.  Cost: 2 circuits per set evaluated.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import criteria_stats, stats
from ..evidence.verdicts import FAIL, INCONCLUSIVE, PASS
from ..progress import progress, stage
from ..spec.settings import Stats
from .circuit_plans import Plan, Variant
from .circuit_spec import Completeness, CriterionResult, Equivalence, Independence, MemberTest, Minimality, SetTest

GROUP = 16  # circuits stacked in one pass of a criterion's search
TIE = 1e-5  # |m_C - m_M| at most this share of the model's largest |metric|: a tie (float32 rounding)


@dataclass
class Scores:
    """What every criterion reads: the claim's metrics per prompt, the prompts the faithfulness
    keeps and its settings, and the circuits run so far (`run`, counted once each)."""

    plan: Plan
    kind: str  # the ablation
    full: np.ndarray
    circuit: np.ndarray
    empty: np.ndarray
    st: Stats
    seed: int
    defined: bool  # whether the faithfulness is defined (the gap is large enough)
    label: str = "criteria"  # the progress lines' label
    seen: set[Variant] = field(default_factory=set)

    @property
    def gap(self) -> np.ndarray:
        out: np.ndarray = self.full - self.empty
        return out

    @property
    def kept(self) -> np.ndarray:
        return self.gap >= self.st.min_prompt_gap

    def faithfulness(self, m: np.ndarray, rows: np.ndarray | None = None) -> float:
        keep = self.kept if rows is None else self.kept & rows
        return float(stats.ratio_of_means((m - self.empty)[keep], self.gap[keep]))

    def run(self, variants: Sequence[Variant]) -> list[np.ndarray]:
        """The metric of each variant (stacked, GROUP circuits a pass, with progress lines; each
        distinct circuit computed once per run)."""
        self.seen.update(variants)
        todo = list(variants)
        if not todo:  # nothing to run: no progress line
            return []
        groups = [todo[i:i + GROUP] for i in range(0, len(todo), GROUP)]
        # a line for one group too: on a real model one group of circuits takes tens of seconds
        return [m for g in progress(groups, f"{self.label}: {len(todo)} circuit(s) in groups of {GROUP}")
                for m in self.plan.variants(g, self.kind)]


def evaluate(plan: Plan, criteria: dict[str, Equivalence | Independence | Completeness | Minimality | None],
             scores: Scores, label: str) -> dict[str, CriterionResult]:
    """Each stated criterion's test, in the order equivalence, independence, completeness, minimality."""
    tests: dict[str, Callable[..., CriterionResult]] = {
        "equivalence": equivalence, "independence": independence, "completeness": completeness,
        "minimality": minimality}
    out = {}
    for name, spec in criteria.items():
        if spec is None:
            continue
        before = len(scores.seen)
        scores.label = f"{name} ({label})"
        result = tests[name](spec, scores)
        out[name] = result.model_copy(update={"circuits": len(scores.seen) - before})
        stage(f"{name} ({label}): {result.verdict}, {len(scores.seen) - before} circuits")
    return out


def brief(name: str, r: CriterionResult) -> str:
    """One clause of what a criterion's test found (the claim's reason lists them)."""
    if r.statistic is None:
        return r.rule
    if name == "equivalence":
        return f"the circuit beats the model on {r.statistic:.0%} of the prompts that differ"
    if name == "independence" and r.p_value is not None:
        return f"HSIC p {r.p_value:.3g}"
    if name == "completeness" and r.sets:
        worst = max(r.sets, key=lambda t: abs(t.incompleteness or 0.0))
        return f"removing {{{', '.join(worst.members)}}}: incompleteness {worst.incompleteness:+.3f}"
    if name == "minimality" and r.members:
        off = [m.member for m in r.members if m.status != "needed"]
        return f"{len(off)} of {len(r.members)} members not shown needed: {', '.join(off[:5])}" + (
            ", ..." if len(off) > 5 else "")
    return r.rule


def undefined(name: str) -> CriterionResult:
    return CriterionResult(verdict=INCONCLUSIVE, statistic=None, circuits=0,
                           rule=f"{name} undefined: the faithfulness is undefined (the full-empty gap is too small)")


def equivalence(spec: Equivalence, s: Scores) -> CriterionResult:
    delta = s.circuit - s.full
    tie = TIE * max(float(np.max(np.abs(s.full))), 1e-30)
    r = criteria_stats.sign_equivalence(delta, tie, spec.tolerance, s.st.alpha)
    eps, a = spec.tolerance, s.st.alpha
    if r.untied == 0:
        return CriterionResult(verdict=PASS, statistic=None, circuits=0,
                               rule=f"the circuit scores as the model on every one of the {len(delta)} prompts")
    share = (f"the circuit beats the model on {r.beats} of {r.untied} prompts that differ ({r.share:.3f}, "
             f"{100 * (1 - 2 * a):.0f}% CI [{r.ci[0]:.3f}, {r.ci[1]:.3f}]; {len(delta) - r.untied} tied)")
    if r.p_equivalent <= a:
        verdict, rule = PASS, f"{share}: within 1/2 +- {eps:g} (two one-sided tests p {r.p_equivalent:.3g} <= {a:g})"
    elif r.p_different <= a:
        verdict, rule = FAIL, f"{share}: outside 1/2 +- {eps:g} (sign test p {r.p_different:.3g} <= {a:g})"
    else:
        verdict, rule = INCONCLUSIVE, (f"{share}: neither within 1/2 +- {eps:g} (p {r.p_equivalent:.3g}) nor outside "
                                       f"it (p {r.p_different:.3g}) at alpha {a:g}")
    return CriterionResult(verdict=verdict, statistic=r.share, p_value=r.p_different, rule=rule, circuits=0,
                           ci=[r.ci[0], r.ci[1]])


def independence(spec: Independence, s: Scores) -> CriterionResult:
    (m_rest,) = s.run([Variant(True, frozenset(s.plan.items()), frozenset())])
    a = s.st.alpha
    h = criteria_stats.hsic_test(s.full, m_rest, spec.permutations, s.seed, alpha=a)
    what = (f"HSIC between the model's score and the score with the circuit removed {h.statistic:.3g}, "
            f"permutation p {h.p_value:.3g} ({h.permutations} permutations, {len(m_rest)} prompts)")
    if h.decision == "borderline":
        return CriterionResult(verdict=INCONCLUSIVE, statistic=h.statistic, p_value=h.p_value, circuits=1,
                               rule=f"{what}: borderline, the permutation p lies within Monte Carlo error of "
                                    f"alpha {a:g} after every permutation drawn")
    if h.decision == "below":
        return CriterionResult(verdict=FAIL, statistic=h.statistic, p_value=h.p_value, circuits=1,
                               rule=f"{what}: the rest of the model carries information about its score (p below "
                                    f"alpha {a:g}, decided)")
    return CriterionResult(verdict=PASS, statistic=h.statistic, p_value=h.p_value, circuits=1,
                           rule=f"{what}: no dependence found at alpha {s.st.alpha:g}")


def minimality(spec: Minimality, s: Scores) -> CriterionResult:
    if not s.defined:
        return undefined("minimality")
    plan, a, q = s.plan, s.st.alpha, spec.quantile
    items, pool = plan.items(), plan.fillers()
    if not pool:
        return CriterionResult(verdict=INCONCLUSIVE, statistic=None, circuits=0,
                               rule="minimality undefined: no filler can be added to the circuit")
    f_c = s.faithfulness(s.circuit)
    knocked = s.run([Variant(False, frozenset([v]), frozenset()) for v in items])
    d_member = np.array([f_c - s.faithfulness(m) for m in knocked])
    rng = np.random.default_rng(s.seed)
    draws = rng.integers(0, len(pool), spec.fillers)
    distinct = sorted(set(draws.tolist()))
    added = s.run([Variant(False, frozenset(), frozenset([pool[u]])) for u in distinct])
    d_pool = dict(zip(distinct, (s.faithfulness(m) - f_c for m in added), strict=True))
    d_fill = np.abs(np.array([d_pool[u] for u in draws.tolist()]))
    beaten = [int(np.sum(abs(d) > d_fill)) for d in d_member]
    sides = [criteria_stats.binomial_sides(b, spec.fillers, q) for b in beaten]
    p_un = stats.benjamini_hochberg([lo for lo, _ in sides])
    p_need = stats.benjamini_hochberg([hi for _, hi in sides])
    members = [MemberTest(member=plan.label(v), knockout=float(d), beaten=b, p_unneeded=pu, p_needed=pn,
                          status="unneeded" if pu <= a else "needed" if pn <= a else "undetermined")
               for v, d, b, pu, pn in zip(items, d_member, beaten, p_un, p_need, strict=True)]
    unneeded = [m for m in members if m.status == "unneeded"]
    what = (f"each member's knockout |F(C) - F(C minus v)| against {spec.fillers} random fillers' (median "
            f"{np.median(d_fill):.3g}, {q:g}-quantile {np.quantile(d_fill, q):.3g})")
    if unneeded:
        worst = sorted(unneeded, key=lambda m: abs(m.knockout))[:10]
        listed = ", ".join(f"{m.member} ({m.knockout:+.3f}, beats {m.beaten}/{spec.fillers})" for m in worst)
        verdict, rule = FAIL, (f"{len(unneeded)} of {len(members)} members unneeded, beating fewer than {q:g} of the "
                               f"fillers (BH-adjusted p <= {a:g}): {listed}{', ...' if len(unneeded) > 10 else ''}; "
                               f"{what}")
    elif all(m.status == "needed" for m in members):
        verdict, rule = PASS, f"every one of the {len(members)} members needed (beats more than {q:g}); {what}"
    else:
        open_ = [m.member for m in members if m.status == "undetermined"]
        verdict, rule = INCONCLUSIVE, (f"{len(open_)} of {len(members)} members undetermined "
                                       f"({', '.join(open_[:10])}{', ...' if len(open_) > 10 else ''}); {what}")
    return CriterionResult(verdict=verdict, statistic=min(b / spec.fillers for b in beaten), rule=rule, circuits=0,
                           members=members)


def completeness(spec: Completeness, s: Scores) -> CriterionResult:
    if not s.defined:
        return undefined("completeness")
    plan, a, tol = s.plan, s.st.alpha, spec.tolerance
    units = plan.search_units()
    n = len(s.full)
    search = np.arange(n) % 2 == 0
    found: dict[frozenset[Hashable], np.ndarray] = {}  # K -> m_(C minus K) - m_(M minus K) per prompt

    def differences(sets: Sequence[frozenset[Hashable]]) -> list[np.ndarray]:
        todo = [k for k in dict.fromkeys(sets) if k not in found]
        got = s.run([v for k in todo for v in (Variant(False, k, frozenset()), Variant(True, k, frozenset()))])
        for i, k in enumerate(todo):
            found[k] = got[2 * i] - got[2 * i + 1]
        return [found[k] for k in sets]

    def incompleteness(d: np.ndarray, rows: np.ndarray | None = None) -> float:
        keep = s.kept if rows is None else s.kept & rows
        return float(stats.ratio_of_means(d[keep], s.gap[keep]))

    rng = np.random.default_rng(s.seed)
    labels: dict[frozenset[Hashable], list[str]] = {}
    candidates = []
    for _ in range(spec.random if units else 0):
        pick = [u for u in units if rng.random() < 0.5] or [units[int(rng.integers(len(units)))]]
        k = frozenset().union(*(items for _, items in pick))
        labels.setdefault(k, [name for name, _ in pick])
        candidates.append(k)
    differences(candidates)
    current: frozenset[Hashable] = frozenset()
    chosen: list[str] = []
    for _ in range(min(spec.greedy, len(units))):
        left = [(name, items) for name, items in units if name not in chosen]
        trial = [current | items for _, items in left]
        scores = [abs(incompleteness(d, search)) for d in differences(trial)]
        best = int(np.argmax(scores))
        current, chosen = trial[best], chosen + [left[best][0]]
        labels.setdefault(current, list(chosen))
        candidates.append(current)
    final: list[tuple[frozenset[Hashable], str, np.ndarray | None]] = []
    if candidates:
        worst = max(candidates, key=lambda k: abs(incompleteness(found[k], search)))
        final.append((worst, "searched", ~search))
    for names_ in spec.sets:
        k = plan.named_set(names_)
        labels.setdefault(k, list(names_))
        final.append((k, "named", None))
    if not final:
        return CriterionResult(verdict=INCONCLUSIVE, statistic=None, circuits=0,
                               rule="completeness untested: no set K searched or named")
    diffs = differences([k for k, _, _ in final])
    m = len(final)
    tests, outside, inside = [], [], []
    for (k, how, rows), d in zip(final, diffs, strict=True):
        keep = s.kept if rows is None else s.kept & rows
        iv = stats.bootstrap_ci([d[keep], s.gap[keep]], stats.ratio_of_means, s.st.bootstrap, 1 - a / m, s.seed)
        ok = bool(np.isfinite(iv.low) and np.isfinite(iv.high))
        t = SetTest(members=labels.get(k, []), how=how, incompleteness=iv.estimate,
                    ci=[iv.low, iv.high] if ok else None, n_prompts=int(keep.sum()))
        tests.append(t)
        if ok and (iv.low > tol or iv.high < -tol):
            outside.append((t, iv))
        elif ok and -tol <= iv.low and iv.high <= tol:
            inside.append(t)
    searched = len(candidates)
    what = (f"{searched} sets searched on {int(search.sum())} prompts ({spec.random} random, {spec.greedy} greedy "
            f"steps), the worst tested on the other {n - int(search.sum())}, {len(spec.sets)} named; intervals at "
            f"{100 * (1 - a / m):.4g}% (Bonferroni over {m})")
    if outside:
        t, iv = max(outside, key=lambda pair: abs(pair[1].estimate))
        verdict, rule = FAIL, (f"incomplete: removing {{{', '.join(t.members)}}} changes the circuit's faithfulness by "
                               f"{iv.estimate:+.3f} more than the model's (CI [{iv.low:.3f}, {iv.high:.3f}] "
                               f"outside +-{tol:g}); {what}")
    elif len(inside) == len(tests):
        verdict, rule = PASS, f"every set tested within +-{tol:g}; {what}"
    else:
        verdict, rule = INCONCLUSIVE, (f"{len(tests) - len(inside)} of {len(tests)} sets not shown within "
                                       f"+-{tol:g}; {what}")
    return CriterionResult(verdict=verdict, statistic=max(abs(t.incompleteness or 0.0) for t in tests), rule=rule,
                           circuits=0, sets=tests)
