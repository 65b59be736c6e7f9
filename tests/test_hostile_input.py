"""Hostile and broken input to hypothesis files, prompt files and the command
line: every case is exit 2 with one line naming the file (and line), no
traceback, nothing written, in bounded time.  One test per group of problems;
the reproducers are the ones found by trying the tool as an attacker would.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.data import dataset as data
from harness.data.settings import MAX_PROMPTS
from harness.errors import DataError
from harness.hypothesis.loading import MAX_FILE_BYTES

from .conftest import FIXTURE, HYPOTHESES

BASE = {"harness": 1, "name": "hostile", "model": str(FIXTURE),
        "data": {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 8},
        "claims": [{"id": "knockout", "kind": "ablation", "heads": ["L0H7"], "ablation": "zero",
                    "at_least": 0.5}]}


def write_yaml(tmp_path: Path, doc: dict, name: str = "h.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def with_(**over) -> dict:
    return json.loads(json.dumps(BASE)) | over


def one_error(capsys, argv: list[str], *needles: str) -> str:
    """Run the CLI in-process: exit 2, and stderr holds every needle and no traceback."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


def prompt_rows(n: int = 6, seg: int = 6) -> list[dict]:
    """Distinct, valid prompt-file rows (repeated tokens, first half corrupted)."""
    ds = data.repeated_tokens(n, seg, 128, seed=3)
    return [{"clean": ds.clean[i].tolist(), "corrupted": ds.corrupted[i].tolist(),
             "positions": ds.positions[i].tolist()} for i in range(n)]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


# ------------------------------------------------------------------ group 7: duplicated prompts
def test_duplicate_prompts_are_dropped_with_a_warning_or_refused(tmp_path, capsys):
    rows = prompt_rows(6)
    same = write_jsonl(tmp_path / "same.jsonl", [rows[0]] * 20)
    with pytest.raises(DataError, match=r"same.jsonl: only 1 distinct prompt\(s\) among 20"):
        data.load_jsonl(same, 128)
    twice = write_jsonl(tmp_path / "twice.jsonl", rows + [rows[1], rows[4]])
    ds = data.load_jsonl(twice, 128)
    assert ds.n == 6
    assert len(ds.warnings) == 1
    assert "2 of 8 prompts repeat an earlier prompt" in ds.warnings[0]
    assert "twice.jsonl:7 repeats" in ds.warnings[0] and "twice.jsonl:2" in ds.warnings[0]
    # a prompt that differs only in its corrupted half is a different prompt
    other = dict(rows[0], corrupted=rows[1]["corrupted"])
    assert data.load_jsonl(write_jsonl(tmp_path / "other.jsonl", rows + [other]), 128).n == 7
    # the generator drops its own collisions (a 3-token range, 2-token segments: at most 81 distinct
    # clean/corrupted pairs); what remains is distinct, and every dropped prompt is counted
    gen = data.repeated_tokens(50, 2, 128, vocab_min=1, vocab_max=4)
    pairs = {tuple(gen.clean[i].tolist() + gen.corrupted[i].tolist()) for i in range(gen.n)}
    assert len(pairs) == gen.n < 50
    assert f"{50 - gen.n} of 50 prompts repeat an earlier prompt" in gen.warnings[0]
    # end to end: the warning is on stderr and in evidence.json, and the statistics use distinct prompts
    doc = with_(data={"file": str(twice)})
    code = main(["run", str(write_yaml(tmp_path, doc)), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code in (0, 1) and "warning: data: 2 of 8 prompts repeat" in err
    ev = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert ev["data"]["n_prompts"] == 6 and any("repeat an earlier prompt" in w for w in ev["warnings"])


# ------------------------------------------------------------------ group 8: NaN bounds, spaced names
@pytest.mark.parametrize("claim, needle", [
    ({"at_least": float("nan")}, "claims[0].at_least: Input should be a finite number"),
    ({"at_least": float("inf")}, "claims[0].at_least: Input should be a finite number"),
    ({"heads": ["L0H7", " L0H6", "L0H5 "]}, "' L0H6' has spaces around the name"),
    ({"heads": ["L0H7 "]}, "'L0H7 ' has spaces around the name"),
])
def test_nan_bounds_and_spaced_names_are_rejected(tmp_path, capsys, claim, needle):
    doc = with_()
    doc["claims"][0].update(claim)
    f = write_yaml(tmp_path, doc)
    one_error(capsys, ["validate", f], f"{f}:", needle)


def test_nan_in_stats_and_spaced_edge_are_rejected(tmp_path, capsys):
    f = write_yaml(tmp_path, with_(stats={"min_gap": float("nan")}))
    one_error(capsys, ["validate", f], "stats.min_gap: Input should be a finite number")
    doc = with_(claims=[{"id": "e", "kind": "edge", "edge": " L0H7 -> L1H5.k"}])
    f = write_yaml(tmp_path, doc)
    one_error(capsys, ["validate", f], "has spaces around the edge")


# ------------------------------------------------------------------ group 9: accepted by validate, crashed later
def test_negative_seeds_are_rejected(tmp_path, capsys):
    f = write_yaml(tmp_path, with_(seed=-1))
    one_error(capsys, ["validate", f], f"{f}:", "seed: Input should be greater than or equal to 0")
    doc = with_()
    doc["data"]["seed"] = -5
    f = write_yaml(tmp_path, doc)
    one_error(capsys, ["validate", f], "data.seed: Input should be greater than or equal to 0")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(HYPOTHESES / "induction.yaml"), "--seed", "-1"])
    assert exc.value.code == 2 and "--seed: -1 must be at least 0" in capsys.readouterr().err


def test_bos_token_outside_the_vocabulary_is_a_file_line_error(tmp_path, capsys):
    doc = with_()
    doc["data"]["bos_token"] = 1000
    f = write_yaml(tmp_path, doc)
    out = tmp_path / "r"
    one_error(capsys, ["run", f, "--out", out], f"{f}:", "data.bos_token: token 1000 is outside the model's "
              "vocabulary 0..127")
    assert not out.exists()


def test_prompts_longer_than_the_context_are_refused(tmp_path, capsys):
    long = [{"clean": [0] + [1 + i % 50 for i in range(99)], "corrupted": [0] + [2] * 99, "positions": [5]},
            {"clean": [0] + [3] * 99, "corrupted": [0] + [4] * 99, "positions": [5]}]
    jf = write_jsonl(tmp_path / "long.jsonl", long)
    f = write_yaml(tmp_path, with_(data={"file": str(jf)}))
    one_error(capsys, ["run", f, "--out", tmp_path / "r"], f"{jf}:1: prompts have 100 tokens; the model's "
              "context is 64 tokens")
    assert not (tmp_path / "r").exists()


def test_overlong_names_and_unaddressable_ids_are_rejected(tmp_path, capsys):
    f = write_yaml(tmp_path, with_(name="n" * 300))
    one_error(capsys, ["validate", f], "name: String should have at most 100 characters")
    for bad_id in ("a::b", "a b", "a[1]", "-leading-dash", "a/b"):
        doc = with_()
        doc["claims"][0]["id"] = bad_id
        f = write_yaml(tmp_path, doc)
        one_error(capsys, ["validate", f], "claims[0].id: a claim id is letters, digits", repr(bad_id))


# ------------------------------------------------------------------ group 11: encodings and permissions
def test_non_utf8_and_unreadable_files(tmp_path, capsys):
    f = tmp_path / "latin1.yaml"
    f.write_bytes((yaml.safe_dump(with_(), sort_keys=False) + "description: caf\u00e9\n").encode("latin-1"))
    line = next(i for i, ln in enumerate(f.read_bytes().split(b"\n"), 1) if b"caf" in ln)
    one_error(capsys, ["validate", f], f"{f}:{line}: (file): not UTF-8 text (byte 0xe9")
    rows = prompt_rows(3)
    jf = tmp_path / "p.jsonl"
    jf.write_bytes(b"\n".join(json.dumps(r).encode() for r in rows) + b"\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"p.jsonl:4: not UTF-8 text \(byte 0xff\)"):
        data.load_jsonl(jf, 128)
    if os.geteuid() == 0:  # root reads everything: the permission case cannot be reproduced
        return
    locked = write_yaml(tmp_path, with_(), "locked.yaml")
    locked.chmod(0)
    one_error(capsys, ["validate", locked], f"{locked}: cannot read: Permission denied")


# ------------------------------------------------------------------ group 12: YAML alias bombs, nesting
BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'x'}]\n" for i in range(12))


@pytest.mark.parametrize("text, needle", [
    (BOMB, ":2: (yaml): aliases (*l0) are not supported"),
    ("harness: 1\nname: &n [*n]\n", ":2: (yaml): aliases (*n)"),  # self-reference: PyYAML builds a cycle
    ("harness: 1\nclaims: " + "[" * 200 + "]" * 200 + "\n", ":2: (yaml): nested deeper than 32 levels"),
])
def test_yaml_bombs_and_deep_nesting_are_refused_quickly(tmp_path, capsys, text, needle):
    f = tmp_path / "bomb.yaml"
    f.write_text(text)
    start = time.perf_counter()
    one_error(capsys, ["validate", f], f"{f}{needle}")
    assert time.perf_counter() - start < 2.0


def test_alias_bomb_is_a_collection_error_in_pytest(pytester):
    pytester.makefile(".yaml", bomb="harness: 1\n" + BOMB)
    result = pytester.runpytest_inprocess()
    out = result.stdout.str()
    assert "aliases (*l0) are not supported" in out and "RecursionError" not in out


# ------------------------------------------------------------------ group 13: size limits
def test_size_limits(tmp_path, capsys):
    doc = with_()
    doc["data"]["n_prompts"] = MAX_PROMPTS + 1
    f = write_yaml(tmp_path, doc)
    one_error(capsys, ["validate", f], f"data.n_prompts: Input should be less than or equal to {MAX_PROMPTS}")
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(with_(), sort_keys=False) + "# " + "x" * MAX_FILE_BYTES + "\n")
    start = time.perf_counter()
    one_error(capsys, ["validate", big], f"{big}:1: (file):", f"limited to {MAX_FILE_BYTES:,} bytes")
    assert time.perf_counter() - start < 1.0
    rows = prompt_rows(2, 2)
    many = write_jsonl(tmp_path / "many.jsonl", [dict(rows[0], clean=[0, i % 100 + 1, 1, 2, 1],
                                                      corrupted=[0, 3, 1, 2, 1], positions=[2])
                                                 for i in range(MAX_PROMPTS + 1)])
    with pytest.raises(DataError, match=f"more than {MAX_PROMPTS:,} prompts"):
        data.load_jsonl(many, 128)


# ------------------------------------------------------------------ group 15: roles options
def test_roles_and_scan_options_are_checked_before_loading(capsys):
    for argv, needle in ((["roles", FIXTURE, "--n-prompts", "0"], "--n-prompts: 0 must be between 2 and"),
                         (["scan", FIXTURE, "--n-prompts", "1"], "--n-prompts: 1 must be between 2 and"),
                         (["roles", FIXTURE, "--segment-length", "1"], "--segment-length: 1 must be at least 2")):
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and needle in err and "Traceback" not in err
    one_error(capsys, ["roles", FIXTURE, "--segment-length", "40"],
              "segment length 40 makes prompts of 81 tokens; the model's context is 64 tokens")


# ------------------------------------------------------------------ group 16: pytest plugin
def test_plugin_runs_a_crashing_file_once_and_shows_one_traceback(pytester, tmp_path, monkeypatch):
    import harness.pytest_plugin as plugin

    calls = tmp_path / "calls"

    def crash(*args, **kwargs):
        with open(calls, "a") as f:
            f.write("run\n")
        raise ZeroDivisionError("boom in the run")

    monkeypatch.setattr(plugin, "run", crash)  # pytester runs in this process; undone after the test
    doc = with_(claims=[{"id": f"c{i}", "kind": "ablation", "heads": ["L0H7"], "at_least": 0.5}
                        for i in range(4)])
    pytester.makefile(".yaml", crash=yaml.safe_dump(doc, sort_keys=False))
    result = pytester.runpytest_inprocess("-rN")  # no short summary: its lines depend on the terminal width
    result.assert_outcomes(failed=4)
    out = result.stdout.str()
    assert calls.read_text().count("run") == 1  # the file ran once, not once per item
    assert out.count('raise ZeroDivisionError("boom in the run")') == 1  # one traceback
    assert out.count("failed with ZeroDivisionError: boom in the run (traceback on the first item)") == 3


def test_plugin_refuses_ids_pytest_cannot_address(pytester):
    doc = with_()
    doc["claims"][0]["id"] = "a::b"
    pytester.makefile(".yaml", colons=yaml.safe_dump(doc, sort_keys=False))
    result = pytester.runpytest_inprocess()
    out = result.stdout.str()
    assert "claims[0].id: a claim id is letters, digits" in out and "1 error" in out


# ------------------------------------------------------------------ group 17: JSONL
def test_jsonl_duplicate_keys_line_separators_and_nesting(tmp_path):
    rows = prompt_rows(3)
    dup = '{"clean": [0, 1, 2, 1, 2], "corrupted": [0, 3, 4, 1, 2], "clean": [0, 1, 2, 1, 2], "positions": [3]}'
    f = write_jsonl(tmp_path / "dup.jsonl", rows + [dup])
    with pytest.raises(DataError, match=r"dup.jsonl:4: key\(s\) \['clean'\] given twice"):
        data.load_jsonl(f, 128)
    # U+2028 inside a line is not a line break: the error points at the real line 3
    sep = '{"clean": [0, 1, 2], "corrupted": [0, 1, 2], "positions": [1], "note\u2028": 1}'
    f = write_jsonl(tmp_path / "sep.jsonl", rows[:2] + [sep])
    with pytest.raises(DataError, match=r"sep.jsonl:3: unknown key"):
        data.load_jsonl(f, 128)
    deep = '{"clean": ' + "[" * 100_000 + "]" * 100_000 + "}"
    f = write_jsonl(tmp_path / "deep.jsonl", rows + [deep])
    with pytest.raises(DataError, match=r"deep.jsonl:4: nested too deeply"):
        data.load_jsonl(f, 128)


@pytest.mark.slow
def test_jsonl_errors_through_the_cli_are_one_line(tmp_path):
    rows = prompt_rows(3)
    f = write_jsonl(tmp_path / "dup.jsonl", rows + ['{"clean": [1], "clean": [2]}'])
    h = write_yaml(tmp_path, with_(data={"file": str(f)}))
    r = subprocess.run([sys.executable, "-m", "harness", "run", str(h), "--out", str(tmp_path / "r")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("[")]  # not progress lines
    assert lines == [f"error: {f}:4: key(s) ['clean'] given twice"]
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ the validate contract, fuzzed
SEED_FILES = [HYPOTHESES / "induction.yaml", HYPOTHESES / "induction-false-claims.yaml",
              *sorted((FIXTURE.parent / "constructed" / "validation").glob("*.yaml"))]
ODD = ["", "~", "null", ".nan", "-.inf", "1e309", "-1", "0", "99999999999999999999", "[]", "{}", "[[[[", "&a x",
       "*a", "!!python/object/apply:os.system ['true']", "!!binary aGk=", "L0H7", "L99H99", "' L0H7'",
       "L0H7 -> L1H5.k", "L1H5 -> L0H7.k", "\t", "'\u2028'", '"\\x00"', "<script>alert(1)</script>", "a::b",
       "|", ">-", "%YAML 1.1", "? x", "- - -", "yes", "0x10", "1_000", "2026-12-01", "\ufeff"]
odd_scalar = st.sampled_from(ODD) | st.text(max_size=12) | st.integers().map(str) | st.floats().map(repr)
odd_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | st.sampled_from(ODD),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)
text_edit = st.tuples(st.sampled_from(["replace_value", "delete_line", "duplicate_line", "insert", "truncate",
                                       "indent", "bytes"]), st.integers(0, 10**9), odd_scalar)


def edit_text(text: str, edit: tuple[str, int, str]) -> bytes:
    """One textual mutation of a YAML file (by line or character offset)."""
    what, at, value = edit
    lines = text.split("\n")
    i = at % len(lines)
    if what == "replace_value" and ":" in lines[i]:
        lines[i] = lines[i].split(":", 1)[0] + ": " + value
    elif what == "delete_line":
        del lines[i]
    elif what == "duplicate_line":
        lines.insert(i, lines[i])
    elif what == "insert":
        j = at % (len(text) + 1)
        return (text[:j] + value + text[j:]).encode("utf-8", "surrogatepass")
    elif what == "truncate":
        return text[:at % (len(text) + 1)].encode("utf-8", "surrogatepass")
    elif what == "indent":
        lines[i] = "  " + lines[i]
    elif what == "bytes":
        raw = text.encode("utf-8", "surrogatepass")
        j = at % (len(raw) + 1)
        return raw[:j] + value.encode("utf-8", "surrogatepass")[:4] + b"\xff\xc3" + raw[j:]
    return "\n".join(lines).encode("utf-8", "surrogatepass")


def edit_tree(doc: object, path: list[int], value: object) -> object:
    """Replace (or, for a mapping, add) one value somewhere in the parsed document."""
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    if isinstance(doc, dict):
        keys = list(doc)
        key = keys[path[0] % len(keys)]
        return doc | {key: edit_tree(doc[key], path[1:], value)}
    i = path[0] % len(doc)
    return doc[:i] + [edit_tree(doc[i], path[1:], value)] + doc[i + 1:]


@functools.cache
def validate_warmed() -> None:
    """`validate`'s one-time costs in this process (lazy imports, the schema's compilation, the
    fixture model's config read) paid once, before any call is timed."""
    for seed in SEED_FILES:
        main(["validate", str(seed)])


@settings(max_examples=int(os.environ.get("HARNESS_FUZZ_EXAMPLES", "400")), deadline=None,
          derandomize="HARNESS_FUZZ_EXAMPLES" not in os.environ, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed_file=st.sampled_from(SEED_FILES),
       edits=st.lists(text_edit, min_size=1, max_size=3),
       tree=st.none() | st.tuples(st.lists(st.integers(0, 100), min_size=1, max_size=5), odd_value))
@pytest.mark.slow
def test_validate_contract_under_mutation(tmp_path_factory, seed_file, edits, tree):
    """Mutated valid files (textual edits, or a value replaced in the parsed tree): `validate`
    exits 0 or 2, never raises, and answers within a second."""
    text = seed_file.read_text()
    if tree is not None:
        path, value = tree
        raw = yaml.safe_dump(edit_tree(yaml.safe_load(text), path, value), sort_keys=False).encode()
    else:
        raw = text.encode()
        for e in edits:
            raw = edit_text(raw.decode("utf-8", "surrogateescape"), e)
    f = tmp_path_factory.mktemp("fuzz") / "mutated.yaml"
    f.write_bytes(raw)
    validate_warmed()
    start = time.perf_counter()
    code = main(["validate", str(f)])  # an unexpected exception fails the test (and is shrunk)
    assert code in (0, 2)
    assert time.perf_counter() - start < 1.0


def test_running_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch):
    import harness.cli as cli

    def alloc_fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(cli, "run", alloc_fails)
    out = tmp_path / "r"
    one_error(capsys, ["run", write_yaml(tmp_path, with_()), "--out", out], "error: out of memory:",
              "lower data.n_prompts")
    assert not out.exists()
    monkeypatch.setattr(cli, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # other errors are not disguised
        main(["run", str(write_yaml(tmp_path, with_())), "--out", str(out)])
