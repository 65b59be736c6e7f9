"""Registries of named things, and plugins that add to them.

Every extension point of the harness (claim kinds and their report views, metrics, data
sources, model sources) is one `Registry`: a name -> item table with its built-in items and
the same rules everywhere:

* `register(name, item)` adds an item; a name already taken (a built-in one too) is a
  `RegistryError`, never a silent replacement;
* `unregister(name)` removes an added item (a built-in one cannot be removed; an unknown
  name is a no-op, so a test's clean-up is idempotent);
* `get(name)` returns an item; an unknown name is a `RegistryError` listing the known ones.

`RegistryError` is a `UserError` (the command line prints one line and exits 2) and a
`ValueError`.

**Plugins.** A package extends the harness by naming a callable in the entry-point group
`harness.plugins` of its distribution's metadata, e.g. in its pyproject.toml:

    [project.entry-points."harness.plugins"]
    my_kinds = "my_package.harness_plugin:register"

`load_plugins()` (the `harness` command and the pytest plugin call it once, before anything
reads a registry) imports each entry point and calls it with no arguments; the callable
registers what it adds.  A plugin that fails to import or to register is one line naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

from .errors import UserError

T = TypeVar("T")

PLUGIN_GROUP = "harness.plugins"


class RegistryError(UserError, ValueError):
    """An unknown name, a name already registered, a built-in item removed, or an item its
    registry refuses."""


class Registry(Generic[T]):
    """Items of one kind by name (`what` names the kind in messages: "claim kind", "metric").
    `check(name, item)` returns a problem in words (None: accepted) before an item is added."""

    def __init__(self, what: str, builtin: Mapping[str, T] | None = None,
                 check: Callable[[str, T], str | None] | None = None):
        self.what = what
        self._check = check
        self._items: dict[str, T] = {}
        for name, item in (builtin or {}).items():
            self.register(name, item)
        self._builtin = frozenset(self._items)

    def register(self, name: str, item: T) -> None:
        if name in self._items:
            raise RegistryError(f"a {self.what} called {name!r} is already registered")
        problem = self._check(name, item) if self._check else None
        if problem:
            raise RegistryError(f"{self.what} {name!r}: {problem}")
        self._items[name] = item

    def unregister(self, name: str) -> None:
        if name in self._builtin:
            raise RegistryError(f"{name!r} is a built-in {self.what}")
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise RegistryError(f"unknown {self.what} {name!r}; allowed: {', '.join(self._items)}") from None

    def find(self, name: str) -> T | None:
        """The item called `name`, or None."""
        return self._items.get(name)

    def is_builtin(self, name: str) -> bool:
        return name in self._builtin

    def names(self) -> tuple[str, ...]:
        """Every name, built-in ones first, then in the order they were registered."""
        return tuple(self._items)

    def items(self) -> dict[str, T]:
        """Every item by name (a copy)."""
        return dict(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))


_loaded: set[str] = set()


def load_plugins(group: str = PLUGIN_GROUP) -> list[str]:
    """Import and call every entry point of `group` not called yet; the names called now.
    RegistryError naming the plugin when one fails to import or to register."""
    from importlib.metadata import entry_points

    called = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        key = f"{ep.name}={ep.value}"
        if key in _loaded:
            continue
        _loaded.add(key)
        try:
            hook = ep.load()
            if not callable(hook):
                raise TypeError(f"{ep.value} is not callable")
            hook()
        except UserError as e:
            raise RegistryError(f"plugin {ep.name} ({ep.value}): {e}") from None
        except Exception as e:  # a plugin's own bug: one line naming it, not a traceback
            raise RegistryError(f"plugin {ep.name} ({ep.value}) failed: {type(e).__name__}: {e}") from None
        called.append(ep.name)
    return called
