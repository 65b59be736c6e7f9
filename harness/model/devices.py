"""Where models run: choosing a device, and moving tensors between devices.

Rule (`resolve_device`):
* an explicit device is one of `cpu`, `cuda`, `cuda:N` or `mps`, and must be
  available on this machine (`cuda:N` needs N < the number of CUDA devices);
* `None` or `auto` means the environment variable `HARNESS_DEVICE` when it is
  set (checked by the same rule; it may itself say `auto`), otherwise the best
  available device: `cuda` if CUDA is available, else `mps` if Apple's Metal
  backend is available and `TRANSFORMERLENS_ALLOW_MPS=1` (TransformerLens's
  rule, for MPS's known correctness problems), else `cpu`;
* anything else raises `DeviceError` (a `UserError`: the CLI exits 2), naming
  the value, the allowed forms and the devices available here.

Arithmetic conventions for the rest of the harness:
* tensors the harness creates are created on the device of the activations
  they meet (`device=x.device`), and results go to the CPU (`.cpu()`) before
  numpy or statistics;
* exact float64 arithmetic (`wide`) runs on the tensor's own device, except on
  MPS, which has no float64: there the tensor is copied to the CPU first;
  `like(t, ref)` brings such a result back to `ref`'s dtype and device;
* random draws (prompts, nulls) always use CPU generators, so the numbers do not
  depend on the device.

torch is imported inside the functions: importing this module is free.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import DeviceError

ENV = "HARNESS_DEVICE"
ALLOWED = "cpu, cuda, cuda:N or mps (or auto: the best available)"
_FORM = re.compile(r"^(cpu|cuda|cuda:\d+|mps)$")


def available() -> list[str]:
    """The devices usable here, best last: cpu, then cuda and cuda:0..N-1, then mps."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        out.append("mps")
    return out


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def best() -> str:
    """cuda if available; else mps if available and TRANSFORMERLENS_ALLOW_MPS=1
    (TransformerLens's own rule: MPS has known correctness problems, its issue
    #1178, so it is used only when asked for); else cpu."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    allow = os.environ.get("TRANSFORMERLENS_ALLOW_MPS", "") == "1"
    return "mps" if allow and _mps_available() else "cpu"


def resolve_device(requested: str | None = None) -> str:
    """The device to run on, as a normalised name (`cpu`, `cuda`, `cuda:N` or `mps`).

    None or "auto": $HARNESS_DEVICE if set (checked by the same rule), else cuda if
    available, else mps if available and TRANSFORMERLENS_ALLOW_MPS=1, else cpu.  An explicit name must have one of
    the allowed forms and be available here; otherwise DeviceError, whose message
    names the value, the allowed forms and the devices available on this machine.
    Case and surrounding spaces are ignored."""
    if requested is None or str(requested).strip().lower() in ("", "auto"):
        env = os.environ.get(ENV, "").strip()
        if env:
            return _check(env, f" (from ${ENV})")
        return best()
    return _check(str(requested), "")


def check_form(value: str) -> str:
    """The normalised name if `value` has an allowed form (`auto` included), without
    asking whether this machine has the device: a Ray driver checks names this way,
    and each worker resolves the device where it runs.  DeviceError otherwise."""
    name = value.strip().lower()
    if name != "auto" and not _FORM.match(name):
        raise DeviceError(f"device {value!r} is not a device name; allowed: {ALLOWED}")
    return name


def _check(value: str, origin: str) -> str:
    name = value.strip().lower()
    if name == "auto":
        return best()
    here = available()
    if not _FORM.match(name):
        raise DeviceError(f"device {value!r}{origin} is not a device name; allowed: {ALLOWED}; "
                          f"available on this machine: {', '.join(here)}")
    if name not in here:
        raise DeviceError(f"device {value!r}{origin} is not available on this machine "
                          f"(available: {', '.join(here)}); allowed forms: {ALLOWED}")
    return name


def of(module: Any) -> Any:
    """The torch.device of a model's (bridge's) first parameter; cpu if it has none
    (or is a stand-in without `parameters`)."""
    import torch

    params = getattr(module, "parameters", None)
    p = next(params(), None) if callable(params) else None
    return p.device if p is not None else torch.device("cpu")


def wide(x: Any) -> Any:
    """x in float64 for exact arithmetic: on x's device, or on the CPU when x is on
    MPS (which has no float64)."""
    return x.to(float64_home(x.device)).double()


def float64_home(device: Any) -> Any:
    """Where float64 arithmetic for a model on `device` runs (the rule `wide` follows): that device, except
    MPS (no float64), for which it is the CPU; None means the CPU."""
    import torch

    dev = torch.device(device if device is not None else "cpu")
    return torch.device("cpu") if dev.type == "mps" else dev


def like(t: Any, ref: Any) -> Any:
    """t with ref's dtype on ref's device (the dtype is changed first, on t's device,
    so a float64 CPU tensor can reach an MPS float32 one)."""
    return t.to(dtype=ref.dtype).to(ref.device)
