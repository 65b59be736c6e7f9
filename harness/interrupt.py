"""Ctrl-C that is never lost.

Python turns SIGINT into a KeyboardInterrupt raised in the main thread wherever
it happens to be.  Raised inside a weakref callback or a `__del__` (the import
system's module locks have such a callback, so any import can be the place),
the exception is printed as `Exception ignored in ...` and the program runs on:
the user pressed Ctrl-C and the command went on for minutes.

Inside `armed()`, a SIGINT raises KeyboardInterrupt as usual and, until the
command leaves `armed` (the CLI catches the exception and exits 130), raises it
again every AGAIN seconds, so one that was swallowed is followed by one that is
not; the swallowed one is not printed (sys.unraisablehook), so stderr still
reads `interrupted` alone.  A SIGINT that the process inherited as ignored stays
ignored.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

AGAIN = 1.0  # seconds between a SIGINT and its repeat, while the command still runs


@contextmanager
def armed() -> Iterator[None]:
    """Within: each SIGINT raises KeyboardInterrupt and again every AGAIN seconds until the block
    is left (module docstring).  Outside the main thread, or with SIGINT ignored: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        yield
        return
    left = threading.Event()
    lock = threading.Lock()

    def again() -> None:
        if left.wait(AGAIN):
            return
        with lock:  # never after the block is left: `left` is set under the same lock
            if not left.is_set():
                _thread.interrupt_main(signal.SIGINT)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if not left.is_set():
            threading.Thread(target=again, name="harness-interrupt-again", daemon=True).start()
        raise KeyboardInterrupt

    printed = sys.unraisablehook

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            printed(info)  # a KeyboardInterrupt lost here comes again (again()), and unprinted

    signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        with lock:
            left.set()
        sys.unraisablehook = printed
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
