"""PURE planning: a composed config + host facts + the recipe's data facts -> a frozen LaunchPlan.

No environment is read, no port bound, no file written, no deepspeed or torch imported: planning takes
milliseconds and a dry run shows exactly what a real run would do. Every problem found is reported at once
(ConfigError). The parallel parts of the run (tensor parallel, recompute, data parallel, pipeline) are chosen and
planned by the parts' rules handed in with the facts (``Facts.parts``: launcher.parallel.RULES) from the intents
gathered here (the steps that gather them fill a ``Draft``: launcher/plan/draft.py); the recipe comes in the facts
too (``Facts.recipe``). The plan imports no part, recipe, store or backend."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from launcher.contract import Facts, backend_named
from launcher.errors import ConfigError
from launcher.loggers import logger_specs
from launcher.plan.batch import BatchPlan
from launcher.plan.budget import budget_of, check_fit
from launcher.plan.host_modules import composition_problems, plan_host_modules
from launcher.plan.draft import (Draft, epoch_steps, plan_dataloader, plan_draft_parts, plan_recompute, plan_shape,
                                 plan_where)
from launcher.plan.layout import ClusterLayout
from launcher.plan.memory import Bytes, MemoryEstimate, state_floats
from launcher.plan.nodes import planned_nodes, store_notes
from launcher.plan.parallel import ParallelDims
from launcher.plan.pipeline import PipelinePlan
from launcher.plan.placement import PlacementPlan, TablePlan, sparse_grad_problems
from launcher.plan.prefetch import kernels_words, plan_prefetch
from launcher.plan.ps import placed, plan_build, ps_fixes, stage_ranks
from launcher.plan.registry import CPU_OPTIMIZERS
from launcher.plan.malloc import with_malloc
from launcher.plan.ranks import RankPlan, omp_threads_kept, plan_ranks, rank_table, visible_devices
from launcher.plan.rules import check_config
from launcher.plan.script import check_script_ops
from launcher.plan.sharding import ShardingPlan
from launcher.plan.types import HostFacts, LaunchPlan, OptimizerPlan, RunPlan, ScriptPlan
from launcher.plan.validation import plan_validation

__all__ = [
    "BatchPlan", "Bytes", "HostFacts", "LaunchPlan", "MemoryEstimate", "OptimizerPlan", "ParallelDims",
    "PipelinePlan", "PlacementPlan", "RankPlan", "RunPlan", "ScriptPlan", "ShardingPlan", "TablePlan",
    "plan_launch", "plan_recompute",
]


def plan_launch(cfg: DictConfig, host: HostFacts, facts: Facts, layout: ClusterLayout | None = None) -> LaunchPlan:
    """Plan a run of ``cfg`` on ``host`` with the ``facts`` gathered about its data and model, on the hosts and
    devices ``layout`` describes (a rank table, hostfile or Slurm allocation; None: cluster.* alone); raise
    ConfigError listing every problem."""
    cfg, node_problems = planned_nodes(cfg, facts.backends)  # cluster.nnodes=MIN:MAX is planned at MAX
    cfg, ds_notes, ds_problems = facts.parts.adopt_config(cfg)  # deepspeed.config's intents, where ours are not set
    d = Draft(problems=node_problems + check_config(cfg, host, facts.backends) + check_script_ops(cfg) + ds_problems,
              notes=_smoke_notes(cfg) + _checkpoint_notes(cfg) + ds_notes + store_notes(cfg, facts.backends))
    plan_shape(cfg, host, facts, d)
    plan_where(cfg, host, d)
    plan_dataloader(cfg, host, facts, d)
    intents, parts = plan_draft_parts(cfg, d, facts.parts)
    if d.problems or intents is None:
        adopted = "; ".join(n for n in ds_notes if n.startswith("batch."))  # sizes the problem's numbers came from
        raise ConfigError(list(dict.fromkeys(f"{p} (Taken: {adopted}.)" if adopted and p.startswith("batch ") else p
                                             for p in d.problems)))  # a rule checked twice says it once
    if cfg.placement.mode == "auto":
        return _auto(cfg, host, facts, layout, d, intents)
    return _launch_plan(cfg, host, facts, layout, d, intents, parts)


def _auto(cfg: DictConfig, host: HostFacts, facts: Facts, layout: ClusterLayout | None, d: Draft, intents
          ) -> LaunchPlan:
    """placement=auto: the search (launcher/plan/auto.py) over the layouts the parts can run; its choice planned as
    the keys it stands for (zero.stage, optimizer.target, placement.offload_params, placement.tables, recompute)
    would be, with its decisions in the plan."""
    from launcher.plan.auto import override_words
    from launcher.plan.auto_search import search

    result = search(cfg, host, facts, d.placement, intents, d.sizes, d.nproc)
    if result.problems:
        raise ConfigError(list(result.problems))
    c = result.chosen
    where = result.overrides.get("placement.tables", {})  # host, device or ps: what auto chose, and what you set
    d.placement = dataclasses.replace(
        d.placement, param_location="host" if c.offload_params else "device",
        optimizer_location="host" if c.offload_optimizer else "device",
        tables=tuple(placed(t, where.get(t.name, "device"), stage_ranks(d.dims)) if t.outside else t
                     for t in d.placement.tables))
    d.zero, d.recompute = c.zero, c.recompute
    if c.host_modules:  # no layout fitted with these on the device: beside the ones you placed
        hosted, _ = plan_host_modules(result.overrides["placement.modules"], d.sizes.modules, cfg.recipe.name,
                                      state_floats(cfg.optimizer.name), d.sizes.module_io)
        d.placement = dataclasses.replace(d.placement, modules=d.placement.modules + hosted,
                                          dense_params=d.placement.dense_params - sum(m.params for m in hosted))
    intents, parts = plan_draft_parts(cfg, d, facts.parts)
    if d.problems or intents is None:
        raise ConfigError(list(dict.fromkeys(d.problems)))
    plan = _launch_plan(cfg, host, facts, layout, d, intents, parts)
    chosen = {**result.overrides, "zero.stage": plan.zero_stage}  # the stage the parts run (CPU optimizer: ZeRO-2)
    kept = [] if c.offload_optimizer or not CPU_OPTIMIZERS[cfg.optimizer.cpu_impl].impl else [
        f"optimizer.cpu_impl={cfg.optimizer.cpu_impl} is not used: placement=auto keeps the optimizer on the device, "
        f"and the key chooses what steps it on the host (where auto moves it when the device is short)"]
    notes = tuple(dict.fromkeys((f"placement=auto chose, of {result.considered} layouts: "
                                 + "; ".join(override_words(chosen)), *kept, *plan.notes)))  # parts ran twice
    optimizer = dataclasses.replace(plan.optimizer, target="cpu" if c.offload_optimizer else "device")
    return dataclasses.replace(plan, notes=notes, optimizer=optimizer, decisions=result.decisions,
                               auto=chosen)


def _checkpoint_notes(cfg: DictConfig) -> list[str]:
    """trainer.checkpoint_dir that no checkpoint goes to, and trainer.checkpoint_every past the last step."""
    t = cfg.trainer
    if t.checkpoint_every < 0 and t.checkpoint_dir:
        return [f"trainer.checkpoint_dir={t.checkpoint_dir} with trainer.checkpoint_every=-1: no checkpoint is "
                f"written, so nothing goes there"]
    if t.checkpoint_every > t.steps and not t.epochs:
        return [f"trainer.checkpoint_every={t.checkpoint_every} is past trainer.steps={t.steps}: the run's one "
                f"checkpoint is the one at its end (as with trainer.checkpoint_every=0)"]
    return []


def _smoke_notes(cfg: DictConfig) -> list[str]:
    if not cfg.smoke:
        return []
    changed = "; ".join(cfg.smoke_changes) or "nothing"
    checkpoint = "a checkpoint is written and read back" if cfg.trainer.checkpoint_every >= 0 else \
        "no checkpoint: trainer.checkpoint_every=-1"
    return [f"smoke=true: a smoke run of the recipe's structure at a tiny size ({checkpoint}); the profile changed "
            f"{changed}"]


def _launch_plan(cfg: DictConfig, host: HostFacts, facts: Facts, layout: ClusterLayout | None, d: Draft, intents,
                 parts) -> LaunchPlan:
    """The frozen plan: what the parts decided (ZeRO stage, sharded dp, where parameters live), memory, ranks."""
    rules = facts.parts
    run = rules.run_facts(intents, parts)
    zero, dims = run.zero, dataclasses.replace(d.dims, dp_shard=run.dp_shard)
    placement = dataclasses.replace(d.placement, param_location=run.param_location,
                                    optimizer_location=run.optimizer_location)
    placement, prefetch_problems = plan_prefetch(cfg.placement.prefetch, placement, dims, zero, d.device_type)
    placement = dataclasses.replace(placement, kernels_words=kernels_words(placement, host.table_kernels,
                                                                                d.device_type, host.table_fbgemm))
    d.problems += prefetch_problems + composition_problems(placement.modules, cfg) + sparse_grad_problems(
        facts.model.sparse_grads if facts.model is not None else (), placement.tables, cfg.optimizer.name,
        cfg.optimizer.weight_decay)
    budget = budget_of(cfg.cluster.device_memory_gb, cfg.cluster.host_memory_gb, cfg.placement.reserve,
                       host.host_memory, host.device_memory, d.device_type, d.nproc)
    mm = rules.model_memory(d.sizes, facts, d.nproc)
    placement, (memory, pipeline, peak), build_notes, build_problems = plan_build(
        cfg.placement.ps_init, placement, lambda p: rules.rank_memory(intents, parts, p, mm), budget.host_usable)
    d.notes += build_notes
    d.problems += build_problems
    fit_problems, fit_notes = check_fit(peak, budget, facts.activations is not None,
                                        ps_fixes(placement, stage_ranks(dims), d.nproc))
    d.problems += fit_problems
    d.notes += fit_notes
    nnodes = cfg.cluster.nnodes
    devices = visible_devices(layout, d.device_type, backend_named(facts.backends, cfg.cluster.launch), d.problems)
    ranks = plan_ranks(nnodes=nnodes, nproc_per_node=d.nproc, device_type=d.device_type,
                       master_addr=cfg.cluster.master_addr, master_port=cfg.cluster.master_port,
                       cpu_count=host.cpu_count, extensions_dir=host.extensions_dir, path=host.toolchain_path,
                       dims=dims, devices=devices, omp_threads=host.omp_threads)
    omp_problems, omp_notes = omp_threads_kept(host.omp_threads, host.cpu_count, d.nproc)
    ranks, malloc_problems, malloc_notes = with_malloc(ranks, cfg.launcher.malloc, host)
    d.problems += omp_problems + malloc_problems
    d.notes += omp_notes + malloc_notes
    loggers, logger_problems = logger_specs(cfg.logger)
    d.problems += logger_problems
    eval_metrics = _eval_metrics(cfg, facts.data, d.notes, d.problems)
    val = plan_validation(cfg, facts.data, _steps_per_epoch(facts.data, d.batch, dims.dp), eval_metrics, d.problems,
                          d.notes)
    if d.problems:
        raise ConfigError(d.problems)
    if 0 < d.steps <= val.eval_every:
        d.notes.append(f"eval.every={val.eval_every} is not below trainer.steps={d.steps}: the only evaluation is the "
                       f"one at the end")
    hosts = (list(layout.hosts) if layout is not None else
             [cfg.cluster.master_addr] if nnodes == 1 else [f"node{n}" for n in range(nnodes)])
    data = OmegaConf.to_container(cfg.data, resolve=True)
    if d.user:
        eval_data = OmegaConf.to_container(cfg.eval_data, resolve=True) if cfg.eval_data else None
        loader = OmegaConf.to_container(cfg.loader, resolve=True)
        val_data = OmegaConf.to_container(cfg.val_data, resolve=True) if cfg.val_data else None
        data = d.recipe.data_spec(data, eval_data, list(cfg.data_inputs), cfg.data_label, loader["collate_fn"],
                                    d.loader.kwargs() if d.loader is not None else {}, val_data)
    return LaunchPlan(
        recipe=cfg.recipe.name, dims=dims, parts=parts, world_size=d.world, nnodes=nnodes, nproc_per_node=d.nproc,
        zero_stage=zero, backend=d.backend, device_type=d.device_type, precision=cfg.precision, steps=d.steps,
        log_every=cfg.trainer.log_every, checkpoint_every=cfg.trainer.checkpoint_every, eval_every=val.eval_every,
        eval_batches=0 if facts.data.eval_samples == 0 else cfg.eval.batches, val_every=val.val_every,
        early_stop=val.early_stop, eval_metrics=eval_metrics, eval_max_batches=cfg.eval.max_batches,
        smoke=cfg.smoke, recompute=d.recompute,
        activations=_activations(facts.activations, d.recompute, d.batch.micro_size), pipeline=pipeline,
        seed=cfg.trainer.seed, batch=d.batch, optimizer=_optimizer(cfg), placement=placement, memory=memory,
        model=d.model, data=data, loss=OmegaConf.to_container(cfg.loss, resolve=True),
        reference=dict(facts.data.reference), ranks=ranks, rank_table=rank_table(ranks, hosts), ds_ops=run.ops,
        notes=tuple(d.notes), resume_from=cfg.trainer.resume_from, code_paths=facts.code_paths,
        debug_fail=(cfg.debug.fail_rank, cfg.debug.fail_step), sharding=d.sharding, model_output=cfg.model_output,
        loggers=loggers, peak=peak, budget=budget,
        warm_start=intents.warm_start,
    )


def _optimizer(cfg: DictConfig) -> OptimizerPlan:
    o = cfg.optimizer
    return OptimizerPlan(name=o.name, lr=o.lr, momentum=o.momentum, betas=(o.betas[0], o.betas[1]), eps=o.eps,
                         weight_decay=o.weight_decay, target=o.target.lower())


def _steps_per_epoch(data_facts, batch, dp: int) -> int | None:
    """Optimizer steps in one pass over the train split; None for a stream of unknown length."""
    if data_facts.train_samples is None or batch is None:
        return None
    return epoch_steps(data_facts.train_samples, batch, dp)


def _eval_metrics(cfg: DictConfig, data_facts, notes: list[str], problems: list[str]) -> str:
    """eval.metrics as planned; with no held-out data at all (no eval_data, no validation split) each eval.* key
    set is refused (nothing would read it), else a note says no evaluation runs."""
    if data_facts.eval_samples == 0 and data_facts.val_samples <= 0:
        unread = _eval_keys_set(cfg)
        problems += [f"eval.{k}={v}: this run has no held-out data (eval_data is null and there is no validation "
                     f"split), so no evaluation runs and nothing reads it. Give eval_data: {{_target_: ...}} (a "
                     f"held-out Dataset), or remove eval.{k}." for k, v in unread.items()]
        if not unread and cfg.eval.batches > 0:
            notes.append("no eval_data: no evaluation (give eval_data: {_target_: ...} for a held-out set)")
    elif cfg.eval.batches == 0 and data_facts.val_samples <= 0:  # (a recipe's eval.metrics is its default)
        notes += [f"eval.{k}={v} with eval.batches=0: no evaluation runs, so nothing reads it" for k, v in
                  _eval_keys_set(cfg).items() if k != "metrics"]
    if cfg.eval.metrics == "binary" and data_facts.binary_labels is False:
        problems.append(f"eval.metrics=binary: AUC, log loss and accuracy score one output of the model per label, "
                        f"each label 0 or 1 (a float), and recipe {cfg.recipe.name}'s are not (integer classes, "
                        f"regression targets, or several scores per label). Set eval.metrics=loss, or auto (binary "
                        f"only where the labels are).")
    if cfg.eval.metrics != "auto":
        return cfg.eval.metrics
    return "binary" if data_facts.binary_labels else "loss"


def _eval_keys_set(cfg: DictConfig) -> dict[str, object]:
    """The eval.* keys whose value is not the schema's default (a smoke run's where smoke=true set it);
    eval.batches=0 (no evaluation) says what happens anyway."""
    from launcher.schema import EvalConfig
    from launcher.smoke import SMOKE_BASE

    default = dataclasses.asdict(EvalConfig())
    if cfg.smoke:
        default |= {k.split(".", 1)[1]: v for k, v in SMOKE_BASE.items() if k.startswith("eval.")}
    return {k: cfg.eval[k] for k in default if cfg.eval[k] != default[k] and not (k == "batches" and cfg.eval[k] == 0)}


def _activations(per_sample: dict | None, recompute: tuple[str, ...], micro: int) -> dict:
    """Bytes kept for the backward per micro-batch, per layer and in all, without and with the planned recompute
    (a recomputed layer keeps only its inputs); {} when not estimated."""
    if not per_sample:
        return {}
    per_layer = {n: round(v["saved"] * micro) for n, v in per_sample.items()}
    kept = sum(per_layer.values())
    with_recompute = sum(round(v["inputs"] * micro) if n in recompute else per_layer[n] for n, v in per_sample.items())
    return {"per_layer": per_layer, "kept_bytes": kept, "kept_bytes_with_recompute": with_recompute}
