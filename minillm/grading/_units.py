"""The units slip every timing exercise meets: milliseconds where seconds are asked (or the
reverse). A factor of about 1000 between the learner's number and the expected one is that
slip, whatever else is wrong, so checkers name it before any other diagnosis."""
from __future__ import annotations

import math


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def thousand_off(got, expected, tolerance: float = 0.05) -> int:
    """1000 if got is about expected * 1000, -1000 if about expected / 1000, else 0; a factor
    of 1000 within `tolerance` (relative), so a units slip on top of a small error still shows."""
    if not (_number(got) and _number(expected)) or expected == 0 or got == 0:
        return 0
    ratio = got / expected
    if abs(ratio / 1e3 - 1) <= tolerance:
        return 1000
    if abs(ratio * 1e3 - 1) <= tolerance:
        return -1000
    return 0


def units_hint(got, expected, asked: str = "seconds", tolerance: float = 0.05) -> str:
    """A units message ("That is milliseconds: ...") when got is ~1000 times off expected, else ""."""
    factor = thousand_off(got, expected, tolerance)
    if factor == 1000 and asked == "seconds":
        return "That is milliseconds, 1000 times the seconds asked for: return seconds. "
    if factor == -1000 and asked == "seconds":
        return "That is 1000 times too small: return seconds (a conversion too many?). "
    if factor == -1000 and asked == "milliseconds":
        return "That is seconds, 1000 times too small: every number here is in milliseconds. "
    if factor == 1000 and asked == "milliseconds":
        return "That is 1000 times the milliseconds asked for (microseconds?): return milliseconds. "
    return ""
