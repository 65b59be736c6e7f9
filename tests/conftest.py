"""Shared fixtures: one fixture-model load per session; tiny hand-set models.

The suite runs on the CPU even where a GPU exists, so its numbers are the same on
every machine: HARNESS_DEVICE defaults to cpu here (an explicit value is kept), and
the session models are loaded on "cpu".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("HARNESS_DEVICE", "cpu")
# Ray reads its authentication mode once per process but hands the environment to the servers it
# starts: one mode for the whole session, so a test that joins a token-less cluster does not leave
# the next test's local instance with a driver and a server that disagree
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "induction-2l"
HYPOTHESES = ROOT / "hypotheses"
SLOW_LIST = ROOT / "tests" / "slow_tests.txt"
QUICK_SECONDS = 90  # what the README promises of make test-quick on two cores
QUICK_TEST_SECONDS = 2.0  # a test longer than this belongs in SLOW_LIST
_STARTED = time.monotonic()


def slow_listed() -> set[str]:
    """The test functions SLOW_LIST names ("tests/test_x.py::test_name"), marked slow at collection."""
    lines = (line.split("#", 1)[0].strip() for line in SLOW_LIST.read_text().splitlines())
    return {line for line in lines if line}


def pytest_addoption(parser):
    parser.addoption("--ray", action="store_true", default=False,
                     help="also run the tests marked ray: sweeps killed and resumed on a local Ray instance, "
                          "a Ray cluster joined, workers that die (make test-ray; HARNESS_RAY=1 does the same)")
    parser.addoption("--real", action="store_true", default=False,
                     help="also run the tests marked real: a real trained model from the local cache, minutes "
                          "(make test-real; HARNESS_REAL=1 does the same)")


def ray_wanted(config) -> bool:
    """Whether the `ray` tier runs: `pytest --ray`, or HARNESS_RAY set (make test-ray)."""
    return bool(config.getoption("--ray", default=False)) or os.environ.get("HARNESS_RAY", "0") not in ("", "0")


def real_wanted(config) -> bool:
    """Whether the `real` tier runs: `pytest --real`, or HARNESS_REAL set (1, or all for its long tests)."""
    return bool(config.getoption("--real", default=False)) or os.environ.get("HARNESS_REAL", "0") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    """A test that reads the demo's run (demo_evidence, about 15 s once per session) is slow:
    `make test-quick` (pytest -m "not slow") leaves it out.  The tests marked `real` are left out
    (deselected) unless the real tier is asked for (real_wanted), whatever -m says.  The test
    functions tests/slow_tests.txt lists are slow, every parameter of each."""
    listed = slow_listed()
    for item in items:
        function = item.nodeid.split("[", 1)[0]
        if "demo_evidence" in getattr(item, "fixturenames", ()) or function in listed:
            item.add_marker(pytest.mark.slow)
    for marker, wanted in (("real", real_wanted(config)), ("ray", ray_wanted(config))):
        if not wanted:
            left = [item for item in items if item.get_closest_marker(marker)]
            if left:
                config.hook.pytest_deselected(items=left)
                items[:] = [item for item in items if not item.get_closest_marker(marker)]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The drift check of the quick subset (-m "not slow"): when the run took longer than
    QUICK_SECONDS, or some test function's calls (every parameter's, summed; not the setup of
    fixtures that the module's other tests share) longer than QUICK_TEST_SECONDS, say so and name
    those tests, for tests/slow_tests.txt.  Says nothing when the run is within both; never fails
    a run (a time depends on the machine)."""
    if config.getoption("markexpr", "") != "not slow":
        return
    took: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) == "call":
                function = r.nodeid.split("[", 1)[0]
                took[function] = took.get(function, 0.0) + float(r.duration)
    over = sorted(((t, f) for f, t in took.items() if t > QUICK_TEST_SECONDS), reverse=True)
    wall = time.monotonic() - _STARTED
    if wall <= QUICK_SECONDS and not over:
        return
    terminalreporter.section("make test-quick drift")
    where = "over" if wall > QUICK_SECONDS else "within"
    terminalreporter.write_line(f"the quick tests took {wall:.0f} s ({where} the README's under {QUICK_SECONDS} s on "
                                f"two cores); {len(over)} test function(s) over {QUICK_TEST_SECONDS:g} s"
                                + (": add them to tests/slow_tests.txt" if over else ""))
    for t, f in over[:20]:
        terminalreporter.write_line(f"{f}  # {t:.1f} s")


@pytest.fixture(scope="session")
def demo_evidence():
    """One run of the demo hypothesis per test session (it is the slowest thing we run)."""
    import harness

    return harness.run(HYPOTHESES / "induction.yaml", device="cpu")


@pytest.fixture(scope="session")
def fixture_model():
    from harness.engine.runner import load_model_cached

    return load_model_cached(str(FIXTURE), "cpu")


def save_native(bridge, cfg: dict, out: Path) -> Path:
    """Write a bridge in the model directory format (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().clone() for k, v in bridge.state_dict().items()},
              str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def tiny_config(**over) -> dict:
    cfg = {"d_model": 8, "d_head": 3, "n_heads": 2, "n_layers": 2, "n_ctx": 12, "d_vocab": 7,
               "attn_only": True, "normalization_type": "LN", "seed": 0}
    cfg.update(over)
    return cfg


def boot_random_native(cfg: dict, seed: int):
    """A float64 native model of `cfg` with non-trivial norm parameters and biases (seeded)."""
    import torch
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**cfg), dtype=torch.float64)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in bridge.original_model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3 + ("weight" in name))
    return bridge


@pytest.fixture(scope="session")
def tiny_native(tmp_path_factory):
    """A random tiny native model (float64) and its directory.  n_heads*d_head != d_model."""
    cfg = tiny_config()
    bridge = boot_random_native(cfg, seed=1)
    path = save_native(bridge, cfg, tmp_path_factory.mktemp("tiny") / "model")
    return bridge, path


@pytest.fixture
def ray_reaped():
    """For a test that starts Ray in this process: afterwards Ray is shut down and every
    child process it left (its servers stop a moment after `ray.shutdown`) is waited for, so
    that no Popen of a still-running child is collected during a later test (a
    ResourceWarning pytest would pin on that test)."""
    yield
    import gc
    import subprocess
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which some proxies (torch.distributed's
        # deprecated names) answer with a warning
        if issubclass(type(obj), subprocess.Popen) and obj.returncode is None:
            try:
                obj.wait(timeout=60)
            except subprocess.TimeoutExpired:
                obj.kill()
                obj.wait()
