"""A short smoke run of the fixture's training function (the real run is not repeated here)."""

import importlib.util
import sys

import torch

from .conftest import ROOT


def load_script():
    spec = importlib.util.spec_from_file_location("train_induction", ROOT / "fixtures" / "train_induction.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_batches_have_variable_offset_repeats():
    t = load_script()
    r = t.Recipe(batch=16)
    toks, mask = t.make_batch(r, torch.Generator().manual_seed(0))
    assert (toks[:, 0] == t.BOS).all() and mask.any(dim=1).all()
    starts = {int(row.nonzero()[0]) for row in mask}
    assert len(starts) > 5  # copies start at many different offsets


def test_training_smoke(tmp_path):
    t = load_script()
    r = t.Recipe(steps=3, batch=4)
    bridge, record = t.train(r, log_every=1)
    t.save(bridge, r, record, tmp_path)
    from harness.model.ref import load_model

    m = load_model(tmp_path)
    assert m.n_layers == 2 and len(record["history"]) == 3
