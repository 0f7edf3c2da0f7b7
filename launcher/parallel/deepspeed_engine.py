"""The deepspeed part in a rank: ``deepspeed.initialize`` with the planned config and a client torch optimizer, behind
the Engine seam (launcher/parallel/engine.py); DeepSpeed's own checkpoints."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from launcher.rundir import CheckpointDir


_DEPRECATED_COLLECTIVES = (r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor|_all_gather_base|"
                           r"_reduce_scatter_base)` is (deprecated|a private function)")
"""torch's FutureWarnings for the collectives DeepSpeed's ZeRO calls (torch/distributed/distributed_c10d.py)."""


class DeepSpeedEngine:
    """deepspeed.initialize with the planned config and a client torch optimizer; DeepSpeed's own checkpoints."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer, *, config: dict[str, Any], backend: str,
                 **_: Any) -> None:
        # DeepSpeed's ZeRO (stage 3's parameter gathers, stages 1-3's reduce-scatters) calls torch.distributed's
        # all_gather_into_tensor / reduce_scatter_tensor, which torch 2.13 deprecates in favour of *_single with a
        # FutureWarning on every call site: DeepSpeed's to change, nothing a user can do, so not on their console.
        warnings.filterwarnings("ignore", category=FutureWarning, message=_DEPRECATED_COLLECTIVES)
        import deepspeed  # after the env is in place: DS_ACCELERATOR, TORCH_EXTENSIONS_DIR

        deepspeed.init_distributed(dist_backend=backend)  # the process group exists: DeepSpeed adopts it
        self._ds, _, _, _ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
        self.module = self._ds.module
        self.optimizer = self._ds.optimizer
        self._boundary = False

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage DeepSpeed's engine runs (what it did, not what was asked)."""
        return self._ds.zero_optimization_stage()

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return self._ds(*inputs, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        self._ds.backward(loss)

    def step(self) -> None:
        self._boundary = self._ds.is_gradient_accumulation_boundary()
        self._ds.step()

    @property
    def grad_norm(self) -> float | None:
        """The global gradient norm of the last step before clipping, as DeepSpeed computed it to clip
        (gradient_clipping > 0; None where its engine keeps none: ZeRO-0 in fp32 clips without keeping it)."""
        if self._ds.gradient_clipping() <= 0:
            return None
        norm = self._ds.get_global_grad_norm()
        return float(norm) if norm is not None else None

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
