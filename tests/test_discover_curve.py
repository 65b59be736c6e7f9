"""The pieces of discovery's reading of a ranking, each against a hand computation: the Jaccard
stability of resampled rankings (tools.stability), the curve's drops (tools.curve), and the
resampled attribution scores, which must be the per-prompt scores reweighted (mech.graph.attribution)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mech.graph.structure import Graph
from harness.tools import stability
from harness.tools.curve import drops

from .graph_helpers import graph_runs


def test_jaccard_of_top_k_sets_by_hand():
    order = np.array([0, 1, 2, 3, 4, 5])  # the ranking: edge 0 first
    resampled = np.array([[6.0, 5.0, 4.0, 3.0, 2.0, 1.0],     # the same ranking
                          [1.0, -5.0, 6.0, 0.5, 2.0, 0.1],    # by |s|: 2, 1, 4, 0, 3, 5
                          [0.0, 0.0, 0.0, 0.0, 0.0, 9.0]])    # 5 first, then ties in edge order: 0, 1, 2, 3, 4
    got = stability.jaccard(resampled, order, [1, 2, 3, 6])
    # resample 1: top-1 {2} vs {0}: 0; top-2 {2, 1} vs {0, 1}: 1/3; top-3 {2, 1, 4} vs {0, 1, 2}: 2/4
    # resample 2: top-1 {5}: 0; top-2 {5, 0} vs {0, 1}: 1/3; top-3 {5, 0, 1} vs {0, 1, 2}: 2/4
    want = np.array([[1, 1, 1, 1], [0, 1 / 3, 2 / 4, 1], [0, 1 / 3, 2 / 4, 1]])
    assert got == pytest.approx(want, abs=1e-12)
    s = stability.summary(got, [1, 2, 3, 6], 2, n_prompts=10)
    assert s["starter"] == {"k": 2, "jaccard": pytest.approx(5 / 9), "range": s["points"][1]["range"], "stable": False}
    assert s["points"][0]["range"] == [pytest.approx(0.0), pytest.approx(0.95)]  # numpy's linear quantiles of 1, 0, 0


def test_bootstrap_weights_draw_n_prompts_each():
    w = stability.weights(7, seed=3)
    assert w.shape == (stability.RESAMPLES, 7) and (w.sum(1) == 7).all() and (w >= 0).all()
    assert (w == stability.weights(7, seed=3)).all() and not (w == stability.weights(7, seed=4)).all()


def test_drops_are_falls_beyond_both_intervals():
    pts = [{"k": 10, "faithfulness": 0.9, "ci": [0.85, 0.95]},
           {"k": 0, "faithfulness": 0.0, "ci": [0.0, 0.0]},
           {"k": 1, "faithfulness": 0.5, "ci": [0.4, 0.6]},
           {"k": 100, "faithfulness": 0.6, "ci": [0.5, 0.7]},     # falls from 0.9 at k 10 beyond both intervals
           {"k": 50, "faithfulness": 0.85, "ci": [0.8, 0.9]},     # falls from 0.9, but the intervals overlap
           {"k": 1000, "faithfulness": 1.0, "ci": [1.0, 1.0]},
           {"k": 1001, "faithfulness": 0.99, "ci": [0.99, 0.99]}]  # beyond the intervals, by less than 0.05
    assert drops(pts, 0.05) == [{"from_k": 10, "to_k": 100, "from": 0.9, "to": 0.6}]
    assert drops(pts, 0.0)[-1] == {"from_k": 1000, "to_k": 1001, "from": 1.0, "to": 0.99}


def test_a_fall_spread_over_neighbours_whose_intervals_overlap_is_a_drop():
    """SmolLM2's IOI curve: no two neighbours' intervals are apart, but 10 % lies wholly below 1 %."""
    pts = [{"k": 123, "faithfulness": 0.735, "ci": [0.647, 0.861]},
           {"k": 1232, "faithfulness": 0.875, "ci": [0.751, 1.008]},
           {"k": 2464, "faithfulness": 0.694, "ci": [0.509, 0.851]},
           {"k": 12321, "faithfulness": 0.571, "ci": [0.480, 0.689]},
           {"k": 61605, "faithfulness": 0.961, "ci": [0.926, 0.997]}]
    assert drops(pts, 0.05) == [{"from_k": 1232, "to_k": 12321, "from": 0.875, "to": 0.571}]


def test_resampled_scores_are_the_per_prompt_scores_reweighted():
    """One pass with weights: a one-hot weight gives that prompt's own score of every wanted edge, and
    uniform weights give the mean over prompts (the scores' total)."""
    runs = graph_runs("names", 6)
    g = runs.graph_model().graph
    us, rs = g.edge_index()
    wanted = list(zip(us[::31].tolist(), rs[::31].tolist(), strict=True)) + [(0, len(g.receivers) - 1)]
    w = np.vstack([np.eye(6), np.ones((1, 6)), np.arange(1.0, 7.0)[None]])
    sc = runs.edge_scores("eap-ig", steps=2, wanted=wanted, batch=4, resamples=w)
    assert sc.resampled.shape[0] == 8
    tol = 1e-6 * np.abs(sc.per_prompt).max()  # float32 dot products (in another order), summed in float64
    for j, (u, v) in enumerate(wanted):
        assert sc.resampled[:6, u, v] == pytest.approx(sc.per_prompt[j], abs=tol)
        assert sc.resampled[7, u, v] == pytest.approx(np.dot(np.arange(1, 7), sc.per_prompt[j]) / 21, abs=tol)
    assert sc.resampled[6] == pytest.approx(sc.total, abs=1e-6 * np.abs(sc.total).max())


def test_the_signed_order_puts_positive_scores_first_ties_in_the_main_order():
    """signed_order: by signed score summed over positions, the largest first; equal scores keep the
    order of the main ranking (as the report's rows sorted by score do)."""
    from harness.tools.curve import signed_order

    g = Graph(1, 1, False)  # senders embed, L0H0; receivers L0H0.q/k/v, logits: 5 edges
    us, rs = g.edge_index()
    totals = np.array([0.5, -2.0, 0.5, 3.0, -0.1])  # per edge, graph order
    score = np.zeros((*g.adjacency.shape, 2))
    score[us, rs, 0], score[us, rs, 1] = totals / 2, totals / 2  # split over two positions
    main = np.array([3, 1, 2, 0, 4])  # by |score|, ties (edges 0 and 2) with 2 first
    assert signed_order(score, g, main).tolist() == [3, 2, 0, 4, 1]


def pt(k: int, f: float, lo: float, hi: float) -> dict:
    return {"k": k, "fraction": None, "faithfulness": f, "ci": [lo, hi]}


def test_the_pareto_front_keeps_what_nothing_smaller_beats():
    """pareto: by k, a point stays when every smaller (or equal, earlier) circuit is further from F = 1;
    F above 1 counts by its distance; all-edges and empty circuits are left out."""
    from harness.tools.curve import pareto

    tried = {"abs": [pt(0, 0.0, 0, 0), pt(10, 0.5, 0.4, 0.6), pt(20, 0.7, 0.6, 0.8), pt(40, 0.95, 0.9, 1.0),
                     pt(100, 1.0, 1.0, 1.0)],
             "signed": [pt(10, 1.3, 1.1, 1.5), pt(15, 1.2, 1.0, 1.4), pt(30, 0.9, 0.8, 1.0)],
             "learned": [pt(20, 0.8, 0.7, 0.9), pt(25, 1.1, 1.0, 1.2), pt(40, 0.96, 0.9, 1.0)]}
    got = [(p["ranking"], p["k"]) for p in pareto(tried, 100)]
    # k=10: abs (|1-F| 0.5) before signed (0.3): both, in that order of closeness; k=15 signed 0.2;
    # k=20 learned 0.2 is no better; k=25 learned 0.1; k=30 signed 0.1 no; k=40 learned 0.04
    assert got == [("signed", 10), ("signed", 15), ("learned", 25), ("learned", 40)]


def test_prompts_to_decide_scale_the_half_width_facing_the_bound():
    """prompts_to_decide: n (w / |F - bound|)^2 with w the half-width on the bound's side, rounded up; a
    decided interval needs the prompts it has; F at the bound needs any number."""
    from harness.tools.curve import prompts_to_decide

    assert prompts_to_decide(pt(5, 0.75, 0.25, 1.0), 0.5, 50) == 200  # w 0.5 against 0.25 above: 50 x 4
    assert prompts_to_decide(pt(5, 0.25, 0.125, 0.625), 0.5, 50) == 113  # w 0.375 against 0.25 below: 112.5 up
    assert prompts_to_decide(pt(5, 0.75, 0.625, 1.0), 0.5, 50) == 50  # already above
    assert prompts_to_decide(pt(5, 0.25, 0.125, 0.375), 0.5, 50) == 50  # already below
    assert prompts_to_decide(pt(5, 0.5, 0.25, 0.75), 0.5, 50) is None
