"""The claim-kind protocol.

A claim kind is one module that defines a schema (a `ClaimSpec` subclass), a
typed details model (a `Details` subclass) and a `ClaimKind` subclass saying

* `hooks(claim, n_layers)`: the activations it needs cached in the clean and
  corrupted base runs;
* `needs_weights(claim)`: whether it reads the head weights (`Context.weights`);
* `interventions(claim, n_layers, n_heads)`: the intervention paths it uses,
  which the identity sanity check runs with a run's own activations;
* `measure(claims, ctx)`: the results of all of the file's claims of this kind
  at once (so a kind can correct its own p-values for multiple testing), as an
  immutable `Measured` (the results, and the weights-vs-use rows the kind adds);
* `ladder(claim, result)`: the steps the claim puts on the evidence ladder;
* `shown_heads(claim)`, `edges(claim)`, `pass_region(claim, result)`: what the
  report's figures draw for it (computed at run time and kept in evidence.json);
* `view`: how a result reads in a report (claims.view.ClaimView: its detail lines, the
  number in the claim table, the lines of sweep plots), from what evidence.json holds alone.

Registering an instance (`claims.registry.register`) is all it takes for the schema, the
runner, evidence.json, sweeps, the reports and the pytest plugin to handle it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from ..evidence.details import Details, Explained, PassRegion, Sensitivity, WeightsVsUseRow
from ..evidence.result import ClaimResult
from ..evidence.verdicts import EvidenceType, Verdict
from ..mech.edges.paths import Route
from ..mech.runs.cached import Runs
from ..mech.weights.explain import Explainer
from ..mech.weights.factored import Composition
from ..mech.weights.scores import HeadWeights, head_weights
from ..model.devices import of
from ..model.tokenizer import bridge_tokenizer
from ..spec import names
from ..spec.fields import BoundedClaim, ClaimSpec
from ..spec.settings import Stats
from ..spec.vocabulary import Direction, LadderStatus, Rung
from ..streams import Stream, derive_seed
from .view import ClaimView
from .view import details as typed_details

S = TypeVar("S", bound=ClaimSpec)
D = TypeVar("D", bound=Details)


# ---------------------------------------------------------------- intervention paths
@dataclass(frozen=True)
class HeadAblationPath:
    """Heads (and MLPs) ablated on the clean prompts (checked with resample-ablation
    from the clean run itself)."""

    heads: tuple[names.Unit, ...]


@dataclass(frozen=True)
class EdgePatchPath:
    """An edge (or a path) patched in one direction (checked with its base run as both
    base and source), with every attention pattern frozen or not."""

    edge: Route
    direction: str
    freeze_patterns: bool = False
    corruption: str | None = None  # the corrupted run a denoising patch starts from (None: the default)

    @property
    def label(self) -> str:
        where = f", {self.corruption}" if self.direction == Direction.DENOISING and self.corruption else ""
        return f"edge {self.edge} ({self.direction}{where}{', frozen patterns' if self.freeze_patterns else ''})"


@dataclass(frozen=True)
class FrozenPatternsPath:
    """Every attention pattern held at the clean run's values."""


@dataclass(frozen=True)
class EdgeCircuitPath:
    """Edge circuits (mech.graph.forward): checked with every edge removed and the clean run's own
    writes as the replacement, which must give the clean run."""


InterventionPath = HeadAblationPath | EdgePatchPath | FrozenPatternsPath | EdgeCircuitPath


# ---------------------------------------------------------------- the evidence ladder
@dataclass(frozen=True)
class LadderEntry:
    """Evidence a claim gives on one rung of a mechanism's ladder (engine.ladder)."""

    mechanism: str  # "L0H7", "L1H0+L1H1", "L0H7 -> L1H5.k"
    type: str  # head, heads or edge
    rung: Rung
    status: LadderStatus
    note: str = ""
    corruption: str | None = None  # for robustness across corruptions


def verdict_status(result: ClaimResult) -> LadderStatus:
    """A claim's step on the evidence ladder reads its verdict first: the ladder is of the mechanism
    as the file states it, so a PASS supports it and a FAIL is against it whatever the claim's
    direction (`at_most`, `expect: unused` and `at_least` alike); an INCONCLUSIVE claim is
    inconclusive.  A FAILed claim never reads as support."""
    if result.verdict == Verdict.PASS:
        return LadderStatus.SUPPORTS
    if result.verdict == Verdict.FAIL:
        return LadderStatus.AGAINST
    return LadderStatus.INCONCLUSIVE


def sensitivity_entry(mechanism: str, type_: str, sens: Sensitivity | None) -> list[LadderEntry]:
    """The robustness rung from a sensitivity run, over the types that reach a verdict (PASS
    or FAIL; INCONCLUSIVE types, untested or undefined, do not count): `against` when they
    disagree; `supports` when at least two PASS; nothing when they agree on FAIL (the lower
    rung is then robustly against); `inconclusive` when fewer than two decide."""
    if sens is None:
        return []
    cells = ", ".join(f"{k} {v.verdict}" for k, v in sens.by_type.items())
    decided = [v.verdict for v in sens.by_type.values() if v.verdict != Verdict.INCONCLUSIVE]
    if len(set(decided)) > 1:
        return [LadderEntry(mechanism, type_, Rung.ROBUSTNESS, LadderStatus.AGAINST,
                            f"the verdict depends on the type: {cells}")]
    if len(decided) > 1:
        return ([LadderEntry(mechanism, type_, Rung.ROBUSTNESS, LadderStatus.SUPPORTS,
                             f"the same verdict under {cells}")] if decided[0] == Verdict.PASS else [])
    return [LadderEntry(mechanism, type_, Rung.ROBUSTNESS, LadderStatus.INCONCLUSIVE,
                        f"fewer than two types decide: {cells}")]


def heads_mechanism(heads: Sequence[names.Unit]) -> tuple[str, str]:
    """(mechanism, type) of one head (or MLP) or a set of them."""
    return ("+".join(str(h) for h in heads), "head" if len(heads) == 1 else "heads")


# ---------------------------------------------------------------- what measure() gets
@dataclass
class Context:
    """Everything a kind's `measure` reads: the base runs, the file's settings,
    and lazily the head weights (read once, shared by the kinds)."""

    runs: Runs  # with the default corruption
    stats: Stats
    seed: int
    unit: str  # of the metric: nats or logits
    processing: str  # weight processing for weight evidence: folded or raw
    baseline: float | None = None  # the metric of a guess with no information (claims.effects)
    metric: str = "logprob"  # the file's metric (model.metrics)
    _weights: HeadWeights | None = None
    _composition: Composition | None = None
    _explainer: Explainer | None = None
    _composition_kept: dict[str, Any] = field(default_factory=dict)  # Composition.without_weights
    _explainer_kept: dict[str, Any] = field(default_factory=dict)  # Explainer.without_weights

    def let_go_of_weights(self) -> None:
        """Forget the head weights and what holds them (made again, with the same numbers, on next use):
        a stage that reads no weights need not hold them (float64 copies, about 4 d_model^2 x 8 bytes a
        layer, and as much again in composition cores).  The composition's scores, spectra and null
        draws, and the explanations made, are kept: the next composition and explainer start from them."""
        if self._composition is not None:
            self._composition_kept = self._composition.without_weights()
        if self._explainer is not None:
            self._explainer_kept = self._explainer.without_weights()
        self._weights = self._composition = self._explainer = None

    def let_go_of_cores(self) -> None:
        """Forget the composition (its cores: 2 to 4 L H d r float64 numbers), keeping what it computed
        without them and the head weights: what follows a composition test (the explanations, the
        patching) reads no cores; a later composition starts from what was kept."""
        if self._composition is not None:
            self._composition_kept = self._composition.without_weights()
            self._composition = None

    def adopt(self, kept: dict[str, Any]) -> None:
        """Start this context's composition from `kept`: what a Composition on the head weights of the
        same model and processing, with this context's seed, computed (its `without_weights()`)."""
        self._composition_kept = kept

    def runs_for(self, corruption: str | None) -> Runs:
        """The base runs with the claim's corruption (None: the data's default)."""
        return self.runs.with_corruption(corruption)

    def weights(self) -> HeadWeights:
        """The head weights (mech.weights.scores.HeadWeights), read once per run."""
        if self._weights is None:
            self._weights = head_weights(self.runs.bridge, self.processing)
        return self._weights

    def composition(self) -> Composition:
        """Composition scores and the shared rotation null on those weights (mech.weights.factored),
        computed once per run and read by claims, the weights-vs-use table and the figures."""
        if self._composition is None:
            self._composition = Composition(self.weights(), self.seed, of(self.runs.bridge),
                                            **self._composition_kept)
        return self._composition

    def explainer(self) -> Explainer:
        """What flows through head routes (mech.weights.explain) on the same weights, token texts from
        the model's tokenizer when it has one; made once per run."""
        if self._explainer is None:
            tok = bridge_tokenizer(self.runs.bridge, "the model")
            self._explainer = Explainer(self.weights(), self.seed, tok.piece if tok is not None else None,
                                        **self._explainer_kept)
        return self._explainer

    def explained(self, edge: names.Edge) -> Explained | None:
        """`explainer().record` of a head -> head-input edge (`stats.null_draws` null draws);
        None for a group of senders or an MLP end."""
        if not isinstance(edge.sender, names.Head) or not isinstance(edge.receiver, names.HeadInput):
            return None
        return self.explainer().record(edge.sender, edge.receiver, self.stats.null_draws)

    def claim_seed(self, index: int) -> int:
        """The seed of claim `index` (its position in the file): Stream.CLAIM."""
        return derive_seed(self.seed, Stream.CLAIM, index)


Indexed = tuple[int, S]  # (position in the file, claim)


@dataclass(frozen=True)
class Measured:
    """What a kind's `measure` found: each claim's result by its position in the file, and the
    rows the kind adds to the weights-vs-use table (edge claims)."""

    results: Mapping[int, ClaimResult]
    weights_vs_use: tuple[WeightsVsUseRow, ...] = ()


# ---------------------------------------------------------------- the protocol
class ClaimKind(ABC, Generic[S, D]):
    """Base class of a claim kind; subclasses set the class attributes and `measure`."""

    name: ClassVar[str]  # the `kind:` value in files and evidence.json
    spec: type[S]  # the schema of one claim
    details: type[D]  # the typed details of one result
    evidence: ClassVar[EvidenceType]  # weights, observational, attribution (an estimate) or causal
    summary: ClassVar[str] = ""  # one line for docs and `--help` texts
    view: ClassVar[ClaimView] = ClaimView()  # how its results read in a report (claims.view)

    def matches(self, raw: dict[str, Any]) -> bool:
        """Whether a claim mapping from a file is of this kind (aliases override this)."""
        return raw.get("kind") == self.name

    def hooks(self, claim: S, n_layers: int) -> list[str]:
        """The hooks the claim reads from the base runs' caches."""
        return []

    def corrupted_hooks(self, claim: S, n_layers: int) -> list[str]:
        """The hooks the claim reads from a corrupted run's cache (the others are cached in the clean
        run only): by default all of `hooks`."""
        return self.hooks(claim, n_layers)

    def needs_weights(self, claim: S) -> bool:
        return False

    def reads_gap(self, claim: S) -> bool:
        """Whether the claim's number is normalised by the clean-corrupted gap (the gap sanity check
        applies to the file only when some claim does)."""
        return False

    def uses_means(self, claim: S) -> bool:
        """Whether the claim replaces activations with means over reference prompts (mean ablation,
        mean replacement, or a sensitivity run that tries them)."""
        return False

    def interventions(self, claim: S, n_layers: int, n_heads: int) -> list[InterventionPath]:
        return []

    @abstractmethod
    def measure(self, claims: Sequence[Indexed[S]], ctx: Context) -> Measured:
        """The result of each claim, keyed by its position in the file (and any weights-vs-use rows)."""

    def pass_region(self, claim: S, result: ClaimResult) -> PassRegion | None:
        """Where the claim's number must lie for PASS (the effects figure shades it).
        Default: a bounded claim's `at_least` / `at_most`; None for other claims."""
        if not isinstance(claim, BoundedClaim):
            return None
        if claim.at_least is not None:
            return PassRegion(low=claim.at_least, high=None, text=f"at least {claim.at_least:g}")
        return PassRegion(low=None, high=claim.bound, text=f"at most {claim.bound:g}")

    def shown_heads(self, claim: S) -> list[names.Head]:
        """Heads whose attention pattern the report draws for this claim."""
        return []

    def edges(self, claim: S) -> list[names.Edge]:
        """Edges the claim names (the composition and signature figures mark them)."""
        return []

    def ladder(self, claim: S, result: ClaimResult) -> list[LadderEntry]:
        """The claim's evidence on the ladders of the mechanisms it names (engine.ladder)."""
        return []

    # helpers for subclasses
    def details_of(self, result: ClaimResult) -> D:
        """The result's details, as this kind's type (claims.view.details)."""
        return typed_details(result, self.details)

    def result(self, claim: S, *, expectation: str, verdict: Verdict, value: float | None,
               ci: list[float] | None, unit: str, rule: str, details: Details,
               per_prompt: list[float] | None = None, reason: str = "") -> ClaimResult:
        """A ClaimResult of this kind for `claim`, with its pass region (`reason`: why the verdict,
        in one line, when the rule is longer than that)."""
        r = ClaimResult(id=claim.id, kind=self.name, expectation=expectation, verdict=verdict, value=value,
                        ci=ci, unit=unit, rule=rule, details=details, evidence=self.evidence,
                        description=claim.description, per_prompt=per_prompt, reason=reason)
        return replace(r, pass_region=self.pass_region(claim, r))


def with_details(result: ClaimResult, **updates: Any) -> ClaimResult:
    """A copy of `result` whose details have `updates` (e.g. a sensitivity run measured after it)."""
    return replace(result, details=result.details.model_copy(update=updates))


def component_names(claim: ClaimSpec) -> Iterator[tuple[str, names.Component | names.Edge]]:
    """(field, parsed name) for every component or edge a claim names."""
    for key in type(claim).model_fields:
        value = getattr(claim, key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, (names.Head, names.HeadInput, names.Mlp, names.Embed, names.Logits, names.Edge)):
                yield key, item
