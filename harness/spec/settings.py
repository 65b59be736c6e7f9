"""Settings blocks of a hypothesis file (pydantic models): the statistics, and `Strict`, the base
of every model of the format (the data source's settings are harness.data.settings).  Defaults
live here only; docs/hypothesis-format.md documents every key.  Imports no torch."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    """Every model of the format: unknown keys are errors; values are frozen; numbers
    are finite (`.nan` and `.inf` are rejected wherever a number is allowed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


MIN_PEER_RATIO = 1.3  # a route composes only when its score is this many times its peers' median


class Stats(Strict):
    """Statistics settings shared by every claim of a file."""

    bootstrap: int = Field(2000, ge=100, le=1_000_000)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    permutations: int = Field(10_000, ge=100, le=1_000_000)
    min_gap: float = Field(0.5, ge=0.0)
    min_prompt_gap: float = Field(0.1, ge=0.0)
    composition_alpha: float = Field(0.01, gt=0.0, lt=1.0)
    composition_min_ratio: float = Field(MIN_PEER_RATIO, ge=1.0)  # C / median of its peers' (mech.weights.scores)
    null_draws: int = Field(1000, ge=99, le=1_000_000)
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    min_effect: float = Field(0.1, gt=0.0)
    tolerance: float = Field(0.05, gt=0.0)
    min_change: float = Field(0.05, gt=0.0, le=1.0)
    min_raw_change: float = Field(0.01, ge=0.0)

    def warnings(self) -> list[str]:
        """Settings that weaken the guards against reading noise as an effect."""
        out = []
        if self.min_raw_change == 0:
            out.append("stats.min_raw_change is 0: an edge can be called used with no change in the metric")
        for key in ("min_gap", "min_prompt_gap"):
            value = getattr(self, key)
            if value < self.min_raw_change:
                out.append(f"stats.{key} {value:g} is below min_raw_change {self.min_raw_change:g}: normalised "
                           "effects may divide by gaps smaller than the smallest change counted as real")
        return out

    @model_validator(mode="after")
    def _zones_apart(self) -> Stats:
        if self.tolerance >= self.min_effect:
            raise ValueError(f"tolerance {self.tolerance:g} must be below min_effect {self.min_effect:g}, "
                             "or 'used' and 'unused' overlap")
        return self
