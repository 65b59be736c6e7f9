"""Interventions run over consecutive prompt chunks (Runs.chunk, Runs.in_chunks: what keeps an
intervention's logits within the memory budget at any n_prompts) give the metric that one pass
over every prompt gives: ablations (single and stacked, zero, resample, and mean with a reference
group left out, over a leave-one-out reference and a reference split), edge patches (one and
batched) and edge circuits (resample, mean, zero), on the induction fixture (means over the
generator's reference split) and the names fixture (MLPs; means over the other prompts,
leave-one-out, as a prompt file has them)."""

import numpy as np
import pytest

from harness.mech.graph.structure import Graph
from harness.mech.runs.cached import Runs
from harness.spec import names
from harness.spec.vocabulary import Direction

from .graph_helpers import graph_runs

N, CHUNK = 13, 4  # 13 prompts in chunks of 4: three full chunks and a partial one


def interventions(runs: Runs) -> dict[str, np.ndarray]:
    g = Graph.of(runs.bridge)
    heads = list(names.Head.every(runs.n_layers, runs.n_heads))[:3]
    edges = [e for e in g.edges() if isinstance(e.sender, names.Head) and isinstance(e.receiver, names.HeadInput)][:3]
    to_logits = next(e for e in g.edges() if isinstance(e.receiver, names.Logits) and isinstance(e.sender, names.Head))
    out = {"zero": runs.ablated(heads[:1], "zero"), "resample": runs.ablated(heads[:2], "resample"),
           "mean": runs.ablated(heads[:1], "mean"), "mean, group 3 left out": runs.ablated(heads[:1], "mean", drop=3)}
    stacked = runs.ablated_many([heads[:1], heads[1:3]], "mean", [None, 2])
    out |= {"stacked 0": stacked[0], "stacked 1": stacked[1]}
    out["edge"] = runs.patched(edges[0], Direction.NOISING, "resample")
    out["edge, mean"] = runs.patched(edges[1], Direction.NOISING, "mean", drop=1)
    out["edge, denoising"] = runs.patched(edges[2], Direction.DENOISING, "resample")
    many = runs.patched_many([edges[0], edges[2], to_logits], Direction.NOISING, "resample")
    out |= {f"batched {i}": m for i, m in enumerate(many)}
    half = g.adjacency & (np.arange(g.adjacency.size).reshape(g.adjacency.shape) % 2 == 0)  # every other edge
    for kind in ("resample", "mean", "zero"):
        out[f"edge circuit, {kind}"] = runs.edge_circuits([half], kind)[0]
    return out


@pytest.mark.parametrize("hypothesis, reference", [("induction", True), ("names", False)])
def test_chunked_interventions_equal_one_pass(hypothesis, reference, monkeypatch):
    whole = interventions(graph_runs(hypothesis, N, reference=reference))
    assert graph_runs(hypothesis, N, reference=reference).reference.loo is not reference
    views = []
    prompts = Runs.prompts

    def counted(self, lo, hi):
        views.append((lo, hi))
        return prompts(self, lo, hi)

    monkeypatch.setattr(Runs, "chunk", lambda self: CHUNK)
    monkeypatch.setattr(Runs, "prompts", counted)
    runs = graph_runs(hypothesis, N, reference=reference)
    chunked = interventions(runs)
    assert (0, 4) in views and (12, 13) in views  # the chunks ran, the last one partial
    scale = max(1.0, float(np.abs(runs.m_clean).max()), float(np.abs(runs.m_corrupt).max()))
    for what, m in whole.items():
        assert chunked[what].shape == (N,), what
        # float32: a prompt's row computed in a batch of 4 or of 13 differs by reduction order only
        assert np.abs(chunked[what] - m).max() <= 1e-5 * scale, what


def test_caching_batches_are_sized_by_the_logits_computed(tmp_path, monkeypatch):
    """A Hugging Face model unembeds from the first scored position on (`logits_to_keep`), so the
    base runs' batches hold as many prompts as fit the budget at those positions, not at all of
    them; the logits kept at the scored positions equal a whole forward's (its own oracle)."""
    import torch

    from harness.data import dataset as data
    from harness.mech import hooks
    from harness.model.ref import ModelRef

    from . import family_models

    m = ModelRef.parse(str(family_models.build("llama", tmp_path / "llama", seed=1))).load("cpu")
    ds = data.repeated_tokens(10, 6, family_models.VOCAB, seed=0)  # 13 tokens, scored from position 7 on
    s, first = ds.clean.shape[1], int(ds.positions.min())
    assert 0 < first < s
    k = int(ds.positions.shape[1])
    # the unembedded positions' logits, float32, and the metric's float64 temporaries at the k scored ones
    per_prompt = (s - first - k) * family_models.VOCAB * 4 + hooks.logits_bytes(k, family_models.VOCAB)
    calls: list[int] = []
    run_with_cache = m.bridge.run_with_cache

    def counted(tokens, **kw):
        calls.append(int(tokens.shape[0]))
        return run_with_cache(tokens, **kw)

    monkeypatch.setattr(m.bridge, "run_with_cache", counted)
    got = hooks.cache_hooks(m.bridge, ds.clean, ["blocks.0.attn.hook_z"], ds.positions, budget_bytes=3 * per_prompt)
    assert calls == [3, 3, 3, 1]  # by all 13 positions' logits it would be two prompts a batch
    with torch.no_grad():
        whole = m.bridge(ds.clean)
    rows = torch.arange(ds.n).unsqueeze(-1)
    torch.testing.assert_close(got["logits_at"], whole[rows, ds.positions], rtol=0, atol=1e-5)


def test_runs_are_freed_when_let_go_not_at_the_next_garbage_collection():
    """Runs hold no reference cycle once every lazy part has been used (the edge graph, the batched
    edge path, reference means, chunk views): `harness discover` lets the discovery runs go before
    the confirmation runs cache theirs, and with a cycle their caches (1.4 GiB on Gemma 3 270M at
    50 prompts) stayed until a full collection."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        runs = graph_runs("names", 6, reference=False)
        interventions(runs)
        runs.graph_model()
        gone = weakref.ref(runs)
        del runs
        assert gone() is None
    finally:
        gc.enable()
