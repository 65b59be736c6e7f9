"""Path patching (harness.mech.edges.paths.patch_path) against tests/path_oracle.py, a plain
float64 GPT-2 written from the definition straight from the HF state dict.

One random float64 GPT-2 (3 layers, 2 heads, d_model 8, vocab 20, MLPs, random LayerNorm
affine parameters, weights scaled so that patches move the logits by O(0.1-1)), 4 base,
4 source and 4 reference prompts of 6 tokens.  The oracle is first checked on its own:
its forward equals transformers' logits, source == base changes nothing, an edge into
logits is the plain formula, and the intermediate change of a path is not written into
the residual stream (the path differs from the edges it could be confused with)."""

from __future__ import annotations

import pytest
import torch

from tests import path_oracle as oracle

N_LAYER, N_HEAD, D_MODEL, VOCAB, SEQ, N = 3, 2, 8, 20, 6, 4
TOL = 1e-6

EDGES = ["L0.mlp -> L1H0.q", "L0.mlp -> L2.mlp", "L1.mlp -> logits", "L0H1 -> L1.mlp", "L1H0 -> L1.mlp",
         "L0H0 + L0H1 -> L2H1.k", "L0H1 + L0.mlp -> logits", "embed -> L2.mlp"]
PATHS = ["L0H0 -> L1H1.k -> L2H0.q", "L0H1 -> L1.mlp -> logits", "embed -> L0H1.v -> L1.mlp -> L2H1.k",
         "L0H0 + L0H1 -> L1H0.v -> logits", "L0.mlp -> L1H1.q -> L2.mlp -> logits"]
SUBSET = ["L0.mlp -> L1H0.q", "L0H0 + L0H1 -> L2H1.k", "L0H1 + L0.mlp -> logits", "embed -> L2.mlp",
          "L0H0 -> L1H1.k -> L2H0.q", "embed -> L0H1.v -> L1.mlp -> L2H1.k", "L0.mlp -> L1H1.q -> L2.mlp -> logits"]
CASES = ([(p, "resample") for p in EDGES + PATHS]
         + [(p, r) for r in ("zero", "mean") for p in SUBSET])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random HF GPT-2 saved with save_pretrained; returns (dir, float64 GPT2LMHeadModel)."""
    pytest.importorskip("transformers")
    model = oracle.random_gpt2(VOCAB, D_MODEL, N_LAYER, N_HEAD)
    d = tmp_path_factory.mktemp("gpt2") / "m"
    model.save_pretrained(d)
    return d, model.double().eval()


@pytest.fixture(scope="module")
def weights(model_dir):
    return oracle.load(model_dir[0])


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(0)
    base, source, reference = torch.randint(0, VOCAB, (3, N, SEQ), generator=g)
    return base, source, reference


@pytest.fixture(scope="module")
def bridge(model_dir):
    from harness.model.ref import load_model

    return load_model(model_dir[0], dtype=torch.float64).bridge


def run(weights, tokens, path, replacement="resample"):
    sd, cfg = weights
    base, source, reference = tokens
    return oracle.patched_logits(sd, cfg, path, base, source, replacement, reference)


# ---------------------------------------------------------------- the oracle on its own


def test_oracle_forward_is_transformers(model_dir, weights, tokens):
    sd, cfg = weights
    base = tokens[0]
    with torch.no_grad():
        want = model_dir[1](base).logits
    got, _ = oracle.forward(sd, cfg, base)
    assert want.dtype == got.dtype == torch.float64
    assert (got - want).abs().max() < 1e-10
    # the HF state dict of the in-memory model gives the same (lm_head tied to wte)
    got2, _ = oracle.forward(oracle.prepare(model_dir[1].state_dict()), cfg, base)
    assert (got2 - want).abs().max() < 1e-10


@pytest.mark.parametrize("path", EDGES + PATHS)
def test_oracle_source_equal_to_base_changes_nothing(weights, tokens, path):
    sd, cfg = weights
    base = tokens[0]
    plain, _ = oracle.forward(sd, cfg, base)
    assert (oracle.patched_logits(sd, cfg, path, base, base, "resample") - plain).abs().max() < 1e-12
    assert (run(weights, tokens, path) - plain).abs().max() > 1e-3  # while a real patch moves the logits


@pytest.mark.parametrize("replacement", ["resample", "zero", "mean"])
def test_oracle_edge_into_logits_is_the_plain_formula(weights, tokens, replacement):
    """L0H1 + L0.mlp -> logits = LN_f(resid_final - out + out') W_U, written out by hand here."""
    sd, cfg = weights
    base, source, reference = tokens
    _, b = oracle.forward(sd, cfg, base)
    other = {"resample": source, "mean": reference, "zero": base}[replacement]
    _, o = oracle.forward(sd, cfg, other)
    out_b = b["head_out"][0][:, :, 1] + b["mlp_out"][0]
    out_o = o["head_out"][0][:, :, 1] + o["mlp_out"][0]
    out_new = {"resample": out_o, "mean": out_o.mean(0, keepdim=True), "zero": 0 * out_o}[replacement]
    resid = b["resid_final"] - out_b + out_new
    mu = resid.mean(-1, keepdim=True)
    var = (resid - mu).pow(2).mean(-1, keepdim=True)
    want = ((resid - mu) / torch.sqrt(var + cfg["eps"]) * sd["ln_f.weight"] + sd["ln_f.bias"]) @ sd["wte.weight"].T
    got = run(weights, tokens, "L0H1 + L0.mlp -> logits", replacement)
    assert (got - want).abs().max() < 1e-12


def test_oracle_last_layer_identities(weights, tokens):
    """The last MLP writes only into logits: `L2.mlp -> logits` is patching its output
    outright, and `X -> L2.mlp -> logits` is the edge `X -> L2.mlp`."""
    sd, cfg = weights
    base, source, _ = tokens
    _, src = oracle.forward(sd, cfg, source)
    node, _ = oracle.forward(sd, cfg, base, replace={("mlp", 2): src["mlp_out"][2]})
    assert (run(weights, tokens, "L2.mlp -> logits") - node).abs().max() < 1e-12
    for sender in ("L0H0", "L1.mlp", "embed", "L1H1 + L0.mlp"):
        path = run(weights, tokens, f"{sender} -> L2.mlp -> logits")
        assert (path - run(weights, tokens, f"{sender} -> L2.mlp")).abs().max() < 1e-12


def test_oracle_intermediate_change_stays_off_the_residual_stream(weights, tokens):
    """L0H0 -> L1H1.k -> L2H0.q is none of: the direct edge L0H0 -> L2H0.q, L1H1's full
    change into L2H0.q, or L0H0 -> L1H1.k with L1H1's change written into the stream."""
    path = run(weights, tokens, "L0H0 -> L1H1.k -> L2H0.q")
    for other in ("L0H0 -> L2H0.q", "L1H1 -> L2H0.q", "L0H0 -> L1H1.k"):
        assert (path - run(weights, tokens, other)).abs().max() > 1e-3, other


def test_oracle_refuses_backward_paths():
    for bad in ("L1H0 -> L1H1.k", "L1.mlp -> L1.mlp", "L1.mlp -> L1H0.q", "L0H0 -> logits -> L1.mlp",
                "L2H0 + L0H0 -> L1H0.q", "L0H0 -> L1H1 -> logits"):
        with pytest.raises(ValueError):
            oracle.parse_path(bad)


# ---------------------------------------------------------------- the harness against the oracle


@pytest.mark.parametrize(("path", "replacement"), CASES)
def test_patch_path_matches_oracle(bridge, weights, tokens, path, replacement):
    from harness.mech.edges.paths import patch_path
    from harness.spec import names

    base, source, reference = tokens
    want = run(weights, tokens, path, replacement)
    got = patch_path(bridge, names.parse_path(path), base, source, replacement=replacement,
                     reference_tokens=reference if replacement == "mean" else None)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64 and got.shape == want.shape
    plain, _ = oracle.forward(*weights, base)
    assert (want - plain).abs().max() > 1e-3  # the patch matters, so agreement is informative
    assert (got.cpu() - want).abs().max() < TOL


def test_patch_path_takes_an_edge(bridge, weights, tokens):
    from harness.mech.edges.paths import patch_path
    from harness.spec import names

    base, source, _ = tokens
    want = run(weights, tokens, "L0H1 -> L1H0.k")
    got = patch_path(bridge, names.parse_edge("L0H1 -> L1H0.k"), base, source)
    assert (got.cpu() - want).abs().max() < TOL


# ---------------------------------------------------------------- all routes (edge claims' routes: all)

ALL_ROUTES = ["L0H0 -> L2H1.q", "L0.mlp -> L2H0.k", "embed -> L2.mlp", "L0H1 + L1.mlp -> logits",
              "L0H0 + L1H1 -> L2H0.v", "L0H1 -> L1.mlp"]


@pytest.mark.parametrize("replacement", ["resample", "zero", "mean"])
@pytest.mark.parametrize("edge", ALL_ROUTES)
def test_all_routes_match_oracle(bridge, weights, tokens, edge, replacement):
    """The receiver's input recomputed with the sender replaced in a whole forward (the oracle
    replaces the senders' outputs in its own plain forward) equals paths.AllRoutes; where a
    component sits between the ends, the result differs from the direct edge."""
    from harness.mech.edges.paths import AllRoutes, patch_path
    from harness.spec import names

    base, source, reference = tokens
    e = names.parse_edge(edge)
    ref = reference if replacement == "mean" else None
    want = oracle.patched_logits(*weights, edge, base, source, replacement, reference, all_routes=True)
    got = patch_path(bridge, AllRoutes(e), base, source, replacement=replacement, reference_tokens=ref)
    assert (got.cpu() - want).abs().max() < TOL
    direct = patch_path(bridge, e, base, source, replacement=replacement, reference_tokens=ref)
    first = min(names.layer_of(m) for m in names.members(e.sender))
    between = names.layer_of(e.receiver) - first > 1 or isinstance(e.receiver, names.Logits)
    if between:  # other components respond to the sender: all routes are not the direct edge
        assert (got - direct).abs().max() > 1e-3
    else:  # L0H1 -> L1.mlp: nothing sits between a head and its own layer's MLP
        assert (got - direct).abs().max() < TOL


def test_all_routes_into_logits_is_the_sender_patched(bridge, weights, tokens):
    """Every route into logits is the sender's whole effect: the sender's output replaced."""
    from harness.mech.edges.paths import AllRoutes, patch_path
    from harness.spec import names

    base, source, _ = tokens
    got = patch_path(bridge, AllRoutes(names.parse_edge("L0H1 -> logits")), base, source)
    _, src = oracle.forward(*weights, source)
    want, _ = oracle.forward(*weights, base, replace={("head", 0, 1): src["head_out"][0][:, :, 1]})
    assert (got.cpu() - want).abs().max() < TOL
