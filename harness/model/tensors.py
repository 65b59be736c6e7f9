"""What a safetensors file holds, read without trusting it: the header (names,
shapes, dtypes) without loading any tensor, non-finite values tensor by tensor,
and whether loading fits in this machine's memory.

Every failure is a ModelLoadError naming the file (and the tensor).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

# bytes per element of each safetensors dtype
ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
            "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (whitespace collapsed), at most `limit` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors spelling: F32, BF16, ...
    file: Path

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE.get(self.dtype, 4)


def shape_text(shape: Any) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def read_header(file: Path) -> dict[str, TensorInfo]:
    """Every tensor in safetensors `file` with its shape and dtype, from the header
    alone (nothing is loaded).  The safetensors library checks that the header is
    complete and that the data section covers every tensor, so a truncated file
    is refused here."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), "pt") as st:
            out = {}
            for key in st.keys():
                sl = st.get_slice(key)
                out[key] = TensorInfo(tuple(int(s) for s in sl.get_shape()), str(sl.get_dtype()), file)
            return out
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError) as exc:
        raise ModelLoadError(f"{file}: cannot read: {one_line(exc)}") from None


def count_nonfinite(t: Any) -> int:
    """Number of NaN and +-inf entries of tensor `t` (0 for integer and bool tensors).  A real
    tensor whose minimum and maximum are finite has none (aminmax propagates NaN): one reduction
    without temporaries, about 50 times faster than counting, on every weight a load checks;
    only a tensor that fails it is counted."""
    import torch

    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0
    if t.element_size() == 1:  # float8 kinds: isfinite is not implemented for every one
        t = t.to(torch.float32)
    if not t.is_complex():
        lo, hi = torch.aminmax(t)
        if bool(torch.isfinite(lo)) and bool(torch.isfinite(hi)):
            return 0
    return int((~torch.isfinite(t)).sum())


def nonfinite_message(file: Path | str, name: str, bad: int, numel: int, after: str = "") -> str:
    return (f"{file}: tensor {name} has {bad} NaN/inf value{'s' if bad != 1 else ''} (of {numel}){after}; "
            "a model with non-finite weights gives NaN outputs: fix the weights")


def check_finite(state: dict[str, Any], file: Path, after: str = "") -> None:
    """Raise ModelLoadError naming `file` and the first tensor of `state` (in name
    order) that holds a NaN or an infinity."""
    for name in sorted(state):
        bad = count_nonfinite(state[name])
        if bad:
            raise ModelLoadError(nonfinite_message(file, name, bad, state[name].numel(), after))


def scan_file_finite(file: Path) -> None:
    """Read safetensors `file` one tensor at a time (peak memory: the largest
    tensor) and raise ModelLoadError at the first tensor holding a NaN or an
    infinity, or when a tensor cannot be read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), "pt") as st:
            for name in sorted(st.keys()):
                t = st.get_tensor(name)
                bad = count_nonfinite(t)
                if bad:
                    raise ModelLoadError(nonfinite_message(file, name, bad, t.numel()))
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError) as exc:
        raise ModelLoadError(f"{file}: cannot read: {one_line(exc)}") from None


def physical_memory() -> int | None:
    """Bytes of RAM of this machine, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _gb(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(need: int, what: str, breakdown: str) -> None:
    """Raise ModelLoadError when loading needs more bytes (`need`, described by
    `breakdown`) than this machine has RAM: the load would be killed or swap."""
    total = physical_memory()
    if total is not None and need > total:
        raise ModelLoadError(f"{what}: loading needs about {_gb(need)} ({breakdown}), more than this machine's "
                             f"{_gb(total)} of memory: a size in config.json is too large")
