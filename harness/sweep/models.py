"""The models of a sweep: expanding `--models` arguments, reading checkpoint
metadata, ordering along training.

A `--models` argument is a model directory (it holds `config.json`), a folder
of model directories (each sub-folder holding `config.json`; e.g. a training
run's checkpoints), or `hf:NAME`.  Paths are checked to exist before any job
starts; whether a directory actually loads is decided by its job, so one bad
checkpoint fails one job, not the sweep.

A model directory may hold `checkpoint.json` (docs/model-format.md):

    {"step": 850, "seed": 0, "run": "induction-2l", ...}

`step` (integer >= 0) places the model on the x axis of the sweep's plots;
`run` and `seed` name its series (one line per (run, seed)).  Other keys are
kept but not used.  Models are ordered series by series (first appearance),
by step within a series; models without `checkpoint.json` keep their order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UserError
from ..model.files import list_dir, read_json
from ..model.ref import ModelRef

CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True)
class SweepModel:
    label: str  # unique, short: the directory name (with parents when names repeat)
    source: str  # absolute directory path or hf:NAME
    step: int | None = None
    seed: int | None = None
    run: str | None = None

    @property
    def series(self) -> str:
        """The name of this model's line in plots: run and seed, or '' when unknown."""
        parts = [self.run or "", f"seed {self.seed}" if self.seed is not None else ""]
        return " ".join(p for p in parts if p)

    def to_dict(self) -> dict:
        return asdict(self)


def read_checkpoint(folder: Path) -> dict:
    """The validated contents of `folder/checkpoint.json` ({} when absent): `step` an
    int >= 0, `seed` an int or None, `run` a str or None.  A file that cannot be read,
    is not UTF-8 JSON or breaks these rules is a UserError naming the file."""
    f = folder / CHECKPOINT_FILE
    if not f.is_file():
        return {}
    meta = read_json(f, UserError)  # unreadable, not UTF-8, not JSON: one line naming the file
    if not isinstance(meta, dict):
        raise UserError(f"{f}: expected a JSON object with 'step' (and optionally 'seed', 'run')")
    step, seed, run = meta.get("step"), meta.get("seed"), meta.get("run")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise UserError(f"{f}: step: must be an integer >= 0 (the number of optimizer steps), "
                        f"got {step!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise UserError(f"{f}: seed: must be an integer, got {seed!r}")
    if run is not None and not isinstance(run, str):
        raise UserError(f"{f}: run: must be a string, got {run!r}")
    return {"step": step, "seed": seed, "run": run}


def expand(arguments: list[str]) -> list[SweepModel]:
    """The models named by `--models` arguments, ordered and labelled."""
    found: list[tuple[str, dict]] = []
    for arg in arguments:
        ref = ModelRef.parse(arg)
        if ref.is_named:  # hf:ORG/NAME, ORG/NAME that is no directory here, or a registered source PREFIX:NAME
            found.append((ref.source, {}))
            continue
        path = Path(arg)
        if not path.exists():
            raise UserError(f"--models {arg}: no such directory")
        if not path.is_dir():
            raise UserError(f"--models {arg}: not a directory (give a model directory, a folder of "
                            "model directories, or a hub model ORG/NAME)")
        if (path / "config.json").exists():
            found.append((str(path.resolve()), read_checkpoint(path)))
            continue
        subs = [p for p in list_dir(path, UserError) if p.is_dir() and (p / "config.json").exists()]
        if not subs:
            raise UserError(f"--models {arg}: neither a model directory (no config.json) nor a "
                            "folder of model directories")
        found += [(str(p.resolve()), read_checkpoint(p)) for p in subs]
    seen: set[str] = set()
    unique = []
    for source, meta in found:
        if source not in seen:
            seen.add(source)
            unique.append((source, meta))
    labels = _labels([s for s, _ in unique])
    models = [SweepModel(labels[s], s, m.get("step"), m.get("seed"), m.get("run")) for s, m in unique]
    order: dict[str, int] = {}
    for m in models:
        order.setdefault(m.series, len(order))
    ranked = sorted(enumerate(models), key=lambda im: (order[im[1].series],
                                                       im[1].step if im[1].step is not None else -1, im[0]))
    return [m for _, m in ranked]


def _labels(sources: list[str]) -> dict[str, str]:
    """Shortest unique path suffix of each source (names, hf: or a registered source's, as given)."""
    parts = {s: ([s] if ModelRef.parse(s).is_named else list(Path(s).parts)) for s in sources}
    depth = dict.fromkeys(sources, 1)
    while True:
        label = {s: "/".join(parts[s][-depth[s]:]) for s in sources}
        clash = {s for s in sources if list(label.values()).count(label[s]) > 1
                 and depth[s] < len(parts[s])}
        if not clash:
            return label
        for s in clash:
            depth[s] += 1
