"""Recompute (activation checkpointing, MindSpore's ``cell.recompute()``) and what it saves, measured.

``apply_recompute`` runs each named layer under ``torch.utils.checkpoint`` (non-reentrant): its forward keeps only
its inputs, and the backward runs it again (ZeRO-3 keeps a little more: its own hooks save tensors too). The RNG state is replayed, so dropout gives the same masks and the
losses are the same as without. ``SavedActivations`` counts the bytes autograd keeps for the backward during a
forward (``torch.autograd.graph.saved_tensors_hooks``), parameters left out: what recompute trades for compute.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def apply_recompute(layers: list[tuple[str, nn.Module]], names: tuple[str, ...]) -> None:
    """Run the layers called ``names`` (of the recipe's ``layers()``) under activation checkpointing, in place."""
    chosen = [(n, m) for n, m in layers if n in names]
    for _, module in chosen:
        forward = module.forward

        def run(*args: Any, _forward=forward, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
            return _forward(*args, **kwargs)

        module.forward = run


def _storage(t: torch.Tensor):
    """The storage of a tensor, or of this rank's shard of a DTensor (which has none of its own)."""
    return getattr(t, "_local_tensor", t).untyped_storage()


class SavedActivations:
    """Within ``with``: the bytes of the tensors autograd saves for backward, parameters excluded."""

    def __init__(self, model: nn.Module) -> None:
        self._params = {_storage(p).data_ptr() for p in model.parameters()}
        self._seen: set[tuple[int, int]] = set()
        self._kept: list[torch.Tensor] = []  # alive until exit: a freed storage's address is not reused meanwhile
        self.bytes = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = _storage(t)
        key = (storage.data_ptr(), storage.nbytes())
        if storage.data_ptr() not in self._params and key not in self._seen:  # a storage saved twice counts once
            self._seen.add(key)
            self._kept.append(t)
            self.bytes += storage.nbytes()
        return t

    def __enter__(self) -> SavedActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._kept.clear()
