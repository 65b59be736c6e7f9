"""The `harness` command's arguments: one parser with a subcommand per command, every option's
type, range and help (`parser()`), checked by argparse before anything runs.
Imports: what the options' choices come from (metrics, vocabularies, executors, methods).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from . import __version__
from .data.settings import MAX_PROMPTS
from .mech.weights.table import MAX_DRAWS
from .model import metrics
from .spec.vocabulary import WEIGHT_PROCESSING, Direction
from .sweep.executors import EXECUTORS
from .tools.discover_inputs import METHODS as DISCOVER_METHODS
from .tools.discover_inputs import RANKS
from .tools.weights_table import FULL_MAX_HEADS, TOP

DEVICE_HELP = "cpu, cuda, cuda:N or mps; default: best available, or $HARNESS_DEVICE"
DATA_HELP = ("prompts instead of the generator: a JSONL prompt file (token ids or text), or a YAML data file "
             "(.yaml/.yml) whose 'data:' mapping is written as in a hypothesis file (a hypothesis file serves too)")
DISTINCT_HELP = ("generator: no token twice inside a segment, and corrupted segments differ from the clean one at "
                 "every position")


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (a usage error, exit 2, otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value} must be at least {lo}" if hi is None
                                             else f"{value} must be between {lo} and {hi:,}")
        return value
    parse.__name__ = "integer"
    return parse


def _layer_range(text: str) -> tuple[int, int]:
    """An argparse type: blocks A..B written `A-B` (or one block `A`), 0 <= A <= B."""
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not A-B (two block numbers) or one block number") from None
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"{text!r}: blocks A-B need 0 <= A <= B")
    return a, b


_layer_range.__name__ = "layer range"
SEED = _int_in(0)
PROMPTS = _int_in(2, MAX_PROMPTS)
SEGMENT = _int_in(2)
THREADS = _int_in(1)


def version() -> str:
    """The installed package's version (importlib.metadata), else harness.__version__."""
    try:
        return metadata.version("harness")
    except metadata.PackageNotFoundError:
        return __version__


def _add_device(p: argparse.ArgumentParser) -> None:
    """--device and --threads for every command that loads or builds a model (checked before any load)."""
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--threads", type=THREADS, default=None,
                   help="torch threads (sets $HARNESS_THREADS; default: 1 for models with d_model < 512, else "
                        "the cores this process may use); small linear algebra always runs on one")


def _add_data_set(p: argparse.ArgumentParser, n_prompts: int, metric_help: str, corruption_help: str) -> None:
    """The model and the prompts of a command that reads a data set (roles, patch): the generator's
    options, --data, --metric and --corruption."""
    p.add_argument("model", help="model directory, or hf:NAME")
    p.add_argument("--n-prompts", type=PROMPTS, default=n_prompts)
    p.add_argument("--segment-length", type=SEGMENT, default=20)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--split", choices=("explore", "test"), default=None,
                   help="prompt split of the generator or a template (default explore, or the data file's own "
                        "split when it sets one: keep the test split for hypotheses)")
    p.add_argument("--data", type=Path, metavar="FILE", help=DATA_HELP)
    p.add_argument("--distinct", action="store_true", help=DISTINCT_HELP)
    p.add_argument("--metric", choices=metrics.names(),
                   help=f"{metric_help} (default prob_diff where the data give sets of answers, logit_diff where "
                        "they give wrong tokens, else logprob)")
    p.add_argument("--corruption", metavar="NAME", help=f"{corruption_help} (default: the data's first)")


def parser() -> argparse.ArgumentParser:
    """Every command's options (a registered metric is one of `--metric`'s choices: load plugins first)."""
    p = argparse.ArgumentParser(
        prog="harness",
        description="Causal intervention testing harness for transformer mechanisms.")
    p.add_argument("--version", action="version", version=f"harness {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check hypothesis files against the schema, and their names against a "
                       "local model's config.json (fast, no torch)")
    v.add_argument("files", nargs="+", type=Path, metavar="FILE")

    r = sub.add_parser("run", help="run hypothesis files and write evidence reports")
    r.add_argument("files", nargs="+", type=Path, metavar="FILE")
    r.add_argument("--out", type=Path, help="report folder (one file only; must not exist)")
    r.add_argument("--reports", type=Path, default=Path("reports"),
                   help="parent folder of new report folders (default: reports/)")
    r.add_argument("--seed", type=SEED, help="override the files' seed (>= 0)")
    r.add_argument("--memory", metavar="SIZE",
                   help="memory budget, e.g. 3G or 512M (sets $HARNESS_MEMORY; default: half the memory available, "
                        "on CUDA the host's or the GPU's, whichever is smaller): "
                        "base runs whose cached activations would not fit stop with one line before measuring, "
                        "and every chunked stage keeps its working memory within an eighth of it (on a CUDA device, "
                        "takes that eighth: fewer, larger batches)")
    _add_device(r)

    sw = sub.add_parser("sweep", help="run hypothesis files on many models (checkpoints, seeds); one combined report")
    sw.add_argument("files", nargs="*", type=Path, metavar="FILE")
    sw.add_argument("--models", nargs="+", metavar="MODEL",
                    help="model directories, folders of model directories (e.g. checkpoints), or hf:NAME")
    sw.add_argument("--resume", type=Path, metavar="FOLDER",
                    help="run the unfinished jobs of this sweep folder (its files, models, seed and device are "
                         "the ones it started with), then write its combined report")
    sw.add_argument("--out", type=Path, help="combined report folder (must not exist)")
    sw.add_argument("--reports", type=Path, default=Path("reports"),
                    help="parent folder of the new report folder (default: reports/)")
    sw.add_argument("--seed", type=SEED, help="override the files' seed (>= 0)")
    sw.add_argument("--executor", choices=EXECUTORS, default="inprocess",
                    help="where jobs run (default inprocess; ray needs the harness[ray] extra)")
    sw.add_argument("--ray-address", help="join this Ray cluster (default: start a local instance)")
    _add_device(sw)

    rp = sub.add_parser("report", help="re-render report.md/report.html/figures from evidence.json alone "
                        "(or a sweep report from sweep.json, a discovery report from discovery.json)")
    rp.add_argument("evidence", type=Path, metavar="EVIDENCE.json",
                    help="an evidence.json, a sweep.json, a discovery.json, or an unfinished sweep folder (its report "
                         "so far)")
    rp.add_argument("--out", type=Path, help="write into this new folder instead of beside the JSON")

    w = sub.add_parser("weights", help="composition-score matrices of a model, with the rotation null",
                       description="Composition-score matrices of a model, with the rotation null. Computed from "
                                   "the weights alone: it runs no prompts, so it takes no --data.")
    w.add_argument("model", help="model directory, or hf:NAME")
    w.add_argument("--processing", choices=WEIGHT_PROCESSING, default="folded",
                   help="weight processing (default folded: LayerNorm folded, writers centred)")
    w.add_argument("--draws", type=int, default=1000, help="null draws per pair (default 1000)")
    w.add_argument("--max-draws", type=int, default=MAX_DRAWS,
                   help=f"at most this many null draws for a pair with p < alpha (default {MAX_DRAWS:,})")
    w.add_argument("--alpha", type=float, default=0.01,
                   help="BH-adjusted significance level over all pairs of a mode (default 0.01)")
    w.add_argument("--seed", type=SEED, default=0)
    w.add_argument("--top", type=_int_in(1), default=TOP, help=f"pairs per mode to list, by score (default {TOP})")
    w.add_argument("--full", action="store_true",
                   help=f"print every pair's score as well (the default for models of at most {FULL_MAX_HEADS} "
                        "heads in all)")
    w.add_argument("--out", type=Path, metavar="FOLDER",
                   help="new folder for composition.csv, composition.json and composition.png (must not exist)")
    _add_device(w)

    ex = sub.add_parser("explain", help="what flows through one composition route: singular directions, principal "
                        "angles, token readouts, against the rotation null",
                        description="What flows through a head -> head-input route (weights only): C² split over "
                                    "the singular directions of the product of the sender's OV and the receiver's "
                                    "input matrix, each share against the rotation null, the principal angles "
                                    "between what the sender writes and what the receiver reads, and the top "
                                    "directions' token readouts (docs/hypothesis-format.md, 'What flows').")
    ex.add_argument("edge", metavar="EDGE", help="a head -> a later head's input, e.g. 'L0H7 -> L1H5.k'")
    ex.add_argument("model", metavar="MODEL", help="model directory, or hf:NAME")
    ex.add_argument("--top", type=_int_in(1), default=3, help="directions to show (default 3)")
    ex.add_argument("--draws", type=_int_in(99), default=1000, help="rotation-null draws (default 1000)")
    ex.add_argument("--out", type=Path, metavar="FIG.png", help="write the figure here (a new .png file)")
    ex.add_argument("--processing", choices=WEIGHT_PROCESSING, default="folded",
                    help="weight processing (default folded: LayerNorm folded, writers centred)")
    ex.add_argument("--seed", type=SEED, default=0)
    _add_device(ex)

    sc = sub.add_parser("scan", help="every edge's composition and causal effect; writes a starter hypothesis")
    sc.add_argument("model", help="model directory, or hf:NAME")
    sc.add_argument("--out", type=Path, help="new folder for scan.json, signature.png, starter.yaml")
    sc.add_argument("--n-prompts", type=PROMPTS, default=200)
    sc.add_argument("--segment-length", type=SEGMENT, default=20)
    sc.add_argument("--metric", choices=metrics.names(), default="logprob",
                    help="logit_diff needs --data with wrong tokens")
    sc.add_argument("--processing", choices=WEIGHT_PROCESSING, default="folded")
    sc.add_argument("--draws", type=int, default=1000, help="composition null draws per edge")
    sc.add_argument("--top", type=int, default=15, help="rows to print")
    sc.add_argument("--budget-mb", type=int, default=32, help="memory budget of a patching chunk (MiB)")
    sc.add_argument("--layers", type=_layer_range, metavar="A-B",
                    help="only the edges whose sender and receiver both lie in blocks A..B (the embedding counts "
                         "as block 0, the logits as the last block): on a real model, a few layers' edges of the "
                         "100,000s; default every edge")
    sc.add_argument("--data", type=Path, metavar="FILE", help=DATA_HELP)
    sc.add_argument("--distinct", action="store_true", help=DISTINCT_HELP)
    sc.add_argument("--corruption", action="append", metavar="NAME",
                    help="a corruption to scan under, repeatable (generator: first_half, second_half, both; "
                         "default first_half; with --data: the file's, default all)")
    sc.add_argument("--seed", type=SEED, default=0)
    _add_device(sc)

    dc = sub.add_parser("discover", help="find an edge circuit on some prompts and confirm it on others: "
                                         "attribution scores, exact patching, the faithfulness curve")
    dc.add_argument("source", metavar="HYPOTHESIS-OR-MODEL",
                    help="a hypothesis file (its model, data on the explore split, metric; an edge circuit claim "
                         "in it is the known circuit), or a model directory or hf:NAME")
    dc.add_argument("--out", type=Path, help="new folder for discovery.json, discover.md/.html, figures/, "
                                              "starter.yaml")
    dc.add_argument("--method", choices=DISCOVER_METHODS, default="eap-ig",
                    help="how edges are scored on the discovery prompts (default eap-ig; exact: patch every edge)")
    dc.add_argument("--steps", type=int, default=5, help="EAP-IG's points between corrupted and clean (default 5)")
    dc.add_argument("--rank", choices=RANKS, default="abs",
                    help="abs: by |score summed over positions| (default); positions: by the sum of |score| per "
                         "position (no cancellation)")
    dc.add_argument("--learn", type=int, default=0, metavar="STEPS",
                    help="also rank edges by a mask learned on the discovery prompts for STEPS steps of 8 prompts "
                         "(100 is a good start; each step a forward and a backward through the edge graph); "
                         "default 0: no learned ranking")
    dc.add_argument("--refine", type=int, default=0, metavar="STEPS",
                    help="refine the starter circuit greedily on the discovery prompts, up to STEPS proposals (each a "
                         "forward and a backward through the edge graph per prompt), and measure the result on the "
                         "confirmation prompts; default 0: no refinement")
    dc.add_argument("--confirm-fraction", type=float, default=0.5,
                    help="share of the prompts held out for confirmation (default 0.5)")
    dc.add_argument("--top", type=int, default=50, help="edges patched exactly on the confirmation prompts")
    dc.add_argument("--bound", type=float, default=0.8,
                    help="faithfulness the starter circuit's interval must clear (default 0.8)")
    dc.add_argument("--metric", choices=metrics.names(), default=None,
                    help="default: the hypothesis file's, else logprob")
    dc.add_argument("--n-prompts", type=PROMPTS, default=200, help="generated prompts, for a model without --data")
    dc.add_argument("--segment-length", type=SEGMENT, default=20)
    dc.add_argument("--data", type=Path, metavar="FILE", help=DATA_HELP)
    dc.add_argument("--corruption", metavar="NAME", help="the corruption (default: the data's default)")
    dc.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of every interval")
    dc.add_argument("--seed", type=SEED, default=0)
    _add_device(dc)

    st = sub.add_parser("selftest", help="check the harness against constructed models with known answers")
    st.add_argument("--out", type=Path, help="keep the constructed models and files here (default: temp dir)")
    st.add_argument("--null-seeds", type=int, default=20, help="null models for the false-positive rates")
    _add_device(st)

    ro = sub.add_parser("roles", help="every head on a data set: direct effect, attention to each slot, role scores")
    _add_data_set(ro, 200, "of the direct effect", "the direct effects under this corruption of the data")
    ro.add_argument("--no-direct", action="store_true", help="attention and role columns only: one clean run, no "
                    "corrupted run and no patching")
    ro.add_argument("--sort", metavar="COLUMN", help="order the rows by this column, largest first (direct: by size)")
    ro.add_argument("--top", type=int, metavar="N", help="show the first N rows")
    ro.add_argument("--out", type=Path, help="new folder for heads.csv, heads.json and heads.png")
    _add_device(ro)

    pa = sub.add_parser("patch", help="where the task's information sits: the residual stream patched at every "
                        "layer x position, with intervals")
    _add_data_set(pa, 50, "of the patched runs", "patch between the clean run and this corruption's")
    pa.add_argument("--direction", choices=[str(d) for d in Direction], default=str(Direction.DENOISING),
                    help="denoising (default): the clean residual into the corrupted run, the fraction of the "
                         "gap restored; noising: the corrupted residual into the clean run, the fraction destroyed")
    pa.add_argument("--heads", action="store_true", help="each head's output at each position instead of the "
                    "residual (rows L{l}H{h}): the next look once the residual map shows which layers matter")
    pa.add_argument("--layers", type=_layer_range, metavar="A-B", help="blocks A to B only (default: every block)")
    pa.add_argument("--top", type=_int_in(1), default=10, help="strongest cells listed below the map")
    pa.add_argument("--out", type=Path, help="new folder for patching.json, patching.csv and patching.png")
    _add_device(pa)
    return p


