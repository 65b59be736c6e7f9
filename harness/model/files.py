"""Reading the small files of a model directory as bad input, not as crashes.

Every reader here raises the error class it is given (a `UserError`, e.g.
`ModelLoadError`) with one line naming the file: unreadable files
(PermissionError and other OSErrors), text that is not UTF-8, JSON that does not
parse.  Also: which files of a directory are pickles, and whether a relative file
name stays inside a directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ModelLoadError, UserError

# Suffixes of files written with pickle (torch.save, pickle, joblib, Lightning checkpoints).
# They can run code when loaded, so a model directory holding one is refused.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
# config.json, checkpoint.json and index files are small: a bigger one is not read into memory
MAX_TEXT_BYTES = 64 * 2**20


def read_bytes(path: Path, error: type[UserError] = ModelLoadError, limit: int | None = None) -> bytes:
    """The bytes of `path`; `error` naming the file when it cannot be read or (with
    `limit`) is larger than `limit` bytes, checked before reading."""
    try:
        if limit is not None and (size := path.stat().st_size) > limit:
            raise error(f"{path}: {size:,} bytes, more than the {limit:,} a text file of a model directory "
                        "may have")
        return path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def decode_text(data: bytes, path: Path, error: type[UserError] = ModelLoadError) -> str:
    """`data` (the bytes of `path`) as UTF-8 text; `error` naming the file and the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def parse_json(data: bytes, path: Path, error: type[UserError] = ModelLoadError) -> Any:
    """`data` (the bytes of `path`) parsed as UTF-8 JSON; `error` as `FILE:LINE: not
    valid JSON: reason` when it does not parse."""
    text = decode_text(data, path, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON: nested too deeply") from None


def read_text(path: Path, error: type[UserError] = ModelLoadError) -> str:
    """The UTF-8 text of `path` (at most MAX_TEXT_BYTES); `error` naming the file otherwise."""
    return decode_text(read_bytes(path, error, MAX_TEXT_BYTES), path, error)


def read_json(path: Path, error: type[UserError] = ModelLoadError) -> Any:
    """The parsed UTF-8 JSON in `path` (at most MAX_TEXT_BYTES); `error` naming the
    file (and line) when it cannot be read, is too large, is not UTF-8 or does not parse."""
    return parse_json(read_bytes(path, error, MAX_TEXT_BYTES), path, error)


def list_dir(path: Path, error: type[UserError] = ModelLoadError) -> list[Path]:
    """The entries of directory `path`, sorted by name; `error` when it cannot be listed."""
    try:
        return sorted(path.iterdir())
    except OSError as exc:
        raise error(f"{path}: cannot list the directory: {exc.strerror or exc}") from None


def pickle_files(path: Path) -> list[Path]:
    """The files directly in directory `path` whose suffix marks a pickle (PICKLE_SUFFIXES)."""
    return [f for f in list_dir(path) if f.name.lower().endswith(PICKLE_SUFFIXES) and not f.is_dir()]


def inside(folder: Path, name: str) -> Path | None:
    """`folder / name` when `name` is a relative path that stays inside `folder`: no
    absolute path, no `..`, no backslash, and, following symlinks, still below
    `folder`.  None otherwise."""
    if not name or "\\" in name or "\0" in name:
        return None
    rel = PurePosixPath(name)
    if rel.is_absolute() or any(part == ".." for part in rel.parts):
        return None
    target = folder / rel
    root = Path(os.path.realpath(folder))
    real = Path(os.path.realpath(target))
    return target if root in real.parents else None
