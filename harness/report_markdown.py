"""Rendering an evidence document as Markdown (report.md).  Pure text from
the evidence alone, so `harness report` reproduces it from evidence.json."""

from __future__ import annotations

from typing import Any

from .evidence import EVIDENCE_TYPES, ClaimResult, Evidence

FIGURE_CAPTIONS = {
    "attention.png": "Attention patterns of the claimed heads on the first clean prompt.",
    "composition.png": ("Composition scores (weights); dots: above the cell's own null 99th percentile "
                        "(uncorrected, a guide to the eye); red boxes: claimed edges."),
    "effects.png": "Claims with per-prompt data: estimate and CI (colour = verdict), per-prompt values in grey.",
    "signature.png": ("Signature plot: composition score against edge effect for every candidate edge "
                      "into the named receivers; claimed edges labelled."),
}
FIGURE_PLACES = {"weights": "composition.png", "observational": "attention.png", "causal": "effects.png"}


def _figure(name: str, figures: set[str]) -> list[str]:
    if name not in figures:
        return []
    return [f"![{FIGURE_CAPTIONS[name]}](figures/{name})", "", f"*{FIGURE_CAPTIONS[name]}*", ""]


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "undefined"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _claim_section(r: ClaimResult, unit: str) -> list[str]:
    out = [f"#### {r.id} — {r.verdict}", ""]
    if r.description:
        out += [r.description.strip(), ""]
    ci = (f", {int(round(100 * r.details.get('confidence', 0.95)))}% CI [{_fmt(r.ci[0])}, {_fmt(r.ci[1])}]"
          if r.ci else "")
    out += [f"- expectation: {r.expectation}", f"- value: {_fmt(r.value)} ({r.unit}){ci}",
            f"- rule: {r.rule}"]
    det = r.details
    if r.kind == "role" and "n_undefined" in det:
        out.append(f"- per-prompt median {_fmt(det.get('median'))}, IQR {_fmt(det.get('iqr'))}; "
                   f"{det['n_prompts']} prompts, {det['n_undefined']} undefined")
    elif r.kind == "role":
        out.append(f"- {det['n_eigenvalues']} eigenvalues of W_E OV W_U (d_head x d_head form), "
                   f"sum |lambda| = {det['sum_abs_eigenvalues']:.4g}; weights {det['processing']}")
    elif r.kind == "composition":
        out.append(f"- null (random relative orientation, spectra kept, {det['n_draws']} draws): mean "
                   f"{_fmt(det['null_mean'])}, sd {_fmt(det['null_std'])}, 95th pct {_fmt(det['null_q95'])}, "
                   f"99th pct {_fmt(det['null_q99'])}")
        out.append(f"- C·sqrt({det['null_dim']}) = {_fmt(det['ratio_to_isotropic'], 2)} (1 = isotropic baseline); "
                   f"C / C_max = {_fmt(det['fraction_of_max'])} (C_max = {_fmt(det['c_max'])}); "
                   f"percentile among all cross-layer {det['mode'].upper()} pairs: {_fmt(det['percentile'], 1)}; "
                   f"ranks {det['rank_sender']} / {det['rank_receiver']}; weights {det['processing']}")
    elif r.kind == "edge":
        out.append(f"- metric: clean {_fmt(det['clean_metric_mean'])}, patched "
                   f"{_fmt(det['patched_metric_mean'])}, corrupted {_fmt(det['corrupted_metric_mean'])} {unit}")
        out.append(f"- raw change {_fmt(det['change_mean'])} {unit} [{_fmt(det['change_ci'][0])}, "
                   f"{_fmt(det['change_ci'][1])}]; sign-flip p = {det['p_value']:.3g}, BH-adjusted "
                   f"{det['p_adjusted']:.3g}; use: **{det['use']}**"
                   + (f"; weights vs use: **{det['weights_vs_use']}**" if "weights_vs_use" in det else ""))
        if "normalized_summary" in det:
            ns = det["normalized_summary"]
            out.append(f"- per-prompt effect median {_fmt(ns['median'])}, IQR {_fmt(ns['iqr'])}; "
                       f"{det['n_excluded_small_gap']} prompt(s) excluded for a small clean-corrupted gap")
    elif r.kind == "circuit":
        out.append(f"- metric: full {_fmt(det['full_metric_mean'])}, circuit {_fmt(det['circuit_metric_mean'])}, "
                   f"empty {_fmt(det['empty_metric_mean'])} {unit}; heads kept: {', '.join(det['heads'])}")
        if "beaten" in det:
            rs = det["random_faithfulness_summary"]
            out.append(f"- {det['random_circuits']} random circuits of the same size: faithfulness median "
                       f"{_fmt(rs['median'])}, IQR {_fmt(rs['iqr'])}, max {_fmt(det['random_faithfulness_max'])}; "
                       f"beaten {det['beaten']}, binomial p = {det['binomial_p_value']:.3g}")
    elif r.kind == "ablation":
        out.append(f"- metric: clean {_fmt(det['clean_metric_mean'])}, ablated "
                   f"{_fmt(det['ablated_metric_mean'])}, corrupted {_fmt(det['corrupted_metric_mean'])} {unit}")
        out.append(f"- raw drop {_fmt(det['drop_mean'])} {unit} [{_fmt(det['drop_ci'][0])}, "
                   f"{_fmt(det['drop_ci'][1])}], sign-flip p = {det['drop_p_value']:.4g}; per-prompt "
                   f"median {_fmt(det['drop_summary']['median'])}, IQR {_fmt(det['drop_summary']['iqr'])}")
        if "normalized" in det:
            ns = det["normalized_summary"]
            out.append(f"- normalized effect {_fmt(det['normalized'])} [{_fmt(det['normalized_ci'][0])}, "
                       f"{_fmt(det['normalized_ci'][1])}]; per-prompt median {_fmt(ns['median'])}, "
                       f"IQR {_fmt(ns['iqr'])}; {det['n_excluded_small_gap']} prompt(s) excluded "
                       "for a small clean-corrupted gap")
    if "sensitivity" in det:
        sens = det["sensitivity"]
        cells = "; ".join(f"{k}: {v['verdict']} {_fmt(v['value'])}" for k, v in sens["by_type"].items())
        varied = "replacement" if r.kind == "edge" else "ablation type"
        out.append(f"- sensitivity across the {varied}: {cells} — "
                   f"{'verdict agrees' if sens['agrees'] else '**verdict depends on the ablation type**'}")
    return out + [""]


def weights_vs_use_table(rows: list[dict]) -> list[str]:
    """The DESIGN.md table: composition (weights) beside causal effect (use)."""
    from tabulate import tabulate

    if not rows:
        return []
    body = [(r["edge"], _fmt(r["composition"]), f"{r['composition_p_adjusted']:.3g}",
             "yes" if r["composes"] else "no",
             "undefined" if r["effect"] is None else f"{r['effect']:.3f} [{r['effect_ci'][0]:.3f}, {r['effect_ci'][1]:.3f}]",
             r["use"], r["class"]) for r in rows]
    return ["## Weights vs use", "",
            "A high composition score proposes a route; only the intervention shows it is used.", "",
            tabulate(body, headers=["edge", "composition", "p_adj", "composes", "effect [CI]", "use", "class"],
                     tablefmt="github"), ""]


def render_markdown(ev: Evidence, figures: set[str] = frozenset()) -> str:
    """The report: verdicts, evidence per claim (with figures), weights vs use,
    settings, provenance, sanity checks."""
    h, m, d, s, b = ev.hypothesis, ev.model, ev.data, ev.settings, ev.baseline
    c = ev.counts()
    out = [f"# Evidence report: {h['name']}", ""]
    if h.get("description"):
        out += [h["description"].strip(), ""]
    out += [f"**{c['PASS']} passed, {c['FAIL']} failed, {c['INCONCLUSIVE']} inconclusive** "
            f"of {len(ev.claims)} claims.", "", "## Verdicts", "", ev.table("github"), ""]
    out += ["## Evidence per claim", ""]
    for kind, title in EVIDENCE_TYPES.items():
        group = [r for r in ev.claims if r.evidence == kind]
        if not group:
            continue
        out += [f"### {title}", ""] + _figure(FIGURE_PLACES[kind], figures)
        for r in group:
            out += _claim_section(r, b["unit"])
    out += weights_vs_use_table(ev.weights_vs_use) + _figure("signature.png", figures)
    out += ["## Settings", "",
            f"- data: {d['description']} ({d['n_prompts']} prompts of length {d['seq_len']}, "
            f"{d['scored_positions_per_prompt']} scored positions each; BOS at position 0: "
            f"{d['bos_at_position_0']})",
            f"- metric: {s['metric']} ({b['unit']}); clean {_fmt(b['clean']['mean'])}, corrupted "
            f"{_fmt(b['corrupted']['mean'])}, gap {_fmt(b['gap']['mean'])} "
            f"[{_fmt(b['gap']['ci'][0])}, {_fmt(b['gap']['ci'][1])}]",
            f"- ablations: mean over {s['mean_ablation_reference']}; resample from "
            f"{s['resample_ablation_source']}",
            f"- weight processing: {s['weight_processing']}",
            f"- statistics: {s['stats']['bootstrap']} BCa bootstrap resamples, "
            f"{s['stats']['confidence']:.0%} intervals, {s['stats']['permutations']} sign-flip "
            f"permutations, min_gap {s['stats']['min_gap']}, min_prompt_gap {s['stats']['min_prompt_gap']}; "
            f"causal alpha {s['stats'].get('alpha')}, min_effect {s['stats'].get('min_effect')}, tolerance "
            f"{s['stats'].get('tolerance')} (Benjamini-Hochberg over edge claims); composition alpha "
            f"{s['stats'].get('composition_alpha')} with at least {s['stats'].get('null_draws')} null draws; "
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
    out += ["## Sanity checks", ""]
    out += [f"- {'ok' if ch['passed'] else 'FAILED'}: {ch['name']} — {ch['detail']}" for ch in ev.sanity_checks]
    return "\n".join(out) + "\n"
