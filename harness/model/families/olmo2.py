"""OLMo 2: no norm before the sublayers, a norm after each, and QK-norm over the whole projection."""

from .family import Family

FAMILY = Family(
    name="olmo2",
    title="OLMo 2",
    architectures=("Olmo2ForCausalLM",),
    model_types=("olmo2",),
    gguf=("olmo2",),
    qk_norm="projection",
    features=("rotary, RMSNorm after (not before) each sublayer, an RMSNorm on the queries and on the keys of all "
              "heads of a layer together (QK-norm over the projection), gated MLP, grouped-query attention"),
)
