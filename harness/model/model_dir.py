"""Model directories: which files the loader reads, checked, and their content hash.

`model_files(path)` names the files of a native or Hugging Face directory the loader will
read (config.json, model.safetensors or the shards an index names, an architecture's extra
files), refusing pickles, symlinks leading out, torch.distributed shards and missing files,
each with a one-line ModelLoadError.  `files_hash` / `directory_hash` hash exactly those
files; `stored_dtype` reads the stored dtype from the safetensors headers; `compare_tensors`
checks a header against the tensors a config implies.
Imports: model.files, model.hub_cache, model.tensors (transformers lazily).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from . import files as _files
from .files import PICKLE_SUFFIXES, list_dir, parse_json, pickle_files, read_bytes, read_json
from .hub_cache import within
from .tensors import TensorInfo, shape_text

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# transformers loads *every* *.safetensors of a directory holding a file named like this
# (a torch.distributed checkpoint), whatever else it is told: such directories are refused.
DISTRIBUTED_SHARD = re.compile(r"^shard-[0-9]{5}-model-[0-9]{5}-of-[0-9]{5}\.safetensors$")
# files from which transformers builds a tokenizer; a Hugging Face directory holding none is
# loaded without one (AutoTokenizer would fail, or give an empty stand-in)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model")
# safetensors dtype -> torch's name for it
DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
               "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}
CONVERT = ("convert them to safetensors (transformers: save_pretrained(dir); torch: "
           "safetensors.torch.save_file(state_dict, 'model.safetensors')) and remove the pickle files")


@dataclass(frozen=True)
class ModelFiles:
    """The files of a model directory the loader reads, checked by `model_files`."""

    folder: Path  # absolute
    kind: str  # "native" | "transformers"
    config: dict[str, Any]  # parsed config.json
    config_bytes: bytes  # config.json as read
    weights: tuple[Path, ...]  # the safetensors files whose tensors are loaded, in name order
    index: Path | None = None  # model.safetensors.index.json when the weights are its shards
    root: Path | None = None  # where symlinks may lead (a hub cache's repository folder); None: `folder`

    @property
    def pinned(self) -> str:
        """The file transformers is told to load (`transformers_weights`)."""
        return self.index.name if self.index is not None else WEIGHTS

    def name(self, f: Path) -> str:
        return f.relative_to(self.folder).as_posix()

    def hashed(self) -> list[Path]:
        """config.json, the index (if any) and the weight files, in name order."""
        files = [self.folder / CONFIG, *([self.index] if self.index is not None else []), *self.weights]
        return sorted(set(files), key=self.name)


def _contained(folder: Path, name: str, root: Path | None = None) -> Path:
    """`folder/name`, refused when it is a symlink leading out of `folder` (out of `root`,
    the hub cache's repository folder, for a cache snapshot)."""
    target = within(folder, name, root)
    if target is None:
        if root is not None and root != folder:
            raise ModelLoadError(f"{folder / name}: a symlink to a file outside the cache folder {root}; every file "
                                 "the loader reads must lie inside it (blobs/ and snapshots/ of that folder)")
        raise ModelLoadError(f"{folder / name}: a symlink to a file outside the model directory; every file the "
                             "loader reads must lie inside it (copy the file in)")
    return target


def _index_shards(folder: Path, index: Path, root: Path | None = None) -> tuple[Path, ...]:
    """The shard files named by `index` (model.safetensors.index.json), each checked
    to be a .safetensors file inside `folder` that exists."""
    doc = read_json(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index}: expected a JSON object with a non-empty 'weight_map' "
                             "(tensor name -> shard file)")
    if not isinstance(doc.get("metadata"), dict):
        raise ModelLoadError(f"{index}: metadata: expected a JSON object (transformers requires it, "
                             "e.g. {\"total_size\": BYTES})")
    shards: set[Path] = set()
    for tensor, name in weight_map.items():
        where = f"{index}: weight_map: {tensor}"
        if not isinstance(name, str):
            raise ModelLoadError(f"{where}: expected a shard file name, got {name!r}")
        if not name.endswith(".safetensors"):
            raise ModelLoadError(f"{where}: {name!r} is not a .safetensors file (harness reads safetensors only)")
        target = within(folder, name, root)
        if target is None:
            raise ModelLoadError(f"{where}: {name!r} is outside the model directory (shards are relative paths "
                                 "inside it: no absolute path, no '..', no symlink leading out)")
        if not target.is_file():
            raise ModelLoadError(f"{where}: shard {name!r} does not exist in {folder}")
        shards.add(target)
    return tuple(sorted(shards, key=lambda f: f.relative_to(folder).as_posix()))


def _hf_extra_files(folder: Path, cfg: dict[str, Any], root: Path | None = None) -> list[Path]:
    """Safetensors files transformers loads besides the checkpoint for some
    architectures (their config class's `extra_files`), when present."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        return []
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return []
    names = getattr(CONFIG_MAPPING[model_type], "extra_files", ()) or ()
    return [_contained(folder, n, root) for n in names if (folder / n).is_file()]


def model_files(path: Path, root: Path | None = None) -> ModelFiles:
    """Check a model directory and name the files the loader will read.

    Guarantees, when it returns: `path` is a directory holding a UTF-8 JSON object
    `config.json` and no pickle file (PICKLE_SUFFIXES) at its top level; the kind
    is "transformers" when config.json has `architectures` or `model_type`, else
    "native"; `weights` are the safetensors files that will be loaded, inside the
    directory: `model.safetensors` for a native directory; for a Hugging Face
    directory `model.safetensors`, else the shards named by
    `model.safetensors.index.json` (relative, inside, present), plus the
    architecture's extra files.  Other *.safetensors files are neither loaded nor
    hashed.  ModelLoadError (one line, naming the file) otherwise.

    `root` (a hub cache snapshot: the repository's cache folder) lets symlinks lead
    anywhere inside `root` instead of inside `path`, and pickle files are then
    ignored instead of refused (the hub client downloads every file of a repository,
    pytorch_model.bin included; nothing but the safetensors named here is read)."""
    if not path.exists():
        raise ModelLoadError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory")
    cfg_file = path / CONFIG
    if not cfg_file.is_file():
        raise ModelLoadError(f"{path} has no config.json; a model directory holds config.json "
                             "and model.safetensors")
    cfg_file = _contained(path, CONFIG, root)
    cfg_bytes = read_bytes(cfg_file, limit=_files.MAX_TEXT_BYTES)
    cfg = parse_json(cfg_bytes, cfg_file)
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file}: expected a JSON object")
    pickles = pickle_files(path) if root is None else []
    if pickles:
        more = f" (and {len(pickles) - 1} more pickle file(s))" if len(pickles) > 1 else ""
        raise ModelLoadError(f"{pickles[0]}: pickle weights are not loaded{more}: harness reads safetensors only "
                             f"and refuses a model directory holding {'/'.join(PICKLE_SUFFIXES)} files; {CONVERT}")
    is_hf = "architectures" in cfg or "model_type" in cfg
    kind = "transformers" if is_hf else "native"
    if not is_hf:
        if not (path / WEIGHTS).is_file():
            raise ModelLoadError(f"{path} has no model.safetensors")
        return ModelFiles(path, kind, cfg, cfg_bytes, (_contained(path, WEIGHTS, root),), root=root)
    for f in list_dir(path):
        if DISTRIBUTED_SHARD.match(f.name):
            raise ModelLoadError(f"{f}: a torch.distributed checkpoint shard; transformers would load every "
                                 "*.safetensors file of the directory instead of model.safetensors: remove it "
                                 "or save the model with save_pretrained")
    index: Path | None = None
    if (path / WEIGHTS).is_file():
        weights: tuple[Path, ...] = (_contained(path, WEIGHTS, root),)
    elif (path / INDEX).is_file():
        index = _contained(path, INDEX, root)
        weights = _index_shards(path, index, root)
    else:
        stray = sorted(f.name for f in path.glob("*.safetensors"))
        extra = f" ({', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not loaded: only model.safetensors " \
                "or the shards an index names)" if stray else ""
        hub = (f", and pickle weights ({', '.join(sorted(f.name for f in pickle_files(path)))}) are not loaded: "
               f"{CONVERT}") if root is not None and pickle_files(path) else ""
        raise ModelLoadError(f"{path} has no model.safetensors or {INDEX}{extra}{hub}")
    files = ModelFiles(path, kind, cfg, cfg_bytes, weights, index, root)
    asked = cfg.get("transformers_weights")
    if asked is not None and asked != files.pinned:
        raise ModelLoadError(f"{cfg_file}: transformers_weights: harness loads {files.pinned}, "
                             f"got {asked!r} (remove the key)")
    extra_files = _hf_extra_files(path, cfg, root)
    if extra_files:
        files = replace(files, weights=tuple(sorted({*weights, *extra_files}, key=files.name)))
    return files


def has_tokenizer_files(folder: Path) -> bool:
    """Whether a Hugging Face directory holds a file transformers builds a tokenizer from (TOKENIZER_FILES)."""
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def files_hash(files: ModelFiles, contents: dict[Path, bytes] | None = None) -> str:
    """sha256 over (name, bytes) of `files.hashed()`, in name order; names are
    relative to the directory (UTF-8).  `contents` supplies files already read."""
    h = hashlib.sha256()
    for f in files.hashed():
        h.update(files.name(f).encode())
        if contents is not None and f in contents:
            h.update(contents[f])
            continue
        if f == files.folder / CONFIG:
            h.update(files.config_bytes)
            continue
        hash_file(h, f)
    return h.hexdigest()


def hash_file(h: Any, f: Path) -> None:
    """Feed the bytes of `f` into the hash `h`, 16 MiB at a time (ModelLoadError if unreadable)."""
    try:
        with open(f, "rb") as stream:
            while chunk := stream.read(1 << 24):
                h.update(chunk)
    except OSError as exc:
        raise ModelLoadError(f"{f}: cannot read: {exc.strerror or exc}") from None


def directory_hash(path: Path) -> str:
    """The content hash of a model directory: sha256 over (name, bytes) of exactly
    the files whose content is loaded: `config.json` and the weight files of
    `model_files` (`model.safetensors`, or `model.safetensors.index.json` and its
    shards), in name order.  Other files (model card, training logs, tokenizer
    files, stray *.safetensors) do not change the hash."""
    return files_hash(model_files(path.resolve()))


def stored_dtype(header: dict[str, TensorInfo]) -> str | None:
    """The floating-point dtype(s) the weight files store, by torch's names (`bfloat16`;
    several, most elements first, as `float32, float16`); None when no tensor is floating-point."""
    counts: dict[str, int] = {}
    for t in header.values():
        if t.dtype in DTYPE_NAMES:
            counts[DTYPE_NAMES[t.dtype]] = counts.get(DTYPE_NAMES[t.dtype], 0) + t.numel
    return ", ".join(sorted(counts, key=lambda d: (-counts[d], d))) or None


def compare_tensors(expected: dict[str, tuple[int, ...]], header: dict[str, TensorInfo], weights: str,
             what: str = "config.json") -> None:
    """Raise ModelLoadError unless `header` holds exactly the tensors `expected` names, with their shapes."""
    missing = [k for k in expected if k not in header]
    unexpected = [k for k in header if k not in expected]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{weights} does not match {what}: missing tensor {missing[0]} "
                             f"(shape {shape_text(expected[missing[0]])}){more}")
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ModelLoadError(f"{weights} does not match {what}: unexpected tensor {unexpected[0]}{more}")
    for k, shape in expected.items():
        if header[k].shape != tuple(shape):
            raise ModelLoadError(f"{header[k].file} does not match {what}: tensor {k} has shape "
                                 f"{shape_text(header[k].shape)}, the config implies {shape_text(shape)}")
