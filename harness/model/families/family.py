"""`Family`: what an adapter declares (the package docstring says what each field means)."""

from __future__ import annotations

from dataclasses import dataclass

QK_NORMS = (None, "head", "projection")
ROTARY = ("none", "model", "layer_type")
WINDOWS = ("none", "config", "module")
NATIVE = "TransformerLensNative"


@dataclass(frozen=True, kw_only=True)
class Family:
    """One model family as harness reproduces it (module docstring)."""

    name: str  # short name: "gemma3"
    title: str  # in docs and messages: "Gemma 3"
    architectures: tuple[str, ...]  # the Hugging Face classes it covers: ("Gemma3ForCausalLM",)
    model_types: tuple[str, ...] = ()  # config.json model_type values (a GGUF file's config names no class)
    gguf: tuple[str, ...] = ()  # the GGUF files' general.architecture values of the family
    qk_norm: str | None = None  # QK_NORMS
    rotary: str = "model"  # ROTARY
    windows: str = "none"  # WINDOWS
    features: str = ""  # what it adds to a GPT-2-style block, in words

    def check(self) -> str | None:
        """What is wrong with this adapter, in words (None: nothing)."""
        if not self.name or not self.architectures:
            return "a family needs a name and at least one architecture"
        for key, value, allowed in (("qk_norm", self.qk_norm, QK_NORMS), ("rotary", self.rotary, ROTARY),
                                    ("windows", self.windows, WINDOWS)):
            if value not in allowed:
                return f"{key} is {value!r}; allowed: {', '.join(map(str, allowed))}"
        return None
