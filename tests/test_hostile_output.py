"""Hostile and broken input, on the output side: what the reports show, where and how
they are written, Ctrl-C, and `harness report` on documents from anyone.

One small run (module fixture) of a hypothesis whose descriptions carry script
payloads, on a copy of the fixture model in a folder whose name is a payload, gives
the evidence that the other tests edit by hand.  Each group of the issue is a test
(or a parametrised test) of its own; every reproducer checks the exit code, the
message, that no traceback was printed and that nothing was left behind.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest.mock
import weakref
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness import cli, entry
from harness.errors import OutputExistsError
from harness.report import folders
from harness.report import html as html_module
from harness.report import writer as report
from harness.report.text import md_block, md_cell, md_code, md_text

from .conftest import FIXTURE, HYPOTHESES

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
IFRAME = "<iframe src=https://e.invalid></iframe>"
LINK = "[click](javascript:alert(1))"
PAYLOADS = (SCRIPT, IMG, IFRAME, LINK, "![x](javascript:alert(1))", "<a href=javascript:alert(1)>a</a>")
MATH = "$\\frac{1}{$ ^x \\alpha $"

HYPOTHESIS = """\
harness: 1
name: hostile
description: {description}
model: {model}
data:
  generator: repeated_tokens
  n_prompts: 16
  segment_length: 8
  split: test
stats:
  bootstrap: 200
  permutations: 200
  null_draws: 99
claims:
  - id: prev-token-L0H7
    kind: role
    head: L0H7
    role: previous_token
    at_least: 0.5
    description: {claim_description}
  - id: prev-token-head-needed
    kind: ablation
    heads: [L0H7]
    ablation: zero
    at_least: 0.3
    description: {ablation_description}
"""


def hostile_file(folder: Path, model: Path) -> Path:
    """A small hypothesis whose free text (descriptions) carries every payload."""
    f = folder / "hostile.yaml"
    f.write_text(HYPOTHESIS.format(
        model=json.dumps(str(model)), description=json.dumps(" ".join(PAYLOADS) + " a | b"),
        claim_description=json.dumps(f"{IMG} **bold** {MATH}"),
        ablation_description=json.dumps(f"line one {SCRIPT}\n- not a list | pipe\n{LINK}")))
    return f


def hostile_model(folder: Path) -> Path:
    """A copy of the fixture model in a folder named like an image-tag payload."""
    model = folder / IMG
    shutil.copytree(FIXTURE, model)
    return model


def leftovers(folder: Path) -> list[str]:
    """Hidden or temporary entries anywhere under `folder` (there must be none)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.name.startswith(".") or p.name.endswith(".tmp"))


PROGRESS = re.compile(r"^\[ *\d+\.\d s\] ")  # harness.progress stage lines, not messages


def messages(err: str) -> list[str]:
    """stderr's lines other than progress lines."""
    return [line for line in err.strip().splitlines() if not PROGRESS.match(line)]


def assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err, err
    lines = messages(err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, err)


class _Elements(HTMLParser):
    """Every element of a page with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def assert_safe_html(page: str) -> None:
    """No element, attribute or URL that could run or load anything, whatever the page's
    text says; and the page carries its CSP."""
    parser = _Elements()
    parser.feed(page)
    for tag, attrs in parser.found:
        assert tag not in ("script", "iframe", "object", "embed", "form", "frame", "svg", "math", "base"), tag
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("href", "src"):
                assert value.startswith(("data:image/png;base64,", "http://", "https://")) or ":" not in value.split(
                    "/")[0], (tag, value)
    assert ("meta", {"http-equiv": "Content-Security-Policy", "content": html_module.CSP}) in parser.found
    assert "default-src 'none'" in html_module.CSP


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """(hypothesis file, report folder) of `harness run` on the hostile hypothesis."""
    tmp = tmp_path_factory.mktemp("hostile")
    hyp = hostile_file(tmp, hostile_model(tmp))
    out = tmp / "report"
    assert cli.main(["run", str(hyp), "--out", str(out), "--device", "cpu"]) in (0, 1)
    return hyp, out


@pytest.fixture
def evidence(hostile):
    """A fresh copy of the hostile run's evidence document."""
    return json.loads((hostile[1] / "evidence.json").read_text())


def table_rows(md: str, title: str) -> list[str]:
    """The rows of the first table after the heading `title`."""
    lines = md[md.index(title):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    return [line for line in lines[start:] if line.startswith("|")][:next(
        (i for i, line in enumerate(lines[start:]) if not line.startswith("|")), None)]


def write_doc(folder: Path, doc: dict, name: str = "evidence.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(doc))
    return folder / name


# --- 1. script injection ------------------------------------------------------------------------------------------

def test_text_helpers_make_input_literal():
    """Each helper's output renders as the input text, in Python-Markdown and in CommonMark,
    with no element made from it."""
    import markdown
    from markdown_it import MarkdownIt

    cm = MarkdownIt("commonmark").enable("table")
    for p in (*PAYLOADS, "*em* _em_ `c`", "# h", "- item", "1. one", "> q", "[a]: javascript:alert(1)", MATH,
              "&lt;b&gt;", "<!-- c -->", "x] (y)"):
        for html in (markdown.markdown(md_block(p), extensions=["tables"]), cm.render(md_block(p))):
            assert unescape(re.sub(r"</?p>|\n", "", html)) == p, (p, html)
        table = f"| a | b |\n|---|---|\n| {md_cell(p + ' | x')} | z |\n"
        for html in (markdown.markdown(table, extensions=["tables"]), cm.render(table)):
            assert html.count("<td") == 2 and "<a " not in html and "<script" not in html, (p, html)
        assert "<script" not in cm.render("x " + md_code(p + "``")) and "<code>" in cm.render("x " + md_code(p))
    assert md_text("L0H7 -> L1H5.k previous_token CI [0.2, 0.3] p <= 0.05") == \
        "L0H7 -> L1H5.k previous_token CI [0.2, 0.3] p <= 0.05"  # the harness's own text is unchanged
    assert md_text("a\nb\r\n\u2028c\x1b[31m") == "a b c[31m"


def test_run_report_shows_payloads_as_text(hostile):
    """`harness run` on a hypothesis whose descriptions and model folder are payloads."""
    _, out = hostile
    page = (out / "report.html").read_text()
    assert_safe_html(page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "[click](javascript:alert(1))" in page  # shown as text, not made a link
    md = (out / "report.md").read_text()
    prose = re.sub(r"(`+)[^`].*?\1", "", md)  # outside code spans, where the text is literal anyway
    assert SCRIPT not in prose and IMG not in prose and "&lt;script>alert(1)&lt;/script>" in prose
    assert "- not a list" not in md.splitlines()  # a description's lines stay one paragraph
    assert leftovers(out.parent) == []


@pytest.fixture
def edited(tmp_path, evidence):
    """An evidence.json edited by hand: payloads in every string the report shows,
    `|` and a line break in ids and descriptions, mathtext in ids."""
    doc = evidence
    doc["hypothesis"]["name"] = f"name {SCRIPT}"
    doc["hypothesis"]["description"] = f"{IFRAME}\n{LINK}"
    doc["model"]["source"] = f"models/{IMG}/`x`"
    doc["data"]["description"] = f"data {IMG}"
    doc["warnings"] = [f"warn {SCRIPT}"]
    doc["provenance"]["command"] = f"harness run `{SCRIPT}`"
    doc["claims"][0]["id"] = f"a|b\nc {SCRIPT}"
    doc["claims"][0]["description"] = f"x | y\n{IMG}"
    doc["claims"][1]["id"] = MATH
    doc["claims"][1]["rule"] = LINK
    doc["claims"][1]["details"]["corruption"] = SCRIPT
    doc["sanity_checks"][0]["detail"] = IFRAME
    for row in doc["ladder"]:
        row["mechanism"] = f"{row['mechanism']} {IMG}"
    if doc["figures_data"].get("attention"):
        doc["figures_data"]["attention"][0]["head"] = MATH
    return write_doc(tmp_path / "in", doc)


def test_report_command_on_an_edited_evidence_json(edited, tmp_path):
    """`harness report` on an evidence.json from someone else: every payload is text,
    table rows keep their cells, figures draw `$`, `\\` and `^` literally."""
    assert report.validate_evidence(json.loads(edited.read_text())) == []
    assert cli.main(["report", str(edited), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert_safe_html(page)
    for text in ("&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt;",
                 "&lt;iframe src=https://e.invalid&gt;&lt;/iframe&gt;", "[click](javascript:alert(1))"):
        assert text in page, text
    md = (tmp_path / "out" / "report.md").read_text()
    for title in ("## Verdicts", "## Evidence ladder"):
        rows = table_rows(md, title)
        assert len(rows) > 2 and len({len(re.split(r"(?<!\\)\|", row)) for row in rows}) == 1, rows
    # `|` and the line break do not add or split cells
    assert r"| [a\|b c &lt;script>alert(1)&lt;/script>](#claim-1) " in md
    assert '<a href="#claim-1" rel="noopener noreferrer">a|b c &lt;script&gt;alert(1)&lt;/script&gt;</a>' in page
    assert (tmp_path / "out" / "figures" / "effects.png").stat().st_size > 1000  # mathtext did not stop it


@pytest.fixture(scope="module")
def hostile_sweep(hostile, tmp_path_factory):
    """The folder of `harness sweep` of the hostile hypothesis over the payload-named model."""
    hyp, _ = hostile
    out = tmp_path_factory.mktemp("hostile-sweep") / "sweep"
    assert cli.main(["sweep", str(hyp), "--models", str(hyp.parent / IMG), "--out", str(out), "--device", "cpu"]) \
        in (0, 1)
    return out


def test_report_command_on_an_edited_sweep_json(tmp_path, hostile_sweep, capsys):
    """A sweep over the payload-named model, then its sweep.json edited by hand: the pages
    show every payload as text; a link target that is not a run folder is refused."""
    out = tmp_path / "sweep"
    shutil.copytree(hostile_sweep, out)
    page = (out / "sweep.html").read_text()
    assert_safe_html(page)
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    doc = json.loads((out / "sweep.json").read_text())
    label = f"m {SCRIPT} | {LINK}"
    doc["models"][0]["label"] = doc["jobs"][0]["model"] = label
    doc["models"][0]["series"] = IFRAME
    doc["hypotheses"][0]["claims"][0]["id"] = doc["jobs"][0]["claims"][0]["id"] = f"c\n{IMG}"
    doc["provenance"]["command"] = f"``{SCRIPT}"
    doc["jobs"][0]["ladder"] = [{"mechanism": IMG, "highest": SCRIPT, "contradictions": []}]
    (out / "sweep.json").write_text(json.dumps(doc))
    assert cli.main(["report", str(out / "sweep.json"), "--out", str(tmp_path / "again")]) == 0
    page = (tmp_path / "again" / "sweep.html").read_text()
    assert_safe_html(page)
    assert '">m &lt;script&gt;alert(1)&lt;/script&gt; | [click](javascript:alert(1))</a></th>' in page  # whole text
    md = (tmp_path / "again" / "sweep.md").read_text()
    for title in ("### Verdicts per model", "### When each claim", "### Key numbers", "## Models"):
        rows = table_rows(md, title)
        assert len(rows) > 2 and len({len(re.split(r"(?<!\\)\|", row)) for row in rows}) == 1, rows
    doc["jobs"][0]["report"] = "javascript:alert(1)//x"
    (out / "sweep.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli.main(["report", str(out / "sweep.json"), "--out", str(tmp_path / "third")]) == 2
    assert "jobs/0/report" in capsys.readouterr().err and not (tmp_path / "third").exists()


def test_csp_stops_a_script_that_got_through(hostile, tmp_path):
    """Defence in depth, in a real browser: the page renders its figures under its CSP
    (screenshot equal to the page without it), and a script put into it never runs."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed")
    page = (hostile[1] / "report.html").read_text()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=3000", "--window-size=1000,1500"]
    injected = tmp_path / "injected.html"
    injected.write_text(page.replace("</body>", "<script>document.body.setAttribute('data-ran', 'yes')</script>"
                                     f"{IMG.replace('alert(1)', 'document.body.setAttribute(`data-ran`,1)')}</body>"))
    dom = subprocess.run([exe, *flags, "--dump-dom", injected.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert "<body" in dom and not re.search(r"<body[^>]*data-ran", dom)  # neither the script nor onerror ran
    shots = []
    for name, text in (("with", page), ("without", re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "",
                                                           page))):
        (tmp_path / f"{name}.html").write_text(text)
        subprocess.run([exe, *flags, f"--screenshot={tmp_path / name}.png", (tmp_path / f"{name}.html").as_uri()],
                       capture_output=True, timeout=120)
        shots.append((tmp_path / f"{name}.png").read_bytes())
    assert len(shots[0]) > 10_000 and shots[0] == shots[1]


# --- 3. concurrent runs -------------------------------------------------------------------------------------------

def _race(n: int, target: Path, unique: bool) -> list[Path | BaseException]:
    """`n` threads write different files to `target` at once (after all of them have
    written their temporary folders)."""
    barrier = threading.Barrier(n)
    real_fill = folders._fill
    results: list[Path | BaseException] = [RuntimeError("not run")] * n

    def fill(folder: Path, files: dict[str, bytes]) -> None:
        real_fill(folder, files)
        barrier.wait(timeout=30)  # every writer reaches the rename together

    def one(i: int) -> None:
        try:
            results[i] = folders.write_folder(target, {"who": str(i).encode(), "sub/x": b"x" * 1000}, unique=unique)
        except BaseException as exc:  # noqa: B036 - the test inspects it
            results[i] = exc

    with unittest.mock.patch.object(folders, "_fill", fill):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    return results


def test_concurrent_writers_never_collide(tmp_path):
    """Writers of one default folder name at the same second each get a complete folder
    of their own; writers of one --out: one wins, the others get OutputExistsError, and
    the winner's folder is whole.  No temporary folder is left."""
    target = folders.default_folder("induction", tmp_path / "reports")
    results = _race(4, target, unique=True)
    assert all(isinstance(r, Path) for r in results), results
    assert len(set(results)) == 4 and all(r.parent == target.parent for r in results)
    assert sorted((r / "who").read_text() for r in results) == ["0", "1", "2", "3"]
    out = tmp_path / "out"
    results = _race(3, out, unique=False)
    won = [r for r in results if isinstance(r, Path)]
    lost = [r for r in results if isinstance(r, OutputExistsError)]
    assert len(won) == 1 and len(lost) == 2, results
    assert sorted(p.name for p in out.iterdir()) == ["sub", "who"] and (out / "sub" / "x").stat().st_size == 1000
    assert leftovers(tmp_path) == []


def test_concurrent_runs_in_processes(tmp_path):
    """Two processes write reports named for the same second into one reports folder."""
    code = ("import sys; from pathlib import Path; from harness.report import folders\n"
            "target = Path(sys.argv[1])\n"
            "import time\n"
            "while not Path(sys.argv[2]).exists(): time.sleep(0.005)\n"
            "print(folders.write_folder(target, {'report.md': sys.argv[3].encode()}, unique=True))\n")
    target = tmp_path / "reports" / "induction-20260101T000000Z"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(target), str(go), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    time.sleep(1.0)
    go.touch()
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    written = sorted(Path(o.strip()) for o, _ in outs)
    assert [w.name for w in written] == [target.name, target.name + "-2"]
    assert sorted(w.joinpath("report.md").read_text() for w in written) == ["0", "1"]
    assert leftovers(tmp_path / "reports") == []


def test_out_taken_during_the_run_is_exit_2(tmp_path, evidence, monkeypatch, capsys):
    """`--out` free when checked, taken by someone else before the final rename: exit 2,
    one line naming it and where the evidence was kept; the other folder untouched."""
    out = tmp_path / "out"
    ev = report.load_evidence(evidence)
    real = report.report_files

    def slow_files(e):
        files = real(e)
        out.mkdir()
        (out / "theirs.txt").write_text("someone else's")
        return files

    monkeypatch.setattr(cli, "run", lambda *a, **k: ev)
    monkeypatch.setattr(report, "report_files", slow_files)
    code = cli.main(["run", str(HYPOTHESES / "induction.yaml"), "--out", str(out), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert_one_line_error(err, str(out), "already exists", "evidence is kept in")
    kept = Path(err.split("kept in ")[1].strip())
    assert report.validate_evidence(json.loads((kept / "evidence.json").read_text())) == []
    assert [p.name for p in out.iterdir()] == ["theirs.txt"] and leftovers(tmp_path) == []
    shutil.rmtree(kept)


# --- 4. output problems found before the work, or said clearly after it ------------------------------------------

def _bad_places(tmp_path: Path, monkeypatch) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "read-only").mkdir()
    real_mkdir = os.mkdir

    def mkdir(path, *a, **k):  # a folder nobody may write in, even root (who may write anywhere)
        if Path(path).parent == tmp_path / "read-only":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(folders.os, "mkdir", mkdir)
    return {
        "dangling symlink as --out": (["--out", str(tmp_path / "dangling")], "symbolic link"),
        "--reports is a file": (["--reports", str(tmp_path / "file")], "not a folder"),
        "--out under a file": (["--out", str(tmp_path / "file" / "r")], "not a folder"),
        "--out in an unwritable folder": (["--out", str(tmp_path / "read-only" / "r")], "Permission denied"),
        "--reports in an unwritable folder": (["--reports", str(tmp_path / "read-only" / "reports")],
                                              "Permission denied"),
        "--out under /proc": (["--out", "/proc/harness-test/r"], "/proc"),
        "--reports under /proc": (["--reports", "/proc/self/harness-test"], "/proc"),
    }


CASES = [(command, case) for command in ("run", "sweep", "scan")
         for case in ("dangling symlink as --out", "--reports is a file", "--out under a file",
                      "--out in an unwritable folder", "--reports in an unwritable folder", "--out under /proc",
                      "--reports under /proc")
         if not (command == "scan" and case.startswith("--reports"))]  # scan writes under ./reports


@pytest.mark.parametrize(("command", "case"), CASES)
def test_unwritable_output_is_refused_before_any_work(command, case, tmp_path, monkeypatch, capsys):
    """A place the report cannot go is exit 2 with one line, before any model loads."""
    args, needle = _bad_places(tmp_path, monkeypatch)[case]

    def no_work(*a, **k):
        raise AssertionError("the work started")

    for name in ("run", "scan", "load_model"):
        monkeypatch.setattr(cli, name, no_work)
    monkeypatch.setattr("harness.sweep.executors.make", no_work)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    argv = {"run": ["run", str(HYPOTHESES / "induction.yaml")],
            "sweep": ["sweep", str(HYPOTHESES / "induction.yaml"), "--models", str(FIXTURE)],
            "scan": ["scan", str(FIXTURE)]}[command]
    assert cli.main([*argv, *args]) == 2
    assert_one_line_error(capsys.readouterr().err, needle)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_full_disk_at_the_end_keeps_the_evidence(tmp_path, evidence, monkeypatch, capsys):
    """ENOSPC while the folder is written: exit 2, one line with the reason and the place
    the evidence was kept; nothing left in the reports folder."""
    ev = report.load_evidence(evidence)
    real_fill = folders._fill
    calls = []

    def full(folder: Path, files: dict[str, bytes]) -> None:
        calls.append(folder)
        if "harness-rescued-" in str(folder):
            return real_fill(folder, files)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cli, "run", lambda *a, **k: ev)
    monkeypatch.setattr(folders, "_fill", full)
    code = cli.main(["run", str(HYPOTHESES / "induction.yaml"), "--reports", str(tmp_path / "reports"),
                     "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert_one_line_error(err, "No space left on device", "evidence.json kept in")
    kept = Path(err.split("kept in ")[1].strip())
    assert json.loads((kept / "evidence.json").read_text())["claims"] == evidence["claims"]
    assert list((tmp_path / "reports").iterdir()) == []
    shutil.rmtree(kept)


def test_report_folders_have_normal_permissions(tmp_path, evidence):
    old = os.umask(0o022)
    try:
        folder = report.write_report(report.load_evidence(evidence), reports_root=tmp_path)
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o755
    assert (folder / "figures").stat().st_mode & 0o777 == 0o755
    assert (folder / "report.md").stat().st_mode & 0o777 == 0o644


# --- 5. Ctrl-C ----------------------------------------------------------------------------------------------------

def _default_sigint() -> None:
    """In the child: SIGINT as a terminal's Ctrl-C delivers it, whatever this process inherited (a
    background job of a non-interactive shell starts with SIGINT ignored, and so would the child)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_run_is_one_line_and_leaves_nothing(tmp_path):
    """SIGINT to a real `harness run` while it measures: exit 130, `interrupted` alone on
    stderr (no traceback), nothing under the reports folder."""
    text = (HYPOTHESES / "induction.yaml").read_text()
    long = tmp_path / "long.yaml"  # the demo on more prompts: still measuring when interrupted
    long.write_text(text.replace("model: ../fixtures/induction-2l", f"model: {FIXTURE}")
                    .replace("n_prompts: 200", "n_prompts: 1000"))
    reports = tmp_path / "reports"
    env = dict(os.environ, OMP_NUM_THREADS="1", HARNESS_DEVICE="cpu")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("harness")), "run", str(long), "--reports",
                             str(reports)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    try:
        said = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("base runs:" in line for line in said):
            line = proc.stderr.readline()  # the stage lines: the run is measuring once base runs start
            assert line, (said, proc.communicate())
            said.append(line)
        assert proc.poll() is None, (said, proc.communicate())
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # whatever failed above: no process left running past the test
        proc.communicate()
    assert proc.returncode == 130, err
    assert messages("".join(said) + err) == ["interrupted"], err
    assert not reports.exists() or list(reports.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.yaml"] + (["reports"] if reports.exists() else [])


@pytest.mark.parametrize("where", ["mkdir", "fill", "claim", "rename"])
def test_ctrl_c_while_writing_leaves_nothing(where, tmp_path, monkeypatch):
    """An interrupt at any step of writing a folder removes what that step made."""
    real_mkdir = os.mkdir

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    def mkdir(path, *a, **k):
        real_mkdir(path, *a, **k)
        name = os.path.basename(path)
        if (where == "mkdir" and name.startswith(".out.")) or (where == "claim" and name == "out"):
            raise KeyboardInterrupt  # just after the folder was made

    monkeypatch.setattr(folders.os, "mkdir", mkdir)
    if where == "fill":
        monkeypatch.setattr(folders, "_fill", interrupt)
    if where == "rename":
        monkeypatch.setattr(folders.os, "rename", interrupt)
    with pytest.raises(KeyboardInterrupt):
        folders.write_folder(tmp_path / "out", {"a/b": b"1", "c": b"2"})
    assert list(tmp_path.iterdir()) == []


def test_a_swallowed_ctrl_c_comes_again(monkeypatch, capsys):
    """A KeyboardInterrupt raised where Python only prints it (an import lock's weakref callback,
    a __del__) is followed by another: the command still ends with `interrupted` and exit 130."""
    class Locked:
        pass

    def swallows_then_works(args):
        lock = Locked()  # as the import system's module locks: a weakref callback runs when it goes
        gone = weakref.ref(lock, lambda _: signal.raise_signal(signal.SIGINT))
        del lock  # Ctrl-C inside the callback: Python prints "Exception ignored" and goes on
        assert gone() is None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.01)
        return 0

    monkeypatch.setattr(cli, "cmd_validate", swallows_then_works)
    # SIGINT as a terminal's Python has it (a background job of a non-interactive shell starts with it ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        start, hook = time.monotonic(), sys.unraisablehook
        assert cli.main(["validate", str(HYPOTHESES / "induction.yaml")]) == 130
        assert time.monotonic() - start < 20  # raised again, not the end of the command's 30 s
        assert capsys.readouterr().err == "interrupted\n"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was
        assert sys.unraisablehook is hook
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_ctrl_c_while_the_cli_imports_is_exit_130(monkeypatch, capsys):
    """The `harness` command's first second or two import the CLI; Ctrl-C then is one line too."""
    class Interrupting:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "harness.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "harness.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert entry.main() == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_in_main_is_exit_130(monkeypatch, capsys):
    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run", interrupt)
    assert cli.main(["run", str(HYPOTHESES / "induction.yaml"), "--reports", "/tmp", "--device", "cpu"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


# --- 14. harness report on documents from anyone ------------------------------------------------------------------

def _bad_document(tmp_path: Path, case: str, good: bytes) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    text = good.decode()
    path = folder / "evidence.json"
    if case == "NaN literal":
        path.write_text(re.sub(r'"value": [^,]+,', '"value": NaN,', text, count=1))
    elif case == "Infinity literal":
        path.write_text(re.sub(r'"ci": \[\s*[^,\]]+,', '"ci": [-Infinity,', text, count=1))
    elif case == "overflowing number":
        path.write_text(re.sub(r'"value": [^,]+,', '"value": 1e999,', text, count=1))
    elif case == "deep nesting":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif case == "not UTF-8":
        path.write_bytes(good[:200] + b"\xff\xfe" + good[200:])
    elif case == "not JSON":
        path.write_text(text[:-20])
    elif case == "named report.html":
        path = folder / "report.html"
        path.write_bytes(good)
    elif case == "no .json suffix":
        path = folder / "evidence.txt"
        path.write_bytes(good)
    elif case == "a folder":
        path = folder / "x.json"
        path.mkdir()
    elif case == "no host platform (the renderer crashed)":
        doc = json.loads(good)
        del doc["provenance"]["host"]["platform"]
        path.write_text(json.dumps(doc))
    elif case == "a ragged figure matrix (the renderer crashed)":
        doc = json.loads(good)
        doc["figures_data"]["attention"][0]["pattern"][1] = [0.5]
        path.write_text(json.dumps(doc))
    return path


BAD_DOCUMENTS = {"NaN literal": "NaN: not a finite number", "Infinity literal": "-Infinity",
                 "overflowing number": "1e999",
                 "deep nesting": "nested too deeply", "not UTF-8": "not UTF-8", "not JSON": "not valid JSON",
                 "named report.html": "not a .json file", "no .json suffix": "not a .json file",
                 "a folder": "is a folder", "no host platform (the renderer crashed)": "host",
                 "a ragged figure matrix (the renderer crashed)": "rows of different lengths"}


@pytest.mark.parametrize("case", list(BAD_DOCUMENTS))
def test_report_refuses_bad_documents_in_one_line(case, tmp_path, hostile, capsys):
    good = (hostile[1] / "evidence.json").read_bytes()
    path = _bad_document(tmp_path, case, good)
    before = {p: p.read_bytes() for p in path.parent.rglob("*") if p.is_file()}
    assert cli.main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(f"error: {path}") and BAD_DOCUMENTS[case] in err, err
    assert all(line.startswith(f"error: {path}") or line.startswith(f"{path}") for line in err.strip().splitlines())
    assert {p: p.read_bytes() for p in path.parent.rglob("*") if p.is_file()} == before  # nothing written


def test_unreadable_file_is_one_line(tmp_path, hostile, monkeypatch, capsys):
    path = write_doc(tmp_path / "in", json.loads((hostile[1] / "evidence.json").read_text()))

    def denied(self):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert cli.main(["report", str(path)]) == 2
    assert_one_line_error(capsys.readouterr().err, str(path), "Permission denied")


def _mutations(doc: dict) -> list[tuple[str, object]]:
    """Every (JSON pointer, replacement) worth trying on the small document: each key
    deleted, emptied, nulled, or given another type or a payload (long lists: their
    first items only)."""
    out: list[tuple[str, object]] = []

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                out.extend((f"{path}/{k}", m) for m in (DELETE, None, "", SCRIPT, 0, -1, 1e300, [], {}, True))
                walk(v, f"{path}/{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x[:2]):
                out.extend((f"{path}/{i}", m) for m in (DELETE, None, "x", 0, [], {}))
                walk(v, f"{path}/{i}")
    walk(doc, "")
    return out


DELETE = object()


def _apply(doc: dict, pointer: str, value: object) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = pointer.split("/")[1:]
    node = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key = int(last) if isinstance(node, list) else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return doc


@contextlib.contextmanager
def _applied(doc: dict, pointer: str, value: object):
    """`doc` with one mutation made in place for the block, then undone (the key restored where it was)."""
    *parents, last = pointer.split("/")[1:]
    node = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key = int(last) if isinstance(node, list) else last
    old = node[key]
    if isinstance(node, dict):
        order = list(node)
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    try:
        yield doc
    finally:
        if isinstance(node, list):
            if value is DELETE:
                node.insert(key, old)
            else:
                node[key] = old
        else:
            node[key] = old
            for k in order:  # the original key order (a deleted key came back last)
                node[k] = node.pop(k)


def _renders_whenever_valid(doc: dict, problems, render_text, render_all, min_accepted: int) -> None:
    """Every single mutation of `doc` (text output; every 15th accepted one with figures) and
    combinations of up to three drawn by hypothesis (figures too): when `problems` finds
    none, rendering works."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    mutations = _mutations(doc)
    accepted = []
    work = copy.deepcopy(doc)
    for pointer, value in mutations:
        with _applied(work, pointer, value) as d:  # in place and undone: most mutations are refused, so no copy
            if problems(d) == []:
                accepted.append(pointer)
                (render_all if len(accepted) % 15 == 0 else render_text)(copy.deepcopy(d))  # must not raise
    assert work == doc  # every mutation undone: each was tried on the document alone
    assert len(accepted) >= min_accepted  # the test did exercise the renderer

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.sampled_from(range(len(mutations))), min_size=1, max_size=3))
    def combined(picks):
        d = doc
        for i in picks:
            try:
                d = _apply(d, *mutations[i])
            except (KeyError, IndexError, TypeError, ValueError):  # an earlier pick changed the path's shape
                return
        if problems(d) == []:
            render_all(d)  # must not raise (nor warn: warnings are errors in the tests)

    combined()


def test_every_schema_valid_evidence_document_renders(hostile):
    """Documents derived from a real evidence.json (each key deleted, emptied, nulled, given
    another type or a payload): whenever validation accepts one, report.md, report.html and
    the figures render."""
    from harness.report.html import render_html
    from harness.report.markdown import render_markdown

    def text(d):
        ev = report.load_evidence(d, checked=True)
        render_html(render_markdown(ev), {}, ev.hypothesis["name"])

    doc = json.loads((hostile[1] / "evidence.json").read_text())
    _renders_whenever_valid(doc, report.validate_evidence, text, report.render_files, 300)


def test_every_schema_valid_sweep_document_renders(hostile_sweep):
    """The same for sweep.json (with a second model whose job failed): whenever validation
    accepts a derived document, sweep.md, sweep.html and the figures render."""
    from harness.sweep import document
    from harness.sweep.report import render_markdown as sweep_markdown
    from harness.sweep.report import render_sweep

    doc = json.loads((hostile_sweep / "sweep.json").read_text())
    doc["models"].append(dict(doc["models"][0], label="second", step=None))
    doc["jobs"].append({"hypothesis": doc["jobs"][0]["hypothesis"], "model": "second", "report": None,
                        "status": "failed", "seconds": 1.0, "host": "h", "error": {
                            "type": "ModelLoadError", "message": f"{SCRIPT}\nsecond line", "where": "loading the model",
                            "traceback": None}})
    assert document.problems(doc) == []
    _renders_whenever_valid(doc, document.problems, lambda d: sweep_markdown(d, set()), render_sweep, 150)


def test_in_place_rerender_is_all_or_nothing(tmp_path, hostile, monkeypatch, capsys):
    """In place: the folder is swapped whole (stale figures and .tmp files gone); on a full
    disk it is left exactly as it was, with no temporary folder; a folder that holds more
    than a report, or the working directory, is refused."""
    folder = tmp_path / "r"
    shutil.copytree(hostile[1], folder)
    (folder / "figures" / "stale.png").write_bytes(b"old")
    (folder / ".report.md.tmp").write_bytes(b"old")
    (folder / "report.md").write_text("stale")
    snapshot = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    def full(dest: Path, files: dict[str, bytes]) -> None:
        (dest / "report.md").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(folders, "_fill", full)
        assert cli.main(["report", str(folder / "evidence.json")]) == 2
    assert_one_line_error(capsys.readouterr().err, "No space left on device", "unchanged")
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == snapshot
    assert [p.name for p in tmp_path.iterdir()] == ["r"]
    assert cli.main(["report", str(folder / "evidence.json")]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["evidence.json", "figures", "report.html", "report.md"]
    assert "stale.png" not in os.listdir(folder / "figures")
    assert (folder / "report.md").read_text() == (hostile[1] / "report.md").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["r"]
    (folder / "notes.txt").write_text("mine")
    assert cli.main(["report", str(folder / "evidence.json")]) == 2
    assert_one_line_error(capsys.readouterr().err, "notes.txt", "--out")
    (folder / "notes.txt").unlink()
    monkeypatch.chdir(folder)
    assert cli.main(["report", "evidence.json"]) == 2
    assert_one_line_error(capsys.readouterr().err, "folder you are in")


def test_report_on_3000_claims_is_fast(tmp_path, hostile):
    """A 3000-claim evidence.json (a real one's claims repeated with new ids) re-renders in
    seconds, not minutes: nothing is quadratic, effects.png draws the first claims only."""
    doc = json.loads((hostile[1] / "evidence.json").read_text())
    claims = doc["claims"]
    doc["claims"] = [dict(copy.deepcopy(claims[i % len(claims)]), id=f"claim-{i}") for i in range(3000)]
    path = write_doc(tmp_path / "big", doc)
    start = time.perf_counter()
    assert cli.main(["report", str(path)]) == 0
    assert time.perf_counter() - start < 60  # 209 s before
    assert "claim-2999" in (tmp_path / "big" / "report.md").read_text()
