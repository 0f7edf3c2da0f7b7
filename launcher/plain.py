"""``OmegaConf.to_container`` and ``OmegaConf.missing_keys`` at a tenth of their cost, for configs with thousands of
entries.

OmegaConf checks every value it hands out (typed access, missing, interpolation): about 5 us a value, so a recipe
with 10,000 ``tables.<name>`` entries of ten fields took half a second to convert, and planning converted it twice.
Most values of a composed config need none of that: they are stored as they will be returned. ``to_plain`` reads
them where OmegaConf stores them and hands every container that needs OmegaConf's care (an interpolation or, with
``throw_on_missing``, a missing value ``???`` in it; the container itself None, missing or an interpolation) to
OmegaConf.to_container, so the result, and any error raised, is the same. ``missing_keys`` likewise asks OmegaConf
about every value but a plain one (a container of nodes, or a value that is neither ``???`` nor an interpolation)."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from omegaconf import Container, OmegaConf

__all__ = ["missing_keys", "to_plain"]


class _NeedsOmegaConf(Exception):
    """A value in this container must be resolved (or checked) by OmegaConf."""


def to_plain(node: Container, resolve: bool = True, throw_on_missing: bool = False) -> Any:
    """What ``OmegaConf.to_container(node, resolve=resolve, throw_on_missing=throw_on_missing)`` returns: dicts and
    lists, structured configs as dicts, enums as enums."""
    content = node.__dict__["_content"]  # a DictConfig's dict of nodes, a ListConfig's list (OmegaConf 2.3)
    with suppress(_NeedsOmegaConf):
        if isinstance(content, dict):
            return {key: _value(child, resolve, throw_on_missing) for key, child in content.items()}
        if isinstance(content, list):
            return [_value(child, resolve, throw_on_missing) for child in content]
    return OmegaConf.to_container(node, resolve=resolve, throw_on_missing=throw_on_missing)


_IS_CONTAINER: dict[type, bool] = {}
"""Node class -> a DictConfig or ListConfig: isinstance(node, Container), an ABC's check, costs ~0.3 us a node."""


def _value(child: Any, resolve: bool, throw_on_missing: bool) -> Any:
    kind = type(child)
    container = _IS_CONTAINER.get(kind)
    if container is None:
        container = _IS_CONTAINER[kind] = issubclass(kind, Container)
    if container:
        return to_plain(child, resolve, throw_on_missing)
    value = child._value()
    if isinstance(value, str) and ("${" in value or (throw_on_missing and value == "???")):
        raise _NeedsOmegaConf  # its container goes through OmegaConf, which resolves or raises as it always did
    return value


def missing_keys(cfg: Container) -> set[str]:
    """What ``OmegaConf.missing_keys(cfg)`` returns: the dotted keys whose value is ``???``."""
    missing: set[str] = set()
    _gather_missing(cfg, missing)
    return missing


def _gather_missing(cfg: Container, missing: set[str]) -> None:
    content = cfg.__dict__["_content"]
    if isinstance(content, dict):
        children = content.items()
    elif isinstance(content, list):
        children = enumerate(content)
    else:  # None, ??? or an interpolation: OmegaConf.missing_keys finds no keys in it either
        return
    for key, child in children:
        if _IS_CONTAINER.get(type(child)) or isinstance(child, Container):
            if isinstance(child.__dict__["_content"], (dict, list)):
                _gather_missing(child, missing)
                continue
        else:
            value = child._value()
            if not (isinstance(value, str) and ("${" in value or value == "???")):
                continue
        # What OmegaConf.missing_keys does with each key (an interpolation resolves here, or raises)
        if OmegaConf.is_missing(cfg, key):
            missing.add(cfg._get_full_key(key))
        elif OmegaConf.is_config(cfg[key]):
            _gather_missing(cfg[key], missing)
