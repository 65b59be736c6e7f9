"""A `data:` mapping made into the Dataset a model runs on, through its data source
(data.sources: generator, token-id or text file, template, list of text prompts, or
a registered one).  `harness run` gives it the hypothesis file's mapping; `harness scan` and
`harness roles` a data file's (hypothesis.loading.load_data_file) or a prompt file's.
Problems name the field through the source's `where` (`h.yaml:5: data.template: ...`)."""

from __future__ import annotations

from pathlib import Path

from .. import locations
from ..data import dataset as data
from ..data import sources as data_sources
from ..data.settings import DataSettings, FileData, GeneratorData
from ..data.sources import FolderSource
from ..data.sources import Where as DataSource
from ..errors import DataError, SpecError
from ..hypothesis.loading import load_data_file
from ..model.loaded import LoadedModel

DataSpec = DataSettings  # the settings of a registered data source (data.sources)
__all__ = ["DataSource", "DataSpec", "FolderSource", "build_dataset", "check_output_vocab", "for_exploring",
           "from_data_file", "mean_reference"]


def build_dataset(d: DataSpec, source: DataSource, model: LoadedModel) -> data.Dataset:
    """The prompts of data mapping `d` for `model` (data.dataset.Dataset), with every answer and
    wrong token inside the model's output vocabulary."""
    ds = data_sources.of(d).build(d, source, model)
    check_output_vocab(ds, model.d_vocab_out, source.where("data"), isinstance(d, GeneratorData))
    return ds


def check_output_vocab(ds: data.Dataset, d_vocab_out: int, where: str, generated: bool) -> None:
    """Raise SpecError when an answer or wrong token id lies outside the output vocabulary
    0..d_vocab_out-1 (a model whose unembedding is narrower than its embedding)."""
    for name, ids in (("answer", ds.answers), ("wrong", ds.wrong), ("answer", ds.answer_sets),
                      ("wrong", ds.wrong_sets)):
        if ids is None:
            continue
        pad = (ids == -1) if ids.dim() == 3 else (ids != ids)  # -1 pads a set; single tokens have no padding
        outside = ((ids < 0) & ~pad) | (ids >= d_vocab_out)
        if bool(outside.any()):
            at = outside.nonzero()[0]
            n, token = int(at[0]), int(ids[tuple(at.tolist())])
            hint = (f"; set data.vocab_max: {d_vocab_out} so that every token can be an answer" if generated
                    else "")
            raise SpecError([f"{where}: prompt {n}: {name} token {token} is outside the model's output "
                             f"vocabulary 0..{d_vocab_out - 1} (d_vocab_out {d_vocab_out}){hint}"])


def mean_reference(d: DataSpec) -> str:
    """Where mean ablation and mean replacement take their per-position means, in words."""
    return data_sources.of(d).mean_reference(d)


YAML_SUFFIXES = (".yaml", ".yml")


def for_exploring(d: DataSpec, split: str | None = None) -> DataSpec:
    """`d` as `harness scan`, `discover` and `roles` use it (data.sources.on_split: any
    source with splits on `explore` unless told otherwise)."""
    return data_sources.on_split(d, split)


def from_data_file(path: Path, split: str | None = None) -> tuple[DataSpec, DataSource]:
    """The data of a file named on the command line (`--data FILE`): a YAML data file
    (.yaml/.yml: a `data:` mapping as in a hypothesis file, hypothesis.loading.load_data_file;
    SpecError with file:line) made ready for exploring (for_exploring), or a JSONL prompt
    file (token ids or text).  DataError when `path` is not a readable file (locations.file_problem)."""
    problem = locations.file_problem(path)
    if problem is not None:
        raise DataError(f"{path}: cannot read the data file: {problem}")
    if path.suffix.lower() in YAML_SUFFIXES:
        loaded = load_data_file(path)
        return for_exploring(loaded.data, split), loaded
    return FileData(file=str(path.resolve())), FolderSource(path.resolve().parent)
