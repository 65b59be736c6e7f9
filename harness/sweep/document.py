"""The sweep document (sweep.json, docs/sweep-json.md): what it keeps of each
job, its counts and exit code, and its validation against the shipped schema
(sweep.schema.json).  Plain data: the runner builds it, the report renders it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from ..claims import registry
from ..errors import ExitCode
from ..evidence import document
from ..evidence.verdicts import FAIL, INCONCLUSIVE, PASS
from ..hypothesis.loading import LoadedHypothesis
from ..report import views

SCHEMA_VERSION = 4  # of sweep.json; docs/sweep-json.md lists the changes
SCHEMA_FILE = Path(__file__).with_name("sweep.schema.json")


def folder_name(text: str) -> str:
    """`text` as a safe file or folder name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def claim_plan(h: LoadedHypothesis) -> list[dict[str, Any]]:
    """The claims of a file as the sweep report lists them, with their fixed bounds."""
    out = []
    for c in h.spec.claims:
        d = c.model_dump()
        out.append({"id": c.id, "kind": c.kind,
                    "at_least": d.get("at_least"), "at_most": d.get("at_most"), "expect": d.get("expect")})
    return out


def plan_of(doc: dict[str, Any], hypothesis: str) -> list[dict[str, Any]]:
    """The planned claims (id, kind, bounds) of the file called `hypothesis`."""
    return next(h for h in doc["hypotheses"] if h["name"] == hypothesis)["claims"]


def job_summary(result: dict[str, Any], plans: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What sweep.json keeps of one job's result (the full evidence stays in runs/)."""
    if result["status"] != "ok":
        return {"status": "failed", "error": result["error"], "seconds": result.get("seconds"),
                "host": result.get("host")}
    doc = result["evidence"]
    ev = document.load(doc, registry.kinds())
    claims = []
    for c in ev.claims:
        lines = views.get(c.kind).reference_lines(c, plans[c.id])
        claims.append({"id": c.id, "kind": c.kind, "evidence": c.evidence, "verdict": c.verdict, "value": c.value,
                       "ci": c.ci, "unit": c.unit, "rule": c.rule,
                       "reference": [{"y": y, "label": label} for y, label in lines if y is not None]})
    return {"status": "ok", "seconds": result.get("seconds"), "host": result.get("host"),
            "model_sha256": ev.model["sha256"], "device": ev.provenance.get("device"),
            "counts": ev.counts(), "baseline_gap": ev.baseline["gap"], "claims": claims,
            "weights_vs_use": [{"edge": w.edge, "direction": w.direction, "class": w.classification,
                                "composes": w.composes, "use": w.use, "composition": w.composition,
                                "effect": w.effect, "effect_ci": w.effect_ci} for w in ev.weights_vs_use],
            "ladder": [{"mechanism": r.mechanism, "highest": r.highest, "contradictions": r.contradictions}
                       for r in ev.ladder],
            "sanity_failed": failed_sanity_checks(doc)}


def failed_sanity_checks(evidence: dict[str, Any]) -> list[dict[str, str]]:
    """`name` and `detail` of each recorded sanity check of an evidence document that failed."""
    return [{"name": c["name"], "detail": c["detail"]} for c in evidence.get("sanity_checks", []) if not c["passed"]]


def counts(jobs: list[dict[str, Any]]) -> dict[str, int]:
    out = {"jobs": len(jobs), "ok": 0, "failed": 0, PASS.value: 0, FAIL.value: 0, INCONCLUSIVE.value: 0}
    for j in jobs:
        out[j["status"]] = out.get(j["status"], 0) + 1
        for c in j.get("claims", []):
            out[c["verdict"]] += 1
    return out


def exit_code(doc: dict[str, Any]) -> int:
    """JOB_FAILED (4) when a job failed (a fatal sanity check fails its job) or has not run yet
    (a partial sweep's `missing` jobs); else SANITY (3) when a job that ran recorded a failed
    sanity check; else OK (0) when every claim of every job passed, CLAIMS (1) otherwise."""
    c = doc["counts"]
    if c["failed"] or c.get("missing"):
        return ExitCode.JOB_FAILED
    if any(j.get("sanity_failed") for j in doc["jobs"]):
        return ExitCode.SANITY
    return ExitCode.OK if c[FAIL] == 0 and c[INCONCLUSIVE] == 0 else ExitCode.CLAIMS


def problems(doc: Any) -> list[str]:
    """Everything wrong with a sweep document ([] when valid, and then it renders): its
    shape against the shipped schema, then what the shape cannot say (references)."""
    import json

    return document.json_schema_problems(doc, json.loads(SCHEMA_FILE.read_text())) or reference_problems(doc)


def _duplicates(values: list[str]) -> list[str]:
    """The values that appear more than once (each once, in order)."""
    counts = Counter(values)
    return [v for v in counts if counts[v] > 1]


def reference_problems(doc: dict[str, Any]) -> list[str]:
    """Names that must be unique and are not; jobs naming a hypothesis or model the
    document does not list; a job that ran without a result for each planned claim."""
    found = [f"hypotheses: the name {n!r} appears twice" for n in _duplicates([h["name"] for h in doc["hypotheses"]])]
    found += [f"models: the label {m!r} appears twice" for m in _duplicates([m["label"] for m in doc["models"]])]
    plans = {h["name"]: [c["id"] for c in h["claims"]] for h in doc["hypotheses"]}
    labels = {m["label"] for m in doc["models"]}
    pairs = [f"{j['hypothesis']!r} on {j['model']!r}" for j in doc["jobs"]]
    found += [f"jobs: {p} appears twice" for p in _duplicates(pairs)]
    for i, j in enumerate(doc["jobs"]):
        if j["hypothesis"] not in plans:
            found.append(f"jobs/{i}/hypothesis: {j['hypothesis']!r} is not one of the document's hypotheses")
        if j["model"] not in labels:
            found.append(f"jobs/{i}/model: {j['model']!r} is not the label of one of the document's models")
        if j["status"] == "ok" and j["hypothesis"] in plans:
            missing = set(plans[j["hypothesis"]]) - {c["id"] for c in j["claims"]}
            if missing:
                found.append(f"jobs/{i}/claims: no result for the planned claim(s) {', '.join(sorted(missing))}")
    return found


def is_sweep(doc: Any) -> bool | None:
    """Whether a JSON document is a sweep document (it has `jobs`)."""
    return isinstance(doc, dict) and "jobs" in doc
