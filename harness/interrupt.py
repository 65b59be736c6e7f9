"""Ctrl-C that is never lost.

Python turns SIGINT into a KeyboardInterrupt raised in the main thread wherever
it happens to be.  Raised inside a weakref callback or a `__del__` (the import
system's module locks have such a callback, so any import can be the place),
the exception is handed to `sys.unraisablehook`, printed as `Exception ignored
in ...`, and the program runs on: the user pressed Ctrl-C and the command went
on for minutes.

Inside `armed()`, a KeyboardInterrupt that reaches `sys.unraisablehook` is not
printed; AGAIN seconds later, once the code that swallowed it has returned, a
helper thread raises it in the main thread again (`_thread.interrupt_main`; from
the hook itself it would be raised, and swallowed, inside the hook).  The
command then stops as it would have: the CLI prints `interrupted` and exits 130.
Anything else unraisable is printed as before.
"""

from __future__ import annotations

import _thread
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

AGAIN = 0.05  # seconds between a swallowed interrupt and the one raised in its place


@contextmanager
def armed() -> Iterator[None]:
    """Within: a KeyboardInterrupt that Python would print and drop is raised again (module docstring)."""
    printed = sys.unraisablehook
    left = threading.Event()
    lock = threading.Lock()

    def again() -> None:
        if left.wait(AGAIN):
            return
        with lock:  # never once the block is left: `left` is set under the same lock
            if not left.is_set():
                _thread.interrupt_main()

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt):
            threading.Thread(target=again, name="harness-interrupt-again", daemon=True).start()
        else:
            printed(info)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        with lock:
            left.set()
        sys.unraisablehook = printed
