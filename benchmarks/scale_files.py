"""The models and hypothesis files of `.venv/bin/python benchmarks/scale_bench.py`: GPT-2
shapes, random-weight GPT-2 directories (seed 0, built once per shape), and the
five-claim, realistic (20 claims) and 123-claim hypothesis files written for them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError

N_PROMPTS, SEGMENT = 50, 20
DATA = {"generator": "repeated_tokens", "n_prompts": N_PROMPTS, "segment_length": SEGMENT}
CIRCUIT_SIZE = 20


@dataclass(frozen=True)
class Shape:
    """A GPT-2 architecture: the sizes passed to transformers.GPT2Config."""

    n_layers: int
    n_heads: int = 12
    d_model: int = 768
    vocab: int = 50257
    n_positions: int = 1024

    @property
    def label(self) -> str:
        return f"{self.n_layers}L"

    @property
    def folder_name(self) -> str:
        return f"gpt2-{self.n_layers}l-{self.n_heads}h-d{self.d_model}-v{self.vocab}"


def gpt2_shape(n_layers: int, tiny: bool = False) -> Shape:
    """The benchmark's model of `n_layers` layers (tiny: d_model 48, vocab 200, for tests)."""
    return Shape(n_layers, 12, 48, 200, 64) if tiny else Shape(n_layers)


def small_shape(tiny: bool = False) -> Shape:
    """The 123-claim model: 2 layers x 4 heads, d_model 120, vocab 1000 (tiny: d_model 24, vocab 100)."""
    return Shape(2, 4, 24, 100, 64) if tiny else Shape(2, 4, 120, 1000, 128)


# ---------------------------------------------------------------------------------------------- models

def _config_matches(shape: Shape, folder: Path) -> bool:
    """Whether `folder` holds a saved GPT-2 of this shape (config.json and model.safetensors)."""
    cfg_file = folder / "config.json"
    if not (cfg_file.is_file() and (folder / "model.safetensors").is_file()):
        return False
    cfg = json.loads(cfg_file.read_text())
    want = {"n_layer": shape.n_layers, "n_head": shape.n_heads, "n_embd": shape.d_model,
            "vocab_size": shape.vocab, "n_positions": shape.n_positions}
    return all(cfg.get(k) == v for k, v in want.items())


def build_model(shape: Shape, folder: Path) -> bool:
    """Save a random-weight GPT-2 of `shape` (seed 0) into `folder`, unless one is there; True if built."""
    if _config_matches(shape, folder):
        return False
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    special = min(50256, shape.vocab - 1)  # GPT-2's <|endoftext|>, or the last id of a smaller vocabulary
    cfg = transformers.GPT2Config(vocab_size=shape.vocab, n_positions=shape.n_positions, n_embd=shape.d_model,
                                  n_layer=shape.n_layers, n_head=shape.n_heads, bos_token_id=special,
                                  eos_token_id=special)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    return True


# ---------------------------------------------------------------------------------------- hypotheses

def _h(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def route(shape: Shape) -> tuple[str, str]:
    """The issue's composition route: (sender, receiver head), L4H11 -> L5H1 from 6 layers on."""
    a = min(4, shape.n_layers - 2)
    return _h(a, shape.n_heads - 1), _h(a + 1, 1)


def _document(name: str, model: Path, claims: list[dict[str, Any]], data: dict[str, Any] | None = None,
              description: str = "") -> dict[str, Any]:
    return {"harness": 1, "name": name, "description": description, "model": str(model.resolve()),
            "data": dict(DATA if data is None else data), "claims": claims}


def five_claim(shape: Shape, model: Path) -> dict[str, Any]:
    """The issue's file: a role, a mean ablation, a composition and two edge claims."""
    sender, receiver = route(shape)
    mid = shape.n_layers // 2
    claims: list[dict[str, Any]] = [
        {"id": "induction-role", "kind": "role", "head": _h(mid, 1), "role": "induction", "at_least": 0.5},
        {"id": "route-heads-needed", "kind": "ablation", "heads": [sender, receiver], "ablation": "mean",
         "at_least": 0.5},
        {"id": "route-composes", "kind": "composition", "edge": f"{sender} -> {receiver}.k", "expect": "composes"},
        {"id": "route-used", "kind": "edge", "edge": f"{sender} -> {receiver}.k", "expect": "used"},
        {"id": "receiver-to-logits", "kind": "edge", "edge": f"{receiver} -> logits", "expect": "used"},
    ]
    return _document(f"scale-five-{shape.label}", model, claims, description="scale benchmark: the five-claim file")


def circuit_heads(shape: Shape, size: int = CIRCUIT_SIZE) -> list[str]:
    """`size` heads (at most all but four), head 0 of every layer first, then head 1, ..."""
    k = min(size, shape.n_layers * shape.n_heads - 4)
    return [_h(layer, head) for head in range(shape.n_heads) for layer in range(shape.n_layers)][:k]


def realistic(shape: Shape, model: Path) -> dict[str, Any]:
    """Roles, ablations of each type, composition, edges and a ~20-head circuit (20 claims)."""
    sender, receiver = route(shape)
    mid, last = shape.n_layers // 2, shape.n_layers - 1
    claims: list[dict[str, Any]] = [
        {"id": "prev-token", "kind": "role", "head": _h(0, 1), "role": "previous_token", "at_least": 0.5},
        {"id": "induction", "kind": "role", "head": _h(mid, 1), "role": "induction", "at_least": 0.5},
        {"id": "duplicate", "kind": "role", "head": _h(mid, 2), "role": "duplicate_token", "at_least": 0.3},
        {"id": "first-token", "kind": "role", "head": _h(last, 0), "role": "first_token", "at_most": 0.9},
        {"id": "zero-ablate", "kind": "ablation", "heads": [_h(0, 1)], "ablation": "zero", "at_least": 0.5},
        {"id": "mean-ablate", "kind": "ablation", "heads": [_h(mid, 1), _h(mid, 2)], "ablation": "mean",
         "at_least": 0.5},
        {"id": "resample-ablate", "kind": "ablation", "heads": [_h(last, h) for h in range(shape.n_heads)],
         "ablation": "resample", "at_least": 0.8},
    ]
    comps: list[tuple[str, str]] = [(f"{sender} -> {receiver}.{x}", "composes") for x in "qkv"] + [
        (f"{_h(0, 1)} -> {_h(mid, 1)}.k", "composes"), (f"{_h(0, 2)} -> {_h(last, 3)}.v", "does_not_compose"),
        (f"{_h(0, 3)} -> {_h(last, 4)}.q", "does_not_compose")]
    claims += [{"id": f"comp-{i}", "kind": "composition", "edge": e, "expect": x} for i, (e, x) in enumerate(comps)]
    claims += [  # edges
        {"id": "edge-route-k", "kind": "edge", "edge": f"{sender} -> {receiver}.k", "expect": "used"},
        {"id": "edge-q-unused", "kind": "edge", "edge": f"{_h(0, 1)} -> {_h(mid, 1)}.q", "expect": "unused"},
        {"id": "edge-embed", "kind": "edge", "edge": f"embed -> {_h(0, 1)}.k", "expect": "used"},
        {"id": "edge-logits", "kind": "edge", "edge": f"{receiver} -> logits", "expect": "used"},
        {"id": "edge-denoising", "kind": "edge", "edge": f"{_h(last, 2)} -> logits", "direction": "denoising",
         "expect": "used"},
        {"id": "edge-zero-v", "kind": "edge", "edge": f"{_h(0, 1)} -> {_h(last, 2)}.v", "replacement": "zero",
         "expect": "used"},
        {"id": "circuit", "kind": "circuit", "heads": circuit_heads(shape), "at_least": 0.5},
    ]
    return _document(f"scale-realistic-{shape.label}", model, claims,
                     description="scale benchmark: a realistic file of every causal and weight kind")


def many_claims(shape: Shape, model: Path) -> dict[str, Any]:
    """123 claims of every kind on a 2-layer model, default settings (written for 2 layers x 4 heads)."""
    if shape.n_layers != 2:
        raise UserError(f"the 123-claim file is written for a 2-layer model, not {shape.n_layers} layers")
    H = shape.n_heads
    heads = [(layer, h) for layer in range(2) for h in range(H)]
    roles = ("previous_token", "induction", "duplicate_token", "first_token")
    claims: list[dict[str, Any]] = []
    claims += [{"id": f"role-{r}-{_h(*lh)}", "kind": "role", "head": _h(*lh), "role": r, "at_least": 0.5}
               for r in roles for lh in heads]
    claims += [{"id": f"copying-{_h(*lh)}", "kind": "copying", "head": _h(*lh), "at_least": 0.5} for lh in heads]
    claims += [{"id": f"comp-{_h(0, a)}-{_h(1, b)}.{x}", "kind": "composition", "edge": f"{_h(0, a)} -> {_h(1, b)}.{x}"}
               for a in range(H) for b in range(H) for x in "qkv"]
    kinds = ("mean", "zero", "resample")
    claims += [{"id": f"ablate-{_h(*lh)}", "kind": "ablation", "heads": [_h(*lh)], "ablation": kinds[i % 3],
                "at_least": 0.3} for i, lh in enumerate(heads)]
    claims += [{"id": "ablate-layer0", "kind": "ablation", "heads": [_h(0, h) for h in range(H)], "at_least": 0.5},
               {"id": "ablate-layer1", "kind": "ablation", "heads": [_h(1, h) for h in range(H)],
                "ablation": "zero", "at_least": 0.5},
               {"id": "ablate-all", "kind": "ablation", "heads": [_h(*lh) for lh in heads], "ablation": "resample",
                "at_least": 0.8}]
    edges = [f"embed -> {_h(0, h)}.k" for h in range(H)]
    edges += [f"{_h(0, h)} -> {_h(1, h)}.{x}" for h in range(H) for x in "qkv"]
    edges += [f"{_h(1, h)} -> logits" for h in range(H)] + ["embed -> logits"]
    claims += [{"id": "edge-" + e.replace(" -> ", "-to-"), "kind": "edge", "edge": e} for e in edges]
    claims += [{"id": "circuit-pair", "kind": "circuit", "heads": [_h(0, 0), _h(1, 0)], "at_least": 0.5},
               {"id": "circuit-four", "kind": "circuit", "heads": [_h(0, 1), _h(0, 2), _h(1, 1), _h(1, 2)],
                "at_least": 0.5},
               {"id": "circuit-layer1", "kind": "circuit", "heads": [_h(1, h) for h in range(H)], "at_least": 0.5}]
    return _document("scale-many-claims", model, claims, data={"generator": "repeated_tokens"},
                     description=f"scale benchmark: {len(claims)} claims of every kind, default settings")


def write_hypothesis(doc: dict[str, Any], path: Path) -> Path:
    """Write `doc` as YAML to `path` (its folder is created)."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
