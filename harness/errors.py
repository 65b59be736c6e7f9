"""Typed exceptions.  `UserError` subclasses are the user's mistakes: the CLI
prints their message (no traceback) and exits 2."""

from __future__ import annotations


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


class SanityCheckError(HarnessError):
    """A check that must hold on every run failed (hook never fired, ...)."""


class OutputExistsError(UserError):
    """The report folder asked for already exists; runs never overwrite."""


class DeviceError(UserError):
    """A device name that is malformed or not available on this machine."""
