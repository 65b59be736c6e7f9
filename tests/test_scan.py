"""harness scan: every edge, ranked; a starter hypothesis that runs."""

import json

import harness
from harness.cli import main
from harness.tools.scan import scan

from .conftest import FIXTURE


def test_scan_fixture(tmp_path):
    rows, table = scan(str(FIXTURE), tmp_path / "s", n_prompts=40, segment_length=10, draws=200,
                       bootstrap=200)
    assert len(rows) == 257 and {p.name for p in (tmp_path / "s").iterdir()} == {"scan.json", "signature.png",
                                                                                 "starter.yaml"}
    by_edge = {r["edge"]: r for r in rows}
    assert by_edge["L0H7 -> L1H5.k"]["class"] == "route used"
    assert by_edge["L0H3 -> L1H5.k"]["class"].startswith("route present")  # composes, not used
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
