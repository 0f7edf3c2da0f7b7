"""The frozen result of planning, and the host facts planning takes as input."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from launcher.plan.batch import BatchPlan
from launcher.plan.memory import Bytes, MemoryEstimate
from launcher.plan.placement import PlacementPlan, TablePlan
from launcher.plan.ranks import RankPlan


@dataclass(frozen=True)
class HostFacts:
    """What the launcher found out about this host (probed in launch/host.py, never inside the plan)."""

    hostname: str
    cpu_count: int
    accelerators: int
    """Visible CUDA devices; 0 on a CPU-only host."""
    extensions_dir: str
    """Where DeepSpeed's JIT-built C++ ops are cached (TORCH_EXTENSIONS_DIR)."""


@dataclass(frozen=True)
class OptimizerPlan:
    name: str
    lr: float
    momentum: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    target: str
    """device or cpu."""


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launcher and the ranks need to know, decided before any process exists."""

    recipe: str
    world_size: int
    nnodes: int
    nproc_per_node: int
    dp: int
    pipeline_stages: int
    zero_stage: int
    backend: str
    device_type: str
    """cpu or cuda."""
    precision: str
    steps: int
    log_every: int
    checkpoint_every: int
    eval_every: int
    eval_batches: int
    eval_metrics: str
    seed: int
    batch: BatchPlan
    optimizer: OptimizerPlan
    placement: PlacementPlan
    memory: MemoryEstimate
    deepspeed: dict[str, Any]
    ranks: tuple[RankPlan, ...]
    rank_table: dict[str, Any]
    ds_ops: tuple[str, ...]
    """DeepSpeed C++ ops the ranks will load (JIT-built once per machine)."""
    notes: tuple[str, ...]
    """Decisions the planner made for the user, in words (e.g. how nproc_per_node=auto resolved)."""
    debug_fail: tuple[int, int] = (-1, -1)
    """(rank, step) where a rank raises on purpose, for testing supervision; (-1, -1) = off."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LaunchPlan:
        d = dict(d)
        d["batch"] = BatchPlan(**d["batch"])
        d["optimizer"] = OptimizerPlan(**{**d["optimizer"], "betas": tuple(d["optimizer"]["betas"])})
        m = d["memory"]
        d["memory"] = MemoryEstimate(**{**m, "host": Bytes(**m["host"]), "device": Bytes(**m["device"])})
        pl = d["placement"]
        tables = tuple(TablePlan(**{**t, "betas": tuple(t["betas"])}) for t in pl["tables"])
        d["placement"] = PlacementPlan(**{**pl, "tables": tables})
        d["ranks"] = tuple(RankPlan(**r) for r in d["ranks"])
        d["ds_ops"] = tuple(d["ds_ops"])
        d["notes"] = tuple(d["notes"])
        d["debug_fail"] = tuple(d["debug_fail"])
        return cls(**d)
