"""How much memory a run may hold, chosen on purpose.

* The budget: `--memory SIZE` (e.g. `3G`, `512M`, `2.5GiB`, or bytes), else $HARNESS_MEMORY,
  else DEFAULT_SHARE of the memory available when the run starts (MemAvailable; for a model on
  a CUDA device the smaller of that and the device memory the process may hold: free + held).
* What it bounds: the activations the base runs cache (checked after the first batch of
  prompts, `check_cache`: a file whose caches would not fit stops with one line before
  anything is measured) and the working memory of every chunked stage (`working`: caching
  batches, batched edge patching, stacked ablations, edge circuits).  On the CPU each keeps its
  own chunk size unless the budget is smaller (larger chunks do not run faster there); for a
  model on a CUDA device each takes an eighth of the budget, since a batch's cost there is mostly
  its kernel launches and Python, whatever its size, so fewer, larger batches are faster.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from .errors import UserError

ENV = "HARNESS_MEMORY"
DEFAULT_SHARE = 0.5  # of the memory available at the start
WORKING_SHARE = 8  # a chunked stage's working memory is at most budget / WORKING_SHARE
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


class MemoryBudgetError(UserError):
    """What a run needs does not fit the memory budget."""


def parse(text: str, source: str) -> int:
    """A size in bytes from `text` (`3G`, `512M`, `2.5GiB`, `1000000`); units are powers of 1024."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise UserError(f"{source}: {text!r} is not a memory size (a positive number with an optional unit "
                        "K, M, G or T, e.g. 3G or 512M)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _accelerator(device: Any) -> bool:
    """Whether `device` (a torch.device, a string, or None for the CPU) is a CUDA device."""
    return device is not None and str(device).split(":")[0] == "cuda"


def available(device: Any = None) -> int:
    """Bytes of memory available to a run now: the host's (`host_available`), and for a model on
    a CUDA device the smaller of that and the device memory this process may hold, free + held
    (torch.cuda.mem_get_info's free + memory_reserved: the model's weights count as held, as the
    budget's check of the caches counts them)."""
    host = host_available()
    if not _accelerator(device):
        return host
    import torch

    dev = torch.device(device)
    free, _total = torch.cuda.mem_get_info(dev)
    return min(host, int(free) + int(torch.cuda.memory_reserved(dev)))


def host_available() -> int:
    """Bytes of host memory available now (MemAvailable of /proc/meminfo; elsewhere the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def chosen(requested: int | None = None, device: Any = None) -> int:
    """`requested`, else $HARNESS_MEMORY, else DEFAULT_SHARE of the memory available to a model
    on `device` (`available`)."""
    if requested is not None:
        return requested
    env = os.environ.get(ENV)
    if env:
        return parse(env, f"${ENV}")
    return int(DEFAULT_SHARE * available(device))


_BUDGET: ContextVar[tuple[int, bool] | None] = ContextVar("harness_memory_budget", default=None)


@contextmanager
def using(requested: int | None = None, device: Any = None) -> Iterator[int]:
    """Run the block under the budget `chosen(requested, device)`, for a model on `device`; yields it."""
    budget = chosen(requested, device)
    token = _BUDGET.set((budget, _accelerator(device)))
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def working(default: int) -> int:
    """A chunked stage's working memory: outside a budget its own `default`; under one, on the CPU
    min(default, budget / WORKING_SHARE), on a CUDA device budget / WORKING_SHARE (at least 1 MiB)."""
    got = _BUDGET.get()
    if got is None:
        return default
    budget, accelerator = got
    share = budget // WORKING_SHARE
    return max(2**20, share if accelerator else min(default, share))


def release() -> None:
    """Hand the C heap's free memory back to the system (glibc's malloc_trim; nothing elsewhere):
    between stages, so that what one stage freed is not counted again in the next one's peak."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak() -> int | None:
    """This process's peak resident memory in bytes so far (None where the platform does not say)."""
    try:
        import resource
        import sys

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)
    except (ImportError, OSError):
        return None


def gb(n: float) -> str:
    """A size for people: GiB from 1 GiB on, else MiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_cache(per_prompt: float, n_prompts: int, runs: int, fixed: float, what: str) -> None:
    """Raise MemoryBudgetError when `runs` base runs of `n_prompts` prompts, each holding `per_prompt`
    bytes of cached activations, plus `fixed` bytes (the model's weights), exceed the budget."""
    got = _BUDGET.get()
    if got is None:
        return
    b = got[0]
    need = per_prompt * n_prompts * runs + fixed
    if need > b:
        fits = max(0, int((b - fixed) // max(1.0, per_prompt * runs)))
        raise MemoryBudgetError(
            f"memory: {what} would hold {gb(per_prompt * n_prompts * runs)} of cached activations "
            f"({per_prompt / 2**20:.1f} MiB a prompt and run, {runs} run(s) of {n_prompts} prompts) beside "
            f"{gb(fixed)} of weights, over the budget of {gb(b)} (--memory or ${ENV}); "
            + (f"at most {fits} prompts fit" if fits else "not even one prompt fits") + ": use fewer prompts or a "
            "larger budget")
