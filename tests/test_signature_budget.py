"""Which signature-plot candidates are patched: all within the budget, else the claimed
edges (at no cost to the budget) and then the most composing ones."""

from harness.engine.figure_data import patch_cost, patch_within_budget
from harness.spec.names import Edge, Head, HeadInput, Logits


def test_costs_follow_the_receiver_layer():
    assert patch_cost(Edge(Head(0, 0), HeadInput(Head(5, 1), "k")), 12) == 7 / 12
    assert patch_cost(Edge(Head(0, 0), HeadInput(Head(11, 1), "q")), 12) == 0.25 / 12
    assert patch_cost(Edge(Head(0, 0), Logits()), 12) == 0.25 / 12


def test_budget_keeps_claimed_then_most_composing():
    cands = [Edge(Head(l, h), HeadInput(Head(5, 1), "k")) for l in range(5) for h in range(12)]  # 60 x 7/12
    scores = [0.01 * i for i in range(60)]
    claimed = {str(cands[3])}
    chosen = patch_within_budget(cands, scores, claimed, 12, budget=3.0)
    assert cands[3] in chosen  # claimed, though it composes weakly
    # the claimed edge costs the budget nothing (the edge claims patched it): 5 x 7/12 = 2.92 <= 3 more
    assert chosen - {cands[3]} == {cands[59], cands[58], cands[57], cands[56], cands[55]}  # the most composing
    assert patch_within_budget(cands, scores, claimed, 12, budget=100.0) == set(cands)


def test_beyond_the_cap_the_signature_plot_runs_on_its_own_first_prompts(monkeypatch):
    """With more prompts than FIGURE_PROMPTS the signature plot patches on a run of its own of the
    first FIGURE_PROMPTS prompts (figure_data.runs_for, caching what the plot reads): its metric and
    an edge patched there equal those of the file's base runs narrowed to the same prompts
    (Runs.prompts); with no more prompts than that it reuses the base runs."""
    import numpy as np

    from harness.engine import figure_data
    from harness.hypothesis.loading import load
    from harness.spec.vocabulary import Direction

    from .graph_helpers import ROOT, graph_runs

    claims = load(ROOT / "hypotheses" / "induction.yaml").spec.claims
    runs = graph_runs("induction", 30, corruption="first_half")
    assert figure_data.runs_for(runs, claims, "logprob") is runs
    monkeypatch.setattr(figure_data, "FIGURE_PROMPTS", 12)
    own = figure_data.runs_for(runs, claims, "logprob")
    narrowed = runs.prompts(0, 12)
    assert own.ds.n == 12 and list(own.corruptions) == ["first_half"]
    assert np.allclose(own.m_clean, narrowed.m_clean, atol=1e-6) and np.allclose(own.m_corrupt, narrowed.m_corrupt,
                                                                                  atol=1e-6)
    edge = Edge(Head(0, 7), HeadInput(Head(1, 5), "k"))
    got = own.patched_many([edge, Edge(Head(0, 3), HeadInput(Head(1, 5), "k"))], Direction.NOISING, "resample")
    want = narrowed.patched_many([edge, Edge(Head(0, 3), HeadInput(Head(1, 5), "k"))], Direction.NOISING, "resample")
    assert all(np.allclose(g, w, atol=1e-5) for g, w in zip(got, want, strict=True))
