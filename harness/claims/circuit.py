"""Claim kind `circuit`: keeping only these heads (ablating every other head)
recovers at least a fraction of the clean behaviour, and more than random
circuits of the same size (causal evidence, node level).

    faithfulness F = sum(m_C - m_empty) / sum(m_full - m_empty)

over prompts with m_full - m_empty >= min_prompt_gap (defined when that mean gap
is >= min_gap; claims.effects), with m_full the clean run, m_C the run with
every head outside C ablated and m_empty the run with every head ablated.  For
`at_least` claims it is compared with N random circuits of the same size (never
C itself): k = #{F_random < F}, one-sided binomial test of H0: P(beat) <= beat_rate.
PASS needs the bound met and p < alpha; FAIL when the bound fails or
k / N <= beat_rate.

Non-vacuity (mech.change): ablating a head outside C that leaves its output as it
was (relative change below `min_change`) does not test whether C needs it; a
PASS with such a head is INCONCLUSIVE, naming the heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from math import comb
from typing import Literal

import numpy as np
from pydantic import Field, StrictBool

from .. import stats
from ..evidence.details import CI, Details, Num, Sensitivity, Summary, optional
from ..evidence.format import fmt, fmt_p
from ..evidence.result import ClaimResult
from ..evidence.verdicts import FAIL, INCONCLUSIVE, PASS, Verdict, threshold_verdict
from ..mech.runs import Runs
from ..progress import stage
from ..spec import names
from ..spec.fields import BoundedCausalClaim, UnitList
from ..spec.names import hook_mlp_out, hook_resid_pre, hook_z
from ..spec.settings import Stats
from ..spec.vocabulary import Ablation, LadderStatus, Rung
from . import effects
from .base import (
    ClaimKind,
    Context,
    HeadAblationPath,
    Indexed,
    InterventionPath,
    LadderEntry,
    Measured,
    bounded_status,
    heads_mechanism,
    sensitivity_entry,
    supporting,
    with_details,
)

UNIT = "faithfulness"


class CircuitClaim(BoundedCausalClaim):
    """Keeping only these heads recovers at least (or at most) a fraction of the behaviour."""

    kind: Literal["circuit"]
    heads: UnitList  # heads and MLPs (L1.mlp)
    ablation: Ablation = Ablation.RESAMPLE
    random_circuits: int = Field(100, ge=20, le=100_000)
    beat_rate: float = Field(0.5, ge=0.0, lt=1.0)
    sensitivity: StrictBool = False


class CircuitDetails(Details):
    heads: list[str]
    ablation: str
    full_metric_mean: float
    circuit_metric_mean: float
    empty_metric_mean: float
    n_prompts: int
    random_circuits: int  # random circuits compared (0: no comparison)
    beat_rate: float
    confidence: float
    n_excluded_small_gap: int
    gap_mean: float  # of m_full - m_empty over all prompts
    kept_gap_mean: Num
    faithfulness: Num = optional()
    faithfulness_ci: CI | None = optional()
    faithfulness_summary: Summary | None = optional()
    faithfulness_ci_method: str | None = optional()
    random_faithfulness_summary: Summary | None = optional()
    random_faithfulness_max: Num = optional()
    beaten: int | None = optional()
    binomial_p_value: Num = optional()
    alpha: float | None = optional()
    corruption: str | None = optional()
    intervention_change: effects.InterventionChange | None = optional()  # of the heads outside the circuit
    sensitivity: Sensitivity | None = optional()  # faithfulness under each ablation type (bound only)


def random_faithfulness(runs: Runs, claim: CircuitClaim, m_empty: np.ndarray, kept: np.ndarray,
                        seed: int) -> np.ndarray | None:
    """Faithfulness of `claim.random_circuits` random circuits of the claim's size (never
    the claimed one), over the kept prompts; None when no other circuit of that size exists."""
    every = pool(claim, runs.n_layers, runs.n_heads)
    size = len(claim.heads)
    if comb(len(every), size) <= 1:
        return None
    gap = runs.m_clean - m_empty
    rng = np.random.default_rng(seed)
    claimed = sorted(every.index(h) for h in claim.heads)
    complements = []
    for _ in range(claim.random_circuits):
        pick = claimed
        while pick == claimed:
            pick = sorted(rng.choice(len(every), size=size, replace=False).tolist())
        chosen = set(pick)
        complements.append([h for j, h in enumerate(every) if j not in chosen])
    stage(f"random circuits ({claim.id}): {len(complements)}, stacked along the batch")
    m_r = runs.ablated_many(complements, claim.ablation)
    return np.asarray([float((m - m_empty)[kept].sum() / gap[kept].sum()) for m in m_r])


def with_mlps(claim: CircuitClaim) -> bool:
    """Whether the circuit is drawn from heads and MLPs: when it names an MLP (a circuit of
    heads alone keeps every MLP)."""
    return any(isinstance(h, names.Mlp) for h in claim.heads)


def pool(claim: CircuitClaim, n_layers: int, n_heads: int) -> list[names.Unit]:
    """What the circuit keeps or ablates: every head, and every MLP when it names one."""
    heads: list[names.Unit] = list(names.Head.every(n_layers, n_heads))
    return heads + ([names.Mlp(layer) for layer in range(n_layers)] if with_mlps(claim) else [])


class CircuitKind(ClaimKind[CircuitClaim, CircuitDetails]):
    name = "circuit"
    spec = CircuitClaim
    details = CircuitDetails
    evidence = "causal"
    summary = "keeping only these heads recovers the behaviour (faithfulness) better than random circuits"

    def hooks(self, claim: CircuitClaim, n_layers: int) -> list[str]:
        mlps = [hook_mlp_out(layer) for layer in range(n_layers)] if with_mlps(claim) else []
        return [hook_z(layer) for layer in range(n_layers)] + mlps + [hook_resid_pre(0)]  # Runs.run starts there

    def uses_means(self, claim: CircuitClaim) -> bool:
        return claim.ablation == Ablation.MEAN or claim.sensitivity

    def interventions(self, claim: CircuitClaim, n_layers: int, n_heads: int) -> list[InterventionPath]:
        return [HeadAblationPath(tuple(pool(claim, n_layers, n_heads)))]

    def ladder(self, claim: CircuitClaim, result: ClaimResult) -> list[LadderEntry]:
        d = self.details_of(result)
        status = bounded_status(claim, result)
        if d.intervention_change is not None and d.intervention_change.vacuous_heads:
            status = LadderStatus.UNTESTED if status == LadderStatus.INCONCLUSIVE else status
        mechanism = f"circuit {heads_mechanism(claim.heads)[0]}"
        return ([LadderEntry(mechanism, "heads", Rung.SUFFICIENCY, status,
                             f"faithfulness {fmt(result.value)} with the rest {claim.ablation}-ablated", d.corruption)]
                + sensitivity_entry(mechanism, "heads", d.sensitivity, supporting(claim)))

    def measure(self, claims: Sequence[Indexed[CircuitClaim]], ctx: Context) -> Measured:
        st = ctx.stats
        out = {}
        for i, c in claims:
            runs, seed = ctx.runs_for(c.corruption), ctx.claim_seed(i)
            every = pool(c, runs.n_layers, runs.n_heads)
            keep = set(c.heads)
            rest = [h for h in every if h not in keep]
            m_circuit, m_empty = runs.ablated_many([rest, every], c.ablation)
            kept = (runs.m_clean - m_empty) >= st.min_prompt_gap
            random_f = None
            if c.at_least is not None and kept.sum() > 0:
                random_f = random_faithfulness(runs, c, m_empty, kept, seed)
            change = effects.head_change(runs, rest, c.ablation, st) if rest else None
            jack = None
            if c.ablation == Ablation.MEAN:
                groups = list(range(runs.reference.groups))
                both = runs.ablated_many([rest] * len(groups) + [every] * len(groups), Ablation.MEAN, groups + groups)
                jack = list(zip(both[:len(groups)], both[len(groups):], strict=True))
            result = self.evaluate(c, runs.m_clean, m_circuit, m_empty, random_f, st, seed, ctx.unit, change,
                                   runs.corruption, jack=jack)
            if c.sensitivity:
                def variant(kind: str, c: CircuitClaim = c, runs: Runs = runs, rest: list[names.Unit] = rest,
                            every: list[names.Unit] = every, seed: int = seed) -> ClaimResult:
                    v = c.model_copy(update={"ablation": kind})
                    ch = effects.head_change(runs, rest, kind, st) if rest else None
                    return self.evaluate(v, runs.m_clean, runs.ablated(rest, kind), runs.ablated(every, kind), None,
                                         st, seed, ctx.unit, ch, runs.corruption, compare=False)
                result = with_details(result, sensitivity=effects.sensitivity(variant, result))
            out[i] = result
        return Measured(out)

    def evaluate(self, claim: CircuitClaim, m_full: np.ndarray, m_circuit: np.ndarray, m_empty: np.ndarray,
                 random_f: np.ndarray | None, st: Stats, seed: int, unit: str,
                 change: effects.InterventionChange | None = None, corruption: str | None = None,
                 compare: bool = True, jack: list[tuple[np.ndarray, np.ndarray]] | None = None) -> ClaimResult:
        """random_f: faithfulness of random circuits of the same size (never the claimed
        one; over the same kept prompts), or None when no other circuit of that size exists.
        The random comparison applies to at_least claims only.  jack: (m_C, m_empty) with
        each reference group left out of the mean (mean ablation), widening F's CI."""
        from scipy.stats import binomtest

        compare = compare and claim.at_least is not None
        n_mlps = sum(isinstance(h, names.Mlp) for h in claim.heads)
        n_heads = len(claim.heads) - n_mlps
        members = (f"{n_heads} head{'s' * (n_heads != 1)} and {n_mlps} MLP{'s' * (n_mlps != 1)} ({claim.ablation} "
                   "elsewhere, MLPs included)" if n_mlps else f"{len(claim.heads)} heads ({claim.ablation} elsewhere)")
        expectation = (f"keep {members}: faithfulness "
                       f"{claim.bound_text()}"
                       + (f", beats random circuits (rate > {claim.beat_rate:g})" if compare else ""))
        num, gap = m_circuit - m_empty, m_full - m_empty
        # the "gap" of a circuit is full minus empty: same rules as a normalised effect
        norm = effects.normalized_effect(num, gap, st, seed, unit, gap_name="full-empty")
        if jack and norm.interval is not None:
            kept = norm.kept
            thetas = [float((mc - me)[kept].sum() / (m_full - me)[kept].sum()) for mc, me in jack]
            norm = replace(norm, interval=effects.widen(norm.interval, thetas, st.confidence))
        iv = norm.interval
        details = CircuitDetails(
            heads=[str(h) for h in claim.heads], ablation=claim.ablation, full_metric_mean=float(m_full.mean()),
            circuit_metric_mean=float(m_circuit.mean()), empty_metric_mean=float(m_empty.mean()),
            n_prompts=int(len(num)), random_circuits=0 if random_f is None else int(len(random_f)),
            beat_rate=claim.beat_rate, confidence=st.confidence, **effects.effect_fields(norm, "faithfulness"),
            corruption=corruption, intervention_change=change)
        if iv is None:
            return self.result(claim, expectation=expectation, verdict=INCONCLUSIVE, value=None, ci=None, unit=UNIT,
                               details=details, rule=f"faithfulness undefined: {norm.reason}")
        f_verdict, f_rule = threshold_verdict(iv.low, iv.high, claim.at_least, claim.at_most)

        def done(verdict: Verdict, rule: str, reason: str = "") -> ClaimResult:
            untested = change.vacuous_heads if change is not None and change.vacuous_heads else []
            if verdict == PASS and untested:
                verdict = INCONCLUSIVE
                reason = (f"untested for {', '.join(untested)}: ablating them leaves their output as it was "
                          f"(relative change < min_change {st.min_change:g})")
                rule = (f"untested for {', '.join(untested)}: {claim.ablation}-ablating them leaves their output as "
                        f"it was (relative change < min_change {st.min_change:g}), so the circuit's faithfulness "
                        f"does not show it works without them ({rule}); use ablation: zero, or a corruption that "
                        "changes their output")
            return self.result(claim, expectation=expectation, verdict=verdict, value=iv.estimate,
                               ci=[iv.low, iv.high], unit=UNIT, rule=rule, details=details,
                               per_prompt=norm.per_prompt, reason=reason)

        if not compare:
            return done(f_verdict, f"faithfulness {f_rule}")
        if random_f is None or len(random_f) == 0:
            return done(FAIL if f_verdict == FAIL else INCONCLUSIVE,
                        f"faithfulness {f_rule}; no other circuit of {len(claim.heads)} heads exists, so the "
                        "random-circuit comparison is undefined")
        k = int(np.sum(random_f < iv.estimate))
        test = binomtest(k, len(random_f), claim.beat_rate, alternative="greater")
        details = details.model_copy(update={
            "random_faithfulness_summary": Summary(**stats.summary(random_f)),
            "random_faithfulness_max": float(np.max(random_f)), "beaten": k, "binomial_p_value": float(test.pvalue),
            "alpha": st.alpha})
        return done(*random_comparison(f_verdict, f_rule, k, len(random_f), float(test.pvalue), st.alpha,
                                       claim.beat_rate))



KIND = CircuitKind()


def random_comparison(f_verdict: Verdict, f_rule: str, k: int, n: int, p: float, alpha: float,
                      beat_rate: float) -> tuple[Verdict, str, str]:
    """(verdict, rule, reason) of a circuit claim from its faithfulness verdict and the
    random-circuit comparison: it beats k of n random circuits, one-sided binomial p of
    k/n > beat_rate.  PASS needs the faithfulness PASS and p < alpha; FAIL follows a
    faithfulness FAIL or k/n <= beat_rate; otherwise INCONCLUSIVE (the reason names which
    part held it back)."""
    better = p < alpha
    worse = k / n <= beat_rate
    if f_verdict == PASS and better:
        verdict = PASS
    elif f_verdict == FAIL or worse:
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    beats = f"beats {k}/{n} random circuits (binomial p {fmt_p(p)} {'<' if better else '>='} alpha {alpha:g})"
    if verdict == PASS:
        reason = f"faithfulness {f_rule}; {beats}"
    elif f_verdict == FAIL:
        reason = f"faithfulness {f_rule}"
    elif worse:
        reason = f"beats only {k}/{n} random circuits, not more than the rate {beat_rate:g} (faithfulness {f_rule})"
    elif f_verdict == PASS:
        reason = f"faithfulness {f_rule}, but it {beats}: not clearly more than the rate {beat_rate:g}"
    else:
        reason = f"faithfulness {f_rule}; {beats}"
    rule = (f"faithfulness {f_rule}; beats {k}/{n} random circuits, binomial p = {fmt_p(p)} "
            f"({'<' if better else '>='} alpha {alpha:g})")
    return verdict, rule, reason
