"""The reference mean's delete-a-group jackknife replicates, at the cost of one to two more
partial forwards.

A mean ablation or mean replacement substitutes a mean over reference prompts, itself an
estimate; claims.effects carries its uncertainty into intervals from the claim's number
recomputed with each of the K reference groups left out of the mean (theta_k).  Recomputing
on all n prompts costs K more interventions.  The replicates are instead measured on the
first J prompts, J = min(n, max(MIN_PROMPTS, ceil(n / K))), and carried to the rest:

    m^(k)_i = m_i + (s^(k)_i - s_i)               for i < J
    m^(k)_i = m_i + mean_{j<J} (s^(k)_j - s_j)     for i >= J

with m_i the per-prompt measurement on all prompts, s_i the same on the first J prompts
(equal to m_i up to float32 batch noise, which the difference cancels) and s^(k)_i with group
k left out of the mean.  The cost is (K + 1) J / n interventions beyond the claim's own
one instead of K more: with K = 10, one to two partial forwards at any n >= 100.  The change
a group's removal makes is smooth in the mean and alike across prompts, so J prompts estimate
it; an error in it only adds variance to the jackknife's variance, which widens the interval
(coverage: tests/test_coverage.py).  With n <= MIN_PROMPTS every prompt is measured (J = n).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .cached import Runs

MIN_PROMPTS = 20  # prompts the replicates are measured on, at least


def n_prompts(n: int, groups: int) -> int:
    """J: how many of the first prompts the replicates are measured on."""
    return min(n, max(MIN_PROMPTS, -(-n // groups)))


#: (runs, drops) -> the per-prompt measurement [..., n] with each drop's group left out of the mean
#: (None: none left out), one array per drop
Measure = Callable[[Runs, Sequence[int | None]], list[np.ndarray]]


def replicates(runs: Runs, measure: Measure, full: np.ndarray) -> list[np.ndarray]:
    """[theta^(k) per prompt for k in 0..K-1]: `measure` with each reference group left out,
    measured on the first J prompts and carried to the rest (module docstring); `full` is m, the
    measurement on all prompts with nothing left out, which the caller has already made."""
    groups = runs.reference.groups
    n = runs.ds.n
    j = n_prompts(n, groups)
    drops = list(range(groups))
    if j >= n:
        return measure(runs, drops)
    sub, *dropped = measure(runs.prompts(0, j), [None, *drops])
    out = []
    for got in dropped:
        shift = got - sub
        rest = np.broadcast_to(shift.mean(-1, keepdims=True), (*shift.shape[:-1], n - j))
        out.append(full + np.concatenate([shift, rest], axis=-1))
    return out
