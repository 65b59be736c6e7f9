"""A loaded model's architecture in the terms harness's exact arithmetic needs.

harness recomputes parts of the forward pass by hand (a receiver head's attention when
one of its inputs is patched; whole blocks in the batched edge sweep), so it must know
every feature that changes that arithmetic.  `describe(bridge)` finds the model's family
(model.families: one declarative adapter per family; an architecture no family covers is
refused, naming those supported) and reads the rest from the bridge's config and, for
Hugging Face models, from the wrapped model's config and attention modules:

* positions: `learned` (GPT-2: added to the embedding), `rotary` (q and k rotated per
  position after their projections, on the first `rotary_dim` dimensions of each head:
  all of them for Llama, Qwen2/3, Mistral, Gemma 2/3, OLMo 2; a quarter for Pythia), or
  `none`; `rotary_keys`: per layer, which of the model's rotation tables it uses (Gemma 3:
  its `layer_types` entry; None: the one table);
* grouped-query attention: `n_kv_heads` key/value heads shared by groups of
  n_heads / n_kv_heads query heads (query head h reads key/value head `kv_head(h)`);
* the score scale per layer (1/sqrt(d_head), or Gemma's query_pre_attn_scalar^-1/2),
  a soft cap c tanh(s / c) on the scores (`attn_softcap`) and on the final logits
  (`logit_softcap`), and the sliding window of each layer (a key j is visible from query
  i iff 0 <= i - j < window; None: every earlier key), as the family declares them read;
* `qk_norm`: a norm on each head's queries and keys after the projection (`head`: over
  each head's values, Qwen3 and Gemma 3; `projection`: over all heads' values of the
  layer, OLMo 2), as the family declares it and the attention modules confirm;
* blocks: `parallel` (attention and MLP both read the block's input: GPT-NeoX, GPT-J),
  `pre_norms` (a norm before each sublayer; OLMo 2 has none), `post_norms` (a norm after
  the attention and after the MLP, before the residual add: Gemma 2 and 3, OLMo 2),
  `gated_mlp` (SwiGLU / GeGLU), the norm kind (`LN`, `RMS` or `none`).

What harness cannot reproduce is refused by `check_supported` in one line naming the
feature.  The rest is held to the model's own activations on every run
(mech.block.attention.check, mech.block.fidelity.check): a mismatch stops the run rather than
giving numbers that are not the model's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedError
from ..registry import RegistryError
from . import families
from .bridge import Bridge

POSITIONS = ("learned", "rotary", "none")


@dataclass(frozen=True)
class Architecture:
    name: str  # the Hugging Face architecture (e.g. LlamaForCausalLM) or TransformerLensNative
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    positions: str  # one of POSITIONS
    rotary_dim: int  # dimensions of each head that rotate (0 without rotary positions)
    norm: str  # "LN" | "RMS" | "none"
    gated_mlp: bool
    parallel: bool
    post_norms: bool
    has_mlp: bool
    scales: tuple[float, ...]  # per layer: scores = scale * q . k
    windows: tuple[int | None, ...]  # per layer: the sliding window, None for full causal attention
    attn_softcap: float | None
    logit_softcap: float | None
    family: str = "native"  # the model.families adapter's name
    qk_norm: str | None = None  # None | "head" | "projection"
    pre_norms: bool = True  # a norm before each sublayer (OLMo 2: none)
    rotary_keys: tuple[str | None, ...] = ()  # per layer, the rotation table it uses (None: the model's one)

    @property
    def grouped(self) -> bool:
        """Whether several query heads share a key/value head."""
        return self.n_kv_heads < self.n_heads

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    def kv_head(self, head: int) -> int:
        """The key/value head query head `head` reads (repeat_kv's grouping: consecutive query heads)."""
        return head // (self.n_heads // self.n_kv_heads)

    def features(self) -> list[str]:
        """The features beyond a GPT-2-style block, in words (for reports)."""
        out = []
        if self.rotary:
            out.append(f"rotary positions ({self.rotary_dim} of {self.d_head} dimensions per head)")
        if self.grouped:
            out.append(f"grouped-query attention ({self.n_kv_heads} key/value heads for {self.n_heads} query heads)")
        if self.norm == "RMS":
            out.append("RMSNorm")
        if self.qk_norm:
            out.append("QK-norm " + ("per head" if self.qk_norm == "head" else "over the projection"))
        if not self.pre_norms:
            out.append("no norms before the sublayers")
        if self.gated_mlp:
            out.append("gated MLP")
        if self.parallel:
            out.append("parallel attention and MLP")
        if self.post_norms:
            out.append("norms after each sublayer")
        if self.attn_softcap:
            out.append(f"attention soft cap {self.attn_softcap:g}")
        if self.logit_softcap:
            out.append(f"logit soft cap {self.logit_softcap:g}")
        sliding = sorted({w for w in self.windows if w is not None})
        if sliding:
            layers = [str(i) for i, w in enumerate(self.windows) if w is not None]
            out.append(f"sliding-window attention ({', '.join(map(str, sliding))} tokens, layers {', '.join(layers)})")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The `model.architecture` record of evidence.json."""
        return {"name": self.name, "family": self.family, "positions": self.positions, "rotary_dim": self.rotary_dim,
                "n_key_value_heads": self.n_kv_heads, "norm": self.norm, "gated_mlp": self.gated_mlp,
                "parallel_blocks": self.parallel, "post_norms": self.post_norms,
                "attn_softcap": self.attn_softcap, "logit_softcap": self.logit_softcap,
                "sliding_windows": list(self.windows), "qk_norm": self.qk_norm, "pre_norms": self.pre_norms,
                "features": self.features()}


def _hf_config(bridge: Bridge) -> Any | None:
    model = getattr(bridge, "original_model", None)
    cfg = getattr(model, "config", None)
    return cfg if cfg is not None and hasattr(cfg, "model_type") else None


def _positive(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def _rope_fraction(hf: Any) -> float:
    """The fraction of each head's dimensions that rotate (Pythia: rotary_pct 0.25)."""
    for holder in (getattr(hf, "rope_parameters", None), getattr(hf, "rope_scaling", None)):
        if isinstance(holder, dict) and isinstance(holder.get("partial_rotary_factor"), int | float):
            return float(holder["partial_rotary_factor"])
    for key in ("partial_rotary_factor", "rotary_pct"):
        v = getattr(hf, key, None)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return 1.0


def _attention_module(bridge: Bridge, layer: int) -> Any:
    attn = bridge.blocks[layer].attn
    return getattr(attn, "original_component", None) or getattr(attn, "_original_component", None)


def family_of(bridge: Bridge) -> families.Family:
    """The model.families adapter of a bridge's architecture; UnsupportedError naming the supported
    architectures when no family covers it."""
    hf = _hf_config(bridge)
    if hf is None:
        name = families.NATIVE
    else:
        archs = getattr(hf, "architectures", None) or [type(bridge.original_model).__name__]
        name = str(archs[0])
    try:
        return families.find(name)
    except RegistryError as exc:
        raise UnsupportedError(str(exc)) from None


def _windows(family: families.Family, hf: Any, cfg: Any, modules: list[Any]) -> list[int | None]:
    """Each layer's sliding window as the family declares it read (None: full causal attention)."""
    out: list[int | None] = []
    for layer, module in enumerate(modules):
        window = None
        if family.windows == "module":
            window = getattr(module, "sliding_window", None)
        elif family.windows == "config":
            window = getattr(hf, "sliding_window", None)
        elif hf is None and getattr(cfg, "use_local_attn", False):
            types = getattr(cfg, "attn_types", None) or []
            window = getattr(cfg, "window_size", None) if layer < len(types) and types[layer] == "local" else None
        out.append(int(window) if isinstance(window, int) and not isinstance(window, bool) else None)
    return out


def _qk_norm(family: families.Family, modules: list[Any], name: str) -> str | None:
    """The family's QK-norm, confirmed by the attention modules (UnsupportedError when the model has one
    its family does not declare, or lacks the one it declares)."""
    present = {any(getattr(m, n, None) is not None for n in ("q_norm", "k_norm")) for m in modules if m is not None}
    if True in present and not family.qk_norm:
        raise UnsupportedError(f"{name}: norms on each head's queries and keys (q_norm, k_norm), which its family "
                               f"adapter ({family.name}) does not declare")
    if family.qk_norm and present != {True}:
        raise UnsupportedError(f"{name}: its family ({family.name}) declares a QK-norm the model's attention lacks")
    return family.qk_norm


def describe(bridge: Bridge) -> Architecture:
    """The architecture of a TransformerBridge (native or Hugging Face)."""
    import math

    cfg = bridge.cfg
    hf = _hf_config(bridge)
    family = family_of(bridge)
    L, H, dh = int(cfg.n_layers), int(cfg.n_heads), int(cfg.d_head)
    n_kv = int(getattr(cfg, "n_key_value_heads", None) or H)
    kind = str(getattr(cfg, "positional_embedding_type", "standard") or "standard")
    positions = {"standard": "learned", "rotary": "rotary"}.get(kind, kind)
    if hf is not None and positions == "learned" and not hasattr(bridge, "pos_embed"):
        positions = "none"
    rotary_dim = 0
    if positions == "rotary":
        given = getattr(cfg, "rotary_dim", None)
        rotary_dim = int(given) if given else int(dh * _rope_fraction(hf)) if hf is not None else dh
    norm_type = str(getattr(cfg, "normalization_type", None) or "none")
    norm = "RMS" if norm_type.startswith("RMS") else "LN" if norm_type.startswith("LN") else "none"
    block0 = bridge.blocks[0]
    modules = [_attention_module(bridge, layer) if hf is not None else None for layer in range(L)]
    scales = []
    for module in modules:
        scale = getattr(module, "scaling", None) if module is not None else None
        if scale is None:
            use = getattr(cfg, "use_attn_scale", True)
            a = float(getattr(cfg, "attn_scale", -1.0) or -1.0)
            scale = (1.0 / a if a > 0 else 1.0 / math.sqrt(dh)) if use else 1.0
        scales.append(float(scale))
    attn_cap = _positive(getattr(hf, "attn_logit_softcapping", None)) if hf is not None else None
    logit_cap = _positive(getattr(hf, "final_logit_softcapping", None)) if hf is not None else None
    attn_cap = attn_cap or _positive(getattr(cfg, "attn_scores_soft_cap", None))
    logit_cap = logit_cap or _positive(getattr(cfg, "output_logits_soft_cap", None))
    name = families.NATIVE
    if hf is not None:
        archs = getattr(hf, "architectures", None) or [type(bridge.original_model).__name__]
        name = str(archs[0])
    keys: tuple[str | None, ...] = (None,) * L
    if family.rotary == "layer_type" and positions == "rotary":
        types = list(getattr(hf, "layer_types", None) or [])
        if len(types) < L:
            raise UnsupportedError(f"{name}: a rotary table per layer type, but the config's layer_types "
                                   f"name {len(types)} of {L} layers")
        keys = tuple(str(t) for t in types[:L])
    return Architecture(
        name=name, n_layers=L, n_heads=H, n_kv_heads=n_kv, d_head=dh, d_model=int(cfg.d_model),
        positions=positions, rotary_dim=rotary_dim, norm=norm, gated_mlp=bool(getattr(cfg, "gated_mlp", False)),
        parallel=bool(getattr(cfg, "parallel_attn_mlp", False)), post_norms=hasattr(block0, "ln1_post"),
        has_mlp=not bool(getattr(cfg, "attn_only", False)), scales=tuple(scales),
        windows=tuple(_windows(family, hf, cfg, modules)), attn_softcap=attn_cap, logit_softcap=logit_cap,
        family=family.name, qk_norm=_qk_norm(family, modules, name), pre_norms=hasattr(block0, "ln1"),
        rotary_keys=keys)


def check_supported(arch: Architecture, rotary_adjacent_pairs: bool = False) -> None:
    """Raise UnsupportedError naming the first feature harness cannot reproduce exactly."""
    if arch.positions not in POSITIONS:
        raise UnsupportedError(f"{arch.name}: positional embedding type {arch.positions!r} is not supported "
                               f"(harness reproduces {', '.join(POSITIONS)} positions)")
    if rotary_adjacent_pairs:
        raise UnsupportedError(f"{arch.name}: rotary positions on adjacent pairs of dimensions (GPT-J style) are not "
                               "supported (harness rotates the two halves of each head, as Llama and GPT-NeoX do)")
    if arch.n_heads % arch.n_kv_heads:
        raise UnsupportedError(f"{arch.name}: {arch.n_heads} query heads cannot be grouped over "
                               f"{arch.n_kv_heads} key/value heads")
    if arch.rotary and not 0 < arch.rotary_dim <= arch.d_head or arch.rotary_dim % 2:
        raise UnsupportedError(f"{arch.name}: rotary dimension {arch.rotary_dim} of a {arch.d_head}-dimensional "
                               "head is not supported (an even number of at most d_head)")


_KNOWN: weakref.WeakKeyDictionary[Any, Architecture] = weakref.WeakKeyDictionary()


def of(bridge: Bridge) -> Architecture:
    """describe(bridge), computed once per bridge (held beside it, the bridge untouched) and
    checked (check_supported)."""
    arch = _KNOWN.get(bridge)
    if arch is None:
        arch = describe(bridge)
        check_supported(arch, bool(getattr(bridge.cfg, "rotary_adjacent_pairs", False)) and arch.rotary)
        _KNOWN[bridge] = arch
    return arch
