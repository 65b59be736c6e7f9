"""What flows through a route (mech.weights.explain): hand-built weights with known shared
directions, dense references (numpy SVDs of the explicit d x d product, scipy's
subspace angles, explicit Haar rotations), basis freedom, and the command, report and
figure that show it."""

import math

import numpy as np
import pytest
import torch
from scipy.linalg import subspace_angles
from scipy.stats import ks_2samp, ortho_group

from harness.cli import main
from harness.evidence.details import Explained, ExplainedDirection, TokenLoad
from harness.mech.weights import scores as W
from harness.mech.weights.explain import Explainer, principal_angles
from harness.mech.weights.factored import Composition
from harness.report import explain_figure, figures
from harness.report.markdown import explained_block, render_markdown
from harness.spec.names import Head, HeadInput

from .conftest import FIXTURE, boot_random_native, tiny_config
from .test_weights import change_head_bases

D, R, V, N_CTX = 12, 3, 7, 4
SENDER = Head(0, 0)


def basis(seed: int = 0) -> np.ndarray:
    """A random orthonormal basis of R^D (columns)."""
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((D, D)))[0]


def hand_weights(W_V, W_O, W_Q, W_K, W_V1, W_O1, W_E, W_U, W_pos=None) -> W.HeadWeights:
    """A 2-layer, 1-head HeadWeights: L0H0 (the sender) and L1H0 (the receiver); raw, null_dim = D."""
    def stack(a, b):
        return torch.as_tensor(np.stack([a, b])[:, None], dtype=torch.float64)

    z = np.zeros((D, R))
    E, U = torch.as_tensor(W_E, dtype=torch.float64), torch.as_tensor(W_U, dtype=torch.float64)
    pos = None if W_pos is None else torch.as_tensor(W_pos, dtype=torch.float64)
    return W.HeadWeights(stack(z, W_Q), stack(z, W_K), stack(W_V, W_V1), stack(W_O, W_O1),
                         lambda a, b: (E[a:b], U[:, a:b]), E.shape[0], lambda: pos, "raw", D)


S_X = np.array([3.0, 2.0, 1.0])  # the sender's singular values


def planted(reads: list[int], gains=(1.0, 1.0, 1.0), noise: float = 0.0, mode: str = "k"):
    """The sender reads e0, e1, e2 and writes w_k = e(3 + k) with singular values S_X.  The
    receiver's reading side takes the basis vectors `reads` (3 + k is the sender's w_k; 6, 7,
    11 lie outside what it writes); its other side is g_k e(8 + k).  Embeddings: token 0 = e0,
    token 1 = e1, token 2 = e2 - 0.3 e11, token 3 = -e0 + 0.5 e11, token 4 = e8, token 5 = e9,
    token 6 = e11; W_U: token 5's column is 3 e8; W_pos row 0 = 2 e1."""
    e = basis()
    W_V = e[:, :3]
    W_O = np.diag(S_X) @ e[:, 3:6].T
    reading = e[:, reads] + noise * np.random.default_rng(7).standard_normal((D, R))
    other = e[:, 8:11] * np.asarray(gains)
    W_E = np.stack([e[:, 0], e[:, 1], e[:, 2] - 0.3 * e[:, 11], -e[:, 0] + 0.5 * e[:, 11], e[:, 8], e[:, 9],
                    e[:, 11]])
    W_U = np.zeros((D, V))
    W_U[:, 5] = 3 * e[:, 8]
    W_pos = np.zeros((N_CTX, D))
    W_pos[0] = 2 * e[:, 1]
    if mode == "k":  # Y = W_K W_Q^T: W_K reads, W_Q is the other side
        hw = hand_weights(W_V, W_O, other, reading, np.zeros((D, R)), np.zeros((R, D)), W_E, W_U, W_pos)
    else:  # Y = W_V W_O: W_V reads, W_O writes g_k e(8 + k)
        hw = hand_weights(W_V, W_O, np.zeros((D, R)), np.zeros((D, R)), reading, other.T, W_E, W_U, W_pos)
    return hw, e


def dense(hw: W.HeadWeights, mode: str):
    """The explicit d x d X and Y of L0H0 -> L1H0.mode."""
    X = (hw.W_V[0, 0] @ hw.W_O[0, 0]).numpy()
    Y = {"q": hw.W_Q[1, 0] @ hw.W_K[1, 0].T, "k": hw.W_K[1, 0] @ hw.W_Q[1, 0].T,
         "v": hw.W_V[1, 0] @ hw.W_O[1, 0]}[mode].numpy()
    return X, Y


def receiver(mode: str = "k") -> HeadInput:
    return HeadInput(Head(1, 0), mode)


def test_one_aligned_direction_is_recovered():
    """The receiver reads w_0 only: P = s_0 g_0 e0 e8^T, rank 1, share 1, angles 0, 90, 90."""
    hw, e = planted([3, 6, 7], gains=(2.0, 1.0, 1.0))
    ex = Explainer(hw, 0).explain(SENDER, receiver(), 200)
    assert ex.rank == 1
    assert ex.shares[0] == pytest.approx(1.0, abs=1e-12)
    assert abs(ex.left[:, 0] @ e[:, 0]) > 1 - 1e-12 and abs(ex.right[:, 0] @ e[:, 8]) > 1 - 1e-12
    assert abs(ex.writes[:, 0] @ e[:, 3]) > 1 - 1e-12
    assert ex.sigma[0] == pytest.approx(3.0 * 2.0, abs=1e-12)
    assert ex.score == pytest.approx(6.0 / (np.linalg.norm(S_X) * math.sqrt(4 + 1 + 1)), abs=1e-12)
    np.testing.assert_allclose(np.degrees(ex.angles), [0.0, 90.0, 90.0], atol=1e-6)
    rec = Explainer(hw, 0).record(SENDER, receiver(), 200)
    d = rec.directions[0]
    assert len(rec.directions) == 1 and rec.n_aligned >= 1
    assert [t.token for t in d.sender_reads][0] == 0 and d.sender_reads[0].load == pytest.approx(1.0)
    assert d.sender_writes[0].token == 0 and d.sender_writes[0].load == pytest.approx(1.0)
    assert d.receiver_reads[0].token == 4 and d.receiver_reads[0].load == pytest.approx(1.0)
    assert 3 not in [t.token for t in d.sender_reads]  # anti-aligned: a negative load is not listed
    assert d.positional_share == pytest.approx(0.0, abs=1e-12)  # no position loads on e0
    assert rec.angles == pytest.approx([0.0, 90.0, 90.0], abs=1e-6)


def test_one_aligned_direction_plus_noise_matches_the_dense_svd():
    hw, e = planted([3, 6, 7], gains=(2.0, 1.0, 1.0), noise=1e-3)
    ex = Explainer(hw, 0).explain(SENDER, receiver(), 200)
    X, Y = dense(hw, "k")
    U, s, Vt = np.linalg.svd(X @ Y)
    np.testing.assert_allclose(ex.sigma, s[:R], rtol=1e-10, atol=1e-12)
    for i in range(R):  # the same singular vectors, up to sign
        assert abs(ex.left[:, i] @ U[:, i]) > 1 - 1e-9 and abs(ex.right[:, i] @ Vt[i]) > 1 - 1e-9
    assert ex.shares[0] > 1 - 1e-5  # noise 1e-3: the other directions carry O(1e-6)
    assert abs(ex.left[:, 0] @ e[:, 0]) > 1 - 1e-5
    expect = np.sort(subspace_angles(X.T, Y))
    np.testing.assert_allclose(np.degrees(ex.angles), np.degrees(expect), atol=1e-6)


def test_two_aligned_directions_with_known_weights():
    """Reads w_0 and w_1 with gains 1 and 2: sigma = (s_1 g_1, s_0 g_0) = (4, 3), shares 16/25, 9/25."""
    hw, e = planted([3, 4, 7], gains=(1.0, 2.0, 5.0))
    ex = Explainer(hw, 0).explain(SENDER, receiver(), 200)
    assert ex.rank == 2
    np.testing.assert_allclose(ex.sigma[:2], [4.0, 3.0], atol=1e-12)
    np.testing.assert_allclose(ex.shares[:2], [16 / 25, 9 / 25], atol=1e-12)
    assert abs(ex.left[:, 0] @ e[:, 1]) > 1 - 1e-12 and abs(ex.left[:, 1] @ e[:, 0]) > 1 - 1e-12
    assert abs(ex.right[:, 0] @ e[:, 9]) > 1 - 1e-12 and abs(ex.right[:, 1] @ e[:, 8]) > 1 - 1e-12
    np.testing.assert_allclose(np.degrees(ex.angles), [0.0, 0.0, 90.0], atol=1e-6)
    assert ex.score ** 2 == pytest.approx(25.0 / (14.0 * 30.0), abs=1e-12)  # sum sigma^2 / (||X||^2 ||Y||^2)
    rec = Explainer(hw, 0).record(SENDER, receiver(), 200)
    assert sum(x * x for x in rec.spectrum) == pytest.approx(rec.score ** 2, abs=1e-12)
    # direction 1 reads e1: token 1 loads 1; W_pos row 0 = 2 e1 gives the positional share exactly
    first = rec.directions[0]
    assert first.sender_reads[0].token == 1
    pos, tok = 4.0 / N_CTX, 1.0 / V
    assert first.positional_share == pytest.approx(pos / (pos + tok), abs=1e-12)
    assert first.receiver_reads[0].token == 5


def test_no_alignment_gives_zero_and_right_angles():
    hw, _ = planted([6, 7, 11])
    ex = Explainer(hw, 0).explain(SENDER, receiver(), 200)
    assert ex.score == pytest.approx(0.0, abs=1e-15) and ex.rank == 0
    np.testing.assert_allclose(np.degrees(ex.angles), [90.0, 90.0, 90.0], atol=1e-6)
    rec = Explainer(hw, 0).record(SENDER, receiver(), 200)
    assert rec.directions == [] and rec.top_share_p is None and rec.n_aligned == 0
    hw.W_O[0, 0].zero_()  # no route at all: the sender writes nothing
    rec = Explainer(hw, 0).record(SENDER, receiver(), 200)
    assert rec.score is None and rec.rank == 0 and rec.angles == [] and rec.directions == []
    assert "the product is zero" in "\n".join(explained_block([row_with(rec)]))


def test_value_route_promotes_through_the_unembedding():
    hw, e = planted([3, 6, 7], gains=(2.0, 1.0, 1.0), mode="v")
    rec = Explainer(hw, 0).record(SENDER, receiver("v"), 200)
    d = rec.directions[0]
    assert d.promotes is not None and d.receiver_reads is None
    assert d.promotes[0].token == 5 and d.promotes[0].load == pytest.approx(3.0, abs=1e-12)
    assert d.share == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("processing", W.PROCESSING)
@pytest.mark.parametrize("mode", W.MODES)
def test_random_weights_match_dense_references(processing, mode):
    """Singular values and vectors vs numpy on X @ Y, angles vs scipy, C vs the factored score,
    and the documented identities: C^2 = sum p_j G_jk^2 q_k, C <= cos(theta_1) C_max."""
    bridge = boot_random_native(tiny_config(n_layers=2, n_heads=2, d_head=3, d_model=8, d_vocab=11), seed=4)
    hw = W.head_weights(bridge, processing)
    sender, recv = Head(0, 1), HeadInput(Head(1, 0), mode)
    ex = Explainer(hw, 0).explain(sender, recv, 200)
    X = (hw.W_V[0, 1] @ hw.W_O[0, 1]).numpy()
    Y = {"q": hw.W_Q[1, 0] @ hw.W_K[1, 0].T, "k": hw.W_K[1, 0] @ hw.W_Q[1, 0].T,
         "v": hw.W_V[1, 0] @ hw.W_O[1, 0]}[mode].numpy()
    U, s, Vt = np.linalg.svd(X @ Y)
    np.testing.assert_allclose(ex.sigma, s[:3], rtol=1e-9, atol=1e-12)
    for i in range(ex.rank):
        assert abs(ex.left[:, i] @ U[:, i]) > 1 - 1e-8 and abs(ex.right[:, i] @ Vt[i]) > 1 - 1e-8
    np.testing.assert_allclose(ex.angles, np.sort(subspace_angles(X.T, Y)), atol=1e-9)
    assert ex.score == pytest.approx(Composition(hw, 0).score(sender, recv), abs=1e-12)
    Ux, sx, Vxt = np.linalg.svd(X)
    Uy, sy, _ = np.linalg.svd(Y)
    G = Vxt[:3] @ Uy[:, :3]
    p, q = sx[:3] ** 2 / np.sum(sx[:3] ** 2), sy[:3] ** 2 / np.sum(sy[:3] ** 2)
    assert ex.score ** 2 == pytest.approx(p @ (G ** 2) @ q, abs=1e-12)
    np.testing.assert_allclose(np.sort(np.linalg.svd(G, compute_uv=False))[::-1], np.cos(ex.angles), atol=1e-9)
    c_max = min(sx[0] / np.linalg.norm(sx), sy[0] / np.linalg.norm(sy))
    assert ex.score <= math.cos(ex.angles[0]) * c_max + 1e-12


def test_flat_spectra_give_the_sum_of_squared_cosines():
    """Orthonormal X and Y of rank r: C^2 = sum_j cos^2(theta_j) / r^2."""
    rng = np.random.default_rng(3)
    q = [np.linalg.qr(rng.standard_normal((D, R)))[0] for _ in range(4)]
    hw = hand_weights(q[0], q[1].T, q[3], q[2], np.zeros((D, R)), np.zeros((R, D)), np.eye(V, D), np.eye(D, V))
    ex = Explainer(hw, 0).explain(SENDER, receiver(), 200)
    assert ex.score ** 2 == pytest.approx(np.sum(np.cos(ex.angles) ** 2) / R ** 2, abs=1e-12)
    assert np.sum(np.cos(ex.angles) ** 2) > 0.1  # a non-trivial case


def test_principal_angles_of_nested_and_small_angles():
    """arcsin for small angles: a 1e-7 rad tilt is resolved (arccos alone gives ~1e-8 error)."""
    e = basis(5)
    tilt = 1e-7
    A = e[:, :2]
    B = np.stack([e[:, 0], math.cos(tilt) * e[:, 1] + math.sin(tilt) * e[:, 5]], axis=1)
    np.testing.assert_allclose(principal_angles(A, B), [0.0, tilt], atol=1e-15, rtol=1e-6)
    np.testing.assert_allclose(principal_angles(e[:, :3], e[:, :1]), [0.0], atol=1e-15)


@pytest.mark.parametrize("processing", W.PROCESSING)
def test_basis_freedom(processing):
    """Changing each head's internal basis (W_V -> W_V A, W_O -> A^-1 W_O; W_Q -> W_Q B,
    W_K -> W_K B^-T) changes no output: spectrum, shares, null statistics, angles, directions
    (with their fixed signs) and readouts."""
    bridge = boot_random_native(tiny_config(n_layers=2, n_heads=2, d_head=3, d_model=8, d_vocab=11), seed=6)
    edges = [(Head(0, h), HeadInput(Head(1, g), m)) for h in range(2) for g in range(2) for m in W.MODES]
    hw0 = W.head_weights(bridge, processing)
    before = [Explainer(hw0, 3).record(s, r, 300, top=3) for s, r in edges]
    vectors = [Explainer(hw0, 3).explain(s, r, 300) for s, r in edges]
    change_head_bases(bridge, seed=2)
    hw1 = W.head_weights(bridge, processing)
    assert not torch.allclose(hw0.W_V, hw1.W_V)
    after = [Explainer(hw1, 3).record(s, r, 300, top=3) for s, r in edges]
    for (s, r), a, b, v in zip(edges, before, after, vectors):
        assert_same(a.to_dict(), b.to_dict(), f"{s} -> {r}")
        w = Explainer(hw1, 3).explain(s, r, 300)
        k = v.rank
        np.testing.assert_allclose(w.left[:, :k], v.left[:, :k], atol=1e-8)
        np.testing.assert_allclose(w.right[:, :k], v.right[:, :k], atol=1e-8)


def assert_same(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, abs=1e-8), where
    else:
        assert a == b, where


def test_null_matches_explicit_haar_rotations():
    """The null's direction-1 share and smallest principal angle agree in distribution with those
    of X R Y for explicit Haar R (scipy.stats.ortho_group)."""
    rng = np.random.default_rng(11)
    W_V, W_O = rng.standard_normal((D, R)), rng.standard_normal((R, D)) * np.array([[3.0], [1.0], [0.3]])
    W_K, W_Q = rng.standard_normal((D, R)) * np.array([2.0, 1.0, 0.5]), rng.standard_normal((D, R))
    hw = hand_weights(W_V, W_O, W_Q, W_K, np.zeros((D, R)), np.zeros((R, D)), np.eye(V, D), np.eye(D, V))
    ex = Explainer(hw, 0).explain(SENDER, receiver(), 3000)
    X, Y = dense(hw, "k")
    shares, smallest = [], []
    for Rot in ortho_group.rvs(D, size=3000, random_state=5):
        s = np.linalg.svd(X @ Rot @ Y, compute_uv=False)
        shares.append(s[0] ** 2 / np.sum(s ** 2))
        smallest.append(np.min(subspace_angles((X @ Rot).T, Y)))
    assert ks_2samp(ex.null.shares[:, 0], shares).pvalue > 0.01
    assert ks_2samp(ex.null.angles[:, 0], smallest).pvalue > 0.01
    # and the statistics differ from the observed route's orientation only by the rotation
    assert ex.null.shares.shape == (3000, R) and np.allclose(ex.null.shares.sum(1), 1.0)


def test_vocabulary_is_read_in_blocks_with_the_same_products(monkeypatch):
    """The readouts and the copying score read W_E and W_U a block of tokens at a time (never
    whole) and get the same products and the same record whatever the block size."""
    bridge = boot_random_native(tiny_config(n_layers=2, n_heads=2, d_head=3, d_model=8, d_vocab=11), seed=4)
    hw = W.head_weights(bridge, "folded")
    calls = []
    vocab = hw.vocab
    hw.vocab = lambda a, b: calls.append((a, b)) or vocab(a, b)
    left, right = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    blocks = list(hw.vocab_products(left, right, chunk=3))
    assert calls == [(0, 3), (3, 6), (6, 9), (9, 11)]
    W_E, W_U = vocab(0, 11)
    torch.testing.assert_close(torch.cat([b[0] for b in blocks]), W_E @ left, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat([b[1] for b in blocks]), torch.linalg.norm(W_E, dim=1), rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat([b[2] for b in blocks], 1), right.T @ W_U, rtol=0, atol=1e-12)
    gram, norm_E, norm_U = hw.unembed_embed()
    torch.testing.assert_close(gram, W_U @ W_E, rtol=0, atol=1e-12)
    assert (norm_E, norm_U) == pytest.approx((float(torch.linalg.norm(W_E)), float(torch.linalg.norm(W_U))))
    assert max(b - a for a, b in calls) <= W.VOCAB_CHUNK
    one = W.head_weights(bridge, "folded")
    monkeypatch.setattr(W, "VOCAB_CHUNK", 4)
    for mode in W.MODES:
        recv = HeadInput(Head(1, 1), mode)
        monkeypatch.setattr(W, "VOCAB_CHUNK", 4)
        small = Explainer(hw, 0).record(Head(0, 0), recv, 200).to_dict()
        monkeypatch.setattr(W, "VOCAB_CHUNK", 64)  # the whole vocabulary in one block
        assert_same(small, Explainer(one, 0).record(Head(0, 0), recv, 200).to_dict(), mode)


def test_null_blocks_are_seeded_chunks():
    hw, _ = planted([3, 6, 7])
    first = Explainer(hw, 1).blocks(R, D, 1000)
    longer = Explainer(hw, 1).blocks(R, D, 1500)
    assert torch.equal(longer[:1000], first)
    assert not torch.equal(Explainer(hw, 2).blocks(R, D, 1000), first)


# ---------------------------------------------------------------- the command, the report, the figure
def test_explain_command_on_the_fixture(tmp_path, capsys):
    fig = tmp_path / "route.png"
    assert main(["explain", "L0H7 -> L1H5.k", str(FIXTURE), "--out", str(fig), "--draws", "500"]) == 0
    out = capsys.readouterr().out
    assert "C = 0.253" in out and "share of C²" in out and "principal angles between what L0H7 writes" in out
    assert "L1H5's queries read tokens" in out and f"wrote {fig}" in out
    assert fig.stat().st_size > 10_000
    assert main(["explain", "L0H7 -> L1H5.k", str(FIXTURE), "--out", str(fig)]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize(("edge", "needle"), [
    ("L0H7 -> L1.mlp", "MLPs have no composition score"),
    ("LOH7 -> L1H5.k", "did you mean L0H7?"),
    ("L0H7 -> L1H5", "is not the receiver of a composition edge"),
    ("embed -> L1H5.k", "'embed' is not the sender of a composition edge"),
    ("L0H7 -> L4H5.k", "L4H5.k is not in the model"),
])
def test_explain_command_bad_edges_exit_2(edge, needle, capsys):
    assert main(["explain", edge, str(FIXTURE)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_demo_report_explains_its_composition_claim(demo_evidence):
    comp = next(c for c in demo_evidence.claims if c.id == "K-comp-L0H7-L1H5")
    ex = comp.details.explained
    assert isinstance(ex, Explained) and ex.score == pytest.approx(comp.value, abs=1e-12)
    assert ex.rank == 16 and len(ex.directions) == 3 and ex.n_draws == 1000
    rows = {r.edge: r.explained for r in demo_evidence.weights_vs_use}
    assert rows["L0H7 -> L1H5.k"] == ex  # one explanation per route, whichever part of the report shows it
    md = render_markdown(demo_evidence, {"explain.png"})
    assert "- explained (what flows" in md and "**What flows**" in md and "(figures/explain.png)" in md
    assert md.count("L1H5's queries read tokens") >= 4  # 3 under the claim, 1 under the table


def test_demo_explain_figure_has_clear_text_at_page_width(demo_evidence):
    items = explain_figure.routes(demo_evidence)
    assert items[0][0] == "L0H7 -> L1H5.k" and len(items) == 5
    fig = explain_figure.draw_explain(items)
    try:
        assert figures.text_problems(fig) == []
        assert fig.get_size_inches()[0] * figures.DPI <= figures.HTML_WIDTH + 0.5
        assert figures.smallest_font_px(fig) >= 8.0
        titles = [ax.get_title() for ax in fig.axes]
        assert "L0H7 -> L1H5.k: C = 0.253" in titles
    finally:
        figures.pyplot().close(fig)


def hostile_explained(text: str) -> Explained:
    loads = [TokenLoad(token=1, text=text, load=0.9)]
    d = ExplainedDirection(index=1, sigma=1.0, share=0.9, null_share_mean=0.5, null_share_ci=[0.4, 0.6],
                           multiplicity=1, positional_share=None, sender_reads=loads, sender_writes=loads,
                           receiver_reads=loads, token_match=1.0)
    return Explained(score=0.3, rank=1, n_draws=99, spectrum=[0.3], null_spectrum=[[0.1, 0.2]], angles=[5.0],
                     null_angles=[[30.0, 40.0]], n_aligned=1, top_share_p=0.01, directions=[d])


def row_with(ex: Explained):
    from harness.evidence.details import WeightsVsUseRow

    return WeightsVsUseRow(edge="L0H1 -> L1H0.k", direction="noising", claim="c", composition=0.3,
                           composition_p_adjusted=0.01, composes=True, effect=0.2, effect_ci=[0.1, 0.3], use="used",
                           classification="route used", tests=[], explained=ex)


def test_token_texts_are_literal_in_the_report_and_the_figure():
    payload = "<img src=x onerror=alert(1)> **b** [l](http://x) $x^2$"
    md = "\n".join(explained_block([row_with(hostile_explained(payload))]))
    assert "<img" not in md and "&lt;img" in md and "\\*\\*b\\*\\*" in md and "[l\\](http" in md
    fig = explain_figure.draw_explain([("L0H1 -> L1H0.k", hostile_explained("$x^2$ <b>"))])
    try:
        assert any("$x^2$" in t.get_text() for t in figures._drawn_texts(fig))  # no mathtext
        assert figures.text_problems(fig) == []
    finally:
        figures.pyplot().close(fig)


@pytest.mark.slow
def test_every_schema_valid_explained_block_renders(demo_evidence):
    """The demo's composition claim alone, its `explained` object mutated key by key (each key
    deleted, emptied, nulled, given another type or a payload): whenever validation accepts the
    document, report.md, report.html and the figures render (every 10th with figures)."""
    from harness.evidence.document import normalised
    from harness.report import writer

    from .test_hostile_output import _apply, _mutations

    doc = normalised(demo_evidence.to_dict())
    claim = next(c for c in doc["claims"] if c["id"] == "K-comp-L0H7-L1H5")
    claim["details"]["explained"]["directions"] = claim["details"]["explained"]["directions"][:1]
    doc.update(claims=[claim], weights_vs_use=[], figures_data={}, ladder=[],
               counts={"PASS": 1, "FAIL": 0, "INCONCLUSIVE": 0})
    assert writer.validate_evidence(doc) == []
    base = "/claims/0/details/explained"
    accepted = 0
    for pointer, value in [(base + p, v) for p, v in _mutations(claim["details"]["explained"])]:
        d = _apply(doc, pointer, value)
        if writer.validate_evidence(d) == []:
            accepted += 1
            if accepted % 10 == 0:
                writer.render_files(d, checked=True)  # must not raise (nor warn)
            else:
                render_markdown(writer.load_evidence(d, checked=True), {"explain.png"})
    assert accepted >= 100


def test_explanations_and_scores_outlive_letting_go_of_the_weights(monkeypatch):
    """A run lets go of the head weights between stages (Context.let_go_of_weights); an edge that a
    later claim names again is not explained or scored again, and reads the same record."""
    from types import SimpleNamespace

    from harness.claims.base import Context
    from harness.model.ref import load_model
    from harness.spec.names import Edge
    from harness.spec.settings import Stats

    ctx = Context(runs=SimpleNamespace(bridge=load_model(FIXTURE).bridge), stats=Stats(null_draws=200), seed=0,
                  unit="nats", processing="folded")
    edge = Edge(Head(0, 3), HeadInput(Head(1, 6), "k"))
    first, score = ctx.explained(edge), ctx.composition().score(edge.sender, edge.receiver)
    ctx.let_go_of_weights()
    assert ctx._weights is None and ctx._explainer is None and ctx._composition is None

    def again(*args, **kwargs):
        raise AssertionError("computed again")

    monkeypatch.setattr(Explainer, "_explain", again)
    monkeypatch.setattr(Composition, "sender_core", again)
    assert ctx.explained(edge) == first
    assert ctx.composition().score(edge.sender, edge.receiver) == score


def test_a_deep_route_says_once_what_its_readouts_leave_out(demo_evidence):
    """A route whose sender sits more than one layer after the embeddings, and whose receiver more than
    one before the logits: one line says which token readouts are left out, and no direction repeats it."""
    from harness.evidence import explain_text

    comp = next(c for c in demo_evidence.claims if c.id == "K-comp-L0H7-L1H5")
    deep = comp.details.explained.model_copy(update={"n_layers": 9})
    text = explain_text.lines(deep, "L3H0 -> L5H1.k")
    said = [line for line in text if "left out" in line]
    assert len(said) == 1 and said == [text[1]] and "sits 3 layers after them" in said[0]
    assert len(text) == 2 + min(3, len(deep.directions))
    shallow = explain_text.lines(comp.details.explained, "L0H7 -> L1H5.k")
    assert not any("left out" in line for line in shallow) and "reads tokens" in shallow[1]
