"""A difference metric's change split into its parts, so that a claim says whether a
component raises the answer or lowers the wrong token (`parts: true` on edge, path and
ablation claims; model.metrics: logit_diff = answer_logit + wrong_logit, prompt by prompt).

Per prompt n, with d_n the claim's change of logit_diff and a_n the same change of
answer_logit (the claim's intervention run once more, scored by the answer's logit):

    answer part  a_n
    wrong part   w_n = d_n - a_n       (the change of wrong_logit = -mean_i logits[w_i])

Each part is reported as a fraction of the claim's gap, sum(a) / sum(g) and sum(w) / sum(g)
over the claim's kept prompts (so the two add up to the claim's normalised effect), with a
BCa interval, and as the mean raw change in logits.  A part is positive where the component
helps the metric through it: a mover raises the answer (answer part > 0), a suppression head
lowers the wrong token (wrong part > 0).  Cost: one more intervention per claim (the wrong part
is the difference), from the same layer as the claim's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..evidence.details import CI, Num, Record, optional
from ..spec.settings import Stats
from . import effects

SPLITS = {"logit_diff": ("answer_logit", "wrong_logit")}  # a metric -> its parts, which add up to it per prompt


class MetricPart(Record):
    """One part of the claim's change (module docstring)."""

    metric: str  # the part's metric (model.metrics)
    change_mean: float  # mean over prompts of the part's change, in the metric's units
    change_ci: CI
    normalized: Num = optional()  # the part's change over the claim's gap (the parts add up to the claim's)
    normalized_ci: CI | None = optional()


def first(metric: str) -> str:
    """The part a claim's intervention is run again with (the last part is the difference)."""
    return SPLITS[metric][0]


def check(claim_id: str, metric: str) -> str | None:
    """Why `parts: true` cannot split this file's metric, or None."""
    if metric in SPLITS:
        return None
    return (f"claim {claim_id!r}: parts: true splits {', '.join(SPLITS)} into its parts "
            f"({', '.join(p for ps in SPLITS.values() for p in ps)}); this file's metric is {metric}")


def split(metric: str, d: np.ndarray, d_first: np.ndarray, gap: np.ndarray, st: Stats, seed: int, unit: str,
          jack: Sequence[np.ndarray] = (), jack_first: Sequence[np.ndarray] = ()) -> list[MetricPart]:
    """The parts of change d (module docstring): d_first is the first part's change, the last part
    d - d_first; `jack`, `jack_first`: the same with each reference group left out of a mean."""
    pieces = [(first(metric), d_first, list(jack_first)),
              (SPLITS[metric][1], d - d_first, [a - b for a, b in zip(jack, jack_first, strict=True)])]
    out = []
    for name, dp, jp in pieces:
        ch = effects.change(dp, st, seed, jp or None)
        iv = effects.normalized_effect(dp, gap, st, seed, unit, jack=jp or None).interval
        out.append(MetricPart(metric=name, change_mean=ch.interval.estimate,
                              change_ci=[ch.interval.low, ch.interval.high],
                              normalized=None if iv is None else iv.estimate,
                              normalized_ci=None if iv is None else [iv.low, iv.high]))
    return out

