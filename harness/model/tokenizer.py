"""The model's tokenizer, as text data and reports use it.

A Hugging Face model directory's tokenizer files (tokenizer.json, or vocab.json and
merges.txt, ...) are loaded with the model by TransformerBridge.boot_transformers
(`bridge.tokenizer`); a hub model takes them from its cache snapshot.  Native model
directories (the shipped fixtures) have none, and a Hugging Face directory without
tokenizer files is loaded without one (loading.TOKENIZER_FILES): token-id data runs on
them, text data is refused in one line saying why.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError
from .loading import TOKENIZER_FILES, LoadedModel, has_tokenizer_files
from .ref import ModelRef


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
    """model_tokenizer(m); DataError (one line, prefixed with `where`) when the model has none,
    saying why: a Hugging Face directory without tokenizer files, a native directory, a
    handed-over bridge without a tokenizer."""
    tok = model_tokenizer(m)
    if tok is None:
        if m.kind == "transformers" and not _has_tokenizer_files(m):
            why = (f"the model directory has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...), which text "
                   "data needs: write them beside config.json with tokenizer.save_pretrained(DIR)")
        elif m.kind == "bridge":
            why = "boot the bridge with one, e.g. TransformerBridge.boot_transformers(NAME), or pass tokenizer=..."
        elif m.kind == "native":
            why = "a native model directory has no tokenizer"
        else:
            why = "its tokenizer files give no vocabulary"
        raise DataError(f"{where}: text data needs a tokenizer, and the model {m.source} has none ({why}): give "
                        "token ids (a JSONL file with 'clean' rows) or the generator")
    return tok


def _has_tokenizer_files(m: LoadedModel) -> bool:
    """Whether the folder the model was loaded from (a directory, a hub model's cache snapshot) has tokenizer files."""
    folder = ModelRef.parse(m.source).folder()
    return folder is not None and has_tokenizer_files(folder)
