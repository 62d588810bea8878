"""Argument checks shared by every public entry point.

One place decides what counts as an integer (Python and numpy integers, never
a bool), what a number is (finite unless said otherwise) and how an error
reads: "name=value: must be ... (try ...)", so that a learner who passes a
bad argument is told which one, what it was and what would work.

A value of the wrong type raises ArgumentTypeError, which is both a TypeError
(what Python raises for a wrong type) and a ValueError (what the rest of the
package raises for a bad argument): callers may catch either.
"""
from __future__ import annotations

import math
from numbers import Integral, Real


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (catch it as TypeError or ValueError)."""


def _message(name: str, value, rule: str, hint: str | None) -> str:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"{name}={shown}: {rule}" + (f" (try {hint})" if hint else "")


def is_int(value) -> bool:
    """True for Python and numpy integers; False for bools and everything else."""
    return type(value) is int or (isinstance(value, Integral) and not isinstance(value, bool))


def _range_rule(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f"in [{minimum}, {maximum}]"
    if minimum is not None:
        return f">= {minimum}"
    if maximum is not None:
        return f"<= {maximum}"
    return ""


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None, *,
              allow_none: bool = False, hint: str | None = None) -> int | None:
    """An integer in [minimum, maximum], returned as a Python int."""
    if type(value) is int and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return value          # the common case, first: the cost model checks every step's shape
    if value is None and allow_none:
        return None
    bounds = _range_rule(minimum, maximum)
    rule = "must be an integer" + (f" {bounds}" if bounds else "") + (" or None" if allow_none else "")
    if not is_int(value):
        raise ArgumentTypeError(_message(name, value, rule, hint))
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(_message(name, value, rule, hint))
    return value


def check_real(name: str, value, minimum: float | None = None, maximum: float | None = None, *,
               exclusive_minimum: bool = False, allow_inf: bool = False, allow_none: bool = False,
               hint: str | None = None) -> float | None:
    """A real number (not a bool, not NaN; finite unless allow_inf) in range, as a float."""
    if value is None and allow_none:
        return None
    low = "" if minimum is None else (f"> {minimum}" if exclusive_minimum else f">= {minimum}")
    high = "" if maximum is None else f"<= {maximum}"
    bounds = " and ".join(b for b in (low, high) if b)
    kind = "a number" if allow_inf else "a finite number"
    rule = f"must be {kind}" + (f" {bounds}" if bounds else "") + (" or None" if allow_none else "")
    if not isinstance(value, Real) or isinstance(value, bool):
        raise ArgumentTypeError(_message(name, value, rule, hint))
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(_message(name, value, rule, hint))
    if minimum is not None and (value < minimum or (exclusive_minimum and value == minimum)):
        raise ValueError(_message(name, value, rule, hint))
    if maximum is not None and value > maximum:
        raise ValueError(_message(name, value, rule, hint))
    return value


def check_bool(name: str, value, hint: str | None = None) -> bool:
    """True or False (numpy bools too); never a truthy string such as 'no'."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    raise ArgumentTypeError(_message(name, value, "must be True or False", hint))


def check_choice(name: str, value, choices, hint: str | None = None):
    """One of `choices` (compared with ==)."""
    choices = tuple(choices)
    # Compare only values of the choice's own type: an array's == is not a bool.
    if any(type(value) is type(choice) and value == choice for choice in choices):
        return value
    raise ValueError(_message(name, value, f"unknown; choose one of {choices}", hint))


def check_instance(name: str, value, cls, what: str, hint: str | None = None):
    """An instance of cls; `what` says in words what is expected."""
    if not isinstance(value, cls):
        raise ArgumentTypeError(_message(name, value, f"must be {what}, got {type(value).__name__}", hint))
    return value


def check_int_sequence(name: str, values, minimum: int | None = None, maximum: int | None = None, *,
                       hint: str | None = None) -> tuple[int, ...]:
    """A list or tuple of integers in range (a bare int or a string is refused,
    so `stop_token_ids=5` does not silently mean something else)."""
    if not isinstance(values, (list, tuple)) and type(values).__name__ != "ndarray":
        raise ArgumentTypeError(_message(name, values, "must be a list of integers", hint or "[5]"))
    return tuple(check_int(f"{name}[{i}]", v, minimum, maximum, hint=hint) for i, v in enumerate(values))
