"""Text prompts made into a Dataset with the model's tokenizer (model.tokenizer).

Every source of text prompts (a template, a list in the hypothesis file, a JSONL file
of text rows) becomes a list of `TextPrompt`s, and `text_dataset` tokenises them the
same way: no special tokens, the BOS token put in front when asked for, one scored
position per prompt (the last token, or the last token before the template's `{@}`
marker), answer and wrong tokens given as strings that must each be one token.  Clean
and corrupted prompts must tokenise to the same length, and all prompts to one
length; every refusal shows the texts and their tokens.  docs/data-format.md
documents the rules and the messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..model.tokenizer import TextTokenizer
from . import dataset as data
from . import named_spans
from .dataset import Dataset, drop_duplicates, parse_line, read_lines, read_rows
from .text_settings import set_problem, spans_problem

DEFAULT = data.DEFAULT


@dataclass(frozen=True)
class TextPrompt:
    """One clean prompt with its corrupted prompts, as text.

    where:          names the prompt in messages (`file:line`, `h.yaml:7: data.prompts[2]`)
    answer:         the correct next token as a string, or a set of them (a tuple: every one right);
                    None: the token after the marker
    wrong:          the wrong token, or a set of them; None: none
    before_marker:  the clean text before the template's `{@}` marker; None: the last
                    token is scored
    where_answer, where_wrong: name the answer and wrong strings in messages
    filling:        the slot values, shown in messages (templates)
    slots:          each slot occurrence's surrounding text (data.text_settings.slot_spans), for the
                    token spans of named positions
    """

    where: str
    clean: str
    corruptions: dict[str, str]
    answer: str | tuple[str, ...] | None
    wrong: str | tuple[str, ...] | None
    where_answer: str
    where_wrong: str
    before_marker: str | None = None
    filling: str = ""
    slots: dict[str, tuple[str, str]] | None = None  # NAME#k -> (text before it, text through it): a template's
    # slot occurrences, or the named spans of a hand-written prompt (data.named_spans)


def _texts(p: TextPrompt) -> list[tuple[str, str, str]]:
    """(where, what, text) of every text of a prompt: the clean and corrupted prompts, answer and wrong."""
    how = f" ({p.filling})" if p.filling else ""
    out = [(p.where, f"the clean prompt{how}", p.clean)]
    out += [(p.where, "the corrupted prompt" if c == DEFAULT else f"corruption {c}", t)
            for c, t in p.corruptions.items()]
    ends = ((p.where_answer, "the answer", p.answer), (p.where_wrong, "the wrong token", p.wrong))
    out += [(w, what, t) for w, what, end in ends for t in members(end)]
    return out


def members(end: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The strings of an answer or wrong end: none, one, or a set's."""
    return () if end is None else (end,) if isinstance(end, str) else end


def answer_of(value: str | list[str] | None) -> str | tuple[str, ...] | None:
    """An answer or wrong end as data give it (a string, or a list: a set) as a TextPrompt holds it."""
    return tuple(value) if isinstance(value, list) else value


def _show(tok: TextTokenizer, ids: list[int]) -> str:
    return f"{len(ids)} tokens {tok.pieces(ids)}"


def _one_token(tok: TextTokenizer, text: str, ids: list[int], where: str, filling: str) -> int:
    if len(ids) != 1:
        how = f" ({filling})" if filling else ""
        raise DataError(f"{where}: {text!r}{how} is {len(ids)} tokens {tok.pieces(ids)}; an answer or wrong token "
                        "must be exactly one token of the model's tokenizer (multi-token answers are not scored): "
                        "choose a string that is one token, e.g. its first token")
    return ids[0]


def unknown_words(tok: TextTokenizer, text: str) -> list[str]:
    """The words of `text` (split at white space) that the tokenizer reads as its unknown token."""
    if tok.unk is None:
        return []
    words = text.split()
    found = [w for w, ids in zip(words, tok.encode(words), strict=True) if tok.unk in ids]
    return found or ([text] if tok.unk in tok.encode([text])[0] else [])


def check_known(tok: TextTokenizer, texts: list[tuple[str, str, str]]) -> None:
    """DataError for the first text that holds the tokenizer's unknown token: (where, what, text) name it."""
    if tok.unk is None:
        return
    encoded = tok.encode([t for _, _, t in texts])
    for (where, what, text), ids in zip(texts, encoded, strict=True):
        if tok.unk in ids:
            words = unknown_words(tok, text) or [text]
            raise DataError(f"{where}: {what} {text!r}: the tokenizer of {tok.model} does not know "
                            f"{', '.join(repr(w) for w in words)} (it becomes the unknown token "
                            f"{tok.piece(tok.unk)!r}): use words it knows, or set data.allow_unknown: true if the "
                            "unknown token is meant")


def text_dataset(prompts: list[TextPrompt], tok: TextTokenizer, prepend_bos: bool, d_vocab: int, *,
                 n_ctx: int | None, description: str, source: str, reference: list[str] | None = None,
                 where_reference: list[str] | None = None, allow_unknown: bool = False) -> Dataset:
    """Tokenise `prompts` into a Dataset (one scored position each).  `reference`: clean
    texts that per-position means are taken over (None: leave-one-out), named by
    `where_reference` in messages.  DataError for a token-length mismatch (clean vs
    corrupted, or between prompts, or a reference prompt), an answer or wrong string that
    is not one token, a marker inside a token, a token id the model does not have, or
    prompts longer than `n_ctx`, or (unless `allow_unknown`) text the tokenizer reads as its
    unknown token (check_known).  Prompts that repeat an earlier one are dropped
    (data.drop_duplicates, `source` naming the data)."""
    import torch

    if not allow_unknown:
        check_known(tok, [item for p in prompts for item in _texts(p)]
                    + [(where_reference[j] if where_reference is not None else f"reference prompt {j}",
                        "the reference prompt", t) for j, t in enumerate(reference or [])])

    names = list(prompts[0].corruptions)
    bos = [tok.bos] if prepend_bos and tok.bos is not None else []
    clean = [bos + ids for ids in tok.encode([p.clean for p in prompts])]
    corrupted = {c: [bos + ids for ids in tok.encode([p.corruptions[c] for p in prompts])] for c in names}
    marked = [i for i, p in enumerate(prompts) if p.before_marker is not None]
    before = dict(zip(marked, tok.encode([str(prompts[i].before_marker) for i in marked]), strict=True))
    strings = sorted({s for p in prompts for end in (p.answer, p.wrong) for s in members(end)})
    encoded = dict(zip(strings, tok.encode(strings), strict=True))
    positions, answers, wrong = [], [], []
    answer_sets: list[list[int]] = []  # every prompt's right (and wrong) set, a set of one where it gives one token
    wrong_sets: list[list[int]] = []
    for i, p in enumerate(prompts):
        ids = clean[i]
        if not ids:
            raise DataError(f"{p.where}: {p.clean!r} tokenises to no tokens")
        for c in names:
            other = corrupted[c][i]
            if len(other) != len(ids):
                label = "corrupted" if c == DEFAULT else f"corruption {c}"
                raise DataError(f"{p.where}: the clean and {label} prompts tokenise to different lengths; "
                                f"clean {p.clean!r}: {_show(tok, ids)}; {label} {p.corruptions[c]!r}: "
                                f"{_show(tok, other)}; a corrupted prompt must have as many tokens as its clean "
                                "prompt (choose values of the same token length)")
        for text, row in [(p.clean, ids)] + [(p.corruptions[c], corrupted[c][i]) for c in names]:
            outside = [t for t in row if not 0 <= t < d_vocab]
            if outside:
                raise DataError(f"{p.where}: {text!r} has token ids {outside[:3]} outside the model's vocabulary "
                                f"0..{d_vocab - 1}: the tokenizer does not fit the model")
        if i in before:
            pre = bos + before[i]
            if not before[i] or ids[:len(pre)] != pre:
                raise DataError(f"{p.where}: the marker {{@}} is not at a token boundary in {p.clean!r}: the text "
                                f"before it is {_show(tok, pre)}, the prompt {_show(tok, ids)}; put {{@}} where a "
                                "token ends (for BPE tokenizers: before the space of the next word)")
            pos = len(pre) - 1
            if p.answer is None and pos + 1 >= len(ids):
                raise DataError(f"{p.where}: nothing follows the marker {{@}} in {p.clean!r} to be the answer")
            answer = ids[pos + 1] if p.answer is None else None
        else:
            pos, answer = len(ids) - 1, None
        right = [answer] if answer is not None else _set_tokens(tok, p.answer, encoded, p.where_answer, p.filling)
        positions.append([pos])
        answers.append(right[:1])
        answer_sets.append(right)
        if p.wrong is not None:
            bad = _set_tokens(tok, p.wrong, encoded, p.where_wrong, p.filling)
            both = sorted(set(right) & set(bad))
            if both and not (isinstance(p.answer, str | None) and isinstance(p.wrong, str)):  # sets: disjoint
                raise DataError(f"{p.where_wrong}: {tok.pieces(both)} is both a right and a wrong answer")
            wrong.append(bad[:1])
            wrong_sets.append(bad)
    for token in [*(a for row in answer_sets for a in row), *(w for row in wrong_sets for w in row)]:
        if not 0 <= token < d_vocab:
            raise DataError(f"{source}: answer or wrong token {token} is outside the model's vocabulary "
                            f"0..{d_vocab - 1}")
    first = prompts[0]
    for i, p in enumerate(prompts):
        if len(clean[i]) != len(clean[0]):
            raise DataError(f"{p.where}: prompts tokenise to different lengths: {len(clean[0])} tokens for "
                            f"{first.clean!r} ({first.where}) but {len(clean[i])} for {p.clean!r}: "
                            f"{_show(tok, clean[0])} vs {_show(tok, clean[i])}; all prompts of a dataset must have "
                            "the same number of tokens")
    length = len(clean[0])
    if n_ctx is not None and length > n_ctx:
        raise DataError(f"{first.where}: prompts have {length} tokens; the model's context is {n_ctx} tokens")
    ref = None
    if reference is not None:
        rows = [bos + ids for ids in tok.encode(reference)]
        for j, row in enumerate(rows):
            label = where_reference[j] if where_reference is not None else f"reference prompt {j}"
            if len(row) != length:
                raise DataError(f"{label}: the reference prompt {reference[j]!r} is {_show(tok, row)}; the data's "
                                f"prompts have {length} tokens, e.g. {first.clean!r}: {_show(tok, clean[0])}")
            outside = [t for t in row if not 0 <= t < d_vocab]
            if outside:
                raise DataError(f"{label}: {reference[j]!r} has token ids {outside[:3]} outside the model's "
                                f"vocabulary 0..{d_vocab - 1}")
        ref = torch.tensor(rows, dtype=torch.long)

    def t(rows: list[list[int]]) -> Any:
        return torch.tensor(rows, dtype=torch.long)

    ds = Dataset(t(clean), {c: t(corrupted[c]) for c in names}, t(positions), t(answers), t(wrong) if wrong else None,
                 description, has_bos=bool(bos), reference=ref)
    if any(not isinstance(p.answer, str | None) or not isinstance(p.wrong, str | None) for p in prompts):
        ds.answer_sets, ds.wrong_sets = _padded(answer_sets), _padded(wrong_sets) if wrong else None
        sizes = sorted({len(r) for r in answer_sets})
        ds.description += (f"; sets of {sizes[0]}" + (f" to {sizes[-1]}" if len(sizes) > 1 else "")
                           + " right answers" + (" against sets of wrong ones" if wrong else ""))
    if ref is not None:
        shared = {tuple(r) for r in ref.tolist()} & {tuple(c) for c in clean}
        ds.shared_reference = sum(tuple(c) in shared for c in clean)
    if prompts[0].slots or any(p.slots for p in prompts):
        named = list(prompts[0].slots or {})
        for p in prompts:
            if list(p.slots or {}) != named:
                raise DataError(f"{p.where}: its named positions ({', '.join(p.slots or {}) or 'none'}) differ from "
                                f"the first prompt's ({', '.join(named) or 'none'}): every prompt names the same "
                                "ones, as often")
        ds.spans = _spans(prompts, clean, tok, bos)
    return drop_duplicates(ds, source, [p.where for p in prompts])


def _set_tokens(tok: TextTokenizer, end: str | tuple[str, ...] | None, encoded: dict[str, list[int]], where: str,
                filling: str) -> list[int]:
    """The token of each string of an answer or wrong end (each one token: _one_token); DataError where two
    strings of a set are the same token."""
    got = [_one_token(tok, text, encoded[text], where, filling) for text in members(end)]
    if len(set(got)) != len(got):
        twice = next(t for t in got if got.count(t) > 1)
        raise DataError(f"{where}: two answers of the set are the same token {tok.piece(twice)!r}")
    return got


def _padded(rows: list[list[int]]) -> Any:
    """[n, 1, S] token sets, padded with -1 to the largest set's size S."""
    import torch

    size = max(len(r) for r in rows)
    return torch.tensor([[r + [-1] * (size - len(r))] for r in rows], dtype=torch.long)


def _spans(prompts: list[TextPrompt], clean: list[list[int]], tok: TextTokenizer, bos: list[int]) -> dict[str, Any]:
    """{NAME#k: [n, 2]} the token span [start, end) of each slot occurrence in each prompt: the tokens
    of the text through it less those of the text before it (without its trailing space).  DataError
    when a slot's value does not begin and end at token boundaries (its tokens merge with the text
    around it)."""
    import torch

    keys = list(prompts[0].slots or {})
    out: dict[str, list[list[int]]] = {k: [] for k in keys}
    for p, ids in zip(prompts, clean, strict=True):
        parts = p.slots or {}
        texts = [t for k in keys for t in (parts[k][0].rstrip(), parts[k][1])]
        encoded = tok.encode([t for t in texts if t])
        it = iter(encoded)
        for k in keys:
            before_text = parts[k][0].rstrip()
            before = bos + (next(it) if before_text else [])
            through = bos + next(it)
            if ids[:len(before)] != before or ids[:len(through)] != through or len(through) <= len(before):
                raise DataError(f"{p.where}: slot occurrence {k} of {p.clean!r} does not begin and end at token "
                                f"boundaries (the text through it is {_show(tok, through)}, the prompt "
                                f"{_show(tok, ids)}), so it has no token span: attention claims cannot name it")
            out[k].append([len(before), len(through)])
    return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}


def first_row(path: Path) -> Any:
    """The first non-blank line of a JSONL file, parsed (data.parse_line); None when every
    line is blank.  DataError when the file is missing, unreadable or not UTF-8."""
    for lineno, line in enumerate(read_lines(path), 1):
        if line.strip():
            return parse_line(line, f"{path}:{lineno}")
    return None


def is_text_file(path: Path) -> bool:
    """Whether a JSONL prompt file holds text prompts: its first row has a "text" key."""
    row = first_row(path)
    return isinstance(row, dict) and "text" in row


TEXT_KEYS = ("text", "corrupted", "answer", "wrong", "spans")


def _check_text_row(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with keys {list(TEXT_KEYS)} (and corrupted_<name>)")
    if "clean" in obj:
        raise DataError(f"{where}: 'clean' (token ids) in a file of text prompts (its first row has 'text'): give "
                        "every row as text, or every row as token ids")
    data.check_keys(obj, where, list(TEXT_KEYS), ("text", "corrupted", "answer"))
    for key, value in obj.items():
        if key == "spans":
            bad = spans_problem(value)
            if bad:
                raise DataError(f"{where}: {bad}")
        elif key in ("answer", "wrong") and isinstance(value, list):
            bad = set_problem(value)
            if bad:
                raise DataError(f"{where}: '{key}': {bad}")
        elif not isinstance(value, str) or not value:
            raise DataError(f"{where}: '{key}' must be a non-empty string"
                            + (" or a list of them (a set of answers)" if key in ("answer", "wrong") else ""))
    return dict(obj, where=where)


def _check_text_reference(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or set(obj) != {"text"} or not isinstance(obj["text"], str) or not obj["text"]:
        raise DataError(f"{where}: a mean_from line of a text prompt file is a JSON object with one key, 'text' "
                        "(a non-empty string)")
    return dict(obj, where=where)


def load_text_jsonl(path: Path, tok: TextTokenizer, prepend_bos: bool, d_vocab: int, *, limit: int | None = None,
                    mean_from: Path | None = None, n_ctx: int | None = None,
                    allow_unknown: bool = False) -> Dataset:
    """Text prompts, one JSON object per line: {"text", "corrupted", "answer", "wrong"
    (optional), "corrupted_<name>" (optional, on every line or none), "spans" (optional: named
    positions, data.named_spans)}; the last token is scored.  `mean_from`: a JSONL file of
    {"text"} lines that means are taken over."""
    rows = read_rows(path, _check_text_row, limit)
    first = rows[0]
    extra = sorted(k for k in first if k.startswith("corrupted_"))
    if any(("wrong" in r) != ("wrong" in first) for r in rows):
        raise DataError(f"{path}: give 'wrong' on every line or on none")
    for r in rows:
        if sorted(k for k in r if k.startswith("corrupted_")) != extra:
            raise DataError(f"{r['where']}: corrupted_<name> keys differ from the first line's "
                            f"({', '.join(extra) or 'none'}); give the same ones on every line")
    def corruptions(r: dict[str, Any]) -> dict[str, str]:
        return {DEFAULT: r["corrupted"]} | {k[len("corrupted_"):]: r[k] for k in extra}

    prompts = [TextPrompt(r["where"], r["text"], corruptions(r),
                          answer_of(r["answer"]), answer_of(r.get("wrong")), f"{r['where']}: answer",
                          f"{r['where']}: wrong",
                          slots=named_spans.occurrences(r["text"], r["spans"], r["where"]) if "spans" in r else None)
               for r in rows]
    ref_rows = read_rows(mean_from, _check_text_reference) if mean_from is not None else None
    means = f"means over {mean_from.name}" if mean_from is not None else "means leave each prompt out"
    names = [DEFAULT] + [k[len("corrupted_"):] for k in extra]
    with_bos = ', BOS prepended' if prepend_bos else ', no BOS'
    desc = (f"text file {path.name}: {len(rows)} prompts{with_bos}; scored at the "
            f"last token; corruptions {', '.join(names)}; {means}")
    return text_dataset(prompts, tok, prepend_bos, d_vocab, n_ctx=n_ctx, description=desc, source=str(path),
                        reference=None if ref_rows is None else [r["text"] for r in ref_rows],
                        where_reference=None if ref_rows is None else [r["where"] for r in ref_rows],
                        allow_unknown=allow_unknown)
