"""Sets of answers: a task with more than one right answer (greater-than: every later year) scored by
prob_diff, the right set's probability minus the wrong set's, prompt by prompt; behaviour compares the
sets; metrics that read one token refuse such data.  Oracles: numpy on hand-written logits, and the
model's own forward (softmax at the scored position)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from yaml import safe_dump as dump

from harness.cli import main
from harness.model import behaviour, metrics

from .conftest import FIXTURE

NAMES = FIXTURE.parent / "names-3l"
PEOPLE = ["Mary", "John", "Alice", "Bob", "Tom", "Anna", "James", "Sarah"]


def test_prob_diff_is_the_mass_of_the_right_set_less_the_wrong_sets():
    """Hand-written logits: p = softmax, sets padded with -1; a set of one is p(a) - p(w)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 1, 12))
    A = torch.tensor([[[1, 4, -1]], [[2, -1, -1]], [[0, 5, 7]]])
    W = torch.tensor([[[3, -1]], [[6, 8]], [[9, -1]]])
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    want = [p[0, 0, [1, 4]].sum() - p[0, 0, 3], p[1, 0, 2] - p[1, 0, [6, 8]].sum(),
            p[2, 0, [0, 5, 7]].sum() - p[2, 0, 9]]
    got = metrics.per_prompt(torch.tensor(logits), None, A, "prob_diff", W)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    one = metrics.per_prompt(torch.tensor(logits), None, A[:, :, :1], "prob_diff", W[:, :, :1])
    np.testing.assert_allclose(one.numpy(), p[[0, 1, 2], 0, [1, 2, 0]] - p[[0, 1, 2], 0, [3, 6, 9]], rtol=1e-12)


def test_behaviour_of_sets_compares_their_mass_and_ranks_their_best_member():
    """correct: the right set's probability above the wrong set's; rank: the best right member's; sets of
    one give exactly what single tokens give."""
    logits = torch.tensor([[[0.0, 3.0, 1.0, 2.9, 2.8, -1.0]], [[5.0, 0.0, 1.0, 0.5, 0.4, 0.3]]])
    A = torch.tensor([[[2, 5, -1]], [[1, 2, 3]]])
    W = torch.tensor([[[1, -1]], [[0, 4]]])
    got = behaviour.per_prompt(logits, A, W).numpy()
    # prompt 0: mass {2, 5} = e^1 + e^-1 < e^3: wrong; its best member, 2 (1.0), has 3.0, 2.9, 2.8 above it
    assert got[0, 0] == 0 and got[0, 1] == 4
    # prompt 1: mass {1, 2, 3} = 1 + e + e^.5 < e^5 + e^.4: wrong; best member 2 (1.0) has 5.0 above it
    assert got[1, 0] == 0 and got[1, 1] == 2
    flip = behaviour.per_prompt(logits, W, A).numpy()  # the other way round the first prompt is right
    assert flip[0, 0] == 1 and flip[0, 1] == 1 and flip[1, 0] == 1
    single = behaviour.per_prompt(logits, A[:, :, 0], W[:, :, 0]).numpy()
    assert (behaviour.per_prompt(logits, A[:, :, :1], W[:, :, :1]).numpy() == single).all()


def _rows(n=16, *, sets=True):
    rows = []
    for i in range(n):
        io, s = PEOPLE[i % 8], PEOPLE[(i + 3) % 8]
        other, new = PEOPLE[(i + 5) % 8], PEOPLE[(i + 6) % 8]
        rows.append({"text": f"When {io} and {s} went to the store , {s} gave a book to",
                     "corrupted": f"When {other} and {new} went to the store , {new} gave a book to",
                     "answer": [f" {io}", f" {other}"] if sets else f" {io}",
                     "wrong": [f" {s}"] if sets else f" {s}"})
    return rows


def _file(tmp_path, rows, name="sets.jsonl"):
    f = tmp_path / name
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _hypothesis(tmp_path, data, metric="prob_diff"):
    h = tmp_path / "h.yaml"
    h.write_text(dump({"harness": 1, "name": "sets", "model": str(NAMES), "data": {"file": str(data),
                       "prepend_bos": True}, "metric": metric, "stats": {"bootstrap": 200, "permutations": 200},
                       "claims": [{"id": "abl", "kind": "ablation", "heads": ["L2H0"], "ablation": "zero",
                                   "at_least": 0.0}]}, sort_keys=False))
    return h


def test_a_run_on_sets_scores_the_models_own_probabilities(tmp_path):
    """The clean run's prob_diff per prompt equals the model's own softmax at the last token summed over
    each set; behaviour compares the sets' probabilities; the description says the data give sets."""
    import harness
    from harness.engine.runner import load_model_cached

    rows = _rows()
    ev = harness.run(_hypothesis(tmp_path, _file(tmp_path, rows)), figures=False)
    m = load_model_cached(str(NAMES), "cpu")
    tok = m.bridge.tokenizer
    ids = [[tok.bos_token_id] + tok.encode(r["text"], add_special_tokens=False) for r in rows]
    with torch.no_grad():
        p = torch.softmax(m.bridge(torch.tensor(ids))[:, -1].double(), -1)

    def token(t):
        (i,) = tok.encode(t, add_special_tokens=False)
        return i

    want = np.array([float(sum(p[n, token(a)] for a in r["answer"]) - sum(p[n, token(w)] for w in r["wrong"]))
                     for n, r in enumerate(rows)])
    assert ev.baseline["clean"]["mean"] == pytest.approx(want.mean(), abs=1e-6)
    b = ev.baseline["behaviour"]
    assert b["compared"] == "right answers' probability above the wrong ones'"
    assert b["clean"]["accuracy"]["mean"] == pytest.approx(float(np.mean(want > 0)))
    assert "sets of 2 right answers against sets of wrong ones" in ev.data["description"]


def test_data_with_sets_refuse_a_metric_that_reads_one_token(tmp_path, capsys):
    data = _file(tmp_path, _rows())
    h = _hypothesis(tmp_path, data, metric="logit_diff")
    assert main(["run", str(h), "--reports", str(tmp_path / "r")]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]  # stage lines
    assert len(err) == 1 and err[0].startswith(f"error: {h}:") and "metric logit_diff reads one answer token" in err[0]
    assert "use a metric that reads sets (prob_diff)" in err[0] and not (tmp_path / "r").exists()


@pytest.mark.parametrize(("change", "needle"), [
    ({"answer": [" Mary", " Mary"]}, "'answer': the set gives ' Mary' twice"),
    ({"answer": []}, "'answer': a set of answers is a non-empty list of strings"),
    ({"answer": [" Mary", ""]}, "'answer': every answer in a set is a non-empty string"),
    ({"answer": [" Mary", " John"], "wrong": [" John"]}, "is both a right and a wrong answer"),
])
def test_bad_sets_are_one_line_with_the_file_and_line(tmp_path, capsys, change, needle):
    rows = _rows(4)
    rows[2] = dict(rows[2], **change)
    data = _file(tmp_path, rows)
    assert main(["roles", str(NAMES), "--data", str(data), "--n-prompts", "4"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]  # stage lines
    assert len(err) == 1 and err[0].startswith(f"error: {data}:3") and needle in err[0], err


def test_sets_of_one_score_as_single_tokens(tmp_path):
    """prob_diff on data whose sets hold one token each equals prob_diff on the same data given as single
    tokens (the metric reads singleton sets built from them), and both read the same behaviour."""
    import harness

    one = [dict(r, answer=[r["answer"][0]]) for r in _rows()]
    a = harness.run(_hypothesis(tmp_path, _file(tmp_path, one, "a.jsonl")), figures=False)
    b = harness.run(_hypothesis(tmp_path, _file(tmp_path, _rows(sets=False), "b.jsonl")), figures=False)
    assert a.baseline["clean"]["mean"] == pytest.approx(b.baseline["clean"]["mean"], abs=1e-12)
    assert a.baseline["corrupted"]["mean"] == pytest.approx(b.baseline["corrupted"]["mean"], abs=1e-12)
    assert a.claims[0].value == pytest.approx(b.claims[0].value, abs=1e-9)
    assert a.baseline["behaviour"]["clean"] == b.baseline["behaviour"]["clean"]
