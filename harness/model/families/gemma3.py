"""Gemma 3 (text): Gemma 2's block without soft caps, plus QK-norm and a rotary table per layer type
(local layers: base 10,000; global layers: base 1,000,000, scaled on the larger models)."""

from .family import Family

FAMILY = Family(
    name="gemma3",
    title="Gemma 3",
    architectures=("Gemma3ForCausalLM",),
    model_types=("gemma3_text",),
    gguf=("gemma3",),
    qk_norm="head",
    rotary="layer_type",
    windows="module",
    features=("as Gemma 2 without soft caps, plus an RMSNorm (`1 + w`) on each head's queries and keys, and local "
              "(sliding-window) and global layers with their own rotary bases and scaling"),
)
