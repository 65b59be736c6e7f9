"""The explain figure (a report's `explain.png`, and `harness explain --out`): what flows
through head -> head-input routes (mech.weights.explain), one row per route, drawn from the
evidence alone:

* left:   the product's singular values sigma_i / (||X||_F ||Y||_F) (their squares sum
          to C^2) against the rotation null's central 95% band of the i-th largest;
* middle: the principal angles between what the sender writes and what the receiver
          reads (degrees, smallest first) against the null's band;
* right:  the top directions: share of C^2 against the null, the tokens the sender reads
          and what the receiver's other side reads (.q/.k) or promotes (.v).

At most MAX_ROUTES rows: the composition claims' routes first, in file order, then the
weights-vs-use table's, each route once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..evidence.details import Explained, ExplainedDirection
from ..evidence.explain_text import DIRECT_DEPTH, readout_depths, token
from ..evidence.format import fmt, fmt_ci
from ..evidence.result import Evidence
from .figures import MAX_WIDTH_IN, label, literal, png, pyplot

MAX_ROUTES = 6
LINE_CHARS = 66  # characters per text line in the right-hand panel
OBSERVED, BAND = "#1f5fa8", "#d9d9d9"


def routes(ev: Evidence) -> list[tuple[str, Explained]]:
    """(edge, Explained) of every explained route: composition claims first, then the
    weights-vs-use rows, each edge once."""
    out: dict[str, Explained] = {}
    for c in ev.claims:
        ex = getattr(c.details, "explained", None)
        edge = getattr(c.details, "edge", None)
        if isinstance(ex, Explained) and isinstance(edge, str):
            out.setdefault(edge, ex)
    for r in ev.weights_vs_use:
        if r.explained is not None:
            out.setdefault(r.edge, r.explained)
    return list(out.items())


def _band(ax: Any, band: list[list[float | None]], x: np.ndarray) -> None:
    n = min(len(band), len(x))
    lo = np.array([np.nan if b[0] is None else b[0] for b in band[:n]], dtype=float)
    hi = np.array([np.nan if b[1] is None else b[1] for b in band[:n]], dtype=float)
    ax.fill_between(x[:n], lo, hi, color=BAND, lw=0, zorder=0, label="rotation null, 95% band")


def _direction_lines(d: ExplainedDirection, sender: str, receiver: str, n_layers: int | None) -> list[str]:
    """A direction's share and, where they read the direct path within DIRECT_DEPTH layers, its token
    readouts (explain_text.direction)."""
    side = {"k": "queries", "q": "keys"}.get(receiver.rsplit(".", 1)[-1], "")
    same = f" ({d.multiplicity} equal)" if d.multiplicity > 1 else ""
    before, after = readout_depths(sender, receiver, n_layers)
    pos = "" if d.positional_share is None or before > DIRECT_DEPTH else f", pos. {fmt(d.positional_share, 2)}"
    out = [f"{d.index}: share {fmt(d.share)}, null {fmt(d.null_share_mean)} {fmt_ci(d.null_share_ci)}{pos}{same}"]
    if before <= DIRECT_DEPTH:  # deeper: said once for the route (draw_explain)
        out.append("   reads " + ", ".join(token(t) for t in d.sender_reads))
        if d.receiver_reads is not None:
            match = "" if d.token_match is None else f" (match {fmt(d.token_match, 2)})"
            out.append(f"   {side} read " + ", ".join(token(t) for t in d.receiver_reads) + match)
    if d.promotes is not None and (after is None or after <= DIRECT_DEPTH):
        out.append("   promotes " + ", ".join(token(t) for t in d.promotes))
    return out


@literal
def draw_explain(items: list[tuple[str, Explained]]) -> Any | None:
    """One row per route (the first MAX_ROUTES); None when there is none."""
    shown = items[:MAX_ROUTES]
    if not shown:
        return None
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig = plt.figure(figsize=(MAX_WIDTH_IN, 2.45 * len(shown) + 0.7), layout="constrained")
    grid = fig.subplots(len(shown), 3, squeeze=False, gridspec_kw={"width_ratios": [1.0, 1.0, 1.55]})
    for row, (edge, ex) in zip(grid, shown):
        spec, angles, words = row
        x = np.arange(1, len(ex.spectrum) + 1)
        _band(spec, ex.null_spectrum, x)
        spec.plot(x, ex.spectrum, "o-", color=OBSERVED, markersize=3, lw=1, zorder=2, label="this route")
        spec.set_title(label(f"{edge}: C = {fmt(ex.score)}", 44), fontsize=9)
        spec.set_xlabel("singular direction i", fontsize=8)
        spec.set_ylabel("sigma_i / (|X| |Y|)", fontsize=8)
        spec.set_ylim(bottom=0)
        spec.tick_params(labelsize=7)
        spec.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ex.angles:
            k = np.arange(1, len(ex.angles) + 1)
            _band(angles, ex.null_angles, k)
            angles.plot(k, ex.angles, "o-", color=OBSERVED, markersize=3, lw=1, zorder=2)
        angles.set_ylim(0, 90)
        angles.set_yticks([0, 30, 60, 90])
        angles.set_title(f"{ex.n_aligned} of {len(ex.angles)} angles below the null", fontsize=9)
        angles.set_xlabel("principal angle j", fontsize=8)
        angles.set_ylabel("degrees", fontsize=8)
        angles.tick_params(labelsize=7)
        angles.xaxis.set_major_locator(MaxNLocator(integer=True))
        words.axis("off")
        sender, receiver = (part.strip() for part in edge.split("->"))
        before, _ = readout_depths(sender, receiver, ex.n_layers)
        text = ([f"(readouts left out: {before} layers after the embeddings)"] if before > DIRECT_DEPTH
                and ex.directions else [])
        text += [line for d in ex.directions for line in _direction_lines(d, sender, receiver, ex.n_layers)]
        text = text or ["no direction: the product is zero"]
        head = f"top directions of {ex.rank}: share of C², tokens read"
        step = min(0.1, 0.9 / max(len(text), 1))
        words.text(0.0, 1.0, label(head, LINE_CHARS), fontsize=7.5, va="top", ha="left", transform=words.transAxes,
                   weight="bold")
        for j, line in enumerate(text):
            words.text(0.0, 0.9 - j * step, label(line, LINE_CHARS), fontsize=7, va="top", ha="left",
                       transform=words.transAxes)
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=7.5, frameon=False)
    more = f" (the first {len(shown)} of {len(items)})" if len(items) > len(shown) else ""
    fig.suptitle(f"What flows through each route: singular directions of X Y against the rotation null{more}",
                 fontsize=10)
    return fig


def render(ev: Evidence) -> dict[str, bytes]:
    """{"explain.png": PNG bytes} when the evidence explains a route, else {}."""
    fig = draw_explain(routes(ev))
    return {} if fig is None else {"explain.png": png(fig, tight=False)}
