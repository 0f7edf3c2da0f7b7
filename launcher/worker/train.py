"""Inside one rank: read plan.json, join the process group, build the mesh and the recipe's model, cut it into this
rank's pipeline stages, take the tables that train outside the parts out, apply the parallel parts in the plan's
order, and hand the engine to a Trainer. The plan is the only input (no config is re-read)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from torch.distributed.device_mesh import DeviceMesh

from launcher.loggers.sink import open_metrics
from launcher.parallel.compose import apply_parts, split
from launcher.module_paths import held_module
from launcher.parallel.rank import RankContext
from launcher.plan import LaunchPlan
from launcher.rundir import CheckpointDir, RunDir
import launcher.tables.kernels as kernels
from launcher.tables import build_tables, hugepages
from launcher.tables.block_init import DeferredTables, init_blocks
from launcher.tables.lookup import take_blocks
from launcher.tables.partition import RowPartition
from launcher.usercode import recipe_for
from launcher.usercode.items import OutputLoss, move_to
from launcher.worker.accounting import resident_bytes
from launcher.worker.heap import keep_freed_memory, release_hook
from launcher.worker.host_modules import HostModules, host_group, place_on_host
from launcher.worker.mesh import DataParallel, build_mesh, describe_mesh, stage_mesh
from launcher.worker.optimizers import build_optimizer
from launcher.parallel.precision import keep_batchnorm_fp32
from launcher.worker.trainer import DTYPES, Trainer


def run_rank(path: str | Path) -> None:
    run_dir = RunDir(path)
    plan = LaunchPlan.from_dict(run_dir.read_plan())
    rank = int(os.environ["RANK"])
    rank_dir = run_dir.rank(rank)
    rank_dir.path.mkdir(exist_ok=True)
    rank_dir.write_pid(os.getpid())
    print(f"rank {rank}: {keep_freed_memory()}", file=sys.stderr, flush=True)
    sys.path[:0] = [p for p in plan.code_paths if p not in sys.path]  # the user's recipe code, by _target_
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 + DeepSpeed: all_gather_into_tensor ...

    device = torch.device(plan.ranks[rank].device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=plan.backend)  # env:// rendezvous on the launcher's TCPStore
    mesh, dp = build_mesh(plan.dims, device.type)
    rank_dir.mesh.write_text(json.dumps(describe_mesh(mesh, dp), indent=2))
    rss_at_start = resident_bytes()  # the runtime's own: imports, the process group, the mesh
    trainer = build_trainer(plan, dp, device, rank, mesh)
    give_back = release_hook()
    if give_back is not None:  # tcmalloc: what the build freed (weights moved into the stores) goes back now
        give_back()
        trainer.step_end = give_back
    trainer.memory_marks = {"rss_at_start": rss_at_start, "rss_after_build": resident_bytes()}
    trainer.track_memory = os.environ.get("HL_MEMORY_TRACKER") == "1"  # memory.json "tracker": torch's split
    if plan.resume_from:
        trainer.load(CheckpointDir(plan.resume_from))
    metrics = open_metrics(rank_dir, plan.loggers, rank)  # rank 0's also feeds the loggers
    try:
        trainer.fit(run_dir, rank_dir, metrics)
        if plan.sharding is not None:
            from launcher.parallel._dtensor import observed_shapes

            rank_dir.sharding.write_text(json.dumps(observed_shapes(trainer.engine.module), indent=2))
        dist.barrier()
    finally:
        metrics.close()
    dist.destroy_process_group()


def build_model(plan: LaunchPlan, rank: int, stage: DeviceMesh | None) -> tuple[torch.nn.Module, dict]:
    """The recipe's model (seeded: every rank builds the same one) and, with sharded tables (``stage``: the group
    they are split over), this rank's blocks of them. A table built whole (TablePlan.built) is copied out and freed
    at once, the ranks of a host building the model one at a time, so a host holds at most one whole copy; a table
    built by blocks is never whole anywhere (launcher/tables/block_init.py). Collective: every rank calls it."""
    born = hugepages.born_huge({(t.rows, t.dim) for t in plan.placement.tables if t.on_host and not t.sharded})
    if stage is None:
        torch.manual_seed(plan.seed)
        with born:
            return instantiate(plan.model), {}
    sharded = [t for t in plan.placement.tables if t.sharded]
    by_blocks = [t for t in sharded if t.built == "blocks"]
    me, size = stage.get_local_rank(), stage.size()
    model, blocks = None, {}
    turns = 1 + max(r.local_rank for r in plan.ranks) if len(by_blocks) < len(sharded) else 1
    for turn in range(turns):
        if turn == plan.ranks[rank].local_rank % turns:
            torch.manual_seed(plan.seed)
            deferred = DeferredTables({(t.rows, t.dim) for t in by_blocks}) if by_blocks else None
            with deferred or nullcontext(), born:
                model = instantiate(plan.model)
            if deferred is not None:
                modules = {t.name: m for t in by_blocks if (m := held_module(model, t.name)) is not None}
                bounds = {t.name: RowPartition(t.rows, size).bounds(me) for t in by_blocks}
                blocks = init_blocks(model, deferred, modules, bounds, plan.seed)
            blocks |= take_blocks(model, plan.placement.tables, me, size)
        if turns > 1:
            dist.barrier()
    return model, blocks


def build_trainer(plan: LaunchPlan, dp: DataParallel, device: torch.device, rank: int, mesh: DeviceMesh) -> Trainer:
    """The recipe's model, loss and data from the plan's specs; this rank's chunks of the model (its pipeline stages,
    or all of it); the tables the plan keeps outside the parts swapped for lookups into a table store; the parts
    applied in order; the engine that drives them. Needs the process group and the mesh."""
    stage = stage_mesh(mesh) if any(t.sharded for t in plan.placement.tables) else None
    model, blocks = build_model(plan, rank, stage)
    hosted = None
    if plan.placement.modules:  # placement.modules: out of the parts' sight before they are applied
        hosted = HostModules(place_on_host(model, [m.name for m in plan.placement.modules]), plan, dp.size,
                             host_group(plan, rank, dp.group))
    loss_fn = OutputLoss(instantiate(plan.loss), plan.model_output)
    data = instantiate(plan.data)
    layers_of = recipe_for(plan.recipe).layers
    example = next(iter(data.train_batches(dp.rank, dp.size, plan.batch.micro_size, plan.seed)))[0]
    rt = RankContext(plan=plan, mesh=mesh, device=device, dp_group=dp.group, rank=rank,
                     grad_accum=plan.batch.grad_accum, loss_fn=loss_fn,
                     layers_of=layers_of,
                     example=move_to(example, device, DTYPES[plan.precision]))
    chunks = split(model, layers_of(model), rt)
    if hosted is not None:  # a pipeline stage trains the host modules it holds
        hosted = hosted.held_by([c.module for c in chunks])
    if plan.precision != "fp32":
        for c in chunks:
            keep_batchnorm_fp32(c.module)
    tables = None
    if plan.placement.sparse_tables:  # tables train outside the parts; the parts get the rest of the model
        tables = build_tables([c.module for c in chunks], plan.placement.tables, device, DTYPES[plan.precision],
                              dp.group, stage.get_group() if stage else None, stage, blocks)
        if tables is not None and not kernels.available():  # the plan's "table kernels" line said which
            print(f"rank {rank}: host tables run on torch's ops: {kernels.why_not()}", file=sys.stderr, flush=True)
    engine = apply_parts(chunks, rt, lambda params: build_optimizer(plan, params))
    return Trainer(plan, engine, tables, loss_fn, data, dp, device, rank, hosted=hosted)
