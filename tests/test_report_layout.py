"""The HTML report fits its page (issue 26): in headless Chromium at 1200 px and 800 px
windows no element is wider than the content column or overflows its own box (a table too
wide scrolls inside its own box, `div.table-box`), every column of the evidence ladder is
visible at 1200 px without scrolling, the verdict table's reason column is readable, and
figures are shown at their own size at 1200 px (at most 1060 px wide) and within the column
at 800 px.  Run on the demo, names and rotary reports."""

import html
import json
import os
import re
import shutil
import subprocess

import pytest

import harness
from harness.report.html import BOX  # the class of the page's designated horizontal scroll boxes

from .conftest import HYPOTHESES

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

WIDTHS = (1200, 800)
REPORTS = ("demo", "names", "rotary")

# Records, once the page has loaded, what does not fit: elements (outside scroll boxes) whose
# content is wider than their box, and elements whose box leaves the body's content box; and the
# geometry the assertions need (ladder and verdict headers, images, the viewport).
PROBE = """<script>
window.addEventListener('load', () => {
  const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width}; };
  const name = (el) => el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') + ' '
    + JSON.stringify((el.textContent || '').trim().slice(0, 60));
  const body = document.body, cs = getComputedStyle(body), b = body.getBoundingClientRect();
  const left = b.left + parseFloat(cs.paddingLeft), right = b.right - parseFloat(cs.paddingRight);
  const boxes = [...document.getElementsByClassName('BOX')];
  const inside = (el) => boxes.some((s) => s !== el && s.contains(el));
  const overflowing = [], outside = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) overflowing.push('html (the page scrolls sideways)');
  for (const el of [body, ...body.querySelectorAll('*')]) {
    if (inside(el)) continue;
    if (!boxes.includes(el) && el.scrollWidth > el.clientWidth + 1)
      overflowing.push(name(el) + ' ' + el.scrollWidth + ' > ' + el.clientWidth);
    const r = el.getBoundingClientRect();
    if (el !== body && (r.width || r.height) && (r.left < left - 1 || r.right > right + 1))
      outside.push(name(el) + ' [' + r.left + ', ' + r.right + '] not in [' + left + ', ' + right + ']');
  }
  const table = (first) => {
    const t = [...document.querySelectorAll('table')].find((t) => {
      const th = t.querySelector('th'); return th && th.textContent.trim() === first; });
    if (!t) return null;
    const s = boxes.find((s) => s.contains(t));
    return {headers: [...t.querySelectorAll('th')].map((th) => ({text: th.textContent.trim(), ...box(th)})),
            scroll: s ? {...box(s), scrollWidth: s.scrollWidth, clientWidth: s.clientWidth} : null};
  };
  const out = {viewport: root.clientWidth, content: [left, right], overflowing, outside,
               font: parseFloat(getComputedStyle(document.querySelector('td') || body).fontSize),  // a cell's
               ladder: table('mechanism'), verdicts: table('claim'),
               images: [...document.images].map((i) => ({natural: i.naturalWidth, shown: i.width,
                                                          complete: i.complete}))};
  body.setAttribute('data-layout', JSON.stringify(out));
});
</script></body>""".replace("'BOX'", f"'{BOX}'")


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return exe


def flags(profile) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--virtual-time-budget=5000"]


def measure(page: str, width: int, tmp_path) -> dict:
    """The probe's record of `page` (its CSP removed so the probe runs) at a `width` px window."""
    probe = tmp_path / f"probe-{width}.html"
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
                     .replace("</body>", PROBE))
    dom = subprocess.run([chromium(), *flags(tmp_path / "profile"), f"--window-size={width},2000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'data-layout="([^"]*)"', dom)
    assert found, dom[:500]
    return json.loads(html.unescape(found.group(1)))


@pytest.fixture(scope="module")
def pages(tmp_path_factory, request):
    """{name: report.html} of the demo, names and rotary reports, freshly written (no run
    without a browser to look at them)."""
    chromium()
    root = tmp_path_factory.mktemp("layout")
    runs = {"demo": request.getfixturevalue("demo_evidence"),
            **{name: harness.run(HYPOTHESES / f"{name}.yaml", device="cpu") for name in ("names", "rotary")}}
    return {name: (harness.write_report(ev, out_dir=root / name) / "report.html").read_text()
            for name, ev in runs.items()}


@pytest.fixture(scope="module")
def layouts(pages, tmp_path_factory):
    """{(report, window width): the probe's record}."""
    out = {}
    for name, page in pages.items():
        for width in WIDTHS:
            out[name, width] = measure(page, width, tmp_path_factory.mktemp(f"{name}-{width}"))
    return out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("report", REPORTS)
def test_nothing_is_wider_than_the_page(layouts, report, width):
    """No element outside a scroll box overflows its own box, and no element's box (the
    scroll boxes' included) leaves the body's content column."""
    layout = layouts[report, width]
    assert layout["overflowing"] == [] and layout["outside"] == [], layout
    assert layout["content"][1] <= layout["viewport"]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("report", REPORTS)
def test_ladder_columns_are_visible(layouts, report, width):
    """At 1200 px every ladder column header lies inside the viewport with no scrolling at
    all; at 800 px each lies inside the viewport or inside the ladder's scroll box, reached
    by scrolling that box (the box itself fits the page: the test above)."""
    layout = layouts[report, width]
    ladder = layout["ladder"]
    criteria = report in ("demo", "names")  # their circuit claims state criteria: one more column
    assert ladder is not None and len(ladder["headers"]) == 9 + criteria, ladder
    heads = ladder["headers"]
    if width == 1200 or all(h["right"] <= layout["viewport"] for h in heads):
        assert all(0 <= h["left"] and h["right"] <= layout["viewport"] for h in heads), heads
        assert ladder["scroll"] is None or ladder["scroll"]["scrollWidth"] <= ladder["scroll"]["clientWidth"] + 1
    else:
        s = ladder["scroll"]
        assert s is not None, ladder
        assert all(s["left"] - 1 <= h["left"] and h["right"] <= s["left"] + s["scrollWidth"] + 1 for h in heads), (
            s, heads)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("report", REPORTS)
def test_verdict_reasons_are_readable(layouts, report, width):
    """The reason column is at least 16 em wide at 1200 px and 10 em at 800 px (some 30 and
    20 characters a line, not one word), and the verdict table shows every column without
    scrolling at 1200 px."""
    layout = layouts[report, width]
    verdicts = layout["verdicts"]
    reason = verdicts["headers"][-1]
    least = 16 if width == 1200 else 10
    assert reason["text"] == "reason" and reason["width"] >= least * layout["font"], (reason, layout["font"])
    if width == 1200:
        assert all(h["right"] <= layout["viewport"] for h in verdicts["headers"]), verdicts
        assert verdicts["scroll"] is None or verdicts["scroll"]["scrollWidth"] <= verdicts["scroll"]["clientWidth"] + 1


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("report", REPORTS)
def test_figures_fit(layouts, report, width):
    """Figures are drawn at most 1060 px wide; at 1200 px each is shown at its own size, at
    800 px within the column."""
    layout = layouts[report, width]
    images = layout["images"]
    assert images and all(i["complete"] and 300 < i["natural"] <= 1060 for i in images), images
    column = layout["content"][1] - layout["content"][0]
    if width == 1200:
        assert all(i["shown"] == i["natural"] for i in images), images
    else:
        assert all(i["shown"] <= column for i in images), (images, column)


def test_fit_and_sanitiser():
    """Without a browser: each table sits in a scroll box classed by its kind, a `+` between
    two names gets a line-break opportunity in text only (never in an attribute), the ladder's
    steps go one a line, and the sanitiser keeps exactly the new elements and classes."""
    from harness.report.html import render_html, sanitise

    md = ("![a+b](figures/x.png)\n\n"
          "| claim | kind | expectation | verdict | value [CI] | reason |\n|---|---|---|---|---|---|\n"
          "| c | ablation | L0H0+L0H1: effect >= 0.5 | PASS | 1 | why |\n\n"
          "| mechanism | weights | highest | contradictions |\n|---|---|---|---|\n"
          "| circuit L0H3+L0H4 | ✓ a-b ✗ (weights vs use) ? c | weights | none |\n\n"
          "| x | y |\n|---|---|\n| a + b | MARK+1 |\n")
    page = render_html(md, {"x.png": b"\x89PNG"}, "t", marks={"MARK+1": "FAIL"})
    body = page.split("<body>")[1]
    assert body.count(f'<div class="{BOX}') == 3
    assert f'<div class="{BOX} verdicts">' in body and f'<div class="{BOX} ladder">' in body
    assert "L0H0+<wbr>L0H1" in body and "circuit L0H3+<wbr>L0H4" in body and 'alt="a+b"' in body
    assert "a + b" in body and '<td class="v-FAIL">MARK+<wbr>1</td>' in body
    assert "<td>✓&nbsp;a-b<br>✗&nbsp;(weights vs use)<br>?&nbsp;c</td>" in body
    assert sanitise('<div class="table-box ladder other" style="x" id="y">t</div><wbr>') == (
        '<div class="table-box ladder">t</div><wbr>')
    assert "ladder" not in sanitise('<table class="ladder"><tr><td class="ladder">x</td></tr></table>')
