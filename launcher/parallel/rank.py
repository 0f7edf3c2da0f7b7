"""What the parts share inside a rank: the model chunks they apply to and the rank's context.

A chunk is the module one pipeline stage runs (a pruned copy of the model that keeps its parameter names), or the
whole model without a pipeline. Every part applies to every chunk of the rank, in the plan's order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.module_paths import held_module

if TYPE_CHECKING:
    import torch


@dataclass
class Chunk:
    module: Any
    """The nn.Module the parts change in place (its state_dict names are the whole model's)."""
    paths: list[tuple[str, str]]
    """The recipe's layers() it holds: (name, module path), in forward order."""
    stage: int = 0
    """Its pipeline stage (0 without a pipeline)."""
    call: Callable[..., Any] | None = None
    """What the forward goes through when a part wraps the module (torch DDP); None = the module itself."""
    io: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None
    """A traced pipeline stage's (inputs, outputs) as meta tensors (launcher/parallel/pipeline_trace.py)."""
    fed: tuple[int, ...] = ()
    """A later pipeline stage's model inputs, read from the micro-batch it runs (their positions in the batch's
    inputs), after what it receives (launcher/parallel/pipeline_graph.py ``Cut.fed``)."""

    @property
    def layers(self) -> list[tuple[str, Any]]:
        """(name, module) of its layers, looked up now: a part may have put another module at a layer's path (op-level
        sharding replaces a Linear), so a module taken before is not the one that runs."""
        return [(name, held_module(self.module, path)) for name, path in self.paths]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.call or self.module)(*args, **kwargs)


@dataclass
class RankContext:
    """This rank's view of the plan, for the parts' ``apply``."""

    plan: Any
    """The LaunchPlan (or a script's RuntimePlan-derived stand-in with the same fields the parts read)."""
    mesh: Any
    """The DeviceMesh over (pp, dp_replicate, dp_shard, tp), with dp flattened; None in a script's runtime.prepare()."""
    device: Any
    dp_group: Any
    """The data-parallel process group (every reduction of gradients, losses and tables runs on it)."""
    rank: int = 0
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    loss_fn: Any = None
    layers_of: Callable[[Any], list[tuple[str, Any]]] | None = None
    """The recipe's layers(model) (a pipeline cuts a model built on the meta device the same way)."""
    example: tuple[Any, ...] | None = None
    """One micro-batch's inputs as the first stage gets them (a pipeline's stages are shaped from it)."""

    def config(self, name: str) -> dict[str, Any]:
        """The planned config of part ``name`` (its own module asks for itself by name)."""
        return next((p.config for p in self.plan.parts if p.name == name), {})

    @property
    def dp_size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size(self.dp_group) if self.dp_group is not None else 1


def layer_paths(model: Any, layers: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(layer name, its module path in ``model``) of a recipe's layers() (gpt's block.0 is at blocks.0)."""
    where = {id(m): path for path, m in model.named_modules()}
    return [(name, where[id(m)]) for name, m in layers]


def local_tensor(t: Any) -> Any:
    """This rank's shard of a DTensor (its local tensor); any other tensor as it is."""
    return getattr(t, "_local_tensor", t)


def as_meta(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a meta tensor, floats in the run's compute ``dtype`` (what a stage receives from a micro-batch)."""
    return t.to("meta", dtype=dtype if t.is_floating_point() else t.dtype)
