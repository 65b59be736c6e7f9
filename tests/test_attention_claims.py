"""Attention claims to named positions (claims.attention) on the text fixture: the score equals
the attention weight read by hand from TransformerLens's cached pattern at the positions found by
searching the prompt's tokens; L2H0 attends from the scored position to the repeated subject
(fixtures/names-3l/README.md) and a head that does not fails; names that do not fit the data are
refused before any model loads."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

import harness
from harness.errors import DataError, SpecError

from .conftest import HYPOTHESES, ROOT

NAMES = ROOT / "fixtures" / "names-3l"


def names_doc(claims, n=40, **data_over):
    d = yaml.safe_load((HYPOTHESES / "names.yaml").read_text())
    d["model"] = str(NAMES)
    d["data"].update(n_prompts=n, **data_over)
    d["stats"] = {"bootstrap": 300}
    d["claims"] = claims
    return d


S2 = {"slot": "S", "occurrence": 2}


@pytest.fixture(scope="module")
def run():
    claims = [{"id": "L2H0-to-S2", "kind": "attention", "head": "L2H0", "from": "scored", "to": S2, "at_least": 0.5},
              {"id": "L1H1-to-S2", "kind": "attention", "head": "L1H1", "from": "scored", "to": S2, "at_least": 0.5},
              {"id": "L0H3-S2-to-IO", "kind": "attention", "head": "L0H3", "from": S2, "to": {"slot": "IO"},
               "at_least": 0.0}]
    doc = names_doc(claims)
    return doc, harness.run(doc, device="cpu", base_dir=HYPOTHESES)


def test_the_repeated_subject_head_passes_and_another_fails(run):
    _, ev = run
    assert ev.claim("L2H0-to-S2").verdict == "PASS" and ev.claim("L2H0-to-S2").value > 0.9
    assert ev.claim("L1H1-to-S2").verdict == "FAIL"
    row = next(r for r in ev.ladder if r.mechanism == "L2H0")
    assert [s.status for s in row.rungs["observation"]] == ["supports"]


def test_scores_equal_the_pattern_at_positions_found_by_hand(run):
    """Oracle: the clean prompts' tokens searched for the subject's second and the indirect
    object's first occurrence (names are one token), the pattern from run_with_cache."""
    import torch

    from harness.engine.runner import build_dataset, load_model_cached

    doc, ev = run
    m = load_model_cached(str(NAMES), "cpu")
    h = harness.load_hypothesis(doc, base_dir=HYPOTHESES)
    ds = build_dataset(h, m)
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(ds.clean, names_filter=lambda n: n.endswith("hook_pattern"))
    s2, io, scored = [], [], ds.positions[:, 0].tolist()
    for row, ans, wrong in zip(ds.clean.tolist(), ds.answers[:, 0].tolist(), ds.wrong[:, 0].tolist()):
        subject = [i for i, t in enumerate(row) if t == wrong]  # the wrong token is the subject: S appears twice
        assert len(subject) == 2
        s2.append(subject[1])
        io.append(row.index(ans))
    n = np.arange(ds.n)
    for cid, layer, head, q, k in (("L2H0-to-S2", 2, 0, scored, s2), ("L1H1-to-S2", 1, 1, scored, s2),
                                   ("L0H3-S2-to-IO", 0, 3, s2, io)):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][:, head].double().numpy()
        want = pattern[n, q, k]
        got = np.asarray(ev.claim(cid).per_prompt)
        np.testing.assert_allclose(got, want, atol=1e-6)  # the same float32 pattern, read at the same places


@pytest.mark.parametrize(("to", "message"), [
    ({"slot": "X"}, "the template has no slot 'X'; its slots: IO, S, PLACE, OBJECT"),
    ({"slot": "S", "occurrence": 3}, "slot 'S' appears 2 time(s) in the template; occurrence 3 does not exist"),
])
def test_slot_positions_that_do_not_fit_the_template(to, message):
    doc = names_doc([{"id": "a", "kind": "attention", "head": "L2H0", "from": "scored", "to": to, "at_least": 0.5}])
    with pytest.raises(SpecError, match=re.escape(message)):
        harness.load_hypothesis(doc, base_dir=HYPOTHESES)


def test_a_slot_position_needs_a_template(tmp_path):
    doc = {"harness": 1, "name": "t", "model": str(NAMES), "data": {"generator": "repeated_tokens"},
           "claims": [{"id": "a", "kind": "attention", "head": "L2H0", "from": "scored", "to": S2, "at_least": 0.5}]}
    with pytest.raises(SpecError, match="a slot position names a slot of a template"):
        harness.load_hypothesis(doc)


def test_positions_the_data_cannot_have():
    later = [{"id": "later", "kind": "attention", "head": "L2H0", "from": {"slot": "IO"}, "to": S2, "at_least": 0.1}]
    with pytest.raises(DataError, match="S \\(occurrence 2\\) comes after IO \\(occurrence 1\\) in every prompt"):
        harness.run(names_doc(later, n=10), device="cpu", base_dir=HYPOTHESES, figures=False)
    bos = [{"id": "bos", "kind": "attention", "head": "L2H0", "from": "scored", "to": "bos", "at_least": 0.1}]
    with pytest.raises(DataError, match="these prompts do not start with the BOS token"):
        harness.run(names_doc(bos, n=10, prepend_bos=False), device="cpu", base_dir=HYPOTHESES, figures=False)


def test_attention_figure_data_is_the_mean_over_prompts_with_labelled_positions():
    """figures_data.attention: each shown head's pattern averaged over every clean prompt (TransformerLens's
    own cache is the oracle), and a label per position: the first prompt's tokens, BOS, the template's
    slot occurrences where they sit in every prompt, `*` on the scored position."""
    from harness.engine.data_source import build_dataset
    from harness.hypothesis.loading import load
    from harness.model.ref import load_model

    h = load(HYPOTHESES / "names-ioi-study.yaml")
    ev = harness.run(HYPOTHESES / "names-ioi-study.yaml", device="cpu")
    (item,) = [a for a in ev.figures_data["attention"] if a["head"] == "L2H0"]
    m = load_model(str(HYPOTHESES.parent / "fixtures" / "names-3l"), device="cpu")
    ds = build_dataset(h.spec.data, h, m)
    import torch

    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(ds.clean, names_filter=lambda n: n == "blocks.2.attn.hook_pattern")
    want = cache["blocks.2.attn.hook_pattern"][:, 0].double().mean(0).numpy()
    assert item["prompts"] == ds.n == 100
    np.testing.assert_allclose(np.array(item["mean_pattern"]), want, atol=1e-5)  # rounded to 5 decimals
    labels = item["labels"]
    assert labels[0] == "BOS" and labels[-1] == "to *"
    assert [x.split(" [")[1].rstrip("]") for x in labels if " [" in x] == ["IO#1", "S#1", "PLACE#1", "S#2",
                                                                           "OBJECT#1"]
