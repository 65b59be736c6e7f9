"""Sweep figures, drawn from a sweep document alone (PNG bytes, or None).

* claims:   one panel per claim: its key number with CI bars along training
            step (or model order), one line per series (run, seed), points
            coloured by verdict, the bound it is judged against dashed;
* together: the same numbers on one shared x axis, grouped by evidence type
            (weights / observational / causal) plus the clean-corrupted gap,
            so a composition score, a role score and an edge effect rising
            together (or not) can be read off one picture.
"""

from __future__ import annotations

from typing import Any

from ..report.figures import label, literal, png, pyplot
from ..report.style import VERDICT_COLOURS
from .document import plan_of

MAX_PANELS = 60  # claims of one file drawn (the rest are in the tables)
GROUPS = (("weights", "weight evidence"), ("observational", "observational evidence"),
          ("causal", "causal evidence"))


def axis(doc: dict) -> tuple[dict[str, float], str, list | None]:
    """x position of each model label, the axis name, and tick labels (None: numeric steps)."""
    models = doc["models"]
    if models and all(m["step"] is not None for m in models):
        return {m["label"]: float(m["step"]) for m in models}, "training step", None
    return {m["label"]: float(i) for i, m in enumerate(models)}, "model", [label(m["label"], 30) for m in models]


def series_points(doc: dict, hypothesis: str, claim_id: str) -> dict[str, list[tuple]]:
    """{series: [(x, value, lo, hi, verdict)]} of one claim, in model order."""
    xs, _, _ = axis(doc)
    series = {m["label"]: m["series"] for m in doc["models"]}
    out: dict[str, list[tuple]] = {}
    for job in doc["jobs"]:
        if job["hypothesis"] != hypothesis or job["status"] != "ok":
            continue
        for c in job["claims"]:
            if c["id"] == claim_id and c["value"] is not None:
                lo, hi = c["ci"] if c["ci"] and None not in c["ci"] else (c["value"], c["value"])
                lo, hi = min(lo, c["value"]), max(hi, c["value"])
                out.setdefault(series[job["model"]], []).append(
                    (xs[job["model"]], c["value"], lo, hi, c["verdict"]))
    return {k: sorted(v) for k, v in out.items()}


def _finish_x(ax: Any, doc: dict) -> None:
    xs, name, ticks = axis(doc)
    ax.set_xlabel(name)
    if ticks is not None:
        ax.set_xticks(list(xs.values()))
        ax.set_xticklabels(ticks, rotation=45, ha="right", fontsize=7)


@literal
def claims(doc: dict, hypothesis: str) -> bytes | None:
    plan = plan_of(doc, hypothesis)[:MAX_PANELS]
    if not any(series_points(doc, hypothesis, c["id"]) for c in plan):
        return None
    plt = pyplot()
    cols = 3
    rows = (len(plan) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.2 * rows), squeeze=False)
    refs = _references(doc, hypothesis)
    units = _units(doc, hypothesis)
    for ax, c in zip(axes.flat, plan):
        pts = series_points(doc, hypothesis, c["id"])
        for k, (name, p) in enumerate(pts.items()):
            x = [q[0] for q in p]
            y = [q[1] for q in p]
            ax.plot(x, y, "-", color=f"C{k % 10}", alpha=0.6, label=label(name, 30) if name else None)
            for xi, yi, lo, hi, verdict in p:
                ax.errorbar([xi], [yi], yerr=[[yi - lo], [hi - yi]], fmt="o", ms=4,
                            color=VERDICT_COLOURS[verdict], capsize=2)
        for xu in _undefined(doc, hypothesis, c["id"]):
            ax.plot([xu], [0.0], "x", color=VERDICT_COLOURS["INCONCLUSIVE"], ms=6, clip_on=False,
                    transform=ax.get_xaxis_transform())
        for name, line in refs.get(c["id"], {}).items():
            ys = {y for _, y in line}
            if len(ys) == 1:
                ax.axhline(line[0][1], ls="--", lw=0.8, color="#555")
            else:
                ax.plot([x for x, _ in line], [y for _, y in line], ls="--", lw=0.8, color="#555")
            ax.annotate(label(name, 30), (1.0, line[-1][1]), xycoords=("axes fraction", "data"), fontsize=7,
                        ha="right", va="bottom", color="#555")
        ax.set_title(label(c["id"]), fontsize=9)
        ax.set_ylabel(label(units.get(c["id"], ""), 20), fontsize=8)
        if len(pts) > 1 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        _finish_x(ax, doc)
    for ax in list(axes.flat)[len(plan):]:
        ax.axis("off")
    fig.suptitle(f"{label(hypothesis)}: key numbers (95% CI; green PASS, red FAIL, amber INCONCLUSIVE; "
                 "amber x on the axis: number undefined)")
    fig.tight_layout()
    return png(fig)


@literal
def together(doc: dict, hypothesis: str) -> bytes | None:
    plan = plan_of(doc, hypothesis)[:MAX_PANELS]
    kinds = _evidence_types(doc, hypothesis)
    panels = [(g, title, [c["id"] for c in plan if kinds.get(c["id"]) == g]) for g, title in GROUPS]
    panels = [p for p in panels if p[2]]
    gap = _gap_points(doc, hypothesis)
    if not panels and not gap:
        return None
    several = len({m["series"] for m in doc["models"] if m["series"]}) > 1
    plt = pyplot()
    n = len(panels) + 1
    fig, axes = plt.subplots(n, 1, figsize=(9.0, 2.6 * n), sharex=True, squeeze=False)
    for ax, (_, title, ids) in zip(axes[:, 0], panels):
        for k, cid in enumerate(ids):
            for s_i, (name, p) in enumerate(series_points(doc, hypothesis, cid).items()):
                x = [q[0] for q in p]
                ax.plot(x, [q[1] for q in p], marker="o", ms=3, color=f"C{k % 10}",
                        ls=["-", "--", ":", "-."][s_i % 4], label=_label(cid, name, several))
                ax.fill_between(x, [q[2] for q in p], [q[3] for q in p], color=f"C{k % 10}", alpha=0.15)
        ax.set_title(title, fontsize=9)
        _legend(ax)
    ax = axes[-1, 0]
    for s_i, (name, p) in enumerate(gap.items()):
        x = [q[0] for q in p]
        ax.plot(x, [q[1] for q in p], marker="o", ms=3, color="k", ls=["-", "--", ":", "-."][s_i % 4],
                label=_label("clean - corrupted", name, several))
        ax.fill_between(x, [q[2] for q in p], [q[3] for q in p], color="k", alpha=0.1)
    ax.set_title("baseline: clean - corrupted metric gap (normalized effects need >= min_gap)", fontsize=9)
    _legend(ax)
    _finish_x(ax, doc)
    fig.suptitle(f"{label(hypothesis)}: evidence over training (bands: 95% CI)")
    fig.tight_layout()
    return png(fig)


def _legend(ax: Any) -> None:
    """A legend beside the panel, when something in it is labelled."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))


def _label(what: str, series: str, several: bool) -> str:
    return label(f"{what} ({series})" if several and series else what)


def _undefined(doc: dict, hypothesis: str, claim_id: str) -> list[float]:
    """x of the models on which the claim's number is undefined (e.g. gap below min_gap)."""
    xs, _, _ = axis(doc)
    return [xs[j["model"]] for j in doc["jobs"] if j["hypothesis"] == hypothesis and j["status"] == "ok"
            for c in j["claims"] if c["id"] == claim_id and c["value"] is None]


def _references(doc: dict, hypothesis: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{claim: {line label: [(x, y)]}}: a bound is one value; the composition null's
    95th percentile is one value per model."""
    xs, _, _ = axis(doc)
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for job in doc["jobs"]:
        if job["hypothesis"] == hypothesis and job["status"] == "ok":
            for c in job["claims"]:
                for r in c["reference"]:
                    out.setdefault(c["id"], {}).setdefault(r["label"], []).append((xs[job["model"]], r["y"]))
    return {cid: {k: sorted(v) for k, v in lines.items()} for cid, lines in out.items()}


def _units(doc: dict, hypothesis: str) -> dict[str, str]:
    return {c["id"]: c["unit"] for j in doc["jobs"] if j["hypothesis"] == hypothesis and j["status"] == "ok"
            for c in j["claims"]}


def _evidence_types(doc: dict, hypothesis: str) -> dict[str, str]:
    return {c["id"]: c["evidence"] for j in doc["jobs"] if j["hypothesis"] == hypothesis and j["status"] == "ok"
            for c in j["claims"]}


def _gap_points(doc: dict, hypothesis: str) -> dict[str, list[tuple]]:
    xs, _, _ = axis(doc)
    series = {m["label"]: m["series"] for m in doc["models"]}
    out: dict[str, list[tuple]] = {}
    for j in doc["jobs"]:
        if j["hypothesis"] == hypothesis and j["status"] == "ok" and j["baseline_gap"]["mean"] is not None:
            g = j["baseline_gap"]
            lo, hi = g["ci"] if g["ci"] and None not in g["ci"] else (g["mean"], g["mean"])
            out.setdefault(series[j["model"]], []).append((xs[j["model"]], g["mean"], lo, hi))
    return {k: sorted(v) for k, v in out.items()}
