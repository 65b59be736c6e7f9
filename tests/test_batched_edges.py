"""Batched edge patching equals the per-edge path, whatever the chunking."""

import numpy as np
import pytest
import torch

from harness.mech import batched_edges
from harness.mech import patching as P
from harness.mech.hooks import cache_hooks
from harness.model import data, metrics

from .conftest import tiny_config


def per_edge(bridge, ds, edges, base, source, clean, tokens, replacement):
    """The per-edge path; `mean` replacement averages the sender over `clean`'s prompts, as the batched path does."""
    def mean_out(e):
        return P.sender_output(bridge, clean, e.sender).mean(0, keepdim=True) if replacement == "mean" else None

    return np.stack([metrics.per_prompt(P.fast_logits(bridge, tokens, P.prepare(bridge, e, base, source, replacement,
                                                                                 mean_out(e))),
                                        ds.positions, ds.answers, "logprob").double().numpy() for e in edges])


def batched(bridge, ds, edges, base, source, clean, replacement, budget):
    def mf(logits, pos):
        return metrics.per_prompt(logits, pos, ds.answers.repeat(logits.shape[0] // ds.n, 1), "logprob")

    return batched_edges.batched_metrics(bridge, edges, base, source, clean, ds.positions, mf, replacement, budget)


def runs(bridge, n_layers, vocab, seq=5, n=6):
    ds = data.repeated_tokens(n, seq, vocab, seed=3)
    hooks = batched_edges.cache_names(n_layers)
    return ds, cache_hooks(bridge, ds.clean, hooks), cache_hooks(bridge, ds.corrupted, hooks)


@pytest.mark.parametrize("replacement", ["resample", "mean", "zero"])
@pytest.mark.parametrize("budget", [1, 2**30])  # one edge per chunk vs everything at once
def test_three_layer_native_model(replacement, budget):
    """Receivers in layers 1 and 2 (general path and last-layer path), embed and logits edges."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    cfg = tiny_config(n_layers=3, seed=5)
    b = TransformerBridge.boot_native(TransformerBridgeConfig(**cfg), dtype=torch.float64)
    ds, clean, corrupt = runs(b, 3, cfg["d_vocab"])
    edges = batched_edges.all_edges(3, 2)
    assert len(edges) == (18 + 1) + 2 * (12 + 1) + 2 * (6 + 1) + 2 * 1  # senders embed, L0, L1, L2
    fast = batched(b, ds, edges, clean, corrupt, clean, replacement, budget)
    slow = per_edge(b, ds, edges, clean, corrupt, clean, ds.clean, replacement)
    np.testing.assert_allclose(fast, slow, atol=1e-10)


def test_fixture_all_edges_noising(fixture_model):
    b = fixture_model.bridge
    ds, clean, corrupt = runs(b, 2, 128, seq=10, n=12)
    edges = batched_edges.all_edges(2, 8)
    fast = batched(b, ds, edges, clean, corrupt, clean, "resample", 32 * 2**20)
    slow = per_edge(b, ds, edges, clean, corrupt, clean, ds.clean, "resample")
    np.testing.assert_allclose(fast, slow, atol=1e-4)


def test_gpt2_with_mlps_denoising(tmp_path):
    transformers = pytest.importorskip("transformers")
    from harness.model.loading import load_model

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=16, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    b = load_model(tmp_path / "m", dtype=torch.float64).bridge
    ds, clean, corrupt = runs(b, 2, 30)
    edges = batched_edges.all_edges(2, 4, embed=False)
    fast = batched(b, ds, edges, corrupt, clean, clean, "resample", 1)
    slow = per_edge(b, ds, edges, corrupt, clean, clean, ds.corrupted, "resample")
    np.testing.assert_allclose(fast, slow, atol=1e-10)


def test_chunk_size_follows_budget():
    per = batched_edges.bytes_per_edge(100, 41, 64, 16, 19, 128)
    assert batched_edges.chunk_size(10 * per, per) == 10 and batched_edges.chunk_size(1, per) == 1
