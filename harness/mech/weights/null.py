"""The rotation null of composition scores, drawn once and shared by every pair.

For a sender with singular values s_x and a receiver input with singular values
s_y (both padded with zeros to length r), the null keeps both spectra and draws
their relative orientation uniformly:

    C_null = ||S_x F S_y||_F / (||s_x|| ||s_y||),
    C_null^2 = a^T (F o F) b,   a = s_x^2 / ||s_x||^2,  b = s_y^2 / ||s_y||^2

with F the top-left r x r block of a Haar-random orthogonal n x n matrix
(n = `null_dim`; o is the elementwise product).  The block's distribution depends
on (r, n) only, so one set of draws P_m = F_m o F_m serves every pair of a model:
a pair's null is a^T P_m b over the same m = 1..N draws (common random numbers).
Each pair's null distribution is exact; p-values of different pairs computed
from the same draws are positively dependent (all increase with the same
draws), the setting in which Benjamini-Hochberg keeps its guarantee (PRDS).
Zero-padding is exact: a zero singular value removes its row or column of F,
and the top-left block of F is again a top-left block of a Haar matrix.

Sampling F exactly in O(r^3) per draw, not O(n r^2): the first r columns of a
Haar matrix are G R^{-1}, G an n x r standard normal matrix and R the upper
Cholesky factor of G^T G (the QR factorisation with a positive diagonal).  Its
top r rows are F = G_top R^{-1}, and G^T G = G_top^T G_top + W with
W ~ Wishart_r(n - r, I) independent of G_top, drawn by the Bartlett
decomposition W = L L^T (L lower triangular, L_ii = sqrt(chi2(n - r - i + 1)),
i = 1..r, L_ij ~ N(0, 1) below the diagonal).  When n < 2r, G is drawn whole.

Draws come in chunks of `chunk_draws(r)` (CHUNK = 1,000 draws, fewer where a chunk of r x r
blocks would pass CHUNK_BYTES: 128 at d_head 256); chunk i is seeded derive_seed(seed,
Stream.ROTATION_NULL, r, n, i), so the first N draws are the same whatever the
total, and extending a null appends chunks.

One-sided Monte Carlo p = (1 + #{C_null >= C}) / (1 + N).

Tail bound (`tail_bound`): C_null = f(R) is Lipschitz in R (Hilbert-Schmidt
metric) with constant L = s1(X) s1(Y) / (||X||_F ||Y||_F), and
E f <= sqrt(E f^2) = 1 / sqrt(n).  Concentration of measure on the orthogonal
group (log-Sobolev; Meckes 2019, Thm 5.17, the constant used for products of
groups, which is the more conservative) gives, for C > 1/sqrt(n),

    P(C_null >= C) <= exp(-(n - 2) (C - 1/sqrt(n))^2 / (24 L^2)).

(Haar measure on O(n) and on SO(n) give the same law of f here: a reflection
fixing the receiver's input subspace maps one coset onto the other.)
`mc_or_bound_p` uses the bound only when no draw reached C, and only if it is
below the Monte Carlo floor 1/(1 + N): then P(p <= u) <= u still holds for every
u (below the floor the bound alone decides; at or above it the event implies the
Monte Carlo p <= u).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import memory
from ...streams import Stream, derive_seed
from ...threads import single_threaded

CHUNK = 1000  # draws per seeded chunk
CHUNK_BYTES = 64 * 2**20  # at most this many bytes of float64 r x r blocks per chunk (d_head 64: 1,000 draws, 32 MiB)


def chunk_draws(r: int) -> int:
    """Draws per seeded chunk for blocks of size r: CHUNK, or fewer where CHUNK blocks would pass
    CHUNK_BYTES (a 256-dimensional head's 1,000 blocks hold 512 MiB, and their draws several times it)."""
    return max(1, min(CHUNK, CHUNK_BYTES // (8 * r * r)))
BUILD_BYTES = 8 * 2**20  # draws of F built at once from their random numbers (each several temporaries of their size)
KEEP_BYTES = 128 * 2**20  # at most this many bytes of a SharedNull's draws stay in memory (d_head 64: all 1,000)
PAIRS = 128  # pairs per contraction in SharedNull.pair_samples
TOL = 1e-12  # C_null >= C - TOL counts as reaching C (ties in exact arithmetic)


def haar_blocks(r: int, n: int, m: int, seed: int) -> Any:
    """m draws of F, the top-left r x r block of a Haar n x n orthogonal matrix (the
    construction above): a float64 tensor [m, r, r].  The random numbers are those of one
    generator seeded `seed` drawing G_top [m, r, r], then W [m, r, r], then the chi-square
    diagonal [m, r]; they are drawn a part of BUILD_BYTES at a time, from three generators that
    each skip to their place in that stream, so nothing of size m x r x r is held but the result."""
    import torch

    if r > n:
        raise ValueError(f"block size {r} exceeds the dimension {n}")
    step = max(1, BUILD_BYTES // (8 * r * r))  # draws built at once
    with single_threaded():
        if n < 2 * r:  # small n: the whole frame (first r columns), then its top rows
            G = torch.from_numpy(np.random.default_rng(seed).standard_normal((m, n, r)))
            R = torch.linalg.cholesky(G.mT @ G, upper=True)
            return torch.linalg.solve_triangular(R, G[:, :r, :], upper=True, left=False)
        tops, lowers, diag_rng = (np.random.default_rng(seed) for _ in range(3))
        _skip(lowers, m, r, step)  # past G_top
        _skip(diag_rng, m, r, step)
        _skip(diag_rng, m, r, step)  # past G_top and W
        diag = np.sqrt(diag_rng.chisquare(n - r - np.arange(r), size=(m, r)))  # n - r - i + 1 for i = 1..r
        out = torch.empty((m, r, r), dtype=torch.float64)
        trim = m > step and 8 * m * r * r >= CHUNK_BYTES  # blocks as large as a chunk may be (d_head 256), not 64's
        for lo in range(0, m, step):
            size = min(step, m - lo)
            G = torch.from_numpy(tops.standard_normal((size, r, r)))
            Lw = torch.from_numpy(np.tril(lowers.standard_normal((size, r, r)), -1)) + torch.diag_embed(
                torch.from_numpy(diag[lo:lo + size]))  # W's strictly lower triangle is L's
            R = torch.linalg.cholesky(G.mT @ G + Lw @ Lw.mT, upper=True)
            out[lo:lo + size] = torch.linalg.solve_triangular(R, G, upper=True, left=False)  # G_top R^{-1}
            if trim:  # a part's freed temporaries back to the system before the next (the heap keeps them)
                memory.release()
        return out


def _skip(rng: np.random.Generator, m: int, r: int, step: int) -> None:
    """Draw (and drop) m x r x r standard normals, `step` x r x r at a time: the same stream as one draw."""
    for lo in range(0, m, step):
        rng.standard_normal((min(step, m - lo), r, r))


def haar_block_squares(r: int, n: int, m: int, seed: int) -> Any:
    """m draws of F o F, F the top-left r x r block of a Haar n x n orthogonal matrix:
    a float64 tensor [m, r, r] (`haar_blocks` squared elementwise)."""
    return haar_blocks(r, n, m, seed).square_()


@dataclass
class SharedNull:
    """The shared draws P_m = F_m o F_m for block size r in dimension n, chunk by chunk.

    The chunks of the first `keep` draws stay in memory (the base draws every pair uses), as far
    as they fit KEEP_BYTES (d_head 256: the first 256 of 1,000 draws); chunks beyond them
    (extensions, and base draws of large blocks) are made again, with the same seed and so the
    same numbers, when asked for."""

    r: int
    n: int
    seed: int
    keep: int = CHUNK
    _chunks: dict[int, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Draws per chunk (chunk_draws)."""
        return chunk_draws(self.r)

    def chunk(self, i: int) -> Any:
        if i in self._chunks:
            return self._chunks[i]
        P = haar_block_squares(self.r, self.n, self.size,
                               derive_seed(self.seed, Stream.ROTATION_NULL, self.r, self.n, i))
        if i * self.size < self.keep and (i + 1) * self.size * 8 * self.r * self.r <= KEEP_BYTES:
            self._chunks[i] = P
        return P

    def blocks(self, stop: int, start: int = 0) -> Iterator[tuple[int, int, Any]]:
        """(first draw, last draw + 1, P) covering draws start..stop-1, one chunk at a time (a chunk
        not kept is let go of before the next is made)."""
        size = self.size
        for i in range(start // size, math.ceil(stop / size)):
            lo, hi = max(start, i * size), min(stop, (i + 1) * size)
            yield lo, hi, self.chunk(i)[lo - i * size:hi - i * size]

    def pair_samples(self, a: Any, b: Any, stop: int, start: int = 0) -> np.ndarray:
        """C_null of K pairs (rows of a, b: [K, r] normalised squared spectra): [K, stop - start].
        Many pairs at once cost far less than one at a time (one contraction per PAIRS pairs and
        chunk of draws; working memory PAIRS x CHUNK x r floats)."""
        import torch

        parts = []
        with single_threaded():
            for _, _, P in self.blocks(stop, start):
                parts.append(torch.cat([torch.einsum("kr,mrs,ks->km", a[lo:lo + PAIRS], P, b[lo:lo + PAIRS])
                                        for lo in range(0, a.shape[0], PAIRS)]).clamp_min(0).sqrt())
        return torch.cat(parts, dim=1).numpy()


def grid_of(a: Any, b: Any, P: Any) -> Any:
    """C_null of every sender (rows of a [NA, r]) with every receiver (rows of b [NB, r]) on the
    draws P [m, r, r]: sqrt(a_i^T P_m b_j), a tensor [NA, NB, m]."""
    import torch

    left = torch.einsum("ir,mrs->mis", a, P)  # [m, NA, r]
    return (left @ b.T).clamp_min(0).sqrt().permute(1, 2, 0)


def normalised_squares(s: Any) -> Any:
    """s^2 / ||s||^2 along the last axis (zeros where the spectrum is zero: no route)."""
    import torch

    sq = s * s
    total = sq.sum(-1, keepdim=True)
    return torch.where(total > 0, sq / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(sq))


def mc_p(null: np.ndarray, c: float) -> float:
    """(1 + #{null >= c}) / (1 + len(null)); 1 for an undefined score."""
    if math.isnan(c):
        return 1.0
    return (1 + int(np.sum(null >= c - TOL))) / (1 + len(null))


def tail_bound(c: float, lipschitz: float, n: int) -> float:
    """exp(-(n - 2) (c - 1/sqrt(n))^2 / (24 L^2)) for c > 1/sqrt(n), else 1 (see the module docstring)."""
    t = c - 1.0 / math.sqrt(n)
    if math.isnan(c) or t <= 0 or lipschitz <= 0 or n <= 2:
        return 1.0
    return math.exp(-(n - 2) * t * t / (24.0 * lipschitz * lipschitz))


def mc_or_bound_p(exceed: int, n_draws: int, bound: float) -> float:
    """The Monte Carlo p, replaced by the tail bound when no draw reached C and the bound is lower."""
    p = (1 + exceed) / (1 + n_draws)
    return min(p, bound) if exceed == 0 else p
