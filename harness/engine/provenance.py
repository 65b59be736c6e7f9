"""Provenance of runs and sweeps: package versions, the host, the command line,
timestamps, and how paths are shown in reports."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..model.ref import ModelRef

PACKAGES = ("harness", "torch", "transformer-lens", "transformers", "numpy", "scipy", "pydantic", "pyyaml",
            "safetensors", "matplotlib", "markdown", "jsonschema")


def versions() -> dict[str, str]:
    """The installed version of every package a result depends on."""
    out = {}
    for pkg in PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def host() -> dict[str, str]:
    return {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine()}


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def command_line() -> str:
    """The command as the user typed it: `harness ARGS` when run from the CLI, else argv."""
    if Path(sys.argv[0]).name in ("harness", "__main__.py"):
        return "harness " + " ".join(sys.argv[1:])
    return " ".join(sys.argv)


def shown_source(kind: str, source: str) -> str:
    """A loaded model's source as reports show it: a handed-over bridge's description as it is,
    anything else by `shown_path`."""
    return source if kind == "bridge" else str(shown_path(source))


def shown_path(path: str | None) -> str | None:
    """A path as reports show it: relative to the working directory when inside it, else
    `~/...` when inside the home folder (as written: links are not followed), else absolute."""
    if path is None or ModelRef.parse(path).is_named:  # a hub model or a registered source: its name
        return path
    p = Path(os.path.abspath(Path(path).expanduser()))
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            return prefix + str(p.relative_to(Path(os.path.abspath(base))))
        except ValueError:
            continue
    return str(p)
