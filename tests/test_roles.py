"""Role scores against hand-computed attention."""

import math

import pytest
import torch

from harness.mech import roles
from harness.spec.names import hook_pattern as pattern_hook

TOKENS = torch.tensor([[0, 1, 2, 1, 2, 3]])


def uniform_causal(s):
    return torch.tril(torch.ones(s, s)) / torch.arange(1, s + 1).view(s, 1)


@pytest.fixture(scope="module")
def uniform_model():
    """Tiny native model with W_Q = W_K = 0 and zero q/k biases: attention is
    uniform over the causal prefix, A[q, k] = 1 / (q + 1)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    from .conftest import tiny_config

    b = TransformerBridge.boot_native(TransformerBridgeConfig(**tiny_config()), dtype=torch.float64)
    with torch.no_grad():
        for layer in range(2):
            for w in ("q", "k"):
                getattr(b.original_model.layers[layer].attn, w).weight.zero_()
                getattr(b.original_model.layers[layer].attn, w).bias.zero_()
    return b


HAND = {
    # queries q = 1..5 each put 1/(q+1) on position q-1 (previous) and on 0 (first)
    "previous_token": sum(1 / (q + 1) for q in range(1, 6)) / 5,
    "first_token": sum(1 / (q + 1) for q in range(1, 6)) / 5,
    # q=3 (token 1, earlier at 1): induction key 2, duplicate key 1; q=4 (token 2, earlier at 2): keys 3 / 2
    "induction": (1 / 4 + 1 / 5) / 2,
    "duplicate_token": (1 / 4 + 1 / 5) / 2,
}


@pytest.mark.parametrize("role", roles.ROLES)
def test_role_scores_on_uniform_attention(uniform_model, role):
    _, cache = uniform_model.run_with_cache(TOKENS)
    pat = cache[pattern_hook(1)][:, 0]
    assert torch.allclose(pat[0], uniform_causal(6).double(), atol=1e-12)
    got = float(roles.role_scores(pat, TOKENS, role)[0])
    assert math.isclose(got, HAND[role], rel_tol=1e-12)


def test_role_scores_on_hand_written_patterns():
    tokens = torch.tensor([[0, 1, 2, 3, 1, 2]])  # induction targets: q=4 -> 2, q=5 -> 3
    s = 6
    prev = torch.zeros(1, s, s)
    prev[0, 0, 0] = 1
    for q in range(1, s):
        prev[0, q, q - 1] = 1
    assert float(roles.role_scores(prev, tokens, "previous_token")[0]) == 1.0
    assert float(roles.role_scores(prev, tokens, "induction")[0]) == 0.0
    assert float(roles.role_scores(prev, tokens, "duplicate_token")[0]) == 0.0
    ind = torch.zeros(1, s, s)
    ind[0, :, 0] = 1
    ind[0, 4, 0], ind[0, 4, 2] = 0, 1  # token 1 at q=4 attends after its earlier copy (1 -> 2)
    ind[0, 5, 0], ind[0, 5, 3], ind[0, 5, 2] = 0.25, 0.5, 0.25  # half on the right key, a quarter on the copy
    assert math.isclose(float(roles.role_scores(ind, tokens, "induction")[0]), 0.75)
    assert math.isclose(float(roles.role_scores(ind, tokens, "duplicate_token")[0]), 0.125)
    assert math.isclose(float(roles.role_scores(ind, tokens, "first_token")[0]), (3 + 0.25) / 5)


def test_undefined_score_is_nan():
    tokens = torch.tensor([[0, 1, 2, 3]])
    pat = uniform_causal(4).unsqueeze(0)
    assert math.isnan(float(roles.role_scores(pat, tokens, "induction")[0]))


def test_fixture_heads_match_model_card(fixture_model):
    from harness.data import dataset as data

    ds = data.repeated_tokens(50, 20, fixture_model.d_vocab, seed=5)
    _, cache = fixture_model.bridge.run_with_cache(ds.clean)
    prev = roles.role_scores(cache[pattern_hook(0)][:, 7], ds.clean, "previous_token").mean()
    ind = roles.role_scores(cache[pattern_hook(1)][:, 5], ds.clean, "induction").mean()
    assert prev > 0.9 and ind > 0.85
