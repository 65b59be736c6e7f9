"""Each ablation type against an independent float64 forward (tests/oracle.py),
and zero-ablating every head against a closed form."""

import pytest
import torch

from harness.data import dataset as data
from harness.errors import SanityCheckError
from harness.mech import hooks as iv
from harness.spec.names import Head, hook_z

from . import oracle
from .conftest import tiny_config

CFG = tiny_config()
HEADS = [Head(0, 1), Head(1, 0)]


@pytest.fixture(scope="module")
def setup(tiny_native):
    bridge, _ = tiny_native
    ds = data.repeated_tokens(6, 4, CFG["d_vocab"], seed=0)
    layers = [0, 1]
    clean = iv.cache_hooks(bridge, ds.clean, [hook_z(l) for l in layers])
    corrupt = iv.cache_hooks(bridge, ds.corrupted, [hook_z(l) for l in layers])
    sd = bridge.state_dict()
    return bridge, ds, sd, {l: clean[hook_z(l)] for l in layers}, {l: corrupt[hook_z(l)] for l in layers}


def test_bridge_matches_oracle(setup):
    bridge, ds, sd, *_ = setup
    with torch.no_grad():
        assert torch.allclose(bridge(ds.clean), oracle.forward(sd, CFG, ds.clean), atol=1e-10)


@pytest.mark.parametrize("kind", ["zero", "mean", "resample"])
def test_ablation_matches_oracle(setup, kind):
    bridge, ds, sd, clean_z, corrupt_z = setup
    _, oz_clean = oracle.forward(sd, CFG, ds.clean, want_z=True)
    _, oz_corrupt = oracle.forward(sd, CFG, ds.corrupted, want_z=True)

    def edit(layer, z):
        z = z.clone()
        for h in HEADS:
            if h.layer != layer:
                continue
            if kind == "zero":
                z[:, :, h.head] = 0
            elif kind == "mean":
                z[:, :, h.head] = oz_clean[layer][:, :, h.head].mean(0)
            else:
                z[:, :, h.head] = oz_corrupt[layer][:, :, h.head]
        return z

    # layer-1's clean z in the oracle is recomputed after layer 0's ablation, but the
    # mean/resample sources are the *unablated* runs' z, exactly as the harness defines them
    expected = oracle.forward(sd, CFG, ds.clean, z_edit=edit)
    mean_z = {layer: z.mean(0, keepdim=True) for layer, z in clean_z.items()}
    got = iv.run_plan(bridge, ds.clean, iv.ablation_plan(HEADS, kind, corrupt_z, mean_z))
    assert torch.allclose(got, expected, atol=1e-10)
    assert not torch.allclose(got, oracle.forward(sd, CFG, ds.clean), atol=1e-6)


def test_zero_ablating_every_head_closed_form(setup):
    """With every z zeroed, the residual is embed + pos + sum_l b_O^l at each position."""
    bridge, ds, sd, clean_z, corrupt_z = setup
    all_heads = [Head(l, h) for l in range(2) for h in range(2)]
    got = iv.run_plan(bridge, ds.clean, iv.ablation_plan(all_heads, "zero", corrupt_z, {}))
    s = ds.seq_len
    x = (sd["embed.weight"][ds.clean] + sd["pos_embed.weight"][:s] + sd["blocks.0.attn.o.bias"]
         + sd["blocks.1.attn.o.bias"])
    x = oracle.layer_norm(x, sd["ln_final.weight"], sd["ln_final.bias"], 1e-5)
    assert torch.allclose(got, x @ sd["unembed.weight"].T + sd["unembed.bias"], atol=1e-10)


def test_identity_resample_changes_nothing(setup):
    bridge, ds, _, clean_z, _ = setup
    got = iv.run_plan(bridge, ds.clean, iv.ablation_plan(HEADS, "resample", clean_z, {}))
    with torch.no_grad():
        assert torch.allclose(got, bridge(ds.clean), atol=1e-12)


def test_silent_hook_is_an_error(setup):
    bridge, ds, *_ = setup
    plan = iv.Plan()
    plan.add("blocks.0.attn.hook_z", lambda z, hook: z)
    plan.add("blocks.0.hook_mlp_in", lambda x, hook: x)  # gated off in an attention-only model
    with pytest.raises(SanityCheckError, match=r"blocks\.0\.hook_mlp_in"):
        iv.run_plan(bridge, ds.clean, plan)


def test_hook_that_never_fires_is_an_error(setup):
    """A model whose forward skips a registered hook (as gated hooks do on some
    architectures): simulated by a bridge whose forward calls no hooks."""
    bridge, ds, *_ = setup

    class SkipsHooks:
        hook_dict = bridge.hook_dict

        def run_with_hooks(self, tokens, fwd_hooks):
            return bridge(tokens)

    plan = iv.Plan()
    plan.add(hook_z(1), lambda z, hook: z)
    with pytest.raises(SanityCheckError, match=r"never fired: blocks\.1\.attn\.hook_z"):
        iv.run_plan(SkipsHooks(), ds.clean, plan)


def test_unknown_hook_is_an_error(setup):
    bridge, ds, *_ = setup
    plan = iv.Plan()
    plan.add("blocks.0.attn.hook_nope", lambda z, hook: z)
    with pytest.raises(SanityCheckError, match="no hook named blocks.0.attn.hook_nope"):
        iv.run_plan(bridge, ds.clean, plan)


def test_model_left_unchanged_after_error(setup):
    bridge, ds, *_ = setup
    with torch.no_grad():
        before = bridge(ds.clean)
    plan = iv.Plan()
    plan.add(hook_z(0), lambda z, hook: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        iv.run_plan(bridge, ds.clean, plan)
    with torch.no_grad():
        assert torch.equal(bridge(ds.clean), before)
