"""The recipes of docs/architecture.md followed from outside the package: a data source
(tests/toy_data_source.py) and a model source (tests/toy_model_source.py), each registered here
and used by `harness run`, `harness validate` and the error messages with no edit anywhere else.
(The claim kind's recipe is tests/test_registry.py's, the metric's tests/test_metrics.py's.)
Then all of them at once on the command line, through a plugin installed the way a package
installs one (an entry point in the `harness.plugins` group: tests/plugin_toys.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import harness
from harness.cli import main
from harness.data import sources as data_sources
from harness.errors import SpecError
from harness.model import ref as model_ref

from . import toy_data_source, toy_model_source
from .conftest import FIXTURE, ROOT
from .documents import hypothesis as document


@pytest.fixture
def reversed_half():
    data_sources.register(toy_data_source.SOURCE)
    try:
        yield toy_data_source.SOURCE
    finally:
        data_sources.unregister("reversed_half")


@pytest.fixture
def toy_models():
    model_ref.register(toy_model_source.SOURCE)
    try:
        yield toy_model_source.SOURCE
    finally:
        model_ref.unregister("toy:")


def doc(model: str, data: dict) -> dict:
    return document(model, [{"id": "prev", "kind": "role", "head": "L0H7", "role": "previous_token", "at_least": 0.8},
                            {"id": "needed", "kind": "ablation", "heads": ["L0H7"], "ablation": "resample",
                             "at_least": 0.3}], name="plugin", data=data, stats={"bootstrap": 300})


def test_a_data_source_registered_from_outside(reversed_half, tmp_path):
    ev = harness.run(doc(str(FIXTURE), toy_data_source.mapping()), device="cpu", figures=False)
    prev, needed = ev.claims
    assert prev.verdict == "PASS"  # the fixture's previous-token head on the plugin's prompts
    assert ev.data["description"].startswith("reversed_half: 40 prompts") and ev.baseline["corruption"] == "reversed"
    # the plugin's corruption breaks the earlier copy's order: induction loses most of its gap
    assert ev.baseline["gap"]["mean"] > 1.0 and needed.verdict == "PASS"
    assert ev.settings["mean_ablation_reference"] == "the other clean prompts (leave-one-out), per position"
    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump(doc(str(FIXTURE), toy_data_source.mapping(reversed_half=1))))
    with pytest.raises(SpecError, match=r"h.yaml:\d+: data.reversed_half: Input should be greater than or equal"):
        harness.load_hypothesis(f)


def test_an_unregistered_data_source_is_named_in_the_error(reversed_half, tmp_path):
    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump(doc(str(FIXTURE), {"generator": "repeated_tokens", "reversed_half": 8})))
    with pytest.raises(SpecError, match="give exactly one of .*'reversed_half' \\(the toy plugin\\)"):
        harness.load_hypothesis(f)
    data_sources.unregister("reversed_half")
    f.write_text(yaml.safe_dump(doc(str(FIXTURE), toy_data_source.mapping())))
    with pytest.raises(SpecError, match="give exactly one of 'generator'"):
        harness.load_hypothesis(f)
    with pytest.raises(ValueError, match="built-in"):
        data_sources.unregister("generator")


def test_a_registered_source_with_splits_is_explored_on_explore(reversed_half, fixture_model):
    """scan, discover and roles read `explore` of any source that has splits (one rule:
    data_sources.on_split), and their starter files point back at `test`."""
    from harness.data.sources import FolderSource, has_splits
    from harness.engine.data_source import for_exploring
    from harness.tools.scan import held_out_mapping

    d = toy_data_source.ReversedHalf(reversed_half=8)
    assert has_splits(d) and d.split == "test"
    explored = for_exploring(d)
    assert explored.split == "explore" and for_exploring(d, "test").split == "test"
    assert held_out_mapping(explored, FolderSource(ROOT))["split"] == "test"
    test_prompts = toy_data_source.build(d, FolderSource(ROOT), fixture_model)
    explore_prompts = toy_data_source.build(explored, FolderSource(ROOT), fixture_model)
    assert not (test_prompts.clean == explore_prompts.clean).all(dim=1).any()  # no prompt in both


def test_a_model_source_registered_from_outside(toy_models, tmp_path, capsys):
    data = {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 6}
    d = doc("toy:3", data)
    d["claims"] = [{"id": "weak", "kind": "role", "head": "L1H3", "role": "previous_token", "at_most": 0.9}]
    ev = harness.run(d, device="cpu", figures=False)
    assert ev.model["source"] == "toy:3" and ev.model["kind"] == "toy" and ev.model["n_heads"] == 4
    again = harness.run(d, device="cpu", figures=False)
    assert again.claims[0].value == ev.claims[0].value  # the same seed builds the same model
    # validate reads the source's shape without loading: a head outside it is refused by name
    bad = dict(d, claims=[{"id": "x", "kind": "role", "head": "L1H7", "role": "previous_token", "at_least": 0.1}])
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    assert main(["validate", str(f)]) == 2
    assert "L1H7 is not in the model: the model has layers 0..1 and heads 0..3" in capsys.readouterr().err
    ref = model_ref.ModelRef.parse("toy:3")
    assert ref.is_named and ref.kind() == "toy" and ref.relative_to(tmp_path) == "toy:3"
    with pytest.raises(ValueError, match="ending with ':'"):
        model_ref.register(model_ref.ModelSource("hf:", toy_model_source.load))


def installed(site: Path, entry_point: str = "tests.plugin_toys:register") -> dict[str, str]:
    """A distribution's metadata naming `entry_point` in the harness.plugins group, in `site`
    (what pip writes for a package with that entry point); the environment that sees it."""
    dist = site / "harness_toy_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: harness-toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[harness.plugins]\ntoys = {entry_point}\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), HARNESS_PROGRESS="0")


def harness_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], env=env, capture_output=True, text=True,
                          timeout=600)


def test_every_recipe_on_the_command_line_through_an_installed_plugin(tmp_path):
    env = installed(tmp_path / "site")
    h = tmp_path / "plugin.yaml"
    h.write_text(yaml.safe_dump({
        "harness": 1, "name": "plugin", "model": "toy:3", "data": toy_data_source.mapping(), "metric": "margin",
        "stats": {"bootstrap": 300},
        "claims": [{"id": "focused", "kind": "attention_entropy", "head": "L0H1", "at_most": 10.0},
                   {"id": "prev", "kind": "role", "head": "L0H1", "role": "previous_token", "at_most": 1.0}]}))
    assert harness_cli(env, "validate", str(h)).returncode == 0
    r = harness_cli(env, "run", str(h), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    ev = json.loads((tmp_path / "out" / "evidence.json").read_text())
    assert ev["model"]["source"] == "toy:3" and ev["model"]["kind"] == "toy"  # the model source
    assert ev["data"]["description"].startswith("reversed_half: 40 prompts")  # the data source
    assert ev["baseline"]["metric"] == "margin"  # the metric
    entropy = next(c for c in ev["claims"] if c["id"] == "focused")  # the claim kind, with its view
    assert entropy["kind"] == "attention_entropy" and entropy["verdict"] == "PASS"
    assert "per-prompt entropy median" in (tmp_path / "out" / "report.md").read_text()
    help_text = harness_cli(env, "scan", "--help").stdout  # the command line offers the plugin's metric
    assert "margin" in help_text.split("--metric", 1)[1].split("--", 1)[0]
    # the same file without the plugin: refused by name, nothing written
    bare = dict(env, PYTHONPATH=str(ROOT))
    r = harness_cli(bare, "validate", str(h))
    assert r.returncode == 2 and "unknown claim kind 'attention_entropy'" in r.stderr


def test_a_broken_plugin_is_one_line_naming_it(tmp_path):
    env = installed(tmp_path / "site", "no_such_module.anywhere:register")
    r = harness_cli(env, "validate", str(ROOT / "hypotheses" / "induction.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("error: plugin toys (no_such_module.anywhere:register) failed: "
                                "ModuleNotFoundError: No module named 'no_such_module'")


# -- the declared surface and its conformance checks ------------------------------------------------------

TOYS = ("toy_kind", "toy_metric", "toy_data_source", "toy_model_source", "toy_family", "plugin_toys")


def test_plugins_import_only_the_declared_surface():
    """Every toy written from outside the package imports harness.extend and nothing else of harness."""
    import ast

    for name in TOYS:
        tree = ast.parse((ROOT / "tests" / f"{name}.py").read_text())
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness"):
                used.add(node.module if node.module != "harness" else f"harness.{node.names[0].name}")
            elif isinstance(node, ast.Import):
                used |= {a.name for a in node.names if a.name.startswith("harness")}
        assert used == {"harness.extend"}, (name, used)


@pytest.fixture
def olmo3(tmp_path):
    from harness import extend

    from . import toy_family

    folder = toy_family.build(tmp_path / "olmo3")
    extend.register_family(toy_family.FAMILY)
    try:
        yield folder
    finally:
        extend.unregister_family("olmo3")


def test_a_family_adapter_from_outside_passes_its_conformance_check(tmp_path):
    """OLMo 3, a family harness does not ship: refused by name until its adapter (tests/toy_family.py)
    is registered, then reproduced exactly by the block arithmetic (its sliding windows, its rotary
    table per layer type, its QK-norm over the projection): every conformance check passes, and a
    hypothesis file runs on it."""
    from harness import extend
    from harness.errors import ModelLoadError

    from . import toy_family

    folder = toy_family.build(tmp_path / "olmo3")
    with pytest.raises(ModelLoadError, match="Olmo3ForCausalLM is not a supported architecture; harness supports "
                                             "GPT2LMHeadModel, LlamaForCausalLM"):
        harness.load_model(folder, device="cpu")
    passed = extend.check_family(toy_family.FAMILY, folder)
    assert len(passed) == 8 and "the batched sweep equals the per-edge path" in passed
    with pytest.raises(ModelLoadError):  # the check registered the family for its own duration only
        harness.load_model(folder, device="cpu")


def test_conformance_catches_a_misdeclared_family(olmo3):
    """The same model with an adapter that forgets the sliding windows: the arithmetic checks fail and
    say which."""
    import dataclasses

    from harness import extend

    from . import toy_family

    extend.unregister_family("olmo3")
    try:
        with pytest.raises(extend.ConformanceError) as exc:
            extend.check_family(dataclasses.replace(toy_family.FAMILY, windows="none"), olmo3)
    finally:
        extend.register_family(toy_family.FAMILY)  # as the fixture expects to find it
    assert any("attention by hand reproduces" in f for f in exc.value.failures)
    assert any("block arithmetic reproduces every layer" in f for f in exc.value.failures)


def test_the_toy_kind_metric_and_data_source_pass_their_conformance_checks():
    from harness import extend

    from . import toy_data_source, toy_kind, toy_metric

    claim = {"id": "L0H7-focused", "kind": "attention_entropy", "head": "L0H7", "at_most": 0.5}
    assert "it ends PASS, FAIL or INCONCLUSIVE with a reason or a value" in extend.check_claim_kind(
        toy_kind.KIND, claim, FIXTURE)
    assert len(extend.check_metric(toy_metric.METRIC)) == 4
    assert "each corruption changes some prompt" in extend.check_data_source(
        toy_data_source.SOURCE, toy_data_source.mapping(), FIXTURE)
    for name in ("logprob", "logit_diff", "kl"):  # the built-in metrics conform too
        from harness.model import metrics

        extend.check_metric(metrics.get(name))


def test_conformance_catches_a_view_that_cannot_read_its_kinds_result():
    from harness import extend

    from . import toy_kind

    class NumbersView(extend.ClaimView):
        def lines(self, result, unit):
            return [len(result.per_prompt or [])]  # not text: the report would print a number as a line

    class Unreadable(toy_kind.EntropyKind):
        view = NumbersView()

    claim = {"id": "L0H7-focused", "kind": "attention_entropy", "head": "L0H7", "at_most": 0.5}
    with pytest.raises(extend.ConformanceError, match="its view reads the result"):
        extend.check_claim_kind(Unreadable(), claim, FIXTURE)


def test_conformance_catches_a_metric_pointing_the_wrong_way():
    from harness import extend

    from . import toy_metric

    backwards = dataclasses_replace(toy_metric.METRIC, name="backwards",
                                    fn=lambda at, a, w, c: -toy_metric.METRIC.fn(at, a, w, c))
    with pytest.raises(extend.ConformanceError, match="higher means more of the clean behaviour"):
        extend.check_metric(backwards)


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)
