"""The one way base runs are built: the clean run and one run per corruption of a dataset,
each caching the hooks the claims read and the metric per prompt (mech.runs.cached.Runs holds
them); `harness run` (engine.measure), `harness scan` and `harness discover` call it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ... import memory
from ...errors import DataError
from ...model import architecture, behaviour, metrics
from ...model.bridge import Bridge
from ...model.devices import wide
from ...progress import stage
from ...spec import names
from .. import hooks
from ..graph import forward
from ..graph import parts as graph_parts
from ..hooks import Cache
from .cached import PerPrompt, Runs, part_key
from .reference import Lazy, Reference

GRAPH_PROBE = 4  # prompts of the run that checks the graph arithmetic when the base runs did not cache every write
KEEP_LOGITS = 2  # prompts whose logits a base run keeps after its metric (hooks.can_start_inside checks on them)
EMBED_HOOKS = (names.HOOK_EMBED, names.HOOK_POS_EMBED)
BEHAVIOUR = "(behaviour)"  # the accuracy and answer rank per prompt (not a metric name: none has brackets)
REFERENCE_FIRST = 8  # reference prompts of the first chunk, which measures a prompt's cache
REFERENCE_BUDGET = 128 * 2**20  # the caches of one chunk of reference prompts, before they are summed


def base_runs(bridge: Bridge, ds: Any, wanted: Sequence[str], metric: str, parts: Sequence[str] = (),
              corrupted: Sequence[str] | None = None) -> Runs:
    """The clean run and one run per corruption of `ds` (data.dataset.Dataset, on the model's
    device), each caching the `wanted` hooks and the logits at the scored positions, with the
    metric per prompt (model.metrics.per_prompt) on each; the reference prompts for means run
    on first use, caching activations only (z, MLP outputs, the embedding).  The one way base
    runs are built: `harness run` (engine.measure) and `harness scan` both call it.  `parts`:
    other metrics taken from the same logits (runs.part_key in each cache; Runs.with_metric).
    `corrupted`: the hooks the corrupted runs cache, where the claims read fewer of them there
    than in the clean run (default: `wanted`)."""

    for name in (metric, *parts):  # a metric that reads one token never scores data with sets of answers
        unfit = metrics.fits_problem(name, ds)
        if unfit is not None:
            raise DataError(unfit)
    wanted = list(dict.fromkeys(wanted))
    in_corrupted = wanted if corrupted is None else list(dict.fromkeys(corrupted))
    reference_lp: list[Any] = []  # the clean run's log-probabilities at the scored positions (needs_clean metrics)
    metric_of, metric_at, metric_rows = scorers(ds, metric, lambda: reference_lp[0] if reference_lp else None)
    part_rows = {p: scorers(ds, p, lambda: reference_lp[0] if reference_lp else None)[2] for p in parts}

    n_runs = 1 + len(ds.corruptions)
    said: list[bool] = []
    weights = float(sum(p.numel() * p.element_size() for p in bridge.parameters()))

    def fits(per_hook: dict[str, float]) -> None:  # called by the clean run, which caches every hook wanted
        clean_pp = sum(per_hook.values())
        other = set(hooks.for_architecture(bridge, in_corrupted))
        other_pp = sum(b for x, b in per_hook.items() if x in other)
        per_prompt = (clean_pp + other_pp * (n_runs - 1)) / n_runs  # a prompt and run, on average
        if not said:
            said.append(True)
            fewer = (f"; the corrupted run(s) {len(other)} of them, {other_pp / 2**20:.2f} MiB a prompt"
                     if n_runs > 1 and len(other) < len(per_hook) else "")
            stage(f"base runs cache {len(per_hook)} hooks: {clean_pp / 2**20:.2f} MiB a prompt{fewer}; "
                  f"{memory.gb(per_prompt * ds.n * n_runs)} for {n_runs} run(s) of {ds.n} prompts")
        memory.check_cache(per_prompt, ds.n, n_runs, weights, f"the base runs of {ds.n} prompts")

    def run(tokens: Any, wanted: list[str]) -> tuple[Cache, PerPrompt]:
        import torch

        got: dict[str, list[Any]] = {name: [] for name in (metric, *parts, BEHAVIOUR)}
        rows = {metric: metric_rows, **part_rows, BEHAVIOUR: behaviour_rows}

        def take(logits_at: Any, lo: int) -> None:  # the metric, batch by batch: no logits of all n prompts
            idx = torch.arange(lo, lo + logits_at.shape[0], device=logits_at.device)
            for name, fn in rows.items():
                got[name].append(fn(logits_at, idx).detach().cpu())

        if metrics.get(metric).needs_clean and not reference_lp:  # the clean run comes first
            # its log-probabilities at the scored positions are what the metric compares every run with
            cache = hooks.cache_hooks(bridge, tokens, wanted, ds.positions, check=fits)
            reference_lp.append(metrics.clean_logp(cache["logits_at"]))
            at = cache["logits_at"]
            got[metric].append(torch.as_tensor(metric_at(at)))
            for name, fn in {**part_rows, BEHAVIOUR: behaviour_rows}.items():
                got[name].append(fn(at, torch.arange(ds.n, device=at.device)).detach().cpu())
            cache["logits_at"] = cache["logits_at"][:KEEP_LOGITS].clone()  # run_from's check reads these
        else:
            cache = hooks.cache_hooks(bridge, tokens, wanted, ds.positions, check=None if said else fits,
                                      keep=KEEP_LOGITS, each=take)
        for name in parts:
            cache[part_key(name)] = torch.cat(got[name])
        behaviour_of.append(torch.cat(got[BEHAVIOUR]).numpy())
        return cache, torch.cat(got[metric]).numpy()

    def behaviour_rows(logits_at: Any, idx: Any) -> Any:
        return behaviour.per_prompt(logits_at, sets[0][idx], None if sets[1] is None else sets[1][idx])

    sets = ds.scored(ds.answer_sets is not None)  # what behaviour compares: the sets where the data give them
    behaviour_of: list[np.ndarray] = []  # each run's accuracy and answer rank per prompt, in the order they ran
    clean, m_clean = run(ds.clean, wanted)
    corruptions = {name: run(tokens, in_corrupted) for name, tokens in ds.corruptions.items()}

    def reference() -> Reference:
        if ds.reference is None:  # the clean prompts themselves, each prompt's mean leaving it out
            return Reference(clean, loo=True)
        # means are taken of activations only: z, MLP outputs, the embedding
        means_of = [n for n in wanted if n.endswith((".attn.hook_z", ".hook_mlp_out")) or n in EMBED_HOOKS]
        m = ds.reference.shape[0]
        positions = ds.positions[:1].expand(m, -1)
        per_prompt: list[float] = []

        def chunks() -> Iterator[tuple[int, Cache]]:  # summed into groups chunk by chunk: memory does not grow with m
            lo = 0
            while lo < m:
                size = REFERENCE_FIRST if not per_prompt else max(1, int(memory.working(REFERENCE_BUDGET)
                                                                          // max(1.0, per_prompt[0])))
                hi = min(m, lo + size)
                # no logits: a large vocabulary makes them the biggest tensors, and no mean reads them
                yield lo, hooks.cache_hooks(bridge, ds.reference[lo:hi], means_of or wanted, positions[lo:hi],
                                            keep=0, check=(lambda got: per_prompt.append(sum(got.values())))
                                            if not per_prompt else None)
                lo = hi
        return Reference.summed(chunks(), m)

    graph_names = graph_parts.cache_names(int(bridge.cfg.n_layers), architecture.of(bridge).has_mlp)

    def probe() -> Cache:  # the first prompts, caching every write: what the graph arithmetic is checked on
        k = min(GRAPH_PROBE, ds.n)
        return hooks.cache_hooks(bridge, ds.clean[:k], graph_names, ds.positions[:k])

    probe_source = Lazy(probe)

    def graph() -> forward.GraphModel:
        if all(n in clean for n in hooks.for_architecture(bridge, graph_names)):
            return forward.GraphModel.build(bridge, clean, ds.positions)
        # the base runs cached the writes some claims read, not all: check the arithmetic on the first prompts
        return forward.GraphModel.build(bridge, probe_source.get(), ds.positions)

    default = ds.default_corruption
    return Runs(bridge, ds, clean, corruptions[default][0], metric_of, m_clean, corruptions[default][1],
                metric_at=metric_at, corruption=default, corruptions=corruptions, reference_source=Lazy(reference),
                clean_logp=reference_lp[0] if reference_lp else None, metric_rows=metric_rows,
                graph_source=Lazy(graph), graph_probe=probe_source, metric_name=metric,
                behaviour=dict(zip(["clean", *ds.corruptions], behaviour_of, strict=True)),
                scorers=lambda d, lp, name=None: scorers(d, name or metric, lambda: lp))


def scorers(ds: Any, metric: str, clean_lp: Callable[[], Any]) -> tuple[Callable[..., Any], ...]:
    """The metric functions of `ds`'s prompts (Runs.metric, .metric_at, .metric_rows); `clean_lp()`: the
    clean run's log-probabilities at the scored positions, or None (for metrics that compare with them)."""

    def clean_for(V: int) -> Any:
        ref = clean_lp()
        return ref if ref is None or V == 1 else ref.repeat(V, 1, 1)

    answers, wrong = ds.scored(metrics.get(metric).sets)  # [n, k], or sets [n, k, S]

    def tiled(t: Any, V: int) -> Any:
        return None if t is None else t.repeat(V, *([1] * (t.dim() - 1)))

    def metric_of(logits: Any) -> np.ndarray:
        return metrics.per_prompt(logits, ds.positions, answers, metric, wrong, clean_for(1)).cpu().numpy()

    def metric_at(logits_at: Any) -> np.ndarray:  # logits at the scored positions [V n, k, vocab]
        V = logits_at.shape[0] // ds.n
        return metrics.per_prompt(logits_at, None, tiled(answers, V), metric, tiled(wrong, V),
                                  clean_for(V)).cpu().numpy()

    def metric_rows(logits_at: Any, idx: Any) -> Any:  # rows [R, k, vocab] showing prompts idx [R]
        """The metric of each row, its float64 work in chunks of rows (metrics.CHUNK_ELEMENTS values:
        at a 262,144-token vocabulary a few rows' float64 logits and log-probabilities are 100s of MiB)."""
        import torch

        m = metrics.get(metric)
        ref = clean_lp()
        size = metrics.rows_per_chunk(logits_at.shape[1], logits_at.shape[2])
        return torch.cat([m.fn(wide(logits_at[lo:lo + size]), answers[idx[lo:lo + size]],
                               None if wrong is None else wrong[idx[lo:lo + size]],
                               None if ref is None else wide(ref[idx[lo:lo + size]]))  # the rows first
                          for lo in range(0, logits_at.shape[0], size)])

    return metric_of, metric_at, metric_rows
