"""The settings of the built-in data sources that are not text: the generator and prompt files
(pydantic models of a `data:` mapping), and `DataSettings`, the base of every source's settings
(harness.data.sources registers the sources).  Defaults live here only; docs/data-format.md
documents every key.  Imports no torch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from ..spec.settings import Strict
from ..spec.vocabulary import Corruption

DEFAULT_CORRUPTIONS: tuple[Corruption, ...] = (Corruption.FIRST_HALF,)
MAX_PROMPTS = 10_000  # prompts run in one batch: memory grows linearly (about 0.5 MB per prompt on the fixture)


class DataSettings(Strict):
    """The settings of a data source (data.sources): a `data:` mapping, named by the one
    key of its source."""

    def corruption_names(self) -> list[str] | None:
        """The names claims may give as `corruption:` (the first is the default); None: known
        only when the prompts are built."""
        return None


class GeneratorData(DataSettings):
    """Built-in generator: `[BOS] + S + S` with S uniformly random tokens, and one or
    more corruptions of it (data.dataset.repeated_tokens)."""

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
