"""Stacked ablations (mech.runs.ablation via Runs.ablated_many) and forwards that
start inside the model (hooks.run_from via Runs.run) against whole forwards with the
same hooks (hooks.run_plan), on a GPT-2 model with MLPs and on a native model."""

import numpy as np
import pytest
import torch

from harness.data import dataset as data
from harness.mech import hooks
from harness.mech.runs.cached import Runs
from harness.mech.runs.reference import Lazy, Reference
from harness.model import metrics
from harness.model.ref import load_model
from harness.spec.names import Head, hook_pattern, hook_resid_pre, hook_z


def gpt2_dir(tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=24, n_layer=3, n_head=4)
    path = tmp_path_factory.mktemp("gpt2") / "model"
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=["gpt2", "native"])
def runs(request, tmp_path_factory, tiny_native):
    if request.param == "gpt2":
        bridge = load_model(gpt2_dir(tmp_path_factory)).bridge
        vocab = 50
    else:
        bridge, _ = tiny_native
        vocab = 7
    L = bridge.cfg.n_layers
    ds = data.repeated_tokens(12, 4, vocab, seed=1)
    names = ([hook_z(layer) for layer in range(L)] + [hook_resid_pre(layer) for layer in range(L)]
             + [hook_pattern(layer) for layer in range(L)])
    clean, corrupt = hooks.cache_hooks(bridge, ds.clean, names), hooks.cache_hooks(bridge, ds.corrupted, names)

    def metric(logits):
        return metrics.per_prompt(logits, ds.positions, ds.answers, "logprob").cpu().numpy()

    def metric_at(logits_at):
        V = logits_at.shape[0] // ds.n
        at = torch.arange(ds.positions.shape[1]).expand(V * ds.n, -1)
        return metrics.per_prompt(logits_at, at, ds.answers.repeat(V, 1), "logprob").cpu().numpy()

    return Runs(bridge, ds, clean, corrupt, metric, metric(clean["logits"]), metric(corrupt["logits"]),
                metric_at=metric_at, corruption="first_half", reference_source=Lazy(lambda: Reference(clean, loo=True)))


def whole_forward(runs, heads, kind, drop=None, freeze=False):
    """The reference: one whole forward with hooks.ablation_plan."""
    means = runs.mean_z({h.layer for h in heads}, drop) if kind == "mean" else {}
    plan = hooks.ablation_plan(heads, kind, runs.z(runs.corrupt), means)
    if freeze:
        from harness.mech.edges.patching import freeze_patterns_plan

        plan.hooks += freeze_patterns_plan(runs.patterns(runs.clean)).hooks
    return runs.metric(hooks.run_plan(runs.bridge, runs.ds.clean, plan))


@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
def test_stacked_ablations_equal_separate_whole_forwards(runs, kind):
    L, H = runs.n_layers, runs.n_heads
    sets = [[Head(1, 0)], [Head(0, 1), Head(2 % L, H - 1)], [Head(L - 1, 1)], Head.every(L, H), [Head(1, 1)]]
    drops = [None, 3, None, 0, 9] if kind == "mean" else None
    runs.memo.clear()
    got = runs.ablated_many(sets, kind, drops)
    for v, heads in enumerate(sets):
        want = whole_forward(runs, heads, kind, drops[v] if drops else None)
        np.testing.assert_allclose(got[v], want, atol=1e-4, rtol=1e-5)
    assert not np.allclose(got[0], runs.m_clean, atol=1e-4)  # the ablation did something


def test_partial_forward_equals_whole_forward(runs):
    """Runs.ablated starts at the lowest ablated layer (frozen patterns too)."""
    runs.memo.clear()
    heads = [Head(runs.n_layers - 1, 0)]
    for freeze in (False, True):
        np.testing.assert_allclose(runs.ablated(heads, "resample", freeze), whole_forward(runs, heads, "resample",
                                                                                         freeze=freeze),
                                   atol=1e-4, rtol=1e-5)


def test_run_from_checks_its_hooks(runs):
    plan = hooks.Plan()
    plan.add(hook_z(0), lambda z, hook: z)
    with pytest.raises(ValueError, match="below layer 1"):
        hooks.run_from(runs.bridge, 1, runs.clean[hook_resid_pre(1)], plan, runs.ds.positions)
