"""The command line: exit codes, messages, nothing half-written, fast paths."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main

from .conftest import HYPOTHESES, ROOT


def line_of(path, text):
    """1-based line number of the first line containing `text`."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def harness_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


def test_help_and_validate_do_not_import_torch():
    code = ("import sys; from harness.cli import main; rc = main(['validate', sys.argv[1]]); "
            "print(rc, [m for m in ('torch', 'transformer_lens') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, str(HYPOTHESES / "induction.yaml")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("0 []")
    r = harness_cli("--help")
    assert r.returncode == 0 and "validate" in r.stdout and "run" in r.stdout


def test_validate_exit_codes(tmp_path, capsys):
    assert main(["validate", str(HYPOTHESES / "induction.yaml")]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text((HYPOTHESES / "induction.yaml").read_text().replace("head: L0H7", "head: L0H7.q"))
    r = harness_cli("validate", bad)
    assert r.returncode == 2
    assert f"{bad}:{line_of(bad, 'head: L0H7.q')}: claims[0].head: 'L0H7.q' is not a head" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_run_passing_file_writes_report(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["run", str(HYPOTHESES / "induction.yaml"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "prev-token-L0H7" in printed and f"report: {out / 'report.md'}" in printed
    ev = json.loads((out / "evidence.json").read_text())
    assert [c["verdict"] for c in ev["claims"]] == ["PASS"] * 15
    assert {c["evidence"] for c in ev["claims"]} == {"weights", "observational", "causal"}
    assert "# Evidence report: induction" in (out / "report.md").read_text()
    # never overwrite
    assert main(["run", str(HYPOTHESES / "induction.yaml"), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.slow
def test_run_false_claims_exit_1(tmp_path):
    assert main(["run", str(HYPOTHESES / "induction-false-claims.yaml"), "--reports", str(tmp_path)]) == 1
    (folder,) = tmp_path.iterdir()
    verdicts = [c["verdict"] for c in json.loads((folder / "evidence.json").read_text())["claims"]]
    assert verdicts == ["FAIL"] * 6


def test_bad_input_writes_nothing(tmp_path):
    bad = tmp_path / "h.yaml"
    bad.write_text((HYPOTHESES / "induction.yaml").read_text().replace("n_prompts: 200", "n_prompts: x"))
    r = harness_cli("run", bad, HYPOTHESES / "induction.yaml", "--reports", tmp_path / "reports")
    assert r.returncode == 2 and f":{line_of(bad, 'n_prompts: x')}: data.n_prompts:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("change,needle", [
    (("model: ../fixtures/induction-2l", "model: ./no-such-model"), "does not exist"),
    # names are checked against the model's config.json before it loads (validate does the same)
    (("head: L1H5", "head: L1H9"), "error: {h}:{line}: claims[1].head: L1H9 is not in the model: the model has layers 0..1 and heads 0..7"),
    (("heads: [L0H7]", "heads: [L0H7, L2H0]"), "error: {h}:{line}: claims[3].heads: L2H0 is not in the model"),
    (("segment_length: 20", "segment_length: 40"), "{h}:{line}: data.segment_length: prompts of length 81 exceed the model's context 64"),
])
@pytest.mark.slow
def test_model_dependent_errors_exit_2(tmp_path, change, needle):
    text = (HYPOTHESES / "induction.yaml").read_text().replace(*change)
    h = tmp_path / "h.yaml"
    h.write_text(text.replace("../fixtures/induction-2l", str(ROOT / "fixtures" / "induction-2l")))
    r = harness_cli("run", h, "--reports", tmp_path / "reports")
    assert r.returncode == 2, r.stderr
    assert needle.format(h=h, line=line_of(h, change[1])) in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.slow
def test_relative_paths_resolve_against_the_file(tmp_path):
    """A file's `model:` and `data.file` resolve against its own folder, not the working directory."""
    r = harness_cli("validate", Path("hypotheses") / "induction.yaml", cwd=ROOT)
    assert r.returncode == 0
    here, elsewhere = tmp_path / "files", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    (here / "p.jsonl").write_text(prompt_file(tmp_path).read_text())
    model = os.path.relpath(ROOT / "fixtures" / "induction-2l", here)
    (here / "h.yaml").write_text(f"harness: 1\nname: t\nmodel: {model}\ndata: {{file: p.jsonl}}\nclaims:\n"
                                 "  - {id: a, kind: role, head: L0H7, role: previous_token, at_least: 0.99}\n")
    r = harness_cli("run", here / "h.yaml", "--out", "o", cwd=elsewhere)
    assert r.returncode == 1, r.stderr  # the claim FAILs: it ran on the model and prompts the file names
    assert (elsewhere / "o" / "evidence.json").is_file()


def test_weights_command_marks_the_aligned_route(tmp_path, capsys):
    from .conftest import save_native, tiny_config
    from .test_weights import aligned_k_route

    path = save_native(aligned_k_route(), tiny_config(d_model=16, d_head=4, n_heads=4, n_ctx=16,
                                                      d_vocab=20), tmp_path / "aligned")
    assert main(["weights", str(path), "--processing", "raw", "--draws", "999"]) == 0
    out = capsys.readouterr().out
    k_table = out[out.index("K-composition"):out.index("V-composition")]
    l0h0 = next(line for line in k_table.splitlines() if line.startswith("L0H0"))
    assert l0h0.split()[1].endswith("*")  # L0H0 -> L1H0.k is significant
    assert "1 of 16 pairs significant" in k_table
    assert "1 pair(s) with p < alpha extended to 3199" in k_table  # BH over 16 needs > 1600 draws
    assert main(["weights", str(path), "--draws", "5"]) == 2


def prompt_file(tmp_path, extra=None):
    rows = [{"clean": [0, 5 + i, 6, 7, 5 + i, 6, 7], "corrupted": [0, 8, 9, 10, 5 + i, 6, 7], "positions": [4, 5],
             **(extra or {})} for i in range(4)]  # distinct prompts (repeats would be dropped)
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f


def file_hypothesis(tmp_path, data, claim_extra):
    h = tmp_path / "h.yaml"
    h.write_text(f"harness: 1\nname: t\nmodel: {ROOT / 'fixtures' / 'induction-2l'}\ndata: {json.dumps(data)}\n"
                 "claims:\n  - id: a\n    kind: ablation\n    heads: [L0H7]\n    at_least: 0.1\n" + claim_extra)
    return h


@pytest.mark.slow
def test_prompt_file_corruption_names_are_checked_with_the_line(tmp_path):
    data = {"file": str(prompt_file(tmp_path, {"corrupted_swap": [0, 8, 9, 10, 5, 6, 7]}))}
    h = file_hypothesis(tmp_path, data, "    corruption: swapp\n")
    r = harness_cli("run", h, "--reports", tmp_path / "reports")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (f"{h}:{line_of(h, 'corruption: swapp')}: claims[0].corruption: (a) corruption 'swapp' is not one of "
            "the data's: default, swap") in r.stderr
    assert not (tmp_path / "reports").exists()


@pytest.mark.slow
def test_weakened_guards_are_warned_on_stderr(tmp_path):
    h = file_hypothesis(tmp_path, {"file": str(prompt_file(tmp_path))}, "")
    h.write_text(h.read_text().replace("claims:", "stats: {min_gap: 0, bootstrap: 200, permutations: 200}\nclaims:"))
    r = harness_cli("run", h, "--out", tmp_path / "o")
    assert r.returncode in (0, 1), r.stderr
    assert "warning: stats.min_gap 0 is below min_raw_change 0.01" in r.stderr
    doc = json.loads((tmp_path / "o" / "evidence.json").read_text())
    assert any("stats.min_gap 0" in w for w in doc["warnings"])
    assert "stats.min_gap 0 is below" in (tmp_path / "o" / "report.md").read_text()
