"""The claim-kind registry: every kind the harness knows, by name.

The built-in kinds are listed here; `register` adds another (a plugin or a
test) and `unregister` removes it.  Everything that handles claims (the
hypothesis schema, the measurement loop, the reports, sweeps and the pytest
plugin) looks kinds up here, so a new kind is one module plus one `register`
call (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from ..errors import HarnessError
from . import ablation, attention, attribution, circuit, composition, copying, edge, path, role
from .base import ClaimKind

_BUILTIN: tuple[ClaimKind[Any, Any], ...] = (role.KIND, attention.KIND, copying.KIND, composition.KIND,
                                              ablation.KIND, attribution.KIND, edge.KIND, path.KIND, circuit.KIND)
_KINDS: dict[str, ClaimKind[Any, Any]] = {k.name: k for k in _BUILTIN}


def kinds() -> Mapping[str, ClaimKind[Any, Any]]:
    """Every registered kind by name, built-in kinds first (a read-only view)."""
    return dict(_KINDS)


def names() -> list[str]:
    return list(_KINDS)


def get(name: str) -> ClaimKind[Any, Any]:
    """The kind called `name`; HarnessError naming the known kinds if there is none."""
    try:
        return _KINDS[name]
    except KeyError:
        raise HarnessError(f"unknown claim kind {name!r}; known: {', '.join(_KINDS)}") from None


def kind_of(claim: Any) -> ClaimKind[Any, Any]:
    """The kind of a validated claim (by its `kind`)."""
    return get(claim.kind)


def for_mapping(raw: Any) -> ClaimKind[Any, Any] | None:
    """The kind that accepts a claim mapping from a file (aliases included), or None."""
    if not isinstance(raw, dict):
        return None
    return next((k for k in _KINDS.values() if k.matches(raw)), None)


def register(kind: ClaimKind[Any, Any]) -> None:
    """Add a kind.  Its name must be new; its schema's `kind` must be that name."""
    if kind.name in _KINDS:
        raise HarnessError(f"a claim kind called {kind.name!r} is already registered")
    if kind.name not in get_args(kind.spec.model_fields["kind"].annotation):
        raise HarnessError(f"claim kind {kind.name!r}: its schema {kind.spec.__name__} must declare "
                           f"kind: Literal[{kind.name!r}]")
    _KINDS[kind.name] = kind


def unregister(name: str) -> None:
    """Remove a kind added with `register` (built-in kinds stay)."""
    if any(k.name == name for k in _BUILTIN):
        raise HarnessError(f"{name!r} is a built-in claim kind")
    _KINDS.pop(name, None)
