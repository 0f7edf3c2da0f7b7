"""Bytes per rank of parameters, gradients and optimizer states, from the parameter count and the ZeRO stage.

ZeRO-1 shards optimizer states over dp ranks, ZeRO-2 also gradients, ZeRO-3 also parameters (Rajbhandari et al.,
"ZeRO", 2020, section 5). With bf16, DeepSpeed keeps an fp32 master copy of the parameters with the optimizer states.
"""

from __future__ import annotations

from dataclasses import dataclass

_STATE_FLOATS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}  # fp32 values per parameter
_WIDTH = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    """Parameters of the model."""
    param_bytes: int
    """Per rank, in the training precision."""
    grad_bytes: int
    """Per rank."""
    optimizer_bytes: int
    """Per rank: optimizer states (+ fp32 master weights below fp32)."""

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


def estimate_memory(params: int, precision: str, optimizer: str, zero_stage: int, dp: int) -> MemoryEstimate:
    width = _WIDTH.get(precision, 4)
    states = _STATE_FLOATS.get(optimizer, 2) * 4 + (4 if width < 4 else 0)

    def share(nbytes: int, sharded: bool) -> int:
        return -(-nbytes // dp) if sharded else nbytes

    return MemoryEstimate(
        params=params,
        param_bytes=share(params * width, zero_stage >= 3),
        grad_bytes=share(params * width, zero_stage >= 2),
        optimizer_bytes=share(params * states, zero_stage >= 1),
    )
