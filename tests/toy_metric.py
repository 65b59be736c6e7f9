"""A metric registered from outside the package (docs/architecture.md, "Adding a metric"):
the margin of the correct token over the best other token, in logits."""

from __future__ import annotations

from typing import Any

from harness.extend import Metric


def margin(at: Any, answers: Any, wrong: Any, clean: Any) -> Any:
    """m_n = mean_i (logits[a_i] - max_{t != a_i} logits[t])."""

    good = at.gather(-1, answers.unsqueeze(-1)).squeeze(-1)
    others = at.scatter(-1, answers.unsqueeze(-1), float("-inf"))
    return (good - others.max(-1).values).mean(-1)


METRIC = Metric("margin", "logits", margin, lambda V, clean: 0.0,
                        "a prediction that ties the correct token with the best other one")
