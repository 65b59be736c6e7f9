"""The shared base runs of a hypothesis file: the clean prompts and each named
corruption, each run once with the hooks its claims need cached, and the metric
per prompt on each.  Every intervention starts from these caches:

* `ablated(heads, kind)`: the clean prompts with `heads` ablated jointly
  (hooks.ablation_plan), optionally with every attention pattern frozen;
* `patched(edge, direction, replacement)`: exact edge patching
  (patching.prepare / fast_plan, run by Runs.run) in the given direction; paths,
  MLP ends and groups of senders through mech.edges.paths.

Each returns the metric per prompt (numpy, float64).  A `Runs` is for one
corruption (`corrupt`, `m_corrupt`); `with_corruption(name)` gives the view
for another.

Means (mean ablation, mean replacement) come from a `Reference` (mech.runs.reference):
per position, over reference prompts other than the one being intervened on.
`drop=k` leaves out the k-th of its groups as well (the delete-a-group jackknife;
claims.effects, mech.runs.jackknife).

`prompts(lo, hi)` is the same runs on a range of their prompts (views); every
ablation and edge patch runs over chunks of them sized by the memory budget
(`chunk`, `in_chunks`), so what an intervention holds does not grow with n.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ... import memory
from ...data.dataset import Dataset
from ...errors import UnsupportedError
from ...model import architecture, shape
from ...model.bridge import Bridge
from ...progress import progress
from ...spec import names
from ...spec.names import hook_mlp_out, hook_pattern, hook_resid_pre, hook_z
from ...spec.vocabulary import Ablation, Direction, Replacement
from .. import hooks
from ..edges import batched, patching, paths, writes
from ..graph import attribution, forward, parts, patches
from ..hooks import Cache
from . import ablation
from .reference import Lazy, Reference

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

PerPrompt = np.ndarray  # float64 [n_prompts]: the metric (or a change of it) prompt by prompt


def part_key(metric: str) -> str:
    """Where a base run keeps another metric's values per prompt (mech.runs.build `parts`)."""
    return f"metric:{metric}"


BATCH_BUDGET = 64 * 2**20  # working memory of one chunk of batched edge patching
CHUNK_BUDGET = 256 * 2**20  # working memory of one prompt chunk of an intervention (Runs.chunk)


@dataclass
class Runs:
    bridge: Bridge  # the TransformerBridge
    ds: Dataset  # on the model's device
    clean: Cache  # cached activations of the clean run (+ "logits")
    corrupt: Cache  # the same for the corrupted run of `corruption`
    metric: Callable[[Float[Tensor, "n pos vocab"]], PerPrompt]  # logits -> metric per prompt
    m_clean: PerPrompt
    m_corrupt: PerPrompt
    #: logits at the scored positions [V n, k, vocab] (V stacked copies of the prompts) -> metric [V n]
    metric_at: Callable[[Any], PerPrompt] | None = None
    corruption: str = ""  # the name of the corruption `corrupt` is
    corruptions: dict[str, tuple[Cache, PerPrompt]] = field(default_factory=dict)  # every corruption's run
    reference_source: Lazy = field(default_factory=lambda: Lazy(None))
    memo: dict[tuple[Any, ...], PerPrompt] = field(default_factory=dict)  # interventions done, shared by every view
    clean_logp: Any = None  # the clean log-probabilities at the scored positions, for metrics that compare with them
    #: logits at the scored positions [R, k, vocab] of rows showing prompts `idx` [R] -> the metric [R] (torch, float64,
    #: differentiable: edge circuits and attribution read it)
    metric_rows: Callable[[Any, Any], Any] | None = None
    graph_source: Lazy = field(default_factory=lambda: Lazy(None))  # the edge-graph arithmetic, made on first use
    graph_probe: Lazy = field(default_factory=lambda: Lazy(None))  # a run of the first prompts caching every write
    #: the batched edge path's checked arithmetic (batched.checked_model, or the UnsupportedError its check
    #: raised), made on first use and shared by every view: prompt chunks do not build and check it again
    edge_source: Lazy = field(default_factory=lambda: Lazy(None))
    metric_name: str = ""  # the registered metric these runs score (model.metrics), "" where not known
    #: (dataset, clean log-probabilities, metric name or None for these runs') -> (metric, metric_at, metric_rows) of
    #: that dataset's prompts (`prompts`, `with_metric`)
    scorers: Callable[..., tuple[Callable[..., Any], ...]] | None = None
    behaviour: dict[str, np.ndarray] = field(default_factory=dict)  # "clean"/corruption -> behaviour.per_prompt

    def __post_init__(self) -> None:
        if self.edge_source.make is None:  # views (`prompts`, `with_corruption`) share their runs' source
            # over the runs' parts, not the runs: a bound method would make a cycle, and dropping the
            # runs would not free their caches until the next full garbage collection
            bridge, clean, probe = self.bridge, self.clean, self.graph_probe
            self.edge_source = Lazy(lambda: checked_edge_blocks(bridge, clean, probe))

    @property
    def n_layers(self) -> int:
        return int(self.bridge.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.bridge.cfg.n_heads)

    @property
    def corrupted_tokens(self) -> Any:
        return self.ds.corruptions[self.corruption]

    def with_corruption(self, name: str | None) -> Runs:
        """The same runs with `name`'s corrupted run (None: this one)."""
        if name is None or name == self.corruption:
            return self
        cache, metric = self.corruptions[name]
        return replace(self, corrupt=cache, m_corrupt=metric, corruption=name)

    def with_metric(self, name: str) -> Runs:
        """The same runs scored by metric `name`, which the base runs took from the same logits
        (base_runs `parts`); interventions memoised apart from these runs'."""
        key = part_key(name)
        if key not in self.clean or self.scorers is None:
            raise ValueError(f"the base runs did not take metric {name!r}")
        metric, metric_at, metric_rows = self.scorers(self.ds, self.clean_logp, name)
        corruptions = {c: (cache, cache[key].numpy()) for c, (cache, _) in self.corruptions.items()}
        scorers = self.scorers
        return replace(self, metric=metric, metric_at=metric_at, metric_rows=metric_rows, metric_name=name,
                       m_clean=self.clean[key].numpy(), m_corrupt=self.corrupt[key].numpy(), corruptions=corruptions,
                       memo={}, scorers=lambda d, lp, n=None: scorers(d, lp, n or name))

    def prompts(self, lo: int, hi: int) -> Runs:
        """The same runs on prompts lo..hi-1: every cached tensor sliced (a view, not a copy), the
        reference means still over every reference prompt (leave-one-out: each prompt's own left out),
        interventions memoised apart from these runs'.  The logits kept for run_from's check (those of
        the first prompts) stay with a range that starts at 0."""
        if self.scorers is None:
            raise ValueError("these runs cannot be narrowed to fewer prompts")
        n = self.ds.n

        def cut(run: Cache) -> Cache:
            return {name: t[lo:hi] if t.shape[0] == n and name != "logits_at" else t for name, t in run.items()
                    if name != "logits_at" or lo == 0}

        ds = self.ds.select(list(range(lo, hi)))
        lp = None if self.clean_logp is None else self.clean_logp[lo:hi]
        metric, metric_at, metric_rows = self.scorers(ds, lp)
        corruptions = {name: (cut(c), m[lo:hi]) for name, (c, m) in self.corruptions.items()}
        source = self.reference_source

        def reference() -> Reference | None:
            ref = source.get()
            return None if ref is None else replace(ref, rows=(lo, hi)) if ref.loo else ref

        return replace(self, ds=ds, clean=cut(self.clean), corrupt=cut(self.corrupt), metric=metric,
                       m_clean=self.m_clean[lo:hi], m_corrupt=self.m_corrupt[lo:hi], metric_at=metric_at,
                       corruptions=corruptions, reference_source=Lazy(reference), memo={}, clean_logp=lp,
                       metric_rows=metric_rows)

    def chunk(self) -> int:
        """Prompts one intervention runs at once: their logits at the scored positions and the float64
        temporaries of their metric (hooks.logits_bytes) within memory.working(CHUNK_BUDGET), so an
        intervention's memory does not grow with n_prompts."""
        per_prompt = hooks.logits_bytes(int(self.ds.positions.shape[1]), shape.vocab_out(self.bridge.cfg))
        return max(1, memory.working(CHUNK_BUDGET) // per_prompt)

    def in_chunks(self, fn: Callable[[Runs], list[PerPrompt]]) -> list[PerPrompt] | None:
        """fn over views of consecutive prompts (`prompts`, `chunk` at a time), each result concatenated
        over them; None when every prompt fits one chunk (then the caller runs on these runs)."""
        n, size = self.ds.n, self.chunk()
        if n <= size:
            return None
        parts = [fn(self.prompts(lo, min(n, lo + size)))
                 for lo in progress(range(0, n, size), f"{n} prompts in chunks of {size}", quiet=True)]
        return [np.concatenate(got) for got in zip(*parts, strict=True)]

    @property
    def reference(self) -> Reference:
        ref = self.reference_source.get()
        if ref is None:
            raise ValueError("these runs have no reference prompts for means")
        return cast("Reference", ref)

    def z(self, run: Cache) -> dict[int, Float[Tensor, "n pos head d_head"]]:
        """{layer: hook_z activations} of the layers cached in `run`."""
        return {layer: run[hook_z(layer)] for layer in range(self.n_layers) if hook_z(layer) in run}

    def patterns(self, run: Cache) -> dict[int, Float[Tensor, "n head query key"]]:
        return {layer: run[hook_pattern(layer)] for layer in range(self.n_layers)}

    def mean_z(self, layers: set[int], drop: int | None = None) -> dict[int, Any]:
        """{layer: per-position mean z over the reference prompts} (see Reference.mean)."""
        ref = self.reference
        return {layer: ref.mean(ref.cache[hook_z(layer)], drop) for layer in layers}

    def mean_activations(self, sender: names.Sender, drop: int | None = None) -> dict[Any, Any]:
        """Each of the sender's members' activations averaged per position over the reference
        prompts (mech.edges.writes.reference_means)."""
        return writes.reference_means(self.bridge, self.reference, sender, drop)

    def run(self, tokens: Any, base: Cache, plan: hooks.Plan, freeze: bool = False) -> PerPrompt:
        """The metric of `tokens` (the run `base` cached) with the plan's hooks, and with every
        attention pattern held at its `base` value if `freeze`.  When the base run cached the
        residual where the plan's first hook sits, only the blocks from there on run, and the
        unembedding only at the scored positions (hooks.run_from); else a whole forward."""
        start = hooks.first_layer(plan)
        key = hook_resid_pre(start) if start is not None else ""
        if freeze:
            pats = self.patterns(base)
            plan = hooks.Plan(plan.hooks + patching.freeze_patterns_plan(
                {layer: p for layer, p in pats.items() if start is None or key not in base or layer >= start}).hooks)
        if (start is not None and self.metric_at is not None
                and hooks.can_start_inside(self.bridge, base, start, self.ds.positions)):
            return self.metric_at(hooks.run_from(self.bridge, start, base[key], plan, self.ds.positions))
        return self.metric(hooks.run_plan(self.bridge, tokens, plan))

    def ablated(self, heads: Sequence[names.Unit], kind: str, freeze: bool = False,
                drop: int | None = None) -> PerPrompt:
        """Metric of the clean prompts with `heads` (heads and MLPs) ablated jointly (`kind`:
        zero, mean, resample); each distinct ablation is computed once per run (`memo`)."""
        key = self._key(heads, kind, freeze, drop)
        if key not in self.memo:
            got = self.in_chunks(lambda r: [r.ablated(heads, kind, freeze, drop)])
            if got is not None:
                self.memo[key] = got[0]
                return got[0]
            only_heads = [h for h in heads if isinstance(h, names.Head)]
            mlps = [m for m in heads if isinstance(m, names.Mlp)]
            means = self.mean_z({h.layer for h in only_heads}, drop) if kind == Ablation.MEAN else {}
            plan = hooks.ablation_plan(only_heads, kind, self.z(self.corrupt), means)
            if mlps:
                layers = {m.layer for m in mlps}
                corrupted = {layer: self.corrupt[hook_mlp_out(layer)] for layer in layers
                             if kind == Ablation.RESAMPLE}
                plan.hooks += hooks.mlp_ablation_plan(
                    mlps, kind, corrupted, self.mean_mlp(layers, drop) if kind == Ablation.MEAN else {}).hooks
            self.memo[key] = self.run(self.ds.clean, self.clean, plan, freeze)
        return self.memo[key]

    def mean_mlp(self, layers: set[int], drop: int | None = None) -> dict[int, Any]:
        """{layer: per-position mean MLP output over the reference prompts} (see Reference.mean)."""
        ref = self.reference
        return {layer: ref.mean(ref.cache[hook_mlp_out(layer)], drop) for layer in layers}

    def ablated_many(self, head_sets: Sequence[Sequence[names.Unit]], kind: str,
                     drops: Sequence[int | None] | None = None) -> list[PerPrompt]:
        """`ablated(head_sets[v], kind, drop=drops[v])` for every v, the variants stacked along the
        batch (mech.runs.ablation; heads only) when the runs allow it, else one by one."""
        drops = list(drops) if drops is not None else [None] * len(head_sets)
        todo = [v for v, (hs, dr) in enumerate(zip(head_sets, drops, strict=True))
                if self._key(hs, kind, False, dr) not in self.memo and hs
                and all(isinstance(h, names.Head) for h in hs)]
        sets, dr_ = [head_sets[v] for v in todo], [drops[v] for v in todo]
        chunked = self.in_chunks(lambda r: r.ablated_many(sets, kind, dr_)) if todo else None
        if chunked is not None:
            for v, m in zip(todo, chunked, strict=True):
                self.memo[self._key(head_sets[v], kind, False, drops[v])] = m
            todo = []
        start = min((h.layer for v in todo for h in head_sets[v]), default=0)
        key = hook_resid_pre(start)
        if todo and self.metric_at is not None and hooks.can_start_inside(self.bridge, self.clean, start,
                                                                          self.ds.positions):
            variants = [ablation.Variant(_heads(head_sets[v]), self._sources(_heads(head_sets[v]), kind,
                                                                                     drops[v]))
                        for v in todo]
            got = ablation.ablated_metrics(self.bridge, self.clean[key], start, self.ds.positions, variants,
                                                   self.metric_at)
            for v, m in zip(todo, got, strict=True):
                self.memo[self._key(head_sets[v], kind, False, drops[v])] = m
        return [self.ablated(hs, kind, drop=dr) for hs, dr in zip(head_sets, drops, strict=True)]

    def _key(self, heads: Sequence[names.Unit], kind: str, freeze: bool, drop: int | None) -> tuple[Any, ...]:
        corruption = self.corruption if kind == Ablation.RESAMPLE else ""
        return (corruption, tuple(sorted(str(h) for h in heads)), kind, freeze, drop)

    def _sources(self, heads: list[names.Head], kind: str, drop: int | None) -> dict[int, Any]:
        """Per ablated layer, the z that replaces the heads' (None: zeros)."""
        layers = {h.layer for h in heads}
        if kind == Ablation.ZERO:
            return dict.fromkeys(layers)
        if kind == Ablation.MEAN:
            return self.mean_z(layers, drop)
        return {layer: self.corrupt[hook_z(layer)] for layer in layers}

    def patched(self, edge: paths.Route, direction: str, replacement: str, freeze: bool = False,
                drop: int | None = None) -> PerPrompt:
        """Metric with `edge` patched: noising runs the clean prompts with the sender's
        replacement output (resample: from the corrupted run) where the receiver reads it;
        denoising runs the corrupted prompts with the clean output there.  A path (or an
        edge with an MLP end or a group of senders) is patched by mech.edges.paths; a one-hop
        path is its edge; all routes: mech.edges.paths.AllRoutes."""
        if isinstance(edge, names.Path) and edge.as_edge is not None:
            edge = edge.as_edge
        key = self.edge_key(edge, direction, replacement, freeze, drop)
        if key not in self.memo:
            got = self.in_chunks(lambda r: [r.patched(edge, direction, replacement, freeze, drop)])
            if got is not None:
                self.memo[key] = got[0]
                return got[0]
            noising = direction == Direction.NOISING
            base, source = (self.clean, self.corrupt) if noising else (self.corrupt, self.clean)
            means = self.mean_activations(edge.sender, drop) if replacement == Replacement.MEAN else None
            tokens = self.ds.clean if noising else self.corrupted_tokens
            if paths.needs_paths(edge) or not isinstance(edge, names.Edge):
                plan = paths.plan(self.bridge, edge, base, source, replacement, means,
                                  lambda p: self.run(tokens, base, p, freeze))
            else:
                plan = patching.fast_plan(self.bridge, patching.prepare(self.bridge, edge, base, source, replacement,
                                                                        means), base)
            self.memo[key] = self.run(tokens, base, plan, freeze)
        return self.memo[key]

    def patched_many(self, edges: Sequence[names.Edge], direction: str, replacement: str,
                     budget: int | None = None, progress: Callable[..., Any] | None = None) -> list[PerPrompt]:
        """`patched(e, direction, replacement)` for every edge, through the batched path
        (mech.edges.batched: many edges per pass, from each receiver's layer, chunks of `budget`
        bytes) when the base runs cached what it reads and the replacement is resample or zero;
        else one by one."""
        todo = list(dict.fromkeys(e for e in edges if self.edge_key(e, direction, replacement, False, None)
                                  not in self.memo and not paths.needs_paths(e)))
        chunked = (self.in_chunks(lambda r: r.patched_many(todo, direction, replacement, budget, progress))
                   if todo else None)
        if chunked is not None:
            for e, m in zip(todo, chunked, strict=True):
                self.memo[self.edge_key(e, direction, replacement, False, None)] = m
            todo = []
        if len(todo) > 1:
            batched.patch_into(self, todo, direction, replacement,
                                     memory.working(BATCH_BUDGET) if budget is None else budget, progress)
        patches.patch_mlp_ends(self, edges, direction, replacement)
        return [self.patched(e, direction, replacement) for e in edges]

    def edge_key(self, edge: paths.Route, direction: str, replacement: str, freeze: bool,
                 drop: int | None) -> tuple[Any, ...]:
        """The key an edge patch is memoised under (in `memo`, shared by every view)."""
        return ("edge", self.corruption, str(edge), direction, replacement, freeze, drop)

    @property
    def rows_metric(self) -> Callable[[Any, Any], Any]:
        """`metric_rows`, which edge circuits and attribution need (ValueError for runs built without it)."""
        if self.metric_rows is None:
            raise ValueError("these runs have no per-row metric")
        return self.metric_rows

    def release(self) -> None:
        """Forget what is made again on use and costs memory of the model's size: the edge-graph
        arithmetic and the batched edge path's (their folded weights), the memory they held handed back
        (memory.release); called between stages and phases of a stage, so that they are held only by
        the stages that use them."""
        self.graph_source.drop()
        self.edge_source.drop()
        memory.release()

    def edge_blocks(self) -> Any:
        """The batched edge path's arithmetic (batched.checked_model), checked on the clean run
        when it cached every layer's residual, else on the run of the first prompts that did; made
        once for every view of these runs (UnsupportedError, every time, where the check failed)."""
        got = self.edge_source.get()
        if isinstance(got, UnsupportedError):
            raise got
        return got

    def graph_model(self) -> forward.GraphModel:
        """The model's arithmetic with one input per receiver (mech.graph.forward), checked on the clean run
        (or, when the base runs did not cache every sender's write, on a run of the first prompts that
        does: `graph_check`)."""
        gm = self.graph_source.get()
        if gm is None:
            raise ValueError("these runs were not built for edge circuits")
        return cast(forward.GraphModel, gm)

    def has_writes(self, run: Cache) -> bool:
        """Whether `run` cached every sender's write (what whole-graph forwards read)."""
        names_ = parts.cache_names(self.n_layers, architecture.of(self.bridge).has_mlp)
        return all(n in run for n in hooks.for_architecture(self.bridge, names_))

    def graph_check(self) -> tuple[Cache, int]:
        """A run that cached every sender's write and how many of the first clean prompts it shows: the
        clean run itself when it did, else the run of the first prompts the graph arithmetic was checked on."""
        self.graph_model()
        if self.has_writes(self.clean):
            return self.clean, self.ds.n
        probe = self.graph_probe.get()
        return probe, int(probe[hook_resid_pre(0)].shape[0])

    def writes(self, run: Cache, layers: set[int] | None = None) -> parts.Writes:
        """Every sender's write in `run` (mech.graph.parts.run_writes), at the positions the graph computes;
        with `layers`, embed's and those of the senders in these layers only."""
        gm = self.graph_model()
        if layers is None and not self.has_writes(run):
            raise ValueError("these base runs did not cache every sender's write (a whole-graph forward reads them)")
        return parts.run_writes(self.bridge, run, gm.s, run[names.HOOK_EMBED].dtype, layers)

    def mean_writes(self, drop: int | None = None) -> parts.Writes:
        """Every sender's per-position mean write over the reference prompts (see Reference.mean)."""
        ref, s = self.reference, self.graph_model().s
        ref_writes = parts.run_writes(self.bridge, ref.cache, s, ref.cache[hook_z(0)].dtype)
        return parts.Writes(ref.mean(ref_writes.embed, drop), [ref.mean(z, drop) for z in ref_writes.z],
                                [None if m is None else ref.mean(m, drop) for m in ref_writes.mlp])

    def edge_scores(self, method: str, *, steps: int = 5, direction: str = Direction.NOISING,
                    wanted: list[tuple[int, int]] | None = None, batch: int | None = None,
                    progress: Callable[..., Any] | None = None, resamples: np.ndarray | None = None
                    ) -> attribution.Scores:
        """The attribution score of every edge between this clean run and this corruption's run
        (mech.graph.attribution.edge_scores, its formulas and sign convention; `resamples`: prompt weights)."""
        return attribution.edge_scores(self.graph_model(), self.writes(self.clean), self.writes(self.corrupt),
                                       self.ds.positions, self.rows_metric, method=method, steps=steps,
                                       direction=direction, wanted=wanted, batch=batch, progress=progress,
                                       resamples=resamples)

    def edge_prompt_scores(self, edge: names.Edge, method: str, *, steps: int = 5,
                           batch: int | None = None) -> np.ndarray:
        """[n]: one edge's noising attribution score per prompt, from the gradient at its receiver alone
        (mech.graph.attribution.edge_prompt_scores: `steps` forwards and backwards to the receiver's layer)."""
        if isinstance(edge.sender, names.Group):
            raise ValueError(f"{edge}: an attribution score is of one sender")
        gm = self.graph_model()
        g = gm.graph
        layers = {edge.sender.layer} if isinstance(edge.sender, (names.Head, names.Mlp)) else set()
        return attribution.edge_prompt_scores(gm, self.writes(self.clean, layers), self.writes(self.corrupt, layers),
                                              self.ds.positions, self.rows_metric,
                                              (g.sender_index(edge.sender), g.receiver_index(edge.receiver)),
                                              method=method, steps=steps, batch=batch)

    def edge_circuits(self, masks: Sequence[np.ndarray], kind: str, drop: int | None = None) -> list[PerPrompt]:
        """Metric of the clean prompts keeping only each mask's edges ([senders, receivers] bool, mech.graph.structure),
        every other edge carrying `kind`'s replacement (resample: this corruption's run; mean: the
        reference means, group `drop` left out; zero); each distinct circuit computed once per run."""
        return patches.circuit_metrics(self, masks, kind, drop)


def _heads(units: Sequence[names.Unit]) -> list[names.Head]:
    """The heads among ablation members (the batched path takes heads only)."""
    return [h for h in units if isinstance(h, names.Head)]


def checked_edge_blocks(bridge: Bridge, clean: Cache, probe: Lazy) -> Any:
    """The batched edge path's arithmetic (Runs.edge_blocks), checked on the clean run when it cached
    every layer's residual, else on the run of the first prompts (`probe`); the UnsupportedError
    where the check failed."""
    every = [hook_resid_pre(layer) for layer in range(int(bridge.cfg.n_layers))]
    check = clean if all(n in clean for n in every) else probe.get()
    try:
        return batched.checked_model(bridge, check)
    except UnsupportedError as exc:
        return exc
