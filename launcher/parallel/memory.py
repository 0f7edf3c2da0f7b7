"""One rank's memory model from the run's parts (pure): the parts' state bytes (``memory``), their buffers
(``buffers``), the activations the recompute set and the pipeline schedule keep, the tables' step temporaries, the
runtime and the data, as launcher/plan/peak.py's terms."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.contract import Facts, ModelFacts

from launcher.parallel.choose import _data_parallel
from launcher.plan.intents import Intents, PartPlan
from launcher.parallel.registry import PARTS
from launcher.plan.estimate import estimate_run
from launcher.plan.memory import MemoryEstimate
from launcher.plan.peak import MemoryInput, MemoryPlan, memory_plan
from launcher.plan.pipeline import PipelinePlan


@dataclass(frozen=True)
class ModelMemory:
    """What the memory model needs of the model and data beyond the intents (gathered before the plan)."""

    layer_paths: dict[str, str] | None = None
    per_sample: dict[str, dict[str, float]] | None = None
    """Per layer: bytes kept for the backward ("saved") and input bytes ("inputs") per sample (meta-device trace)."""
    lookups: dict[str, float] = field(default_factory=dict)
    """Rows each sample looks up per table."""
    data_bytes: int = 0
    nproc_per_node: int = 1
    families: tuple[str, ...] = ()
    """Operator kinds with a runtime cost of their own (conv)."""
    imports: tuple[int, str] = (0, "")
    """(bytes, what) the user's code's imports add to a rank (Facts.imports)."""

    @classmethod
    def of(cls, sizes: ModelFacts, facts: Facts, nproc: int) -> ModelMemory:
        """What the memory model needs of the model (``sizes``) and the facts gathered before the plan."""
        return cls(layer_paths=sizes.layer_paths, per_sample=facts.activations, lookups=dict(facts.lookups or {}),
                   data_bytes=facts.data.resident_bytes, nproc_per_node=nproc, families=facts.families,
                   imports=facts.imports)


def kept_activations(per_sample: dict | None, recompute: tuple[str, ...], micro: int) -> int | None:
    """Bytes one micro-batch keeps for the backward with ``recompute``; None when not traced."""
    if not per_sample:
        return None
    return sum(round((v["inputs"] if n in recompute else v["saved"]) * micro) for n, v in per_sample.items())


def rank_memory(i: Intents, parts: tuple[PartPlan, ...], placement, m: ModelMemory, tables: tuple | None = None
                ) -> tuple[MemoryEstimate, PipelinePlan | None, MemoryPlan]:
    """(the parts' state estimate, the pipeline with each stage's bytes, the memory plan of the busiest rank);
    ``tables``: the tables' terms when computed already (launcher/plan/peak.py table_terms)."""
    micro, accum = i.batch[1], i.batch[2]
    dp = _data_parallel(parts)
    saved = {path: n for p in parts for path, n in PARTS[p.name].saved_params(i).items()}  # what tp takes off a rank
    est, pipeline = estimate_run(i, dp, placement, saved, m.layer_paths, m.per_sample, i.recompute, micro)
    params = max(0, placement.dense_params - sum(saved.values())) // max(1, i.dims.pp)
    buffers = tuple(dp.buffers(i, params))
    in_flight, act = 1, kept_activations(m.per_sample, i.recompute, micro)
    if pipeline is not None:
        acts = [s.activation_bytes for s in pipeline.stages if s.activation_bytes is not None]
        act = max(acts) if acts else None  # a stage's figure counts its in-flight micro-batches already
    mem = memory_plan(MemoryInput(
        estimate=est, device_type=i.device_type, nproc_per_node=m.nproc_per_node, micro_size=micro,
        grad_accum=accum, in_flight=in_flight, activation_bytes=act, tables=placement.tables, lookups=m.lookups,
        prefetch=getattr(placement, "prefetch", 0),
        optimizer=i.optimizer, optimizer_location=placement.optimizer_location, buffers=buffers,
        data_bytes=m.data_bytes, families=m.families, imports=m.imports,
        deepspeed=any(p.name == "deepspeed" for p in parts), warm=i.warm_start,
        per_table=pipeline is None,
        table_terms=tables))
    return est, pipeline, mem
