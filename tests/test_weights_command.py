"""`harness weights` at real sizes: top pairs, the per-layer-pair summary, the full table for
small models, and `--out FOLDER` (composition.csv, composition.json, composition.png)."""

import csv
import io
import json
import math
import os
import sys

import numpy as np
import pytest

from harness import stats
from harness.cli import main
from harness.mech.weights import scores as W
from harness.mech.weights import table as CT
from harness.mech.weights.factored import Composition
from harness.model.ref import load_model
from harness.report.figures import text_problems
from harness.tools import weights_table as WT

from .conftest import FIXTURE, boot_random_native, save_native, tiny_config

DRAWS = 999


def direct(bridge, processing, n_draws, alpha, seed=0, max_draws=CT.MAX_DRAWS):
    """Scores, p and BH-adjusted p of every pair and mode, straight from Composition:
    {mode: {(l1, h1, l2, h2): (C, p, p_adj, draws)}}."""
    hw = W.head_weights(bridge, processing)
    comp = Composition(hw, seed)
    L, H = hw.n_layers, hw.n_heads
    pairs = [(l1, h1, l2, h2) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L) for h2 in range(H)]
    extend_to = min(W.draws_needed(len(pairs), alpha), max(max_draws, n_draws))
    out = {}
    for mode in W.MODES:
        scores = comp.scores(mode)
        p, used = comp.p_values(mode, n_draws, extend_to, alpha)
        adj = stats.benjamini_hochberg([float(p[q]) for q in pairs])
        out[mode] = {q: (float(scores[q]), float(p[q]), a, int(used[q])) for q, a in zip(pairs, adj, strict=True)}
    return out


def section(out, mode):
    """The terminal text of one mode, from its heading to the next mode's (or the summary)."""
    start = out.index(f"{mode.upper()}-composition (senders")
    ends = [out.index(f"{m.upper()}-composition (senders") for m in W.MODES if m != mode
            and out.index(f"{m.upper()}-composition (senders") > start] + [out.index("Per layer pair")]
    return out[start:min(ends)]


def top_rows(text):
    """(rank, sender, receiver, C, p, p_adj, decision) of a section's top table."""
    rows = []
    for line in text[text.index("top "):].splitlines()[3:]:
        if not line.strip():
            break
        f = line.split()
        rows.append((int(f[0]), f[1], f[2], float(f[3]), float(f[4]), float(f[5]), f[6]))
    return rows


def summary_rows(out):
    """{(sender layer, receiver layer): [pairs, q sig, q comp, q max, q mean, k sig, ..., baseline]}."""
    lines = out[out.index("Per layer pair"):].splitlines()[3:]
    rows = {}
    for line in lines:
        if not line.startswith("L"):
            break
        f = line.split()
        rows[(int(f[0][1:]), int(f[1][1:]))] = [float(x) for x in f[2:]]
    return rows


@pytest.fixture(scope="module")
def three_layer(tmp_path_factory):
    """A random 3-layer native model with 6 heads a layer (18 heads: above FULL_MAX_HEADS)."""
    cfg = tiny_config(n_layers=3, n_heads=6, d_head=4, d_model=24, d_vocab=30, n_ctx=16, seed=3)
    return save_native(boot_random_native(cfg, 3), cfg, tmp_path_factory.mktemp("m") / "three")


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory):
    """`harness weights fixtures/induction-2l --out FOLDER`: (terminal text, folder)."""
    folder = tmp_path_factory.mktemp("w") / "out"
    import contextlib

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["weights", str(FIXTURE), "--draws", str(DRAWS), "--top", "5", "--out", str(folder)]) == 0
    return buf.getvalue(), folder


@pytest.fixture(scope="module")
def fixture_direct():
    return direct(load_model(FIXTURE).bridge, "folded", DRAWS, 0.01)


def test_fixture_terminal_top_pairs_header_and_full_table(fixture_run, fixture_direct):
    out, folder = fixture_run
    head = out.splitlines()[0]
    assert "weights folded" in head and f"{DRAWS} shared null draws" in head
    assert "isotropic baseline 1/sqrt(63) = 0.126" in head and "Rotary" not in out
    k = section(out, "k")
    rows = top_rows(k)
    assert rows[0][:3] == (1, "L0H7", "L1H5.k") and rows[0][6] == "yes"  # the previous-token head's route
    d = fixture_direct["k"]
    want = sorted(d, key=lambda q: -d[q][0])[:5]
    assert [(r[1], r[2]) for r in rows] == [(f"L{q[0]}H{q[1]}", f"L{q[2]}H{q[3]}.k") for q in want]
    for r, q in zip(rows, want, strict=True):
        c, p, adj, _ = d[q]
        assert r[3] == pytest.approx(c, abs=5e-4) and r[4] == pytest.approx(p, rel=5e-3)
        assert r[5] == pytest.approx(adj, rel=5e-3) and r[6] == ("yes" if adj < 0.01 else "no")
    n_sig = sum(v[2] < 0.01 for v in d.values())
    assert f"{n_sig} of 64 pairs significant" in k
    # 16 heads in all: the full table is still printed, `*` on significant cells
    assert "all pairs (rows: sender OV; columns: receiver .k; * = significant)" in k
    l0h7 = next(line for line in k.splitlines() if line.startswith("L0H7 "))
    assert l0h7.split()[6] == f"{d[(0, 7, 1, 5)][0]:.3f}*"
    assert f"wrote {folder / 'composition.csv'}" in out


def composes(vals: dict, q: tuple, alpha: float, min_ratio: float = 1.3) -> bool:
    """The rule by hand: p_adj < alpha, and C >= min_ratio x the median C of the other earlier
    senders into the same input when there are at least 5 of them."""
    c, _, adj, _ = vals[q]
    peers = [v[0] for k, v in vals.items() if k[2:] == q[2:] and k[:2] != q[:2] and v[0] == v[0]]
    return adj < alpha and (len(peers) < 5 or c >= min_ratio * float(np.median(peers)))


def test_fixture_summary_counts_match_composition(fixture_run, fixture_direct):
    out, _ = fixture_run
    rows = summary_rows(out)
    assert list(rows) == [(0, 1)]
    r = rows[(0, 1)]
    assert r[0] == 64
    for i, mode in enumerate(W.MODES):
        vals = fixture_direct[mode].values()
        assert r[1 + 4 * i] == sum(v[2] < 0.01 for v in vals)
        assert r[2 + 4 * i] == sum(composes(fixture_direct[mode], q, 0.01) for q in fixture_direct[mode])
        assert r[3 + 4 * i] == pytest.approx(max(v[0] for v in vals), abs=5e-4)
        assert r[4 + 4 * i] == pytest.approx(np.mean([v[0] for v in vals]), abs=5e-4)
    assert r[-1] == pytest.approx(1 / math.sqrt(63), abs=5e-4)
    assert rows[(0, 1)][5] == 55  # K: 55 of 64 significant (docs/hypothesis-format.md)
    assert rows[(0, 1)][6] == 5  # of which 5 compose: L0H7 into five of the induction heads' keys


def test_fixture_csv_and_json_hold_the_in_memory_numbers(fixture_run, fixture_direct):
    _, folder = fixture_run
    assert sorted(p.name for p in folder.iterdir()) == ["composition.csv", "composition.json", "composition.png"]
    table = list(csv.DictReader(io.StringIO((folder / "composition.csv").read_text())))
    assert len(table) == 64 * 3 and list(table[0]) == list(WT.CSV_COLUMNS)
    doc = json.loads((folder / "composition.json").read_text())
    assert len(doc["pairs"]) == 64 * 3
    seen = set()
    for row, rec in zip(table, doc["pairs"], strict=True):
        mode = row["mode"]
        s, r = row["sender"], row["receiver"]
        q = (int(s[1]), int(s[3:]), int(r[1]), int(r[3:r.index(".")]))
        c, p, adj, draws = fixture_direct[mode][q]
        assert (float(row["score"]), float(row["p"]), float(row["p_adj"])) == (c, p, adj)  # exactly
        assert row["significant"] == ("true" if adj < 0.01 else "false") and int(row["null_draws"]) == draws
        want = composes(fixture_direct[mode], q, 0.01)
        assert row["composes"] == ("true" if want else "false")
        peers = [v[0] for k, v in fixture_direct[mode].items() if k[2:] == q[2:] and k[:2] != q[:2]]
        assert rec.pop("peer_ratio") == pytest.approx(c / float(np.median(peers)), rel=1e-9)
        assert rec == {"sender": s, "receiver": r, "mode": mode, "score": c, "p": p, "p_adj": adj,
                       "significant": adj < 0.01, "null_draws": draws, "composes": want}
        seen.add((mode, q))
    assert len(seen) == 192
    st = doc["settings"]
    assert (st["processing"], st["null_dim"], st["draws"], st["alpha"], st["seed"]) == ("folded", 63, DRAWS, 0.01, 0)
    assert st["extended_to"] == W.draws_needed(64, 0.01) and st["modes"] == ["q", "k", "v"]
    m = load_model(FIXTURE)
    assert st["model"]["source"] == m.source and st["model"]["sha256"] == m.sha256
    assert [s["significant"] for s in doc["summary"]["k"]] == [55]


def png_pixels(path):
    from PIL import Image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_fixture_png_is_a_valid_non_blank_heatmap(fixture_run):
    _, folder = fixture_run
    px = png_pixels(folder / "composition.png")
    assert px.shape[0] > 200 and px.shape[1] > 600
    assert px.std() > 10 and len(np.unique(px.reshape(-1, 3), axis=0)) > 50
    orange = np.all(np.abs(px.astype(int) - [0xe8, 0x59, 0x0c]) < 30, axis=-1)
    assert orange.sum() > 100  # the significant K cells carry their dots


def test_large_model_has_no_full_table_unless_asked(three_layer, capsys):
    assert main(["weights", str(three_layer), "--draws", "199", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "all pairs (rows" not in out and "(every pair: --full, or --out FOLDER" in out
    assert "3 layers x 6 heads, 108 cross-layer pairs per mode" in out
    assert [len(top_rows(section(out, m))) for m in W.MODES] == [3, 3, 3]
    assert main(["weights", str(three_layer), "--draws", "199", "--top", "3", "--full"]) == 0
    full = capsys.readouterr().out
    assert full.count("all pairs (rows") == 3 and "(every pair: --full" not in full


def test_three_layer_summary_and_files_match_composition(three_layer, tmp_path, capsys):
    alpha = 0.3  # loose, so some layer pairs have significant pairs to count
    folder = tmp_path / "o"
    assert main(["weights", str(three_layer), "--processing", "raw", "--draws", "199", "--alpha", str(alpha),
                 "--out", str(folder)]) == 0
    out = capsys.readouterr().out
    d = direct(load_model(three_layer).bridge, "raw", 199, alpha)
    rows = summary_rows(out)
    assert list(rows) == [(0, 1), (0, 2), (1, 2)]
    total = 0
    for (l1, l2), r in rows.items():
        assert r[0] == 36
        for i, mode in enumerate(W.MODES):
            block = [v for q, v in d[mode].items() if q[0] == l1 and q[2] == l2]
            assert r[1 + 4 * i] == sum(v[2] < alpha for v in block)
            total += r[1 + 4 * i]
            assert r[2 + 4 * i] == sum(composes(d[mode], q, alpha) for q in d[mode] if q[0] == l1 and q[2] == l2)
            assert r[3 + 4 * i] == pytest.approx(max(v[0] for v in block), abs=5e-4)
            assert r[4 + 4 * i] == pytest.approx(np.mean([v[0] for v in block]), abs=5e-4)
        assert r[-1] == pytest.approx(1 / math.sqrt(24), abs=5e-4)  # raw: null_dim = d_model
    assert total > 0
    table = list(csv.DictReader(io.StringIO((folder / "composition.csv").read_text())))
    assert len(table) == 108 * 3
    got = {(r["mode"], r["sender"], r["receiver"]): (float(r["score"]), float(r["p_adj"])) for r in table}
    want = {(m, f"L{q[0]}H{q[1]}", f"L{q[2]}H{q[3]}.{m}"): (v[0], v[2]) for m in W.MODES for q, v in d[m].items()}
    assert got == want
    doc = json.loads((folder / "composition.json").read_text())
    assert [[s["significant"] for s in doc["summary"][m]] for m in W.MODES] == \
        [[int(r[1 + 4 * i]) for r in rows.values()] for i in range(3)]
    png_pixels(folder / "composition.png")


def synthetic(n_layers, n_heads, seed=0, null_dim=767):
    """A WeightsTables of random numbers (no model): for the figure at GPT-2-small's size."""
    g = np.random.default_rng(seed)
    t = CT.WeightsTables("folded", n_layers, n_heads, null_dim, 1000, 20_000, 20_000, 1_000_000, 0.01, 0, False)
    L, H = n_layers, n_heads
    ok = np.zeros((L, H, L, H), dtype=bool)
    for l1 in range(L):
        ok[l1, :, l1 + 1:, :] = True
    for mode in W.MODES:
        c = np.where(ok, np.abs(g.normal(1 / math.sqrt(null_dim), 0.005, ok.shape)), np.nan)
        p = np.where(ok, g.uniform(size=ok.shape), np.nan)
        p[0, 0, 1, :] = 1e-9  # a few significant cells
        c[0, H - 1, L - 1, H - 1] = np.nan  # a pair with no route
        t.modes[mode] = CT.ModeTable(mode, c, p, p, np.full(ok.shape, 1000), np.full(ok.shape, 0.5), 0, 0,
                                     np.full(ok.shape, 1.5))
    return t


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 2), (12, 12)])
def test_figure_text_stands_clear_at_any_size(shape):
    from harness.report.weights_figure import composition_png, draw_composition

    t = synthetic(*shape)
    assert text_problems(draw_composition(t)) == []
    png = composition_png(t)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_an_existing_out_folder_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import harness.cli as cli

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(cli, "load_model", no_load)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert main(["weights", str(FIXTURE), "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "already exists" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    assert main(["weights", str(FIXTURE), "--out", str(link)]) == 2
    assert "is a symbolic link" in capsys.readouterr().err


def test_an_unwritable_out_parent_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import harness.cli as cli

    monkeypatch.setattr(cli, "load_model", lambda *a, **k: pytest.fail("loaded before --out was checked"))
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert main(["weights", str(FIXTURE), "--out", str(a_file / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a folder" in err and len(err.strip().splitlines()) == 1
    if sys.platform.startswith("linux"):  # no folder can be made in /proc, not even by root
        assert main(["weights", str(FIXTURE), "--out", "/proc/harness-weights-out"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "cannot write" in err and len(err.strip().splitlines()) == 1
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            assert main(["weights", str(FIXTURE), "--out", str(locked / "out")]) == 2
            assert "cannot write" in capsys.readouterr().err
        finally:
            locked.chmod(0o700)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.slow
def test_out_errors_from_the_command_line_have_no_traceback(tmp_path):
    import subprocess

    taken = tmp_path / "taken"
    taken.mkdir()
    for out in (taken, tmp_path / "file" / "out"):
        (tmp_path / "file").write_text("")
        r = subprocess.run([sys.executable, "-m", "harness", "weights", str(FIXTURE), "--out", str(out)],
                           capture_output=True, text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert [line for line in r.stderr.splitlines() if not line.startswith("[")][0].startswith("error: ")
