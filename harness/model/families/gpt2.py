"""GPT-2: learned positions, LayerNorm, a GELU MLP; the control family."""

from .family import Family

FAMILY = Family(
    name="gpt2",
    title="GPT-2",
    architectures=("GPT2LMHeadModel",),
    model_types=("gpt2",),
    gguf=("gpt2",),
    rotary="none",
    features=("learned positions, LayerNorm, GELU MLP"),
)
