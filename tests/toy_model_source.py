"""A model source written outside the harness package, as a plugin would write one
(docs/architecture.md, "Adding a model source"): `toy:SEED` is a random 2-layer, 4-head
attention-only native model built in memory from that seed (nothing read from disk)."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.extend import LoadedModel, ModelSource, Shape, from_bridge

CONFIG = {"d_model": 32, "d_head": 8, "n_heads": 4, "n_layers": 2, "n_ctx": 40, "d_vocab": 50, "attn_only": True,
          "normalization_type": "LN", "act_fn": "gelu"}


def load(name: str, device: str | None, dtype: Any) -> LoadedModel:
    import torch
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    seed = int(name)  # ValueError for a name that is not a seed: the loader reports it
    torch.manual_seed(seed)
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**CONFIG, seed=seed))
    if device is not None:
        bridge = bridge.to(device)
    return dataclasses.replace(from_bridge(bridge), source=f"toy:{name}", kind="toy")


SOURCE = ModelSource("toy:", load, lambda name: Shape(CONFIG["n_layers"], CONFIG["n_heads"], False))
