"""A zero-ablated circuit's base runs cache none of its outside heads' outputs: its non-vacuity
(mech.runs.change.head_changes) and the identity check make them again chunk by chunk.  Their
numbers equal those read from base runs that cached every head's output, on a model with a
norm after its attention (whose writes read the layer's pre-norm sum) and on one without."""

from __future__ import annotations

import numpy as np
import pytest

from harness.data import dataset as data
from harness.engine import sanity
from harness.mech import hooks
from harness.mech.runs import change
from harness.mech.runs.build import base_runs
from harness.model.ref import ModelRef
from harness.spec import names
from harness.spec.names import hook_resid_pre, hook_z

from . import family_models


@pytest.fixture(scope="module", params=["gemma3", "llama"])
def model(request, tmp_path_factory):
    folder = family_models.build(request.param, tmp_path_factory.mktemp(request.param) / "model", seed=2)
    return ModelRef.parse(str(folder)).load("cpu")


@pytest.mark.parametrize("kind", ["zero", "resample"])  # a mean reads the reference prompts' cache: always made
def test_outputs_made_again_give_the_cached_numbers(model, kind, monkeypatch):
    L, H = model.n_layers, model.n_heads
    ds = data.repeated_tokens(10, 5, model.d_vocab, seed=0, bos_token=1, n_ctx=model.n_ctx)
    heads = [names.Head(layer, h) for layer in range(L) for h in range(H) if (layer, h) != (1, 2)]
    every = [hook_z(layer) for layer in range(L)] + [hook_resid_pre(0)]
    cached = base_runs(model.bridge, ds, every, "logprob")
    bare = base_runs(model.bridge, ds, [hook_resid_pre(0)], "logprob", corrupted=[])
    assert change.missing(bare, heads) and not change.missing(cached, heads, corrupted=True)
    monkeypatch.setattr(type(bare), "chunk", lambda self: 3)  # 10 prompts in chunks of 3, 3, 3, 1
    want, got = change.head_changes(cached, heads, kind), change.head_changes(bare, heads, kind)
    assert change.missing(bare, heads)  # made for the chunks, not kept
    # float32 forwards of other batch sizes: equal to float32's precision
    np.testing.assert_allclose(got.joint, want.joint, rtol=1e-5)
    np.testing.assert_allclose(got.joint_scored, want.joint_scored, rtol=1e-5)
    for h in heads:
        np.testing.assert_allclose(got.per_head[h], want.per_head[h], rtol=1e-5, atol=1e-7)
    assert np.all(want.joint > 0.1)  # the numbers compared are not zeros


def test_identity_check_makes_the_outputs_it_patches(model):
    ds = data.repeated_tokens(10, 5, model.d_vocab, seed=0, bos_token=1, n_ctx=model.n_ctx)
    bare = base_runs(model.bridge, ds, [hook_resid_pre(0)], "logprob", corrupted=[])
    every = [names.Head(layer, h) for layer in range(model.n_layers) for h in range(model.n_heads)]
    from harness.claims.base import HeadAblationPath

    checks = sanity.identity_checks(bare, [HeadAblationPath(tuple(every))])
    assert checks and checks[0].passed and "head ablation" in checks[0].detail
    # the patch was not an empty plan: every layer's z was made and replaced
    view = change.with_activations(bare.prompts(0, 4), every)
    assert all(hook_z(layer) in view.clean for layer in range(model.n_layers))
    assert len(hooks.ablation_plan(every, "resample", view.z(view.clean), {}).hooks) >= model.n_layers
