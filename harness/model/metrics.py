"""Metrics: what a claim reads from the logits at the scored positions, one value per prompt.

A metric is one registered object (`Metric`): its name, its unit, its per-prompt function,
its no-information baseline (the metric of a prediction that knows nothing) and what data
it needs.  Every metric is oriented so that **higher means more of the clean behaviour**
(the gap m_clean - m_corrupted is then positive wherever the mechanism matters).  Built in,
with p = softmax(logits) at scored position i of prompt n and a_i, w_i its correct and wrong
tokens:

* `logprob`:    m_n = mean_i log p(a_i)                               (nats)
                no information: log(1 / V), V the output vocabulary
* `logit_diff`: m_n = mean_i (logits[a_i] - logits[w_i])              (logits; needs `wrong`)
                no information: 0 (equal correct and wrong logits)
* `answer_logit`: m_n = mean_i logits[a_i]                            (logits)
                and `wrong_logit`: m_n = -mean_i logits[w_i]          (logits; needs `wrong`)
                the two parts of logit_diff (answer_logit + wrong_logit = logit_diff, prompt by
                prompt): an effect on logit_diff is the sum of the effects on its parts, so a head
                that raises the answer (a mover) is told from one that lowers the wrong token (a
                suppressor).  A logit is shift-invariant in the softmax, so a part also carries any
                change every token's logit shares; only their sum is free of it.
                no information: none (a single logit has no baseline)
* `prob`:       m_n = mean_i p(a_i)                                   (probability)
                no information: 1 / V
* `prob_diff`:  m_n = mean_i (sum_{t in A_i} p(t) - sum_{t in W_i} p(t))     (probability; needs `wrong`)
                with A_i, W_i the sets of right and wrong answers where the data give sets (a
                task with more than one right answer: greater-than's every later year), else
                the answer and the wrong token alone (p(a_i) - p(w_i)): the probability mass of
                the right set minus the wrong set's.  The one built-in metric that reads sets
                (`Metric.sets`); the others read one answer token and refuse data with sets.
                no information: none shown ((|A_i| - |W_i|) / V, prompt by prompt)
* `kl`:         m_n = -mean_i KL(p_clean,n,i || p_n,i)
                    = -mean_i sum_t p_clean(t) (log p_clean(t) - log p(t))   (nats; 0 on the clean run)
                the divergence of the next-token distribution from the clean run's, negated so
                that higher is better: the clean run scores 0, a run further from it scores
                lower, and the clean-corrupted gap is KL(p_clean || p_corrupted) > 0, so a
                normalised noising effect is KL(p_clean || p_patched) / KL(p_clean || p_corrupted).
                no information: -mean KL(p_clean || uniform) = -mean (log V - H(p_clean))

Register a metric with `register(Metric(...))` (tests/toy_metric.py registers one from
outside the package).  Values are float64, one per prompt, on the logits' device (the CPU
for MPS logits, which have no float64: devices.wide); the vocabulary-wide float64 work runs
over chunks of prompts (CHUNK_ELEMENTS at a time), so a large vocabulary never holds
n x k x vocab float64 values at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import DataError
from ..registry import Registry
from .devices import wide

__all__ = ["Metric", "register", "unregister", "get", "names", "per_prompt", "at_positions", "columns_metric", "UNITS",
           "METRICS"]

if TYPE_CHECKING:
    from jaxtyping import Float, Int
    from torch import Tensor

CHUNK_ELEMENTS = 2**22  # float64 values of the vocabulary-wide work held at once (32 MiB)


@dataclass(frozen=True)
class Metric:
    """A metric: `fn(at, answers, wrong, clean)` -> [n] float64, with `at` the float64 logits at the
    scored positions [n, k, V], `answers` and `wrong` [n, k] token ids, `clean` the clean run's
    log-probabilities there [n, k, V] (float64; only when `needs_clean`); `no_information(V, clean)`
    the metric of a prediction with no information (V the output vocabulary), or None.  `columns`:
    fn reads the answer's and the wrong token's logits only, so a caller may compute just those
    two columns of the unembedding and call fn(at [n, k, 2], 0, 1, None) (`columns_metric`).  `sets`: fn
    reads sets of answers, `answers` and `wrong` [n, k, S] padded with -1 (data.dataset.Dataset.scored)."""

    name: str
    unit: str
    fn: Callable[[Any, Any, Any, Any], Any]
    no_information: Callable[[int, Any], float] | None
    no_information_text: str  # in words, for reports
    needs_wrong: bool = False
    needs_clean: bool = False
    columns: bool = False
    sets: bool = False


def rows_per_chunk(k: int, vocab: int) -> int:
    """Prompts whose float64 work at k scored positions over `vocab` fits CHUNK_ELEMENTS (at least one)."""
    return max(1, CHUNK_ELEMENTS // max(1, k * vocab))


def columns_metric(names: str | Sequence[str], answers: Any,
                   wrong: Any) -> tuple[Any, Callable[[Any, Any], Any]] | None:
    """For metrics that read two logits only (`Metric.columns`): (tokens [n, k, c], fn) with tokens the
    answer's (and, with `wrong`, the wrong token's) ids at each scored position, and fn(logits of those
    tokens [N, k, c], positions [N, k]) -> the metric [N] float64 (N any multiple of n), or with a list
    of `names` every one of them from the same logits, [N, len(names)]; None where one of them reads
    the whole vocabulary."""
    import torch

    chosen = [get(x) for x in ([names] if isinstance(names, str) else names)]
    if not all(m.columns and not (m.needs_wrong and wrong is None) for m in chosen):
        return None
    tokens = torch.stack([answers] if wrong is None else [answers, wrong], -1)

    def fn(logits: Any, positions: Any) -> Any:
        at, first = wide(logits), torch.zeros_like(positions)
        got = [m.fn(at, first, None if wrong is None else first + 1, None) for m in chosen]
        return got[0] if isinstance(names, str) else torch.stack(got, -1)

    return tokens, fn


def _metric_name(name: str, metric: Metric) -> str | None:
    if name != metric.name:
        return f"registered as {name!r} but called {metric.name!r}"
    if not name or not name.replace("_", "").isalnum():
        return "a metric name is letters, digits and _"
    return None


def register(metric: Metric) -> None:
    """Make a metric available to hypothesis files (`metric: NAME`) and the command line; its name
    must be new (RegistryError otherwise: no metric, a built-in one least of all, is replaced)."""
    _REGISTRY.register(metric.name, metric)


def unregister(name: str) -> None:
    """Remove a registered metric (a plugin's, or a test's); the built-ins stay."""
    _REGISTRY.unregister(name)


def names() -> tuple[str, ...]:
    """The registered metrics' names, built-in first."""
    return _REGISTRY.names()


def get(name: str) -> Metric:
    """The metric called `name`; RegistryError listing the allowed ones if there is none."""
    return _REGISTRY.get(str(name))


def _logprob(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    import torch

    return torch.log_softmax(at, dim=-1).gather(-1, answers.unsqueeze(-1)).squeeze(-1).mean(-1)


def _logit_diff(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    if wrong is None:
        raise DataError("metric logit_diff needs 'wrong' answer tokens in the data")
    good = at.gather(-1, answers.unsqueeze(-1)).squeeze(-1)
    bad = at.gather(-1, wrong.unsqueeze(-1)).squeeze(-1)
    return (good - bad).mean(-1)


def _answer_logit(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    return at.gather(-1, answers.unsqueeze(-1)).squeeze(-1).mean(-1)


def _wrong_logit(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    if wrong is None:
        raise DataError("metric wrong_logit needs 'wrong' answer tokens in the data")
    return -at.gather(-1, wrong.unsqueeze(-1)).squeeze(-1).mean(-1)


def _prob(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    import torch

    return torch.softmax(at, dim=-1).gather(-1, answers.unsqueeze(-1)).squeeze(-1).mean(-1)


def _mass(p: Any, tokens: Any) -> Any:
    """sum_{t in the set} p[..., t] for sets [n, k, S] padded with -1: [n, k]."""
    return (p.gather(-1, tokens.clamp(min=0)) * (tokens >= 0)).sum(-1)


def _prob_diff(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    import torch

    if wrong is None:
        raise DataError("metric prob_diff needs 'wrong' answers in the data")
    p = torch.softmax(at, dim=-1)
    return (_mass(p, answers) - _mass(p, wrong)).mean(-1)


def _kl(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    import torch

    logp = torch.log_softmax(at, dim=-1)
    kl = (clean.exp() * (clean - logp)).sum(-1)  # [n, k]
    return -kl.mean(-1)


def _kl_none(V: int, clean: Any) -> float:
    """-mean KL(p_clean || uniform) = -mean (log V - H(p_clean)), in chunks of prompts (float64)."""
    n, k = clean.shape[0], clean.shape[1]
    size = rows_per_chunk(k, clean.shape[-1])
    total = 0.0
    for i in range(0, n, size):
        part = wide(clean[i:i + size])
        total += float((-(part.exp() * part).sum(-1)).sum())
    return float(-(math.log(V) - total / (n * k)))


_BUILTIN = (
    Metric("logprob", "nats", _logprob, lambda V, clean: -math.log(V), "a uniform guess over the vocabulary"),
    Metric("logit_diff", "logits", _logit_diff, lambda V, clean: 0.0, "equal correct and wrong logits",
           needs_wrong=True, columns=True),
    Metric("prob", "probability", _prob, lambda V, clean: 1.0 / V, "a uniform guess over the vocabulary"),
    Metric("kl", "nats (-KL from the clean run)", _kl, _kl_none,
           "a uniform guess: minus the divergence of the clean distribution from uniform", needs_clean=True),
    Metric("answer_logit", "logits", _answer_logit, None, "none (a single logit has no baseline)", columns=True),
    Metric("wrong_logit", "logits (minus the wrong token's)", _wrong_logit, None,
           "none (a single logit has no baseline)", needs_wrong=True, columns=True),
    Metric("prob_diff", "probability", _prob_diff, None,
           "none shown ((|right| - |wrong|) / V for a uniform guess, prompt by prompt)", needs_wrong=True, sets=True),
)
_REGISTRY: Registry[Metric] = Registry("metric", {m.name: m for m in _BUILTIN}, _metric_name)

UNITS = {m.name: m.unit for m in _REGISTRY}  # the built-ins' units (get(name).unit for any)
METRICS = names()  # the built-ins (names() for every registered one)


def clean_logp(logits_at: Float[Tensor, "n k vocab"]) -> Any:
    """The clean run's log-probabilities at the scored positions (float32, for `needs_clean` metrics)."""
    import torch

    return torch.log_softmax(logits_at.float(), dim=-1)


def at_positions(logits: Float[Tensor, "n pos vocab"], positions: Int[Tensor, "n k"]) -> Any:
    """logits[i, positions[i, j]] for every prompt i and scored position j: [n, k, vocab] (a row
    copy per position, on the logits' device)."""
    import torch

    rows = torch.arange(positions.shape[0], device=logits.device).unsqueeze(-1)
    return logits[rows, positions.to(logits.device)]


def per_prompt(logits: Float[Tensor, "n pos vocab"], positions: Int[Tensor, "n k"] | None, answers: Int[Tensor, "n k"],
               metric: str, wrong: Int[Tensor, "n k"] | None = None,
               clean: Any = None) -> Float[Tensor, " n"]:
    """logits [n, seq, vocab] -> metric per prompt [n] (float64), read at `positions` [n, k] (None:
    `logits` are already those at the scored positions, [n, k, vocab]), in chunks of prompts of at
    most CHUNK_ELEMENTS float64 values; `clean`: the clean run's log-probabilities at the scored
    positions [n, k, vocab] (clean_logp; metrics that compare with the clean run)."""
    import torch

    m = get(metric)
    if m.needs_clean and clean is None:
        raise DataError(f"metric {metric} compares with the clean run: its log-probabilities are needed")
    n, k = answers.shape[:2]
    vocab = logits.shape[-1]
    size = rows_per_chunk(k, vocab)
    if n > size:
        parts = [per_prompt(logits[i:i + size], None if positions is None else positions[i:i + size],
                            answers[i:i + size], metric, None if wrong is None else wrong[i:i + size],
                            None if clean is None else clean[i:i + size])
                 for i in range(0, n, size)]
        return torch.cat(parts)
    at = wide(logits if positions is None else at_positions(logits, positions))  # [n, k, vocab]
    answers = answers.to(at.device)
    wrong = None if wrong is None else wrong.to(at.device)
    ref = None if clean is None else wide(clean).to(at.device)
    return cast("Tensor", m.fn(at, answers, wrong, ref))


def default_for(ds: Any) -> str:
    """The metric a command uses when none is named: prob_diff where the data give sets of answers,
    logit_diff where they give wrong tokens, else logprob."""
    if ds.answer_sets is not None and ds.wrong is not None:
        return "prob_diff"
    return "logit_diff" if ds.wrong is not None else "logprob"


def fits_problem(metric: str, ds: Any) -> str | None:
    """Why `metric` cannot score `ds` (None when it can): it needs wrong tokens the data lack, or it
    reads one answer token where the data give sets of answers."""
    m = get(metric)
    if m.needs_wrong and ds.wrong is None:
        return f"metric {metric} needs 'wrong' answer tokens in the data"
    if ds.answer_sets is not None and not m.sets:
        return (f"metric {metric} reads one answer token; the data give sets of answers: use a metric that reads "
                "sets (prob_diff)")
    return None


def no_information(metric: str, d_vocab_out: int, clean: Any = None) -> float | None:
    """The metric of a prediction with no information (the registered baseline), or None."""
    m = get(metric)
    if m.no_information is None:
        return None
    return m.no_information(d_vocab_out, clean)
