"""The one place where tensors cross between host and device memory.

Each step the looked-up embedding rows go host -> device (pinned, non-blocking on CUDA) and their gradients come
back device -> host. On a CPU-only machine "device" is the CPU and both are no-ops apart from a dtype cast.
"""

from __future__ import annotations

import torch


def host_to_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Move host rows to the compute device (and precision). Already there: no call at all (a tiny model's step is
    ~1 ms, and each no-op ``.to`` costs microseconds)."""
    if t.device != device:
        if device.type == "cuda" and t.device.type == "cpu":
            t = t.pin_memory().to(device, non_blocking=True)
        else:
            t = t.to(device)
    if dtype is not None and t.dtype != dtype and t.is_floating_point():
        t = t.to(dtype)
    return t


def device_to_host(t: torch.Tensor, host: torch.device) -> torch.Tensor:
    """Bring gradients back to where the table lives, in fp32 (tables and their states stay fp32)."""
    return t.to(host).float()
