"""The dense optimizer the plan names (launcher.plan.registry.DENSE_OPTIMIZERS), built over the parameters the
parallel parts left (after FSDP2 and tensor parallel replaced them with DTensors)."""

from __future__ import annotations

from typing import Any

import torch
from hydra.utils import get_class

from launcher.plan.registry import CPU_OPTIMIZERS, DENSE_OPTIMIZERS


def build_optimizer(plan: Any, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """With ZeRO-Offload, DeepSpeed steps it on its host partitions: torch's fused CPU kernel by default, or
    DeepSpeedCPUAdam with optimizer.cpu_impl=deepspeed."""
    o = plan.optimizer
    cpu = CPU_OPTIMIZERS[plan.placement.cpu_impl]
    if plan.placement.optimizer_location == "host" and cpu.impl:  # DeepSpeedCPUAdam (Adam or AdamW: planned)
        return get_class(cpu.impl)(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                   adamw_mode=o.name == "adamw")
    return torch_optimizer(plan, params)


def torch_optimizer(plan: Any, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The plan's dense optimizer as torch's own class (fused where it has a fused kernel): also what steps the
    dense modules placed on the host (launcher/worker/host_modules.py)."""
    o = plan.optimizer
    spec = DENSE_OPTIMIZERS[o.name]
    kwargs = {k: getattr(o, k) for k in spec.kwargs}
    if any(hasattr(p, "device_mesh") for p in params):  # DTensors: torch's fused and foreach kernels refuse
        kwargs["foreach"] = False  # DTensors of several meshes (and plain tensors) in one call
    elif spec.fused:
        kwargs["fused"] = True  # one kernel per step, on CPU and CUDA (bench/placement_bench.py, "hand dense")
    return get_class(spec.impl)(params, **kwargs)
