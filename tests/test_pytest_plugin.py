"""The pytest plugin, run on temporary hypothesis files with pytester."""

import xml.etree.ElementTree as ET

import pytest
import yaml

import harness

from .conftest import FIXTURE, HYPOTHESES

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

BASE = {"harness": 1, "name": "plugin-test", "model": str(FIXTURE),
        "data": {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 10}}
PASSING = {"id": "prev-token-L0H7", "kind": "role", "head": "L0H7", "role": "previous_token", "at_least": 0.8}
FAILING = {"id": "L0H3-is-prev", "kind": "role", "head": "L0H3", "role": "previous_token", "at_least": 0.8}
INCONCLUSIVE = {"id": "undefined-effect", "kind": "ablation", "heads": ["L0H7"], "at_least": 0.5}


@pytest.fixture(autouse=True, scope="module")
def import_everything_first(demo_evidence, tmp_path_factory):
    """pytester's in-process runs drop the modules first imported inside them; C
    extensions (torch) re-imported that way crash at garbage collection.  A full
    run with a written report, here in the outer process, imports everything first."""
    harness.write_report(demo_evidence, out_dir=tmp_path_factory.mktemp("warm") / "r")


def write(pytester, name, claims, **extra):
    doc = dict(BASE, claims=claims, **extra)
    if INCONCLUSIVE in claims:
        doc["stats"] = {"min_gap": 100.0}  # no gap is that large: the normalised effect is undefined
    return pytester.makefile(".yaml", **{name: yaml.safe_dump(doc, sort_keys=False)})


def test_pass_fail_and_inconclusive_default(pytester):
    write(pytester, "mech", [PASSING, FAILING, INCONCLUSIVE])
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "mech.yaml::prev-token-L0H7 PASSED" in pytester.runpytest_inprocess("-v").stdout.str()
    assert "FAIL: L0H3-is-prev (role, observational evidence)" in out
    assert "expected: previous_token score of L0H3 >= 0.8" in out and "rule: CI [" in out
    assert "INCONCLUSIVE: undefined-effect" in out and "normalized effect undefined" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("how,outcome", [("xfail", {"xfailed": 1}), ("skip", {"skipped": 1}),
                                         ("fail", {"failed": 1})])
def test_inconclusive_option(pytester, how, outcome):
    write(pytester, "mech", [PASSING, INCONCLUSIVE])
    result = pytester.runpytest_inprocess(f"--harness-inconclusive={how}")
    result.assert_outcomes(passed=1, **outcome)


def test_inconclusive_ini_option(pytester):
    write(pytester, "mech", [INCONCLUSIVE])
    pytester.makeini("[pytest]\nharness_inconclusive = xfail\n")
    pytester.runpytest_inprocess().assert_outcomes(xfailed=1)


def test_device_option_and_ini(pytester):
    """The ini `harness_device` reaches run(); --harness-device wins over it."""
    write(pytester, "mech", [PASSING])
    pytester.makeini("[pytest]\nharness_device = gpu0\n")
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    assert "device 'gpu0' is not a device name" in result.stdout.str()
    pytester.runpytest_inprocess("--harness-device=cpu").assert_outcomes(passed=1)


def test_schema_error_is_a_collection_error_with_line(pytester):
    f = write(pytester, "bad", [dict(PASSING, head="L0H7.k")])
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(errors=1)
    line = next(i for i, text in enumerate(f.read_text().splitlines(), 1) if "L0H7.k" in text)
    assert f"bad.yaml:{line}: claims[0].head: 'L0H7.k' is not a head" in result.stdout.str()


def test_model_error_fails_every_item_without_traceback(pytester):
    f = write(pytester, "nomodel", [PASSING, FAILING])
    f.write_text(f.read_text().replace(str(FIXTURE), "./missing-model"))
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(failed=2)
    assert "does not exist" in result.stdout.str() and "Traceback" not in result.stdout.str()


def test_other_yaml_files_are_not_collected(pytester):
    pytester.makefile(".yaml", config="name: not-a-hypothesis\nclaims: []\n")
    pytester.makefile(".yml", other="harness_version: 1\n")
    write(pytester, "mech", [PASSING])
    pytester.runpytest_inprocess().assert_outcomes(passed=1)


def test_selection_markers_and_k(pytester):
    write(pytester, "mech", [PASSING, FAILING, dict(INCONCLUSIVE, id="abl")])
    pytester.runpytest_inprocess("-m", "not ablation").assert_outcomes(passed=1, failed=1)
    pytester.runpytest_inprocess("-k", "L0H7").assert_outcomes(passed=1)
    pytester.runpytest_inprocess("-x").assert_outcomes(passed=1, failed=1)  # stops at the first failure


def test_junitxml(pytester):
    write(pytester, "mech", [PASSING, FAILING])
    pytester.runpytest_inprocess("--junitxml=out.xml")
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").getroot().iter("testcase")}
    assert set(cases) == {"prev-token-L0H7", "L0H3-is-prev"}
    failure = cases["L0H3-is-prev"].find("failure")
    assert failure is not None and "previous_token score of L0H3 >= 0.8" in failure.get("message")
    props = {p.get("name"): p.get("value") for p in cases["prev-token-L0H7"].iter("property")}
    assert props["verdict"] == "PASS" and props["value"].startswith("0.9")


def test_report_and_seed_options(pytester):
    write(pytester, "mech", [PASSING])
    result = pytester.runpytest_inprocess("--harness-report=reports", "--harness-seed=3")
    result.assert_outcomes(passed=1)
    (folder,) = (pytester.path / "reports").iterdir()
    assert (folder / "evidence.json").is_file() and '"seed": 3' in (folder / "evidence.json").read_text()
    assert "harness evidence reports" in result.stdout.str()


def test_shipped_hypotheses_match_harness_run(pytester, demo_evidence):
    """`pytest hypotheses/` passes and fails exactly the claims `harness run` passes and fails."""
    import harness

    expected = {}
    for name, ev in (("induction", demo_evidence),
                     ("induction-false-claims", harness.run(HYPOTHESES / "induction-false-claims.yaml"))):
        text = (HYPOTHESES / f"{name}.yaml").read_text().replace("../fixtures/induction-2l", str(FIXTURE))
        pytester.makefile(".yaml", **{name: text})
        expected |= {f"{name}.yaml::{c.id}": c.verdict for c in ev.claims}
    result = pytester.runpytest_inprocess("-rA")
    reports = result.reprec.getreports("pytest_runtest_logreport")
    got = {r.nodeid: r.outcome for r in reports if r.when == "call"}
    assert got == {k: {"PASS": "passed", "FAIL": "failed"}[v] for k, v in expected.items()}
