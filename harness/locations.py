"""Paths a user writes, made absolute: the one rule every file format follows; and what is
wrong with a path that should be a file to read (`file_problem`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def resolve(rel: str | Path, base: str | Path) -> Path:
    """`rel` with `~` expanded: as it is when absolute, else relative to `base` (the folder of
    the file that names it)."""
    p = Path(rel).expanduser()
    return p if p.is_absolute() else Path(base) / p


def file_problem(path: Path) -> str | None:
    """Why `path` cannot be read as a file, in words (None when it is a regular file): not found,
    a symlink loop, a directory, or a device, pipe or socket (which could block or never end)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file" if not os.path.islink(path) else "a symbolic link to nothing"
    except OSError as exc:
        return "a symlink loop (a link that leads back to itself)" if exc.errno == 40 else (exc.strerror or str(exc))
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a device, a pipe or a socket)"
    return None
