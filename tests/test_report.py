"""Report folders: files, schema validity, re-rendering from JSON, atomic
writes, non-trivial figures, the HTML in headless Chromium, and the committed
demo report staying current."""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import harness
from harness.evidence.document import to_json
from harness.report import writer as report

from . import committed
from .conftest import HYPOTHESES, ROOT

DEMO_REPORT = ROOT / "reports" / "demo"
FIGURES = {"attention.png", "composition.png", "effects.png", "explain.png", "signature.png"}


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory, demo_evidence):
    return demo_evidence, harness.write_report(demo_evidence, out_dir=tmp_path_factory.mktemp("r") / "demo")


@pytest.mark.slow
def test_folder_contents(demo_folder):
    _, folder = demo_folder
    assert {p.name for p in folder.iterdir()} == {"report.md", "report.html", "evidence.json", "figures"}
    assert {p.name for p in (folder / "figures").iterdir()} == FIGURES
    md = (folder / "report.md").read_text()
    order = [md.index(h) for h in ("## Verdicts", "## Evidence ladder", "## Evidence per claim", "## Weights vs use",
                                   "## Settings", "## Provenance", "## Sanity checks")]
    assert order == sorted(order)
    for name in FIGURES:
        assert f"(figures/{name})" in md


def test_demo_evidence_ladder(demo_folder):
    """One row per mechanism the demo names and the highest rung each reached, for the mechanism as
    the file states it: a redundant head and a route present but unused, as the file claims, are
    steps that support it (their claims PASS), not contradictions."""
    ev, folder = demo_folder
    rows = {r.mechanism: r for r in ev.ladder}
    verdict = {c.id: c.verdict for c in ev.claims}
    for row in ev.ladder:  # every claim's step reads its verdict
        for steps in row.rungs.values():
            for s in steps:
                if s.claim in verdict and s.status != "untested":
                    assert s.status == {"PASS": "supports", "FAIL": "against", "INCONCLUSIVE": "inconclusive"}[
                        verdict[s.claim]], (row.mechanism, s)
    assert rows["L0H7"].highest == "robustness"  # role, mean ablation, agreeing across ablation types
    assert [s.claim for s in rows["L0H7"].rungs["robustness"]] == ["prev-token-head-needed"]
    assert rows["L0H7 -> L1H5.k"].highest == "edge necessity" and rows["L0H7 -> L1H5.k"].contradictions == []
    assert "sufficiency" in rows["L0H7 -> L1H5.k"].missing
    decoy = rows["L0H3 -> L1H5.k"]  # beats the null without standing out, and is unused, as the file says
    assert verdict["L0H3-route-unused"] == "PASS"
    assert [s.status for s in decoy.rungs["edge necessity"]] == ["supports"] and decoy.contradictions == []
    assert "weights" in decoy.missing  # composition says nothing either way about a route the file says is unused
    wvu = {(w.edge, w.direction): w for w in ev.weights_vs_use}
    assert wvu[("L0H3 -> L1H5.k", "noising")].composes is False  # the weights-vs-use table still shows the pair
    used = rows["L0H7 -> L1H5.k"]  # a route the file says is used: its composition test is a weights step
    # its composition claim is the step; the weights-vs-use row's test of the same pair is not shown again
    assert [(s.claim, s.status) for s in used.rungs["weights"]] == [("K-comp-L0H7-L1H5", "supports")]
    assert rows["L1H5"].rungs["necessity"][0].claim == "one-induction-head-is-redundant"
    assert rows["L1H5"].rungs["necessity"][0].status == "supports" and rows["L1H5"].contradictions == []
    assert rows["L0H0 -> L1H5.k"].highest == "weights"  # it does not compose, as the file says
    md = (folder / "report.md").read_text()
    ladder = md[md.index("## Evidence ladder"):md.index("## Evidence per claim")]
    assert "| L0H3 -> L1H5.k" in ladder and "✓ L0H3-route-unused" in ladder and "FAILed" in ladder
    assert "Evidence ladder" in (folder / "report.html").read_text()


@pytest.mark.slow
def test_evidence_validates_against_schema(demo_folder, tmp_path):
    _, folder = demo_folder
    assert report.validate_evidence(json.loads((folder / "evidence.json").read_text())) == []
    ev = harness.run(HYPOTHESES / "induction-false-claims.yaml")
    assert report.validate_evidence(json.loads(to_json(ev.to_dict()))) == []
    broken = json.loads((folder / "evidence.json").read_text())
    broken["claims"][0]["verdict"] = "MAYBE"
    del broken["model"]["sha256"]
    problems = report.validate_evidence(broken)
    assert any("claims/0/verdict" in p for p in problems) and any("sha256" in p for p in problems)


@pytest.mark.slow
def test_rerender_round_trip(demo_folder, tmp_path):
    _, folder = demo_folder
    out = report.rerender(folder / "evidence.json", tmp_path / "again")
    for rel in ["report.md", "report.html", "evidence.json"] + [f"figures/{f}" for f in FIGURES]:
        assert (out / rel).read_bytes() == (folder / rel).read_bytes(), rel
    copy = tmp_path / "inplace"
    shutil.copytree(folder, copy)
    (copy / "report.md").write_text("stale")
    (copy / "figures" / "signature.png").unlink()
    report.rerender(copy / "evidence.json")
    assert (copy / "report.md").read_bytes() == (folder / "report.md").read_bytes()
    assert (copy / "figures" / "signature.png").read_bytes() == (folder / "figures" / "signature.png").read_bytes()


@pytest.mark.slow
def test_version_1_documents_are_read(demo_folder, tmp_path):
    """schema_version 1 wrote copying claims as kind `role`: they read back as `copying`,
    and the report re-renders exactly as from the current document, less its evidence ladder (an
    older ladder read a claim's direction, not its verdict, so it is not read)."""
    _, folder = demo_folder
    doc = json.loads((folder / "evidence.json").read_text())
    old = json.loads(json.dumps(doc))
    old["schema_version"] = 1
    copying = [c for c in old["claims"] if c["kind"] == "copying"]
    assert len(copying) == 1
    copying[0]["kind"] = "role"
    assert report.validate_evidence(old) == []
    assert report.load_evidence(old).claim("L1H5-copies").kind == "copying"
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "evidence.json").write_text(json.dumps(old))
    out = report.rerender(tmp_path / "v1" / "evidence.json", tmp_path / "again")
    md = (folder / "report.md").read_text()
    without_ladder = md[:md.index("## Evidence ladder")] + md[md.index("## Evidence per claim"):]
    assert (out / "report.md").read_text() == without_ladder
    bad = json.loads(json.dumps(doc))
    bad["claims"][0]["details"]["n_undefined"] = "many"
    bad["claims"][1]["evidence"] = "causal"
    problems = report.validate_evidence(bad)
    assert any(p.startswith("claims/0/details/n_undefined") for p in problems)
    assert any("claims/1/evidence: a role claim is observational evidence" in p for p in problems)


def test_report_command_errors(tmp_path):
    from harness.cli import main

    assert main(["report", str(tmp_path / "none.json")]) == 2
    bad = tmp_path / "e.json"
    bad.write_text('{"schema_version": 1}')
    assert main(["report", str(bad)]) == 2


def test_interrupted_write_leaves_nothing(demo_folder, tmp_path, monkeypatch):
    ev, _ = demo_folder

    def boom(doc):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "render_files", boom)
    with pytest.raises(KeyboardInterrupt):
        harness.write_report(ev, reports_root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_figures_are_not_trivial(demo_folder):
    import matplotlib.image as mpimg

    _, folder = demo_folder
    for name in FIGURES:
        img = mpimg.imread(folder / "figures" / name)
        assert img.shape[0] > 200 and img.shape[1] > 300, name
        assert float(np.std(img[..., :3])) > 0.05, name  # not a blank canvas


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_html_renders_in_headless_chromium(demo_folder, tmp_path):
    """The self-contained HTML shows every figure: each <img> decodes (naturalWidth > 0)
    and a screenshot of the page is far from blank."""
    exe = chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    _, folder = demo_folder
    html = (folder / "report.html").read_text()
    assert "src=\"figures/" not in html and html.count("data:image/png;base64,") == len(FIGURES)
    script = ("<script>document.body.setAttribute('data-imgs', [...document.images].map(i => i.complete && "
              "i.naturalWidth + 'x' + i.width).join(','));document.body.setAttribute('data-height', "
              "document.documentElement.scrollHeight)</script></body>")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    # the page's Content-Security-Policy stops a script slipped into it from running ...
    injected = tmp_path / "injected.html"
    injected.write_text(html.replace("</body>", script))
    dom = subprocess.run([exe, *flags, "--dump-dom", injected.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert "<body" in dom and 'data-imgs="' not in dom
    # ... so the probe that measures the images removes the policy first
    probe = tmp_path / "probe.html"
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html).replace("</body>", script))
    dom = subprocess.run([exe, *flags, "--window-size=1200,2000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    sizes = [w.split("x") for w in dom.split('data-imgs="')[1].split('"')[0].split(",")]
    assert len(sizes) == len(FIGURES) and all(int(n) > 300 for n, _ in sizes), sizes
    # every figure is shown at its own size (never scaled down, so its text stays as drawn)
    assert all(n == shown for n, shown in sizes), sizes
    height = int(dom.split('data-height="')[1].split('"')[0])
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", f"--window-size=1200,{height + 50}", probe.as_uri()],
                   capture_output=True, timeout=120)
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[0] >= height and float(np.std(img)) > 0.05

    def pixels(hex_colour: str) -> int:
        rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
        return int(np.count_nonzero(np.abs(img - rgb).max(axis=-1) < 2 / 255))

    # the new figure elements are on the page: claimed-edge boxes (composition), the
    # unused band (signature), the use colours of the signature points
    assert pixels("#ff0000") > 200  # red boxes around claimed edges
    assert pixels("#e8eef8") > 10_000  # the ±tolerance band
    assert pixels("#4a6fa5") > 50 and pixels("#2e8b2e") > 50  # unused and used points, PASS markers


def test_committed_comparison_catches_a_real_change():
    """The committed-report comparison (tests/committed.py) passes kernel-sized differences and
    fails a number moved by more than its tolerance, a verdict, a text or an integer changed."""
    doc = committed.comparable(json.loads((DEMO_REPORT / "evidence.json").read_text()))
    scale = committed.metric_scale(doc)
    assert scale == pytest.approx(doc["baseline"]["gap"]["mean"])
    near_zero = next(i for i, c in enumerate(doc["claims"]) if abs(c["value"]) < 1e-3)
    edge = next(i for i, c in enumerate(doc["claims"]) if c["kind"] == "edge")

    def edited(path: tuple, change) -> dict:
        out = json.loads(json.dumps(doc))
        node = out
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = change(node[path[-1]])
        return out

    # within tolerance: a relative change of 1e-5 on a value near zero (the old rule's failure),
    # half a tolerance on a fraction, half a tolerance x gap on a number in nats
    for ok in (edited(("claims", near_zero, "value"), lambda v: v * (1 + 1e-5)),
               edited(("claims", edge, "value"), lambda v: v + 0.5 * committed.TOL),
               edited(("claims", edge, "details", "change_mean"), lambda v: v + 0.5 * committed.TOL * scale),
               edited(("claims", edge, "rule"), lambda r: r.replace("0.205", "0.204"))):
        committed.assert_matches(doc, ok, scale)
    for bad in (edited(("claims", near_zero, "value"), lambda v: v + 2 * committed.TOL),
                edited(("claims", edge, "ci"), lambda ci: [ci[0] - 2 * committed.TOL, ci[1]]),
                edited(("claims", edge, "details", "change_mean"), lambda v: v + 2 * committed.TOL * scale),
                edited(("claims", edge, "verdict"), lambda v: "FAIL"),
                edited(("claims", edge, "reason"), lambda r: r + "!"),
                edited(("claims", edge, "rule"), lambda r: r.replace("0.205", "0.207")),
                edited(("counts", "PASS"), lambda n: n - 1),
                edited(("weights_vs_use", 0, "class"), lambda c: "no route"),
                edited(("ladder", 0, "highest"), lambda h: "observation"),
                edited(("claims", edge, "per_prompt"), lambda p: p[:-1])):
        with pytest.raises(committed.Mismatch):
            committed.assert_matches(doc, bad, scale)
    md = (DEMO_REPORT / "report.md").read_text()
    assert "0.966" in md
    committed.assert_text_matches(md, md.replace("0.966", "0.967", 1), scale)
    for bad_md in (md.replace("15 passed", "14 passed"), md.replace("L0H7 -> L1H5.k", "L0H6 -> L1H5.k"),
                   md.replace("0.966", "0.968", 1)):
        with pytest.raises(committed.Mismatch):
            committed.assert_text_matches(md, bad_md, scale)


def assert_committed(folder_or_doc, committed_dir) -> None:
    """The committed report in `committed_dir` matches a fresh run (tests/committed.py's rule):
    evidence.json field by field, and report.md up to its provenance."""
    old = json.loads((committed_dir / "evidence.json").read_text())
    new = (json.loads((folder_or_doc / "evidence.json").read_text()) if not isinstance(folder_or_doc, dict)
           else folder_or_doc)
    scale = committed.metric_scale(old)
    committed.assert_matches(committed.comparable(old), committed.comparable(new), scale)
    if not isinstance(folder_or_doc, dict):
        committed.assert_text_matches((committed_dir / "report.md").read_text().split("## Provenance")[0],
                                      (folder_or_doc / "report.md").read_text().split("## Provenance")[0], scale,
                                      "report.md")


@pytest.mark.stored_numbers
def test_committed_demo_report_is_current(demo_folder):
    """reports/demo is what `harness run hypotheses/induction.yaml --out reports/demo` gives
    with the current code (regenerate it with that command after a change)."""
    ev, folder = demo_folder
    assert_committed(folder, DEMO_REPORT)
    assert {p.name for p in (DEMO_REPORT / "figures").iterdir()} == FIGURES


@pytest.mark.slow
@pytest.mark.stored_numbers
def test_committed_names_report_is_current(tmp_path):
    """reports/names (the README's second example: text prompts, MLP nodes, a group edge and
    paths on fixtures/names-3l) is what `harness run hypotheses/names.yaml --out reports/names`
    gives with the current code: every claim passes, with the committed numbers, and its report
    shows the prompts as text."""
    ev = harness.run(HYPOTHESES / "names.yaml", device="cpu")
    assert ev.counts() == {"PASS": 23, "FAIL": 0, "INCONCLUSIVE": 0}
    folder = harness.write_report(ev, out_dir=tmp_path / "names")
    assert_committed(folder, ROOT / "reports" / "names")
    md = (ROOT / "reports" / "names" / "report.md").read_text()
    assert "**to**" in md and "When " in md and "L0H0 + L0H3 -> L0.mlp" in md
