"""Orchestration: hypothesis -> model -> data -> measurements -> Evidence.

Data flows one way: the spec is validated, names are checked against the
loaded model, the clean and corrupted prompts are run once each (caching only
the hooks the claims need), each ablation is one more forward, and the
evaluators in `claims` turn the numbers into verdicts.
"""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from pathlib import Path
from typing import Any, Optional, Union

from . import names, spec as spec_mod
from .errors import ComponentNameError, SpecError
from .evidence import Evidence

_MODEL_CACHE: dict[tuple, Any] = {}


def load_model_cached(source: str, device: Optional[str] = None) -> Any:
    """One model load per (source, device) per process (the pytest plugin reuses it).
    `device` is resolved first (devices.resolve_device: None = $HARNESS_DEVICE or the
    best available), so None and its resolved name share one entry."""
    from .devices import resolve_device
    from .models import load_model

    key = (source, resolve_device(device))
    if key not in _MODEL_CACHE:
        _MODEL_CACHE[key] = load_model(source, device=key[1])
    return _MODEL_CACHE[key]


def build_dataset(h: spec_mod.LoadedHypothesis, model: Any) -> Any:
    from . import data

    d = h.spec.data
    if isinstance(d, spec_mod.GeneratorData):
        if d.segment_length * 2 + int(d.bos) > model.n_ctx:
            raise SpecError([f"{h.where('data.segment_length')}: prompts of length "
                             f"{d.segment_length * 2 + int(d.bos)} exceed the model's context "
                             f"{model.n_ctx}"])
        return data.repeated_tokens(d.n_prompts, d.segment_length, model.d_vocab, d.seed, d.split,
                                    d.bos, d.vocab_min, d.vocab_max,
                                    d.bos_token if d.bos_token is not None else model.bos_token)
    return data.load_jsonl(h.resolve(d.file), model.d_vocab, d.limit)


def check_names(h: spec_mod.LoadedHypothesis, model: Any) -> None:
    """Every head named by a claim must exist in the loaded model."""
    problems = []
    for i, c in enumerate(h.spec.claims):
        for key in ("head", "heads", "edge"):
            value = getattr(c, key, None)
            if value is None:
                continue
            parse = names.parse_edge if key == "edge" else names.parse_head
            for text in value if isinstance(value, list) else [value]:
                try:
                    names.check_in_model(parse(text), model.n_layers, model.n_heads, model.has_mlp)
                except ComponentNameError as exc:
                    problems.append(f"{h.where(f'claims[{i}].{key}')}: ({c.id}) {exc}")
    if problems:
        raise SpecError(problems)


def run(hypothesis: Union[str, Path, dict], seed: Optional[int] = None,
        base_dir: Union[str, Path, None] = None, command: Optional[str] = None,
        figures: bool = True, model: Any = None, device: Optional[str] = None) -> Evidence:
    """Run every claim of a hypothesis (file path or dict) and return the Evidence.

    `seed` overrides the file's `seed` (bootstrap and permutation streams).
    `figures=False` skips collecting the figures' data (figures_data stays empty: no
    attention, composition-matrix or signature data); verdicts and numbers are unchanged.
    `model` replaces the file's `model:` — a model directory / `hf:NAME` (loaded
    here, not cached) or an already loaded `LoadedModel` (sweeps run many files on
    one checkpoint).  `device` is where a model loaded here is placed: `cpu`, `cuda`,
    `cuda:N` or `mps`; None means $HARNESS_DEVICE or the best available
    (devices.resolve_device; a bad or unavailable name raises DeviceError).  An
    already loaded model runs where it is.  The data is moved to the model's device,
    and provenance["device"] records the device the model ran on (e.g. "cpu").
    """
    from .devices import of, resolve_device
    from .measure import measure_all
    from .models import LoadedModel, load_model

    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    h = spec_mod.load(hypothesis, base_dir=base_dir)
    s = h.spec
    seed = s.seed if seed is None else seed
    device = resolve_device(device)
    if isinstance(model, LoadedModel):
        pass
    elif model is not None:
        model = load_model(model, device=device)
    else:
        source = s.model if s.model.startswith("hf:") else str(h.resolve(s.model))
        model = load_model_cached(source, device)
    check_names(h, model)
    ds = build_dataset(h, model)
    if s.metric == "logit_diff" and ds.wrong is None:
        raise SpecError([f"{h.where('metric')}: logit_diff needs 'wrong' tokens in the data"])
    m = measure_all(model, ds, s, seed, figures)
    cfg = model.bridge.cfg
    return Evidence(
        hypothesis={"name": s.name, "description": s.description, "file": shown_path(h.path),
                    "sha256": h.sha256},
        model={"source": shown_path(model.source), "kind": model.kind, "sha256": model.sha256,
               "n_layers": model.n_layers, "n_heads": model.n_heads, "d_model": int(cfg.d_model),
               "d_head": int(cfg.d_head), "d_vocab": model.d_vocab, "n_ctx": model.n_ctx,
               "attn_only": not model.has_mlp,
               "normalization": str(getattr(cfg, "normalization_type", None))},
        data={"description": ds.description, "n_prompts": ds.n, "seq_len": ds.seq_len,
              "bos_at_position_0": ds.has_bos, "scored_positions_per_prompt": int(ds.positions.shape[1])},
        settings={"metric": s.metric, "seed": seed, "stats": s.stats.model_dump(),
                  "weight_processing": _processing_text(s.weight_processing),
                  "mean_ablation_reference": "clean prompts of the dataset, per position",
                  "resample_ablation_source": "the paired corrupted prompt"},
        baseline=m.baseline,
        sanity_checks=m.sanity_checks,
        claims=m.claims,
        weights_vs_use=m.weights_vs_use,
        figures_data=m.figures_data,
        provenance={"versions": versions(), "command": command or " ".join(sys.argv),
                    "started": started,
                    "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "device": str(of(model.bridge)),
                    "host": {"python": platform.python_version(), "platform": platform.platform(),
                             "machine": platform.machine()}},
    )


def shown_path(path: Optional[str]) -> Optional[str]:
    """A path as reports show it: relative to the working directory when inside it."""
    if path is None or path.startswith("hf:"):
        return path
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _processing_text(p: str) -> str:
    if p == "raw":
        return "raw: weights as stored (no LayerNorm folding, no centring)"
    return ("folded: LayerNorm weights folded into W_Q/W_K/W_V and W_U, reading weights "
            "centred (LN removes the mean), writing weights W_O and W_E centred, as "
            "TransformerLens process_weights(fold_ln, center_writing_weights); used for "
            "composition and copying scores only, runs use the model as loaded")


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("harness", "torch", "transformer-lens", "transformers", "numpy", "scipy", "pydantic", "pyyaml",
                "safetensors", "matplotlib", "markdown", "jsonschema"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out

