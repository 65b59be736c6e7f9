"""What `harness discover` runs on (tools.discover): its options, the model and prompts a source
names (a hypothesis file, a data file with its model, or a model with the generator's prompts or
--data), and the seeded split of the prompts into discovery and confirmation parts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..claims.circuit_spec import CircuitClaim
from ..engine.data_source import for_exploring, from_data_file
from ..errors import UserError
from ..hypothesis.loading import load, load_data_file
from ..model import metrics
from ..model.loaded import LoadedModel
from ..model.ref import ModelRef, load_model
from ..spec.settings import Stats
from ..streams import Stream, derive_seed
from .scan import ScanSettings, explore_dataset, held_out_mapping

METHODS = ("eap-ig", "eap", "exact")
RANKS = ("abs", "positions")

@dataclass(frozen=True, kw_only=True)
class DiscoverSettings:
    """`harness discover`'s options."""

    method: str = "eap-ig"
    steps: int = 5  # EAP-IG's points
    rank: str = "abs"
    confirm_fraction: float = 0.5
    top: int = 50  # edges patched exactly on the confirmation prompts
    bound: float = 0.8  # the faithfulness the starter circuit's interval must clear
    n_prompts: int = 200  # the generator's, for a model without --data
    segment_length: int = 20
    corruption: str | None = None  # None: the data's default
    metric: str | None = None  # None: the hypothesis file's, else logprob
    seed: int = 0
    bootstrap: int = 1000
    learn: int = 0  # steps of the learned edge mask (mech.graph.learn); 0: no learned ranking
    refine: int = 0  # proposals of the starter's greedy refinement (mech.graph.prune); 0: none

    def check(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"--method {self.method}: allowed: {', '.join(METHODS)}")
        if self.rank not in RANKS:
            raise UserError(f"--rank {self.rank}: allowed: {', '.join(RANKS)}")
        if not 0.0 < self.confirm_fraction < 1.0:
            raise UserError(f"--confirm-fraction {self.confirm_fraction:g}: allowed: a fraction in (0, 1)")
        if self.steps < 1 or self.top < 1 or self.n_prompts < 4:
            raise UserError("--steps and --top must be at least 1, --n-prompts at least 4")
        if self.learn < 0:
            raise UserError(f"--learn {self.learn}: allowed: 0 (no learned mask) or a number of steps")
        if self.refine < 0:
            raise UserError(f"--refine {self.refine}: allowed: 0 (no refinement) or a number of proposals")


@dataclass(frozen=True)
class Inputs:
    """What discovery runs on: the model, the prompts, the metric, the starter's data mapping and
    the known circuit (a hypothesis file's circuit claim: its first edge circuit, else its first
    node circuit)."""

    model: LoadedModel
    dataset: Any
    metric: str
    mapping: dict[str, Any]
    known: CircuitClaim | None
    thresholds: Stats | None = None  # a hypothesis file's stats (its gaps and levels), else the defaults


def inputs(source: str, cfg: DiscoverSettings, data_file: Path | None, device: str) -> Inputs:
    """The model and prompts `source` names: a hypothesis file (its model, its data on the explore
    split, its metric; --data replaces the data), a data file without claims (the same from its
    `model`, `data` and `metric`) or a model (the generator's explore prompts, or --data)."""
    given = from_data_file(data_file, "explore") if data_file is not None else None  # a bad file stops before loading
    path = Path(source)
    known = None
    metric = cfg.metric
    thresholds = None
    data_only = load_data_file(path) if path.suffix.lower() in (".yaml", ".yml") else None
    if data_only is not None and not data_only.claims:  # a data file that names its model: no known circuit
        if data_only.model is None:
            raise UserError(f"{path}: a file without claims names the model to discover on (model: PATH), or give "
                            f"the model: harness discover MODEL --data {path}")
        m = ModelRef.parse(data_only.model, Path(data_only.base_dir)).load(device)
        given = given or (for_exploring(data_only.data, "explore"), data_only)
        metric = metric or data_only.metric
    elif data_only is not None:
        h = load(path)
        thresholds = h.spec.stats
        m = ModelRef.parse(h.spec.model, h.base_dir).load(device)
        if given is None:
            given = (for_exploring(h.spec.data, "explore"), h)
        circuits = [c for c in h.spec.claims if isinstance(c, CircuitClaim)]
        known = next((c for c in circuits if c.edges), next(iter(circuits), None))
        metric = metric or h.spec.metric
    else:
        m = load_model(source, device=device)
    chosen = (cfg.corruption,) if cfg.corruption else None
    ds, corruptions = explore_dataset(m, ScanSettings(n_prompts=cfg.n_prompts, segment_length=cfg.segment_length,
                                                      seed=cfg.seed, corruptions=chosen), given,
                                      "harness discover")
    metric = metric or ("prob_diff" if metrics.default_for(ds) == "prob_diff" else "logprob")
    if given is None:
        mapping: dict[str, Any] = {"generator": "repeated_tokens", "n_prompts": cfg.n_prompts,
                                   "segment_length": cfg.segment_length, "split": "test",
                                   "corruptions": corruptions}
    else:
        mapping = held_out_mapping(*given)
    ds = ds.keep_corruptions(corruptions[:1])
    return Inputs(m, ds, metric, mapping, known, thresholds)


def split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(discovery indices, confirmation indices): a seeded permutation of the n prompts, its last
    round(fraction x n) confirming (each part at least 2 prompts)."""
    if n < 4:
        raise UserError(f"{n} prompts: discovery and confirmation need at least 2 each")
    order = np.random.default_rng(derive_seed(seed, Stream.DISCOVER)).permutation(n).tolist()
    n_conf = min(n - 2, max(2, round(fraction * n)))
    return sorted(order[:n - n_conf]), sorted(order[n - n_conf:])
