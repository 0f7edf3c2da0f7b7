"""The tensor-parallel engine: a model already sharded on the mesh's tp dim (``launcher.worker.sharding``), data
parallel over the dp dim, behind the Engine seam.

The forward and backward are the model's own (DTensor inserts the tp collectives the plan names). At the accumulation
boundary the gradients are averaged over the dp group (one all-reduce of every local gradient, flattened), then a
plain torch optimizer steps the DTensor parameters. Each rank holds its own shards, so each rank writes its own part
of a checkpoint (``CheckpointDir.shard``): the local tensors of the model and the optimizer, read back into the same
placements.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from launcher.rundir import CheckpointDir
from launcher.worker.engines import Unscaled


def _local(t: Any) -> Any:
    return t._local_tensor if isinstance(t, DTensor) else t


def _like(saved: torch.Tensor, live: Any) -> Any:
    """A saved local tensor placed as ``live`` is (a DTensor of the same mesh and placements), or itself."""
    if isinstance(live, DTensor):
        return DTensor.from_local(saved.to(live.device), live.device_mesh, live.placements, run_check=False,
                                  shape=live.shape, stride=live.stride())
    return saved


class TensorParallelEngine(Unscaled):
    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device, dp_group,
                 grad_accum: int, **_: Any) -> None:
        self.module = net.to(device)
        self.optimizer = optimizer
        self._group = dp_group
        self._dp = dist.get_world_size(dp_group) if dp_group is not None else 1
        self._accum = grad_accum
        self._micro = 0

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self._accum if self._accum > 1 else loss).backward()

    @torch.no_grad()
    def _average_gradients(self) -> None:
        grads = [_local(p.grad) for p in self.module.parameters() if p.grad is not None]
        if self._dp == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self._group)
        flat.div_(self._dp)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def step(self) -> None:
        self._micro += 1
        if self._micro % self._accum == 0:
            self._average_gradients()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def train(self, mode: bool = True) -> Any:
        return self.module.train(mode)

    def eval(self) -> Any:
        return self.module.eval()

    def state_dict(self) -> dict[str, Any]:
        """This rank's local tensors (references to the live shards) of the model and the optimizer."""
        opt = self.optimizer.state_dict()
        state = {k: {n: _local(v) for n, v in s.items()} for k, s in opt["state"].items()}
        return {"module": {n: _local(v) for n, v in self.module.state_dict().items()},
                "optimizer": {**opt, "state": state}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Local tensors back into this rank's shards, with the live placements."""
        live = self.module.state_dict()
        self.module.load_state_dict({n: _like(v, live[n]) for n, v in state["module"].items()})
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        opt = state["optimizer"]
        placed = {}
        for k, s in opt["state"].items():
            p = params[int(k)]
            placed[k] = {n: _like(v, p) if torch.is_tensor(v) and v.dim() > 0 else v for n, v in s.items()}
        self.optimizer.load_state_dict({**opt, "state": placed})

    def save(self, ckpt: CheckpointDir) -> None:
        ckpt.path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), ckpt.shard(dist.get_rank()))
        dist.barrier()

    def load(self, ckpt: CheckpointDir) -> None:
        self.load_state_dict(torch.load(ckpt.shard(dist.get_rank()), map_location="cpu", weights_only=True))
