"""Typed exceptions and the exit codes they map to.

`UserError` subclasses are the user's mistakes: the CLI prints their message
(`error: ` before each line, no traceback) and exits `ExitCode.INPUT` (2).
`SanityCheckError` is a fatal sanity check, one that must hold for any number of
the run to mean anything (a hook that never fired, a non-finite metric): the CLI
prints `sanity check failed: ...` and exits `ExitCode.SANITY` (3), no report.  A
recorded sanity check that fails (the clean-corrupted gap below min_gap) does not
stop the run: the report is written and says which, and the exit code is 3 too.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of every `harness` command (documented in the README)."""

    OK = 0  # every claim passed (validate: every file valid; tables: printed)
    CLAIMS = 1  # a claim failed or was inconclusive
    INPUT = 2  # bad input: file:line: field: message, nothing written
    SANITY = 3  # a sanity check failed: a fatal one stops the run (no report); a recorded one is in the report
    JOB_FAILED = 4  # (sweep) a job failed; the others are kept
    INTERRUPTED = 130  # Ctrl-C (SIGINT): "interrupted" on stderr, no report folder, no temporary files


class HarnessError(Exception):
    """Base class for every error the harness raises on purpose."""


class UserError(HarnessError):
    """Bad input from the user: a file, a name, a path, an option."""


class SpecError(UserError):
    """One or more problems in a hypothesis file, each `file:line: field: message`."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ComponentNameError(UserError):
    """A component or edge name that does not parse or is outside the model."""


class ModelLoadError(UserError):
    """A model directory that is missing, malformed or unsafe to load."""


class DataError(UserError):
    """A dataset that is malformed (e.g. clean/corrupted length mismatch)."""


class UnsupportedError(UserError):
    """A request the harness understands but cannot carry out (e.g. edge patching
    from an MLP sender)."""


class OutputExistsError(UserError):
    """The report folder asked for already exists; runs never overwrite."""


class OutputWriteError(UserError):
    """A report folder that cannot be written (not a folder, no permission, a full
    disk); when it happens after the work, the message says where the evidence was kept."""


class DeviceError(UserError):
    """A device name that is malformed or not available on this machine."""


class EvidenceFormatError(UserError):
    """An evidence.json or sweep.json document that does not match its format."""


class SanityCheckError(HarnessError):
    """A check that must hold on every run failed (hook never fired, ...)."""
