"""Text data without silent failures, and tokenizer files that cannot hurt token-id data:

* a word the tokenizer does not know (it becomes [UNK]) is an error naming the text, the slot
  and the word, for every slot value of a template whether drawn or not, for listed prompts and
  for answers; `allow_unknown: true` lets a file mean it;
* the BOS token comes from the tokenizer's vocabulary or not at all: `prepend_bos: true` on a
  tokenizer without one is the documented error;
* hostile tokenizer files are read only when the data need the tokenizer, and then fail in one
  line naming the file (exit 2, nothing written); token-id data and a generator given its start
  token run whatever the files hold.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from harness.cli import main

from .conftest import HYPOTHESES, ROOT

NAMES = ROOT / "fixtures" / "names-3l"


def names_file(tmp_path, model=NAMES, n=24, **data_over):
    d = yaml.safe_load((HYPOTHESES / "names.yaml").read_text())
    d["model"] = str(model)
    d["data"]["n_prompts"] = n
    d["data"].update(data_over)
    d["claims"] = [{"id": "L2H0-needed", "kind": "ablation", "heads": ["L2H0"], "ablation": "resample",
                    "at_least": 0.1}]
    d["stats"] = {"bootstrap": 200}
    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    return f


def token_id_file(tmp_path, model, data, metric="logit_diff"):
    d = {"harness": 1, "name": "ids", "model": str(model), "data": data, "metric": metric,
         "stats": {"bootstrap": 200},
         "claims": [{"id": "L2H0-needed", "kind": "ablation", "heads": ["L2H0"], "ablation": "resample",
                     "at_least": 0.1}]}
    f = tmp_path / "ids.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    return f


def run(capsys, f, out):
    code = main(["run", str(f), "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    return code, err


def test_an_unknown_slot_value_is_named_before_any_prompt_is_drawn(tmp_path, capsys):
    slots = yaml.safe_load((HYPOTHESES / "names.yaml").read_text())["data"]["slots"]
    slots["IO"] = slots["IO"] + ["Zoe"]  # one value in 31, likely never drawn for 24 prompts
    f = names_file(tmp_path, slots=slots)
    code, err = run(capsys, f, tmp_path / "o")
    assert code == 2 and len(err) == 1 and not (tmp_path / "o").exists()
    assert "data.slots.IO: slot IO: value 'Zoe': the tokenizer of" in err[0]
    assert "does not know 'Zoe' (it becomes the unknown token '[UNK]')" in err[0]
    assert "data.allow_unknown: true" in err[0]


def test_allow_unknown_lets_a_file_mean_it(tmp_path, capsys):
    slots = yaml.safe_load((HYPOTHESES / "names.yaml").read_text())["data"]["slots"]
    slots["PLACE"] = slots["PLACE"] + ["Zanzibar"]
    f = names_file(tmp_path, slots=slots, allow_unknown=True)
    code, _ = run(capsys, f, tmp_path / "o")
    assert code in (0, 1) and (tmp_path / "o" / "evidence.json").exists()


def test_unknown_words_in_listed_prompts_and_answers(tmp_path, capsys):
    d = yaml.safe_load(names_file(tmp_path).read_text())
    d["data"] = {"prompts": [
        {"text": "When Mary and John went to the store , John gave a drink to", "corrupted":
         "When Anna and Paul went to the store , Paul gave a drink to", "answer": " Mary", "wrong": " John"},
        {"text": "When Tom and Kate went to the park , Kate gave a book to", "corrupted":
         "When Sam and Rose went to the park , Rose gave a book to", "answer": " Xavier", "wrong": " Kate"}]}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    code, err = run(capsys, f, tmp_path / "o")
    assert code == 2 and len(err) == 1
    assert "data.prompts[1].answer: the answer ' Xavier': the tokenizer of" in err[0] and "'Xavier'" in err[0]


def copy_names(tmp_path, name="names"):
    dest = tmp_path / name
    shutil.copytree(NAMES, dest)
    return dest


def test_a_tokenizer_without_bos_gives_the_documented_error(tmp_path, capsys):
    m = copy_names(tmp_path)
    cfg = json.loads((m / "tokenizer_config.json").read_text())
    del cfg["bos_token"]
    (m / "tokenizer_config.json").write_text(json.dumps(cfg))
    code, err = run(capsys, names_file(tmp_path, model=m), tmp_path / "o")
    assert code == 2 and len(err) == 1
    assert "data.prepend_bos: the tokenizer of" in err[0] and "has no BOS token; set prepend_bos: false" in err[0]
    code, _ = run(capsys, names_file(tmp_path, model=m, prepend_bos=False), tmp_path / "o2")
    assert code in (0, 1)  # without BOS, as asked: it runs (the examples do not start with [UNK])
    ev = json.loads((tmp_path / "o2" / "evidence.json").read_text())
    assert not ev["data"]["bos_at_position_0"] and "[UNK]" not in json.dumps(ev["data"]["examples"])


def tokenizer_json_string_id(folder):
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["added_tokens"][0]["id"] = "7"
    (folder / "tokenizer.json").write_text(json.dumps(doc))


def config_key(key, value):
    def edit(folder):
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg[key] = value
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return edit


def truncated(folder):
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text[:700])


def no_vocabulary(folder):
    (folder / "tokenizer.json").unlink()


HOSTILE = {
    "string id in tokenizer.json": (tokenizer_json_string_id, "tokenizer.json: the tokenizers library cannot read it"),
    "bos_token is a number": (config_key("bos_token", 12345), "tokenizer_config.json: bos_token: expected the "
                                                               "token's text, got 12345"),
    "model_max_length is text": (config_key("model_max_length", "lots"), "tokenizer_config.json: model_max_length: "
                                                                          "expected a number, got 'lots'"),
    "tokenizer_class is a list": (config_key("tokenizer_class", ["x"]), "tokenizer_config.json: tokenizer_class: "
                                                                         "expected a class name, got ['x']"),
    "truncated tokenizer.json": (truncated, "tokenizer.json: not a valid JSON file (Expecting"),
    "no vocabulary file": (no_vocabulary, "tokenizer_config.json but no vocabulary file"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_tokenizer_files(tmp_path, capsys, case):
    edit, message = HOSTILE[case]
    m = copy_names(tmp_path)
    edit(m)
    # text data needs the tokenizer: one line naming the file, nothing written
    code, err = run(capsys, names_file(tmp_path, model=m), tmp_path / "text")
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "text").exists()
    # token-id data never reads the tokenizer files
    ids = token_id_file(tmp_path, m, {"file": str(NAMES / "prompts-abba.jsonl"), "limit": 24})
    code, err = run(capsys, ids, tmp_path / "ids")
    assert code in (0, 1) and err == [] and (tmp_path / "ids" / "evidence.json").exists()
    # the generator needs the start token: given, the files are not read; else one line naming them
    gen = {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 6}
    code, err = run(capsys, token_id_file(tmp_path, m, {**gen, "bos_token": 0}, "logprob"), tmp_path / "gen")
    assert err == [] and code in (0, 1, 3)
    code, err = run(capsys, token_id_file(tmp_path, m, gen, "logprob"), tmp_path / "gen2")
    assert code == 2 and len(err) == 1 and "data.bos_token" in err[0] and message in err[0], err
