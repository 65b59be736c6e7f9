"""Component names: one spelling everywhere (files, reports, JSON, test ids).

Grammar (whitespace around `->` is optional, printed as ` -> `):

    head      := "L" layer "H" head            e.g. L1H6
    input     := head "." ("q" | "k" | "v")    e.g. L1H6.k
    node      := head | input | "embed" | "logits" | "L" layer ".mlp"
    sender    := head | "embed" | mlp | sender " + " sender    (a group: patched together)
    receiver  := input | mlp | "logits"                        (an MLP receives into its input)
    edge      := sender " -> " receiver
    path      := sender (" -> " hop)* " -> " receiver          hop: input | mlp

Every node of an edge or path comes later in the forward pass than the one before
it (`layer_of`: embed, then per layer its heads, then its MLP, then logits), so a
head of layer l may feed `Ll.mlp`, and an MLP of layer l feeds layer l + 1 on.

`parse_component` / `parse_edge` return frozen dataclasses whose `str()` is the
canonical spelling, so `str(parse_x(s)) == s` for canonical `s`.  Each field that
takes a name says what fits it (`Fits`: a head; an edge's sender or receiver; a
composition edge's ends); a bad name's error lists only that and suggests the
nearest name that fits (`nearest`: `LOH7` -> `L0H7`), inside the model's range
when a `Shape` is known.  `check_in_model` rejects names outside a model's range
and names the range.

The component types live in `spec.components` and the TransformerLens hook names in
`spec.hook_names` (the one place that spells them: `hook_z(1) == "blocks.1.attn.hook_z"`);
both are importable from here too, the names most code uses.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ComponentNameError
from .components import (
    Component,
    Edge,
    Embed,
    Group,
    Head,
    HeadInput,
    Logits,
    Mlp,
    Node,
    Path,
    Receiver,
    Sender,
    Unit,
    layer_of,
    members,
)
from .hook_names import (
    HOOK_EMBED,
    HOOK_POS_EMBED,
    QKV,
    hook_attn_out,
    hook_attn_sum,
    hook_input,
    hook_layer,
    hook_mlp_out,
    hook_pattern,
    hook_resid_mid,
    hook_resid_post,
    hook_resid_pre,
    hook_z,
    unit_hook,
)

__all__ = [  # the component types and hook names are re-exported: most code imports them from here
    "Component", "Edge", "Embed", "Group", "Head", "HeadInput", "Logits", "Mlp", "Node", "Path", "Receiver",
    "Sender", "Unit", "layer_of", "members", "HOOK_EMBED", "HOOK_POS_EMBED",
    "QKV", "hook_attn_out", "hook_attn_sum", "hook_input", "hook_layer", "hook_mlp_out", "hook_pattern",
    "hook_resid_mid", "hook_resid_post", "hook_resid_pre", "hook_z", "unit_hook", "EDGE_RULE", "MLP_NOTE",
    "Shape", "Fits", "HEAD", "SENDER", "RECEIVER", "UNIT_NODE", "HOP", "ROUTE_SENDER", "ROUTE_RECEIVER",
    "EdgeEnds", "EDGE", "HEAD_ROUTE", "parse_component", "parse_as", "parse_unit", "parse_head", "parse_edge",
    "parse_sender", "parse_path", "nearest", "edge_end_unsupported", "is_head_route", "check_in_model",
]

_N = r"(0|[1-9]\d*)"  # no leading zeros: one spelling per component
_HEAD = re.compile(rf"^L{_N}H{_N}$")
_INPUT = re.compile(rf"^L{_N}H{_N}\.([qkv])$")
_MLP = re.compile(rf"^L{_N}\.mlp$")


_ALLOWED = "L<layer>H<head>, L<layer>H<head>.q/.k/.v, L<layer>.mlp, embed, logits"
# What an edge connects; every message about edge ends (parsing, claims, patching) says this.
EDGE_RULE = ("an edge goes from a head, an MLP (L<layer>.mlp), embed, or a group of them joined by ' + ', to "
             "a later head's .q/.k/.v input, a later MLP (its input) or logits")
MLP_NOTE = "MLPs have no composition score (composition scores are defined between attention heads)"


@dataclass(frozen=True)
class Shape:
    """A model's size as far as component names go."""

    n_layers: int
    n_heads: int
    has_mlp: bool = False


@dataclass(frozen=True)
class Fits:
    """What a name field takes: the component types it accepts, what to call such a
    name (`noun`) and how to write one (`text`), for its error messages; `edge_end`: an
    end of an edge (an MLP there gets MLP_NOTE)."""

    types: tuple[type, ...]
    noun: str
    text: str
    edge_end: bool = False  # an end of a composition edge (an MLP there gets MLP_NOTE)

    def accepts(self, c: Component) -> bool:
        """Whether the field takes component `c`."""
        return isinstance(c, self.types)


HEAD = Fits((Head,), "a head", "a head L<layer>H<head>, e.g. L1H6")
SENDER = Fits((Head, Embed, Mlp), "an edge sender", "a head L<layer>H<head>, an MLP L<layer>.mlp or embed")
RECEIVER = Fits((HeadInput, Mlp, Logits), "an edge receiver",
                "a later head's input L<layer>H<head>.q/.k/.v, a later MLP L<layer>.mlp, or logits")
UNIT_NODE = Fits((Head, Mlp), "a head or an MLP", "a head L<layer>H<head> or an MLP L<layer>.mlp, e.g. L1H6 or L1.mlp")
HOP = Fits((HeadInput, Mlp), "a path hop", "a head's input L<layer>H<head>.q/.k/.v or an MLP L<layer>.mlp")
ROUTE_SENDER = Fits((Head,), "the sender of a composition edge", "a head L<layer>H<head>", edge_end=True)
ROUTE_RECEIVER = Fits((HeadInput,), "the receiver of a composition edge",
                      "a later head's input L<layer>H<head>.q/.k/.v", edge_end=True)


@dataclass(frozen=True)
class EdgeEnds:
    """What an edge field takes at each end."""

    sender: Fits
    receiver: Fits


EDGE = EdgeEnds(SENDER, RECEIVER)  # edge claims: what edge patching supports (EDGE_RULE)
HEAD_ROUTE = EdgeEnds(ROUTE_SENDER, ROUTE_RECEIVER)  # composition claims: weights compose between heads


def parse_component(text: str) -> Component:
    """Parse one component name; raise ComponentNameError saying what is allowed."""
    if not isinstance(text, str):
        raise ComponentNameError(f"expected a component name ({_ALLOWED}), got {text!r}")
    if text != text.strip():
        raise ComponentNameError(f"{text!r} has spaces around the name; write {text.strip()!r}")
    s = text
    if s == "embed":
        return Embed()
    if s == "logits":
        return Logits()
    if m := _HEAD.match(s):
        return Head(int(m[1]), int(m[2]))
    if m := _INPUT.match(s):
        return HeadInput(Head(int(m[1]), int(m[2])), m[3])
    if m := _MLP.match(s):
        return Mlp(int(m[1]))
    raise ComponentNameError(f"{text!r} is not a component name; allowed: {_ALLOWED}")


def parse_as(text: Any, fits: Fits, shape: Shape | None = None) -> Component:
    """Parse a name for a field that takes `fits` (and, with `shape`, only names inside
    that model).  A name that does not fit raises ComponentNameError saying what the
    field takes, with the nearest name that does when one is close
    (`'LOH7' is not a head; expected a head L<layer>H<head>, e.g. L1H6 (did you mean L0H7?)`)."""
    if not isinstance(text, str):
        raise ComponentNameError(f"expected {fits.text}, got {text!r}")
    if text != text.strip():
        raise ComponentNameError(f"{text!r} has spaces around the name; write {text.strip()!r}")
    try:
        c: Component | None = parse_component(text)
    except ComponentNameError:
        c = None
    if c is not None and fits.accepts(c):
        if shape is not None:
            check_in_model(c, shape.n_layers, shape.n_heads, shape.has_mlp)
        return c
    note = f"; {MLP_NOTE}" if isinstance(c, Mlp) and fits.edge_end else ""
    hint = nearest(text, fits, shape)
    raise ComponentNameError(f"{text!r} is not {fits.noun}; expected {fits.text}{note}"
                             + (f" (did you mean {hint}?)" if hint else ""))


def parse_unit(text: Any, shape: Shape | None = None) -> Head | Mlp:
    """Parse a name that must be a head or an MLP (ablation and circuit members); see parse_as."""
    c = parse_as(text, UNIT_NODE, shape)
    if not isinstance(c, (Head, Mlp)):  # unreachable: parse_as returns what UNIT_NODE accepts
        raise ComponentNameError(f"{text!r} is not a head or an MLP")
    return c


def parse_head(text: Any, shape: Shape | None = None) -> Head:
    """Parse a name that must be a head (`L1H6`); see parse_as."""
    c = parse_as(text, HEAD, shape)
    if not isinstance(c, Head):  # unreachable: parse_as returns what HEAD accepts
        raise ComponentNameError(f"{text!r} is not a head")
    return c


_ARROW = re.compile(r"\s*(?:-+\s*>|=+>|\u2192|\u27f6|>)\s*")  # ->, - >, =>, unicode arrows, a bare >


def parse_edge(text: Any, ends: EdgeEnds = EDGE, shape: Shape | None = None) -> Edge:
    """Parse `sender -> receiver` for a field that takes `ends` (default: an edge claim's,
    EDGE_RULE) and check the edge goes forward (and, with `shape`, lies inside the model).
    Errors say what fits each end and suggest the nearest name (parse_as)."""
    if not isinstance(text, str) or text.count("->") != 1:
        hint = _arrow_fix(text, ends, shape) if isinstance(text, str) else None
        raise ComponentNameError(
            f"{text!r} is not an edge; expected 'sender -> receiver', e.g. 'L0H3 -> L1H6.k'"
            + (f" (did you mean {hint!r}?)" if hint else "")
        )
    if text != text.strip():
        raise ComponentNameError(f"{text!r} has spaces around the edge; write {text.strip()!r}")
    left, right = (part.strip() for part in text.split("->"))
    sender = parse_sender(left, ends.sender)
    receiver = parse_as(right, ends.receiver)
    if not isinstance(receiver, (HeadInput, Mlp, Logits)):
        raise ComponentNameError(f"{text!r} is not an edge: {EDGE_RULE}")  # unreachable with the shipped ends
    if layer_of(sender) >= layer_of(receiver):
        raise ComponentNameError(f"edge {text!r} does not go forward: {_order(sender, receiver)}")
    edge = Edge(sender, receiver)
    if shape is not None:
        check_in_model(edge, shape.n_layers, shape.n_heads, shape.has_mlp)
    return edge


def parse_sender(text: str, fits: Fits = SENDER, shape: Shape | None = None) -> Sender:
    """One sender, or a group `A + B + ...` of distinct senders (where `fits` is an edge
    claim's SENDER; a composition edge's sender is one head)."""
    parts = [part.strip() for part in text.split("+")]
    if len(parts) == 1:
        node = parse_as(text, fits, shape)
        if not isinstance(node, (Head, Mlp, Embed)):  # unreachable: the shipped sender fits
            raise ComponentNameError(f"{text!r} is not {fits.noun}")
        return node
    if fits is not SENDER:
        raise ComponentNameError(f"{text!r}: {fits.noun} is a single name ({fits.text}), not a group")
    nodes: list[Node] = []
    for part in parts:
        node = parse_as(part, fits, shape)
        if not isinstance(node, (Head, Mlp, Embed)):  # unreachable: SENDER takes these
            raise ComponentNameError(f"{part!r} is not {fits.noun}")
        if node in nodes:
            raise ComponentNameError(f"{text!r} names {node} twice")
        nodes.append(node)
    return Group(tuple(sorted(nodes, key=lambda n: (layer_of(n), str(n)))))


def parse_path(text: Any, shape: Shape | None = None) -> Path:
    """Parse `sender -> hop -> ... -> receiver` (at least one `->`; hops are head inputs or
    MLPs, the last node any receiver), each node later in the forward pass than the one
    before it (and, with `shape`, inside the model)."""
    if not isinstance(text, str) or "->" not in text:
        raise ComponentNameError(f"{text!r} is not a path; expected 'sender -> hop -> ... -> receiver', "
                                 "e.g. 'L0H7 -> L1H5.k -> L2H3.q'")
    if text != text.strip():
        raise ComponentNameError(f"{text!r} has spaces around the path; write {text.strip()!r}")
    parts = [part.strip() for part in text.split("->")]
    sender = parse_sender(parts[0], SENDER, shape)
    hops: list[Receiver] = []
    for i, part in enumerate(parts[1:], start=1):
        node = parse_as(part, RECEIVER if i == len(parts) - 1 else HOP, shape)
        if not isinstance(node, (HeadInput, Mlp, Logits)):  # unreachable: RECEIVER and HOP take these
            raise ComponentNameError(f"{part!r} is not {RECEIVER.noun}")
        before = sender if i == 1 else hops[-1]
        if layer_of(before) >= layer_of(node):
            raise ComponentNameError(f"path {text!r} does not go forward at {before} -> {node}: "
                                     f"{_order(before, node)}")
        hops.append(node)
    return Path(sender, tuple(hops))


def _order(before: Sender | Receiver, after: Receiver) -> str:
    """Why `after` cannot read `before`, in words."""
    if isinstance(after, HeadInput):
        l = after.head.layer
        what = (f"the residual stream before layer {l}'s attention: embed" if l == 0 else
                f"the residual stream before layer {l}'s attention: embed and the heads and MLPs of layers "
                f"0..{l - 1}")
    elif isinstance(after, Mlp):
        l = after.layer
        what = (f"the residual stream after layer {l}'s attention: embed, the heads of layers 0..{l}"
                + (f" and the MLPs of layers 0..{l - 1}" if l > 0 else ""))
    else:
        what = "everything"
    return f"{after} reads {what}, not {before}"


def _arrow_fix(text: str, ends: EdgeEnds, shape: Shape | None) -> str | None:
    """`text` with its arrow written `->`, when that makes an edge that fits `ends`."""
    fixed = _ARROW.sub(" -> ", text.strip())
    if fixed == text or fixed.count("->") != 1:
        return None
    try:
        return str(parse_edge(fixed, ends, shape))
    except ComponentNameError:
        return None


# ---------------------------------------------------------------- did you mean
_DIGITS = str.maketrans("oil|", "0111")  # letters typed for digits: O for 0, l/I for 1
_NUM = r"([0-9oil|]+)"
_SEP = r"\s*[._:\-/ ]?\s*"
_LOOSE_HEAD = re.compile(rf"^(?:layer|l){_SEP}{_NUM}{_SEP}(?:head|h){_SEP}{_NUM}(?:{_SEP}([qkv]))?$")
_LOOSE_MLP = re.compile(rf"^(?:layer|l){_SEP}{_NUM}{_SEP}mlp$")


def _loose(text: str) -> Component | None:
    """What a misspelt name most likely means: case ignored, O/l/I read as digits,
    separators and leading zeros dropped (`LOH7`, `l0h7`, `L01H7`, `L0.H7` -> L0H7;
    `L0H7K` -> L0H7.k; `Embed` -> embed).  None when it does not look like a name."""
    s = text.strip().lower()
    if s in ("embed", "logits"):
        return Embed() if s == "embed" else Logits()
    if m := _LOOSE_HEAD.match(s):
        head = Head(int(m[1].translate(_DIGITS)), int(m[2].translate(_DIGITS)))
        return HeadInput(head, m[3]) if m[3] else head
    if m := _LOOSE_MLP.match(s):
        return Mlp(int(m[1].translate(_DIGITS)))
    return None


def _inside(c: Component, shape: Shape | None) -> bool:
    """Whether `c` is in a model of `shape` (always, when the shape is unknown)."""
    if shape is None:
        return True
    try:
        check_in_model(c, shape.n_layers, shape.n_heads, shape.has_mlp)
    except ComponentNameError:
        return False
    return True


def _fitting(c: Component, fits: Fits, shape: Shape | None) -> str | None:
    """`c`, or the closest thing to it, as a hint when it fits the field (and the model)."""
    if fits.accepts(c) and _inside(c, shape):
        return str(c)
    if isinstance(c, Head) and HeadInput in fits.types and _inside(c, shape):
        return f"{c}.q, .k or .v"
    if isinstance(c, HeadInput) and Head in fits.types and _inside(c.head, shape):
        return str(c.head)
    return None


def _vocabulary(fits: Fits, shape: Shape | None, text: str) -> list[str]:
    """Every name the field takes: inside `shape`, or (unknown model) up to the larger of
    12 and the numbers in `text`."""
    if shape is not None:
        n_layers, n_heads = shape.n_layers, shape.n_heads
    else:
        n_layers = n_heads = max([12] + [int(n) + 1 for n in re.findall(r"\d+", text)[:2] if len(n) < 4])
    heads = Head.every(n_layers, n_heads)
    out: list[Component] = [Embed(), Logits(), *heads, *(HeadInput(h, w) for h in heads for w in QKV)]
    return [str(c) for c in out if fits.accepts(c)]


def nearest(text: str, fits: Fits, shape: Shape | None = None) -> str | None:
    """The name the field takes that `text` most likely means, as a hint (`L0H7`, or
    `L1H5.q, .k or .v` for a head where an input is wanted); only names inside `shape`
    when it is known.  First the spelling is normalised (`_loose`); otherwise the one
    closest name by difflib's ratio (at least 0.7, and no tie).  None when nothing is close."""
    c = _loose(text)
    if c is not None:
        hint = _fitting(c, fits, shape)
        if hint is not None and hint != text:
            return hint
    scored = sorted(((difflib.SequenceMatcher(None, text.lower(), w.lower()).ratio(), w)
                     for w in _vocabulary(fits, shape, text)), reverse=True)
    if scored and scored[0][0] >= 0.7 and (len(scored) == 1 or scored[1][0] < scored[0][0]):
        return scored[0][1]
    return None


def edge_end_unsupported(c: Component | Group, end: str) -> str:
    """The message for patching an edge from (`end="from"`) or into (`"into"`) a
    component that is not an edge end (EDGE_RULE)."""
    return f"edge patching {end} {c} is not supported: {EDGE_RULE}"


def is_head_route(e: Edge) -> bool:
    """A head (or a group of heads) -> head-input edge: the edges that have a composition
    score (a group's is its members' combined write)."""
    return all(isinstance(m, Head) for m in members(e.sender)) and isinstance(e.receiver, HeadInput)


def check_in_model(c: Component | Group | Edge | Path, n_layers: int, n_heads: int, has_mlp: bool = False) -> None:
    """Raise ComponentNameError if `c` names something the model does not have."""
    if isinstance(c, (Edge, Path)):
        for node in (c.sender, c.receiver) if isinstance(c, Edge) else (c.sender, *c.hops):
            check_in_model(node, n_layers, n_heads, has_mlp)
        return
    if isinstance(c, Group):
        for m in c.members:
            check_in_model(m, n_layers, n_heads, has_mlp)
        return
    head = c.head if isinstance(c, HeadInput) else c
    rng = f"the model has layers 0..{n_layers - 1} and heads 0..{n_heads - 1}"
    if isinstance(head, Head):
        if not (0 <= head.layer < n_layers and 0 <= head.head < n_heads):
            raise ComponentNameError(f"{c} is not in the model: {rng}")
    elif isinstance(c, Mlp):
        if not has_mlp:
            raise ComponentNameError(f"{c} is not in the model: it is attention-only")
        if not 0 <= c.layer < n_layers:
            raise ComponentNameError(f"{c} is not in the model: {rng}")
