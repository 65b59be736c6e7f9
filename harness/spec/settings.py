"""Settings blocks of a hypothesis file (pydantic models): the data source and
the statistics.  Defaults live here only; docs/hypothesis-format.md documents
every key.  Imports no torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from .vocabulary import Corruption

DEFAULT_CORRUPTIONS: tuple[Corruption, ...] = (Corruption.FIRST_HALF,)
MAX_PROMPTS = 10_000  # prompts run in one batch: memory grows linearly (about 0.5 MB per prompt on the fixture)


class Strict(BaseModel):
    """Every model of the format: unknown keys are errors; values are frozen; numbers
    are finite (`.nan` and `.inf` are rejected wherever a number is allowed)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DataSettings(Strict):
    """The settings of a data source (model.data_sources): a `data:` mapping, named by the one
    key of its source."""

    def corruption_names(self) -> list[str] | None:
        """The names claims may give as `corruption:` (the first is the default); None: known
        only when the prompts are built."""
        return None


class GeneratorData(DataSettings):
    """Built-in generator: `[BOS] + S + S` with S uniformly random tokens, and one or
    more corruptions of it (model.data.repeated_tokens)."""

    generator: Literal["repeated_tokens"]
    n_prompts: int = Field(200, ge=2, le=MAX_PROMPTS)
    segment_length: int = Field(20, ge=2)
    bos: StrictBool | None = None  # None: as the tokenizer does by itself (model.tokenizer.start_token)
    bos_token: int | None = Field(None, ge=0)
    seed: int = Field(0, ge=0)
    split: Literal["test", "explore"] = "test"
    vocab_min: int = Field(1, ge=0)
    vocab_max: int | None = Field(None, ge=1)
    corruptions: list[Corruption] = Field(default_factory=lambda: list(DEFAULT_CORRUPTIONS), min_length=1)
    n_reference: int | None = Field(None, ge=2, le=MAX_PROMPTS)
    distinct: StrictBool = False  # no token twice inside a segment; corrupted segments differ at every position

    @model_validator(mode="after")
    def _range(self) -> GeneratorData:
        if self.vocab_max is not None and self.vocab_max <= self.vocab_min:
            raise ValueError("vocab_max must be greater than vocab_min")
        if len(set(self.corruptions)) != len(self.corruptions):
            raise ValueError("a corruption is listed twice")
        return self

    def corruption_names(self) -> list[str] | None:
        """The names claims may give as `corruption:` (the first is the default)."""
        return list(self.corruptions)


class FileData(DataSettings):
    """A JSONL file of token-id prompts, or of text prompts (rows with "text"; see
    docs/data-format.md)."""

    file: str
    limit: int | None = Field(None, ge=2, le=MAX_PROMPTS)
    mean_from: str | None = None
    prepend_bos: StrictBool | None = None  # text files only; None: when the tokenizer has a BOS token
    allow_unknown: StrictBool = False  # text files only: text the tokenizer does not know is an error unless true

    def corruption_names(self) -> list[str] | None:
        """None: known only when the file is read (`default`, and one per corrupted_<name> key)."""
        return None


MIN_PEER_RATIO = 1.3  # a route composes only when its score is this many times its peers' median


class Stats(Strict):
    """Statistics settings shared by every claim of a file."""

    bootstrap: int = Field(2000, ge=100, le=1_000_000)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    permutations: int = Field(10_000, ge=100, le=1_000_000)
    min_gap: float = Field(0.5, ge=0.0)
    min_prompt_gap: float = Field(0.1, ge=0.0)
    composition_alpha: float = Field(0.01, gt=0.0, lt=1.0)
    composition_min_ratio: float = Field(MIN_PEER_RATIO, ge=1.0)  # C / median of its peers' (mech.weights)
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
