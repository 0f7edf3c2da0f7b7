"""Inside one rank: read plan.json, join the process group, build the mesh, the recipe and the engine, hand them to
a Trainer, and run it. The plan is the only input (no config is re-read)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from torch.distributed.device_mesh import DeviceMesh

from launcher.plan import LaunchPlan
from launcher.rundir import CheckpointDir, MetricsWriter, RunDir
from launcher.worker.engines import build_engine, build_optimizer
from launcher.worker.mesh import DataParallel, build_mesh, describe_mesh
from launcher.usercode import recipe_for
from launcher.worker.recompute import apply_recompute
from launcher.worker.sharding import observed_shapes, shard_model
from launcher.worker.tables import build_tables
from launcher.worker.trainer import DTYPES, Trainer


def run_rank(path: str | Path) -> None:
    run_dir = RunDir(path)
    plan = LaunchPlan.from_dict(run_dir.read_plan())
    rank = int(os.environ["RANK"])
    rank_dir = run_dir.rank(rank)
    rank_dir.path.mkdir(exist_ok=True)
    rank_dir.write_pid(os.getpid())
    sys.path[:0] = [p for p in plan.code_paths if p not in sys.path]  # the user's recipe code, by _target_
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 + DeepSpeed: all_gather_into_tensor ...

    device = torch.device(plan.ranks[rank].device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=plan.backend)  # env:// rendezvous on the launcher's TCPStore
    mesh, dp = build_mesh(plan.dims, device.type)
    rank_dir.mesh.write_text(json.dumps(describe_mesh(mesh, plan.dims), indent=2))
    trainer = build_trainer(plan, dp, device, rank, mesh)
    if plan.resume_from:
        trainer.load(CheckpointDir(plan.resume_from))
    metrics = MetricsWriter(rank_dir)
    try:
        trainer.fit(run_dir, rank_dir, metrics)
        if plan.sharding is not None:
            rank_dir.sharding.write_text(json.dumps(observed_shapes(trainer.model), indent=2))
        dist.barrier()
    finally:
        metrics.close()
    dist.destroy_process_group()


def build_trainer(plan: LaunchPlan, dp: DataParallel, device: torch.device, rank: int,
                  mesh: DeviceMesh | None = None) -> Trainer:
    """The recipe's model, loss and data from the plan's specs; the tables the plan keeps outside the engine are
    swapped for lookups (``build_tables``), a sharding plan is applied on the mesh's tp dim (``shard_model``), and
    the engine wraps the model. Needs the process group (and the dp group, and the mesh with sharding) to exist."""
    torch.manual_seed(plan.seed)
    model = instantiate(plan.model)
    loss_fn = instantiate(plan.loss)
    data = instantiate(plan.data)
    layers = recipe_for(plan.recipe).layers(model)
    if plan.recompute:
        apply_recompute(layers, plan.recompute)
    if plan.pipeline is not None:  # the stages take the layers; DeepSpeed's schedule drives them
        from launcher.worker.pipeline import PipelineEngine

        engine = PipelineEngine(layers, plan.pipeline, loss_fn, optimizer_factory=lambda ps: build_optimizer(plan, ps),
                                dims=plan.dims, config=plan.deepspeed, backend=plan.backend, device=device)
        return Trainer(plan, engine, engine.module, None, loss_fn, data, dp, device, rank)
    tables = None
    if plan.placement.sparse_tables:  # tables train outside the engine; the engine gets the rest of the model
        tables = build_tables(model, plan.placement.tables, device, DTYPES[plan.precision], dp.group)
    if plan.sharding is not None:
        shard_model(model, plan.sharding, mesh["tp"])
    engine = build_engine(plan, model, device, dp.group)
    return Trainer(plan, engine, model, tables, loss_fn, data, dp, device, rank)
