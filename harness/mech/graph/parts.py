"""What the edge graph's forward passes (mech.graph.forward) read: every sender's write in a run
(`Writes`, `run_writes`), each layer's per-head projections (`head_weights`), the hooks a base run
caches for them (`cache_names`), and each query head's queries or keys from its own input (`own_qk`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...model import architecture
from ...model.bridge import Bridge
from ...spec import names
from ...spec.names import hook_mlp_out, hook_z
from ..block.arith import Norm
from ..block.layer import Layer
from ..edges import writes
from ..edges.sets import cache_names as block_cache_names


def cache_names(n_layers: int, has_mlp: bool) -> list[str]:
    """Hooks a base run caches for graph runs: every sender's activation (embed, z, MLP outputs)
    and what mech.block.fidelity.check holds the arithmetic to."""
    out = block_cache_names(n_layers)
    return out + ([hook_mlp_out(layer) for layer in range(n_layers)] if has_mlp else [])


@dataclass
class HeadWeights:
    """One layer's per-head projections (norm1's affine folded in, mech.block.read): Wqkv
    [H, 3, d, dh], each head's q, k and v (k and v repeated from each query head's key/value head),
    before any QK-norm, scale or rotation, and their biases bqkv [3, 1, H, 1, dh]; W_O [H, dh, d],
    b_O [d]."""

    Wqkv: Any
    bqkv: Any
    W_O: Any
    b_O: Any


def head_weights(lay: Layer, arch: architecture.Architecture) -> HeadWeights:
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
    return HeadWeights(torch.stack([Wq, Wk, Wv], 1).contiguous(), torch.stack([bq, bk, bv], 0)[:, None, :, None, :],
                        W_O.reshape(H, dh, d), b_O if b_O is not None else W_O.new_zeros(d))


def own_qk(lay: Layer, arch: architecture.Architecture, which: str, p: Any, inputs: Any) -> Any:
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


def run_writes(bridge: Bridge, cache: dict[str, Any], s: int, dtype: Any, layers: set[int] | None = None) -> Writes:
    """The senders' writes in the run `cache` holds, at positions < s; with `layers`, those of the
    senders in these layers only (and embed; the other layers' entries are None)."""
    L = int(bridge.cfg.n_layers)
    embed = writes.activation(bridge, cache, names.Embed())[:, :s].to(dtype)
    z = [cache[hook_z(layer)][:, :s].to(dtype) if layers is None or layer in layers else None for layer in range(L)]
    mlp = [cache[hook_mlp_out(layer)][:, :s].to(dtype) if hook_mlp_out(layer) in cache
           and (layers is None or layer in layers) else None for layer in range(L)]
    return Writes(embed, z, mlp)


def norm_of(ln: Any) -> Norm | None:
    """The norm whose `standardize` a layer's ln1 is (None: the model's own module)."""
    owner = getattr(ln, "__self__", None)
    return owner if isinstance(owner, Norm) and ln.__func__ is Norm.standardize else None


