"""Exact edge patching: fast (hooked q/k/v) == slow (attention by hand) == an
independent float64 forward; identity patches change nothing; TransformerLens
parity where it supports the model."""

import pytest
import torch

from harness.data import dataset as data
from harness.mech.edges import patching as P
from harness.mech.edges import writes
from harness.mech.hooks import cache_hooks
from harness.model import metrics
from harness.spec import names

from . import oracle
from .conftest import tiny_config

EDGES = ["L0H0 -> L1H1.q", "L0H1 -> L1H0.k", "L0H0 -> L1H0.v", "embed -> L0H1.k", "embed -> L1H1.v",
         "L0H1 -> logits", "L1H0 -> logits", "embed -> logits"]


@pytest.fixture(scope="module")
def runs(tiny_native):
    bridge, _ = tiny_native
    ds = data.repeated_tokens(8, 4, tiny_config()["d_vocab"], seed=2)
    edges = [names.parse_edge(e) for e in EDGES]
    hooks = P.cache_names(edges, 2)
    return bridge, ds, cache_hooks(bridge, ds.clean, hooks), cache_hooks(bridge, ds.corrupted, hooks)


def oracle_logits(bridge, tokens, edge, patch):
    """The patched residual fed to the receiver by hand, in tests/oracle.py's forward."""
    cfg, sd = tiny_config(), bridge.state_dict()
    r = edge.receiver
    if isinstance(r, names.Logits):
        return oracle.forward(sd, cfg, tokens, final_edit=lambda x: patch.resid)
    return oracle.forward(sd, cfg, tokens, input_edit=lambda layer, x: (
        {(r.head.head, r.which): patch.resid} if layer == r.head.layer else {}))


@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("direction,replacement", [("noising", "resample"), ("noising", "mean"),
                                                   ("noising", "zero"), ("denoising", "resample")])
def test_fast_equals_slow_equals_oracle(runs, edge, direction, replacement):
    bridge, ds, clean, corrupt = runs
    e = names.parse_edge(edge)
    base, source, tokens = ((clean, corrupt, ds.clean) if direction == "noising"
                            else (corrupt, clean, ds.corrupted))
    means = ({m: writes.activation(bridge, clean, m).mean(0, keepdim=True) for m in writes.members(e.sender)}
             if replacement == "mean" else None)
    patch = P.prepare(bridge, e, base, source, replacement, means)
    fast = P.fast_logits(bridge, tokens, patch)
    slow = P.slow_logits(bridge, tokens, patch, base)
    assert torch.allclose(fast, slow, atol=1e-10)
    assert torch.allclose(fast, oracle_logits(bridge, tokens, e, patch), atol=1e-10)
    assert not torch.allclose(fast, base["logits"], atol=1e-8)  # the patch did something


def test_patched_residual_is_base_minus_sender_plus_replacement(runs):
    bridge, ds, clean, corrupt = runs
    e = names.parse_edge("L0H1 -> L1H0.k")
    patch = P.prepare(bridge, e, clean, corrupt, "resample")
    W_O = bridge.W_O[0, 1]
    expected = (clean["blocks.1.hook_resid_pre"] - clean["blocks.0.attn.hook_z"][:, :, 1] @ W_O
                + corrupt["blocks.0.attn.hook_z"][:, :, 1] @ W_O)
    assert torch.allclose(patch.resid, expected, atol=1e-12)


@pytest.mark.parametrize("edge", EDGES)
def test_identity_patch_changes_nothing(runs, edge):
    bridge, ds, clean, _ = runs
    patch = P.prepare(bridge, names.parse_edge(edge), clean, clean, "resample")
    assert torch.allclose(P.fast_logits(bridge, ds.clean, patch), clean["logits"], atol=1e-12)


def test_frozen_patterns_remove_key_and_query_effects(fixture_model):
    """With every pattern frozen to the base run, q and k edges can do nothing; v edges still act."""
    b = fixture_model.bridge
    ds = data.repeated_tokens(20, 10, 128, seed=4)
    hooks = P.cache_names([names.parse_edge("L0H7 -> L1H5.k")], 2) + [
        f"blocks.{l}.attn.hook_pattern" for l in range(2)]
    clean, corrupt = cache_hooks(b, ds.clean, hooks), cache_hooks(b, ds.corrupted, hooks)
    freeze = P.freeze_patterns_plan({l: clean[f"blocks.{l}.attn.hook_pattern"] for l in range(2)})
    for which, moves in (("k", False), ("q", False), ("v", True)):
        patch = P.prepare(b, names.parse_edge(f"L0H7 -> L1H5.{which}"), clean, corrupt, "resample")
        frozen = P.fast_logits(b, ds.clean, patch, freeze)
        free = P.fast_logits(b, ds.clean, patch)
        assert torch.allclose(frozen, free, atol=1e-5) == (which == "v")
        assert torch.allclose(frozen, clean["logits"], atol=1e-5) != moves


def test_transformer_lens_direct_path_parity(tmp_path):
    """Denoising edge patching equals TransformerLens's get_act_patch_direct_path on an
    HF GPT-2 bridge (the model family where TL supports split q/k/v input)."""
    transformers = pytest.importorskip("transformers")
    from transformer_lens.patching import get_act_patch_direct_path

    from harness.model.ref import load_model

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=16, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    b = load_model(tmp_path / "m", dtype=torch.float64).bridge
    ds = data.repeated_tokens(6, 5, 30, seed=0)
    _, clean_cache = b.run_with_cache(ds.clean)
    _, corrupt_cache = b.run_with_cache(ds.corrupted)

    def metric(logits):
        return metrics.per_prompt(logits, ds.positions, ds.answers, "logprob").mean()

    hooks = ["blocks.0.attn.hook_z", "blocks.1.hook_resid_pre"]
    clean, corrupt = cache_hooks(b, ds.clean, hooks), cache_hooks(b, ds.corrupted, hooks)
    for which in "qkv":
        tl = get_act_patch_direct_path(b, ds.corrupted, clean_cache, corrupt_cache, metric, 0, 2,
                                       component=which, verbose=False)
        for head in range(4):
            e = names.parse_edge(f"L0H2 -> L1H{head}.{which}")
            ours = metric(P.fast_logits(b, ds.corrupted, P.prepare(b, e, corrupt, clean, "resample")))
            assert float(ours) == pytest.approx(float(tl[1, head]), abs=1e-6)
