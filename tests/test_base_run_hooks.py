"""What the base runs hold: each hook cached once, filled batch by batch (no second copy made by
concatenating the batches), and in a corrupted run only the hooks some claim reads there
(ClaimKind.corrupted_hooks): a mean-ablation circuit reads every head's output in the clean run
and nothing in a corrupted one; a zero-ablation circuit reads no head's output at all (its
non-vacuity check makes them again chunk by chunk).  The verdicts and numbers do not change."""

from pathlib import Path

import numpy as np

from harness.claims.base import ClaimKind
from harness.claims.registry import kind_of
from harness.engine import measure
from harness.hypothesis.loading import load
from harness.mech import hooks
from harness.spec.names import hook_z

from .graph_helpers import ROOT

FIXTURE = str(ROOT / "fixtures" / "induction-2l")


def doc(ablation: str) -> dict:
    return {"harness": 1, "name": "hooks", "model": FIXTURE, "seed": 0, "metric": "logprob",
            "data": {"generator": "repeated_tokens", "n_prompts": 12, "segment_length": 6},
            "claims": [{"id": "c", "kind": "circuit", "heads": ["L0H7", "L1H5"], "ablation": ablation,
                        "at_most": 0.9},
                       {"id": "a", "kind": "ablation", "heads": ["L1H5"], "ablation": ablation, "at_least": 0.05}]}


def test_batches_fill_one_tensor_equal_to_the_batches_run_alone():
    """Caching in batches of 3 (3, 3, 3, 1 prompts) gives, hook by hook, exactly the four batches
    run alone and put end to end: the in-place fill puts every row where it belongs."""
    import torch

    from harness.engine import runner

    m = runner.load_model_cached(FIXTURE, "cpu")
    h = load(doc("zero"))
    ds = runner.build_dataset(h, m).select(list(range(10)))
    names = [hook_z(0), hook_z(1), "blocks.1.attn.hook_pattern", "hook_embed"]
    k, vocab = int(ds.positions.shape[1]), int(m.bridge.cfg.d_vocab)
    per_prompt = ds.clean.shape[1] * vocab * 4 + hooks.logits_bytes(k, vocab)
    got = hooks.cache_hooks(m.bridge, ds.clean, names, ds.positions, budget_bytes=3 * per_prompt)
    alone = [hooks.cache_hooks(m.bridge, ds.clean[lo:hi], names, ds.positions[lo:hi])
             for lo, hi in [(0, 3), (3, 6), (6, 9), (9, 10)]]
    for name in [*names, "logits_at"]:
        assert torch.equal(got[name], torch.cat([a[name] for a in alone])), name


def test_corrupted_runs_cache_what_their_claims_read_and_numbers_stay(monkeypatch):
    from harness.engine import runner
    from harness.mech.runs import build

    claims = load(doc("zero")).spec.claims
    clean, corrupted = measure.hooks_needed(claims, 2, figures=False)
    assert hook_z(0) not in clean and hook_z(1) in clean  # zeros replace L0H7: only the ablation claim's L1
    assert corrupted == []  # zero ablation: nothing read from the corrupted run
    clean, corrupted = measure.hooks_needed(load(doc("mean")).spec.claims, 2, figures=False)
    assert hook_z(0) in clean and hook_z(1) in clean and corrupted == []
    _, resample = measure.hooks_needed(load(doc("resample")).spec.claims, 2, figures=False)
    assert hook_z(0) in resample and hook_z(1) in resample  # the replacements come from there

    cached: list[list[str]] = []
    cache_hooks = hooks.cache_hooks

    def spy(bridge, tokens, names, *a, **kw):
        cached.append(list(names))
        return cache_hooks(bridge, tokens, names, *a, **kw)

    monkeypatch.setattr(build.hooks, "cache_hooks", spy)
    for ablation in ("zero", "mean"):
        cached.clear()
        lean = runner.run(doc(ablation), figures=False, base_dir=Path("."))
        assert (hook_z(1) if ablation == "zero" else hook_z(0)) in cached[0], ablation
        assert not any(hook_z(0) in c or hook_z(1) in c for c in cached[1:2]), ablation
        with monkeypatch.context() as every:  # the corrupted runs caching all the clean run caches
            for kind in {type(kind_of(c)) for c in claims}:
                every.setattr(kind, "corrupted_hooks", ClaimKind.corrupted_hooks)
            cached.clear()
            full = runner.run(doc(ablation), figures=False, base_dir=Path("."))
            assert hook_z(1) in cached[1]
        for a, b in zip(lean.claims, full.claims, strict=True):
            assert a.verdict == b.verdict and a.value == b.value and a.ci == b.ci, (ablation, a.id)
        assert np.isfinite(lean.claims[0].value)
