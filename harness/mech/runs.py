"""The shared base runs of a hypothesis file: the clean and the corrupted
prompts, each run once with the hooks its claims need cached, and the metric
per prompt on each.  Every intervention starts from these caches:

* `ablated(heads, kind)`: the clean prompts with `heads` ablated jointly
  (hooks.ablation_plan), optionally with every attention pattern frozen;
* `patched(edge, direction, replacement)`: exact edge patching
  (patching.prepare / fast_logits) in the given direction.

Each returns the metric per prompt (numpy, float64).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..spec import names
from ..spec.names import hook_pattern, hook_z
from . import hooks, patching
from .hooks import Cache

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

PerPrompt = np.ndarray  # float64 [n_prompts]: the metric (or a change of it) prompt by prompt


@dataclass
class Runs:
    bridge: Any  # the TransformerBridge
    ds: Any  # model.data.Dataset, on the model's device
    clean: Cache  # cached activations of the clean run (+ "logits")
    corrupt: Cache  # the same for the corrupted run
    metric: Callable[[Float[Tensor, "n pos vocab"]], PerPrompt]  # logits -> metric per prompt
    m_clean: PerPrompt
    m_corrupt: PerPrompt

    @property
    def n_layers(self) -> int:
        return int(self.bridge.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.bridge.cfg.n_heads)

    def z(self, run: Cache) -> dict[int, Float[Tensor, "n pos head d_head"]]:
        """{layer: hook_z activations} of the layers cached in `run`."""
        return {layer: run[hook_z(layer)] for layer in range(self.n_layers) if hook_z(layer) in run}

    def patterns(self, run: Cache) -> dict[int, Float[Tensor, "n head query key"]]:
        return {layer: run[hook_pattern(layer)] for layer in range(self.n_layers)}

    def ablated(self, heads: list[names.Head], kind: str, freeze: bool = False) -> PerPrompt:
        """Metric of the clean prompts with `heads` ablated jointly (`kind`: zero, mean, resample)."""
        plan = hooks.ablation_plan(heads, kind, self.z(self.clean), self.z(self.corrupt))
        if freeze:
            plan.hooks += patching.freeze_patterns_plan(self.patterns(self.clean)).hooks
        return self.metric(hooks.run_plan(self.bridge, self.ds.clean, plan))

    def patched(self, edge: names.Edge, direction: str, replacement: str, freeze: bool = False) -> PerPrompt:
        """Metric with `edge` patched: noising runs the clean prompts with the sender's
        replacement output (resample: from the corrupted run) where the receiver reads it;
        denoising runs the corrupted prompts with the clean output there."""
        noising = direction == "noising"
        base, source = (self.clean, self.corrupt) if noising else (self.corrupt, self.clean)
        patch = patching.prepare(self.bridge, edge, base, source, self.clean, replacement)
        extra = patching.freeze_patterns_plan(self.patterns(base)) if freeze else None
        tokens = self.ds.clean if noising else self.ds.corrupted
        return self.metric(patching.fast_logits(self.bridge, tokens, patch, extra))
