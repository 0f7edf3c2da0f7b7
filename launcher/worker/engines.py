"""Engines behind one seam: what the Trainer's loop drives, whatever does the data parallelism underneath.

Every engine follows ``Engine``: call it for a micro-batch's forward, ``backward(loss)``, then ``step()`` after every
micro-batch (it steps the optimizer at the accumulation boundary and zeroes the gradients), ``state_dict`` /
``save`` / ``load``. DeepSpeed's engine already has this shape (``deepspeed.initialize``); torch DDP gets it from
``DDPEngine``, DTensor tensor parallelism from ``launcher.worker.tensor_parallel``. A pipeline
(``launcher.worker.pipeline``) runs a whole step's micro-batches through its schedule: it says
``drives_schedule = True`` and the Trainer calls its ``train_batch`` instead. The plan chose the engine
(``launcher.plan.registry.ENGINES``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist
from hydra.utils import get_class
from torch import nn

from launcher.plan import LaunchPlan
from launcher.plan.registry import DENSE_OPTIMIZERS, ENGINES
from launcher.rundir import CheckpointDir


class Engine(Protocol):
    module: nn.Module
    """The network it trains (unwrapped)."""
    optimizer: Any
    """Its optimizer (DeepSpeed's wrapper, or the torch optimizer)."""

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any: ...

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of loss / grad_accum (and × loss scale with fp16)."""

    def step(self) -> None:
        """After every micro-batch: at the accumulation boundary, step the optimizer and zero the gradients."""

    @property
    def loss_scale(self) -> float:
        """The factor the gradients of the last backward carry (1.0 without fp16 loss scaling)."""

    @property
    def step_skipped(self) -> bool:
        """The last boundary step was skipped (fp16 overflow)."""

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]:
        """Model and optimizer state, in memory: references to the live tensors, as torch's state_dict gives."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save(self, ckpt: CheckpointDir) -> None:
        """Write this rank's part of a checkpoint (collective: every rank calls it)."""

    def load(self, ckpt: CheckpointDir) -> None: ...


def build_optimizer(plan: LaunchPlan, params) -> torch.optim.Optimizer:
    """The dense optimizer the registry names, as a torch optimizer (with ZeRO-Offload, DeepSpeed steps it on its
    host partitions: torch's fused CPU kernel by default, or DeepSpeedCPUAdam with optimizer.cpu_impl=deepspeed)."""
    o = plan.optimizer
    if plan.placement.optimizer_location == "host" and plan.placement.cpu_impl == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                adamw_mode=o.name == "adamw")
    spec = DENSE_OPTIMIZERS[o.name]
    kwargs = {k: getattr(o, k) for k in spec.kwargs}
    if plan.engine == "tensor_parallel":  # DTensor and plain parameters mixed: torch's fused and foreach kernels
        kwargs["foreach"] = False        # refuse them (aten._fused_adamw_ got mixed torch.Tensor and DTensor)
    elif spec.fused:
        kwargs["fused"] = True  # one kernel per step, on CPU and CUDA (bench/placement_bench.py, "hand dense")
    return get_class(spec.impl)(params, **kwargs)


def build_engine(plan: LaunchPlan, net: nn.Module, device: torch.device, dp_group) -> Engine:
    """The planned engine around ``net``, with the planned dense optimizer."""
    optimizer = build_optimizer(plan, net.parameters())
    return make_engine(plan.engine, net, optimizer, device=device, dp_group=dp_group, grad_accum=plan.batch.grad_accum,
                       config=plan.deepspeed, backend=plan.backend)


def make_engine(name: str, net: nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device, dp_group,
                grad_accum: int, config: dict[str, Any] | None, backend: str) -> Engine:
    """Engine ``name`` (launcher.plan.registry.ENGINES) around ``net`` and a torch ``optimizer`` of its parameters:
    what a recipe run and a script's ``runtime.prepare()`` both build."""
    return get_class(ENGINES[name].impl)(net, optimizer, device=device, dp_group=dp_group, grad_accum=grad_accum,
                                         config=config, backend=backend)


class Unscaled:
    """For engines without loss scaling: gradients carry no scale, and no step is ever skipped."""

    @property
    def loss_scale(self) -> float:
        return 1.0

    @property
    def step_skipped(self) -> bool:
        return False


class DDPEngine(Unscaled):
    """torch DistributedDataParallel over the dp group, with DeepSpeed's micro-batch protocol: the gradient
    all-reduce runs only in the boundary micro-batch's backward, the loss is divided by grad_accum."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device, dp_group,
                 grad_accum: int, **_: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.module = net.to(device)
        self.optimizer = optimizer
        self._ddp = DistributedDataParallel(
            self.module, process_group=dp_group, device_ids=[device] if device.type == "cuda" else None
        )
        self._accum = grad_accum
        self._micro = 0
        self._group = dp_group

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        if self._accum > 1:  # DDP.no_sync() sets this flag: all-reduce only in the boundary micro-batch's backward
            self._ddp.require_backward_grad_sync = (self._micro + 1) % self._accum == 0
        return self._ddp(*inputs, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self._accum if self._accum > 1 else loss).backward()

    def step(self) -> None:
        self._micro += 1
        if self._micro % self._accum == 0:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def train(self, mode: bool = True) -> Any:
        return self._ddp.train(mode)

    def eval(self) -> Any:
        return self._ddp.eval()

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, ckpt: CheckpointDir) -> None:
        # Buffers (BatchNorm's running stats) follow each rank's last batch until DDP's next forward broadcasts
        # rank 0's; broadcast them now, so every rank holds what the checkpoint holds.
        src = dist.get_global_rank(self._group, 0) if self._group is not None else 0
        for b in self.module.buffers():
            dist.broadcast(b, src=src, group=self._group)
        if dist.get_rank() == 0:  # replicas are identical: one copy
            ckpt.path.mkdir(parents=True, exist_ok=True)
            torch.save(self.state_dict(), ckpt.engine)
        dist.barrier()

    def load(self, ckpt: CheckpointDir) -> None:
        device = next(self.module.parameters()).device
        self.load_state_dict(torch.load(ckpt.engine, map_location=device, weights_only=True))


class DeepSpeedEngine:
    """deepspeed.initialize with the planned config and a client torch optimizer; DeepSpeed's own checkpoints."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer, *, config: dict[str, Any], backend: str,
                 **_: Any) -> None:
        import deepspeed  # after the env is in place: DS_ACCELERATOR, TORCH_EXTENSIONS_DIR

        deepspeed.init_distributed(dist_backend=backend)  # the process group exists: DeepSpeed adopts it
        self._ds, _, _, _ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
        self.module = self._ds.module
        self.optimizer = self._ds.optimizer
        self._boundary = False

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return self._ds(*inputs, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        self._ds.backward(loss)

    def step(self) -> None:
        self._boundary = self._ds.is_gradient_accumulation_boundary()
        self._ds.step()

    @property
    def loss_scale(self) -> float:
        opt = self.optimizer  # FP16_Optimizer: cur_scale; ZeRO optimizers: loss_scale; others scale nothing
        return float(getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None) or 1.0)

    @property
    def step_skipped(self) -> bool:
        return self._boundary and not self._ds.was_step_applied()

    def train(self, mode: bool = True) -> Any:
        return self._ds.train(mode)

    def eval(self) -> Any:
        return self._ds.eval()

    def state_dict(self) -> dict[str, Any]:
        """In memory only where nothing is sharded or wrapped (ZeRO-0, fp32): otherwise each rank holds a shard
        that only DeepSpeed's checkpoint (``save``) reassembles."""
        self._check_in_memory()
        return {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_in_memory()
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])

    def _check_in_memory(self) -> None:
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise RuntimeError(
                f"DeepSpeed ZeRO-{self._ds.zero_optimization_stage()} / {type(self.optimizer).__name__} keeps its "
                f"state in shards: use Trainer.save(), which writes DeepSpeed's checkpoint."
            )

    def save(self, ckpt: CheckpointDir) -> None:
        self._ds.save_checkpoint(str(ckpt.root), tag=ckpt.tag)

    def load(self, ckpt: CheckpointDir) -> None:
        path, _ = self._ds.load_checkpoint(str(ckpt.root), tag=ckpt.tag)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {ckpt.path}")
