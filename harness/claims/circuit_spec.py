"""The `circuit` claim's schema and its details (claims.circuit has the kind: what it measures and
how it is judged)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, model_validator

from ..evidence.details import CI, Details, Num, Record, Sensitivity, Summary, optional
from ..spec import names
from ..spec.fields import BoundedCausalClaim, CircuitEdgeList, UnitList
from ..spec.settings import Strict
from ..spec.vocabulary import Ablation
from . import effects


class Equivalence(Strict):
    """The circuit scores like the model prompt by prompt (Shi et al. 2024): the share of prompts
    on which the circuit beats the model is 1/2 within `tolerance`."""

    tolerance: float = Field(0.1, gt=0.0, lt=0.5)


class Independence(Strict):
    """The model's score tells nothing about what the rest does once the circuit is removed
    (Shi et al. 2024): an HSIC permutation test between the two per-prompt scores."""

    permutations: int = Field(1000, ge=100, le=100_000)


class Minimality(Strict):
    """Every member is needed (Shi et al. 2024): knocking it out of the circuit matters more than
    knocking out a random filler added to it, at least `quantile` of the time."""

    fillers: int = Field(100, ge=20, le=10_000)  # random fillers drawn (the reference)
    quantile: float = Field(0.9, gt=0.0, lt=1.0)


class Completeness(Strict):
    """Removing a set K of the circuit's members hurts the circuit as it hurts the model (Wang et
    al. 2022): |F(C minus K) - F(M minus K)| at most `tolerance` for every K searched."""

    tolerance: float = Field(0.1, gt=0.0)
    random: int = Field(20, ge=0, le=10_000)  # random subsets K of the members
    greedy: int = Field(3, ge=0, le=100)  # steps of the greedy search (each tries every member left)
    # named sets K: members (edge circuits: edges, or nodes standing for their circuit edges)
    sets: list[Annotated[list[str], Field(min_length=1)]] = Field(default_factory=list)


class Criteria(Strict):
    """The criteria a circuit claim states beyond its faithfulness bound (claims.circuit_criteria)."""

    equivalence: Equivalence | None = None
    independence: Independence | None = None
    completeness: Completeness | None = None
    minimality: Minimality | None = None

    @model_validator(mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        """`[equivalence, minimality]` is short for each named criterion with its defaults."""
        if isinstance(value, list):
            unknown = [v for v in value if v not in CRITERIA]
            if unknown:
                raise ValueError(f"unknown criterion {unknown[0]!r}; allowed: {', '.join(CRITERIA)}")
            return {v: {} for v in value}
        return value

    def stated(self) -> list[str]:
        return [c for c in CRITERIA if getattr(self, c) is not None]


CRITERIA = ("equivalence", "independence", "completeness", "minimality")


class MemberTest(Record):
    """Minimality of one member: its knockout effect |F(C) - F(C minus v)| against the fillers'."""

    member: str
    knockout: float  # F(C) - F(C minus v)
    beaten: int  # fillers whose knockout effect it exceeds
    p_unneeded: float  # BH-adjusted: it beats fewer than `quantile` of the fillers
    p_needed: float  # BH-adjusted: it beats more than `quantile` of them
    status: str  # needed / unneeded / undetermined


class SetTest(Record):
    """Completeness of one set K: incompleteness F(C minus K) - F(M minus K) and its interval."""

    members: list[str]
    how: str  # named / searched (the search's worst set, tested on the held-out prompts)
    incompleteness: Num
    ci: CI | None = optional()
    n_prompts: int


class CriterionResult(Record):
    """One criterion's test on a circuit (claims.circuit_criteria)."""

    verdict: str  # PASS / FAIL / INCONCLUSIVE
    statistic: Num  # equivalence: share of prompts the circuit beats the model; independence: HSIC;
    # completeness: the largest |incompleteness| found; minimality: the smallest share of fillers a member beats
    p_value: Num = optional()  # of the violation (equivalence: non-equivalence; independence: dependence)
    rule: str
    circuits: int  # circuits run for this test (each one forward over the prompts)
    members: list[MemberTest] | None = optional()  # minimality: one per member
    sets: list[SetTest] | None = optional()  # completeness: the sets K tested
    ci: CI | None = optional()  # equivalence: the share's interval at 1 - 2 alpha


class CircuitClaim(BoundedCausalClaim):
    """Keeping only these heads (or these edges) recovers at least (or at most) a fraction of the behaviour."""

    kind: Literal["circuit"]
    heads: UnitList | None = None  # heads and MLPs (L1.mlp): a node circuit
    edges: CircuitEdgeList | None = None  # an edge circuit
    edges_from: str | None = None  # the file the edges were read from (hypothesis.references)
    top: int | None = Field(None, ge=1)  # with edges_from: its first `top` edges
    ablation: Ablation = Ablation.RESAMPLE
    random_circuits: int = Field(100, ge=20, le=100_000)  # the most random circuits drawn
    beat_rate: float = Field(0.5, ge=0.0, lt=1.0)
    sensitivity: StrictBool = False
    criteria: Criteria | None = None  # equivalence, independence, completeness, minimality

    @model_validator(mode="after")
    def _one_set(self) -> CircuitClaim:
        if (self.heads is None) == (self.edges is None):
            raise ValueError("give exactly one of heads (a node circuit) / edges (an edge circuit), or edges_from "
                             "(a file of edges)")
        if self.top is not None and self.edges_from is None:
            raise ValueError("top keeps the first edges of an edges_from file; give edges_from")
        if self.criteria is not None and self.criteria.completeness is not None and self.edges is not None:
            for k in self.criteria.completeness.sets:  # node circuits: checked with the parsed heads below
                for name in k:
                    edge_set(self, name)
        elif self.criteria is not None and self.criteria.completeness is not None:
            for k in self.criteria.completeness.sets:
                for name in k:
                    unit_of(self, name)
        return self

    @property
    def size(self) -> int:
        return len(self.heads if self.heads is not None else self.edges or [])


class CircuitDetails(Details):
    heads: list[str]  # the heads (and MLPs) kept; of an edge circuit, the nodes its edges join
    ablation: str
    full_metric_mean: float
    circuit_metric_mean: float
    empty_metric_mean: float
    n_prompts: int
    random_circuits: int  # random circuits drawn (0: no comparison)
    beat_rate: float
    confidence: float
    n_excluded_small_gap: int
    gap_mean: float  # of m_full - m_empty over all prompts
    kept_gap_mean: Num
    faithfulness: Num = optional()
    faithfulness_ci: CI | None = optional()
    faithfulness_summary: Summary | None = optional()
    faithfulness_ci_method: str | None = optional()
    random_faithfulness_summary: Summary | None = optional()
    random_faithfulness_max: Num = optional()
    beaten: int | None = optional()
    binomial_p_value: Num = optional()  # documents before version 5: the fixed-N binomial test
    beat_p_value: Num = optional()  # the sequential test's anytime-valid p-value (stats.sequential_beat_test)
    beat_decision: str | None = optional()  # more / not more / undecided
    random_draws_max: int | None = optional()  # the claim's random_circuits
    random_draw: str | None = optional()  # how random circuits are drawn
    alpha: float | None = optional()
    corruption: str | None = optional()
    intervention_change: effects.InterventionChange | None = optional()  # of the heads (senders) outside the circuit
    sensitivity: Sensitivity | None = optional()  # faithfulness under each ablation type (bound only)
    edges: list[str] | None = optional()  # an edge circuit's edges
    graph_edges: int | None = optional()  # edges of the model's graph (edge circuits)
    edge_classes: dict[str, dict[str, int]] | None = optional()  # the kept edges by sender and receiver kind
    criteria: dict[str, CriterionResult] | None = optional()  # each stated criterion's test
    bound_verdict: str | None = optional()  # with criteria: the verdict of the bound and random circuits alone


def unit_of(claim: CircuitClaim, name: str) -> names.Unit:
    """The member of a node circuit a completeness set names (ValueError when it is not one)."""
    try:
        unit = names.parse_unit(name)
    except ValueError as exc:
        raise ValueError(f"completeness set member {name!r}: {exc}") from None
    if unit not in (claim.heads or []):
        raise ValueError(f"completeness set member {name!r} is not in the circuit's heads")
    return unit


def edge_set(claim: CircuitClaim, name: str) -> list[names.Edge]:
    """The edges of an edge circuit a completeness set's entry names: one of its edges, or a
    node (a head or MLP): every circuit edge it sends or receives (ValueError when none)."""
    edges = claim.edges or []
    if "->" in name:
        try:
            edge = names.parse_edge(name, names.EDGE)
        except ValueError as exc:
            raise ValueError(f"completeness set member {name!r}: {exc}") from None
        if edge not in edges:
            raise ValueError(f"completeness set member {name!r} is not one of the circuit's edges")
        return [edge]
    try:
        unit = names.parse_unit(name)
    except ValueError as exc:
        raise ValueError(f"completeness set member {name!r}: give an edge of the circuit or a node ({exc})") from None
    found = [e for e in edges if touches(e, unit)]
    if not found:
        raise ValueError(f"completeness set member {name!r}: no edge of the circuit starts or ends at it")
    return found


def touches(edge: names.Edge, unit: names.Unit) -> bool:
    """Whether `edge` starts at `unit` or ends at one of its inputs."""
    receiver = edge.receiver.head if isinstance(edge.receiver, names.HeadInput) else edge.receiver
    return unit in names.members(edge.sender) or receiver == unit
