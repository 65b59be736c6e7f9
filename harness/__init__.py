"""harness: causal intervention testing for transformer mechanisms.

The public API (imported lazily, so `import harness` does not load torch):

    harness.run(path_or_dict, seed=None, base_dir=None, figures=True, model=None, device=None) -> Evidence
    harness.write_report(evidence, out_dir=None, reports_root=None) -> Path   (report.md, .html, evidence.json)
    harness.claim_table(evidence) -> str
    harness.load_hypothesis(path_or_dict, base_dir=None, check_model=False) -> LoadedHypothesis
        (validation only; check_model: names against the model's config.json too; a dict's
        problems name the field and the claim's id, `claims[2] (id: prev-token): head: ...`)
    harness.load_model(path_or_hf_name, device=None) -> LoadedModel
    harness.Evidence, harness.ClaimResult, harness.Verdict
    harness.errors: HarnessError, UserError, SpecError, ... and ExitCode

Everything else (harness.claims, harness.engine, harness.mech, ...) is internal:
docs/architecture.md says where things live and how to add a claim kind.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from . import errors
from .errors import ExitCode, HarnessError, SpecError, UserError

__version__ = "0.1.0"

_LAZY = {
    "run": ("harness.engine.runner", "run"),
    "write_report": ("harness.report.writer", "write_report"),
    "claim_table": ("harness.report.markdown", "claim_table"),
    "load_hypothesis": ("harness.hypothesis.loading", "load"),
    "load_model": ("harness.model.ref", "load_model"),
    "Evidence": ("harness.evidence.result", "Evidence"),
    "ClaimResult": ("harness.evidence.result", "ClaimResult"),
    "Verdict": ("harness.evidence.verdicts", "Verdict"),
}

__all__ = ["run", "write_report", "claim_table", "load_hypothesis", "load_model", "Evidence", "ClaimResult",
           "Verdict", "errors", "ExitCode", "HarnessError", "SpecError", "UserError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(import_module(module), attr)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
