"""Hugging Face hub names resolved in the local cache, offline (no torch, no network).

A hypothesis's `model: EleutherAI/pythia-70m` (or `hf:EleutherAI/pythia-70m`, `--model`,
`harness.run(..., model=...)`) names a model in the local Hugging Face cache:
`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, laid out as the
hub client writes it:

    models--ORG--NAME/refs/main              the commit hash of the revision `main`
    models--ORG--NAME/snapshots/<hash>/...   the files (often symlinks into ../../blobs/)
    models--ORG--NAME/blobs/<sha>            the files' contents

model.ref.ModelRef decides what a `model:` text is (an existing directory wins; `hf:`
forces the hub), `find_snapshot` finds the snapshot folder the loader then reads like a
local directory, and `within` is the loader's containment rule for a snapshot: a
symlink may lead anywhere inside the repository's cache folder, not out of it.
Nothing here downloads: a name that is not in the cache is a one-line ModelLoadError
naming the folder searched and how to fill it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ModelLoadError
from .files import inside, read_bytes

HF_PREFIX = "hf:"
# a hub repository id: NAME or ORG/NAME, each part letters, digits, '-', '_', '.', starting
# with a letter or digit, at most 96 characters; the hub refuses '--' and '..' in names
_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
HUB_NAME = re.compile(rf"^(?:{_PART}/)?{_PART}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REVISION = "main"


def is_hub_name(text: str) -> bool:
    """Whether `text` is spelled like a hub repository id (`NAME` or `ORG/NAME`)."""
    return bool(HUB_NAME.match(text)) and "--" not in text and ".." not in text and not text.endswith(".git")


def cache_dir() -> Path:
    """The hub cache folder: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
    (the order huggingface_hub reads them in)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def repo_folder(name: str) -> str:
    """The cache folder name of hub model `name`: `models--ORG--NAME`."""
    return "models--" + name.replace("/", "--")


@dataclass(frozen=True)
class Snapshot:
    """A hub model found in the local cache."""

    name: str  # ORG/NAME as given
    root: Path  # the repository's cache folder, models--ORG--NAME (symlinks may lead anywhere inside it)
    folder: Path  # root/snapshots/<revision>: read like a model directory
    revision: str  # the commit hash refs/main names


def _fill_hint(name: str, cache: Path) -> str:
    return (f"on a machine with network access run `huggingface-cli download {name}` (or "
            f"`hf download {name}`) and copy its cache folder {repo_folder(name)} into {cache} (or point "
            "HF_HUB_CACHE at a cache that holds it); harness never downloads")


def find_snapshot(name: str) -> Snapshot:
    """The snapshot of hub model `name` that refs/main names, in cache_dir().

    Guarantees, when it returns: `name` is a hub name; `root` is
    cache_dir()/models--ORG--NAME, `revision` the 40-hex commit refs/main holds, and
    `folder` = root/snapshots/<revision> is a directory.  ModelLoadError (one line,
    naming the folder searched and how to fill it) otherwise."""
    if not is_hub_name(name):
        raise ModelLoadError(f"{HF_PREFIX}{name}: not a Hugging Face model name (NAME or ORG/NAME: letters, digits, "
                             "'-', '_', '.', starting with a letter or digit)")
    cache = cache_dir()
    root = cache / repo_folder(name)
    where = ("the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; a model: that is "
             "not an existing directory is looked up there")
    if not root.is_dir():
        raise ModelLoadError(f"Hugging Face model {name!r} is not in the local cache: {root} does not exist "
                             f"({where}): {_fill_hint(name, cache)}")
    ref = root / "refs" / REVISION
    if not ref.is_file():
        raise ModelLoadError(f"{ref}: missing: the cache holds {name!r} but no revision {REVISION!r} "
                             f"(refs/{REVISION} names the snapshot harness loads): {_fill_hint(name, cache)}")
    revision = read_bytes(ref, limit=4096).decode("utf-8", "replace").strip()
    if not COMMIT.match(revision):
        raise ModelLoadError(f"{ref}: expected a 40-character commit hash, got {revision[:60]!r}: "
                             f"{_fill_hint(name, cache)}")
    folder = root / "snapshots" / revision
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: missing: refs/{REVISION} names revision {revision}, which the cache has "
                             f"no snapshot of: {_fill_hint(name, cache)}")
    return Snapshot(name, root, folder, revision)


def within(folder: Path, name: str, root: Path | None = None) -> Path | None:
    """`folder / name` when `name` is a relative path inside `folder` (no absolute path,
    no `..`, no backslash) whose target, following symlinks, lies inside `root` (default
    `folder` itself: files.inside).  A cache snapshot passes its repository folder as
    `root`: its files are links into ../../blobs/, which stay inside it.  None otherwise."""
    if root is None or root == folder:
        return inside(folder, name)
    if not name or "\\" in name or "\0" in name or PurePosixPath(name).is_absolute():
        return None
    try:
        rel = folder.relative_to(root).as_posix()
    except ValueError:
        return None
    return folder / name if inside(root, f"{rel}/{name}") is not None else None
