"""Paths that are not what a command expects: a model path that is a symlink loop, a data file
that is a device or a loop, output places that cannot be written.  Each is one line on stderr,
exit 2, nothing written, checked before any work where the place is an output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.cli import main

from .conftest import FIXTURE
from .documents import hypothesis as document
from .documents import write


def errors(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.fixture
def loop(tmp_path) -> Path:
    p = tmp_path / "loop"
    os.symlink(p, p)
    return p


def hypothesis(tmp_path: Path, model: str) -> Path:
    claims = [{"id": "r", "kind": "role", "head": "L0H0", "role": "previous_token", "at_least": 0.5}]
    return write(tmp_path, document(model, claims, data={"generator": "repeated_tokens", "n_prompts": 10,
                                                         "segment_length": 5}))


@pytest.mark.parametrize("command", ["run", "roles", "explain", "scan", "weights"])
def test_a_model_path_that_is_a_symlink_loop(loop, tmp_path, capsys, command):
    args = {"run": ["run", str(hypothesis(tmp_path, str(loop))), "--out", str(tmp_path / "o")],
            "roles": ["roles", str(loop)], "explain": ["explain", "L0H0 -> L1H0.k", str(loop)],
            "scan": ["scan", str(loop), "--out", str(tmp_path / "o")], "weights": ["weights", str(loop)]}[command]
    assert main(args) == 2
    assert errors(capsys) == [f"error: model path {loop}: a symlink loop (a link that leads back to itself)"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("data", "what"), [("/dev/zero", "not a regular file (a device, a pipe or a socket)"),
                                            ("loop", "a symlink loop (a link that leads back to itself)"),
                                            ("missing.jsonl", "no such file")])
def test_data_files_that_are_not_files(loop, tmp_path, capsys, data, what):
    path = loop if data == "loop" else Path(data) if data.startswith("/") else tmp_path / data
    assert main(["scan", str(FIXTURE), "--data", str(path), "--out", str(tmp_path / "o")]) == 2
    assert errors(capsys) == [f"error: {path}: cannot read the data file: {what}"]
    assert not (tmp_path / "o").exists()


def test_a_hypothesis_file_that_is_not_a_file(loop, capsys):
    assert main(["run", str(loop)]) == 2
    assert errors(capsys) == [f"error: {loop}: cannot read the hypothesis file: a symlink loop (a link that leads "
                              "back to itself)"]


@pytest.mark.parametrize("command", ["explain", "scan", "sweep", "weights"])
def test_output_places_are_checked_before_any_work(tmp_path, capsys, command, monkeypatch):
    import harness.model.ref as ref

    def no_loading(*a, **k):
        raise AssertionError("the model was loaded before the output place was checked")

    monkeypatch.setattr(ref.ModelRef, "load", no_loading)
    blocked = tmp_path / "file"
    blocked.write_text("x")
    out = blocked / "sub"  # a path under a file: nothing can be written there
    args = {"explain": ["explain", "L0H0 -> L1H0.k", str(FIXTURE), "--out", str(out)],
            "scan": ["scan", str(FIXTURE), "--out", str(out)],
            "sweep": ["sweep", str(hypothesis(tmp_path, str(FIXTURE))), "--models", str(FIXTURE), "--out", str(out)],
            "weights": ["weights", str(FIXTURE), "--out", str(out)]}[command]
    assert main(args) == 2
    (line,) = errors(capsys)
    assert "cannot write the" in line and line.endswith(f"there: {blocked} is not a folder")
    assert main(["explain", "L0H0 -> L1H0.k", str(FIXTURE), "--out", str(tmp_path)]) == 2
    assert errors(capsys) == [f"error: {tmp_path}: cannot write the figure there: it is a directory, not a file"]
