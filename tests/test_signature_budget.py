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


def test_base_runs_cache_only_what_the_chosen_patches_read(monkeypatch):
    """The signature plot's patches are chosen from the composition scores before the base runs, which
    then cache the head outputs of the chosen senders' layers only: with a budget that leaves room for
    the claimed edge alone, layer 1's outputs (read by no claim) are not cached, the patched
    candidates are the ones chosen (figure_data.signature_patches on a composition of its own), and
    every number, figures included, equals that of a run caching every candidate's layer."""
    import yaml

    from harness.engine import figure_data, measure, runner
    from harness.hypothesis.loading import load
    from harness.mech.weights.factored import Composition
    from harness.mech.weights.scores import head_weights
    from harness.spec.names import hook_z

    from .graph_helpers import ROOT

    doc = yaml.safe_load((ROOT / "hypotheses" / "names.yaml").read_text())
    doc["data"]["n_prompts"] = 24
    doc["claims"] = [{"id": "e", "kind": "edge", "edge": "L0H3 -> L2H0.v", "expect": "used"}]
    base_dir = ROOT / "hypotheses"
    monkeypatch.setattr(figure_data, "SIGNATURE_BUDGET", 0.0)
    cached: list[list[str]] = []
    real = measure.base_runs

    def recording(bridge, ds, names_, *args, **kw):
        cached.append(list(names_))
        return real(bridge, ds, names_, *args, **kw)

    monkeypatch.setattr(measure, "base_runs", recording)
    chosen_run = runner.run(doc, base_dir=base_dir)
    assert hook_z(0) in cached[-1] and hook_z(1) not in cached[-1]
    points = chosen_run.figures_data["signature"]["points"]
    assert len(points) == 2 * 4  # every head of layers 0 and 1 a candidate
    assert {p["edge"] for p in points if p["patched"]} == {"L0H3 -> L2H0.v"}

    h = load(doc, base_dir)
    model = runner.load_model_cached(str(ROOT / "fixtures" / "names-3l"), "cpu")
    comp = Composition(head_weights(model.bridge), 0)
    assert {str(e) for e in figure_data.signature_patches(comp, h.spec.claims)} == {"L0H3 -> L2H0.v"}

    every = measure.hooks_needed
    monkeypatch.setattr(measure, "hooks_needed", lambda c, n, f=True, k=0, patched=None: every(c, n, f, k, None))
    full_run = runner.run(doc, base_dir=base_dir)
    assert hook_z(1) in cached[-1]
    assert full_run.figures_data == chosen_run.figures_data
    assert [r.value for r in full_run.claims] == [r.value for r in chosen_run.claims]


def test_a_named_receivers_layer_is_cached_whatever_the_plot_patches():
    """With no candidate chosen (an edge claim from an MLP, which is no candidate, and no budget left),
    the receiver's layer is cached all the same (its q, k, v, attention output and z: what the
    claims' own edges into it read on the batched path), and no earlier layer's head outputs."""
    from harness.engine import measure
    from harness.hypothesis.loading import load
    from harness.spec.names import hook_attn_out, hook_input, hook_z

    from .graph_helpers import ROOT

    doc = {"harness": 1, "name": "mlp-edge", "model": str(ROOT / "fixtures" / "names-3l"),
           "data": {"generator": "repeated_tokens", "n_prompts": 10},
           "claims": [{"id": "e", "kind": "edge", "edge": "L0.mlp -> L2H0.v", "expect": "used"}]}
    claims = load(doc).spec.claims
    got, _ = measure.hooks_needed(claims, 3, True, 10, patched=set())
    assert {hook_attn_out(2), hook_z(2), *(hook_input(2, x) for x in "qkv")} <= set(got)
    assert hook_z(0) not in got and hook_z(1) not in got
    every, _ = measure.hooks_needed(claims, 3, True, 10)
    assert hook_z(0) in every and hook_z(1) in every  # not knowing the patches: every candidate's layer
