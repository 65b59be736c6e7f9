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


def fmt_p(p: Any) -> str:
    """A p-value, everywhere in one form: 3 significant digits (`0.0001`, `0.000133`,
    `1.6e-19`, `1`); `undefined` for None and NaN."""
    if p is None or (isinstance(p, float) and p != p):
        return "undefined"
    return f"{float(p):.3g}"
