"""The words of the hypothesis format and of the evidence: every enumeration, defined
once as a string enum (each member *is* its spelling, so it compares equal to the text
a file or a document holds) and imported by the schema, the mechanisms and the reports.
Members carry what they mean where code needs it (a replacement's source of values,
the run a direction patches); the tuples beside them are their spellings, in order,
for messages ("allowed: ...")."""

from __future__ import annotations

from enum import StrEnum


class AttentionRole(StrEnum):
    PREVIOUS_TOKEN = "previous_token"
    INDUCTION = "induction"
    DUPLICATE_TOKEN = "duplicate_token"
    FIRST_TOKEN = "first_token"


class Replacement(StrEnum):
    """What replaces a sender's activation in a patch (mech.edges.writes.replacement)."""

    RESAMPLE = "resample"
    MEAN = "mean"
    ZERO = "zero"

    @property
    def source(self) -> str:
        """Where the replacement values come from, in words."""
        return {"resample": "the other run (the paired prompt)",
                "mean": "the per-position mean over reference prompts other than the patched one",
                "zero": "zeros"}[self.value]

    @property
    def needs_reference(self) -> bool:
        """Whether the values are a mean over reference prompts (and carry its uncertainty)."""
        return self is Replacement.MEAN

    @property
    def needs_source_run(self) -> bool:
        """Whether the values come from a second run of other prompts."""
        return self is Replacement.RESAMPLE


class Ablation(StrEnum):
    """How an ablated head's (or MLP's) activation is replaced (mech.hooks.ablation_plan)."""

    ZERO = "zero"
    MEAN = "mean"
    RESAMPLE = "resample"

    @property
    def replacement(self) -> Replacement:
        """The same values as a patch's replacement."""
        return Replacement(self.value)

    @property
    def source(self) -> str:
        return self.replacement.source

    @property
    def needs_reference(self) -> bool:
        return self is Ablation.MEAN


class Direction(StrEnum):
    """Which run an edge patch changes (docs: Exact edge patching)."""

    NOISING = "noising"  # base = clean, replacement from the corrupted run: necessity
    DENOISING = "denoising"  # base = corrupted, replacement from the clean run: sufficiency

    @property
    def tests(self) -> str:
        return "necessity" if self is Direction.NOISING else "sufficiency"


class Processing(StrEnum):
    FOLDED = "folded"
    RAW = "raw"


class Mode(StrEnum):
    """A composition mode: the receiver input read."""

    Q = "q"
    K = "k"
    V = "v"


class Corruption(StrEnum):
    """The corruptions of the repeated-tokens generator."""

    FIRST_HALF = "first_half"
    SECOND_HALF = "second_half"
    BOTH = "both"


class Normalization(StrEnum):
    """What a normalised effect divides by."""

    CORRUPTED = "corrupted"
    BASELINE = "baseline"


class UseStatus(StrEnum):
    """Whether an edge is used, from its effect's interval (claims.edge_test.UseRule)."""

    USED = "used"
    OPPOSITE = "used (opposite sign)"
    UNUSED = "unused"
    UNDETERMINED = "undetermined"
    UNTESTED = "untested"  # the patch changes nothing the receiver reads


class LadderStatus(StrEnum):
    """How a claim bears on a rung of the evidence ladder."""

    SUPPORTS = "supports"
    AGAINST = "against"
    INCONCLUSIVE = "inconclusive"
    UNTESTED = "untested"


class Rung(StrEnum):
    """The levels of evidence, lowest first."""

    WEIGHTS = "weights"
    OBSERVATION = "observation"
    ATTRIBUTION = "attribution"  # a first-order estimate of an edge's effect (no intervention)
    NECESSITY = "necessity"
    EDGE_NECESSITY = "edge necessity"
    SUFFICIENCY = "sufficiency"
    EQUIVALENCE = "equivalence"  # a circuit scores as the model prompt by prompt (circuit criteria)
    COMPLETENESS = "completeness"  # removing its parts hurts it as it hurts the model
    INDEPENDENCE = "independence"  # the rest carries nothing of the model's score
    MINIMALITY = "minimality"  # every member is needed (a member's row: that it is)
    ROBUSTNESS = "robustness"


CIRCUIT_RUNGS = (Rung.EQUIVALENCE, Rung.COMPLETENESS, Rung.INDEPENDENCE, Rung.MINIMALITY)  # stated, not applied


ATTENTION_ROLES = tuple(r.value for r in AttentionRole)
ABLATIONS = tuple(a.value for a in Ablation)
DIRECTIONS = tuple(d.value for d in Direction)
REPLACEMENTS = tuple(r.value for r in Replacement)
WEIGHT_PROCESSING = tuple(p.value for p in Processing)
MODES = tuple(m.value for m in Mode)
CORRUPTIONS = tuple(c.value for c in Corruption)
NORMALIZATIONS = tuple(n.value for n in Normalization)
USE_STATUSES = tuple(u.value for u in UseStatus)
LADDER_STATUSES = tuple(s.value for s in LadderStatus)
RUNGS = tuple(r.value for r in Rung)
