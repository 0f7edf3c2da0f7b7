"""The plan's parts applied in a rank, in the plan's order, on one DeviceMesh (torchtitan's ``parallelize``).

``split`` cuts the model into this rank's pipeline stages (or keeps it whole): the chunks. The caller then takes the
tables that train outside the parts out of the chunks (launcher/tables/). ``apply_parts`` applies tensor parallel,
recompute and data parallelism to every chunk, builds an optimizer for each over what is left (after the parts replaced
parameters with DTensors, as FSDP2 needs), lets the data-parallel part hook it, and returns the engine: the one of
the part that drives the step (deepspeed, pipeline), or the torch loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from launcher.parallel.clip import attach_clip
from launcher.parallel.engine import Engine, NoOptimizer, Optimizers, TorchEngine
from launcher.parallel.rank import Chunk, RankContext, layer_paths
from launcher.parallel.registry import PARTS


def _parts(plan: Any) -> list[Any]:
    return [PARTS[p.name] for p in plan.parts]


def split(model: nn.Module, layers: list[tuple[str, nn.Module]], rt: RankContext) -> list[Chunk]:
    """This rank's chunks: its pipeline stages, or the whole model."""
    pipeline = next((p for p in _parts(rt.plan) if p.slot == "pipeline"), None)
    if pipeline is not None:
        return pipeline.split(model, layers, rt)
    return [Chunk(module=model, paths=layer_paths(model, layers))]


def apply_parts(chunks: list[Chunk], rt: RankContext,
                optimizer_factory: Callable[[list[nn.Parameter]], Any]) -> Engine:
    """Every part applied to every chunk in order; the optimizer; the engine that drives them."""
    parts = _parts(rt.plan)
    trained = [c for c in chunks if any(True for _ in c.module.parameters())]  # a stage of tables alone has none
    for c in chunks:
        if c not in trained:  # its buffers; the data-parallel part places the others
            c.module.to(rt.device)
    for part in parts:
        part.apply(trained if part.slot == "data_parallel" else chunks, rt)
    optimizers = [optimizer_factory(list(c.module.parameters())) if c in trained else NoOptimizer() for c in chunks]
    optimizer = optimizers[0] if len(optimizers) == 1 else Optimizers(optimizers)  # one per chunk: DCP names its
    # states by that chunk's parameter names
    dp = next(p for p in parts if p.slot == "data_parallel")  # every plan has one
    dp.attach(optimizer, trained, rt)
    driver = next((p for p in reversed(parts) if hasattr(p, "engine")), None)
    engine = driver.engine(chunks, optimizer, rt) if driver is not None else \
        TorchEngine(chunks[0], optimizer, dp, rt.grad_accum, rt.dp_group)
    clip = rt.config(dp.name).get("clip")  # trainer.grad_clip on a torch-native part (deepspeed clips itself)
    if clip:
        attach_clip(engine, optimizer, trained, rt, clip["max_norm"])  # after every other pre-step hook
    return engine
