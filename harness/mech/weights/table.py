"""Every cross-layer composition score of a model, per mode, in one record (`WeightsTables`):
C, the rotation-null p-value of each pair (mech.weights.factored's shared null, extended for pairs
below alpha), its Benjamini-Hochberg adjustment over all pairs of that mode, and
C_max = min(s1(X)/||X||_F, s1(Y)/||Y||_F) and the peer ratio C / median(peers) (mech.weights.scores:
a pair composes when p_adj < alpha and the ratio reaches min_ratio).  `harness weights` renders it (tools.weights_table)
and draws it (report.weights_figure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ... import stats
from ...model.bridge import Bridge
from ...model.devices import of
from ...progress import stage
from ...spec.settings import MIN_PEER_RATIO
from . import scores
from .factored import Composition

MAX_DRAWS = 20_000  # default cap on a pair's extended null (harness weights --max-draws)


@dataclass
class ModeTable:
    """One mode's numbers, each [L, H, L, H] (meaningful where l1 < l2; NaN elsewhere)."""

    mode: str
    scores: np.ndarray  # C (NaN: no route)
    p: np.ndarray  # rotation-null p (1 where there is no route)
    p_adj: np.ndarray  # Benjamini-Hochberg over the pairs of this mode
    draws: np.ndarray  # null draws used (int)
    c_max: np.ndarray  # min(s1(X)/||X||_F, s1(Y)/||Y||_F): the largest C the spectra allow
    n_extended: int  # pairs extended past n_draws
    by_bound: int  # pairs whose p is the tail bound (below the Monte Carlo floor)
    peer_ratio: np.ndarray  # C / the median of every other earlier head's C into the same input (mech.weights.scores)
    composes: np.ndarray | None = None  # WeightsTables.composes_grid, made on first use


@dataclass
class WeightsTables:
    processing: str
    n_layers: int
    n_heads: int
    null_dim: int
    n_draws: int
    max_draws: int
    extend_to: int  # draws a pair with p < alpha is extended to
    needed: int  # draws BH would need (scores.draws_needed)
    alpha: float
    seed: int
    rotary: bool
    min_ratio: float = MIN_PEER_RATIO  # stats.composition_min_ratio
    modes: dict[str, ModeTable] = field(default_factory=dict)

    @property
    def baseline(self) -> float:
        """The isotropic baseline 1/sqrt(null_dim) (E[C^2] = 1/null_dim)."""
        return 1 / math.sqrt(self.null_dim)

    def pairs(self) -> list[tuple[int, int, int, int]]:
        """Every cross-layer pair (l1, h1, l2, h2), sender-major (the full table's order)."""
        L, H = self.n_layers, self.n_heads
        return [(l1, h1, l2, h2) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L) for h2 in range(H)]

    def significant(self, mode: str, q: tuple[int, int, int, int]) -> bool:
        return bool(self.modes[mode].p_adj[q] < self.alpha)

    def ratio(self, mode: str, q: tuple[int, int, int, int]) -> float | None:
        r = float(self.modes[mode].peer_ratio[q])
        return None if math.isnan(r) else r

    def composes(self, mode: str, q: tuple[int, int, int, int]) -> bool:
        """mech.weights.scores.composes: significant and standing out among its peers."""
        return bool(self.composes_grid(mode)[q])

    def composes_grid(self, mode: str) -> np.ndarray:
        """[L, H, L, H] bool: `composes` of every cross-layer pair (False elsewhere), made once per mode."""
        m = self.modes[mode]
        if m.composes is None:
            m.composes = np.zeros(m.scores.shape, dtype=bool)
            for q in self.pairs():
                m.composes[q] = scores.composes(float(m.p_adj[q]), self.ratio(mode, q), self.alpha, self.min_ratio)
        return m.composes


def _c_max(comp: Composition, mode: str) -> np.ndarray:
    """[L, H, L, H] C_max of every (sender, receiver) (NaN where a matrix is zero)."""
    def top_share(s: Any) -> np.ndarray:
        s = s.numpy()
        n = np.linalg.norm(s, axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, s[..., 0] / np.where(n > 0, n, 1.0), np.nan)

    x, y = top_share(comp.spectrum("x")), top_share(comp.spectrum(mode))
    return cast(np.ndarray, np.minimum(x[:, :, None, None], y[None, None, :, :]))


def composition_data(bridge: Bridge, *, processing: str, n_draws: int, alpha: float, seed: int,
                     modes: tuple[str, ...] = scores.MODES, max_draws: int = MAX_DRAWS,
                     min_ratio: float = MIN_PEER_RATIO) -> WeightsTables | None:
    """The numbers of every mode (None for a single-layer model); pairs with p < alpha after
    n_draws are extended towards the draws BH needs (scores.draws_needed), at most `max_draws`."""
    hw = scores.head_weights(bridge, processing)
    L, H = hw.n_layers, hw.n_heads
    if L < 2:
        return None
    comp = Composition(hw, seed, of(bridge))
    n_pairs = H * H * L * (L - 1) // 2
    needed = scores.draws_needed(n_pairs, alpha)
    out = WeightsTables(processing, L, H, hw.null_dim, n_draws, max_draws, min(needed, max(max_draws, n_draws)),
                        needed, alpha, seed, bool(hw.rotary), min_ratio)
    pairs = out.pairs()
    idx = tuple(np.array(pairs).T)
    for mode in modes:
        stage(f"harness weights: {mode.upper()}-composition, {n_pairs} pairs")
        grid = comp.scores(mode)
        pv, used = comp.p_values(mode, n_draws, out.extend_to, alpha)
        adj = np.full(pv.shape, np.nan)
        adj[idx] = stats.benjamini_hochberg([float(v) for v in pv[idx]])
        sc = np.full(grid.shape, np.nan)
        sc[idx] = grid[idx]
        by_bound = int(np.sum(pv[idx] < 1 / (1 + used[idx])))
        out.modes[mode] = ModeTable(mode, sc, pv, adj, used, _c_max(comp, mode),
                                    int(np.sum(used[idx] > n_draws)), by_bound, comp.peer_ratios(mode))
    return out
