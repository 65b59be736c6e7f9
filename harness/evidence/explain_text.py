"""What flows through a route, in words: the lines the report (under a composition claim
and under the weights-vs-use table) and `harness explain` print from an `Explained`
record (mech.weights.explain).  Token texts come from the model's tokenizer, so they pass
through `esc` (md_text in Markdown, plain on a terminal)."""

from __future__ import annotations

from collections.abc import Callable

from ..spec import names
from .details import Explained, ExplainedDirection, TokenLoad
from .format import fmt, fmt_ci, fmt_p

Escape = Callable[[object], str]


def _same(x: object) -> str:
    return str(x)


def token(t: TokenLoad, esc: Escape = _same) -> str:
    """`17`, or `17 " Mary"` when the model has a tokenizer."""
    return f"{t.token}" if t.text is None else f'{t.token} "{esc(t.text)}"'


def tokens(loads: list[TokenLoad], esc: Escape = _same, n: int = 5) -> str:
    return ", ".join(token(t, esc) for t in loads[:n])


def _degrees(x: float | None) -> str:
    return "undefined" if x is None else f"{x:.1f}°"


def summary(ex: Explained, n: int = 3) -> str:
    """One line: the top directions' shares against the null and the aligned angles."""
    if not ex.directions:
        return (f"no direction carries anything: the product is zero ({len(ex.angles)} principal angle(s), "
                f"smallest {_degrees(ex.angles[0] if ex.angles else None)})")
    shares = ", ".join(f"{d.index}: {fmt(d.share)} (null {fmt(d.null_share_mean)} {fmt_ci(d.null_share_ci)})"
                       for d in ex.directions[:n])
    carried = sum(d.share for d in ex.directions[:n])
    angle = ""
    if ex.angles and ex.null_angles:
        angle = (f"; {ex.n_aligned} of {len(ex.angles)} principal angles below the null (smallest "
                 f"{_degrees(ex.angles[0])}, null {degrees_interval(ex.null_angles[0])})")
    top = (f"; the top {min(n, len(ex.directions))} of {ex.rank} carry {fmt(carried)}" if len(ex.directions) > 1
           else f" of {ex.rank}")
    return (f"share of C² per direction (null mean [95%]): {shares}{top}; direction 1's share p = "
            f"{fmt_p(ex.top_share_p)}{angle}")


def degrees_interval(ci: list[float | None]) -> str:
    return f"[{_degrees(ci[0])}, {_degrees(ci[1])}]"


DIRECT_DEPTH = 1  # layers a readout may skip and still be shown: token readouts read the direct path only


def readout_depths(sender: str, receiver: str, n_layers: int | None) -> tuple[int, int | None]:
    """(the layers before the sender, which the embedding-side readouts skip; the layers after the
    receiver, which `promotes` skips, None when the model's depth is not recorded)."""
    u, v = names.parse_head(sender), names.parse_edge(f"{sender} -> {receiver}").receiver
    v_layer = v.head.layer if isinstance(v, names.HeadInput) else (n_layers or 1) - 1  # explained routes end at a head
    return u.layer, None if n_layers is None else n_layers - 1 - v_layer


def direction(d: ExplainedDirection, sender: str, receiver: str, esc: Escape = _same,
              n_layers: int | None = None) -> str:
    """One direction: what the sender reads and writes, and what the receiver's other side
    reads (.q/.k) or promotes (.v), in tokens.  Token readouts read the direct path (the
    embeddings, the unembedding): those that would skip more than DIRECT_DEPTH layers are left
    out (`left_out` says so once for the route), since they say nothing about what a deep route
    carries."""
    head = receiver.split(".")[0]
    side = {"k": "queries", "q": "keys"}.get(receiver.rsplit(".", 1)[-1], "")
    before, after = readout_depths(sender, receiver, n_layers)
    text = f"direction {d.index} (share {fmt(d.share)})"
    if before <= DIRECT_DEPTH:
        pos = "" if d.positional_share is None else f"; positional share {fmt(d.positional_share, 2)}"
        text += (f": {sender} reads tokens {tokens(d.sender_reads, esc)}{pos}; "
                 f"its write points this way most for tokens {tokens(d.sender_writes, esc)}")
        if d.receiver_reads is not None:
            match = "" if d.token_match is None else f", token match {fmt(d.token_match, 2)}"
            text += f"; {head}'s {side} read tokens {tokens(d.receiver_reads, esc)}{match}"
    if d.promotes is not None and (after is None or after <= DIRECT_DEPTH):
        text += f"; {head} promotes tokens {tokens(d.promotes, esc)}"
    if d.multiplicity > 1:
        text += (f" (one of {d.multiplicity} equal singular values: any rotation among them is as valid, "
                 "these readouts show one)")
    return text


def left_out(ex: Explained, sender: str, receiver: str) -> str | None:
    """What the route's token readouts leave out, said once for all its directions (None: nothing)."""
    head = receiver.split(".")[0]
    before, after = readout_depths(sender, receiver, ex.n_layers)
    parts = []
    if before > DIRECT_DEPTH:
        parts.append(f"the token readouts of the embeddings are left out ({sender} sits {before} layers after them, "
                     "and the readouts would skip what those layers do)")
    if after is not None and after > DIRECT_DEPTH and any(d.promotes is not None for d in ex.directions):
        parts.append(f"what {head} promotes is left out ({after} layers lie between it and the logits)")
    return "; ".join(parts) if parts else None


def lines(ex: Explained, edge: str, esc: Escape = _same, n: int = 3) -> list[str]:
    """The summary, what the readouts leave out (once), then one line per shown direction."""
    sender, receiver = (part.strip() for part in edge.split("->"))
    note = left_out(ex, sender, receiver)
    return ([summary(ex, n)] + ([note[0].upper() + note[1:] + "."] if note else [])
            + [direction(d, sender, receiver, esc, ex.n_layers) for d in ex.directions[:n]])
