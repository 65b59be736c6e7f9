"""`harness discover` (tools.discover): the split is disjoint and seeded, the ranking's ROC AUC is
the share of correctly ordered pairs, the constructed models' known circuits are ranked first
(AUC >= 0.95) and the interval of the top-|known| circuit covers the known circuit's
faithfulness; the curve reads 0 with no edge and 1 with every edge, CPR and CMD are the
trapezoid areas of its points; the starter file is a valid hypothesis that runs; bad options
are one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from harness.cli import main
from harness.tools import constructed
from harness.tools.curve import PERCENTAGES, curve_ks
from harness.tools.discover import discover, split
from harness.tools.known import roc_auc

from .graph_helpers import ROOT

# the edges each constructed model's mechanism carries under the first-half corruption (edges that
# read only positions, or the current token where no scored prompt changes it, carry nothing)
KNOWN = {
    "clean": ["embed -> L0H0.v", "L0H0 -> L1H0.k", "embed -> L1H0.v", "L1H0 -> logits"],
    "decoy": ["embed -> L0H0.v", "L0H0 -> L1H0.k", "embed -> L1H0.v", "L1H0 -> logits"],
    "redundant": ["embed -> L0H0.v", "embed -> L0H1.v", "L0H0 -> L1H0.k", "L0H1 -> L1H0.k", "embed -> L1H0.v",
                  "L1H0 -> logits"],
}


def test_split_is_disjoint_seeded_and_sized():
    d, c = split(101, 0.3, seed=4)
    assert len(c) == 30 and len(d) == 71 and not set(d) & set(c) and sorted(d + c) == list(range(101))
    assert split(101, 0.3, seed=4) == (d, c) and split(101, 0.3, seed=5) != (d, c)
    assert [len(x) for x in split(4, 0.01, 0)] == [2, 2]


def test_roc_auc_counts_ordered_pairs():
    known = np.array([True, False, True, False, False])
    assert roc_auc(np.array([0, 2, 1, 3, 4]), known) == 1.0
    assert roc_auc(np.array([1, 3, 4, 0, 2]), known) == 0.0
    # order 0, 1, 2, 3, 4: known 0 is above all 3 others, known 2 above 2 of them: 5 of 6 pairs
    assert roc_auc(np.arange(5), known) == pytest.approx(5 / 6)
    assert np.isnan(roc_auc(np.arange(3), np.array([True, True, True])))


def test_curve_sizes_follow_mib():
    assert curve_ks(32_491) == [32, 64, 162, 324, 649, 1624, 3249, 6498, 16245, 32491]
    assert PERCENTAGES[-1] == 1.0


@pytest.fixture(scope="module")
def constructed_models(tmp_path_factory):
    return constructed.build_all(tmp_path_factory.mktemp("constructed"))


def known_file(folder, model_path, variant: str):
    f = folder / f"{variant}.yaml"
    f.write_text(yaml.safe_dump({
        "harness": 1, "name": variant, "model": str(model_path),
        "data": {"generator": "repeated_tokens", "n_prompts": 120, "segment_length": 10},
        "claims": [{"id": "known", "kind": "circuit", "edges": KNOWN[variant], "at_least": 0.9}]}))
    return f


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(KNOWN))
def test_known_circuits_of_constructed_models_are_recovered(constructed_models, variant, tmp_path):
    f = known_file(tmp_path, constructed_models[variant], variant)
    doc, summary = discover(str(f), tmp_path / "out", device="cpu", bootstrap=300, top=10, learn=60)
    known = doc["known"]
    assert known["auc"] >= 0.95, (variant, known["auc"], doc["ranking"][:8])
    assert doc["learned"]["auc"] >= 0.95, (variant, doc["learned"]["auc"])  # the learned mask recovers it too
    assert known["top"]["covers"], known
    assert known["faithfulness"] == pytest.approx(1.0, abs=0.02)
    assert "ROC AUC" in summary
    sp = doc["split"]
    assert not set(sp["discovery_indices"]) & set(sp["confirmation_indices"])
    assert sp["discovery"] + sp["confirmation"] == sp["prompts"] == 120


@pytest.mark.slow
def test_names_discovery_end_to_end(tmp_path):
    """On the names fixture (MLPs, real text): every edge class is scored, the curve reads 0 with no
    edge and 1 with every edge, CPR / CMD are the areas of the points, the report and the starter
    file are written, and the starter runs."""
    out = tmp_path / "names"
    code = main(["discover", str(ROOT / "hypotheses" / "names.yaml"), "--out", str(out), "--bootstrap", "200",
                 "--top", "12", "--bound", "0.5", "--device", "cpu"])
    assert code == 0
    doc = json.loads((out / "discovery.json").read_text())
    for part in ("discovery", "confirmation"):  # the behaviour of each part's prompts, before any edge
        b = doc["behaviour"][part]
        assert b["clean"]["prompts"] == doc["split"][part] and 0 <= b["clean"]["accuracy"]["mean"] <= 1
    assert "**Behaviour** on the" in (out / "discover.md").read_text()
    classes = doc["graph"]["classes"]
    assert classes["mlp"]["q"] > 0 and classes["head"]["mlp"] > 0 and classes["embed"]["logits"] == 1
    assert sum(sum(r.values()) for r in classes.values()) == doc["graph"]["edges"] == len(doc["ranking"])
    curve = doc["curve"]
    assert curve[-1]["k"] == doc["graph"]["edges"] and curve[-1]["faithfulness"] == pytest.approx(1.0, abs=1e-9)
    assert curve[0]["k"] == 0 and curve[0]["faithfulness"] == 0.0
    x = np.array([p["fraction"] for p in curve])
    f = np.array([p["faithfulness"] for p in curve])
    assert doc["summaries"]["CPR"]["value"] == pytest.approx(np.trapezoid(f, x), abs=1e-9)
    assert doc["summaries"]["CMD"]["value"] == pytest.approx(np.trapezoid(np.abs(1 - f), x), abs=1e-9)
    for p in curve:
        assert p["ci"][0] <= p["faithfulness"] <= p["ci"][1]
    assert len(doc["confirmed"]) == 12
    # the file's first circuit is a node circuit of heads: known as the edges among them and every MLP
    known = doc["known"]
    assert (known["claim"], known["from"]) == ("head-circuit", "nodes")
    assert "L0.mlp -> L1.mlp" in known["edges"] and "embed -> logits" in known["edges"]
    rank = {r["edge"]: r["rank"] for r in doc["ranking"]}
    inside = [rank[e] for e in known["edges"]]
    outside = [r for e, r in rank.items() if e not in set(known["edges"])]
    pairs = sum(a < b for a in inside for b in outside)  # the AUC by counting every (known, other) pair
    assert known["auc"] == pytest.approx(pairs / (len(inside) * len(outside)), abs=1e-12)
    assert known["auc"] > 0.5  # better than chance: the ranking finds the mechanism the file states
    # the estimate against the exact patch: scipy's correlations of the same pairs are the oracle
    from scipy.stats import pearsonr, spearmanr

    estimate = {r["edge"]: r["estimate"] for r in doc["ranking"]}
    pairs = [(estimate[c["edge"]], c["effect"]) for c in doc["confirmed"] if c["effect"] is not None]
    agree = doc["agreement"]
    assert agree["edges"] == len(pairs) >= 3
    x, y = zip(*pairs, strict=True)
    assert agree["spearman"]["value"] == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert agree["pearson"]["value"] == pytest.approx(pearsonr(x, y).statistic, abs=1e-12)
    for key in ("spearman", "pearson"):
        assert agree[key]["ci"][0] <= agree[key]["value"] <= agree[key]["ci"][1]
    # the finer search lies between the grid's last point below the bound and its first above, and the
    # starter is the smallest k tried whose interval clears the bound
    bound = doc["settings"]["bound"]
    first = next(i for i, p in enumerate(curve) if p["k"] > 0 and p["ci"][0] >= bound)
    lo, hi = curve[first - 1]["k"], curve[first]["k"]
    for p in doc["curve_finer"]:  # bisection: each k the midpoint of what is left of the gap
        assert p["k"] == (lo + hi) // 2 and lo < p["k"] < hi
        lo, hi = (lo, p["k"]) if p["ci"][0] >= bound else (p["k"], hi)
    assert len(doc["curve_finer"]) == 5 or hi - lo <= 1  # 5 steps, or nothing left between
    # every edge kept is the clean run: exactly 1
    assert (curve[-1]["k"], curve[-1]["faithfulness"], curve[-1]["ci"]) == (doc["graph"]["edges"], 1.0, [1.0, 1.0])
    # the signed ranking: its own curve from 0 to 1, and the starter the smaller of the two rankings' first k
    signed = doc["signed"]
    assert signed["curve"][0]["faithfulness"] == 0.0 and signed["curve"][-1]["faithfulness"] == 1.0
    assert signed["negative_edges"] == sum(r["score"] < 0 for r in doc["ranking"]) > 0

    assert doc["learned"] is None and "mask" not in doc["ranking"][0]  # no --learn
    tried = starters(doc)
    chosen = min(tried, key=lambda key: (tried[key][0] is None, tried[key][0] or 0))  # ties: the first tried
    assert doc["starter_ranking"] == chosen and doc["starter_k"] == tried[chosen][0]
    _, starter_rows, chosen_finer = tried[chosen]
    # stability: at every k tried, and at the starter's
    stab = doc["stability"]
    assert stab["resamples"] == 20 and stab["prompts"] == doc["split"]["discovery"]
    assert {p["k"] for p in stab["points"]} == {p["k"] for p in [*curve, *chosen_finer]}
    for p in stab["points"]:
        assert 0.0 <= p["range"][0] <= p["jaccard"] <= p["range"][1] <= 1.0
    assert stab["points"][-1]["jaccard"] == 1.0  # every edge: the same set whatever the prompts
    assert stab["starter"]["k"] == doc["starter_k"] and stab["starter"]["stable"] == (stab["starter"]["jaccard"] >= 0.8)
    assert (out / "figures" / "stability.png").stat().st_size > 1000
    # the starter circuit read as nodes, and its whole edge list in a file
    k = doc["starter_k"]
    assert k
    nodes = doc["starter_nodes"]
    assert sum(r["share"] for r in nodes) == pytest.approx(1.0, abs=1e-12)
    assert sum(r["edges"] for r in nodes) == 2 * k  # every edge has two ends
    assert [r["share"] for r in nodes] == sorted((r["share"] for r in nodes), reverse=True)
    assert (out / "starter-edges.txt").read_text().splitlines() == [r["edge"] for r in starter_rows[:k]]
    md = (out / "discover.md").read_text()
    assert "## The estimate against the exact patch" in md and "| node " in md
    assert {"discover.md", "discover.html", "discovery.json", "starter.yaml"} <= {p.name for p in out.iterdir()}
    assert (out / "figures" / "curve.png").stat().st_size > 1000
    starter = yaml.safe_load((out / "starter.yaml").read_text())
    assert starter["data"]["split"] == "test"  # held out from the explore split discovery used
    kinds = {c["kind"] for c in starter["claims"]}
    assert kinds <= {"circuit", "edge"} and kinds
    for c in starter["claims"]:  # a circuit names its edges by reference: the file beside it
        if c["kind"] == "circuit":
            assert c["edges_from"] == "starter-edges.txt" and "edges" not in c
    assert main(["run", str(out / "starter.yaml"), "--out", str(tmp_path / "starter-run"), "--device", "cpu"]) in (0, 1)
    ev = json.loads((tmp_path / "starter-run" / "evidence.json").read_text())
    assert {c["id"] for c in ev["claims"]} == {c["id"] for c in starter["claims"]}


def starters(doc: dict) -> dict:
    """Each ranking's (smallest k whose interval clears the bound, its rows in order, its finer search)."""
    bound = doc["settings"]["bound"]

    def first_k(points):
        return min((p["k"] for p in points if p["k"] > 0 and p["ci"][0] >= bound), default=None)

    signed, learned = doc["signed"], doc["learned"]
    out = {"abs": (first_k([*doc["curve"], *doc["curve_finer"]]), doc["ranking"], doc["curve_finer"]),
           "signed": (first_k([*signed["curve"], *signed["curve_finer"]]),
                      sorted(doc["ranking"], key=lambda r: -r["score"]), signed["curve_finer"])}
    if learned:
        out["learned"] = (first_k([*learned["curve"], *learned["curve_finer"]]),
                          sorted(doc["ranking"], key=lambda r: -r["mask"]), learned["curve_finer"])
    return out


@pytest.mark.slow
def test_a_learned_mask_is_a_third_ranking_and_refinement_prunes_the_starter(tmp_path):
    """--learn: a mask trained on the discovery prompts (its logit on every row, its training history, the
    penalty rising from its first to its last value), its own curve on the confirmation prompts, and the
    smallest circuit of the three rankings; a learned starter has no stability figure (one mask is trained,
    not one per resample) and its edges are the rows with the largest logits.  --refine: that circuit pruned
    on the discovery prompts, a subset of it, the starter when it clears the bound on the confirmation
    prompts with fewer edges."""
    out = tmp_path / "learned"
    assert main(["discover", str(ROOT / "hypotheses" / "names.yaml"), "--out", str(out), "--bootstrap", "200",
                 "--top", "5", "--bound", "0.5", "--device", "cpu", "--learn", "30", "--refine", "8"]) == 0
    doc = json.loads((out / "discovery.json").read_text())
    learned = doc["learned"]
    assert doc["settings"]["learn"] == learned["steps"] == 30 and 0.5 < learned["auc"] <= 1.0
    assert learned["kept"] == sum(r["mask"] > 0 for r in doc["ranking"])
    assert [h["step"] for h in learned["history"]] == [0, 10, 20, 29]
    penalties = [h["penalty"] for h in learned["history"]]
    assert penalties[0] == learned["penalty"][0] and penalties[-1] == pytest.approx(learned["penalty"][1])
    assert learned["history"][-1]["kept_share"] < learned["history"][0]["kept_share"]  # the penalty prunes
    assert learned["curve"][0]["faithfulness"] == 0.0 and learned["curve"][-1]["faithfulness"] == 1.0
    tried = starters(doc)
    chosen = min(tried, key=lambda key: (tried[key][0] is None, tried[key][0] or 0))  # ties: the first tried
    # the refinement starts from that ranking's starter and keeps a subset of it
    refined = doc["refined"]
    k, rows, _ = tried[chosen]
    assert (refined["from"], refined["from_k"]) == (chosen, k) and refined["k"] == len(refined["edges"])
    assert set(refined["edges"]) <= {r["edge"] for r in rows[:k]}
    props = refined["proposals"]
    assert props[0]["removed"] == 0 and props[0]["edges"] == k
    assert refined["k"] == k - sum(p["removed"] for p in props if p["accepted"])
    for p in props[1:]:  # accepted exactly when the discovery interval still clears the bound
        assert p["accepted"] == (p["ci"][0] >= 0.5)
    assert refined["clears"] == (refined["ci"][0] >= 0.5)
    if refined["clears"] and refined["k"] < k:
        assert doc["starter_ranking"] == "refined" and doc["starter_k"] == refined["k"]
        want = refined["edges"]
        assert doc["stability"] is None
    else:
        assert doc["starter_ranking"] == chosen and doc["starter_k"] == k
        want = [r["edge"] for r in rows[:k]]
        assert (doc["stability"] is None) == (chosen == "learned")
    assert (out / "starter-edges.txt").read_text().splitlines() == want
    md = (out / "discover.md").read_text()
    assert "The **learned ranking**" in md and (chosen != "learned" or "of the learned ranking" in md)
    # the size/faithfulness front over the three rankings' circuits, and each ranking's 1 % circuit
    sel = doc["selection"]
    assert sel["prompts"] == doc["split"]["confirmation"] and {p["ranking"] for p in sel["one_percent"]} == set(tried)
    front = sel["pareto"]
    assert [p["k"] for p in front] == sorted(p["k"] for p in front)
    errors = [abs(1 - p["faithfulness"]) for p in front]
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False))  # each closer to 1 than every smaller one
    every = [p for key in tried for p in [*(doc["curve"] if key == "abs" else doc[key]["curve"]), *tried[key][2]]
             if 0 < p["k"] < doc["graph"]["edges"]]
    def off(p: dict) -> float:
        return round(abs(1 - p["faithfulness"]), 3)

    for p in every:  # nothing tried beats a point of the front on both counts
        for f in front:
            assert not (p["k"] <= f["k"] and off(p) < off(f))
    assert "## Size against faithfulness" in md


def test_the_model_is_shown_as_the_evidence_reports_show_it(tmp_path, monkeypatch):
    """discovery.json's `model` and discover.md's title name a model under the home folder
    `~/...` (and one under the working directory relative to it), as evidence.json does."""
    import shutil
    from pathlib import Path

    home = tmp_path / "home"
    shutil.copytree(ROOT / "fixtures" / "induction-2l", home / "models" / "induction-2l")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # the home folder is not under it
    out = tmp_path / "d"
    assert main(["discover", str(home / "models" / "induction-2l"), "--out", str(out), "--n-prompts", "8",
                 "--bootstrap", "100", "--top", "3", "--device", "cpu"]) == 0
    doc = json.loads((out / "discovery.json").read_text())
    assert doc["settings"]["model"] == "~/models/induction-2l"
    assert (out / "discover.md").read_text().startswith("# Discovery: ~/models/induction-2l\n")


def test_a_starter_that_cannot_be_written_is_a_warning_not_a_lost_run(tmp_path, monkeypatch, capsys):
    """When the starter would not be a valid hypothesis file (here: over a hypothesis file's size
    limit, lowered to 200 bytes), discovery still writes its whole folder, without
    starter.yaml, and says why in discovery.json, the report and the terminal."""
    from harness.hypothesis import loading

    monkeypatch.setattr(loading, "MAX_FILE_BYTES", 200)
    out = tmp_path / "d"
    code = main(["discover", str(ROOT / "fixtures" / "induction-2l"), "--out", str(out), "--n-prompts", "8",
                 "--bootstrap", "100", "--top", "3", "--device", "cpu"])
    assert code == 0
    doc = json.loads((out / "discovery.json").read_text())
    assert len(doc["warnings"]) == 1 and doc["warnings"][0].startswith("starter.yaml not written: ")
    assert "hypothesis files are limited to 200 bytes" in doc["warnings"][0]
    assert not (out / "starter.yaml").exists() and (out / "discover.md").exists()
    assert "## Warnings" in (out / "discover.md").read_text()
    assert "warning: starter.yaml not written" in capsys.readouterr().out


def test_a_circuit_of_a_hundred_thousand_edges_validates_in_linear_time():
    """Checking an edge circuit's edges for repeats is one pass: a 100,000-edge circuit claim
    validates (about a second here; the quadratic check it replaces took more than 8 minutes at
    61,605 edges, and would take hours here), and a repeat is still found."""
    from pydantic import ValidationError

    from harness.claims.circuit_spec import CircuitClaim

    edges = [f"L{s}H{h} -> L{r}H{q}.{x}" for s in range(30) for h in range(9) for r in range(s + 1, 30)
             for q in range(9) for x in "qkv"][:100_000]
    assert len(set(edges)) == 100_000
    claim = CircuitClaim.model_validate({"id": "c", "kind": "circuit", "edges": edges, "at_least": 0.5})
    assert claim.edges is not None and len(claim.edges) == 100_000
    with pytest.raises(ValidationError, match="L0H0 -> L1H1.q is listed twice"):
        CircuitClaim.model_validate({"id": "c", "kind": "circuit", "edges": [*edges[:10], edges[3]], "at_least": 0.5})


@pytest.mark.slow
def test_exact_method_ranks_by_the_patch_it_confirms(tmp_path):
    """--method exact scores every edge by exact noising on the discovery prompts: its first edges
    are the confirmation's largest effects too (the two parts share the mechanism)."""
    doc, _ = discover(str(ROOT / "fixtures" / "induction-2l"), tmp_path / "exact", device="cpu", method="exact",
                      n_prompts=40, bootstrap=200, top=5)
    assert doc["settings"]["method"] == "exact" and doc["settings"]["steps"] is None
    assert doc["ranking"][0]["edge"] == max(doc["confirmed"], key=lambda c: c["effect"])["edge"]
    assert all(r["peak_position"] is None for r in doc["ranking"][:5])


def test_a_data_file_that_names_its_model_is_discovered_on(tmp_path, capsys):
    """`harness discover FILE` with a file of model, data and metric and no claims: the discovery runs on
    them (no known circuit); without `model` it says how to name one, in one line."""
    f = tmp_path / "task.yaml"
    f.write_text(f"model: {ROOT / 'fixtures' / 'induction-2l'}\nmetric: kl\n"
                 "data:\n  generator: repeated_tokens\n  n_prompts: 24\n  segment_length: 6\n")
    assert main(["discover", str(f), "--out", str(tmp_path / "o"), "--bootstrap", "100", "--top", "3",
                 "--device", "cpu"]) in (0, 1)
    doc = json.loads((tmp_path / "o" / "discovery.json").read_text())
    assert doc["settings"]["metric"] == "kl" and doc["known"] is None and doc["split"]["prompts"] == 24
    assert doc["behaviour"]["discovery"]["compared"] == "answer top-1"
    capsys.readouterr()
    f.write_text("data:\n  generator: repeated_tokens\n  n_prompts: 24\n")
    assert main(["discover", str(f), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert f"{f}: a file without claims names the model to discover on (model: PATH)" in err
    assert "Traceback" not in err and not (tmp_path / "o2").exists()


@pytest.mark.parametrize("args,message", [
    (["--method", "acdc"], "invalid choice"),
    (["--confirm-fraction", "1.5"], "--confirm-fraction 1.5: allowed: a fraction in (0, 1)"),
    (["--bootstrap", "10"], "--bootstrap must be at least 100"),
])
def test_bad_options_are_one_line_errors(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) if "invalid choice" in message else _no_raise():
        code = main(["discover", str(ROOT / "fixtures" / "induction-2l"), "--out", str(tmp_path / "o"), *args])
        assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_harness_report_renders_a_discovery_again(tmp_path, capsys):
    """`harness report discovery.json` writes the same discover.md from the JSON alone, keeps the JSON's
    bytes and starter.yaml, and with --out fills a new folder; a document it cannot read is one line
    and leaves the folder as it was."""
    out = tmp_path / "d"
    assert main(["discover", str(ROOT / "fixtures" / "induction-2l"), "--out", str(out), "--n-prompts", "12",
                 "--bootstrap", "100", "--top", "3", "--device", "cpu"]) == 0
    md, raw = (out / "discover.md").read_bytes(), (out / "discovery.json").read_bytes()
    starter = (out / "starter.yaml").read_bytes() if (out / "starter.yaml").exists() else None
    (out / "discover.md").write_text("stale")
    capsys.readouterr()
    assert main(["report", str(out / "discovery.json")]) == 0
    assert "discover.md" in capsys.readouterr().out
    assert (out / "discover.md").read_bytes() == md and (out / "discovery.json").read_bytes() == raw
    assert ((out / "starter.yaml").read_bytes() if starter is not None else None) == starter
    assert (out / "figures" / "curve.png").stat().st_size > 1000
    assert main(["report", str(out / "discovery.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "discover.md").read_bytes() == md
    assert (tmp_path / "again" / "discovery.json").read_bytes() == raw
    doc = json.loads(raw)
    del doc["curve"]
    (out / "discovery.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["report", str(out / "discovery.json")]) != 0
    err = capsys.readouterr().err
    assert "missing curve" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (out / "discover.md").read_bytes() == md


def test_the_circuit_figure_merges_edges_per_pair_of_nodes():
    """One arrow per (sender, receiver node): an edge into .q, .k or .v ends at the head; its weight the
    summed |score|; its use the patched edge of largest |score| (None when none was patched)."""
    from harness.report.circuit_figure import arrows

    rows = [{"edge": "L0H1 -> L1H2.q", "score": 0.5}, {"edge": "L0H1 -> L1H2.k", "score": -2.0},
            {"edge": "embed -> L1H2.v", "score": 1.0}, {"edge": "L1H2 -> logits", "score": 3.0},
            {"edge": "L0H1 -> logits", "score": 0.25}]
    use = {"L0H1 -> L1H2.q": "used", "L0H1 -> L1H2.k": "unused", "L1H2 -> logits": "used"}
    assert arrows(rows, use) == [("L1H2", "logits", 3.0, "used"), ("L0H1", "L1H2", 2.5, "unused"),
                                 ("embed", "L1H2", 1.0, None), ("L0H1", "logits", 0.25, None)]
