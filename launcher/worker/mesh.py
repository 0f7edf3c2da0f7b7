"""The plan's topology as a named DeviceMesh, and the data-parallel group everything that reduces asks for."""

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
    """init_device_mesh over (pp, dp, tp) with those names (collective: every rank calls it)."""
    mesh = init_device_mesh(device_type, dims.shape, mesh_dim_names=dims.names)
    dp = DataParallel(rank=mesh.get_local_rank("dp"), size=dims.dp, group=mesh.get_group("dp"))
    return mesh, dp


def describe_mesh(mesh: DeviceMesh, dims: ParallelDims) -> dict[str, Any]:
    """This rank's coordinates and the global ranks of each of its groups, as torch.distributed sees them."""
    return {
        "rank": dist.get_rank(),
        "coords": {n: mesh.get_local_rank(n) for n in dims.names},
        "groups": {n: dist.get_process_group_ranks(mesh.get_group(n)) for n in dims.names},
    }
