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


@pytest.mark.slow
def test_scan_of_some_layers_is_those_edges_of_the_whole_scan(tmp_path, capsys):
    """`--layers 1-1` on the two-layer fixture scans the edges with both ends in block 1 (the logits
    count as the last block, the embedding as block 0): exactly those of the whole scan, each with the
    whole scan's effect and interval (its seeds are keyed by the edge, not by its place in the list);
    the BH family is the edges scanned.  A range past the model's blocks is one line, exit 2."""
    from harness.spec import names
    from harness.tools.scan import in_blocks

    settings = {"n_prompts": 20, "segment_length": 8, "draws": 99, "bootstrap": 200}
    whole, _ = scan(str(FIXTURE), tmp_path / "all", **settings)
    some, _ = scan(str(FIXTURE), tmp_path / "one", layers=(1, 1), **settings)
    wanted = {r["edge"] for r in whole if in_blocks(names.parse_edge(r["edge"]), 1, 1, 2)}
    assert {r["edge"] for r in some} == wanted and 0 < len(wanted) < len(whole)
    assert all(not r["edge"].startswith(("embed", "L0")) for r in some)
    assert "L1H5 -> logits" in wanted and "L0H7 -> L1H5.k" not in wanted
    by_edge = {r["edge"]: r for r in whole}
    for r in some:
        w = by_edge[r["edge"]]
        assert r["effect"] == pytest.approx(w["effect"], rel=1e-5, abs=1e-7), r["edge"]
        if r["effect_ci"] is not None:
            assert r["effect_ci"] == pytest.approx(w["effect_ci"], rel=1e-5, abs=1e-7), r["edge"]
    doc = json.loads((tmp_path / "one" / "scan.json").read_text())
    assert doc["layers"] == [1, 1] and len(doc["edges"]) == len(wanted)
    assert sum(n for row in doc["edge_classes"].values() for n in row.values()) == len(wanted)
    assert json.loads((tmp_path / "all" / "scan.json").read_text())["layers"] is None
    assert main(["scan", str(FIXTURE), "--layers", "1-2", "--out", str(tmp_path / "x")]) == 2
    assert "--layers 1-2: the model's blocks are 0-1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
