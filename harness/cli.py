"""Command line: `harness validate`, `harness run`, `harness sweep`, `harness report`,
`harness weights`, `harness explain`, `harness roles`, `harness scan`, `harness discover`,
`harness selftest`.

Exit codes (errors.ExitCode): 0 every claim passed (or every file valid), 1 a
claim failed or was inconclusive, 2 bad input (the message says file:line,
field, what is allowed; no traceback), 3 a sanity check failed: a fatal one
(a hook that never fired, a non-finite metric, an identity intervention that
changed the metric) stops the run with no report; a recorded one (the
clean-corrupted gap below min_gap) lets the report be written, which says which,
and is printed on stderr after the claim table; 4 (sweep) a job failed: the
combined report names it and keeps the others (a sweep whose jobs all ran exits 3
when one of them recorded a failed sanity check).  Messages: `error: ...` for bad
input (every line of it), `sanity check failed: ...`, `warning: ...`.
`harness --version` prints the package version.

Every command calls the library; heavy imports (torch,
TransformerLens, matplotlib) happen inside the library functions that need them, so
`harness --help` and `harness validate` stay fast.  Those that
load or build one (run, sweep, weights, explain, scan, discover, roles, selftest) take `--device`
(model.devices.resolve_device), checked before any model loads.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from . import __version__, memory, threads
from .engine.data_source import from_data_file
from .engine.provenance import command_line
from .engine.runner import run
from .errors import ExitCode, HarnessError, SanityCheckError, SpecError, UserError
from .evidence.result import Evidence
from .hypothesis.loading import load, load_all
from .mech.composition_table import MAX_DRAWS, composition_data
from .model import metrics
from .model.devices import check_form, resolve_device
from .model.ref import load_model
from .progress import clock, stage
from .registry import load_plugins
from .report import discovery as discovery_report
from .report import writer
from .report.markdown import claim_table
from .report.writer import check_new, default_folder, write_report
from .spec.settings import MAX_PROMPTS
from .spec.vocabulary import WEIGHT_PROCESSING
from .sweep import document as sweep_document
from .sweep import executors
from .sweep import report as sweep_report
from .sweep.document import exit_code
from .sweep.executors import EXECUTORS
from .sweep.run import MANIFEST, partial_report, read_manifest, sweep, write_file
from .tools import roles_table, weights_table
from .tools.discover import METHODS as DISCOVER_METHODS
from .tools.discover import RANKS, discover, is_discovery
from .tools.explain_route import explain_route
from .tools.scan import is_scan, scan
from .tools.selftest import render, selftest
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


def _parser() -> argparse.ArgumentParser:
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
                   help="memory budget, e.g. 3G or 512M (sets $HARNESS_MEMORY; default: half the memory available): "
                        "base runs whose cached activations would not fit stop with one line before measuring, "
                        "and every chunked stage keeps its working memory within an eighth of it")
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
    ro.add_argument("model", help="model directory, or hf:NAME")
    ro.add_argument("--n-prompts", type=PROMPTS, default=200)
    ro.add_argument("--segment-length", type=SEGMENT, default=20)
    ro.add_argument("--seed", type=SEED, default=0)
    ro.add_argument("--split", choices=("explore", "test"), default=None,
                    help="prompt split of the generator or a template (default explore, or the data file's own "
                         "split when it sets one: keep the test split for hypotheses)")
    ro.add_argument("--data", type=Path, metavar="FILE", help=DATA_HELP)
    ro.add_argument("--distinct", action="store_true", help=DISTINCT_HELP)
    ro.add_argument("--metric", choices=metrics.names(),
                    help="of the direct effect (default logit_diff when the data have wrong tokens, else logprob)")
    ro.add_argument("--corruption", metavar="NAME", help="the direct effects under this corruption of the data "
                    "(default: its first)")
    ro.add_argument("--sort", metavar="COLUMN", help="order the rows by this column, largest first (direct: by size)")
    ro.add_argument("--top", type=int, metavar="N", help="show the first N rows")
    ro.add_argument("--out", type=Path, help="new folder for heads.csv, heads.json and heads.png")
    _add_device(ro)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        load_plugins()  # before the parser: a plugin's metric is one of --metric's choices
    except UserError as exc:
        print(error_text(exc), file=sys.stderr)
        return ExitCode.INPUT
    args = _parser().parse_args(argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "validate": cmd_validate, "run": cmd_run, "roles": cmd_roles, "weights": cmd_weights,
        "report": cmd_report, "selftest": cmd_selftest, "scan": cmd_scan, "sweep": cmd_sweep,
        "explain": cmd_explain, "discover": cmd_discover}
    try:
        with clock():
            if getattr(args, "threads", None) is not None:  # the same as HARNESS_THREADS (workers inherit it)
                os.environ[threads.ENV] = str(args.threads)
            if getattr(args, "memory", None) is not None:  # checked here, read by harness.memory.chosen
                memory.parse(args.memory, "--memory")
                os.environ[memory.ENV] = args.memory
            return commands[args.command](args)
    except UserError as exc:
        print(error_text(exc), file=sys.stderr)
        return ExitCode.INPUT
    except SanityCheckError as exc:
        print(f"sanity check failed: {exc}", file=sys.stderr)
        return ExitCode.SANITY
    except HarnessError as exc:
        print(error_text(exc), file=sys.stderr)
        return ExitCode.SANITY
    except KeyboardInterrupt:  # Ctrl-C: one line; report folders are whole or absent (report.folders)
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        print("error: out of memory: every prompt runs in one batch; lower data.n_prompts (or --n-prompts), "
              "the segment length, or the number of claims per file", file=sys.stderr)
        return ExitCode.INPUT


def error_text(exc: BaseException) -> str:
    """An error as the CLI prints it: `error: ` before every line (a SpecError has one
    line per problem)."""
    return "\n".join(f"error: {line}" for line in str(exc).splitlines() or [""])


def sanity_lines(ev: Evidence) -> list[str]:
    """One `sanity check failed: NAME — DETAIL` line per recorded sanity check that failed."""
    return [f"sanity check failed: {c.name} — {c.detail}" for c in ev.failed_sanity_checks]


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation failure (Python's MemoryError or torch's CPU/GPU allocator)."""
    text = str(exc)
    return isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()


def cmd_validate(args: argparse.Namespace) -> int:
    bad = 0
    for f in args.files:
        try:
            h = load(f, check_model=True)
            print(f"{f}: ok ({len(h.spec.claims)} claims)")
        except SpecError as exc:
            bad += 1
            print(error_text(exc), file=sys.stderr)
    return ExitCode.INPUT if bad else ExitCode.OK


def cmd_run(args: argparse.Namespace) -> int:
    if args.out is not None and len(args.files) != 1:
        raise UserError("--out takes one hypothesis file; use --reports for several")
    writer.preflight(args.out, args.reports)  # the report can be written: checked before any work
    load_all(args.files, check_model=True)  # every file is valid (names in range where config.json says) first
    device = resolve_device(args.device)  # a bad device stops the command before any model loads
    code: int = ExitCode.OK
    for f in args.files:
        ev = run(f, seed=args.seed, command=command_line(), device=device)
        stage("writing the report")
        folder = write_report(ev, out_dir=args.out, reports_root=args.reports)
        c = ev.counts()
        print(f"\n{ev.hypothesis['name']} ({f})\n")
        print(claim_table(ev))
        print(f"\n{c['PASS']} passed, {c['FAIL']} failed, {c['INCONCLUSIVE']} inconclusive", flush=True)
        for line in sanity_lines(ev):  # recorded, not fatal: the report is written and says the same
            print(line, file=sys.stderr)
        for w in ev.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"report: {folder / 'report.md'} (and report.html, evidence.json, figures/)")
        code = max(code, ev.exit_code)
    return code


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.resume is not None:
        if args.files or args.models or args.out is not None or args.seed is not None:
            raise UserError("--resume FOLDER takes the files, models, seed and output folder the sweep started with: "
                            "give no FILE, --models, --seed or --out with it")
        read_manifest(args.resume)  # one line when FOLDER is not an unfinished sweep
    elif not args.files or not args.models:
        raise UserError("harness sweep needs FILE... and --models MODEL... (or --resume FOLDER)")
    else:
        writer.preflight(args.out, args.reports)  # the report can be written: checked before any work
    if args.device is not None and args.executor == "ray":
        check_form(args.device)  # the workers resolve it where they run
    elif args.device is not None:
        resolve_device(args.device)  # fail fast on a bad or unavailable device
    executor = executors.make(args.executor, args.ray_address, args.device)

    def progress(r: dict[str, Any]) -> None:
        head = f"[{r['index'] + 1}/{r['total']}] {r['hypothesis']} on {r['model']}"
        if r["status"] == "ok":
            c = r["evidence"]["counts"]
            print(f"{head}: {c['PASS']} pass, {c['FAIL']} fail, {c['INCONCLUSIVE']} inconclusive "
                  f"({r['seconds']:.1f} s)", file=sys.stderr, flush=True)
            for check in sweep_document.failed_sanity_checks(r["evidence"]):
                print(f"{head}: sanity check failed: {check['name']} — {check['detail']}", file=sys.stderr, flush=True)
        else:
            e = r["error"]
            print(f"{head}: JOB FAILED: {e['type']}: {e['message'].splitlines()[0] if e['message'] else ''}",
                  file=sys.stderr, flush=True)

    doc, folder = sweep(args.files, args.models or [], executor, seed=args.seed, device=args.device, out=args.out,
                        reports_root=args.reports, command=command_line(), on_done=progress, resume=args.resume)
    c = doc["counts"]
    print(f"{c['jobs']} jobs ({c['ok']} ran, {c['failed']} failed); claims: {c['PASS']} pass, "
          f"{c['FAIL']} fail, {c['INCONCLUSIVE']} inconclusive")
    print(f"report: {folder / 'sweep.md'} (and sweep.html, sweep.json, figures/, runs/)")
    return exit_code(doc)


def cmd_scan(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.draws < 99 or args.top < 1 or args.budget_mb < 1:  # --n-prompts: checked by its argparse type
        raise UserError("--draws >= 99, --top >= 1 and --budget-mb >= 1 are required")
    writer.preflight(args.out, Path("reports"))  # the folder can be written: checked before any work
    out = check_new(args.out) if args.out is not None else default_folder("scan", Path("reports"))
    _, table = scan(args.model, out, device=device, data_file=args.data, unique=args.out is None,
                    n_prompts=args.n_prompts, segment_length=args.segment_length, seed=args.seed, metric=args.metric,
                    processing=args.processing, draws=args.draws, top=args.top, budget_mb=args.budget_mb,
                    corruptions=tuple(dict.fromkeys(args.corruption)) if args.corruption else None,
                    distinct=args.distinct)
    print(table)
    print(f"\nwrote {out / 'scan.json'}, {out / 'signature.png'} and {out / 'starter.yaml'}")
    return ExitCode.OK


def cmd_discover(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.bootstrap < 100:
        raise UserError("--bootstrap must be at least 100")
    writer.preflight(args.out, Path("reports"))
    out = check_new(args.out) if args.out is not None else default_folder("discover", Path("reports"))
    _, summary = discover(args.source, out, device=device, data_file=args.data, unique=args.out is None,
                          method=args.method, steps=args.steps, rank=args.rank,
                          confirm_fraction=args.confirm_fraction, top=args.top, bound=args.bound,
                          metric=args.metric, n_prompts=args.n_prompts, segment_length=args.segment_length,
                          corruption=args.corruption, bootstrap=args.bootstrap, seed=args.seed)
    print(summary)
    print(f"\nwrote {out / 'discover.md'} (and discover.html, discovery.json, figures/, starter.yaml)")
    return ExitCode.OK


def cmd_selftest(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.null_seeds < 1:
        raise UserError("--null-seeds must be at least 1")
    if args.out is not None and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise UserError(f"{args.out} exists and is not an empty folder")
    res = selftest(args.out, args.null_seeds, device)
    print(render(res))
    return ExitCode.OK if res.passed else ExitCode.CLAIMS


def cmd_report(args: argparse.Namespace) -> int:
    if args.evidence.is_dir() and (args.evidence / MANIFEST).is_file():  # an unfinished sweep: its report so far
        if args.out is not None:
            raise UserError("the report of an unfinished sweep is written into its folder: give no --out")
        partial, files = partial_report(args.evidence)
        for rel, data in files.items():
            write_file(args.evidence / rel, data)
        c = partial["counts"]
        print(f"partial sweep report ({c['jobs'] - c.get('missing', 0)} of {c['jobs']} jobs have a result): "
              f"{args.evidence / 'sweep.md'} and {args.evidence / 'sweep.html'}")
        return ExitCode.OK
    doc = writer.read_json(args.evidence, "evidence")
    if is_scan(doc):
        raise UserError(f"{args.evidence} is a scan file (scan.json); scan results are not re-rendered: "
                        "run `harness scan` again")
    if is_discovery(doc):
        folder = discovery_report.rerender(args.evidence, args.out)
        stem = "discover"
    elif sweep_document.is_sweep(doc):
        folder = sweep_report.rerender(args.evidence, args.out)
        stem = "sweep"
    else:
        folder = writer.rerender(args.evidence, args.out)
        stem = "report"
    print(f"report: {folder / (stem + '.md')} and {folder / (stem + '.html')}")
    return ExitCode.OK


def cmd_weights(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.draws < 99:
        raise UserError("--draws must be at least 99")
    if not 0 < args.alpha < 1:
        raise UserError("--alpha must lie in (0, 1)")
    if args.out is not None:
        writer.preflight(args.out)  # the folder can be written: checked before any work
    m = load_model(args.model, device=device)
    tables = composition_data(m.bridge, processing=args.processing, n_draws=args.draws, alpha=args.alpha,
                              seed=args.seed, max_draws=args.max_draws)
    print(weights_table.render(tables, args.top, True if args.full else None))
    if args.out is not None and tables is not None:
        stage("harness weights: writing the files")
        model = {k: getattr(m, k, None) for k in ("source", "sha256", "revision")}
        writer.write_folder(args.out, weights_table.output_files(tables, model))
        print(f"\nwrote {args.out / 'composition.csv'}, {args.out / 'composition.json'} and "
              f"{args.out / 'composition.png'}")
    elif args.out is not None:
        print(f"\nnothing written to {args.out}: no pairs")
    return ExitCode.OK


def cmd_explain(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.out is not None:
        writer.preflight_file(args.out, "figure")  # the figure can be written: checked before any work
    text, _ = explain_route(args.model, args.edge, top=args.top, draws=args.draws, processing=args.processing,
                            seed=args.seed, device=device, out=args.out)
    print(text)
    if args.out is not None:
        print(f"\nwrote {args.out}")
    return ExitCode.OK


def cmd_roles(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    given = from_data_file(args.data, args.split) if args.data is not None else None  # checked before loading
    if args.top is not None and args.top < 1:
        raise UserError(f"--top: {args.top} must be at least 1")
    m = load_model(args.model, device=device)
    table = roles_table.head_table(m, n_prompts=args.n_prompts, segment_length=args.segment_length, seed=args.seed,
                                   split=args.split or "explore", distinct=args.distinct, given=given,
                                   metric=args.metric, corruption=args.corruption)
    try:
        text = roles_table.render(table, args.sort, args.top)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.out is not None:
        roles_table.write(table, args.out, args.sort)
    print(text + (f"\n\nwrote {args.out}/ (heads.csv, heads.json, heads.png)" if args.out is not None else ""))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
