"""The parallel parts, one module each, and what every part says about itself (torchtitan's parallelize order).

A part owns its knowledge: the intents it cannot take and why (``problems``; a data-parallel part also answers
``cannot``, which the choice filters by), its config (what the plan shows and the rank applies), the memory it leaves
on each rank, how a rank applies it (``apply``, which imports torch lazily) and the format of its part of a
checkpoint. Parts apply in the order of ``SLOTS`` on one DeviceMesh: tensor parallel (tp) -> recompute ->
sync_batchnorm (normalization: BatchNorm statistics over dp) -> data parallel (dp: ddp | fsdp | deepspeed) ->
pipeline (pp). The pipeline cuts the model into its stages before the others apply (each part then applies to a
stage's module, as torchtitan does) and drives the schedule last.

The protocols a part subclasses, with the answers of a part that has nothing of its own to say, are in part.py.
Names are compared here and in the parts' own modules only; everywhere else a part is asked for what it knows."""

from __future__ import annotations

from launcher.parallel.part import DCP, DEEPSPEED, DataParallelPart, Part  # noqa: F401 - named beside the parts

SLOTS = ("tensor_parallel", "recompute", "normalization", "data_parallel", "pipeline")
"""The order parts apply in; a run has at most one part per slot and always one data-parallel part."""


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
