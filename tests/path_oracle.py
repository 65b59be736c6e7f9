"""A slow, plainly written reference for path patching on Hugging Face GPT-2, straight
from the HF state dict in float64 — independent of harness.mech and of the bridge.

GPT-2 block:  resid_mid = resid_pre + attn(LN1(resid_pre));  resid_post = resid_mid +
MLP(LN2(resid_mid));  logits = LN_f(resid_final) W_U.  Outputs: a head's out = z W_O[h]
(its slice of c_proj; the c_proj bias is shared, not a head's), an MLP's out =
MLP(LN2(resid_mid)) incl. its output bias, embed's out = wte[tok] + wpe[pos].

Path  n0 -> n1 -> ... -> nm  (n0 a node or a group `A + B`):
  Delta_0 = replacement output - base output of n0 (summed over the group);
  hop k < m: n_k recomputes its output from ONLY its listed input reading base + Delta_{k-1}
             (head input: that one of q/k/v from LN1(resid_pre(base) + Delta), the other two
             from the base run; MLP: MLP(LN2(resid_mid(base) + Delta))); Delta_k = new - base
             output; it reaches only the next hop;
  hop m:     the same recomputation, but its new output replaces its output in a normal forward
             pass of the base tokens (logits: LN_f(resid_final(base) + Delta_{m-1}) W_U).

Nodes are tuples: ("embed",), ("head", l, h), ("mlp", l), ("input", l, h, "q"|"k"|"v"),
("logits",).  A path is [senders, hop1, ..., hopm], senders a list of nodes.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

# ---------------------------------------------------------------- a random model to test on


def random_gpt2(vocab: int, d_model: int, n_layer: int, n_head: int, seed: int = 3):
    """A random transformers GPT2LMHeadModel (float32) whose patches matter: LayerNorm affine
    parameters away from (1, 0), so LN recomputation matters; random biases; embeddings of
    unit scale; Conv1D weights [in, out] scaled for O(1) activations and sharp attention."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=8, n_embd=d_model, n_layer=n_layer, n_head=n_head)
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name:
                p.copy_(torch.randn(p.shape) * 0.3 + ("weight" in name))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape) * 0.2)
            elif "wte" in name or "wpe" in name:
                p.copy_(torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) * 1.5 / p.shape[0] ** 0.5)
    return model


# ---------------------------------------------------------------- weights


def load(model_dir) -> tuple[dict, dict]:
    """(state dict in float64 with HF GPT-2 keys minus 'transformer.', config) from a
    save_pretrained directory (config.json + model.safetensors)."""
    from safetensors.torch import load_file

    d = Path(model_dir)
    return prepare(load_file(str(d / "model.safetensors"))), config(json.loads((d / "config.json").read_text()))


def prepare(sd: dict) -> dict:
    """HF GPT2LMHeadModel / GPT2Model state dict -> float64 dict without the 'transformer.'
    prefix; the unembedding is lm_head.weight when present, else the tied wte."""
    out = {k.removeprefix("transformer."): v.detach().to(torch.float64) for k, v in sd.items()}
    out.setdefault("lm_head.weight", out["wte.weight"])
    return out


def config(hf: dict) -> dict:
    """The few numbers the oracle needs from a GPT-2 config.json (or GPT2Config.to_dict())."""
    assert hf.get("activation_function", "gelu_new") == "gelu_new", hf.get("activation_function")
    assert not hf.get("scale_attn_by_inverse_layer_idx", False)
    assert hf.get("scale_attn_weights", True)
    d, h = hf["n_embd"], hf["n_head"]
    return {"n_layers": hf["n_layer"], "n_heads": h, "d_model": d, "d_head": d // h,
            "eps": hf.get("layer_norm_epsilon", 1e-5)}


# ---------------------------------------------------------------- pieces of the forward pass


def layer_norm(x, w, b, eps):
    x = x - x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def ln1(sd, cfg, layer, resid):
    p = f"h.{layer}.ln_1."
    return layer_norm(resid, sd[p + "weight"], sd[p + "bias"], cfg["eps"])


def head_input(sd, cfg, layer, head, which, resid):
    """Head `head`'s q, k or v [n, pos, d_head] when LN1 of layer `layer` reads `resid`."""
    d, dh = cfg["d_model"], cfg["d_head"]
    col = "qkv".index(which) * d + head * dh  # c_attn is Conv1D: [d_model, 3 d_model], columns q | k | v
    w = sd[f"h.{layer}.attn.c_attn.weight"][:, col:col + dh]
    b = sd[f"h.{layer}.attn.c_attn.bias"][col:col + dh]
    return ln1(sd, cfg, layer, resid) @ w + b


def attend(cfg, q, k, v):
    """One head's causal attention: z [n, pos, d_head]."""
    s = q.shape[1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg["d_head"])
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def w_o(sd, cfg, layer, head):
    """Head's rows of c_proj (Conv1D [d_model, d_model]): [d_head, d_model]."""
    dh = cfg["d_head"]
    return sd[f"h.{layer}.attn.c_proj.weight"][head * dh:(head + 1) * dh]


def mlp(sd, cfg, layer, resid_mid):
    """MLP(LN2(resid_mid)) incl. its output bias."""
    p = f"h.{layer}."
    x = layer_norm(resid_mid, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], cfg["eps"])
    x = gelu_new(x @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"])
    return x @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]


def unembed(sd, cfg, resid_final):
    return layer_norm(resid_final, sd["ln_f.weight"], sd["ln_f.bias"], cfg["eps"]) @ sd["lm_head.weight"].T


def forward(sd, cfg, tokens, replace=None):
    """Plain GPT-2 forward.  replace: {("head", l, h) | ("mlp", l) | ("embed",): output [n, pos, d_model]}
    puts that output in place of the node's own (everything later is recomputed).
    Returns (logits, cache) with cache keys embed, resid_pre/resid_mid/head_out/mlp_out per
    layer (resid_pre[l], ...), q/k/v [l][n, pos, H, d_head], resid_final."""
    replace = replace or {}
    n, s = tokens.shape
    H = cfg["n_heads"]
    c: dict = {k: {} for k in ("resid_pre", "resid_mid", "head_out", "mlp_out", "q", "k", "v")}
    x = replace.get(("embed",), sd["wte.weight"][tokens] + sd["wpe.weight"][:s])
    c["embed"] = x
    for layer in range(cfg["n_layers"]):
        c["resid_pre"][layer] = x
        qkv = {w: torch.stack([head_input(sd, cfg, layer, h, w, x) for h in range(H)], 2) for w in "qkv"}
        for w in "qkv":
            c[w][layer] = qkv[w]
        outs = []
        for h in range(H):
            out = attend(cfg, qkv["q"][:, :, h], qkv["k"][:, :, h], qkv["v"][:, :, h]) @ w_o(sd, cfg, layer, h)
            outs.append(replace.get(("head", layer, h), out))
        c["head_out"][layer] = torch.stack(outs, 2)  # [n, pos, H, d_model]
        x = x + sum(outs) + sd[f"h.{layer}.attn.c_proj.bias"]
        c["resid_mid"][layer] = x
        m = replace.get(("mlp", layer), mlp(sd, cfg, layer, x))
        c["mlp_out"][layer] = m
        x = x + m
    c["resid_final"] = x
    return unembed(sd, cfg, x), c


# ---------------------------------------------------------------- names

_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_INPUT = re.compile(r"^L(\d+)H(\d+)\.([qkv])$")
_MLP = re.compile(r"^L(\d+)\.mlp$")


def parse_node(text: str) -> tuple:
    t = text.strip()
    if t in ("embed", "logits"):
        return (t,)
    if m := _HEAD.match(t):
        return ("head", int(m[1]), int(m[2]))
    if m := _INPUT.match(t):
        return ("input", int(m[1]), int(m[2]), m[3])
    if m := _MLP.match(t):
        return ("mlp", int(m[1]))
    raise ValueError(f"not a node: {text!r}")


def _writes_at(node) -> float:
    """Where a node writes in the stream order embed < heads of l < MLP l < heads of l+1."""
    if node[0] == "embed":
        return -1
    return 2 * node[1] + (node[0] == "mlp")


def _reads_at(node) -> float:
    """A reader sees writers strictly before this: heads of l read resid_pre_l, MLP l resid_mid_l."""
    if node[0] == "logits":
        return math.inf
    return 2 * node[1] + (node[0] == "mlp")


def parse_path(text: str) -> list:
    """'A + B -> L1H0.v -> logits' -> [[A, B], ("input", 1, 0, "v"), ("logits",)], checked."""
    parts = [p.strip() for p in text.split("->")]
    if len(parts) < 2:
        raise ValueError(f"a path has at least two nodes: {text!r}")
    senders = [parse_node(p) for p in parts[0].split("+")]
    hops = [parse_node(p) for p in parts[1:]]
    for s in senders:
        if s[0] not in ("embed", "head", "mlp"):
            raise ValueError(f"not a sender: {s}")
    for k, hop in enumerate(hops):
        if hop[0] not in ("input", "mlp", "logits") or (hop[0] == "logits" and k != len(hops) - 1):
            raise ValueError(f"not a hop here: {hop}")
        before = senders if k == 0 else [hops[k - 1]]
        if any(_writes_at(b) >= _reads_at(hop) for b in before):
            raise ValueError(f"path does not go forward at {hop}: {text!r}")
    return [senders, *hops]


# ---------------------------------------------------------------- patching


def output(cache, node):
    """A sender's output [n, pos, d_model] in a cached run (a head input's node: its head)."""
    if node[0] == "embed":
        return cache["embed"]
    if node[0] in ("head", "input"):
        return cache["head_out"][node[1]][:, :, node[2]]
    return cache["mlp_out"][node[1]]


def hop_output(sd, cfg, base, node, delta):
    """The hop's output when only its listed input reads base + delta (node: input or mlp)."""
    if node[0] == "mlp":
        return mlp(sd, cfg, node[1], base["resid_mid"][node[1]] + delta)
    _, layer, head, which = node
    qkv = {w: base[w][layer][:, :, head] for w in "qkv"}  # the base run's own q, k, v
    qkv[which] = head_input(sd, cfg, layer, head, which, base["resid_pre"][layer] + delta)
    return attend(cfg, qkv["q"], qkv["k"], qkv["v"]) @ w_o(sd, cfg, layer, head)


def patched_logits(sd, cfg, path_nodes, base_tokens, source_tokens, replacement="resample",
                   reference_tokens=None, all_routes=False):
    """Logits [n, pos, vocab] (float64) of the base tokens with the path patched (module doc).
    path_nodes: a string ('L0H1 + L0.mlp -> L1H0.v -> logits') or parse_path's list.
    all_routes (an edge): the senders' outputs replaced in a whole forward; the change of the
    residual the receiver reads is what the receiver alone receives (by every route)."""
    path = parse_path(path_nodes) if isinstance(path_nodes, str) else path_nodes
    senders, hops = path[0], path[1:]
    _, base = forward(sd, cfg, base_tokens)
    base_out = sum(output(base, s) for s in senders)
    if replacement == "resample":
        _, src = forward(sd, cfg, source_tokens)
        replaced = [output(src, s) for s in senders]
    elif replacement == "zero":
        replaced = [torch.zeros_like(base_out) for _ in senders]
    elif replacement == "mean":
        _, ref = forward(sd, cfg, reference_tokens)
        replaced = [output(ref, s).mean(0, keepdim=True).expand_as(base_out) for s in senders]  # per position
    else:
        raise ValueError(replacement)
    new = sum(replaced)
    delta = new - base_out  # Delta_0
    if all_routes:  # the sender's outputs replaced in a whole forward; the change where the receiver reads
        _, moved = forward(sd, cfg, base_tokens, replace=dict(zip(senders, replaced, strict=True)))
        last = hops[-1]
        where = {"input": "resid_pre", "mlp": "resid_mid"}.get(last[0])
        delta = (moved["resid_final"] - base["resid_final"] if where is None
                 else moved[where][last[1]] - base[where][last[1]])
        hops = [last]
    for hop in hops[:-1]:  # intermediate hops: their change reaches only the next hop
        delta = hop_output(sd, cfg, base, hop, delta) - output(base, hop)
    last = hops[-1]
    if last[0] == "logits":
        return unembed(sd, cfg, base["resid_final"] + delta)
    key = ("mlp", last[1]) if last[0] == "mlp" else ("head", last[1], last[2])
    logits, _ = forward(sd, cfg, base_tokens, replace={key: hop_output(sd, cfg, base, last, delta)})
    return logits
