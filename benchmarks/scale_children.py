"""The in-process timings of `.venv/bin/python benchmarks/scale_bench.py`, each run in its own
subprocess (`--child KIND`) so that its wall time and peak memory are its own:

* `scores` / `tl-scores`: harness composition scores (head_weights + mech.weights.factored, every
  cross-layer pair for q, k, v) against TransformerLens's `all_composition_scores`;
* `edges` / `tl-edges`: batched edge patching (mech.edges.batched) on a fixed subset of
  edges, and on the edges TransformerLens's `get_act_patch_direct_path` sweeps, against it.

Each writes its numbers to a JSON file (`run_child`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.data import dataset as data
from harness.errors import UserError
from harness.mech.edges import batched, sets
from harness.mech.hooks import cache_hooks
from harness.mech.weights import scores
from harness.mech.weights.factored import Composition
from harness.model import metrics
from harness.model.ref import load_model
from harness.model.tokenizer import model_bos
from harness.spec import names
from harness.threads import configure


def _load(model: str) -> Any:

    configure()
    return load_model(model)


def _prompts(m: Any, n_prompts: int, segment: int) -> Any:

    return data.repeated_tokens(n_prompts, segment, m.d_vocab, seed=0, bos_token=model_bos(m, "benchmark"),
                                n_ctx=m.n_ctx)


SCORE_REPEATS = 3


def _score_function(hw: Any) -> tuple[str, Any]:
    """The harness's all-pairs score grid of one mode, computed afresh (mech.weights.factored)."""
    return "mech.weights.factored.Composition.scores", Composition(hw, 0).scores


def _median_of(repeats: int, work: Any) -> tuple[float, list[float]]:
    """Median seconds of `repeats` calls of work() (and every call's seconds)."""
    import statistics

    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def child_scores(model: str) -> dict[str, Any]:
    """Seconds of the harness composition scores from the loaded model: head_weights (folded) and every
    cross-layer pair's score for q, k and v (median of SCORE_REPEATS fresh computations)."""

    m = _load(model)
    api: list[str] = []

    def work() -> None:
        name, score = _score_function(scores.head_weights(m.bridge, "folded"))
        api[:] = [name]
        for x in "qkv":
            score(x)

    seconds, times = _median_of(SCORE_REPEATS, work)
    return {"seconds": seconds, "times": times, "api": api[0]}


def child_tl_scores(model: str) -> dict[str, Any]:
    """Seconds of TransformerLens's TransformerBridge.all_composition_scores for Q, K and V (median of
    SCORE_REPEATS calls)."""
    import torch

    m = _load(model)

    def work() -> None:
        with torch.no_grad():
            for mode in "QKV":
                m.bridge.all_composition_scores(mode)

    seconds, times = _median_of(SCORE_REPEATS, work)
    return {"seconds": seconds, "times": times}


def subset_edges(n_layers: int, n_heads: int) -> dict[str, list[Any]]:
    """The fixed edge subset of the sweep row, by group (see the module docstring)."""

    def into(receiver: Any) -> list[Any]:
        senders = [names.Embed()] + [names.Head(receiver.layer - 1, h) for h in range(n_heads)]
        return [names.Edge(s, names.HeadInput(receiver, x)) for s in senders for x in "qkv"]

    mid, last = names.Head(n_layers // 2, 1), names.Head(n_layers - 1, 2)
    to_logits = [names.Edge(s, names.Logits()) for s in
                 [names.Embed()] + [names.Head(n_layers - 1, h) for h in range(n_heads)]]
    return {f"into {mid}": into(mid), f"into {last}": into(last), "to logits": to_logits}


def tl_edges(n_layers: int, n_heads: int) -> list[Any]:
    """The edges TransformerLens's direct-path patching covers from L{L-2}H0 (component k)."""

    sender = names.Head(n_layers - 2, 0)
    return [names.Edge(sender, names.HeadInput(names.Head(n_layers - 1, h), "k")) for h in range(n_heads)]


def _median_forward(bridge: Any, tokens: Any, repeats: int = 3) -> float:
    """Median seconds of a plain forward pass (no hooks) on `tokens`."""
    import torch

    def work() -> None:
        with torch.no_grad():
            bridge(tokens)

    return _median_of(repeats, work)[0]


def child_edges(model: str, n_prompts: int, segment: int) -> dict[str, Any]:
    """Batched sweep seconds on the subset (per group) and on TL's edges; one forward's seconds."""

    m = _load(model)
    bridge, ds = m.bridge, _prompts(m, n_prompts, segment)
    hooks = sets.cache_names(m.n_layers)
    clean, corrupt = cache_hooks(bridge, ds.clean, hooks), cache_hooks(bridge, ds.corrupted, hooks)

    def per_prompt(logits: Any, pos: Any) -> Any:
        return metrics.per_prompt(logits, pos, ds.answers.repeat(logits.shape[0] // ds.n, 1), "logprob")

    def sweep(edges: list[Any]) -> tuple[float, list[float]]:
        t = time.perf_counter()
        vals = batched.batched_metrics(bridge, edges, corrupt, clean, clean, ds.positions, per_prompt,
                                             replacement="resample")
        return time.perf_counter() - t, [float(v) for v in vals.mean(1)]

    sweep(tl_edges(m.n_layers, m.n_heads)[:1])  # warm-up: first-call costs stay out of the timings
    forward = _median_forward(bridge, ds.clean)
    groups = {name: sweep(es)[0] for name, es in subset_edges(m.n_layers, m.n_heads).items()}
    sizes = {name: len(es) for name, es in subset_edges(m.n_layers, m.n_heads).items()}
    tl_seconds, tl_values = sweep(tl_edges(m.n_layers, m.n_heads))
    return {"forward_seconds": forward, "group_seconds": groups, "group_edges": sizes,
            "seconds": sum(groups.values()), "edges": sum(sizes.values()),
            "tl_edges_seconds": tl_seconds, "tl_edges_values": tl_values}


def child_tl_edges(model: str, n_prompts: int, segment: int) -> dict[str, Any]:
    """Seconds of get_act_patch_direct_path from L{L-2}H0 into every last-layer head's k input."""
    import torch
    from transformer_lens.patching import get_act_patch_direct_path


    m = _load(model)
    bridge, ds = m.bridge, _prompts(m, n_prompts, segment)
    layer = m.n_layers - 2
    z = f"blocks.{layer}.attn.hook_z"

    def scalar(logits: Any) -> Any:
        return metrics.per_prompt(logits, ds.positions, ds.answers, "logprob").mean()

    with torch.no_grad():
        _, clean_cache = bridge.run_with_cache(ds.clean, names_filter=z)
        _, corrupt_cache = bridge.run_with_cache(ds.corrupted, names_filter=z)
        t = time.perf_counter()
        res = get_act_patch_direct_path(bridge, ds.corrupted, clean_cache, corrupt_cache, scalar, layer, 0, "k",
                                        verbose=False)
        seconds = time.perf_counter() - t
    return {"seconds": seconds, "edges": m.n_heads, "values": [float(v) for v in res[m.n_layers - 1]]}


CHILDREN = {"scores": child_scores, "tl-scores": child_tl_scores}
DATA_CHILDREN = {"edges": child_edges, "tl-edges": child_tl_edges}


def run_child(kind: str, model: str, out: Path, n_prompts: int, segment: int) -> int:
    """(in the subprocess) one in-process timing, written to `out` as JSON."""
    if kind in CHILDREN:
        result = CHILDREN[kind](model)
    elif kind in DATA_CHILDREN:
        result = DATA_CHILDREN[kind](model, n_prompts, segment)
    else:
        raise UserError(f"unknown child measurement {kind!r}")
    out.write_text(json.dumps(result))
    return 0
