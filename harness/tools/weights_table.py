"""`harness weights`: every cross-layer composition score of a model, per mode, with the
rotation-null p-value of each pair, Benjamini-Hochberg adjusted over all pairs of that mode.

`mech.weights.table.composition_data` computes the numbers once (a `WeightsTables`);
from it:

* `render` (the terminal): a header (processing, null draws, baseline, the rotary note),
  then per mode the top pairs by C (C, raw p, BH-adjusted p, the decision at alpha,
  C x sqrt(null_dim), C / C_max) and, for small models (at most FULL_MAX_HEADS heads in
  all) or with `full`, the full table (`*` = significant); then one summary per (sender
  layer, receiver layer), every mode side by side;
* `csv_bytes` / `json_bytes` / `output_files` (`harness weights --out FOLDER`):
  composition.csv and composition.json, one row per pair and mode, and the heatmap
  composition.png (report.weights_figure).
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import numpy as np
from tabulate import tabulate

from ..evidence.document import to_json
from ..mech.weights import scores
from ..mech.weights.table import MAX_DRAWS, WeightsTables, composition_data
from ..model.bridge import Bridge
from ..report.weights_figure import composition_png
from ..spec import names

TOP = 20  # pairs per mode on the terminal (harness weights --top)
FULL_MAX_HEADS = 16  # models with at most this many heads in all also print the full tables
CSV_COLUMNS = ("sender", "receiver", "mode", "score", "p", "p_adj", "significant", "null_draws", "peer_ratio",
               "composes")
SINGLE_LAYER = "the model has a single layer: no cross-layer pairs"


# ---------------------------------------------------------------- the terminal
def _num(x: float, spec: str = ".3f") -> str:
    return "none" if x != x else format(x, spec)  # NaN: a zero matrix, no route


def _p(x: float) -> str:
    return "none" if x != x else f"{x:.3g}"


def header(t: WeightsTables) -> list[str]:
    out = [f"Composition scores C = ||X Y||_F / (||X||_F ||Y||_F); weights {t.processing}; "
           f"{t.n_layers} layers x {t.n_heads} heads, {len(t.pairs())} cross-layer pairs per mode; "
           f"{t.n_draws} shared null draws per pair (pairs with p < alpha extended to {t.extend_to:,}); "
           f"isotropic baseline 1/sqrt({t.null_dim}) = {t.baseline:.3f}; significant: p_adj < {t.alpha:g}, the "
           f"rotation-null p Benjamini-Hochberg adjusted over the pairs of a mode (where no "
           f"draw reaches C, the concentration bound on the null's tail stands in when it is smaller: "
           f"docs/hypothesis-format.md)."]
    if t.rotary:
        out.append("Rotary positions: Q- and K-composition are one-sided and offset-free (Y = the receiver's W_Q, "
                   "W_K: what its queries and keys read; the QK form itself depends on the offset); V-composition "
                   "is Y = OV as usual.")
    if t.extend_to < t.needed:
        out.append(f"With {len(t.pairs())} pairs per mode, Monte Carlo p can reach the BH threshold only with "
                   f"{t.needed:,} draws; pairs with p < alpha are extended to {t.extend_to:,} (--max-draws), so "
                   "below that floor only the tail bound can make a pair significant.")
    return out


def top_pairs(t: WeightsTables, mode: str, n: int) -> list[tuple[int, int, int, int]]:
    """The n pairs of `mode` with the largest C (pairs with no route left out), largest first;
    ties in the full table's order."""
    scores = t.modes[mode].scores
    ranked = [q for q in t.pairs() if not math.isnan(scores[q])]
    ranked.sort(key=lambda q: -scores[q])  # stable
    return ranked[:n]


def top_table(t: WeightsTables, mode: str, n: int) -> str:
    m = t.modes[mode]
    rows = []
    for rank, q in enumerate(top_pairs(t, mode, n), 1):
        c, cm = float(m.scores[q]), float(m.c_max[q])
        rows.append([rank, str(names.Head(q[0], q[1])), str(names.HeadInput(names.Head(q[2], q[3]), mode)),
                     _num(c), _p(float(m.p[q])), _p(float(m.p_adj[q])),
                     "yes" if t.significant(mode, q) else "no", int(m.draws[q]), _num(c * math.sqrt(t.null_dim), ".2f"),
                     _num(c / cm if cm > 0 else float("nan"), ".2f"), _num(float(m.peer_ratio[q]), ".2f"),
                     "yes" if t.composes(mode, q) else "no"])
    return tabulate(rows, disable_numparse=True, colalign=("right",) + ("left",) * 2 + ("right",) * 9,
                    headers=["rank", "sender", "receiver", "C", "p", "p_adj", f"p_adj < {t.alpha:g}", "draws",
                             f"C x sqrt({t.null_dim})", "C / C_max", "C / peers", "composes"])


def layer_summary(t: WeightsTables, mode: str) -> list[dict[str, Any]]:
    """Per (sender layer, receiver layer): pairs, significant, max C and mean C (over the pairs
    with a route; None when there is none), the baseline."""
    m, out = t.modes[mode], []
    for l1 in range(t.n_layers - 1):
        for l2 in range(l1 + 1, t.n_layers):
            block = m.scores[l1, :, l2, :]
            defined = block[~np.isnan(block)]
            out.append({"sender_layer": l1, "receiver_layer": l2, "pairs": int(block.size),
                        "significant": int(np.sum(m.p_adj[l1, :, l2, :] < t.alpha)),
                        "composes": int(t.composes_grid(mode)[l1, :, l2, :].sum()),
                        "max_score": float(defined.max()) if defined.size else None,
                        "mean_score": float(defined.mean()) if defined.size else None,
                        "baseline": t.baseline})
    return out


def summary_table(t: WeightsTables) -> str:
    """Per (sender layer, receiver layer), every mode side by side: pairs, significant, max C,
    mean C; the isotropic baseline last."""
    by_mode = {mode: layer_summary(t, mode) for mode in t.modes}
    first = next(iter(by_mode.values()))
    rows = []
    for i, s in enumerate(first):
        row: list[Any] = [f"L{s['sender_layer']}", f"L{s['receiver_layer']}", s["pairs"]]
        for mode in t.modes:
            m = by_mode[mode][i]
            row += [m["significant"], m["composes"], _num(float("nan") if m["max_score"] is None else m["max_score"]),
                    _num(float("nan") if m["mean_score"] is None else m["mean_score"])]
        rows.append(row + [f"{t.baseline:.3f}"])
    heads = ["sender", "receiver", "pairs"]
    for mode in t.modes:
        heads += [f"{mode} sig", f"{mode} comp", f"{mode} max C", f"{mode} mean C"]
    return tabulate(rows, disable_numparse=True, colalign=("left", "left") + ("right",) * (len(heads) - 1),
                    headers=heads + ["baseline"])


def full_table(t: WeightsTables, mode: str) -> str:
    """Every pair: rows senders, columns receiver inputs, `*` = significant."""
    L, H, m = t.n_layers, t.n_heads, t.modes[mode]
    receivers = [(l2, h2) for l2 in range(1, L) for h2 in range(H)]
    rows = []
    for l1 in range(L - 1):
        for h1 in range(H):
            row = [str(names.Head(l1, h1))]
            for l2, h2 in receivers:
                q = (l1, h1, l2, h2)
                row.append("" if l2 <= l1 else _num(float(m.scores[q])) + ("*" if t.significant(mode, q) else ""))
            rows.append(row)
    return tabulate(rows, disable_numparse=True,
                    headers=["sender"] + [str(names.HeadInput(names.Head(l, h), mode)) for l, h in receivers])


def render(t: WeightsTables | None, top: int = TOP, full: bool | None = None) -> str:
    """The terminal text; `full` None: the full tables for models of at most FULL_MAX_HEADS heads."""
    if t is None:
        return SINGLE_LAYER
    show_full = t.n_layers * t.n_heads <= FULL_MAX_HEADS if full is None else full
    out = header(t)
    n_pairs = len(t.pairs())
    for mode, m in t.modes.items():
        n_sig = int(np.nansum(m.p_adj < t.alpha))
        n_comp = int(t.composes_grid(mode).sum())
        out += ["", f"{mode.upper()}-composition (senders: OV; receivers: .{mode}); "
                f"{n_sig} of {n_pairs} pairs significant, {n_comp} of them at least {t.min_ratio:g} x their peers' "
                f"median (compose); {t.n_draws} null draws"
                + (f", {m.n_extended} pair(s) with p < alpha extended to {t.extend_to}" if m.n_extended else "")
                + (f"; {m.by_bound} pair(s) below the Monte Carlo floor by the tail bound" if m.by_bound else ""),
                "", f"top {min(top, n_pairs)} of {n_pairs} pairs by C:", top_table(t, mode, top)]
        if show_full:
            out += ["", f"all pairs (rows: sender OV; columns: receiver .{mode}; * = significant):",
                    full_table(t, mode)]
    out += ["", f"Per layer pair (sig: pairs with p_adj < {t.alpha:g}; comp: those that also reach "
            f"{t.min_ratio:g} x their peers' median; mean C against the isotropic baseline "
            f"1/sqrt({t.null_dim})):", summary_table(t)]
    if not show_full:
        out += ["", "(every pair: --full, or --out FOLDER for composition.csv, .json and .png)"]
    return "\n".join(out)


def composition_tables(bridge: Bridge, *, processing: str, n_draws: int, alpha: float, seed: int,
                       modes: tuple[str, ...] = scores.MODES, max_draws: int = MAX_DRAWS, top: int = TOP,
                       full: bool | None = None) -> str:
    """The terminal text of `harness weights` (composition_data, then render)."""
    return render(composition_data(bridge, processing=processing, n_draws=n_draws, alpha=alpha, seed=seed,
                                   modes=modes, max_draws=max_draws), top, full)


# ---------------------------------------------------------------- the files
def rows(t: WeightsTables) -> list[dict[str, Any]]:
    """One record per pair and mode (mode-major, then the full table's order); NaN scores stay NaN."""
    out = []
    for mode, m in t.modes.items():
        for q in t.pairs():
            out.append({"sender": str(names.Head(q[0], q[1])),
                        "receiver": str(names.HeadInput(names.Head(q[2], q[3]), mode)), "mode": mode,
                        "score": float(m.scores[q]), "p": float(m.p[q]), "p_adj": float(m.p_adj[q]),
                        "significant": t.significant(mode, q), "null_draws": int(m.draws[q]),
                        "peer_ratio": float(m.peer_ratio[q]), "composes": t.composes(mode, q)})
    return out


def csv_bytes(t: WeightsTables) -> bytes:
    """composition.csv: CSV_COLUMNS; floats as repr (they read back exactly), an empty score
    for a pair with no route, significant as true/false."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows(t):
        w.writerow(["" if isinstance(v, float) and v != v else
                    ("true" if v else "false") if isinstance(v, bool) else repr(v) if isinstance(v, float) else v
                    for v in (r[c] for c in CSV_COLUMNS)])
    return buf.getvalue().encode()


def settings(t: WeightsTables, model: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"processing": t.processing, "n_layers": t.n_layers, "n_heads": t.n_heads, "null_dim": t.null_dim,
            "baseline": t.baseline, "draws": t.n_draws, "max_draws": t.max_draws, "extended_to": t.extend_to,
            "draws_needed": t.needed, "alpha": t.alpha, "min_ratio": t.min_ratio, "seed": t.seed, "rotary": t.rotary,
            "modes": list(t.modes), "adjustment": "Benjamini-Hochberg over the pairs of a mode",
            "model": model or {}}


def json_bytes(t: WeightsTables, model: dict[str, Any] | None = None) -> bytes:
    """composition.json: {"settings", "summary" (per mode, per layer pair), "pairs" (the CSV's
    records, NaN as null)}; one pair per line (evidence.document.to_json), so a GPT-2-sized file stays
    small."""
    summary = {mode: layer_summary(t, mode) for mode in t.modes}
    return to_json({"settings": settings(t, model), "summary": summary, "pairs": rows(t)}).encode()


def output_files(t: WeightsTables, model: dict[str, Any] | None = None) -> dict[str, bytes]:
    """{name: bytes} of the --out folder."""
    return {"composition.csv": csv_bytes(t), "composition.json": json_bytes(t, model),
            "composition.png": composition_png(t)}
