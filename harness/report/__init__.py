"""Rendering evidence: report.md, a self-contained report.html, figures/*.png,
and writing report folders atomically.  Everything here is drawn from the
evidence document alone (what `harness report` re-renders)."""
