"""The one way tests write hypothesis documents: `hypothesis(model, claims, ...)` builds the
mapping a hypothesis file holds (docs/hypothesis-format.md), `write(folder, doc)` saves it as
YAML.  Defaults are small and fast: the repeated-tokens generator, 20 prompts of segments of 8."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

GENERATOR = {"generator": "repeated_tokens", "n_prompts": 20, "segment_length": 8}


def hypothesis(model: str | Path, claims: list[dict[str, Any]], *, name: str = "h",
               data: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    """{harness: 1, name, model, data, claims} and any other top-level keys (`stats`, `metric`,
    `seed`, ...), in the order a file lists them."""
    doc: dict[str, Any] = {"harness": 1, "name": name, "model": str(model), "data": dict(data or GENERATOR)}
    doc.update(top)
    doc["claims"] = claims
    return doc


def write(folder: Path, doc: dict[str, Any], name: str | None = None) -> Path:
    """`doc` as folder/NAME.yaml (NAME: the document's name), keys in order."""
    path = Path(folder) / f"{name or doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
