"""Which signature-plot candidates are patched: all within the budget, else the claimed
edges and then the most composing ones."""

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
    assert len(chosen) == 5  # 5 x 7/12 = 2.92 <= 3
    assert {cands[59], cands[58], cands[57], cands[56]} <= chosen  # the most composing
    assert patch_within_budget(cands, scores, claimed, 12, budget=100.0) == set(cands)
