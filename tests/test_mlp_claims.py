"""Edge, path, ablation and circuit claims with MLPs, run end to end (harness.run on
hypothesis files) and checked against tests/path_oracle.py, a plain float64 GPT-2
written straight from the HF state dict.

One random float64 GPT-2 (tests/test_paths.py's construction: 3 layers, 2 heads,
d_model 8, vocab 20, weights scaled so patches matter), saved with save_pretrained and
loaded by the harness in float64 (load_model(dtype=float64), passed to harness.run:
the file's `model:` alone would load float32), and a JSONL file of 12 token-id prompts
(`metric: logit_diff`; each position's answer/wrong pair is the one the clean-corrupted
difference favours most, so every gap is positive).  Every claim's numbers are
recomputed with the oracle: metric per prompt on the clean, corrupted and intervened
runs, d_n, the normalised effect over the kept prompts, and for `mean` the
leave-one-out reference means with the delete-a-group jackknife the harness applies
(claims.effects.widen: estimate theta - (K-1)(mean theta_k - theta), K = 10 groups of
prompts i mod 10).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import path_oracle as oracle

from .documents import hypothesis as document
from .documents import write

N_LAYER, N_HEAD, D_MODEL, VOCAB, SEQ, N = 3, 2, 8, 20, 6, 12
TOL = 1e-6
GROUPS = 10  # mech.runs.cached.GROUPS
NUMERICAL_TOL = 1e-5  # claims.effects.NUMERICAL_TOL
ROOT = Path(__file__).resolve().parent.parent
STATS = {"bootstrap": 200, "permutations": 200, "null_draws": 99, "min_gap": 0.1, "min_prompt_gap": 0.05}

# (id, kind-specific keys); `pair` is the claim that is an edge in one file and a path in the other
ROUTES = [
    ("mlp-sender", {"kind": "edge", "edge": "L0.mlp -> L1H0.q"}),
    ("mlp-receiver", {"kind": "edge", "edge": "L0H1 -> L1.mlp"}),
    ("same-layer-head-mlp", {"kind": "edge", "edge": "L1H0 -> L1.mlp"}),
    ("group-heads", {"kind": "edge", "edge": "L0H0 + L0H1 -> L2.mlp"}),  # -> a head input: a test of its own
    ("group-head-mlp", {"kind": "edge", "edge": "L0H1 + L0.mlp -> logits"}),
    ("mlp-mlp-mean", {"kind": "edge", "edge": "L0.mlp -> L2.mlp", "replacement": "mean", "parts": True}),
    ("mlp-denoising", {"kind": "edge", "edge": "L1.mlp -> L2H0.q", "direction": "denoising"}),
    ("pair", {"kind": "edge", "edge": "L0H1 -> L1H0.k"}),
    ("head-edge", {"kind": "edge", "edge": "L0H0 -> L2H0.v", "parts": True}),  # with `pair`: the batched path
    ("path3-heads", {"kind": "path", "path": "L0H0 -> L1H1.k -> L2H0.q"}),
    ("path3-mlp", {"kind": "path", "path": "L0H1 -> L1.mlp -> L2H1.k"}),
    ("path4", {"kind": "path", "path": "embed -> L0H1.v -> L1.mlp -> L2H1.k"}),
    ("path4-logits-zero", {"kind": "path", "path": "L0.mlp -> L1H1.q -> L2.mlp -> logits", "replacement": "zero"}),
    ("path3-group-mean", {"kind": "path", "path": "L0H0 + L0.mlp -> L1H0.v -> logits", "replacement": "mean"}),
    ("all-routes", {"kind": "edge", "edge": "L0H0 -> L2H1.q", "routes": "all", "parts": True}),
    ("all-routes-mean", {"kind": "edge", "edge": "L0.mlp -> L2H0.k", "routes": "all", "replacement": "mean"}),
    ("all-routes-denoising", {"kind": "edge", "edge": "L0H1 + L1.mlp -> L2.mlp", "routes": "all",
                              "direction": "denoising", "parts": True}),
]
ABLATIONS = [(f"abl-{'-'.join(u.replace('.', '') for u in units)}-{kind}", units, kind)
             for units in (["L1.mlp"], ["L1.mlp", "L0H1"]) for kind in ("zero", "resample", "mean")]
CIRCUIT = ["L0H1", "L1.mlp", "L2H0"]


def route_text(keys: dict) -> str:
    return keys.get("edge") or keys["path"]


def all_routes(keys: dict) -> bool:
    return keys.get("routes") == "all"


# ---------------------------------------------------------------- model, prompts, oracle


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The oracle's many tiny matmuls: one thread is ~50x faster than two on shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random HF GPT-2 saved with save_pretrained, in float64 (path_oracle.random_gpt2)."""
    pytest.importorskip("transformers")
    model = oracle.random_gpt2(VOCAB, D_MODEL, N_LAYER, N_HEAD)
    d = tmp_path_factory.mktemp("gpt2") / "m"
    model.double().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def weights(model_dir):
    return oracle.load(model_dir)


@pytest.fixture(scope="module")
def loaded(model_dir):
    from harness.model.ref import load_model

    m = load_model(model_dir, dtype=torch.float64, device="cpu")
    assert next(m.bridge.parameters()).dtype == torch.float64
    return m


@pytest.fixture(scope="module")
def data(weights):
    """clean, corrupted [N, SEQ], positions [N, 2], answers, wrong [N, 2] (tensors)."""
    sd, cfg = weights
    g = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randint(0, VOCAB, (2, N, SEQ), generator=g)
    positions = torch.stack([torch.randperm(SEQ, generator=g)[:2].sort().values for _ in range(N)])
    lc, _ = oracle.forward(sd, cfg, clean)
    lx, _ = oracle.forward(sd, cfg, corrupt)
    rows = torch.arange(N)[:, None]
    diff = lc[rows, positions] - lx[rows, positions]  # [N, 2, vocab]
    return clean, corrupt, positions, diff.argmax(-1), diff.argmin(-1)


class Oracle:
    """The metric (logit_diff) of oracle runs, and the effects the harness reports."""

    def __init__(self, weights, data):
        self.sd, self.cfg = weights
        self.clean, self.corrupt, self.positions, self.answers, self.wrong = data
        self.m_clean = self.metric(self.forward(self.clean)[0])
        self.m_corrupt = self.metric(self.forward(self.corrupt)[0])
        self.scale = max(1.0, np.abs(self.m_clean).max(), np.abs(self.m_corrupt).max())
        self.kept = (self.m_clean - self.m_corrupt) >= STATS["min_prompt_gap"]

    def forward(self, tokens, replace=None):
        return oracle.forward(self.sd, self.cfg, tokens, replace)

    def metric(self, logits, rows=None, part=None):
        """logit_diff per prompt (part "answer": the answer's logit alone, answer_logit)."""
        rows = torch.arange(N) if rows is None else rows
        lg = logits[torch.arange(len(rows))[:, None], self.positions[rows]]
        good = lg.gather(-1, self.answers[rows].unsqueeze(-1)).squeeze(-1)
        bad = lg.gather(-1, self.wrong[rows].unsqueeze(-1)).squeeze(-1)
        return (good if part == "answer" else good - bad).mean(-1).numpy()

    def floor(self, d):
        return np.where(np.abs(d) < NUMERICAL_TOL * self.scale, 0.0, d)

    def reference(self, n, drop=None):
        """Prompt n's leave-one-out reference prompts (group `drop` left out too)."""
        return [i for i in range(N) if i != n and (drop is None or i % GROUPS != drop)]

    def patched(self, route, direction="noising", replacement="resample", drop=None, every=False, part=None):
        """m_patched per prompt (`every`: the edge by all routes; `part`: Oracle.metric's)."""
        base, source = (self.clean, self.corrupt) if direction == "noising" else (self.corrupt, self.clean)
        if replacement != "mean":
            return self.metric(oracle.patched_logits(self.sd, self.cfg, route, base, source, replacement,
                                                     all_routes=every), part=part)
        out = []
        for n in range(N):  # leave-one-out means: one base prompt at a time
            ref = self.clean[self.reference(n, drop)]
            lg = oracle.patched_logits(self.sd, self.cfg, route, base[n:n + 1], source[n:n + 1], "mean", ref,
                                       all_routes=every)
            out.append(self.metric(lg, torch.tensor([n]), part=part)[0])
        return np.asarray(out)

    def change(self, m_patched, direction="noising"):
        return self.floor(self.m_clean - m_patched if direction == "noising" else m_patched - self.m_corrupt)

    def ratio(self, d):
        k = self.kept
        return float(d[k].sum() / (self.m_clean - self.m_corrupt)[k].sum())

    def jackknifed(self, theta, thetas):
        return theta - (len(thetas) - 1) * (float(np.mean(thetas)) - theta)

    def loo_mean(self, x, drop=None):
        """Per prompt n: the per-position mean of x [N, ...] over n's reference prompts."""
        return torch.stack([x[self.reference(n, drop)].mean(0) for n in range(N)])

    def ablated(self, units, kind, drop=None, part=None):
        """m per prompt of the clean prompts with `units` (L1.mlp, L0H1) replaced."""
        _, c = self.forward(self.clean)
        _, x = self.forward(self.corrupt)
        replace = {}
        for u in units:
            node = oracle.parse_node(u)
            clean_out, corrupt_out = oracle.output(c, node), oracle.output(x, node)
            replace[node] = {"zero": torch.zeros_like(clean_out), "resample": corrupt_out,
                             "mean": self.loo_mean(clean_out, drop)}[kind]
        return self.metric(self.forward(self.clean, replace)[0], part=part)


@pytest.fixture(scope="module")
def orc(weights, data):
    o = Oracle(weights, data)
    assert o.kept.all() and (o.m_clean - o.m_corrupt).min() > 0.1  # every prompt's gap is defined
    return o


# ---------------------------------------------------------------- the hypothesis files and their runs


def claims(paired_as: str) -> list[dict]:
    out = []
    for cid, keys in ROUTES:
        keys = dict(keys)
        if cid == "pair" and paired_as == "path":
            keys = {"kind": "path", "path": keys.pop("edge"), **{k: v for k, v in keys.items() if k != "kind"}}
        out.append({"id": cid, **keys})
    out += [{"id": cid, "kind": "ablation", "heads": list(units), "ablation": kind, "measure": "delta", "at_least": 0.0,
             "parts": True} for cid, units, kind in ABLATIONS]
    out.append({"id": "circuit-mlp", "kind": "circuit", "heads": list(CIRCUIT), "ablation": "resample",
                "random_circuits": 20, "at_least": 0.0})
    return out


def write_data(folder: Path, data) -> Path:
    clean, corrupt, positions, answers, wrong = data
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"clean": clean[n].tolist(), "corrupted": corrupt[n].tolist(),
                                        "positions": positions[n].tolist(), "answers": answers[n].tolist(),
                                        "wrong": wrong[n].tolist()}) + "\n" for n in range(N)))
    return path


def hypothesis(folder: Path, name: str, model: Path | str, claim_list: list[dict], data_file="prompts.jsonl") -> Path:
    return write(folder, document(model, claim_list, name=name, data={"file": data_file}, metric="logit_diff",
                                  seed=0, stats=STATS))


@pytest.fixture(scope="module")
def folder(tmp_path_factory, model_dir, data):
    f = tmp_path_factory.mktemp("hyp")
    write_data(f, data)
    return f


@pytest.fixture(scope="module")
def runs(folder, model_dir, loaded):
    """{"edge": evidence, "path": evidence}: the two files differing only in claim `pair`."""
    import harness

    out = {}
    for as_ in ("edge", "path"):
        path = hypothesis(folder, f"mlp-{as_}", model_dir, claims(as_))
        out[as_] = harness.run(path, device="cpu", model=loaded, figures=False)
    return out


def by_id(evidence) -> dict:
    return {c.id: c for c in evidence.claims}


# ---------------------------------------------------------------- 1, 2: edge and path claims


def test_float64_baseline(runs, orc):
    c = by_id(runs["edge"])["mlp-sender"]
    assert abs(c.details.clean_metric_mean - orc.m_clean.mean()) < TOL
    assert abs(c.details.corrupted_metric_mean - orc.m_corrupt.mean()) < TOL


@pytest.mark.parametrize(("cid", "keys"), ROUTES, ids=[r[0] for r in ROUTES])
def test_route_claim_matches_oracle(runs, orc, cid, keys):
    c = by_id(runs["edge"])[cid]
    direction, replacement = keys.get("direction", "noising"), keys.get("replacement", "resample")
    every = all_routes(keys)
    m_patched = orc.patched(route_text(keys), direction, replacement, every=every)
    d = orc.change(m_patched, direction)
    assert (d != 0).any()  # the route matters, so agreement is informative
    if every:  # and the components in between matter: all routes are not the direct edge
        assert np.abs(m_patched - orc.patched(route_text(keys), direction, replacement)).max() > 1e-3
    gap = orc.m_clean - orc.m_corrupt
    det = c.details
    assert det.edge == route_text(keys) + (" (all routes)" if every else "")
    assert abs(det.clean_metric_mean - orc.m_clean.mean()) < TOL
    assert abs(det.corrupted_metric_mean - orc.m_corrupt.mean()) < TOL
    assert abs(det.patched_metric_mean - m_patched.mean()) < TOL, (det.patched_metric_mean, m_patched.mean())
    assert det.n_excluded_small_gap == 0
    np.testing.assert_allclose(c.per_prompt, (d / gap)[orc.kept], rtol=0, atol=TOL)
    theta = orc.ratio(d)
    if replacement == "mean":  # the delete-a-group jackknife of the reference mean (claims.effects.widen)
        thetas = [orc.ratio(orc.change(orc.patched(route_text(keys), direction, "mean", drop=k, every=every),
                                       direction))
                  for k in range(GROUPS)]
        assert abs(det.normalized - orc.jackknifed(theta, thetas)) < TOL
        assert abs(c.value - orc.jackknifed(theta, thetas)) < TOL
        assert "jackknife" in det.normalized_ci_method
        assert abs(theta - orc.jackknifed(theta, thetas)) > 1e-9  # the correction is there, and reproduced
    else:
        assert abs(c.value - theta) < TOL, (c.value, theta)
    assert abs(det.change_mean - d.mean()) < TOL or replacement == "mean"


def check_parts(c, orc, d, d_answer, jack=None):
    """The claim's parts (claims.metric_parts): the answer's logit and the wrong token's, each over
    the claim's gap, adding up to the claim's effect (with `jack`: the jackknife-corrected ones)."""
    answer, wrong = c.details.parts
    assert (answer.metric, wrong.metric) == ("answer_logit", "wrong_logit")
    gap, k = orc.m_clean - orc.m_corrupt, orc.kept
    for part, dp in ((answer, d_answer), (wrong, d - d_answer)):
        assert np.abs(dp).max() > 1e-3  # both parts move, so agreement is informative
        want = float(dp[k].sum() / gap[k].sum())
        if jack is not None:
            want = orc.jackknifed(want, jack(part.metric))
        assert abs(part.normalized - want) < TOL, (part.metric, part.normalized, want)
        assert part.normalized_ci[0] <= part.normalized <= part.normalized_ci[1]
    if jack is None:
        assert abs(answer.change_mean - d_answer.mean()) < TOL
    assert abs(answer.normalized + wrong.normalized - c.details.normalized) < TOL


@pytest.mark.parametrize("cid", [cid for cid, keys in ROUTES if keys.get("parts")])
def test_route_parts_match_oracle(runs, orc, cid):
    keys = dict(ROUTES)[cid]
    c = by_id(runs["edge"])[cid]
    route, every = route_text(keys), all_routes(keys)
    direction, replacement = keys.get("direction", "noising"), keys.get("replacement", "resample")
    noising = direction == "noising"

    def change(part, drop=None):
        m = orc.patched(route, direction, replacement, drop=drop, every=every, part=part)
        clean, corrupt = ((orc.m_clean, orc.m_corrupt) if part is None else
                          (orc.metric(orc.forward(orc.clean)[0], part=part),
                           orc.metric(orc.forward(orc.corrupt)[0], part=part)))
        return orc.floor(clean - m if noising else m - corrupt)

    def jack(metric):
        d_k = [change(None, k) for k in range(GROUPS)]
        a_k = [change("answer", k) for k in range(GROUPS)]
        gap, kept = orc.m_clean - orc.m_corrupt, orc.kept
        parts = a_k if metric == "answer_logit" else [d - a for d, a in zip(d_k, a_k, strict=True)]
        return [float(p[kept].sum() / gap[kept].sum()) for p in parts]

    check_parts(c, orc, change(None), change("answer"), jack if replacement == "mean" else None)


@pytest.mark.parametrize(("cid", "units", "kind"), ABLATIONS, ids=[a[0] for a in ABLATIONS])
def test_ablation_parts_match_oracle(runs, orc, cid, units, kind):
    c = by_id(runs["edge"])[cid]
    a_clean = orc.metric(orc.forward(orc.clean)[0], part="answer")

    def jack(metric):
        gap, kept = orc.m_clean - orc.m_corrupt, orc.kept
        out = []
        for k in range(GROUPS):
            d = orc.floor(orc.m_clean - orc.ablated(units, kind, drop=k))
            a = orc.floor(a_clean - orc.ablated(units, kind, drop=k, part="answer"))
            out.append(float((a if metric == "answer_logit" else d - a)[kept].sum() / gap[kept].sum()))
        return out

    check_parts(c, orc, orc.floor(orc.m_clean - orc.ablated(units, kind)),
                orc.floor(a_clean - orc.ablated(units, kind, part="answer")), jack if kind == "mean" else None)


def test_path_equals_its_edge_exactly(runs):
    """A two-node path has exactly the edge claim's numbers (same position, same seed)."""
    e, p = by_id(runs["edge"])["pair"], by_id(runs["path"])["pair"]
    assert e.kind == "edge" and p.kind == "path"
    assert e.value == p.value
    assert e.ci == p.ci
    assert e.details.p_value == p.details.p_value
    assert e.per_prompt == p.per_prompt
    assert e.details.patched_metric_mean == p.details.patched_metric_mean
    # every other claim is untouched by the swap
    for cid in by_id(runs["edge"]):
        if cid != "pair":
            assert by_id(runs["edge"])[cid].value == by_id(runs["path"])[cid].value, cid


def test_group_of_heads_into_head_input(folder, model_dir, loaded, orc):
    """A group of heads into a head input, whose combined write (k d_head = 8) is wider than
    the null's dimension (d_model - 1 = 7): the patch matches the oracle, and the
    weights-vs-use row has the group's combined composition score."""
    import harness

    route = "L0H0 + L0H1 -> L2H1.k"
    path = hypothesis(folder, "group-input", model_dir, [{"id": "g", "kind": "edge", "edge": route}])
    ev = harness.run(path, device="cpu", model=loaded, figures=False)
    c = ev.claims[0]
    m_patched = orc.patched(route)
    assert abs(c.details.patched_metric_mean - m_patched.mean()) < TOL
    assert abs(c.value - orc.ratio(orc.change(m_patched))) < TOL
    row = ev.weights_vs_use[0]
    assert row.edge == route and row.composes is not None and 0 < row.composition <= 1


# ---------------------------------------------------------------- 4: MLP ablation


@pytest.mark.parametrize(("cid", "units", "kind"), ABLATIONS, ids=[a[0] for a in ABLATIONS])
def test_mlp_ablation_matches_oracle(runs, orc, cid, units, kind):
    c = by_id(runs["edge"])[cid]
    m = orc.ablated(units, kind)
    d = orc.floor(orc.m_clean - m)
    assert (d != 0).all()
    assert c.details.heads == units
    assert abs(c.details.ablated_metric_mean - m.mean()) < TOL, (c.details.ablated_metric_mean, m.mean())
    np.testing.assert_allclose(c.per_prompt, d, rtol=0, atol=TOL)  # measure: delta -> per prompt d_n
    if kind == "mean":
        thetas = [orc.floor(orc.m_clean - orc.ablated(units, kind, drop=k)).mean() for k in range(GROUPS)]
        assert abs(c.value - orc.jackknifed(float(d.mean()), thetas)) < TOL
    else:
        assert abs(c.value - d.mean()) < TOL


# ---------------------------------------------------------------- 5: a circuit naming an MLP


def test_circuit_with_mlp_ablates_unnamed_heads_and_mlps(runs, orc):
    c = by_id(runs["edge"])["circuit-mlp"]
    pool = [f"L{l}H{h}" for l in range(N_LAYER) for h in range(N_HEAD)] + [f"L{l}.mlp" for l in range(N_LAYER)]

    def m_keep(keep):
        return orc.ablated([u for u in pool if u not in keep], "resample")

    m_c, m_empty = m_keep(CIRCUIT), m_keep([])
    assert abs(c.details.circuit_metric_mean - m_c.mean()) < TOL, (c.details.circuit_metric_mean, m_c.mean())
    assert abs(c.details.empty_metric_mean - m_empty.mean()) < TOL
    # heads alone (every MLP kept) would give another number: the MLPs are ablated
    heads_only = orc.ablated([u for u in pool if u not in CIRCUIT and "mlp" not in u], "resample")
    assert abs(heads_only.mean() - m_c.mean()) > 1e-3
    assert "MLPs included" in c.expectation and "2 heads and 1 MLP" in c.expectation
    gap = orc.m_clean - m_empty
    kept = gap >= STATS["min_prompt_gap"]
    if c.value is not None:
        f = float((m_c - m_empty)[kept].sum() / gap[kept].sum())
        assert abs(c.value - f) < TOL, (c.value, f)
    # random circuits are drawn from heads + MLPs: the best one is a 3-subset of that pool
    if c.details.random_faithfulness_max is not None:
        fs = [float((m_keep(list(s)) - m_empty)[kept].sum() / gap[kept].sum())
              for s in itertools.combinations(pool, len(CIRCUIT)) if set(s) != set(CIRCUIT)]
        assert min(abs(f - c.details.random_faithfulness_max) for f in fs) < TOL


# ---------------------------------------------------------------- 6: errors

BAD = [
    ("backward", {"kind": "edge", "edge": "L1.mlp -> L1H0.q"}, "does not go forward"),
    ("twice", {"kind": "edge", "edge": "L0H1 + L0H1 -> L1H0.q"}, "l0h1 twice"),
    ("composition", {"kind": "composition", "edge": "L0.mlp -> L1H0.k"}, "mlps have no composition score"),
    ("path-logits", {"kind": "path", "path": "L0H0 -> logits -> L1H0.q"}, "'logits' is not a path hop"),
]


def bad_file(folder: Path, name: str, model, claim: dict) -> Path:
    return hypothesis(folder, name, model, [{"id": "c0", **claim}, {"id": "pad", "kind": "edge",
                                                                     "edge": "L0H0 -> L1H1.q"}])


@pytest.fixture(scope="module")
def bad_files(folder, model_dir):
    out = {name: bad_file(folder, name, model_dir, claim) for name, claim, _ in BAD}
    attn = bad_file(folder, "attn-only", ROOT / "fixtures" / "induction-2l",
                    {"kind": "edge", "edge": "L0.mlp -> L1H0.q"})
    out["attn-only"] = attn
    return out


def claim_line(path: Path) -> int:
    """1-based line of the first claim's edge/path key (yaml.safe_dump layout)."""
    lines = path.read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if t.strip().startswith(("edge:", "path:")))


@pytest.mark.parametrize(("name", "word"), [(b[0], b[2]) for b in BAD] + [("attn-only", "attention-only")])
def test_bad_names_are_spec_errors(bad_files, loaded, name, word):
    import harness
    from harness.errors import SpecError

    path = bad_files[name]
    with pytest.raises(SpecError) as e:
        harness.run(path, device="cpu", figures=False, model=None if name == "attn-only" else loaded)
    msg = str(e.value)
    assert f"{path}:{claim_line(path)}:" in msg, msg
    assert word in msg.lower(), msg


@pytest.mark.slow
def test_bad_names_exit_2_from_the_cli(bad_files):
    for name, path in bad_files.items():
        r = subprocess.run([sys.executable, "-m", "harness", "validate", str(path)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2, (name, r.returncode, r.stdout, r.stderr)
        assert f"{path}:{claim_line(path)}:" in r.stdout + r.stderr, (name, r.stdout, r.stderr)
