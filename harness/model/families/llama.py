"""Llama (and SmolLM2, TinyLlama, Llama 2 and 3): rotary positions (Llama 3's scaling included), RMSNorm,
a gated MLP, grouped-query attention."""

from .family import Family

FAMILY = Family(
    name="llama",
    title="Llama",
    architectures=("LlamaForCausalLM",),
    model_types=("llama",),
    gguf=("llama",),
    features=("rotary positions (Llama 3's frequency scaling included), RMSNorm, gated MLP (SwiGLU), grouped-query "
              "attention"),
)
