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
| `qwen3`   | Qwen3ForCausalLM    | QK-norm per head (RMSNorm w * x/rms over each head's d_head dims of q and of k, |
|           |                     | after the projection, before rotary), head_dim 16 given explicitly with        |
|           |                     | d_model 48 (n_heads*d_head = 64 != 48), GQA, tied embeddings, no biases        |
| `olmo2`   | Olmo2ForCausalLM    | no norm before the sublayers: h = x + post1(attn(x)), out = h + post2(mlp(h)); |
|           |                     | QK-norm over the WHOLE projection (q_norm of size n_heads*d_head, k_norm of    |
|           |                     | n_kv_heads*d_head), GQA, untied lm_head                                        |
| `gemma3`  | Gemma3ForCausalLM   | as gemma2 (1 + w norms, sqrt(d) embed scale, pre- and post-norms, GELU-tanh,   |
|           |                     | query_pre_attn_scalar 24, head_dim 16 with d_model 32, GQA, tied) plus QK-norm |
|           |                     | per head with (1 + w), no soft caps, layers sliding (window 6) / full / sliding |
|           |                     | with rope theta 1e4 (default) on sliding and theta 1e6 with linear scaling     |
|           |                     | (factor 8: inv_freq / 8) on full layers                                        |
| `llama3`  | LlamaForCausalLM    | as llama with d_head 16 (d_model 64) and Llama 3 rope scaling: theta 1e4,       |
|           |                     | factor 8, low_freq_factor 1, high_freq_factor 8, original_max_position 256:    |
|           |                     | of the 8 frequencies 2 are unchanged, 2 interpolated and 4 divided by 8         |

`FAMILIES` are the six the harness supports (other test files parametrize over them); `NEW_FAMILIES` are
covered by the oracle (tests/family_oracle.py) and its tests only, until the harness supports them.

Weights are chosen so that nothing can hide: norm weights are 1 + N(0, 0.3) (Gemma: N(0, 0.3),
as its norm multiplies by 1 + w), norm biases and all linear biases N(0, 0.2); matrices
N(0, 1/fan_in); the query and key projections are scaled by `QK_GAIN` so attention patterns are
sharp (scores of several units, beyond Gemma's soft cap); the unembedding is scaled so logits
are a few units (beyond Gemma's final soft cap).  With a QK-norm the norm removes the projections'
scale, so there the query / key norm weights carry the gain instead: the effective weight (w, or
Gemma's 1 + w) is QK_GAIN * (1 + N(0, 0.3)) (Gemma 3 stores w = QK_GAIN * (1 + N(0, 0.3)) - 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "gemma2", "neox", "gpt2")
NEW_FAMILIES: tuple[str, ...] = ("qwen3", "olmo2", "gemma3", "llama3")  # the oracle's only, for now
GEMMA: tuple[str, ...] = ("gemma2", "gemma3")  # norms multiply by 1 + w

QK_GAIN = 2.0  # query/key projections are N(0, QK_GAIN**2 / fan_in)
UNEMBED_GAIN = 2.0  # logits ~ N(0, UNEMBED_GAIN**2) for unit-scale normalised residuals

VOCAB = 100


def _config(family: str, overrides: dict[str, Any]) -> Any:
    """The transformers config of `family` with `overrides` (config keyword arguments) applied."""
    import transformers as tf

    common: dict[str, Any] = {"vocab_size": VOCAB, "max_position_embeddings": 64}
    kw: dict[str, Any]
    cls: Any
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
    elif family == "qwen3":
        kw = {**common, "hidden_size": 48, "head_dim": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
        cls = tf.Qwen3Config
    elif family == "olmo2":
        kw = {**common, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "eos_token_id": 0,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
        cls = tf.Olmo2Config
    elif family == "gemma3":
        kw = {**common, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 64, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 24,
              "sliding_window": 6, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
              "attn_logit_softcapping": None, "final_logit_softcapping": None, "tie_word_embeddings": True,
              "hidden_activation": "gelu_pytorch_tanh",
              "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                  "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}}
        cls = tf.Gemma3TextConfig
    elif family == "llama3":
        kw = {**common, "max_position_embeddings": 2048, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 8.0, "original_max_position_embeddings": 256}}
        cls = tf.LlamaConfig
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES + NEW_FAMILIES}")
    kw.update(overrides)
    if family in GEMMA and "num_hidden_layers" in overrides and "layer_types" not in overrides:
        kw.pop("layer_types")  # let the Gemma config alternate sliding / full itself
    return cls(**kw)


def _model_class(family: str) -> Any:
    import transformers as tf

    return {"llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
            "gemma2": tf.Gemma2ForCausalLM, "neox": tf.GPTNeoXForCausalLM, "gpt2": tf.GPT2LMHeadModel,
            "qwen3": tf.Qwen3ForCausalLM, "olmo2": tf.Olmo2ForCausalLM, "gemma3": tf.Gemma3ForCausalLM,
            "llama3": tf.LlamaForCausalLM}[family]


def _is_norm(name: str) -> bool:
    leaf = name.split(".")[-2]
    return "norm" in leaf or leaf in ("ln_1", "ln_2", "ln_f")


@torch.no_grad()
def perturb(model: torch.nn.Module, family: str, seed: int) -> None:
    """Overwrite every parameter with seeded noise (module doc), in `named_parameters` order.

    Norm weights 1 + N(0, .3) (Gemma: N(0, .3)); QK-norm weights (q_norm, k_norm) QK_GAIN * (1 + N(0, .3))
    (Gemma: that minus 1, as its norm multiplies by 1 + w); norm and linear biases N(0, .2); token embeddings
    N(0, (2/sqrt(d))**2) (so Gemma's sqrt(d) scaling gives unit-scale rows and tied unembeddings give
    logits of a few units); learned positions N(0, .5**2); matrices N(0, 1/fan_in), the query and
    key parts times QK_GAIN, an untied unembedding times UNEMBED_GAIN."""
    g = torch.Generator().manual_seed(seed)
    config: Any = model.config
    d = config.hidden_size

    def noise(shape: torch.Size, std: float) -> torch.Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    for name, p in model.named_parameters():
        if _is_norm(name):
            if name.endswith(("q_norm.weight", "k_norm.weight")):  # the norm sets the q / k scale: gain here
                p.copy_(QK_GAIN * (1.0 + noise(p.shape, 0.3)) - (1.0 if family in GEMMA else 0.0))
            elif name.endswith("weight"):
                p.copy_(noise(p.shape, 0.3) + (0.0 if family in GEMMA else 1.0))
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
                heads = config.num_attention_heads
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
