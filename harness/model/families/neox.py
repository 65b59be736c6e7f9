"""GPT-NeoX and Pythia: rotary positions on part of each head, parallel attention and MLP."""

from .family import Family

FAMILY = Family(
    name="neox",
    title="GPT-NeoX / Pythia",
    architectures=("GPTNeoXForCausalLM",),
    model_types=("gpt_neox",),
    gguf=("gptneox",),
    features=("rotary positions on part of each head (`rotary_pct`, `partial_rotary_factor`), parallel attention "
              "and MLP (`use_parallel_residual`), untied `embed_out`"),
)
