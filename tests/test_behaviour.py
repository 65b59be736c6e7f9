"""The model's behaviour before any claim (model.behaviour): accuracy and the answer's rank per
prompt against hand-computed logits, their intervals against scipy's exact ones, the baseline
of a run against the fixture model's own logits, and the warning a run near chance carries."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import binom, binomtest

import harness
from harness.model import behaviour

from .conftest import FIXTURE


def test_accuracy_and_rank_per_prompt_by_hand():
    # one prompt, two scored positions over a vocabulary of 4
    logits = torch.tensor([[[1.0, 3.0, 2.0, 0.0],     # answer 2: one token above it -> rank 2
                            [5.0, 1.0, 1.0, 0.0]]])   # answer 0: the top -> rank 1
    answers = torch.tensor([[2, 0]])
    got = behaviour.per_prompt(logits, answers, None)
    assert got.tolist() == [[0.5, 1.0]]  # top-1 at one position of two; median of ranks 2 and 1 (the lower)
    wrong = torch.tensor([[0, 3]])  # answer above wrong at both positions (2 > 1, 5 > 0)
    assert behaviour.per_prompt(logits, answers, wrong)[0, 0].item() == 1.0
    tied = torch.tensor([[[2.0, 2.0, 0.0, 0.0]]])  # a tie with the answer counts for it
    assert behaviour.per_prompt(tied, torch.tensor([[1]]), None).tolist() == [[1.0, 1.0]]
    assert behaviour.per_prompt(tied, torch.tensor([[1]]), torch.tensor([[0]]))[0, 0].item() == 0.0


def test_one_position_a_prompt_gets_the_exact_binomial_interval_and_the_median_its_order_statistics():
    rng = np.random.default_rng(0)
    n = 40
    correct = (rng.random(n) < 0.7).astype(float)
    ranks = rng.integers(1, 50, n).astype(float)
    got = behaviour.summary(np.stack([correct, ranks], 1), k=1, n_resamples=500, confidence=0.95, seed=0)
    ci = binomtest(int(correct.sum()), n).proportion_ci(0.95, method="exact")
    assert got["accuracy"]["mean"] == correct.mean()
    assert got["accuracy"]["ci"] == pytest.approx([ci.low, ci.high], abs=1e-12)
    # distribution-free interval of the median: order statistics x_(l) and x_(u) with l, u from
    # Binomial(n, 1/2); its coverage is at least 95 %
    x = np.sort(ranks)
    lo_i = int(binom.ppf(0.025, n, 0.5))
    hi_i = int(binom.isf(0.025, n, 0.5))
    low, high = got["median_rank"]["ci"]
    assert got["median_rank"]["median"] == np.median(ranks)
    assert x[lo_i - 1] <= low <= x[lo_i + 1] and x[hi_i - 1] <= high <= x[hi_i + 1]
    assert binom.cdf(np.searchsorted(x, high, side="right") - 1, n, 0.5) \
        - binom.cdf(np.searchsorted(x, low, side="left") - 1, n, 0.5) >= 0.95
    assert got["prompts"] == n


def test_near_chance_is_the_interval_reaching_chance_plus_the_margin():
    doc = {"accuracy": {"mean": 0.7, "ci": [0.55, 0.8]}}
    assert behaviour.near_chance(doc, 0.5)  # 0.55 <= 0.5 + 0.1
    assert not behaviour.near_chance({"accuracy": {"mean": 0.9, "ci": [0.61, 0.95]}}, 0.5)
    assert behaviour.near_chance({"accuracy": {"mean": 0.05, "ci": [None, None]}}, 1 / 128)  # undefined: the mean


def rows_file(tmp_path, answers_of, wrong_of=None, n=24):
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        seg = rng.integers(1, 128, 6).tolist()
        clean = [0, *seg, *seg]
        positions = [9, 10, 11]
        row = {"clean": clean, "corrupted": [0, *rng.integers(1, 128, 6).tolist(), *seg], "positions": positions,
               "answers": [answers_of(clean, p, i) for p in positions]}
        if wrong_of is not None:
            row["wrong"] = [wrong_of(clean, p, i) for p in positions]
        rows.append(row)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f, rows


def run_on(f, metric="logprob", fixture_model=None):
    doc = {"harness": 1, "name": "b", "model": str(FIXTURE), "data": {"file": str(f)}, "metric": metric,
           "claims": [{"id": "a", "kind": "ablation", "heads": ["L1H5"], "ablation": "mean", "at_least": 0.1}]}
    return harness.run(doc, figures=False, model=fixture_model)


def test_a_runs_accuracy_and_rank_are_the_fixture_models_own(tmp_path, fixture_model):
    f, rows = rows_file(tmp_path, lambda clean, p, i: clean[p + 1])  # induction: the repeated token
    ev = run_on(f, fixture_model=fixture_model)
    tokens = torch.tensor([r["clean"] for r in rows])
    with torch.no_grad():
        logits = fixture_model.bridge(tokens).double().numpy()  # the model's own forward, every position
    acc, rank = [], []
    for n, r in enumerate(rows):
        at = logits[n, r["positions"]]  # [k, vocab]
        a = np.array(r["answers"])
        above = (at > at[np.arange(len(a)), a][:, None]).sum(1)
        acc.append(np.mean(above == 0))
        rank.append(np.median(1 + above))
    b = ev.baseline["behaviour"]
    assert b["compared"] == "answer top-1" and b["chance"] == 1 / 128
    assert b["clean"]["accuracy"]["mean"] == pytest.approx(np.mean(acc), abs=1e-12)
    assert b["clean"]["median_rank"]["median"] == np.median(rank)
    assert b["clean"]["accuracy"]["mean"] > 0.5 and not b["near_chance"]  # the fixture does induction
    assert set(b["corrupted"]) == {"default"} and b["corrupted"]["default"]["prompts"] == len(rows)
    assert not any("near chance" in w for w in ev.warnings)
    md = (harness.write_report(ev, out_dir=tmp_path / "r") / "report.md").read_text()
    first = md.split("## Verdicts")[0]
    assert "**Behaviour** on the 24 clean prompts: accuracy (answer top-1)" in first
    assert "on the prompts of corruption `default`" in first and "clean − corrupted gap" in first


def test_a_task_the_model_does_not_do_is_near_chance_and_says_so(tmp_path, fixture_model):
    # the answer and the wrong token are two arbitrary tokens, swapped on every other prompt
    f, _ = rows_file(tmp_path, lambda clean, p, i: 3 if i % 2 else 4, lambda clean, p, i: 4 if i % 2 else 3)
    ev = run_on(f, metric="logit_diff", fixture_model=fixture_model)
    b = ev.baseline["behaviour"]
    assert b["compared"] == "answer above wrong" and b["chance"] == 0.5 and b["near_chance"]
    assert any(w.startswith("the model is near chance on this task") for w in ev.warnings)
    md = (harness.write_report(ev, out_dir=tmp_path / "r") / "report.md").read_text()
    assert "**near chance**" in md.split("## Verdicts")[0]
