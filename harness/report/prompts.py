"""The report's "Prompts" section: the first prompts of the data (evidence
`data.examples`), as text (or token ids) with the scored tokens in bold and the answers
they should predict.  Every token comes from input and is made literal (report.text)."""

from __future__ import annotations

import itertools
from typing import Any

from .text import md_code, md_text


def _token(t: Any) -> str:
    return t if isinstance(t, str) else str(t)


def _prompt(tokens: list[Any], positions: list[Any]) -> str:
    """One prompt on one line: text segments joined (token ids separated by spaces), each
    run of scored tokens in bold, with the white space around it outside the bold."""
    sep = "" if all(isinstance(t, str) for t in tokens) else " "
    scored = {p for p in positions if isinstance(p, int)}
    out = []
    for bold, run in itertools.groupby(enumerate(tokens), key=lambda it: it[0] in scored):
        s = sep.join(_token(t) for _, t in run)
        if not bold:
            out.append(md_text(s))
            continue
        core = s.strip()
        lead, trail = s[:len(s) - len(s.lstrip())], s[len(s.rstrip()):]
        out.append(f"{md_text(lead)}**{md_text(core) if core else md_code(s)}**{md_text(trail)}")
    return sep.join(out)


def _answers(tokens: list[Any]) -> str:
    return ", ".join(md_code(_token(t)) for t in tokens)


def prompt_lines(examples: Any, n_prompts: Any) -> list[str]:
    """The "Prompts" section (empty when the evidence has no examples)."""
    if not isinstance(examples, list) or not examples:
        return []
    as_text = all(isinstance(t, str) for e in examples for t in e.get("clean", []))
    how = "as the model's tokenizer reads them" if as_text else "as token ids (the model has no tokenizer)"
    out = ["### Prompts", "",
           f"The first {len(examples)} of {md_text(n_prompts)} prompts, {how}; the scored token in bold, then the "
           "answer it should predict (and the wrong token, when the data gives one). Every run scores the same "
           "positions and answers.", ""]
    for i, e in enumerate(examples, 1):
        positions = e.get("positions", [])
        wrong = e.get("wrong")
        line = f"{i}. clean: {_prompt(e.get('clean', []), positions)} → {_answers(e.get('answers', []))}"
        if wrong:
            line += f" (wrong: {_answers(wrong)})"
        out.append(line)
        for name, tokens in (e.get("corrupted") or {}).items():
            out.append(f"    - {md_text(name)}: {_prompt(tokens, positions)}")
    return out + [""]
