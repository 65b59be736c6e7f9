"""`harness weights`: every cross-layer composition score of a model, per mode,
with the rotation-null p-value of each pair, Benjamini-Hochberg adjusted over
all pairs of that mode; cells significant at alpha are marked `*`."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from .. import stats
from ..mech import weights
from ..spec import names
from ..streams import WEIGHTS_TABLE_MODE_STREAMS, derive_seed


def composition_tables(bridge: Any, processing: str, n_draws: int, alpha: float, seed: int,
                       modes: tuple[str, ...] = weights.MODES) -> str:
    hw = weights.head_weights(bridge, processing)
    L, H = hw.n_layers, hw.n_heads
    out = [f"Composition scores C = ||X Y||_F / (||X||_F ||Y||_F), weights {processing}; "
           f"isotropic baseline 1/sqrt({hw.null_dim}) = {1 / hw.null_dim ** 0.5:.3f}; "
           f"* = rotation-null p < {alpha:g} after Benjamini-Hochberg over the pairs of a mode."]
    for mode in modes:
        scores = weights.all_scores(hw, mode)
        pairs = [(l1, h1, l2, h2) for l1 in range(L) for l2 in range(l1 + 1, L)
                 for h1 in range(H) for h2 in range(H)]
        if not pairs:
            return "the model has a single layer: no cross-layer pairs"
        pvals, used = [], []
        extend = weights.draws_needed(len(pairs), alpha)
        for k, (l1, h1, l2, h2) in enumerate(pairs):
            X = weights.sender_matrix(hw, l1, h1)
            Y = weights.receiver_matrix(hw, l2, h2, mode)
            p, null = weights.null_p_value(X, Y, float(scores[l1, h1, l2, h2]), n_draws,
                                           derive_seed(seed, WEIGHTS_TABLE_MODE_STREAMS[mode], k), extend, alpha,
                                           hw.null_dim)
            pvals.append(p)
            used.append(len(null))
        adj = dict(zip(pairs, stats.benjamini_hochberg(pvals), strict=True))
        receivers = [(l2, h2) for l2 in range(1, L) for h2 in range(H)]
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
                f"{n_sig} of {len(pairs)} pairs significant; {n_draws} null draws per pair"
                + (f", {sum(u > n_draws for u in used)} pair(s) with p < alpha extended to {max(used)}"
                   if max(used) > n_draws else ""),
                tabulate(rows, disable_numparse=True,
                         headers=["sender"] + [str(names.HeadInput(names.Head(l, h), mode)) for l, h in receivers])]
    return "\n".join(out)
