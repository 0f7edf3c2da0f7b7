"""PURE planning: a composed config + host facts -> a frozen LaunchPlan.

No environment is read, no port bound, no file written, no deepspeed imported: planning takes milliseconds and a
dry run shows exactly what a real run would do. Every problem found is reported at once (ConfigError).
"""

from __future__ import annotations

from omegaconf import DictConfig

from launcher.errors import ConfigError
from launcher.plan.batch import BatchPlan, plan_batch
from launcher.plan.deepspeed import DeepSpeedInputs, deepspeed_config
from launcher.plan.memory import Bytes, MemoryEstimate, estimate_memory
from launcher.plan.placement import PlacementPlan, TablePlan, plan_placement
from launcher.plan.ranks import RankPlan, plan_ranks, rank_table
from launcher.plan.rules import check_config, device_and_backend, resolve_nproc
from launcher.plan.types import HostFacts, LaunchPlan, OptimizerPlan

__all__ = [
    "BatchPlan", "Bytes", "HostFacts", "LaunchPlan", "MemoryEstimate", "OptimizerPlan", "PlacementPlan", "RankPlan",
    "TablePlan", "plan_launch",
]


def plan_launch(cfg: DictConfig, host: HostFacts) -> LaunchPlan:
    """Plan a run of ``cfg`` on ``host``; raise ConfigError listing every problem."""
    from launcher.recipes import RECIPES

    problems = check_config(cfg, host)
    notes: list[str] = []
    nproc, nproc_note = resolve_nproc(cfg.cluster.nproc_per_node, host)
    if nproc_note:
        notes.append(nproc_note)
    nnodes = cfg.cluster.nnodes
    world = nnodes * nproc
    pp = cfg.parallel.pipeline_stages
    dp = cfg.parallel.dp if cfg.parallel.dp != -1 else max(1, world // max(1, pp))
    if dp * pp != world:
        problems.append(
            f"parallel.dp={dp} × parallel.pipeline_stages={pp} = {dp * pp} != world_size {world} "
            f"(cluster.nnodes {nnodes} × nproc_per_node {nproc}). Set parallel.dp=-1 to infer it."
        )
    batch, batch_problems = plan_batch(cfg.batch.global_size, cfg.batch.micro_size, cfg.batch.grad_accum, dp)
    problems += batch_problems
    recipe = RECIPES[cfg.recipe.name]
    steps = cfg.trainer.steps
    if cfg.trainer.epochs > 0 and batch is not None:
        per_epoch = recipe.samples_per_epoch(cfg.data)
        if per_epoch is None:
            problems.append(
                f"trainer.epochs={cfg.trainer.epochs} needs a data set of known size; this data is an endless "
                f"stream. Set trainer.epochs=0 and use trainer.steps."
            )
        else:
            steps_per_epoch = per_epoch // (batch.micro_size * dp) // batch.grad_accum
            if steps_per_epoch < 1:
                problems.append(
                    f"trainer.epochs: one global batch ({batch.global_size}) is larger than the {per_epoch} "
                    f"training samples. Lower batch.global_size."
                )
            steps = max(1, int(cfg.trainer.epochs * steps_per_epoch))
            notes.append(f"trainer.epochs={cfg.trainer.epochs} -> {steps} steps ({steps_per_epoch} per epoch of "
                         f"{per_epoch:,} samples)")
    if batch is not None:
        problems += recipe.problems(cfg.model, cfg.data, batch.micro_size * dp)
    device_type, backend = device_and_backend(cfg.cluster.backend, host)
    placement, zero, placement_problems, placement_notes = plan_placement(cfg, recipe, device_type)
    problems += placement_problems
    notes += placement_notes
    if problems:
        raise ConfigError(problems)

    o = cfg.optimizer
    optimizer = OptimizerPlan(
        name=o.name,
        lr=o.lr,
        momentum=o.momentum,
        betas=(o.betas[0], o.betas[1]),
        eps=o.eps,
        weight_decay=o.weight_decay,
        target=o.target.lower(),
    )
    ds = deepspeed_config(
        DeepSpeedInputs(
            global_size=batch.global_size,
            micro_size=batch.micro_size,
            grad_accum=batch.grad_accum,
            zero_stage=zero,
            precision=cfg.precision,
            optimizer=o.name,
            log_every=cfg.trainer.log_every,
            offload_optimizer=placement.optimizer_location == "host",
            offload_params=placement.param_location == "host",
            pin_memory=placement.pin_memory,
            cpu_impl=placement.cpu_impl,
        )
    )
    ds_ops = ("deepspeed_shm_comm",) if device_type == "cpu" else ()  # DeepSpeed's CPU accelerator loads it at init
    if placement.optimizer_location == "host" and placement.cpu_impl == "deepspeed":
        ds_ops += ("cpu_adam",)
    ranks = plan_ranks(
        nnodes=nnodes,
        nproc_per_node=nproc,
        device_type=device_type,
        master_addr=cfg.cluster.master_addr,
        master_port=cfg.cluster.master_port,
        cpu_count=host.cpu_count,
        extensions_dir=host.extensions_dir,
    )
    hosts = [cfg.cluster.master_addr] if nnodes == 1 else [f"node{n}" for n in range(nnodes)]
    return LaunchPlan(
        recipe=cfg.recipe.name,
        world_size=world,
        nnodes=nnodes,
        nproc_per_node=nproc,
        dp=dp,
        pipeline_stages=pp,
        zero_stage=zero,
        backend=backend,
        device_type=device_type,
        precision=cfg.precision,
        steps=steps,
        log_every=cfg.trainer.log_every,
        checkpoint_every=cfg.trainer.checkpoint_every,
        eval_every=cfg.eval.every,
        eval_batches=cfg.eval.batches,
        eval_metrics=cfg.eval.metrics,
        seed=cfg.trainer.seed,
        batch=batch,
        optimizer=optimizer,
        placement=placement,
        memory=estimate_memory(placement, cfg.precision, o.name, zero, dp),
        deepspeed=ds,
        ranks=ranks,
        rank_table=rank_table(ranks, hosts),
        ds_ops=ds_ops,
        notes=tuple(notes),
        debug_fail=(cfg.debug.fail_rank, cfg.debug.fail_step),
    )
