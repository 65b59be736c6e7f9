"""Gemma 2: norms before and after each sublayer, RMSNorm scaling by 1 + w, soft caps, alternating local
and global layers."""

from .family import Family

FAMILY = Family(
    name="gemma2",
    title="Gemma 2",
    architectures=("Gemma2ForCausalLM",),
    model_types=("gemma2",),
    gguf=("gemma2",),
    windows="module",
    features=("rotary, RMSNorm with `1 + w`, gated MLP (GeGLU), grouped-query attention, a soft cap on attention "
              "scores and on the final logits, alternating local (sliding-window) and global layers, norms before "
              "and after each sublayer, embeddings scaled by `sqrt(d_model)`, `query_pre_attn_scalar`"),
)
