"""Progress bars for long loops: shown on stderr only when it is a terminal and
not under CI, so logs stay quiet."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress(items: Iterable[T], label: str) -> Iterable[T]:
    """Iterate `items`, with a tqdm bar on an interactive stderr."""
    if not enabled():
        return items
    from tqdm import tqdm

    return tqdm(items, desc=label, file=sys.stderr, leave=False)
