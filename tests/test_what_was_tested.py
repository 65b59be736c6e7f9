"""Verdicts that say what they tested, on constructed models with known mechanisms
(harness.tools.constructed): non-vacuity, signed use, the no-information baseline,
the absolute floor on raw changes, structurally zero edges, the weights-vs-use rows
and the evidence ladder."""

import json

import pytest
import torch

import harness
from harness.data import dataset as datasets
from harness.report import markdown
from harness.tools import constructed

STATS = {"bootstrap": 400, "permutations": 2000}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("constructed")
    return {v: constructed.save(constructed.build(v), v, 0, root / v) for v in ("query", "clean", "null")}


def run(model, claims, tmp_path, data=None, stats=None):
    doc = {"harness": 1, "name": "t", "model": str(model),
           "data": data or {"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 10},
           "stats": STATS | (stats or {}), "claims": claims}
    return harness.run(doc, base_dir=tmp_path)


def by_id(ev):
    return {c.id: c for c in ev.claims}


def q_edge(cid, **kw):
    return {"id": cid, "kind": "edge", "edge": "L0H1 -> L1H0.q", "expect": "used", **kw}


def test_query_route_is_untested_by_the_default_corruption_and_used_under_the_second(models, tmp_path):
    """L0H1 copies the current token into what L1H0's queries read.  Replacing the first
    half never changes L0H1's output at the query positions: the patch is the identity
    there, so the verdict is 'untested', never 'unused'.  The second-half corruption
    changes it and shows the route carries the whole gap."""
    first = run(models["query"], [q_edge("q", expect="unused")], tmp_path)
    (c,) = first.claims
    assert c.verdict == "INCONCLUSIVE" and c.details.use == "untested"
    assert c.details.intervention_change.vacuous
    assert c.details.intervention_change.relative_change < 1e-3
    assert "does not change L0H1's output where L1H0.q reads it" in c.rule
    assert "a corruption that changes it there, or replacement: zero" in c.rule
    (row,) = first.weights_vs_use
    assert row.composes and row.classification == "route present, untested by this intervention"
    (ladder,) = [r for r in first.ladder if r.mechanism == "L0H1 -> L1H0.q"]
    assert [s.status for s in ladder.rungs["edge necessity"]] == ["untested"]
    # the file says the route is unused: its composing says nothing either way, so no weights step
    assert ladder.highest is None and "weights" in ladder.missing

    second = run(models["query"], [q_edge("q", corruption="second_half")], tmp_path,
                 data={"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 10,
                       "corruptions": ["second_half"]})
    (c,) = second.claims
    assert c.verdict == "PASS" and c.details.use == "used"
    assert c.ci[0] > 0.8  # most of the gap
    assert c.details.intervention_change.relative_change > 0.5
    assert second.weights_vs_use[0].classification == "route used"


def test_one_row_per_edge_and_direction_with_every_test(models, tmp_path):
    data = {"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 10,
            "corruptions": ["first_half", "second_half"]}
    ev = run(models["query"], [
        q_edge("first", expect="unused"), q_edge("second", corruption="second_half"),
        q_edge("zero", replacement="zero"), q_edge("denoise", direction="denoising", corruption="second_half"),
    ], tmp_path, data=data)
    rows = {(r.edge, r.direction): r for r in ev.weights_vs_use}
    assert set(rows) == {("L0H1 -> L1H0.q", "noising"), ("L0H1 -> L1H0.q", "denoising")}
    noising = rows["L0H1 -> L1H0.q", "noising"]
    assert [(t.claim, t.use) for t in noising.tests] == [("first", "untested"), ("second", "used"),
                                                         ("zero", "used")]
    assert [t.corruption for t in noising.tests] == ["first_half", "second_half", "first_half"]
    assert noising.claim == "second" and noising.classification == "route used"
    assert rows["L0H1 -> L1H0.q", "denoising"].tests[0].claim == "denoise"
    c = by_id(ev)
    assert c["first"].details.weights_vs_use == "route present, untested by this intervention"  # its own test
    assert c["second"].details.weights_vs_use == "route used"
    # the ladder: edge necessity untested under first_half, supported under second_half and zero
    (ladder,) = [r for r in ev.ladder if r.mechanism == "L0H1 -> L1H0.q"]
    statuses = {s.claim: s.status for s in ladder.rungs["edge necessity"]}
    assert statuses == {"first": "untested", "second": "supports", "zero": "supports"}
    table = "\n".join(markdown.weights_vs_use_table(ev.weights_vs_use))
    assert ("first (resample, first_half): untested; second (resample, second_half): used; "
            "zero (zero, first_half): used") in table
    assert sum(line.startswith("| L0H1 -> L1H0.q") for line in table.splitlines()) == 2  # two table rows
    assert table.count("- L0H1 -> L1H0.q: share of C²") == 1  # and what flows, once per edge


def test_opposite_sign_is_its_own_use_class(models, tmp_path):
    """Denoising the previous-token head's key edge alone makes the clean model worse
    than the corrupted run (the keys then match the corrupted earlier copy, which is
    absent): a clear effect against the claim's direction."""
    ev = run(models["clean"], [{"id": "k", "kind": "edge", "edge": "L0H0 -> L1H0.k", "expect": "used",
                                "direction": "denoising"}], tmp_path)
    (c,) = ev.claims
    assert c.details.use == "used (opposite sign)"
    assert c.verdict == "FAIL" and c.ci[1] < -0.1 and c.details.p_adjusted < 0.05
    assert ev.weights_vs_use[0].classification == "route used, against the claim's direction"
    (ladder,) = [r for r in ev.ladder if r.mechanism == "L0H0 -> L1H0.k"]
    assert [s.status for s in ladder.rungs["sufficiency"]] == ["against"]


def reversed_first_half(tmp_path, n=40):
    """Clean [BOS] S S; corrupted [BOS] reverse(S) S: the induction head then confidently
    predicts the wrong next token (the corrupted run is far below a uniform guess)."""
    ds = datasets.repeated_tokens(n, 10, constructed.config(0)["d_vocab"], seed=5)
    f = tmp_path / "reversed.jsonl"
    with f.open("w") as out:
        for clean, pos in zip(ds.clean.tolist(), ds.positions.tolist(), strict=True):
            corrupted = [clean[0], *reversed(clean[1:11]), *clean[11:]]
            out.write(json.dumps({"clean": clean, "corrupted": corrupted, "positions": pos}) + "\n")
    return f


def test_baseline_normalised_knockout_is_complete_where_the_corrupted_scale_says_partial(models, tmp_path):
    """Zero-ablating the induction head removes the behaviour: the metric falls to the
    uniform guess, -log V.  Divided by the clean-corrupted gap that reads as a partial
    effect, because the corrupted run is confidently wrong; against the no-information
    baseline it is ~1."""
    claim = {"kind": "ablation", "heads": ["L1H0"], "ablation": "zero", "at_least": 0.8}
    ev = run(models["clean"], [claim | {"id": "corrupted"}, claim | {"id": "baseline", "normalize": "baseline"}],
             tmp_path, data={"file": str(reversed_first_half(tmp_path))})
    c = by_id(ev)
    v = constructed.config(0)["d_vocab"]
    d = c["corrupted"].details
    assert d.baseline_metric == pytest.approx(-float(torch.log(torch.tensor(float(v)))), abs=1e-6)
    assert d.corrupted_metric_mean < d.baseline_metric - 2  # confidently wrong
    assert d.ablated_metric_mean == pytest.approx(d.baseline_metric, abs=0.05)
    assert d.corrupted_below_baseline and d.knockout_reads_as < 0.6
    assert c["corrupted"].value < 0.6 and c["corrupted"].verdict == "FAIL"
    assert c["baseline"].value == pytest.approx(1.0, abs=0.03) and c["baseline"].verdict == "PASS"
    assert d.baseline_normalized == pytest.approx(c["baseline"].value)
    assert ev.baseline["no_information"] == pytest.approx(d.baseline_metric)


def test_raw_change_floor_stops_a_used_verdict_when_the_metric_barely_moves(tmp_path):
    """The clean model with its unembedding scaled by 1e-4: the mechanism is intact but the
    clean-corrupted gap is ~1e-3 nats.  With the gap guards off, L1H0 -> logits carries
    the whole (tiny) gap with a tight CI and a small p-value; the absolute floor on the
    raw change keeps it from being called used, and switching the floor off is warned."""
    import torch

    b = constructed.build("clean")
    with torch.no_grad():
        b.original_model.head.weight.mul_(1e-4)
    model = constructed.save(b, "clean", 0, tmp_path / "faint")
    claims = [{"id": "e", "kind": "edge", "edge": "L1H0 -> logits", "expect": "used"}]
    guards_off = {"min_gap": 0, "min_prompt_gap": 0}
    ev = run(model, claims, tmp_path, stats=guards_off)
    assert any("stats.min_gap 0 is below" in w for w in ev.warnings)
    assert any("stats.min_prompt_gap 0 is below" in w for w in ev.warnings)
    (c,) = ev.claims
    assert 0 < ev.baseline["gap"]["mean"] < 0.01
    assert c.ci[0] > 0.5 and c.details.p_adjusted < 0.05  # a clear effect on the normalised scale ...
    assert 0 < c.details.change_mean < 0.01  # ... of a metric that moved by almost nothing
    assert c.details.use == "undetermined" and c.verdict == "INCONCLUSIVE", c.rule
    assert "raw change >= 0.01" in c.rule

    floor_off = run(model, claims, tmp_path, stats=guards_off | {"min_raw_change": 0})
    assert floor_off.claims[0].details.use == "used"  # what the floor prevented
    assert "stats.min_raw_change is 0: an edge can be called used with no change in the metric" in floor_off.warnings


def test_structurally_zero_edges_leave_the_bh_family(models, tmp_path):
    """In the clean model L1H0's queries and values read only the token block, which layer
    0 never writes: L0H0 -> L1H0.q and .v change the metric by exactly nothing though the
    corruption changes L0H0's output.  Their p-value is 1, not float noise, and they do not
    count in the BH family of the other edges.  embed -> L1H0.q is structurally zero and
    vacuous too (the scored positions' embeddings are the same in both runs)."""
    ev = run(models["clean"], [
        {"id": "q", "kind": "edge", "edge": "L0H0 -> L1H0.q", "expect": "unused"},
        {"id": "v", "kind": "edge", "edge": "L0H0 -> L1H0.v", "expect": "unused"},
        {"id": "embed", "kind": "edge", "edge": "embed -> L1H0.q", "expect": "unused"},
        {"id": "k", "kind": "edge", "edge": "L0H0 -> L1H0.k", "expect": "used"},
        {"id": "noise", "kind": "edge", "edge": "L0H1 -> L1H0.k", "expect": "unused"},
    ], tmp_path)
    c = by_id(ev)
    for cid in ("q", "v", "embed"):
        d = c[cid].details
        assert d.structurally_zero and d.change_mean == 0.0 and d.p_value == 1.0 and d.p_adjusted == 1.0, cid
    for cid in ("q", "v"):
        assert not c[cid].details.intervention_change.vacuous
        assert c[cid].verdict == "PASS" and "structurally zero: left out of the BH family" in c[cid].rule
    assert c["embed"].verdict == "INCONCLUSIVE" and c["embed"].details.use == "untested"
    ps = [c["k"].details.p_value, c["noise"].details.p_value]
    adjusted = harness.stats.benjamini_hochberg(ps)  # the family of two, not five
    assert [c["k"].details.p_adjusted, c["noise"].details.p_adjusted] == pytest.approx(list(adjusted))
    assert c["noise"].details.structurally_zero is None


@pytest.mark.parametrize("verdicts,expected", [
    (("PASS", "PASS", "PASS"), ["supports"]),
    (("PASS", "INCONCLUSIVE", "PASS"), ["supports"]),  # inconclusive types do not count
    (("FAIL", "FAIL", "FAIL"), []),  # robustly against (whatever the claim's direction): no robustness step
    (("PASS", "FAIL", "PASS"), ["against"]),  # depends on the type: a contradiction
    (("PASS", "INCONCLUSIVE", "INCONCLUSIVE"), ["inconclusive"]),
])
def test_robustness_rung_from_a_sensitivity_run(verdicts, expected):
    from harness.claims.base import sensitivity_entry
    from harness.evidence.details import Sensitivity, Variant

    sens = Sensitivity(by_type={k: Variant(verdict=v, value=0.5, ci=[0.4, 0.6])
                                for k, v in zip(("zero", "mean", "resample"), verdicts, strict=True)},
                       agrees=len(set(verdicts)) == 1)
    assert [e.status for e in sensitivity_entry("L0H0", "head", sens)] == expected
