"""The child processes of benchmarks/real_model.py that do harness's stages by hand with
TransformerLens 4.3 on the same `TransformerBridge` (`child_tl`: `run_with_cache` of the same hooks,
hooks for a mean ablation and an edge patch, EAP-IG through hooks with autograd), and its own
`attribution_patch` (`child_tl_attribution_patch`); what each computes is in real_model.py's
docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from real_model_children import (
    IG_STEPS,
    Child,
    Model,
    _names,
    _plain,
    stage_claims,
    start,
    tl_metric,
)


class ByHand:
    """Attention of one head computed by hand from a residual stream, on the bridge's HF modules:
    the layer's norm module, the head's q/k/v projection (its key/value group's under grouped-query
    attention), the rotation with the run's cos and sin, softmax(q k^T / sqrt(d_head)) with the
    causal mask, times v."""

    def __init__(self, bridge: Any, layer: int, head: int) -> None:
        self.bridge, self.layer, self.head = bridge, layer, head
        cfg = bridge.cfg
        self.n_heads, self.d_head = int(cfg.n_heads), int(cfg.d_head)
        self.n_kv = int(getattr(cfg, "n_key_value_heads", None) or self.n_heads)
        self.kv = head // (self.n_heads // self.n_kv)
        attn = bridge.blocks[layer].attn
        self.rotary = f"blocks.{layer}.attn.hook_rot_q" in bridge.hook_dict
        self.norm = bridge.blocks[layer].ln1.original_component
        self.proj = {x: getattr(attn, x).original_component for x in "qkv"}

    def hooks(self) -> list[str]:
        p = f"blocks.{self.layer}.attn."
        return [p + ("hook_rot_q" if self.rotary else "hook_q"), p + ("hook_rot_k" if self.rotary else "hook_k"),
                p + "hook_v"] + ([p + "hook_cos", p + "hook_sin"] if self.rotary else [])

    def z(self, which: str, resid: Any, got: dict[str, Any]) -> Any:
        """The head's z [n, pos, d_head] with input `which` read from `resid` [n, pos, d_model], the
        other two inputs (and cos, sin) from `got` (a cache of hooks())."""
        import torch

        q_name, k_name, v_name = self.hooks()[:3]
        x = self.proj[which](self.norm(resid))
        x = x.view(*x.shape[:2], -1, self.d_head)[:, :, self.head if which == "q" else self.kv]
        if self.rotary and which in "qk":
            cos, sin = got[f"blocks.{self.layer}.attn.hook_cos"], got[f"blocks.{self.layer}.attn.hook_sin"]
            half = x.shape[-1] // 2
            x = x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin
        q = x if which == "q" else got[q_name][:, :, self.head]
        k = x if which == "k" else got[k_name][:, :, self.kv]
        v = x if which == "v" else got[v_name][:, :, self.kv]
        scores = (q @ k.transpose(-1, -2)).float() / self.d_head ** 0.5
        n = scores.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        pattern = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(v.dtype)
        return pattern @ v


def with_head(bridge: Any, ds: Any, name: str, head: int, value: Any) -> Any:
    """The metric of the clean prompts with head `head`'s slice of hook `name` (its z) set to `value`."""
    def hook(z: Any, hook: Any) -> Any:
        z[:, :, head] = value
        return z

    return tl_metric(bridge.run_with_hooks(ds.clean, fwd_hooks=[(name, hook)]), ds)


def head_out(bridge: Any, layer: int, head: int, z: Any) -> Any:
    """z [n, pos, d_head] of one head times its slice of the output projection (HF weights; GPT-2's
    Conv1D stores it transposed)."""
    o = bridge.blocks[layer].attn.o.original_component
    d = z.shape[-1]
    w = o.weight
    part = w[head * d:(head + 1) * d] if type(o).__name__ == "Conv1D" else w[:, head * d:(head + 1) * d].T
    return z @ part


def child_tl(c: Child) -> dict[str, Any]:
    """TransformerLens by hand on the same bridge: run_with_cache, run_with_hooks, autograd."""
    import numpy as np
    import torch

    import harness
    from harness.engine.measure import hooks_needed

    sw, m, ds = start(c)
    bridge = m.bridge
    a, b, _ = _names(c)
    model = Model("", "", Path(c.folder), c.sender, c.receiver)
    doc = {"harness": 1, "name": "stages", "model": c.folder, "data": {"generator": "repeated_tokens", "bos": True},
           "claims": stage_claims(model)}
    hand = ByHand(bridge, b.layer, b.head)
    z_a, z_b = f"blocks.{a.layer}.attn.hook_z", f"blocks.{b.layer}.attn.hook_z"
    resid = f"blocks.{b.layer}.hook_resid_pre"
    wanted = list(dict.fromkeys(hooks_needed(harness.load_hypothesis(doc).spec.claims, m.n_layers)[0]
                                + hand.hooks() + [z_a, z_b, resid, "hook_embed"]))
    out: dict[str, Any] = {"hooks": len(wanted)}

    def base() -> tuple[Any, Any, Any, Any]:  # the metric included, as harness's base runs take it
        with torch.no_grad():
            lc, cc = bridge.run_with_cache(ds.clean, names_filter=wanted)
            mc = tl_metric(lc, ds)
            del lc
            lk, kc = bridge.run_with_cache(ds.corrupted, names_filter=wanted)
            mk = tl_metric(lk, ds)
        return mc, cc, mk, kc

    mc, clean, mk, corrupt = sw.time("base", base)
    out["base"] = _plain(np.concatenate([mc.cpu().numpy(), mk.cpu().numpy()]))

    if "ablation" in c.stages:
        def ablation() -> Any:
            with torch.no_grad():
                _, ref = bridge.run_with_cache(ds.reference, names_filter=[z_a])
                return with_head(bridge, ds, z_a, a.head, ref[z_a][:, :, a.head].mean(0))

        out["ablation"] = _plain(sw.time("ablation", ablation).cpu())

    if "edge" in c.stages:
        with torch.no_grad():  # the arithmetic by hand reproduces the model's own z of the receiver
            out["by_hand_check"] = float((hand.z("k", clean[resid], clean) - clean[z_b][:, :, b.head]).abs().max())

        def edge() -> Any:
            with torch.no_grad():
                r = (clean[resid] - head_out(bridge, a.layer, a.head, clean[z_a][:, :, a.head])
                     + head_out(bridge, a.layer, a.head, corrupt[z_a][:, :, a.head]))
                return with_head(bridge, ds, z_b, b.head, hand.z("k", r, clean))

        out["edge"] = _plain(sw.time("edge", edge).cpu())

    if "attribution" in c.stages:
        out["attribution"] = _plain(sw.time("attribution", lambda: tl_attribution(bridge, ds, hand, a, clean,
                                                                                 corrupt)))
    return {"stages": sw.rows, "numbers": out}


def tl_attribution(bridge: Any, ds: Any, hand: ByHand, a: Any, clean: Any, corrupt: Any,
                   batch: int = 16) -> Any:
    """EAP-IG (IG_STEPS points, noising) of sender `a` -> the receiver's .k, per prompt, with hooks."""
    import numpy as np
    import torch

    for p in bridge.parameters():
        p.requires_grad_(False)
    z_a = f"blocks.{a.layer}.attn.hook_z"
    resid = f"blocks.{hand.layer}.hook_resid_pre"
    z_b = f"blocks.{hand.layer}.attn.hook_z"
    delta = (head_out(bridge, a.layer, a.head, clean[z_a][:, :, a.head])
             - head_out(bridge, a.layer, a.head, corrupt[z_a][:, :, a.head]))  # clean - corrupted write
    out = np.zeros(ds.n)
    for lo in range(0, ds.n, batch):
        sl = slice(lo, min(ds.n, lo + batch))
        e_clean, e_corrupt = clean["hook_embed"][sl], corrupt["hook_embed"][sl]
        grad = torch.zeros_like(clean[resid][sl])
        for j in range(1, IG_STEPS + 1):
            alpha = j / IG_STEPS
            got: dict[str, Any] = {}

            def embed(x: Any, hook: Any, at: Any = e_corrupt + alpha * (e_clean - e_corrupt)) -> Any:
                return at

            def keeper(name: str, got: dict[str, Any] = got) -> Callable[[Any, Any], Any]:
                def keep(x: Any, hook: Any) -> Any:  # under its alias: hook.name is the canonical name
                    got[name] = x.detach()
                    return x
                return keep

            def leaf(x: Any, hook: Any, got: dict[str, Any] = got) -> Any:
                got["leaf"] = x.detach().clone().requires_grad_(True)
                return x

            def recompute(z: Any, hook: Any, got: dict[str, Any] = got) -> Any:
                z = z.clone()
                z[:, :, hand.head] = hand.z("k", got["leaf"], got)
                return z

            fwd = ([("hook_embed", embed), (resid, leaf)] + [(h, keeper(h)) for h in hand.hooks()]
                   + [(z_b, recompute)])
            logits = bridge.run_with_hooks(ds.clean[sl], fwd_hooks=fwd)
            sub = ds.select(list(range(sl.start, sl.stop)))
            tl_metric(logits, sub).sum().backward()
            grad += got["leaf"].grad
        out[sl] = (delta[sl] * (grad / IG_STEPS)).double().sum((1, 2)).cpu().numpy()
    return out


def child_tl_attribution_patch(c: Child) -> dict[str, Any]:
    """TransformerLens's attribution_patch, one pair per call, on the first tl_pairs prompts."""
    import torch

    from harness.mech.graph import attribution

    sw, m, ds = start(c)
    _, _, edge = _names(c)
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    pairs = min(c.tl_pairs, ds.n)
    keys = {attribution.transformer_lens_nodes(edge, p, m.n_layers) for p in range(ds.clean.shape[1])}
    scores: list[float] = []

    def work() -> None:
        for i in range(pairs):
            sub = ds.select([i])

            def metric(logits: Any, sub: Any = sub) -> Any:
                return tl_metric(logits, sub).sum()

            res = attribution_patch(m.bridge, ds.clean[i:i + 1], ds.corrupted[i:i + 1], metric,
                                    EdgeAttributionConfig(granularity="edge"))
            scores.append(sum(float(v) for k, v in res.edge_scores.items() if k in keys))

    try:
        sw.time("attribution_patch", work)
    except (ValueError, NotImplementedError) as exc:
        return {"stages": sw.rows, "numbers": {}, "refused": str(exc).split("\n")[0]}
    del torch
    return {"stages": sw.rows, "numbers": {"eap_denoising": scores, "pairs": pairs}}
