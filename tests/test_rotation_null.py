"""The shared rotation null and the factored scores, against slow references:
explicit Haar matrices (scipy), explicit d_model x d_model products, and the
exact moments of the null."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp, ortho_group

from harness.mech.weights import scores as W
from harness.mech.weights.factored import Composition, receiver_cores, sender_cores
from harness.mech.weights.null import CHUNK, PAIRS, SharedNull, haar_block_squares, mc_or_bound_p, tail_bound
from harness.spec.names import Head, HeadInput

from .conftest import tiny_config
from .test_weights import boot, dense_score


@pytest.mark.parametrize(("r", "n"), [(3, 12), (3, 5), (4, 8)])  # Bartlett path (n >= 2r) and the whole frame
def test_block_squares_match_explicit_haar_matrices(r, n):
    fast = haar_block_squares(r, n, 4000, seed=0).numpy()
    Rs = ortho_group.rvs(n, size=4000, random_state=2)
    slow = (Rs[:, :r, :r] ** 2)
    w = np.random.default_rng(5).uniform(size=(r, r))
    assert ks_2samp((fast * w).sum((1, 2)), (slow * w).sum((1, 2))).pvalue > 0.01
    assert ks_2samp(fast[:, 0, 0], slow[:, 0, 0]).pvalue > 0.01
    # E[F_ij^2] = 1/n exactly; the standard error of a mean of 4000 draws of F_00^2 is < 0.01/n here
    assert fast.mean() == pytest.approx(1 / n, rel=0.03)


@pytest.mark.parametrize(("r", "n", "m"), [(16, 64, 1000), (256, 640, 40)])
def test_blocks_built_a_part_at_a_time_are_the_one_generator_construction(r, n, m, monkeypatch):
    """haar_blocks draws G_top, W and the chi-square diagonal a part at a time from three generators
    that skip to their place: the numbers of one generator drawing each whole, in that order, and the
    blocks built from them, whatever the part size."""
    from harness.mech.weights import null

    rng = np.random.default_rng(7)
    G = torch.from_numpy(rng.standard_normal((m, r, r)))
    W = rng.standard_normal((m, r, r))
    diag = np.sqrt(rng.chisquare(n - r - np.arange(r), size=(m, r)))
    Lw = torch.from_numpy(np.tril(W, -1)) + torch.diag_embed(torch.from_numpy(diag))
    R = torch.linalg.cholesky(G.mT @ G + Lw @ Lw.mT, upper=True)
    want = torch.linalg.solve_triangular(R, G, upper=True, left=False)
    for build_bytes in (8 * r * r * 3, null.BUILD_BYTES):  # parts of 3 draws, and the default's
        monkeypatch.setattr(null, "BUILD_BYTES", build_bytes)
        torch.testing.assert_close(null.haar_blocks(r, n, m, 7), want, rtol=1e-12, atol=1e-14)


def test_null_draws_come_in_seeded_chunks():
    null = SharedNull(r=4, n=20, seed=7)
    a = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    b = torch.tensor([[0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    first = null.pair_samples(a, b, CHUNK)
    longer = SharedNull(r=4, n=20, seed=7).pair_samples(a, b, 2 * CHUNK + 500)
    np.testing.assert_array_equal(longer[:, :CHUNK], first)  # extending appends, never moves the base draws
    tail = SharedNull(r=4, n=20, seed=7).pair_samples(a, b, 2 * CHUNK + 500, start=CHUNK)
    np.testing.assert_array_equal(tail, longer[:, CHUNK:])
    assert not np.array_equal(SharedNull(r=4, n=20, seed=8).pair_samples(a, b, CHUNK), first)
    # E[C^2] = sum_ij a_i b_j E[F_ij^2] = 1/n
    assert np.mean(longer ** 2) == pytest.approx(1 / 20, rel=0.05)


def test_large_blocks_are_made_again_not_kept(monkeypatch):
    """What a SharedNull keeps is bounded by KEEP_BYTES (a 256-dimensional head's 1,000 draws would
    hold 512 MiB): with room for one chunk, the later chunks are made again on each use, with the
    same seed and so the same numbers as a null that keeps them all."""
    from harness.mech.weights import null as N

    r, n = 6, 20
    monkeypatch.setattr(N, "CHUNK_BYTES", 8 * r * r * 300)  # chunks of 300 draws
    rng = np.random.default_rng(1)
    a = torch.from_numpy(rng.dirichlet(np.ones(r), size=3))
    b = torch.from_numpy(rng.dirichlet(np.ones(r), size=3))
    kept_all = SharedNull(r=r, n=n, seed=5)
    full = kept_all.pair_samples(a, b, CHUNK)
    assert sorted(kept_all._chunks) == [0, 1, 2, 3]
    monkeypatch.setattr(N, "KEEP_BYTES", 8 * r * r * 300)
    bounded = SharedNull(r=r, n=n, seed=5)
    np.testing.assert_array_equal(bounded.pair_samples(a, b, CHUNK), full)
    np.testing.assert_array_equal(bounded.pair_samples(a, b, CHUNK), full)  # made again: the same draws
    assert sorted(bounded._chunks) == [0]


def test_many_pairs_drawn_together_match_one_at_a_time():
    """pair_samples of K pairs (more than PAIRS, so in several contractions) is each pair's own null
    C_null = sqrt(a^T (F o F) b), checked against the explicit draws, to float64 rounding."""
    null = SharedNull(r=4, n=20, seed=3)
    rng = np.random.default_rng(0)
    K = PAIRS + 5
    a = torch.from_numpy(rng.dirichlet(np.ones(4), size=K))
    b = torch.from_numpy(rng.dirichlet(np.ones(4), size=K))
    together = null.pair_samples(a, b, 1500)
    P = torch.cat([block for _, _, block in null.blocks(1500)]).numpy()  # [m, r, r]
    explicit = np.sqrt(np.einsum("kr,mrs,ks->km", a.numpy(), P, b.numpy()))
    np.testing.assert_allclose(together, explicit, rtol=1e-13, atol=0)
    one = np.concatenate([null.pair_samples(a[i:i + 1], b[i:i + 1], 1500) for i in (0, PAIRS, K - 1)])
    np.testing.assert_allclose(together[[0, PAIRS, K - 1]], one, rtol=1e-13, atol=0)


def test_tail_bound_holds():
    """P(C_null >= c) <= bound(c) for every c, checked against 20000 exact draws."""
    n, r = 30, 4
    sx = torch.tensor([3.0, 1.0, 0.5, 0.1], dtype=torch.float64)
    sy = torch.tensor([2.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    a, b = sx ** 2 / (sx ** 2).sum(), sy ** 2 / (sy ** 2).sum()
    null = np.concatenate([torch.einsum("r,mrs,s->m", a, haar_block_squares(r, n, 5000, s), b).sqrt().numpy()
                           for s in range(4)])
    lip = float(sx[0] * sy[0] / (sx.norm() * sy.norm()))
    for c in np.linspace(0.2, 1.0, 17):
        assert np.mean(null >= c) <= tail_bound(float(c), lip, n) + 1e-12
    assert tail_bound(0.1, lip, n) == 1.0  # below 1/sqrt(n): no bound
    assert tail_bound(0.99, 0.05, 768) < 1e-100


def test_bound_only_below_the_floor():
    assert mc_or_bound_p(0, 999, 1e-9) == 1e-9
    assert mc_or_bound_p(0, 999, 0.5) == 1 / 1000
    assert mc_or_bound_p(1, 999, 1e-9) == 2 / 1000  # a draw reached C: the Monte Carlo p stands


@pytest.mark.parametrize("processing", W.PROCESSING)
def test_factored_scores_equal_explicit_products(processing):
    b = boot(tiny_config(n_layers=3, n_heads=3, d_head=4, d_model=20, seed=11))
    hw = W.head_weights(b, processing)
    with torch.no_grad():  # head L0H1 writes nothing: no route from it
        hw.W_O[0, 1].zero_()
    comp = Composition(hw, 0)
    dense_x = hw.W_V @ hw.W_O
    dense_y = {"q": hw.W_Q @ hw.W_K.mT, "k": hw.W_K @ hw.W_Q.mT, "v": hw.W_V @ hw.W_O}
    for mode in W.MODES:
        got = comp.scores(mode)
        for l1 in range(3):
            for l2 in range(l1 + 1, 3):
                for h1 in range(3):
                    for h2 in range(3):
                        if (l1, h1) == (0, 1):
                            assert math.isnan(got[l1, h1, l2, h2])
                            continue
                        want = dense_score(dense_x[l1, h1], dense_y[mode][l2, h2])
                        assert got[l1, h1, l2, h2] == pytest.approx(want, abs=1e-12)
        assert got[1, :, 0, :].sum() == 0  # only earlier -> later
    # the cores reproduce the norms and spectra of the explicit matrices
    X, Y = sender_cores(hw), receiver_cores(hw, "k")
    np.testing.assert_allclose(torch.linalg.svdvals(X[2, 0]), torch.linalg.svdvals(dense_x[2, 0])[:4], atol=1e-10)
    np.testing.assert_allclose(torch.linalg.svdvals(Y[1, 2]), torch.linalg.svdvals(dense_y["k"][1, 2])[:4],
                               atol=1e-10)


def test_p_value_grid_agrees_with_single_pairs():
    b = boot(tiny_config(n_layers=3, n_heads=3, d_head=4, d_model=24, seed=12))
    comp = Composition(W.head_weights(b, "folded"), seed=3)
    for mode in W.MODES:
        grid, _ = comp.p_values(mode, 999)
        for l1, h1, l2, h2 in [(0, 0, 1, 2), (0, 2, 2, 1), (1, 1, 2, 0)]:
            one = comp.result(Head(l1, h1), HeadInput(Head(l2, h2), mode), 999)
            floor = 1 / 1000
            if one.p_value > floor:
                assert grid[l1, h1, l2, h2] == pytest.approx(one.p_value, abs=1e-15)
            else:
                bound = comp.bound(Head(l1, h1), HeadInput(Head(l2, h2), mode))
                assert grid[l1, h1, l2, h2] == pytest.approx(min(floor, bound))
        assert np.isnan(grid[1, 0, 0, 0]) and np.isnan(grid[2, 0, 2, 0])


def test_p_value_grid_is_calibrated_on_random_models():
    """Random init: the rate of p < alpha over every pair of 10 models is near alpha."""
    pvals = []
    for seed in range(10):
        hw = W.head_weights(boot(tiny_config(d_model=24, d_head=6, n_heads=4, seed=400 + seed)), "raw")
        comp = Composition(hw, seed)
        for mode in W.MODES:
            pvals.append(comp.p_values(mode, 400)[0][0, :, 1, :].ravel())
    p = np.concatenate(pvals)  # 480 p-values
    for alpha in (0.05, 0.1, 0.2):
        assert abs(np.mean(p < alpha) - alpha) < 3.5 * math.sqrt(alpha * (1 - alpha) / len(p)), alpha


@pytest.mark.parametrize("processing", W.PROCESSING)
def test_group_composition_is_the_stacked_write_against_its_own_null(processing):
    """A group of sender heads composes as their stacked OVs [X_1; X_2]: the score equals the
    explicit product's, a member-weighted mean of the members' C_i^2, and its null (spectra
    kept, Haar orientation) matches explicit rotations of the receiver (KS test)."""
    b = boot(tiny_config(n_layers=2, n_heads=3, d_head=3, d_model=10, seed=21))
    hw = W.head_weights(b, processing)
    comp = Composition(hw, 0)
    senders, receiver = (Head(0, 0), Head(0, 2)), HeadInput(Head(1, 1), "k")
    got = comp.group_result(senders, receiver, 2000)
    X = torch.cat([(hw.W_V @ hw.W_O)[s.layer, s.head] for s in senders])  # [2 d, d]
    Y = (hw.W_K @ hw.W_Q.mT)[1, 1]
    assert got.score == pytest.approx(dense_score(X, Y), abs=1e-12)
    singles = [comp.score(s, receiver) for s in senders]
    w = [float(torch.linalg.norm((hw.W_V @ hw.W_O)[s.layer, s.head]) ** 2) for s in senders]
    assert got.score ** 2 == pytest.approx(sum(wi * c ** 2 for wi, c in zip(w, singles)) / sum(w), abs=1e-12)
    assert got.sender == "L0H0 + L0H2" and math.isnan(got.percentile)
    # the null: X' against Y rotated by explicit Haar matrices of the null's dimension
    n = hw.null_dim
    basis = torch.linalg.qr(torch.randn(hw.W_V.shape[-2], n, dtype=torch.float64, generator=torch.Generator()
                                         .manual_seed(0)))[0] if n == hw.W_V.shape[-2] else None
    if basis is None:  # centred writes live in the complement of the all-ones direction
        ones = torch.ones(hw.W_V.shape[-2], 1, dtype=torch.float64) / math.sqrt(hw.W_V.shape[-2])
        full = torch.linalg.qr(torch.cat([ones, torch.randn(hw.W_V.shape[-2], n, dtype=torch.float64,
                                                             generator=torch.Generator().manual_seed(0))], 1))[0]
        basis = full[:, 1:]
    Xs, Ys = X.double() @ basis, basis.T @ Y.double()  # coordinates in the null's n-dimensional space
    explicit = []
    for R in ortho_group.rvs(n, size=2000, random_state=1):
        R = torch.as_tensor(R)
        explicit.append(float(torch.linalg.norm(Xs @ R @ Ys) / (torch.linalg.norm(Xs) * torch.linalg.norm(Ys))))
    shared = comp.group_result(senders, receiver, 2000)
    from harness.mech.weights.null import SharedNull, normalised_squares

    sx = torch.linalg.svdvals(X.double())[:min(2 * hw.W_V.shape[-1], n)]  # rank <= 2 d_head: the rest are 0
    sy = comp.spectrum("k")[1, 1]
    bvec = torch.zeros(len(sx), dtype=sx.dtype)
    bvec[:len(sy)] = normalised_squares(sy)
    null = SharedNull(len(sx), n, 0).pair_samples(normalised_squares(sx)[None], bvec[None], 2000)[0]
    assert ks_2samp(null, explicit).pvalue > 0.01
    assert shared.null_mean == pytest.approx(float(np.mean(null)), abs=1e-12)
    assert shared.p_value == pytest.approx((1 + int(np.sum(null >= got.score - 1e-12))) / 2001, abs=1e-12)
