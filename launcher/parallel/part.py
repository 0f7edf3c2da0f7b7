"""What the parts and their registry share: the checkpoint formats a part saves its state in, and what every part says
about itself (``Part``, ``DataParallelPart``), with the answer of a part that has nothing of its own to say where
there is one (a member without one is abstract: a part that lacks it cannot be built). A leaf: each part's module
(ddp.py, fsdp.py, ...) imports it and subclasses its protocol, and registry.py imports the parts, so a part never
imports the registry back."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Protocol

from launcher.plan.intents import Intents
from launcher.units import Term

__all__ = ["DCP", "DEEPSPEED", "DataParallelPart", "Part"]

DCP = "dcp"
"""torch.distributed.checkpoint: sharded tensors saved with their global shapes, loadable on another layout."""
DEEPSPEED = "deepspeed"
"""DeepSpeed's own checkpoint files: resumable on the layout they were saved with."""


class Part(Protocol):
    """Every part. A part that drives the step also has ``engine(chunks, optimizer, rt)`` (deepspeed, pipeline); the
    pipeline has ``split(model, layers, rt)``, which cuts the model into this rank's stages before the others apply."""

    name: str
    slot: str
    """Where it applies: one of SLOTS (launcher/parallel/registry.py)."""
    dims: tuple[str, ...] = ()
    """The mesh dims it uses."""
    checkpoint: str = DCP
    """The format of its part of a checkpoint: DCP or DEEPSPEED."""
    config_file: bool = False
    """Its config is a file of its own, written to the run dir (DeepSpeed's ds_config.json)."""

    def problems(self, i: Intents) -> list[str]:
        """What it cannot do with these intents: true impossibilities, one sentence each with the reason and a fix."""
        return []

    def notes(self, i: Intents) -> list[str]:
        """What the plan should tell the user of how it runs these intents."""
        return []

    @abstractmethod
    def config(self, i: Intents) -> dict[str, Any]:
        """What it emits (shown in the dry run, applied in the ranks)."""

    @abstractmethod
    def why(self, i: Intents) -> str:
        """The intent it compiles, in words."""

    def saved_params(self, i: Intents) -> dict[str, int]:
        """Per operator: the parameters its split takes off a rank (tensor parallel's), for the memory estimate."""
        return {}

    @abstractmethod
    def apply(self, chunks: list[Any], rt: Any) -> None:
        """In a rank: apply itself to each model chunk (a pipeline stage's module, or the whole model), in place."""


class DataParallelPart(Part, Protocol):
    """The extra questions the choice asks a data-parallel part."""

    slot: str = "data_parallel"
    dims: tuple[str, ...] = ("dp",)
    client_optimizer: bool
    """It can wrap an optimizer the user built before it applied (a script's runtime.prepare())."""
    step_overhead_s: float = 0.0
    """Seconds its engine adds to a step beyond compute and traffic (the step-time model's reference: none)."""

    @abstractmethod
    def cannot(self, i: Intents) -> str:
        """'' when it can run these intents, else why not (one clause)."""

    @abstractmethod
    def zero_stage(self, i: Intents) -> int:
        """The ZeRO stage it runs (what the plan and the checkpoint record)."""

    @abstractmethod
    def locations(self, i: Intents) -> tuple[str, str]:
        """(where the parameters live, where the optimizer states live and step): host or device."""

    def shard_ways(self, i: Intents) -> int:
        """The ranks of dp its DTensor shards span (the mesh's dp_shard dim); 1 = it does not shard on the mesh."""
        return 1

    def set_sync(self, chunks: list[Any], on: bool) -> None:
        """Gradient accumulation: whether the next micro-batch's backward reduces gradients over dp."""

    def attach(self, optimizer: Any, chunks: list[Any], rt: Any) -> None:
        """Hook the optimizer once it exists (e.g. average gradients before each step)."""

    @abstractmethod
    def memory(self, i: Intents, params: int) -> tuple[Any, Any]:
        """(host, device) Bytes per rank of ``params`` dense parameters, their gradients and optimizer states."""

    def buffers(self, i: Intents, params: int) -> tuple[Term, ...]:
        """Its own buckets and prefetch buffers, as launcher/plan/peak.py Terms."""
        return ()

    def ops(self, i: Intents) -> tuple[str, ...]:
        """C++ ops its ranks JIT-load (built once by the launcher)."""
        return ()
