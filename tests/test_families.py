"""Exact patching on every architecture family harness supports, held to an independent
float64 reference forward (tests/family_oracle.py) of Llama, Mistral, Qwen2, Gemma 2,
GPT-NeoX (Pythia) and GPT-2 models built here with random weights (tests/family_models.py).

The harness model is loaded in float64 and run inside `Float64` (transformers computes
RMSNorm, rotary frequencies and the softmax in float32 even in a float64 model; the mode
makes those float64 too), so its unpatched logits equal the oracle's to ~1e-15 and every
patched quantity must equal the oracle's to 1e-9 of the logits' scale: fast path (the
model's own q/k/v hooks, or the receiver's z by hand for a shared key/value head), slow
path (the receiver's whole attention by hand), paths, ablations and the batched sweep.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harness.errors import UnsupportedError
from harness.mech import hooks
from harness.mech.block import attention
from harness.mech.edges import patching as P
from harness.mech.edges import paths, writes
from harness.model import architecture
from harness.spec import names

from . import family_models
from .family_oracle import Oracle
from .test_family_oracle import Float64

pytestmark = pytest.mark.slow  # make test-quick leaves this module out

REL = 1e-9
SEQ = 13


def tokens(seed: int, n: int = 3) -> torch.Tensor:
    return torch.randint(1, family_models.VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))


BASE, SOURCE = tokens(1), tokens(2)


class Family:
    """A built model, loaded by harness in exact float64, its oracle, and cached base/source runs."""

    def __init__(self, name: str, folder: Path):
        import harness

        self.name, self.folder = name, folder
        self.model = harness.load_model(folder, device="cpu", dtype=torch.float64)
        self.bridge = self.model.bridge
        hf = self.bridge.original_model
        for _, mod in list(hf.named_modules()):  # float64 rotary frequencies (the buffer stays float32 otherwise)
            if type(mod).__name__.endswith("RotaryEmbedding"):
                with Float64():
                    fresh = type(mod)(hf.config)
                for key, value in fresh.named_buffers():
                    getattr(mod, key).data = value
        self.oracle = Oracle(folder)
        self.arch = architecture.of(self.bridge)

    def cache(self, toks: torch.Tensor, wanted: list[str]) -> dict:
        with Float64():
            return hooks.cache_hooks(self.bridge, toks, wanted)

    def scale(self) -> float:
        return float(self.oracle.run(BASE)["logits"].abs().max())


@pytest.fixture(scope="module", params=family_models.FAMILIES + family_models.NEW_FAMILIES)
def fam(request, tmp_path_factory) -> Family:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        folder = family_models.build(request.param, tmp_path_factory.mktemp(request.param) / "model")
        yield Family(request.param, folder)
    finally:
        torch.set_num_threads(before)


def oracle_node(node) -> tuple:
    if isinstance(node, names.Head):
        return ("head", node.layer, node.head)
    if isinstance(node, names.Embed):
        return ("embed",)
    if isinstance(node, names.Mlp):
        return ("mlp", node.layer)
    if isinstance(node, names.HeadInput):
        return (node.which, node.head.layer, node.head.head)
    return ("logits",)


def oracle_route(route) -> list:
    path = paths.as_path(route)
    sender = path.sender
    first = ([oracle_node(m) for m in names.members(sender)] if isinstance(sender, names.Group)
             else oracle_node(sender))
    return [first, *[oracle_node(h) for h in path.hops]]


def close(a: torch.Tensor, b: torch.Tensor, scale: float) -> bool:
    return float((a.double() - b.double()).abs().max()) <= REL * scale


def test_unpatched_logits_equal_the_oracle(fam):
    with Float64(), torch.no_grad():
        logits = fam.bridge(BASE).double()
    assert close(logits, fam.oracle.run(BASE)["logits"], fam.scale())


def test_hand_attention_reproduces_every_layer(fam):
    """mech.block.attention recomputes every head's z from the cached residual, as the model does."""
    cache = fam.cache(BASE, [n for L in range(fam.arch.n_layers) for n in (names.hook_resid_pre(L), names.hook_z(L))])
    with Float64():
        for L in range(fam.arch.n_layers):
            resid = cache[names.hook_resid_pre(L)]
            for h in range(fam.arch.n_heads):
                z = attention.head_z(fam.bridge, names.Head(L, h), dict.fromkeys("qkv", resid))
                assert torch.allclose(z, cache[names.hook_z(L)][:, :, h].double(), atol=1e-10, rtol=0)


def edges_of(fam: Family) -> list[str]:
    return ["L0H1 -> L1H2.q", "L0H1 -> L1H2.k", "L0H3 -> L1H1.v", "L0H0 -> L1H3.k", "embed -> L1H0.k",
            "embed -> L0H2.q", "L0H2 -> logits", "L1H3 -> logits", "embed -> logits"]


@pytest.mark.parametrize("replacement", ["resample", "zero", "mean"])
def test_edges_fast_slow_and_oracle_agree(fam, replacement):
    scale = fam.scale()
    edges = [names.parse_edge(e) for e in edges_of(fam)]
    wanted = P.cache_names(edges, fam.arch.n_layers)
    base, source = fam.cache(BASE, wanted), fam.cache(SOURCE, wanted)
    for e in edges:
        means = ({m: writes.activation(fam.bridge, source, m).mean(0, keepdim=True) for m in writes.members(e.sender)}
                 if replacement == "mean" else None)
        with Float64():
            patch = P.prepare(fam.bridge, e, base, source, replacement, means)
            fast = P.fast_logits(fam.bridge, BASE, patch, base=base)
            slow = P.slow_logits(fam.bridge, BASE, patch, base)
        mean = (fam.oracle.mean_values(SOURCE, [oracle_node(e.sender)])[oracle_node(e.sender)]
                if replacement == "mean" else None)
        want = fam.oracle.patched_logits(BASE, SOURCE, oracle_route(e), replacement, mean)
        assert close(fast, want, scale), (fam.name, str(e), float((fast.double() - want).abs().max()))
        assert close(slow, want, scale), (fam.name, str(e))
        unpatched = fam.oracle.run(BASE)["logits"]
        assert float((want - unpatched).abs().max()) > 1e-4 * scale, str(e)  # the patch changes the logits


def routes_of(fam: Family) -> list[str]:
    out = ["L0.mlp -> L1H2.v", "L0H1 -> L1.mlp", "L0H1 -> L1H2.k -> logits", "L0H0 + L0H3 -> L1H1.k",
           "embed -> L0.mlp -> L1H3.q -> logits", "L1.mlp -> logits"]
    if not fam.arch.parallel:
        out.append("L1H0 -> L1.mlp")  # a head feeds its own layer's MLP only in sequential blocks
    return out


def test_paths_and_mlp_ends_equal_the_oracle(fam):
    scale = fam.scale()
    routes = [names.parse_path(r) for r in routes_of(fam)]
    wanted = list(dict.fromkeys(n for r in routes for n in paths.cache_names(r, fam.arch.n_layers)))
    base, source = fam.cache(BASE, wanted), fam.cache(SOURCE, wanted)
    for r in routes:
        with Float64():
            got = hooks.run_plan(fam.bridge, BASE, paths.plan(fam.bridge, r, base, source, "resample"))
        want = fam.oracle.patched_logits(BASE, SOURCE, oracle_route(r))
        assert close(got, want, scale), (fam.name, str(r), float((got.double() - want).abs().max()))


def test_parallel_blocks_refuse_a_head_into_its_own_mlp(fam):
    if not fam.arch.parallel:
        pytest.skip("sequential blocks: a head does feed its own layer's MLP")
    r = names.parse_path("L1H0 -> L1.mlp")
    base = fam.cache(BASE, paths.cache_names(r, fam.arch.n_layers))
    with pytest.raises(UnsupportedError, match="parallel"):
        paths.plan(fam.bridge, r, base, base, "resample")


def test_head_ablation_equals_the_oracle(fam):
    scale = fam.scale()
    heads = [names.Head(0, 1), names.Head(1, 3)]
    with Float64():
        got = hooks.run_plan(fam.bridge, BASE, hooks.ablation_plan(heads, "zero", {}, {}))
    want = fam.oracle.ablated_logits(BASE, [(h.layer, h.head) for h in heads])
    assert close(got, want, scale)


def test_identity_patches_change_nothing(fam):
    """The sanity check every run makes: patching the base run into itself reproduces it."""
    edges = [names.parse_edge(e) for e in edges_of(fam)]
    base = fam.cache(BASE, P.cache_names(edges, fam.arch.n_layers))
    for e in edges:
        with Float64():
            got = P.fast_logits(fam.bridge, BASE, P.prepare(fam.bridge, e, base, base, "resample"), base=base)
        assert close(got, base["logits"], fam.scale()), str(e)


def test_grouped_keys_reach_only_their_query_head(fam):
    """L1H1.k under grouped-query attention: query head 1's z changes, its group partner's does not."""
    if not fam.arch.grouped:
        pytest.skip("one key/value head per query head")
    e = names.parse_edge("L0H2 -> L1H1.k")
    wanted = P.cache_names([e], fam.arch.n_layers)
    base, source = fam.cache(BASE, wanted), fam.cache(SOURCE, wanted)
    partner = 0 if fam.arch.kv_head(0) == fam.arch.kv_head(1) else 2
    seen = {}
    with Float64():
        plan = P.fast_plan(fam.bridge, P.prepare(fam.bridge, e, base, source, "resample"), base)
        plan.add(names.hook_z(1), lambda z, hook: seen.setdefault("z", z.detach().clone()))
        hooks.run_plan(fam.bridge, BASE, plan)
    z0 = base[names.hook_z(1)]
    assert not torch.allclose(seen["z"][:, :, 1], z0[:, :, 1], atol=1e-6)
    assert torch.allclose(seen["z"][:, :, partner], z0[:, :, partner], atol=1e-12, rtol=0)


def test_a_misread_architecture_is_refused(fam, monkeypatch):
    """The check of the hand attention fails, naming the features, if harness misreads one."""
    from dataclasses import replace

    wrong = replace(fam.arch, scales=tuple(s * 1.5 for s in fam.arch.scales))
    monkeypatch.setitem(architecture._KNOWN, fam.bridge, wrong)
    monkeypatch.setattr(attention, "_CHECKED", type(attention._CHECKED)())
    base = fam.cache(BASE, [names.hook_resid_pre(1), names.hook_z(1)])
    with pytest.raises(UnsupportedError, match="recomputed by hand differs"):
        with Float64():
            attention.check(fam.bridge, base, 1)


@pytest.mark.parametrize("replacement", ["resample", "zero"])
@pytest.mark.parametrize("budget", [1, 2**30])  # one edge per chunk vs everything at once
def test_batched_sweep_equals_the_per_edge_path(fam, replacement, budget):
    """Every edge of the model through mech.edges.batched (its own arithmetic: rotary, grouped
    keys, gated and parallel MLPs, post norms, soft caps, windows) equals the per-edge path."""
    import numpy as np

    from harness.mech.edges import batched, sets
    from harness.model import metrics

    arch = fam.arch
    edges = sets.all_edges(arch.n_layers, arch.n_heads)
    n, s = BASE.shape
    positions = torch.arange(4, s - 1).expand(n, -1).contiguous()
    answers = BASE.gather(1, positions + 1)
    wanted = sets.cache_names(arch.n_layers)
    base, source = fam.cache(BASE, wanted), fam.cache(SOURCE, wanted)

    def mf(logits, pos):
        return metrics.per_prompt(logits, pos, answers.repeat(logits.shape[0] // n, 1), "logprob")

    with Float64():
        got = batched.batched_metrics(fam.bridge, edges, base, source, base, positions, mf,
                                            replacement=replacement, budget_bytes=budget)
        want = np.stack([metrics.per_prompt(P.fast_logits(fam.bridge, BASE, P.prepare(fam.bridge, e, base, source,
                                                                                       replacement), base=base),
                                            positions, answers, "logprob").double().numpy() for e in edges])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert np.abs(want - want[:1]).max() > 1e-3  # the edges differ: the comparison is not of constants


def folded_from_oracle(fam: Family, layer: int, head: int) -> dict[str, torch.Tensor]:
    """The folded per-head matrices built from the oracle's own reading of the weights file:
    readers diag(w1) W (RMS, or Gemma's 1 + w; LN also centred), then times the QK-norm's gain
    (q and k), writers W_O diag(w_post) for a norm after the attention (Gemma 2 and 3, OLMo 2),
    then centred for LN; the key/value head's W_K, W_V."""
    o = fam.oracle
    lay = o.layers[layer]
    d = o.d_model

    def gain(w: torch.Tensor) -> torch.Tensor:
        return w + 1.0 if o.norm_kind == "rms_1p" else w

    w1 = torch.ones(d, dtype=torch.float64) if lay.norm1 is None else gain(lay.norm1[0])  # OLMo 2: no norm before
    g = int(o.kv_of[head])
    P = torch.eye(d, dtype=torch.float64) - (1.0 / d if o.norm_kind == "layer" else 0.0)
    out = {"W_Q": P @ (w1[:, None] * lay.W_Q[head]), "W_K": P @ (w1[:, None] * lay.W_K[g]),
           "W_V": P @ (w1[:, None] * lay.W_V[g])}
    if lay.q_norm is not None:  # the QK-norm's gain (the head's slice where it spans the projection)
        out["W_Q"] = out["W_Q"] * gain(lay.q_norm[head])
        out["W_K"] = out["W_K"] * gain(lay.k_norm[g])
    W_O = lay.W_O[head]
    if lay.post1 is not None:
        wp = lay.post1[0] + 1.0 if o.norm_kind == "rms_1p" else lay.post1[0]
        W_O = W_O * wp
    out["W_O"] = W_O @ P
    return out


def test_composition_scores_follow_the_architecture(fam):
    """C for L0H1 -> L1H2.{q,k,v} from the harness's Composition equals ||X Y|| / (||X|| ||Y||)
    built by hand from the oracle's weights: one-sided Y = W_Q / W_K under rotary positions
    (offset-free), W_Q W_K^T otherwise; grouped keys and values from the key/value head."""
    from harness.mech.weights.factored import Composition
    from harness.mech.weights.scores import head_weights

    comp = Composition(head_weights(fam.bridge, "folded"), seed=0)
    A, B = folded_from_oracle(fam, 0, 1), folded_from_oracle(fam, 1, 2)
    X = A["W_V"] @ A["W_O"]
    Ys = {"q": B["W_Q"] if fam.arch.rotary else B["W_Q"] @ B["W_K"].T,
          "k": B["W_K"] if fam.arch.rotary else B["W_K"] @ B["W_Q"].T,
          "v": B["W_V"] @ B["W_O"]}
    for mode, Y in Ys.items():
        want = float(torch.linalg.norm(X @ Y) / (torch.linalg.norm(X) * torch.linalg.norm(Y)))
        got = comp.score(names.Head(0, 1), names.HeadInput(names.Head(1, 2), mode))
        assert got == pytest.approx(want, abs=1e-10), (fam.name, mode)


def test_one_key_value_head_is_read_as_a_view(tmp_path):
    """Gemma 3 270M's layers have one key/value head: HeadWeights repeats its W_K, W_V for the four
    query heads as a view (no copy), and the scores equal those built by hand as above."""
    from harness.mech.weights.scores import head_weights

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mqa = Family("gemma3", family_models.build("gemma3", tmp_path / "model", num_key_value_heads=1))
        hw = head_weights(mqa.bridge, "folded")
        assert hw.W_K.stride(1) == 0 and hw.W_V.stride(1) == 0  # one key/value head's matrices, not four copies
        for h in range(4):
            own = folded_from_oracle(mqa, 1, h)
            assert torch.allclose(hw.W_K[1, h], own["W_K"], rtol=0, atol=1e-12)
            assert torch.allclose(hw.W_V[1, h], own["W_V"], rtol=0, atol=1e-12)
        test_composition_scores_follow_the_architecture(mqa)
    finally:
        torch.set_num_threads(before)


def test_offset_free_score_is_invariant_to_the_rotation(fam):
    """The one-sided score does not change when the receiver's queries are rotated by any offset
    (R orthogonal), while the two-sided W_Q R W_K^T form does."""
    if not fam.arch.rotary:
        pytest.skip("learned positions: the bilinear QK form has no offset")
    A, B = folded_from_oracle(fam, 0, 1), folded_from_oracle(fam, 1, 2)
    X = A["W_V"] @ A["W_O"]
    r, dh = fam.arch.rotary_dim, fam.arch.d_head

    def R(offset: float) -> torch.Tensor:
        theta = offset / 10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
        c, s = torch.cos(theta), torch.sin(theta)
        M = torch.eye(dh, dtype=torch.float64)
        half = r // 2
        idx = torch.arange(half)
        M[idx, idx], M[idx + half, idx + half] = c, c
        M[idx, idx + half], M[idx + half, idx] = s, -s
        return M

    def C(Y: torch.Tensor) -> float:
        return float(torch.linalg.norm(X @ Y) / (torch.linalg.norm(X) * torch.linalg.norm(Y)))

    one = [C(B["W_Q"] @ R(o)) for o in (0.0, 3.0, 17.0)]
    two = [C(B["W_Q"] @ R(o) @ B["W_K"].T) for o in (0.0, 3.0, 17.0)]
    assert max(one) - min(one) < 1e-12
    assert max(two) - min(two) > 1e-4


def test_copying_score_reads_the_folded_unembedding(fam):
    """Copying of L1H0 equals the eigenvalue positivity of W_E OV W_U built from the oracle's
    weights (final norm folded into W_U, Gemma's 1 + w, LN centring)."""
    import numpy as np

    from harness.mech.weights.scores import copying_score, head_weights

    o = fam.oracle
    hw = head_weights(fam.bridge, "folded")
    B = folded_from_oracle(fam, 1, 0)
    wf = o.norm_f[0] + 1.0 if o.norm_kind == "rms_1p" else o.norm_f[0]
    d = o.d_model
    P = torch.eye(d, dtype=torch.float64) - (1.0 / d if o.norm_kind == "layer" else 0.0)
    W_E = o.W_E @ P
    W_U = P @ (wf[:, None] * o.W_U)
    lam = np.linalg.eigvals((W_E @ B["W_V"] @ B["W_O"] @ W_U).numpy())
    want = float(lam.sum().real / np.abs(lam).sum())
    assert copying_score(hw, 1, 0).value == pytest.approx(want, abs=1e-8), fam.name


def test_explain_reads_the_same_route(fam):
    """`explain` decomposes the Y the score uses: its C equals the composition score, and a
    rotary model's q/k route has no receiver-side token readouts."""
    from harness.mech.weights.explain import Explainer
    from harness.mech.weights.factored import Composition
    from harness.mech.weights.scores import head_weights

    hw = head_weights(fam.bridge, "folded")
    sender, receiver = names.Head(0, 1), names.HeadInput(names.Head(1, 2), "k")
    ex = Explainer(hw, seed=0).explain(sender, receiver, draws=50)
    assert ex.score == pytest.approx(Composition(hw, seed=0).score(sender, receiver), abs=1e-10)
    has_far = all("receiver_reads" in r for r in ex.readouts)
    assert has_far is (not fam.arch.rotary)


def graph_inputs(fam):
    """What the edge-graph tests share: the scored positions (4 to the last but one), the answers (the
    next tokens), the base and source caches of what the graph reads, and the per-row logprob metric."""
    from harness.mech.graph import parts
    from harness.model import metrics

    n, s = BASE.shape
    positions = torch.arange(4, s - 1).expand(n, -1).contiguous()
    answers = BASE.gather(1, positions + 1)
    wanted = parts.cache_names(fam.arch.n_layers, fam.arch.has_mlp)
    base, source = fam.cache(BASE, wanted), fam.cache(SOURCE, wanted)

    def metric(logits_at, idx):
        k = logits_at.shape[1]
        return metrics.per_prompt(logits_at, torch.arange(k).expand(len(idx), k), answers[idx], "logprob")

    return positions, answers, base, source, metric


GRAPH_EDGES = ["L0H1 -> L1H2.q", "L0H3 -> L1H0.k", "L0H2 -> L1H1.v", "L0H0 -> L1.mlp", "L0.mlp -> L1H3.k",
               "L1H2 -> logits", "embed -> L1H1.q", "L0.mlp -> logits"]


def test_the_edge_graph_equals_the_oracle(fam):
    """The edge graph (mech.graph.forward) on every family, norms after the attention included (Gemma 2
    and 3, OLMo 2: a receiver's copy of a layer's attention output renormalised without the removed
    heads): every edge but one kept equals the oracle's exact patch of that edge (circuit_pass), as
    does that edge alone from its receiver's layer (edge_patches); and an edge's EAP score equals
    minus the derivative of the oracle's metric as the sender moves from its clean to its corrupted
    activation along the edge (a central difference: the first order through the norms)."""
    from harness.mech.graph import attribution, forward, parts
    from harness.model import metrics

    arch = fam.arch
    positions, answers, base, source, metric = graph_inputs(fam)

    def oracle_metric(logits):
        return metrics.per_prompt(logits, positions, answers, "logprob").double()

    with Float64():
        gm = forward.GraphModel.build(fam.bridge, base, positions)
        clean = parts.run_writes(fam.bridge, base, gm.s, torch.float64)
        rep = parts.run_writes(fam.bridge, source, gm.s, torch.float64)
        g = gm.graph
        edges = [names.parse_edge(e) for e in GRAPH_EDGES if arch.has_mlp or "mlp" not in e]
        edges = [e for e in edges if g.has(e)]
        pairs = [(g.sender_index(e.sender), g.receiver_index(e.receiver)) for e in edges]
        masks = np.repeat(g.full()[None], len(pairs), axis=0)
        for i, (u, v) in enumerate(pairs):
            masks[i, u, v] = False
        circuits = gm.circuits(clean, rep, masks, positions, metric)
        entering = [names.hook_resid_pre(layer) for layer in range(arch.n_layers)]
        entering += [names.hook_resid_post(arch.n_layers - 1)]
        singles = gm.edge_patches(clean, rep, lambda layer: base[entering[layer]], pairs, positions, metric)
        scale = float(oracle_metric(fam.oracle.run(BASE)["logits"]).abs().max())
        for i, e in enumerate(edges):
            route = oracle_route(e)
            want = oracle_metric(fam.oracle.patched_logits(BASE, SOURCE, route)).numpy()
            np.testing.assert_allclose(circuits[i], want, rtol=0, atol=1e-9 * scale, err_msg=str(e))
            np.testing.assert_allclose(singles[i], want, rtol=0, atol=1e-9 * scale, err_msg=str(e))
        for e, pair in zip(edges, pairs, strict=True):
            if not isinstance(e.sender, names.Head):
                continue
            got = attribution.edge_prompt_scores(gm, clean, rep, positions, metric, pair, method="eap")
            sender = oracle_node(e.sender)
            z_clean = fam.oracle.run(BASE)["z"][e.sender.layer][:, :, e.sender.head]
            z_corr = fam.oracle.run(SOURCE)["z"][e.sender.layer][:, :, e.sender.head]
            eps = 1e-4

            route = [sender, oracle_node(e.receiver)]

            def moved(t: float, route: list = route, a: torch.Tensor = z_clean,
                      b: torch.Tensor = z_corr) -> torch.Tensor:
                return oracle_metric(fam.oracle.patched_logits(BASE, None, route, "mean", a + t * (b - a)))

            want = -((moved(eps) - moved(-eps)) / (2 * eps)).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7 * scale, err_msg=f"EAP {e}")


def test_what_an_edge_circuit_receives_equals_the_oracle(fam):
    """An edge circuit's non-vacuity (mech.graph.received): for each receiver the circuit reads, the
    change its removed edges carry equals the model's own change of those senders' writes taken
    together (mech.edges.writes, through the norm after the attention where there is one), with the
    resample and with the zero replacement, summed over the receivers at each position they read."""
    from harness.mech.graph import forward, parts, received
    from harness.mech.graph.structure import Graph

    arch = fam.arch
    n, s = BASE.shape
    positions = torch.arange(4, s - 1).expand(n, -1).contiguous()
    g = Graph.of(fam.bridge)
    wanted = parts.cache_names(arch.n_layers, arch.has_mlp)
    wanted += [x for u in g.senders for x in writes.activation_names(u)]
    base, source = fam.cache(BASE, wanted), fam.cache(SOURCE, wanted)
    keep = g.adjacency & (np.random.default_rng(0).random(g.adjacency.shape) < 0.3)
    with Float64(), torch.no_grad():
        gm = forward.GraphModel.build(fam.bridge, base, positions)
        clean = parts.run_writes(fam.bridge, base, gm.s, torch.float64)
        scored = torch.zeros(n, gm.s, dtype=torch.float64).scatter_(1, positions, 1.0)
        upto = (torch.arange(gm.s)[None, :] <= positions.max(1, keepdim=True).values).double()
        got = received.received_squares(gm, clean, parts.run_writes(fam.bridge, source, gm.s, torch.float64), keep,
                                        scored, upto, budget=1)  # one prompt a chunk
        want = np.zeros((4, n, gm.s))
        for v in np.nonzero(received.receivers_read(keep))[0]:
            gone = [g.senders[u] for u in np.nonzero(g.adjacency[:, v] & ~keep[:, v])[0]]
            if not gone:  # every edge into v kept: v reads nothing changed
                continue
            sender = gone[0] if len(gone) == 1 else names.Group(tuple(gone))
            w = scored if received.reads_scored(g, v) else upto
            for j, (src, kind) in enumerate([(source, "resample"), (None, "zero")]):
                d = writes.sender_change(fam.bridge, base, src, sender, kind)[:, :gm.s]
                want[j] += (w * (d ** 2).sum(-1)).numpy()
                want[2 + j] += (d ** 2).sum(-1).numpy()
    assert (want[1].sum(-1) > 0).all() and (want[0] > 0).any()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)


def test_a_fractional_masks_gradient_is_the_circuits_derivative(fam):
    """An edge circuit with each edge removed by a fraction (what `harness discover --method learned`
    optimises): the gradient of the metric with respect to every edge's fraction, taken through the
    senders' changes (mech.graph.carried: a buffer read forward, each block of senders its own gradient
    backward), equals a central difference of the circuit's metric, norms after the attention included; at
    the full circuit too, where no edge is removed at all."""
    from harness.mech.graph import forward, parts

    positions, _, base, source, metric = graph_inputs(fam)
    n = BASE.shape[0]

    with Float64():
        gm = forward.GraphModel.build(fam.bridge, base, positions)
        clean = parts.run_writes(fam.bridge, base, gm.s, torch.float64)
        rep = parts.run_writes(fam.bridge, source, gm.s, torch.float64)
        g = gm.graph
        idx = torch.arange(n)
        adjacency = torch.from_numpy(g.adjacency).double()
        frac = adjacency * torch.from_numpy(np.random.default_rng(1).random(g.adjacency.shape))

        def total(removed: torch.Tensor) -> torch.Tensor:
            return metric(gm.circuit_pass(clean.embed, idx, rep, removed[None].expand(n, -1, -1), positions), idx).sum()

        us, rs = g.edge_index()
        picked = np.random.default_rng(2).choice(len(us), size=8, replace=False)
        eps = 1e-5
        for at in (frac, torch.zeros_like(frac)):  # fractions, and every edge kept whole (the full circuit)
            removed = at.clone().requires_grad_(True)
            with torch.enable_grad():
                (grad,) = torch.autograd.grad(total(removed), [removed])
            with torch.no_grad():
                scale = float(total(at).abs())
                for e in picked:
                    step = torch.zeros_like(at)
                    step[us[e], rs[e]] = eps
                    want = float((total(at + step) - total(at - step)) / (2 * eps))
                    got = float(grad[us[e], rs[e]])
                    assert abs(got - want) <= 1e-7 * scale, (str(g.edges()[e]), got, want)
            assert float(grad.abs().max()) > 0
