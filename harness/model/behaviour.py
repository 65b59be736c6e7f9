"""Does the model do the task at all: its accuracy and the answer's rank, before any claim.

At scored position i of prompt n, with a_i the answer, w_i the wrong token and l the logits,

    rank_i    = 1 + #{t : l[t] > l[a_i]}                 (1: the answer is the top token; ties count for it)
    correct_i = l[a_i] > l[w_i]    with a wrong token    (chance 1/2)
              = rank_i == 1        without one (top-1)   (chance 1 / V, V the output vocabulary)

and per prompt

    accuracy_n = mean_i correct_i,    rank_n = median_i rank_i.

Over the prompts: the accuracy is the mean of accuracy_n, with the exact (Clopper-Pearson)
interval where every prompt has one scored position (accuracy_n is then 0 or 1) and the BCa
bootstrap over prompts otherwise (positions of one prompt are not independent draws); the
answer's rank is the median of rank_n with its distribution-free interval (order statistics,
scipy.stats.quantile_test).  A run whose clean accuracy's interval reaches within NEAR_CHANCE of
chance is near chance: no mechanism claim about the task means much there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import stats

if TYPE_CHECKING:
    from jaxtyping import Float
    from torch import Tensor

__all__ = ["per_prompt", "summary", "document", "near_chance", "NEAR_CHANCE", "words", "headline"]

NEAR_CHANCE = 0.1  # an accuracy whose interval reaches chance + this is near chance


def per_prompt(logits_at: Float[Tensor, "n k vocab"], answers: Any, wrong: Any | None) -> Float[Tensor, "n 2"]:
    """[n, 2] float64: accuracy_n and rank_n (module docstring) from the logits at the scored positions;
    `answers` and `wrong` [n, k] tokens, or sets [n, k, S] padded with -1 (the answer's rank is then its
    best member's, and correct means the right set's probability above the wrong set's:
    logsumexp l[A] > logsumexp l[W], which for sets of one is l[a] > l[w])."""
    import torch

    at = logits_at.detach()

    def members(t: Any) -> tuple[Any, Any]:  # [n, k, S] logits of a set's members, -inf at the padding
        t = t.to(at.device)
        t = t if t.dim() == 3 else t.unsqueeze(-1)
        got = at.gather(-1, t.clamp(min=0))
        return torch.where(t >= 0, got, torch.full_like(got, -torch.inf)), t

    right, _ = members(answers)
    best = right.max(-1, keepdim=True).values  # [n, k, 1]
    rank = 1 + (at > best).sum(-1)  # [n, k]
    if wrong is None:
        correct = rank == 1
    else:
        correct = torch.logsumexp(right, -1) > torch.logsumexp(members(wrong)[0], -1)
    return torch.stack([correct.double().mean(-1), rank.double().median(-1).values], -1).cpu()


def summary(rows: np.ndarray, k: int, n_resamples: int, confidence: float, seed: int) -> dict[str, Any]:
    """The accuracy and the answer's median rank over prompts (rows [n, 2] of per_prompt, k scored
    positions a prompt): {"accuracy": {mean, ci}, "median_rank": {median, ci}, "prompts": n}."""
    from scipy.stats import quantile_test

    acc, rank = rows[:, 0], rows[:, 1]
    n = len(acc)
    if k == 1 and n > 0:
        ci: list[float | None] = list(stats.clopper_pearson(int(round(acc.sum())), n, confidence))
    else:
        got = stats.mean_ci(acc, n_resamples, confidence, seed)
        ci = [got.low, got.high]
    median = float(np.median(rank)) if n else float("nan")
    bounds = quantile_test(rank, q=median, p=0.5).confidence_interval(confidence) if n else None
    rank_ci = [float(bounds.low), float(bounds.high)] if bounds is not None else [float("nan")] * 2
    return {"accuracy": {"mean": float(acc.mean()) if n else float("nan"), "ci": ci},
            "median_rank": {"median": median, "ci": rank_ci}, "prompts": n}


def document(rows: dict[str, np.ndarray], k: int, has_wrong: bool, vocab: int, n_resamples: int,
             confidence: float, seed: int, sets: bool = False) -> dict[str, Any]:
    """The behaviour of every run (rows: "clean" and each corruption's name -> per_prompt's [n, 2]):
    {"compared", "chance", "near_chance", "clean": summary, "corrupted": {NAME: summary}}; `sets`: the
    data give sets of answers (chance is then taken as 1/2, a guess between the two sets)."""
    rate = chance(has_wrong, vocab)
    every = {name: summary(r, k, n_resamples, confidence, seed) for name, r in rows.items()}
    clean = every.pop("clean")
    return {"compared": compared(has_wrong, sets), "chance": rate, "near_chance": near_chance(clean, rate),
            "clean": clean, "corrupted": every}


def chance(has_wrong: bool, vocab: int) -> float:
    """The accuracy of a guess: 1/2 between the answer and the wrong token, 1 / vocab for top-1."""
    return 0.5 if has_wrong else 1.0 / vocab


def compared(has_wrong: bool, sets: bool = False) -> str:
    """What accuracy counts, in words."""
    if sets:
        return "right answers' probability above the wrong ones'" if has_wrong else "a right answer top-1"
    return "answer above wrong" if has_wrong else "answer top-1"


def near_chance(clean: dict[str, Any], chance_rate: float) -> bool:
    """Whether the clean accuracy's interval (its mean where the interval is undefined) reaches chance + NEAR_CHANCE."""
    low = clean["accuracy"]["ci"][0]
    low = clean["accuracy"]["mean"] if low is None or not np.isfinite(low) else low
    return bool(low <= chance_rate + NEAR_CHANCE)


def words(doc: dict[str, Any], run: str = "clean", full: bool = True) -> str:
    """One line of `run` ("clean" or a corruption's name) in a behaviour document (engine.measure's
    baseline["behaviour"]): 'accuracy (answer above wrong) 0.97 [0.94, 0.99], chance 0.5; the answer's median
    rank 1 [1, 1]' (without what is compared and chance unless `full`)."""
    got = doc["clean"] if run == "clean" else doc["corrupted"][run]
    a, r = got["accuracy"], got["median_rank"]
    what = f" ({doc['compared']})" if full else ""
    odds = f", chance {doc['chance']:.3g}" if full else ""
    return (f"accuracy{what} {_num(a['mean'])} {_ci(a['ci'])}{odds}; the answer's median rank "
            f"{_num(r['median'])} {_ci(r['ci'])}")


def headline(doc: dict[str, Any], prompts: str = "clean") -> str:
    """'behaviour on the 200 clean prompts: accuracy ...' (words of the clean run), the line every command
    opens with; `prompts` names the prompts (discover's "discovery" and "confirmation")."""
    return f"behaviour on the {doc['clean']['prompts']} {prompts} prompts: {words(doc)}"


def _num(x: float | None) -> str:
    return "undefined" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _ci(ci: list[float | None] | None) -> str:
    return "[undefined]" if ci is None else f"[{_num(ci[0])}, {_num(ci[1])}]"
