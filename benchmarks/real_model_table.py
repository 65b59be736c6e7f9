"""The tables benchmarks/real_model.py prints: per stage, harness against TransformerLens by hand
and against the plain forward, and the `harness run` row against the floor its own count predicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from real_model_children import SEGMENT, STAGES, Model, say

STAGE_NAMES = {"base": "base runs (clean + corrupted, cached)", "ablation": "mean ablation of {sender}",
               "edge": "edge patch {sender} -> {receiver}.k", "attribution": "attribution {sender} -> {receiver}.k "
               "(EAP-IG, 5 steps)", "run": "harness run, {claims} claims ({what})"}


def counted_forwards(log: str) -> float | None:
    """The forward-equivalents a `harness run` counted (its stage line `measured: X forward-equivalents
    of the n prompts in all`), or None when the run did not get that far."""
    import re

    found = re.findall(r"measured: ([0-9.]+) forward-equivalents", log)
    return float(found[-1]) if found else None


# ---------------------------------------------------------------------------------------------- the table

def max_diff(x: list[float] | None, y: list[float] | None) -> float | None:
    if not x or not y or len(x) != len(y):
        return None
    return max(abs(p - q) for p, q in zip(x, y, strict=True))


def fmt_s(row: dict[str, Any] | None) -> str:
    if not row:
        return ""
    return f"{row['wall_s']:.2f} s ({row['cpu_s']:.1f} s CPU, {row['peak_gb']:.2f} GiB)"


def table(model: Model, n: int, res: dict[str, Any]) -> tuple[list[list[str]], list[dict[str, Any]], list[str]]:
    """The rows printed for one model and prompt count, the same as numbers, and notes for below them."""
    floor = res["floor"]["stages"].get("forward")
    fwd = floor["wall_s"] if floor else None
    h, t, p = res["harness"], res["tl"], res.get("tl_patch", {})
    rows, records, notes = [], [], []
    fill = {"sender": model.sender, "receiver": model.receiver}

    def ratio(x: float | None, y: float | None, unit: str = "") -> str:
        return f"{x / y:.2f}{unit}" if x is not None and y else ""

    for stage in STAGES:
        hs, ts = h["stages"].get(stage), t["stages"].get(stage)
        hw, tw = (hs or {}).get("wall_s"), (ts or {}).get("wall_s")
        diff = max_diff(h["numbers"].get(stage), t["numbers"].get(stage))
        counted = (hs or {}).get("counted")
        floor_s = counted * fwd if counted and fwd else None  # the stage's floor: its count of plain forwards
        records.append({"stage": stage, "harness": hs, "tl": ts, "max_abs_diff": diff,
                        "harness_forwards": hw / fwd if hw and fwd else None,
                        "counted_forwards": counted, "harness_over_floor": hw / floor_s if hw and floor_s else None,
                        "tl_forwards": tw / fwd if tw and fwd else None,
                        "tl_over_harness": tw / hw if hw and tw else None})
        rows.append([STAGE_NAMES[stage].format(**fill), fmt_s(hs), fmt_s(ts), ratio(hw, fwd),
                     "" if counted is None else f"{counted:.2f}", ratio(hw, floor_s, "x"), ratio(tw, fwd),
                     ratio(tw, hw, "x"), _fmt(diff, "")])
    # TransformerLens's own attribution_patch (EAP, whole graph, per pair)
    if p.get("refused"):
        rows.append(["TL attribution_patch (EAP, per pair)", "", "refused (see below)", "", "", "", "", "", ""])
        notes.append(f"TransformerLens attribution_patch refused this model: {p['refused']}")
    elif p.get("stages", {}).get("attribution_patch"):
        ps = p["stages"]["attribution_patch"]
        pairs = p["numbers"]["pairs"]
        scaled = ps["wall_s"] * n / pairs
        diff = max_diff(h["numbers"].get("eap_denoising", [])[:pairs], p["numbers"]["eap_denoising"])
        hw = (h["stages"].get("attribution") or {}).get("wall_s")
        records.append({"stage": "attribution_patch", "tl": ps, "pairs": pairs, "tl_scaled_s": scaled,
                        "tl_forwards": scaled / fwd if fwd else None, "max_abs_diff": diff})
        rows.append(["TL attribution_patch (EAP, whole graph, per pair)", "",
                     f"{scaled:.1f} s ({ps['wall_s'] / pairs:.1f} s per pair; {pairs} of {n} timed, scaled)", "",
                     "", "", ratio(scaled, fwd), ratio(scaled, hw, "x"), _fmt(diff, "")])
        notes.append("TL attribution_patch's number: the edge's EAP score (denoising, summed over positions) on the "
                     f"first {pairs} prompts, against harness's from the whole graph's writes"
                     + (f" ({h['numbers']['eap_denoising_error']})" if "eap_denoising_error" in h["numbers"] else ""))
    run = res.get("run")
    if run:
        counted = run.get("counted_forwards")
        if counted and fwd and run["n"] == n:  # the run against the floor its own count predicts
            notes.append(f"harness run: {counted:.2f} forward-equivalents counted, so its predicted floor is "
                         f"{counted:.2f} x {fwd:.2f} s = {counted * fwd:.1f} s; the run took {run['wall_s']:.1f} s, "
                         f"{run['wall_s'] / (counted * fwd):.2f}x that floor (model load included)")
        records.append({"stage": "run", **run})
        what = Path(run["source"]).name if run.get("source") else "every kind"
        rows.append([STAGE_NAMES["run"].format(claims=run["claims"], what=what) + f", {run['n']} prompts",
                     f"{run['wall_s']:.1f} s ({run['cpu_s']:.1f} s CPU, {run['peak_gb']:.2f} GiB)"
                     + (", timeout" if run["timed_out"] else f", exit {run['exit']}"), "",
                     ratio(run["wall_s"], fwd) if run["n"] == n else "",
                     f"{counted:.2f}" if counted and run["n"] == n else "",
                     ratio(run["wall_s"], counted * fwd, "x") if counted and fwd and run["n"] == n else "",
                     "", "", ""])
    return rows, records, notes


def print_table(model: Model, n: int, res: dict[str, Any], threads: int, device: str) -> list[dict[str, Any]]:
    from tabulate import tabulate

    floor = res["floor"]["stages"].get("forward")
    h_load = res["harness"]["stages"].get("load")
    say()
    say(f"{model.title}: {n} prompts x {2 * SEGMENT + 1} tokens, {threads} thread(s), {device}")
    if floor:
        say(f"floor: one plain forward of the {n} clean prompts (HF model, torch.no_grad, best of 2): "
            f"{floor['wall_s']:.2f} s ({floor['cpu_s']:.1f} s CPU), peak {floor['peak_gb']:.2f} GiB; "
            f"its metric vs harness's clean run: max abs diff "
            f"{_fmt(max_diff(res['floor']['numbers'].get('m_clean'), res['harness']['numbers'].get('base', [])[:n]))}")
    if h_load:
        say(f"model load (harness's loader, both contenders): {h_load['wall_s']:.1f} s")
    graph_check = res["harness"]["numbers"].get("attribution_check_s")
    if graph_check is not None:
        say(f"harness's attribution stage includes {graph_check:.1f} s checking the edge graph's arithmetic on the "
            "first prompts (Runs.graph_model), as the claim does")
    check = res["tl"]["numbers"].get("by_hand_check")
    if check is not None:
        say(f"TransformerLens by hand: the receiver's z recomputed from the unpatched residual vs the model's: "
            f"max abs diff {check:.1e}")
    rows, records, notes = table(model, n, res)
    say(tabulate(rows, headers=["stage", "harness (wall, CPU, peak so far)", "TransformerLens by hand",
                                "harness / fwd", "counted", "harness / floor", "TL / fwd", "TL / harness",
                                "max abs diff"], tablefmt="github",
                 disable_numparse=True))
    for line in notes:
        say(line)
    return records


def _fmt(x: float | None, missing: str = "n/a") -> str:
    return missing if x is None else f"{x:.1e}"
