"""The trained rotary fixture (fixtures/induction-rotary: Llama-style, RMSNorm, rotary
positions, 4 query heads on 2 key/value heads, SwiGLU MLPs) through every command: its
hypothesis passes with the committed report's numbers, and `scan`, `sweep`, `weights`,
`roles`, `explain` and the pytest plugin work on it."""

from __future__ import annotations

import json

import pytest
import yaml

import harness
from harness import cli

from .conftest import HYPOTHESES, ROOT
from .test_report import assert_committed

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

ROTARY = ROOT / "fixtures" / "induction-rotary"
REPORT = ROOT / "reports" / "rotary"


@pytest.mark.stored_numbers
def test_committed_rotary_report_is_current(tmp_path):
    """reports/rotary is what `harness run hypotheses/rotary.yaml --out reports/rotary` gives with the
    current code; every claim passes (previous-token head L0H2 read through the induction heads'
    keys, current-token head L0H3 through their queries)."""
    ev = harness.run(HYPOTHESES / "rotary.yaml", device="cpu")
    assert ev.counts() == {"PASS": len(ev.claims), "FAIL": 0, "INCONCLUSIVE": 0}, \
        [(c.id, c.verdict, c.rule) for c in ev.claims if c.verdict != "PASS"]
    arch = ev.model["architecture"]
    assert (arch["name"], arch["positions"], arch["n_key_value_heads"], arch["norm"], arch["gated_mlp"]) == \
        ("LlamaForCausalLM", "rotary", 2, "RMS", True)
    assert all(c.passed for c in ev.sanity_checks if "identity" in c.name)
    weights = {row.mechanism: [s.claim for s in row.rungs.get("weights", [])] for row in ev.ladder}
    # a route with a composition claim has that claim as its weights step, once; a route only an edge claim
    # names has the weights-vs-use row's composition test
    assert weights["L0H2 -> L1H1.k"] == ["K-comp-L0H2-L1H1"] and weights["L0H3 -> L1H1.q"] == ["Q-comp-L0H3-L1H1"]
    assert "(weights vs use)" in sum(weights.values(), [])
    folder = harness.write_report(ev, out_dir=tmp_path / "rotary")
    assert_committed(folder, REPORT)


def small(tmp_path, model=ROTARY, name="small"):
    doc = {"harness": 1, "name": name, "model": str(model),
           "data": {"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 10},
           "stats": {"bootstrap": 500, "permutations": 1000, "null_draws": 200},
           "claims": [{"id": "prev", "kind": "role", "head": "L0H2", "role": "previous_token", "at_least": 0.9},
                      {"id": "k-edge", "kind": "edge", "edge": "L0H2 -> L1H1.k", "expect": "used"}]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_scan_finds_the_key_route(tmp_path):
    from harness.tools.scan import scan

    rows, table = scan(str(ROTARY), tmp_path / "s", n_prompts=40, segment_length=10, draws=200, bootstrap=200)
    by_edge = {r["edge"]: r for r in rows}
    assert by_edge["L0H2 -> L1H1.k"]["use"] == "used" and by_edge["L0H2 -> L1H1.k"]["composes"]
    assert by_edge["L0H2 -> L1H1.q"]["use"] != "used"
    starter = yaml.safe_load((tmp_path / "s" / "starter.yaml").read_text())
    assert any(c.get("edge") == "L0H2 -> L1H1.k" for c in starter["claims"])


def test_sweep_over_a_rotary_and_a_learned_position_model(tmp_path):
    """One file over both fixtures: every job runs, each under its own architecture."""
    hyp = small(tmp_path)
    out = tmp_path / "sweep"
    code = cli.main(["sweep", str(hyp), "--models", str(ROTARY), str(ROOT / "fixtures" / "induction-2l"),
                     "--out", str(out), "--device", "cpu"])
    doc = json.loads((out / "sweep.json").read_text())
    assert code in (0, 1) and [j["status"] for j in doc["jobs"]] == ["ok", "ok"]
    rot = next(j for j in doc["jobs"] if j["model"] == "induction-rotary")
    assert {c["id"]: c["verdict"] for c in rot["claims"]} == {"prev": "PASS", "k-edge": "PASS"}


def test_weights_roles_and_explain(capsys, tmp_path):
    assert cli.main(["weights", str(ROTARY), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Rotary positions: Q- and K-composition are one-sided" in out
    row = next(line for line in out.splitlines() if line.startswith("L0H2 ") and "*" in line)
    assert row  # L0H2 composes significantly with some later head input
    assert cli.main(["roles", str(ROTARY), "--device", "cpu", "--out", str(tmp_path / "roles")]) == 0
    capsys.readouterr()
    heads = {h["head"]: h for h in json.loads((tmp_path / "roles" / "heads.json").read_text())["heads"]}
    assert heads["L0H2"]["previous_token"][0] > 0.9  # its mean (then the interval's ends)
    assert cli.main(["explain", "L0H2 -> L1H1.k", str(ROTARY), "--device", "cpu"]) == 0
    assert "L0H2 -> L1H1.k" in capsys.readouterr().out


def test_pytest_plugin_runs_a_rotary_hypothesis(pytester, tmp_path):
    text = small(tmp_path).read_text()
    pytester.makefile(".yaml", rotary=text)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
