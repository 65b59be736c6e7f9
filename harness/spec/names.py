"""Component names: one spelling everywhere (files, reports, JSON, test ids).

Grammar (whitespace around `->` is optional, printed as ` -> `):

    head      := "L" layer "H" head            e.g. L1H6
    input     := head "." ("q" | "k" | "v")    e.g. L1H6.k
    node      := head | "embed" | "logits" | "L" layer ".mlp"
    edge      := sender " -> " receiver        sender: head | embed | L<n>.mlp
                                               receiver: input | logits | L<n>.mlp

`parse_component` / `parse_edge` return frozen dataclasses whose `str()` is the
canonical spelling, so `str(parse_x(s)) == s` for canonical `s`.
`check_in_model` rejects names outside a model's range and names the range.

This module is also the one place that spells TransformerLens hook names
(`hook_z(1) == "blocks.1.attn.hook_z"`, ...): code elsewhere calls these
functions instead of writing hook strings inline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ComponentNameError

_N = r"(0|[1-9]\d*)"  # no leading zeros: one spelling per component
_HEAD = re.compile(rf"^L{_N}H{_N}$")
_INPUT = re.compile(rf"^L{_N}H{_N}\.([qkv])$")
_MLP = re.compile(rf"^L{_N}\.mlp$")


@dataclass(frozen=True, order=True)
class Head:
    layer: int
    head: int

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"

    @staticmethod
    def every(n_layers: int, n_heads: int) -> list[Head]:
        """All heads of a model, layer by layer."""
        return [Head(layer, head) for layer in range(n_layers) for head in range(n_heads)]


@dataclass(frozen=True, order=True)
class HeadInput:
    """A head's query, key or value input (the receiving end of an edge)."""

    head: Head
    which: str  # "q" | "k" | "v"

    def __str__(self) -> str:
        return f"{self.head}.{self.which}"


@dataclass(frozen=True, order=True)
class Mlp:
    layer: int

    def __str__(self) -> str:
        return f"L{self.layer}.mlp"


@dataclass(frozen=True)
class Embed:
    def __str__(self) -> str:
        return "embed"


@dataclass(frozen=True)
class Logits:
    def __str__(self) -> str:
        return "logits"


Component = Head | HeadInput | Mlp | Embed | Logits
Sender = Head | Mlp | Embed
Receiver = HeadInput | Mlp | Logits


@dataclass(frozen=True)
class Edge:
    sender: Sender
    receiver: Receiver

    def __str__(self) -> str:
        return f"{self.sender} -> {self.receiver}"


_ALLOWED = "L<layer>H<head>, L<layer>H<head>.q/.k/.v, L<layer>.mlp, embed, logits"


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


def parse_head(text: str) -> Head:
    """Parse a name that must be a head (`L1H6`)."""
    c = parse_component(text)
    if not isinstance(c, Head):
        raise ComponentNameError(f"{text!r} is not a head; expected L<layer>H<head>, e.g. L1H6")
    return c


def parse_edge(text: str) -> Edge:
    """Parse `sender -> receiver` and check the edge goes forward in the model."""
    if not isinstance(text, str) or text.count("->") != 1:
        raise ComponentNameError(
            f"{text!r} is not an edge; expected 'sender -> receiver', e.g. 'L0H3 -> L1H6.k'"
        )
    if text != text.strip():
        raise ComponentNameError(f"{text!r} has spaces around the edge; write {text.strip()!r}")
    left, right = (part.strip() for part in text.split("->"))
    sender, receiver = parse_component(left), parse_component(right)
    if not isinstance(sender, (Head, Mlp, Embed)):
        raise ComponentNameError(f"edge sender {left!r} must be a head, an MLP or embed")
    if not isinstance(receiver, (HeadInput, Mlp, Logits)):
        hint = f" (did you mean {receiver}.q, .k or .v?)" if isinstance(receiver, Head) else ""
        raise ComponentNameError(
            f"edge receiver {right!r} must be a head input (.q/.k/.v), an MLP or logits{hint}"
        )
    if layer_of(sender) >= layer_of(receiver) and not (
        isinstance(sender, Head) and isinstance(receiver, Mlp) and sender.layer == receiver.layer
    ):
        raise ComponentNameError(f"edge {text!r} does not go forward: the sender must come earlier")
    return Edge(sender, receiver)


def is_head_route(e: Edge) -> bool:
    """A head -> head-input edge: the edges that have a composition score."""
    return isinstance(e.sender, Head) and isinstance(e.receiver, HeadInput)


def layer_of(c: Component) -> float:
    """Position of a component in the forward pass (embed -1, logits +inf)."""
    if isinstance(c, Embed):
        return -1
    if isinstance(c, Logits):
        return float("inf")
    if isinstance(c, Head):
        return c.layer
    if isinstance(c, HeadInput):
        return c.head.layer
    return c.layer + 0.5  # an MLP reads after its layer's attention


def check_in_model(c: Component | Edge, n_layers: int, n_heads: int, has_mlp: bool = False) -> None:
    """Raise ComponentNameError if `c` names something the model does not have."""
    if isinstance(c, Edge):
        check_in_model(c.sender, n_layers, n_heads, has_mlp)
        check_in_model(c.receiver, n_layers, n_heads, has_mlp)
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


# ---------------------------------------------------------------- hook names
HOOK_EMBED = "hook_embed"
HOOK_POS_EMBED = "hook_pos_embed"
QKV = ("q", "k", "v")


def hook_z(layer: int) -> str:
    """A layer's attention-weighted values, before W_O: [n, pos, head, d_head]."""
    return f"blocks.{layer}.attn.hook_z"


def hook_pattern(layer: int) -> str:
    """A layer's attention patterns: [n, head, query, key]."""
    return f"blocks.{layer}.attn.hook_pattern"


def hook_input(layer: int, which: str) -> str:
    """A layer's queries, keys or values (`which` in q, k, v): [n, pos, head, d_head]."""
    return f"blocks.{layer}.attn.hook_{which}"


def hook_resid_pre(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_pre"


def hook_resid_post(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


def hook_attn_out(layer: int) -> str:
    return f"blocks.{layer}.hook_attn_out"
