"""`harness explain EDGE MODEL`: what flows through one head -> head-input route
(mech.weights.explain): the composition score against its rotation null, C^2 split over the
singular directions of the product X Y with each share against the null, the principal
angles between what the sender writes and what the receiver reads, and the top
directions' token readouts; with `--out FIG.png`, the figure of a report's explain.png
for this route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tabulate import tabulate

from ..errors import OutputWriteError, UserError
from ..evidence import explain_text
from ..evidence.details import Explained
from ..evidence.format import fmt, fmt_ci, fmt_p
from ..mech.weights import scores
from ..mech.weights.explain import Explainer
from ..mech.weights.factored import Composition
from ..model.devices import of
from ..model.ref import load_model
from ..model.tokenizer import shown_tokenizer
from ..report import explain_figure
from ..report.figures import png
from ..report.text import plain
from ..spec import names


def check_figure_path(out: Path | None) -> None:
    """A new .png file in an existing folder (checked before any work)."""
    if out is None:
        return
    if out.suffix.lower() != ".png":
        raise UserError(f"--out {out}: the figure is a PNG file; give a name ending in .png")
    if out.exists():
        raise UserError(f"--out {out} exists; the figure is never written over a file")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: the folder {out.parent} does not exist")


def explain_route(model: str, edge_text: str, *, top: int = 3, draws: int = 1000, processing: str = "folded",
                  seed: int = 0, device: str | None = None, out: Path | None = None) -> tuple[str, Explained]:
    """(the text summary, the record) of one route; the figure written to `out` when given.
    A name that is not a head -> head-input edge, or lies outside the model, is a UserError."""
    edge = names.parse_edge(edge_text, names.HEAD_ROUTE)
    check_figure_path(out)
    m = load_model(model, device=device)
    names.check_in_model(edge, m.n_layers, m.n_heads, m.has_mlp)
    sender, receiver = edge.sender, edge.receiver
    if not isinstance(sender, names.Head) or not isinstance(receiver, names.HeadInput):  # parse_edge checked
        raise UserError(f"{edge} is not a head -> head-input edge")
    hw = scores.head_weights(m.bridge, processing)
    tok = shown_tokenizer(m)
    record = Explainer(hw, seed, tok.piece if tok is not None else None).record(sender, receiver, draws, top)
    score = Composition(hw, seed, of(m.bridge)).result(sender, receiver, draws)
    text = render(str(edge), model, record, score, null_dim=hw.null_dim, processing=processing, seed=seed)
    if out is not None:
        fig = explain_figure.draw_explain([(str(edge), record)])
        if fig is not None:
            try:
                out.write_bytes(png(fig, tight=False))
            except OSError as exc:  # checked before the work (report.folders.preflight_file); changed since
                raise OutputWriteError(f"{out}: cannot write the figure: {exc.strerror or exc}") from None
    return text, record


def render(edge: str, model: str, ex: Explained, score: scores.CompositionResult, *, null_dim: int,
           processing: str, seed: int) -> str:
    """The terminal text of one explained route."""
    sender, receiver = (part.strip() for part in edge.split("->"))
    lines = [f"{edge} in {plain(model)} (weights {processing}, null_dim {null_dim}, {ex.n_draws} null draws, "
             f"seed {seed})",
             f"C = {fmt(ex.score)}: rotation null of C mean {fmt(score.null_mean)}, 99th pct {fmt(score.null_q99)}, "
             f"p = {fmt_p(score.p_value)}; C² = {fmt(None if ex.score is None else ex.score ** 2, 4)} = "
             f"sum of (sigma_i / (||X|| ||Y||))² over the {ex.rank} nonzero directions of P = X Y", ""]
    rows: list[list[Any]] = []
    total = 0.0
    for d in ex.directions:
        total += d.share
        rows.append([d.index, fmt(ex.spectrum[d.index - 1], 4), fmt(d.share),
                     f"{fmt(d.null_share_mean)} {fmt_ci(d.null_share_ci)}", fmt(total), d.multiplicity])
    if rows:
        lines += [tabulate(rows, headers=["i", "sigma_i/(|X||Y|)", "share of C²", "null share [95%]", "cumulative",
                                          "equal"], disable_numparse=True),
                  f"direction 1's share: one-sided p = {fmt_p(ex.top_share_p)} against the null", ""]
    if ex.angles:
        shown = " ".join(f"{a:.1f}" for a in ex.angles)
        lines.append(f"principal angles between what {sender} writes and what {receiver} reads (degrees, smallest "
                     f"first): {shown}")
        first = explain_text.degrees_interval(ex.null_angles[0]) if ex.null_angles else "undefined"
        lines.append(f"  {ex.n_aligned} of {len(ex.angles)} below the null's 95% band of the same rank (the "
                     f"smallest's: {first})")
        lines.append("")
    lines += [plain(line) for line in explain_text.lines(ex, edge, plain, n=len(ex.directions))[1:]]
    return "\n".join(lines)
