"""evidence.json as a document: writing it, reading it back, validating it.

* `to_json(doc)`: pretty-printed JSON; NaN and infinities become null.
* `problems(doc, kinds)`: everything wrong with a document: the shape, against
  the shipped JSON Schema (`evidence.schema.json`), then each claim's details
  against its kind's typed model, and its evidence type against its kind's.
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
from .details import Details, LadderRow, SanityCheck, WeightsVsUseRow
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
    """The document as written to disk (2-space indentation, NaN as null)."""
    return json.dumps(finite(doc), indent=2) + "\n"


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
            the `tests` of its claims (an old row becomes a row with its one test)."""
    version = doc.get("schema_version")
    if version == SCHEMA_VERSION:
        return doc
    out = dict(doc, schema_version=SCHEMA_VERSION)
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


def problems(doc: Any, kinds: Mapping[str, KindInfo]) -> list[str]:
    """Everything wrong with an evidence document ([] when it is valid)."""
    found = json_schema_problems(doc, schema())
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
        try:
            kind.details.model_validate(c["details"])
        except ValidationError as exc:
            found += [f"claims/{i}/details/{'/'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return found


def load(doc: dict[str, Any], kinds: Mapping[str, KindInfo]) -> Evidence:
    """The Evidence of a document (EvidenceFormatError listing the problems if invalid)."""
    found = problems(doc, kinds)
    if found:
        raise EvidenceFormatError("not a valid evidence document:\n" + "\n".join(found[:10]))
    d = upgrade(doc)
    claims = [ClaimResult(**dict(c, verdict=Verdict(c["verdict"]),
                                 details=kinds[c["kind"]].details.model_validate(c["details"])))
              for c in d["claims"]]
    return Evidence(hypothesis=d["hypothesis"], model=d["model"], data=d["data"], settings=d["settings"],
                    baseline=d["baseline"], sanity_checks=[SanityCheck.model_validate(x) for x in d["sanity_checks"]],
                    claims=claims, provenance=d["provenance"],
                    weights_vs_use=[WeightsVsUseRow.model_validate(x) for x in d.get("weights_vs_use", [])],
                    figures_data=d.get("figures_data", {}), warnings=d.get("warnings", []),
                    ladder=[LadderRow.model_validate(x) for x in d.get("ladder", [])])
