"""Forward passes over a model's edge graph (mech.graph.structure): every receiver reads its own input.

In the model each layer's heads and MLP read one shared residual stream.  Here every
receiver v (a head's q, k or v input, an MLP's input, the logits) gets its own copy, so
that an edge circuit can hold each edge on or off and a gradient can be taken at each
receiver's input.  With R the residual stream of the run itself (the running sum of every
sender's write in this forward, and the biases),

    input_v = R - sum over senders u with (u, v) not kept of  D_u,    D_u = out_u - rep_u

where out_u is u's write in this forward and rep_u its replacement write: u's write in the
corrupted run (resample), its per-position mean over reference prompts (mean), or 0 (zero).
So a removed edge carries the replacement and a kept one the circuit's own output
(upstream changes propagate through kept edges), the definition of ACDC, auto-circuit and
TransformerLens's `faithfulness`.  With every edge kept this is the model's forward pass;
with none kept every receiver reads the sum of the replacement writes (with resample, the
corrupted run).  Writes: a head's z_h W_O[h] (b_O, shared by the layer's heads, stays in R
and never changes), an MLP's whole output (its bias included), embed what enters the
residual before block 0.

Each receiver's input is normalised and projected separately (a head input by its own
head's W_Q, or the W_K / W_V of its key/value head with grouped-query attention); rotary
positions, soft caps and sliding windows are applied as the model does (mech.block.arith,
held to the model's cached activations before use).  A norm after the attention (Gemma 2)
makes a head's write depend on the other heads of its layer: such models are refused.

`GraphModel.circuits` evaluates edge circuits (masks [E, senders, receivers]) on a batch of
prompts, the circuits stacked along the batch in chunks of a memory budget, and returns
the metric of every (circuit, prompt).  `GraphModel.receiver_gradients` returns
d(sum of the metric)/d(input_v) of every receiver at every position with every edge kept,
from a given residual at the embedding (mech.graph.attribution integrates it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import cost, memory
from ...errors import UnsupportedError
from ...model import architecture
from ...model.shape import vocab_out
from ...spec import names
from ...spec.names import hook_mlp_out, hook_resid_post, hook_resid_pre, hook_z
from ..block import fidelity, read
from ..block.arith import Norm, attend, causal
from ..block.layer import Layer, Model, at, block
from ..edges import writes
from ..edges.sets import cache_names as block_cache_names
from .structure import Graph

BUDGET = 256 * 2**20  # working memory of one chunk of rows (circuit x prompt)


def cache_names(n_layers: int, has_mlp: bool) -> list[str]:
    """Hooks a base run caches for graph runs: every sender's activation (embed, z, MLP outputs)
    and what mech.block.fidelity.check holds the arithmetic to."""
    out = block_cache_names(n_layers)
    return out + ([hook_mlp_out(layer) for layer in range(n_layers)] if has_mlp else [])


@dataclass
class _HeadWeights:
    """One layer's per-head projections (norm1's affine folded in, mech.block.read): Wqkv
    [H, 3, d, dh], each head's q, k and v (k and v repeated from each query head's key/value head),
    before any QK-norm, scale or rotation, and their biases bqkv [3, 1, H, 1, dh]; W_O [H, dh, d],
    b_O [d]."""

    Wqkv: Any
    bqkv: Any
    W_O: Any
    b_O: Any


def _head_weights(lay: Layer, arch: architecture.Architecture) -> _HeadWeights:
    import torch

    H, Hkv, dh, d = arch.n_heads, lay.n_kv, arch.d_head, arch.d_model
    W, b = lay.proj["qkv"].matrix()
    if b is None:
        b = W.new_zeros(W.shape[1])
    hq, hk = H * dh, Hkv * dh
    kv = torch.tensor([arch.kv_head(h) for h in range(H)], device=W.device)

    def per_head(cols: slice, heads: int, pick: Any = None) -> tuple[Any, Any]:
        Wx = W[:, cols].reshape(d, heads, dh).permute(1, 0, 2)
        bx = b[cols].reshape(heads, dh)
        return (Wx, bx) if pick is None else (Wx[pick], bx[pick])

    (Wq, bq), (Wk, bk), (Wv, bv) = (per_head(slice(0, hq), H), per_head(slice(hq, hq + hk), Hkv, kv),
                                    per_head(slice(hq + hk, hq + 2 * hk), Hkv, kv))
    W_O, b_O = lay.out.matrix()
    return _HeadWeights(torch.stack([Wq, Wk, Wv], 1).contiguous(), torch.stack([bq, bk, bv], 0)[:, None, :, None, :],
                        W_O.reshape(H, dh, d), b_O if b_O is not None else W_O.new_zeros(d))


def _own_qk(lay: Layer, arch: architecture.Architecture, which: str, p: Any, inputs: Any) -> Any:
    """Queries or keys [R, H, s, dh] as the scores read them, each query head's from its own input:
    `p` its projection, `inputs` [R, s, H, d] the normalised inputs it was projected from.  A QK-norm
    over the whole projection reads every head's projection of that input (so each receiver's is
    projected onto every head: H times the work, exact); otherwise finish per head."""
    if arch.qk_norm != "projection":
        return lay.qk(which, p, 1)
    import torch

    heads = arch.n_heads if which == "q" else lay.n_kv
    full = lay.proj[which](inputs).view(*inputs.shape[:3], heads, arch.d_head)  # [R, s, H, heads, dh]
    full = lay.finish(which, full, 3)
    pick = torch.tensor([h if which == "q" else arch.kv_head(h) for h in range(arch.n_heads)], device=p.device)
    own = full.gather(3, pick.view(1, 1, -1, 1, 1).expand(*full.shape[:3], 1, full.shape[-1])).squeeze(3)
    return lay.rotate(own.transpose(1, 2))


@dataclass
class Writes:
    """Every sender's write in one run, as the graph forward reads it: embed [n, s, d], per layer z
    [n, s, H, dh] (a head's write is z_h W_O[h]) and MLP output [n, s, d] (None: zeros).  A tensor with
    first dimension 1 is shared by every prompt (a mean)."""

    embed: Any
    z: list[Any]
    mlp: list[Any]

    def zeros(self) -> Writes:
        """Zero writes of the same shapes (the zero replacement), shared by every prompt."""
        return Writes(self.embed[:1] * 0, [z[:1] * 0 for z in self.z], [None if m is None else m[:1] * 0
                                                                         for m in self.mlp])

    def first(self, k: int) -> Writes:
        """The writes of the first k prompts (a shared mean stays shared)."""
        def cut(x: Any) -> Any:
            return x if x is None or x.shape[0] == 1 else x[:k]
        return Writes(cut(self.embed), [cut(z) for z in self.z], [cut(m) for m in self.mlp])

    def rows(self, x: Any, idx: Any) -> Any:
        if x is None:
            return None
        return x.expand(len(idx), *x.shape[1:]) if x.shape[0] == 1 else x[idx]


def run_writes(bridge: Any, cache: dict[str, Any], s: int, dtype: Any, layers: set[int] | None = None) -> Writes:
    """The senders' writes in the run `cache` holds, at positions < s; with `layers`, those of the
    senders in these layers only (and embed; the other layers' entries are None)."""
    L = int(bridge.cfg.n_layers)
    embed = writes.activation(bridge, cache, names.Embed())[:, :s].to(dtype)
    z = [cache[hook_z(layer)][:, :s].to(dtype) if layers is None or layer in layers else None for layer in range(L)]
    mlp = [cache[hook_mlp_out(layer)][:, :s].to(dtype) if hook_mlp_out(layer) in cache
           and (layers is None or layer in layers) else None for layer in range(L)]
    return Writes(embed, z, mlp)


def _norm_of(ln: Any) -> Norm | None:
    """The norm whose `standardize` a layer's ln1 is (None: the model's own module)."""
    owner = getattr(ln, "__self__", None)
    return owner if isinstance(owner, Norm) and ln.__func__ is Norm.standardize else None


@dataclass
class _AfterNorm:
    """A probe added after a layer's first norm, shared by its head inputs: the gradient at the
    inputs is the norm's VJP at x (its input) of the probe's gradient."""

    probe: Any  # [R, s, 3H, d]
    norm: Norm
    x: Any  # [R, s, d]
    y: Any  # standardize(x)


@dataclass
class GraphModel:
    """The model's arithmetic with one input per receiver (module docstring)."""

    graph: Graph
    model: Model
    arch: architecture.Architecture
    s: int  # positions computed: up to the last scored one
    vocab: int = 0  # the logits' width
    _heads: dict[int, _HeadWeights] = field(default_factory=dict)  # per layer, made on first use

    def heads(self, layer: int) -> _HeadWeights:
        """Layer `layer`'s per-head projections (made on first use: a forward through the model's own
        blocks needs none, and a one-receiver gradient one layer's)."""
        if layer not in self._heads:
            self._heads[layer] = _head_weights(self.model.layers[layer], self.arch)
        return self._heads[layer]

    @classmethod
    def build(cls, bridge: Any, base: dict[str, Any], positions: Any) -> GraphModel:
        """The checked arithmetic for a batch whose base run cached `cache_names` (mech.block.fidelity.check);
        UnsupportedError for a model whose heads' writes are not separable (norms after the attention)."""
        arch = architecture.of(bridge)
        if arch.post_norms:
            raise UnsupportedError(f"edge graph ({arch.name}): a norm after the attention makes each head's write "
                                   "depend on the other heads of its layer, so an edge from one head is not defined; "
                                   "edge circuits and attribution scores are not offered for this model")
        ref = base[hook_resid_pre(0)]
        s = int(positions.max()) + 1
        L = arch.n_layers
        trimmed = {k: v[:, :s] for k, v in base.items() if k.startswith(("blocks.", "hook_"))
                   and v.dim() >= 2}
        if "logits" in base:
            trimmed["logits"] = base["logits"][:, :s]
        import torch

        with torch.no_grad():
            model, w = read.build(bridge, ref.dtype, ref.device, s)
            fidelity.check(model, w, trimmed)
        if hook_resid_post(L - 1) not in trimmed:
            raise UnsupportedError("edge graph: the base run did not cache the final residual")
        return cls(Graph.of(bridge), model, arch, s, vocab_out(bridge.cfg))

    # ------------------------------------------------------------ the forward
    def forward(self, x0: Any, cur_idx: Any, rep: Writes | None, removed: Any | None, positions: Any,
                probes: list[Any] | None = None, only: int | None = None, shift: Any = None,
                start: int = 0) -> Any:
        """Logits at the scored positions [R, k, vocab] of R rows.

        x0 [R, s, d]: what enters the residual stream (embed's write in this forward); rep: the
        replacement writes (indexed by `cur_idx` [R], each row's prompt); removed [R, U, V] float
        (1: the edge is removed) or None (every edge kept); positions [R, k].  `probes`: a list
        to which a zero tensor added to every receiver's input is appended (requires_grad), in
        forward order: per layer [R, s, 3H, d] (the head inputs) and [R, s, d] (the MLP), then
        [R, k, d] (logits).  `only` (a receiver index, with `probes` and every edge kept): one probe
        [R, s, d] (logits: [R, k, d]) added to that receiver's input alone, so that a backward pass
        reaches back to that receiver's layer only; with `shift` ([R, s, d] or [R, k, d]) that tensor
        is added instead of a probe (an edit of the receiver's input, no gradient).  `start` (with
        `only`): x0 is the residual entering layer `start` (at most the receiver's layer), the layers
        before it are not run."""
        import torch

        g, arch, m = self.graph, self.arch, self.model
        R, s, d = x0.shape
        H = arch.n_heads
        D = None  # [R, senders, s, d]: sender-major, so that the senders before a layer are one block
        if removed is not None:
            D = x0.new_empty(R, len(g.senders), s, d)
            D[:, 0] = x0 - rep.rows(rep.embed, cur_idx)  # type: ignore[union-attr]
        resid = x0
        # one probed receiver with every edge kept: the other layers are the model's own blocks
        # (before the receiver's layer without gradients), only the probed layer runs per receiver
        dense = only if D is None and probes is not None else None
        lv = g.receiver_layer(dense) if dense is not None else -1
        if start and (dense is None or start > lv):
            raise ValueError("a forward that starts inside the model is one probed receiver's, at or before its layer")

        def take_out(inp: Any, U: int, cols: Any) -> Any:
            """inp minus the removed senders' D (the first U senders) for the receivers `cols`."""
            if D is None:
                return inp
            M = removed[:, :U, cols]  # type: ignore[index]
            if not bool(M.any()):
                return inp
            sent = D[:, :U].reshape(R, U, s * d)  # a view: no copy
            if M.dim() == 2:  # one receiver: [R, U]
                return inp - torch.bmm(M[:, None, :], sent).view(R, s, d)
            V = M.shape[2]
            return inp - torch.bmm(M.transpose(1, 2), sent).view(R, V, s, d).transpose(1, 2)

        def wanted(first: int, stop: int) -> bool:
            """Whether receivers first..stop-1 are probed."""
            return probes is not None and (only is None or first <= only < stop)

        def probe(inp: Any, want: bool = True) -> Any:
            if probes is None or not want:
                return inp
            p = shift if shift is not None else torch.zeros_like(inp, requires_grad=True)
            probes.append(p)
            return inp + p

        for L, lay in enumerate(m.layers):
            if L < start:
                continue
            if dense is not None and L != lv:
                with torch.set_grad_enabled(L > lv and torch.is_grad_enabled()):
                    resid = block(m, lay, resid, causal(s, lay.window, x0))
                continue
            hw = self.heads(L)
            U = g.senders_before(L)
            cols, mlp_col = g.layer_receivers(L)
            norm = _norm_of(lay.ln1)
            if D is None and only is not None:
                # every head input reads the same residual: normalise it once; the probed receiver's
                # copy alone carries the probe
                x = resid[:, :, None, :].expand(R, s, 3 * H, d)
                if wanted(cols.start, cols.stop):
                    p = shift if shift is not None else torch.zeros_like(resid, requires_grad=True)
                    probes.append(p)  # type: ignore[union-attr]
                    one = torch.zeros(3 * H, 1, dtype=x.dtype, device=x.device)
                    one[only - cols.start] = 1.0
                    h = lay.ln1(x + one * p[:, :, None, :])
                else:
                    h = lay.ln1(resid)[:, :, None, :].expand(R, s, 3 * H, d)
            elif D is None and probes is not None and norm is not None:
                # every head input reads the same residual: normalise it once and probe after the norm
                # (receiver_gradients takes the gradient back through the norm, _Norm.standardize_vjp)
                y = lay.ln1(resid)
                h = probe(y[:, :, None, :].expand(R, s, 3 * H, d))
                probes[-1] = _AfterNorm(probes[-1], norm, resid.detach(), y.detach())
            else:
                h = lay.ln1(probe(take_out(resid[:, :, None, :].expand(R, s, 3 * H, d), U, cols)))
            h = h.reshape(R, s, H, 3, d)  # each head's q, k and v input, in receiver order
            q, k, v = (torch.einsum("rshtd,htde->trhse", h, hw.Wqkv) + hw.bqkv).unbind(0)
            q, k = _own_qk(lay, arch, "q", q, h[:, :, :, 0]), _own_qk(lay, arch, "k", k, h[:, :, :, 1])
            z = attend(q.contiguous(), k.contiguous(), v.contiguous(), causal(s, lay.window, x0), lay.cap)
            out = torch.einsum("rhse,hed->rshd", z, hw.W_O)  # [R, s, H, d]
            attn = out.sum(2) + hw.b_O
            if D is not None:
                zr = rep.rows(rep.z[L], cur_idx)  # type: ignore[union-attr]
                D[:, U:U + H] = (out - torch.einsum("rshe,hed->rshd", zr, hw.W_O)).transpose(1, 2)
            if lay.mlp is None:
                resid = resid + attn
                continue
            Um = U if arch.parallel else U + H
            mlp_in = take_out(resid if arch.parallel else resid + attn, Um, mlp_col)
            mlp_out = lay.mlp(probe(mlp_in, mlp_col is not None and wanted(mlp_col, mlp_col + 1)))
            if D is not None:
                mr = rep.rows(rep.mlp[L], cur_idx)  # type: ignore[union-attr]
                D[:, U + H] = mlp_out - (0.0 if mr is None else mr)
            resid = resid + attn + mlp_out
        cost.spend(R, cost.layers_from(start, arch.n_layers))
        final = take_out(resid, len(g.senders), len(g.receivers) - 1)
        final_at = at(positions, final[None])[0]  # [R, k, d]
        return m.logits(probe(final_at, wanted(len(g.receivers) - 1, len(g.receivers))))

    # ------------------------------------------------------------ edge circuits
    def circuits(self, clean: Writes, rep: Writes, keep: np.ndarray, positions: Any,
                 metric: Callable[[Any, Any], Any], budget: int | None = None,
                 progress: Callable[..., Any] | None = None) -> np.ndarray:
        """The metric [E, n] of each edge circuit `keep` [E, U, V] (bool: the edges kept) on the n
        prompts; `metric(logits_at [R, k, vocab], prompt index [R]) -> [R]`.  Rows (circuit,
        prompt) run in chunks of `budget` bytes."""
        import torch

        budget = memory.working(BUDGET) if budget is None else budget
        E = keep.shape[0]
        n = clean.embed.shape[0]
        out = np.zeros(E * n)
        x = clean.embed
        per_row = self.row_bytes(x.element_size())
        size = max(1, budget // per_row)
        removed = torch.from_numpy(~keep & self.graph.adjacency[None]).to(device=x.device)
        chunks = list(range(0, E * n, size))
        with torch.no_grad():
            for lo in (progress(chunks, "edge circuit chunks") if progress else chunks):
                rows = torch.arange(lo, min(E * n, lo + size), device=x.device)
                e, i = rows // n, rows % n
                logits = self.forward(x[i], i, rep, removed[e].to(x.dtype), positions[i])
                out[lo:lo + len(rows)] = metric(logits, i).double().cpu().numpy()
        return out.reshape(E, n)

    def edge_patches(self, base: Writes, rep: Writes, entering: Callable[[int], Any], edges: list[tuple[int, int]],
                     positions: Any, metric: Callable[[Any, Any], Any], budget: int | None = None) -> np.ndarray:
        """The metric [E, n] with one edge (u, v) patched at a time: receiver v reads its input with
        sender u's write replaced by `rep`'s (input_v = R - (base_u - rep_u)), every other edge kept.
        Exact, and run from v's layer on: `entering(layer)` gives the base run's residual entering a
        layer [n, >= s, d] (n_layers: the final residual), nothing before v's layer changes, and the
        layers after it are the model's own blocks.  Prompts in chunks of `budget` bytes."""
        import torch

        g, L = self.graph, self.arch.n_layers
        budget = memory.working(BUDGET) if budget is None else budget
        n = base.embed.shape[0]
        size = max(1, budget // self.dense_row_bytes(base.embed.element_size()))
        out = np.zeros((len(edges), n))
        with torch.no_grad():
            for e, (u, v) in enumerate(edges):
                lv = g.receiver_layer(v)
                x = entering(lv)[:, :self.s]
                delta = self.sender_delta(base, rep, g.senders[u])
                for lo in range(0, n, size):
                    idx = torch.arange(lo, min(n, lo + size), device=x.device)
                    shift = -delta[idx]
                    if lv == L:  # the logits read the final residual at the scored positions
                        shift = at(positions[idx], shift[None])[0]
                    logits = self.forward(x[idx], idx, None, None, positions[idx], probes=[], only=v, shift=shift,
                                          start=lv)
                    out[e, lo:lo + len(idx)] = metric(logits, idx).double().cpu().numpy()
        return out

    def sender_delta(self, base: Writes, rep: Writes, sender: names.Node, idx: Any = None) -> Any:
        """[n, s, d]: one sender's write in `base` minus its write in `rep` (prompts `idx`, default all):
        a head's (z_base - z_rep) W_O[h], an MLP's output, embed's write."""
        import torch

        idx = torch.arange(base.embed.shape[0], device=base.embed.device) if idx is None else idx
        if isinstance(sender, names.Head):
            h, z = sender.head, sender.layer
            return (base.rows(base.z[z], idx)[:, :, h] - rep.rows(rep.z[z], idx)[:, :, h]) @ self.heads(z).W_O[h]
        if isinstance(sender, names.Mlp):
            bm, rm = base.rows(base.mlp[sender.layer], idx), rep.rows(rep.mlp[sender.layer], idx)
            return bm - (0.0 if rm is None else rm)
        return base.rows(base.embed, idx) - rep.rows(rep.embed, idx)

    def dense_row_bytes(self, item: int) -> int:
        """A generous estimate of one prompt's working memory in a forward through the model's own
        blocks (the residual, q, k, v, attention scores and output, the MLP's hidden units per layer,
        one layer's at a time) and its logits at every position."""
        a, s = self.arch, self.s
        d, H = a.d_model, a.n_heads
        return item * s * (8 * d + 4 * 4 * d + 3 * H * s + 3 * self.vocab)

    def row_bytes(self, item: int) -> int:
        """Working memory of one row (a generous estimate): the senders' D, a layer's per-receiver
        inputs and their projections, the attention scores, the MLP and the logits."""
        g, a = self.graph, self.arch
        s, d = self.s, a.d_model
        d_mlp = 4 * d
        return item * s * (len(g.senders) * d + 3 * a.n_heads * (3 * d + 2 * a.d_head) + 2 * a.n_heads * s
                           + 3 * d_mlp + 4 * d)

    # ------------------------------------------------------------ gradients
    def receiver_gradient(self, x0: Any, positions: Any, metric: Callable[[Any, Any], Any], v: int) -> Any:
        """d(sum over rows of the metric)/d(input_v) of the one receiver v with every edge kept, from the
        residual x0 [n, s, d] at the embedding: [n, s, d] ([n, k, d] for the logits).  One forward and a
        backward pass from the logits to v's layer (nothing before v's layer is differentiated)."""
        import torch

        idx = torch.arange(x0.shape[0], device=x0.device)
        probes: list[Any] = []
        with torch.enable_grad():
            logits = self.forward(x0.detach(), idx, None, None, positions, probes, only=v)
            (grad,) = torch.autograd.grad(metric(logits, idx).sum(), probes, allow_unused=True)
        cost.spend(x0.shape[0], cost.layers_from(self.graph.receiver_layer(v), self.arch.n_layers))
        return torch.zeros_like(probes[0]) if grad is None else grad.detach()

    def receiver_gradients(self, x0: Any, positions: Any, metric: Callable[[Any, Any], Any]) -> list[Any]:
        """d(sum over rows of the metric)/d(input_v) with every edge kept, from the residual x0 [n, s, d]
        at the embedding: per layer [n, s, 3H, d] and [n, s, d] (the MLP, when there is one), then
        [n, k, d] (logits): the order of `forward`'s probes."""
        import torch

        idx = torch.arange(x0.shape[0], device=x0.device)
        probes: list[Any] = []
        with torch.enable_grad():
            logits = self.forward(x0.detach(), idx, None, None, positions, probes)
            total = metric(logits, idx).sum()
            leaves = [p.probe if isinstance(p, _AfterNorm) else p for p in probes]
            grads = torch.autograd.grad(total, leaves, allow_unused=True)
        cost.spend(x0.shape[0])
        out = []
        for p, leaf, gr in zip(probes, leaves, grads, strict=True):
            gr = torch.zeros_like(leaf) if gr is None else gr.detach()
            out.append(p.norm.standardize_vjp(p.y[:, :, None], p.x[:, :, None], gr) if isinstance(p, _AfterNorm)
                       else gr)
        return out
