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
and never changes), an MLP's whole output (its bias and any norm after it included), embed
what enters the residual before block 0.

A norm after the attention (Gemma 2 and 3, OLMo 2) adds post1(P_l) to the residual, P_l =
sum_h z_h W_O[h] + b_O, so a head's write is not a term of its own.  Each receiver then reads
its own copy of every earlier layer's attention output, the heads whose edges into it are
removed replaced inside the norm (as mech.edges.writes takes a head's change, every other head
of the layer at its value in this forward):

    input_v = R - sum_{u not a head, (u, v) removed} D_u
                - sum_l [ post1_l(P_l) - post1_l(P_l - sum_{h in l, (h, v) removed} Dpre_h) ]

with Dpre_h = (z_h - z_h^rep) W_O[h]; without post norms this is the sum above.

Each receiver's input is normalised and projected separately (a head input by its own
head's W_Q, or the W_K / W_V of its key/value head with grouped-query attention); QK-norms,
rotary positions, soft caps and sliding windows are applied as the model does
(mech.block, held to the model's cached activations before use).

Passes, one method each: `circuit_pass` (edge circuits: masks of removed edges),
`gradient_pass` (every edge kept, a probe at every receiver's input), `one_receiver_pass` (one
receiver's input probed or shifted, the other layers the model's own blocks).  `circuits`
evaluates edge circuits (masks [E, senders, receivers]) on a batch of prompts, the circuits
stacked along the batch in chunks of a memory budget; `edge_patches` patches single edges
exactly; `receiver_gradients` / `receiver_gradient` return d(sum of the metric)/d(input_v)
with every edge kept, from a given residual at the embedding (mech.graph.attribution
integrates them).  With `record`, a pass keeps each layer's P_l (attribution linearises the
norm after the attention there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import cost, memory
from ...errors import UnsupportedError
from ...model import architecture
from ...model.bridge import Bridge
from ...model.shape import vocab_out
from ...spec import names
from ...spec.names import hook_resid_post, hook_resid_pre
from ..block import fidelity, read
from ..block.arith import Norm, attend, causal
from ..block.layer import Model, at, block
from ..hooks import logits_bytes
from .carried import carried
from .parts import HeadWeights, Writes, head_weights, norm_of, own_qk
from .structure import Graph

BUDGET = 256 * 2**20  # working memory of one chunk of rows (circuit x prompt)


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
    _heads: dict[int, HeadWeights] = field(default_factory=dict)  # per layer, made on first use

    def heads(self, layer: int) -> HeadWeights:
        """Layer `layer`'s per-head projections (made on first use: a forward through the model's own
        blocks needs none, and a one-receiver gradient one layer's)."""
        if layer not in self._heads:
            self._heads[layer] = head_weights(self.model.layers[layer], self.arch)
        return self._heads[layer]

    def post_norm(self, layer: int) -> Norm | None:
        """The norm after layer `layer`'s attention, as arithmetic (None: none)."""
        post = self.model.layers[layer].post1
        return post if isinstance(post, Norm) else None

    @classmethod
    def build(cls, bridge: Bridge, base: dict[str, Any], positions: Any) -> GraphModel:
        """The checked arithmetic for a batch whose base run cached `parts.cache_names` (mech.block.fidelity);
        UnsupportedError where a norm after the attention is not one harness writes out (its Jacobian
        is needed)."""
        import torch

        arch = architecture.of(bridge)
        ref = base[hook_resid_pre(0)]
        s = int(positions.max()) + 1
        L = arch.n_layers
        trimmed = {k: v[:, :s] for k, v in base.items() if k.startswith(("blocks.", "hook_")) and v.dim() >= 2}
        if "logits" in base:
            trimmed["logits"] = base["logits"][:, :s]
        with torch.no_grad():
            model, w = read.build(bridge, ref.dtype, ref.device, s)
            fidelity.check(model, w, trimmed)
        if hook_resid_post(L - 1) not in trimmed:
            raise UnsupportedError("edge graph: the base run did not cache the final residual")
        gm = cls(Graph.of(bridge), model, arch, s, vocab_out(bridge.cfg))
        if any(lay.post1 is not None and gm.post_norm(i) is None for i, lay in enumerate(model.layers)):
            raise UnsupportedError(f"edge graph ({arch.name}): the norm after the attention is not reproduced "
                                   "as arithmetic, so a head's edge through it cannot be taken")
        return gm

    # ------------------------------------------------------------ one layer
    def attention(self, layer: int, h: Any) -> tuple[Any, Any]:
        """Layer `layer`'s heads from their normalised inputs h [R, s, H, 3, d] (each query head's q, k
        and v input): every head's write z_h W_O[h] [R, s, H, d] and P = their sum + b_O [R, s, d]."""
        import torch

        lay, hw = self.model.layers[layer], self.heads(layer)
        s = h.shape[1]
        q, k, v = (torch.einsum("rshtd,htde->trhse", h, hw.Wqkv) + hw.bqkv).unbind(0)
        q, k = own_qk(lay, self.arch, "q", q, h[:, :, :, 0]), own_qk(lay, self.arch, "k", k, h[:, :, :, 1])
        z = attend(q.contiguous(), k.contiguous(), v.contiguous(), causal(s, lay.window, h), lay.cap)
        out = torch.einsum("rhse,hed->rshd", z, hw.W_O)  # [R, s, H, d]
        return out, out.sum(2) + hw.b_O

    # ------------------------------------------------------------ the passes
    def circuit_pass(self, x0: Any, cur_idx: Any, rep: Writes, removed: Any, positions: Any) -> Any:
        """Logits at the scored positions [R, k, vocab] of R rows of edge circuits: x0 [R, s, d] what
        enters the residual stream (embed's write in this forward); rep the replacement writes (row r
        reads prompt cur_idx[r]); removed [R, U, V] float (1: the edge is removed); positions [R, k]."""
        import torch

        g, arch, m = self.graph, self.arch, self.model
        R, s, d = x0.shape
        H = arch.n_heads
        D = x0.new_empty(R, len(g.senders), s, d)  # sender-major: the senders before a layer are one block
        grad = torch.is_grad_enabled() and removed.requires_grad  # a learned mask: D's blocks kept for its gradient
        blocks: dict[int, Any] = {}  # first sender -> the tensor D was filled from there (with `grad` only)

        def fill(u0: int, block: Any) -> None:
            D[:, u0:u0 + block.shape[1]] = block.detach()
            if grad:
                blocks[u0] = block

        fill(0, (x0 - rep.rows(rep.embed, cur_idx))[:, None])
        posts: list[tuple[int, Any, Norm, Any]] = []  # (first head sender, P, post1, post1(P)) per earlier layer
        linear = removed.new_ones(len(g.senders))  # the senders whose change adds (not inside a post norm)
        for L in range(len(m.layers)):
            if self.post_norm(L) is not None:
                linear[g.senders_before(L):g.senders_before(L) + H] = 0.0

        def take_out(inp: Any, U: int, cols: Any) -> Any:
            """inp minus the removed senders' changes (the first U senders) for the receivers `cols`."""
            M = removed[:, :U, cols]
            if not grad and not bool(M.any()):  # with a gradient, an edge kept whole still has one
                return inp
            lin = M * linear[:U].view(1, U, *([1] * (M.dim() - 2))) if posts else M
            shown = [b for u0, b in blocks.items() if u0 < U]
            if M.dim() == 2:  # one receiver: [R, U]
                inp = inp - carried(lin[:, :, None], D, U, shown).view(R, s, d)
            else:
                V = M.shape[2]
                inp = inp - carried(lin, D, U, shown).view(R, V, s, d).transpose(1, 2)
            for u0, P, post1, out in posts:
                if u0 >= U:
                    break
                Mh = M[:, u0:u0 + H]
                if not grad and not bool(Mh.any()):
                    continue
                Dh = blocks[u0] if grad else D[:, u0:u0 + H]
                if Mh.dim() == 2:
                    inp = inp - (out - post1(P - torch.einsum("rh,rhsd->rsd", Mh, Dh)))
                else:
                    X = P[:, None] - torch.einsum("rhv,rhsd->rvsd", Mh, Dh)  # [R, V, s, d]
                    inp = inp - (out[:, :, None, :] - post1(X).transpose(1, 2))
            return inp

        resid = x0
        for L, lay in enumerate(m.layers):
            U = g.senders_before(L)
            cols, mlp_col = g.layer_receivers(L)
            h = lay.ln1(take_out(resid[:, :, None, :].expand(R, s, 3 * H, d), U, cols)).reshape(R, s, H, 3, d)
            out, P = self.attention(L, h)
            zr = rep.rows(rep.z[L], cur_idx)
            fill(U, (out - torch.einsum("rshe,hed->rshd", zr, self.heads(L).W_O)).transpose(1, 2))
            attn = lay.attn_out(P)
            post1 = self.post_norm(L)
            if post1 is not None:
                posts.append((U, P, post1, attn))
            if lay.mlp is None:
                resid = resid + attn
                continue
            Um = U if arch.parallel else U + H
            mlp_out = lay.mlp(take_out(resid if arch.parallel else resid + attn, Um, mlp_col))
            mr = rep.rows(rep.mlp[L], cur_idx)
            fill(U + H, (mlp_out - (0.0 if mr is None else mr))[:, None])
            resid = resid + attn + mlp_out
        cost.spend(R)
        final = take_out(resid, len(g.senders), len(g.receivers) - 1)
        return m.logits(at(positions, final[None])[0])

    def gradient_pass(self, x0: Any, positions: Any, probes: list[Any], record: dict[int, Any] | None = None) -> Any:
        """Logits at the scored positions [R, k, vocab] with every edge kept, a zero probe (requires_grad)
        added to every receiver's input and appended to `probes` in forward order: per layer [R, s, 3H, d]
        (the head inputs; after the first norm, as an _AfterNorm, where it is arithmetic) and [R, s, d]
        (the MLP), then [R, k, d] (logits).  `record`: receives each layer's P (detached)."""
        import torch

        g, arch, m = self.graph, self.arch, self.model
        R, s, d = x0.shape
        H = arch.n_heads

        def probe(inp: Any) -> Any:
            p = torch.zeros_like(inp, requires_grad=True)
            probes.append(p)
            return inp + p

        resid = x0
        for L, lay in enumerate(m.layers):
            _, mlp_col = g.layer_receivers(L)
            norm = norm_of(lay.ln1)
            if norm is not None:  # every head input reads the same residual: normalise it once, probe after it
                y = lay.ln1(resid)
                h = probe(y[:, :, None, :].expand(R, s, 3 * H, d))
                probes[-1] = _AfterNorm(probes[-1], norm, resid.detach(), y.detach())
            else:
                h = lay.ln1(probe(resid[:, :, None, :].expand(R, s, 3 * H, d)))
            resid = self._rest_of_layer(L, h.reshape(R, s, H, 3, d), resid, probe, record)
        cost.spend(R)
        return m.logits(probe(at(positions, resid[None])[0]))

    def one_receiver_pass(self, x0: Any, positions: Any, v: int, edit: Any, start: int = 0,
                          record: dict[int, Any] | None = None) -> Any:
        """Logits at the scored positions [R, k, vocab] with every edge kept and `edit` ([R, s, d]; [R, k, d]
        for the logits) added to receiver v's input alone: a probe (requires_grad) for its gradient, or a
        shift (an exact edit).  Layers other than v's are the model's own blocks (only those after it
        differentiated); x0 is the residual entering layer `start` (at most v's).  `record`: receives
        each run layer's P (detached)."""
        import torch

        g, arch, m = self.graph, self.arch, self.model
        R, s, d = x0.shape
        H = arch.n_heads
        lv = g.receiver_layer(v)
        if start > lv:
            raise ValueError("a forward that starts inside the model starts at or before the receiver's layer")
        resid = x0
        for L in range(start, len(m.layers)):
            lay = m.layers[L]
            keep: dict[str, Any] | None = {} if record is not None else None
            if L != lv:
                with torch.set_grad_enabled(L > lv and torch.is_grad_enabled()):
                    resid = block(m, lay, resid, causal(s, lay.window, x0), keep)
                if record is not None and keep is not None:
                    record[L] = keep["P"].detach()
                continue
            cols, mlp_col = g.layer_receivers(L)
            if cols.start <= v < cols.stop:  # the probed receiver's copy alone carries the edit
                one = torch.zeros(3 * H, 1, dtype=x0.dtype, device=x0.device)
                one[v - cols.start] = 1.0
                h = lay.ln1(resid[:, :, None, :] + one * edit[:, :, None, :])
            else:
                h = lay.ln1(resid)[:, :, None, :].expand(R, s, 3 * H, d)
            resid = self._rest_of_layer(L, h.reshape(R, s, H, 3, d), resid,
                                        (lambda x: x + edit) if v == mlp_col else (lambda x: x), record)
        cost.spend(R, cost.layers_from(start, arch.n_layers))
        final_at = at(positions, resid[None])[0]
        return m.logits(final_at + edit if lv == arch.n_layers else final_at)

    def _rest_of_layer(self, layer: int, h: Any, resid: Any, mlp_input: Callable[[Any], Any],
                       record: dict[int, Any] | None) -> Any:
        """resid_post of layer `layer` with every edge kept, from its heads' normalised inputs h [R, s, H, 3, d]
        and its input resid [R, s, d]; the MLP reads mlp_input(its input) (a probe or an edit, or the
        input itself); `record` receives P."""
        lay = self.model.layers[layer]
        _, P = self.attention(layer, h)
        if record is not None:
            record[layer] = P.detach()
        attn = lay.attn_out(P)
        if lay.mlp is None:
            return resid + attn
        return resid + attn + lay.mlp(mlp_input(resid if self.arch.parallel else resid + attn))

    # ------------------------------------------------------------ edge circuits and single edges
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
        size = max(1, budget // self.row_bytes(x.element_size(), int(positions.shape[1])))
        removed = torch.from_numpy(~keep & self.graph.adjacency[None]).to(device=x.device)
        chunks = list(range(0, E * n, size))
        with torch.no_grad():
            for lo in (progress(chunks, "edge circuit chunks") if progress else chunks):
                rows = torch.arange(lo, min(E * n, lo + size), device=x.device)
                e, i = rows // n, rows % n
                logits = self.circuit_pass(x[i], i, rep, removed[e].to(x.dtype), positions[i])
                out[lo:lo + len(rows)] = metric(logits, i).double().cpu().numpy()
        return out.reshape(E, n)

    def edge_patches(self, base: Writes, rep: Writes, entering: Callable[[int], Any], edges: list[tuple[int, int]],
                     positions: Any, metric: Callable[[Any, Any], Any], budget: int | None = None) -> np.ndarray:
        """The metric [E, n] with one edge (u, v) patched at a time: receiver v reads its input with
        sender u's write replaced by `rep`'s (input_v = R - (base_u - rep_u), inside the norm after the
        attention where there is one: sender_delta), every other edge kept.  Exact, and run from v's
        layer on: `entering(layer)` gives the base run's residual entering a layer [n, >= s, d] (n_layers:
        the final residual), nothing before v's layer changes, and the layers after it are the model's
        own blocks.  Prompts in chunks of `budget` bytes."""
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
                    logits = self.one_receiver_pass(x[idx], positions[idx], v, shift, start=lv)
                    out[e, lo:lo + len(idx)] = metric(logits, idx).double().cpu().numpy()
        return out

    def sender_delta(self, base: Writes, rep: Writes, sender: names.Node, idx: Any = None) -> Any:
        """[n, s, d]: one sender's write in `base` minus its write in `rep` (prompts `idx`, default all):
        a head's (z_base - z_rep) W_O[h] (through the norm after the attention where there is one:
        post1(P) - post1(P - that), P the layer's attention sum in `base`), an MLP's output, embed's
        write."""
        import torch

        idx = torch.arange(base.embed.shape[0], device=base.embed.device) if idx is None else idx
        if isinstance(sender, names.Head):
            h, layer = sender.head, sender.layer
            W_O = self.heads(layer).W_O
            zb = base.rows(base.z[layer], idx)
            dpre = (zb[:, :, h] - rep.rows(rep.z[layer], idx)[:, :, h]) @ W_O[h]
            post1 = self.post_norm(layer)
            if post1 is None:
                return dpre
            P = torch.einsum("nshe,hed->nsd", zb, W_O) + self.heads(layer).b_O
            return post1(P) - post1(P - dpre)
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

    def row_bytes(self, item: int, k: int) -> int:
        """Working memory of one row (a generous estimate): the senders' D, a layer's per-receiver
        inputs and their projections, the attention scores, the MLP; with norms after the attention,
        the receivers' own copies of a layer's attention output; and the logits at the k scored
        positions with the float64 temporaries of their metric (hooks.logits_bytes: at a 262k
        vocabulary most of a row)."""
        g, a = self.graph, self.arch
        s, d = self.s, a.d_model
        d_mlp = 4 * d
        posts = 3 * (3 * a.n_heads + 1) * d if a.post_norms else 0
        return item * s * (len(g.senders) * d + 3 * a.n_heads * (3 * d + 2 * a.d_head) + 2 * a.n_heads * s
                           + 3 * d_mlp + 4 * d + posts) + logits_bytes(k, self.vocab)

    # ------------------------------------------------------------ gradients
    def receiver_gradient(self, x0: Any, positions: Any, metric: Callable[[Any, Any], Any], v: int,
                          record: dict[int, Any] | None = None) -> Any:
        """d(sum over rows of the metric)/d(input_v) of the one receiver v with every edge kept, from the
        residual x0 [n, s, d] at the embedding: [n, s, d] ([n, k, d] for the logits).  One forward and a
        backward pass from the logits to v's layer (nothing before v's layer is differentiated).
        `record`: receives every layer's P of that forward."""
        import torch

        idx = torch.arange(x0.shape[0], device=x0.device)
        lv = self.graph.receiver_layer(v)
        shape = (x0.shape[0], positions.shape[1], x0.shape[2]) if lv == self.arch.n_layers else x0.shape
        p = torch.zeros(shape, dtype=x0.dtype, device=x0.device, requires_grad=True)
        with torch.enable_grad():
            logits = self.one_receiver_pass(x0.detach(), positions, v, p, record=record)
            (grad,) = torch.autograd.grad(metric(logits, idx).sum(), [p], allow_unused=True)
        cost.spend(x0.shape[0], cost.layers_from(lv, self.arch.n_layers))
        return torch.zeros_like(p) if grad is None else grad.detach()

    def receiver_gradients(self, x0: Any, positions: Any, metric: Callable[[Any, Any], Any],
                           record: dict[int, Any] | None = None) -> list[Any]:
        """d(sum over rows of the metric)/d(input_v) with every edge kept, from the residual x0 [n, s, d]
        at the embedding: per layer [n, s, 3H, d] and [n, s, d] (the MLP, when there is one), then
        [n, k, d] (logits): the order of `gradient_pass`'s probes.  `record`: receives every layer's P."""
        import torch

        idx = torch.arange(x0.shape[0], device=x0.device)
        probes: list[Any] = []
        with torch.enable_grad():
            logits = self.gradient_pass(x0.detach(), positions, probes, record)
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
