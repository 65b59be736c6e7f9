"""Hand-built attention-only models (no LayerNorm) whose causal answers are known.

Vocabulary V; residual dims [0, V) hold the token one-hot (W_E = [I 0]), dims
[V, 2V) are a scratch space, and W_U reads dims [0, V) only.  Every head has
W_Q = W_K = 0, so attention is uniform over the causal prefix.

* L0H0 ("copier"): OV copies the one-hot into the scratch space: its output at
  position p is the mean one-hot of tokens 0..p, written to [V, 2V).
* L0H1 ("silent"): W_V = 0, so its output is 0 on every input.
* L1H0 ("reader"): OV reads the scratch space and writes `gain` times it back
  into [0, V), so the logits favour tokens frequent in the prefix.

The only path from an earlier token to the logits at the last position is
L0H0 -> L1H0.v: that edge carries the whole clean-corrupted gap; L0H1's edges,
L0H0 -> L1H0.q/.k (q and k are constant) and L0H0 -> logits (scratch space is
not read by W_U) carry none.  With `redundant=True`, L0H1 is a second copier:
each copier alone saturates the reader, so single ablations move the metric
little and the joint ablation a lot.
"""

from __future__ import annotations

import torch

V = 6


def config() -> dict:
    return {"d_model": 2 * V, "d_head": V, "n_heads": 2, "n_layers": 2, "n_ctx": 16, "d_vocab": V,
                "attn_only": True, "normalization_type": None, "seed": 0}


def build(redundant: bool = False, gain: float = 8.0):
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_native(TransformerBridgeConfig(**config()), dtype=torch.float64)
    m = b.original_model
    eye = torch.eye(V, dtype=torch.float64)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.tok_embed.weight[:, :V] = eye  # W_E = [I 0]
        m.head.weight[:, :V] = eye  # W_U reads [0, V)
        a0, a1 = m.layers[0].attn, m.layers[1].attn
        copiers = (0, 1) if redundant else (0,)
        for h in copiers:  # nn.Linear weights are W^T: v.weight[h-block] = W_V^T
            a0.v.weight[h * V:(h + 1) * V, :V] = eye  # read the one-hot
            a0.o.weight[V:, h * V:(h + 1) * V] = eye * (1.0 if not redundant else 1.0)  # write scratch
        a1.v.weight[0:V, V:] = eye  # reader head 0 reads the scratch space
        a1.o.weight[:V, 0:V] = eye * gain  # and writes it back, amplified
    return b


def dataset(n: int = 40, seq: int = 10, seed: int = 0):
    """Clean prompts repeat one token often; corrupted prompts replace the early half.
    The scored position is the last one; the answer is the clean prompt's majority token."""
    from harness.data.dataset import Dataset

    g = torch.Generator().manual_seed(seed)
    major = torch.randint(0, V, (n,), generator=g)
    clean = torch.randint(0, V, (n, seq), generator=g)
    clean[:, : seq // 2 + 2] = major[:, None]
    corrupted = clean.clone()
    corrupted[:, : seq // 2 + 2] = (major[:, None] + 1 + torch.randint(0, V - 1, (n, 1), generator=g)) % V
    corrupted[:, -1] = clean[:, -1]
    positions = torch.full((n, 1), seq - 1)
    return Dataset(clean, {"default": corrupted}, positions, major[:, None].clone(), None, "hand-built majority",
                   False)
