"""The Hugging Face loader: a `save_pretrained` directory, a cache snapshot or a GGUF file,
loaded as `TransformerBridge.boot_transformers` loads it, offline and from safetensors only.

`check_hf_weights` checks a directory's weights against its config before anything is
allocated; `load_transformers` builds the bridge (`_boot_without_tokenizer`: the tokenizer is
read later, when something needs it), with transformers made to read exactly the checked files.
Imports: model.config_check, model.files, model.model_dir, model.tensors (transformers,
huggingface_hub and TransformerLens lazily).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import ModelLoadError
from . import families, tensors
from .config_check import check_hf_sizes
from .files import read_json
from .model_dir import CONFIG, INDEX, ModelFiles, compare_tensors, stored_dtype
from .tensors import TensorInfo, one_line


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
    compare_tensors(expected, {k: header[k] for k in expected}, str(path), f"config.json ({cfg.model_type})")
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


def _name_architecture(hf_config: Any, shown: str) -> None:
    """Set the config's `architectures` from its `model_type` where it names none (a GGUF file's config:
    `gemma3_text` -> Gemma3ForCausalLM, model.families); ModelLoadError, before any weight is read, when
    no family harness supports covers the architecture or the model type."""
    named = getattr(hf_config, "architectures", None)
    if named:
        if families.of_architecture(str(named[0])) is None:
            raise ModelLoadError(f"cannot load {shown}: {named[0]} is not a supported architecture; harness "
                                 f"supports {', '.join(families.supported())} (a family is added as in "
                                 "docs/architecture.md)")
        return
    model_type = str(getattr(hf_config, "model_type", "") or "")
    family = families.of_model_type(model_type)
    if family is None:
        known = ", ".join(t for f in families.FAMILIES for t in f.model_types)
        raise ModelLoadError(f"cannot load {shown}: its config names no architecture, and model_type "
                             f"{model_type!r} is none harness supports ({known})")
    hf_config.architectures = [family.architectures[0]]


def _boot_without_tokenizer(path: str, dtype: Any, device: str | None, weights: str | None,
                            gguf_file: str | None = None, shown: str | None = None) -> Any:
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
    _name_architecture(hf_config, shown or f"Hugging Face model {path!r}")
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
            bridge = _boot_without_tokenizer(name_or_path, dtype, device, weights, gguf_file, shown)
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
