"""Qwen3: Llama's block with an RMSNorm on each head's queries and keys (before the rotation)."""

from .family import Family

FAMILY = Family(
    name="qwen3",
    title="Qwen3",
    architectures=("Qwen3ForCausalLM",),
    model_types=("qwen3",),
    gguf=("qwen3",),
    qk_norm="head",
    windows="module",
    features=("as Llama, plus an RMSNorm on each head's queries and keys (QK-norm, over d_head)"),
)
