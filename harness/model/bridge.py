"""The type of the models harness works on, for the type checker: TransformerLens's
`TransformerBridge` (`Bridge`).  Nothing is imported at run time (`import harness` stays light);
at run time `Bridge` is `Any`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge as Bridge
else:
    Bridge = Any

__all__ = ["Bridge"]
