"""Qwen2 and Qwen2.5: Llama's block with biases on the query, key and value projections."""

from .family import Family

FAMILY = Family(
    name="qwen2",
    title="Qwen2",
    architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    gguf=("qwen2",),
    windows="module",
    features=("as Llama, plus q/k/v biases, tied embeddings, optional sliding-window layers"),
)
