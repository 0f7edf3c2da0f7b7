"""The parallel parts, one module each, and what every part says about itself (torchtitan's parallelize order).

A part owns its knowledge: the intents it cannot take and why (``problems``; a data-parallel part also answers
``cannot``, which the choice filters by), its config (what the plan shows and the rank applies), the memory it leaves
on each rank, how a rank applies it (``apply``, which imports torch lazily) and the format of its part of a
checkpoint. Parts apply in the order of ``SLOTS`` on one DeviceMesh: tensor parallel (tp) -> recompute ->
sync_batchnorm (normalization: BatchNorm statistics over dp) -> data parallel (dp: ddp | fsdp | deepspeed) ->
pipeline (pp). The pipeline cuts the model into its stages before the others apply (each part then applies to a
stage's module, as torchtitan does) and drives the schedule last.

Names are compared here and in the parts' own modules only; everywhere else a part is asked for what it knows."""

from __future__ import annotations

from typing import Any, Protocol

from launcher.plan.intents import Intents
from launcher.parallel.part import DCP, DEEPSPEED  # noqa: F401 - the formats, named beside the parts

SLOTS = ("tensor_parallel", "recompute", "normalization", "data_parallel", "pipeline")
"""The order parts apply in; a run has at most one part per slot and always one data-parallel part."""


class Part(Protocol):
    """Every part. A part that drives the step also has ``engine(chunks, optimizer, rt)`` (deepspeed, pipeline); the
    pipeline has ``split(model, layers, rt)``, which cuts the model into this rank's stages before the others apply;
    tensor_parallel has ``saved_params(i)`` (what its split takes off a rank, for the memory estimate); a data-parallel
    part has ``buffers(i, params)``: its own buckets and prefetch buffers, as launcher/plan/peak.py Terms, and
    ``step_overhead_s``: what its engine adds to a step (the step-time model's); a part whose
    config is a file of its own has ``config_file = True`` (DeepSpeed's ds_config.json)."""

    name: str
    slot: str
    """Where it applies: one of SLOTS."""
    dims: tuple[str, ...]
    """The mesh dims it uses."""
    checkpoint: str
    """The format of its part of a checkpoint: DCP or DEEPSPEED."""

    def problems(self, i: Intents) -> list[str]:
        """What it cannot do with these intents: true impossibilities, one sentence each with the reason and a fix."""

    def config(self, i: Intents) -> dict[str, Any]:
        """What it emits (shown in the dry run, applied in the ranks)."""

    def why(self, i: Intents) -> str:
        """The intent it compiles, in words."""

    def apply(self, chunks: list[Any], rt: Any) -> None:
        """In a rank: apply itself to each model chunk (a pipeline stage's module, or the whole model), in place."""


class DataParallelPart(Part, Protocol):
    """The extra questions the choice asks a data-parallel part."""

    client_optimizer: bool
    """It can wrap an optimizer the user built before it applied (a script's runtime.prepare())."""

    def cannot(self, i: Intents) -> str:
        """'' when it can run these intents, else why not (one clause)."""

    def zero_stage(self, i: Intents) -> int:
        """The ZeRO stage it runs (what the plan and the checkpoint record)."""

    def locations(self, i: Intents) -> tuple[str, str]:
        """(where the parameters live, where the optimizer states live and step): host or device."""

    def shard_ways(self, i: Intents) -> int:
        """The ranks of dp its DTensor shards span (the mesh's dp_shard dim); 1 = it does not shard on the mesh."""

    def set_sync(self, chunks: list[Any], on: bool) -> None:
        """Gradient accumulation: whether the next micro-batch's backward reduces gradients over dp."""

    def attach(self, optimizer: Any, chunks: list[Any], rt: Any) -> None:
        """Hook the optimizer once it exists (e.g. average gradients before each step)."""

    def memory(self, i: Intents, params: int) -> tuple[Any, Any]:
        """(host, device) Bytes per rank of ``params`` dense parameters, their gradients and optimizer states."""

    def ops(self, i: Intents) -> tuple[str, ...]:
        """C++ ops its ranks JIT-load (built once by the launcher)."""


def _parts() -> dict[str, Part]:
    from launcher.parallel.ddp import PART as ddp
    from launcher.parallel.deepspeed import PART as deepspeed
    from launcher.parallel.fsdp import PART as fsdp
    from launcher.parallel.pipeline import PART as pipeline
    from launcher.parallel.recompute import PART as recompute
    from launcher.parallel.sync_batchnorm import PART as sync_batchnorm
    from launcher.parallel.tensor_parallel import PART as tensor_parallel

    return {p.name: p for p in (tensor_parallel, recompute, sync_batchnorm, ddp, fsdp, deepspeed, pipeline)}


PARTS: dict[str, Part] = _parts()

DATA_PARALLEL: tuple[str, ...] = tuple(n for n, p in PARTS.items() if p.slot == "data_parallel")
"""The data-parallel parts, in the order auto prefers them when several can run the intents."""
