"""Rendering evidence as Markdown (report.md) and the claim table.  Pure text
from the evidence alone, so `harness report` reproduces it from evidence.json;
each claim kind's details read through its view (report.views)."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ..evidence import explain_text
from ..evidence.details import Explained, LadderRow, WeightsVsUseRow
from ..evidence.format import fmt, fmt_ci, fmt_p
from ..evidence.result import ClaimResult, Evidence
from ..evidence.verdicts import EVIDENCE_TYPES
from ..model import behaviour
from ..spec.vocabulary import CIRCUIT_RUNGS, Rung
from . import views
from .prompts import prompt_lines
from .text import literal_result, md_block, md_cell, md_code, md_link_text, md_text, plain

FIGURE_CAPTIONS = {
    "attention.png": ("Attention patterns of the heads the claims name, averaged over the clean prompts (one colour "
                      "scale; positions named by the first prompt's tokens, [slot] where a template's slot sits in "
                      "every prompt, * the scored positions)."),
    "composition.png": ("Composition scores (weights) on one colour scale: sender heads (rows) against receiver "
                        "inputs (columns); red boxes: claimed edges. Each panel counts the cells above their own "
                        "null 99th percentile (per cell, uncorrected: many cells above it says the null is "
                        "exceeded broadly, not that each route is used)."),
    "effects.png": ("Observational and causal claims, one panel per unit: estimate and CI (colour = verdict), "
                    "per-prompt values in grey, and the PASS region (green, dashed bound) the CI must lie in; a "
                    "claim whose value is undefined says why in its row."),
    "explain.png": ("What flows through the claimed head routes, one row per route (mech.weights.explain): left, the "
                    "product's singular values sigma_i / (||X|| ||Y||) (their squares sum to C²) against the "
                    "rotation null's 95% band; middle, the principal angles between what the sender writes and "
                    "what the receiver reads, against the null's band; right, the top directions' share of C² "
                    "and the tokens they read."),
    "signature.png": ("Signature plot: composition score against edge effect (noising, resample replacement) for "
                      "every candidate edge into the named receivers. Colour: use by the edge claims' rule (the "
                      "CI against min_effect and ±tolerance, BH-adjusted p); filled: composes (BH-adjusted null "
                      "p < composition_alpha); ring: claimed edges. Claimed and used edges are labelled."),
}
FIGURE_PLACES = {"weights": "composition.png", "observational": "attention.png", "causal": "effects.png"}


def key_number(r: ClaimResult) -> str:
    """The number the claim table shows for a result (its kind decides the form; an
    interval with an undefined bound, e.g. from fewer than 2 prompts, reads `undefined`)."""
    if r.ci is not None and None in r.ci:
        return f"{fmt(r.value)} {fmt_ci(r.ci)}"
    return views.get(r.kind).key_number(r)


def anchor(index: int) -> str:
    """The HTML id of the section of the claim at `index` (0-based): `claim-<n>`, n from 1."""
    return f"claim-{index + 1}"


NBSP = "\u00a0"  # keeps `value [CI]` on one line in the report's table


def claim_table(ev: Evidence, tablefmt: str = "simple") -> str:
    """The claim table: id, kind, expectation, verdict, value [CI] (a tabulate format).

    In the "github" format (report.md) every cell is literal Markdown (`md_cell`), each id
    links to its claim's section, the value does not wrap, and a `reason` column says why
    each verdict (ClaimResult.why).  In any other format (the terminal) every cell is one
    line without control characters, and the reasons of the claims that did not pass
    follow the table, one line each."""
    if tablefmt == "github":
        rows = [(f"[{md_link_text(c.id)}](#{anchor(i)})", md_cell(c.kind), md_cell(c.expectation), md_cell(c.verdict),
                 md_cell(key_number(c)).replace(" ", NBSP), md_cell(c.why)) for i, c in enumerate(ev.claims)]
        return tabulate(rows, headers=["claim", "kind", "expectation", "verdict", "value [CI]", "reason"],
                        tablefmt=tablefmt, disable_numparse=True)
    cells = [[plain(x) for x in (c.id, c.kind, c.expectation, c.verdict, key_number(c))] for c in ev.claims]
    table = tabulate(cells, headers=["claim", "kind", "expectation", "verdict", "value [CI]"], tablefmt=tablefmt,
                     disable_numparse=[0, 1, 2])
    why = [f"  {plain(c.id)}: {c.verdict}: {plain(c.why)}" for c in ev.claims if c.verdict != "PASS"]
    return table + ("\n\nwhy not PASS:\n" + "\n".join(why) if why else "")


def _figure(name: str, figures: frozenset[str] | set[str]) -> list[str]:
    if name not in figures:
        return []
    return [f"![{FIGURE_CAPTIONS[name]}](figures/{name})", "", f"*{FIGURE_CAPTIONS[name]}*", ""]


def _claim_section(r: ClaimResult, unit: str, index: int) -> list[str]:
    """A claim's section (its heading carries the id the verdict table links to); every
    string of the result (its details' too) is literal text."""
    description = md_block(r.description) if r.description.strip() else ""
    r = literal_result(r)
    out = [f'#### <a id="{anchor(index)}"></a>{r.id} — {r.verdict}', ""]
    if description:
        out += [description, ""]
    confidence = getattr(r.details, "confidence", None) or 0.95
    ci = f", {int(round(100 * confidence))}% CI [{fmt(r.ci[0])}, {fmt(r.ci[1])}]" if r.ci else ""
    out += [f"- expectation: {r.expectation}", f"- value: {fmt(r.value)} ({r.unit}){ci}", f"- rule: {r.rule}"]
    return out + views.get(r.kind).lines(r, md_text(unit)) + [""]


SYMBOLS = {"supports": "✓", "against": "✗", "inconclusive": "?", "untested": "∅"}


CRITERIA_WORDS = {Rung.EQUIVALENCE: "equivalent", Rung.COMPLETENESS: "complete", Rung.INDEPENDENCE: "independent",
                  Rung.MINIMALITY: "minimal"}


def ladder_table(rows: list[LadderRow]) -> list[str]:
    """The evidence ladder: per mechanism, each rung's steps, the highest rung reached,
    and the contradictions.  The circuit criteria's four rungs share one column (`criteria`:
    `✓ complete ✗ minimal` on a circuit's row, `✓ needed` on a member's), so that stating them
    widens the table by one column, not four."""
    if not rows:
        return []
    body = []
    shown = [r for r in Rung if r not in CIRCUIT_RUNGS and (r != Rung.ATTRIBUTION
                                                           or any(r in row.rungs for row in rows))]
    criteria = any(r in row.rungs for row in rows for r in CIRCUIT_RUNGS)
    for r in rows:
        cells = []
        for rung in shown:
            if rung == Rung.ROBUSTNESS and criteria:  # the criteria's column sits where their rungs do
                words = {c: (CRITERIA_WORDS[c] if r.type == "heads" else "needed") for c in CIRCUIT_RUNGS}
                cells.append(" ".join(f"{SYMBOLS[s.status]} {words[c]}" for c in CIRCUIT_RUNGS
                                      for s in r.rungs.get(c, [])))
            steps = r.rungs.get(rung)
            cells.append(" ".join(f"{SYMBOLS[s.status]} {md_cell(s.claim)}" for s in steps) if steps
                         else "—" if rung in r.missing else "")
        body.append([md_cell(r.mechanism), *cells, md_cell(r.highest or "none"),
                     md_cell("; ".join(r.contradictions) or "none")])
    headers = [h for rung in shown for h in (["criteria", rung] if rung == Rung.ROBUSTNESS and criteria else [rung])]
    legend = ("; criteria: a circuit claim's stated criteria (✓ complete: shown complete, ✗ minimal: not minimal), "
              "and on a member's row whether minimality found it needed" if criteria else "")
    return ["## Evidence ladder", "",
            "Per mechanism the file names, the levels of evidence this run reached, lowest first, for the "
            "mechanism as the file states it: ✓ a claim that PASSed (whatever its direction: a head claimed not "
            "needed that is not needed is ✓), ✗ one that FAILed, ? inconclusive, ∅ untested (the intervention "
            "changed nothing it reads), — applies but no claim tested it; `(weights vs use)` is the route's "
            f"composition test where no composition claim names it{legend}. A high rung does not erase a "
            "contradiction on a lower one.", "",
            tabulate(body, headers=["mechanism", *headers, "highest", "contradictions"], tablefmt="github",
                     disable_numparse=True), ""]


def weights_vs_use_table(rows: list[WeightsVsUseRow]) -> list[str]:
    """Composition (weights) beside causal effect (use), one row per edge and direction with
    every claim that tests it."""
    if not rows:
        return []
    body = [(md_cell(r.edge), md_cell(r.direction),
             "no score (MLP)" if r.composes is None else fmt(r.composition),
             "—" if r.composes is None else fmt_p(r.composition_p_adjusted),
             "—" if r.composes is None else "yes" if r.composes else "no",
             "undefined" if r.effect is None or not r.effect_ci
             else f"{r.effect:.3f} [{fmt(r.effect_ci[0])}, {fmt(r.effect_ci[1])}]",
             md_cell(r.use), md_cell(r.classification),
             md_cell("; ".join(f"{t.claim} ({t.replacement}" + (f", {t.corruption}" if t.corruption else "")
                               + f"): {t.use}" for t in r.tests))) for r in rows]
    return ["## Weights vs use", "",
            "A high composition score proposes a route; only the intervention shows it is used. *Unused* means an "
            "intervention that changes what the receiver reads moved the metric by less than the tolerance; an "
            "intervention that changes nothing there (*untested*) is no evidence either way. A group of senders "
            "(`A + B`) composes as their combined write (their OVs stacked); an edge with an MLP end has no "
            "composition score (scores are defined between attention heads).", "",
            tabulate(body, headers=["edge", "direction", "composition", "p_adj", "composes", "effect [CI]", "use",
                                    "class", "tests"], tablefmt="github", disable_numparse=[0, 1, 6, 7, 8]), ""
            ] + explained_block(rows)


def explained_block(rows: list[WeightsVsUseRow]) -> list[str]:
    """What flows through each edge of the table (once per edge): its top singular directions'
    share of C² against the rotation null, and what the first one reads."""
    seen: dict[str, Explained] = {}
    for r in rows:
        if r.explained is not None:
            seen.setdefault(r.edge, r.explained)
    if not seen:
        return []
    out = ["**What flows** through each route (the singular directions of the product of the sender's OV and "
           "the receiver's input matrix; shares of C² against the rotation null, principal angles between what "
           "the sender writes and what the receiver reads):", ""]
    for edge, ex in seen.items():
        first, *rest = explain_text.lines(ex, edge, md_text, n=3)
        out.append(f"- {md_text(edge)}: {first}")
        out += [f"  - {line}" for line in rest[:1]]
    return out + [""]


def behaviour_lines(b: dict[str, Any]) -> list[str]:
    """What the model does on the task before any claim: its accuracy and the answer's rank on the clean
    prompts, then each corruption's with its clean-corrupted gap (none in documents before version 8)."""
    got = b.get("behaviour")
    if not got:
        return []
    t = md_text
    line = (f"**Behaviour** on the {got['clean']['prompts']} clean prompts: {t(behaviour.words(got))}"
            + (" — **near chance**: no claim about how the model does the task means much" if got["near_chance"]
               else "") + ".")
    default = b.get("corruption")
    gaps = b.get("by_corruption") or ({default: {"gap": b["gap"]}} if isinstance(default, str) else {})
    rest = [f"on the prompts of corruption {md_code(str(name))}: {t(behaviour.words(got, name, full=False))}; clean − "
            f"corrupted gap {fmt(gaps[name]['gap']['mean'])} {fmt_ci(gaps[name]['gap']['ci'])} {t(b['unit'])}"
            for name in got["corrupted"] if name in gaps]
    return [line, ""] + [f"- {r}" for r in rest] + ([""] if rest else [])


def render_markdown(ev: Evidence, figures: frozenset[str] | set[str] = frozenset()) -> str:
    """The report: verdicts, evidence per claim (with figures), weights vs use,
    settings, provenance, sanity checks."""
    h, m, d, s, b = ev.hypothesis, ev.model, ev.data, ev.settings, ev.baseline
    t = md_text  # every value of the document is shown literally
    c = ev.counts()
    out = [f"# Evidence report: {t(h['name'])}", ""]
    if str(h.get("description") or "").strip():
        out += [md_block(h["description"]), ""]
    out += [f"**{c['PASS']} passed, {c['FAIL']} failed, {c['INCONCLUSIVE']} inconclusive** "
            f"of {len(ev.claims)} claims.", ""] + behaviour_lines(b)
    out += ["## Verdicts", "", claim_table(ev, "github"), ""]
    out += ladder_table(ev.ladder)
    out += ["## Evidence per claim", ""]
    position = {id(r): i for i, r in enumerate(ev.claims)}
    for kind, title in EVIDENCE_TYPES.items():
        group = [r for r in ev.claims if r.evidence == kind]
        if not group:
            continue
        place = FIGURE_PLACES.get(kind)
        if kind == "attribution" and not any(r.evidence == "causal" for r in ev.claims):
            place = FIGURE_PLACES["causal"]  # the effects figure shows estimates too
        out += [f"### {title}", ""] + (_figure(place, figures) if place else [])
        out += _figure("explain.png", figures) if kind == "weights" else []
        for r in group:
            out += _claim_section(r, b["unit"], position[id(r)])
    explain_placed = any(r.evidence == "weights" for r in ev.claims)  # beside the composition figure
    out += (weights_vs_use_table(ev.weights_vs_use) + ([] if explain_placed else _figure("explain.png", figures))
            + _figure("signature.png", figures))
    note = (ev.figures_data or {}).get("signature", {}).get("note")
    if note and "signature.png" in figures:
        out += [f"Signature plot data: {t(note)}.", ""]
    st = {k: t(v) if isinstance(v, str) else v for k, v in s["stats"].items()}
    out += ["## Settings", "",
            f"- data: {t(d['description'])} ({t(d['n_prompts'])} prompts of length {t(d['seq_len'])}, "
            f"{t(d['scored_positions_per_prompt'])} scored positions each; BOS at position 0: "
            f"{t(d['bos_at_position_0'])})",
            f"- metric: {t(s['metric'])} ({t(b['unit'])}); clean {fmt(b['clean']['mean'])}, corrupted "
            f"{fmt(b['corrupted']['mean'])}, gap {fmt(b['gap']['mean'])} {fmt_ci(b['gap']['ci'])}",
            f"- ablations: mean over {t(s['mean_ablation_reference'])}; resample from "
            f"{t(s['resample_ablation_source'])}",
            f"- weight processing: {t(s['weight_processing'])}",
            f"- statistics: {st['bootstrap']} BCa bootstrap resamples, "
            f"{st['confidence']:.0%} intervals, {st['permutations']} sign-flip "
            f"permutations, min_gap {st['min_gap']}, min_prompt_gap {st['min_prompt_gap']}; "
            f"causal alpha {st.get('alpha')}, min_effect {st.get('min_effect')}, tolerance "
            f"{st.get('tolerance')} (Benjamini-Hochberg over edge claims), min_change {st.get('min_change')}, "
            f"min_raw_change {st.get('min_raw_change')}; composition alpha "
            f"{st.get('composition_alpha')} with at least {st.get('null_draws')} null draws; "
            f"seed {t(s['seed'])}", ""]
    out += prompt_lines(d.get("examples"), d.get("n_prompts"))
    p = ev.provenance
    out += ["## Provenance", "",
            f"- model: {md_code(m['source'])} ({t(m['kind'])}, {t(m['n_layers'])} layers x {t(m['n_heads'])} heads, "
            f"d_model {t(m['d_model'])}, d_head {t(m['d_head'])}), sha256 {md_code(str(m['sha256'])[:16] + '…')}",
            *([f"- architecture: {t(m['architecture']['name'])}: "
               f"{t(', '.join(m['architecture']['features']) or 'learned positions, one key/value head per head')}"]
              if m.get("architecture") else []),
            f"- hypothesis: {md_code(h['file'] or '<dict>')}, sha256 {md_code(str(h['sha256'])[:16] + '…')}",
            *[f"- edges of {md_code(r['claim'])}: {md_code(r['file'])}"
              + (f" (its first {t(r['top'])})" if r.get("top") else "")
              + f", {t(r['edges'])} edges, sha256 {md_code(str(r['sha256'])[:16] + '…')}"
              for r in h.get("references", [])],
            "- versions: " + ", ".join(f"{t(k)} {t(v)}" for k, v in p["versions"].items()),
            f"- command: {md_code(p['command'])}",
            f"- run: {t(p['started'])} to {t(p['finished'])} on {t(p['host']['platform'])}"
            + (f", device {t(p['device'])}" if p.get("device") else ""), ""]
    if ev.warnings:
        out += ["## Warnings", ""] + [f"- {t(w)}" for w in ev.warnings] + [""]
    out += ["## Sanity checks", ""]
    out += [f"- {'not applicable' if ch.applies is False else 'ok' if ch.passed else 'FAILED'}: {t(ch.name)} — "
            f"{t(ch.detail)}" for ch in ev.sanity_checks]
    return "\n".join(out) + "\n"
