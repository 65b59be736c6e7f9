"""Attention-role scores (Olsson et al. 2022), defined from the tokens alone
so they apply to any data.  For a prompt with attention pattern A[q, k]
(rows sum to 1) and a 0/1 target mask M[q, k]:

    score = (1 / |Q|) * sum_{q in Q} sum_k A[q, k] * M[q, k]

where Q is the set of queries that have at least one target.

* previous_token:  M[q, q-1] = 1 for q >= 1
* first_token:     M[q, 0]   = 1 for q >= 1
* duplicate_token: M[q, j]   = 1 for j < q with tok[j] == tok[q]
* induction (prefix matching): M[q, j+1] = 1 for j <= q-2 with tok[j] == tok[q]
  (attention to the token *after* an earlier occurrence of the current token)

A prompt with no qualifying query has an undefined score (NaN here; excluded
and counted by the caller).  Masks are built on the tokens' device; scores are
float64 on the pattern's device (the CPU for MPS patterns: devices.wide).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model.devices import wide
from ..spec.vocabulary import ATTENTION_ROLES as ROLES

__all__ = ["ROLES", "role_scores", "target_mask"]

if TYPE_CHECKING:
    from jaxtyping import Float, Int
    from torch import Tensor


def target_mask(tokens: Int[Tensor, "n pos"], role: str) -> Float[Tensor, "n query key"]:
    """0/1 mask [n, seq, seq] (query, key) of what the role attends to (float64,
    on the tokens' device; an MPS caller passes CPU tokens)."""
    import torch

    n, s = tokens.shape
    q = torch.arange(s, device=tokens.device).view(s, 1)
    k = torch.arange(s, device=tokens.device).view(1, s)
    if role == "previous_token":
        m = (k == q - 1).expand(n, s, s)
    elif role == "first_token":
        m = ((k == 0) & (q >= 1)).expand(n, s, s)
    else:
        same = tokens.unsqueeze(2) == tokens.unsqueeze(1)  # same[n, q, j]
        if role == "duplicate_token":
            m = same & (k < q)
        elif role == "induction":
            earlier = same & (k <= q - 2)  # j with tok[j] == tok[q], j <= q-2
            m = torch.zeros(n, s, s, dtype=torch.bool, device=tokens.device)
            m[:, :, 1:] = earlier[:, :, :-1]  # shift key j -> j+1
        else:
            raise ValueError(f"unknown role {role!r}; allowed: {', '.join(ROLES)}")
    return m.to(torch.float64)


def role_scores(pattern: Float[Tensor, "n query key"], tokens: Int[Tensor, "n pos"], role: str) -> Float[Tensor, " n"]:
    """Per-prompt role score for one head: pattern [n, q, k] -> [n] float64 (NaN if undefined)."""
    import torch

    pattern = wide(pattern)
    m = target_mask(tokens.to(pattern.device), role)
    qualifies = m.sum(-1) > 0  # [n, q]
    hit = (pattern * m).sum(-1)  # [n, q]
    count = qualifies.sum(-1)
    total = (hit * qualifies).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))
