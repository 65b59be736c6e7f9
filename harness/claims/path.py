"""Claim kind `path`: patching a multi-hop route moves the metric (`used`) or does
not (`unused`) (causal evidence; path patching, mech.edges.paths).

`path: L0H7 -> L1H5.k -> L2H3.q` carries the first node's change to each hop only
through its listed input; only the last hop's changed output enters the residual
stream (mech.edges.paths states the arithmetic).  Everything else is the edge claim's
(claims.edge): the same keys, per-prompt changes, normalised effect, sign-flip
p-values (Benjamini-Hochberg adjusted over the file's path claims), use status,
verdict rules and report lines.  A path of one hop is an edge, with exactly the
edge claim's numbers.  Non-vacuity is measured where the first hop reads the
sender's change.  Paths have no weights-vs-use rows (composition scores are
between two heads).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..spec import names
from ..spec.fields import PathName
from .base import Context, Indexed
from .edge import EdgeKind, RouteClaim, Routes


class PathClaim(RouteClaim):
    """Patching a path moves the metric (used) or not (unused)."""

    kind: Literal["path"]
    path: PathName  # sender -> hop -> ... -> receiver (names.parse_path)

    @property
    def route(self) -> names.Path:
        return self.path


class PathKind(EdgeKind):
    name = "path"
    spec = PathClaim
    summary = "patching a multi-hop path (path patching) moves the metric, or does not"

    def route_rows(self, claims: Sequence[Indexed[RouteClaim]], ctx: Context) -> Routes:
        """Paths have no weights-vs-use rows."""
        return Routes([], {})


KIND = PathKind()
