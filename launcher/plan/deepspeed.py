"""The DeepSpeed config, emitted as a table: each row maps plan fields to one dotted DeepSpeed key.

Keys are spelled exactly as DeepSpeed names them (deepspeed/runtime/constants.py, zero/config.py). Never emitted:
deprecated ``cpu_offload*``, ``"auto"`` (DeepSpeed does not resolve it; HF Accelerate does), ``sparse_gradients``
(rejected by DeepSpeed >= 0.19), and ``optimizer`` (the worker passes a torch optimizer; naming one here makes
DeepSpeed JIT-build fused_adam on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.plan.registry import DENSE_OPTIMIZERS


@dataclass(frozen=True)
class DeepSpeedInputs:
    """The plan fields the DeepSpeed config depends on."""

    global_size: int
    micro_size: int
    grad_accum: int
    zero_stage: int
    precision: str
    optimizer: str
    log_every: int
    offload_optimizer: bool = False
    offload_params: bool = False
    pin_memory: bool = False
    cpu_impl: str = "torch"


_SKIP = object()  # a row that does not apply to this plan emits nothing


_ROWS: list[tuple[str, Callable[[DeepSpeedInputs], Any]]] = [
    ("train_batch_size", lambda p: p.global_size),
    ("train_micro_batch_size_per_gpu", lambda p: p.micro_size),
    ("gradient_accumulation_steps", lambda p: p.grad_accum),
    ("steps_per_print", lambda p: p.log_every),
    ("wall_clock_breakdown", lambda p: False),
    # DeepSpeed clips the global gradient norm at 1.0 unless told otherwise; torch DDP and the DTensor engine do not
    # clip, and the same run must take the same steps on every engine (a pipeline of resnet took 1/5 of DDP's step).
    ("gradient_clipping", lambda p: 0.0),
    ("zero_optimization.stage", lambda p: p.zero_stage),
    ("zero_optimization.offload_optimizer",
     lambda p: {"device": "cpu", "pin_memory": p.pin_memory} if p.offload_optimizer else _SKIP),
    ("zero_optimization.offload_param",
     lambda p: {"device": "cpu", "pin_memory": p.pin_memory} if p.offload_params else _SKIP),
    # A torch optimizer stepping on DeepSpeed's host partitions (faster than DeepSpeedCPUAdam, no JIT build: see
    # README "Performance"); DeepSpeed refuses a client optimizer with offload unless told otherwise.
    ("zero_force_ds_cpu_optimizer", lambda p: False if p.offload_optimizer and p.cpu_impl == "torch" else _SKIP),
    ("zero_allow_untested_optimizer", lambda p: p.zero_stage > 0 and not DENSE_OPTIMIZERS[p.optimizer].zero_tested),
    ("bf16.enabled", lambda p: p.precision == "bf16"),
    ("fp16.enabled", lambda p: p.precision == "fp16"),
]


def deepspeed_config(p: DeepSpeedInputs) -> dict[str, Any]:
    """The DeepSpeed config dict for these inputs."""
    out: dict[str, Any] = {}
    for dotted, row in _ROWS:
        value = row(p)
        if value is _SKIP:
            continue
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def plan_deepspeed(batch: tuple[int, int, int], placement, zero_stage: int, precision: str, optimizer: str,
                   log_every: int, device_type: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the DeepSpeed config, the C++ ops its ranks load) for a DeepSpeed run: ``batch`` is (global, micro, accum),
    ``placement`` a PlacementPlan (offload of optimizer and parameters, pinned memory, CPU optimizer)."""
    config = deepspeed_config(DeepSpeedInputs(
        global_size=batch[0], micro_size=batch[1], grad_accum=batch[2], zero_stage=zero_stage, precision=precision,
        optimizer=optimizer, log_every=log_every, offload_optimizer=placement.optimizer_location == "host",
        offload_params=placement.param_location == "host", pin_memory=placement.pin_memory,
        cpu_impl=placement.cpu_impl,
    ))
    ops = ("deepspeed_shm_comm",) if device_type == "cpu" else ()  # DeepSpeed's CPU accelerator loads it
    if placement.optimizer_location == "host" and placement.cpu_impl == "deepspeed":
        ops += ("cpu_adam",)
    return config, ops
