"""The plan's topology as a named DeviceMesh, and the data-parallel group everything that reduces asks for.

The mesh is (pp, dp_replicate, dp_shard, tp), tp varying fastest, with dp the flattening of dp_replicate × dp_shard
(torchtitan's layout): the fsdp part shards over dp_shard and replicates over dp_replicate (HSDP); every other
reduction (losses, metrics, the tables' sparse gradients, ddp's gradients) runs on the whole dp group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from launcher.plan import ParallelDims


@dataclass(frozen=True)
class DataParallel:
    """This rank's place in its data-parallel group: data shards by ``rank``; losses, metrics and the tables'
    sparse gradients reduce over ``group``."""

    rank: int
    size: int
    group: Any


def build_mesh(dims: ParallelDims, device_type: str) -> tuple[DeviceMesh, DataParallel]:
    """init_device_mesh over (pp, dp_replicate, dp_shard, tp) with dp flattened (collective: every rank calls it)."""
    shape = (dims.pp, dims.dp // dims.dp_shard, dims.dp_shard, dims.tp)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    flat = mesh["dp_replicate", "dp_shard"]._flatten("dp")  # kept here: slicing it from the root is deprecated
    return mesh, DataParallel(rank=flat.get_local_rank(), size=dims.dp, group=flat.get_group())


def describe_mesh(mesh: DeviceMesh, dp: DataParallel) -> dict[str, Any]:
    """This rank's coordinates and the global ranks of each of its groups, as torch.distributed sees them."""
    dims = {"pp": mesh["pp"], "tp": mesh["tp"]}
    return {
        "rank": dist.get_rank(),
        "coords": {"pp": dims["pp"].get_local_rank(), "dp": dp.rank, "tp": dims["tp"].get_local_rank()},
        "groups": {"pp": dist.get_process_group_ranks(dims["pp"].get_group()),
                   "dp": dist.get_process_group_ranks(dp.group),
                   "tp": dist.get_process_group_ranks(dims["tp"].get_group())},
    }


def stage_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks of this rank's pipeline stage (dp × tp, all ranks without stages) as one flat mesh: the group a
    parameter-server table's rows are split over (collective: every rank calls it)."""
    return mesh["dp_replicate", "dp_shard", "tp"]._flatten("stage")


def world_mesh(device_type: str) -> DeviceMesh:
    """Every rank as one flat mesh (a script's runtime.prepare(): its split tables' group and DTensor mesh)."""
    return init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("tables",))
