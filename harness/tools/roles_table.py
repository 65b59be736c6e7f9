"""`harness roles`: every head's attention-role scores, for choosing a hypothesis.

For each head and role (mech.roles), the mean over prompts of the per-prompt
role score on the clean prompts: generated repeated-token prompts (the `explore`
split by default, so the `test` split stays held out for hypotheses), or the
prompts of a data file (`--data`, engine.data_source.from_data_file)."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ..engine.data_source import DataSource, DataSpec, build_dataset
from ..mech import roles
from ..model import data
from ..model.devices import of
from ..model.loading import LoadedModel
from ..model.tokenizer import start_token
from ..spec import names
from ..spec.names import hook_pattern


def role_table(m: LoadedModel, *, n_prompts: int, segment_length: int, seed: int, split: str, distinct: bool = False,
               given: tuple[DataSpec, DataSource] | None = None) -> str:
    """The printable table (with the data's description above it): on the generator's
    prompts (`distinct`: its distinct-token option), or on `given` data (a data mapping and
    where it came from) instead."""
    import torch

    ds = (build_dataset(*given, m) if given is not None else
          _generated(m, n_prompts, segment_length, seed, split, distinct))
    ds = ds.to(of(m.bridge))
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(ds.clean, names_filter=lambda n: n.endswith("hook_pattern"))
    rows: list[list[Any]] = []
    for h in names.Head.every(m.n_layers, m.n_heads):
        pat = cache[hook_pattern(h.layer)][:, h.head]
        rows.append([str(h)] + [float(torch.nanmean(roles.role_scores(pat, ds.clean, r))) for r in roles.ROLES])
    return f"{ds.description}\n\n" + tabulate(rows, headers=["head", *roles.ROLES], floatfmt=".3f")


def _generated(m: LoadedModel, n_prompts: int, segment_length: int, seed: int, split: str,
               distinct: bool) -> data.Dataset:
    """The generator's prompts with the start token every command uses (model.tokenizer.start_token)."""
    token = start_token(m, None, "harness roles")
    return data.repeated_tokens(n_prompts, segment_length, m.d_vocab, seed=seed, split=split, n_ctx=m.n_ctx,
                                distinct=distinct, bos=token is not None, bos_token=token or 0)
