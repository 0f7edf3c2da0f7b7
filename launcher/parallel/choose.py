"""Which parts a run is made of (pure): a filter over the registry's parts by what each says it can do.

Tensor parallel, recompute and the pipeline join when their intents are given. The data-parallel part is
``parallel.data_parallel``, or with auto the first part of ``preference(intents)`` that can run the intents: ddp when
nothing asks for more than replicated fp32 (it is the lightest); deepspeed for ZeRO-1/2, offload and bf16 on plain data
parallelism, fsdp for ZeRO-3 without offload (bench/zero_bench.py measured each faster there: docs/performance.md);
fsdp where DeepSpeed cannot go (with tensor parallel or pipeline stages). The plan says which and why."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from launcher.codec import from_plain
from launcher.plan.intents import Intents, PartPlan
from launcher.parallel.part import DCP
from launcher.parallel.registry import DATA_PARALLEL, PARTS
from launcher.plan.registry import unknown

PREFERENCE = ("ddp", "deepspeed", "fsdp")
"""auto's order among the data-parallel parts that can run the intents."""
SHARDED_PREFERENCE = ("ddp", "fsdp", "deepspeed")
"""auto's order for ZeRO-3 without offload: FSDP2 stepped 0.91x DeepSpeed's ZeRO-3 time (bench/zero_bench.py)."""


def preference(i: Intents) -> tuple[str, ...]:
    """auto's order among the data-parallel parts for these intents; deepspeed first when you brought a DeepSpeed
    config (deepspeed.config)."""
    order = SHARDED_PREFERENCE if i.zero == 3 and not i.offload else PREFERENCE
    return ("deepspeed", *(n for n in order if n != "deepspeed")) if i.ds_file is not None else order


def choose_data_parallel(i: Intents) -> tuple[str | None, list[str], list[str]]:
    """(part name or None, problems, notes) for parallel.data_parallel."""
    key = f"parallel.data_parallel={i.data_parallel}"
    if i.data_parallel != "auto":
        if i.data_parallel not in DATA_PARALLEL:
            return None, [unknown("parallel.data_parallel", i.data_parallel, ("auto", *DATA_PARALLEL))], []
        why_not = PARTS[i.data_parallel].cannot(i)
        if why_not:
            able = [n for n in preference(i) if not PARTS[n].cannot(i)]
            fix = f"Set parallel.data_parallel=auto (it picks {able[0]})" if able else "Change the intents"
            return None, [f"{key}: {why_not}. {fix}."], []
        return i.data_parallel, [], []
    order = preference(i)
    reasons = {n: PARTS[n].cannot(i) for n in order}
    able = [n for n in order if not reasons[n]]
    if not able:
        why = "; ".join(f"{n}: {r}" for n, r in reasons.items())
        return None, [f"no data-parallel part can run {', '.join(i.needs + i.layout_words) or 'this run'} ({why}). "
                      f"Drop one of those settings."], []
    pick = able[0]
    passed = "".join(f"; not {n}: {reasons[n]}" for n in order if reasons[n])
    over = f"; auto prefers it to {', '.join(able[1:])} (bench/zero_bench.py)" if pick != order[0] and able[1:] else ""
    why = PARTS[pick].why(i) + passed + over
    return pick, [], [f"{key} -> {pick} ({why})"]


def plan_parts(i: Intents) -> tuple[tuple[PartPlan, ...], list[str], list[str]]:
    """(the run's parts in the order they apply, problems, notes)."""
    dp, problems, notes = choose_data_parallel(i)
    if dp is None:
        return (), problems, notes
    names = [*(["tensor_parallel"] if i.sharding is not None else []), *(["recompute"] if i.recompute else []),
             *(["sync_batchnorm"] if i.sync_batchnorm else []), dp,
             *(["pipeline"] if i.dims.pp > 1 else [])]
    parts = []
    for name in names:
        part = PARTS[name]
        problems += part.problems(i)
        notes += part.notes(i)
        parts.append(PartPlan(name=name, dims=part.dims, config=part.config(i), why=part.why(i)))
    if i.ds_file is not None and not any(PARTS[n].config_file for n in names):
        problems += _file_unused(i, dp)
    return tuple(parts), problems, notes


def _file_unused(i: Intents, dp: str) -> list[str]:
    """deepspeed.config on a run without the deepspeed part: its intents apply, the keys only DeepSpeed reads would
    do nothing."""
    from launcher.parallel.deepspeed_file import unused

    keys = unused(i.ds_file)
    if not keys:
        return []
    why = PARTS["deepspeed"].cannot(i) or f"parallel.data_parallel={i.data_parallel}"
    return [f"deepspeed.config: {', '.join(keys)} in {i.ds_source} would do nothing: the run's data-parallel part is "
            f"{dp}, not deepspeed ({why}). Remove them from the file, or set parallel.data_parallel=deepspeed where "
            f"DeepSpeed can run the layout."]


def _data_parallel(parts: tuple[PartPlan, ...]):
    return next(PARTS[p.name] for p in parts if PARTS[p.name].slot == "data_parallel")


@dataclass(frozen=True)
class RunFacts:
    """What the run's data-parallel part says of the run, for the plan to write down."""

    zero: int
    """The ZeRO stage it runs (0-3)."""
    dp_shard: int
    """The ranks of dp its parameters are sharded over (the mesh's dp_shard dim); 1 = replicated."""
    ops: tuple[str, ...]
    """DeepSpeed's C++ ops its ranks load (launcher/plan/ds_ops.py names)."""
    param_location: str
    """Where the parameters live: device or cpu."""
    optimizer_location: str
    """Where the optimizer states live: device or cpu."""
    data_parallel: str
    """Its name: what a checkpoint's format depends on."""
    step_overhead_s: float = 0.0
    """What its engine adds to a step (the step-time model's)."""


def run_facts(i: Intents, parts: tuple[PartPlan, ...]) -> RunFacts:
    """What the run's data-parallel part says of it (RunFacts)."""
    dp = _data_parallel(parts)
    params, optimizer = dp.locations(i)
    return RunFacts(zero=dp.zero_stage(i), dp_shard=dp.shard_ways(i), ops=tuple(dp.ops(i)), param_location=params,
                    optimizer_location=optimizer, data_parallel=dp.name,
                    step_overhead_s=dp.step_overhead_s)


def checkpoint_format(parts: tuple[PartPlan, ...]) -> str:
    """dcp when every part checkpoints through torch.distributed.checkpoint, else the other format (deepspeed)."""
    return next(iter({PARTS[p.name].checkpoint for p in parts} - {DCP}), DCP)


def config_file(parts: tuple[PartPlan, ...]) -> dict | None:
    """The config of the part that writes one to the run dir (DeepSpeed's ds_config.json), or None."""
    return next((p.config for p in parts if PARTS[p.name].config_file), None)


def engine_config(plan: Any) -> dict | None:
    """The engine config file a planned run's parts write (DeepSpeed's ds_config.json), or None: a recipe's
    LaunchPlan, a script's runtime plan, or a ScriptPlan (its runtime's parts, as plan.json holds them)."""
    parts = getattr(plan, "parts", None)
    if parts is None:
        parts = tuple(from_plain(PartPlan, p) for p in (plan.runtime or {}).get("parts", ()))
    return config_file(parts)


def trained_data(data: Any) -> Any:
    """The data spec a checkpoint's position depends on. The DataLoader's settings (``loader``: workers, pinning,
    read-ahead; auto picks the workers by timing a read, so two launches may differ) change how the items are read,
    not which or in what order, and are left out."""
    return {k: v for k, v in data.items() if k != "loader"} if isinstance(data, dict) else data


LATER_KEYS = {"table_optimizers": "tables.{}.optimizer"}
"""Layout keys recorded later than the first checkpoints (compared only when the checkpoint has them), and how a
difference in one of their entries is named: the user's key."""


def checkpoint_layout(plan: Any) -> dict[str, Any]:
    """What a checkpoint depends on: a run resumes from it only with the same values. The data position counts
    global micro-batches (micro × dp samples) of this seed; the optimizer's hyperparameters come back with its state;
    each table's optimizer names the states saved with it (``table_optimizers``, recorded since 2026-12-01: a
    checkpoint saved before has none, LATER_KEYS).
    A DCP checkpoint (torch-native parts) is saved by the model's names with global shapes, so the layout (world
    size, dp, tp, pp, the data-parallel part) may change; DeepSpeed's own files resume on the layout they were
    saved with."""
    fmt = checkpoint_format(plan.parts)
    out = {"format": fmt, "recipe": plan.recipe, "precision": plan.precision,
           "tables": {t.name: "outside" if t.outside else "inside" for t in plan.placement.tables},
           "table_optimizers": {t.name: t.optimizer for t in plan.placement.tables},
           "global_batch": plan.batch.global_size, "global_micro_batch": plan.batch.micro_size * plan.dims.dp,
           "grad_accum": plan.batch.grad_accum, "seed": plan.seed,
           "optimizer": {**dataclasses.asdict(plan.optimizer), "betas": list(plan.optimizer.betas)},
           "model": plan.model, "data": trained_data(plan.data)}
    if fmt != "dcp":
        out |= {"data_parallel": _data_parallel(plan.parts).name, "zero_stage": plan.zero_stage,
                "world_size": plan.world_size,
                "dims": {n: getattr(plan.dims, n) for n in plan.dims.names}}
    return out
