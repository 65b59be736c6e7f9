"""`harness discover`: find an edge circuit on some prompts, confirm it on others.

The prompts (a hypothesis file's data on its `explore` split, or `--data`, or for a model the
repeated-token generator's `explore` prompts) are split at random (seeded, Stream.DISCOVER)
into a discovery part and a disjoint confirmation part, sizes stated.  On the discovery part
every edge of the model's graph (mech.graph.structure: embed, heads and MLPs into heads' q/k/v, MLP
inputs and the logits) is scored, by one of

    eap-ig   attribution with the gradient averaged over `steps` points from the corrupted to
             the clean input (mech.graph.attribution; the default, 5 steps)
    eap      first-order attribution at the clean run (mech.graph.attribution)
    exact    exact noising patch of every edge, resample (mech.runs.cached.Runs.patched_many)

each the mean over prompts of the noising change m_clean - m_patched it measures or estimates,
and ranked by |score| summed over positions (`rank: abs`), or by the sum over positions of
|score| (`rank: positions`: opposite-signed positions do not cancel).  The ranking is an
estimate; only the confirmation part confirms:

* the top `top` edges are patched exactly on the confirmation prompts (noising, resample;
  claims.edge_test: Benjamini-Hochberg over them, each edge's use status);
* the faithfulness curve (tools.curve): the circuit of the top-k edges (every other edge
  resampled from the corrupted run) on MIB's grid of k, with CPR and CMD, then a finer search
  between the last k below `bound` and the first above it; the curve's drops beyond its
  intervals;
* the same curve and finer search on the signed ranking (tools.curve.signed_order: the largest
  signed score first, so its circuits leave out the edges that push against the answer); the
  starter is the smallest circuit of any ranking whose interval clears `bound`, and its
  non-vacuity is judged as a circuit claim's (claims.effects.circuit_change);
* with `learn` steps, the same curve and finer search on a third ranking: the logits of an edge
  mask trained on the discovery prompts (mech.graph.learn; tools.curve.learned_order);
* stability (tools.stability): the Jaccard overlap of the top-k sets of bootstrap resamples of
  the discovery prompts with the starter's ranking's, from the same scoring pass.

With a hypothesis file that has a circuit claim, its edges are the known circuit (its first edge
circuit; else its first node circuit as an edge circuit: the edges among its nodes, from embed
and to the logits, every MLP included when it names only heads): the
document gives the ROC AUC of the ranking against them, the known circuit's faithfulness on
the confirmation prompts, and whether the interval of the top-|known| circuit covers it.
The folder (report.discovery) holds discovery.json (docs/discover.md), discover.md,
discover.html, figures/curve.png and figures/circuit.png, and starter.yaml: an edge circuit
claim of the starter, and an edge claim for each
confirmed edge, on held-out prompts (a generator's or template's `test` split).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import memory, threads
from ..claims import effects
from ..claims.circuit_spec import CircuitClaim
from ..claims.edge_test import USED, EdgeTestResult, EdgeTestSpec, edge_tests
from ..engine import measure, provenance
from ..errors import SpecError
from ..hypothesis.loading import load
from ..mech.graph import learn
from ..mech.graph.structure import Graph
from ..mech.runs.build import base_runs
from ..mech.runs.cached import Runs
from ..model import behaviour, metrics
from ..model.devices import of, resolve_device
from ..model.ref import ModelRef
from ..model.tokenizer import start_words
from ..progress import progress, stage
from ..report import circuit_reading as reading
from ..report import discovery as render
from ..report.discovery import STARTER_EDGES, VERSION, starter_rows
from ..report.writer import write_folder
from ..spec.settings import Stats
from ..spec.vocabulary import Direction, Replacement
from ..streams import Stream, derive_seed
from . import stability
from .curve import (
    curve_ks,
    doc_rankings,
    drops,
    faithfulness_curve,
    learned_order,
    ranking_search,
    refine,
    selection,
    signed_order,
    starter_k,
    top_mask,
)
from .discover_inputs import DiscoverSettings, Inputs, inputs, split
from .known import known_doc, known_edges, roc_auc
from .refine import refine_starter
from .scan import scan_hooks

RANKED_BY = {"signed": ", by signed score: those that push towards the answer",
             "learned": ", by the learned mask's logits"}
DISCOVER_STATS = Stats(bootstrap=1000, permutations=2000)  # thresholds are the defaults; fewer resamples


# ---------------------------------------------------------------- scores and ranking
def scores(runs: Runs, g: Graph, cfg: DiscoverSettings, resamples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([U, V, s] every edge's discovery score (0 where the graph has no edge): the mean over
    prompts, per position for attribution (exact: a single position slot); [B, E] each edge's
    score (summed over positions) under each of the prompt weights `resamples` [B, n], graph edge
    order: tools.stability), from one pass."""
    us, rs = g.edge_index()
    if cfg.method in ("eap", "eap-ig"):
        got = runs.edge_scores(cfg.method, steps=cfg.steps, progress=progress, resamples=resamples)
        return got.per_position, got.resampled[:, us, rs]
    edges = g.edges()
    per_prompt = np.stack([runs.m_clean - m for m in
                           runs.patched_many(edges, Direction.NOISING, Replacement.RESAMPLE, progress=progress)])
    out = np.zeros((len(g.senders), len(g.receivers), 1))
    out[us, rs, 0] = per_prompt.mean(1)
    return out, (resamples @ per_prompt.T) / resamples.sum(1)[:, None]


def ranking(score: np.ndarray, g: Graph, how: str) -> np.ndarray:
    """Edge indices (graph.edges() order) from the strongest: by |sum over positions| (abs) or by the
    sum over positions of |score| (positions); ties keep the graph's order."""
    us, rs = g.edge_index()
    value = np.abs(score).sum(-1) if how == "positions" else np.abs(score.sum(-1))
    return np.argsort(-value[us, rs], kind="stable")


# ---------------------------------------------------------------- the command
def discover(source: str, out: Path, *, device: str | None = None, data_file: Path | None = None,
             unique: bool = False, **settings: Any) -> tuple[dict[str, Any], str]:
    """Discover and confirm (module docstring), write the folder; return (the discovery.json
    document, the terminal summary).  `settings`: DiscoverSettings' fields."""
    cfg = DiscoverSettings(**settings)
    cfg.check()
    got = inputs(source, cfg, data_file, resolve_device(device))
    with threads.using(None, int(got.model.bridge.cfg.d_model)), memory.using(device=of(got.model.bridge)):
        doc = run_discovery(got, cfg, source)
    try:
        starter: bytes | None = starter_yaml(doc, got, out)
    except SpecError as exc:  # the work is done: a starter that cannot be written must not lose it
        starter = None
        doc["warnings"].append(f"starter.yaml not written: {' '.join(str(exc).split())}")
    files = render.files(doc)
    if starter is not None:
        files["starter.yaml"] = starter
    write_folder(out, files, unique=unique)
    return doc, render.summary(doc)


def run_discovery(got: Inputs, cfg: DiscoverSettings, source: str) -> dict[str, Any]:
    """The discovery.json document (docs/discover.md) of one discovery."""
    m, metric = got.model, got.metric
    bridge = m.bridge
    ds = got.dataset.to(of(bridge))
    disc_idx, conf_idx = split(ds.n, cfg.confirm_fraction, cfg.seed)
    # a hypothesis file's thresholds (min_gap, alpha, ...), with discovery's own resample counts
    st = (got.thresholds or DISCOVER_STATS).model_copy(update={"bootstrap": cfg.bootstrap,
                                                               "permutations": DISCOVER_STATS.permutations})
    unit = metrics.get(metric).unit
    hooks = scan_hooks(m.n_layers, m.has_mlp)
    stage(f"discovery: {len(disc_idx)} prompts ({start_words(m, ds)}), {cfg.method}")
    disc = base_runs(bridge, ds.select(disc_idx), hooks, metric)
    behaves = {"discovery": measure.behaviour_of(disc, m.d_vocab_out, st, cfg.seed)}
    stage(behaviour.headline(behaves["discovery"], "discovery"))
    g = disc.graph_model().graph
    known_mask = None if got.known is None else known_edges(got.known, g)
    resamples = stability.weights(len(disc_idx), derive_seed(cfg.seed, Stream.DISCOVER_STABILITY))
    score, resampled = scores(disc, g, cfg, resamples)
    gap = float(np.mean(disc.m_clean - disc.m_corrupt))
    mask = learned_mask(disc, gap, cfg) if cfg.learn else None
    del disc  # its caches: the confirmation runs need the memory
    order = ranking(score, g, cfg.rank)
    edges = g.edges()
    top = [edges[i] for i in order[:cfg.top]]
    stage(f"confirmation: {len(conf_idx)} prompts, {len(top)} edges patched exactly, the faithfulness curve")
    conf = base_runs(bridge, ds.select(conf_idx), hooks, metric)
    behaves["confirmation"] = measure.behaviour_of(conf, m.d_vocab_out, st, cfg.seed)
    specs = [EdgeTestSpec(e, seed=derive_seed(cfg.seed, Stream.DISCOVER_EFFECT, r),
                          perm_seed=derive_seed(cfg.seed, Stream.DISCOVER_PERMUTATION, r)) for r, e in enumerate(top)]
    tests = edge_tests(conf, specs, st, unit, progress=progress, label="confirmation edge tests")
    n_known = int(known_mask.sum()) if known_mask is not None else 0
    extra = [known_mask, top_mask(g, order, n_known)] if known_mask is not None else []
    curve_seed = derive_seed(cfg.seed, Stream.DISCOVER_CURVE)
    curve = faithfulness_curve(conf, g, order, st, curve_seed, unit, extra)
    finer = refine(conf, g, order, curve, cfg.bound, st, curve_seed, unit)
    k_main = starter_k(curve, finer, cfg.bound)
    s_order = signed_order(score, g, order)
    signed = ranking_search(conf, g, s_order, st, derive_seed(cfg.seed, Stream.DISCOVER_CURVE, 1), unit, cfg.bound,
                            "the signed ranking: edges that push towards the clean answer first")
    tried = [(k_main, cfg.rank, order, finer), (signed["starter_k"], "signed", s_order, signed["curve_finer"])]
    learned = None
    if mask is not None:
        l_order = learned_order(mask.logits, g, order)
        learned = {**learned_settings(mask), **ranking_search(
            conf, g, l_order, st, derive_seed(cfg.seed, Stream.DISCOVER_CURVE, 2), unit, cfg.bound,
            "the learned ranking: edges by the learned mask's logits")}
        tried.append((learned["starter_k"], "learned", l_order, learned["curve_finer"]))
        us, rs = g.edge_index()
        learned["auc"] = None if known_mask is None else roc_auc(l_order, known_mask[us, rs])
    # the smallest circuit that clears the bound; on a tie the ranking tried first
    k_start, by, chosen, chosen_finer = min(tried, key=lambda t: (t[0] is None, t[0] or 0))
    ks = sorted({*curve_ks(g.n_edges), *(p["k"] for p in chosen_finer)})
    stable = None if cfg.rank != "abs" or by == "learned" else stability.summary(
        stability.jaccard(resampled, chosen, ks, signed=by == "signed"), ks, k_start, len(disc_idx))
    start = top_mask(g, chosen, k_start) if k_start else None
    refined = None
    conf_gap = float(np.mean(conf.m_clean - conf.m_corrupt))
    if cfg.refine and start is not None:
        conf.release()
        del conf  # the discovery runs are built again: one set of base runs at a time
        refined, keep, conf = refine_starter(bridge, ds.select(disc_idx), ds.select(conf_idx), hooks, metric, g,
                                             start, by, cfg.refine, cfg.bound, st, unit, cfg.seed)
        if refined["clears"] and refined["k"] < (k_start or 0):  # the refined circuit is the starter
            k_start, by, start, stable = refined["k"], "refined", keep, None
    change = None if start is None else starter_change(conf, start, st)
    rows = ranking_rows(score, g, order, gap, None if mask is None else mask.logits)
    signed["negative_edges"] = int(sum(r["score"] < 0 for r in rows))
    confirmed = [confirmed_row(r, t) for r, t in enumerate(tests, start=1)]
    doc = {
        "kind": "discovery", "version": VERSION,
        "settings": {"input": source, "model": provenance.shown_source(m.kind, m.source),
                     "model_sha256": m.sha256, "method": cfg.method,
                     "steps": cfg.steps if cfg.method == "eap-ig" else None, "rank": cfg.rank, "metric": metric,
                     "unit": unit, "corruption": ds.default_corruption, "seed": cfg.seed, "top": cfg.top,
                     "bound": cfg.bound, "learn": cfg.learn, "refine": cfg.refine,
                     "replacement": Replacement.RESAMPLE.value, "direction": Direction.NOISING.value,
                     "bootstrap": st.bootstrap, "confidence": st.confidence,
                     "alpha": st.alpha, "min_effect": st.min_effect, "tolerance": st.tolerance,
                     "min_prompt_gap": st.min_prompt_gap, "data": ds.description},
        "split": {"prompts": ds.n, "discovery": len(disc_idx), "confirmation": len(conf_idx),
                  "discovery_indices": disc_idx, "confirmation_indices": conf_idx,
                  "discovery_gap": gap, "confirmation_gap": conf_gap},
        "behaviour": behaves,
        "graph": {"edges": g.n_edges, "senders": len(g.senders), "receivers": len(g.receivers),
                  "classes": g.counts()},
        "ranking": rows,
        "curve": curve.points, "summaries": curve.summaries, "curve_finer": finer,
        "curve_drops": drops([*curve.points, *finer], st.tolerance), "stability": stable,
        "confirmed": confirmed,
        "agreement": reading.agreement(rows, confirmed, st.bootstrap, st.confidence,
                                       derive_seed(cfg.seed, Stream.DISCOVER_AGREEMENT)),
        "known": None if got.known is None or known_mask is None else known_doc(got.known, known_mask, g, order,
                                                                                curve),
        "signed": signed,
        "learned": learned,
        "refined": refined,
        "selection": selection(doc_rankings(cfg.rank, curve.points, finer, signed, learned, refined), g.n_edges,
                               cfg.bound, len(conf_idx)),
        "starter_k": k_start,
        "starter_ranking": by,
        "starter_nodes": [],  # below: from the document's starter rows
        "starter_change": change,
        "warnings": measure.chance_warnings(behaves["discovery"]) + (
            [] if change is None or not change["vacuous"] else [
                "the starter circuit is untested: resample-ablating the rest leaves what it reads as it was "
                f"(relative change {change['relative_change']:.3f} < min_change {st.min_change:g}), so `harness run` "
                "of starter.yaml will call its circuit claim INCONCLUSIVE"])}
    if k_start:
        doc["starter_nodes"] = reading.starter_nodes(starter_rows(doc), k_start)
    return doc


def starter_change(conf: Runs, keep: np.ndarray, st: Stats) -> dict[str, Any]:
    """The starter circuit's (`keep` [U, V]) non-vacuity on the confirmation prompts, judged as `harness run`
    judges its circuit claim (claims.effects.circuit_change: what its receivers read through its removed edges)."""
    c = effects.circuit_change(conf, keep, [], Replacement.RESAMPLE.value, st)
    return {"relative_change": c.relative_change, "at_scored": c.at_scored, "prompts_changed": c.prompts_changed,
            "min_change": c.min_change, "vacuous": c.vacuous, "read_at": c.read_at}


def learned_mask(disc: Runs, gap: float, cfg: DiscoverSettings) -> learn.Learned:
    """The learned edge mask (mech.graph.learn) on the discovery prompts, resample replacement."""
    ms = learn.MaskSettings(steps=cfg.learn, seed=cfg.seed)
    stage(f"the learned mask: {ms.steps} steps of {ms.batch} prompts, each a forward and a backward through the "
          "edge graph")
    return learn.learn_mask(disc.graph_model(), disc.writes(disc.clean), disc.writes(disc.corrupt), disc.ds.positions,
                            disc.rows_metric, disc.m_clean, gap, ms, progress=progress)


def learned_settings(mask: learn.Learned) -> dict[str, Any]:
    """discovery.json's `learned`, less its curve: how the mask was trained and how it ended."""
    ms = mask.settings
    return {"steps": ms.steps, "batch": ms.batch, "learning_rate": ms.learning_rate, "init": ms.init,
            "penalty": list(ms.penalty), "kept": mask.kept, "history": mask.loss}


def ranking_rows(score: np.ndarray, g: Graph, order: np.ndarray, gap: float,
                 mask: np.ndarray | None = None) -> list[dict[str, Any]]:
    """Every edge in ranked order: its score (the mean noising change, summed over positions), that
    score over the mean clean-corrupted gap, the position where |score| peaks (attribution), and with
    a learned mask ([U, V] logits) the edge's logit."""
    us, rs = g.edge_index()
    edges = g.edges()
    total = score.sum(-1)
    rows = []
    for rank, e in enumerate(order, start=1):
        u, r = us[e], rs[e]
        rows.append({"edge": str(edges[e]), "rank": rank, "score": float(total[u, r]),
                     "estimate": float(total[u, r] / gap) if gap else None,
                     "peak_position": int(np.argmax(np.abs(score[u, r]))) if score.shape[-1] > 1 else None,
                     **({} if mask is None else {"mask": float(mask[u, r])})})
    return rows


def confirmed_row(rank: int, t: EdgeTestResult) -> dict[str, Any]:
    iv = t.effect.norm.interval
    return {"edge": str(t.spec.route), "rank": rank, "effect": None if iv is None else iv.estimate,
            "ci": None if iv is None else [iv.low, iv.high], "p_adjusted": t.p_adjusted, "use": str(t.use),
            "relative_change": t.effect.read.relative_change}


def starter_yaml(doc: dict[str, Any], got: Inputs, folder: Path) -> bytes:
    """starter.yaml: the circuit at the smallest k whose interval clears the bound (its edges named by
    `edges_from: starter-edges.txt`, which the folder holds), and an edge claim for each confirmed edge;
    its data held out where the data has a split."""
    import yaml

    claims: list[dict[str, Any]] = []
    k, bound, method = doc["starter_k"], doc["settings"]["bound"], doc["settings"]["method"]
    if k:
        refined = doc.get("starter_ranking") == "refined"
        found = (f"The {k} edges left when discovery refined the top {doc['refined']['from_k']} of its "
                 f"{doc['refined']['from']} ranking ({method}) on its own prompts" if refined else
                 f"The {k} edges discovery ranked first ({method}" + RANKED_BY.get(doc.get("starter_ranking") or "", "")
                 + ")")
        claims.append({"id": f"{'refined' if refined else 'top'}-{k}-edge-circuit", "kind": "circuit",
                       "description": found + "; on the confirmation prompts the interval of their circuit's "
                                      f"faithfulness lay at or above {bound:g}.",
                       "edges": [r["edge"] for r in starter_rows(doc)], "at_least": bound})
    for c in doc["confirmed"]:
        if c["use"] == USED:
            slug = c["edge"].replace(" -> ", "-to-").replace(".", "-")
            claims.append({"id": f"edge-{slug}", "kind": "edge", "edge": c["edge"], "expect": "used"})
    if not claims:
        best = doc["confirmed"][0]["edge"]
        claims.append({"id": "strongest-edge", "kind": "edge", "edge": best, "expect": "used",
                       "description": "No edge was confirmed and no circuit cleared the bound: the edge discovery "
                                      "ranked first, to test on held-out prompts."})
    held_out = ("its data uses the held-out test split" if "split" in got.mapping else
                "it reads the discovery's prompts: point data at held-out prompts before testing")
    out = {"harness": 1, "name": "discovered",
           "description": f"Written by `harness discover` ({method}, confirmed on {doc['split']['confirmation']} "
                          f"prompts not used to find it); {held_out}.",
           "model": ModelRef.parse(got.model.source).relative_to(folder), "data": got.mapping,
           "metric": doc["settings"]["metric"], "claims": claims}
    if not k:
        load(out, base_dir=folder)  # the starter file must be valid
        return yaml.safe_dump(out, sort_keys=False).encode()
    circuit = out["claims"][0]
    CircuitClaim.model_validate(circuit)  # its edges, in one linear pass (not through the file's size limit)
    load({**out, "claims": [{**circuit, "edges": circuit["edges"][:1]}, *claims[1:]]}, base_dir=folder)  # the rest
    # the circuit's edges by reference: starter-edges.txt, written beside it with the same edges
    by_reference = {**{key: v for key, v in circuit.items() if key != "edges"}, "edges_from": STARTER_EDGES}
    return yaml.safe_dump({**out, "claims": [by_reference, *claims[1:]]}, sort_keys=False).encode()
