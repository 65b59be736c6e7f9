"""Conformance checks that a plugin author runs on their own extension (harness.extend), in the
spirit of scikit-learn's `check_estimator`: each runs the extension through what harness will do
with it and raises ConformanceError listing every check that failed; it returns the names of the
checks that passed.

* `check_family(family, model_dir)`: the family's model, loaded through the adapter, reproduced by
  harness's own arithmetic on random prompts: the block arithmetic of every layer (q/k/v, z, the
  attention output, each block's output and the logits: mech.block.fidelity), each head's
  attention by hand (mech.block.attention), the identity patch of a few edges into q/k/v and the
  logits, their fast and reference paths agreeing, the batched sweep agreeing with them, and the
  edge graph reproducing the clean run with every edge kept and the corrupted one with none.
* `check_claim_kind(kind, claim, model_dir)`: the kind's declaration (name, schema literal,
  details, evidence type, summary, view), then a hypothesis file of that one claim run end to end
  on the model: a verdict, details of the declared type, a valid evidence.json, and `harness
  report` rendering it again from the document alone.
* `check_metric(metric)`: per-prompt float64 values of the right shape, finite; higher when the
  answer's logit is raised (the orientation every effect assumes); the no-information value.
* `check_data_source(source, data, model_dir)`: the prompts it builds for the model: clean and
  corrupted token ids of one shape, scored positions inside the prompts, answers inside the
  output vocabulary, a corruption that changes some prompt, and a run of a role claim on them.

Each check registers what it is given for its own duration when it is not registered yet.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .claims import registry
from .claims.base import ClaimKind
from .claims.view import ClaimView
from .data import sources
from .engine import runner
from .errors import HarnessError
from .evidence.details import Details
from .hypothesis.loading import load as load_hypothesis
from .mech import hooks
from .mech.block import attention, fidelity
from .mech.edges import batched, sets
from .mech.edges import patching as P
from .mech.graph import forward, parts
from .model import architecture, families, metrics
from .model.metrics import Metric
from .model.ref import ModelRef
from .report import writer
from .spec import names
from .spec.fields import ClaimSpec


class ConformanceError(HarnessError):
    """An extension failed conformance checks: `failures` holds one line per failed check."""

    def __init__(self, what: str, failures: list[str]):
        self.failures = failures
        super().__init__(f"{what}: {len(failures)} conformance check(s) failed: " + "; ".join(failures))


class _Checks:
    """Named checks run in order; a failing one is recorded and the rest still run (unless a later one
    depends on it: `require`)."""

    def __init__(self, what: str):
        self.what, self.passed, self.failed = what, [], []  # type: ignore[var-annotated]

    def check(self, name: str, fn: Callable[[], object]) -> bool:
        try:
            result = fn()
        except Exception as exc:  # a check's own error is its failure, named
            self.failed.append(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            return False
        if result is False:
            self.failed.append(name)
            return False
        self.passed.append(name)
        return True

    def done(self) -> list[str]:
        if self.failed:
            raise ConformanceError(self.what, self.failed)
        return self.passed


@contextmanager
def _registered(add: Callable[[], None], remove: Callable[[], None], present: bool) -> Iterator[None]:
    if present:
        yield
        return
    add()
    try:
        yield
    finally:
        remove()


def _close(a: Any, b: Any, tol: float) -> bool:
    return float((a.double() - b.double()).abs().max()) <= tol * (1.0 + float(b.double().abs().max()))


# ------------------------------------------------------------------------------------------- families
def check_family(family: Any, model_dir: str | Path, *, n_prompts: int = 4, seq: int = 12, seed: int = 0) -> list[str]:
    """Conformance of a model family adapter on a model of the family (module docstring); the model is
    loaded in float32 on the CPU, so keep it small (a random model of the family's shape serves)."""

    checks = _Checks(f"model family {getattr(family, 'name', family)!r}")
    if not checks.check("the adapter is well formed", lambda: family.check() is None):
        return checks.done()
    present = families.FAMILIES.find(family.name) is family
    with _registered(lambda: families.register(family), lambda: families.unregister(family.name), present):
        _family_checks(checks, family, Path(model_dir), n_prompts, seq, seed)
    return checks.done()


def _family_checks(checks: _Checks, family: Any, model_dir: Path, n: int, seq: int, seed: int) -> None:
    import numpy as np
    import torch

    state: dict[str, Any] = {}

    def load() -> bool:
        m = ModelRef.parse(str(model_dir)).load("cpu", torch.float32)
        state["m"], state["arch"] = m, architecture.of(m.bridge)
        return state["arch"].family == family.name

    if not checks.check("the model loads and describes itself through the adapter", load):
        return
    m, arch = state["m"], state["arch"]
    L, H, V = arch.n_layers, arch.n_heads, int(m.d_vocab)
    g = torch.Generator().manual_seed(seed)
    base_tokens = torch.randint(1, V, (n, seq), generator=g)
    source_tokens = torch.randint(1, V, (n, seq), generator=g)
    positions = torch.arange(seq // 2, seq - 1).expand(n, -1).contiguous()
    answers = base_tokens.gather(1, positions + 1)
    wanted = list(dict.fromkeys(sets.cache_names(L) + parts.cache_names(L, arch.has_mlp)))
    base = hooks.cache_hooks(m.bridge, base_tokens, wanted)
    source = hooks.cache_hooks(m.bridge, source_tokens, wanted)
    tol = fidelity.tolerance(base[names.hook_resid_pre(0)].dtype)

    checks.check("the block arithmetic reproduces every layer and the logits (mech.block.fidelity)",
                 lambda: batched.checked_model(m.bridge, base) is not None)

    def hand() -> None:
        for layer in range(L):
            attention.check(m.bridge, base, layer)

    checks.check("each head's attention by hand reproduces the model's z (mech.block.attention)", hand)
    edges = [names.Edge(names.Head(0, h % H), names.HeadInput(names.Head(L - 1, (h + 1) % H), x))
             for h, x in enumerate("qkv")] + [names.Edge(names.Head(L - 1, 0), names.Logits()),
                                              names.Edge(names.Embed(), names.HeadInput(names.Head(L - 1, 0), "k"))]

    def identity() -> bool:
        return all(_close(P.fast_logits(m.bridge, base_tokens, P.prepare(m.bridge, e, base, base, "resample"),
                                        base=base), base["logits"], tol) for e in edges)

    checks.check("patching a run into itself changes nothing", identity)

    def per_edge() -> Any:
        if "per_edge" not in state:
            state["per_edge"] = {e: P.fast_logits(m.bridge, base_tokens, P.prepare(m.bridge, e, base, source,
                                                                                  "resample"), base=base)
                                 for e in edges}
        return state["per_edge"]

    def fast_slow() -> bool:
        return all(_close(per_edge()[e], P.slow_logits(m.bridge, base_tokens, P.prepare(m.bridge, e, base, source,
                                                                                        "resample"), base), tol)
                   for e in edges)

    checks.check("each edge's fast path equals its reference path", fast_slow)

    def metric(logits: Any, pos: Any) -> Any:
        return metrics.per_prompt(logits, pos, answers.repeat(logits.shape[0] // n, 1), "logprob")

    def swept() -> bool:
        got = batched.batched_metrics(m.bridge, edges, base, source, base, positions, metric)
        want = np.stack([metrics.per_prompt(per_edge()[e], positions, answers, "logprob").double().numpy()
                         for e in edges])
        return bool(np.abs(got - want).max() <= tol * 10 * (1.0 + np.abs(want).max()))

    checks.check("the batched sweep equals the per-edge path", swept)

    def graph() -> bool:
        gm = forward.GraphModel.build(m.bridge, base, positions)
        clean = parts.run_writes(m.bridge, base, gm.s, base[names.HOOK_EMBED].dtype)
        rep = parts.run_writes(m.bridge, source, gm.s, base[names.HOOK_EMBED].dtype)
        keep = np.stack([gm.graph.full(), np.zeros_like(gm.graph.adjacency)])

        def rows(logits_at: Any, idx: Any) -> Any:
            k = logits_at.shape[1]
            return metrics.per_prompt(logits_at, torch.arange(k).expand(len(idx), k), answers[idx], "logprob")

        full, empty = gm.circuits(clean, rep, keep, positions, rows)
        m_clean = metrics.per_prompt(base["logits"], positions, answers, "logprob").double().numpy()
        corrupt_logits = hooks.cache_hooks(m.bridge, source_tokens, [])["logits"]
        m_corrupt = metrics.per_prompt(corrupt_logits, positions, answers, "logprob").double().numpy()
        bound = tol * 10 * (1.0 + float(np.abs(m_clean).max()))
        return bool(np.abs(full - m_clean).max() <= bound and np.abs(empty - m_corrupt).max() <= bound)

    checks.check("the edge graph: every edge kept is the clean run, none kept the corrupted one", graph)


# ------------------------------------------------------------------------------------------- claim kinds
def check_claim_kind(kind: Any, claim: dict[str, Any], model_dir: str | Path, *,
                     data: dict[str, Any] | None = None) -> list[str]:
    """Conformance of a claim kind and the view it carries (module docstring): `claim` one claim of the kind
    (its `id` and keys, as a hypothesis file writes it), run on `model_dir` with `data` (default:
    40 repeated-token prompts)."""

    checks = _Checks(f"claim kind {getattr(kind, 'name', kind)!r}")
    checks.check("it is a ClaimKind with a name and a one-line summary",
                 lambda: isinstance(kind, ClaimKind) and bool(kind.name) and bool(kind.summary))
    checks.check("its schema is a ClaimSpec whose kind is Literal[name]",
                 lambda: issubclass(kind.spec, ClaimSpec)
                 and kind.spec.model_fields["kind"].annotation.__args__[0] == kind.name)
    checks.check("its details are a Details record", lambda: issubclass(kind.details, Details))
    checks.check("its evidence type is weights, observational, attribution or causal",
                 lambda: kind.evidence in ("weights", "observational", "attribution", "causal"))
    checks.check("its view is a ClaimView", lambda: isinstance(kind.view, ClaimView))
    if checks.failed:
        return checks.done()
    present = registry.kinds().get(kind.name) is kind

    with _registered(lambda: registry.register(kind), lambda: registry.unregister(kind.name), present):
        _run_checks(checks, kind, claim, Path(model_dir), data)
    return checks.done()


def _run_checks(checks: _Checks, kind: Any, claim: dict[str, Any], model_dir: Path,
                data: dict[str, Any] | None) -> None:
    import json

    doc = {"harness": 1, "name": "conformance", "model": str(model_dir),
           "data": data or {"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 8},
           "stats": {"bootstrap": 500}, "claims": [dict(claim)]}
    state: dict[str, Any] = {}

    def run() -> bool:
        state["ev"] = runner.run(doc, device="cpu", figures=False)
        return len(state["ev"].claims) == 1

    if not checks.check("a file of the claim runs end to end", run):
        return
    result = state["ev"].claims[0]
    checks.check("it ends PASS, FAIL or INCONCLUSIVE with a reason or a value",
                 lambda: str(result.verdict) in ("PASS", "FAIL", "INCONCLUSIVE"))
    checks.check("its details are of the declared type", lambda: isinstance(result.details, kind.details))
    checks.check("its view reads the result: text lines and the claim table's number",
                 lambda: isinstance(kind.view.key_number(result), str)
                 and all(isinstance(line, str) for line in kind.view.lines(result, result.unit)))
    with tempfile.TemporaryDirectory(prefix="harness-conformance-") as tmp:
        def written() -> bool:
            folder = writer.write_report(state["ev"], reports_root=tmp)
            state["folder"] = Path(folder)
            problems = writer.validate_evidence(json.loads((state["folder"] / "evidence.json").read_text()))
            return not problems and str(result.id) in (state["folder"] / "report.md").read_text()

        if checks.check("the report is written and its evidence.json is valid", written):
            checks.check("`harness report` renders it again from evidence.json alone",
                         lambda: writer.rerender(state["folder"] / "evidence.json") is not None)


# ------------------------------------------------------------------------------------------- metrics
def check_metric(metric: Any, *, vocab: int = 50, n: int = 6, k: int = 3, seed: int = 0) -> list[str]:
    """Conformance of a metric (module docstring) on random float64 logits."""
    import torch

    checks = _Checks(f"metric {getattr(metric, 'name', metric)!r}")
    if not checks.check("it is a Metric with a name and a unit",
                        lambda: isinstance(metric, Metric) and bool(metric.name) and bool(metric.unit)):
        return checks.done()
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, vocab, generator=g, dtype=torch.float64)
    answers = torch.randint(0, vocab, (n, k), generator=g)
    wrong = (answers + 1 + torch.randint(0, vocab - 1, (n, k), generator=g)) % vocab
    clean = torch.log_softmax(logits, -1)

    def value(at: Any) -> Any:
        return metric.fn(at, answers, wrong if metric.needs_wrong else None, clean if metric.needs_clean else None)

    checks.check("one finite float64 value per prompt", lambda: (lambda v: tuple(v.shape) == (n,)
                 and v.dtype == torch.float64 and bool(torch.isfinite(v).all()))(value(logits)))

    def oriented() -> bool:
        raised, lowered = logits.clone(), logits.clone()
        raised.scatter_add_(-1, answers[..., None], torch.full((n, k, 1), 5.0, dtype=torch.float64))
        lowered.scatter_add_(-1, answers[..., None], torch.full((n, k, 1), -5.0, dtype=torch.float64))
        if metric.needs_clean:  # against the clean run: the clean logits themselves score highest
            return bool((value(logits) >= value(raised) - 1e-12).all() and (value(logits) >= value(lowered)).all())
        return bool((value(raised) > value(lowered)).all())

    checks.check("higher means more of the clean behaviour (the answer's logit raised scores higher)", oriented)
    if metric.no_information is not None:
        checks.check("its no-information value is a finite number",
                     lambda: math.isfinite(float(metric.no_information(vocab, clean if metric.needs_clean
                                                                       else None))))
    return checks.done()


# ------------------------------------------------------------------------------------------- data sources
def check_data_source(source: Any, data: dict[str, Any], model_dir: str | Path) -> list[str]:
    """Conformance of a data source (module docstring): `data` a `data:` mapping that selects it."""

    checks = _Checks(f"data source {getattr(source, 'key', source)!r}")
    present = sources.kinds().get(source.key) is source
    with _registered(lambda: sources.register(source), lambda: sources.unregister(source.key), present):
        _data_checks(checks, data, Path(model_dir))
    return checks.done()


def _data_checks(checks: _Checks, data: dict[str, Any], model_dir: Path) -> None:


    state: dict[str, Any] = {}
    doc = {"harness": 1, "name": "conformance", "model": str(model_dir), "data": dict(data),
           "stats": {"bootstrap": 300},
           "claims": [{"id": "first-token", "kind": "role", "head": "L0H0", "role": "first_token", "at_least": 0.0}]}

    def build() -> bool:
        h = load_hypothesis(doc)
        m = runner.load_model_cached(str(ModelRef.parse(h.spec.model, h.base_dir).source), "cpu")
        state["ds"], state["m"] = runner.build_dataset(h, m), m
        return True

    if not checks.check("the data mapping validates and the prompts build", build):
        return
    ds, m = state["ds"], state["m"]
    checks.check("clean and corrupted prompts are token ids of one shape",
                 lambda: all(c.shape == ds.clean.shape for c in ds.corruptions.values()) and bool(ds.corruptions))
    checks.check("scored positions lie inside the prompts",
                 lambda: int(ds.positions.min()) >= 0 and int(ds.positions.max()) < ds.clean.shape[1])
    checks.check("answers lie inside the output vocabulary",
                 lambda: int(ds.answers.min()) >= 0 and int(ds.answers.max()) < int(m.d_vocab_out))
    checks.check("each corruption changes some prompt",
                 lambda: all(bool((c != ds.clean).any()) for c in ds.corruptions.values()))
    checks.check("a claim runs on the prompts", lambda: runner.run(doc, device="cpu", figures=False).claims[0]
                 .verdict is not None)
