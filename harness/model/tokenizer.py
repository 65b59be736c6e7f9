"""The model's tokenizer, as text data and reports use it.

A Hugging Face model directory's tokenizer files (tokenizer.json, or vocab.json and
merges.txt, ...) are loaded with the model by TransformerBridge.boot_transformers
(`bridge.tokenizer`); `hf:NAME` takes the tokenizer from the user's cache.  Native
model directories (the shipped fixtures) have none.  A directory without tokenizer
files gets an empty stand-in from transformers (no vocabulary): that counts as none.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError
from .loading import LoadedModel


class TextTokenizer:
    """Encoding and decoding with a model's tokenizer.  Text is tokenised without
    special tokens (`add_special_tokens=False`); the BOS token, when asked for, is put
    in front by the caller, so every tokenizer is used the same way."""

    def __init__(self, tokenizer: Any, model: str):
        self.tokenizer = tokenizer
        self.model = model  # names the model in messages
        bos = getattr(tokenizer, "bos_token_id", None)
        self.bos: int | None = int(bos) if bos is not None else None

    def encode(self, texts: list[str]) -> list[list[int]]:
        """The token ids of each text (no special tokens added)."""
        if not texts:
            return []
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [[int(t) for t in row] for row in ids]

    def piece(self, token: int) -> str:
        """One token as text (special tokens included, spaces kept)."""
        return str(self.tokenizer.decode([int(token)], skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False))

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token of `ids` as text: the token lists of error messages."""
        return [self.piece(t) for t in ids]

    def segments(self, ids: list[int]) -> list[str]:
        """Text segments, one per token, that join to the decoded prompt: segment i is
        what decoding the tokens `i - 8 … i` adds to decoding `i - 8 … i - 1` (so a
        word-level tokenizer's spaces between words are kept), or the token decoded
        alone where decoding is not incremental (e.g. half of a multi-byte character)."""
        def decode(part: list[int]) -> str:
            return str(self.tokenizer.decode([int(t) for t in part], skip_special_tokens=False,
                                             clean_up_tokenization_spaces=False))

        out: list[str] = []
        for i in range(len(ids)):
            start = max(0, i - 8)
            before, now = decode(ids[start:i]) if i > start else "", decode(ids[start:i + 1])
            out.append(now[len(before):] if now.startswith(before) else self.piece(ids[i]))
        return out


def model_tokenizer(m: LoadedModel) -> TextTokenizer | None:
    """The model's tokenizer, or None when it has none (a native model, or a Hugging
    Face directory without tokenizer files)."""
    return bridge_tokenizer(m.bridge, m.source)


def bridge_tokenizer(bridge: Any, model: str) -> TextTokenizer | None:
    """`model_tokenizer` of a bridge (`model` names it in messages)."""
    tok = getattr(bridge, "tokenizer", None)
    if tok is None or not int(getattr(tok, "vocab_size", 0) or 0):
        return None
    return TextTokenizer(tok, model)


def require_tokenizer(m: LoadedModel, where: str) -> TextTokenizer:
    """model_tokenizer(m); DataError (prefixed with `where`) when the model has none."""
    tok = model_tokenizer(m)
    if tok is None:
        raise DataError(f"{where}: text data needs a tokenizer, and the model {m.source} has none (a Hugging Face "
                        "model directory holds its tokenizer files, e.g. tokenizer.json written by "
                        "tokenizer.save_pretrained(DIR); native model directories have none): give token ids "
                        "(a JSONL file with 'clean' rows) or the generator")
    return tok
