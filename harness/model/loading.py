"""Loading models as TransformerLens 4.x `TransformerBridge`s.

Model directory formats (see docs/model-format.md):

* **fixture / native**: `config.json` holding `TransformerBridgeConfig` fields
  plus `model.safetensors` holding the bridge state dict (TL-format keys).
  Booted with `TransformerBridge.boot_native`, then the weights are loaded.
* **Hugging Face**: a directory written by `save_pretrained` (its config.json
  has `architectures` or `model_type`), loaded as `TransformerBridge.boot_transformers`
  loads it, by harness itself and wrapped with TransformerLens's `build_bridge_from_module`
  (the same bridge), without its tokenizer: the tokenizer files are read only when
  something needs them (model.tokenizer).  Its weights are exactly `model.safetensors`,
  or the shards named by `model.safetensors.index.json`.
* **hub name** (`ORG/NAME`, `hf:ORG/NAME`): the snapshot folder of the local Hugging
  Face cache (model.hub_cache), loaded like a directory, offline.
* **a TransformerBridge the user holds** (`from_bridge`): wrapped without reloading,
  hashed over its tensors.
* **GGUF file** (`model.gguf`): read by transformers' GGUF support, dequantised, and wrapped
  like a Hugging Face directory (`load_transformers(..., gguf_file=...)`).

The loader's rule: only safetensors are read, never pickles.  A directory holding a
pickle file (PICKLE_SUFFIXES) is refused; transformers is made to load exactly the
files the loader checked and hashed.  Before anything is allocated, config.json is
validated and compared with the safetensors header (sizes that would need more
memory than the weights hold are refused); every loaded tensor is checked for
NaN/inf.  Weights are used in float32 unless a dtype is asked for (bfloat16 and
float16 checkpoints are converted); the stored and the used dtype are recorded.
Every problem is a one-line ModelLoadError naming the file.

The jobs live in their own modules: `model.loaded` (the LoadedModel record, `from_bridge`),
`model.model_dir` (which files, checked, and their hash), `model.native_loader`,
`model.hf_loader` (Hugging Face directories, snapshots and GGUF files).  This module picks the
loader for a directory or a cache snapshot, and keeps the names plugins import
(`LoadedModel`, `from_bridge`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .devices import resolve_device
from .hf_loader import check_hf_weights, load_transformers
from .hub_cache import HF_PREFIX, find_snapshot
from .loaded import LoadedModel, from_bridge
from .model_dir import ModelFiles, directory_hash, files_hash, model_files
from .native_loader import load_native
from .tensors import one_line

__all__ = ["LoadedModel", "from_bridge", "load_directory", "load_hub", "directory_hash", "model_files"]


def _load_files(files: ModelFiles, shown: str, dtype: Any, device: str | None,
                revision: str | None = None) -> LoadedModel:
    """Load the checked files of a model directory (or cache snapshot) as LoadedModel(source=`shown`)."""
    if files.kind == "native":
        bridge, digest, stored = load_native(files, dtype, device)
    else:
        stored = check_hf_weights(files, dtype)
        digest = files_hash(files)
        bridge = load_transformers(str(files.folder), dtype, device, files.pinned)
    return LoadedModel(bridge, shown, files.kind, digest, revision, stored)


def load_hub(name: str, dtype: Any = None, device: str | None = None) -> LoadedModel:
    """Hub model `name` (ORG/NAME) from the local cache (hub_cache.find_snapshot), loaded
    like a model directory (model_files with the cache's repository folder as the
    symlink root; the same checks and content hash), offline.  `source` is `hf:NAME`,
    `revision` the snapshot's commit hash."""
    snap = find_snapshot(name)
    files = model_files(snap.folder, root=snap.root)
    return _load_files(files, HF_PREFIX + name, dtype, resolve_device(device), snap.revision)


def load_directory(path: Path, dtype: Any = None, device: str | None = None) -> LoadedModel:
    """A model directory (native or Hugging Face, model_files) onto `device` (devices.resolve_device)."""
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError) as exc:  # Python reports a symlink loop as a RuntimeError
        loop = "Symlink loop" in str(exc) or getattr(exc, "errno", None) == 40
        raise ModelLoadError(f"model path {path}: " + ("a symlink loop (a link that leads back to itself)" if loop
                                                       else f"cannot be resolved ({one_line(exc)})")) from None
    return _load_files(model_files(path), str(path), dtype, resolve_device(device))
