"""Composition scores in factored form: nothing d_model x d_model is ever formed.

A sender's OV and a receiver's input matrix are products of thin factors
(row-vector convention, d = d_model, r = d_head):

    X = W_V W_O                       (sender; d x r times r x d)
    Y = a b:  q: W_Q W_K^T,  k: W_K W_Q^T,  v: W_V W_O   (receiver)

With thin QR factorisations W_V = Q_v R_v and b^T = Q_b R_b (Q with orthonormal
columns), the r x d and d x r cores

    core_X = R_v W_O,   core_Y = a R_b^T

have X = Q_v core_X and Y = core_Y Q_b^T, so ||X||_F = ||core_X||_F,
||Y||_F = ||core_Y||_F, the singular values agree, and

    ||X Y||_F = ||core_X core_Y||_F        (an r x r product)

    C = ||core_X core_Y||_F / (||core_X||_F ||core_Y||_F).

All cross-layer pairs of a mode are one matrix product per sender layer:
[H r, d] x [d, (receivers) r], L^2 H^2 r^2 d / 2 multiply-adds for the grid, in float64 on
the model's device (the CPU for MPS, which has no float64: model.devices.float64_home), the
receivers in chunks of layers sized by the working memory (memory.working).  `Composition`
computes the cores, spectra and score grids of one `HeadWeights` once, and holds the shared
rotation null (mech.weights.null), so claims, the weights-vs-use table, the figures and
`harness weights` / `harness scan` read the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ... import memory
from ...model.bridge import Bridge
from ...model.devices import float64_home, of
from ...progress import progress
from ...spec.names import Head, HeadInput
from ...threads import single_threaded
from . import scores
from .null import SharedNull, grid_of, mc_or_bound_p, mc_p, normalised_squares, tail_bound
from .scores import CompositionResult, HeadWeights

GRID_MEMORY = 64 * 2**20  # bytes a score grid's chunk of receiver layers may hold, outside a budget


def _r_factor(A: Any) -> Any:
    """R of the thin QR of A [..., d, r] (so A = Q R, Q with orthonormal columns): [..., r, r].  A
    stack of layers [L, H, d, r] a layer at a time: the factorisation works on a copy of its input
    (0.09 GiB for all of Gemma 3 270M's heads at once)."""
    import torch

    with single_threaded():
        if A.dim() > 3:
            return torch.stack([torch.linalg.qr(a, mode="r").R for a in A])
        return torch.linalg.qr(A, mode="r").R


def sender_cores(hw: HeadWeights) -> Any:
    """core_X = R_v W_O per head: [L, H, r, d]."""
    return _r_factor(hw.W_V) @ hw.W_O


def receiver_factors(hw: HeadWeights, mode: str) -> tuple[Any, Any]:
    """(a, b^T) with Y = a b for input `mode`, per head: q: (W_Q, W_K); k: (W_K, W_Q);
    v: (W_V, W_O^T); each [L, H, d, r].  Rotary models (mech.weights.scores): q: (W_Q, I), k: (W_K, I)
    with I the d_head x d_head identity, so Y = W_Q (W_K): the offset-free one-sided form."""
    if mode in ("q", "k") and hw.rotary:
        import torch

        a = hw.W_Q if mode == "q" else hw.W_K
        L, H, _, r = a.shape
        return a, torch.eye(r, dtype=a.dtype).expand(L, H, r, r)
    if mode == "q":
        return hw.W_Q, hw.W_K
    if mode == "k":
        return hw.W_K, hw.W_Q
    if mode == "v":
        return hw.W_V, hw.W_O.mT
    raise ValueError(f"unknown receiver input {mode!r}")


def receiver_cores(hw: HeadWeights, mode: str) -> Any:
    """core_Y = a R_b^T per head for input `mode`: [L, H, d, r].  A rotary model's q and k: b^T is the
    identity, whose R is the identity, so core_Y = a itself (the weights, not a copy)."""
    a, bT = receiver_factors(hw, mode)
    if mode in ("q", "k") and hw.rotary:
        return a
    return a @ _r_factor(bT).mT


@dataclass
class Composition:
    """Composition scores and their rotation null on one model's head weights,
    each piece computed on first use and kept (see the module docstring)."""

    hw: HeadWeights
    seed: int
    device: Any = None  # where the score grids' products run (float64_home of it); None: the CPU
    _sender: Any = None
    _receiver: dict[str, Any] = field(default_factory=dict)
    _spectra: dict[str, Any] = field(default_factory=dict)
    _scores: dict[str, np.ndarray] = field(default_factory=dict)
    _null: SharedNull | None = None
    _results: dict[tuple[Any, ...], CompositionResult] = field(default_factory=dict)
    _pools: dict[str, np.ndarray] = field(default_factory=dict)
    _peer_ratios: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def read(cls, bridge: Bridge, processing: str, seed: int) -> Composition:
        """The composition of `bridge`'s head weights (scores.head_weights with `processing`), its
        score grids on the bridge's device."""
        return cls(scores.head_weights(bridge, processing), seed, of(bridge))

    def without_weights(self) -> dict[str, Any]:
        """What this composition computed that does not hold the weights (spectra, score grids, the
        shared null, results, pools): `Composition(hw, seed, **kept)` on the same weights read again
        starts from them, and makes only the cores again (the memory-heavy part), if it needs them."""
        return {"_spectra": self._spectra, "_scores": self._scores, "_null": self._null, "_results": self._results,
                "_pools": self._pools, "_peer_ratios": self._peer_ratios}

    # -------------------------------------------------------------- cores, spectra, scores
    def sender_core(self) -> Any:
        if self._sender is None:
            self._sender = sender_cores(self.hw)
        return self._sender

    def receiver_core(self, mode: str) -> Any:
        if mode not in self._receiver:
            self._receiver[mode] = receiver_cores(self.hw, mode)
        return self._receiver[mode]

    def spectrum(self, side: str) -> Any:
        """Singular values [L, H, r] of every head's X (`side` "x") or Y of mode `side`."""
        import torch

        if side not in self._spectra:  # of the r x r R factor: the same singular values, a small SVD
            thin = self.sender_core().mT if side == "x" else self.receiver_core(side)
            R = _r_factor(thin)
            with single_threaded():
                self._spectra[side] = torch.linalg.svdvals(R)
        return self._spectra[side]

    def scores(self, mode: str) -> np.ndarray:
        """[L, H, L, H] scores C(sender l1 h1 -> receiver l2 h2 .mode), 0 unless l1 < l2;
        NaN where a matrix is zero (no route).  Receiver layers in chunks whose cores, their
        [d, chunk] right factor and one sender layer's [H r, chunk] product fit the working
        memory (8 (2 d + H r) H r bytes a receiver layer; at least one layer a chunk)."""
        import torch

        if mode in self._scores:
            return self._scores[mode]
        X, Y = self.sender_core(), self.receiver_core(mode)
        L, H, r, d = X.shape
        xn, yn = torch.linalg.norm(X, dim=(-2, -1)), torch.linalg.norm(Y, dim=(-2, -1))
        out = np.zeros((L, H, L, H))
        home = float64_home(self.device)
        step = max(1, memory.working(GRID_MEMORY) // (8 * (2 * d + H * r) * H * r))
        for lo in progress(range(1, L, step), f"{mode.upper()}-composition scores, receiver layers in chunks of "
                           f"{step}", quiet=True):
            hi = min(L, lo + step)
            right = Y[lo:hi].to(home).permute(2, 0, 1, 3).reshape(d, -1)  # [d, (hi - lo) H r]
            for l1 in range(hi - 1):
                first = max(lo, l1 + 1)  # the chunk's receiver layers after the sender's
                prod = X[l1].to(home).reshape(H * r, d) @ right[:, (first - lo) * H * r:]
                num = torch.linalg.norm(prod.reshape(H, r, hi - first, H, r), dim=(1, 4)).cpu()  # [H, L', H]
                denom = xn[l1][:, None, None] * yn[first:hi][None]
                ratio = torch.where(denom > 0, num / torch.where(denom > 0, denom, 1.0), float("nan"))
                out[l1, :, first:hi, :] = ratio.numpy()
            del right
        self._scores[mode] = out
        return out

    def score(self, sender: Head, receiver: HeadInput) -> float:
        return float(self.scores(receiver.which)[sender.layer, sender.head, receiver.head.layer, receiver.head.head])

    def peers(self, senders: tuple[Head, ...], receiver: HeadInput) -> np.ndarray:
        """The scores a route is compared with (mech.weights.scores.stands_out): every other earlier head's
        into the same receiver input (NaN, no route, left out)."""
        g = self.scores(receiver.which)
        l2, h2 = receiver.head.layer, receiver.head.head
        column = g[:l2, :, l2, h2].copy()
        for s in senders:
            column[s.layer, s.head] = np.nan
        out = column.ravel()
        return cast(np.ndarray, out[~np.isnan(out)])

    def peer_numbers(self, senders: tuple[Head, ...], receiver: HeadInput, c: float) -> dict[str, Any]:
        """The peer fields of a CompositionResult: the peers' median, C over it, C's rank among the
        route and its peers (1: the highest) and how many peers there are."""
        p = self.peers(senders, receiver)
        if len(p) < scores.MIN_PEERS or math.isnan(c):
            return {"peer_median": None, "peer_ratio": None, "peer_rank": None, "n_peers": int(len(p))}
        median = float(np.median(p))
        return {"peer_median": median, "peer_ratio": c / median if median > 0 else float("inf"),
                "peer_rank": int(np.sum(p > c)) + 1, "n_peers": int(len(p))}

    def peer_ratios(self, mode: str) -> np.ndarray:
        """[L, H, L, H] C / median(peers) of every cross-layer pair of input `mode` (NaN elsewhere, and
        with fewer than MIN_PEERS peers); made once per mode.  Per receiver input, its column of
        senders is sorted once and each sender's median of the others read off it (peer_numbers'
        median, without a sort per pair)."""
        if mode not in self._peer_ratios:
            L, H = self.hw.n_layers, self.hw.n_heads
            g = self.scores(mode)
            out = np.full((L, H, L, H), np.nan)
            for l2 in range(1, L):
                for h2 in range(H):
                    out[:l2, :, l2, h2] = _leave_one_out_ratio(g[:l2, :, l2, h2].ravel()).reshape(l2, H)
            self._peer_ratios[mode] = out
        return self._peer_ratios[mode]

    # -------------------------------------------------------------- the shared null
    @property
    def null(self) -> SharedNull:
        if self._null is None:
            self._null = SharedNull(int(self.hw.W_V.shape[-1]), self.hw.null_dim, self.seed)
        return self._null

    def weights_of(self, side: str) -> Any:
        """a (or b): normalised squared spectra [L, H, r]."""
        return normalised_squares(self.spectrum(side))

    def null_layer_grids(self, mode: str, stop: int, start: int = 0) -> list[Any]:
        """Null draws start..stop-1 of every head of every sender layer l1 with every head input
        `mode` of the later layers: [H, (L - l1 - 1) H, stop - start] for l1 = 0 .. L - 2.  Each
        chunk of the shared draws is made once for all layers (a chunk the null does not keep is
        made again on every call: loop over the draws outside, the layers inside)."""
        import torch

        x, y = self.weights_of("x"), self.weights_of(mode)
        L, r = self.hw.n_layers, x.shape[-1]
        out: list[list[Any]] = [[] for _ in range(L - 1)]
        for _, _, P in self.null.blocks(stop, start):
            for l1 in range(L - 1):
                out[l1].append(grid_of(x[l1], y[l1 + 1:].reshape(-1, r), P))
        return [torch.cat(parts, dim=2) for parts in out]

    def p_values(self, mode: str, n_draws: int, extend_to: int = 0,
                 alpha: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """([L, H, L, H] p, [L, H, L, H] draws used) of every cross-layer pair of `mode`: the
        one-sided p from the first n_draws shared draws; pairs with p < alpha extended to
        `extend_to` draws; where no draw reached C the tail bound stands in if lower
        (rotation_null.mc_or_bound_p); 1 where the score is undefined; NaN off the pairs."""
        import torch

        L, H = self.hw.n_layers, self.hw.n_heads
        scores = self.scores(mode)
        exceed = np.zeros((L, H, L, H), dtype=np.int64)
        rows = [torch.from_numpy(scores[l1, :, l1 + 1:, :].reshape(H, -1) - 1e-12)[..., None] for l1 in range(L - 1)]
        label = f"{mode.upper()}-composition null, {n_draws} draws in chunks of {self.null.size}"
        for lo in progress(range(0, n_draws, self.null.size), label, quiet=True):  # each chunk made once
            grids = self.null_layer_grids(mode, min(n_draws, lo + self.null.size), lo)
            for l1, grid in enumerate(grids):
                exceed[l1, :, l1 + 1:, :] += (grid >= rows[l1]).sum(-1).reshape(H, L - l1 - 1, H).numpy()
        used = np.full((L, H, L, H), n_draws)
        pairs = [(l1, h1, l2, h2) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L) for h2 in range(H)]
        short = [q for q in pairs if not math.isnan(scores[q]) and (1 + exceed[q]) / (1 + n_draws) < alpha]
        if short and extend_to > n_draws:
            idx = tuple(np.array(short).T)
            a = self.weights_of("x")[idx[0], idx[1]]
            b = self.weights_of(mode)[idx[2], idx[3]]
            target = scores[idx][:, None]
            for start in progress(range(n_draws, extend_to, self.null.size),
                                  f"{mode.upper()}-composition null: {len(short)} pairs with p < {alpha:g} extended to "
                                  f"{extend_to} draws, chunks of {self.null.size}"):
                more = self.null.pair_samples(a, b, min(extend_to, start + self.null.size), start)
                exceed[idx] += (more >= target - 1e-12).sum(1)
            used[idx] = extend_to
        out = np.full((L, H, L, H), np.nan)
        for q in pairs:
            score = float(scores[q])
            if math.isnan(score):
                out[q] = 1.0
                continue
            bound = tail_bound(score, self.lipschitz(Head(q[0], q[1]), HeadInput(Head(q[2], q[3]), mode)),
                               self.hw.null_dim)
            out[q] = mc_or_bound_p(int(exceed[q]), int(used[q]), bound)
        return out, used

    def lipschitz(self, sender: Head, receiver: HeadInput) -> float:
        """s1(X) s1(Y) / (||X|| ||Y||): the null statistic's Lipschitz constant (rotation_null.tail_bound)."""
        sx = self.spectrum("x")[sender.layer, sender.head]
        sy = self.spectrum(receiver.which)[receiver.head.layer, receiver.head.head]
        nx, ny = float(sx.norm()), float(sy.norm())
        return float(sx[0]) * float(sy[0]) / (nx * ny) if nx > 0 and ny > 0 else 0.0

    # -------------------------------------------------------------- one pair, with its context
    def result(self, sender: Head, receiver: HeadInput, n_draws: int, extend_to: int = 0,
               alpha: float = 0.0) -> CompositionResult:
        """Score, null and context numbers of one pair: n_draws shared null draws, extended to
        `extend_to` when p < alpha (pairs at or above alpha cannot become significant)."""
        return self.results([(sender, receiver)], n_draws, extend_to, alpha)[0]

    def results(self, pairs: list[tuple[Head, HeadInput]], n_draws: int, extend_to: int = 0,
                alpha: float = 0.0) -> list[CompositionResult]:
        """`result` of every pair; the pairs that need more draws are extended together, each
        extra chunk of null draws made once for all of them."""
        todo = list(dict.fromkeys(q for q in pairs if (*q, n_draws, extend_to, alpha) not in self._results))
        base = dict(zip(todo, self.null.pair_samples(*self._pair_weights(todo), n_draws), strict=True)) if todo else {}
        short = [q for q in todo if mc_p(base[q], self.score(*q)) < alpha] if extend_to > n_draws else []
        exceed = {q: int(np.sum(base[q] >= self.score(*q) - 1e-12)) for q in short}
        if short:
            a, b = self._pair_weights(short)
            target = np.array([self.score(*q) for q in short])[:, None]
            for start in progress(range(n_draws, extend_to, self.null.size),
                                  f"composition null: {len(short)} pairs with p < {alpha:g} extended to "
                                  f"{extend_to} draws, chunks of {self.null.size}"):
                more = self.null.pair_samples(a, b, min(extend_to, start + self.null.size), start)
                for q, k in zip(short, (more >= target - 1e-12).sum(1), strict=True):
                    exceed[q] += int(k)
        for q in todo:
            used = extend_to if q in exceed else n_draws
            p = (1 + exceed[q]) / (1 + used) if q in exceed else mc_p(base[q], self.score(*q))
            self._results[(*q, n_draws, extend_to, alpha)] = self._record(q[0], q[1], base[q], p, used)
        return [self._results[(*q, n_draws, extend_to, alpha)] for q in pairs]

    def _pair_weights(self, pairs: list[tuple[Head, HeadInput]]) -> tuple[Any, Any]:
        """(a [K, r], b [K, r]): the sender's and the receiver's normalised squared spectra of each of
        the K (at least one) pairs, rows for SharedNull.pair_samples (every pair drawn together)."""
        import torch

        wx = self.weights_of("x")
        wy = {m: self.weights_of(m) for m in {r.which for _, r in pairs}}
        return (torch.stack([wx[s.layer, s.head] for s, _ in pairs]),
                torch.stack([wy[r.which][r.head.layer, r.head.head] for _, r in pairs]))

    def pool(self, mode: str) -> np.ndarray:
        """Every cross-layer pair's score of input `mode` (NaN left out), sorted: what a pair's
        percentile is taken among; made once per mode."""
        if mode not in self._pools:
            grid = self.scores(mode)
            L = self.hw.n_layers
            pool = np.concatenate([grid[l1, :, l2, :].ravel() for l1 in range(L) for l2 in range(l1 + 1, L)])
            self._pools[mode] = np.sort(pool[~np.isnan(pool)])
        return self._pools[mode]

    def _record(self, sender: Head, receiver: HeadInput, null: np.ndarray, p: float,
                used: int) -> CompositionResult:
        hw, mode = self.hw, receiver.which
        c = self.score(sender, receiver)
        sx = self.spectrum("x")[sender.layer, sender.head].numpy()
        sy = self.spectrum(mode)[receiver.head.layer, receiver.head.head].numpy()
        nx, ny = float(np.linalg.norm(sx)), float(np.linalg.norm(sy))
        c_max = min(sx[0] / nx, sy[0] / ny) if nx > 0 and ny > 0 else 0.0
        pool = self.pool(mode)
        return CompositionResult(
            sender=str(sender), receiver=str(receiver), mode=mode,
            score=c, p_value=p, null_mean=float(null.mean()), null_std=float(null.std()),
            null_q95=float(np.quantile(null, 0.95)), null_q99=float(np.quantile(null, 0.99)), n_draws=used,
            ratio_to_isotropic=c * math.sqrt(hw.null_dim), fraction_of_max=c / c_max if c_max > 0 else float("nan"),
            c_max=float(c_max),
            percentile=(float(100.0 * np.searchsorted(pool, c + 1e-15, side="right") / len(pool))
                        if not math.isnan(c) else float("nan")),
            rank_sender=spectrum_rank(sx), rank_receiver=spectrum_rank(sy), processing=hw.processing,
            null_dim=hw.null_dim, **self.peer_numbers((sender,), receiver, c))

    def group_result(self, senders: tuple[Head, ...], receiver: HeadInput, n_draws: int) -> CompositionResult:
        """The joint route of several sender heads into one receiver input, as their combined
        write: X' = [X_1; ...; X_k] stacked, so X'^T X' = sum_i X_i^T X_i and

            C'^2 = sum_i ||X_i Y||_F^2 / (sum_i ||X_i||_F^2 ||Y||_F^2)

        (a weighted mean of the members' C_i^2, weights ||X_i||_F^2).  The null is the same
        rotation null: X''s spectrum (rank <= k d_head, from the stacked cores, whose singular
        values are X''s) and Y's kept, their relative orientation Haar; its own shared draws
        (block size k d_head), `n_draws` of them.  `percentile` is undefined (NaN) for a group."""
        import torch

        X = torch.cat([self.sender_core()[s.layer, s.head] for s in senders])  # [k r, d]
        Y = self.receiver_core(receiver.which)[receiver.head.layer, receiver.head.head]  # [d, r]
        nx, ny = float(torch.linalg.norm(X)), float(torch.linalg.norm(Y))
        c = float(torch.linalg.norm(X @ Y)) / (nx * ny) if nx > 0 and ny > 0 else float("nan")
        with single_threaded():
            sx = torch.linalg.svdvals(X)
        sy = self.spectrum(receiver.which)[receiver.head.layer, receiver.head.head]
        k = min(X.shape[0], self.hw.null_dim)  # the write's rank is at most the null's dimension
        sx = sx[:k]  # (centred writes: the singular values past null_dim are zero)
        b = torch.zeros(k, dtype=sx.dtype)
        b[:min(k, sy.shape[0])] = normalised_squares(sy)[:k]
        null = SharedNull(k, self.hw.null_dim, self.seed).pair_samples(normalised_squares(sx)[None], b[None],
                                                                      n_draws)[0]
        sxn, syn = sx.numpy(), sy.numpy()
        c_max = min(sxn[0] / nx, syn[0] / ny) if nx > 0 and ny > 0 else 0.0
        return CompositionResult(
            sender=" + ".join(str(h) for h in senders), receiver=str(receiver), mode=receiver.which, score=c,
            p_value=mc_p(null, c) if not math.isnan(c) else 1.0, null_mean=float(null.mean()),
            null_std=float(null.std()), null_q95=float(np.quantile(null, 0.95)),
            null_q99=float(np.quantile(null, 0.99)), n_draws=n_draws,
            ratio_to_isotropic=c * math.sqrt(self.hw.null_dim),
            fraction_of_max=c / c_max if c_max > 0 else float("nan"),
            c_max=float(c_max), percentile=float("nan"), rank_sender=spectrum_rank(sxn),
            rank_receiver=spectrum_rank(syn),
            processing=self.hw.processing, null_dim=self.hw.null_dim, **self.peer_numbers(senders, receiver, c))

    def bound(self, sender: Head, receiver: HeadInput) -> float:
        """The concentration tail bound on P(C_null >= C) for this pair."""
        return tail_bound(self.score(sender, receiver), self.lipschitz(sender, receiver), self.hw.null_dim)


def _leave_one_out_ratio(column: np.ndarray) -> np.ndarray:
    """c_i / median(c_j, j != i, c_j not NaN) for every i of `column` (NaN where c_i is NaN or fewer
    than MIN_PEERS others remain; inf where that median is 0): the column sorted once, each median
    read at the positions the remaining values take."""
    out = np.full(column.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(column))
    m = len(ok) - 1  # peers of each defined entry
    if m < scores.MIN_PEERS:
        return out
    vals = column[ok]
    order = np.argsort(vals, kind="stable")
    srt = vals[order]
    rank = np.empty(len(vals), dtype=int)
    rank[order] = np.arange(len(vals))
    lo, hi = (m - 1) // 2, m // 2  # the middle positions among the m others

    def at(k: int) -> np.ndarray:  # the k-th smallest of the others: skip the entry's own position
        return srt[np.where(k < rank, k, k + 1)]

    median = (at(lo) + at(hi)) / 2
    with np.errstate(divide="ignore"):
        out[ok] = np.where(median > 0, vals / np.where(median > 0, median, 1.0), np.inf)
    return out


def spectrum_rank(s: np.ndarray, tol: float = 1e-10) -> int:
    """The singular values (largest first) above `tol` times the largest."""
    return int(np.sum(s > tol * max(float(s[0]), 1e-300))) if len(s) else 0
