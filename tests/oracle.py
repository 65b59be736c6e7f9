"""A slow, plainly written forward pass of a native attention-only LN model,
straight from the state dict in float64 — an oracle independent of the
bridge's hooks.  `z_edit(layer, z)` may replace the heads' z [n, seq, H, d_head]."""

import math

import torch


def layer_norm(x, w, b, eps):
    if w is None:  # normalization_type None
        return x
    x = x - x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b


def forward(sd, cfg, tokens, z_edit=None, want_z=False, input_edit=None, final_edit=None):
    """input_edit(layer, resid) -> {(head, "q"|"k"|"v"): residual that input reads}
    final_edit(resid) -> residual read by ln_final (exact edge patching by hand)."""
    sd = {k: v.double() for k, v in sd.items()}
    n, s = tokens.shape
    H, dh, eps = cfg["n_heads"], cfg["d_head"], cfg.get("eps", 1e-5)
    x = sd["embed.weight"][tokens] + sd["pos_embed.weight"][:s]
    zs = {}
    for layer in range(cfg["n_layers"]):
        p = f"blocks.{layer}."
        h = layer_norm(x, sd.get(p + "ln1.weight"), sd.get(p + "ln1.bias"), eps)
        q, k, v = ((h @ sd[p + f"attn.{w}.weight"].T + sd[p + f"attn.{w}.bias"]).view(n, s, H, dh)
                   for w in "qkv")
        edits = input_edit(layer, x) if input_edit is not None else {}
        for (head, w), resid in edits.items():
            normed = layer_norm(resid, sd.get(p + "ln1.weight"), sd.get(p + "ln1.bias"), eps)
            lin = (normed @ sd[p + f"attn.{w}.weight"].T + sd[p + f"attn.{w}.bias"]).view(n, s, H, dh)
            {"q": q, "k": k, "v": v}[w][:, :, head] = lin[:, :, head]
        scores = torch.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(dh)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
        pattern = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        z = torch.einsum("nhqk,nkhd->nqhd", pattern, v)
        zs[layer] = z
        if z_edit is not None:
            z = z_edit(layer, z)
        x = x + z.reshape(n, s, H * dh) @ sd[p + "attn.o.weight"].T + sd[p + "attn.o.bias"]
    if final_edit is not None:
        x = final_edit(x)
    x = layer_norm(x, sd.get("ln_final.weight"), sd.get("ln_final.bias"), eps)
    logits = x @ sd["unembed.weight"].T + sd.get("unembed.bias", 0.0)
    return (logits, zs) if want_z else logits
