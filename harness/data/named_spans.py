"""Named positions of hand-written text prompts (a text JSONL file's rows, `data.prompts`): a row's
`spans` maps a name to where it is in the clean text, so attention claims (`{slot: NAME,
occurrence: k}`) and the head table's `attn NAME#k` columns work on prompts no template made.

    spans: {NAME: "John"}              every occurrence of the substring in the clean text, in
                                       reading order (non-overlapping): NAME#1, NAME#2, ...
    spans: {NAME: [[a, b], [c, d]]}    character offsets [a, b) into the clean text, in the order given

Each occurrence becomes (the text before it, the text through it), as a template's slot
occurrence does (data.text_settings.slot_spans), and data.text turns that into its token span;
data.text_settings.spans_problem checks a `spans` value's shape.  A token-id JSONL file's rows give
token offsets instead (`token_spans`): {NAME: [[start, end], ...]}, the tokens [start, end) of each
occurrence.
"""

from __future__ import annotations

from typing import Any

from ..errors import DataError

Spans = dict[str, str | list[list[int]]]


def occurrences(text: str, spans: Spans, where: str) -> dict[str, tuple[str, str]]:
    """{NAME#k: (text before it, text through it)} of every named occurrence in `text` (module
    docstring); DataError (prefixed `where`) for a substring that does not occur or offsets outside it."""
    out: dict[str, tuple[str, str]] = {}
    for name, at in spans.items():
        if isinstance(at, str):
            found, start = [], text.find(at)
            while start >= 0:
                found.append([start, start + len(at)])
                start = text.find(at, start + len(at))
            if not found:
                raise DataError(f"{where}: spans.{name}: {at!r} does not occur in the clean text {text!r}")
        else:
            found = at
            bad = [p for p in found if not 0 <= p[0] < p[1] <= len(text)]
            if bad:
                raise DataError(f"{where}: spans.{name}: [{bad[0][0]}, {bad[0][1]}] is not a span of the clean text "
                                f"(0 <= start < end <= {len(text)})")
        for k, (a, b) in enumerate(found, 1):
            out[f"{name}#{k}"] = (text[:a], text[:b])
    return out


def token_spans(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """{NAME#k: [n, 2]} of a token-id JSONL file's rows, each of whose `spans` maps a name to token
    offsets [[start, end), ...] (in the order given: NAME#1, NAME#2, ...); {} where no row gives spans.
    DataError (naming the row) for a span outside the prompt, a row without spans where others have
    them, or other names or counts than the first row's."""
    import torch

    if not any("spans" in r for r in rows):
        return {}
    out: dict[str, list[list[int]]] = {}
    first: list[str] | None = None
    for r in rows:
        spans = r.get("spans")
        if not isinstance(spans, dict) or not spans:
            raise DataError(f"{r['where']}: no 'spans' where other lines give them: give them on every line")
        keys = []
        for name, at in spans.items():
            if (not isinstance(name, str) or not name.replace("_", "").isalnum() or not isinstance(at, list) or not at
                    or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p) for p in at)):
                raise DataError(f"{r['where']}: spans.{name}: a list of [start, end] token offsets (NAME: letters, "
                                "digits, _)")
            bad = [p for p in at if not 0 <= p[0] < p[1] <= len(r["clean"])]
            if bad:
                raise DataError(f"{r['where']}: spans.{name}: [{bad[0][0]}, {bad[0][1]}] is not a span of the prompt "
                                f"(0 <= start < end <= {len(r['clean'])})")
            for k, p in enumerate(at, 1):
                keys.append(f"{name}#{k}")
                out.setdefault(f"{name}#{k}", []).append(p)
        if first is None:
            first = keys
        elif keys != first:
            raise DataError(f"{r['where']}: its named positions ({', '.join(keys)}) differ from the first line's "
                            f"({', '.join(first)}): every line names the same ones, as often")
    return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
