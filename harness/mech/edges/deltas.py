"""The senders' changes of write a batched sweep reads (mech.edges.batched): each computed once, kept
only while a later chunk of the sweep reads it again, at every position or at the scored ones.
Imports: mech.block.layer, mech.edges.writes, model.devices, spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...model.bridge import Bridge
from ...model.devices import like
from ...spec import names
from ...spec.names import hook_resid_pre
from ...spec.vocabulary import Replacement
from ..block.layer import at
from . import writes


class Deltas:
    """senders -> [S, n, s, d] (`scored`: [S, n, k, d], at the scored positions only): D_A, the change of
    each sender's write (mech.edges.writes), computed in float64 once per sender and kept only while a
    later chunk of the sweep reads it again (`expect`), so that what is held is bounded by the senders
    of the chunks at hand, not by every sender of the sweep.  resample: the source run's activation;
    mean: its mean over `clean`'s prompts; zero: 0.  At the scored positions, resample and zero read
    the caches there alone (a write's change at a position reads that position only); mean takes the
    per-position means over every position first."""

    def __init__(self, bridge: Bridge, base: dict[str, Any], source: dict[str, Any], clean: dict[str, Any],
                 replacement: str, positions: Any) -> None:
        self.bridge, self.base, self.source, self.clean = bridge, base, source, clean
        self.replacement, self.positions = replacement, positions
        self.memo: dict[tuple[str, bool], Any] = {}
        self.uses: dict[tuple[str, bool], int] = {}
        self.scored_caches: tuple[Any, Any] | None = None

    def expect(self, senders: Sequence[names.Sender], scored: bool = False) -> None:
        """One more chunk will read these senders' changes."""
        for x in {str(x) for x in senders}:
            self.uses[(x, scored)] = self.uses.get((x, scored), 0) + 1

    def __call__(self, senders: Sequence[names.Sender], scored: bool = False) -> Any:
        import torch

        out = torch.stack([self._one(x, scored) for x in senders])
        for x in {str(x) for x in senders}:
            key = (x, scored)
            self.uses[key] = self.uses.get(key, 1) - 1
            if self.uses[key] <= 0:
                self.memo.pop(key, None)
        return out

    def _one(self, x: names.Sender, scored: bool) -> Any:
        key = (str(x), scored)
        if key in self.memo:
            return self.memo[key]
        ref = self.base[hook_resid_pre(0)]
        if scored and self.replacement != Replacement.MEAN:
            if self.scored_caches is None:
                self.scored_caches = (AtPositions(self.base, self.positions),
                                      AtPositions(self.source, self.positions))
            base, source = self.scored_caches
            got = like(writes.sender_change(self.bridge, base, source, x, self.replacement), ref)
        else:
            means = ({m: writes.activation(self.bridge, self.clean, m).mean(0, keepdim=True)
                      for m in writes.members(x)} if self.replacement == Replacement.MEAN else None)
            got = like(writes.sender_change(self.bridge, self.base, self.source, x, self.replacement, means), ref)
            got = at(self.positions, got[None])[0] if scored else got
        if self.uses.get(key, 0) > 1:
            self.memo[key] = got
        return got


class AtPositions(dict[str, Any]):
    """A cache's activations [n, s, ...] at the scored positions [n, k] only ([n, k, ...]), each gathered
    on first read."""

    def __init__(self, cache: dict[str, Any], positions: Any) -> None:
        super().__init__()
        self.cache, self.positions = cache, positions

    def __missing__(self, name: str) -> Any:
        got = self[name] = at(self.positions, self.cache[name][None])[0]
        return got

    def __contains__(self, name: object) -> bool:
        return name in self.cache
