"""Orchestration: hypothesis -> model -> data -> measurements -> Evidence.

Data flows one way: the file is validated (hypothesis.loading), the names its
claims use are checked against the loaded model, the dataset is built, the
claims are measured (engine.measure) and the Evidence is assembled with its
provenance.  Rendering and writing are `harness.report`'s job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import memory, threads
from ..claims.base import component_names
from ..data import dataset as data
from ..data.examples import examples
from ..errors import ComponentNameError, SpecError
from ..evidence.result import Evidence
from ..hypothesis.loading import LoadedHypothesis, load
from ..model import architecture, metrics
from ..model.architecture import Architecture
from ..model.cache import ModelCache
from ..model.devices import of, resolve_device
from ..model.loaded import LoadedModel, from_bridge
from ..model.ref import ModelRef, load_model
from ..model.tokenizer import bridge_tokenizer
from ..progress import clock, stage
from ..spec import names
from . import data_source, provenance
from .measure import measure_all

MODELS = ModelCache(capacity=None)  # every model a process names, loaded once (the pytest plugin reuses them)


def load_model_cached(source: str, device: str | None = None) -> LoadedModel:
    """`MODELS.get(source, device)`: one load per (source, resolved device) per process."""
    return MODELS.get(source, device)


def build_dataset(h: LoadedHypothesis, model: LoadedModel) -> data.Dataset:
    """The file's prompts for this model (data.dataset.Dataset; engine.data_source)."""
    return data_source.build_dataset(h.spec.data, h, model)


def check_corruptions(h: LoadedHypothesis, ds: data.Dataset) -> None:
    """Every corruption a claim names must be one of the data's."""
    problems = [f"{h.where_claim(i, 'corruption')} corruption {name!r} is not one of the data's: "
                f"{', '.join(ds.corruptions)}"
                for i, c in enumerate(h.spec.claims) for name in c.corruptions_used() if name not in ds.corruptions]
    if problems:
        raise SpecError(problems)


def check_names(h: LoadedHypothesis, model: LoadedModel) -> None:
    """Every component a claim names must exist in the loaded model."""
    problems = []
    for i, c in enumerate(h.spec.claims):
        for key, name in component_names(c):
            try:
                names.check_in_model(name, model.n_layers, model.n_heads, model.has_mlp)
            except ComponentNameError as exc:
                problems.append(f"{h.where_claim(i, key)} {exc}")
    if problems:
        raise SpecError(list(dict.fromkeys(problems)))


def run(hypothesis: str | Path | dict[str, Any], *, seed: int | None = None,
        base_dir: str | Path | None = None, command: str | None = None,
        figures: bool = True, model: LoadedModel | str | Path | Any | None = None,
        device: str | None = None, threads: int | None = None) -> Evidence:
    """Run every claim of a hypothesis (file path or dict) and return the Evidence.

    `seed` overrides the file's `seed` (bootstrap and permutation streams).
    `figures=False` skips collecting the figures' data (figures_data stays empty: no
    attention, composition-matrix or signature data); verdicts and numbers are unchanged.
    `model` replaces the file's `model:` — a model directory, a hub name (`ORG/NAME` that
    is not a directory here, or `hf:ORG/NAME`: the local Hugging Face cache, offline;
    loaded here, not cached), an already loaded `LoadedModel` (sweeps run many files on
    one checkpoint), or a transformer_lens `TransformerBridge` the caller holds (booted in
    a notebook; wrapped by model.loading.from_bridge, not reloaded: kind "bridge").
    `device` is where a model loaded here is placed: `cpu`, `cuda`, `cuda:N` or `mps`;
    None means $HARNESS_DEVICE or the best available
    (model.devices.resolve_device; a bad or unavailable name raises DeviceError).  An
    already loaded model runs where it is.  The data is moved to the model's device,
    and provenance["device"] records the device the model ran on (e.g. "cpu").
    `command` is recorded in the provenance (default: this process's command line).
    `threads`: torch threads while the claims are measured (harness.threads.chosen: default
    $HARNESS_THREADS, else 1 for models narrower than 512, else every available core);
    the previous count is restored afterwards.
    """
    with clock():
        return _run(hypothesis, seed=seed, base_dir=base_dir, command=command, figures=figures, model=model,
                    device=device, n_threads=threads)


def _run(hypothesis: str | Path | dict[str, Any], *, seed: int | None, base_dir: str | Path | None,
         command: str | None, figures: bool, model: LoadedModel | str | Path | Any | None, device: str | None,
         n_threads: int | None) -> Evidence:
    started = provenance.now()
    h = load(hypothesis, base_dir=base_dir)
    s = h.spec
    seed = s.seed if seed is None else seed
    device = resolve_device(device)
    stage(f"{s.name}: {len(s.claims)} claim(s); loading the model")
    if isinstance(model, LoadedModel):
        loaded = model
    elif isinstance(model, (str, Path)):
        loaded = load_model(model, device=device)
    elif model is not None:
        loaded = from_bridge(model)
    else:  # a directory relative to the file's folder wins; else a hub name from the local cache
        loaded = MODELS.get(ModelRef.parse(s.model, h.base_dir), device)
    check_names(h, loaded)
    ds = build_dataset(h, loaded)
    check_corruptions(h, ds)
    if metrics.get(s.metric).needs_wrong and ds.wrong is None:
        raise SpecError([f"{h.where('metric')}: {s.metric} needs 'wrong' tokens in the data"])
    unfit = metrics.fits_problem(s.metric, ds)
    if unfit is not None:
        raise SpecError([f"{h.where('metric')}: {unfit}"])
    with (threads.using(n_threads, int(loaded.bridge.cfg.d_model)) as used,
          memory.using(device=of(loaded.bridge)) as budget):
        stage(f"measuring on {used} thread(s), memory budget {memory.gb(budget)}")
        m = measure_all(loaded, ds, s.claims, metric=s.metric, st=s.stats, processing=s.weight_processing,
                        seed=seed, figures=figures)
    cfg = loaded.bridge.cfg
    return Evidence(
        hypothesis={"name": s.name, "description": s.description, "file": provenance.shown_path(h.path),
                    "sha256": h.sha256, "references": [r.to_dict() for r in h.references]},
        model={**model_record(loaded),
               "n_layers": loaded.n_layers, "n_heads": loaded.n_heads, "d_model": int(cfg.d_model),
               "d_head": int(cfg.d_head), "d_vocab": loaded.d_vocab,
               "d_vocab_out": loaded.d_vocab_out, "n_ctx": loaded.n_ctx,
               "attn_only": not loaded.has_mlp,
               "normalization": str(getattr(cfg, "normalization_type", None)),
               **dtype_record(loaded), "architecture": architecture.of(loaded.bridge).to_dict()},
        data={"description": ds.description, "n_prompts": ds.n, "seq_len": ds.seq_len,
              "bos_at_position_0": ds.has_bos, "scored_positions_per_prompt": int(ds.positions.shape[1]),
              "examples": examples(ds, bridge_tokenizer(loaded.bridge, loaded.source))},
        settings={"metric": s.metric, "seed": seed, "stats": s.stats.model_dump(),
                  "weight_processing": processing_text(s.weight_processing, architecture.of(loaded.bridge)),
                  "mean_ablation_reference": data_source.mean_reference(h.spec.data),
                  "resample_ablation_source": "the paired corrupted prompt"},
        baseline=m.baseline,
        sanity_checks=m.sanity_checks,
        claims=m.claims,
        weights_vs_use=m.weights_vs_use,
        figures_data=m.figures_data,
        warnings=ds.warnings + m.warnings,
        ladder=m.ladder,
        provenance={"versions": provenance.versions(), "command": command or provenance.command_line(),
                    "started": started, "finished": provenance.now(), "device": str(of(loaded.bridge)),
                    "memory_budget": budget, "host": provenance.host()},
    )


def model_record(m: LoadedModel) -> dict[str, Any]:
    """The evidence's model `source`, `kind`, `sha256` (and `revision` for a hub model).  A
    directory is shown relative to the working directory when inside it; `hf:NAME` and a
    handed-over bridge's description as they are."""
    record: dict[str, Any] = {"source": provenance.shown_source(m.kind, m.source), "kind": m.kind, "sha256": m.sha256}
    if m.revision is not None:
        record["revision"] = m.revision
    return record


def dtype_record(m: LoadedModel) -> dict[str, Any]:
    """The evidence's model `dtype` (what the model computes in), `stored_dtype` (what its
    weight files hold; absent for a handed-over bridge, which has no files, and a GGUF file) and
    `quantization` (a GGUF file's tensor types and file type)."""
    record: dict[str, Any] = {"dtype": m.dtype}
    if m.stored_dtype is not None:
        record["stored_dtype"] = m.stored_dtype
    if m.quantization is not None:
        record["quantization"] = dict(m.quantization)
    return record


def processing_text(p: str, arch: Architecture | None = None) -> str:
    """The weight processing in words, as `settings.weight_processing` records it (for the
    model's architecture: its norm, norms after sublayers, rotary positions)."""
    rotary = arch is not None and arch.rotary
    qk = ("; Q- and K-composition one-sided and offset-free under rotary positions (Y = W_Q, W_K of the "
          "receiver; the receiver's key/value head under grouped-query attention)") if rotary else ""
    if p == "raw":
        return "raw: weights as stored (no norm folding, no centring)" + qk
    tail = "; used for composition and copying scores only, runs use the model as loaded"
    if arch is not None and arch.norm == "RMS":
        post = ("; the norm after each attention (Gemma 2) folded into W_O as W_O diag(w_post)"
                if arch.post_norms else "")
        return ("folded: RMSNorm weights folded into W_Q/W_K/W_V and W_U (no centring: RMSNorm keeps the "
                "mean; a norm storing its offset from 1 contributes 1 + w)" + post + qk + tail)
    if arch is not None and arch.norm == "none":
        return "folded: the model has no norm weights, so the weights are as stored" + qk + tail
    return ("folded: LayerNorm weights folded into W_Q/W_K/W_V and W_U, reading weights "
            "centred (LN removes the mean), writing weights W_O and W_E centred, as "
            "TransformerLens process_weights(fold_ln, center_writing_weights)" + qk + tail)
