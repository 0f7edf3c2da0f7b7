"""The draft ``plan_launch`` fills step by step before the parts compile it: the run's shape (ranks, mesh dims, batch,
steps, the recipe's model and sizes, op-level sharding), where things live (device, backend, tables, recompute,
pipeline stages), the DataLoader, and the parallel parts' intents. Each step adds its problems and notes to the
``Draft``; ``plan_launch`` (launcher/plan/__init__.py) raises them at once and freezes the result.

Pure, as the rest of the plan: no environment read, no file written, no torch imported."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from launcher.contract import Facts, ModelFacts, PartRules, model_facts
from launcher.errors import ConfigError, did_you_mean
from launcher.plan.batch import DEFAULT_MICRO_SIZE, BatchPlan, plan_batch
from launcher.plan.host_modules import crossing_words, plan_host_modules
from launcher.plan.intents import intents_of
from launcher.plan.loader import LoaderPlan, plan_loader
from launcher.plan.memory import state_floats
from launcher.plan.parallel import ParallelDims, plan_parallel
from launcher.plan.pipeline import PipelinePlan, plan_pipeline
from launcher.plan.placement import PlacementPlan, plan_placement, takes_tables_out
from launcher.plan.ps import stage_ranks
from launcher.plan.rules import device_and_backend, resolve_nproc
from launcher.plan.sharding import ShardingPlan, plan_sharding, plan_tensor_parallel, sharding_degrees
from launcher.plan.types import HostFacts
from launcher.plan.values import INT64

__all__ = ["Draft", "plan_dataloader", "plan_draft_parts", "plan_recompute", "plan_shape", "plan_where"]


def plan_recompute(wanted: list[str], layers: tuple[str, ...],
                   outside: set[str] = frozenset()) -> tuple[tuple[str, ...], list[str], list[str]]:
    """(the layers to recompute, problems, notes): ``recompute`` names checked against the model's layers() ([all] =
    every layer). A layer that is a table trained outside the parts is not recomputed: a lookup keeps only its rows."""
    if not wanted:
        return (), [], []
    problems = []
    items = {name: [n for n in layers if n.startswith(name + ".")] for name in wanted if name not in layers}
    wanted = [n for name in wanted for n in (items.get(name) or [name])]  # a stack's name: its items (layer1.0, ...)
    for name in wanted if wanted != ["all"] else []:
        if name not in layers:
            hint = did_you_mean(name, layers)
            problems.append(f"recompute: the model has no layer {name}.{hint} Its layers: {', '.join(layers) or 'none'}"
                            f" (or recompute=[all]).")
    chosen = [n for n in layers if wanted == ["all"] or n in wanted]
    skipped = [n for n in chosen if n in outside]
    notes = [f"recompute: {', '.join(skipped)} not recomputed (a table trained outside the parts keeps only the rows "
             f"it looked up)"] if skipped else []
    return tuple(n for n in chosen if n not in outside), problems, notes


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


def _topology(cfg: DictConfig, world: int, world_words: str, problems: list[str],
              notes: list[str]) -> tuple[ParallelDims | None, dict, bool]:
    """(dims, parallel.sharding as a dict, whether its degrees were consistent): dp × pp × tp = world, with the
    strategies of parallel.sharding deciding dp and tp (their factors span the ranks of one pipeline stage)."""
    par = cfg.parallel
    sharding_cfg = OmegaConf.to_container(par.sharding, resolve=True)
    want_dp, want_tp, degrees_ok = par.dp, par.tp, True
    if sharding_cfg:
        stage_world = world // par.pipeline_stages if par.pipeline_stages >= 1 and world % par.pipeline_stages == 0 \
            else world
        words = world_words if par.pipeline_stages <= 1 else f"{world_words} / pipeline_stages {par.pipeline_stages}"
        sdp, stp, sharding_problems = sharding_degrees(sharding_cfg, stage_world, words, par.dp, par.tp)
        problems += sharding_problems
        degrees_ok = sdp is not None
        if sdp is not None:
            want_dp, want_tp = sdp, stp
            notes.append(f"parallel.sharding -> dp {sdp} × tp {stp} (the strategies' batch factor and the rest)")
    dims, dims_problems = plan_parallel(want_dp, par.pipeline_stages, want_tp, world, world_words)
    problems += dims_problems
    return dims, sharding_cfg, degrees_ok


def epoch_steps(samples: int, batch: BatchPlan, dp: int) -> int:
    """Optimizer steps in one pass over ``samples`` training samples (the last partial global batch dropped)."""
    return samples // (batch.micro_size * dp) // batch.grad_accum


def _steps(cfg: DictConfig, batch: BatchPlan | None, dp: int, data_facts, problems: list[str],
           notes: list[str]) -> int:
    """trainer.steps, or the steps trainer.epochs makes of a data set of known size."""
    steps = cfg.trainer.steps
    if cfg.trainer.epochs > 0 and batch is not None:
        per_epoch = data_facts.train_samples
        if per_epoch is None:
            problems.append(f"trainer.epochs={cfg.trainer.epochs} needs a data set of known size; this data is a "
                            f"stream (endless, or an IterableDataset read to its end each epoch). Set "
                            f"trainer.epochs=0 and use trainer.steps.")
            return steps
        steps_per_epoch = epoch_steps(per_epoch, batch, dp)
        if steps_per_epoch < 1:
            problems.append(f"trainer.epochs: one global batch ({batch.global_size}) is larger than the {per_epoch} "
                            f"training samples. Lower batch.global_size.")
        steps = max(1, int(min(cfg.trainer.epochs * steps_per_epoch, INT64)))
        if steps >= INT64:
            problems.append(f"trainer.epochs={cfg.trainer.epochs} gives more than 2**63 steps. Lower trainer.epochs.")
        notes.append(f"trainer.epochs={cfg.trainer.epochs} -> {steps} steps ({steps_per_epoch} per epoch of "
                     f"{per_epoch:,} samples)")
    problems += _too_few_samples(data_facts, batch, dp)
    return steps


def _too_few_samples(data_facts, batch: BatchPlan | None, dp: int) -> list[str]:
    """A data set, or a stream that ended when the launcher read it, with fewer items than one global micro-batch:
    every rank would stop before its first step (a stream's epoch would hold no micro-batch)."""
    group = batch.micro_size * dp if batch is not None else 0
    key = data_facts.samples_key
    fix = (f"Lower batch.global_size (or batch.micro_size), or give more data"
           f"{f' ({key}={group} or more)' if key else ''}.")
    if data_facts.train_samples is not None and data_facts.train_samples < group:
        given = f" ({key}={data_facts.train_samples})" if key else ""
        return [f"the data has {data_facts.train_samples} training samples{given}, fewer than one global micro-batch "
                f"(batch.micro_size {batch.micro_size} × dp {dp} = {group}). {fix}"]
    if data_facts.stream_items is not None and data_facts.stream_items < group:
        return [f"data is a stream (IterableDataset) that ended after {data_facts.stream_items} items when the "
                f"launcher read it, fewer than one global micro-batch (batch.micro_size {batch.micro_size} × dp {dp} "
                f"= {group}): no epoch of it would hold a micro-batch. {fix}"]
    return []


def _table_default(cfg: DictConfig, user: bool):
    """How a table without a tables.<path> entry trains: outside the parts with optimizer.name's row-sparse twin
    (plan/placement.py: plan_table_optimizers, which notes how it differs); a recipe in the user's folder trains its
    model as written (inside the parts, with optimizer) unless a placement intent takes the tables out."""
    from launcher.schema import TableConfig

    if user and not takes_tables_out(cfg.placement.host_device_mix, cfg.placement.tables, cfg.tables, cfg.placement.ps):
        return TableConfig(optimizer="dense")
    return TableConfig()


def _unused_pipeline_keys(par: DictConfig) -> list[str]:
    """The pipeline's keys a run does not use: any of them without a pipeline; parallel.partition beside
    parallel.stages, which places every layer itself."""
    given = ["parallel.stages"] if par.stages else []
    given += [f"parallel.{k}={par[k]}" for k, default in (("schedule", "1f1b"), ("partition", "parameters"))
              if par[k] != default]
    if par.pipeline_stages == 1:
        return [f"{k} is not used: parallel.pipeline_stages=1 (no pipeline)" for k in given]
    if par.stages and par.partition != "parameters":
        return [f"parallel.partition={par.partition} is not used: parallel.stages places every layer (set "
                f"parallel.stages={{}} to partition the layers)"]
    return []


def _pipeline(cfg: DictConfig, dims: ParallelDims | None, batch: BatchPlan | None, sizes: ModelFacts, recipe,
              problems: list[str], notes: list[str]) -> PipelinePlan | None:
    par = cfg.parallel
    notes += _unused_pipeline_keys(par)
    if dims is None or dims.pp == 1 or batch is None:
        return None
    if sizes.layer_params is None:
        if not problems:
            given = ", ".join(f"model.{k}={v}" for k, v in cfg.model.items()
                              if isinstance(v, (int, float)) or k == "_target_")
            problems.append(f"parallel.pipeline_stages={dims.pp}: the model could not be built on the meta device to "
                            f"count its layers' parameters. Check the model's settings ({given}), or set "
                            f"parallel.pipeline_stages=1.")
        return None
    schedule = par.schedule
    if schedule == "1f1b" and batch.grad_accum < dims.pp:  # torch's Schedule1F1B needs M >= P
        schedule = "gpipe"
    pipeline, found = plan_pipeline(dims.pp, batch.grad_accum, dict(par.stages), par.partition, sizes.layers,
                                    sizes.layer_params, sizes.tied, schedule, par.stages_per_rank,
                                    sizes.split or getattr(recipe, "pipeline_split", "chain"), sizes.uncuttable)
    problems += found
    if pipeline is not None and batch.grad_accum < dims.pp:
        runs = ("; with fewer micro-batches than stages 1F1B is GPipe (torch's Schedule1F1B refuses it): "
                "parallel.schedule=1f1b runs as gpipe") if schedule != par.schedule else ""
        notes.append(f"batch.micro_batches={batch.grad_accum} on {dims.pp} pipeline stages: each rank idles "
                     f"{pipeline.bubble:.0%} of a step (the bubble); batch.micro_batches={4 * dims.pp} would cut it "
                     f"to {(dims.pp - 1) / (4 * dims.pp + dims.pp - 1):.0%}{runs}")
    return pipeline


@dataclasses.dataclass
class Draft:
    """What ``plan_launch`` has decided so far; every step adds its problems and notes here."""

    problems: list[str]
    notes: list[str]
    nproc: int = 1
    world: int = 1
    dims: ParallelDims | None = None
    batch: BatchPlan | None = None
    recipe: object = None
    user: bool = False
    steps: int = 0
    model: dict = dataclasses.field(default_factory=dict)
    sizes: ModelFacts | None = None
    sharding: ShardingPlan | None = None
    device_type: str = "cpu"
    backend: str = "gloo"
    placement: PlacementPlan | None = None
    zero: int = 0
    recompute: tuple[str, ...] = ()
    pipeline: PipelinePlan | None = None
    loader: LoaderPlan | None = None


def plan_shape(cfg: DictConfig, host: HostFacts, facts: Facts, d: Draft) -> None:
    """Ranks, mesh dims, batch split, steps, the recipe's model and its sizes, op-level sharding."""
    d.nproc, nproc_note = resolve_nproc(cfg.cluster.nproc_per_node, host)
    d.notes += [nproc_note] if nproc_note else []
    nnodes = max(1, cfg.cluster.nnodes)  # below 1: check_cluster names it; the rest plans on 1 (no 0 × anything)
    d.world = nnodes * d.nproc
    d.dims, sharding_cfg, degrees_ok = _topology(cfg, d.world, f"cluster.nnodes {nnodes} × nproc_per_node {d.nproc}",
                                                 d.problems, d.notes)
    dp = d.dims.dp if d.dims is not None else 1
    accum, accum_problems, accum_notes = _grad_accum(cfg.batch.grad_accum, cfg.batch.micro_batches)
    d.problems += accum_problems
    d.notes += accum_notes
    accum_key = "batch.micro_batches" if cfg.batch.micro_batches != -1 else "batch.grad_accum"  # (it set accum)
    d.batch, batch_problems = plan_batch(cfg.batch.global_size, cfg.batch.micro_size, accum, dp, accum_key)
    d.problems += batch_problems
    if d.batch is not None and cfg.batch.global_size == -1 and cfg.batch.micro_size == -1:
        d.notes.append(f"batch: no size set; {DEFAULT_MICRO_SIZE} samples per rank and micro-batch (HuggingFace "
                       f"Trainer's default), global {d.batch.global_size}. Set batch.global_size or batch.micro_size.")
    d.recipe = facts.recipe
    d.user = bool(getattr(d.recipe, "from_folder", False))
    d.steps = _steps(cfg, d.batch, dp, facts.data, d.problems, d.notes)
    d.model = d.recipe.model_spec(OmegaConf.to_object(cfg.model), facts.data)
    if d.batch is not None:
        found = d.recipe.problems(d.model, OmegaConf.to_object(cfg.data), d.batch.micro_size * dp)
        if found:  # a model the recipe refuses has no sizes to plan with (nor layers to list: model.layers=10**15)
            raise ConfigError(list(dict.fromkeys([*d.problems, *found])))
    d.sizes = facts.model or model_facts(d.recipe, d.model)
    if d.batch is not None and d.batch.micro_size == 1 and d.sizes.single_item:
        key = "batch.micro_size" if cfg.batch.micro_size != -1 else "batch.global_size"
        d.problems.append(f"{key}={cfg.batch[key.split('.')[1]]}: a micro-batch of 1 item on each data-parallel rank "
                          f"(global {d.batch.global_size} = 1 × dp {dp} × grad_accum {d.batch.grad_accum}), and the "
                          f"model cannot take 1 item: {d.sizes.single_item} Give at least 2 items a micro-batch: "
                          + ("batch.micro_size=2." if key == "batch.micro_size" else
                             f"batch.global_size={2 * dp * d.batch.grad_accum} or more."))
    if d.dims is not None and d.batch is not None and degrees_ok and (sharding_cfg or d.dims.tp > 1):
        d.sharding, sharding_problems = _plan_sharding(d.recipe, d.model, sharding_cfg, cfg.parallel.search_mode,
                                                       d.dims, d.batch.micro_size)
        d.problems += sharding_problems
    if not d.user:
        d.problems += _user_recipe_keys(cfg)
    if cfg.debug.fail_rank >= d.world:
        d.problems.append(f"debug.fail_rank={cfg.debug.fail_rank} is not a rank of this run (world size {d.world}). "
                          f"Set debug.fail_rank to 0 .. {d.world - 1}, or -1 (off).")
    d.notes += _fail_notes(cfg.debug.fail_rank, cfg.debug.fail_step, d.steps)


def _fail_notes(rank: int, step: int, steps: int) -> list[str]:
    """debug.fail_* set where no failure comes of it (a sweep over debug.fail_rank=-1,1 keeps its fail_step)."""
    if (rank == -1) != (step == -1):
        on, off = (f"debug.fail_step={step}", "debug.fail_rank") if rank == -1 else (f"debug.fail_rank={rank}",
                                                                                      "debug.fail_step")
        return [f"{on}: no failure is injected, as {off}=-1 (a failure needs both: the rank and the step)"]
    if 0 < steps < step:
        return [f"debug.fail_step={step}: no failure is injected, as the run ends at step {steps}"]
    return []


def _user_recipe_keys(cfg: DictConfig) -> list[str]:
    """The keys that shape a recipe in your folder's data and output, set on a built-in recipe: each would do
    nothing (a built-in recipe's data source makes whole batches, its model returns a tensor)."""
    name, p = cfg.recipe.name, []
    if cfg.loader.collate_fn is not None:
        p.append(f"loader.collate_fn: recipe {name} batches its own data (its data source makes whole batches), so a "
                 f"collate function would not be called. Remove loader.collate_fn; it is for a recipe in your folder "
                 f"whose data is a Dataset of items.")
    if cfg.model_output != "auto":  # a user's model is checked by a forward (usercode/forward_check)
        p.append(f"model_output={cfg.model_output}: recipe {name}'s model returns a tensor, which its loss takes as "
                 f"it is; model_output picks a key or attribute of a dict, tuple or ModelOutput a model in your "
                 f"folder returns. Remove model_output.")
    given = [f"{k}={v}" for k, v in (("data_inputs", list(cfg.data_inputs)), ("data_label", cfg.data_label)) if v]
    if given:
        p.append(f"{' and '.join(given)}: recipe {name}'s data source makes whole batches of (inputs, label) itself; "
                 f"data_inputs and data_label name the keys of a dict item of a Dataset in your folder. Remove "
                 f"{' and '.join(g.split('=')[0] for g in given)}.")
    return p


def plan_dataloader(cfg: DictConfig, host: HostFacts, facts: Facts, d: Draft) -> None:
    """The DataLoader of a user's Dataset (launcher/plan/loader.py), stated in the plan's notes."""
    if d.batch is None:
        return
    d.loader, found = plan_loader(OmegaConf.to_container(cfg.loader, resolve=True), d.user, facts.data.item_seconds,
                                  facts.data.item_cpu_share, d.batch.micro_size, host.cpu_count, d.nproc,
                                  d.device_type, stream=d.user and facts.data.train_samples is None)
    d.problems += found
    d.notes += [d.loader.line()] if d.loader is not None else []


def plan_where(cfg: DictConfig, host: HostFacts, d: Draft) -> None:
    """Device and backend, where tables and parameters live, what is recomputed, the pipeline's stages."""
    d.device_type, d.backend = device_and_backend(cfg.cluster.backend, host, cfg.cluster.device)
    d.placement, d.zero, placement_problems, placement_notes = plan_placement(
        cfg, d.sizes.tables, d.sizes.dense_params, d.device_type, _table_default(cfg, d.user),
        dict(d.sizes.kept), stage_ranks(d.dims), dict(d.sizes.aliases))
    d.problems += placement_problems
    d.notes += placement_notes
    hosted, module_problems = plan_host_modules(dict(cfg.placement.modules), d.sizes.modules, cfg.recipe.name,
                                                state_floats(cfg.optimizer.name), d.sizes.module_io)
    d.problems += module_problems
    if hosted and d.placement is not None:
        d.placement = dataclasses.replace(d.placement, modules=hosted,
                                          dense_params=d.placement.dense_params - sum(m.params for m in hosted))
        d.notes.append(f"placement.modules: {', '.join(f'{m.name} ({m.params:,} parameters)' for m in hosted)} on the "
                       f"host, {sum(m.bytes for m in hosted) / 1e6:,.1f} MB per rank with gradients and optimizer "
                       f"states, run on the host CPU (inputs copied there, outputs back); the parts train the rest; "
                       + crossing_words(hosted, d.batch.micro_size * d.batch.grad_accum if d.batch else 0))
    outside = {t.name for t in d.placement.tables if t.outside}
    d.recompute, recompute_problems, recompute_notes = plan_recompute(list(cfg.recompute), d.sizes.layers, outside)
    d.problems += recompute_problems
    d.notes += recompute_notes
    d.pipeline = _pipeline(cfg, d.dims, d.batch, d.sizes, d.recipe, d.problems, d.notes)


def plan_draft_parts(cfg: DictConfig, d: Draft, rules: PartRules) -> tuple:
    """The intents gathered so far, and the parallel parts that compile them (None, () when the shape failed)."""
    if d.dims is None or d.batch is None or (d.dims.pp > 1 and d.pipeline is None):
        return None, ()
    outside = [t.name for t in d.placement.tables if t.outside]
    unused = tuple(n for n in d.sizes.unused if n.rsplit(".", 1)[0] not in outside)
    intents = intents_of(cfg, d.dims, d.placement, d.zero, d.device_type,
                         (d.batch.global_size, d.batch.micro_size, d.batch.grad_accum), sharding=d.sharding,
                         recompute=d.recompute, pipeline=d.pipeline, unused_params=unused)
    parts, part_problems, part_notes = rules.plan_parts(intents)
    d.problems += part_problems
    d.notes += part_notes
    if cfg.trainer.grad_clip > 0 and outside:
        d.notes.append(f"trainer.grad_clip={cfg.trainer.grad_clip} clips the parts' dense gradients; the tables "
                       f"trained outside the parts ({', '.join(outside[:3])}{' ...' if len(outside) > 3 else ''}) "
                       f"step unclipped (their row-sparse optimizers take each row's gradient as it is)")
    return intents, parts


def _plan_sharding(recipe, model: dict, sharding_cfg: dict, search_mode: str, dims: ParallelDims,
                   micro: int) -> tuple[ShardingPlan | None, list[str]]:
    """parallel.sharding over the recipe's operators(), or parallel.tp alone with its tp_plan()."""
    if sharding_cfg:
        ops = recipe.operators(model) if hasattr(recipe, "operators") else None
        return plan_sharding(sharding_cfg, search_mode, ops, recipe.name, dims.dp, dims.tp, micro,
                             has_tp_plan=hasattr(recipe, "tp_plan"))
    ops, recipe_problems = recipe.tp_plan(model, dims.tp) if hasattr(recipe, "tp_plan") else (None, [])
    return plan_tensor_parallel(ops, recipe_problems, recipe.name, dims.dp, dims.tp, micro)
