"""placement.modules inside a rank: dense modules whose parameters, gradients, optimizer states and compute live on
the host (launcher/plan/host_modules.py plans them).

``HostModule`` stands where such a module was. It holds the module without registering it, so the parallel parts
(DDP, DeepSpeed, FSDP2) never see its parameters and ``.to(device)`` never moves them: its forward copies its tensor
inputs to the host (fp32), runs the module on the host CPU, and copies its outputs back to the device and dtype the
inputs came in (``Tensor.to`` is differentiable, so autograd flows through both copies and the module's backward runs
on the host). ``HostModules`` trains them beside the parts, as a table store trains its tables: after each backward
``collect`` takes the loss scale; ``step`` averages the gradients over the data-parallel ranks through a gloo group
(one flat all-reduce), skips the step when one is not finite, and steps a torch optimizer of the run's own kind and
settings on the host. Their weights and optimizer states go into every checkpoint (DCP, ``host_modules/``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map

from launcher.worker.optimizers import torch_optimizer

HOST = torch.device("cpu")
HOST_MODULES = "host_modules"
"""Their folder in a checkpoint dir (DCP)."""


class ToDevice(torch.autograd.Function):
    """A host module's output to the compute device, its gradient back: on CUDA through page-locked memory with a
    non-blocking copy (torch's caching host allocator keeps the pinned block until the copy that reads it is done),
    elsewhere a plain ``Tensor.to``. The gradient comes back with a blocking copy: the host's backward reads it next.
    The CUDA path has run on no GPU yet (tests/integration/test_gpu.py waits for one)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        ctx.host_dtype = t.dtype
        if device.type == "cuda":
            return t.detach().to(dtype).pin_memory().to(device, non_blocking=True)
        return t.detach().to(device, dtype, copy=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad.to(HOST, ctx.host_dtype), None, None


class HostModule(nn.Module):
    def __init__(self, inner: nn.Module, name: str) -> None:
        super().__init__()
        object.__setattr__(self, "inner", inner.to(HOST, torch.float32))  # not a submodule: the parts never see it
        self.path = name

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [t for t in (*args, *kwargs.values()) if torch.is_tensor(t)]
        device = tensors[0].device if tensors else HOST
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
        to_host = (lambda t: t.to(HOST, torch.float32 if t.is_floating_point() else t.dtype)
                   if torch.is_tensor(t) else t)
        out = self.inner(*tree_map(to_host, args), **tree_map(to_host, kwargs))
        back = lambda t: ToDevice.apply(t, device, dtype if t.is_floating_point() else t.dtype) \
            if torch.is_tensor(t) else t  # noqa: E731
        return tree_map(back, out)

    def extra_repr(self) -> str:
        return f"{self.path} on the host: {type(self.inner).__name__}"


def place_on_host(model: nn.Module, names: list[str]) -> dict[str, nn.Module]:
    """Swap each named module of ``model`` for a HostModule; {path: the module itself} of those swapped."""
    moved = {}
    for name in names:
        parent_path, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        inner = getattr(parent, attr)
        setattr(parent, attr, HostModule(inner, name))
        moved[name] = inner
    return moved


def host_group(plan: Any, rank: int, dp_group: Any) -> Any:
    """A gloo group of this rank's data-parallel peers: the run's own dp group when it is gloo already, else one made
    for every dp group of the mesh (``new_group`` is collective: every rank makes every group, in the same order)."""
    if plan.backend == "gloo":
        return dp_group
    groups: dict[tuple[int, int], list[int]] = {}
    for r in plan.ranks:
        groups.setdefault((r.coords.get("pp", 0), r.coords.get("tp", 0)), []).append(r.rank)
    mine = None
    for ranks in sorted(sorted(g) for g in groups.values()):
        made = dist.new_group(ranks, backend="gloo")
        if rank in ranks:
            mine = made
    return mine


class HostModules:
    """The host modules of this rank: their optimizer, their gradients' average over the data-parallel group."""

    def __init__(self, modules: dict[str, nn.Module], plan: Any, dp_size: int, group: Any) -> None:
        self.modules = modules
        self.container = nn.ModuleDict({k.replace(".", "/"): m for k, m in modules.items()})
        """The same modules under one root: the names their state dict and optimizer state are saved by."""
        self.params = [p for p in self.container.parameters() if p.requires_grad]
        self.optimizer = torch_optimizer(plan, self.params)  # as the parts' torch optimizer: the same arithmetic
        self.dp_size, self._plan = dp_size, plan
        self.group = group if dp_size > 1 else None
        """A gloo group of this rank's data-parallel peers (host_group): the host gradients' all-reduce."""
        self._scale = 1.0
        self.grad_bytes = 0
        """Bytes of the gradients the last step averaged (they are freed after it)."""

    def held_by(self, chunks: list[nn.Module]) -> HostModules | None:
        """These modules but those no chunk of this rank holds (a pipeline's other stages'); None when none is left.
        Called before any step: the optimizer is made again over what is kept."""
        paths = {m.path for c in chunks for m in c.modules() if isinstance(m, HostModule)}
        if paths == set(self.modules):
            return self
        if not paths:
            return None
        return HostModules({k: v for k, v in self.modules.items() if k in paths}, self._plan, self.dp_size, self.group)

    def collect(self, grad_scale: float = 1.0) -> None:
        self._scale = grad_scale

    def step(self) -> bool:
        """Average the gradients over the data-parallel ranks and step (collective on the dp group). False when a
        gradient was not finite: nothing is updated."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if self.group is not None:
            dist.all_reduce(flat, group=self.group)
        flat /= self.dp_size * self._scale
        self.grad_bytes = sum(g.numel() * g.element_size() for g in grads)
        ok = bool(torch.isfinite(flat).all())
        if ok:
            for p, g in zip(self.params, flat.split([q.numel() for q in self.params])):
                p.grad = g.view_as(p)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return ok

    def discard(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimizer states by name (torch's distributed state-dict API: states made for a fresh one)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        return {"model": get_model_state_dict(self.container),
                "optim": get_optimizer_state_dict(self.container, self.optimizer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(self.container, state["model"])
        set_optimizer_state_dict(self.container, self.optimizer, state["optim"])

    def held_bytes(self) -> dict[str, int]:
        """Host bytes of the weights, gradients and optimizer states now (memory.json)."""
        params = sum(p.numel() * p.element_size() for p in self.params)
        states = sum(t.numel() * t.element_size() for s in self.optimizer.state.values() for t in s.values()
                     if torch.is_tensor(t) and t.dim() > 0)
        devices = sorted({p.device.type for p in self.params})
        return {"params": params, "grads": self.grad_bytes, "optimizer": states, "devices": devices,
                "modules": list(self.modules)}
