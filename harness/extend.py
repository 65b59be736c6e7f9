"""What code outside the package needs to extend harness: the declared extension surface.

A plugin (docs/architecture.md, "Registries and plugins") imports from here and nowhere else
in harness; everything not named here is internal and may change between versions.  Each
extension point has its register function, and a conformance check (harness.conformance,
re-exported here) that a plugin author runs on their own code, in the spirit of
scikit-learn's `check_estimator`:

* a model family: `Family`, `register_family`, `check_family(family, model_dir)`;
* a claim kind, with the view it carries (`ClaimKind.view`, how its results read in a report):
  `ClaimKind`, `ClaimSpec`, `BoundedClaim`, `Details`, `ClaimView`, ... and
  `register_claim_kind(kind)`, `check_claim_kind(kind, claim, model_dir)`;
* a metric: `Metric`, `register_metric`, `check_metric(metric)`;
* a data source: `DataSourceKind`, `DataSettings`, `Where`, `register_data_source`,
  `check_data_source(source, data, model_dir)`;
* a model source: `ModelSource`, `LoadedModel`, `from_bridge`, `register_model_source`.
"""

from __future__ import annotations

from . import stats
from .claims import registry as _claims
from .claims.base import ClaimKind, Context, Indexed, Measured
from .claims.view import ClaimView, details
from .conformance import ConformanceError, check_claim_kind, check_data_source, check_family, check_metric
from .data import dataset
from .data import sources as _sources
from .data.settings import DataSettings
from .data.sources import DataSourceKind, Where
from .evidence.details import Details, Num
from .evidence.format import fmt
from .evidence.result import ClaimResult
from .evidence.verdicts import threshold_verdict
from .model import families as _families
from .model import metrics as _metrics
from .model import ref as _ref
from .model.families import Family
from .model.loaded import LoadedModel, from_bridge
from .model.metrics import Metric
from .model.ref import ModelSource
from .model.tokenizer import model_bos
from .spec import names
from .spec.fields import BoundedClaim, ClaimSpec, HeadName
from .spec.names import Shape

__all__ = [
    "BoundedClaim", "ClaimKind", "ClaimResult", "ClaimSpec", "ClaimView", "ConformanceError", "Context",
    "DataSettings", "DataSourceKind", "Details", "Family", "HeadName", "Indexed", "LoadedModel", "Measured",
    "Metric", "ModelSource", "Num", "Shape", "Where", "check_claim_kind", "check_data_source", "check_family",
    "check_metric", "dataset", "details", "fmt", "from_bridge", "model_bos", "names", "register_claim_kind",
    "register_data_source", "register_family", "register_metric", "register_model_source", "stats",
    "threshold_verdict", "unregister_claim_kind", "unregister_data_source", "unregister_family",
    "unregister_metric", "unregister_model_source",
]


def register_family(family: Family) -> None:
    """Add a model family (model.families; RegistryError if its name or an architecture is taken)."""
    _families.register(family)


def unregister_family(name: str) -> None:
    _families.unregister(name)


def register_claim_kind(kind: ClaimKind) -> None:
    """Add a claim kind, and with it how its results read in a report (`kind.view`; ClaimView's
    defaults unless the kind sets its own); RegistryError if its name is taken."""
    _claims.register(kind)


def unregister_claim_kind(name: str) -> None:
    _claims.unregister(name)


def register_metric(metric: Metric) -> None:
    _metrics.register(metric)


def unregister_metric(name: str) -> None:
    _metrics.unregister(name)


def register_data_source(source: DataSourceKind) -> None:
    _sources.register(source)


def unregister_data_source(key: str) -> None:
    _sources.unregister(key)


def register_model_source(source: ModelSource) -> None:
    _ref.register(source)


def unregister_model_source(prefix: str) -> None:
    _ref.unregister(prefix)
