"""Report figures (matplotlib, headless), drawn from the evidence alone.

Each `draw_*` function returns a matplotlib Figure, or None when the run has
nothing to show; `render_all` turns them into PNG bytes:
* attention:    the claimed heads' patterns on the first prompt, one colour scale;
* composition:  score matrices per mode on one colour scale, sender heads (rows)
                against receiver inputs (columns), claimed edges outlined, each
                panel's count of cells above their own null 99th percentile;
* effects:      every observational and causal claim: estimate with CI bar,
                per-prompt values beside it, and the region its CI must lie in
                for PASS (`at_least`, `at_most`, `min_effect`, `tolerance`);
                claims with an undefined value say so in their row;
* signature:    composition score (x) against edge effect (y) for every candidate
                edge into the named receivers; colour = use status (the edge
                claims' rule), filled = composes (BH-adjusted null p < alpha),
                the `min_effect` and `tolerance` lines drawn, claimed and used
                edges labelled.

Every figure is at most `HTML_WIDTH` pixels wide, the width the HTML report shows
it at, so the report never scales its text down; `text_problems` finds text that
overlaps other text or leaves the figure (the tests run it on every figure).
"""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..claims.edge_test import OPPOSITE, UNTESTED, USED, UseRule
from ..evidence.result import ClaimResult, Evidence
from . import views
from .style import VERDICT_COLOURS
from .text import plain

F = TypeVar("F", bound=Callable[..., Any])
MAX_ROWS = 80  # claims drawn in effects.png (the rest are in the report's text)
LABEL_CHARS = 60
DPI = 110
HTML_WIDTH = 1060  # px: the report page's content width (report.html: max-width 1100px, 1em padding)
MAX_WIDTH_IN = HTML_WIDTH / DPI
CELL_TEXT_MAX = 12  # composition grids up to this many rows and columns print each cell's score
TICKS_MAX = 40  # longer axes are labelled per layer instead of per head
LAYER_TICKS_MAX = {"x": 8, "y": 30}  # per-layer labels that fit a composition panel's axis


def literal(fn: F) -> F:
    """Draw inside `fn` with every text literal: no mathtext (`$`, `\\`, `^` are plain
    characters) and no LaTeX, whatever the user's matplotlibrc says."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def label(text: object, chars: int = LABEL_CHARS) -> str:
    """Input text as a figure label: one line, at most `chars` characters."""
    s = plain(text)
    s = s if len(s) <= chars else s[:chars - 1] + "…"
    return " " + s if s.startswith("_") else s  # matplotlib hides legend labels that start with `_`


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any, tight: bool = True) -> bytes:
    """The figure as PNG bytes (closed afterwards); `tight`: cropped to what is drawn
    (the report's own figures use constrained layout at their exact size instead)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a token in a script the font lacks (Gemma's 262k vocabulary) draws as a box
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, bbox_inches="tight" if tight else None)
    pyplot().close(fig)
    return buf.getvalue()


# ---------------------------------------------------------------- checking text
def _drawn_texts(fig: Any) -> list[Any]:
    """Every non-empty text the figure draws (titles, labels, tick labels in view, legends,
    annotations), recorded while the figure is drawn once."""
    from matplotlib.text import Text

    drawn: list[Any] = []
    original = Text.draw

    def recording(self: Any, renderer: Any) -> None:
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)

    Text.draw = recording  # type: ignore[method-assign]
    try:
        fig.canvas.draw()
    finally:
        Text.draw = original  # type: ignore[method-assign]
    return drawn


def text_problems(fig: Any) -> list[str]:
    """Texts that overlap another text or reach outside the figure, as `'a' overlaps 'b'`
    lines ([] when every text stands clear)."""
    texts = _drawn_texts(fig)
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    found = []
    for i, (a, box) in enumerate(boxes):
        if box.x0 < page.x0 - 1 or box.y0 < page.y0 - 1 or box.x1 > page.x1 + 1 or box.y1 > page.y1 + 1:
            found.append(f"{a!r} reaches outside the figure")
        for b, other in boxes[i + 1:]:
            if box.overlaps(other) and _area(box, other) > 2.0:
                found.append(f"{a!r} overlaps {b!r}")
    return found


def _area(a: Any, b: Any) -> float:
    """The area (px²) two boxes share."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return float(max(w, 0.0) * max(h, 0.0))


def smallest_font_px(fig: Any) -> float:
    """The smallest text of the figure in pixels of the saved PNG."""
    sizes = [float(t.get_fontsize()) * DPI / 72 for t in _drawn_texts(fig)]
    return float(min(sizes)) if sizes else float("inf")


def new_figure(width: float, height: float) -> tuple[Any, Any]:
    """(pyplot, a constrained-layout figure at most MAX_WIDTH_IN wide)."""
    plt = pyplot()
    return plt, plt.figure(figsize=(min(width, MAX_WIDTH_IN), height), layout="constrained")


# ---------------------------------------------------------------- attention
# ---------------------------------------------------------------- composition
def _matrix(rows: list[list[Any]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def _ticks(ax: Any, axis: str, names_: list[str]) -> None:
    """Head labels on an axis; per layer (`L3`) when there are more than TICKS_MAX, every k-th
    layer when more than LAYER_TICKS_MAX[axis] layers would crowd a panel (30 layers: every 4th
    across a 2.9-inch panel)."""
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    if len(names_) <= TICKS_MAX:
        setter(range(len(names_)), [label(n, 16) for n in names_], fontsize=7,
               **({"rotation": 90} if axis == "x" else {}))
        return
    starts = [i for i, n in enumerate(names_) if i == 0 or n.split("H")[0] != names_[i - 1].split("H")[0]]
    starts = starts[::-(-len(starts) // LAYER_TICKS_MAX[axis])]
    setter(starts, [label(names_[i].split("H")[0], 8) for i in starts], fontsize=7)


@literal
def draw_composition(data: dict[str, Any], claimed: set[str]) -> Any | None:
    if not data:
        return None
    modes = sorted(data)
    scores = {m: _matrix(data[m]["scores"]) for m in modes}
    above = {m: _matrix(data[m]["null_q99"]) for m in modes}
    finite = [s[np.isfinite(s)] for s in scores.values()]
    top = max((float(f.max()) for f in finite if f.size), default=1.0) or 1.0
    n_cols = max(len(data[m]["receivers"]) for m in modes)
    plt, fig = new_figure(2.9 * len(modes) + 1.2, 3.9 if n_cols <= TICKS_MAX else 4.4)
    axes = np.atleast_1d(fig.subplots(1, len(modes), squeeze=False)).ravel()
    im = None
    for k, (ax, mode) in enumerate(zip(axes, modes)):
        d, sc, q99 = data[mode], scores[mode], above[mode]
        im = ax.imshow(sc, cmap="viridis", vmin=0.0, vmax=top, aspect="auto")
        _ticks(ax, "x", d["receivers"])
        _ticks(ax, "y", d["senders"])
        valid = np.isfinite(sc) & np.isfinite(q99)
        n_above = int(np.count_nonzero(sc[valid] > q99[valid]))
        ax.set_title(f"{label(mode.upper(), 4)}-composition\n{n_above} of {int(valid.sum())} above own null q99",
                     fontsize=9)
        ax.set_xlabel("receiver input (reads)", fontsize=9)
        if k == 0:
            ax.set_ylabel("sender head (writes)", fontsize=9)
        small = sc.shape[0] <= CELL_TEXT_MAX and sc.shape[1] <= CELL_TEXT_MAX
        for i, s in enumerate(d["senders"]):
            for j, r in enumerate(d["receivers"]):
                if small and np.isfinite(sc[i, j]):
                    ax.text(j, i, f"{sc[i, j]:.2f}"[1:] if 0 <= sc[i, j] < 1 else f"{sc[i, j]:.1f}",
                            ha="center", va="center", fontsize=5.5,
                            color="black" if sc[i, j] > 0.6 * top else "white")
                if f"{s} -> {r}" in claimed:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.8))
    fig.colorbar(im, ax=axes.tolist(), shrink=0.9, label="composition score C (one scale)")
    if claimed:
        from matplotlib.patches import Patch

        fig.legend(handles=[Patch(fill=False, edgecolor="red", lw=1.8, label="claimed edge")],
                   loc="outside lower center", fontsize=8, frameon=False)
    return fig


# ---------------------------------------------------------------- effects
def _rows(claims: list[ClaimResult]) -> list[ClaimResult]:
    """The claims the effects figure draws: observational and causal ones (the first MAX_ROWS)."""
    return [c for c in claims if c.evidence != "weights"][:MAX_ROWS]


def _region(c: ClaimResult) -> tuple[float | None, float | None] | None:
    r = c.pass_region
    return None if r is None else (r.low, r.high)


@literal
def draw_effects(claims: list[ClaimResult]) -> Any | None:
    """Each observational and causal claim (the first MAX_ROWS), grouped by unit: estimate, CI,
    per-prompt values, PASS region; an undefined value written in its row."""
    every = [c for c in claims if c.evidence != "weights"]
    rows = _rows(claims)
    if not rows:
        return None
    units = list(dict.fromkeys(c.unit for c in rows))
    groups = [[c for c in rows if c.unit == u] for u in units]
    plt, fig = new_figure(9.6, 0.36 * len(rows) + 0.95 * len(groups) + 1.0)
    axes = np.atleast_1d(fig.subplots(len(groups), 1, squeeze=False,
                                      gridspec_kw={"height_ratios": [len(g) + 1.2 for g in groups]})).ravel()
    rng = np.random.default_rng(0)
    for ax, unit, group in zip(axes, units, groups):
        lo_x, hi_x = _x_range(group)
        for y, c in enumerate(group):
            r = _region(c)
            if r is not None:
                a = lo_x if r[0] is None else max(r[0], lo_x)
                b = hi_x if r[1] is None else min(r[1], hi_x)
                ax.fill_between([a, b], y - 0.42, y + 0.42, color="#d8f0d8", zorder=0, lw=0)
                for edge in (x for x in r if x is not None and lo_x <= x <= hi_x):
                    ax.plot([edge, edge], [y - 0.42, y + 0.42], color="#2e8b2e", lw=1.0, ls="--", zorder=1)
                # the bound's words: inside a one-sided region, beside a two-sided one
                x_text, ha = (b, "left") if None not in r else (b, "right") if r[0] is None else (a, "left")
                ax.text(x_text, y - 0.4, f" {label(c.pass_region.text, 40)} " if c.pass_region else "",
                        ha=ha, va="top", fontsize=6.5, color="#2e8b2e", zorder=2)
            outside = 0
            if c.per_prompt:
                pp = np.asarray([v for v in c.per_prompt if v is not None], dtype=float)
                pp = pp[np.isfinite(pp)]
                inside = pp[(pp >= lo_x) & (pp <= hi_x)]
                outside = int(pp.size - inside.size)
                ax.scatter(inside, y + 0.24 + rng.uniform(-0.08, 0.08, inside.size), s=4, alpha=0.35,
                           color="grey", zorder=2, lw=0)
            colour = VERDICT_COLOURS.get(c.verdict, "black")
            if c.value is None:
                ax.text(lo_x + 0.02 * (hi_x - lo_x), y, label(f"undefined: {c.why}", 90), va="center",
                        fontsize=7, color=colour, zorder=3)
            elif c.ci and None not in c.ci:
                ax.errorbar(c.value, y, xerr=[[max(c.value - c.ci[0], 0.0)], [max(c.ci[1] - c.value, 0.0)]],
                            fmt="o", color=colour, capsize=4, markersize=5, zorder=3)
            else:
                ax.plot(c.value, y, "o", color=colour, markersize=5, zorder=3)
            if outside:
                ax.text(hi_x, y + 0.24, f"+{outside} off axis ", ha="right", va="center", fontsize=6,
                        color="dimgray")
        ax.set_xlim(lo_x, hi_x)
        ax.set_ylim(len(group) - 0.5, -0.5)
        ax.set_yticks(range(len(group)), [label(c.id, 40) for c in group], fontsize=8)
        ax.set_xlabel(label(unit, 30), fontsize=9)
        if lo_x < 0 < hi_x:
            ax.axvline(0, color="black", lw=0.5, zorder=1)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Line2D([], [], marker="o", ls="", color=VERDICT_COLOURS[v], label=f"{v}: estimate, CI")
                          for v in ("PASS", "FAIL", "INCONCLUSIVE")]
    handles += [Line2D([], [], marker="o", ls="", color="grey", alpha=0.5, markersize=3, label="per prompt"),
                Patch(color="#d8f0d8", label="PASS region (the CI must lie in it)")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=7.5, frameon=False)
    shown = "" if len(rows) == len(every) else f" (the first {len(rows)} of {len(every)})"
    fig.suptitle(f"Observational and causal claims{shown}", fontsize=11)
    return fig


def _x_range(group: list[ClaimResult]) -> tuple[float, float]:
    """The x-axis of one unit's panel: every estimate, CI end and PASS-region bound (and 0),
    widened to the per-prompt values but by at most twice that span on each side, so a few
    extreme per-prompt ratios (prompts with a tiny gap) do not squash the estimates;
    values beyond are counted in their row ("+k off axis")."""
    core = [0.0] + [x for c in group for x in ([c.value] if c.value is not None else []) + list(c.ci or [])
                    if x is not None]
    core += [x for c in group for x in (_region(c) or ()) if x is not None]
    lo, hi = min(core), max(core)
    span = max(hi - lo, 0.1)
    for c in group:
        pp = np.asarray([v for v in c.per_prompt or [] if v is not None], dtype=float)
        pp = pp[np.isfinite(pp)]
        if pp.size:
            lo = min(lo, max(float(pp.min()), min(core) - 2 * span))
            hi = max(hi, min(float(pp.max()), max(core) + 2 * span))
    pad = 0.06 * (hi - lo or 1.0)
    return lo - pad, hi + pad


# ---------------------------------------------------------------- signature
USE_STYLE = {  # use status -> (colour, legend text)
    "used": ("#2e8b2e", "used"),
    "used (opposite sign)": ("#c83232", "used, opposite sign"),
    "unused": ("#4a6fa5", "unused (within ±tolerance)"),
    "undetermined": ("#d99a00", "undetermined"),
    "untested": ("#888888", "untested (patch changes nothing read)"),
}


def use_of(p: dict[str, Any], min_effect: float, tolerance: float) -> str:
    """A signature point's use status: as recorded, or (documents before version 4) from
    its CI against the bands alone."""
    if p.get("use"):
        return str(p["use"])
    if p.get("untested"):
        return UNTESTED
    lo, hi = p["effect_ci"]
    return UseRule(min_effect=min_effect, tolerance=tolerance, alpha=1.0).status(lo, hi, p_adj=0.0)  # the bands alone


def _place_labels(ax: Any, fig: Any, items: list[tuple[float, float, str]]) -> None:
    """Annotate points, each label moved up or down until it overlaps no other label
    and stays inside the axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    for x, y, text in sorted(items, key=lambda t: -t[1]):
        px, _ = ax.transData.transform((x, y))
        right = px < frame.x0 + 0.6 * frame.width
        for dy in (6, -12, 18, -24, 30, -36, 42, -48):
            a = ax.annotate(text, (x, y), textcoords="offset points", xytext=(6 if right else -6, dy),
                            ha="left" if right else "right", fontsize=7, color="black",
                            arrowprops={"arrowstyle": "-", "color": "dimgray", "lw": 0.5})
            box = a.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            a.remove()


@literal
def draw_signature(data: dict[str, Any]) -> Any | None:
    pts = [p for p in data.get("points", []) if p["composition"] is not None and p["effect"] is not None
           and p["effect_ci"] is not None and None not in p["effect_ci"]]
    if not pts:
        return None
    min_effect, tol = float(data["min_effect"]), float(data.get("tolerance") or 0.0)
    plt, fig = new_figure(8.6, 5.6)
    ax = fig.subplots()
    xs = np.array([p["composition"] for p in pts])
    lows = np.array([p["effect_ci"][0] for p in pts])
    highs = np.array([p["effect_ci"][1] for p in pts])
    y0, y1 = min(lows.min(), -tol) - 0.04, max(highs.max(), min_effect) + 0.06
    ax.axhspan(-tol, tol, color="#e8eef8", zorder=0, lw=0)
    ax.axhline(min_effect, color="#2e8b2e", ls="--", lw=1, zorder=1)
    if y0 < -min_effect:
        ax.axhline(-min_effect, color="#c83232", ls="--", lw=1, zorder=1)
    ax.axhline(0, color="black", lw=0.4, zorder=1)
    present = []
    for p in pts:
        use = use_of(p, min_effect, tol)
        colour = USE_STYLE.get(use, ("black", use))[0]
        present.append(use)
        lo, hi = p["effect_ci"]
        ax.errorbar(p["composition"], p["effect"], yerr=[[max(p["effect"] - lo, 0.0)], [max(hi - p["effect"], 0.0)]],
                    fmt="o", color=colour, markersize=5, capsize=2, zorder=3, markeredgewidth=1.3,
                    markerfacecolor=colour if p["composes"] else "white")
        if p["claimed"]:
            ax.plot(p["composition"], p["effect"], "o", markersize=10, markerfacecolor="none",
                    markeredgecolor="black", markeredgewidth=1.0, zorder=4)
    span = float(xs.max() - xs.min()) or 0.1
    ax.set_xlim(xs.min() - 0.06 * span, xs.max() + 0.06 * span)
    ax.set_ylim(y0, y1)
    ax.set_xlabel("composition score C (weights)", fontsize=9)
    ax.set_ylabel("edge effect, fraction of gap (use)", fontsize=9)
    ax.set_title("Signature: weights propose, interventions decide", fontsize=11)
    ax.text(1.0, min_effect, f" min_effect {min_effect:g}", transform=ax.get_yaxis_transform(), va="center",
            ha="left", fontsize=7, color="#2e8b2e")
    ax.text(1.0, tol, f" ±tolerance {tol:g}", transform=ax.get_yaxis_transform(), va="bottom", ha="left",
            fontsize=7, color="#4a6fa5")
    from matplotlib.lines import Line2D

    uses = [u for u in USE_STYLE if u in present] + [u for u in dict.fromkeys(present) if u not in USE_STYLE]
    handles = [Line2D([], [], marker="o", ls="", color=USE_STYLE.get(u, ("black", u))[0],
                      label=USE_STYLE.get(u, ("black", u))[1]) for u in uses]
    handles += [Line2D([], [], marker="o", ls="", color="black", markerfacecolor="black", label="composes (p_adj < "
                       f"{data.get('composition_alpha', 0.01):g})"),
                Line2D([], [], marker="o", ls="", color="black", markerfacecolor="white", label="does not compose"),
                Line2D([], [], marker="o", ls="", markerfacecolor="none", markeredgecolor="black", markersize=10,
                       label="claimed edge (ring)")]
    fig.legend(handles=handles, loc="outside right upper", fontsize=7.5, title="use (colour), weights (fill)",
               title_fontsize=8, frameon=False)
    shown = [(p["composition"], p["effect"], label(p["edge"], 32)) for p in pts
             if p["claimed"] or use_of(p, min_effect, tol) in (USED, OPPOSITE)]
    _place_labels(ax, fig, shown)
    return fig


def signature(data: dict[str, Any]) -> bytes | None:
    """The signature plot as PNG bytes (None: no point to draw); `harness scan` draws it too."""
    fig = draw_signature(data)
    return None if fig is None else png(fig, tight=False)


def draw_all(ev: Evidence) -> dict[str, Any]:
    """{file name: Figure} for every figure this evidence supports."""
    fd = ev.figures_data or {}
    claimed = {e for c in ev.claims for e in views.get(c.kind).claimed_edges(c)}
    out = {
        "composition.png": draw_composition(fd.get("composition", {}), claimed),
        "effects.png": draw_effects(ev.claims),
        "signature.png": draw_signature(fd.get("signature", {})),
    }
    return {k: v for k, v in out.items() if v is not None}


def render_all(ev: Evidence) -> dict[str, bytes]:
    """{file name: PNG bytes} for every figure this evidence supports."""
    return {k: png(v, tight=False) for k, v in draw_all(ev).items()}
