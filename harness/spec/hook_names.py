"""TransformerLens hook names, spelled in one place.

`hook_z(1) == "blocks.1.attn.hook_z"`, ...: code elsewhere calls these functions (or reads a
name back with `hook_layer`) instead of writing hook strings inline.  Imports nothing of harness.
"""

from __future__ import annotations

import re

from .components import Head, Mlp

HOOK_EMBED = "hook_embed"
HOOK_POS_EMBED = "hook_pos_embed"  # learned absolute positions only
QKV = ("q", "k", "v")


def hook_z(layer: int) -> str:
    """A layer's attention-weighted values, before W_O: [n, pos, head, d_head]."""
    return f"blocks.{layer}.attn.hook_z"


def hook_pattern(layer: int) -> str:
    """A layer's attention patterns: [n, head, query, key]."""
    return f"blocks.{layer}.attn.hook_pattern"


def hook_input(layer: int, which: str) -> str:
    """A layer's queries, keys or values (`which` in q, k, v): [n, pos, head, d_head]."""
    return f"blocks.{layer}.attn.hook_{which}"


def hook_resid_pre(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_pre"


def hook_resid_post(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


def hook_attn_out(layer: int) -> str:
    return f"blocks.{layer}.hook_attn_out"


def hook_resid_mid(layer: int) -> str:
    """The residual between a layer's attention and its MLP (what the MLP's LN2 reads)."""
    return f"blocks.{layer}.hook_resid_mid"


def hook_attn_sum(layer: int) -> str:
    """A layer's attention output before any post-attention norm: sum_h z_h W_O[h] + b_O
    (equal to hook_attn_out where the model has no such norm)."""
    return f"blocks.{layer}.attn.hook_out"


def hook_mlp_out(layer: int) -> str:
    """A layer's MLP output, as written into the residual stream (its output bias included)."""
    return f"blocks.{layer}.hook_mlp_out"


def unit_hook(unit: Head | Mlp) -> str:
    """Where an ablation of a head (its z) or an MLP (its output) acts."""
    return hook_z(unit.layer) if isinstance(unit, Head) else hook_mlp_out(unit.layer)


_LAYER = re.compile(r"^blocks\.(\d+)\.")


def hook_layer(name: str) -> int | None:
    """The layer of a per-layer hook name (`blocks.L....`), None for any other."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None
