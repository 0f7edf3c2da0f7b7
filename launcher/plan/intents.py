"""What the parallel parts are planned from (pure, torch-free): the run's topology and the user's intents, after the
batch, the placement of the tables and the pipeline's stages were planned.

``Intents`` is the one typed input of every part's plan-side knowledge (its problems, memory and config) and of the
choice between parts (``launcher.parallel.choose``); ``PartPlan`` is what the plan keeps of each chosen part."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:  # annotations only: launcher.plan imports this module
    from launcher.plan.parallel import ParallelDims
    from launcher.plan.pipeline import PipelinePlan
    from launcher.plan.sharding import ShardingPlan


@dataclass(frozen=True)
class Intents:
    dims: ParallelDims
    zero: int
    """zero.stage as asked (0-3)."""
    offload_optimizer: bool
    """optimizer.target=CPU."""
    offload_params: bool
    """placement.offload_params."""
    precision: str
    """fp32, bf16 or fp16."""
    optimizer: str = "adam"
    """optimizer.name (a DENSE_OPTIMIZERS key)."""
    cpu_impl: str = "torch"
    """optimizer.cpu_impl with the optimizer on the host: torch, or deepspeed (DeepSpeedCPUAdam)."""
    pin_memory: bool = False
    data_parallel: str = "auto"
    """parallel.data_parallel: auto or a data-parallel part's name."""
    sharding: ShardingPlan | None = None
    """Op-level sharding / the recipe's tensor-parallel plan on the tp dim; None = no tensor parallel."""
    recompute: tuple[str, ...] = ()
    pipeline: PipelinePlan | None = None
    device_type: str = "cpu"
    batch: tuple[int, int, int] = (1, 1, 1)
    """(global, micro, grad_accum)."""
    log_every: int = 10
    client_optimizer: bool = False
    """A script's runtime.prepare() brings its own optimizer, built before any part applies."""
    sync_batchnorm: bool = False
    """parallel.sync_batchnorm: BatchNorm statistics over the dp group."""
    grad_clip: float = 0.0
    """trainer.grad_clip: the global gradient norm's bound, 0 = off."""
    ds_file: dict[str, Any] | None = None
    """deepspeed.config's keys (after its intents were adopted), merged into the deepspeed part's config; None = none."""
    ds_source: str = ""
    """Where they came from (the file's path, or "inline"), for messages."""
    unused_params: tuple[str, ...] = ()
    """Trainable parameters of the parts' model that the loss of the data's first items leaves without a gradient
    (ModelFacts.unused, less the tables trained outside the parts)."""
    warm_start: bool = False
    """The ranks are forked from the warm-start forkserver (launcher.warm_start, a recipe on CPU): their runtime is
    smaller (launcher/constants.py WARM_RANK_RUNTIME)."""

    @property
    def offload(self) -> bool:
        return self.offload_optimizer or self.offload_params

    @property
    def needs(self) -> list[str]:
        """What plain replicated fp32 data parallelism (DDP) does not do, in the user's keys."""
        out = [f"zero.stage={self.zero}"] if self.zero > 0 else []
        if self.offload_optimizer:
            out.append("optimizer.target=CPU")
        if self.offload_params:
            out.append("placement.offload_params=true")
        if self.precision != "fp32":
            out.append(f"precision={self.precision}")
        return out

    @property
    def layout_words(self) -> list[str]:
        """The layout parts beyond data parallelism, in the user's keys."""
        out = []
        if self.sharding is not None and self.sharding.source == "parallel.tp":
            out.append(f"parallel.tp={self.dims.tp}")
        elif self.sharding is not None:
            given = ",".join(f"{op.alias}:{op.strategy}".replace(" ", "") for op in self.sharding.ops if op.given)
            out.append(f"parallel.sharding={{{given}}}")
        if self.dims.pp > 1:
            out.append(f"parallel.pipeline_stages={self.dims.pp}")
        return out


def intents_of(cfg: Any, dims: ParallelDims, placement: Any, zero: int, device_type: str,
               batch: tuple[int, int, int], **layout: Any) -> Intents:
    """The Intents of a composed config after its placement was planned (``layout``: sharding, recompute, pipeline,
    client_optimizer)."""
    return Intents(dims=dims, zero=zero, offload_optimizer=placement.optimizer_location == "host",
                   offload_params=placement.param_location == "host", precision=cfg.precision,
                   optimizer=cfg.optimizer.name, cpu_impl=placement.cpu_impl, pin_memory=placement.pin_memory,
                   data_parallel=cfg.parallel.data_parallel, device_type=device_type, batch=batch,
                   log_every=cfg.trainer.log_every, sync_batchnorm=bool(cfg.parallel.sync_batchnorm),
                   grad_clip=float(cfg.trainer.grad_clip), warm_start=warm_start(cfg, device_type), **_ds_file(cfg),
                   **layout)


def _ds_file(cfg: Any) -> dict[str, Any]:
    """deepspeed.config as plain dicts, and where it came from (launcher/launch/deepspeed_check.py read a path)."""
    from omegaconf import DictConfig, OmegaConf

    section = cfg.get("deepspeed")
    if section is None or section.config is None:
        return {}
    file = OmegaConf.to_container(section.config, resolve=True) if isinstance(section.config, DictConfig) \
        else section.config
    if not isinstance(file, dict):  # a path not read yet: launcher/parallel/deepspeed_file.py adopt_config says so
        return {}
    return {"ds_file": file, "ds_source": section.source or "the inline config"}


def clip_config(i: Intents) -> dict[str, Any]:
    """What a torch-native data-parallel part's config says of trainer.grad_clip (the rank clips by it)."""
    if i.grad_clip <= 0:
        return {}
    return {"clip": {"max_norm": i.grad_clip, "norm": "the global L2 norm of every stage's gradients, as torch's "
                                                      "clip_grad_norm_ (launcher/parallel/clip.py)"}}


@dataclass(frozen=True)
class PartPlan:
    """One part of the run's parallelism, as planned: applied in the order of the plan's ``parts``."""

    name: str
    """Its registry name (launcher.parallel.registry.PARTS)."""
    dims: tuple[str, ...]
    """The mesh dims it uses."""
    config: dict[str, Any] = field(default_factory=dict)
    """What it emits and the rank applies: DeepSpeed's config, FSDP2's policies, the pipeline's schedule, ..."""
    why: str = ""
    """Why it is in the run (the intent it compiles), in words."""


def warm_start(cfg: Any, device_type: str) -> bool:
    """Whether the ranks start warm (launcher/backends/warm_start.py): launcher.warm_start, for a recipe's ranks on
    CPU (a script's start as ``python script.py``; a CUDA plan's never fork)."""
    return bool(cfg.launcher.warm_start) and device_type == "cpu" and not cfg.get("script")
