"""Weight evidence: composition scores (Elhage et al. 2021) against a
spectrum-preserving rotation null, and OV copying scores.

Row-vector convention (TransformerLens): per head
    OV = W_V W_O            (d_model x d_model, rank <= d_head)
    QK = W_Q W_K^T          (query side x key side)

Composition of sender head A (earlier layer) into receiver head B:
    C = ||X Y||_F / (||X||_F ||Y||_F),  X = OV_A,
    Y = QK_B (q),  QK_B^T (k),  OV_B (v).

Weight processing (`processing`):
* "raw":    the weights as stored (what `all_composition_scores` uses on an
            unprocessed bridge);
* "folded": LayerNorm folded in, as TransformerLens's `process_weights`
            (fold_ln + center_writing_weights) does: readers become
            P diag(w_ln1) W_{Q,K,V} and writers W_O P, with P = I - 11^T/d the
            centring projection (LN removes the mean of its input anyway).
            RMSNorm weights are folded without centring (RMSNorm keeps the
            mean); models without norm weights are left as they are.

Null: keep both heads' spectra and draw their relative orientation uniformly:
    C_null = ||X R Y||_F / (||X||_F ||Y||_F),  R Haar-random orthogonal.
After centring, X's outputs and Y's inputs lie in the (d-1)-dimensional
complement of the all-ones direction, so R is drawn there (`null_dim` = d - 1);
otherwise null_dim = d.
With X = U_x S_x V_x^T and Y = U_y S_y V_y^T (thin SVDs, ranks r_x, r_y),
||X R Y||_F = ||S_x (V_x^T R U_y) S_y||_F and V_x^T R U_y is distributed as the
top-left r_x x r_y block of a Haar orthogonal matrix, so each draw costs one
small QR.  One-sided p = (1 + #{C_null >= C}) / (1 + n_draws).

Monte Carlo resolution: the smallest attainable p is 1/(1 + n_draws), so with
n tests corrected by Benjamini-Hochberg nothing can be significant at alpha
unless n_draws + 1 > n / alpha.  `draws_needed` gives the count that makes the
floor alpha/2; pairs whose p is below alpha after the base draws are extended to
it (pairs at or above alpha cannot become significant), and the count used is
recorded per pair.

Also reported: C * sqrt(null_dim) (1 = the isotropic baseline E[C^2] = 1/null_dim),
C / C_max with C_max = min(s1(X)/||X||_F, s1(Y)/||Y||_F) (the largest score
the two spectra allow), and the pair's percentile among all cross-layer pairs.

Copying score of head h: eigenvalues lambda of the full OV circuit
W_E OV_h W_U (vocab x vocab); its non-zero eigenvalues are those of the
d_head x d_head matrix W_O W_U W_E W_V, so that is what is decomposed.
    copying = Re(sum lambda) / sum |lambda|   (1 = pure copying)
undefined (None) when sum |lambda| is ~0 (the head's OV circuit never reaches
the unembedding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..evidence.details import Num, Record
from ..spec.names import Head, HeadInput
from ..spec.vocabulary import MODES
from ..spec.vocabulary import WEIGHT_PROCESSING as PROCESSING
from ..streams import NULL_EXTENSION, derive_seed

__all__ = ["MODES", "PROCESSING", "HeadWeights", "head_weights", "composition", "copying_score",
           "CopyingScore", "CompositionResult"]


@dataclass
class HeadWeights:
    """Per-layer stacks in float64 on the CPU, whatever the model's device (MPS has
    no float64, and the null draws use CPU generators): W_Q, W_K, W_V [L, H, d, dh];
    W_O [L, H, dh, d]; W_E [vocab, d]; W_U [d, vocab]."""

    W_Q: Any
    W_K: Any
    W_V: Any
    W_O: Any
    W_E: Any
    W_U: Any
    processing: str
    null_dim: int  # dimension the null rotates in: d_model, or d_model - 1 after centring

    @property
    def d_model(self) -> int:
        return int(self.W_Q.shape[-2])

    @property
    def n_layers(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[1])


def head_weights(bridge: Any, processing: str = "folded") -> HeadWeights:
    """Read the attention weights from a bridge (never modifying it), as CPU float64 copies."""
    import torch

    if processing not in PROCESSING:
        raise ValueError(f"unknown weight processing {processing!r}; allowed: {', '.join(PROCESSING)}")
    with torch.no_grad():
        def get(name: str) -> Any:
            return getattr(bridge, name).detach().cpu().to(torch.float64).clone()

        W_Q, W_K, W_V, W_O, W_E, W_U = (get(n) for n in ("W_Q", "W_K", "W_V", "W_O", "W_E", "W_U"))
        d = W_Q.shape[-2]
        null_dim = d
        if processing == "folded":
            centre = str(getattr(bridge.cfg, "normalization_type", "") or "").upper().startswith("LN")
            P = torch.eye(d, dtype=torch.float64) - (1.0 / d if centre else 0.0)
            for layer in range(W_Q.shape[0]):
                w = _ln_weight(bridge.blocks[layer], "ln1")
                if w is None and not centre:
                    continue
                reader = P if w is None else P @ torch.diag(w)
                W_Q[layer], W_K[layer], W_V[layer] = (reader @ W[layer] for W in (W_Q, W_K, W_V))
            if centre:
                W_O, W_E = W_O @ P, W_E @ P
                null_dim = d - 1
            wf = _ln_weight(bridge, "ln_final")
            if wf is not None or centre:
                W_U = (P if wf is None else P @ torch.diag(wf)) @ W_U
    return HeadWeights(W_Q, W_K, W_V, W_O, W_E, W_U, processing, null_dim)


def _ln_weight(module: Any, name: str) -> Any | None:
    import torch

    ln = getattr(module, name, None)
    w = getattr(ln, "weight", None) if ln is not None else None
    return w.detach().cpu().to(torch.float64) if isinstance(w, torch.Tensor) else None


def factors(hw: HeadWeights, layer: int, head: int, which: str) -> tuple[Any, Any]:
    """(A, B) with the d_model x d_model matrix = A @ B for OV or QK (or QK^T)."""
    if which == "ov":
        return hw.W_V[layer, head], hw.W_O[layer, head]
    if which == "qk":
        return hw.W_Q[layer, head], hw.W_K[layer, head].T
    if which == "qkT":
        return hw.W_K[layer, head], hw.W_Q[layer, head].T
    raise ValueError(which)


def receiver_matrix(hw: HeadWeights, layer: int, head: int, mode: str) -> Any:
    """Y for the receiver: QK (q), QK^T (k) or OV (v)."""
    a, b = factors(hw, layer, head, {"q": "qk", "k": "qkT", "v": "ov"}[mode])
    return a @ b


def sender_matrix(hw: HeadWeights, layer: int, head: int) -> Any:
    a, b = factors(hw, layer, head, "ov")
    return a @ b


def composition_score(X: Any, Y: Any) -> float:
    """||X Y||_F / (||X||_F ||Y||_F); NaN (undefined) when either matrix is zero,
    which means there is no route at all."""
    import torch

    denom = float(torch.linalg.norm(X) * torch.linalg.norm(Y))
    return float(torch.linalg.norm(X @ Y)) / denom if denom > 0 else float("nan")


def all_scores(hw: HeadWeights, mode: str) -> np.ndarray:
    """[L, H, L, H] scores C(sender L1 H1 -> receiver L2 H2), 0 unless L1 < L2."""
    import torch

    L, H = hw.n_layers, hw.n_heads
    X = torch.stack([torch.stack([sender_matrix(hw, l, h) for h in range(H)]) for l in range(L)])
    Y = torch.stack([torch.stack([receiver_matrix(hw, l, h, mode) for h in range(H)]) for l in range(L)])
    xn = torch.linalg.norm(X, dim=(-2, -1))
    yn = torch.linalg.norm(Y, dim=(-2, -1))
    out = np.zeros((L, H, L, H))
    for l1 in range(L):
        for l2 in range(l1 + 1, L):
            prod = torch.einsum("hij,gjk->hgik", X[l1], Y[l2])
            denom = xn[l1][:, None] * yn[l2][None, :]
            ratio = torch.linalg.norm(prod, dim=(-2, -1)) / denom
            out[l1, :, l2, :] = torch.where(denom > 0, ratio, torch.full_like(ratio, float("nan"))).numpy()
    return out


def _spectrum(M: Any, tol: float = 1e-10) -> tuple[np.ndarray, Any]:
    import torch

    s = torch.linalg.svdvals(M)
    keep = s > tol * max(float(s[0]), 1e-300)
    return s[keep].numpy(), s


def null_scores(X: Any, Y: Any, n_draws: int, seed: int, null_dim: int | None = None) -> np.ndarray:
    """n_draws samples of ||X R Y||_F / (||X|| ||Y||) for Haar-random orthogonal R
    on a `null_dim`-dimensional space holding X's outputs and Y's inputs."""
    import torch

    sx, _ = _spectrum(X)
    sy, _ = _spectrum(Y)
    d = X.shape[-1] if null_dim is None else null_dim
    rx, ry = len(sx), len(sy)
    if rx == 0 or ry == 0:
        return np.zeros(n_draws)
    g = torch.Generator().manual_seed(seed)
    k = max(rx, ry)
    G = torch.randn(n_draws, d, k, generator=g, dtype=torch.float64)
    Q, Rr = torch.linalg.qr(G)  # Q [n, d, k] Haar frame after the sign fix below
    Q = Q * torch.sign(torch.diagonal(Rr, dim1=-2, dim2=-1)).unsqueeze(-2)
    block = Q[:, :rx, :ry]  # distributed as V_x^T R U_y
    Sx = torch.as_tensor(sx)
    Sy = torch.as_tensor(sy)
    num = torch.linalg.norm(Sx[None, :, None] * block * Sy[None, None, :], dim=(-2, -1))
    return (num / (torch.linalg.norm(Sx) * torch.linalg.norm(Sy))).numpy()


class CompositionResult(Record):
    """Score, null and context numbers of one sender -> receiver.{q,k,v} pair (a record
    of the evidence: a composition claim's details extend it)."""

    sender: str
    receiver: str  # e.g. "L1H5.k"
    mode: str
    score: Num  # C; NaN (null in JSON) when a matrix is zero: no route
    p_value: float
    null_mean: float
    null_std: float
    null_q95: float
    null_q99: float
    n_draws: int
    ratio_to_isotropic: Num  # C * sqrt(null_dim)
    fraction_of_max: Num  # C / C_max
    c_max: float
    percentile: Num  # among all cross-layer pairs of this mode, in [0, 100]
    rank_sender: int
    rank_receiver: int
    processing: str
    null_dim: int


def draws_needed(n_tests: int, alpha: float) -> int:
    """Null draws that bring the BH floor n_tests / (1 + draws) down to alpha / 2."""
    return max(0, math.ceil(2 * n_tests / alpha) - 1)


def null_p_value(X: Any, Y: Any, c: float, n_draws: int, seed: int, extend_to: int = 0,
                 alpha: float = 0.0, null_dim: int | None = None) -> tuple[float, np.ndarray]:
    """(p, null samples): n_draws draws, extended to `extend_to` when p < alpha.
    An undefined score (a zero matrix: no route) gets p = 1."""
    null = null_scores(X, Y, n_draws, seed, null_dim)
    if math.isnan(c):
        return 1.0, null
    p = (1 + int(np.sum(null >= c - 1e-12))) / (1 + len(null))
    if p < alpha and extend_to > len(null):
        more = null_scores(X, Y, extend_to - len(null), derive_seed(seed, NULL_EXTENSION), null_dim)
        null = np.concatenate([null, more])
        p = (1 + int(np.sum(null >= c - 1e-12))) / (1 + len(null))
    return p, null


def composition(hw: HeadWeights, sender: Head, receiver: HeadInput, n_draws: int, seed: int,
                all_mode_scores: np.ndarray | None = None, extend_to: int = 0,
                alpha: float = 0.0) -> CompositionResult:
    """Score, null and context numbers for one sender -> receiver.{q,k,v} pair."""
    import torch

    mode = receiver.which
    X = sender_matrix(hw, sender.layer, sender.head)
    Y = receiver_matrix(hw, receiver.head.layer, receiver.head.head, mode)
    c = composition_score(X, Y)
    p, null = null_p_value(X, Y, c, n_draws, seed, extend_to, alpha, hw.null_dim)
    sx, sx_all = _spectrum(X)
    sy, sy_all = _spectrum(Y)
    nx, ny = float(torch.linalg.norm(X)), float(torch.linalg.norm(Y))
    c_max = min(float(sx_all[0]) / nx, float(sy_all[0]) / ny) if nx > 0 and ny > 0 else 0.0
    if all_mode_scores is None:
        all_mode_scores = all_scores(hw, mode)
    L = hw.n_layers
    pool = np.concatenate([all_mode_scores[l1, :, l2, :].ravel() for l1 in range(L) for l2 in range(l1 + 1, L)])
    pool = pool[~np.isnan(pool)]
    return CompositionResult(
        sender=str(sender), receiver=str(receiver), mode=mode,
        score=c, p_value=p, null_mean=float(null.mean()), null_std=float(null.std()),
        null_q95=float(np.quantile(null, 0.95)), null_q99=float(np.quantile(null, 0.99)), n_draws=len(null),
        ratio_to_isotropic=c * math.sqrt(hw.null_dim), fraction_of_max=c / c_max if c_max > 0 else float("nan"),
        c_max=c_max, percentile=float(100.0 * np.mean(pool <= c + 1e-15)) if not math.isnan(c) else float("nan"),
        rank_sender=len(sx), rank_receiver=len(sy), processing=hw.processing, null_dim=hw.null_dim)


@dataclass(frozen=True)
class CopyingScore:
    value: float | None  # None: undefined (the OV circuit never reaches the unembedding)
    sum_abs_eigenvalues: float
    n_eigenvalues: int
    processing: str


def copying_score(hw: HeadWeights, layer: int, head: int, tol: float = 1e-12) -> CopyingScore:
    """Re(sum lambda) / sum |lambda| of W_E OV W_U via the d_head x d_head form."""
    import torch

    M = hw.W_O[layer, head] @ hw.W_U @ hw.W_E @ hw.W_V[layer, head]
    lam = torch.linalg.eigvals(M)
    total = float(lam.abs().sum())
    scale = float(torch.linalg.norm(hw.W_E) * torch.linalg.norm(hw.W_U)
                  * torch.linalg.norm(hw.W_V[layer, head] @ hw.W_O[layer, head]))
    defined = scale > 0.0 and total > tol * scale
    return CopyingScore(float(lam.sum().real) / total if defined else None, total, int(lam.numel()),
                        hw.processing)
