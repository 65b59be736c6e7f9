"""Checking a model directory's config.json before anything is built from it.

Native directories (`check_native_config`): every key must be one harness
supports, with a value of the right type and range; anything else is refused
with `FILE: KEY: ...`.  The supported set is what the TL-native model builds
*and* what harness's own mechanics can check against it: learned positions, one
key/value head per query head, no soft caps, causal attention (rotary positions,
grouped key/value heads and soft caps are supported for Hugging Face models, whose
bridges expose the rotation and the attention modules harness reproduces).
`n_heads * d_head` may differ from `d_model`: the native attention projects the
`n_heads * d_head` head outputs back to `d_model`.

`native_weight_count` is the number of matrix entries a config implies (a lower
bound on the elements a matching safetensors file holds); the loader refuses a
config whose count exceeds the file's before allocating anything.

Hugging Face directories (`check_hf_sizes`): the size keys transformers reads for
common architectures must be positive integers when present (`n_head: 0` is
refused here rather than as a ZeroDivisionError inside transformers).  The rest
of a Hugging Face config is checked by building the model on the meta device
and comparing with the safetensors header (loading.check_hf_weights).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .shape import vocab_out

REQUIRED = ("d_model", "d_head", "n_layers", "n_ctx", "n_heads", "d_vocab")
NORMALIZATION_TYPES = ("LN", "LNPre", "RMS", "RMSPre")  # or null: no normalization
ACT_FNS = ("gelu", "gelu_new", "relu", "silu", "swish", "solu", "solu_ln")
NATIVE_ARCHITECTURE = "TransformerLensNative"

# TransformerBridgeConfig fields harness refuses in a native config, with the reason.
UNSUPPORTED = {
    "attn_scores_soft_cap": "soft caps are supported for Hugging Face models (Gemma 2), not in native configs",
    "output_logits_soft_cap": "soft caps are supported for Hugging Face models (Gemma 2), not in native configs",
    "rotary_dim": "rotary positions are supported for Hugging Face models, whose rotation harness reads from the "
                  "model's own hooks; the native bridge has none",
    "rotary_base": "rotary positions are supported for Hugging Face models, whose rotation harness reads from the "
                   "model's own hooks; the native bridge has none",
    "dtype": "the dtype is chosen when loading, not in config.json",
    "device": "the device is chosen when loading (--device, $HARNESS_DEVICE), not in config.json",
}

HF_SIZE_KEYS = ("n_head", "n_embd", "n_layer", "n_positions", "n_ctx", "n_inner", "vocab_size", "hidden_size",
                "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "head_dim", "d_model", "ffn_dim", "num_heads", "num_layers")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _positive_int(v: Any) -> str | None:
    return None if _is_int(v) and v > 0 else "must be a positive integer"


def _choice(allowed: tuple[Any, ...], shown: str) -> Any:
    def check(v: Any) -> str | None:
        return None if v in allowed and not isinstance(v, bool) else f"must be {shown}"
    return check


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _optional(check: Any) -> Any:
    def inner(v: Any) -> str | None:
        return None if v is None else check(v)
    return inner


# key -> check(value) returning None or what the value must be.
CHECKS: dict[str, Any] = {
    **dict.fromkeys(REQUIRED, _positive_int),
    "d_mlp": _optional(_positive_int),
    "attn_only": _bool,
    "gated_mlp": _bool,
    "final_rms": _bool,
    "use_attn_scale": _bool,
    "init_weights": _bool,
    "act_fn": _optional(_choice(ACT_FNS, "one of " + ", ".join(ACT_FNS) + " (or null)")),
    "normalization_type": _optional(_choice(NORMALIZATION_TYPES,
                                            "one of " + ", ".join(NORMALIZATION_TYPES) + " (or null: none)")),
    "positional_embedding_type": _choice(("standard",), "'standard' (learned positional embeddings; rotary "
                                                        "models load from a Hugging Face directory, whose "
                                                        "rotation harness reads from the model's own hooks)"),
    "attention_dir": _choice(("causal",), "'causal' (harness measures next-token metrics)"),
    "eps": lambda v: None if _is_number(v) and v > 0 else "must be a positive number",
    "attn_scale": lambda v: None if _is_number(v) and (v > 0 or v == -1) else
    "must be a positive number, or -1 for sqrt(d_head)",
    "n_key_value_heads": lambda v: None if v is None else "must be null in a native config (grouped-query "
                                                          "attention is supported for Hugging Face models)",
    "d_vocab_out": lambda v: None if _is_int(v) and (v == -1 or v > 0) else
    "must be -1 (the output vocabulary is d_vocab) or the output vocabulary's size (a positive integer)",
    "model_name": lambda v: None if isinstance(v, str) else "must be a string",
    "seed": _optional(lambda v: None if _is_int(v) else "must be an integer"),
    "init_mode": lambda v: None if isinstance(v, str) else "must be a string",
    "initializer_range": lambda v: None if _is_number(v) else "must be a number",
    "architecture": _optional(_choice((NATIVE_ARCHITECTURE,), f"'{NATIVE_ARCHITECTURE}' or null")),
}


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _bridge_fields() -> set[str]:
    import inspect

    from transformer_lens.config import TransformerBridgeConfig

    fields: set[str] = set()
    for cls in TransformerBridgeConfig.__mro__:
        if cls is object:
            continue
        try:
            fields |= set(inspect.signature(cls).parameters)
        except (TypeError, ValueError):
            continue
    return fields - {"kwargs", "args"}


def check_native_config(cfg: dict[str, Any], file: Path) -> None:
    """Raise ModelLoadError (`FILE: KEY: ...`) unless `cfg` (the parsed config.json of a
    native directory) holds the six required keys and only supported keys with
    valid values.  Guarantees, when it returns: the six sizes are positive ints,
    `d_mlp` is null or a positive int, and every enumerated value (normalization,
    activation, positions, attention direction) is one harness and TL both implement."""
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise ModelLoadError(f"{file}: missing TransformerBridgeConfig fields: {', '.join(missing)}")
    for key, value in cfg.items():
        check = CHECKS.get(key)
        if check is None:
            if key in UNSUPPORTED:
                raise ModelLoadError(f"{file}: {key}: not supported for native models ({UNSUPPORTED[key]})")
            known = key in _bridge_fields()
            what = ("a TransformerBridgeConfig field the native loader does not support" if known
                    else "unknown key (not a TransformerBridgeConfig field)")
            raise ModelLoadError(f"{file}: {key}: {what}; native config.json keys: {', '.join(CHECKS)}")
        problem = check(value)
        if problem is not None:
            raise ModelLoadError(f"{file}: {key}: {problem}, got {_shown(value)}")


def native_weight_count(cfg: dict[str, Any]) -> tuple[int, str]:
    """(entries of the weight matrices the native config implies, the largest term
    described).  Biases and norm weights are left out, so a safetensors file
    matching the config holds at least this many elements.  `cfg` must have passed
    check_native_config."""
    d, dv, ctx, L = cfg["d_model"], cfg["d_vocab"], cfg["n_ctx"], cfg["n_layers"]
    dvo = vocab_out(cfg)
    heads = cfg["n_heads"] * cfg["d_head"]
    vocab_term = (f"embedding and unembedding (2 x d_vocab {dv} x d_model {d})" if dvo == dv else
                  f"embedding and unembedding ((d_vocab {dv} + d_vocab_out {dvo}) x d_model {d})")
    terms = {
        vocab_term: (dv + dvo) * d,
        f"positional embedding (n_ctx {ctx} x d_model {d})": ctx * d,
        f"attention (n_layers {L} x 4 x d_model {d} x n_heads*d_head {heads})": L * 4 * d * heads,
    }
    if not cfg.get("attn_only", False):
        d_mlp = cfg.get("d_mlp") or 4 * d
        n = 3 if cfg.get("gated_mlp", False) else 2
        terms[f"MLPs (n_layers {L} x {n} x d_model {d} x d_mlp {d_mlp})"] = L * n * d * d_mlp
    largest = max(terms, key=lambda k: terms[k])
    return sum(terms.values()), largest


def native_buffer_bytes(cfg: dict[str, Any]) -> int:
    """Bytes of the native model's non-weight buffers: one n_ctx x n_ctx causal mask per layer."""
    return int(cfg["n_layers"]) * int(cfg["n_ctx"]) ** 2


def check_hf_sizes(cfg: dict[str, Any], file: Path) -> None:
    """Raise ModelLoadError (`FILE: KEY: ...`) when a size key transformers reads
    (HF_SIZE_KEYS) is present but not a positive integer (null is left to
    transformers, which fills in its default)."""
    for key in HF_SIZE_KEYS:
        if key in cfg and cfg[key] is not None and _positive_int(cfg[key]) is not None:
            raise ModelLoadError(f"{file}: {key}: must be a positive integer, got {_shown(cfg[key])}")
