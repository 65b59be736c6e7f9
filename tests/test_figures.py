"""What the report's figures and verdict table show a newcomer: no overlapping or
clipped text, figures no wider than the page shows them, the PASS regions, legends,
undefined values and use statuses drawn, one p-value format, a reason per verdict."""

import dataclasses
import re

import numpy as np
import pytest

from harness.claims.circuit import random_comparison
from harness.evidence.details import PassRegion
from harness.evidence.format import fmt_p
from harness.evidence.verdicts import Verdict
from harness.report import attention_figure, figures
from harness.report.markdown import claim_table, render_markdown


@pytest.fixture(scope="module")
def drawn(demo_evidence):
    out = {**figures.draw_all(demo_evidence), "attention.png": attention_figure.draw_attention(
        demo_evidence.figures_data["attention"])}
    yield out
    for fig in out.values():
        figures.pyplot().close(fig)


def texts(fig) -> list[str]:
    return [t.get_text() for t in figures._drawn_texts(fig)]


def test_every_demo_figure_has_clear_text_at_page_width(drawn):
    """No text overlaps another or leaves the figure; each figure fits the HTML page's
    width (so it is shown at its own size) and its smallest text is at least 8 px."""
    assert set(drawn) == {"attention.png", "composition.png", "effects.png", "signature.png"}
    for name, fig in drawn.items():
        assert figures.text_problems(fig) == [], name
        assert fig.get_size_inches()[0] * figures.DPI <= figures.HTML_WIDTH + 0.5, name
        assert figures.smallest_font_px(fig) >= 8.0, name


def test_text_check_can_fail():
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.text(0.5, 0.5, "first label")
    ax.text(0.52, 0.5, "second label")
    ax.text(1.6, 0.5, "beyond the edge", transform=ax.transAxes)
    found = figures.text_problems(fig)
    plt.close(fig)
    assert "'first label' overlaps 'second label'" in found
    assert "'beyond the edge' reaches outside the figure" in found


def test_composition_one_scale_axis_titles_and_counts(drawn, demo_evidence):
    fig = drawn["composition.png"]
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 3
    limits = {ax.images[0].get_clim() for ax in panels}
    assert len(limits) == 1 and limits.pop()[0] == 0.0  # one colour scale from 0
    assert all(ax.get_xlabel() == "receiver input (reads)" for ax in panels)
    assert panels[0].get_ylabel() == "sender head (writes)"
    k = demo_evidence.figures_data["composition"]["k"]
    sc, q = np.array(k["scores"], dtype=float), np.array(k["null_q99"], dtype=float)
    ok = np.isfinite(sc) & np.isfinite(q)
    assert f"{int((sc[ok] > q[ok]).sum())} of {int(ok.sum())} above own null q99" in panels[0].get_title()
    assert "claimed edge" in texts(fig)
    assert any(t.startswith("composition score C") for t in texts(fig))


def test_effects_draws_pass_regions_and_legend(drawn, demo_evidence):
    fig = drawn["effects.png"]
    shown = texts(fig)
    for c in demo_evidence.claims:
        if c.evidence != "weights":
            assert c.pass_region is not None
            assert f" {c.pass_region.text} " in shown, c.id
    assert " at least 0.8 " in shown and " within ±0.05 (tolerance) " in shown and " > 0.1 (min_effect) " in shown
    for legend in ("PASS: estimate, CI", "INCONCLUSIVE: estimate, CI", "per prompt",
                   "PASS region (the CI must lie in it)"):
        assert legend in shown
    units = [ax.get_xlabel() for ax in fig.axes]
    assert units == ["attention", "fraction of gap", "faithfulness"]


def test_effects_one_claim_and_undefined_values(demo_evidence):
    """A single claim's per-prompt dots sit inside its row; a claim with an undefined value
    is drawn as a row that says why, not left out."""
    one = dataclasses.replace(demo_evidence, claims=[demo_evidence.claim("prev-token-feeds-induction-keys")])
    fig = figures.draw_effects(one.claims)
    ax = fig.axes[0]
    y_lo, y_hi = sorted(ax.get_ylim())
    from matplotlib.collections import PathCollection

    dots = next(c for c in ax.collections if isinstance(c, PathCollection)).get_offsets()
    assert len(dots) == 200 and y_lo < dots[:, 1].min() and dots[:, 1].max() < y_hi
    assert not any("off axis" in t for t in texts(fig))
    figures.pyplot().close(fig)

    undefined = dataclasses.replace(demo_evidence.claim("prev-token-not-via-values"), value=None, ci=None,
                                    per_prompt=None, verdict=Verdict.INCONCLUSIVE,
                                    reason="normalized effect undefined: mean gap below min_gap")
    fig = figures.draw_effects([demo_evidence.claim("prev-token-head-needed"), undefined])
    shown = texts(fig)
    assert "undefined: normalized effect undefined: mean gap below min_gap" in shown
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["prev-token-head-needed",
                                                                      "prev-token-not-via-values"]
    assert figures.text_problems(fig) == []
    figures.pyplot().close(fig)


def test_signature_legend_lines_and_labels(drawn, demo_evidence):
    fig = drawn["signature.png"]
    ax = fig.axes[0]
    shown = texts(fig)
    assert not any(len(set(line.get_xdata())) == 1 and len(line.get_xdata()) == 2 for line in ax.lines)  # no vertical
    assert " min_effect 0.1" in shown and " ±tolerance 0.05" in shown
    pts = demo_evidence.figures_data["signature"]["points"]
    for p in pts:
        assert p["use"] in figures.USE_STYLE
    for use in {p["use"] for p in pts}:
        assert figures.USE_STYLE[use][1] in shown
    assert "composes (p_adj < 0.01)" in shown and "does not compose" in shown and "claimed edge (ring)" in shown
    claimed = [p["edge"] for p in pts if p["claimed"]]
    assert claimed and all(e in shown for e in claimed)  # every claimed edge labelled (inside: text_problems)
    frame = ax.get_window_extent()
    for t in ax.texts:
        if t.get_text() in claimed:
            box = t.get_window_extent()
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1, t.get_text()


def test_signature_undetermined_is_not_drawn_as_unused(demo_evidence):
    """A point's colour is its use status, so an undetermined edge is never shown as unused."""
    pts = [dict(p) for p in demo_evidence.figures_data["signature"]["points"] if p["effect"] is not None]
    pts[0].update(effect=0.07, effect_ci=[0.03, 0.11], use="undetermined", claimed=True)
    data = dict(demo_evidence.figures_data["signature"], points=pts)
    fig = figures.draw_signature(data)
    from matplotlib.colors import to_hex

    colours = {to_hex(line.get_color()) for line in fig.axes[0].lines
               if line.get_marker() == "o" and line.get_markersize() == 5}
    assert figures.USE_STYLE["undetermined"][0] in colours
    assert "undetermined" in texts(fig)
    figures.pyplot().close(fig)
    # documents before version 4 have no `use`: it is read from the CI against the bands
    assert figures.use_of({"effect_ci": [0.03, 0.11]}, 0.1, 0.05) == "undetermined"
    assert figures.use_of({"effect_ci": [0.12, 0.2]}, 0.1, 0.05) == "used"
    assert figures.use_of({"effect_ci": [-0.01, 0.02]}, 0.1, 0.05) == "unused"


def test_one_p_value_format(demo_evidence):
    """The same p-value reads the same everywhere (9.999e-05 is `0.0001`)."""
    assert fmt_p(9.999000099990002e-05) == "0.0001" and fmt_p(1.6e-19) == "1.6e-19" and fmt_p(1.0) == "1"
    md = render_markdown(demo_evidence)
    assert "9.999e-05" not in md and "sign-flip p = 0.0001" in md
    printed = re.findall(r"(?:p =|p_adj|BH-adjusted|, p) ([0-9][0-9.e+-]*[0-9])", md)
    assert len(printed) > 10
    assert all(fmt_p(float(x)) == x for x in printed), printed


def test_rank_text(demo_evidence):
    md = render_markdown(demo_evidence)
    assert "rank(X) = 16 (X: the sender's OV), rank(Y) = 16 (Y: the receiver's QK)" in md
    assert "ranks 16 / 16" not in md


def test_verdict_table_links_reasons_and_unbroken_values(demo_evidence):
    md = render_markdown(demo_evidence)
    table = md[md.index("## Verdicts"):md.index("## Evidence ladder")]
    assert [c.strip() for c in table.splitlines()[2].strip().strip("|").split("|")][-1] == "reason"
    for i, c in enumerate(demo_evidence.claims):
        assert f"[{c.id}](#claim-{i + 1})" in table
        assert f'#### <a id="claim-{i + 1}"></a>{c.id} — {c.verdict}' in md
    assert "0.205\u00a0[0.199,\u00a00.210]" in table
    assert "used: CI [0.199, 0.210] above 0.1, p_adj 0.000133 < 0.05" in table


def test_terminal_table_says_why_not_pass(demo_evidence):
    assert "why not PASS" not in claim_table(demo_evidence)  # every demo claim passes
    held = dataclasses.replace(demo_evidence.claim("induction-circuit"), verdict=Verdict.INCONCLUSIVE,
                               reason="faithfulness CI [0.6, 0.62] lies at or above 0.25, but it beats 53/100 random")
    ev = dataclasses.replace(demo_evidence, claims=[demo_evidence.claim("prev-token-L0H7"), held])
    out = claim_table(ev)
    assert out.splitlines()[-2] == "why not PASS:"
    assert out.splitlines()[-1] == ("  induction-circuit: INCONCLUSIVE: faithfulness CI [0.6, 0.62] lies at or "
                                    "above 0.25, but it beats 53/100 random")
    assert "reason" not in out.splitlines()[0]  # the terminal table keeps five columns


def test_circuit_reason_names_what_held_it_back():
    """A faithful circuit whose sequential test stays undecided is INCONCLUSIVE, and says so; one
    the test decides against FAILs; one it decides for PASSes, saying after how many draws."""
    from harness.stats import BeatTest

    def test(k, n, decision, p):
        return BeatTest(k, n, 100, 0.5, 0.05, decision, p, (8, 16, 32, 64, 100)[:4 if n == 64 else 5])

    verdict, rule, reason = random_comparison(Verdict.PASS, "CI [0.590, 0.628] lies at or above 0.25",
                                              test(53, 100, "undecided", 0.31))
    assert verdict == Verdict.INCONCLUSIVE
    assert reason == ("faithfulness CI [0.590, 0.628] lies at or above 0.25, but it beats 53/100 random circuits "
                      "(sequential test undecided after 100 of at most 100 draws, p 0.31 at alpha 0.05): not clearly "
                      "more than the rate 0.5")
    assert "beats 53/100 random circuits (sequential test undecided" in rule
    verdict, _, reason = random_comparison(Verdict.PASS, "CI ok", test(20, 64, "not more", 1.0))
    assert verdict == Verdict.FAIL and reason.startswith("beats only 20/64 random circuits")
    decided = BeatTest(8, 8, 100, 0.5, 0.05, "more", 0.0176, (8,))
    verdict, _, reason = random_comparison(Verdict.PASS, "CI ok", decided)
    assert verdict == Verdict.PASS
    assert "decided after 8 of at most 100 draws: more than the rate 0.5, p 0.0176" in reason


def test_pass_regions_in_evidence(demo_evidence):
    regions = {c.id: c.pass_region for c in demo_evidence.claims}
    assert regions["prev-token-L0H7"] == PassRegion(low=0.8, high=None, text="at least 0.8")
    assert regions["one-induction-head-is-redundant"] == PassRegion(low=None, high=0.3, text="at most 0.3")
    assert regions["prev-token-feeds-induction-keys"] == PassRegion(low=0.1, high=None, text="> 0.1 (min_effect)")
    assert regions["prev-token-not-via-queries"] == PassRegion(low=-0.05, high=0.05, text="within ±0.05 (tolerance)")
    assert regions["K-comp-L0H7-L1H5"] is None
    doc = demo_evidence.to_dict()
    assert doc["schema_version"] == 8
    assert doc["claims"][0]["pass_region"] == {"low": 0.8, "high": None, "text": "at least 0.8"}
    assert re.match(r"^CI \[", doc["claims"][0]["reason"] or doc["claims"][0]["rule"])


def test_composition_of_a_30_layer_model_reads_clearly():
    """At SmolLM2's size (30 layers x 9 heads: 261 x 261 cells a panel) the per-layer labels are
    thinned so that none overlaps (every layer on the senders' axis, every 4th on the receivers')."""
    rng = np.random.default_rng(0)
    senders = [f"L{la}H{h}" for la in range(29) for h in range(9)]
    receivers = [f"L{la}H{h}" for la in range(1, 30) for h in range(9)]
    scores = rng.random((len(senders), len(receivers))).tolist()
    data = {m: {"scores": scores, "null_q99": scores, "senders": senders, "receivers": receivers} for m in "kqv"}
    fig = figures.draw_composition(data, {"L16H0 -> L18H6.k"})
    try:
        assert figures.text_problems(fig) == []
        panel = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"][0]
        assert [t.get_text() for t in panel.get_yticklabels()] == [f"L{la}" for la in range(29)]
        assert [t.get_text() for t in panel.get_xticklabels()] == [f"L{la}" for la in range(1, 30, 4)]
    finally:
        figures.pyplot().close(fig)
