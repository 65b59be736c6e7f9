"""The starter circuit of a discovery drawn as nodes (figures/circuit.png).

Every node of the circuit is drawn: embed at the bottom, each layer's heads (by head index) and
MLP (left) on its row, the logits on top.  The circuit's edges are merged per pair of nodes (an
edge into L23H3.q, .k or .v ends at L23H3): one arrow per (sender, receiver node), its width the
sum of its edges' |score| relative to the largest, its colour the confirmation use of its
highest-|score| edge that was patched exactly (grey: none was).  Past NODE_ARROWS arrows only the
strongest are drawn and each layer says how many nodes no drawn arrow reaches; the whole edge
list is starter-edges.txt.
"""

from __future__ import annotations

from typing import Any

from .circuit_reading import node_of
from .figures import MAX_WIDTH_IN, label, literal, pyplot
from .style import VERDICT_COLOURS

USE_COLOURS = {"used": VERDICT_COLOURS["PASS"], "used (opposite sign)": "#7b3294", "unused": "#2c7bb6",
               "undetermined": VERDICT_COLOURS["INCONCLUSIVE"], "untested": "#aaaaaa"}
NOT_PATCHED = "#cccccc"
NODE_ARROWS = 200  # node-to-node arrows drawn at most (the strongest by summed |score|)


def node_xy(name: str, n_layers: int) -> tuple[float, float]:
    """(x, y) of a node: y the layer (embed at -1, logits at n_layers), x its head index (MLP left)."""
    if name == "embed":
        return 0.0, -1.0
    if name == "logits":
        return 0.0, float(n_layers)
    if name.endswith(".mlp"):
        return -1.5, int(name[1:name.index(".")]) + 0.5
    layer, head = name[1:].split("H")
    return float(head.split(".")[0]) + 1, float(layer)


def arrows(rows: list[dict[str, Any]], use: dict[str, str]) -> list[tuple[str, str, float, str | None]]:
    """(sender, receiver node, summed |score|, use of the strongest patched edge or None) per pair of
    nodes, the strongest first."""
    merged: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        src, dst = r["edge"].split(" -> ")
        w = abs(float(r["score"]))
        entry = merged.setdefault((src, node_of(dst)), [0.0, None, -1.0])
        entry[0] += w
        if r["edge"] in use and w > entry[2]:
            entry[1], entry[2] = use[r["edge"]], w
    out = [(src, dst, total, status) for (src, dst), (total, status, _) in merged.items()]
    return sorted(out, key=lambda a: -a[2])


@literal
def draw_circuit(doc: dict[str, Any], rows: list[dict[str, Any]]) -> Any | None:
    """The starter circuit `rows` (its ranking rows) as nodes and merged arrows (module docstring); a
    node's disc sized by its share of the circuit's attribution (report.circuit_reading)."""
    if not rows:
        return None
    share = {r["node"]: r["share"] for r in doc.get("starter_nodes") or []}
    use = {c["edge"]: c["use"] for c in doc["confirmed"]}
    every = {node_of(part) for r in rows for part in r["edge"].split(" -> ")}
    layers = max([int(n[1:].split("H")[0].split(".")[0]) for n in every if n.startswith("L")] + [0]) + 1
    pairs = arrows(rows, use)
    drawn = pairs[:NODE_ARROWS]
    strongest = drawn[0][2] if drawn and drawn[0][2] > 0 else 1.0
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(8.0, MAX_WIDTH_IN), 1.2 + 0.5 * (layers + 2)), layout="constrained")
    for src, dst, total, status in reversed(drawn):  # the strongest drawn last, on top
        (x0, y0), (x1, y1) = node_xy(src, layers), node_xy(dst, layers)
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "color": USE_COLOURS.get(status or "", NOT_PATCHED),
                                "lw": 0.5 + 2.5 * total / strongest, "shrinkA": 8, "shrinkB": 8})
    reached = {n for src, dst, _, _ in drawn for n in (src, dst)} if len(pairs) > NODE_ARROWS else every
    for n in every:
        x, y = node_xy(n, layers)
        ax.scatter([x], [y], s=30 + 900 * share.get(n, 0.0), color="#9ecae1", alpha=0.6, zorder=1, lw=0)
        ax.annotate(n, (x, y), ha="center", va="center", fontsize=6, zorder=2, alpha=1.0 if n in reached else 0.5,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "#444444", "lw": 0.5})
    xs = [node_xy(n, layers)[0] for n in every]
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.set_ylim(-1.6, layers + 0.6)
    ax.set_yticks(range(-1, layers + 1), ["embed", *[f"layer {i}" for i in range(layers)], "logits"],
                  fontsize=8 if layers <= 12 else 5)
    ax.set_xticks([])
    handles = [plt.Line2D([], [], color=c, lw=1.4, label=u) for u, c in USE_COLOURS.items()]
    handles.append(plt.Line2D([], [], color=NOT_PATCHED, lw=0.8, label="not patched"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    shown = (f"as {len(pairs)} node-to-node arrows" if len(pairs) <= NODE_ARROWS
             else f"the strongest {NODE_ARROWS} of {len(pairs)} node-to-node arrows (faded: no arrow drawn)")
    ax.set_title(label(f"the circuit: {len(every)} nodes, {len(rows)} edges {shown}", 100) + "\n"
                 + label(f"width: summed |score|; disc: share of the attribution; colour: exact patching of "
                         f"the top {doc['settings']['top']}", 100), fontsize=8)
    return fig
