"""How a claim kind's results read in a report: the view every kind carries (`ClaimKind.view`).

A kind (claims.base.ClaimKind) measures and judges; its view says how a result reads, from the
result alone (so a run and `harness report EVIDENCE.json` render through one path):

* `lines(result, unit)`: the Markdown bullet lines under the claim's expectation, value and rule
  (every string of the result is literal text already, report.text);
* `key_number(result)`: the number in the claim table (`value [low, high]`, `(exact)`);
* `reference_lines(result, plan)`: the (y, label) lines a sweep plot draws beside the claim's
  number (`plan`: the claim as planned, with `at_least`, `at_most`, `expect`);
* `claimed_edges(result)`: the edges the figures mark for it.

Each kind's module defines its view next to its measurement; the lines several kinds share
(the baseline-normalised effect, the intervention's change, sensitivity, a split metric) are here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..evidence import explain_text
from ..evidence.details import Details, Explained, Num, Sensitivity
from ..evidence.format import fmt, fmt_ci
from ..evidence.result import ClaimResult
from .effects import InterventionChange, NormalizedFields
from .metric_parts import MetricPart

D = TypeVar("D", bound=Details)
KNOCKOUT_WARN = 0.8  # a complete knockout reading below this on the corrupted scale is flagged in bold


def details(result: ClaimResult, kind: type[D]) -> D:
    """The result's details as `kind` (TypeError naming the claim when they are not)."""
    if not isinstance(result.details, kind):
        raise TypeError(f"claim {result.id!r}: details are {type(result.details).__name__}, not {kind.__name__}")
    return result.details


class ClaimView:
    """The default view: no detail lines, `value [low, high]` (or `(exact)`), the bound as the
    sweep plot's reference line, no edges."""

    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        return []

    def key_number(self, result: ClaimResult) -> str:
        if result.value is None:
            return "undefined"
        ci = f" [{result.ci[0]:.3f}, {result.ci[1]:.3f}]" if result.ci else " (exact)"
        return f"{result.value:.3f}{ci}"

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        for key in ("at_least", "at_most"):
            if plan.get(key) is not None:
                return [(plan[key], key.replace("_", " "))]
        return []

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return []


# ---------------------------------------------------------------- lines shared by the causal kinds
def baseline_line(d: NormalizedFields, unit: str) -> list[str]:
    """The line of the baseline-normalised effect (claims.effects.baseline_fields)."""
    if d.baseline_metric is None:
        return []
    below = ""
    if d.corrupted_below_baseline and d.knockout_reads_as is not None:
        strong = "**" if d.knockout_reads_as < KNOCKOUT_WARN else ""
        below = (f" (the corrupted run is below it: normalised by the clean-corrupted gap, a complete knockout to "
                 f"the baseline reads as {strong}{fmt(d.knockout_reads_as)}{strong})")
    return [f"- against a guess with no information (metric {fmt(d.baseline_metric)} {unit}): effect "
            f"{fmt(d.baseline_normalized)} {fmt_ci(d.baseline_normalized_ci)}{below}"]


def change_line(c: InterventionChange, what: str) -> str:
    """The line of an intervention's change (what = the sender(s)): non-vacuity."""
    heads = ""
    if c.by_head and len(c.by_head) > 1:
        low = sorted(c.by_head.items(), key=lambda hv: hv[1])[:6]
        heads = ("; per head " if len(c.by_head) <= 6 else "; lowest heads ") + ", ".join(
            f"{h} {v:.3f}" for h, v in low)
    if c.vacuous_heads and not c.vacuous:
        heads += (f"; unchanged on their own: {', '.join(c.vacuous_heads[:10])}"
                  f"{', ...' if len(c.vacuous_heads) > 10 else ''} (the set is judged as a whole)")
    if c.at_scored is not None:
        heads += f"; {c.at_scored:.3f} at the scored positions alone"
    verdict = ("nothing is written there: the route carries nothing, whatever the intervention" if c.silent
               else "**vacuous: the intervention does not change what is read, so it tests nothing**" if c.vacuous
               else "non-vacuous")
    return (f"- intervention change: {what} changes by {c.relative_change:.3f} (relative) at {c.read_at}, "
            f"{c.prompts_changed:.0%} of prompts by at least {c.min_change:g}{heads} — {verdict}")


def sensitivity_line(sens: Sensitivity, varied: str) -> str:
    """The line of a sensitivity run (`varied`: "replacement" or "ablation type")."""
    cells = "; ".join(f"{k}: {v.verdict} {fmt(v.value)}" for k, v in sens.by_type.items())
    return (f"- sensitivity across the {varied}: {cells} — "
            f"{'verdict agrees' if sens.agrees else '**verdict depends on the ablation type**'}")


def parts_line(parts: list[MetricPart] | None, unit: str) -> list[str]:
    """The line of a split metric (claims.metric_parts): each part over the claim's gap and raw."""
    if not parts:
        return []
    cells = "; ".join(f"{p.metric} {fmt(p.normalized)} {fmt_ci(p.normalized_ci)}" if p.normalized is not None
                      else f"{p.metric} raw {fmt(p.change_mean)} {unit}" for p in parts)
    return [f"- split of the effect: {cells} (fractions of the gap that add up to the effect; positive: the "
            "component helps through that logit)"]


def prompt_effect_line(d: NormalizedFields, what: str) -> list[str]:
    """The line of the per-prompt ratios of a normalised effect (none while it is undefined)."""
    if d.normalized_summary is None:
        return []
    return [f"- per-prompt {what} median {fmt(d.normalized_summary.median)}, IQR {fmt(d.normalized_summary.iqr)}; "
            f"{d.n_excluded_small_gap} prompt(s) excluded for a small clean-corrupted gap"]


def use_reference_lines(used: bool, min_effect: float, tolerance: float) -> list[tuple[Num, str]]:
    """A use claim's lines on a sweep plot: min_effect (expected used) or the ±tolerance band."""
    return [(min_effect, "min effect")] if used else [(tolerance, "+tolerance"), (-tolerance, "-tolerance")]


def explained_lines(ex: Explained | None, edge: str) -> list[str]:
    """The `explained` bullets of a composition claim (its strings are literal already)."""
    if ex is None:
        return []
    first, *rest = explain_text.lines(ex, edge)
    return [f"- explained (what flows, the product's singular directions against the rotation null, "
            f"{ex.n_draws} draws): {first}"] + [f"  - {line}" for line in rest]


def edge_classes_text(classes: dict[str, dict[str, int]]) -> str:
    """'embed -> v 3, head -> logits 2, ...': the non-zero classes of a {sender: {receiver: count}} table."""
    parts = [f"{s} -> {r} {n}" for s, row in classes.items() for r, n in row.items() if n]
    return ", ".join(parts) or "none"
