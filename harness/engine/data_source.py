"""A `data:` mapping (generator, token-id or text file, template, list of text prompts)
made into the Dataset a model runs on.  `harness run` gives it the hypothesis file's
mapping; `harness scan` and `harness roles` a data file's (hypothesis.loading.load_data_file) or a
prompt file's.  Problems name the field through the source's `where`
(`h.yaml:5: data.template: ...`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import locations
from ..errors import SpecError
from ..hypothesis.loading import load_data_file
from ..model import data, templates, text_data
from ..model.loading import LoadedModel
from ..model.text_data import TextPrompt
from ..model.tokenizer import TextTokenizer, require_tokenizer
from ..spec.settings import FileData, GeneratorData
from ..spec.text_data import PromptsData, TemplateData

DataSpec = GeneratorData | FileData | TemplateData | PromptsData


class DataSource(Protocol):
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


def _bos(setting: bool | None, tok: TextTokenizer, where: str, d_vocab: int) -> bool:
    """Whether to prepend the BOS token: the setting, or (None) whether the tokenizer has one
    inside the model's vocabulary (TransformerLens gives a tokenizer without one a stand-in
    that may lie outside it)."""
    if setting and tok.bos is None:
        raise SpecError([f"{where}: the tokenizer of {tok.model} has no BOS token; set prepend_bos: false"])
    return tok.bos is not None and tok.bos < d_vocab if setting is None else setting


def build_dataset(d: DataSpec, source: DataSource, model: LoadedModel) -> data.Dataset:
    """The prompts of data mapping `d` for `model` (model.data.Dataset), with every answer and
    wrong token inside the model's output vocabulary."""
    ds = _build(d, source, model)
    check_output_vocab(ds, model.d_vocab_out, source.where("data"), isinstance(d, GeneratorData))
    return ds


def check_output_vocab(ds: data.Dataset, d_vocab_out: int, where: str, generated: bool) -> None:
    """Raise SpecError when an answer or wrong token id lies outside the output vocabulary
    0..d_vocab_out-1 (a model whose unembedding is narrower than its embedding)."""
    for name, ids in (("answer", ds.answers), ("wrong", ds.wrong)):
        if ids is None:
            continue
        outside = (ids < 0) | (ids >= d_vocab_out)
        if bool(outside.any()):
            n, k = (int(i) for i in outside.nonzero()[0])
            hint = (f"; set data.vocab_max: {d_vocab_out} so that every token can be an answer" if generated
                    else "")
            raise SpecError([f"{where}: prompt {n}: {name} token {int(ids[n, k])} is outside the model's output "
                             f"vocabulary 0..{d_vocab_out - 1} (d_vocab_out {d_vocab_out}){hint}"])


def _build(d: DataSpec, source: DataSource, model: LoadedModel) -> data.Dataset:
    if isinstance(d, GeneratorData):
        if d.bos_token is not None and d.bos_token >= model.d_vocab:
            raise SpecError([f"{source.where('data.bos_token')}: token {d.bos_token} is outside the model's "
                             f"vocabulary 0..{model.d_vocab - 1}"])
        if d.segment_length * 2 + int(d.bos) > model.n_ctx:
            raise SpecError([f"{source.where('data.segment_length')}: prompts of length "
                             f"{d.segment_length * 2 + int(d.bos)} exceed the model's context "
                             f"{model.n_ctx}"])
        return data.repeated_tokens(d.n_prompts, d.segment_length, model.d_vocab, d.seed, d.split,
                                    d.bos, d.vocab_min, d.vocab_max,
                                    d.bos_token if d.bos_token is not None else model.bos_token,
                                    tuple(d.corruptions), d.n_reference, distinct=d.distinct)
    if isinstance(d, FileData):
        path = source.resolve(d.file)
        mean_from = source.resolve(d.mean_from) if d.mean_from is not None else None
        if text_data.is_text_file(path):
            tok = require_tokenizer(model, source.where("data.file"))
            bos = _bos(d.prepend_bos, tok, source.where("data.prepend_bos"), model.d_vocab)
            return text_data.load_text_jsonl(path, tok, bos, model.d_vocab, d.limit, mean_from, model.n_ctx)
        if d.prepend_bos is not None:
            raise SpecError([f"{source.where('data.prepend_bos')}: applies to text prompts, and {path} holds token ids "
                             "(nothing is prepended to them): remove the key"])
        return data.load_jsonl(path, model.d_vocab, d.limit, mean_from, model.n_ctx)
    if isinstance(d, TemplateData):
        tok = require_tokenizer(model, source.where("data.template"))
        bos = _bos(d.prepend_bos, tok, source.where("data.prepend_bos"), model.d_vocab)
        prompts, reference = templates.template_prompts(d, source.where)
        return text_data.text_dataset(prompts, tok, bos, model.d_vocab, model.n_ctx,
                                      templates.describe(d, len(reference)), source.where("data.template"),
                                      reference, [source.where("data.n_reference")] * len(reference))
    tok = require_tokenizer(model, source.where("data.prompts"))
    bos = _bos(d.prepend_bos, tok, source.where("data.prepend_bos"), model.d_vocab)
    rows = [TextPrompt(source.where(f"data.prompts[{i}]"), p.text, p.corruption_texts(), p.answer, p.wrong,
                       source.where(f"data.prompts[{i}].answer"), source.where(f"data.prompts[{i}].wrong"))
            for i, p in enumerate(d.prompts)]
    names = list(rows[0].corruptions)
    desc = (f"prompts listed in the data: {len(rows)} text prompts{', BOS prepended' if bos else ''}; scored at "
            f"the last token; corruptions {', '.join(names)}; means leave each prompt out")
    return text_data.text_dataset(rows, tok, bos, model.d_vocab, model.n_ctx, desc, source.where("data.prompts"))


def mean_reference(d: DataSpec) -> str:
    """Where mean ablation and mean replacement take their per-position means, in words."""
    if isinstance(d, GeneratorData):
        n = d.n_reference if d.n_reference is not None else d.n_prompts
        return f"{n} reference prompts (the generator's independent reference split), per position"
    if isinstance(d, TemplateData):
        n = d.n_reference if d.n_reference is not None else d.n_prompts
        return f"{n} reference prompts (fillings of the template from its independent reference split), per position"
    if isinstance(d, FileData) and d.mean_from is not None:
        return f"the clean prompts of {Path(d.mean_from).name}, per position"
    return "the other clean prompts (leave-one-out), per position"


YAML_SUFFIXES = (".yaml", ".yml")


def for_exploring(d: DataSpec, split: str | None = None) -> DataSpec:
    """`d` as `harness scan` and `harness roles` use it: a generator or template on the
    `split` given, else on the one its mapping sets, else on `explore` (so the `test`
    split stays held out for hypotheses)."""
    if isinstance(d, (GeneratorData, TemplateData)) and (split is not None or "split" not in d.model_fields_set):
        return d.model_copy(update={"split": split or "explore"})
    return d


def from_data_file(path: Path, split: str | None = None) -> tuple[DataSpec, DataSource]:
    """The data of a file named on the command line (`--data FILE`): a YAML data file
    (.yaml/.yml: a `data:` mapping as in a hypothesis file, hypothesis.loading.load_data_file;
    SpecError with file:line) made ready for exploring (for_exploring), or a JSONL prompt
    file (token ids or text)."""
    if path.suffix.lower() in YAML_SUFFIXES:
        loaded = load_data_file(path)
        return for_exploring(loaded.data, split), loaded
    return FileData(file=str(path.resolve())), FolderSource(path.resolve().parent)
