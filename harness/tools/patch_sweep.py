"""`harness patch`: where the task's information sits, a layer x position map of the residual stream.

The first look at a new task: for every layer l and position p, the residual stream at (l, p) of
one run is patched into the other (mech.runs.position_patch; denoising by default: the clean
residual into the corrupted run), and the effect is the fraction of the clean - corrupted gap
that one residual carries,

    E[l, p] = sum_n e_n[l, p] / sum_n (m_clean,n - m_corrupted,n)

`--heads`: each head's output at each position instead (rows L{l}H{h}), the next look once the
map shows which layers matter; `--layers A-B`: those layers only.

with e_n the per-prompt change in the metric, oriented so that 1 is all of the clean behaviour
(denoising: restored; noising: destroyed) and 0 none of it.  Intervals (95 %): a percentile
bootstrap of the prompts, 1,000 resamples shared by every cell (stats.ratio_of_sums_ci).  A
cell that cannot change anything (after the last scored position, or identical in both runs) is
exactly 0 and is not run.

Above the map, what it stands on (as `harness roles`): the model's accuracy and answer rank on
the clean and corrupted prompts (model.behaviour) and the gap with its interval; a warning where
the gap's interval reaches 0 (the map is then noise) or the model is near chance.  Positions are
named by the first prompt's token and, where every prompt has it at that position, the slot
occurrence (`IO#1`) of a template or of `spans`.  `--out DIR` writes patching.json (every cell's
effect and interval, docs/methods.md), patching.csv and patching.png (the map).

Cost: the clean and corrupted runs (2 forward passes, caching the residual before every layer,
and with `--heads` every head's output) and sum over the cells run of (L - l) / L forward passes
(printed before they run).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from .. import stats
from ..data.sources import generated
from ..engine.data_source import DataSource, DataSpec, build_dataset
from ..errors import UserError
from ..evidence.document import to_json
from ..mech.runs import position_patch
from ..mech.runs.build import base_runs
from ..model import behaviour, metrics
from ..model.devices import of
from ..model.loaded import LoadedModel
from ..model.tokenizer import shown_tokenizer, start_words
from ..progress import stage
from ..report.figures import png, pyplot
from ..report.folders import write_folder
from ..spec.vocabulary import Direction

RESAMPLES = 1000
CONFIDENCE = 0.95
VERSION = 1  # patching.json's format (docs/methods.md)
SITE = {"resid": "residual", "heads": "head output"}
WHAT = {"resid": "residual at one layer and position", "heads": "output of one head at one position"}


def explained(direction: str, site: str) -> str:
    """What a cell's value is, in words."""
    if Direction(direction) is Direction.DENOISING:
        return (f"the clean {WHAT[site]} patched into the corrupted run: the fraction of the clean - corrupted gap "
                "it restores")
    return (f"the corrupted {WHAT[site]} patched into the clean run: the fraction of the clean - corrupted gap it "
            "destroys")


@dataclass(frozen=True)
class PatchMap:
    """The map: effect, low, high [R, s] (0 where not run), `run` [R, s], one row a layer (resid) or a
    head (heads, `rows` its names), and what it stands on."""

    site: str
    rows: list[str]
    effect: np.ndarray
    low: np.ndarray
    high: np.ndarray
    run: np.ndarray
    positions: list[dict[str, Any]]  # per position: index, token (the first prompt's), slot (or None)
    description: str
    metric: str
    corruption: str
    direction: str
    n_prompts: int
    forwards: float  # the cells' cost in forward passes (the base runs' 2 besides)
    behaviour: dict[str, Any]
    gap: dict[str, Any]  # {mean, ci}

    @property
    def shown(self) -> list[int]:
        """The positions with a cell run (every other position's cells are exactly 0)."""
        return [int(p) for p in np.flatnonzero(self.run.any(0))]


def patch_map(m: LoadedModel, *, n_prompts: int, segment_length: int, seed: int, split: str,
              distinct: bool = False, given: tuple[DataSpec, DataSource] | None = None, metric: str | None = None,
              corruption: str | None = None, direction: str = Direction.DENOISING, site: str = "resid",
              layers: tuple[int, int] | None = None) -> PatchMap:
    """The map (module docstring) on the generator's prompts, or on `given` data, under `corruption`
    (default: the data's first), of `site` (position_patch.SITES) at blocks `layers` (A, B: A..B)."""
    ds = (build_dataset(*given, m) if given is not None else
          generated(m, n_prompts, segment_length, "harness patch", seed=seed, split=split, n_ctx=m.n_ctx,
                    distinct=distinct)).to(of(m.bridge))
    if not ds.corruptions:
        raise UserError("harness patch: the data have no corruption: there is nothing to patch from")
    if corruption is not None and corruption not in ds.corruptions:
        raise UserError(f"--corruption {corruption}: the data have {', '.join(ds.corruptions)}")
    ds = ds.keep_corruptions([corruption or ds.default_corruption])
    if layers is not None and layers[1] >= m.n_layers:
        raise UserError(f"--layers {layers[0]}-{layers[1]}: the model has blocks 0-{m.n_layers - 1}")
    chosen = range(layers[0], layers[1] + 1) if layers is not None else range(m.n_layers)
    metric = metric or metrics.default_for(ds)
    unfit = metrics.fits_problem(metric, ds)
    if unfit is not None:
        raise UserError(f"--metric {metric}: {unfit}")
    stage(f"{SITE[site]} patching: {ds.n} prompts ({start_words(m, ds)}), {len(chosen)} layers x "
          f"{ds.clean.shape[1]} positions" + (f" x {m.n_heads} heads" if site == "heads" else ""))
    runs = base_runs(m.bridge, ds, position_patch.cache_names(site, chosen), metric)
    behaves = behaviour.document(runs.behaviour, int(ds.positions.shape[1]), ds.wrong is not None, m.d_vocab_out,
                                 RESAMPLES, CONFIDENCE, seed, sets=ds.answer_sets is not None)
    stage(behaviour.headline(behaves))
    gap = np.asarray(runs.m_clean, dtype=np.float64) - np.asarray(runs.m_corrupt, dtype=np.float64)
    got = stats.mean_ci(gap, RESAMPLES, CONFIDENCE, seed)
    cells = position_patch.cells_to_run(runs, site, chosen)
    e = position_patch.effects(runs, direction, cells)  # [L, s, n] or [L, H, s, n]
    del runs
    s = int(ds.clean.shape[1])
    run = cells.run.reshape(-1, s)
    if site == "resid":
        keep, names = list(chosen), [f"L{layer}" for layer in chosen]
    else:
        keep = [layer * m.n_heads + h for layer in chosen for h in range(m.n_heads)]
        names = [f"L{layer}H{h}" for layer in chosen for h in range(m.n_heads)]
    run = run[keep]
    R = len(keep)
    mean, low, high = stats.ratio_of_sums_ci(e.reshape(-1, s, ds.n)[keep].reshape(R * s, -1).T, gap, RESAMPLES,
                                             CONFIDENCE, seed)
    effect, low, high = (np.where(run, x.reshape(R, s), 0.0) for x in (mean, low, high))
    return PatchMap(site, names, effect, low, high, run,
                    _positions(m, ds), ds.description, metric, ds.default_corruption,
                    str(Direction(direction)), ds.n, cells.forwards(), behaves,
                    {"mean": got.estimate, "ci": [got.low, got.high]})


def _positions(m: LoadedModel, ds: Any) -> list[dict[str, Any]]:
    """Each position's index, the first prompt's token there (None without a tokenizer) and the slot
    occurrence every prompt has at it (None where there is none or the prompts disagree)."""
    tok = shown_tokenizer(m)
    first = [int(t) for t in ds.clean[0].tolist()]
    pieces = tok.pieces(first) if tok is not None else [None] * len(first)
    out = []
    for p in range(len(first)):
        slot = next((name for name, span in ds.spans.items()
                     if bool(((span[:, 0] <= p) & (p < span[:, 1])).all())), None)
        out.append({"index": p, "token": pieces[p], "slot": slot})
    return out


def label(pos: dict[str, Any]) -> str:
    """A position as a reader names it: `7 IO#1 ' Mary'`."""
    parts = [str(pos["index"])]
    if pos["slot"]:
        parts.append(str(pos["slot"]))
    if pos["token"] is not None:
        parts.append(repr(pos["token"]))
    return " ".join(parts)


def headline_lines(t: PatchMap) -> list[str]:
    """What the map stands on: behaviour, the gap, and warnings where either makes the map mean little."""
    b = t.behaviour
    out = [t.description, behaviour.headline(b)]
    out += [f"  on the prompts of corruption {name}: {behaviour.words(b, name, full=False)}" for name in b["corrupted"]]
    low, high = t.gap["ci"]
    out.append(f"clean - corrupted gap {t.gap['mean']:.4g} [{low:.4g}, {high:.4g}] ({t.metric}, corruption "
               f"{t.corruption})")
    if not (low > 0 or high < 0):
        out.append("warning: the gap's interval reaches 0: every cell, a fraction of it, is noise")
    if b["near_chance"]:
        out.append("warning: the model is near chance on this task: where its information sits means little")
    return out


def render(t: PatchMap, top: int = 10) -> str:
    """The printable map: rows layers (heads: the rows of the `top` cells), columns the positions with
    a cell run, then the `top` cells by size with their intervals."""
    shown = t.shown
    left = [p["index"] for p in t.positions if p["index"] not in shown]
    notes = [f"{t.direction}: {explained(t.direction, t.site)}; {t.n_prompts} prompts, "
             f"{t.forwards:.1f} forward passes for the cells"]
    if left:
        notes.append(f"positions left out (every cell exactly 0: after the last scored position, or the same in both "
                     f"runs): {_ranges(left)}")
    if not shown:
        return "\n".join([*headline_lines(t), *notes, "no cell can change the metric: the runs do not differ"])
    order = sorted(((r, p) for r in range(len(t.rows)) for p in shown if t.run[r, p]),
                   key=lambda c: -abs(t.effect[c]))[:top]
    listed = range(len(t.rows)) if t.site == "resid" else sorted({r for r, _ in order})
    rows = [[t.rows[r]] + [("." if not t.run[r, p] else f"{t.effect[r, p]:.2f}") for p in shown] for r in listed]
    table = tabulate(rows, headers=["layer" if t.site == "resid" else "head", *(label(t.positions[p]) for p in shown)],
                     disable_numparse=True)
    if t.site == "heads":
        notes.append(f"the rows of the {len(order)} strongest cells (every head: --out's patching.csv and .png)")
    best = [f"  {t.rows[r]} at {label(t.positions[p])}: {t.effect[r, p]:.3f} "
            f"[{t.low[r, p]:.3f}, {t.high[r, p]:.3f}]" for r, p in order]
    return "\n".join([*headline_lines(t), *notes, "", table, "", "strongest cells (95 % intervals):", *best])


def _ranges(xs: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], xs[0]
    for a, b in zip(xs, [*xs[1:], None], strict=True):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b if b is not None else start
    return ", ".join(out)


def document(t: PatchMap) -> dict[str, Any]:
    """patching.json (docs/methods.md)."""
    def grid(x: np.ndarray) -> list[list[float]]:
        return [[float(v) for v in row] for row in x]

    return {"format": "harness residual patching", "version": VERSION, "description": t.description,
            "metric": t.metric, "corruption": t.corruption, "direction": t.direction, "site": t.site,
            "explained": explained(t.direction, t.site), "n_prompts": t.n_prompts, "confidence": CONFIDENCE,
            "resamples": RESAMPLES, "forward_passes": t.forwards, "behaviour": t.behaviour, "gap": t.gap,
            "rows": t.rows, "positions": t.positions, "run": [[bool(v) for v in r] for r in t.run],
            "effect": grid(t.effect), "low": grid(t.low), "high": grid(t.high)}


def files(t: PatchMap) -> dict[str, bytes]:
    """patching.json, patching.csv (one row a cell run) and patching.png."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["layer" if t.site == "resid" else "head", "position", "slot", "token", "effect", "low", "high"])
    for r, name in enumerate(t.rows):
        for p in t.shown:
            if t.run[r, p]:
                pos = t.positions[p]
                w.writerow([name, p, pos["slot"] or "", "" if pos["token"] is None else pos["token"],
                            *(f"{v:.6g}" for v in (t.effect[r, p], t.low[r, p], t.high[r, p]))])
    return {"patching.json": to_json(document(t)).encode(), "patching.csv": out.getvalue().encode(),
            "patching.png": _png(t)}


def _png(t: PatchMap) -> bytes:
    """The map over the positions with a cell run: layers (or heads) down, positions across, 0 white."""
    shown = t.shown or [0]
    grid = np.where(t.run[:, shown], t.effect[:, shown], np.nan)
    L, P = grid.shape
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(16.0, 3 + 0.6 * P), min(24.0, 2 + 0.3 * L)))
    lim = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_xticks(range(P))
    ax.set_xticklabels([label(t.positions[p]) for p in shown], rotation=60, ha="right", fontsize=8)
    ticks = range(0, L, max(1, L // 40))
    ax.set_yticks(list(ticks))
    ax.set_yticklabels([t.rows[r] for r in ticks], fontsize=8)
    ax.set_xlabel("position (of the first prompt)")
    ax.set_ylabel("layer (the residual it reads)" if t.site == "resid" else "head (its output)")
    ax.set_title(f"{SITE[t.site]} patching, {t.direction} ({t.metric}): "
                 "fraction of the gap")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return png(fig)


def write(t: PatchMap, out: Path, unique: bool = False) -> Path:
    """The --out folder (report.folders.write_folder: whole or not at all; `unique`: a default folder's
    name, moved on to the next free one if taken)."""
    return write_folder(out, files(t), unique=unique)


__all__ = ["PatchMap", "document", "explained", "files", "label", "patch_map", "render", "write"]
