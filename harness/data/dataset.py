"""Datasets: clean prompts with matched corrupted prompts of the same length,
the positions the metric reads and the answer tokens there.

Convention: position `p` of a prompt is scored by the logits *at* `p`, which
predict the token at `p + 1`; `answers[i]` is the correct token for
`positions[i]` and `wrong[i]` (optional) the contrasting wrong token.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import locations
from ..errors import DataError
from ..spec.vocabulary import CORRUPTIONS
from ..textfile import utf8
from . import named_spans, settings
from .text_settings import CORRUPTED_KEY

BOS_TOKEN = 0
DEFAULT = "default"  # the name of a prompt file's own `corrupted` prompts
MAX_PROMPTS = settings.MAX_PROMPTS  # prompts per run (generator n_prompts and prompt files)


@dataclass
class Dataset:
    """All tensors have the prompts along their first dimension.

    clean:       [n, seq] token ids
    corruptions: {name: [n, seq]} the corrupted prompts of each named corruption (the
                 first is the default a claim uses unless it names another)
    positions:   [n, k] scored positions
    answers:     [n, k] correct next tokens at those positions
    wrong:       [n, k] wrong tokens (for logit difference) or None
    reference:   [m, seq] clean prompts that per-position means are taken over (mean
                 ablation, mean replacement), drawn independently of `clean`; None: the
                 mean over the other clean prompts (leave-one-out)
    warnings:    what the reader of a report must know about the prompts (e.g. duplicates
                 dropped)
    shared_reference: how many clean prompts are also reference prompts (engine.measure
                 warns when claims take means and the share is material)
    spans:       the token span [start, end) of each occurrence of each slot of a template,
                 `NAME#k` (k from 1), per prompt [n, 2] (attention claims to named positions)
    answer_sets: [n, k, S] the right answers at each scored position where the data give sets of
                 them (padded with -1; `answers` then holds each set's first member), else None
    wrong_sets:  [n, k, S] the wrong answers likewise (None without sets or without wrong tokens)
    """

    clean: Any
    corruptions: dict[str, Any]
    positions: Any
    answers: Any
    wrong: Any | None
    description: str
    has_bos: bool
    reference: Any | None = None
    warnings: list[str] = field(default_factory=list)
    shared_reference: int = 0  # clean prompts that are also reference prompts (a mean over them includes them)
    spans: dict[str, Any] = field(default_factory=dict)  # named positions of template prompts: {"S#2": [n, 2]}
    answer_sets: Any | None = None  # [n, k, S] padded with -1, where the data give sets of right answers
    wrong_sets: Any | None = None  # [n, k, S] likewise for the wrong answers

    def scored(self, sets: bool) -> tuple[Any, Any | None]:
        """(answers, wrong) as a metric reads them: with `sets`, the sets [n, k, S] (padded with -1;
        single tokens become sets of one), else the single tokens [n, k]."""
        if not sets:
            return self.answers, self.wrong
        answers = self.answer_sets if self.answer_sets is not None else self.answers.unsqueeze(-1)
        if self.wrong is None:
            return answers, None
        return answers, self.wrong_sets if self.wrong_sets is not None else self.wrong.unsqueeze(-1)

    @property
    def corrupted(self) -> Any:
        """The default corruption's prompts."""
        return self.corruptions[self.default_corruption]

    @property
    def default_corruption(self) -> str:
        return next(iter(self.corruptions))

    def start_token(self) -> int | None:
        """The token every prompt starts with when it starts with a BOS token (has_bos), else None."""
        return int(self.clean[0, 0]) if self.has_bos else None

    def to(self, device: Any) -> Dataset:
        """The same dataset with every tensor on `device` (a no-op copy when already there).
        Prompts are always drawn on the CPU, so they do not depend on the device."""
        def move(t: Any) -> Any:
            return None if t is None else t.to(device)

        return Dataset(move(self.clean), {k: move(v) for k, v in self.corruptions.items()}, move(self.positions),
                       move(self.answers), move(self.wrong), self.description, self.has_bos, move(self.reference),
                       list(self.warnings), self.shared_reference, {k: move(v) for k, v in self.spans.items()},
                       move(self.answer_sets), move(self.wrong_sets))

    def keep_corruptions(self, chosen: list[str]) -> Dataset:
        """The same prompts with only the `chosen` corruptions, in that order (the first the default)."""
        return replace(self, corruptions={k: self.corruptions[k] for k in chosen})

    def select(self, keep: list[int]) -> Dataset:
        """The prompts at indices `keep` (reference prompts unchanged)."""
        def take(t: Any) -> Any:
            return None if t is None else t[keep]

        return replace(self, clean=take(self.clean), corruptions={k: take(v) for k, v in self.corruptions.items()},
                       positions=take(self.positions), answers=take(self.answers), wrong=take(self.wrong),
                       spans={k: take(v) for k, v in self.spans.items()}, answer_sets=take(self.answer_sets),
                       wrong_sets=take(self.wrong_sets))

    @property
    def n(self) -> int:
        return int(self.clean.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.clean.shape[1])


def drop_duplicates(ds: Dataset, source: str, labels: list[str] | None = None) -> Dataset:
    """`ds` without prompts that repeat an earlier one exactly (clean prompt, every
    corruption, positions, answers and wrong tokens), with a warning saying how many
    were dropped.  The statistics treat prompts as independent draws: a repeated
    prompt would count its evidence twice and narrow every interval.  `labels[i]`
    names prompt i in the warning (e.g. `file:line`).  DataError (naming `source`)
    when fewer than 2 distinct prompts remain."""
    tensors = [ds.clean, *ds.corruptions.values(), ds.positions, ds.answers]
    tensors += [t for t in (ds.wrong, ds.answer_sets, ds.wrong_sets) if t is not None]
    seen: dict[tuple[Any, ...], int] = {}
    keep, repeats = [], []
    for i in range(ds.n):
        key = tuple(tuple(t[i].flatten().tolist()) for t in tensors)
        if key in seen:
            repeats.append((i, seen[key]))
        else:
            seen[key] = i
            keep.append(i)
    if not repeats:
        return ds
    def name(i: int) -> str:
        return labels[i] if labels is not None else f"prompt {i}"

    if len(keep) < 2:
        raise DataError(f"{source}: only {len(keep)} distinct prompt(s) among {ds.n}; "
                        "the statistics need at least 2 independent prompts")
    examples = ", ".join(f"{name(i)} repeats {name(j)}" for i, j in repeats[:3])
    warning = (f"data: {len(repeats)} of {ds.n} prompts repeat an earlier prompt exactly ({examples}"
               f"{', ...' if len(repeats) > 3 else ''}); they were dropped, and the statistics use the "
               f"{len(keep)} distinct prompts")
    out = ds.select(keep)
    out.warnings = [*ds.warnings, warning]
    out.description = f"{ds.description}; {len(repeats)} duplicate prompts dropped ({len(keep)} distinct)"
    return out


def split_seed(seed: int, split: str) -> int:
    """Independent seed streams per split, so `explore`, `test` and `reference` prompts differ."""
    return (seed * 1_000_003 + zlib.crc32(split.encode())) % (2**63)


def repeated_tokens(n_prompts: int, segment_length: int, d_vocab: int, *, seed: int = 0,
                    split: str = "test", bos: bool = True, vocab_min: int = 1,
                    vocab_max: int | None = None, bos_token: int = BOS_TOKEN,
                    corruptions: tuple[str, ...] = ("first_half",), n_reference: int | None = None,
                    n_ctx: int | None = None, distinct: bool = False) -> Dataset:
    """Repeated random tokens: clean = [BOS] + S + S, S uniform on [vocab_min, vocab_max).

    Corruptions (same length, fresh random tokens R1, R2 drawn independently):
    `first_half` [BOS] + R1 + S (the earlier copy is gone: nothing to copy);
    `second_half` [BOS] + S + R2 (the current tokens change: what queries read varies);
    `both` [BOS] + R1 + R2.  Scored positions are those of the second copy except its
    last token, each predicting the next token of S in the clean prompt.  Note: the
    answer at the boundary (predicting S[0]) is not scored.  The start token
    `bos_token` never occurs inside S or R.  `n_reference` (default n_prompts) clean
    prompts are drawn from the independent `reference` stream for per-position means.
    Prompts longer than `n_ctx` (the model's context, when given) are refused.
    `distinct`: no token occurs twice inside S, R1, R2 or a reference segment, and R1
    and R2 differ from S at every position (draw_distinct; other random numbers than
    the default's, which stays as it was).
    """
    import torch

    length = 2 * segment_length + int(bos)
    if n_ctx is not None and length > n_ctx:
        raise DataError(f"segment length {segment_length} makes prompts of {length} tokens; the model's context "
                        f"is {n_ctx} tokens (segment length at most {(n_ctx - int(bos)) // 2})")
    if not 2 <= n_prompts <= MAX_PROMPTS:
        raise DataError(f"{n_prompts} prompts: between 2 and {MAX_PROMPTS:,} are supported")

    unknown = [c for c in corruptions if c not in CORRUPTIONS]
    if unknown or not corruptions:
        raise DataError(f"unknown corruption(s) {unknown}; allowed: {', '.join(CORRUPTIONS)}")
    hi = d_vocab if vocab_max is None else vocab_max
    if not 0 <= vocab_min < hi <= d_vocab:
        raise DataError(f"token range [{vocab_min}, {hi}) is not inside the vocabulary 0..{d_vocab - 1}")
    skip = vocab_min <= bos_token < hi  # draw uniformly from the range without the start token
    if hi - vocab_min - int(skip) < 2:
        raise DataError(f"token range [{vocab_min}, {hi}) leaves fewer than 2 tokens to draw from")
    if distinct and hi - vocab_min - int(skip) < segment_length:
        without = " without the start token" if skip else ""
        raise DataError(f"distinct tokens: a segment of {segment_length} tokens needs at least {segment_length} "
                        f"tokens to draw from; the range [{vocab_min}, {hi}){without} has {hi - vocab_min - int(skip)}")

    def token(t: Any) -> Any:
        return t + (t >= bos_token).long() if skip else t

    def draw(g: Any, n: int, unlike: Any = None) -> Any:
        if distinct:
            return token(draw_distinct(g, n, segment_length, vocab_min, hi - int(skip),
                                       None if unlike is None else unlike - (unlike > bos_token).long() * int(skip)))
        return token(torch.randint(vocab_min, hi - int(skip), (n, segment_length), generator=g))

    g = torch.Generator().manual_seed(split_seed(seed, split))
    seg = draw(g, n_prompts)
    fresh = draw(g, n_prompts, seg)
    fresh2 = draw(g, n_prompts, seg) if set(corruptions) - {"first_half"} else None  # after: first_half unchanged
    prefix = torch.full((n_prompts, 1), bos_token, dtype=torch.long) if bos else seg[:, :0]
    clean = torch.cat([prefix, seg, seg], dim=1)
    halves = {"first_half": (fresh, seg), "second_half": (seg, fresh2), "both": (fresh, fresh2)}
    corrupted = {c: torch.cat([prefix, *halves[c]], dim=1) for c in corruptions}
    off = prefix.shape[1] + segment_length  # index of S[0] in the second copy
    positions = torch.arange(off, off + segment_length - 1).expand(n_prompts, -1).clone()
    answers = seg[:, 1:].clone()
    n_ref = n_prompts if n_reference is None else n_reference
    ref_seg = draw(torch.Generator().manual_seed(split_seed(seed, "reference")), n_ref)
    reference = torch.cat([prefix[:1].expand(n_ref, -1), ref_seg, ref_seg], dim=1)
    what = {"first_half": "first S replaced by fresh random tokens", "second_half": "second S replaced",
            "both": "both copies replaced"}
    shape = f"[BOS={bos_token}] + S + S" if bos else "S + S (no start token)"
    desc = (f"repeated_tokens: {n_prompts} prompts, {shape} with "
            f"|S| = {segment_length}, tokens in [{vocab_min}, {hi}), seed {seed}, split {split}; "
            + "; ".join(f"corruption {c}: {what[c]}" for c in corruptions)
            + f"; means over {n_ref} reference prompts" + ("; distinct tokens" if distinct else ""))
    return drop_duplicates(Dataset(clean, corrupted, positions, answers, None, desc, bos, reference),
                           "data (generator repeated_tokens)")


def draw_distinct(g: Any, n: int, length: int, lo: int, hi: int, unlike: Any = None) -> Any:
    """[n, length] tokens in [lo, hi), no token twice in a row; with `unlike` ([n, length]),
    each row also differs from `unlike`'s row at every position.  A range of fewer than
    8 x length^2 tokens: each row is the start of a random permutation of the range
    (torch.randperm from `g`), drawn again while it meets `unlike` somewhere.  A larger
    range: every row is drawn uniformly (torch.randint), and the rows with a repeated
    token or meeting `unlike` are drawn again, together, until none is left."""
    import torch

    if hi - lo < 8 * length * length:
        out = torch.empty((n, length), dtype=torch.long)
        for i in range(n):
            row = torch.randperm(hi - lo, generator=g)[:length] + lo
            while unlike is not None and bool((row == unlike[i]).any()):
                row = torch.randperm(hi - lo, generator=g)[:length] + lo
            out[i] = row
        return out
    out = torch.randint(lo, hi, (n, length), generator=g)
    while True:
        ordered = out.sort(dim=1).values
        bad = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
        if unlike is not None:
            bad |= (out == unlike).any(dim=1)
        if not bool(bad.any()):
            return out
        out[bad] = torch.randint(lo, hi, (int(bad.sum()), length), generator=g)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"key(s) {twice} given twice")
    return dict(pairs)


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, split at line feeds only (so a U+2028 inside a
    string does not shift line numbers); DataError when missing, unreadable or not UTF-8."""
    problem = locations.file_problem(path)
    if problem is not None:
        raise DataError(f"{path}: cannot read the data file: {problem}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return [line.removesuffix("\r") for line in utf8(raw, path, DataError).split("\n")]


def parse_line(line: str, where: str) -> Any:
    """One JSONL line as a value: DataError on invalid JSON, a key given twice, or
    nesting Python cannot follow."""
    try:
        return json.loads(line, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None
    except RecursionError:
        raise DataError(f"{where}: nested too deeply to be a prompt") from None


def read_rows(path: Path, check: Any, limit: int | None = None) -> list[dict[str, Any]]:
    """The checked rows of a JSONL file (blank lines skipped), each with its `where`."""
    rows = []
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        rows.append(check(parse_line(line, f"{path}:{lineno}"), f"{path}:{lineno}"))
        if len(rows) > MAX_PROMPTS:
            raise DataError(f"{path}: more than {MAX_PROMPTS:,} prompts; use data.limit, or split the file")
        if limit is not None and len(rows) >= limit:
            break
    if len(rows) < 2:
        raise DataError(f"{path}: needs at least 2 prompts, found {len(rows)}")
    return rows


def load_jsonl(path: Path, d_vocab: int, limit: int | None = None, mean_from: Path | None = None,
               n_ctx: int | None = None) -> Dataset:
    """Load token-id prompts, one JSON object per line:

    {"clean": [ids], "corrupted": [ids], "positions": [p...],
     "answers": [ids] (optional: default clean[p + 1]), "wrong": [ids] (optional),
     "corrupted_<name>": [ids] (optional: more corruptions, on every line or none),
     "spans": {NAME: [[start, end], ...]} (optional: named token spans, data.named_spans.token_spans)}

    All prompts must have one length (so per-position means are defined).  The
    `corrupted` prompts are the corruption named `default`.  `mean_from`: a JSONL file
    of `{"clean": [ids]}` lines (same length) whose clean prompts per-position means
    are taken over; without it, each prompt's mean leaves that prompt out.  Prompts
    longer than `n_ctx` (the model's context) are refused; prompts that repeat an
    earlier one exactly are dropped with a warning (drop_duplicates).
    """
    import torch

    rows = read_rows(path, lambda obj, where: _check_row(obj, where, d_vocab), limit)
    first = rows[0]
    if n_ctx is not None and len(first["clean"]) > n_ctx:
        raise DataError(f"{first['where']}: prompts have {len(first['clean'])} tokens; the model's context "
                        f"is {n_ctx} tokens")
    extra = sorted(k for k in first if k.startswith("corrupted_"))
    for key in ("clean", "positions"):
        for r in rows:
            if len(r[key]) != len(first[key]):
                raise DataError(f"{r['where']}: {key} has length {len(r[key])}, but the first prompt's "
                                f"has {len(first[key])}; all prompts must share one shape")
    for key in ["wrong", *extra]:
        if any((key in r) != (key in first) for r in rows):
            raise DataError(f"{path}: give '{key}' on every line or on none")
    for r in rows:
        if sorted(k for k in r if k.startswith("corrupted_")) != extra:
            raise DataError(f"{r['where']}: corrupted_<name> keys differ from the first line's "
                            f"({', '.join(extra) or 'none'}); give the same ones on every line")

    def t(key: str) -> Any:
        return torch.tensor([r[key] for r in rows], dtype=torch.long)

    corruptions = {DEFAULT: t("corrupted")} | {k[len("corrupted_"):]: t(k) for k in extra}
    reference = None
    if mean_from is not None:
        ref = read_rows(mean_from, lambda obj, where: _check_reference(obj, where, d_vocab, len(first["clean"])))
        reference = torch.tensor([r["clean"] for r in ref], dtype=torch.long)
    means = f"means over {mean_from.name}" if mean_from is not None else "means leave each prompt out"
    ds = Dataset(t("clean"), corruptions, t("positions"), t("answers"), t("wrong") if "wrong" in first else None,
                 f"file {path.name}: {len(rows)} prompts of length {len(first['clean'])}; corruptions "
                 f"{', '.join(corruptions)}; {means}",
                 has_bos=all(r["clean"][0] == BOS_TOKEN for r in rows), reference=reference,
                 spans=named_spans.token_spans(rows))
    return drop_duplicates(ds, str(path), [r["where"] for r in rows])


def _ids(obj: dict[str, Any], key: str, where: str) -> list[int]:
    v = obj[key]
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise DataError(f"{where}: '{key}' must be a non-empty list of integers")
    return v


def _check_reference(obj: Any, where: str, d_vocab: int, length: int) -> dict[str, Any]:
    if not isinstance(obj, dict) or set(obj) != {"clean"}:
        raise DataError(f"{where}: a mean_from line is a JSON object with one key, 'clean'")
    clean = _ids(obj, "clean", where)
    if len(clean) != length:
        raise DataError(f"{where}: clean has {len(clean)} tokens; the data's prompts have {length}")
    bad = [x for x in clean if not 0 <= x < d_vocab]
    if bad:
        raise DataError(f"{where}: 'clean' has token ids {bad[:3]} outside the vocabulary 0..{d_vocab - 1}")
    return {"clean": clean, "where": where}


def check_keys(obj: dict[str, Any], where: str, allowed: list[str], required: tuple[str, ...]) -> None:
    """A prompt row's keys: no `corrupted_default`, nothing but `allowed` and
    corrupted_<name>, every `required` key present (DataError otherwise)."""
    if "corrupted_default" in obj:
        raise DataError(f"{where}: 'corrupted_default' would replace the default corruption: give those prompts as "
                        "'corrupted'")
    unknown = sorted(k for k in obj if k not in allowed and not CORRUPTED_KEY.match(k))
    if unknown:
        raise DataError(f"{where}: unknown key(s) {unknown}; allowed: {allowed} and corrupted_<name> "
                        "(letters, digits, _)")
    for key in required:
        if key not in obj:
            raise DataError(f"{where}: missing '{key}'")


def _check_row(obj: Any, where: str, d_vocab: int) -> dict[str, Any]:
    allowed = sorted({"clean", "corrupted", "positions", "answers", "wrong", "spans"})
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with keys {allowed} (and corrupted_<name>)")
    check_keys(obj, where, allowed, ("clean", "corrupted", "positions"))
    for key in obj:
        if key != "spans":  # named token spans: named_spans.token_spans checks them
            _ids(obj, key, where)
    clean, pos = obj["clean"], obj["positions"]
    for key in [k for k in obj if k.startswith("corrupted")]:
        if len(obj[key]) != len(clean):
            raise DataError(f"{where}: clean has {len(clean)} tokens but {key} has {len(obj[key])}; "
                            "a corrupted prompt must have the same length as its clean prompt")
    for key in [k for k in obj if k not in ("positions", "spans")]:
        bad = [x for x in obj[key] if not 0 <= x < d_vocab]
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
