"""Tiny random-weight Hugging Face causal LMs, one per architecture family, for exact tests.

Each builder makes a seeded `XForCausalLM(XConfig(...))`, overwrites every parameter with seeded
noise (see `perturb`), and writes it with `save_pretrained` (float32 safetensors + config.json; no
tokenizer files, no generation_config.json).  Nothing is downloaded.

What each family exercises:

| family    | class               | features                                                                       |
|-----------|---------------------|--------------------------------------------------------------------------------|
| `llama`   | LlamaForCausalLM    | RMSNorm (w * x/rms), rotary on the full head (rotate_half), SwiGLU gated MLP,  |
|           |                     | GQA (4 query heads, 2 KV heads), untied lm_head, no biases                     |
| `mistral` | MistralForCausalLM  | as llama, plus a sliding window of 6 on every layer (prompts of ~12 tokens     |
|           |                     | cross it), rope_theta 1e6                                                       |
| `qwen2`   | Qwen2ForCausalLM    | q/k/v biases (o_proj without), GQA, tied embeddings (no lm_head.weight saved)  |
| `gemma2`  | Gemma2ForCausalLM   | RMSNorm as x/rms * (1 + w), embeddings times sqrt(d_model), post-attention and |
|           |                     | post-feedforward norms, attention soft cap (5) and final-logit soft cap (3),    |
|           |                     | layers sliding (window 6) / full / sliding, query_pre_attn_scalar 24 with       |
|           |                     | head_dim 16 (n_heads*d_head = 64 != d_model = 32), GELU-tanh gated MLP, GQA,    |
|           |                     | tied embeddings                                                                 |
| `neox`    | GPTNeoXForCausalLM  | Pythia-style: LayerNorm with biases, fused per-head interleaved query_key_value |
|           |                     | rotary on the first 25% of each head (rotary_pct 0.25, d_head 16 -> 4 dims),    |
|           |                     | parallel attention + MLP (use_parallel_residual), untied `embed_out`, erf GELU |
| `gpt2`    | GPT2LMHeadModel     | the control: learned positions, LayerNorm, Conv1D layout, GELU-new, tied wte   |

Weights are chosen so that nothing can hide: norm weights are 1 + N(0, 0.3) (Gemma: N(0, 0.3),
as its norm multiplies by 1 + w), norm biases and all linear biases N(0, 0.2); matrices
N(0, 1/fan_in); the query and key projections are scaled by `QK_GAIN` so attention patterns are
sharp (scores of several units, beyond Gemma's soft cap); the unembedding is scaled so logits
are a few units (beyond Gemma's final soft cap).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "gemma2", "neox", "gpt2")

QK_GAIN = 2.0  # query/key projections are N(0, QK_GAIN**2 / fan_in)
UNEMBED_GAIN = 2.0  # logits ~ N(0, UNEMBED_GAIN**2) for unit-scale normalised residuals

VOCAB = 100


def _config(family: str, overrides: dict[str, Any]):
    """The transformers config of `family` with `overrides` (config keyword arguments) applied."""
    import transformers as tf

    common: dict[str, Any] = {"vocab_size": VOCAB, "max_position_embeddings": 64}
    kw: dict[str, Any]
    if family == "llama":
        kw = {**common, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
        cls = tf.LlamaConfig
    elif family == "mistral":
        kw = {**common, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "rms_norm_eps": 1e-6, "sliding_window": 6, "tie_word_embeddings": False,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
        cls = tf.MistralConfig
    elif family == "qwen2":
        kw = {**common, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
        cls = tf.Qwen2Config
    elif family == "gemma2":
        kw = {**common, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 64, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 24,
              "sliding_window": 6, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
              "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0, "tie_word_embeddings": True,
              "hidden_activation": "gelu_pytorch_tanh",
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
        cls = tf.Gemma2Config
    elif family == "neox":
        kw = {**common, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
              "use_parallel_residual": True, "tie_word_embeddings": False, "hidden_act": "gelu",
              "layer_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                         "partial_rotary_factor": 0.25}}
        cls = tf.GPTNeoXConfig
    elif family == "gpt2":
        kw = {"vocab_size": VOCAB, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4,
              "activation_function": "gelu_new", "bos_token_id": 0, "eos_token_id": 0}
        cls = tf.GPT2Config
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    kw.update(overrides)
    if family == "gemma2" and "num_hidden_layers" in overrides and "layer_types" not in overrides:
        kw.pop("layer_types")  # let Gemma2Config alternate sliding / full itself
    return cls(**kw)


def _model_class(family: str):
    import transformers as tf

    return {"llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
            "gemma2": tf.Gemma2ForCausalLM, "neox": tf.GPTNeoXForCausalLM, "gpt2": tf.GPT2LMHeadModel}[family]


def _is_norm(name: str) -> bool:
    leaf = name.split(".")[-2]
    return "norm" in leaf or leaf in ("ln_1", "ln_2", "ln_f")


@torch.no_grad()
def perturb(model: torch.nn.Module, family: str, seed: int) -> None:
    """Overwrite every parameter with seeded noise (module doc), in `named_parameters` order.

    Norm weights 1 + N(0, .3) (Gemma: N(0, .3)); norm and linear biases N(0, .2); token embeddings
    N(0, (2/sqrt(d))**2) (so Gemma's sqrt(d) scaling gives unit-scale rows and tied unembeddings give
    logits of a few units); learned positions N(0, .5**2); matrices N(0, 1/fan_in), the query and
    key parts times QK_GAIN, an untied unembedding times UNEMBED_GAIN."""
    g = torch.Generator().manual_seed(seed)
    d = model.config.hidden_size

    def noise(shape: torch.Size, std: float) -> torch.Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    for name, p in model.named_parameters():
        if _is_norm(name):
            if name.endswith("weight"):
                p.copy_(noise(p.shape, 0.3) + (0.0 if family == "gemma2" else 1.0))
            else:
                p.copy_(noise(p.shape, 0.2))
        elif name.endswith("bias"):
            p.copy_(noise(p.shape, 0.2))
        elif any(k in name for k in ("embed_tokens", "embed_in", "wte")):
            p.copy_(noise(p.shape, 2.0 / d**0.5))
        elif "wpe" in name:
            p.copy_(noise(p.shape, 0.5))
        else:
            conv1d = family == "gpt2"  # Conv1D weights are [in, out]
            fan_in = p.shape[0] if conv1d else p.shape[1]
            w = noise(p.shape, 1.0 / fan_in**0.5)
            if any(k in name for k in ("q_proj", "k_proj")):
                w *= QK_GAIN
            elif "query_key_value" in name:  # rows: per head [q | k | v], d_head each
                heads = model.config.num_attention_heads
                w.view(heads, 3, -1, w.shape[1])[:, :2] *= QK_GAIN
            elif "c_attn" in name:  # columns q | k | v
                w[:, : 2 * d] *= QK_GAIN
            elif any(k in name for k in ("lm_head", "embed_out")):
                w *= UNEMBED_GAIN
            p.copy_(w)


def build(family: str, out_dir: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Build, perturb (seeded) and `save_pretrained` a tiny `family` model into `out_dir`.

    `overrides` are config keyword arguments (e.g. `attention_bias=True`, `use_parallel_residual=False`).
    Returns the directory, holding exactly config.json and model.safetensors (float32)."""
    out = Path(out_dir)
    cfg = _config(family, overrides)
    torch.manual_seed(seed)
    model = _model_class(family)(cfg).to(torch.float32).eval()
    perturb(model, family, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    return out
