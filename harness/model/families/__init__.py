"""Model families: one small declarative adapter per family, and the registry they are found in.

harness recomputes parts of a model's forward pass by hand (mech.block), so it supports a
family only when it reproduces every feature of the family's arithmetic.  An adapter
(`Family`, one module per family in this package) says which Hugging Face classes and config
`model_type`s the family covers and declares the features that cannot be read off the model
safely:

* `qk_norm`: a norm on each head's queries and keys after their projection and before the
  rotation: `"head"` (over each head's d_head values: Qwen3, Gemma 3) or `"projection"`
  (over all heads' values of the layer at once, then split into heads: OLMo 2);
* `rotary`: where each layer's rotation table comes from: `"model"` (one rotary embedding
  for every layer), `"layer_type"` (one per entry of the config's `layer_types`, each with
  its own base and scaling: Gemma 3), or `"none"`;
* `windows`: which layers attend within a sliding window: `"none"`, `"config"` (every
  layer, the config's `sliding_window`: Mistral) or `"module"` (each attention module's own
  `sliding_window`, None on full-attention layers: Qwen2, Qwen3, Gemma 2, Gemma 3).

Everything else (sizes, norm kinds and offsets, norms before and after the sublayers, gated
MLPs, parallel blocks, score scales, soft caps) is read from the loaded model by
model.architecture.describe, and every run holds the arithmetic to the model's own
activations (mech.block.check).  Adding a family is one module here with a `FAMILY`, its line
in `_BUILTIN`, and its float64 oracle test (docs/architecture.md, "Adding a model family");
code outside the package calls `register(family)` (harness.extend).
"""

from __future__ import annotations

from ...registry import Registry, RegistryError
from . import gemma2, gemma3, gpt2, llama, mistral, native, neox, olmo2, qwen2, qwen3
from .family import NATIVE, Family

__all__ = ["FAMILIES", "NATIVE", "Family", "find", "of_architecture", "of_gguf", "of_model_type", "register",
           "supported", "supported_gguf", "unregister"]

def _check(name: str, family: Family) -> str | None:
    if not isinstance(family, Family):
        return "not a Family"
    if family.name != name:
        return f"registered under {name!r} but called {family.name!r}"
    return family.check()


_BUILTIN = (gpt2, llama, mistral, qwen2, qwen3, gemma2, gemma3, olmo2, neox, native)
FAMILIES: Registry[Family] = Registry("model family", {m.FAMILY.name: m.FAMILY for m in _BUILTIN}, check=_check)


def register(family: Family) -> None:
    """Add a family (RegistryError if its name or one of its architectures is taken, or it is malformed)."""
    clash = sorted({a for a in family.architectures if of_architecture(a) is not None})
    if clash:
        raise RegistryError(f"model family {family.name!r}: {', '.join(clash)} already belong(s) to another family")
    FAMILIES.register(family.name, family)


def unregister(name: str) -> None:
    FAMILIES.unregister(name)


def of_architecture(architecture: str) -> Family | None:
    """The family covering a Hugging Face class name (or TransformerLensNative), None if none does."""
    return next((f for f in FAMILIES if architecture in f.architectures), None)


def of_gguf(architecture: str) -> Family | None:
    """The family whose GGUF files name this `general.architecture`, None if none does."""
    return next((f for f in FAMILIES if architecture in f.gguf), None)


def supported_gguf() -> list[str]:
    """Every GGUF architecture a family covers (for messages)."""
    return [a for f in FAMILIES for a in f.gguf]


def of_model_type(model_type: str) -> Family | None:
    """The family whose configs carry this `model_type`, None if none does."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def supported() -> list[str]:
    """Every Hugging Face class a family covers (for messages), in registration order."""
    return [a for f in FAMILIES for a in f.architectures if a != NATIVE]


def find(architecture: str) -> Family:
    """The family of `architecture`; RegistryError naming what is supported otherwise."""
    family = of_architecture(architecture)
    if family is None:
        raise RegistryError(f"{architecture} is not a supported architecture; harness supports "
                            f"{', '.join(supported())} (a family is added as in docs/architecture.md)")
    return family
