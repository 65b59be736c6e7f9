"""Rendering evidence as Markdown (report.md) and the claim table.  Pure text
from the evidence alone, so `harness report` reproduces it from evidence.json;
each claim kind renders its own details (ClaimKind.render)."""

from __future__ import annotations

from tabulate import tabulate

from ..claims import registry
from ..evidence.details import RUNGS, LadderRow, WeightsVsUseRow
from ..evidence.format import fmt
from ..evidence.result import ClaimResult, Evidence
from ..evidence.verdicts import EVIDENCE_TYPES

FIGURE_CAPTIONS = {
    "attention.png": "Attention patterns of the claimed heads on the first clean prompt.",
    "composition.png": ("Composition scores (weights); dots: above the cell's own null 99th percentile "
                        "(uncorrected, a guide to the eye); red boxes: claimed edges."),
    "effects.png": "Claims with per-prompt data: estimate and CI (colour = verdict), per-prompt values in grey.",
    "signature.png": ("Signature plot: composition score against edge effect for every candidate edge "
                      "into the named receivers; claimed edges labelled."),
}
FIGURE_PLACES = {"weights": "composition.png", "observational": "attention.png", "causal": "effects.png"}


def key_number(r: ClaimResult) -> str:
    """The number the claim table shows for a result (its kind decides the form)."""
    return registry.get(r.kind).key_number(r)


def claim_table(ev: Evidence, tablefmt: str = "simple") -> str:
    """The claim table: id, kind, expectation, verdict, value [CI] (a tabulate format)."""
    rows = [(c.id, c.kind, c.expectation, c.verdict, key_number(c)) for c in ev.claims]
    return tabulate(rows, headers=["claim", "kind", "expectation", "verdict", "value [CI]"], tablefmt=tablefmt)


def _figure(name: str, figures: frozenset[str] | set[str]) -> list[str]:
    if name not in figures:
        return []
    return [f"![{FIGURE_CAPTIONS[name]}](figures/{name})", "", f"*{FIGURE_CAPTIONS[name]}*", ""]


def _claim_section(r: ClaimResult, unit: str) -> list[str]:
    out = [f"#### {r.id} — {r.verdict}", ""]
    if r.description:
        out += [r.description.strip(), ""]
    confidence = getattr(r.details, "confidence", None) or 0.95
    ci = f", {int(round(100 * confidence))}% CI [{fmt(r.ci[0])}, {fmt(r.ci[1])}]" if r.ci else ""
    out += [f"- expectation: {r.expectation}", f"- value: {fmt(r.value)} ({r.unit}){ci}", f"- rule: {r.rule}"]
    return out + registry.get(r.kind).render(r, unit) + [""]


SYMBOLS = {"supports": "✓", "against": "✗", "inconclusive": "?", "untested": "∅"}


def ladder_table(rows: list[LadderRow]) -> list[str]:
    """The evidence ladder: per mechanism, each rung's steps, the highest rung reached,
    and the contradictions."""
    if not rows:
        return []
    body = []
    for r in rows:
        cells = []
        for rung in RUNGS:
            steps = r.rungs.get(rung)
            cells.append(" ".join(f"{SYMBOLS[s.status]} {s.claim}" for s in steps) if steps
                         else "—" if rung in r.missing else "")
        body.append([r.mechanism, *cells, r.highest or "none", "; ".join(r.contradictions) or "none"])
    return ["## Evidence ladder", "",
            "Per mechanism the file names, the levels of evidence this run reached, lowest first: ✓ supports it, "
            "✗ is against it, ? inconclusive, ∅ untested (the intervention changed nothing it reads), — applies "
            "but no claim tested it. A high rung does not erase a contradiction on a lower one.", "",
            tabulate(body, headers=["mechanism", *RUNGS, "highest", "contradictions"], tablefmt="github"), ""]


def weights_vs_use_table(rows: list[WeightsVsUseRow]) -> list[str]:
    """Composition (weights) beside causal effect (use), one row per edge and direction with
    every claim that tests it."""
    if not rows:
        return []
    body = [(r.edge, r.direction, fmt(r.composition), f"{r.composition_p_adjusted:.3g}", "yes" if r.composes else "no",
             "undefined" if r.effect is None or not r.effect_ci
             else f"{r.effect:.3f} [{fmt(r.effect_ci[0])}, {fmt(r.effect_ci[1])}]",
             r.use, r.classification, "; ".join(f"{t.claim} ({t.replacement}"
                                                + (f", {t.corruption}" if t.corruption else "") + f"): {t.use}"
                                                for t in r.tests)) for r in rows]
    return ["## Weights vs use", "",
            "A high composition score proposes a route; only the intervention shows it is used. *Unused* means an "
            "intervention that changes what the receiver reads moved the metric by less than the tolerance; an "
            "intervention that changes nothing there (*untested*) is no evidence either way.", "",
            tabulate(body, headers=["edge", "direction", "composition", "p_adj", "composes", "effect [CI]", "use",
                                    "class", "tests"], tablefmt="github"), ""]


def render_markdown(ev: Evidence, figures: frozenset[str] | set[str] = frozenset()) -> str:
    """The report: verdicts, evidence per claim (with figures), weights vs use,
    settings, provenance, sanity checks."""
    h, m, d, s, b = ev.hypothesis, ev.model, ev.data, ev.settings, ev.baseline
    c = ev.counts()
    out = [f"# Evidence report: {h['name']}", ""]
    if h.get("description"):
        out += [h["description"].strip(), ""]
    out += [f"**{c['PASS']} passed, {c['FAIL']} failed, {c['INCONCLUSIVE']} inconclusive** "
            f"of {len(ev.claims)} claims.", "", "## Verdicts", "", claim_table(ev, "github"), ""]
    out += ladder_table(ev.ladder)
    out += ["## Evidence per claim", ""]
    for kind, title in EVIDENCE_TYPES.items():
        group = [r for r in ev.claims if r.evidence == kind]
        if not group:
            continue
        out += [f"### {title}", ""] + _figure(FIGURE_PLACES[kind], figures)
        for r in group:
            out += _claim_section(r, b["unit"])
    out += weights_vs_use_table(ev.weights_vs_use) + _figure("signature.png", figures)
    st = s["stats"]
    out += ["## Settings", "",
            f"- data: {d['description']} ({d['n_prompts']} prompts of length {d['seq_len']}, "
            f"{d['scored_positions_per_prompt']} scored positions each; BOS at position 0: "
            f"{d['bos_at_position_0']})",
            f"- metric: {s['metric']} ({b['unit']}); clean {fmt(b['clean']['mean'])}, corrupted "
            f"{fmt(b['corrupted']['mean'])}, gap {fmt(b['gap']['mean'])} "
            f"[{fmt(b['gap']['ci'][0])}, {fmt(b['gap']['ci'][1])}]",
            f"- ablations: mean over {s['mean_ablation_reference']}; resample from "
            f"{s['resample_ablation_source']}",
            f"- weight processing: {s['weight_processing']}",
            f"- statistics: {st['bootstrap']} BCa bootstrap resamples, "
            f"{st['confidence']:.0%} intervals, {st['permutations']} sign-flip "
            f"permutations, min_gap {st['min_gap']}, min_prompt_gap {st['min_prompt_gap']}; "
            f"causal alpha {st.get('alpha')}, min_effect {st.get('min_effect')}, tolerance "
            f"{st.get('tolerance')} (Benjamini-Hochberg over edge claims), min_change {st.get('min_change')}, "
            f"min_raw_change {st.get('min_raw_change')}; composition alpha "
            f"{st.get('composition_alpha')} with at least {st.get('null_draws')} null draws; "
            f"seed {s['seed']}", ""]
    p = ev.provenance
    out += ["## Provenance", "",
            f"- model: `{m['source']}` ({m['kind']}, {m['n_layers']} layers x {m['n_heads']} heads, "
            f"d_model {m['d_model']}, d_head {m['d_head']}), sha256 `{m['sha256'][:16]}…`",
            f"- hypothesis: `{h['file'] or '<dict>'}`, sha256 `{h['sha256'][:16]}…`",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in p["versions"].items()),
            f"- command: `{p['command']}`",
            f"- run: {p['started']} to {p['finished']} on {p['host']['platform']}"
            + (f", device {p['device']}" if p.get("device") else ""), ""]
    if ev.warnings:
        out += ["## Warnings", ""] + [f"- {w}" for w in ev.warnings] + [""]
    out += ["## Sanity checks", ""]
    out += [f"- {'ok' if ch.passed else 'FAILED'}: {ch.name} — {ch.detail}" for ch in ev.sanity_checks]
    return "\n".join(out) + "\n"
