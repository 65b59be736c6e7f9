"""Batched edge patching equals the per-edge path, whatever the chunking."""

import numpy as np
import pytest
import torch

from harness.data import dataset as data
from harness.mech.block import arith
from harness.mech.edges import patching as P
from harness.mech.edges import sets, writes
from harness.mech.edges.batched import batched_metrics
from harness.mech.hooks import cache_hooks
from harness.model import metrics
from harness.spec import names

from .conftest import boot_random_native, tiny_config


def per_edge(bridge, ds, edges, base, source, clean, tokens, replacement):
    """The per-edge path; `mean` replacement averages the sender over `clean`'s prompts, as the batched path does."""
    def mean_out(e):
        return ({m: writes.activation(bridge, clean, m).mean(0, keepdim=True) for m in writes.members(e.sender)}
                if replacement == "mean" else None)

    return np.stack([metrics.per_prompt(P.fast_logits(bridge, tokens, P.prepare(bridge, e, base, source, replacement,
                                                                                 mean_out(e))),
                                        ds.positions, ds.answers, "logprob").double().numpy() for e in edges])


def batched(bridge, ds, edges, base, source, clean, replacement, budget):
    def mf(logits, pos):
        return metrics.per_prompt(logits, pos, ds.answers.repeat(logits.shape[0] // ds.n, 1), "logprob")

    return batched_metrics(bridge, edges, base, source, clean, ds.positions, mf,
                                         replacement=replacement, budget_bytes=budget)


def runs(bridge, n_layers, vocab, seq=5, n=6):
    ds = data.repeated_tokens(n, seq, vocab, seed=3)
    hooks = sets.cache_names(n_layers)
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
    edges = sets.all_edges(3, 2)
    assert len(edges) == (18 + 1) + 2 * (12 + 1) + 2 * (6 + 1) + 2 * 1  # senders embed, L0, L1, L2
    fast = batched(b, ds, edges, clean, corrupt, clean, replacement, budget)
    slow = per_edge(b, ds, edges, clean, corrupt, clean, ds.clean, replacement)
    np.testing.assert_allclose(fast, slow, atol=1e-10)


@pytest.mark.slow
def test_fixture_all_edges_noising(fixture_model):
    b = fixture_model.bridge
    ds, clean, corrupt = runs(b, 2, 128, seq=10, n=12)
    edges = sets.all_edges(2, 8)
    fast = batched(b, ds, edges, clean, corrupt, clean, "resample", 32 * 2**20)
    slow = per_edge(b, ds, edges, clean, corrupt, clean, ds.clean, "resample")
    np.testing.assert_allclose(fast, slow, atol=1e-4)


def test_gpt2_with_mlps_denoising(tmp_path):
    transformers = pytest.importorskip("transformers")
    from harness.model.ref import load_model

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=16, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    b = load_model(tmp_path / "m", dtype=torch.float64).bridge
    ds, clean, corrupt = runs(b, 2, 30)
    edges = sets.all_edges(2, 4, embed=False)
    fast = batched(b, ds, edges, corrupt, clean, clean, "resample", 1)
    slow = per_edge(b, ds, edges, corrupt, clean, clean, ds.corrupted, "resample")
    np.testing.assert_allclose(fast, slow, atol=1e-10)


def test_chunk_size_follows_budget():
    per = sets.bytes_per_edge(100, 41, 64, 16, 19, 128)
    assert sets.chunk_size(10 * per, per) == 10 and sets.chunk_size(1, per) == 1


# -- the batched path's arithmetic (written out in torch) against the per-edge path --------------------------


def gpt2(tmp_path, n_layer, dtype, n_head=4, n_embd=16, vocab=30, **extra):
    """A random Hugging Face GPT-2 (MLPs, LayerNorms with random affine parameters) loaded as a bridge."""
    transformers = pytest.importorskip("transformers")
    from harness.model.ref import load_model

    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=24, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                                  **extra)
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():  # LayerNorm weights away from 1 and biases away from 0, so folding them matters
        for name, p in model.named_parameters():
            if "ln" in name:
                p.copy_(torch.randn(p.shape) * 0.3 + ("weight" in name))
    model.save_pretrained(tmp_path / "m")
    return load_model(tmp_path / "m", dtype=dtype).bridge


def scattered(ds, seed=0):
    """ds with different scored positions in every prompt (unsorted, not at the end), answers the next token."""
    import dataclasses

    g = torch.Generator().manual_seed(seed)
    n, seq = ds.clean.shape
    k = ds.positions.shape[1]
    pos = torch.stack([torch.randperm(seq - 3, generator=g)[:k] + 1 for _ in range(n)])
    return dataclasses.replace(ds, positions=pos, answers=ds.clean.gather(1, pos + 1))


@pytest.mark.slow
@pytest.mark.parametrize("replacement", ["resample", "mean", "zero"])
def test_four_layer_gpt2_every_receiver(tmp_path, replacement):
    """MLPs, 4 layers: receivers in layers 1 and 2 (downstream blocks in full, the last at the
    scored positions), in layer 3 (the last-layer road), and logits; embed and head senders;
    one edge per chunk and everything in one chunk."""
    b = gpt2(tmp_path, 4, torch.float64, n_head=2, n_embd=8)
    ds, clean, corrupt = runs(b, 4, 30, seq=6, n=5)
    edges = sets.all_edges(4, 2)
    slow = per_edge(b, ds, edges, clean, corrupt, clean, ds.clean, replacement)
    for budget in (1, 2**30):
        fast = batched(b, ds, edges, clean, corrupt, clean, replacement, budget)
        np.testing.assert_allclose(fast, slow, atol=1e-10)


def test_scattered_positions(tmp_path):
    """Scored positions that differ between prompts, unsorted, some early: the causal masks of
    the scored queries and the trimming of later positions."""
    b = gpt2(tmp_path, 3, torch.float64, n_head=2, n_embd=8)
    ds, clean, corrupt = runs(b, 3, 30, seq=7, n=4)
    ds = scattered(ds)
    edges = sets.all_edges(3, 2)
    fast = batched(b, ds, edges, corrupt, clean, clean, "resample", 2**20)
    slow = per_edge(b, ds, edges, corrupt, clean, clean, ds.corrupted, "resample")
    np.testing.assert_allclose(fast, slow, atol=1e-10)


@pytest.mark.parametrize("replacement", ["resample", "mean", "zero"])
def test_logits_edges_alone_read_the_scored_positions_and_no_layer(tmp_path, monkeypatch, replacement):
    """Edges into the logits alone: the arithmetic is ln_final and the unembedding only (no layer is
    built), each sender's change is taken at the scored positions (scattered, differing per prompt),
    and the numbers are the per-edge path's."""
    from harness.mech.block import read

    b = gpt2(tmp_path, 3, torch.float64, n_head=2, n_embd=8)
    ds, clean, corrupt = runs(b, 3, 30, seq=7, n=4)
    ds = scattered(ds)
    edges = [e for e in sets.all_edges(3, 2) if isinstance(e.receiver, names.Logits)]
    assert len(edges) == 1 + 3 * 2
    monkeypatch.setattr(read, "build_layer", lambda *a, **k: pytest.fail("a layer was built"))
    fast = batched(b, ds, edges, corrupt, clean, clean, replacement, 2**20)
    slow = per_edge(b, ds, edges, corrupt, clean, clean, ds.corrupted, replacement)
    np.testing.assert_allclose(fast, slow, atol=1e-10)


def test_a_senders_change_is_kept_only_while_a_later_chunk_reads_it(tmp_path):
    """Deltas: a sender read by two chunks is computed once and dropped after its second read; one read
    once is never kept."""
    from harness.mech.edges.deltas import Deltas

    b = gpt2(tmp_path, 2, torch.float64, n_head=2, n_embd=8)
    ds, clean, corrupt = runs(b, 2, 30, seq=7, n=4)
    a, c = names.Head(0, 0), names.Head(0, 1)
    d = Deltas(b, clean, corrupt, clean, "resample", ds.positions)
    d.expect([a, c])
    d.expect([a], scored=True)
    d.expect([a])
    first = d([a, c])
    assert set(d.memo) == {(str(a), False)}
    scored = d([a], scored=True)
    torch.testing.assert_close(scored[0], first[0].gather(
        1, ds.positions[:, :, None].expand(-1, -1, first.shape[-1])), rtol=0, atol=1e-12)
    assert set(d.memo) == {(str(a), False)}
    torch.testing.assert_close(d([a])[0], first[0], rtol=0, atol=0)
    assert d.memo == {}


def test_float32_gpt2(tmp_path):
    """float32 on the CPU (oneDNN's linear with the GELU fused on CPUs with AVX-512, else torch's)."""
    b = gpt2(tmp_path, 3, torch.float32, n_head=2, n_embd=16)
    ds, clean, corrupt = runs(b, 3, 30, seq=8, n=6)
    edges = sets.all_edges(3, 2)
    fast = batched(b, ds, edges, corrupt, clean, clean, "resample", 32 * 2**20)
    slow = per_edge(b, ds, edges, corrupt, clean, clean, ds.corrupted, "resample")
    np.testing.assert_allclose(fast, slow, atol=1e-4)


@pytest.mark.parametrize("over", [
    {"act_fn": "gelu", "normalization_type": "LN"},
    {"act_fn": "relu", "normalization_type": "RMS"},
    {"act_fn": "silu", "normalization_type": "LNPre"},
    {"act_fn": "gelu_new", "normalization_type": "RMSPre"},
    {"act_fn": "gelu", "normalization_type": None},
    {"act_fn": "solu_ln", "normalization_type": "LN"},  # not written out: the model's MLP module is called
    {"act_fn": "silu", "normalization_type": "RMS", "gated_mlp": True},  # gated: the model's MLP module
])
def test_native_mlp_variants(over):
    """Native 3-layer models with MLPs: activations, norms, gated MLPs, each against the per-edge path."""
    cfg = tiny_config(n_layers=3, seed=7, attn_only=False, d_mlp=12, **over)
    b = boot_random_native(cfg, seed=2)
    ds, clean, corrupt = runs(b, 3, cfg["d_vocab"])
    edges = sets.all_edges(3, 2)
    fast = batched(b, ds, edges, clean, corrupt, clean, "resample", 2**20)
    slow = per_edge(b, ds, edges, clean, corrupt, clean, ds.clean, "resample")
    np.testing.assert_allclose(fast, slow, atol=1e-10)


def test_torch_arithmetic_checked_against_the_cache(tmp_path):
    """A cache the model could not have produced (as from a block the batched path does not
    write out) is refused rather than swept."""
    from harness.errors import UnsupportedError
    from harness.spec.names import hook_z

    b = gpt2(tmp_path, 2, torch.float64)
    ds, clean, corrupt = runs(b, 2, 30)
    bad = dict(clean)
    bad[hook_z(1)] = clean[hook_z(1)] + 0.5
    with pytest.raises(UnsupportedError, match="blocks.1.attn.hook_z"):
        batched(b, ds, sets.all_edges(2, 4), bad, corrupt, clean, "resample", 2**20)


@pytest.mark.parametrize("act", [None, "gelu_new", "gelu", "relu", "silu"])
def test_dense_matches_addmm(act):
    """Dense = act(x W + b): by oneDNN's linear with the activation fused wherever this torch has it
    (build uses it on AVX-512 CPUs only, where it is the faster kernel), else addmm."""
    g = torch.Generator().manual_seed(0)
    x, W, b = torch.randn(37, 16, generator=g), torch.randn(16, 24, generator=g), torch.randn(24, generator=g)
    fn = arith.activation(act)
    dense = arith.Dense(W, b, dnn=True, act=fn)
    assert (dense.Wt is not None) == arith.dnn_ok(W.dtype, fn)
    want = torch.addmm(b, x, W)
    want = want if fn is None else fn[0](want)
    torch.testing.assert_close(dense(x.view(37, 1, 16)).view(37, 24), want, rtol=1e-5, atol=1e-5)


def test_gelu_tanh_form():
    x = torch.linspace(-12, 12, 1001, dtype=torch.float64)
    torch.testing.assert_close(arith.gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("columns", [True, False])  # in torch (read.token_logits), or gathered from the full logits
def test_a_few_tokens_logits_are_the_full_unembeddings_columns(columns):
    """With `tokens`, the sweep unembeds those tokens' columns only, and several values come back per
    edge and prompt: equal (float64) to the same values gathered from the whole vocabulary's logits,
    for every edge of a three-layer model (receivers in layers 1 and 2, and the logits)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    from harness.mech.edges.batched import checked_model

    cfg = tiny_config(n_layers=3, seed=5)
    b = TransformerBridge.boot_native(TransformerBridgeConfig(**cfg), dtype=torch.float64)
    ds, clean, corrupt = runs(b, 3, cfg["d_vocab"])
    edges = sets.all_edges(3, 2)
    other = (ds.answers * 7 + 3) % cfg["d_vocab"]
    tokens = torch.stack([ds.answers, other], -1)  # [n, k, 2]
    model = checked_model(b, clean)
    assert model.columns is not None  # the torch arithmetic reproduced the model's unembedding
    if not columns:
        model.columns = None

    def two(logits, pos):  # [N, k, 2] -> [N, 2]
        return torch.stack([logits[..., 0].mean(-1), -logits[..., 1].mean(-1)], -1)

    def gathered(logits, pos):  # [N, k, vocab] -> the same two values
        t = tokens.repeat(logits.shape[0] // ds.n, 1, 1)
        return two(logits.gather(-1, t), pos)

    few = batched_metrics(b, edges, clean, corrupt, clean, ds.positions, two, model=model, tokens=tokens, values=2)
    full = batched_metrics(b, edges, clean, corrupt, clean, ds.positions, gathered, model=model, values=2)
    assert few.shape == (len(edges), ds.n, 2)
    np.testing.assert_allclose(few, full, rtol=0, atol=1e-12)
    assert np.ptp(few[:, :, 0]) > 1e-3  # the edges move the logits: the comparison is not of constants


def test_a_logit_diff_sweep_unembeds_the_answer_and_wrong_columns_only():
    """Runs.patched_many under logit_diff (the names fixture: IO against S) takes the answer's and the
    wrong token's logits alone (model.metrics.columns_metric), never the whole unembedding, and gives
    each edge's metric as the per-edge path does from the whole vocabulary's logits."""
    from harness.mech.graph.structure import Graph
    from harness.spec.vocabulary import Direction

    from .graph_helpers import graph_runs

    runs = graph_runs("names", 12)
    assert runs.metric_name == "logit_diff"
    g = Graph.of(runs.bridge)
    edges = [e for e in g.edges() if isinstance(e.sender, names.Head)
             and isinstance(e.receiver, (names.HeadInput, names.Logits))][::5]
    assert {type(e.receiver) for e in edges} == {names.HeadInput, names.Logits}
    model = runs.edge_blocks()

    def whole(*args, **kwargs):
        raise AssertionError("the whole vocabulary was unembedded")

    model.logits = whole
    many = runs.patched_many(edges, Direction.NOISING, "resample")
    apart = graph_runs("names", 12)  # the same base runs, with a memo of their own
    one = [apart.patched(e, Direction.NOISING, "resample") for e in edges]  # a hooked forward each
    scale = max(1.0, float(np.abs(runs.m_clean).max()))
    np.testing.assert_allclose(np.stack(many), np.stack(one), rtol=0, atol=1e-5 * scale)  # float32 logits
    assert not np.allclose(np.stack(many), runs.m_clean)  # the patches moved the metric
