"""ddp: replicated data parallelism (DDP semantics): every dp rank holds the whole fp32 model and its optimizer,
gradients are averaged over the dp group before each step.

On a plain model it is torch's ``DistributedDataParallel`` (bucketed all-reduces overlapping the backward; the
all-reduce runs only in an accumulation boundary's backward). A model whose parameters are DTensors (tensor
parallel) or a pipeline stage (whose backward the schedule runs) gets the same average as one flat all-reduce of
every local gradient before the optimizer steps. One data-parallel rank has nothing to average: no wrapper (a
script's runtime.prepare() keeps torch DDP's there, as under plain torchrun)."""

from __future__ import annotations

from typing import Any

from launcher.errors import few
from launcher.plan.intents import Intents, clip_config
from launcher.parallel.part import DataParallelPart
from launcher.plan.memory import state_floats
from launcher.units import Bytes, Term

TORCH_DDP = "torch DistributedDataParallel"
FLAT = "one flat all-reduce of every local gradient before each step"
ALONE = "none: one data-parallel rank has nothing to average"


class ReplicatedDataParallel(DataParallelPart):
    name = "ddp"
    client_optimizer = True

    def cannot(self, i: Intents) -> str:
        if i.needs:
            return (f"ddp keeps whole fp32 parameters and their optimizer on the device: no sharding, offload or "
                    f"master weights for {', '.join(i.needs)}")
        return ""

    def zero_stage(self, i: Intents) -> int:
        return 0

    def locations(self, i: Intents) -> tuple[str, str]:
        """(where the parameters live, where the optimizer steps): the device."""
        return "device", "device"

    def why(self, i: Intents) -> str:
        return "data parallel with replicated fp32 parameters (zero.stage=0, no offload, fp32)"

    def config(self, i: Intents) -> dict[str, Any]:
        flat = i.sharding is not None or i.dims.pp > 1 or bool(i.unused_params)
        how = ALONE if i.dims.dp == 1 and not i.client_optimizer else FLAT if flat else TORCH_DDP
        return {"gradients": f"averaged over dp {i.dims.dp}", "implementation": how, **clip_config(i)}

    def notes(self, i: Intents) -> list[str]:
        if not i.unused_params or self.config(i)["implementation"] != FLAT or i.sharding or i.dims.pp > 1:
            return []
        return [f"ddp: {few(i.unused_params)} got no gradient from the loss of the data's first items (built, not "
                f"used by the forward): the gradients are averaged in {FLAT}, which takes a parameter without one as "
                f"one process does (torch DistributedDataParallel would stop at the second step, 'Expected to have "
                f"finished reduction in the prior iteration')"]

    def memory(self, i: Intents, params: int) -> tuple[Bytes, Bytes]:
        n = params * 4
        return Bytes(), Bytes(params=n, grads=n, optimizer=params * state_floats(i.optimizer) * 4)

    def buffers(self, i: Intents, params: int) -> tuple[Term, ...]:
        """torch DDP's buckets hold a flat copy of every gradient from the first backward on (gradient_as_bucket_view
        is off); the flat all-reduce concatenates every gradient at the step."""
        how = self.config(i)["implementation"]
        if how == TORCH_DDP:
            return (Term("ddp buckets", "device", params * 4, source="torch DDP's gradient buckets: a flat copy of "
                         "every gradient (gradient_as_bucket_view=False)"),)
        if how == FLAT:
            return (Term("flat all-reduce", "device", params * 4, phase="step", source="one flat copy of every "
                         "gradient, all-reduced before the step"),)
        return ()

    # -- in a rank ---------------------------------------------------------------------------------------------------
    def apply(self, chunks: list[Any], rt: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        for c in chunks:
            c.module.to(rt.device)
        if rt.config(self.name).get("implementation") != TORCH_DDP:
            return
        for c in chunks:
            c.call = DistributedDataParallel(c.module, process_group=rt.dp_group,
                                             device_ids=[rt.device] if rt.device.type == "cuda" else None)

    def set_sync(self, chunks: list[Any], on: bool) -> None:
        """Gradient accumulation: torch DDP all-reduces only in the boundary micro-batch's backward (no_sync)."""
        for c in chunks:
            if c.call is not None:
                c.call.require_backward_grad_sync = on

    def attach(self, optimizer: Any, chunks: list[Any], rt: Any) -> None:
        """Without torch DDP: average the gradients over dp in one flat all-reduce before each optimizer step."""
        if any(c.call is not None for c in chunks) or rt.dp_size == 1:
            return
        params = [p for c in chunks for p in c.module.parameters()]
        group, size = rt.dp_group, rt.dp_size

        def average(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
            average_gradients(params, group, size)

        optimizer.register_step_pre_hook(average)


def average_gradients(params: list[Any], group: Any, size: int) -> None:
    """The mean over ``group`` of each parameter's gradient (a DTensor's local shard), in one all-reduce of every
    parameter, with a flag per parameter saying whether this rank has its gradient: every rank reduces the same
    buffer even when a parameter got no gradient on some of them, and one that got none anywhere keeps none (the
    optimizer skips it, as in one process)."""
    import torch
    import torch.distributed as dist

    if not params:
        return
    from launcher.parallel.rank import local_tensor

    local = [local_tensor(p) for p in params]
    with torch.no_grad():
        parts = [local_tensor(p.grad).reshape(-1) if p.grad is not None
                 else torch.zeros(t.numel(), dtype=t.dtype, device=t.device) for p, t in zip(params, local)]
        present = torch.tensor([p.grad is not None for p in params], dtype=parts[0].dtype, device=parts[0].device)
        flat = torch.cat([*parts, present])
        dist.all_reduce(flat, group=group)
        flat[:-len(params)].div_(size)
        offset = 0
        for p, t, anywhere in zip(params, local, flat[-len(params):].tolist()):
            if anywhere and p.grad is None:
                p.grad = torch.zeros_like(p)
            if anywhere:
                local_tensor(p.grad).copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


PART = ReplicatedDataParallel()
