"""harness: causal intervention testing for transformer mechanisms.

Public API (imported lazily, so `import harness` does not load torch):

    harness.run(path_or_dict, seed=None, base_dir=None, figures=True, device=None) -> Evidence
    harness.load_hypothesis(path_or_dict) -> LoadedHypothesis   (validation only)
    harness.load_model(path) -> LoadedModel
    harness.Evidence, harness.ClaimResult
    harness.errors: HarnessError, UserError, SpecError, ...
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from . import errors
from .errors import HarnessError, SpecError, UserError

__version__ = "0.1.0"

_LAZY = {
    "run": ("harness.runner", "run"),
    "load_hypothesis": ("harness.spec", "load"),
    "load_model": ("harness.models", "load_model"),
    "Evidence": ("harness.evidence", "Evidence"),
    "ClaimResult": ("harness.evidence", "ClaimResult"),
}

__all__ = ["run", "load_hypothesis", "load_model", "Evidence", "ClaimResult", "errors",
           "HarnessError", "SpecError", "UserError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(import_module(module), attr)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
