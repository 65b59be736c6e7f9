"""Where means come from, and values the views of the base runs share.

`Reference`: the prompts per-position means (mean ablation, mean replacement) are taken
over: reference prompts other than the one being intervened on, so no prompt's own activation
is part of its replacement; separate reference prompts are held as per-group sums, not prompt
by prompt; `drop=k` leaves out the k-th of `groups` groups as well (the
delete-a-group jackknife that carries the mean's own uncertainty into intervals;
claims.effects, mech.runs.jackknife).  `Lazy`: a value computed on first use (mech.runs.cached.Runs holds
the reference, the edge graph and its probe run this way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..hooks import Cache

GROUPS = 10  # reference groups of the delete-a-group jackknife


@dataclass
class Reference:
    """The prompts per-position means are taken over.

    cache:  with `loo`, the clean prompts' cached activations (prompt n's mean leaves n out);
            else the reference prompts' activations summed per group, [groups, ...] (prompt i
            belongs to group i mod `groups`), so that the reference run holds `groups` rows
            whatever its number of prompts;
    counts: [groups] the reference prompts in each group (None with `loo`)."""

    cache: Cache
    loo: bool
    groups: int = GROUPS
    rows: tuple[int, int] | None = None  # with `loo`: the means of prompts lo..hi-1 only (Runs.prompts)
    counts: Any = None

    def mean(self, x: Any, drop: int | None = None) -> Any:
        """Per-position mean over the reference prompts (leaving out group `drop`, and with `loo`
        each prompt itself) of x: the group sums [groups, ...] of an activation (or anything linear
        in one), or with `loo` the activation of every prompt [m, ...]; [1, ...], or [m, ...] with
        `loo`.  Without `loo`: (sum_g w_g x_g) / (sum_g w_g c_g), w_g = 0 for the dropped group."""
        import torch

        if not self.loo:
            w = torch.ones(x.shape[0], dtype=torch.float64, device=x.device)
            if drop is not None:
                w[drop] = 0.0
            count = float((w * self.counts.to(w)).sum())
            total = (x * w.to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))).sum(0, keepdim=True)
            return total / count
        m = x.shape[0]
        keep = torch.ones(m, dtype=torch.bool, device=x.device)
        if drop is not None:
            keep &= torch.arange(m, device=x.device) % self.groups != drop
        w = keep.to(x.dtype).reshape(m, *([1] * (x.dim() - 1)))
        total = (x * w).sum(0, keepdim=True)
        xs, ws = (x, w) if self.rows is None else (x[slice(*self.rows)], w[slice(*self.rows)])
        return (total - xs * ws) / (keep.sum() - ws)  # each prompt's own activation left out

    @classmethod
    def summed(cls, runs: Any, n: int, groups: int = GROUPS) -> Reference:
        """A reference of n prompts from `runs`: an iterable of (first prompt, cache of the prompts
        from there on), each cache summed into its prompts' groups (in float64, stored in the
        activations' dtype) as it comes, so no more than one cache is held at a time."""
        import torch

        sums: dict[str, Any] = {}
        dtypes: dict[str, Any] = {}
        for lo, cache in runs:
            for name, t in cache.items():
                if t.dim() == 0 or name == "logits_at":
                    continue
                ids = (torch.arange(lo, lo + t.shape[0], device=t.device) % groups)
                if name not in sums:
                    sums[name] = torch.zeros(groups, *t.shape[1:], dtype=torch.float64, device=t.device)
                    dtypes[name] = t.dtype
                sums[name].index_add_(0, ids, t.to(torch.float64))
        counts = torch.bincount(torch.arange(n) % groups, minlength=groups)
        return cls({name: s.to(dtypes[name]) for name, s in sums.items()}, loo=False, groups=groups, counts=counts)


@dataclass
class Lazy:
    """A value computed on first use and shared by every view of the runs."""

    make: Callable[[], Any] | None
    value: Any = None

    def get(self) -> Any:
        if self.value is None and self.make is not None:
            self.value = self.make()
        return self.value

    def drop(self) -> None:
        """Forget the value (made again on next use); a value given without `make` is kept."""
        if self.make is not None:
            self.value = None
