"""Ground-truth models: 2-layer attention-only TransformerLens native models
whose mechanisms are set by hand, so every verdict on them is known in advance.

No LayerNorm (normalization_type None), so the analysis is exact.  With
vocabulary V (token 0 is the start token) and context N, the residual stream
has four blocks of coordinates:

    tok  [0, V)              token one-hot (W_E)
    pos  [V, V+N)            position one-hot (W_pos)
    prev [V+N, 2V+N)         "previous token" one-hot, written by layer 0
    out  [2V+N, 3V+N)        read by the unembedding (W_U = GAIN * identity there)

Heads have d_head = max(V, N).  Attention logits are SHARP / sqrt(d_head) times
an indicator, so softmax is nearly hard.

* previous-token head (L0H0): q_i = pos one-hot of i-1, k_j = pos one-hot of j,
  so position i attends to i-1; OV copies tok into prev.
* induction head (L1H0): q_i = tok one-hot of token i, k_j = prev one-hot at j
  (the token before j), so it attends to the position after an earlier copy of
  the current token; OV copies tok into out: it predicts that copy's successor.
  Its keys read only what L0H0 writes (K-composition); its queries and values
  read tok, which layer 0 never writes.
* every other head: small random weights (scale 0.01).

Variants: `clean` (the above); `decoy` (+ L0H1 attends to the start token and
writes tok -> prev like L0H0, so it K-composes with L1H0 as strongly, but it adds
the same vector to every key, which softmax ignores: route present, unused);
`redundant` (L0H1 is a second previous-token head; each alone saturates the
induction head); `query` (a fifth block cur [3V+N, 4V+N): L0H1 attends to its
own position and copies tok into cur, and L1H0's queries read cur instead of
tok, so the induction head cannot work without L0H1; a corruption of the first
half of the prompt never changes L0H1's output where L1H0's queries read it);
`null` (same shapes, random weights, no mechanism).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..model.bridge import Bridge

V = 32  # vocabulary; token 0 is the start token
N = 24  # context
D_HEAD = max(V, N)
SHARP = 30.0  # attention logit of a match, before / sqrt(d_head)
GAIN = 10.0  # logit of the copied token
NOISE = 0.01  # scale of the unused heads' random weights
VARIANTS = ("clean", "decoy", "redundant", "query", "null")
TOK, POS, PREV, OUT, CUR = 0, V, V + N, 2 * V + N, 3 * V + N
D_MODEL = 3 * V + N


def config(seed: int, variant: str = "clean") -> dict[str, Any]:
    """The TransformerBridgeConfig fields (the `query` variant has the extra cur block)."""
    d_model = D_MODEL + V if variant == "query" else D_MODEL
    return {"d_model": d_model, "d_head": D_HEAD, "n_heads": 2, "n_layers": 2, "n_ctx": N, "d_vocab": V,
            "attn_only": True, "normalization_type": None, "positional_embedding_type": "standard",
            "model_name": "constructed", "seed": seed}


def build(variant: str, seed: int = 0) -> Any:
    """A native bridge (float32, on the CPU: the weights are drawn from a CPU
    generator, and runs move the saved model to their own device) with the
    variant's hand-set weights."""
    import torch
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**config(seed, variant)),  # type: ignore[attr-defined]
                                           device="cpu")
    m = bridge.original_model
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * NOISE)
        if variant == "null":
            for p in m.parameters():  # a plain random model, larger weights
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            return bridge
        eye_v, scale = torch.eye(V), SHARP * D_HEAD ** 0.5
        m.tok_embed.weight.zero_()
        m.tok_embed.weight[:, TOK:TOK + V] = eye_v
        m.pos.weight.zero_()
        m.pos.weight[:, POS:POS + N] = torch.eye(N)
        m.head.weight.zero_()
        m.head.weight[:, OUT:OUT + V] = eye_v * GAIN
        a0, a1 = m.layers[0].attn, m.layers[1].attn
        _prev_token_head(a0, 0, scale)
        if variant == "redundant":
            _prev_token_head(a0, 1, scale)
        if variant == "decoy":
            _first_token_writer(a0, 1, scale)
        if variant == "query":
            _current_token_head(a0, 1, scale)
        # induction head L1H0: q = tok (query variant: cur), k = prev, OV: tok -> out
        _zero_head(a1, 0)
        blk = _rows(0)
        reads = CUR if variant == "query" else TOK
        a1.q.weight[blk][:V, reads:reads + V] = eye_v * scale
        a1.k.weight[blk][:V, PREV:PREV + V] = eye_v
        a1.v.weight[blk][:V, TOK:TOK + V] = eye_v
        a1.o.weight[:, blk][OUT:OUT + V, :V] = eye_v
        a0.o.bias.zero_()
        a1.o.bias.zero_()
    return bridge


def _rows(head: int) -> slice:
    return slice(head * D_HEAD, (head + 1) * D_HEAD)


def _zero_head(attn: Any, head: int) -> None:
    blk = _rows(head)
    for lin in (attn.q, attn.k, attn.v):
        lin.weight[blk] = 0.0
        lin.bias[blk] = 0.0
    attn.o.weight[:, blk] = 0.0


def _prev_token_head(attn: Any, head: int, scale: float) -> None:
    """Attend from i to i-1 (positions); OV copies tok into prev."""
    import torch

    _zero_head(attn, head)
    blk = _rows(head)
    shift = torch.zeros(N, N)
    shift[torch.arange(N - 1), torch.arange(1, N)] = 1.0  # query at i -> direction i-1
    attn.q.weight[blk][:N, POS:POS + N] = shift * scale
    attn.k.weight[blk][:N, POS:POS + N] = torch.eye(N)
    attn.v.weight[blk][:V, TOK:TOK + V] = torch.eye(V)
    attn.o.weight[:, blk][PREV:PREV + V, :V] = torch.eye(V)


def _current_token_head(attn: Any, head: int, scale: float) -> None:
    """Attend from i to i (positions); OV copies tok into cur."""
    import torch

    _zero_head(attn, head)
    blk = _rows(head)
    attn.q.weight[blk][:N, POS:POS + N] = torch.eye(N) * scale
    attn.k.weight[blk][:N, POS:POS + N] = torch.eye(N)
    attn.v.weight[blk][:V, TOK:TOK + V] = torch.eye(V)
    attn.o.weight[:, blk][CUR:CUR + V, :V] = torch.eye(V)


def _first_token_writer(attn: Any, head: int, scale: float) -> None:
    """Attend to the start token (key = tok one-hot, query = constant e_0); OV tok -> prev."""
    import torch

    _zero_head(attn, head)
    blk = _rows(head)
    attn.q.bias[blk][0] = scale  # every query is scale * e_0
    attn.k.weight[blk][:V, TOK:TOK + V] = torch.eye(V)  # key of token t is e_t
    attn.v.weight[blk][:V, TOK:TOK + V] = torch.eye(V)
    attn.o.weight[:, blk][PREV:PREV + V, :V] = torch.eye(V)


def save(bridge: Bridge, variant: str, seed: int, out: Path) -> Path:
    """Write the model directory format (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in bridge.state_dict().items()},
              str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config(seed, variant), indent=2) + "\n")
    (out / "README.md").write_text(f"Constructed model `{variant}` (seed {seed}), built by "
                                   "`harness.constructed.build`; see that module's docstring.\n")
    return out


def build_all(root: Path, null_seeds: tuple[int, ...] = (0,)) -> dict[str, Path]:
    """Build clean, decoy, redundant, query and null-<seed> under root; return their paths."""
    paths = {v: save(build(v), v, 0, root / v) for v in ("clean", "decoy", "redundant", "query")}
    for s in null_seeds:
        paths[f"null-{s}"] = save(build("null", s), "null", s, root / f"null-{s}")
    return paths
