"""A data source written outside the harness package, as a plugin would write one
(docs/architecture.md, "Adding a data source"): `reversed_half`, repeated random tokens whose
corruption reverses the first copy.

    clean      [BOS] + S + S
    corrupted  [BOS] + reverse(S) + S     (the earlier copy holds the same tokens, in the wrong order)

scored on the second copy except its last token, each position predicting the next token of S.
A data mapping names it by its key: `data: {reversed_half: 10, n_prompts: 40}` (10: |S|).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from harness.extend import DataSettings, DataSourceKind, LoadedModel, Where, model_bos
from harness.extend import dataset as data


class ReversedHalf(DataSettings):
    reversed_half: int = Field(ge=2, le=100)  # the segment length |S|
    n_prompts: int = Field(40, ge=2, le=10_000)
    seed: int = Field(0, ge=0)
    split: Literal["test", "explore"] = "test"  # its prompts come in two splits: scan and discover read explore

    def corruption_names(self) -> list[str]:
        return ["reversed"]


def build(d: ReversedHalf, where: Where, model: LoadedModel) -> data.Dataset:
    import torch

    g = torch.Generator().manual_seed(2 * d.seed + (d.split == "explore"))
    L, n, bos = d.reversed_half, d.n_prompts, model_bos(model, where.where("data"))
    S = torch.randint(1, model.d_vocab, (n, L), generator=g)
    S = torch.where(S == bos, (S % (model.d_vocab - 1)) + 1, S)  # the start token never inside S
    start = torch.full((n, 1), bos)
    clean = torch.cat([start, S, S], 1)
    corrupted = torch.cat([start, S.flip(1), S], 1)
    positions = torch.arange(L + 1, 2 * L).expand(n, -1).contiguous()
    answers = clean.gather(1, positions + 1)
    return data.Dataset(clean, {"reversed": corrupted}, positions, answers, None,
                        f"reversed_half: {n} prompts [BOS] + S + S, |S| = {L}; corruption reverses the first S",
                        True)


SOURCE = DataSourceKind("reversed_half", ReversedHalf, "'reversed_half' (the toy plugin)", build,
                        lambda d: "the other clean prompts (leave-one-out), per position")


def mapping(**over: Any) -> dict[str, Any]:
    return {"reversed_half": 8, "n_prompts": 40, **over}
