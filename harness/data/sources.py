"""Data sources: the kinds of `data:` mapping a hypothesis file (or a data file) may hold, each
named by the one key its mapping must have, and how each becomes the Dataset a model runs on.

A source is one registered object (`DataSourceKind`): its key, its settings schema (a
data.settings.DataSettings, torch-free: a field named by the key, and the names of its
corruptions when they are known before the prompts are built), a one-line description for
messages, `build(settings, where, model)` -> data.dataset.Dataset, and `mean_reference(settings)`,
where mean ablation takes its per-position means, in words.  Built in:

    generator   repeated random tokens (data.settings.GeneratorData; data.dataset.repeated_tokens)
    file        a JSONL file of token ids or of text (data.settings.FileData)
    template    text with slots (data.text_settings.TemplateData; data.templates)
    prompts     a list of text prompts (data.text_settings.PromptsData)

`register(DataSourceKind(...))` adds another (tests/toy_data_source.py registers one from
outside the package): the hypothesis schema (hypothesis.document), `harness run`, `harness
scan --data` and `harness roles --data` pick it up.  Problems name the field through the
mapping's `where` (`h.yaml:5: data.template: ...`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .. import locations
from ..errors import SpecError
from ..model.loaded import LoadedModel
from ..model.tokenizer import TextTokenizer, require_tokenizer, start_token
from ..registry import Registry, RegistryError
from . import dataset as data
from . import named_spans, templates
from . import text as text_data
from .settings import DataSettings, FileData, GeneratorData
from .text import TextPrompt
from .text_settings import PromptsData, TemplateData


class Where(Protocol):
    """Where a data mapping came from: `where(key)` is the prefix naming a field in
    messages; `resolve(path)` makes a path in it absolute."""

    def where(self, key: str) -> str: ...

    def resolve(self, rel: str) -> Path: ...


@dataclass(frozen=True)
class FolderSource:
    """A data mapping built in code (e.g. for a prompt file named on the command line):
    fields are named as they are, paths resolve against `folder`."""

    folder: Path

    def where(self, key: str) -> str:
        return key

    def resolve(self, rel: str) -> Path:
        return locations.resolve(rel, self.folder)


@dataclass(frozen=True)
class DataSourceKind:
    """One kind of data mapping (module docstring)."""

    key: str  # the key that names it in a `data:` mapping
    settings: type[DataSettings]  # its schema
    text: str  # in words, for messages: "'generator' (built-in)"
    build: Callable[[Any, Where, LoadedModel], data.Dataset]
    mean_reference: Callable[[Any], str]


def _bos(setting: bool | None, tok: TextTokenizer, where: str, d_vocab: int) -> bool:
    """Whether to prepend the BOS token: the setting, or (None) what the tokenizer does by itself
    (TextTokenizer.adds_bos: Llama's does, GPT-2's and SmolLM2's do not), with the token inside the
    model's vocabulary (TransformerLens gives a tokenizer without one a stand-in that may lie outside it)."""
    if setting and tok.bos is None:
        raise SpecError([f"{where}: the tokenizer of {tok.model} has no BOS token; set prepend_bos: false"])
    return tok.adds_bos and tok.bos is not None and tok.bos < d_vocab if setting is None else setting


def generated(model: LoadedModel, n_prompts: int, segment_length: int, where: str, *, bos: bool | None = None,
              bos_token: int | None = None, **kwargs: Any) -> data.Dataset:
    """The repeated-token generator's prompts (data.repeated_tokens, `kwargs` passed on) with the start
    token every command uses: none when `bos` is false, else `bos_token`, else tokenizer.start_token
    (`where` names the setting in its errors)."""
    token = None if bos is False else bos_token if bos_token is not None else start_token(model, bos, where)
    return data.repeated_tokens(n_prompts, segment_length, model.d_vocab, bos=token is not None,
                                bos_token=token or 0, **kwargs)


def _generator(d: GeneratorData, source: Where, model: LoadedModel) -> data.Dataset:
    if d.bos_token is not None and d.bos_token >= model.d_vocab:
        raise SpecError([f"{source.where('data.bos_token')}: token {d.bos_token} is outside the model's "
                         f"vocabulary 0..{model.d_vocab - 1}"])
    ds = generated(model, d.n_prompts, d.segment_length, source.where("data.bos_token"), bos=d.bos,
                   bos_token=d.bos_token, seed=d.seed, split=d.split, vocab_min=d.vocab_min, vocab_max=d.vocab_max,
                   corruptions=tuple(d.corruptions), n_reference=d.n_reference, distinct=d.distinct)
    if ds.clean.shape[1] > model.n_ctx:
        raise SpecError([f"{source.where('data.segment_length')}: prompts of length "
                         f"{ds.clean.shape[1]} exceed the model's context {model.n_ctx}"])
    return ds


def _file(d: FileData, source: Where, model: LoadedModel) -> data.Dataset:
    path = source.resolve(d.file)
    mean_from = source.resolve(d.mean_from) if d.mean_from is not None else None
    if text_data.is_text_file(path):
        tok = require_tokenizer(model, source.where("data.file"))
        bos = _bos(d.prepend_bos, tok, source.where("data.prepend_bos"), model.d_vocab)
        return text_data.load_text_jsonl(path, tok, bos, model.d_vocab, limit=d.limit, mean_from=mean_from,
                                         n_ctx=model.n_ctx, allow_unknown=d.allow_unknown)
    if d.prepend_bos is not None:
        raise SpecError([f"{source.where('data.prepend_bos')}: applies to text prompts, and {path} holds token ids "
                         "(nothing is prepended to them): remove the key"])
    return data.load_jsonl(path, model.d_vocab, d.limit, mean_from, model.n_ctx)


def _template(d: TemplateData, source: Where, model: LoadedModel) -> data.Dataset:
    tok = require_tokenizer(model, source.where("data.template"))
    bos = _bos(d.prepend_bos, tok, source.where("data.prepend_bos"), model.d_vocab)
    if not d.allow_unknown:  # every value of every slot, drawn or not, alone and after a space
        text_data.check_known(tok, [(source.where(f"data.slots.{slot}"), f"slot {slot}: value", form)
                                    for slot, values in d.slots.items() for v in values
                                    for s in ([v] if isinstance(v, str) else v.values()) for form in (s, " " + s)])
    prompts, reference = templates.template_prompts(d, source.where)
    return text_data.text_dataset(prompts, tok, bos, model.d_vocab, n_ctx=model.n_ctx,
                                  description=templates.describe(d, len(reference)),
                                  source=source.where("data.template"), reference=reference,
                                  where_reference=[source.where("data.n_reference")] * len(reference),
                                  allow_unknown=d.allow_unknown)


def _prompts(d: PromptsData, source: Where, model: LoadedModel) -> data.Dataset:
    tok = require_tokenizer(model, source.where("data.prompts"))
    bos = _bos(d.prepend_bos, tok, source.where("data.prepend_bos"), model.d_vocab)
    rows = [TextPrompt(source.where(f"data.prompts[{i}]"), p.text, p.corruption_texts(), text_data.answer_of(p.answer),
                       text_data.answer_of(p.wrong),
                       source.where(f"data.prompts[{i}].answer"), source.where(f"data.prompts[{i}].wrong"),
                       slots=None if p.spans is None else named_spans.occurrences(
                           p.text, p.spans, source.where(f"data.prompts[{i}].spans")))
            for i, p in enumerate(d.prompts)]
    names = list(rows[0].corruptions)
    with_bos = ', BOS prepended' if bos else ', no BOS'
    desc = (f"prompts listed in the data: {len(rows)} text prompts{with_bos}; scored at "
            f"the last token; corruptions {', '.join(names)}; means leave each prompt out")
    return text_data.text_dataset(rows, tok, bos, model.d_vocab, n_ctx=model.n_ctx, description=desc,
                                  source=source.where("data.prompts"), allow_unknown=d.allow_unknown)


LEAVE_ONE_OUT = "the other clean prompts (leave-one-out), per position"


def _generator_means(d: GeneratorData) -> str:
    n = d.n_reference if d.n_reference is not None else d.n_prompts
    return f"{n} reference prompts (the generator's independent reference split), per position"


def _template_means(d: TemplateData) -> str:
    n = d.n_reference if d.n_reference is not None else d.n_prompts
    return f"{n} reference prompts (fillings of the template from its independent reference split), per position"


def _file_means(d: FileData) -> str:
    return f"the clean prompts of {Path(d.mean_from).name}, per position" if d.mean_from is not None else LEAVE_ONE_OUT


_BUILTIN = (
    DataSourceKind("generator", GeneratorData, "'generator' (built-in)", _generator, _generator_means),
    DataSourceKind("file", FileData, "'file' (JSONL of token ids or text)", _file, _file_means),
    DataSourceKind("template", TemplateData, "'template' (text with slots)", _template, _template_means),
    DataSourceKind("prompts", PromptsData, "'prompts' (a list of text prompts)", _prompts,
                   lambda d: LEAVE_ONE_OUT),
)
def _key_is_a_field(key: str, source: DataSourceKind) -> str | None:
    if key != source.key:
        return f"registered as {key!r} but its key is {source.key!r}"
    if key not in source.settings.model_fields:
        return (f"its schema {source.settings.__name__} must have a field {key!r} (the key that names the "
                f"source in a data mapping)")
    return None


_SOURCES: Registry[DataSourceKind] = Registry("data source", {s.key: s for s in _BUILTIN}, _key_is_a_field)


def kinds() -> dict[str, DataSourceKind]:
    """Every registered data source by key, built-in ones first (a copy)."""
    return _SOURCES.items()


def register(source: DataSourceKind) -> None:
    """Add a data source; its key must be new and its schema must have that key as a field."""
    _SOURCES.register(source.key, source)


def unregister(key: str) -> None:
    """Remove a data source added with `register` (the built-in ones stay)."""
    _SOURCES.unregister(key)


def of(settings: DataSettings) -> DataSourceKind:
    """The source whose schema `settings` is."""
    for s in _SOURCES:
        if type(settings) is s.settings:
            return s
    raise RegistryError(f"no data source has the schema {type(settings).__name__}")


def has_splits(settings: DataSettings) -> bool:
    """Whether the source draws its prompts from the named splits `explore` and `test`: its
    schema has a `split` field (the generator's and the template's do; a registered source may)."""
    return "split" in type(settings).model_fields


def on_split(settings: DataSettings, split: str | None = None) -> DataSettings:
    """`settings` as the exploring commands (`scan`, `discover`, `roles`) read them: on `split`
    when given, else on the split the mapping sets, else on `explore`, so that the `test` split
    stays held out for hypotheses.  A source without splits is returned as it is."""
    if has_splits(settings) and (split is not None or "split" not in settings.model_fields_set):
        return settings.model_copy(update={"split": split or "explore"})
    return settings


def allowed() -> str:
    """The keys that name a data source, in words (for messages)."""
    texts = [s.text for s in _SOURCES]
    return ", ".join(texts[:-1]) + f" or {texts[-1]}" if len(texts) > 1 else texts[0]
