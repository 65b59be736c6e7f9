"""Datasets: the repeated-tokens generator and the JSONL prompt format."""

import json

import pytest
import torch

from harness.errors import DataError
from harness.model import data


def test_repeated_tokens_structure():
    ds = data.repeated_tokens(10, 6, d_vocab=50, seed=3)
    assert ds.clean.shape == ds.corrupted.shape == (10, 13)
    assert (ds.clean[:, 0] == data.BOS_TOKEN).all() and ds.has_bos
    first, second = ds.clean[:, 1:7], ds.clean[:, 7:]
    assert torch.equal(first, second)
    assert torch.equal(ds.corrupted[:, 7:], second)  # the repeat's second copy is kept
    assert (ds.corrupted[:, 1:7] != first).any(dim=1).all()  # the first copy is replaced
    assert torch.equal(ds.positions[0], torch.arange(7, 12))
    assert torch.equal(ds.answers, ds.clean.gather(1, ds.positions + 1))
    assert ((ds.clean[:, 1:] >= 1) & (ds.clean[:, 1:] < 50)).all()


def test_repeated_tokens_seeded_and_split():
    a = data.repeated_tokens(5, 4, 50, seed=1)
    assert torch.equal(a.clean, data.repeated_tokens(5, 4, 50, seed=1).clean)
    assert not torch.equal(a.clean, data.repeated_tokens(5, 4, 50, seed=2).clean)
    assert not torch.equal(a.clean, data.repeated_tokens(5, 4, 50, seed=1, split="explore").clean)


def test_repeated_tokens_without_bos():
    ds = data.repeated_tokens(4, 5, 20, bos=False)
    assert ds.clean.shape == (4, 10) and not ds.has_bos
    assert torch.equal(ds.positions[0], torch.arange(5, 9))


def test_repeated_tokens_custom_bos_never_drawn():
    ds = data.repeated_tokens(200, 10, d_vocab=6, bos_token=3, vocab_min=0)
    assert (ds.clean[:, 0] == 3).all()
    body = torch.cat([ds.clean[:, 1:], ds.corrupted[:, 1:]])
    assert not (body == 3).any()
    assert set(body.unique().tolist()) == {0, 1, 2, 4, 5}


def test_repeated_tokens_bad_range():
    with pytest.raises(DataError, match="outside|not inside"):
        data.repeated_tokens(4, 5, 20, vocab_max=30)


def write(tmp_path, rows):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return f


ROW = {"clean": [0, 5, 6, 5], "corrupted": [0, 7, 6, 5], "positions": [2]}


def test_jsonl_defaults_answers_to_next_token(tmp_path):
    ds = data.load_jsonl(write(tmp_path, [ROW, {**ROW, "clean": [0, 1, 2, 3]}]), d_vocab=10)
    assert ds.n == 2 and ds.seq_len == 4 and ds.wrong is None
    assert ds.answers.tolist() == [[5], [3]]


def test_jsonl_explicit_answers_and_wrong(tmp_path):
    rows = [{**ROW, "answers": [9], "wrong": [8]}] * 3
    ds = data.load_jsonl(write(tmp_path, rows), d_vocab=10, limit=2)
    assert ds.n == 2 and ds.answers.tolist() == [[9], [9]] and ds.wrong.tolist() == [[8], [8]]


@pytest.mark.parametrize("rows,needle", [
    ([{**ROW, "corrupted": [0, 7, 6]}, ROW], r"d.jsonl:1: clean has 4 tokens but corrupted has 3"),
    ([ROW, {**ROW, "clean": [0, 1, 2, 3, 4], "corrupted": [0, 1, 2, 3, 4]}], r"d.jsonl:2: clean has length 5"),
    ([ROW, "{not json"], r"d.jsonl:2: not valid JSON"),
    ([ROW, {**ROW, "extra": 1}], r"d.jsonl:2: unknown key"),
    ([ROW, {"clean": [1], "positions": [0]}], r"d.jsonl:2: missing 'corrupted'"),
    ([ROW, {**ROW, "clean": [0, 5, 6, 50]}], r"outside the vocabulary 0..9"),
    ([ROW, {**ROW, "positions": [7]}], r"positions \[7\] outside the prompt"),
    ([ROW, {**ROW, "positions": [3]}], r"every position needs a next token"),
    ([ROW, {**ROW, "answers": [1, 2]}], r"'answers' needs one token per position"),
    ([ROW, {**ROW, "wrong": [1]}], r"give 'wrong' on every line or on none"),
    ([ROW, {**ROW, "clean": "abc"}], r"must be a non-empty list of integers"),
    ([ROW], r"needs at least 2 prompts"),
])
def test_jsonl_errors(tmp_path, rows, needle):
    with pytest.raises(DataError, match=needle):
        data.load_jsonl(write(tmp_path, rows), d_vocab=10)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found"):
        data.load_jsonl(tmp_path / "none.jsonl", 10)
