"""Thread counts chosen on purpose, and progress lines on stderr."""

import pytest
import torch

from harness import progress, threads
from harness.cli import main
from harness.errors import UserError


def test_default_follows_the_model_width(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    assert threads.chosen(None, d_model=64) == 1
    assert threads.chosen(None, d_model=768) == threads.available_cores()
    assert threads.chosen(3, d_model=64) == 3  # an explicit count wins
    monkeypatch.setenv(threads.ENV, "2")
    assert threads.chosen(None, d_model=64) == 2
    monkeypatch.setenv(threads.ENV, "many")
    with pytest.raises(UserError, match=r"\$HARNESS_THREADS: 'many' is not a thread count"):
        threads.chosen(None, d_model=64)


def test_using_restores_the_previous_count(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    before = torch.get_num_threads()
    with threads.using(None, d_model=64) as n:
        assert n == 1 and torch.get_num_threads() == 1
        with threads.single_threaded():
            assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_cli_refuses_a_bad_thread_count(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["weights", "fixtures/induction-2l", "--threads", "0"])
    assert exc.value.code == 2 and "--threads: 0 must be at least 1" in capsys.readouterr().err


def test_stage_lines_go_to_stderr_and_can_be_silenced(capsys, monkeypatch):
    monkeypatch.delenv("HARNESS_PROGRESS", raising=False)
    with progress.clock():
        progress.stage("base runs")
        assert list(progress.progress(range(3), "loop")) == [0, 1, 2]
    err = capsys.readouterr().err
    assert "s] base runs" in err and "loop: 3 steps" in err and "loop: done in" in err  # stderr is not a tty here
    monkeypatch.setattr(progress, "EVERY", 0.0)  # a long loop: a line after each step but the last
    with progress.clock():
        assert list(progress.progress(range(3), "slow")) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split("] ", 1)[1].split(" in ")[0] for ln in lines] == [
        "slow: 3 steps", "slow: 1 of 3 steps", "slow: 2 of 3 steps", "slow: done"]
    assert "s left" in lines[1]
    # quiet: a loop inside a stage (caching batches, prompt chunks) says nothing while it is short
    monkeypatch.setattr(progress, "EVERY", 3600.0)
    assert list(progress.progress(range(3), "short", quiet=True)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "EVERY", 0.0)  # and like any loop once it takes long
    assert list(progress.progress(range(3), "long", quiet=True)) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split("] ", 1)[1].split(" in ")[0] for ln in lines] == [
        "long: 1 of 3 steps", "long: 2 of 3 steps", "long: done"]
    monkeypatch.setenv("HARNESS_PROGRESS", "0")
    progress.stage("quiet")
    assert capsys.readouterr().err == ""


def test_a_quiet_command_is_said_to_be_still_at_its_last_line(capsys, monkeypatch):
    """The watch: a command inside clock() that prints nothing for QUIET seconds gets a line naming
    the stage it is still in (not the last loop inside it); outside a command, or silenced, it
    says nothing."""
    import time

    monkeypatch.delenv("HARNESS_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "QUIET", 0.3)
    monkeypatch.setattr(progress, "_WATCH_EVERY", 0.05)
    progress._WATCH.enter(time.perf_counter())  # the thread starts with a command (or is running already)
    progress._WATCH.leave()
    progress._WATCH.wake.set()  # it looks now, and then every _WATCH_EVERY seconds
    with progress.clock():
        progress.stage("claims: 4 edge")
        assert list(progress.progress(range(2), "100 prompts in chunks of 4")) == [0, 1]  # a loop's lines
        time.sleep(1.0)
    time.sleep(0.8)  # no command running: nothing more
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "still at" in ln]
    assert lines and all("still at: claims: 4 edge (" in ln and "s since the last line)" in ln for ln in lines)
    assert len(lines) <= 4  # one per quiet spell of QUIET seconds, not one per look
    monkeypatch.setenv("HARNESS_PROGRESS", "0")
    with progress.clock():
        time.sleep(0.8)
    assert "still at" not in capsys.readouterr().err
