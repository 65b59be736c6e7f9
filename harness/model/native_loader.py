"""The native loader: a `TransformerBridgeConfig` config.json and a TL-format model.safetensors.

`load_native` boots the bridge from the config and loads the weights, after checking the
config, the header against it, the memory it needs and that every tensor is finite.
Imports: model.config_check, model.model_dir, model.tensors (torch, safetensors and
TransformerLens lazily).
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelLoadError
from . import tensors
from .config_check import check_native_config, native_buffer_bytes, native_weight_count
from .files import read_bytes
from .model_dir import CONFIG, ModelFiles, compare_tensors, files_hash, stored_dtype
from .tensors import one_line


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
    compare_tensors({k: tuple(v.shape) for k, v in target.items()}, header, str(weights))
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
