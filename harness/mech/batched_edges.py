"""Batched exact edge patching: many edges per forward, each starting at its
receiver's layer, the metric computed only at the scored positions.

Same definition as patching.py (the per-edge reference).  For an edge
A -> B.x with B in layer L, and base/source caches of one prompt batch:

    r'      = resid_pre_L - out_A(base) + out_A(replacement)
    x_B'    = LN1_L(r') W_x[B] + b_x[B]        (the other two inputs of B from the base run)
    z_B'    = softmax(q_B' k_B'^T / scale + causal mask) v_B'
    mid_L'  = resid_mid_L(base) + (z_B' - z_B(base)) W_O[B]
    post_L' = mid_L' + MLP_L(LN2_L(mid_L'))   (models with MLPs; else post = mid)

then blocks L+1.. run on post_L', and ln_final + unembed only at the scored
positions.  `-> logits` edges swap the final residual directly.  Nothing below
layer L is recomputed, and every other head of layer L keeps its cached output
(only B's inputs change, and B's output is all that its inputs affect).

Edges are stacked along the batch dimension in chunks whose size follows a
memory budget (bytes per edge estimated from the shapes), so peak memory is
bounded by the budget, not by the number of edges.

Devices: every tensor made here is made on the device of the cached
activations (the model's), including index tensors; `positions` are moved there;
the per-edge metrics come back to the CPU as numpy.

Receivers in the last layer (every head receiver of a 2-layer model) take a
shorter road: r' depends only on the sender, so LN1(r') is computed once per
sender and projected onto every receiver head's q/k/v at once; queries, the
attention output, the MLP and the unembedding are computed at the scored
positions only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import UnsupportedError
from ..model.devices import like
from ..spec import names
from ..spec.names import hook_attn_out, hook_input, hook_resid_post, hook_resid_pre, hook_z
from ..spec.vocabulary import REPLACEMENTS
from .patching import attn_scale, sender_output


def all_edges(n_layers: int, n_heads: int, embed: bool = True, logits: bool = True,
              inputs: str = "qkv") -> list[names.Edge]:
    """Every sender (embed, heads) -> every later head's q/k/v, and -> logits."""
    heads = names.Head.every(n_layers, n_heads)
    senders: list = ([names.Embed()] if embed else []) + heads
    out = []
    for s in senders:
        for r in heads:
            if names.layer_of(s) < r.layer:
                out += [names.Edge(s, names.HeadInput(r, x)) for x in inputs]
        if logits:
            out.append(names.Edge(s, names.Logits()))
    return out


def cache_names(n_layers: int) -> list[str]:
    """Hooks the batched path reads from the base and source runs."""
    out = [names.HOOK_EMBED, names.HOOK_POS_EMBED]
    for layer in range(n_layers):
        out += [hook_z(layer), hook_resid_pre(layer), hook_attn_out(layer)] + [hook_input(layer, x) for x in "qkv"]
    out.append(hook_resid_post(n_layers - 1))
    return out


def bytes_per_edge(n: int, s: int, d: int, d_head: int, k: int, vocab: int, itemsize: int = 4) -> int:
    """Working memory of one patched variant (a generous estimate of the live tensors)."""
    return itemsize * (8 * n * s * d + 6 * n * s * d_head + 2 * n * s * s + 3 * n * k * vocab)


def chunk_size(budget_bytes: int, per_edge: int) -> int:
    return max(1, int(budget_bytes // max(per_edge, 1)))


def _head_z(bridge: Any, q: Any, k: Any, v: Any) -> Any:
    """z = softmax(q k^T / scale + causal mask) v for stacked single heads [E, n, s, dh]."""
    import torch

    scores = q @ k.transpose(-1, -2) / attn_scale(bridge.cfg)
    s = scores.shape[-1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=scores.device), 1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def _rest_of_model(bridge: Any, layer: int, mid: Any) -> Any:
    """From resid_mid of `layer` ([E, n, s, d]) to the final residual."""
    E, n, s, d = mid.shape
    x = mid.reshape(E * n, s, d)
    block = bridge.blocks[layer]
    if not getattr(bridge.cfg, "attn_only", False) and hasattr(block, "mlp"):
        x = x + block.mlp(block.ln2(x))
    for l in range(layer + 1, bridge.cfg.n_layers):
        out = bridge.blocks[l](x)
        x = out[0] if isinstance(out, tuple) else out
    return x.reshape(E, n, s, d)


def batched_metrics(bridge: Any, edges: list[names.Edge], base: dict, source: dict, clean: dict,
                    positions: Any, metric_fn: Callable, replacement: str = "resample",
                    budget_bytes: int = 32 * 2**20, progress: Callable = lambda it, label: it) -> np.ndarray:
    """Per-edge, per-prompt metric of every patched variant: [len(edges), n_prompts].

    metric_fn(logits [N, k, vocab], positions [N, k]) -> [N] (the scored positions
    are already selected).  `base`/`source`: caches with `cache_names`; `clean`
    provides the reference set for the `mean` replacement.
    """
    import torch

    if replacement not in REPLACEMENTS:
        raise ValueError(f"unknown replacement {replacement!r}")
    ref = base[hook_resid_pre(0)]  # dtype and device of the activations
    positions = positions.to(ref.device)
    cfg = bridge.cfg
    L_last = cfg.n_layers - 1
    n, s = base[hook_resid_pre(0)].shape[:2]
    d, dh, k = cfg.d_model, cfg.d_head, positions.shape[1]
    per_edge = bytes_per_edge(n, s, d, dh, k, cfg.d_vocab)
    size = chunk_size(budget_bytes, per_edge)
    out = np.zeros((len(edges), n))
    dtype, dev = ref.dtype, ref.device

    def replaced(senders: list) -> Any:
        if replacement == "resample":
            return outputs(source, senders)
        if replacement == "zero":
            return torch.zeros(len(senders), n, s, d, dtype=dtype, device=dev)
        return outputs(clean, senders).mean(1, keepdim=True).expand(-1, n, -1, -1)

    cached_out: dict = {}

    def outputs(cache: dict, senders: list) -> Any:
        """Sender outputs, computed once per (run, sender)."""
        for x in senders:
            if (id(cache), str(x)) not in cached_out:
                cached_out[(id(cache), str(x))] = like(sender_output(bridge, cache, x), ref)
        return torch.stack([cached_out[(id(cache), str(x))] for x in senders])

    groups: dict = {}
    last = []
    for i, e in enumerate(edges):
        r = e.receiver
        if isinstance(r, names.Logits):
            groups.setdefault("logits", []).append(i)
        elif not isinstance(r, names.HeadInput):
            raise UnsupportedError(f"edge patching into {r} is not supported (receivers: .q/.k/.v, logits)")
        elif r.head.layer == L_last:
            last.append(i)
        else:
            groups.setdefault(r.head.layer, []).append(i)
    if last:
        with torch.no_grad():
            _last_layer(bridge, edges, last, base, positions, metric_fn, outputs, replaced, out,
                        budget_bytes, progress)
    chunks = [(key, idx[j:j + size]) for key, idx in groups.items() for j in range(0, len(idx), size)]
    with torch.no_grad():
        for key, idx in progress(chunks, "edge chunks"):
            senders = [edges[i].sender for i in idx]
            delta_out = replaced(senders) - outputs(base, senders)  # [E, n, s, d]
            if key == "logits":
                pos = _at(positions, base[hook_resid_post(L_last)][None] + delta_out)
                out[idx] = _metric_at(bridge, pos, metric_fn).cpu().double().numpy()
                continue
            L = key
            resid = base[hook_resid_pre(L)][None] + delta_out  # r' per edge
            E = len(idx)
            normed = bridge.blocks[L].ln1(resid.reshape(E * n, s, d)).reshape(E, n, s, d)
            heads = torch.tensor([edges[i].receiver.head.head for i in idx], device=dev)
            which = [edges[i].receiver.which for i in idx]
            qkv = {x: base[hook_input(L, x)][:, :, heads].permute(2, 0, 1, 3).clone() for x in "qkv"}
            for x in "qkv":
                sel = [j for j, w in enumerate(which) if w == x]
                if sel:
                    W = getattr(bridge, f"W_{x.upper()}")[L, heads[sel]].to(dtype)  # [e, d, dh]
                    b = getattr(bridge, f"b_{x.upper()}")[L, heads[sel]].to(dtype)  # [e, dh]
                    qkv[x][sel] = torch.einsum("enpd,edh->enph", normed[sel], W) + b[:, None, None, :]
            z_new = _head_z(bridge, qkv["q"], qkv["k"], qkv["v"])
            z_old = base[hook_z(L)][:, :, heads].permute(2, 0, 1, 3)
            W_O = bridge.W_O[L, heads].to(dtype)  # [E, dh, d]
            mid = (base[hook_resid_pre(L)] + base[hook_attn_out(L)])[None] + \
                torch.einsum("enph,ehd->enpd", z_new - z_old, W_O)
            final = _rest_of_model(bridge, L, mid)
            out[idx] = _metric_at(bridge, _at(positions, final), metric_fn).cpu().double().numpy()
    return out


def _at(positions: Any, x: Any) -> Any:
    """x [E, n, s, ...] -> [E, n, k, ...] at the scored positions."""
    idx = positions.reshape(1, *positions.shape, *([1] * (x.dim() - 3)))
    return x.gather(2, idx.expand(x.shape[0], -1, -1, *x.shape[3:]))


def _metric_at(bridge: Any, final_at: Any, metric_fn: Callable) -> Any:
    """final residual at the scored positions [E, n, k, d] -> metric [E, n]."""
    import torch

    E, n, k, d = final_at.shape
    logits = bridge.unembed(bridge.ln_final(final_at.reshape(E * n, k, d)))
    return metric_fn(logits, torch.arange(k, device=final_at.device).expand(E * n, -1)).reshape(E, n)


def _last_layer(bridge: Any, edges: list, idx: list, base: dict, positions: Any, metric_fn: Callable,
                outputs: Callable, replaced: Callable, out: np.ndarray, budget_bytes: int,
                progress: Callable) -> None:
    """Edges into heads of the last layer, grouped by sender (see the module docstring)."""
    import torch

    cfg = bridge.cfg
    L = cfg.n_layers - 1
    pre = base[hook_resid_pre(L)]
    n, s, d = pre.shape
    k = positions.shape[1]
    H, dh = cfg.n_heads, cfg.d_head
    by_sender: dict = {}
    for i in idx:
        by_sender.setdefault(str(edges[i].sender), []).append(i)
    senders = list(by_sender)
    item = pre.element_size()
    d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * d)
    per_sender = item * n * s * (2 * d + 3 * H * dh)  # r', LN1(r'), the projections
    per_row = item * n * (2 * k * dh + 2 * s * dh + 2 * k * s + 4 * k * d + 4 * k * d_mlp + 3 * k * cfg.d_vocab)
    size = chunk_size(budget_bytes // 2, per_sender)
    row_size = chunk_size(budget_bytes // 2, per_row)
    base_q = _at(positions, base[hook_input(L, "q")][None])[0]  # [n, k, H, dh]
    base_k, base_v = base[hook_input(L, "k")], base[hook_input(L, "v")]
    base_z = _at(positions, base[hook_z(L)][None])[0]  # [n, k, H, dh]
    mid_at = _at(positions, (pre + base[hook_attn_out(L)])[None])[0]  # [n, k, d]
    dev = pre.device
    causal = torch.arange(s, device=dev)[None, None, :] > positions[:, :, None]  # [n, k, s] masked keys
    scale = attn_scale(cfg)
    W = {x: getattr(bridge, f"W_{x.upper()}")[L].to(pre.dtype) for x in "qkv"}  # [H, d, dh]
    b = {x: getattr(bridge, f"b_{x.upper()}")[L].to(pre.dtype) for x in "qkv"}  # [H, dh]
    W_O = bridge.W_O[L].to(pre.dtype)  # [H, dh, d]
    block = bridge.blocks[L]
    has_mlp = not getattr(cfg, "attn_only", False) and hasattr(block, "mlp")
    for j in progress(range(0, len(senders), size), "sender chunks"):
        chunk = senders[j:j + size]
        objs = [edges[by_sender[c][0]].sender for c in chunk]
        r = pre[None] + (replaced(objs) - outputs(base, objs))  # [S, n, s, d]
        S = r.shape[0]
        normed = block.ln1(r.reshape(S * n, s, d)).reshape(S, n, s, d)
        which_needed = {edges[i].receiver.which for c in chunk for i in by_sender[c]}
        proj = {}
        if "q" in which_needed:
            proj["q"] = torch.einsum("snkd,hde->snkhe", _at(positions, normed), W["q"]) + b["q"]
        for x in "kv":
            if x in which_needed:
                proj[x] = torch.einsum("snpd,hde->snphe", normed, W[x]) + b[x]
        all_rows = [(si, i) for si, c in enumerate(chunk) for i in by_sender[c]]
        for r0 in range(0, len(all_rows), row_size):
            rows = all_rows[r0:r0 + row_size]
            sid = torch.tensor([si for si, _ in rows], device=dev)
            head = torch.tensor([edges[i].receiver.head.head for _, i in rows], device=dev)
            which = [edges[i].receiver.which for _, i in rows]

            q, kk, vv = (_pick(x, base_x, head, which, sid, proj) for x, base_x in
                         (("q", base_q), ("k", base_k), ("v", base_v)))
            scores = (q @ kk.transpose(-1, -2) / scale).masked_fill(causal[None], float("-inf"))
            z = torch.softmax(scores, dim=-1) @ vv  # [E, n, k, dh]
            dz = z - base_z[:, :, head].permute(2, 0, 1, 3)
            mid = mid_at[None] + torch.einsum("enkh,ehd->enkd", dz, W_O[head])
            if has_mlp:
                E = mid.shape[0]
                flat = mid.reshape(E * n, k, d)
                mid = (flat + block.mlp(block.ln2(flat))).reshape(E, n, k, d)
            out[[i for _, i in rows]] = _metric_at(bridge, mid, metric_fn).cpu().double().numpy()


def _pick(x: str, base_x: Any, head: Any, which: list[str], sid: Any, proj: dict[str, Any]) -> Any:
    """Input `x` of each row's receiver head [E, n, ., dh]: the base run's, or the patched
    projection for the rows whose edge enters that input."""
    import torch

    v = base_x[:, :, head].permute(2, 0, 1, 3).clone()
    sel = torch.tensor([w == x for w in which], device=v.device)
    if sel.any():
        v[sel] = proj[x][sid[sel], :, :, head[sel]]
    return v
