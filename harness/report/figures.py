"""Report figures (matplotlib, headless), drawn from the evidence alone.

Each function returns PNG bytes or None when the run has nothing to show:
* attention:    heatmaps of the claimed heads' patterns on the first prompt;
* composition:  score matrices per mode, cells above their own null 99th
                percentile marked, claimed edges outlined;
* effects:      causal and attention claims: estimate with CI bar and the
                per-prompt values beside it (cancellation stays visible);
* signature:    composition score (x) vs causal effect (y) for every candidate
                edge into the named receivers, claimed edges labelled, the four
                weights-vs-use quadrants shaded.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..claims import registry
from ..evidence.result import ClaimResult, Evidence
from .style import VERDICT_COLOURS
from .text import plain

F = TypeVar("F", bound=Callable[..., Any])
MAX_ROWS = 80  # claims drawn in effects.png (the rest are in the report's text)
MAX_PANELS = 12  # heads drawn in attention.png
LABEL_CHARS = 60


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


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    pyplot().close(fig)
    return buf.getvalue()


@literal
def attention(data: list[dict[str, Any]]) -> bytes | None:
    data = data[:MAX_PANELS]
    if not data:
        return None
    plt = pyplot()
    n = len(data)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4.0), squeeze=False)
    for ax, item in zip(axes[0], data):
        pat = np.asarray(item["pattern"], dtype=float)
        im = ax.imshow(pat, cmap="Blues", vmin=0, vmax=1)
        ax.set_title(f"{label(item['head'])} attention (prompt 0)")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return png(fig)


@literal
def composition(data: dict[str, Any], claimed: set[str]) -> bytes | None:
    if not data:
        return None
    plt = pyplot()
    modes = sorted(data)
    fig, axes = plt.subplots(1, len(modes), figsize=(5.0 * len(modes), 4.6), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        d = data[mode]
        sc = np.array([[np.nan if v is None else v for v in row] for row in d["scores"]], dtype=float)
        q99 = np.array([[np.nan if v is None else v for v in row] for row in d["null_q99"]], dtype=float)
        im = ax.imshow(sc, cmap="viridis")
        ax.set_xticks(range(len(d["receivers"])), [label(r) for r in d["receivers"]], rotation=90, fontsize=7)
        ax.set_yticks(range(len(d["senders"])), [label(x) for x in d["senders"]], fontsize=7)
        ax.set_title(f"{label(mode.upper())}-composition (• above own null q99)")
        for i, s in enumerate(d["senders"]):
            for j, r in enumerate(d["receivers"]):
                if np.isfinite(sc[i, j]) and np.isfinite(q99[i, j]) and sc[i, j] > q99[i, j]:
                    ax.plot(j, i, "o", color="white", markersize=3)
                if f"{s} -> {r}" in claimed:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return png(fig)


@literal
def effects(claims: list[ClaimResult]) -> bytes | None:
    """Each claim with per-prompt data (the first MAX_ROWS): estimate, CI, per-prompt values."""
    every = [(c, c.value, c.ci) for c in claims if c.per_prompt and c.ci and c.value is not None
             and None not in c.ci]
    rows = every[:MAX_ROWS]
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 0.55 * len(rows) + 1.2))
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for y, (c, _, _) in enumerate(rows):
        pp = np.asarray(c.per_prompt, dtype=float)
        xs.append(pp)
        ys.append(y + 0.22 + rng.uniform(-0.08, 0.08, len(pp)))
    ax.scatter(np.concatenate(xs), np.concatenate(ys), s=4, alpha=0.35, color="grey")
    for y, (c, value, (lo, hi)) in enumerate(rows):
        ax.errorbar(value, y, xerr=[[max(value - lo, 0.0)], [max(hi - value, 0.0)]], fmt="o",
                    color=VERDICT_COLOURS.get(c.verdict, "black"), capsize=4)
    ax.set_yticks(range(len(rows)), [f"{label(c.id)} ({label(c.unit, 20)})" for c, _, _ in rows], fontsize=8)
    ax.axvline(0, color="black", lw=0.5)
    ax.invert_yaxis()
    ax.set_xlabel("estimate with CI (colour = verdict); grey: per-prompt values")
    shown = "" if len(rows) == len(every) else f" (the first {len(rows)} of {len(every)})"
    ax.set_title(f"Claims with per-prompt data{shown}")
    return png(fig)


QUADRANTS = [  # (composes, used) -> label, colour
    ((True, True), "route used", "#d8f0d8"),
    ((True, False), "route present, unused", "#f8e4c8"),
    ((False, True), "used without a weight route", "#dce6f8"),
    ((False, False), "no route", "#eeeeee"),
]
OPPOSITE_COLOUR = "#f4d4d4"


@literal
def signature(data: dict[str, Any]) -> bytes | None:
    pts = [p for p in data.get("points", []) if p["composition"] is not None and p["effect"] is not None
           and p["effect_ci"] is not None and None not in p["effect_ci"]]
    if not pts:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    xs = np.array([p["composition"] for p in pts])
    ys = np.array([p["effect"] for p in pts])
    # x boundary: between the largest non-composing and the smallest composing score
    comp = [p["composition"] for p in pts if p["composes"]]
    non = [p["composition"] for p in pts if not p["composes"]]
    xb = (max(non) + min(comp)) / 2 if comp and non else float(np.median(xs))
    yb = data["min_effect"]
    x0, x1 = min(xs.min(), xb) - 0.02, max(xs.max(), xb) + 0.02
    y0, y1 = min(ys.min(), 0) - 0.05, max(ys.max(), yb) + 0.08
    opposite = bool(ys.min() < -yb) or any(p["effect_ci"][1] < -yb for p in pts)
    y0 = min(y0, -yb - 0.05) if opposite else y0
    for (c, u), name, colour in QUADRANTS:
        xa, xz = (xb, x1) if c else (x0, xb)
        ya, yz = (yb, y1) if u else ((-yb if opposite else y0), yb)
        ax.add_patch(plt.Rectangle((xa, ya), xz - xa, yz - ya, color=colour, zorder=0))
        ax.text((xa + xz) / 2, yz - 0.02, name, ha="center", va="top", fontsize=8, color="dimgray")
    if opposite:  # a band for effects against the claim's direction
        ax.add_patch(plt.Rectangle((x0, y0), x1 - x0, -yb - y0, color=OPPOSITE_COLOUR, zorder=0))
        ax.text((x0 + x1) / 2, y0 + 0.02, "used, opposite sign", ha="center", va="bottom", fontsize=8,
                color="dimgray")
    for p in pts:
        lo, hi = p["effect_ci"]
        colour = "tab:red" if p["claimed"] else "tab:blue"
        ax.errorbar(p["composition"], p["effect"], yerr=[[max(p["effect"] - lo, 0.0)], [max(hi - p["effect"], 0.0)]],
                    fmt="o" if p["claimed"] else ".", color=colour, markersize=6 if p["claimed"] else 4, capsize=2,
                    markerfacecolor="white" if p.get("untested") else colour)
        if p["claimed"]:
            ax.annotate(label(p["edge"]), (p["composition"], p["effect"]), textcoords="offset points",
                        xytext=(5, 5), fontsize=7)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_xlabel("composition score (weights)")
    ax.set_ylabel("edge effect, fraction of gap (use)")
    ax.set_title("Signature: weights propose, interventions decide")
    if any(p.get("untested") for p in pts):
        ax.text(0.01, 0.01, "hollow: untested (the patch changes nothing the receiver reads)",
                transform=ax.transAxes, fontsize=7, color="dimgray")
    return png(fig)


def render_all(ev: Evidence) -> dict[str, bytes]:
    """{file name: PNG bytes} for every figure this evidence supports."""
    fd = ev.figures_data or {}
    claimed = {e for c in ev.claims for e in registry.get(c.kind).claimed_edges(c)}
    out = {
        "attention.png": attention(fd.get("attention", [])),
        "composition.png": composition(fd.get("composition", {}), claimed),
        "effects.png": effects(ev.claims),
        "signature.png": signature(fd.get("signature", {})),
    }
    return {k: v for k, v in out.items() if v is not None}
