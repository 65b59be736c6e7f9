"""Each layer's rotation table, from the model's own rotary embedding.

A rotary model rotates each head's query and key at position p by the angles p * inv_freq_i
(mech.block.arith.rotate).  The table of cos and sin of those angles for positions 0..s-1 is
what the model's rotary embedding module returns, and harness asks that module for it (the
module the bridge wraps, called on position ids 0..s-1 in the model's dtype and on its
device), so every frequency scaling the module applies (Llama 3's, linear, YaRN's attention
factor) is reproduced to the bit.  A family whose layers use different tables (model.families:
`rotary: layer_type`, Gemma 3's local and global layers) gets each layer the table of its
`layer_types` entry.  A scaling that changes with the sequence length (`dynamic`,
`longrope`) is refused by name.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

from ...errors import UnsupportedError
from ...model import architecture
from ...model.bridge import Bridge

Table = tuple[Any, Any]  # (cos, sin) [1, s, r]

_TABLES: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], list[Table | None]]] = weakref.WeakKeyDictionary()
DYNAMIC = ("dynamic", "longrope")


def module(bridge: Bridge) -> Any:
    """The model's rotary embedding module (the one the bridge wraps)."""
    rot = getattr(bridge, "rotary_emb", None)
    found = getattr(rot, "original_component", None) if rot is not None else None
    if found is None:
        model = getattr(bridge, "original_model", None)
        inner = getattr(model, "model", None) or getattr(model, "gpt_neox", None)
        found = getattr(inner, "rotary_emb", None)
    if found is None:
        raise UnsupportedError(f"{architecture.of(bridge).name}: rotary positions, but no rotary embedding module")
    return found


def tables(bridge: Bridge, s: int, dtype: Any, device: Any) -> list[Table | None]:
    """Per layer, (cos, sin) [1, s, r] of positions 0..s-1 in `dtype` on `device` (None for every
    layer of a model without rotary positions); made once per length, dtype and device."""
    import torch

    arch = architecture.of(bridge)
    if not arch.rotary:
        return [None] * arch.n_layers
    memo = _TABLES.setdefault(bridge, {})
    key = (s, dtype, str(device))
    if key not in memo:
        rot = module(bridge)
        kinds = getattr(rot, "rope_type", None)
        kinds = set(kinds.values()) if isinstance(kinds, dict) else {kinds}
        dynamic = sorted(k for k in kinds if k in DYNAMIC)
        if dynamic:
            raise UnsupportedError(f"{arch.name}: rotary scaling {dynamic[0]!r} changes with the sequence length; "
                                   "harness reproduces fixed tables (default, linear, llama3, yarn)")
        x = torch.zeros(1, s, 1, dtype=_model_dtype(bridge), device=_device(rot))
        ids = torch.arange(s, device=x.device)[None]
        by_type = "layer_type" in inspect.signature(rot.forward).parameters
        made: dict[Any, Table] = {}
        out: list[Table | None] = []
        for kind in arch.rotary_keys:
            if kind not in made:
                with torch.no_grad():
                    cos, sin = rot(x, ids, kind) if by_type and kind is not None else rot(x, ids)
                made[kind] = (cos.to(dtype=dtype, device=device), sin.to(dtype=dtype, device=device))
            out.append(made[kind])
        memo[key] = out
    return memo[key]


def _model_dtype(bridge: Bridge) -> Any:
    """The dtype of the model's hidden states (its first floating-point parameter's)."""
    import torch

    for p in bridge.parameters():
        if p.dtype.is_floating_point:
            return p.dtype
    return torch.float32


def _device(module: Any) -> Any:
    import torch

    t = next(module.buffers(), None)
    return t.device if t is not None else torch.device("cpu")
