"""The report's attention figure (attention.png): each head a claim shows, its attention
pattern averaged over the clean prompts (figures_data.attention, engine.figure_data), with a
label per position where there is room for one."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..evidence.result import Evidence
from .figures import DPI, MAX_WIDTH_IN, label, literal, new_figure, png

MAX_PANELS = 12  # heads drawn in attention.png
LABELLED_POSITIONS = 48  # positions up to which the attention figure names every token
LABEL_PX = 11  # room a position's label needs (6-point text)


@literal
def draw_attention(data: list[dict[str, Any]]) -> Any | None:
    """Each head's attention pattern averaged over the clean prompts (documents before the mean was
    kept: the first prompt's), with a label per position where there are few enough (the first
    prompt's tokens, the template's slot occurrences, `*` on the scored positions)."""
    data = data[:MAX_PANELS]
    if not data:
        return None
    mean = all("mean_pattern" in item for item in data)
    size = len(data[0]["mean_pattern" if mean else "pattern"])
    cols = min(len(data), 3)
    panel = min(2.5 + 0.09 * size, (MAX_WIDTH_IN - 1.0) / cols)
    # a label per position where each gets room for its text, else numbered positions
    labelled = (all(item.get("labels") for item in data) and size <= LABELLED_POSITIONS
                and panel * DPI / size >= LABEL_PX)
    if not labelled:
        cols, panel = min(len(data), 4), 2.5
    rows = -(-len(data) // cols)
    plt, fig = new_figure(panel * cols + 1.0, (panel + 0.05) * rows + 0.5)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    im = None
    for k, ax in enumerate(axes):
        if k >= len(data):
            ax.set_visible(False)
            continue
        item = data[k]
        im = ax.imshow(np.asarray(item["mean_pattern" if mean else "pattern"], dtype=float), cmap="Blues", vmin=0,
                       vmax=1)
        ax.set_title(label(item["head"], 24), fontsize=10)
        ax.tick_params(labelsize=8)
        if labelled:
            names_ = [label(x, 18) for x in item["labels"]]
            ax.set_xticks(range(len(names_)), names_, fontsize=6, rotation=90)
            ax.set_yticks(range(len(names_)), names_, fontsize=6)
        if k % cols == 0:
            ax.set_ylabel("query position", fontsize=9)
        if k // cols == rows - 1 or k + cols >= len(data):
            ax.set_xlabel("key position", fontsize=9)
    fig.colorbar(im, ax=axes[:len(data)].tolist(), shrink=0.85, label="attention weight")
    prompts = data[0].get("prompts")
    fig.suptitle(f"Attention patterns, mean over {prompts} clean prompts" if mean else
                 "Attention patterns on the first clean prompt", fontsize=11)
    return fig


def render(ev: Evidence) -> dict[str, bytes]:
    """{"attention.png": PNG bytes} when a claim shows a head, else {}."""
    fig = draw_attention((ev.figures_data or {}).get("attention", []))
    return {} if fig is None else {"attention.png": png(fig, tight=False)}
