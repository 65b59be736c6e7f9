"""pytest plugin: hypothesis files as tests.

Registered through the `pytest11` entry point, so `pytest hypotheses/` collects
every hypothesis file as a test collection and every claim as one test item,
named by its claim id (`hypotheses/induction.yaml::prev-token-L0H7`).

Recognition rule: a `.yaml` / `.yml` file is a hypothesis file when it has a
top-level `harness:` key (the format version), i.e. a line starting with
`harness:` — other YAML files are left alone.

Each file is run once (lazily, by its first selected item) and every item
reads its verdict from that run; models are loaded once per session.  A run
that fails is not repeated: a harness error (bad model, names outside it, a
sanity check) fails every item with its one-line message; an unexpected error
shows its traceback once, on the first item, and the others point to it.  PASS ->
passed; FAIL -> failed with a short evidence summary; INCONCLUSIVE -> failed by
default, or xfail / skip with `--harness-inconclusive` (ini:
`harness_inconclusive`).  A recorded sanity check that fails (the clean-corrupted
gap below min_gap) does not change the items' outcomes (the claims whose numbers
it leaves undefined are INCONCLUSIVE on their own): it is listed in a "harness
sanity checks" section of the terminal summary, `FILE: sanity check failed: NAME —
DETAIL`, and pytest's exit code stays pytest's.  Schema errors are collection errors with file:line.
One marker per registered claim kind (role, attention, copying, composition, ablation,
edge, path, circuit; e.g. `-m "not circuit"`).  Options: `--harness-report DIR` (write each file's
report under DIR), `--harness-seed N`, `--harness-device DEVICE` (ini:
`harness_device`; cpu, cuda, cuda:N or mps; default: $HARNESS_DEVICE or the best
available, as model.devices.resolve_device; the command-line option wins over the ini).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from .claims import registry
from .engine.runner import run
from .errors import HarnessError, SpecError
from .evidence.format import fmt_p
from .evidence.result import ClaimResult, Evidence
from .hypothesis.loading import load
from .registry import load_plugins
from .report import views
from .report.writer import write_report

_KEY = re.compile(rb"^harness\s*:", re.MULTILINE)


def is_hypothesis_file(path: Path) -> bool:
    """The recognition rule: a YAML file with a top-level `harness:` key."""
    if path.suffix not in (".yaml", ".yml"):
        return False
    try:
        head = path.read_bytes()[:65536]
    except OSError:
        return False
    return bool(_KEY.search(head))


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("harness", "mechanism hypotheses (harness)")
    group.addoption("--harness-report", metavar="DIR", default=None,
                    help="write each hypothesis file's evidence report into a new folder under DIR")
    group.addoption("--harness-seed", type=int, default=None, help="override the files' seed")
    group.addoption("--harness-inconclusive", choices=("fail", "xfail", "skip"), default=None,
                    help="outcome of an INCONCLUSIVE claim (default: fail, or the ini value)")
    group.addoption("--harness-device", metavar="DEVICE", default=None,
                    help="cpu, cuda, cuda:N or mps; default: best available, or $HARNESS_DEVICE "
                         "(or the ini value)")
    parser.addini("harness_inconclusive", "outcome of an INCONCLUSIVE claim: fail, xfail or skip",
                  default="fail")
    parser.addini("harness_device", "device the models run on: cpu, cuda, cuda:N or mps "
                  "(default: best available, or $HARNESS_DEVICE)", default="")


def pytest_configure(config: Any) -> None:
    load_plugins()  # the kinds of installed plugins get their markers too
    for kind in registry.kinds().values():
        config.addinivalue_line("markers", f"{kind.name}: a harness {kind.name} claim ({kind.summary})")


def pytest_collect_file(file_path: Path, parent: Any) -> HypothesisFile | None:
    if is_hypothesis_file(file_path):
        return HypothesisFile.from_parent(parent, path=file_path)
    return None


class HypothesisError(Exception):
    """A file whose run could not happen (model missing, names outside the model, ...)."""


class ClaimNotPassed(Exception):
    """A FAIL (or INCONCLUSIVE treated as failure) verdict."""


class HypothesisFile(pytest.File):
    _evidence: Evidence | None = None
    _error: str | None = None
    _crash: BaseException | None = None  # an unexpected error, raised (with its traceback) once

    def collect(self) -> Any:
        try:
            loaded = load(self.path)
        except SpecError as exc:
            raise self.CollectError(str(exc)) from None
        self._evidence = None
        self._error = None
        for claim in loaded.spec.claims:
            item = ClaimItem.from_parent(self, name=claim.id, claim_kind=claim.kind)
            item.add_marker(getattr(pytest.mark, claim.kind))
            yield item

    def evidence(self) -> Evidence:
        """Run the file once; every item reads its verdict from this."""
        if self._evidence is None and self._error is None:
            config = self.config
            try:
                evidence = run(self.path, seed=config.getoption("harness_seed"),
                               command=f"pytest {self.path}", device=device(config))
                config.stash.setdefault(_SANITY, []).extend(
                    f"{self.path}: sanity check failed: {c.name} — {c.detail}" for c in evidence.failed_sanity_checks)
                out = config.getoption("harness_report")
                if out:
                    folder = write_report(evidence, reports_root=out)
                    config.stash.setdefault(_REPORTS, []).append(str(folder))
                self._evidence = evidence
            except HarnessError as exc:
                self._error = str(exc)
            except Exception as exc:  # a bug or an environment failure: its traceback is shown once
                self._error = (f"the run of {self.path.name} failed with {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''} (traceback on the first item)")
                self._crash = exc
        if self._crash is not None:
            crash, self._crash = self._crash, None
            raise crash
        if self._error is not None or self._evidence is None:
            raise HypothesisError(self._error or "the file did not run")
        return self._evidence


_REPORTS = pytest.StashKey[list[str]]()
_SANITY = pytest.StashKey[list[str]]()  # recorded sanity checks that failed, one line each


def device(config: Any) -> str | None:
    """--harness-device, else the ini `harness_device`, else None (resolved by run())."""
    return config.getoption("harness_device") or config.getini("harness_device") or None


class ClaimItem(pytest.Item):
    def __init__(self, *, claim_kind: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.claim_kind = claim_kind

    def runtest(self) -> None:
        if not isinstance(self.parent, HypothesisFile):
            raise TypeError("a harness claim item belongs to a hypothesis file")
        result = self.parent.evidence().claim(self.name)
        self.user_properties += [("verdict", result.verdict), ("value", key_number(result)),
                                 ("expectation", result.expectation)]
        if result.verdict == "PASS":
            return
        if result.verdict == "INCONCLUSIVE":
            mode = (self.config.getoption("harness_inconclusive")
                    or self.config.getini("harness_inconclusive"))
            if mode == "xfail":
                pytest.xfail(f"INCONCLUSIVE: {result.why}")
            if mode == "skip":
                pytest.skip(f"INCONCLUSIVE: {result.why}")
        raise ClaimNotPassed(summary(result))

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, (ClaimNotPassed, HypothesisError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Any, None, str]:
        return self.path, None, f"{self.path.name}::{self.name} ({self.claim_kind})"


def key_number(r: ClaimResult) -> str:
    return views.get(r.kind).key_number(r)


def summary(r: ClaimResult) -> str:
    """The failure message: what was claimed, what was measured, and the rule."""
    lines = [f"{r.verdict}: {r.id} ({r.kind}, {r.evidence} evidence)",
             *([f"  why: {r.reason}"] if r.reason else []),
             f"  expected: {r.expectation}",
             f"  measured: {key_number(r)} {r.unit}"]
    p = getattr(r.details, "p_adjusted", None)
    if p is None:
        p = getattr(r.details, "binomial_p_value", None)
    if p is not None:
        lines.append(f"  p-value: {fmt_p(p)}")
    lines.append(f"  rule: {r.rule}")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    failed = config.stash.get(_SANITY, [])
    if failed:
        terminalreporter.write_sep("-", "harness sanity checks")
        for line in failed:
            terminalreporter.write_line(line)
    folders = config.stash.get(_REPORTS, [])
    if folders:
        terminalreporter.write_sep("-", "harness evidence reports")
        for f in folders:
            terminalreporter.write_line(f)
