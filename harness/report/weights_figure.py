"""`harness weights --out`: composition.png, one heatmap panel per mode.

Rows are the sender heads (layers 0 .. L-2), columns the receiving head inputs (layers
1 .. L-1); one colour scale for every panel (the smallest C to the largest, the isotropic
baseline 1/sqrt(null_dim) marked on the colour bar); cells that are not a cross-layer
pair (sender layer >= receiver layer) are hatched, pairs with no route (C undefined) grey;
cells that compose (BH-adjusted p < alpha and C at least min_ratio x the median of the other
senders into that input) carry a dot; layer boundaries are drawn.  Axes are labelled per head
up to figures.TICKS_MAX rows, per layer beyond; no cell prints its number, so the figure
stays readable at GPT-2-small's 132 x 132.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..mech.weights.table import WeightsTables
from .figures import MAX_WIDTH_IN, TICKS_MAX, literal, png, pyplot

CMAP = "Blues"
SIGNIFICANT = "#e8590c"  # orange dots: visible on light and dark blue
NO_ROUTE = "#8c8c8c"
NOT_A_PAIR = "#cccccc"  # hatching of the blocks with sender layer >= receiver layer


def grid(t: WeightsTables, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """(C [(L-1) H, (L-1) H] with NaN off the pairs and where no route, composes [same, bool]: the
    rotation null rejected and the pair standing out among its peers, mech.weights.scores.composes)."""
    L, H, m = t.n_layers, t.n_heads, t.modes[mode]
    c = m.scores[: L - 1, :, 1:, :].reshape((L - 1) * H, (L - 1) * H)
    return c, t.composes_grid(mode)[: L - 1, :, 1:, :].reshape(c.shape)


def _pair_mask(t: WeightsTables) -> np.ndarray:
    """True where (row, column) is a cross-layer pair (sender layer < receiver layer)."""
    L, H = t.n_layers, t.n_heads
    s = np.repeat(np.arange(L - 1), H)
    r = np.repeat(np.arange(1, L), H)
    return s[:, None] < r[None, :]


def _ticks(ax: Any, t: WeightsTables, axis: str, first_layer: int) -> None:
    L, H = t.n_layers, t.n_heads
    n = (L - 1) * H
    set_ticks, set_labels = (ax.set_yticks, ax.set_yticklabels) if axis == "y" else (ax.set_xticks,
                                                                                       ax.set_xticklabels)
    if n <= TICKS_MAX:
        set_ticks(range(n))
        set_labels([f"L{first_layer + i // H}H{i % H}" for i in range(n)], fontsize=6 if n > 16 else 7)
    else:
        set_ticks([i * H + (H - 1) / 2 for i in range(L - 1)])
        set_labels([f"L{first_layer + i}" for i in range(L - 1)], fontsize=8)
    if axis == "x":
        ax.tick_params(axis="x", labelrotation=90)


@literal
def draw_composition(t: WeightsTables) -> Any:
    """The figure: one panel per mode of `t`, side by side, and a shared colour bar."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    L, H = t.n_layers, t.n_heads
    n = (L - 1) * H
    modes = list(t.modes)
    panel = float(np.clip(0.055 * n, 2.6, 7.0))  # inches: ~5 px a cell at 132 x 132
    plt = pyplot()
    fig = plt.figure(figsize=(max(panel * len(modes) + 1.2, min(MAX_WIDTH_IN, 6.0)), panel + 1.1),
                     layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(modes), squeeze=False)).ravel()
    pairs = _pair_mask(t)
    defined = [v[~np.isnan(v)] for v in (grid(t, m)[0][pairs] for m in modes)]
    defined = [v for v in defined if v.size]
    vmin = min([float(v.min()) for v in defined] or [0.0])  # one scale, from the smallest C to the largest
    vmax = max([float(v.max()) for v in defined] or [1.0])
    vmin, vmax = min(vmin, t.baseline), max(vmax, t.baseline, vmin + 1e-6)
    cmap = plt.get_cmap(CMAP).with_extremes(bad="white")
    im = None
    for ax, mode in zip(axes, modes, strict=True):
        c, sig = grid(t, mode)
        im = ax.imshow(np.ma.masked_invalid(np.where(pairs, c, np.nan)), cmap=cmap, vmin=vmin, vmax=vmax,
                       interpolation="nearest", aspect="equal")
        no_route = pairs & np.isnan(c)
        if no_route.any():
            ax.imshow(np.ma.masked_where(~no_route, np.ones_like(c)), cmap=ListedColormap([NO_ROUTE]),
                      interpolation="nearest", aspect="equal")
        rows, cols = np.nonzero(sig & pairs)
        if rows.size:
            cell_pt = panel * 72 / n
            dot = max(0.35 * cell_pt, min(2.5, 0.7 * cell_pt))  # points: at least 2.5 where the cells allow
            ax.scatter(cols, rows, s=dot ** 2, c=SIGNIFICANT, marker="o", linewidths=0,
                       label="composes")
        for l1 in range(1, L - 1):  # sender layer >= receiver layer: no pair
            for l2 in range(1, l1 + 1):
                ax.add_patch(Rectangle(((l2 - 1) * H - 0.5, l1 * H - 0.5), H, H, facecolor="white",
                                       edgecolor=NOT_A_PAIR, hatch="///", lw=0))
        for b in range(1, L - 1):
            ax.axhline(b * H - 0.5, color="0.3", lw=0.6)
            ax.axvline(b * H - 0.5, color="0.3", lw=0.6)
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylim(n - 0.5, -0.5)
        _ticks(ax, t, "y", 0)
        _ticks(ax, t, "x", 1)
        n_sig = int(np.nansum(t.modes[mode].p_adj < t.alpha))
        ax.set_title(f"{mode.upper()}-composition\n{int(np.sum(sig & pairs))} of {int(pairs.sum())} compose "
                     f"({n_sig} significant)", fontsize=9)
        ax.set_xlabel(f"receiver .{mode}", fontsize=8)
        ax.set_ylabel("sender (OV)", fontsize=8)
    if im is not None:
        bar = fig.colorbar(im, ax=list(axes), shrink=0.8, label="C")
        bar.ax.axhline(t.baseline, color=SIGNIFICANT, lw=2)
    fig.suptitle(f"Composition scores, weights {t.processing}; isotropic baseline 1/sqrt({t.null_dim}) = "
                 f"{t.baseline:.3f} (the line on the colour bar)\ndots: compose (rotation-null p_adj < {t.alpha:g} "
                 f"and C >= {t.min_ratio:g} x the other senders' median)\nhatched: not a cross-layer pair", fontsize=9)
    return fig


def composition_png(t: WeightsTables) -> bytes:
    """composition.png's bytes."""
    return png(draw_composition(t), tight=False)
