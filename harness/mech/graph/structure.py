"""The edge graph of a model: every sender, every receiver, every edge between them.

Senders write into the residual stream, receivers read from it (names.Edge spells an
edge).  In forward order:

    senders    embed; per layer l: its heads L<l>H<h>, then its MLP L<l>.mlp (when it has one)
    receivers  per layer l: each head's inputs L<l>H<h>.q, .k, .v, then the MLP's input L<l>.mlp;
               last, logits

An edge u -> v exists when v reads the residual stream after u has written into it:

    into a head input of layer l   embed, the heads and MLPs of layers < l
    into MLP l                     embed, the heads of layers <= l (< l with parallel blocks,
                                   where the MLP reads the block's input), the MLPs of layers < l
    into logits                    every sender

A model with H heads, L layers and MLPs has 1 + L (H + 1) senders and L (3H + 1) + 1
receivers (GPT-2 small: 157 and 445, 32,491 edges).  Edges are counted by class
(`counts`): the kind of sender (embed, head, mlp) and of receiver (q, k, v, mlp, logits).

Edge sets are boolean masks [senders, receivers] (`mask`), so that an edge circuit, a top-k
circuit or the complement of one edge is one array; `edges_of(mask)` reads one back.
This module is numpy-only: it builds no model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...model import architecture
from ...model.bridge import Bridge
from ...spec import names

SENDER_KINDS = ("embed", "head", "mlp")
RECEIVER_KINDS = ("q", "k", "v", "mlp", "logits")


def sender_kind(node: names.Node) -> str:
    return "embed" if isinstance(node, names.Embed) else "head" if isinstance(node, names.Head) else "mlp"


def receiver_kind(r: names.Receiver) -> str:
    return r.which if isinstance(r, names.HeadInput) else "mlp" if isinstance(r, names.Mlp) else "logits"


@dataclass(frozen=True)
class Graph:
    """Senders, receivers and the adjacency of a model's edge graph (module docstring)."""

    n_layers: int
    n_heads: int
    has_mlp: bool
    parallel: bool = False
    senders: tuple[names.Node, ...] = field(init=False)
    receivers: tuple[names.Receiver, ...] = field(init=False)
    adjacency: np.ndarray = field(init=False, repr=False, compare=False)  # [U, V] bool: the edge exists
    _s_index: dict[names.Node, int] = field(init=False, repr=False, compare=False)
    _r_index: dict[names.Receiver, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        L, H = self.n_layers, self.n_heads
        senders: list[names.Node] = [names.Embed()]
        receivers: list[names.Receiver] = []
        for layer in range(L):
            heads = [names.Head(layer, h) for h in range(H)]
            receivers += [names.HeadInput(h, w) for h in heads for w in names.QKV]
            senders += heads
            if self.has_mlp:
                receivers.append(names.Mlp(layer))
                senders.append(names.Mlp(layer))
        receivers.append(names.Logits())
        adj = np.zeros((len(senders), len(receivers)), dtype=bool)
        for j, r in enumerate(receivers):
            for i, u in enumerate(senders):
                adj[i, j] = self._precedes(u, r)
        object.__setattr__(self, "senders", tuple(senders))
        object.__setattr__(self, "receivers", tuple(receivers))
        object.__setattr__(self, "adjacency", adj)
        object.__setattr__(self, "_s_index", {u: i for i, u in enumerate(senders)})
        object.__setattr__(self, "_r_index", {r: j for j, r in enumerate(receivers)})

    def _precedes(self, u: names.Node, r: names.Receiver) -> bool:
        if isinstance(r, names.Logits) or isinstance(u, names.Embed):
            return True
        lu = u.layer
        if isinstance(r, names.HeadInput):
            return lu < r.head.layer
        if isinstance(u, names.Mlp):
            return lu < r.layer
        return lu < r.layer or (lu == r.layer and not self.parallel)

    @classmethod
    def of(cls, bridge: Bridge) -> Graph:
        """The graph of a loaded model (its architecture decides MLPs and parallel blocks)."""
        arch = architecture.of(bridge)
        return cls(arch.n_layers, arch.n_heads, arch.has_mlp, arch.parallel)

    # ------------------------------------------------------------ indices
    @property
    def n_edges(self) -> int:
        return int(self.adjacency.sum())

    def sender_index(self, node: names.Node) -> int:
        try:
            return self._s_index[node]
        except KeyError:
            raise ValueError(f"{node} is not a sender of this model") from None

    def receiver_index(self, r: names.Receiver) -> int:
        try:
            return self._r_index[r]
        except KeyError:
            raise ValueError(f"{r} is not a receiver of this model") from None

    def edges(self) -> list[names.Edge]:
        """Every edge, receiver-major (receivers in forward order, then senders in forward order)."""
        return self.edges_of(self.adjacency)

    def edge_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(sender indices, receiver indices) of `edges()`, in that order."""
        rs, us = np.nonzero(self.adjacency.T)
        return us, rs

    def has(self, edge: names.Edge) -> bool:
        """Whether `edge` (one sender, no group) is an edge of this graph."""
        if isinstance(edge.sender, names.Group):
            return False
        try:
            return bool(self.adjacency[self.sender_index(edge.sender), self.receiver_index(edge.receiver)])
        except ValueError:
            return False

    def mask(self, edges: Iterable[names.Edge]) -> np.ndarray:
        """[U, V] bool: True at each of `edges` (ValueError for an edge the graph does not have)."""
        out = np.zeros(self.adjacency.shape, dtype=bool)
        for e in edges:
            if not self.has(e):
                raise ValueError(f"{e} is not an edge of this model's graph")
            out[self.sender_index(e.sender), self.receiver_index(e.receiver)] = True  # type: ignore[arg-type]
        return out

    def full(self) -> np.ndarray:
        """Every edge kept."""
        return self.adjacency.copy()

    def edges_of(self, mask: np.ndarray) -> list[names.Edge]:
        """The edges a mask holds (receiver-major order)."""
        rs, us = np.nonzero((mask & self.adjacency).T)  # receiver-major
        return [names.Edge(self.senders[u], self.receivers[r]) for r, u in zip(rs, us)]

    def node_mask(self, nodes: Sequence[names.Node]) -> np.ndarray:
        """The edges among `nodes` (heads and MLPs), from embed and to logits: the edge circuit
        a node circuit of `nodes` is (claims.circuit)."""
        keep_s = np.zeros(len(self.senders), dtype=bool)
        keep_r = np.zeros(len(self.receivers), dtype=bool)
        keep_s[0] = True  # embed
        keep_r[-1] = True  # logits
        wanted = set(nodes)
        for i, u in enumerate(self.senders):
            keep_s[i] |= u in wanted
        for j, r in enumerate(self.receivers):
            owner = r.head if isinstance(r, names.HeadInput) else r
            keep_r[j] |= owner in wanted
        return self.adjacency & keep_s[:, None] & keep_r[None, :]

    # ------------------------------------------------------------ classes
    def counts(self, mask: np.ndarray | None = None) -> dict[str, dict[str, int]]:
        """{sender kind: {receiver kind: edges}} of the whole graph, or of `mask`."""
        m = self.adjacency if mask is None else mask & self.adjacency
        out = {s: dict.fromkeys(RECEIVER_KINDS, 0) for s in SENDER_KINDS}
        sk = [sender_kind(u) for u in self.senders]
        rk = [receiver_kind(r) for r in self.receivers]
        for i, j in zip(*np.nonzero(m)):
            out[sk[i]][rk[j]] += 1
        return out

    def receiver_layer(self, j: int) -> int:
        """The layer a receiver reads in (n_layers for logits)."""
        r = self.receivers[j]
        if isinstance(r, names.HeadInput):
            return r.head.layer
        return r.layer if isinstance(r, names.Mlp) else self.n_layers

    def layer_receivers(self, layer: int) -> tuple[slice, int | None]:
        """(the slice of layer `layer`'s head inputs, the index of its MLP input or None) in `receivers`."""
        per = 3 * self.n_heads + (1 if self.has_mlp else 0)
        start = layer * per
        heads = slice(start, start + 3 * self.n_heads)
        return heads, (start + 3 * self.n_heads if self.has_mlp else None)

    def senders_before(self, layer: int) -> int:
        """How many senders precede layer `layer`'s heads (embed and every node of layers < layer)."""
        return 1 + layer * (self.n_heads + (1 if self.has_mlp else 0))
