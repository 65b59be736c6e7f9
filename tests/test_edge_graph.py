"""The edge graph (mech.graph.structure) and edge circuits (mech.graph.forward, Runs.edge_circuits) against
independent oracles: every edge kept is the clean run and none kept the corrupted run (exactly,
to float precision); every edge but one is the exact noising patch of that edge (Runs.patched,
mech.edges.patching / mech.edges.paths, which know nothing of the graph); the edge circuit of every edge
among a node circuit's nodes is the node circuit (Runs.ablated on hook_z); and per prompt an edge
circuit's faithfulness equals TransformerLens's `faithfulness` for the same circuit and pair."""

from __future__ import annotations

import numpy as np
import pytest

from harness.mech.graph.structure import Graph
from harness.spec import names
from harness.spec.vocabulary import Direction, Replacement

from .graph_helpers import graph_runs

CASES = ["induction", "names", "rotary"]  # attention-only native; GPT-2 HF with MLPs; rotary native


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def test_graph_counts_match_the_field():
    """GPT-2 small's graph has 32,491 edges (MIB's count); classes sum to the total; a parallel block's
    heads do not feed their own layer's MLP (Pythia), so it has 12 x 12 fewer edges."""
    g = Graph(12, 12, True)
    assert (len(g.senders), len(g.receivers), g.n_edges) == (157, 445, 32_491)
    counts = g.counts()
    assert sum(sum(row.values()) for row in counts.values()) == g.n_edges
    assert counts["embed"] == {"q": 144, "k": 144, "v": 144, "mlp": 12, "logits": 1}
    assert counts["mlp"]["logits"] == 12 and counts["head"]["mlp"] == sum(12 * (layer + 1) for layer in range(12))
    assert Graph(12, 12, True, parallel=True).n_edges == 32_491 - 144
    attn_only = Graph(2, 8, False)
    assert attn_only.n_edges == 3 * 8 * (1 + 8) * 1 + 3 * 8 * 1 + 17 and attn_only.counts()["mlp"]["logits"] == 0


def test_masks_read_back_and_refuse_what_the_graph_lacks():
    g = Graph(2, 2, True)
    edges = [names.Edge(names.Embed(), names.HeadInput(names.Head(0, 1), "v")),
             names.Edge(names.Mlp(0), names.Logits()), names.Edge(names.Head(0, 0), names.Mlp(0))]
    assert set(g.edges_of(g.mask(edges))) == set(edges)
    assert g.edges_of(g.full()) == g.edges() and len(g.edges()) == g.n_edges
    with pytest.raises(ValueError, match="not an edge"):
        g.mask([names.Edge(names.Mlp(1), names.HeadInput(names.Head(1, 0), "q"))])
    with pytest.raises(ValueError, match="not an edge"):  # a parallel block's MLP reads the block input
        Graph(2, 2, True, parallel=True).mask([names.Edge(names.Head(0, 0), names.Mlp(0))])


@pytest.mark.parametrize("case", CASES)
def test_full_is_clean_and_empty_is_corrupted(case):
    runs = graph_runs(case, 16)
    g = runs.graph_model().graph
    full, empty = runs.edge_circuits([g.full(), np.zeros_like(g.adjacency)], Replacement.RESAMPLE)
    assert rel(full, runs.m_clean) < 1e-5
    assert rel(empty, runs.m_corrupt) < 1e-5
    zero = runs.edge_circuits([g.full()], Replacement.ZERO)[0]  # every edge kept: no replacement is read
    assert rel(zero, runs.m_clean) < 1e-5


@pytest.mark.parametrize("case", CASES)
def test_every_edge_but_one_is_the_exact_patch_of_that_edge(case):
    """Noising and denoising, resample, zero and mean, edges of every class, against the
    patching code that knows nothing of the graph."""
    runs = graph_runs(case, 12)
    g = runs.graph_model().graph
    edges = g.edges()
    pick = [edges[i] for i in np.random.default_rng(0).choice(len(edges), size=10, replace=False)]
    pick += [e for e in edges if isinstance(e.sender, names.Mlp) or isinstance(e.receiver, names.Mlp)][:4]
    for e in pick:
        mask = g.full()
        mask[g.sender_index(e.sender), g.receiver_index(e.receiver)] = False
        for kind in (Replacement.RESAMPLE, Replacement.ZERO, Replacement.MEAN):
            got = runs.edge_circuits([mask], kind)[0]
            assert rel(got, runs.patched(e, Direction.NOISING, kind)) < 2e-5, (e, kind)


@pytest.mark.parametrize("case", ["names", "rotary"])
def test_mlp_edges_patched_together_equal_one_at_a_time(case):
    """Runs.patched_many takes edges with an MLP end through the graph, each from its receiver's layer
    (GraphModel.edge_patches): the same numbers as mech.edges.paths one edge at a time, in both directions,
    on a GPT-2-style model and a rotary one."""
    runs = graph_runs(case, 12)
    mlp_edges = [e for e in runs.graph_model().graph.edges()
                 if isinstance(e.sender, names.Mlp) or isinstance(e.receiver, names.Mlp)][::5]
    assert mlp_edges
    for direction in (Direction.NOISING, Direction.DENOISING):
        one = [runs.patched(e, direction, Replacement.RESAMPLE) for e in mlp_edges]
        runs.memo.clear()
        many = runs.patched_many(mlp_edges, direction, Replacement.RESAMPLE)
        assert max(rel(a, b) for a, b in zip(many, one, strict=True)) < 2e-5


@pytest.mark.parametrize("case", CASES)
def test_node_circuit_is_the_edge_circuit_among_its_nodes(case):
    """Keeping heads C (every other head resample-ablated on hook_z, MLPs kept) equals keeping the
    edges among C and every MLP, from embed and to the logits (Graph.node_mask)."""
    runs = graph_runs(case, 12)
    g = runs.graph_model().graph
    heads = names.Head.every(runs.n_layers, runs.n_heads)
    for keep in (heads[::3], heads[1::2]):
        rest = [h for h in heads if h not in keep]
        mlps = [names.Mlp(layer) for layer in range(runs.n_layers)] if g.has_mlp else []
        edge_circuit = runs.edge_circuits([g.node_mask([*keep, *mlps])], Replacement.RESAMPLE)[0]
        assert rel(edge_circuit, runs.ablated(rest, Replacement.RESAMPLE)) < 2e-5


@pytest.mark.slow
def test_faithfulness_per_prompt_equals_transformer_lens():
    """TransformerLens's `faithfulness` (one pair at a time; its edges are per position, so the
    circuit is each of harness's edges at every position) gives each prompt's recovered fraction
    (m_C - m_corrupt) / (m_clean - m_corrupt); harness's edge circuit, resample, the same."""
    import torch
    from transformer_lens.tools.analysis.attribution_patching import faithfulness

    from harness.mech.graph.attribution import transformer_lens_nodes

    from .test_attribution import tl_prompt_metric

    runs = graph_runs("names", 4)
    g = runs.graph_model().graph
    edges = g.edges()
    circuit = [edges[i] for i in np.random.default_rng(1).choice(len(edges), size=60, replace=False)]
    got = runs.edge_circuits([g.mask(circuit)], Replacement.RESAMPLE)[0]
    ds = runs.ds
    s = ds.clean.shape[1]
    for i in range(ds.n):
        kept = [transformer_lens_nodes(e, p, runs.n_layers) for e in circuit for p in range(s)]
        with torch.no_grad():
            res = faithfulness(runs.bridge, ds.clean[i:i + 1], ds.corrupted[i:i + 1], tl_prompt_metric(runs, i), kept)
        mine = (got[i] - runs.m_corrupt[i]) / (runs.m_clean[i] - runs.m_corrupt[i])
        assert mine == pytest.approx(res.recovered, abs=2e-5)
