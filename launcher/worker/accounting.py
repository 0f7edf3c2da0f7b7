"""Where the bytes really are: the real tensors of the engine and the tables, by owner and planned location; and the
bytes autograd saves for the backward (``SavedActivations``: what recompute trades for compute).

Written to rank.N/memory.json after the first step (optimizer states exist from then on) so that the plan's
estimate can be checked against the run. Each entry also lists the torch device types seen, so a placement that
silently fell back (a host table on cuda, offload not applied) shows up.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn

from launcher.parallel.rank import local_tensor

KINDS = ("params", "optimizer", "tables", "table_states")


def _nbytes(t: torch.Tensor) -> int:
    t = local_tensor(t)  # a DTensor: this rank's shard
    return t.numel() * t.element_size()


def measure_memory(engine, tables, placement) -> dict:
    """{"host"|"device": {kind: bytes}, "devices": {kind: [torch device types]}, "offload": {...}} for this rank."""
    where: dict[str, dict[str, int]] = {"host": dict.fromkeys(KINDS, 0), "device": dict.fromkeys(KINDS, 0)}
    devices: dict[str, set[str]] = defaultdict(set)

    def add(location: str, kind: str, t: torch.Tensor) -> None:
        where[location][kind] += _nbytes(t)
        devices[kind].add(t.device.type)

    module_params = list(engine.module.parameters())
    module_ids = {id(p) for p in module_params}
    for p in module_params:
        partition = getattr(p, "ds_tensor", None)  # ZeRO-3 keeps only this rank's partition
        add(placement.param_location, "params", partition if partition is not None else p)
    opt = engine.optimizer
    base = getattr(opt, "optimizer", opt)  # DeepSpeed's ZeRO/bf16 wrappers hold the torch optimizer
    masters = {}  # DeepSpeed's fp32 master partitions (ZeRO-3 swaps them into param_groups only during step)
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition"):
        for t in getattr(opt, attr, None) or []:
            if torch.is_tensor(t):
                masters[id(t)] = t
    for group in base.param_groups:
        for p in group["params"]:
            if id(p) not in module_ids:
                masters[id(p)] = p
    for t in masters.values():
        add(placement.optimizer_location, "optimizer", t)
    for state in base.state.values():
        for v in state.values():
            if torch.is_tensor(v) and v.dim() > 0:
                add(placement.optimizer_location, "optimizer", v)
    per_table = {}
    if tables is not None:
        engine_ids = {p.data_ptr() for p in module_params}
        for name, (location, weight, states) in tables.held().items():
            add(location, "tables", weight)
            for s in states:
                add(location, "table_states", s)
            per_table[name] = {
                "planned": location,
                "torch_device": weight.device.type,
                "state_devices": sorted({s.device.type for s in states}),
                "in_engine": weight.data_ptr() in engine_ids,
            }
    # What DeepSpeed's ZeRO optimizer actually switched on (stage 1/2: cpu_offload; stage 3: offload_*).
    offload = {
        "optimizer": bool(getattr(opt, "cpu_offload", False) or getattr(opt, "offload_optimizer", False)),
        "params": bool(getattr(opt, "offload_param", False)),
    }
    return {**where, "devices": {k: sorted(v) for k, v in devices.items()}, "offload": offload, "tables": per_table}


def _storage(t: torch.Tensor):
    """The storage of a tensor, or of this rank's shard of a DTensor (which has none of its own)."""
    return local_tensor(t).untyped_storage()


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
