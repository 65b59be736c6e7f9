"""Weight evidence: composition scores vs TransformerLens, the rotation null,
basis freedom, copying scores."""

import math

import numpy as np
import pytest
import torch

from harness import stats
from harness.mech.weights import scores as W
from harness.mech.weights.factored import Composition
from harness.mech.weights.null import haar_block_squares
from harness.model.ref import load_model
from harness.spec.names import Head, HeadInput

from .conftest import FIXTURE, tiny_config


def boot(cfg: dict, seed_weights: int | None = None):
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_native(TransformerBridgeConfig(**cfg), dtype=torch.float64)


def all_scores(hw, mode):
    return Composition(hw, 0).scores(mode)


def composition(hw, sender, receiver, n_draws, seed):
    """One pair with its own null draws (a fresh Composition per seed)."""
    return Composition(hw, seed).result(sender, receiver, n_draws)


def dense_score(X, Y):
    """||X Y||_F / (||X||_F ||Y||_F) on explicit d x d matrices (the slow reference)."""
    return float(torch.linalg.norm(X @ Y) / (torch.linalg.norm(X) * torch.linalg.norm(Y)))


def null_from_matrices(X, Y, n_draws, seed, r):
    """The shared-draw null of one explicit pair: sqrt(a^T (F o F) b) with a, b the top-r
    normalised squared spectra."""
    sx, sy = torch.linalg.svdvals(X)[:r], torch.linalg.svdvals(Y)[:r]
    a, b = sx ** 2 / (sx ** 2).sum(), sy ** 2 / (sy ** 2).sum()
    P = haar_block_squares(r, X.shape[0], n_draws, seed)
    return torch.einsum("r,mrs,s->m", a, P, b).sqrt().numpy()


def tl_scores(bridge, mode):
    return bridge.all_composition_scores(mode.upper()).scores.detach().numpy()


@pytest.mark.parametrize("mode", W.MODES)
def test_raw_scores_match_transformer_lens_on_fixture(mode):
    b = load_model(FIXTURE, dtype=torch.float64).bridge
    ours = all_scores(W.head_weights(b, "raw"), mode)
    np.testing.assert_allclose(ours, tl_scores(b, mode), atol=1e-5, rtol=0)
    assert ours[0, :, 1, :].min() > 0.01  # and the numbers are not all zero


@pytest.mark.parametrize("mode", W.MODES)
def test_raw_scores_match_transformer_lens_on_random_model(mode):
    b = boot(tiny_config(n_layers=3, n_heads=3, d_head=2, d_model=10, seed=4))
    np.testing.assert_allclose(all_scores(W.head_weights(b, "raw"), mode), tl_scores(b, mode),
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("layers_a_chunk", [1, 2, 3])
def test_scores_in_chunks_of_receiver_layers_match_transformer_lens(layers_a_chunk, monkeypatch):
    """The grid's receiver layers in chunks of 1, 2 or 3 (what a small working memory gives a wide
    model): every pair as TransformerLens's dense scores, to float64 rounding."""
    from harness.mech.weights import factored

    L, H, r, d = 5, 3, 2, 10
    monkeypatch.setattr(factored, "GRID_MEMORY", layers_a_chunk * 8 * (2 * d + H * r) * H * r)
    b = boot(tiny_config(n_layers=L, n_heads=H, d_head=r, d_model=d, seed=9))
    for mode in W.MODES:
        ours = all_scores(W.head_weights(b, "raw"), mode)
        np.testing.assert_allclose(ours, tl_scores(b, mode), atol=1e-12, rtol=0)
        assert np.all(ours[np.triu_indices(L, 1)[0], :, np.triu_indices(L, 1)[1], :] > 0)  # every pair filled


@pytest.mark.parametrize("mode", W.MODES)
def test_folded_scores_match_transformer_lens_processed_weights(mode):
    b = load_model(FIXTURE, dtype=torch.float64).bridge
    ours = all_scores(W.head_weights(b, "folded"), mode)
    b.process_weights(fold_ln=True, center_writing_weights=True, center_unembed=True,
                      fold_value_biases=True)
    np.testing.assert_allclose(ours, tl_scores(b, mode), atol=1e-5, rtol=0)
    assert np.abs(ours - all_scores(W.head_weights(load_model(FIXTURE, dtype=torch.float64).bridge,
                                                     "raw"), mode)).max() > 1e-4  # folding matters


def aligned_k_route(seed: int = 0):
    """Layer-0 head 0 copies residual dims 0-3 into dims 8-11; layer-1 head 0's keys
    read exactly dims 8-11.  Every other head is small and random.  LN weights are 1."""
    cfg = tiny_config(d_model=16, d_head=4, n_heads=4, n_ctx=16, d_vocab=20, seed=seed)
    b = boot(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in b.original_model.layers:
            for lin in (layer.attn.q, layer.attn.k, layer.attn.v, layer.attn.o):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g, dtype=torch.float64) * 0.1)
        a0, a1 = b.original_model.layers[0].attn, b.original_model.layers[1].attn
        a0.v.weight[0:4].zero_()
        a0.v.weight[0:4, 0:4] = torch.eye(4, dtype=torch.float64)  # W_V of head 0 reads dims 0-3
        a0.o.weight[:, 0:4].zero_()
        a0.o.weight[8:12, 0:4] = torch.eye(4, dtype=torch.float64) * 2  # W_O writes dims 8-11
        a1.k.weight[0:4].zero_()
        a1.k.weight[0:4, 8:12] = torch.eye(4, dtype=torch.float64)  # head 0's keys read dims 8-11
    return b


@pytest.mark.parametrize("processing", W.PROCESSING)
def test_aligned_route_is_significant_and_others_are_not(processing):
    hw = W.head_weights(aligned_k_route(), processing)
    claimed = composition(hw, Head(0, 0), HeadInput(Head(1, 0), "k"), 2000, seed=1)
    assert claimed.p_value < 0.001 and claimed.percentile == 100.0
    assert claimed.fraction_of_max > 0.9  # nearly as aligned as the spectra allow
    others = [composition(hw, Head(0, s), HeadInput(Head(1, r), "k"), 2000, seed=2 + 4 * s + r)
              for s in range(4) for r in range(4) if (s, r) != (0, 0)]
    assert all(o.p_value > 0.001 for o in others)
    assert min(o.p_value for o in others if o.sender != "L0H0") > 0.01


@pytest.mark.slow
@pytest.mark.parametrize("processing", W.PROCESSING)
def test_random_models_give_calibrated_p_values(processing):
    """Under random init the relative orientation of two heads is Haar-random (in
    the d-1 dimensions left after centring, for folded weights), so the null is
    exact: the rate of p < alpha must be near alpha."""
    pvals = []
    for seed in range(8):
        b = boot(tiny_config(d_model=24, d_head=6, n_heads=4, seed=100 + seed))
        hw = W.head_weights(b, processing)
        assert hw.null_dim == (23 if processing == "folded" else 24)
        for mode in W.MODES:
            for s in range(4):
                for r in range(4):
                    res = composition(hw, Head(0, s), HeadInput(Head(1, r), mode), 400, seed=seed * 97 + s * 4 + r)
                    pvals.append(res.p_value)
    pvals = np.array(pvals)  # 384 p-values
    for alpha in (0.05, 0.1, 0.2):
        rate = np.mean(pvals < alpha)
        assert abs(rate - alpha) < 3.5 * math.sqrt(alpha * (1 - alpha) / len(pvals)), (alpha, rate)


@pytest.mark.slow
@pytest.mark.parametrize("processing", W.PROCESSING)
def test_null_dimension_matches_random_models(processing):
    """E[C^2] = 1/null_dim for a random relative orientation, whatever the spectra.
    Random models must show it: 1/(d-1) after centring (folded), 1/d raw."""
    sq = []
    for seed in range(40):
        hw = W.head_weights(boot(tiny_config(d_model=8, d_head=2, n_heads=4, seed=300 + seed)), processing)
        for mode in W.MODES:
            sq.append(all_scores(hw, mode)[0, :, 1, :].ravel() ** 2)
    mean_sq = np.concatenate(sq).mean()  # 1920 pairs
    assert mean_sq == pytest.approx(1 / hw.null_dim, rel=0.05)
    wrong = 8 if processing == "folded" else 7
    assert abs(mean_sq - 1 / wrong) > 0.08 / wrong


def test_null_spread_depends_on_rank():
    """E[C^2] = 1/d under the null whatever the ranks, but the spread shrinks with
    rank: a rank-1 pair's null is far wider than a full-rank pair's, so no single
    threshold on C can be right for both."""
    d = 64
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    X1, Y1 = rnd(d, 1) @ rnd(1, d), rnd(d, 1) @ rnd(1, d)
    Xf, Yf = rnd(d, 16) @ rnd(16, d), rnd(d, 16) @ rnd(16, d)
    n1 = null_from_matrices(X1, Y1, 4000, 0, r=1)
    nf = null_from_matrices(Xf, Yf, 4000, 0, r=16)
    assert np.mean(n1 ** 2) == pytest.approx(1 / d, rel=0.1)
    assert np.mean(nf ** 2) == pytest.approx(1 / d, rel=0.1)
    assert n1.std() > 4 * nf.std()
    assert np.quantile(n1, 0.99) > 2.2 * np.quantile(nf, 0.99)


def test_null_matches_explicit_rotations():
    """The cheap null (a Haar block) agrees in distribution with ||X R Y|| for explicit Haar R."""
    from scipy.stats import ks_2samp, ortho_group

    g = torch.Generator().manual_seed(3)
    X = torch.randn(12, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 12, generator=g, dtype=torch.float64)
    Y = torch.randn(12, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 12, generator=g, dtype=torch.float64)
    fast = null_from_matrices(X, Y, 3000, 0, r=3)
    Rs = ortho_group.rvs(12, size=3000, random_state=1)
    slow = np.array([dense_score(X, torch.as_tensor(R) @ Y) for R in Rs])
    assert ks_2samp(fast, slow).pvalue > 0.01


def change_head_bases(bridge, seed=0):
    """W_V -> W_V R, W_O -> R^-1 W_O; W_Q -> W_Q S, W_K -> W_K S^-T (biases too), per head."""
    g = torch.Generator().manual_seed(seed)
    dh = bridge.cfg.d_head
    with torch.no_grad():
        for layer in bridge.original_model.layers:
            a = layer.attn
            for h in range(bridge.cfg.n_heads):
                sl = slice(h * dh, (h + 1) * dh)
                R = torch.randn(dh, dh, generator=g, dtype=torch.float64) + 2 * torch.eye(dh, dtype=torch.float64)
                S = torch.randn(dh, dh, generator=g, dtype=torch.float64) + 2 * torch.eye(dh, dtype=torch.float64)
                # nn.Linear stores W^T: block_new = (W M)^T = M^T block
                a.v.weight[sl] = R.T @ a.v.weight[sl]
                a.v.bias[sl] = R.T @ a.v.bias[sl]
                a.o.weight[:, sl] = a.o.weight[:, sl] @ torch.linalg.inv(R).T
                a.q.weight[sl] = S.T @ a.q.weight[sl]
                a.q.bias[sl] = S.T @ a.q.bias[sl]
                a.k.weight[sl] = torch.linalg.inv(S) @ a.k.weight[sl]
                a.k.bias[sl] = torch.linalg.inv(S) @ a.k.bias[sl]


@pytest.mark.parametrize("processing", W.PROCESSING)
def test_basis_freedom(processing):
    b = load_model(FIXTURE, dtype=torch.float64).bridge
    toks = torch.randint(0, 128, (3, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before_out = b(toks)
    hw0 = W.head_weights(b, processing)
    before = {m: all_scores(hw0, m) for m in W.MODES}
    copy0 = [W.copying_score(hw0, 1, h).value for h in range(8)]
    change_head_bases(b)
    hw1 = W.head_weights(b, processing)
    assert not torch.allclose(hw0.W_V, hw1.W_V)  # the weights really changed
    with torch.no_grad():
        assert torch.allclose(b(toks), before_out, atol=1e-9)
    for m in W.MODES:
        np.testing.assert_allclose(all_scores(hw1, m), before[m], atol=1e-9)
    np.testing.assert_allclose([W.copying_score(hw1, 1, h).value for h in range(8)], copy0, atol=1e-9)


def test_copying_score_matches_full_vocab_eigenvalues():
    b = boot(tiny_config(seed=9))
    hw = W.head_weights(b, "raw")
    W_E, W_U = hw.vocab(0, hw.vocab_span)
    for layer in range(2):
        for h in range(2):
            full = (W_E @ hw.W_V[layer, h] @ hw.W_O[layer, h] @ W_U).numpy()
            lam = np.linalg.eigvals(full)
            expected = lam.sum().real / np.abs(lam).sum()
            assert W.copying_score(hw, layer, h).value == pytest.approx(expected, abs=1e-9)


def test_copying_score_hand_built():
    """W_E = W_U^T and OV = identity on the embedding span: the full circuit is
    W_E W_E^T (positive semi-definite) -> copying 1; negated OV -> -1; zero OV -> undefined."""
    b = boot(tiny_config(d_model=6, d_head=6, n_heads=1, seed=1))
    with torch.no_grad():
        m = b.original_model
        m.head.weight.copy_(m.tok_embed.weight)  # W_U = W_E^T
        a = m.layers[0].attn
        a.v.weight.copy_(torch.eye(6, dtype=torch.float64))
        a.o.weight.copy_(torch.eye(6, dtype=torch.float64))
    hw = W.head_weights(b, "raw")
    assert W.copying_score(hw, 0, 0).value == pytest.approx(1.0, abs=1e-12)
    with torch.no_grad():
        a.o.weight.mul_(-1)
    assert W.copying_score(W.head_weights(b, "raw"), 0, 0).value == pytest.approx(-1.0, abs=1e-12)
    with torch.no_grad():
        a.o.weight.zero_()
    assert W.copying_score(W.head_weights(b, "raw"), 0, 0).value is None


def test_benjamini_hochberg_matches_scipy():
    from scipy.stats import false_discovery_control

    p = np.random.default_rng(0).uniform(size=40) ** 2
    np.testing.assert_allclose(stats.benjamini_hochberg(list(p)), false_discovery_control(p), atol=1e-12)
    assert stats.benjamini_hochberg([]) == []


def test_head_weights_do_not_modify_the_model():
    b = load_model(FIXTURE, dtype=torch.float64).bridge
    before = {k: v.clone() for k, v in b.state_dict().items()}
    W.head_weights(b, "folded")
    assert all(torch.equal(before[k], v) for k, v in b.state_dict().items())
