"""Loading models as TransformerLens 4.x `TransformerBridge`s.

Model directory formats (see docs/model-format.md):

* **fixture / native**: `config.json` holding `TransformerBridgeConfig` fields
  plus `model.safetensors` holding the bridge state dict (TL-format keys).
  Booted with `TransformerBridge.boot_native`, then the weights are loaded.
* **Hugging Face**: a directory written by `save_pretrained` (its config.json
  has `architectures` or `model_type`), booted with
  `TransformerBridge.boot_transformers`.  Every parameter the architecture
  needs must be in the safetensors file(s): transformers would otherwise fill
  missing weights with random values, silently.
  A hub name is given as `hf:NAME` and needs the user's local cache.

Only safe formats are read: safetensors, never pickles.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .devices import resolve_device

HF_PREFIX = "hf:"


@dataclass
class LoadedModel:
    bridge: Any  # transformer_lens.model_bridge.TransformerBridge
    source: str  # as given (absolute path, or hf:NAME)
    kind: str  # "native" | "transformers"
    sha256: str  # content hash of the weight and config files

    @property
    def n_layers(self) -> int:
        return int(self.bridge.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.bridge.cfg.n_heads)

    @property
    def d_vocab(self) -> int:
        return int(self.bridge.cfg.d_vocab)

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


def directory_hash(path: Path) -> str:
    """sha256 over (name, bytes) of the files that define the model's function:
    `config.json` and every top-level `*.safetensors`, in name order.  Other
    files (model card, training logs) do not change the hash."""
    h = hashlib.sha256()
    for f in sorted([path / "config.json", *path.glob("*.safetensors")]):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def detect_kind(path: Path) -> str:
    """'native' or 'transformers' for a model directory; ModelLoadError otherwise."""
    if not path.exists():
        raise ModelLoadError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{path} has no config.json; a model directory holds config.json "
                             "and model.safetensors")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{cfg_file}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file}: expected a JSON object")
    is_hf = "architectures" in cfg or "model_type" in cfg
    # Hugging Face checkpoints may be sharded (model-00001-of-00002.safetensors, ...)
    has_weights = (path / "model.safetensors").is_file() or (is_hf and any(path.glob("*.safetensors")))
    if not has_weights:
        extra = ""
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            extra = " (pickle weights such as .bin/.pt are not loaded: convert them to safetensors)"
        raise ModelLoadError(f"{path} has no model.safetensors{extra}")
    return "transformers" if is_hf else "native"


def _native_config(path: Path) -> dict:
    cfg = json.loads((path / "config.json").read_text())
    required = ("d_model", "d_head", "n_layers", "n_ctx", "n_heads", "d_vocab")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ModelLoadError(f"{path / 'config.json'}: missing TransformerBridgeConfig fields: "
                             f"{', '.join(missing)}")
    return cfg


def load_native(path: Path, dtype: Any = None, device: str | None = None) -> Any:
    """Boot a native bridge from config.json and load model.safetensors into it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    cfg = _native_config(path)
    try:
        config = TransformerBridgeConfig.from_dict(cfg)
        bridge = TransformerBridge.boot_native(config, device=device, dtype=dtype)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path / 'config.json'}: not a valid TransformerBridgeConfig: {exc}") from None
    try:
        state = load_file(str(path / "model.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(f"{path / 'model.safetensors'}: cannot read: {exc}") from None
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    try:
        result = bridge.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{path / 'model.safetensors'} does not match config.json: "
                             f"{str(exc).splitlines()[0]}") from None
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(f"{path / 'model.safetensors'} does not match config.json: missing "
                             f"{result.missing_keys}, unexpected {result.unexpected_keys}")
    bridge.eval()
    return bridge


def check_hf_weights(path: Path) -> None:
    """Raise ModelLoadError unless the safetensors files hold every parameter of
    the architecture config.json names (tied weights count once)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.from_pretrained(str(path))
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(cfg)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{path / 'config.json'}: not a Hugging Face causal LM config: {exc}") from None
    keys: set[str] = set()
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            keys.update(st.keys())
    prefix = getattr(skeleton, "base_model_prefix", "") + "."
    missing = [n for n, _ in skeleton.named_parameters()
               if n not in keys and not (n.startswith(prefix) and n[len(prefix):] in keys)]
    if missing:
        raise ModelLoadError(f"{path}: the weights do not match config.json ({cfg.model_type}): "
                             f"{len(missing)} parameter(s) missing, e.g. {', '.join(missing[:3])}")


def load_transformers(name_or_path: str, dtype: Any = None, device: str | None = None) -> Any:
    """Boot a bridge around a Hugging Face model (local directory or cached hub name)."""
    from transformer_lens.model_bridge import TransformerBridge

    kwargs: dict = {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if device is not None:
        kwargs["device"] = device
    try:
        bridge = TransformerBridge.boot_transformers(name_or_path, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load Hugging Face model {name_or_path!r}: {exc}") from None
    bridge.eval()
    return bridge


def load_model(source: str | Path, dtype: Any = None, device: str | None = None) -> LoadedModel:
    """Load a model directory (native or Hugging Face) or `hf:NAME` onto `device`,
    resolved by devices.resolve_device (None: $HARNESS_DEVICE, else the best
    available; a bad or unavailable name raises DeviceError before any loading)."""
    device = resolve_device(device)
    src = str(source)
    if src.startswith(HF_PREFIX):
        name = src[len(HF_PREFIX):]
        return LoadedModel(load_transformers(name, dtype, device), src, "transformers", "hub:" + name)
    path = Path(src).resolve()
    kind = detect_kind(path)
    if kind == "native":
        bridge = load_native(path, dtype, device)
    else:
        check_hf_weights(path)
        bridge = load_transformers(str(path), dtype, device)
    return LoadedModel(bridge, str(path), kind, directory_hash(path))
