"""A module's place in a model's tree, by its dotted path (``towers.0.item_emb``): read it, or put another module
there. A leaf: the parallel parts, the table stores and the checks of your model all use it, and it imports nothing
of theirs (no torch either: it reads ``_modules`` and calls the model's own ``get_submodule``)."""

from __future__ import annotations

from typing import Any


def held_module(model: Any, path: str) -> Any:
    """The module at ``path`` in ``model``, or None when the model does not hold it (a pipeline stage whose other
    stages' layers were removed)."""
    node = model
    for part in path.split("."):
        node = node._modules.get(part) if node is not None else None
    return node


def set_module(model: Any, path: str, module: Any) -> None:
    """Put ``module`` (or None) at ``path`` in ``model``."""
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)
