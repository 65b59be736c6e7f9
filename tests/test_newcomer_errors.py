"""What a newcomer sees when something is wrong: the terminal says what the report
says (a failed sanity check, exit 3), a bad name or key gets the nearest valid one,
YAML indentation errors get a hint, `validate` checks head ranges against the model's
config.json without torch, one `error:` prefix, `--version`, dict sources name the
claim, `harness report` refuses a scan.json, and starter.yaml's model path is relative."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import cli
from harness.cli import main
from harness.errors import ExitCode, HarnessError, SanityCheckError, SpecError
from harness.hypothesis import loading
from harness.spec import names
from harness.sweep import document as sweep_document

from .conftest import FIXTURE, ROOT

GAP_HYPOTHESIS = """\
harness: 1
name: gap
model: {model}
data:
  file: p.jsonl
stats: {{bootstrap: 200, permutations: 200}}
claims:
  - id: prev-token
    kind: role
    head: L0H7
    role: previous_token
    at_least: 0.5
  - id: knockout
    kind: ablation
    heads: [L0H7]
    at_least: 0.5
"""
GAP_LINE = ("sanity check failed: clean and corrupted metrics differ — mean gap 0.000 nats (min_gap 0.5); "
            "normalised effects are undefined below it")


def messages(err: str) -> list[str]:
    """stderr without the progress lines (`[  1.2 s] ...`)."""
    return [line for line in err.splitlines() if line and not line.startswith("[")]


def write_gap_files(folder: Path) -> Path:
    """A hypothesis on the fixture whose prompt file's corrupted prompts equal the clean ones."""
    from harness.data import dataset as data

    ds = data.repeated_tokens(8, 6, 128, seed=3)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "p.jsonl").write_text("".join(json.dumps({"clean": c, "corrupted": c, "positions": p}) + "\n"
                                            for c, p in zip(ds.clean.tolist(), ds.positions.tolist(), strict=True)))
    h = folder / "h.yaml"
    h.write_text(GAP_HYPOTHESIS.format(model=FIXTURE))
    return h


class _Tee(io.StringIO):
    """A stream that also writes everything to `both` (stdout and stderr in the order written)."""

    def __init__(self, both: io.StringIO):
        super().__init__()
        self.both = both

    def write(self, text: str) -> int:
        self.both.write(text)
        return super().write(text)


@pytest.fixture(scope="module")
def gap_run(fixture_model, tmp_path_factory):
    """`harness run` (in-process) of the gap hypothesis: (exit code, stdout, stderr, both in
    order, report folder).  It also imports everything a run and its report need, before
    pytester's in-process runs."""
    folder = tmp_path_factory.mktemp("gap")
    h = write_gap_files(folder)
    out = folder / "out"
    both = io.StringIO()
    stdout, stderr = _Tee(both), _Tee(both)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["run", str(h), "--out", str(out), "--device", "cpu"])
    return code, stdout.getvalue(), stderr.getvalue(), both.getvalue(), out


# ---------------------------------------------------------------- sanity: terminal and exit code
def test_a_failed_gap_check_exits_3_and_is_printed_after_the_claim_table(gap_run):
    code, out, err, both, folder = gap_run
    assert code == ExitCode.SANITY == 3
    assert "1 passed, 0 failed, 1 inconclusive" in out  # the claim table was printed, the report written
    assert messages(err) == [GAP_LINE]
    lines = messages(both)  # after the claim table and its counts, before the report's path
    assert lines.index("1 passed, 0 failed, 1 inconclusive") < lines.index(GAP_LINE) < len(lines) - 1
    assert lines[-1].startswith("report: ")
    report = (folder / "report.md").read_text()
    assert "FAILED: clean and corrupted metrics differ — mean gap 0.000 nats" in report  # the report says the same
    checks = json.loads((folder / "evidence.json").read_text())["sanity_checks"]
    assert [c["passed"] for c in checks if c["name"] == "clean and corrupted metrics differ"] == [False]


def test_a_gap_no_claim_reads_is_not_applicable(gap_run, tmp_path, capsys):
    """The same prompts with only the role claim: no claim normalises by the gap, so its check is
    recorded as not applicable and the run exits by its claims."""
    folder = gap_run[-1]
    h = tmp_path / "h.yaml"
    (tmp_path / "p.jsonl").write_text((folder.parent / "p.jsonl").read_text())
    h.write_text(GAP_HYPOTHESIS.format(model=FIXTURE).split("  - id: knockout")[0])
    assert main(["run", str(h), "--out", str(tmp_path / "o"), "--device", "cpu"]) == ExitCode.OK
    assert "sanity check failed" not in capsys.readouterr().err
    check = next(c for c in json.loads((tmp_path / "o" / "evidence.json").read_text())["sanity_checks"]
                 if c["name"] == "clean and corrupted metrics differ")
    assert check["passed"] and check["applies"] is False and check["detail"].startswith("not applicable (no claim")
    assert "- not applicable: clean and corrupted metrics differ — not applicable (no claim normalises by this " \
           "gap): mean gap 0.000 nats" in (tmp_path / "o" / "report.md").read_text()


def test_the_pytest_plugin_lists_a_failed_sanity_check(gap_run, pytester):
    folder = gap_run[-1]
    pytester.makefile(".jsonl", p=(folder.parent / "p.jsonl").read_text())
    pytester.makefile(".yaml", gap=GAP_HYPOTHESIS.format(model=FIXTURE))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--harness-inconclusive=xfail")
    result.assert_outcomes(passed=1, xfailed=1)  # the claims' own verdicts stand
    out = result.stdout.str()
    assert "harness sanity checks" in out
    assert f"gap.yaml: {GAP_LINE}" in out


def test_evidence_and_sweep_exit_codes_count_recorded_sanity_checks():
    from harness.evidence.details import SanityCheck
    from harness.evidence.result import Evidence

    def evidence(passed: bool) -> Evidence:
        return Evidence(hypothesis={}, model={}, data={}, settings={}, baseline={}, claims=[], provenance={},
                        sanity_checks=[SanityCheck(name="gap", passed=passed, detail="mean gap 0.000 nats")])

    assert evidence(True).exit_code == ExitCode.OK and evidence(False).exit_code == ExitCode.SANITY
    assert evidence(False).failed_sanity_checks[0].name == "gap"
    ok = {"status": "ok", "sanity_failed": []}
    gap = {"status": "ok", "sanity_failed": [{"name": "gap", "detail": "mean gap 0.000 nats"}]}
    counts = {"failed": 0, "FAIL": 0, "INCONCLUSIVE": 0}
    assert sweep_document.exit_code({"counts": counts, "jobs": [ok]}) == ExitCode.OK
    assert sweep_document.exit_code({"counts": counts, "jobs": [ok, gap]}) == ExitCode.SANITY
    assert sweep_document.exit_code({"counts": dict(counts, failed=1), "jobs": [gap]}) == ExitCode.JOB_FAILED
    assert sweep_document.exit_code({"counts": counts, "jobs": [{"status": "ok"}]}) == ExitCode.OK  # older sweep.json
    assert sweep_document.failed_sanity_checks(
        {"sanity_checks": [{"name": "a", "passed": True, "detail": "x"}, {"name": "b", "passed": False, "detail": "y"}]}
    ) == [{"name": "b", "detail": "y"}]


# ---------------------------------------------------------------- did you mean: names
@pytest.mark.parametrize("text,fits,hint", [
    ("LOH7", names.HEAD, "L0H7"),  # letter O for digit 0
    ("l0h7", names.HEAD, "L0H7"),
    ("L01H7", names.HEAD, "L1H7"),  # leading zero
    ("L0.H7", names.HEAD, "L0H7"),
    ("L1G6", names.HEAD, "L1H6"),  # difflib
    ("L0H7.q", names.HEAD, "L0H7"),  # an input where a head is wanted
    ("L1H5", names.RECEIVER, "L1H5.q, .k or .v"),  # a head where an input is wanted
    ("L1H5K", names.RECEIVER, "L1H5.k"),
    ("emebd", names.SENDER, "embed"),
    ("logit", names.RECEIVER, "logits"),
    ("Embed", names.SENDER, "embed"),
])
def test_a_bad_name_gets_the_nearest_name_that_fits(text, fits, hint):
    with pytest.raises(HarnessError) as exc:
        names.parse_as(text, fits)
    assert str(exc.value) == f"{text!r} is not {fits.noun}; expected {fits.text} (did you mean {hint}?)"


@pytest.mark.parametrize("fits,absent", [
    (names.HEAD, ("embed", "logits", ".mlp", ".q/.k/.v")),
    (names.SENDER, ("logits", ".q/.k/.v")),
    (names.RECEIVER, ("embed",)),
    (names.ROUTE_SENDER, ("embed", "logits", ".mlp")),
    (names.ROUTE_RECEIVER, ("embed", "logits", ".mlp")),
])
def test_a_field_lists_only_what_fits_it(fits, absent):
    with pytest.raises(HarnessError) as exc:
        names.parse_as("X1", fits)
    message = str(exc.value)
    assert message == f"'X1' is not {fits.noun}; expected {fits.text}"  # nothing close: no suggestion
    assert not [word for word in absent if word in message], message


def test_suggestions_stay_inside_a_known_model():
    two_layers = names.Shape(n_layers=2, n_heads=8)
    assert names.nearest("LOH9", names.HEAD) == "L0H9"
    assert names.nearest("LOH9", names.HEAD, two_layers) is None  # L0H9 is not in a model of 8 heads
    assert names.nearest("LOH7", names.HEAD, two_layers) == "L0H7"
    assert names.nearest("L2H5", names.RECEIVER, two_layers) is None


def test_an_edge_with_a_wrong_arrow_gets_the_edge_that_fits():
    with pytest.raises(HarnessError) as arrow:
        names.parse_edge("L0H7 => L1H5.k")
    assert str(arrow.value) == ("'L0H7 => L1H5.k' is not an edge; expected 'sender -> receiver', e.g. 'L0H3 -> L1H6.k' "
                                "(did you mean 'L0H7 -> L1H5.k'?)")
    with pytest.raises(HarnessError) as exc:
        names.parse_edge("embed -> L1H5.k", names.HEAD_ROUTE)
    assert str(exc.value) == "'embed' is not the sender of a composition edge; expected a head L<layer>H<head>"


def test_mlps_get_one_answer_everywhere(tmp_path):
    """Parsing and claims say the same: MLPs are edge senders and receivers (EDGE_RULE),
    but have no composition score (MLP_NOTE)."""
    f = tmp_path / "h.yaml"
    f.write_text("harness: 1\nname: t\nmodel: hf:gpt2\ndata: {generator: repeated_tokens}\nclaims:\n"
                 "  - id: e\n    kind: edge\n    edge: L0H7 -> L1.mlp\n"
                 "  - id: c\n    kind: composition\n    edge: L0.mlp -> L1H0.k\n")
    with pytest.raises(SpecError) as exc:
        loading.load(f)
    assert exc.value.problems == [
        f"{f}:11: claims[1].edge: 'L0.mlp' is not the sender of a composition edge; expected a head L<layer>H<head>; "
        f"{names.MLP_NOTE}",
    ]
    assert "an MLP (L<layer>.mlp)" in names.EDGE_RULE and "a later MLP (its input)" in names.EDGE_RULE


# ---------------------------------------------------------------- did you mean: keys; file:line kept
GOOD = f"""\
harness: 1
name: t
model: {FIXTURE}
data:
  generator: repeated_tokens
  n_prompts: 20
claims:
  - id: prev-token
    kind: role
    head: L0H7
    role: previous_token
    at_least: 0.5
  - id: knockout
    kind: ablation
    heads: [L0H7]
    at_least: 0.5
"""


def problems_of(tmp_path: Path, text: str, check_model: bool = False) -> list[str]:
    f = tmp_path / "h.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as exc:
        loading.load(f, check_model=check_model)
    return [p.replace(str(f), "h.yaml") for p in exc.value.problems]


@pytest.mark.parametrize("old,new,expected", [
    ("    at_least: 0.5\n  - id: knockout", "    at_leest: 0.5\n  - id: knockout",
     "h.yaml:12: claims[0].at_leest: unknown key; allowed keys: id, kind, head, role, at_least, at_most, description "
     "(did you mean at_least?)"),
    ("name: t\n", "nmae: t\n",
     "h.yaml:2: nmae: unknown key; allowed keys: harness, name, description, model, data, metric, weight_processing, "
     "seed, stats, claims (did you mean name?)"),
    ("  n_prompts: 20", "  n_promts: 20",
     "h.yaml:6: data.n_promts: unknown key; allowed keys: generator, n_prompts, segment_length, bos, bos_token, seed, "
     "split, vocab_min, vocab_max, corruptions, n_reference, distinct (did you mean n_prompts?)"),
    ("claims:", "stats:\n  bootstrp: 100\nclaims:", "h.yaml:8: stats.bootstrp: unknown key; allowed keys: bootstrap, "),
    ("kind: ablation", "kind: abalation", "h.yaml:14: claims[1].kind: unknown claim kind 'abalation'; allowed: role, "
     "attention, copying, composition, ablation, attribution, edge, path, circuit (did you mean ablation?)"),
    ("role: previous_token", "role: previous-token", "h.yaml:11: claims[0].role: Input should be 'previous_token', "
     "'induction', 'duplicate_token' or 'first_token' (got 'previous-token') (did you mean previous_token?)"),
    ("head: L0H7", "head: LOH7", "h.yaml:10: claims[0].head: 'LOH7' is not a head; expected a head L<layer>H<head>, "
     "e.g. L1H6 (did you mean L0H7?)"),
    ("heads: [L0H7]", "heads: [L0H7, L1h5]", "h.yaml:15: claims[1].heads: 'L1h5' is not a head or an MLP; expected "
     "a head L<layer>H<head> or an MLP L<layer>.mlp, e.g. L1H6 or L1.mlp (did you mean L1H5?)"),
])
def test_unknown_keys_and_names_get_a_did_you_mean_with_file_and_line(tmp_path, old, new, expected):
    assert old in GOOD
    found = problems_of(tmp_path, GOOD.replace(old, new, 1))
    assert any(p.startswith(expected) for p in found), found
    if "bootstrp" in new:
        assert found[0].endswith("(did you mean bootstrap?)")


# ---------------------------------------------------------------- YAML indentation hints
HINT = "hint: check the indentation of this line and the one above (YAML nests by indentation; use spaces, not tabs)"


@pytest.mark.parametrize("old,new,expected", [
    ("  n_prompts: 20", "  n_prompts: 20\n    seed: 3",
     f"h.yaml:7: (yaml): mapping values are not allowed here; {HINT}"),
    ("    kind: role", "    kind role", f"h.yaml:10: (yaml): could not find expected ':'; {HINT}"),
    ("  - id: knockout", "   - id: knockout",
     f"h.yaml:13: (yaml): expected <block end>, but found '<block sequence start>'; {HINT}"),
    ("    head: L0H7", "\thead: L0H7", "h.yaml:10: (yaml): found character '\\t' that cannot start any token; hint: "
     "this line has a tab character; indent with spaces (YAML nests by indentation and refuses tabs)"),
])
def test_yaml_indentation_errors_get_a_plain_hint(tmp_path, old, new, expected):
    assert old in GOOD
    assert problems_of(tmp_path, GOOD.replace(old, new, 1)) == [expected]


def test_other_yaml_errors_keep_pyyamls_words(tmp_path):
    assert problems_of(tmp_path, GOOD.replace("  - id: knockout", "  - id: [knockout")) == [
        "h.yaml:14: (yaml): expected ',' or ']', but got ':'"]


# ---------------------------------------------------------------- validate checks head ranges from config.json
def test_validate_rejects_a_head_outside_the_fixture_without_importing_torch(tmp_path):
    f = tmp_path / "h.yaml"
    f.write_text(GOOD.replace("head: L0H7", "head: L9H0"))
    code = ("import sys; from harness.cli import main; rc = main(['validate', sys.argv[1]]); "
            "print(rc, [m for m in ('torch', 'transformer_lens') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "2 []", r.stderr
    assert r.stderr.strip() == (f"error: {f}:10: claims[0].head: L9H0 is not in the model: "
                                "the model has layers 0..1 and heads 0..7")


def test_validate_reads_hugging_face_sizes_and_says_nothing_without_a_config(tmp_path, capsys):
    hf = tmp_path / "gpt2-tiny"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                                "n_layer": 2, "n_head": 4, "n_embd": 16}))
    text = GOOD.replace(str(FIXTURE), "gpt2-tiny").replace("heads: [L0H7]", "heads: [L1H3, L2H0]")
    f = tmp_path / "h.yaml"
    f.write_text(text.replace("head: L0H7", "head: L0H3"))
    assert main(["validate", str(f)]) == 2
    assert messages(capsys.readouterr().err) == [
        f"error: {f}:15: claims[1].heads: L2H0 is not in the model: the model has layers 0..1 and heads 0..3"]
    for model in ("hf:gpt2", "no-such-directory"):  # no config.json to read: ranges are checked when it loads
        f.write_text(text.replace("gpt2-tiny", model))
        assert main(["validate", str(f)]) == 0, capsys.readouterr().err


def test_run_checks_ranges_before_the_model_loads(tmp_path, capsys, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(cli, "run", no_load)
    f = tmp_path / "h.yaml"
    f.write_text(GOOD.replace("heads: [L0H7]", "heads: [L0H7, L2H0]"))
    assert main(["run", str(f), "--reports", str(tmp_path / "reports")]) == 2
    assert messages(capsys.readouterr().err) == [
        f"error: {f}:15: claims[1].heads: L2H0 is not in the model: the model has layers 0..1 and heads 0..7"]
    assert not (tmp_path / "reports").exists()


# ---------------------------------------------------------------- prefixes and --version
def test_version():
    from importlib import metadata

    r = subprocess.run([sys.executable, "-m", "harness", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout == f"harness {metadata.version('harness')}\n"


@pytest.mark.parametrize("error,expected,code", [
    (SpecError(["a.yaml:1: x: bad", "a.yaml:2: y: worse"]), ["error: a.yaml:1: x: bad", "error: a.yaml:2: y: worse"],
     ExitCode.INPUT),
    (SanityCheckError("a hook never fired"), ["sanity check failed: a hook never fired"], ExitCode.SANITY),
    (HarnessError("something else"), ["error: something else"], ExitCode.SANITY),
])
def test_one_prefix_for_every_error(monkeypatch, capsys, error, expected, code):
    def fail(args):
        raise error

    monkeypatch.setattr(cli, "cmd_validate", fail)
    assert main(["validate", "x.yaml"]) == code
    assert capsys.readouterr().err.splitlines() == expected


def test_validate_prefixes_every_problem(tmp_path, capsys):
    f = tmp_path / "h.yaml"
    f.write_text(GOOD.replace("head: L0H7", "head: LOH7").replace("n_prompts: 20", "n_prompts: 1"))
    assert main(["validate", str(f)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"error: {f}:") for line in lines), lines


# ---------------------------------------------------------------- the Python API names the claim
def test_a_dict_source_names_the_claim_not_a_line(tmp_path):
    doc = yaml.safe_load(GOOD)
    doc["claims"][1]["heads"] = ["LOH7"]
    doc["claims"][0]["at_leest"] = 0.5
    doc["data"]["n_prompts"] = 1
    with pytest.raises(SpecError) as exc:
        loading.load(doc)
    assert sorted(exc.value.problems) == [
        "claims[0] (id: prev-token): at_leest: unknown key; allowed keys: id, kind, head, role, at_least, at_most, "
        "description (did you mean at_least?)",
        "claims[1] (id: knockout): heads: 'LOH7' is not a head or an MLP; expected a head L<layer>H<head> or an MLP "
        "L<layer>.mlp, e.g. L1H6 or L1.mlp (did you mean L0H7?)",
        "data.n_prompts: Input should be greater than or equal to 2",
    ]
    h = loading.load(yaml.safe_load(GOOD))
    assert h.where("claims[1].heads") == "claims[1] (id: knockout): heads"
    assert h.where_claim(1, "heads") == "claims[1] (id: knockout): heads:"
    assert h.where("data.seed") == "data.seed"
    f = tmp_path / "h.yaml"
    f.write_text(GOOD)
    assert loading.load(f).where_claim(1, "heads") == f"{f}:15: claims[1].heads: (knockout)"


def test_a_dict_that_is_not_plain_data_is_a_spec_error():
    doc = yaml.safe_load(GOOD)
    doc["description"] = object()
    with pytest.raises(SpecError, match=r"^\(top level\): the hypothesis holds a value that is not plain data"):
        loading.load(doc)


# ---------------------------------------------------------------- scan: report refuses scan.json; starter paths
@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    from harness.tools.scan import scan

    out = tmp_path_factory.mktemp("scan") / "deep" / "s"
    scan(str(FIXTURE), out, n_prompts=20, segment_length=6, draws=99, bootstrap=100, device="cpu")
    return out


def test_report_refuses_a_scan_file_in_one_line(scanned, capsys):
    before = sorted(p.name for p in scanned.iterdir())
    assert main(["report", str(scanned / "scan.json")]) == 2
    assert capsys.readouterr().err == (f"error: {scanned / 'scan.json'} is a scan file (scan.json); scan results are "
                                       "not re-rendered: run `harness scan` again\n")
    assert sorted(p.name for p in scanned.iterdir()) == before


def test_starter_model_path_is_the_shorter_of_relative_and_absolute(scanned, tmp_path, monkeypatch):
    from harness.tools.scan import starter_model

    written = yaml.safe_load((scanned / "starter.yaml").read_text())["model"]
    rel = os.path.relpath(FIXTURE, scanned.resolve())
    assert written == min(rel, str(FIXTURE), key=len)  # the scan folder sits under /tmp: the absolute path wins
    monkeypatch.chdir(tmp_path)  # resolved against the file's folder, not the working directory
    h = loading.load(scanned / "starter.yaml", check_model=True)
    assert h.resolve(h.spec.model).resolve() == FIXTURE
    assert starter_model("hf:gpt2", scanned) == "hf:gpt2"
    near = FIXTURE.parent / "scan-here"  # beside the model: the relative path is shorter
    assert starter_model(str(FIXTURE), near) == "../induction-2l"


def test_names_outside_the_loaded_model_name_the_claim(fixture_model, tmp_path):
    """The check against the loaded model (hf: models, the Python API): `(id)` after a file's
    field, the id in the field for a dict."""
    import harness

    doc = yaml.safe_load(GOOD.replace("heads: [L0H7]", "heads: [L0H7, L2H0]"))
    with pytest.raises(SpecError) as exc:
        harness.run(doc, device="cpu")
    assert exc.value.problems == ["claims[1] (id: knockout): heads: L2H0 is not in the model: the model has "
                                  "layers 0..1 and heads 0..7"]
    f = tmp_path / "h.yaml"
    f.write_text(GOOD.replace("heads: [L0H7]", "heads: [L0H7, L2H0]"))
    with pytest.raises(SpecError) as exc:
        harness.run(f, device="cpu")
    assert exc.value.problems == [f"{f}:15: claims[1].heads: (knockout) L2H0 is not in the model: the model has "
                                  "layers 0..1 and heads 0..7"]
