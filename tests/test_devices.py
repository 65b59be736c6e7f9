"""--device: the resolution rule, the CLI's refusal of bad devices, and the
device recorded in the evidence."""

import json

import pytest
import torch

from harness.cli import main
from harness.data import dataset as data
from harness.errors import DeviceError, UserError
from harness.model.devices import ENV, resolve_device

from .conftest import FIXTURE, HYPOTHESES
from .test_cli import harness_cli

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


def best_here() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def test_explicit_cpu():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(" CPU ") == "cpu"


@pytest.mark.parametrize("requested", [None, "auto"])
def test_default_is_best_available_without_env(monkeypatch, requested):
    monkeypatch.delenv(ENV, raising=False)
    assert resolve_device(requested) == best_here()


def test_env_var_is_honoured_and_checked(monkeypatch):
    monkeypatch.setenv(ENV, "cpu")
    assert resolve_device(None) == resolve_device("auto") == "cpu"
    monkeypatch.setenv(ENV, "auto")
    assert resolve_device(None) == best_here()
    monkeypatch.setenv(ENV, "gpu0")
    with pytest.raises(DeviceError, match=r"'gpu0' \(from \$HARNESS_DEVICE\) is not a device name"):
        resolve_device(None)
    assert resolve_device("cpu") == "cpu"  # an explicit device wins over the variable


@NO_CUDA
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_cuda_names_available_devices(name):
    with pytest.raises(DeviceError) as err:
        resolve_device(name)
    msg = str(err.value)
    assert f"'{name}'" in msg and "not available on this machine" in msg
    assert "available: cpu" in msg and "cpu, cuda, cuda:N or mps" in msg
    assert isinstance(err.value, UserError)


@pytest.mark.parametrize("name", ["gpu0", "cuda0", "cuda:x", "mps:0", "tpu"])
def test_garbage_is_refused_with_allowed_forms(name):
    with pytest.raises(DeviceError, match=rf"'{name}' is not a device name; allowed: cpu, cuda, cuda:N or mps"
                                          r".*available on this machine: cpu"):
        resolve_device(name)


def test_dataset_to_moves_every_tensor():
    ds = data.repeated_tokens(4, 3, 10, seed=1)
    ds.wrong = ds.answers.clone()
    moved = ds.to("meta")
    for name in ("clean", "corrupted", "positions", "answers", "wrong"):
        assert getattr(moved, name).device.type == "meta", name
        assert getattr(ds, name).device.type == "cpu", name  # the original is untouched
    assert (moved.description, moved.has_bos, moved.n, moved.seq_len) == (ds.description, ds.has_bos, 4, 7)
    assert ds.to("cpu").clean is ds.clean  # already there: nothing is copied


@pytest.mark.slow
@NO_CUDA
def test_run_on_cuda_without_cuda_exits_2_and_writes_nothing(tmp_path):
    r = harness_cli("run", HYPOTHESES / "induction.yaml", "--device", "cuda", "--reports", tmp_path / "reports")
    assert r.returncode == 2, r.stderr
    assert "error: device 'cuda' is not available on this machine (available: cpu)" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("argv", [["run", str(HYPOTHESES / "induction.yaml")], ["weights", str(FIXTURE)],
                                  ["scan", str(FIXTURE)], ["roles", str(FIXTURE)], ["selftest"]])
def test_every_model_command_checks_device_first(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # scan's default folder would go under ./reports
    assert main([*argv, "--device", "gpu0", *(["--reports", str(tmp_path / "r")] if argv[0] == "run" else [])]) == 2
    assert "error: device 'gpu0' is not a device name" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_run_records_device_in_provenance(demo_evidence):
    """demo_evidence is harness.run(..., device="cpu")."""
    from harness.evidence.document import to_json
    from harness.report.markdown import render_markdown
    from harness.report.writer import validate_evidence

    assert demo_evidence.provenance["device"] == "cpu"
    doc = json.loads(to_json(demo_evidence.to_dict()))
    assert validate_evidence(doc) == []
    assert ", device cpu" in render_markdown(demo_evidence).split("## Provenance")[1]
    doc["provenance"]["device"] = ""
    assert any("device" in p for p in validate_evidence(doc))


def test_check_form_accepts_devices_this_machine_lacks_and_refuses_bad_names():
    """A Ray driver checks only the name: the workers resolve the device where they run."""
    from harness.model.devices import check_form

    assert [check_form(x) for x in ("cuda", " CUDA:1 ", "mps", "auto", "cpu")] == \
        ["cuda", "cuda:1", "mps", "auto", "cpu"]
    for bad in ("gpu0", "cuda:x", "tpu"):
        with pytest.raises(DeviceError, match="not a device name"):
            check_form(bad)
