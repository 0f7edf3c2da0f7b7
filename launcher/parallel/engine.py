"""What the Trainer drives, whatever parts were composed: the Engine seam, the torch loop engine, and the DCP
checkpoint of the torch-native parts.

An engine is called for a micro-batch's forward, then ``backward(loss)`` and ``step()`` after every micro-batch (it
steps the optimizer at the accumulation boundary); a pipeline's engine runs a whole step's micro-batches itself
(``drives_schedule``, ``train_batch``). ``TorchEngine`` drives a model that tensor parallel, recompute and ddp or
fsdp were applied to, with a torch optimizer; the deepspeed part brings DeepSpeed's engine, the pipeline part the
schedule's.

Torch-native parts checkpoint through ``torch.distributed.checkpoint`` (launcher/parallel/checkpoint.py)."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from launcher.parallel.checkpoint import load_dcp, save_dcp
from launcher.rundir import CheckpointDir


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The torch dtype of each training precision."""


class Engine(Protocol):
    module: nn.Module
    """The network it trains (unwrapped; a pipeline rank's stages as one ModuleList)."""
    optimizer: Any

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
        """Model and optimizer state in memory: references to the live tensors (DTensors where parts shard)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save(self, ckpt: CheckpointDir) -> None:
        """Write this rank's part of a checkpoint (collective: every rank calls it)."""

    def load(self, ckpt: CheckpointDir) -> None: ...


class Unscaled:
    """For engines without loss scaling: gradients carry no scale, and no step is ever skipped."""

    @property
    def loss_scale(self) -> float:
        return 1.0

    @property
    def step_skipped(self) -> bool:
        return False


def reshard(modules: list[nn.Module]) -> None:
    """Back to sharded parameters after an evaluation: an FSDP2 unit that keeps its gathered parameters from forward
    to backward (reshard_after_forward=False) would otherwise hold the whole layer until the next backward."""
    for m in modules:
        for sub in m.modules():
            if hasattr(sub, "reshard") and hasattr(sub, "unshard"):  # FSDP2's FSDPModule
                sub.reshard()


def broadcast_buffers(modules: list[nn.Module], group: Any) -> None:
    """Buffers (BatchNorm's running statistics) from dp rank 0 to the dp group: each replica's follow its own batches,
    and a checkpoint holds one copy (collective over the group)."""
    if group is None or dist.get_world_size(group) == 1:
        return
    src = dist.get_global_rank(group, 0)
    for m in modules:
        for b in m.buffers():
            dist.broadcast(b, src=src, group=group)


class Optimizers:
    """One torch optimizer per model chunk, stepped together (torchtitan's OptimizersContainer): DCP names each
    chunk's optimizer states by that chunk's parameter names. Pre-step hooks run once, before every optimizer."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        self._hooks: list[Any] = []

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {p: s for o in self.optimizers for p, s in o.state.items()}

    def register_step_pre_hook(self, hook: Any) -> None:
        self._hooks.append(hook)

    def step(self) -> None:
        for hook in self._hooks:
            hook(self, (), {})
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {str(k): o.state_dict() for k, o in enumerate(self.optimizers)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, o in enumerate(self.optimizers):
            o.load_state_dict(state[str(k)])


class NoOptimizer(Optimizers):
    """The optimizer of a chunk that has no parameters of its own (a pipeline stage holding only tables that train
    in a table store): one over no optimizer, nothing to step. Its pre-step hooks still run: a collective in one
    (trainer.grad_clip's norm over the pp group) must run on every rank."""

    def __init__(self) -> None:
        super().__init__([])


def per_chunk(optimizer: Any) -> list[torch.optim.Optimizer]:
    """Each chunk's optimizer (a chunk's own NoOptimizer is one)."""
    return optimizer.optimizers if type(optimizer) is Optimizers else [optimizer]


class ChunkEngine(Unscaled):
    """What the torch-native engines share: this rank's chunks, their optimizer(s) (one per chunk), the in-memory state
    dict, train/eval (back to sharded parameters after an evaluation) and the DCP checkpoint."""

    clip: Any = None
    """trainer.grad_clip's hook (launcher/parallel/clip.py GradClip), when the run clips."""

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The global gradient norm of the last step, before clipping (None when the run does not clip)."""
        return self.clip.last if self.clip is not None else None

    def __init__(self, chunks: list[Any], optimizer: Any, dp_group: Any) -> None:
        self.chunks, self.optimizer, self._dp_group = chunks, optimizer, dp_group
        self.module = chunks[0].module if len(chunks) == 1 else nn.ModuleList(c.module for c in chunks)

    def _modules(self) -> list[nn.Module]:
        return [c.module for c in self.chunks]

    def train(self, mode: bool = True) -> Any:
        reshard(self._modules())
        return self.module.train(mode)

    def eval(self) -> Any:
        return self.module.eval()

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, ckpt: CheckpointDir) -> None:
        broadcast_buffers(self._modules(), self._dp_group)
        save_dcp(list(zip(self._modules(), per_chunk(self.optimizer))), str(ckpt.dcp))

    def load(self, ckpt: CheckpointDir) -> None:
        load_dcp(list(zip(self._modules(), per_chunk(self.optimizer))), str(ckpt.dcp))


class TorchEngine(ChunkEngine):
    """The model (one chunk) with torch-native parts applied, a torch optimizer, gradient accumulation: the loss is
    divided by grad_accum and the optimizer steps at the boundary; the data-parallel part syncs gradients when it
    should (torch DDP only in the boundary's backward)."""

    def __init__(self, chunk: Any, optimizer: torch.optim.Optimizer, data_parallel: Any, grad_accum: int,
                 dp_group: Any) -> None:
        super().__init__([chunk], optimizer, dp_group)
        self.chunk = chunk
        self._dp, self._accum, self._micro = data_parallel, grad_accum, 0

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        self._dp.set_sync([self.chunk], (self._micro + 1) % self._accum == 0)
        return self.chunk(*inputs, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self._accum if self._accum > 1 else loss).backward()

    def step(self) -> None:
        self._micro += 1
        if self._micro % self._accum == 0:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
