"""Numbers from the user: finite and in range, or one sentence naming the key, the value and the range."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_RANGES = {
    "positive": (lambda v: v > 0, "> 0"),
    "non_negative": (lambda v: v >= 0, ">= 0"),
    "non_positive": (lambda v: v <= 0, "<= 0"),
    "unit": (lambda v: 0 <= v < 1, "in [0, 1)"),
}

INT64 = 2**63
"""Integers reach torch (seeds, sizes, steps) as int64: |v| < 2**63."""


def number_problems(prefix: str, values: dict[str, tuple[float, str]]) -> list[str]:
    """One sentence per value that is not a finite number in its range: {name: (value, range)} with range one of
    positive, non_negative, non_positive, unit."""
    out = []
    for name, (value, rule) in values.items():
        ok, words = _RANGES[rule]
        if not (math.isfinite(value) and ok(value)):
            out.append(f"{prefix}.{name}={value} must be a finite number {words}.")
    return out


def _numbers(node: Any, prefix: str) -> Iterator[tuple[str, float]]:
    """(dotted key, number) of every int and float under node (bools are no numbers)."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _numbers(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, Sequence) and not isinstance(node, str):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{prefix}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix, node


def wild_number_problems(config: Mapping[str, Any], named: str = "") -> list[str]:
    """One sentence per number anywhere in config (a plain container) that no rank could use: a float that is
    nan or infinite, an integer outside int64. Keys already named in ``named`` (earlier problems) are skipped."""
    out = []
    for key, value in _numbers(config, ""):
        if f"{key}=" in named:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            out.append(f"{key}={value} must be a finite number. Give a number such as {key}=1.0.")
        elif isinstance(value, int) and not -INT64 <= value < INT64:
            out.append(f"{key}={value} is too large: numbers reach torch as 64-bit integers (|value| < 2**63).")
    return out
