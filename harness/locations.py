"""Paths a user writes, made absolute: the one rule every file format follows."""

from __future__ import annotations

from pathlib import Path


def resolve(rel: str | Path, base: str | Path) -> Path:
    """`rel` with `~` expanded: as it is when absolute, else relative to `base` (the folder of
    the file that names it)."""
    p = Path(rel).expanduser()
    return p if p.is_absolute() else Path(base) / p
