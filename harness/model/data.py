"""Datasets: clean prompts with matched corrupted prompts of the same length,
the positions the metric reads and the answer tokens there.

Convention: position `p` of a prompt is scored by the logits *at* `p`, which
predict the token at `p + 1`; `answers[i]` is the correct token for
`positions[i]` and `wrong[i]` (optional) the contrasting wrong token.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError

BOS_TOKEN = 0


@dataclass
class Dataset:
    """All fields are torch tensors of equal first dimension (prompts).

    clean, corrupted: [n, seq] token ids
    positions:        [n, k] scored positions
    answers:          [n, k] correct next tokens at those positions
    wrong:            [n, k] wrong tokens (for logit difference) or None
    """

    clean: Any
    corrupted: Any
    positions: Any
    answers: Any
    wrong: Any | None
    description: str
    has_bos: bool

    def to(self, device: Any) -> Dataset:
        """The same dataset with every tensor on `device` (a no-op copy when already there).
        Prompts are always drawn on the CPU, so they do not depend on the device."""
        def move(t: Any) -> Any:
            return None if t is None else t.to(device)

        return Dataset(move(self.clean), move(self.corrupted), move(self.positions), move(self.answers),
                       move(self.wrong), self.description, self.has_bos)

    @property
    def n(self) -> int:
        return int(self.clean.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.clean.shape[1])


def _split_seed(seed: int, split: str) -> int:
    """Independent seed streams per split, so `explore` and `test` prompts differ."""
    return (seed * 1_000_003 + zlib.crc32(split.encode())) % (2**63)


def repeated_tokens(n_prompts: int, segment_length: int, d_vocab: int, seed: int = 0,
                    split: str = "test", bos: bool = True, vocab_min: int = 1,
                    vocab_max: int | None = None, bos_token: int = BOS_TOKEN) -> Dataset:
    """Repeated random tokens: clean = [BOS] + S + S, S uniform on [vocab_min, vocab_max).

    The corrupted prompt replaces the first occurrence of S by fresh random
    tokens R (same length), so the repeat is broken: [BOS] + R + S.  Scored
    positions are those of the second S except its last token, each predicting
    the next token of S (which an induction head can copy in the clean prompt
    only).  Note: the answer at the boundary (predicting S[0]) is not scored.
    The start token `bos_token` never occurs inside S or R.
    """
    import torch

    hi = d_vocab if vocab_max is None else vocab_max
    if not 0 <= vocab_min < hi <= d_vocab:
        raise DataError(f"token range [{vocab_min}, {hi}) is not inside the vocabulary 0..{d_vocab - 1}")
    skip = vocab_min <= bos_token < hi  # draw uniformly from the range without the start token
    if hi - vocab_min - int(skip) < 2:
        raise DataError(f"token range [{vocab_min}, {hi}) leaves fewer than 2 tokens to draw from")
    g = torch.Generator().manual_seed(_split_seed(seed, split))

    def draw() -> Any:
        t = torch.randint(vocab_min, hi - int(skip), (n_prompts, segment_length), generator=g)
        return t + (t >= bos_token).long() if skip else t

    seg, fresh = draw(), draw()
    prefix = torch.full((n_prompts, 1), bos_token, dtype=torch.long) if bos else seg[:, :0]
    clean = torch.cat([prefix, seg, seg], dim=1)
    corrupted = torch.cat([prefix, fresh, seg], dim=1)
    off = prefix.shape[1] + segment_length  # index of S[0] in the second copy
    positions = torch.arange(off, off + segment_length - 1).expand(n_prompts, -1).clone()
    answers = seg[:, 1:].clone()
    desc = (f"repeated_tokens: {n_prompts} prompts, {f'[BOS={bos_token}] + ' if bos else ''}S + S with "
            f"|S| = {segment_length}, tokens in [{vocab_min}, {hi}), seed {seed}, split {split}; "
            f"corruption: first S replaced by fresh random tokens")
    return Dataset(clean, corrupted, positions, answers, None, desc, bos)


def load_jsonl(path: Path, d_vocab: int, limit: int | None = None) -> Dataset:
    """Load token-id prompts, one JSON object per line:

    {"clean": [ids], "corrupted": [ids], "positions": [p...],
     "answers": [ids] (optional: default clean[p + 1]), "wrong": [ids] (optional)}

    All prompts must have one length (so per-position means are defined).
    """
    import torch

    if not path.is_file():
        raise DataError(f"{path}: data file not found")
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from None
        rows.append(_check_row(obj, f"{path}:{lineno}", d_vocab))
        if limit is not None and len(rows) >= limit:
            break
    if len(rows) < 2:
        raise DataError(f"{path}: needs at least 2 prompts, found {len(rows)}")
    first = rows[0]
    for key in ("clean", "positions"):
        for where, r in ((r["where"], r) for r in rows):
            if len(r[key]) != len(first[key]):
                raise DataError(f"{where}: {key} has length {len(r[key])}, but the first prompt's "
                                f"has {len(first[key])}; all prompts must share one shape")
    if any(("wrong" in r) != ("wrong" in first) for r in rows):
        raise DataError(f"{path}: give 'wrong' on every line or on none")
    t = lambda key: torch.tensor([r[key] for r in rows], dtype=torch.long)  # noqa: E731
    return Dataset(t("clean"), t("corrupted"), t("positions"), t("answers"),
                   t("wrong") if "wrong" in first else None,
                   f"file {path.name}: {len(rows)} prompts of length {len(first['clean'])}",
                   has_bos=all(r["clean"][0] == BOS_TOKEN for r in rows))


def _check_row(obj: Any, where: str, d_vocab: int) -> dict:
    allowed = {"clean", "corrupted", "positions", "answers", "wrong"}
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with keys {sorted(allowed)}")
    unknown = set(obj) - allowed
    if unknown:
        raise DataError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    for key in ("clean", "corrupted", "positions"):
        if key not in obj:
            raise DataError(f"{where}: missing '{key}'")
    for key in obj:
        v = obj[key]
        if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise DataError(f"{where}: '{key}' must be a non-empty list of integers")
    clean, corrupted, pos = obj["clean"], obj["corrupted"], obj["positions"]
    if len(clean) != len(corrupted):
        raise DataError(f"{where}: clean has {len(clean)} tokens but corrupted has {len(corrupted)}; "
                        "a corrupted prompt must have the same length as its clean prompt")
    for key in ("clean", "corrupted", "answers", "wrong"):
        bad = [x for x in obj.get(key, []) if not 0 <= x < d_vocab]
        if bad:
            raise DataError(f"{where}: '{key}' has token ids {bad[:3]} outside the vocabulary 0..{d_vocab - 1}")
    bad_pos = [p for p in pos if not 0 <= p < len(clean)]
    if bad_pos:
        raise DataError(f"{where}: positions {bad_pos[:3]} outside the prompt (length {len(clean)})")
    row = dict(obj, where=where)
    if "answers" not in obj:
        if any(p + 1 >= len(clean) for p in pos):
            raise DataError(f"{where}: without 'answers', every position needs a next token "
                            f"(position < {len(clean) - 1})")
        row["answers"] = [clean[p + 1] for p in pos]
    for key in ("answers", "wrong"):
        if key in row and len(row[key]) != len(pos):
            raise DataError(f"{where}: '{key}' needs one token per position ({len(pos)})")
    return row
