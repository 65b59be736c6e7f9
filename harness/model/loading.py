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
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from . import files as _files
from . import tensors
from .config_check import (
    check_hf_sizes,
    check_native_config,
    native_buffer_bytes,
    native_weight_count,
)
from .devices import resolve_device
from .files import PICKLE_SUFFIXES, list_dir, parse_json, pickle_files, read_bytes, read_json
from .hub_cache import HF_PREFIX, find_snapshot, within
from .shape import vocab_out
from .tensors import TensorInfo, one_line, shape_text

BRIDGE_HASH_PREFIX = "tensors-sha256:"  # LoadedModel.sha256 of a bridge the user handed over (from_bridge)
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


@dataclass
class LoadedModel:
    bridge: Any  # transformer_lens.model_bridge.TransformerBridge
    source: str  # absolute path, hf:NAME, or "TransformerBridge (ARCHITECTURE)" for a bridge handed over
    kind: str  # "native" | "transformers" | "bridge" | "gguf"
    sha256: str  # content hash of config.json and the weight files loaded (directory_hash), or of a
    #              handed-over bridge's tensors (bridge_hash, prefixed "tensors-sha256:"), or of the GGUF file
    revision: str | None = None  # hub models: the commit hash of the cached snapshot loaded
    stored_dtype: str | None = None  # the floating-point dtype(s) of the weight files (e.g. "bfloat16")
    quantization: dict[str, str] | None = None  # GGUF files: tensor_types, file_type (model.gguf.quantization)

    @property
    def dtype(self) -> str:
        """The dtype the model computes in (its first floating-point parameter's), e.g. "float32"."""
        return tensor_dtype_name(self.bridge)

    @property
    def n_layers(self) -> int:
        return int(self.bridge.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.bridge.cfg.n_heads)

    @property
    def d_vocab(self) -> int:
        """The input vocabulary (token ids a prompt may hold)."""
        return int(self.bridge.cfg.d_vocab)

    @property
    def d_vocab_out(self) -> int:
        """The output vocabulary (the logits' width; answer and wrong ids index it)."""
        return vocab_out(self.bridge.cfg)

    @property
    def n_ctx(self) -> int:
        return int(self.bridge.cfg.n_ctx)

    @property
    def has_mlp(self) -> bool:
        return not bool(getattr(self.bridge.cfg, "attn_only", False))


@dataclass(frozen=True)
class ModelFiles:
    """The files of a model directory the loader reads, checked by `model_files`."""

    folder: Path  # absolute
    kind: str  # "native" | "transformers"
    config: dict  # parsed config.json
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


def _hf_extra_files(folder: Path, cfg: dict, root: Path | None = None) -> list[Path]:
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


def tensor_dtype_name(module: Any) -> str:
    """The dtype of a module's first floating-point parameter, by torch's name (`float32`)."""
    for p in module.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return "float32"


def _compare(expected: dict[str, tuple[int, ...]], header: dict[str, TensorInfo], weights: str,
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


def load_native(files: ModelFiles, dtype: Any = None, device: str | None = None) -> tuple[Any, str, str | None]:
    """Boot a native bridge from config.json and load model.safetensors into it.

    Returns (bridge, content hash of the bytes loaded, the dtype(s) stored: stored_dtype).
    The bridge is in `dtype` (default float32): bfloat16/float16 files are converted.  Guarantees: config.json
    passed config_check.check_native_config; nothing was allocated for a config
    implying more weights than the file holds or more memory than the machine
    has; the file holds exactly the bridge's tensors with their shapes; every
    tensor is finite, also after conversion to the bridge's dtype (`dtype`)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load as load_bytes
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    cfg, cfg_file, weights = files.config, files.folder / CONFIG, files.weights[0]
    check_native_config(cfg, cfg_file)
    header = tensors.read_header(weights)
    held = sum(t.numel for t in header.values())
    implied, largest = native_weight_count(cfg)
    if implied > held:
        raise ModelLoadError(f"{cfg_file}: the config implies at least {implied:,} weights, mostly {largest}, "
                             f"but {weights.name} holds {held:,}: a size in config.json is wrong")
    itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
    file_bytes = weights.stat().st_size
    masks = native_buffer_bytes(cfg)
    tensors.check_memory(2 * file_bytes + held * itemsize + masks, str(cfg_file),
                         f"the weights twice while loading, and n_layers x n_ctx^2 = {masks:,} bytes of masks")
    try:
        config = TransformerBridgeConfig.from_dict(cfg)
        bridge = TransformerBridge.boot_native(config, device=device, dtype=dtype)  # type: ignore[attr-defined]
    except (TypeError, ValueError, ArithmeticError, NotImplementedError) as exc:
        raise ModelLoadError(f"{cfg_file}: not a valid TransformerBridgeConfig: {one_line(exc)}") from None
    target = bridge.state_dict()
    _compare({k: tuple(v.shape) for k, v in target.items()}, header, str(weights))
    data = read_bytes(weights)
    try:
        state = load_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{weights}: cannot read: {one_line(exc)}") from None
    tensors.check_finite(state, weights)
    # load_state_dict would copy each tensor into the bridge's dtype: convert first, so an overflow is seen
    converted = {k for k, v in state.items() if v.is_floating_point() and v.dtype != target[k].dtype}
    for k in converted:
        state[k] = state[k].to(target[k].dtype)
    if converted:
        tensors.check_finite({k: state[k] for k in converted}, weights,
                             f" after conversion to {target[next(iter(converted))].dtype}")
    try:
        result = bridge.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{weights} does not match config.json: {one_line(exc)}") from None
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(f"{weights} does not match config.json: missing "
                             f"{result.missing_keys}, unexpected {result.unexpected_keys}")
    bridge.eval()
    return bridge, files_hash(files, {weights: data}), stored_dtype(header)


def _weight_renamings(model: Any) -> list[Any]:
    """The simple key renamings (`WeightRenaming`, e.g. GPT-NeoX's `embed_out.` -> `lm_head.`)
    transformers applies to checkpoint keys when it loads `model` (get_model_conversion_mapping,
    as from_pretrained calls it).  Other transforms (converters merging or splitting
    tensors, stateful renamings) are left out: their keys are compared as the files name them."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    return [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]


def loaded_names(keys: list[str], renamings: list[Any]) -> dict[str, str]:
    """{checkpoint key: the name transformers loads it as} after `renamings`, applied in turn."""
    out = {}
    for key in keys:
        name = key
        for r in renamings:
            name, _ = r.rename_source_key(name)
        out[key] = name
    return out


def check_hf_weights(files: ModelFiles, dtype: Any = None) -> str | None:
    """Check a Hugging Face directory before transformers loads it; return the dtype(s)
    its weight files store (stored_dtype).

    Guarantees, when it returns: config.json builds a causal LM in transformers
    (built on the `meta` device: nothing allocated); the weight files are readable
    safetensors (complete headers, data covering every tensor) holding every
    parameter of that model (tied weights once, the base-model prefix optional),
    each with the shape the config implies, and each tensor named by an index in
    the shard it names; checkpoint keys are compared under the names transformers
    loads them as (the architecture's simple renamings, _weight_renamings); loading
    fits in this machine's memory; no tensor holds a NaN or an infinity.
    ModelLoadError naming the file (and tensor) otherwise."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path, cfg_file = files.folder, files.folder / CONFIG
    check_hf_sizes(files.config, cfg_file)
    try:
        cfg = AutoConfig.from_pretrained(str(path))
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # any failure to build a model from the user's config is bad input
        raise ModelLoadError(f"{cfg_file}: not a Hugging Face causal LM config: {type(exc).__name__}: "
                             f"{one_line(exc)}") from None
    header: dict[str, TensorInfo] = {}
    for f in files.weights:
        for key, info in tensors.read_header(f).items():
            if key in header:
                raise ModelLoadError(f"{f}: tensor {key} is also in {header[key].file}: which one transformers "
                                     "loads is undefined")
            header[key] = info
    if files.index is not None:
        weight_map = read_json(files.index)["weight_map"]
        for key, name in weight_map.items():
            if key not in header or header[key].file != path / name:
                raise ModelLoadError(f"{files.index}: weight_map: {key}: not in {name}")
    renamed = loaded_names(list(header), _weight_renamings(skeleton))
    by_name: dict[str, str] = {}  # loaded name -> checkpoint key
    for key, name in renamed.items():
        if name in by_name:
            raise ModelLoadError(f"{header[key].file}: tensors {by_name[name]} and {key} are both loaded as {name}: "
                                 "which one transformers keeps is undefined")
        by_name[name] = key
    prefix = getattr(skeleton, "base_model_prefix", "") + "."
    expected: dict[str, tuple[int, ...]] = {}  # checkpoint key -> shape the config implies
    missing: list[str] = []
    for n, p in skeleton.named_parameters():
        stripped = n[len(prefix):] if n.startswith(prefix) else None
        found = n if n in by_name else stripped if stripped is not None and stripped in by_name else None
        if found is None:
            missing.append(n)
        else:
            expected[by_name[found]] = tuple(p.shape)
    if missing:
        raise ModelLoadError(f"{path}: the weights do not match config.json ({cfg.model_type}): "
                             f"{len(missing)} parameter(s) missing, e.g. {', '.join(missing[:3])}")
    _compare(expected, {k: header[k] for k in expected}, str(path), f"config.json ({cfg.model_type})")
    itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
    model_bytes = sum(t.numel() for t in [*skeleton.parameters(), *skeleton.buffers()]) * itemsize
    file_bytes = sum(f.stat().st_size for f in files.weights)
    tensors.check_memory(file_bytes + model_bytes, str(cfg_file), "the model's tensors and the weight files")
    for f in files.weights:
        tensors.scan_file_finite(f)
    return stored_dtype(header)


class _SafetensorsOnly:
    """The `model_class` given to boot_transformers: the class TransformerLens would
    pick for the architecture, loaded with `use_safetensors=True` (a pickle
    checkpoint is never read, even from the hub)."""

    @staticmethod
    def _resolve(config: Any) -> Any:
        from transformer_lens.model_bridge.sources._hf_format import determine_architecture_from_hf_config
        from transformer_lens.model_bridge.sources.transformers import get_hf_model_class_for_architecture

        return get_hf_model_class_for_architecture(determine_architecture_from_hf_config(config))

    @staticmethod
    def from_pretrained(name: str, **kwargs: Any) -> Any:
        return _SafetensorsOnly._resolve(kwargs["config"]).from_pretrained(name, use_safetensors=True, **kwargs)

    @staticmethod
    def from_config(config: Any, **kwargs: Any) -> Any:
        return _SafetensorsOnly._resolve(config).from_config(config, **kwargs)


@contextmanager
def offline() -> Iterator[None]:
    """Hugging Face offline mode while loading: $HF_HUB_OFFLINE=1 and huggingface_hub's own
    flag (read at import), so no request leaves the machine; both restored afterwards."""
    import huggingface_hub.constants as hub_constants

    saved_env, saved_flag = os.environ.get("HF_HUB_OFFLINE"), hub_constants.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved_flag
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env


def _boot_without_tokenizer(path: str, dtype: Any, device: str | None, weights: str | None,
                            gguf_file: str | None = None) -> Any:
    """The bridge `TransformerBridge.boot_transformers(path)` builds, without its tokenizer
    (boot_transformers always builds a tokenizer, and fails on a directory without tokenizer
    files or with unreadable ones): the model is loaded as boot_transformers loads it (the
    config with output_attentions, the adapter's attention implementation, else eager;
    safetensors only; `dtype`, default float32; then `device`) and wrapped with
    TransformerLens's `build_bridge_from_module`.  The bridge has no tokenizer
    (`bridge.tokenizer` is None) until model.tokenizer reads it.  With `gguf_file` (model.gguf)
    the config and the weights come from that GGUF file instead, dequantised to a plain model."""
    import torch
    from transformer_lens.factories import architecture_adapter_factory
    from transformer_lens.model_bridge.sources._bridge_builder import (
        build_bridge_config_from_hf,
        build_bridge_from_module,
    )
    from transformer_lens.model_bridge.sources._hf_format import determine_architecture_from_hf_config
    from transformer_lens.utilities.hf_utils import autoconfig_with_remote_post_init_compat
    from transformer_lens.utilities.multi_gpu import maybe_cast_floating_params
    from transformers import AutoConfig

    dtype = dtype or torch.float32
    source = {"gguf_file": gguf_file} if gguf_file is not None else {}
    hf_config = autoconfig_with_remote_post_init_compat(path, auto_config=AutoConfig, output_attentions=True,
                                                        trust_remote_code=False, **source)
    hf_config.__dict__.update({"transformers_weights": weights})
    architecture = determine_architecture_from_hf_config(hf_config)
    adapter = architecture_adapter_factory.ArchitectureAdapterFactory.select_architecture_adapter(
        build_bridge_config_from_hf(hf_config, architecture, path, dtype))
    if not hasattr(hf_config, "pad_token_id") or "pad_token_id" not in hf_config.__dict__:
        pad = getattr(hf_config, "eos_token_id", None)
        hf_config.pad_token_id = (pad[0] if pad else None) if isinstance(pad, list) else pad
    kwargs: dict[str, Any] = {"config": hf_config, "torch_dtype": dtype,
                              "attn_implementation": getattr(adapter.cfg, "attn_implementation", None) or "eager"}
    adapter.prepare_loading(path, kwargs)
    if gguf_file is None:
        hf_model = _SafetensorsOnly.from_pretrained(path, **kwargs)
    else:  # every tensor dequantised, no quantizer left on the model (transformers without GgufConfig always does)
        from transformers.utils import quantization_config

        if hasattr(quantization_config, "GgufConfig"):
            kwargs["quantization_config"] = quantization_config.GgufConfig(dequantize=True)
        hf_model = _SafetensorsOnly._resolve(hf_config).from_pretrained(path, **source, **kwargs)
    if device is not None:
        hf_model = hf_model.to(device)
    maybe_cast_floating_params(hf_model, dtype)
    return build_bridge_from_module(hf_model, architecture, hf_config=hf_config, dtype=dtype, device=device,
                                    model_name=path)


def load_transformers(name_or_path: str, dtype: Any = None, device: str | None = None,
                      weights: str | None = None, gguf_file: str | None = None, shown: str | None = None) -> Any:
    """Boot a bridge around a Hugging Face model directory (or cache snapshot), offline, without its
    tokenizer (`_boot_without_tokenizer`: the bridge boot_transformers builds).

    transformers loads safetensors only (`use_safetensors=True`), and exactly the
    file `weights` (`model.safetensors` or the index) when given: it is set as the
    config's `transformers_weights`, overriding config.json's.  No network request is
    made (`offline`).  Every parameter is finite after loading (in `dtype`, default float32).
    `gguf_file`: the config and weights from that GGUF file (model.gguf); `shown` names the model
    in messages (default: `Hugging Face model 'NAME_OR_PATH'`)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()  # no "Loading weights" bar between the stage lines
    hf_logging.disable_progress_bar()
    try:
        with offline():
            bridge = _boot_without_tokenizer(name_or_path, dtype, device, weights, gguf_file)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        if gguf_file is None and "use_safetensors" in str(exc):  # transformers found no safetensors checkpoint
            raise ModelLoadError(f"cannot load Hugging Face model {name_or_path!r}: it has no model.safetensors "
                                 f"or {INDEX}, and pickle weights (pytorch_model.bin) are not loaded: "
                                 "convert them to safetensors") from None
        shown = shown or f"Hugging Face model {name_or_path!r}"
        raise ModelLoadError(f"cannot load {shown}: {one_line(exc)}") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    for name, p in bridge.original_model.named_parameters():
        bad = tensors.count_nonfinite(p.detach())
        if bad:
            after = f" after loading as {dtype}" if dtype is not None else ""
            raise ModelLoadError(tensors.nonfinite_message(gguf_file or name_or_path,
                                                           name.replace("._original_component", ""),
                                                           bad, p.numel(), after))
    bridge.eval()
    return bridge


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


def bridge_hash(bridge: Any) -> str:
    """`tensors-sha256:` + sha256 over every parameter and buffer of `bridge` (named as
    `named_parameters`/`named_buffers` name them, tied tensors once), in name order: each
    tensor's name, dtype, shape and bytes."""
    import torch

    h = hashlib.sha256()
    named = dict(bridge.named_buffers())
    named.update(bridge.named_parameters())
    for name in sorted(named):
        t = named[name].detach()
        h.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0".encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return BRIDGE_HASH_PREFIX + h.hexdigest()


def from_bridge(bridge: Any) -> LoadedModel:
    """A `TransformerBridge` the caller already holds (booted in a notebook with
    `boot_transformers` or `boot_native`) as a LoadedModel, without reloading it:
    kind "bridge", source `TransformerBridge (ARCHITECTURE)`, sha256 `bridge_hash`.
    Its floating-point parameters must be finite; it is put in eval mode (dropout off),
    as every loaded model is.  ModelLoadError for anything that is not a bridge."""
    from transformer_lens.model_bridge import TransformerBridge

    if not isinstance(bridge, TransformerBridge):
        raise ModelLoadError(f"model: expected a model directory, a hub name (ORG/NAME or hf:ORG/NAME), a loaded "
                             f"harness model or a transformer_lens TransformerBridge, got {type(bridge).__name__}")
    architecture = getattr(bridge.cfg, "architecture", None) or type(bridge.original_model).__name__
    source = f"TransformerBridge ({architecture})"
    for name, p in bridge.named_parameters():
        if p.is_floating_point():
            bad = tensors.count_nonfinite(p.detach())
            if bad:
                raise ModelLoadError(tensors.nonfinite_message(source, name.replace("._original_component", ""),
                                                               bad, p.numel(), ""))
    bridge.eval()
    return LoadedModel(bridge, source, "bridge", bridge_hash(bridge))
