"""The one place where tensors cross between host and device memory.

Each step the looked-up embedding rows go host -> device and their gradients come back device -> host. On CUDA the
rows are gathered straight into a page-locked (pinned) buffer that lives for the whole run (``PinnedRing``) and copied
with ``non_blocking=True``: no page-locked allocation and no extra host copy per batch (``t.pin_memory()`` made both
at every call). A buffer is written again only once the copy that last read it has finished (a CUDA event per
buffer). On a CPU-only machine "device" is the CPU: rows are gathered where the table is and used as they are (no
copy beyond the gather), apart from a dtype cast. The CUDA path has run on no GPU in this project's checks (written,
unit-tested with the CUDA calls stubbed out).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

import launcher.tables.kernels as kernels


RING_MAX = 64 << 20
"""Bytes of the largest copy a ring takes (a buffer grows up to this); a larger one is pinned by torch's caching host
allocator instead (``pin_memory()``), so a run with large batches does not keep several such buffers pinned."""


class PinnedRing:
    """``slots`` page-locked host buffers used in turn, each grown (to the next power of two, 1 MiB at least) when a
    copy needs more, and kept for the run: at most slots x RING_MAX bytes (wide_deep's lookups: 4 x 4 MiB). ``stage``
    hands out the next buffer as a tensor of the asked shape, after waiting for the copy that last used it; ``sent``
    records, after the copy was queued, the event that says when it is done. One ring per thread that copies (the
    prefetch thread has its own)."""

    def __init__(self, slots: int = 4) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list[Any] = [None] * slots
        self._next = 0

    def stage(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor | None, int]:
        """(a pinned tensor of ``shape`` and ``dtype``, its slot): free to write until ``sent(slot)``; (None, -1) for
        a copy larger than RING_MAX."""
        numel = 1
        for n in shape:
            numel *= n
        need = max(numel, 1) * dtype.itemsize
        if need > RING_MAX:
            return None, -1
        slot = self._next
        self._next = (slot + 1) % len(self._buffers)
        if self._events[slot] is not None:
            self._events[slot].synchronize()  # its last copy has left the buffer
            self._events[slot] = None
        buf = self._buffers[slot]
        if buf is None or buf.numel() < need:
            buf = torch.empty(max(1 << 20, 1 << (need - 1).bit_length()), dtype=torch.uint8, pin_memory=True)
            self._buffers[slot] = buf
        return buf[:need].view(dtype)[:numel].view(shape), slot

    def sent(self, slot: int, device: torch.device) -> None:
        """The copy out of ``slot`` was queued on ``device``'s current stream."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._events[slot] = event

    def pinned_bytes(self) -> int:
        return sum(b.numel() for b in self._buffers if b is not None)


_rings = threading.local()


def ring() -> PinnedRing:
    """This thread's PinnedRing (made on first use)."""
    if not hasattr(_rings, "ring"):
        _rings.ring = PinnedRing()
    return _rings.ring


def _to_device(staged: torch.Tensor, slot: int, staging: PinnedRing, device: torch.device) -> torch.Tensor:
    out = staged.to(device, non_blocking=True)
    staging.sent(slot, device)
    return out


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.dtype != dtype and t.is_floating_point() else t


def host_to_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None,
                   staging: PinnedRing | None = None) -> torch.Tensor:
    """Move host rows (or a batch's tensor) to the compute device (and precision). Already there: no call at all (a
    tiny model's step is ~1 ms, and each no-op ``.to`` costs microseconds). On CUDA from the host: through a pinned
    buffer of ``staging`` (this thread's ring by default), non-blocking; a tensor already pinned (a DataLoader's with
    pin_memory) is copied as it is."""
    if t.device != device:
        if device.type == "cuda" and t.device.type == "cpu":
            staging = staging or ring()
            staged, slot = (None, -1) if t.is_pinned() else staging.stage(tuple(t.shape), t.dtype)
            if staged is None:  # pinned already (a DataLoader's with pin_memory), or too large for the ring
                t = (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)
            else:
                staged.copy_(t)
                t = _to_device(staged, slot, staging, device)
        else:
            t = t.to(device)
    return _cast(t, dtype)


def gather_to_device(table: torch.Tensor, index: torch.Tensor, device: torch.device,
                     dtype: torch.dtype | None = None, staging: PinnedRing | None = None) -> torch.Tensor:
    """Rows ``index`` (1-D) of ``table`` on the compute device: on CUDA from a host table, gathered straight into a
    pinned buffer and copied non-blocking; otherwise one ``index_select`` where the table lives (4.6x ``table[ids]``
    at dim 16 on a CPU), moved only if it lives elsewhere."""
    index = index.to(table.device)
    if device.type == "cuda" and table.device.type == "cpu":
        staging = staging or ring()
        staged, slot = staging.stage((index.numel(), *table.shape[1:]), table.dtype)
        if staged is not None:
            torch.index_select(table, 0, index, out=staged)
            return _cast(_to_device(staged, slot, staging, device), dtype)
    if table.dim() == 2 and table.dtype == torch.float32 and index.dtype == torch.int64 \
            and kernels.usable(table, index):  # one pass, rows prefetched (launcher/tables/kernels.c)
        return host_to_device(kernels.gather(table, index), device, dtype)
    return host_to_device(torch.index_select(table, 0, index), device, dtype)


def device_to_host(t: torch.Tensor, host: torch.device) -> torch.Tensor:
    """Bring gradients back to where the table lives, in fp32 (tables and their states stay fp32)."""
    return t.to(host).float()
