"""An independent float64 reference forward pass and patching oracle for Hugging Face causal LMs.

It reads ONLY a `save_pretrained` directory's `config.json` and `model.safetensors` and implements
the architectures from their definitions (no transformers or TransformerLens modeling code is
called).  Supported `model_type`s: llama (with Llama 3 rope scaling too), mistral, qwen2, qwen3, olmo2,
gemma2, gemma3_text, gpt_neox, gpt2.  Anything it does not implement exactly (rope types other than
default / linear / llama3, bidirectional attention, Gemma 3's attention soft cap, layer-index attention
scaling, unknown weights, ...) is refused with a ValueError.

Forward pass (everything float64; tokens [n, s]; positions 0..s-1)
------------------------------------------------------------------
    embed      = W_E[tok] * embed_scale (+ W_pos[pos] for GPT-2),   embed_scale = sqrt(d_model) for Gemma 2 / 3, else 1
    block l:   r = resid_pre_l
               x = norm1_l(r)                     (OLMo 2 has no norm1: x = r)
               q_h = x W_Q[h] + b_Q[h]            (query head h)
               k_h = x W_K[kv(h)] + b_K[kv(h)],   v_h likewise,   kv(h) = h // (H / H_kv)   (GQA)
               QK-norm (Qwen 3, Gemma 3, OLMo 2), after the projection and BEFORE rotary, on q and k (not v):
                 per head (Qwen 3, Gemma 3): q_h <- rms(q_h) * w_q, the RMS over the head's d_head dims and
                   w_q [d_head] shared by the heads (Gemma 3: * (1 + w_q)); k of each KV head likewise with w_k;
                 whole projection (OLMo 2): q = [q_0 | ... | q_{H-1}] <- rms(q) * w_q, the RMS over all H * d_head
                   dims jointly and w_q [H * d_head], then split into heads; k over all H_kv * d_head dims with w_k
                 (rms(y) = y / sqrt(mean(y^2) + eps), eps = rms_norm_eps as for the other norms)
               q_h, k_h <- rotary_l(q_h), rotary_l(k_h) at the tokens' own positions
               scores = scale * q_h k_h^T,        scale = d_head**-0.5, Gemma 2 / 3: query_pre_attn_scalar**-0.5
               scores = c * tanh(scores / c)      (Gemma 2 attn_logit_softcapping c), THEN the mask:
               key j is visible from query i iff j <= i and, on a sliding layer of window w, j > i - w
               (the query and the w-1 keys before it: w keys in all)
               z_h = softmax(scores) v_h                                   -> cache "z"  [n, s, H, d_head]
               P = sum_h z_h W_O[h] + b_O                                  -> cache "attn_pre_norm"
               A = post1_l(P) (Gemma 2 / 3, OLMo 2) or P                   -> cache "attn_out"
               sequential: resid_mid = r + A;  M = post2_l(mlp_l(norm2_l(resid_mid)))   (OLMo 2: no norm2)
               parallel (GPT-NeoX use_parallel_residual): M = mlp_l(norm2_l(r))
               M                                                           -> cache "mlp_out"
               resid_pre_{l+1} = r + A + M
    logits     = c_f * tanh((norm_f(resid_final) W_U) / c_f)   (Gemma 2 / 3 final_logit_softcapping c_f; else no cap)

    norms:  LayerNorm (x - mean) / sqrt(var + eps) * w + b  (GPT-2, GPT-NeoX);
            RMSNorm x / sqrt(mean(x^2) + eps) * w  (Llama, Mistral, Qwen2 / 3, OLMo 2);  Gemma: ... * (1 + w)
            (Gemma 3's q_norm / k_norm too).
    rotary: base inv_freq_i = theta ** (-2i / r_dim) for 2i < r_dim, then by rope_type:
              default: as is;   linear (factor f): inv_freq_i / f;
              llama3 (factor f, low_freq_factor a, high_freq_factor b, original_max_position_embeddings N):
                wavelen_i = 2 pi / inv_freq_i;
                wavelen_i < N / b:  inv_freq_i (unchanged);   wavelen_i > N / a:  inv_freq_i / f;
                otherwise (N / b <= wavelen_i <= N / a):  (1 - t) inv_freq_i / f + t inv_freq_i,
                  t = (N / wavelen_i - a) / (b - a)
                (N: the rope parameters' original_max_position_embeddings, a top-level config
                original_max_position_embeddings winning as in transformers, else max_position_embeddings);
            angle = pos * inv_freq, emb = [angle, angle];
            on the first 2 * len(inv_freq) dims: x * cos(emb) + rotate_half(x) * sin(emb),
            rotate_half([x1, x2]) = [-x2, x1]; the rest passes.  r_dim = d_head, or for GPT-NeoX
            int(d_head * partial_rotary_factor) (an odd r_dim rotates r_dim + 1 dims, as HF does).
            One rope for every layer, except Gemma 3: rope_parameters per layer type ({"sliding_attention":
            {...}, "full_attention": {...}}; the legacy keys rope_theta / rope_local_base_freq / rope_scaling
            are read as transformers reads them: rope_scaling updates the full-attention entry, missing thetas
            default to 1e6 (full) and 1e4 (sliding)); each layer uses its type's inv_freq.
    MLPs:   gated (Llama family, Qwen, OLMo 2, Gemma): down(act(gate(x)) * up(x));  else out(act(in(x))).

Patching semantics (the definition the harness must reproduce)
---------------------------------------------------------------
Nodes are tuples.  Senders: ("head", l, h), ("embed",), ("mlp", l).  Receivers / hops:
("q" | "k" | "v", l, h) (an input of query head h of layer l), ("mlp", l), ("logits",).

* The write of a sender and its change D when its activation is replaced (base run unless said):
  - head A = (l, h): activation z_A (per query head).  Without post-attention norms write(z_A) = z_A W_O[h]
    and D = (z'_A - z_A) W_O[h].  With a post-attention norm (Gemma 2 / 3, OLMo 2) layer l adds post1_l(P),
    P = sum_h z_h W_O[h] + b_O, and D = post1_l(P + (z'_A - z_A) W_O[h]) - post1_l(P), every other head at
    its base value.  Several heads of one layer change jointly inside one post1 call; groups spanning
    layers (and embed / MLP senders) sum their per-layer changes.
  - embed: D = embed' - embed.    MLP l: D = mlp_out' - mlp_out, its write after the post-feedforward norm
    (Gemma 2 / 3, OLMo 2: post2_l(mlp_l(...))).
  - replacement values z'_A / embed' / mlp_out': "resample" = the source run's values (same prompt index),
    "zero" = 0, "mean" = a given per-position mean tensor (broadcast over the batch).
* Edge A -> B.x (B = query head h of layer L, x in q/k/v): only B's input x reads r' = resid_pre_L(base) + D:
  x_B = norm1_L(r') W_x + b_x (W_Q[h] for q; W_K / W_V of kv(h) for k / v); B's other two inputs come from
  norm1_L(resid_pre_L(base)); then rotary, scale, soft cap, mask, softmax: z'_B = pattern v.  Only B's z is
  replaced (the other query heads of its KV group keep the base keys / values); the forward is recomputed
  from layer L on (layer L's other heads keep their base z; its MLP and later layers see the change).
  With a QK-norm, B's q / k passes through it at the receiver's positions, computed from r': per head, only
  the slice x_B is normalised (q_h(r') = rms(norm1(r') W_Q[h] + b_Q[h]) * w_q); over the whole projection
  (OLMo 2), B's query is the h-slice of q_norm(norm1(r') W_Q + b_Q) with the RMS over ALL heads' projections
  of r' (and B's key the kv(h)-slice of k_norm over all KV heads' projections of r'); every other head, and
  B's other inputs, keep their base values.
* Edge A -> logits: logits of resid_final(base) + D (final norm, unembedding, final soft cap).
* Edge A -> MLP m: MLP m reads norm2_m(resid_mid_m(base) + D) (sequential; OLMo 2: resid_mid_m(base) + D, no
  norm2) or norm2_m(resid_pre_m(base) + D) (parallel; there a head of layer m -> MLP m is not an edge:
  ValueError); its new output (after the post-feedforward norm where there is one) replaces MLP m's output in
  the forward.
* Path A -> R1 -> ... -> Rk -> last: D_0 as above; each intermediate hop computes its output change when
  only its listed input reads base + D_{i-1} (a head hop: the change of its write, post-norm as above; an
  MLP hop: mlp_out' - mlp_out), and only that change is passed on; the last hop receives it as an edge.
* Every hop must read after what feeds it writes (embed < heads of l < MLP l < heads of l+1; in a parallel
  block heads and MLP of layer l both read resid_pre_l); otherwise ValueError.

API: `Oracle(model_dir)`, `.run(tokens, patch)`, `.patched_logits(...)`, `.sender_delta(...)`,
`.ablated_logits(...)`, `.mean_values(...)`; see their docstrings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

F64 = torch.float64

Node = tuple[Any, ...]
Norm = tuple[Tensor, Tensor | None]  # (weight, bias or None)

DECODERS = ("llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma2", "gemma3_text")  # model.layers.{l}.self_attn
GEMMAS = ("gemma2", "gemma3_text")
ROPE_KEYS = {  # the rope parameters each implemented rope_type reads (besides rope_type / type)
    "default": {"rope_theta", "partial_rotary_factor"},
    "linear": {"rope_theta", "partial_rotary_factor", "factor"},
    "llama3": {"rope_theta", "partial_rotary_factor", "factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
}

SENDER_KINDS = ("head", "embed", "mlp")
RECEIVER_KINDS = ("q", "k", "v", "mlp", "logits")


@dataclass
class Patch:
    """Interventions for `Oracle.run` (all tensors float64, broadcastable to the shapes given).

    z:           {(layer, head): z [n, s, d_head]}  replaces that query head's z after it is computed
                 (so it feeds W_O, the post-attention norm and everything after).
    head_inputs: {(layer, head, "q"|"k"|"v"): D [n, s, d_model]}  only that input of that query head reads
                 norm1(resid_pre + D) (its own copy of k / v under GQA; through the QK norm, module doc); z
                 replacement wins over this.
    mlp_in:      {layer: D [n, s, d_model]}  MLP `layer` reads norm2(its input residual + D) (OLMo 2: no norm2).
    mlp_out:     {layer: M [n, s, d_model]}  replaces what MLP `layer` adds to the residual.
    final:       D [n, s, d_model]  added to the final residual before the final norm (the logits' read only).
    """

    z: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    head_inputs: dict[tuple[int, int, str], Tensor] = field(default_factory=dict)
    mlp_in: dict[int, Tensor] = field(default_factory=dict)
    mlp_out: dict[int, Tensor] = field(default_factory=dict)
    final: Tensor | None = None


@dataclass
class _Layer:
    """One block's weights in math layout (x @ W): W_Q [H, d, dh], W_K/W_V [H_kv, d, dh], W_O [H, dh, d].
    norm1 / norm2 None: no norm before the sublayer (OLMo 2).  q_norm [H, dh] / k_norm [H_kv, dh]: the QK-norm
    weights (a per-head weight [dh] repeated over the heads; a whole-projection weight viewed per head)."""

    norm1: Norm | None
    norm2: Norm | None
    post1: Norm | None
    post2: Norm | None
    W_Q: Tensor
    b_Q: Tensor
    W_K: Tensor
    b_K: Tensor
    W_V: Tensor
    b_V: Tensor
    W_O: Tensor
    b_O: Tensor
    W_gate: Tensor | None  # [d, d_mlp] for gated MLPs
    b_gate: Tensor | None
    W_in: Tensor  # [d, d_mlp] (the "up" projection of a gated MLP)
    b_in: Tensor
    W_out: Tensor  # [d_mlp, d]
    b_out: Tensor
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None


class _StateDict:
    """The safetensors state dict in float64; `take` marks keys used, `check_used` refuses leftovers."""

    IGNORABLE = (".rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias", ".attn.bias", ".attn.masked_bias")

    def __init__(self, sd: Mapping[str, Tensor]):
        self.sd = {k: v.to(F64) for k, v in sd.items()}
        self.used: set[str] = set()

    def take(self, key: str) -> Tensor:
        if key not in self.sd:
            raise ValueError(f"model.safetensors has no {key!r}")
        self.used.add(key)
        return self.sd[key]

    def maybe(self, key: str) -> Tensor | None:
        return self.take(key) if key in self.sd else None

    def check_used(self) -> None:
        left = sorted(k for k in self.sd if k not in self.used and not k.endswith(self.IGNORABLE))
        if left:
            raise ValueError(f"weights the oracle does not implement: {left}")


def _act(name: str, x: Tensor) -> Tensor:
    """The MLP activation by its transformers name (gelu_new and gelu_pytorch_tanh are the same tanh form)."""
    if name in ("silu", "swish"):
        return x * torch.sigmoid(x)
    if name == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
    if name == "relu":
        return torch.relu(x)
    raise ValueError(f"activation {name!r} not implemented")


def _is_node(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) > 0 and isinstance(x[0], str)


class Oracle:
    """Float64 reference of a `save_pretrained` directory (module doc).  Attributes: n_layers, n_heads,
    n_kv_heads, d_head, d_model, d_vocab, model_type, parallel, post_norms, attn_scale, attn_softcap,
    final_softcap, windows (per layer, None = full causal), rotary_dims (dims rotated; 0 = learned
    positions), inv_freq (layer 0's), layer_inv_freq (per layer), qk_norm (None, "head": per head, or
    "all": over the whole projection), embed_scale."""

    def __init__(self, model_dir: Path | str):
        from safetensors.torch import load_file

        d = Path(model_dir)
        self.config: dict[str, Any] = json.loads((d / "config.json").read_text())
        sd = _StateDict(load_file(str(d / "model.safetensors")))
        mt = self.config.get("model_type")
        self.model_type: str = str(mt)
        self.qk_norm: str | None = None
        if mt in DECODERS:
            self._load_decoder(self.config, sd)
        elif mt == "gpt_neox":
            self._load_neox(self.config, sd)
        elif mt == "gpt2":
            self._load_gpt2(self.config, sd)
        else:
            raise ValueError(f"model_type {mt!r} not implemented")
        sd.check_used()
        rep = self.n_heads // self.n_kv_heads
        if rep * self.n_kv_heads != self.n_heads:
            raise ValueError("n_heads is not a multiple of n_kv_heads")
        self.kv_of = torch.arange(self.n_heads) // rep  # query head -> its key/value head

    # ------------------------------------------------------------------ loading

    def set_rotary(self, rotary_dim: int, theta: float) -> None:
        """Every layer: inv_freq_i = theta ** -(2i / rotary_dim), i = 0 .. ceil(rotary_dim / 2) - 1 (HF's
        arange(0, dim, 2)), unscaled."""
        self.set_inv_freq([self.rope_inv_freq({"rope_type": "default", "rope_theta": theta}, rotary_dim)]
                          * self.n_layers)

    def set_inv_freq(self, per_layer: Sequence[Tensor]) -> None:
        """Each layer's inv_freq (all of one length: the rotated dims are 2 * len)."""
        if len(per_layer) != self.n_layers or len({len(f) for f in per_layer}) != 1:
            raise ValueError("one inv_freq per layer, all of one length")
        self.layer_inv_freq = list(per_layer)
        self.inv_freq = self.layer_inv_freq[0]
        self.rotary_dims = 2 * len(self.inv_freq)
        if self.rotary_dims > self.d_head:
            raise ValueError("rotary dims exceed d_head")

    @staticmethod
    def rope_inv_freq(rp: Mapping[str, Any], rotary_dim: int) -> Tensor:
        """inv_freq of one rope-parameter dict (rope_theta filled in) on `rotary_dim` dims (module doc):
        default, linear (/ factor) or llama3 (piecewise); any other rope_type or key is refused."""
        rtype = rp.get("rope_type", rp.get("type", "default"))
        if "type" in rp and rp["type"] != rtype:
            raise ValueError(f"rope parameters with both type {rp['type']!r} and rope_type {rtype!r}")
        if rtype not in ROPE_KEYS:
            raise ValueError(f"rope_type {rtype!r} not implemented")
        unknown = set(rp) - ROPE_KEYS[rtype] - {"rope_type", "type"}
        if unknown:
            raise ValueError(f"rope parameters {sorted(unknown)} not implemented for rope_type {rtype!r}")
        inv = 1.0 / float(rp["rope_theta"]) ** (torch.arange(0, rotary_dim, 2, dtype=F64) / rotary_dim)
        if rtype == "linear":
            inv = inv / float(rp["factor"])
        elif rtype == "llama3":
            f, a, b = float(rp["factor"]), float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
            N = float(rp["original_max_position_embeddings"])
            if not b > a:
                raise ValueError("llama3 rope needs high_freq_factor > low_freq_factor")
            wavelen = 2 * math.pi / inv
            t = (N / wavelen - a) / (b - a)
            inv = torch.where(wavelen < N / b, inv, torch.where(wavelen > N / a, inv / f, (1 - t) * inv / f + t * inv))
        return inv

    @staticmethod
    def _rope_params(cfg: dict[str, Any], default_theta: float = 10000.0) -> dict[str, Any]:
        """The one (flat) rope-parameter dict of `cfg` with rope_theta (else a top-level rope_theta, else
        `default_theta`) and, for llama3, original_max_position_embeddings filled in as transformers'
        standardize_rope_params does."""
        rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rp.setdefault("rope_theta", cfg.get("rope_theta", default_theta))
        rtype = rp.get("rope_type", rp.get("type", "default"))
        if rtype == "llama3":
            if "original_max_position_embeddings" in cfg:  # a top-level value wins (transformers)
                rp["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
            rp.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
        return rp

    @staticmethod
    def _gemma3_rope_params(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Gemma 3's rope parameters per layer type, read as Gemma3TextConfig.convert_rope_params_to_dict does:
        {"sliding_attention": {...}, "full_attention": {...}} (or the legacy rope_theta / rope_local_base_freq /
        rope_scaling keys); rope_scaling updates the full-attention entry; thetas default to 1e6 / 1e4."""
        rp = cfg.get("rope_parameters")
        rp = {k: (dict(v) if v is not None else None) for k, v in (rp or {}).items()}
        if rp and not set(rp) <= {"sliding_attention", "full_attention"}:
            raise ValueError(f"Gemma 3 rope_parameters keyed by {sorted(rp)}: expected layer types")
        full = rp.get("full_attention") or {"rope_type": "default"}
        sliding = rp.get("sliding_attention") or {"rope_type": "default"}
        full.update(cfg.get("rope_scaling") or {})
        full.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
        sliding.setdefault("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))
        for p in (full, sliding):
            p.setdefault("rope_type", p.get("type", "default"))
            if p["rope_type"] == "llama3":
                p.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
        return {"full_attention": full, "sliding_attention": sliding}

    def _load_decoder(self, cfg: dict[str, Any], sd: _StateDict) -> None:
        """Llama / Mistral / Qwen2 / Qwen3 / OLMo 2 / Gemma 2 / Gemma 3 (`model.layers.{l}.self_attn.{q,k,v,o}_proj`,
        gated MLP; Qwen3 / Gemma 3 / OLMo 2 also `self_attn.{q,k}_norm`)."""
        mt = cfg["model_type"]
        gemma = mt in GEMMAS
        olmo = mt == "olmo2"
        self.d_model = d = cfg["hidden_size"]
        self.n_heads = H = cfg["num_attention_heads"]
        self.n_kv_heads = Hkv = cfg.get("num_key_value_heads") or H
        self.d_head = dh = cfg.get("head_dim") or d // H
        self.n_layers = L = cfg["num_hidden_layers"]
        self.eps = cfg["rms_norm_eps"]
        self.norm_kind = "rms_1p" if gemma else "rms"
        self.act = cfg["hidden_activation"] if gemma else cfg.get("hidden_act", "silu")
        self.parallel = False
        self.post_norms = gemma or olmo
        self.qk_norm = {"qwen3": "head", "gemma3_text": "head", "olmo2": "all"}.get(mt)
        self.embed_scale = math.sqrt(d) if gemma else 1.0
        self.attn_scale = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else dh**-0.5
        self.attn_softcap = cfg.get("attn_logit_softcapping") if gemma else None
        self.final_softcap = cfg.get("final_logit_softcapping") if gemma else None
        if mt == "gemma3_text" and self.attn_softcap is not None:
            # Gemma3Attention never passes it to the attention function: transformers ignores it
            raise ValueError("Gemma 3 with attn_logit_softcapping: transformers ignores it; refusing to guess")
        if gemma and cfg.get("use_bidirectional_attention"):
            raise ValueError("bidirectional attention not implemented")
        self.windows: list[int | None] = self._decoder_windows(cfg, mt, L)
        if mt == "gemma3_text":
            by_type = self._gemma3_rope_params(cfg)
            rps = [by_type["full_attention" if w is None else "sliding_attention"] for w in self.windows]
        else:
            rps = [self._rope_params(cfg)] * L
        if any(rp.get("partial_rotary_factor", 1.0) != 1.0 for rp in rps):
            raise ValueError("partial rotary is not used by this family in transformers; refusing to guess")
        self.set_inv_freq([self.rope_inv_freq(rp, dh) for rp in rps])

        self.W_E = sd.take("model.embed_tokens.weight")
        self.W_pos: Tensor | None = None
        self.d_vocab = self.W_E.shape[0]
        self.layers: list[_Layer] = []
        for l in range(L):
            p = f"model.layers.{l}."

            def lin(name: str, heads: int, p: str = p) -> tuple[Tensor, Tensor]:
                w = sd.take(p + f"self_attn.{name}.weight")  # nn.Linear [heads*dh, d]
                b = sd.maybe(p + f"self_attn.{name}.bias")
                w = w.view(heads, dh, d).transpose(1, 2)  # [heads, d, dh]
                return w, (b.view(heads, dh) if b is not None else torch.zeros(heads, dh, dtype=F64))

            W_Q, b_Q = lin("q_proj", H)
            W_K, b_K = lin("k_proj", Hkv)
            W_V, b_V = lin("v_proj", Hkv)
            W_O = sd.take(p + "self_attn.o_proj.weight").T.reshape(H, dh, d)  # [d, H*dh] -> [H, dh, d]
            b_O = sd.maybe(p + "self_attn.o_proj.bias")

            def mlp(name: str, p: str = p) -> tuple[Tensor, Tensor | None]:
                b = sd.maybe(p + f"mlp.{name}.bias")
                return sd.take(p + f"mlp.{name}.weight").T, b

            W_gate, b_gate = mlp("gate_proj")
            W_in, b_in = mlp("up_proj")
            W_out, b_out = mlp("down_proj")

            def norm(name: str, p: str = p) -> Norm:
                return sd.take(p + f"{name}.weight"), None

            def qk_norm(name: str, heads: int, p: str = p) -> Tensor | None:
                """[heads, dh]: a per-head weight [dh] repeated, or a whole-projection weight [heads*dh] split."""
                if self.qk_norm is None:
                    return None
                w = sd.take(p + f"self_attn.{name}.weight")
                want = dh if self.qk_norm == "head" else heads * dh
                if w.shape != (want,):
                    raise ValueError(f"{p}self_attn.{name}.weight has shape {tuple(w.shape)}, expected ({want},)")
                return w.expand(heads, dh).clone() if self.qk_norm == "head" else w.view(heads, dh)

            self.layers.append(_Layer(
                norm1=None if olmo else norm("input_layernorm"),
                norm2=(None if olmo else
                       norm("pre_feedforward_layernorm" if gemma else "post_attention_layernorm")),
                post1=norm("post_attention_layernorm") if self.post_norms else None,
                post2=norm("post_feedforward_layernorm") if self.post_norms else None,
                q_norm=qk_norm("q_norm", H), k_norm=qk_norm("k_norm", Hkv),
                W_Q=W_Q, b_Q=b_Q, W_K=W_K, b_K=b_K, W_V=W_V, b_V=b_V, W_O=W_O,
                b_O=b_O if b_O is not None else torch.zeros(d, dtype=F64),
                W_gate=W_gate, b_gate=b_gate if b_gate is not None else torch.zeros(W_gate.shape[1], dtype=F64),
                W_in=W_in, b_in=b_in if b_in is not None else torch.zeros(W_in.shape[1], dtype=F64),
                W_out=W_out, b_out=b_out if b_out is not None else torch.zeros(d, dtype=F64)))
        self.norm_f: Norm = (sd.take("model.norm.weight"), None)
        self.W_U = self._unembedding(cfg, sd, "lm_head.weight", self.W_E)

    @staticmethod
    def _decoder_windows(cfg: dict[str, Any], mt: str, L: int) -> list[int | None]:
        """Per-layer sliding windows: Mistral uses `sliding_window` on every layer; Qwen2 / Qwen3 and Gemma 2 / 3
        use it on the layers `layer_types` marks "sliding_attention" (Qwen only with use_sliding_window);
        Llama and OLMo 2 none.  Without layer_types: Gemma 2 alternates sliding / full, Gemma 3 makes every
        sliding_window_pattern-th layer (default 6) full, Qwen slides from max_window_layers on."""
        w = cfg.get("sliding_window")
        if mt in ("llama", "olmo2"):
            return [None] * L
        if mt == "mistral":
            return [w] * L
        if mt in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            w = None
        types = cfg.get("layer_types")
        if types is None:
            if mt == "gemma2":
                types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
            elif mt == "gemma3_text":
                pattern = cfg.get("sliding_window_pattern", 6)
                types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)]
            else:  # qwen2 / qwen3
                mwl = cfg.get("max_window_layers", 28)
                types = ["sliding_attention" if w is not None and i >= mwl else "full_attention" for i in range(L)]
        for t in types:
            if t not in ("sliding_attention", "full_attention"):
                raise ValueError(f"layer type {t!r} not implemented")
        if any(t == "sliding_attention" for t in types) and w is None:
            raise ValueError("sliding layers without a sliding_window")
        return [w if t == "sliding_attention" else None for t in types[:L]]

    def _unembedding(self, cfg: dict[str, Any], sd: _StateDict, key: str, W_E: Tensor) -> Tensor:
        """W_U [d, vocab]: the saved output matrix, else the token embedding when tied."""
        w = sd.maybe(key)
        if w is None:
            if not cfg.get("tie_word_embeddings", True):
                raise ValueError(f"untied model without {key!r}")
            w = W_E
        return w.T

    def _load_neox(self, cfg: dict[str, Any], sd: _StateDict) -> None:
        """GPT-NeoX / Pythia: fused query_key_value whose output rows are, per head, [q | k | v] (d_head each)."""
        self.d_model = d = cfg["hidden_size"]
        self.n_heads = self.n_kv_heads = H = cfg["num_attention_heads"]
        self.d_head = dh = d // H
        self.n_layers = L = cfg["num_hidden_layers"]
        self.eps = cfg.get("layer_norm_eps", 1e-5)
        self.norm_kind = "layer"
        self.act = cfg.get("hidden_act", "gelu")
        self.parallel = bool(cfg.get("use_parallel_residual", True))
        self.post_norms = False
        self.embed_scale = 1.0
        self.attn_scale = dh**-0.5
        self.attn_softcap = self.final_softcap = None
        rp = self._rope_params(cfg, cfg.get("rotary_emb_base", 10000.0))
        pct = rp.get("partial_rotary_factor", cfg.get("rotary_pct", 0.25))
        self.set_inv_freq([self.rope_inv_freq(rp, int(dh * pct))] * L)
        self.windows = [None] * L

        self.W_E = sd.take("gpt_neox.embed_in.weight")
        self.W_pos = None
        self.d_vocab = self.W_E.shape[0]
        self.layers = []
        for l in range(L):
            p = f"gpt_neox.layers.{l}."
            w = sd.take(p + "attention.query_key_value.weight").view(H, 3, dh, d)
            b = sd.maybe(p + "attention.query_key_value.bias")
            b = b.view(H, 3, dh) if b is not None else torch.zeros(H, 3, dh, dtype=F64)
            W = w.transpose(2, 3)  # [H, 3, d, dh]
            dense_b = sd.maybe(p + "attention.dense.bias")
            self.layers.append(_Layer(
                norm1=(sd.take(p + "input_layernorm.weight"), sd.take(p + "input_layernorm.bias")),
                norm2=(sd.take(p + "post_attention_layernorm.weight"), sd.take(p + "post_attention_layernorm.bias")),
                post1=None, post2=None,
                W_Q=W[:, 0], b_Q=b[:, 0], W_K=W[:, 1], b_K=b[:, 1], W_V=W[:, 2], b_V=b[:, 2],
                W_O=sd.take(p + "attention.dense.weight").T.reshape(H, dh, d),
                b_O=dense_b if dense_b is not None else torch.zeros(d, dtype=F64),
                W_gate=None, b_gate=None,
                W_in=sd.take(p + "mlp.dense_h_to_4h.weight").T, b_in=sd.take(p + "mlp.dense_h_to_4h.bias"),
                W_out=sd.take(p + "mlp.dense_4h_to_h.weight").T, b_out=sd.take(p + "mlp.dense_4h_to_h.bias")))
        self.norm_f = (sd.take("gpt_neox.final_layer_norm.weight"), sd.take("gpt_neox.final_layer_norm.bias"))
        key = "embed_out.weight" if "embed_out.weight" in sd.sd else "lm_head.weight"
        self.W_U = self._unembedding(cfg, sd, key, self.W_E)

    def _load_gpt2(self, cfg: dict[str, Any], sd: _StateDict) -> None:
        """GPT-2: Conv1D weights [in, out]; c_attn columns q | k | v, head h at h*d_head within each."""
        if cfg.get("scale_attn_by_inverse_layer_idx", False):
            raise ValueError("scale_attn_by_inverse_layer_idx not implemented")
        self.d_model = d = cfg["n_embd"]
        self.n_heads = self.n_kv_heads = H = cfg["n_head"]
        self.d_head = dh = d // H
        self.n_layers = L = cfg["n_layer"]
        self.eps = cfg.get("layer_norm_epsilon", 1e-5)
        self.norm_kind = "layer"
        self.act = cfg.get("activation_function", "gelu_new")
        self.parallel = False
        self.post_norms = False
        self.embed_scale = 1.0
        self.attn_scale = dh**-0.5 if cfg.get("scale_attn_weights", True) else 1.0
        self.attn_softcap = self.final_softcap = None
        self.inv_freq = torch.zeros(0, dtype=F64)
        self.layer_inv_freq = [self.inv_freq] * L
        self.rotary_dims = 0
        self.windows = [None] * L
        self.n_positions = cfg.get("n_positions", 1024)

        pre = "transformer."
        self.W_E = sd.take(pre + "wte.weight")
        self.W_pos = sd.take(pre + "wpe.weight")
        self.d_vocab = self.W_E.shape[0]
        self.layers = []
        for l in range(L):
            p = f"{pre}h.{l}."
            w = sd.take(p + "attn.c_attn.weight").view(d, 3, H, dh).permute(1, 2, 0, 3)  # [3, H, d, dh]
            b = sd.take(p + "attn.c_attn.bias").view(3, H, dh)
            self.layers.append(_Layer(
                norm1=(sd.take(p + "ln_1.weight"), sd.take(p + "ln_1.bias")),
                norm2=(sd.take(p + "ln_2.weight"), sd.take(p + "ln_2.bias")),
                post1=None, post2=None,
                W_Q=w[0], b_Q=b[0], W_K=w[1], b_K=b[1], W_V=w[2], b_V=b[2],
                W_O=sd.take(p + "attn.c_proj.weight").view(H, dh, d), b_O=sd.take(p + "attn.c_proj.bias"),
                W_gate=None, b_gate=None,
                W_in=sd.take(p + "mlp.c_fc.weight"), b_in=sd.take(p + "mlp.c_fc.bias"),
                W_out=sd.take(p + "mlp.c_proj.weight"), b_out=sd.take(p + "mlp.c_proj.bias")))
        self.norm_f = (sd.take(pre + "ln_f.weight"), sd.take(pre + "ln_f.bias"))
        self.W_U = self._unembedding(cfg, sd, "lm_head.weight", self.W_E)

    # ------------------------------------------------------------------ pieces of the forward pass

    def norm(self, x: Tensor, nw: Norm | None) -> Tensor:
        """LayerNorm (x - mean)/sqrt(var + eps) * w + b;  RMSNorm x/sqrt(mean x^2 + eps) * w  (Gemma: * (1 + w));
        None: no norm (x itself)."""
        if nw is None:
            return x
        w, b = nw
        if self.norm_kind == "layer":
            x = x - x.mean(-1, keepdim=True)
            y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w
            return y + b if b is not None else y
        y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * (1.0 + w) if self.norm_kind == "rms_1p" else y * w

    def embed(self, tokens: Tensor) -> Tensor:
        """What enters the residual before block 0: W_E[tok] * embed_scale (+ W_pos[pos])."""
        s = tokens.shape[1]
        x = self.W_E[tokens] * self.embed_scale
        if self.W_pos is not None:
            if s > self.W_pos.shape[0]:
                raise ValueError(f"prompt of {s} tokens exceeds {self.W_pos.shape[0]} positions")
            x = x + self.W_pos[:s]
        return x

    def unembed(self, resid_final: Tensor) -> Tensor:
        """c_f * tanh(norm_f(resid) W_U / c_f), or norm_f(resid) W_U without a final soft cap."""
        logits = self.norm(resid_final, self.norm_f) @ self.W_U
        if self.final_softcap:
            logits = self.final_softcap * torch.tanh(logits / self.final_softcap)
        return logits

    def rotary(self, x: Tensor, l: int = 0) -> Tensor:
        """x [n, s, h, dh] at positions 0..s-1: x*cos + rotate_half(x)*sin on the first rotary_dims dims, with
        layer l's inv_freq."""
        r = self.rotary_dims
        if r == 0:
            return x
        s = x.shape[1]
        angle = torch.arange(s, dtype=F64)[:, None] * self.layer_inv_freq[l][None, :]  # [s, r/2]
        emb = torch.cat([angle, angle], -1)[None, :, None, :]  # [1, s, 1, r]
        xr, xp = x[..., :r], x[..., r:]
        rot = torch.cat([-xr[..., r // 2:], xr[..., : r // 2]], -1)
        return torch.cat([xr * emb.cos() + rot * emb.sin(), xp], -1)

    def visible(self, s: int, window: int | None) -> Tensor:
        """[s, s] bool, True where query i may attend key j: j <= i and (window w) j > i - w."""
        i = torch.arange(s)[:, None]
        j = torch.arange(s)[None, :]
        ok = j <= i
        if window is not None:
            ok = ok & (j > i - window)
        return ok

    def project(self, l: int, which: str, x_normed: Tensor, heads: Sequence[int] | Tensor | None = None) -> Tensor:
        """q, k or v [n, s, len(heads), dh] of the given QUERY heads (k / v from each one's KV head kv(h)), q and k
        after the QK norm (module doc; over the whole projection, all heads' projections of x_normed enter it)."""
        layer = self.layers[l]
        idx = torch.arange(self.n_heads) if heads is None else torch.as_tensor(heads, dtype=torch.long)
        if which == "q":
            sel, W, b, nw = idx, layer.W_Q, layer.b_Q, layer.q_norm
        elif which in ("k", "v"):
            sel = self.kv_of[idx]
            W, b, nw = (layer.W_K, layer.b_K, layer.k_norm) if which == "k" else (layer.W_V, layer.b_V, None)
        else:
            raise ValueError(f"not a head input: {which!r}")
        if nw is None:
            return torch.einsum("nsd,hde->nshe", x_normed, W[sel]) + b[sel]
        if self.qk_norm == "head":
            return self.qk_rms(torch.einsum("nsd,hde->nshe", x_normed, W[sel]) + b[sel], nw[sel])
        return self.qk_rms(torch.einsum("nsd,hde->nshe", x_normed, W) + b, nw)[:, :, sel]

    def qk_rms(self, y: Tensor, w: Tensor) -> Tensor:
        """The QK norm of y [n, s, heads, dh] with weight w [heads, dh]: the RMS per head (qk_norm "head") or over
        all heads jointly ("all"); times w (Gemma: 1 + w)."""
        dims = (-1,) if self.qk_norm == "head" else (-2, -1)
        y = y / torch.sqrt(y.pow(2).mean(dims, keepdim=True) + self.eps)
        return y * (1.0 + w) if self.norm_kind == "rms_1p" else y * w

    def attend(self, l: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Per query head (q, k, v [n, s, h, dh], before rotary): (z [n, s, h, dh], pattern [n, h, s, s])."""
        q, k = self.rotary(q, l), self.rotary(k, l)
        scores = torch.einsum("nqhe,nkhe->nhqk", q, k) * self.attn_scale
        if self.attn_softcap:
            scores = self.attn_softcap * torch.tanh(scores / self.attn_softcap)
        mask = self.visible(q.shape[1], self.windows[l])
        pattern = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.einsum("nhqk,nkhe->nqhe", pattern, v), pattern

    def mlp(self, l: int, resid: Tensor) -> Tensor:
        """What MLP l adds when it reads `resid`: post2(mlp(norm2(resid))) (post2 only for Gemma 2 / 3 and OLMo 2;
        OLMo 2 has no norm2)."""
        layer = self.layers[l]
        x = self.norm(resid, layer.norm2)
        if layer.W_gate is not None:
            assert layer.b_gate is not None
            h = _act(self.act, x @ layer.W_gate + layer.b_gate) * (x @ layer.W_in + layer.b_in)
        else:
            h = _act(self.act, x @ layer.W_in + layer.b_in)
        out = h @ layer.W_out + layer.b_out
        return self.norm(out, layer.post2) if layer.post2 is not None else out

    def attn_out(self, l: int, attn_pre_norm: Tensor) -> Tensor:
        """What the attention of layer l adds given P = sum_h z_h W_O[h] + b_O: post1(P) (Gemma 2 / 3, OLMo 2)
        or P."""
        post1 = self.layers[l].post1
        return self.norm(attn_pre_norm, post1) if post1 is not None else attn_pre_norm

    # ------------------------------------------------------------------ forward

    def run(self, tokens: Tensor, patch: Patch | None = None) -> dict[str, Any]:
        """The forward pass of `tokens` [n, s] (long) with `patch` applied.  Returns float64 tensors:
        logits [n, s, vocab] (after the final soft cap), embed [n, s, d], resid_final [n, s, d], and per
        layer lists: resid_pre, resid_mid (resid_pre + attn_out; in a parallel block not read by the MLP),
        mlp_in (the residual the MLP reads, before any Patch.mlp_in), q / k / v [n, s, H, dh] (per QUERY
        head, after any QK norm and before rotary; k / v copied from each head's KV head), pattern [n, H, s, s],
        z [n, s, H, dh], attn_pre_norm (P), attn_out (post1(P) or P), mlp_out [n, s, d]."""
        patch = patch or Patch()
        self._check_patch(patch)
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        x = self.embed(tokens)
        keys = ("resid_pre", "resid_mid", "mlp_in", "q", "k", "v", "pattern", "z", "attn_pre_norm", "attn_out",
                "mlp_out")
        out: dict[str, Any] = {"embed": x, **{k: [] for k in keys}}
        for l, layer in enumerate(self.layers):
            out["resid_pre"].append(x)
            xn = self.norm(x, layer.norm1)
            qkv = {w: self.project(l, w, xn) for w in "qkv"}
            for w in "qkv":
                out[w].append(qkv[w])
            inputs = {(h, w): D for (L, h, w), D in patch.head_inputs.items() if L == l}
            if inputs:
                qkv = {w: t.clone() for w, t in qkv.items()}
                for (h, w), D in inputs.items():
                    qkv[w][:, :, h] = self.project(l, w, self.norm(x + D, layer.norm1), [h])[:, :, 0]
            z, pattern = self.attend(l, qkv["q"], qkv["k"], qkv["v"])
            zs = {h: val for (L, h), val in patch.z.items() if L == l}
            if zs:
                z = z.clone()
                for h, val in zs.items():
                    z[:, :, h] = val.to(F64)
            P = torch.einsum("nshe,hed->nsd", z, layer.W_O) + layer.b_O
            A = self.attn_out(l, P)
            mid = x + A
            m_in = x if self.parallel else mid
            M = self.mlp(l, m_in + patch.mlp_in[l]) if l in patch.mlp_in else self.mlp(l, m_in)
            if l in patch.mlp_out:
                M = patch.mlp_out[l].to(F64).expand_as(M)
            for k, t in (("pattern", pattern), ("z", z), ("attn_pre_norm", P), ("attn_out", A), ("resid_mid", mid),
                         ("mlp_in", m_in), ("mlp_out", M)):
                out[k].append(t)
            x = mid + M
        out["resid_final"] = x
        out["logits"] = self.unembed(x + patch.final if patch.final is not None else x)
        return out

    def _check_patch(self, patch: Patch) -> None:
        for l, h in patch.z:
            self._check_head(l, h)
        for l, h, w in patch.head_inputs:
            self._check_head(l, h)
            if w not in ("q", "k", "v"):
                raise ValueError(f"not a head input: {w!r}")
        for l in (*patch.mlp_in, *patch.mlp_out):
            self._check_layer(l)

    def _check_layer(self, l: Any) -> None:
        if not isinstance(l, int) or not 0 <= l < self.n_layers:
            raise ValueError(f"no layer {l!r} (the model has {self.n_layers})")

    def _check_head(self, l: Any, h: Any) -> None:
        self._check_layer(l)
        if not isinstance(h, int) or not 0 <= h < self.n_heads:
            raise ValueError(f"no head {h!r} (layer {l} has {self.n_heads})")

    # ------------------------------------------------------------------ nodes and paths

    def _node(self, node: Any, role: str) -> Node:
        """Check a node tuple (module doc) for role 'sender' or 'receiver'."""
        if not _is_node(node):
            raise ValueError(f"not a node: {node!r}")
        kind = node[0]
        kinds = SENDER_KINDS if role == "sender" else RECEIVER_KINDS
        if kind not in kinds:
            raise ValueError(f"{node!r} is not a {role} (kinds {kinds})")
        arity = {"head": 3, "q": 3, "k": 3, "v": 3, "mlp": 2, "embed": 1, "logits": 1}[kind]
        if len(node) != arity:
            raise ValueError(f"malformed node {node!r}")
        if arity == 3:
            self._check_head(node[1], node[2])
        elif arity == 2:
            self._check_layer(node[1])
        return tuple(node)

    @staticmethod
    def _writes_at(node: Node) -> float:
        """Stream order of a writer: embed -1, heads (and head hops) of l at 2l, MLP l at 2l + 1."""
        if node[0] == "embed":
            return -1
        return 2 * node[1] + (node[0] == "mlp")

    def _reads_at(self, node: Node) -> float:
        """A reader sees writers strictly before this: head inputs of L 2L, MLP m 2m + 1 (parallel: 2m)."""
        if node[0] == "logits":
            return math.inf
        if node[0] == "mlp":
            return 2 * node[1] + (0 if self.parallel else 1)
        return 2 * node[1]

    def parse(self, edge_or_path: Any) -> tuple[list[Node], list[Node]]:
        """(senders, hops) of an edge (sender, receiver) or a path [sender, hop1, ..., last], where the
        sender may be one node or a list / tuple of nodes (a group).  Checks kinds and stream order."""
        if _is_node(edge_or_path) or not isinstance(edge_or_path, (list, tuple)) or len(edge_or_path) < 2:
            raise ValueError(f"an edge or path needs a sender and at least one receiver: {edge_or_path!r}")
        first, *rest = edge_or_path
        senders = [self._node(first, "sender")] if _is_node(first) else [self._node(s, "sender") for s in first]
        if not senders or len(set(senders)) != len(senders):
            raise ValueError(f"empty or repeated senders: {first!r}")
        hops = [self._node(h, "receiver") for h in rest]
        for i, hop in enumerate(hops):
            if hop[0] == "logits" and i != len(hops) - 1:
                raise ValueError("logits can only be the last receiver")
            feeding = senders if i == 0 else [hops[i - 1]]
            for f in feeding:
                if self._writes_at(f) >= self._reads_at(hop):
                    why = (" (in a parallel block a head of layer m does not feed MLP m)"
                           if self.parallel and hop[0] == "mlp" and f[0] in ("head", "q", "k", "v")
                           and f[1] == hop[1] else "")
                    raise ValueError(f"{f!r} does not write before {hop!r} reads{why}")
        return senders, hops

    # ------------------------------------------------------------------ patching

    @staticmethod
    def _value(cache: Mapping[str, Any], node: Node) -> Tensor:
        """A sender's activation in a run: z [n, s, dh] (head), embed or mlp_out [n, s, d]."""
        if node[0] == "head":
            return cache["z"][node[1]][:, :, node[2]]
        if node[0] == "embed":
            return cache["embed"]
        return cache["mlp_out"][node[1]]

    def mean_values(self, tokens: Tensor, senders: Sequence[Node]) -> dict[Node, Tensor]:
        """{sender: its activation averaged over the batch of `tokens`, per position [s, ...]}."""
        cache = self.run(tokens)
        return {self._node(s, "sender"): self._value(cache, tuple(s)).mean(0) for s in senders}

    def _replacements(self, senders: Sequence[Node], base: Mapping[str, Any], source_tokens: Tensor | None,
                      replacement: str, mean: Tensor | Mapping[Node, Tensor] | None) -> dict[Node, Tensor]:
        if replacement == "resample":
            if source_tokens is None:
                raise ValueError("resample needs source tokens")
            src = self.run(source_tokens)
            if src["embed"].shape != base["embed"].shape:
                raise ValueError("source and base tokens differ in shape")
            return {s: self._value(src, s) for s in senders}
        if replacement == "zero":
            return {s: torch.zeros_like(self._value(base, s)) for s in senders}
        if replacement == "mean":
            if mean is None:
                raise ValueError("mean replacement needs `mean`")
            if isinstance(mean, Tensor):
                if len(senders) != 1:
                    raise ValueError("several senders need a {sender: mean} mapping")
                mean = {senders[0]: mean}
            return {s: torch.as_tensor(mean[s], dtype=F64).expand_as(self._value(base, s)) for s in senders}
        raise ValueError(f"unknown replacement {replacement!r}")

    def write_change(self, base: Mapping[str, Any], l: int, dz: Mapping[int, Tensor]) -> Tensor:
        """The change of layer l's attention write when heads h get z_h + dz[h] (the rest at base):
        sum_h dz_h W_O[h], or with a post-attention norm post1(P + sum_h dz_h W_O[h]) - post1(P)."""
        layer = self.layers[l]
        change = sum(torch.einsum("nse,ed->nsd", dz[h], layer.W_O[h]) for h in dz)
        assert isinstance(change, Tensor)
        if layer.post1 is None:
            return change
        P = base["attn_pre_norm"][l]
        return self.norm(P + change, layer.post1) - self.norm(P, layer.post1)

    def _delta(self, base: Mapping[str, Any], senders: Sequence[Node], new: Mapping[Node, Tensor]) -> Tensor:
        """D_0: per-layer joint head changes (write_change) plus embed / MLP output changes, summed."""
        D = torch.zeros_like(base["embed"])
        by_layer: dict[int, dict[int, Tensor]] = {}
        for s in senders:
            if s[0] == "head":
                by_layer.setdefault(s[1], {})[s[2]] = new[s] - self._value(base, s)
            else:
                D = D + (new[s] - self._value(base, s))
        for l, dz in by_layer.items():
            D = D + self.write_change(base, l, dz)
        return D

    def sender_delta(self, base_tokens: Tensor, source_tokens: Tensor | None, senders: Node | Sequence[Node],
                     replacement: str = "resample", mean: Tensor | Mapping[Node, Tensor] | None = None) -> Tensor:
        """D [n, s, d_model]: the change of the sender(s)' write into the residual stream (module doc)."""
        group = [self._node(senders, "sender")] if _is_node(senders) else [self._node(s, "sender") for s in senders]
        base = self.run(base_tokens)
        return self._delta(base, group, self._replacements(group, base, source_tokens, replacement, mean))

    def head_z(self, base: Mapping[str, Any], l: int, h: int, which: str, D: Tensor) -> Tensor:
        """z'_B [n, s, dh] of query head h of layer l when only its input `which` reads resid_pre_l + D."""
        layer = self.layers[l]
        qkv = {w: base[w][l][:, :, [h]] for w in "qkv"}
        qkv[which] = self.project(l, which, self.norm(base["resid_pre"][l] + D, layer.norm1), [h])
        return self.attend(l, qkv["q"], qkv["k"], qkv["v"])[0][:, :, 0]

    def _hop_change(self, base: Mapping[str, Any], hop: Node, D: Tensor) -> Tensor:
        """An intermediate hop's output change when only its listed input reads base + D."""
        if hop[0] == "mlp":
            m = hop[1]
            return self.mlp(m, base["mlp_in"][m] + D) - base["mlp_out"][m]
        _, l, h = hop
        dz = self.head_z(base, l, h, hop[0], D) - base["z"][l][:, :, h]
        return self.write_change(base, l, {h: dz})

    def patched_logits(self, base_tokens: Tensor, source_tokens: Tensor | None, edge_or_path: Any,
                       replacement: str = "resample", mean: Tensor | Mapping[Node, Tensor] | None = None) -> Tensor:
        """Logits [n, s, vocab] of `base_tokens` with the edge (sender, receiver) or the path
        [sender, hop1, ..., last] patched (module doc).  The sender may be a group (a list of nodes).
        replacement: "resample" (from `source_tokens`' run), "zero", or "mean" (`mean`: a per-position
        tensor for a single sender, or {sender: tensor}; broadcast over the batch)."""
        senders, hops = self.parse(edge_or_path)
        base = self.run(base_tokens)
        D = self._delta(base, senders, self._replacements(senders, base, source_tokens, replacement, mean))
        for hop in hops[:-1]:
            D = self._hop_change(base, hop, D)
        last = hops[-1]
        if last[0] == "logits":
            return self.unembed(base["resid_final"] + D)
        if last[0] == "mlp":
            m = last[1]
            return self.run(base_tokens, Patch(mlp_out={m: self.mlp(m, base["mlp_in"][m] + D)}))["logits"]
        _, l, h = last
        return self.run(base_tokens, Patch(z={(l, h): self.head_z(base, l, h, last[0], D)}))["logits"]

    def ablated_logits(self, tokens: Tensor, heads: Sequence[tuple[int, int]],
                       values: Mapping[tuple[int, int], Tensor] | None = None) -> Tensor:
        """Logits with the z of each (layer, head) in `heads` replaced by 0 (values None) or values[(l, h)]
        (broadcastable to [n, s, dh]), everything downstream recomputed."""
        n, s = torch.as_tensor(tokens).shape
        z = {}
        for l, h in heads:
            self._check_head(l, h)
            z[(l, h)] = (torch.zeros(n, s, self.d_head, dtype=F64) if values is None
                         else torch.as_tensor(values[(l, h)], dtype=F64).expand(n, s, self.d_head))
        return self.run(tokens, Patch(z=z))["logits"]
