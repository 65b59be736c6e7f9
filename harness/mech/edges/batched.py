"""Batched exact edge patching: many edges per pass, each starting at its
receiver's layer, the metric computed only at the scored positions.

Same definition as patching.py (the per-edge reference).  For an edge
A -> B.x with B a head of layer L, and base/source caches of one prompt batch:

    r'      = resid_pre_L + D_A                       (D_A: the sender's change of write, mech.edges.writes)
    x_B'    = norm1_L(r') W_x[B] + b_x[B]             (the other two inputs of B from the base run;
                                                       k, v: B's key/value head's weights)
    z_B'    = softmax(cap(scale rot(q_B') rot(k_B')^T) + mask_L) v_B'
    P_L'    = P_L(base) + (z_B' - z_B(base)) W_O[B]   (P: the attention sum before any post norm)
    post_L' = finish(resid_pre_L, post1(P_L'))         (mech.block.arith: + MLP, sequential or parallel)

then blocks L+1.. run on post_L', and ln_final + unembed only at the scored
positions.  `-> logits` edges swap the final residual directly.  Nothing below
layer L is recomputed, and every other head of layer L keeps its cached output
(only B's inputs change, and B's output is all that its inputs affect).

What one patched variant (edge) pays for, and what is shared:

* LN1_L(r') depends on the sender only: it is computed once per sender and
  projected onto every receiver head's q/k/v at once, giving a bank
  [base inputs of the H heads; patched inputs of the H heads per sender] that
  each edge indexes for its three inputs;
* receiver head B's attention alone: queries at the scored positions only when
  L is the last layer (nothing reads the other positions), at every position
  otherwise (later layers' keys and values read them); the other heads' outputs
  come from the cache (mid_L(base));
* layer L's MLP, then the blocks after L in full, at every position (exact:
  their attention needs keys and values everywhere), except the last block,
  whose queries, attention output, MLP and unembedding are computed at the
  scored positions only (keys and values at every position);
* positions after the last scored one are never computed (causal attention:
  nothing scored reads them).

The arithmetic is mech.block.arith' (norm affines folded into the linear map after them;
ln_final's not, so that W_U, often the tied embedding, is used without a copy; oneDNN's linear
with the MLP's activation fused on the CPU in float32), read from the bridge by
mech.block.read and held to the model on two prompts of the base run before the sweep
(mech.block.fidelity): a norm, MLP or unembedding that does not reproduce the model's module
falls back to calling it; attention or a block that does not reproduce the cache raises
UnsupportedError instead of giving wrong numbers (the per-edge path then runs instead).

Edges are stacked along the batch dimension in chunks whose size follows a
memory budget (bytes per edge estimated from the shapes, `bytes_per_edge`, and
capped at CHUNK_POSITIONS query positions so that a chunk stays cache-sized), so
peak memory is bounded by the budget (or one edge's working set, if larger), not
by the number of edges.  Per-layer constants (the base banks, resid_mid) are the
size of a few cached activations.

`benchmarks/edge_sweep.py` measures the sweep against TransformerLens and against
the per-edge path on the same model and prompts (docs/performance.md has the numbers).

Devices: every tensor made here is made on the device of the cached
activations (the model's), including index tensors; `positions` are moved there;
the per-edge metrics come back to the CPU as numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import cost
from ...errors import UnsupportedError
from ...model import metrics
from ...model.bridge import Bridge
from ...spec import names
from ...spec.names import hook_attn_out, hook_attn_sum, hook_input, hook_resid_post, hook_resid_pre, hook_z
from ...spec.vocabulary import REPLACEMENTS, Direction, Replacement
from .. import hooks
from ..block import fidelity, read
from ..block.arith import attend, causal, mask
from ..block.layer import Layer, Model, at, block, block_at
from .deltas import Deltas
from .sets import bytes_per_edge, cache_names, chunk_size, patch_cost

# At most this many query positions (prompts x positions) per chunk of patched variants:
# larger chunks were no faster on the benchmark model (its products are large enough by
# then) and only hold more memory.
CHUNK_POSITIONS = 4096


# ----------------------------------------------------------------------------------------------
# The sweep


@dataclass
class _Sweep:
    """What every group of edges needs: the checked model arithmetic, the trimmed base cache,
    the scored positions [n, k], masks, and where the metrics go."""

    model: Model
    base: dict[str, Any]
    positions: Any
    metric_fn: Callable[..., Any]
    out: np.ndarray
    budget: int
    delta: Deltas  # senders -> [S, n, s, d]: the change of each sender's write
    masks: list[Any]  # per layer [s, s] additive: causal, within the layer's sliding window
    scored_masks: list[Any]  # per layer [n, k, s] additive: the same for the scored queries
    d_mlp: int
    vocab: int  # the logits computed at a scored position: the vocabulary's, or len(tokens)
    tokens: Any = None  # [n, k, c] token ids: only their logits are computed (Model.logits_of)
    n_layers: int = 0  # the model's layers (`model` may hold none: edges into the logits read none)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(n prompts, s positions computed, k scored positions, d_model)."""
        n, s, d = self.base[hook_resid_pre(0)].shape
        return n, s, self.positions.shape[1], d

    def finish(self, final_at: Any, idx: list[int]) -> None:
        """Final residual at the scored positions [E, n, k, d] -> the metric of each variant, into out[idx]."""
        import torch

        E, n, k, _ = final_at.shape
        logits = self.model.logits(final_at) if self.tokens is None else self.model.logits_of(final_at, self.tokens)
        pos = torch.arange(k, device=final_at.device).expand(E * n, -1)
        vals = self.metric_fn(logits.reshape(E * n, k, logits.shape[-1]), pos).reshape(E, *self.out.shape[1:])
        self.out[idx] = vals.cpu().double().numpy()


def silent(items: Any, label: str) -> Any:
    """No progress lines: the items themselves."""
    return items


def checked_model(bridge: Bridge, check: dict[str, Any], layers: bool = True) -> Model:
    """The torch arithmetic (mech.block.arith) built in the dtype and on the device of `check`'s
    activations and held to the model on its first prompts (`check` cached every layer's residual;
    UnsupportedError where it does not reproduce them).  Building copies the weights and checking
    runs every block: a caller that patches several times on the same model makes it once and passes
    it to batched_metrics (`model`).  Without `layers`, ln_final and the unembedding alone (all that
    edges into the logits read), checked on the final residual."""
    import torch

    ref = check[hook_resid_pre(0)]
    with torch.no_grad():
        if not layers:
            model, weights = read.build_unembedding(bridge, ref.dtype, ref.device)
            fidelity.check_unembedding(model, weights, check)
            return model
        model, weights = read.build(bridge, ref.dtype, ref.device, int(ref.shape[1]))
        fidelity.check(model, weights, check)
    return model


def batched_metrics(bridge: Bridge, edges: list[names.Edge], base: dict[str, Any], source: dict[str, Any],
                    clean: dict[str, Any],
                    positions: Any, metric_fn: Callable[..., Any], *, replacement: str = Replacement.RESAMPLE,
                    budget_bytes: int = 32 * 2**20, progress: Callable[..., Any] = silent,
                    check: dict[str, Any] | None = None, model: Model | None = None,
                    tokens: Any = None, values: int = 1) -> np.ndarray:
    """Per-edge, per-prompt metric of every patched variant: [len(edges), n_prompts] (with `values` > 1,
    [len(edges), n_prompts, values]: metric_fn returns [N, values], several metrics of the same logits).

    metric_fn(logits [N, k, vocab], positions [N, k]) -> [N] (the scored positions
    are already selected).  `base`/`source`: caches with `cache_names`; `clean`
    provides the reference set for the `mean` replacement; `check`: the run the torch
    arithmetic is held to (fidelity.check: its first prompts, every layer's
    residual cached; default `base`, which then needs them); `model`: that arithmetic already made
    and checked (`checked_model`), when the caller holds it; `tokens` [n, k, c]: metric_fn reads the
    logits of these tokens only, and gets them alone (logits [N, k, c], column j token j: a metric
    of a few tokens' logits skips the rest of the unembedding).  Each row is the per-edge
    path's (patching.prepare + fast_logits) up to float rounding.  Working memory is
    about `budget_bytes` beyond a few cache-sized constants, whatever the number of edges.
    """
    import torch

    if replacement not in REPLACEMENTS:
        raise ValueError(f"unknown replacement {replacement!r}")
    groups = _groups(edges)
    out = np.zeros((len(edges), base[hook_resid_pre(0)].shape[0], *((values,) if values > 1 else ())))
    with torch.no_grad():
        sw = _sweep(bridge, base, source, clean, positions, metric_fn, replacement, budget_bytes, out,
                    model if model is not None else checked_model(bridge, base if check is None else check,
                                                                  layers=set(groups) != {"logits"}), tokens)
        work = [(key, part) for key, idx in groups.items() for part in _chunks(sw, key, edges, idx)]
        for key, part in work:
            sw.delta.expect([edges[i].sender for i in part], scored=key == "logits")
        receivers: _Receivers | None = None
        for key, part in progress(work, "edge chunks"):
            if key == "logits":
                _logit_chunk(sw, edges, part)
                continue
            if receivers is None or receivers.L != key:
                receivers = _receivers(sw, key)
            _sender_chunk(sw, receivers, edges, part)
    cost.spend(out.shape[1], sum(patch_cost(e, int(bridge.cfg.n_layers)) for e in edges))
    return out


def _sweep(bridge: Bridge, base: dict[str, Any], source: dict[str, Any], clean: dict[str, Any], positions: Any,
           metric_fn: Callable[..., Any], replacement: str, budget: int, out: np.ndarray,
           model: Model, tokens: Any = None) -> _Sweep:
    """The checked torch arithmetic, the caches trimmed to the positions up to the last scored one
    (causal attention: nothing scored reads later ones), masks, the senders' deltas."""
    ref = base[hook_resid_pre(0)]  # dtype and device of the activations
    positions = positions.to(ref.device)
    s = int(positions.max()) + 1
    L = bridge.cfg.n_layers
    caches = {id(c): _trim(c, s, L) for c in (base, source, clean)}
    tbase = caches[id(base)]
    vocab = (int(model.logits(tbase[hook_resid_post(L - 1)][:1, :1]).shape[-1]) if tokens is None
             else int(tokens.shape[-1]))
    windows = [lay.window for lay in model.layers]
    return _Sweep(model, tbase, positions, metric_fn, out, budget,
                  Deltas(bridge, tbase, caches[id(source)], caches[id(clean)], replacement, positions),
                  [causal(s, w, ref) for w in windows], [mask(positions, s, w, ref) for w in windows],
                  int(getattr(bridge.cfg, "d_mlp", None) or 4 * bridge.cfg.d_model), vocab,
                  None if tokens is None else tokens.to(ref.device), L)


def _groups(edges: list[names.Edge]) -> dict[Any, list[int]]:
    """Edge indices by receiver: "logits", or the receiver head's layer."""
    groups: dict[Any, list[int]] = {}
    for i, e in enumerate(edges):
        r = e.receiver
        if isinstance(r, names.Logits):
            groups.setdefault("logits", []).append(i)
        elif isinstance(r, names.HeadInput):
            groups.setdefault(r.head.layer, []).append(i)
        else:
            raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    return groups


def _trim(cache: dict[str, Any], s: int, n_layers: int) -> dict[str, Any]:
    """The cache's activations the batched path reads ([n, pos, ...]) at positions < s (views)."""
    names_ = [*cache_names(n_layers), "logits", *(hook_attn_sum(layer) for layer in range(n_layers))]
    return {name: cache[name][:, :s] for name in names_ if name in cache}


def _chunks(sw: _Sweep, key: Any, edges: list[names.Edge], idx: list[int]) -> list[list[int]]:
    """The group's edges in chunks: logits edges by the budget; edges into heads by chunks of
    senders (every edge of a sender in the same chunk), a sender's working set being
    r', LN1(r') and its projections onto every head's q, k, v [n, s, d + 2 d + 6 H dh]."""
    n, s, k, d = sw.shape
    item = sw.base[hook_resid_pre(0)].element_size()
    if key == "logits":
        size = min(chunk_size(sw.budget // 2, item * n * k * (2 * d + 7 * sw.vocab)), _position_cap(n * k))
        return [idx[j:j + size] for j in range(0, len(idx), size)]
    by_sender: dict[str, list[int]] = {}
    for i in idx:
        by_sender.setdefault(str(edges[i].sender), []).append(i)
    groups = list(by_sender.values())
    size = chunk_size(sw.budget // 2, item * n * s * (3 * d + 6 * sw.model.n_heads * sw.model.d_head))
    return [[i for g in groups[j:j + size] for i in g] for j in range(0, len(groups), size)]


def _logit_chunk(sw: _Sweep, edges: list[names.Edge], idx: list[int]) -> None:
    """A -> logits: final' = resid_post_last + delta_A at the scored positions."""
    last = sw.n_layers - 1
    final = at(sw.positions, sw.base[hook_resid_post(last)][None])  # [1, n, k, d]
    sw.finish(final + sw.delta([edges[i].sender for i in idx], scored=True), idx)


def _position_cap(positions_per_edge: int) -> int:
    return max(1, CHUNK_POSITIONS // max(positions_per_edge, 1))


@dataclass
class _Receivers:
    """Constants of one receiver layer L.  sq = the query positions computed: the scored ones
    (k) when L is the last layer, else all s.  Banks are over heads: q [H, n, sq, dh], k and v
    [H_kv, n, s, dh], q and k finished (QK-norm, the scale on q) and rotated at their positions."""

    L: int
    last: bool
    bank: dict[str, Any]  # x -> base inputs
    z: Any  # base z [H, n, sq, dh]
    pre: Any  # base resid_pre [n, sq, d]
    P: Any  # base attention sum before any post norm [n, sq, d]
    mlp_x: Any  # parallel blocks: the MLP's base output [n, sq, d] (it reads resid_pre, which no edge changes)

    @property
    def mid(self) -> Any:  # the size and dtype of a residual at the computed positions
        return self.pre


def _receivers(sw: _Sweep, L: int) -> _Receivers:
    lay = sw.model.layers[L]
    last = L == len(sw.model.layers) - 1
    base = sw.base

    def q_positions(t: Any) -> Any:  # [n, s, ...] -> [n, sq, ...]
        return at(sw.positions, t[None])[0] if last else t

    def heads_first(t: Any) -> Any:  # [n, p, H, dh] -> [H, n, p, dh]
        return t.permute(2, 0, 1, 3).contiguous()

    q = lay.finish("q", heads_first(q_positions(base[hook_input(L, "q")])), 0)
    bank = {"q": _rotate_q(lay, sw.positions, q, last),
            "k": lay.rotate(lay.finish("k", heads_first(base[hook_input(L, "k")]), 0)),
            "v": heads_first(base[hook_input(L, "v")])}
    pre = q_positions(base[hook_resid_pre(L)])
    P = q_positions(base[hook_attn_sum(L)] if lay.post1 is not None else base[hook_attn_out(L)])
    mlp_x = lay.mlp(pre) if lay.parallel and lay.mlp is not None else None
    return _Receivers(L, last, bank, heads_first(q_positions(base[hook_z(L)])), pre, P, mlp_x)


def _rotate_q(lay: Layer, positions: Any, q: Any, last: bool) -> Any:
    """Queries [., n, sq, dh] rotated at their positions (the scored ones when `last`)."""
    if not last:
        return lay.rotate(q)
    return lay.rotate(q.unsqueeze(0).transpose(1, 2), positions).transpose(1, 2).squeeze(0)


def _sender_chunk(sw: _Sweep, rc: _Receivers, edges: list[names.Edge], idx: list[int]) -> None:
    """Edges into heads of layer rc.L from one chunk of senders: the senders' bank, then the
    edges in chunks (bytes_per_edge, CHUNK_POSITIONS)."""
    import torch

    lay, H, dh = sw.model.layers[rc.L], sw.model.n_heads, sw.model.d_head
    n, s, k, d = sw.shape
    slot: dict[str, int] = {}
    for i in idx:
        slot.setdefault(str(edges[i].sender), len(slot))
    senders = [edges[i].sender for i in idx]
    chunk = list({str(x): x for x in senders}.values())
    bank = _banks(sw, lay, rc, sw.delta(chunk), {_head_input(edges[i]).which for i in idx})
    per_row = bytes_per_edge(n, s, d, dh, k, sw.vocab, itemsize=rc.mid.element_size(), d_mlp=sw.d_mlp,
                             n_heads=H, downstream=len(sw.model.layers) - 1 - rc.L)
    size = min(chunk_size(sw.budget // 2, per_row), _position_cap(n * rc.mid.shape[1]))
    for j in range(0, len(idx), size):
        part = idx[j:j + size]
        picks = torch.tensor([_bank_rows(_head_input(edges[i]), slot[str(edges[i].sender)], H, lay.n_kv)
                              for i in part], device=rc.mid.device)
        post = _variants(sw, lay, rc, bank, picks)
        sw.finish(post if rc.last else _downstream(sw, rc.L, post), part)


def _head_input(edge: names.Edge) -> names.HeadInput:
    r = edge.receiver
    if not isinstance(r, names.HeadInput):
        raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    return r


def _bank_rows(receiver: names.HeadInput, si: int, H: int, n_kv: int) -> tuple[int, int, int, int]:
    """(receiver head, then for q, k, v its row in the bank: the patched row H_x (1 + si) + i
    for the edge's input, the base row i for the other two; i = the head for q, its key/value
    head for k and v, H_x = H or n_kv)."""
    h = receiver.head.head
    g = h // (H // n_kv)
    rows = []
    for x in "qkv":
        i, Hx = (h, H) if x == "q" else (g, n_kv)
        rows.append(Hx * (1 + si) + i if receiver.which == x else i)
    return h, rows[0], rows[1], rows[2]


def _banks(sw: _Sweep, lay: Layer, rc: _Receivers, delta: Any, needed: set[str]) -> dict[str, Any]:
    """bank[x] = [base inputs of the H heads; inputs of the H heads from LN1(r') for each sender]
    [(1 + S) H, n, ., dh], r' = resid_pre + delta (the inputs in `needed` only; queries and keys
    finished and rotated as the scores read them, mech.block.layer)."""
    import torch

    S, n, s, d = delta.shape
    H, dh = sw.model.n_heads, sw.model.d_head
    h = lay.ln1(sw.base[hook_resid_pre(rc.L)][None] + delta)  # [S, n, s, d]
    out = dict(rc.bank)
    for x in needed:
        hx = at(sw.positions, h) if x == "q" and rc.last else h
        Hx = H if x == "q" else lay.n_kv
        p = lay.proj[x](hx).view(S, n, hx.shape[2], Hx, dh).permute(0, 3, 1, 2, 4)  # [S, Hx, n, p, dh]
        p = lay.finish(x, p, 1)
        if x == "q":
            p = lay.rotate(p.transpose(1, 2), sw.positions).transpose(1, 2) if rc.last else lay.rotate(p)
        elif x == "k":
            p = lay.rotate(p)
        out[x] = torch.cat([rc.bank[x], p.reshape(S * Hx, n, hx.shape[2], dh)])
    return out


def _variants(sw: _Sweep, lay: Layer, rc: _Receivers, bank: dict[str, Any], picks: Any) -> Any:
    """resid_post of layer L for each edge [E, n, sq, d]; picks [E, 4]: the receiver head and
    its q, k, v rows in the bank (_bank_rows).

        z' = softmax(cap(q k^T) + mask) v,  P' = P + (z' - z) W_O[head],  post' = finish(pre, post1(P'))"""
    import torch

    heads = picks[:, 0]
    q, k, v = (bank[x].index_select(0, picks[:, 1 + j]) for j, x in enumerate("qkv"))
    bias = sw.scored_masks[rc.L] if rc.last else sw.masks[rc.L]
    dz = attend(q, k, v, bias, lay.cap).sub_(rc.z.index_select(0, heads))
    E, n, sq, dh = dz.shape
    d = rc.pre.shape[-1]
    P = torch.baddbmm(rc.P.reshape(1, n * sq, d), dz.reshape(E, n * sq, dh), lay.W_O.index_select(0, heads))
    return lay.finish_block(rc.pre[None], lay.attn_out(P.view(E, n, sq, d)), rc.mlp_x)


def _downstream(sw: _Sweep, L: int, post: Any) -> Any:
    """resid_post of layer L [E, n, s, d] -> the final residual at the scored positions [E, n, k, d]:
    blocks L+1.. in full, the last one at the scored positions."""
    E, n, s, d = post.shape
    m = sw.model
    x = post.reshape(E * n, s, d)
    for l in range(L + 1, len(m.layers) - 1):
        x = block(m, m.layers[l], x, sw.masks[l])
    last = len(m.layers) - 1
    return block_at(m, m.layers[-1], x.view(E, n, s, d), sw.positions, sw.scored_masks[last])


def patch_into(runs: Any, todo: Sequence[names.Edge], direction: str, replacement: str, budget: int,
               progress: Callable[..., Any] | None = None) -> None:
    """Runs.patched_many's batched path: `todo` patched by `batched_metrics` from the base runs of
    `runs` (mech.runs.cached.Runs) into runs.memo, when those runs cached what it reads, the replacement
    is resample or zero and the runs score the metric at the scored positions; nothing otherwise,
    or where the arithmetic does not reproduce the model (UnsupportedError: one by one then)."""
    noising = direction == Direction.NOISING
    base, source = (runs.clean, runs.corrupt) if noising else (runs.corrupt, runs.clean)
    wanted = hooks.for_architecture(runs.bridge, cache_names(runs.n_layers, list(todo)))
    if (replacement in (Replacement.RESAMPLE, Replacement.ZERO) and runs.metric_at is not None
            and all(n in base and n in source for n in wanted)):
        metric_at = runs.metric_at

        def whole(logits: Any, positions: Any) -> Any:
            import torch

            return torch.as_tensor(metric_at(logits))

        # a metric of the answer's and the wrong token's logits (logit_diff): those columns alone are unembedded
        few = metrics.columns_metric(runs.metric_name, runs.ds.answers, runs.ds.wrong) if runs.metric_name else None
        tokens, metric_fn = (None, whole) if few is None else few
        try:
            got = batched_metrics(runs.bridge, list(todo), base, source, runs.clean, runs.ds.positions, metric_fn,
                                  replacement=replacement, budget_bytes=budget, model=runs.edge_blocks(),
                                  progress=progress or silent, tokens=tokens)
        except UnsupportedError:
            got = None  # an architecture the batched arithmetic does not reproduce: one by one
        if got is not None:
            for e, m in zip(todo, got, strict=True):
                runs.memo[runs.edge_key(e, direction, replacement, False, None)] = m
