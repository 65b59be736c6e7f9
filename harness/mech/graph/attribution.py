"""Attribution scores of every edge of the model's graph (mech.graph.structure): first-order estimates of
what exact edge patching measures, from a few backward passes over a batch of prompts.

For an edge u -> v, with a_clean[u], a_corrupt[u] u's write in the clean and corrupted run
and g_v(x) = d m / d(input of v) the gradient of the metric at v's input in a forward pass
whose residual enters at x, per prompt n and position p:

    EAP      s_n,p(u -> v) = (a_clean[u] - a_corrupt[u])_p . g_v(x_ref)_p
    EAP-IG   s_n,p(u -> v) = (a_clean[u] - a_corrupt[u])_p . (1/m) sum_{j=1..m} g_v(x_c + (j/m)(x_clean - x_c))_p

where x is what enters the residual stream (embed's write), x_c the corrupted prompt's.  The
score of an edge is the mean over prompts of sum_p s_n,p (or, `per_position`, every p kept
apart: summing over positions can cancel contributions of opposite sign).

Sign convention: a positive score estimates that the edge carries the clean behaviour.
`noising` (the default) takes g at the clean run (x_ref = x_clean) and estimates the noising
change m_clean - m_patched of exact edge patching (claims.edge: d_n for direction
noising, to first order, since m_patched - m_clean ~ (a_corrupt - a_clean) . g); `denoising`
takes g at the corrupted run and estimates m_patched - m_corrupt, which is the convention of
TransformerLens's `attribution_patch` (its edge scores summed over positions equal these).
EAP-IG with m = 1 is EAP (noising): its single point is the clean run.  Dividing by the mean
clean-corrupted gap gives an estimate of the normalised edge effect.

These are estimates, not interventions: reports keep them on their own rung ("attribution"),
below any exact patch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ... import memory
from ...progress import progress as quiet_progress
from ...spec import names
from ...spec.vocabulary import Direction
from ..hooks import logits_bytes
from .forward import GraphModel
from .parts import Writes
from .structure import Graph

METHODS = ("eap", "eap-ig")
BATCH = 16  # the most prompts per backward pass of every receiver's gradient
EVERY_BUDGET = 512 * 2**20  # working memory of one such pass (by every_gradient_bytes)
# working memory of one batch of one receiver's gradient passes (by one_gradient_bytes, about 3-fold generous)
GRADIENT_BUDGET = 768 * 2**20


@dataclass(frozen=True)
class Scores:
    """Attribution scores: `per_position` [U, V, s] (mean over prompts, per position) and `total` [U, V]
    (summed over positions), zero where the graph has no edge; `per_prompt` [len(wanted), n]: the
    wanted edges' scores prompt by prompt, summed over positions; `resampled` [B, U, V] (with
    `resamples` weights w [B, n]): sum_n w_b,n total_n / sum_n w_b,n, the totals of B reweightings of
    the prompts (bootstrap resamples: w_b,n how often prompt n is drawn), from the same pass."""

    per_position: np.ndarray
    per_prompt: np.ndarray
    resampled: np.ndarray  # [0, U, V] without resamples

    @property
    def total(self) -> np.ndarray:
        return cast(np.ndarray, self.per_position.sum(-1))


def transformer_lens_nodes(edge: names.Edge, position: int, n_layers: int) -> tuple[Any, Any]:
    """TransformerLens's (writer, reader) `Node`s of `edge` at one position: its edge attribution
    (`attribution_patch` with `EdgeAttributionConfig(granularity="edge")`) scores one pair of these
    per position, and harness's edge is the sum of them over positions."""
    from transformer_lens.tools.analysis.attribution_patching import Node

    u, r = edge.sender, edge.receiver
    if isinstance(u, names.Embed):
        w = Node("embed", position)
    elif isinstance(u, names.Head):
        w = Node("attn_head_out", position, u.layer, u.head)
    elif isinstance(u, names.Mlp):
        w = Node("mlp_out", position, u.layer)
    else:
        raise ValueError(f"{edge}: a group of senders is not one TransformerLens node")
    if isinstance(r, names.HeadInput):
        v = Node(f"{r.which}_input", position, r.head.layer, r.head.head)  # type: ignore[arg-type]
    elif isinstance(r, names.Mlp):
        v = Node("mlp_in", position, r.layer)
    else:
        v = Node("logits", position, n_layers - 1)
    return w, v


def _deltas(gm: GraphModel, clean: Writes, corrupt: Writes, layer: int, idx: Any, P: Any = None) -> Any:
    """[b, s, H, d]: each head's write in the clean run minus the corrupted run, layer `layer`,
    prompts `idx`; through the norm after the attention where there is one, to first order at the
    layer's attention sum `P` [b, s, d] of the pass the gradients come from (its Jacobian there times
    the pre-norm change)."""
    import torch

    dz = clean.rows(clean.z[layer], idx) - corrupt.rows(corrupt.z[layer], idx)
    dpre = torch.einsum("bshe,hed->bshd", dz, gm.heads(layer).W_O)
    post1 = gm.post_norm(layer)
    return dpre if post1 is None else post1.jvp(P[:, :, None, :], dpre)


def edge_scores(gm: GraphModel, clean: Writes, corrupt: Writes, positions: Any,
                metric: Callable[[Any, Any], Any], method: str = "eap-ig", steps: int = 5,
                direction: str = Direction.NOISING, batch: int | None = None,
                progress: Callable[..., Any] | None = None, wanted: list[tuple[int, int]] | None = None,
                resamples: np.ndarray | None = None) -> Scores:
    """The attribution score of every edge (module docstring) over the prompts of `clean` /
    `corrupt` (run_writes of the two runs), `batch` prompts per backward pass; for the `wanted`
    edges ((sender index, receiver index) in the graph), each prompt's score summed over
    positions; with `resamples` [B, n] (prompt weights), Scores.resampled.  `batch`: prompts per pass
    (default: at most BATCH, within memory.working(EVERY_BUDGET) by every_gradient_bytes)."""
    import torch

    if batch is None:
        one = every_gradient_bytes(gm, clean.embed.element_size(), int(positions.shape[1]))
        batch = max(1, min(BATCH, memory.working(EVERY_BUDGET) // one))

    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; allowed: {', '.join(METHODS)}")
    if method == "eap-ig" and direction != Direction.NOISING:
        raise ValueError("EAP-IG integrates from the corrupted to the clean run: it has no direction")
    g = gm.graph
    n, s, _ = clean.embed.shape
    out = np.zeros((len(g.senders), len(g.receivers), s))
    per_prompt = np.zeros((len(wanted or []), n))
    resampled = np.zeros((0 if resamples is None else resamples.shape[0], len(g.senders), len(g.receivers)))
    points = ([1.0] if direction == Direction.NOISING else [0.0]) if method == "eap" else \
        [j / steps for j in range(1, steps + 1)]
    starts = list(range(0, n, batch))
    for lo in (progress(starts, "attribution batches") if progress else starts):
        idx = torch.arange(lo, min(n, lo + batch), device=clean.embed.device)
        xc, xk = corrupt.rows(corrupt.embed, idx), clean.rows(clean.embed, idx)
        def rows(lg: Any, i: Any, idx: Any = idx) -> Any:
            return metric(lg, idx[i])

        def gradients(a: float, P: dict[int, Any] | None = None, xc: Any = xc, xk: Any = xk,
                      idx: Any = idx) -> list[Any]:
            return gm.receiver_gradients(xc + a * (xk - xc), positions[idx], rows, P)

        w = None if resamples is None else torch.from_numpy(resamples[:, lo:lo + len(idx)]).double()  # [B, b]
        at = positions[idx]
        # the changes are linear in the gradient without a norm after the attention: the points' gradients
        # are summed first (one point's held at a time); with one, each point's changes pass its Jacobian
        for group in ([[a] for a in points] if gm.arch.post_norms else [points]):
            P: dict[int, Any] | None = {} if gm.arch.post_norms else None
            grads = gradients(group[0], P)
            for a in group[1:]:
                grads = [x + y for x, y in zip(grads, gradients(a), strict=True)]
            grads = [x / len(points) for x in grads]
            every = _changes(gm, clean, corrupt, idx, xk - xc, P)  # [b, s, senders, d]
            _accumulate(gm, every, grads, at, s, w, out, resampled)
            for j, (u, v) in enumerate(wanted or []):
                per_prompt[j, idx.cpu().numpy()] += _prompt_scores(g, every, grads, at, u, v).cpu().numpy()
    out /= n
    out *= g.adjacency[:, :, None]
    if resamples is not None:
        resampled /= resamples.sum(1)[:, None, None]
        resampled *= g.adjacency[None]
    return Scores(out, per_prompt, resampled)


def _accumulate(gm: GraphModel, every: Any, grads: list[Any], at: Any, s: int, w: Any, out: np.ndarray,
                resampled: np.ndarray) -> None:
    """Add a batch's scores into `out` [U, V, s] (summed over prompts) and `resampled` [B, U, V] (weighted
    by w [B, b]): every sender's change `every` [b, s, U, d] against every receiver's gradient (`grads`
    in forward order; the logits' at the scored positions `at` [b, k])."""
    import torch

    g = gm.graph
    d, k = every.shape[-1], at.shape[1]
    gi = 0
    for L in range(g.n_layers):
        U = g.senders_before(L)
        cols, mlp_col = g.layer_receivers(L)
        summed, drawn = _contract(every[:, :, :U], grads[gi], w)
        out[:U, cols] += summed
        if drawn is not None:
            resampled[:, :U, cols] += drawn
        gi += 1
        if mlp_col is not None:
            Um = U + (0 if gm.arch.parallel else gm.arch.n_heads)
            summed, drawn = _contract(every[:, :, :Um], grads[gi][:, :, None], w)
            out[:Um, mlp_col] += summed[:, 0]
            if drawn is not None:
                resampled[:, :Um, mlp_col] += drawn[:, :, 0]
            gi += 1
    picked = every.gather(1, at[:, :, None, None].expand(-1, -1, every.shape[2], d))  # [b, k, U, d]
    contrib = torch.einsum("bkud,bkd->buk", picked, grads[gi]).double()  # [b, U, k]
    per_pos = torch.zeros(every.shape[0], every.shape[2], s, dtype=torch.float64, device=contrib.device)
    per_pos.scatter_add_(2, at[:, None, :].expand(-1, every.shape[2], k), contrib)
    out[:, -1] += per_pos.sum(0).cpu().numpy()
    if w is not None:
        resampled[:, :, -1] += (w @ contrib.sum(-1).cpu()).numpy()


def edge_prompt_scores(gm: GraphModel, clean: Writes, corrupt: Writes, positions: Any,
                       metric: Callable[[Any, Any], Any], edge: tuple[int, int], method: str = "eap-ig",
                       steps: int = 5, batch: int | None = None,
                       progress: Callable[..., Any] | None = None) -> np.ndarray:
    """[n]: the noising attribution score of the one edge (u, v) (sender and receiver index in the
    graph) for each prompt, summed over positions: edge_scores' per_prompt for that edge alone, from
    the gradient at v's input only (GraphModel.receiver_gradient).  Cost: per batch of prompts, one
    forward and one backward from the logits to v's layer per point (EAP: 1, EAP-IG: `steps`).
    `batch`: prompts per pass (default: what memory.working(GRADIENT_BUDGET) holds, one_gradient_bytes)."""
    import torch

    if batch is None:
        batch = max(1, memory.working(GRADIENT_BUDGET) // one_gradient_bytes(gm, clean.embed.element_size(),
                                                                         int(positions.shape[1])))

    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; allowed: {', '.join(METHODS)}")
    g = gm.graph
    u, v = edge
    n = clean.embed.shape[0]
    points = [1.0] if method == "eap" else [j / steps for j in range(1, steps + 1)]
    out = np.zeros(n)
    starts = list(range(0, n, batch))
    steps_of = (progress(starts, "attribution batches") if progress
                else quiet_progress(starts, f"attribution batches of {batch} prompts", quiet=True))
    for lo in steps_of:
        idx = torch.arange(lo, min(n, lo + batch), device=clean.embed.device)
        xc, xk = corrupt.rows(corrupt.embed, idx), clean.rows(clean.embed, idx)

        def rows(lg: Any, i: Any, idx: Any = idx) -> Any:
            return metric(lg, idx[i])

        sender = g.senders[u]
        head = sender if isinstance(sender, names.Head) else None
        through_norm = head is not None and gm.post_norm(head.layer) is not None
        for group in ([[a] for a in points] if through_norm else [points]):  # as edge_scores groups them
            P: dict[int, Any] = {}
            grad = sum(gm.receiver_gradient(xc + a * (xk - xc), positions[idx], rows, v, P)
                       for a in group) / len(points)
            if head is not None and through_norm:
                delta = _deltas(gm, clean, corrupt, head.layer, idx, P[head.layer])[:, :, head.head]
            else:
                delta = gm.sender_delta(clean, corrupt, sender, idx)  # [b, s, d]
            if v == len(g.receivers) - 1:
                at = positions[idx]
                delta = delta.gather(1, at[:, :, None].expand(-1, -1, delta.shape[-1]))
            out[lo:lo + len(idx)] += torch.einsum("bsd,bsd->bs", delta, grad).double().sum(1).cpu().numpy()
    return out


def every_gradient_bytes(gm: GraphModel, item: int, k: int) -> int:
    """A generous estimate of what one prompt's pass for every receiver's gradient holds: one_gradient_bytes,
    and per layer the receivers' inputs, their gradients and those taken back through the norm
    ([s, 3H, d] each) and the senders' changes the scores are contracted with."""
    a, s = gm.arch, gm.s
    per_layer = s * 3 * a.n_heads * a.d_model * 3 + s * len(gm.graph.senders) * a.d_model // a.n_layers
    return one_gradient_bytes(gm, item, k) + item * a.n_layers * per_layer


def one_gradient_bytes(gm: GraphModel, item: int, k: int) -> int:
    """A generous estimate of what one prompt's one-receiver gradient pass holds: per layer the
    activations a backward pass reads (the residual, q, k, v, attention scores and output, the MLP's
    hidden units), s positions; and the larger of the logits at every position and what the backward
    pass of the metric at the k scored positions keeps (three times hooks.logits_bytes: the float64
    log-probabilities it saves and their gradients; at a 262k vocabulary most of a prompt's)."""
    a, s = gm.arch, gm.s
    d, H, d_mlp = a.d_model, a.n_heads, 4 * a.d_model
    per_layer = s * (8 * d + 4 * d_mlp + 3 * H * s)
    return item * a.n_layers * per_layer + max(item * 3 * s * gm.vocab, 3 * logits_bytes(k, gm.vocab))


def _changes(gm: GraphModel, clean: Writes, corrupt: Writes, idx: Any, d_embed: Any,
             P: dict[int, Any] | None = None) -> Any:
    """[b, s, senders, d]: every sender's write in the clean run minus the corrupted run, prompts
    `idx`, in the graph's sender order (embed's change is `d_embed`); `P`: each layer's attention sum
    in the pass the gradients come from (models with a norm after the attention, _deltas)."""
    import torch

    parts = [d_embed[:, :, None, :]]
    for L in range(gm.graph.n_layers):
        parts.append(_deltas(gm, clean, corrupt, L, idx, None if P is None else P[L]))
        if gm.graph.has_mlp:
            cm, km = clean.rows(clean.mlp[L], idx), corrupt.rows(corrupt.mlp[L], idx)
            parts.append((cm - (0.0 if km is None else km))[:, :, None, :])
    return torch.cat(parts, 2)


def _contract(delta: Any, grad: Any, weights: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """[U, V, s]: sum over prompts of delta[b, s, u] . grad[b, s, v] (the dot product over d in the
    model's dtype, position by position; the sum over prompts in float64); and with `weights` [B, b]
    (float64), [B, U, V]: sum_b weights[B, b] (sum over positions of those dot products)."""
    import torch

    per = torch.einsum("bsud,bsvd->bsuv", delta, grad).double()
    drawn = None if weights is None else torch.einsum("Bb,buv->Buv", weights, per.sum(1).cpu()).numpy()
    return np.asarray(per.sum(0).permute(1, 2, 0).cpu().numpy()), drawn


def _prompt_scores(g: Graph, every: Any, grads: list[Any], at: Any, u: int, v: int) -> Any:
    """[b] edge (u, v)'s score of each prompt of a batch, summed over positions: sender u's change
    `every[:, :, u]` [b, s, d] against receiver v's gradient (`grads` in forward order: per layer the
    head inputs [b, s, 3H, d] and the MLP [b, s, d], then the logits [b, k, d] at positions `at`)."""
    import torch

    delta = every[:, :, u]
    per_layer = 1 + int(g.has_mlp)
    if v == len(g.receivers) - 1:
        picked = delta.gather(1, at[:, :, None].expand(-1, -1, delta.shape[-1]))
        per_position = torch.einsum("bkd,bkd->bk", picked, grads[-1])
    else:
        layer = g.receiver_layer(v)
        cols, mlp_col = g.layer_receivers(layer)
        grad = grads[layer * per_layer + 1] if v == mlp_col else grads[layer * per_layer][:, :, v - cols.start]
        per_position = torch.einsum("bsd,bsd->bs", delta, grad)
    return per_position.double().sum(1)  # the dot products as _contract takes them, the sum in float64
