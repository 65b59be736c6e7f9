"""Mistral: Llama's block, every layer attending within the config's sliding window."""

from .family import Family

FAMILY = Family(
    name="mistral",
    title="Mistral",
    architectures=("MistralForCausalLM",),
    model_types=("mistral",),
    gguf=("mistral",),
    windows="config",
    features=("as Llama, plus a sliding window on every layer"),
)
