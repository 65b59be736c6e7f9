"""evidence.json as a document: writing it, reading it back, validating it.

* `to_json(doc)`: pretty-printed JSON; NaN and infinities become null.
* `problems(doc, kinds)`: everything wrong with a document: the shape, against
  the shipped JSON Schema (`evidence.schema.json`), then each claim's details
  against its kind's typed model, its evidence type against its kind's, and the
  figure data's matrices against their labels.  A document without problems
  renders (`harness report` turns a failure to render one into a clear error).
* `load(doc, kinds)`: the `Evidence` of a valid document (older versions are
  upgraded first, see `upgrade`).

`kinds` maps a claim kind's name to an object with `details` (its typed
details model) and `evidence` (its evidence type): the claim-kind registry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from ..errors import EvidenceFormatError
from .details import Details, LadderRow, PassRegion, Record, SanityCheck, WeightsVsUseRow
from .result import SCHEMA_VERSION, ClaimResult, Evidence
from .verdicts import Verdict

SCHEMA_FILE = Path(__file__).with_name("evidence.schema.json")


class KindInfo(Protocol):
    """What reading a claim needs from its kind."""

    @property
    def details(self) -> type[Details]: ...

    @property
    def evidence(self) -> str: ...


def finite(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def to_json(doc: dict[str, Any]) -> str:
    """The document as written to disk: 2-space indentation, except that a list or object holding
    scalars only is written on one line (a table's row, an interval, a matrix's row: a
    123,000-row ranking is 123,000 lines, not a million, and is written by the C encoder);
    NaN and infinities as null."""
    return _encode(doc, 0) + "\n"


_ONE_LINE = json.JSONEncoder(allow_nan=False, separators=(", ", ": "))  # made once: the C encoder


def _container(x: Any) -> bool:
    return isinstance(x, (dict, list, tuple))


def _encode(x: Any, level: int) -> str:
    values = x.values() if isinstance(x, dict) else x
    if not _container(x) or not any(_container(v) for v in values):
        try:
            return _ONE_LINE.encode(x)
        except ValueError:  # a NaN or an infinity somewhere in it
            return _ONE_LINE.encode(finite(x))
    pad, end = "  " * (level + 1), "  " * level
    if isinstance(x, dict):
        items = [f"{pad}{json.dumps(k if isinstance(k, str) else json.dumps(k))}: {_encode(v, level + 1)}"
                 for k, v in x.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + _encode(v, level + 1) for v in x) + "\n" + end + "]"


def normalised(doc: dict[str, Any]) -> dict[str, Any]:
    """Exactly what evidence.json holds for `doc` (the JSON round trip)."""
    out: dict[str, Any] = json.loads(to_json(doc))
    return out


def schema() -> dict[str, Any]:
    """The JSON Schema of the document's shape (harness/evidence/evidence.schema.json)."""
    out: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return out


def json_schema_problems(doc: Any, schema_doc: dict[str, Any]) -> list[str]:
    """`path: message` for every violation of a JSON Schema ([] when valid)."""
    import jsonschema

    v = jsonschema.Draft202012Validator(schema_doc)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
            for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """A document of an older schema_version in the current form (a copy).

    1 -> 2: copying claims had kind `role` (with weights evidence); now `copying`.
    2 -> 3: a weights-vs-use row was one edge claim; now one edge and direction with
            the `tests` of its claims (an old row becomes a row with its one test).
    3 -> 4: claims gain `reason` and `pass_region`, signature points `use`; all three may
            be absent (a claim then reads with the rule as its reason and no pass region).
    4 -> 5: circuit claims gain the sequential test's keys (`beat_p_value`, `beat_decision`, ...;
            a version-4 circuit keeps its `binomial_p_value`), edge circuits, attribution claims
            and the `attribution` rung: only added keys.
    5 -> 6: a ladder step reads its claim's verdict (a FAIL is against the mechanism whatever the
            claim's direction); an older ladder read the direction (a FAILed `at_most` claim was
            support), so it is not read: the document reads with no ladder.
    6 -> 7: circuit claims may state criteria (`details.criteria`, `details.bound_verdict`, the
            rungs equivalence, completeness, independence, minimality): only added keys.
    7 -> 8: the baseline gains `behaviour` (the model's accuracy and answer rank): an added key."""
    version = doc.get("schema_version")
    if version == SCHEMA_VERSION:
        return doc
    if version in (6, 7):
        return dict(doc, schema_version=SCHEMA_VERSION)
    if version in (3, 4, 5):  # 3 -> 4 -> 5 only added keys that may be absent
        return dict(doc, schema_version=SCHEMA_VERSION, ladder=[])
    out = dict(doc, schema_version=SCHEMA_VERSION, ladder=[])
    claims = doc.get("claims", [])
    if version == 1:
        claims = [dict(c, kind="copying") if c.get("kind") == "role" and c.get("evidence") == "weights" else c
                  for c in claims]
    out["claims"] = claims
    by_id = {c["id"]: c.get("details", {}) for c in claims}
    rows = []
    for row in doc.get("weights_vs_use", []):
        details = by_id.get(row.get("claim"), {})
        test = {"claim": row.get("claim"), "replacement": details.get("replacement", "resample"), "corruption": None,
                "use": row.get("use"), "effect": row.get("effect")}
        rows.append(dict(row, direction=row.get("direction", details.get("direction", "noising")),
                         tests=row.get("tests", [test])))  # keys already there are kept
    out["weights_vs_use"] = rows
    return out


def _number_list_problems(doc: Any) -> tuple[Any, list[str]]:
    """(doc with each claim's `per_prompt` list emptied, what is wrong with those lists):
    the long per-prompt lists are checked here, fast, instead of item by item by the schema."""
    if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
        return doc, []
    found, claims = [], []
    for i, c in enumerate(doc["claims"]):
        pp = c.get("per_prompt") if isinstance(c, dict) else None
        if isinstance(pp, list):
            bad = next((j for j, x in enumerate(pp) if x is not None and (type(x) not in (int, float))), None)
            if bad is not None:
                found.append(f"claims/{i}/per_prompt/{bad}: {pp[bad]!r} is not of type 'number', 'null'")
            c = dict(c, per_prompt=[])
        claims.append(c)
    return dict(doc, claims=claims), found


def _matrix_problems(where: str, m: Any) -> list[str]:
    """What the schema's `matrix` refuses in `m` (a non-empty list of non-empty lists of numbers or
    nulls), checked row by row instead of item by item."""
    if not isinstance(m, list) or not m:
        return [f"{where}: not a non-empty list of rows"]
    for i, row in enumerate(m):
        if not isinstance(row, list) or not row:
            return [f"{where}/{i}: not a non-empty list of numbers"]
        bad = next((j for j, x in enumerate(row) if x is not None and type(x) not in (int, float)), None)
        if bad is not None:
            return [f"{where}/{i}/{bad}: {row[bad]!r} is not of type 'number', 'null'"]
    return []


def _figure_matrix_problems(doc: Any) -> tuple[Any, list[str]]:
    """(doc with the figure data's matrices (attention patterns, composition scores and null
    percentiles) each replaced by [[0]], what is wrong with them): a composition figure of a
    30-layer model holds some 400,000 numbers, which the schema would check one by one."""
    fd = doc.get("figures_data") if isinstance(doc, dict) else None
    if not isinstance(fd, dict):
        return doc, []
    found: list[str] = []
    light = dict(fd)
    if isinstance(fd.get("attention"), list):
        light["attention"] = []
        for i, a in enumerate(fd["attention"]):
            for key in ("pattern", "mean_pattern"):
                if isinstance(a, dict) and key in a:
                    found += _matrix_problems(f"figures_data/attention/{i}/{key}", a[key])
                    a = dict(a, **{key: [[0]]})
            light["attention"].append(a)
    if isinstance(fd.get("composition"), dict):
        light["composition"] = {}
        for mode, c in fd["composition"].items():
            if isinstance(c, dict):
                for key in ("scores", "null_q99"):
                    if key in c:
                        found += _matrix_problems(f"figures_data/composition/{mode}/{key}", c[key])
                c = dict(c, **{key: [[0]] for key in ("scores", "null_q99") if key in c})
            light["composition"][mode] = c
    return dict(doc, figures_data=light), found


def problems(doc: Any, kinds: Mapping[str, KindInfo]) -> list[str]:
    """Everything wrong with an evidence document ([] when it is valid)."""
    light, found = _number_list_problems(doc)
    light, more = _figure_matrix_problems(light)
    found += more
    found = json_schema_problems(light, schema()) + found
    if found:
        return found
    doc = upgrade(doc)
    for i, c in enumerate(doc["claims"]):
        kind = kinds.get(c["kind"])
        if kind is None:
            found.append(f"claims/{i}/kind: unknown claim kind {c['kind']!r}; this harness knows "
                         f"{', '.join(kinds)}")
            continue
        if c["evidence"] != kind.evidence:
            found.append(f"claims/{i}/evidence: a {c['kind']} claim is {kind.evidence} evidence, "
                         f"not {c['evidence']!r}")
        found += _typed_problems(kind.details, c["details"], f"claims/{i}/details")
    for key, model in (("sanity_checks", SanityCheck), ("weights_vs_use", WeightsVsUseRow), ("ladder", LadderRow)):
        for i, x in enumerate(doc.get(key, [])):
            found += _typed_problems(model, x, f"{key}/{i}")
    return found + figure_problems(doc.get("figures_data", {}))


def _typed_problems(model: type[Record], value: Any, where: str) -> list[str]:
    """`where/field: message` for everything `model` refuses in `value`."""
    try:
        model.model_validate(value)
    except ValidationError as exc:
        return [f"{where}/{'/'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return []


def _shape_problems(where: str, matrix: list[list[Any]], rows: int | None, cols: int | None) -> list[str]:
    """`where: ...` if `matrix` is not `rows` x `cols` (None: any number, but every row alike)."""
    widths = {len(r) for r in matrix}
    if len(widths) > 1:
        return [f"{where}: rows of different lengths ({', '.join(map(str, sorted(widths)))})"]
    if rows is not None and (len(matrix), next(iter(widths))) != (rows, cols):
        return [f"{where}: {len(matrix)} x {next(iter(widths))}, not {rows} x {cols} (senders x receivers)"]
    return []


def figure_problems(fd: dict[str, Any]) -> list[str]:
    """Matrices of the figure data that do not fit their labels (the shapes are checked already)."""
    found = []
    for i, a in enumerate(fd.get("attention", [])):
        found += _shape_problems(f"figures_data/attention/{i}/pattern", a["pattern"], None, None)
    for mode, c in fd.get("composition", {}).items():
        for key in ("scores", "null_q99"):
            found += _shape_problems(f"figures_data/composition/{mode}/{key}", c[key], len(c["senders"]),
                                     len(c["receivers"]))
    return found


def load(doc: dict[str, Any], kinds: Mapping[str, KindInfo], checked: bool = False) -> Evidence:
    """The Evidence of a document (EvidenceFormatError listing the problems if invalid;
    `checked`: `problems` was run on it already and found none)."""
    found = [] if checked else problems(doc, kinds)
    if found:
        raise EvidenceFormatError("not a valid evidence document:\n" + "\n".join(found[:10]))
    d = upgrade(doc)
    claims = [ClaimResult(**dict(c, verdict=Verdict(c["verdict"]),
                                 details=kinds[c["kind"]].details.model_validate(c["details"]),
                                 pass_region=None if c.get("pass_region") is None
                                 else PassRegion.model_validate(c["pass_region"])))
              for c in d["claims"]]
    return Evidence(hypothesis=d["hypothesis"], model=d["model"], data=d["data"], settings=d["settings"],
                    baseline=d["baseline"], sanity_checks=[SanityCheck.model_validate(x) for x in d["sanity_checks"]],
                    claims=claims, provenance=d["provenance"],
                    weights_vs_use=[WeightsVsUseRow.model_validate(x) for x in d.get("weights_vs_use", [])],
                    figures_data=d.get("figures_data", {}), warnings=d.get("warnings", []),
                    ladder=[LadderRow.model_validate(x) for x in d.get("ladder", [])])
