"""What an edge circuit's receivers read through its removed edges: the non-vacuity of a circuit.

An edge circuit keeps its edges and gives every other edge the sender's replacement write
(mech.graph.forward).  The intervention tests something only where a receiver of the circuit
reads a changed input.  For each receiver v the circuit keeps an edge into, and for the logits
(which the metric reads whatever the circuit keeps), the change its removed edges carry, at the
base run's writes (first order: no change propagated from one layer to the next), is

    Δ_v = sum over removed (u, v), u not a head inside a post norm, of  (out_u - rep_u)
          + sum_l [ post1_l(P_l) - post1_l(P_l - sum_{h in l, (h, v) removed} (z_h - z_h^rep) W_O[h]) ]

and what those edges carry at all, S_v, is the same with every replacement 0 (rep = 0).  At each
position p, pooled over the receivers that read it (w_vp: 1 where v reads p),

    r_np = min(1, sqrt(sum_v w_vp ||Δ_vnp||^2 / sum_v w_vp ||S_vnp||^2))

and r_n is the mean of r_np over the positions where some removed edge writes something (NaN
where none does).  w: the scored positions for the logits, the last layer's queries and its MLP;
every position up to the last scored one for any other receiver (a later layer may read any of
them).  Each position counts once: a trained model's first position carries residual norms a
hundred times the others' (over 99% of sum_p ||S_p||^2 in SmolLM2), and it never changes, so a
ratio of sums over positions would read any corruption as vacuous.  A position counts as fully
changed at most (the min with 1), so one where the removed edges write almost nothing cannot
outweigh the rest.  `at_scored`: r_np over every receiver at the scored positions, averaged
over them.  Embed's edges count like any other: a receiver cut off from the clean token
embeddings reads the corrupted ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ... import memory
from ...spec import names
from ..block.arith import Norm
from .forward import BUDGET, GraphModel
from .parts import Writes
from .structure import Graph


def receivers_read(keep: np.ndarray) -> np.ndarray:
    """The receivers a circuit's non-vacuity reads: every one the mask keeps an edge into, and the logits."""
    read = np.asarray(keep.any(0), dtype=bool)
    read[-1] = True
    return read


def received_squares(gm: GraphModel, clean: Writes, rep: Writes, keep: np.ndarray, scored: Any, upto: Any,
                     budget: int | None = None) -> np.ndarray:
    """[4, n, s]: per prompt and position, sum_v w_vp ||Δ_v||^2 and sum_v w_vp ||S_v||^2, then the same
    summed over every receiver read (w = 1: the scored positions' sums) (module docstring), for the
    edge circuit `keep` [U, V] on the prompts of `clean`; `scored` and `upto` [n, >= s]: 1 at the
    scored positions, and at every position up to the last scored one (mech.runs.change)."""
    import torch

    budget = memory.working(BUDGET) if budget is None else budget
    n, s, d = clean.embed.shape[0], gm.s, clean.embed.shape[-1]
    # per prompt, float64: every sender's change, and a layer's receivers' changes (and their post-norm inputs)
    row = (len(gm.graph.senders) + 6 * gm.arch.n_heads + 8) * s * d * 8
    size = max(1, budget // row)
    out = np.zeros((4, n, s))
    with torch.no_grad():
        for lo in range(0, n, size):
            idx = torch.arange(lo, min(n, lo + size), device=clean.embed.device)
            for j, r in enumerate((rep, clean.zeros())):
                read, every = _squares(gm, clean, r, keep, scored[idx, :s], upto[idx, :s], idx)
                out[j, lo:lo + len(idx)] = read
                out[2 + j, lo:lo + len(idx)] = every
    return out


def position_mean(num: np.ndarray, den: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """r_n [n]: the mean over positions (those of `where`, and with den > 0) of min(1, sqrt(num / den));
    NaN for a prompt with no such position."""
    ok = den > 0 if where is None else (den > 0) & where
    r = np.minimum(1.0, np.sqrt(np.divide(num, den, out=np.zeros_like(num), where=ok)))
    count = ok.sum(-1)
    return np.asarray(np.divide((r * ok).sum(-1), count, out=np.full(len(count), np.nan), where=count > 0))


def _squares(gm: GraphModel, clean: Writes, rep: Writes, keep: np.ndarray, scored: Any, upto: Any, idx: Any
             ) -> tuple[np.ndarray, np.ndarray]:
    """(sum_v w_vp ||Δ_v||^2, sum_v ||Δ_v||^2) [R, s] for prompts idx (their weights `scored`, `upto`)."""
    import torch

    g, arch = gm.graph, gm.arch
    H, s = arch.n_heads, gm.s
    dev = clean.embed.device
    R = len(idx)
    scored, upto = (scored > 0).to(device=dev, dtype=torch.float64), upto.to(device=dev, dtype=torch.float64)
    removed = torch.from_numpy(g.adjacency & ~keep).to(device=dev, dtype=torch.float64)
    read = receivers_read(keep & g.adjacency)
    wide = torch.float64
    D = torch.zeros(R, len(g.senders), s, clean.embed.shape[-1], dtype=wide, device=dev)  # out_u - rep_u
    D[:, 0] = (clean.rows(clean.embed, idx) - rep.rows(rep.embed, idx))[:, :s].to(wide)
    linear = torch.ones(len(g.senders), dtype=wide, device=dev)  # 0: a head inside a post norm
    posts: list[tuple[int, Any, Any, Any]] = []  # (first head sender, P, post1, post1(P))
    read_sq, every_sq = torch.zeros(R, s, dtype=wide, device=dev), torch.zeros(R, s, dtype=wide, device=dev)

    def take(cols: list[int], U: int) -> None:
        """Add the receivers `cols` (reading the first U senders) to the sums."""
        nonlocal read_sq, every_sq
        if not cols:
            return
        M = removed[:U, cols] * linear[:U, None]  # [U, V]
        change = torch.einsum("uv,rusd->rvsd", M, D[:, :U])
        for u0, P, post1, out in posts:
            if u0 >= U:
                break
            Mh = removed[u0:u0 + H, cols]  # [H, V]
            if bool(Mh.any()):
                X = P[:, None] - torch.einsum("hv,rhsd->rvsd", Mh, D[:, u0:u0 + H])
                change = change + (out[:, None] - post1(X))
        sq = (change ** 2).sum(-1)  # [R, V, s]
        for c, v in enumerate(cols):
            read_sq = read_sq + (scored if reads_scored(g, v) else upto) * sq[:, c]
        every_sq = every_sq + sq.sum(1)

    for L in range(g.n_layers):
        U = g.senders_before(L)
        head_cols, mlp_col = g.layer_receivers(L)
        take([j for j in range(head_cols.start, head_cols.stop) if read[j]], U)
        hw = gm.heads(L)
        zc = clean.rows(clean.z[L], idx)[:, :s].to(wide)
        zr = rep.rows(rep.z[L], idx)[:, :s].to(wide)
        W_O = hw.W_O.to(wide)
        D[:, U:U + H] = torch.einsum("rshe,hed->rhsd", zc - zr, W_O)
        post1 = gm.post_norm(L)
        if post1 is not None:
            P = torch.einsum("rshe,hed->rsd", zc, W_O) + hw.b_O.to(wide)
            norm = _wide(post1)
            posts.append((U, P, norm, norm(P)))
            linear[U:U + H] = 0.0
        if mlp_col is not None:
            take([mlp_col] if read[mlp_col] else [], U if arch.parallel else U + H)
            mc, mr = clean.rows(clean.mlp[L], idx), rep.rows(rep.mlp[L], idx)
            if mc is not None:
                D[:, U + H] = (mc[:, :s].to(wide) - (0.0 if mr is None else mr[:, :s].to(wide)))
    take([len(g.receivers) - 1], len(g.senders))
    return read_sq.cpu().numpy(), every_sq.cpu().numpy()


def reads_scored(g: Graph, v: int) -> bool:
    """Whether receiver v reads the scored positions only: the logits, the last layer's queries and MLP."""
    r, layer = g.receivers[v], g.receiver_layer(v)
    if layer == g.n_layers:
        return True
    return layer == g.n_layers - 1 and (isinstance(r, names.Mlp) or (isinstance(r, names.HeadInput) and r.which == "q"))


def _wide(norm: Norm) -> Norm:
    """A post norm's arithmetic in float64 (its weights widened)."""
    import torch

    return replace(norm, w=None if norm.w is None else norm.w.to(torch.float64),
                   b=None if norm.b is None else norm.b.to(torch.float64))
