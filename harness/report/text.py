"""Text that comes from input, made literal in Markdown (report.md, sweep.md).

Every string a report shows that it did not write itself (claim ids, descriptions,
hypothesis and model names, paths, labels, details strings, error messages; from a
run, or from an evidence.json or sweep.json received from someone else) goes
through one of these before it is put into Markdown:

* `md_text(s)`:  inline text.  No HTML (`<` and `&` become entities), no link,
                 image, reference, emphasis or code syntax, no line break: it shows
                 as exactly `s` (line breaks and runs of white space as one space,
                 other control characters dropped) in any CommonMark viewer and in
                 Python-Markdown.
* `md_block(s)`: the same, also safe at the start of a line (a paragraph).
* `md_cell(s)`:  the same, also safe inside a table cell (`|` escaped).
* `md_link_text(s)`: the same, as the text of a link (every bracket escaped).
* `md_code(s)`:  `s` as an inline code span, whatever backticks it holds.
* `plain(s)`:    one line for a terminal: no line breaks, no control characters
                 (so no terminal escape sequences).
* `literal_result(r)`: a copy of a claim result whose every string is `md_text`,
                 for the claim kinds' own `render` lines.

Only what could be markup is escaped: `\\`, backticks, `*`, `#`; `<` before a letter,
`/`, `!` or `?` (a tag, comment or autolink); `&` that would start an entity; `_` that
is not between letters or digits (it could be emphasis); `]` before `(`, `[` or `:`
(every link, image and reference needs one).  So the harness's own text
(`L0H7 -> L1H5.k`, `previous_token`, `CI [0.2, 0.3]`, `p <= 0.05`) reads as before.
"""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from typing import Any

from pydantic import BaseModel

from ..evidence.result import ClaimResult

_BREAKS = re.compile(r"[\s\u2028\u2029]*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029][\s\u2028\u2029]*")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_ALWAYS = {"\\": "\\\\", "`": "\\`", "*": "\\*", "#": "\\#", "<": "&lt;", "&": "&amp;"}
_SPECIAL = re.compile(r"[\\`*#]"
                      r"|<(?=[A-Za-z/!?])"  # `<` that could open a tag, a comment or an autolink
                      r"|&(?=#?[A-Za-z0-9]+;)"  # `&` that would start an entity
                      r"|_(?![^\W_])|(?<![^\W_])_"  # `_` unless between letters/digits (never emphasis)
                      r"|\](?=\s*[(\[:])")  # `]` that would end a link text or a reference label
_LEADING = re.compile(r"^(\s*)([-+>[]|\d+[.)])")  # list item, block quote, ordered list, reference definition


def _one_line(s: str) -> str:
    return _CONTROL.sub("", _BREAKS.sub(" ", s.replace("\t", " ")))


def plain(s: object) -> str:
    """`s` as one line of terminal text: line breaks as spaces, control characters removed."""
    return _one_line(str(s))


def md_text(s: object) -> str:
    """`s` as inline Markdown text that renders as exactly `s` (on one line)."""
    return _SPECIAL.sub(lambda m: _ALWAYS.get(m.group(), "\\" + m.group()), _one_line(str(s)))


def md_block(s: object) -> str:
    """`md_text(s)`, also literal at the start of a line (a paragraph of its own)."""
    out = md_text(str(s).strip())
    return _LEADING.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], out, count=1)


def md_cell(s: object) -> str:
    """`md_text(s)` for a table cell: a `|` in it does not end the cell."""
    return md_text(s).replace("|", "\\|")


def md_link_text(s: object) -> str:
    """`md_cell(s)` as the text of a link: every bracket escaped, so the text ends
    exactly where the link's own `]` is."""
    return re.sub(r"(?<!\\)((?:\\\\)*)([\[\]])", r"\1\\\2", md_cell(s))


def md_code(s: object) -> str:
    """`s` (on one line) as an inline code span: the fence is longer than any run of
    backticks inside it, so it always closes where it should."""
    text = _one_line(str(s))
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _literal(x: Any) -> Any:
    if isinstance(x, Enum) or not isinstance(x, (str, list, tuple, dict, BaseModel)):
        return x
    if isinstance(x, str):
        return md_text(x)
    if isinstance(x, BaseModel):
        return x.model_copy(update={name: _literal(getattr(x, name)) for name in type(x).model_fields})
    if isinstance(x, dict):
        return {_literal(k): _literal(v) for k, v in x.items()}
    return type(x)(_literal(v) for v in x)


def literal_result(r: ClaimResult) -> ClaimResult:
    """A copy of `r` in which every string (its own and its details', nested ones too,
    dictionary keys included) is `md_text` of it; numbers, flags and enums are kept."""
    fields = {f.name: _literal(getattr(r, f.name)) for f in dataclasses.fields(r) if f.name != "per_prompt"}
    return dataclasses.replace(r, **fields)
