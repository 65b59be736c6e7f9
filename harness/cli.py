"""Command line: `harness validate`, `harness run`, `harness sweep`, `harness report`,
`harness weights`, `harness roles`, `harness scan`, `harness selftest`.

Exit codes: 0 every claim passed (or every file valid), 1 a claim failed or
was inconclusive, 2 bad input (the message says file:line, field, what is
allowed; no traceback), 3 a sanity check failed (the run stops, no report),
4 (sweep) a job failed: the combined report names it and keeps the others.
Heavy imports (torch, TransformerLens) happen only inside the commands that
need a model.  Those that load or build one (run, sweep, weights, scan, roles,
selftest) take `--device` (devices.resolve_device), checked before any model loads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from .errors import HarnessError, UserError

EXIT_OK, EXIT_CLAIMS, EXIT_INPUT, EXIT_SANITY = 0, 1, 2, 3
DEVICE_HELP = "cpu, cuda, cuda:N or mps; default: best available, or $HARNESS_DEVICE"


def _add_device(p: argparse.ArgumentParser) -> None:
    """--device for every command that loads or builds a model (checked before any load)."""
    p.add_argument("--device", default=None, help=DEVICE_HELP)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness",
        description="Causal intervention testing harness for transformer mechanisms.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check hypothesis files against the schema (fast, no model)")
    v.add_argument("files", nargs="+", type=Path, metavar="FILE")

    r = sub.add_parser("run", help="run hypothesis files and write evidence reports")
    r.add_argument("files", nargs="+", type=Path, metavar="FILE")
    r.add_argument("--out", type=Path, help="report folder (one file only; must not exist)")
    r.add_argument("--reports", type=Path, default=Path("reports"),
                   help="parent folder of new report folders (default: reports/)")
    r.add_argument("--seed", type=int, help="override the files' seed")
    _add_device(r)

    sw = sub.add_parser("sweep", help="run hypothesis files on many models (checkpoints, seeds); one combined report")
    sw.add_argument("files", nargs="+", type=Path, metavar="FILE")
    sw.add_argument("--models", nargs="+", required=True, metavar="MODEL",
                    help="model directories, folders of model directories (e.g. checkpoints), or hf:NAME")
    sw.add_argument("--out", type=Path, help="combined report folder (must not exist)")
    sw.add_argument("--reports", type=Path, default=Path("reports"),
                    help="parent folder of the new report folder (default: reports/)")
    sw.add_argument("--seed", type=int, help="override the files' seed")
    sw.add_argument("--executor", choices=("inprocess", "ray"), default="inprocess",
                    help="where jobs run (default inprocess; ray needs the harness[ray] extra)")
    sw.add_argument("--ray-address", help="join this Ray cluster (default: start a local instance)")
    _add_device(sw)

    rp = sub.add_parser("report", help="re-render report.md/report.html/figures from evidence.json alone "
                        "(or a sweep report from sweep.json)")
    rp.add_argument("evidence", type=Path, metavar="EVIDENCE.json")
    rp.add_argument("--out", type=Path, help="write into this new folder instead of beside the JSON")

    w = sub.add_parser("weights", help="composition-score matrices of a model, with the rotation null")
    w.add_argument("model", help="model directory, or hf:NAME")
    w.add_argument("--processing", choices=("folded", "raw"), default="folded",
                   help="weight processing (default folded: LayerNorm folded, writers centred)")
    w.add_argument("--draws", type=int, default=1000, help="null draws per pair (default 1000)")
    w.add_argument("--alpha", type=float, default=0.01,
                   help="BH-adjusted significance level over all pairs of a mode (default 0.01)")
    w.add_argument("--seed", type=int, default=0)
    _add_device(w)

    sc = sub.add_parser("scan", help="every edge's composition and causal effect; writes a starter hypothesis")
    sc.add_argument("model", help="model directory, or hf:NAME")
    sc.add_argument("--out", type=Path, help="new folder for scan.json, signature.png, starter.yaml")
    sc.add_argument("--n-prompts", type=int, default=200)
    sc.add_argument("--segment-length", type=int, default=20)
    sc.add_argument("--metric", choices=("logprob",), default="logprob")
    sc.add_argument("--processing", choices=("folded", "raw"), default="folded")
    sc.add_argument("--draws", type=int, default=1000, help="composition null draws per edge")
    sc.add_argument("--top", type=int, default=15, help="rows to print")
    sc.add_argument("--budget-mb", type=int, default=32, help="memory budget of a patching chunk (MiB)")
    sc.add_argument("--seed", type=int, default=0)
    _add_device(sc)

    st = sub.add_parser("selftest", help="check the harness against constructed models with known answers")
    st.add_argument("--out", type=Path, help="keep the constructed models and files here (default: temp dir)")
    st.add_argument("--null-seeds", type=int, default=20, help="null models for the false-positive rates")
    _add_device(st)

    ro = sub.add_parser("roles", help="attention-role scores of every head of a model")
    ro.add_argument("model", help="model directory, or hf:NAME")
    ro.add_argument("--n-prompts", type=int, default=200)
    ro.add_argument("--segment-length", type=int, default=20)
    ro.add_argument("--seed", type=int, default=0)
    ro.add_argument("--split", choices=("explore", "test"), default="explore",
                    help="prompt split (default explore: keep the test split for hypotheses)")
    _add_device(ro)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {"validate": cmd_validate, "run": cmd_run, "roles": cmd_roles, "weights": cmd_weights,
                    "report": cmd_report, "selftest": cmd_selftest, "scan": cmd_scan,
                    "sweep": cmd_sweep}
        return commands[args.command](args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except HarnessError as exc:
        print(f"harness: sanity check failed: {exc}", file=sys.stderr)
        return EXIT_SANITY


def cmd_validate(args: argparse.Namespace) -> int:
    from . import spec
    from .errors import SpecError

    bad = 0
    for f in args.files:
        try:
            h = spec.load(f)
            print(f"{f}: ok ({len(h.spec.claims)} claims)")
        except SpecError as exc:
            bad += 1
            print(str(exc), file=sys.stderr)
    return EXIT_INPUT if bad else EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from . import spec
    from .errors import SpecError

    if args.out is not None and len(args.files) != 1:
        raise UserError("--out takes one hypothesis file; use --reports for several")
    if args.out is not None and args.out.exists():
        raise UserError(f"{args.out} already exists; runs never overwrite a report")
    problems = []
    for f in args.files:  # validate everything before loading any model
        try:
            spec.load(f)
        except SpecError as exc:
            problems += exc.problems
    if problems:
        raise SpecError(problems)

    from .devices import resolve_device
    from .runner import run

    device = resolve_device(args.device)  # a bad device stops the command before any model loads

    code = EXIT_OK
    command = "harness " + " ".join(sys.argv[1:]) if argv_is_cli() else None
    for f in args.files:
        ev = run(f, seed=args.seed, command=command, device=device)
        folder = ev.write(out_dir=args.out, reports_root=args.reports)
        c = ev.counts()
        print(f"\n{ev.hypothesis['name']} ({f})\n")
        print(ev.table())
        print(f"\n{c['PASS']} passed, {c['FAIL']} failed, {c['INCONCLUSIVE']} inconclusive")
        print(f"report: {folder / 'report.md'} (and report.html, evidence.json, figures/)")
        code = max(code, ev.exit_code)
    return code


def cmd_sweep(args: argparse.Namespace) -> int:
    from . import executors
    from .sweep_run import exit_code, sweep

    if args.device is not None:  # fail fast on a bad name; in-process, also on an unavailable device
        from .devices import check_form, resolve_device

        check_form(args.device) if args.executor == "ray" else resolve_device(args.device)
    executor = executors.make(args.executor, args.ray_address, args.device)
    command = "harness " + " ".join(sys.argv[1:]) if argv_is_cli() else "harness.cli.main"

    def progress(r: dict) -> None:
        head = f"[{r['index'] + 1}/{r['total']}] {r['hypothesis']} on {r['model']}"
        if r["status"] == "ok":
            c = r["evidence"]["counts"]
            print(f"{head}: {c['PASS']} pass, {c['FAIL']} fail, {c['INCONCLUSIVE']} inconclusive "
                  f"({r['seconds']:.1f} s)", file=sys.stderr, flush=True)
        else:
            e = r["error"]
            print(f"{head}: JOB FAILED: {e['type']}: {e['message'].splitlines()[0] if e['message'] else ''}",
                  file=sys.stderr, flush=True)

    doc, folder = sweep(args.files, args.models, executor, args.seed, args.device, args.out, args.reports,
                        command, progress)
    c = doc["counts"]
    print(f"{c['jobs']} jobs ({c['ok']} ran, {c['failed']} failed); claims: {c['PASS']} pass, "
          f"{c['FAIL']} fail, {c['INCONCLUSIVE']} inconclusive")
    print(f"report: {folder / 'sweep.md'} (and sweep.html, sweep.json, figures/, runs/)")
    return exit_code(doc)


def argv_is_cli() -> bool:
    return Path(sys.argv[0]).name in ("harness", "__main__.py")


def cmd_scan(args: argparse.Namespace) -> int:
    from .devices import resolve_device
    from .errors import OutputExistsError
    from .report import default_folder
    from .scan import scan

    device = resolve_device(args.device)
    if args.n_prompts < 2 or args.draws < 99 or args.top < 1 or args.budget_mb < 1:
        raise UserError("--n-prompts >= 2, --draws >= 99, --top >= 1 and --budget-mb >= 1 are required")
    out = args.out or default_folder("scan", Path("reports"))
    if out.exists():
        raise OutputExistsError(f"{out} already exists; choose another --out")
    _, table = scan(args.model, out, args.n_prompts, args.segment_length, args.seed, args.metric,
                    args.processing, args.draws, args.top, args.budget_mb, device=device)
    print(table)
    print(f"\nwrote {out / 'scan.json'}, {out / 'signature.png'} and {out / 'starter.yaml'}")
    return EXIT_OK


def cmd_selftest(args: argparse.Namespace) -> int:
    from .devices import resolve_device
    from .selftest import render, selftest

    device = resolve_device(args.device)
    if args.null_seeds < 1:
        raise UserError("--null-seeds must be at least 1")
    if args.out is not None and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise UserError(f"{args.out} exists and is not an empty folder")
    res = selftest(args.out, args.null_seeds, device)
    print(render(res))
    return EXIT_OK if res.passed else EXIT_CLAIMS


def cmd_report(args: argparse.Namespace) -> int:
    from .report import rerender

    folder = rerender(args.evidence, args.out)
    stem = "sweep" if (folder / "sweep.md").exists() else "report"  # a sweep folder has no report.md
    print(f"report: {folder / (stem + '.md')} and {folder / (stem + '.html')}")
    return EXIT_OK


def cmd_weights(args: argparse.Namespace) -> int:
    from .devices import resolve_device
    from .models import load_model
    from .weights_table import composition_tables

    device = resolve_device(args.device)
    if args.draws < 99:
        raise UserError("--draws must be at least 99")
    if not 0 < args.alpha < 1:
        raise UserError("--alpha must lie in (0, 1)")
    m = load_model(args.model, device=device)
    print(composition_tables(m.bridge, args.processing, args.draws, args.alpha, args.seed))
    return EXIT_OK


def cmd_roles(args: argparse.Namespace) -> int:
    import torch
    from tabulate import tabulate

    from . import data, roles
    from .devices import of, resolve_device
    from .interventions import pattern_hook
    from .models import load_model

    m = load_model(args.model, device=resolve_device(args.device))
    ds = data.repeated_tokens(args.n_prompts, args.segment_length, m.d_vocab, args.seed, args.split)
    ds = ds.to(of(m.bridge))
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(ds.clean, names_filter=lambda n: n.endswith("hook_pattern"))
    rows = []
    for layer in range(m.n_layers):
        pat = cache[pattern_hook(layer)]
        for head in range(m.n_heads):
            rows.append([f"L{layer}H{head}"] + [
                float(torch.nanmean(roles.role_scores(pat[:, head], ds.clean, r))) for r in roles.ROLES])
    print(f"{ds.description}\n")
    print(tabulate(rows, headers=["head", *roles.ROLES], floatfmt=".3f"))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
