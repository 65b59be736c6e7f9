"""Where means come from, and values the views of the base runs share.

`Reference`: the prompts per-position means (mean ablation, mean replacement) are taken
over: reference prompts other than the one being intervened on, so no prompt's own activation
is part of its replacement; `drop=k` leaves out the k-th of `groups` groups as well (the
delete-a-group jackknife that carries the mean's own uncertainty into intervals;
claims.effects, mech.jackknife).  `Lazy`: a value computed on first use (mech.runs.Runs holds
the reference, the edge graph and its probe run this way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .hooks import Cache

GROUPS = 10  # reference groups of the delete-a-group jackknife


@dataclass
class Reference:
    """The prompts per-position means are taken over.

    cache: their run's cached activations (the same hooks as the base runs);
    loo:   they are the clean prompts themselves, so prompt n's mean leaves n out;
    groups: prompt i belongs to group i mod `groups` (for `drop`)."""

    cache: Cache
    loo: bool
    groups: int = GROUPS
    rows: tuple[int, int] | None = None  # with `loo`: the means of prompts lo..hi-1 only (Runs.prompts)

    def mean(self, x: Any, drop: int | None = None) -> Any:
        """Per-position mean of x [m, ...] over the reference prompts (leaving out group
        `drop`, and with `loo` each prompt itself): [1, ...], or [m, ...] with `loo`."""
        import torch

        m = x.shape[0]
        keep = torch.ones(m, dtype=torch.bool, device=x.device)
        if drop is not None:
            keep &= torch.arange(m, device=x.device) % self.groups != drop
        w = keep.to(x.dtype).reshape(m, *([1] * (x.dim() - 1)))
        total = (x * w).sum(0, keepdim=True)
        if not self.loo:
            return total / keep.sum()
        xs, ws = (x, w) if self.rows is None else (x[slice(*self.rows)], w[slice(*self.rows)])
        return (total - xs * ws) / (keep.sum() - ws)  # each prompt's own activation left out


@dataclass
class Lazy:
    """A value computed on first use and shared by every view of the runs."""

    make: Callable[[], Any] | None
    value: Any = None

    def get(self) -> Any:
        if self.value is None and self.make is not None:
            self.value = self.make()
        return self.value
