"""Coverage of the 95% intervals, by simulation: many small runs (60 prompts, each with its
own prompts) against a large-sample truth (2,000 prompts, 2,000 reference prompts), for
every ablation type, every edge replacement, and circuits under mean and resample
ablation.  The means that mean ablation and mean replacement substitute come from a
reference set (the generator's reference split, or leave-one-out for a prompt file) and
their uncertainty widens the interval; a mean taken over the same prompts, as a check
that this test can fail, covers far below the nominal rate."""

import json

import pytest

import harness
from harness.data import dataset as data

from .conftest import FIXTURE

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

SEGMENT = 10
N, REPLICATES, TRUTH_N = 60, 60, 2000
MIN_COVERAGE = 0.85  # nominal 0.95; 60 replicates of a true 0.92 fall below 0.85 with probability ~2%
# the negative control: means over the same prompts cover about 0.62 (0.6 on seeds 0-29, 0.65 on 0-39),
# far enough below 0.75 that 30 replicates tell it apart (a true 0.62 reaches 0.75 in 30 with probability ~8%;
# the seeds are fixed, so on a given machine the outcome is too)
SAME_REPLICATES = 30
CLAIMS = [
    {"id": "ablation-mean", "kind": "ablation", "heads": ["L0H7"], "ablation": "mean", "at_least": 0.5},
    {"id": "ablation-zero", "kind": "ablation", "heads": ["L0H7"], "ablation": "zero", "at_least": 0.5},
    {"id": "ablation-resample", "kind": "ablation", "heads": ["L0H7"], "ablation": "resample", "at_least": 0.5},
    {"id": "edge-mean", "kind": "edge", "edge": "L0H7 -> L1H5.k", "expect": "used", "replacement": "mean"},
    {"id": "edge-resample", "kind": "edge", "edge": "L0H7 -> L1H5.k", "expect": "used"},
    {"id": "edge-zero", "kind": "edge", "edge": "L0H7 -> L1H5.k", "expect": "used", "replacement": "zero"},
    # circuits ablate every head outside the circuit (at_most: no random circuits needed)
    {"id": "circuit-mean", "kind": "circuit", "heads": ["L0H7", "L1H5", "L1H1"], "ablation": "mean", "at_most": 2},
    {"id": "circuit-resample", "kind": "circuit", "heads": ["L0H7", "L1H5", "L1H1"], "ablation": "resample",
     "at_most": 2},
]
MEAN_CLAIMS = [c for c in CLAIMS if "mean" in c["id"]]


def run(model, data_spec, claims, bootstrap=1000):
    doc = {"harness": 1, "name": "coverage", "model": str(FIXTURE), "data": data_spec,
           "stats": {"bootstrap": bootstrap, "permutations": 100}, "claims": claims}
    return harness.run(doc, figures=False, model=model)


def generated(n, seed, n_reference=None):
    spec = {"generator": "repeated_tokens", "n_prompts": n, "segment_length": SEGMENT, "seed": seed}
    return spec | ({"n_reference": n_reference} if n_reference else {})


def prompt_file(tmp_path, seed, same_prompts_mean=False):
    """The generator's prompts as a JSONL file (means: leave-one-out, or over the same prompts)."""
    ds = data.repeated_tokens(N, SEGMENT, 128, seed=seed)
    f = tmp_path / f"p{seed}.jsonl"
    f.write_text("".join(json.dumps({"clean": c, "corrupted": k, "positions": p}) + "\n"
                         for c, k, p in zip(ds.clean.tolist(), ds.corrupted.tolist(), ds.positions.tolist(),
                                            strict=True)))
    spec = {"file": str(f)}
    if same_prompts_mean:
        ref = tmp_path / f"r{seed}.jsonl"
        ref.write_text("".join(json.dumps({"clean": c}) + "\n" for c in ds.clean.tolist()))
        spec["mean_from"] = str(ref)
    return spec


@pytest.fixture(scope="module")
def truth(fixture_model):
    ev = run(fixture_model, generated(TRUTH_N, 1_000_003, TRUTH_N), CLAIMS, bootstrap=200)
    return {c.id: c.value for c in ev.claims}


def coverage(results, truth):
    hits: dict[str, list[bool]] = {}
    for ev in results:
        for c in ev.claims:
            hits.setdefault(c.id, []).append(c.ci[0] <= truth[c.id] <= c.ci[1])
    return {k: sum(v) / len(v) for k, v in hits.items()}


def test_every_ablation_and_replacement_covers_at_its_nominal_rate(fixture_model, truth):
    cov = coverage([run(fixture_model, generated(N, seed), CLAIMS) for seed in range(REPLICATES)], truth)
    assert set(cov) == {c["id"] for c in CLAIMS}
    assert all(v >= MIN_COVERAGE for v in cov.values()), cov


def test_leave_one_out_means_cover_and_same_prompt_means_do_not(fixture_model, truth, tmp_path):
    loo = coverage([run(fixture_model, prompt_file(tmp_path, seed), MEAN_CLAIMS) for seed in range(REPLICATES)],
                   truth)
    assert all(v >= MIN_COVERAGE for v in loo.values()), loo
    # each prompt's own activation in its replacement: biased by about -0.75/n of the effect
    same = coverage([run(fixture_model, prompt_file(tmp_path, seed, same_prompts_mean=True), MEAN_CLAIMS)
                     for seed in range(SAME_REPLICATES)], truth)
    assert same["ablation-mean"] < 0.75, same
