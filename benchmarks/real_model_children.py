"""The child processes of benchmarks/real_model.py that time harness and the floor, and what every
child shares: its spec (`Child`), the stopwatch (wall and CPU seconds, peak memory per stage), the
prompts every contender runs, and the numbers compared between contenders.

* `child_floor`: one plain forward of the clean prompts through the Hugging Face model, its logits
  from the first scored position on, with its metric;
* `child_harness`: harness's stages (base runs, a mean ablation, an edge patch, an EAP-IG
  attribution claim) on the claims of `stage_claims`.

Each returns {"stages": {name: {wall_s, cpu_s, peak_gb, ...}}, "numbers": {name: [per prompt]}}.
TransformerLens's children are in real_model_tl.py.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEGMENT = 20  # tokens of the repeated segment: [BOS] + S + S, 41 tokens
IG_STEPS = 5
STAGES = ("base", "ablation", "edge", "attribution")


def say(line: str = "") -> None:
    print(line, flush=True)


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


def stage_claims(model: Model) -> list[dict[str, Any]]:
    """The three claims whose work stages 2-4 time (their hooks are what harness's base runs cache)."""
    a, b = model.sender, model.receiver
    return [{"id": "ablation", "kind": "ablation", "heads": [a], "ablation": "mean", "at_least": 0.1},
            {"id": "edge", "kind": "edge", "edge": f"{a} -> {b}.k"},
            {"id": "attribution", "kind": "attribution", "edge": f"{a} -> {b}.k", "steps": IG_STEPS}]


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

    def time(self, name: str, work: Callable[[], Any], ledger: Any = None) -> Any:
        """work(), timed as stage `name`; with harness's cost `ledger`, the stage's row also gets
        `counted`: the forward-equivalents harness counted for it."""
        if ledger is not None:
            ledger.lap()
        self.sync()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats()
        w, c = time.perf_counter(), time.process_time()
        out = work()
        self.sync()
        row = {"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c, "peak_gb": peak_rss_gb()}
        if ledger is not None:
            row["counted"] = ledger.lap()
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


def start(c: Child) -> tuple[Stopwatch, Any, Any]:
    """A model child's start: its torch threads, its stopwatch, the model loaded (timed as "load")
    and the prompts every contender runs."""
    from harness.threads import configure

    configure(c.threads)
    sw = Stopwatch(c.device)
    m = _load(c, sw)
    return sw, m, _prompts(prompt_args(m), c.n_prompts, c.device)


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
    from harness import cost, memory
    from harness.engine.measure import hooks_needed
    from harness.mech.graph import parts as graph_parts
    from harness.mech.runs.build import base_runs
    from harness.spec.vocabulary import Direction

    sw, m, ds = start(c)
    a, _, edge = _names(c)
    model = Model("", "", Path(c.folder), c.sender, c.receiver)
    doc = {"harness": 1, "name": "stages", "model": c.folder, "data": {"generator": "repeated_tokens", "bos": True},
           "claims": stage_claims(model)}
    claims = harness.load_hypothesis(doc).spec.claims
    hooks, corrupted = hooks_needed(claims, m.n_layers)
    out: dict[str, Any] = {"hooks": len(hooks), "prompts": prompt_args(m)}
    # the stages' chunks follow from the memory budget `harness run` sets; what each stage counts in
    # forward-equivalents of the n prompts (harness.cost, as `harness run` counts it) goes with its row
    with memory.using(device=c.device) as budget, cost.counting(ds.n) as ledger:
        out["memory_budget"] = budget
        runs = sw.time("base", lambda: base_runs(m.bridge, ds, hooks, "logprob", corrupted=corrupted), ledger)
        out["base"] = _plain(np.concatenate([runs.m_clean, runs.m_corrupt]))
        if "ablation" in c.stages:
            out["ablation"] = _plain(sw.time("ablation", lambda: runs.ablated([a], "mean"), ledger))
        if "edge" in c.stages:
            out["edge"] = _plain(sw.time("edge", lambda: runs.patched(edge, Direction.NOISING, "resample"), ledger))
        if "attribution" in c.stages:
            def attribution() -> Any:
                t = time.perf_counter()
                runs.graph_model()  # the claim's first step: the graph arithmetic, checked on the first prompts
                out["attribution_check_s"] = time.perf_counter() - t
                return _edge_prompt_scores(runs, edge, "eap-ig")

            out["attribution"] = _plain(sw.time("attribution", attribution, ledger))
            # untimed: what TransformerLens's attribution_patch computes (EAP, denoising, from the whole graph's
            # writes) on the prompts it runs, for the comparison of numbers; it refuses grouped-query attention
            kv = getattr(m.bridge.cfg, "n_key_value_heads", None)
            try:
                if kv is not None and kv != m.n_heads:
                    raise _Skipped("grouped-query attention: TransformerLens's edge attribution refuses it")
                first = ds.select(list(range(min(c.tl_pairs, ds.n))))
                small = base_runs(m.bridge, first, graph_parts.cache_names(m.n_layers, m.has_mlp), "logprob")
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
