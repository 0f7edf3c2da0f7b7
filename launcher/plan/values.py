"""Numbers from the user: finite and in range, or one sentence naming the key, the value and the range."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


def _wild_numbers(node: Any, prefix: str, out: list[tuple[str, float]]) -> None:
    """Appends (dotted key, number) for every int and float under the container node (bools are no numbers) that no
    rank could use. A config may hold 100,000 numbers: plain ints and floats are checked without building their keys
    or a generator for each."""
    if isinstance(node, Mapping):
        items, dotted = node.items(), (lambda k: f"{prefix}.{k}" if prefix else str(k))
    else:
        items, dotted = enumerate(node), (lambda i: f"{prefix}[{i}]")
    for k, value in items:
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):
                out.append((dotted(k), value))
        elif kind is int:
            if not -INT64 <= value < INT64:
                out.append((dotted(k), value))
        elif kind in (str, bool, type(None)):
            continue
        elif kind in (dict, list) or _nested(value):
            _wild_numbers(value, dotted(k), out)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and _is_wild(value):
            out.append((dotted(k), value))  # a subclass of int or float (an IntEnum)


def _nested(value: Any) -> bool:
    return isinstance(value, Mapping) or (isinstance(value, Sequence) and not isinstance(value, str))


def _is_wild(value: float) -> bool:
    return not math.isfinite(value) if isinstance(value, float) else not -INT64 <= value < INT64


def wild_number_problems(config: Mapping[str, Any], named: str = "") -> list[str]:
    """One sentence per number anywhere in config (a plain container) that no rank could use: a float that is
    nan or infinite, an integer outside int64. Keys already named in ``named`` (earlier problems) are skipped."""
    wild: list[tuple[str, float]] = []
    _wild_numbers(config, "", wild)
    out = []
    for key, value in wild:
        if f"{key}=" in named:
            continue
        if isinstance(value, float):
            out.append(f"{key}={value} must be a finite number. Give a number such as {key}=1.0.")
        else:
            out.append(f"{key}={value} is too large: numbers reach torch as 64-bit integers (|value| < 2**63).")
    return out
