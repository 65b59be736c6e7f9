"""The figures of a discovery (report.discovery), from its discovery.json alone: the faithfulness
curve with its intervals (figures/curve.png) and the ranking's stability over resamples
(figures/stability.png)."""

from __future__ import annotations

from typing import Any

from .figures import MAX_WIDTH_IN, label, literal, pyplot
from .style import VERDICT_COLOURS


@literal
def draw_curve(doc: dict[str, Any]) -> Any:
    """Faithfulness against the fraction of edges kept (log x), each point with its interval."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(7.0, MAX_WIDTH_IN), 3.6), layout="constrained")
    pts = [p for p in doc["curve"] if p["k"] > 0]
    xs = [100 * p["fraction"] for p in pts]
    ys = [p["faithfulness"] for p in pts]
    lo = [p["faithfulness"] - p["ci"][0] for p in pts]
    hi = [p["ci"][1] - p["faithfulness"] for p in pts]
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", color="#1f4e79", capsize=3, label="top-k circuit (95% CI)")
    finer = doc.get("curve_finer") or []
    if finer:
        n = doc["graph"]["edges"]
        err = [[p["faithfulness"] - p["ci"][0] for p in finer], [p["ci"][1] - p["faithfulness"] for p in finer]]
        ax.errorbar([100 * p["k"] / n for p in finer], [p["faithfulness"] for p in finer], yerr=err,
                    fmt="s", ms=3, color="#6a51a3", capsize=2, lw=0.8, label="finer search")
    for key, style, colour in (("signed", "^--", "#1b9e77"), ("learned", "v-.", "#e7298a")):
        other = doc.get(key)
        if other:
            sp = [p for p in other["curve"] if p["k"] > 0]
            ax.errorbar([100 * p["fraction"] for p in sp], [p["faithfulness"] for p in sp],
                        yerr=[[p["faithfulness"] - p["ci"][0] for p in sp],
                              [p["ci"][1] - p["faithfulness"] for p in sp]],
                        fmt=style, ms=4, color=colour, capsize=2, lw=0.8, label=f"{key} ranking (95% CI)")
    ax.axhline(1.0, color="#888888", lw=0.8, ls=":")
    ax.axhline(doc["settings"]["bound"], color=VERDICT_COLOURS["PASS"], lw=0.8, ls="--",
               label=f"bound {doc['settings']['bound']:g}")
    known = doc.get("known")
    if known:
        ax.axhline(known["faithfulness"], color="#d95f02", lw=0.8, ls="-.", label="known circuit")
    ax.set_xscale("log")
    ax.set_xlabel("edges kept (% of the graph's edges)")
    ax.set_ylabel("faithfulness")
    s = doc["summaries"]
    ax.set_title(label(f"{doc['settings']['method']}: CPR {s['CPR']['value']:.3f}, CMD {s['CMD']['value']:.3f} "
                       f"({doc['split']['confirmation']} confirmation prompts)", 90), fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return fig


@literal
def draw_stability(doc: dict[str, Any]) -> Any | None:
    """The Jaccard overlap of the resamples' top-k sets with the ranking's, against k (log x): the mean
    and the 2.5-97.5 % range over resamples, the stability bar, the starter's k."""
    st = doc.get("stability")
    if not st:
        return None
    n = doc["graph"]["edges"]
    pts = [p for p in st["points"] if p["k"] > 0]
    xs = [100 * p["k"] / n for p in pts]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(7.0, MAX_WIDTH_IN), 3.2), layout="constrained")
    ax.fill_between(xs, [p["range"][0] for p in pts], [p["range"][1] for p in pts], color="#9ecae1", alpha=0.5,
                    lw=0, label="2.5-97.5 % of resamples")
    ax.plot(xs, [p["jaccard"] for p in pts], "o-", color="#1f4e79", ms=3, label="mean over resamples")
    ax.axhline(st["bar"], color=VERDICT_COLOURS["PASS"], lw=0.8, ls="--", label=f"stable: {st['bar']:g}")
    if doc.get("starter_k"):
        ax.axvline(100 * doc["starter_k"] / n, color="#d95f02", lw=0.8, ls="-.", label="starter circuit")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("edges kept (% of the graph's edges)")
    ax.set_ylabel("Jaccard with the ranking's top k")
    ax.set_title(label(f"stability: {st['resamples']} bootstrap resamples of the {st['prompts']} discovery prompts",
                       90), fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return fig
