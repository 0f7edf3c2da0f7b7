"""PURE planning: a composed config + host facts + the recipe's data facts -> a frozen LaunchPlan.

No environment is read, no port bound, no file written, no deepspeed imported: planning takes milliseconds and a
dry run shows exactly what a real run would do. Every problem found is reported at once (ConfigError).
"""

from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, OmegaConf

from launcher.contract import Facts, model_facts
from launcher.errors import ConfigError
from launcher.plan.batch import BatchPlan, plan_batch
from launcher.plan.deepspeed import plan_deepspeed
from launcher.plan.engine import plan_engine
from launcher.plan.memory import Bytes, MemoryEstimate, estimate_memory
from launcher.plan.parallel import ParallelDims, plan_parallel
from launcher.plan.pipeline import PipelinePlan, plan_pipeline
from launcher.plan.placement import PlacementPlan, TablePlan, plan_placement, takes_tables_out
from launcher.plan.layout import ClusterLayout
from launcher.plan.ranks import RankPlan, plan_ranks, rank_table, visible_devices
from launcher.plan.sharding import ShardingPlan, plan_sharding, plan_tensor_parallel, sharding_degrees
from launcher.plan.rules import check_config, device_and_backend, resolve_nproc
from launcher.plan.types import HostFacts, LaunchPlan, OptimizerPlan, RunPlan, ScriptPlan, checkpoint_layout
from launcher.plan.values import INT64

__all__ = [
    "BatchPlan", "Bytes", "HostFacts", "LaunchPlan", "MemoryEstimate", "OptimizerPlan", "ParallelDims",
    "PipelinePlan", "PlacementPlan", "RankPlan", "RunPlan", "ScriptPlan", "ShardingPlan", "TablePlan",
    "checkpoint_layout", "plan_launch",
]


def plan_recompute(wanted: list[str], layers: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """(the layers to recompute, problems): ``recompute`` names checked against the model's layers() ([all] = every
    layer)."""
    if not wanted:
        return (), []
    if wanted == ["all"]:
        return layers, []
    problems = []
    for name in wanted:
        if name not in layers:
            close = difflib.get_close_matches(name, layers, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            problems.append(f"recompute: the model has no layer {name}.{hint} Its layers: {', '.join(layers) or 'none'}"
                            f" (or recompute=[all]).")
    return tuple(n for n in layers if n in wanted), problems


def _activations(per_sample: dict | None, recompute: tuple[str, ...], micro: int) -> dict:
    """Bytes kept for the backward per micro-batch, per layer and in all, without and with the planned recompute
    (a recomputed layer keeps only its inputs); {} when not estimated."""
    if not per_sample:
        return {}
    per_layer = {n: round(v["saved"] * micro) for n, v in per_sample.items()}
    kept = sum(per_layer.values())
    with_recompute = sum(round(v["inputs"] * micro) if n in recompute else per_layer[n] for n, v in per_sample.items())
    return {"per_layer": per_layer, "kept_bytes": kept, "kept_bytes_with_recompute": with_recompute}


def _grad_accum(grad_accum: int, micro_batches: int) -> tuple[int, list[str], list[str]]:
    """(grad_accum, problems, notes): batch.micro_batches, a pipeline's name for the micro-batches per step, is
    grad_accum, and wins when set."""
    if micro_batches == -1:
        return grad_accum, [], []
    if micro_batches < 1:
        return grad_accum, [f"batch.micro_batches={micro_batches} must be a positive integer, or -1 (= grad_accum)."], []
    notes = [f"batch.micro_batches={micro_batches} sets batch.grad_accum (was {grad_accum})"] \
        if grad_accum not in (-1, micro_batches) else []
    return micro_batches, [], notes


def _pipeline_conflicts(pp: int, placement: PlacementPlan, zero: int, pipeline: PipelinePlan | None) -> list[str]:
    """What the placement and ZeRO cannot do with a pipeline."""
    p = []
    host = [t.name for t in placement.tables if t.location == "host"]
    if host:
        p.append(f"parallel.pipeline_stages={pp} with tables on the host ({', '.join(host)}): host tables live "
                 f"outside the engine, which a pipeline's schedule cannot reach. Set placement.host_device_mix=0 "
                 f"(and no placement.tables host entries), or parallel.pipeline_stages=1.")
    elif placement.sparse_tables:
        names = ", ".join(t.name for t in placement.tables if t.location != "engine")
        p.append(f"parallel.pipeline_stages={pp} with tables trained by a row-sparse optimizer ({names}): they train "
                 f"outside the engine. Set tables.<name>.optimizer=dense, or parallel.pipeline_stages=1.")
    if pipeline is not None and pipeline.tied and zero >= 1:
        ties = "; ".join(" = ".join(t.paths) for t in pipeline.tied)
        p.append(f"parallel.pipeline_stages={pp} with zero.stage={zero}: weights shared across stages ({ties}) are "
                 f"summed over the stages before each step, which ZeRO's partitioned optimizer does not allow. Set "
                 f"zero.stage=0, or give the sharing layers one stage in parallel.stages.")
    return p


def _stage_memory(pipeline: PipelinePlan, whole: MemoryEstimate, placement: PlacementPlan, precision: str,
                  optimizer: str, zero: int, dp: int, per_sample: dict | None, recompute: tuple[str, ...], micro: int
                  ) -> tuple[PipelinePlan, MemoryEstimate]:
    """Each stage's estimate (its parameters, gradients and optimizer states; its activations for the micro-batches
    it keeps in flight), and ``whole`` (the whole model's estimate) with the largest stage's per-rank bytes:
    what one rank of the pipeline holds at most."""
    stages, biggest = [], None
    for s in pipeline.stages:
        est = estimate_memory(dataclasses.replace(placement, dense_params=s.params), precision, optimizer, zero, dp)
        act = None
        if per_sample:
            act = s.in_flight * sum(round((per_sample[n]["inputs"] if n in recompute else per_sample[n]["saved"])
                                          * micro) for n in s.layers)
        stages.append(dataclasses.replace(s, state_bytes=est.device.total, activation_bytes=act))
        if biggest is None or s.params > biggest[0]:
            biggest = (s.params, est)
    per_rank = biggest[1]
    return dataclasses.replace(pipeline, stages=tuple(stages)), dataclasses.replace(whole, host=per_rank.host,
                                                                                   device=per_rank.device)


def plan_launch(cfg: DictConfig, host: HostFacts, facts: Facts, layout: ClusterLayout | None = None) -> LaunchPlan:
    """Plan a run of ``cfg`` on ``host`` with the ``facts`` gathered about its data and model, on the hosts and
    devices ``layout`` describes (a rank table, hostfile or Slurm allocation; None: cluster.* alone); raise
    ConfigError listing every problem."""
    from launcher.schema import TableConfig
    from launcher.usercode import UserRecipe, recipe_for

    problems = check_config(cfg, host)
    notes: list[str] = []
    if cfg.smoke:
        changed = "; ".join(cfg.smoke_changes) or "nothing"
        notes.append(f"smoke=true: a smoke run of the recipe's structure at a tiny size (a checkpoint is written and "
                     f"read back); the profile changed {changed}")
    nproc, nproc_note = resolve_nproc(cfg.cluster.nproc_per_node, host)
    if nproc_note:
        notes.append(nproc_note)
    nnodes = cfg.cluster.nnodes
    world = nnodes * nproc
    par = cfg.parallel
    world_words = f"cluster.nnodes {nnodes} × nproc_per_node {nproc}"
    sharding_cfg = OmegaConf.to_container(par.sharding, resolve=True)
    want_dp, want_tp = par.dp, par.tp
    degrees_ok = True
    if sharding_cfg:
        sdp, stp, sharding_problems = sharding_degrees(sharding_cfg, world, world_words, par.dp, par.tp)
        problems += sharding_problems
        degrees_ok = sdp is not None
        if sdp is not None:
            want_dp, want_tp = sdp, stp
            notes.append(f"parallel.sharding -> dp {sdp} × tp {stp} (the strategies' batch factor and the rest)")
    dims, dims_problems = plan_parallel(want_dp, par.pipeline_stages, want_tp, world, world_words)
    problems += dims_problems
    dp = dims.dp if dims is not None else 1
    accum, accum_problems, accum_notes = _grad_accum(cfg.batch.grad_accum, cfg.batch.micro_batches)
    problems += accum_problems
    notes += accum_notes
    batch, batch_problems = plan_batch(cfg.batch.global_size, cfg.batch.micro_size, accum, dp)
    problems += batch_problems
    recipe = recipe_for(cfg.recipe.name)
    user = isinstance(recipe, UserRecipe)
    data_facts = facts.data
    steps = cfg.trainer.steps
    if cfg.trainer.epochs > 0 and batch is not None:
        per_epoch = data_facts.train_samples
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
            steps = max(1, int(min(cfg.trainer.epochs * steps_per_epoch, INT64)))
            if steps >= INT64:
                problems.append(f"trainer.epochs={cfg.trainer.epochs} gives more than 2**63 steps. Lower "
                                f"trainer.epochs.")
            notes.append(f"trainer.epochs={cfg.trainer.epochs} -> {steps} steps ({steps_per_epoch} per epoch of "
                         f"{per_epoch:,} samples)")
    if data_facts.train_samples is not None and batch is not None and data_facts.train_samples < batch.micro_size * dp:
        problems.append(
            f"the data has {data_facts.train_samples} training samples, fewer than one global micro-batch "
            f"(batch.micro_size {batch.micro_size} × dp {dp} = {batch.micro_size * dp}). Lower batch.global_size "
            f"(or batch.micro_size), or give more data."
        )
    data_cfg = OmegaConf.to_object(cfg.data)
    model = recipe.model_spec(OmegaConf.to_object(cfg.model), data_facts)
    sizes = facts.model or model_facts(recipe, model)
    if batch is not None:
        problems += recipe.problems(model, data_cfg, batch.micro_size * dp)
    sharding = None
    if dims is not None and batch is not None and degrees_ok and (sharding_cfg or dims.tp > 1):
        sharding, sharding_problems = _plan_sharding(recipe, model, sharding_cfg, par.search_mode, dims,
                                                     batch.micro_size)
        problems += sharding_problems
        if sharding is not None:
            notes.append("the memory estimate counts parameters and optimizer states whole on every rank; tensor-"
                         "parallel shards hold less (rank.N/memory.json measures what they hold)")
    device_type, backend = device_and_backend(cfg.cluster.backend, host, cfg.cluster.device)
    table_default = TableConfig()
    if user:  # as written (inside the engine, with optimizer) unless a placement intent takes tables out of it
        intent = takes_tables_out(cfg.placement.host_device_mix, cfg.placement.tables, cfg.tables)
        o = cfg.optimizer
        adam = o.name in ("adam", "adamw")  # an SGD lr is no Adam lr: then lazy Adam's own defaults
        table_default = TableConfig(optimizer="dense")
        if intent:
            table_default = TableConfig(optimizer="lazy_adam", lr=o.lr, betas=list(o.betas), eps=o.eps) if adam \
                else TableConfig(optimizer="lazy_adam")
            notes.append(f"tables out of the engine train with lazy_adam, lr {table_default.lr} "
                         f"({'optimizer.lr' if adam else 'its default: optimizer.name=' + o.name + ' is not Adam'}) "
                         f"unless tables.<path>.optimizer / .lr say otherwise")
    placement, zero, placement_problems, placement_notes = plan_placement(
        cfg, sizes.tables, sizes.dense_params, device_type, table_default)
    problems += placement_problems
    notes += placement_notes
    engine, engine_problems, engine_notes = plan_engine(par.engine, zero, placement.offload, cfg.precision, dims,
                                                        sharded=bool(sharding_cfg),
                                                        host_tables=bool(placement.sparse_tables),
                                                        recompute=bool(cfg.recompute))
    problems += engine_problems
    notes += engine_notes
    recompute, recompute_problems = plan_recompute(list(cfg.recompute), sizes.layers)
    problems += recompute_problems
    pipeline = None
    if par.stages and par.pipeline_stages == 1:
        notes.append("parallel.stages is not used: parallel.pipeline_stages=1 (no pipeline)")
    if dims is not None and dims.pp > 1 and batch is not None and sizes.layer_params is None and not problems:
        problems.append(f"parallel.pipeline_stages={dims.pp}: the model could not be built on the meta device to "
                        f"count its layers' parameters. Check the model's settings, or set parallel.pipeline_stages=1.")
    if dims is not None and dims.pp > 1 and batch is not None and sizes.layer_params is not None:
        pipeline, pipeline_problems = plan_pipeline(dims.pp, batch.grad_accum, dict(par.stages), par.partition,
                                                    sizes.layers, sizes.layer_params, sizes.tied)
        problems += pipeline_problems
        problems += _pipeline_conflicts(dims.pp, placement, zero, pipeline)
    if cfg.debug.fail_rank >= world:
        problems.append(f"debug.fail_rank={cfg.debug.fail_rank} is not a rank of this run (world size {world}). "
                        f"Set debug.fail_rank to 0 .. {world - 1}, or -1 (off).")
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))  # a rule checked twice says it once
    activations = _activations(facts.activations, recompute, batch.micro_size)
    memory = estimate_memory(placement, cfg.precision, cfg.optimizer.name, zero, dp)
    if pipeline is not None:
        pipeline, memory = _stage_memory(pipeline, memory, placement, cfg.precision, cfg.optimizer.name, zero, dp,
                                         facts.activations, recompute, batch.micro_size)

    eval_metrics = cfg.eval.metrics
    if eval_metrics == "auto":
        eval_metrics = "binary" if data_facts.binary_labels and pipeline is None else "loss"
        if data_facts.binary_labels and pipeline is not None:
            notes.append("eval.metrics=auto -> loss: a pipeline's last stage reports the held-out loss only")
    if data_facts.eval_samples == 0 and cfg.eval.batches > 0:
        notes.append("no eval_data: no evaluation (give eval_data: {_target_: ...} for a held-out set)")
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
    ds, ds_ops = None, ()
    if engine in ("deepspeed", "pipeline"):
        ds, ds_ops = plan_deepspeed((batch.global_size, batch.micro_size, batch.grad_accum), placement, zero,
                                    cfg.precision, o.name, cfg.trainer.log_every, device_type)
    ranks = plan_ranks(
        nnodes=nnodes,
        nproc_per_node=nproc,
        device_type=device_type,
        master_addr=cfg.cluster.master_addr,
        master_port=cfg.cluster.master_port,
        cpu_count=host.cpu_count,
        extensions_dir=host.extensions_dir,
        dims=dims,
        devices=visible_devices(layout, device_type, cfg.cluster.launch, problems),
    )
    if problems:
        raise ConfigError(problems)
    hosts = (list(layout.hosts) if layout is not None else
             [cfg.cluster.master_addr] if nnodes == 1 else [f"node{n}" for n in range(nnodes)])
    return LaunchPlan(
        recipe=cfg.recipe.name,
        dims=dims,
        engine=engine,
        world_size=world,
        nnodes=nnodes,
        nproc_per_node=nproc,
        zero_stage=zero,
        backend=backend,
        device_type=device_type,
        precision=cfg.precision,
        steps=steps,
        log_every=cfg.trainer.log_every,
        checkpoint_every=cfg.trainer.checkpoint_every,
        eval_every=cfg.eval.every,
        eval_batches=0 if data_facts.eval_samples == 0 else cfg.eval.batches,
        eval_metrics=eval_metrics,
        eval_max_batches=cfg.eval.max_batches,
        smoke=cfg.smoke,
        recompute=recompute,
        activations=activations,
        pipeline=pipeline,
        seed=cfg.trainer.seed,
        batch=batch,
        optimizer=optimizer,
        placement=placement,
        memory=memory,
        model=model,
        data=(UserRecipe.data_spec(OmegaConf.to_container(cfg.data, resolve=True),
                                   OmegaConf.to_container(cfg.eval_data, resolve=True) if cfg.eval_data else None)
              if user else OmegaConf.to_container(cfg.data, resolve=True)),
        loss=OmegaConf.to_container(cfg.loss, resolve=True),
        reference=dict(data_facts.reference),
        deepspeed=ds,
        ranks=ranks,
        rank_table=rank_table(ranks, hosts),
        ds_ops=ds_ops,
        notes=tuple(notes),
        resume_from=cfg.trainer.resume_from,
        code_paths=facts.code_paths,
        debug_fail=(cfg.debug.fail_rank, cfg.debug.fail_step),
        sharding=sharding,
    )


def _plan_sharding(recipe, model: dict, sharding_cfg: dict, search_mode: str, dims: ParallelDims,
                   micro: int) -> tuple[ShardingPlan | None, list[str]]:
    """parallel.sharding over the recipe's operators(), or parallel.tp alone with its tp_plan()."""
    if sharding_cfg:
        ops = recipe.operators(model) if hasattr(recipe, "operators") else None
        return plan_sharding(sharding_cfg, search_mode, ops, recipe.name, dims.dp, dims.tp, micro)
    ops, recipe_problems = recipe.tp_plan(model, dims.tp) if hasattr(recipe, "tp_plan") else (None, [])
    return plan_tensor_parallel(ops, recipe_problems, recipe.name, dims.dp, dims.tp, micro)
