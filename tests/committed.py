"""Comparing a run's evidence with a committed one for what its numbers mean, not for
their float bits.

float32 results differ in the last digits between CPUs (AVX2 / AVX-512 kernels, MKL's
code paths, the reduction order a thread count gives): a claim value of -3.896e-05 came
out as -3.8961e-05 on one machine and -3.8962e-05 on another.  A comparison of committed
outputs has to hold on every machine and still catch a real change, so:

* **exactly**: every text field (ids, kinds, verdicts, reasons, rules, ladder entries,
  weights-vs-use classes, warnings, sanity checks), every integer (counts, prompt
  counts, ranks, token ids), every boolean, None and the structure (the same keys,
  the same list lengths);
* **numbers, absolutely, on their own scale**: |a - b| <= TOL x scale, TOL = 1e-4.
  The scale is the committed run's mean clean-corrupted gap (at least 1) for numbers
  in the metric's own units (nats or logits: metric means, raw changes, the gap, the
  no-information baseline, claim values in those units) and 1 for every other number
  (normalised effects and faithfulness are fractions of the gap; attention weights,
  composition and copying scores, shares and p-values live on [0, 1]).  The reports
  print these numbers at three decimals and decide verdicts at bounds set to two, so
  1e-4 of the scale is a tenth of the last printed digit; kernel differences move
  them by 1e-10 to 1e-6 of the scale.  Never a relative tolerance: a value near zero
  (an unused edge's effect) would make any relative test as strict as float bits.
* **per-prompt normalised values** (a fraction-of-gap or faithfulness claim's
  `per_prompt` and the medians and quartiles of them): each is d_n / g_n, divided by
  its own prompt's gap, which may be as small as `min_prompt_gap`; an error of
  TOL x scale in d_n becomes TOL x scale / min_prompt_gap in the ratio, and that is
  their tolerance (measured: a per-prompt value of 58.9, from a prompt with a gap
  near min_prompt_gap, moved by 1.4e-3 under MKL_CBWR=COMPATIBLE).
* **numerals inside text** (rules, reasons, report.md): the text around them exactly
  (runs of spaces and of table-rule dashes collapsed, since padding follows the
  widths of the numbers); a numeral without a decimal point or exponent (a count, a
  head index) exactly; any other numeral to one unit of its last printed digit or
  TOL x the metric scale, whichever is larger (a value rounded on either side of a
  rounding boundary, or a noise level such as the identity check's max |diff|).

The exact oracles of the other tests (float64 references computed the same way on the
same machine) are not compared this way; this module is for numbers stored in the
repository, and for two runs of the same model on different workers.
"""

from __future__ import annotations

import math
import re
from typing import Any

TOL = 1e-4

# details keys whose numbers are in the metric's units (everything under `baseline` is too)
METRIC_KEYS = frozenset({
    "clean_metric_mean", "patched_metric_mean", "corrupted_metric_mean", "ablated_metric_mean",
    "full_metric_mean", "circuit_metric_mean", "empty_metric_mean", "baseline_metric", "gap_mean",
    "kept_gap_mean", "change_mean", "change_ci", "change_summary", "drop_mean", "drop_ci", "drop_summary",
    "no_information", "baseline"})
METRIC_UNITS = frozenset({"nats", "logits"})
CLAIM_NUMBERS = frozenset({"value", "ci", "per_prompt"})
RATIO_UNITS = frozenset({"fraction of gap", "faithfulness"})  # per-prompt values are d_n / g_n
PER_PROMPT_RATIOS = frozenset({"per_prompt", "normalized_summary", "faithfulness_summary",
                               "random_faithfulness_summary", "baseline_normalized_summary"})
# a numeral: optional sign, digits, optional decimals, optional exponent; not part of a word
# (L0H7, a sha256 and step-00250's letters stay in the text, compared exactly)
NUMERAL = re.compile(r"(?<![\w.])[-\u2212]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w)")


def metric_scale(doc: dict) -> float:
    """The scale of numbers in the metric's units: the committed run's mean gap, at least 1."""
    gap = (doc.get("baseline") or {}).get("gap") or {}
    mean = gap.get("mean") if isinstance(gap, dict) else None
    return max(1.0, abs(float(mean))) if isinstance(mean, int | float) else 1.0


def comparable(doc: dict) -> dict:
    """An evidence document without what differs from run to run by design: the provenance
    (versions, command, times, host) and the figures' file list."""
    return {k: v for k, v in doc.items() if k not in ("provenance",)}


class Mismatch(AssertionError):
    """Where two documents differ, and by how much."""


def min_prompt_gap(doc: dict) -> float:
    """The smallest per-prompt gap a normalised per-prompt value can have (settings.stats)."""
    st = (doc.get("settings") or {}).get("stats") or {}
    value = st.get("min_prompt_gap") if isinstance(st, dict) else None
    return float(value) if isinstance(value, int | float) and value > 0 else 0.1


def assert_matches(committed: Any, fresh: Any, scale: float, where: str = "evidence",
                   prompt_gap: float | None = None) -> None:
    """Raise Mismatch at the first place `fresh` differs from `committed` under the module's rule.
    `scale` is metric_scale(committed), `prompt_gap` min_prompt_gap(committed) (when the
    documents are whole evidence documents it is read from them)."""
    if prompt_gap is None:
        prompt_gap = min_prompt_gap(committed) if isinstance(committed, dict) else 0.1
    _compare(committed, fresh, scale, where, 1.0, prompt_gap)


def _compare(a: Any, b: Any, scale: float, where: str, factor: float, prompt_gap: float) -> None:
    """`factor`: the scale of the numbers at this place (1, the metric scale, or the metric
    scale over min_prompt_gap for per-prompt ratios)."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            raise Mismatch(f"{where}: keys differ: {sorted(a) if isinstance(a, dict) else a!r} vs "
                           f"{sorted(b) if isinstance(b, dict) else b!r}")
        unit = a.get("unit")
        for k in a:
            here = factor
            if k in METRIC_KEYS or (unit in METRIC_UNITS and k in CLAIM_NUMBERS):
                here = max(here, scale)
            elif k in PER_PROMPT_RATIOS and (unit in RATIO_UNITS or k != "per_prompt"):
                here = max(here, scale / prompt_gap)
            _compare(a[k], b[k], scale, f"{where}.{k}", here, prompt_gap)
        return
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            raise Mismatch(f"{where}: lengths differ: {len(a)} vs {len(b) if isinstance(b, list) else b!r}")
        for i, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, scale, f"{where}[{i}]", factor, prompt_gap)
        return
    if isinstance(a, float) and isinstance(b, int | float) and not isinstance(b, bool):
        tol = TOL * factor
        if not (math.isfinite(a) and math.isfinite(b)):
            if not (a == b or (math.isnan(a) and math.isnan(b))):
                raise Mismatch(f"{where}: {a!r} != {b!r}")
        elif abs(a - b) > tol:
            raise Mismatch(f"{where}: {a!r} != {b!r} (|diff| {abs(a - b):.3g} > tolerance {tol:.3g})")
        return
    if isinstance(a, str) and isinstance(b, str):
        assert_text_matches(a, b, scale, where)
        return
    if type(a) is not type(b) or a != b:
        raise Mismatch(f"{where}: {a!r} != {b!r}")


def _skeleton(text: str) -> tuple[str, list[str]]:
    numerals = NUMERAL.findall(text)
    rest = NUMERAL.sub("#", text)
    rest = re.sub(r"-{3,}", "---", rest)
    return re.sub(r"[ \t\u00a0]+", " ", rest), numerals


def _last_digit(numeral: str) -> float:
    """One unit of the numeral's last printed digit (1.6e-19 -> 1e-20; 0.205 -> 0.001)."""
    mantissa, _, exponent = numeral.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def assert_text_matches(a: str, b: str, scale: float, where: str = "text") -> None:
    """The text around numerals equal; numerals as the module's rule says."""
    (sa, na), (sb, nb) = _skeleton(a), _skeleton(b)
    if sa != sb or len(na) != len(nb):
        raise Mismatch(f"{where}: text differs:\n  {a!r}\n  {b!r}")
    for x, y in zip(na, nb):
        exact = not any(c in x + y for c in ".eE")
        if exact:
            if x.replace("\u2212", "-") != y.replace("\u2212", "-"):
                raise Mismatch(f"{where}: {x} != {y} in\n  {a!r}\n  {b!r}")
            continue
        fx, fy = (float(s.replace("\u2212", "-")) for s in (x, y))
        allowed = max(_last_digit(x), _last_digit(y), TOL * scale) * (1 + 1e-9)
        if abs(fx - fy) > allowed:
            raise Mismatch(f"{where}: {x} != {y} (more than {allowed:.3g} apart) in\n  {a!r}\n  {b!r}")
