"""An edge circuit's non-vacuity reads what its receivers receive (mech.graph.received), on
prompts whose corruption changes one token: the circuit's receivers read the changed token and
the changed writes, and the claim is tested (PASS); the senders' own changes are listed beside
it; `harness discover` judges its starter circuit the same way.  (That the numbers are right is
tests/test_families.py's oracle test.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import harness
from harness.claims.circuit_plans import EdgeCircuit
from harness.claims.circuit_spec import CircuitClaim
from harness.engine import runner
from harness.hypothesis.loading import load
from harness.mech.graph import received
from harness.mech.runs import change
from harness.mech.runs.build import base_runs
from harness.model.ref import ModelRef
from harness.spec.settings import Stats
from harness.tools.curve import top_mask
from harness.tools.discover import starter_change
from harness.tools.scan import scan_hooks

from .graph_helpers import ROOT

SEGMENT = 12
SMALL = ["embed -> L0H7.v", "L0H7 -> L1H5.k", "embed -> L1H5.v", "embed -> L1H5.q", "L1H5 -> logits"]


def one_token_prompts(n: int, seed: int = 0) -> list[dict]:
    """[0] + S + S, scored where the second S's last token is predicted; the corruption changes the
    token that token's induction reads in the first S (one token per prompt)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        seg = rng.choice(np.arange(1, 128), size=SEGMENT, replace=False)
        clean = [0, *seg.tolist(), *seg.tolist()]
        corrupted = list(clean)
        corrupted[SEGMENT] = int(next(t for t in rng.permutation(np.arange(1, 128)) if t not in seg))
        rows.append({"clean": clean, "corrupted": corrupted, "positions": [len(clean) - 2]})
    return rows


@pytest.fixture(scope="module")
def hypothesis(tmp_path_factory):
    folder = tmp_path_factory.mktemp("received")
    (folder / "one.jsonl").write_text("".join(json.dumps(r) + "\n" for r in one_token_prompts(60)))
    path = folder / "h.yaml"
    path.write_text(yaml.safe_dump({
        "harness": 1, "name": "one-token", "model": str(ROOT / "fixtures" / "induction-2l"),
        "data": {"file": "one.jsonl"}, "metric": "logprob",
        "claims": [{"id": "small", "kind": "circuit", "edges": SMALL, "at_least": 0.1}]}))  # F about 0.19
    return path


def test_a_one_token_corruption_tests_an_edge_circuit(hypothesis):
    ev = harness.run(str(hypothesis), device="cpu", figures=False)
    r = ev.claim("small")
    c = r.details.intervention_change
    assert c.read_at == change.RECEIVED and not c.vacuous
    assert c.relative_change >= 0.05 and c.at_scored is not None
    assert c.by_head is not None and set(c.by_head) <= {f"L{la}H{h}" for la in range(2) for h in range(8)}
    assert r.verdict == harness.Verdict.PASS, r.reason


def test_discover_judges_its_starter_as_run_does(hypothesis):
    """The starter circuit's non-vacuity in discovery.json (tools.discover.starter_change, of the top 5
    edges of a ranking whose first edges are the circuit's) is the circuit claim's, on the same prompts."""
    h = load(hypothesis)
    m = runner.load_model_cached(str(ModelRef.parse(h.spec.model, h.base_dir).source), "cpu")
    ds = runner.build_dataset(h, m)
    runs = base_runs(m.bridge, ds, scan_hooks(m.n_layers, m.has_mlp), h.spec.metric)
    claim = CircuitClaim.model_validate({"id": "c", "kind": "circuit", "edges": SMALL, "at_least": 0.3})
    plan = EdgeCircuit(claim, runs)
    us, rs = plan.graph.edge_index()
    order = np.argsort(~plan.mask[us, rs], kind="stable")  # the circuit's edges first
    st = Stats()
    doc = starter_change(runs, top_mask(plan.graph, order, len(SMALL)), st)
    ev = harness.run(str(hypothesis), device="cpu", figures=False)
    want = ev.claim("small").details.intervention_change
    assert doc is not None and not doc["vacuous"]
    # float32 base runs, batched differently: equal to float32's precision, far below min_change's 0.05
    assert doc["relative_change"] == pytest.approx(want.relative_change, rel=1e-5)
    assert doc["at_scored"] == pytest.approx(want.at_scored, rel=1e-5)


def test_each_position_counts_once_and_at_most_fully():
    """r_n is the mean over positions of min(1, sqrt(num / den)): a first position whose huge, unchanged
    residual dwarfs the rest (as in trained models) counts as one unchanged position, not as the whole
    denominator; a position where nothing is written is left out; a prompt with none is NaN."""
    num = np.array([[0.0, 0.25, 4.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    den = np.array([[1e6, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    r = received.position_mean(num, den)
    assert r[0] == pytest.approx((0.0 + 0.5 + 1.0) / 3) and np.isnan(r[1])
    assert np.sqrt(num[0].sum() / den[0].sum()) < 0.003  # the ratio of sums: vacuous-looking
    at = received.position_mean(num, den, np.array([[False, True, False, False]] * 2))
    assert at[0] == pytest.approx(0.5) and np.isnan(at[1])
