"""What a run spends, counted in forward passes of its prompts.

The unit is one plain forward of the file's n prompts through every layer (a *forward*,
the floor every stage is compared with: docs/performance.md has the cost model).  The
places that run the model report what they ran:

    spend(rows, share)   rows prompt-rows through `share` of the layers (1.0: a whole
                         forward; (L - l) / L: from layer l on)

and a `Ledger`, entered with `counting(n)` by whoever knows n (engine.measure), sums
rows * share / n.  Backward passes are counted at their forward cost (a gradient with
respect to activations only, no parameter gradients, costs about one forward of the layers
it crosses).  Outside a ledger `spend` does nothing, so library callers pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class Ledger:
    """Forward-equivalents spent on n prompts (`total`), and since the last `lap`."""

    n: int
    total: float = 0.0
    since: float = 0.0

    def add(self, rows: float, share: float) -> None:
        f = rows * share / max(1, self.n)
        self.total += f
        self.since += f

    def lap(self) -> float:
        """The forward-equivalents spent since the previous lap (and start a new one)."""
        out, self.since = self.since, 0.0
        return out


_LEDGER: ContextVar[Ledger | None] = ContextVar("harness_cost_ledger", default=None)


@contextmanager
def counting(n: int) -> Iterator[Ledger]:
    """Count what is spent on n prompts until the block ends (nested: the inner ledger counts)."""
    ledger = Ledger(n)
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)


def spend(rows: float, share: float = 1.0) -> None:
    """Record `rows` prompt-rows run through `share` of the model's layers."""
    ledger = _LEDGER.get()
    if ledger is not None:
        ledger.add(float(rows), float(share))


def layers_from(layer: int, n_layers: int) -> float:
    """The share of a forward that starts at `layer`: (L - layer) / L."""
    return max(0.0, (n_layers - layer) / max(1, n_layers))
