"""The report of `harness discover` (tools.discover), drawn from its discovery.json alone:
discover.md, discover.html (report.html's sanitised page), figures/curve.png (the faithfulness
curve with its intervals) and figures/circuit.png (the circuit at the starter's k drawn as a
graph: nodes by layer, each edge coloured by its exact effect where it was confirmed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tabulate import tabulate

from ..evidence.document import to_json
from ..evidence.format import fmt, fmt_ci, fmt_p
from ..model import behaviour
from .circuit_figure import draw_circuit
from .circuit_reading import SHOWN_NODES
from .discovery_figures import draw_curve, draw_stability
from .figures import png
from .html import render_html
from .text import md_cell, md_code, md_text
from .writer import place, rendered_again

VERSION = 5  # of discovery.json (docs/discover.md): `rerender` reads READABLE
READABLE = (1, 2, 3, 4, VERSION)
STARTER_EDGES = "starter-edges.txt"  # the starter circuit's edges, one per line (starter.yaml's edges_from)
SHOWN_AGAINST = 10  # the most negative edges named
OF_RANKING = {"signed": " of the signed ranking", "learned": " of the learned ranking"}


def is_discovery(doc: Any) -> bool:
    """Whether a JSON document is a discovery.json (`harness report` does not re-render those)."""
    return isinstance(doc, dict) and doc.get("kind") == "discovery"


def starter_words(doc: dict[str, Any]) -> str:
    """The starter circuit in a few words: the top k of its ranking, or the refined circuit."""
    k = doc.get("starter_k")
    if not k:
        return "none"
    if doc.get("starter_ranking") == "refined":
        r = doc["refined"]
        return f"the {k} edges of the refined circuit (from the top {r['from_k']} of the {r['from']} ranking)"
    return f"top {k} edges" + OF_RANKING.get(doc.get("starter_ranking") or "", "")


def signed_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranking's rows in the signed ranking's order: the largest signed score first (ties in the
    main ranking's order)."""
    return sorted(rows, key=lambda r: -float(r["score"]))


def learned_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranking's rows in the learned ranking's order: the largest mask logit first (ties in the
    main ranking's order)."""
    return sorted(rows, key=lambda r: -float(r["mask"]))


def ordered_rows(rows: list[dict[str, Any]], ranking: str | None) -> list[dict[str, Any]]:
    """The ranking's rows in the order of the ranking named `ranking` (`starter_ranking`'s values)."""
    return signed_rows(rows) if ranking == "signed" else learned_rows(rows) if ranking == "learned" else rows


def starter_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The starter circuit's rows: the first `starter_k` of the ranking it was chosen from
    (`starter_ranking`: the main ranking's order, the signed one's or the learned one's), or the refined
    circuit's edges (`refined`)."""
    if doc.get("starter_ranking") == "refined":
        by_edge = {r["edge"]: r for r in doc["ranking"]}
        return [by_edge[e] for e in doc["refined"]["edges"]]
    return ordered_rows(doc["ranking"], doc.get("starter_ranking"))[:doc.get("starter_k") or 0]


def points_table(pts: list[dict[str, Any]]) -> str:
    """Circuits tried (curve points), by k: k and faithfulness with its interval."""
    rows = [[p["k"], f"{fmt(p['faithfulness'])} {fmt_ci(p['ci'])}"] for p in sorted(pts, key=lambda p: p["k"])]
    return tabulate(rows, headers=["k", "faithfulness [CI]"], tablefmt="github")


def _signed_lines(doc: dict[str, Any]) -> list[str]:
    """The signed ranking's curve, its smallest circuit above the bound, and the edges that push
    against the answer."""
    signed = doc.get("signed")
    if not signed:
        return []
    pts = [p for p in [*signed["curve"], *signed["curve_finer"]] if 0 < p["k"] < doc["graph"]["edges"]]
    against = sorted((r for r in doc["ranking"] if r["score"] < 0), key=lambda r: float(r["score"]))[:SHOWN_AGAINST]
    out = ["The **signed ranking** puts the edges that push the metric towards the clean answer first and those "
           f"that push against it ({signed['negative_edges']:,} of the {doc['graph']['edges']:,} edges) last, so its "
           "circuits leave the opposing edges out (the ranking by |score| mixes them in: a faithfulness above 1 "
           "means the circuit misses edges that hold the answer back):", "",
           points_table(pts), "",
           f"CPR {fmt(signed['summaries']['CPR']['value'])}, CMD {fmt(signed['summaries']['CMD']['value'])}; the "
           "edges that push hardest against the answer: "
           + (", ".join(f"{md_code(r['edge'])} ({fmt(r['score'])})" for r in against) or "none") + ".", ""]
    return out


def _learned_lines(doc: dict[str, Any]) -> list[str]:
    """The learned ranking: how its mask was trained, its curve, its smallest circuit above the bound."""
    learned = doc.get("learned")
    if not learned:
        return []
    pts = [p for p in [*learned["curve"], *learned["curve_finer"]] if 0 < p["k"] < doc["graph"]["edges"]]
    last = learned["history"][-1] if learned["history"] else None
    return ["The **learned ranking**: a mask over every edge trained on the discovery prompts for "
            f"{learned['steps']} steps of {learned['batch']} prompts (the squared shortfall of each prompt's "
            "faithfulness plus a sparsity penalty rising from "
            f"{learned['penalty'][0]:g} to {learned['penalty'][1]:g}), the edges ranked by their mask logits; "
            f"{learned['kept']:,} edges ended with a keep weight above 1/2"
            + (f" (last step's faithfulness loss {fmt(last['faithfulness_loss'])})" if last else "") + ":", "",
            points_table(pts), "",
            f"CPR {fmt(learned['summaries']['CPR']['value'])}, CMD {fmt(learned['summaries']['CMD']['value'])}.", ""]


def decide_text(p: dict[str, Any], bound: float, n: int) -> str:
    """One ranking's circuit at 1 % of the edges against the bound, in words."""
    head = f"{p['ranking']}: {p['k']:,} edges, {fmt(p['faithfulness'])} {fmt_ci(p['ci'])}"
    if p["decided"]:
        return f"{head}, {'above' if p['ci'][0] >= bound else 'below'} {bound:g} on these {n} prompts"
    if p["prompts_needed"] is None:
        return f"{head}, at the bound itself: no number of prompts decides it"
    return f"{head}: about {p['prompts_needed']:,} confirmation prompts would decide it ({n} here)"


def _selection_lines(doc: dict[str, Any]) -> list[str]:
    """The size/faithfulness front over every ranking, and the 1 % circuits against the bound."""
    sel = doc.get("selection")
    if not sel:
        return []
    bound = doc["settings"]["bound"]
    out = ["## Size against faithfulness", "",
           "Every circuit tried (each ranking's grid and finer search, and the refined circuit) that no other "
           "beats on both counts: no other is as small and as close to F = 1:", "",
           tabulate([[p["ranking"], p["k"], f"{fmt(p['faithfulness'])} {fmt_ci(p['ci'])}"] for p in sel["pareto"]],
                    headers=["ranking", "k", "faithfulness [CI]"], tablefmt="github", disable_numparse=True), ""]
    if sel["one_percent"]:
        out += [f"At 1 % of the edges, against the bound {bound:g} (an interval's half-width shrinks as 1/sqrt(n)):",
                "", *(f"- {decide_text(p, bound, sel['prompts'])}" for p in sel["one_percent"]), ""]
    return out


def _refined_lines(doc: dict[str, Any]) -> list[str]:
    """The greedy refinement of the starter: its proposals on the discovery prompts, its result on the
    confirmation prompts."""
    r = doc.get("refined")
    if not r:
        return []
    props = r["proposals"][1:]
    start = r["proposals"][0]
    taken = sum(p["accepted"] for p in props)
    return [f"**Greedy refinement** of the top {r['from_k']} edges of the {t_rank(r['from'])} ranking, on the "
            f"discovery prompts (their F {fmt(start['faithfulness'])} {fmt_ci(start['ci'])}): {len(props)} proposals, "
            f"each removing the kept edges whose estimated effect is smallest and run exactly, {taken} accepted (the "
            f"interval still clearing the bound). **{r['k']} edges** remain; on the confirmation prompts their F is "
            f"{fmt(r['faithfulness'])} {fmt_ci(r['ci'])}"
            + (", which clears the bound." if r["clears"] else
               ", which does **not** clear the bound" + (f" (about {r['prompts_needed']:,} confirmation prompts would "
                                                         "decide it)." if r.get("prompts_needed") else ".")), ""]


def t_rank(name: str) -> str:
    """A ranking's name as the report writes it."""
    return {"abs": "|score|", "positions": "per-position |score|"}.get(name, name)


def behaviour_lines(doc: dict[str, Any]) -> list[str]:
    """The model's accuracy and answer rank on each part's clean prompts (none before version 5)."""
    got = doc.get("behaviour") or {}
    return [f"**Behaviour** on the {b['clean']['prompts']} {part} prompts: {md_text(behaviour.words(b))}"
            + (" — **near chance**" if b["near_chance"] else "") + "." for part, b in got.items()] + (
        [""] if got else [])


def render_markdown(doc: dict[str, Any], figures: set[str]) -> str:
    s, sp, g, su = doc["settings"], doc["split"], doc["graph"], doc["summaries"]
    t = md_text
    out = [f"# Discovery: {t(s['model'])}", "",
           f"Method **{t(s['method'])}**" + (f" ({s['steps']} steps)" if s.get("steps") else "")
           + f", metric {md_code(s['metric'])}; {t(s['data'])}.", "",
           "## Prompts: found on one part, confirmed on another", "",
           f"{sp['prompts']} prompts split at random (seed {s['seed']}): **{sp['discovery']} for discovery** (the "
           f"ranking, an estimate) and **{sp['confirmation']} for confirmation** (exact patching and every "
           "faithfulness below); no prompt is in both. Mean clean-corrupted gap "
           f"{fmt(sp['discovery_gap'])} and {fmt(sp['confirmation_gap'])} {t(s['unit'])}.", "",
           *behaviour_lines(doc),
           f"The graph has **{g['edges']} edges** ({g['senders']} senders, {g['receivers']} receivers):", ""]
    rows = [[k, *(v[r] for r in ("q", "k", "v", "mlp", "logits"))] for k, v in g["classes"].items()]
    out += [tabulate(rows, headers=["sender \\ receiver", "q", "k", "v", "mlp", "logits"], tablefmt="github"), ""]
    out += ["## Faithfulness curve", "",
            "Circuits of the top-k edges by the discovery ranking, every other edge resampled from the corrupted "
            "run, on the confirmation prompts: faithfulness F = sum(m_C - m_empty) / sum(m_full - m_empty) with a "
            f"95% BCa interval; {su['kept_prompts']} prompts kept ({su['excluded_prompts']} with a full-empty gap "
            "below min_prompt_gap left out).", ""]
    if "curve.png" in figures:
        out += ["![faithfulness curve](figures/curve.png)", ""]
    out += [tabulate([[f"{100 * p['fraction']:g}%", p["k"], f"{fmt(p['faithfulness'])} {fmt_ci(p['ci'])}"]
                      for p in doc["curve"]], headers=["edges kept", "k", "faithfulness [CI]"], tablefmt="github"), "",
            f"CPR (area under F, the fraction of edges on a linear axis from 0.1 to 100 %): "
            f"**{fmt(su['CPR']['value'])}** {fmt_ci(su['CPR']['ci'])}; CMD (area under |1 - F|): "
            f"**{fmt(su['CMD']['value'])}** {fmt_ci(su['CMD']['ci'])} (MIB's summaries; intervals from the same "
            "paired bootstrap of the confirmation prompts).", ""]
    finer = doc.get("curve_finer") or []
    if finer:
        out += [f"A finer search between the grid's last point below {s['bound']:g} and its first above tried "
                f"{len(finer)} more circuits:", "",
                points_table(finer), ""]
    k = doc.get("starter_k")
    out += _signed_lines(doc) + _learned_lines(doc) + _refined_lines(doc)
    out += [f"The smallest circuit tried, of any ranking or refined, whose interval lies above {s['bound']:g}: "
            + (f"**{starter_words(doc)}** (starter.yaml's circuit claim; the smallest of several intervals that "
               "clear a bound is an optimistic pick, which the starter file tests again on held-out prompts)." if k
               else "none (no circuit claim in starter.yaml)."), ""]
    change = doc.get("starter_change")
    if k and change:
        out += [f"Non-vacuity, as `harness run` judges the circuit claim: what the circuit's receivers read through "
                f"its removed edges changes by {fmt(change['relative_change'])} (relative; "
                f"{fmt(change['at_scored'])} at the scored positions alone) when the rest is resample-ablated — "
                + ("**untested: the rest's replacement changes nothing the circuit reads**" if change["vacuous"]
                   else "non-vacuous") + ".", ""]
    drops = doc.get("curve_drops") or []
    if drops:
        out += ["**The curve is not monotone**: keeping more edges makes the circuit less faithful, beyond both "
                "intervals, " + "; ".join(f"from {fmt(d['from'])} at k = {d['from_k']} to {fmt(d['to'])} at "
                                          f"k = {d['to_k']}" for d in drops)
                + " (edges ranked in between push the metric the other way).", ""]
    if "circuit.png" in figures:
        out += ["![the circuit](figures/circuit.png)", ""]
    if k and doc.get("starter_nodes"):
        nodes = doc["starter_nodes"]
        out += [f"Its {len(nodes)} nodes, by their share of the circuit's attribution (the |score| of the edges they "
                f"send or receive, each edge's split between its two ends); every edge is in `starter-edges.txt`"
                + (f"; the first {SHOWN_NODES}:" if len(nodes) > SHOWN_NODES else ":"), ""]
        out += [tabulate([[md_cell(r["node"]), r["edges"], f"{100 * r['share']:.1f}%"] for r in nodes[:SHOWN_NODES]],
                         headers=["node", "edges", "share"], tablefmt="github", disable_numparse=True), ""]
    out += _selection_lines(doc)
    known = doc.get("known")
    if known:
        top = known["top"]
        covers = ("undefined" if top["covers"] is None else "covers" if top["covers"] else "does **not** cover")
        out += ["## The known circuit", "",
                f"The input file's circuit {md_code(known['claim'])} ({len(known['edges'])} edges"
                f"{', those among its nodes' if known['from'] == 'nodes' else ''}): the discovery ranking puts "
                f"its edges above the others with ROC AUC **{fmt(known['auc'])}** (1: every known edge first, 0.5: "
                "chance). "
                f"Its faithfulness on the confirmation prompts is {fmt(known['faithfulness'])} "
                f"{fmt_ci(known['ci'])}; the circuit of the top {top['k']} edges reads {fmt(top['faithfulness'])} "
                f"{fmt_ci(top['ci'])}, whose interval {covers} the known circuit's value.", ""]
    out += _stability_lines(doc, figures)
    if doc.get("warnings"):
        out += ["## Warnings", "", *(f"- {t(w)}" for w in doc["warnings"]), ""]
    out += ["## Confirmed edges", "",
            f"The top {s['top']} edges patched exactly on the confirmation prompts (noising, resample; "
            f"Benjamini-Hochberg over them; used: CI above {s['min_effect']:g} and p_adj < {s['alpha']:g}):", ""]
    out += [tabulate([[c["rank"], md_cell(c["edge"]), "undefined" if c["effect"] is None else
                       f"{fmt(c['effect'])} {fmt_ci(c['ci'])}", fmt_p(c["p_adjusted"]), md_cell(c["use"])]
                      for c in doc["confirmed"]], headers=["rank", "edge", "effect [CI]", "p_adj", "use"],
                     tablefmt="github", disable_numparse=True), ""]
    agree = doc.get("agreement")
    if agree is not None:
        out += ["## The estimate against the exact patch", "",
                f"Over the {agree['edges']} confirmed edges: the correlation of each edge's estimate (discovery "
                "prompts) with its exact effect (confirmation prompts), 95% BCa intervals over the edges: "
                + "; ".join(f"{name} **{fmt(agree[key]['value'])}** {fmt_ci(agree[key]['ci'])}" if agree[key]
                            else f"{name} undefined (fewer than 3 edges, or no spread)"
                            for name, key in (("Pearson", "pearson"), ("Spearman", "spearman"))) + ".", ""]
    est = "estimated effect" if s["method"] != "exact" else "effect on the discovery prompts"
    out += ["## Discovery ranking (an estimate)", "",
            f"The first 30 of {len(doc['ranking'])} edges by |score| ({t(s['method'])} on the discovery prompts; "
            f"score: the mean change of the metric, {est}: the score over the mean gap). Attribution estimates the "
            "effect of a patch to first order; only the confirmation above tests it.", ""]
    out += [tabulate([[r["rank"], md_cell(r["edge"]), fmt(r["score"]), fmt(r["estimate"])]
                      for r in doc["ranking"][:30]], headers=["rank", "edge", "score", "estimate"], tablefmt="github",
                     disable_numparse=True), ""]
    return "\n".join(out) + "\n"


def _stability_lines(doc: dict[str, Any], figures: set[str]) -> list[str]:
    st = doc.get("stability")
    if not st:
        return ["## Stability", "", "Not measured: the `positions` rank would need every position of every "
                "resample; rank `abs` measures it.", ""]
    out = ["## Stability", "",
           f"The discovery prompts resampled {st['resamples']} times with replacement, each resample's ranking "
           "from the same scoring pass: the Jaccard overlap |T_b ∩ T| / |T_b ∪ T| of each resample's top-k set "
           "T_b with the ranking's T (mean over resamples, and the range of 95% of them).", ""]
    if "stability.png" in figures:
        out += ["![stability](figures/stability.png)", ""]
    starter = st.get("starter")
    if starter:
        verdict = ("**stable**" if starter["stable"] else "**not stable**: other prompts would give a different "
                   "circuit of this size")
        out += [f"The starter circuit (k = {starter['k']}): Jaccard **{fmt(starter['jaccard'])}** "
                f"{fmt_ci(starter['range'])}, {verdict} (bar {st['bar']:g}).", ""]
    return out


def files(doc: dict[str, Any]) -> dict[str, bytes]:
    """{relative path: bytes}: discovery.json, discover.md, discover.html, figures/."""
    figs: dict[str, bytes] = {"curve.png": png(draw_curve(doc), tight=False)}
    circuit = draw_circuit(doc, starter_rows(doc))
    if circuit is not None:
        figs["circuit.png"] = png(circuit, tight=False)
    stable = draw_stability(doc)
    if stable is not None:
        figs["stability.png"] = png(stable, tight=False)
    md = render_markdown(doc, set(figs))
    out = {f"figures/{k}": v for k, v in figs.items()}
    out["discover.md"] = md.encode()
    out["discover.html"] = render_html(md, figs, f"discovery: {doc['settings']['model']}").encode()
    out["discovery.json"] = to_json(doc).encode()
    if doc.get("starter_k"):
        out[STARTER_EDGES] = "".join(r["edge"] + "\n" for r in starter_rows(doc)).encode()
    return out


def summary(doc: dict[str, Any]) -> str:
    """The terminal text: split, curve, CPR / CMD, the starter's k, confirmed edges."""
    s, sp, su = doc["settings"], doc["split"], doc["summaries"]
    used = [c["edge"] for c in doc["confirmed"] if c["use"] == "used"]
    others = [key for key in ("signed", "learned") if doc.get(key)]
    by_k = {key: {p["k"]: p for p in doc[key]["curve"]} for key in others}

    def cell(p: dict[str, Any] | None) -> str:
        return "" if p is None else f"{p['faithfulness']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}]"

    def cmd(su: dict[str, Any]) -> str:
        return (f"CPR {su['CPR']['value']:.3f} [{su['CPR']['ci'][0]:.3f}, {su['CPR']['ci'][1]:.3f}], "
                f"CMD {su['CMD']['value']:.3f} [{su['CMD']['ci'][0]:.3f}, {su['CMD']['ci'][1]:.3f}]")

    start = starter_words(doc)
    lines = [f"{s['method']} on {sp['discovery']} discovery prompts; confirmed on {sp['confirmation']} others",
             *(behaviour.headline(b, part) for part, b in (doc.get("behaviour") or {}).items()),
             f"graph: {doc['graph']['edges']} edges",
             tabulate([[f"{100 * p['fraction']:g}%", p["k"], cell(p), *(cell(by_k[key].get(p["k"])) for key in others)]
                       for p in doc["curve"]],
                      headers=["edges", "k", "faithfulness [CI]", *(f"{key} ranking" for key in others)],
                      disable_numparse=True),
             cmd(su) + "".join(f"; {key} ranking: {cmd(doc[key]['summaries'])}" for key in others),
             f"starter circuit: {start}; confirmed edges (used): {len(used)} of the top {s['top']}"]
    sel = doc.get("selection")
    if sel and sel["one_percent"]:
        lines.append(f"at 1 % of the edges, against {s['bound']:g}: "
                     + "; ".join(decide_text(p, s["bound"], sel["prompts"]) for p in sel["one_percent"]))
    if doc.get("known"):
        k = doc["known"]
        lines.append(f"known circuit {k['claim']} ({len(k['edges'])} edges): ROC AUC {fmt(k['auc'])}; faithfulness "
                     f"{fmt(k['faithfulness'])} {fmt_ci(k['ci'])}; the top {k['top']['k']}: "
                     f"{fmt(k['top']['faithfulness'])} {fmt_ci(k['top']['ci'])}")
    starter = (doc.get("stability") or {}).get("starter")
    if starter:
        word = "stable" if starter["stable"] else "not stable"
        lines.append(f"stability of the starter circuit: Jaccard {fmt(starter['jaccard'])} "
                     f"{fmt_ci(starter['range'])} over {doc['stability']['resamples']} resamples ({word})")
    lines += [f"the curve falls from {fmt(d['from'])} at k = {d['from_k']} to {fmt(d['to'])} at k = {d['to_k']}"
              for d in doc.get("curve_drops") or []]
    agree = doc.get("agreement")
    if agree and agree.get("spearman"):
        lines.append(f"estimate vs exact over {agree['edges']} confirmed edges: Spearman "
                     f"{fmt(agree['spearman']['value'])} {fmt_ci(agree['spearman']['ci'])}, Pearson "
                     f"{fmt(agree['pearson']['value'])} {fmt_ci(agree['pearson']['ci'])}")
    lines += [f"warning: {w}" for w in doc.get("warnings", [])]
    return "\n".join(lines)


DISCOVERY_FILES = frozenset({"discover.md", "discover.html", "figures", STARTER_EDGES, "starter.yaml"})
REQUIRED = ("settings", "split", "graph", "ranking", "curve", "summaries", "confirmed", "starter_k")


def rerender(json_path: Path, out_dir: Path | None = None) -> Path:
    """`harness report` of a discovery.json: discover.md/html, figures/ and starter-edges.txt again
    from the JSON alone (discovery.json's READABLE versions).  In place the folder is swapped at once
    for the new one, keeping discovery.json's bytes and starter.yaml; with `out_dir`, a new folder
    gets a copy of the JSON (starter.yaml names its model relative to its own folder, so it stays
    where it is).  Problems are one-line UserErrors; nothing is half-written."""
    new = rendered_again(json_path, out_dir, "discovery", problems, files)
    return place(json_path, new, out_dir, DISCOVERY_FILES, carry=("starter.yaml",))


def problems(doc: Any) -> list[str]:
    """What keeps a document from being a discovery.json this harness renders (the READABLE versions)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    missing = [k for k in REQUIRED if k not in doc]
    return ([f"version {doc.get('version')!r}; this harness renders {', '.join(map(str, READABLE))}"]
            if doc.get("version") not in READABLE else []) + ([f"missing {', '.join(missing)}"] if missing else [])
