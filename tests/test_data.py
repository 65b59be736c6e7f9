"""Datasets: the repeated-tokens generator and the JSONL prompt format."""

import json

import pytest
import torch

from harness.data import dataset as data
from harness.errors import DataError


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
    rows = [{**ROW, "answers": [9], "wrong": [8]}, {**ROW, "answers": [7], "wrong": [6]}, ROW]
    ds = data.load_jsonl(write(tmp_path, rows), d_vocab=10, limit=2)
    assert ds.n == 2 and ds.answers.tolist() == [[9], [7]] and ds.wrong.tolist() == [[8], [6]]


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
    with pytest.raises(DataError, match="cannot read the data file: no such file"):
        data.load_jsonl(tmp_path / "none.jsonl", 10)


def test_generator_corruptions_keep_the_first_half_prompts_and_vary_the_named_half():
    one = data.repeated_tokens(20, 6, 50, seed=4)
    three = data.repeated_tokens(20, 6, 50, seed=4, corruptions=("first_half", "second_half", "both"))
    assert list(three.corruptions) == ["first_half", "second_half", "both"] and three.default_corruption == "first_half"
    assert torch.equal(one.clean, three.clean)
    assert torch.equal(one.corrupted, three.corruptions["first_half"])  # adding corruptions changes nothing else
    first, second = three.clean[:, 1:7], three.clean[:, 7:]
    sh, both = three.corruptions["second_half"], three.corruptions["both"]
    assert torch.equal(sh[:, :7], three.clean[:, :7]) and (sh[:, 7:] != second).any(dim=1).all()
    assert torch.equal(both[:, 1:7], three.corruptions["first_half"][:, 1:7])
    assert torch.equal(both[:, 7:], sh[:, 7:]) and (both[:, 1:7] != first).any(dim=1).all()


def test_generator_reference_prompts_are_an_independent_split():
    ds = data.repeated_tokens(30, 6, 50, seed=4, n_reference=50)
    assert ds.reference.shape == (50, 13)
    assert torch.equal(ds.reference[:, 1:7], ds.reference[:, 7:]) and (ds.reference[:, 0] == data.BOS_TOKEN).all()
    clean_rows = {tuple(r) for r in ds.clean.tolist()}
    assert not any(tuple(r) in clean_rows for r in ds.reference.tolist())
    assert torch.equal(ds.reference, data.repeated_tokens(5, 6, 50, seed=4, n_reference=50).reference)


def test_generator_rejects_unknown_corruptions():
    with pytest.raises(DataError, match="unknown corruption.*allowed: first_half, second_half, both"):
        data.repeated_tokens(4, 5, 20, corruptions=("middle",))


def test_jsonl_named_corruptions_and_mean_from(tmp_path):
    rows = [{**ROW, "corrupted_swap": [0, 6, 5, 5]}, {**ROW, "clean": [0, 1, 2, 3], "corrupted_swap": [0, 2, 1, 3]}]
    ref = tmp_path / "ref.jsonl"
    ref.write_text("\n".join(json.dumps({"clean": c}) for c in ([0, 1, 1, 1], [0, 2, 2, 2], [0, 3, 3, 3])) + "\n")
    ds = data.load_jsonl(write(tmp_path, rows), d_vocab=10, mean_from=ref)
    assert list(ds.corruptions) == ["default", "swap"] and ds.default_corruption == "default"
    assert ds.corruptions["swap"].tolist() == [[0, 6, 5, 5], [0, 2, 1, 3]]
    assert ds.reference.tolist() == [[0, 1, 1, 1], [0, 2, 2, 2], [0, 3, 3, 3]]
    assert data.load_jsonl(write(tmp_path, rows), d_vocab=10).reference is None  # leave-one-out means


@pytest.mark.parametrize("rows,ref,needle", [
    ([{**ROW, "corrupted_swap": [0, 6, 5, 5]}, ROW], None, r"give 'corrupted_swap' on every line or on none"),
    ([{**ROW, "corrupted_a": [0, 6, 5, 5]}, {**ROW, "corrupted_b": [0, 6, 5, 5]}], None,
     r"give 'corrupted_a' on every line or on none"),
    ([{**ROW, "corrupted_swap": [0, 6, 5]}, ROW], None, r"d.jsonl:1: clean has 4 tokens but corrupted_swap has 3"),
    ([{**ROW, "corrupted-x": [0, 6, 5, 5]}, ROW], None, r"d.jsonl:1: unknown key\(s\) \['corrupted-x'\]"),
    ([{**ROW, "corrupted_default": [0, 6, 5, 5]}, ROW], None,
     r"d.jsonl:1: 'corrupted_default' would replace the default corruption: give those prompts as 'corrupted'"),
    ([ROW, {**ROW, "corrupted_x": [0, 6, 5, 5]}], None,
     r"d.jsonl:2: corrupted_<name> keys differ from the first line's \(none\); give the same ones on every line"),
    ([ROW, ROW], ['{"clean": [0, 1, 1]}', '{"clean": [0, 1, 1, 1]}'], r"ref.jsonl:1: clean has 3 tokens; the data's"),
    ([ROW, ROW], ['{"clean": [0, 1, 1, 1], "positions": [1]}', '{"clean": [0, 1, 1, 1]}'],
     r"ref.jsonl:1: a mean_from line is a JSON object with one key, 'clean'"),
    ([ROW, ROW], ['{"clean": [0, 1, 1, 99]}', '{"clean": [0, 1, 1, 1]}'], r"ref.jsonl:1: 'clean' has token ids \[99\]"),
])
def test_jsonl_corruption_and_reference_errors(tmp_path, rows, ref, needle):
    mean_from = None
    if ref is not None:
        mean_from = tmp_path / "ref.jsonl"
        mean_from.write_text("\n".join(ref) + "\n")
    with pytest.raises(DataError, match=needle):
        data.load_jsonl(write(tmp_path, rows), d_vocab=10, mean_from=mean_from)
