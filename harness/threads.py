"""How many threads torch uses, chosen on purpose.

Two rules, measured on a 2-core machine while another 2-thread torch process ran
(benchmark: `python -m harness.tools.threads_bench`):

* Small linear algebra (the composition null's Cholesky factors and triangular
  solves, eigenvalues of d_head-sized matrices, QR of small matrices) always runs
  on one thread (`single_threaded()`): with two threads competing with another
  job, 200 QRs of 120 x 48 matrices took 27 s against 0.06 s on one thread
  (OpenMP workers spin-waiting for a core), and one thread is never slower
  for matrices this small.
* Everything else (forward passes, batched patching) uses `configure()`'s count:
  `--threads N`, else $HARNESS_THREADS, else the number of cores this process may
  run on (os.sched_getaffinity), since large matrix products do gain from more
  threads even on a busy machine (a 2050 x 768 by 768 x 3072 product: 2.7 s on
  one thread, 2.0 s on two, with the same competing job).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import UserError

ENV = "HARNESS_THREADS"


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


def chosen(requested: int | None = None) -> int:
    """`requested`, else $HARNESS_THREADS, else available_cores()."""
    if requested is not None:
        return requested
    env = os.environ.get(ENV)
    if env:
        return parse(env, f"${ENV}")
    return available_cores()


def configure(requested: int | None = None) -> int:
    """Set torch's intra-op thread count to `chosen(requested)` and return it."""
    import torch

    n = chosen(requested)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


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
