"""Text data mappings of a hypothesis file (pydantic): a template with slots, or a
list of text prompts.  Both are tokenised at run time with the model's own tokenizer
(data.text); here only their shape is checked, so `harness validate` stays
free of torch and tokenizers.  docs/data-format.md documents every key.

A template is text with slots `{NAME}` (or `{NAME.field}`: a field of a slot whose values are
records), at most one scored-position marker `{@}`, and `{{` / `}}` for literal braces
(parse_template).  A slot's values are strings, or records (mappings of field names to strings,
the same fields in each, one of them `text`): the values that go together (a name with its
pronoun, a country with its capital), drawn and replaced as one; `{NAME}` is a record's `text`."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, StrictBool, ValidationInfo, field_validator, model_validator

from ..spec.settings import Strict
from .settings import MAX_PROMPTS, DataSettings

SLOT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CORRUPTION_NAME = re.compile(r"^[A-Za-z0-9_]+$")
CORRUPTED_KEY = re.compile(r"^corrupted_[A-Za-z0-9_]+$")
NEW = "new"  # a corruption's replacement: a value of the slot's list that the clean prompt does not use


def new_field(to: str) -> str | None:
    """The field a `new.FIELD` replacement must change ("" for plain `new`; None: not a new value)."""
    if to == NEW:
        return ""
    return to[len(NEW) + 1:] if to.startswith(NEW + ".") else None
MARKER = "@"  # `{@}`: the scored position is the last token before it
_PART = re.compile(r"\{\{|\}\}|\{@\}|\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\}|[{}]")
TEXT = "text"  # the field of a record that `{NAME}` shows

Part = tuple[Literal["text", "slot", "marker"], str]
Value = str | dict[str, str]  # a slot's value: a string, or a record of fields (one of them `text`)


def text_of(value: Value) -> str:
    """What `{NAME}` shows of a value: the string, or the record's `text`."""
    return value if isinstance(value, str) else value[TEXT]


def placeholder(name: str) -> tuple[str, str]:
    """(slot, field) of a slot part's name: `S` -> (S, text), `S.pronoun` -> (S, pronoun)."""
    slot, _, field = name.partition(".")
    return slot, field or TEXT


def shown(value: Value, field: str) -> str:
    """The text a placeholder shows of `value`: its `field` (`text` of a string is the string)."""
    return text_of(value) if field == TEXT else value[field]  # type: ignore[index]  # fields are checked


def fields_of(values: Sequence[Value]) -> set[str]:
    """The fields a slot's values have: {text} for strings."""
    return {TEXT} if not values or isinstance(values[0], str) else set(values[0])


def parse_template(text: str) -> list[Part]:
    """The parts of a template string, in order: ("text", literal text), ("slot", NAME)
    for `{NAME}` (("slot", "NAME.field") for `{NAME.field}`), ("marker", "") for `{@}`; `{{` and
    `}}` are literal braces.  ValueError
    (naming the character) for any other brace."""
    parts: list[Part] = []
    buf, pos = [], 0
    for m in _PART.finditer(text):
        buf.append(text[pos:m.start()])
        token = m.group()
        pos = m.end()
        if token in ("{{", "}}"):
            buf.append(token[0])
            continue
        if token in ("{", "}"):
            raise ValueError(f"'{token}' at character {m.start() + 1} is not part of a slot: write {{NAME}} for a "
                             "slot (letters, digits, _) or {NAME.field} for a field of its records, {@} for the "
                             "scored position, {{ or }} for a literal brace")
        if buf and "".join(buf):
            parts.append(("text", "".join(buf)))
        buf = []
        parts.append(("marker", "") if token == "{@}" else ("slot", m.group(1)))
    buf.append(text[pos:])
    if "".join(buf):
        parts.append(("text", "".join(buf)))
    return parts


def render(parts: list[Part], values: dict[str, Value]) -> tuple[str, str | None]:
    """(the text with every slot filled and the marker removed, the text before the
    marker or None when there is none).  `values` maps a slot's name to its value, and may map
    one occurrence `NAME#k` (k from 1: its k-th placeholder in reading order, `{NAME}` or
    `{NAME.field}`) to a value of its own (a corruption of that occurrence alone)."""
    out: list[str] = []
    before: str | None = None
    for kind, value, k in _numbered(parts):
        if kind == "marker":
            before = "".join(out)
        elif kind == "slot":
            slot, field = placeholder(value)
            out.append(shown(values.get(f"{slot}#{k}", values[slot]), field))
        else:
            out.append(value)
    return "".join(out), before


def _numbered(parts: list[Part]) -> list[tuple[str, str, int]]:
    """The parts with each slot placeholder's occurrence k (from 1, per slot, in reading order; 0 for the rest)."""
    seen: dict[str, int] = {}
    out: list[tuple[str, str, int]] = []
    for kind, value in parts:
        if kind == "slot":
            slot = placeholder(value)[0]
            seen[slot] = seen.get(slot, 0) + 1
        out.append((kind, value, seen[placeholder(value)[0]] if kind == "slot" else 0))
    return out


def split_occurrence(key: str) -> tuple[str, int | None]:
    """(slot name, occurrence k or None) of a corruption's key: `S` or `S#2`."""
    name, sep, k = key.partition("#")
    return (name, int(k)) if sep and k.isdigit() and int(k) >= 1 else (name, None if not sep else -1)


def slot_spans(parts: list[Part], values: dict[str, Value]) -> dict[str, tuple[str, str]]:
    """For each occurrence of each slot, named `NAME#k` (k from 1: its k-th placeholder in reading
    order): (the filled text before it, the filled text through it), the marker removed."""
    out: dict[str, tuple[str, str]] = {}
    text = ""
    for kind, value, k in _numbered(parts):
        if kind == "slot":
            slot, field = placeholder(value)
            filled = shown(values.get(f"{slot}#{k}", values[slot]), field)
            out[f"{slot}#{k}"] = (text, text + filled)
            text += filled
        elif kind == "text":
            text += value
    return out


def occurrences(parts: list[Part], slot: str) -> int:
    """How often a parsed template uses slot `slot` (`{slot}` and `{slot.field}` alike)."""
    return sum(1 for k, v in parts if k == "slot" and placeholder(v)[0] == slot)


def slots_in(parts: list[Part]) -> list[str]:
    """The slot names a parsed template uses, in order of first use."""
    return list(dict.fromkeys(placeholder(v)[0] for k, v in parts if k == "slot"))


def unknown_fields(parts: list[Part], slots: Mapping[str, Sequence[Value]]) -> list[str]:
    """`{NAME.field}` placeholders whose slot's values have no such field, as `NAME.field`."""
    return [v for k, v in parts if k == "slot" and placeholder(v)[0] in slots
            and placeholder(v)[1] not in fields_of(slots[placeholder(v)[0]])]


def default_different(slots: Mapping[str, Sequence[Value]]) -> list[list[str]]:
    """The slots kept different when `different` is not given: each group of two or more
    slots whose value lists hold the same values (by their text)."""
    groups: dict[frozenset[str], list[str]] = {}
    for name, values in slots.items():
        groups.setdefault(frozenset(text_of(v) for v in values), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


class TemplateData(DataSettings):
    """Prompts made by filling a template's slots (data.templates); corrupted prompts
    replace slot values."""

    template: str = Field(min_length=1)
    slots: dict[str, list[str | dict[str, str]]] = Field(min_length=1)
    different: list[list[str]] | None = None
    answer: str | None = Field(None, min_length=1)
    wrong: str | None = Field(None, min_length=1)
    corruptions: dict[str, dict[str, str]] = Field(min_length=1)
    n_prompts: int = Field(200, ge=2, le=MAX_PROMPTS)
    n_reference: int | None = Field(None, ge=2, le=MAX_PROMPTS)
    prepend_bos: StrictBool | None = None
    allow_unknown: StrictBool = False  # text the tokenizer does not know is an error unless this is true
    seed: int = Field(0, ge=0)
    split: Literal["test", "explore"] = "test"

    @field_validator("template")
    @classmethod
    def _template(cls, v: str) -> str:
        parts = parse_template(v)
        kinds = [k for k, _ in parts]
        if kinds.count("marker") > 1:
            raise ValueError("the marker {@} is given more than once; give it once, after the scored token")
        if kinds and kinds[0] == "marker":
            raise ValueError("nothing comes before the marker {@}: it goes after the scored token")
        if not any(k == "slot" for k in kinds):
            raise ValueError("the template has no slot {NAME}: with fixed text, give the prompts as a list "
                             "(data.prompts)")
        return v

    @field_validator("slots")
    @classmethod
    def _slots(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        for name, values in v.items():
            if not SLOT_NAME.match(name) or name == NEW:
                raise ValueError(f"slot name {name!r}: letters, digits and _, not starting with a digit, and not "
                                 f"{NEW!r} (a corruption's keyword)")
            if not values:
                raise ValueError(f"slot {name!r} has no values")
            _records(name, values)
            empty = [x for x in values if not text_of(x)]
            if empty:
                raise ValueError(f"slot {name!r} has an empty value")
            twice = sorted(x for x, n in Counter(text_of(x) for x in values).items() if n > 1)
            if twice:
                raise ValueError(f"slot {name!r} lists {twice[0]!r} twice")
        template = info.data.get("template")
        if template is not None:
            parts = parse_template(template)
            used = slots_in(parts)
            undefined = [s for s in used if s not in v]
            if undefined:
                raise ValueError(f"the template uses slot(s) {', '.join(undefined)} that 'slots' does not define; "
                                 f"defined: {', '.join(v)}")
            unused = [s for s in v if s not in used]
            if unused:
                raise ValueError(f"slot(s) {', '.join(unused)} are not used in the template")
            _no_unknown_fields(parts, v, "the template")
        return v

    @field_validator("different")
    @classmethod
    def _different(cls, v: list[list[str]] | None, info: ValidationInfo) -> list[list[str]] | None:
        slots = info.data.get("slots")
        for group in v or []:
            if len(group) < 2 or len(set(group)) != len(group):
                raise ValueError(f"{group}: a group names two or more different slots")
            unknown = [s for s in group if slots is not None and s not in slots]
            if unknown:
                raise ValueError(f"{group}: {', '.join(unknown)} is not a slot; slots: {', '.join(slots or [])}")
        return v

    @field_validator("answer", "wrong")
    @classmethod
    def _answer(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        parts = parse_template(v)
        if any(k == "marker" for k, _ in parts):
            raise ValueError("the marker {@} belongs in the template, not here")
        slots = info.data.get("slots")
        unknown = [s for s in slots_in(parts) if slots is not None and s not in slots]
        if unknown:
            raise ValueError(f"uses slot(s) {', '.join(unknown)} that 'slots' does not define")
        if slots is not None:
            _no_unknown_fields(parts, slots, "it")
        return v

    @field_validator("corruptions")
    @classmethod
    def _corruptions(cls, v: dict[str, dict[str, str]], info: ValidationInfo) -> dict[str, dict[str, str]]:
        slots = info.data.get("slots")
        for name, changes in v.items():
            if not CORRUPTION_NAME.match(name):
                raise ValueError(f"corruption name {name!r}: letters, digits and _ only")
            if not changes:
                raise ValueError(f"corruption {name!r} changes no slot: map slots to '{NEW}' or to another slot")
            for key, to in changes.items():
                if slots is None:
                    continue
                slot, k = split_occurrence(key)
                if k == -1:
                    raise ValueError(f"corruption {name!r}: {key!r}: an occurrence is written NAME#k with k = 1, 2, "
                                     f"... (S#2: the second S)")
                if slot not in slots:
                    raise ValueError(f"corruption {name!r}: {slot!r} is not a slot; slots: {', '.join(slots)}")
                field = new_field(to)
                if field:  # new.FIELD: a field of the slot's records
                    fields = sorted(fields_of(slots[slot]) - {TEXT})
                    if field not in fields:
                        raise ValueError(f"corruption {name!r}: {slot}: {to!r}: {slot}'s values have "
                                         + (f"the fields {', '.join(fields)}" if fields else "no fields but text")
                                         + f" ('{NEW}.FIELD' draws a value whose FIELD differs from the clean one's)")
                elif field is None and (to not in slots or to == slot):
                    raise ValueError(f"corruption {name!r}: {slot}: {to!r} must be '{NEW}' (a value of {slot}'s list "
                                     f"that the clean prompt does not use), '{NEW}.FIELD' (one whose record field "
                                     f"FIELD differs too) or another slot's name (its clean value); "
                                     f"slots: {', '.join(slots)}")
        return v

    @model_validator(mode="after")
    def _scored(self) -> TemplateData:
        parts = parse_template(self.template)
        kinds = [k for k, _ in parts]
        if "marker" not in kinds and self.answer is None:
            raise ValueError("give 'answer' (the correct next token after the prompt), or mark the scored token "
                             "with {@} and let the text after it give the answer")
        for name, changes in self.corruptions.items():  # an occurrence the template has
            for key in changes:
                slot, k = split_occurrence(key)
                if k is not None and k > occurrences(parts, slot):
                    raise ValueError(f"corruption {name!r}: {key!r}: the template uses {slot} "
                                     f"{occurrences(parts, slot)} time(s)")
                if k is not None and slot in changes:
                    raise ValueError(f"corruption {name!r}: {key!r} and {slot!r}: change the slot or one of its "
                                     "occurrences, not both")
        if "marker" in kinds and self.answer is None and kinds[-1] == "marker":
            raise ValueError("nothing comes after the marker {@} to be the answer: give 'answer', or continue the "
                             "template after {@}")
        return self

    def corruption_names(self) -> list[str] | None:
        """The names claims may give as `corruption:` (the first is the default)."""
        return list(self.corruptions)

    def groups(self) -> list[list[str]]:
        """The groups of slots that take different values in one prompt."""
        return self.different if self.different is not None else default_different(self.slots)


def _records(name: str, values: Sequence[Value]) -> None:
    """ValueError unless a slot's values are all strings, or all records with the same fields, one of
    them `text`, each field a name (letters, digits, _) holding a non-empty string."""
    if all(isinstance(x, str) for x in values):
        return
    first = values[0]
    if isinstance(first, str) or any(isinstance(x, str) for x in values):
        raise ValueError(f"slot {name!r} mixes strings and records: give every value as a string, or every one "
                         f"as a record ({{{TEXT}: ..., FIELD: ...}})")
    if TEXT not in first:
        raise ValueError(f"slot {name!r}: a record needs a '{TEXT}' field (what {{{name}}} shows); it has "
                         f"{', '.join(first)}")
    for i, x in enumerate(values):
        if set(x) != set(first):
            raise ValueError(f"slot {name!r}: record {i + 1} has fields {', '.join(x)}, record 1 has "
                             f"{', '.join(first)}: give every record the same fields")
        bad = [f for f, s in x.items() if not SLOT_NAME.match(f) or not s]  # type: ignore[union-attr]
        if bad:
            raise ValueError(f"slot {name!r}: record {i + 1}: field {bad[0]!r} needs a name of letters, digits and _ "
                             "and a non-empty string")


def _no_unknown_fields(parts: list[Part], slots: Mapping[str, Sequence[Value]], what: str) -> None:
    unknown = unknown_fields(parts, slots)
    if unknown:
        slot = placeholder(unknown[0])[0]
        raise ValueError(f"{what} uses {{{unknown[0]}}}, but the values of slot {slot} have the field(s) "
                         f"{', '.join(sorted(fields_of(slots[slot])))}")


def spans_problem(value: Any) -> str | None:
    """What is wrong with a text prompt's `spans` value (data.named_spans; None when it is well formed)."""
    if not isinstance(value, dict) or not value:
        return "'spans' maps names to a substring of the text or a list of [start, end] character offsets"
    for name, where in value.items():
        if not isinstance(name, str) or not SLOT_NAME.match(name):
            return f"spans: name {name!r}: letters, digits and _, not starting with a digit"
        pairs = isinstance(where, list) and where and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
            for p in where)
        if not (isinstance(where, str) and where) and not pairs:
            return (f"spans.{name}: a non-empty substring of the text, or a list of [start, end] character offsets "
                    f"(got {where!r})")
    return None


def set_problem(values: Any) -> str | None:
    """What is wrong with a set of answers given as a list (None when it is a list of distinct non-empty
    strings, at least one)."""
    if not isinstance(values, list) or not values:
        return "a set of answers is a non-empty list of strings"
    if not all(isinstance(v, str) and v for v in values):
        return "every answer in a set is a non-empty string"
    if len(set(values)) != len(values):
        twice = next(v for v in values if values.count(v) > 1)
        return f"the set gives {twice!r} twice"
    return None


class TextPrompt(Strict, extra="allow"):
    """One prompt of `data.prompts`: the clean text, its corrupted text(s) and the answer."""

    __pydantic_extra__: dict[str, Any] = Field(init=False)  # corrupted_<name>: more corruptions (checked below)

    text: str = Field(min_length=1)
    corrupted: str = Field(min_length=1)
    answer: str | list[str] = Field(min_length=1)  # a list: a set of right answers (metric prob_diff)
    wrong: str | list[str] | None = Field(None, min_length=1)
    spans: dict[str, Any] | None = None  # named positions (data.named_spans)

    @field_validator("answer", "wrong")
    @classmethod
    def _set(cls, v: str | list[str] | None) -> str | list[str] | None:
        problem = None if v is None or isinstance(v, str) else set_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("spans")
    @classmethod
    def _spans(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        bad = None if v is None else spans_problem(v)
        if bad:
            raise ValueError(bad)
        return v

    @model_validator(mode="after")
    def _extra_keys(self) -> TextPrompt:
        extra = self.__pydantic_extra__ or {}
        if "corrupted_default" in extra:
            raise ValueError("'corrupted_default' would replace the default corruption: give that prompt as "
                             "'corrupted'")
        unknown = sorted(k for k in extra if not CORRUPTED_KEY.match(k))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}; allowed: text, corrupted, answer, wrong, spans and "
                             "corrupted_<name> (letters, digits, _)")
        bad = sorted(k for k, t in extra.items() if not isinstance(t, str) or not t)
        if bad:
            raise ValueError(f"{bad[0]} must be a non-empty string (a corrupted prompt)")
        return self

    def corruption_texts(self) -> dict[str, str]:
        """{corruption name: corrupted text}: `default` first, then corrupted_<name> in sorted order."""
        extra = self.__pydantic_extra__ or {}
        return {"default": self.corrupted} | {k[len("corrupted_"):]: extra[k] for k in sorted(extra)}


class PromptsData(DataSettings):
    """A list of text prompts given in the hypothesis file."""

    prompts: list[TextPrompt] = Field(min_length=2, max_length=MAX_PROMPTS)
    prepend_bos: StrictBool | None = None
    allow_unknown: StrictBool = False  # text the tokenizer does not know is an error unless this is true

    @model_validator(mode="after")
    def _same_keys(self) -> PromptsData:
        first = self.prompts[0]
        for i, p in enumerate(self.prompts):
            if list(p.corruption_texts()) != list(first.corruption_texts()):
                raise ValueError(f"prompts[{i}] has corrupted_<name> keys {sorted(p.__pydantic_extra__ or {})}, "
                                 f"prompts[0] has {sorted(first.__pydantic_extra__ or {})}: give the same ones "
                                 "on every prompt")
            if (p.wrong is None) != (first.wrong is None):
                raise ValueError("give 'wrong' on every prompt or on none")
        return self

    def corruption_names(self) -> list[str] | None:
        """`default` (the `corrupted` texts) and one per corrupted_<name> key."""
        return list(self.prompts[0].corruption_texts())
