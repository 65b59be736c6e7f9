"""The claim-kind registry: every kind the harness knows, by name.

The built-in kinds are listed here; `register` adds another (a plugin or a
test) and `unregister` removes it, by the rules of `harness.registry.Registry`.
Everything that handles claims (the hypothesis schema, the measurement loop, the
reports, sweeps and the pytest plugin) looks kinds up here, so a new kind is one module plus one `register`
call (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from ..registry import Registry
from . import ablation, attention, attribution, circuit, composition, copying, edge, path, role
from .base import ClaimKind


def _schema_names_kind(name: str, kind: ClaimKind[Any, Any]) -> str | None:
    if kind.name != name:
        return f"registered as {name!r} but called {kind.name!r}"
    if name not in get_args(kind.spec.model_fields["kind"].annotation):
        return f"its schema {kind.spec.__name__} must declare kind: Literal[{name!r}]"
    return None


_BUILTIN: tuple[ClaimKind[Any, Any], ...] = (role.KIND, attention.KIND, copying.KIND, composition.KIND,
                                              ablation.KIND, attribution.KIND, edge.KIND, path.KIND, circuit.KIND)
KINDS: Registry[ClaimKind[Any, Any]] = Registry("claim kind", {k.name: k for k in _BUILTIN}, _schema_names_kind)


def kinds() -> Mapping[str, ClaimKind[Any, Any]]:
    """Every registered kind by name, built-in kinds first (a copy)."""
    return KINDS.items()


def names() -> list[str]:
    return list(KINDS.names())


def get(name: str) -> ClaimKind[Any, Any]:
    """The kind called `name`; RegistryError naming the known kinds if there is none."""
    return KINDS.get(name)


def kind_of(claim: Any) -> ClaimKind[Any, Any]:
    """The kind of a validated claim (by its `kind`)."""
    return get(claim.kind)


def for_mapping(raw: Any) -> ClaimKind[Any, Any] | None:
    """The kind that accepts a claim mapping from a file (aliases included), or None."""
    if not isinstance(raw, dict):
        return None
    return next((k for k in KINDS if k.matches(raw)), None)


def register(kind: ClaimKind[Any, Any]) -> None:
    """Add a kind.  Its name must be new; its schema's `kind` must be that name."""
    KINDS.register(kind.name, kind)


def unregister(name: str) -> None:
    """Remove a kind added with `register` (built-in kinds stay)."""
    KINDS.unregister(name)
