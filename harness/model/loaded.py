"""The loaded-model record, and a `TransformerBridge` the caller holds wrapped as one.

`LoadedModel` is what every command and claim receives: the bridge and what was loaded
(source, kind, content hash, revision, stored dtype, GGUF quantisation).  `from_bridge` wraps
a bridge booted elsewhere (a notebook's), hashed over its tensors (`bridge_hash`).
Imports: model.tensors and model.shape (torch and TransformerLens lazily).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..errors import ModelLoadError
from . import tensors
from .bridge import Bridge
from .shape import vocab_out

BRIDGE_HASH_PREFIX = "tensors-sha256:"  # LoadedModel.sha256 of a bridge the user handed over (from_bridge)


@dataclass
class LoadedModel:
    bridge: Bridge  # transformer_lens.model_bridge.TransformerBridge
    source: str  # absolute path, hf:NAME, or "TransformerBridge (ARCHITECTURE)" for a bridge handed over
    kind: str  # "native" | "transformers" | "bridge" | "gguf", or a registered model source's kind
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


def tensor_dtype_name(module: Any) -> str:
    """The dtype of a module's first floating-point parameter, by torch's name (`float32`)."""
    for p in module.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return "float32"


def bridge_hash(bridge: Bridge) -> str:
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


def from_bridge(bridge: Bridge) -> LoadedModel:
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
