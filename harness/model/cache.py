"""Loaded models kept for reuse, keyed by (source, resolved device).

A `ModelCache` keeps at most `capacity` models (None: no limit), dropping the
least recently used one.  Two caches exist, with their policies stated where
they are made: `engine.runner.MODELS` (no limit: a test session or a script
reuses each model it names) and `sweep.jobs.MODELS` (one model: a sweep walks
through checkpoints model by model, and each is needed once).
"""

from __future__ import annotations

from collections import OrderedDict

from .devices import resolve_device
from .loaded import LoadedModel
from .ref import ModelRef


class ModelCache:
    def __init__(self, capacity: int | None = None):
        if capacity is not None and capacity < 1:
            raise ValueError("a model cache holds at least one model")
        self.capacity = capacity
        self._models: OrderedDict[tuple[str, str], LoadedModel] = OrderedDict()

    def get(self, source: str | ModelRef, device: str | None = None) -> LoadedModel:
        """The model `source` names (a ModelRef, or a text ModelRef.parse reads) on `device`
        (devices.resolve_device: None = $HARNESS_DEVICE or the best available), loaded on first use."""
        ref = source if isinstance(source, ModelRef) else ModelRef.parse(source)
        key = (ref.source, resolve_device(device))
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        if self.capacity is not None:
            while len(self._models) >= self.capacity:
                self._models.popitem(last=False)
        model = ref.load(device=key[1])
        self._models[key] = model
        return model

    def clear(self) -> None:
        self._models.clear()

    def __len__(self) -> int:
        return len(self._models)
