"""Loading models as TransformerLens 4.x `TransformerBridge`s.

Model directory formats (see docs/model-format.md):

* **fixture / native**: `config.json` holding `TransformerBridgeConfig` fields
  plus `model.safetensors` holding the bridge state dict (TL-format keys).
  Booted with `TransformerBridge.boot_native`, then the weights are loaded.
* **Hugging Face**: a directory written by `save_pretrained` (its config.json
  has `architectures` or `model_type`), booted with
  `TransformerBridge.boot_transformers`.  Its weights are exactly
  `model.safetensors`, or the shards named by `model.safetensors.index.json`.
  A hub name is given as `hf:NAME` and needs the user's local cache.

The loader's rule: only safetensors are read, never pickles.  A directory holding a
pickle file (PICKLE_SUFFIXES) is refused; transformers is made to load exactly the
files the loader checked and hashed.  Before anything is allocated, config.json is
validated and compared with the safetensors header (sizes that would need more
memory than the weights hold are refused); every loaded tensor is checked for
NaN/inf.  Every problem is a one-line ModelLoadError naming the file.
"""

from __future__ import annotations

import hashlib
import re
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
from .files import PICKLE_SUFFIXES, inside, list_dir, parse_json, pickle_files, read_bytes, read_json
from .shape import vocab_out
from .tensors import TensorInfo, one_line, shape_text

HF_PREFIX = "hf:"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# transformers loads *every* *.safetensors of a directory holding a file named like this
# (a torch.distributed checkpoint), whatever else it is told: such directories are refused.
DISTRIBUTED_SHARD = re.compile(r"^shard-[0-9]{5}-model-[0-9]{5}-of-[0-9]{5}\.safetensors$")
CONVERT = ("convert them to safetensors (transformers: save_pretrained(dir); torch: "
           "safetensors.torch.save_file(state_dict, 'model.safetensors')) and remove the pickle files")


@dataclass
class LoadedModel:
    bridge: Any  # transformer_lens.model_bridge.TransformerBridge
    source: str  # as given (absolute path, or hf:NAME)
    kind: str  # "native" | "transformers"
    sha256: str  # content hash of config.json and the weight files loaded (directory_hash)

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
    def bos_token(self) -> int:
        """The tokenizer's start token id; 0 for models without a tokenizer (fixtures)."""
        tok = getattr(self.bridge, "tokenizer", None)
        bos = getattr(tok, "bos_token_id", None) if tok is not None else None
        return int(bos) if bos is not None else 0

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


def _contained(folder: Path, name: str) -> Path:
    """`folder/name`, refused when it is a symlink leading out of `folder`."""
    target = inside(folder, name)
    if target is None:
        raise ModelLoadError(f"{folder / name}: a symlink to a file outside the model directory; every file the "
                             "loader reads must lie inside it (copy the file in)")
    return target


def _index_shards(folder: Path, index: Path) -> tuple[Path, ...]:
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
        target = inside(folder, name)
        if target is None:
            raise ModelLoadError(f"{where}: {name!r} is outside the model directory (shards are relative paths "
                                 "inside it: no absolute path, no '..', no symlink leading out)")
        if not target.is_file():
            raise ModelLoadError(f"{where}: shard {name!r} does not exist in {folder}")
        shards.add(target)
    return tuple(sorted(shards, key=lambda f: f.relative_to(folder).as_posix()))


def _hf_extra_files(folder: Path, cfg: dict) -> list[Path]:
    """Safetensors files transformers loads besides the checkpoint for some
    architectures (their config class's `extra_files`), when present."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        return []
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return []
    names = getattr(CONFIG_MAPPING[model_type], "extra_files", ()) or ()
    return [_contained(folder, n) for n in names if (folder / n).is_file()]


def model_files(path: Path) -> ModelFiles:
    """Check a model directory and name the files the loader will read.

    Guarantees, when it returns: `path` is a directory holding a UTF-8 JSON object
    `config.json` and no pickle file (PICKLE_SUFFIXES) at its top level; the kind
    is "transformers" when config.json has `architectures` or `model_type`, else
    "native"; `weights` are the safetensors files that will be loaded, inside the
    directory: `model.safetensors` for a native directory; for a Hugging Face
    directory `model.safetensors`, else the shards named by
    `model.safetensors.index.json` (relative, inside, present), plus the
    architecture's extra files.  Other *.safetensors files are neither loaded nor
    hashed.  ModelLoadError (one line, naming the file) otherwise."""
    if not path.exists():
        raise ModelLoadError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory")
    cfg_file = path / CONFIG
    if not cfg_file.is_file():
        raise ModelLoadError(f"{path} has no config.json; a model directory holds config.json "
                             "and model.safetensors")
    cfg_file = _contained(path, CONFIG)
    cfg_bytes = read_bytes(cfg_file, limit=_files.MAX_TEXT_BYTES)
    cfg = parse_json(cfg_bytes, cfg_file)
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file}: expected a JSON object")
    pickles = pickle_files(path)
    if pickles:
        more = f" (and {len(pickles) - 1} more pickle file(s))" if len(pickles) > 1 else ""
        raise ModelLoadError(f"{pickles[0]}: pickle weights are not loaded{more}: harness reads safetensors only "
                             f"and refuses a model directory holding {'/'.join(PICKLE_SUFFIXES)} files; {CONVERT}")
    is_hf = "architectures" in cfg or "model_type" in cfg
    kind = "transformers" if is_hf else "native"
    if not is_hf:
        if not (path / WEIGHTS).is_file():
            raise ModelLoadError(f"{path} has no model.safetensors")
        return ModelFiles(path, kind, cfg, cfg_bytes, (_contained(path, WEIGHTS),))
    for f in list_dir(path):
        if DISTRIBUTED_SHARD.match(f.name):
            raise ModelLoadError(f"{f}: a torch.distributed checkpoint shard; transformers would load every "
                                 "*.safetensors file of the directory instead of model.safetensors: remove it "
                                 "or save the model with save_pretrained")
    index: Path | None = None
    if (path / WEIGHTS).is_file():
        weights: tuple[Path, ...] = (_contained(path, WEIGHTS),)
    elif (path / INDEX).is_file():
        index = _contained(path, INDEX)
        weights = _index_shards(path, index)
    else:
        stray = sorted(f.name for f in path.glob("*.safetensors"))
        extra = f" ({', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not loaded: only model.safetensors " \
                "or the shards an index names)" if stray else ""
        raise ModelLoadError(f"{path} has no model.safetensors or {INDEX}{extra}")
    files = ModelFiles(path, kind, cfg, cfg_bytes, weights, index)
    asked = cfg.get("transformers_weights")
    if asked is not None and asked != files.pinned:
        raise ModelLoadError(f"{cfg_file}: transformers_weights: harness loads {files.pinned}, "
                             f"got {asked!r} (remove the key)")
    extra_files = _hf_extra_files(path, cfg)
    if extra_files:
        files = replace(files, weights=tuple(sorted({*weights, *extra_files}, key=files.name)))
    return files


def detect_kind(path: Path) -> str:
    """'native' or 'transformers' for a model directory (model_files); ModelLoadError otherwise."""
    return model_files(path).kind


def _file_hash(files: ModelFiles, contents: dict[Path, bytes] | None = None) -> str:
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
        try:
            with open(f, "rb") as stream:
                while chunk := stream.read(1 << 24):
                    h.update(chunk)
        except OSError as exc:
            raise ModelLoadError(f"{f}: cannot read: {exc.strerror or exc}") from None
    return h.hexdigest()


def directory_hash(path: Path) -> str:
    """The content hash of a model directory: sha256 over (name, bytes) of exactly
    the files whose content is loaded: `config.json` and the weight files of
    `model_files` (`model.safetensors`, or `model.safetensors.index.json` and its
    shards), in name order.  Other files (model card, training logs, tokenizer
    files, stray *.safetensors) do not change the hash."""
    return _file_hash(model_files(path.resolve()))


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


def load_native(files: ModelFiles, dtype: Any = None, device: str | None = None) -> tuple[Any, str]:
    """Boot a native bridge from config.json and load model.safetensors into it.

    Returns (bridge, content hash of the bytes loaded).  Guarantees: config.json
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
    return bridge, _file_hash(files, {weights: data})


def check_hf_weights(files: ModelFiles, dtype: Any = None) -> None:
    """Check a Hugging Face directory before transformers loads it.

    Guarantees, when it returns: config.json builds a causal LM in transformers
    (built on the `meta` device: nothing allocated); the weight files are readable
    safetensors (complete headers, data covering every tensor) holding every
    parameter of that model (tied weights once, the base-model prefix optional),
    each with the shape the config implies, and each tensor named by an index in
    the shard it names; loading fits in this machine's memory; no tensor holds a
    NaN or an infinity.  ModelLoadError naming the file (and tensor) otherwise."""
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
    prefix = getattr(skeleton, "base_model_prefix", "") + "."
    expected: dict[str, tuple[int, ...]] = {}
    missing: list[str] = []
    for n, p in skeleton.named_parameters():
        stripped = n[len(prefix):] if n.startswith(prefix) else None
        found = n if n in header else stripped if stripped is not None and stripped in header else None
        if found is None:
            missing.append(n)
        else:
            expected[found] = tuple(p.shape)
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


def load_transformers(name_or_path: str, dtype: Any = None, device: str | None = None,
                      weights: str | None = None) -> Any:
    """Boot a bridge around a Hugging Face model (local directory or cached hub name).

    transformers loads safetensors only (`use_safetensors=True`), and exactly the
    file `weights` (`model.safetensors` or the index) when given: it is set as the
    config's `transformers_weights`, overriding config.json's.  Every parameter is
    finite after loading (in `dtype`)."""
    from transformer_lens.model_bridge import TransformerBridge

    kwargs: dict = {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if device is not None:
        kwargs["device"] = device
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()  # no "Loading weights" bar between the stage lines
    hf_logging.disable_progress_bar()
    try:
        bridge = TransformerBridge.boot_transformers(name_or_path, model_class=_SafetensorsOnly,
                                                     hf_config_overrides={"transformers_weights": weights}, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        if "use_safetensors" in str(exc):  # transformers found no safetensors checkpoint
            raise ModelLoadError(f"cannot load Hugging Face model {name_or_path!r}: it has no model.safetensors "
                                 f"or {INDEX}, and pickle weights (pytorch_model.bin) are not loaded: "
                                 "convert them to safetensors") from None
        raise ModelLoadError(f"cannot load Hugging Face model {name_or_path!r}: {one_line(exc)}") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    for name, p in bridge.original_model.named_parameters():
        bad = tensors.count_nonfinite(p.detach())
        if bad:
            after = f" after loading as {dtype}" if dtype is not None else ""
            raise ModelLoadError(tensors.nonfinite_message(name_or_path, name.replace("._original_component", ""),
                                                           bad, p.numel(), after))
    bridge.eval()
    return bridge


def load_model(source: str | Path, dtype: Any = None, device: str | None = None) -> LoadedModel:
    """Load a model directory (native or Hugging Face) or `hf:NAME` onto `device`,
    resolved by devices.resolve_device (None: $HARNESS_DEVICE, else the best
    available; a bad or unavailable name raises DeviceError before any loading).

    Guarantees: only safetensors were read; `sha256` covers exactly config.json
    and the weight files whose tensors were loaded (directory_hash; `hub:NAME` for
    hub models); the weights are finite.  ModelLoadError (one line naming the
    file) for every problem with the directory."""
    device = resolve_device(device)
    src = str(source)
    if src.startswith(HF_PREFIX):
        name = src[len(HF_PREFIX):]
        if name and Path(name).exists():
            raise ModelLoadError(f"{src}: {name} is also a path here, and transformers would load it instead of "
                                 f"the hub model: give the directory without {HF_PREFIX}, or run from another folder")
        return LoadedModel(load_transformers(name, dtype, device), src, "transformers", "hub:" + name)
    path = Path(src).resolve()
    files = model_files(path)
    if files.kind == "native":
        bridge, digest = load_native(files, dtype, device)
    else:
        check_hf_weights(files, dtype)
        digest = _file_hash(files)
        bridge = load_transformers(str(path), dtype, device, files.pinned)
    return LoadedModel(bridge, str(path), files.kind, digest)
