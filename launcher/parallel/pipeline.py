"""pipeline: pipeline stages over the mesh's pp dim with torch.distributed.pipelining (``PipelineStage`` and its
schedules: ``Schedule1F1B``, ``ScheduleGPipe``, ``ScheduleInterleaved1F1B`` with several stages per rank).

The plan (launcher/plan/pipeline.py) gave each stage its layers. Every rank builds the whole model from the seed (so a
stage's weights are the one-process model's) and keeps the stages it runs: a copy of the model whose other layers
are removed, so its parameters keep their names (a DCP checkpoint loads on another layout). The other parts apply to
each stage's module (torchtitan's order: the split first, then tensor parallel, recompute, data parallel); the
schedule drives the micro-batches last. Tables outside the parts live with the stage that holds their module and
exchange their gradients on that stage's dp group.

Each micro-batch's loss is divided by M on the last stage, so parameters and tables alike get the gradient of the
step's mean loss; the mean is sent to every stage. A weight that layers on different stages share (GPT's tied head)
lives once per stage; before each optimizer step the copies' gradients (or gradient shards, under fsdp) are summed
over the ranks that hold them. Evaluation runs the held-out batches forward through the same stages (a forward-only
schedule), and the last stage scores them with the recipe's metrics."""

from __future__ import annotations

from typing import Any

from launcher.plan.intents import Intents
from launcher.parallel.part import Part
from launcher.plan.pipeline import schedule_problems


class Pipeline(Part):
    name = "pipeline"
    slot = "pipeline"
    dims = ("pp",)

    def problems(self, i: Intents) -> list[str]:
        p = i.pipeline
        return schedule_problems(p.schedule, p.stages_per_rank, p.ranks, p.micro_batches) if p is not None else []

    def why(self, i: Intents) -> str:
        return f"parallel.pipeline_stages={i.dims.pp}"

    def config(self, i: Intents) -> dict[str, Any]:
        p = i.pipeline
        return {"schedule": p.schedule, "micro_batches": p.micro_batches, "stages_per_rank": p.stages_per_rank,
                "stages": len(p.stages), "split": p.split, "bubble": round(p.bubble, 4),
                "loss": "the last stage's, each micro-batch's divided by M, sent to every stage"}

    # -- in a rank ---------------------------------------------------------------------------------------------------
    def split(self, model: Any, layers: list[tuple[str, Any]], rt: Any) -> list[Any]:
        """This rank's stages of ``model`` as chunks (before the other parts apply)."""
        from launcher.parallel.pipeline_stages import split_model

        return split_model(model, layers, rt.plan.pipeline, rt.mesh["pp"].get_local_rank(), rt)

    def apply(self, chunks: list[Any], rt: Any) -> None:
        """The split happened first (``split``); the schedule is built with the engine, once the optimizer exists."""

    def engine(self, chunks: list[Any], optimizer: Any, rt: Any) -> Any:
        from launcher.parallel.pipeline_engine import PipelineEngine

        return PipelineEngine(chunks, optimizer, rt)


PART = Pipeline()
