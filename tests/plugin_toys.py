"""The entry point of a plugin package written outside the harness: it registers every toy
of the recipes in docs/architecture.md (a claim kind with its view, a metric, a data source,
a model source, a model family) through the declared extension surface (harness.extend).
`tests/test_extension_points.py` installs it (a distribution's metadata naming
`tests.plugin_toys:register` in the `harness.plugins` entry-point group) and runs the `harness`
command, which loads it."""

from __future__ import annotations


def register() -> None:
    from harness import extend

    from . import toy_data_source, toy_family, toy_kind, toy_metric, toy_model_source

    extend.register_claim_kind(toy_kind.KIND)
    extend.register_metric(toy_metric.METRIC)
    extend.register_data_source(toy_data_source.SOURCE)
    extend.register_model_source(toy_model_source.SOURCE)
    extend.register_family(toy_family.FAMILY)
