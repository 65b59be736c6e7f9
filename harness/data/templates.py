"""Filling a template's slots (data.text_settings.TemplateData) into text prompts.

The clean prompts are `n_prompts` distinct fillings (one value per slot, the slots of a
`different` group taking different values), drawn without replacement with a
torch.Generator seeded from the data's `seed` and `split` (data.split_seed), so the same
file gives the same prompts everywhere.  Each corruption replaces slot values of the
clean filling: `new` draws a value of that slot's list that no slot of the clean prompt
uses (and no other `new` of the same corruption), from the corruption's own stream; a
slot name takes that slot's clean value.  A corruption may change one occurrence of a slot
(`S#2`: the second S in reading order) and leave the others clean (Wang et al.'s S2
corruption of IOI).  Reference prompts for means are
`n_reference` distinct fillings from the independent `reference` stream.  The prompts
are tokenised by data.text.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from ..errors import DataError
from .dataset import split_seed
from .text import TextPrompt
from .text_settings import (
    NEW,
    TemplateData,
    Value,
    new_field,
    parse_template,
    render,
    shown,
    slot_spans,
    split_occurrence,
    text_of,
)

ENUMERATE_AT_MOST = 200_000  # fillings listed in full below this many combinations; sampled above
Filling = tuple[int, ...]  # an index into each slot's value list, in the order of `slots`


def _groups(d: TemplateData) -> list[list[int]]:
    """The `different` groups as slot indices whose values must differ as strings."""
    order = list(d.slots)
    return [[order.index(s) for s in g] for g in d.groups()]


def _distinct_values(d: TemplateData, groups: list[list[int]]) -> Callable[[Filling], bool]:
    values = list(d.slots.values())

    def ok(f: Filling) -> bool:
        return all(len({text_of(values[s][f[s]]) for s in g}) == len(g) for g in groups)
    return ok


def draw_fillings(d: TemplateData, n: int, seed: int, where: str) -> list[Filling]:
    """`n` distinct fillings, each keeping the `different` groups apart, in the order drawn.
    Up to ENUMERATE_AT_MOST combinations: every valid filling is listed and a seeded
    permutation picks `n` of them; above, fillings are drawn slot by slot and repeats and
    invalid ones drawn again.  DataError (prefixed `where`) when there are fewer than `n`."""
    import torch

    sizes = [len(v) for v in d.slots.values()]
    ok = _distinct_values(d, _groups(d))
    g = torch.Generator().manual_seed(seed)
    total = math.prod(sizes)
    if total <= ENUMERATE_AT_MOST:
        every = [f for f in itertools.product(*(range(s) for s in sizes)) if ok(f)]
        if n > len(every):
            kept = "; ".join(", ".join(grp) + " different" for grp in d.groups())
            raise DataError(f"{where}: {n} prompts asked for, but the template has only {len(every)} distinct "
                            f"fillings ({' x '.join(f'{k} {len(v)}' for k, v in d.slots.items())} values"
                            f"{'; ' + kept if kept else ''}): lower the number or add slot values")
        return [every[i] for i in torch.randperm(len(every), generator=g)[:n].tolist()]
    seen: set[Filling] = set()
    out: list[Filling] = []
    for _ in range(100 * n):
        f = tuple(int(torch.randint(s, (1,), generator=g)) for s in sizes)
        if f not in seen and ok(f):
            seen.add(f)
            out.append(f)
            if len(out) == n:
                return out
    raise DataError(f"{where}: found only {len(out)} distinct fillings of the template in {100 * n} draws; "
                    "the 'different' groups leave too few: lower the number or add slot values")


def _corrupt(d: TemplateData, name: str, clean: dict[str, Value], g: Any, where: str) -> dict[str, Value]:
    import torch

    out = dict(clean)
    taken = {text_of(v) for v in clean.values()}
    for key, to in d.corruptions[name].items():  # a slot, or one occurrence of it (S#2)
        slot, _ = split_occurrence(key)
        field = new_field(to)
        if field is None:
            out[key] = clean[to]
            continue
        own = clean[slot]
        choices = [v for v in d.slots[slot] if text_of(v) not in taken
                   and (not field or shown(v, field) != shown(own, field))]
        if not choices:
            also = f" with a {field} other than {shown(own, field)!r}" if field else ""
            raise DataError(f"{where}: corruption {name!r}: slot {slot} has no value left for '{to}' in the "
                            f"prompt with {_filling_text(clean)}: every value of its list{also} is used by the "
                            "clean prompt (or another new value); add values to the slot's list")
        out[key] = choices[int(torch.randint(len(choices), (1,), generator=g))]
        taken.add(text_of(out[key]))
    return out


def _filling_text(values: dict[str, Value]) -> str:
    return ", ".join(f"{k} = {text_of(v)!r}" for k, v in values.items())


def template_prompts(d: TemplateData, where: Callable[[str], str]) -> tuple[list[TextPrompt], list[str]]:
    """(the prompts, the reference texts): `n_prompts` fillings with their corruptions, and
    `n_reference` (default `n_prompts`) reference fillings.  `where(key)` is the prefix that
    names a field of the data mapping in messages (`h.yaml:5: data.template`)."""
    import torch

    parts = parse_template(d.template)
    answer_parts = parse_template(d.answer) if d.answer is not None else None
    wrong_parts = parse_template(d.wrong) if d.wrong is not None else None
    names = list(d.slots)
    streams = {c: torch.Generator().manual_seed(split_seed(d.seed, f"{d.split}/corruption/{c}"))
               for c in d.corruptions}
    prompts = []
    for f in draw_fillings(d, d.n_prompts, split_seed(d.seed, d.split), where("data.n_prompts")):
        values: dict[str, Value] = {s: d.slots[s][i] for s, i in zip(names, f, strict=True)}
        text, before = render(parts, values)
        corrupted = {c: render(parts, _corrupt(d, c, values, streams[c], where("data.corruptions")))[0]
                     for c in d.corruptions}
        prompts.append(TextPrompt(
            f"{where('data.template')} ({_filling_text(values)})", text, corrupted,
            None if answer_parts is None else render(answer_parts, values)[0],
            None if wrong_parts is None else render(wrong_parts, values)[0],
            where("data.answer"), where("data.wrong"), before, _filling_text(values), slot_spans(parts, values)))
    n_ref = d.n_reference if d.n_reference is not None else d.n_prompts
    reference = [render(parts, {s: d.slots[s][i] for s, i in zip(names, f, strict=True)})[0]
                 for f in draw_fillings(d, n_ref, split_seed(d.seed, "reference"), where("data.n_reference"))]
    return prompts, reference


def describe(d: TemplateData, n_reference: int) -> str:
    """The data's description (evidence `data.description`)."""
    def change(slot: str, to: str) -> str:
        field = new_field(to)
        return (f"{slot} = clean {to}" if field is None else f"{slot} {NEW}" if not field
                else f"{slot} {NEW} with another {field}")

    corruptions = "; ".join(f"corruption {c}: " + ", ".join(change(s, t) for s, t in ch.items())
                            for c, ch in d.corruptions.items())
    scored = ("the last token before {@}" if any(k == "marker" for k, _ in parse_template(d.template))
              else "the last token")
    return (f"template {d.template!r}: {d.n_prompts} distinct fillings of slots {', '.join(d.slots)}, seed {d.seed}, "
            f"split {d.split}; scored at {scored}; {corruptions}; means over {n_reference} reference prompts")
