"""Text data: templates, lists and files of text prompts tokenised with the model's own
tokenizer; the distinct-token generator; `--data` for scan and roles; prompts in the report.

One tiny random GPT-2 with a word-level tokenizer (built with the `tokenizers` library on
the word list below, saved into the model directory) serves the module; nothing downloads.
Expected token ids come from WORDS directly, not from the harness."""

from __future__ import annotations

import itertools
import json
import random
import re
import shutil

import numpy as np
import pytest
import torch
import yaml

import harness
from harness.cli import main
from harness.data import dataset as data
from harness.data.examples import examples
from harness.engine.runner import build_dataset, load_model_cached
from harness.errors import DataError, SpecError
from harness.hypothesis.loading import load
from harness.model.tokenizer import model_tokenizer

from .conftest import FIXTURE
from .documents import hypothesis as document

NAMES = ["Mary", "John", "Alice", "Bob", "Eve", "Dan"]
WORDS = ["[BOS]", "[UNK]", "When", "and", "went", "to", "the", ",", "gave", "a", *NAMES, "store", "park", "drink",
         "book", "Ann"]
ID = {w: i for i, w in enumerate(WORDS)}
IOI = "When {IO} and {S} went to the {PLACE} , {S} gave a {OBJECT} to"


def ids(text: str, bos: bool = True) -> list[int]:
    """The expected token ids of `text` (words split at spaces)."""
    return ([ID["[BOS]"]] if bos else []) + [ID[w] for w in text.split()]


def save_word_model(folder, initializer_range: float = 1.0, adds_bos: bool = True):
    """A random GPT-2 and a word-level tokenizer over WORDS, saved into `folder`; the model.  The
    tokenizer puts [BOS] in front of every text by itself (as Llama's does) unless `adds_bos` is
    false (as GPT-2's: it names a BOS token and adds none)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(ID, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", ID["[BOS]"])])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", unk_token="[UNK]",
                                         eos_token="[BOS]", pad_token="[BOS]").save_pretrained(folder)
    cfg = transformers.GPT2Config(vocab_size=len(WORDS), n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                  bos_token_id=0, eos_token_id=0, initializer_range=initializer_range)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(folder)
    return hf


def oriented_rows(hf) -> list[dict]:
    """Text prompt pairs whose clean prompt gives the answer a higher log-prob than the
    corrupted one (as the GPT-2 itself computes it), so the clean-corrupted gap is positive."""
    rng = random.Random(0)
    rows = []
    for io, s in itertools.permutations(NAMES[:5], 2):
        a, b = rng.sample([n for n in NAMES if n not in (io, s)], 2)
        texts = [f"When {io} and {s} went to the store , {s} gave a drink to",
                 f"When {a} and {b} went to the store , {b} gave a drink to"]
        with torch.no_grad():
            lp = [hf(torch.tensor([ids(t)])).logits[0, -1].log_softmax(-1)[ID[io]].item() for t in texts]
        if abs(lp[0] - lp[1]) > 0.3:
            clean, corrupted = texts if lp[0] > lp[1] else texts[::-1]
            rows.append({"text": clean, "corrupted": corrupted, "answer": f" {io}", "wrong": f" {s}"})
    return rows[:16]


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    """(model directory, loaded model, oriented text prompts file)."""
    folder = tmp_path_factory.mktemp("words") / "m"
    hf = save_word_model(folder)
    rows = oriented_rows(hf)
    assert len(rows) == 16
    (folder / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, load_model_cached(str(folder), "cpu"), folder / "p.jsonl"


def template(**over) -> dict:
    d = {"template": IOI, "slots": {"IO": NAMES[:4], "S": NAMES[:4], "PLACE": ["store", "park"],
                                    "OBJECT": ["drink", "book"]},
         "answer": " {IO}", "wrong": " {S}", "corruptions": {"abc": {"IO": "new", "S": "new"},
                                                            "swap": {"IO": "S", "S": "IO"}},
         "n_prompts": 12}
    return d | over


class NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:
        return True


def dump(doc: dict) -> str:
    """YAML text of `doc`, a value used twice written out twice (hypothesis files refuse aliases)."""
    return yaml.dump(doc, Dumper=NoAliases, sort_keys=False)


def hypothesis(folder, data_: dict, **over) -> dict:
    return document(folder, [{"id": "e", "kind": "edge", "edge": "L0H1 -> L1H0.v", "expect": "used"}], name="text",
                    data=data_) | over


def dataset(word_model, data_: dict):
    folder, model, _ = word_model
    return build_dataset(load(hypothesis(folder, data_), base_dir=folder), model)


def words(row) -> list[str]:
    return [WORDS[i] for i in row.tolist()]


# --- the three text sources ---------------------------------------------------------------------------------------

def test_template_fills_slots_and_corrupts_them(word_model):
    ds = dataset(word_model, template())
    assert ds.n == 12 and list(ds.corruptions) == ["abc", "swap"] and ds.has_bos
    seen = set()
    for i in range(ds.n):
        clean = words(ds.clean[i])
        assert clean[0] == "[BOS]" and len(clean) == 15
        io, s, place, obj = clean[2], clean[4], clean[8], clean[13]
        assert clean == ["[BOS]"] + IOI.format(IO=io, S=s, PLACE=place, OBJECT=obj).split()
        assert io != s and {io, s} <= set(NAMES[:4])  # IO and S have the same list: kept different
        assert ds.positions[i].tolist() == [14]  # the last token
        assert ds.answers[i].tolist() == [ID[io]] and ds.wrong[i].tolist() == [ID[s]]
        swap = words(ds.corruptions["swap"][i])
        assert swap == ["[BOS]"] + IOI.format(IO=s, S=io, PLACE=place, OBJECT=obj).split()
        abc = words(ds.corruptions["abc"][i])
        io2, s2 = abc[2], abc[4]
        assert {io2, s2}.isdisjoint({io, s}) and io2 != s2 and io2 in NAMES[:4]  # new: unused by the clean prompt
        assert abc == ["[BOS]"] + IOI.format(IO=io2, S=s2, PLACE=place, OBJECT=obj).split()
        seen.add(tuple(clean))
    assert len(seen) == 12  # distinct fillings
    assert ds.reference.shape == (12, 15) and (ds.reference[:, 0] == 0).all()
    again = dataset(word_model, template())
    assert torch.equal(again.clean, ds.clean) and torch.equal(again.corruptions["abc"], ds.corruptions["abc"])
    assert not torch.equal(dataset(word_model, template(seed=1)).clean, ds.clean)
    assert not torch.equal(dataset(word_model, template(split="explore")).clean, ds.clean)
    only_swap = dataset(word_model, template(corruptions={"swap": {"IO": "S", "S": "IO"}}))
    assert torch.equal(only_swap.clean, ds.clean)  # the clean draw does not depend on the corruptions
    assert "template 'When {IO} and {S}" in ds.description and "corruption abc: IO new, S new" in ds.description


def test_template_marker_scores_the_token_before_it(word_model):
    ds = dataset(word_model, template(template="When {IO} and {S} went to the {PLACE}{@} , {S} gave a {OBJECT} to",
                                      answer=None, wrong=None, prepend_bos=False))
    assert not ds.has_bos and ds.wrong is None
    for i in range(ds.n):
        clean = words(ds.clean[i])
        assert clean[0] == "When" and len(clean) == 14  # the marker is removed; no BOS
        assert ds.positions[i].tolist() == [7] and clean[7] in ("store", "park")
        assert ds.answers[i].tolist() == [ID[","]]  # the first token after the marker


def test_template_default_different_and_explicit_groups(word_model):
    same = dataset(word_model, template(slots={"IO": NAMES[:3], "S": NAMES[:3], "PLACE": ["store"],
                                               "OBJECT": ["drink"]}, n_prompts=6, corruptions={"swap": {"IO": "S"}}))
    pairs = {(words(c)[2], words(c)[4]) for c in same.clean}
    assert len(pairs) == 6 and all(a != b for a, b in pairs)  # 3 x 2 fillings, never IO = S
    assert same.shared_reference == 6  # all 6 fillings are reference prompts too (engine.measure warns for means)
    free = dataset(word_model, template(slots={"IO": NAMES[:3], "S": NAMES[:3], "PLACE": ["store"],
                                               "OBJECT": ["drink"]}, different=[], n_prompts=9,
                                        corruptions={"swap": {"IO": "S"}}))
    assert len({(words(c)[2], words(c)[4]) for c in free.clean}) == 9  # different: [] allows IO = S


def test_prompt_list_and_text_file(word_model, tmp_path):
    texts = ["When Mary and John went to the store , John gave a drink to",
             "When Eve and Dan went to the park , Dan gave a book to"]
    bad = ["When Bob and Alice went to the store , Alice gave a drink to",
           "When Ann and Bob went to the park , Bob gave a book to"]
    prompts = [{"text": t, "corrupted": c, "answer": f" {t.split()[1]}", "corrupted_late": c.replace(" to", " a")}
               for t, c in zip(texts, bad, strict=True)]
    listed = dataset(word_model, {"prompts": prompts})
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(p) for p in prompts) + "\n\n")
    (tmp_path / "ref.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in bad))
    filed = dataset(word_model, {"file": str(f), "mean_from": str(tmp_path / "ref.jsonl")})
    for ds in (listed, filed):
        assert ds.clean.tolist() == [ids(t) for t in texts]
        assert list(ds.corruptions) == ["default", "late"]
        assert ds.corruptions["default"].tolist() == [ids(t) for t in bad]
        assert ds.corruptions["late"].tolist() == [ids(t.replace(" to", " a")) for t in bad]
        assert ds.positions.tolist() == [[14], [14]] and ds.answers.tolist() == [[ID["Mary"]], [ID["Eve"]]]
        assert ds.wrong is None
    assert listed.reference is None and filed.reference.tolist() == [ids(t) for t in bad]
    assert "text file p.jsonl: 2 prompts" in filed.description
    no_bos = dataset(word_model, {"file": str(f), "prepend_bos": False})
    assert no_bos.clean.tolist() == [ids(t, bos=False) for t in texts] and not no_bos.has_bos


def test_token_id_files_still_load_and_refuse_prepend_bos(word_model, tmp_path):
    f = tmp_path / "ids.jsonl"
    f.write_text('{"clean": [0, 2, 10], "corrupted": [0, 2, 11], "positions": [2], "answers": [3]}\n'
                 '{"clean": [0, 2, 12], "corrupted": [0, 2, 13], "positions": [2], "answers": [3]}\n')
    assert dataset(word_model, {"file": str(f)}).clean.tolist() == [[0, 2, 10], [0, 2, 12]]
    with pytest.raises(SpecError, match=r"data.prepend_bos: applies to text prompts, and .*ids.jsonl holds token ids"):
        dataset(word_model, {"file": str(f), "prepend_bos": True})


# --- refusals -------------------------------------------------------------------------------------------------------

def test_clean_and_corrupted_of_different_lengths_are_refused_with_their_tokens(word_model, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "When Mary went to", "corrupted": "When Mary Ann went to", "answer": " John"})
                 + "\n" + json.dumps({"text": "When Eve went to", "corrupted": "When Dan went to", "answer": " a"}))
    with pytest.raises(DataError) as e:
        dataset(word_model, {"file": str(f)})
    assert str(e.value) == (
        f"{f}:1: the clean and corrupted prompts tokenise to different lengths; clean 'When Mary went to': 5 tokens "
        "['[BOS]', 'When', 'Mary', 'went', 'to']; corrupted 'When Mary Ann went to': 6 tokens ['[BOS]', 'When', "
        "'Mary', 'Ann', 'went', 'to']; a corrupted prompt must have as many tokens as its clean prompt (choose "
        "values of the same token length)")
    with pytest.raises(DataError, match=r"data.template \(IO = '.*'\): the clean and corruption abc prompts "
                                        r"tokenise to different lengths; .*'Mary', 'Ann'"):
        dataset(word_model, template(slots={"IO": ["Mary", "John"], "S": ["Eve", "Dan", "Mary Ann"],
                                            "PLACE": ["store"], "OBJECT": ["drink"]},
                                     corruptions={"abc": {"S": "new"}}, n_prompts=2, seed=3))


def test_multi_token_answers_are_refused_with_their_tokens(word_model):
    doc = hypothesis(word_model[0], template(answer=" {IO} Ann"))
    h = load(doc, base_dir=word_model[0])
    with pytest.raises(DataError) as e:
        build_dataset(h, word_model[1])
    assert str(e.value).startswith("data.answer: ' ")
    assert " Ann' (IO = '" in str(e.value) and "is 2 tokens [" in str(e.value) and ", 'Ann']; an answer or wrong " \
        "token must be exactly one token of the model's tokenizer (multi-token answers are not scored)" in str(e.value)
    prompts = [{"text": "When Mary went to", "corrupted": "When Eve went to", "answer": " John", "wrong": "Mary Ann"},
               {"text": "When Dan went to", "corrupted": "When Bob went to", "answer": " John", "wrong": " Eve"}]
    with pytest.raises(DataError, match=r"^data.prompts\[0\].wrong: 'Mary Ann' is 2 tokens \['Mary', 'Ann'\]"):
        dataset(word_model, {"prompts": prompts})


def test_prompts_of_different_lengths_are_refused_with_both(word_model):
    prompts = [{"text": "When Mary went to", "corrupted": "When Eve went to", "answer": " John"},
               {"text": "When Mary Ann went to", "corrupted": "When Eve Ann went to", "answer": " John"}]
    with pytest.raises(DataError) as e:
        dataset(word_model, {"prompts": prompts})
    assert str(e.value) == (
        "data.prompts[1]: prompts tokenise to different lengths: 5 tokens for 'When Mary went to' (data.prompts[0]) "
        "but 6 for 'When Mary Ann went to': 5 tokens ['[BOS]', 'When', 'Mary', 'went', 'to'] vs 6 tokens ['[BOS]', "
        "'When', 'Mary', 'Ann', 'went', 'to']; all prompts of a dataset must have the same number of tokens")


def test_marker_inside_a_token_and_too_few_fillings(word_model):
    with pytest.raises(DataError, match=r"the marker \{@\} is not at a token boundary in 'When .* the text before "
                                        r"it is 14 tokens \[.*'a', '\[UNK\]'\], the prompt 15 tokens"):
        dataset(word_model, template(template="When {IO} and {S} went to the {PLACE} , {S} gave a dr{@}ink to",
                                     slots={"IO": NAMES[:2], "S": NAMES[:2], "PLACE": ["store"]}, n_prompts=2,
                                     answer=None, wrong=None, corruptions={"swap": {"IO": "S", "S": "IO"}}))
    with pytest.raises(DataError, match=r"^data.n_prompts: 13 prompts asked for, but the template has only 12 "
                                        r"distinct fillings \(IO 4 x S 4 x PLACE 1 x OBJECT 1 values; IO, S "
                                        r"different\)"):
        dataset(word_model, template(slots={"IO": NAMES[:4], "S": NAMES[:4], "PLACE": ["store"], "OBJECT": ["book"]},
                                     n_prompts=13))


def test_text_data_needs_a_tokenizer(word_model, tmp_path, capsys):
    """The native fixture has none; neither has a Hugging Face directory without tokenizer
    files (transformers then attaches an empty stand-in)."""
    h = tmp_path / "h.yaml"
    h.write_text(dump(hypothesis(FIXTURE, template(), claims=[
        {"id": "e", "kind": "edge", "edge": "L0H1 -> L1H0.v", "expect": "used"}])))
    assert main(["run", str(h), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"error: {h}:5: data.template: text data needs a tokenizer, and the model {FIXTURE} has none" in err
    assert "Traceback" not in err and not (tmp_path / "r").exists()
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(word_model[0] / name, bare / name)
    assert model_tokenizer(harness.load_model(bare)) is None
    with pytest.raises(DataError, match=f"data.prompts: text data needs a tokenizer, and the model {bare} has none"):
        build_dataset(load(hypothesis(bare, {"prompts": [{"text": "a", "corrupted": "b", "answer": "c"}] * 2})),
                      harness.load_model(bare))


@pytest.mark.parametrize("data_,key,needle", [
    (template(template="When {IO} and {S {"), "  template:", "data.template: '{' at character 15 is not part of a "
                                                             "slot"),
    (template(template="When {IO} and {X} went"), "  slots:", "data.slots: the template uses slot(s) X that 'slots' "
                                                              "does not define"),
    (template(slots={"IO": NAMES, "S": NAMES, "PLACE": ["a"], "OBJECT": ["b"], "Y": ["c"]}), "  slots:",
     "data.slots: slot(s) Y are not used in the template"),
    (template(corruptions={"abc": {"IO": "T"}}), "  corruptions:", "data.corruptions: corruption 'abc': IO: 'T' must "
                                                                   "be 'new'"),
    (template(answer=None), "data:", "data: give 'answer' (the correct next token after the prompt), or mark"),
    (template(different=[["IO", "Q"]]), "  different:", "data.different: ['IO', 'Q']: Q is not a slot"),
    ({"prompts": [{"text": "a", "corrupted": "b", "answer": "c", "corrupted_x": "d"},
                  {"text": "a", "corrupted": "b", "answer": "c"}]}, "data:",
     "data: prompts[1] has corrupted_<name> keys [], prompts[0] has ['corrupted_x']"),
    ({"prompts": [{"text": "a", "corrupted": "b", "answer": "c", "extra": 1}] * 2}, "  - text: a",
     "data.prompts[0]: unknown key(s) ['extra']"),
    ({"template": "x {A}", "file": "p.jsonl"}, "data:", "data: give exactly one of 'generator' (built-in), 'file'"),
])
def test_schema_errors_name_the_line_without_torch(tmp_path, data_, key, needle):
    h = tmp_path / "h.yaml"
    text = dump(hypothesis(FIXTURE, data_))
    h.write_text(text)
    line = 1 + next(i for i, t in enumerate(text.splitlines()) if t.startswith(key))
    with pytest.raises(SpecError) as e:
        load(h)
    assert f"{h}:{line}: {needle}" in str(e.value), str(e.value)


def test_validating_text_data_imports_no_torch(tmp_path):
    """`harness validate` checks a template and a prompt list without torch or tokenizers."""
    import subprocess
    import sys

    h = tmp_path / "h.yaml"
    h.write_text(dump(hypothesis(FIXTURE, template())))
    p = tmp_path / "p.yaml"
    p.write_text(dump(hypothesis(FIXTURE, {"prompts": [{"text": "a", "corrupted": "b", "answer": "c"}] * 2})))
    code = ("import sys; from harness.cli import main; assert main(['validate', sys.argv[1], sys.argv[2]]) == 0; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'tokenizers'}))")
    out = subprocess.run([sys.executable, "-c", code, str(h), str(p)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]"


# --- end to end ------------------------------------------------------------------------------------------------------

def test_run_on_a_text_file_reports_prompts_as_text(word_model, tmp_path, capsys):
    folder, _, prompts = word_model
    h = tmp_path / "h.yaml"
    h.write_text(dump(hypothesis(folder, {"file": str(prompts)}, metric="logit_diff")))
    code = main(["run", str(h), "--out", str(tmp_path / "r")])
    assert code in (0, 1), capsys.readouterr().err
    ev = json.loads((tmp_path / "r" / "evidence.json").read_text())
    first = json.loads(prompts.read_text().splitlines()[0])
    ex = ev["data"]["examples"][0]
    assert "".join(ex["clean"]) == "[BOS] " + first["text"] and ex["positions"] == [14]
    assert ex["answers"] == [first["answer"].strip()] and ex["wrong"] == [first["wrong"].strip()]
    assert "".join(ex["corrupted"]["default"]) == "[BOS] " + first["corrupted"]
    md = (tmp_path / "r" / "report.md").read_text()
    section = md[md.index("### Prompts"):md.index("## Provenance")]
    head = first["text"].rsplit(" ", 1)[0]
    assert f"1. clean: [BOS] {head} **to** → `{first['answer'].strip()}` (wrong: `{first['wrong'].strip()}`)" \
        in section
    assert f"    - default: [BOS] {first['corrupted'].rsplit(' ', 1)[0]} **to**" in section
    assert "<strong>to</strong>" in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.slow
def test_run_on_a_template_writes_its_prompts(word_model, tmp_path):
    folder = word_model[0]
    h = tmp_path / "h.yaml"
    h.write_text(dump(hypothesis(folder, template(), metric="logit_diff")))
    assert main(["run", str(h), "--out", str(tmp_path / "r")]) in (0, 1, 3)  # 3: a random model's gap is small
    md = (tmp_path / "r" / "report.md").read_text()
    assert "### Prompts" in md and "    - abc: [BOS] When " in md and "    - swap: [BOS] When " in md
    assert md.count(" **to** → `") == 3
    ev = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert ev["data"]["description"].startswith("template 'When {IO}") and ev["data"]["seq_len"] == 15
    assert ev["settings"]["mean_ablation_reference"].startswith("12 reference prompts (fillings of the template")


def test_scan_numbers_equal_the_run_edge_claims(word_model, tmp_path):
    """The same text file through `harness scan --data` and through edge claims: equal point
    estimates (effect, raw change, change where the receiver reads).  The intervals differ
    by design: the scan draws 1000 bootstrap resamples from its own streams, a run 2000
    from each claim's."""
    from harness.tools.scan import scan

    folder, _, prompts = word_model
    edges = ["L0H1 -> L1H0.v", "embed -> L1H1.k", "L1H0 -> logits"]
    ev = harness.run(hypothesis(folder, {"file": str(prompts)}, claims=[
        {"id": f"e{i}", "kind": "edge", "edge": e, "expect": "used"} for i, e in enumerate(edges)]), device="cpu")
    rows, _ = scan(str(folder), tmp_path / "s", draws=99, bootstrap=100, data_file=prompts)
    by = {r["edge"]: r for r in rows}
    assert ev.claims[0].value is not None and abs(ev.claims[0].value) > 0.05  # a defined, non-zero effect
    for c in ev.claims:
        r, d = by[c.details.edge], c.details
        assert r["effect"] == pytest.approx(c.value, abs=1e-9)
        assert r["raw_change"] == pytest.approx(d.change_mean, abs=1e-9)
        assert r["relative_change"] == pytest.approx(d.intervention_change.relative_change, abs=1e-9)
    starter = yaml.safe_load((tmp_path / "s" / "starter.yaml").read_text())
    assert starter["data"] == {"file": str(prompts.resolve())}


def test_scan_and_roles_take_a_yaml_data_file(word_model, tmp_path, capsys):
    folder = word_model[0]
    d = tmp_path / "d.yaml"
    d.write_text(dump({"data": template()}))
    assert main(["scan", str(folder), "--data", str(d), "--draws", "99", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "template 'When {IO} and {S}" in out and "split explore" in out
    # a random-weight model: a corruption whose gap is negative or small is listed as not used, with why
    skipped = {c for c in ("abc", "swap") if f"not used: corruption {c}: mean clean-corrupted gap" in out}
    used = [c for c in ("abc", "swap") if c not in skipped]
    assert f"x {len(used)} corruption(s) ({', '.join(used)};" in out
    starter = yaml.safe_load((tmp_path / "s" / "starter.yaml").read_text())
    want = template(split="test")  # the held-out split, without the corruptions the scan could not use
    want["corruptions"] = {k: v for k, v in want["corruptions"].items() if k not in skipped}
    assert starter["data"] == want
    load(tmp_path / "s" / "starter.yaml")
    assert main(["roles", str(folder), "--data", str(d)]) == 0
    out = capsys.readouterr().out
    assert "split explore" in out and "L1H1" in out
    assert main(["roles", str(folder), "--data", str(d), "--split", "test"]) == 0
    assert "split test" in capsys.readouterr().out
    d.write_text("data:\n  template: 'x {A}'\n  slots: {A: [a]}\n  corruptions: {c: {A: nope}}\n  answer: a\n")
    assert main(["scan", str(folder), "--data", str(d), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"error: {d}:4: data.corruptions: corruption 'c': A: 'nope' must be 'new'" in err
    assert not (tmp_path / "x").exists()
    d.write_text("harness: 1\n")
    assert main(["roles", str(folder), "--data", str(d)]) == 2
    assert f"{d}:1: (top level): a data file is a YAML mapping with a 'data' key" in capsys.readouterr().err


# --- the distinct-token generator -----------------------------------------------------------------------------------

@pytest.mark.parametrize("d_vocab", [23, 5000])  # a range below 8 x L^2 (permutations) and above it (rejection)
def test_distinct_generator(d_vocab):
    L = 10
    ds = data.repeated_tokens(60, L, d_vocab, seed=4, corruptions=("first_half", "second_half", "both"),
                              n_reference=30, distinct=True)
    S = ds.clean[:, 1:L + 1]
    assert torch.equal(ds.clean[:, L + 1:], S) and (ds.clean[:, 0] == 0).all()
    for seg in (S, ds.corruptions["first_half"][:, 1:L + 1], ds.corruptions["second_half"][:, L + 1:],
                ds.reference[:, 1:L + 1]):
        assert all(len(set(row.tolist())) == L for row in seg)  # no token twice in a segment
        assert ((seg >= 1) & (seg < d_vocab)).all()
    assert not (ds.corruptions["first_half"][:, 1:L + 1] == S).any()  # differs at every position
    assert not (ds.corruptions["second_half"][:, L + 1:] == S).any()
    assert not (ds.corruptions["both"][:, 1:L + 1] == S).any() and not (ds.corruptions["both"][:, L + 1:] == S).any()
    assert torch.equal(ds.corruptions["second_half"][:, :L + 1], ds.clean[:, :L + 1])
    assert ds.description.endswith("; distinct tokens")
    with pytest.raises(DataError, match=r"a segment of 10 tokens needs at least 10 tokens to draw from; the range "
                                        r"\[1, 10\) has 9"):
        data.repeated_tokens(4, L, 10, distinct=True)


def test_default_generator_keeps_its_numbers():
    """`distinct: false` (the default) draws what it always drew (docs/data-format.md's example)."""
    ds = data.repeated_tokens(2, 4, d_vocab=10, seed=0, corruptions=("first_half", "second_half", "both"),
                              n_reference=2)
    assert ds.clean.tolist() == [[0, 1, 4, 2, 3, 1, 4, 2, 3], [0, 2, 7, 4, 8, 2, 7, 4, 8]]
    assert ds.corruptions["first_half"].tolist() == [[0, 1, 7, 7, 4, 1, 4, 2, 3], [0, 7, 3, 2, 4, 2, 7, 4, 8]]
    assert ds.corruptions["both"].tolist() == [[0, 1, 7, 7, 4, 6, 8, 7, 3], [0, 7, 3, 2, 4, 2, 9, 3, 7]]
    assert ds.reference.tolist() == [[0, 3, 8, 8, 4, 3, 8, 8, 4], [0, 7, 8, 7, 5, 7, 8, 7, 5]]


def test_distinct_in_a_hypothesis_and_generator_examples(word_model, fixture_model):
    gen = {"generator": "repeated_tokens", "n_prompts": 5, "segment_length": 6, "distinct": True}
    ds = dataset(word_model, gen)
    assert all(len(set(r.tolist())) == 6 for r in ds.clean[:, 1:7])
    shown = examples(ds, model_tokenizer(word_model[1]))  # decoded with the model's tokenizer
    assert len(shown) == 3 and shown[0]["clean"][0] == "[BOS]"
    assert shown[0]["clean"][1:] == [" " + WORDS[t] for t in ds.clean[0, 1:].tolist()]
    assert shown[0]["answers"] == [WORDS[t] for t in ds.answers[0].tolist()]
    plain = examples(data.repeated_tokens(4, 3, 20, seed=1), None)  # no tokenizer: token ids
    assert plain[0]["clean"] == data.repeated_tokens(4, 3, 20, seed=1).clean[0].tolist()
    assert model_tokenizer(fixture_model) is None


# --- the report ------------------------------------------------------------------------------------------------------

def test_prompts_render_literally():
    """Prompt text is input: markup in it renders as text, only the scored token is bold."""
    import markdown

    from harness.report.prompts import prompt_lines

    hostile = ["<script>alert(1)</script>", " *not*", " [x](javascript:alert(1))", " _y_", " **", " \\"]
    lines = prompt_lines([{"clean": hostile, "corrupted": {"<b>c</b>": hostile}, "positions": [4],
                           "answers": ["`a`"], "wrong": None}], 9)
    page = markdown.markdown("\n".join(lines))
    assert "<script>" not in page and "<b>" not in page and "<a " not in page and "<em>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; *not* [x](javascript:alert(1)) _y_ <strong>**</strong> \\" in page
    assert page.count("<strong>") == 2 and "&lt;b&gt;c&lt;/b&gt;:" in page
    ids = prompt_lines([{"clean": [0, 5, 9], "corrupted": {}, "positions": [1], "answers": [9], "wrong": [3]}], 2)
    assert "1. clean: 0 **5** 9 → `9` (wrong: `3`)" in ids and "as token ids" in ids[2]


# --- the BOS token: as the tokenizer does by itself, the same in every command ----------------------------------

@pytest.fixture(scope="module")
def gpt2_like(tmp_path_factory):
    """(folder, loaded model, unused) of a word model whose tokenizer names [BOS] and adds none (as GPT-2's,
    Pythia's and SmolLM2's do)."""
    folder = tmp_path_factory.mktemp("plain") / "m"
    save_word_model(folder, adds_bos=False)
    return folder, load_model_cached(str(folder), "cpu"), None


def test_prompts_get_the_bos_token_only_where_the_tokenizer_adds_it(word_model, gpt2_like):
    from harness.model.tokenizer import start_words

    bos = ID["[BOS]"]
    words_ = len(IOI.split())  # the word-level tokenizer: one token a word
    for model, adds in ((word_model, True), (gpt2_like, False)):
        assert model_tokenizer(model[1]).adds_bos is adds and model_tokenizer(model[1]).bos == bos
        ds = dataset(model, template())
        assert ds.has_bos is adds and bool((ds.clean[:, 0] == bos).all()) is adds
        assert ds.clean.shape[1] == words_ + int(adds)  # and [BOS] where the tokenizer adds it
        gen = dataset(model, {"generator": "repeated_tokens", "n_prompts": 8, "segment_length": 4})
        assert gen.has_bos is adds and gen.clean.shape[1] == 8 + int(adds)
        assert ("[BOS=0] + S + S" in gen.description) is adds and ("no start token" in gen.description) is not adds
        assert start_words(model[1], ds) == ("BOS '[BOS]' (id 0) in front" if adds else "no BOS token in front")
    # asked for, the tokenizer's BOS token goes in front all the same
    ds = dataset(gpt2_like, template(prepend_bos=True))
    assert ds.has_bos and bool((ds.clean[:, 0] == bos).all())
    gen = dataset(gpt2_like, {"generator": "repeated_tokens", "n_prompts": 8, "segment_length": 4, "bos": True})
    assert gen.has_bos and bool((gen.clean[:, 0] == bos).all())


def test_roles_scan_and_run_start_their_prompts_alike(gpt2_like, word_model):
    """`harness roles` and `harness scan` build the generator's prompts with the start token `harness run` uses."""
    from harness.tools.roles_table import role_table
    from harness.tools.scan import ScanSettings, explore_dataset

    for model in (gpt2_like, word_model):
        m = model[1]
        run = dataset(model, {"generator": "repeated_tokens", "n_prompts": 8, "segment_length": 4})
        table = role_table(m, n_prompts=8, segment_length=4, seed=0, split="test")
        assert table.startswith(run.description.split(" with ")[0])  # "repeated_tokens: 8 prompts, <start> + S + S"
        scanned, _ = explore_dataset(m, ScanSettings(n_prompts=8, segment_length=4, seed=0), None)
        assert scanned.has_bos == run.has_bos and scanned.start_token() == run.start_token()


# --- corrupting one occurrence of a slot ----------------------------------------------------------------------------

def test_a_corruption_of_one_occurrence_leaves_the_others_clean(word_model):
    """`S#2: new` replaces the second S only (Wang et al.'s S2 corruption); the slots' spans are
    those of the clean prompt, so attention claims can still name S#1 and S#2."""
    d = template(corruptions={"s2": {"S#2": "new"}, "s2_io": {"S#2": "IO"}, "abc": {"IO": "new", "S": "new"}})
    ds = dataset(word_model, d)
    clean = [words(r) for r in ds.clean]
    s2 = [words(r) for r in ds.corruptions["s2"]]
    swap = [words(r) for r in ds.corruptions["s2_io"]]
    first, second = IOI.split().index("{S}"), len(IOI.split()) - 1 - IOI.split()[::-1].index("{S}")
    off = int(ds.has_bos)
    for c, x, y in zip(clean, s2, swap, strict=True):
        changed = [i - off for i, (a, b) in enumerate(zip(c, x, strict=True)) if a != b]
        assert changed == [second]  # the second S alone
        assert x[second + off] not in (c[first + off], c[IOI.split().index("{IO}") + off])  # a name the prompt lacks
        assert y[second + off] == c[IOI.split().index("{IO}") + off] and y[first + off] == c[first + off]
    assert set(ds.spans) >= {"S#1", "S#2", "IO#1"}
    assert bool((ds.spans["S#2"][:, 0] == second + off).all())


@pytest.mark.parametrize(("change", "message"), [
    ({"S#3": "new"}, "'S#3': the template uses S 2 time(s)"),
    ({"S#0": "new"}, "an occurrence is written NAME#k with k = 1, 2"),
    ({"S#x": "new"}, "an occurrence is written NAME#k with k = 1, 2"),
    ({"S": "new", "S#2": "IO"}, "change the slot or one of its occurrences, not both"),
    ({"Q#1": "new"}, "'Q' is not a slot"),
])
def test_occurrence_corruptions_are_checked(word_model, change, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        dataset(word_model, template(corruptions={"c": change}))


# --- the head table of `harness roles` ------------------------------------------------------------------------------

def test_the_head_table_against_transformer_lens_by_hand(tmp_path, capsys, monkeypatch):
    """Each head's direct effect is the fraction of the gap its write carries straight to the logits:
    TransformerLens by hand (the final residual minus the head's clean-minus-corrupted write, at
    blocks.{L-1}.hook_resid_post, which only the final norm and unembedding read) is the oracle; the
    attention to S#2 is the pattern summed over the second S's tokens."""
    from harness.engine.runner import load_model_cached
    from harness.model.metrics import per_prompt
    from harness.tools import roles_table

    names_dir = FIXTURE.parent / "names-3l"
    d = tmp_path / "ioi.yaml"
    people = ["Mary", "John", "Alice", "Bob", "Tom", "Anna"]
    d.write_text(dump({"data": {"template": IOI, "slots": {"IO": people, "S": people, "PLACE": ["store", "park"],
                                                           "OBJECT": ["drink", "book"]},
                                "answer": " {IO}", "wrong": " {S}", "prepend_bos": True,
                                "corruptions": {"abc": {"IO": "new", "S": "new"}}, "n_prompts": 24}}))
    from harness.engine.data_source import from_data_file

    m = load_model_cached(str(names_dir), "cpu")
    given = from_data_file(d, "explore")
    t = roles_table.head_table(m, n_prompts=24, segment_length=4, seed=0, split="explore", given=given)
    assert t.metric == "logit_diff" and [c.name for c in t.columns][:1] == ["direct"]
    from harness.engine import data_source

    ds = data_source.build_dataset(*given, m)
    bridge, L = m.bridge, m.n_layers
    with torch.no_grad():
        _, clean = bridge.run_with_cache(ds.clean)
        _, corr = bridge.run_with_cache(ds.corrupted)

        def metric(tokens, hooks=(), name="logit_diff"):
            logits = bridge.run_with_hooks(tokens, fwd_hooks=list(hooks))
            return per_prompt(logits, ds.positions, ds.answers, name, ds.wrong).double().numpy()

        m_clean, m_corr = metric(ds.clean), metric(ds.corrupted)
        parts = sum(metric(ds.clean, name=n) for n in ("answer_logit", "wrong_logit"))
        np.testing.assert_allclose(parts, m_clean, rtol=0, atol=1e-5)  # the two parts add up to logit_diff
        col = {c.name: c for c in t.columns}
        for i, h in enumerate(t.heads):
            z = f"blocks.{h.layer}.attn.hook_z"
            delta = (clean[z][:, :, h.head] - corr[z][:, :, h.head]) @ bridge.W_O[h.layer, h.head]
            m_h = metric(ds.clean, [(f"blocks.{L - 1}.hook_resid_post", lambda x, hook, dl=delta: x - dl)])
            want = (m_clean - m_h).sum() / (m_clean - m_corr).sum()
            assert col["direct"].mean[i] == pytest.approx(want, abs=1e-4), h  # float32 logits of a gap of ~nats
            # the answer's part: the same patch read on the answer's logit alone, over the logit_diff gap
            hook = [(f"blocks.{L - 1}.hook_resid_post", lambda x, hook, dl=delta: x - dl)]
            part = (metric(ds.clean, name="answer_logit") - metric(ds.clean, hook, "answer_logit")).sum()
            assert col["direct via answer_logit"].mean[i] == pytest.approx(part / (m_clean - m_corr).sum(), abs=1e-4)
            assert col["direct via answer_logit"].mean[i] + col["direct via wrong_logit"].mean[i] == pytest.approx(
                col["direct"].mean[i], abs=1e-9)
            assert col["direct"].low[i] <= col["direct"].mean[i] <= col["direct"].high[i]
            pat = clean[f"blocks.{h.layer}.attn.hook_pattern"][:, h.head]
            span = ds.spans["S#2"]
            att = np.array([pat[n, ds.positions[n, 0], span[n, 0]:span[n, 1]].sum().item() for n in range(ds.n)])
            assert col["attn S#2"].mean[i] == pytest.approx(att.mean(), abs=1e-6)
    # L2H0, the suppression head of the fixture, attends to S#2 and carries the most
    order = roles_table.ordered(t, "direct", 1)
    assert str(t.heads[order[0]]) == "L2H0" and col["attn S#2"].mean[order[0]] > 0.9
    # the command: sorted, cut, written
    assert main(["roles", str(names_dir), "--data", str(d), "--sort", "S#2", "--top", "3", "--out",
                 str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    rows = [line.split()[0] for line in text.splitlines() if line.startswith("L") and line[1].isdigit()]
    assert rows[0] == "L2H0" and len(rows) == 3
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"heads.csv", "heads.json", "heads.png"}
    doc = json.loads((tmp_path / "out" / "heads.json").read_text())
    assert len(doc["heads"]) == len(t.heads) and doc["heads"][0]["head"] == "L2H0"
    # what the table stands on, above its rows: the behaviour (answer above wrong) and the gap
    assert doc["behaviour"] == t.behaviour and doc["behaviour"]["compared"] == "answer above wrong"
    assert doc["gap"]["ci"][0] > 0 and "warning" not in text.split("head ")[0]
    assert f"behaviour on the {ds.n} clean prompts: accuracy (answer above wrong)" in text
    assert f"clean - corrupted gap {t.gap['mean']:.4g}" in text
    assert roles_table.SINK in text.split("head ")[0]  # the first_token column is named for what it mostly is
    assert main(["roles", str(names_dir), "--data", str(d), "--sort", "nope"]) == 2
    capsys.readouterr()
    # --no-direct: the same attention and role columns from the clean run alone, no corrupted run
    from harness import cost

    with cost.counting(ds.n) as ledger:
        alone = roles_table.head_table(m, n_prompts=24, segment_length=4, seed=0, split="explore", given=given,
                                       direct=False)
    assert ledger.total == pytest.approx(1.0)  # one forward of the prompts
    assert [c.name for c in alone.columns] == [c.name for c in t.columns if not c.name.startswith("direct")]
    for c in alone.columns:
        np.testing.assert_array_equal(c.mean, col[c.name].mean)
    assert alone.metric is None and "--no-direct" in alone.note
    assert alone.behaviour["clean"] == t.behaviour["clean"] and alone.behaviour["corrupted"] == {}  # the same run
    monkeypatch.chdir(tmp_path)  # without --out, rows --top leaves out go to a new folder under reports/
    assert main(["roles", str(names_dir), "--data", str(d), "--no-direct", "--top", "2"]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("head "))
    assert "direct" not in header and "attn S#2" in header
    (kept,) = (tmp_path / "reports").iterdir()
    assert kept.name.startswith("roles-") and text.splitlines()[-1] == (
        f"{len(t.heads) - 2} rows left out by --top: every row is in reports/{kept.name}/ "
        "(heads.csv, heads.json, heads.png)")
    assert len(json.loads((kept / "heads.json").read_text())["heads"]) == len(t.heads)
    assert main(["roles", str(names_dir), "--data", str(d), "--no-direct"]) == 0  # every row printed: nothing written
    assert len(list((tmp_path / "reports").iterdir())) == 1 and "rows left out" not in capsys.readouterr().out


PALS = [{"text": "Mary", "pal": "Ann"}, {"text": "John", "pal": "Bob"}, {"text": "Alice", "pal": "Eve"},
        {"text": "Dan", "pal": "park"}]  # distinct pals


def test_record_slots_keep_their_fields_together(word_model):
    """A slot of records: `{IO}` shows a record's text, `{IO.pal}` its field, in the template and the
    answer alike; `new` draws a whole record (its fields follow it) and the clean answer stays."""
    d = template(template="When {IO} and {S} went to the {PLACE} , {IO.pal} gave a {OBJECT} to",
                 slots={"IO": PALS, "S": ["Bob", "Eve"], "PLACE": ["store"], "OBJECT": ["drink", "book"]},
                 answer=" {IO.pal}", wrong=" {S}", corruptions={"abc": {"IO": "new"}, "second": {"IO#2": "new"}},
                 n_prompts=8)
    ds = dataset(word_model, d)
    pal = {r["text"]: r["pal"] for r in PALS}
    for i in range(ds.n):
        clean = words(ds.clean[i])
        io, s = clean[2], clean[4]
        assert clean[10] == pal[io]  # {IO.pal}: the same record as {IO}
        assert ds.answers[i].tolist() == [ID[pal[io]]] and ds.wrong[i].tolist() == [ID[s]]
        abc = words(ds.corruptions["abc"][i])
        assert abc[2] != io and abc[2] in pal and abc[10] == pal[abc[2]]  # a new record, its field with it
        second = words(ds.corruptions["second"][i])
        assert second[2] == io and second[10] != pal[io]  # IO#2 is the {IO.pal} placeholder alone
    assert ds.spans is not None and set(ds.spans) >= {"IO#1", "IO#2", "S#1"}
    assert [ds.spans["IO#2"][i].tolist() for i in range(2)] == [[10, 11]] * 2  # the pal's token (BOS at 0)


def test_new_field_draws_a_record_whose_field_differs(word_model):
    """`new.FIELD`: a new value whose record field FIELD differs from the clean one's (the pronoun task's
    name of the other gender); `new` alone may keep it; the description says which."""
    grouped = [dict(r, group=g) for r, g in zip(PALS, ["drink", "book", "drink", "book"], strict=True)]  # known words
    group = {r["text"]: r["group"] for r in grouped}
    d = template(template="When {IO} and {S} went to the {PLACE} , {IO.pal} gave a {OBJECT} to",
                 slots={"IO": grouped, "S": ["Bob", "Eve"], "PLACE": ["store"], "OBJECT": ["drink", "book"]},
                 answer=" {IO.pal}", wrong=" {S}", corruptions={"other": {"IO": "new.group"}, "any": {"IO": "new"}},
                 n_prompts=8)
    ds = dataset(word_model, d)
    same = 0
    for i in range(ds.n):
        io = words(ds.clean[i])[2]
        other, anyone = words(ds.corruptions["other"][i])[2], words(ds.corruptions["any"][i])[2]
        assert other != io and group[other] != group[io]
        same += group[anyone] == group[io]
    assert same > 0  # plain `new` draws from the whole list, the same group included
    assert "corruption other: IO new with another group; corruption any: IO new" in ds.description


@pytest.mark.parametrize("change,message", [
    ({"corruptions": {"c": {"IO": "new.age"}}, "slots": {"IO": PALS, "S": ["Bob"], "PLACE": ["store"],
                                                        "OBJECT": ["drink"]}},
     "corruption 'c': IO: 'new.age': IO's values have the fields pal ('new.FIELD' draws a value whose FIELD "
     "differs from the clean one's)"),
    ({"corruptions": {"c": {"S": "new.pal"}}}, "corruption 'c': S: 'new.pal': S's values have no fields but text"),
    ({"slots": {"IO": [{"text": "Mary", "pal": "Ann"}, "John"], "S": ["Bob"], "PLACE": ["store"],
                "OBJECT": ["drink"]}}, "slot 'IO' mixes strings and records"),
    ({"slots": {"IO": [{"name": "Mary"}], "S": ["Bob"], "PLACE": ["store"], "OBJECT": ["drink"]}},
     "slot 'IO': a record needs a 'text' field"),
    ({"slots": {"IO": [{"text": "Mary", "pal": "Ann"}, {"text": "John"}], "S": ["Bob"], "PLACE": ["store"],
                "OBJECT": ["drink"]}}, "slot 'IO': record 2 has fields text, record 1 has text, pal"),
    ({"answer": " {IO.age}", "slots": {"IO": PALS, "S": ["Bob"], "PLACE": ["store"], "OBJECT": ["drink"]}},
     "data.answer: it uses {IO.age}, but the values of slot IO have the field(s) pal, text"),
    ({"answer": " {S.pal}"}, "data.answer: it uses {S.pal}, but the values of slot S have the field(s) text"),
])
def test_record_slots_are_checked_with_the_line(word_model, tmp_path, change, message):
    folder = word_model[0]
    h = tmp_path / "h.yaml"
    h.write_text(dump(hypothesis(folder, template(**change))))
    with pytest.raises(SpecError) as e:
        load(h)
    assert message in str(e.value) and f"{h}:" in str(e.value)


def _spanned_rows(tmp_path):
    """(texts, rows, file): three IOI text rows naming IO and S by substring (S occurs twice)."""
    texts = ["When Mary and John went to the store , John gave a drink to",
             "When Eve and Dan went to the park , Dan gave a book to",
             "When Alice and Bob went to the store , Bob gave a book to"]
    rows = [{"text": t, "corrupted": t.replace(t.split()[1], "Ann", 1), "answer": f" {t.split()[1]}",
             "spans": {"IO": t.split()[1], "S": t.split()[3]}} for t in texts]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return texts, rows, f


def test_hand_written_prompts_name_their_positions(word_model, tmp_path):
    """A text prompt file's `spans` (a substring: every occurrence in reading order) and listed prompts'
    (character offsets) give the token spans a template gives, and an attention claim to a named
    position reads the head's attention there, as the model's own attention weights give it."""
    import transformers

    folder, model, _ = word_model
    texts, rows, f = _spanned_rows(tmp_path)
    filed = dataset(word_model, {"file": str(f)})
    assert set(filed.spans) == {"IO#1", "S#1", "S#2"}  # S occurs twice in each text
    # [BOS] When IO and S went to the PLACE , S gave ...: IO at 2, S at 4 and 10
    assert filed.spans["IO#1"].tolist() == [[2, 3]] * 3 and filed.spans["S#2"].tolist() == [[10, 11]] * 3
    offsets = [dict(r, spans={"S": [[t.index(" , ") + 3, t.index(" gave")]]}) for r, t in zip(rows, texts, strict=True)]
    listed = dataset(word_model, {"prompts": offsets})
    assert listed.spans["S#1"].tolist() == filed.spans["S#2"].tolist()  # the same token, named by offsets
    doc = hypothesis(folder, {"file": str(f)}, claims=[
        {"id": "a", "kind": "attention", "head": "L1H0", "from": "scored", "to": {"slot": "S", "occurrence": 2},
         "at_least": 0.0}])
    h = tmp_path / "h.yaml"
    h.write_text(dump(doc))
    (claim,) = harness.run(h, figures=False, model=model).claims
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        att = hf(filed.clean, output_attentions=True).attentions[1][:, 0]  # [n, query, key] of L1H0
    by_hand = att[torch.arange(3), filed.positions[:, 0], 10].double().mean().item()
    # float32 weights of two implementations (eager here, the bridge's there) of scores of order 10 (random
    # weights of initializer_range 1): they agree to about 1e-5, far below any threshold a claim states
    assert claim.value == pytest.approx(by_hand, abs=1e-4)


def test_token_id_files_name_their_positions_by_token_offsets(word_model, tmp_path):
    """A token-id JSONL file's `spans` ({NAME: [[start, end], ...]} token offsets) give the spans the same
    prompts give as text, and the attention claim to a named position the same value; a span outside the
    prompt, or other names than the first line's, is one line naming the file and line."""
    import harness

    folder, model, _ = word_model
    _, _, f = _spanned_rows(tmp_path)
    filed = dataset(word_model, {"file": str(f)})
    ids = [{"clean": filed.clean[i].tolist(), "corrupted": filed.corrupted[i].tolist(),
            "positions": filed.positions[i].tolist(), "answers": filed.answers[i].tolist(),
            "spans": {"IO": [[2, 3]], "S": [[4, 5], [10, 11]]}} for i in range(3)]
    g = tmp_path / "ids.jsonl"
    g.write_text("".join(json.dumps(r) + "\n" for r in ids))
    tokens = dataset(word_model, {"file": str(g)})
    assert {k: v.tolist() for k, v in tokens.spans.items()} == {k: v.tolist() for k, v in filed.spans.items()}
    claim = [{"id": "a", "kind": "attention", "head": "L1H0", "from": "scored", "to": {"slot": "S", "occurrence": 2},
              "at_least": 0.0}]
    values = []
    for data_file in (f, g):
        h = tmp_path / f"h-{data_file.stem}.yaml"
        h.write_text(dump(hypothesis(folder, {"file": str(data_file)}, claims=claim)))
        values.append(harness.run(h, figures=False, model=model).claims[0].value)
    assert values[0] == values[1]
    for bad, message in (({"S": [[4, 99]]}, "ids.jsonl:2: spans.S: [4, 99] is not a span of the prompt"),
                         ({"IO": [[2, 3]]}, "ids.jsonl:2: its named positions (IO#1) differ from the first line's")):
        g.write_text("".join(json.dumps(dict(r, spans=bad) if i == 1 else r) + "\n" for i, r in enumerate(ids)))
        with pytest.raises(DataError) as e:
            dataset(word_model, {"file": str(g)})
        assert message in str(e.value)


@pytest.mark.parametrize("row,message", [
    ({"spans": {"S": "Zed"}}, "p.jsonl:1: spans.S: 'Zed' does not occur in the clean text"),
    ({"spans": {"S": [[5, 99]]}}, "p.jsonl:1: spans.S: [5, 99] is not a span of the clean text"),
    ({"spans": {"S": 3}}, "p.jsonl:1: spans.S: a non-empty substring of the text, or a list of [start, end]"),
    ({"spans": {"IO": "Mary"}}, "p.jsonl:2: its named positions (none) differ from the first prompt's (IO#1)"),
])
def test_bad_spans_are_one_line_errors(word_model, tmp_path, row, message):
    text = "When Mary and John went to the store , John gave a drink to"
    base = {"text": text, "corrupted": text.replace("Mary", "Ann"), "answer": " Mary"}
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(base | row) + "\n" + json.dumps(base | {"text": text.replace("drink", "book"),
                                                                    "corrupted": "When Ann and John went to the "
                                                                                 "store , John gave a book to"})
                 + "\n")
    with pytest.raises(DataError) as e:
        dataset(word_model, {"file": str(f)})
    assert message in str(e.value)


def test_a_slot_position_needs_named_positions(word_model, tmp_path):
    folder = word_model[0]
    claim = {"id": "a", "kind": "attention", "head": "L1H0", "from": "scored", "to": {"slot": "S"}, "at_least": 0.1}
    listed = {"prompts": [{"text": "When Mary and John went to the store , John gave a drink to", "corrupted":
                           "When Ann and John went to the store , John gave a drink to", "answer": " Mary",
                           "spans": {"IO": "Mary"}}] * 2}
    for data_, message in ((listed, "data.prompts[0] names 'S' 0 time(s) in its spans"),
                           ({"generator": "repeated_tokens", "n_prompts": 10},
                            "a slot position names a slot of a template (data.template) or a named span")):
        h = tmp_path / "h.yaml"
        h.write_text(dump(hypothesis(folder, data_, claims=[claim])))
        with pytest.raises(SpecError) as e:
            load(h)
        assert message in str(e.value)
