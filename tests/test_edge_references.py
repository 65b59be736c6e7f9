"""Circuit claims that name their edges by reference (`edges_from:`, hypothesis.references): the edges
read from a text file or a discovery.json, `top`, and one clear line for every problem, naming both
the hypothesis file's line and the edge file's."""

from __future__ import annotations

import json

import pytest
import yaml

from harness.errors import SpecError
from harness.hypothesis.loading import load

from .documents import hypothesis as document
from .documents import write
from .graph_helpers import ROOT

EDGES = ["embed -> L0H7.v", "L0H7 -> L1H5.k", "L1H5 -> logits"]


def hypothesis(folder, claim: dict) -> str:
    doc = document(ROOT / "fixtures" / "induction-2l", [{"id": "c", "kind": "circuit", "at_least": 0.5, **claim}],
                   name="refs", data={"generator": "repeated_tokens", "n_prompts": 8, "segment_length": 6})
    return str(write(folder, doc, "h"))


def test_a_text_file_and_a_discovery_json_give_the_listed_edges(tmp_path):
    (tmp_path / "e.txt").write_text("# a comment\n\n" + "\n".join(f"  {e}  " for e in EDGES) + "\n")
    (tmp_path / "d.json").write_text(json.dumps({"kind": "discovery", "ranking": [{"edge": e} for e in EDGES]}))
    inline = load(hypothesis(tmp_path, {"edges": EDGES})).spec.claims[0]
    from_text = load(hypothesis(tmp_path, {"edges_from": "e.txt"}), check_model=True)
    from_json = load(hypothesis(tmp_path, {"edges_from": "d.json", "top": 2}))
    assert from_text.spec.claims[0].edges == inline.edges
    assert from_json.spec.claims[0].edges == inline.edges[:2]
    (ref,) = from_json.references
    assert (ref.claim, ref.file, ref.top, ref.edges) == ("c", "d.json", 2, 2)
    assert from_text.references[0].sha256 != ref.sha256
    assert load(hypothesis(tmp_path, {"edges": EDGES})).references == ()


@pytest.mark.parametrize("files,claim,fragment", [
    ({}, {"edges_from": "missing.txt"}, "missing.txt: no such file"),
    ({"e.txt": "L0H7 -> L1H5.k\nL0H7 -> L1H5.k\n"}, {"edges_from": "e.txt"},
     "e.txt:2: L0H7 -> L1H5.k is listed twice (first at"),
    ({"e.txt": "L0H7 -> L1H5.k\n# fine\nL0H7 => L1H5.k\n"}, {"edges_from": "e.txt"}, "e.txt:3: "),
    ({"e.txt": "L0H7 -> L1H5.k\nL7H0 -> L9H1.k\n"}, {"edges_from": "e.txt"}, "e.txt:2: "),
    ({"e.txt": "L0H6+L0H7 -> L1H5.k\n"}, {"edges_from": "e.txt"}, "an edge of a circuit has one sender"),
    ({"e.txt": "# nothing\n"}, {"edges_from": "e.txt"}, "e.txt: lists no edges"),
    ({"e.txt": "L0H7 -> L1H5.k\n"}, {"edges_from": "e.txt", "top": 3}, "top: 3 but e.txt lists 1 edges"),
    ({"e.txt": "L0H7 -> L1H5.k\n"}, {"edges_from": "e.txt", "top": 0}, "top: expected a whole number"),
    ({"e.txt": "L0H7 -> L1H5.k\n"}, {"edges_from": "e.txt", "edges": EDGES}, "give edges or edges_from, not both"),
    ({"d.json": '{"kind": "evidence"}'}, {"edges_from": "d.json"}, "not a discovery.json"),
    ({"d.json": '{"kind": '}, {"edges_from": "d.json"}, "d.json:1: not JSON"),
    ({}, {"edges": EDGES, "top": 2}, "top keeps the first edges of an edges_from file"),
])
def test_a_bad_reference_is_one_line_at_the_claims_edges_from(tmp_path, files, claim, fragment):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SpecError) as got:
        load(hypothesis(tmp_path, claim), check_model=True)
    (problem,) = got.value.problems
    assert fragment in problem, problem
    assert problem.startswith(f"{tmp_path / 'h.yaml'}:") and "\n" not in problem
    if "edges_from" in claim:
        assert "claims[0].edges_from: (c)" in problem


def test_a_hundred_thousand_edges_from_a_file_load_in_linear_time(tmp_path):
    edges = [f"L{s}H{h} -> L{r}H{q}.{x}" for s in range(30) for h in range(9) for r in range(s + 1, 30)
             for q in range(9) for x in "qkv"][:100_000]
    (tmp_path / "big.txt").write_text("\n".join(edges) + "\n")
    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump({"harness": 1, "name": "big", "model": "gpt2",
                                 "data": {"generator": "repeated_tokens", "n_prompts": 8, "segment_length": 6},
                                 "claims": [{"id": "c", "kind": "circuit", "at_least": 0.5, "edges_from": "big.txt",
                                             "top": 99_999}]}))
    h = load(str(f))
    assert len(h.spec.claims[0].edges) == 99_999 and h.references[0].edges == 99_999
