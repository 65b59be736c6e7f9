"""Benchmark: harness on rotary, RMSNorm, grouped-query and parallel-block models.

    .venv/bin/python benchmarks/modern_architectures.py [--keep DIR] [--only sweep|scale] [--json FILE]

Two parts, each measured side by side in one run, with random-weight models built here
with transformers (seed 0; `--keep DIR` keeps them between runs):

1. **Batched sweep** on a 2-layer Llama-style model (rotary positions, RMSNorm, gated MLP,
   8 query heads over 2 key/value heads, d_model 64, vocab 128), 50 prompts of 41 tokens,
   every head -> later head .q/.k/.v edge, denoising (TransformerLens's direction), one
   thread for everyone: harness's batched sweep (`mech.edges.batched`) against
   TransformerLens's `get_act_patch_direct_path_all_sources` where it supports the model
   (it refuses .k/.v edges under grouped-query attention: "per-query-head K/V semantics
   are undefined"), and against harness's own per-edge path for all three; the largest
   difference between their per-edge metrics.
2. **Real sizes**: random models shaped like Pythia-160M (GPTNeoXForCausalLM: 12 layers,
   12 heads, d_model 768, vocab 50304, rotary_pct 0.25, parallel blocks), Qwen2.5-0.5B
   (Qwen2ForCausalLM: 24 layers, 14 query heads over 2 key/value heads, d_model 896,
   d_mlp 4864, vocab 151936, tied embeddings), the QK-norm families Qwen3-0.6B
   (Qwen3ForCausalLM: 28 layers, 16 query heads over 8, head_dim 128, d_model 1024, vocab
   151936), Gemma 3 270M (Gemma3ForCausalLM: 18 layers, 4 query heads over 1, head_dim 256,
   d_model 640, vocab 262144, five local layers to one global) and OLMo 2 1B at 4 of its 16
   layers (Olmo2ForCausalLM: d_model 2048, 16 heads, vocab 100352), and the Pythia shape at 2
   and 6 layers for the growth with layers (`--cases` picks some): wall-clock time and peak
   memory (`/usr/bin/time`'s maximum resident set size) of `harness run` on the scale
   benchmark's five-claim file (a role, a mean ablation of two heads, a composition, two
   edge claims; 50 prompts), and of
   `harness weights`, each in its own process on the machine's cores.

Prints one line per measurement; the last lines of each part state the ratios and the
targets (issue 25: Pythia-160M shape under 2 minutes and 4 GB, Qwen2.5-0.5B shape under
5 minutes and 8 GB, the sweep at least 10x TransformerLens, numbers equal to 1e-4).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

N_PROMPTS, SEGMENT = 50, 20


def _print(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------- models

def build(kind: str, folder: Path, n_layers: int | None = None) -> Path:
    """A random-weight model of `kind` saved to `folder` (kept if one with the same config is there)."""
    import torch
    import transformers

    if kind == "llama-2l":
        cfg: Any = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64)
        cls: Any = transformers.LlamaForCausalLM
    elif kind == "pythia-160m":
        cfg = transformers.GPTNeoXConfig(vocab_size=50304, hidden_size=768, intermediate_size=3072,
                                         num_hidden_layers=n_layers or 12, num_attention_heads=12, rotary_pct=0.25,
                                         use_parallel_residual=True, max_position_embeddings=2048,
                                         tie_word_embeddings=False)
        cls = transformers.GPTNeoXForCausalLM
    elif kind == "qwen2.5-0.5b":
        cfg = transformers.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                       num_hidden_layers=n_layers or 24, num_attention_heads=14, num_key_value_heads=2,
                                       max_position_embeddings=32768, tie_word_embeddings=True)
        cls = transformers.Qwen2ForCausalLM
    elif kind == "qwen3-0.6b":
        cfg = transformers.Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                       num_hidden_layers=n_layers or 28, num_attention_heads=16, num_key_value_heads=8,
                                       head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True)
        cls = transformers.Qwen3ForCausalLM
    elif kind == "gemma3-270m":
        layers = n_layers or 18
        cfg = transformers.Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048,
                                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=1,
                                            head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
                                            layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                                         for i in range(layers)],
                                            max_position_embeddings=32768)
        cls = transformers.Gemma3ForCausalLM
    elif kind == "olmo2-1b":
        cfg = transformers.Olmo2Config(vocab_size=100352, hidden_size=2048, intermediate_size=8192,
                                       num_hidden_layers=n_layers or 16, num_attention_heads=16,
                                       num_key_value_heads=16, max_position_embeddings=4096, tie_word_embeddings=False,
                                       eos_token_id=100257, pad_token_id=100277)
        cls = transformers.Olmo2ForCausalLM
    else:
        raise ValueError(kind)
    marker = folder / "benchmark-config.json"
    want = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    if marker.is_file() and marker.read_text() == want and (folder / "config.json").is_file():
        return folder
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    t = time.perf_counter()
    cls(cfg).eval().save_pretrained(folder)
    marker.write_text(want)
    _print(f"built {kind} ({cfg.num_hidden_layers} layers) in {time.perf_counter() - t:.0f} s: {folder}")
    return folder


# ---------------------------------------------------------------------------------------------- sweep

def sweep(root: Path) -> dict[str, Any]:
    import numpy as np
    import torch

    from harness.data import dataset as data
    from harness.mech.edges import patching as P
    from harness.mech.edges import sets
    from harness.mech.edges.batched import batched_metrics
    from harness.mech.hooks import cache_hooks
    from harness.model import metrics
    from harness.model.ref import load_model

    torch.set_num_threads(1)
    bridge = load_model(build("llama-2l", root / "llama-2l"), device="cpu").bridge
    ds = data.repeated_tokens(N_PROMPTS, SEGMENT, 128, seed=0)
    hooks = sets.cache_names(2)
    clean, corrupt = cache_hooks(bridge, ds.clean, hooks), cache_hooks(bridge, ds.corrupted, hooks)
    edges = sets.all_edges(2, 8, embed=False, logits=False)
    _print(f"sweep model: 2-layer Llama shape (rotary, RMSNorm, gated MLP, 8 query heads / 2 key-value heads), "
           f"{N_PROMPTS} prompts x {ds.seq_len} tokens, {len(edges)} edges, 1 thread")

    def per_prompt(logits: Any, pos: Any) -> Any:
        return metrics.per_prompt(logits, pos, ds.answers.repeat(logits.shape[0] // ds.n, 1), "logprob")

    def scalar(logits: Any) -> Any:
        return metrics.per_prompt(logits, ds.positions, ds.answers, "logprob").mean()

    def batched() -> Any:
        return batched_metrics(bridge, edges, corrupt, clean, clean, ds.positions, per_prompt,
                                             replacement="resample", budget_bytes=32 * 2**20)

    def per_edge() -> list[float]:
        return [float(metrics.per_prompt(P.fast_logits(bridge, ds.corrupted, P.prepare(bridge, e, corrupt, clean,
                                                                                      "resample"), base=corrupt),
                                         ds.positions, ds.answers, "logprob").mean()) for e in edges]

    with torch.no_grad():
        batched()  # warm
        times, got = [], None
        for _ in range(3):
            t = time.perf_counter()
            got = batched()
            times.append(time.perf_counter() - t)
        t_batched = float(np.median(times))
        t = time.perf_counter()
        slow = per_edge()
        t_per_edge = time.perf_counter() - t
    assert got is not None
    fast = got.mean(1)
    diff_per_edge = float(np.abs(fast - np.array(slow)).max())
    _print(f"harness batched sweep: {t_batched:.3f} s (median of 3)")
    _print(f"harness per-edge path: {t_per_edge:.3f} s")
    out = {"edges": len(edges), "batched_s": t_batched, "per_edge_s": t_per_edge, "max_diff_per_edge": diff_per_edge}
    # TransformerLens: query edges (it refuses k/v under grouped-query attention)
    from transformer_lens.patching import get_act_patch_direct_path_all_sources

    _, clean_cache = bridge.run_with_cache(ds.clean)
    _, corrupt_cache = bridge.run_with_cache(ds.corrupted)
    tl: dict[str, Any] = {}
    for x in "qkv":
        try:
            t = time.perf_counter()
            with torch.no_grad():
                res = get_act_patch_direct_path_all_sources(bridge, ds.corrupted, clean_cache, corrupt_cache, scalar,
                                                            component=x, verbose=False)  # type: ignore[arg-type]
            tl[x] = (time.perf_counter() - t, res)
        except (ValueError, NotImplementedError) as exc:
            tl[x] = (None, str(exc).split("\n")[0])
    q_idx = [i for i, e in enumerate(edges) if e.receiver.which == "q"]
    if tl["q"][0] is not None:
        res = tl["q"][1]
        ours = {str(edges[i]): fast[i] for i in q_idx}
        theirs = _tl_values(res, edges, q_idx)
        diff_tl = max(abs(ours[k] - theirs[k]) for k in theirs) if theirs else float("nan")
        q_edges = [edges[i] for i in q_idx]
        q_times = []
        with torch.no_grad():
            for _ in range(3):
                t = time.perf_counter()
                batched_metrics(bridge, q_edges, corrupt, clean, clean, ds.positions, per_prompt,
                                              replacement="resample", budget_bytes=32 * 2**20)
                q_times.append(time.perf_counter() - t)
        t_q_batched = float(np.median(q_times))
        _print(f"TransformerLens get_act_patch_direct_path_all_sources, q: {tl['q'][0]:.3f} s for {len(q_idx)} edges"
               f"; harness batched on the same edges: {t_q_batched:.3f} s (median of 3)")
        out.update(tl_q_s=tl["q"][0], max_diff_tl_q=diff_tl, speedup_tl_q=tl["q"][0] / t_q_batched)
    for x in "kv":
        if tl[x][0] is None:
            _print(f"TransformerLens, {x}: refused ({tl[x][1][:160]})")
    _print(f"speedup vs harness per-edge path (all {len(edges)} edges): {t_per_edge / t_batched:.1f}x, "
           f"max abs diff {diff_per_edge:.2e}")
    if "speedup_tl_q" in out:
        _print(f"speedup vs TransformerLens (q edges): {out['speedup_tl_q']:.1f}x, max abs diff "
               f"{out['max_diff_tl_q']:.2e}")
    out["speedup_per_edge"] = t_per_edge / t_batched
    return out


def _tl_values(res: Any, edges: list, idx: list[int]) -> dict[str, float]:
    """TransformerLens's all-sources result [sender layer, sender head, receiver layer, receiver head]
    (its layout) as {edge: value} for the edges it covers."""
    out = {}
    arr = res.detach().cpu().double().numpy() if hasattr(res, "detach") else None
    if arr is None:
        return out
    for i in idx:
        e = edges[i]
        r, s = e.receiver.head, e.sender
        try:
            out[str(e)] = float(arr[s.layer, s.head, r.layer, r.head])
        except IndexError:
            return {}
    return out


# ---------------------------------------------------------------------------------------------- scale

def five_claim_file(model: Path, n_layers: int, n_heads: int, out: Path) -> Path:
    """The scale benchmark's five-claim file (benchmarks/scale_files.py: five_claim) for this shape."""
    import yaml

    a = min(4, n_layers - 2)
    sender, receiver = f"L{a}H{n_heads - 1}", f"L{a + 1}H1"
    mid = n_layers // 2
    doc = {"harness": 1, "name": f"five-{model.name}", "model": str(model.resolve()),
           "data": {"generator": "repeated_tokens", "n_prompts": N_PROMPTS, "segment_length": SEGMENT},
           "claims": [
               {"id": "induction-role", "kind": "role", "head": f"L{mid}H1", "role": "induction", "at_least": 0.5},
               {"id": "route-heads-needed", "kind": "ablation", "heads": [sender, receiver], "ablation": "mean",
                "at_least": 0.5},
               {"id": "route-composes", "kind": "composition", "edge": f"{sender} -> {receiver}.k",
                "expect": "composes"},
               {"id": "route-used", "kind": "edge", "edge": f"{sender} -> {receiver}.k", "expect": "used"},
               {"id": "receiver-to-logits", "kind": "edge", "edge": f"{receiver} -> logits", "expect": "used"}]}
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS in GB, exit code, last stderr line) of a command in its own process."""
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    rss = int(m.group(1)) / 2**20 if m else float("nan")
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("\t") and "Command being" not in x]
    return wall, rss, r.returncode, (lines[-1] if lines else "")


CASES = {"pythia-160m-2l": ("pythia-160m", 2, 12), "pythia-160m-6l": ("pythia-160m", 6, 12),
         "pythia-160m": ("pythia-160m", 12, 12), "qwen2.5-0.5b": ("qwen2.5-0.5b", 24, 14),
         # the QK-norm families: Qwen3-0.6B's and Gemma 3 270M's shapes whole, OLMo 2 1B's at 4 of its 16 layers
         "qwen3-0.6b": ("qwen3-0.6b", 28, 16), "gemma3-270m": ("gemma3-270m", 18, 4),
         "olmo2-1b-4l": ("olmo2-1b", 4, 16)}


def scale(root: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    harness = str(Path(sys.executable).with_name("harness"))
    rows = []
    cases = [CASES[n] for n in (names or list(CASES))]
    for kind, layers, heads in cases:
        model = build(kind, root / f"{kind}-{layers}l", layers)
        hyp = five_claim_file(model, layers, heads, root / f"five-{kind}-{layers}l.yaml")
        out = root / f"report-{kind}-{layers}l"
        subprocess.run(["rm", "-rf", str(out)])
        wall, rss, code, last = timed([harness, "run", str(hyp), "--out", str(out)])
        ev = json.loads((out / "evidence.json").read_text()) if (out / "evidence.json").is_file() else {}
        verdicts = {c["id"]: c["verdict"] for c in ev.get("claims", [])}
        _print(f"{kind} shape, {layers} layers: harness run (five-claim file): {wall:.1f} s, peak {rss:.2f} GB, "
               f"exit {code} ({last[:100]}); verdicts {verdicts}")
        w_wall, w_rss, w_code, _ = timed([harness, "weights", str(model)])
        _print(f"{kind} shape, {layers} layers: harness weights: {w_wall:.1f} s, peak {w_rss:.2f} GB, exit {w_code}")
        rows.append({"model": kind, "layers": layers, "run_s": wall, "run_gb": rss, "run_exit": code,
                     "weights_s": w_wall, "weights_gb": w_rss})
    targets = {"pythia-160m": (120, 4.0), "qwen2.5-0.5b": (300, 8.0)}
    for r in rows:
        if r["layers"] in (12, 24):
            limit_s, limit_gb = targets[r["model"]]
            ok = r["run_s"] < limit_s and r["run_gb"] < limit_gb
            _print(f"target {r['model']}: under {limit_s} s and {limit_gb} GB: {r['run_s']:.0f} s, "
                   f"{r['run_gb']:.2f} GB -> {'met' if ok else 'NOT met'}")
    pythia = [r for r in rows if r["model"] == "pythia-160m"]
    if len(pythia) > 1:
        a, b = pythia[0], pythia[-1]
        _print(f"growth (Pythia shape, {a['layers']} -> {b['layers']} layers): run time x{b['run_s'] / a['run_s']:.1f}"
               f", memory x{b['run_gb'] / a['run_gb']:.1f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", type=Path, help="folder for the built models (kept between runs)")
    p.add_argument("--only", choices=("sweep", "scale"))
    p.add_argument("--cases", help=f"comma-separated scale cases (default all: {', '.join(CASES)})")
    p.add_argument("--json", type=Path, help="write the measurements here")
    args = p.parse_args(argv)
    os.environ.setdefault("HARNESS_DEVICE", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {}
        if args.only in (None, "sweep"):
            result["sweep"] = sweep(root)
        if args.only in (None, "scale"):
            result["scale"] = scale(root, args.cases.split(",") if args.cases else None)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
