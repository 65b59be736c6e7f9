"""What a long run is doing, on stderr.

* `progress(items, label)`: a tqdm bar over a loop when stderr is an interactive
  terminal (and not under CI); otherwise one line when the loop starts, one at most
  every EVERY seconds while it runs (steps done, time spent, time left at the
  rate so far), and one when it ends, with its duration (`quiet`: only the lines
  while it runs, and the end line after them).
* `stage(label)`: one line per stage of a command (`[  12.3 s] base runs: ...`),
  the time counted from the start of the command (`clock()`, entered by the CLI
  and by `harness.run`; the first stage starts it otherwise).  Printed whether or
  not stderr is a terminal, so CI logs show what a long run is doing; set
  HARNESS_PROGRESS=0 to silence both.
* While a command runs (inside `clock()`) and stderr is not a terminal, a watch
  prints `still at: STAGE (N s since the last line)` when QUIET seconds pass with
  no line (STAGE: the last stage line, not a loop's), so a log never stays silent
  for a minute, whatever the stage does.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")
_START: ContextVar[float | None] = ContextVar("harness_progress_start", default=None)


def silenced() -> bool:
    return os.environ.get("HARNESS_PROGRESS", "1") == "0"


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


QUIET = 45.0  # seconds without a line after which the watch says the command is still at its last line
_WATCH_EVERY = 5.0  # how often the watch looks


class _Watch:
    """The last line printed (its time and label) and how many commands are running; one daemon
    thread, started with the first command, prints a line when a running command is quiet."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last, self.label, self.start, self.running = 0.0, "", 0.0, 0
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()  # set: look now (and read _WATCH_EVERY again)

    def said(self, label: str | None, start: float) -> None:
        with self.lock:
            self.last, self.start = time.perf_counter(), start
            self.label = self.label if label is None else label

    def enter(self, start: float) -> None:
        with self.lock:
            if not self.running:  # a new command: nothing said yet
                self.label = ""
            self.running += 1
            self.last, self.start = time.perf_counter(), start
            if self.thread is None and not interactive():
                self.thread = threading.Thread(target=self._loop, name="harness-progress-watch", daemon=True)
                self.thread.start()

    def leave(self) -> None:
        with self.lock:
            self.running -= 1

    def _loop(self) -> None:
        while True:
            self.wake.wait(_WATCH_EVERY)
            self.wake.clear()
            with self.lock:
                now = time.perf_counter()
                if not self.running or silenced() or now - self.last < QUIET:
                    continue
                quiet, self.last = now - self.last, now
                line = (f"[{now - self.start:7.1f} s] still at: {self.label or 'starting'} "
                        f"({quiet:.0f} s since the last line)")
            print(line, file=sys.stderr, flush=True)


_WATCH = _Watch()


@contextmanager
def clock() -> Iterator[None]:
    """Count stage times from here (nested clocks keep the outermost start); while inside, a
    quiet command gets the watch's lines (module docstring)."""
    token = _START.set(_START.get() or time.perf_counter())
    _WATCH.enter(_START.get() or 0.0)
    try:
        yield
    finally:
        _WATCH.leave()
        _START.reset(token)


def elapsed() -> float:
    start = _START.get()
    return 0.0 if start is None else time.perf_counter() - start


def stage(label: str, within: bool = False) -> None:
    """One progress line on stderr: the time since the command started, and `label`; `within`: a
    line of a loop inside the stage (the watch goes on naming the stage, not the loop)."""
    if silenced():
        return
    if _START.get() is None:
        _START.set(time.perf_counter())
    print(f"[{elapsed():7.1f} s] {label}", file=sys.stderr, flush=True)
    _WATCH.said(None if within else label, _START.get() or 0.0)


def progress(items: Iterable[T], label: str, quiet: bool = False) -> Iterable[T]:
    """Iterate `items`: a tqdm bar on an interactive stderr, else a start and an end line and one
    every EVERY seconds between; `quiet`: no start line, and an end line only after a line between
    (for a loop that is mostly short, run inside a stage that has its own lines)."""
    if silenced():
        return items
    if interactive():
        from tqdm import tqdm

        return tqdm(items, desc=label, file=sys.stderr, leave=False)
    return _lines(items, label, quiet)


EVERY = 30.0  # seconds between a non-interactive loop's lines


def _lines(items: Iterable[T], label: str, quiet: bool = False) -> Iterator[T]:
    seq = list(items)
    t = last = time.perf_counter()
    said = not quiet
    if said:
        stage(f"{label}: {len(seq)} steps", within=True)
    for i, item in enumerate(seq):
        yield item
        now = time.perf_counter()
        if now - last >= EVERY and i + 1 < len(seq):
            last, said = now, True
            spent = now - t
            stage(f"{label}: {i + 1} of {len(seq)} steps in {spent:.0f} s, about "
                  f"{spent / (i + 1) * (len(seq) - i - 1):.0f} s left", within=True)
    if said:
        stage(f"{label}: done in {time.perf_counter() - t:.1f} s", within=True)
