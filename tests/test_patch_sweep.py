"""`harness patch`: the residual stream patched at every layer x position, against the model's own
forward with one hook (TransformerLens's run_with_hooks) as the oracle."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from yaml import safe_dump as dump

from harness import stats
from harness.cli import main

from .conftest import FIXTURE

NAMES = FIXTURE.parent / "names-3l"
IOI = "When {IO} and {S} went to the {PLACE} , {S} gave a {OBJECT} to"
PEOPLE = ["Mary", "John", "Alice", "Bob", "Tom", "Anna"]


def _data(tmp_path, n=12, corruptions=None):
    d = tmp_path / "ioi.yaml"
    d.write_text(dump({"data": {"template": IOI, "slots": {"IO": PEOPLE, "S": list(PEOPLE), "PLACE": ["store", "park"],
                                                           "OBJECT": ["drink", "book"]},
                                "answer": " {IO}", "wrong": " {S}", "prepend_bos": True,
                                "corruptions": corruptions if corruptions is not None else {"abc": {"IO": "new",
                                                                                                    "S": "new"}},
                                "n_prompts": n}}))
    return d


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    from harness.engine.data_source import build_dataset, from_data_file
    from harness.engine.runner import load_model_cached
    from harness.mech.runs.build import base_runs
    from harness.spec.names import hook_resid_pre

    m = load_model_cached(str(NAMES), "cpu")
    ds = build_dataset(*from_data_file(_data(tmp_path_factory.mktemp("d")), "explore"), m)
    runs = base_runs(m.bridge, ds, [hook_resid_pre(layer) for layer in range(m.n_layers)], "logit_diff")
    return m, ds, runs


def _oracle(m, ds, direction):
    """e [L, s, n]: each cell patched by a hook on the model's own forward, every cell run."""
    bridge, L, (n, s) = m.bridge, m.n_layers, ds.clean.shape
    base, other = (ds.corrupted, ds.clean) if direction == "denoising" else (ds.clean, ds.corrupted)
    rows = torch.arange(n)

    def metric(logits):
        at = logits[rows, ds.positions[:, 0]].double()
        return (at[rows, ds.answers[:, 0]] - at[rows, ds.wrong[:, 0]]).numpy()

    with torch.no_grad():
        m_base = metric(bridge(base))
        _, cache = bridge.run_with_cache(other)
        e = np.zeros((L, s, n))
        for layer in range(L):
            name = f"blocks.{layer}.hook_resid_pre"
            for p in range(s):
                def put(x, hook, p=p, name=name):
                    x = x.clone()
                    x[:, p] = cache[name][:, p]
                    return x

                got = metric(bridge.run_with_hooks(base, fwd_hooks=[(name, put)]))
                e[layer, p] = got - m_base if direction == "denoising" else m_base - got
    return e


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_every_cell_equals_the_models_own_forward_with_one_hook(setting, direction):
    """Each cell's per-prompt effect equals a whole forward of the base prompts with the residual at
    (layer, position) put in by a hook, to float32's rounding of logits near 10; the cells left out
    (after the scored position, or the same in both runs) are ones the oracle finds no effect in."""
    from harness.mech.runs import position_patch

    m, ds, runs = setting
    cells = position_patch.cells_to_run(runs, "resid")
    got = position_patch.effects(runs, direction, cells)
    want = _oracle(m, ds, direction)
    scale = float(np.abs(want).max())
    assert scale > 1.0  # the map is not vacuous: some cell moves the logit difference by logits
    np.testing.assert_allclose(got, want, atol=1e-4 * scale)
    assert np.abs(want[~cells.run]).max() <= 1e-4 * scale
    assert cells.run.any(1).all() and not cells.run[:, 0].any()  # the BOS position never differs
    assert cells.forwards() == pytest.approx(sum(cells.run[layer].sum() * (3 - layer) / 3 for layer in range(3)))


def test_every_head_and_position_equals_a_hook_on_its_output(setting):
    """--heads: each (head, position) cell's per-prompt effect equals a whole forward of the corrupted
    prompts with that head's z at that position put in from the clean run by a hook; the cells left
    out are ones the oracle finds no effect in; the map of blocks 1-2 is those rows of the whole."""
    from harness.mech.runs import position_patch
    from harness.mech.runs.build import base_runs

    m, ds, _ = setting
    runs = base_runs(m.bridge, ds, position_patch.cache_names("heads", range(3)), "logit_diff")
    cells = position_patch.cells_to_run(runs, "heads")
    got = position_patch.effects(runs, "denoising", cells)  # [L, H, s, n]
    bridge, s, rows = m.bridge, ds.clean.shape[1], torch.arange(ds.n)

    def metric(logits):
        at = logits[rows, ds.positions[:, 0]].double()
        return (at[rows, ds.answers[:, 0]] - at[rows, ds.wrong[:, 0]]).numpy()

    want = np.zeros_like(got)
    with torch.no_grad():
        m_base = metric(bridge(ds.corrupted))
        _, cache = bridge.run_with_cache(ds.clean)
        for layer in range(m.n_layers):
            name = f"blocks.{layer}.attn.hook_z"
            for h in range(m.n_heads):
                for p in range(s):
                    def put(z, hook, p=p, h=h, name=name):
                        z = z.clone()
                        z[:, p, h] = cache[name][:, p, h]
                        return z

                    want[layer, h, p] = metric(bridge.run_with_hooks(ds.corrupted, fwd_hooks=[(name, put)])) - m_base
    scale = float(np.abs(want).max())
    assert scale > 1.0
    np.testing.assert_allclose(got, want, atol=1e-4 * scale)
    assert np.abs(want[~cells.run]).max() <= 1e-4 * scale
    part = position_patch.cells_to_run(runs, "heads", range(1, 3))
    assert not part.run[0].any() and (part.run[1:] == cells.run[1:]).all()


def test_chunks_of_prompts_and_positions_give_the_same_cells(setting):
    """A working memory of 8 prompt-variants (prompt chunks of 8 and 4, one or two positions a pass)
    gives every cell the values of one pass a layer, to float32's rounding (other batch shapes sum
    in another order)."""
    from harness.mech.runs import ablation, position_patch

    m, ds, runs = setting
    cells = position_patch.cells_to_run(runs, "resid")
    whole = position_patch.effects(runs, "denoising", cells)
    cfg = m.bridge.cfg
    one = ablation.bytes_per_variant(1, ds.clean.shape[1], cfg.d_model, cfg.d_mlp, cfg.n_heads, 4, 1, m.d_vocab_out)
    small = position_patch.effects(runs, "denoising", cells, budget_bytes=8 * one)
    np.testing.assert_allclose(small, whole, rtol=0, atol=1e-6 * float(np.abs(whole).max()))


def test_ratio_of_sums_interval_is_the_bootstrap_written_out():
    """stats.ratio_of_sums_ci: the estimate is sum(e) / sum(gap) per column, the interval the 2.5 and
    97.5 percentiles of the same ratio over multinomial resamples of the prompts, drawn from the seed."""
    rng = np.random.default_rng(3)
    gap = rng.uniform(0.5, 2.0, 40)
    e = gap[:, None] * rng.uniform(-0.2, 1.0, (40, 3))
    est, low, high = stats.ratio_of_sums_ci(e, gap, 500, 0.95, seed=7)
    np.testing.assert_allclose(est, e.sum(0) / gap.sum())
    w = np.random.default_rng(7).multinomial(40, np.full(40, 1 / 40), size=500)
    ratios = np.array([[(w[b] * e[:, c]).sum() / (w[b] * gap).sum() for c in range(3)] for b in range(500)])
    np.testing.assert_allclose(low, np.quantile(ratios, 0.025, axis=0))
    np.testing.assert_allclose(high, np.quantile(ratios, 0.975, axis=0))
    assert (low < est).all() and (est < high).all()
    nan = stats.ratio_of_sums_ci(e, -gap, 500, 0.95, seed=7)
    assert all(np.isnan(x).all() for x in nan)  # no positive gap: no fraction of it


def test_the_command_prints_the_map_and_writes_its_files(tmp_path, capsys, setting):
    """The printed map opens with the behaviour and the gap; patching.json holds every cell's effect
    and interval, the ones the library computes; the slot occurrences name their positions."""
    from harness.engine.data_source import from_data_file
    from harness.tools import patch_sweep

    m, _, _ = setting
    d = _data(tmp_path)
    out = tmp_path / "map"
    assert main(["patch", str(NAMES), "--data", str(d), "--out", str(out), "--top", "3"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[1].startswith("behaviour on the 12 clean prompts: accuracy")
    assert "clean - corrupted gap" in lines[3] and "strongest cells (95 % intervals):" in text
    assert "positions left out" in text and "0" in text.split("positions left out")[1].splitlines()[0]
    doc = json.loads((out / "patching.json").read_text())
    want = patch_sweep.patch_map(m, n_prompts=12, segment_length=4, seed=0, split="explore",
                                 given=from_data_file(d, "explore"))
    np.testing.assert_allclose(np.array(doc["effect"]), want.effect, rtol=1e-12)
    np.testing.assert_allclose(np.array(doc["low"]), want.low, rtol=1e-12)
    assert doc["direction"] == "denoising" and doc["metric"] == "logit_diff" and doc["rows"] == ["L0", "L1", "L2"]
    slots = {p["slot"] for p in doc["positions"]}
    assert {"IO#1", "S#1", "S#2", "PLACE#1", "OBJECT#1"} <= slots
    ran = np.array(doc["run"])
    assert ((np.array(doc["low"]) <= np.array(doc["effect"]) + 1e-12) | ~ran).all()
    assert (out / "patching.png").read_bytes()[:4] == b"\x89PNG"
    assert len((out / "patching.csv").read_text().splitlines()) == 1 + int(ran.sum())


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    d = _data(tmp_path)
    out = tmp_path / "map"
    assert main(["patch", str(NAMES), "--data", str(d), "--corruption", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --corruption nope: the data have abc"] and not out.exists()
    none = tmp_path / "plain.jsonl"  # prompts with no corrupted text: nothing to patch from
    none.write_text("".join(json.dumps({"text": f"When {a} and {b} went to the store , {b} gave a book to",
                                        "answer": f" {a}"}) + "\n" for a, b in [("Mary", "John"), ("Tom", "Anna")]))
    assert main(["patch", str(NAMES), "--data", str(none)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {none}:1: missing 'corrupted'"]


def test_heads_of_some_layers_from_the_command(tmp_path, capsys, monkeypatch):
    """--heads --layers 1-2: rows L1H0..L2H3 in patching.json; the printed table lists the rows of the
    strongest cells, and without --out every head goes to a new folder under reports/; blocks outside
    the model are one line."""
    d = _data(tmp_path)
    out = tmp_path / "heads"
    assert main(["patch", str(NAMES), "--data", str(d), "--heads", "--layers", "1-2", "--top", "4",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads((out / "patching.json").read_text())
    assert doc["site"] == "heads" and doc["rows"] == [f"L{layer}H{h}" for layer in (1, 2) for h in range(4)]
    best = [x for x in text.split("strongest cells (95 % intervals):\n")[1].splitlines() if x.startswith("  L")]
    assert len(best) == 4 and all(line.split()[0] in doc["rows"] for line in best)
    table = text.split("\n\n")[1].splitlines()
    assert table[0].startswith("head") and {r.split()[0] for r in table[2:]} == {line.split()[0] for line in best}
    monkeypatch.chdir(tmp_path)
    assert main(["patch", str(NAMES), "--data", str(d), "--heads", "--layers", "2-2"]) == 0
    (kept,) = (tmp_path / "reports").iterdir()
    assert capsys.readouterr().out.splitlines()[-1] == (f"every head is in reports/{kept.name}/ (patching.json, "
                                                        "patching.csv, patching.png)")
    assert json.loads((kept / "patching.json").read_text())["rows"] == [f"L2H{h}" for h in range(4)]
    assert main(["patch", str(NAMES), "--data", str(d), "--layers", "2-5"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --layers 2-5: the model has blocks 0-2"]
