"""`harness weights`: every cross-layer composition score of a model, per mode,
with the rotation-null p-value of each pair, Benjamini-Hochberg adjusted over
all pairs of that mode; cells significant at alpha are marked `*`."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from .. import stats
from ..mech import weights
from ..mech.factored import Composition
from ..progress import stage
from ..spec import names

MAX_DRAWS = 20_000  # default cap on a pair's extended null (harness weights --max-draws)


def composition_tables(bridge: Any, processing: str, n_draws: int, alpha: float, seed: int,
                       modes: tuple[str, ...] = weights.MODES, max_draws: int = MAX_DRAWS) -> str:
    """The tables; pairs with p < alpha after n_draws are extended towards the draws BH needs
    (weights.draws_needed), at most `max_draws`."""
    hw = weights.head_weights(bridge, processing)
    comp = Composition(hw, seed)
    L, H = hw.n_layers, hw.n_heads
    if L < 2:
        return "the model has a single layer: no cross-layer pairs"
    out = [f"Composition scores C = ||X Y||_F / (||X||_F ||Y||_F), weights {processing}; "
           f"isotropic baseline 1/sqrt({hw.null_dim}) = {1 / hw.null_dim ** 0.5:.3f}; "
           f"* = rotation-null p < {alpha:g} after Benjamini-Hochberg over the pairs of a mode "
           f"({n_draws} shared null draws; where no draw reaches C, the concentration bound on the null's tail "
           f"stands in when it is smaller: docs/hypothesis-format.md)."]
    if hw.rotary:
        out.append("Rotary positions: Q- and K-composition are one-sided and offset-free (Y = the receiver's W_Q, "
                   "W_K: what its queries and keys read; the QK form itself depends on the offset); V-composition "
                   "is Y = OV as usual.")
    pairs = [(l1, h1, l2, h2) for l1 in range(L) for l2 in range(l1 + 1, L) for h1 in range(H) for h2 in range(H)]
    receivers = [(l2, h2) for l2 in range(1, L) for h2 in range(H)]
    needed = weights.draws_needed(len(pairs), alpha)
    extend_to = min(needed, max(max_draws, n_draws))
    if extend_to < needed:
        out.append(f"With {len(pairs)} pairs per mode, Monte Carlo p can reach the BH threshold only with {needed:,} "
                   f"draws; pairs with p < alpha are extended to {extend_to:,} (--max-draws), so below that floor "
                   f"only the tail bound can make a pair significant.")
    for mode in modes:
        stage(f"harness weights: {mode.upper()}-composition, {len(pairs)} pairs")
        scores = comp.scores(mode)
        pv, used = comp.p_values(mode, n_draws, extend_to, alpha)
        adjusted = stats.benjamini_hochberg([float(pv[p]) for p in pairs])
        adj = dict(zip(pairs, adjusted, strict=True))
        by_bound = sum(float(pv[p]) < 1 / (1 + int(used[p])) for p in pairs)
        n_extended = sum(int(used[p]) > n_draws for p in pairs)
        rows = []
        for l1 in range(L - 1):
            for h1 in range(H):
                row = [str(names.Head(l1, h1))]
                for l2, h2 in receivers:
                    if l2 <= l1:
                        row.append("")
                        continue
                    mark = "*" if adj[(l1, h1, l2, h2)] < alpha else ""
                    c = scores[l1, h1, l2, h2]
                    row.append("none" if c != c else f"{c:.3f}{mark}")  # NaN: a zero matrix, no route
                rows.append(row)
        n_sig = sum(v < alpha for v in adj.values())
        out += ["", f"{mode.upper()}-composition (rows: sender OV; columns: receiver .{mode}); "
                f"{n_sig} of {len(pairs)} pairs significant; {n_draws} null draws"
                + (f", {n_extended} pair(s) with p < alpha extended to {extend_to}" if n_extended else "")
                + (f"; {by_bound} pair(s) below the Monte Carlo floor by the tail bound" if by_bound else ""),
                tabulate(rows, disable_numparse=True,
                         headers=["sender"] + [str(names.HeadInput(names.Head(l, h), mode)) for l, h in receivers])]
    return "\n".join(out)
