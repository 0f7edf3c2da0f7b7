"""Where the bytes really are: the real tensors of the engine and the tables, by owner and planned location; and the
bytes autograd saves for the backward (``SavedActivations``: what recompute trades for compute).

Written to rank.N/memory.json after the first step (optimizer states exist from then on) so that the plan's
estimate can be checked against the run. Each entry also lists the torch device types seen, so a placement that
silently fell back (a host table on cuda, offload not applied) shows up.

What the plan's estimate is checked against: the rank's peak memory (``measure_peak``: its peak resident set, its RSS
at start and after the build, the device's max reserved and allocated), written with the first step's record and
again at the end of the run, and torch's own per-category split of the first step's peak (``StepTracker``)."""

from __future__ import annotations

import os
import resource
import warnings
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from launcher.parallel.rank import local_tensor
from launcher.procfs import kernel_field

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
    for t in _masters(opt, base, module_ids):
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


def _masters(opt, base, module_ids: set[int]) -> list[torch.Tensor]:
    """The optimizer's own copies of the parameters: DeepSpeed's fp32 master partitions (ZeRO-3 swaps them into
    param_groups only during step) and any param_groups tensor that is not one of the module's parameters."""
    masters = {}
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition"):
        for t in getattr(opt, attr, None) or []:
            if torch.is_tensor(t):
                masters[id(t)] = t
    for group in base.param_groups:
        for p in group["params"]:
            if id(p) not in module_ids:
                masters[id(p)] = p
    return list(masters.values())


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


# -- what the estimate is checked against ----------------------------------------------------------------------------
def resident_bytes() -> int:
    """This process's resident set now, in bytes (/proc/self/statm; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_resident_bytes() -> int:
    """This process's peak resident set in bytes: VmHWM of /proc/self/status. Not getrusage's ru_maxrss, which Linux
    carries over from the parent across vfork + exec (how Python's subprocess starts a rank), so that a rank's
    ru_maxrss is never below the launcher's RSS when it started the rank. ru_maxrss (KiB on Linux) where there is no
    /proc."""
    return kernel_field("/proc/self/status", "VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_peak(marks: dict[str, int], device: torch.device, step: int) -> dict[str, Any]:
    """memory.json's "peak", in bytes: "rss" the rank's peak resident set so far, "rss_at_start" its RSS once the
    imports, the process group and the mesh are up (the runtime's own), "rss_after_build" once the model, engine and
    tables are built (both None when not marked), "device_max_reserved" / "device_max_allocated" torch.cuda's peaks
    on a cuda device (None elsewhere), "step" the last step it covers."""
    cuda = device.type == "cuda"
    return {
        "rss": peak_resident_bytes(),
        "rss_at_start": marks.get("rss_at_start"),
        "rss_after_build": marks.get("rss_after_build"),
        "device_max_reserved": torch.cuda.max_memory_reserved(device) if cuda else None,
        "device_max_allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
        "step": step,
    }


TRACKER_CATEGORIES = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients",
                      "Activation": "activations", "Optstate": "optimizer_states", "Temp": "temporaries",
                      "Other": "other", "Total": "total"}
"""MemTracker's categories (torch.distributed._tools.mem_tracker._MemRefType) as memory.json names them."""


class StepTracker:
    """Within ``with``: torch's MemTracker over one optimizer step; ``split`` is then {device: {category: bytes}} at
    the step's peak (None where this torch has no MemTracker).

    MemTracker is a TorchDispatchMode: it sees every op's output tensors on any device (CPU included) and labels them
    by module and optimizer hooks it sets only while it is entered, so the steps after it run as before. Tensors made
    before the step are given to it: the module's parameters and buffers, the optimizer's states and master copies,
    and the tables outside the engine with their states ("other"). It counts a storage's whole size when it is made,
    as a device's allocator does, not the pages a host touches: on CPU, DeepSpeed ZeRO-1/2's gradient bucket
    (``torch.empty(reduce_bucket_size)``, 2 GB in fp32 by default) counts whole under "temporaries" while hardly any
    of it is resident. It refuses a second forward of the root module in one context, so the Trainer calls
    ``next_micro_batch`` before each micro-batch; a pipeline's schedule runs its micro-batches itself: not tracked.

    Opt-in (HL_MEMORY_TRACKER=1 in the launcher's environment): it leaves the losses bit-identical (DDP, FSDP2, tensor
    parallel, recompute, grad_accum, DeepSpeed ZeRO 1-3 and offload, bf16), but it costs what it would measure: the
    rank's peak RSS rises by 6-13 MiB (1.5-3.5 % on wide_deep, gpt, resnet: a Python call per op fragments the heap)
    and its first step takes 5-12 times as long (resnet: +3 s)."""

    def __init__(self, engine, tables) -> None:
        self.split: dict[str, dict[str, int]] | None = None
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
        except ImportError:
            self._tracker = None
            return
        self._tracker = MemTracker()
        self._tracker.track_external(engine.module)
        opt = getattr(engine, "optimizer", None)
        base = getattr(opt, "optimizer", opt)
        if isinstance(base, torch.optim.Optimizer):
            self._tracker.track_external(base, *_masters(opt, base, {id(p) for p in engine.module.parameters()}))
        for _, weight, states in (tables.held() if tables is not None else {}).values():
            self._tracker.track_external(weight, *states)

    def next_micro_batch(self) -> None:
        """Before each micro-batch's forward: forget the modules' stats of the last one (the peak is kept)."""
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def __enter__(self) -> StepTracker:
        if self._tracker is not None:
            self._warnings = warnings.catch_warnings()  # its gradient hook warns on a None grad (DeepSpeed ZeRO)
            self._warnings.__enter__()
            warnings.filterwarnings("ignore", message="Expected a tensor", category=UserWarning)
            self._tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._tracker is None:
            return
        self._tracker.__exit__(*exc)
        self._warnings.__exit__(*exc)
        peak = self._tracker.get_tracker_snapshot("peak")
        self.split = {str(dev): {TRACKER_CATEGORIES.get(str(getattr(k, "value", k)), str(k)): int(v)
                                 for k, v in snap.items()} for dev, snap in peak.items()}
        self._tracker = None  # its weak references go with it
