"""The model's arithmetic written out in torch, for the batched edge sweep
(mech.batched_edges): norms (LayerNorm, RMSNorm), dense layers with their activations
(oneDNN's fused linear on the CPU in float32), plain and gated MLPs, attention (rotary
positions, grouped key/value heads, soft caps, sliding windows: the features of
model.architecture), sequential and parallel blocks with or without norms after each
sublayer, and the unembedding with the model's output transform.  The affine part of
norm1 and norm2 is folded into the linear map after it:

    norm(x) W + b = standardize(x) (diag(w_norm) W) + (b_norm W + b)

A block, with P = sum_h z_h W_O[h] + b_O its attention sum and post1, post2 the norms
after the sublayers where the model has them (else the identity):

    sequential: mid = x + post1(P(norm1(x))),   post = mid + post2(MLP(norm2(mid)))
    parallel:   post = x + post1(P(norm1(x))) + post2(MLP(norm2(x)))

`build` reads a bridge's weights into these pieces; `check` holds them to the model's
own modules and cached activations on a few prompts of the base run (CHECK_PROMPTS): a
norm, MLP or unembedding that does not reproduce its module falls back to calling the
module; attention or a block that does not reproduce the cache raises
UnsupportedError.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedError
from ..model import architecture
from ..spec.names import (
    HOOK_ROT_COS,
    HOOK_ROT_SIN,
    hook_attn_out,
    hook_input,
    hook_resid_post,
    hook_resid_pre,
    hook_z,
)
from .attention import rotate
from .hooks import output_transform

CHECK_PROMPTS = 2  # prompts of the base run the torch arithmetic is checked on



def gelu_tanh(x: Any) -> Any:
    """GELU (tanh approximation) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
    the sigmoid form, torch's CPU tanh being several times slower than its sigmoid."""
    import torch

    c = 2 * math.sqrt(2 / math.pi)
    t = torch.addcmul(x.new_full((), c), x, x, value=0.044715 * c)  # 2u / x
    if _tracked(x):  # autograd needs the intermediate values kept: no in-place steps
        return x * torch.sigmoid(t * x)
    return t.mul_(x).sigmoid_().mul_(x)


def _tracked(x: Any) -> bool:
    """Whether autograd records operations on x (mech.attribution differentiates through these
    functions; in-place steps and oneDNN's fused linear are then avoided)."""
    import torch

    return torch.is_grad_enabled() and bool(x.requires_grad)


def activation(name: str | None) -> tuple[Callable, tuple[str, str]] | None:
    """(torch function, oneDNN post-op (attr, algorithm)) of a TransformerLens act_fn name."""
    import torch.nn.functional as F

    table: dict[str, tuple[Callable, tuple[str, str]]] = {
        "gelu_new": (gelu_tanh, ("gelu", "tanh")), "gelu_fast": (gelu_tanh, ("gelu", "tanh")),
        "gelu_pytorch_tanh": (gelu_tanh, ("gelu", "tanh")), "gelu": (F.gelu, ("gelu", "none")),
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
        if _tracked(x):
            return c * (c.square().mean(-1, keepdim=True) + self.eps).rsqrt()
        r = torch.linalg.vector_norm(c, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(self.eps).rsqrt_()
        return c.mul_(r) if self.kind == "ln" else c * r

    def standardize_vjp(self, y: Any, x: Any, g: Any) -> Any:
        """d L / d x from g = d L / d standardize(x) (y = standardize(x), r = 1 / sqrt(mean(c^2) + eps)):
        rms  r (g - y mean(g y));  ln  r (g - mean(g) - y mean(g y));  none  g.  g may carry extra
        axes before the last (several readers of the same x); x and y broadcast against it."""
        if self.kind == "none":
            return g
        c = x - x.mean(-1, keepdim=True) if self.kind == "ln" else x
        r = (c.square().mean(-1, keepdim=True) + self.eps).rsqrt()
        out = g - y * (g * y).mean(-1, keepdim=True)
        if self.kind == "ln":
            out = out - g.mean(-1, keepdim=True)
        return r * out

    def __call__(self, x: Any) -> Any:
        import torch

        y = self.standardize(x)
        if self.w is not None and self.b is not None:
            return torch.addcmul(self.b, y, self.w)
        y = y if self.w is None else y * self.w
        return y if self.b is None else y + self.b


class Dense:
    """y = act(x W + b) for a fixed W [in, out], b [out] (or None), act (or None).

    On the CPU in float32, when this torch has it and it agrees with addmm, by oneDNN's
    linear with the activation fused (W kept only as oneDNN's layout W^T [out, in]), which
    on some CPUs runs faster kernels than torch's own float32 matmul (docs/performance.md)."""

    def __init__(self, W: Any, b: Any, dnn: bool, act: tuple[Callable, tuple[str, str]] | None = None):
        self.b, self.act = b, act
        self.Wt = W.t().contiguous() if dnn and _dnn_ok(W.dtype, act) else None  # no copy if W^T is contiguous
        self.W = None if self.Wt is not None else W

    def outputs(self, lo: int, hi: int) -> Dense:
        """The map to outputs lo:hi only (sharing this one's weights)."""
        part = Dense.__new__(Dense)
        part.act = self.act
        part.b = None if self.b is None else self.b[lo:hi]
        part.Wt = None if self.Wt is None else self.Wt[lo:hi]
        part.W = None if self.W is None else self.W[:, lo:hi]
        return part

    def __call__(self, x: Any) -> Any:
        import torch

        if self.Wt is not None and _tracked(x):
            y = torch.nn.functional.linear(x, self.Wt, self.b)
            return y if self.act is None else self.act[0](y)
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
class Layer:
    """One block as arithmetic.

    ln1(x): standardize(x) (norm1's affine folded into proj) or the model's norm1 module;
    proj[x] for x in q, k, v, qkv, kv: ln1's output -> those inputs of every head, pre-rotation
    [..., H dh] for q (W_Q and b_Q times the score scale), [..., H_kv dh] for k and v;
    W_O [H, dh, d]; out: z [..., H dh] -> P = sum_h z_h W_O[h] + b_O; post1: the norm after
    the attention (None: none); mlp(x): what the MLP adds given the residual it reads
    (norm2, MLP, post2; None: no MLP); parallel: the MLP reads the block's input."""

    ln1: Callable
    proj: dict[str, Dense]
    W_O: Any
    out: Dense
    post1: Callable | None
    mlp: Callable | None
    parallel: bool
    n_kv: int
    cap: float | None  # soft cap on the scores
    window: int | None  # sliding window (None: every earlier key)

    def attn_out(self, P: Any) -> Any:
        """What the attention adds to the residual given its sum P."""
        return P if self.post1 is None else self.post1(P)

    def finish(self, x: Any, attn_out: Any, mlp_x: Any = None) -> Any:
        """resid_post from the block's input x and its attention output; `mlp_x`: the MLP's
        output when it reads x (parallel blocks; computed here when not given)."""
        if self.parallel:
            if self.mlp is None:
                return x + attn_out
            return x + attn_out + (self.mlp(x) if mlp_x is None else mlp_x)
        mid = x + attn_out
        return mid if self.mlp is None else mid + self.mlp(mid)


@dataclass
class Model:
    layers: list[Layer]
    logits: Callable  # final residual -> the model's output transform of unembed(ln_final(.))
    n_heads: int
    d_head: int
    rotation: tuple[Any, Any] | None = None  # (cos, sin) [1 or n, s, r] of the run (rotary models)

    def rotate(self, x: Any, positions: Any = None) -> Any:
        """x [..., s or k, dh] rotated at positions 0..s-1, or at `positions` [n, k] (scored queries:
        x [E, n, H, k, dh]); the identity without rotary positions."""
        if self.rotation is None:
            return x
        cos, sin = self.rotation
        if positions is not None:
            n, k = positions.shape
            idx = positions.reshape(n, k, 1).expand(n, k, cos.shape[-1])
            cos = cos.expand(n, -1, -1).gather(1, idx)[None, :, None]  # [1, n, 1, k, r]
            sin = sin.expand(n, -1, -1).gather(1, idx)[None, :, None]
            return rotate(x, cos, sin)
        s = x.shape[-2]
        return rotate(x, cos[..., :s, :], sin[..., :s, :])


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
    dtype and device), its architecture, the torch norms, the activation, oneDNN or not."""

    bridge: Any
    arch: architecture.Architecture
    st: dict[str, Any]  # the unembedding: W_U, b_U
    norms: dict[str, _Norm | None]  # "ln1.L", "ln2.L", "ln1_post.L", "ln2_post.L", "ln_final"
    act: tuple[Callable, tuple[str, str]] | None
    dnn: bool
    cast: Callable[[Any], Any]

    def of(self, L: int, name: str) -> Any:
        """Layer L's W_Q, b_O, W_in, ... (None where the model has none) from the layer itself, in the
        activations' dtype and device: views of the model's parameters where the layout allows (the
        model-wide stacks would copy every layer's weights at once)."""
        part = self.bridge.blocks[L].mlp if name[2:] in ("in", "gate", "out") else self.bridge.blocks[L].attn
        try:
            value = getattr(part, name)
        except (AttributeError, KeyError, IndexError, RuntimeError, TypeError, ValueError):
            value = None
        return self.cast(value)

    def has_mlp(self, L: int) -> bool:
        return self.arch.has_mlp and getattr(self.bridge.blocks[L], "mlp", None) is not None

    def mlp_in_torch(self, L: int) -> bool:
        """Whether MLP L can be written out: a known activation, its weights exposed."""
        gate_ok = not self.arch.gated_mlp or self.of(L, "W_gate") is not None
        return self.act is not None and gate_ok and self.of(L, "W_in") is not None and self.of(L, "W_out") is not None


def _weights(bridge: Any, dtype: Any, device: Any) -> _Weights:
    import torch

    cfg = bridge.cfg
    arch = architecture.of(bridge)

    def cast(t: Any) -> Any:
        return None if t is None else t.detach().to(dtype=dtype, device=device)

    st = {x: cast(_stacked(bridge, x)) for x in ("W_U", "b_U")}
    norms = {"ln_final": _norm_of(getattr(bridge, "ln_final", None), cfg, cast)}
    for L in range(cfg.n_layers):
        block = bridge.blocks[L]
        for name in ("ln1", "ln2", "ln1_post", "ln2_post"):
            module = getattr(block, name, None)
            if module is not None or name in ("ln1", "ln2"):
                norms[f"{name}.{L}"] = _norm_of(module, cfg, cast)
    dnn = torch.device(device).type == "cpu" and _dnn_ok(dtype, None)
    return _Weights(bridge, arch, st, norms, activation(getattr(cfg, "act_fn", None)), dnn, cast)


def _bias(w: _Weights, name: str, L: int, shape: tuple[int, ...], like: Any) -> Any:
    b = w.of(L, name)
    return b.reshape(shape) if b is not None else like.new_zeros(shape)


def _post(w: _Weights, name: str, L: int, block: Any, in_torch: bool) -> Callable | None:
    """The norm after a sublayer (Gemma 2), in torch or the model's module; None without one."""
    if f"{name}.{L}" not in w.norms:
        return None
    norm = w.norms[f"{name}.{L}"]
    return norm if in_torch and norm is not None else _through(getattr(block, name))


def _layer(w: _Weights, L: int, torch_ln1: bool = True, torch_mlp: bool = True) -> Layer:
    """Block L as arithmetic: norm1, and norm2 + MLP (+ post2), in torch when recognised and asked
    for, else the model's modules."""
    import torch

    arch, block = w.arch, w.bridge.blocks[L]
    H, Hkv, dh, d = arch.n_heads, arch.n_kv_heads, arch.d_head, arch.d_model
    scale = arch.scales[L]
    norm1 = w.norms[f"ln1.{L}"] if torch_ln1 else None
    W_Q = w.of(L, "W_Q").permute(1, 0, 2).reshape(d, H * dh) * scale
    b_Q = _bias(w, "b_Q", L, (H * dh,), W_Q) * scale
    W_K, W_V = (w.of(L, f"W_{x}").permute(1, 0, 2).reshape(d, Hkv * dh) for x in "KV")
    b_K, b_V = (_bias(w, f"b_{x}", L, (Hkv * dh,), W_K) for x in "KV")
    qkv = Dense(*_fold(norm1, torch.cat([W_Q, W_K, W_V], 1), torch.cat([b_Q, b_K, b_V])), w.dnn)
    hq, hk = H * dh, Hkv * dh
    proj = {"qkv": qkv, "q": qkv.outputs(0, hq), "k": qkv.outputs(hq, hq + hk),
            "v": qkv.outputs(hq + hk, hq + 2 * hk), "kv": qkv.outputs(hq, hq + 2 * hk)}
    ln1 = norm1.standardize if norm1 is not None else _through(block.ln1)
    mlp: Callable | None = None
    post2 = _post(w, "ln2_post", L, block, torch_mlp)
    if w.has_mlp(L):
        norm2 = w.norms[f"ln2.{L}"]
        if torch_mlp and norm2 is not None and w.mlp_in_torch(L):
            fc_out = Dense(w.of(L, "W_out"), w.of(L, "b_out"), w.dnn)
            b_in = w.of(L, "b_in")
            inner: Callable
            if arch.gated_mlp:
                gate = Dense(*_fold(norm2, w.of(L, "W_gate"), w.of(L, "b_gate")), w.dnn, w.act)
                up = Dense(*_fold(norm2, w.of(L, "W_in"), b_in), w.dnn)

                def gated(h: Any, gate: Dense = gate, up: Dense = up, fc_out: Dense = fc_out) -> Any:
                    a = gate(h)
                    return fc_out(a * up(h) if _tracked(a) else a.mul_(up(h)))
                inner = gated
            else:
                fc_in = Dense(*_fold(norm2, w.of(L, "W_in"), b_in), w.dnn, w.act)

                def plain(h: Any, fc_in: Dense = fc_in, fc_out: Dense = fc_out) -> Any:
                    return fc_out(fc_in(h))
                inner = plain

            def mlp(x: Any, norm2: _Norm = norm2, inner: Callable = inner, post2: Callable | None = post2) -> Any:
                y = inner(norm2.standardize(x))
                return y if post2 is None else post2(y)
        else:
            ln2, module = _through(block.ln2), _through(block.mlp)

            def mlp(x: Any, ln2: Callable = ln2, module: Callable = module, post2: Callable | None = post2) -> Any:
                y = module(ln2(x))
                return y if post2 is None else post2(y)
    W_O = w.of(L, "W_O")
    out = Dense(W_O.reshape(H * dh, d), w.of(L, "b_O"), w.dnn)
    return Layer(ln1, proj, W_O, out, _post(w, "ln1_post", L, block, torch_ln1), mlp, arch.parallel, Hkv,
                 arch.attn_softcap, arch.windows[L])


def _logits(w: _Weights, in_torch: bool = True) -> Callable:
    """Final residual -> logits: ln_final, the unembedding, the output transform; in torch, or the
    model's modules."""
    norm = w.norms["ln_final"]
    bridge = w.bridge
    if in_torch and norm is not None and w.st["W_U"] is not None:
        unembed = Dense(w.st["W_U"], w.st["b_U"], w.dnn)  # not folded: W_U^T is the (tied) embedding, no copy
        return lambda x: output_transform(bridge, unembed(norm(x)))
    ln_final, unembed_module = _through(bridge.ln_final), _through(bridge.unembed)
    return lambda x: output_transform(bridge, unembed_module(ln_final(x)))


def build(bridge: Any, dtype: Any, device: Any, base: dict | None = None) -> tuple[Model, _Weights]:
    """The torch arithmetic of every block, ln_final and the unembedding, in the activations'
    dtype and device (unchecked: see check); the rotation of a rotary model from `base`'s
    cached cos and sin."""
    w = _weights(bridge, dtype, device)
    layers = [_layer(w, L) for L in range(bridge.cfg.n_layers)]
    rotation = None
    if w.arch.rotary:
        if base is None or HOOK_ROT_COS not in base:
            raise UnsupportedError("batched edge patching of a rotary model needs the run's cos and sin cached")
        rotation = (base[HOOK_ROT_COS].to(dtype=dtype, device=device), base[HOOK_ROT_SIN].to(dtype=dtype,
                                                                                             device=device))
    return Model(layers, _logits(w), bridge.cfg.n_heads, bridge.cfg.d_head, rotation), w


def tolerance(dtype: Any) -> float:
    import torch

    return {torch.float64: 1e-8, torch.float32: 1e-4}.get(dtype, 3e-2)


def _off(a: Any, b: Any, tol: float) -> float | None:
    """max |a - b| when it exceeds tol * (1 + max |b|), else None."""
    diff = float((a - b).abs().max())
    return diff if diff > tol * (1 + float(b.abs().max())) else None


def _require(diff: float | None, what: str, arch: architecture.Architecture) -> None:
    if diff is not None:
        feats = ", ".join(arch.features()) or "a GPT-2-style block"
        raise UnsupportedError(f"batched edge patching: {what} recomputed from the cached activations differs from "
                               f"the model's by {diff:.3g} ({arch.name}: {feats})")


def check(model: Model, w: _Weights, base: dict, tol: float) -> None:
    """Hold the torch arithmetic to the model on the first prompts of the base run.

    norm1, the MLP (with norm2 and post2) and ln_final + unembed are compared with the model's
    modules and replaced by them where they differ; q/k/v, z and attn_out of every layer whose
    attention the base run cached, each block's output and the logits are compared with the
    cache (UnsupportedError where they differ); a layer cached only by its residual is checked
    as a whole block (its output from its input)."""
    m = CHECK_PROMPTS
    bridge, arch = w.bridge, w.arch
    L_last = len(model.layers) - 1
    for L in range(len(model.layers)):
        own, lay = bridge.blocks[L], model.layers[L]
        pre = base[hook_resid_pre(L)][:m]
        detailed = all(k in base for k in (hook_attn_out(L), hook_z(L), *(hook_input(L, x) for x in "qkv")))
        probe = base[hook_attn_out(L)][:m] if detailed else pre
        reads = pre if arch.parallel or not detailed else pre + probe
        norm1 = w.norms[f"ln1.{L}"]
        torch_ln1 = norm1 is not None and _off(norm1(pre), _through(own.ln1)(pre), tol) is None
        if torch_ln1 and lay.post1 is not None:
            torch_ln1 = _off(lay.post1(probe), _through(own.ln1_post)(probe), tol) is None
        module_mlp = None
        if lay.mlp is not None:
            module_mlp = _through(own.mlp)(_through(own.ln2)(reads))
            if getattr(own, "ln2_post", None) is not None:
                module_mlp = _through(own.ln2_post)(module_mlp)
        torch_mlp = lay.mlp is None or _off(lay.mlp(reads), module_mlp, tol) is None
        if not (torch_ln1 and torch_mlp):
            model.layers[L] = lay = _layer(w, L, torch_ln1, torch_mlp)
        nxt = hook_resid_pre(L + 1) if L < L_last else hook_resid_post(L)
        if not detailed:
            whole = block(model, lay, pre, mask(pre.shape[1], lay.window, pre))
            _require(_off(whole, base[nxt][:m], tol), f"{nxt} (block {L} as a whole from its input)", arch)
            continue
        z = _check_attention(model, lay, L, pre, base, tol, arch)
        attn_out = lay.attn_out(lay.out(z.reshape(*z.shape[:-2], -1)))
        _require(_off(attn_out, base[hook_attn_out(L)][:m], tol), hook_attn_out(L), arch)
        _require(_off(lay.finish(pre, base[hook_attn_out(L)][:m]), base[nxt][:m], tol), f"{nxt} (the block's output)",
                 arch)
    final = base[hook_resid_post(L_last)][:m]
    if _off(model.logits(final), output_transform(bridge, bridge.unembed(bridge.ln_final(final))), tol) is not None:
        model.logits = _logits(w, in_torch=False)
    if "logits" in base:
        _require(_off(model.logits(final), base["logits"][:m], tol), "the logits (ln_final, unembed)", arch)


def _check_attention(model: Model, lay: Layer, L: int, pre: Any, base: dict, tol: float,
                     arch: architecture.Architecture) -> Any:
    """q/k/v and z of layer L recomputed from resid_pre [m, s, d] and compared with the cache;
    returns z [m, s, H, dh]."""
    m, s, _ = pre.shape
    H, Hkv, dh = arch.n_heads, lay.n_kv, arch.d_head
    h = lay.ln1(pre)
    qkv = {x: lay.proj[x](h).view(m, s, H if x == "q" else Hkv, dh) for x in "qkv"}
    scale = arch.scales[L]
    for x in "qkv":
        _require(_off(qkv[x] / (scale if x == "q" else 1.0), base[hook_input(L, x)][:m], tol), hook_input(L, x), arch)
    q, k, v = (model.rotate(qkv[x].transpose(1, 2)) if x != "v" else qkv[x].transpose(1, 2) for x in "qkv")
    z = attend(q, k, v, mask(s, lay.window, pre), lay.cap).transpose(1, 2)
    _require(_off(z, base[hook_z(L)][:m], tol), hook_z(L), arch)
    return z


def causal(s: int, ref: Any) -> Any:
    """Additive causal mask [s, s]: 0 on and below the diagonal, -inf above."""
    return mask(s, None, ref)


def mask(s: int, window: int | None, ref: Any) -> Any:
    """Additive mask [s, s]: 0 where key j is visible from query i (j <= i and i - j < window), -inf elsewhere."""
    import torch

    i = torch.arange(s, device=ref.device)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep &= (i[:, None] - i[None, :]) < window
    return torch.zeros(s, s, dtype=ref.dtype, device=ref.device).masked_fill(~keep, float("-inf"))


def scored_mask(positions: Any, s: int, window: int | None, ref: Any) -> Any:
    """[n, k, s] additive: key j is visible to the query at scored position p iff j <= p (and p - j < window)."""
    import torch

    j = torch.arange(s, device=ref.device)[None, None, :]
    p = positions[:, :, None]
    hidden = j > p
    if window is not None:
        hidden |= (p - j) >= window
    return torch.zeros(hidden.shape, dtype=ref.dtype, device=ref.device).masked_fill(hidden, float("-inf"))


def attend(q: Any, k: Any, v: Any, bias: Any, cap: float | None = None) -> Any:
    """softmax(cap(q k^T) + bias) v over the last two dims, q [..., H, sq, dh] already scaled (and
    rotated), k and v [..., H or H_kv, s, dh] (key/value heads repeated over their query heads'
    groups), bias [sq, s] or broadcasting to [..., sq, s] (0 or -inf); cap: c tanh(x / c).  As
    3-D batched products (4-D matmuls of permuted views are several times slower on CPU)."""
    import torch

    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    lead, sq, s = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    scores = torch.bmm(q3, k3.transpose(1, 2))
    if cap and _tracked(scores):
        scores = torch.tanh(scores / cap) * cap
    elif cap:
        scores = scores.div_(cap).tanh_().mul_(cap)
    scores.view(*lead, sq, s).add_(bias)
    return torch.bmm(torch.softmax(scores, dim=-1), v3).view(*lead, sq, v.shape[-1])


def block(model: Model, lay: Layer, x: Any, bias: Any) -> Any:
    """A whole block at every position: x [B, s, d] -> resid_post [B, s, d]; `bias` its mask [s, s]."""
    H, dh = model.n_heads, model.d_head
    B, s, d = x.shape
    h = lay.ln1(x)
    q = model.rotate(lay.proj["q"](h).view(B, s, H, dh).transpose(1, 2))
    kv = lay.proj["kv"](h).view(B, s, 2, lay.n_kv, dh).permute(2, 0, 3, 1, 4)
    k, v = model.rotate(kv[0]), kv[1]
    z = attend(q.contiguous(), k.contiguous(), v.contiguous(), bias, lay.cap).transpose(1, 2)  # [B, s, H, dh]
    return lay.finish(x, lay.attn_out(lay.out(z.reshape(B, s, H * dh))))


def block_at(model: Model, lay: Layer, x: Any, positions: Any, scored: Any) -> Any:
    """The last block at the scored positions only: x [E, n, s, d] -> resid_post [E, n, k, d]
    (keys and values at every position, queries and everything after at the scored ones);
    `scored` its mask [n, k, s]."""
    H, dh = model.n_heads, model.d_head
    E, n, s, d = x.shape
    k_ = positions.shape[1]
    h = lay.ln1(x)
    kv = lay.proj["kv"](h).view(E, n, s, 2, lay.n_kv, dh).permute(3, 0, 1, 4, 2, 5)  # [2, E, n, Hkv, s, dh]
    k, v = model.rotate(kv[0]).contiguous(), kv[1].contiguous()
    q = lay.proj["q"](at(positions, h)).view(E, n, k_, H, dh).transpose(2, 3)
    q = model.rotate(q, positions).contiguous()
    z = attend(q, k, v, scored[:, None], lay.cap).transpose(2, 3)  # [E, n, k, H, dh]
    attn = lay.attn_out(lay.out(z.reshape(E, n, k_, H * dh)))
    return lay.finish(at(positions, x), attn, lay.mlp(at(positions, x)) if lay.parallel and lay.mlp else None)


def at(positions: Any, x: Any) -> Any:
    """x [E, n, s, ...] -> [E, n, k, ...] at the scored positions."""
    idx = positions.reshape(1, *positions.shape, *([1] * (x.dim() - 3)))
    return x.gather(2, idx.expand(x.shape[0], -1, -1, *x.shape[3:]))
