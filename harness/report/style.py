"""One palette for verdicts, used by the HTML tables, the report figures and
the sweep figures."""

from __future__ import annotations

VERDICT_COLOURS = {"PASS": "#2e8b2e", "FAIL": "#c83232", "INCONCLUSIVE": "#d99a00"}  # markers, lines
VERDICT_BACKGROUNDS = {"PASS": "#d8f0d8", "FAIL": "#f8d0d0", "INCONCLUSIVE": "#f8e8c0"}  # table cells
