"""A learned edge mask (mech.graph.learn) and greedy refinement (mech.graph.prune) on the names fixture:
what they report is what the exact edge-graph forward gives (the gradient itself is held to a central
difference in tests/test_families.py)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.claims import effects
from harness.mech.graph import learn, prune
from harness.spec.settings import Stats
from harness.spec.vocabulary import Replacement
from harness.tools.refine import judge

from .graph_helpers import graph_runs

pytestmark = pytest.mark.slow
ST = Stats(bootstrap=300)


@pytest.fixture(scope="module")
def runs():
    return graph_runs("names", 24)


def parts(runs):
    return runs.graph_model(), runs.writes(runs.clean), runs.writes(runs.corrupt)


def faithfulness(runs, m):
    full, empty = np.asarray(runs.m_clean, float), np.asarray(runs.m_corrupt, float)
    return float(np.sum(m - empty) / np.sum(full - empty))


def test_refinement_keeps_a_subset_whose_exact_faithfulness_clears_the_bound(runs):
    """From every edge (F = 1): each accepted proposal's interval clears the bound, each rejected one's
    does not, the result is a subset of the start, and its faithfulness is the gradient-free forward's
    (Runs.edge_circuits) to float32 rounding."""
    gm, clean, rep = parts(runs)
    g = gm.graph
    got = prune.prune(gm, clean, rep, runs.ds.positions, runs.rows_metric, g.full(), 0.6, judge(runs, ST, "nats", 0),
                      steps=10)
    first, *props = got.steps
    assert first["edges"] == g.n_edges and first["faithfulness"] == pytest.approx(1.0, abs=1e-5)
    assert props and any(p["accepted"] for p in props) and not (got.keep & ~g.adjacency).any()
    for p in props:
        assert p["accepted"] == (p["ci"][0] >= 0.6)
    assert got.keep.sum() == g.n_edges - sum(p["removed"] for p in props if p["accepted"]) < g.n_edges
    (m,) = runs.edge_circuits([got.keep], Replacement.RESAMPLE)
    last = [p for p in got.steps if p["accepted"]][-1]
    assert last["edges"] == got.keep.sum()
    assert faithfulness(runs, m) == pytest.approx(last["faithfulness"], abs=1e-5)
    f = effects.normalized_effect(m - np.asarray(runs.m_corrupt, float), np.asarray(runs.m_clean, float)
                                  - np.asarray(runs.m_corrupt, float), ST, 1, "nats", gap_name="full-empty")
    assert f.interval is not None and f.interval.estimate == pytest.approx(last["faithfulness"], abs=1e-5)


def test_refinement_from_a_circuit_below_the_bound_changes_nothing(runs):
    """A start whose interval does not clear the bound is returned as it was, after one exact pass."""
    gm, clean, rep = parts(runs)
    g = gm.graph
    none_kept = np.zeros_like(g.adjacency)
    none_kept[0, -1] = True  # embed -> logits alone
    got = prune.prune(gm, clean, rep, runs.ds.positions, runs.rows_metric, none_kept, 0.6, judge(runs, ST, "nats", 0),
                      steps=10)
    assert len(got.steps) == 1 and (got.keep == none_kept).all() and got.steps[0]["ci"][0] < 0.6


def test_a_learned_mask_is_seeded_and_the_penalty_prunes(runs):
    """The same seed gives the same logits; a rising penalty leaves fewer edges kept than it started with,
    and `kept` counts the logits above 0 on the graph's edges."""
    gm, clean, rep = parts(runs)
    gap = float(np.mean(np.asarray(runs.m_clean) - np.asarray(runs.m_corrupt)))
    cfg = learn.MaskSettings(steps=12, batch=4)
    a = learn.learn_mask(gm, clean, rep, runs.ds.positions, runs.rows_metric, runs.m_clean, gap, cfg)
    b = learn.learn_mask(gm, clean, rep, runs.ds.positions, runs.rows_metric, runs.m_clean, gap, cfg)
    assert np.array_equal(a.logits, b.logits)
    adjacency = gm.graph.adjacency
    assert a.kept == int(((a.logits > 0) & adjacency).sum()) < gm.graph.n_edges
    assert not a.logits[~adjacency].any()
    assert a.loss[-1]["kept_share"] < a.loss[0]["kept_share"] and a.loss[-1]["step"] == 11
