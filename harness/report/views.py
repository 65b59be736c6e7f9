"""How a claim's result reads in a report: the view of its kind (claims.view.ClaimView).

Every kind carries its view (`ClaimKind.view`), registered with it in one place
(claims.registry); a result of a kind this process has not registered (an evidence.json
written with a plugin that is not loaded) reads with `ClaimView`'s defaults.
"""

from __future__ import annotations

from ..claims import registry
from ..claims.view import ClaimView

DEFAULT = ClaimView()


def get(kind: str) -> ClaimView:
    """The view of claim kind `kind` (ClaimView's defaults for a kind not registered)."""
    found = registry.KINDS.find(kind)
    return found.view if found is not None else DEFAULT
