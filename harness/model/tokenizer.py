"""The model's tokenizer, as text data and reports use it.

A Hugging Face model directory's tokenizer files (tokenizer.json, or vocab.json and
merges.txt, ...; a hub model's in its cache snapshot) are read only when something needs
the tokenizer (`model_tokenizer`): text data, the generator's start token, token texts in
`harness explain`.  Models load without them, so token-id data runs whatever they hold;
files that cannot be read give one line naming the file (DataError), never a traceback.
Native model directories (the shipped fixtures) have none; text data on a model without a
tokenizer is refused in one line saying why.  A handed-over bridge keeps its own.

The start token (`bos`) is the tokenizer's BOS token when that token is in its vocabulary
(TransformerLens gives a tokenizer without one a stand-in, often outside it), else None;
the unknown token (`unk`) likewise.  Whether prompts get it by default follows what the
tokenizer does by itself (`adds_bos`): text data (`prepend_bos`) and the generator
(`start_token`) alike, in every command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import DataError
from .bridge import Bridge
from .hf_loader import offline
from .loaded import LoadedModel
from .model_dir import TOKENIZER_FILES, has_tokenizer_files
from .ref import ModelRef
from .tensors import one_line

VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                    "sentencepiece.bpe.model")
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class TextTokenizer:
    """Encoding and decoding with a model's tokenizer.  Text is tokenised without
    special tokens (`add_special_tokens=False`); the BOS token, when asked for, is put
    in front by the caller, so every tokenizer is used the same way."""

    def __init__(self, tokenizer: Any, model: str):
        self.tokenizer = tokenizer
        self.model = model  # names the model in messages
        self.bos: int | None = _special(tokenizer, "bos")
        self.unk: int | None = _special(tokenizer, "unk")
        # whether the tokenizer puts its BOS token in front of a text by itself (Llama, Gemma: yes;
        # GPT-2, Pythia, SmolLM2: no, though they name one): what harness does by default
        self.adds_bos: bool = self.bos is not None and _adds(tokenizer, self.bos)

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


def _adds(tokenizer: Any, bos: int) -> bool:
    """Whether `tokenizer` starts a text with `bos` when it adds its special tokens."""
    try:
        ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    except Exception:  # a tokenizer that cannot say: nothing is added
        return False
    return len(ids) > 1 and int(ids[0]) == bos


def _special(tokenizer: Any, which: str) -> int | None:
    """The id of the tokenizer's `which` token (bos, unk) when its text is in the vocabulary, else None."""
    text = getattr(tokenizer, f"{which}_token", None)
    tid = getattr(tokenizer, f"{which}_token_id", None)
    if not isinstance(text, str) or tid is None:
        return None
    try:  # one lookup each way (get_vocab builds a dict of the whole vocabulary: seconds at 262k tokens)
        found = tokenizer.convert_tokens_to_ids(text)
        back = tokenizer.convert_ids_to_tokens(int(found)) if found is not None else None
    except Exception:  # a tokenizer without a readable vocabulary: trust its id
        return int(tid)
    return int(found) if back == text else None


def model_tokenizer(m: LoadedModel) -> TextTokenizer | None:
    """The model's tokenizer: the bridge's own, else the one its tokenizer files build (read once,
    then kept on the bridge); None when it has none (a native model, or a Hugging Face directory
    without tokenizer files).  DataError, one line naming the file, when the files cannot be read."""
    tok = bridge_tokenizer(m.bridge, m.source)
    if tok is not None:
        return tok
    folder = ModelRef.parse(m.source).folder() if m.kind != "bridge" else None
    if folder is None or not has_tokenizer_files(folder):
        return None
    m.bridge.tokenizer = read_tokenizer(folder, m.source)
    return bridge_tokenizer(m.bridge, m.source)


def shown_tokenizer(m: LoadedModel) -> TextTokenizer | None:
    """model_tokenizer for showing token texts: None where it has none or its files cannot be read."""
    try:
        return model_tokenizer(m)
    except DataError:
        return None


def read_tokenizer(folder: Path, model: str) -> Any:
    """The transformers tokenizer of `folder`'s files, offline; DataError naming the file when a
    file is not what a tokenizer file must be (invalid JSON, a special token that is not text, a
    tokenizer.json the tokenizers library refuses, no vocabulary file at all)."""
    present = [n for n in TOKENIZER_FILES if (folder / n).is_file()]
    where = f"the tokenizer of {model}"
    if not any((folder / n).is_file() for n in VOCABULARY_FILES):
        raise DataError(f"{where}: {', '.join(present)} but no vocabulary file ({', '.join(VOCABULARY_FILES[:4])}): "
                        "the tokenizer cannot be built; write it with tokenizer.save_pretrained(DIR)")
    for name in ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
        doc = _json(folder / name, where)
        if name != "added_tokens.json" and isinstance(doc, dict):
            _check_config(doc, folder / name, where)
    try:
        from transformers import AutoTokenizer

        with offline():
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a bad file; any of them is one line here
        # the large files are read again only now, to name the one at fault: read on the way in, a 262k
        # vocabulary's tokenizer.json would cost its parsed JSON and a second tokenizer (about 0.8 GB)
        _json(folder / "vocab.json", where)
        if _json(folder / "tokenizer.json", where) is not None:
            _check_tokenizer_json(folder / "tokenizer.json", where)
        raise DataError(f"{where}: cannot read its tokenizer files ({', '.join(present)}): {one_line(exc)}") from None


def _json(path: Path, where: str) -> Any:
    """The JSON document of `path` (None where there is no such file); DataError naming it when it is not JSON."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{where}: {path}: not a valid JSON file ({one_line(exc)})") from None


def _check_config(doc: dict[str, Any], path: Path, where: str) -> None:
    for key in SPECIAL_KEYS:
        v = doc.get(key)
        if v is not None and not isinstance(v, str) and not (isinstance(v, dict) and isinstance(v.get("content"), str)):
            raise DataError(f"{where}: {path}: {key}: expected the token's text, got {v!r}")
    v = doc.get("model_max_length")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
        raise DataError(f"{where}: {path}: model_max_length: expected a number, got {v!r}")
    v = doc.get("tokenizer_class")
    if v is not None and not isinstance(v, str):
        raise DataError(f"{where}: {path}: tokenizer_class: expected a class name, got {v!r}")


def _check_tokenizer_json(path: Path, where: str) -> None:
    try:
        from tokenizers import Tokenizer

        Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises a bare Exception for a malformed file
        raise DataError(f"{where}: {path}: the tokenizers library cannot read it ({one_line(exc)})") from None


def model_bos(m: LoadedModel, where: str) -> int:
    """The start token the generator puts at position 0: the tokenizer's BOS token (model_tokenizer), or
    0 for a model without a tokenizer (the fixtures); DataError when the tokenizer has no BOS token in its
    vocabulary or its files cannot be read (`where` names the setting that avoids it)."""
    tok = _start_tokenizer(m, where)
    if tok is None:
        return 0
    if tok.bos is None:
        raise DataError(f"{where}: the tokenizer of {m.source} has no BOS token in its vocabulary: set "
                        "data.bos_token to the start token's id, or data.bos: false")
    return tok.bos


def bridge_tokenizer(bridge: Bridge, model: str) -> TextTokenizer | None:
    """`model_tokenizer` of a bridge (`model` names it in messages)."""
    tok = getattr(bridge, "tokenizer", None)
    if tok is None or not int(getattr(tok, "vocab_size", 0) or 0):
        return None
    return TextTokenizer(tok, model)


def require_tokenizer(m: LoadedModel, where: str) -> TextTokenizer:
    """model_tokenizer(m); DataError (one line, prefixed with `where`) when the model has none,
    saying why: a Hugging Face directory without tokenizer files, a native directory, a
    handed-over bridge without a tokenizer."""
    try:
        tok = model_tokenizer(m)
    except DataError as exc:
        raise DataError(f"{where}: text data needs the model's tokenizer, and {exc}") from None
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


def start_token(m: LoadedModel, setting: bool | None, where: str) -> int | None:
    """The token the generator puts at position 0, None for none: `setting` false: none; true:
    model_bos; None (the default): what the tokenizer does by itself: its BOS token when it adds
    one to every text, none when it adds none, and 0 for a model without a tokenizer (the shipped
    fixtures, trained with token 0 first).  The one rule for `harness run`, `roles`, `scan` and
    `discover`."""
    if setting is False:
        return None
    if setting:
        return model_bos(m, where)
    tok = _start_tokenizer(m, where)
    if tok is None:
        return 0
    return tok.bos if tok.adds_bos else None


def _start_tokenizer(m: LoadedModel, where: str) -> TextTokenizer | None:
    """model_tokenizer, its DataError saying that the generator's start token comes from it."""
    try:
        return model_tokenizer(m)
    except DataError as exc:
        raise DataError(f"{where}: the generator's start token comes from the tokenizer, and {exc}; or set "
                        "data.bos_token, or data.bos: false") from None


def start_words(m: LoadedModel, ds: Any) -> str:
    """Which start token the prompts of `ds` (data.dataset.Dataset) begin with, in words for the stage
    lines: `BOS '<s>' (id 1) in front` or `no BOS token in front`."""
    token = ds.start_token()
    if token is None:
        return "no BOS token in front"
    tok = shown_tokenizer(m)
    return f"BOS {tok.piece(token)!r} (id {token}) in front" if tok is not None else f"start token {token} in front"
