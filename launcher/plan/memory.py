"""Bytes per rank on the host and on the device: parameters, gradients, optimizer states, tables, table states.

The dense network's bytes are each data-parallel part's own rule (``memory`` in launcher/parallel/ddp.py, fsdp.py,
deepspeed.py), for the parameters one rank holds after the pipeline cut it into stages and tensor parallel split
its operators. Tables trained outside the parts are fp32 and whole on every rank that holds them (data parallel),
or in parameter-server mode (placement.ps) split over the ranks of their group, each rank holding its block of
ceil(rows / shards) rows; their optimizer's states lie beside them; this module adds them."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.placement import PlacementPlan
from launcher.plan.ps import rows_per_rank
from launcher.plan.registry import DENSE_OPTIMIZERS, table_state_bytes
from launcher.units import Bytes

@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    """All parameters of the model, tables included."""
    dense_params: int
    """Parameters the parallel parts train (the whole model's, before any split)."""
    host: Bytes
    """Per rank, in host memory."""
    device: Bytes
    """Per rank, in device memory (on a CPU-only host: also host memory, but accounted here)."""


def state_floats(optimizer: str) -> int:
    """fp32 optimizer state values per parameter (Adam: 2)."""
    return DENSE_OPTIMIZERS[optimizer].state_floats if optimizer in DENSE_OPTIMIZERS else 0


def with_tables(placement: PlacementPlan, dense: tuple[Bytes, Bytes], table_names: set[str] | None = None,
                module_names: set[str] | None = None) -> MemoryEstimate:
    """The estimate: ``dense`` (host, device) bytes of the parts plus the tables and the host modules outside them
    (only those named in ``table_names`` / ``module_names`` when given: the pipeline stage this estimate is for's)."""
    sums = {"host": [0, 0], "device": [0, 0]}  # (tables, table_states) per location, summed before one Bytes each
    tables_total = 0
    for t in placement.tables:
        tables_total += t.rows * t.dim
        if not t.outside or (table_names is not None and t.name not in table_names):
            continue
        size = rows_per_rank(t) * t.dim * 4  # its block with ps, else the whole table
        sums[t.location][0] += size
        sums[t.location][1] += table_state_bytes(t.optimizer, rows_per_rank(t), t.dim)
    where = {loc: b.plus(tables=sums[loc][0], table_states=sums[loc][1]) for loc, b in (("host", dense[0]),
                                                                                       ("device", dense[1]))}
    mine = [m for m in placement.modules if module_names is None or m.name in module_names]
    hosted = sum(m.params for m in mine)  # placement.modules: fp32 on the host, with grads and states
    where["host"] = where["host"].plus(params=4 * hosted, grads=4 * hosted,
                                       optimizer=sum(4 * m.params * m.state_floats for m in mine))
    n = placement.dense_params
    params_total = n + sum(m.params for m in placement.modules) + (tables_total if placement.sparse_tables else 0)
    return MemoryEstimate(params=params_total, dense_params=n, host=where["host"], device=where["device"])
