"""How many threads torch uses, chosen on purpose.

Two rules (`benchmarks/threads_bench.py` measures them; docs/performance.md has the
numbers):

* Small linear algebra (the composition null's Cholesky factors and triangular
  solves, eigenvalues of d_head-sized matrices, QR of small matrices) always runs
  on one thread (`single_threaded()`): on a machine shared with another job, extra
  OpenMP workers spin-wait for a core, and one thread is never slower for matrices
  this small.
* Forward passes and batched patching use `chosen()`'s count: `--threads N`, else
  $HARNESS_THREADS, else by model size: one thread for models with d_model below
  LARGE_D_MODEL, the cores this process may run on (os.sched_getaffinity) above.
  Small models are dominated by small operations, where a second thread only adds
  spin-waiting on a busy machine; large matrix products gain from more threads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import UserError

ENV = "HARNESS_THREADS"
LARGE_D_MODEL = 512  # from this width on, forwards use every available core by default


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity API (macOS): every core
        return max(1, os.cpu_count() or 1)


def parse(text: str, source: str) -> int:
    """A thread count from the command line or the environment: a whole number >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"{source}: {text!r} is not a thread count (a whole number >= 1)")
    return n


def chosen(requested: int | None = None, d_model: int | None = None) -> int:
    """`requested`, else $HARNESS_THREADS, else 1 for a model narrower than LARGE_D_MODEL,
    else available_cores() (also when the model is not known yet)."""
    if requested is not None:
        return requested
    env = os.environ.get(ENV)
    if env:
        return parse(env, f"${ENV}")
    if d_model is not None and d_model < LARGE_D_MODEL:
        return 1
    return available_cores()


def configure(requested: int | None = None, d_model: int | None = None) -> int:
    """Set torch's intra-op thread count to `chosen(requested, d_model)` and return it."""
    import torch

    n = chosen(requested, d_model)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


@contextmanager
def using(requested: int | None = None, d_model: int | None = None) -> Iterator[int]:
    """Run the block with `chosen(requested, d_model)` threads, then restore the previous count."""
    import torch

    before = torch.get_num_threads()
    n = configure(requested, d_model)
    try:
        yield n
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with torch on one thread (small linear algebra; see the module docstring)."""
    import torch

    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
