"""The metric registry: the built-in metrics against hand computations, `kl` and `prob` in
every claim kind that reads a metric, and a metric registered from outside the package."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import harness
from harness.model import metrics

from .conftest import FIXTURE
from .documents import hypothesis as document
from .documents import write


def logits_case():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64) * 2
    positions = torch.tensor([[1, 3], [0, 4], [2, 2]])
    answers = torch.tensor([[6, 0], [3, 3], [1, 5]])
    wrong = torch.tensor([[2, 1], [0, 6], [4, 4]])
    return logits, positions, answers, wrong


def hand(fn):
    """The metric per prompt, computed with plain Python floats over the same numbers."""
    logits, positions, answers, wrong = logits_case()
    out = []
    for n in range(3):
        vals = []
        for i in range(2):
            row = logits[n, positions[n, i]].tolist()
            vals.append(fn(row, int(answers[n, i]), int(wrong[n, i]), n, i))
        out.append(sum(vals) / len(vals))
    return np.array(out)


def softmax(row):
    mx = max(row)
    e = [math.exp(x - mx) for x in row]
    s = sum(e)
    return [x / s for x in e]


def test_prob_and_logprob_by_hand():
    logits, positions, answers, wrong = logits_case()
    prob = metrics.per_prompt(logits, positions, answers, "prob").numpy()
    np.testing.assert_allclose(prob, hand(lambda r, a, w, n, i: softmax(r)[a]), atol=1e-14)
    lp = metrics.per_prompt(logits, positions, answers, "logprob").numpy()
    np.testing.assert_allclose(lp, hand(lambda r, a, w, n, i: math.log(softmax(r)[a])), atol=1e-13)
    ld = metrics.per_prompt(logits, positions, answers, "logit_diff", wrong).numpy()
    np.testing.assert_allclose(ld, hand(lambda r, a, w, n, i: r[a] - r[w]), atol=1e-13)
    assert metrics.no_information("prob", 7) == pytest.approx(1 / 7)


def test_kl_by_hand():
    """-KL(p_clean || p) per scored position, averaged: 0 for the clean logits themselves."""
    logits, positions, answers, _ = logits_case()
    clean_logits = logits + torch.randn(logits.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    idx = positions.unsqueeze(-1).expand(-1, -1, 7)
    clean_lp = torch.log_softmax(clean_logits.gather(1, idx), -1)
    got = metrics.per_prompt(logits, positions, answers, "kl", clean=clean_lp).numpy()

    def kl(r, a, w, n, i):
        pc = softmax(clean_logits[n, positions[n, i]].tolist())
        p = softmax(r)
        return -sum(c * (math.log(c) - math.log(q)) for c, q in zip(pc, p))

    np.testing.assert_allclose(got, hand(kl), atol=1e-13)
    same = metrics.per_prompt(clean_logits, positions, answers, "kl", clean=clean_lp).numpy()
    np.testing.assert_allclose(same, 0.0, atol=1e-14)
    uniform = -np.mean([[math.log(7) + sum(c * math.log(c) for c in softmax(clean_logits[n, positions[n, i]].tolist()))
                         for i in range(2)] for n in range(3)])
    assert metrics.no_information("kl", 7, clean_lp) == pytest.approx(uniform, abs=1e-12)
    with pytest.raises(harness.errors.DataError, match="compares with the clean run"):
        metrics.per_prompt(logits, positions, answers, "kl")


def test_metrics_are_chunked_over_prompts(monkeypatch):
    logits, positions, answers, wrong = logits_case()
    whole = metrics.per_prompt(logits, positions, answers, "prob")
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 14)  # one prompt at a time
    torch.testing.assert_close(metrics.per_prompt(logits, positions, answers, "prob"), whole, rtol=0, atol=0)


CLAIMS = [
    {"id": "needed", "kind": "ablation", "heads": ["L0H7"], "ablation": "mean", "at_least": 0.3},
    {"id": "k-edge", "kind": "edge", "edge": "L0H7 -> L1H5.k", "expect": "used"},
    {"id": "q-edge", "kind": "edge", "edge": "L0H7 -> L1H5.q", "expect": "unused"},
    {"id": "path", "kind": "path", "path": "L0H7 -> L1H5.k -> logits", "expect": "used"},
    {"id": "circuit", "kind": "circuit", "heads": ["L0H3", "L0H4", "L0H5", "L0H6", "L0H7"]
     + [f"L1H{i}" for i in range(8)], "at_least": 0.3, "random_circuits": 20},
]


def hypothesis(tmp_path, metric):
    st = {"bootstrap": 500, "permutations": 1000, "null_draws": 200}
    if metric == "prob":  # the gap thresholds are in the metric's own units: a probability here
        st.update(min_gap=0.1, min_prompt_gap=0.02)
    doc = document(FIXTURE, CLAIMS, name=f"metric-{metric}", metric=metric, stats=st,
                   data={"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 10})
    return write(tmp_path, doc, metric)


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["kl", "prob"])
def test_kl_and_prob_in_every_claim_kind_that_reads_a_metric(tmp_path, metric):
    ev = harness.run(hypothesis(tmp_path, metric), device="cpu")
    verdicts = {c.id: c.verdict for c in ev.claims}
    assert verdicts == {"needed": "PASS", "k-edge": "PASS", "q-edge": "PASS", "path": "PASS", "circuit": "PASS"}, \
        [(c.id, c.rule) for c in ev.claims]
    assert ev.baseline["metric"] == metric and ev.baseline["unit"] == metrics.get(metric).unit
    assert ev.baseline["gap"]["mean"] > 0  # oriented: higher is more of the clean behaviour
    if metric == "kl":
        assert ev.baseline["clean"]["mean"] == pytest.approx(0.0, abs=1e-6)  # the clean run against itself
    harness.write_report(ev, out_dir=tmp_path / f"report-{metric}")


def test_a_metric_registered_from_outside(tmp_path):
    from . import toy_metric

    metrics.register(toy_metric.METRIC)
    with pytest.raises(ValueError, match="a metric called 'margin' is already registered"):
        metrics.register(toy_metric.METRIC)  # never a silent replacement
    try:
        _check_margin(tmp_path, toy_metric)
    finally:
        metrics.unregister("margin")  # no other test sees it among the allowed metrics
    assert "margin" not in metrics.names()


def _check_margin(tmp_path, toy_metric):
    assert "margin" in metrics.names()
    logits, positions, answers, _ = logits_case()

    def by_hand(r, a, w, n, i):
        return r[a] - max(x for t, x in enumerate(r) if t != a)

    np.testing.assert_allclose(toy_metric.margin(logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, 7)),
                                                 answers, None, None).numpy(), hand(by_hand), atol=1e-13)
    ev = harness.run(hypothesis(tmp_path, "margin"), device="cpu")
    assert ev.baseline["unit"] == "logits" and ev.claim("k-edge").verdict == "PASS"


def test_an_unknown_metric_is_refused(tmp_path):
    path = hypothesis(tmp_path, "kl")
    path.write_text(path.read_text().replace("metric: kl", "metric: kll"))
    with pytest.raises(harness.errors.SpecError, match=r"metric: .*unknown metric 'kll'; allowed: .*kl.*did you mean"):
        harness.load_hypothesis(path)
