"""Which edges a batched sweep patches, what it caches, and what one edge costs.

`all_edges` lists every sender (embed, heads) -> later head input and -> logits edge;
`cache_names` the hooks the batched path reads from the base and source runs for a set of
edges; `bytes_per_edge` a patched variant's working memory (`chunk_size` edges fit a budget);
`patch_cost` one exact patch in forward-equivalents (from the receiver's layer on).
Imports: spec.names only.
"""

from __future__ import annotations

from typing import Any

from ...spec import names
from ...spec.names import hook_attn_out, hook_input, hook_resid_post, hook_resid_pre, hook_z


def all_edges(n_layers: int, n_heads: int, embed: bool = True, logits: bool = True,
              inputs: str = "qkv") -> list[names.Edge]:
    """Every sender (embed, heads) -> every later head's q/k/v, and -> logits."""
    heads = names.Head.every(n_layers, n_heads)
    senders: list[Any] = ([names.Embed()] if embed else []) + heads
    out = []
    for s in senders:
        for r in heads:
            if names.layer_of(s) < r.layer:
                out += [names.Edge(s, names.HeadInput(r, x)) for x in inputs]
        if logits:
            out.append(names.Edge(s, names.Logits()))
    return out


def cache_names(n_layers: int, edges: list[names.Edge] | None = None) -> list[str]:
    """Hooks the batched path reads from the base and source runs for `edges` (None: every edge of
    the model): every sender's activation, each receiver layer's residual, q, k, v, z and attention
    output, and the last residual.  With None, every layer's residual too, which the arithmetic is
    checked against (torch_check.check); for some edges, batched_metrics takes that check's run
    apart (`check`: a run of a few prompts that cached every layer's residual)."""
    out = [names.HOOK_EMBED, names.HOOK_POS_EMBED]
    if edges is None:
        receiving, sending = set(range(n_layers)), set(range(n_layers))
    else:
        receiving = {e.receiver.head.layer for e in edges if isinstance(e.receiver, names.HeadInput)}
        sending = {m.layer for e in edges for m in names.members(e.sender) if isinstance(m, names.Head)}
    for layer in range(n_layers):
        if edges is None or layer in receiving or layer == 0:
            out.append(hook_resid_pre(layer))
        if layer in sending:
            out.append(hook_z(layer))
        if layer in receiving:
            out += [hook_z(layer), hook_attn_out(layer)] + [hook_input(layer, x) for x in "qkv"]
    out.append(hook_resid_post(n_layers - 1))
    return list(dict.fromkeys(out))


def bytes_per_edge(n: int, s: int, d: int, d_head: int, k: int, vocab: int, *, itemsize: int = 4,
                   d_mlp: int | None = None, n_heads: int = 1, downstream: int = 0) -> int:
    """Working memory of one patched variant (a generous estimate of its live tensors).

    n prompts of s positions, k of them scored; `downstream`: the blocks after the
    receiver's layer (0: the receiver is in the last layer, and its layer is computed
    at the k scored positions only, else at all s).  Receiver layer: the head's q/k/v,
    scores and z, mid and the MLP; each later block (one at a time): its residual,
    q/k/v of every head, scores, MLP; the last of them at the scored positions; the
    end: logits and the metric's float64 copies.
    """
    dm = d_mlp or 4 * d
    hd = n_heads * d_head
    sq = s if downstream else k
    receiver = (sq + 2 * s) * d_head + 2 * sq * s + 2 * sq * d_head + sq * (4 * d + 3 * dm)
    block = s * (4 * d + 8 * hd + 2 * n_heads * s + 3 * dm)
    last = s * (2 * d + 4 * hd) + k * (2 * n_heads * s + 2 * hd + 4 * d + 3 * dm)
    end = 7 * k * vocab  # logits, and the metric's copies (two of them in float64)
    return itemsize * n * (receiver + (block + last if downstream else 0) + end)


def chunk_size(budget_bytes: int, per_edge: int) -> int:
    """Edges per chunk: budget_bytes // per_edge, at least 1."""
    return max(1, int(budget_bytes // max(per_edge, 1)))


def patch_cost(edge: names.Edge, n_layers: int) -> float:
    """What patching one edge costs, in forward passes of the prompts: the blocks from the
    receiver's layer on ((L - l) / L), a quarter of a block's share for the last layer, whose
    queries, MLP and unembedding run at the scored positions only."""
    layer = edge.receiver.head.layer if isinstance(edge.receiver, names.HeadInput) else n_layers - 1
    return 0.25 / n_layers if layer == n_layers - 1 else (n_layers - layer) / n_layers
