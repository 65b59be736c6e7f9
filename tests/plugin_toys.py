"""The entry point of a plugin package written outside the harness: it registers every toy
of the recipes in docs/architecture.md (a claim kind and its view, a metric, a data source,
a model source).  `tests/test_extension_points.py` installs it (a distribution's metadata
naming `tests.plugin_toys:register` in the `harness.plugins` entry-point group) and runs the
`harness` command, which loads it."""

from __future__ import annotations


def register() -> None:
    from harness.claims import registry
    from harness.data import sources as data_sources
    from harness.model import metrics
    from harness.model import ref as model_ref
    from harness.report import views

    from . import toy_data_source, toy_kind, toy_metric, toy_model_source

    registry.register(toy_kind.KIND)
    views.register(toy_kind.KIND.name, toy_kind.VIEW)
    metrics.register(toy_metric.METRIC)
    data_sources.register(toy_data_source.SOURCE)
    model_ref.register(toy_model_source.SOURCE)
