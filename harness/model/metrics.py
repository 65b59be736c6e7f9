"""Per-prompt metrics read from logits at the scored positions.

* `logprob`:    m_n = mean_i log softmax(logits[n, p_i])[answer_i]   (nats; higher is better)
* `logit_diff`: m_n = mean_i (logits[n, p_i, answer_i] - logits[n, p_i, wrong_i])

Both are oriented so that higher means "more of the clean behaviour".
Values are returned in float64, one per prompt, on the logits' device (on the
CPU for MPS logits, which have no float64: devices.wide); positions, answers and
wrong tokens are moved to the logits' device first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DataError
from ..spec.vocabulary import METRICS, UNITS
from .devices import wide

__all__ = ["METRICS", "UNITS", "per_prompt"]

if TYPE_CHECKING:
    from jaxtyping import Float, Int
    from torch import Tensor


CHUNK_ELEMENTS = 2**22  # float64 values of the vocabulary-wide work held at once (32 MiB)


def per_prompt(logits: Float[Tensor, "n pos vocab"], positions: Int[Tensor, "n k"], answers: Int[Tensor, "n k"],
               metric: str, wrong: Int[Tensor, "n k"] | None = None) -> Float[Tensor, " n"]:
    """logits [n, seq, vocab] -> metric per prompt [n] (float64).  The float64 log-softmax runs over
    chunks of prompts (CHUNK_ELEMENTS at a time), so a large vocabulary never holds n x k x vocab
    float64 values at once."""
    import torch

    if metric not in METRICS:
        raise DataError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    n, k = positions.shape
    vocab = logits.shape[-1]
    size = max(1, CHUNK_ELEMENTS // max(1, k * vocab))
    if n > size:
        parts = [per_prompt(logits[i:i + size], positions[i:i + size], answers[i:i + size], metric,
                            None if wrong is None else wrong[i:i + size]) for i in range(0, n, size)]
        return torch.cat(parts)
    idx = positions.to(logits.device).unsqueeze(-1).expand(-1, -1, vocab)
    at = wide(logits.gather(1, idx))  # [n, k, vocab]
    answers = answers.to(at.device)
    wrong = None if wrong is None else wrong.to(at.device)
    if metric == "logprob":
        lp = torch.log_softmax(at, dim=-1)
        return lp.gather(-1, answers.unsqueeze(-1)).squeeze(-1).mean(-1)
    if metric == "logit_diff":
        if wrong is None:
            raise DataError("metric logit_diff needs 'wrong' answer tokens in the data")
        good = at.gather(-1, answers.unsqueeze(-1)).squeeze(-1)
        bad = at.gather(-1, wrong.unsqueeze(-1)).squeeze(-1)
        return (good - bad).mean(-1)
    raise DataError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
