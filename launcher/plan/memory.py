"""Bytes per rank on the host and on the device: parameters, gradients, optimizer states, tables, table states.

DeepSpeed's rules (Rajbhandari et al., "ZeRO", 2020, section 5; deepspeed/runtime/zero/stage_1_and_2.py, stage3.py,
bf16_optimizer.py): ZeRO-1 shards optimizer states over dp ranks, ZeRO-2 also gradients, ZeRO-3 also parameters.
From ZeRO-1 up (and with bf16 at stage 0, unsharded) DeepSpeed keeps an fp32 master copy with the states.
Sparse tables are fp32 and whole on every rank (data parallel), with their optimizer's states beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.placement import PlacementPlan
from launcher.plan.registry import DENSE_OPTIMIZERS, TABLE_OPTIMIZERS

_WIDTH = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Bytes:
    params: int = 0
    """Dense parameters (in the training precision)."""
    grads: int = 0
    """Dense gradients (and, with ZeRO-Offload, the fp32 gradient partition on the host)."""
    optimizer: int = 0
    """Dense optimizer states plus DeepSpeed's fp32 master partition."""
    tables: int = 0
    """Sparse embedding tables (fp32)."""
    table_states: int = 0
    """Their optimizers' states (fp32)."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.tables + self.table_states


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    """All parameters of the model, tables included."""
    dense_params: int
    """Parameters inside the engine."""
    host: Bytes
    """Per rank, in host memory."""
    device: Bytes
    """Per rank, in device memory (on a CPU-only host: also host memory, but accounted here)."""


def estimate_memory(placement: PlacementPlan, precision: str, optimizer: str, zero_stage: int, dp: int) -> MemoryEstimate:
    width = _WIDTH.get(precision, 4)
    n = placement.dense_params

    def share(nbytes: int, sharded: bool) -> int:
        return -(-nbytes // dp) if sharded else nbytes

    master = zero_stage >= 1 or width < 4
    params = share(n * width, zero_stage >= 3)
    grads = share(n * width, zero_stage >= 2)
    states = share(n * (DENSE_OPTIMIZERS[optimizer].state_floats + (1 if master else 0)) * 4, zero_stage >= 1)
    where = {"host": Bytes(), "device": Bytes()}
    where[placement.param_location] = _add(where[placement.param_location], params=params)
    where["device"] = _add(where["device"], grads=grads)
    where[placement.optimizer_location] = _add(where[placement.optimizer_location], optimizer=states)
    if placement.optimizer_location == "host":
        where["host"] = _add(where["host"], grads=share(n * 4, True))  # fp32 grad partition for the host step
    tables_total = 0
    for t in placement.tables:
        tables_total += t.rows * t.dim
        if t.location == "engine":
            continue
        size = t.rows * t.dim * 4
        where[t.location] = _add(where[t.location], tables=size, table_states=size * TABLE_OPTIMIZERS[t.optimizer].state_floats)
    params_total = n + (tables_total if placement.sparse_tables else 0)
    return MemoryEstimate(params=params_total, dense_params=n, host=where["host"], device=where["device"])


def _add(b: Bytes, **more: int) -> Bytes:
    return Bytes(**{k: getattr(b, k) + more.get(k, 0) for k in b.__dataclass_fields__})
