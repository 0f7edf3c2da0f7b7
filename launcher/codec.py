"""One codec for the frozen plans: ``from_plain(cls, data)`` rebuilds a dataclass from what ``dataclasses.asdict``
and JSON made of it (plan.json), driven by the field types alone, so a field added to a plan needs no hand-written
reader. Nested dataclasses, ``tuple[X, ...]`` and fixed tuples (JSON gives lists), ``X | None``, ``list``, ``dict``
(values decoded by their type) and ``Any`` (kept as read) are handled; a field missing from ``data`` takes its
default, as an older plan.json written before the field existed. A leaf: it imports nothing of the launcher."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

__all__ = ["from_plain"]

T = TypeVar("T")


def from_plain(cls: type[T], data: dict[str, Any]) -> T:
    """``cls`` rebuilt from ``data`` (a dict of its fields, as asdict and JSON wrote them). A key that is not one of
    its fields is a TypeError, as ``cls(**data)`` would raise."""
    hints = _hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{key: _decode(hints[key], value) if key in known else value for key, value in data.items()})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The field types of ``cls``, resolved (the modules use ``from __future__ import annotations``); cached: a
    worker reads its plan once, but a test suite reads thousands."""
    return typing.get_type_hints(cls)


def _decode(tp: Any, value: Any) -> Any:
    """``value`` as the type ``tp`` says (only containers and dataclasses are rebuilt; scalars are as JSON read them)."""
    if value is None or tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _decode_union(args, value)
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return from_plain(tp, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value)) if args else tuple(value)
    if origin is list:
        return [_decode(args[0], v) for v in value] if args else list(value)
    if origin is dict:
        return {k: _decode(args[1], v) for k, v in value.items()} if args else dict(value)
    if tp is tuple:
        return tuple(value)
    return value


def _decode_union(args: tuple[Any, ...], value: Any) -> Any:
    """``A | None`` is A; a union of several types keeps a value one of its plain types already is, else decodes it
    by the first dataclass or container among them."""
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        return _decode(options[0], value)
    if any(isinstance(value, a) for a in options if isinstance(a, type) and not dataclasses.is_dataclass(a)):
        return value
    return _decode(options[0], value)
