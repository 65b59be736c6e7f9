"""Named positions of hand-written text prompts (a text JSONL file's rows, `data.prompts`): a row's
`spans` maps a name to where it is in the clean text, so attention claims (`{slot: NAME,
occurrence: k}`) and the head table's `attn NAME#k` columns work on prompts no template made.

    spans: {NAME: "John"}              every occurrence of the substring in the clean text, in
                                       reading order (non-overlapping): NAME#1, NAME#2, ...
    spans: {NAME: [[a, b], [c, d]]}    character offsets [a, b) into the clean text, in the order given

Each occurrence becomes (the text before it, the text through it), as a template's slot
occurrence does (data.text_settings.slot_spans), and data.text turns that into its token span;
data.text_settings.spans_problem checks a `spans` value's shape.
"""

from __future__ import annotations

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
