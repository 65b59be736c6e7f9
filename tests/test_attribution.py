"""Attribution scores (mech.graph.attribution) against independent oracles:

* EAP (denoising) equals TransformerLens 4.3's `attribution_patch(..., EdgeAttributionConfig(
  granularity="edge"))`, one pair at a time, its per-position edges summed over positions and
  averaged over the prompts, on fixtures/names-3l and on random Llama- and Pythia-shaped models;
* EAP-IG with one step is EAP (noising): its one point is the clean run;
* on a hand-built model whose heads write nothing, the only edge that matters is embed -> logits:
  with a metric linear in that edge (logit difference, no final norm) EAP is exact patching; with
  one that is not (log-probability), EAP misses and EAP-IG converges to the exact patch as its
  steps grow (error ~ 1/steps);
* per-prompt scores of chosen edges equal the whole-graph scores' mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from harness.data import dataset as data
from harness.mech.graph import attribution, parts
from harness.mech.graph.structure import Graph
from harness.mech.runs.build import base_runs
from harness.mech.runs.cached import Runs
from harness.model.ref import ModelRef
from harness.spec import names
from harness.spec.vocabulary import Direction, Replacement

from . import family_models
from .conftest import save_native
from .graph_helpers import graph_runs


def scores(runs: Runs, **kw) -> attribution.Scores:
    return runs.edge_scores(**kw)


# ---------------------------------------------------------------- TransformerLens's side
def tl_prompt_metric(runs: Runs, i: int):
    """Prompt i's metric from full logits [1, seq, vocab], as TransformerLens's functions take it."""
    pos = runs.ds.positions[i:i + 1]
    idx = torch.tensor([i])

    def metric(logits):
        at = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
        assert runs.metric_rows is not None
        return runs.metric_rows(at, idx).sum()
    return metric


def tl_edge_totals(runs: Runs) -> np.ndarray:
    """TransformerLens's edge EAP, pair by pair, summed over positions, mean over prompts: [U, V]."""
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    g = runs.graph_model().graph
    ds = runs.ds
    out = np.zeros(g.adjacency.shape)
    index = {}
    for e, u, v in zip(g.edges(), *g.edge_index(), strict=True):
        for p in range(ds.clean.shape[1]):
            index[attribution.transformer_lens_nodes(e, p, g.n_layers)] = (u, v)
    for i in range(ds.n):
        res = attribution_patch(runs.bridge, ds.clean[i:i + 1], ds.corrupted[i:i + 1], tl_prompt_metric(runs, i),
                                EdgeAttributionConfig(granularity="edge"))
        for pair, value in res.edge_scores.items():
            u, v = index[pair]  # every TransformerLens edge is one of harness's at one position
            out[u, v] += float(value) / ds.n
    return out


def random_runs(family: str, tmp_path, n: int = 4) -> Runs:
    """A random `family` model (every query head its own key/value head, as TransformerLens's edge
    attribution requires) on repeated-token prompts."""
    over = {"num_key_value_heads": 4} if family == "llama" else {}
    folder = family_models.build(family, tmp_path / family, seed=3, **over)
    m = ModelRef.parse(str(folder)).load("cpu")
    ds = data.repeated_tokens(n, 6, m.d_vocab, seed=0, bos_token=1, n_ctx=m.n_ctx)
    return base_runs(m.bridge, ds, parts.cache_names(m.n_layers, m.has_mlp), "logprob")


def assert_tl_parity(runs: Runs, float64: Any = None) -> None:
    """harness's EAP (denoising) against TransformerLens's: within 1e-5 of the largest score.  With
    `float64` (the same model loaded in float64), TransformerLens's float64 scores are the reference
    and harness (float32) must be as close to them as TransformerLens's own float32 scores, or closer
    (random models with sharp attention lose about 1e-5 to float32 rounding on both sides)."""
    mine = scores(runs, method="eap", direction=Direction.DENOISING).total
    theirs = tl_edge_totals(runs)
    scale = np.abs(theirs).max()
    assert scale > 0
    assert (theirs[~runs.graph_model().graph.adjacency] == 0).all()  # nothing outside harness's graph
    if float64 is None:
        assert np.abs(mine - theirs).max() <= 1e-5 * scale
        return
    reference = tl_edge_totals(dataclasses.replace(runs, bridge=float64))
    tl_error = np.abs(theirs - reference).max()
    assert np.abs(mine - reference).max() <= max(1e-5 * scale, 1.5 * tl_error)
    assert tl_error < 1e-4 * scale  # the float32 error the comparison allows is small itself


@pytest.mark.slow
def test_eap_equals_transformer_lens_on_the_names_fixture():
    assert_tl_parity(graph_runs("names", 4))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "neox"])
def test_eap_equals_transformer_lens_on_random_modern_models(family, tmp_path):
    """Llama: RMSNorm, rotary, gated MLP; Pythia (GPT-NeoX): partial rotary, parallel blocks,
    whose heads do not feed their own layer's MLP (both graphs leave that edge out)."""
    runs = random_runs(family, tmp_path)
    assert_tl_parity(runs, ModelRef.parse(str(tmp_path / family)).load("cpu", torch.float64).bridge)


# ---------------------------------------------------------------- EAP-IG
@pytest.mark.parametrize("case", ["induction", "names"])
def test_eap_ig_with_one_step_is_eap(case):
    runs = graph_runs(case, 8)
    eap = scores(runs, method="eap").per_position
    ig1 = scores(runs, method="eap-ig", steps=1).per_position
    assert np.abs(eap - ig1).max() <= 1e-9 * max(1.0, np.abs(eap).max())


def test_per_prompt_scores_average_to_the_graph_scores():
    runs = graph_runs("names", 8)
    g = runs.graph_model().graph
    us, rs = g.edge_index()
    wanted = list(zip(us[::37].tolist(), rs[::37].tolist(), strict=True))
    sc = scores(runs, method="eap-ig", steps=3, wanted=wanted, batch=3)
    assert sc.per_prompt is not None
    scale = np.abs(sc.total).max()
    for w, (u, v) in enumerate(wanted):  # float32 dot products, summed in float64
        assert sc.per_prompt[w].mean() == pytest.approx(sc.total[u, v], abs=1e-6 * scale)


@pytest.mark.parametrize("method,hypothesis", [("eap", "names"), ("eap-ig", "names"), ("eap-ig", "rotary")])
def test_one_edge_from_its_receiver_alone_equals_the_whole_graph(method, hypothesis):
    """An attribution claim's per-prompt scores (the gradient at the edge's receiver only, through the
    model's own blocks elsewhere) equal the whole graph's per-prompt scores of that edge: heads into
    q/k/v, MLPs, embed, and the logits; on a GPT-2-style model and a rotary one."""
    runs = graph_runs(hypothesis, 8)
    g = runs.graph_model().graph
    us, rs = g.edge_index()
    wanted = list(zip(us[::29].tolist(), rs[::29].tolist(), strict=True)) + [(0, len(g.receivers) - 1)]
    sc = scores(runs, method=method, steps=3, wanted=wanted, batch=3)
    scale = np.abs(sc.per_prompt).max()
    for w, (u, v) in enumerate(wanted):
        one = runs.edge_prompt_scores(names.Edge(g.senders[u], g.receivers[v]), method, steps=3, batch=5)
        assert one == pytest.approx(sc.per_prompt[w], abs=1e-5 * scale)


def silent_heads_model(tmp_path, final_norm: bool):
    """A native 1-layer attention-only model whose heads write nothing (W_O = 0): the metric sees
    the prompt only through embed -> logits."""
    from .conftest import boot_random_native, tiny_config

    cfg = tiny_config(n_layers=1, d_model=16, d_head=4, n_heads=2, d_vocab=12, n_ctx=16,
                      normalization_type="LN" if final_norm else None, seed=0)
    bridge = boot_random_native(cfg, seed=2)
    with torch.no_grad():
        for name, p in bridge.original_model.named_parameters():
            if ".attn._original_component.o." in name:  # W_O and b_O
                p.zero_()
    return save_native(bridge.to(torch.float32), cfg, tmp_path / ("ln" if final_norm else "plain"))


def handbuilt_runs(tmp_path, metric: str = "logprob") -> Runs:
    """Repeated-token prompts on the silent-heads model, scored with `metric` (logit_diff: against
    the token after the answer)."""
    m = ModelRef.parse(str(silent_heads_model(tmp_path, final_norm=False))).load("cpu")
    # the corruption must change the tokens at the scored positions: nothing else reaches the logits
    ds = data.repeated_tokens(16, 5, m.d_vocab, seed=1, n_ctx=m.n_ctx, bos_token=0, corruptions=("second_half",))
    if metric == "logit_diff":
        ds = dataclasses.replace(ds, wrong=(ds.answers + 1) % m.d_vocab)
    return base_runs(m.bridge, ds, parts.cache_names(m.n_layers, m.has_mlp), metric)


def test_eap_ig_converges_to_exact_patching_where_one_edge_carries_everything(tmp_path):
    """log-probability of the answer, no final norm: m is a nonlinear function of embed's write into
    the logits alone.  Exact noising of that edge is m_clean - m_corrupt; EAP-IG with m steps is a
    right Riemann sum of the same line integral, so its error shrinks like 1/m; EAP (one point) is
    off by the curvature."""
    runs = handbuilt_runs(tmp_path)
    g = runs.graph_model().graph
    u, v = g.sender_index(names.Embed()), g.receiver_index(names.Logits())
    exact = runs.m_clean - runs.patched(names.Edge(names.Embed(), names.Logits()), Direction.NOISING,
                                        Replacement.RESAMPLE)
    assert np.allclose(exact, runs.m_clean - runs.m_corrupt, atol=1e-5)  # the one edge carries it all
    target = float(exact.mean())
    other = g.adjacency.copy()
    other[u, v] = False
    errors = {}
    for steps in (1, 4, 16, 64):
        sc = scores(runs, method="eap-ig", steps=steps)
        errors[steps] = abs(sc.total[u, v] - target)
        assert np.abs(sc.total[other]).max() < 1e-9  # the heads write nothing: no other edge scores
    eap = scores(runs, method="eap").total[u, v]
    assert abs(eap - target) > 0.05 * abs(target)  # first order is not enough here
    assert errors[1] == pytest.approx(abs(eap - target))
    assert errors[64] < 0.02 * abs(target) and errors[64] < errors[16] < errors[4] < errors[1]
    assert errors[16] / errors[64] == pytest.approx(4.0, rel=0.25)  # ~ 1/m


def test_eap_is_exact_where_the_metric_is_linear_in_the_edge(tmp_path):
    """Logit difference without a final norm is linear in embed's write into the logits: the
    first-order estimate is the exact patch, per prompt, and so is every step of EAP-IG."""
    runs = handbuilt_runs(tmp_path, "logit_diff")
    g = runs.graph_model().graph
    edge = names.Edge(names.Embed(), names.Logits())
    wanted = [(g.sender_index(edge.sender), g.receiver_index(edge.receiver))]
    exact = runs.m_clean - runs.patched(edge, Direction.NOISING, Replacement.RESAMPLE)
    assert np.abs(exact).max() > 0.1
    for method in ("eap", "eap-ig"):
        sc = scores(runs, method=method, wanted=wanted)
        assert sc.per_prompt is not None
        assert np.abs(sc.per_prompt[0] - exact).max() < 1e-5 * max(1.0, np.abs(exact).max())


@pytest.mark.parametrize("family", ["gemma3", "olmo2"])
def test_eap_ig_through_norms_after_the_attention(family, tmp_path):
    """With a norm after the attention a head's change reaches a receiver through that norm's Jacobian at
    each integration point's attention sum: the whole graph's per-prompt EAP-IG scores (every receiver's
    gradient, the changes taken point by point) equal the one-receiver pass's (the receiver's gradient
    alone, P recorded through the model's own blocks) for heads into q/k/v, the MLP and the logits
    (tests/test_families.py holds EAP to the float64 oracle's derivative through the norm)."""
    runs = random_runs(family, tmp_path, n=3)
    g = runs.graph_model().graph
    heads = [u for u, x in enumerate(g.senders) if isinstance(x, names.Head) and x.layer == 0]
    wanted = [(u, v) for u in heads[:2] for v in (g.receiver_index(names.HeadInput(names.Head(1, 1), "k")),
                                                  g.receiver_index(names.Mlp(1)), len(g.receivers) - 1)]
    sc = scores(runs, method="eap-ig", steps=3, wanted=wanted, batch=2)
    scale = np.abs(sc.per_prompt).max()
    assert scale > 0
    for w, (u, v) in enumerate(wanted):
        one = runs.edge_prompt_scores(names.Edge(g.senders[u], g.receivers[v]), "eap-ig", steps=3, batch=3)
        assert one == pytest.approx(sc.per_prompt[w], abs=1e-5 * scale)


def test_graph_of_a_parallel_model_drops_the_same_layer_mlp_edges(tmp_path):
    m = ModelRef.parse(str(family_models.build("neox", tmp_path / "neox", seed=0))).load("cpu")
    g = Graph.of(m.bridge)
    assert g.parallel and not g.has(names.Edge(names.Head(0, 0), names.Mlp(0)))
    assert g.has(names.Edge(names.Head(0, 0), names.Mlp(1)))


def test_attribution_claims_stay_on_their_own_rung(tmp_path):
    """An attribution claim is evidence of its own type, on the ladder's attribution rung below the
    interventions; where the exact patch disagrees, the ladder says so."""
    import yaml

    import harness
    from harness.report.markdown import render_markdown

    from .graph_helpers import ROOT

    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump({
        "harness": 1, "name": "attr", "model": str(ROOT / "fixtures" / "induction-2l"),
        "data": {"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 12},
        "claims": [{"id": "eap", "kind": "attribution", "edge": "L0H7 -> L1H5.k", "method": "eap"},
                   {"id": "ig", "kind": "attribution", "edge": "L0H7 -> L1H5.k", "steps": 8},
                   {"id": "patch", "kind": "edge", "edge": "L0H7 -> L1H5.k", "expect": "used"}]}))
    ev = harness.run(f, device="cpu")
    assert [c.evidence for c in ev.claims] == ["attribution", "attribution", "causal"]
    assert ev.claim("eap").details.steps == 1 and ev.claim("ig").details.steps == 8
    row = next(r for r in ev.ladder if r.mechanism == "L0H7 -> L1H5.k")
    assert {s.claim for s in row.rungs["attribution"]} == {"eap", "ig"}
    assert row.highest == "edge necessity"  # an estimate never stands above an intervention
    # EAP at the clean run underestimates this saturated route badly (the patch shows about 0.2)
    assert ev.claim("eap").value < ev.claim("patch").value / 4
    md = render_markdown(ev)
    assert "### Attribution estimates" in md
    header = next(line for line in md.splitlines() if line.startswith("| mechanism"))
    assert [c.strip() for c in header.strip("|").split("|")][1:4] == ["weights", "observation", "attribution"]


def test_an_attribution_claim_alone_caches_only_what_it_reads(tmp_path):
    """A file whose only claim is an attribution claim, without figures: the base runs cache embed's
    and the sender's writes (and what the edge's non-vacuity check reads), not every write; the
    graph arithmetic is checked, and the identity check run, on a run of the first 4 prompts."""
    import yaml

    import harness

    from .graph_helpers import ROOT

    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump({
        "harness": 1, "name": "attr", "model": str(ROOT / "fixtures" / "induction-2l"),
        "data": {"generator": "repeated_tokens", "n_prompts": 12, "segment_length": 8},
        "claims": [{"id": "ig", "kind": "attribution", "edge": "L0H7 -> L1H5.k", "steps": 3}]}))
    ev = harness.run(f, device="cpu", figures=False)
    assert ev.claim("ig").evidence == "attribution" and ev.claim("ig").value is not None
    checks = " ".join(c.detail for c in ev.sanity_checks)
    assert "edge circuit (every edge removed, the clean run's own writes; 4 prompts)" in checks
