"""The first prompts of a dataset as the evidence shows them (`data.examples`): each
prompt as one text segment per token (model.tokenizer.TextTokenizer.segments) when the
model has a tokenizer, else as token ids, with the scored positions and the answer and
wrong tokens."""

from __future__ import annotations

from typing import Any

from ..model.tokenizer import TextTokenizer
from .dataset import Dataset

N_EXAMPLES = 3


def examples(ds: Dataset, tok: TextTokenizer | None, n: int = N_EXAMPLES) -> list[dict[str, Any]]:
    """Up to `n` prompts: {"clean": tokens, "corrupted": {name: tokens}, "positions": [p],
    "answers": [token], "wrong": [token] or None}, a token being its text (a string) or,
    without a tokenizer, its id (an integer)."""
    def show(ids: list[int]) -> list[Any]:
        return tok.segments(ids) if tok is not None else ids

    def one(ids: list[int]) -> list[Any]:
        return [tok.piece(t) for t in ids] if tok is not None else ids

    out = []
    for i in range(min(n, ds.n)):
        out.append({"clean": show(ds.clean[i].tolist()),
                    "corrupted": {c: show(t[i].tolist()) for c, t in ds.corruptions.items()},
                    "positions": ds.positions[i].tolist(), "answers": one(ds.answers[i].tolist()),
                    "wrong": None if ds.wrong is None else one(ds.wrong[i].tolist())})
    return out
