"""A model directory's size, read from its config.json alone (no torch).

`harness validate` uses it to check the component names of a hypothesis against
the model's layers and heads before any model is loaded.  Both config styles the
loader reads are understood: native (TransformerBridgeConfig keys `n_layers`,
`n_heads`, `attn_only`) and Hugging Face (a config with `architectures` or
`model_type`: `n_layer`/`n_head` as GPT-2 writes them, or `num_hidden_layers`/
`num_attention_heads` and the other spellings transformers uses; such models have
MLPs).  Anything this cannot read (no config.json, not JSON, sizes missing or
not positive integers) gives None: the names are then checked when the model
loads, where the loader reports what is wrong with the directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UserError
from ..spec.names import Shape
from .files import read_json
from .hub_cache import within

CONFIG = "config.json"
NATIVE_KEYS = (("n_layers",), ("n_heads",))
HF_KEYS = (("n_layer", "num_hidden_layers", "num_layers", "n_layers"),
           ("n_head", "num_attention_heads", "num_heads", "n_heads"))


def _size(cfg: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of `keys` that `cfg` has, when it is a positive integer (else None)."""
    for key in keys:
        if key in cfg:
            value = cfg[key]
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


def config_shape(folder: Path, root: Path | None = None) -> Shape | None:
    """The layers, heads and whether there are MLPs that `folder/config.json` gives;
    None when `folder` is not a directory holding a readable config.json (inside it, or,
    for a hub cache snapshot, inside its repository folder `root`) with positive integer
    layer and head counts."""
    if not folder.is_dir():
        return None
    cfg_file = within(folder, CONFIG, root)
    if cfg_file is None or not cfg_file.is_file():
        return None
    try:
        cfg = read_json(cfg_file)
    except UserError:
        return None
    if not isinstance(cfg, dict):
        return None
    hf = "architectures" in cfg or "model_type" in cfg
    layer_keys, head_keys = HF_KEYS if hf else NATIVE_KEYS
    n_layers, n_heads = _size(cfg, layer_keys), _size(cfg, head_keys)
    if n_layers is None or n_heads is None:
        return None
    has_mlp = True if hf else cfg.get("attn_only", False) is not True
    return Shape(n_layers, n_heads, has_mlp)


def vocab_out(cfg: Any) -> int:
    """The output vocabulary of a model config (a config.json mapping or a TransformerBridge
    config): `d_vocab_out` when it is set (not -1), else `d_vocab`."""
    values: dict[str, Any] = cfg if isinstance(cfg, dict) else vars(cfg)
    out = values.get("d_vocab_out", -1)
    return int(values["d_vocab"]) if out in (-1, None) else int(out)
