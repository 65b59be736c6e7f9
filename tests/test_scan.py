"""harness scan: every edge, ranked; a starter hypothesis that runs."""

import json

import pytest
import yaml

import harness
from harness.cli import main
from harness.tools.scan import scan

from .conftest import FIXTURE


@pytest.mark.slow
def test_scan_fixture(tmp_path):
    rows, table = scan(str(FIXTURE), tmp_path / "s", n_prompts=40, segment_length=10, draws=200,
                       bootstrap=200)
    assert len(rows) == 257 and {p.name for p in (tmp_path / "s").iterdir()} == {"scan.json", "signature.png",
                                                                                 "starter.yaml"}
    by_edge = {r["edge"]: r for r in rows}
    assert by_edge["L0H7 -> L1H5.k"]["class"] == "route used"
    decoy = by_edge["L0H3 -> L1H5.k"]  # beats the rotation null, does not stand out among its peers, not used
    assert decoy["class"] == "no route" and decoy["composition_p"] < 0.01 and decoy["peer_ratio"] < 1.3
    assert by_edge["L0H7 -> L1H5.q"]["use"] == "unused"
    effects = [r["effect"] for r in rows if r["effect"] is not None]
    assert effects == sorted(effects, reverse=True)  # ranked
    assert "L0H7 -> L1H5.k" in table
    doc = json.loads((tmp_path / "s" / "scan.json").read_text())
    assert len(doc["edges"]) == 257
    ev = harness.run(tmp_path / "s" / "starter.yaml")  # held-out split: the routes still hold
    assert any(getattr(c.details, "edge", None) == "L0H7 -> L1H5.k" for c in ev.claims)
    assert all(c.verdict == "PASS" for c in ev.claims), [(c.id, c.verdict) for c in ev.claims]


def test_scan_cli_refuses_existing_folder(tmp_path):
    assert main(["scan", str(FIXTURE), "--out", str(tmp_path)]) == 2
    assert main(["scan", str(FIXTURE), "--draws", "5", "--out", str(tmp_path / "x")]) == 2


@pytest.mark.slow
def test_scan_under_two_corruptions_finds_the_query_route(tmp_path):
    """On the constructed query model, L0H1 -> L1H0.q is untested under first_half (the patch
    changes nothing the queries read) and used under second_half; the starter file claims
    it under second_half, and that claim holds on held-out prompts."""
    from harness.tools import constructed

    model = constructed.save(constructed.build("query"), "query", 0, tmp_path / "query")
    rows, table = scan(str(model), tmp_path / "s", n_prompts=40, segment_length=10, draws=100, bootstrap=200,
                       corruptions=("first_half", "second_half"))
    got = {(r["edge"], r["corruption"]): r for r in rows}
    first, second = got["L0H1 -> L1H0.q", "first_half"], got["L0H1 -> L1H0.q", "second_half"]
    assert first["use"] == "untested" and first["vacuous"] and first["class"].endswith("untested by this intervention")
    assert second["use"] == "used" and second["class"] == "route used"
    assert got["L0H0 -> L1H0.k", "first_half"]["use"] == "used"
    assert "second_half" in table and "untested" in table
    starter = yaml.safe_load((tmp_path / "s" / "starter.yaml").read_text())
    assert starter["data"]["corruptions"] == ["first_half", "second_half"]
    q = next(c for c in starter["claims"] if c["kind"] == "edge" and c["edge"] == "L0H1 -> L1H0.q")
    assert q["corruption"] == "second_half"
    ev = harness.run(tmp_path / "s" / "starter.yaml")
    assert all(c.verdict == "PASS" for c in ev.claims), [(c.id, c.verdict, c.rule) for c in ev.claims]
    doc = json.loads((tmp_path / "s" / "scan.json").read_text())
    assert doc["corruptions"] == ["first_half", "second_half"] and len(doc["edges"]) == len(rows)


@pytest.mark.slow
def test_scan_reads_a_prompt_file_and_its_named_corruptions(tmp_path):
    from harness.data import dataset as data

    ds = data.repeated_tokens(30, 10, 64, seed=9, corruptions=("first_half", "second_half"))
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"clean": c, "corrupted": a, "corrupted_late": b, "positions": p}) + "\n"
                         for c, a, b, p in zip(ds.clean.tolist(), ds.corrupted.tolist(),
                                               ds.corruptions["second_half"].tolist(), ds.positions.tolist(),
                                               strict=True)))
    rows, _ = scan(str(FIXTURE), tmp_path / "s", draws=50, bootstrap=100, data_file=f)
    assert {r["corruption"] for r in rows} == {"default", "late"}
    by = {(r["edge"], r["corruption"]): r for r in rows}
    assert by["L0H7 -> L1H5.k", "default"]["use"] == "used"
    starter = yaml.safe_load((tmp_path / "s" / "starter.yaml").read_text())
    assert starter["data"] == {"file": str(f.resolve())}
    assert main(["scan", str(FIXTURE), "--data", str(f), "--corruption", "early", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
