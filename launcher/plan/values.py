"""Numbers from the user: finite and in range, or one sentence naming the key, the value and the range."""

from __future__ import annotations

import math

_RANGES = {
    "positive": (lambda v: v > 0, "> 0"),
    "non_negative": (lambda v: v >= 0, ">= 0"),
    "non_positive": (lambda v: v <= 0, "<= 0"),
    "unit": (lambda v: 0 <= v < 1, "in [0, 1)"),
}


def number_problems(prefix: str, values: dict[str, tuple[float, str]]) -> list[str]:
    """One sentence per value that is not a finite number in its range: {name: (value, range)} with range one of
    positive, non_negative, non_positive, unit."""
    out = []
    for name, (value, rule) in values.items():
        ok, words = _RANGES[rule]
        if not (math.isfinite(value) and ok(value)):
            out.append(f"{prefix}.{name}={value} must be a finite number {words}.")
    return out
