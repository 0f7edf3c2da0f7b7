"""The tensor_parallel part in a rank: the plan's ShardingPlan applied to a model chunk, on the mesh's tp dim (DTensor).

- ``parallel.sharding`` (source parallel.sharding): each operator of the chain is wrapped. A matmul becomes a
  ``ShardedLinear`` whose weight and bias are DTensor parameters placed as its strategy says (torch's Linear keeps w
  as (out, in): a split of w's height, MindSpore's in, is ``Shard(1)``); its input is redistributed to the planned
  layout, a row split's partial output is all-reduced before the bias. Elementwise operators get the same input
  redistribution. The last operator a chunk holds hands on a plain tensor (to the loss, or to the next pipeline
  stage).
- ``parallel.tp`` (source parallel.tp): torch's ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``
  per the recipe's tp_plan.

Operators a chunk does not hold (another pipeline stage's) are skipped.

Every sharded operator records the local shapes it computed on at its first call (``observed_shapes``: x, w as
(in, out), out), which the rank writes to rank.N/sharding.json to be checked against the plan."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from launcher.module_paths import held_module, set_module
from launcher.parallel.rank import local_tensor
from launcher.plan.sharding import OpShard, ShardingPlan

LAYOUTS = {"R": Replicate(), "S": Shard(-1)}


def _record(module: nn.Module, x: Any, w: torch.Tensor | None, out: Any) -> None:
    if getattr(module, "hl_local_shapes", None) is None:
        shapes = {"x": list(local_tensor(x).shape)}
        if w is not None:
            shapes["w"] = list(local_tensor(w).t().shape)  # (in, out), as the plan writes it
            shapes["out"] = list(local_tensor(out).shape)
        module.hl_local_shapes = shapes


class _Redistributing(nn.Module):
    """An operator's input in its planned layout on tp; the chain's last operator returns a plain whole tensor."""

    def __init__(self, op: OpShard, mesh: DeviceMesh, last: bool) -> None:
        super().__init__()
        self.op, self.mesh, self.last = op, mesh, last
        self.hl_local_shapes: dict[str, list[int]] | None = None

    def _input(self, x: Any) -> DTensor:
        if not isinstance(x, DTensor):  # data (or a plain tensor) is whole on every tp rank
            x = DTensor.from_local(x, self.mesh, [Replicate()], run_check=False)
        return x.redistribute(self.mesh, [LAYOUTS[self.op.input_layout]])

    def _output(self, y: DTensor) -> Any:
        return y.redistribute(self.mesh, [Replicate()]).to_local() if self.last else y


class ShardedLinear(_Redistributing):
    """nn.Linear as a matmul with a strategy: style row (w's in split, partial output), col (w's out split, output
    sharded on its last dim) or replicate."""

    def __init__(self, linear: nn.Linear, op: OpShard, mesh: DeviceMesh, last: bool) -> None:
        super().__init__(op, mesh, last)
        weight = {"row": Shard(1), "col": Shard(0), "replicate": Replicate()}[op.style]
        self.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), mesh, [weight]))
        self.bias = None
        if linear.bias is not None:
            bias = Shard(0) if op.style == "col" else Replicate()
            self.bias = nn.Parameter(distribute_tensor(linear.bias.detach(), mesh, [bias]))

    def forward(self, x: Any) -> Any:
        x = self._input(x)
        y = torch.matmul(x, self.weight.t())
        _record(self, x, self.weight, y)
        if y.placements[0].is_partial():  # a row split: all-reduce over tp before the bias
            y = y.redistribute(self.mesh, [Replicate()])
        if self.bias is not None:
            y = y + self.bias
        return self._output(y)


class ShardedElementwise(_Redistributing):
    def __init__(self, inner: nn.Module, op: OpShard, mesh: DeviceMesh, last: bool) -> None:
        super().__init__(op, mesh, last)
        self.inner = inner

    def forward(self, x: Any) -> Any:
        x = self._input(x)
        _record(self, x, None, None)
        return self._output(self.inner(x))


def _record_hook(module: nn.Module, args: tuple, output: Any) -> None:
    _record(module, args[0], module.weight, output)


def shard_model(model: nn.Module, sharding: ShardingPlan, mesh: DeviceMesh) -> None:
    """Apply the plan to the operators ``model`` holds, in place, on the 1-D tp ``mesh`` (collective over tp: every
    rank calls it with the same, identically initialised model)."""
    held = [(op, m) for op in sharding.ops if (m := held_module(model, op.name)) is not None]
    if sharding.source == "parallel.sharding":
        for i, (op, module) in enumerate(held):
            last = i == len(held) - 1
            new = ShardedLinear(module, op, mesh, last) if op.kind == "matmul" else ShardedElementwise(module, op, mesh, last)
            set_module(model, op.name, new)
        return
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for op, module in held:
        parallelize_module(module, mesh, styles[op.style]())
        module.register_forward_hook(_record_hook)


def observed_shapes(model: nn.Module) -> dict[str, dict[str, list[int]]]:
    """Operator name -> the local shapes it computed on at its first call."""
    return {name: m.hl_local_shapes for name, m in model.named_modules()
            if getattr(m, "hl_local_shapes", None) is not None}


__all__ = ["ShardedElementwise", "ShardedLinear", "observed_shapes", "shard_model"]
