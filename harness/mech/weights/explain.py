"""What flows through a composition route: the singular directions of the product of a
sender's OV and a receiver's input matrix, how C^2 splits over them, the principal
angles between what the sender writes and what the receiver reads, token readouts,
and the same spectrum statistics under the rotation null.

Row-vector convention (a residual vector x is 1 x d): the sender writes x X, with
X = OV_A = W_V W_O; the receiver reads z Y, with Y = W_Q W_K^T (.q), W_K W_Q^T (.k),
W_V W_O (.v).  The route is the product

    P = X Y          (Y^T X^T, i.e. "Y X", in the column convention)

and C = ||P||_F / (||X||_F ||Y||_F) (mech.weights.scores).

**Singular directions, in factored form** (mech.weights.factored): X = Q_v core_X and
Y = core_Y Q_b^T, so P = Q_v M Q_b^T with the r x r matrix M = core_X core_Y
(r = d_head).  With M = U S V^T, P = (Q_v U) S (Q_b V)^T: P's nonzero singular values
sigma_i are M's, its left singular vectors a_i = Q_v u_i (the sender-input direction:
what the sender reads) and its right ones b_i = Q_b v_i (what the receiver produces:
the query-side direction the keys match for .k, the key side for .q, the written
direction for .v).  What the sender writes when it reads a_i is
m_i = a_i^T X / ||a_i^T X||.  Nothing d x d is formed.

**C^2 over the directions**:

    C^2 = sum_i sigma_i^2 / (||X||_F^2 ||Y||_F^2),   share_i = sigma_i^2 / sum_j sigma_j^2.

**Principal angles.** W = row space of X (what the sender can write), R = column
space of Y (what the receiver reads: z Y depends on z only through its projection on
R).  With thin SVDs X = U_x S_x V_x^T and Y = U_y S_y V_y^T,

    P = U_x (S_x G S_y) V_y^T,   G = V_x^T U_y,

so P's singular values are those of S_x G S_y, the singular values of G are
cos theta_j (theta_j the principal angles between W and R), and

    C^2 = ||S_x G S_y||_F^2 / (||s_x||^2 ||s_y||^2) = sum_jk p_j G_jk^2 q_k,

p = s_x^2 / ||s_x||^2, q = s_y^2 / ||s_y||^2.  Flat spectra of rank r give
C^2 = ||G||_F^2 / r^2 = sum_j cos^2 theta_j / r^2, and always
C <= cos theta_1 * C_max, C_max = min(s1(X)/||X||_F, s1(Y)/||Y||_F).  Angles are
computed as scipy.linalg.subspace_angles does: arccos of the cosines, arcsin of the
sines (singular values of the part of one basis outside the other) where
cos^2 >= 1/2, so small angles are accurate too.

**Null.** The rotation null of the composition score (mech.weights.null) keeps both
spectra and draws their relative orientation: G becomes F, the top-left r x r block of
a Haar matrix of dimension null_dim, and M becomes S_x F S_y.  The same statistics
(shares, normalised singular values sigma_i / (||X|| ||Y||), principal angles: the
arccos of the singular values of F's top-left rank(X) x rank(Y) block) are computed
on `draws` draws of F (Stream.EXPLAIN_NULL; chunks of null.chunk_draws(r), the same Bartlett
sampler), each summarised by its mean and central 95% interval.  Direction 1's
p = (1 + #{null share_1 >= share_1}) / (1 + draws); n_aligned counts the angles below
the null interval of the angle of the same rank.

**Readouts** (the direct path: what a direction means for the embeddings, ignoring
earlier layers), with the embeddings processed as the scores are (mech.weights.scores:
centred when LayerNorm is folded, which is what a LayerNorm reader sees; a_i is
orthogonal to the all-ones direction then, so centring does not change a load):

* sender_reads: the tokens t with the largest cos(W_E[t], a_i);
* sender_writes: the largest cos(W_E[t] X, m_i) (what each token makes the sender write);
* receiver_reads (.q/.k): the largest cos(W_E[t], b_i);
* token_match (.q/.k): Pearson's correlation over t of cos(W_E[t], a_i) and cos(W_E[t], b_i)
  (both left out for a rotary model's one-sided q/k form, Y = W_Q or W_K: its b_i are
  directions in the head's query or key space, which meet the other side only through the
  position-dependent rotation);
* promotes (.v): the largest logits b_i . W_U[:, t] (W_U with ln_final folded);
* positional_share(u) = mean_p (W_pos[p] . u)^2 / (mean_p (W_pos[p] . u)^2 + mean_t (W_E[t] . u)^2):
  the share of the second moment of x . u that comes from the position, x = W_E[t] + W_pos[p]
  with token and position drawn uniformly (None without learned positions).

Cosines are scale-free, as a LayerNorm reader is.  Only tokens with a positive load are
listed.  The vocabulary is read once per route, a block of tokens at a time
(HeadWeights.vocab_products: W_E [a | b | W_V] and b^T W_U), so W_E X is never formed and
no [vocabulary, d_head] array is held: only each token's numbers for the top directions.
The sign of each (a_i, b_i, m_i) is fixed so that
the token with the largest |cos(W_E[t], a_i)| loads positively.  Everything depends on X,
Y and the embeddings only, so changing a head's internal basis (W_V -> W_V A,
W_O -> A^-1 W_O; W_Q -> W_Q B, W_K -> W_K B^-T) changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ... import memory
from ...evidence.details import Explained, ExplainedDirection, TokenLoad
from ...progress import progress
from ...spec.names import Head, HeadInput
from ...streams import Stream, derive_seed
from ...threads import single_threaded
from .factored import receiver_factors, spectrum_rank
from .null import CHUNK, TOL, chunk_draws, haar_blocks
from .scores import HeadWeights

NULL_STEP = 64**3 * 1000  # r^3 per step of the null spectra (1,000 draws at d_head 64, 15 at d_head 256)

RANK_TOL = 1e-10  # singular values below this times the largest (for P: times ||X|| ||Y||) count as zero
TIE_TOL = 1e-6  # singular values within this times the largest are equal (multiplicity)
LOAD_TOL = 1e-9  # readouts list only tokens that load more than this
TOP = 3  # directions a report shows
TOKENS = 5  # tokens per readout
LEVEL = 0.95  # the null intervals


@dataclass(frozen=True)
class NullSpectrum:
    """The statistics of `draws` null draws: shares [N, r] and normalised singular values
    [N, r] (largest first), principal angles [N, k] in radians (smallest first)."""

    shares: np.ndarray
    spectrum: np.ndarray
    angles: np.ndarray

    @property
    def draws(self) -> int:
        return int(self.shares.shape[0])


@dataclass(frozen=True)
class Explanation:
    """One route's decomposition (module docstring); vectors are d_model columns, signs fixed."""

    sender: Head
    receiver: HeadInput
    norm_x: float  # ||X||_F
    norm_y: float  # ||Y||_F
    sigma: np.ndarray  # [r] singular values of P, largest first (zeros past its rank)
    left: np.ndarray  # [d, r] a_i: what the sender reads
    right: np.ndarray  # [d, r] b_i: what the receiver produces ([d_head, r] for a rotary model's q/k)
    writes: np.ndarray  # [d, r] m_i: what the sender writes reading a_i (0 where a_i X = 0)
    spectrum_x: np.ndarray  # [r] singular values of X
    spectrum_y: np.ndarray  # [r] singular values of Y
    angles: np.ndarray  # [min(rank X, rank Y)] principal angles (radians), smallest first
    null: NullSpectrum
    readouts: list[dict[str, Any]]  # of the top directions (Explainer.explain's `top`), ExplainedDirection keys

    @property
    def score(self) -> float:
        """C; NaN when X or Y is zero (no route)."""
        denom = self.norm_x * self.norm_y
        return float(np.linalg.norm(self.sigma) / denom) if denom > 0 else float("nan")

    @property
    def rank(self) -> int:
        """Singular values of P above RANK_TOL ||X||_F ||Y||_F (which bounds them all)."""
        return _rank_of(self.sigma, self.norm_x * self.norm_y)

    @property
    def shares(self) -> np.ndarray:
        """sigma_i^2 / sum sigma^2 (NaN when P = 0)."""
        total = float(np.sum(self.sigma ** 2))
        return self.sigma ** 2 / total if self.rank > 0 else np.full_like(self.sigma, np.nan)

    @property
    def normalised(self) -> np.ndarray:
        """sigma_i / (||X|| ||Y||): their squares sum to C^2."""
        denom = self.norm_x * self.norm_y
        return self.sigma / denom if denom > 0 else np.full_like(self.sigma, np.nan)

    def multiplicity(self, i: int) -> int:
        """How many singular values equal sigma_i (within TIE_TOL of the largest)."""
        return int(np.sum(np.abs(self.sigma - self.sigma[i]) <= TIE_TOL * max(float(self.sigma[0]), 1e-300)))

    @property
    def top_share_p(self) -> float:
        """One-sided p of direction 1's share under the null; NaN when P = 0."""
        if self.rank == 0:
            return float("nan")
        s1 = float(self.shares[0])
        return (1 + int(np.sum(self.null.shares[:, 0] >= s1 - TOL))) / (1 + self.null.draws)


def _rank_of(sigma: np.ndarray, bound: float) -> int:
    return int(np.sum(sigma > RANK_TOL * bound)) if bound > 0 else 0


def principal_angles(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Principal angles (radians, smallest first) between the column spaces of the
    orthonormal bases A [d, p] and B [d, q]: min(p, q) of them."""
    if A.shape[1] == 0 or B.shape[1] == 0:
        return np.zeros(0)
    cos = np.clip(np.linalg.svd(A.T @ B, compute_uv=False), 0.0, 1.0)  # largest first
    rest = B - A @ (A.T @ B) if A.shape[1] >= B.shape[1] else A - B @ (B.T @ A)
    sin = np.clip(np.linalg.svd(rest, compute_uv=False), 0.0, 1.0)[::-1]  # smallest first
    k = min(A.shape[1], B.shape[1])
    cos, sin = cos[:k], sin[:k]
    return cast(np.ndarray, np.where(cos ** 2 >= 0.5, np.arcsin(sin), np.arccos(cos)))


@dataclass
class Explainer:
    """Explanations of one model's routes, with the null blocks computed once.  `decode`:
    token id -> text (the model's tokenizer), or None."""

    hw: HeadWeights
    seed: int
    decode: Callable[[int], str] | None = None
    _blocks: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    _done: dict[tuple[Any, ...], Explanation] = field(default_factory=dict)

    def without_weights(self) -> dict[str, Any]:
        """What this explainer made that does not hold the weights (null blocks, explanations):
        `Explainer(hw, seed, decode, **kept)` on the same weights read again starts from them."""
        return {"_blocks": self._blocks, "_done": self._done}

    def blocks(self, r: int, n: int, draws: int) -> Any:
        """The first `draws` null blocks F [draws, r, r] (chunk c seeded
        derive_seed(seed, Stream.EXPLAIN_NULL, r, n, c))."""
        import torch

        return torch.cat(list(self.block_chunks(r, n, draws)))

    def block_chunks(self, r: int, n: int, draws: int) -> Iterator[Any]:
        """blocks(r, n, draws) chunk by chunk (block_chunk)."""
        for c in range(math.ceil(draws / chunk_draws(r))):
            yield self.block_chunk(r, n, c, draws)

    def block_chunk(self, r: int, n: int, c: int, draws: int) -> Any:
        """Chunk c of the first `draws` null blocks (null.chunk_draws(r) draws, the last cut to `draws`);
        kept for the next route where a chunk is CHUNK draws, made afresh where the blocks are too
        large to keep (a 256-dimensional head's 1,000 would hold 512 MiB)."""
        size = chunk_draws(r)
        kept = self._blocks.setdefault((r, n), []) if size == CHUNK else []
        while size == CHUNK and len(kept) <= c:  # kept chunks are made in order
            kept.append(haar_blocks(r, n, size, derive_seed(self.seed, Stream.EXPLAIN_NULL, r, n, len(kept))))
        chunk = kept[c] if size == CHUNK else haar_blocks(r, n, size, derive_seed(self.seed, Stream.EXPLAIN_NULL,
                                                                                   r, n, c))
        return chunk[:draws - c * size]

    def explain(self, sender: Head, receiver: HeadInput, draws: int = 1000, top: int = TOP,
                n_tokens: int = TOKENS) -> Explanation:
        """The decomposition of sender -> receiver (module docstring), with `draws` null draws
        and the readouts of the top `top` directions (`n_tokens` tokens each)."""
        key = (sender, receiver, draws, top, n_tokens)
        if key not in self._done:
            self._done[key] = self._explain(sender, receiver, draws, top, n_tokens)
            memory.release()  # its vocabulary-wide float64 temporaries (several [vocab, d_head] arrays)
        return self._done[key]

    def _explain(self, sender: Head, receiver: HeadInput, draws: int, top: int, n_tokens: int) -> Explanation:
        import torch

        hw = self.hw
        W_V, W_O = hw.W_V[sender.layer, sender.head], hw.W_O[sender.layer, sender.head]
        with single_threaded():
            Q_v, R_v = torch.linalg.qr(W_V)
            core_x = R_v @ W_O  # [r, d]: X = Q_v core_x
            a_all, bT_all = receiver_factors(hw, receiver.which)
            a, bT = a_all[receiver.head.layer, receiver.head.head], bT_all[receiver.head.layer, receiver.head.head]
            Q_b, R_b = torch.linalg.qr(bT)
            core_y = a @ R_b.mT  # [d, r]: Y = core_y Q_b^T
            U, S, Vh = torch.linalg.svd(core_x @ core_y)
            _, sx, Vxh = torch.linalg.svd(core_x, full_matrices=False)
            Uy, sy, _ = torch.linalg.svd(core_y, full_matrices=False)
        left, right = Q_v @ U, Q_b @ Vh.mT
        writes = (U.mT @ core_x).mT  # [d, r]: column i = a_i^T X
        norms = torch.linalg.norm(writes, dim=0)
        writes = torch.where(norms > RANK_TOL * max(float(norms.max()), 1e-300), writes / norms.clamp_min(1e-300), 0.0)
        sx_, sy_, sigma = sx.numpy(), sy.numpy(), S.numpy()
        k = min(top, _rank_of(sigma, float(np.linalg.norm(sx_) * np.linalg.norm(sy_))))
        # one pass over the vocabulary, a block at a time: W_E [a_1..a_r | b_1..b_k | W_V], ||W_E[t]||,
        # b^T W_U (.v); what the readouts need of it kept per token for the top k directions only
        value = receiver.which == "v"
        # a rotary model's one-sided q/k form has no residual direction on the receiver's far side
        two_sided = value or not hw.rotary
        far = right[:, :k] if two_sided else left.new_zeros(left.shape[0], 0)
        v = _vocab_pass(hw, torch.cat([left, far, W_V], dim=1), right[:, :k] if value else None, left.shape[1], k,
                        far.shape[1], W_O.numpy(), writes.numpy())
        memory.release()  # the pass's freed block temporaries back to the system
        sign = np.where(v.extreme < 0, -1.0, 1.0)  # the token of largest |cos(W_E[t], a_i)| loads positively
        left_, right_, writes_ = left.numpy() * sign, right.numpy() * sign, writes.numpy() * sign
        readouts = []
        for i in range(k):
            out: dict[str, Any] = {
                "positional_share": self._positional(left_[:, i], v.squares[i]),
                "sender_reads": self._tokens(v.cos[:, i] * sign[i], n_tokens),
                "sender_writes": self._tokens(np.divide(v.along[:, i] * sign[i], v.write_norms,
                                                        out=np.zeros(len(v.write_norms)), where=v.write_norms > 0),
                                              n_tokens)}
            if value:
                out["promotes"] = self._tokens(v.logits[i] * sign[i], n_tokens)
            elif two_sided:
                out["receiver_reads"] = self._tokens(v.cos_far[:, i] * sign[i], n_tokens)
                out["receiver_positional_share"] = self._positional(right_[:, i], v.squares_far[i])
                out["token_match"] = _correlation(v.cos[:, i], v.cos_far[:, i])
            readouts.append(out)
        kx, ky = spectrum_rank(sx_, RANK_TOL), spectrum_rank(sy_, RANK_TOL)
        angles = principal_angles(Vxh.mT.numpy()[:, :kx], Uy.numpy()[:, :ky])
        return Explanation(sender, receiver, float(np.linalg.norm(sx_)), float(np.linalg.norm(sy_)), sigma,
                           left_, right_, writes_, sx_, sy_, angles, self._null(sx, sy, kx, ky, draws), readouts)

    def _null(self, sx: Any, sy: Any, kx: int, ky: int, draws: int) -> NullSpectrum:
        """The statistics under the rotation null: M = S_x F S_y, angles from F[:kx, :ky]."""
        import torch

        r = int(sx.shape[0])
        step = max(1, NULL_STEP // max(1, r) ** 3)  # draws per step: a 256-dimensional head's take minutes in all
        parts: list[Any] = []
        with single_threaded():
            for c in progress(range(math.ceil(draws / chunk_draws(r))), f"null spectra of {draws} draws (d_head {r})",
                              quiet=True):
                F = self.block_chunk(r, self.hw.null_dim, c, draws)  # one chunk held at a time
                for lo in range(0, len(F), step):
                    part = F[lo:lo + step]
                    sv_ = torch.linalg.svdvals(sx[:, None] * part * sy[None, :]).numpy()
                    cos_ = (torch.linalg.svdvals(part[:, :kx, :ky]).clamp(0.0, 1.0).numpy() if kx and ky
                            else np.zeros((len(part), 0)))
                    parts.append((sv_, cos_))
                del F
                if chunk_draws(r) < CHUNK:  # chunks made afresh: their build's freed blocks back to the system
                    memory.release()
        sv, cos = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        total = np.sum(sv ** 2, axis=1, keepdims=True)
        shares = np.divide(sv ** 2, total, out=np.full_like(sv, np.nan), where=total > 0)
        denom = float(torch.linalg.norm(sx) * torch.linalg.norm(sy))
        spectrum = sv / denom if denom > 0 else np.full_like(sv, np.nan)
        return NullSpectrum(shares, spectrum, np.arccos(cos))

    # ---------------------------------------------------------------- readouts
    def _tokens(self, loads: np.ndarray, n: int) -> list[TokenLoad]:
        """The (at most) n tokens with the largest positive loads."""
        order = [t for t in np.argsort(-loads, kind="stable")[:n] if loads[t] > LOAD_TOL]
        return [TokenLoad(token=int(t), text=self.decode(int(t)) if self.decode else None, load=float(loads[t]))
                for t in order]

    def _positional(self, u: np.ndarray, token_square: float) -> float | None:
        """mean_p (W_pos[p] . u)^2 / (that + mean_t (W_E[t] . u)^2), `token_square` the latter;
        None without W_pos or when both are 0."""
        W_pos = self.hw.W_pos
        if W_pos is None:
            return None
        pos = float(np.mean((W_pos.numpy() @ u) ** 2))
        return pos / (pos + token_square) if pos + token_square > 0 else None

    # ---------------------------------------------------------------- the evidence record
    def record(self, sender: Head, receiver: HeadInput, draws: int = 1000, top: int = TOP,
               n_tokens: int = TOKENS) -> Explained:
        """The evidence record of one route: its spectrum and angles against the null and
        its top `top` directions with their readouts."""
        ex = self.explain(sender, receiver, draws, top, n_tokens)
        null = ex.null
        lo, hi = (1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2

        def band(x: np.ndarray, scale: float = 1.0) -> list[list[float | None]]:
            if x.shape[1] == 0:
                return []
            q = np.quantile(x, [lo, hi], axis=0) * scale
            return [[_num(q[0, j]), _num(q[1, j])] for j in range(x.shape[1])]

        directions = [ExplainedDirection(
            index=i + 1, sigma=float(ex.sigma[i]), share=float(ex.shares[i]),
            null_share_mean=float(np.mean(null.shares[:, i])), null_share_ci=band(null.shares[:, i:i + 1])[0],
            multiplicity=ex.multiplicity(i), **readout) for i, readout in enumerate(ex.readouts)]
        degrees = 180.0 / math.pi
        null_angles = band(null.angles, degrees)
        angles = [float(x) * degrees for x in ex.angles]
        return Explained(score=_num(ex.score), rank=ex.rank, n_draws=null.draws,
                         spectrum=[float(x) for x in np.nan_to_num(ex.normalised)],
                         null_spectrum=band(null.spectrum), angles=angles, null_angles=null_angles,
                         n_aligned=sum(1 for x, b in zip(angles, null_angles) if b[0] is not None and x < b[0]),
                         top_share_p=_num(ex.top_share_p), directions=directions, n_layers=int(self.hw.n_layers))


@dataclass
class _Vocab:
    """What the readouts read of the vocabulary (one pass, _vocab_pass), [vocab] per token and direction
    for the top k directions only: cos(W_E[t], a_i), cos(W_E[t], b_i) (cos_far), (W_E[t] X) . m_i
    (along; m_i unsigned), ||W_E[t] X|| (write_norms), b_i . W_U[:, t] (logits, .v); per direction of
    the r, the cos of largest |cos| (extreme: its sign fixes the direction's); mean_t (W_E[t] . a_i)^2
    and (W_E[t] . b_i)^2 (squares, squares_far)."""

    cos: np.ndarray
    cos_far: np.ndarray
    along: np.ndarray
    write_norms: np.ndarray
    logits: np.ndarray
    extreme: np.ndarray
    squares: np.ndarray
    squares_far: np.ndarray


def _vocab_pass(hw: HeadWeights, left: Any, right: Any, r: int, k: int, k_far: int, W_O: np.ndarray,
                writes: np.ndarray) -> _Vocab:
    """One pass over the vocabulary in blocks (HeadWeights.vocab_products): `left` [d, r + k_far + r] =
    [a | b_1..b_k_far | W_V], `right` b_1..b_k (.v: the logits) or None; nothing vocabulary-wide is held
    but the [vocab, k] columns of _Vocab (a 262k vocabulary: the full [vocab, 2r + k] would be GBs).
    Those columns are allocated once and filled block by block: small arrays kept from every block,
    between the blocks' large temporaries, would pin the C heap's freed blocks (0.8 to 1.2 GiB held
    at 262k tokens and d_head 256)."""
    V = hw.vocab_span
    cos, cos_far, along, write_norms = np.zeros((V, k)), np.zeros((V, k_far)), np.zeros((V, k)), np.zeros(V)
    logits = np.zeros((right.shape[1], V)) if right is not None else np.zeros((0, 0))
    best = np.zeros(r)
    extreme = np.zeros(r)
    squares, squares_far, n = np.zeros(k), np.zeros(k_far), 0
    WW, Mw = W_O @ W_O.T, W_O @ writes[:, :k]
    for dots_t, norms_t, logits_t in hw.vocab_products(left, right):
        dots, norms = dots_t.numpy(), norms_t.numpy()
        a, b = n, n + len(dots)
        c = np.divide(dots, norms[:, None], out=np.zeros_like(dots), where=norms[:, None] > 0)
        rows = np.argmax(np.abs(c[:, :r]), axis=0)
        top = c[rows, np.arange(r)]
        better = np.abs(top) > best
        best, extreme = np.where(better, np.abs(top), best), np.where(better, top, extreme)
        cos[a:b], cos_far[a:b] = c[:, :k], c[:, r:r + k_far]
        squares += np.sum(dots[:, :k] ** 2, axis=0)
        squares_far += np.sum(dots[:, r:r + k_far] ** 2, axis=0)
        EV = dots[:, r + k_far:]  # W_E W_V [block, r]: W_E X = EV W_O, never formed
        along[a:b] = EV @ Mw
        write_norms[a:b] = np.sqrt(np.clip(np.sum((EV @ WW) * EV, axis=1), 0.0, None))
        if logits_t is not None:
            logits[:, a:b] = logits_t.numpy()
        n = b
    return _Vocab(cos[:n], cos_far[:n], along[:n], write_norms[:n], logits[:, :n] if right is not None else logits,
                  extreme, squares / max(n, 1), squares_far / max(n, 1))


def _correlation(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's correlation of x and y; None when either is constant."""
    x, y = x - x.mean(), y - y.mean()
    denom = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(x @ y) / denom if denom > 0 else None


def _num(x: float) -> float | None:
    return None if x != x else float(x)
