"""What ``runtime.log`` accepts, checked in the rank before anything is all-reduced or written: a step that is an
int >= 0, numbers (or one-element tensors) as values, no key the launcher writes itself."""

from __future__ import annotations

import operator
import reprlib
from contextlib import suppress
from typing import Any

import torch


RESERVED = ("event", "time", "wall_s", "local_loss")
"""Keys of a metrics.jsonl record the launcher writes itself, so no value logged with runtime.log takes them."""


def checked_log_args(step: Any, loss: Any, values: dict[str, Any]) -> tuple[int, Any, dict[str, Any]]:
    """(step as an int, loss and each value as a float or a one-element tensor) of a runtime.log call; TypeError or
    ValueError naming the argument otherwise, raised in the rank (before the loss is all-reduced)."""
    try:
        index = None if isinstance(step, bool) else operator.index(step)  # an int, a numpy int, an int tensor's one
    except TypeError:
        index = None
    if index is None:
        raise TypeError(f"runtime.log(step={reprlib.repr(step)}): step must be an int >= 0 (the number of the step "
                        f"just finished), not {type(step).__name__}")
    step = index
    if step < 0:
        raise ValueError(f"runtime.log(step={step}): step must be an int >= 0 (the number of the step just finished)")
    taken = [k for k in values if k in RESERVED]
    if taken:
        raise ValueError(f"runtime.log({taken[0]}=...): {taken[0]} is a name the launcher writes in metrics.jsonl "
                         f"itself ({', '.join(RESERVED)}); log it under another name, e.g. my_{taken[0]}=...")
    return step, None if loss is None else _number("loss", loss), {k: _number(k, v) for k, v in values.items()}


def _number(name: str, value: Any) -> float | torch.Tensor:
    """A value of runtime.log: a real number (int, float, a numpy scalar) as a float, or a tensor of one element."""
    if torch.is_tensor(value):
        if value.numel() != 1 or value.is_complex():
            raise ValueError(f"runtime.log({name}=<tensor of shape {tuple(value.shape)}, {value.dtype}>): {name} "
                             f"must be one real number; log e.g. {name}=t.mean() or {name}=t[0]")
        return value
    if not isinstance(value, (str, bytes, complex)) and hasattr(value, "__float__"):
        with suppress(TypeError, ValueError):
            return float(value)
    raise TypeError(f"runtime.log({name}={reprlib.repr(value)}): {name} must be a number (int, float or a "
                    f"one-element tensor), not {type(value).__name__}")
