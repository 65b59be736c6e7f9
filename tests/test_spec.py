"""Schema validation: good files load; each malformed file gives file:line: field: message."""

import subprocess
import sys
import textwrap

import pytest

from harness.errors import SpecError
from harness.hypothesis import loading as spec

from .conftest import HYPOTHESES

GOOD = """\
harness: 1
name: t
model: ../fixtures/induction-2l
data:
  generator: repeated_tokens
  n_prompts: 20
claims:
  - id: a
    kind: role
    head: L0H7
    role: previous_token
    at_least: 0.5
  - id: b
    kind: ablation
    heads: [L0H7]
    at_least: 0.5
"""


def load_text(tmp_path, text):
    f = tmp_path / "h.yaml"
    f.write_text(textwrap.dedent(text))
    return spec.load(f)


def problems(tmp_path, text):
    with pytest.raises(SpecError) as exc:
        load_text(tmp_path, text)
    return exc.value.problems


def test_good_file_and_defaults(tmp_path):
    h = load_text(tmp_path, GOOD)
    assert h.spec.metric == "logprob"
    assert h.spec.stats.bootstrap == 2000
    assert h.spec.claims[1].ablation == "mean"
    assert h.resolve(h.spec.model) == tmp_path / "../fixtures/induction-2l"
    assert len(h.sha256) == 64


@pytest.mark.parametrize("path", sorted(HYPOTHESES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_hypotheses_validate(path):
    assert spec.load(path).spec.claims


CASES = [
    # (description, replace old -> new, expected line, expected fragment)
    ("unknown top-level key", ("name: t\n", "name: t\nnmae: x\n"), 3, "nmae: unknown key; allowed keys: harness, name"),
    ("wrong version", ("harness: 1", "harness: 2"), 1, "harness: Input should be 1"),
    ("boolean version", ("harness: 1", "harness: true"), 1, "harness: Input should be 1"),
    ("missing model", ("model: ../fixtures/induction-2l\n", ""), 1, "model: required field is missing"),
    ("bad name characters", ("name: t", "name: has space"), 2, "name: a name is letters, digits, '_', '.' and '-'"),
    ("n_prompts wrong type", ("n_prompts: 20", "n_prompts: many"), 6, "data.n_prompts: Input should be a valid integer"),
    ("n_prompts too small", ("n_prompts: 20", "n_prompts: 1"), 6, "data.n_prompts: Input should be greater than or equal to 2"),
    ("unknown generator", ("generator: repeated_tokens", "generator: ioi"), 5, "data.generator: Input should be 'repeated_tokens' (got 'ioi')"),
    ("generator and file", ("  n_prompts: 20", "  n_prompts: 20\n  file: x.jsonl"), 4, "data: give exactly one of 'generator'"),
    ("unknown data key", ("  n_prompts: 20", "  n_prompts: 20\n  promtps: 3"), 7, "data.promtps: unknown key; allowed keys: generator, n_prompts"),
    ("bad head name", ("head: L0H7", "head: L0H7.k"), 10, "claims[0].head: 'L0H7.k' is not a head"),
    ("bad head in list", ("heads: [L0H7]", "heads: [L0H7, X1]"), 15, "claims[1].heads: 'X1' is not a head or an MLP; expected a head L<layer>H<head> or an MLP L<layer>.mlp"),
    ("duplicate head", ("heads: [L0H7]", "heads: [L0H7, L0H7]"), 15, "claims[1].heads: L0H7 is listed twice"),
    ("unknown role", ("role: previous_token", "role: copying_head"), 11, "claims[0].role: Input should be"),
    ("impossible role threshold", ("at_least: 0.5\n  - id: b", "at_least: 1.5\n  - id: b"), 8, "an attention score lies in [0, 1]; threshold 1.5 is impossible"),
    ("two bounds", ("    at_least: 0.5\n  - id: b", "    at_least: 0.5\n    at_most: 0.9\n  - id: b"), 8, "give exactly one of at_least / at_most"),
    ("no bound", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n"), 13, "claims[1]: give exactly one of at_least / at_most"),
    ("unknown claim kind", ("kind: ablation", "kind: ablate"), 14, "claims[1].kind: unknown claim kind 'ablate'; allowed: role, attention, copying, composition, ablation, attribution, edge, path, circuit"),
    ("unknown claim key", ("    heads: [L0H7]\n", "    heads: [L0H7]\n    effect: 0.5\n"), 16, "claims[1].effect: unknown key; allowed keys: id, kind, corruption, heads, ablation, measure, normalize, freeze_patterns, sensitivity, parts, at_least, at_most, description"),
    ("parts of another metric", ("    heads: [L0H7]\n", "    heads: [L0H7]\n    parts: true\n"), 1, "claim 'b': parts: true splits logit_diff into its parts (answer_logit, wrong_logit); this file's metric is logprob"),
    ("unknown ablation type", ("    heads: [L0H7]\n", "    heads: [L0H7]\n    ablation: knockout\n"), 16, "claims[1].ablation: Input should be 'zero', 'mean' or 'resample'"),
    ("duplicate claim id", ("- id: b", "- id: a"), 13, "claims[1].id: claim id 'a' is used twice"),
    ("missing claim field", ("    role: previous_token\n", ""), 8, "claims[0].role: required field is missing"),
    ("threshold wrong type", ("at_least: 0.5\n  - id: b", "at_least: high\n  - id: b"), 12, "claims[0].at_least: Input should be a valid number"),
    ("duplicate key", ("name: t\n", "name: t\nname: u\n"), 3, "name: duplicate key"),
    ("bad stats", ("claims:", "stats:\n  confidence: 1.5\nclaims:"), 8, "stats.confidence: Input should be less than 1"),
    ("unknown metric", ("claims:", "metric: accuracy\nclaims:"), 7, "metric: unknown metric 'accuracy'; allowed: logprob, logit_diff, prob, kl, answer_logit, wrong_logit"),
    ("composition edge backwards", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: composition\n    edge: L1H5 -> L0H7.k\n"), 19, "claims[2].edge: edge 'L1H5 -> L0H7.k' does not go forward"),
    ("composition to logits", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: composition\n    edge: L0H7 -> logits\n"), 19, "claims[2].edge: 'logits' is not the receiver of a composition edge; expected a later head's input L<layer>H<head>.q/.k/.v"),
    ("composition expect", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: composition\n    edge: L0H7 -> L1H0.k\n    expect: used\n"), 20, "claims[2].expect: Input should be 'composes' or 'does_not_compose' (got 'used')"),
    ("copying threshold", ("role: previous_token\n    at_least: 0.5", "role: copying\n    at_least: -1.5"), 8, "a copying score lies in [-1, 1]; threshold -1.5 is impossible"),
    ("edge from logits", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: edge\n    edge: logits -> L1H0.k\n"), 19, "claims[2].edge: 'logits' is not an edge sender; expected a head L<layer>H<head>, an MLP L<layer>.mlp or embed"),
    ("edge into a head", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: edge\n    edge: L0H7 -> L1H0\n"), 19, "did you mean L1H0.q, .k or .v?"),
    ("edge expect", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: edge\n    edge: L0H7 -> L1H0.k\n    expect: composes\n"), 20, "claims[2].expect: Input should be 'used' or 'unused' (got 'composes')"),
    ("denoising with zero", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: edge\n    edge: L0H7 -> L1H0.k\n    direction: denoising\n    replacement: zero\n"), 17, "claims[2]: denoising patches the clean run's output into the corrupted run"),
    ("edge min_effect", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: edge\n    edge: L0H7 -> L1H0.k\n    min_effect: -1\n"), 20, "claims[2].min_effect: Input should be greater than 0"),
    ("circuit few random", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: circuit\n    heads: [L0H7]\n    at_least: 0.5\n    random_circuits: 5\n"), 21, "claims[2].random_circuits: Input should be greater than or equal to 20"),
    ("circuit heads and edges", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: circuit\n    heads: [L0H7]\n    edges: [L0H7 -> logits]\n    at_least: 0.5\n"), 17, "claims[2]: give exactly one of heads (a node circuit) / edges (an edge circuit)"),
    ("circuit edge group", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: circuit\n    edges: [L0H6+L0H7 -> L1H5.k]\n    at_least: 0.5\n"), 19, "an edge of a circuit has one sender; list 'L0H6 -> L1H5.k' and 'L0H7 -> L1H5.k'"),
    ("circuit edge twice", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: circuit\n    edges: [L0H7 -> logits, L0H7 -> logits]\n    at_least: 0.5\n"), 19, "L0H7 -> logits is listed twice"),
    ("circuit edge backwards", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: circuit\n    edges: [L1H5 -> L0H7.k]\n    at_least: 0.5\n"), 19, "does not go forward"),
    ("circuit no bound", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: circuit\n    heads: [L0H7]\n"), 17, "claims[2]: give exactly one of at_least / at_most"),
    ("frozen patterns on a key edge", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: edge\n    edge: L0H7 -> L1H0.k\n    freeze_patterns: true\n"), 17, "freeze_patterns holds every attention pattern fixed, so a route through L1H0.k cannot act"),
    ("overlapping zones", ("claims:", "stats:\n  tolerance: 0.2\nclaims:"), 7, "stats: tolerance 0.2 must be below min_effect 0.1"),
    ("claim tolerance over stats min_effect", ("    heads: [L0H7]\n    at_least: 0.5\n", "    heads: [L0H7]\n    at_least: 0.5\n  - id: c\n    kind: edge\n    edge: L0H7 -> L1H0.k\n    tolerance: 0.3\n"), 1, "claim 'c': tolerance 0.3 must be below min_effect 0.1"),
    ("non-boolean flag", ("    heads: [L0H7]\n", "    heads: [L0H7]\n    sensitivity: 1\n"), 16, "claims[1].sensitivity: Input should be a valid boolean"),
    ("unknown generator corruption", ("  n_prompts: 20\n", "  n_prompts: 20\n  corruptions: [first_half, middle]\n"), 7, "data.corruptions[1]: Input should be 'first_half', 'second_half' or 'both' (got 'middle')"),
    ("corruption listed twice", ("  n_prompts: 20\n", "  n_prompts: 20\n  corruptions: [both, both]\n"), 4, "a corruption is listed twice"),
    ("claim names a corruption the data lacks", ("    heads: [L0H7]\n", "    heads: [L0H7]\n    corruption: second_half\n"), 16, "claims[1].corruption: 'second_half' is not one of the data's corruptions: first_half (add it to data.corruptions)"),
    ("claim normalize", ("    heads: [L0H7]\n", "    heads: [L0H7]\n    normalize: uniform\n"), 16, "claims[1].normalize: Input should be 'corrupted' or 'baseline'"),
    ("stats min_change", ("claims:", "stats:\n  min_change: -0.1\nclaims:"), 8, "stats.min_change: Input should be greater than 0"),
    ("empty claims", (GOOD[GOOD.index("claims:"):], "claims: []\n"), 7, "claims: List should have at least 1 item"),
]


@pytest.mark.parametrize("desc,change,line,fragment", CASES, ids=[c[0] for c in CASES])
def test_malformed_file(tmp_path, desc, change, line, fragment):
    old, new = change
    assert old in GOOD, desc
    found = problems(tmp_path, GOOD.replace(old, new, 1))
    expected_prefix = f"{tmp_path / 'h.yaml'}:{line}: "
    assert any(p.startswith(expected_prefix) and fragment in p for p in found), found


def test_all_problems_reported_at_once(tmp_path):
    text = GOOD.replace("n_prompts: 20", "n_prompts: 0").replace("head: L0H7", "head: Q")
    found = problems(tmp_path, text)
    assert len(found) == 2
    assert [p.split(":")[1] for p in found] == ["6", "10"]


def test_yaml_syntax_error_has_line(tmp_path):
    found = problems(tmp_path, GOOD.replace("  - id: b", "  - id: [b"))
    assert found == [f"{tmp_path / 'h.yaml'}:14: (yaml): expected ',' or ']', but got ':'"]


def test_not_a_mapping(tmp_path):
    assert "YAML mapping" in problems(tmp_path, "- a\n- b\n")[0]


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read the hypothesis file: no such file"):
        spec.load(tmp_path / "nope.yaml")


def test_dict_input_resolves_against_base_dir(tmp_path):
    import yaml

    h = spec.load(yaml.safe_load(GOOD), base_dir=tmp_path)
    assert h.path is None
    assert h.resolve("m") == tmp_path.resolve() / "m"
    d = yaml.safe_load(GOOD)
    d["claims"][0]["head"] = "nope"
    with pytest.raises(SpecError) as exc:  # a dict has no lines: the claim is named by its id
        spec.load(d)
    assert exc.value.problems == ["claims[0] (id: a): head: 'nope' is not a head; expected a head L<layer>H<head>, "
                                  "e.g. L1H6"]


def test_validation_does_not_import_torch():
    code = ("import sys; from harness.hypothesis import loading as spec; spec.load(sys.argv[1]); "
            "bad = [m for m in ('torch', 'transformer_lens') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code, str(HYPOTHESES / "induction.yaml")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hook_names_read_back_their_layer():
    from harness.spec import names

    for L in (0, 7, 31):
        for spelled in (names.hook_z(L), names.hook_mlp_out(L), names.hook_resid_mid(L), names.hook_input(L, "k")):
            assert names.hook_layer(spelled) == L
    assert names.hook_layer(names.HOOK_EMBED) is None and names.hook_layer(names.HOOK_POS_EMBED) is None
    assert names.hook_layer("blocksX.1.hook_z") is None
