"""`harness scan`: every edge at once, before writing a hypothesis.

For every sender (embed, heads) -> later head .q/.k/.v and -> logits edge:
* the causal effect (noising, resample replacement, batched exact edge
  patching, mech.batched_edges): normalised effect with a BCa CI and a sign-flip
  p-value, Benjamini-Hochberg adjusted over all edges, and its use status
  (claims.edge.use_status, with the default `stats` thresholds);
* for head -> head-input edges, the composition score and its rotation-null
  p-value (uncorrected, `--draws` draws: an exploration aid, not a claim), and
  the weights-vs-use class.

Prints the edges ranked by effect, and writes into a new folder: scan.json
(every edge), signature.png (composition vs effect), and starter.yaml, a
hypothesis file whose claims are the strongest used routes, for the user to edit
and then test on held-out prompts (its data uses the `test` split; the scan uses
`explore`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .. import stats
from ..claims.edge import classify, use_status
from ..claims.effects import normalized_effect
from ..evidence.document import to_json
from ..hypothesis.loading import load
from ..mech import batched_edges, weights
from ..mech.hooks import cache_hooks
from ..model import data, metrics
from ..model.devices import of, resolve_device
from ..model.loading import load_model
from ..progress import progress
from ..report.figures import signature
from ..report.writer import write_folder
from ..spec import names
from ..spec.settings import Stats
from ..streams import Stream, derive_seed

SCAN_STATS = Stats(bootstrap=1000, permutations=2000)  # thresholds are the defaults; fewer resamples


def scan(model_source: str, out: Path, n_prompts: int = 200, segment_length: int = 20, seed: int = 0,
         metric: str = "logprob", processing: str = "folded", draws: int = 1000, top: int = 15,
         budget_mb: int = 32, bootstrap: int = 1000, device: str | None = None) -> tuple[list[dict], str]:
    """Run the scan; return (rows ranked by effect, printable table).  `device`: where the
    model runs (devices.resolve_device: None = $HARNESS_DEVICE or the best available);
    prompts are drawn on the CPU and moved there, the statistics run on the CPU."""
    device = resolve_device(device)
    m = load_model(model_source, device=device)
    bridge, L, H = m.bridge, m.n_layers, m.n_heads
    ds = data.repeated_tokens(n_prompts, segment_length, m.d_vocab, seed, "explore", bos_token=m.bos_token)
    ds = ds.to(of(bridge))
    hooks = batched_edges.cache_names(L)
    clean, corrupt = cache_hooks(bridge, ds.clean, hooks), cache_hooks(bridge, ds.corrupted, hooks)
    m_clean = metrics.per_prompt(clean["logits"], ds.positions, ds.answers, metric).cpu().numpy()
    m_corrupt = metrics.per_prompt(corrupt["logits"], ds.positions, ds.answers, metric).cpu().numpy()
    edges = batched_edges.all_edges(L, H)

    def mf(logits: Any, pos: Any) -> Any:
        return metrics.per_prompt(logits, pos, ds.answers.repeat(logits.shape[0] // ds.n, 1), metric)

    patched = batched_edges.batched_metrics(bridge, edges, clean, corrupt, clean, ds.positions, mf, "resample",
                                    budget_mb * 2**20, progress)
    st = SCAN_STATS.model_copy(update={"bootstrap": bootstrap})
    hw = weights.head_weights(bridge, processing)
    mode_scores = {x: weights.all_scores(hw, x) for x in "qkv"}
    rows = []
    for i, e in enumerate(progress(edges, "statistics")):
        d = m_clean - patched[i]
        norm = normalized_effect(d, m_clean - m_corrupt, st, derive_seed(seed, Stream.SCAN_EFFECT, i),
                                 metrics.UNITS[metric])
        iv = norm.interval
        row: dict[str, Any] = {
            "edge": str(e), "effect": None if iv is None else iv.estimate,
            "effect_ci": None if iv is None else [iv.low, iv.high], "undefined_reason": norm.reason,
            "raw_change": float(d.mean()),
            "p_value": stats.sign_flip_pvalue(d[norm.kept], st.permutations,
                                              derive_seed(seed, Stream.SCAN_PERMUTATION, i))
            if iv is not None else 1.0,
            "composition": None, "composition_p": None}
        if isinstance(e.sender, names.Head) and isinstance(e.receiver, names.HeadInput):
            r = e.receiver
            c = float(mode_scores[r.which][e.sender.layer, e.sender.head, r.head.layer, r.head.head])
            p, _ = weights.null_p_value(weights.sender_matrix(hw, e.sender.layer, e.sender.head),
                                        weights.receiver_matrix(hw, r.head.layer, r.head.head, r.which), c,
                                        draws, derive_seed(seed, Stream.SCAN_NULL, i), null_dim=hw.null_dim)
            row["composition"], row["composition_p"] = (None if c != c else c), p
        rows.append(row)
    for row, p_adj in zip(rows, stats.benjamini_hochberg([r["p_value"] for r in rows]), strict=True):
        row["p_adjusted"] = p_adj
        lo, hi = row["effect_ci"] if row["effect_ci"] else (float("nan"), float("nan"))
        row["use"] = (use_status(lo, hi, p_adj, st.min_effect, st.tolerance, st.alpha)
                      if row["effect_ci"] else "undetermined")
        if row["composition_p"] is not None:
            row["composes"] = row["composition_p"] < st.composition_alpha
            row["class"] = classify(row["composes"], row["use"])
    rows.sort(key=lambda r: -(r["effect"] if r["effect"] is not None else -np.inf))
    table = _table(rows[:top], ds.description, len(rows))
    _write(out, rows, model_source, n_prompts, segment_length, seed, metric, top)
    return rows, table


def _table(rows: list[dict], desc: str, n: int) -> str:
    from tabulate import tabulate

    body = [(r["edge"], "undefined" if r["effect"] is None else
             f"{r['effect']:.3f} [{r['effect_ci'][0]:.3f}, {r['effect_ci'][1]:.3f}]", f"{r['p_adjusted']:.2g}",
             r["use"], "" if r["composition"] is None else f"{r['composition']:.3f}",
             "" if r["composition_p"] is None else f"{r['composition_p']:.3g}", r.get("class", ""))
            for r in rows]
    return (f"{desc}\n{n} edges (noising, resample); top {len(rows)} by effect:\n\n"
            + tabulate(body, headers=["edge", "effect [CI]", "p_adj", "use", "composition", "comp. p (uncorr.)",
                                      "weights vs use"]))


def starter(rows: list[dict], model_source: str, n_prompts: int, segment_length: int, metric: str,
            top: int = 5) -> dict:
    """A hypothesis with the strongest used edges as claims (and, for head -> head
    edges that compose, the composition claim beside them)."""
    used = [r for r in rows if r["use"] == "used"][:top]
    claims = []
    for r in used:
        slug = r["edge"].replace(" -> ", "-to-").replace(".", "-").replace("_", "-")
        claims.append({"id": f"edge-{slug}", "kind": "edge", "edge": r["edge"], "expect": "used"})
        if r.get("composes"):
            claims.append({"id": f"comp-{slug}", "kind": "composition", "edge": r["edge"], "expect": "composes"})
    if not claims:
        best = next((r for r in rows if r["effect"] is not None), None)
        if best is not None:
            claims.append({"id": "strongest-edge", "kind": "edge", "edge": best["edge"], "expect": "used"})
    return {"harness": 1, "name": "starter",
            "description": "Written by `harness scan` from the strongest used routes (explore split). Edit the "
                           "claims, then test them: this file's data uses the held-out test split.",
            "model": str(Path(model_source).resolve()) if not model_source.startswith("hf:") else model_source,
            "data": {"generator": "repeated_tokens", "n_prompts": n_prompts, "segment_length": segment_length,
                     "split": "test"},
            "metric": metric, "claims": claims}


def _write(out: Path, rows: list[dict], model_source: str, n_prompts: int, segment_length: int, seed: int,
           metric: str, top: int) -> None:
    doc = starter(rows, model_source, n_prompts, segment_length, metric)
    load(doc)  # the starter file must be valid
    files = {"scan.json": to_json({"edges": rows, "seed": seed, "metric": metric}).encode(),
             "starter.yaml": yaml.safe_dump(doc, sort_keys=False).encode()}
    claimed = {c["edge"] for c in doc["claims"]}
    pts = [{"edge": r["edge"], "composition": r["composition"], "effect": r["effect"], "effect_ci": r["effect_ci"],
            "composes": r.get("composes", False), "claimed": r["edge"] in claimed}
           for r in rows if r["composition"] is not None]
    png = signature({"points": pts, "min_effect": SCAN_STATS.min_effect})
    if png is not None:
        files["signature.png"] = png
    write_folder(out, files)
