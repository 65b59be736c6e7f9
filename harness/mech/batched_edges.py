"""Batched exact edge patching: many edges per pass, each starting at its
receiver's layer, the metric computed only at the scored positions.

Same definition as patching.py (the per-edge reference).  For an edge
A -> B.x with B a head of layer L, and base/source caches of one prompt batch:

    r'      = resid_pre_L - out_A(base) + out_A(replacement)
    x_B'    = LN1_L(r') W_x[B] + b_x[B]        (the other two inputs of B from the base run)
    z_B'    = softmax(q_B' k_B'^T / scale + causal mask) v_B'
    mid_L'  = mid_L(base) + (z_B' - z_B(base)) W_O[B]     (mid = resid_pre + attn_out)
    post_L' = mid_L' + MLP_L(LN2_L(mid_L'))                 (models with MLPs; else post = mid)

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

The arithmetic is written out in torch.  LN1 and LN2 are each followed by a
linear map, so their affine parts are folded into it:
    norm(x) W + b = standardize(x) (diag(w_norm) W) + (b_norm W + b)
(LN1 into the fused [W_Q/scale | W_K | W_V], LN2 into W_in; not ln_final, so that
W_U, often the tied embedding, is used without a copy).  On the CPU in float32
the matrix products use oneDNN's linear, with the MLP's activation fused (torch's
own float32 matmul calls MKL, whose kernels on AMD CPUs are AVX2 ones).  Before
the sweep the arithmetic is checked on two prompts of the base run: a norm, MLP
or unembedding that does not reproduce the model's own module (an unfamiliar
activation, a gated MLP, a norm computed in another precision) falls back to
calling that module; attention or a block that does not reproduce the cached
activations (rotary positions, parallel attention and MLP, soft caps) raises
UnsupportedError instead of giving wrong numbers.

Edges are stacked along the batch dimension in chunks whose size follows a
memory budget (bytes per edge estimated from the shapes, `bytes_per_edge`, and
capped at CHUNK_POSITIONS query positions so that a chunk stays cache-sized), so
peak memory is bounded by the budget (or one edge's working set, if larger), not
by the number of edges.  Per-layer constants (the base banks, resid_mid) are the
size of a few cached activations.

Measured (`python -m harness.tools.bench [--layers 6]`: GPT-2 architecture,
8 heads, d_model 64, 50 prompts of 41 tokens, every head -> later head q/k/v edge,
one thread, on this project's shared 2-core AMD machine): 2 layers, 192 edges:
1.04 ms per edge = 0.070 of one plain forward of the prompt batch, 28x
TransformerLens's get_act_patch_direct_path_all_sources; 6 layers, 2880 edges:
0.106 of a forward per edge, 19.5x.  On the 2-layer model about a third of the
per-edge cost is the metric (metrics.per_prompt: a gather and a float64
log-softmax over the vocabulary), the rest mostly the MLP and unembedding
products; with more layers, the later blocks' attention at every position.

Devices: every tensor made here is made on the device of the cached
activations (the model's), including index tensors; `positions` are moved there;
the per-edge metrics come back to the CPU as numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnsupportedError
from ..model.devices import like
from ..spec import names
from ..spec.names import hook_attn_out, hook_input, hook_resid_post, hook_resid_pre, hook_z
from ..spec.vocabulary import REPLACEMENTS
from .patching import attn_scale, sender_output

# At most this many query positions (prompts x positions) per chunk of patched variants:
# larger chunks were no faster on the benchmark model (its products are large enough by
# then) and only hold more memory.
CHUNK_POSITIONS = 4096
CHECK_PROMPTS = 2  # prompts of the base run the torch arithmetic is checked on


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


def bytes_per_edge(n: int, s: int, d: int, d_head: int, k: int, vocab: int, itemsize: int = 4,
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


# ----------------------------------------------------------------------------------------------
# The model's arithmetic, written out in torch


def _gelu_tanh(x: Any) -> Any:
    """GELU (tanh approximation) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
    the sigmoid form, torch's CPU tanh being several times slower than its sigmoid."""
    import torch

    c = 2 * math.sqrt(2 / math.pi)
    t = torch.addcmul(x.new_full((), c), x, x, value=0.044715 * c)  # 2u / x
    return t.mul_(x).sigmoid_().mul_(x)


def _activation(name: str | None) -> tuple[Callable, tuple[str, str]] | None:
    """(torch function, oneDNN post-op (attr, algorithm)) of a TransformerLens act_fn name."""
    import torch.nn.functional as F

    table: dict[str, tuple[Callable, tuple[str, str]]] = {
        "gelu_new": (_gelu_tanh, ("gelu", "tanh")), "gelu_fast": (_gelu_tanh, ("gelu", "tanh")),
        "gelu_pytorch_tanh": (_gelu_tanh, ("gelu", "tanh")), "gelu": (F.gelu, ("gelu", "none")),
        "relu": (F.relu, ("relu", "")), "silu": (F.silu, ("swish", "")), "swish": (F.silu, ("swish", ""))}
    return table.get(name or "")


@dataclass
class _Norm:
    """y = standardize(x) w + b, standardize(x) = c(x) / sqrt(mean(c(x)^2) + eps); c(x) = x - mean(x)
    for LayerNorm (kind "ln"), c(x) = x for RMS norms ("rms"); "none": y = x.  For LN1 and LN2
    the affine part (w, b) is folded into the linear map that follows (see _fold)."""

    kind: str
    w: Any = None
    b: Any = None
    eps: float = 0.0

    def standardize(self, x: Any) -> Any:
        import torch

        if self.kind == "none":
            return x
        c = x - x.mean(-1, keepdim=True) if self.kind == "ln" else x
        r = torch.linalg.vector_norm(c, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(self.eps).rsqrt_()
        return c.mul_(r) if self.kind == "ln" else c * r

    def __call__(self, x: Any) -> Any:
        import torch

        y = self.standardize(x)
        if self.w is not None and self.b is not None:
            return torch.addcmul(self.b, y, self.w)
        y = y if self.w is None else y * self.w
        return y if self.b is None else y + self.b


class _Dense:
    """y = act(x W + b) for a fixed W [in, out], b [out] (or None), act (or None).

    On the CPU in float32, when this torch has it and it agrees with addmm, by oneDNN's
    linear with the activation fused (W kept only as oneDNN's layout W^T [out, in]):
    torch's own float32 matmul calls MKL, whose kernels on AMD CPUs are AVX2 ones, about
    half the speed of oneDNN's AVX-512 ones there."""

    def __init__(self, W: Any, b: Any, dnn: bool, act: tuple[Callable, tuple[str, str]] | None = None):
        self.b, self.act = b, act
        self.Wt = W.t().contiguous() if dnn and _dnn_ok(W.dtype, act) else None  # no copy if W^T is contiguous
        self.W = None if self.Wt is not None else W

    def outputs(self, lo: int, hi: int) -> _Dense:
        """The map to outputs lo:hi only (sharing this one's weights)."""
        part = _Dense.__new__(_Dense)
        part.act = self.act
        part.b = None if self.b is None else self.b[lo:hi]
        part.Wt = None if self.Wt is None else self.Wt[lo:hi]
        part.W = None if self.W is None else self.W[:, lo:hi]
        return part

    def __call__(self, x: Any) -> Any:
        import torch

        if self.Wt is not None:
            attr, algorithm = self.act[1] if self.act is not None else ("none", "")
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.Wt, self.b, attr, [], algorithm)
        W: Any = self.W
        flat = x.reshape(-1, x.shape[-1])
        y = (flat @ W if self.b is None else torch.addmm(self.b, flat, W)).view(*x.shape[:-1], -1)
        return y if self.act is None else self.act[0](y)


@functools.cache
def _dnn_ok(dtype: Any, act: tuple[Callable, tuple[str, str]] | None) -> bool:
    """Whether oneDNN's linear (with this activation fused) runs here and agrees with torch on a trial
    (once per dtype and activation)."""
    import torch

    if dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    g = torch.Generator().manual_seed(0)
    x, W, b = (torch.randn(*shape, generator=g) for shape in ((33, 24), (24, 40), (40,)))
    attr, algorithm = act[1] if act is not None else ("none", "")
    try:
        y = torch.ops.mkldnn._linear_pointwise(x, W.t().contiguous(), b, attr, [], algorithm)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    want = torch.addmm(b, x, W)
    want = want if act is None else act[0](want)
    return y.shape == want.shape and bool(torch.allclose(y, want, rtol=1e-5, atol=1e-5))


def _fold(norm: _Norm | None, W: Any, b: Any) -> tuple[Any, Any]:
    """norm(x) W + b = standardize(x) W' + b':  W' = diag(w) W, b' = b_norm W + b (no norm: W, b)."""
    if norm is None:
        return W, b
    Wf = W if norm.w is None else norm.w[:, None] * W
    bf = b if norm.b is None else (norm.b @ W if b is None else b + norm.b @ W)
    return Wf, bf


def _through(module: Any) -> Callable:
    """A position-wise module (norm, MLP, unembedding) called on [..., d] as one [1, N, d] batch."""
    def call(x: Any) -> Any:
        y = module(x.reshape(1, -1, x.shape[-1]))
        return y.reshape(*x.shape[:-1], y.shape[-1])
    return call


@dataclass
class _Layer:
    """One block as arithmetic.

    ln1(x): standardize(x) (LN1's affine folded into proj) or the model's LN1 module;
    proj[x] for x in q, k, v, qkv, kv: ln1's output -> those inputs of every head
    [..., (1-3) H dh] (W_Q and b_Q divided by the attention scale); W_O [H, dh, d];
    out: z [..., H dh] -> sum_h z_h W_O[h] + b_O; mlp(mid) = MLP(LN2(mid)) (None: no MLP)."""

    ln1: Callable
    proj: dict[str, _Dense]
    W_O: Any
    out: _Dense
    mlp: Callable | None
    scale: float

    def after_attention(self, mid: Any) -> Any:
        """post = mid + MLP(LN2(mid)) (mid without an MLP)."""
        return mid if self.mlp is None else mid + self.mlp(mid)


@dataclass
class _Model:
    layers: list[_Layer]
    logits: Callable  # final residual -> unembed(ln_final(.))
    n_heads: int
    d_head: int


def _stacked(bridge: Any, name: str) -> Any:
    """bridge.W_in etc. (stacked over layers), or None when the model has none."""
    try:
        return getattr(bridge, name)
    except (AttributeError, KeyError, IndexError, RuntimeError, TypeError, ValueError):
        return None


def _norm_of(module: Any, cfg: Any, cast: Callable) -> _Norm | None:
    """The arithmetic a TransformerLens NormalizationBridge does (None if not recognised)."""
    import torch

    if module is None:
        return _Norm("none")
    comp = getattr(module, "original_component", None)
    if comp is None:
        return None
    if isinstance(comp, torch.nn.Identity):
        return _Norm("none")
    rms = bool(getattr(module, "uses_rms_norm", False))
    w = getattr(comp, "weight", None)
    b = None if rms else getattr(comp, "bias", None)
    if w is not None and getattr(module, "uses_weight_offset", False):
        w = 1.0 + w
    eps: Any = getattr(comp, "eps", None) or getattr(comp, "variance_epsilon", None) or getattr(cfg, "eps", 1e-5)
    return _Norm("rms" if rms else "ln", cast(w), cast(b), float(eps))


@dataclass
class _Weights:
    """What _layer and _logits build from: the bridge's stacked weights (in the activations'
    dtype and device), its config, the torch norms, the activation, oneDNN or not."""

    bridge: Any
    st: dict[str, Any]
    norms: dict[str, _Norm | None]  # "ln1.L", "ln2.L", "ln_final"
    act: tuple[Callable, tuple[str, str]] | None
    dnn: bool

    def has_mlp(self, L: int) -> bool:
        cfg = self.bridge.cfg
        return not getattr(cfg, "attn_only", False) and getattr(self.bridge.blocks[L], "mlp", None) is not None

    def mlp_in_torch(self, L: int) -> bool:
        """Whether MLP L can be written out: a known activation, not gated, weights exposed."""
        return (self.act is not None and not bool(getattr(self.bridge.cfg, "gated_mlp", False))
                and self.st["W_in"] is not None and self.st["W_out"] is not None)


def _weights(bridge: Any, dtype: Any, device: Any) -> _Weights:
    import torch

    cfg = bridge.cfg

    def cast(t: Any) -> Any:
        return None if t is None else t.detach().to(dtype=dtype, device=device)

    st = {x: cast(_stacked(bridge, x)) for x in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O", "W_in",
                                                 "b_in", "W_out", "b_out", "W_U", "b_U")}
    norms = {"ln_final": _norm_of(getattr(bridge, "ln_final", None), cfg, cast)}
    for L in range(cfg.n_layers):
        block = bridge.blocks[L]
        norms[f"ln1.{L}"] = _norm_of(getattr(block, "ln1", None), cfg, cast)
        norms[f"ln2.{L}"] = _norm_of(getattr(block, "ln2", None), cfg, cast)
    dnn = torch.device(device).type == "cpu" and _dnn_ok(dtype, None)
    return _Weights(bridge, st, norms, _activation(getattr(cfg, "act_fn", None)), dnn)


def _layer(w: _Weights, L: int, torch_ln1: bool = True, torch_mlp: bool = True) -> _Layer:
    """Block L as arithmetic: LN1 and LN2 + MLP in torch when recognised and asked for, else
    the model's modules."""
    import torch

    cfg, st, block = w.bridge.cfg, w.st, w.bridge.blocks[L]
    H, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    scale = attn_scale(cfg)
    norm1 = w.norms[f"ln1.{L}"] if torch_ln1 else None
    hd = H * dh
    W = torch.cat([st[f"W_{x.upper()}"][L].permute(1, 0, 2).reshape(d, hd) / (scale if x == "q" else 1.0)
                   for x in "qkv"], dim=1)  # [d, 3 H dh]
    b = torch.cat([st[f"b_{x.upper()}"][L].reshape(hd) / (scale if x == "q" else 1.0) for x in "qkv"])
    qkv = _Dense(*_fold(norm1, W, b), w.dnn)
    proj = {"qkv": qkv, "q": qkv.outputs(0, hd), "k": qkv.outputs(hd, 2 * hd), "v": qkv.outputs(2 * hd, 3 * hd),
            "kv": qkv.outputs(hd, 3 * hd)}
    ln1 = norm1.standardize if norm1 is not None else _through(block.ln1)
    mlp: Callable | None = None
    if w.has_mlp(L):
        norm2 = w.norms[f"ln2.{L}"]
        if torch_mlp and norm2 is not None and w.mlp_in_torch(L):
            fc_in = _Dense(*_fold(norm2, st["W_in"][L], st["b_in"][L]), w.dnn, w.act)
            fc_out = _Dense(st["W_out"][L], st["b_out"][L], w.dnn)

            def mlp(mid: Any, norm2: _Norm = norm2, fc_in: _Dense = fc_in, fc_out: _Dense = fc_out) -> Any:
                return fc_out(fc_in(norm2.standardize(mid)))
        else:
            ln2, module = _through(block.ln2), _through(block.mlp)

            def mlp(mid: Any, ln2: Callable = ln2, module: Callable = module) -> Any:
                return module(ln2(mid))
    out = _Dense(st["W_O"][L].reshape(H * dh, d), st["b_O"][L], w.dnn)
    return _Layer(ln1, proj, st["W_O"][L], out, mlp, scale)


def _logits(w: _Weights, in_torch: bool = True) -> Callable:
    """Final residual -> logits: ln_final, then the unembedding; in torch, or the model's modules."""
    norm = w.norms["ln_final"]
    if in_torch and norm is not None and w.st["W_U"] is not None:
        unembed = _Dense(w.st["W_U"], w.st["b_U"], w.dnn)  # not folded: W_U^T is the (tied) embedding, no copy
        return lambda x: unembed(norm(x))
    ln_final, unembed_module = _through(w.bridge.ln_final), _through(w.bridge.unembed)
    return lambda x: unembed_module(ln_final(x))


def _build(bridge: Any, dtype: Any, device: Any) -> tuple[_Model, _Weights]:
    """The torch arithmetic of every block, ln_final and the unembedding, in the activations'
    dtype and device (unchecked: see _check)."""
    w = _weights(bridge, dtype, device)
    layers = [_layer(w, L) for L in range(bridge.cfg.n_layers)]
    return _Model(layers, _logits(w), bridge.cfg.n_heads, bridge.cfg.d_head), w


def _tolerance(dtype: Any) -> float:
    import torch

    return {torch.float64: 1e-8, torch.float32: 1e-4}.get(dtype, 3e-2)


def _off(a: Any, b: Any, tol: float) -> float | None:
    """max |a - b| when it exceeds tol * (1 + max |b|), else None."""
    diff = float((a - b).abs().max())
    return diff if diff > tol * (1 + float(b.abs().max())) else None


def _require(diff: float | None, what: str) -> None:
    if diff is not None:
        raise UnsupportedError(f"batched edge patching: {what} recomputed from the cached activations differs from "
                               f"the model's by {diff:.3g}; the batched path handles blocks resid + attention "
                               "(learned positions, causal softmax), then + MLP(LN2(.)), only")


def _check(model: _Model, w: _Weights, base: dict, tol: float) -> None:
    """Hold the torch arithmetic to the model on the first prompts of the base run.

    LN1, LN2 + MLP and ln_final + unembed are compared with the model's modules and
    replaced by them where they differ; q/k/v, z and attn_out of every layer, each block's
    output and the logits are compared with the cache (UnsupportedError where they differ)."""
    m = CHECK_PROMPTS
    bridge = w.bridge
    L_last = len(model.layers) - 1
    for L in range(len(model.layers)):
        block, lay = bridge.blocks[L], model.layers[L]
        pre = base[hook_resid_pre(L)][:m]
        mid = pre + base[hook_attn_out(L)][:m]
        norm1 = w.norms[f"ln1.{L}"]
        torch_ln1 = norm1 is not None and _off(norm1(pre), _through(block.ln1)(pre), tol) is None
        torch_mlp = lay.mlp is None or _off(lay.mlp(mid), _through(block.mlp)(_through(block.ln2)(mid)), tol) is None
        if not (torch_ln1 and torch_mlp):
            model.layers[L] = lay = _layer(w, L, torch_ln1, torch_mlp)
        z = _check_attention(lay, L, pre, base, tol, model.n_heads, model.d_head)
        _require(_off(lay.out(z.reshape(*z.shape[:-2], -1)), base[hook_attn_out(L)][:m], tol), hook_attn_out(L))
        nxt = hook_resid_pre(L + 1) if L < L_last else hook_resid_post(L)
        _require(_off(lay.after_attention(mid), base[nxt][:m], tol), f"{nxt} (as resid_mid + MLP(LN2(resid_mid)))")
    final = base[hook_resid_post(L_last)][:m]
    if _off(model.logits(final), bridge.unembed(bridge.ln_final(final)), tol) is not None:
        model.logits = _logits(w, in_torch=False)
    if "logits" in base:
        _require(_off(model.logits(final), base["logits"][:m], tol), "the logits (ln_final, unembed)")


def _check_attention(lay: _Layer, L: int, pre: Any, base: dict, tol: float, H: int, dh: int) -> Any:
    """q/k/v and z of layer L recomputed from resid_pre [m, s, d] and compared with the cache;
    returns z [m, s, H, dh]."""
    m, s, _ = pre.shape
    h = lay.ln1(pre)
    qkv = {x: lay.proj[x](h).view(m, s, H, dh) for x in "qkv"}
    for x in "qkv":
        _require(_off(qkv[x] * (lay.scale if x == "q" else 1.0), base[hook_input(L, x)][:m], tol), hook_input(L, x))
    z = _attend(qkv["q"].transpose(1, 2), qkv["k"].transpose(1, 2), qkv["v"].transpose(1, 2),
                _causal(s, pre)).transpose(1, 2)
    _require(_off(z, base[hook_z(L)][:m], tol), hook_z(L))
    return z


def _causal(s: int, ref: Any) -> Any:
    """Additive causal mask [s, s]: 0 on and below the diagonal, -inf above."""
    import torch

    keep = torch.ones(s, s, dtype=torch.bool, device=ref.device).tril()
    return torch.zeros(s, s, dtype=ref.dtype, device=ref.device).masked_fill(~keep, float("-inf"))


def _attend(q: Any, k: Any, v: Any, bias: Any) -> Any:
    """softmax(q k^T + bias) v over the last two dims, q [..., sq, dh] already divided by the
    attention scale, bias [sq, s] or broadcasting to [..., sq, s] (0 or -inf).  As 3-D
    batched products (4-D matmuls of permuted views are several times slower on CPU)."""
    import torch

    lead, sq, s = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    scores = torch.bmm(q3, k3.transpose(1, 2))
    scores.view(*lead, sq, s).add_(bias)
    return torch.bmm(torch.softmax(scores, dim=-1), v3).view(*lead, sq, v.shape[-1])


def _block(lay: _Layer, x: Any, causal: Any, H: int, dh: int) -> Any:
    """A whole block at every position: x [B, s, d] -> resid_post [B, s, d]."""
    B, s, d = x.shape
    q, k, v = lay.proj["qkv"](lay.ln1(x)).view(B, s, 3, H, dh).permute(2, 0, 3, 1, 4).contiguous()  # [B, H, s, dh]
    z = _attend(q, k, v, causal).transpose(1, 2)  # [B, s, H, dh]
    return lay.after_attention(x + lay.out(z.reshape(B, s, H * dh)))


def _block_at(lay: _Layer, x: Any, positions: Any, scored_mask: Any, H: int, dh: int) -> Any:
    """The last block at the scored positions only: x [E, n, s, d] -> resid_post [E, n, k, d]
    (keys and values at every position, queries and everything after at the scored ones)."""
    E, n, s, d = x.shape
    k_ = positions.shape[1]
    h = lay.ln1(x)
    k, v = lay.proj["kv"](h).view(E, n, s, 2, H, dh).permute(3, 0, 1, 4, 2, 5).contiguous()  # [E, n, H, s, dh]
    q = lay.proj["q"](_at(positions, h)).view(E, n, k_, H, dh).transpose(2, 3).contiguous()
    z = _attend(q, k, v, scored_mask[:, None]).transpose(2, 3)  # [E, n, k, H, dh]
    return lay.after_attention(_at(positions, x) + lay.out(z.reshape(E, n, k_, H * dh)))


def _at(positions: Any, x: Any) -> Any:
    """x [E, n, s, ...] -> [E, n, k, ...] at the scored positions."""
    idx = positions.reshape(1, *positions.shape, *([1] * (x.dim() - 3)))
    return x.gather(2, idx.expand(x.shape[0], -1, -1, *x.shape[3:]))


# ----------------------------------------------------------------------------------------------
# The sweep


@dataclass
class _Sweep:
    """What every group of edges needs: the checked model arithmetic, the trimmed base cache,
    the scored positions [n, k], masks, and where the metrics go."""

    model: _Model
    base: dict
    positions: Any
    metric_fn: Callable
    out: np.ndarray
    budget: int
    delta: Callable  # senders -> [S, n, s, d]: out_A(replacement) - out_A(base)
    causal: Any  # [s, s] additive
    scored_mask: Any  # [n, k, s] additive: the causal mask of the scored queries
    d_mlp: int
    vocab: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(n prompts, s positions computed, k scored positions, d_model)."""
        n, s, d = self.base[hook_resid_pre(0)].shape
        return n, s, self.positions.shape[1], d

    def finish(self, final_at: Any, idx: list[int]) -> None:
        """Final residual at the scored positions [E, n, k, d] -> the metric of each variant, into out[idx]."""
        import torch

        E, n, k, _ = final_at.shape
        logits = self.model.logits(final_at)
        pos = torch.arange(k, device=final_at.device).expand(E * n, -1)
        vals = self.metric_fn(logits.reshape(E * n, k, logits.shape[-1]), pos).reshape(E, n)
        self.out[idx] = vals.cpu().double().numpy()


def batched_metrics(bridge: Any, edges: list[names.Edge], base: dict, source: dict, clean: dict,
                    positions: Any, metric_fn: Callable, replacement: str = "resample",
                    budget_bytes: int = 32 * 2**20, progress: Callable = lambda it, label: it) -> np.ndarray:
    """Per-edge, per-prompt metric of every patched variant: [len(edges), n_prompts].

    metric_fn(logits [N, k, vocab], positions [N, k]) -> [N] (the scored positions
    are already selected).  `base`/`source`: caches with `cache_names`; `clean`
    provides the reference set for the `mean` replacement.  Each row is the per-edge
    path's (patching.prepare + fast_logits) up to float rounding.  Working memory is
    about `budget_bytes` beyond a few cache-sized constants, whatever the number of edges.
    """
    import torch

    if replacement not in REPLACEMENTS:
        raise ValueError(f"unknown replacement {replacement!r}")
    groups = _groups(edges)
    out = np.zeros((len(edges), base[hook_resid_pre(0)].shape[0]))
    with torch.no_grad():
        sw = _sweep(bridge, base, source, clean, positions, metric_fn, replacement, budget_bytes, out)
        work = [(key, part) for key, idx in groups.items() for part in _chunks(sw, key, edges, idx)]
        receivers: _Receivers | None = None
        for key, part in progress(work, "edge chunks"):
            if key == "logits":
                _logit_chunk(sw, edges, part)
                continue
            if receivers is None or receivers.L != key:
                receivers = _receivers(sw, key)
            _sender_chunk(sw, receivers, edges, part)
    return out


def _sweep(bridge: Any, base: dict, source: dict, clean: dict, positions: Any, metric_fn: Callable,
           replacement: str, budget: int, out: np.ndarray) -> _Sweep:
    """The checked torch arithmetic, the caches trimmed to the positions up to the last scored
    one (causal attention: nothing scored reads later ones), masks, the senders' deltas."""
    ref = base[hook_resid_pre(0)]  # dtype and device of the activations
    positions = positions.to(ref.device)
    s = int(positions.max()) + 1
    L = bridge.cfg.n_layers
    caches = {id(c): _trim(c, s, L) for c in (base, source, clean)}
    tbase = caches[id(base)]
    model, weights = _build(bridge, ref.dtype, ref.device)
    _check(model, weights, tbase, _tolerance(ref.dtype))
    vocab = int(model.logits(tbase[hook_resid_post(L - 1)][:1, :1]).shape[-1])
    return _Sweep(model, tbase, positions, metric_fn, out, budget,
                  _deltas(bridge, tbase, caches[id(source)], caches[id(clean)], replacement),
                  _causal(s, ref), _scored_mask(positions, s, ref),
                  int(getattr(bridge.cfg, "d_mlp", None) or 4 * bridge.cfg.d_model), vocab)


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


def _trim(cache: dict, s: int, n_layers: int) -> dict:
    """The cache's activations the batched path reads ([n, pos, ...]) at positions < s (views)."""
    return {name: cache[name][:, :s] for name in [*cache_names(n_layers), "logits"] if name in cache}


def _scored_mask(positions: Any, s: int, ref: Any) -> Any:
    """[n, k, s] additive: key j is visible to the query at scored position p iff j <= p."""
    import torch

    hidden = torch.arange(s, device=ref.device)[None, None, :] > positions[:, :, None]
    return torch.zeros(hidden.shape, dtype=ref.dtype, device=ref.device).masked_fill(hidden, float("-inf"))


def _deltas(bridge: Any, base: dict, source: dict, clean: dict, replacement: str) -> Callable:
    """senders -> [S, n, s, d]: out_A(replacement) - out_A(base), computed in float64 once per sender.
    resample: the source run's output; mean: its mean over `clean`'s prompts; zero: 0."""
    import torch

    ref = base[hook_resid_pre(0)]
    memo: dict[str, Any] = {}

    def one(x: names.Sender) -> Any:
        key = str(x)
        if key not in memo:
            old = sender_output(bridge, base, x)
            if replacement == "resample":
                new = sender_output(bridge, source, x)
            elif replacement == "mean":
                new = sender_output(bridge, clean, x).mean(0, keepdim=True)
            else:
                new = torch.zeros_like(old)
            memo[key] = like(new - old, ref)
        return memo[key]

    return lambda senders: torch.stack([one(x) for x in senders])


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
    final = _at(sw.positions, sw.base[hook_resid_post(len(sw.model.layers) - 1)][None])  # [1, n, k, d]
    sw.finish(final + _at(sw.positions, sw.delta([edges[i].sender for i in idx])), idx)


def _position_cap(positions_per_edge: int) -> int:
    return max(1, CHUNK_POSITIONS // max(positions_per_edge, 1))


@dataclass
class _Receivers:
    """Constants of one receiver layer L.  sq = the query positions computed: the scored ones
    (k) when L is the last layer, else all s.  Banks are [H, n, ., dh] over heads (q divided
    by the attention scale)."""

    L: int
    last: bool
    bank: dict[str, Any]  # x -> base inputs [H, n, sq or s, dh]
    z: Any  # base z [H, n, sq, dh]
    mid: Any  # base resid_mid [n, sq, d]


def _receivers(sw: _Sweep, L: int) -> _Receivers:
    lay = sw.model.layers[L]
    last = L == len(sw.model.layers) - 1
    base = sw.base

    def q_positions(t: Any) -> Any:  # [n, s, ...] -> [n, sq, ...]
        return _at(sw.positions, t[None])[0] if last else t

    def heads_first(t: Any) -> Any:  # [n, p, H, dh] -> [H, n, p, dh]
        return t.permute(2, 0, 1, 3).contiguous()

    bank = {"q": heads_first(q_positions(base[hook_input(L, "q")]) / lay.scale),
            "k": heads_first(base[hook_input(L, "k")]), "v": heads_first(base[hook_input(L, "v")])}
    mid = q_positions(base[hook_resid_pre(L)] + base[hook_attn_out(L)])
    return _Receivers(L, last, bank, heads_first(q_positions(base[hook_z(L)])), mid)


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
    per_row = bytes_per_edge(n, s, d, dh, k, sw.vocab, rc.mid.element_size(), sw.d_mlp, H,
                             len(sw.model.layers) - 1 - rc.L)
    size = min(chunk_size(sw.budget // 2, per_row), _position_cap(n * rc.mid.shape[1]))
    for j in range(0, len(idx), size):
        part = idx[j:j + size]
        picks = torch.tensor([_bank_rows(_head_input(edges[i]), slot[str(edges[i].sender)], H) for i in part],
                             device=rc.mid.device)
        post = _variants(sw, lay, rc, bank, picks)
        sw.finish(post if rc.last else _downstream(sw, rc.L, post), part)


def _head_input(edge: names.Edge) -> names.HeadInput:
    r = edge.receiver
    if not isinstance(r, names.HeadInput):
        raise UnsupportedError(names.edge_end_unsupported(r, "into"))
    return r


def _bank_rows(receiver: names.HeadInput, si: int, H: int) -> tuple[int, int, int, int]:
    """(receiver head, then for q, k, v its row in the bank: the patched row H (1 + si) + head
    for the edge's input, the base row `head` for the other two)."""
    h = receiver.head.head
    q, k, v = (H * (1 + si) + h if receiver.which == x else h for x in "qkv")
    return h, q, k, v


def _banks(sw: _Sweep, lay: _Layer, rc: _Receivers, delta: Any, needed: set[str]) -> dict[str, Any]:
    """bank[x] = [base inputs of the H heads; inputs of the H heads from LN1(r') for each sender]
    [(1 + S) H, n, ., dh], r' = resid_pre + delta (the inputs in `needed` only)."""
    import torch

    S, n, s, d = delta.shape
    H, dh = sw.model.n_heads, sw.model.d_head
    h = lay.ln1(sw.base[hook_resid_pre(rc.L)][None] + delta)  # [S, n, s, d]
    out = dict(rc.bank)
    for x in needed:
        hx = _at(sw.positions, h) if x == "q" and rc.last else h
        p = lay.proj[x](hx).view(S, n, hx.shape[2], H, dh).permute(0, 3, 1, 2, 4)
        out[x] = torch.cat([rc.bank[x], p.reshape(S * H, n, hx.shape[2], dh)])
    return out


def _variants(sw: _Sweep, lay: _Layer, rc: _Receivers, bank: dict[str, Any], picks: Any) -> Any:
    """resid_post of layer L for each edge [E, n, sq, d]; picks [E, 4]: the receiver head and
    its q, k, v rows in the bank (_bank_rows).

        z' = softmax(q k^T + mask) v,  mid' = mid + (z' - z) W_O[head],  post' = mid' + MLP(LN2(mid'))"""
    import torch

    heads = picks[:, 0]
    q, k, v = (bank[x].index_select(0, picks[:, 1 + j]) for j, x in enumerate("qkv"))
    dz = _attend(q, k, v, sw.scored_mask if rc.last else sw.causal).sub_(rc.z.index_select(0, heads))
    E, n, sq, dh = dz.shape
    d = rc.mid.shape[-1]
    mid = torch.baddbmm(rc.mid.reshape(1, n * sq, d), dz.reshape(E, n * sq, dh), lay.W_O.index_select(0, heads))
    return lay.after_attention(mid).view(E, n, sq, d)


def _downstream(sw: _Sweep, L: int, post: Any) -> Any:
    """resid_post of layer L [E, n, s, d] -> the final residual at the scored positions [E, n, k, d]:
    blocks L+1.. in full, the last one at the scored positions."""
    E, n, s, d = post.shape
    m = sw.model
    x = post.reshape(E * n, s, d)
    for l in range(L + 1, len(m.layers) - 1):
        x = _block(m.layers[l], x, sw.causal, m.n_heads, m.d_head)
    return _block_at(m.layers[-1], x.view(E, n, s, d), sw.positions, sw.scored_mask, m.n_heads, m.d_head)
