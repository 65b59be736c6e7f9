"""`harness roles`: a table of every head on a data set, for choosing a hypothesis.

For each head h, on the clean prompts (generated repeated-token prompts, the `explore`
split by default so the `test` split stays held out for hypotheses, or the prompts of a
data file, `--data`, engine.data_source.from_data_file):

* **role scores** (mech.roles): per prompt, then the mean over prompts;
* **attention to each slot occurrence** of a template (`IO#1`, `S#1`, `S#2`, ...): per prompt
  a_n = mean over the scored positions q of the sum over the occurrence's tokens k of
  A_h[n, q, k] (the attention claim's score, claims.attention.attention_scores);
* **direct effect** on the metric, exact: the edge h -> logits noised with the default
  corruption's run (resample), every other edge kept, so the logits read h's corrupted write
  and everything else clean; per prompt e_n = m_clean - m_patched, and the effect is
  DE_h = sum_n e_n / sum_n (m_clean - m_corrupt), the fraction of the clean-corrupted gap that h
  carries straight to the logits (one pass for all heads: mech.edges.batched, each a forward of
  the final norm and unembedding).  With `logit_diff` the effect is split into its two parts
  (model.metrics: answer_logit + wrong_logit = logit_diff, prompt by prompt): `direct via
  answer_logit` and `direct via wrong_logit`, each over the same logit_diff gap, so they add up
  to `direct`: a head that raises the answer (a mover) is told from one that lowers the wrong
  token (a suppressor); a change every logit shares shows in both parts with opposite signs.

Above the rows, what the table stands on: the model's accuracy and the answer's rank on the
clean prompts (and on the corrupted ones; model.behaviour), the clean-corrupted gap the direct
effects are fractions of, with its interval, and a warning where that interval reaches 0 (the
direct columns are then noise) or the model is near chance.

Intervals (95 %): the role and attention means get a t interval (mean +- t_{n-1} sd / sqrt n,
NaN prompts left out); the direct effect, a ratio, a percentile bootstrap of the prompts
(1,000 resamples, the same resamples for every head).  `--sort COLUMN` orders the rows by that
column's mean, from the largest (the direct effect by its size: heads that push the metric
down, e.g. negative movers, rank high too); `--top N` keeps the first N; `--out DIR` writes
heads.csv, heads.json and heads.png (the sorted column as a layer x head grid), every row; without
`--out`, a table `--top` cuts is written to a new folder under reports/ all the same (harness.cli),
so no row computed is lost.  Cost: the
clean and corrupted runs (2 forward passes, which score both parts of logit_diff) and, for
the direct effects, one final-norm pass per head with the unembedding of the answer's and the
wrong token's columns only (logit_diff), or of the whole vocabulary (other metrics).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps
from tabulate import tabulate

from .. import memory, stats
from ..claims.attention import attention_scores, queries
from ..data.sources import generated
from ..engine.data_source import DataSource, DataSpec, build_dataset
from ..errors import UnsupportedError, UserError
from ..evidence.document import to_json
from ..mech import roles
from ..mech.edges import batched, sets
from ..mech.hooks import cache_hooks
from ..mech.runs.build import base_runs
from ..mech.runs.cached import BATCH_BUDGET
from ..model import behaviour, metrics
from ..model.devices import of
from ..model.loaded import LoadedModel
from ..model.tokenizer import start_words
from ..progress import stage
from ..report.figures import png, pyplot
from ..report.folders import write_folder
from ..spec import names
from ..spec.names import hook_pattern
from ..spec.vocabulary import Direction, Replacement

DIRECT = "direct"
PARTS = ("answer_logit", "wrong_logit")  # logit_diff, prompt by prompt (model.metrics)
RESAMPLES = 1000
SINK = ("first_token: the attention to position 0, where most heads of a trained model rest when they have "
        "nothing to read (the attention sink): a high value alone is not a role")
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Column:
    """One column of the table: its name, and per head the mean and interval ([H] each)."""

    name: str
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


@dataclass(frozen=True)
class HeadTable:
    heads: list[names.Head]
    columns: list[Column]
    description: str  # the data's, and how the prompts begin
    metric: str | None  # of the direct effect (None: not measured)
    note: str  # what the direct effect is, or why it is missing
    #: the model's accuracy and answer rank (model.behaviour.document), on the clean prompts and, with the
    #: direct effects, the corrupted ones
    behaviour: dict[str, Any] | None = None
    gap: dict[str, Any] | None = None  # the clean-corrupted gap the direct effects are fractions of: {mean, ci}


def _t_interval(per_prompt: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high) of the finite values: a 95 % t interval (low = high = mean for one value)."""
    x = per_prompt[np.isfinite(per_prompt)]
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, mean, mean
    half = float(sps.t.ppf(0.5 + CONFIDENCE / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def _column(name: str, per_head: list[np.ndarray]) -> Column:
    rows = np.array([_t_interval(x) for x in per_head])
    return Column(name, rows[:, 0], rows[:, 1], rows[:, 2])


def head_table(m: LoadedModel, *, n_prompts: int, segment_length: int, seed: int, split: str,
               distinct: bool = False, given: tuple[DataSpec, DataSource] | None = None,
               metric: str | None = None, direct: bool = True, corruption: str | None = None) -> HeadTable:
    """The table (module docstring) on the generator's prompts, or on `given` data; the direct effects
    under `corruption` (default: the data's first)."""
    import torch

    ds = (build_dataset(*given, m) if given is not None else
          generated(m, n_prompts, segment_length, "harness roles", seed=seed, split=split, n_ctx=m.n_ctx,
                    distinct=distinct)).to(of(m.bridge))
    if corruption is not None:
        if corruption not in ds.corruptions:
            raise UserError(f"--corruption {corruption}: the data have {', '.join(ds.corruptions) or 'none'}")
        ds = ds.keep_corruptions([corruption])
    heads = list(names.Head.every(m.n_layers, m.n_heads))
    metric = metric or metrics.default_for(ds)
    unfit = metrics.fits_problem(metric, ds)
    if unfit is not None:
        raise UserError(f"--metric {metric}: {unfit}")
    direct = direct and bool(ds.corruptions)
    to_logits = [names.Edge(h, names.Logits()) for h in heads]
    edge_hooks = sets.cache_names(m.n_layers, to_logits) if direct else []  # what the head -> logits patches read
    hooks = [hook_pattern(layer) for layer in range(m.n_layers)] + edge_hooks
    stage(f"head table: {ds.n} prompts ({start_words(m, ds)}), {len(heads)} heads")
    parts = PARTS if metric == "logit_diff" and direct else (metric,)
    runs: Any = None
    if direct:  # one clean and one corrupted run, scored by every part (patterns: the clean run's only)
        runs = base_runs(m.bridge, ds.keep_corruptions(list(ds.corruptions)[:1]), hooks, parts[0], parts=parts[1:],
                         corrupted=edge_hooks)
        clean = runs.clean
    else:  # the clean run alone
        stage(f"the clean run caches {len(hooks)} attention patterns")
        rows: list[Any] = []
        answers, wrong = ds.scored(ds.answer_sets is not None)  # what behaviour compares

        def take(logits_at: Any, lo: int) -> None:
            hi = lo + logits_at.shape[0]
            rows.append(behaviour.per_prompt(logits_at, answers[lo:hi], None if wrong is None else wrong[lo:hi]))

        clean = cache_hooks(m.bridge, ds.clean, hooks, ds.positions, keep=0, each=take)
    behaves = behaviour.document(runs.behaviour if runs is not None else {"clean": torch.cat(rows).numpy()},
                                 int(ds.positions.shape[1]), ds.wrong is not None, m.d_vocab_out, RESAMPLES,
                                 CONFIDENCE, seed, sets=ds.answer_sets is not None)
    stage(behaviour.headline(behaves))
    q = queries(ds, "scored").to(of(m.bridge))
    slots = list(ds.spans) if ds.spans else []  # in reading order
    per_role: dict[str, list[np.ndarray]] = {r: [] for r in roles.ROLES}
    per_slot: dict[str, list[np.ndarray]] = {k: [] for k in slots}
    with torch.no_grad():
        for h in heads:
            pat = clean[hook_pattern(h.layer)][:, h.head]
            for r in roles.ROLES:
                per_role[r].append(roles.role_scores(pat, ds.clean, r).cpu().numpy())
            for k in slots:
                per_slot[k].append(attention_scores(pat, q, ds.spans[k].to(pat.device)))
    columns = [_column(f"attn {k}", per_slot[k]) for k in slots]
    columns += [_column(r, per_role[r]) for r in roles.ROLES]
    note = ""
    gap_ci = None
    if direct:
        corruption = runs.corruption
        found = _direct(runs, to_logits, parts)
        del runs
        effect, gap = np.sum([e for e, _ in found], axis=0), np.sum([g for _, g in found], axis=0)
        got = stats.mean_ci(gap, RESAMPLES, CONFIDENCE, seed)
        gap_ci = {"mean": got.estimate, "ci": [got.low, got.high]}
        columns[:0] = [_ratio(DIRECT, effect, gap, seed)] + (
            [_ratio(f"{DIRECT} via {part}", e, gap, seed) for part, (e, _) in zip(parts, found, strict=True)]
            if len(parts) > 1 else [])
        note = (f"direct: the fraction of the clean-corrupted gap ({metric}, corruption {corruption}) each head "
                "carries straight to the logits (the edge HEAD -> logits noised, resample), with a 95 % bootstrap "
                "interval" + ("; split into what it does to the answer's logit and to the wrong token's "
                              "(they add up to direct)" if len(parts) > 1 else ""))
    else:
        metric = None
        note = ("no direct effects: the data have no corruption" if not ds.corruptions
                else "no direct effects: left out (--no-direct)")
    return HeadTable(heads, columns, ds.description, metric, note, behaves, gap_ci)


def _direct(runs: Any, edges: list[names.Edge], parts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per part (metric) of `parts`, which the base runs took: (e [n, H]: each head's per-prompt direct
    effect m_clean - m_patched, gap [n]: m_clean - m_corrupt) (module docstring).  The two parts of
    logit_diff read two logits of each patched run: one pass computes only those (the answer's and
    the wrong token's columns of the unembedding); other metrics, or an architecture the batched
    arithmetic does not reproduce, one pass per part over the whole vocabulary (Runs.patched_many)."""
    per_part = [runs if p == parts[0] else runs.with_metric(p) for p in parts]
    both = _logit_parts(runs, edges) if tuple(parts) == PARTS else None
    if both is None:
        stage(f"direct effects: {len(edges)} head -> logits edges, one final-norm and unembedding pass each"
              + (f", for each of {len(parts)} parts" if len(parts) > 1 else ""))
        both = np.stack([np.stack(r.patched_many(edges, Direction.NOISING, Replacement.RESAMPLE))
                         for r in per_part], -1)  # [E, n, parts]
    out = []
    for j, r in enumerate(per_part):
        clean = np.asarray(r.m_clean, dtype=float)
        out.append((clean[:, None] - both[..., j].T, clean - np.asarray(r.m_corrupt, dtype=float)))
    return out


def _logit_parts(runs: Any, edges: list[names.Edge]) -> np.ndarray | None:
    """[E, n, 2]: answer_logit and wrong_logit (model.metrics) of each head -> logits edge patched, from
    one pass that unembeds the answer's and the wrong token's columns only (mech.edges.batched
    `tokens`); None where the batched arithmetic does not reproduce the model."""
    stage(f"direct effects: {len(edges)} head -> logits edges, one final-norm pass each and the unembedding "
          "of the answer and the wrong token")
    few = metrics.columns_metric(PARTS, runs.ds.answers, runs.ds.wrong)  # [N, k, 2] -> [N, 2]: both parts
    if few is None:
        return None
    tokens, parts_of = few
    try:
        return batched.batched_metrics(runs.bridge, edges, runs.clean, runs.corrupt, runs.clean, runs.ds.positions,
                                       parts_of, replacement=Replacement.RESAMPLE,
                                       budget_bytes=memory.working(BATCH_BUDGET), tokens=tokens, values=len(PARTS))
    except UnsupportedError:
        return None


def _ratio(name: str, effect: np.ndarray, gap: np.ndarray, seed: int) -> Column:
    """sum_n e_n / sum_n gap_n per head, with a percentile bootstrap of the prompts (the same resamples
    for every head and column: `seed`; stats.ratio_of_sums_ci); NaN where the gap is not positive."""
    return Column(name, *stats.ratio_of_sums_ci(effect, gap, RESAMPLES, CONFIDENCE, seed))


def ordered(t: HeadTable, sort: str | None, top: int | None) -> list[int]:
    """Row indices: by `sort`'s mean from the largest (the direct effect by its size), else head order;
    the first `top`.  ValueError naming the columns for an unknown column."""
    order = list(range(len(t.heads)))
    if sort is not None:
        col = next((c for c in t.columns if c.name == sort or c.name == f"attn {sort}"), None)
        if col is None:
            raise ValueError(f"--sort {sort}: no such column; columns: "
                             + ", ".join(c.name.removeprefix("attn ") for c in t.columns))
        key = np.abs(col.mean) if col.name.startswith(DIRECT) else col.mean
        order = sorted(order, key=lambda i: (-key[i] if np.isfinite(key[i]) else math.inf, i))
    return order[:top] if top else order


def _cell(c: Column, i: int) -> str:
    if not np.isfinite(c.mean[i]):
        return "-"
    if c.name.startswith(DIRECT):  # a ratio's percentile interval: not symmetric
        return f"{c.mean[i]:.3f} [{c.low[i]:.3f}, {c.high[i]:.3f}]"
    return f"{c.mean[i]:.3f} ± {(c.high[i] - c.low[i]) / 2:.3f}"


def render(t: HeadTable, sort: str | None = None, top: int | None = None) -> str:
    """The printable table with the data's description and the direct effect's note above it."""
    rows = [[str(t.heads[i])] + [_cell(c, i) for c in t.columns] for i in ordered(t, sort, top)]
    shown = f"; rows by {sort}" if sort else ""
    sink = [SINK] if any(c.name == "first_token" for c in t.columns) else []
    head = "".join(f"{line}\n" for line in [t.description, *behaviour_lines(t), *sink])
    return (f"{head}{t.note}; intervals 95 %{shown}\n\n"
            + tabulate(rows, headers=["head", *(c.name for c in t.columns)], disable_numparse=True))


def behaviour_lines(t: HeadTable) -> list[str]:
    """What the table stands on: the model's accuracy and answer rank on the clean prompts (and the
    corrupted ones), the gap the direct effects are fractions of, and a warning where that gap's interval
    reaches zero (the direct columns are then noise) or the model is near chance."""
    b = t.behaviour
    if b is None:
        return []
    out = [behaviour.headline(b)]
    out += [f"  on the prompts of corruption {name}: {behaviour.words(b, name, full=False)}" for name in b["corrupted"]]
    if t.gap is not None:
        low, high = t.gap["ci"]
        out.append(f"clean - corrupted gap {t.gap['mean']:.4g} [{low:.4g}, {high:.4g}] ({t.metric})")
        if not (low > 0 or high < 0):
            out.append("warning: the gap's interval reaches 0: the direct columns, fractions of it, are noise")
    if b["near_chance"]:
        out.append("warning: the model is near chance on this task: no head's role in it means much")
    return out


def role_table(m: LoadedModel, *, n_prompts: int, segment_length: int, seed: int, split: str, distinct: bool = False,
               given: tuple[DataSpec, DataSource] | None = None, metric: str | None = None, direct: bool = True,
               sort: str | None = None, top: int | None = None, corruption: str | None = None) -> str:
    """The printable head table (module docstring)."""
    return render(head_table(m, n_prompts=n_prompts, segment_length=segment_length, seed=seed, split=split,
                             distinct=distinct, given=given, metric=metric, direct=direct, corruption=corruption),
                  sort, top)


def files(t: HeadTable, sort: str | None = None) -> dict[str, bytes]:
    """heads.csv, heads.json (every head, every column's mean and interval) and heads.png."""
    order = ordered(t, sort, None)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["head", *(f"{c.name}{part}" for c in t.columns for part in ("", " low", " high"))])
    for i in order:
        w.writerow([str(t.heads[i]), *(f"{v:.6g}" for c in t.columns for v in (c.mean[i], c.low[i], c.high[i]))])
    doc = {"description": t.description, "metric": t.metric, "note": t.note, "confidence": CONFIDENCE,
           "behaviour": t.behaviour, "gap": t.gap,
           "columns": [c.name for c in t.columns],
           "heads": [{"head": str(t.heads[i]), **{c.name: [float(c.mean[i]), float(c.low[i]), float(c.high[i])]
                                                  for c in t.columns}} for i in order]}
    return {"heads.csv": out.getvalue().encode(), "heads.json": to_json(doc).encode(),
            "heads.png": _grid_png(t, sort)}


def _grid_png(t: HeadTable, sort: str | None) -> bytes:
    """The sorted column (else the direct effect, else the first) as a layer x head grid."""
    col = next((c for c in t.columns if sort is not None and c.name in (sort, f"attn {sort}")), t.columns[0])
    L = max(h.layer for h in t.heads) + 1
    H = max(h.head for h in t.heads) + 1
    grid = np.full((L, H), np.nan)
    for h, v in zip(t.heads, col.mean, strict=True):
        grid[h.layer, h.head] = v
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(12.0, 2 + 0.5 * H), min(14.0, 1.5 + 0.3 * L)))
    lim = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    im = ax.imshow(grid, aspect="auto", cmap="RdBu_r" if col.name == DIRECT else "viridis",
                   vmin=-lim if col.name == DIRECT else None, vmax=lim if col.name == DIRECT else None)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(H))
    ax.set_yticks(range(0, L, max(1, L // 15)))
    ax.set_title(f"{col.name} per head" + (" (fraction of the gap, straight to the logits)" if col.name == DIRECT
                                           else ""))
    fig.colorbar(im, ax=ax)
    return png(fig)


def write(t: HeadTable, out: Path, sort: str | None = None, unique: bool = False) -> Path:
    """The --out folder (report.folders.write_folder: whole or not at all; `unique`: a default folder's
    name, moved on to the next free one if taken)."""
    return write_folder(out, files(t, sort), unique=unique)


__all__ = ["DIRECT", "HeadTable", "files", "head_table", "ordered", "render", "role_table", "write"]
