"""How numbers of the evidence read in text (the claim table, report.md)."""

from __future__ import annotations

from typing import Any


def fmt(x: Any, digits: int = 3) -> str:
    """A number with `digits` decimals; `undefined` for None and NaN."""
    if x is None or (isinstance(x, float) and x != x):
        return "undefined"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def fmt_ci(ci: list[Any] | None, digits: int = 3) -> str:
    """`[low, high]`, or `undefined`."""
    if not ci:
        return "undefined"
    return f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"
