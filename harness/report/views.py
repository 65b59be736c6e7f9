"""How each claim kind's results read in a report: the rendering side of a claim kind.

A kind (claims.base.ClaimKind) measures and judges; its view says how a result reads,
from the result alone (so a run and `harness report EVIDENCE.json` render through one
path):

* `lines(result, unit)`: the Markdown bullet lines under the claim's expectation, value
  and rule (every string of the result is literal text already, report.text);
* `key_number(result)`: the number in the claim table (`value [low, high]`, `(exact)`);
* `reference_lines(result, plan)`: the (y, label) lines a sweep plot draws beside the
  claim's number (`plan`: the claim as planned, with `at_least`, `at_most`, `expect`);
* `claimed_edges(result)`: the edges the figures mark for it.

`register(kind_name, view)` adds the view of a kind registered from outside the package
(tests/toy_kind.py); a kind without one gets `ClaimView`'s defaults.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..claims.ablation import AblationDetails
from ..claims.attention import AttentionDetails
from ..claims.attribution import AttributionDetails
from ..claims.circuit_spec import CircuitDetails
from ..claims.composition import CompositionDetails
from ..claims.copying import CopyingDetails
from ..claims.edge import EdgeDetails
from ..claims.effects import InterventionChange, NormalizedFields
from ..claims.metric_parts import MetricPart
from ..claims.role import RoleDetails
from ..evidence.details import Details, Explained, Num, Sensitivity
from ..evidence.format import fmt, fmt_ci, fmt_p
from ..evidence.result import ClaimResult
from ..registry import Registry
from . import explain_text

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


# ---------------------------------------------------------------- the built-in kinds
class RoleView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, RoleDetails)
        return [f"- per-prompt median {fmt(d.median)}, IQR {fmt(d.iqr)}; {d.n_prompts} prompts, "
                f"{d.n_undefined} undefined"]


class AttentionView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, AttentionDetails)
        return [f"- from {d.from_position} to {d.to_position}: per-prompt median {fmt(d.median)}, IQR {fmt(d.iqr)}; "
                f"{d.n_prompts} prompts"]


class CopyingView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, CopyingDetails)
        return [f"- {d.n_eigenvalues} eigenvalues of W_E OV W_U (d_head x d_head form), "
                f"sum |lambda| = {d.sum_abs_eigenvalues:.4g}; weights {d.processing}"]


class CompositionView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, CompositionDetails)
        return [f"- null (random relative orientation, spectra kept, {d.n_draws} draws): mean "
                f"{fmt(d.null_mean)}, sd {fmt(d.null_std)}, 95th pct {fmt(d.null_q95)}, 99th pct {fmt(d.null_q99)}",
                f"- C·sqrt({d.null_dim}) = {fmt(d.ratio_to_isotropic, 2)} (1 = isotropic baseline); "
                f"C / C_max = {fmt(d.fraction_of_max)} (C_max = {fmt(d.c_max)}); percentile among all cross-layer "
                f"{d.mode.upper()} pairs: {fmt(d.percentile, 1)}; rank(X) = {d.rank_sender} (X: the sender's OV), "
                f"rank(Y) = {d.rank_receiver} (Y: the receiver's {'OV' if d.mode == 'v' else 'QK'}); "
                f"weights {d.processing}"] + explained_lines(d.explained, d.edge)

    def key_number(self, result: ClaimResult) -> str:
        if result.value is None:
            return "undefined"
        return f"{result.value:.3f} (p_adj {fmt_p(details(result, CompositionDetails).p_adjusted)})"

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        return [(details(result, CompositionDetails).null_q99, "null 99th pct")]

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return [details(result, CompositionDetails).edge]


class AblationView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, AblationDetails)
        out = [f"- metric: clean {fmt(d.clean_metric_mean)}, ablated {fmt(d.ablated_metric_mean)}, corrupted "
               f"{fmt(d.corrupted_metric_mean)} {unit}" + (f" (corruption {d.corruption})" if d.corruption else ""),
               f"- raw drop {fmt(d.drop_mean)} {unit} {fmt_ci(d.drop_ci)}, sign-flip p = {fmt_p(d.drop_p_value)}; "
               f"per-prompt median {fmt(d.drop_summary.median)}, IQR {fmt(d.drop_summary.iqr)}"]
        if d.normalized is not None and d.normalized_summary is not None:
            out.append(f"- normalized effect {fmt(d.normalized)} {fmt_ci(d.normalized_ci)}; per-prompt median "
                       f"{fmt(d.normalized_summary.median)}, IQR {fmt(d.normalized_summary.iqr)}; "
                       f"{d.n_excluded_small_gap} prompt(s) excluded for a small clean-corrupted gap")
        out += baseline_line(d, unit) + parts_line(d.parts, unit)
        if d.intervention_change is not None:
            out.append(change_line(d.intervention_change, "the ablated heads' output"))
        if d.sensitivity is not None:
            out.append(sensitivity_line(d.sensitivity, "ablation type"))
        return out


class EdgeView(ClaimView):
    """Edge and path claims."""

    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, EdgeDetails)
        wvu = f"; weights vs use: **{d.weights_vs_use}**" if d.weights_vs_use is not None else ""
        where = f" (corruption {d.corruption})" if d.corruption else ""
        out = [f"- metric: clean {fmt(d.clean_metric_mean)}, patched {fmt(d.patched_metric_mean)}, corrupted "
               f"{fmt(d.corrupted_metric_mean)} {unit}{where}",
               f"- raw change {fmt(d.change_mean)} {unit} {fmt_ci(d.change_ci)}; sign-flip p = {fmt_p(d.p_value)}, "
               f"BH-adjusted {fmt_p(d.p_adjusted)}; use: **{d.use}**{wvu}"]
        out += prompt_effect_line(d, "effect")
        out += baseline_line(d, unit) + parts_line(d.parts, unit)
        if d.intervention_change is not None:
            out.append(change_line(d.intervention_change, f"the sender {d.edge.split(' -> ')[0]}'s output"))
        if d.sensitivity is not None:
            out.append(sensitivity_line(d.sensitivity, "replacement"))
        return out

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        d = details(result, EdgeDetails)
        return use_reference_lines(plan.get("expect") == "used", d.min_effect, d.tolerance)

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return [details(result, EdgeDetails).edge]


class AttributionView(ClaimView):
    """Attribution claims: an estimate, said so on every line."""

    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, AttributionDetails)
        how = d.method + (f", {d.steps} steps" if d.method == "eap-ig" else "")
        where = f" (corruption {d.corruption})" if d.corruption else ""
        out = [f"- attribution score ({how}; estimates clean minus patched metric): mean {fmt(d.score_mean)} {unit} "
               f"{fmt_ci(d.score_ci)}{where}; sign-flip p = {fmt_p(d.p_value)}, BH-adjusted {fmt_p(d.p_adjusted)}; "
               f"estimated use: **{d.use}** — an estimate, not an intervention"]
        out += prompt_effect_line(d, "estimated effect")
        if d.intervention_change is not None:
            out.append(change_line(d.intervention_change, f"the sender {d.edge.split(' -> ')[0]}'s output"))
        return out

    def reference_lines(self, result: ClaimResult, plan: dict[str, Any]) -> list[tuple[Num, str]]:
        d = details(result, AttributionDetails)
        return use_reference_lines(plan.get("expect", "used") == "used", d.min_effect, d.tolerance)

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return [details(result, AttributionDetails).edge]


class CircuitView(ClaimView):
    def lines(self, result: ClaimResult, unit: str) -> list[str]:
        d = details(result, CircuitDetails)
        kept = (f"{len(d.edges)} of the model's {d.graph_edges} edges kept, joining {', '.join(d.heads) or 'no heads'}"
                if d.edges is not None else f"heads kept: {', '.join(d.heads)}")
        out = [f"- metric: full {fmt(d.full_metric_mean)}, circuit {fmt(d.circuit_metric_mean)}, empty "
               f"{fmt(d.empty_metric_mean)} {unit}; {kept}"]
        if d.edge_classes is not None:
            out.append(f"- kept edges by class: {edge_classes_text(d.edge_classes)}")
        if d.beaten is not None and d.random_faithfulness_summary is not None and d.beat_p_value is not None:
            rs = d.random_faithfulness_summary
            out.append(f"- {d.random_circuits} random circuits drawn (at most {d.random_draws_max}; {d.random_draw}): "
                       f"faithfulness median {fmt(rs.median)}, IQR {fmt(rs.iqr)}, max "
                       f"{fmt(d.random_faithfulness_max)}; beaten {d.beaten}; sequential test: {d.beat_decision} than "
                       f"the rate {d.beat_rate:g}, p = {fmt_p(d.beat_p_value)}")
        if d.intervention_change is not None:
            out.append(change_line(d.intervention_change, "the output of the heads outside the circuit"
                                   if d.edges is None else "the output of the senders whose edges are removed"))
        if d.sensitivity is not None:
            out.append(sensitivity_line(d.sensitivity, "ablation type (faithfulness bound only)"))
        if d.criteria:
            out.append(f"- faithfulness bound and random circuits alone: {d.bound_verdict}")
            out += [f"- {name}: **{r.verdict}** ({r.circuits} circuits): {r.rule}" for name, r in d.criteria.items()]
            minimality = d.criteria.get("minimality")
            failing = [m for m in (minimality.members or []) if m.status != "needed"] if minimality else []
            if failing:
                out.append("- members not shown needed: " + ", ".join(
                    f"{m.member} {m.status} (knockout {m.knockout:+.3f}, beats {m.beaten} fillers)"
                    for m in failing[:20]) + (f", and {len(failing) - 20} more" if len(failing) > 20 else ""))
        return out

    def claimed_edges(self, result: ClaimResult) -> list[str]:
        return list(details(result, CircuitDetails).edges or [])


def edge_classes_text(classes: dict[str, dict[str, int]]) -> str:
    """'embed -> v 3, head -> logits 2, ...': the non-zero classes of a {sender: {receiver: count}} table."""
    parts = [f"{s} -> {r} {n}" for s, row in classes.items() for r, n in row.items() if n]
    return ", ".join(parts) or "none"


_BUILTIN: dict[str, ClaimView] = {"role": RoleView(), "attention": AttentionView(), "copying": CopyingView(),
                                  "composition": CompositionView(), "ablation": AblationView(),
                                  "attribution": AttributionView(), "edge": EdgeView(), "path": EdgeView(),
                                  "circuit": CircuitView()}
_VIEWS: Registry[ClaimView] = Registry("claim view", _BUILTIN)
DEFAULT = ClaimView()


def register(kind: str, view: ClaimView) -> None:
    """The view of claim kind `kind` (a kind registered from outside the package)."""
    _VIEWS.register(kind, view)


def unregister(kind: str) -> None:
    _VIEWS.unregister(kind)


def get(kind: str) -> ClaimView:
    """The view of kind `kind` (ClaimView's defaults for a kind without one)."""
    return _VIEWS.find(kind) or DEFAULT
