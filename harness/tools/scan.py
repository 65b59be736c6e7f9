"""`harness scan`: every edge at once, before writing a hypothesis.

For every edge of the model's graph (mech.graph.structure: embed, heads and MLPs into later heads'
.q/.k/.v, MLP inputs and the logits; the count of each class printed and in scan.json), and
for each corruption asked for (generator: `first_half`, `second_half`, `both`;
`--data`, a prompt file or a YAML data file: its own corruptions):
* the causal effect (noising, resample replacement, batched exact edge
  patching: mech.edges.batched for head and embed edges, the edge graph for edges with an MLP
  end, mech.graph.forward): normalised effect with a BCa CI and a sign-flip
  p-value, Benjamini-Hochberg adjusted over the corruption's edges (structurally
  zero edges left out), how much the patch changes the sender's output where the
  receiver reads it (mech.runs.change), and the use status (claims.edge_test.UseRule,
  with the default `stats` thresholds: `untested` when the patch is vacuous,
  `used (opposite sign)` for a clear effect against the clean behaviour);
* for head -> head-input edges, the composition score and its rotation-null
  p-value (uncorrected, `--draws` draws: an exploration aid, not a claim), and
  the weights-vs-use class.

Prints the edges ranked by effect, and writes into a new folder: scan.json
(every edge under every corruption), signature.png (composition vs effect), and
starter.yaml, a hypothesis file (its model path relative to the file's folder)
whose claims are the strongest routes found used under any corruption (each
claim naming its corruption), for the user to edit and then test on held-out
prompts (with the generator or a template its data uses the `test` split; the
scan uses `explore`, whatever split the data sets; with a prompt file or a list of prompts, give the starter
held-out prompts).  `harness
report` refuses a scan.json (is_scan): scan results are not re-rendered.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .. import memory, threads
from ..claims.edge_test import UNTESTED, USED, EdgeTestResult, EdgeTestSpec, classify, edge_tests
from ..claims.view import edge_classes_text
from ..data import sources as data_sources
from ..data.settings import DEFAULT_CORRUPTIONS, FileData
from ..data.sources import generated
from ..engine.data_source import DataSource, DataSpec, build_dataset, from_data_file
from ..errors import UserError
from ..evidence.document import to_json
from ..evidence.format import fmt_p
from ..hypothesis.loading import load
from ..mech.edges import sets
from ..mech.graph import parts
from ..mech.graph.structure import Graph
from ..mech.runs.build import base_runs
from ..mech.weights import scores
from ..mech.weights.factored import Composition
from ..model import metrics
from ..model.devices import of, resolve_device
from ..model.ref import ModelRef, load_model
from ..progress import progress, stage
from ..report.figures import signature
from ..report.writer import write_folder
from ..spec import names
from ..spec.names import hook_pattern
from ..spec.settings import Stats
from ..spec.vocabulary import Direction, Replacement
from ..streams import Stream, derive_seed

SCAN_STATS = Stats(bootstrap=1000, permutations=2000)  # thresholds are the defaults; fewer resamples


def _seed(seed: int, stream: Stream, i: int, c: int) -> int:
    """Edge i under the c-th corruption (the first corruption keeps the one-corruption keys)."""
    return derive_seed(seed, stream, i) if c == 0 else derive_seed(seed, stream, i, c)


@dataclass(frozen=True, kw_only=True)
class ScanSettings:
    """What a scan draws and measures (`harness scan`'s options)."""

    n_prompts: int = 200
    segment_length: int = 20
    seed: int = 0
    metric: str = "logprob"
    processing: str = "folded"
    draws: int = 1000  # composition null draws
    top: int = 15  # rows printed
    budget_mb: int = 32  # the batched sweep's chunk budget
    bootstrap: int = 1000
    corruptions: tuple[str, ...] | None = None
    distinct: bool = False  # the generator's distinct-token option
    layers: tuple[int, int] | None = None  # blocks (A, B): only the edges between them (in_blocks); None: all


def scan(model_source: str, out: Path, *, device: str | None = None, data_file: Path | None = None,
         unique: bool = False, **settings: Any) -> tuple[list[dict[str, Any]], str]:
    """Run the scan; return (rows ranked by effect, printable table).  `settings`: the fields of
    ScanSettings.  `device`: where the model runs (model.devices.resolve_device); prompts are
    drawn on the CPU and moved there, the statistics run on the CPU.  `corruptions`: the
    generator's (default first_half), or with `data_file` (instead of the generator: a JSONL
    prompt file of token ids or text, or a YAML data file, engine.data_source.from_data_file)
    some of the data's (default all).  `unique`: `out` was chosen by
    report.folders.default_folder, and moves on to the next free suffix if another process
    takes it first."""
    cfg = ScanSettings(**settings)
    device = resolve_device(device)
    given = from_data_file(data_file, "explore") if data_file is not None else None  # a bad file stops before loading
    m = load_model(model_source, device=device)
    with threads.using(None, int(m.bridge.cfg.d_model)), memory.using(device=of(m.bridge)):
        return _scan(m, model_source, out, cfg, given, unique)


def scan_hooks(n_layers: int, has_mlp: bool) -> list[str]:
    """What exact patching of every edge reads from the base runs: the batched sweep's hooks
    (mech.edges.batched), the last layer's pattern (non-vacuity of its keys and values) and the
    edge graph's (mech.graph.forward: edges with an MLP end)."""
    return list(dict.fromkeys(sets.cache_names(n_layers) + [hook_pattern(n_layers - 1)]
                              + parts.cache_names(n_layers, has_mlp)))


def explore_dataset(m: Any, cfg: ScanSettings, given: tuple[DataSpec, DataSource] | None,
                    who: str = "harness scan") -> tuple[Any, list[str]]:
    """The explored prompts (the repeated-token generator's explore split, or the given data) and
    the corruptions chosen (cfg.corruptions; default: the generator's first_half, every one of
    the given data's)."""
    if given is not None:
        ds = build_dataset(*given, m)
        chosen = list(ds.corruptions) if cfg.corruptions is None else list(cfg.corruptions)
        missing = [c for c in chosen if c not in ds.corruptions]
        if missing:
            raise UserError(f"--corruption {', '.join(missing)}: the data has {', '.join(ds.corruptions)}")
        return ds, chosen
    chosen = [str(c) for c in cfg.corruptions or DEFAULT_CORRUPTIONS]
    # every generated token is a possible answer: draw them from the ids the output vocabulary has too
    ds = generated(m, cfg.n_prompts, cfg.segment_length, who, seed=cfg.seed, split="explore",
                   corruptions=tuple(chosen), n_ctx=m.n_ctx, distinct=cfg.distinct,
                   vocab_max=min(m.d_vocab, m.d_vocab_out))
    return ds, chosen


def _scan(m: Any, model_source: str, out: Path, cfg: ScanSettings, given: tuple[DataSpec, DataSource] | None,
          unique: bool) -> tuple[list[dict[str, Any]], str]:
    bridge, L, H = m.bridge, m.n_layers, m.n_heads
    ds, chosen = explore_dataset(m, cfg, given)
    ds = ds.to(of(bridge))
    graph = Graph.of(bridge)
    head_edges = sets.all_edges(L, H)  # first, in the order that keys their seeds
    listed = set(head_edges)
    edges = head_edges + [e for e in graph.edges() if e not in listed]
    keyed = {e: i for i, e in enumerate(edges)}  # an edge's seeds: the same whichever edges are scanned
    if cfg.layers is not None:
        if cfg.layers[1] >= L:
            raise UserError(f"--layers {cfg.layers[0]}-{cfg.layers[1]}: the model's blocks are 0-{L - 1}")
        edges = [e for e in edges if in_blocks(e, *cfg.layers, L)]
    stage(f"scan: {len(edges):,} edges" + ("" if cfg.layers is None else f" between blocks {cfg.layers[0]}-"
                                          f"{cfg.layers[1]}") + f", {sum(sets.patch_cost(e, L) for e in edges):,.0f} "
          "forward-equivalents of the prompts a corruption to patch them")
    hooks = scan_hooks(L, m.has_mlp)
    runs = base_runs(bridge, ds.keep_corruptions(chosen), hooks, cfg.metric)
    st = SCAN_STATS.model_copy(update={"bootstrap": cfg.bootstrap})
    unit = metrics.get(cfg.metric).unit
    unusable = unusable_corruptions(runs, chosen, st, unit)
    if len(unusable) == len(chosen):
        raise UserError("no corruption to scan with: " + "; ".join(f"{u['corruption']}: {u['reason']}"
                                                                   for u in unusable))
    skipped = {u["corruption"] for u in unusable}
    chosen = [c for c in chosen if c not in skipped]
    composition = _composition(Composition.read(bridge, cfg.processing, cfg.seed), edges, cfg.draws)
    rows: list[dict[str, Any]] = []
    for c_i, name in enumerate(chosen):
        view = runs.with_corruption(name)
        view.patched_many(edges, Direction.NOISING, Replacement.RESAMPLE, budget=cfg.budget_mb * 2**20,
                          progress=progress)
        specs = [EdgeTestSpec(e, corruption=name, seed=_seed(cfg.seed, Stream.SCAN_EFFECT, keyed[e], c_i),
                              perm_seed=_seed(cfg.seed, Stream.SCAN_PERMUTATION, keyed[e], c_i)) for e in edges]
        tests = edge_tests(runs, specs, st, metrics.get(cfg.metric).unit, progress=progress,
                           label=f"statistics ({name})")
        rows += _rows(tests, composition, st, name)
    rows.sort(key=lambda r: -(r["effect"] if r["effect"] is not None else -np.inf))
    classes = graph.counts(None if cfg.layers is None else graph.mask(edges))  # the edges scanned
    table = _table(rows[:cfg.top], ds.description, len(edges), chosen, unusable, classes)
    mapping = held_out_mapping(*given) if given is not None else None
    if mapping is not None and skipped and "corruptions" in mapping:
        kept = mapping["corruptions"]
        mapping["corruptions"] = ([c for c in kept if c not in skipped] if isinstance(kept, list)
                                  else {k: v for k, v in kept.items() if k not in skipped})
    _write(out, rows, model_source, cfg, corruptions=chosen, data=mapping, unique=unique, unusable=unusable,
           classes=classes)
    return rows, table


def in_blocks(edge: names.Edge, lo: int, hi: int, n_layers: int) -> bool:
    """Whether the edge's sender and receiver both lie in blocks lo..hi: a head or an MLP (or a group's
    members) in its block, the embedding in block 0, the logits in the last block (n_layers - 1)."""
    def block(c: Any) -> int:
        place = names.layer_of(c)
        return 0 if place < 0 else n_layers - 1 if place == float("inf") else int(place)
    return all(lo <= block(c) <= hi for c in (*names.members(edge.sender), edge.receiver))


def unusable_corruptions(runs: Any, chosen: list[str], st: Stats, unit: str) -> list[dict[str, Any]]:
    """The corruptions a scan cannot use, each with its mean clean-corrupted gap and why: a negative gap
    (the corrupted prompts score higher: the corruption gives the metric's answer, e.g. it puts the
    wrong token where the answer was) or one below min_gap (the corruption barely changes the metric)."""
    out = []
    for name in chosen:
        gap = float(np.mean(runs.m_clean - runs.with_corruption(name).m_corrupt))
        if gap < 0:
            why = (f"mean clean-corrupted gap {gap:.3g} {unit} is negative: the corrupted prompts score higher than "
                   "the clean ones, so the corruption gives the answer rather than taking it away (is the metric's "
                   "wrong token the value the corruption puts in?)")
        elif gap < st.min_gap:
            why = (f"mean clean-corrupted gap {gap:.3g} {unit} is below min_gap {st.min_gap:g}: the corruption "
                   "barely changes the metric, so no effect can be normalised by it")
        else:
            continue
        out.append({"corruption": name, "gap": gap, "reason": why})
    return out


def held_out_mapping(d: DataSpec, source: DataSource) -> dict[str, Any]:
    """The `data:` mapping of the starter file for scanned data `d`: the same mapping with
    its paths absolute, and a source with splits on the held-out `test` split."""
    out = d.model_dump(mode="json", exclude_unset=True, exclude_none=True)  # plain data: enums as their words
    if isinstance(d, FileData):
        out["file"] = str(source.resolve(d.file).resolve())
        if d.mean_from is not None:
            out["mean_from"] = str(source.resolve(d.mean_from).resolve())
    if data_sources.has_splits(d):
        out["split"] = "test"
    return out


def _composition(comp: Composition, edges: list[names.Edge], draws: int) -> dict[int, tuple]:
    """{edge index: (score or None, uncorrected null p, peer ratio or None)} for head -> head-input
    edges (the shared null draws; the tail bound below the Monte Carlo floor, as `harness weights`;
    the peer ratio of mech.weights.scores.stands_out)."""
    modes = sorted({e.receiver.which for e in edges if isinstance(e.receiver, names.HeadInput)})
    pv = {x: comp.p_values(x, draws)[0] for x in modes}
    ratios = {x: comp.peer_ratios(x) for x in modes}
    out = {}
    for i, e in enumerate(edges):
        if isinstance(e.sender, names.Head) and isinstance(e.receiver, names.HeadInput):
            r = e.receiver
            at = (e.sender.layer, e.sender.head, r.head.layer, r.head.head)
            c, ratio = comp.score(e.sender, r), float(ratios[r.which][at])
            out[i] = (None if c != c else c, float(pv[r.which][at]), None if ratio != ratio else ratio)
    return out


def _rows(tests: list[EdgeTestResult], composition: dict[int, tuple], st: Stats,
          corruption: str) -> list[dict[str, Any]]:
    """One row per edge under one corruption (claims.edge_test: BH over its non-zero edges)."""
    rows = []
    for i, t in enumerate(tests):
        e, iv = t.effect, t.effect.norm.interval
        score, comp_p, ratio = composition.get(i, (None, None, None))
        row = {"edge": str(t.spec.route), "corruption": corruption, "effect": None if iv is None else iv.estimate,
               "effect_ci": None if iv is None else [iv.low, iv.high], "undefined_reason": e.norm.reason,
               "raw_change": e.change.interval.estimate, "relative_change": e.read.relative_change,
               "vacuous": e.read.vacuous, "structurally_zero": e.structurally_zero, "p_value": e.p_value,
               "composition": score, "composition_p": comp_p, "p_adjusted": t.p_adjusted, "use": t.use}
        if comp_p is not None:
            row["peer_ratio"] = ratio
            row["composes"] = scores.composes(comp_p, ratio, st.composition_alpha, st.composition_min_ratio)
            row["class"] = classify(row["composes"], t.use)
        rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]], desc: str, n: int, corruptions: list[str],
           unusable: list[dict[str, Any]] | None = None, classes: dict[str, dict[str, int]] | None = None) -> str:
    from tabulate import tabulate

    several = len(corruptions) > 1
    body = [(r["edge"], *([r["corruption"]] if several else []), "undefined" if r["effect"] is None else
             f"{r['effect']:.3f} [{r['effect_ci'][0]:.3f}, {r['effect_ci'][1]:.3f}]", fmt_p(r['p_adjusted']),
             r["use"], f"{r['relative_change']:.2f}", "" if r["composition"] is None else f"{r['composition']:.3f}",
             "" if r["composition_p"] is None else fmt_p(r['composition_p']), r.get("class", ""))
            for r in rows]
    headers = ["edge", *(["corruption"] if several else []), "effect [CI]", "p_adj", "use", "changed",
               "composition", "comp. p (uncorr.)", "weights vs use"]
    skipped = "".join(f"not used: corruption {u['corruption']}: {u['reason']}\n" for u in unusable or [])
    by_class = f" ({edge_classes_text(classes)})" if classes else ""
    return (f"{desc}\n{skipped}{n} edges{by_class} x {len(corruptions)} corruption(s) ({', '.join(corruptions)}; "
            "noising, resample); "
            f"top {len(rows)} by effect; changed = how much the patch changes the sender's output where the "
            f"receiver reads it (below {SCAN_STATS.min_change:g}: untested):\n\n" + tabulate(body, headers=headers))


def is_scan(doc: Any) -> bool:
    """Whether a JSON document is a scan's scan.json (its edges, seed, metric and
    corruptions; no claims or jobs): `harness report` does not re-render those."""
    return (isinstance(doc, dict) and isinstance(doc.get("edges"), list) and "corruptions" in doc
            and "claims" not in doc and "jobs" not in doc)


def starter_model(model_source: str, folder: Path) -> str:
    """The starter file's `model:` (ModelRef.relative_to): `hf:NAME` as it is, a directory
    relative to `folder` (where starter.yaml is written; hypothesis paths resolve against
    their file's folder), or absolute when no relative path leads there (another drive)."""
    return ModelRef.parse(model_source).relative_to(folder)


def starter(rows: list[dict[str, Any]], model_source: str, *, n_prompts: int, segment_length: int, metric: str,
            corruptions: list[str], data: dict[str, Any] | None = None, top: int = 5,
            folder: Path | None = None, distinct: bool = False) -> dict[str, Any]:
    """A hypothesis with the strongest used edges as claims (each under the corruption that
    showed it, and for head -> head edges that compose the composition claim beside them).
    `data`: the scanned data's mapping (held_out_mapping), else the generator's (with
    `distinct`).  `folder`: where the file will be written; its model path is relative to it
    (default: absolute)."""
    used: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in rows:  # the strongest corruption per edge, rows being ranked by effect
        if r["use"] == USED and r["edge"] not in seen:
            seen.add(r["edge"])
            used.append(r)
    claims: list[dict[str, Any]] = []
    for r in used[:top]:
        slug = r["edge"].replace(" -> ", "-to-").replace(".", "-").replace("_", "-")
        claim = {"id": f"edge-{slug}", "kind": "edge", "edge": r["edge"], "expect": "used"}
        if r["corruption"] != corruptions[0]:
            claim["corruption"] = r["corruption"]
        claims.append(claim)
        if r.get("composes"):
            claims.append({"id": f"comp-{slug}", "kind": "composition", "edge": r["edge"], "expect": "composes"})
    if not claims:
        best = next((r for r in rows if r["effect"] is not None), None)
        if best is not None:
            claim = {"id": "strongest-edge", "kind": "edge", "edge": best["edge"], "expect": "used"}
            if best["corruption"] != corruptions[0]:
                claim["corruption"] = best["corruption"]
            claims.append(claim)
    if data is not None and "split" not in data:
        source: dict[str, Any] = data
        held_out = "it reads the scanned prompts: point data at held-out prompts before testing."
    elif data is not None:
        source = data
        held_out = "this file's data uses the held-out test split."
    else:
        source = {"generator": "repeated_tokens", "n_prompts": n_prompts, "segment_length": segment_length,
                  "split": "test", "corruptions": corruptions} | ({"distinct": True} if distinct else {})
        held_out = "this file's data uses the held-out test split."
    return {"harness": 1, "name": "starter",
            "description": "Written by `harness scan` from the strongest routes used under any corruption (explore "
                           f"split). Edit the claims, then test them: {held_out}",
            "model": (starter_model(model_source, folder) if folder is not None else
                      ModelRef.parse(model_source).source),
            "data": source, "metric": metric, "claims": claims}


def _write(out: Path, rows: list[dict[str, Any]], model_source: str, cfg: ScanSettings, *, corruptions: list[str],
           data: dict[str, Any] | None, unique: bool, unusable: list[dict[str, Any]],
           classes: dict[str, dict[str, int]]) -> None:
    doc = starter(rows, model_source, n_prompts=cfg.n_prompts, segment_length=cfg.segment_length, metric=cfg.metric,
                  corruptions=corruptions, data=data, folder=out, distinct=cfg.distinct)
    load(doc, base_dir=out)  # the starter file must be valid
    files = {"scan.json": to_json({"edges": rows, "seed": cfg.seed, "metric": cfg.metric,
                                   "corruptions": corruptions, "unusable_corruptions": unusable,
                                   "edge_classes": classes,
                                   "layers": None if cfg.layers is None else list(cfg.layers)}).encode(),
             "starter.yaml": yaml.safe_dump(doc, sort_keys=False).encode()}
    claimed = {c["edge"] for c in doc["claims"]}
    first = [r for r in rows if r["corruption"] == corruptions[0]]
    pts = [{"edge": r["edge"], "composition": r["composition"], "effect": r["effect"], "effect_ci": r["effect_ci"],
            "composes": r.get("composes", False), "claimed": r["edge"] in claimed, "untested": r["use"] == UNTESTED,
            "use": r["use"]} for r in first if r["composition"] is not None]
    png = signature({"points": pts, "min_effect": SCAN_STATS.min_effect, "tolerance": SCAN_STATS.tolerance,
                     "composition_alpha": SCAN_STATS.composition_alpha})
    if png is not None:
        files["signature.png"] = png
    write_folder(out, files, unique=unique)
