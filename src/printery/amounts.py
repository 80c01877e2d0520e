"""Cost amounts as text (``trace``, ``cost``, the console): a sum of floats carries their
noise (``0.00014000000000000001`` usd for two calls) and ``:g`` turns a million tokens
into ``1e+06``; neither is what a reader wants to see. JSON output keeps the numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["amount", "amounts"]

#: Significant digits of an amount that is not a whole number.
DIGITS = 6


def amount(value: object) -> str:
    """A whole number in full (token counts), any other number to :data:`DIGITS`
    significant digits without an exponent from a million up (cents stay cents), and what
    is not a number as it is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value.is_integer():
        return str(int(value))
    text = f"{value:.{DIGITS}g}"
    return f"{value:.2f}" if "e+" in text else text


def amounts(cost: Mapping[str, object] | None, *, joiner: str = ",", between: str = "=") -> str:
    """``unit=amount`` pairs in the mapping's order ("" for none)."""
    return joiner.join(f"{unit}{between}{amount(value)}" for unit, value in (cost or {}).items())
