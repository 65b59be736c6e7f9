"""Command line: `harness validate`, `harness run`, `harness sweep`, `harness report`,
`harness weights`, `harness explain`, `harness roles`, `harness patch`, `harness scan`,
`harness discover`, `harness selftest`.

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
load or build one (run, sweep, weights, explain, scan, discover, roles, patch, selftest) take `--device`
(model.devices.resolve_device), checked before any model loads.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import memory, threads
from .cli_args import parser
from .engine.data_source import from_data_file
from .engine.provenance import command_line
from .engine.runner import run
from .errors import ExitCode, HarnessError, SanityCheckError, SpecError, UserError
from .evidence.result import Evidence
from .hypothesis.loading import load, load_all
from .interrupt import armed
from .mech.weights.table import composition_data
from .model import behaviour
from .model.devices import check_form, resolve_device
from .model.ref import load_model
from .progress import clock, stage
from .registry import load_plugins
from .report import discovery as discovery_report
from .report import writer
from .report.markdown import claim_table
from .report.writer import check_new, default_folder, write_report
from .sweep import document as sweep_document
from .sweep import executors
from .sweep import report as sweep_report
from .sweep.document import exit_code
from .sweep.run import MANIFEST, partial_report, read_manifest, sweep, write_file
from .tools import patch_sweep, roles_table, weights_table
from .tools.discover import discover
from .tools.explain_route import explain_route
from .tools.scan import is_scan, scan
from .tools.selftest import render, selftest


def main(argv: list[str] | None = None) -> int:
    try:
        load_plugins()  # before the parser: a plugin's metric is one of --metric's choices
    except UserError as exc:
        print(error_text(exc), file=sys.stderr)
        return ExitCode.INPUT
    args = parser().parse_args(argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "validate": cmd_validate, "run": cmd_run, "roles": cmd_roles, "weights": cmd_weights,
        "report": cmd_report, "selftest": cmd_selftest, "scan": cmd_scan, "sweep": cmd_sweep,
        "explain": cmd_explain, "discover": cmd_discover, "patch": cmd_patch}
    try:
        with armed(), clock():
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
    except KeyboardInterrupt:  # Ctrl-C (never lost: harness.interrupt): one line; report folders whole or absent
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
        behaves = ev.baseline.get("behaviour")
        if behaves:  # what the model does before any claim, on the first line
            print(f"{behaviour.headline(behaves)}\n")
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
                    distinct=args.distinct, layers=args.layers)
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
                          corruption=args.corruption, bootstrap=args.bootstrap, seed=args.seed,
                          learn=args.learn, refine=args.refine)
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
    if discovery_report.is_discovery(doc):
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


def _kept(out: Path | None, left_out: bool, name: str) -> Path | None:
    """Where a table's files go: --out, else (when the printed table leaves rows out, which would be
    lost) a new folder under reports/, else nowhere."""
    return out if out is not None else default_folder(name, Path("reports")) if left_out else None


def cmd_roles(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    given = from_data_file(args.data, args.split) if args.data is not None else None  # checked before loading
    if args.top is not None and args.top < 1:
        raise UserError(f"--top: {args.top} must be at least 1")
    if args.out is not None or args.top is not None:  # the folder can be written: checked before any work
        writer.preflight(args.out, Path("reports"))
    m = load_model(args.model, device=device)
    table = roles_table.head_table(m, n_prompts=args.n_prompts, segment_length=args.segment_length, seed=args.seed,
                                   split=args.split or "explore", distinct=args.distinct, given=given,
                                   metric=args.metric, corruption=args.corruption, direct=not args.no_direct)
    try:
        text = roles_table.render(table, args.sort, args.top)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    left = len(table.heads) - len(roles_table.ordered(table, args.sort, args.top))
    out = _kept(args.out, left > 0, "roles")
    if out is not None:
        out = roles_table.write(table, out, args.sort, unique=args.out is None)
    kept = f"{left} rows left out by --top: every row is in " if left and args.out is None else "wrote "
    print(text + (f"\n\n{kept}{out}/ (heads.csv, heads.json, heads.png)" if out is not None else ""))
    return ExitCode.OK


def cmd_patch(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    given = from_data_file(args.data, args.split) if args.data is not None else None  # checked before loading
    if args.out is not None or args.heads:  # the folder can be written: checked before any work
        writer.preflight(args.out, Path("reports"))
    m = load_model(args.model, device=device)
    t = patch_sweep.patch_map(m, n_prompts=args.n_prompts, segment_length=args.segment_length, seed=args.seed,
                              split=args.split or "explore", distinct=args.distinct, given=given,
                              metric=args.metric, corruption=args.corruption, direction=args.direction,
                              site="heads" if args.heads else "resid", layers=args.layers)
    left = t.site == "heads"  # the printed table shows the heads of the strongest cells only
    out = _kept(args.out, left, "patch")
    if out is not None:
        out = patch_sweep.write(t, out, unique=args.out is None)
    kept = "every head is in " if left and args.out is None else "wrote "
    print(patch_sweep.render(t, args.top)
          + (f"\n\n{kept}{out}/ (patching.json, patching.csv, patching.png)" if out is not None else ""))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
