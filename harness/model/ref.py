"""What a `model:` names, parsed once: a local directory (native or Hugging Face), a GGUF
file, or a hub model in the local Hugging Face cache (no torch, no network).

    ModelRef.parse(text, base)   `hf:ORG/NAME` -> the hub model; a path (relative to `base`,
                                 the folder of the file that names it) that is an existing
                                 directory -> that directory (a folder without config.json
                                 holding one .gguf file -> that file); a path ending in
                                 `.gguf` -> that file; else a text spelled like a hub
                                 name (`NAME`, `ORG/NAME`) -> the hub model; else the path
                                 (whose absence the loader reports).  So `./ORG/NAME` forces
                                 the directory and `hf:ORG/NAME` the hub.
    ref.source                   the one spelling: `hf:ORG/NAME`, or the absolute directory or file
    ref.kind()                   "hub", "gguf", or the directory's kind ("native" /
                                 "transformers", from its config.json)
    ref.shape()                  layers and heads from config.json alone, or a GGUF file's
                                 metadata (`harness validate`)
    ref.load(device, dtype)      the LoadedModel (model.loading)

A new model source is a text prefix with a loader: `register(ModelSource("zoo:", load, shape))`
makes `model: zoo:NAME` (and `--models zoo:NAME`, and every command's MODEL) load through it
(docs/architecture.md, "Adding a model source"; tests/toy_model_source.py registers one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HarnessError, UserError
from ..registry import Registry
from ..spec.names import Shape
from . import gguf, hub_cache
from .loaded import LoadedModel
from .loading import load_directory, load_hub
from .model_dir import files_hash as loading_hash
from .model_dir import model_files
from .shape import config_shape

HF_PREFIX = hub_cache.HF_PREFIX


@dataclass(frozen=True)
class ModelSource:
    """A kind of model text registered from outside: `PREFIX` + a name.  `load(name, device,
    dtype)` returns the LoadedModel (model.loading.from_bridge turns a TransformerBridge into one);
    `shape(name)` gives layers and heads without loading (`harness validate`; None: unknown)."""

    prefix: str  # e.g. "zoo:"; ends with ":"
    load: Callable[[str, str | None, Any], LoadedModel]
    shape: Callable[[str], Shape | None] = lambda name: None


def _prefix(prefix: str, source: ModelSource) -> str | None:
    if prefix != source.prefix:
        return f"registered as {prefix!r} but its prefix is {source.prefix!r}"
    if not prefix.endswith(":") or len(prefix) < 2 or prefix == HF_PREFIX:
        return f"a model source prefix is a word ending with ':' other than {HF_PREFIX}"
    return None


_SOURCES: Registry[ModelSource] = Registry("model source", check=_prefix)


def register(source: ModelSource) -> None:
    """Add a model source; its prefix must end with ':' and be new (not `hf:`)."""
    _SOURCES.register(source.prefix, source)


def unregister(prefix: str) -> None:
    _SOURCES.unregister(prefix)


@dataclass(frozen=True)
class ModelRef:
    text: str  # as written
    hub: str | None = None  # ORG/NAME of a hub model
    path: Path | None = None  # the directory or GGUF file of a local model (absolute)
    custom: ModelSource | None = None  # a registered source; its name is text after the prefix

    def local_path(self) -> Path:
        """The directory or GGUF file of a local model (HarnessError for a hub name or a registered
        source, which have none: callers ask only after ruling those out)."""
        if self.path is None:
            raise HarnessError(f"{self.text}: not a local model, so it has no path")
        return self.path

    @classmethod
    def parse(cls, text: str | Path, base: str | Path | None = None) -> ModelRef:
        """The model `text` names (module docstring); `base` defaults to the working directory."""
        raw = str(text)
        if raw.startswith(HF_PREFIX):
            return cls(raw, hub=raw[len(HF_PREFIX):])
        custom = next((s for s in _SOURCES if raw.startswith(s.prefix)), None)
        if custom is not None and not isinstance(text, Path):
            return cls(raw, custom=custom)
        folder = Path(base) if base is not None else Path.cwd()
        try:
            p = Path(raw).expanduser()
            full = p if p.is_absolute() else folder / p
            if full.is_dir():
                return cls(raw, path=(gguf.single_file(full) or full).resolve())
            if gguf.is_named(full):  # a .gguf path is a file, never a hub name
                return cls(raw, path=full.resolve())
        except (OSError, ValueError, RuntimeError):  # a NUL byte, no home directory for ~user, a loop
            return cls(raw, path=Path(raw))
        if not isinstance(text, Path) and hub_cache.is_hub_name(raw):
            return cls(raw, hub=raw)
        return cls(raw, path=Path(os.path.abspath(full)))

    @property
    def is_hub(self) -> bool:
        return self.hub is not None

    @property
    def source(self) -> str:
        """`hf:ORG/NAME`, `PREFIX:NAME` of a registered source, or the absolute directory: what
        LoadedModel.source and reports hold."""
        if self.custom is not None:
            return self.text
        return HF_PREFIX + self.hub if self.hub is not None else str(self.path)

    @property
    def is_named(self) -> bool:
        """Whether the model is a name rather than a local directory (a hub model or a registered source)."""
        return self.hub is not None or self.custom is not None

    def snapshot(self) -> hub_cache.Snapshot:
        """The cached snapshot of a hub model (hub_cache.find_snapshot: one line when missing)."""
        if self.hub is None:
            raise UserError(f"{self.text}: not a hub model")
        return hub_cache.find_snapshot(self.hub)

    def folder(self) -> Path | None:
        """The directory the model's files are in: the directory, or the hub model's cached
        snapshot (None when it is not in the cache; None for a GGUF file, which holds its tokenizer)."""
        if self.path is not None:
            return None if gguf.is_gguf(self.path) else self.path
        if self.custom is not None:
            return None
        try:
            return self.snapshot().folder
        except (UserError, OSError):
            return None

    def kind(self) -> str:
        """"hub", the prefix of a registered source, "gguf" for a GGUF file (or a folder without
        config.json holding .gguf files), or "native" / "transformers" for a directory (its
        config.json decides)."""
        if self.custom is not None:
            return self.custom.prefix.rstrip(":")
        if self.is_hub:
            return "hub"
        path = self.local_path()
        return "gguf" if gguf.is_gguf(path) else model_files(path).kind

    def shape(self) -> Shape | None:
        """Layers, heads and MLPs from config.json alone, or a GGUF file's metadata (None when it
        cannot be read: the loader reports why when the model loads)."""
        try:
            if self.custom is not None:
                return self.custom.shape(self.text[len(self.custom.prefix):])
            if self.hub is not None:
                snap = self.snapshot()
                return config_shape(snap.folder, snap.root)
            if self.path is not None and gguf.is_gguf(self.path):
                return gguf.shape(self.path)
            return config_shape(self.path) if self.path is not None else None
        except (UserError, OSError, ValueError, RuntimeError):
            return None

    def load(self, device: str | None = None, dtype: Any = None) -> LoadedModel:
        """The model, loaded (model.loading: safetensors only, checked, hashed; offline; model.gguf for a
        GGUF file; a registered source's own loader)."""
        if self.custom is not None:
            return self.custom.load(self.text[len(self.custom.prefix):], device, dtype)
        if self.hub is not None:
            return load_hub(self.hub, dtype, device)
        path = self.local_path()
        if gguf.is_gguf(path):
            return gguf.load(path, dtype, device)
        return load_directory(path, dtype, device)

    def content_hash(self) -> str | None:
        """The sha256 the loader would record (model.loading: config.json and the weight files, read
        but not loaded; a GGUF file's bytes); None for a registered source (its loader computes its own)."""
        if self.custom is not None:
            return None
        if self.hub is not None:
            snap = self.snapshot()
            return loading_hash(model_files(snap.folder, root=snap.root))
        path = self.local_path()
        if gguf.is_gguf(path):
            return gguf.file_hash(gguf.find_file(path))
        return loading_hash(model_files(path.resolve()))

    def relative_to(self, folder: Path) -> str:
        """How a file written in `folder` names this model: `hf:ORG/NAME` (or a registered source's
        name), or the directory: relative to `folder` when that is no longer than the absolute path
        (`../fixtures/m`, not `../../../../work/fixtures/m`), else absolute (also when no relative
        path leads there, e.g. another drive)."""
        if self.is_named:
            return self.source
        path = self.local_path()
        try:
            rel = Path(os.path.relpath(path, folder.resolve())).as_posix()
        except ValueError:
            return str(path)
        return rel if len(rel) <= len(str(path)) else str(path)


def load_model(source: str | Path, dtype: Any = None, device: str | None = None) -> LoadedModel:
    """Load what `source` names (ModelRef.parse, relative to the working directory: a model
    directory, native or Hugging Face, a GGUF file, or a hub model from the local cache) onto `device`,
    resolved by devices.resolve_device (None: $HARNESS_DEVICE, else the best available; a bad
    or unavailable name raises DeviceError before any loading).

    Guarantees: only safetensors (or the one GGUF file) were read; `sha256` covers exactly config.json
    and the weight files whose tensors were loaded (directory_hash; for a hub model, those files of
    its snapshot; for a GGUF file, its bytes); the weights are finite; nothing was downloaded.  ModelLoadError (one line
    naming the file) for every problem with the directory."""
    return ModelRef.parse(source).load(device, dtype)
