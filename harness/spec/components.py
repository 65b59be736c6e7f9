"""The components of a model as values: heads, their inputs, MLPs, embed, logits, groups of
senders, edges and paths.  Frozen dataclasses whose `str()` is the one canonical spelling
(`L1H6`, `L1H6.k`, `L1.mlp`, `L0H1 + L0H3`, `L0H7 -> L1H5.k`); `spec.names` parses text into
them.  `layer_of` orders them in the forward pass.  Imports nothing of harness.
"""

from __future__ import annotations

from dataclasses import dataclass


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
Node = Head | Mlp | Embed  # what writes into the residual stream
Unit = Head | Mlp  # what an ablation or a circuit keeps or knocks out


@dataclass(frozen=True)
class Group:
    """Several senders patched together (`L0H1 + L0H3`): their output changes add up.
    Members are distinct, at least two, in forward order (`layer_of`, then name)."""

    members: tuple[Node, ...]

    def __str__(self) -> str:
        return " + ".join(str(m) for m in self.members)


Sender = Head | Mlp | Embed | Group
Receiver = HeadInput | Mlp | Logits


@dataclass(frozen=True)
class Edge:
    sender: Sender
    receiver: Receiver

    def __str__(self) -> str:
        return f"{self.sender} -> {self.receiver}"


@dataclass(frozen=True)
class Path:
    """`sender -> hop -> ... -> receiver`: the sender's change reaches each hop only through
    its listed input, and only the last hop's changed output enters the residual stream.
    `hops` ends with the receiver; a path with one hop is an edge (`as_edge`)."""

    sender: Sender
    hops: tuple[Receiver, ...]

    def __str__(self) -> str:
        return " -> ".join(str(n) for n in (self.sender, *self.hops))

    @property
    def as_edge(self) -> Edge | None:
        """The edge this path is when it has one hop, else None."""
        return Edge(self.sender, self.hops[0]) if len(self.hops) == 1 else None


def members(sender: Sender) -> tuple[Node, ...]:
    """The nodes a sender consists of (a group's members, or the sender itself)."""
    return sender.members if isinstance(sender, Group) else (sender,)


def layer_of(c: Component | Group) -> float:
    """Position of a component in the forward pass (embed -1, a layer's heads l, its MLP
    l + 0.5, logits +inf; a group: its latest member)."""
    if isinstance(c, Group):
        return max(layer_of(m) for m in c.members)
    if isinstance(c, Embed):
        return -1
    if isinstance(c, Logits):
        return float("inf")
    if isinstance(c, Head):
        return c.layer
    if isinstance(c, HeadInput):
        return c.head.layer
    return c.layer + 0.5  # an MLP reads after its layer's attention
