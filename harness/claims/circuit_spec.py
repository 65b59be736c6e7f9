"""The `circuit` claim's schema and its details (claims.circuit has the kind: what it measures and
how it is judged)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from ..evidence.details import CI, Details, Num, Sensitivity, Summary, optional
from ..spec.fields import BoundedCausalClaim, CircuitEdgeList, UnitList
from ..spec.vocabulary import Ablation
from . import effects


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

    @model_validator(mode="after")
    def _one_set(self) -> CircuitClaim:
        if (self.heads is None) == (self.edges is None):
            raise ValueError("give exactly one of heads (a node circuit) / edges (an edge circuit), or edges_from "
                             "(a file of edges)")
        if self.top is not None and self.edges_from is None:
            raise ValueError("top keeps the first edges of an edges_from file; give edges_from")
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
