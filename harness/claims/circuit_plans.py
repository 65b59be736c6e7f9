"""The two kinds of circuit a `circuit` claim states, as plans of what to run (claims.circuit):
a node circuit (units kept; every other head, and MLP when it names one, ablated) and an edge
circuit (edges kept; every other edge of the graph carries its replacement), each with its
random circuits of the same size, and the sequential test of the claimed circuit against them."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from math import comb, prod
from typing import NamedTuple, cast

import numpy as np

from .. import stats
from ..errors import UnsupportedError
from ..mech.graph.structure import Graph
from ..mech.runs.cached import Runs
from ..progress import stage
from ..spec import names
from ..spec.settings import Stats
from .circuit_spec import CircuitClaim, edge_set, unit_of


class Variant(NamedTuple):
    """A circuit derived from the claim's: the model's (`from_model`) or the circuit's members,
    less `removed`, plus `added` (members: units of a node circuit, (sender, receiver) indices of
    an edge circuit)."""

    from_model: bool
    removed: frozenset[Hashable]
    added: frozenset[Hashable]


@dataclass(frozen=True)
class RandomComparison:
    """What the random circuits showed: their faithfulness and the sequential test."""

    faithfulness: np.ndarray
    test: stats.BeatTest
    how: str


class NodeCircuit:
    """Variants are the units ablated; the random circuits: as many units drawn uniformly."""

    def __init__(self, claim: CircuitClaim, runs: Runs):
        self.runs, self.claim = runs, claim
        self.every = pool(claim, runs.n_layers, runs.n_heads)
        keep = set(claim.heads or [])
        self.rest = [h for h in self.every if h not in keep]
        self.how = f"{claim.size} of the {len(self.every)} {'heads and MLPs' if with_mlps(claim) else 'heads'}, " \
                   "uniformly"

    def base(self, kind: str, drop: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(m_full, m_circuit, m_empty)."""
        m_c, m_e = self.runs.ablated_many([self.rest, self.every], kind, [drop, drop])
        return self.runs.m_clean, m_c, m_e

    def can_draw(self) -> bool:
        return comb(len(self.every), self.claim.size) > 1

    def random(self, rng: np.random.Generator, n: int, kind: str) -> list[np.ndarray]:
        claimed = sorted(self.every.index(h) for h in self.claim.heads or [])
        complements = []
        for _ in range(n):
            pick = claimed
            while pick == claimed:
                pick = sorted(rng.choice(len(self.every), size=self.claim.size, replace=False).tolist())
            chosen = set(pick)
            complements.append([h for j, h in enumerate(self.every) if j not in chosen])
        return self.runs.ablated_many(complements, kind)

    def outside(self) -> list[names.Unit]:
        return self.rest

    def items(self) -> list[Hashable]:
        return list(self.claim.heads or [])

    def label(self, item: Hashable) -> str:
        return str(item)

    def fillers(self) -> list[Hashable]:
        return list(self.rest)

    def search_units(self) -> list[tuple[str, frozenset[Hashable]]]:
        return [(str(h), frozenset([h])) for h in self.claim.heads or []]

    def named_set(self, entries: Sequence[str]) -> frozenset[Hashable]:
        return frozenset(unit_of(self.claim, name) for name in entries)

    def variants(self, specs: Sequence[Variant], kind: str) -> list[np.ndarray]:
        """The metric of each variant: every unit of the pool outside it ablated."""
        members = set(self.claim.heads or [])
        ablated = []
        for v in specs:
            kept = ((set(self.every) if v.from_model else members) - v.removed) | v.added
            ablated.append([h for h in self.every if h not in kept])
        return self.runs.ablated_many(ablated, kind)


class EdgeCircuit:
    """Variants are edge masks; the random circuits: as many edges into each receiver as the claimed
    circuit has, drawn uniformly among that receiver's senders."""

    def __init__(self, claim: CircuitClaim, runs: Runs):
        self.runs, self.claim = runs, claim
        self.graph: Graph = runs.graph_model().graph
        try:
            self.mask = self.graph.mask(claim.edges or [])
        except ValueError as exc:
            raise UnsupportedError(f"claim {claim.id!r}: {exc} (its receiver reads the residual stream before the "
                                   "sender writes to it)") from None
        self.per_receiver = self.mask.sum(0)
        self.how = f"{claim.size} edges, as many into each receiver as the circuit has, uniformly among its senders"

    def base(self, kind: str, drop: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g = self.graph
        m_f, m_c, m_e = self.runs.edge_circuits([g.full(), self.mask, np.zeros_like(self.mask)], kind, drop)
        return m_f, m_c, m_e

    def can_draw(self) -> bool:
        adj = self.graph.adjacency
        return prod(comb(int(adj[:, j].sum()), int(c)) for j, c in enumerate(self.per_receiver) if c) > 1

    def random(self, rng: np.random.Generator, n: int, kind: str) -> list[np.ndarray]:
        adj = self.graph.adjacency
        pools = [(j, np.nonzero(adj[:, j])[0], int(self.per_receiver[j])) for j in np.nonzero(self.per_receiver)[0]]
        masks = []
        for _ in range(n):
            while True:
                m = np.zeros_like(self.mask)
                for j, senders, count in pools:  # each receiver's senders found once, not per draw
                    m[rng.choice(senders, size=count, replace=False), j] = True
                if not np.array_equal(m, self.mask):
                    break
            masks.append(m)
        return self.runs.edge_circuits(masks, kind)

    def outside(self) -> list[names.Unit]:
        """The heads and MLPs some of whose edges are removed (embed's change is not an ablation)."""
        removed = (self.graph.adjacency & ~self.mask).any(1)
        return [u for u, r in zip(self.graph.senders, removed) if r and isinstance(u, (names.Head, names.Mlp))]

    def items(self) -> list[Hashable]:
        return [(int(i), int(j)) for i, j in zip(*np.nonzero(self.mask.T)[::-1])]  # receiver-major

    def label(self, item: Hashable) -> str:
        i, j = pair(item)
        return str(names.Edge(self.graph.senders[i], self.graph.receivers[j]))

    def fillers(self) -> list[Hashable]:
        """Edges outside the circuit from a live sender (embed, or a node some circuit edge enters)
        into a receiver the circuit reads (the logits, or an input of a node some circuit edge leaves)."""
        g = self.graph
        fed = {owner(g.receivers[j]) for j in np.nonzero(self.mask.any(0))[0]}
        sending = {g.senders[i] for i in np.nonzero(self.mask.any(1))[0]}
        live = np.array([isinstance(u, names.Embed) or u in fed for u in g.senders])
        read = np.array([isinstance(r, names.Logits) or owner(r) in sending for r in g.receivers])
        pool = g.adjacency & ~self.mask & live[:, None] & read[None, :]
        return [(int(i), int(j)) for i, j in zip(*np.nonzero(pool.T)[::-1])]

    def search_units(self) -> list[tuple[str, frozenset[Hashable]]]:
        """The circuit's edges grouped by sender."""
        groups: dict[int, set[Hashable]] = {}
        for i, j in map(pair, self.items()):
            groups.setdefault(i, set()).add((i, j))
        return [(str(self.graph.senders[i]), frozenset(groups[i])) for i in sorted(groups)]

    def named_set(self, entries: Sequence[str]) -> frozenset[Hashable]:
        g = self.graph
        return frozenset((g.sender_index(e.sender), g.receiver_index(e.receiver))  # type: ignore[arg-type]
                         for name in entries for e in edge_set(self.claim, name))

    def variants(self, specs: Sequence[Variant], kind: str) -> list[np.ndarray]:
        """The metric of each variant's edge mask (every other edge carrying its replacement)."""
        masks = []
        for v in specs:
            m = (self.graph.adjacency if v.from_model else self.mask).copy()
            for i, j in map(pair, v.removed):
                m[i, j] = False
            for i, j in map(pair, v.added):
                m[i, j] = True
            masks.append(m)
        return self.runs.edge_circuits(masks, kind)


Plan = NodeCircuit | EdgeCircuit


def random_faithfulness_test(plan: Plan, claim: CircuitClaim, m_empty: np.ndarray, gap: np.ndarray,
                             kept: np.ndarray, f_claimed: float, seed: int, st: Stats) -> RandomComparison | None:
    """Random circuits of the claim's size drawn in rounds until the sequential test decides
    (stats.sequential_beat_test); None when no other circuit of that size exists."""
    if not plan.can_draw():
        return None
    rng = np.random.default_rng(seed)
    found: list[float] = []

    def draw(n: int) -> list[bool]:
        ms = plan.random(rng, n, claim.ablation)
        fs = [float(stats.ratio_of_means((m - m_empty)[kept], gap[kept])) for m in ms]
        found.extend(fs)
        return [f < f_claimed for f in fs]

    test = stats.sequential_beat_test(draw, claim.random_circuits, claim.beat_rate, st.alpha)
    stage(f"random circuits ({claim.id}): {test.drawn} of at most {claim.random_circuits} drawn (sequential test: "
          f"{test.decision})")
    return RandomComparison(np.asarray(found), test, plan.how)


def pair(item: Hashable) -> tuple[int, int]:
    """An edge circuit's member: (sender index, receiver index) in its graph."""
    return cast(tuple[int, int], item)


def owner(r: names.Receiver) -> names.Node | names.Receiver:
    """The node a receiver is an input of (a head's q/k/v: the head)."""
    return r.head if isinstance(r, names.HeadInput) else r


def with_mlps(claim: CircuitClaim) -> bool:
    """Whether a node circuit is drawn from heads and MLPs: when it names an MLP (a circuit of
    heads alone keeps every MLP)."""
    return any(isinstance(h, names.Mlp) for h in claim.heads or [])


def pool(claim: CircuitClaim, n_layers: int, n_heads: int) -> list[names.Unit]:
    """What a node circuit keeps or ablates: every head, and every MLP when it names one."""
    heads: list[names.Unit] = list(names.Head.every(n_layers, n_heads))
    return heads + ([names.Mlp(layer) for layer in range(n_layers)] if with_mlps(claim) else [])


def nodes_of(edges: Sequence[names.Edge]) -> list[str]:
    """The heads and MLPs an edge circuit's edges join, in forward order."""
    found: set[names.Unit] = set()
    for e in edges:
        for n in (*names.members(e.sender), e.receiver):
            owner = n.head if isinstance(n, names.HeadInput) else n
            if isinstance(owner, (names.Head, names.Mlp)):
                found.add(owner)
    return [str(u) for u in sorted(found, key=lambda u: (names.layer_of(u), str(u)))]
